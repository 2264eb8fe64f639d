use super::*;
use kube::Resource;
use serde_json::json;

fn dynamic(value: Value) -> DynamicObject {
    serde_json::from_value(value).unwrap()
}

#[test]
fn reads_a_v1beta2_machine() {
    let m = MachineView::from_dynamic(&dynamic(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": { "name": "m", "namespace": "ns", "uid": "u",
            "labels": { "cluster.x-k8s.io/cluster-name": "c", "cluster.x-k8s.io/control-plane": "" } },
        "spec": { "clusterName": "c", "bootstrap": { "configRef": { "apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "CK8sConfig", "name": "cfg" } } },
        "status": { "nodeRef": { "name": "n1" } }
    })));
    assert!(m.is_ck8s() && m.control_plane);
    assert_eq!(
        (
            m.cluster.as_deref(),
            m.node_name.as_deref(),
            m.bootstrap_name.as_deref()
        ),
        (Some("c"), Some("n1"), Some("cfg"))
    );
}

#[test]
fn reads_a_v1beta1_machine_and_rejects_other_providers() {
    let m = MachineView::from_dynamic(&dynamic(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
        "metadata": { "name": "m", "namespace": "ns" },
        "spec": { "clusterName": "c", "bootstrap": { "configRef": { "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1", "kind": "KubeadmConfig", "name": "cfg" } } }
    })));
    assert!(!m.is_ck8s());
    assert_eq!(m.node_name, None);
    let odd = MachineView::from_dynamic(&dynamic(
        json!({ "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "metadata": { "name": "x" }, "spec": 7 }),
    ));
    assert!(!odd.is_ck8s());
}

#[test]
fn a_cluster_is_paused_by_spec_or_annotation() {
    let spec = ClusterView::from_dynamic(&dynamic(
        json!({ "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": { "name": "c" }, "spec": { "paused": true, "controlPlaneEndpoint": { "host": "" } } }),
    ));
    assert!(spec.paused);
    assert_eq!(spec.endpoint_host, None);
    let annotated = ClusterView::from_dynamic(&dynamic(
        json!({ "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster", "metadata": { "name": "c", "annotations": { "cluster.x-k8s.io/paused": "" } }, "spec": { "controlPlaneEndpoint": { "host": "api.example.com", "port": 6443 } } }),
    ));
    assert!(annotated.paused);
    assert_eq!(annotated.endpoint_host.as_deref(), Some("api.example.com"));
}

fn full_machine() -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {
            "name": "m", "namespace": "ns", "uid": "u", "resourceVersion": "7",
            "generation": 3, "finalizers": ["machine.cluster.x-k8s.io"],
            "ownerReferences": [{ "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet", "name": "s", "uid": "s1" }],
            "labels": { "cluster.x-k8s.io/cluster-name": "c", "cluster.x-k8s.io/control-plane": "" },
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{…}",
                "machine.cluster.x-k8s.io/certificates-expiry": "2027-01-01T00:00:00Z",
                "v1beta2.k8sd.io/refresh-certificates": "1y"
            },
            "managedFields": [
                { "manager": "capi", "operation": "Update", "fieldsType": "FieldsV1",
                  "fieldsV1": { "f:spec": { "f:version": {} } } },
                { "manager": "kubectl-annotate", "operation": "Update", "fieldsType": "FieldsV1",
                  "fieldsV1": { "f:metadata": { "f:annotations": { "f:v1beta2.k8sd.io/refresh-certificates": {}, "f:other": {} } } } }
            ]
        },
        "spec": {
            "clusterName": "c", "version": "v1.34.4",
            "bootstrap": { "configRef": { "apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "CK8sConfig", "name": "cfg" }, "dataSecretName": "s" },
            "infrastructureRef": { "kind": "DockerMachine", "name": "m" }
        },
        "status": {
            "nodeRef": { "name": "n1" }, "phase": "Running",
            "addresses": [{ "type": "InternalIP", "address": "10.0.0.1" }],
            "conditions": [{ "type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z" }]
        }
    })
}

#[test]
fn a_cached_machine_reads_like_the_full_object() {
    let full = full_machine();
    let cached: Machine = serde_json::from_value(full.clone()).unwrap();
    let mut expected = MachineView::from_dynamic(&dynamic(full));
    expected
        .annotations
        .remove("kubectl.kubernetes.io/last-applied-configuration");
    assert_eq!(MachineView::of(&cached), expected);
    assert_eq!(cached.trigger_manager.as_deref(), Some("kubectl-annotate"));
    // Only the identity, labels and the annotations we read are kept.
    let meta = &cached.metadata;
    assert_eq!(
        (meta.resource_version.as_deref(), meta.uid.as_deref()),
        (Some("7"), Some("u"))
    );
    assert_eq!(
        (
            &meta.managed_fields,
            &meta.owner_references,
            &meta.finalizers,
            meta.generation
        ),
        (&None, &None, &None, None)
    );
    assert_eq!((&meta.labels, &meta.annotations), (&None, &None));
    assert_eq!(cached.annotations.len(), 2);
    assert_eq!(
        cached
            .annotations
            .get("v1beta2.k8sd.io/refresh-certificates"),
        Some("1y")
    );
    assert_eq!(
        cached.labels.get("cluster.x-k8s.io/control-plane"),
        Some("")
    );
    assert!(!cached.labels.contains_key("cluster.x-k8s.io/watch-filter"));
}

#[test]
fn a_cached_v1beta1_machine_reads_like_the_full_object() {
    let full = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
        "metadata": { "name": "m", "namespace": "ns", "deletionTimestamp": "2026-01-01T00:00:00Z" },
        "spec": { "clusterName": "c", "bootstrap": { "configRef": { "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "CK8sConfig", "name": "cfg", "namespace": "ns" } } },
        "status": { "nodeRef": { "apiVersion": "v1", "kind": "Node", "name": "n1" } }
    });
    let cached: Machine = serde_json::from_str(&full.to_string()).unwrap();
    let view = MachineView::of(&cached);
    assert_eq!(view, MachineView::from_dynamic(&dynamic(full)));
    assert!(view.is_ck8s() && view.deleting && !view.control_plane);
    assert_eq!(cached.trigger_manager, None);
}

#[test]
fn an_odd_machine_decodes_with_the_odd_parts_missing() {
    for odd in [
        json!({ "metadata": { "name": "x" }, "spec": 7 }),
        json!({ "metadata": { "name": "x" }, "spec": { "clusterName": 7, "bootstrap": [1, { "a": 2 }] }, "status": "odd" }),
        json!({ "metadata": { "name": "x" }, "spec": { "bootstrap": { "configRef": { "kind": { "k": "v" }, "name": null } } }, "status": { "nodeRef": { "name": false } } }),
    ] {
        let cached: Machine = serde_json::from_str(&odd.to_string()).unwrap();
        assert_eq!(cached.metadata.name.as_deref(), Some("x"));
        assert_eq!(
            (&cached.cluster_name, &cached.bootstrap, &cached.node_name),
            (&None, &BootstrapRef::default(), &None),
            "{odd}"
        );
        assert!(!MachineView::of(&cached).is_ck8s());
    }
    // Unknown fields, nested deeper than what is read, are skipped.
    let deep: Machine = serde_json::from_str(
        r#"{"metadata":{"name":"x"},"spec":{"x":{"y":[{"z":null}]},"clusterName":"c"},"extra":[1,2]}"#,
    )
    .unwrap();
    assert_eq!(deep.cluster_name.as_deref(), Some("c"));
}

#[test]
fn a_cached_cluster_reads_like_the_full_object() {
    for full in [
        json!({ "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": { "name": "c", "namespace": "ns", "labels": { "env": "prod" }, "annotations": { "cluster.x-k8s.io/paused": "" } },
            "spec": { "paused": false, "controlPlaneEndpoint": { "host": "api.example.com", "port": 6443 },
                      "clusterNetwork": { "pods": { "cidrBlocks": ["10.1.0.0/16"] } }, "topology": { "class": "x" } },
            "status": { "phase": "Provisioned" } }),
        json!({ "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": { "name": "c" }, "spec": { "paused": true, "controlPlaneEndpoint": { "host": "" } } }),
        json!({ "metadata": { "name": "c" }, "spec": { "paused": "yes", "controlPlaneEndpoint": 1 } }),
    ] {
        let cached: Cluster = serde_json::from_str(&full.to_string()).unwrap();
        assert_eq!(
            ClusterView::of(&cached),
            ClusterView::from_dynamic(&dynamic(full))
        );
        assert_eq!(cached.metadata.annotations, None);
    }
}

#[test]
fn capi_kinds_name_their_served_version() {
    let machine = Machine::default();
    let reference = machine.object_ref(&CapiVersion::V1Beta1);
    assert_eq!(
        (reference.api_version.as_deref(), reference.kind.as_deref()),
        (Some("cluster.x-k8s.io/v1beta1"), Some("Machine"))
    );
    assert_eq!(Cluster::plural(&CapiVersion::V1Beta2), "clusters");
    assert_eq!(
        CapiVersion::from_version("v1beta2"),
        Some(CapiVersion::V1Beta2)
    );
    assert_eq!(CapiVersion::from_version("v1alpha4"), None);
}

#[test]
fn the_trigger_s_owner_is_the_manager_that_last_set_it_and_how() {
    let machine = |entries: serde_json::Value| -> Machine {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {
                "name": "m", "namespace": "ns",
                "annotations": { "v1beta2.k8sd.io/refresh-certificates": "1y" },
                "managedFields": entries,
            },
            "spec": { "clusterName": "c" },
        }))
        .unwrap()
    };
    let trigger = json!({ "f:metadata": { "f:annotations": { "f:v1beta2.k8sd.io/refresh-certificates": {} } } });
    // Copied from a machine template by Cluster API's MachineSet controller.
    let applied = machine(json!([
        { "manager": "capi-machineset", "operation": "Apply", "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": trigger },
    ]));
    assert_eq!(applied.trigger_manager.as_deref(), Some("capi-machineset"));
    assert!(applied.trigger_applied);
    // Then annotated by a person: theirs, an update.
    let annotated = machine(json!([
        { "manager": "capi-machineset", "operation": "Apply", "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": trigger },
        { "manager": "kubectl-annotate", "operation": "Update", "time": "2026-01-01T00:05:00Z", "fieldsType": "FieldsV1", "fieldsV1": trigger },
    ]));
    assert_eq!(
        annotated.trigger_manager.as_deref(),
        Some("kubectl-annotate")
    );
    assert!(!annotated.trigger_applied);
    let view = MachineView::of(&annotated);
    assert_eq!(
        (view.trigger_manager.as_deref(), view.trigger_applied),
        (Some("kubectl-annotate"), false)
    );
}

#[test]
fn a_remediation_left_to_the_owner_is_read_from_either_list_of_conditions() {
    let decoded = |status: serde_json::Value| -> bool {
        let machine: Machine =
            serde_json::from_value(json!({ "metadata": { "name": "x" }, "status": status }))
                .unwrap();
        machine.owner_remediation
    };
    let waiting =
        json!({ "type": "OwnerRemediated", "status": "False", "reason": "WaitingForRemediation" });
    // v1beta2, as Cluster API v1.11 and later store it.
    assert!(decoded(
        json!({ "conditions": [{ "type": "Ready", "status": "True" }, waiting] })
    ));
    // v1beta1, as Cluster API v1.10 serves it: its own list, and the v1beta2 one beside it.
    assert!(decoded(
        json!({ "conditions": [], "v1beta2": { "conditions": [waiting] } })
    ));
    assert!(!decoded(
        json!({ "conditions": [{ "type": "OwnerRemediated", "status": "True" }] })
    ));
    assert!(!decoded(
        json!({ "conditions": [{ "type": "HealthCheckSucceeded", "status": "False" }] })
    ));
    // Odd shapes are no remediation, and take nothing else with them.
    assert!(!decoded(json!({ "conditions": "x" })));
    assert!(decoded(
        json!({ "conditions": [1, "y", { "type": 3 }, waiting] })
    ));
    assert!(!decoded(json!({ "v1beta2": [waiting] })));
}
