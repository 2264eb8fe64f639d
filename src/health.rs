//! `/healthz` (the process is alive and serving) and `/readyz` (ready to do its job: a standby
//! when it takes part in leader election and could take over, the leader once its caches are
//! synced and its reconcilers run; never while stopping).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::task::JoinHandle;

/// Shared readiness flag.
#[derive(Clone, Default)]
pub struct Health {
    ready: Arc<AtomicBool>,
    stopping: Arc<AtomicBool>,
}

impl Health {
    /// Sets readiness; ignored once [`Health::stopping`] was called, so a late cache sync cannot
    /// mark a stopping replica ready again.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(
            ready && !self.stopping.load(Ordering::Acquire),
            Ordering::Release,
        );
    }

    /// Not ready from now on.
    pub fn stopping(&self) {
        self.stopping.store(true, Ordering::Release);
        self.ready.store(false, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

/// Binds `address` and serves the endpoints in the background.
pub async fn serve(address: SocketAddr, health: Health) -> std::io::Result<JoinHandle<()>> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(health);
    let listener = tokio::net::TcpListener::bind(address).await?;
    tracing::info!(address = %listener.local_addr()?, "Serving health endpoints");
    // With the webhook's limits: a client that holds connections must not fail the kubelet's
    // probes (and so restart the pod).
    Ok(crate::serving::serve(
        listener,
        None,
        app,
        crate::serving::Limits::default(),
    ))
}

async fn readyz(State(health): State<Health>) -> (StatusCode, &'static str) {
    if health.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopping_replica_is_never_ready_again() {
        let health = Health::default();
        assert!(!health.is_ready());
        health.set_ready(true);
        assert!(health.is_ready());
        health.stopping();
        assert!(!health.is_ready());
        health.set_ready(true);
        assert!(!health.is_ready());
    }
}
