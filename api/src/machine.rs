//! A narrow, version-independent view of a Cluster API Machine and Cluster: only the fields this
//! controller reads, from either v1beta1 or v1beta2 (their shapes differ in the references).
//! Reading never fails on an odd object; missing pieces become `None` and the controller says
//! what is missing.

use std::collections::BTreeMap;

use kube::api::DynamicObject;
use serde_json::Value;

use crate::capi::{
    CK8S_CONFIG_GROUP, CK8S_CONFIG_KIND, CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL, PAUSED_ANNOTATION,
};

#[derive(Clone, Debug, PartialEq)]
pub struct MachineView {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    pub cluster: Option<String>,
    pub control_plane: bool,
    /// Kind and name of `spec.bootstrap.configRef`.
    pub bootstrap_kind: Option<String>,
    pub bootstrap_group: Option<String>,
    pub bootstrap_name: Option<String>,
    /// `status.nodeRef.name`.
    pub node_name: Option<String>,
    pub annotations: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    pub deleting: bool,
}

impl MachineView {
    pub fn from_dynamic(machine: &DynamicObject) -> Self {
        let meta = &machine.metadata;
        let spec = machine.data.get("spec").unwrap_or(&Value::Null);
        let status = machine.data.get("status").unwrap_or(&Value::Null);
        let config_ref = spec.pointer("/bootstrap/configRef").unwrap_or(&Value::Null);
        let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
        // v1beta2 references carry `apiGroup`; v1beta1 ones `apiVersion` (group/version).
        let bootstrap_group = text(config_ref, "apiGroup").or_else(|| {
            text(config_ref, "apiVersion").map(|av| {
                av.split_once('/')
                    .map(|(g, _)| g.to_owned())
                    .unwrap_or_default()
            })
        });
        let labels = meta.labels.clone().unwrap_or_default();
        Self {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone(),
            cluster: text(spec, "clusterName").or_else(|| labels.get(CLUSTER_NAME_LABEL).cloned()),
            control_plane: labels.contains_key(CONTROL_PLANE_LABEL),
            bootstrap_kind: text(config_ref, "kind"),
            bootstrap_group,
            bootstrap_name: text(config_ref, "name"),
            node_name: status
                .pointer("/nodeRef/name")
                .and_then(Value::as_str)
                .map(str::to_owned),
            annotations: meta.annotations.clone().unwrap_or_default(),
            labels,
            deleting: meta.deletion_timestamp.is_some(),
        }
    }

    /// Bootstrapped by the CK8s bootstrap provider.
    pub fn is_ck8s(&self) -> bool {
        self.bootstrap_kind.as_deref() == Some(CK8S_CONFIG_KIND)
            && self
                .bootstrap_group
                .as_deref()
                .is_none_or(|g| g == CK8S_CONFIG_GROUP)
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterView {
    pub labels: BTreeMap<String, String>,
    pub paused: bool,
    /// `spec.controlPlaneEndpoint.host`, when set and not empty.
    pub endpoint_host: Option<String>,
}

impl ClusterView {
    pub fn from_dynamic(cluster: &DynamicObject) -> Self {
        let spec = cluster.data.get("spec").unwrap_or(&Value::Null);
        let annotated = cluster
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(PAUSED_ANNOTATION));
        Self {
            labels: cluster.metadata.labels.clone().unwrap_or_default(),
            paused: annotated || spec.get("paused").and_then(Value::as_bool).unwrap_or(false),
            endpoint_host: spec
                .pointer("/controlPlaneEndpoint/host")
                .and_then(Value::as_str)
                .filter(|h| !h.is_empty())
                .map(str::to_owned),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
}
