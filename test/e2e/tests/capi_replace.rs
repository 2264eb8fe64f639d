//! A worker that cannot be refreshed in place, replaced beside the real Cluster API manager
//! (issue 37): under a policy with `inPlaceImpossible: Replace`, the controller deletes its
//! Machine once, and its MachineSet (Cluster API's controller, not ours) creates a new one. Its
//! own test binary: it changes its cluster's Machines for good.

use std::time::{Duration, Instant};

use ck8s_certs_e2e::capi_manager;
use ck8s_certs_e2e::drill::{expire_nodes, wait_pinned};
use ck8s_certs_e2e::shared_with;
use kube::api::ListParams;
use serde_json::json;

const CLUSTER: &str = "delta";
const TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test]
async fn a_worker_that_cannot_be_refreshed_in_place_is_replaced_by_its_machine_set() {
    let env = shared_with(|| capi_manager::spec(CLUSTER)).await;
    let manager = env.capi_manager.clone().expect("the manager");
    let ns = capi_manager::NAMESPACE;
    let set = capi_manager::machine_set_name(CLUSTER);
    let nodes = env.isolate_cluster(CLUSTER, "replace").await;
    let _controller = env.start_controller("replace", &[]);
    wait_pinned(&env, &nodes).await;
    let lost = nodes
        .iter()
        .find(|n| n.machine == format!("{CLUSTER}-md-0-w1"))
        .unwrap()
        .clone();
    let client = env.management().await.unwrap();
    let machines = env.capi_api(client.clone(), ns, "Machine");
    let of_the_set = ListParams::default().labels(&format!(
        "{}={CLUSTER}",
        ck8s_certs_api::capi::CLUSTER_NAME_LABEL
    ));
    let owned_by_set = |list: &kube::core::ObjectList<kube::api::DynamicObject>| -> Vec<String> {
        list.items
            .iter()
            .filter(|m| {
                m.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.controller == Some(true) && o.name == set)
            })
            .filter_map(|m| m.metadata.name.clone())
            .collect()
    };
    // The MachineSet controls its workers once the manager adopted them.
    let start = Instant::now();
    let before = loop {
        let owned = owned_by_set(&machines.list(&of_the_set).await.unwrap());
        if owned.contains(&lost.machine) {
            break owned;
        }
        assert!(start.elapsed() < TIMEOUT, "not adopted: {owned:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };

    // Switched off past its expiry: its kubelet.conf too.
    expire_nodes(&env, std::slice::from_ref(&lost), &lost.machine).await;
    let audit_from = ck8s_certs_e2e::controlplane::audited_writes(&env.dir, "management").len();
    let policy_at = Instant::now();
    env.create_policy(
        ns,
        "replace",
        "replace",
        json!({
            "policy": "Automatic", "ttl": "1y",
            "inPlaceImpossible": { "action": "Replace" },
        }),
    )
    .await;
    // Cluster API drains a deleted Machine's Node first; no kubelet here ends the evicted pods,
    // so the drain (and the wait for volumes) is turned off as an operator may.
    env.patch_machine(
        &lost,
        json!({ "metadata": {
            "labels": { "e2e-policy": "replace" },
            "annotations": {
                "machine.cluster.x-k8s.io/exclude-node-draining": "",
                "machine.cluster.x-k8s.io/exclude-wait-for-node-volume-detach": "",
            },
        } }),
    )
    .await;

    // Deleted (Cluster API's finalizer then drains and removes it), and the MachineSet makes
    // a new Machine in its place.
    let start = Instant::now();
    let (deleted_after, new) = loop {
        let list = machines.list(&of_the_set).await.unwrap();
        let deleting = list.items.iter().any(|m| {
            m.metadata.name.as_deref() == Some(lost.machine.as_str())
                && m.metadata.deletion_timestamp.is_some()
        }) || !list
            .items
            .iter()
            .any(|m| m.metadata.name.as_deref() == Some(lost.machine.as_str()));
        let new: Vec<String> = owned_by_set(&list)
            .into_iter()
            .filter(|name| !before.contains(name))
            .collect();
        if deleting && !new.is_empty() {
            break (policy_at.elapsed(), new);
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "not replaced: {:?}\n{}\n{}",
            list.items
                .iter()
                .map(|m| (&m.metadata.name, &m.metadata.deletion_timestamp))
                .collect::<Vec<_>>(),
            manager.log_tail(30),
            env.capi_api(client.clone(), ns, "MachineSet")
                .get(&set)
                .await
                .map(|ms| ms.data["status"].clone())
                .unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!(
        "replaced beside the Cluster API manager: {new:?} made {deleted_after:?} after the policy"
    );
    assert_eq!(new.len(), 1, "{new:?}");

    // The controller deleted that one Machine, once; nothing else.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ours: Vec<String> = ck8s_certs_e2e::controlplane::audited_writes(&env.dir, "management")
        .into_iter()
        .skip(audit_from)
        .filter(|w| w.verb == "delete")
        .filter(|w| {
            w.user
                .username
                .starts_with("system:serviceaccount:ck8s-certs-system:")
        })
        .filter_map(|w| w.object_ref)
        .map(|o| format!("{} {}/{}", o.resource, o.namespace, o.name))
        .collect();
    assert_eq!(ours, [format!("machines {ns}/{}", lost.machine)]);
    let events = env.cluster_events(ns, CLUSTER).await;
    assert!(
        events.iter().any(|e| {
            e.reason.as_deref() == Some("CertificatesMachineReplaced")
                && e.note.as_deref().is_some_and(|n| {
                    n.contains(&format!("(owned by MachineSet {set})"))
                        && n.contains("CertificateRenewalPolicy replace replaces such workers")
                })
        }),
        "{events:#?}"
    );
}
