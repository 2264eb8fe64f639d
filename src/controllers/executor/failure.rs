//! Why an operation did not finish, before it becomes a user-facing message; and how long a
//! refresh may still wait for what it needs.

use std::time::Duration;

use ck8s_certs_api::machine::MachineView;

use crate::k8sd::K8sdError;
use crate::refresh::csr::Mismatch;
use crate::workload::WorkloadError;

/// The Event reason, and the word in a failure's message, of CSRs that were not approved.
pub const UNVERIFIED_CSR: &str = ck8s_certs_api::reasons::events::UNVERIFIED_CSR;

/// What to look at when a worker's CSRs did not pass, by the field that failed.
pub fn unverified_hint(mismatch: &Mismatch) -> &'static str {
    match mismatch.field {
        "spec.username" | "spec.groups" => {
            "something other than the node created a CSR under the refresh's name: check who may create CertificateSigningRequests in the workload cluster (docs/security.md, \"Only verified CSRs are approved\")"
        }
        "subject alternative names" => {
            "if the node really has these names or addresses, they must be in its Machine's status.addresses (written by the infrastructure provider) (docs/security.md, \"Only verified CSRs are approved\")"
        }
        _ => {
            "the node's k8sd made a CSR unlike the ones released k8sd makes, or something else did: see docs/security.md, \"Only verified CSRs are approved\""
        }
    }
}

/// The most of a failure's message kept in a status (an Event takes 1 KiB).
pub const MAX_MESSAGE_CHARS: usize = 2000;

/// An error of our own write or read (the journal, the Machine's objects), boxed so the executor
/// does not depend on the reconciler that made it.
pub type ApiError = Box<dyn std::error::Error + Send + Sync>;

/// Why an operation failed, or why it stopped for now.
#[derive(Debug)]
pub enum Failure {
    K8sd {
        step: &'static str,
        error: K8sdError,
    },
    Workload(WorkloadError),
    /// A worker's CSRs did not pass verification at its last attempt: none was approved.
    UnverifiedCsr(Mismatch),
    /// A worker's `run` could not create its CSRs: the API server refused the node's own client
    /// (`kubelet.conf` expired). Nothing in place can fix that: the Machine must be replaced.
    InPlaceImpossible(K8sdError),
    /// Our own API call failed: the operation stays as last journaled and is taken up again.
    Api(ApiError),
    Message(String),
    /// Something the refresh needs does not answer for now (waited for, then a failure).
    Unavailable(String),
    /// Not now: the refresh waits `after` (or until it is woken) without holding anything. It
    /// is what the journal says, and goes on at the next reconcile.
    Wait(Duration),
    /// The process is stopping and nothing was sent to the node for this attempt: the next
    /// leader takes the request up from its record.
    Stopping,
    /// Another controller instance (a `--watch-filter` shard) recorded its attempt first and
    /// carries the refresh out; nothing was sent to the node by this one.
    Superseded,
}

impl Failure {
    pub fn k8sd(step: &'static str, error: K8sdError) -> Self {
        Self::K8sd { step, error }
    }

    /// Whether waiting may help: the node or its cluster does not answer for now, as during a
    /// restart (refused connections, a tunnel that cannot be opened, 503 while k8sd starts). A
    /// node that accepts and then never answers (a timeout) is not restarting: that is tried
    /// again a bounded number of times ([`Failure::timed_out`]).
    pub fn unavailable(&self) -> bool {
        match self {
            Self::K8sd { error, .. } => {
                error.is_retryable() && !matches!(error, K8sdError::Timeout { .. })
            }
            Self::Workload(err) => err.is_retryable(),
            Self::Unavailable(_) => true,
            Self::Api(_)
            | Self::Message(_)
            | Self::UnverifiedCsr(_)
            | Self::InPlaceImpossible(_)
            | Self::Wait(_)
            | Self::Stopping
            | Self::Superseded => false,
        }
    }

    /// A call that got no answer in time: worth a few more tries, not an open-ended wait.
    pub fn timed_out(&self) -> bool {
        matches!(
            self,
            Self::K8sd {
                error: K8sdError::Timeout { .. },
                ..
            }
        )
    }

    /// What went wrong, without advice. Bounded: it may quote a node or a workload API server.
    pub fn cause(&self) -> String {
        crate::text::bounded(&self.unbounded_cause(), MAX_MESSAGE_CHARS)
    }

    fn unbounded_cause(&self) -> String {
        match self {
            Self::K8sd { step, error } => format!("{step}: {error}"),
            Self::Workload(err) => err.to_string(),
            Self::UnverifiedCsr(mismatch) => format!("{UNVERIFIED_CSR}: {mismatch}"),
            Self::InPlaceImpossible(error) => format!("run: {error}"),
            Self::Api(err) => err.to_string(),
            Self::Message(text) | Self::Unavailable(text) => text.clone(),
            Self::Wait(after) => format!("waiting {}", humantime::format_duration(*after)),
            Self::Stopping => "stopping".into(),
            Self::Superseded => "superseded".into(),
        }
    }

    /// What failed and what to fix before trying again (how to try again, the caller says: it
    /// depends on who asked). Never contains a token. Bounded, without control characters: it
    /// may quote a node or a workload API server, and goes into statuses and Events.
    pub fn message(&self, machine: &MachineView) -> String {
        crate::text::bounded(&self.unbounded_message(machine), MAX_MESSAGE_CHARS)
    }

    fn unbounded_message(&self, machine: &MachineView) -> String {
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
                        "if the node was re-installed, check the fingerprint of its k8sd certificate on the node and pin it: `kubectl patch machinecertificates -n {} {} --subresource=status --type=merge -p '{{\"status\":{{\"k8sdFingerprint\":\"<sha256>\"}}}}'` (docs/refresh.md, \"Trust in k8sd's certificate\")",
                        machine.namespace, machine.name
                    ),
                    e if e.is_retryable() => "check that the node is up and its k8sd-proxy pod is Running".into(),
                    _ => String::new(),
                };
                let hint = hint.trim_end_matches([',', ' ']);
                match hint.is_empty() {
                    true => format!("Refreshing failed at {step}: {error}"),
                    false => format!("Refreshing failed at {step}: {error}; {hint}"),
                }
            }
            Self::Workload(err) => {
                format!("Refreshing failed before contacting the node: {err}")
            }
            Self::UnverifiedCsr(mismatch) => format!(
                "Refreshing failed: a CSR of the worker's last refresh did not pass verification, so none was approved ({UNVERIFIED_CSR}): {mismatch}; {}",
                unverified_hint(mismatch)
            ),
            Self::InPlaceImpossible(error) => format!(
                "The node cannot be refreshed in place: its cluster's API server refused the node's own client certificate (kubelet.conf) when run created its CSRs ({error}), so that certificate has expired. Replace the Machine: `kubectl delete machine -n {} {}` (a Machine of a MachineSet is created again; docs/refresh.md, \"When certificates have already expired\")",
                machine.namespace, machine.name
            ),
            Self::Api(err) => format!("Refreshing failed: {err}"),
            Self::Message(text) | Self::Unavailable(text) => text.clone(),
            Self::Wait(_) => "The refresh is waiting".into(),
            Self::Stopping => "The controller stopped before the refresh started".into(),
            Self::Superseded => "Another controller instance carries the refresh out".into(),
        }
    }
}

/// How long a refresh may still wait for what it needs (a node or API that does not answer, a
/// node that times out), across the reconciles it gives its slot back in between: the pauses
/// grow from 1 s to 8 s; a node or API that does not answer is waited for until the deadline,
/// a call that times out is tried `tries` times in all.
#[derive(Clone, Debug)]
pub struct Wait {
    deadline: tokio::time::Instant,
    delay: Duration,
    timeouts_left: u32,
}

impl Wait {
    pub fn new(timeout: Duration, tries: u32) -> Self {
        Self {
            deadline: deadline_after(timeout),
            delay: Duration::from_secs(1),
            timeouts_left: tries.saturating_sub(1),
        }
    }

    /// The pause before trying again after `failure`, or `None` once waiting is over.
    pub fn next(&mut self, failure: &Failure) -> Option<Duration> {
        if failure.timed_out() {
            self.timeouts_left = self.timeouts_left.checked_sub(1)?;
        }
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

    /// Whether the deadline has passed.
    pub fn over(&self) -> bool {
        tokio::time::Instant::now() >= self.deadline
    }
}

/// `timeout` from now; a timeout past what the clock can hold waits "forever" (a century)
/// instead of panicking.
pub fn deadline_after(timeout: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout() -> Failure {
        Failure::k8sd(
            "plan",
            K8sdError::Timeout {
                node: "n".into(),
                endpoint: "plan".into(),
                timeout: Duration::from_secs(10),
            },
        )
    }

    fn refused() -> Failure {
        Failure::Unavailable("connection refused".into())
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_that_does_not_answer_is_waited_for_until_the_deadline() {
        let mut wait = Wait::new(Duration::from_secs(20), 5);
        let mut pauses = Vec::new();
        while let Some(pause) = wait.next(&refused()) {
            pauses.push(pause.as_secs());
            tokio::time::advance(pause).await;
        }
        assert_eq!(pauses, [1, 2, 4, 8, 5]);
        assert!(wait.over());
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_times_out_is_tried_a_bounded_number_of_times() {
        let mut wait = Wait::new(Duration::from_secs(600), 3);
        assert!(wait.next(&timeout()).is_some());
        assert!(wait.next(&timeout()).is_some());
        assert_eq!(wait.next(&timeout()), None);
    }

    #[test]
    fn an_absurd_timeout_waits_without_panicking() {
        let wait = Wait::new(Duration::MAX, 5);
        assert!(!wait.over());
    }
}
