//! The monitoring overlay as users apply it: `kubectl kustomize config/monitoring` with the pinned
//! kubectl renders a PrometheusRule whose spec is exactly the rules file promtool tests, a
//! PodMonitor that selects the pods config/default installs on their metrics port, and the
//! dashboard ConfigMap for Grafana's sidecar; promtool parses every dashboard query.
//! (`make monitoring-test` runs `promtool check rules` and `promtool test rules`; tests/monitoring.rs
//! checks the metric names against the controller's registry.)
//!
//! Tools: `CK8S_E2E_KUBECTL` / `CK8S_E2E_PROMTOOL` (the Makefile sets them), else the cache of
//! `make tools` / `make promtool`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use ck8s_certs_e2e::manifests;
use ck8s_certs_e2e::tool;
use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;
use kube::api::DynamicObject;

const NAMESPACE: &str = "ck8s-certs-system";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    let path = repo_root().join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn kustomize(dir: &str) -> Vec<DynamicObject> {
    let output = Command::new(tool("CK8S_E2E_KUBECTL", "kubectl", "KUBE_VERSION"))
        .arg("kustomize")
        .arg(repo_root().join(dir))
        .output()
        .expect("run kubectl kustomize");
    assert!(
        output.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    manifests::parse(&String::from_utf8(output.stdout).unwrap()).unwrap()
}

fn find<'a>(objects: &'a [DynamicObject], kind: &str, name: &str) -> &'a DynamicObject {
    objects
        .iter()
        .find(|o| o.types.as_ref().is_some_and(|t| t.kind == kind) && o.name_any() == name)
        .unwrap_or_else(|| {
            panic!(
                "no {kind} {name} in {:?}",
                objects.iter().map(manifests::describe).collect::<Vec<_>>()
            )
        })
}

#[test]
fn the_overlay_renders_the_rule_the_pod_monitor_and_the_dashboard_in_the_providers_namespace() {
    let objects = kustomize("config/monitoring");
    let mut kinds: Vec<String> = objects.iter().map(manifests::describe).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ConfigMap ck8s-certs-system/ck8s-certs-grafana-dashboard",
            "PodMonitor ck8s-certs-system/ck8s-certs-controller-manager",
            "PrometheusRule ck8s-certs-system/ck8s-certs-alerts",
        ]
    );
    for object in &objects {
        // Not part of the clusterctl components: clusterctl would delete it on upgrade.
        assert!(
            !object.labels().contains_key("cluster.x-k8s.io/provider"),
            "{}",
            manifests::describe(object)
        );
    }

    // The PrometheusRule's spec is the rules file promtool checks, to the letter.
    let rule = find(&objects, "PrometheusRule", "ck8s-certs-alerts");
    assert_eq!(
        rule.types.as_ref().unwrap().api_version,
        "monitoring.coreos.com/v1"
    );
    let rules: serde_json::Value =
        serde_yaml::from_str(&read("config/monitoring/rules/ck8s-certs.rules.yaml")).unwrap();
    assert_eq!(rule.data["spec"], rules);

    // The dashboard, byte for byte, where Grafana's sidecar looks for it.
    let dashboard = find(&objects, "ConfigMap", "ck8s-certs-grafana-dashboard");
    assert_eq!(
        dashboard
            .labels()
            .get("grafana_dashboard")
            .map(String::as_str),
        Some("1")
    );
    assert_eq!(
        dashboard.data["data"]["ck8s-certs.json"].as_str(),
        Some(read("config/monitoring/dashboards/ck8s-certs.json").as_str())
    );
}

/// The PodMonitor selects the controller pods of config/default (with the labels kustomize adds
/// there) on a port the manager container declares, and names the job the alerts look for.
#[test]
fn the_pod_monitor_selects_the_installed_controller_pods_on_their_metrics_port() {
    let monitoring = kustomize("config/monitoring");
    let monitor = find(&monitoring, "PodMonitor", "ck8s-certs-controller-manager");
    let default = kustomize("config/default");
    let deployment = find(&default, "Deployment", "ck8s-certs-controller-manager");
    assert_eq!(deployment.namespace().as_deref(), Some(NAMESPACE));
    let deployment: Deployment =
        serde_json::from_value(serde_json::to_value(deployment).unwrap()).unwrap();
    let template = deployment.spec.unwrap().template;
    let pod_labels = template.metadata.unwrap().labels.unwrap();
    let selector: BTreeMap<String, String> =
        serde_json::from_value(monitor.data["spec"]["selector"]["matchLabels"].clone()).unwrap();
    assert!(!selector.is_empty());
    for (key, value) in &selector {
        assert_eq!(pod_labels.get(key), Some(value), "pod label {key}");
    }
    let ports: Vec<String> = template.spec.unwrap().containers[0]
        .ports
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| p.name)
        .collect();
    let endpoint = &monitor.data["spec"]["podMetricsEndpoints"][0];
    assert!(
        ports.iter().any(|p| endpoint["port"] == p.as_str()),
        "{endpoint} not in {ports:?}"
    );
    assert_eq!(endpoint["path"], "/metrics");
    assert!(
        endpoint["relabelings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["targetLabel"] == "job" && r["replacement"] == "ck8s-certs"),
        "{endpoint}"
    );
}

/// Every panel query and variable query of the dashboard is valid PromQL (Grafana's variables
/// replaced by values they take), as promtool parses it.
#[test]
fn every_dashboard_query_parses_with_promtool() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("config/monitoring/dashboards/ck8s-certs.json")).unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        // label_values(<selector>, <label>): the selector is a query.
        if let Some(definition) = variable["definition"].as_str() {
            let selector = definition
                .strip_prefix("label_values(")
                .and_then(|rest| rest.rsplit_once(','))
                .map(|(selector, _)| selector.to_owned())
                .unwrap_or_else(|| panic!("unexpected variable query {definition}"));
            queries.push(selector);
        }
    }
    assert!(queries.len() > 10, "{queries:?}");
    let mut file = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, query) in queries.iter().enumerate() {
        let expr = query
            .replace("$__rate_interval", "5m")
            .replace("$namespace", ".*")
            .replace("$cluster", ".*");
        file.push_str(&format!(
            "      - record: dashboard:query_{i}\n        expr: {}\n",
            serde_json::to_string(&expr).unwrap()
        ));
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("monitoring");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("dashboard-queries.rules.yaml");
    std::fs::write(&path, &file).unwrap();
    let output = Command::new(tool("CK8S_E2E_PROMTOOL", "promtool", "PROMTOOL_VERSION"))
        .args(["check", "rules", "--lint=none"])
        .arg(&path)
        .output()
        .expect("run promtool");
    assert!(
        output.status.success(),
        "{}{}\n{file}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
