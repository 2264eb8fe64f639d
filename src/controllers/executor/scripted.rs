//! The executor's test fakes: a scripted node, approver, connector and journal, and the errors
//! released k8sd and its transports give. Everything that happens is logged, in order.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ck8s_certs_api::machine_certificates::Operation;

use super::{Connector, Failure, NodeSession, Probe};
use crate::k8sd::K8sdError;
use crate::k8sd::wire::{PlanResponse, RunRequest, RunResponse};
use crate::refresh::csr::Mismatch;
use crate::refresh::{ApproveApi, NodeApi, Verification};

/// A call that got no answer in time (`endpoint`: `plan`, `run`).
pub fn no_answer(endpoint: &str) -> K8sdError {
    K8sdError::Timeout {
        node: "n".into(),
        endpoint: endpoint.into(),
        timeout: Duration::from_secs(10),
    }
}

/// A node that is not there (restarting).
pub fn refused() -> K8sdError {
    K8sdError::Connect {
        node: "n".into(),
        route: "port-forward".into(),
        reason: "connection refused".into(),
    }
}

/// An answered error.
pub fn api(status: u16, message: &str) -> K8sdError {
    K8sdError::Api {
        endpoint: "x".into(),
        status,
        message: message.into(),
    }
}

/// The next answer of a script (`what`: `plan`, `run`); an API error once it has run out.
pub(super) fn next<T>(
    script: &mut VecDeque<Result<T, K8sdError>>,
    what: &str,
) -> Result<T, K8sdError> {
    script
        .pop_front()
        .unwrap_or_else(|| Err(api(500, &format!("unscripted {what}"))))
}

pub(super) type Log = Arc<Mutex<Vec<String>>>;

pub(super) fn push(log: &Log, entry: impl Into<String>) {
    log.lock().unwrap().push(entry.into());
}

pub(super) fn entries(log: &Log) -> Vec<String> {
    log.lock().unwrap().clone()
}

/// A scripted node: each `plan` pops a seed (or an error), each `run` an expiry (or an error);
/// `probe` pops an answer (then answers).
pub(super) struct Node {
    pub(super) name: &'static str,
    pub(super) plans: VecDeque<Result<i64, K8sdError>>,
    pub(super) runs: VecDeque<Result<i64, K8sdError>>,
    pub(super) probes: VecDeque<Result<(), K8sdError>>,
    /// A worker's `run` waits for its CSRs to be approved.
    pub(super) run_takes: Duration,
    pub(super) log: Log,
}

impl NodeApi for Node {
    async fn plan(&mut self) -> Result<PlanResponse, K8sdError> {
        let seed = next(&mut self.plans, "plan")
            .inspect_err(|e| push(&self.log, format!("{} plan: {e}", self.name)))?;
        push(&self.log, format!("{} plan {seed}", self.name));
        Ok(PlanResponse {
            seed,
            certificate_signing_requests: None,
        })
    }

    async fn run(&mut self, request: &RunRequest) -> Result<RunResponse, K8sdError> {
        push(
            &self.log,
            format!(
                "{} run {} for {}s",
                self.name, request.seed, request.expiration_seconds
            ),
        );
        tokio::time::sleep(self.run_takes).await;
        let expiration_seconds = next(&mut self.runs, "run")?;
        Ok(RunResponse { expiration_seconds })
    }
}

impl Probe for Node {
    async fn probe(&mut self) -> Result<(), K8sdError> {
        push(&self.log, format!("{} probe", self.name));
        self.probes.pop_front().unwrap_or(Ok(()))
    }
}

/// Approves as scripted. Each look at the CSRs pops the next `checks` (`None`: they pass;
/// `Some`: one does not), passing once none are left.
pub(super) struct Approver {
    pub(super) answers: VecDeque<Result<(), K8sdError>>,
    pub(super) checks: VecDeque<Option<Mismatch>>,
    pub(super) log: Log,
}

impl Approver {
    pub(super) fn new(answers: Vec<Result<(), K8sdError>>, log: &Log) -> Self {
        Self {
            answers: answers.into(),
            checks: VecDeque::new(),
            log: log.clone(),
        }
    }
}

impl ApproveApi for Approver {
    async fn approve(&mut self, seed: i64) -> Result<(), K8sdError> {
        push(&self.log, format!("approve {seed}"));
        self.answers.pop_front().unwrap_or(Ok(()))
    }

    async fn verify(&mut self, _seed: i64, _lifetime: i64) -> Verification {
        match self.checks.pop_front().flatten() {
            Some(mismatch) => Verification::Unverified(mismatch),
            None => Verification::Verified,
        }
    }

    async fn deny(&mut self, seed: i64, why: &Mismatch) {
        push(&self.log, format!("deny {seed} ({})", why.field));
    }
}

/// What a journal logs of CSRs that did not pass.
pub(super) fn unverified(op: &Operation, mismatch: &Mismatch) -> String {
    format!(
        "unverified seed={} attempts={} ({})",
        op.seed.unwrap_or_default(),
        op.run_attempts,
        mismatch.field
    )
}

/// A serving CSR naming the cluster's API server.
pub(super) fn foreign_san(seed: i64) -> Mismatch {
    Mismatch {
        csr: format!("k8sd-{seed}-worker-kubelet-serving"),
        field: "subject alternative names",
        found: "DNS:kubernetes.default.svc".into(),
        wanted: "only the worker's own names and addresses (w0, 10.0.0.7)".into(),
    }
}

/// Hands out its node once; its connections and approver fail as scripted first.
pub(super) struct Link {
    pub(super) node: Mutex<Option<Node>>,
    pub(super) connects: Mutex<VecDeque<Failure>>,
    pub(super) approver: Mutex<Option<Approver>>,
    /// How long reaching the node takes (a workload API that answers slowly).
    pub(super) connect_takes: Duration,
    pub(super) log: Log,
}

impl Connector for Link {
    type Node = Node;
    type Approver = Approver;

    async fn node(&self) -> Result<NodeSession<Node>, Failure> {
        tokio::time::sleep(self.connect_takes).await;
        let failed = self.connects.lock().unwrap().pop_front();
        if let Some(failure) = failed {
            push(&self.log, format!("connect: {}", failure.cause()));
            return Err(failure);
        }
        push(&self.log, "connect");
        Ok(NodeSession {
            node: self
                .node
                .lock()
                .unwrap()
                .take()
                .expect("one node per execute"),
            extra_sans: vec!["cp.example".into()],
            reached_by: "port-forward to pod k8sd-proxy-x:2380".into(),
        })
    }

    async fn approver(&self) -> Result<Approver, Failure> {
        self.approver
            .lock()
            .unwrap()
            .take()
            .ok_or_else(|| Failure::Unavailable("no control plane answers".into()))
    }
}

/// How a journal logs the record of `op`.
pub(super) fn recorded(op: &Operation) -> String {
    format!(
        "record seed={} attempts={}",
        op.seed.unwrap_or_default(),
        op.run_attempts
    )
}

/// Records into the log; refuses to record when told.
pub(super) struct Journal {
    pub(super) log: Log,
    pub(super) refuse: Option<fn() -> Failure>,
    pub(super) shown: Vec<String>,
}

impl super::Journal for Journal {
    async fn record(&mut self, op: &mut Operation, _: Option<String>) -> Result<(), Failure> {
        if let Some(refusal) = self.refuse {
            push(&self.log, "record refused");
            return Err(refusal());
        }
        push(&self.log, recorded(op));
        Ok(())
    }

    async fn unverified(&mut self, op: &Operation, mismatch: &Mismatch) {
        push(&self.log, unverified(op, mismatch));
    }

    async fn waiting(&mut self, _: &Operation, note: &str) -> Result<(), Failure> {
        self.shown.push(note.to_owned());
        Ok(())
    }

    fn seen(&self) -> Option<u64> {
        None
    }
}

pub(super) fn journal(log: &Log) -> Journal {
    Journal {
        log: log.clone(),
        refuse: None,
        shown: Vec::new(),
    }
}

pub(super) fn node(
    log: &Log,
    name: &'static str,
    plans: Vec<Result<i64, K8sdError>>,
    runs: Vec<Result<i64, K8sdError>>,
) -> Link {
    Link {
        node: Mutex::new(Some(Node {
            name,
            plans: plans.into(),
            runs: runs.into(),
            probes: VecDeque::new(),
            run_takes: Duration::ZERO,
            log: log.clone(),
        })),
        connects: Mutex::default(),
        approver: Mutex::new(Some(Approver::new(Vec::new(), log))),
        connect_takes: Duration::ZERO,
        log: log.clone(),
    }
}
