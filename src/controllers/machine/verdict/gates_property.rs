//! Gates against the verdict over a simulated fleet (issue 38): 200 clusters, each with its own
//! policy, Machines and closed-gate intervals, stepped through 40 days in random steps, each
//! Machine looked at when its verdict asked to be or when its cluster's gate changed (as the
//! watches wake it). No refresh is planned while a gate is closed before the fail-safe point,
//! no certificate ever expires, and every Machine of a cluster whose gates stay open is renewed
//! before its fail-safe point.

use std::sync::Arc;

use ck8s_certs_api::renewal_policy::CertificateRenewalPolicySpec;
use jiff::SignedDuration;
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::controllers::governing_policy::PolicyInfo;
use crate::controllers::machine::gates::Gate;
use crate::policy::spec::{Settings, validate};

const START: &str = "2026-11-25T12:00:00Z";
const DAYS: i64 = 40;
const TTL_DAYS: i64 = 30;
const MARGIN: SignedDuration = SignedDuration::from_hours(24);
const RESYNC: Duration = Duration::from_secs(10 * 3600);

/// The policies a cluster may have: no windows, a daily window, an overnight weekday window in
/// a zone with DST.
fn governing(kind: u8) -> Governing {
    let windows = match kind {
        0 => json!([]),
        1 => json!([{ "start": "00:00", "end": "06:00", "timezone": "UTC" }]),
        _ => json!([{
            "daysOfWeek": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"],
            "start": "22:00", "end": "02:00", "timezone": "Europe/Berlin",
        }]),
    };
    let spec: CertificateRenewalPolicySpec = serde_json::from_value(json!({
        "policy": "Automatic", "ttl": format!("{TTL_DAYS}d"), "renewBefore": "10d",
        "failSafeMargin": "1d", "windows": windows, "machineSelector": {},
    }))
    .unwrap();
    let valid = validate(&spec).unwrap();
    Governing::One {
        info: PolicyInfo::of_spec(&format!("p{kind}"), &spec),
        policy: Ok(Arc::new(valid)),
    }
}

#[derive(Clone, Debug)]
struct ClusterPlan {
    policy: u8,
    /// Each Machine's first expiry, in minutes from the start.
    expiries: Vec<i64>,
    /// Closed-gate intervals: start and length, in minutes from the start.
    closed: Vec<(i64, i64)>,
}

fn cluster() -> impl Strategy<Value = ClusterPlan> {
    let minutes = |days: i64| days * 24 * 60;
    (
        0u8..3,
        prop::collection::vec(minutes(2)..minutes(TTL_DAYS), 1..=3),
        // Some long enough to span a whole renewal period (the fail-safe point ends them).
        prop::collection::vec((0..minutes(DAYS), 1..minutes(15)), 0..4),
    )
        .prop_map(|(policy, expiries, closed)| ClusterPlan {
            policy,
            expiries,
            closed,
        })
}

struct Simulated {
    cluster: usize,
    view: MachineView,
    status: MachineCertificatesStatus,
    /// When its verdict asked to be looked at again.
    next_at: Timestamp,
    /// Renewals: when, and the fail-safe point of the certificates they replaced.
    renewals: Vec<(Timestamp, Timestamp)>,
}

fn closed_at(plan: &ClusterPlan, start: Timestamp, t: Timestamp) -> bool {
    plan.closed.iter().any(|&(from, length)| {
        let from = start + SignedDuration::from_mins(from);
        from <= t && t < from + SignedDuration::from_mins(length)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]

    #[test]
    fn gates_hold_every_renewal_they_should_and_none_expires(
        clusters in prop::collection::vec(cluster(), 200),
        steps in prop::collection::vec(1i64..=60, 3_000),
    ) {
        let start: Timestamp = START.parse().unwrap();
        let policies: Vec<Governing> = (0..3).map(governing).collect();
        let mut machines: Vec<Simulated> = Vec::new();
        for (index, plan) in clusters.iter().enumerate() {
            for (m, expiry) in plan.expiries.iter().enumerate() {
                machines.push(Simulated {
                    cluster: index,
                    view: MachineView {
                        namespace: "ns".into(),
                        name: format!("c{index}-m{m}"),
                        uid: Some(format!("uid-{index}-{m}")),
                        control_plane: m == 0,
                        ..Default::default()
                    },
                    status: MachineCertificatesStatus {
                        expiry: Some(Time(start + SignedDuration::from_mins(*expiry))),
                        ..Default::default()
                    },
                    next_at: start,
                    renewals: Vec::new(),
                });
            }
        }
        let end = start + SignedDuration::from_hours(DAYS * 24);
        let mut was_closed: Vec<bool> = clusters.iter().map(|c| closed_at(c, start, start)).collect();
        let mut t = start;
        for step in steps {
            t += SignedDuration::from_mins(step);
            if t > end {
                break;
            }
            let closed: Vec<bool> = clusters.iter().map(|c| closed_at(c, start, t)).collect();
            for machine in &mut machines {
                let expiry = machine.status.expiry.as_ref().map(|e| e.0).unwrap();
                prop_assert!(t < expiry, "{} expired at {expiry} (now {t})", machine.view.name);
                let gate_closed = closed[machine.cluster];
                let woken = gate_closed != was_closed[machine.cluster];
                if t < machine.next_at && !woken {
                    continue;
                }
                let gate = || gate_closed.then(|| Gate::RollingOut("MachineDeployment", "md-0".into()));
                let plan = plan(
                    &machine.view,
                    &machine.status,
                    &policies[clusters[machine.cluster].policy as usize],
                    Settings::default(),
                    RESYNC,
                    &gate,
                    t,
                );
                let fail_safe_at = expiry - MARGIN;
                match plan.next {
                    VerdictNext::Renew(_) => {
                        prop_assert!(
                            !gate_closed || t >= fail_safe_at,
                            "{} renewed at {t} while its gate was closed, before {fail_safe_at}",
                            machine.view.name
                        );
                        machine.renewals.push((t, fail_safe_at));
                        machine.status = plan.status;
                        machine.status.expiry =
                            Some(Time(t + SignedDuration::from_hours(TTL_DAYS * 24)));
                        machine.next_at = t;
                    }
                    VerdictNext::Requeue(after) => {
                        if gate_closed && t >= expiry - SignedDuration::from_hours(240) && t < fail_safe_at {
                            let reason = plan.status.renewal.as_ref().map(|r| r.reason.as_str());
                            // Due and held: the gate is said (or a window or the spread holds it
                            // anyway, which the verdict says first).
                            prop_assert!(
                                matches!(reason, Some("RollingOut" | "OutsideWindow" | "Staggered")),
                                "{}: {reason:?}", machine.view.name
                            );
                        }
                        machine.status = plan.status;
                        machine.next_at = t + SignedDuration::try_from(after).unwrap();
                    }
                    VerdictNext::Replace(_) => prop_assert!(false, "nothing here is replaced"),
                }
            }
            was_closed = closed;
        }
        for machine in &machines {
            if clusters[machine.cluster].closed.is_empty() {
                for (at, fail_safe_at) in &machine.renewals {
                    prop_assert!(at < fail_safe_at, "{} renewed at {at}, after {fail_safe_at}", machine.view.name);
                }
            }
        }
        prop_assert!(machines.iter().all(|m| !m.renewals.is_empty()));
    }
}
