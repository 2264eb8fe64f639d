//! Carrying one [`Step`] out on what a reconcile read: the one way in is [`Act::run`]. A Machine
//! at rest shows what [`settle`] says; a refresh is taken up ([`requests`](super::requests)),
//! handed to the executor ([`Act::execute`]: an [`Accepted`] refresh with its seams, the node's
//! k8sd through the [`KubeConnector`], the request as [`RequestJournal`]) and its outcome recorded
//! ([`outcome`](super::outcome)).

use crate::events::EventType;
use ck8s_certs_api::annotations::{CERTIFICATES_EXPIRY, FORCE_REFRESH, RefreshStatus};
use ck8s_certs_api::machine::{ClusterView, Machine, MachineView};
use ck8s_certs_api::machine_certificates::{MachineCertificatesStatus, Operation, Origin, Role};
use ck8s_certs_api::reasons::events;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::controller::Action;
use tracing::{info, warn};

use super::connector::{KubeConnector, control_planes_pending, pin_of};
use super::gates::Gate;
use super::gates::workload::ControlPlane;
use super::journal::{RequestJournal, Requests};
use super::next::Certificates;
use super::observe::{Observed, role, waiter};
use super::report::{Reporter, Seen};
use super::rest::{After, MachineMark, Renewals, Settled, clear_refusal, settle};
use super::step::Step;
use super::verdict::{self, VerdictMetric};
use super::{Context, Error, MANAGER};
use crate::controllers::executor::{self, Accepted, Finished};
use crate::controllers::patches::MachineChanges;
use crate::controllers::shard::{self, Acting};

/// The action a rest amounts to.
pub(super) fn action(after: After) -> Action {
    match after {
        After::Change => Action::await_change(),
        After::Requeue(after) => Action::requeue(after),
    }
}

/// One step carried out on one Machine.
pub(super) struct Act<'a> {
    pub ctx: &'a Context,
    /// The Machine as read (its resourceVersion guards the take-up).
    pub machine: &'a Machine,
    /// The Machine as last read or written.
    pub view: &'a MachineView,
    pub cluster: ClusterView,
    pub report: Reporter<'a>,
    pub requests: Requests<'a>,
}

impl<'a> Act<'a> {
    /// Carries `step` out on what `observed` holds; a step of rest shows `planned` when the
    /// caches' pass planned it, else what [`settle`] says now.
    pub async fn run(
        ctx: &Context,
        observed: &Observed,
        step: Step,
        planned: Option<Settled>,
    ) -> Result<Action, Error> {
        tracing::Span::current().record("step", tracing::field::debug(&step));
        let Certificates::Read {
            status,
            generation,
            digest: _,
        } = &observed.certificates
        else {
            return Ok(Action::await_change());
        };
        // Sharding: an operation another live instance carries out is left to it (no API call
        // for any other step).
        let acting = match &step {
            Step::Resume(op) => Some(Acting::Resume(op)),
            Step::Record(op) => Some(Acting::Record(op)),
            _ => None,
        };
        if let Some(acting) = acting {
            let view = &observed.view;
            let gate = shard::gate(&ctx.shard, acting, &view.namespace, &view.name, MANAGER);
            if let Some(retry) = gate.await? {
                return Ok(Action::requeue(retry));
            }
        }
        if !matches!(
            step,
            Step::Continue(_) | Step::Resume(_) | Step::Start { .. }
        ) {
            // What waited (if anything) is over: withdrawn, paused, recorded.
            ctx.executor.forget(&waiter(&observed.view));
        }
        let seen = Seen::default();
        seen.set(status.as_ref());
        let reference = observed.machine.object_ref(&ctx.capi());
        let act = Act::new(
            ctx,
            &observed.machine,
            &observed.view,
            observed.cluster.clone().unwrap_or_default(),
            &reference,
            *generation,
            &seen,
        );
        let status = status.clone().unwrap_or_default();
        match planned {
            Some(settled) => act.show_settled(status, settled).await,
            None => act.step(status, observed.request.as_ref(), step).await,
        }
    }

    pub fn new(
        ctx: &'a Context,
        machine: &'a Machine,
        view: &'a MachineView,
        cluster: ClusterView,
        reference: &'a ObjectReference,
        generation: Option<i64>,
        seen: &'a Seen,
    ) -> Self {
        Self {
            ctx,
            machine,
            view,
            cluster,
            report: Reporter {
                client: ctx.client(),
                capi: ctx.capi(),
                recorder: &ctx.recorder,
                machine: view,
                reference,
                generation,
                seen,
            },
            requests: Requests {
                client: ctx.client(),
                capi: ctx.capi(),
                machine: view,
                role: role(view),
            },
        }
    }

    /// `request`: the operation of the request the Machine names as in flight.
    async fn step(
        self,
        mut status: MachineCertificatesStatus,
        request: Option<&Operation>,
        step: Step,
    ) -> Result<Action, Error> {
        let now = self.ctx.clock.now();
        if matches!(
            step,
            Step::Ignore
                | Step::ClusterMissing
                | Step::Paused
                | Step::WaitForNode
                | Step::Reapplied { .. }
                | Step::Idle
        ) {
            return self.rest(status, &step).await;
        }
        // The trigger its owner kept applying is gone (or changed): the refusal is over.
        let before = status.clone();
        clear_refusal(&mut status, now);
        self.report.update_status(&before, &status).await?;
        match step {
            Step::Withdrawn => {
                self.report
                    .patch_machine(&MachineChanges {
                        status: Some(RefreshStatus::Failed),
                        ..Default::default()
                    })
                    .await?;
                self.report
                    .event(
                        EventType::Warning,
                        events::REFRESH_FAILED,
                        "The refresh request was withdrawn before it started".into(),
                    )
                    .await;
                Ok(Action::await_change())
            }
            Step::Record(op) => {
                let journaled = request == Some(&op);
                self.record(status, &op, journaled).await
            }
            Step::Start { trigger } => self.start(status, trigger).await,
            Step::Continue(op) => {
                let role = role(self.view);
                self.execute(status, op, false, role).await
            }
            Step::Resume(op) => {
                let opened = request == Some(&op);
                let role = status.role.unwrap_or(role(self.view));
                info!(seed = ?op.seed, attempts = op.run_attempts, "Resuming an interrupted refresh");
                self.execute(status, op, opened, role).await
            }
            Step::SyncExpiry => {
                let expiry = status.expiry.clone();
                self.report
                    .patch_machine(&MachineChanges {
                        expiry: expiry.as_ref(),
                        ..Default::default()
                    })
                    .await?;
                // Then as at rest: the verdict.
                self.rest(status, &Step::Idle).await
            }
            Step::ReadExpiry => self.read_expiry(status).await,
            // At rest: above.
            Step::Ignore
            | Step::ClusterMissing
            | Step::Paused
            | Step::WaitForNode
            | Step::Reapplied { .. }
            | Step::Idle => Ok(Action::await_change()),
        }
    }

    /// A Machine at rest for `step`: shows what [`settle`] says, under its governing policy.
    async fn rest(self, status: MachineCertificatesStatus, step: &Step) -> Result<Action, Error> {
        let governing = crate::controllers::governing_policy::governing(
            &self.ctx.stores.policies,
            &self.ctx.stores.policy_readings,
            &self.view.namespace,
            Some(&self.cluster.labels),
            &self.view.labels,
        );
        let now = self.ctx.clock.now();
        let gate = || {
            let labels = Some(&self.cluster.labels);
            self.ctx.renewal_gate(self.view, labels, &governing, now)
        };
        let renewals = Renewals {
            governing: &governing,
            settings: self.ctx.config().renewal,
            resync: self.ctx.config().resync,
            gate: &gate,
        };
        match settle(
            step,
            self.view,
            Some(&self.cluster),
            &status,
            &renewals,
            now,
        ) {
            Some(settled) => self.show_settled(status, settled).await,
            None => Ok(Action::requeue(self.ctx.config().resync)),
        }
    }

    /// Shows what `settled` says (each write only when it changes something), then renews when
    /// the verdict says so.
    async fn show_settled(
        self,
        current: MachineCertificatesStatus,
        settled: Settled,
    ) -> Result<Action, Error> {
        let Settled {
            status,
            machine,
            event,
            metric,
            next,
            after,
        } = settled;
        if let Some(mark) = machine {
            let (failed, release_move) = match mark {
                MachineMark::Refused { release_move } => (true, release_move),
                MachineMark::ReleaseMove => (false, true),
            };
            self.report
                .patch_machine(&MachineChanges {
                    status: failed.then_some(RefreshStatus::Failed),
                    release_move,
                    ..Default::default()
                })
                .await?;
        }
        let replacement = match next {
            Some(verdict::Then::Renew(renewal)) => {
                // Right before it starts: what the workload cluster shows. A closed gate is
                // remembered, so the verdict shown again now is the held one.
                if renewal.gated && workload_gate(self.ctx, self.view).await.is_some() {
                    return Box::pin(self.rest(current, &Step::Idle)).await;
                }
                return self.start_automatic(status, renewal).await;
            }
            Some(verdict::Then::Replace(replacement)) => Some(replacement),
            None => None,
        };
        self.report.update_status(&current, &status).await?;
        let metrics = &self.ctx.metrics;
        match metric {
            Some(VerdictMetric::Deferred(reason)) => {
                let labels = crate::metrics::reason_label(&reason);
                metrics.renewal_deferred.get_or_create(&labels).inc();
            }
            Some(VerdictMetric::Invalid(reason)) => {
                let labels = crate::metrics::reason_label(&reason);
                metrics.policy_invalid.get_or_create(&labels).inc();
            }
            None => {}
        }
        if let Some((type_, reason, message)) = event {
            if reason == events::REFRESH_REFUSED {
                warn!("Refused a refresh trigger its owner applies again");
            }
            self.report.event(type_, reason, message).await;
        }
        if let Some(replacement) = replacement {
            return self.replace(replacement).await;
        }
        Ok(action(after))
    }
}

impl Act<'_> {
    /// Runs (or continues) `op` as far as it can go now and records the outcome. `opened`: its
    /// request exists.
    pub(super) async fn execute(
        self,
        mut status: MachineCertificatesStatus,
        op: Operation,
        opened: bool,
        role: Role,
    ) -> Result<Action, Error> {
        let ttl = match executor::ttl_of(&op) {
            Ok(ttl) => ttl,
            Err(failure) => return self.finish(status, op, Err(failure)).await,
        };
        let view = self.view;
        let pin = match pin_of(
            status.k8sd_fingerprint.as_deref(),
            &view.namespace,
            &view.name,
        ) {
            Ok(pin) => pin,
            Err(failure) => return self.finish(status, op, Err(failure)).await,
        };
        let ctx = self.ctx;
        let mut op = op;
        // A manual refresh not yet begun waits while a gate of its cluster is closed, unless
        // forced (automatic renewals were held by their verdict already).
        let gate = match op.origin != Origin::Policy && op.seed.is_none() {
            true => match manual_gate(ctx, view, &status).await {
                ManualGate::Open => None,
                ManualGate::Held(gate) => Some(gate),
                ManualGate::Forced(note) => {
                    if !op.note.as_deref().is_some_and(|n| n.contains(&note)) {
                        op.note = Some(match op.note.take() {
                            Some(earlier) => format!("{earlier}; {note}"),
                            None => note,
                        });
                    }
                    None
                }
            },
            false => None,
        };
        let accepted = Accepted {
            namespace: view.namespace.clone(),
            machine: view.name.clone(),
            cluster: view.cluster.clone().unwrap_or_default(),
            node: view.node_name.clone().unwrap_or_default(),
            role,
            ttl,
            request: self.requests.name(&op),
            control_planes_pending: role == Role::Worker
                && op.seed.is_none()
                && control_planes_pending(&ctx.stores.machines, view),
            op,
            gate,
        };
        status.role = Some(role);
        status.node_name = view.node_name.clone();
        let connector = KubeConnector {
            reach: &ctx.reach,
            machine: view,
            cluster: &self.cluster,
            pin,
            role,
            now: ctx.clock.now(),
        };
        ctx.metrics.in_progress.inc();
        let finished = {
            let _in_progress = scopeguard(|| {
                ctx.metrics.in_progress.dec();
            });
            let mut journal = RequestJournal {
                requests: self.requests,
                reporter: self.report,
                shard: &ctx.shard,
                metrics: &ctx.metrics,
                clock: ctx.clock.as_ref(),
                status: &mut status,
                opened,
            };
            ctx.executor
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
            Finished::Wait { after, .. } => Ok(Action::requeue(after)),
            // Stopping: the next leader takes this up from the request.
            Finished::Stopping => Ok(Action::await_change()),
            // Another instance recorded its own attempt first: it carries the refresh out.
            Finished::Superseded => Ok(Action::requeue(crate::controllers::shard::RECHECK)),
        }
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

/// The gate `view`'s workload cluster shows closed now (a fresh look's, else a new look's).
async fn workload_gate(ctx: &Context, view: &MachineView) -> Option<Gate> {
    let cluster = view.cluster.as_deref()?;
    let now = ctx.clock.now();
    // A fresh look answers without the client, whose making reads the kubeconfig Secret.
    if let Some(gate) = ctx.workload_gates.fresh(&view.namespace, cluster, now) {
        return gate;
    }
    let client = ctx.reach.workload.get(&view.namespace, cluster).await.ok();
    let control_planes: Vec<ControlPlane> = ctx
        .stores
        .machines
        .state()
        .iter()
        .map(|m| MachineView::of(m))
        .filter(|m| {
            m.namespace == view.namespace
                && m.cluster.as_deref() == Some(cluster)
                && m.control_plane
                && !m.deleting
                && m.name != view.name
        })
        .map(|m| ControlPlane {
            machine: m.name,
            node: m.node_name,
        })
        .collect();
    ctx.workload_gates
        .look(&view.namespace, cluster, client, &control_planes, now)
        .await
}

/// What the pre-flight gates say of a manual refresh.
enum ManualGate {
    Open,
    /// Held by this gate (said whole).
    Held(String),
    /// Forced past this gate: the operation's note.
    Forced(String),
}

/// The pre-flight gates for a manual refresh of `view` (its record `status`). Recovery is never
/// held: not a Machine whose certificates expire within a day (the default fail-safe margin) or
/// have expired, nor any Machine of a cluster one of whose Machines records expired
/// certificates (its API, its Nodes are then expected to fail the gates).
async fn manual_gate(
    ctx: &Context,
    view: &MachineView,
    status: &MachineCertificatesStatus,
) -> ManualGate {
    let now = ctx.clock.now();
    let soon = now + jiff::SignedDuration::from_hours(24);
    if status.expiry.as_ref().is_some_and(|e| e.0 <= soon) || cluster_expired(ctx, view, now) {
        return ManualGate::Open;
    }
    let gate = match ctx.gate(view, now) {
        Some(gate) => Some(gate),
        None => workload_gate(ctx, view).await,
    };
    let Some(gate) = gate else {
        return ManualGate::Open;
    };
    let gate = format!("{gate} (gate {})", gate.reason());
    match view.annotation(FORCE_REFRESH) == Some("true") {
        true => ManualGate::Forced(format!(
            "forced past a closed pre-flight gate ({FORCE_REFRESH}): {gate}"
        )),
        false => ManualGate::Held(gate),
    }
}

/// Whether a Machine of `view`'s cluster records certificates that expired by `now`.
fn cluster_expired(ctx: &Context, view: &MachineView, now: jiff::Timestamp) -> bool {
    let Some(cluster) = view.cluster.as_deref() else {
        return false;
    };
    ctx.stores.machines.state().iter().any(|m| {
        m.metadata.namespace.as_deref() == Some(view.namespace.as_str())
            && m.cluster() == Some(cluster)
            && m.annotations
                .get(CERTIFICATES_EXPIRY)
                .and_then(|at| at.parse::<jiff::Timestamp>().ok())
                .is_some_and(|at| at <= now)
    })
}
