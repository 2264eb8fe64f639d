//! Every case of [`next`]: what a reconcile does with what it has read, without an API server.

use std::time::Duration;

use ck8s_certs_api::annotations::{CERTIFICATES_EXPIRY, REFRESH_CERTIFICATES_STATUS};
use ck8s_certs_api::capi::PAUSED_ANNOTATION;
use ck8s_certs_api::machine_certificates::Phase;
use ck8s_certs_api::reasons::conditions;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::controllers::governing_policy::Governing;
use crate::controllers::machine::testing::{machine, op};
use crate::controllers::patches::set_condition;

const RESYNC: Duration = Duration::from_secs(36_000);
const EXPIRY: i64 = 1_900_000_000;
const EXPIRY_TEXT: &str = "2030-03-17T17:46:40Z";
const REQUEST: &str = "m-1";

fn now() -> Timestamp {
    Timestamp::from_second(EXPIRY - 300 * 86_400).unwrap()
}

/// A Machine at rest: its expiry known and shown.
fn at_rest() -> MachineView {
    machine(&[(CERTIFICATES_EXPIRY, EXPIRY_TEXT)])
}

/// A Machine whose refresh (trigger `1y`) was taken up as request [`REQUEST`].
fn asked(trigger: &str) -> MachineView {
    machine(&[
        (REFRESH_CERTIFICATES, trigger),
        (REFRESH_CERTIFICATES_STATUS, "in-progress"),
        (IN_FLIGHT_REFRESH, REQUEST),
    ])
}

fn known() -> MachineCertificatesStatus {
    MachineCertificatesStatus {
        expiry: Some(Time(Timestamp::from_second(EXPIRY).unwrap())),
        ..Default::default()
    }
}

/// `status` with its Ready condition as settling `step` shows it.
fn shown(
    step: &Step,
    machine: &MachineView,
    cluster: Option<&ClusterView>,
) -> MachineCertificatesStatus {
    let governing = Governing::None;
    let renewals = renewals(&governing);
    settle(step, machine, cluster, &known(), &renewals, now())
        .map(|s| s.status)
        .unwrap_or_else(known)
}

fn refused() -> MachineCertificatesStatus {
    let mut status = known();
    set_condition(
        &mut status,
        conditions::TRIGGER_REFUSED,
        true,
        "Reapplied",
        "refused".into(),
        now(),
    );
    status
}

fn read(status: MachineCertificatesStatus) -> Certificates {
    Certificates::Read {
        digest: crate::controllers::stores::status_digest(Some(&status)),
        status: Some(status),
        generation: Some(1),
    }
}

fn renewals(governing: &Governing) -> Renewals<'_> {
    Renewals {
        governing,
        settings: crate::policy::spec::Settings::default(),
        resync: RESYNC,
        gate: &|| None,
    }
}

/// One row: what was read, and what comes next.
struct Row {
    name: &'static str,
    source: Source,
    machine: MachineView,
    cluster: Option<ClusterView>,
    certificates: Certificates,
    request: Option<Operation>,
    parked: Option<Parked>,
    kept_outcome: bool,
    planned: Option<Planned>,
    next: Next,
}

fn row(
    name: &'static str,
    source: Source,
    machine: MachineView,
    certificates: Certificates,
    next: Next,
) -> Row {
    Row {
        name,
        source,
        machine,
        cluster: Some(ClusterView::default()),
        certificates,
        request: None,
        parked: None,
        kept_outcome: false,
        planned: None,
        next,
    }
}

/// A row of a refresh parked as `parked`, its Machine as the cache shows it.
fn parked(
    parked: Parked,
    name: &'static str,
    machine: MachineView,
    certificates: Certificates,
    next: Next,
) -> Row {
    Row {
        parked: Some(parked),
        ..row(name, Source::Cache, machine, certificates, next)
    }
}

/// A row of `request`, in flight for a Machine asked for `1y` whose status is known.
fn requested(request: Operation, name: &'static str, source: Source, next: Next) -> Row {
    Row {
        request: Some(request),
        ..row(name, source, asked("1y"), read(known()), next)
    }
}

/// What the caches' pass plans for a Machine at rest in `step` that shows `status`.
fn planned(
    step: Step,
    machine: &MachineView,
    cluster: Option<&ClusterView>,
    status: &MachineCertificatesStatus,
) -> Planned {
    let governing = Governing::None;
    let renewals = renewals(&governing);
    let settled = settle(&step, machine, cluster, status, &renewals, now()).unwrap();
    Planned {
        step,
        digest: crate::controllers::stores::status_digest(Some(status)),
        cluster: cluster.cloned(),
        settled,
    }
}

#[test]
fn every_case_of_the_next_step() {
    let live = Next::Read(Source::Live);
    let cluster = ClusterView::default();
    let paused_cluster = ClusterView {
        paused: true,
        ..ClusterView::default()
    };
    let waiting = Parked {
        op: Some(op(Phase::Pending, "1y")),
        seen: None,
        blocked: false,
    };
    let blocked = Parked {
        blocked: true,
        ..waiting.clone()
    };
    // Woken, having seen the status whose digest is `seen`.
    let woken = |seen| Parked {
        seen: Some(seen),
        ..waiting.clone()
    };
    let asked_status = known();
    let digest = crate::controllers::stores::status_digest(Some(&asked_status));
    let nodeless = MachineView {
        node_name: None,
        ..at_rest()
    };
    let deleting = MachineView {
        deleting: true,
        ..at_rest()
    };
    let paused = machine(&[(CERTIFICATES_EXPIRY, EXPIRY_TEXT), (PAUSED_ANNOTATION, "")]);
    let reapplied = MachineView {
        trigger_manager: Some("capi-machineset".into()),
        trigger_applied: true,
        ..machine(&[
            (REFRESH_CERTIFICATES, "1y"),
            (CERTIFICATES_EXPIRY, EXPIRY_TEXT),
        ])
    };
    let reapplied_step = Step::Reapplied {
        trigger: "1y".into(),
        manager: "capi-machineset".into(),
    };
    let done = Operation {
        requested_by: Some("capi-machineset".into()),
        ..op(Phase::Succeeded, "1y")
    };
    // What the caches' pass plans for the Machine with no node yet, its status known.
    let nodeless_plan = planned(Step::WaitForNode, &nodeless, Some(&cluster), &known());
    let rows = vec![
        parked(
            blocked.clone(),
            "parked, still asked for and still blocked: nothing is read",
            asked("1y"),
            Certificates::Missing,
            Next::Rest(After::Requeue(WAITING_RECHECK)),
        ),
        parked(
            Parked {
                op: None,
                ..blocked.clone()
            },
            "parked after its seed and blocked: nothing is read",
            asked("1y"),
            Certificates::Missing,
            Next::Rest(After::Requeue(WAITING_RECHECK)),
        ),
        parked(
            blocked,
            "parked and blocked, but another TTL is asked now: read live",
            asked("30d"),
            read(known()),
            live.clone(),
        ),
        parked(
            woken(digest),
            "woken, the caches showing what it left: it goes on",
            asked("1y"),
            read(asked_status.clone()),
            Next::Act(Step::Continue(op(Phase::Pending, "1y"))),
        ),
        parked(
            woken(digest ^ 1),
            "woken, the status changed since it parked: read live",
            asked("1y"),
            read(asked_status.clone()),
            live.clone(),
        ),
        Row {
            kept_outcome: true,
            ..parked(
                woken(digest),
                "woken, an outcome is kept to be written first: read live",
                asked("1y"),
                read(asked_status),
                live.clone(),
            )
        },
        row(
            "no MachineCertificates in the cache: read live (and created)",
            Source::Cache,
            at_rest(),
            Certificates::Missing,
            live.clone(),
        ),
        row(
            "a status this version cannot read: read live, where it is reported",
            Source::Cache,
            at_rest(),
            Certificates::Unreadable,
            live.clone(),
        ),
        row(
            "a request in flight is read live",
            Source::Cache,
            asked("1y"),
            read(known()),
            live.clone(),
        ),
        row(
            "at rest, nothing to show: no request",
            Source::Cache,
            at_rest(),
            read(known()),
            Next::Rest(After::Requeue(RESYNC)),
        ),
        row(
            "a refusal shown, its trigger gone: planned, read live to end it",
            Source::Cache,
            at_rest(),
            read(refused()),
            Next::Confirm(Box::new(planned(
                Step::Idle,
                &at_rest(),
                Some(&cluster),
                &refused(),
            ))),
        ),
        row(
            "a new trigger: read live",
            Source::Cache,
            machine(&[
                (REFRESH_CERTIFICATES, "1y"),
                (CERTIFICATES_EXPIRY, EXPIRY_TEXT),
            ]),
            read(known()),
            live.clone(),
        ),
        row(
            "no node yet, shown: no request",
            Source::Cache,
            nodeless.clone(),
            read(shown(&Step::WaitForNode, &nodeless, Some(&cluster))),
            Next::Rest(After::Change),
        ),
        row(
            "no node yet, not shown: planned, read live to show it",
            Source::Cache,
            nodeless.clone(),
            read(known()),
            Next::Confirm(Box::new(nodeless_plan.clone())),
        ),
        Row {
            planned: Some(nodeless_plan.clone()),
            ..row(
                "live shows what the plan was made from: the plan is written",
                Source::Live,
                nodeless.clone(),
                read(known()),
                Next::Show(Step::WaitForNode, Box::new(nodeless_plan.settled.clone())),
            )
        },
        Row {
            planned: Some(nodeless_plan.clone()),
            ..row(
                "live shows another status than the plan's: settled again",
                Source::Live,
                nodeless.clone(),
                read(refused()),
                Next::Act(Step::WaitForNode),
            )
        },
        Row {
            planned: Some(nodeless_plan.clone()),
            cluster: Some(paused_cluster.clone()),
            ..row(
                "live shows another Cluster than the plan's: settled again",
                Source::Live,
                nodeless,
                read(known()),
                Next::Act(Step::Paused),
            )
        },
        row(
            "paused, shown: no request",
            Source::Cache,
            paused.clone(),
            read(shown(&Step::Paused, &paused, Some(&cluster))),
            Next::Rest(After::Change),
        ),
        Row {
            cluster: Some(paused_cluster.clone()),
            ..row(
                "its Cluster paused, shown for the Machine's annotation instead: planned",
                Source::Cache,
                paused.clone(),
                read(shown(&Step::Paused, &paused, Some(&cluster))),
                Next::Confirm(Box::new(planned(
                    Step::Paused,
                    &paused,
                    Some(&paused_cluster),
                    &shown(&Step::Paused, &paused, Some(&cluster)),
                ))),
            )
        },
        row(
            "being deleted: nothing to do",
            Source::Cache,
            deleting,
            read(known()),
            Next::Rest(After::Change),
        ),
        Row {
            cluster: None,
            ..row(
                "its Cluster not in the cache: looked up live",
                Source::Cache,
                at_rest(),
                read(known()),
                live.clone(),
            )
        },
        row(
            "a reapplied trigger, refused and shown: no request",
            Source::Cache,
            reapplied.clone(),
            read(MachineCertificatesStatus {
                operation: Some(done.clone()),
                ..shown(&reapplied_step, &reapplied, Some(&cluster))
            }),
            Next::Rest(After::Change),
        ),
        row(
            "live: no MachineCertificates and none created (paused, deleting)",
            Source::Live,
            at_rest(),
            Certificates::Missing,
            Next::Rest(After::Change),
        ),
        requested(
            op(Phase::Succeeded, "1y"),
            "live: an outcome to show on the Machine is shown from the Machine read fresh",
            Source::Live,
            Next::Read(Source::Fresh),
        ),
        requested(
            op(Phase::Succeeded, "1y"),
            "fresh: the outcome is recorded",
            Source::Fresh,
            Next::Act(Step::Record(op(Phase::Succeeded, "1y"))),
        ),
        requested(
            op(Phase::Running, "1y"),
            "live: a request Running is resumed",
            Source::Live,
            Next::Act(Step::Resume(op(Phase::Running, "1y"))),
        ),
        Row {
            parked: Some(waiting.clone()),
            ..row(
                "live: the parked refresh, still asked for, goes on",
                Source::Live,
                asked("1y"),
                read(known()),
                Next::Act(Step::Continue(op(Phase::Pending, "1y"))),
            )
        },
        row(
            "live: a new trigger starts",
            Source::Live,
            machine(&[(REFRESH_CERTIFICATES, "1y")]),
            read(known()),
            Next::Act(Step::Start {
                trigger: "1y".into(),
            }),
        ),
        row(
            "live: the idle Machine is settled",
            Source::Live,
            at_rest(),
            read(known()),
            Next::Act(Step::Idle),
        ),
    ];
    assert!(rows.len() >= 12);
    let governing = Governing::None;
    let renewals = renewals(&governing);
    for row in rows {
        let summary = Summary {
            source: row.source,
            machine: &row.machine,
            cluster: row.cluster.as_ref(),
            certificates: &row.certificates,
            request: row.request.as_ref(),
            parked: row.parked.as_ref(),
            kept_outcome: row.kept_outcome,
            renewals: &renewals,
            planned: row.planned.as_ref(),
        };
        assert_eq!(next(&summary, now()), row.next, "{}", row.name);
    }
}

#[test]
fn a_changed_verdict_is_written_by_the_pass_that_planned_it_and_an_unchanged_one_costs_nothing() {
    let spec: ck8s_certs_api::renewal_policy::CertificateRenewalPolicySpec =
        serde_json::from_value(serde_json::json!({"machineSelector": {}, "policy": "Automatic"}))
            .unwrap();
    let governing = Governing::One {
        info: crate::controllers::governing_policy::PolicyInfo {
            name: "p".into(),
            generation: Some(1),
            mode: Some(spec.policy),
            windows: Some(crate::controllers::governing_policy::windows_status(&[])),
            halted_since: None,
            canaries_since: None,
        },
        policy: Ok(std::sync::Arc::new(
            crate::policy::spec::validate(&spec).unwrap(),
        )),
    };
    let renewals = renewals(&governing);
    let machine = at_rest();
    let cluster = ClusterView::default();
    let ask = |source, certificates: &Certificates, planned: Option<&Planned>| {
        next(
            &Summary {
                source,
                machine: &machine,
                cluster: Some(&cluster),
                certificates,
                request: None,
                parked: None,
                kept_outcome: false,
                renewals: &renewals,
                planned,
            },
            now(),
        )
    };
    // The caches' pass plans the new verdict.
    let Next::Confirm(plan) = ask(Source::Cache, &read(known()), None) else {
        panic!("a changed verdict is not planned");
    };
    let settled = settle(
        &Step::Idle,
        &machine,
        Some(&cluster),
        &known(),
        &renewals,
        now(),
    )
    .unwrap();
    assert_eq!(plan.step, Step::Idle);
    assert_eq!(plan.settled, settled);
    // Read live and the same: the plan is written, not computed again.
    assert_eq!(
        ask(Source::Live, &read(known()), Some(&plan)),
        Next::Show(Step::Idle, Box::new(settled.clone()))
    );
    // Read live and changed meanwhile: settled again on what is there.
    assert_eq!(
        ask(Source::Live, &read(refused()), Some(&plan)),
        Next::Act(Step::Idle)
    );
    // Shown: nothing to write, no request.
    assert!(matches!(
        ask(Source::Cache, &read(settled.status), None),
        Next::Rest(After::Requeue(_))
    ));
}
