//! Sequencing, bounded retries and result interpretation of a refresh (no persistence, no
//! Kubernetes objects).

use std::future::Future;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use super::{ApproveApi, NodeApi};
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

/// `run` on a control plane, retried on transient failures; `before_send` runs before every
/// attempt (the controller persists the attempt count there) and may refuse it.
pub async fn run<N, B, BFut>(
    node: &mut N,
    request: &RunRequest,
    retry: &Retry,
    mut before_send: B,
) -> Result<RunResponse, K8sdError>
where
    N: NodeApi,
    B: FnMut() -> BFut,
    BFut: Future<Output = Result<(), K8sdError>>,
{
    let mut attempt = 1;
    loop {
        before_send().await?;
        match node.run(request).await {
            Err(err) if again(retry, &mut attempt, &err).await => continue,
            result => return result,
        }
    }
}

/// How often `approve` is retried while the worker's `run` is still pending. Older k8sd GETs the
/// CSRs once and answers 500 when `run` has not created them yet.
const APPROVE_INTERVAL: Duration = Duration::from_millis(500);

/// `run` on a worker concurrently with `approve` on a control plane. Approve is retried while
/// `run` is pending (older k8sd loses the race to CSR creation); "already approved" counts as
/// done. A permanently failing approve aborts `run` (dropping the call closes its connection).
pub async fn run_worker<N, A, B, BFut>(
    worker: &mut N,
    approver: &mut A,
    request: &RunRequest,
    retry: &Retry,
    before_send: B,
) -> Result<RunResponse, K8sdError>
where
    N: NodeApi,
    A: ApproveApi,
    B: FnMut() -> BFut,
    BFut: Future<Output = Result<(), K8sdError>>,
{
    let seed = request.seed;
    let run = run(worker, request, retry, before_send);
    let approve = async {
        let mut failures = 0;
        loop {
            match approver.approve(seed).await {
                Ok(()) => return Ok(()),
                Err(K8sdError::Api {
                    status: 500,
                    message,
                    ..
                }) if message.contains("already approved") => return Ok(()),
                Err(err) => {
                    let racing = matches!(&err, K8sdError::Api { status: 500, message, .. }
                        if message.contains("failed to get CSR") || message.contains("not found"));
                    failures += 1;
                    if !(racing || err.is_retryable()) || failures >= retry.attempts.max(1) * 8 {
                        return Err(err);
                    }
                    tokio::time::sleep(APPROVE_INTERVAL).await;
                }
            }
        }
    };
    tokio::pin!(run);
    tokio::pin!(approve);
    tokio::select! {
        result = &mut run => result,
        approved = &mut approve => match approved {
            Ok(()) => run.await,
            Err(err) => Err(err),
        },
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

    struct FakeApprover {
        answers: VecDeque<Result<(), K8sdError>>,
        calls: usize,
    }

    impl ApproveApi for FakeApprover {
        async fn approve(&mut self, _seed: i64) -> Result<(), K8sdError> {
            self.calls += 1;
            self.answers.pop_front().unwrap_or(Ok(()))
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

    fn noop() -> impl FnMut() -> std::future::Ready<Result<(), K8sdError>> {
        || std::future::ready(Ok(()))
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

    #[tokio::test(start_paused = true)]
    async fn run_calls_before_send_for_every_attempt_and_stops_when_it_refuses() {
        let mut node = FakeNode::default();
        node.runs
            .push_back(Err(api(503, "Database is not yet initialized")));
        node.runs.push_back(Ok(RunResponse {
            expiration_seconds: 2_000_000_000,
        }));
        let mut sends = 0;
        let response = run(&mut node, &request(1), &fast(), || {
            sends += 1;
            std::future::ready(Ok(()))
        })
        .await
        .unwrap();
        assert_eq!((response.expiration_seconds, sends), (2_000_000_000, 2));

        let mut node = FakeNode::default();
        let err = run(&mut node, &request(1), &fast(), || {
            std::future::ready(Err(api(409, "refused")))
        })
        .await
        .unwrap_err();
        assert!(matches!(err, K8sdError::Api { status: 409, .. }));
        assert!(
            node.run_calls.lock().unwrap().is_empty(),
            "run was never sent"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_run_waits_for_an_approve_that_loses_the_race_on_older_k8sd() {
        let mut worker = FakeNode {
            run_delay: APPROVE_INTERVAL + Duration::from_millis(300),
            ..FakeNode::default()
        };
        worker.runs.push_back(Ok(RunResponse {
            expiration_seconds: 2_000_000_000,
        }));
        let mut approver = FakeApprover {
            answers: VecDeque::from([
                Err(api(
                    500,
                    "failed to approve worker node CSR: failed to get CSR k8sd-1-worker-kubelet-serving: not found",
                )),
                Err(api(
                    500,
                    "failed to approve worker node CSR: CSR k8sd-1-worker-kubelet-serving is already approved",
                )),
            ]),
            calls: 0,
        };
        let response = run_worker(&mut worker, &mut approver, &request(1), &fast(), noop())
            .await
            .unwrap();
        assert_eq!(response.expiration_seconds, 2_000_000_000);
        assert_eq!(approver.calls, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_permanently_failing_approve_aborts_the_worker_run() {
        let mut worker = FakeNode {
            run_delay: Duration::from_secs(3600),
            ..FakeNode::default()
        };
        worker.runs.push_back(Ok(RunResponse {
            expiration_seconds: 2_000_000_000,
        }));
        let mut approver = FakeApprover {
            answers: VecDeque::from([Err(api(401, "invalid token"))]),
            calls: 0,
        };
        let err = run_worker(&mut worker, &mut approver, &request(1), &fast(), noop())
            .await
            .unwrap_err();
        assert!(matches!(err, K8sdError::Api { status: 401, .. }));
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
