//! Errors of a k8sd exchange, split by what the caller should do about them.

use std::time::Duration;

use super::tls::Fingerprint;

#[derive(Debug, thiserror::Error)]
pub enum K8sdError {
    /// The route to the node could not be opened (port-forward refused, connection refused, …).
    #[error("opening a connection to k8sd on node {node} via {route} failed: {reason}")]
    Connect {
        node: String,
        route: String,
        reason: String,
    },

    /// The workload API server refused to port-forward to the node because the kubelet's
    /// serving certificate has expired (it verifies kubelets): a node whose certificates
    /// expired is reached directly or not at all, and waiting does not change that.
    #[error(
        "the workload API server refuses to port-forward to node {node}: its kubelet's serving certificate expired{}",
        ended.map(|at| format!(" at {at}")).unwrap_or_default()
    )]
    KubeletCertificateExpired {
        node: String,
        ended: Option<jiff::Timestamp>,
    },

    /// TLS failed for a reason other than a pin mismatch.
    #[error("TLS handshake with k8sd on node {node} failed: {source}")]
    Tls {
        node: String,
        #[source]
        source: std::io::Error,
    },

    /// The node presented a different certificate than the one pinned on first use.
    #[error(
        "k8sd on node {node} presented a certificate with SHA-256 fingerprint {presented}, but {pinned} is pinned \
         (the node was reinstalled, or something else answers in its place)"
    )]
    PinMismatch {
        node: String,
        pinned: Fingerprint,
        presented: Fingerprint,
    },

    /// No answer within the call's deadline.
    #[error("{endpoint} on node {node} got no answer within {timeout:?}")]
    Timeout {
        node: String,
        endpoint: String,
        timeout: Duration,
    },

    /// The HTTP exchange broke (connection reset, closed before an answer, …).
    #[error("the HTTP exchange for {endpoint} with k8sd on node {node} failed: {source}")]
    Http {
        node: String,
        endpoint: String,
        #[source]
        source: hyper::Error,
    },

    /// k8sd answered with an error envelope (or a non-200 status).
    #[error("k8sd answered {endpoint} with HTTP {status}: {message}")]
    Api {
        endpoint: String,
        status: u16,
        message: String,
    },

    /// k8sd answered 200 with something that is not the documented payload.
    #[error("k8sd answered {endpoint} with an unexpected response: {reason}")]
    InvalidResponse { endpoint: String, reason: String },
}

impl K8sdError {
    /// Whether trying again later can succeed without anyone changing anything: the node is
    /// starting (503), unreachable for now, slow, or the connection broke. 4xx answers, pin
    /// mismatches and malformed answers need a person.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Connect { .. } | Self::Timeout { .. } | Self::Http { .. } => true,
            Self::Api { status, .. } => *status == 503 || *status == 502 || *status == 504,
            Self::KubeletCertificateExpired { .. }
            | Self::Tls { .. }
            | Self::PinMismatch { .. }
            | Self::InvalidResponse { .. } => false,
        }
    }

    /// Every value of [`Self::category`] (the metrics reference lists them).
    pub const CATEGORIES: [&'static str; 7] = [
        "connect",
        "tls",
        "pin_mismatch",
        "timeout",
        "http",
        "api",
        "invalid_response",
    ];

    /// A static name for metrics labels, one of [`Self::CATEGORIES`].
    pub fn category(&self) -> &'static str {
        match self {
            Self::Connect { .. } | Self::KubeletCertificateExpired { .. } => "connect",
            Self::Tls { .. } => "tls",
            Self::PinMismatch { .. } => "pin_mismatch",
            Self::Timeout { .. } => "timeout",
            Self::Http { .. } => "http",
            Self::Api { .. } => "api",
            Self::InvalidResponse { .. } => "invalid_response",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(status: u16) -> K8sdError {
        K8sdError::Api {
            endpoint: "plan".into(),
            status,
            message: String::new(),
        }
    }

    #[test]
    fn categories_are_listed() {
        let node = || "n".to_owned();
        let endpoint = || "run".to_owned();
        for error in [
            K8sdError::Connect {
                node: node(),
                route: "r".into(),
                reason: String::new(),
            },
            K8sdError::Tls {
                node: node(),
                source: std::io::Error::other("x"),
            },
            K8sdError::KubeletCertificateExpired {
                node: node(),
                ended: None,
            },
            K8sdError::Timeout {
                node: node(),
                endpoint: endpoint(),
                timeout: Duration::from_secs(1),
            },
            api(500),
            K8sdError::InvalidResponse {
                endpoint: endpoint(),
                reason: String::new(),
            },
        ] {
            assert!(K8sdError::CATEGORIES.contains(&error.category()), "{error}");
        }
    }

    #[test]
    fn only_transient_failures_are_retryable() {
        assert!(api(503).is_retryable());
        for status in [400, 401, 404, 500, 501] {
            assert!(!api(status).is_retryable(), "{status}");
        }
        assert!(
            K8sdError::Timeout {
                node: "n".into(),
                endpoint: "run".into(),
                timeout: Duration::from_secs(1)
            }
            .is_retryable()
        );
        assert!(
            !K8sdError::InvalidResponse {
                endpoint: "run".into(),
                reason: String::new()
            }
            .is_retryable()
        );
    }
}
