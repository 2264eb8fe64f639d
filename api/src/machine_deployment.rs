//! A CAPI MachineDeployment as the fleet trigger caches it: its identity, labels (the watch
//! filter), its Cluster, the fleet annotations and the manager of its refresh trigger. Nothing
//! else of the object is kept.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::core::DynamicResourceScope;
use serde::Deserialize;

use crate::capi::{CLUSTER_NAME_LABEL, GROUP};
use crate::machine::{CapiVersion, Pairs, TriggerMeta, capi_resource};

#[derive(Clone, Debug, Default, PartialEq)]
pub struct MachineDeployment {
    /// The identity and labels.
    pub metadata: ObjectMeta,
    /// The [`CLUSTER_READ_ANNOTATIONS`] only: its fleet refresh trigger and what became of it.
    pub annotations: Pairs,
    /// The field manager that last set the fleet refresh trigger.
    pub trigger_manager: Option<String>,
    /// `spec.clusterName`, else the `cluster.x-k8s.io/cluster-name` label.
    pub cluster_name: Option<String>,
    /// The `cluster.x-k8s.io/paused` annotation.
    pub paused: bool,
    /// A rollout is running, as its status tells: not as many Machines as `spec.replicas`, or
    /// not all of them up to date. Not judged before the status counts any Machine.
    pub rolling_out: bool,
}

capi_resource!(MachineDeployment, "MachineDeployment", "machinedeployments");

impl<'de> Deserialize<'de> for MachineDeployment {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default)]
            metadata: ObjectMeta,
            #[serde(default)]
            spec: Spec,
            /// Read leniently ([`rolling_out`]): a status of another shape is no rollout.
            #[serde(default)]
            status: serde_json::Value,
        }
        #[derive(Default, Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Spec {
            #[serde(default)]
            cluster_name: Option<String>,
            #[serde(default)]
            replicas: Option<i64>,
        }
        let Wire {
            metadata,
            spec,
            status,
        } = Wire::deserialize(deserializer)?;
        let rolling_out = rolling_out(spec.replicas, &status);
        let cluster_name = spec.cluster_name.or_else(|| {
            metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(CLUSTER_NAME_LABEL).cloned())
        });
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

/// Whether `status` shows a rollout: fewer or more Machines than `desired`, or some not up to
/// date (v1beta2 `upToDateReplicas`; v1beta1 `updatedReplicas`, or `v1beta2.upToDateReplicas`
/// as Cluster API v1.10 serves it). The Cluster API control plane contract has a control plane
/// provider report the same counts.
pub fn rolling_out(desired: Option<i64>, status: &serde_json::Value) -> bool {
    let count = |pointer: &str| status.pointer(pointer).and_then(serde_json::Value::as_i64);
    let Some(replicas) = count("/replicas") else {
        return false;
    };
    let up_to_date = count("/upToDateReplicas")
        .or_else(|| count("/v1beta2/upToDateReplicas"))
        .or_else(|| count("/updatedReplicas"));
    desired.is_some_and(|d| d != replicas) || up_to_date.is_some_and(|u| u < replicas)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::annotations::REFRESH_CERTIFICATES;
    use crate::capi::PAUSED_ANNOTATION;

    #[test]
    fn keeps_its_cluster_trigger_and_manager_only() {
        let md: MachineDeployment = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
            "metadata": {
                "name": "md-0", "namespace": "ns", "uid": "u",
                "labels": { "cluster.x-k8s.io/watch-filter": "a" },
                "annotations": { REFRESH_CERTIFICATES: "1y", "other": "x", PAUSED_ANNOTATION: "" },
                "managedFields": [{ "manager": "kubectl-annotate", "operation": "Update", "fieldsType": "FieldsV1",
                    "fieldsV1": { "f:metadata": { "f:annotations": { "f:v1beta2.k8sd.io/refresh-certificates": {} } } } }]
            },
            "spec": { "clusterName": "c", "replicas": 3, "template": { "spec": { "clusterName": "c" } } }
        }))
        .unwrap();
        assert_eq!(md.cluster_name.as_deref(), Some("c"));
        assert_eq!(md.annotations.get(REFRESH_CERTIFICATES), Some("1y"));
        assert_eq!(md.annotations.len(), 1);
        assert_eq!(md.trigger_manager.as_deref(), Some("kubectl-annotate"));
        assert!(md.paused);
        assert_eq!(md.metadata.uid.as_deref(), Some("u"));
        assert!(md.metadata.managed_fields.is_none() && md.metadata.annotations.is_none());
        assert!(!md.rolling_out, "no status: not judged");
    }

    #[test]
    fn a_rollout_is_read_from_its_status_in_either_version() {
        let md = |spec: serde_json::Value, status: serde_json::Value| -> MachineDeployment {
            serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
                "metadata": { "name": "md-0", "namespace": "ns" },
                "spec": spec, "status": status,
            }))
            .unwrap()
        };
        let three = json!({ "replicas": 3 });
        let cases = [
            (json!({ "replicas": 3, "upToDateReplicas": 3 }), false),
            (json!({ "replicas": 3, "upToDateReplicas": 2 }), true),
            (json!({ "replicas": 4, "upToDateReplicas": 4 }), true),
            (json!({ "replicas": 3, "updatedReplicas": 1 }), true),
            (json!({ "replicas": 3, "updatedReplicas": 3 }), false),
            (
                json!({ "replicas": 3, "v1beta2": { "upToDateReplicas": 2 } }),
                true,
            ),
            (json!({}), false),
            (json!("not a status"), false),
        ];
        for (status, rolling) in cases {
            assert_eq!(
                md(three.clone(), status.clone()).rolling_out,
                rolling,
                "{status}"
            );
        }
    }
}
