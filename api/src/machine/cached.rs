//! [`Machine`] and [`Cluster`] as the watch caches hold them, decoded straight from the API
//! server's JSON into a few fields (lenient below `metadata`).

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};
use kube::Resource;
use kube::core::DynamicResourceScope;
use serde::Deserialize;

use super::{CLUSTER_READ_ANNOTATIONS, CapiVersion, READ_ANNOTATIONS, is_ck8s};
use crate::annotations::REFRESH_CERTIFICATES;
use crate::capi::{CLUSTER_NAME_LABEL, GROUP, PAUSED_ANNOTATION};

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
    /// Whether that manager owns the trigger through server-side apply (an owner that asserts it:
    /// Cluster API's MachineSet controller copying a machine template, a GitOps tool).
    pub trigger_applied: bool,
    /// A MachineHealthCheck found it unhealthy and left it to its owner to remediate: condition
    /// `OwnerRemediated` False (in `status.conditions`, or `status.v1beta2.conditions` as Cluster
    /// API's v1beta1 serves it), until the owner deletes it.
    pub owner_remediation: bool,
}

impl Machine {
    /// Its Cluster's name: `spec.clusterName`, else the `cluster.x-k8s.io/cluster-name` label.
    pub fn cluster(&self) -> Option<&str> {
        self.cluster_name
            .as_deref()
            .or_else(|| self.labels.get(CLUSTER_NAME_LABEL))
    }

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

/// What the caches keep of an object that can carry the fleet refresh trigger (a Cluster, a
/// MachineDeployment, a control plane object): its identity and labels, the
/// [`CLUSTER_READ_ANNOTATIONS`], the manager of the trigger and the paused annotation.
pub(crate) struct TriggerMeta {
    pub metadata: ObjectMeta,
    pub annotations: Pairs,
    pub trigger_manager: Option<String>,
    /// The `cluster.x-k8s.io/paused` annotation.
    pub paused: bool,
}

impl TriggerMeta {
    pub(crate) fn of(mut meta: ObjectMeta) -> Self {
        let paused = meta
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(PAUSED_ANNOTATION));
        let trigger_manager = trigger_manager(&meta);
        Self {
            annotations: Pairs::new(meta.annotations.take(), |key| {
                CLUSTER_READ_ANNOTATIONS.contains(&key)
            }),
            trigger_manager,
            paused,
            metadata: ObjectMeta {
                labels: meta.labels.take().filter(|l| !l.is_empty()),
                ..identity(&mut meta)
            },
        }
    }
}

/// The manager of the `managedFields` entry that owns the refresh trigger.
/// The `managedFields` entry that last set the refresh trigger: of the entries that own it (a
/// field applied by one manager and then updated by another has both), the most recent.
fn trigger_entry(meta: &ObjectMeta) -> Option<&ManagedFieldsEntry> {
    let key = format!("f:{REFRESH_CERTIFICATES}");
    meta.managed_fields
        .iter()
        .flatten()
        .filter(|entry| {
            entry.fields_v1.as_ref().is_some_and(|fields| {
                fields
                    .0
                    .pointer("/f:metadata/f:annotations")
                    .and_then(|a| a.get(&key))
                    .is_some()
            })
        })
        .max_by_key(|entry| entry.time.as_ref().map(|t| t.0))
}

/// Whether the refresh trigger was last set through server-side apply (`operation: Apply`): by
/// an owner that asserts it.
pub(crate) fn trigger_applied(meta: &ObjectMeta) -> bool {
    trigger_entry(meta).is_some_and(|entry| entry.operation.as_deref() == Some("Apply"))
}

/// The field manager that last set the refresh trigger.
pub(crate) fn trigger_manager(meta: &ObjectMeta) -> Option<String> {
    trigger_entry(meta)?.manager.clone()
}

impl<'de> Deserialize<'de> for Machine {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = wire::Machine::deserialize(deserializer)?;
        let spec = wire.spec.0.unwrap_or_default();
        let status = wire.status.0.unwrap_or_default();
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
        let trigger_applied = trigger_applied(&meta);
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
            owner_remediation: status.owner_remediation(),
            node_name: status.node_ref.0.and_then(|n| n.name.0),
            trigger_manager,
            trigger_applied,
        })
    }
}

impl<'de> Deserialize<'de> for Cluster {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = wire::Cluster::deserialize(deserializer)?;
        let spec = wire.spec.0.unwrap_or_default();
        let meta = TriggerMeta::of(wire.metadata);
        Ok(Self {
            annotations: meta.annotations,
            trigger_manager: meta.trigger_manager,
            metadata: meta.metadata,
            paused: meta.paused || spec.paused.0.unwrap_or(false),
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
        /// Any JSON: only `OwnerRemediated` is looked for, whatever the rest holds.
        #[serde(default)]
        pub conditions: serde_json::Value,
        #[serde(default)]
        pub v1beta2: serde_json::Value,
    }

    impl MachineStatus {
        /// Condition `OwnerRemediated` is False in either list.
        pub fn owner_remediation(&self) -> bool {
            let listed = |conditions: &serde_json::Value| {
                conditions.as_array().is_some_and(|list| {
                    list.iter().any(|c| {
                        c.get("type").and_then(|t| t.as_str()) == Some("OwnerRemediated")
                            && c.get("status").and_then(|s| s.as_str()) == Some("False")
                    })
                })
            };
            listed(&self.conditions) || listed(&self.v1beta2["conditions"])
        }
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
