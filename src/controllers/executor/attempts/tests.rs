//! The attempts against a scripted node, approver and journal: what is recorded before what is
//! sent, and when a new `plan` follows. Paused time: retries and waits cost nothing.

use std::collections::VecDeque;
use std::time::Duration;

use ck8s_certs_api::machine_certificates::Origin;

use super::*;
use crate::controllers::executor::scripted::foreign_san;
use crate::controllers::executor::scripted::{self, Approver, Log, api, entries, push, refused};
use crate::k8sd::K8sdError;
use crate::k8sd::wire::{PlanResponse, RunResponse};
use crate::testing::{assert_contains, assert_starts_with};

const EXPIRY: i64 = 1_900_000_000;

fn no_answer() -> K8sdError {
    scripted::no_answer("run")
}

/// A scripted node: each `plan` pops a seed (or an error), each `run` an expiry (or an error).
struct Node {
    plans: VecDeque<Result<i64, K8sdError>>,
    runs: VecDeque<Result<i64, K8sdError>>,
    /// How long `run` takes (a worker's waits for its CSRs to be approved).
    run_takes: Duration,
    /// The `expiration-seconds` of every `run` received.
    lifetimes: Vec<i64>,
    log: Log,
}

impl NodeApi for Node {
    async fn plan(&mut self) -> Result<PlanResponse, K8sdError> {
        let seed = scripted::next(&mut self.plans, "plan")?;
        push(&self.log, format!("plan {seed}"));
        Ok(PlanResponse {
            seed,
            certificate_signing_requests: None,
        })
    }

    async fn run(&mut self, request: &RunRequest) -> Result<RunResponse, K8sdError> {
        self.lifetimes.push(request.expiration_seconds);
        push(
            &self.log,
            format!("run {} sans={:?}", request.seed, request.extra_sans),
        );
        tokio::time::sleep(self.run_takes).await;
        let expiration_seconds = scripted::next(&mut self.runs, "run")?;
        Ok(RunResponse { expiration_seconds })
    }

    fn fingerprint(&self) -> Option<String> {
        Some("AB:CD".into())
    }
}

fn node(log: &Log, plans: Vec<Result<i64, K8sdError>>, runs: Vec<Result<i64, K8sdError>>) -> Node {
    Node {
        plans: plans.into(),
        runs: runs.into(),
        run_takes: Duration::ZERO,
        lifetimes: Vec::new(),
        log: log.clone(),
    }
}

/// Records into the log; fails to record when told; waits `waits` times, then gives up.
struct Journal {
    log: Log,
    refuse: bool,
    waits: u32,
    /// Ends the attempts for now at the first wait, as the executor does.
    later: Option<Duration>,
    stopping: bool,
    /// The term as leader: `Some(n)` ends it once `n` seeds are recorded.
    term_records: Option<usize>,
    fingerprints: Vec<Option<String>>,
}

fn journal(log: &Log) -> Journal {
    Journal {
        log: log.clone(),
        refuse: false,
        waits: 0,
        later: None,
        stopping: false,
        term_records: None,
        fingerprints: Vec::new(),
    }
}

impl super::Journal for Journal {
    async fn record(
        &mut self,
        op: &mut Operation,
        fingerprint: Option<String>,
    ) -> Result<(), Failure> {
        push(&self.log, scripted::recorded(op));
        self.fingerprints.push(fingerprint);
        if self.refuse {
            return Err(Failure::Superseded);
        }
        Ok(())
    }

    async fn unverified(&mut self, op: &Operation, mismatch: &Mismatch) {
        push(&self.log, scripted::unverified(op, mismatch));
    }

    async fn wait(&mut self, _: &mut Operation, failure: &Failure) -> Result<(), Failure> {
        push(&self.log, format!("wait ({})", failure.cause()));
        if let Some(later) = self.later {
            return Err(Failure::Wait(later));
        }
        if self.waits == 0 {
            return Err(Failure::Message("the node's k8sd did not answer".into()));
        }
        self.waits -= 1;
        tokio::time::sleep(Duration::from_secs(5)).await;
        Ok(())
    }

    fn stopping(&self) -> bool {
        self.stopping
    }

    fn leading(&self) -> bool {
        self.term_records
            .is_none_or(|records| self.fingerprints.len() < records)
    }

    fn now(&self) -> Timestamp {
        Timestamp::from_second(EXPIRY - 365 * 86_400).unwrap()
    }
}

fn pending(ttl_seconds: i64) -> Operation {
    Operation::pending(
        Origin::Manual,
        None,
        Some("1y".into()),
        "1y".into(),
        ttl_seconds,
        Time(Timestamp::from_second(EXPIRY - 365 * 86_400).unwrap()),
    )
}

async fn control_plane(
    node: &mut Node,
    op: &mut Operation,
    journal: &mut Journal,
) -> Result<(), Failure> {
    let no_approver: Option<&mut Approver> = None;
    let ttl = ttl(op);
    carry_out(
        node,
        no_approver,
        op,
        ttl,
        Some(vec!["cp.example".into()]),
        journal,
    )
    .await
}

/// A control plane's node answering as scripted, with its journal and a fresh one-year
/// operation: each may be changed before [`ControlPlane::attempt`].
struct ControlPlane {
    log: Log,
    node: Node,
    journal: Journal,
    op: Operation,
}

impl ControlPlane {
    fn new(plans: Vec<Result<i64, K8sdError>>, runs: Vec<Result<i64, K8sdError>>) -> Self {
        let log = Log::default();
        Self {
            node: node(&log, plans, runs),
            journal: journal(&log),
            op: pending(31_536_000),
            log,
        }
    }

    async fn attempt(&mut self) -> Result<(), Failure> {
        control_plane(&mut self.node, &mut self.op, &mut self.journal).await
    }

    fn entries(&self) -> Vec<String> {
        entries(&self.log)
    }
}

/// A worker whose `run` takes 3 s (it waits for its CSRs) beside a control plane answering
/// `approvals` (then approving).
async fn worker(
    log: &Log,
    plans: Vec<Result<i64, K8sdError>>,
    runs: Vec<Result<i64, K8sdError>>,
    approvals: Vec<Result<(), K8sdError>>,
    op: &mut Operation,
) -> Result<(), Failure> {
    worker_checked(log, plans, runs, Approver::new(approvals, log), op).await
}

/// A worker beside a control plane that approves as `approver` says (its CSR checks too).
async fn worker_checked(
    log: &Log,
    plans: Vec<Result<i64, K8sdError>>,
    runs: Vec<Result<i64, K8sdError>>,
    mut approver: Approver,
    op: &mut Operation,
) -> Result<(), Failure> {
    let mut worker = Node {
        run_takes: Duration::from_secs(3),
        ..node(log, plans, runs)
    };
    let mut journal = journal(log);
    let ttl = ttl(op);
    carry_out(
        &mut worker,
        Some(&mut approver),
        op,
        ttl,
        None,
        &mut journal,
    )
    .await
}

/// The lifetime the executor gives the attempts.
fn ttl(op: &Operation) -> Ttl {
    crate::controllers::executor::ttl_of(op).unwrap()
}

fn error_text(result: Result<(), Failure>) -> String {
    match result {
        Ok(()) => "succeeded".into(),
        Err(Failure::Stopping) => "stopping".into(),
        Err(Failure::Superseded) => "superseded".into(),
        Err(failure) => failure.cause(),
    }
}

#[tokio::test(start_paused = true)]
async fn the_seed_is_recorded_before_run_and_the_answer_is_the_new_expiry() {
    let mut cp = ControlPlane::new(vec![Ok(42)], vec![Ok(EXPIRY)]);
    cp.attempt().await.ok();
    let ControlPlane { journal, op, .. } = &cp;

    assert_eq!(
        cp.entries(),
        [
            "plan 42",
            "record seed=42 attempts=1",
            r#"run 42 sans=Some(["cp.example"])"#
        ]
    );
    assert_eq!(journal.fingerprints, [Some("AB:CD".to_owned())]);
    assert_eq!(op.phase, Phase::Succeeded);
    assert_eq!(op.seed, Some(42));
    assert_eq!(op.run_attempts, 1);
    assert_eq!(
        op.new_expiry,
        Some(Time(Timestamp::from_second(EXPIRY).unwrap()))
    );
    assert_eq!(op.note, None);
}

#[tokio::test(start_paused = true)]
async fn a_run_without_an_answer_is_followed_by_a_new_plan_never_the_same_seed() {
    let mut cp = ControlPlane::new(vec![Ok(1), Ok(2)], vec![Err(no_answer()), Ok(EXPIRY)]);
    assert_eq!(error_text(cp.attempt().await), "succeeded");
    assert_eq!(
        cp.entries(),
        [
            "plan 1",
            "record seed=1 attempts=1",
            r#"run 1 sans=Some(["cp.example"])"#,
            "plan 2",
            "record seed=2 attempts=2",
            r#"run 2 sans=Some(["cp.example"])"#
        ]
    );
    assert_eq!((cp.op.seed, cp.op.run_attempts), (Some(2), 2));
}

#[tokio::test(start_paused = true)]
async fn run_is_sent_at_most_three_times_per_operation() {
    let mut cp = ControlPlane::new(
        vec![Ok(1), Ok(2), Ok(3), Ok(4)],
        vec![Err(no_answer()), Err(no_answer()), Err(no_answer())],
    );
    assert_eq!(
        error_text(cp.attempt().await),
        "run was sent 3 times without an answer (last seed 3); the node may hold new certificates that it does not serve yet"
    );
    let runs = cp
        .entries()
        .into_iter()
        .filter(|e| e.starts_with("run "))
        .count();
    assert_eq!(runs, MAX_RUN_SENDS as usize);
}

#[tokio::test(start_paused = true)]
async fn a_resumed_operation_counts_the_runs_sent_before_the_restart() {
    // Two runs were sent before a crash; the last one's outcome is unknown.
    let mut cp = ControlPlane::new(vec![Ok(8)], vec![Err(no_answer())]);
    cp.op.seed = Some(7);
    cp.op.phase = Phase::Running;
    cp.op.run_attempts = 2;
    let result = cp.attempt().await;

    assert_eq!(
        cp.entries(),
        [
            "plan 8",
            "record seed=8 attempts=3",
            r#"run 8 sans=Some(["cp.example"])"#
        ]
    );
    assert!(error_text(result).starts_with("run was sent 3 times"));
}

#[tokio::test(start_paused = true)]
async fn nothing_reaches_the_node_when_the_seed_cannot_be_recorded() {
    let mut cp = ControlPlane::new(vec![Ok(42)], vec![Ok(EXPIRY)]);
    cp.journal.refuse = true;
    assert_eq!(error_text(cp.attempt().await), "superseded");
    assert_eq!(cp.entries(), ["plan 42", "record seed=42 attempts=1"]);
}

#[tokio::test(start_paused = true)]
async fn a_stopping_process_sends_nothing_new_but_finishes_what_it_started() {
    let mut cp = ControlPlane::new(vec![Ok(42)], vec![Ok(EXPIRY)]);
    cp.journal.stopping = true;
    assert_eq!(error_text(cp.attempt().await), "stopping");
    assert_eq!(cp.entries(), ["plan 42"]);

    // A seed recorded already: the node may hold it, so the operation is carried on.
    let mut again = ControlPlane::new(vec![Ok(43)], vec![Ok(EXPIRY)]);
    again.journal.stopping = true;
    again.op = Operation {
        seed: Some(42),
        phase: Phase::Running,
        run_attempts: 1,
        ..cp.op
    };
    assert_eq!(error_text(again.attempt().await), "succeeded");
    assert_eq!(again.op.seed, Some(43));
}

#[tokio::test(start_paused = true)]
async fn a_replica_whose_term_ended_sends_nothing_more() {
    // Over before the first seed: nothing recorded, nothing run.
    let mut cp = ControlPlane::new(vec![Ok(42)], vec![Ok(EXPIRY)]);
    cp.journal.term_records = Some(0);
    assert_eq!(error_text(cp.attempt().await), "stopping");
    assert_eq!(cp.entries(), ["plan 42"]);

    // Over while the seed was recorded (a pause, a suspend): its run is never sent.
    let mut cp = ControlPlane::new(vec![Ok(43)], vec![Ok(EXPIRY)]);
    cp.journal.term_records = Some(1);
    assert_eq!(error_text(cp.attempt().await), "stopping");
    assert_eq!(cp.entries(), ["plan 43", "record seed=43 attempts=1"]);
    assert_eq!((cp.op.seed, cp.op.run_attempts), (Some(43), 1));
}

#[tokio::test(start_paused = true)]
async fn a_k8sd_that_does_not_answer_plan_is_waited_for_then_given_up_on() {
    // Each plan is one call, waited for after it fails.
    let mut cp = ControlPlane::new(
        vec![Err(refused()), Err(refused()), Ok(42)],
        vec![Ok(EXPIRY)],
    );
    cp.journal.waits = 2;
    assert_eq!(error_text(cp.attempt().await), "succeeded");
    let log_entries = cp.entries();
    assert!(
        log_entries[0].starts_with("wait (plan: opening a connection"),
        "{log_entries:?}"
    );
    assert!(log_entries[1].starts_with("wait (plan:"), "{log_entries:?}");
    assert_eq!(log_entries[2], "plan 42");

    let mut cp = ControlPlane::new(vec![Err(refused()), Err(refused())], vec![]);
    assert_eq!(
        error_text(cp.attempt().await),
        "the node's k8sd did not answer"
    );
    assert!(!cp.entries().iter().any(|e| e.starts_with("record")));
}

#[tokio::test(start_paused = true)]
async fn an_answered_error_fails_at_once() {
    for (plans, runs, failed_at) in [
        (vec![Err(api(401, "invalid token"))], vec![], "plan"),
        (vec![Ok(42)], vec![Err(api(500, "failed to sign"))], "run"),
        (vec![Ok(42)], vec![Ok(0)], "run"),
    ] {
        let mut cp = ControlPlane::new(plans, runs);
        let text = error_text(cp.attempt().await);
        assert!(text.starts_with(&format!("{failed_at}: ")), "{text}");
        let plans_sent = cp
            .entries()
            .iter()
            .filter(|e| e.starts_with("plan"))
            .count();
        assert!(
            plans_sent <= 1,
            "no new plan after an answer: {:?}",
            cp.entries()
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_worker_runs_while_a_control_plane_approves_and_an_approve_error_is_noted() {
    let log = Log::default();
    let mut op = pending(31_536_000);
    // It never approves: the CSRs are approved by k8sd's auto-approver meanwhile.
    let approvals = (0..10).map(|_| Err(api(500, "no CSRs yet"))).collect();
    let result = worker(&log, vec![Ok(9)], vec![Ok(EXPIRY)], approvals, &mut op).await;
    assert_eq!(error_text(result), "succeeded");
    let log_entries = entries(&log);
    assert_eq!(&log_entries[..2], ["plan 9", "record seed=9 attempts=1"]);
    // Both at once; approve again after each error while run is pending.
    let concurrent = &log_entries[2..];
    assert_eq!(
        concurrent
            .iter()
            .filter(|e| *e == "run 9 sans=None")
            .count(),
        1
    );
    assert!(
        concurrent.iter().filter(|e| *e == "approve 9").count() >= 2,
        "{log_entries:?}"
    );
    assert_eq!(
        op.note.as_deref(),
        Some(
            "approve answered an error that did not stop the refresh: k8sd answered x with HTTP 500: no CSRs yet"
        )
    );
}

#[tokio::test(start_paused = true)]
async fn a_worker_whose_csrs_nobody_approves_fails_with_the_cause_and_no_new_plan() {
    let log = Log::default();
    let mut op = pending(31_536_000);
    let approvals = vec![Err(api(401, "invalid token"))];
    let result = worker(
        &log,
        vec![Ok(9), Ok(10)],
        vec![Err(no_answer())],
        approvals,
        &mut op,
    )
    .await;
    assert_starts_with(
        &error_text(result),
        "Approving the worker's CSRs failed (k8sd answered x with HTTP 401: invalid token), and run then failed",
    );
    assert_eq!(
        entries(&log)
            .iter()
            .filter(|e| e.starts_with("plan"))
            .count(),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn csrs_that_do_not_pass_are_denied_never_approved_and_a_new_plan_follows() {
    let log = Log::default();
    let mut op = pending(31_536_000);
    let mut approver = Approver::new(Vec::new(), &log);
    // Seed 9's serving CSR was made by someone else; seed 10's are the node's.
    approver.checks = VecDeque::from([Some(foreign_san(9))]);
    let denied = || Err(api(500, "CSR k8sd-9-worker-kubelet-serving was denied"));
    let result = worker_checked(
        &log,
        vec![Ok(9), Ok(10)],
        vec![denied(), Ok(EXPIRY)],
        approver,
        &mut op,
    )
    .await;
    assert_eq!(error_text(result), "succeeded");
    // The check and run start together (in either order); nothing is approved for seed 9.
    let mut log = entries(&log);
    log[2..4].sort();
    log[7..9].sort();
    assert_eq!(
        log,
        [
            "plan 9",
            "record seed=9 attempts=1",
            "deny 9 (subject alternative names)",
            "run 9 sans=None",
            "unverified seed=9 attempts=1 (subject alternative names)",
            "plan 10",
            "record seed=10 attempts=2",
            "approve 10",
            "run 10 sans=None",
        ]
    );
    assert_eq!(op.seed, Some(10));
}

#[tokio::test(start_paused = true)]
async fn csrs_that_never_pass_fail_the_refresh_as_unverified_after_the_last_run() {
    let log = Log::default();
    let mut op = pending(31_536_000);
    let mut approver = Approver::new(Vec::new(), &log);
    approver.checks = (1..=3).map(|seed| Some(foreign_san(seed))).collect();
    let denied = || Err(api(500, "a CSR was denied"));
    let result = worker_checked(
        &log,
        vec![Ok(1), Ok(2), Ok(3), Ok(4)],
        vec![denied(), denied(), denied()],
        approver,
        &mut op,
    )
    .await;
    assert_starts_with(
        &error_text(result),
        "UnverifiedCSR: CSR k8sd-3-worker-kubelet-serving: subject alternative names is DNS:kubernetes.default.svc",
    );
    let log = entries(&log);
    assert!(!log.iter().any(|e| e.starts_with("approve")), "{log:?}");
    assert_eq!(log.iter().filter(|e| e.starts_with("plan")).count(), 3);
    assert_eq!(log.iter().filter(|e| e.starts_with("deny")).count(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_lifetime_answered_in_seconds_or_far_from_the_ttl_is_noted() {
    // An older k8sd answers the lifetime, not the expiry.
    let mut cp = ControlPlane::new(vec![Ok(1)], vec![Ok(31_536_000)]);
    cp.attempt().await.ok();
    assert_eq!(
        cp.op.new_expiry,
        Some(Time(Timestamp::from_second(EXPIRY).unwrap()))
    );
    assert_starts_with(
        cp.op.note.as_deref().unwrap_or_default(),
        "k8sd answered the certificate lifetime",
    );

    // Ten years for a one-year request (published k8sd's worker certificates).
    let mut cp = ControlPlane::new(vec![Ok(1)], vec![Ok(EXPIRY + 9 * 365 * 86_400)]);
    cp.attempt().await.ok();
    assert_contains(
        cp.op.note.as_deref().unwrap_or_default(),
        "although 365 days were requested",
    );
}

#[tokio::test(start_paused = true)]
async fn run_asks_for_the_operation_s_lifetime_also_when_the_journal_has_no_seconds() {
    let log = Log::default();
    let mut node = node(&log, vec![Ok(1)], vec![Ok(EXPIRY)]);
    let mut op = pending(31_536_000);
    control_plane(&mut node, &mut op, &mut journal(&log))
        .await
        .ok();
    assert_eq!(node.lifetimes, [31_536_000]);

    // Journaled without seconds: the TTL as written ("1y"), never 0.
    let mut node = self::node(&log, vec![Ok(2)], vec![Ok(EXPIRY)]);
    let mut op = Operation {
        ttl_seconds: None,
        ..pending(1)
    };
    control_plane(&mut node, &mut op, &mut journal(&log))
        .await
        .ok();
    assert_eq!(node.lifetimes, [31_536_000]);
}

#[tokio::test(start_paused = true)]
async fn a_plan_that_times_out_is_waited_for_not_failed_at_once() {
    let mut cp = ControlPlane::new(vec![Err(no_answer()), Ok(5)], vec![Ok(EXPIRY)]);
    cp.journal.waits = 1;
    assert_eq!(error_text(cp.attempt().await), "succeeded");
    let log_entries = cp.entries();
    assert!(log_entries[0].starts_with("wait (plan:"), "{log_entries:?}");
    assert_eq!(log_entries[1], "plan 5");
}

#[tokio::test(start_paused = true)]
async fn a_wait_for_later_ends_the_attempts_with_nothing_sent() {
    let mut cp = ControlPlane::new(vec![Err(refused()), Ok(5)], vec![Ok(EXPIRY)]);
    cp.journal.later = Some(Duration::from_secs(2));
    let result = cp.attempt().await;
    assert!(matches!(result, Err(Failure::Wait(d)) if d == Duration::from_secs(2)));
    assert_eq!(cp.entries().len(), 1, "{:?}", cp.entries());
    assert_eq!((cp.op.seed, cp.op.run_attempts), (None, 0));
}

/// A worker whose own client (kubelet.conf) the API server refuses cannot make its CSRs: the
/// refresh ends at its first `run`, with no new plan (none would help).
#[tokio::test(start_paused = true)]
async fn a_worker_whose_client_is_refused_is_not_planned_again() {
    let log = Log::default();
    let mut op = pending(31_536_000);
    let approver = Approver::new(Vec::new(), &log);
    let refused = Err(api(
        500,
        "failed to get worker node certificates: failed to create CSR for k8sd-4-worker-kubelet-serving: Unauthorized",
    ));
    let result = worker_checked(&log, vec![Ok(4), Ok(5)], vec![refused], approver, &mut op).await;
    assert!(
        matches!(result, Err(Failure::InPlaceImpossible(_))),
        "{}",
        error_text(result)
    );
    let plans = entries(&log)
        .iter()
        .filter(|e| e.starts_with("plan"))
        .count();
    assert_eq!(plans, 1);
}
