//! Recording the outcome of an operation: in its request first (the journal), then the
//! MachineCertificates' expiry and conditions (as [`conclusion`](super::conclusion) computes
//! them, with a copy of the operation), then the Machine's annotations, then Events and metrics
//! (idempotent: also used after a crash).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::events::EventType;
use ck8s_certs_api::annotations::{IN_FLIGHT_REFRESH, REFRESH_CERTIFICATES, RefreshStatus};
use ck8s_certs_api::machine::MachineView;
use ck8s_certs_api::machine_certificates::{MachineCertificatesStatus, Operation, Phase};
use ck8s_certs_api::reasons::events;
use kube::runtime::controller::Action;
use tracing::{info, warn};

use super::act::Act;
use super::conclusion::{Ending, conclude, ending_of};
use super::{Context, Error};
use crate::controllers::executor::Failure;
use crate::controllers::patches::MachineChanges;
use crate::metrics::role_label;
use crate::refresh::trigger::{renew_now_hint, with_hint};

impl Act<'_> {
    /// Records the outcome: the request, the status, then the Machine, then Events.
    pub(super) async fn finish(
        &self,
        mut status: MachineCertificatesStatus,
        mut op: Operation,
        result: Result<(), Failure>,
    ) -> Result<Action, Error> {
        let now = self.ctx.clock.now();
        let outcome = if result.is_ok() {
            "succeeded"
        } else {
            "failed"
        };
        if !matches!(result, Err(Failure::Api(_))) {
            let metrics = &self.ctx.metrics;
            let origin = crate::metrics::origin(op.origin);
            if result.is_ok() {
                &metrics.renewals_succeeded
            } else {
                &metrics.renewals_failed
            }
            .get_or_create(&origin)
            .inc();
            let seconds = now.duration_since(op.started_at.0).as_secs_f64().max(0.0);
            let role = role_label(self.requests.role);
            metrics
                .refresh_duration
                .get_or_create(&crate::metrics::RefreshLabels {
                    origin: origin.origin,
                    role: role.to_owned(),
                    result: outcome.to_owned(),
                })
                .observe(seconds);
        }
        let ending = match result {
            Ok(()) => Ending::Succeeded,
            // Our own write failed: the operation stays as last persisted and is resumed.
            Err(Failure::Api(err)) => return Err(Error::from_api(err)),
            // Renewing again would fail the same way: no "renew now", only what to do.
            Err(failure @ Failure::InPlaceImpossible(_)) => Ending::Impossible(with_hint(
                failure.message(self.view),
                &details(self.view, &op),
            )),
            Err(failure) => {
                let message = failure_message(self.ctx, self.view, &failure, &op, &status, now);
                Ending::Failed(message)
            }
        };
        conclude(&mut status, &mut op, ending, now);
        self.journal_outcome(&op).await?;
        crate::failpoint::hit(crate::failpoint::AFTER_OUTCOME_RECORDED);
        self.report.write_status(&status).await?;
        self.show(&op).await
    }

    /// Writes a finished operation into its request (the journal) before anything else shows
    /// it. Once `run` answered, a refused write must not cost the node a second `run` (a resumed
    /// operation whose journal still says Running sends one): the write is tried again in place
    /// ([`OUTCOME_WRITE_DELAYS`]), and when the API still refuses it, the outcome is kept in
    /// memory ([`KeptOutcomes`]) and written first the next time the Machine is reconciled.
    async fn journal_outcome(&self, op: &Operation) -> Result<(), Error> {
        let name = self.requests.name(op);
        let written = retried(OUTCOME_WRITE_DELAYS, || {
            self.requests.write_named(&name, op)
        })
        .await;
        if let Err(err) = &written {
            warn!(request = name, error = %err, "The outcome could not be written to its request; it is kept and written before anything else");
            self.ctx
                .outcomes
                .keep(&self.view.namespace, &self.view.name, &name, op);
        }
        written
    }

    /// Records a finished operation found after a crash (or a lost write) wherever it is not
    /// yet: its request (`journaled`: read from it), the status, the Machine.
    pub(super) async fn record(
        &self,
        mut status: MachineCertificatesStatus,
        op: &Operation,
        journaled: bool,
    ) -> Result<Action, Error> {
        // A copy found in the status but in no request: an older version's operation, whose
        // record may lack the outcome.
        if !journaled
            && self.view.annotation(IN_FLIGHT_REFRESH).is_none()
            && self.ctx.config().history > 0
        {
            self.requests.write(op).await?;
        }
        if status.operation.as_ref() != Some(op) {
            let mut concluded = op.clone();
            let now = op
                .finished_at
                .as_ref()
                .map_or_else(|| self.ctx.clock.now(), |t| t.0);
            conclude(&mut status, &mut concluded, ending_of(op), now);
            self.report.write_status(&status).await?;
        }
        self.show(op).await
    }

    /// Shows a finished operation on the Machine, then drops records beyond the history.
    async fn show(&self, op: &Operation) -> Result<Action, Error> {
        let succeeded = op.phase == Phase::Succeeded;
        let current_trigger = self.view.annotation(REFRESH_CERTIFICATES);
        let remove = op
            .trigger
            .as_deref()
            .filter(|t| Some(*t) == current_trigger);
        self.report
            .patch_machine(&MachineChanges {
                status: Some(if succeeded {
                    RefreshStatus::Done
                } else {
                    RefreshStatus::Failed
                }),
                expiry: if succeeded {
                    op.new_expiry.as_ref()
                } else {
                    None
                },
                remove_trigger: remove,
                // The fleet's mark goes with the trigger it came with.
                remove_fleet: remove.is_some()
                    && op.fleet.is_some()
                    && self
                        .view
                        .annotation(ck8s_certs_api::annotations::FLEET_REQUEST)
                        == op.fleet.as_deref(),
                ..Default::default()
            })
            .await?;
        if succeeded {
            let expiry = op
                .new_expiry
                .as_ref()
                .map(crate::controllers::patches::rfc3339)
                .unwrap_or_default();
            self.report
                .event(
                    EventType::Normal,
                    events::REFRESH_DONE,
                    format!("Certificates refreshed; they now expire at {expiry}"),
                )
                .await;
            if let Some(note) = &op.note {
                self.report
                    .event(EventType::Warning, events::LIFETIME_MISMATCH, note.clone())
                    .await;
            }
            info!(expiry, "Certificates refreshed");
        } else {
            let error = op.error.clone().unwrap_or_default();
            self.report
                .event(EventType::Warning, events::REFRESH_FAILED, error.clone())
                .await;
            warn!(error, "Certificate refresh failed");
        }
        self.requests.prune(self.ctx.config().history).await;
        Ok(Action::requeue(self.ctx.config().resync))
    }
}

/// What failed, what to fix, how it is tried again (by the controller after its backoff
/// for an automatic renewal, by annotating again otherwise) and where to read more.
fn failure_message(
    ctx: &Context,
    view: &MachineView,
    failure: &Failure,
    op: &Operation,
    status: &MachineCertificatesStatus,
    now: jiff::Timestamp,
) -> String {
    let renew_now = renew_now_hint(view, &op.ttl);
    let again = match op.origin {
        ck8s_certs_api::machine_certificates::Origin::Policy => {
            // The count `conclude` is about to record.
            let failures = status.failed_attempts.unwrap_or(0).max(0).saturating_add(1);
            let delay = ctx.config().renewal.backoff.delay(Some(failures));
            let at = crate::policy::backoff::saturating_add(now, delay);
            // Whole seconds, as the status shows the failure's time.
            let at = jiff::Timestamp::from_second(at.as_second()).unwrap_or(at);
            format!(
                "The controller tries again by itself, not before {at} (backoff after {failures} failed automatic renewal(s); windows permitting), or: {renew_now}"
            )
        }
        _ => renew_now,
    };
    with_hint(with_hint(failure.message(view), &again), &details(view, op))
}

/// Where to read more about `op`.
fn details(view: &MachineView, op: &Operation) -> String {
    format!(
        "Details: kubectl ck8s-certs explain {} -n {} (CertificateRefresh {})",
        view.name,
        view.namespace,
        super::journal::request_name(view, op)
    )
}

/// The pauses between the tries of an outcome's write: five tries within about 15 s.
pub(super) const OUTCOME_WRITE_DELAYS: &[Duration] = &[
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
];

/// Runs `write` until it succeeds, pausing `delays` between tries; the last error otherwise.
pub(super) async fn retried<F, Fut, E>(delays: &[Duration], mut write: F) -> Result<(), E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let mut pauses = delays.iter();
    loop {
        match write().await {
            Ok(()) => return Ok(()),
            Err(err) => match pauses.next() {
                Some(pause) => {
                    warn!(error = %err, retry_in = ?pause, "Writing the outcome failed");
                    tokio::time::sleep(*pause).await;
                }
                None => return Err(err),
            },
        }
    }
}

/// Outcomes whose write to their request failed, per Machine: `(namespace, machine)` to the
/// request's name and the finished operation. Memory only: lost with the process, as the
/// answer of a `run` in flight would be.
#[derive(Default)]
pub struct KeptOutcomes(Mutex<HashMap<(String, String), (String, Operation)>>);

impl KeptOutcomes {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), (String, Operation)>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn keep(&self, namespace: &str, machine: &str, request: &str, op: &Operation) {
        self.map().insert(
            (namespace.to_owned(), machine.to_owned()),
            (request.to_owned(), op.clone()),
        );
    }

    pub(super) fn get(&self, namespace: &str, machine: &str) -> Option<(String, Operation)> {
        self.map()
            .get(&(namespace.to_owned(), machine.to_owned()))
            .cloned()
    }

    /// Forgets the kept outcome of `request` (a newer one kept meanwhile stays).
    pub(super) fn forget(&self, namespace: &str, machine: &str, request: &str) {
        let mut map = self.map();
        let key = (namespace.to_owned(), machine.to_owned());
        if map.get(&key).is_some_and(|(name, _)| name == request) {
            map.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_refused_write_is_tried_again_in_place_until_the_delays_run_out() {
        let tries = AtomicU32::new(0);
        let refused_twice = retried(OUTCOME_WRITE_DELAYS, || async {
            match tries.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Err("refused"),
                _ => Ok(()),
            }
        })
        .await;
        assert_eq!(refused_twice, Ok(()));
        assert_eq!(tries.load(Ordering::SeqCst), 3);

        let tries = AtomicU32::new(0);
        let started = tokio::time::Instant::now();
        let always = retried(OUTCOME_WRITE_DELAYS, || async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>("refused")
        })
        .await;
        assert_eq!(always, Err("refused"));
        assert_eq!(tries.load(Ordering::SeqCst), 5);
        assert_eq!(started.elapsed(), Duration::from_secs(15));
    }

    #[test]
    fn a_kept_outcome_is_the_machine_s_until_its_own_request_is_written() {
        let kept = KeptOutcomes::default();
        let op = crate::controllers::machine::testing::op(Phase::Running, "1y");
        kept.keep("ns", "m", "m-1", &op);
        assert_eq!(kept.get("ns", "m"), Some(("m-1".into(), op.clone())));
        assert_eq!(kept.get("other", "m"), None);
        // Writing an older request does not drop a newer outcome.
        kept.keep("ns", "m", "m-2", &op);
        kept.forget("ns", "m", "m-1");
        assert_eq!(
            kept.get("ns", "m").map(|(name, _)| name),
            Some("m-2".into())
        );
        kept.forget("ns", "m", "m-2");
        assert_eq!(kept.get("ns", "m"), None);
    }
}
