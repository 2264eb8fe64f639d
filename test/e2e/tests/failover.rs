//! Two replicas, as the Deployment runs them: one leads, the other stands by. Whatever happens
//! to the leader in the middle of a refresh — killed outright or asked to stop — the refresh is
//! finished exactly once: no `run` follows a completed one, and nothing stays in-progress.

use std::time::{Duration, Instant};

use ck8s_certs::k8sd::wire::path;
use ck8s_certs_api::machine_certificates::Phase;
use ck8s_certs_e2e::Environment;
use ck8s_certs_e2e::controller::Controller;
use ck8s_certs_e2e::fixtures::NodeInfo;
use ck8s_certs_e2e::shared_of;
use ck8s_certs_e2e::sim::{CallRecord, Endpoint, runs};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

/// The standard clusters these tests use; the others are not started.
const CLUSTERS: &[&str] = &["alpha", "beta", "gamma", "trio"];

const TIMEOUT: Duration = Duration::from_secs(90);

/// Starts replica `a` and waits until it leads, then starts standby `b` and waits until it is
/// ready. Each replica's POD_NAME names it in the Lease and in its Events.
async fn two_replicas(
    env: &Environment,
    filter: &str,
    a_args: &[&str],
    a_env: &[(&str, &str)],
) -> (Controller, Controller) {
    let a_name = format!("{filter}-a");
    let b_name = format!("{filter}-b");
    let mut a_vars = vec![("POD_NAME", a_name.as_str())];
    a_vars.extend_from_slice(a_env);
    let a = env.start_controller_with_env(filter, a_args, &a_vars);
    a.wait_until_leader(TIMEOUT).await;
    a.wait_until_ready(TIMEOUT).await;
    let b = env.start_controller_with_env(filter, &[], &[("POD_NAME", b_name.as_str())]);
    b.wait_until_ready(TIMEOUT).await;
    assert!(!b.is_leader().await, "only one replica leads");
    assert!(
        lease_holder(env, filter).await.starts_with(&a_name),
        "the Lease names the leader"
    );
    (a, b)
}

async fn lease_holder(env: &Environment, filter: &str) -> String {
    let leases: Api<Lease> = Api::namespaced(
        env.management().await.unwrap(),
        ck8s_certs_e2e::controller::NAMESPACE,
    );
    leases
        .get(&format!("ck8s-certs-{filter}"))
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default()
}

/// The refresh ended `done`, its record is Succeeded and nothing says it is still going.
async fn expect_finished(
    env: &Environment,
    node: &NodeInfo,
) -> ck8s_certs_api::machine_certificates::Operation {
    env.wait_for_done(node, TIMEOUT).await;
    let status = env
        .machine_certificates(node)
        .await
        .unwrap()
        .status
        .unwrap();
    let refreshing = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Refreshing")
        .map(|c| c.status.as_str());
    assert_ne!(refreshing, Some("True"), "{status:#?}");
    let op = status.operation.unwrap();
    assert_eq!(op.phase, Phase::Succeeded, "{op:#?}");
    op
}

/// Every completed `run` (answered 200) of `node`, and that none was sent after one completed.
async fn completed_runs(env: &Environment, node: &NodeInfo) -> Vec<CallRecord> {
    let calls = env.calls(node).await;
    let runs = runs(&calls);
    if let Some(first) = runs.iter().position(|r| r.status == 200) {
        assert_eq!(
            first,
            runs.len() - 1,
            "a run was sent after one completed: {runs:#?}"
        );
    }
    runs.into_iter()
        .filter(|r| r.status == 200)
        .cloned()
        .collect()
}

#[tokio::test]
async fn leader_killed_after_a_worker_run_the_standby_refreshes_it_again_with_a_new_plan() {
    let env = shared_of(CLUSTERS).await;
    let filter = "failover-worker";
    let [node] = env.isolated("alpha", ["alpha-md-0-w0"], filter).await;
    let (mut a, b) = two_replicas(
        &env,
        filter,
        &[],
        &[("CK8S_CERTS_FAILPOINTS", "after-run-answered")],
    )
    .await;
    env.annotate_refresh(&node, "1y").await;
    // The leader dies the instant the node answered: only the node knows the outcome, and
    // released k8sd offers no way to ask, so the standby refreshes again with a new plan.
    a.wait_for_exit(TIMEOUT).await;
    let died = Instant::now();
    expect_finished_by(&env, &node, &b, died).await;
    let calls = env.calls(&node).await;
    let answered: Vec<&CallRecord> = runs(&calls)
        .into_iter()
        .filter(|r| r.status == 200)
        .collect();
    assert_eq!(answered.len(), 2, "{answered:#?}");
    assert_ne!(
        answered[0].seed(),
        answered[1].seed(),
        "a seed is never sent twice"
    );
    let op = env.operation(&node).await;
    assert_eq!(op.seed, Some(answered[1].seed()));
    let state = env.sim.node(&node).await.unwrap();
    assert_eq!(
        env.machine_annotations(&node).await[ck8s_certs_api::annotations::CERTIFICATES_EXPIRY],
        state.cert_not_after,
        "the recorded expiry is what the node serves"
    );
}

async fn expect_finished_by(
    env: &Environment,
    node: &NodeInfo,
    standby: &Controller,
    since: Instant,
) {
    standby.wait_until_leader(TIMEOUT).await;
    println!(
        "standby took over {:.1}s after the leader died",
        since.elapsed().as_secs_f64()
    );
    expect_finished(env, node).await;
}

#[tokio::test]
async fn leader_killed_during_a_control_plane_run_the_standby_finishes_it_with_a_new_plan() {
    let env = shared_of(CLUSTERS).await;
    let filter = "failover-cp-kill";
    let [node] = env.isolated("beta", ["beta-cp-0"], filter).await;
    let (a, b) = two_replicas(&env, filter, &[], &[]).await;
    env.annotate_held_at(&node, Endpoint::Run, Duration::from_secs(3), TIMEOUT)
        .await;
    // Killed while run is held back: the node never acted on it (the client left first).
    a.crash();
    let died = Instant::now();
    expect_finished_by(&env, &node, &b, died).await;
    let calls = env.calls(&node).await;
    let runs = runs(&calls);
    assert_eq!(runs.len(), 2, "{runs:#?}");
    assert_ne!(
        runs[0].seed(),
        runs[1].seed(),
        "the unknown outcome is refreshed with a new plan"
    );
    assert_eq!(completed_runs(&env, &node).await.len(), 1);
    assert_eq!(calls.iter().filter(|c| c.path == path::PLAN).count(), 2);
}

#[tokio::test]
async fn leader_stopped_during_a_control_plane_run_finishes_it_and_hands_over() {
    let env = shared_of(CLUSTERS).await;
    let [cp, worker] = env.nodes("alpha", ["alpha-cp-0", "alpha-md-0-w1"]);
    env.isolate_all([&cp, &worker], "failover-cp-stop").await;
    let (mut a, b) = two_replicas(&env, "failover-cp-stop", &[], &[]).await;
    env.annotate_held_at(&cp, Endpoint::Run, Duration::from_secs(3), TIMEOUT)
        .await;

    // SIGTERM as the kubelet sends it: no new work, the run in flight finishes and is recorded,
    // then the Lease is released.
    let stopping = Instant::now();
    let terminate = tokio::task::spawn_blocking(move || {
        let status = a.process.terminate(Duration::from_secs(60));
        (a, status)
    });
    // Work requested while the leader drains is left for the standby.
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.annotate_refresh(&worker, "30d").await;
    let (a, status) = terminate.await.unwrap();
    assert!(
        status.is_some_and(|s| s.success()),
        "a graceful stop exits 0: {status:?}\n{}",
        a.process.log_tail(30)
    );
    println!(
        "leader drained and exited in {:.1}s",
        stopping.elapsed().as_secs_f64()
    );
    let log = a.log();
    assert!(log.contains("Released the leader Lease"), "{log}");
    let op = expect_finished(&env, &cp).await;
    assert_eq!(op.run_attempts, 1, "{op:#?}");
    assert_eq!(completed_runs(&env, &cp).await.len(), 1);
    assert_eq!(runs(&env.calls(&cp).await).len(), 1);

    // The standby takes over at once (the Lease was released, not left to expire) and does
    // the worker that arrived during the drain.
    b.wait_until_leader(TIMEOUT).await;
    expect_finished(&env, &worker).await;
    assert_eq!(
        env.event_reporters(&worker, "CertificatesRefreshInProgress")
            .await,
        vec!["failover-cp-stop-b".to_string()],
        "only the new leader started the worker"
    );
    assert_eq!(
        env.event_reporters(&cp, "CertificatesRefreshDone").await,
        vec!["failover-cp-stop-a".to_string()],
        "the stopping leader recorded its own refresh"
    );
    assert!(
        lease_holder(&env, "failover-cp-stop")
            .await
            .starts_with("failover-cp-stop-b")
    );
}

#[tokio::test]
async fn a_leader_that_loses_its_lease_stops_acting_and_exits() {
    let env = shared_of(CLUSTERS).await;
    let mut leader =
        env.start_controller_with_env("failover-lost", &[], &[("POD_NAME", "failover-lost-a")]);
    leader.wait_until_leader(TIMEOUT).await;
    // Another holder appears (an operator's edit, a replica with a skewed view): the leader must
    // not act beside it.
    let leases: Api<Lease> = Api::namespaced(
        env.management().await.unwrap(),
        ck8s_certs_e2e::controller::NAMESPACE,
    );
    leases
        .patch(
            "ck8s-certs-failover-lost",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({ "spec": { "holderIdentity": "intruder" } }),
            ),
        )
        .await
        .unwrap();
    leader.wait_for_exit(TIMEOUT).await;
    let status = leader.process.check_running().unwrap_err().to_string();
    assert!(status.contains("exit status: 1"), "{status}");
    let log = leader.log();
    assert!(
        log.contains("stopped acting because leadership was lost") && log.contains("intruder"),
        "{status}\n{log}"
    );
}

fn signal(controller: &Controller, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(controller.process.pid()).expect("a pid");
    // SAFETY: kill(2) on a child process of this test; no memory is shared.
    let sent = unsafe { libc::kill(pid, signal) };
    assert_eq!(sent, 0, "kill({pid}, {signal})");
}

#[tokio::test]
async fn a_leader_paused_past_its_lease_sends_nothing_after_the_standby_took_over() {
    let env = shared_of(CLUSTERS).await;
    let [cp] = env.isolated("trio", ["trio-cp-2"], "failover-paused").await;
    let (mut a, b) = two_replicas(&env, "failover-paused", &[], &[]).await;
    // The leader's `plan` is answered late: it is frozen (SIGSTOP, as a VM pause or a debugger
    // would) while it waits, with a seed about to come back.
    env.annotate_held_at(&cp, Endpoint::Plan, Duration::from_secs(3), TIMEOUT)
        .await;
    signal(&a, libc::SIGSTOP);
    let paused = Instant::now();

    // The standby takes over once the Lease is not renewed, and refreshes the node.
    b.wait_until_leader(TIMEOUT).await;
    println!(
        "the standby led {:.1}s after the leader was paused",
        paused.elapsed().as_secs_f64()
    );
    expect_finished(&env, &cp).await;
    let before = runs(&env.calls(&cp).await).len();
    assert_eq!(before, 1);

    // The old leader wakes with its `plan` answered: its term is over, so it records nothing,
    // sends nothing, and exits.
    signal(&a, libc::SIGCONT);
    a.wait_for_exit(TIMEOUT).await;
    let status = a.process.check_running().unwrap_err().to_string();
    assert!(status.contains("exit status: 1"), "{status}");
    let calls = env.calls(&cp).await;
    assert_eq!(runs(&calls).len(), 1, "{:#?}", runs(&calls));
    assert_eq!(completed_runs(&env, &cp).await.len(), 1);
    assert_eq!(
        env.event_reporters(&cp, "CertificatesRefreshDone").await,
        vec!["failover-paused-b".to_string()],
        "only the new leader refreshed"
    );
}

#[tokio::test]
async fn leader_stopped_while_a_worker_run_waits_for_approval_the_run_is_waited_out_before_a_new_plan()
 {
    let env = shared_of(CLUSTERS).await;
    let gamma = env.cluster("gamma");
    let worker = gamma.node("alpha-md-0-w1").clone();
    env.isolate(&worker, "failover-worker-stop").await;
    // A short grace period: the worker's `run` (waiting for its CSRs, whose approval is slow)
    // outlasts it.
    let (mut a, b) = two_replicas(
        &env,
        "failover-worker-stop",
        &["--shutdown-grace-period=1s"],
        &[],
    )
    .await;
    for cp in gamma.nodes.iter().filter(|n| n.machine.contains("-cp-")) {
        env.sim
            .delay_next(cp, Endpoint::Approve, Duration::from_secs(8))
            .await
            .unwrap();
    }
    env.annotate_until_held(&worker, "1y", path::RUN, TIMEOUT)
        .await;
    let first = env.operation(&worker).await;
    let seeded_at = first
        .seeded_at
        .clone()
        .expect("the seed's time is journaled");

    let status = tokio::task::spawn_blocking(move || a.process.terminate(Duration::from_secs(60)))
        .await
        .unwrap();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");

    // The standby takes over at once (the Lease was released) and says why it waits.
    b.wait_until_leader(TIMEOUT).await;
    let shown = format!(
        "the run of seed {} (recorded at",
        first.seed.unwrap_or_default()
    );
    let start = Instant::now();
    loop {
        let status = env
            .machine_certificates(&worker)
            .await
            .and_then(|mc| mc.status);
        let says = status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Refreshing" && c.message.contains(&shown))
        });
        if says {
            break;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "the new leader never said it waits for the abandoned run: {status:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    expect_finished(&env, &worker).await;

    // One run answered; the new plan came only after the first run's timeout had passed.
    let calls = env.calls(&worker).await;
    let all = runs(&calls);
    assert_eq!(all.len(), 2, "{all:#?}");
    assert_eq!(completed_runs(&env, &worker).await.len(), 1);
    let plans: Vec<&CallRecord> = calls.iter().filter(|c| c.path == path::PLAN).collect();
    let second_plan: jiff::Timestamp = plans.last().unwrap().started_at.parse().unwrap();
    // --k8sd-run-timeout of the e2e controllers: 20 s, from when the new leader took it over
    // (after the seed was recorded).
    let allowed = seeded_at.0 + jiff::SignedDuration::from_secs(20);
    assert!(
        second_plan >= allowed,
        "planned again at {second_plan}, before {allowed}"
    );
    let op = env.operation(&worker).await;
    assert_eq!(op.run_attempts, 2, "{op:#?}");
}

/// The Lease itself, in-process against the real API server: one leader at a time, a released
/// Lease is taken at once, an abandoned one after its duration, and a leader whose Lease is
/// taken over stops leading. The records are client-go's, so `kubectl get lease` reads them.
mod lease {
    use std::time::{Duration, Instant};

    use ck8s_certs::leader::{Elector, Lost, Settings};
    use ck8s_certs_e2e::shared_of;

    use super::CLUSTERS;
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::Api;
    use kube::api::{Patch, PatchParams};

    const NAMESPACE: &str = "default";

    fn settings(lease: &str, identity: &str) -> Settings {
        Settings {
            namespace: NAMESPACE.into(),
            name: lease.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(3),
            // The margin a leader's last call to a node needs: 2 s at least.
            renew_deadline: Duration::from_secs(1),
            retry_period: Duration::from_millis(200),
        }
    }

    async fn lease(name: &str) -> Lease {
        let env = shared_of(CLUSTERS).await;
        Api::<Lease>::namespaced(env.management().await.unwrap(), NAMESPACE)
            .get(name)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn one_leader_at_a_time_and_a_released_lease_is_taken_at_once() {
        let env = shared_of(CLUSTERS).await;
        let client = env.management().await.unwrap();
        let mut first = Elector::new(client.clone(), settings("release", "first")).unwrap();
        let mut second = Elector::new(client, settings("release", "second")).unwrap();
        first.acquire().await;
        let record = lease("release").await.spec.unwrap();
        assert_eq!(record.holder_identity.as_deref(), Some("first"));
        assert_eq!(record.lease_duration_seconds, Some(3));
        assert_eq!(record.lease_transitions, Some(1));

        // The second waits while the first renews, well past the lease duration.
        let waited = tokio::select! {
            () = second.acquire() => false,
            lost = first.hold() => panic!("the leader lost its Lease: {lost}"),
            () = tokio::time::sleep(Duration::from_secs(5)) => true,
        };
        assert!(
            waited,
            "the second candidate took a Lease that was being renewed"
        );

        first.release().await.unwrap();
        let released = lease("release").await.spec.unwrap();
        assert_eq!(released.holder_identity, None);
        let start = Instant::now();
        second.acquire().await;
        println!(
            "a released Lease was taken after {:.2}s",
            start.elapsed().as_secs_f64()
        );
        let record = lease("release").await.spec.unwrap();
        assert_eq!(record.holder_identity.as_deref(), Some("second"));
        assert_eq!(record.lease_transitions, Some(2));
    }

    #[tokio::test]
    async fn an_abandoned_lease_is_taken_after_its_duration() {
        let env = shared_of(CLUSTERS).await;
        let client = env.management().await.unwrap();
        let mut crashed = Elector::new(client.clone(), settings("abandoned", "crashed")).unwrap();
        crashed.acquire().await;
        drop(crashed);
        let mut standby = Elector::new(client, settings("abandoned", "standby")).unwrap();
        let start = Instant::now();
        standby.acquire().await;
        let waited = start.elapsed();
        println!(
            "an abandoned 3s Lease was taken after {:.2}s",
            waited.as_secs_f64()
        );
        // Expiry is measured on the standby's own clock from when it first saw the record.
        assert!(waited >= Duration::from_secs(3), "{waited:?}");
    }

    #[tokio::test]
    async fn a_lease_deleted_while_held_is_waited_out_not_taken_at_once() {
        let env = shared_of(CLUSTERS).await;
        let client = env.management().await.unwrap();
        let mut holder = Elector::new(client.clone(), settings("deleted", "holder")).unwrap();
        holder.acquire().await;
        let mut standby = Elector::new(client.clone(), settings("deleted", "standby")).unwrap();
        // The standby sees the holder's record…
        let saw = Instant::now();
        let took = tokio::time::timeout(Duration::from_millis(300), standby.acquire()).await;
        assert!(took.is_err(), "a held Lease was taken");
        // …then someone deletes the Lease while the holder may still act.
        Api::<Lease>::namespaced(client, NAMESPACE)
            .delete("deleted", &Default::default())
            .await
            .unwrap();
        standby.acquire().await;
        let waited = saw.elapsed();
        println!(
            "a 3s Lease deleted while held was taken {:.2}s after its holder was last seen",
            waited.as_secs_f64()
        );
        assert!(waited >= Duration::from_secs(3), "{waited:?}");
        let record = lease("deleted").await.spec.unwrap();
        assert_eq!(record.holder_identity.as_deref(), Some("standby"));
    }

    #[tokio::test]
    async fn a_leader_whose_lease_is_taken_over_stops_leading() {
        let env = shared_of(CLUSTERS).await;
        let client = env.management().await.unwrap();
        let mut leader = Elector::new(client.clone(), settings("takeover", "leader")).unwrap();
        leader.acquire().await;
        // Someone else (an operator, another version) writes the Lease.
        Api::<Lease>::namespaced(client, NAMESPACE)
            .patch(
                "takeover",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "spec": { "holderIdentity": "intruder" } })),
            )
            .await
            .unwrap();
        let lost = tokio::time::timeout(Duration::from_secs(10), leader.hold())
            .await
            .expect("the leader noticed");
        assert!(
            matches!(&lost, Lost::TakenOver { holder, .. } if holder == "intruder"),
            "{lost}"
        );
    }

    #[tokio::test]
    async fn inconsistent_timings_are_refused() {
        let env = shared_of(CLUSTERS).await;
        let mut bad = settings("never", "me");
        bad.renew_deadline = Duration::from_secs(3);
        let error = Elector::new(env.management().await.unwrap(), bad)
            .err()
            .expect("refused");
        assert!(
            error.to_string().contains("--leader-elect-renew-deadline"),
            "{error}"
        );
    }
}
