//! The Machine reconciler's side of carrying a refresh out: it hands the [`executor`] an
//! [`Accepted`] refresh with its seams (the node's k8sd, the request as journal), and records
//! what [`Finished`] says.

use ck8s_certs_api::annotations::{IN_FLIGHT_REFRESH, REFRESH_CERTIFICATES, RefreshStatus};
use ck8s_certs_api::capi::{CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL};
use ck8s_certs_api::machine::ClusterView;
use ck8s_certs_api::machine_certificates::{MachineCertificatesStatus, Operation, Role};
use ck8s_certs_api::reasons::{condition_reasons as why, conditions};
use jiff::Timestamp;
use kube::Client;
use kube::runtime::controller::Action;

use super::step::{self, Step};
use super::{Error, MANAGER, Mode, Reconciler, journal};
use crate::controllers::executor::{
    self, Accepted, Connector, Failure, Finished, NodeSession, Probe, Waiter,
};
use crate::controllers::patches::set_condition;
use crate::k8sd::{Fingerprint, K8sdError};
use crate::refresh::NodeApi;
use crate::refresh::session::Session;

impl Reconciler<'_> {
    /// The Machine as the executor knows it.
    pub(super) fn waiter(&self) -> Waiter {
        Waiter {
            namespace: self.view.namespace.clone(),
            machine: self.view.name.clone(),
        }
    }

    /// Runs (or continues) `op` as far as it can go now and records the outcome. `opened`: its
    /// request exists.
    pub(super) async fn execute(
        &self,
        mut status: MachineCertificatesStatus,
        op: Operation,
        opened: bool,
        role: Role,
        cluster: ClusterView,
    ) -> Result<Action, Error> {
        let ttl = match executor::ttl_of(&op) {
            Ok(ttl) => ttl,
            Err(failure) => return self.finish(status, op, Err(failure)).await,
        };
        let pin = match super::node::pin_of(
            status.k8sd_fingerprint.as_deref(),
            &self.view.namespace,
            &self.view.name,
        ) {
            Ok(pin) => pin,
            Err(failure) => return self.finish(status, op, Err(failure)).await,
        };
        let accepted = Accepted {
            namespace: self.view.namespace.clone(),
            machine: self.view.name.clone(),
            cluster: self.view.cluster.clone().unwrap_or_default(),
            node: self.view.node_name.clone().unwrap_or_default(),
            role,
            ttl,
            request: self.request_name(&op),
            control_planes_pending: role == Role::Worker
                && op.seed.is_none()
                && self.control_planes_pending(),
            op,
        };
        status.role = Some(role);
        status.node_name = self.view.node_name.clone();
        let connector = KubeConnector {
            reconciler: self,
            cluster: &cluster,
            pin,
            role,
        };
        let metrics = &self.ctx.metrics;
        metrics.in_progress.inc();
        let finished = {
            let _in_progress = scopeguard(|| {
                metrics.in_progress.dec();
            });
            let mut journal = RequestJournal {
                reconciler: self,
                status: &mut status,
                opened,
            };
            self.ctx
                .executor
                .execute(accepted, &connector, &mut journal)
                .await
        };
        match finished {
            Finished::Ran { op, settle } => {
                let action = self.finish(status, op, Ok(())).await;
                if let Some(settle) = settle {
                    settle.spawn();
                }
                action
            }
            Finished::Failed { op, failure } => self.finish(status, op, Err(failure)).await,
            Finished::Wait { after, .. } => {
                if let Some(digest) = self.seen.get() {
                    self.ctx.executor.note_seen(&self.waiter(), digest);
                }
                Ok(Action::requeue(after))
            }
            // Stopping: the next leader takes this up from the request.
            Finished::Stopping => Ok(Action::await_change()),
            // Another instance recorded its own attempt first: it carries the refresh out.
            Finished::Superseded => Ok(Action::requeue(crate::controllers::shard::RECHECK)),
        }
    }

    /// A refresh this process parked that still could not go (its cluster busy, a control
    /// plane first): looked at again later, without reading anything. `None` when the Machine
    /// asks for something else now, or the refresh may go.
    pub(super) fn still_waiting(&self) -> Option<Action> {
        use ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS;
        let request = self.view.annotation(IN_FLIGHT_REFRESH)?;
        let waiter = self.waiter();
        let executor = &self.ctx.executor;
        if let Some(op) = executor.waiting_operation(&waiter, request) {
            let asked = self.view.annotation(REFRESH_CERTIFICATES_STATUS)
                == Some(RefreshStatus::InProgress.as_str())
                && self.view.annotation(REFRESH_CERTIFICATES) == op.trigger.as_deref();
            if !asked {
                return None;
            }
        }
        let role = self.role();
        executor
            .still_blocked(&waiter, request, role, || self.control_planes_pending())
            .then_some(Action::requeue(executor::WAITING_RECHECK))
    }

    /// A refresh this process parked before its first seed that may go now, woken with the
    /// caches showing what it left (the Machine still asking for it, the MachineCertificates'
    /// status as it last saw it): it goes on without reading anything. `None` when anything
    /// differs; the live path then reads what it needs.
    pub(super) async fn continue_parked(&self) -> Option<Result<Action, Error>> {
        let request = self.view.annotation(IN_FLIGHT_REFRESH)?;
        let (op, seen) = self.ctx.executor.waiting_seen(&self.waiter(), request)?;
        let ctx = self.ctx;
        let cached = super::super::stores::get(
            &ctx.stores.certificates,
            &self.view.namespace,
            &self.view.name,
        )?;
        if cached.digest() != seen
            || ctx
                .outcomes
                .get(&self.view.namespace, &self.view.name)
                .is_some()
        {
            return None;
        }
        let status = cached.status().ok()?;
        let cluster = super::super::stores::get_capi(
            &ctx.stores.clusters,
            ctx.capi,
            &self.view.namespace,
            self.view.cluster.as_deref()?,
        )?;
        let cluster = ClusterView::of(&cluster);
        let step =
            step::decide_waiting(&self.view, Some(&cluster), status.as_ref(), None, Some(&op));
        if !matches!(step, Step::Continue(_)) {
            return None;
        }
        self.seen.set(status.as_ref());
        // The generation its conditions were last written with: the status is the one this
        // process last read or wrote, and the spec (the cluster's name) does not change.
        let generation = status
            .as_ref()
            .and_then(|s| s.conditions.iter().find_map(|c| c.observed_generation))?;
        let live = Reconciler {
            view: self.view.clone(),
            mode: Mode::Live,
            generation: Some(generation),
            ..*self
        };
        Some(live.act(Some(cluster), status, None, step).await)
    }

    /// Whether a control plane of this Machine's cluster is being refreshed or asked to be (from
    /// the cache): its workers wait for it. Cheap fields first: this runs on every look at a
    /// waiting worker, over every cached Machine.
    pub(super) fn control_planes_pending(&self) -> bool {
        use ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS;
        let Some(cluster) = self.view.cluster.as_deref() else {
            return false;
        };
        self.ctx.stores.machines.state().iter().any(|m| {
            m.metadata.namespace.as_deref() == Some(self.view.namespace.as_str())
                && m.labels.get(CONTROL_PLANE_LABEL).is_some()
                && m.labels.get(CLUSTER_NAME_LABEL) == Some(cluster)
                && m.metadata.name.as_deref() != Some(self.view.name.as_str())
                && m.node_name.is_some()
                && m.metadata.deletion_timestamp.is_none()
                && (m.annotations.get(REFRESH_CERTIFICATES).is_some()
                    || m.annotations.get(REFRESH_CERTIFICATES_STATUS)
                        == Some(RefreshStatus::InProgress.as_str()))
        })
    }

    /// Records an attempt (its seed) in the request's status before its `run` is sent, creating
    /// the request first if it is not there yet. With a Lease, the same write names us as the
    /// operation's carrier, on the condition that the request did not change since it was read
    /// (sharding): of two instances that planned at once (`plan` changes nothing on the node),
    /// only one records and runs.
    pub(super) async fn record_attempt(
        &self,
        op: &mut Operation,
        opened: &mut bool,
    ) -> Result<(), Failure> {
        self.live_only()?;
        if !*opened {
            self.open_record(op).await?;
            *opened = true;
        }
        if self.ctx.shard.ours().is_none() {
            return Ok(self.write_record(op).await?);
        }
        let name = self.request_name(op);
        let role = self.role();
        let status = |op: &Operation| journal::record_status(&self.view.name, role, op);
        match self
            .ctx
            .shard
            .claim(&self.view.namespace, &name, op, status, MANAGER)
            .await
        {
            Ok(crate::controllers::shard::Claimed::Ours) => Ok(()),
            Ok(crate::controllers::shard::Claimed::Lost) => Err(Failure::Superseded),
            Err(err) => Err(Error::from(err).into()),
        }
    }

    /// Shows in the Refreshing condition that the refresh runs (with its request and seed) or
    /// waits (with what for); written only when it changes.
    async fn show_refreshing(
        &self,
        status: &mut MachineCertificatesStatus,
        message: String,
    ) -> Result<(), Error> {
        let before = status.clone();
        set_condition(
            status,
            conditions::REFRESHING,
            true,
            why::REFRESH_IN_PROGRESS,
            message,
            self.now(),
        );
        if *status != before {
            self.write_status(status).await?;
        }
        Ok(())
    }
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        Self::Api(Box::new(err))
    }
}

/// The request's status is the journal: the seed is recorded there before `run`. The
/// MachineCertificates shows the refresh in its Refreshing condition (naming the request and
/// seed), written in the same step with the pinned k8sd certificate of a node met for the first
/// time.
struct RequestJournal<'r, 'a> {
    reconciler: &'r Reconciler<'a>,
    status: &'r mut MachineCertificatesStatus,
    /// Whether the request exists.
    opened: bool,
}

impl executor::Journal for RequestJournal<'_, '_> {
    async fn record(
        &mut self,
        op: &mut Operation,
        fingerprint: Option<String>,
    ) -> Result<(), Failure> {
        self.status.k8sd_fingerprint = fingerprint;
        self.reconciler.record_attempt(op, &mut self.opened).await?;
        crate::failpoint::hit(crate::failpoint::AFTER_SEED_RECORDED);
        if op.run_attempts == 1 {
            self.reconciler
                .ctx
                .metrics
                .renewals_started
                .get_or_create(&crate::metrics::origin(op.origin))
                .inc();
        }
        let request = self.reconciler.request_name(op);
        let seed = op.seed.unwrap_or_default();
        let message = format!(
            "CertificateRefresh {request}: refreshing with seed {seed} (run {} of at most {})",
            op.run_attempts,
            executor::MAX_RUN_SENDS
        );
        Ok(self
            .reconciler
            .show_refreshing(self.status, message)
            .await?)
    }

    async fn waiting(&mut self, op: &Operation, note: &str) -> Result<(), Failure> {
        let request = self.reconciler.request_name(op);
        let message = format!("CertificateRefresh {request}: {note}");
        Ok(self
            .reconciler
            .show_refreshing(self.status, message)
            .await?)
    }

    fn now(&self) -> Timestamp {
        self.reconciler.now()
    }
}

/// The node's k8sd through the workload cluster (see [`node`](super::node)).
struct KubeConnector<'r, 'a> {
    reconciler: &'r Reconciler<'a>,
    cluster: &'r ClusterView,
    pin: Option<Fingerprint>,
    role: Role,
}

impl Connector for KubeConnector<'_, '_> {
    type Node = NodeLink;
    type Approver = Session;

    async fn node(&self) -> Result<NodeSession<NodeLink>, Failure> {
        let node = self
            .reconciler
            .prepare(self.pin, self.role, self.cluster)
            .await?;
        Ok(NodeSession {
            node: NodeLink {
                session: node.session,
                _workload: node.workload,
            },
            extra_sans: node.sans,
        })
    }

    async fn approver(&self) -> Result<Session, Failure> {
        let cluster = self.reconciler.view.cluster.clone().unwrap_or_default();
        self.reconciler.approver(&cluster).await
    }
}

/// A node's session, with the workload client its tunnels go through kept alive.
pub(super) struct NodeLink {
    session: Session,
    _workload: Client,
}

impl NodeApi for NodeLink {
    async fn plan(&mut self) -> Result<crate::k8sd::wire::PlanResponse, K8sdError> {
        self.session.plan().await
    }

    async fn run(
        &mut self,
        request: &crate::k8sd::wire::RunRequest,
    ) -> Result<crate::k8sd::wire::RunResponse, K8sdError> {
        self.session.run(request).await
    }

    fn fingerprint(&self) -> Option<String> {
        NodeApi::fingerprint(&self.session)
    }
}

impl Probe for NodeLink {
    async fn probe(&mut self) -> Result<(), K8sdError> {
        self.session.probe().await
    }
}

/// Runs `f` when dropped (on every exit path, a cancelled reconcile included).
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
