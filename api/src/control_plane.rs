//! A CK8s control plane object (`CK8sControlPlane`, of the CK8s control plane provider) as the
//! fleet trigger caches it: its identity, labels (the watch filter), its Cluster, the fleet
//! annotations and the manager of its refresh trigger. Nothing else of the object is kept.
//!
//! The provider's kind is optional on a management cluster: its version is the one discovery
//! recommends at start ([`ControlPlane`]'s dynamic type), and without it nothing is watched.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::core::DynamicResourceScope;
use serde::Deserialize;

use crate::capi::{
    CK8S_CONTROL_PLANE_KIND, CK8S_CONTROL_PLANE_PLURAL, CLUSTER_NAME_LABEL, CONTROL_PLANE_GROUP,
    GROUP,
};
use crate::machine::{Pairs, TriggerMeta};
use crate::machine_deployment::rolling_out;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ControlPlane {
    /// The identity and labels.
    pub metadata: ObjectMeta,
    /// The [`CLUSTER_READ_ANNOTATIONS`] only: its fleet refresh trigger and what became of it.
    pub annotations: Pairs,
    /// The field manager that last set the fleet refresh trigger.
    pub trigger_manager: Option<String>,
    /// The `cluster.x-k8s.io/cluster-name` label (CAPI's Cluster controller sets it on the
    /// control plane it references), else the owning Cluster.
    pub cluster_name: Option<String>,
    /// The `cluster.x-k8s.io/paused` annotation.
    pub paused: bool,
    /// A rollout is running (it replaces control-plane Machines), as its status tells under the
    /// Cluster API control plane contract ([`rolling_out`]).
    pub rolling_out: bool,
}

/// The served version of the control plane kind, e.g. `v1beta2`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ControlPlaneVersion(pub String);

impl Resource for ControlPlane {
    type DynamicType = ControlPlaneVersion;
    type Scope = DynamicResourceScope;

    fn kind(_: &ControlPlaneVersion) -> Cow<'_, str> {
        Cow::Borrowed(CK8S_CONTROL_PLANE_KIND)
    }
    fn group(_: &ControlPlaneVersion) -> Cow<'_, str> {
        Cow::Borrowed(CONTROL_PLANE_GROUP)
    }
    fn version(version: &ControlPlaneVersion) -> Cow<'_, str> {
        Cow::Borrowed(version.0.as_str())
    }
    fn plural(_: &ControlPlaneVersion) -> Cow<'_, str> {
        Cow::Borrowed(CK8S_CONTROL_PLANE_PLURAL)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl<'de> Deserialize<'de> for ControlPlane {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default)]
            metadata: ObjectMeta,
            #[serde(default)]
            spec: Spec,
            /// Read leniently: a status of another shape is no rollout.
            #[serde(default)]
            status: serde_json::Value,
        }
        #[derive(Default, Deserialize)]
        struct Spec {
            #[serde(default)]
            replicas: Option<i64>,
        }
        let Wire {
            metadata,
            spec,
            status,
        } = Wire::deserialize(deserializer)?;
        let rolling_out = rolling_out(spec.replicas, &status);
        let owning_cluster = || {
            metadata.owner_references.as_ref()?.iter().find_map(|o| {
                let group = o.api_version.split_once('/').map(|(g, _)| g);
                (o.kind == "Cluster" && group == Some(GROUP)).then(|| o.name.clone())
            })
        };
        let cluster_name = metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(CLUSTER_NAME_LABEL).cloned())
            .or_else(owning_cluster);
        let meta = TriggerMeta::of(metadata);
        Ok(Self {
            metadata: meta.metadata,
            annotations: meta.annotations,
            trigger_manager: meta.trigger_manager,
            cluster_name,
            paused: meta.paused,
            rolling_out,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::annotations::REFRESH_CERTIFICATES;
    use crate::capi::PAUSED_ANNOTATION;

    #[test]
    fn keeps_its_cluster_trigger_and_manager_only() {
        let cp: ControlPlane = serde_json::from_value(json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "CK8sControlPlane",
            "metadata": {
                "name": "c-control-plane", "namespace": "ns", "uid": "u",
                "labels": { "cluster.x-k8s.io/cluster-name": "c" },
                "annotations": { REFRESH_CERTIFICATES: "1y", "other": "x" },
                "managedFields": [{ "manager": "kubectl-annotate", "operation": "Update", "fieldsType": "FieldsV1",
                    "fieldsV1": { "f:metadata": { "f:annotations": { "f:v1beta2.k8sd.io/refresh-certificates": {} } } } }]
            },
            "spec": { "replicas": 3, "version": "v1.34.4" }
        }))
        .unwrap();
        assert_eq!(cp.cluster_name.as_deref(), Some("c"));
        assert_eq!(cp.annotations.get(REFRESH_CERTIFICATES), Some("1y"));
        assert_eq!(cp.annotations.len(), 1);
        assert_eq!(cp.trigger_manager.as_deref(), Some("kubectl-annotate"));
        assert!(!cp.paused);
        assert_eq!(cp.metadata.uid.as_deref(), Some("u"));
        assert!(cp.metadata.managed_fields.is_none() && cp.metadata.annotations.is_none());
    }

    #[test]
    fn without_the_cluster_label_its_cluster_is_the_owning_cluster() {
        let cp: ControlPlane = serde_json::from_value(json!({
            "metadata": {
                "name": "cp", "namespace": "ns",
                "annotations": { PAUSED_ANNOTATION: "" },
                "ownerReferences": [
                    { "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Cluster", "name": "not-capi", "uid": "x" },
                    { "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster", "name": "c", "uid": "y" }
                ]
            }
        }))
        .unwrap();
        assert_eq!(cp.cluster_name.as_deref(), Some("c"));
        assert!(cp.paused);
        assert!(cp.metadata.owner_references.is_none());
    }

    #[test]
    fn a_rollout_is_read_from_the_contract_s_counts() {
        let cp = |status: serde_json::Value| -> ControlPlane {
            serde_json::from_value(json!({
                "metadata": { "name": "cp", "namespace": "ns" },
                "spec": { "replicas": 3 },
                "status": status,
            }))
            .unwrap()
        };
        assert!(!cp(json!({})).rolling_out);
        assert!(!cp(json!({ "replicas": 3, "updatedReplicas": 3 })).rolling_out);
        // A new Machine beside the old ones, or one not yet up to date.
        assert!(cp(json!({ "replicas": 4, "updatedReplicas": 1 })).rolling_out);
        assert!(cp(json!({ "replicas": 3, "upToDateReplicas": 2 })).rolling_out);
        assert!(!cp(json!("not an object")).rolling_out);
    }
}
