//! What the Machine reconciler should do next: a pure function of the Machine, its Cluster, its
//! `MachineCertificates` status and the operation of the request the Machine names as in
//! flight. The reconciler only executes the answer.
//!
//! Order matters: an operation already in flight is finished before anything new starts, so a
//! crash or restart never leaves the status `in-progress` and never starts a second flow.

use ck8s_certs_api::annotations::{
    CERTIFICATES_EXPIRY, REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS, REFRESH_REQUEST,
    RefreshStatus,
};
use ck8s_certs_api::capi::PAUSED_ANNOTATION;
use ck8s_certs_api::machine::{ClusterView, MachineView};
use ck8s_certs_api::machine_certificates::{MachineCertificatesStatus, Operation, Phase};

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Not a CK8s Machine, or being deleted: nothing of ours to do.
    Ignore,
    /// The Machine's Cluster is not there (yet).
    ClusterMissing,
    /// The Cluster or the Machine itself (`cluster.x-k8s.io/paused`) is paused: nothing new
    /// starts. (An operation already on the node is still finished and shown: it holds
    /// clusterctl's block-move, and a move waits for it.)
    Paused,
    /// No node yet: nothing to talk to.
    WaitForNode,
    /// An operation was interrupted after `plan` (seed recorded): continue it.
    Resume(Operation),
    /// An operation finished but the Machine does not show it yet (crash before the patch).
    Record(Operation),
    /// The Machine says in-progress, but there is neither a trigger nor an operation: the request
    /// was withdrawn before anything happened on the node.
    Withdrawn,
    /// A refresh was requested.
    Start { trigger: String },
    /// The trigger is the one the last refresh was for, applied again by the same owner through
    /// server-side apply (a machine template that Cluster API copies onto the Machine, a GitOps
    /// tool): an owner that re-asserts it would make every refresh ask for the next. Refused,
    /// saying where it comes from.
    Reapplied { trigger: String, manager: String },
    /// A refresh this process took up waits (for its cluster, its node) before its first seed:
    /// go on with it, without taking it up again.
    Continue(Operation),
    /// The Machine's expiry annotation differs from what we know.
    SyncExpiry,
    /// The expiry is not known yet: ask k8sd.
    ReadExpiry,
    /// Everything is up to date.
    Idle,
}

/// `request` is the operation in the status of the `CertificateRefresh` the Machine names as in
/// flight (the journal of the refresh); `status.operation` is the copy of the last finished one
/// (or, written by an older version, one still in flight).
pub fn decide(
    machine: &MachineView,
    cluster: Option<&ClusterView>,
    status: Option<&MachineCertificatesStatus>,
    request: Option<&Operation>,
) -> Step {
    decide_waiting(machine, cluster, status, request, None)
}

/// [`decide`], knowing `waiting`: the operation this process took up for the request the
/// Machine names, waiting before its first seed (nothing of it is journaled).
pub fn decide_waiting(
    machine: &MachineView,
    cluster: Option<&ClusterView>,
    status: Option<&MachineCertificatesStatus>,
    request: Option<&Operation>,
    waiting: Option<&Operation>,
) -> Step {
    if !machine.is_ck8s() || machine.deleting {
        return Step::Ignore;
    }
    let Some(cluster) = cluster else {
        return Step::ClusterMissing;
    };
    let step = match waiting {
        // Still asked for as it was taken up (the same trigger, or none for a policy's), and
        // still shown in progress.
        Some(op)
            if request.is_none_or(|r| !r.is_finished())
                && machine.annotation(REFRESH_CERTIFICATES_STATUS)
                    == Some(RefreshStatus::InProgress.as_str())
                && machine.annotation(REFRESH_CERTIFICATES) == op.trigger.as_deref()
                && machine.node_name.is_some() =>
        {
            match request.filter(|r| !r.is_finished()) {
                Some(journaled) => Step::Resume(journaled.clone()),
                None => Step::Continue(op.clone()),
            }
        }
        _ => decide_unpaused(machine, status, request),
    };
    let paused = cluster.paused || machine.annotation(PAUSED_ANNOTATION).is_some();
    if paused && !matches!(step, Step::Resume(_) | Step::Record(_)) {
        return Step::Paused;
    }
    step
}

fn decide_unpaused(
    machine: &MachineView,
    status: Option<&MachineCertificatesStatus>,
    request: Option<&Operation>,
) -> Step {
    let last = status.and_then(|s| s.operation.as_ref());
    let unfinished = |op: &&Operation| !op.is_finished();
    if let Some(op) = request.filter(unfinished).or(last.filter(unfinished)) {
        return match op.phase {
            // Not persisted by this version (its seed is); an older one wrote a Pending op as
            // the carrier's claim, before `plan`, which has no side effects: start over like a
            // fresh request.
            Phase::Pending => Step::Start {
                trigger: op.trigger.clone().unwrap_or_else(|| op.ttl.clone()),
            },
            _ => Step::Resume(op.clone()),
        };
    }
    // The last finished operation: the request's (the journal) before its copy.
    let operation = request.or(last);
    if machine.node_name.is_none() {
        return Step::WaitForNode;
    }
    let trigger = machine.annotation(REFRESH_CERTIFICATES);
    let in_progress =
        machine.annotation(REFRESH_CERTIFICATES_STATUS) == Some(RefreshStatus::InProgress.as_str());
    if let Some(trigger) = trigger {
        // The trigger we already acted on, still there while the Machine says in-progress: the
        // final patch did not land. Anything else (a new value, or the same value re-added after
        // we removed it) is a new request.
        // With the admission webhook, every request carries its own name: the same TTL
        // requested again after a refresh is a new request.
        if let Some(op) = operation
            && op.is_finished()
            && in_progress
            && op.trigger.as_deref() == Some(trigger)
            && op.request.as_deref() == machine.annotation(REFRESH_REQUEST)
        {
            return Step::Record(op.clone());
        }
        if let Some(op) = operation
            && op.is_finished()
            && op.trigger.as_deref() == Some(trigger)
            && machine.trigger_applied
            && let Some(manager) = machine.trigger_manager.as_deref()
            && op.requested_by.as_deref() == Some(manager)
        {
            return Step::Reapplied {
                trigger: trigger.to_owned(),
                manager: manager.to_owned(),
            };
        }
        return Step::Start {
            trigger: trigger.to_owned(),
        };
    }
    if in_progress {
        // in-progress without a trigger: either our final patch half-landed or the user removed
        // the trigger mid-way; the last operation (if any) has the answer.
        return match operation {
            Some(op) => Step::Record(op.clone()),
            None => Step::Withdrawn,
        };
    }
    let known = status.and_then(|s| s.expiry.as_ref());
    match (known, machine.annotation(CERTIFICATES_EXPIRY)) {
        (None, _) => Step::ReadExpiry,
        (Some(expiry), annotated)
            if annotated != Some(crate::controllers::patches::rfc3339(expiry).as_str()) =>
        {
            Step::SyncExpiry
        }
        _ => Step::Idle,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use jiff::Timestamp;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use ck8s_certs_api::machine_certificates::Origin;

    use crate::controllers::machine::testing::{machine, op};

    /// A Machine that asks for a refresh of `ttl`, accepted by the webhook.
    fn asking(ttl: &str) -> MachineView {
        machine(&[
            (REFRESH_CERTIFICATES, ttl),
            (REFRESH_CERTIFICATES_STATUS, "in-progress"),
        ])
    }

    /// The expiry known, nothing in flight.
    fn known() -> MachineCertificatesStatus {
        status(None, Some(EXPIRY))
    }

    fn status(operation: Option<&Operation>, expiry: Option<i64>) -> MachineCertificatesStatus {
        MachineCertificatesStatus {
            operation: operation.cloned(),
            expiry: expiry.map(|s| Time(Timestamp::from_second(s).unwrap())),
            ..Default::default()
        }
    }

    const LIVE: ClusterView = ClusterView {
        labels: BTreeMap::new(),
        paused: false,
        endpoint_host: None,
    };
    const EXPIRY: i64 = 1_900_000_000;
    const EXPIRY_TEXT: &str = "2030-03-17T17:46:40Z";

    #[test]
    fn foreign_deleting_paused_and_nodeless_machines_are_left_alone() {
        let mut foreign = machine(&[(REFRESH_CERTIFICATES, "1y")]);
        foreign.bootstrap_kind = Some("KubeadmConfig".into());
        assert_eq!(decide(&foreign, Some(&LIVE), None, None), Step::Ignore);

        let mut deleting = machine(&[(REFRESH_CERTIFICATES, "1y")]);
        deleting.deleting = true;
        assert_eq!(decide(&deleting, Some(&LIVE), None, None), Step::Ignore);

        let paused = ClusterView {
            labels: BTreeMap::new(),
            paused: true,
            endpoint_host: None,
        };
        assert_eq!(
            decide(
                &machine(&[(REFRESH_CERTIFICATES, "1y")]),
                Some(&paused),
                None,
                None
            ),
            Step::Paused
        );
        assert_eq!(
            decide(&machine(&[]), None, None, None),
            Step::ClusterMissing
        );

        let mut nodeless = machine(&[(REFRESH_CERTIFICATES, "1y")]);
        nodeless.node_name = None;
        assert_eq!(
            decide(&nodeless, Some(&LIVE), None, None),
            Step::WaitForNode
        );
    }

    #[test]
    fn a_waiting_refresh_goes_on_without_being_taken_up_again_while_still_asked_for() {
        let asked = asking("1y");
        let waiting = Operation {
            seed: None,
            phase: Phase::Pending,
            run_attempts: 0,
            ..op(Phase::Pending, "1y")
        };
        let decide = |m: &MachineView, cluster: &ClusterView, request: Option<&Operation>| {
            decide_waiting(m, Some(cluster), None, request, Some(&waiting))
        };
        assert_eq!(decide(&asked, &LIVE, None), Step::Continue(waiting.clone()));
        // Its seed journaled since: the journal goes on.
        let running = op(Phase::Running, "1y");
        assert_eq!(
            decide(&asked, &LIVE, Some(&running)),
            Step::Resume(running.clone())
        );
        // Another TTL asked meanwhile: a new request.
        let changed = asking("30d");
        assert_eq!(
            decide(&changed, &LIVE, None),
            Step::Start {
                trigger: "30d".into()
            }
        );
        // Withdrawn: nothing happened on the node.
        let withdrawn = machine(&[(REFRESH_CERTIFICATES_STATUS, "in-progress")]);
        assert_eq!(decide(&withdrawn, &LIVE, None), Step::Withdrawn);
        // Paused meanwhile: nothing new starts.
        let paused = ClusterView {
            paused: true,
            ..LIVE
        };
        assert_eq!(decide(&asked, &paused, None), Step::Paused);

        // A policy's renewal (no trigger) goes on the same way.
        let renewal = Operation {
            trigger: None,
            origin: Origin::Policy,
            ..waiting.clone()
        };
        let shown = machine(&[(REFRESH_CERTIFICATES_STATUS, "in-progress")]);
        assert_eq!(
            decide_waiting(&shown, Some(&LIVE), None, None, Some(&renewal)),
            Step::Continue(renewal.clone())
        );
    }

    #[test]
    fn a_trigger_its_owner_applies_again_after_the_refresh_is_refused_not_refreshed() {
        let applied = |trigger: &str, manager: &str, in_progress: bool| {
            let mut pairs = vec![(REFRESH_CERTIFICATES, trigger)];
            if in_progress {
                // The admission webhook marks a new trigger in-progress, naming a new request.
                pairs.push((REFRESH_CERTIFICATES_STATUS, "in-progress"));
                pairs.push((REFRESH_REQUEST, "r2"));
            }
            MachineView {
                trigger_manager: Some(manager.into()),
                trigger_applied: true,
                ..machine(&pairs)
            }
        };
        let last = Operation {
            requested_by: Some("capi-machineset".into()),
            ..op(Phase::Succeeded, "1y")
        };
        let done = status(Some(&last), Some(EXPIRY));
        let reapplied = Step::Reapplied {
            trigger: "1y".into(),
            manager: "capi-machineset".into(),
        };
        for in_progress in [false, true] {
            assert_eq!(
                decide(
                    &applied("1y", "capi-machineset", in_progress),
                    Some(&LIVE),
                    Some(&done),
                    None
                ),
                reapplied,
                "webhook: {in_progress}"
            );
        }
        // Another value, another owner, or a plain annotate (an update, not an apply): a new
        // request.
        for machine in [
            applied("30d", "capi-machineset", false),
            applied("1y", "argocd-controller", false),
            MachineView {
                trigger_applied: false,
                ..applied("1y", "capi-machineset", false)
            },
        ] {
            assert!(
                matches!(
                    decide(&machine, Some(&LIVE), Some(&done), None),
                    Step::Start { .. }
                ),
                "{machine:?}"
            );
        }
        // Our own final patch that did not land is still recorded, not refused.
        let unshown = MachineView {
            trigger_manager: Some("capi-machineset".into()),
            trigger_applied: true,
            ..asking("1y")
        };
        assert_eq!(
            decide(&unshown, Some(&LIVE), Some(&done), None),
            Step::Record(last)
        );
    }

    #[test]
    fn a_paused_machine_starts_nothing_and_finishes_what_runs_on_the_node() {
        let paused = |extra: &[(&str, &str)]| {
            let mut pairs = vec![(PAUSED_ANNOTATION, "")];
            pairs.extend_from_slice(extra);
            machine(&pairs)
        };
        assert_eq!(
            decide(
                &paused(&[(REFRESH_CERTIFICATES, "1y")]),
                Some(&LIVE),
                None,
                None
            ),
            Step::Paused
        );
        // Nor an expiry read or an automatic renewal.
        assert_eq!(decide(&paused(&[]), Some(&LIVE), None, None), Step::Paused);
        let m = paused(&[
            (REFRESH_CERTIFICATES, "1y"),
            (REFRESH_CERTIFICATES_STATUS, "in-progress"),
        ]);
        let running = op(Phase::Running, "1y");
        assert_eq!(
            decide(&m, Some(&LIVE), None, Some(&running)),
            Step::Resume(running)
        );
        let done = op(Phase::Succeeded, "1y");
        assert_eq!(
            decide(&m, Some(&LIVE), None, Some(&done)),
            Step::Record(done)
        );
    }

    #[test]
    fn a_paused_cluster_finishes_what_runs_on_the_node_and_starts_nothing() {
        let paused = ClusterView {
            labels: BTreeMap::new(),
            paused: true,
            endpoint_host: None,
        };
        let m = asking("1y");
        // Past `plan`: the node is mid-refresh, and block-move holds a move until it ends.
        let running = op(Phase::Running, "1y");
        assert_eq!(
            decide(&m, Some(&paused), Some(&status(Some(&running), None)), None),
            Step::Resume(running)
        );
        // Finished, not yet shown on the Machine: shown (which releases block-move).
        let done = op(Phase::Succeeded, "1y");
        assert_eq!(
            decide(&m, Some(&paused), Some(&status(Some(&done), None)), None),
            Step::Record(done)
        );
        // Only claimed (nothing ran on the node): it waits for the Cluster to be resumed.
        let pending = op(Phase::Pending, "1y");
        assert_eq!(
            decide(&m, Some(&paused), Some(&status(Some(&pending), None)), None),
            Step::Paused
        );
        // At rest: nothing to do, paused or not.
        let idle = machine(&[(CERTIFICATES_EXPIRY, EXPIRY_TEXT)]);
        assert_eq!(
            decide(&idle, Some(&paused), Some(&known()), None),
            Step::Paused
        );
    }

    #[test]
    fn an_interrupted_run_is_resumed_before_anything_else() {
        let running = op(Phase::Running, "1y");
        let m = asking("90d");
        assert_eq!(
            decide(&m, Some(&LIVE), Some(&status(Some(&running), None)), None),
            Step::Resume(running)
        );
    }

    #[test]
    fn a_finished_operation_whose_patch_did_not_land_is_recorded_not_repeated() {
        let done = op(Phase::Succeeded, "1y");
        let m = asking("1y");
        let finished = status(Some(&done), Some(EXPIRY));
        assert_eq!(
            decide(&m, Some(&LIVE), Some(&finished), None),
            Step::Record(done)
        );
    }

    #[test]
    fn the_same_ttl_requested_again_through_the_webhook_is_a_new_request() {
        // The webhook writes in-progress together with the trigger and names each request.
        let done = Operation {
            request: Some("uid-1".into()),
            ..op(Phase::Succeeded, "1y")
        };
        let st = status(Some(&done), Some(EXPIRY));
        let annotated = |request| {
            machine(&[
                (REFRESH_CERTIFICATES, "1y"),
                (REFRESH_CERTIFICATES_STATUS, "in-progress"),
                (REFRESH_REQUEST, request),
            ])
        };
        assert_eq!(
            decide(&annotated("uid-2"), Some(&LIVE), Some(&st), None),
            Step::Start {
                trigger: "1y".into()
            }
        );
        assert_eq!(
            decide(&annotated("uid-1"), Some(&LIVE), Some(&st), None),
            Step::Record(done),
            "the same request whose final patch did not land"
        );
    }

    #[test]
    fn a_new_or_re_added_trigger_starts_a_refresh() {
        let done = op(Phase::Succeeded, "1y");
        let st = status(Some(&done), Some(EXPIRY));
        // Another value while the last one was being handled.
        let changed = asking("90d");
        assert_eq!(
            decide(&changed, Some(&LIVE), Some(&st), None),
            Step::Start {
                trigger: "90d".into()
            }
        );
        // The same value added again after the last refresh finished.
        let again = machine(&[
            (REFRESH_CERTIFICATES, "1y"),
            (REFRESH_CERTIFICATES_STATUS, "done"),
        ]);
        assert_eq!(
            decide(&again, Some(&LIVE), Some(&st), None),
            Step::Start {
                trigger: "1y".into()
            }
        );
        // First request ever.
        assert_eq!(
            decide(
                &machine(&[(REFRESH_CERTIFICATES, "1y")]),
                Some(&LIVE),
                None,
                None
            ),
            Step::Start {
                trigger: "1y".into()
            }
        );
    }

    #[test]
    fn in_progress_without_a_trigger_is_settled() {
        let m = machine(&[(REFRESH_CERTIFICATES_STATUS, "in-progress")]);
        assert_eq!(decide(&m, Some(&LIVE), None, None), Step::Withdrawn);
        let done = op_with(Phase::Succeeded);
        let finished = status(Some(&done), Some(EXPIRY));
        assert_eq!(
            decide(&m, Some(&LIVE), Some(&finished), None),
            Step::Record(done)
        );
    }

    fn op_with(phase: Phase) -> Operation {
        op(phase, "1y")
    }

    #[test]
    fn the_expiry_is_read_then_kept_in_sync() {
        assert_eq!(
            decide(&machine(&[]), Some(&LIVE), None, None),
            Step::ReadExpiry
        );
        assert_eq!(
            decide(&machine(&[]), Some(&LIVE), Some(&known()), None),
            Step::SyncExpiry
        );
        let synced = machine(&[(CERTIFICATES_EXPIRY, EXPIRY_TEXT)]);
        assert_eq!(
            decide(&synced, Some(&LIVE), Some(&known()), None),
            Step::Idle
        );
        let finished = status(Some(&op_with(Phase::Failed)), Some(EXPIRY));
        assert_eq!(
            decide(&synced, Some(&LIVE), Some(&finished), None),
            Step::Idle
        );
    }

    #[test]
    fn the_request_named_by_the_machine_is_the_journal() {
        let m = asking("1y");
        let mut last = op(Phase::Succeeded, "90d");
        last.started_at = Time(Timestamp::from_second(1).unwrap());
        let copy = status(Some(&last), Some(EXPIRY));
        // Running in the request: resumed, whatever the copy in the status says.
        let running = op(Phase::Running, "1y");
        assert_eq!(
            decide(&m, Some(&LIVE), Some(&copy), Some(&running)),
            Step::Resume(running.clone())
        );
        // Also on a paused Cluster: it is on the node, and a move waits for it.
        let paused = ClusterView {
            paused: true,
            ..LIVE
        };
        assert_eq!(
            decide(&m, Some(&paused), Some(&copy), Some(&running)),
            Step::Resume(running)
        );
        // Finished in the request, not yet in the status nor on the Machine: recorded from the
        // request, never run again.
        let done = op(Phase::Succeeded, "1y");
        assert_eq!(
            decide(&m, Some(&LIVE), Some(&copy), Some(&done)),
            Step::Record(done.clone())
        );
        // The same without the trigger (a policy renewal): recorded from the request.
        let policy = machine(&[(REFRESH_CERTIFICATES_STATUS, "in-progress")]);
        assert_eq!(
            decide(&policy, Some(&LIVE), Some(&copy), Some(&done)),
            Step::Record(done)
        );
        // A request without an operation yet (nothing was sent): the trigger starts over.
        assert_eq!(
            decide(&m, Some(&LIVE), Some(&copy), None),
            Step::Start {
                trigger: "1y".into()
            }
        );
    }
}
