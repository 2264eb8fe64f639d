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
//! A reconcile reads what it needs once ([`observe`]), from the caches first, and asks [`next`]
//! (pure) what to do: rest, read more, or act ([`act`]) on one [`step`]. The executor carries a
//! refresh out through three seams of their own: the [`connector`] to the node, the request's
//! [`journal`] and the [`report`] of what the Machine shows.
//!
//! After a crash the operation in the request the Machine names decides: a finished one is only
//! recorded (MachineCertificates, Machine); a Running one had a `run` whose outcome is unknown,
//! so it continues with a new `plan` and a new seed (released k8sd cannot repeat a worker seed,
//! and after a lost answer it does not serve what it wrote), at most [`MAX_RUN_SENDS`] `run`s per
//! operation in total. An expiry is recorded only from a `run` answer.

use std::sync::Arc;
use std::time::Duration;

use crate::events::Recorder;
use ck8s_certs_api::machine::{CapiVersion, Machine, MachineView};
use kube::Client;
use kube::runtime::controller::Action;
use tracing::{Instrument, warn};

use crate::controllers::executor::ApiError;
use crate::k8sd::K8sdError;
use crate::refresh::session::Timeouts;
use crate::workload::WorkloadError;
use crate::workload::endpoint::Transport;

mod act;
mod conclusion;
pub mod connector;
mod expiry;
pub mod gates;
mod journal;
pub mod next;
mod observe;
mod outcome;
mod replace;
mod report;
mod requests;
pub mod rest;
pub mod start;
pub mod step;
#[cfg(test)]
pub(crate) mod testing;
pub mod verdict;

pub use crate::controllers::executor::MAX_RUN_SENDS;
pub use connector::Reach;
pub use outcome::KeptOutcomes;
pub use start::start;

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
    /// The lifetimes a manual refresh may ask for (`--min-ttl`, `--max-ttl`).
    pub band: crate::refresh::band::TtlBand,
    /// The admission policy a renewal policy that replaces Machines must be older than
    /// (`--renewal-admission-policy`).
    pub renewal_admission_policy: Option<String>,
}

/// Everything the reconciler touches.
pub struct Context {
    /// The management cluster, the workload clusters' clients and the settings a connection
    /// to a node needs (`reach.config` is the reconciler's).
    pub reach: Reach,
    /// The watch caches (Machines, Clusters, MachineCertificates, policies).
    pub stores: crate::controllers::stores::Stores,
    pub recorder: Recorder,
    /// Carries refreshes out on their nodes (admission per cluster, waits, attempts).
    pub executor: crate::controllers::executor::Executor,
    /// Outcomes of `run`s whose write to their request failed, written before anything else.
    pub outcomes: KeptOutcomes,
    /// Why Machines were not replaced, as already said.
    pub replace_refusals: replace::Refusals,
    /// The last look at each workload cluster's gates.
    pub workload_gates: gates::workload::Looks,
    /// The last look at each policy's canaries.
    pub canary_gates: gates::canaries::Looks,
    /// Our identity among the --watch-filter shards, and what we saw of the others' Leases.
    pub shard: crate::controllers::shard::Shard,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The time decisions are taken at.
    pub clock: crate::clock::SharedClock,
    /// Cancelled when the process is asked to stop: operations not yet started on a node are
    /// left for the next leader; those already started finish.
    pub stop: tokio_util::sync::CancellationToken,
}

impl Context {
    fn client(&self) -> &Client {
        &self.reach.client
    }

    fn capi(&self) -> CapiVersion {
        self.reach.capi
    }

    fn config(&self) -> &Config {
        &self.reach.config
    }

    /// The first closed gate of `machine`'s cluster: the caches' first, then the one the
    /// workload cluster showed at a look still fresh.
    fn gate(&self, machine: &MachineView, now: jiff::Timestamp) -> Option<gates::Gate> {
        let cluster = machine.cluster.as_deref()?;
        gates::of_cluster(&self.stores, &machine.namespace, cluster)
            .or_else(|| self.workload_gates.closed(&machine.namespace, cluster, now))
    }

    /// What holds an automatic renewal of `machine` (on a Cluster labelled `cluster_labels`):
    /// a closed [`gate`](Self::gate), or else its policy's canaries, which a manual refresh
    /// never waits for.
    fn renewal_gate(
        &self,
        machine: &MachineView,
        cluster_labels: Option<&std::collections::BTreeMap<String, String>>,
        governing: &crate::controllers::governing_policy::Governing,
        now: jiff::Timestamp,
    ) -> Option<gates::Gate> {
        self.gate(machine, now).or_else(|| {
            let settings = self.config().renewal;
            let stores = &self.stores;
            (self.canary_gates).gate(stores, machine, cluster_labels, governing, settings, now)
        })
    }
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
    Shard(#[from] crate::controllers::shard::ShardError),
    /// Our own call failed while a refresh was carried out.
    #[error("Kubernetes API call failed: {0}")]
    Api(#[source] ApiError),
}

impl Error {
    pub fn category(&self) -> &'static str {
        match self {
            Self::Kube(_) => "kube",
            Self::Workload(_) => "workload",
            Self::Expiry(e) => e.category(),
            Self::Shard(_) | Self::Api(_) => "kube",
        }
    }

    /// The error a [`Failure::Api`](crate::controllers::executor::Failure::Api) carries: ours
    /// when it was ours.
    fn from_api(err: ApiError) -> Self {
        match err.downcast::<Self>() {
            Ok(ours) => *ours,
            Err(other) => match other.downcast::<kube::Error>() {
                Ok(kube) => Self::Kube(*kube),
                Err(other) => Self::Api(other),
            },
        }
    }
}

impl From<Error> for crate::controllers::executor::Failure {
    fn from(err: Error) -> Self {
        Self::Api(Box::new(err))
    }
}

/// Requeue on errors: short for API hiccups (nothing is lost: state is in the objects).
pub fn error_policy(_machine: Arc<Machine>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(error = %error, category = error.category(), "Reconcile failed");
    Action::requeue(Duration::from_secs(15))
}

/// Reads what the Machine's state needs, from the caches first, until [`next::next`] says to
/// rest or act; a Machine at rest costs no request.
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
        let mut observed = observe::Observed::cached(&ctx, machine);
        loop {
            let now = ctx.clock.now();
            match observed.next(&ctx, now) {
                next::Next::Rest(after) => return Ok(act::action(after)),
                next::Next::Read(source) => observed = observed.read(&ctx, source, None).await?,
                next::Next::Confirm(planned) => {
                    observed = observed
                        .read(&ctx, next::Source::Live, Some(*planned))
                        .await?;
                }
                next::Next::Act(step) => return act::Act::run(&ctx, &observed, step, None).await,
                next::Next::Show(step, planned) => {
                    return act::Act::run(&ctx, &observed, step, Some(*planned)).await;
                }
            }
        }
    }
    .instrument(span)
    .await
}
