//! Handing a refresh to the [`executor`]: an [`Accepted`] refresh with its seams (the node's
//! k8sd through the [`KubeConnector`], the request as [`RequestJournal`]), and what
//! [`Finished`] says recorded.

use ck8s_certs_api::machine_certificates::{MachineCertificatesStatus, Operation, Role};
use kube::runtime::controller::Action;

use super::Error;
use super::act::Act;
use super::connector::{KubeConnector, control_planes_pending, pin_of};
use super::journal::RequestJournal;
use crate::controllers::executor::{self, Accepted, Finished};

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
        };
        status.role = Some(role);
        status.node_name = view.node_name.clone();
        let connector = KubeConnector {
            reach: &ctx.reach,
            machine: view,
            cluster: &self.cluster,
            pin,
            role,
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
