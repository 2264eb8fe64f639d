//! Fleet refreshes: `CertificateRefresh` requests for a whole cluster (or one Machine, when made
//! by hand), carried out by handing each Machine the refresh trigger in the order [`plan`]
//! decides; the Machine controller does each refresh exactly as for a manual one and reports it
//! back through the Machine's `MachineCertificates` (its operation names the request).
//!
//! Crash safety: a Machine is marked Running in the request's status before its trigger is set,
//! and a Machine found Running without the trigger after a restart is handed it again only when
//! a live read shows that its refresh never started. [`trigger`] turns the annotation on a
//! Cluster into a request.

mod authority;
mod moves;
pub mod plan;
mod report;
pub mod scope;
mod start;
#[cfg(test)]
mod tests;
pub mod trigger;

pub use start::{control_plane_triggers, start};

use std::sync::Arc;
use std::time::Duration;

use crate::events::Recorder;
use ck8s_certs_api::annotations::{
    FLEET_REQUEST, REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS, RefreshStatus,
};
use ck8s_certs_api::certificate_refresh::{CertificateRefresh, MachinePhase, RequestPhase, Role};
use ck8s_certs_api::machine::{CapiVersion, ClusterView, Machine, MachineView};
use ck8s_certs_api::machine_certificates::{MachineCertificates, Phase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

pub use self::moves::owner_ref;
use self::moves::{hold_move, release_move, restore_status};
use self::plan::{MachineState, Outcome, World};
use self::report::{event_target, mirror_on_trigger, prune, publish};
use self::scope::Scope;
use crate::controllers::stores::{Stores, get, get_capi};

const MANAGER: &str = "ck8s-certs";

/// How often a request that is not finished is looked at again, besides the Machine changes
/// that wake it.
const POLL: Duration = Duration::from_secs(5);

/// A refresh handed over this long ago whose Machine's cache still shows nothing of it is
/// checked live (a restart between the status write and the trigger).
const HAND_OVER_GRACE: jiff::SignedDuration = jiff::SignedDuration::from_secs(30);

pub struct Context {
    pub client: Client,
    pub capi: CapiVersion,
    pub stores: Stores,
    pub requests: Store<CertificateRefresh>,
    pub workload: crate::workload::Clients,
    pub recorder: Recorder,
    /// How long to wait for a cluster API that does not answer after a control plane's refresh.
    pub wait_timeout: Duration,
    /// The lifetimes a request may ask for (`--min-ttl`, `--max-ttl`).
    pub band: crate::refresh::band::TtlBand,
    /// The admission policy that checks requests made by hand (`--request-policy`).
    pub request_policy: Option<String>,
    /// Finished fleet requests kept per Cluster.
    pub history: usize,
    /// `--watch-filter`: only Clusters with this label are ours.
    pub watch_filter: Option<String>,
    /// True once every cache holds a full list: a request is planned on complete information.
    pub synced: tokio::sync::watch::Receiver<bool>,
    /// The time decisions are taken at.
    pub clock: crate::clock::SharedClock,
}

/// Until the caches are synced, a reconcile comes back later.
fn not_synced(ctx: &Context) -> Option<Action> {
    (!*ctx.synced.borrow()).then(|| Action::requeue(Duration::from_secs(1)))
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API call failed: {0}")]
    Kube(#[from] kube::Error),
}

pub fn error_policy(_: Arc<CertificateRefresh>, err: &Error, _: Arc<Context>) -> Action {
    warn!(error = %err, "Fleet refresh step failed; retrying");
    Action::requeue(POLL)
}

pub async fn reconcile(
    request: Arc<CertificateRefresh>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    if let Some(later) = not_synced(&ctx) {
        return Ok(later);
    }
    let namespace = request.namespace().unwrap_or_default();
    let name = request.name_any();
    let old = request.status.clone().unwrap_or_default();
    let api: Api<CertificateRefresh> = Api::namespaced(ctx.client.clone(), &namespace);
    if let Some(phase) = request.outcome() {
        if old.phase.is_none() {
            restore_status(&api, &name, phase).await?;
        }
        // Again, in case a write of the finishing reconcile failed (each is a no-op when done).
        conclude(&ctx, &api, &request, phase).await?;
        return Ok(Action::await_change());
    }
    let views = target_views(&ctx, &request);
    let clusters = views.as_deref().map(clusters_of).unwrap_or_default();
    let cluster = request
        .spec
        .target
        .cluster
        .clone()
        .or_else(|| clusters.first().cloned());
    hold_move(&ctx, &api, &request, cluster.as_deref()).await?;
    let now = ctx.clock.now();
    let mut world = World {
        machines: views.map(|views| views.iter().map(|v| state_of(&ctx, v, &name)).collect()),
        clusters,
        earlier: earlier(&ctx, &request, cluster.as_deref()),
        paused: cluster.as_deref().is_some_and(|c| {
            get_capi(&ctx.stores.clusters, ctx.capi, &namespace, c)
                .is_some_and(|c| ClusterView::of(&c).paused)
        }),
        api_answers: None,
        authority: None,
        wait_timeout: ctx.wait_timeout,
        band: ctx.band,
        now,
    };
    // The planner asks for what it needs to hand Machines over; each is asked once.
    let starting = old.phase.is_none() || old.machines.is_empty();
    let mut next = plan::plan(&request.spec, &old, &world);
    loop {
        if next.needs_authority && world.authority.is_none() {
            let policy = ctx.request_policy.as_deref();
            world.authority =
                Some(authority::check(&ctx.client, policy, &request, starting).await?);
        } else if next.needs_api && world.api_answers.is_none() {
            world.api_answers = Some(api_answers(&ctx, &namespace, cluster.as_deref()).await);
        } else {
            break;
        }
        next = plan::plan(&request.spec, &old, &world);
    }
    if next.status != old {
        let patch = json!({
            "apiVersion": CertificateRefresh::api_version(&()),
            "kind": CertificateRefresh::kind(&()),
            "status": next.status,
        });
        api.patch_status(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(patch),
        )
        .await?;
    }
    for machine in &next.hand {
        let entry = next.status.machines.iter().find(|m| &m.name == machine);
        let handed_before = old
            .machines
            .iter()
            .any(|m| &m.name == machine && m.phase == MachinePhase::Running);
        if handed_before {
            let since = entry
                .and_then(|e| e.started_at.as_ref())
                .map(|t| now.duration_since(t.0))
                .unwrap_or_default();
            if since < HAND_OVER_GRACE || started_live(&ctx, &namespace, machine, &name).await? {
                continue;
            }
            info!(
                request = name,
                machine, "Handing the refresh over again: it never started"
            );
        }
        hand_over(&ctx, &namespace, machine, &request.spec.ttl, &name).await?;
    }
    let target = event_target(&ctx, &request, &namespace);
    for note in &next.notes {
        publish(&ctx.recorder, &target, note).await;
    }
    let finished = next.status.phase.filter(|p| p.is_finished());
    if let Some(phase) = finished {
        info!(
            request = name,
            ?phase,
            message = next.status.message,
            "Fleet refresh finished"
        );
        conclude(&ctx, &api, &request, phase).await?;
        if let (Some(owner), Some(cluster)) = (controller_of(&request), &cluster) {
            prune(&api, cluster, &owner.uid, ctx.history).await;
        }
        return Ok(Action::await_change());
    }
    Ok(Action::requeue(POLL))
}

/// A finished request: its outcome on the object that asked for it, then its block-move
/// released and the outcome recorded on it.
async fn conclude(
    ctx: &Context,
    api: &Api<CertificateRefresh>,
    request: &CertificateRefresh,
    phase: RequestPhase,
) -> Result<(), Error> {
    if let Some(owner) = controller_of(request) {
        let namespace = request.namespace().unwrap_or_default();
        mirror_on_trigger(ctx, &namespace, owner, &request.name_any(), phase).await?;
    }
    release_move(api, request, phase).await
}

/// The request's controlling owner: the object whose trigger created it, or that adopted it.
fn controller_of(request: &CertificateRefresh) -> Option<&OwnerReference> {
    request
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
}

/// The target's CK8s Machines that are not being deleted, as the caches show them; `None` when
/// the target (its Cluster, or its one Machine) is not there or names nothing.
fn target_views(ctx: &Context, request: &CertificateRefresh) -> Option<Vec<MachineView>> {
    let namespace = request.namespace().unwrap_or_default();
    let scope = Scope::of(&request.spec.target).ok()?;
    let views: Vec<MachineView> = match &scope {
        Scope::Machine(machine) => vec![MachineView::of(
            get_capi(&ctx.stores.machines, ctx.capi, &namespace, machine)?.as_ref(),
        )],
        Scope::Cluster(cluster) => {
            get_capi(&ctx.stores.clusters, ctx.capi, &namespace, cluster)?;
            namespace_views(ctx, &namespace, &scope)
        }
        _ => namespace_views(ctx, &namespace, &scope),
    };
    Some(
        views
            .into_iter()
            .filter(|v| v.is_ck8s() && !v.deleting)
            .collect(),
    )
}

fn namespace_views(ctx: &Context, namespace: &str, scope: &Scope) -> Vec<MachineView> {
    ctx.stores
        .machines
        .state()
        .iter()
        .map(|m| MachineView::of(m))
        .filter(|v| v.namespace == namespace && scope.selects(v))
        .collect()
}

/// The cluster a request's Machines belong to (the first one's, if a selector spans several:
/// such a request is refused).
fn cluster_of(ctx: &Context, request: &CertificateRefresh) -> Option<String> {
    if let Some(cluster) = &request.spec.target.cluster {
        return Some(cluster.clone());
    }
    target_views(ctx, request)?
        .into_iter()
        .find_map(|v| v.cluster)
}

/// The distinct clusters of some Machines.
fn clusters_of(views: &[MachineView]) -> Vec<String> {
    let clusters: std::collections::BTreeSet<String> =
        views.iter().filter_map(|v| v.cluster.clone()).collect();
    clusters.into_iter().collect()
}

fn state_of(ctx: &Context, view: &MachineView, request: &str) -> MachineState {
    let ours = view.annotation(FLEET_REQUEST) == Some(request);
    let operation = get(&ctx.stores.certificates, &view.namespace, &view.name)
        .and_then(|c| c.status().ok().flatten())
        .and_then(|s| s.operation);
    let mine = operation
        .as_ref()
        .filter(|op| op.fleet.as_deref() == Some(request));
    let outcome = mine.filter(|op| op.is_finished() && !ours).map(|op| {
        if op.phase == Phase::Succeeded {
            Outcome::Succeeded {
                expiry: op.new_expiry.clone(),
            }
        } else {
            Outcome::Failed {
                error: op.error.clone().unwrap_or_default(),
            }
        }
    });
    let in_flight = view.annotation(REFRESH_CERTIFICATES).is_some()
        || view.annotation(REFRESH_CERTIFICATES_STATUS) == Some(RefreshStatus::InProgress.as_str())
        || operation.as_ref().is_some_and(|op| !op.is_finished());
    MachineState {
        name: view.name.clone(),
        role: if view.control_plane {
            Role::ControlPlane
        } else {
            Role::Worker
        },
        node: view.node_name.is_some(),
        busy: in_flight && !ours && mine.is_none(),
        handed: ours || mine.is_some(),
        outcome,
    }
}

/// The earliest unfinished multi-Machine request of the same cluster, if it is not `request`
/// (a one-Machine request waits for its Machine instead).
fn earlier(ctx: &Context, request: &CertificateRefresh, cluster: Option<&str>) -> Option<String> {
    let cluster = cluster?;
    if !Scope::of(&request.spec.target).is_ok_and(|s| s.is_fleet()) {
        return None;
    }
    let namespace = request.namespace();
    let key = |r: &CertificateRefresh| (r.creation_timestamp().map(|t| t.0), r.name_any());
    ctx.requests
        .state()
        .iter()
        .filter(|r| r.namespace() == namespace && !r.is_finished())
        .filter(|r| Scope::of(&r.spec.target).is_ok_and(|s| s.is_fleet()))
        .filter(|r| cluster_of(ctx, r).as_deref() == Some(cluster))
        .min_by_key(|r| key(r))
        .map(|r| r.name_any())
        .filter(|first| *first != request.name_any())
}

/// How the workload cluster's API server answers (`/version`, bounded).
async fn api_answers(ctx: &Context, namespace: &str, cluster: Option<&str>) -> plan::Api {
    let Some(cluster) = cluster else {
        return plan::Api::Down;
    };
    let client = match ctx.workload.get(namespace, cluster).await {
        Ok(client) => client,
        Err(err) => {
            info!(cluster, error = %err, "The cluster API cannot be reached");
            return plan::Api::Down;
        }
    };
    match tokio::time::timeout(Duration::from_secs(10), client.apiserver_version()).await {
        Ok(Ok(_)) => plan::Api::Answers,
        Ok(Err(err)) if crate::workload::expired_certificate(&err).is_some() => {
            plan::Api::CertificateExpired
        }
        _ => plan::Api::Down,
    }
}

/// Whether the Machine's refresh for `request` started (live reads: the Machine carries the
/// trigger, or its MachineCertificates has the request's operation).
async fn started_live(
    ctx: &Context,
    namespace: &str,
    machine: &str,
    request: &str,
) -> Result<bool, Error> {
    // The Machine first: its trigger goes only after the operation is recorded.
    let machines: Api<Machine> = Api::namespaced_with(ctx.client.clone(), namespace, &ctx.capi);
    let Some(live) = machines.get_opt(machine).await? else {
        return Ok(true);
    };
    if MachineView::of(&live).annotation(FLEET_REQUEST) == Some(request) {
        return Ok(true);
    }
    let certificates: Api<MachineCertificates> = Api::namespaced(ctx.client.clone(), namespace);
    let recorded = certificates
        .get_opt(machine)
        .await?
        .and_then(|c| c.status)
        .and_then(|s| s.operation)
        .is_some_and(|op| op.fleet.as_deref() == Some(request));
    Ok(recorded)
}

/// Sets the trigger (and the request's mark) on a Machine.
async fn hand_over(
    ctx: &Context,
    namespace: &str,
    machine: &str,
    ttl: &str,
    request: &str,
) -> Result<(), Error> {
    let machines: Api<Machine> = Api::namespaced_with(ctx.client.clone(), namespace, &ctx.capi);
    let patch = json!({ "metadata": { "annotations": {
        REFRESH_CERTIFICATES: ttl,
        FLEET_REQUEST: request,
    }}});
    match machines
        .patch(machine, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => {
            info!(request, machine, ttl, "Handed the refresh to the Machine");
            Ok(())
        }
        // Gone meanwhile: the next step skips it.
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// The unfinished requests a Machine's change may move on (those of its cluster or itself).
pub fn requests_of_machine(
    requests: &Store<CertificateRefresh>,
    machine: &Machine,
) -> Vec<ObjectRef<CertificateRefresh>> {
    let view = MachineView::of(machine);
    requests
        .state()
        .iter()
        .filter(|r| r.namespace().as_deref() == Some(view.namespace.as_str()))
        .filter(|r| !r.is_finished())
        .filter(|r| Scope::of(&r.spec.target).is_ok_and(|s| s.selects(&view)))
        .map(|r| ObjectRef::from_obj(r.as_ref()))
        .collect()
}
