//! Pre-flight gates (issue 38): a control plane due under an Automatic policy is not refreshed
//! while its cluster is busy with something that restarts or replaces nodes, says which gate
//! holds it, and is refreshed once the gate opens. Asserted by order and k8sd calls, not by
//! timings. Each test has a cluster of its own.

use std::time::{Duration, Instant};

use ck8s_certs_e2e::drill::refreshing;
use ck8s_certs_e2e::fixtures::NodeInfo;
use ck8s_certs_e2e::sim::runs;
use ck8s_certs_e2e::{EnvSpec, Environment, shared_with};
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);

async fn shared() -> std::sync::Arc<Environment> {
    shared_with(EnvSpec::standard).await
}

/// Starts a controller for `cluster`'s Machines and puts `cp` under an Automatic policy that
/// finds it due now (the simulated certificates end in 90 days), once `close` closed a gate.
/// Waits until its verdict names the gate `reason` and checks that its node got no call; then
/// `open` opens the gate, and the control plane is refreshed. Answers the message it showed.
async fn held_then_refreshed(
    env: &Environment,
    cluster: &str,
    cp: &str,
    reason: &str,
    close: impl AsyncFnOnce(&Environment, &[NodeInfo]),
    open: impl AsyncFnOnce(&Environment, &[NodeInfo]),
) -> String {
    let filter = format!("gates-{cluster}");
    let nodes = env.isolate_cluster(cluster, &filter).await;
    let cp = nodes.iter().find(|n| n.machine == cp).unwrap().clone();
    let _controller = env.start_controller(&filter, &[]);
    env.wait_for_status(&cp, TIMEOUT, "the k8sd pin", |s| {
        s.k8sd_fingerprint.is_some() && s.expiry.is_some()
    })
    .await;
    close(env, &nodes).await;
    env.sim.clear_calls(cluster, &cp.node).await.unwrap();
    let namespace = &env.cluster(cluster).spec.namespace;
    env.create_policy(
        namespace,
        &filter,
        &filter,
        json!({ "policy": "Automatic", "renewBefore": "100d", "ttl": "1y" }),
    )
    .await;
    env.patch_machine(
        &cp,
        json!({ "metadata": { "labels": { "e2e-policy": filter } } }),
    )
    .await;
    let held = env
        .wait_for_status(&cp, TIMEOUT, "held by the gate", |s| {
            s.renewal.as_ref().is_some_and(|r| r.reason == reason)
        })
        .await;
    let message = held.renewal.map(|r| r.message).unwrap_or_default();
    // Held: a look again or two later, still nothing sent to the node.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let calls = env.calls(&cp).await;
    assert!(calls.is_empty(), "{reason}: calls while held: {calls:#?}");
    let opened = jiff::Timestamp::now();
    let start = Instant::now();
    open(env, &nodes).await;
    env.wait_for_done(&cp, TIMEOUT).await;
    println!(
        "{reason}: refreshed {:?} after the gate opened",
        start.elapsed()
    );
    let calls = env.calls(&cp).await;
    let runs = runs(&calls);
    assert_eq!(runs.len(), 1, "{calls:#?}");
    let first: jiff::Timestamp = calls[0].started_at.parse().unwrap();
    assert!(
        first >= opened,
        "{reason}: a call at {first}, before the gate opened at {opened}"
    );
    message
}

#[tokio::test]
async fn a_machine_being_deleted_holds_the_cluster_s_renewals() {
    let env = shared().await;
    let finalizer = "e2e.ck8s.io/hold";
    let message = held_then_refreshed(
        &env,
        "alpha",
        "alpha-cp-0",
        "MachineDeleting",
        async |env, nodes| {
            let worker = nodes.iter().find(|n| n.machine == "alpha-md-0-w1").unwrap();
            delete_held(env, worker, finalizer).await;
        },
        async |env, nodes| {
            let worker = nodes.iter().find(|n| n.machine == "alpha-md-0-w1").unwrap();
            env.patch_machine(worker, json!({ "metadata": { "finalizers": null } }))
                .await;
        },
    )
    .await;
    assert!(
        message.starts_with(
            "Renewal due, held while Machine alpha-md-0-w1 of the cluster is being deleted (gate MachineDeleting)"
        ),
        "{message}"
    );

    // A manual refresh waits for the same gate, before anything reaches its node, until forced.
    let filter = "gates-alpha";
    let [cp, worker] = env.nodes("alpha", ["alpha-cp-1", "alpha-md-0-w0"]);
    let (cp, worker) = (&cp, &worker);
    let _controller = env.start_controller(filter, &[]);
    delete_held(&env, worker, finalizer).await;
    env.sim.clear_calls("alpha", &cp.node).await.unwrap();
    env.annotate_refresh(cp, "1y").await;
    let waiting = env
        .wait_for_status(cp, TIMEOUT, "the manual refresh held", |s| {
            refreshing(s).contains("(a pre-flight gate)")
        })
        .await;
    assert!(
        refreshing(&waiting).contains(
            "Waiting: Machine alpha-md-0-w0 of the cluster is being deleted (gate MachineDeleting) (a pre-flight gate): it starts once that ends, or now with certificates.ck8s.io/force-refresh=true on the Machine"
        ),
        "{}",
        refreshing(&waiting)
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(env.calls(cp).await.is_empty(), "calls while held");
    let forced_at = jiff::Timestamp::now();
    env.patch_machine(
        cp,
        json!({ "metadata": { "annotations": { ck8s_certs_api::annotations::FORCE_REFRESH: "true" } } }),
    )
    .await;
    env.wait_for_done(cp, TIMEOUT).await;
    let calls = env.calls(cp).await;
    assert_eq!(runs(&calls).len(), 1, "{calls:#?}");
    let first: jiff::Timestamp = calls[0].started_at.parse().unwrap();
    assert!(
        first >= forced_at,
        "a call at {first}, before the force at {forced_at}"
    );
    let note = env.operation(cp).await.note.unwrap_or_default();
    assert!(
        note.contains("forced past a closed pre-flight gate (certificates.ck8s.io/force-refresh): Machine alpha-md-0-w0 of the cluster is being deleted (gate MachineDeleting)"),
        "{note}"
    );
    // The force went with the trigger.
    let machine = env
        .machine_api(env.management().await.unwrap(), "fleet")
        .get(&cp.machine)
        .await
        .unwrap();
    let annotations = machine.metadata.annotations.unwrap_or_default();
    assert!(
        !annotations.contains_key(ck8s_certs_api::annotations::FORCE_REFRESH),
        "{annotations:?}"
    );
    env.patch_machine(worker, json!({ "metadata": { "finalizers": null } }))
        .await;
}

#[tokio::test]
async fn an_in_place_upgrade_holds_the_cluster_s_renewals() {
    let env = shared().await;
    let status = |value: &str| {
        json!({ "metadata": { "annotations": {
            ck8s_certs_api::annotations::IN_PLACE_UPGRADE_STATUS: value
        } } })
    };
    let message = held_then_refreshed(
        &env,
        "beta",
        "beta-cp-0",
        "InPlaceUpgrade",
        async |env, nodes| {
            let worker = nodes.iter().find(|n| n.machine == "beta-md-0-w0").unwrap();
            env.patch_machine(worker, status("in-progress")).await;
        },
        async |env, nodes| {
            let worker = nodes.iter().find(|n| n.machine == "beta-md-0-w0").unwrap();
            env.patch_machine(worker, status("done")).await;
        },
    )
    .await;
    assert!(
        message.starts_with(
            "Renewal due, held while Machine beta-md-0-w0 of the cluster is being upgraded in place (gate InPlaceUpgrade)"
        ),
        "{message}"
    );
}

#[tokio::test]
async fn a_machine_deployment_rollout_holds_the_cluster_s_renewals() {
    let env = shared().await;
    // gamma lives in namespace `edge`.
    let rollout =
        |up_to_date: i64| json!({ "status": { "replicas": 2, "upToDateReplicas": up_to_date } });
    let status = async |env: &Environment, up_to_date: i64| {
        env.machine_deployment_api(env.management().await.unwrap(), "edge")
            .patch_status(
                "gamma-md-0",
                &PatchParams::default(),
                &Patch::Merge(rollout(up_to_date)),
            )
            .await
            .unwrap();
    };
    let message = held_then_refreshed(
        &env,
        "gamma",
        "alpha-cp-0",
        "RollingOut",
        async |env, _| status(env, 1).await,
        async |env, _| status(env, 2).await,
    )
    .await;
    assert!(
        message.starts_with(
            "Renewal due, held while MachineDeployment gamma-md-0 of the cluster is rolling out (gate RollingOut)"
        ),
        "{message}"
    );

    // The control plane's rollout holds its other control plane, by the contract's counts (a
    // new Machine beside the old ones), until its counts settle.
    let [cp] = env.nodes("gamma", ["alpha-cp-1"]);
    let _controller = env.start_controller("gates-gamma", &[]);
    let counts = async |replicas: i64, updated: i64| {
        env.control_plane_api(env.management().await.unwrap(), "edge")
            .patch_status(
                "gamma-control-plane",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({ "status": { "replicas": replicas, "updatedReplicas": updated } }),
                ),
            )
            .await
            .unwrap();
    };
    counts(3, 1).await;
    env.sim.clear_calls("gamma", &cp.node).await.unwrap();
    env.patch_machine(
        &cp,
        json!({ "metadata": { "labels": { "e2e-policy": "gates-gamma" } } }),
    )
    .await;
    let held = env
        .wait_for_status(&cp, TIMEOUT, "held by the control plane's rollout", |s| {
            s.renewal.as_ref().is_some_and(|r| r.reason == "RollingOut")
        })
        .await;
    let message = held.renewal.map(|r| r.message).unwrap_or_default();
    assert!(
        message.starts_with(
            "Renewal due, held while CK8sControlPlane gamma-control-plane of the cluster is rolling out (gate RollingOut)"
        ),
        "{message}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(env.calls(&cp).await.is_empty(), "calls while held");
    let settled = jiff::Timestamp::now();
    counts(2, 2).await;
    env.wait_for_done(&cp, TIMEOUT).await;
    let calls = env.calls(&cp).await;
    assert_eq!(runs(&calls).len(), 1, "{calls:#?}");
    let first: jiff::Timestamp = calls[0].started_at.parse().unwrap();
    assert!(
        first >= settled,
        "a call at {first}, before the rollout ended at {settled}"
    );
}

#[tokio::test]
async fn another_control_plane_not_ready_holds_the_cluster_s_renewals() {
    let env = shared().await;
    // As the node lifecycle controller marks a Node whose kubelet stopped posting.
    let ready = async |env: &Environment, nodes: &[NodeInfo], status: &str, reason: &str| {
        let other = nodes.iter().find(|n| n.machine == "trio-cp-1").unwrap();
        let api: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(env.cluster("trio").client().await.unwrap());
        let now = jiff::Timestamp::now().to_string();
        api.patch_status(
            &other.node,
            &PatchParams::default(),
            &Patch::Strategic(json!({ "status": { "conditions": [{
                "type": "Ready", "status": status, "reason": reason,
                "lastHeartbeatTime": now, "lastTransitionTime": now,
            }] } })),
        )
        .await
        .unwrap();
    };
    let message = held_then_refreshed(
        &env,
        "trio",
        "trio-cp-0",
        "ControlPlaneNotReady",
        async |env, nodes| ready(env, nodes, "Unknown", "NodeStatusUnknown").await,
        async |env, nodes| ready(env, nodes, "True", "KubeletReady").await,
    )
    .await;
    assert!(
        message.starts_with("Renewal due, held while control plane trio-cp-1's Node ")
            && message.contains(
                " is not Ready (Ready=Unknown, NodeStatusUnknown) (gate ControlPlaneNotReady)"
            ),
        "{message}"
    );
}

#[tokio::test]
async fn a_workload_api_that_is_not_ready_holds_the_cluster_s_renewals() {
    let env = shared().await;
    let message = held_then_refreshed(
        &env,
        "solo",
        "solo-cp-0",
        "ApiNotReady",
        // SIGTERM: it serves on with /readyz failing (as while a node shuts down), then exits
        // and is started again.
        async |env, _| {
            env.drain_workload_api("solo", TIMEOUT).await.unwrap();
        },
        async |env, _| env.wait_for_workload_api("solo", TIMEOUT).await.unwrap(),
    )
    .await;
    assert!(
        message.starts_with(
            "Renewal due, held while the workload API server is not ready (GET /readyz answered 500: [-]shutdown failed: reason withheld) (gate ApiNotReady)"
        ),
        "{message}"
    );
}

/// Deletes `worker`'s Machine, held by `finalizer` (it stays, being deleted, until that goes).
async fn delete_held(env: &Environment, worker: &NodeInfo, finalizer: &str) {
    env.patch_machine(worker, json!({ "metadata": { "finalizers": [finalizer] } }))
        .await;
    env.machine_api(env.management().await.unwrap(), "fleet")
        .delete(&worker.machine, &DeleteParams::default())
        .await
        .unwrap();
}
