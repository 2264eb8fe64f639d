//! Two shards (`--watch-filter` instances, each with its own Lease) and one cluster moved from
//! the first to the second while a refresh of one of its nodes is in flight, following
//! docs/sharding.md's move commands (as API patches). The node is refreshed exactly once, by the
//! shard that started it, which records it; the new shard waits and says so; the next refresh is
//! the new shard's; the old shard no longer acts on the cluster.

use std::time::{Duration, Instant};

use ck8s_certs::k8sd::wire::path;
use ck8s_certs_api::annotations::CERTIFICATES_EXPIRY;
use ck8s_certs_api::capi::{CLUSTER_NAME_LABEL, GROUP, WATCH_FILTER_LABEL};
use ck8s_certs_api::machine_certificates::{MachineCertificates, Phase};
use ck8s_certs_e2e::controller::{Controller, NAMESPACE};
use ck8s_certs_e2e::sim::{CallRecord, Endpoint, runs};
use ck8s_certs_e2e::{Environment, shared_of};
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::{Api, ResourceExt};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);
const SHARD_A: &str = "sharding-a";
const SHARD_B: &str = "sharding-b";
/// How long the node holds the first `run` before acting on it: the move happens meanwhile.
const HELD: Duration = Duration::from_secs(10);

/// One instance per shard; POD_NAME names it in its Events.
async fn shard(env: &Environment, filter: &str) -> Controller {
    let pod = format!("{filter}-0");
    let controller = env.start_controller_with_env(filter, &[], &[("POD_NAME", pod.as_str())]);
    controller.wait_until_leader(TIMEOUT).await;
    controller.wait_until_ready(TIMEOUT).await;
    controller
}

fn lease(filter: &str) -> String {
    format!("{NAMESPACE}/ck8s-certs-{filter}")
}

/// docs/sharding.md, "Moving a cluster": the Cluster, then every Machine of the cluster.
/// `kubectl label cluster -n <ns> <cluster> cluster.x-k8s.io/watch-filter=<to> --overwrite`
/// `kubectl label machines -n <ns> -l cluster.x-k8s.io/cluster-name=<cluster> cluster.x-k8s.io/watch-filter=<to> --overwrite`
async fn move_cluster(env: &Environment, namespace: &str, cluster: &str, to: &str) {
    let client = env.management().await.unwrap();
    let version = env.spec.capi_version.storage_version();
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(GROUP, version, "Cluster")),
    );
    let label = json!({ "metadata": { "labels": { WATCH_FILTER_LABEL: to } } });
    let params = PatchParams {
        field_manager: Some("kubectl-label".into()),
        ..Default::default()
    };
    clusters
        .patch(cluster, &params, &Patch::Merge(&label))
        .await
        .unwrap();
    let machines = env.machine_api(client, namespace);
    let selector = format!("{CLUSTER_NAME_LABEL}={cluster}");
    for machine in machines
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
    {
        machines
            .patch(&machine.name_any(), &params, &Patch::Merge(&label))
            .await
            .unwrap();
    }
}

fn answered(calls: &[CallRecord]) -> usize {
    runs(calls).iter().filter(|r| r.status == 200).count()
}

/// Lines of `log` (from byte `from` on) about `machine`'s reconciles.
fn about(log: &str, from: usize, machine: &str) -> Vec<String> {
    log.get(from..)
        .unwrap_or_default()
        .lines()
        .filter(|line| line.contains(machine))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_cluster_moved_between_shards_mid_refresh_is_refreshed_once_then_by_the_new_shard() {
    let env = shared_of(&["alpha"]).await;
    let alpha = env.cluster("alpha");
    let namespace = alpha.spec.namespace.clone();
    let node = alpha.node("alpha-cp-0").clone();
    let machine = format!("{namespace}/{}", node.machine);

    // The cluster starts in shard a.
    move_cluster(&env, &namespace, "alpha", SHARD_A).await;
    let a = shard(&env, SHARD_A).await;
    let b = shard(&env, SHARD_B).await;
    let expiry_known = |mc: &MachineCertificates| {
        mc.status.as_ref().is_some_and(|s| s.expiry.is_some())
            && mc.labels().get(WATCH_FILTER_LABEL).map(String::as_str) == Some(SHARD_A)
    };
    for n in &alpha.nodes {
        env.wait_for_certificates(n, TIMEOUT, "shard a's record", expiry_known)
            .await;
    }

    // A refresh starts on shard a and is held on the node.
    env.annotate_held_at(&node, Endpoint::Run, HELD, TIMEOUT)
        .await;
    let in_flight = env.operation(&node).await;
    assert_eq!(in_flight.phase, Phase::Running, "{in_flight:#?}");
    assert_eq!(
        in_flight.carrier.as_ref().map(|c| c.lease.as_str()),
        Some(lease(SHARD_A).as_str()),
        "{in_flight:#?}"
    );

    // The move, while that run is in flight.
    let moved = Instant::now();
    move_cluster(&env, &namespace, "alpha", SHARD_B).await;

    // Shard b sees an unfinished operation of shard a, which still holds its Lease: it leaves it
    // to shard a and says so, and takes the record into its own shard.
    let waiting = env
        .wait_for_certificates(
            &node,
            HELD,
            "shard b saying who carries the refresh out",
            |mc| {
                mc.status.as_ref().is_some_and(|s| {
                    s.conditions.iter().any(|c| {
                        c.type_ == "Refreshing"
                            && c.status == "True"
                            && c.message
                                .contains(&format!("Carried out by {}", lease(SHARD_A)))
                    })
                })
            },
        )
        .await;
    println!(
        "shard b left the refresh to shard a {:.1}s after the move",
        moved.elapsed().as_secs_f64()
    );
    assert_eq!(
        waiting.labels().get(WATCH_FILTER_LABEL).map(String::as_str),
        Some(SHARD_B),
        "the record follows its Machine into shard b"
    );

    // Shard a finishes the refresh it started and records it; the node is refreshed once.
    env.wait_for_done(&node, TIMEOUT).await;
    println!(
        "the refresh ended {:.1}s after the move",
        moved.elapsed().as_secs_f64()
    );
    // Anything shard b might still (wrongly) send would come within its recheck period.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let calls = env.calls(&node).await;
    assert_eq!(runs(&calls).len(), 1, "one run: {:#?}", runs(&calls));
    assert_eq!(answered(&calls), 1);
    assert_eq!(calls.iter().filter(|c| c.path == path::PLAN).count(), 1);
    let op = env.operation(&node).await;
    assert_eq!(op.phase, Phase::Succeeded, "{op:#?}");
    assert_eq!(op.seed, Some(runs(&calls)[0].seed()));
    assert_eq!(op.run_attempts, 1);
    assert_eq!(
        op.carrier.as_ref().map(|c| c.lease.clone()),
        Some(lease(SHARD_A))
    );
    let state = env.sim.node(&node).await.unwrap();
    assert_eq!(
        env.machine_annotations(&node).await[CERTIFICATES_EXPIRY],
        state.cert_not_after,
        "the recorded expiry is what the node serves"
    );
    assert!(state.serves_disk(), "{state:#?}");
    assert_eq!(
        env.event_reporters(&node, "CertificatesRefreshDone").await,
        vec![format!("{SHARD_A}-0")],
        "shard a recorded its own refresh, once"
    );
    for n in alpha.nodes.iter().filter(|n| n.machine != node.machine) {
        let calls = env.calls(n).await;
        assert!(runs(&calls).is_empty(), "{}: {:#?}", n.node, runs(&calls));
        let mc = env
            .wait_for_certificates(n, TIMEOUT, "its record in shard b", |mc| {
                mc.labels().get(WATCH_FILTER_LABEL).map(String::as_str) == Some(SHARD_B)
            })
            .await;
        assert!(mc.status.is_some());
    }

    // The next refresh of the moved cluster is shard b's; shard a does not act on it.
    let a_log_from = a.log().len();
    env.annotate_refresh(&node, "90d").await;
    env.wait_for_done(&node, TIMEOUT).await;
    let calls = env.calls(&node).await;
    assert_eq!(runs(&calls).len(), 2, "{:#?}", runs(&calls));
    assert_eq!(answered(&calls), 2);
    let op = env.operation(&node).await;
    assert_eq!(op.phase, Phase::Succeeded, "{op:#?}");
    assert_eq!(op.ttl, "90d");
    let carrier = op.carrier.clone().expect("the operation names its carrier");
    assert_eq!(carrier.lease, lease(SHARD_B), "{op:#?}");
    assert_eq!(op.seed, Some(runs(&calls)[1].seed()));
    assert_eq!(
        env.event_reporters(&node, "CertificatesRefreshInProgress")
            .await,
        vec![format!("{SHARD_A}-0"), format!("{SHARD_B}-0")],
        "each refresh was announced once, the second by shard b"
    );
    assert_eq!(
        env.event_reporters(&node, "CertificatesRefreshDone").await,
        vec![format!("{SHARD_A}-0"), format!("{SHARD_B}-0")]
    );
    let state = env.sim.node(&node).await.unwrap();
    assert_eq!(
        env.machine_annotations(&node).await[CERTIFICATES_EXPIRY],
        state.cert_not_after
    );
    let a_lines = about(&a.log(), a_log_from, &machine);
    assert!(
        a_lines.is_empty(),
        "shard a acted on the moved Machine: {a_lines:#?}"
    );
    let b_lines = about(&b.log(), 0, &machine);
    assert!(
        b_lines.iter().any(|l| l.contains("Certificates refreshed")),
        "{b_lines:#?}"
    );
}
