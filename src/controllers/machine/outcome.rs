//! Recording the outcome of an operation: in its request first (the journal), then the
//! MachineCertificates' expiry and conditions (as [`conclusion`](super::conclusion) computes
//! them, with a copy of the operation), then the Machine's annotations, then Events and metrics
//! (idempotent: also used after a crash).

use super::conclusion::{Ending, conclude, ending_of};
use super::*;

impl Reconciler<'_> {
    /// Records the outcome: the request, the status, then the Machine, then Events.
    pub(super) async fn finish(
        &self,
        mut status: MachineCertificatesStatus,
        mut op: Operation,
        result: Result<(), Failure>,
    ) -> Result<Action, Error> {
        let now = Self::now();
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
            let role = role_label(self.role());
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
            Err(Failure::Api(err)) => return Err(err),
            Err(failure) => Ending::Failed(crate::controllers::governing_policy::with_hint(
                failure.message(&self.view),
                &crate::controllers::governing_policy::renew_now_hint(&self.view, &op.ttl),
            )),
        };
        conclude(&mut status, &mut op, ending, now);
        self.write_record(&op).await?;
        crate::failpoint::hit(crate::failpoint::AFTER_OUTCOME_RECORDED);
        self.write_status(&status).await?;
        self.show(&op).await
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
            && self.ctx.config.history > 0
        {
            self.write_record(op).await?;
        }
        if status.operation.as_ref() != Some(op) {
            let mut concluded = op.clone();
            let now = op.finished_at.as_ref().map_or_else(Self::now, |t| t.0);
            conclude(&mut status, &mut concluded, ending_of(op), now);
            self.write_status(&status).await?;
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
        self.patch_machine(&MachineChanges {
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
            self.event(
                EventType::Normal,
                events::REFRESH_DONE,
                format!("Certificates refreshed; they now expire at {expiry}"),
            )
            .await;
            if let Some(note) = &op.note {
                self.event(EventType::Warning, events::LIFETIME_MISMATCH, note.clone())
                    .await;
            }
            info!(expiry, "Certificates refreshed");
        } else {
            let error = op.error.clone().unwrap_or_default();
            self.event(EventType::Warning, events::REFRESH_FAILED, error.clone())
                .await;
            warn!(error, "Certificate refresh failed");
        }
        self.prune_history().await;
        Ok(Action::requeue(self.ctx.config.resync))
    }
}
