//! What the executor's tests script a node to answer: the errors released k8sd and its
//! transports give.

use std::time::Duration;

use crate::k8sd::K8sdError;

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
