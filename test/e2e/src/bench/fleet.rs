//! The benchmark's fleet: N workload clusters × M Machines in steady state (a known expiry far
//! away, nothing due), and a watch of every Machine's refresh status.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ck8s_certs_api::annotations::{
    CERTIFICATES_EXPIRY, REFRESH_CERTIFICATES_STATUS, RefreshStatus,
};
use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

use crate::controlplane::Audit;
use crate::fixtures::ClusterSpec;
use crate::{EnvSpec, Environment};

/// The shape of the fleet.
#[derive(Clone, Debug)]
pub struct Fleet {
    pub clusters: usize,
    pub machines: usize,
    pub control_planes: usize,
    /// Workload clusters per namespace.
    pub clusters_per_namespace: usize,
    pub workload_servers: usize,
}

impl Fleet {
    /// Nodes a workload kube-apiserver carries before another one is started.
    pub const NODES_PER_SERVER: usize = 2_500;

    pub fn new(clusters: usize, machines: usize, control_planes: usize) -> Self {
        Self {
            clusters,
            machines,
            control_planes: control_planes.min(machines),
            clusters_per_namespace: 10,
            workload_servers: (clusters * machines)
                .div_ceil(Self::NODES_PER_SERVER)
                .clamp(1, clusters.max(1)),
        }
    }

    pub fn spec(&self) -> EnvSpec {
        let standard = EnvSpec::standard();
        // Certificates valid for another 300 days: nothing is due.
        let expiry = jiff::Timestamp::now()
            .checked_add(jiff::SignedDuration::from_hours(24 * 300))
            .unwrap_or_else(|_| jiff::Timestamp::now())
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        EnvSpec {
            clusters: (0..self.clusters)
                .map(|i| {
                    let name = format!("c{i:03}");
                    ClusterSpec {
                        namespace: format!("fleet-{}", i / self.clusters_per_namespace),
                        machine_prefix: name.clone(),
                        control_planes: self.control_planes,
                        workers: self.machines - self.control_planes,
                        microcluster_port: None,
                        extra_sans: Vec::new(),
                        endpoint_host: format!("{name}.k8s.example.internal"),
                        name,
                    }
                })
                .collect(),
            // Short restarts: the refresh phase measures the controller, not the nodes.
            restart_seconds: 1,
            workload_servers: Some(self.workload_servers),
            audit: Audit::All,
            machine_annotations: BTreeMap::from([(CERTIFICATES_EXPIRY.to_owned(), expiry)]),
            ..standard
        }
    }
}

/// When each refresh status value was first seen on a Machine.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    pub in_progress: Option<Instant>,
    pub done: Option<Instant>,
    pub failed: Option<Instant>,
}

impl Seen {
    pub fn finished(&self) -> Option<Instant> {
        self.done.or(self.failed)
    }
}

/// Watches every Machine's refresh status (one watch, like a user's `kubectl get -w`).
#[derive(Clone, Default)]
pub struct StatusWatch {
    seen: Arc<Mutex<HashMap<(String, String), Seen>>>,
}

impl StatusWatch {
    /// Starts watching; returns once the first list has been read.
    pub async fn start(env: &Environment, client: Client) -> Self {
        let resource = ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
            ck8s_certs_api::capi::GROUP,
            env.spec.capi_version.storage_version(),
            "Machine",
        ));
        let api: Api<DynamicObject> = Api::all_with(client, &resource);
        let watch = Self::default();
        let seen = Arc::clone(&watch.seen);
        watch_applied(api, move |object: DynamicObject| {
            let now = Instant::now();
            let status = object
                .annotations()
                .get(REFRESH_CERTIFICATES_STATUS)
                .cloned();
            let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
            let entry = seen
                .entry((object.namespace().unwrap_or_default(), object.name_any()))
                .or_default();
            let slot = match status.as_deref() {
                Some(s) if s == RefreshStatus::InProgress.as_str() => &mut entry.in_progress,
                Some(s) if s == RefreshStatus::Done.as_str() => &mut entry.done,
                Some(s) if s == RefreshStatus::Failed.as_str() => &mut entry.failed,
                _ => return,
            };
            slot.get_or_insert(now);
        })
        .await;
        watch
    }

    pub fn get(&self, namespace: &str, name: &str) -> Seen {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
            .unwrap_or_default()
    }

    /// Waits until `check` holds for the Machine, polling every 10 ms; `None` after `timeout`.
    pub async fn wait_for<T>(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
        check: impl Fn(&Seen) -> Option<T>,
    ) -> Option<T> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(value) = check(&self.get(namespace, name)) {
                return Some(value);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Watches every object of `api`, handing each one listed or changed to `seen`; returns once
/// the first list was read (at most 2 minutes), the watch going on in the background.
pub async fn watch_applied<K>(api: Api<K>, mut seen: impl FnMut(K) + Send + 'static)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let (listed_tx, listed_rx) = tokio::sync::oneshot::channel();
    let mut listed_tx = Some(listed_tx);
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                    seen(object)
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = listed_tx.take() {
                        let _ = tx.send(());
                    }
                }
                _ => {}
            }
        }
    });
    let _ = tokio::time::timeout(Duration::from_secs(120), listed_rx).await;
}

/// Merge-patches every `(resource, namespace, name, patch)`, 16 at a time.
pub async fn patch_all(
    client: &Client,
    patches: Vec<(ApiResource, String, String, serde_json::Value)>,
) -> Result<(), crate::Error> {
    use futures::TryStreamExt;
    use kube::api::{Patch, PatchParams};
    futures::stream::iter(patches)
        .map(|(resource, namespace, name, patch)| {
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &namespace, &resource);
            async move {
                api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .map(drop)
                    .map_err(crate::Error::Kube)
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await
        .map(drop)
}
