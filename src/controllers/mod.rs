//! Controllers. `machine` reconciles CK8s Machines: it keeps their certificate expiry known and
//! carries out refresh requests, recording everything in the Machine's `MachineCertificates`.

pub mod cluster_credentials;
pub mod fleet;
pub mod governing_policy;
pub mod machine;
pub mod patches;
pub mod policy_status;
pub mod shard;
pub mod stores;

use std::sync::Arc;

use ck8s_certs_api::capi::{CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL, WATCH_FILTER_LABEL};
use ck8s_certs_api::certificate_refresh::{CertificateRefresh, labels as refresh_labels};
use ck8s_certs_api::cluster_certificates::ClusterCertificates;
use ck8s_certs_api::machine::{CapiVersion, Cluster, Machine};
use ck8s_certs_api::machine_deployment::MachineDeployment;
use ck8s_certs_api::renewal_policy::CertificateRenewalPolicy;
use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, controller, watcher};
use kube::{Api, Client, ResourceExt};

use tokio_util::sync::CancellationToken;

use crate::cli::Args;
use crate::health::Health;
use crate::metrics::{Controller as Timed, Metrics};
use crate::refresh::flow::Retry;
use crate::refresh::session::Timeouts;
use stores::SharedWatch;

/// The watch caches the reconcilers read (see [`stores`]).
#[derive(Clone)]
pub struct Stores {
    pub machines: Store<Machine>,
    pub clusters: Store<Cluster>,
    /// For their fleet refresh trigger.
    pub deployments: Store<MachineDeployment>,
    pub certificates: stores::CertificateStore,
    pub policies: Store<DynamicObject>,
}

impl Stores {
    /// Waits until every cache holds a full list.
    pub async fn synced(&self) {
        synced(&self.machines).await;
        synced(&self.clusters).await;
        synced(&self.deployments).await;
        self.certificates.synced().await;
        synced(&self.policies).await;
    }
}

/// Runs the Machine controller until its stream ends.
// One argument per thing the process hands over; a struct of them would only rename them.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: Client,
    capi: CapiVersion,
    args: &Args,
    renewal: crate::policy::spec::Settings,
    metrics: Arc<crate::metrics::Metrics>,
    health: Health,
    stop: CancellationToken,
    carrier: Option<ck8s_certs_api::machine_certificates::Carrier>,
) {
    let (machines, clusters, owned): (Api<Machine>, Api<Cluster>, Api<stores::CachedCertificates>) =
        match &args.namespace {
            Some(ns) => (
                Api::namespaced_with(client.clone(), ns, &capi),
                Api::namespaced_with(client.clone(), ns, &capi),
                Api::namespaced(client.clone(), ns),
            ),
            None => (
                Api::all_with(client.clone(), &capi),
                Api::all_with(client.clone(), &capi),
                Api::all(client.clone()),
            ),
        };
    let mut filtered = watcher::Config::default();
    if let Some(filter) = &args.watch_filter {
        filtered = filtered.labels(&format!("{WATCH_FILTER_LABEL}={filter}"));
    }
    // One watch per kind, shared by both controllers. With --watch-filter, Machines, their
    // MachineCertificates and the policies are those of this shard: a policy governs (and
    // reports on) the Machines of the shard whose label it carries (docs/sharding.md).
    let mut machine_watch = SharedWatch::<Machine>::with(capi);
    let mut cluster_watch = SharedWatch::<Cluster>::with(capi);
    let mut deployment_watch = SharedWatch::<MachineDeployment>::with(capi);
    let mut certificate_watch = SharedWatch::in_cache(stores::CertificateWriter::new());
    let mut cluster_record_watch = SharedWatch::<ClusterCertificates>::new();
    let policy_resource = ApiResource::erase::<CertificateRenewalPolicy>(&());
    let mut policy_watch = SharedWatch::<DynamicObject>::with(policy_resource.clone());
    let stores = Stores {
        machines: machine_watch.store.clone(),
        clusters: cluster_watch.store.clone(),
        deployments: deployment_watch.store.clone(),
        certificates: certificate_watch.store.clone(),
        policies: policy_watch.store.clone(),
    };
    let machine_events = machine_watch.subscribe();
    let policy_machine_events = machine_watch.subscribe();
    let cluster_events = cluster_watch.subscribe();
    let credential_cluster_events = cluster_watch.subscribe();
    let cluster_record_events = cluster_record_watch.subscribe();
    let cluster_records_store = cluster_record_watch.store.clone();
    let certificate_events = certificate_watch.subscribe();
    // Fleet requests (not the per-Machine records, which nothing reads back).
    let mut request_watch = SharedWatch::<CertificateRefresh>::new();
    let request_events = request_watch.subscribe();
    let requests_store = request_watch.store.clone();
    let fleet_machine_events = machine_watch.subscribe();
    let trigger_cluster_events = cluster_watch.subscribe();
    let trigger_deployment_events = deployment_watch.subscribe();
    let deployments: Api<MachineDeployment> = match &args.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &capi),
        None => Api::all_with(client.clone(), &capi),
    };
    let mut requests_config = watcher::Config::default().labels(&match &args.watch_filter {
        Some(filter) => format!("!{},{WATCH_FILTER_LABEL}={filter}", refresh_labels::MACHINE),
        None => format!("!{}", refresh_labels::MACHINE),
    });
    requests_config.bookmarks = true;
    let requests_api: Api<CertificateRefresh> = match &args.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let policy_events = policy_watch.subscribe();
    let policy_policy_events = policy_watch.subscribe();
    let policy_sibling_events = policy_watch.subscribe();
    let cluster_records: Api<ClusterCertificates> = match &args.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let watches = futures::future::join3(
        request_watch.run(requests_api, requests_config, trim_request),
        // Few, and cached compactly: not filtered, the trigger checks the label.
        deployment_watch.run(deployments, watcher::Config::default(), stores::keep),
        futures::future::join5(
            machine_watch.run(machines, filtered.clone(), stores::keep),
            cluster_watch.run(clusters, watcher::Config::default(), stores::keep),
            // One per Cluster (few): not filtered, the Machines decide which shard reports a Cluster.
            cluster_record_watch.run(cluster_records, watcher::Config::default(), stores::keep),
            certificate_watch.run(owned, filtered.clone(), stores::keep),
            policy_watch.run(policies_api(&client, args), filtered, stores::trim_policy),
        ),
    );

    // Ready once every cache holds a full list: reconcilers then act on complete information.
    let (synced_tx, synced_rx) = tokio::sync::watch::channel(false);
    let readiness = {
        let stores = stores.clone();
        tokio::spawn(async move {
            stores.synced().await;
            tracing::info!("Caches synced: reconciling");
            synced_tx.send_replace(true);
            health.set_ready(true);
        })
    };
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "ck8s-certs".into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    let credentials = cluster_credentials::Context {
        readings: Default::default(),
        client: client.clone(),
        capi,
        machines: stores.machines.clone(),
        records: cluster_records_store,
        recorder: recorder.clone(),
        metrics: metrics.clone(),
        config: cluster_credentials::Config {
            warning: jiff::SignedDuration::try_from(args.kubeconfig_expiry_warning)
                .unwrap_or(jiff::SignedDuration::MAX),
            interval: args.kubeconfig_check_interval,
        },
    };
    let fleet_ctx = Arc::new(fleet::Context {
        client: client.clone(),
        capi,
        stores: stores.clone(),
        requests: requests_store.clone(),
        workload: crate::workload::Clients::new(client.clone()),
        recorder: recorder.clone(),
        wait_timeout: args.refresh_wait_timeout,
        history: args.refresh_history,
        watch_filter: args.watch_filter.clone(),
        synced: synced_rx,
    });
    let ctx = Arc::new(machine::Context {
        client: client.clone(),
        capi,
        workload: crate::workload::Clients::new(client.clone()),
        stores: stores.clone(),
        recorder,
        config: machine::Config {
            transport: args.k8sd_transport,
            timeouts: Timeouts {
                call: args.k8sd_timeout,
                run: args.k8sd_run_timeout,
            },
            retry: Retry {
                attempts: args.k8sd_attempts.max(1),
                ..Retry::default()
            },
            max_worker_refreshes_per_cluster: args.max_worker_refreshes_per_cluster,
            max_worker_refreshes: args.max_worker_refreshes,
            settle_timeout: args.settle_timeout,
            wait_timeout: args.refresh_wait_timeout,
            resync: args.resync_period,
            renewal,
            history: args.refresh_history,
        },
        locks: machine::Locks::new(args.max_worker_refreshes),
        shard: shard::Shard::new(client.clone(), carrier),
        metrics: metrics.clone(),
        stop: stop.clone(),
    });
    // The expiry metric is read from the caches when scraped.
    metrics.expiry.read_from(CachedExpiries {
        machines: stores.machines.clone(),
        certificates: stores.certificates.clone(),
    });
    let metrics_of_policies = metrics;
    // A policy change re-checks every Machine of its namespace.
    let machines_seen = stores.machines.clone();
    let machines_of_namespace = move |policy: DynamicObject| {
        let namespace = policy.namespace();
        machines_seen
            .state()
            .into_iter()
            .filter(|m| m.namespace() == namespace)
            .map(|m| ObjectRef::from_obj_with(m.as_ref(), capi))
            .collect::<Vec<_>>()
    };
    // A Cluster change (paused, endpoint) re-checks its Machines.
    let machines_of_cluster = {
        let store = stores.machines.clone();
        move |cluster: Cluster| {
            let (namespace, name) = (cluster.namespace(), cluster.name_any());
            store
                .state()
                .into_iter()
                .filter(|m| {
                    m.namespace() == namespace
                        && m.labels.get(CLUSTER_NAME_LABEL) == Some(name.as_str())
                })
                .map(|m| ObjectRef::from_obj_with(m.as_ref(), capi))
                .collect::<Vec<_>>()
        }
    };
    // A MachineCertificates belongs to the Machine of the same name (its owner; the cache keeps
    // no owner references).
    let machine_of_certificates = move |certificates: stores::CachedCertificates| {
        let namespace = certificates.namespace().unwrap_or_default();
        Some(ObjectRef::new_with(&certificates.name_any(), capi).within(&namespace))
    };
    let machine_controller =
        Controller::for_stream_with(machine_events, stores.machines.clone(), capi)
            .with_config(controller::Config::default().concurrency(args.concurrent_reconciles))
            .graceful_shutdown_on(stop.clone().cancelled_owned())
            .watches_stream_with(certificate_events, machine_of_certificates, ())
            .watches_stream_with(cluster_events, machines_of_cluster, capi)
            .watches_stream_with(
                policy_events,
                machines_of_namespace,
                policy_resource.clone(),
            )
            .run(
                |machine, ctx: Arc<machine::Context>| {
                    let metrics = ctx.metrics.clone();
                    observed(
                        metrics,
                        Timed::Machine,
                        machine::reconcile(machine, ctx),
                        machine::Error::category,
                    )
                },
                machine::error_policy,
                ctx,
            )
            .enumerate()
            .for_each(|(count, result)| async move {
                if count == 0 {
                    // Start-up time, for operators and `make bench`.
                    tracing::info!("First Machine reconciled");
                }
                if let Err(err) = result {
                    tracing::debug!(error = %err, "Reconcile error");
                }
            });
    let policy_controller = policy_controller(
        &client,
        capi,
        metrics_of_policies,
        PolicyFeeds {
            policies: policy_policy_events,
            siblings: policy_sibling_events,
            machines: policy_machine_events,
            stores: stores.clone(),
        },
        stop.clone(),
    );
    let credentials_controller = credentials_controller(
        credential_cluster_events,
        cluster_record_events,
        stores.clone(),
        credentials,
        stop.clone(),
    );
    let fleet_controllers = fleet_controllers(
        FleetFeeds {
            requests: request_events,
            machines: fleet_machine_events,
            clusters: trigger_cluster_events,
            deployments: trigger_deployment_events,
            store: requests_store,
        },
        fleet_ctx,
        stores.clone(),
        stop.clone(),
    );
    tokio::select! {
        _ = futures::future::join4(machine_controller, policy_controller, credentials_controller, fleet_controllers) => {}
        _ = watches => tracing::error!("The watches ended unexpectedly"),
    }
    readiness.abort();
}

/// The streams the fleet controllers are fed.
struct FleetFeeds<R, M, C, D> {
    requests: R,
    machines: M,
    clusters: C,
    deployments: D,
    store: Store<CertificateRefresh>,
}

/// Runs the fleet controllers: the requests, and the Cluster triggers that create them (both
/// act only once the caches are synced).
async fn fleet_controllers<R, M, C, D>(
    feeds: FleetFeeds<R, M, C, D>,
    ctx: Arc<fleet::Context>,
    stores: Stores,
    stop: CancellationToken,
) where
    R: futures::Stream<Item = Result<CertificateRefresh, watcher::Error>> + Send + 'static,
    M: futures::Stream<Item = Result<Machine, watcher::Error>> + Send + 'static,
    C: futures::Stream<Item = Result<Cluster, watcher::Error>> + Send + 'static,
    D: futures::Stream<Item = Result<MachineDeployment, watcher::Error>> + Send + 'static,
{
    // The subscriptions are read from the start: a watch waits for a subscriber that falls
    // behind, so one not read until the caches are synced would keep them from ever syncing
    // (a kind with more objects than the subscription's buffer). Reconciles wait instead.
    let capi = ctx.capi;
    let store = feeds.store.clone();
    let requests = Controller::for_stream(feeds.requests, feeds.store)
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .watches_stream_with(
            feeds.machines,
            move |machine: Machine| fleet::requests_of_machine(&store, &machine),
            capi,
        )
        .run(fleet::reconcile, fleet::error_policy, ctx.clone())
        .for_each(|_| async {});
    let triggers = Controller::for_stream_with(feeds.clusters, stores.clusters.clone(), capi)
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(
            fleet::trigger::reconcile,
            fleet::trigger::error_policy,
            ctx.clone(),
        )
        .for_each(|_| async {});
    let deployment_triggers =
        Controller::for_stream_with(feeds.deployments, stores.deployments.clone(), capi)
            .graceful_shutdown_on(stop.cancelled_owned())
            .run(
                fleet::trigger::reconcile_deployment,
                fleet::trigger::error_policy,
                ctx,
            )
            .for_each(|_| async {});
    futures::future::join3(requests, triggers, deployment_triggers).await;
}

/// A fleet request as cached: without `managedFields`.
fn trim_request(request: &mut CertificateRefresh) {
    request.metadata.managed_fields = None;
}

/// The series of `certificate_expiry_timestamp_seconds`: each CK8s Machine in the cache whose
/// MachineCertificates' status knows its expiry (what each Machine's reconcile exported before
/// the series were read from the caches; a deleted Machine's series now goes with it).
struct CachedExpiries {
    machines: Store<Machine>,
    certificates: stores::CertificateStore,
}

impl CachedExpiries {
    fn series(&self) -> impl Iterator<Item = (Arc<Machine>, f64)> + '_ {
        self.machines
            .state()
            .into_iter()
            .filter(|machine| machine.is_ck8s())
            .filter_map(|machine| {
                let meta = &machine.metadata;
                let (namespace, name) = (meta.namespace.as_deref()?, meta.name.as_deref()?);
                let expiry = self.certificates.get(namespace, name)?.expiry()?;
                Some((machine, expiry.as_millisecond() as f64 / 1000.0))
            })
    }
}

impl std::fmt::Debug for CachedExpiries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedExpiries").finish_non_exhaustive()
    }
}

impl crate::metrics::ExpirySource for CachedExpiries {
    fn is_empty(&self) -> bool {
        self.series().next().is_none()
    }

    fn for_each(&self, each: &mut dyn FnMut(crate::metrics::MachineExpiry<'_>)) {
        use ck8s_certs_api::machine_certificates::Role;
        for (machine, expiry) in self.series() {
            let meta = &machine.metadata;
            // As the Machine's view has it (`MachineView::of`).
            let cluster = machine
                .cluster_name
                .as_deref()
                .or_else(|| machine.labels.get(CLUSTER_NAME_LABEL));
            let role = match machine.labels.contains_key(CONTROL_PLANE_LABEL) {
                true => Role::ControlPlane,
                false => Role::Worker,
            };
            each(crate::metrics::MachineExpiry {
                namespace: meta.namespace.as_deref().unwrap_or_default(),
                cluster: cluster.unwrap_or_default(),
                machine: meta.name.as_deref().unwrap_or_default(),
                role: machine::role_label(role),
                expiry,
            });
        }
    }
}

/// Runs one reconcile, recording its wall time and, when it fails, its error's category
/// (`ck8s_certs_reconcile_duration_seconds`, `ck8s_certs_reconcile_errors_total`).
async fn observed<E>(
    metrics: Arc<Metrics>,
    controller: Timed,
    reconcile: impl std::future::Future<Output = Result<controller::Action, E>>,
    category: fn(&E) -> &'static str,
) -> Result<controller::Action, E> {
    let started = std::time::Instant::now();
    let result = reconcile.await;
    metrics.reconciled(
        controller,
        started.elapsed(),
        result.as_ref().err().map(category),
    );
    result
}

/// Waits until `store` holds a full list. The Controller itself also waits on the store, and a
/// store wakes only one waiter (kube-runtime's DelayedInit keeps one waker), so this polls.
async fn synced<K>(store: &Store<K>)
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        let poll = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            store.wait_until_ready(),
        );
        if let Ok(result) = poll.await {
            if result.is_err() {
                // The writer is gone: the controller stopped, readiness no longer matters.
                std::future::pending::<()>().await;
            }
            return;
        }
    }
}

/// Checks each Cluster's management kubeconfig ([`cluster_credentials`]), once every cache is
/// synced (which Clusters have CK8s Machines is read from the Machine cache).
async fn credentials_controller<C, R>(
    clusters: C,
    records: R,
    stores: Stores,
    ctx: cluster_credentials::Context,
    stop: CancellationToken,
) where
    C: futures::Stream<Item = Result<Cluster, watcher::Error>> + Send + 'static,
    R: futures::Stream<Item = Result<ClusterCertificates, watcher::Error>> + Send + 'static,
{
    stores.synced().await;
    synced(&ctx.records).await;
    let capi = ctx.capi;
    // A record changed or deleted by someone else is set right from the last reading.
    let cluster_of_record = move |record: ClusterCertificates| {
        let namespace = record.namespace().unwrap_or_default();
        Some(ObjectRef::new_with(&record.name_any(), capi).within(&namespace))
    };
    let metrics = ctx.metrics.clone();
    Controller::for_stream_with(clusters, stores.clusters.clone(), capi)
        // Secret reads are few and need not be fast: keep them gentle on the API server.
        .with_config(controller::Config::default().concurrency(2))
        .graceful_shutdown_on(stop.cancelled_owned())
        .watches_stream_with(records, cluster_of_record, ())
        .run(
            move |cluster, ctx| {
                observed(
                    metrics.clone(),
                    Timed::Kubeconfig,
                    cluster_credentials::reconcile(cluster, ctx),
                    cluster_credentials::Error::category,
                )
            },
            cluster_credentials::error_policy,
            Arc::new(ctx),
        )
        .for_each(|_| async {})
        .await;
}

fn policies_api(client: &Client, args: &Args) -> Api<DynamicObject> {
    let resource = ApiResource::erase::<CertificateRenewalPolicy>(&());
    match &args.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// What the policy controller is fed from the shared watches.
struct PolicyFeeds<P, M> {
    policies: P,
    /// The same policies again: a change re-checks the other policies of its namespace.
    siblings: P,
    machines: M,
    stores: Stores,
}

/// Reports on every CertificateRenewalPolicy. A Machine or policy change re-checks the policies
/// of that namespace.
fn policy_controller<P, M>(
    client: &Client,
    capi: CapiVersion,
    metrics: Arc<Metrics>,
    feeds: PolicyFeeds<P, M>,
    stop: CancellationToken,
) -> impl std::future::Future<Output = ()> + use<P, M>
where
    P: futures::Stream<Item = Result<DynamicObject, watcher::Error>> + Send + 'static,
    M: futures::Stream<Item = Result<Machine, watcher::Error>> + Send + 'static,
{
    let resource = ApiResource::erase::<CertificateRenewalPolicy>(&());
    let policies_of_namespace = {
        let (store, resource) = (feeds.stores.policies.clone(), resource.clone());
        move |namespace: Option<String>| {
            store
                .state()
                .into_iter()
                .filter(|p| p.namespace() == namespace)
                .map(|p| ObjectRef::from_obj_with(p.as_ref(), resource.clone()))
                .collect::<Vec<_>>()
        }
    };
    let of_machine = {
        let policies_of_namespace = policies_of_namespace.clone();
        move |machine: Machine| policies_of_namespace(machine.namespace())
    };
    let of_sibling = move |policy: DynamicObject| policies_of_namespace(policy.namespace());
    let ctx = Arc::new(policy_status::Context {
        client: client.clone(),
        machines: feeds.stores.machines.clone(),
        clusters: feeds.stores.clusters.clone(),
        policies: feeds.stores.policies.clone(),
    });
    Controller::for_stream_with(feeds.policies, feeds.stores.policies, resource.clone())
        .graceful_shutdown_on(stop.cancelled_owned())
        .watches_stream_with(feeds.machines, of_machine, capi)
        .watches_stream_with(feeds.siblings, of_sibling, resource.clone())
        .run(
            move |object, ctx| {
                observed(
                    metrics.clone(),
                    Timed::Policy,
                    policy_status::reconcile(object, ctx),
                    |_: &kube::Error| "kube",
                )
            },
            policy_status::error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(error = %err, "Policy reconcile error");
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8sd::K8sdError;
    use crate::metrics::Metrics;
    use crate::workload::WorkloadError;

    fn kube_error() -> kube::Error {
        kube::Error::LinesCodecMaxLineLengthExceeded
    }

    /// The `category` label of ck8s_certs_reconcile_errors_total: one snake_case name per kind
    /// of failure, never a message.
    #[test]
    fn machine_reconcile_errors_have_bounded_snake_case_categories() {
        let cases = [
            (machine::Error::Kube(kube_error()), "kube"),
            (
                machine::Error::Shard(shard::ShardError::Lease {
                    lease: "l".into(),
                    source: kube_error(),
                }),
                "kube",
            ),
            (
                machine::Error::Workload(WorkloadError::Node("no node".into())),
                "workload",
            ),
            (
                machine::Error::Expiry(K8sdError::Connect {
                    node: "n".into(),
                    route: "r".into(),
                    reason: "refused".into(),
                }),
                "connect",
            ),
            (
                machine::Error::Expiry(K8sdError::Api {
                    endpoint: "e".into(),
                    status: 401,
                    message: "invalid token".into(),
                }),
                "api",
            ),
            (machine::Error::NeedsLive, "internal"),
        ];
        for (error, category) in cases {
            assert_eq!(error.category(), category, "{error}");
        }
    }

    #[tokio::test]
    async fn observed_reconciles_record_time_and_the_error_category() {
        let metrics = Arc::new(Metrics::default());
        let ok = observed(
            metrics.clone(),
            Timed::Machine,
            async { Ok::<_, machine::Error>(controller::Action::await_change()) },
            machine::Error::category,
        )
        .await;
        assert!(ok.is_ok());
        let failed = observed(
            metrics.clone(),
            Timed::Machine,
            async {
                Err::<controller::Action, _>(machine::Error::Workload(WorkloadError::Node(
                    "x".into(),
                )))
            },
            machine::Error::category,
        )
        .await;
        assert!(failed.is_err());
        let text = metrics.encode().unwrap();
        for line in [
            "ck8s_certs_reconcile_duration_seconds_count{controller=\"machine\"} 2",
            "ck8s_certs_reconcile_errors_total{controller=\"machine\",category=\"workload\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
