//! The Machine reconciler: keeps each CK8s Machine's certificate expiry known and carries out
//! refresh requests (`v1beta2.k8sd.io/refresh-certificates`).
//!
//! Flow of a refresh (writes marked W):
//! ```text
//! trigger ─► TTL valid? ──no──► W status failed, trigger removed, Event (no k8sd call)
//!              │yes
//!              ▼
//!   W Machine in-progress, naming its CertificateRefresh + Event
//!   ─► lock (CP: one per cluster; workers: bounded)
//!   ─► plan ─► W request created ─► W request status: operation {Running, seed}
//!   ─► run (∥ approve for workers)
//!   ─► W request status: operation {Succeeded|Failed, expiry}
//!   ─► W MachineCertificates (expiry, conditions, a copy of the operation)
//!   ─► W Machine done|failed + expiry, trigger removed
//! ```
//! After a crash the operation in the request the Machine names decides: a finished one is only
//! recorded (MachineCertificates, Machine); a Running one had a `run` whose outcome is unknown,
//! so it continues with a new `plan` and a new seed (released k8sd cannot repeat a worker seed,
//! and after a lost answer it does not serve what it wrote), at most [`MAX_RUN_SENDS`] `run`s per
//! operation in total. An expiry is recorded only from a `run` answer.

use std::sync::Arc;
use std::time::Duration;

use ck8s_certs_api::annotations::{IN_FLIGHT_REFRESH, RefreshStatus};
use ck8s_certs_api::capi::{BLOCK_MOVE_ANNOTATION, BLOCK_MOVE_OWNER};
use ck8s_certs_api::machine::{CapiVersion, Cluster, ClusterView, Machine, MachineView};
use ck8s_certs_api::machine_certificates::{
    MachineCertificates, MachineCertificatesStatus, Operation, Role,
};
use ck8s_certs_api::reasons::{condition_reasons as why, events};
use jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::{EventType, Recorder};
use kube::{Api, Client};
use tracing::{Instrument, warn};

use self::step::{Step, decide};
use super::patches::MachineChanges;
use crate::k8sd::K8sdError;
use crate::refresh::session::{Session, Timeouts};
use crate::workload::endpoint::Transport;
use crate::workload::{self, WorkloadError};

mod conclusion;
mod execute;
mod expiry;
pub mod journal;
mod node;
mod outcome;
mod records;
mod requests;
pub mod step;
mod verdict;

use crate::controllers::executor::ApiError;
pub use crate::controllers::executor::MAX_RUN_SENDS;
pub use outcome::KeptOutcomes;

/// Field manager of our writes.
const MANAGER: &str = "ck8s-certs";

/// Settings of the reconciler, from the command line.
#[derive(Clone, Debug)]
pub struct Config {
    pub transport: Transport,
    pub timeouts: Timeouts,
    /// Re-check period of idle Machines.
    pub resync: Duration,
    /// Strict windows and backoff of automatic renewals.
    pub renewal: crate::policy::spec::Settings,
    /// Finished refresh records kept per Machine (`--refresh-history`; 0: none).
    pub history: usize,
}

/// Everything the reconciler touches.
pub struct Context {
    pub client: Client,
    /// The Cluster API version Machines and Clusters are read in.
    pub capi: CapiVersion,
    pub workload: workload::Clients,
    /// The watch caches (Machines, Clusters, MachineCertificates, policies).
    pub stores: super::Stores,
    pub recorder: Recorder,
    pub config: Config,
    /// Carries refreshes out on their nodes (admission per cluster, waits, attempts).
    pub executor: crate::controllers::executor::Executor,
    /// Outcomes of `run`s whose write to their request failed, written before anything else.
    pub outcomes: KeptOutcomes,
    /// Our identity among the --watch-filter shards, and what we saw of the others' Leases.
    pub shard: super::shard::Shard,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The time decisions are taken at.
    pub clock: crate::clock::SharedClock,
    /// Cancelled when the process is asked to stop: operations not yet started on a node are
    /// left for the next leader; those already started finish.
    pub stop: tokio_util::sync::CancellationToken,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API call failed: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error("reading node certificate expiry failed: {0}")]
    Expiry(#[source] K8sdError),
    #[error(transparent)]
    Shard(#[from] super::shard::ShardError),
    /// Our own call failed while a refresh was carried out.
    #[error("Kubernetes API call failed: {0}")]
    Api(#[source] ApiError),
    /// A reconcile that started from the caches reached a write: it starts over on live reads
    /// (never seen outside `Reconciler::run`).
    #[error("the cached state calls for action: reading it live")]
    NeedsLive,
    /// A decision that writes the Machine's final state from what the Machine shows was taken on
    /// the cached Machine: it is taken again on the Machine read live (never seen outside
    /// [`reconcile`]).
    #[error("the cached Machine decides what is written: reading it live")]
    Stale,
}

impl Error {
    pub fn category(&self) -> &'static str {
        match self {
            Self::Kube(_) => "kube",
            Self::Workload(_) => "workload",
            Self::Expiry(e) => e.category(),
            Self::Shard(_) | Self::Api(_) => "kube",
            Self::NeedsLive | Self::Stale => "internal",
        }
    }
}

/// Requeue on errors: short for API hiccups (nothing is lost: state is in the objects).
pub fn error_policy(_machine: Arc<Machine>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(error = %error, category = error.category(), "Reconcile failed");
    Action::requeue(Duration::from_secs(15))
}

pub async fn reconcile(machine: Arc<Machine>, ctx: Arc<Context>) -> Result<Action, Error> {
    let view = MachineView::of(&machine);
    if !view.is_ck8s() || ctx.stop.is_cancelled() {
        return Ok(Action::await_change());
    }
    let span = tracing::info_span!(
        "reconcile",
        Machine = %format!("{}/{}", view.namespace, view.name),
        Cluster = %format!("{}/{}", view.namespace, view.cluster.as_deref().unwrap_or("")),
        seed = tracing::field::Empty,
        step = tracing::field::Empty,
    );
    async {
        ctx.stores.synced().await;
        // The caches decide whether there is anything to do: a Machine at rest costs no request.
        // What to do is decided on what the API server holds now (our own last write may not be
        // in the cache yet, and a status write replaces the whole status).
        let seen = Seen::default();
        let cached = Reconciler {
            ctx: &ctx,
            machine: &machine,
            view: view.clone(),
            mode: Mode::Cache,
            generation: None,
            fresh: false,
            seen: &seen,
        };
        if let Some(action) = cached.still_waiting() {
            return Ok(action);
        }
        if let Some(result) = cached.continue_parked().await {
            return result;
        }
        if let Some(result) = cached.run_from_cache().await {
            return result;
        }
        let result = Reconciler {
            ctx: &ctx,
            machine: &machine,
            view,
            mode: Mode::Live,
            generation: None,
            fresh: false,
            seen: &seen,
        }
        .run()
        .await;
        let Err(Error::Stale) = result else {
            return result;
        };
        let api: Api<Machine> =
            Api::namespaced_with(ctx.client.clone(), &machine_namespace(&machine), &ctx.capi);
        let Some(fresh) = api.get_opt(&machine_name(&machine)).await? else {
            return Ok(Action::await_change());
        };
        Reconciler {
            ctx: &ctx,
            machine: &fresh,
            view: MachineView::of(&fresh),
            mode: Mode::Live,
            generation: None,
            fresh: true,
            seen: &seen,
        }
        .run()
        .await
    }
    .instrument(span)
    .await
}

/// Where a reconcile reads the Cluster and MachineCertificates from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// The watch caches; any write or Event stops it (`Error::NeedsLive`).
    Cache,
    /// The API server.
    Live,
}

struct Reconciler<'a> {
    ctx: &'a Context,
    machine: &'a Machine,
    view: MachineView,
    mode: Mode,
    /// The MachineCertificates' `metadata.generation` (read live): the conditions'
    /// `observedGeneration`.
    generation: Option<i64>,
    /// Whether the Machine was read from the API server (else from the cache).
    fresh: bool,
    /// What this reconcile last read or wrote of the MachineCertificates' status.
    seen: &'a Seen,
}

/// A digest of the MachineCertificates' status as a reconcile last read or wrote it: a refresh
/// that parks notes it, and when woken goes on from the cache if the cache shows that status.
#[derive(Default)]
struct Seen(std::sync::Mutex<Option<u64>>);

impl Seen {
    fn set(&self, status: Option<&MachineCertificatesStatus>) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(super::stores::status_digest(status));
    }

    fn get(&self) -> Option<u64> {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What `prepare` found out about the node.
struct Node {
    session: Session,
    sans: Vec<String>,
    workload: Client,
}

impl Reconciler<'_> {
    fn now(&self) -> Timestamp {
        self.ctx.clock.now()
    }

    fn role(&self) -> Role {
        if self.view.control_plane {
            Role::ControlPlane
        } else {
            Role::Worker
        }
    }

    fn certificates(&self) -> Api<MachineCertificates> {
        Api::namespaced(self.ctx.client.clone(), &self.view.namespace)
    }

    fn machines(&self) -> Api<Machine> {
        Api::namespaced_with(
            self.ctx.client.clone(),
            &self.view.namespace,
            &self.ctx.capi,
        )
    }

    /// Reconciles from the caches when they show a Machine at rest; `None` when the live path
    /// must run (no status object yet, an operation, a trigger, or a change to write).
    async fn run_from_cache(self) -> Option<Result<Action, Error>> {
        let mc = super::stores::get(
            &self.ctx.stores.certificates,
            &self.view.namespace,
            &self.view.name,
        )?;
        let cluster = self.view.cluster.as_deref().and_then(|name| {
            super::stores::get_capi(
                &self.ctx.stores.clusters,
                self.ctx.capi,
                &self.view.namespace,
                name,
            )
        });
        let cluster = cluster.map(|c| ClusterView::of(&c));
        // A status this version cannot read is read live, where it is reported.
        let status = mc.status().ok()?;
        // A Machine naming a request in flight is never at rest: the request is read live.
        let step = decide(&self.view, cluster.as_ref(), status.as_ref(), None);
        if !matches!(
            step,
            Step::Ignore | Step::Paused | Step::WaitForNode | Step::Idle | Step::Reapplied { .. }
        ) || self.view.annotation(IN_FLIGHT_REFRESH).is_some()
        {
            return None;
        }
        match self.act(cluster, status, None, step).await {
            Err(Error::NeedsLive) => None,
            result => Some(result),
        }
    }

    /// In cache mode, stops before a side effect.
    fn live_only(&self) -> Result<(), Error> {
        match self.mode {
            Mode::Cache => Err(Error::NeedsLive),
            Mode::Live => Ok(()),
        }
    }

    async fn run(mut self) -> Result<Action, Error> {
        let cluster = self.cluster().await?;
        // Nothing is created for a paused Cluster: `clusterctl move` pauses it, then deletes our
        // objects before their Machines; one created in between would be left behind.
        let create = !cluster.as_ref().is_some_and(|c| c.paused);
        let Some(mc) = self.machine_certificates(create).await? else {
            return Ok(Action::await_change());
        };
        self.generation = mc.metadata.generation;
        self.seen.set(mc.status.as_ref());
        let status = mc.status;
        // An outcome whose write failed is journaled before the request is read: resuming the
        // request as still Running would send the node a second `run`.
        self.write_kept_outcome().await?;
        let request = self
            .in_flight_request()
            .await?
            .and_then(|r| r.status)
            .and_then(|s| s.operation);
        let waiting = self
            .view
            .annotation(IN_FLIGHT_REFRESH)
            .and_then(|name| self.ctx.executor.waiting_operation(&self.waiter(), name));
        let step = step::decide_waiting(
            &self.view,
            cluster.as_ref(),
            status.as_ref(),
            request.as_ref(),
            waiting.as_ref(),
        );
        if matches!(step, Step::Record(_)) && !self.fresh {
            // Recording shows an outcome on the Machine (done, the trigger removed) because the
            // Machine still shows the refresh: a cache behind would show our own in-progress
            // after a newer request was taken up.
            return Err(Error::Stale);
        }
        if !matches!(
            step,
            Step::Continue(_) | Step::Resume(_) | Step::Start { .. }
        ) {
            // What waited (if anything) is over: withdrawn, paused, recorded.
            self.ctx.executor.forget(&self.waiter());
        }
        self.act(cluster, status, request, step).await
    }

    /// `request`: the operation of the request the Machine names as in flight.
    async fn act(
        self,
        cluster: Option<ClusterView>,
        status: Option<MachineCertificatesStatus>,
        request: Option<Operation>,
        step: Step,
    ) -> Result<Action, Error> {
        tracing::Span::current().record("step", tracing::field::debug(&step));
        let mut status = status.unwrap_or_default();
        // Sharding: an operation another live instance carries out is left to it.
        if let Some(retry) = super::shard::gate(
            &self.ctx.shard,
            &step,
            &self.view.namespace,
            &self.view.name,
            MANAGER,
        )
        .await?
        {
            return Ok(Action::requeue(retry));
        }
        let now = self.now();
        if !matches!(step, Step::Reapplied { .. } | Step::Ignore) {
            // The trigger its owner kept applying is gone (or changed): the refusal is over.
            self.clear_refusal(&mut status, now).await?;
        }
        match step {
            Step::Ignore => Ok(Action::await_change()),
            Step::ClusterMissing => {
                let message = format!(
                    "Cluster {} not found in namespace {}",
                    self.view.cluster.as_deref().unwrap_or("<unset>"),
                    self.view.namespace
                );
                self.set_ready(&mut status, false, why::EXPIRY_UNKNOWN, message, now)
                    .await?;
                Ok(Action::requeue(self.ctx.config.resync))
            }
            Step::Paused => {
                // Announced but not started on the node: nothing for a move to wait for.
                if self.view.annotation(BLOCK_MOVE_ANNOTATION) == Some(BLOCK_MOVE_OWNER) {
                    self.patch_machine(&MachineChanges {
                        release_move: true,
                        ..Default::default()
                    })
                    .await?;
                }
                let message = if cluster.as_ref().is_some_and(|c| c.paused) {
                    "The Cluster is paused: no certificate work until it is resumed"
                } else {
                    "The Machine is paused (annotation cluster.x-k8s.io/paused): no certificate work until it is removed"
                };
                self.set_ready(&mut status, false, why::PAUSED, message.into(), now)
                    .await?;
                Ok(Action::await_change())
            }
            Step::WaitForNode => {
                self.set_ready(
                    &mut status,
                    false,
                    why::NO_NODE,
                    "Waiting for the Machine's node (status.nodeRef)".into(),
                    now,
                )
                .await?;
                Ok(Action::await_change())
            }
            Step::Withdrawn => {
                self.patch_machine(&MachineChanges {
                    status: Some(RefreshStatus::Failed),
                    ..Default::default()
                })
                .await?;
                self.event(
                    EventType::Warning,
                    events::REFRESH_FAILED,
                    "The refresh request was withdrawn before it started".into(),
                )
                .await;
                Ok(Action::await_change())
            }
            Step::Record(op) => {
                let journaled = request.as_ref() == Some(&op);
                self.record(status, &op, journaled).await
            }
            Step::Start { trigger } => {
                self.start(status, trigger, cluster.unwrap_or_default())
                    .await
            }
            Step::Reapplied { trigger, manager } => {
                self.refuse_reapplied(status, &trigger, &manager, now).await
            }
            Step::Continue(op) => {
                let role = self.role();
                self.execute(status, op, false, role, cluster.unwrap_or_default())
                    .await
            }
            Step::Resume(op) => {
                let opened = request.as_ref() == Some(&op);
                self.resume(status, op, opened, cluster.unwrap_or_default())
                    .await
            }
            Step::SyncExpiry => {
                let expiry = status.expiry.clone();
                self.patch_machine(&MachineChanges {
                    expiry: expiry.as_ref(),
                    ..Default::default()
                })
                .await?;
                self.renew(status, cluster.unwrap_or_default()).await
            }
            Step::ReadExpiry => self.read_expiry(status, cluster.unwrap_or_default()).await,
            Step::Idle => self.renew(status, cluster.unwrap_or_default()).await,
        }
    }

    async fn cluster(&self) -> Result<Option<ClusterView>, Error> {
        let Some(name) = self.view.cluster.as_deref() else {
            return Ok(None);
        };
        let api: Api<Cluster> = Api::namespaced_with(
            self.ctx.client.clone(),
            &self.view.namespace,
            &self.ctx.capi,
        );
        Ok(api.get_opt(name).await?.map(|c| ClusterView::of(&c)))
    }
}

/// A role as a metric label value.
pub(crate) fn role_label(role: Role) -> &'static str {
    match role {
        Role::ControlPlane => "control-plane",
        Role::Worker => "worker",
    }
}

impl Error {
    /// The error a [`Failure::Api`] carries: ours when it was ours.
    pub(super) fn from_api(err: ApiError) -> Self {
        match err.downcast::<Self>() {
            Ok(ours) => *ours,
            Err(other) => match other.downcast::<kube::Error>() {
                Ok(kube) => Self::Kube(*kube),
                Err(other) => Self::Api(other),
            },
        }
    }
}

fn machine_namespace(machine: &Machine) -> String {
    machine.metadata.namespace.clone().unwrap_or_default()
}

fn machine_name(machine: &Machine) -> String {
    machine.metadata.name.clone().unwrap_or_default()
}
