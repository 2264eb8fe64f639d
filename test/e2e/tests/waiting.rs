//! Waiting refreshes give their reconcile slot back. A whole cluster annotated at once (150
//! workers waiting for its control plane, then for a place) must not hold up a Machine of
//! another cluster: with a sleep in the reconcile, the few reconcile slots filled with waiting
//! workers and every other Machine waited for the whole cluster.

use std::time::Duration;

use ck8s_certs::k8sd::wire::path;
use ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS;
use ck8s_certs_e2e::fixtures::{ClusterSpec, NodeInfo, Role};
use ck8s_certs_e2e::sim::CallRecord;
use ck8s_certs_e2e::{EnvSpec, shared_with};

const TIMEOUT: Duration = Duration::from_secs(600);
const WORKERS: usize = 150;

fn spec() -> EnvSpec {
    let mut spec = EnvSpec::standard_of(&["alpha"]);
    let bulk = ClusterSpec {
        name: "bulk".into(),
        machine_prefix: "bulk".into(),
        control_planes: 1,
        workers: WORKERS,
        endpoint_host: "bulk.k8s.example.internal".into(),
        ..spec.clusters[0].clone()
    };
    spec.clusters.push(bulk);
    spec
}

fn started(call: &CallRecord) -> jiff::Timestamp {
    call.started_at.parse().expect("RFC 3339 startedAt")
}

#[tokio::test]
async fn a_cluster_annotated_at_once_does_not_hold_up_a_machine_of_another_cluster() {
    let env = shared_with(spec).await;
    let bulk: Vec<NodeInfo> = env.cluster("bulk").nodes.clone();
    let other = env.cluster("alpha").node("alpha-cp-0").clone();
    for node in bulk.iter().chain([&other]) {
        env.isolate(node, "waiting").await;
    }
    // Few reconcile slots and two workers per cluster at once: far more waiting workers than
    // slots.
    let controller = env.start_controller(
        "waiting",
        &[
            "--concurrent-reconciles=4",
            "--max-worker-refreshes-per-cluster=2",
        ],
    );
    let (control_planes, workers): (Vec<&NodeInfo>, Vec<&NodeInfo>) =
        bulk.iter().partition(|n| n.role == Role::ControlPlane);
    let probe = ck8s_certs_e2e::bench::probe::ProcessProbe {
        pid: controller.process.pid(),
    };
    let cpu_before = probe.cpu_seconds().unwrap_or_default();
    // As `kubectl annotate machine -l cluster.x-k8s.io/cluster-name=bulk` would, in name order:
    // the control plane, then the workers; then the Machine of the other cluster. (A worker
    // taken up before its control plane was asked for would go first: the order is the
    // user's.)
    for node in control_planes.iter().chain(&workers) {
        env.annotate_refresh(node, "1y").await;
    }
    env.annotate_refresh(&other, "1y").await;

    let annotations = env.wait_for_refresh(&other, TIMEOUT).await;
    assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "done");
    for node in &bulk {
        let annotations = env.wait_for_refresh(node, TIMEOUT).await;
        assert_eq!(
            annotations[REFRESH_CERTIFICATES_STATUS], "done",
            "{}: {annotations:#?}",
            node.machine
        );
    }
    let cpu = probe.cpu_seconds().unwrap_or_default() - cpu_before;

    let other_run = env
        .calls(&other)
        .await
        .iter()
        .find(|c| c.path == path::RUN)
        .map(started)
        .expect("the other cluster's run");
    let calls = env.sim.calls("bulk", "").await.unwrap();
    let runs: Vec<(String, jiff::Timestamp)> = calls
        .iter()
        .filter(|c| c.path == path::RUN)
        .map(|c| (c.node.clone(), started(c)))
        .collect();
    assert_eq!(runs.len(), WORKERS + 1, "one run per Machine");
    let control_plane_node = &control_planes[0].node;
    let control_plane_run = runs
        .iter()
        .find(|(node, _)| node == control_plane_node)
        .map(|(_, at)| *at)
        .expect("the control plane's run");
    // Control planes first: no worker of the cluster ran before its control plane.
    assert!(
        runs.iter().all(|(_, at)| *at >= control_plane_run),
        "a worker ran before the control plane"
    );
    let last_run = runs.iter().map(|(_, at)| *at).max().unwrap();
    println!(
        "bulk: {} runs from {control_plane_run} to {last_run}; the other cluster's run at {other_run}; controller CPU {cpu:.2}s",
        runs.len()
    );
    // The other cluster's refresh started before the bulk ended.
    assert!(
        other_run < last_run,
        "the other cluster's run ({other_run}) waited for the whole bulk (last run {last_run})"
    );
}
