//! The docs name only what exists, and name everything a user sets or scrapes: every flag,
//! metric, annotation and CamelCase term (condition reasons, Event reasons, kinds) named in
//! `docs/`, the README and the alerts of `config/monitoring` exists in the code, every flag and
//! metric of the code is in the docs, and every column of `kubectl get` is described. A rename
//! without its docs, or docs written ahead of the code, fails here.
//!
//! What can be generated is (`make docs`, `ck8s_certs_e2e::docsgen`), and a doc whose
//! generated region differs fails here. What cannot is checked: every repository path, test
//! name, `make` target, link and anchor cited in README.md and docs/**.md exists; every
//! `label="value"` of a metric selector is a value the code gives that label; every flag in a
//! command line belongs to the command it is given to (`ck8s-certs`, `ck8s-certs policy
//! preview`, `kubectl ck8s-certs …`); every lowerCamelCase field is one of our CRDs' (or a
//! listed one of another project) and every "`field` (default X)" is the CRD's default; and
//! `kubectl kustomize` of every overlay but the clusterctl templates leaves no `${…}`. Only that
//! last one needs a tool (the pinned kubectl). Metric HELP texts are in the generated table.

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
    "--shutdown-delay-duration",
    // The CK8s node CLI (`k8s refresh-certs`).
    "--expires-in",
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
    // Every family the controller exports, as the generated reference lists them.
    let families: BTreeSet<String> = ck8s_certs_e2e::docsgen::families()
        .unwrap()
        .into_iter()
        .map(|family| family.name)
        .collect();
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
    // Cluster API's Machine condition a MachineHealthCheck sets.
    "OwnerRemediated",
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

// ---------------------------------------------------------------------------------------------
// Generated regions, and what cannot be generated: paths, tests, make targets, anchors, label
// values, the command each flag is given to, and the rendered overlays.

use ck8s_certs_e2e::docsgen;

/// README.md and every page under docs/ (the design notes too: their links and paths are
/// followed as much as the user pages').
fn markdown() -> Vec<(PathBuf, String)> {
    let root = root();
    let mut paths = vec![root.join("README.md")];
    paths.extend(files(&root.join("docs"), &[".md"]));
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect()
}

/// The path relative to the repository, for messages.
fn shown(path: &Path) -> String {
    let root = root().canonicalize().unwrap();
    let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    path.strip_prefix(&root)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| path.display().to_string())
}

/// Lines outside fenced code blocks (`None`) and inside them (`Some(info)`), with line numbers.
fn lines_with_fences(text: &str) -> Vec<(usize, Option<&str>, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            fence = match fence {
                Some(_) => None,
                None => Some(info.trim()),
            };
            continue;
        }
        out.push((n + 1, fence, line));
    }
    out
}

/// Inline code spans of a line outside code blocks.
fn code_spans(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

#[test]
fn generated_regions_are_up_to_date() {
    let mut stale = Vec::new();
    for (path, committed, generated) in docsgen::generated_docs(&root()).unwrap() {
        if committed != generated {
            let first = committed
                .lines()
                .zip(generated.lines())
                .enumerate()
                .find(|(_, (c, g))| c != g)
                .map(|(n, (c, g))| format!("line {}:\n  committed: {c}\n  generated: {g}", n + 1))
                .unwrap_or_else(|| "the line counts differ".into());
            stale.push(format!(
                "{} differs from what `make docs` writes, first at {first}",
                shown(&path)
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "{}\nrun `make docs` (and edit the source, not the generated region)",
        stale.join("\n")
    );
}

/// Runs of path characters in `text` that start at a word boundary with one of `roots`.
fn cited_paths(text: &str) -> Vec<String> {
    const ROOTS: &[&str] = &[
        "src/", "api/", "config/", "docs/", "hack/", "test/", "tests/", "fuzz/", ".ci/",
    ];
    let path_char = |c: char| c.is_ascii_alphanumeric() || "_-./".contains(c);
    let mut found = Vec::new();
    for (at, _) in text.char_indices() {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| path_char(c) || c == '~' || c == '$' || c == '{') {
            continue;
        }
        let rest = &text[at..];
        if !ROOTS.iter().any(|r| rest.starts_with(r)) {
            continue;
        }
        let end = rest.find(|c: char| !path_char(c)).unwrap_or(rest.len());
        let path = rest[..end].trim_end_matches('.');
        found.push(path.to_owned());
    }
    found
}

#[test]
fn every_repository_path_in_the_docs_exists() {
    let root = root();
    let mut missing = BTreeSet::new();
    let mut checked = 0;
    for (path, text) in markdown() {
        for (n, _, line) in lines_with_fences(&text) {
            for cited in cited_paths(line) {
                checked += 1;
                // Paths of the e2e crate are written as cargo names them (`tests/fleet.rs`).
                if !root.join(&cited).exists() && !root.join("test/e2e").join(&cited).exists() {
                    missing.insert(format!("{}:{n}: {cited}", shown(&path)));
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} paths found in the docs");
    assert!(
        missing.is_empty(),
        "repository paths in the docs that do not exist: {missing:#?}"
    );
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces to
/// `-`; repeated headings get `-1`, `-2`, ….
fn slug(heading: &str) -> String {
    // Links in headings count by their text.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        text.push_str(&rest[..open]);
        let tail = &rest[open + 1..];
        match (tail.find("]("), tail.find(')')) {
            (Some(close), Some(end)) if close < end => {
                text.push_str(&tail[..close]);
                rest = &tail[end + 1..];
            }
            _ => {
                text.push('[');
                rest = tail;
            }
        }
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
    let mut anchors = BTreeSet::new();
    for (_, fence, line) in lines_with_fences(text) {
        if fence.is_some() {
            continue;
        }
        let Some(heading) = line
            .strip_prefix('#')
            .map(|h| h.trim_start_matches('#'))
            .filter(|h| h.starts_with(' '))
        else {
            continue;
        };
        let base = slug(heading.trim_end_matches('#'));
        let count = seen.entry(base.clone()).or_default();
        anchors.insert(if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        });
        *count += 1;
    }
    anchors
}

/// `(target, line)` of the markdown links `[text](target)` outside code blocks.
fn links(text: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for (n, fence, line) in lines_with_fences(text) {
        if fence.is_some() {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let tail = &rest[at + 2..];
            let end = tail.find(')').unwrap_or(tail.len());
            found.push((tail[..end].trim().to_owned(), n));
            rest = &tail[end..];
        }
    }
    found
}

#[test]
fn every_link_and_anchor_in_the_docs_exists() {
    let docs = markdown();
    let mut broken = BTreeSet::new();
    let mut anchored = 0;
    for (path, text) in &docs {
        for (target, n) in links(text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            anchored += usize::from(target.contains('#'));
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let file = if file.is_empty() {
                path.clone()
            } else {
                path.parent().unwrap().join(file)
            };
            let here = format!("{}:{n}: {target}", shown(path));
            if !file.exists() {
                broken.insert(format!("{here} (no such file)"));
                continue;
            }
            if anchor.is_empty() {
                continue;
            }
            let Ok(target_text) = std::fs::read_to_string(&file) else {
                broken.insert(format!("{here} (an anchor into a directory)"));
                continue;
            };
            if !anchors(&target_text).contains(anchor) {
                broken.insert(format!("{here} (no heading with anchor #{anchor})"));
            }
        }
    }
    assert!(
        anchored > 30,
        "only {anchored} links with anchors found in the docs"
    );
    assert!(
        broken.is_empty(),
        "links in the docs to files or headings that do not exist: {broken:#?}"
    );
}

/// Every `fn name` of the Rust sources (tests included).
fn function_names() -> BTreeSet<String> {
    let root = root();
    let mut names = BTreeSet::new();
    for dir in ["src", "api", "test", "tests", "fuzz"] {
        for file in files(&root.join(dir), &[".rs"]) {
            let text = std::fs::read_to_string(file).unwrap();
            for after in text.split("fn ").skip(1) {
                let name: String = after
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                names.insert(name);
            }
        }
    }
    names
}

#[test]
fn every_test_named_in_the_docs_exists() {
    let functions = function_names();
    // Label values of the metrics (`control_plane_not_ready`) are checked with them.
    let label_values: BTreeSet<&str> = ck8s_certs::metrics::label_values()
        .into_iter()
        .flat_map(|(_, _, values)| values)
        .collect();
    let mut missing = BTreeSet::new();
    for (path, text) in markdown() {
        for (n, _, line) in lines_with_fences(&text) {
            for span in code_spans(line) {
                // A test name: snake_case of four words or more; metric names are checked above.
                let snake = span
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
                if snake
                    && span.matches('_').count() >= 3
                    && !span.starts_with("ck8s_certs_")
                    && !span.starts_with("apiserver_")
                    && !label_values.contains(span)
                    && !functions.contains(span)
                {
                    missing.insert(format!("{}:{n}: {span}", shown(&path)));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "test names in the docs that no function has: {missing:#?}"
    );
}

fn make_targets() -> BTreeSet<String> {
    let makefile = std::fs::read_to_string(root().join("Makefile")).unwrap();
    makefile
        .lines()
        .filter(|l| !l.starts_with(['\t', '#', ' ', '.']))
        .filter_map(|l| l.split_once(':'))
        .filter(|(_, after)| !after.starts_with('='))
        .flat_map(|(targets, _)| targets.split_whitespace().map(str::to_owned))
        .collect()
}

/// The targets of a `make …` command line (variables and options skipped).
fn make_command_targets(command: &str) -> Vec<String> {
    // Quoted values (`BENCH_FLAGS="--clusters 10"`) are one word.
    let unquoted: String = command
        .split('"')
        .enumerate()
        .map(|(i, part)| {
            if i % 2 == 1 {
                part.replace(' ', "_")
            } else {
                part.to_owned()
            }
        })
        .collect();
    let mut words = unquoted.split_whitespace().skip_while(|w| *w != "make");
    if words.next().is_none() {
        return Vec::new();
    }
    words
        .take_while(|w| !matches!(*w, "&&" | "|" | ";" | "#" | "||"))
        .filter(|w| !w.contains('=') && !w.starts_with('-'))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_make_target_in_the_docs_exists() {
    let targets = make_targets();
    assert!(
        targets.contains("unit") && targets.contains("docs"),
        "{targets:?}"
    );
    let mut missing = BTreeSet::new();
    for (path, text) in markdown() {
        for (n, fence, line) in lines_with_fences(&text) {
            let commands: Vec<&str> = match fence {
                Some(_) => vec![line.trim_start().trim_start_matches("$ ")],
                None => code_spans(line),
            };
            for command in commands {
                if !command.starts_with("make ") {
                    continue;
                }
                for target in make_command_targets(command) {
                    if !targets.contains(&target) {
                        missing.insert(format!("{}:{n}: make {target}", shown(&path)));
                    }
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "make targets in the docs that the Makefile lacks: {missing:#?}"
    );
}

/// Labels Prometheus adds to every scraped series (the PodMonitor's target labels).
const TARGET_LABELS: &[&str] = &[
    "job",
    "instance",
    "pod",
    "namespace",
    "container",
    "endpoint",
];

/// `(family, label, values)` of every `ck8s_certs_…{label="value", …}` in `text`; values of
/// `=~` alternatives and of the docs' `label="a"|"b"` shorthand one by one.
fn selectors(text: &str) -> Vec<(String, String, Vec<String>)> {
    let text = text.replace("\\\"", "\"");
    let mut found = Vec::new();
    let metric_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    for (at, _) in text.match_indices("ck8s_certs_") {
        let rest = &text[at..];
        let end = rest.find(|c| !metric_char(c)).unwrap_or(rest.len());
        let name = &rest[..end];
        let Some(inside) = rest[end..].strip_prefix('{') else {
            continue;
        };
        let inside = &inside[..inside.find('}').unwrap_or(inside.len())];
        let mut rest = inside;
        while let Some(quote) = rest.find('"') {
            // The last matcher before the quote: `label=`, `label!=`, `label=~`, `label!~`.
            let matcher = rest[..quote]
                .rsplit([',', ' ', '{'])
                .next()
                .unwrap_or_default();
            let label: String = matcher
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let op = &matcher[label.len()..];
            let tail = &rest[quote + 1..];
            let close = tail.find('"').unwrap_or(tail.len());
            let mut values: Vec<String> = match op {
                "=" | "!=" => vec![tail[..close].to_owned()],
                "=~" | "!~" => tail[..close].split('|').map(str::to_owned).collect(),
                _ => Vec::new(),
            };
            rest = tail.get(close + 1..).unwrap_or("");
            // `certificate="client"|"ca"`: the docs' shorthand for alternatives.
            while let Some(alternative) = rest.strip_prefix("|\"") {
                let close = alternative.find('"').unwrap_or(alternative.len());
                values.push(alternative[..close].to_owned());
                rest = alternative.get(close + 1..).unwrap_or("");
            }
            if !label.is_empty() {
                found.push((name.to_owned(), label, values));
            }
        }
    }
    found
}

#[test]
fn every_label_value_in_the_docs_is_one_the_metric_takes() {
    let families = docsgen::families().unwrap();
    let family_of = |name: &str| {
        families.iter().find(|f| {
            name == f.name
                || ["_total", "_bucket", "_sum", "_count", "_created"]
                    .iter()
                    .any(|s| name.strip_suffix(s) == Some(f.name.as_str()))
        })
    };
    let mut wrong = BTreeSet::new();
    let mut checked = 0;
    let mut texts = markdown();
    // The alerts and the dashboard; not the promtool tests, whose input series include values
    // the controller never exports (`reason="not_due"`) to show that the alerts ignore them.
    texts.extend(user_docs().into_iter().filter(|(p, _)| {
        p.starts_with(root().join("config")) && !p.components().any(|c| c.as_os_str() == "tests")
    }));
    for (path, text) in texts {
        for (name, label, values) in selectors(&text) {
            let Some(family) = family_of(&name) else {
                continue; // an unknown metric: reported by the metric names test
            };
            let here = format!("{}: {name}{{{label}=…}}", shown(&path));
            if label == "le" && family.kind == "histogram" {
                continue;
            }
            let Some((_, known)) = family.labels.iter().find(|(l, _)| *l == label) else {
                if !TARGET_LABELS.contains(&label.as_str()) {
                    wrong.insert(format!("{here}: {name} has no label {label}"));
                }
                continue;
            };
            // Labels that name objects take any value.
            if known.iter().any(|v| v.starts_with('<')) {
                continue;
            }
            for value in values {
                // A Grafana variable or a regular expression, not a value.
                if value.is_empty() || value.contains(['$', '.', '*', '(', '[']) {
                    continue;
                }
                checked += 1;
                if !known.contains(&value) {
                    wrong.insert(format!(
                        "{here}: {label}=\"{value}\" is not a value of {label} (it takes {known:?})"
                    ));
                }
            }
        }
    }
    assert!(
        checked > 10,
        "only {checked} label values found in the docs"
    );
    assert!(
        wrong.is_empty(),
        "label values in the docs that the metric never takes: {wrong:#?}"
    );
}

/// Long and short flags of `command` (clap's `--help`/`-h`, `--version`/`-V` included) and the
/// global flags of `ancestors`.
fn flags_of(command: &clap::Command, ancestors: &[clap::Command]) -> BTreeSet<String> {
    let mut flags: BTreeSet<String> = ["--help", "-h", "--version", "-V"].map(String::from).into();
    let own = command.get_arguments().map(|a| (a, true));
    let inherited = ancestors
        .iter()
        .flat_map(|c| c.get_arguments())
        .map(|a| (a, a.is_global_set()));
    for (arg, applies) in own.chain(inherited) {
        if !applies {
            continue;
        }
        if let Some(long) = arg.get_long() {
            flags.insert(format!("--{long}"));
        }
        if let Some(short) = arg.get_short() {
            flags.insert(format!("-{short}"));
        }
    }
    flags
}

/// Flags in `words` (a command line after the program) that `command` does not take.
fn foreign_flags(root: clap::Command, words: &[&str]) -> Vec<String> {
    let mut command = root;
    let mut ancestors: Vec<clap::Command> = Vec::new();
    let mut path = vec![command.get_name().to_owned()];
    let mut wrong = Vec::new();
    for word in words {
        if matches!(*word, "|" | "&&" | "||" | ";" | "#" | ">" | "2>&1") || word.starts_with("$(") {
            break;
        }
        if word.starts_with('-') && word.len() > 1 && !word.starts_with("--=") {
            let flag = word.split('=').next().unwrap_or(word);
            if !flags_of(&command, &ancestors).contains(flag) {
                wrong.push(format!("{flag} is not a flag of `{}`", path.join(" ")));
            }
            continue;
        }
        if let Some(sub) = command.find_subcommand(word).cloned() {
            path.push(word.to_string());
            ancestors.push(std::mem::replace(&mut command, sub));
        }
    }
    wrong
}

/// The command lines of a doc: shell lines of code blocks (continuations joined) and inline
/// code spans.
fn command_lines(text: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (n, fence, line) in lines_with_fences(text) {
        if fence.is_none() {
            lines.extend(code_spans(line).into_iter().map(|s| (n, s.to_owned())));
            continue;
        }
        let (start, mut joined) = pending.take().unwrap_or((n, String::new()));
        joined.push(' ');
        joined.push_str(line.trim());
        match joined.strip_suffix('\\') {
            Some(open) => pending = Some((start, open.to_owned())),
            None => lines.push((start, joined)),
        }
    }
    lines
}

/// Whether `words[j]` is where a command starts: first, or after a prompt, `&&`, `|` or `;`,
/// past any `NAME=value` assignments.
fn at_command_start(words: &[&str], j: usize) -> bool {
    let assignments = words[..j]
        .iter()
        .rev()
        .take_while(|w| w.contains('=') && !w.starts_with('-'))
        .count();
    let k = j - assignments;
    k == 0 || matches!(words[k - 1], "$" | "&&" | "|" | ";" | "||")
}

#[test]
fn every_flag_in_a_command_line_belongs_to_its_command() {
    use clap::CommandFactory;
    let controller = ck8s_certs::cli::Args::command();
    let plugin = ck8s_certs::plugin::PluginArgs::command();
    let mut wrong = BTreeSet::new();
    let mut checked = 0;
    for (path, text) in markdown() {
        for (n, line) in command_lines(&text) {
            let words: Vec<&str> = line.split_whitespace().collect();
            for (i, word) in words.iter().enumerate() {
                let program = word.rsplit('/').next().unwrap_or(word);
                let (command, rest) = if program == "ck8s-certs"
                    && i > 0
                    && words[i - 1] == "kubectl"
                    && at_command_start(&words, i - 1)
                {
                    (plugin.clone(), &words[i + 1..])
                } else if program == "ck8s-certs" && at_command_start(&words, i) {
                    (controller.clone(), &words[i + 1..])
                } else if program == "ck8s-certs" && i > 0 && words[i - 1] == "--bin" {
                    // cargo run --bin ck8s-certs -- <flags>
                    let after = words[i..]
                        .iter()
                        .position(|w| *w == "--")
                        .map_or(words.len(), |p| i + p + 1);
                    (controller.clone(), &words[after.min(words.len())..])
                } else {
                    continue;
                };
                checked += 1;
                for problem in foreign_flags(command, rest) {
                    wrong.insert(format!("{}:{n}: {problem} ({})", shown(&path), line.trim()));
                }
            }
        }
    }
    assert!(
        checked > 10,
        "only {checked} command lines found in the docs"
    );
    assert!(
        wrong.is_empty(),
        "flags given to a command that does not take them: {wrong:#?}"
    );
}

/// The overlays that are clusterctl templates: their `${NAME:=default}` values are substituted
/// by clusterctl (or `clusterctl generate yaml`), so `kubectl apply -k` of them cannot work
/// (docs/install.md says so). Every other overlay must render to objects that apply as they are.
const CLUSTERCTL_TEMPLATES: &[&str] = &[
    "config/default",
    "config/provider",
    "config/manager",
    "config/namespaced",
];

/// `${…}` allowed in a rendered overlay: Grafana's datasource variable of the dashboard, which
/// Grafana fills in when it loads the dashboard.
const OTHER_TEMPLATE_VARIABLES: &[&str] = &["${datasource}"];

#[test]
fn overlays_render_without_unsubstituted_variables() {
    // `make unit` runs this without the pinned kubectl only when `make tools` has not built it,
    // and says so; `make e2e` always runs it (CK8S_E2E_KUBECTL).
    if std::env::var_os("CK8S_DOCS_WITHOUT_KUBECTL").is_some() {
        eprintln!(
            "overlays_render_without_unsubstituted_variables: not run (no kubectl: `make tools` builds it, `make e2e` runs this)"
        );
        return;
    }
    let kubectl = ck8s_certs_e2e::tool("CK8S_E2E_KUBECTL", "kubectl", "KUBE_VERSION");
    let root = root();
    let mut wrong = Vec::new();
    let mut overlays: Vec<PathBuf> = std::fs::read_dir(root.join("config"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("kustomization.yaml").exists())
        .collect();
    overlays.sort();
    assert!(overlays.len() > 5, "{overlays:?}");
    for overlay in overlays {
        let name = shown(&overlay);
        let output = std::process::Command::new(&kubectl)
            .arg("kustomize")
            .arg(&overlay)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "kubectl kustomize {name}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let rendered = String::from_utf8(output.stdout).unwrap();
        let template = CLUSTERCTL_TEMPLATES.contains(&name.as_str());
        for (at, _) in rendered.match_indices("${") {
            let end = rendered[at..]
                .find('}')
                .map_or(rendered.len(), |e| at + e + 1);
            let variable = &rendered[at..end];
            if OTHER_TEMPLATE_VARIABLES.contains(&variable) {
                continue;
            }
            if !template {
                wrong.push(format!(
                    "{name}: {variable} (not a clusterctl template: it must apply as rendered)"
                ));
            } else if !variable.contains(":=") {
                wrong.push(format!(
                    "{name}: {variable} has no default (`${{NAME:=default}}`)"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "unsubstituted variables in rendered overlays: {wrong:#?}"
    );
}

/// Fields of other projects' objects and settings that the docs name: Kubernetes (webhook,
/// RBAC, Pod, NetworkPolicy, admission, CertificateSigningRequest), Cluster API and CK8s (Machine, CK8sConfig, k8sd), kubeconfig, and
/// kube-prometheus-stack's Helm values.
const OTHER_FIELDS: &[&str] = &[
    "caBundle",
    "clientConfig",
    "failurePolicy",
    "managedFields",
    "matchConditions",
    "objectSelector",
    "resourceNames",
    "resourceVersion",
    "serviceAccount",
    "terminationGracePeriodSeconds",
    "userInfo",
    "ipBlock",
    "signerName",
    "nodeRef",
    "controlPlaneEndpoint",
    "extraSANs",
    "certificatesExpiryDate",
    "nodeDrainTimeout",
    "nodeDrainTimeoutSeconds",
    "upToDateReplicas",
    "updatedReplicas",
    "tokenFile",
    "prometheusSpec",
    "podMonitorSelectorNilUsesHelmValues",
    "ruleSelectorNilUsesHelmValues",
    "searchNamespace",
];

/// Calls `visit` with every `properties` mapping of the CRDs this project installs
/// (`config/crd/bases`), nested ones included.
fn each_crd_properties(mut visit: impl FnMut(&serde_yaml::Mapping)) {
    fn walk(value: &serde_yaml::Value, visit: &mut impl FnMut(&serde_yaml::Mapping)) {
        match value {
            serde_yaml::Value::Mapping(map) => {
                for (key, value) in map {
                    if key.as_str() == Some("properties")
                        && let Some(properties) = value.as_mapping()
                    {
                        visit(properties);
                    }
                    walk(value, visit);
                }
            }
            serde_yaml::Value::Sequence(items) => items.iter().for_each(|v| walk(v, visit)),
            _ => {}
        }
    }
    for crd in files(&root().join("config/crd/bases"), &[".yaml"]) {
        let text = std::fs::read_to_string(crd).unwrap();
        walk(&serde_yaml::from_str(&text).unwrap(), &mut visit);
    }
}

/// Property names of the CRDs this project installs.
fn crd_properties() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    each_crd_properties(|properties| {
        names.extend(
            properties
                .keys()
                .filter_map(|k| k.as_str().map(str::to_owned)),
        );
    });
    names
}

/// `lastRefresh` → `last_refresh`.
fn snake(camel: &str) -> String {
    let mut out = String::new();
    for c in camel.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

#[test]
fn every_field_in_the_docs_exists() {
    let properties = crd_properties();
    assert!(properties.contains("maxParallelWorkers"), "{properties:?}");
    let code = code();
    let mut unknown = BTreeSet::new();
    for (path, text) in markdown()
        .into_iter()
        .filter(|(p, _)| !p.components().any(|c| c.as_os_str() == "design"))
    {
        for (n, fence, line) in lines_with_fences(&text) {
            if fence.is_some() {
                continue;
            }
            for span in code_spans(line) {
                for word in span.split(|c: char| !c.is_ascii_alphanumeric()) {
                    // A field: lowerCamelCase (`renewBefore`, `status.kubeconfig.lastRenewalTime`).
                    let field = word.starts_with(|c: char| c.is_ascii_lowercase())
                        && word.chars().any(|c| c.is_ascii_uppercase());
                    if field
                        && !properties.contains(word)
                        && !OTHER_FIELDS.contains(&word)
                        // A serde field of ours (the plugin's `-o json` rows).
                        && !code.contains(&format!("pub {}:", snake(word)))
                    {
                        unknown.insert(format!("{}:{n}: {word}", shown(&path)));
                    }
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "fields in the docs that no CRD of ours (config/crd/bases) and no list of other projects' fields has: {unknown:#?}"
    );
}

/// What the CRDs say of each property: its `default:` and its description, per CRD that has
/// it.
fn crd_property_facts() -> Vec<(String, Option<String>, String)> {
    let mut facts = Vec::new();
    each_crd_properties(|properties| {
        for (name, schema) in properties {
            let default = match &schema["default"] {
                serde_yaml::Value::Null => None,
                serde_yaml::Value::String(s) => Some(s.clone()),
                other => serde_yaml::to_string(other)
                    .ok()
                    .map(|s| s.trim().to_owned()),
            };
            let description = schema["description"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if let Some(name) = name.as_str() {
                facts.push((name.to_owned(), default, description));
            }
        }
    });
    facts
}

/// `(field, default)` of the docs' "`field` (…, default X)" and of sample YAML lines
/// "field: value  # … (default X)".
fn documented_defaults(line: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let value_of = |text: &str| -> Option<String> {
        let after = text.split("default ").nth(1)?;
        let value: String = after
            .trim_start_matches('`')
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '.')
            .collect();
        (!value.is_empty()).then_some(value)
    };
    // YAML: `  name: value   # … (default X)`.
    if let Some((before, comment)) = line.split_once('#')
        && let Some((name, _)) = before.trim().split_once(':')
        && name.chars().all(|c| c.is_ascii_alphanumeric())
        && let Some(value) = value_of(comment)
    {
        found.push((name.to_owned(), value));
    }
    // Prose: "`name` (…default X…)".
    let mut rest = line;
    while let Some(at) = rest.find("` (") {
        let name = rest[..at].rsplit('`').next().unwrap_or_default();
        let inside = &rest[at + 3..];
        let close = inside.find(')').unwrap_or(inside.len());
        if name.chars().all(|c| c.is_ascii_alphanumeric())
            && let Some(value) = value_of(&inside[..close])
        {
            found.push((name.to_owned(), value));
        }
        rest = &inside[close..];
    }
    found
}

#[test]
fn every_default_of_a_crd_field_in_the_docs_is_the_crds() {
    let facts = crd_property_facts();
    let mut wrong = BTreeSet::new();
    let mut checked = 0;
    for (path, text) in markdown()
        .into_iter()
        .filter(|(p, _)| !p.components().any(|c| c.as_os_str() == "design"))
    {
        for (n, _, line) in lines_with_fences(&text) {
            for (field, value) in documented_defaults(line) {
                let ours: Vec<_> = facts.iter().filter(|(name, _, _)| *name == field).collect();
                if ours.is_empty() {
                    continue; // not a field of our CRDs
                }
                checked += 1;
                // The schema's default, or the one its description states ("Default 2.",
                // "Omitted: UTC.", "When neither is set: 30d.").
                let agrees = ours.iter().any(|(_, default, description)| {
                    let description = description.split_whitespace().collect::<Vec<_>>().join(" ");
                    let description = description.to_lowercase();
                    let value = value.to_lowercase();
                    default.as_deref().map(str::to_lowercase) == Some(value.clone())
                        || ["default ", "default: ", "omitted: ", "set: "]
                            .iter()
                            .any(|lead| description.contains(&format!("{lead}{value}")))
                });
                if !agrees {
                    let said: Vec<String> = ours
                        .iter()
                        .map(|(_, d, desc)| format!("default {d:?}, description {desc:?}"))
                        .collect();
                    wrong.insert(format!(
                        "{}:{n}: {field} default {value}, but the CRD says {said:?}",
                        shown(&path)
                    ));
                }
            }
        }
    }
    assert!(
        checked >= 3,
        "only {checked} CRD defaults found in the docs"
    );
    assert!(
        wrong.is_empty(),
        "defaults in the docs that the CRDs do not have: {wrong:#?}"
    );
}

/// The checks' own parsers, on cases the docs hold.
#[test]
fn the_parsers_read_what_the_docs_write() {
    assert_eq!(
        slug(" CertificateRefresh (`certificates.ck8s.io/v1alpha1`, short name `crefresh`)"),
        "certificaterefresh-certificatesck8siov1alpha1-short-name-crefresh"
    );
    assert_eq!(slug(" A — b: [c](d.md) e_f"), "a--b-c-e_f");
    let anchors = anchors("# T\n## Two shards\n```\n# not a heading\n```\n## Two shards\n");
    assert_eq!(
        anchors,
        ["t", "two-shards", "two-shards-1"].map(String::from).into()
    );
    assert_eq!(
        selectors(
            r#"x ck8s_certs_k8sd_requests_total{endpoint="run",outcome!="success"} and ck8s_certs_kubeconfig_expiry_timestamp_seconds{namespace, certificate="client"|"ca"} ck8s_certs_renewal_deferred_total{reason=~"backoff|outside_window"}"#
        ),
        [
            ("ck8s_certs_k8sd_requests_total", "endpoint", vec!["run"]),
            ("ck8s_certs_k8sd_requests_total", "outcome", vec!["success"]),
            (
                "ck8s_certs_kubeconfig_expiry_timestamp_seconds",
                "certificate",
                vec!["client", "ca"]
            ),
            (
                "ck8s_certs_renewal_deferred_total",
                "reason",
                vec!["backoff", "outside_window"]
            ),
        ]
        .map(|(f, l, v)| (
            f.to_owned(),
            l.to_owned(),
            v.into_iter().map(String::from).collect::<Vec<_>>()
        ))
    );
    assert_eq!(
        cited_paths(
            "see `config/rbac/role.yaml`, https://x.io//config/monitoring and ~/.config/a, tests/fleet.rs."
        ),
        ["config/rbac/role.yaml", "tests/fleet.rs"]
    );
    assert_eq!(
        make_command_targets(r#"make bench BENCH_FLAGS="--clusters 10" tools && make x"#),
        ["bench", "tools"]
    );
    assert_eq!(
        documented_defaults(
            "`maxParallelWorkers` (1-100, default 2), `continueOnFailure` (default false)"
        ),
        [("maxParallelWorkers", "2"), ("continueOnFailure", "false")]
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
    );
    let controller = <ck8s_certs::cli::Args as clap::CommandFactory>::command();
    assert!(
        foreign_flags(
            controller.clone(),
            &["policy", "preview", "-f", "p.yaml", "--expiry", "x"]
        )
        .is_empty()
    );
    assert_eq!(
        foreign_flags(
            controller,
            &["--strict", "policy", "preview", "--leader-elect"]
        ),
        [
            "--strict is not a flag of `ck8s-certs`",
            "--leader-elect is not a flag of `ck8s-certs policy preview`"
        ]
    );
    let variables = docsgen::clusterctl_variables(
        "  # A note.\n  - name: A\n    value: \"${A:=1}\"\n  - name: B\n    value: \"${B:=x}\"\n",
    );
    assert_eq!(
        variables,
        [("A", "1", "A note."), ("B", "x", "")].map(|(a, b, c)| (
            a.to_owned(),
            b.to_owned(),
            c.to_owned()
        ))
    );
}

/// The NetworkPolicy of `overlay` as `kubectl kustomize` renders it.
fn network_policy_of(kubectl: &Path, overlay: &str) -> serde_yaml::Value {
    let output = std::process::Command::new(kubectl)
        .arg("kustomize")
        .arg(root().join(overlay))
        .output()
        .unwrap();
    assert!(output.status.success(), "kubectl kustomize {overlay}");
    let text = String::from_utf8(output.stdout).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .find(|object: &serde_yaml::Value| object["kind"].as_str() == Some("NetworkPolicy"))
        .unwrap_or_else(|| panic!("{overlay} renders no NetworkPolicy"))
}

/// `config/network-policy-narrow` replaces the installed policy (same name, namespace and pods),
/// admits the same ports, and each of them only from somewhere.
#[test]
fn the_narrow_network_policy_replaces_the_installed_one() {
    if std::env::var_os("CK8S_DOCS_WITHOUT_KUBECTL").is_some() {
        eprintln!("the_narrow_network_policy_replaces_the_installed_one: not run (no kubectl)");
        return;
    }
    let kubectl = ck8s_certs_e2e::tool("CK8S_E2E_KUBECTL", "kubectl", "KUBE_VERSION");
    let installed = network_policy_of(&kubectl, "config/default");
    let narrow = network_policy_of(&kubectl, "config/network-policy-narrow");
    for field in ["name", "namespace"] {
        assert_eq!(
            installed["metadata"][field], narrow["metadata"][field],
            "{field}"
        );
    }
    assert_eq!(
        installed["spec"]["podSelector"],
        narrow["spec"]["podSelector"]
    );
    let ports = |policy: &serde_yaml::Value| -> BTreeSet<String> {
        policy["spec"]["ingress"]
            .as_sequence()
            .unwrap()
            .iter()
            .flat_map(|rule| rule["ports"].as_sequence().unwrap().clone())
            .map(|port| port["port"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(ports(&installed), ports(&narrow));
    for rule in narrow["spec"]["ingress"].as_sequence().unwrap() {
        assert!(
            rule["from"]
                .as_sequence()
                .is_some_and(|from| !from.is_empty()),
            "a rule from anywhere: {rule:?}"
        );
    }
}

/// `config/namespaced` splits the controller's rules, not changes them: its Role and its narrow
/// ClusterRole hold together exactly the rules of `config/rbac/role.yaml`.
#[test]
fn the_namespaced_install_splits_the_manager_role_without_changing_it() {
    let rules = |path: &str| -> Vec<serde_yaml::Value> {
        let text = std::fs::read_to_string(root().join(path)).unwrap();
        serde_yaml::Deserializer::from_str(&text)
            .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
            .filter(|o: &serde_yaml::Value| {
                matches!(o["kind"].as_str(), Some("Role" | "ClusterRole"))
            })
            .flat_map(|o: serde_yaml::Value| o["rules"].as_sequence().unwrap().clone())
            .collect()
    };
    let mut split = rules("config/namespaced/role.yaml");
    split.extend(rules("config/namespaced/cluster_role.yaml"));
    let shown = |rules: &[serde_yaml::Value]| -> BTreeSet<String> {
        rules
            .iter()
            .map(|r| serde_yaml::to_string(r).unwrap())
            .collect()
    };
    let whole = rules("config/rbac/role.yaml");
    assert_eq!(shown(&split), shown(&whole));
    assert_eq!(split.len(), whole.len(), "a rule twice");
}
