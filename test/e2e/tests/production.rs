//! What released k8sd and edge clusters do to a refresh (k8sd-protocol.md, "What released k8sd
//! does that a client must survive"): a single control plane takes the whole workload API with it
//! when it restarts, a lost `run` answer leaves the node serving its old certificates, and CSRs
//! approved by k8sd's auto-approver make `approve` fail while `run` succeeds.

use std::time::Duration;

use ck8s_certs::k8sd::wire::path;
use ck8s_certs_api::annotations::{CERTIFICATES_EXPIRY, REFRESH_CERTIFICATES_STATUS};
use ck8s_certs_e2e::fixtures::{NodeInfo, Role};
use ck8s_certs_e2e::sim::{CallRecord, Endpoint, Fault, runs};
use ck8s_certs_e2e::{Environment, shared_of};
use jiff::Timestamp;

/// The standard clusters these tests use; the others are not started.
const CLUSTERS: &[&str] = &["beta", "gamma", "solo", "trio"];

const TIMEOUT: Duration = Duration::from_secs(180);

fn started(call: &CallRecord) -> Timestamp {
    call.started_at.parse().expect("RFC 3339 startedAt")
}

fn answered(call: &CallRecord) -> Timestamp {
    started(call) + jiff::SignedDuration::from_secs_f64(call.duration_ms / 1000.0)
}

/// Every node of `nodes` ends `done`, serving exactly what its Machine records, after `runs`
/// runs that wrote certificates. Returns the successful runs' call records, node by node.
async fn all_done_serving_what_is_recorded(
    env: &Environment,
    nodes: &[NodeInfo],
    written_runs: usize,
) -> Vec<Vec<CallRecord>> {
    let mut out = Vec::new();
    for node in nodes {
        let annotations = env.wait_for_refresh(node, TIMEOUT).await;
        assert_eq!(
            annotations[REFRESH_CERTIFICATES_STATUS], "done",
            "{}: {annotations:#?}",
            node.machine
        );
        let state = env.sim.node(node).await.unwrap();
        assert_eq!(
            annotations[CERTIFICATES_EXPIRY], state.cert_not_after,
            "{}: the recorded expiry is what the node serves",
            node.machine
        );
        let seeds = state.seeds_run.clone().unwrap_or_default();
        assert_eq!(seeds.len(), written_runs, "{}: {seeds:?}", node.machine);
        let calls = env.sim.calls(&node.cluster, &node.node).await.unwrap();
        let ok: Vec<CallRecord> = runs(&calls)
            .into_iter()
            .filter(|c| c.status == 200)
            .cloned()
            .collect();
        assert_eq!(
            ok.len(),
            1,
            "{}: exactly one answered run: {ok:#?}",
            node.machine
        );
        out.push(ok);
    }
    out
}

async fn annotate_all(env: &Environment, nodes: &[NodeInfo], filter: &str) {
    for node in nodes {
        env.isolate(node, filter).await;
    }
    // As `kubectl annotate machine -l cluster.x-k8s.io/cluster-name=<c>` does: one patch per
    // Machine, in name order (control planes first), back to back.
    for node in nodes {
        env.annotate_refresh(node, "1y").await;
    }
}

#[tokio::test]
async fn a_single_control_plane_cluster_annotated_at_once_refreshes_its_control_plane_then_every_worker()
 {
    let env = shared_of(CLUSTERS).await;
    let solo = env.cluster("solo");
    let nodes = solo.nodes.clone();
    assert_eq!(solo.nodes_with_role(Role::ControlPlane).count(), 1);
    let restarts_before = env.apiserver_restarts("solo");
    let _controller = env.start_controller("solo", &[]);
    annotate_all(&env, &nodes, "solo").await;
    let runs = all_done_serving_what_is_recorded(&env, &nodes, 1).await;
    assert!(
        env.apiserver_restarts("solo") > restarts_before,
        "the workload API restarted with its only control plane"
    );
    // Control plane first: every worker's plan started after the control plane's run answered.
    let control_plane_done = answered(&runs[0][0]);
    let calls = env.sim.calls("solo", "").await.unwrap();
    for plan in calls
        .iter()
        .filter(|c| c.path == path::PLAN && c.node != nodes[0].node)
    {
        assert!(
            started(plan) > control_plane_done,
            "worker plan {plan:#?} before the control plane was done"
        );
    }
}

#[tokio::test]
async fn three_control_planes_are_refreshed_strictly_one_at_a_time_then_the_workers() {
    let env = shared_of(CLUSTERS).await;
    let trio = env.cluster("trio");
    let nodes = trio.nodes.clone();
    let _controller = env.start_controller("trio", &[]);
    annotate_all(&env, &nodes, "trio").await;
    all_done_serving_what_is_recorded(&env, &nodes, 1).await;
    let calls = env.sim.calls("trio", "").await.unwrap();
    let control_planes: Vec<&str> = trio
        .nodes_with_role(Role::ControlPlane)
        .map(|n| n.node.as_str())
        .collect();
    // Each control plane's plan..run span, in time order, must not overlap the next one's.
    let mut spans: Vec<(Timestamp, Timestamp)> = control_planes
        .iter()
        .map(|node| {
            let mine: Vec<&CallRecord> = calls
                .iter()
                .filter(|c| c.node == *node && (c.path == path::PLAN || c.path == path::RUN))
                .collect();
            let first = mine.iter().map(|c| started(c)).min().unwrap();
            let last = mine.iter().map(|c| answered(c)).max().unwrap();
            (first, last)
        })
        .collect();
    spans.sort();
    for pair in spans.windows(2) {
        assert!(
            pair[0].1 < pair[1].0,
            "control planes overlapped: {spans:?}"
        );
    }
}

#[tokio::test]
async fn a_lost_run_answer_is_refreshed_again_with_a_new_plan_until_the_node_serves_it() {
    let env = shared_of(CLUSTERS).await;
    let nodes = env.nodes("beta", ["beta-cp-0", "beta-md-0-w0"]);
    for node in &nodes {
        env.isolate(node, "lost-answer").await;
        // The node writes its certificates, then the answer is lost: no restart, so it keeps
        // serving the old ones.
        env.sim
            .inject(&Fault::drop_answer().on(node).at(Endpoint::Run).times(1))
            .await
            .unwrap();
    }
    let _controller = env.start_controller("lost-answer", &[]);
    for node in &nodes {
        env.annotate_refresh(node, "1y").await;
    }
    // Two runs wrote certificates; only the second was answered and so served.
    all_done_serving_what_is_recorded(&env, &nodes, 2).await;
    for node in &nodes {
        let calls = env.sim.calls("beta", &node.node).await.unwrap();
        let seeds: Vec<i64> = runs(&calls).iter().map(|c| c.seed()).collect();
        assert_eq!(seeds.len(), 2, "{}", node.machine);
        assert_ne!(seeds[0], seeds[1], "{}: a new plan each time", node.machine);
        let op = env.operation(node).await;
        assert_eq!((op.run_attempts, op.seed), (2, Some(seeds[1])));
    }
}

#[tokio::test]
async fn with_auto_approve_on_a_worker_is_refreshed_once_and_the_approve_error_is_only_noted() {
    let env = shared_of(CLUSTERS).await;
    // Auto-approve applies to a whole cluster: gamma, which no other test here uses.
    let node = env.cluster("gamma").node("alpha-md-0-w0").clone();
    env.isolate(&node, "auto-approve").await;
    env.sim.set_auto_approve("gamma", true).await.unwrap();
    let _controller = env.start_controller("auto-approve", &[]);
    env.annotate_refresh(&node, "1y").await;
    all_done_serving_what_is_recorded(&env, std::slice::from_ref(&node), 1).await;
    env.sim.set_auto_approve("gamma", false).await.unwrap();
    let op = env.operation(&node).await;
    assert!(op.error.is_none(), "{op:#?}");
    // Whether `approve` answers (500: already approved by the signer) before `run` finishes
    // is a race, as with real k8sd; either way its error is never the outcome (above), and
    // the worker ran once.
    let calls = env.sim.calls("gamma", &node.node).await.unwrap();
    assert_eq!(runs(&calls).len(), 1, "refreshed once");
}
