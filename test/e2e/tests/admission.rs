//! The refresh-trigger admission webhook at the keyboard: with the pinned kubectl against the real
//! API server, a trigger the controller would refuse is refused in the write, with the
//! controller's own message, and nothing is stored on the Machine; a valid but surprising one is
//! accepted with a warning. And the NetworkPolicy lets in what the controller pods serve.
//!
//! Tools: `CK8S_E2E_KUBECTL` (the Makefile sets it), else the cache of `make tools`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use ck8s_certs::refresh::band::TtlBand;
use ck8s_certs::refresh::trigger::check_trigger;
use ck8s_certs_api::annotations::{
    CERTIFICATES_EXPIRY, REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS, REFRESH_REQUEST,
};
use ck8s_certs_api::machine::MachineView;
use ck8s_certs_e2e::fixtures::NodeInfo;
use ck8s_certs_e2e::{Environment, manifests, shared_of, tool};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::api::DynamicObject;

const FILTER: &str = "admission";

fn kubectl() -> PathBuf {
    tool("CK8S_E2E_KUBECTL", "kubectl", "KUBE_VERSION")
}

/// `kubectl annotate machine <m> <trigger>=<ttl>` as a person types it, with the admin
/// kubeconfig.
fn annotate(env: &Environment, node: &NodeInfo, ttl: &str, extra: &[&str]) -> Output {
    Command::new(kubectl())
        .arg("--kubeconfig")
        .arg(&env.management_kubeconfig)
        .args(["annotate", "machines.cluster.x-k8s.io", &node.machine])
        .args(["-n", &node.namespace])
        .arg(format!("{REFRESH_CERTIFICATES}={ttl}"))
        .args(extra)
        .output()
        .expect("run kubectl annotate")
}

async fn machine(env: &Environment, node: &NodeInfo) -> DynamicObject {
    env.machine_api(env.management().await.unwrap(), &node.namespace)
        .get(&node.machine)
        .await
        .unwrap()
}

/// The controller's band here: `--min-ttl=10m` (a 30m control-plane TTL is warned about, not
/// refused) and the environment's `--max-ttl=10y`.
fn band() -> TtlBand {
    TtlBand::new("10m".parse().unwrap(), "10y".parse().unwrap()).unwrap()
}

/// What the controller would report for `ttl` on the Machine as it is.
async fn controller_message(env: &Environment, node: &NodeInfo, ttl: &str) -> String {
    let view = MachineView::from_dynamic(&machine(env, node).await);
    check_trigger(&view, ttl, band())
        .expect_err("a trigger the controller refuses")
        .message(&view)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn kubectl_annotate_with_a_bad_ttl_is_refused_with_the_controllers_message_and_nothing_is_stored()
 {
    let env = shared_of(&["alpha"]).await;
    let [control_plane, worker] = env.nodes("alpha", ["alpha-cp-1", "alpha-md-0-w1"]);
    env.isolate_all([&control_plane, &worker], FILTER).await;
    let _controller = env
        .start_controller_with_webhook(FILTER, &["--min-ttl=10m"])
        .await;
    for node in [&control_plane, &worker] {
        env.wait_for_machine(node, Duration::from_secs(60), |a| {
            a.contains_key(CERTIFICATES_EXPIRY)
        })
        .await;
    }

    // A typo on either role, and a lifetime a worker's CSR cannot carry.
    for (node, ttl, says) in [
        (&control_plane, "1yr", "unknown unit \"yr\""),
        (&worker, "1yr", "unknown unit \"yr\""),
        (&worker, "69y", "too long for a worker node"),
    ] {
        let before = machine(&env, node).await;
        let output = annotate(&env, node, ttl, &[]);
        let stderr = text(&output.stderr);
        assert!(
            !output.status.success(),
            "{ttl} on {} was accepted: {stderr}",
            node.machine
        );
        let message = controller_message(&env, node, ttl).await;
        assert!(message.contains(says), "{message}");
        assert!(
            stderr.contains(&format!(
                "admission webhook \"refresh-trigger.certificates.ck8s.io\" denied the request: {message}"
            )),
            "{ttl} on {}: {stderr}",
            node.machine
        );
        println!("{}", stderr.trim());
        // Nothing was written: the same object, no trigger, no status, no request.
        let after = machine(&env, node).await;
        assert_eq!(after.resource_version(), before.resource_version());
        let annotations = after.annotations();
        for key in [
            REFRESH_CERTIFICATES,
            REFRESH_CERTIFICATES_STATUS,
            REFRESH_REQUEST,
        ] {
            assert!(!annotations.contains_key(key), "{key}: {annotations:#?}");
        }
    }

    // Set through server-side apply (as Cluster API copies a machine template onto its
    // Machines): accepted, with the controller's message as a warning, since a denial would stall
    // the owner. A server-side dry run goes through the webhook and stores nothing.
    let applied = serde_json::json!({
        "apiVersion": format!("cluster.x-k8s.io/{}", env.spec.capi_version.storage_version()),
        "kind": "Machine",
        "metadata": {
            "name": worker.machine,
            "namespace": worker.namespace,
            "annotations": { REFRESH_CERTIFICATES: "1yr" },
        },
    });
    let mut apply = Command::new(kubectl())
        .arg("--kubeconfig")
        .arg(&env.management_kubeconfig)
        .args([
            "apply",
            "--server-side",
            "--field-manager=capi-machineset",
            "--dry-run=server",
            "-f",
            "-",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kubectl apply");
    {
        use std::io::Write;
        let mut stdin = apply.stdin.take().unwrap();
        stdin.write_all(applied.to_string().as_bytes()).unwrap();
    }
    let output = apply.wait_with_output().unwrap();
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let message = controller_message(&env, &worker, "1yr").await;
    assert!(stderr.contains(&format!("Warning: {message}")), "{stderr}");

    // Valid but surprising (a control plane's certificates for 30 minutes): accepted with a
    // warning.
    let output = annotate(&env, &control_plane, "30m", &["--dry-run=server"]);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "Warning: TTL 30m: the new certificates will expire 30m after the refresh, in less than a day (m is minutes; months are mo, e.g. 6mo)"
        ),
        "{stderr}"
    );
    assert!(
        !machine(&env, &control_plane)
            .await
            .annotations()
            .contains_key(REFRESH_CERTIFICATES)
    );
    // A valid one is accepted quietly.
    let output = annotate(&env, &worker, "1y", &["--dry-run=server"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        !text(&output.stderr).contains("Warning"),
        "{}",
        text(&output.stderr)
    );
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn kustomize(dir: &str) -> Vec<DynamicObject> {
    let output = Command::new(kubectl())
        .arg("kustomize")
        .arg(repo_root().join(dir))
        .output()
        .expect("run kubectl kustomize");
    assert!(
        output.status.success(),
        "kubectl kustomize {dir}: {}",
        text(&output.stderr)
    );
    manifests::parse(&text(&output.stdout)).unwrap()
}

fn typed<K: serde::de::DeserializeOwned>(objects: &[DynamicObject], kind: &str) -> K {
    let object = objects
        .iter()
        .find(|o| o.types.as_ref().is_some_and(|t| t.kind == kind))
        .unwrap_or_else(|| panic!("no {kind} in config/default"));
    serde_json::from_value(serde_json::to_value(object).unwrap()).unwrap()
}

/// The NetworkPolicy selects the controller pods config/default installs and lets in exactly
/// the ports their container declares (the webhook's, which the Service targets, among them).
#[test]
fn the_network_policy_admits_the_ports_the_controller_pods_serve() {
    let objects = kustomize("config/default");
    let policy: NetworkPolicy = typed(&objects, "NetworkPolicy");
    let deployment: Deployment = typed(&objects, "Deployment");
    let service: Service = typed(&objects, "Service");
    assert_eq!(policy.namespace(), deployment.namespace());

    let template = deployment.spec.unwrap().template;
    let pod_labels = template.metadata.unwrap().labels.unwrap();
    let spec = policy.spec.unwrap();
    let selector = spec.pod_selector.unwrap().match_labels.unwrap();
    assert!(!selector.is_empty());
    for (key, value) in &selector {
        assert_eq!(pod_labels.get(key), Some(value), "pod label {key}");
    }
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_owned()]));

    let declared: BTreeSet<String> = template.spec.unwrap().containers[0]
        .ports
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| p.name)
        .collect();
    let ingress = spec.ingress.unwrap();
    assert_eq!(ingress.len(), 1);
    let admitted: BTreeSet<String> = ingress[0]
        .ports
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|p| match p.port {
            Some(IntOrString::String(name)) => name,
            other => panic!("a port by name, not {other:?}"),
        })
        .collect();
    assert_eq!(admitted, declared);
    let target = service.spec.unwrap().ports.unwrap()[0].target_port.clone();
    assert!(
        matches!(&target, Some(IntOrString::String(name)) if admitted.contains(name)),
        "the Service targets {target:?}"
    );
}
