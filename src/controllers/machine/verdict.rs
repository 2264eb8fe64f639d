//! Automatic renewal: the governing policy's verdict for this Machine, shown in its status (written
//! only when it changes) and carried out when it says renew now.

use std::time::Duration;

use ck8s_certs_api::machine::ClusterView;
use ck8s_certs_api::machine_certificates::{MachineCertificatesStatus, RenewalStatus};
use ck8s_certs_api::reasons::{conditions, events};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::{Error, Reconciler};

impl Reconciler<'_> {
    /// Applies the governing renewal policy, if any: renew now, or record why not and come back
    /// exactly when the answer can change. The verdict is written only when it changes.
    pub(super) async fn renew(
        &self,
        mut status: MachineCertificatesStatus,
        cluster: ClusterView,
    ) -> Result<Action, Error> {
        use crate::controllers::governing_policy::{CONFIG_INVALID, Governing, Verdict, with_hint};
        use crate::policy::{Decision, DeferReason, RenewReason};
        let now = self.now();
        let resync = self.ctx.config.resync;
        let hint =
            |ttl: &str| crate::controllers::governing_policy::renew_now_hint(&self.view, ttl);
        let default_ttl = ck8s_certs_api::renewal_policy::DEFAULT_TTL.to_string();
        let warn_invalid = Some((EventType::Warning, events::RENEWAL_CONFIG_INVALID));
        let governing = crate::controllers::governing_policy::governing(
            &self.ctx.stores.policies,
            &self.ctx.stores.policy_readings,
            &self.view.namespace,
            Some(&cluster.labels),
            &self.view.labels,
        );
        let (info, policy) = match governing {
            Governing::None => {
                self.show_verdict(&status, Verdict::none(), None, now)
                    .await?;
                return Ok(Action::requeue(resync));
            }
            Governing::Conflict(names) => {
                let message = format!(
                    "CertificateRenewalPolicies {} all select this Machine; no automatic renewal until exactly one does (adjust their selectors)",
                    names.join(", ")
                );
                let verdict = Verdict::conflict(names, with_hint(message, &hint(&default_ttl)));
                self.show_verdict(&status, verdict, warn_invalid, now)
                    .await?;
                return Ok(Action::requeue(resync));
            }
            Governing::One { info, policy } => (info, policy),
        };
        let invalid = |message: String, ttl: &str| {
            Verdict::new(
                &info,
                CONFIG_INVALID,
                None,
                with_hint(message, &hint(ttl)),
                Some(conditions::RENEWAL_CONFIG_INVALID),
            )
        };
        let policy = match policy {
            Ok(policy) => policy,
            Err(message) => {
                let verdict = invalid(message, &default_ttl);
                self.show_verdict(&status, verdict, warn_invalid, now)
                    .await?;
                return Ok(Action::requeue(resync));
            }
        };
        let ttl = policy.ttl.to_string();
        if !self.view.control_plane
            && let Err(err) = policy.ttl.check_worker()
        {
            let message = format!(
                "CertificateRenewalPolicy {} cannot renew this worker: {err}",
                info.name
            );
            let verdict = invalid(message, &default_ttl);
            self.show_verdict(&status, verdict, warn_invalid, now)
                .await?;
            return Ok(Action::requeue(resync));
        }
        let failures = crate::policy::Failures {
            count: status.failed_attempts,
            last_failure: status.last_failure_time.as_ref().map(|t| t.0),
        };
        let input = policy
            .input(
                status.expiry.as_ref().map(|t| t.0),
                failures,
                self.ctx.config.renewal,
            )
            // For renewBeforePercentage: when the certificates now served were issued.
            .with_lifetime_start(crate::policy::lifetime_start(&status))
            // Its place in the policy's spread: the UID stays the same for the Machine's life.
            .with_stagger_key(self.view.uid.as_deref());
        let decision = crate::policy::decide(&input, now);
        let requeue = crate::policy::requeue_at(&decision)
            .map(|at| {
                Duration::try_from(at.duration_since(now))
                    .unwrap_or_default()
                    .max(Duration::from_millis(100))
            })
            .map_or(resync, |d| d.min(resync));
        let message = decision.to_string();
        let windows_ignored = |verdict: Verdict| {
            if decision.windows_ignored() {
                verdict.with(
                    conditions::WINDOWS_IGNORED,
                    "Automatic",
                    crate::policy::decision::WINDOWS_IGNORED_MESSAGE.to_owned(),
                )
            } else {
                verdict
            }
        };
        let severity = if decision.is_warning() {
            EventType::Warning
        } else {
            EventType::Normal
        };
        match &decision {
            Decision::NoExpiry { .. } => Ok(Action::requeue(resync)),
            Decision::RenewNow(renewal) => {
                self.live_only()?;
                let verdict = Verdict::new(&info, "RenewNow", Some(now), message.clone(), None);
                if renewal.reason == RenewReason::FailSafeBypass {
                    // Kept (with its condition) until a later refresh succeeds.
                    // Announced (Event, metric) once the renewal is taken up.
                    status.last_window_bypass =
                        Some(ck8s_certs_api::machine_certificates::WindowBypass {
                            time: Time(now),
                            expiry: status.expiry.clone(),
                            message: message.clone(),
                        });
                }
                let matched_window = renewal.window.map(|index| {
                    crate::controllers::governing_policy::describe_window(&policy.windows, index)
                });
                let bypassed = renewal.reason == RenewReason::FailSafeBypass;
                let status = crate::controllers::governing_policy::with_verdict(
                    &status,
                    &windows_ignored(verdict),
                    now,
                );
                self.start_automatic(
                    status,
                    &info.name,
                    policy.ttl,
                    cluster,
                    matched_window,
                    bypassed,
                )
                .await
            }
            Decision::Defer(deferral) => {
                // Not due is the healthy steady state: no condition, and a Normal Event saying
                // when the next renewal is. Anything else holds back a due renewal.
                let (condition, announce) = if deferral.reason == DeferReason::NotDue {
                    (None, (EventType::Normal, events::RENEWAL_SCHEDULED))
                } else {
                    (
                        Some(conditions::RENEWAL_DEFERRED),
                        (severity, events::RENEWAL_DEFERRED),
                    )
                };
                let verdict = Verdict::new(
                    &info,
                    deferral.reason.as_str(),
                    Some(deferral.until),
                    with_hint(message, &hint(&ttl)),
                    condition,
                );
                self.show_verdict(&status, windows_ignored(verdict), Some(announce), now)
                    .await?;
                Ok(Action::requeue(requeue))
            }
            Decision::Disabled { .. } => {
                let verdict = Verdict::new(
                    &info,
                    "Disabled",
                    None,
                    with_hint(message, &hint(&ttl)),
                    Some(conditions::RENEWAL_DISABLED),
                );
                self.show_verdict(
                    &status,
                    windows_ignored(verdict),
                    Some((severity, events::RENEWAL_DISABLED)),
                    now,
                )
                .await?;
                Ok(Action::requeue(requeue))
            }
            Decision::Invalid { .. } => {
                self.show_verdict(&status, invalid(message, &ttl), warn_invalid, now)
                    .await?;
                Ok(Action::requeue(resync))
            }
        }
    }

    /// Shows a renewal verdict: the status is written only when it differs from what is stored
    /// (at rest nothing is written); a changed verdict is announced with `announce` and counted.
    pub(super) async fn show_verdict(
        &self,
        current: &MachineCertificatesStatus,
        verdict: crate::controllers::governing_policy::Verdict,
        announce: Option<(EventType, &str)>,
        now: Timestamp,
    ) -> Result<(), Error> {
        let desired = crate::controllers::governing_policy::with_verdict(current, &verdict, now);
        if desired != *current {
            self.write_status(&desired).await?;
        }
        let Some(renewal) = verdict.renewal.as_ref() else {
            return Ok(());
        };
        // A new generation of the same policy with the same outcome is recorded, not announced.
        fn said(r: &RenewalStatus) -> (&String, &String, &Option<Time>) {
            (&r.reason, &r.message, &r.next_renewal_time)
        }
        if current.renewal.as_ref().map(said) == Some(said(renewal)) {
            return Ok(());
        }
        let labels = crate::metrics::reason_label(&renewal.reason);
        match verdict.conditions.first().map(|(type_, _, _)| *type_) {
            Some(conditions::RENEWAL_DEFERRED) => {
                self.ctx
                    .metrics
                    .renewal_deferred
                    .get_or_create(&labels)
                    .inc();
            }
            Some(conditions::RENEWAL_CONFIG_INVALID) => {
                self.ctx.metrics.policy_invalid.get_or_create(&labels).inc();
            }
            _ => {}
        }
        if let Some((type_, reason)) = announce {
            self.event(type_, reason, renewal.message.clone()).await;
        }
        Ok(())
    }
}
