//! Automatic renewal: the governing policy's verdict for a Machine, as a pure plan. The plan says
//! what the status shows (written only when it differs), what is announced and counted when the
//! verdict changed, and what comes next: a look again exactly when the answer can change, or a
//! renewal now.

use std::time::Duration;

use crate::events::EventType;
use ck8s_certs_api::machine::MachineView;
use ck8s_certs_api::machine_certificates::{
    MachineCertificatesStatus, RenewalStatus, WindowBypass,
};
use ck8s_certs_api::reasons::{condition_reasons as why, conditions, events};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::gates::Gate;
use crate::controllers::governing_policy::{
    CONFIG_INVALID, Governing, PolicyInfo, Verdict, describe_window, with_verdict,
};
use crate::policy::spec::ValidPolicy;
use crate::policy::{Decision, DeferReason, Deferral, RenewReason, Ttl};
use crate::refresh::trigger::{renew_now_hint, with_hint};

/// How soon a renewal held by a closed gate looks again: the gates are other objects' state,
/// whose changes do not wake this Machine.
pub const GATE_RECHECK: Duration = Duration::from_secs(30);

/// What the verdict amounts to for one Machine at one moment.
#[derive(Debug, PartialEq)]
pub struct VerdictPlan {
    /// The status showing the verdict: equal to the status given when nothing changed.
    pub status: MachineCertificatesStatus,
    /// Announced once the status is written, when the verdict changed.
    pub event: Option<(EventType, &'static str, String)>,
    /// Counted when the verdict changed.
    pub metric: Option<VerdictMetric>,
    pub next: VerdictNext,
}

/// A changed verdict's counter (its label is the verdict's reason).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VerdictMetric {
    Deferred(String),
    Invalid(String),
}

#[derive(Clone, Debug, PartialEq)]
pub enum VerdictNext {
    /// Look again after this long (or when something changes).
    Requeue(Duration),
    /// Renew now, as the policy says.
    Renew(Renewal),
    /// Replace the Machine (it cannot be refreshed in place), as the policy says, when its
    /// cluster allows it.
    Replace(Replacement),
}

/// What the verdict asks for besides a look again.
#[derive(Clone, Debug, PartialEq)]
pub enum Then {
    Renew(Renewal),
    Replace(Replacement),
}

/// A replacement the verdict asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct Replacement {
    pub policy: String,
    pub max_unavailable: crate::policy::spec::MaxUnavailable,
}

/// An automatic renewal the verdict asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct Renewal {
    pub policy: String,
    pub ttl: Ttl,
    /// The window it renews in, described.
    pub matched_window: Option<String>,
    /// Its windows were bypassed by the fail-safe (announced once it is taken up).
    pub bypassed_windows: bool,
    /// Before the fail-safe point: the pre-flight gates the workload cluster shows still hold
    /// it (asked right before it starts).
    pub gated: bool,
}

impl VerdictPlan {
    /// Whether carrying the plan out writes nothing.
    pub fn quiet(&self, current: &MachineCertificatesStatus) -> bool {
        self.status == *current && matches!(self.next, VerdictNext::Requeue(_))
    }
}

/// The verdict of `governing` for `machine` at `now`, given its status. `resync` bounds every
/// requeue.
pub fn plan(
    machine: &MachineView,
    status: &MachineCertificatesStatus,
    governing: &Governing,
    settings: crate::policy::spec::Settings,
    resync: Duration,
    gate: &(dyn Fn() -> Option<Gate> + Sync),
    now: Timestamp,
) -> VerdictPlan {
    let default_ttl = ck8s_certs_api::renewal_policy::DEFAULT_TTL.to_string();
    let hint = |ttl: &str| renew_now_hint(machine, ttl);
    let invalid_event = (EventType::Warning, events::RENEWAL_CONFIG_INVALID);
    let shown = |verdict: Verdict, announce: Option<(EventType, &'static str)>, after| {
        shown(status, verdict, announce, VerdictNext::Requeue(after), now)
    };
    let (info, policy) = match governing {
        Governing::None => return shown(Verdict::none(), None, resync),
        Governing::Conflict(names) => {
            let message = format!(
                "CertificateRenewalPolicies {} all select this Machine; no automatic renewal until exactly one does (adjust their selectors)",
                names.join(", ")
            );
            let verdict = Verdict::conflict(names.clone(), with_hint(message, &hint(&default_ttl)));
            return shown(verdict, Some(invalid_event), resync);
        }
        Governing::One { info, policy } => (info, policy),
    };
    let invalid = |message: String, ttl: &str| invalid(info, machine, message, ttl);
    let policy = match policy {
        Ok(policy) => policy,
        Err(message) => {
            return shown(
                invalid(message.clone(), &default_ttl),
                Some(invalid_event),
                resync,
            );
        }
    };
    if !machine.control_plane
        && let Err(err) = policy.ttl.check_worker()
    {
        let message = format!(
            "CertificateRenewalPolicy {} cannot renew this worker: {err}",
            info.name
        );
        return shown(invalid(message, &default_ttl), Some(invalid_event), resync);
    }
    decided(machine, status, info, policy, settings, resync, gate, now)
}

/// The verdict of one usable `policy`: its decision shown, and what comes of it.
#[allow(clippy::too_many_arguments)]
fn decided(
    machine: &MachineView,
    status: &MachineCertificatesStatus,
    info: &PolicyInfo,
    policy: &ValidPolicy,
    settings: crate::policy::spec::Settings,
    resync: Duration,
    gate: &(dyn Fn() -> Option<Gate> + Sync),
    now: Timestamp,
) -> VerdictPlan {
    let ttl = policy.ttl.to_string();
    let hinted = |message: String| with_hint(message, &renew_now_hint(machine, &ttl));
    let input = |failures| {
        policy
            .input(status.expiry.as_ref().map(|t| t.0), failures, settings)
            // For renewBeforePercentage: when the certificates now served were issued.
            .with_lifetime_start(crate::policy::lifetime_start(status))
            // Its place in the policy's spread: the UID stays the same for the Machine's life.
            .with_stagger_key(machine.uid.as_deref())
    };
    let decision = crate::policy::decide(
        &input(crate::policy::Failures {
            count: status.failed_attempts,
            last_failure: status.last_failure_time.as_ref().map(|t| t.0),
        }),
        now,
    );
    // When the renewal turns overdue: a day after the instant the policy alone planned it for
    // (its due time into the windows and the spread, as if nothing had failed or held it).
    let overdue_at = due_at(&decision).filter(|due| *due <= now).map(|due| {
        match crate::policy::decide(&input(Default::default()), due) {
            Decision::Defer(deferral) => deferral.until + OVERDUE_AFTER,
            _ => due + OVERDUE_AFTER,
        }
    });
    let shown = |verdict: Verdict, announce: Option<(EventType, &'static str)>, after| {
        let next = VerdictNext::Requeue(until_overdue(after, overdue_at, now));
        shown(
            status,
            overdue(verdict, overdue_at, now),
            announce,
            next,
            now,
        )
    };
    let requeue = requeue_after(&decision, now, resync);
    let message = decision.to_string();
    let windows_ignored = |verdict: Verdict| windows_ignored(&decision, verdict);
    let severity = severity(&decision);
    match &decision {
        // Its last refresh found it cannot be refreshed in place: renewing it again would fail
        // the same way (one `plan` and one `run` per backoff step, for ever), and a backoff
        // would say it will be tried again.
        Decision::RenewNow(_)
        | Decision::Defer(Deferral {
            reason: DeferReason::Backoff,
            ..
        }) if must_be_replaced(status) => {
            in_place_impossible(machine, status, info, policy, resync, overdue_at, now)
        }
        Decision::NoExpiry { .. } => VerdictPlan {
            status: status.clone(),
            event: None,
            metric: None,
            next: VerdictNext::Requeue(resync),
        },
        // The policy's circuit breaker is open: nothing automatic starts, fail-safe or not (its
        // renewals fail; a person looks first), until a person resumes the policy. Its own
        // status lists the failures; a resume wakes its Machines.
        Decision::RenewNow(_) if let Some(since) = info.halted_since => shown(
            windows_ignored(halted(machine, info, since, &hinted)),
            Some((EventType::Warning, events::RENEWAL_DEFERRED)),
            resync,
        ),
        // A closed gate holds a due renewal until it opens, or until the fail-safe point (as a
        // closed window would): asked only now, since finding it scans the cluster's objects.
        Decision::RenewNow(renewal)
            if now < renewal.fail_safe_at
                && let Some(gate) = gate() =>
        {
            let (verdict, after) = held(info, &gate, renewal.fail_safe_at, &hinted, now);
            shown(
                windows_ignored(verdict),
                Some((EventType::Normal, events::RENEWAL_DEFERRED)),
                after,
            )
        }
        Decision::RenewNow(renewal) => {
            let verdict = windows_ignored(Verdict::new(
                info,
                "RenewNow",
                Some(now),
                message.clone(),
                None,
            ));
            renew_now(status, info, policy, renewal, verdict, message, now)
        }
        Decision::Defer(deferral) => {
            let (verdict, announce) = deferred(info, deferral, hinted(message), severity);
            shown(windows_ignored(verdict), Some(announce), requeue)
        }
        Decision::Disabled { .. } => {
            let verdict = Verdict::new(
                info,
                "Disabled",
                None,
                hinted(message),
                Some(conditions::RENEWAL_DISABLED),
            );
            let announce = (severity, events::RENEWAL_DISABLED);
            shown(windows_ignored(verdict), Some(announce), requeue)
        }
        Decision::Invalid { .. } => {
            let verdict = invalid(info, machine, message, &ttl);
            let announce = (EventType::Warning, events::RENEWAL_CONFIG_INVALID);
            shown(verdict, Some(announce), resync)
        }
    }
}

/// The type of the Event announcing `decision`.
fn severity(decision: &Decision) -> EventType {
    match decision.is_warning() {
        true => EventType::Warning,
        false => EventType::Normal,
    }
}

/// `verdict`, with the condition saying the policy's windows are ignored when `decision` says so.
fn windows_ignored(decision: &Decision, verdict: Verdict) -> Verdict {
    if decision.windows_ignored() {
        verdict.with(
            conditions::WINDOWS_IGNORED,
            "Automatic",
            crate::policy::decision::WINDOWS_IGNORED_MESSAGE.to_owned(),
        )
    } else {
        verdict
    }
}

/// A due renewal held while the circuit breaker of its policy is open (since `since`).
fn halted(
    machine: &MachineView,
    info: &PolicyInfo,
    since: Timestamp,
    hinted: &dyn Fn(String) -> String,
) -> Verdict {
    let message = format!(
        "Renewal due, held: the circuit breaker of CertificateRenewalPolicy {} is open since {since} (automatic renewals failed too often; its RenewalsHalted condition lists them). Once the cause is fixed, resume it with `kubectl ck8s-certs resume -n {} {}`",
        info.name, machine.namespace, info.name,
    );
    Verdict::new(
        info,
        why::RENEWALS_HALTED,
        None,
        hinted(message),
        Some(conditions::RENEWAL_DEFERRED),
    )
}

/// A due renewal held by a closed `gate` until it opens or the fail-safe point comes: its
/// verdict (`hinted` adds how to renew now) and how soon to look again.
fn held(
    info: &PolicyInfo,
    gate: &Gate,
    fail_safe_at: Timestamp,
    hinted: &dyn Fn(String) -> String,
    now: Timestamp,
) -> (Verdict, Duration) {
    let message = format!(
        "Renewal due, held while {gate} (gate {}): it starts once that ends, and at the fail-safe point {fail_safe_at} at the latest",
        gate.reason(),
    );
    let verdict = Verdict::new(
        info,
        gate.reason(),
        Some(fail_safe_at),
        hinted(message),
        Some(conditions::RENEWAL_DEFERRED),
    );
    let after = Duration::try_from(fail_safe_at.duration_since(now))
        .unwrap_or_default()
        .clamp(Duration::from_secs(1), GATE_RECHECK);
    (verdict, after)
}

/// A renewal due now: `verdict` shown, and the renewal asked for. A fail-safe bypass of the
/// windows is kept in the status (with its condition) until a later refresh succeeds, and
/// announced (Event, metric) once the renewal is taken up.
fn renew_now(
    status: &MachineCertificatesStatus,
    info: &PolicyInfo,
    policy: &ValidPolicy,
    renewal: &crate::policy::Renewal,
    verdict: Verdict,
    message: String,
    now: Timestamp,
) -> VerdictPlan {
    let bypassed_windows = renewal.reason == RenewReason::FailSafeBypass;
    let mut current = status.clone();
    if bypassed_windows {
        current.last_window_bypass = Some(WindowBypass {
            time: Time(now),
            expiry: status.expiry.clone(),
            message,
        });
    }
    VerdictPlan {
        status: with_verdict(&current, &verdict, now),
        event: None,
        metric: None,
        next: VerdictNext::Renew(Renewal {
            policy: info.name.clone(),
            ttl: policy.ttl,
            matched_window: renewal
                .window
                .map(|index| describe_window(&policy.windows, index)),
            bypassed_windows,
            gated: now < renewal.fail_safe_at,
        }),
    }
}

/// A worker whose last refresh found it cannot be refreshed in place: held (and said so) until
/// a refresh succeeds (a person renewed kubelet.conf on the node, then asked) or the Machine is
/// replaced (a new Machine has a record of its own), by the policy when it says Replace.
fn in_place_impossible(
    machine: &MachineView,
    status: &MachineCertificatesStatus,
    info: &PolicyInfo,
    policy: &ValidPolicy,
    resync: Duration,
    overdue_at: Option<Timestamp>,
    now: Timestamp,
) -> VerdictPlan {
    let found = "Not renewed automatically: its last refresh found that the node cannot be refreshed in place (its kubelet.conf expired, so the API server refuses the CSRs it creates)";
    let message = match policy.replace {
        Some(_) => format!(
            "{found}. CertificateRenewalPolicy {} replaces it (inPlaceImpossible: Replace): the Machine is deleted, so that its MachineSet creates a new one, once the cluster's control planes were refreshed, one Machine of the cluster at a time",
            info.name
        ),
        None => format!(
            "{found}. Replace the Machine: `kubectl delete machine -n {} {}` (a Machine of a MachineSet is created again); or renew kubelet.conf on the node by hand, then ask for a refresh",
            machine.namespace, machine.name
        ),
    };
    let verdict = Verdict::new(
        info,
        why::IN_PLACE_IMPOSSIBLE,
        None,
        with_hint(message, &renew_now_hint(machine, &policy.ttl.to_string())),
        Some(conditions::RENEWAL_DEFERRED),
    );
    let next = match policy.replace {
        Some(max_unavailable) => VerdictNext::Replace(Replacement {
            policy: info.name.clone(),
            max_unavailable,
        }),
        None => VerdictNext::Requeue(resync),
    };
    let announce = Some((EventType::Warning, events::RENEWAL_DEFERRED));
    shown(
        status,
        overdue(verdict, overdue_at, now),
        announce,
        next,
        now,
    )
}

/// How late a renewal may be, past the instant its policy planned it for, before it is said
/// to be overdue.
pub const OVERDUE_AFTER: jiff::SignedDuration = jiff::SignedDuration::from_hours(24);

/// When `decision` found the renewal due.
fn due_at(decision: &Decision) -> Option<Timestamp> {
    match decision {
        Decision::RenewNow(renewal) => Some(renewal.due_at),
        Decision::Defer(deferral) => Some(deferral.due_at),
        Decision::NoExpiry { .. } | Decision::Disabled { .. } | Decision::Invalid { .. } => None,
    }
}

/// The verdict of a deferral, and how it is announced. Not due is the healthy steady state: no
/// condition, and a Normal Event saying when the next renewal is. Anything else holds back a due
/// renewal (announced as `severity`).
fn deferred(
    info: &PolicyInfo,
    deferral: &Deferral,
    message: String,
    severity: EventType,
) -> (Verdict, (EventType, &'static str)) {
    let (condition, announce) = if deferral.reason == DeferReason::NotDue {
        (None, (EventType::Normal, events::RENEWAL_SCHEDULED))
    } else {
        (
            Some(conditions::RENEWAL_DEFERRED),
            (severity, events::RENEWAL_DEFERRED),
        )
    };
    let verdict = Verdict::new(
        info,
        deferral.reason.as_str(),
        Some(deferral.until),
        message,
        condition,
    );
    (verdict, announce)
}

/// `after`, or sooner when the renewal turns overdue before (looked at again then).
fn until_overdue(after: Duration, overdue_at: Option<Timestamp>, now: Timestamp) -> Duration {
    match overdue_at.map(|at| at.duration_since(now)) {
        Some(until) if until.is_positive() => after.min(Duration::try_from(until).unwrap_or(after)),
        _ => after,
    }
}

/// `verdict`, with the condition saying the renewal is overdue once `now` reached `overdue_at`
/// (its reason the verdict's: what holds it).
fn overdue(verdict: Verdict, overdue_at: Option<Timestamp>, now: Timestamp) -> Verdict {
    let Some(at) = overdue_at.filter(|at| *at <= now) else {
        return verdict;
    };
    let reason = verdict
        .renewal
        .as_ref()
        .map(|r| r.reason.clone())
        .unwrap_or_default();
    let message = format!(
        "The renewal planned for {} has not happened: more than a day late, held by {reason}",
        at - OVERDUE_AFTER
    );
    verdict.with(conditions::RENEWAL_OVERDUE, &reason, message)
}

/// Whether the Machine's last refresh ended InPlaceImpossible (`Ready` says so until a refresh
/// succeeds).
fn must_be_replaced(status: &MachineCertificatesStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == conditions::READY && c.reason == why::IN_PLACE_IMPOSSIBLE)
}

/// When the answer of `decision` can change, from `now`, at most `resync` later.
fn requeue_after(decision: &Decision, now: Timestamp, resync: Duration) -> Duration {
    crate::policy::requeue_at(decision)
        .map(|at| {
            Duration::try_from(at.duration_since(now))
                .unwrap_or_default()
                .max(Duration::from_millis(100))
        })
        .map_or(resync, |d| d.min(resync))
}

/// The verdict of a policy that cannot renew this Machine: `message`, then how to renew now
/// (for `ttl`).
fn invalid(info: &PolicyInfo, machine: &MachineView, message: String, ttl: &str) -> Verdict {
    Verdict::new(
        info,
        CONFIG_INVALID,
        None,
        with_hint(message, &renew_now_hint(machine, ttl)),
        Some(conditions::RENEWAL_CONFIG_INVALID),
    )
}

/// Shows `verdict`: the status differs from `current` only when the verdict does; a changed
/// verdict is announced with `announce` and counted. A new generation of the same policy with
/// the same outcome is recorded, not announced.
fn shown(
    current: &MachineCertificatesStatus,
    verdict: Verdict,
    announce: Option<(EventType, &'static str)>,
    next: VerdictNext,
    now: Timestamp,
) -> VerdictPlan {
    let status = with_verdict(current, &verdict, now);
    fn said(r: &RenewalStatus) -> (&String, &String, &Option<Time>) {
        (&r.reason, &r.message, &r.next_renewal_time)
    }
    let changed = verdict
        .renewal
        .as_ref()
        .filter(|renewal| current.renewal.as_ref().map(said) != Some(said(renewal)));
    let (event, metric) = match changed {
        None => (None, None),
        Some(renewal) => {
            let reason = renewal.reason.clone();
            let metric = match verdict.conditions.first().map(|(type_, _, _)| *type_) {
                Some(conditions::RENEWAL_DEFERRED) => Some(VerdictMetric::Deferred(reason)),
                Some(conditions::RENEWAL_CONFIG_INVALID) => Some(VerdictMetric::Invalid(reason)),
                _ => None,
            };
            let event = announce.map(|(type_, why)| (type_, why, renewal.message.clone()));
            (event, metric)
        }
    };
    VerdictPlan {
        status,
        event,
        metric,
        next,
    }
}

#[cfg(test)]
mod gates_property;
#[cfg(test)]
mod tests;
