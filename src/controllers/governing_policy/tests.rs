use ck8s_certs_api::machine_certificates::{Origin, Phase, WindowBypass};

use super::*;
use crate::refresh::trigger::{renew_now_hint, with_hint};
use ck8s_certs_api::machine::MachineView;

fn at(second: i64) -> jiff::Timestamp {
    jiff::Timestamp::from_second(second).unwrap()
}

fn info(name: &str, mode: Mode) -> PolicyInfo {
    PolicyInfo {
        name: name.into(),
        generation: Some(3),
        mode: Some(mode),
        windows: Some(windows_status(&[])),
        halted_since: None,
        canaries_since: None,
    }
}

fn deferred(reason: &str, condition: Option<&'static str>) -> Verdict {
    Verdict::new(
        &info("auto", Mode::Automatic),
        reason,
        Some(at(5_000)),
        "Renewal is not due".into(),
        condition,
    )
}

fn deferred_with_windows_ignored() -> Verdict {
    deferred("Backoff", Some(conditions::RENEWAL_DEFERRED)).with(
        conditions::WINDOWS_IGNORED,
        "Automatic",
        "windows are ignored".into(),
    )
}

fn disabled() -> Verdict {
    Verdict::new(
        &info("off", Mode::Disabled),
        "Disabled",
        None,
        "disabled".into(),
        Some(conditions::RENEWAL_DISABLED),
    )
}

/// A Machine's first status: `verdict`, shown at 100.
fn fresh(verdict: &Verdict) -> MachineCertificatesStatus {
    with_verdict(&MachineCertificatesStatus::default(), verdict, at(100))
}

fn types(status: &MachineCertificatesStatus) -> Vec<&str> {
    status.conditions.iter().map(|c| c.type_.as_str()).collect()
}

#[test]
fn an_unchanged_verdict_gives_an_equal_status_for_every_shape() {
    let verdicts = [
        Verdict::none(),
        deferred("NotDue", None),
        deferred_with_windows_ignored(),
        disabled(),
        Verdict::conflict(vec!["a".into(), "b".into()], "conflict".into()),
    ];
    for verdict in verdicts {
        let first = fresh(&verdict);
        let again = with_verdict(&first, &verdict, at(200));
        assert_eq!(first, again, "{verdict:?}");
    }
}

#[test]
fn the_renewal_status_names_the_policy_its_generation_mode_and_windows() {
    let status = fresh(&deferred("NotDue", None));
    let renewal = status.renewal.unwrap();
    assert_eq!(
        renewal.policy_ref,
        Some(PolicyReference {
            name: "auto".into(),
            observed_generation: Some(3)
        })
    );
    assert_eq!(renewal.policy.as_deref(), Some("Automatic"));
    assert_eq!(
        renewal.windows,
        Some(WindowsStatus {
            valid: true,
            count: 0,
            message: None
        })
    );
    assert!(renewal.conflicting_policies.is_empty());
    let conflict = Verdict::conflict(vec!["a".into(), "b".into()], "both".into());
    let renewal = conflict.renewal.unwrap();
    assert_eq!(
        (
            renewal.policy_ref,
            renewal.policy,
            renewal.conflicting_policies
        ),
        (None, None, vec!["a".to_owned(), "b".to_owned()])
    );
}

#[test]
fn not_due_is_healthy_and_shows_no_renewal_condition() {
    let status = fresh(&deferred("NotDue", None));
    assert!(status.conditions.is_empty(), "{:?}", status.conditions);
    assert_eq!(status.renewal.unwrap().reason, "NotDue");
}

#[test]
fn a_new_verdict_replaces_the_old_conditions_and_keeps_other_ones() {
    let mut status = MachineCertificatesStatus::default();
    set_condition(
        &mut status,
        conditions::READY,
        true,
        "R",
        "ready".into(),
        at(1),
    );
    let deferred = with_verdict(&status, &deferred_with_windows_ignored(), at(100));
    assert_eq!(deferred.conditions.len(), 3);
    let disabled = with_verdict(&deferred, &disabled(), at(200));
    assert_eq!(
        types(&disabled),
        [conditions::READY, conditions::RENEWAL_DISABLED]
    );
    assert_eq!(disabled.conditions[0].last_transition_time, Time(at(1)));
    assert_eq!(disabled.conditions[1].last_transition_time, Time(at(200)));
    let cleared = with_verdict(&disabled, &Verdict::none(), at(300));
    assert_eq!(cleared.renewal, None);
    assert_eq!(cleared.conditions.len(), 1);
}

#[test]
fn a_deferral_whose_reason_changes_keeps_its_transition_time() {
    let first = fresh(&deferred_with_windows_ignored());
    let outside = deferred("OutsideWindow", Some(conditions::RENEWAL_DEFERRED));
    let second = with_verdict(&first, &outside, at(200));
    let deferred = second
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::RENEWAL_DEFERRED)
        .unwrap();
    assert_eq!(
        (deferred.reason.as_str(), &deferred.last_transition_time),
        ("OutsideWindow", &Time(at(100)))
    );
    assert!(
        second
            .conditions
            .iter()
            .all(|c| c.type_ != conditions::WINDOWS_IGNORED)
    );
}

fn operation(bypassed_windows: bool) -> Operation {
    Operation {
        phase: Phase::Succeeded,
        bypassed_windows,
        ..Operation::pending(Origin::Policy, None, None, "1y".into(), 1, Time(at(1_000)))
    }
}

#[test]
fn a_window_bypass_lasts_through_verdicts_until_a_later_refresh_succeeds() {
    let mut status = MachineCertificatesStatus {
        last_window_bypass: Some(WindowBypass {
            time: Time(at(1_000)),
            expiry: None,
            message: "bypassed".into(),
        }),
        ..Default::default()
    };
    status = with_verdict(&status, &deferred("RenewNow", None), at(1_000));
    assert_eq!(types(&status), [conditions::RENEWAL_WINDOW_BYPASSED]);
    // Later verdicts (the renewal done, next one not due) keep it...
    for verdict in [deferred("NotDue", None), disabled(), Verdict::none()] {
        status = with_verdict(&status, &verdict, at(2_000));
        assert!(
            types(&status).contains(&conditions::RENEWAL_WINDOW_BYPASSED),
            "{verdict:?}"
        );
    }
    // ...and so does the success of the bypassing refresh itself...
    forget_window_bypass(&mut status, &operation(true));
    assert!(status.last_window_bypass.is_some());
    // ...until another one succeeds (however soon after).
    forget_window_bypass(&mut status, &operation(false));
    show_window_bypass(&mut status, at(5_100));
    assert_eq!(status.last_window_bypass, None);
    assert!(status.conditions.is_empty());
}

#[test]
fn hints_end_messages_with_the_command_that_renews_now() {
    let machine = MachineView {
        namespace: "edge".into(),
        name: "cp-0".into(),
        ..Default::default()
    };
    let hint = renew_now_hint(&machine, "1y");
    assert_eq!(
        hint,
        "Renew now: kubectl annotate machines.cluster.x-k8s.io cp-0 -n edge v1beta2.k8sd.io/refresh-certificates=1y --overwrite"
    );
    assert_eq!(
        with_hint("Renewal is deferred.".into(), &hint),
        format!("Renewal is deferred. {hint}")
    );
    assert!(with_hint("x".into(), &hint).ends_with("--overwrite"));
}

#[test]
fn windows_are_described_and_checked() {
    let windows: Vec<Window> = serde_json::from_value(serde_json::json!([
        { "daysOfWeek": ["Saturday", "Sunday"], "start": "02:00", "end": "06:00", "timezone": "Europe/London" },
        { "schedule": "0 22 * * 1-5", "duration": "4h" },
    ]))
    .unwrap();
    assert_eq!(
        describe_window(&windows, 0),
        "windows[0] (Saturday,Sunday 02:00-06:00 Europe/London)"
    );
    assert_eq!(
        describe_window(&windows, 1),
        "windows[1] (\"0 22 * * 1-5\" for 4h UTC)"
    );
    assert_eq!(describe_window(&windows, 7), "windows[7]");
    assert!(windows_status(&windows).valid);
    let bad: Vec<Window> = serde_json::from_value(serde_json::json!([
        { "start": "02:00", "end": "06:00", "timezone": "Mars/Olympus_Mons" },
    ]))
    .unwrap();
    let status = windows_status(&bad);
    assert!(!status.valid);
    assert!(
        status
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("Mars/Olympus_Mons"),
        "{status:?}"
    );
}

/// A policy object as the cache holds it.
fn policy_object(name: &str, generation: i64, spec: serde_json::Value) -> DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "certificates.ck8s.io/v1alpha1",
        "kind": "CertificateRenewalPolicy",
        "metadata": { "name": name, "namespace": "ns", "uid": format!("uid-{name}"), "generation": generation },
        "spec": spec,
    }))
    .unwrap()
}

fn store(objects: &[DynamicObject]) -> Store<DynamicObject> {
    let resource = kube::api::ApiResource::erase::<CertificateRenewalPolicy>(&());
    let mut writer = kube::runtime::reflector::store::Writer::new(resource);
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Init);
    for object in objects {
        writer.apply_watcher_event(&kube::runtime::watcher::Event::InitApply(object.clone()));
    }
    writer.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
    writer.as_reader()
}

#[test]
fn policies_are_decoded_once_per_generation_and_forgotten_when_gone() {
    let labels: BTreeMap<String, String> = [("env".to_owned(), "prod".to_owned())].into();
    let auto = serde_json::json!({ "policy": "Automatic", "clusterSelector": { "matchLabels": { "env": "prod" } } });
    let unreadable = serde_json::json!({ "policy": "Automatic", "ttl": "forever", "clusterSelector": { "matchLabels": { "env": "lab" } } });
    let readings = PolicyReadings::default();
    let first = store(&[
        policy_object("auto", 1, auto.clone()),
        policy_object("broken", 1, unreadable),
    ]);
    let governs = |store: &Store<DynamicObject>| match governing(
        store,
        &readings,
        "ns",
        Some(&labels),
        &BTreeMap::new(),
    ) {
        Governing::One { info, policy } => {
            (info.name, info.generation, policy.map(|p| Arc::as_ptr(&p)))
        }
        _ => panic!("one policy governs"),
    };
    let (name, generation, decoded) = governs(&first);
    assert_eq!((name.as_str(), generation), ("auto", Some(1)));
    assert_eq!(readings.len(), 2);
    // The same generation again (a second Machine, a status write): the same decoded policy.
    assert_eq!(governs(&first).2, decoded);
    // A new generation is decoded anew.
    let edited = store(&[
        policy_object("auto", 2, auto),
        policy_object(
            "broken",
            1,
            serde_json::json!({ "policy": "Automatic", "ttl": "forever", "clusterSelector": { "matchLabels": { "env": "lab" } } }),
        ),
    ]);
    let (_, generation, again) = governs(&edited);
    assert_eq!(generation, Some(2));
    assert_ne!(again, decoded);
    // Deleted: forgotten.
    let without = store(&[policy_object(
        "auto",
        2,
        serde_json::json!({ "policy": "Automatic", "clusterSelector": { "matchLabels": { "env": "prod" } } }),
    )]);
    let _ = governs(&without);
    assert_eq!(readings.len(), 1);
}

/// A cache holding `objects`, as after a list.
fn listed<K>(dyntype: K::DynamicType, objects: Vec<K>) -> Store<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    use kube::runtime::watcher::Event;
    let mut writer = kube::runtime::reflector::store::Writer::new(dyntype);
    writer.apply_watcher_event(&Event::Init);
    for object in objects {
        writer.apply_watcher_event(&Event::InitApply(object));
    }
    writer.apply_watcher_event(&Event::InitDone);
    writer.as_reader()
}

fn stores_of(policies: Vec<DynamicObject>) -> crate::controllers::stores::Stores {
    use crate::controllers::stores::Cache;
    use ck8s_certs_api::machine::{CapiVersion, Cluster, Machine};
    let capi = CapiVersion::default();
    let machine = |namespace: &str, name: &str, tier: &str| -> Machine {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": { "name": name, "namespace": namespace, "labels": { "tier": tier } },
            "spec": { "clusterName": format!("{name}-cluster") },
        }))
        .unwrap()
    };
    let cluster = |name: &str, env: &str| -> Cluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": { "name": name, "namespace": "ns", "labels": { "env": env } },
        }))
        .unwrap()
    };
    crate::controllers::stores::Stores {
        machines: listed(
            capi,
            vec![
                machine("ns", "web-1", "web"),
                machine("ns", "web-2", "web"),
                machine("ns", "db", "db"),
                machine("other", "web-3", "web"),
            ],
        ),
        clusters: listed(
            capi,
            vec![
                cluster("web-1-cluster", "prod"),
                cluster("db-cluster", "lab"),
            ],
        ),
        deployments: listed(capi, Vec::new()),
        certificates: crate::controllers::stores::CertificateWriter::new().reader(),
        cluster_records: listed((), Vec::new()),
        policies: listed(
            kube::api::ApiResource::erase::<CertificateRenewalPolicy>(&()),
            policies,
        ),
        policy_readings: Default::default(),
        control_planes: Default::default(),
    }
}

/// A policy change concerns the Machines its previous generation selected and those its new one
/// selects, of its namespace only; a status write none; a deletion those it selected.
#[test]
fn a_policy_change_concerns_the_machines_it_selected_and_selects() {
    let selections = PolicySelections::default();
    let web = serde_json::json!({ "policy": "Automatic", "machineSelector": { "matchLabels": { "tier": "web" } } });
    let db = serde_json::json!({ "policy": "Automatic", "machineSelector": { "matchLabels": { "tier": "db" } } });
    let prod = serde_json::json!({ "policy": "Automatic", "clusterSelector": { "matchLabels": { "env": "prod" } } });
    let concerned = |policy: &DynamicObject, stores: &crate::controllers::stores::Stores| {
        let mut names: Vec<String> = selections
            .concerned(policy, &stores.policy_caches())
            .iter()
            .map(|c| c.machine.name_any())
            .collect();
        names.sort();
        names
    };
    let first = policy_object("p", 1, web.clone());
    let stores = stores_of(vec![first.clone()]);
    // First shown: whom it selects.
    assert_eq!(concerned(&first, &stores), ["web-1", "web-2"]);
    // Its status written: the same generation, nothing to re-check.
    assert!(concerned(&first, &stores).is_empty());
    // Edited to select the database tier: both selections.
    let edited = policy_object("p", 2, db);
    let stores = stores_of(vec![edited.clone()]);
    assert_eq!(concerned(&edited, &stores), ["db", "web-1", "web-2"]);
    // Edited to select by cluster label.
    let by_cluster = policy_object("p", 3, prod);
    let stores = stores_of(vec![by_cluster.clone()]);
    assert_eq!(concerned(&by_cluster, &stores), ["db", "web-1"]);
    // Deleted: the Machines it selected.
    let stores = stores_of(Vec::new());
    assert_eq!(concerned(&by_cluster, &stores), ["web-1"]);
    // Deleted before it was ever shown: whom its object selects.
    assert_eq!(
        concerned(&policy_object("q", 1, web), &stores),
        ["web-1", "web-2"]
    );
}
