//! The executor against a scripted connector (node, approver) and journal, without a network or
//! an API server; paused time. What is asserted is what the node saw, in order, and when a
//! refresh gives its cluster back.

use std::sync::Arc;

use ck8s_certs_api::machine_certificates::{Origin, Phase};
use futures::channel::mpsc;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::scripted::{Journal, Link, Log, Node, api, entries, journal, no_answer, node, refused};
use super::*;
use crate::testing::{assert_contains, assert_starts_with};

const EXPIRY: i64 = 1_900_000_000;
const YEAR: i64 = 365 * 86_400;
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// A log of what the scripted nodes and journals see, and a leading executor whose wakings come
/// out of the receiver.
fn bench() -> (Log, Executor, mpsc::UnboundedReceiver<Waiter>) {
    bench_in(crate::leader::Term::always())
}

fn bench_in(term: crate::leader::Term) -> (Log, Executor, mpsc::UnboundedReceiver<Waiter>) {
    let (tx, rx) = mpsc::unbounded();
    let executor = Executor::new(
        Admission::new(2, 10, Some(tx)),
        Settings {
            wait_timeout: Duration::from_secs(60),
            tries: 3,
            settle_timeout: Duration::from_secs(30),
            run_timeout: RUN_TIMEOUT,
            connect_timeout: Duration::from_secs(20),
        },
        CancellationToken::new(),
        term,
        Arc::new(crate::clock::FixedClock::new(
            Timestamp::from_second(EXPIRY - YEAR).unwrap(),
        )),
    );
    (Log::default(), executor, rx)
}

fn operation(seed: Option<i64>, run_attempts: u32) -> Operation {
    Operation {
        seed,
        phase: if seed.is_some() {
            Phase::Running
        } else {
            Phase::Pending
        },
        run_attempts,
        ..Operation::pending(
            Origin::Manual,
            None,
            Some("1y".into()),
            "1y".into(),
            YEAR,
            Time(Timestamp::from_second(EXPIRY - YEAR).unwrap()),
        )
    }
}

fn accepted(machine: &str, role: Role, op: Operation) -> Accepted {
    Accepted {
        namespace: "ns".into(),
        machine: machine.into(),
        cluster: "c".into(),
        node: machine.into(),
        role,
        ttl: ttl_of(&op).unwrap(),
        request: format!("{machine}-1"),
        op,
        control_planes_pending: false,
        gate: None,
    }
}

/// Runs a first operation of `machine` (in cluster `c`) through `executor`.
async fn go(
    executor: &Executor,
    machine: &str,
    role: Role,
    link: &Link,
    journal: &mut Journal,
) -> Finished<Node> {
    go_with(executor, machine, role, operation(None, 0), link, journal).await
}

/// Runs a first operation of control plane `machine` through `executor`, with a journal of
/// its own.
async fn control_plane(
    executor: &Executor,
    machine: &str,
    link: &Link,
    log: &Log,
) -> Finished<Node> {
    let mut journal = journal(log);
    go(executor, machine, Role::ControlPlane, link, &mut journal).await
}

/// Runs `op` of `machine` (in cluster `c`) through `executor`.
async fn go_with(
    executor: &Executor,
    machine: &str,
    role: Role,
    op: Operation,
    link: &Link,
    journal: &mut Journal,
) -> Finished<Node> {
    executor
        .execute(accepted(machine, role, op), link, journal)
        .await
}

/// A Machine of namespace `ns`.
fn who(machine: &str) -> Waiter {
    Waiter {
        namespace: "ns".into(),
        machine: machine.into(),
    }
}

fn woken(rx: &mut mpsc::UnboundedReceiver<Waiter>) -> Vec<String> {
    let mut names = Vec::new();
    while let Ok(w) = rx.try_recv() {
        names.push(w.machine);
    }
    names
}

/// Workers `w-1` and `w-2` hold cluster `c`'s two places.
fn both_places_of_c_taken(executor: &Executor) -> (Guard, Guard) {
    let take = |machine| {
        executor
            .admission
            .try_enter("ns", "c", Role::Worker, &who(machine))
            .unwrap()
    };
    (take("w-1"), take("w-2"))
}

/// What a [`Finished`] says, for assertions.
fn said<N>(finished: &Finished<N>) -> String {
    match finished {
        Finished::Ran { op, settle } => format!(
            "ran {:?} expiry={} settle={}",
            op.phase,
            op.new_expiry.as_ref().map_or(0, |t| t.0.as_second()),
            settle.is_some()
        ),
        Finished::Failed { failure, .. } => format!("failed: {}", failure.cause()),
        Finished::Wait { why, .. } => format!("wait: {why}"),
        Finished::Stopping => "stopping".into(),
        Finished::Superseded => "superseded".into(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_control_plane_is_refreshed_and_keeps_its_cluster_until_it_answers_again() {
    let (log, executor, mut rx) = bench();
    let link = node(&log, "cp-0", vec![Ok(42)], vec![Ok(EXPIRY)]);
    let finished = control_plane(&executor, "cp-0", &link, &log).await;
    assert_eq!(
        said(&finished),
        format!("ran Succeeded expiry={EXPIRY} settle=true")
    );
    assert_eq!(
        entries(&log),
        [
            "connect",
            "cp-0 plan 42",
            "record seed=42 attempts=1",
            "cp-0 run 42 for 31536000s"
        ]
    );
    let Finished::Ran {
        settle: Some(mut settle),
        ..
    } = finished
    else {
        unreachable!()
    };
    settle.node.probes = [Err(refused()), Err(refused())].into();
    // While it settles, the cluster is taken: a second control plane and a worker wait.
    settle.spawn();
    let other = node(&log, "cp-1", vec![Ok(7)], vec![Ok(EXPIRY)]);
    let waiting = control_plane(&executor, "cp-1", &other, &log).await;
    assert_eq!(
        said(&waiting),
        "wait: another control plane of the cluster is being refreshed"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    // Answered at the third probe: the cluster is free, the waiter woken.
    assert_eq!(
        entries(&log)
            .iter()
            .filter(|e| e.ends_with("probe"))
            .count(),
        3
    );
    assert_eq!(woken(&mut rx), ["cp-1"]);
    let finished = control_plane(&executor, "cp-1", &other, &log).await;
    assert_starts_with(&said(&finished), "ran Succeeded");
}

#[tokio::test(start_paused = true)]
async fn a_worker_runs_while_a_control_plane_approves_and_an_approve_error_is_noted() {
    let (log, executor, _rx) = bench();
    let mut link = node(&log, "w-0", vec![Ok(9)], vec![Ok(EXPIRY)]);
    // k8sd's auto-approver approved the CSRs: every approve answers 500, run succeeds.
    link.approver.get_mut().unwrap().as_mut().unwrap().answers =
        (0..10).map(|_| Err(api(500, "already approved"))).collect();
    link.node.get_mut().unwrap().as_mut().unwrap().run_takes = Duration::from_secs(3);
    let finished = go(&executor, "w-0", Role::Worker, &link, &mut journal(&log)).await;
    let Finished::Ran { op, settle } = finished else {
        panic!("not run: {}", said(&finished));
    };
    assert!(settle.is_none(), "a worker's cluster is not held after it");
    // How the node was reached goes on the record (the connector says).
    assert_eq!(
        op.transport.as_deref(),
        Some("port-forward to pod k8sd-proxy-x:2380")
    );
    assert!(
        op.note
            .as_deref()
            .is_some_and(|n| n.contains("approve answered an error")),
        "{:?}",
        op.note
    );
    let log = entries(&log);
    assert!(log.contains(&"approve 9".to_owned()), "{log:?}");
    assert!(
        log.contains(&"w-0 run 9 for 31536000s".to_owned()),
        "{log:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_is_followed_by_a_new_plan_and_a_restart_counts_the_runs_sent() {
    let (log, executor, _rx) = bench();
    let link = node(
        &log,
        "cp-0",
        vec![Ok(1), Ok(2)],
        vec![Err(no_answer("run")), Ok(EXPIRY)],
    );
    let finished = control_plane(&executor, "cp-0", &link, &log).await;
    assert!(said(&finished).starts_with("ran Succeeded"));
    // Its settle is not started: the cluster is free.
    drop(finished);
    assert_eq!(
        entries(&log)
            .iter()
            .filter(|e| e.contains(" run "))
            .cloned()
            .collect::<Vec<_>>(),
        ["cp-0 run 1 for 31536000s", "cp-0 run 2 for 31536000s"]
    );

    // A crash between the seed and the answer: resumed from the journal (seed 5, one run
    // sent, outcome unknown), a new plan, never seed 5 again; and no more than three runs.
    let log = Log::default();
    let link = node(
        &log,
        "cp-1",
        vec![Ok(6), Ok(7)],
        vec![Err(no_answer("run")), Err(no_answer("run"))],
    );
    let finished = executor
        .execute(
            accepted("cp-1", Role::ControlPlane, operation(Some(5), 1)),
            &link,
            &mut journal(&log),
        )
        .await;
    assert_contains(&said(&finished), "run was sent 3 times without an answer");
    let runs: Vec<_> = entries(&log)
        .into_iter()
        .filter(|e| e.contains(" run "))
        .collect();
    assert_eq!(
        runs,
        ["cp-1 run 6 for 31536000s", "cp-1 run 7 for 31536000s"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_journal_that_cannot_record_the_seed_stops_the_operation_before_run() {
    let (log, executor, _rx) = bench();
    let link = node(&log, "cp-0", vec![Ok(42)], vec![Ok(EXPIRY)]);
    let mut journal = Journal {
        refuse: Some(|| Failure::Api("the API server refused the write".into())),
        ..journal(&log)
    };
    let finished = go(&executor, "cp-0", Role::ControlPlane, &link, &mut journal).await;
    assert_eq!(said(&finished), "failed: the API server refused the write");
    assert!(!entries(&log).iter().any(|e| e.contains(" run ")));
    // The cluster is free again at once.
    let next = node(&log, "cp-1", vec![Ok(1)], vec![Ok(EXPIRY)]);
    let finished = control_plane(&executor, "cp-1", &next, &log).await;
    assert_starts_with(&said(&finished), "ran");
}

#[tokio::test(start_paused = true)]
async fn a_hung_worker_gives_its_cluster_back_between_tries_so_a_control_plane_goes_in_between() {
    let (log, executor, _rx) = bench();
    let worker = node(&log, "w-0", vec![Err(no_answer("plan"))], vec![]);
    let first = go(&executor, "w-0", Role::Worker, &worker, &mut journal(&log)).await;
    assert_starts_with(&said(&first), "wait: the node's k8sd");
    // Between the worker's tries, a control plane of its cluster refreshes.
    let cp = node(&log, "cp-0", vec![Ok(3)], vec![Ok(EXPIRY)]);
    let finished = control_plane(&executor, "cp-0", &cp, &log).await;
    let Finished::Ran { settle, .. } = finished else {
        panic!("the control plane waited for the hung worker");
    };
    drop(settle);
    // The worker's tries go on (3 in all), then it fails with the cause.
    let mut journal = self::journal(&log);
    let mut last = String::new();
    for _ in 0..2 {
        let worker = node(&log, "w-0", vec![Err(no_answer("plan"))], vec![]);
        last = said(&go(&executor, "w-0", Role::Worker, &worker, &mut journal).await);
    }
    assert!(last.contains("(3 tries)"), "{last}");
    let plans = entries(&log)
        .iter()
        .filter(|e| e.starts_with("w-0 plan"))
        .count();
    assert_eq!(plans, 3);
}

#[tokio::test(start_paused = true)]
async fn a_refresh_a_gate_holds_waits_before_its_node_is_touched() {
    let (log, executor, _rx) = bench();
    let link = node(&log, "cp-0", vec![Ok(1)], vec![Ok(EXPIRY)]);
    let mut journal = journal(&log);
    let gate = Some("Machine w-3 of the cluster is being deleted (gate MachineDeleting)".into());
    let held = executor
        .execute(
            Accepted {
                gate: gate.clone(),
                ..accepted("cp-0", Role::ControlPlane, operation(None, 0))
            },
            &link,
            &mut journal,
        )
        .await;
    assert_eq!(
        said(&held),
        "wait: Machine w-3 of the cluster is being deleted (gate MachineDeleting) (a pre-flight gate): it starts once that ends, or now with certificates.ck8s.io/force-refresh=true on the Machine"
    );
    assert!(
        entries(&log).iter().all(|e| !e.starts_with("cp-0 ")),
        "{:?}",
        entries(&log)
    );
    // The gate opened: it goes on.
    let ran = executor
        .execute(
            accepted("cp-0", Role::ControlPlane, operation(None, 0)),
            &link,
            &mut journal,
        )
        .await;
    assert!(said(&ran).starts_with("ran Succeeded"), "{}", said(&ran));
}

#[tokio::test(start_paused = true)]
async fn workers_wait_for_their_cluster_s_control_planes_and_for_a_place() {
    let (log, executor, mut rx) = bench();
    // A control plane is pending: the worker waits without touching anything.
    let link = node(&log, "w-0", vec![Ok(1)], vec![Ok(EXPIRY)]);
    let mut journal = journal(&log);
    let waiting = executor
        .execute(
            Accepted {
                control_planes_pending: true,
                ..accepted("w-0", Role::Worker, operation(None, 0))
            },
            &link,
            &mut journal,
        )
        .await;
    assert_eq!(
        said(&waiting),
        "wait: the control planes of cluster c are refreshed first"
    );
    assert!(entries(&log).is_empty());
    assert_eq!(
        journal.shown,
        ["Waiting: the control planes of cluster c are refreshed first"]
    );
    assert_eq!(
        executor
            .look(&who("w-0"), "w-0-1", Role::Worker, || true)
            .and_then(|parked| parked.op),
        Some(operation(None, 0))
    );
    // The control plane's refresh wakes it.
    let cp = node(&log, "cp-0", vec![Ok(3)], vec![Ok(EXPIRY)]);
    let Finished::Ran { settle, .. } = control_plane(&executor, "cp-0", &cp, &log).await else {
        panic!("the control plane did not run");
    };
    drop(settle);
    assert_eq!(woken(&mut rx), ["w-0"]);
    // Woken, it goes (its place was kept for it).
    let finished = go(&executor, "w-0", Role::Worker, &link, &mut journal).await;
    assert_starts_with(&said(&finished), "ran");

    // Two places per cluster: a third worker waits, and is woken when one leaves.
    let link = node(&log, "w-3", vec![Ok(4)], vec![Ok(EXPIRY)]);
    let mut journal = self::journal(&log);
    let (a, _b) = both_places_of_c_taken(&executor);
    let waiting = go(&executor, "w-3", Role::Worker, &link, &mut journal).await;
    assert!(said(&waiting).contains("(--max-worker-refreshes-per-cluster)"));
    // Queued for a place: nothing written.
    assert!(journal.shown.is_empty(), "{:?}", journal.shown);
    let again = go(&executor, "w-3", Role::Worker, &link, &mut journal).await;
    assert_starts_with(&said(&again), "wait");
    assert!(journal.shown.is_empty(), "{:?}", journal.shown);
    drop(a);
    assert_eq!(woken(&mut rx), ["w-3"]);
    let finished = go(&executor, "w-3", Role::Worker, &link, &mut journal).await;
    assert_starts_with(&said(&finished), "ran");
}

#[tokio::test(start_paused = true)]
async fn a_queued_worker_that_only_looks_again_keeps_its_place_in_line() {
    let (log, executor, mut rx) = bench();
    let (a, _b) = both_places_of_c_taken(&executor);
    let link = node(&log, "w-3", vec![Ok(4)], vec![Ok(EXPIRY)]);
    let mut journal = journal(&log);
    let queued = go(&executor, "w-3", Role::Worker, &link, &mut journal).await;
    assert_starts_with(&said(&queued), "wait");
    // Its note in the queue lapses (WAITER_TTL without a new try) while it still waits.
    executor.admission.forget("ns", "c", &who("w-3"));
    // Looking again (the cheap recheck, nothing read) notes it as waiting again ...
    assert!(blocked(&executor, "w-3"));
    // ... so that it is woken when a place frees, not left to find one by itself.
    drop(a);
    assert_eq!(woken(&mut rx), ["w-3"]);
    assert!(!blocked(&executor, "w-3"));
}

/// Whether the refresh parked for `machine` (request `<machine>-1`) could still not go.
fn blocked(executor: &Executor, machine: &str) -> bool {
    executor
        .look(&who(machine), &format!("{machine}-1"), Role::Worker, || {
            false
        })
        .is_some_and(|parked| parked.blocked)
}

#[tokio::test(start_paused = true)]
async fn a_restarting_workload_api_is_waited_for_then_given_up_on() {
    let (log, executor, _rx) = bench();
    let mut link = node(&log, "cp-0", vec![], vec![]);
    *link.connects.get_mut().unwrap() = (0..20)
        .map(|_| Failure::Unavailable("the tunnel cannot be opened".into()))
        .collect();
    let mut journal = journal(&log);
    let mut waited = Duration::ZERO;
    let last = loop {
        let finished = go(&executor, "cp-0", Role::ControlPlane, &link, &mut journal).await;
        match finished {
            Finished::Wait { after, .. } => {
                waited += after;
                tokio::time::advance(after).await;
            }
            other => break said(&other),
        }
    };
    assert!(
        last.contains("the workload cluster did not answer within 1m"),
        "{last}"
    );
    assert_eq!(waited, Duration::from_secs(60));
    // Shown once, not at every try.
    assert_eq!(journal.shown.len(), 1, "{:?}", journal.shown);
}

/// A workload API whose certificate expired is renewed by a control plane's refresh: a worker
/// waits for that (saying so), and goes on once the API answers again.
#[tokio::test(start_paused = true)]
async fn a_worker_waits_for_a_control_plane_to_renew_an_expired_workload_api() {
    let (log, executor, _rx) = bench();
    let mut link = node(&log, "w-0", vec![Ok(5)], vec![Ok(EXPIRY)]);
    *link.connects.get_mut().unwrap() = (0..2)
        .map(|_| {
            Failure::Workload(crate::workload::WorkloadError::ApiCertificateExpired {
                cluster: "c".into(),
                at: None,
            })
        })
        .collect();
    // The scripted approver is handed out once: kept back while the node cannot be reached.
    let mut approver = link.approver.get_mut().unwrap().take();
    let mut journal = journal(&log);
    let mut waits = Vec::new();
    let finished = loop {
        if waits.len() == 2 {
            *link.approver.get_mut().unwrap() = approver.take();
        }
        let finished = go(&executor, "w-0", Role::Worker, &link, &mut journal).await;
        match finished {
            Finished::Wait { after, .. } => {
                waits.push(after);
                tokio::time::advance(after).await;
            }
            other => break other,
        }
    };
    assert_eq!(waits.len(), 2);
    assert!(
        matches!(finished, Finished::Ran { .. }),
        "{}",
        said(&finished)
    );
    assert_eq!(journal.shown.len(), 1, "{:?}", journal.shown);
    assert!(
        journal.shown[0].contains(
            "a control plane's refresh, which renews the workload cluster's API: the API server of workload cluster c serves a certificate that expired:"
        ),
        "{:?}",
        journal.shown
    );
}

#[tokio::test(start_paused = true)]
async fn a_stopping_process_starts_nothing_new() {
    let (log, executor, _rx) = bench();
    executor.stop.cancel();
    let link = node(&log, "cp-0", vec![Ok(1)], vec![Ok(EXPIRY)]);
    let finished = control_plane(&executor, "cp-0", &link, &log).await;
    assert_eq!(said(&finished), "stopping");
    assert!(entries(&log).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_run_sent_before_a_handover_is_waited_out_from_when_it_was_taken_over() {
    let (log, executor, _rx) = bench();
    let now = Timestamp::from_second(EXPIRY - YEAR).unwrap();
    // Recorded an hour ago by the wall clock of the replica that sent it, which may be ahead
    // of ours by any amount: the run may still be running on the node, so this replica waits
    // the whole run timeout from when it first sees it.
    let sent = Operation {
        seeded_at: Some(Time(now - jiff::SignedDuration::from_secs(3600))),
        ..operation(Some(7), 1)
    };
    let mut journal = journal(&log);
    let mut look = async |op: &Operation| {
        let link = node(&log, "w-0", vec![Ok(8)], vec![Ok(EXPIRY)]);
        go_with(
            &executor,
            "w-0",
            Role::Worker,
            op.clone(),
            &link,
            &mut journal,
        )
        .await
    };
    let finished = look(&sent).await;
    assert!(
        said(&finished).contains("the run of seed 7 (recorded at")
            && said(&finished).contains(
                "a new plan waits --k8sd-run-timeout (5m) from when this replica took it over"
            )
            && matches!(finished, Finished::Wait { after, .. } if after == RUN_TIMEOUT),
        "{}",
        said(&finished)
    );
    // Looked at again later: the rest of the wait, counted from the first sighting.
    tokio::time::advance(RUN_TIMEOUT - Duration::from_secs(10)).await;
    let finished = look(&sent).await;
    assert!(
        matches!(finished, Finished::Wait { after, .. } if after == Duration::from_secs(10)),
        "{}",
        said(&finished)
    );
    assert!(entries(&log).is_empty(), "{:?}", entries(&log));
    // The run timeout has passed since it was taken over: a new plan, a new seed.
    tokio::time::advance(Duration::from_secs(10)).await;
    let finished = look(&sent).await;
    assert_starts_with(&said(&finished), "ran Succeeded");
    assert!(
        entries(&log).contains(&"record seed=8 attempts=2".to_owned()),
        "{:?}",
        entries(&log)
    );
    assert_eq!(
        journal.shown.len(),
        1,
        "shown waiting once: {:?}",
        journal.shown
    );
}

#[tokio::test(start_paused = true)]
async fn a_replica_that_does_not_lead_sends_nothing_even_for_a_journaled_operation() {
    let (log, executor, _rx) = bench_in(crate::leader::Term::none());
    let link = node(&log, "cp-0", vec![Ok(2)], vec![Ok(EXPIRY)]);
    // A run of seed 1 with no known outcome: the next leader goes on with it, not this one.
    let finished = go_with(
        &executor,
        "cp-0",
        Role::ControlPlane,
        operation(Some(1), 1),
        &link,
        &mut journal(&log),
    )
    .await;
    assert_eq!(said(&finished), "stopping");
    assert!(entries(&log).is_empty());
}

#[test]
fn an_operation_without_a_valid_lifetime_is_refused_before_anything_is_sent() {
    assert_eq!(ttl_of(&operation(None, 0)).unwrap().as_seconds(), YEAR);
    // Journaled without seconds: the TTL as written.
    let without = Operation {
        ttl_seconds: None,
        ..operation(None, 0)
    };
    assert_eq!(ttl_of(&without).unwrap().as_seconds(), YEAR);
    for (seconds, ttl) in [(None, "soon"), (Some(0), "1y"), (Some(-5), "1y")] {
        let op = Operation {
            ttl_seconds: seconds,
            ttl: ttl.into(),
            ..operation(None, 0)
        };
        let failure = ttl_of(&op).err().map(|f| f.cause()).unwrap_or_default();
        assert!(
            failure.contains("no valid certificate lifetime"),
            "{seconds:?} {ttl}: {failure}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_node_that_is_slow_to_reach_holds_no_place_and_is_given_up_on_at_the_connect_timeout() {
    let (log, executor, _) = bench();
    // A tenant's workload API that answers every read slowly: reaching the worker takes an hour.
    let mut link = node(&log, "w-1", vec![Ok(11)], vec![Ok(EXPIRY)]);
    link.connect_takes = Duration::from_secs(3600);
    let mut journal = journal(&log);
    // One of cluster c's two worker places is taken.
    let held = executor
        .admission
        .try_enter("ns", "c", Role::Worker, &who("w-3"))
        .unwrap();
    let slow = go(&executor, "w-1", Role::Worker, &link, &mut journal);
    tokio::pin!(slow);
    tokio::select! {
        _ = &mut slow => panic!("reaching the node took its hour"),
        () = tokio::time::sleep(Duration::from_secs(1)) => {}
    }
    // The other place is kept for it a few seconds (INVITED_FOR), as for a woken waiter...
    assert!(
        !executor
            .admission
            .would_enter("ns", "c", Role::Worker, &who("w-2"))
    );
    tokio::select! {
        _ = &mut slow => panic!("reaching the node took its hour"),
        () = tokio::time::sleep(Duration::from_secs(9)) => {}
    }
    // ...not while it is slow to reach: half-way, another worker could go.
    assert!(
        executor
            .admission
            .would_enter("ns", "c", Role::Worker, &who("w-2"))
    );
    let started = tokio::time::Instant::now();
    let finished = slow.await;
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(10),
        "cut at 20 s in all"
    );
    let said = said(&finished);
    assert!(
        said.starts_with("wait: the workload cluster, which does not answer")
            && said.contains("took longer than 20s (--node-connect-timeout)"),
        "{said}"
    );
    // Nothing was sent to the node; the refresh is parked, not failed, and keeps no place.
    assert_eq!(entries(&log), Vec::<String>::new());
    drop(held);
    assert!(
        executor
            .admission
            .would_enter("ns", "c", Role::ControlPlane, &who("cp-0"))
    );
}
