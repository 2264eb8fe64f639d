//! Carrying out an operation: under the cluster's lock, the node (and a control plane to approve
//! a worker's CSRs) reached, waiting while they restart; then the [`attempts`] on the node, with
//! the request's status as their journal; then the outcome.

use super::*;

impl Reconciler<'_> {
    /// Runs (or continues) `op` under the cluster's lock and records the outcome. `opened`: its
    /// request exists.
    pub(super) async fn execute(
        &self,
        mut status: MachineCertificatesStatus,
        mut op: Operation,
        opened: bool,
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
        let result = self
            .refresh(&mut status, &mut op, opened, role, &cluster)
            .await;
        let mut node = match result {
            Ok(node) => node,
            Err(Failure::Stopping) => return Ok(Action::await_change()),
            // Another instance recorded its own attempt first: it carries the refresh out.
            Err(Failure::Superseded) => {
                return Ok(Action::requeue(crate::controllers::shard::RECHECK));
            }
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
        self.live_only().map_err(Failure::Api)?;
        if !*opened {
            self.open_record(op).await.map_err(Failure::Api)?;
            *opened = true;
        }
        if self.ctx.shard.ours().is_none() {
            return self.write_record(op).await.map_err(Failure::Api);
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
            Err(err) => Err(Failure::Api(err.into())),
        }
    }

    /// Everything up to the outcome of `run`. Progress is written to `status` as it happens
    /// (see [`attempts`] for the rules of the attempts on the node).
    pub(super) async fn refresh(
        &self,
        status: &mut MachineCertificatesStatus,
        op: &mut Operation,
        opened: bool,
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
        let mut journal = RequestJournal {
            reconciler: self,
            status,
            opened,
            wait,
        };
        let extra_sans = (role == Role::ControlPlane).then(|| node.sans.clone());
        let retry = &self.ctx.config.retry;
        attempts::carry_out(
            &mut node.session,
            approver.as_mut(),
            op,
            extra_sans,
            retry,
            &mut journal,
        )
        .await?;
        Ok(node)
    }

    /// Waits while something the refresh needs does not answer (a node or control plane
    /// restarting after a refresh), up to `--refresh-wait-timeout`; the first wait is shown in
    /// the Refreshing condition (and in the operation's note, written with its next record).
    pub(super) async fn pause(
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
}

/// The attempts' journal is the request's status: the seed is recorded there before `run`.
/// The pinned k8sd certificate goes in the Machine's status with the outcome, and waits are
/// shown in its Refreshing condition.
struct RequestJournal<'r, 'a> {
    reconciler: &'r Reconciler<'a>,
    status: &'r mut MachineCertificatesStatus,
    /// Whether the request exists.
    opened: bool,
    wait: Wait,
}

impl attempts::Journal for RequestJournal<'_, '_> {
    async fn record(
        &mut self,
        op: &mut Operation,
        fingerprint: Option<String>,
    ) -> Result<(), Failure> {
        self.status.k8sd_fingerprint = fingerprint;
        self.reconciler.record_attempt(op, &mut self.opened).await?;
        crate::failpoint::hit(crate::failpoint::AFTER_SEED_RECORDED);
        Ok(())
    }

    async fn wait(&mut self, op: &mut Operation, failure: &Failure) -> Result<(), Failure> {
        self.reconciler
            .pause(&mut self.wait, self.status, op, "the node's k8sd", failure)
            .await
    }

    fn stopping(&self) -> bool {
        self.reconciler.ctx.stop.is_cancelled()
    }

    fn now(&self) -> Timestamp {
        Reconciler::now()
    }
}
