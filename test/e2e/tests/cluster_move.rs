//! `clusterctl move` and paused Clusters. clusterctl pauses a Cluster, then waits while any
//! object it moves carries `clusterctl.cluster.x-k8s.io/block-move`, then copies the objects
//! (without their status) and deletes them from the source.
//!
//! - A Machine carries our block-move exactly while its refresh runs on the node; a refresh that
//!   reached the node finishes on a paused Cluster (and then releases it); nothing new starts on
//!   a paused Cluster.
//! - A fleet request carries it until it ends (its progress is status, which a move drops); a
//!   finished one records its outcome in an annotation.
//! - The pinned clusterctl moves a cluster mid-refresh to a second management API server: it
//!   waits for the refresh, our objects go with the Cluster (records, MachineCertificates, fleet
//!   requests, renewal policies), and the controller there carries on (CAPI v1beta2 management
//!   clusters only: the pinned clusterctl refuses older contracts).
//!
//! One environment: clusters `held` (namespace `pausing`) and `mover` (namespace `moving`), one
//! control plane and two workers each, and a second management API server.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ck8s_certs::k8sd::wire::path;
use ck8s_certs_api::annotations::{
    CERTIFICATES_EXPIRY, REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS, REQUEST_OUTCOME,
};
use ck8s_certs_api::capi::{BLOCK_MOVE_ANNOTATION, BLOCK_MOVE_OWNER, WATCH_FILTER_LABEL};
use ck8s_certs_api::certificate_refresh::{CertificateRefresh, RequestPhase, labels};
use ck8s_certs_api::machine_certificates::{MachineCertificates, Phase};
use ck8s_certs_api::reasons::condition_reasons;
use ck8s_certs_api::renewal_policy::CertificateRenewalPolicy;
use ck8s_certs_e2e::fixtures::{ClusterSpec, NodeInfo, Role, write_provisioned_status};
use ck8s_certs_e2e::sim::{Endpoint, Fault};
use ck8s_certs_e2e::{EnvSpec, Environment, shared_with, tool};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(180);

fn spec() -> EnvSpec {
    let mut spec = EnvSpec::standard();
    let cluster = |name: &str, namespace: &str| ClusterSpec {
        name: name.into(),
        namespace: namespace.into(),
        machine_prefix: name.into(),
        control_planes: 1,
        workers: 2,
        microcluster_port: None,
        extra_sans: Vec::new(),
        endpoint_host: format!("{name}.k8s.example.internal"),
    };
    spec.clusters = vec![cluster("held", "pausing"), cluster("mover", "moving")];
    spec.move_target = true;
    spec
}

async fn env() -> Arc<Environment> {
    shared_with(spec).await
}

fn workers(env: &Environment, cluster: &str) -> Vec<NodeInfo> {
    env.cluster(cluster)
        .nodes_with_role(Role::Worker)
        .cloned()
        .collect()
}

async fn set_paused(env: &Environment, cluster: &str, paused: bool) {
    let namespace = env.cluster(cluster).spec.namespace.clone();
    env.cluster_api(env.management().await.unwrap(), &namespace)
        .patch(
            cluster,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "paused": paused } })),
        )
        .await
        .unwrap();
}

async fn runs(env: &Environment, node: &NodeInfo) -> usize {
    env.calls(node)
        .await
        .iter()
        .filter(|c| c.path == path::RUN && c.method == "POST")
        .count()
}

/// Waits until the node's refresh is past `plan` (its seed is recorded in its request): it runs
/// on the node.
async fn wait_until_on_the_node(env: &Environment, node: &NodeInfo) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let phase = env
            .in_flight(node)
            .await
            .filter(|op| !op.is_finished())
            .map(|op| op.phase);
        if matches!(phase, Some(p) if p != Phase::Pending) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} never reached its node",
            node.machine
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn block_move(annotations: &std::collections::BTreeMap<String, String>) -> Option<&str> {
    annotations.get(BLOCK_MOVE_ANNOTATION).map(String::as_str)
}

/// A one-Machine request made by hand; waits for `done` to hold of it.
async fn wait_for_request(
    api: &Api<CertificateRefresh>,
    name: &str,
    done: impl Fn(&CertificateRefresh) -> bool,
) -> CertificateRefresh {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let request = api.get(name).await.unwrap();
        if done(&request) {
            return request;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: {:?} {:?}",
            request.annotations(),
            request.status
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn request_for(machine: &str, suspend: bool) -> CertificateRefresh {
    serde_json::from_value(json!({
        "apiVersion": "certificates.ck8s.io/v1alpha1", "kind": "CertificateRefresh",
        "metadata": { "name": format!("{machine}-by-hand") },
        "spec": { "target": { "machine": machine }, "ttl": "1y", "origin": "Manual", "suspend": suspend },
    }))
    .unwrap()
}

#[tokio::test]
async fn block_move_is_held_exactly_while_a_refresh_runs_and_a_paused_cluster_finishes_it() {
    let env = env().await;
    env.isolate_cluster("held", "held").await;
    let _controller = env.start_controller("held", &[]);
    let [slow, waiting] = <[NodeInfo; 2]>::try_from(workers(&env, "held")).unwrap();

    // A refresh whose `run` takes 6 s: block-move comes with in-progress.
    env.sim
        .inject(
            &Fault::latency(Duration::from_secs(6))
                .on(&slow)
                .at(Endpoint::Run),
        )
        .await
        .unwrap();
    env.annotate_refresh(&slow, "1y").await;
    let annotations = env
        .wait_for_machine(&slow, TIMEOUT, |a| block_move(a).is_some())
        .await;
    assert_eq!(block_move(&annotations), Some(BLOCK_MOVE_OWNER));
    assert_eq!(
        annotations
            .get(REFRESH_CERTIFICATES_STATUS)
            .map(String::as_str),
        Some("in-progress")
    );
    wait_until_on_the_node(&env, &slow).await;

    // Paused as clusterctl does before it waits: the refresh on the node still finishes and
    // releases the move; a new request waits.
    set_paused(&env, "held", true).await;
    env.annotate_refresh(&waiting, "1y").await;
    let annotations = env.wait_for_refresh(&slow, TIMEOUT).await;
    assert_eq!(
        annotations
            .get(REFRESH_CERTIFICATES_STATUS)
            .map(String::as_str),
        Some("done")
    );
    assert_eq!(block_move(&annotations), None, "{annotations:?}");
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let reason = env
            .machine_certificates(&waiting)
            .await
            .and_then(|m| m.status)
            .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.reason);
        if reason.as_deref() == Some(condition_reasons::PAUSED) {
            break;
        }
        assert!(Instant::now() < deadline, "{reason:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let annotations = env.machine_annotations(&waiting).await;
    assert_eq!(
        annotations.get(REFRESH_CERTIFICATES).map(String::as_str),
        Some("1y")
    );
    assert_eq!(block_move(&annotations), None);
    assert_eq!(runs(&env, &waiting).await, 0);

    // Resumed: it runs, once.
    set_paused(&env, "held", false).await;
    let annotations = env.wait_for_refresh(&waiting, TIMEOUT).await;
    assert_eq!(
        annotations
            .get(REFRESH_CERTIFICATES_STATUS)
            .map(String::as_str),
        Some("done")
    );
    assert_eq!(block_move(&annotations), None);
    assert_eq!(runs(&env, &slow).await, 1);
    assert_eq!(runs(&env, &waiting).await, 1);

    // A fleet request holds block-move while it is unfinished, suspended included, and records
    // its outcome where a move keeps it when it ends.
    let api: Api<CertificateRefresh> = Api::namespaced(env.management().await.unwrap(), "pausing");
    let mut request = request_for(&waiting.machine, true);
    request.metadata.labels = Some([(WATCH_FILTER_LABEL.to_owned(), "held".to_owned())].into());
    api.create(&PostParams::default(), &request).await.unwrap();
    let name = request.name_any();
    let held = wait_for_request(&api, &name, |r| {
        r.status.as_ref().and_then(|s| s.phase) == Some(RequestPhase::Suspended)
            && r.annotations().contains_key(BLOCK_MOVE_ANNOTATION)
    })
    .await;
    assert_eq!(block_move(held.annotations()), Some(BLOCK_MOVE_OWNER));
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "suspend": false } })),
    )
    .await
    .unwrap();
    let ended = wait_for_request(&api, &name, |r| {
        r.annotations().contains_key(REQUEST_OUTCOME)
    })
    .await;
    assert_eq!(
        ended.status.as_ref().and_then(|s| s.phase),
        Some(RequestPhase::Succeeded)
    );
    assert_eq!(
        ended.annotations().get(REQUEST_OUTCOME).map(String::as_str),
        Some("Succeeded")
    );
    assert_eq!(block_move(ended.annotations()), None);
    assert_eq!(runs(&env, &waiting).await, 2);
}

/// Runs the pinned clusterctl with nothing of the developer's environment.
fn clusterctl(dir: &Path, args: &[&str]) -> std::process::Output {
    let home = dir.join("clusterctl-home");
    std::fs::create_dir_all(&home).unwrap();
    let config = dir.join("clusterctl.yaml");
    // It would ask the Go module proxy for a newer clusterctl otherwise.
    std::fs::write(&config, "CLUSTERCTL_DISABLE_VERSIONCHECK: \"true\"\n").unwrap();
    Command::new(tool(
        "CK8S_E2E_CLUSTERCTL",
        "clusterctl",
        "CLUSTERCTL_VERSION",
    ))
    .args(args)
    .arg("--config")
    .arg(&config)
    .env_clear()
    .env("PATH", std::env::var_os("PATH").unwrap_or_default())
    .env("HOME", &home)
    .env("XDG_CONFIG_HOME", home.join(".config"))
    .output()
    .expect("run clusterctl")
}

async fn names<K>(client: &Client, namespace: &str) -> Vec<String>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let mut names: Vec<String> = api
        .list_metadata(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|m| m.name_any())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn clusterctl_move_waits_for_the_refresh_and_takes_our_objects_along() {
    if EnvSpec::standard().capi_version.storage_version() != "v1beta2" {
        eprintln!(
            "skipped: the pinned clusterctl moves only v1beta2 management clusters (Cluster API v1.11 on)"
        );
        return;
    }
    let env = env().await;
    let nodes = env.isolate_cluster("mover", "mover").await;
    // A run held 30 s on the node below: the run timeout must outlast it.
    let _controller = env.start_controller("mover", &["--k8sd-run-timeout=60s"]);
    let source = env.management().await.unwrap();
    let [first, second] = <[NodeInfo; 2]>::try_from(workers(&env, "mover")).unwrap();

    // Something of each kind of ours: a policy (no Cluster owns it), a record, a finished
    // request.
    env.create_policy_in(
        "mover",
        "moving",
        "mover-policy",
        "mover-policy",
        json!({ "policy": "Automatic", "renewBefore": "1d", "ttl": "1y" }),
    )
    .await;
    let requests: Api<CertificateRefresh> = Api::namespaced(source.clone(), "moving");
    let mut request = request_for(&first.machine, false);
    request.metadata.labels = Some([(WATCH_FILTER_LABEL.to_owned(), "mover".to_owned())].into());
    requests
        .create(&PostParams::default(), &request)
        .await
        .unwrap();
    let by_hand = request.name_any();
    wait_for_request(&requests, &by_hand, |r| {
        r.annotations().get(REQUEST_OUTCOME).map(String::as_str) == Some("Succeeded")
    })
    .await;
    assert_eq!(runs(&env, &first).await, 1);
    // What CAPI's controllers would have written, and clusterctl checks.
    write_provisioned_status(&source, &env.spec.capi_version, "mover", &nodes)
        .await
        .unwrap();

    // A refresh whose `run` takes 30 s, on its node when the move starts.
    env.sim
        .inject(
            &Fault::latency(Duration::from_secs(30))
                .on(&second)
                .at(Endpoint::Run),
        )
        .await
        .unwrap();
    env.annotate_refresh(&second, "1y").await;
    wait_until_on_the_node(&env, &second).await;
    let target = env.move_target.as_ref().unwrap();
    let (from, to) = (
        env.management_kubeconfig.display().to_string(),
        target.kubeconfig.display().to_string(),
    );
    let dir = env.dir.clone();
    let moving = tokio::task::spawn_blocking(move || {
        clusterctl(
            &dir,
            &[
                "move",
                "--kubeconfig",
                &from,
                "--to-kubeconfig",
                &to,
                "--namespace",
                "moving",
            ],
        )
    });
    // clusterctl paused the Cluster while the Machine still blocked the move.
    let deadline = Instant::now() + TIMEOUT;
    let clusters = env.cluster_api(source.clone(), "moving");
    loop {
        let paused = clusters
            .get_opt("mover")
            .await
            .unwrap()
            .is_some_and(|c| c.data["spec"]["paused"] == json!(true));
        if paused {
            let annotations = env.machine_annotations(&second).await;
            assert_eq!(
                block_move(&annotations),
                Some(BLOCK_MOVE_OWNER),
                "paused before the refresh ended: {annotations:?}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "clusterctl never paused mover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let output = moving.await.unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("clusterctl move:\n{printed}");
    assert!(output.status.success(), "clusterctl move failed");
    assert!(
        printed.contains("Move blocked by clusterctl.cluster.x-k8s.io/block-move annotation"),
        "clusterctl did not wait for the refresh:\n{printed}"
    );
    assert_eq!(runs(&env, &second).await, 1);

    // Nothing of ours is left behind; everything arrived.
    let target_client = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&target.kubeconfig).unwrap(),
            &Default::default(),
        )
        .await
        .unwrap(),
    )
    .unwrap();
    let left = (
        names::<MachineCertificates>(&source, "moving").await,
        names::<CertificateRefresh>(&source, "moving").await,
        names::<CertificateRenewalPolicy>(&source, "moving").await,
    );
    assert!(
        left.0.is_empty() && left.1.is_empty() && left.2.is_empty(),
        "left behind: {left:?}"
    );
    let mut machine_names: Vec<String> = nodes.iter().map(|n| n.machine.clone()).collect();
    machine_names.sort();
    assert_eq!(
        names::<MachineCertificates>(&target_client, "moving").await,
        machine_names
    );
    assert_eq!(
        names::<CertificateRenewalPolicy>(&target_client, "moving").await,
        vec!["mover-policy".to_owned()]
    );
    let records = names::<CertificateRefresh>(&target_client, "moving").await;
    assert!(records.contains(&by_hand), "{records:?}");
    // The records of `first`'s refresh by the request and of `second`'s.
    let arrived: Api<CertificateRefresh> = Api::namespaced(target_client.clone(), "moving");
    for node in [&first, &second] {
        let own = arrived
            .list_metadata(&ListParams::default().labels(&format!(
                "{}={}",
                labels::MACHINE,
                node.machine
            )))
            .await
            .unwrap();
        assert_eq!(own.items.len(), 1, "{}: {records:?}", node.machine);
    }
    let machines = env.machine_api(target_client.clone(), "moving");
    let moved = machines.get(&second.machine).await.unwrap();
    let annotations = moved.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations
            .get(REFRESH_CERTIFICATES_STATUS)
            .map(String::as_str),
        Some("done")
    );
    assert!(annotations.contains_key(CERTIFICATES_EXPIRY));
    assert_eq!(block_move(&annotations), None);

    // The controller of the new management cluster carries on: the finished request is known
    // finished (not run again), and a new refresh works.
    write_provisioned_status(&target_client, &env.spec.capi_version, "mover", &nodes)
        .await
        .unwrap();
    let _there = env.start_controller_on_move_target("mover", &["--k8sd-run-timeout=60s"]);
    let moved_requests: Api<CertificateRefresh> = Api::namespaced(target_client.clone(), "moving");
    let restored = wait_for_request(&moved_requests, &by_hand, |r| r.status.is_some()).await;
    let status = restored.status.unwrap();
    assert_eq!(status.phase, Some(RequestPhase::Succeeded));
    assert!(
        status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("before it was moved")),
        "{status:?}"
    );
    env.annotate_refresh_through(&machines, &first, "2y").await;
    env.wait_for_annotations(&machines, &first.machine, TIMEOUT, |a| {
        a.get(REFRESH_CERTIFICATES_STATUS).map(String::as_str) == Some("done")
            && !a.contains_key(REFRESH_CERTIFICATES)
    })
    .await;
    assert_eq!(
        runs(&env, &first).await,
        2,
        "refreshed once more, on request"
    );
}
