//! Why an operation failed, before it becomes a user-facing message; and the small helpers of the
//! refresh flow (bounded waits, guards).

use super::*;

/// Why an operation failed, before it becomes a user-facing message.
pub(super) enum Failure {
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
    pub(super) fn k8sd(step: &'static str, error: K8sdError) -> Self {
        Self::K8sd { step, error }
    }

    /// Whether waiting may help: the node or its cluster does not answer for now, as during a
    /// restart (refused connections, a tunnel that cannot be opened, 503 while k8sd starts). A
    /// node that accepts and then never answers (a timeout) is not restarting: that fails.
    pub(super) fn unavailable(&self) -> bool {
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
    pub(super) fn cause(&self) -> String {
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
    pub(super) fn message(&self, machine: &MachineView) -> String {
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

pub(super) fn truncate(mut text: String, max: usize) -> String {
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
pub(super) struct Wait {
    deadline: tokio::time::Instant,
    delay: Duration,
    /// Whether the wait was shown in the operation record already.
    pub(super) shown: bool,
}

impl Wait {
    pub(super) fn new(timeout: Duration) -> Self {
        Self {
            deadline: deadline_after(timeout),
            delay: Duration::from_secs(1),
            shown: false,
        }
    }

    /// The next pause, or `None` once the deadline has passed.
    pub(super) fn next(&mut self) -> Option<Duration> {
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

/// `timeout` from now; a timeout past what the clock can hold waits "forever" (a century)
/// instead of panicking.
pub(super) fn deadline_after(timeout: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(now)
}

/// Runs `f` when dropped (on every exit path, including errors).
pub(super) fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
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
