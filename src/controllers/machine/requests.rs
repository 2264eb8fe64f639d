//! Taking up a refresh request: a manual trigger (checked, or refused with a reason), an automatic
//! renewal, or an interrupted operation resumed; control planes of a cluster go first. Taking one
//! up shows the Machine in-progress and names the CertificateRefresh that will carry it.

use crate::events::EventType;
use ck8s_certs_api::annotations::{
    FLEET_REQUEST, IN_FLIGHT_REFRESH, REFRESH_CERTIFICATES, REFRESH_REQUEST, REQUESTER,
    RefreshStatus,
};
use ck8s_certs_api::certificate_refresh::{CertificateRefresh, MachinePhase, RequestPhase};
use ck8s_certs_api::machine::MachineView;
use ck8s_certs_api::machine_certificates::{
    MachineCertificatesStatus, Operation, Origin, Requester,
};
use ck8s_certs_api::reasons::events;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::Action;
use kube::{Api, Resource};
use tracing::{info, warn};

use super::Error;
use super::act::Act;
use super::conclusion::{Ending, conclude};
use super::verdict::Renewal;
use crate::controllers::patches::{MachineChanges, patched};
use crate::refresh::trigger::check_trigger;

/// Whether `request` (the fleet request a Machine's mark names) handed `machine` its trigger: it
/// exists, is not finished, and shows the Machine Running in its status (written before the
/// hand-over). The mark is the controller's (an admission policy keeps it so); this holds where
/// the policy is missing.
pub(super) fn handed_over(request: Option<&CertificateRefresh>, machine: &str) -> bool {
    let Some(status) = request.and_then(|r| r.status.as_ref()) else {
        return false;
    };
    !status.phase.is_some_and(RequestPhase::is_finished)
        && status
            .machines
            .iter()
            .any(|m| m.name == machine && m.phase == MachinePhase::Running)
}

/// Who asked for a manual refresh, as the Machine's annotations say.
struct Asked {
    /// The fleet request that set the trigger, if one did.
    fleet: Option<String>,
    /// The admission webhook's name for the request the trigger belongs to, if it ran.
    request: Option<String>,
    /// The user who wrote the trigger, as the admission webhook recorded them. A fleet
    /// request's hand-over is the controller's own write: its request names the user.
    requester: Option<Requester>,
    /// The field manager that last set the trigger annotation (e.g. `kubectl-annotate`), or the
    /// fleet request.
    requested_by: Option<String>,
}

impl Asked {
    /// `fleet_handed`: whether the fleet request the Machine's mark names really handed it its
    /// trigger ([`handed_over`]). A mark that names no such request is not believed: the
    /// refresh is the trigger author's, not part of someone else's fleet request.
    fn of(view: &MachineView, fleet_handed: bool) -> Self {
        let fleet = view
            .annotation(FLEET_REQUEST)
            .filter(|_| fleet_handed)
            .map(str::to_owned);
        let requester = match fleet {
            Some(_) => None,
            None => view.annotation(REQUESTER).map(|username| Requester {
                username: username.to_owned(),
                ..Default::default()
            }),
        };
        Self {
            requested_by: match &fleet {
                Some(fleet) => Some(format!("CertificateRefresh/{fleet}")),
                None => view.trigger_manager.clone(),
            },
            request: view.annotation(REFRESH_REQUEST).map(str::to_owned),
            requester,
            fleet,
        }
    }

    /// The operation of `trigger` asked for at `started` (for `ttl_seconds`).
    fn operation(self, trigger: &str, ttl_seconds: i64, started: Time) -> Operation {
        let origin = if self.fleet.is_some() {
            Origin::Fleet
        } else {
            Origin::Manual
        };
        Operation {
            request: self.request,
            fleet: self.fleet,
            requester: self.requester,
            ..Operation::pending(
                origin,
                self.requested_by,
                Some(trigger.to_owned()),
                trigger.to_owned(),
                ttl_seconds,
                started,
            )
        }
    }
}

impl Act<'_> {
    /// Takes a manual trigger up, or refuses it before anything happens on the node.
    pub(super) async fn start(
        self,
        status: MachineCertificatesStatus,
        trigger: String,
    ) -> Result<Action, Error> {
        let now = self.ctx.clock.now();
        let ttl = match check_trigger(self.view, &trigger, self.ctx.config().band) {
            Ok(ttl) => ttl,
            Err(refusal) => {
                let message = refusal.message(self.view);
                return self.reject(status, &trigger, message).await;
            }
        };
        if let Some(why) = self.cluster_ca_end().and_then(|ca| ca.refuse(ttl, now)) {
            let message = format!("Refused before anything started: {why}");
            return self.reject(status, &trigger, message).await;
        }
        let node = self.view.node_name.clone().unwrap_or_default();
        let fleet_handed = match self.view.annotation(FLEET_REQUEST) {
            Some(fleet) => {
                let requests: Api<CertificateRefresh> =
                    Api::namespaced(self.ctx.client().clone(), &self.view.namespace);
                let request = requests.get_opt(fleet).await?;
                let handed = handed_over(request.as_ref(), &self.view.name);
                if !handed {
                    warn!(
                        fleet,
                        "The Machine's fleet-request mark names no request that handed it its trigger: the refresh is its trigger author's"
                    );
                }
                handed
            }
            None => false,
        };
        let asked = Asked::of(self.view, fleet_handed);
        // Who asked, where known: the trigger's author, or the fleet request (which names its
        // own requester).
        let by = match (&asked.requester, &asked.fleet) {
            (Some(user), _) => format!(", asked by {}", user.username),
            (None, Some(fleet)) => format!(", for CertificateRefresh {fleet}"),
            (None, None) => String::new(),
        };
        let announcement = format!("Refreshing the certificates of node {node} for {trigger}{by}");
        let op = asked.operation(&trigger, ttl.as_seconds(), Time(now));
        self.announce_and_execute(status, op, announcement).await
    }

    /// Fails a request before anything happened on the node (bad input).
    async fn reject(
        &self,
        mut status: MachineCertificatesStatus,
        trigger: &str,
        error: String,
    ) -> Result<Action, Error> {
        let now = self.ctx.clock.now();
        let started = after_last(Time(now), status.operation.as_ref());
        // Reported to the fleet request the mark names as it is: a request that did not hand
        // the Machine over ignores it (its planner follows only the Machines it marked Running).
        let mut op = Operation {
            ttl_seconds: None,
            ..Asked::of(self.view, true).operation(trigger, 0, started)
        };
        let fleet = op.fleet.is_some();
        conclude(&mut status, &mut op, Ending::Failed(error.clone()), now);
        self.report.write_status(&status).await?;
        if self.ctx.config().history > 0 {
            self.requests.write(&op).await?;
        }
        self.report
            .patch_machine(&MachineChanges {
                status: Some(RefreshStatus::Failed),
                remove_trigger: Some(trigger),
                remove_fleet: fleet,
                ..Default::default()
            })
            .await?;
        self.report
            .event(EventType::Warning, events::REFRESH_FAILED, error)
            .await;
        self.requests.prune(self.ctx.config().history).await;
        Ok(Action::await_change())
    }

    /// The end of the Machine's cluster CA, as its ClusterCertificates record shows it (from the
    /// kubeconfig's CA data: the CA's key is never read for it); `None` while unknown.
    fn cluster_ca_end(&self) -> Option<crate::refresh::band::CaEnd> {
        let cluster = self.view.cluster.as_deref()?;
        let namespace = &self.view.namespace;
        let record = self
            .ctx
            .stores
            .cluster_records
            .get(&kube::runtime::reflector::ObjectRef::new(cluster).within(namespace))?;
        let at = record
            .status
            .as_ref()?
            .kubeconfig
            .as_ref()?
            .certificate_authority_expiry
            .as_ref()?
            .0;
        Some(crate::refresh::band::CaEnd {
            at,
            source: format!(
                "the cluster CA (certificate-authority-data of Secret {namespace}/{})",
                ck8s_certs_api::capi::kubeconfig_secret_name(cluster)
            ),
        })
    }

    /// Starts an automatic renewal: the same operation as a manual refresh, origin Policy.
    pub(super) async fn start_automatic(
        self,
        status: MachineCertificatesStatus,
        renewal: Renewal,
    ) -> Result<Action, Error> {
        let node = self.view.node_name.clone().unwrap_or_default();
        let Renewal {
            policy,
            ttl: wanted,
            matched_window,
            bypassed_windows,
            gated: _,
        } = renewal;
        // A policy's ttl outside the band, or past the cluster CA's end, is brought into it,
        // and said so: refusing would leave the certificates to expire.
        let (banded, outside) = self.ctx.config().band.clamp(wanted);
        let mut notes: Vec<String> = outside
            .map(|why| {
                format!("CertificateRenewalPolicy {policy} asks for {wanted}, but {why}: {banded} was asked for")
            })
            .into_iter()
            .collect();
        let ttl = match self
            .cluster_ca_end()
            .map(|ca| ca.clamp(banded, self.ctx.clock.now()))
        {
            Some(Ok((ttl, cut))) => {
                notes.extend(cut);
                ttl
            }
            // Nothing a refresh signs can outlast the CA: renewed as asked, and said so.
            Some(Err(why)) => {
                notes.push(why);
                banded
            }
            None => banded,
        };
        let note = (!notes.is_empty()).then(|| notes.join("; "));
        let announcement = match &note {
            Some(note) => format!(
                "Renewing the certificates of node {node} for {ttl}, as CertificateRenewalPolicy {policy} requires ({note})"
            ),
            None => format!(
                "Renewing the certificates of node {node} for {ttl}, as CertificateRenewalPolicy {policy} requires"
            ),
        };
        let op = Operation {
            matched_window,
            bypassed_windows,
            note,
            ..Operation::pending(
                Origin::Policy,
                Some(format!("CertificateRenewalPolicy/{policy}")),
                None,
                ttl.to_string(),
                ttl.as_seconds(),
                Time(self.ctx.clock.now()),
            )
        };
        self.announce_and_execute(status, op, announcement).await
    }

    /// Takes the refresh up: shows the Machine in-progress, naming the request that will carry
    /// it (one already named is kept: a refresh restarted before it reached the node), with an
    /// Event; then runs the operation. The write is conditional on the Machine as read, so a
    /// cache behind or two instances never name two requests.
    async fn announce_and_execute(
        self,
        status: MachineCertificatesStatus,
        mut op: Operation,
        announcement: String,
    ) -> Result<Action, Error> {
        if self.ctx.stop.is_cancelled() {
            return Ok(Action::await_change());
        }
        op.started_at = after_last(op.started_at, status.operation.as_ref());
        let request = self.requests.name(&op);
        let Some(view) = self.take_up(&op, &request).await? else {
            info!("The Machine changed before the refresh was taken up; looking again");
            return Ok(Action::requeue(crate::controllers::shard::RECHECK));
        };
        // The final patch releases the block-move this one set: it must see it.
        let announced = Act::new(
            self.ctx,
            self.machine,
            &view,
            self.cluster.clone(),
            self.report.reference,
            self.report.generation,
            self.report.seen,
        );
        announced
            .report
            .event(EventType::Normal, events::REFRESH_IN_PROGRESS, announcement)
            .await;
        if op.bypassed_windows
            && let Some(bypass) = &status.last_window_bypass
        {
            // Said once the renewal is taken up: a take-up tried again says nothing twice.
            announced
                .report
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
        let role = super::observe::role(&view);
        announced.execute(status, op, false, role).await
    }

    /// Shows the Machine in-progress, naming `request`, on the condition that the Machine did
    /// not change since read (a cache behind, or another instance, would otherwise take a refresh
    /// up twice); when it did (our own write earlier in this reconcile,
    /// a cache behind, or another instance), it is read again and taken up as it is now, unless
    /// it no longer asks for this refresh (another request named, another trigger). Returns the
    /// Machine as announced; `None`: not taken up, look again.
    async fn take_up(&self, op: &Operation, request: &str) -> Result<Option<MachineView>, Error> {
        let mut view = self.view.clone();
        let mut version = self.machine.meta().resource_version.clone();
        let machines: kube::Api<ck8s_certs_api::machine::Machine> = kube::Api::namespaced_with(
            self.ctx.client().clone(),
            &view.namespace,
            &self.ctx.capi(),
        );
        for _ in 0..2 {
            let announce = MachineChanges {
                status: Some(RefreshStatus::InProgress),
                request: Some(request),
                unchanged_since: version.as_deref(),
                ..Default::default()
            };
            match self.report.apply_machine_patch(&view, &announce).await {
                Ok(()) => return Ok(Some(patched(&view, &announce))),
                Err(kube::Error::Api(status)) if status.code == 409 || status.code == 422 => {
                    let Some(fresh) = machines.get_opt(&self.view.name).await? else {
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
    use super::super::journal;
    use super::*;

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

    fn fleet(
        phase: Option<RequestPhase>,
        machine: &str,
        entry: MachinePhase,
    ) -> CertificateRefresh {
        let mut request: CertificateRefresh = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "store-1" },
            "spec": { "target": { "cluster": "c" }, "ttl": "1y", "origin": "Manual" },
            "status": { "machines": [{ "name": machine, "role": "Worker", "phase": "Pending" }] }
        }))
        .unwrap();
        let status = request.status.as_mut().unwrap();
        status.phase = phase;
        status.machines[0].phase = entry;
        request
    }

    #[test]
    fn a_fleet_mark_is_believed_only_from_a_running_request_that_handed_the_machine_over() {
        let running = Some(RequestPhase::Running);
        assert!(handed_over(
            Some(&fleet(running, "w0", MachinePhase::Running)),
            "w0"
        ));
        // Someone else's request, or one that has not handed this Machine over.
        assert!(!handed_over(
            Some(&fleet(running, "w1", MachinePhase::Running)),
            "w0"
        ));
        assert!(!handed_over(
            Some(&fleet(running, "w0", MachinePhase::Pending)),
            "w0"
        ));
        assert!(!handed_over(
            Some(&fleet(running, "w0", MachinePhase::Succeeded)),
            "w0"
        ));
        // Finished, gone, or never started.
        let done = Some(RequestPhase::Succeeded);
        assert!(!handed_over(
            Some(&fleet(done, "w0", MachinePhase::Running)),
            "w0"
        ));
        assert!(!handed_over(None, "w0"));
        let mut fresh = fleet(running, "w0", MachinePhase::Running);
        fresh.status = None;
        assert!(!handed_over(Some(&fresh), "w0"));
    }

    #[test]
    fn a_mark_not_believed_leaves_the_refresh_to_its_trigger_author() {
        let mut view = MachineView {
            name: "w0".into(),
            trigger_manager: Some("kubectl-annotate".into()),
            ..Default::default()
        };
        view.annotations
            .insert(FLEET_REQUEST.into(), "store-1".into());
        view.annotations.insert(REQUESTER.into(), "mallory".into());
        let believed = Asked::of(&view, true);
        assert_eq!(believed.fleet.as_deref(), Some("store-1"));
        assert_eq!(believed.requester, None, "the fleet request names its own");
        assert_eq!(
            believed.requested_by.as_deref(),
            Some("CertificateRefresh/store-1")
        );
        let forged = Asked::of(&view, false);
        assert_eq!(forged.fleet, None);
        assert_eq!(
            forged.requester.map(|r| r.username).as_deref(),
            Some("mallory")
        );
        assert_eq!(forged.requested_by.as_deref(), Some("kubectl-annotate"));
    }
}
