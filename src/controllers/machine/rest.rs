//! A Machine at rest: what it shows when nothing is carried out on its node (paused, no node yet,
//! its Cluster missing, a trigger refused, or up to date under its renewal policy). Pure: the
//! reconcile compares the plan with what the caches hold, and a Machine whose plan shows what is
//! already there costs no request at all.

use std::time::Duration;

use crate::events::EventType;
use ck8s_certs_api::annotations::{
    REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS, RefreshStatus,
};
use ck8s_certs_api::capi::{BLOCK_MOVE_ANNOTATION, BLOCK_MOVE_OWNER};
use ck8s_certs_api::machine::{ClusterView, MachineView};
use ck8s_certs_api::machine_certificates::MachineCertificatesStatus;
use ck8s_certs_api::reasons::{condition_reasons as why, conditions, events};
use jiff::Timestamp;

use super::step::Step;
use super::verdict::{self, VerdictMetric, VerdictNext, VerdictPlan};
use crate::controllers::governing_policy::Governing;
use crate::controllers::patches::set_condition;

/// When a Machine at rest is looked at again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    /// When something it is watched through changes.
    Change,
    /// After this long (or on a change).
    Requeue(Duration),
}

/// What the renewal verdict is computed from, besides the Machine.
pub struct Renewals<'a> {
    pub governing: &'a Governing,
    pub settings: crate::policy::spec::Settings,
    /// The re-check period of idle Machines.
    pub resync: Duration,
    /// The cluster's closed pre-flight gate, if any (asked only of a due renewal).
    pub gate: &'a (dyn Fn() -> Option<super::gates::Gate> + Sync),
}

/// What settling a Machine at rest writes and says.
#[derive(Clone, Debug, PartialEq)]
pub struct Settled {
    /// The status it shows.
    pub status: MachineCertificatesStatus,
    /// Our annotations on the Machine to change: the in-progress mark of a refused trigger, a
    /// block-move of a refresh that never started.
    pub machine: Option<MachineMark>,
    pub event: Option<(EventType, &'static str, String)>,
    pub metric: Option<VerdictMetric>,
    /// What comes next besides a look again: what the policy says (a renewal, a replacement).
    pub next: Option<verdict::Then>,
    pub after: After,
}

/// What settling a Machine at rest from the caches would write, and what it was computed from:
/// written once the API server shows the same (the pass that computed it writes it).
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    pub step: Step,
    /// The status digest and the Cluster it was computed from.
    pub digest: u64,
    pub cluster: Option<ClusterView>,
    pub settled: Settled,
}

/// A change of our annotations that settling a Machine makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MachineMark {
    /// Show the refresh failed (a refused trigger marked in-progress by the admission webhook),
    /// releasing its block-move when it holds one.
    Refused { release_move: bool },
    /// Release the block-move of a refresh that was announced but never started on the node.
    ReleaseMove,
}

impl Settled {
    /// Whether settling writes nothing: what `current` already shows.
    pub fn quiet(&self, current: &MachineCertificatesStatus) -> bool {
        self.status == *current
            && self.machine.is_none()
            && self.event.is_none()
            && self.next.is_none()
    }
}

/// The settled state of a Machine at rest for `step`, or `None` when `step` is not one of rest
/// (it starts, continues or records a refresh, or reads the node).
pub fn settle(
    step: &Step,
    machine: &MachineView,
    cluster: Option<&ClusterView>,
    status: &MachineCertificatesStatus,
    renewals: &Renewals<'_>,
    now: Timestamp,
) -> Option<Settled> {
    let mut shown = status.clone();
    if !matches!(step, Step::Reapplied { .. } | Step::Ignore) {
        clear_refusal(&mut shown, now);
    }
    let ready = |mut shown: MachineCertificatesStatus, reason: &str, message: String| {
        set_condition(&mut shown, conditions::READY, false, reason, message, now);
        shown
    };
    let settled = |status, machine, after| Settled {
        status,
        machine,
        event: None,
        metric: None,
        next: None,
        after,
    };
    let holds_move = machine.annotation(BLOCK_MOVE_ANNOTATION) == Some(BLOCK_MOVE_OWNER);
    Some(match step {
        Step::Ignore => settled(shown, None, After::Change),
        Step::ClusterMissing => {
            let message = format!(
                "Cluster {} not found in namespace {}",
                machine.cluster.as_deref().unwrap_or("<unset>"),
                machine.namespace
            );
            let status = ready(shown, why::EXPIRY_UNKNOWN, message);
            settled(status, None, After::Requeue(renewals.resync))
        }
        Step::Paused => {
            // Announced but not started on the node: nothing for a move to wait for.
            let release = holds_move.then_some(MachineMark::ReleaseMove);
            let message = if cluster.is_some_and(|c| c.paused) {
                "The Cluster is paused: no certificate work until it is resumed"
            } else {
                "The Machine is paused (annotation cluster.x-k8s.io/paused): no certificate work until it is removed"
            };
            let status = ready(shown, why::PAUSED, message.into());
            settled(status, release, After::Change)
        }
        Step::WaitForNode => {
            let message = "Waiting for the Machine's node (status.nodeRef)".into();
            settled(ready(shown, why::NO_NODE, message), None, After::Change)
        }
        Step::Reapplied { trigger, manager } => {
            let message = reapplied_message(machine, trigger, manager);
            // Marked in progress by the admission webhook when it was applied again.
            let mark = (machine.annotation(REFRESH_CERTIFICATES_STATUS)
                == Some(RefreshStatus::InProgress.as_str()))
            .then_some(MachineMark::Refused {
                release_move: holds_move,
            });
            set_condition(
                &mut shown,
                conditions::TRIGGER_REFUSED,
                true,
                why::REAPPLIED,
                message.clone(),
                now,
            );
            // Said once, when the refusal is first shown; nothing is written again while the
            // trigger stays.
            let event = (shown != *status).then_some((
                EventType::Warning,
                events::REFRESH_REFUSED,
                message,
            ));
            Settled {
                event,
                ..settled(shown, mark, After::Change)
            }
        }
        Step::Idle => {
            let VerdictPlan {
                status,
                event,
                metric,
                next,
            } = verdict::plan(
                machine,
                &shown,
                renewals.governing,
                renewals.settings,
                renewals.resync,
                renewals.gate,
                now,
            );
            let (next, after) = match next {
                VerdictNext::Requeue(after) => (None, After::Requeue(after)),
                VerdictNext::Renew(renewal) => (Some(verdict::Then::Renew(renewal)), After::Change),
                VerdictNext::Replace(replacement) => {
                    (Some(verdict::Then::Replace(replacement)), After::Change)
                }
            };
            Settled {
                status,
                machine: None,
                event,
                metric,
                next,
                after,
            }
        }
        Step::Withdrawn
        | Step::Record(_)
        | Step::Start { .. }
        | Step::Continue(_)
        | Step::Resume(_)
        | Step::SyncExpiry
        | Step::ReadExpiry => return None,
    })
}

/// Ends a refusal ([`Step::Reapplied`]) once its trigger is gone or changed.
pub fn clear_refusal(status: &mut MachineCertificatesStatus, now: Timestamp) {
    let refused = status
        .conditions
        .iter()
        .any(|c| c.type_ == conditions::TRIGGER_REFUSED && c.status == "True");
    if refused {
        set_condition(
            status,
            conditions::TRIGGER_REFUSED,
            false,
            why::IDLE,
            "No trigger is refused".into(),
            now,
        );
    }
}

/// Why a trigger its owner applies again is refused (see [`Step::Reapplied`]): the trigger is
/// left where it is (removing it would only make the owner apply it again, and the next removal
/// again), the Machine no longer shows it in progress, and the `TriggerRefused` condition and
/// one Event say where it comes from.
fn reapplied_message(machine: &MachineView, trigger: &str, manager: &str) -> String {
    format!(
        "Not refreshed again: {REFRESH_CERTIFICATES}={trigger} is applied again by {manager} (server-side apply) after the refresh it asked for finished, so every refresh would ask for the next. It comes from an owner that asserts it: a MachineDeployment's or MachineSet's spec.template.metadata.annotations (Cluster API copies them onto each Machine), ClusterClass topology metadata, or a GitOps tool. Remove it there. To refresh the Machines of a MachineDeployment, annotate the MachineDeployment itself: kubectl annotate machinedeployment -n {} <name> {REFRESH_CERTIFICATES}={trigger}",
        machine.namespace
    )
}
