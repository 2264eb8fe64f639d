//! Taking up a refresh request: a manual trigger (checked, or refused with a reason), an automatic
//! renewal, or an interrupted operation resumed; control planes of a cluster go first. Taking one
//! up shows the Machine in-progress and names the CertificateRefresh that will carry it.

use ck8s_certs_api::annotations::{REFRESH_CERTIFICATES, RefreshStatus};
use ck8s_certs_api::capi::{BLOCK_MOVE_ANNOTATION, BLOCK_MOVE_OWNER};
use ck8s_certs_api::machine::{ClusterView, MachineView};
use ck8s_certs_api::machine_certificates::{MachineCertificatesStatus, Operation, Origin};
use ck8s_certs_api::reasons::{condition_reasons as why, conditions, events};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::{Error, Reconciler};
use crate::controllers::patches::{MachineChanges, set_condition};
use crate::policy::Ttl;

use super::conclusion::{Ending, conclude};

impl Reconciler<'_> {
    /// Fails a request before anything happened on the node (bad input).
    pub(super) async fn reject(
        &self,
        mut status: MachineCertificatesStatus,
        trigger: &str,
        error: String,
    ) -> Result<Action, Error> {
        let now = self.now();
        let mut op = Operation {
            request: self.request(),
            fleet: self.fleet(),
            requester: self.requester(),
            ttl_seconds: None,
            ..Operation::pending(
                self.origin(),
                self.requested_by(),
                Some(trigger.to_owned()),
                trigger.to_owned(),
                0,
                after_last(Time(now), status.operation.as_ref()),
            )
        };
        conclude(&mut status, &mut op, Ending::Failed(error.clone()), now);
        self.write_status(&status).await?;
        if self.ctx.config.history > 0 {
            self.write_record(&op).await?;
        }
        self.patch_machine(&MachineChanges {
            status: Some(RefreshStatus::Failed),
            remove_trigger: Some(trigger),
            remove_fleet: self.fleet().is_some(),
            ..Default::default()
        })
        .await?;
        self.event(EventType::Warning, events::REFRESH_FAILED, error)
            .await;
        self.prune_history().await;
        Ok(Action::await_change())
    }

    /// Refuses a trigger its owner applies again after the refresh it asked for (see
    /// [`Step::Reapplied`]): the trigger is left where it is (removing it would only make the
    /// owner apply it again, and the next removal again), the Machine no longer shows it in
    /// progress, and the `TriggerRefused` condition and one Event say where it comes from.
    /// Nothing is written again while it stays.
    pub(super) async fn refuse_reapplied(
        &self,
        mut status: MachineCertificatesStatus,
        trigger: &str,
        manager: &str,
        now: Timestamp,
    ) -> Result<Action, Error> {
        use ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS;
        let message = format!(
            "Not refreshed again: {REFRESH_CERTIFICATES}={trigger} is applied again by {manager} (server-side apply) after the refresh it asked for finished, so every refresh would ask for the next. It comes from an owner that asserts it: a MachineDeployment's or MachineSet's spec.template.metadata.annotations (Cluster API copies them onto each Machine), ClusterClass topology metadata, or a GitOps tool. Remove it there. To refresh the Machines of a MachineDeployment, annotate the MachineDeployment itself: kubectl annotate machinedeployment -n {} <name> {REFRESH_CERTIFICATES}={trigger}",
            self.view.namespace
        );
        if self.view.annotation(REFRESH_CERTIFICATES_STATUS)
            == Some(RefreshStatus::InProgress.as_str())
        {
            // Marked in progress by the admission webhook when it was applied again.
            self.patch_machine(&MachineChanges {
                status: Some(RefreshStatus::Failed),
                release_move: self.view.annotation(BLOCK_MOVE_ANNOTATION) == Some(BLOCK_MOVE_OWNER),
                ..Default::default()
            })
            .await?;
        }
        let before = status.clone();
        set_condition(
            &mut status,
            conditions::TRIGGER_REFUSED,
            true,
            why::REAPPLIED,
            message.clone(),
            now,
        );
        if status != before {
            self.write_status(&status).await?;
            warn!(manager, "Refused a refresh trigger its owner applies again");
            self.event(EventType::Warning, events::REFRESH_REFUSED, message)
                .await;
        }
        Ok(Action::await_change())
    }

    /// Ends a refusal ([`refuse_reapplied`](Self::refuse_reapplied)) once its trigger is gone or
    /// changed.
    pub(super) async fn clear_refusal(
        &self,
        status: &mut MachineCertificatesStatus,
        now: Timestamp,
    ) -> Result<(), Error> {
        let refused = status
            .conditions
            .iter()
            .any(|c| c.type_ == conditions::TRIGGER_REFUSED && c.status == "True");
        if !refused {
            return Ok(());
        }
        set_condition(
            status,
            conditions::TRIGGER_REFUSED,
            false,
            why::IDLE,
            "No trigger is refused".into(),
            now,
        );
        self.write_status(status).await
    }

    /// The fleet request that set the trigger, if one did.
    pub(super) fn fleet(&self) -> Option<String> {
        self.view
            .annotation(ck8s_certs_api::annotations::FLEET_REQUEST)
            .map(str::to_owned)
    }

    /// Fleet when a fleet request set the trigger, else Manual.
    fn origin(&self) -> Origin {
        if self.fleet().is_some() {
            Origin::Fleet
        } else {
            Origin::Manual
        }
    }

    /// The admission webhook's name for the request the trigger belongs to, if it ran.
    pub(super) fn request(&self) -> Option<String> {
        self.view
            .annotation(ck8s_certs_api::annotations::REFRESH_REQUEST)
            .map(str::to_owned)
    }

    /// The user who wrote the trigger, as the admission webhook recorded them. A fleet
    /// request's hand-over is the controller's own write: its request names the user.
    pub(super) fn requester(&self) -> Option<ck8s_certs_api::machine_certificates::Requester> {
        if self.fleet().is_some() {
            return None;
        }
        let username = self
            .view
            .annotation(ck8s_certs_api::annotations::REQUESTER)?;
        Some(ck8s_certs_api::machine_certificates::Requester {
            username: username.to_owned(),
            ..Default::default()
        })
    }

    /// The field manager that last set the trigger annotation, e.g. `kubectl-annotate`.
    pub(super) fn requested_by(&self) -> Option<String> {
        match self.fleet() {
            Some(fleet) => Some(format!("CertificateRefresh/{fleet}")),
            None => self.machine.trigger_manager.clone(),
        }
    }

    pub(super) async fn start(
        self,
        status: MachineCertificatesStatus,
        trigger: String,
        cluster: ClusterView,
    ) -> Result<Action, Error> {
        let ttl = match super::step::check_trigger(&self.view, &trigger) {
            Ok(ttl) => ttl,
            Err(refusal) => {
                let message = refusal.message(&self.view);
                return self.reject(status, &trigger, message).await;
            }
        };
        let node = self.view.node_name.clone().unwrap_or_default();
        let requester = self.requester();
        // Who asked, where known: the trigger's author, or the fleet request (which names its
        // own requester).
        let asked = match (&requester, self.fleet()) {
            (Some(user), _) => format!(", asked by {}", user.username),
            (None, Some(fleet)) => format!(", for CertificateRefresh {fleet}"),
            (None, None) => String::new(),
        };
        let announcement =
            format!("Refreshing the certificates of node {node} for {trigger}{asked}");
        let op = Operation {
            request: self.request(),
            fleet: self.fleet(),
            requester,
            ..Operation::pending(
                self.origin(),
                self.requested_by(),
                Some(trigger.clone()),
                trigger,
                ttl.as_seconds(),
                Time(self.now()),
            )
        };
        self.announce_and_execute(status, op, announcement, cluster)
            .await
    }

    /// Starts an automatic renewal: the same operation as a manual refresh, origin Policy.
    pub(super) async fn start_automatic(
        &self,
        status: MachineCertificatesStatus,
        policy: &str,
        ttl: Ttl,
        cluster: ClusterView,
        matched_window: Option<String>,
        bypassed_windows: bool,
    ) -> Result<Action, Error> {
        let node = self.view.node_name.clone().unwrap_or_default();
        let announcement = format!(
            "Renewing the certificates of node {node} for {ttl}, as CertificateRenewalPolicy {policy} requires"
        );
        let requested_by = Some(format!("CertificateRenewalPolicy/{policy}"));
        let op = Operation {
            matched_window,
            bypassed_windows,
            ..Operation::pending(
                Origin::Policy,
                requested_by,
                None,
                ttl.to_string(),
                ttl.as_seconds(),
                Time(self.now()),
            )
        };
        self.announce_and_execute(status, op, announcement, cluster)
            .await
    }

    /// Takes the refresh up: shows the Machine in-progress, naming the request that will carry
    /// it (one already named is kept: a refresh restarted before it reached the node), with an
    /// Event; then runs the operation. The write is conditional on the Machine as read, so a
    /// cache behind or two instances never name two requests.
    pub(super) async fn announce_and_execute(
        &self,
        status: MachineCertificatesStatus,
        mut op: Operation,
        announcement: String,
        cluster: ClusterView,
    ) -> Result<Action, Error> {
        if self.ctx.stop.is_cancelled() {
            return Ok(Action::await_change());
        }
        self.live_only()?;
        op.started_at = after_last(op.started_at, status.operation.as_ref());
        let request = self.request_name(&op);
        let Some(view) = self.take_up(&op, &request).await? else {
            info!("The Machine changed before the refresh was taken up; looking again");
            return Ok(Action::requeue(crate::controllers::shard::RECHECK));
        };
        // The final patch releases the block-move this one set: it must see it.
        let announced = Reconciler { view, ..*self };
        announced
            .event(EventType::Normal, events::REFRESH_IN_PROGRESS, announcement)
            .await;
        if op.bypassed_windows
            && let Some(bypass) = &status.last_window_bypass
        {
            // Said once the renewal is taken up: a take-up tried again says nothing twice.
            announced
                .event(
                    EventType::Warning,
                    events::RENEWAL_WINDOW_BYPASSED,
                    bypass.message.clone(),
                )
                .await;
            self.ctx
                .metrics
                .renewal_bypassed
                .get_or_create(&crate::metrics::expiry_imminent())
                .inc();
        }
        announced
            .execute(status, op, false, self.role(), cluster)
            .await
    }

    /// Shows the Machine in-progress, naming `request`, on the condition that the Machine did
    /// not change since read (a cache behind, or another instance, would otherwise take a refresh
    /// up twice); when it did (our own write earlier in this reconcile,
    /// a cache behind, or another instance), it is read again and taken up as it is now, unless
    /// it no longer asks for this refresh (another request named, another trigger). Returns the
    /// Machine as announced; `None`: not taken up, look again.
    async fn take_up(&self, op: &Operation, request: &str) -> Result<Option<MachineView>, Error> {
        use ck8s_certs_api::annotations::{IN_FLIGHT_REFRESH, REFRESH_REQUEST};
        let mut view = self.view.clone();
        let mut version = self.machine.meta().resource_version.clone();
        for _ in 0..2 {
            let announce = MachineChanges {
                status: Some(RefreshStatus::InProgress),
                request: Some(request),
                unchanged_since: version.as_deref(),
                ..Default::default()
            };
            match self.apply_machine_patch(&view, &announce).await {
                Ok(()) => {
                    return Ok(Some(crate::controllers::patches::patched(&view, &announce)));
                }
                Err(kube::Error::Api(status)) if status.code == 409 || status.code == 422 => {
                    let Some(fresh) = self.machines().get_opt(&self.view.name).await? else {
                        return Ok(None);
                    };
                    let now = MachineView::of(&fresh);
                    let still_asked = now.uid == view.uid
                        && !now.deleting
                        && now
                            .annotation(IN_FLIGHT_REFRESH)
                            .is_none_or(|n| n == request)
                        && now.annotation(REFRESH_CERTIFICATES) == op.trigger.as_deref()
                        && (op.trigger.is_none()
                            || now.annotation(REFRESH_REQUEST) == op.request.as_deref());
                    if !still_asked {
                        return Ok(None);
                    }
                    version = fresh.meta().resource_version.clone();
                    view = now;
                }
                Err(kube::Error::Api(status)) if status.code == 404 => return Ok(None),
                Err(err) => return Err(err.into()),
            }
        }
        Ok(None)
    }

    /// `opened`: the operation was read from its request (an older version kept it in the
    /// MachineCertificates only).
    pub(super) async fn resume(
        self,
        status: MachineCertificatesStatus,
        op: Operation,
        opened: bool,
        cluster: ClusterView,
    ) -> Result<Action, Error> {
        let role = status.role.unwrap_or(self.role());
        info!(seed = ?op.seed, attempts = op.run_attempts, "Resuming an interrupted refresh");
        self.execute(status, op, opened, role, cluster).await
    }
}

/// A new operation's start: `started`, or a second after the last operation's start when that
/// is not earlier. A request is named after its start second, and a refresh takes well under a
/// second: a second request within the second of the last one would take its name (and be
/// taken for it, finished).
fn after_last(started: Time, last: Option<&Operation>) -> Time {
    match last {
        Some(last) if last.started_at.0.as_second() >= started.0.as_second() => {
            let next = last.started_at.0.as_second().saturating_add(1);
            Time(Timestamp::from_second(next).unwrap_or(started.0))
        }
        _ => started,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::machine::journal;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(second).unwrap())
    }

    #[test]
    fn a_new_request_never_takes_the_name_of_the_last_one() {
        let last = Operation::pending(Origin::Manual, None, None, "1y".into(), 1, at(100));
        // Within the same second as the last start, or a clock behind it: the next second.
        let same =
            Time(Timestamp::from_second(100).unwrap() + jiff::SignedDuration::from_millis(400));
        assert_eq!(after_last(same.clone(), Some(&last)).0.as_second(), 101);
        assert_eq!(after_last(at(90), Some(&last)).0.as_second(), 101);
        assert_eq!(after_last(at(105), Some(&last)), at(105));
        assert_eq!(after_last(at(105), None), at(105));
        assert_ne!(
            journal::record_name(
                "m",
                &Operation {
                    started_at: after_last(same, Some(&last)),
                    ..last.clone()
                }
            ),
            journal::record_name("m", &last)
        );
    }
}
