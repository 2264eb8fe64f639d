//! The attempts of one operation on its node, once the node (and, for a worker, a control plane
//! to approve) can be called: `plan`, the seed recorded, `run` (with `approve` for a worker),
//! until `run` answers. Free of Kubernetes: the node and the approver are
//! [`NodeApi`]/[`ApproveApi`] and what must be persisted goes through a [`Journal`], so the rules
//! below are unit-tested with fakes, without a network:
//!
//! - every attempt is a fresh `plan` whose seed is recorded before its `run` is sent; when the
//!   journal cannot record it, the node sees nothing of that attempt;
//! - an attempt whose outcome is unknown (no answer, or a crash while it ran) is followed by a
//!   new `plan`, never by the same seed again: released k8sd refuses a worker `run` with a seed
//!   whose CSRs exist, and after a lost answer it skips its restart, so only a new `run` whose
//!   answer arrives tells what the node serves;
//! - at most [`MAX_RUN_SENDS`] `run`s per operation, across restarts (`op.run_attempts`);
//! - once the process is stopping, an operation that has sent nothing yet sends nothing;
//! - a replica whose term as leader is over sends nothing more (it looks right before it does);
//! - a `plan` that gets no answer is waited for through the journal, one call at a time.

use std::future::Future;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tracing::{info, warn};

use super::MAX_RUN_SENDS;
use super::failure::Failure;
use crate::k8sd::wire::RunRequest;
use crate::policy::Ttl;
use crate::refresh::csr::Mismatch;
use crate::refresh::flow;
use crate::refresh::{ApproveApi, NodeApi};
use ck8s_certs_api::machine_certificates::{Operation, Phase};

/// What the attempts persist and ask of the world around them.
pub(super) trait Journal: Send {
    /// Persists `op` (its new seed and attempt count) before the attempt's `run` is sent, with
    /// the node's certificate fingerprint (pinned on first contact). An error stops the operation
    /// there.
    fn record(
        &mut self,
        op: &mut Operation,
        fingerprint: Option<String>,
    ) -> impl Future<Output = Result<(), Failure>> + Send;
    /// The node's k8sd does not answer `plan` for now (restarting, or the call timed out):
    /// waits before the next try, fails when waiting is over, or ends the attempts for now
    /// ([`Failure::Wait`]: the operation goes on later from what is journaled).
    fn wait(
        &mut self,
        op: &mut Operation,
        failure: &Failure,
    ) -> impl Future<Output = Result<(), Failure>> + Send;
    /// A CSR of the attempt's seed did not pass verification, so nothing was approved and the
    /// seed's CSRs were denied: shows it (an `UnverifiedCSR` Event, a metric) before a new
    /// plan or the failure.
    fn unverified(
        &mut self,
        op: &Operation,
        mismatch: &Mismatch,
    ) -> impl Future<Output = ()> + Send;
    /// Whether the process is stopping.
    fn stopping(&self) -> bool;
    /// Whether this replica still leads: asked right before the seed is recorded and right
    /// before `run` (and `approve`) is sent, the calls that change the node.
    fn leading(&self) -> bool;
    fn now(&self) -> Timestamp;
}

/// Whether `op` has sent its last `run` without an answer: no new attempt may start.
pub(super) fn runs_spent(op: &Operation) -> bool {
    op.phase == Phase::Running && op.seed.is_some() && op.run_attempts >= MAX_RUN_SENDS
}

/// Carries `op` out on `node`, asking for `ttl`, until `run` answers: `Ok` with `op` Succeeded (its new expiry and
/// notes set), or why it failed. `approver` is the control plane that approves a
/// worker's CSRs (`None` for a control plane); `extra_sans` go with a control plane's `run`.
pub(super) async fn carry_out<N, A, J>(
    node: &mut N,
    mut approver: Option<&mut A>,
    op: &mut Operation,
    ttl: Ttl,
    extra_sans: Option<Vec<String>>,
    journal: &mut J,
) -> Result<(), Failure>
where
    N: NodeApi,
    A: ApproveApi,
    J: Journal,
{
    // The last attempt ended on CSRs that did not pass: its outcome is known (failed).
    let mut refused = false;
    loop {
        if op.phase == Phase::Running
            && !refused
            && let Some(seed) = op.seed
        {
            // The run of `seed` has no known outcome.
            if runs_spent(op) {
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
        // One call at a time: a node that does not answer is waited for by the journal (which
        // gives the cluster back in between), not retried here.
        let plan = loop {
            match node.plan().await {
                Ok(plan) => break plan,
                Err(err) => {
                    let failure = Failure::k8sd("plan", err);
                    if !failure.unavailable() && !failure.timed_out() {
                        return Err(failure);
                    }
                    journal.wait(op, &failure).await?;
                }
            }
        };
        if (journal.stopping() && op.seed.is_none()) || !journal.leading() {
            return Err(Failure::Stopping);
        }
        let seed = plan.seed;
        op.seed = Some(seed);
        op.phase = Phase::Running;
        op.run_attempts = op.run_attempts.saturating_add(1);
        op.seeded_at = Some(Time(journal.now()));
        journal.record(op, node.fingerprint()).await?;
        tracing::Span::current().record("seed", seed);

        if !journal.leading() {
            // The term ended while the seed was recorded: the seed's `run` was never sent, and
            // the next leader goes on with a new plan (it counts as one of the sends).
            return Err(Failure::Stopping);
        }
        let request = RunRequest::new(seed, ttl, extra_sans.clone());
        let (answered, approve_error) = match approver.as_deref_mut() {
            None => (node.run(&request).await, None),
            Some(approver) => {
                let worker = flow::run_worker(node, approver, &request).await;
                if let (Some(mismatch), Err(_)) = (&worker.unverified, &worker.run) {
                    journal.unverified(op, mismatch).await;
                    if op.run_attempts >= MAX_RUN_SENDS {
                        return Err(Failure::UnverifiedCsr(mismatch.clone()));
                    }
                    // Its CSRs were denied and its run is over: a new plan, with a new seed,
                    // whose names nobody has taken.
                    refused = true;
                    continue;
                }
                if let (Some(mismatch), Ok(_)) = (&worker.unverified, &worker.run) {
                    op.note = Some(format!(
                        "the CSRs were not approved by this controller ({mismatch}), yet run succeeded: something else approved them"
                    ));
                }
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
                let outcome = flow::interpret_run(&response, journal.now())
                    .map_err(|e| Failure::k8sd("run", e))?;
                if let Some(err) = approve_error {
                    // Recorded, not reported as a failure: run's answer is the outcome.
                    op.note = Some(format!(
                        "approve answered an error that did not stop the refresh: {err}"
                    ));
                }
                succeed(op, &outcome);
                return Ok(());
            }
            Err(err) if flow::client_refused(&err) => return Err(Failure::InPlaceImpossible(err)),
            Err(err) if flow::outcome_unknown(&err) => {
                warn!(seed, error = %err, "run got no answer; its outcome is unknown");
            }
            Err(err) => return Err(Failure::k8sd("run", err)),
        }
    }
}

/// `op` succeeded with `outcome`: its new expiry, and notes on anything odd in the answer.
fn succeed(op: &mut Operation, outcome: &flow::RunOutcome) {
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
            std::time::Duration::from_secs(seconds.unsigned_abs()),
            op.started_at.0,
            outcome.not_after,
        )
    {
        notes.push(note);
    }
    op.note = (!notes.is_empty()).then(|| notes.join("; "));
}

#[cfg(test)]
mod tests;
