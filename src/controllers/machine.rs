//! The Machine reconciler: keeps each CK8s Machine's certificate expiry known and carries out
//! refresh requests (`v1beta2.k8sd.io/refresh-certificates`).
//!
//! Flow of a refresh (writes marked W):
//! ```text
//! trigger ─► TTL valid? ──no──► W status failed, trigger removed, Event (no k8sd call)
//!              │yes
//!              ▼
//!   W Machine in-progress + Event ─► lock (CP: one per cluster; workers: bounded)
//!   ─► plan ─► W operation {Running, seed} ─► run (∥ approve for workers)
//!   ─► W operation {Succeeded|Failed, expiry} ─► W Machine done|failed + expiry, trigger removed
//! ```
//! After a crash the persisted operation decides: a finished one is only recorded on the
//! Machine; a Running one had a `run` whose outcome is unknown, so it continues with a new
//! `plan` and a new seed (released k8sd cannot repeat a worker seed, and after a lost answer it
//! does not serve what it wrote), at most [`MAX_RUN_SENDS`] `run`s per operation in total. An
//! expiry is recorded only from a `run` answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ck8s_certs_api::annotations::{REFRESH_CERTIFICATES, RefreshStatus};
use ck8s_certs_api::capi::{
    CK8S_CONFIG_GROUP, CK8S_CONFIG_KIND, CK8S_CONFIG_VERSION, CLUSTER_NAME_LABEL,
    CONTROL_PLANE_LABEL, WATCH_FILTER_LABEL,
};
use ck8s_certs_api::k8sd::DEFAULT_MICROCLUSTER_PORT;
use ck8s_certs_api::machine::{CapiVersion, Cluster, ClusterView, Machine, MachineView};
use ck8s_certs_api::machine_certificates::{
    MachineCertificates, MachineCertificatesSpec, MachineCertificatesStatus, Operation, Origin,
    Phase, RenewalStatus, Role,
};
use ck8s_certs_api::reasons::{condition_reasons as why, conditions, events};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client, Resource};
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{Instrument, info, warn};

use super::decide::{Step, decide};
use super::patches::{MachineChanges, MachinePatch, machine_patch, set_condition};
use crate::k8sd::wire::{CertificatesExpiryResponse, RunRequest, path};
use crate::k8sd::{Fingerprint, K8sdError};
use crate::policy::Ttl;
use crate::refresh::NodeApi;
use crate::refresh::flow::{self, Retry};
use crate::refresh::session::{Session, Timeouts};
use crate::workload::endpoint::{self, Transport};
use crate::workload::{self, WorkloadError};

/// `run` is sent at most this many times per operation (across retries and restarts), each time
/// after a new `plan`. A second send only happens when the first one's outcome is unknown.
pub const MAX_RUN_SENDS: u32 = 3;

/// Field manager of our writes.
const MANAGER: &str = "ck8s-certs";

/// Settings of the reconciler, from the command line.
#[derive(Clone, Debug)]
pub struct Config {
    pub transport: Transport,
    pub timeouts: Timeouts,
    pub retry: Retry,
    pub max_worker_refreshes_per_cluster: usize,
    pub max_worker_refreshes: usize,
    /// After a control-plane `run`, how long to wait for the node's k8sd to answer again before
    /// another control plane of that cluster may start (k8sd restarts its services).
    pub settle_timeout: Duration,
    /// How long a refresh waits for a node, a control plane or a workload cluster API that does
    /// not answer (k8sd restarts services after a refresh) before it fails.
    pub wait_timeout: Duration,
    /// Re-check period of idle Machines.
    pub resync: Duration,
    /// Strict windows and backoff of automatic renewals.
    pub renewal: crate::policy::spec::Settings,
}

/// In-memory concurrency limits (one controller replica acts at a time: leader election).
pub struct Locks {
    clusters: Mutex<HashMap<(String, String), Arc<ClusterLocks>>>,
    workers: Arc<Semaphore>,
}

struct ClusterLocks {
    /// Control planes take it exclusively, workers shared: a control-plane refresh (with its
    /// settling, while k8sd restarts the control-plane services) never overlaps another refresh
    /// of its cluster, whose worker approvals and tunnels need that control plane. The lock is
    /// fair, so a waiting control plane goes before workers that arrive after it.
    nodes: Arc<tokio::sync::RwLock<()>>,
    workers: Arc<Semaphore>,
}

/// Held while a node is being refreshed.
pub enum Guard {
    ControlPlane(#[allow(dead_code)] tokio::sync::OwnedRwLockWriteGuard<()>),
    Worker(
        #[allow(dead_code)] tokio::sync::OwnedRwLockReadGuard<()>,
        #[allow(dead_code)] OwnedSemaphorePermit,
        #[allow(dead_code)] OwnedSemaphorePermit,
    ),
}

impl Locks {
    pub fn new(max_workers: usize) -> Self {
        Self {
            clusters: Mutex::new(HashMap::new()),
            workers: Arc::new(Semaphore::new(max_workers.max(1))),
        }
    }

    async fn acquire(
        &self,
        namespace: &str,
        cluster: &str,
        role: Role,
        per_cluster: usize,
    ) -> Option<Guard> {
        let locks = {
            let mut map = match self.clusters.lock() {
                Ok(map) => map,
                Err(poisoned) => poisoned.into_inner(),
            };
            map.entry((namespace.to_owned(), cluster.to_owned()))
                .or_insert_with(|| {
                    Arc::new(ClusterLocks {
                        nodes: Arc::new(tokio::sync::RwLock::new(())),
                        workers: Arc::new(Semaphore::new(per_cluster.max(1))),
                    })
                })
                .clone()
        };
        match role {
            Role::ControlPlane => {
                Some(Guard::ControlPlane(locks.nodes.clone().write_owned().await))
            }
            // Acquiring fails only on a closed semaphore, and these are never closed.
            Role::Worker => Some(Guard::Worker(
                locks.nodes.clone().read_owned().await,
                locks.workers.clone().acquire_owned().await.ok()?,
                self.workers.clone().acquire_owned().await.ok()?,
            )),
        }
    }
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
    pub locks: Locks,
    /// Our identity among the --watch-filter shards, and what we saw of the others' Leases.
    pub shard: super::shard::Shard,
    pub metrics: Arc<crate::metrics::Metrics>,
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
    /// A reconcile that started from the caches reached a write: it starts over on live reads
    /// (never seen outside `Reconciler::run`).
    #[error("the cached state calls for action: reading it live")]
    NeedsLive,
}

impl Error {
    pub fn category(&self) -> &'static str {
        match self {
            Self::Kube(_) => "kube",
            Self::Workload(_) => "workload",
            Self::Expiry(e) => e.category(),
            Self::Shard(_) => "kube",
            Self::NeedsLive => "internal",
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
        let cached = Reconciler {
            ctx: &ctx,
            machine: &machine,
            view: view.clone(),
            mode: Mode::Cache,
            generation: None,
        };
        if let Some(result) = cached.run_from_cache().await {
            return result;
        }
        Reconciler {
            ctx: &ctx,
            machine: &machine,
            view,
            mode: Mode::Live,
            generation: None,
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
}

/// What `prepare` found out about the node.
struct Node {
    session: Session,
    cluster: String,
    sans: Vec<String>,
    workload: Client,
}

impl Reconciler<'_> {
    fn now() -> Timestamp {
        Timestamp::now()
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
        let step = decide(&self.view, cluster.as_ref(), status.as_ref());
        if !matches!(
            step,
            Step::Ignore | Step::Paused | Step::WaitForNode | Step::Idle
        ) {
            return None;
        }
        match self.act(cluster, status, step).await {
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
        let mc = self.machine_certificates().await?;
        self.generation = mc.as_ref().and_then(|m| m.metadata.generation);
        let status = mc.as_ref().and_then(|m| m.status.clone());
        let step = decide(&self.view, cluster.as_ref(), status.as_ref());
        self.act(cluster, status, step).await
    }

    async fn act(
        self,
        cluster: Option<ClusterView>,
        status: Option<MachineCertificatesStatus>,
        step: Step,
    ) -> Result<Action, Error> {
        tracing::Span::current().record("step", tracing::field::debug(&step));
        let mut status = status.unwrap_or_default();
        self.export_expiry(&status);
        // Sharding: an operation another live instance carries out is left to it.
        if let Some(retry) = super::shard::gate(
            &self.ctx.shard,
            &step,
            &status,
            &self.view.namespace,
            &self.view.name,
            MANAGER,
        )
        .await?
        {
            return Ok(Action::requeue(retry));
        }
        let now = Self::now();
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
                self.set_ready(
                    &mut status,
                    false,
                    why::PAUSED,
                    "The Cluster is paused: no certificate work until it is resumed".into(),
                    now,
                )
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
            Step::Record(op) => self.record(&op).await,
            Step::Start { trigger } => {
                self.start(status, trigger, cluster.unwrap_or_default())
                    .await
            }
            Step::Resume(op) => self.resume(status, op, cluster.unwrap_or_default()).await,
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

    fn export_expiry(&self, status: &MachineCertificatesStatus) {
        if let Some(expiry) = &status.expiry {
            let labels = crate::metrics::MachineLabels {
                namespace: self.view.namespace.clone(),
                cluster: self.view.cluster.clone().unwrap_or_default(),
                machine: self.view.name.clone(),
                role: role_label(self.role()).to_owned(),
            };
            self.ctx
                .metrics
                .expiry
                .get_or_create(&labels)
                .set(expiry.0.as_millisecond() as f64 / 1000.0);
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

    /// The Machine's MachineCertificates, created (owned by the Machine) when missing.
    async fn machine_certificates(&self) -> Result<Option<MachineCertificates>, Error> {
        let api = self.certificates();
        if let Some(existing) = api.get_opt(&self.view.name).await? {
            // Sharding: the record follows its Machine into another shard's watch.
            let filter = |labels: &std::collections::BTreeMap<String, String>| {
                labels.get(WATCH_FILTER_LABEL).cloned()
            };
            let moved = super::shard::label_patch(
                filter(&self.view.labels).as_deref(),
                existing
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(filter)
                    .as_deref(),
            );
            if let Some(patch) = moved {
                let params = PatchParams {
                    field_manager: Some(MANAGER.into()),
                    ..Default::default()
                };
                return Ok(Some(
                    api.patch(&self.view.name, &params, &Patch::Merge(patch))
                        .await?,
                ));
            }
            return Ok(Some(existing));
        }
        if self.view.deleting {
            return Ok(None);
        }
        let mut mc = MachineCertificates::new(
            &self.view.name,
            MachineCertificatesSpec {
                cluster_name: self.view.cluster.clone().unwrap_or_default(),
            },
        );
        mc.metadata.namespace = Some(self.view.namespace.clone());
        // The cluster label for selection, the watch-filter label so a filtered controller sees it.
        let labels = [CLUSTER_NAME_LABEL, WATCH_FILTER_LABEL]
            .into_iter()
            .filter_map(|key| {
                self.view
                    .labels
                    .get(key)
                    .map(|v| (key.to_owned(), v.clone()))
            });
        mc.metadata.labels = Some(labels.collect());
        mc.metadata.owner_references = Some(vec![OwnerReference {
            api_version: Machine::api_version(&self.ctx.capi).into_owned(),
            kind: "Machine".into(),
            name: self.view.name.clone(),
            uid: self.view.uid.clone().unwrap_or_default(),
            controller: Some(true),
            // true would need update permission on machines/finalizers.
            block_owner_deletion: None,
        }]);
        match api
            .create(
                &PostParams {
                    field_manager: Some(MANAGER.into()),
                    ..Default::default()
                },
                &mc,
            )
            .await
        {
            Ok(created) => Ok(Some(created)),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                Ok(api.get_opt(&self.view.name).await?)
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Writes the whole status with server-side apply: fields we no longer set (a cleared
    /// failure history, the previous operation's error) are removed, which a merge patch of a
    /// struct that skips `None` would silently keep.
    async fn write_status(&self, status: &MachineCertificatesStatus) -> Result<(), Error> {
        self.live_only()?;
        let mut status = status.clone();
        for condition in &mut status.conditions {
            condition.observed_generation = self.generation;
        }
        let apply = json!({
            "apiVersion": MachineCertificates::api_version(&()),
            "kind": MachineCertificates::kind(&()),
            "status": status,
        });
        self.certificates()
            .patch_status(
                &self.view.name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(apply),
            )
            .await?;
        Ok(())
    }

    async fn set_ready(
        &self,
        status: &mut MachineCertificatesStatus,
        ready: bool,
        reason: &str,
        message: String,
        now: Timestamp,
    ) -> Result<(), Error> {
        let before = status.clone();
        set_condition(status, conditions::READY, ready, reason, message, now);
        if *status != before {
            self.write_status(status).await?;
        }
        Ok(())
    }

    async fn patch_machine(&self, changes: &MachineChanges<'_>) -> Result<(), Error> {
        self.live_only()?;
        match self.apply_machine_patch(changes).await {
            Ok(()) => Ok(()),
            // A failed `test`: the trigger changed (a new request) or the Machine was replaced.
            // Apply the rest; the new trigger is handled by the next reconcile.
            Err(kube::Error::Api(status))
                if status.code == 422 && changes.remove_trigger.is_some() =>
            {
                let without = MachineChanges {
                    remove_trigger: None,
                    ..changes.clone()
                };
                Ok(self.apply_machine_patch(&without).await?)
            }
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    async fn apply_machine_patch(&self, changes: &MachineChanges<'_>) -> Result<(), kube::Error> {
        let params = PatchParams {
            field_manager: Some(MANAGER.into()),
            ..Default::default()
        };
        let machines = self.machines();
        match machine_patch(&self.view, changes) {
            MachinePatch::Json(ops) => {
                let ops: json_patch::Patch =
                    serde_json::from_value(ops).map_err(kube::Error::SerdeError)?;
                machines
                    .patch(&self.view.name, &params, &Patch::<()>::Json(ops))
                    .await?;
            }
            MachinePatch::Merge(body) => {
                machines
                    .patch(&self.view.name, &params, &Patch::Merge(body))
                    .await?;
            }
        }
        Ok(())
    }

    async fn event(&self, type_: EventType, reason: &str, note: String) {
        if self.mode == Mode::Cache {
            // Unreachable: every Event follows a write or `live_only` (which stop cache mode).
            warn!(reason, "An Event from cached state was not published");
            return;
        }
        let reference = self.machine.object_ref(&self.ctx.capi);
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(truncate(note, 1000)),
            action: "RefreshCertificates".into(),
            secondary: None,
        };
        if let Err(err) = self.ctx.recorder.publish(&event, &reference).await {
            warn!(error = %err, reason, "Publishing an Event failed");
        }
    }

    /// Fails a request before anything happened on the node (bad input).
    async fn reject(
        &self,
        mut status: MachineCertificatesStatus,
        trigger: &str,
        error: String,
    ) -> Result<Action, Error> {
        let now = Self::now();
        status.operation = Some(Operation {
            origin: Origin::Manual,
            requested_by: self.requested_by(),
            trigger: Some(trigger.to_owned()),
            request: self.request(),
            ttl: trigger.to_owned(),
            ttl_seconds: None,
            seed: None,
            phase: Phase::Failed,
            run_attempts: 0,
            started_at: Time(now),
            finished_at: Some(Time(now)),
            new_expiry: None,
            error: Some(error.clone()),
            note: None,
            matched_window: None,
            bypassed_windows: false,
            carrier: None,
        });
        set_condition(
            &mut status,
            conditions::READY,
            false,
            why::REFRESH_FAILED,
            error.clone(),
            now,
        );
        self.write_status(&status).await?;
        self.patch_machine(&MachineChanges {
            status: Some(RefreshStatus::Failed),
            expiry: None,
            remove_trigger: Some(trigger),
        })
        .await?;
        self.event(EventType::Warning, events::REFRESH_FAILED, error)
            .await;
        Ok(Action::await_change())
    }

    /// The admission webhook's name for the request the trigger belongs to, if it ran.
    fn request(&self) -> Option<String> {
        self.view
            .annotation(ck8s_certs_api::annotations::REFRESH_REQUEST)
            .map(str::to_owned)
    }

    /// The field manager that last set the trigger annotation, e.g. `kubectl-annotate`.
    fn requested_by(&self) -> Option<String> {
        self.machine.trigger_manager.clone()
    }

    async fn start(
        self,
        status: MachineCertificatesStatus,
        trigger: String,
        cluster: ClusterView,
    ) -> Result<Action, Error> {
        let ttl: Ttl = match trigger.parse() {
            Ok(ttl) => ttl,
            Err(err) => {
                return self
                    .reject(
                        status,
                        &trigger,
                        super::renewal::with_hint(
                            format!("Refusing to refresh: {err}; annotate again with a valid TTL"),
                            &super::renewal::renew_now_hint(
                                &self.view,
                                &ck8s_certs_api::renewal_policy::DEFAULT_TTL.to_string(),
                            ),
                        ),
                    )
                    .await;
            }
        };
        let role = self.role();
        if role == Role::Worker
            && let Err(err) = ttl.check_worker()
        {
            return self
                .reject(
                    status,
                    &trigger,
                    super::renewal::with_hint(
                        format!(
                            "Refusing to refresh: {err}; annotate again with a TTL from 10m to 68y"
                        ),
                        &super::renewal::renew_now_hint(
                            &self.view,
                            &ck8s_certs_api::renewal_policy::DEFAULT_TTL.to_string(),
                        ),
                    ),
                )
                .await;
        }
        let node = self.view.node_name.clone().unwrap_or_default();
        let announcement = format!("Refreshing the certificates of node {node} for {trigger}");
        let op = Operation {
            request: self.request(),
            ..Operation::pending(
                Origin::Manual,
                self.requested_by(),
                Some(trigger.clone()),
                trigger,
                ttl.as_seconds(),
                Time(Self::now()),
            )
        };
        self.announce_and_execute(status, op, announcement, cluster)
            .await
    }

    /// Starts an automatic renewal: the same operation as a manual refresh, origin Policy.
    async fn start_automatic(
        &self,
        status: MachineCertificatesStatus,
        policy: &str,
        ttl: Ttl,
        cluster: ClusterView,
        matched_window: Option<String>,
        bypassed_windows: bool,
    ) -> Result<Action, Error> {
        let node = self.view.node_name.clone().unwrap_or_default();
        let announcement = format!(
            "Renewing the certificates of node {node} for {ttl}, as CertificateRenewalPolicy {policy} requires"
        );
        let requested_by = Some(format!("CertificateRenewalPolicy/{policy}"));
        let op = Operation {
            matched_window,
            bypassed_windows,
            ..Operation::pending(
                Origin::Policy,
                requested_by,
                None,
                ttl.to_string(),
                ttl.as_seconds(),
                Time(Self::now()),
            )
        };
        self.announce_and_execute(status, op, announcement, cluster)
            .await
    }

    /// Shows the Machine in-progress with an Event, then runs the operation.
    async fn announce_and_execute(
        &self,
        status: MachineCertificatesStatus,
        op: Operation,
        announcement: String,
        cluster: ClusterView,
    ) -> Result<Action, Error> {
        if self.ctx.stop.is_cancelled() {
            return Ok(Action::await_change());
        }
        self.patch_machine(&MachineChanges {
            status: Some(RefreshStatus::InProgress),
            ..Default::default()
        })
        .await?;
        self.event(EventType::Normal, events::REFRESH_IN_PROGRESS, announcement)
            .await;
        self.execute(status, op, self.role(), cluster).await
    }

    /// Applies the governing renewal policy, if any: renew now, or record why not and come back
    /// exactly when the answer can change. The verdict is written only when it changes.
    async fn renew(
        &self,
        mut status: MachineCertificatesStatus,
        cluster: ClusterView,
    ) -> Result<Action, Error> {
        use super::renewal::{CONFIG_INVALID, Governing, Verdict, with_hint};
        use crate::policy::{Decision, DeferReason, RenewReason};
        let now = Self::now();
        let resync = self.ctx.config.resync;
        let hint = |ttl: &str| super::renewal::renew_now_hint(&self.view, ttl);
        let default_ttl = ck8s_certs_api::renewal_policy::DEFAULT_TTL.to_string();
        let warn_invalid = Some((EventType::Warning, events::RENEWAL_CONFIG_INVALID));
        let governing = super::renewal::governing(
            &self.ctx.stores.policies,
            &self.view.namespace,
            Some(&cluster.labels),
            &self.view.labels,
        );
        let (info, policy) = match governing {
            Governing::None => {
                self.show_verdict(&status, Verdict::none(), None, now)
                    .await?;
                return Ok(Action::requeue(resync));
            }
            Governing::Conflict(names) => {
                let message = format!(
                    "CertificateRenewalPolicies {} all select this Machine; no automatic renewal until exactly one does (adjust their selectors)",
                    names.join(", ")
                );
                let verdict = Verdict::conflict(names, with_hint(message, &hint(&default_ttl)));
                self.show_verdict(&status, verdict, warn_invalid, now)
                    .await?;
                return Ok(Action::requeue(resync));
            }
            Governing::One { info, policy } => (info, policy),
        };
        let invalid = |message: String, ttl: &str| {
            Verdict::new(
                &info,
                CONFIG_INVALID,
                None,
                with_hint(message, &hint(ttl)),
                Some(conditions::RENEWAL_CONFIG_INVALID),
            )
        };
        let policy = match policy {
            Ok(policy) => policy,
            Err(message) => {
                let verdict = invalid(message, &default_ttl);
                self.show_verdict(&status, verdict, warn_invalid, now)
                    .await?;
                return Ok(Action::requeue(resync));
            }
        };
        let ttl = policy.ttl.to_string();
        if !self.view.control_plane
            && let Err(err) = policy.ttl.check_worker()
        {
            let message = format!(
                "CertificateRenewalPolicy {} cannot renew this worker: {err}",
                info.name
            );
            let verdict = invalid(message, &default_ttl);
            self.show_verdict(&status, verdict, warn_invalid, now)
                .await?;
            return Ok(Action::requeue(resync));
        }
        let failures = crate::policy::Failures {
            count: status.failed_attempts,
            last_failure: status.last_failure_time.as_ref().map(|t| t.0),
        };
        let input = policy
            .input(
                status.expiry.as_ref().map(|t| t.0),
                failures,
                self.ctx.config.renewal,
            )
            // For renewBeforePercentage: when the certificates now served were issued.
            .with_lifetime_start(crate::policy::lifetime_start(&status))
            // Its place in the policy's spread: the UID stays the same for the Machine's life.
            .with_stagger_key(self.view.uid.as_deref());
        let decision = crate::policy::decide(&input, now);
        let requeue = crate::policy::requeue_at(&decision)
            .map(|at| {
                Duration::try_from(at.duration_since(now))
                    .unwrap_or_default()
                    .max(Duration::from_millis(100))
            })
            .map_or(resync, |d| d.min(resync));
        let message = decision.to_string();
        let windows_ignored = |verdict: Verdict| {
            if decision.windows_ignored() {
                verdict.with(
                    conditions::WINDOWS_IGNORED,
                    "Automatic",
                    crate::policy::decision::WINDOWS_IGNORED_MESSAGE.to_owned(),
                )
            } else {
                verdict
            }
        };
        let severity = if decision.is_warning() {
            EventType::Warning
        } else {
            EventType::Normal
        };
        match &decision {
            Decision::NoExpiry { .. } => Ok(Action::requeue(resync)),
            Decision::RenewNow(renewal) => {
                self.live_only()?;
                let verdict = Verdict::new(&info, "RenewNow", Some(now), message.clone(), None);
                if renewal.reason == RenewReason::FailSafeBypass {
                    // Kept (with its condition) until a later refresh succeeds.
                    status.last_window_bypass =
                        Some(ck8s_certs_api::machine_certificates::WindowBypass {
                            time: Time(now),
                            expiry: status.expiry.clone(),
                            message: message.clone(),
                        });
                    self.event(
                        EventType::Warning,
                        events::RENEWAL_WINDOW_BYPASSED,
                        message.clone(),
                    )
                    .await;
                    self.ctx
                        .metrics
                        .renewal_bypassed
                        .get_or_create(&crate::metrics::expiry_imminent())
                        .inc();
                }
                let matched_window = renewal
                    .window
                    .map(|index| super::renewal::describe_window(&policy.windows, index));
                let bypassed = renewal.reason == RenewReason::FailSafeBypass;
                let status = super::renewal::with_verdict(&status, &windows_ignored(verdict), now);
                self.start_automatic(
                    status,
                    &info.name,
                    policy.ttl,
                    cluster,
                    matched_window,
                    bypassed,
                )
                .await
            }
            Decision::Defer(deferral) => {
                // Not due is the healthy steady state: no condition, and a Normal Event saying
                // when the next renewal is. Anything else holds back a due renewal.
                let (condition, announce) = if deferral.reason == DeferReason::NotDue {
                    (None, (EventType::Normal, events::RENEWAL_SCHEDULED))
                } else {
                    (
                        Some(conditions::RENEWAL_DEFERRED),
                        (severity, events::RENEWAL_DEFERRED),
                    )
                };
                let verdict = Verdict::new(
                    &info,
                    deferral.reason.as_str(),
                    Some(deferral.until),
                    with_hint(message, &hint(&ttl)),
                    condition,
                );
                self.show_verdict(&status, windows_ignored(verdict), Some(announce), now)
                    .await?;
                Ok(Action::requeue(requeue))
            }
            Decision::Disabled { .. } => {
                let verdict = Verdict::new(
                    &info,
                    "Disabled",
                    None,
                    with_hint(message, &hint(&ttl)),
                    Some(conditions::RENEWAL_DISABLED),
                );
                self.show_verdict(
                    &status,
                    windows_ignored(verdict),
                    Some((severity, events::RENEWAL_DISABLED)),
                    now,
                )
                .await?;
                Ok(Action::requeue(requeue))
            }
            Decision::Invalid { .. } => {
                self.show_verdict(&status, invalid(message, &ttl), warn_invalid, now)
                    .await?;
                Ok(Action::requeue(resync))
            }
        }
    }

    /// Shows a renewal verdict: the status is written only when it differs from what is stored
    /// (at rest nothing is written); a changed verdict is announced with `announce` and counted.
    async fn show_verdict(
        &self,
        current: &MachineCertificatesStatus,
        verdict: super::renewal::Verdict,
        announce: Option<(EventType, &str)>,
        now: Timestamp,
    ) -> Result<(), Error> {
        let desired = super::renewal::with_verdict(current, &verdict, now);
        if desired != *current {
            self.write_status(&desired).await?;
        }
        let Some(renewal) = verdict.renewal.as_ref() else {
            return Ok(());
        };
        // A new generation of the same policy with the same outcome is recorded, not announced.
        fn said(r: &RenewalStatus) -> (&String, &String, &Option<Time>) {
            (&r.reason, &r.message, &r.next_renewal_time)
        }
        if current.renewal.as_ref().map(said) == Some(said(renewal)) {
            return Ok(());
        }
        let labels = crate::metrics::reason_label(&renewal.reason);
        match verdict.conditions.first().map(|(type_, _, _)| *type_) {
            Some(conditions::RENEWAL_DEFERRED) => {
                self.ctx
                    .metrics
                    .renewal_deferred
                    .get_or_create(&labels)
                    .inc();
            }
            Some(conditions::RENEWAL_CONFIG_INVALID) => {
                self.ctx.metrics.policy_invalid.get_or_create(&labels).inc();
            }
            _ => {}
        }
        if let Some((type_, reason)) = announce {
            self.event(type_, reason, renewal.message.clone()).await;
        }
        Ok(())
    }

    async fn resume(
        self,
        status: MachineCertificatesStatus,
        op: Operation,
        cluster: ClusterView,
    ) -> Result<Action, Error> {
        let role = status.role.unwrap_or(self.role());
        info!(seed = ?op.seed, attempts = op.run_attempts, "Resuming an interrupted refresh");
        self.execute(status, op, role, cluster).await
    }

    /// Control planes first: a worker whose cluster has a control-plane refresh requested or
    /// running waits for it (up to `--refresh-wait-timeout`), so that a cluster annotated in one
    /// command refreshes its control planes before its workers, whose approvals need them.
    async fn control_planes_first(&self) {
        let pending = || {
            self.ctx.stores.machines.state().iter().any(|m| {
                let other = MachineView::of(m);
                other.control_plane
                    && other.name != self.view.name
                    && other.namespace == self.view.namespace
                    && other.cluster == self.view.cluster
                    && other.node_name.is_some()
                    && !other.deleting
                    && (other.annotation(REFRESH_CERTIFICATES).is_some()
                        || other
                            .annotation(ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS)
                            == Some(RefreshStatus::InProgress.as_str()))
            })
        };
        let deadline = tokio::time::Instant::now() + self.ctx.config.wait_timeout;
        let mut logged = false;
        while pending() && tokio::time::Instant::now() < deadline && !self.ctx.stop.is_cancelled() {
            if !logged {
                info!("Waiting for the control planes of the cluster to be refreshed first");
                logged = true;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Runs (or continues) `op` under the cluster's lock and records the outcome.
    async fn execute(
        &self,
        mut status: MachineCertificatesStatus,
        mut op: Operation,
        role: Role,
        cluster: ClusterView,
    ) -> Result<Action, Error> {
        let cluster_name = self.view.cluster.clone().unwrap_or_default();
        let config = &self.ctx.config;
        if role == Role::Worker && op.seed.is_none() {
            self.control_planes_first().await;
        }
        let acquire = self.ctx.locks.acquire(
            &self.view.namespace,
            &cluster_name,
            role,
            config.max_worker_refreshes_per_cluster,
        );
        let guard = tokio::select! {
            guard = acquire => guard,
            () = self.ctx.stop.cancelled() => None,
        };
        let Some(_guard) = guard else {
            // Stopping: the next leader takes this up from the record.
            return Ok(Action::await_change());
        };
        if op.seed.is_none() && self.ctx.stop.is_cancelled() {
            // Stopping: nothing was sent to the node yet, the next leader starts it.
            return Ok(Action::await_change());
        }
        let metrics = &self.ctx.metrics;
        if op.seed.is_none() {
            metrics
                .renewals_started
                .get_or_create(&crate::metrics::origin(op.origin))
                .inc();
        }
        metrics.in_progress.inc();
        let _in_progress = scopeguard(|| {
            metrics.in_progress.dec();
        });
        status.role = Some(role);
        status.node_name = self.view.node_name.clone();
        let result = self.refresh(&mut status, &mut op, role, &cluster).await;
        let mut node = match result {
            Ok(node) => node,
            Err(Failure::Stopping) => return Ok(Action::await_change()),
            // Another instance recorded its own attempt first: it carries the refresh out.
            Err(Failure::Superseded) => return Ok(Action::requeue(super::shard::RECHECK)),
            Err(failure) => return self.finish(status, op, Err(failure)).await,
        };
        let action = self.finish(status, op.clone(), Ok(())).await?;
        if role == Role::ControlPlane && op.phase == Phase::Succeeded {
            // k8sd restarts the control-plane services after answering: keep other control
            // planes of this cluster waiting until this one answers again.
            let settle = tokio::time::timeout(config.settle_timeout, async {
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if node.session.probe().await.is_ok() {
                        break;
                    }
                }
            });
            if settle.await.is_err() {
                warn!(node = %node.session.target().node, "k8sd did not answer again within the settle timeout after a refresh");
            }
        }
        drop(node.workload);
        Ok(action)
    }

    /// Records an attempt (its seed) before its `run` is sent. With a Lease, the same write names
    /// us as the operation's carrier, on the condition that the record did not change since it
    /// was read (sharding): of two instances that planned at once (`plan` changes nothing on the
    /// node), only one records and runs.
    async fn record_attempt(
        &self,
        status: &mut MachineCertificatesStatus,
        op: &mut Operation,
    ) -> Result<(), Failure> {
        if self.ctx.shard.ours().is_none() {
            return self.write_status(status).await.map_err(Failure::Api);
        }
        self.live_only().map_err(Failure::Api)?;
        let (namespace, name) = (&self.view.namespace, &self.view.name);
        match self
            .ctx
            .shard
            .claim(namespace, name, status, op, MANAGER)
            .await
        {
            Ok(super::shard::Claimed::Ours) => Ok(()),
            Ok(super::shard::Claimed::Lost) => Err(Failure::Superseded),
            Err(err) => Err(Failure::Api(err.into())),
        }
    }

    /// Everything up to the outcome of `run`. Progress is written to `status` as it happens.
    ///
    /// Every attempt is a fresh `plan` whose seed is recorded before its `run` is sent; an
    /// attempt whose outcome is unknown (no answer, or a crash while it ran) is followed by a new
    /// `plan`, never by the same seed again: released k8sd refuses a worker `run` with a seed
    /// whose CSRs exist, and after a lost answer it skips the restart, so only a new `run` whose
    /// answer arrives tells what the node serves. At most [`MAX_RUN_SENDS`] attempts.
    async fn refresh(
        &self,
        status: &mut MachineCertificatesStatus,
        op: &mut Operation,
        role: Role,
        cluster: &ClusterView,
    ) -> Result<Node, Failure> {
        let mut wait = Wait::new(self.ctx.config.wait_timeout);
        let mut node = loop {
            match self.prepare(status, role, cluster).await {
                Err(failure) if failure.unavailable() => {
                    self.pause(&mut wait, status, op, "the workload cluster", &failure)
                        .await?;
                }
                result => break result?,
            }
        };
        let mut approver = match role {
            Role::ControlPlane => None,
            Role::Worker => Some(loop {
                match self.approver(&node.cluster).await {
                    Err(failure) if failure.unavailable() => {
                        self.pause(
                            &mut wait,
                            status,
                            op,
                            "a Ready control-plane node",
                            &failure,
                        )
                        .await?;
                    }
                    result => break result?,
                }
            }),
        };
        let retry = self.ctx.config.retry.clone();
        loop {
            if op.phase == Phase::Running
                && let Some(seed) = op.seed
            {
                // The run of `seed` has no known outcome.
                if op.run_attempts >= MAX_RUN_SENDS {
                    return Err(Failure::Message(format!(
                        "run was sent {} times without an answer (last seed {seed}); the node may hold new certificates that it does not serve yet",
                        op.run_attempts
                    )));
                }
                info!(
                    seed,
                    attempts = op.run_attempts,
                    "The outcome of run is unknown: refreshing again with a new plan"
                );
            }
            let plan = loop {
                match flow::plan(&mut node.session, &retry).await {
                    Ok(plan) => break plan,
                    Err(err) => {
                        let failure = Failure::k8sd("plan", err);
                        if !failure.unavailable() {
                            return Err(failure);
                        }
                        self.pause(&mut wait, status, op, "the node's k8sd", &failure)
                            .await?;
                    }
                }
            };
            if self.ctx.stop.is_cancelled() && op.seed.is_none() {
                return Err(Failure::Stopping);
            }
            let seed = plan.seed;
            op.seed = Some(seed);
            op.phase = Phase::Running;
            op.run_attempts = op.run_attempts.saturating_add(1);
            // Record the seed (and the pinned certificate) before anything changes on the node.
            status.operation = Some(op.clone());
            status.k8sd_fingerprint = node.session.fingerprint().map(|f| f.to_string());
            set_condition(
                status,
                conditions::REFRESHING,
                true,
                why::REFRESH_IN_PROGRESS,
                format!("Refreshing with seed {seed}"),
                Self::now(),
            );
            self.record_attempt(status, op).await?;
            crate::failpoint::hit(crate::failpoint::AFTER_SEED_RECORDED);
            tracing::Span::current().record("seed", seed);

            let request = RunRequest {
                certificates: None,
                seed,
                expiration_seconds: op.ttl_seconds.unwrap_or_default(),
                extra_sans: (role == Role::ControlPlane).then(|| node.sans.clone()),
            };
            let (answered, approve_error) = match approver.as_mut() {
                None => (node.session.run(&request).await, None),
                Some(approver) => {
                    let worker = flow::run_worker(&mut node.session, approver, &request).await;
                    if worker.approve_abandoned
                        && let (Err(err), Some(approve)) = (&worker.run, &worker.approve_error)
                    {
                        // Nothing approved the CSRs: the cause is known, a new plan would not help.
                        return Err(Failure::Message(format!(
                            "Approving the worker's CSRs failed ({approve}), and run then failed: {err}"
                        )));
                    }
                    (worker.run, worker.approve_error)
                }
            };
            match answered {
                Ok(response) => {
                    crate::failpoint::hit(crate::failpoint::AFTER_RUN_ANSWERED);
                    let outcome = flow::interpret_run(&response, Self::now())
                        .map_err(|e| Failure::k8sd("run", e))?;
                    if let Some(err) = approve_error {
                        // Recorded, not reported as a failure: run's answer is the outcome.
                        op.note = Some(format!(
                            "approve answered an error that did not stop the refresh: {err}"
                        ));
                    }
                    self.succeed(op, outcome)?;
                    return Ok(node);
                }
                Err(err) if flow::outcome_unknown(&err) => {
                    warn!(seed, error = %err, "run got no answer; its outcome is unknown");
                }
                Err(err) => return Err(Failure::k8sd("run", err)),
            }
        }
    }

    /// Waits while something the refresh needs does not answer (a node or control plane
    /// restarting after a refresh), up to `--refresh-wait-timeout`; the first wait is shown in
    /// the Refreshing condition (and the operation record, once it is persisted).
    async fn pause(
        &self,
        wait: &mut Wait,
        status: &mut MachineCertificatesStatus,
        op: &mut Operation,
        what: &str,
        failure: &Failure,
    ) -> Result<(), Failure> {
        let reason = failure.cause();
        let Some(delay) = wait.next() else {
            return Err(Failure::Message(format!(
                "{what} did not answer within {} ({reason})",
                humantime::format_duration(self.ctx.config.wait_timeout)
            )));
        };
        if !wait.shown {
            wait.shown = true;
            let note = format!("Waiting for {what}, which does not answer (restarting?): {reason}");
            info!(note, "Waiting");
            op.note = Some(note.clone());
            // A pending operation is never persisted (nothing was sent; after a crash the
            // request simply starts again): then the condition alone says it.
            if op.seed.is_some() {
                status.operation = Some(op.clone());
            }
            set_condition(
                status,
                conditions::REFRESHING,
                true,
                why::REFRESH_IN_PROGRESS,
                note,
                Self::now(),
            );
            self.write_status(status).await.map_err(Failure::Api)?;
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => Ok(()),
            () = self.ctx.stop.cancelled(), if op.seed.is_none() => Err(Failure::Stopping),
        }
    }

    fn succeed(&self, op: &mut Operation, outcome: flow::RunOutcome) -> Result<(), Failure> {
        op.phase = Phase::Succeeded;
        op.new_expiry = Some(Time(outcome.not_after));
        let mut notes = Vec::new();
        if let Some(note) = op.note.take() {
            notes.push(note);
        }
        if outcome.answered_duration {
            notes.push("k8sd answered the certificate lifetime instead of its expiry (an older k8sd); the expiry was computed from the time of the answer".into());
        }
        if let Some(seconds) = op.ttl_seconds
            && let Some(note) = flow::lifetime_mismatch(
                Duration::from_secs(seconds.unsigned_abs()),
                op.started_at.0,
                outcome.not_after,
            )
        {
            notes.push(note);
        }
        op.note = (!notes.is_empty()).then(|| notes.join("; "));
        Ok(())
    }

    /// Resolves the node, its tokens and SANs, and opens a session (nothing sent yet).
    async fn prepare(
        &self,
        status: &MachineCertificatesStatus,
        role: Role,
        cluster: &ClusterView,
    ) -> Result<Node, Failure> {
        let ns = &self.view.namespace;
        let cluster_name = self.view.cluster.clone().unwrap_or_default();
        let node_name = self.view.node_name.clone().unwrap_or_default();
        let client = self
            .ctx
            .workload
            .get(ns, &cluster_name)
            .await
            .map_err(Failure::Workload)?;
        let config = self
            .ck8s_config()
            .await
            .map_err(|e| Failure::Api(e.into()))?;
        let port = config
            .as_ref()
            .and_then(|c| c.data.pointer("/spec/controlPlane/microclusterPort"))
            .and_then(serde_json::Value::as_u64)
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(DEFAULT_MICROCLUSTER_PORT);
        let mut sans: Vec<String> = config
            .as_ref()
            .and_then(|c| c.data.pointer("/spec/controlPlane/extraSANs"))
            .and_then(serde_json::Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str())
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        if role == Role::ControlPlane {
            // The CK8s provider adds the CK8sConfig's name when the node joins: keep it.
            if let Some(name) = &self.view.bootstrap_name {
                sans.push(name.clone());
            }
            if let Some(host) = &cluster.endpoint_host {
                sans.push(host.clone());
            }
            sans.dedup();
        }
        let endpoint = endpoint::resolve(
            &client,
            &cluster_name,
            &node_name,
            port,
            self.ctx.config.transport,
        )
        .await
        .map_err(Failure::Workload)?;
        let tokens = workload::tokens(&self.ctx.client, ns, &cluster_name, &self.view.name)
            .await
            .map_err(Failure::Workload)?;
        let pin = status
            .k8sd_fingerprint
            .as_deref()
            .and_then(|f| f.parse::<Fingerprint>().ok());
        let session = Session::node(
            endpoint.target,
            endpoint.route,
            pin,
            tokens.node,
            self.ctx.config.timeouts,
            self.ctx.metrics.k8sd.clone(),
        );
        Ok(Node {
            session,
            cluster: cluster_name,
            sans,
            workload: client,
        })
    }

    async fn ck8s_config(&self) -> Result<Option<DynamicObject>, kube::Error> {
        let Some(name) = &self.view.bootstrap_name else {
            return Ok(None);
        };
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
            CK8S_CONFIG_GROUP,
            CK8S_CONFIG_VERSION,
            CK8S_CONFIG_KIND,
        ));
        Api::<DynamicObject>::namespaced_with(
            self.ctx.client.clone(),
            &self.view.namespace,
            &resource,
        )
        .get_opt(name)
        .await
    }

    /// A session to a Ready control-plane node of the same cluster that answers a probe.
    async fn approver(&self, cluster: &str) -> Result<Session, Failure> {
        let ns = &self.view.namespace;
        let client = self
            .ctx
            .workload
            .get(ns, cluster)
            .await
            .map_err(Failure::Workload)?;
        let tokens = workload::tokens(&self.ctx.client, ns, cluster, &self.view.name)
            .await
            .map_err(Failure::Workload)?;
        // Listed, not taken from our cache: the control planes need not be in our watch scope
        // (--watch-filter, --namespace) to approve a worker's CSRs.
        let selector = format!("{CLUSTER_NAME_LABEL}={cluster},{CONTROL_PLANE_LABEL}");
        let listed = self
            .machines()
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| Failure::Api(e.into()))?;
        let mut candidates: Vec<MachineView> = listed
            .items
            .iter()
            .map(MachineView::of)
            .filter(|m| m.node_name.is_some() && !m.deleting)
            .collect();
        candidates.sort_by(|a, b| a.name.cmp(&b.name));
        let mut tried = Vec::new();
        for machine in candidates {
            let node = machine.node_name.clone().unwrap_or_default();
            let config = Api::<MachineCertificates>::namespaced(self.ctx.client.clone(), ns)
                .get_opt(&machine.name)
                .await
                .ok()
                .flatten();
            let pin = config
                .and_then(|c| c.status)
                .and_then(|s| s.k8sd_fingerprint)
                .and_then(|f| f.parse::<Fingerprint>().ok());
            let port = self.microcluster_port_of(&machine).await;
            let Ok(endpoint) =
                endpoint::resolve(&client, cluster, &node, port, self.ctx.config.transport).await
            else {
                tried.push(format!("{node} (no endpoint)"));
                continue;
            };
            if !endpoint.ready {
                tried.push(format!("{node} (not Ready)"));
                continue;
            }
            let mut session = Session::approver(
                endpoint.target,
                endpoint.route,
                pin,
                tokens.capi_auth.clone(),
                self.ctx.config.timeouts,
                self.ctx.metrics.k8sd.clone(),
            );
            match session.probe().await {
                Ok(()) => return Ok(session),
                Err(err) => tried.push(format!("{node} ({err})")),
            }
        }
        Err(Failure::Unavailable(format!(
            "No Ready control-plane node of cluster {cluster} answered, so the worker's CSRs cannot be approved (tried: {}); check the control-plane nodes and their k8sd-proxy pods",
            if tried.is_empty() {
                "none found".to_owned()
            } else {
                tried.join(", ")
            }
        )))
    }

    async fn microcluster_port_of(&self, machine: &MachineView) -> u16 {
        let Some(name) = &machine.bootstrap_name else {
            return DEFAULT_MICROCLUSTER_PORT;
        };
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
            CK8S_CONFIG_GROUP,
            CK8S_CONFIG_VERSION,
            CK8S_CONFIG_KIND,
        ));
        Api::<DynamicObject>::namespaced_with(
            self.ctx.client.clone(),
            &machine.namespace,
            &resource,
        )
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|c| {
            c.data
                .pointer("/spec/controlPlane/microclusterPort")
                .and_then(serde_json::Value::as_u64)
        })
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or(DEFAULT_MICROCLUSTER_PORT)
    }

    /// Records the outcome: operation and conditions first, then the Machine, then Events.
    async fn finish(
        &self,
        mut status: MachineCertificatesStatus,
        mut op: Operation,
        result: Result<(), Failure>,
    ) -> Result<Action, Error> {
        let now = Self::now();
        op.finished_at = Some(Time(now));
        let outcome = if result.is_ok() {
            "succeeded"
        } else {
            "failed"
        };
        if !matches!(result, Err(Failure::Api(_))) {
            let metrics = &self.ctx.metrics;
            let origin = crate::metrics::origin(op.origin);
            if result.is_ok() {
                &metrics.renewals_succeeded
            } else {
                &metrics.renewals_failed
            }
            .get_or_create(&origin)
            .inc();
            let seconds = now.duration_since(op.started_at.0).as_secs_f64().max(0.0);
            let role = role_label(self.role());
            metrics
                .refresh_duration
                .get_or_create(&crate::metrics::RefreshLabels {
                    origin: origin.origin,
                    role: role.to_owned(),
                    result: outcome.to_owned(),
                })
                .observe(seconds);
        }
        match result {
            Ok(()) => {
                // Any success ends the backoff, and an earlier fail-safe bypass is history.
                status.failed_attempts = None;
                status.last_failure_time = None;
                super::renewal::forget_window_bypass(&mut status, &op);
                super::renewal::show_window_bypass(&mut status, now);
                status.expiry = op.new_expiry.clone();
                set_condition(
                    &mut status,
                    conditions::READY,
                    true,
                    why::REFRESHED,
                    format!(
                        "Certificates refreshed; they expire at {}",
                        op.new_expiry
                            .as_ref()
                            .map(super::patches::rfc3339)
                            .unwrap_or_default()
                    ),
                    now,
                );
            }
            Err(Failure::Api(err)) => {
                // Our own write failed: the operation stays as last persisted and is resumed.
                return Err(err);
            }
            Err(failure) => {
                if op.origin == Origin::Policy {
                    // Remembered in the object, so the backoff survives restarts and failovers.
                    status.failed_attempts =
                        Some(status.failed_attempts.unwrap_or(0).max(0).saturating_add(1));
                    status.last_failure_time = Some(Time(now));
                }
                op.phase = Phase::Failed;
                let message = super::renewal::with_hint(
                    failure.message(&self.view),
                    &super::renewal::renew_now_hint(&self.view, &op.ttl),
                );
                op.error = Some(message.clone());
                set_condition(
                    &mut status,
                    conditions::READY,
                    false,
                    why::REFRESH_FAILED,
                    message,
                    now,
                );
            }
        }
        set_condition(
            &mut status,
            conditions::REFRESHING,
            false,
            why::IDLE,
            "No refresh in progress".into(),
            now,
        );
        status.operation = Some(op.clone());
        self.write_status(&status).await?;
        crate::failpoint::hit(crate::failpoint::AFTER_OUTCOME_RECORDED);
        self.record(&op).await
    }

    /// Shows a finished operation on the Machine (idempotent: also used after a crash).
    async fn record(&self, op: &Operation) -> Result<Action, Error> {
        let succeeded = op.phase == Phase::Succeeded;
        let current_trigger = self.view.annotation(REFRESH_CERTIFICATES);
        let remove = op
            .trigger
            .as_deref()
            .filter(|t| Some(*t) == current_trigger);
        self.patch_machine(&MachineChanges {
            status: Some(if succeeded {
                RefreshStatus::Done
            } else {
                RefreshStatus::Failed
            }),
            expiry: if succeeded {
                op.new_expiry.as_ref()
            } else {
                None
            },
            remove_trigger: remove,
        })
        .await?;
        if succeeded {
            let expiry = op
                .new_expiry
                .as_ref()
                .map(super::patches::rfc3339)
                .unwrap_or_default();
            self.event(
                EventType::Normal,
                events::REFRESH_DONE,
                format!("Certificates refreshed; they now expire at {expiry}"),
            )
            .await;
            if let Some(note) = &op.note {
                self.event(EventType::Warning, events::LIFETIME_MISMATCH, note.clone())
                    .await;
            }
            info!(expiry, "Certificates refreshed");
        } else {
            let error = op.error.clone().unwrap_or_default();
            self.event(EventType::Warning, events::REFRESH_FAILED, error.clone())
                .await;
            warn!(error, "Certificate refresh failed");
        }
        Ok(Action::requeue(self.ctx.config.resync))
    }

    /// Reads the node's expiry through `certificates-expiry`; quiet while the node is starting.
    async fn read_expiry(
        &self,
        mut status: MachineCertificatesStatus,
        cluster: ClusterView,
    ) -> Result<Action, Error> {
        let now = Self::now();
        let role = self.role();
        let mut node = match self.prepare(&status, role, &cluster).await {
            Ok(node) => node,
            Err(Failure::Workload(err)) if err.is_retryable() => {
                return Ok(Action::requeue(Duration::from_secs(15)));
            }
            Err(failure) => {
                let message = failure.message(&self.view);
                self.set_ready(&mut status, false, why::EXPIRY_UNKNOWN, message, now)
                    .await?;
                return Ok(Action::requeue(Duration::from_secs(300)));
            }
        };
        let timeout = self.ctx.config.timeouts.call;
        match node
            .session
            .call::<_, CertificatesExpiryResponse>(
                path::CERTIFICATES_EXPIRY,
                &crate::k8sd::wire::CertificatesExpiryRequest {},
                timeout,
            )
            .await
        {
            Ok(answer) => {
                let Ok(expiry) = answer.expiry_date.parse::<Timestamp>() else {
                    let message = format!(
                        "k8sd on node {} answered an unreadable expiry date {:?}",
                        node.session.target().node,
                        answer.expiry_date
                    );
                    self.set_ready(
                        &mut status,
                        false,
                        why::EXPIRY_UNKNOWN,
                        message.clone(),
                        now,
                    )
                    .await?;
                    self.event(EventType::Warning, events::EXPIRY_UNKNOWN, message)
                        .await;
                    return Ok(Action::requeue(Duration::from_secs(300)));
                };
                status.expiry = Some(Time(expiry));
                status.role = Some(role);
                status.node_name = self.view.node_name.clone();
                status.k8sd_fingerprint = node.session.fingerprint().map(|f| f.to_string());
                set_condition(
                    &mut status,
                    conditions::READY,
                    true,
                    why::EXPIRY_KNOWN,
                    format!(
                        "Certificates expire at {}",
                        super::patches::rfc3339(&Time(expiry))
                    ),
                    now,
                );
                self.write_status(&status).await?;
                self.patch_machine(&MachineChanges {
                    expiry: status.expiry.as_ref(),
                    ..Default::default()
                })
                .await?;
                Ok(Action::requeue(self.ctx.config.resync))
            }
            // The node is still starting (503) or unreachable for now: try again soon, quietly.
            Err(err) if err.is_retryable() => Ok(Action::requeue(Duration::from_secs(15))),
            Err(err) => {
                let message = Failure::k8sd("certificates-expiry", err).message(&self.view);
                if status.conditions.iter().all(|c| c.message != message) {
                    self.event(EventType::Warning, events::EXPIRY_UNKNOWN, message.clone())
                        .await;
                }
                self.set_ready(&mut status, false, why::EXPIRY_UNKNOWN, message, now)
                    .await?;
                Ok(Action::requeue(Duration::from_secs(300)))
            }
        }
    }
}

/// Why an operation failed, before it becomes a user-facing message.
enum Failure {
    K8sd {
        step: &'static str,
        error: K8sdError,
    },
    Workload(WorkloadError),
    Api(Error),
    Message(String),
    /// Something the refresh needs does not answer for now (waited for, then a failure).
    Unavailable(String),
    /// The process is stopping and nothing was sent to the node for this attempt: the next
    /// leader takes the request up from its record.
    Stopping,
    /// Another controller instance (a `--watch-filter` shard) recorded its attempt first and
    /// carries the refresh out; nothing was sent to the node by this one.
    Superseded,
}

impl Failure {
    fn k8sd(step: &'static str, error: K8sdError) -> Self {
        Self::K8sd { step, error }
    }

    /// Whether waiting may help: the node or its cluster does not answer for now, as during a
    /// restart (refused connections, a tunnel that cannot be opened, 503 while k8sd starts). A
    /// node that accepts and then never answers (a timeout) is not restarting: that fails.
    fn unavailable(&self) -> bool {
        match self {
            Self::K8sd { error, .. } => {
                error.is_retryable() && !matches!(error, K8sdError::Timeout { .. })
            }
            Self::Workload(err) => err.is_retryable(),
            Self::Unavailable(_) => true,
            Self::Api(_) | Self::Message(_) | Self::Stopping | Self::Superseded => false,
        }
    }

    /// What went wrong, without advice.
    fn cause(&self) -> String {
        match self {
            Self::K8sd { step, error } => format!("{step}: {error}"),
            Self::Workload(err) => err.to_string(),
            Self::Api(err) => err.to_string(),
            Self::Message(text) | Self::Unavailable(text) => text.clone(),
            Self::Stopping => "stopping".into(),
            Self::Superseded => "superseded".into(),
        }
    }

    /// What failed and what to do about it. Never contains a token.
    fn message(&self, machine: &MachineView) -> String {
        let retry = "then annotate the Machine again to retry";
        let cluster = machine.cluster.as_deref().unwrap_or("");
        match self {
            Self::K8sd { step, error } => {
                let hint = match error {
                    K8sdError::Api { status: 401, .. } => format!(
                        "check that Secret {}/{} holds this node's token ({}), ",
                        machine.namespace,
                        ck8s_certs_api::k8sd::token_secret_name(cluster),
                        ck8s_certs_api::k8sd::node_token_key(&machine.name)
                    ),
                    K8sdError::Api { status: 400 | 404 | 501, .. } => "this k8sd may not support certificate refreshes through Cluster API; upgrade the node's k8s snap, ".into(),
                    K8sdError::PinMismatch { .. } => format!(
                        "to trust the node's new certificate run `kubectl patch machinecertificates -n {} {} --subresource=status --type=json -p '[{{\"op\":\"remove\",\"path\":\"/status/k8sdFingerprint\"}}]'`, ",
                        machine.namespace, machine.name
                    ),
                    e if e.is_retryable() => "check that the node is up and its k8sd-proxy pod is Running, ".into(),
                    _ => String::new(),
                };
                format!("Refreshing failed at {step}: {error}; {hint}{retry}")
            }
            Self::Workload(err) => {
                format!("Refreshing failed before contacting the node: {err}; {retry}")
            }
            Self::Api(err) => format!("Refreshing failed: {err}"),
            Self::Message(text) | Self::Unavailable(text) => format!("{text}; {retry}"),
            Self::Stopping => "The controller stopped before the refresh started".into(),
            Self::Superseded => "Another controller instance carries the refresh out".into(),
        }
    }
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max.saturating_sub(1);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// How long a refresh still waits for what it needs, with a delay growing from 1 s to 8 s.
struct Wait {
    deadline: tokio::time::Instant,
    delay: Duration,
    /// Whether the wait was shown in the operation record already.
    shown: bool,
}

impl Wait {
    fn new(timeout: Duration) -> Self {
        Self {
            deadline: tokio::time::Instant::now() + timeout,
            delay: Duration::from_secs(1),
            shown: false,
        }
    }

    /// The next pause, or `None` once the deadline has passed.
    fn next(&mut self) -> Option<Duration> {
        let left = self
            .deadline
            .checked_duration_since(tokio::time::Instant::now())?;
        if left.is_zero() {
            return None;
        }
        let delay = self.delay.min(left);
        self.delay = (self.delay * 2).min(Duration::from_secs(8));
        Some(delay)
    }
}

/// Runs `f` when dropped (on every exit path, including errors).
fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

/// A role as a metric label value.
fn role_label(role: Role) -> &'static str {
    match role {
        Role::ControlPlane => "control-plane",
        Role::Worker => "worker",
    }
}
