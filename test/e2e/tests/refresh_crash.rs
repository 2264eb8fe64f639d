//! Kill the controller at any step and start it again: the refresh finishes, the Machine never
//! stays in-progress, and `run` is not repeated once it is known to have completed. When a crash
//! leaves `run`'s outcome unknown, the refresh is done again with a new `plan` and a new seed
//! (released k8sd refuses a worker seed twice), and the recorded expiry is what the node serves.

use std::collections::BTreeMap;
use std::time::Duration;

use ck8s_certs::k8sd::wire::path;
use ck8s_certs_api::annotations::{IN_FLIGHT_REFRESH, REFRESH_CERTIFICATES_STATUS};
use ck8s_certs_api::machine_certificates::Phase;
use ck8s_certs_e2e::controller::Controller;
use ck8s_certs_e2e::fixtures::NodeInfo;
use ck8s_certs_e2e::sim::{CallRecord, Endpoint, Fault, runs};
use ck8s_certs_e2e::{Environment, shared_of};

/// The standard clusters these tests use; the others are not started.
const CLUSTERS: &[&str] = &["alpha", "beta"];

const TIMEOUT: Duration = Duration::from_secs(90);

/// Kills the controller of `filter` while `node`'s call to `endpoint` is held back (3 s), then
/// starts another ([`restart_until_done`]).
async fn crash_while_held(
    env: &Environment,
    node: &NodeInfo,
    filter: &str,
    endpoint: Endpoint,
) -> Controller {
    let first = env.start_controller(filter, &[]);
    env.annotate_held_at(node, endpoint, Duration::from_secs(3), TIMEOUT)
        .await;
    first.crash();
    restart_until_done(env, node, filter).await
}

/// Starts a controller of `filter` that aborts at `failpoint`, annotates `node` and waits until
/// the controller exited: the Machine is left in-progress. Returns its annotations.
async fn crash_at(
    env: &Environment,
    node: &NodeInfo,
    filter: &str,
    failpoint: &str,
) -> BTreeMap<String, String> {
    let mut first =
        env.start_controller_with_env(filter, &[], &[("CK8S_CERTS_FAILPOINTS", failpoint)]);
    env.annotate_refresh(node, "1y").await;
    first.wait_for_exit(TIMEOUT).await;
    let annotations = env.machine_annotations(node).await;
    assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "in-progress");
    annotations
}

/// Starts the controller of `filter` again and waits until `node`'s refresh is done.
async fn restart_until_done(env: &Environment, node: &NodeInfo, filter: &str) -> Controller {
    let controller = env.start_controller(filter, &[]);
    env.wait_for_done(node, TIMEOUT).await;
    controller
}

/// The `run`s of `node` after a crash left the first one's outcome unknown: a second one, with
/// a new seed, wrote what the node serves and the Machine records.
async fn ran_again_with_a_new_seed(env: &Environment, node: &NodeInfo) -> Vec<CallRecord> {
    let calls = env.calls(node).await;
    let runs: Vec<CallRecord> = runs(&calls).into_iter().cloned().collect();
    assert_eq!(runs.len(), 2, "outcome unknown: one more run: {runs:#?}");
    assert_ne!(runs[0].seed(), runs[1].seed(), "a seed is never sent twice");
    assert_eq!(serves_the_recorded_expiry(env, node).await, runs[1].seed());
    runs
}

#[tokio::test]
async fn killed_during_plan_the_refresh_starts_over_and_runs_once() {
    let env = shared_of(CLUSTERS).await;
    let [node] = env.isolated("alpha", ["alpha-cp-0"], "crash-plan").await;
    crash_while_held(&env, &node, "crash-plan", Endpoint::Plan).await;
    assert_eq!(runs(&env.calls(&node).await).len(), 1);
}

#[tokio::test]
async fn killed_after_the_seed_is_recorded_it_continues_with_a_new_plan_and_runs_once() {
    let env = shared_of(CLUSTERS).await;
    let [node] = env.isolated("alpha", ["alpha-cp-1"], "crash-seed").await;
    crash_at(&env, &node, "crash-seed", "after-seed-recorded").await;
    let op = env.operation(&node).await;
    // The seed record covers the first send: from here on run may have been sent.
    assert_eq!((op.phase, op.run_attempts), (Phase::Running, 1));

    restart_until_done(&env, &node, "crash-seed").await;
    let calls = env.calls(&node).await;
    let runs = runs(&calls);
    assert_eq!(runs.len(), 1, "{runs:#?}");
    // The recorded seed may have been sent: it is never sent again.
    assert_ne!(Some(runs[0].seed()), op.seed);
    assert_eq!(calls.iter().filter(|c| c.path == path::PLAN).count(), 2);
    assert_eq!(
        serves_the_recorded_expiry(&env, &node).await,
        runs[0].seed()
    );
}

#[tokio::test]
async fn killed_after_run_before_the_machine_patch_nothing_is_run_again() {
    let env = shared_of(CLUSTERS).await;
    let [node] = env.isolated("beta", ["beta-cp-0"], "crash-outcome").await;
    let annotations = crash_at(&env, &node, "crash-outcome", "after-outcome-recorded").await;
    // The outcome is in the request (the journal) and nowhere else yet.
    let request = annotations[IN_FLIGHT_REFRESH].clone();
    let recorded = env.operation(&node).await;
    assert_eq!(recorded.phase, Phase::Succeeded, "{recorded:#?}");
    let copy = env
        .machine_certificates(&node)
        .await
        .and_then(|m| m.status)
        .and_then(|s| s.operation);
    assert_ne!(copy.as_ref(), Some(&recorded), "{copy:#?}");

    restart_until_done(&env, &node, "crash-outcome").await;
    assert_eq!(runs(&env.calls(&node).await).len(), 1);
    // Recorded from the request: the status and the Machine show that outcome.
    let annotations = env.machine_annotations(&node).await;
    assert!(
        !annotations.contains_key(IN_FLIGHT_REFRESH),
        "{annotations:#?}"
    );
    let status = env
        .machine_certificates(&node)
        .await
        .and_then(|m| m.status)
        .expect("a status");
    assert_eq!(status.operation.as_ref(), Some(&recorded));
    assert_eq!(status.expiry, recorded.new_expiry);
    assert_eq!(
        annotations[ck8s_certs_api::annotations::CERTIFICATES_EXPIRY],
        env.sim.node(&node).await.unwrap().cert_not_after
    );
    assert!(recorded.new_expiry.is_some(), "{request}: {recorded:#?}");
}

/// The node serves what the Machine records, and exactly one `run` wrote certificates.
async fn serves_the_recorded_expiry(env: &Environment, node: &NodeInfo) -> i64 {
    let state = env.sim.node(node).await.unwrap();
    let annotations = env.machine_annotations(node).await;
    assert_eq!(
        annotations[ck8s_certs_api::annotations::CERTIFICATES_EXPIRY],
        state.cert_not_after,
        "recorded expiry vs what the node serves: {state:#?}"
    );
    let seeds = state.seeds_run.unwrap_or_default();
    assert_eq!(seeds.len(), 1, "exactly one successful run: {seeds:?}");
    seeds[0]
}

#[tokio::test]
async fn killed_during_a_control_plane_run_it_is_refreshed_again_with_a_new_plan() {
    let env = shared_of(CLUSTERS).await;
    let [node] = env.isolated("beta", ["beta-cp-1"], "crash-run-cp").await;
    crash_while_held(&env, &node, "crash-run-cp", Endpoint::Run).await;
    let runs = ran_again_with_a_new_seed(&env, &node).await;
    let plans = env.calls(&node).await;
    assert_eq!(
        plans.iter().filter(|c| c.path == path::PLAN).count(),
        2,
        "a second plan"
    );
    let op = env.operation(&node).await;
    assert_eq!(op.run_attempts, 2);
    assert_eq!(op.seed, Some(runs[1].seed()));
}

#[tokio::test]
async fn killed_while_a_worker_run_waits_for_approval_it_finishes_with_a_new_seed() {
    let env = shared_of(CLUSTERS).await;
    let filter = "crash-run-worker";
    let [node] = env.isolated("alpha", ["alpha-md-0-w0"], filter).await;
    // The approve is held back, so the worker's run is waiting for approval when the
    // controller is SIGKILLed.
    let held = env
        .sim
        .inject(
            &Fault::latency(Duration::from_secs(4))
                .on_cluster("alpha")
                .at(Endpoint::Approve)
                .times(1),
        )
        .await
        .unwrap();
    let first = env.start_controller(filter, &[]);
    env.annotate_until_held(&node, "1y", path::RUN, TIMEOUT)
        .await;
    first.crash();
    env.sim.clear_fault(&held).await.ok();
    restart_until_done(&env, &node, filter).await;
    let runs = ran_again_with_a_new_seed(&env, &node).await;
    assert_eq!(runs[1].status, 200);
}
