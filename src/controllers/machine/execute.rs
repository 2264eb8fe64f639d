//! Carrying out an operation: under the cluster's lock, `plan`, the seed recorded before `run`,
//! `run` (with `approve` on a control plane for a worker), the outcome.

use super::*;

impl Reconciler<'_> {
    /// Runs (or continues) `op` under the cluster's lock and records the outcome.
    pub(super) async fn execute(
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

    /// Records an attempt (its seed) before its `run` is sent. With a Lease, the same write names
    /// us as the operation's carrier, on the condition that the record did not change since it
    /// was read (sharding): of two instances that planned at once (`plan` changes nothing on the
    /// node), only one records and runs.
    pub(super) async fn record_attempt(
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
            Ok(crate::controllers::shard::Claimed::Ours) => Ok(()),
            Ok(crate::controllers::shard::Claimed::Lost) => Err(Failure::Superseded),
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
    pub(super) async fn refresh(
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
            if op.run_attempts == 1 {
                // On the node from now on: its record exists while it runs, so `clusterctl move`
                // (which finds objects before it waits for our block-move) takes it along. Not
                // before: an operation that never got here starts over under another name.
                // Housekeeping: without it now, the outcome creates it.
                if let Err(err) = self.open_record(op).await {
                    warn!(error = %err, "Could not open the refresh record; it is written at the end");
                }
            }
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

    pub(super) fn succeed(
        &self,
        op: &mut Operation,
        outcome: flow::RunOutcome,
    ) -> Result<(), Failure> {
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
}
