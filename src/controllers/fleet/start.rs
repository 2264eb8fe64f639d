//! The fleet controllers' wiring: the requests, the triggers on Clusters and MachineDeployments
//! that create them (all act only once the caches are synced), and the trigger on
//! CK8sControlPlanes once that kind is served.

use std::sync::Arc;
use std::time::Duration;

use crate::controllers::stores::ControlPlanes;
use ck8s_certs_api::control_plane::{ControlPlane, ControlPlaneVersion};
use ck8s_certs_api::machine::Machine;
use futures::{Stream, StreamExt};
use kube::runtime::reflector::Store;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::trigger::{self, Triggering};
use super::{Context, error_policy, reconcile, requests_of_machine};
use crate::controllers::panics::guarded;
use crate::controllers::stores::{self, SharedWatch};
use crate::controllers::watches::Watches;

/// Subscribes the fleet controllers to `watches`; the future runs them. The subscriptions are
/// read from the start: a watch waits for a subscriber that falls behind, so one not read until
/// the caches are synced would keep them from ever syncing (a kind with more objects than the
/// subscription's buffer). Reconciles wait instead.
pub fn start(
    watches: &mut Watches,
    ctx: Arc<Context>,
    stop: CancellationToken,
) -> impl Future<Output = ()> + use<> {
    let capi = ctx.capi;
    let store = ctx.requests.clone();
    let of_machine = move |machine: Machine| requests_of_machine(&store, &machine);
    let requests = Controller::for_stream(watches.requests.subscribe(), ctx.requests.clone())
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .watches_stream_with(watches.machines.subscribe(), of_machine, capi)
        .run(
            |request, ctx| guarded(reconcile(request, ctx)),
            error_policy,
            ctx.clone(),
        )
        .for_each(|_| async {});
    let clusters = triggers(
        watches.clusters.subscribe(),
        ctx.stores.clusters.clone(),
        capi,
        ctx.clone(),
        stop.clone(),
    );
    let deployments = triggers(
        watches.deployments.subscribe(),
        ctx.stores.deployments.clone(),
        capi,
        ctx,
        stop,
    );
    async move {
        futures::future::join3(requests, clusters, deployments).await;
    }
}

/// The refresh trigger's controller on the objects of kind `K` that `events` and `store` hold.
fn triggers<K>(
    events: impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    store: Store<K>,
    version: K::DynamicType,
    ctx: Arc<Context>,
    stop: CancellationToken,
) -> impl Future<Output = ()>
where
    K: Triggering + Clone + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Eq + std::hash::Hash + Clone + std::fmt::Debug + Unpin + Send + Sync,
{
    Controller::for_stream_with(events, store, version)
        .graceful_shutdown_on(stop.cancelled_owned())
        .run(
            |object, ctx| guarded(trigger::reconcile::<K>(object, ctx)),
            trigger::error_policy,
            ctx,
        )
        .for_each(|_| async {})
}

/// How long the first look for the CK8s control plane kind waits before looking again, and the
/// longest wait between looks (one discovery read each).
const CONTROL_PLANE_LOOK: (Duration, Duration) =
    (Duration::from_secs(10), Duration::from_secs(600));

/// The refresh trigger on CK8sControlPlanes. The kind is the CK8s control plane provider's, which
/// may be installed after us (`clusterctl init` installs providers in one go) or not at all
/// (another control plane provider): it is looked for until it is served, then watched.
pub async fn control_plane_triggers(
    client: Client,
    namespace: Option<String>,
    ctx: Arc<Context>,
    stop: CancellationToken,
) {
    let planes = ctx.stores.control_planes.clone();
    let version = tokio::select! {
        version = control_plane_version(&client, &planes) => version,
        () = stop.cancelled() => return,
    };
    let mut watch = SharedWatch::<ControlPlane>::with(version.clone());
    let events = watch.subscribe();
    planes.set(version.clone(), watch.store.clone());
    let listed = watch.store.clone();
    tokio::spawn(async move {
        // Polled: the trigger controller waits on the store too, and a store wakes one waiter.
        crate::controllers::stores::synced(&listed).await;
        planes.settle();
    });
    let api: Api<ControlPlane> = match &namespace {
        Some(ns) => Api::namespaced_with(client, ns, &version),
        None => Api::all_with(client, &version),
    };
    let controller = triggers(events, watch.store.clone(), version, ctx, stop.clone());
    tokio::select! {
        () = watch.run(api, watcher::Config::default(), stores::keep) => {
            tracing::error!("The CK8sControlPlane watch ended unexpectedly");
        }
        () = controller => {}
    }
}

/// The served version of the CK8s control plane kind, once it is served; `planes` is told
/// when the first look found none.
async fn control_plane_version(client: &Client, planes: &ControlPlanes) -> ControlPlaneVersion {
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
            planes.settle();
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
