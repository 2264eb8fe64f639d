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

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::DynamicObject;
use kube::core::DynamicResourceScope;
use serde::Deserialize;
use serde_json::Value;

use crate::annotations::{
    CERTIFICATES_EXPIRY, FLEET_REQUEST, FLEET_REQUEST_PENDING, REFRESH_CERTIFICATES,
    REFRESH_CERTIFICATES_STATUS, REFRESH_REQUEST,
};
use crate::capi::{
    BLOCK_MOVE_ANNOTATION, CK8S_CONFIG_GROUP, CK8S_CONFIG_KIND, CLUSTER_NAME_LABEL,
    CONTROL_PLANE_LABEL, DELETE_FOR_MOVE_ANNOTATION, GROUP, PAUSED_ANNOTATION,
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
        }
    }

    /// The view of a cached Machine (its annotations are the [`READ_ANNOTATIONS`] only).
    pub fn of(machine: &Machine) -> Self {
        let meta = &machine.metadata;
        let labels = machine.labels.to_map();
        Self {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone(),
            cluster: machine
                .cluster_name
                .clone()
                .or_else(|| labels.get(CLUSTER_NAME_LABEL).cloned()),
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
pub const READ_ANNOTATIONS: [&str; 8] = [
    REFRESH_CERTIFICATES,
    REFRESH_CERTIFICATES_STATUS,
    CERTIFICATES_EXPIRY,
    REFRESH_REQUEST,
    PAUSED_ANNOTATION,
    FLEET_REQUEST,
    BLOCK_MOVE_ANNOTATION,
    DELETE_FOR_MOVE_ANNOTATION,
];

/// The annotations a cached Cluster keeps: its fleet refresh trigger and what became of it.
pub const CLUSTER_READ_ANNOTATIONS: [&str; 4] = [
    REFRESH_CERTIFICATES,
    REFRESH_CERTIFICATES_STATUS,
    FLEET_REQUEST,
    FLEET_REQUEST_PENDING,
];

/// A Machine as the controllers cache it. `metadata` keeps only the name, namespace, uid,
/// resourceVersion and deletionTimestamp: the labels (policies select on them) and the
/// [`READ_ANNOTATIONS`] are in [`Machine::labels`] and [`Machine::annotations`], not in
/// `metadata`. Nothing else of the object is kept.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Machine {
    pub metadata: ObjectMeta,
    pub labels: Pairs,
    pub annotations: Pairs,
    /// `spec.clusterName`.
    pub cluster_name: Option<String>,
    /// `spec.bootstrap.configRef`.
    pub bootstrap: BootstrapRef,
    /// `status.nodeRef.name`.
    pub node_name: Option<String>,
    /// The field manager that last set the refresh trigger (from `managedFields`), e.g.
    /// `kubectl-annotate`: reported on the refresh.
    pub trigger_manager: Option<String>,
}

impl Machine {
    /// Bootstrapped by the CK8s bootstrap provider (what [`MachineView::is_ck8s`] says of its
    /// view).
    pub fn is_ck8s(&self) -> bool {
        is_ck8s(
            self.bootstrap.kind.as_deref(),
            self.bootstrap.group.as_deref(),
        )
    }
}

/// Labels or annotations, sorted by key. A cached Machine has a handful; a `BTreeMap` would
/// cost a ~550-byte node even for one entry.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pairs(Box<[(Box<str>, Box<str>)]>);

impl Pairs {
    pub(crate) fn new(map: Option<BTreeMap<String, String>>, keep: impl Fn(&str) -> bool) -> Self {
        let pairs = map.into_iter().flatten().filter(|(key, _)| keep(key));
        Self(pairs.map(|(k, v)| (k.into(), v.into())).collect())
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| k.as_ref().cmp(key))
            .ok()
            .map(|i| self.0[i].1.as_ref())
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.0
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

/// `spec.bootstrap.configRef` of a Machine: v1beta2 names the group (`apiGroup`), v1beta1 the
/// group/version (`apiVersion`); both are kept as the group.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BootstrapRef {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub name: Option<String>,
}

/// A Cluster as the controllers cache it: name, namespace, uid, resourceVersion and labels
/// (policies select on them), whether it is paused, and its endpoint host.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cluster {
    pub metadata: ObjectMeta,
    /// The [`CLUSTER_READ_ANNOTATIONS`] only.
    pub annotations: Pairs,
    /// The field manager that last set the fleet refresh trigger.
    pub trigger_manager: Option<String>,
    /// `spec.paused` or the `cluster.x-k8s.io/paused` annotation.
    pub paused: bool,
    /// `spec.controlPlaneEndpoint.host`, when set and not empty.
    pub endpoint_host: Option<String>,
}

macro_rules! capi_resource {
    ($type:ty, $kind:literal, $plural:literal) => {
        impl Resource for $type {
            type DynamicType = CapiVersion;
            // Namespaced; "dynamic" because the version is chosen at run time.
            type Scope = DynamicResourceScope;

            fn kind(_: &CapiVersion) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }
            fn group(_: &CapiVersion) -> Cow<'_, str> {
                Cow::Borrowed(GROUP)
            }
            fn version(version: &CapiVersion) -> Cow<'_, str> {
                Cow::Borrowed(version.as_str())
            }
            fn plural(_: &CapiVersion) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
capi_resource!(Machine, "Machine", "machines");
capi_resource!(Cluster, "Cluster", "clusters");
pub(crate) use capi_resource;

/// The identity of an object: name, namespace, uid, resourceVersion and deletionTimestamp.
/// Whatever else it carries (labels, annotations, managed fields, owner references,
/// finalizers) is left to the caller or dropped.
pub(crate) fn identity(meta: &mut ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        uid: meta.uid.take(),
        resource_version: meta.resource_version.take(),
        deletion_timestamp: meta.deletion_timestamp.take(),
        ..ObjectMeta::default()
    }
}

/// The manager of the `managedFields` entry that owns the refresh trigger.
pub(crate) fn trigger_manager(meta: &ObjectMeta) -> Option<String> {
    let key = format!("f:{REFRESH_CERTIFICATES}");
    meta.managed_fields.as_ref()?.iter().find_map(|entry| {
        let fields = entry.fields_v1.as_ref()?;
        fields.0.pointer("/f:metadata/f:annotations")?.get(&key)?;
        entry.manager.clone()
    })
}

impl<'de> Deserialize<'de> for Machine {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = wire::Machine::deserialize(deserializer)?;
        let spec = wire.spec.0.unwrap_or_default();
        let config_ref = spec
            .bootstrap
            .0
            .and_then(|b| b.config_ref.0)
            .unwrap_or_default();
        let group = config_ref.api_group.0.or_else(|| {
            config_ref.api_version.0.map(|av| {
                av.split_once('/')
                    .map(|(g, _)| g.to_owned())
                    .unwrap_or_default()
            })
        });
        let mut meta = wire.metadata;
        let trigger_manager = trigger_manager(&meta);
        Ok(Self {
            metadata: identity(&mut meta),
            labels: Pairs::new(meta.labels, |_| true),
            annotations: Pairs::new(meta.annotations, |key| READ_ANNOTATIONS.contains(&key)),
            cluster_name: spec.cluster_name.0,
            bootstrap: BootstrapRef {
                group,
                kind: config_ref.kind.0,
                name: config_ref.name.0,
            },
            node_name: wire
                .status
                .0
                .and_then(|s| s.node_ref.0)
                .and_then(|n| n.name.0),
            trigger_manager,
        })
    }
}

impl<'de> Deserialize<'de> for Cluster {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = wire::Cluster::deserialize(deserializer)?;
        let spec = wire.spec.0.unwrap_or_default();
        let annotated = wire
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(PAUSED_ANNOTATION));
        let mut meta = wire.metadata;
        let trigger_manager = trigger_manager(&meta);
        Ok(Self {
            annotations: Pairs::new(meta.annotations.take(), |key| {
                CLUSTER_READ_ANNOTATIONS.contains(&key)
            }),
            trigger_manager,
            metadata: ObjectMeta {
                labels: meta.labels.take().filter(|l| !l.is_empty()),
                ..identity(&mut meta)
            },
            paused: annotated || spec.paused.0.unwrap_or(false),
            endpoint_host: spec
                .control_plane_endpoint
                .0
                .and_then(|e| e.host.0)
                .filter(|h| !h.is_empty()),
        })
    }
}

/// The JSON shapes [`Machine`] and [`Cluster`] are decoded from. Every field below `metadata`
/// is [`Lenient`] and every other field is skipped unread, so decoding allocates only what is
/// kept.
mod wire {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde::Deserialize;

    use super::Lenient;

    #[derive(Deserialize)]
    pub struct Machine {
        pub metadata: ObjectMeta,
        #[serde(default)]
        pub spec: Lenient<MachineSpec>,
        #[serde(default)]
        pub status: Lenient<MachineStatus>,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct MachineSpec {
        #[serde(default)]
        pub cluster_name: Lenient<String>,
        #[serde(default)]
        pub bootstrap: Lenient<Bootstrap>,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Bootstrap {
        #[serde(default)]
        pub config_ref: Lenient<ConfigRef>,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ConfigRef {
        #[serde(default)]
        pub api_group: Lenient<String>,
        #[serde(default)]
        pub api_version: Lenient<String>,
        #[serde(default)]
        pub kind: Lenient<String>,
        #[serde(default)]
        pub name: Lenient<String>,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct MachineStatus {
        #[serde(default)]
        pub node_ref: Lenient<NodeRef>,
    }

    #[derive(Default, Deserialize)]
    pub struct NodeRef {
        #[serde(default)]
        pub name: Lenient<String>,
    }

    #[derive(Deserialize)]
    pub struct Cluster {
        pub metadata: ObjectMeta,
        #[serde(default)]
        pub spec: Lenient<ClusterSpec>,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ClusterSpec {
        #[serde(default)]
        pub paused: Lenient<bool>,
        #[serde(default)]
        pub control_plane_endpoint: Lenient<Endpoint>,
    }

    #[derive(Default, Deserialize)]
    pub struct Endpoint {
        #[serde(default)]
        pub host: Lenient<String>,
    }
}

/// A value that reads as `None` when the JSON has another shape than `T` (a number where a
/// string belongs, a string where an object belongs), instead of failing the whole object. `T`
/// is a scalar or a struct whose own fields are lenient.
struct Lenient<T>(Option<T>);

impl<T> Default for Lenient<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::value::{MapAccessDeserializer, StrDeserializer};
        use serde::de::{IgnoredAny, IntoDeserializer, MapAccess, SeqAccess, Visitor};
        use std::marker::PhantomData;

        struct LenientVisitor<T>(PhantomData<T>);

        impl<T> LenientVisitor<T> {
            /// A scalar that `T` may or may not accept.
            fn scalar<'de, E, V>(value: V) -> Result<Lenient<T>, E>
            where
                T: Deserialize<'de>,
                E: serde::de::Error,
                V: IntoDeserializer<'de, E>,
            {
                Ok(Lenient(T::deserialize(value.into_deserializer()).ok()))
            }
        }

        impl<'de, T: Deserialize<'de>> Visitor<'de> for LenientVisitor<T> {
            type Value = Lenient<T>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                // A struct whose fields are lenient takes any map; a scalar refuses it before
                // reading an entry, and the entries are skipped.
                match T::deserialize(MapAccessDeserializer::new(&mut map)) {
                    Ok(value) => Ok(Lenient(Some(value))),
                    Err(_) => {
                        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                        Ok(Lenient(None))
                    }
                }
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Lenient(None))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Lenient(T::deserialize(StrDeserializer::<E>::new(v)).ok()))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
                Self::scalar(v)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Self::scalar(v)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Self::scalar(v)
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Self::scalar(v)
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(Lenient(None))
            }
            fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(Lenient(None))
            }
        }

        deserializer.deserialize_any(LenientVisitor(PhantomData))
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
}
