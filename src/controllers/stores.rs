//! The watch caches the controllers read from: one watch per kind (and label selector), shared
//! by every controller that needs the kind, trimmed to what the controllers read.
//!
//! Reconcilers read Clusters, MachineCertificates and policies here instead of asking the API
//! server, so a Machine whose situation does not change costs no request at all. What is
//! dropped: `managedFields` (all but who set the refresh trigger, which the Machine reconciler
//! reports), `kubectl.kubernetes.io/last-applied-configuration`, and the parts of Machine and
//! Cluster specs and statuses that `ck8s_certs_api::machine` never reads.

use std::future::Future;

use ck8s_certs_api::annotations::REFRESH_CERTIFICATES;
use ck8s_certs_api::machine_certificates::MachineCertificates;
use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use kube::api::{ApiResource, DynamicObject};
use kube::core::ObjectMeta;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde_json::{Map, Value, json};

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

/// Looks up `namespace/name` in a cache of dynamic objects.
pub fn get_dynamic(
    store: &Store<DynamicObject>,
    resource: &ApiResource,
    namespace: &str,
    name: &str,
) -> Option<std::sync::Arc<DynamicObject>> {
    store.get(&ObjectRef::new_with(name, resource.clone()).within(namespace))
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
    // Who set the refresh trigger is reported on the refresh; nothing else of managedFields is
    // read. Kept as the bare manager entry that owns the trigger.
    let key = format!("f:{REFRESH_CERTIFICATES}");
    let owner = meta.managed_fields.take().and_then(|entries| {
        entries.into_iter().find(|entry| {
            entry.fields_v1.as_ref().is_some_and(|f| {
                f.0.pointer("/f:metadata/f:annotations")
                    .and_then(|a| a.get(&key))
                    .is_some()
            })
        })
    });
    meta.managed_fields = owner.map(|entry| {
        vec![ManagedFieldsEntry {
            manager: entry.manager,
            operation: entry.operation,
            fields_v1: Some(FieldsV1(
                json!({ "f:metadata": { "f:annotations": { key: {} } } }),
            )),
            ..ManagedFieldsEntry::default()
        }]
    });
}

/// Keeps only the listed JSON pointers of `data` (whole subtrees).
fn keep_only(data: &mut Value, pointers: &[&str]) {
    let mut kept = Value::Object(Map::new());
    for pointer in pointers {
        let Some(value) = data.pointer(pointer) else {
            continue;
        };
        let value = value.clone();
        let mut node = &mut kept;
        let parts: Vec<&str> = pointer.split('/').skip(1).collect();
        for (i, part) in parts.iter().enumerate() {
            let Value::Object(map) = node else { break };
            if i + 1 == parts.len() {
                map.insert((*part).to_owned(), value.clone());
                break;
            }
            node = map
                .entry((*part).to_owned())
                .or_insert_with(|| Value::Object(Map::new()));
        }
    }
    *data = kept;
}

/// A Machine as `MachineView` reads it.
pub fn trim_machine(machine: &mut DynamicObject) {
    trim_metadata(&mut machine.metadata);
    keep_only(
        &mut machine.data,
        &[
            "/spec/clusterName",
            "/spec/bootstrap/configRef",
            "/status/nodeRef",
        ],
    );
}

/// A Cluster as `ClusterView` reads it.
pub fn trim_cluster(cluster: &mut DynamicObject) {
    trim_metadata(&mut cluster.metadata);
    keep_only(
        &mut cluster.data,
        &["/spec/paused", "/spec/controlPlaneEndpoint"],
    );
}

pub fn trim_certificates(certificates: &mut MachineCertificates) {
    trim_metadata(&mut certificates.metadata);
}

pub fn trim_policy(policy: &mut DynamicObject) {
    trim_metadata(&mut policy.metadata);
}

#[cfg(test)]
mod tests {
    use super::*;
    use ck8s_certs_api::machine::{ClusterView, MachineView};

    fn dynamic(value: Value) -> DynamicObject {
        serde_json::from_value(value).expect("object")
    }

    #[test]
    fn a_trimmed_machine_reads_the_same() {
        let full = dynamic(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {
                "name": "m", "namespace": "ns", "uid": "u", "resourceVersion": "7",
                "labels": { "cluster.x-k8s.io/cluster-name": "c", "cluster.x-k8s.io/control-plane": "" },
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": "{…}",
                    REFRESH_CERTIFICATES: "1y"
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
            "status": { "nodeRef": { "name": "n1" }, "phase": "Running", "addresses": [{ "type": "InternalIP", "address": "10.0.0.1" }] }
        }));
        let mut trimmed = full.clone();
        trim_machine(&mut trimmed);
        let mut expected = MachineView::from_dynamic(&full);
        expected
            .annotations
            .remove("kubectl.kubernetes.io/last-applied-configuration");
        assert_eq!(MachineView::from_dynamic(&trimmed), expected);
        assert_eq!(
            trimmed.data,
            json!({
                "spec": { "clusterName": "c", "bootstrap": { "configRef": { "apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "CK8sConfig", "name": "cfg" } } },
                "status": { "nodeRef": { "name": "n1" } }
            })
        );
        let managed = trimmed
            .metadata
            .managed_fields
            .expect("the trigger's owner");
        assert_eq!(managed.len(), 1);
        assert_eq!(managed[0].manager.as_deref(), Some("kubectl-annotate"));
        assert_eq!(trimmed.metadata.resource_version.as_deref(), Some("7"));
    }

    #[test]
    fn a_machine_nobody_annotated_keeps_no_managed_fields() {
        let mut machine = dynamic(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
            "metadata": { "name": "m", "namespace": "ns", "managedFields": [
                { "manager": "capi", "operation": "Update", "fieldsV1": { "f:spec": {} } }
            ] },
            "spec": { "clusterName": "c" }
        }));
        trim_machine(&mut machine);
        assert_eq!(machine.metadata.managed_fields, None);
        assert_eq!(machine.data, json!({ "spec": { "clusterName": "c" } }));
    }

    #[test]
    fn a_trimmed_cluster_reads_the_same() {
        let full = dynamic(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": { "name": "c", "namespace": "ns", "labels": { "env": "prod" },
                "annotations": { "cluster.x-k8s.io/paused": "" } },
            "spec": {
                "paused": false,
                "controlPlaneEndpoint": { "host": "api.example.com", "port": 6443 },
                "clusterNetwork": { "pods": { "cidrBlocks": ["10.1.0.0/16"] } },
                "topology": { "class": "x" }
            },
            "status": { "phase": "Provisioned" }
        }));
        let mut trimmed = full.clone();
        trim_cluster(&mut trimmed);
        assert_eq!(
            ClusterView::from_dynamic(&trimmed),
            ClusterView::from_dynamic(&full)
        );
        assert_eq!(
            trimmed.data,
            json!({ "spec": { "paused": false, "controlPlaneEndpoint": { "host": "api.example.com", "port": 6443 } } })
        );
    }
}
