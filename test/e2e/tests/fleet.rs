//! Fleet refreshes: `kubectl annotate cluster <c> v1beta2.k8sd.io/refresh-certificates=1y` (or a
//! CertificateRefresh made by hand) refreshes every CK8s Machine of the cluster: control planes
//! one at a time, then workers at most `maxParallelWorkers` at once; a failure stops it unless
//! `continueOnFailure`; bad input is refused before anything starts; a second request of a
//! cluster waits for the first; a restarted controller carries on without refreshing a Machine
//! twice. Every Machine refresh leaves one record (the history).
//!
//! One environment for this file: the standard clusters, `trio` with a fourth worker. Each test
//! owns whole clusters (a fleet request works on all of a cluster's Machines).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ck8s_certs::k8sd::wire::path;
use ck8s_certs_api::annotations::{
    FLEET_REQUEST, REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS,
};
use ck8s_certs_api::capi::WATCH_FILTER_LABEL;
use ck8s_certs_api::certificate_refresh::{
    CertificateRefresh, MachinePhase, Origin, RequestPhase, Target, labels,
};
use ck8s_certs_e2e::fixtures::{NodeInfo, Role, manual_request};
use ck8s_certs_e2e::sim::{CallRecord, Endpoint, Fault};
use ck8s_certs_e2e::{EnvSpec, Environment, shared_with};
use k8s_openapi::api::core::v1::Event;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::sync::Arc;

const TIMEOUT: Duration = Duration::from_secs(240);

fn spec() -> EnvSpec {
    let mut spec = EnvSpec::standard();
    for cluster in &mut spec.clusters {
        if cluster.name == "trio" {
            cluster.workers = 4;
        }
    }
    // For the MachineDeployment, control plane and selector targets.
    let mut delta = spec.clusters[0].clone();
    delta.name = "delta".into();
    delta.machine_prefix = "delta".into();
    delta.workers = 3;
    delta.endpoint_host = "delta.k8s.example.internal".into();
    spec.clusters.push(delta);
    // For suspend, deletion, a busy Machine and a Machine gone mid-fleet.
    let mut epsilon = spec.clusters[0].clone();
    epsilon.name = "epsilon".into();
    epsilon.machine_prefix = "epsilon".into();
    epsilon.workers = 4;
    epsilon.endpoint_host = "epsilon.k8s.example.internal".into();
    spec.clusters.push(epsilon);
    spec
}

async fn env() -> Arc<Environment> {
    shared_with(spec).await
}

async fn annotate_cluster(env: &Environment, cluster: &str, ttl: &str) {
    let namespace = env.cluster(cluster).spec.namespace.clone();
    env.cluster_api(env.management().await.unwrap(), &namespace)
        .patch(
            cluster,
            &PatchParams {
                field_manager: Some("kubectl-annotate".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({ "metadata": { "annotations": { REFRESH_CERTIFICATES: ttl } } })),
        )
        .await
        .unwrap();
}

async fn cluster_annotations(env: &Environment, cluster: &str) -> BTreeMap<String, String> {
    let namespace = env.cluster(cluster).spec.namespace.clone();
    env.cluster_api(env.management().await.unwrap(), &namespace)
        .get(cluster)
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap_or_default()
}

fn requests(client: kube::Client, namespace: &str) -> Api<CertificateRefresh> {
    Api::namespaced(client, namespace)
}

/// Waits for the request the Cluster's trigger created, then for it to finish.
async fn finished_request_of_cluster(env: &Environment, cluster: &str) -> CertificateRefresh {
    let deadline = Instant::now() + TIMEOUT;
    let name = loop {
        if let Some(name) = cluster_annotations(env, cluster).await.get(FLEET_REQUEST) {
            break name.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no request for cluster {cluster}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    finished(env, &env.cluster(cluster).spec.namespace.clone(), &name).await
}

async fn finished(env: &Environment, namespace: &str, name: &str) -> CertificateRefresh {
    env.finished_request(namespace, name, TIMEOUT).await
}

fn cluster_target(cluster: &str) -> Target {
    Target {
        cluster: Some(cluster.into()),
        ..Default::default()
    }
}

async fn runs(env: &Environment, node: &NodeInfo) -> Vec<CallRecord> {
    env.calls(node)
        .await
        .into_iter()
        .filter(|c| c.path == path::RUN && c.method == "POST")
        .collect()
}

fn started(call: &CallRecord) -> jiff::Timestamp {
    call.started_at.parse().unwrap()
}

fn ended(call: &CallRecord) -> jiff::Timestamp {
    started(call) + jiff::SignedDuration::from_secs_f64(call.duration_ms / 1000.0)
}

/// The Machine records of `node`, newest first.
async fn records(env: &Environment, node: &NodeInfo) -> Vec<CertificateRefresh> {
    let api = requests(env.management().await.unwrap(), &node.namespace);
    let mut list = api
        .list(&ListParams::default().labels(&format!("{}={}", labels::MACHINE, node.machine)))
        .await
        .unwrap()
        .items;
    list.sort_by_key(|r| std::cmp::Reverse(r.creation_timestamp()));
    list
}

async fn cluster_event_reasons(env: &Environment, namespace: &str, cluster: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(env.management().await.unwrap(), namespace);
    events
        .list(&ListParams::default().fields(&format!(
            "involvedObject.name={cluster},involvedObject.kind=Cluster"
        )))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect()
}

/// Control-plane runs never overlap and each starts after the previous one ended; worker runs
/// start after every control plane's and never more than `parallel` overlap.
fn assert_order(control_planes: &[CallRecord], workers: &[CallRecord], parallel: usize) {
    let mut cps: Vec<&CallRecord> = control_planes.iter().collect();
    cps.sort_by_key(|c| started(c));
    for pair in cps.windows(2) {
        assert!(
            started(pair[1]) >= ended(pair[0]),
            "control planes overlapped: {} and {}",
            pair[0].node,
            pair[1].node
        );
    }
    let last_cp = cps.iter().map(|c| ended(c)).max();
    for worker in workers {
        assert!(
            last_cp.is_none_or(|last| started(worker) >= last),
            "worker {} ran before the control planes finished",
            worker.node
        );
        let overlapping = workers
            .iter()
            .filter(|w| started(w) <= started(worker) && ended(w) > started(worker))
            .count();
        assert!(overlapping <= parallel, "{overlapping} workers ran at once");
    }
}

async fn assert_fleet_refreshed(env: &Environment, cluster: &str, request: &CertificateRefresh) {
    let status = request.status.clone().unwrap();
    let nodes = env.cluster(cluster).nodes.clone();
    assert_eq!(status.phase, Some(RequestPhase::Succeeded), "{status:?}");
    assert_eq!(status.progress, Some(format!("{n}/{n}", n = nodes.len())));
    assert!(
        status
            .machines
            .iter()
            .all(|m| m.phase == MachinePhase::Succeeded && m.new_expiry.is_some())
    );
    let (mut cp_runs, mut worker_runs) = (Vec::new(), Vec::new());
    for node in &nodes {
        let annotations = env.machine_annotations(node).await;
        assert_eq!(
            annotations
                .get(REFRESH_CERTIFICATES_STATUS)
                .map(String::as_str),
            Some("done"),
            "{}",
            node.machine
        );
        assert!(
            !annotations.contains_key(REFRESH_CERTIFICATES)
                && !annotations.contains_key(FLEET_REQUEST)
        );
        let node_runs = runs(env, node).await;
        assert_eq!(node_runs.len(), 1, "{} refreshed once", node.machine);
        match node.role {
            Role::ControlPlane => cp_runs.extend(node_runs),
            Role::Worker => worker_runs.extend(node_runs),
        }
        // One record, of origin Fleet, naming the request.
        let records = records(env, node).await;
        assert_eq!(records.len(), 1, "{}: {records:?}", node.machine);
        assert_eq!(records[0].spec.origin, Origin::Fleet);
        assert_eq!(
            records[0].labels().get(labels::FLEET).map(String::as_str),
            Some(request.name_any().as_str())
        );
        assert_eq!(
            records[0].spec.requested_by,
            Some(format!("CertificateRefresh/{}", request.name_any()))
        );
        assert_eq!(
            records[0].status.as_ref().unwrap().phase,
            Some(RequestPhase::Succeeded)
        );
    }
    assert_order(&cp_runs, &worker_runs, 2);
}

#[tokio::test]
async fn a_cluster_annotation_refreshes_control_planes_one_at_a_time_then_workers_two_at_a_time() {
    let env = env().await;
    env.isolate_cluster("trio", "fleet-trio").await;
    let _controller = env.start_controller("fleet-trio", &[]);
    annotate_cluster(&env, "trio", "1y").await;
    let request = finished_request_of_cluster(&env, "trio").await;
    assert_eq!(
        request.spec.requested_by.as_deref(),
        Some("kubectl-annotate")
    );
    assert_eq!(request.spec.target.cluster.as_deref(), Some("trio"));
    assert_fleet_refreshed(&env, "trio", &request).await;
    // The Cluster shows the outcome like a Machine does, the trigger is gone.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let annotations = cluster_annotations(&env, "trio").await;
        if annotations
            .get(REFRESH_CERTIFICATES_STATUS)
            .map(String::as_str)
            == Some("done")
        {
            assert!(!annotations.contains_key(REFRESH_CERTIFICATES));
            break;
        }
        assert!(Instant::now() < deadline, "{annotations:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let reasons = cluster_event_reasons(&env, "fleet", "trio").await;
    for reason in [
        "CertificatesFleetRefreshRequested",
        "CertificatesFleetRefreshStarted",
        "CertificatesFleetMachineRefreshed",
        "CertificatesFleetRefreshSucceeded",
    ] {
        assert!(
            reasons.iter().any(|r| r == reason),
            "{reason} in {reasons:?}"
        );
    }
}

#[tokio::test]
async fn a_single_control_plane_cluster_waits_for_its_api_before_the_workers() {
    let env = env().await;
    env.isolate_cluster("solo", "fleet-solo").await;
    let _controller = env.start_controller("fleet-solo", &[]);
    annotate_cluster(&env, "solo", "1y").await;
    let request = finished_request_of_cluster(&env, "solo").await;
    assert_fleet_refreshed(&env, "solo", &request).await;
    // Its only control plane took the workload API down with it; the workers started after.
    assert!(env.apiserver_restarts("solo") >= 1);
}

#[tokio::test]
async fn a_failure_stops_the_fleet_and_continue_on_failure_carries_on() {
    let env = env().await;
    let nodes = env.isolate_cluster("beta", "fleet-beta").await;
    let _controller = env.start_controller("fleet-beta", &[]);
    let failing = env.cluster("beta").node("beta-cp-0").clone();
    let fault = env
        .sim
        .inject(
            &Fault::error(500, "failed to generate certificates: disk full")
                .on(&failing)
                .at(Endpoint::Run),
        )
        .await
        .unwrap();
    annotate_cluster(&env, "beta", "1y").await;
    let stopped = finished_request_of_cluster(&env, "beta").await;
    let status = stopped.status.clone().unwrap();
    assert_eq!(status.phase, Some(RequestPhase::Failed));
    assert!(
        status.message.as_deref().unwrap().contains("beta-cp-0"),
        "{status:?}"
    );
    let phase_of = |name: &str| {
        status
            .machines
            .iter()
            .find(|m| m.name == name)
            .unwrap()
            .phase
    };
    assert_eq!(phase_of("beta-cp-0"), MachinePhase::Failed);
    for node in nodes.iter().filter(|n| n.machine != "beta-cp-0") {
        assert_eq!(
            phase_of(&node.machine),
            MachinePhase::Skipped,
            "{}",
            node.machine
        );
        assert!(
            runs(&env, node).await.is_empty(),
            "{} was not refreshed",
            node.machine
        );
    }
    // Shown on the Cluster right after the request's status.
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster_annotations(&env, "beta")
        .await
        .get(REFRESH_CERTIFICATES_STATUS)
        .map(String::as_str)
        != Some("failed")
    {
        assert!(Instant::now() < deadline, "the Cluster never showed failed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        cluster_event_reasons(&env, "fleet", "beta")
            .await
            .iter()
            .any(|r| r == "CertificatesFleetRefreshFailed")
    );

    // The same with continueOnFailure, made by hand: every other Machine is refreshed.
    let api = requests(env.management().await.unwrap(), "fleet");
    let mut request = manual_request("beta-continue", cluster_target("beta"), "fleet-beta");
    request.spec.continue_on_failure = true;
    api.create(&PostParams::default(), &request).await.unwrap();
    let carried = finished(&env, "fleet", "beta-continue")
        .await
        .status
        .unwrap();
    assert_eq!(carried.phase, Some(RequestPhase::Failed));
    assert_eq!(
        carried.message.as_deref(),
        Some("1 Machine(s) failed, 3 refreshed, 0 skipped")
    );
    for node in nodes.iter().filter(|n| n.machine != "beta-cp-0") {
        assert_eq!(runs(&env, node).await.len(), 1, "{}", node.machine);
    }
    // The spec cannot be changed, but for suspend.
    let changed = api
        .patch(
            "beta-continue",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "ttl": "2y" } })),
        )
        .await;
    assert!(changed.is_err(), "the spec is immutable");
    env.sim.clear_fault(&fault).await.unwrap();
}

#[tokio::test]
async fn bad_input_and_overlapping_requests_get_a_clear_answer() {
    let env = env().await;
    let nodes = env.isolate_cluster("gamma", "fleet-gamma").await;
    let _controller = env.start_controller("fleet-gamma", &[]);

    // A bad TTL: refused before anything starts, on the Cluster too.
    annotate_cluster(&env, "gamma", "forever").await;
    let refused = finished_request_of_cluster(&env, "gamma")
        .await
        .status
        .unwrap();
    assert_eq!(refused.phase, Some(RequestPhase::Failed));
    assert!(
        refused
            .message
            .as_deref()
            .unwrap()
            .starts_with("Refused before anything started"),
        "{refused:?}"
    );
    assert!(refused.machines.is_empty());
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster_annotations(&env, "gamma")
        .await
        .get(REFRESH_CERTIFICATES_STATUS)
        .map(String::as_str)
        != Some("failed")
    {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        cluster_event_reasons(&env, "edge", "gamma")
            .await
            .iter()
            .any(|r| r == "CertificatesFleetRefreshRefused")
    );
    for node in &nodes {
        assert!(runs(&env, node).await.is_empty());
    }

    let api = requests(env.management().await.unwrap(), "edge");
    let create = |name: &str, cluster: &str| {
        let mut request = manual_request(name, cluster_target(cluster), "fleet-gamma");
        request.spec.max_parallel_workers = Some(1);
        request
    };
    // A cluster that does not exist.
    api.create(
        &PostParams::default(),
        &create("nowhere", "no-such-cluster"),
    )
    .await
    .unwrap();
    let nowhere = finished(&env, "edge", "nowhere").await.status.unwrap();
    assert_eq!(nowhere.phase, Some(RequestPhase::Failed));
    assert_eq!(
        nowhere.message.as_deref(),
        Some("Refused: Cluster no-such-cluster does not exist")
    );

    // Two requests of one cluster: the second waits for the first, no node runs two at once.
    api.create(&PostParams::default(), &create("first", "gamma"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    api.create(&PostParams::default(), &create("second", "gamma"))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let second = api.get("second").await.unwrap().status.unwrap_or_default();
        if second.phase == Some(RequestPhase::Pending) {
            assert!(
                second
                    .message
                    .as_deref()
                    .unwrap()
                    .contains("CertificateRefresh first"),
                "{second:?}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "{second:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let first = finished(&env, "edge", "first").await.status.unwrap();
    let second = finished(&env, "edge", "second").await.status.unwrap();
    assert_eq!(
        (first.phase, second.phase),
        (Some(RequestPhase::Succeeded), Some(RequestPhase::Succeeded))
    );
    assert!(second.started_at.unwrap().0 >= first.finished_at.unwrap().0);
    for node in &nodes {
        let node_runs = runs(&env, node).await;
        assert_eq!(node_runs.len(), 2, "{}", node.machine);
        assert!(started(&node_runs[1]) >= ended(&node_runs[0]));
        assert_eq!(records(&env, node).await.len(), 2);
    }
}

#[tokio::test]
async fn a_controller_killed_mid_fleet_resumes_without_refreshing_a_machine_twice() {
    let env = env().await;
    let nodes = env.isolate_cluster("alpha", "fleet-alpha").await;
    let controller = env.start_controller("fleet-alpha", &[]);
    annotate_cluster(&env, "alpha", "1y").await;
    // Killed once the first control plane is done, mid-fleet.
    let first = env.cluster("alpha").node("alpha-cp-0").clone();
    let annotations = env.wait_for_refresh(&first, TIMEOUT).await;
    assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "done");
    controller.crash();
    let _restarted = env.start_controller("fleet-alpha", &[]);
    let request = finished_request_of_cluster(&env, "alpha").await;
    assert_eq!(
        request.status.as_ref().unwrap().phase,
        Some(RequestPhase::Succeeded)
    );
    for node in &nodes {
        assert_eq!(
            records(&env, node).await.len(),
            1,
            "{} refreshed once",
            node.machine
        );
        assert_eq!(
            env.machine_annotations(node).await[REFRESH_CERTIFICATES_STATUS],
            "done"
        );
    }
    assert_eq!(runs(&env, &first).await.len(), 1);
}

/// A request by hand in namespace `fleet`, for the controller with `filter`.
fn request_for(name: &str, target: serde_json::Value, filter: &str) -> CertificateRefresh {
    serde_json::from_value(json!({
        "apiVersion": "certificates.ck8s.io/v1alpha1", "kind": "CertificateRefresh",
        "metadata": { "name": name, "labels": { WATCH_FILTER_LABEL: filter } },
        "spec": { "target": target, "ttl": "1y", "origin": "Manual" },
    }))
    .unwrap()
}

#[tokio::test]
async fn machine_deployment_control_plane_and_selector_targets() {
    let env = env().await;
    let nodes = env.isolate_cluster("delta", "fleet-delta").await;
    let _controller = env.start_controller("fleet-delta", &[]);
    let api = requests(env.management().await.unwrap(), "fleet");
    let (cps, workers): (Vec<NodeInfo>, Vec<NodeInfo>) = nodes
        .into_iter()
        .partition(|n| n.role == Role::ControlPlane);
    let run_counts = async |nodes: &[NodeInfo]| {
        let mut counts = Vec::new();
        for node in nodes {
            counts.push(runs(&env, node).await.len());
        }
        counts
    };

    // Creates a request of `target` and waits for it to finish.
    let run_request = async |name: &str, target: serde_json::Value| {
        api.create(
            &PostParams::default(),
            &request_for(name, target, "fleet-delta"),
        )
        .await
        .unwrap();
        finished(&env, "fleet", name).await.status.unwrap()
    };

    // The MachineDeployment's workers, two at a time; the control planes untouched.
    let status = run_request(
        "delta-workers",
        json!({ "machineDeployment": "delta-md-0" }),
    )
    .await;
    assert_eq!(status.phase, Some(RequestPhase::Succeeded), "{status:?}");
    assert_eq!(status.progress.as_deref(), Some("3/3"));
    assert_eq!(run_counts(&workers).await, vec![1, 1, 1]);
    assert_eq!(run_counts(&cps).await, vec![0, 0]);
    let mut worker_runs = Vec::new();
    for worker in &workers {
        worker_runs.extend(runs(&env, worker).await);
    }
    assert_order(&[], &worker_runs, 2);

    // The control plane object's Machines, one at a time.
    let status = run_request(
        "delta-control-plane",
        json!({ "controlPlane": "delta-control-plane" }),
    )
    .await;
    assert_eq!(status.phase, Some(RequestPhase::Succeeded), "{status:?}");
    assert_eq!(status.progress.as_deref(), Some("2/2"));
    let mut cp_runs = Vec::new();
    for cp in &cps {
        cp_runs.extend(runs(&env, cp).await);
    }
    assert_eq!(cp_runs.len(), 2);
    assert_order(&cp_runs, &[], 1);

    // A selector: the Machines it matches; one that matches nothing ends at once and says so;
    // an invalid one is refused before anything starts.
    let status = run_request(
        "delta-one",
        json!({ "selector": { "matchLabels": { "cluster.x-k8s.io/cluster-name": "delta", "cluster.x-k8s.io/deployment-name": "delta-md-0" }, "matchExpressions": [{ "key": "cluster.x-k8s.io/control-plane", "operator": "DoesNotExist" }] } }),
    )
    .await;
    assert_eq!(status.phase, Some(RequestPhase::Succeeded), "{status:?}");
    assert_eq!(run_counts(&workers).await, vec![2, 2, 2]);
    for (name, selector, message) in [
        (
            "delta-nothing",
            json!({ "matchLabels": { "e2e-tier": "none" } }),
            r#"Nothing to refresh: the selector "e2e-tier=none" has no CK8s Machines (bootstrapped by CK8sConfig)"#,
        ),
        (
            "delta-invalid",
            json!({ "matchExpressions": [{ "key": "e2e-tier", "operator": "In" }] }),
            "Refused: spec.target.selector.matchExpressions[0].values: must be non-empty when the operator is In; create a new request with a valid selector",
        ),
    ] {
        let status = run_request(name, json!({ "selector": selector })).await;
        assert_eq!(status.phase, Some(RequestPhase::Failed));
        assert_eq!(status.message.as_deref(), Some(message));
        assert!(status.machines.is_empty());
    }
    assert_eq!(run_counts(&workers).await, vec![2, 2, 2]);
    assert_eq!(run_counts(&cps).await, vec![1, 1]);

    // The annotation on the MachineDeployment, then on the CK8sControlPlane: a bad TTL is
    // refused there, before anything starts; a good one refreshes its Machines (and no other)
    // and shows the outcome there.
    let management = env.management().await.unwrap();
    let triggers = [
        (
            env.machine_deployment_api(management.clone(), "fleet"),
            "delta-md-0",
            "MachineDeployment",
        ),
        (
            env.control_plane_api(management.clone(), "fleet"),
            "delta-control-plane",
            "CK8sControlPlane",
        ),
    ];
    for (objects, object, kind) in &triggers {
        let before = (run_counts(&cps).await, run_counts(&workers).await);
        for (ttl, outcome) in [("forever", "failed"), ("1y", "done")] {
            objects
                .patch(
                    object,
                    &PatchParams {
                        field_manager: Some("kubectl-annotate".into()),
                        ..Default::default()
                    },
                    &Patch::Merge(
                        json!({ "metadata": { "annotations": { REFRESH_CERTIFICATES: ttl } } }),
                    ),
                )
                .await
                .unwrap();
            let annotations = env
                .wait_for_annotations(objects, object, TIMEOUT, |a| {
                    !a.contains_key(REFRESH_CERTIFICATES)
                        && a.get(REFRESH_CERTIFICATES_STATUS).map(String::as_str) == Some(outcome)
                })
                .await;
            let request = finished(&env, "fleet", &annotations[FLEET_REQUEST]).await;
            let target = &request.spec.target;
            let targeted = match *kind {
                "MachineDeployment" => target.machine_deployment.as_deref(),
                _ => target.control_plane.as_deref(),
            };
            assert_eq!(targeted, Some(*object), "{target:?}");
            assert_eq!(
                request.spec.requested_by.as_deref(),
                Some("kubectl-annotate")
            );
            assert_eq!(
                request.owner_references()[0].kind,
                *kind,
                "owned by what it was asked on"
            );
            let status = request.status.unwrap();
            let counts = (run_counts(&cps).await, run_counts(&workers).await);
            if outcome == "failed" {
                assert!(
                    status
                        .message
                        .as_deref()
                        .is_some_and(|m| m.starts_with("Refused before anything started")),
                    "{status:?}"
                );
                assert_eq!(counts, before, "nothing ran for {kind} {ttl}");
            } else if *kind == "MachineDeployment" {
                assert_eq!(status.progress.as_deref(), Some("3/3"));
                assert_eq!(counts, (before.0.clone(), vec![3, 3, 3]));
            } else {
                assert_eq!(status.progress.as_deref(), Some("2/2"));
                assert_eq!(counts, (vec![2, 2], before.1.clone()));
                // One at a time: the second control plane's run after the first one's.
                let mut cp_runs = Vec::new();
                for cp in &cps {
                    cp_runs.extend(runs(&env, cp).await.into_iter().skip(1));
                }
                assert_order(&cp_runs, &[], 1);
            }
        }
        let events: Api<Event> = Api::namespaced(management.clone(), "fleet");
        let reasons: Vec<String> = events
            .list(&ListParams::default().fields(&format!(
                "involvedObject.name={object},involvedObject.kind={kind}"
            )))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|e| e.reason)
            .collect();
        for reason in [
            "CertificatesFleetRefreshRequested",
            "CertificatesFleetRefreshRefused",
            "CertificatesFleetRefreshSucceeded",
        ] {
            assert!(
                reasons.iter().any(|r| r == reason),
                "{kind}: {reason} in {reasons:?}"
            );
        }
    }

    // Two targets at once: the API server refuses the request.
    let both = api
        .create(
            &PostParams::default(),
            &request_for(
                "delta-both",
                json!({ "cluster": "delta", "machineDeployment": "delta-md-0" }),
                "fleet-delta",
            ),
        )
        .await
        .unwrap_err();
    assert!(
        both.to_string().contains(
            "set exactly one of machine, cluster, machineDeployment, controlPlane and selector"
        ),
        "{both}"
    );
}

/// The workers' `run` counts.
async fn run_counts(env: &Environment, nodes: &[NodeInfo]) -> Vec<usize> {
    let mut counts = Vec::new();
    for node in nodes {
        counts.push(runs(env, node).await.len());
    }
    counts
}

/// Waits until `check` holds for the request's status.
async fn wait_for_status(
    api: &Api<CertificateRefresh>,
    name: &str,
    what: &str,
    check: impl Fn(&ck8s_certs_api::certificate_refresh::CertificateRefreshStatus) -> bool,
) -> ck8s_certs_api::certificate_refresh::CertificateRefreshStatus {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let status = api.get(name).await.unwrap().status.unwrap_or_default();
        if check(&status) {
            return status;
        }
        assert!(Instant::now() < deadline, "{name}: {what}: {status:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn running(status: &ck8s_certs_api::certificate_refresh::CertificateRefreshStatus) -> Vec<String> {
    status
        .machines
        .iter()
        .filter(|m| m.phase == MachinePhase::Running)
        .map(|m| m.name.clone())
        .collect()
}

#[tokio::test]
async fn a_busy_machine_waits_suspend_pauses_deletion_cancels_and_a_machine_gone_is_skipped() {
    let env = env().await;
    let nodes = env.isolate_cluster("epsilon", "fleet-epsilon").await;
    let _controller = env.start_controller("fleet-epsilon", &[]);
    let api = requests(env.management().await.unwrap(), "fleet");
    let workers: Vec<NodeInfo> = nodes
        .into_iter()
        .filter(|n| n.role == Role::Worker)
        .collect();
    let workers_target = json!({ "machineDeployment": "epsilon-md-0" });
    let create = async |name: &str, parallel: u32| {
        let mut request = request_for(name, workers_target.clone(), "fleet-epsilon");
        request.spec.max_parallel_workers = Some(parallel);
        api.create(&PostParams::default(), &request).await.unwrap();
    };
    // Every worker's `run` takes 3 s: long enough to act while one runs.
    env.sim
        .inject(
            &Fault::latency(Duration::from_secs(3))
                .on_cluster("epsilon")
                .at(Endpoint::Run),
        )
        .await
        .unwrap();

    // A Machine with a refresh in flight (annotated by hand) is not given a second one: the
    // request waits for it, then refreshes it after the first ended.
    let busy = &workers[0];
    env.annotate_refresh(busy, "1y").await;
    env.wait_for_machine(busy, TIMEOUT, |a| {
        a.get(REFRESH_CERTIFICATES_STATUS).map(String::as_str) == Some("in-progress")
    })
    .await;
    create("epsilon-busy", 4).await;
    let status = finished(&env, "fleet", "epsilon-busy")
        .await
        .status
        .unwrap();
    assert_eq!(status.phase, Some(RequestPhase::Succeeded), "{status:#?}");
    assert_eq!(status.progress.as_deref(), Some("4/4"));
    let busy_runs = runs(&env, busy).await;
    assert_eq!(busy_runs.len(), 2, "the manual refresh, then the request's");
    assert!(
        started(&busy_runs[1]) >= ended(&busy_runs[0]),
        "never two refreshes of one node at once"
    );
    assert_eq!(run_counts(&env, &workers).await, vec![2, 1, 1, 1]);

    // Suspended: the running Machine finishes, no other starts; resumed: the rest follow.
    create("epsilon-suspend", 1).await;
    let first = wait_for_status(&api, "epsilon-suspend", "one running", |s| {
        running(s).len() == 1
    })
    .await;
    api.patch(
        "epsilon-suspend",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "suspend": true } })),
    )
    .await
    .unwrap();
    let suspended = wait_for_status(&api, "epsilon-suspend", "suspended, none running", |s| {
        s.phase == Some(RequestPhase::Suspended) && running(s).is_empty()
    })
    .await;
    assert!(
        suspended
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with("Suspended")),
        "{suspended:#?}"
    );
    let done_while_suspended: Vec<&str> = suspended
        .machines
        .iter()
        .filter(|m| m.phase == MachinePhase::Succeeded)
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(
        done_while_suspended,
        running(&first),
        "the running one finished"
    );
    let counts = run_counts(&env, &workers).await;
    assert_eq!(counts.iter().sum::<usize>(), 5 + 1, "{counts:?}");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        run_counts(&env, &workers).await,
        counts,
        "nothing starts while suspended"
    );
    api.patch(
        "epsilon-suspend",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "suspend": false } })),
    )
    .await
    .unwrap();
    let status = finished(&env, "fleet", "epsilon-suspend")
        .await
        .status
        .unwrap();
    assert_eq!(status.phase, Some(RequestPhase::Succeeded), "{status:#?}");
    assert_eq!(run_counts(&env, &workers).await, vec![3, 2, 2, 2]);

    // Deleted: the running Machine finishes, the others never start.
    create("epsilon-deleted", 1).await;
    let status = wait_for_status(&api, "epsilon-deleted", "one running", |s| {
        running(s).len() == 1
    })
    .await;
    let was_running = running(&status)[0].clone();
    api.delete("epsilon-deleted", &Default::default())
        .await
        .unwrap();
    let ran = workers.iter().find(|w| w.machine == was_running).unwrap();
    let annotations = env.wait_for_refresh(ran, TIMEOUT).await;
    assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "done");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let counts = run_counts(&env, &workers).await;
    assert_eq!(
        counts.iter().sum::<usize>(),
        9 + 1,
        "only the running one: {counts:?}"
    );

    // A Machine deleted mid-fleet: skipped and reported; the others are refreshed.
    create("epsilon-gone", 1).await;
    let status = wait_for_status(&api, "epsilon-gone", "one running", |s| {
        running(s).len() == 1
    })
    .await;
    let gone = status
        .machines
        .iter()
        .rev()
        .find(|m| m.phase == MachinePhase::Pending)
        .map(|m| m.name.clone())
        .unwrap();
    env.machine_api(env.management().await.unwrap(), "fleet")
        .delete(&gone, &Default::default())
        .await
        .unwrap();
    let status = finished(&env, "fleet", "epsilon-gone")
        .await
        .status
        .unwrap();
    assert_eq!(status.phase, Some(RequestPhase::Succeeded), "{status:#?}");
    let entry = status.machines.iter().find(|m| m.name == gone).unwrap();
    assert_eq!(entry.phase, MachinePhase::Skipped);
    assert_eq!(entry.message.as_deref(), Some("The Machine is gone"));
    assert_eq!(
        status.message.as_deref(),
        Some("Refreshed 3 Machine(s); 1 skipped")
    );
    let gone_node = workers.iter().find(|w| w.machine == gone).unwrap();
    let before = counts[workers.iter().position(|w| w.machine == gone).unwrap()];
    assert_eq!(
        runs(&env, gone_node).await.len(),
        before,
        "the gone one never ran"
    );
    assert!(
        cluster_event_reasons(&env, "fleet", "epsilon")
            .await
            .iter()
            .any(|r| r == "CertificatesFleetMachineSkipped")
    );
}
