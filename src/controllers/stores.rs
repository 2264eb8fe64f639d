//! The watch caches the controllers read from: one watch per kind (and label selector), shared
//! by every controller that needs the kind, trimmed to what the controllers read.
//!
//! Reconcilers read Machines, Clusters, MachineCertificates and policies here instead of asking
//! the API server, so a Machine whose situation does not change costs no request at all.
//! Machines and Clusters are cached as the compact kinds of `ck8s_certs_api::machine` (decoded
//! straight into the few fields the controllers read); of MachineCertificates and policies,
//! `managedFields` and `kubectl.kubernetes.io/last-applied-configuration` are dropped.

use std::future::Future;

use ck8s_certs_api::machine::CapiVersion;
use std::borrow::Cow;

use ck8s_certs_api::machine_certificates::{MachineCertificates, MachineCertificatesStatus};
use futures::{Stream, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use kube::api::DynamicObject;
use kube::core::ObjectMeta;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::Deserialize;

/// Changed objects a subscriber may fall behind by before the watch waits for it.
const BUFFER: usize = 1024;

/// One watch of a kind: its cache, and the controllers it feeds. (kube-runtime's shared streams
/// need a static type; this fans out dynamic objects too.)
pub struct SharedWatch<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    pub store: Store<K>,
    writer: Writer<K>,
    subscribers: Vec<tokio::sync::mpsc::Sender<K>>,
}

impl<K> SharedWatch<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default + Send + Sync,
{
    pub fn new() -> Self {
        Self::with(Default::default())
    }
}

impl<K> SharedWatch<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    pub fn with(dyntype: K::DynamicType) -> Self {
        let writer = Writer::new(dyntype);
        Self {
            store: writer.as_reader(),
            writer,
            subscribers: Vec::new(),
        }
    }

    /// The changed objects (after the cache took them), for one more controller.
    pub fn subscribe(
        &mut self,
    ) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static + use<K> {
        let (tx, rx) = tokio::sync::mpsc::channel(BUFFER);
        self.subscribers.push(tx);
        futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|object| (Ok(object), rx))
        })
    }

    /// Runs the watch (forever): list, then watch, trimming each object before it is cached
    /// and passed on.
    pub fn run(
        self,
        api: Api<K>,
        config: watcher::Config,
        trim: fn(&mut K),
    ) -> impl Future<Output = ()> + Send + 'static {
        let subscribers = self.subscribers;
        watcher(api, config)
            .default_backoff()
            .modify(trim)
            .reflect(self.writer)
            .applied_objects()
            .for_each(move |object| {
                let subscribers = subscribers.clone();
                async move {
                    match object {
                        Ok(object) => {
                            for subscriber in &subscribers {
                                // A closed subscriber is a controller that stopped.
                                let _ = subscriber.send(object.clone()).await;
                            }
                        }
                        Err(err) => {
                            tracing::warn!(error = %err, "Watch failed; retrying with backoff")
                        }
                    }
                }
            })
    }
}

impl<K> Default for SharedWatch<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default + Send + Sync,
{
    fn default() -> Self {
        Self::new()
    }
}

/// Looks up `namespace/name` in a cache of a Cluster API kind.
pub fn get_capi<K>(
    store: &Store<K>,
    version: CapiVersion,
    namespace: &str,
    name: &str,
) -> Option<std::sync::Arc<K>>
where
    K: Resource<DynamicType = CapiVersion> + Clone + 'static,
{
    store.get(&ObjectRef::new_with(name, version).within(namespace))
}

/// Looks up `namespace/name` in a cache of a static kind.
pub fn get<K>(store: &Store<K>, namespace: &str, name: &str) -> Option<std::sync::Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store.get(&ObjectRef::new(name).within(namespace))
}

/// Metadata the controllers never read.
fn trim_metadata(meta: &mut ObjectMeta) {
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    meta.managed_fields = None;
}

/// Nothing to trim: the kind is decoded compactly.
pub fn keep<K>(_: &mut K) {}

/// A MachineCertificates as the Machine controller caches it: its identity, and its status as
/// compact JSON, decoded when a reconcile reads it (about half the memory of the decoded
/// status, and a reconcile reads a Machine's status at most a few times an hour at rest).
/// Labels and owner references are not kept: writes are server-side applies of the status,
/// labels are checked on live reads, and its Machine is the one of the same name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CachedCertificates {
    pub metadata: ObjectMeta,
    status: Option<Box<str>>,
}

impl CachedCertificates {
    /// The status as stored; `Err` only for a status this version cannot read.
    pub fn status(&self) -> Result<Option<MachineCertificatesStatus>, serde_json::Error> {
        self.status.as_deref().map(serde_json::from_str).transpose()
    }
}

impl Resource for CachedCertificates {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        MachineCertificates::kind(&())
    }
    fn group(_: &()) -> Cow<'_, str> {
        MachineCertificates::group(&())
    }
    fn version(_: &()) -> Cow<'_, str> {
        MachineCertificates::version(&())
    }
    fn plural(_: &()) -> Cow<'_, str> {
        MachineCertificates::plural(&())
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl<'de> Deserialize<'de> for CachedCertificates {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            metadata: ObjectMeta,
            #[serde(default)]
            status: Option<MachineCertificatesStatus>,
        }
        let wire = Wire::deserialize(deserializer)?;
        let status = wire
            .status
            .map(|status| serde_json::to_string(&status).map(String::into_boxed_str))
            .transpose()
            .map_err(serde::de::Error::custom)?;
        let meta = wire.metadata;
        Ok(Self {
            metadata: ObjectMeta {
                name: meta.name,
                namespace: meta.namespace,
                uid: meta.uid,
                resource_version: meta.resource_version,
                ..ObjectMeta::default()
            },
            status,
        })
    }
}

pub fn trim_policy(policy: &mut DynamicObject) {
    trim_metadata(&mut policy.metadata);
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::DynamicObject;
    use serde_json::json;

    #[test]
    fn cached_certificates_keep_identity_and_status() {
        let full = json!({
            "apiVersion": "certificates.ck8s.io/v1alpha1", "kind": "MachineCertificates",
            "metadata": { "name": "m", "namespace": "ns", "uid": "u", "resourceVersion": "9",
                "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": { "cluster.x-k8s.io/cluster-name": "c" },
                "ownerReferences": [{ "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "name": "m", "uid": "mu" }],
                "managedFields": [{ "manager": "ck8s-certs", "operation": "Apply", "fieldsV1": { "f:status": {} } }] },
            "spec": { "clusterName": "c" },
            "status": { "role": "Worker", "nodeName": "n1", "expiry": "2027-01-01T00:00:00Z",
                "conditions": [{ "type": "Ready", "status": "True", "reason": "ExpiryKnown", "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z" }] }
        });
        let decoded: MachineCertificates = serde_json::from_value(full.clone()).expect("object");
        let cached: CachedCertificates = serde_json::from_str(&full.to_string()).expect("cached");
        let meta = &cached.metadata;
        assert_eq!(
            (
                meta.name.as_deref(),
                meta.namespace.as_deref(),
                meta.uid.as_deref(),
                meta.resource_version.as_deref()
            ),
            (Some("m"), Some("ns"), Some("u"), Some("9"))
        );
        assert_eq!(
            (
                &meta.labels,
                &meta.owner_references,
                &meta.managed_fields,
                meta.generation
            ),
            (&None, &None, &None, None)
        );
        assert_eq!(cached.status().expect("status"), decoded.status);
        let bare: CachedCertificates =
            serde_json::from_str(r#"{"metadata":{"name":"m"},"spec":{"clusterName":"c"}}"#)
                .expect("cached");
        assert_eq!(bare.status().expect("status"), None);
    }

    #[test]
    fn trimmed_metadata_drops_managed_fields_and_the_last_applied_configuration() {
        let mut policy: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "certificates.ck8s.io/v1alpha1", "kind": "CertificateRenewalPolicy",
            "metadata": { "name": "p", "namespace": "ns",
                "annotations": { "kubectl.kubernetes.io/last-applied-configuration": "{…}", "keep": "me" },
                "managedFields": [{ "manager": "kubectl", "operation": "Apply", "fieldsV1": { "f:spec": {} } }] },
            "spec": { "policy": "Automatic" }
        }))
        .expect("object");
        trim_policy(&mut policy);
        assert_eq!(policy.metadata.managed_fields, None);
        assert_eq!(
            policy.metadata.annotations,
            Some([("keep".to_owned(), "me".to_owned())].into())
        );
        assert_eq!(policy.data, json!({ "spec": { "policy": "Automatic" } }));
    }
}
