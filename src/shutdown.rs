//! Stop requests. The first SIGTERM or SIGINT asks for a graceful stop (no new work, in-flight
//! refreshes get the grace period); a second one skips what is left of the grace period.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    /// Cancelled on the first signal: start nothing new.
    pub stop: CancellationToken,
    /// Cancelled on the second signal: abandon in-flight work now.
    pub force: CancellationToken,
}

impl Shutdown {
    /// Installs the signal handlers.
    pub fn on_signals() -> std::io::Result<Self> {
        let shutdown = Self::default();
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let (stop, force) = (shutdown.stop.clone(), shutdown.force.clone());
        tokio::spawn(async move {
            for token in [stop, force] {
                let name = tokio::select! {
                    _ = terminate.recv() => "SIGTERM",
                    _ = interrupt.recv() => "SIGINT",
                };
                if token.is_cancelled() {
                    continue;
                }
                tracing::info!(signal = name, "Received a stop signal");
                token.cancel();
            }
        });
        Ok(shutdown)
    }
}
