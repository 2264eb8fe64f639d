//! The docs name only what exists, and name everything a user sets or scrapes: every flag,
//! metric, annotation and CamelCase term (condition reasons, Event reasons, kinds) named in
//! `docs/`, the README and the alerts of `config/monitoring` exists in the code, every flag and
//! metric of the code is in the docs, and every column of `kubectl get` is described. A rename
//! without its docs, or docs written ahead of the code, fails here. No environment needed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Files under `dir` (recursively) whose names end with one of `extensions`.
fn files(dir: &Path, extensions: &[&str]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files(&path, extensions));
        } else if extensions
            .iter()
            .any(|e| path.to_string_lossy().ends_with(e))
        {
            found.push(path);
        }
    }
    found.sort();
    found
}

/// The user docs: docs/ (not the design notes, which describe plans), the README, and the
/// alerts and dashboard of config/monitoring (their text names metrics).
fn user_docs() -> Vec<(PathBuf, String)> {
    let root = root();
    let mut paths: Vec<PathBuf> = files(&root.join("docs"), &[".md"])
        .into_iter()
        .filter(|p| !p.components().any(|c| c.as_os_str() == "design"))
        .collect();
    paths.push(root.join("README.md"));
    paths.extend(files(&root.join("config/monitoring"), &[".yaml", ".json"]));
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect()
}

/// The code: Rust sources of the controller and its API, and config/ (CRDs, RBAC, policies).
fn code() -> String {
    let root = root();
    let mut text = String::new();
    for path in files(&root.join("src"), &[".rs"])
        .into_iter()
        .chain(files(&root.join("api/src"), &[".rs"]))
        .chain(files(&root.join("config"), &[".yaml"]))
    {
        text.push_str(&std::fs::read_to_string(path).unwrap());
        text.push('\n');
    }
    text
}

/// Maximal runs of `allowed` characters that start with `prefix`.
fn words<'a>(text: &'a str, prefix: &str, allowed: impl Fn(char) -> bool) -> Vec<&'a str> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let end = tail
            .char_indices()
            .skip(prefix.len())
            .find(|(_, c)| !allowed(*c))
            .map_or(tail.len(), |(i, _)| i);
        // A word, not the end of a longer one.
        if before.is_none_or(|c| !allowed(c) && c != '-') && end > prefix.len() {
            found.push(tail[..end].trim_end_matches(['-', '.', '_']));
        }
        rest = &tail[end.max(prefix.len())..];
    }
    found
}

fn long_flags(command: &clap::Command, into: &mut BTreeSet<String>) {
    for arg in command.get_arguments() {
        if let Some(long) = arg.get_long() {
            into.insert(format!("--{long}"));
        }
    }
    for sub in command.get_subcommands() {
        long_flags(sub, into);
    }
}

/// The controller's own flags (documented in docs/reference.md), and every flag of ours: those
/// and `policy preview`'s, the kubectl plugin's and the bench's.
fn our_flags() -> (BTreeSet<String>, BTreeSet<String>) {
    let command = ck8s_certs::cli::Args::command();
    let controller: BTreeSet<String> = command
        .get_arguments()
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect();
    let mut all = BTreeSet::new();
    long_flags(&command, &mut all);
    long_flags(&ck8s_certs::plugin::PluginArgs::command(), &mut all);
    long_flags(&ck8s_certs_e2e::bench::Options::command(), &mut all);
    (controller, all)
}

/// Flags of other tools that the docs show in commands (kubectl, clusterctl, openssl) or name
/// (kube-apiserver).
const OTHER_TOOLS_FLAGS: &[&str] = &[
    "--addon",
    "--client-ca-file",
    "--config",
    "--context",
    "--describe",
    "--dry-run",
    "--field-selector",
    "--flatten",
    "--from-file",
    "--include-crd",
    "--include-namespace",
    "--kubeconfig",
    "--minify",
    "--overwrite",
    "--raw",
    "--server-side",
    "--sort-by",
    "--subresource",
    "--target-namespace",
    "--type",
    "--help",
    "--from",
    "--prefix",
    "--release",
    "--namespace",
    "--timeout",
    "--server",
    "--enable-priority-and-fairness",
];

#[test]
fn every_flag_in_the_docs_exists_and_every_controller_flag_is_documented() {
    let (controller, ours) = our_flags();
    let flag_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    let mut unknown = BTreeSet::new();
    for (path, text) in user_docs() {
        for flag in words(&text, "--", flag_char) {
            if flag.len() > 3 && !ours.contains(flag) && !OTHER_TOOLS_FLAGS.contains(&flag) {
                unknown.insert(format!("{flag} ({})", path.display()));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "flags in the docs that do not exist: {unknown:#?}"
    );
    let reference = std::fs::read_to_string(root().join("docs/reference.md")).unwrap();
    let undocumented: Vec<&String> = controller
        .iter()
        .filter(|f| !["--help", "--version"].contains(&f.as_str()))
        .filter(|f| !reference.contains(&format!("`{f}`")))
        .collect();
    assert!(
        undocumented.is_empty(),
        "controller flags missing from docs/reference.md: {undocumented:?}"
    );
    let docs: String = user_docs().into_iter().map(|(_, t)| t).collect();
    let unmentioned: Vec<&String> = ours
        .iter()
        .filter(|f| !["--help", "--version"].contains(&f.as_str()))
        .filter(|f| words(&docs, "--", flag_char).iter().all(|w| w != f))
        .collect();
    assert!(
        unmentioned.is_empty(),
        "flags (of the plugin, policy preview or the bench) no doc mentions: {unmentioned:?}"
    );
}

/// The metric families the controller registers (`register(` in src/metrics.rs, and the
/// collector's `encode_descriptor(`), prefixed as the registry prefixes them, and the sample
/// names they may carry. Read from the source: a family with labels shows no sample until it
/// has one.
fn our_metrics() -> (BTreeSet<String>, BTreeSet<String>) {
    let metrics = root().join("src/metrics.rs");
    let collector = root().join("src/metrics/expiry.rs");
    let mut families = BTreeSet::new();
    for (path, call) in [(metrics, "register("), (collector, "encode_descriptor(")] {
        let text = std::fs::read_to_string(path).unwrap();
        for after in text.split(call).skip(1) {
            if let Some(name) = after.split('"').nth(1) {
                families.insert(format!("ck8s_certs_{name}"));
            }
        }
    }
    let samples = families
        .iter()
        .flat_map(|f| {
            [
                "", "_total", "_created", "_count", "_sum", "_bucket", "_info",
            ]
            .map(|suffix| format!("{f}{suffix}"))
        })
        .collect();
    (families, samples)
}

#[test]
fn every_metric_in_the_docs_exists_and_every_metric_is_documented() {
    let (families, samples) = our_metrics();
    assert!(families.len() > 5, "{families:?}");
    let metric_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    let docs = user_docs();
    let mut unknown = BTreeSet::new();
    for (path, text) in &docs {
        for name in words(text, "ck8s_certs_", metric_char) {
            // Crate names, not metrics.
            if ["ck8s_certs_api", "ck8s_certs_e2e"].contains(&name) {
                continue;
            }
            if !samples.contains(name) && !families.contains(name) {
                unknown.insert(format!("{name} ({})", path.display()));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics in the docs that do not exist: {unknown:#?}"
    );
    let monitoring = std::fs::read_to_string(root().join("docs/monitoring.md")).unwrap()
        + &std::fs::read_to_string(root().join("docs/reference.md")).unwrap();
    let undocumented: Vec<&String> = families
        .iter()
        .filter(|f| !monitoring.contains(f.as_str()))
        .collect();
    assert!(
        undocumented.is_empty(),
        "metrics missing from docs/monitoring.md and docs/reference.md: {undocumented:?}"
    );
}

/// Keys the docs tell users to set on their own objects, which the code never reads.
const DOCS_ONLY_KEYS: &[&str] = &[
    // The pod label a shard's Deployment and Service select on (docs/sharding.md).
    "certificates.ck8s.io/shard",
];

#[test]
fn every_annotation_and_label_in_the_docs_exists() {
    let code = code();
    let key_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '/';
    let mut unknown = BTreeSet::new();
    for (path, text) in user_docs() {
        for prefix in ["certificates.ck8s.io/", "v1beta2.k8sd.io/"] {
            for key in words(&text, prefix, key_char) {
                let key = key.trim_end_matches('/');
                // A key, not an API group path (certificates.ck8s.io/v1alpha1).
                if key.len() <= prefix.len() || key.ends_with("v1alpha1") {
                    continue;
                }
                if !code.contains(&format!("\"{key}\"")) && !DOCS_ONLY_KEYS.contains(&key) {
                    unknown.insert(format!("{key} ({})", path.display()));
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "annotations or labels in the docs that do not exist: {unknown:#?}"
    );
}

/// CamelCase terms of other projects that the docs name (kinds, tools).
const OTHER_TERMS: &[&str] = &[
    "ClusterClass",
    "KubeadmControlPlane",
    "ServiceMonitor",
    "CertificateRequest",
    "GitOps",
    "MachinePool",
    "PodMonitor",
    "PrometheusRule",
    "CronJob",
    "DaemonSet",
    "StatefulSet",
    "ReplicaSet",
    "CustomResourceDefinition",
    "ConfigMap",
    "TokenRequest",
    "SubjectAccessReview",
    "SelfSubjectReview",
    "LastTransitionTime",
    "RuntimeDefault",
];

#[test]
fn every_condition_reason_event_reason_and_kind_in_the_docs_exists() {
    let code = code();
    let mut unknown = BTreeSet::new();
    for (path, text) in user_docs()
        .into_iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "md"))
    {
        // `CamelCase` in backticks: a reason, a kind, a condition type.
        for quoted in text.split('`').skip(1).step_by(2) {
            let term = quoted.trim();
            let camel = term.len() > 3
                && term.starts_with(|c: char| c.is_ascii_uppercase())
                && term.chars().all(|c| c.is_ascii_alphanumeric())
                && term.chars().skip(1).any(|c| c.is_ascii_uppercase())
                && term.chars().any(|c| c.is_ascii_lowercase());
            if camel
                && !OTHER_TERMS.contains(&term)
                && !code.contains(&format!("\"{term}\""))
                && !code.contains(&format!("{term}\n"))
                && !code.contains(&format!("{term},"))
                && !code.contains(&format!("{term} "))
            {
                unknown.insert(format!("{term} ({})", path.display()));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "terms in the docs that the code does not know: {unknown:#?}"
    );
}

#[test]
fn every_column_of_kubectl_get_is_described() {
    let docs: String = user_docs().into_iter().map(|(_, t)| t).collect();
    let docs = docs.to_lowercase();
    let mut missing = Vec::new();
    for crd in files(&root().join("config/crd/bases"), &[".yaml"]) {
        let text = std::fs::read_to_string(&crd).unwrap();
        let object: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        for version in object["spec"]["versions"]
            .as_sequence()
            .into_iter()
            .flatten()
        {
            for column in version["additionalPrinterColumns"]
                .as_sequence()
                .into_iter()
                .flatten()
            {
                let name = column["name"].as_str().unwrap_or_default();
                if name != "Age" && !docs.contains(&name.to_lowercase()) {
                    missing.push(format!("{name} ({})", crd.display()));
                }
            }
        }
    }
    assert!(missing.is_empty(), "columns no doc describes: {missing:?}");
}
