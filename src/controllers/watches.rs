//! The watches the controllers share: one per kind, each feeding its cache and every controller
//! that subscribed to it. Each controller's `start` subscribes to what it needs; then
//! [`Watches::run`] runs them all.

use ck8s_certs_api::capi::WATCH_FILTER_LABEL;
use ck8s_certs_api::certificate_refresh::{CertificateRefresh, labels as refresh_labels};
use ck8s_certs_api::cluster_certificates::ClusterCertificates;
use ck8s_certs_api::machine::{CapiVersion, Cluster, Machine};
use ck8s_certs_api::machine_deployment::MachineDeployment;
use ck8s_certs_api::renewal_policy::CertificateRenewalPolicy;
use kube::api::{ApiResource, DynamicObject};
use kube::core::{DynamicResourceScope, NamespaceResourceScope};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};

use crate::controllers::stores::{
    self, CachedCertificates, CertificateWriter, SharedWatch, Stores,
};

/// What this instance watches: a namespace (else all), and with `--watch-filter` its shard's
/// Machines, MachineCertificates and policies (docs/sharding.md).
#[derive(Clone, Debug, Default)]
pub struct Scope {
    pub namespace: Option<String>,
    pub watch_filter: Option<String>,
}

impl Scope {
    /// The objects of kind `K` in scope.
    pub fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match &self.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }

    /// [`api`](Self::api), of a kind whose version is known at run time.
    pub fn api_with<K>(&self, client: &Client, dyntype: &K::DynamicType) -> Api<K>
    where
        K: Resource<Scope = DynamicResourceScope>,
    {
        match &self.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, dyntype),
            None => Api::all_with(client.clone(), dyntype),
        }
    }

    /// Only this shard's objects.
    fn filtered(&self) -> watcher::Config {
        match &self.watch_filter {
            Some(filter) => {
                watcher::Config::default().labels(&format!("{WATCH_FILTER_LABEL}={filter}"))
            }
            None => watcher::Config::default(),
        }
    }
}

/// One watch per kind, shared by the controllers.
pub struct Watches {
    pub machines: SharedWatch<Machine>,
    pub clusters: SharedWatch<Cluster>,
    pub deployments: SharedWatch<MachineDeployment>,
    pub certificates: SharedWatch<CachedCertificates, CertificateWriter>,
    pub cluster_records: SharedWatch<ClusterCertificates>,
    pub policies: SharedWatch<DynamicObject>,
    /// Fleet requests (not the per-Machine records, which nothing reads back).
    pub requests: SharedWatch<CertificateRefresh>,
}

impl Watches {
    /// `buffer`: how many changed objects a controller may fall behind each watch by.
    pub fn new(capi: CapiVersion, buffer: usize) -> Self {
        Self {
            machines: SharedWatch::with(capi).buffered(buffer),
            clusters: SharedWatch::with(capi).buffered(buffer),
            deployments: SharedWatch::with(capi).buffered(buffer),
            certificates: SharedWatch::in_cache(CertificateWriter::new()).buffered(buffer),
            cluster_records: SharedWatch::new().buffered(buffer),
            policies: SharedWatch::with(policy_resource()).buffered(buffer),
            requests: SharedWatch::new().buffered(buffer),
        }
    }

    /// The caches the watches fill.
    pub fn stores(&self) -> Stores {
        Stores {
            machines: self.machines.store.clone(),
            clusters: self.clusters.store.clone(),
            deployments: self.deployments.store.clone(),
            certificates: self.certificates.store.clone(),
            cluster_records: self.cluster_records.store.clone(),
            policies: self.policies.store.clone(),
            policy_readings: Default::default(),
            control_planes: Default::default(),
        }
    }

    /// Runs every watch (forever).
    pub async fn run(self, client: &Client, capi: CapiVersion, scope: &Scope) {
        let filtered = scope.filtered();
        let mut requests = watcher::Config::default().labels(&match &scope.watch_filter {
            Some(filter) => format!("!{},{WATCH_FILTER_LABEL}={filter}", refresh_labels::MACHINE),
            None => format!("!{}", refresh_labels::MACHINE),
        });
        requests.bookmarks = true;
        let all = watcher::Config::default;
        futures::future::join3(
            self.requests.run(scope.api(client), requests, trim_request),
            // Few, and cached compactly: not filtered, the trigger checks the label.
            self.deployments
                .run(scope.api_with(client, &capi), all(), stores::keep),
            futures::future::join5(
                self.machines.run(
                    scope.api_with(client, &capi),
                    filtered.clone(),
                    stores::keep,
                ),
                self.clusters
                    .run(scope.api_with(client, &capi), all(), stores::keep),
                // One per Cluster (few): not filtered, the Machines decide which shard reports
                // a Cluster.
                self.cluster_records
                    .run(scope.api(client), all(), stores::keep),
                self.certificates
                    .run(scope.api(client), filtered.clone(), stores::keep),
                self.policies.run(
                    scope.api_with(client, &policy_resource()),
                    filtered,
                    stores::trim_policy,
                ),
            ),
        )
        .await;
    }
}

/// CertificateRenewalPolicies, read as dynamic objects: one that cannot be decoded still tells
/// which Machines it was meant for.
pub fn policy_resource() -> ApiResource {
    ApiResource::erase::<CertificateRenewalPolicy>(&())
}

/// A fleet request as cached: without `managedFields`.
fn trim_request(request: &mut CertificateRefresh) {
    request.metadata.managed_fields = None;
}
