//! Sequencing, bounded retries and result interpretation of a refresh (no persistence, no
//! Kubernetes objects).

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use super::csr::Mismatch;
use super::{ApproveApi, NodeApi, Verification};
use crate::k8sd::K8sdError;
use crate::k8sd::wire::{PlanResponse, RunRequest, RunResponse};
use crate::policy::{Backoff, PolicyDuration};

/// How often and how patiently transient failures are retried inside one operation. The delays
/// follow the renewal policy's backoff formula (`min · 2^(n−1)`, capped), on a seconds scale.
#[derive(Clone, Debug)]
pub struct Retry {
    /// Attempts per call, the first included.
    pub attempts: u32,
    /// Delay before the second attempt (1 s), doubling up to 8 s.
    pub backoff: Backoff,
}

impl Default for Retry {
    /// 5 attempts over ~15 s: long enough for a k8sd that is restarting, short enough that a
    /// broken node is reported within a minute.
    fn default() -> Self {
        let (min, max) = (
            PolicyDuration::from_secs_const(1),
            PolicyDuration::from_secs_const(8),
        );
        Self {
            attempts: 5,
            backoff: Backoff::new(min, max).unwrap_or_default(),
        }
    }
}

impl Retry {
    /// Delay before attempt `n + 1` (n ≥ 1).
    pub fn delay(&self, n: u32) -> Duration {
        Duration::try_from(self.backoff.delay(Some(i64::from(n)))).unwrap_or_default()
    }
}

/// Whether a failed attempt `attempt` (1-based) is worth another try; if so, waits first.
async fn again(retry: &Retry, attempt: &mut u32, err: &K8sdError) -> bool {
    if !err.is_retryable() || *attempt >= retry.attempts {
        return false;
    }
    tracing::debug!(error = %err, attempt = *attempt, "Retrying k8sd call");
    tokio::time::sleep(retry.delay(*attempt)).await;
    *attempt += 1;
    true
}

/// `plan`, retried. The seed must be a JSON integer (k8sd's is up to 2^63−1).
pub async fn plan<N: NodeApi>(node: &mut N, retry: &Retry) -> Result<PlanResponse, K8sdError> {
    let mut attempt = 1;
    loop {
        match node.plan().await {
            Err(err) if again(retry, &mut attempt, &err).await => continue,
            result => return result,
        }
    }
}

/// What `run` told us.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOutcome {
    /// The new certificates' NotAfter.
    pub not_after: Timestamp,
    /// Set when the answer was a lifetime in seconds (older k8sd), not a Unix time.
    pub answered_duration: bool,
}

/// Values below this cannot be a Unix time of a freshly issued certificate (2001-09-09): older
/// k8sd versions answered the certificate lifetime in seconds instead.
const PLAUSIBLE_UNIX_TIME: i64 = 1_000_000_000;

/// Interprets `run`'s `expiration-seconds`, answered at `answered_at`.
pub fn interpret_run(
    response: &RunResponse,
    answered_at: Timestamp,
) -> Result<RunOutcome, K8sdError> {
    let value = response.expiration_seconds;
    let invalid = |reason: String| K8sdError::InvalidResponse {
        endpoint: "run".to_owned(),
        reason,
    };
    if value <= 0 {
        return Err(invalid(format!(
            "expiration-seconds is {value}, not a time"
        )));
    }
    if value < PLAUSIBLE_UNIX_TIME {
        let not_after = answered_at
            .checked_add(SignedDuration::from_secs(value))
            .map_err(|e| invalid(format!("expiration-seconds {value}: {e}")))?;
        return Ok(RunOutcome {
            not_after,
            answered_duration: true,
        });
    }
    let not_after = Timestamp::from_second(value)
        .map_err(|e| invalid(format!("expiration-seconds {value}: {e}")))?;
    Ok(RunOutcome {
        not_after,
        answered_duration: false,
    })
}

/// A note when the node's lifetime differs materially (more than a day and 10%) from the
/// request: published k8sd signs worker certificates for ten years whatever was asked.
pub fn lifetime_mismatch(
    requested: Duration,
    started: Timestamp,
    not_after: Timestamp,
) -> Option<String> {
    let got = not_after.duration_since(started);
    let asked = SignedDuration::try_from(requested).ok()?;
    let diff = (got - asked).abs();
    let tolerance = SignedDuration::from_hours(24).max(asked / 10);
    (diff > tolerance).then(|| {
        format!(
            "The node issued certificates valid until {not_after} (about {} days) although {} days were requested",
            got.as_secs() / 86_400,
            asked.as_secs() / 86_400
        )
    })
}

/// Whether a worker's `run` failed because the API server refused the node's own client (its
/// `kubelet.conf`) when it created its CSRs: that certificate has expired (or was revoked by
/// replacing the CA), and the node cannot be refreshed in place; no new plan would help.
/// Released k8sd answers 500 `failed to get worker node certificates: failed to create CSR for
/// k8sd-<seed>-worker-…: Unauthorized`.
pub fn client_refused(err: &K8sdError) -> bool {
    matches!(err, K8sdError::Api { status: 500, message, .. }
        if message.contains("failed to create CSR for") && message.trim_end().ends_with("Unauthorized"))
}

/// Whether a failed `run` leaves its outcome unknown (no answer: timeout, broken connection, a
/// node or tunnel going away, a gateway error). Released k8sd writes the certificates before it
/// answers and restarts its services only once the answer is delivered, so after a lost answer
/// the node may hold certificates it does not serve: the refresh is done again with a **new**
/// `plan` (a worker `run` cannot be repeated with a seed: its CSRs exist already). Any other
/// error is k8sd's answer: the refresh failed.
pub fn outcome_unknown(err: &K8sdError) -> bool {
    err.is_retryable()
}

/// What a worker refresh got: `run`'s answer is the outcome; approve errors are only remembered.
#[derive(Debug)]
pub struct WorkerRun {
    pub run: Result<RunResponse, K8sdError>,
    /// The last error `approve` answered, if it never succeeded. It does not fail the refresh:
    /// an approve can fail while `run` succeeds (CSRs approved by k8sd's auto-approver or by an
    /// earlier approve).
    pub approve_error: Option<K8sdError>,
    /// Whether approving was given up on (an error no retry can fix, like a bad token).
    pub approve_abandoned: bool,
    /// A CSR of the seed that did not pass verification: nothing was approved, the seed's
    /// undecided CSRs were denied, and `run` was waited for (it fails on a denied CSR, or failed
    /// already on a CSR name someone else had taken).
    pub unverified: Option<Mismatch>,
}

/// First delay between approve attempts while `run` is pending; it doubles up to
/// [`APPROVE_MAX_INTERVAL`]. A pre-release k8sd answered 500 until `run` had created the CSRs.
const APPROVE_INTERVAL: Duration = Duration::from_millis(500);
const APPROVE_MAX_INTERVAL: Duration = Duration::from_secs(5);

/// Approve errors that no retry fixes: the request or its credentials are wrong.
fn approve_hopeless(err: &K8sdError) -> bool {
    matches!(
        err,
        K8sdError::Api {
            status: 400 | 401 | 403 | 404 | 501,
            ..
        } | K8sdError::PinMismatch { .. }
            | K8sdError::Tls { .. }
    )
}

/// One try at approving: the seed's CSRs are read and checked before every `approve` (k8sd
/// approves whatever carries their names at that moment).
enum Step {
    Pending(String),
    Unverified(Mismatch),
    Approved(Result<(), K8sdError>),
}

async fn approve_step<A: ApproveApi>(approver: &mut A, seed: i64, lifetime: i64) -> Step {
    match approver.verify(seed, lifetime).await {
        Verification::Verified => Step::Approved(approver.approve(seed).await),
        Verification::Pending(why) => Step::Pending(why),
        Verification::Unverified(mismatch) => Step::Unverified(mismatch),
    }
}

/// `run` on a worker concurrently with `approve` on a control plane (run blocks until its CSRs
/// are approved and signed, so run-then-approve would deadlock). `run` is sent once: its answer
/// is the outcome. Before each `approve` the seed's CSRs are read and verified; while they are
/// not all there, or `approve` fails in a way a retry may fix, it is tried again with a growing
/// interval while `run` is pending. An approve error never fails the refresh; a CSR that does
/// not pass stops approving for good, and its seed's CSRs are denied.
pub async fn run_worker<N, A>(worker: &mut N, approver: &mut A, request: &RunRequest) -> WorkerRun
where
    N: NodeApi,
    A: ApproveApi,
{
    let (seed, lifetime) = (request.seed, request.expiration_seconds);
    let mut last_error = None;
    let mut abandoned = false;
    let run = worker.run(request);
    tokio::pin!(run);
    let mut interval = APPROVE_INTERVAL;
    let unverified = |run, mismatch| WorkerRun {
        run,
        approve_error: None,
        approve_abandoned: false,
        unverified: Some(mismatch),
    };
    loop {
        tokio::select! {
            result = &mut run => {
                if result.is_err()
                    && !abandoned
                    && let Verification::Unverified(mismatch) = approver.verify(seed, lifetime).await
                {
                    // Someone else's CSR under the seed's name makes `run` fail ("already
                    // exists") before a check saw it: say so, not just that run failed.
                    approver.deny(seed, &mismatch).await;
                    return unverified(result, mismatch);
                }
                return WorkerRun { run: result, approve_error: last_error, approve_abandoned: abandoned, unverified: None };
            }
            step = approve_step(approver, seed, lifetime), if !abandoned => {
                match step {
                    Step::Unverified(mismatch) => {
                        tracing::warn!(%mismatch, seed, "A CSR of the worker's refresh did not pass verification: nothing is approved");
                        approver.deny(seed, &mismatch).await;
                        return unverified(run.await, mismatch);
                    }
                    Step::Approved(Ok(())) => {
                        return WorkerRun { run: run.await, approve_error: None, approve_abandoned: false, unverified: None };
                    }
                    Step::Approved(Err(err)) => {
                        tracing::debug!(error = %err, seed, "Approve failed; retrying while run is pending");
                        abandoned = approve_hopeless(&err);
                        last_error = Some(err);
                    }
                    Step::Pending(why) => {
                        tracing::debug!(seed, why, "The worker's CSRs are not all there yet");
                    }
                }
                if !abandoned {
                    tokio::select! {
                        result = &mut run => {
                            return WorkerRun { run: result, approve_error: last_error, approve_abandoned: false, unverified: None };
                        }
                        () = tokio::time::sleep(interval) => {}
                    }
                    interval = (interval * 2).min(APPROVE_MAX_INTERVAL);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use super::*;

    fn api(status: u16, message: &str) -> K8sdError {
        K8sdError::Api {
            endpoint: "x".into(),
            status,
            message: message.into(),
        }
    }

    /// Three attempts; the tests run on paused time, so the backoff's seconds cost nothing.
    fn fast() -> Retry {
        Retry {
            attempts: 3,
            ..Retry::default()
        }
    }

    /// A scripted node: each call pops the next answer.
    #[derive(Default)]
    struct FakeNode {
        plans: VecDeque<Result<PlanResponse, K8sdError>>,
        runs: VecDeque<Result<RunResponse, K8sdError>>,
        run_calls: Arc<Mutex<Vec<i64>>>,
        run_delay: Duration,
    }

    impl NodeApi for FakeNode {
        async fn plan(&mut self) -> Result<PlanResponse, K8sdError> {
            self.plans
                .pop_front()
                .unwrap_or_else(|| Err(api(500, "unscripted plan")))
        }
        async fn run(&mut self, request: &RunRequest) -> Result<RunResponse, K8sdError> {
            self.run_calls.lock().unwrap().push(request.seed);
            tokio::time::sleep(self.run_delay).await;
            self.runs
                .pop_front()
                .unwrap_or_else(|| Err(api(500, "unscripted run")))
        }
    }

    /// Approves as scripted; its CSRs are verified once `pending` checks have found them
    /// missing, unless `mismatch` says they do not pass.
    #[derive(Default)]
    struct FakeApprover {
        answers: VecDeque<Result<(), K8sdError>>,
        calls: usize,
        pending: usize,
        mismatch: Option<Mismatch>,
        verified: usize,
        denied: Vec<i64>,
    }

    impl ApproveApi for FakeApprover {
        async fn approve(&mut self, _seed: i64) -> Result<(), K8sdError> {
            self.calls += 1;
            self.answers.pop_front().unwrap_or(Ok(()))
        }

        async fn verify(&mut self, _seed: i64, lifetime: i64) -> Verification {
            assert_eq!(lifetime, 3600, "checked against the lifetime run asked for");
            self.verified += 1;
            if let Some(mismatch) = &self.mismatch {
                return Verification::Unverified(mismatch.clone());
            }
            if self.pending > 0 {
                self.pending -= 1;
                return Verification::Pending("not created yet".into());
            }
            Verification::Verified
        }

        async fn deny(&mut self, seed: i64, _why: &Mismatch) {
            self.denied.push(seed);
        }
    }

    fn foreign_san() -> Mismatch {
        Mismatch {
            csr: "k8sd-1-worker-kubelet-serving".into(),
            field: "subject alternative names",
            found: "DNS:kubernetes.default.svc".into(),
            wanted: "only the worker's own names and addresses (w0)".into(),
        }
    }

    fn request(seed: i64) -> RunRequest {
        RunRequest {
            certificates: None,
            seed,
            expiration_seconds: 3600,
            extra_sans: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn plan_retries_a_starting_node_then_succeeds() {
        let mut node = FakeNode::default();
        node.plans
            .push_back(Err(api(503, "Database is not yet initialized")));
        node.plans.push_back(Ok(PlanResponse {
            seed: 7,
            certificate_signing_requests: None,
        }));
        assert_eq!(plan(&mut node, &fast()).await.unwrap().seed, 7);
    }

    #[tokio::test(start_paused = true)]
    async fn permanent_errors_are_not_retried_and_retries_are_bounded() {
        let mut node = FakeNode::default();
        node.plans.push_back(Err(api(401, "invalid token")));
        node.plans.push_back(Ok(PlanResponse {
            seed: 7,
            certificate_signing_requests: None,
        }));
        assert!(matches!(
            plan(&mut node, &fast()).await,
            Err(K8sdError::Api { status: 401, .. })
        ));

        let mut node = FakeNode::default();
        for _ in 0..5 {
            node.plans
                .push_back(Err(api(503, "Database is not yet initialized")));
        }
        assert!(plan(&mut node, &fast()).await.is_err());
        assert_eq!(node.plans.len(), 2, "exactly `attempts` calls");
    }

    fn worker(run_delay: Duration) -> FakeNode {
        let mut worker = FakeNode {
            run_delay,
            ..FakeNode::default()
        };
        worker.runs.push_back(Ok(RunResponse {
            expiration_seconds: 2_000_000_000,
        }));
        worker
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_run_waits_for_an_approve_that_loses_the_race_on_older_k8sd() {
        let mut worker = worker(APPROVE_INTERVAL + Duration::from_millis(300));
        let mut approver = FakeApprover {
            answers: VecDeque::from([Err(api(
                500,
                "failed to approve worker node CSR: failed to get CSR k8sd-1-worker-kubelet-serving: not found",
            ))]),
            ..FakeApprover::default()
        };
        let outcome = run_worker(&mut worker, &mut approver, &request(1)).await;
        assert_eq!(outcome.run.unwrap().expiration_seconds, 2_000_000_000);
        assert!(
            outcome.approve_error.is_none(),
            "the second approve succeeded"
        );
        assert_eq!(approver.calls, 2);
        assert_eq!(*worker.run_calls.lock().unwrap(), [1], "run is sent once");
    }

    #[tokio::test(start_paused = true)]
    async fn an_approve_failing_on_already_approved_csrs_does_not_fail_the_run() {
        // k8sd's auto-approver approved the CSRs: every approve answers 500, run succeeds.
        let mut worker = worker(Duration::from_secs(20));
        let already = || {
            Err(api(
                500,
                "failed to approve worker node CSR: CertificateSigningRequest.certificates.k8s.io \"k8sd-1-worker-kubelet-serving\" is invalid: status.conditions[1].type: Duplicate value: \"Approved\"",
            ))
        };
        let mut approver = FakeApprover {
            answers: (0..100).map(|_| already()).collect(),
            ..FakeApprover::default()
        };
        let outcome = run_worker(&mut worker, &mut approver, &request(1)).await;
        assert_eq!(outcome.run.unwrap().expiration_seconds, 2_000_000_000);
        assert!(outcome.approve_error.is_some());
        assert!(!outcome.approve_abandoned);
        // Retried with a growing interval (0.5, 1, 2, 4, 5, 5, … s) over 20 s, not hammered.
        assert!((5..=10).contains(&approver.calls), "{}", approver.calls);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hopeless_approve_is_given_up_but_run_still_decides() {
        let mut worker = worker(Duration::from_secs(30));
        let mut approver = FakeApprover {
            answers: VecDeque::from([Err(api(401, "invalid token"))]),
            ..FakeApprover::default()
        };
        let outcome = run_worker(&mut worker, &mut approver, &request(1)).await;
        assert!(outcome.run.is_ok());
        assert!(outcome.approve_abandoned);
        assert_eq!(approver.calls, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn approve_waits_until_the_seeds_csrs_exist_and_pass() {
        let mut worker = worker(Duration::from_secs(10));
        let mut approver = FakeApprover {
            pending: 2,
            ..FakeApprover::default()
        };
        let outcome = run_worker(&mut worker, &mut approver, &request(1)).await;
        assert!(outcome.run.is_ok());
        assert!(outcome.unverified.is_none());
        assert_eq!((approver.verified, approver.calls), (3, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_csr_that_does_not_pass_is_never_approved_and_its_seed_is_denied() {
        let mut worker = FakeNode {
            run_delay: Duration::from_secs(3),
            ..FakeNode::default()
        };
        worker.runs.push_back(Err(api(
            500,
            "CSR k8sd-1-worker-kubelet-serving was denied",
        )));
        let mut approver = FakeApprover {
            mismatch: Some(foreign_san()),
            ..FakeApprover::default()
        };
        let outcome = run_worker(&mut worker, &mut approver, &request(1)).await;
        assert_eq!(outcome.unverified, Some(foreign_san()));
        assert!(outcome.run.is_err(), "run was waited for");
        assert_eq!(approver.calls, 0, "no approve sent");
        assert_eq!(approver.denied, [1]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_failing_on_a_taken_csr_name_reports_the_csr_that_took_it() {
        // The name was taken before run could create its CSR: run fails at once, and the look
        // after it names the CSR that took the name.
        let mut worker = FakeNode::default();
        worker.runs.push_back(Err(api(500, "already exists")));
        let mut approver = FakeApprover {
            mismatch: Some(foreign_san()),
            ..FakeApprover::default()
        };
        let outcome = run_worker(&mut worker, &mut approver, &request(1)).await;
        assert_eq!(outcome.unverified, Some(foreign_san()));
        assert_eq!(approver.calls, 0);
        assert_eq!(approver.denied, [1]);
    }

    #[test]
    fn a_run_whose_csrs_the_api_server_refused_to_the_node_is_told_apart() {
        let refused = api(
            500,
            "failed to get worker node certificates: failed to create CSR for k8sd-7-worker-kubelet-serving: Unauthorized",
        );
        assert!(client_refused(&refused));
        for other in [
            api(
                500,
                "failed to get worker node certificates: failed to create CSR for k8sd-7-worker-kubelet-serving: certificatesigningrequests.certificates.k8s.io \"k8sd-7-worker-kubelet-serving\" already exists",
            ),
            api(401, "Unauthorized"),
            api(
                500,
                "failed to get worker node certificates: CSR k8sd-7-worker-kubelet-serving was denied",
            ),
        ] {
            assert!(!client_refused(&other), "{other}");
        }
    }

    #[test]
    fn only_answers_without_an_outcome_are_unknown() {
        assert!(outcome_unknown(&K8sdError::Timeout {
            node: "n".into(),
            endpoint: "run".into(),
            timeout: Duration::from_secs(1)
        }));
        assert!(outcome_unknown(&api(
            503,
            "Database is not yet initialized"
        )));
        for status in [400, 401, 500] {
            assert!(!outcome_unknown(&api(status, "x")), "{status}");
        }
    }

    #[test]
    fn run_answers_are_unix_times_or_legacy_lifetimes() {
        let at = Timestamp::from_second(1_800_000_000).unwrap();
        let unix = interpret_run(
            &RunResponse {
                expiration_seconds: 1_900_000_000,
            },
            at,
        )
        .unwrap();
        assert_eq!(
            unix,
            RunOutcome {
                not_after: Timestamp::from_second(1_900_000_000).unwrap(),
                answered_duration: false
            }
        );
        let legacy = interpret_run(
            &RunResponse {
                expiration_seconds: 86_400,
            },
            at,
        )
        .unwrap();
        assert_eq!(
            legacy,
            RunOutcome {
                not_after: Timestamp::from_second(1_800_086_400).unwrap(),
                answered_duration: true
            }
        );
        assert!(
            interpret_run(
                &RunResponse {
                    expiration_seconds: 0
                },
                at
            )
            .is_err()
        );
        assert!(
            interpret_run(
                &RunResponse {
                    expiration_seconds: -5
                },
                at
            )
            .is_err()
        );
        assert!(
            interpret_run(
                &RunResponse {
                    expiration_seconds: i64::MAX
                },
                at
            )
            .is_err()
        );
    }

    #[test]
    fn a_ten_year_certificate_for_a_90_day_request_is_reported() {
        let start = Timestamp::from_second(1_800_000_000).unwrap();
        let day = Duration::from_secs(86_400);
        let ten_years = start + SignedDuration::from_hours(24 * 3650);
        let note = lifetime_mismatch(day * 90, start, ten_years).unwrap();
        assert!(
            note.contains("3650 days") && note.contains("90 days"),
            "{note}"
        );
        assert_eq!(
            lifetime_mismatch(
                day * 365,
                start,
                start + SignedDuration::from_hours(24 * 365)
            ),
            None
        );
        // Calendar conversion (k8sd adds 1 year = 365 or 366 days) is within tolerance.
        assert_eq!(
            lifetime_mismatch(
                day * 365,
                start,
                start + SignedDuration::from_hours(24 * 366)
            ),
            None
        );
    }

    #[test]
    fn retry_delays_double_up_to_the_cap() {
        let retry = Retry::default();
        let delays: Vec<u64> = (1..=6).map(|n| retry.delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 8, 8]);
        assert_eq!(retry.delay(u32::MAX), Duration::from_secs(8));
    }
}
