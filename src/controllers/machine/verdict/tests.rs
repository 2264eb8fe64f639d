//! The verdict plan, one row per shape of policy and status: what the status shows, what is
//! announced and counted, and what comes next.

use std::sync::Arc;

use ck8s_certs_api::machine_certificates::RenewalStatus;
use ck8s_certs_api::renewal_policy::CertificateRenewalPolicySpec;
use serde_json::json;

use super::*;
use crate::controllers::governing_policy::PolicyInfo;
use crate::policy::spec::{Settings, validate};
use crate::testing::{assert_contains, assert_starts_with};

const DAY: i64 = 86_400;
/// A Wednesday, 12:00 UTC.
const NOW: &str = "2026-11-25T12:00:00Z";
const RESYNC: Duration = Duration::from_secs(36_000);

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

fn machine(control_plane: bool) -> MachineView {
    MachineView {
        namespace: "ns".into(),
        name: "m".into(),
        control_plane,
        ..Default::default()
    }
}

fn policy(spec: serde_json::Value) -> Governing {
    let mut spec = spec;
    spec["machineSelector"] = json!({});
    let spec: CertificateRenewalPolicySpec = serde_json::from_value(spec).unwrap();
    let valid = validate(&spec).unwrap();
    Governing::One {
        info: PolicyInfo::of_spec("p", &spec),
        policy: Ok(Arc::new(valid)),
    }
}

fn unreadable() -> Governing {
    Governing::One {
        info: PolicyInfo {
            name: "p".into(),
            generation: Some(1),
            mode: None,
            windows: None,
            halted_since: None,
            canaries_since: None,
        },
        policy: Err("spec.ttl: not a duration".into()),
    }
}

/// A status whose certificates expire `days` from now (none: unknown), with `failures`
/// automatic failures, the last ten minutes ago.
fn status(days: Option<i64>, failures: Option<i64>) -> MachineCertificatesStatus {
    MachineCertificatesStatus {
        expiry: days.map(|d| Time(now() + jiff::SignedDuration::from_secs(d * DAY))),
        failed_attempts: failures,
        last_failure_time: failures.map(|_| Time(now() - jiff::SignedDuration::from_mins(10))),
        ..Default::default()
    }
}

/// `status` after a refresh that ended InPlaceImpossible.
fn must_be_replaced(mut status: MachineCertificatesStatus) -> MachineCertificatesStatus {
    crate::controllers::patches::set_condition(
        &mut status,
        conditions::READY,
        false,
        why::IN_PLACE_IMPOSSIBLE,
        "The node cannot be refreshed in place".into(),
        now(),
    );
    status
}

/// The plan at [`NOW`], with the default settings and resync period, no gate closed.
fn planned(
    machine: &MachineView,
    status: &MachineCertificatesStatus,
    governing: &Governing,
) -> VerdictPlan {
    gated(machine, status, governing, &|| None)
}

/// [`planned`], with `gate` telling which pre-flight gate is closed.
fn gated(
    machine: &MachineView,
    status: &MachineCertificatesStatus,
    governing: &Governing,
    gate: &(dyn Fn() -> Option<super::super::gates::Gate> + Sync),
) -> VerdictPlan {
    plan(
        machine,
        status,
        governing,
        Settings::default(),
        RESYNC,
        gate,
        now(),
    )
}

/// What a row expects.
#[derive(Debug, PartialEq)]
struct Seen {
    reason: Option<String>,
    conditions: Vec<String>,
    event: Option<(EventType, &'static str)>,
    metric: Option<VerdictMetric>,
    /// `Some((bypassed, in a window))` for a renewal.
    renew: Option<(bool, bool)>,
    /// A replacement is asked for.
    replace: bool,
    changed: bool,
}

fn seen(plan: &VerdictPlan, before: &MachineCertificatesStatus) -> Seen {
    Seen {
        reason: plan.status.renewal.as_ref().map(|r| r.reason.clone()),
        conditions: plan
            .status
            .conditions
            .iter()
            .map(|c| c.type_.clone())
            .collect(),
        event: plan.event.as_ref().map(|(t, r, _)| (*t, *r)),
        metric: plan.metric.clone(),
        renew: match &plan.next {
            VerdictNext::Renew(r) => Some((r.bypassed_windows, r.matched_window.is_some())),
            VerdictNext::Requeue(_) | VerdictNext::Replace(_) => None,
        },
        replace: matches!(plan.next, VerdictNext::Replace(_)),
        changed: plan.status != *before,
    }
}

fn expect(
    reason: Option<&str>,
    conditions: &[&str],
    event: Option<(EventType, &'static str)>,
    metric: Option<VerdictMetric>,
    renew: Option<(bool, bool)>,
    changed: bool,
) -> Seen {
    Seen {
        reason: reason.map(str::to_owned),
        conditions: conditions.iter().map(|c| (*c).to_owned()).collect(),
        event,
        metric,
        renew,
        replace: false,
        changed,
    }
}

/// Nothing shown, announced or counted; `changed`: a verdict shown before is taken away.
fn nothing(changed: bool) -> Seen {
    expect(None, &[], None, None, None, changed)
}

/// The policy cannot be used: shown, warned of and counted.
fn config_invalid() -> Seen {
    expect(
        Some(CONFIG_INVALID),
        &[conditions::RENEWAL_CONFIG_INVALID],
        Some((EventType::Warning, events::RENEWAL_CONFIG_INVALID)),
        Some(VerdictMetric::Invalid(CONFIG_INVALID.into())),
        None,
        true,
    )
}

/// Not due, with `conditions`: the renewal is scheduled.
fn not_due(conditions: &[&str]) -> Seen {
    let scheduled = Some((EventType::Normal, events::RENEWAL_SCHEDULED));
    expect(Some("NotDue"), conditions, scheduled, None, None, true)
}

/// Renewed now, announced when taken up: `(bypassed, in a window)`.
fn renew_now(conditions: &[&str], renew: (bool, bool)) -> Seen {
    expect(Some("RenewNow"), conditions, None, None, Some(renew), true)
}

/// A due renewal held back for `reason`, announced as `kind`.
fn deferred(reason: &str, kind: EventType) -> Seen {
    expect(
        Some(reason),
        &[conditions::RENEWAL_DEFERRED],
        Some((kind, events::RENEWAL_DEFERRED)),
        Some(VerdictMetric::Deferred(reason.into())),
        None,
        true,
    )
}

/// Disabled, announced as `kind`.
fn disabled(kind: EventType) -> Seen {
    let disabled = Some((kind, events::RENEWAL_DISABLED));
    expect(
        Some("Disabled"),
        &[conditions::RENEWAL_DISABLED],
        disabled,
        None,
        None,
        true,
    )
}

#[test]
fn every_verdict_shape_plans_its_status_announcement_metric_and_next_step() {
    use EventType::{Normal, Warning};
    let automatic = json!({"policy": "Automatic", "renewBefore": "30d"});
    let scheduled_sunday = json!({
        "policy": "Scheduled", "renewBefore": "30d", "failSafeMargin": "2d",
        "windows": [{"daysOfWeek": ["Sunday"], "start": "01:00", "end": "03:00"}],
    });
    let scheduled_now = json!({
        "policy": "Scheduled", "renewBefore": "30d",
        "windows": [{"start": "11:00", "end": "13:00"}],
    });
    let short_ttl = json!({"policy": "Automatic", "ttl": "5m", "renewBefore": "1m"});
    let ignored_windows = json!({
        "policy": "Automatic", "renewBefore": "30d",
        "windows": [{"start": "01:00", "end": "02:00"}],
    });
    let shown_renewal = MachineCertificatesStatus {
        renewal: Some(RenewalStatus {
            reason: "NotDue".into(),
            ..Default::default()
        }),
        ..status(Some(300), None)
    };
    let not_due_far = status(Some(300), None);
    let due = status(Some(10), None);
    let rows: Vec<(&str, bool, MachineCertificatesStatus, Governing, Seen)> = vec![
        (
            "no policy, nothing shown",
            true,
            not_due_far.clone(),
            Governing::None,
            nothing(false),
        ),
        (
            "no policy any more: the old verdict goes, unannounced",
            true,
            shown_renewal,
            Governing::None,
            nothing(true),
        ),
        (
            "two policies select the Machine",
            true,
            not_due_far.clone(),
            Governing::Conflict(vec!["a".into(), "b".into()]),
            config_invalid(),
        ),
        (
            "a policy that cannot be read",
            true,
            not_due_far.clone(),
            unreadable(),
            config_invalid(),
        ),
        (
            "a TTL no worker CSR can carry",
            false,
            not_due_far.clone(),
            policy(short_ttl.clone()),
            config_invalid(),
        ),
        (
            "the same TTL on a control plane is fine",
            true,
            not_due_far.clone(),
            policy(short_ttl),
            not_due(&[]),
        ),
        (
            "not due: scheduled, no condition",
            true,
            not_due_far.clone(),
            policy(automatic.clone()),
            not_due(&[]),
        ),
        (
            "due: renew now, announced when taken up",
            true,
            due.clone(),
            policy(automatic.clone()),
            renew_now(&[], (false, false)),
        ),
        (
            "expiry not known yet: nothing to show",
            true,
            status(None, None),
            policy(automatic.clone()),
            nothing(false),
        ),
        (
            "due 20 days ago, a failure ten minutes ago: backing off, and overdue",
            true,
            status(Some(10), Some(1)),
            policy(automatic.clone()),
            Seen {
                conditions: vec![
                    conditions::RENEWAL_DEFERRED.into(),
                    conditions::RENEWAL_OVERDUE.into(),
                ],
                ..deferred("Backoff", Normal)
            },
        ),
        (
            "disabled",
            true,
            not_due_far.clone(),
            policy(json!({"policy": "Disabled"})),
            disabled(Normal),
        ),
        (
            "disabled inside the fail-safe margin: a warning",
            true,
            status(Some(0), None),
            policy(json!({"policy": "Disabled"})),
            disabled(Warning),
        ),
        (
            "due since yesterday, outside its window: deferred until it opens",
            true,
            status(Some(29), None),
            policy(scheduled_sunday.clone()),
            deferred("OutsideWindow", Normal),
        ),
        (
            "outside its window inside the fail-safe: the windows are bypassed",
            true,
            status(Some(1), None),
            policy(scheduled_sunday),
            renew_now(&[conditions::RENEWAL_WINDOW_BYPASSED], (true, false)),
        ),
        (
            "due inside its window: renewed in it",
            true,
            due,
            policy(scheduled_now),
            renew_now(&[], (false, true)),
        ),
        (
            "Automatic with windows: they are ignored, and said so",
            true,
            not_due_far.clone(),
            policy(ignored_windows),
            not_due(&[conditions::WINDOWS_IGNORED]),
        ),
        (
            "expired, but its last refresh found it cannot be refreshed in place: held, overdue",
            false,
            must_be_replaced(status(Some(-1), Some(1))),
            policy(automatic.clone()),
            expect(
                Some(why::IN_PLACE_IMPOSSIBLE),
                &[
                    conditions::READY,
                    conditions::RENEWAL_DEFERRED,
                    conditions::RENEWAL_OVERDUE,
                ],
                Some((Warning, events::RENEWAL_DEFERRED)),
                Some(VerdictMetric::Deferred(why::IN_PLACE_IMPOSSIBLE.into())),
                None,
                true,
            ),
        ),
        (
            "not due, and cannot be refreshed in place: nothing to hold yet",
            false,
            must_be_replaced(not_due_far),
            policy(automatic),
            not_due(&[conditions::READY]),
        ),
    ];
    assert!(rows.len() >= 15);
    for (name, control_plane, before, governing, expected) in rows {
        let machine = machine(control_plane);
        let plan = planned(&machine, &before, &governing);
        assert_eq!(seen(&plan, &before), expected, "{name}");
        // Shown once, the same verdict again writes and says nothing.
        let again = planned(&machine, &plan.status, &governing);
        assert_eq!(again.status, plan.status, "{name}: again");
        assert_eq!(
            (&again.event, &again.metric),
            (&None, &None),
            "{name}: again"
        );
        let renews = matches!(plan.next, VerdictNext::Renew(_) | VerdictNext::Replace(_));
        assert_eq!(again.quiet(&plan.status), !renews, "{name}: quiet");
    }
}

#[test]
fn a_verdict_looks_again_when_its_answer_can_change_within_the_resync_period() {
    let machine = machine(true);
    let governing = policy(json!({"policy": "Automatic", "renewBefore": "30d"}));
    // Due in 270 days: looked at again after the resync period.
    let far = planned(&machine, &status(Some(300), None), &governing);
    assert_eq!(far.next, VerdictNext::Requeue(RESYNC));
    // Due in an hour: looked at again then.
    let soon = MachineCertificatesStatus {
        expiry: Some(Time(now() + jiff::SignedDuration::from_hours(30 * 24 + 1))),
        ..Default::default()
    };
    let plan = planned(&machine, &soon, &governing);
    assert_eq!(plan.next, VerdictNext::Requeue(Duration::from_secs(3_600)));
}

#[test]
fn a_worker_that_must_be_replaced_is_replaced_when_its_policy_says_so() {
    let replacing = json!({
        "policy": "Automatic", "renewBefore": "30d",
        "inPlaceImpossible": {"action": "Replace", "maxUnavailable": "50%"},
    });
    let lost = must_be_replaced(status(Some(-1), Some(1)));
    let plan = planned(&machine(false), &lost, &policy(replacing.clone()));
    assert_eq!(
        plan.next,
        VerdictNext::Replace(Replacement {
            policy: "p".into(),
            max_unavailable: crate::policy::spec::MaxUnavailable::Percent(50),
        })
    );
    let renewal = plan.status.renewal.as_ref().unwrap();
    assert_eq!(renewal.reason, why::IN_PLACE_IMPOSSIBLE);
    assert_contains(
        &renewal.message,
        "CertificateRenewalPolicy p replaces it (inPlaceImpossible: Replace)",
    );
    // Not due: nothing to replace (yet).
    let far = must_be_replaced(status(Some(300), None));
    let plan = planned(&machine(false), &far, &policy(replacing));
    assert!(
        matches!(plan.next, VerdictNext::Requeue(_)),
        "{:?}",
        plan.next
    );
}

#[test]
fn a_closed_gate_holds_a_due_renewal_until_the_fail_safe_point() {
    use super::super::gates::Gate;
    let automatic = policy(json!({"policy": "Automatic", "renewBefore": "30d"}));
    let upgrading = || Some(Gate::InPlaceUpgrade("w-1".into()));
    // Due in 10 days' time: held, and said so.
    let due = status(Some(10), None);
    let held = gated(&machine(true), &due, &automatic, &upgrading);
    let renewal = held.status.renewal.as_ref().unwrap();
    assert_eq!(renewal.reason, "InPlaceUpgrade");
    assert_starts_with(
        &renewal.message,
        "Renewal due, held while Machine w-1 of the cluster is being upgraded in place (gate InPlaceUpgrade): it starts once that ends, and at the fail-safe point ",
    );
    assert_eq!(
        held.metric,
        Some(VerdictMetric::Deferred("InPlaceUpgrade".into()))
    );
    assert_eq!(held.next, VerdictNext::Requeue(GATE_RECHECK));
    assert!(
        held.status
            .conditions
            .iter()
            .any(|c| c.type_ == conditions::RENEWAL_DEFERRED && c.reason == "InPlaceUpgrade")
    );
    // Held again: nothing to write or say.
    let again = gated(&machine(true), &held.status, &automatic, &upgrading);
    assert!(again.quiet(&held.status));
    // The gate opens: renewed.
    let open = planned(&machine(true), &held.status, &automatic);
    assert!(
        matches!(open.next, VerdictNext::Renew(_)),
        "{:?}",
        open.next
    );
    // Inside the fail-safe margin (and so for certificates that expired): the gate is passed.
    for days in [0, -3] {
        let near = MachineCertificatesStatus {
            expiry: Some(Time(
                now() + jiff::SignedDuration::from_hours(days * 24 + 12),
            )),
            ..Default::default()
        };
        let plan = gated(&machine(true), &near, &automatic, &upgrading);
        assert!(
            matches!(plan.next, VerdictNext::Renew(_)),
            "{days}: {:?}",
            plan.next
        );
    }
    // Not due: the gate is not even asked.
    let asked = std::sync::atomic::AtomicBool::new(false);
    let asking = || {
        asked.store(true, std::sync::atomic::Ordering::Relaxed);
        upgrading()
    };
    let _ = gated(
        &machine(true),
        &status(Some(300), None),
        &automatic,
        &asking,
    );
    assert!(!asked.load(std::sync::atomic::Ordering::Relaxed));
}

#[test]
fn a_renewal_more_than_a_day_past_its_planned_instant_is_overdue() {
    use super::super::gates::Gate;
    let automatic = policy(json!({"policy": "Automatic", "renewBefore": "30d"}));
    let overdue = |plan: &VerdictPlan| {
        plan.status
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::RENEWAL_OVERDUE)
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let hours = |h: i64| jiff::SignedDuration::from_hours(h);
    // Due 20 hours ago, six failures (the next try 32 hours after the last): not overdue yet,
    // and looked at again when it turns so (in 4 hours), not at the end of the backoff.
    let failing = |due_ago: i64| MachineCertificatesStatus {
        expiry: Some(Time(now() + hours(30 * 24 - due_ago))),
        failed_attempts: Some(6),
        last_failure_time: Some(Time(now() - jiff::SignedDuration::from_mins(10))),
        ..Default::default()
    };
    let plan = planned(&machine(true), &failing(20), &automatic);
    assert_eq!(overdue(&plan), None);
    assert_eq!(
        plan.next,
        VerdictNext::Requeue(Duration::from_secs(4 * 3600))
    );
    // Due 20 days ago: overdue, held by its backoff, since the day after it was due.
    let plan = planned(&machine(true), &failing(20 * 24), &automatic);
    let due = now() - hours(20 * 24);
    assert_eq!(
        overdue(&plan),
        Some((
            "Backoff".into(),
            format!(
                "The renewal planned for {due} has not happened: more than a day late, held by Backoff"
            )
        ))
    );
    // Held by a gate: the gate is what holds it.
    let upgrading = || Some(Gate::InPlaceUpgrade("w-1".into()));
    let held = gated(
        &machine(true),
        &status(Some(10), None),
        &automatic,
        &upgrading,
    );
    assert_eq!(
        overdue(&held).map(|(reason, _)| reason).as_deref(),
        Some("InPlaceUpgrade")
    );
    // Renewing now: no longer overdue.
    let renewing = planned(&machine(true), &held.status, &automatic);
    assert!(matches!(renewing.next, VerdictNext::Renew(_)));
    assert_eq!(overdue(&renewing), None);
    // With windows the plan is the first window after the due time: due 30 hours ago (Tuesday
    // 06:00 UTC) under a daily 02:00-04:00 window, planned for Wednesday 02:00, overdue only
    // from Thursday 02:00.
    let nightly = policy(json!({
        "policy": "Scheduled", "renewBefore": "30d",
        "windows": [{ "start": "02:00", "end": "04:00", "timezone": "UTC" }],
    }));
    let missed = MachineCertificatesStatus {
        expiry: Some(Time(now() + hours(30 * 24 - 30))),
        ..Default::default()
    };
    let plan = planned(&machine(true), &missed, &nightly);
    assert_eq!(
        plan.status.renewal.as_ref().map(|r| r.reason.as_str()),
        Some("OutsideWindow")
    );
    assert_eq!(overdue(&plan), None);
}
