//! Cluster API Machines and Clusters as this controller reads them, from either v1beta1 or
//! v1beta2 (their shapes differ in the references):
//! - [`Machine`] and [`Cluster`] are what the watch caches hold: decoded straight from the API
//!   server's JSON into a few fields, so a cached Machine costs about a kilobyte instead of the
//!   full object (see docs/performance.md). Decoding is lenient below `metadata`: a field of an
//!   unexpected shape reads as missing, so one odd object cannot stall a watch.
//! - [`MachineView`] and [`ClusterView`] are the narrow views the decisions take.
//!
//! Reading never fails on an odd object; missing pieces become `None` and the controller says
//! what is missing.

use std::collections::BTreeMap;

use kube::api::DynamicObject;
use serde_json::Value;

use crate::annotations::{
    CERTIFICATES_EXPIRY, FLEET_REQUEST, FLEET_REQUEST_PENDING, FORCE_REFRESH, IN_FLIGHT_REFRESH,
    IN_PLACE_UPGRADE_STATUS, REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS, REFRESH_REQUEST,
    REQUESTER,
};
use crate::capi::{
    BLOCK_MOVE_ANNOTATION, CK8S_CONFIG_GROUP, CK8S_CONFIG_KIND, CLUSTER_NAME_LABEL,
    CONTROL_PLANE_LABEL, DELETE_FOR_MOVE_ANNOTATION, PAUSED_ANNOTATION,
    REMEDIATE_MACHINE_ANNOTATION,
};

#[derive(Clone, Debug, Default, PartialEq)]
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
    /// The field manager that last set the refresh trigger, and whether it owns it through
    /// server-side apply.
    pub trigger_manager: Option<String>,
    pub trigger_applied: bool,
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
            deleting: meta.deletion_timestamp.is_some()
                || meta
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(DELETE_FOR_MOVE_ANNOTATION)),
            annotations: meta.annotations.clone().unwrap_or_default(),
            labels,
            trigger_manager: cached::trigger_manager(meta),
            trigger_applied: cached::trigger_applied(meta),
        }
    }

    /// Whether an object's refresh trigger (any kind that carries one) was last set through
    /// server-side apply: by an owner that asserts it, which a denial would stall.
    pub fn trigger_set_by_apply(
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> bool {
        cached::trigger_applied(meta)
    }

    /// The view of a cached Machine (its annotations are the [`READ_ANNOTATIONS`] only).
    pub fn of(machine: &Machine) -> Self {
        let meta = &machine.metadata;
        let labels = machine.labels.to_map();
        Self {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone(),
            cluster: machine.cluster().map(str::to_owned),
            control_plane: labels.contains_key(CONTROL_PLANE_LABEL),
            bootstrap_kind: machine.bootstrap.kind.clone(),
            bootstrap_group: machine.bootstrap.group.clone(),
            bootstrap_name: machine.bootstrap.name.clone(),
            node_name: machine.node_name.clone(),
            deleting: meta.deletion_timestamp.is_some()
                || machine
                    .annotations
                    .get(DELETE_FOR_MOVE_ANNOTATION)
                    .is_some(),
            annotations: machine.annotations.to_map(),
            labels,
            trigger_manager: machine.trigger_manager.clone(),
            trigger_applied: machine.trigger_applied,
        }
    }

    /// Bootstrapped by the CK8s bootstrap provider.
    pub fn is_ck8s(&self) -> bool {
        is_ck8s(
            self.bootstrap_kind.as_deref(),
            self.bootstrap_group.as_deref(),
        )
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }
}

/// A bootstrap reference to a CK8sConfig (the group may be left out).
fn is_ck8s(kind: Option<&str>, group: Option<&str>) -> bool {
    kind == Some(CK8S_CONFIG_KIND) && group.is_none_or(|g| g == CK8S_CONFIG_GROUP)
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterView {
    pub labels: BTreeMap<String, String>,
    pub paused: bool,
    /// `spec.controlPlaneEndpoint.host`, when set and not empty.
    pub endpoint_host: Option<String>,
}

impl ClusterView {
    pub fn of(cluster: &Cluster) -> Self {
        Self {
            labels: cluster.metadata.labels.clone().unwrap_or_default(),
            paused: cluster.paused,
            endpoint_host: cluster.endpoint_host.clone(),
        }
    }

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

/// Which served version of the Cluster API group Machines and Clusters are read in: the
/// `DynamicType` of [`Machine`] and [`Cluster`]. One byte in every cached object reference, where
/// an `ApiResource` costs a few hundred.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CapiVersion {
    #[default]
    V1Beta2,
    V1Beta1,
}

impl CapiVersion {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::V1Beta2 => "v1beta2",
            Self::V1Beta1 => "v1beta1",
        }
    }

    /// `v1beta2` or `v1beta1`; `None` for a version this controller does not read.
    pub fn from_version(version: &str) -> Option<Self> {
        match version {
            "v1beta2" => Some(Self::V1Beta2),
            "v1beta1" => Some(Self::V1Beta1),
            _ => None,
        }
    }
}

/// The Machine annotations the controller reads; a cached [`Machine`] keeps no others.
pub const READ_ANNOTATIONS: [&str; 13] = [
    IN_PLACE_UPGRADE_STATUS,
    REMEDIATE_MACHINE_ANNOTATION,
    REFRESH_CERTIFICATES,
    FORCE_REFRESH,
    REFRESH_CERTIFICATES_STATUS,
    CERTIFICATES_EXPIRY,
    REFRESH_REQUEST,
    REQUESTER,
    IN_FLIGHT_REFRESH,
    PAUSED_ANNOTATION,
    FLEET_REQUEST,
    BLOCK_MOVE_ANNOTATION,
    DELETE_FOR_MOVE_ANNOTATION,
];

/// The annotations a cached Cluster keeps: its fleet refresh trigger and what became of it.
pub const CLUSTER_READ_ANNOTATIONS: [&str; 5] = [
    REFRESH_CERTIFICATES,
    REFRESH_CERTIFICATES_STATUS,
    FLEET_REQUEST,
    FLEET_REQUEST_PENDING,
    REQUESTER,
];

mod cached;
#[cfg(test)]
mod tests;

pub use cached::{BootstrapRef, Cluster, Machine, Pairs};
pub(crate) use cached::{TriggerMeta, capi_resource};
