//! How the fleet, policy and credential controllers are fed from the shared watches: each is a
//! kube-runtime Controller over its subscriptions, started at once and reconciling only once
//! the caches are synced.

use std::time::Duration;

use ck8s_certs_api::control_plane::{ControlPlane, ControlPlaneVersion};

use super::*;

/// The streams the fleet controllers are fed.
pub(super) struct FleetFeeds<R, M, C, D> {
    pub(super) requests: R,
    pub(super) machines: M,
    pub(super) clusters: C,
    pub(super) deployments: D,
    pub(super) store: Store<CertificateRefresh>,
}

/// Runs the fleet controllers: the requests, and the Cluster triggers that create them (both
/// act only once the caches are synced).
pub(super) async fn fleet_controllers<R, M, C, D>(
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

/// How long the first look for the CK8s control plane kind waits before looking again, and the
/// longest wait between looks (one discovery read each).
const CONTROL_PLANE_LOOK: (Duration, Duration) =
    (Duration::from_secs(10), Duration::from_secs(600));

/// The refresh trigger on CK8sControlPlanes. The kind is the CK8s control plane provider's, which
/// may be installed after us (`clusterctl init` installs providers in one go) or not at all
/// (another control plane provider): it is looked for until it is served, then watched.
pub(super) async fn control_plane_triggers(
    client: Client,
    namespace: Option<String>,
    ctx: Arc<fleet::Context>,
    stop: CancellationToken,
) {
    let version = tokio::select! {
        version = control_plane_version(&client) => version,
        () = stop.cancelled() => return,
    };
    let mut watch = SharedWatch::<ControlPlane>::with(version.clone());
    let events = watch.subscribe();
    ctx.control_planes.set(version.clone(), watch.store.clone());
    let api: Api<ControlPlane> = match &namespace {
        Some(ns) => Api::namespaced_with(client, ns, &version),
        None => Api::all_with(client, &version),
    };
    let store = watch.store.clone();
    let controller = Controller::for_stream_with(events, store, version)
        .graceful_shutdown_on(stop.cancelled_owned())
        .run(
            fleet::trigger::reconcile_control_plane,
            fleet::trigger::error_policy,
            ctx,
        )
        .for_each(|_| async {});
    tokio::select! {
        () = watch.run(api, watcher::Config::default(), stores::keep) => {
            tracing::error!("The CK8sControlPlane watch ended unexpectedly");
        }
        () = controller => {}
    }
}

/// The served version of the CK8s control plane kind, once it is served.
async fn control_plane_version(client: &Client) -> ControlPlaneVersion {
    use ck8s_certs_api::capi::{CK8S_CONTROL_PLANE_KIND, CONTROL_PLANE_GROUP};
    let (mut wait, longest) = CONTROL_PLANE_LOOK;
    let mut said = false;
    loop {
        match kube::discovery::group(client, CONTROL_PLANE_GROUP).await {
            Ok(group) => {
                let found = group
                    .resources_by_stability()
                    .into_iter()
                    .find(|(resource, _)| resource.kind == CK8S_CONTROL_PLANE_KIND);
                if let Some((resource, _)) = found {
                    tracing::info!(
                        version = %resource.version,
                        "Watching CK8sControlPlanes for the refresh trigger"
                    );
                    return ControlPlaneVersion(resource.version);
                }
            }
            // The group is not served.
            Err(kube::Error::Discovery(_)) => {}
            Err(err) => {
                tracing::debug!(error = %err, "Looking for the CK8sControlPlane kind failed")
            }
        }
        if !said {
            tracing::info!(
                "CK8sControlPlane is not served: its refresh trigger starts once it is (looked for again, at most every {})",
                humantime::format_duration(longest)
            );
            said = true;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(longest);
    }
}

/// A fleet request as cached: without `managedFields`.
pub(super) fn trim_request(request: &mut CertificateRefresh) {
    request.metadata.managed_fields = None;
}

/// Checks each Cluster's management kubeconfig ([`cluster_credentials`]), once every cache is
/// synced (which Clusters have CK8s Machines is read from the Machine cache).
pub(super) async fn credentials_controller<C, R>(
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
    super::stores::synced(&ctx.records).await;
    let capi = ctx.capi;
    // A record changed or deleted by someone else is set right from the last reading.
    let cluster_of_record = move |record: ClusterCertificates| {
        let namespace = record.namespace().unwrap_or_default();
        Some(ObjectRef::new_with(&record.name_any(), capi).within(&namespace))
    };
    let metrics = ctx.metrics.clone();
    let ctx = Arc::new(ctx);
    let sweeper = {
        let (ctx, clusters, stop) = (ctx.clone(), stores.clusters.clone(), stop.clone());
        async move {
            let mut every = tokio::time::interval(cluster_credentials::SWEEP_INTERVAL);
            loop {
                tokio::select! {
                    _ = every.tick() => cluster_credentials::sweep(&ctx, &clusters),
                    () = stop.cancelled() => break,
                }
            }
        }
    };
    let controller = Controller::for_stream_with(clusters, stores.clusters.clone(), capi)
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
            ctx,
        )
        .for_each(|_| async {});
    futures::future::join(controller, sweeper).await;
}

pub(super) fn policies_api(client: &Client, args: &Args) -> Api<DynamicObject> {
    let resource = ApiResource::erase::<CertificateRenewalPolicy>(&());
    match &args.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// What the policy controller is fed from the shared watches.
pub(super) struct PolicyFeeds<P, S, M> {
    pub(super) policies: P,
    /// Changes of the policies' specs, and deletions: a change re-checks the other policies
    /// that select the Machines it concerns (their conflicts).
    pub(super) siblings: S,
    pub(super) machines: M,
    pub(super) stores: Stores,
    /// The time decisions are taken at.
    pub(super) clock: crate::clock::SharedClock,
    /// How often a policy's report is computed again without a change.
    pub(super) resync: Duration,
}

/// Reports on every CertificateRenewalPolicy. A Machine change re-checks the policies of its
/// namespace; a policy change, those that select the Machines it concerns.
pub(super) fn policy_controller<P, S, M>(
    client: &Client,
    capi: CapiVersion,
    metrics: Arc<Metrics>,
    feeds: PolicyFeeds<P, S, M>,
    stop: CancellationToken,
) -> impl std::future::Future<Output = ()> + use<P, S, M>
where
    P: futures::Stream<Item = Result<DynamicObject, watcher::Error>> + Send + 'static,
    S: futures::Stream<Item = Result<DynamicObject, watcher::Error>> + Send + 'static,
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
    let of_machine = move |machine: Machine| policies_of_namespace(machine.namespace());
    let of_sibling = {
        let (stores, resource) = (feeds.stores.clone(), resource.clone());
        let selections = governing_policy::PolicySelections::default();
        move |policy: DynamicObject| {
            let concerned = selections.concerned(&policy, &stores);
            if concerned.is_empty() {
                return Vec::new();
            }
            let namespace = policy.namespace();
            stores
                .policies
                .state()
                .into_iter()
                .filter(|p| p.namespace() == namespace && p.metadata.uid != policy.metadata.uid)
                .filter(|p| {
                    stores
                        .policy_readings
                        .of(p)
                        .is_some_and(|r| concerned.iter().any(|m| m.selected_by(&r)))
                })
                .map(|p| ObjectRef::from_obj_with(p.as_ref(), resource.clone()))
                .collect::<Vec<_>>()
        }
    };
    let ctx = Arc::new(policy_status::Context {
        client: client.clone(),
        machines: feeds.stores.machines.clone(),
        clusters: feeds.stores.clusters.clone(),
        policies: feeds.stores.policies.clone(),
        readings: feeds.stores.policy_readings.clone(),
        clock: feeds.clock,
        resync: feeds.resync,
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
