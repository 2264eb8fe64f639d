//! The parts of the docs that are generated from the code: the flag tables (clap), the metrics
//! table (the registry and [`ck8s_certs::metrics::label_values`]), the Event reasons and
//! conditions (`api/src/reasons.rs`) and the clusterctl variables (`config/manager/manager.yaml`).
//! Each sits in its doc between a begin and an end marker; `make docs` rewrites them
//! (`src/bin/docsgen.rs`) and `tests/docs.rs` fails when a committed doc differs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ck8s_certs::metrics::{
    ControllerLabels, EndpointLabels, K8sdCallLabels, KubeconfigLabels, MachineLabels, Metrics,
    OriginLabels, ReasonLabels, ReconcileErrorLabels, RefreshLabels, ResultLabels,
};
use clap::CommandFactory;

#[derive(Debug, thiserror::Error)]
pub enum DocsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}: no `{marker}` marker (a generated region needs both of its markers)")]
    Marker { file: String, marker: String },
    #[error("encoding the metrics: {0}")]
    Encode(#[from] std::fmt::Error),
    #[error("{0}")]
    Inconsistent(String),
}

/// One generated region: the doc it lives in (relative to the repository), its name in the
/// markers, and its content.
#[derive(Debug)]
pub struct Region {
    pub file: &'static str,
    pub name: &'static str,
    pub content: String,
}

pub fn begin_marker(name: &str) -> String {
    format!("<!-- BEGIN GENERATED {name}: edit its source and run `make docs` -->")
}

pub fn end_marker(name: &str) -> String {
    format!("<!-- END GENERATED {name} -->")
}

/// Every generated region, from the code and the files under `root`.
pub fn regions(root: &Path) -> Result<Vec<Region>, DocsError> {
    let read = |path: &str| {
        let path = root.join(path);
        std::fs::read_to_string(&path).map_err(|source| DocsError::Io { path, source })
    };
    let controller = ck8s_certs::cli::Args::command();
    let preview = controller
        .find_subcommand("policy")
        .and_then(|p| p.find_subcommand("preview"))
        .cloned()
        .ok_or_else(|| DocsError::Inconsistent("no `policy preview` subcommand".into()))?;
    Ok(vec![
        Region {
            file: "docs/reference.md",
            name: "flags",
            content: flags_table(&controller),
        },
        Region {
            file: "docs/reference.md",
            name: "policy-preview-flags",
            content: flags_table(&preview),
        },
        Region {
            file: "docs/reference.md",
            name: "plugin-flags",
            content: plugin_tables(),
        },
        Region {
            file: "docs/reference.md",
            name: "metrics",
            content: metrics_table()?,
        },
        Region {
            file: "docs/reference.md",
            name: "reasons",
            content: reasons_tables(&read("api/src/reasons.rs")?)?,
        },
        Region {
            file: "docs/reference.md",
            name: "alerts",
            content: alerts_table(&read("config/monitoring/rules/ck8s-certs.rules.yaml")?)?,
        },
        Region {
            file: "docs/install.md",
            name: "clusterctl-variables",
            content: variables_table(&read("config/manager/manager.yaml")?, &controller)?,
        },
    ])
}

/// The alerts of the shipped rules file: name, severity, `for`, summary, and the runbook's
/// section in docs/monitoring.md.
fn alerts_table(rules: &str) -> Result<String, DocsError> {
    let rules: serde_yaml::Value = serde_yaml::from_str(rules)
        .map_err(|err| DocsError::Inconsistent(format!("the alerting rules: {err}")))?;
    let mut table = String::from("| alert | severity | for | summary |\n|---|---|---|---|\n");
    let groups = rules["groups"].as_sequence().into_iter().flatten();
    for rule in groups.flat_map(|g| g["rules"].as_sequence().into_iter().flatten()) {
        let Some(alert) = rule["alert"].as_str() else {
            continue;
        };
        let text = |value: &serde_yaml::Value| value.as_str().unwrap_or("").to_owned();
        table.push_str(&format!(
            "| [`{alert}`](monitoring.md#{}) | {} | {} | {} |\n",
            alert.to_lowercase(),
            text(&rule["labels"]["severity"]),
            Some(text(&rule["for"]))
                .filter(|f| !f.is_empty())
                .unwrap_or("—".into()),
            cell(&text(&rule["annotations"]["summary"])),
        ));
    }
    Ok(table)
}

/// `text` with the region `name` replaced by `content`.
pub fn replace_region(
    file: &str,
    text: &str,
    name: &str,
    content: &str,
) -> Result<String, DocsError> {
    let (begin, end) = (begin_marker(name), end_marker(name));
    let missing = |marker: &str| DocsError::Marker {
        file: file.to_owned(),
        marker: marker.to_owned(),
    };
    let start = text.find(&begin).ok_or_else(|| missing(&begin))? + begin.len();
    let stop = text[start..].find(&end).ok_or_else(|| missing(&end))? + start;
    Ok(format!("{}\n{content}{}", &text[..start], &text[stop..]))
}

/// Every doc with generated regions: its path, committed text and generated text.
pub fn generated_docs(root: &Path) -> Result<Vec<(PathBuf, String, String)>, DocsError> {
    let mut by_file: BTreeMap<&str, Vec<Region>> = BTreeMap::new();
    for region in regions(root)? {
        by_file.entry(region.file).or_default().push(region);
    }
    let mut docs = Vec::new();
    for (file, regions) in by_file {
        let path = root.join(file);
        let committed = std::fs::read_to_string(&path).map_err(|source| DocsError::Io {
            path: path.clone(),
            source,
        })?;
        let mut text = committed.clone();
        for region in regions {
            text = replace_region(file, &text, region.name, &region.content)?;
        }
        docs.push((path, committed, text));
    }
    Ok(docs)
}

/// Text for a markdown table cell: one line, pipes escaped, and `<` outside code spans
/// escaped (`<cluster>-kubeconfig` would be read as an HTML tag).
fn cell(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    line.split('`')
        .enumerate()
        .map(|(i, part)| {
            let part = part.replace('|', "\\|");
            if i % 2 == 0 {
                part.replace('<', "&lt;")
            } else {
                part
            }
        })
        .collect::<Vec<_>>()
        .join("`")
}

fn code_list<'a>(values: impl IntoIterator<Item = &'a str>) -> String {
    values
        .into_iter()
        .map(|v| format!("`{v}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One row per flag of `command`, in declaration order: flag, environment variable, default,
/// help (clap's long help, which is the doc comment), and the values it takes when they are
/// a fixed set.
pub fn flags_table(command: &clap::Command) -> String {
    let mut out = String::from("| flag | env | default | meaning |\n|---|---|---|---|\n");
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "help" | "version") {
            continue;
        }
        let mut name = format!("`--{long}`");
        if let Some(short) = arg.get_short() {
            name = format!("`-{short}`, {name}");
        }
        let env = arg
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_default();
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let mut default = code_list(defaults.iter().map(String::as_str));
        let bare = bare_value(command, arg);
        if !bare.is_empty() {
            default = format!(
                "{default} (bare flag: {})",
                code_list(bare.iter().map(String::as_str))
            );
        }
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        let mut meaning = cell(&help);
        // clap drops the final period of a one-paragraph help.
        if !meaning.is_empty() && !meaning.ends_with(['.', '!', '?']) {
            meaning.push('.');
        }
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| v.get_name().to_owned())
            .collect();
        if !values.is_empty() && values != ["true", "false"] {
            meaning.push_str(&format!(
                " Values: {}.",
                code_list(values.iter().map(String::as_str))
            ));
        }
        if arg.is_required_set() {
            meaning.push_str(" Required.");
        }
        out.push_str(&format!("| {name} | {env} | {default} | {meaning} |\n"));
    }
    out
}

/// What a flag given without a value means (clap has no getter for it: parse the bare flag).
fn bare_value(command: &clap::Command, arg: &clap::Arg) -> Vec<String> {
    let (Some(long), Some(range)) = (arg.get_long(), arg.get_num_args()) else {
        return Vec::new();
    };
    if range.min_values() > 0 || !arg.get_action().takes_values() {
        return Vec::new();
    }
    let matches = command
        .clone()
        .ignore_errors(true)
        .try_get_matches_from([command.get_name().to_owned(), format!("--{long}")]);
    matches
        .ok()
        .and_then(|m| {
            m.get_raw(arg.get_id().as_str())
                .map(|v| v.map(|v| v.to_string_lossy().into_owned()).collect())
        })
        .unwrap_or_default()
}

/// The kubectl plugin: its own flags, then each command's.
fn plugin_tables() -> String {
    let plugin = ck8s_certs::plugin::PluginArgs::command();
    let mut out = String::new();
    let mut stack: Vec<(String, clap::Command)> = vec![("kubectl ck8s-certs".into(), plugin)];
    while let Some((path, command)) = stack.pop() {
        let table = flags_table(&command);
        if table.lines().count() > 2 {
            out.push_str(&format!("`{path}`:\n\n{table}\n"));
        }
        // Reversed onto the stack: printed in declaration order.
        let subs: Vec<clap::Command> = command.get_subcommands().cloned().collect();
        for sub in subs.into_iter().rev() {
            // The plugin's `policy preview` is `ck8s-certs policy preview`, listed above.
            if !matches!(sub.get_name(), "help" | "policy") {
                stack.push((format!("{path} {}", sub.get_name()), sub));
            }
        }
    }
    out.trim_end().to_owned() + "\n"
}

/// A placeholder for labels that name objects (namespace, cluster, machine).
const ANY: &str = "<any>";

/// Every family of the registry with every listed label value, as the text exposition.
fn exhibited() -> Result<String, DocsError> {
    let values = ck8s_certs::metrics::label_values();
    let of = |family: &str, label: &str| -> Vec<String> {
        values
            .iter()
            .find(|(f, l, _)| *f == family && *l == label)
            .map(|(_, _, v)| v.iter().map(|s| s.to_string()).collect())
            .unwrap_or_else(|| vec![ANY.to_owned()])
    };
    let m = Metrics::default();
    // Every Machine shown overdue too, so that both families are listed.
    let machines: Vec<(MachineLabels, f64, Option<f64>)> =
        of("certificate_expiry_timestamp_seconds", "role")
            .into_iter()
            .map(|role| {
                (
                    MachineLabels {
                        namespace: ANY.into(),
                        cluster: ANY.into(),
                        machine: ANY.into(),
                        role,
                    },
                    0.0,
                    Some(0.0),
                )
            })
            .collect();
    m.expiry.read_from(machines);
    let halted: Vec<(String, String, String, f64)> =
        of("renewals_halted_since_timestamp_seconds", "scope")
            .into_iter()
            .map(|scope| (ANY.into(), ANY.into(), scope, 0.0))
            .collect();
    m.halted.read_from(halted);
    for certificate in of("kubeconfig_expiry_timestamp_seconds", "certificate") {
        let _ = m.kubeconfig_expiry.get_or_create(&KubeconfigLabels {
            namespace: ANY.into(),
            cluster: ANY.into(),
            certificate,
        });
    }
    let _ = m
        .cluster_expired_since
        .get_or_create(&ck8s_certs::metrics::ClusterLabels {
            namespace: ANY.into(),
            cluster: ANY.into(),
        });
    for result in of("kubeconfig_renewals", "result") {
        let _ = m
            .kubeconfig_renewals
            .get_or_create(&ResultLabels { result });
    }
    for (family, metric) in [
        ("renewals_started", &m.renewals_started),
        ("renewals_succeeded", &m.renewals_succeeded),
        ("renewals_failed", &m.renewals_failed),
    ] {
        for origin in of(family, "origin") {
            let _ = metric.get_or_create(&OriginLabels { origin });
        }
    }
    for (family, metric) in [
        ("renewal_deferred", &m.renewal_deferred),
        ("renewal_bypassed", &m.renewal_bypassed),
        ("renewal_config_invalid", &m.policy_invalid),
    ] {
        for reason in of(family, "reason") {
            let _ = metric.get_or_create(&ReasonLabels { reason });
        }
    }
    for origin in of("refresh_duration_seconds", "origin") {
        for role in of("refresh_duration_seconds", "role") {
            for result in of("refresh_duration_seconds", "result") {
                let _ = m.refresh_duration.get_or_create(&RefreshLabels {
                    origin: origin.clone(),
                    role: role.clone(),
                    result,
                });
            }
        }
    }
    for endpoint in of("k8sd_requests", "endpoint") {
        for outcome in of("k8sd_requests", "outcome") {
            let _ = m.k8sd.requests.get_or_create(&K8sdCallLabels {
                endpoint: endpoint.clone(),
                outcome,
            });
        }
    }
    for endpoint in of("k8sd_request_duration_seconds", "endpoint") {
        let _ = m.k8sd.duration.get_or_create(&EndpointLabels { endpoint });
    }
    for controller in of("reconcile_duration_seconds", "controller") {
        let _ = m
            .reconcile_duration
            .get_or_create(&ControllerLabels { controller });
    }
    for controller in of("reconcile_errors", "controller") {
        for category in of("reconcile_errors", "category") {
            let _ = m.reconcile_errors.get_or_create(&ReconcileErrorLabels {
                controller: controller.clone(),
                category,
            });
        }
    }
    Ok(m.encode()?)
}

/// One metric family as the exposition shows it.
#[derive(Debug, Default)]
pub struct Family {
    pub name: String,
    pub kind: String,
    pub help: String,
    /// Label names in exposition order, each with the values seen (in order).
    pub labels: Vec<(String, Vec<String>)>,
    /// Histogram bucket bounds (`le`) of the first series.
    pub buckets: Vec<String>,
}

/// The `k="v"` pairs of one sample's braces.
fn sample_labels(braces: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut rest = braces;
    while let Some(eq) = rest.find("=\"") {
        let name = rest[..eq].trim_start_matches(',').trim().to_owned();
        let after = &rest[eq + 2..];
        let end = after.find('"').unwrap_or(after.len());
        pairs.push((name, after[..end].to_owned()));
        rest = after.get(end + 1..).unwrap_or("");
    }
    pairs
}

/// Every family the controller exports, with every label value it can take.
pub fn families() -> Result<Vec<Family>, DocsError> {
    let text = exhibited()?;
    let mut families: Vec<Family> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.push(Family {
                name: name.to_owned(),
                help: help.to_owned(),
                ..Family::default()
            });
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let (Some(family), Some((_, kind))) = (families.last_mut(), rest.split_once(' ')) {
                family.kind = kind.to_owned();
            }
        } else if !line.starts_with('#')
            && let (Some(family), Some((_, braces))) = (families.last_mut(), line.split_once('{'))
        {
            let braces = braces.rsplit_once('}').map_or(braces, |(b, _)| b);
            for (name, value) in sample_labels(braces) {
                if name == "le" {
                    if !family.buckets.contains(&value) {
                        family.buckets.push(value);
                    }
                    continue;
                }
                match family.labels.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, values)) => {
                        if !values.contains(&value) {
                            values.push(value);
                        }
                    }
                    None => family.labels.push((name, vec![value])),
                }
            }
        }
    }
    // Every listed label is a label of its family; its values in the listed order (the
    // registry's is a hash map's).
    for (family, label, values) in ck8s_certs::metrics::label_values() {
        let name = format!("ck8s_certs_{family}");
        let known = families
            .iter_mut()
            .filter(|f| f.name == name)
            .flat_map(|f| f.labels.iter_mut())
            .find(|(l, _)| l == label);
        if let Some((_, seen)) = known {
            *seen = values.iter().map(|v| v.to_string()).collect();
        } else {
            return Err(DocsError::Inconsistent(format!(
                "metrics::label_values() lists {label} of {name}, which has no such label"
            )));
        }
    }
    Ok(families)
}

/// The name users query: counters carry `_total`.
pub fn sample_name(family: &Family) -> String {
    match family.kind.as_str() {
        "counter" => format!("{}_total", family.name),
        _ => family.name.clone(),
    }
}

fn metrics_table() -> Result<String, DocsError> {
    let families = families()?;
    let mut out = String::from("| metric | type | labels (values) | help |\n|---|---|---|---|\n");
    for family in &families {
        let labels: Vec<String> = family
            .labels
            .iter()
            .map(|(name, values)| {
                if values.iter().any(|v| v == ANY) {
                    name.clone()
                } else {
                    format!("{name} ({})", code_list(values.iter().map(String::as_str)))
                }
            })
            .collect();
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            sample_name(family),
            family.kind,
            labels.join("; "),
            cell(&family.help)
        ));
    }
    out.push_str("\nHistogram buckets (upper bounds, seconds; each histogram also has `_sum` and `_count`):\n\n");
    for family in families.iter().filter(|f| f.kind == "histogram") {
        // `le` as the exposition writes it is a float's shortest form (0.009000000000000001).
        let bounds: Vec<String> = family
            .buckets
            .iter()
            .map(|b| match b.parse::<f64>() {
                Ok(v) if v.is_finite() => format!("{}", (v * 1e9).round() / 1e9),
                _ => b.clone(),
            })
            .collect();
        out.push_str(&format!("- `{}`: {}\n", family.name, bounds.join(", ")));
    }
    Ok(out)
}

/// `(module, [(value, doc)])` of `pub mod x { /// doc  pub const NAME: &str = "Value"; }`.
pub fn reason_modules(source: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut modules: Vec<(String, Vec<(String, String)>)> = Vec::new();
    let mut doc = Vec::new();
    for line in source.lines().map(str::trim) {
        if let Some(name) = line
            .strip_prefix("pub mod ")
            .and_then(|r| r.strip_suffix(" {"))
        {
            modules.push((name.to_owned(), Vec::new()));
            doc.clear();
        } else if let Some(text) = line.strip_prefix("///") {
            doc.push(text.trim().to_owned());
        } else if line.starts_with("pub const ") {
            if let (Some(module), Some(value)) = (modules.last_mut(), line.split('"').nth(1)) {
                module.1.push((value.to_owned(), doc.join(" ")));
            }
            doc.clear();
        } else {
            doc.clear();
        }
    }
    modules
}

fn reasons_tables(source: &str) -> Result<String, DocsError> {
    let modules = reason_modules(source);
    let mut out = String::new();
    for (module, title) in [
        ("events", "Event reasons (`kubectl get events`)"),
        ("conditions", "MachineCertificates condition types"),
        ("condition_reasons", "Condition reasons"),
    ] {
        let entries = modules
            .iter()
            .find(|(m, _)| m == module)
            .map(|(_, e)| e)
            .ok_or_else(|| {
                DocsError::Inconsistent(format!("api/src/reasons.rs has no `pub mod {module}`"))
            })?;
        out.push_str(&format!("{title}:\n\n| name | meaning |\n|---|---|\n"));
        for (value, doc) in entries {
            out.push_str(&format!("| `{value}` | {} |\n", cell(doc)));
        }
        out.push('\n');
    }
    Ok(out.trim_end().to_owned() + "\n")
}

/// `${NAME:=default}` occurrences of `manifest`, with the comment lines right above the
/// `- name:` entry they belong to.
pub fn clusterctl_variables(manifest: &str) -> Vec<(String, String, String)> {
    let mut found = Vec::new();
    let mut comment: Vec<String> = Vec::new();
    let mut held = Vec::new();
    for line in manifest.lines() {
        let trimmed = line.trim();
        if let Some(text) = trimmed.strip_prefix('#') {
            comment.push(text.trim().to_owned());
            continue;
        }
        if trimmed.starts_with("- name:") {
            held = std::mem::take(&mut comment);
        } else if !trimmed.starts_with("value:") {
            held.clear();
        }
        comment.clear();
        let mut rest = trimmed;
        while let Some(at) = rest.find("${") {
            let after = &rest[at + 2..];
            let Some(end) = after.find('}') else { break };
            if let Some((name, default)) = after[..end].split_once(":=") {
                found.push((name.to_owned(), default.to_owned(), held.join(" ")));
            }
            rest = &after[end..];
        }
    }
    found
}

fn variables_table(manifest: &str, controller: &clap::Command) -> Result<String, DocsError> {
    let mut out = String::from(
        "| variable | default | controller setting ([reference](reference.md#flags)) |\n|---|---|---|\n",
    );
    for (name, default, note) in clusterctl_variables(manifest) {
        let flag = controller
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|e| e == name.as_str()))
            .and_then(|a| a.get_long())
            .ok_or_else(|| {
                DocsError::Inconsistent(format!(
                    "config/manager/manager.yaml: ${{{name}}} is no flag's environment variable"
                ))
            })?;
        let note = if note.is_empty() {
            String::new()
        } else {
            format!(": {}", cell(&note))
        };
        out.push_str(&format!("| `{name}` | `{default}` | `--{flag}`{note} |\n"));
    }
    Ok(out)
}
