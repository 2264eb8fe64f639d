//! The verdict plan, one row per shape of policy and status: what the status shows, what is
//! announced and counted, and what comes next.

use std::sync::Arc;

use ck8s_certs_api::machine_certificates::RenewalStatus;
use ck8s_certs_api::renewal_policy::CertificateRenewalPolicySpec;
use serde_json::json;

use super::*;
use crate::controllers::governing_policy::{PolicyInfo, windows_status};
use crate::policy::spec::{Settings, validate};

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
        info: PolicyInfo {
            name: "p".into(),
            generation: Some(1),
            mode: Some(spec.policy),
            windows: Some(windows_status(&spec.windows)),
        },
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

#[test]
fn every_verdict_shape_plans_its_status_announcement_metric_and_next_step() {
    use EventType::{Normal, Warning};
    let invalid = Some(VerdictMetric::Invalid(CONFIG_INVALID.into()));
    let config_invalid = [conditions::RENEWAL_CONFIG_INVALID];
    let automatic = json!({"policy": "Automatic", "renewBefore": "30d"});
    let scheduled_sunday = json!({
        "policy": "Scheduled", "renewBefore": "30d", "failSafeMargin": "2d",
        "windows": [{"daysOfWeek": ["Sunday"], "start": "01:00", "end": "03:00"}],
    });
    let scheduled_now = json!({
        "policy": "Scheduled", "renewBefore": "30d",
        "windows": [{"start": "11:00", "end": "13:00"}],
    });
    let shown_renewal = MachineCertificatesStatus {
        renewal: Some(RenewalStatus {
            reason: "NotDue".into(),
            ..Default::default()
        }),
        ..status(Some(300), None)
    };
    let rows: Vec<(&str, bool, MachineCertificatesStatus, Governing, Seen)> = vec![
        (
            "no policy, nothing shown",
            true,
            status(Some(300), None),
            Governing::None,
            expect(None, &[], None, None, None, false),
        ),
        (
            "no policy any more: the old verdict goes, unannounced",
            true,
            shown_renewal,
            Governing::None,
            expect(None, &[], None, None, None, true),
        ),
        (
            "two policies select the Machine",
            true,
            status(Some(300), None),
            Governing::Conflict(vec!["a".into(), "b".into()]),
            expect(
                Some(CONFIG_INVALID),
                &config_invalid,
                Some((Warning, events::RENEWAL_CONFIG_INVALID)),
                invalid.clone(),
                None,
                true,
            ),
        ),
        (
            "a policy that cannot be read",
            true,
            status(Some(300), None),
            unreadable(),
            expect(
                Some(CONFIG_INVALID),
                &config_invalid,
                Some((Warning, events::RENEWAL_CONFIG_INVALID)),
                invalid.clone(),
                None,
                true,
            ),
        ),
        (
            "a TTL no worker CSR can carry",
            false,
            status(Some(300), None),
            policy(json!({"policy": "Automatic", "ttl": "5m", "renewBefore": "1m"})),
            expect(
                Some(CONFIG_INVALID),
                &config_invalid,
                Some((Warning, events::RENEWAL_CONFIG_INVALID)),
                invalid,
                None,
                true,
            ),
        ),
        (
            "the same TTL on a control plane is fine",
            true,
            status(Some(300), None),
            policy(json!({"policy": "Automatic", "ttl": "5m", "renewBefore": "1m"})),
            expect(
                Some("NotDue"),
                &[],
                Some((Normal, events::RENEWAL_SCHEDULED)),
                None,
                None,
                true,
            ),
        ),
        (
            "not due: scheduled, no condition",
            true,
            status(Some(300), None),
            policy(automatic.clone()),
            expect(
                Some("NotDue"),
                &[],
                Some((Normal, events::RENEWAL_SCHEDULED)),
                None,
                None,
                true,
            ),
        ),
        (
            "due: renew now, announced when taken up",
            true,
            status(Some(10), None),
            policy(automatic.clone()),
            expect(
                Some("RenewNow"),
                &[],
                None,
                None,
                Some((false, false)),
                true,
            ),
        ),
        (
            "expiry not known yet: nothing to show",
            true,
            status(None, None),
            policy(automatic.clone()),
            expect(None, &[], None, None, None, false),
        ),
        (
            "due after a failure ten minutes ago: backing off",
            true,
            status(Some(10), Some(1)),
            policy(automatic.clone()),
            expect(
                Some("Backoff"),
                &[conditions::RENEWAL_DEFERRED],
                Some((Normal, events::RENEWAL_DEFERRED)),
                Some(VerdictMetric::Deferred("Backoff".into())),
                None,
                true,
            ),
        ),
        (
            "disabled",
            true,
            status(Some(300), None),
            policy(json!({"policy": "Disabled"})),
            expect(
                Some("Disabled"),
                &[conditions::RENEWAL_DISABLED],
                Some((Normal, events::RENEWAL_DISABLED)),
                None,
                None,
                true,
            ),
        ),
        (
            "disabled inside the fail-safe margin: a warning",
            true,
            status(Some(0), None),
            policy(json!({"policy": "Disabled"})),
            expect(
                Some("Disabled"),
                &[conditions::RENEWAL_DISABLED],
                Some((Warning, events::RENEWAL_DISABLED)),
                None,
                None,
                true,
            ),
        ),
        (
            "due outside its window: deferred until it opens",
            true,
            status(Some(10), None),
            policy(scheduled_sunday.clone()),
            expect(
                Some("OutsideWindow"),
                &[conditions::RENEWAL_DEFERRED],
                Some((Normal, events::RENEWAL_DEFERRED)),
                Some(VerdictMetric::Deferred("OutsideWindow".into())),
                None,
                true,
            ),
        ),
        (
            "outside its window inside the fail-safe: the windows are bypassed",
            true,
            status(Some(1), None),
            policy(scheduled_sunday),
            expect(
                Some("RenewNow"),
                &[conditions::RENEWAL_WINDOW_BYPASSED],
                None,
                None,
                Some((true, false)),
                true,
            ),
        ),
        (
            "due inside its window: renewed in it",
            true,
            status(Some(10), None),
            policy(scheduled_now),
            expect(Some("RenewNow"), &[], None, None, Some((false, true)), true),
        ),
        (
            "Automatic with windows: they are ignored, and said so",
            true,
            status(Some(300), None),
            policy(json!({
                "policy": "Automatic", "renewBefore": "30d",
                "windows": [{"start": "01:00", "end": "02:00"}],
            })),
            expect(
                Some("NotDue"),
                &[conditions::WINDOWS_IGNORED],
                Some((Normal, events::RENEWAL_SCHEDULED)),
                None,
                None,
                true,
            ),
        ),
        (
            "expired, but its last refresh found it cannot be refreshed in place: held",
            false,
            must_be_replaced(status(Some(-1), Some(1))),
            policy(automatic.clone()),
            expect(
                Some(why::IN_PLACE_IMPOSSIBLE),
                &[conditions::READY, conditions::RENEWAL_DEFERRED],
                Some((Warning, events::RENEWAL_DEFERRED)),
                Some(VerdictMetric::Deferred(why::IN_PLACE_IMPOSSIBLE.into())),
                None,
                true,
            ),
        ),
        (
            "not due, and cannot be refreshed in place: nothing to hold yet",
            false,
            must_be_replaced(status(Some(300), None)),
            policy(automatic),
            expect(
                Some("NotDue"),
                &[conditions::READY],
                Some((Normal, events::RENEWAL_SCHEDULED)),
                None,
                None,
                true,
            ),
        ),
    ];
    assert!(rows.len() >= 15);
    let settings = Settings::default();
    for (name, control_plane, before, governing, expected) in rows {
        let machine = machine(control_plane);
        let plan = plan(
            &machine,
            &before,
            &governing,
            settings,
            RESYNC,
            &|| None,
            now(),
        );
        assert_eq!(seen(&plan, &before), expected, "{name}");
        // Shown once, the same verdict again writes and says nothing.
        let again = super::plan(
            &machine,
            &plan.status,
            &governing,
            settings,
            RESYNC,
            &|| None,
            now(),
        );
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
    let settings = Settings::default();
    // Due in 270 days: looked at again after the resync period.
    let far = plan(
        &machine,
        &status(Some(300), None),
        &governing,
        settings,
        RESYNC,
        &|| None,
        now(),
    );
    assert_eq!(far.next, VerdictNext::Requeue(RESYNC));
    // Due in an hour: looked at again then.
    let soon = MachineCertificatesStatus {
        expiry: Some(Time(now() + jiff::SignedDuration::from_hours(30 * 24 + 1))),
        ..Default::default()
    };
    let plan = plan(
        &machine,
        &soon,
        &governing,
        settings,
        RESYNC,
        &|| None,
        now(),
    );
    assert_eq!(plan.next, VerdictNext::Requeue(Duration::from_secs(3_600)));
}

#[test]
fn a_worker_that_must_be_replaced_is_replaced_when_its_policy_says_so() {
    let replacing = json!({
        "policy": "Automatic", "renewBefore": "30d",
        "inPlaceImpossible": {"action": "Replace", "maxUnavailable": "50%"},
    });
    let lost = must_be_replaced(status(Some(-1), Some(1)));
    let plan = plan(
        &machine(false),
        &lost,
        &policy(replacing.clone()),
        Settings::default(),
        RESYNC,
        &|| None,
        now(),
    );
    assert_eq!(
        plan.next,
        VerdictNext::Replace(Replacement {
            policy: "p".into(),
            max_unavailable: crate::policy::spec::MaxUnavailable::Percent(50),
        })
    );
    let renewal = plan.status.renewal.as_ref().unwrap();
    assert_eq!(renewal.reason, why::IN_PLACE_IMPOSSIBLE);
    assert!(
        renewal
            .message
            .contains("CertificateRenewalPolicy p replaces it (inPlaceImpossible: Replace)"),
        "{}",
        renewal.message
    );
    // Not due: nothing to replace (yet).
    let far = must_be_replaced(status(Some(300), None));
    let plan = super::plan(
        &machine(false),
        &far,
        &policy(replacing),
        Settings::default(),
        RESYNC,
        &|| None,
        now(),
    );
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
    let settings = Settings::default();
    // Due in 10 days' time: held, and said so.
    let due = status(Some(10), None);
    let held = plan(
        &machine(true),
        &due,
        &automatic,
        settings,
        RESYNC,
        &upgrading,
        now(),
    );
    let renewal = held.status.renewal.as_ref().unwrap();
    assert_eq!(renewal.reason, "InPlaceUpgrade");
    assert!(
        renewal.message.starts_with(
            "Renewal due, held while Machine w-1 of the cluster is being upgraded in place (gate InPlaceUpgrade): it starts once that ends, and at the fail-safe point "
        ),
        "{}",
        renewal.message
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
    let again = plan(
        &machine(true),
        &held.status,
        &automatic,
        settings,
        RESYNC,
        &upgrading,
        now(),
    );
    assert!(again.quiet(&held.status));
    // The gate opens: renewed.
    let open = plan(
        &machine(true),
        &held.status,
        &automatic,
        settings,
        RESYNC,
        &|| None,
        now(),
    );
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
        let plan = plan(
            &machine(true),
            &near,
            &automatic,
            settings,
            RESYNC,
            &upgrading,
            now(),
        );
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
    let _ = plan(
        &machine(true),
        &status(Some(300), None),
        &automatic,
        settings,
        RESYNC,
        &asking,
        now(),
    );
    assert!(!asked.load(std::sync::atomic::Ordering::Relaxed));
}
