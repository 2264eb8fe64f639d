//! config/monitoring against the metrics the controller exports: every metric an alert or a
//! dashboard panel queries exists under that exact name (counters with `_total`, histograms with
//! `_bucket`/`_sum`/`_count`), and the dashboard has the shape Grafana loads (schema-level
//! checks; promtool parses its queries in the e2e suite, test/e2e/tests/monitoring.rs).

// A test: its helpers panic with a message, which is how a test fails.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use ck8s_certs::metrics::Metrics;

fn file(path: &str) -> String {
    let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), path].iter().collect();
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// A registry with a sample in every family: the encoder leaves out families without one.
fn populated() -> Metrics {
    use ck8s_certs::metrics::{
        Controller, K8sdEndpoint, KubeconfigLabels, MachineLabels, ReasonLabels, RefreshLabels,
    };
    let metrics = Metrics::default();
    metrics
        .kubeconfig_expiry
        .get_or_create(&KubeconfigLabels {
            namespace: "fleet".into(),
            cluster: "alpha".into(),
            certificate: "client".into(),
        })
        .set(1.0);
    metrics.expiry.read_from(vec![(
        MachineLabels {
            namespace: "fleet".into(),
            cluster: "alpha".into(),
            machine: "alpha-cp-0".into(),
            role: "control-plane".into(),
        },
        1.0,
        // Overdue: its series exists only then.
        Some(1.0),
    )]);
    // A policy whose circuit breaker is open: its series exists only then.
    metrics.halted.read_from(vec![(
        "fleet".to_owned(),
        "edge".to_owned(),
        "policy".to_owned(),
        1.0,
    )]);
    metrics
        .refresh_duration
        .get_or_create(&RefreshLabels {
            origin: "manual".into(),
            role: "control-plane".into(),
            result: "succeeded".into(),
        })
        .observe(1.0);
    metrics
        .policy_invalid
        .get_or_create(&ReasonLabels {
            reason: "config_invalid".into(),
        })
        .inc();
    metrics
        .cluster_expired_since
        .get_or_create(&ck8s_certs::metrics::ClusterLabels {
            namespace: "fleet".into(),
            cluster: "alpha".into(),
        })
        .set(1.0);
    metrics.k8sd.start(K8sdEndpoint::Plan).finish("success");
    metrics.reconciled(Controller::Machine, std::time::Duration::ZERO, Some("kube"));
    metrics
}

/// Sample names the controller exports, from the `# TYPE` lines of the registry.
fn exported() -> BTreeSet<String> {
    let text = populated().encode().unwrap();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

/// The `ck8s_certs_*` metric names a PromQL expression mentions.
fn metrics_in(expr: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("ck8s_certs_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        found.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    found
}

fn rules() -> Vec<serde_yaml::Value> {
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&file("config/monitoring/rules/ck8s-certs.rules.yaml")).unwrap();
    rules["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap().clone())
        .collect()
}

fn dashboard() -> serde_json::Value {
    serde_json::from_str(&file("config/monitoring/dashboards/ck8s-certs.json")).unwrap()
}

#[test]
fn the_registry_lists_the_families_the_monitoring_needs() {
    let names = exported();
    for name in [
        "ck8s_certs_certificate_expiry_timestamp_seconds",
        "ck8s_certs_k8sd_requests_total",
        "ck8s_certs_k8sd_request_duration_seconds_bucket",
        "ck8s_certs_reconcile_duration_seconds_count",
        "ck8s_certs_reconcile_errors_total",
        "ck8s_certs_renewal_config_invalid_total",
        "ck8s_certs_leader",
    ] {
        assert!(names.contains(name), "{name} not in {names:?}");
    }
}

#[test]
fn every_alert_queries_exported_metrics_only() {
    let exported = exported();
    for rule in rules() {
        let name = rule["alert"].as_str().unwrap();
        let expr = rule["expr"].as_str().unwrap();
        let metrics = metrics_in(expr);
        // Only the controller-down alert looks at Prometheus' own `up` of the PodMonitor's job.
        assert!(
            !metrics.is_empty() || expr.contains(r#"up{job="ck8s-certs"}"#),
            "{name} queries no ck8s-certs metric"
        );
        for metric in metrics {
            assert!(
                exported.contains(&metric),
                "alert {name} queries {metric}, which the controller does not export"
            );
        }
        for key in ["summary", "description", "runbook_url"] {
            assert!(
                rule["annotations"][key].as_str().is_some(),
                "{name} lacks {key}"
            );
        }
        let severity = rule["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("warning" | "critical")),
            "{name}: {severity:?}"
        );
    }
}

#[test]
fn every_alert_has_a_runbook_section_in_the_docs() {
    let docs = file("docs/monitoring.md");
    for rule in rules() {
        let name = rule["alert"].as_str().unwrap();
        let anchor = name.to_ascii_lowercase();
        assert!(
            rule["annotations"]["runbook_url"]
                .as_str()
                .unwrap()
                .ends_with(&format!("docs/monitoring.md#{anchor}")),
            "{name}"
        );
        assert!(
            docs.lines()
                .any(|l| l.starts_with("### ") && l[4..].trim() == name),
            "docs/monitoring.md has no `### {name}` section"
        );
    }
}

#[test]
fn every_dashboard_panel_queries_metrics_the_controller_exports() {
    let exported = exported();
    let dashboard = dashboard();
    let mut all = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap();
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            let metrics = metrics_in(expr);
            assert!(
                !metrics.is_empty(),
                "panel {title:?} queries no ck8s-certs metric: {expr}"
            );
            for metric in metrics {
                assert!(
                    exported.contains(&metric),
                    "panel {title:?} queries {metric}, which the controller does not export"
                );
                all.insert(metric);
            }
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(definition) = variable["definition"].as_str() {
            for metric in metrics_in(definition) {
                assert!(exported.contains(&metric), "variable query {definition}");
            }
        }
    }
    // The panels the fleet needs: expiry, refreshes, deferrals, k8sd latency.
    for metric in [
        "ck8s_certs_certificate_expiry_timestamp_seconds",
        "ck8s_certs_renewals_failed_total",
        "ck8s_certs_renewal_deferred_total",
        "ck8s_certs_k8sd_request_duration_seconds_bucket",
    ] {
        assert!(all.contains(metric), "no panel shows {metric}");
    }
}

/// What Grafana needs to load the JSON: a uid and title, the schema version, panels with unique
/// ids, a type and a position on the 24-column grid, queries with unique refIds against the
/// dashboard's Prometheus data source variable.
#[test]
fn the_dashboard_has_the_shape_grafana_loads() {
    let dashboard = dashboard();
    assert_eq!(dashboard["uid"], "ck8s-certs");
    assert!(dashboard["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36));
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let datasource = variables
        .iter()
        .find(|v| v["type"] == "datasource")
        .unwrap();
    assert_eq!(datasource["query"], "prometheus");
    let name = datasource["name"].as_str().unwrap();
    let mut ids = BTreeSet::new();
    // Cells of the grid taken by panels, to catch overlaps.
    let mut taken = BTreeMap::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap();
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "duplicate id: {title}"
        );
        assert!(panel["type"].as_str().is_some(), "{title}");
        let grid = &panel["gridPos"];
        let (x, y, w, h) = (
            grid["x"].as_u64().unwrap(),
            grid["y"].as_u64().unwrap(),
            grid["w"].as_u64().unwrap(),
            grid["h"].as_u64().unwrap(),
        );
        assert!(w >= 1 && h >= 1 && x + w <= 24, "{title}: {grid}");
        for cx in x..x + w {
            for cy in y..y + h {
                if let Some(other) = taken.insert((cx, cy), title) {
                    panic!("panels {other:?} and {title:?} overlap at {cx},{cy}");
                }
            }
        }
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["type"], "prometheus", "{title}");
        assert_eq!(
            panel["datasource"]["uid"],
            format!("${{{name}}}"),
            "{title}"
        );
        let mut refs = BTreeSet::new();
        for target in panel["targets"].as_array().unwrap() {
            assert!(
                refs.insert(target["refId"].as_str().unwrap()),
                "{title}: duplicate refId"
            );
        }
    }
}
