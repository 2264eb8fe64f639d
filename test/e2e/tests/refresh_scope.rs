//! What the controller leaves alone and how it orders work: paused Clusters, Machines of other
//! bootstrap providers, control planes of one cluster one at a time, a re-annotation during a
//! refresh, a Machine deleted mid-refresh, and the initial expiry read.

use std::time::{Duration, Instant};

use ck8s_certs::k8sd::wire::path;
use ck8s_certs_api::annotations::{
    CERTIFICATES_EXPIRY, REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS,
};
use ck8s_certs_api::capi::{self, WATCH_FILTER_LABEL};
use ck8s_certs_api::machine_certificates::MachineCertificatesStatus;
use ck8s_certs_e2e::fixtures::{NodeInfo, Role};
use ck8s_certs_e2e::shared_of;
use ck8s_certs_e2e::sim::{CallRecord, Endpoint, Fault};
use kube::Api;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::json;

/// The standard clusters these tests use; the others are not started.
const CLUSTERS: &[&str] = &["alpha", "beta", "gamma", "trio"];

const TIMEOUT: Duration = Duration::from_secs(90);

fn started(call: &CallRecord) -> jiff::Timestamp {
    call.started_at.parse().unwrap()
}

fn finished(call: &CallRecord) -> jiff::Timestamp {
    started(call) + jiff::SignedDuration::from_secs_f64(call.duration_ms / 1000.0)
}

/// A condition says the refresh waits because something is paused.
fn paused(status: &MachineCertificatesStatus) -> bool {
    status.conditions.iter().any(|c| c.reason == "Paused")
}

#[tokio::test]
async fn a_paused_cluster_is_left_alone_until_it_is_resumed() {
    let env = shared_of(CLUSTERS).await;
    let [node] = env.isolated("beta", ["beta-cp-0"], "paused").await;
    let mgmt = env.management().await.unwrap();
    let version = env.spec.capi_version.storage_version();
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        mgmt,
        "fleet",
        &ApiResource::from_gvk(&GroupVersionKind::gvk(capi::GROUP, version, "Cluster")),
    );
    let pause = |paused: bool| json!({ "spec": { "paused": paused } });
    // Known before the pause: on a paused Cluster nothing is created, not even its
    // MachineCertificates (`clusterctl move` pauses, then deletes them before the Machine).
    let _controller = env.start_controller("paused", &[]);
    env.wait_for_machine(&node, TIMEOUT, |a| a.contains_key(CERTIFICATES_EXPIRY))
        .await;
    clusters
        .patch("beta", &PatchParams::default(), &Patch::Merge(pause(true)))
        .await
        .unwrap();
    env.sim.clear_calls("beta", &node.node).await.unwrap();
    env.annotate_refresh(&node, "1y").await;

    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(4) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let calls = env.calls(&node).await;
        assert!(
            calls
                .iter()
                .all(|c| c.method != "POST" || c.path == path::APPROVE)
        );
    }
    let annotations = env.machine_annotations(&node).await;
    assert_eq!(
        annotations.get(REFRESH_CERTIFICATES).map(String::as_str),
        Some("1y")
    );
    assert!(!annotations.contains_key(REFRESH_CERTIFICATES_STATUS));
    env.wait_for_status(&node, TIMEOUT, "Paused", paused).await;

    clusters
        .patch("beta", &PatchParams::default(), &Patch::Merge(pause(false)))
        .await
        .unwrap();
    env.wait_for_done(&node, TIMEOUT).await;
}

/// Cluster API users pause single Machines (`cluster.x-k8s.io/paused` on the Machine): nothing
/// new starts on it, and it goes on once the annotation is removed.
#[tokio::test]
async fn a_paused_machine_is_left_alone_until_it_is_resumed() {
    let env = shared_of(CLUSTERS).await;
    let [node] = env.nodes("trio", ["trio-md-0-w0"]);
    env.isolate(&node, "paused-machine").await;
    let _controller = env.start_controller("paused-machine", &[]);
    env.wait_for_machine(&node, TIMEOUT, |a| a.contains_key(CERTIFICATES_EXPIRY))
        .await;
    env.patch_machine(
        &node,
        json!({ "metadata": { "annotations": { capi::PAUSED_ANNOTATION: "" } } }),
    )
    .await;
    env.sim.clear_calls("trio", &node.node).await.unwrap();
    env.annotate_refresh(&node, "1y").await;

    // Shown paused, and nothing sent to the node meanwhile.
    let status = env.wait_for_status(&node, TIMEOUT, "Paused", paused).await;
    let paused = status.conditions.iter().find(|c| c.reason == "Paused");
    assert!(
        paused.is_some_and(|c| c.message.contains("The Machine is paused")),
        "{paused:?}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let calls = env.calls(&node).await;
    assert!(calls.iter().all(|c| c.method != "POST"), "{calls:#?}");
    let annotations = env.machine_annotations(&node).await;
    assert_eq!(
        annotations.get(REFRESH_CERTIFICATES).map(String::as_str),
        Some("1y")
    );

    env.patch_machine(
        &node,
        json!({ "metadata": { "annotations": { capi::PAUSED_ANNOTATION: null } } }),
    )
    .await;
    env.wait_for_done(&node, TIMEOUT).await;
}

#[tokio::test]
async fn machines_of_other_bootstrap_providers_are_untouched() {
    let env = shared_of(CLUSTERS).await;
    let mgmt = env.management().await.unwrap();
    let api = env.machine_api(mgmt.clone(), "fleet");
    let v1beta2 = env.spec.capi_version.storage_version() == "v1beta2";
    let config_ref = if v1beta2 {
        json!({ "apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": "kubeadm-0" })
    } else {
        json!({ "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1", "kind": "KubeadmConfig", "name": "kubeadm-0", "namespace": "fleet" })
    };
    let infra_ref = if v1beta2 {
        json!({ "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": "kubeadm-0" })
    } else {
        json!({ "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerMachine", "name": "kubeadm-0", "namespace": "fleet" })
    };
    let machine: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{}/{}", capi::GROUP, env.spec.capi_version.storage_version()), "kind": "Machine",
        "metadata": { "name": "kubeadm-0", "namespace": "fleet",
            "labels": { capi::CLUSTER_NAME_LABEL: "alpha", WATCH_FILTER_LABEL: "foreign" },
            "annotations": { REFRESH_CERTIFICATES: "1y" } },
        "spec": { "clusterName": "alpha", "bootstrap": { "configRef": config_ref }, "infrastructureRef": infra_ref }
    }))
    .unwrap();
    api.create(&PostParams::default(), &machine).await.unwrap();
    let controller = env.start_controller("foreign", &[]);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after = api.get("kubeadm-0").await.unwrap();
    let annotations = after.metadata.annotations.unwrap_or_default();
    assert_eq!(annotations.len(), 1, "{annotations:?}");
    let certificates: Api<ck8s_certs_api::machine_certificates::MachineCertificates> =
        Api::namespaced(mgmt, "fleet");
    assert!(certificates.get_opt("kubeadm-0").await.unwrap().is_none());
    assert!(
        !controller.log().contains("Reconcile failed"),
        "{}",
        controller.log()
    );
}

#[tokio::test]
async fn control_planes_of_one_cluster_are_refreshed_one_at_a_time() {
    let env = shared_of(CLUSTERS).await;
    let nodes: Vec<NodeInfo> = env
        .cluster("alpha")
        .nodes_with_role(Role::ControlPlane)
        .cloned()
        .collect();
    for node in &nodes {
        env.isolate(node, "serial").await;
    }
    let _controller = env.start_controller("serial", &[]);
    for node in &nodes {
        env.annotate_refresh(node, "1y").await;
    }
    for node in &nodes {
        env.wait_for_done(node, TIMEOUT).await;
    }
    let mut runs: Vec<CallRecord> = Vec::new();
    for node in &nodes {
        runs.extend(
            env.calls(node)
                .await
                .into_iter()
                .filter(|c| c.path == path::RUN),
        );
    }
    assert_eq!(runs.len(), 2, "{runs:#?}");
    runs.sort_by_key(started);
    // The second starts only after the first answered and its node came back (restart: 2 s).
    assert!(
        started(&runs[1]) >= finished(&runs[0]) + jiff::SignedDuration::from_secs(2),
        "{runs:#?}"
    );
}

#[tokio::test]
async fn a_new_ttl_written_during_a_refresh_is_carried_out_afterwards() {
    let env = shared_of(CLUSTERS).await;
    let [node] = env.isolated("alpha", ["alpha-md-0-w0"], "reannotate").await;
    let _controller = env.start_controller("reannotate", &[]);
    env.annotate_held_at(&node, Endpoint::Run, Duration::from_secs(2), TIMEOUT)
        .await;
    env.annotate_refresh(&node, "2y").await;
    env.wait_for_machine(&node, TIMEOUT, |a| {
        a.get(REFRESH_CERTIFICATES_STATUS).map(String::as_str) == Some("done")
            && !a.contains_key(REFRESH_CERTIFICATES)
    })
    .await;
    let start = Instant::now();
    let runs = loop {
        let runs: Vec<CallRecord> = env
            .calls(&node)
            .await
            .into_iter()
            .filter(|c| c.path == path::RUN && c.status == 200)
            .collect();
        if runs.len() >= 2 || start.elapsed() > TIMEOUT {
            break runs;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let ttls: Vec<i64> = runs
        .iter()
        .map(|r| {
            serde_json::from_str::<serde_json::Value>(&r.body).unwrap()["expiration-seconds"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(ttls, [365 * 86_400, 2 * 365 * 86_400]);
}

#[tokio::test]
async fn a_machine_deleted_mid_refresh_leaves_no_error_loop() {
    let env = shared_of(CLUSTERS).await;
    let [node] = env.isolated("alpha", ["alpha-md-0-w1"], "deleted").await;
    env.sim
        .inject(&Fault::hang().on(&node).at(Endpoint::Run))
        .await
        .unwrap();
    let controller =
        env.start_controller("deleted", &["--k8sd-run-timeout=3s", "--k8sd-attempts=1"]);
    env.annotate_refresh(&node, "1y").await;
    env.wait_for_call(&node, path::RUN, TIMEOUT, |_| true).await;
    let api = env.machine_api(env.management().await.unwrap(), "fleet");
    api.delete(&node.machine, &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let log = controller.log();
    assert!(!log.contains("Reconcile failed"), "{log}");
    env.sim.clear_faults("alpha").await.ok();
}

#[tokio::test]
async fn the_expiry_of_a_new_node_is_read_quietly_while_it_starts() {
    let env = shared_of(CLUSTERS).await;
    let [node] = env.isolated("beta", ["beta-md-0-w1"], "expiry").await;
    env.sim
        .inject(&Fault::unavailable().on(&node).at(Endpoint::Expiry).times(2))
        .await
        .unwrap();
    let _controller = env.start_controller("expiry", &[]);
    let annotations = env
        .wait_for_machine(&node, TIMEOUT, |a| a.contains_key(CERTIFICATES_EXPIRY))
        .await;
    let state = env.sim.node(&node).await.unwrap();
    let expected: jiff::Timestamp = state.database_expiry.parse().unwrap();
    assert_eq!(
        annotations[CERTIFICATES_EXPIRY],
        expected.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    );
    assert!(
        env.machine_events(&node)
            .await
            .iter()
            .all(|e| e.type_.as_deref() != Some("Warning"))
    );
}

#[tokio::test]
async fn a_controller_limited_to_a_namespace_leaves_the_others_alone() {
    let env = shared_of(CLUSTERS).await;
    let [inside] = env.isolated("gamma", ["alpha-md-0-w1"], "namespaced").await;
    let [outside] = env.isolated("beta", ["beta-md-0-w0"], "namespaced").await;
    let _controller = env.start_controller("namespaced", &["--namespace=edge"]);
    env.annotate_refresh(&inside, "1y").await;
    env.annotate_refresh(&outside, "1y").await;
    env.wait_for_done(&inside, TIMEOUT).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let untouched = env.machine_annotations(&outside).await;
    assert_eq!(
        untouched.get(REFRESH_CERTIFICATES).map(String::as_str),
        Some("1y")
    );
    assert!(!untouched.contains_key(REFRESH_CERTIFICATES_STATUS));
    assert!(env.machine_certificates(&outside).await.is_none());
}

#[tokio::test]
async fn the_direct_transport_refreshes_through_the_node_address() {
    let env = shared_of(CLUSTERS).await;
    let [node] = env.isolated("gamma", ["alpha-cp-0"], "direct").await;
    // Without k8sd-proxy pods the port-forward route cannot work: only the node address can.
    let workload = env.cluster("gamma").client().await.unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(workload, "kube-system");
    pods.delete(&node.proxy_pod, &DeleteParams::default())
        .await
        .unwrap();
    let _controller = env.start_controller("direct", &["--k8sd-transport=direct"]);
    env.annotate_refresh(&node, "1y").await;
    env.wait_for_done(&node, TIMEOUT).await;
    let calls = env.calls(&node).await;
    assert!(calls.iter().any(|c| c.path == path::RUN && c.status == 200));
}
