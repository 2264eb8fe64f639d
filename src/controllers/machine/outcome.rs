//! Recording the outcome of an operation: the operation and conditions first, then the Machine's
//! annotations, then Events and metrics (idempotent: also used after a crash).

use super::*;

impl Reconciler<'_> {
    /// Records the outcome: operation and conditions first, then the Machine, then Events.
    pub(super) async fn finish(
        &self,
        mut status: MachineCertificatesStatus,
        mut op: Operation,
        result: Result<(), Failure>,
    ) -> Result<Action, Error> {
        let now = Self::now();
        op.finished_at = Some(Time(now));
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
        match result {
            Ok(()) => {
                // Any success ends the backoff, and an earlier fail-safe bypass is history.
                status.failed_attempts = None;
                status.last_failure_time = None;
                crate::controllers::governing_policy::forget_window_bypass(&mut status, &op);
                crate::controllers::governing_policy::show_window_bypass(&mut status, now);
                status.expiry = op.new_expiry.clone();
                set_condition(
                    &mut status,
                    conditions::READY,
                    true,
                    why::REFRESHED,
                    format!(
                        "Certificates refreshed; they expire at {}",
                        op.new_expiry
                            .as_ref()
                            .map(crate::controllers::patches::rfc3339)
                            .unwrap_or_default()
                    ),
                    now,
                );
            }
            Err(Failure::Api(err)) => {
                // Our own write failed: the operation stays as last persisted and is resumed.
                return Err(err);
            }
            Err(failure) => {
                if op.origin == Origin::Policy {
                    // Remembered in the object, so the backoff survives restarts and failovers.
                    status.failed_attempts =
                        Some(status.failed_attempts.unwrap_or(0).max(0).saturating_add(1));
                    status.last_failure_time = Some(Time(now));
                }
                op.phase = Phase::Failed;
                let message = crate::controllers::governing_policy::with_hint(
                    failure.message(&self.view),
                    &crate::controllers::governing_policy::renew_now_hint(&self.view, &op.ttl),
                );
                op.error = Some(message.clone());
                set_condition(
                    &mut status,
                    conditions::READY,
                    false,
                    why::REFRESH_FAILED,
                    message,
                    now,
                );
            }
        }
        set_condition(
            &mut status,
            conditions::REFRESHING,
            false,
            why::IDLE,
            "No refresh in progress".into(),
            now,
        );
        status.operation = Some(op.clone());
        self.write_status(&status).await?;
        crate::failpoint::hit(crate::failpoint::AFTER_OUTCOME_RECORDED);
        self.record(&op).await
    }

    /// Shows a finished operation on the Machine (idempotent: also used after a crash).
    pub(super) async fn record(&self, op: &Operation) -> Result<Action, Error> {
        let succeeded = op.phase == Phase::Succeeded;
        self.keep_history(op).await?;
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
        Ok(Action::requeue(self.ctx.config.resync))
    }
}
