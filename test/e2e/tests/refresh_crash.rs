//! Kill the controller at any step and start it again: the refresh finishes, the Machine never
//! stays in-progress, and `run` is not repeated once it is known to have completed. When a crash
//! leaves `run`'s outcome unknown, the refresh is done again with a new `plan` and a new seed
//! (released k8sd refuses a worker seed twice), and the recorded expiry is what the node serves.

use std::time::Duration;

use ck8s_certs::k8sd::wire::path;
use ck8s_certs_api::annotations::{IN_FLIGHT_REFRESH, REFRESH_CERTIFICATES_STATUS};
use ck8s_certs_api::machine_certificates::Phase;
use ck8s_certs_e2e::fixtures::NodeInfo;
use ck8s_certs_e2e::shared;
use ck8s_certs_e2e::sim::{Endpoint, Fault, runs};

const TIMEOUT: Duration = Duration::from_secs(90);

async fn expect_done(env: &ck8s_certs_e2e::Environment, node: &NodeInfo) {
    let annotations = env.wait_for_refresh(node, TIMEOUT).await;
    assert_eq!(
        annotations[REFRESH_CERTIFICATES_STATUS], "done",
        "{annotations:#?}"
    );
}

#[tokio::test]
async fn killed_during_plan_the_refresh_starts_over_and_runs_once() {
    let env = shared().await;
    let node = env.cluster("alpha").node("alpha-cp-0").clone();
    env.isolate(&node, "crash-plan").await;
    env.sim
        .inject(
            &Fault::latency(Duration::from_secs(3))
                .on(&node)
                .at(Endpoint::Plan)
                .times(1),
        )
        .await
        .unwrap();
    let first = env.start_controller("crash-plan", &[]);
    env.annotate_refresh(&node, "1y").await;
    env.wait_for_call(&node, path::PLAN, TIMEOUT, |c| c.status == 0)
        .await;
    first.crash();
    let _second = env.start_controller("crash-plan", &[]);
    expect_done(&env, &node).await;
    assert_eq!(
        runs(&env.sim.calls("alpha", &node.node).await.unwrap()).len(),
        1
    );
}

#[tokio::test]
async fn killed_after_the_seed_is_recorded_it_continues_with_a_new_plan_and_runs_once() {
    let env = shared().await;
    let node = env.cluster("alpha").node("alpha-cp-1").clone();
    env.isolate(&node, "crash-seed").await;
    let mut first = env.start_controller_with_env(
        "crash-seed",
        &[],
        &[("CK8S_CERTS_FAILPOINTS", "after-seed-recorded")],
    );
    env.annotate_refresh(&node, "1y").await;
    first.wait_for_exit(TIMEOUT).await;
    let op = env.operation(&node).await;
    // The seed record covers the first send: from here on run may have been sent.
    assert_eq!((op.phase, op.run_attempts), (Phase::Running, 1));
    assert_eq!(
        env.machine_annotations(&node).await[REFRESH_CERTIFICATES_STATUS],
        "in-progress"
    );

    let _second = env.start_controller("crash-seed", &[]);
    expect_done(&env, &node).await;
    let calls = env.sim.calls("alpha", &node.node).await.unwrap();
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
    let env = shared().await;
    let node = env.cluster("beta").node("beta-cp-0").clone();
    env.isolate(&node, "crash-outcome").await;
    let mut first = env.start_controller_with_env(
        "crash-outcome",
        &[],
        &[("CK8S_CERTS_FAILPOINTS", "after-outcome-recorded")],
    );
    env.annotate_refresh(&node, "1y").await;
    first.wait_for_exit(TIMEOUT).await;
    let annotations = env.machine_annotations(&node).await;
    assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "in-progress");
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

    let _second = env.start_controller("crash-outcome", &[]);
    expect_done(&env, &node).await;
    assert_eq!(
        runs(&env.sim.calls("beta", &node.node).await.unwrap()).len(),
        1
    );
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
async fn serves_the_recorded_expiry(env: &ck8s_certs_e2e::Environment, node: &NodeInfo) -> i64 {
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
    let env = shared().await;
    let node = env.cluster("beta").node("beta-cp-1").clone();
    env.isolate(&node, "crash-run-cp").await;
    env.sim
        .inject(
            &Fault::latency(Duration::from_secs(3))
                .on(&node)
                .at(Endpoint::Run)
                .times(1),
        )
        .await
        .unwrap();
    let first = env.start_controller("crash-run-cp", &[]);
    env.annotate_refresh(&node, "1y").await;
    env.wait_for_call(&node, path::RUN, TIMEOUT, |c| c.status == 0)
        .await;
    first.crash();
    let _second = env.start_controller("crash-run-cp", &[]);
    expect_done(&env, &node).await;
    let calls = env.sim.calls("beta", &node.node).await.unwrap();
    let runs = runs(&calls);
    assert_eq!(runs.len(), 2, "outcome unknown: one more run: {runs:#?}");
    assert_ne!(runs[0].seed(), runs[1].seed(), "a new plan, a new seed");
    assert_eq!(
        calls.iter().filter(|c| c.path == path::PLAN).count(),
        2,
        "a second plan"
    );
    let op = env.operation(&node).await;
    assert_eq!(op.run_attempts, 2);
    assert_eq!(op.seed, Some(runs[1].seed()));
    assert_eq!(
        serves_the_recorded_expiry(&env, &node).await,
        runs[1].seed()
    );
}

#[tokio::test]
async fn killed_while_a_worker_run_waits_for_approval_it_finishes_with_a_new_seed() {
    let env = shared().await;
    let alpha = env.cluster("alpha");
    let node = alpha.node("alpha-md-0-w0").clone();
    env.isolate(&node, "crash-run-worker").await;
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
    let first = env.start_controller("crash-run-worker", &[]);
    env.annotate_refresh(&node, "1y").await;
    env.wait_for_call(&node, path::RUN, TIMEOUT, |c| c.status == 0)
        .await;
    first.crash();
    env.sim.clear_fault(&held).await.ok();
    let _second = env.start_controller("crash-run-worker", &[]);
    expect_done(&env, &node).await;
    let calls = env.sim.calls("alpha", &node.node).await.unwrap();
    let runs = runs(&calls);
    assert_eq!(runs.len(), 2, "{runs:#?}");
    assert_ne!(runs[0].seed(), runs[1].seed(), "a seed is never sent twice");
    assert_eq!(runs[1].status, 200);
    assert_eq!(
        serves_the_recorded_expiry(&env, &node).await,
        runs[1].seed()
    );
}
