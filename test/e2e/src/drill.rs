//! The expired drill (issue 37): a cluster switched off past its certificates' expiry, made so
//! for real (an expired workload API certificate, expired kubelet certificates, an expired
//! kubelet.conf), and what its recovery must show. Shared by the one-cluster and the fleet
//! drills.

use std::time::{Duration, Instant};

use ck8s_certs_api::annotations::CERTIFICATES_EXPIRY;
use ck8s_certs_api::cluster_certificates::ClusterCertificates;
use ck8s_certs_api::machine_certificates::{MachineCertificates, Phase};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::Environment;
use crate::fixtures::NodeInfo;
use crate::sim::CallRecord;

const TIMEOUT: Duration = Duration::from_secs(90);

/// An instant the simulator recorded (RFC 3339, a varying number of fraction digits: compared
/// as text they would sort wrong).
pub fn at(text: &str) -> jiff::Timestamp {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// Waits until each node's k8sd certificate is pinned (the cluster was healthy once), then
/// forgets the calls made so far.
pub async fn wait_pinned(env: &Environment, nodes: &[NodeInfo]) {
    for node in nodes {
        env.wait_for_status(node, TIMEOUT, "the k8sd pin", |s| {
            s.k8sd_fingerprint.is_some() && s.expiry.is_some()
        })
        .await;
        env.sim
            .clear_calls(&node.cluster, &node.node)
            .await
            .unwrap();
    }
}

/// What a drill cluster went through: every leaf certificate expired, one worker's kubelet.conf
/// with them.
pub struct Dark {
    /// When the lost worker's certificates ended (the controller's record says so, as it would
    /// once that instant passed).
    pub ended: jiff::Timestamp,
    /// The worker whose kubelet.conf expired: it cannot be refreshed in place.
    pub lost: NodeInfo,
}

/// Switches `cluster` off past its certificates' expiry, as far as anything can tell: its
/// workload API server serves an expired certificate (the real kube-apiserver, started again
/// with it), every node's certificates expired (k8sd reports it, and each kubelet serves an
/// expired certificate, so the API server refuses to port-forward to it), the worker `lost`'s
/// kubelet.conf expired, and the controller's record of each node is that end (written as it
/// was recorded while the cluster was up, now passed). The calls made so far are forgotten.
pub async fn go_dark(env: &Environment, cluster: &str, nodes: &[NodeInfo], lost: &str) -> Dark {
    env.expire_workload_api(cluster, TIMEOUT).await.unwrap();
    expire_nodes(env, nodes, lost).await
}

/// [`go_dark`] but for the workload API server (which the caller expired, maybe shared):
/// every node's certificates expired, `lost`'s kubelet.conf with them, and the controller's
/// record of each node is that end. The calls made so far are forgotten.
pub async fn expire_nodes(env: &Environment, nodes: &[NodeInfo], lost: &str) -> Dark {
    let client = env.management().await.unwrap();
    let mut ended = None;
    for node in nodes {
        let records: Api<MachineCertificates> = Api::namespaced(client.clone(), &node.namespace);
        let state = env.sim.set_certificates_expired(node, true).await.unwrap();
        let end = at(&state.cert_not_after);
        if node.machine == lost {
            ended = Some(end);
        }
        records
            .patch_status(
                &node.machine,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": { "expiry": end.to_string() } })),
            )
            .await
            .unwrap();
        env.patch_machine(
            node,
            json!({ "metadata": { "annotations": { CERTIFICATES_EXPIRY: end.to_string() } } }),
        )
        .await;
    }
    let lost = nodes.iter().find(|n| n.machine == lost).unwrap().clone();
    env.sim
        .set_client_certificate_expired(&lost, true)
        .await
        .unwrap();
    for node in nodes {
        env.sim
            .clear_calls(&node.cluster, &node.node)
            .await
            .unwrap();
    }
    Dark {
        ended: ended.unwrap(),
        lost,
    }
}

/// The record of a refreshed node: its operation's transport and its calls.
struct Recovered {
    machine: String,
    control_plane: bool,
    transport: String,
    calls: Vec<CallRecord>,
}

impl Recovered {
    fn run(&self) -> &CallRecord {
        crate::sim::runs(&self.calls)
            .into_iter()
            .find(|c| c.status == 200)
            .unwrap_or_else(|| panic!("no answered run on {}: {:#?}", self.machine, self.calls))
    }
}

fn ended_at(call: &CallRecord) -> jiff::Timestamp {
    at(&call.started_at) + jiff::SignedDuration::from_secs_f64(call.duration_ms / 1000.0)
}

/// What the drill requires of a recovered cluster: the control planes were refreshed one at a
/// time, each directly (past the expired API or their expired kubelets); the workers directly
/// past their expired kubelets, approved by a control plane that was refreshed already; the
/// workload API answers with a valid certificate; the lost worker is InPlaceImpossible after
/// one `run`, and the cluster's record names it as what is still expired (or, `replaced`: its
/// Machine was deleted to be replaced, and the record says nothing expired any more).
/// `own_api`: the cluster has its workload API server to itself, so its first control plane
/// renewed it (was reached past it) and its workers waited for that.
pub async fn check_recovered(
    env: &Environment,
    cluster: &str,
    dark: &Dark,
    own_api: bool,
    replaced: bool,
) {
    let mut recovered = Vec::new();
    for node in &env.cluster(cluster).nodes {
        if node.machine == dark.lost.machine {
            continue;
        }
        let transport = env
            .machine_certificates(node)
            .await
            .and_then(|m| m.status?.operation?.transport)
            .unwrap_or_default();
        recovered.push(Recovered {
            machine: node.machine.clone(),
            control_plane: node.machine.contains("-cp-"),
            transport,
            calls: env.calls(node).await,
        });
    }
    let (mut cps, workers): (Vec<_>, Vec<_>) = recovered.into_iter().partition(|r| r.control_plane);
    cps.sort_by_key(|r| at(&r.run().started_at));
    let kubelet = "(the node's kubelet serving certificate expired)";
    let api = "(the workload API server's certificate expired)";
    for (i, cp) in cps.iter().enumerate() {
        let why = |t: &str| match (i, own_api) {
            (0, true) => t.ends_with(api),
            (0, false) => t.ends_with(api) || t.ends_with(kubelet),
            _ => t.ends_with(kubelet),
        };
        assert!(
            cp.transport.starts_with("direct connection to ") && why(&cp.transport),
            "control plane {i} ({}): {}",
            cp.machine,
            cp.transport
        );
        if let Some(next) = cps.get(i + 1) {
            assert!(
                ended_at(cp.run()) <= at(&next.run().started_at),
                "control planes refreshed at once: {} and {}",
                cp.machine,
                next.machine
            );
        }
    }
    // Every approve a control plane answered, with when it started.
    let approves: Vec<(&str, jiff::Timestamp, i64)> = cps
        .iter()
        .flat_map(|cp| {
            cp.calls
                .iter()
                .filter(|c| c.path == ck8s_certs::k8sd::wire::path::APPROVE && c.status == 200)
                .map(|c| (cp.machine.as_str(), at(&c.started_at), c.seed()))
        })
        .collect();
    let first_cp_run_end = ended_at(cps[0].run());
    for worker in &workers {
        assert!(
            worker.transport.starts_with("direct connection to ")
                && worker.transport.ends_with(kubelet),
            "{}: {}",
            worker.machine,
            worker.transport
        );
        let first = worker.calls.first().map(|c| at(&c.started_at)).unwrap();
        assert!(
            !own_api || first >= first_cp_run_end,
            "{} asked at {first}, before the first control plane's run ended ({first_cp_run_end})",
            worker.machine
        );
        let seed = worker.run().seed();
        let (approver, approved_at, _) = approves
            .iter()
            .find(|(_, _, s)| *s == seed)
            .unwrap_or_else(|| panic!("no approve of {}'s seed: {approves:?}", worker.machine));
        let approver_run = cps.iter().find(|cp| cp.machine == *approver).unwrap().run();
        assert!(
            ended_at(approver_run) <= *approved_at,
            "{} approved by {approver} before its own refresh",
            worker.machine
        );
    }

    // The workload API answers with a valid certificate again.
    assert!(
        !env.sim
            .cluster(cluster)
            .await
            .unwrap()
            .api_certificate_expired
    );
    let client = env.cluster(cluster).client().await.unwrap();
    assert!(crate::controlplane::is_ready(&client).await);

    // The lost worker: told within its first run, never retried.
    let ready = ready_condition(env, &dark.lost).await;
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "InPlaceImpossible"),
        "{}",
        ready.message
    );
    assert!(
        ready.message.contains(&format!(
            "`kubectl delete machine -n fleet {}`",
            dark.lost.machine
        )),
        "{}",
        ready.message
    );
    let calls = env.calls(&dark.lost).await;
    assert_eq!(crate::sim::runs(&calls).len(), 1, "{calls:#?}");

    // The cluster's record: what is still expired is the lost worker.
    let records: Api<ClusterCertificates> = Api::namespaced(
        env.management().await.unwrap(),
        &env.cluster(cluster).spec.namespace,
    );
    let start = Instant::now();
    loop {
        let condition = records
            .get_opt(cluster)
            .await
            .unwrap()
            .and_then(|r| r.status)
            .and_then(|s| {
                s.conditions
                    .into_iter()
                    .find(|c| c.type_ == "CertificatesExpired")
            });
        let told = condition.as_ref().is_some_and(|c| match replaced {
            true => c.status == "False",
            false => {
                c.reason == "NodeCertificatesExpired"
                    && c.message.starts_with(&format!(
                        "The certificates of Machine {} expired at {}",
                        dark.lost.machine, dark.ended
                    ))
            }
        });
        if told {
            break;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "{cluster}'s record does not name the lost worker: {condition:#?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until every node of `cluster` but the lost one finished its refresh, and the lost one
/// says InPlaceImpossible; answers how long after `from` each did.
pub async fn wait_recovered(
    env: &Environment,
    cluster: &str,
    dark: &Dark,
    from: Instant,
) -> Vec<(String, Duration)> {
    let mut done_after = Vec::new();
    for node in &env.cluster(cluster).nodes {
        env.wait_for_status(node, Duration::from_secs(300), "recovered", |s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "InPlaceImpossible")
                || (node.machine != dark.lost.machine
                    && s.operation
                        .as_ref()
                        .is_some_and(|o| o.phase == Phase::Succeeded))
        })
        .await;
        done_after.push((node.machine.clone(), from.elapsed()));
    }
    done_after
}

/// Makes `node`'s Machine owned (controlled) by a MachineSet `<cluster>-md-0-drill` of its
/// MachineDeployment, as Cluster API's MachineDeployment controller would have made it (the
/// environment has no Cluster API manager: nothing reconciles that MachineSet). Answers the
/// MachineSet's name.
pub async fn own_by_machine_set(env: &Environment, node: &NodeInfo) -> String {
    use ck8s_certs_api::capi::{CLUSTER_NAME_LABEL, DEPLOYMENT_NAME_LABEL, GROUP};
    let client = env.management().await.unwrap();
    let version = env.spec.capi_version.storage_version();
    let deployment = format!("{}-md-0", node.cluster);
    let set = format!("{deployment}-drill");
    let resource = |kind: &str| {
        kube::api::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(GROUP, version, kind))
    };
    let sets: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), &node.namespace, &resource("MachineSet"));
    let machines: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client, &node.namespace, &resource("Machine"));
    let machine = machines.get(&node.machine).await.unwrap();
    let labels = json!({ CLUSTER_NAME_LABEL: node.cluster, DEPLOYMENT_NAME_LABEL: deployment });
    let created: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/{version}"), "kind": "MachineSet",
        "metadata": { "name": set, "namespace": node.namespace, "labels": labels },
        "spec": {
            "clusterName": node.cluster,
            "replicas": 1,
            "selector": { "matchLabels": labels },
            "template": {
                "metadata": { "labels": labels },
                "spec": machine.data["spec"],
            }
        }
    }))
    .unwrap();
    let created = sets
        .create(&kube::api::PostParams::default(), &created)
        .await
        .unwrap();
    machines
        .patch(
            &node.machine,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": {
                "labels": { DEPLOYMENT_NAME_LABEL: deployment },
                "ownerReferences": [{
                    "apiVersion": format!("{GROUP}/{version}"), "kind": "MachineSet",
                    "name": set, "uid": created.metadata.uid, "controller": true,
                    "blockOwnerDeletion": true
                }]
            } })),
        )
        .await
        .unwrap();
    set
}

/// The `Ready` condition of `node`'s MachineCertificates.
pub async fn ready_condition(
    env: &Environment,
    node: &NodeInfo,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    env.machine_certificates(node)
        .await
        .and_then(|m| m.status)
        .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Ready"))
        .unwrap_or_else(|| panic!("no Ready condition on {}", node.machine))
}

/// The message of the `Refreshing` condition of `status` (empty without one): what a refresh
/// in flight waits for.
pub fn refreshing(
    status: &ck8s_certs_api::machine_certificates::MachineCertificatesStatus,
) -> String {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == "Refreshing")
        .map(|c| c.message.clone())
        .unwrap_or_default()
}
