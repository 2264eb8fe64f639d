//! The controller beside the real Cluster API core manager (see `ck8s_certs_e2e::capi_manager`):
//! on a cluster of its own, in the namespace the manager reconciles, made coherent for CAPI
//! (its workers belong to a MachineSet of their MachineDeployment), the manager takes the
//! Machines over without creating or deleting any, a manual refresh works beside it, it mirrors
//! our expiry into the control planes' status, and at rest neither side writes.
//!
//! The tests share one cluster and take turns ([`SERIAL`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ck8s_certs_api::annotations::{
    CERTIFICATES_EXPIRY, REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS,
};
use ck8s_certs_e2e::capi_manager::{self, CapiManager, MACHINE_FINALIZER, MACHINE_SET_MANAGER};
use ck8s_certs_e2e::fixtures::{NodeInfo, Role};
use ck8s_certs_e2e::sim::runs;
use ck8s_certs_e2e::{EnvSpec, Environment, shared_with};
use kube::Api;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;

const CLUSTER: &str = "delta";
const FILTER: &str = "capi";
const CONTROLLER: &str = "system:serviceaccount:ck8s-certs-system:ck8s-certs-manager";
const TIMEOUT: Duration = Duration::from_secs(120);

/// One test at a time on the one cluster.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// This test's turn on the environment (one test at a time), and the CAPI manager it runs.
async fn turn() -> (
    tokio::sync::MutexGuard<'static, ()>,
    Arc<Environment>,
    CapiManager,
) {
    let turn = SERIAL.lock().await;
    let env = shared_with(spec).await;
    let manager = env
        .capi_manager
        .clone()
        .expect("the environment runs the manager");
    (turn, env, manager)
}

/// The names of the objects of `api`.
async fn names(api: &Api<DynamicObject>) -> Vec<String> {
    let list = api.list(&ListParams::default()).await.unwrap();
    list.items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect()
}

/// One cluster (two control planes, two workers) in the manager's namespace, and the manager.
fn spec() -> EnvSpec {
    capi_manager::spec(CLUSTER)
}

/// One audited request, with what the audit log says beyond `controlplane::AuditEvent`.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Audited {
    verb: String,
    stage: String,
    user: User,
    #[serde(default)]
    object_ref: Option<Object>,
    #[serde(default)]
    response_status: Option<Status>,
}

#[derive(Debug, serde::Deserialize)]
struct User {
    username: String,
}

#[derive(Debug, Default, serde::Deserialize)]
struct Object {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    subresource: String,
}

#[derive(Debug, serde::Deserialize)]
struct Status {
    #[serde(default)]
    code: u16,
}

/// The management API server's audited writes (completed), oldest first.
fn audited(env: &Environment) -> Vec<Audited> {
    std::fs::read_to_string(env.dir.join("audit-management.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<Audited>(line).ok())
        .filter(|e| e.stage == "ResponseComplete")
        // The log holds reads of Secrets too.
        .filter(|e| matches!(e.verb.as_str(), "create" | "update" | "patch" | "delete"))
        .collect()
}

/// `user`'s writes among `events` as `verb resource/subresource name (code)`, Leases left out
/// (leader election's cost, not the Machines').
fn writes_by<'a>(events: impl IntoIterator<Item = &'a Audited>, user: &str) -> Vec<String> {
    events
        .into_iter()
        .filter(|e| e.user.username == user)
        .filter_map(|e| {
            let object = e.object_ref.as_ref()?;
            (object.resource != "leases").then(|| {
                format!(
                    "{} {}/{} {} ({})",
                    e.verb,
                    object.resource,
                    object.subresource,
                    object.name,
                    e.response_status.as_ref().map_or(0, |s| s.code)
                )
            })
        })
        .collect()
}

fn conflicts(writes: &[String]) -> usize {
    writes.iter().filter(|w| w.ends_with("(409)")).count()
}

async fn machine(env: &Environment, node: &NodeInfo) -> DynamicObject {
    env.machine_api(env.management().await.unwrap(), &node.namespace)
        .get(&node.machine)
        .await
        .unwrap()
}

/// Polls `check` on the Machine until it holds; panics with the Machine and the manager's log.
async fn wait_for(
    env: &Environment,
    node: &NodeInfo,
    what: &str,
    check: impl Fn(&DynamicObject) -> bool,
) -> DynamicObject {
    let start = Instant::now();
    loop {
        let object = machine(env, node).await;
        if check(&object) {
            return object;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "{}: never {what}: {:#?}\n--- capi-manager log ---\n{}",
            node.machine,
            object,
            env.capi_manager.as_ref().unwrap().log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn controller_owner(object: &DynamicObject) -> Option<(String, String)> {
    object
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map(|r| (r.kind.clone(), r.name.clone()))
}

/// The time `status.certificatesExpiryDate` names, if any.
fn status_expiry(object: &DynamicObject) -> Option<jiff::Timestamp> {
    object.data["status"]["certificatesExpiryDate"]
        .as_str()?
        .parse()
        .ok()
}

fn annotated_expiry(object: &DynamicObject) -> Option<jiff::Timestamp> {
    object
        .metadata
        .annotations
        .as_ref()?
        .get(CERTIFICATES_EXPIRY)?
        .parse()
        .ok()
}

#[tokio::test]
async fn beside_the_capi_manager_machines_are_kept_a_refresh_works_and_nothing_is_written_at_rest()
{
    let (_turn, env, manager) = turn().await;
    let cluster = env.cluster(CLUSTER);
    let client = env.management().await.unwrap();
    let ns = capi_manager::NAMESPACE;
    let set = capi_manager::machine_set_name(CLUSTER);

    // (a) It is up and reconciles: its finalizer on every Machine, the MachineSet controls the
    // workers and counts them ready; no Machine was created or deleted.
    assert!(manager.is_ready().await, "{}", manager.log_tail(40));
    for node in &cluster.nodes {
        wait_for(&env, node, "got the Machine finalizer", |m| {
            m.metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == MACHINE_FINALIZER)
        })
        .await;
    }
    for node in cluster.nodes_with_role(Role::Worker) {
        wait_for(&env, node, "was adopted by the MachineSet", |m| {
            controller_owner(m) == Some(("MachineSet".into(), set.clone()))
        })
        .await;
    }
    let sets = env.capi_api(client.clone(), ns, "MachineSet");
    let start = Instant::now();
    loop {
        let ms = sets.get(&set).await.unwrap();
        if ms.data["status"]["replicas"] == json!(cluster.spec.workers) {
            break;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "MachineSet status: {:#}\n{}",
            ms.data["status"],
            manager.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let set_names = names(&sets).await;
    assert_eq!(
        set_names,
        std::slice::from_ref(&set),
        "the MachineDeployment rolled out"
    );
    let machines = names(&env.machine_api(client.clone(), ns)).await;
    let mut expected: Vec<String> = cluster.nodes.iter().map(|n| n.machine.clone()).collect();
    expected.sort();
    assert_eq!(machines, expected, "Machines were created or deleted");
    let capi_writes = writes_by(&audited(&env), capi_manager::USER);
    let creations_or_deletions: Vec<&String> = capi_writes
        .iter()
        .filter(|w| w.starts_with("create machines/") || w.starts_with("delete machines/"))
        .collect();
    assert!(
        creations_or_deletions.is_empty(),
        "{creations_or_deletions:#?}"
    );
    println!(
        "CAPI {}: {} writes to settle the cluster (Leases excluded)",
        manager.version,
        capi_writes.len()
    );

    // (b) Our controller beside it: it records every expiry, and the manager mirrors it into the
    // control planes' status.
    env.isolate_cluster(CLUSTER, FILTER).await;
    let controller = env.start_controller(FILTER, &["--resync-period=3s"]);
    let audit_start = audited(&env).len();
    for node in &cluster.nodes {
        wait_for(&env, node, "had its expiry recorded", |m| {
            annotated_expiry(m).is_some()
        })
        .await;
    }
    for node in cluster.nodes_with_role(Role::ControlPlane) {
        wait_for(&env, node, "had its expiry mirrored into the status", |m| {
            status_expiry(m).is_some() && status_expiry(m) == annotated_expiry(m)
        })
        .await;
    }

    // A manual refresh of a control plane and a worker at once.
    let cp = cluster.node(&format!("{CLUSTER}-cp-0")).clone();
    let worker = cluster.node(&format!("{CLUSTER}-md-0-w0")).clone();
    let before = status_expiry(&machine(&env, &cp).await);
    let started = Instant::now();
    for node in [&cp, &worker] {
        env.annotate_refresh(node, "1y").await;
    }
    for node in [&cp, &worker] {
        let annotations = env.wait_for_refresh(node, TIMEOUT).await;
        assert_eq!(
            annotations[REFRESH_CERTIFICATES_STATUS],
            "done",
            "{}: {annotations:#?}\n--- controller ---\n{}",
            node.machine,
            controller.process.log_tail(40)
        );
    }
    println!(
        "refresh of {} and {} beside CAPI {}: {:.1}s",
        cp.machine,
        worker.machine,
        manager.version,
        started.elapsed().as_secs_f64()
    );
    let refreshed = wait_for(&env, &cp, "had its new expiry mirrored", |m| {
        status_expiry(m).is_some() && status_expiry(m) == annotated_expiry(m)
    })
    .await;
    assert_ne!(status_expiry(&refreshed), before, "the expiry did not move");
    let year = jiff::SignedDuration::from_hours(365 * 24);
    let left = status_expiry(&refreshed)
        .unwrap()
        .duration_since(jiff::Timestamp::now());
    assert!(
        (left - year).abs() < jiff::SignedDuration::from_mins(5),
        "{left:?}"
    );

    // (c) At rest, once the refresh's tail settled: first 10 s left alone (our resync every
    // 3 s), where neither side writes; then 20 s of Cluster edits, which re-check every Machine
    // on both sides: we still write nothing, and CAPI nothing to the Machines (v1.10 answers
    // each edit with no-op server-side applies to the infrastructure and bootstrap objects and
    // a Cluster status patch: its own, not a fight with us).
    tokio::time::sleep(Duration::from_secs(8)).await;
    let quiet_start = audited(&env).len();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let edits_start = audited(&env).len();
    let clusters = env.cluster_api(client.clone(), ns);
    for round in 0..5 {
        let touch =
            json!({ "metadata": { "annotations": { "e2e.ck8s.io/touch": round.to_string() } } });
        clusters
            .patch(CLUSTER, &PatchParams::default(), &Patch::Merge(&touch))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    let events = audited(&env);
    let quiet = &events[quiet_start..edits_start];
    let (ours_quiet, capi_quiet) = (
        writes_by(quiet, CONTROLLER),
        writes_by(quiet, capi_manager::USER),
    );
    let edited = &events[edits_start..];
    let (ours_edited, capi_edited) = (
        writes_by(edited, CONTROLLER),
        writes_by(edited, capi_manager::USER),
    );
    let ours = writes_by(&events[audit_start..], CONTROLLER);
    let capi = writes_by(&events[audit_start..], capi_manager::USER);
    println!(
        "beside CAPI {}: from our start to rest, {} writes by us ({} conflicts), {} by CAPI ({} conflicts); \
         at rest, 10 s alone: {} by us, {} by CAPI; 20 s of Cluster edits: {} by us, {} by CAPI {capi_edited:?}",
        manager.version,
        ours.len(),
        conflicts(&ours),
        capi.len(),
        conflicts(&capi),
        ours_quiet.len(),
        capi_quiet.len(),
        ours_edited.len(),
        capi_edited.len(),
    );
    assert!(ours_quiet.is_empty(), "our writes at rest: {ours_quiet:#?}");
    assert!(
        capi_quiet.is_empty(),
        "CAPI's writes at rest: {capi_quiet:#?}"
    );
    assert!(
        ours_edited.is_empty(),
        "our writes at rest (Cluster edits): {ours_edited:#?}"
    );
    let capi_machine_writes: Vec<&String> = capi_edited
        .iter()
        .filter(|w| w.contains(" machines/"))
        .collect();
    assert!(
        capi_machine_writes.is_empty(),
        "CAPI's Machine writes at rest (Cluster edits): {capi_machine_writes:#?}"
    );
    // A conflict now and then is optimistic concurrency at work; a loop of them is a fight.
    assert!(
        conflicts(&ours) + conflicts(&capi) <= 4,
        "conflicts: ours {:#?}, CAPI's {:#?}",
        ours.iter()
            .filter(|w| w.ends_with("(409)"))
            .collect::<Vec<_>>(),
        capi.iter()
            .filter(|w| w.ends_with("(409)"))
            .collect::<Vec<_>>()
    );
    assert!(manager.is_ready().await, "{}", manager.log_tail(40));
    // Informational: what the manager could not do, by error (e.g. before its workload
    // cluster connection was up).
    let log = manager.log();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for line in log.lines().filter(|l| l.contains("Reconciler error")) {
        let err = line.split(" err=\"").nth(1).unwrap_or(line);
        *errors.entry(err.chars().take(100).collect()).or_default() += 1;
    }
    println!(
        "CAPI {}: reconciler errors in its log: {errors:#?}",
        manager.version
    );
    // The controllers that carry a template's trigger to the Machines must not fail (they did
    // when the manager ran with `--namespace`; see `ck8s_certs_e2e::capi_manager`).
    let carriers: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Reconciler error"))
        .filter(|l| {
            l.contains("controller=\"machinedeployment\"")
                || l.contains("controller=\"machineset\"")
        })
        .collect();
    assert!(carriers.is_empty(), "{carriers:#?}");
}

/// A trigger in the machine template is refreshed once per Machine. The MachineSet controller
/// applies the template's annotations to its Machines (server-side apply, field manager
/// `capi-machineset`) and applies them again whenever someone removes them: each removal at the
/// end of a refresh brings the trigger back (measured before the fix: 9-10 `run`s per worker in
/// 30 s). The controller refuses a trigger its owner applies again after the refresh it asked
/// for, with an Event that names the owner and the template.
#[tokio::test]
async fn a_trigger_in_the_machine_template_refreshes_each_worker_once() {
    let (_turn, env, manager) = turn().await;
    let cluster = env.cluster(CLUSTER);
    let workers: Vec<NodeInfo> = cluster.nodes_with_role(Role::Worker).cloned().collect();
    let client = env.management().await.unwrap();
    let ns = capi_manager::NAMESPACE;
    env.isolate_cluster(CLUSTER, FILTER).await;
    let _controller = env.start_controller(FILTER, &[]);
    for node in &workers {
        wait_for(&env, node, "had its expiry recorded", |m| {
            annotated_expiry(m).is_some()
        })
        .await;
        env.sim.clear_calls(CLUSTER, &node.node).await.unwrap();
    }

    let deployments = env.machine_deployment_api(client.clone(), ns);
    let deployment = format!("{CLUSTER}-md-0");
    let trigger = |value: serde_json::Value| {
        Patch::Merge(json!({ "spec": { "template": { "metadata": {
            "annotations": { REFRESH_CERTIFICATES: value }
        }}}}))
    };
    deployments
        .patch(&deployment, &PatchParams::default(), &trigger(json!("1y")))
        .await
        .unwrap();
    // The MachineSet controller carries it to the Machines as its own field.
    let applied = wait_for(&env, &workers[0], "got the template's trigger", |m| {
        capi_manager::field_managers(m)
            .iter()
            .any(|(manager, fields)| {
                manager.starts_with(MACHINE_SET_MANAGER) && fields.contains(REFRESH_CERTIFICATES)
            })
    })
    .await;
    let status_of = |m: &DynamicObject| {
        m.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REFRESH_CERTIFICATES_STATUS).cloned())
    };
    println!(
        "trigger applied to {} by {MACHINE_SET_MANAGER} (status {:?})",
        workers[0].machine,
        status_of(&applied)
    );

    tokio::time::sleep(Duration::from_secs(30)).await;
    let mut counts = BTreeMap::new();
    for node in &workers {
        let calls = env.sim.calls(CLUSTER, &node.node).await.unwrap();
        counts.insert(node.machine.clone(), runs(&calls).len());
    }
    println!(
        "defect 9, CAPI {}: `run` calls per worker in 30 s with the trigger in the template: {counts:?}",
        manager.version
    );
    // Leave the cluster as it was for the next test: the trigger out of the template, and so
    // (the MachineSet controller applies the template again) off the Machines, where the
    // refusal then clears.
    deployments
        .patch(
            &deployment,
            &PatchParams::default(),
            &trigger(serde_json::Value::Null),
        )
        .await
        .unwrap();
    // The MachineSet's template too: the MachineDeployment controller propagates what it adds
    // to its templates in place, but a removal was seen to stay in the MachineSet's.
    env.capi_api(client.clone(), ns, "MachineSet")
        .patch(
            &capi_manager::machine_set_name(CLUSTER),
            &PatchParams::default(),
            &trigger(serde_json::Value::Null),
        )
        .await
        .unwrap();
    let has_trigger = |m: &DynamicObject| {
        m.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(REFRESH_CERTIFICATES))
    };
    for node in &workers {
        // The MachineSet controller stops applying it; where it stays on the Machine (another
        // manager shares the field), it is removed as a person would.
        let deadline = Instant::now() + TIMEOUT;
        while has_trigger(&machine(&env, node).await) {
            assert!(
                Instant::now() < deadline,
                "{}: the trigger stays",
                node.machine
            );
            env.patch_machine(
                node,
                json!({ "metadata": { "annotations": { REFRESH_CERTIFICATES: null } } }),
            )
            .await;
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let refused = env
                .machine_certificates(node)
                .await
                .and_then(|m| m.status)
                .is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "TriggerRefused" && c.status == "True")
                });
            if !refused {
                break;
            }
            assert!(Instant::now() < deadline, "{}: still refused", node.machine);
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    for (machine, count) in &counts {
        assert!(
            *count <= 1,
            "{machine}: {count} runs while the trigger stayed in the template"
        );
    }
    for node in &workers {
        let refused: Vec<String> = env
            .machine_events(node)
            .await
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("CertificatesRefreshRefused"))
            .filter_map(|e| e.note)
            .collect();
        assert_eq!(refused.len(), 1, "{}: {refused:#?}", node.machine);
        assert!(
            refused[0].contains(MACHINE_SET_MANAGER)
                && refused[0].contains("spec.template.metadata.annotations"),
            "{}",
            refused[0]
        );
    }
}

/// A trigger written into a machine template is refused at admission by the provider's
/// ValidatingAdmissionPolicy (`config/policy`, enforced by the API server itself), and the
/// message names the right way.
#[tokio::test]
async fn a_trigger_written_into_a_machine_template_is_refused_at_admission() {
    let (_turn, env, _) = turn().await;
    let client = env.management().await.unwrap();
    let installed = env.install_admission_policies().await;

    let deployments = env.machine_deployment_api(client.clone(), capi_manager::NAMESPACE);
    let deployment = format!("{CLUSTER}-md-0");
    let in_template = Patch::Merge(json!({ "spec": { "template": { "metadata": {
        "annotations": { REFRESH_CERTIFICATES: "1y" }
    }}}}));
    let refused = deployments
        .patch(&deployment, &PatchParams::default(), &in_template)
        .await;
    for (api, name) in &installed {
        let _ = api.delete(name, &Default::default()).await;
    }
    match refused {
        Err(kube::Error::Api(status)) => {
            assert!(
                status.message.contains("Annotate the object itself")
                    && status
                        .message
                        .contains("kubectl annotate machinedeployment"),
                "{status:?}"
            );
        }
        other => panic!("the template trigger was not refused: {other:?}"),
    }
    let template = deployments.get(&deployment).await.unwrap();
    assert!(
        template.data["spec"]["template"]["metadata"]["annotations"][REFRESH_CERTIFICATES]
            .is_null(),
        "nothing was written"
    );
}
