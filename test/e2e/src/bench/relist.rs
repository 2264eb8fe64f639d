//! The controller across a restart of the management kube-apiserver (a management cluster
//! upgrade, a control-plane node reboot): every watch breaks, and each informer lists again.
//! Measured: the requests that follow (the relist, and no storm after it), CPU and memory, and
//! that nothing is refreshed or written because of it (the fleet is at rest).

use std::time::{Duration, Instant};

use jiff::Timestamp;

use super::idle::Contender;
use super::probe::{AuditTail, Memory, ProcessProbe, Requests};
use super::{alive, settle, wait_for_log};
use crate::process::Process;
use crate::{Environment, Error};

/// What one management API server restart cost the controller.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RelistFigures {
    /// From the kill to the API server's /readyz answering again.
    pub down_seconds: f64,
    /// The window measured after it came back.
    pub window_seconds: f64,
    /// Requests from the kill to the end of the window.
    pub requests: Requests,
    /// From the API server's return to the controller's last list request in the window: the
    /// relist's length (`None`: no list at all).
    pub relist_seconds: Option<f64>,
    /// Requests in the last half of the window: 0 is no storm, no retry loop.
    pub late_requests: usize,
    pub cpu_seconds: f64,
    pub memory_before: Memory,
    pub memory_after: Memory,
    /// k8sd calls any node saw from the kill to the end of the window (0: nothing refreshed).
    pub k8sd_calls: usize,
}

/// Starts the controller, lets it settle, restarts the management API server, measures for
/// `window` after it is back, and stops the controller.
pub async fn measure(
    env: &Environment,
    audit: &mut AuditTail,
    contender: Contender,
    window: Duration,
) -> Result<RelistFigures, Error> {
    let user = contender.user.clone();
    let mut process = Process::spawn("bench-ck8s-certs-relist", contender.command, &env.dir)?;
    let probe = ProcessProbe { pid: process.pid() };
    wait_for_log(&mut process, contender.first_reconcile_marker).await?;
    settle(audit, &mut process, &user).await?;

    env.sim.clear_calls("", "").await?;
    let cpu_before = probe.cpu_seconds().unwrap_or_default();
    let memory_before = probe.memory().unwrap_or_default();
    let killed_at = Timestamp::now();
    let killed = Instant::now();
    env.restart_management_apiserver(Duration::from_secs(300))
        .await?;
    let down_seconds = killed.elapsed().as_secs_f64();
    let back_at = Timestamp::now();
    let back = Instant::now();
    while back.elapsed() < window {
        alive(&mut process)?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let ended_at = Timestamp::now();
    let cpu_seconds = probe.cpu_seconds().unwrap_or_default() - cpu_before;
    let memory_after = probe.memory().unwrap_or_default();
    let k8sd_calls = env.sim.calls("", "").await?.len();
    process.terminate(Duration::from_secs(30));
    // The API server writes its audit events as requests complete.
    tokio::time::sleep(Duration::from_secs(2)).await;
    audit.refresh();

    let half = jiff::SignedDuration::try_from(window / 2).unwrap_or_default();
    let late_from = ended_at.checked_sub(half).unwrap_or(ended_at);
    let last_list = audit
        .events
        .iter()
        .filter(|e| e.user.username == user && e.verb == "list")
        .filter_map(|e| e.received())
        .filter(|at| *at >= back_at && *at < ended_at)
        .max();
    Ok(RelistFigures {
        down_seconds,
        window_seconds: window.as_secs_f64(),
        requests: audit.requests(&user, killed_at, ended_at),
        relist_seconds: last_list.map(|at| at.duration_since(back_at).as_secs_f64().max(0.0)),
        late_requests: audit.requests(&user, late_from, ended_at).other,
        cpu_seconds,
        memory_before,
        memory_after,
        k8sd_calls,
    })
}
