use std::time::Duration;

use ck8s_certs_api::certificate_refresh::{
    CertificateRefreshSpec, CertificateRefreshStatus, MachinePhase, Origin, RequestPhase, Role,
    Target,
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::plan::{Api, MachineState, Outcome, Plan, World, plan};
use super::trigger::{Step, request_name, step};

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn spec(ttl: &str) -> CertificateRefreshSpec {
    CertificateRefreshSpec {
        target: Target {
            cluster: Some("c".into()),
            ..Default::default()
        },
        ttl: ttl.into(),
        origin: Origin::Manual,
        requested_by: None,
        requester: None,
        max_parallel_workers: Some(2),
        continue_on_failure: false,
        suspend: false,
    }
}

fn machine(name: &str, role: Role) -> MachineState {
    MachineState {
        name: name.into(),
        role,
        node: true,
        busy: false,
        handed: false,
        outcome: None,
    }
}

/// Two control planes and three workers, by name out of order.
fn fleet() -> Vec<MachineState> {
    vec![
        machine("w-2", Role::Worker),
        machine("cp-1", Role::ControlPlane),
        machine("w-0", Role::Worker),
        machine("cp-0", Role::ControlPlane),
        machine("w-1", Role::Worker),
    ]
}

fn world(machines: Vec<MachineState>, api: Option<bool>, now: i64) -> World {
    World {
        machines: Some(machines),
        clusters: vec!["c".into()],
        earlier: None,
        paused: false,
        api_answers: api.map(|answers| match answers {
            true => Api::Answers,
            false => Api::Down,
        }),
        authority: Some(Ok(())),
        wait_timeout: Duration::from_secs(600),
        band: Default::default(),
        now: at(now),
    }
}

fn phases(plan: &Plan) -> Vec<(&str, MachinePhase)> {
    plan.status
        .machines
        .iter()
        .map(|m| (m.name.as_str(), m.phase))
        .collect()
}

/// Marks the handed Machines as showing the trigger, and `done` ones as finished.
fn advance(machines: &mut [MachineState], handed: &[String], done: &[(&str, Option<&str>)]) {
    for m in machines.iter_mut() {
        if handed.contains(&m.name) {
            m.handed = true;
        }
        if let Some((_, error)) = done.iter().find(|(n, _)| *n == m.name) {
            m.handed = false;
            m.outcome = Some(match error {
                None => Outcome::Succeeded { expiry: None },
                Some(e) => Outcome::Failed {
                    error: (*e).to_owned(),
                },
            });
        }
    }
}

/// A cluster whose API serves an expired certificate: its control planes are handed over (they
/// are reached directly, and their refresh renews it), its workers wait for the API.
#[test]
fn an_expired_cluster_api_holds_workers_back_but_not_control_planes() {
    let spec = spec("1y");
    let mut machines = fleet();
    let expired = |machines: Vec<MachineState>, now| World {
        api_answers: Some(Api::CertificateExpired),
        ..world(machines, None, now)
    };
    let first = plan(
        &spec,
        &CertificateRefreshStatus::default(),
        &expired(machines.clone(), 0),
    );
    assert_eq!(first.hand, vec!["cp-0"]);
    advance(&mut machines, &first.hand, &[("cp-0", None)]);
    let second = plan(&spec, &first.status, &expired(machines.clone(), 5));
    assert_eq!(second.hand, vec!["cp-1"]);
    advance(&mut machines, &second.hand, &[("cp-1", None)]);
    let workers = plan(&spec, &second.status, &expired(machines, 10));
    assert!(workers.hand.is_empty());
    assert_eq!(
        workers.status.message.as_deref(),
        Some("Waiting for the cluster API to answer")
    );
}

#[test]
fn control_planes_go_one_at_a_time_in_name_order_then_workers_two_at_a_time() {
    let spec = spec("1y");
    let mut machines = fleet();
    let first = plan(
        &spec,
        &CertificateRefreshStatus::default(),
        &world(machines.clone(), None, 0),
    );
    assert!(first.needs_api, "a start waits for the cluster API");
    let first = plan(
        &spec,
        &CertificateRefreshStatus::default(),
        &world(machines.clone(), Some(true), 0),
    );
    assert_eq!(first.status.phase, Some(RequestPhase::Running));
    assert_eq!(first.hand, vec!["cp-0"]);
    assert_eq!(
        phases(&first),
        vec![
            ("cp-0", MachinePhase::Running),
            ("cp-1", MachinePhase::Pending),
            ("w-0", MachinePhase::Pending),
            ("w-1", MachinePhase::Pending),
            ("w-2", MachinePhase::Pending),
        ]
    );
    assert_eq!(first.status.progress.as_deref(), Some("0/5"));
    advance(&mut machines, &first.hand, &[]);

    // cp-0 running: nothing else starts.
    let waiting = plan(
        &spec,
        &first.status,
        &world(machines.clone(), Some(true), 5),
    );
    assert!(waiting.hand.is_empty());

    // cp-0 done but the cluster API does not answer: wait.
    advance(&mut machines, &[], &[("cp-0", None)]);
    let no_api = plan(
        &spec,
        &first.status,
        &world(machines.clone(), Some(false), 10),
    );
    assert!(no_api.hand.is_empty());
    assert_eq!(
        no_api.status.message.as_deref(),
        Some("Waiting for the cluster API to answer")
    );
    assert_eq!(no_api.status.machines[0].phase, MachinePhase::Succeeded);

    let second = plan(
        &spec,
        &no_api.status,
        &world(machines.clone(), Some(true), 15),
    );
    assert_eq!(second.hand, vec!["cp-1"]);
    advance(&mut machines, &second.hand, &[("cp-1", None)]);

    let workers = plan(
        &spec,
        &second.status,
        &world(machines.clone(), Some(true), 20),
    );
    assert_eq!(workers.hand, vec!["w-0", "w-1"], "maxParallelWorkers 2");
    advance(&mut machines, &workers.hand, &[("w-0", None)]);

    let last = plan(
        &spec,
        &workers.status,
        &world(machines.clone(), Some(true), 25),
    );
    assert_eq!(last.hand, vec!["w-2"]);
    advance(&mut machines, &last.hand, &[("w-1", None), ("w-2", None)]);

    let done = plan(&spec, &last.status, &world(machines, Some(true), 30));
    assert_eq!(done.status.phase, Some(RequestPhase::Succeeded));
    assert_eq!(done.status.progress.as_deref(), Some("5/5"));
    assert!(
        done.notes
            .iter()
            .any(|n| n.reason == super::plan::reasons::SUCCEEDED)
    );
    assert!(done.status.finished_at.is_some());
}

#[test]
fn the_first_failure_stops_the_request_unless_continue_on_failure() {
    let mut machines = vec![
        machine("cp-0", Role::ControlPlane),
        machine("w-0", Role::Worker),
    ];
    let spec_ = spec("1y");
    let first = plan(
        &spec_,
        &Default::default(),
        &world(machines.clone(), Some(true), 0),
    );
    advance(
        &mut machines,
        &first.hand,
        &[("cp-0", Some("k8sd refused"))],
    );
    let stopped = plan(
        &spec_,
        &first.status,
        &world(machines.clone(), Some(true), 5),
    );
    assert_eq!(stopped.status.phase, Some(RequestPhase::Failed));
    assert_eq!(
        phases(&stopped),
        vec![
            ("cp-0", MachinePhase::Failed),
            ("w-0", MachinePhase::Skipped)
        ]
    );
    assert!(stopped.hand.is_empty());
    assert!(stopped.status.message.as_deref().unwrap().contains("cp-0"));

    let carry_on = CertificateRefreshSpec {
        continue_on_failure: true,
        ..spec("1y")
    };
    let going = plan(&carry_on, &first.status, &world(machines, Some(true), 5));
    assert_eq!(going.status.phase, Some(RequestPhase::Running));
    assert_eq!(going.hand, vec!["w-0"]);
}

#[test]
fn bad_input_is_refused_before_anything_starts() {
    let refused = |spec: &CertificateRefreshSpec, machines: Option<Vec<MachineState>>| {
        let world = World {
            machines,
            ..world(vec![], Some(true), 0)
        };
        let plan = plan(spec, &Default::default(), &world);
        assert_eq!(plan.status.phase, Some(RequestPhase::Failed));
        assert!(plan.hand.is_empty());
        assert!(plan.notes.iter().all(|n| n.warning));
        plan.status.message.unwrap()
    };
    assert!(refused(&spec("forever"), Some(fleet())).contains("Refused before anything started"));
    // Workers take 10m to 68y.
    assert!(refused(&spec("1m"), Some(fleet())).contains("10m to 68y"));
    assert!(refused(&spec("1y"), Some(vec![])).contains("has no CK8s Machines"));
    assert!(refused(&spec("1y"), None).contains("does not exist"));
}

#[test]
fn a_second_request_of_a_cluster_is_queued_behind_the_first() {
    let world = World {
        earlier: Some("c-1".into()),
        ..world(fleet(), Some(true), 0)
    };
    let queued = plan(&spec("1y"), &Default::default(), &world);
    assert_eq!(queued.status.phase, Some(RequestPhase::Pending));
    assert!(queued.hand.is_empty());
    assert!(queued.status.message.as_deref().unwrap().contains("c-1"));
    // The Event is sent once, not on every look.
    let again = plan(&spec("1y"), &queued.status, &world);
    assert!(again.notes.is_empty());
}

#[test]
fn a_busy_machine_waits_and_a_gone_one_is_skipped() {
    let mut machines = vec![
        machine("w-0", Role::Worker),
        machine("w-1", Role::Worker),
        machine("w-2", Role::Worker),
    ];
    machines[0].busy = true;
    let first = plan(
        &spec("1y"),
        &Default::default(),
        &world(machines.clone(), Some(true), 0),
    );
    assert_eq!(first.hand, vec!["w-1", "w-2"]);
    advance(&mut machines, &first.hand, &[]);
    machines.retain(|m| m.name != "w-2");
    let next = plan(&spec("1y"), &first.status, &world(machines, Some(true), 5));
    assert_eq!(next.status.machines[2].phase, MachinePhase::Skipped);
    assert_eq!(
        next.status.machines[2].message.as_deref(),
        Some("The Machine is gone")
    );
    assert!(next.hand.is_empty(), "w-0 still busy, w-1 running");
}

#[test]
fn suspend_starts_nothing_and_a_restart_hands_over_again() {
    let machines = vec![machine("w-0", Role::Worker), machine("w-1", Role::Worker)];
    let first = plan(
        &spec("1y"),
        &Default::default(),
        &world(machines.clone(), Some(true), 0),
    );
    let suspended = CertificateRefreshSpec {
        suspend: true,
        ..spec("1y")
    };
    let paused = plan(
        &suspended,
        &first.status,
        &world(machines.clone(), Some(true), 5),
    );
    assert_eq!(paused.status.phase, Some(RequestPhase::Suspended));
    // Running Machines whose cache shows no trigger are handed over again (checked live by
    // the caller), nothing new starts.
    assert_eq!(paused.hand, vec!["w-0", "w-1"]);
    let mut handed = machines;
    for m in &mut handed {
        m.handed = true;
    }
    let quiet = plan(&suspended, &first.status, &world(handed, Some(true), 5));
    assert!(quiet.hand.is_empty());
}

#[test]
fn a_target_spanning_clusters_is_refused_before_anything_starts() {
    let selector = CertificateRefreshSpec {
        target: Target {
            selector: Some(LabelSelector {
                match_labels: Some([("tier".to_owned(), "edge".to_owned())].into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..spec("1y")
    };
    let spanning = World {
        clusters: vec!["a".into(), "b".into()],
        ..world(fleet(), Some(true), 0)
    };
    let refused = plan(&selector, &Default::default(), &spanning);
    assert_eq!(refused.status.phase, Some(RequestPhase::Failed));
    assert_eq!(
        refused.status.message.as_deref(),
        Some(
            r#"Refused: the selector "tier=edge" takes Machines of 2 Clusters (a, b); a request refreshes the Machines of one cluster: narrow it, e.g. with the label cluster.x-k8s.io/cluster-name"#
        )
    );
    assert!(refused.hand.is_empty());
    let nothing = plan(
        &selector,
        &Default::default(),
        &world(Vec::new(), Some(true), 0),
    );
    assert_eq!(
        nothing.status.message.as_deref(),
        Some(
            r#"Nothing to refresh: the selector "tier=edge" has no CK8s Machines (bootstrapped by CK8sConfig)"#
        )
    );
}

#[test]
fn a_paused_cluster_lets_the_running_machine_finish_and_starts_no_other() {
    let machines = vec![machine("w-0", Role::Worker), machine("w-1", Role::Worker)];
    let one_at_a_time = CertificateRefreshSpec {
        max_parallel_workers: Some(1),
        ..spec("1y")
    };
    let first = plan(
        &one_at_a_time,
        &Default::default(),
        &world(machines.clone(), Some(true), 0),
    );
    assert_eq!(first.hand, vec!["w-0"]);
    let mut done = machines;
    done[0].handed = true;
    done[0].outcome = Some(Outcome::Succeeded { expiry: None });
    let paused = World {
        paused: true,
        ..world(done.clone(), Some(true), 5)
    };
    let next = plan(&one_at_a_time, &first.status, &paused);
    assert_eq!(
        phases(&next),
        vec![
            ("w-0", MachinePhase::Succeeded),
            ("w-1", MachinePhase::Pending)
        ]
    );
    assert!(next.hand.is_empty());
    assert_eq!(next.status.phase, Some(RequestPhase::Running));
    assert!(
        next.status
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with("Paused with its Cluster")),
        "{:?}",
        next.status.message
    );
    // Resumed: the next one starts.
    let resumed = plan(&one_at_a_time, &next.status, &world(done, Some(true), 10));
    assert_eq!(resumed.hand, vec!["w-1"]);
}

#[test]
fn two_triggers_in_one_second_name_two_requests() {
    let now = at(0);
    let first = request_name("c", None, now);
    assert_eq!(first, format!("c-{}", now.as_second()));
    let second = request_name("c", Some(&first), now);
    assert_eq!(second, format!("c-{}", now.as_second() + 1));
    assert_eq!(
        request_name("c", Some(&second), now),
        format!("c-{}", now.as_second() + 2)
    );
    // Another object's name, or an older one, does not hold it back.
    assert_eq!(request_name("c", Some("c-md-0-5"), now), first);
    assert_eq!(request_name("c", Some("c-5"), now), first);
}

#[test]
fn the_cluster_trigger_is_taken_in_two_steps() {
    let now = at(0);
    assert_eq!(step("c", None, None, None, now), Step::Nothing);
    assert_eq!(
        step("c", Some("1y"), None, None, now),
        Step::Reserve {
            ttl: "1y".into(),
            name: format!("c-{}", now.as_second())
        }
    );
    assert_eq!(
        step("c", Some("1y"), Some("c-1"), None, now),
        Step::Create {
            ttl: "1y".into(),
            name: "c-1".into()
        }
    );
    assert_eq!(
        step("c", None, Some("c-1"), None, now),
        Step::Withdraw { name: "c-1".into() }
    );
}

#[test]
fn nothing_starts_before_the_requests_authority_is_checked_and_a_refusal_starts_nothing() {
    let spec = spec("1y");
    let unasked = World {
        authority: None,
        ..world(fleet(), Some(true), 0)
    };
    let first = plan(&spec, &CertificateRefreshStatus::default(), &unasked);
    assert!(first.needs_authority);
    assert_eq!(first.status, CertificateRefreshStatus::default());
    assert!(first.hand.is_empty() && first.notes.is_empty());

    let why = "Refused: its requester mallory may not refresh clusters.cluster.x-k8s.io c in namespace fleet (now)";
    let refused = World {
        authority: Some(Err(why.into())),
        ..world(fleet(), Some(true), 0)
    };
    let first = plan(&spec, &CertificateRefreshStatus::default(), &refused);
    assert_eq!(first.status.phase, Some(RequestPhase::Failed));
    assert_eq!(first.status.message.as_deref(), Some(why));
    assert!(first.hand.is_empty());
    assert_eq!(first.notes.len(), 1);
    assert!(first.notes[0].warning);
    assert_eq!(first.notes[0].reason, super::plan::reasons::REFUSED);
}

#[test]
fn rights_revoked_mid_way_stop_the_hand_overs_and_the_running_finish() {
    let spec = spec("1y");
    let mut machines = fleet();
    let first = plan(
        &spec,
        &CertificateRefreshStatus::default(),
        &world(machines.clone(), Some(true), 0),
    );
    assert_eq!(first.hand, vec!["cp-0"]);
    advance(&mut machines, &first.hand, &[("cp-0", None)]);
    let why = "Refused: its requester mallory may not refresh clusters.cluster.x-k8s.io c in namespace fleet (now)";
    let revoked = World {
        authority: Some(Err(why.into())),
        ..world(machines.clone(), Some(true), 60)
    };
    let second = plan(&spec, &first.status, &revoked);
    assert!(second.hand.is_empty());
    assert_eq!(second.status.phase, Some(RequestPhase::Failed));
    assert_eq!(
        phases(&second),
        vec![
            ("cp-0", MachinePhase::Succeeded),
            ("cp-1", MachinePhase::Skipped),
            ("w-0", MachinePhase::Skipped),
            ("w-1", MachinePhase::Skipped),
            ("w-2", MachinePhase::Skipped),
        ]
    );
    let message = second.status.message.unwrap_or_default();
    assert!(message.starts_with(&format!("Stopped: {why}")), "{message}");

    // With a worker running, it finishes; nothing else starts.
    let mut running = first.status.clone();
    running.machines[0].phase = MachinePhase::Succeeded;
    running.machines[1].phase = MachinePhase::Succeeded;
    running.machines[2].phase = MachinePhase::Running;
    let mut states = fleet();
    advance(
        &mut states,
        &["w-0".to_owned()],
        &[("cp-0", None), ("cp-1", None)],
    );
    let third = plan(
        &spec,
        &running,
        &World {
            authority: Some(Err(why.into())),
            ..world(states, Some(true), 120)
        },
    );
    assert!(third.hand.is_empty());
    assert_eq!(third.status.phase, Some(RequestPhase::Running));
    let message = third.status.message.unwrap_or_default();
    assert!(
        message.starts_with(&format!("Stopping: {why}")),
        "{message}"
    );
}
