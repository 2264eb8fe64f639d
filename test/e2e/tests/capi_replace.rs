//! A worker that cannot be refreshed in place, replaced beside the real Cluster API manager
//! (issue 37): under a policy with `inPlaceImpossible: Replace`, the controller deletes its
//! Machine once, and its MachineSet (Cluster API's controller, not ours) creates a new one, but
//! only once the shipped admission policy that lets only a user who may delete Machines ask for
//! Replace has checked the policy's last write. Its own test binary: it changes its cluster's
//! Machines for good.

use std::time::{Duration, Instant};

use ck8s_certs_api::renewal_policy::CertificateRenewalPolicy;
use ck8s_certs_e2e::Environment;
use ck8s_certs_e2e::capi_manager;
use ck8s_certs_e2e::drill::{expire_nodes, wait_pinned};
use ck8s_certs_e2e::fixtures::NodeInfo;
use ck8s_certs_e2e::shared_with;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;

const CLUSTER: &str = "delta";
const TIMEOUT: Duration = Duration::from_secs(120);
/// The shipped admission policy that checks who asks for Replace.
const ADMISSION: &str = "ck8s-certs-renewal-policies";

#[tokio::test]
async fn a_worker_that_cannot_be_refreshed_in_place_is_replaced_by_its_machine_set() {
    let env = shared_with(|| capi_manager::spec(CLUSTER)).await;
    let manager = env.capi_manager.clone().expect("the manager");
    let ns = capi_manager::NAMESPACE;
    let set = capi_manager::machine_set_name(CLUSTER);
    let nodes = env.isolate_cluster(CLUSTER, "replace").await;
    let _controller = env.start_controller(
        "replace",
        &[&format!("--renewal-admission-policy={ADMISSION}")],
    );
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

    // Written while the admission policy was not installed: nothing checked its writer, so
    // nothing is deleted, and the Machine says why.
    let missing = refusal(&env, &lost, "is not installed").await;
    assert!(
        missing.contains(&format!("ValidatingAdmissionPolicy {ADMISSION}")),
        "{missing}"
    );
    env.install_admission_policies().await;
    let touch = |n: u8| json!({ "metadata": { "annotations": { "e2e-touch": n.to_string() } } });
    env.patch_machine(&lost, touch(1)).await;
    let younger = refusal(&env, &lost, "before the admission policy").await;
    assert!(younger.contains("kubectl annotate"), "{younger}");
    assert_exists(&machines, &lost.machine).await;
    // Written again by a user who may delete Machines (the admin), under the policy: checked.
    let policies: kube::Api<CertificateRenewalPolicy> = kube::Api::namespaced(client.clone(), ns);
    policies
        .patch(
            "replace",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": {
                "reviewed": "e2e",
            } } })),
        )
        .await
        .unwrap();
    env.patch_machine(&lost, touch(2)).await;

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

    // The controller deleted that one Machine, once; nothing else. (A delete refused because
    // the Machine changed since it was read, 409, is tried again.)
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ours: Vec<String> = ck8s_certs_e2e::controlplane::audited_writes(&env.dir, "management")
        .into_iter()
        .skip(audit_from)
        .filter(|w| w.verb == "delete")
        .filter(|w| w.response_status.as_ref().and_then(|r| r.code) != Some(409))
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

/// The note of the Machine's `CertificatesMachineReplaceRefused` Event that contains `says`,
/// once there is one.
async fn refusal(env: &Environment, node: &NodeInfo, says: &str) -> String {
    let start = Instant::now();
    loop {
        let events = env.machine_events(node).await;
        if let Some(note) = events
            .iter()
            .filter(|e| e.reason.as_deref() == Some("CertificatesMachineReplaceRefused"))
            .filter_map(|e| e.note.clone())
            .find(|note| note.contains(says))
        {
            return note;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "no refusal saying {says:?}: {events:#?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Machine `name` exists and is not being deleted.
async fn assert_exists(machines: &kube::Api<DynamicObject>, name: &str) {
    let machine = machines.get(name).await.unwrap();
    assert!(
        machine.metadata.deletion_timestamp.is_none(),
        "{name} is being deleted"
    );
}
