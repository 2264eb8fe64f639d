//! Each contender alone against the fleet: cold start, a start-up window and an idle window.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;

use super::alive;
use super::probe::{AuditTail, Memory, ProcessProbe, Requests};
use crate::controller::{NAMESPACE, SERVICE_ACCOUNT};
use crate::process::Process;
use crate::{Environment, Error, controlplane};

/// One program measured against the fleet.
pub struct Contender {
    pub name: &'static str,
    /// Its API identity, as the audit log names it.
    pub user: String,
    pub command: Command,
    /// Log lines that mark caches synced and the first reconcile.
    pub ready_marker: &'static str,
    pub first_reconcile_marker: &'static str,
}

impl Contender {
    /// The controller under test: the ServiceAccount of `config/rbac`, leader election on, no
    /// webhook (annotate → in-progress is then the controller's own reaction).
    pub fn ours(env: &Environment, binary: &Path, extra: &[String]) -> Result<Self, Error> {
        let mut command = Command::new(binary);
        command
            .arg("--kubeconfig")
            .arg(&env.controller_kubeconfig)
            .arg(format!(
                "--health-bind-address=127.0.0.1:{}",
                controlplane::free_port()?
            ))
            .arg(format!(
                "--metrics-bind-address=127.0.0.1:{}",
                controlplane::free_port()?
            ))
            .arg("--webhook=false")
            .args(extra)
            // CK8S_BENCH_LOG: a log filter for the controller under test (e.g. `info,ck8s_certs=debug`).
            .env(
                "RUST_LOG",
                std::env::var("CK8S_BENCH_LOG").unwrap_or_else(|_| "info".to_owned()),
            );
        Ok(Self {
            name: "ck8s-certs",
            user: format!("system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"),
            command,
            ready_marker: "Caches synced",
            first_reconcile_marker: "First Machine reconciled",
        })
    }

    /// The reference manager (`test/refmanager`), as cluster-admin like the provider's.
    pub async fn reference(env: &Environment, binary: &Path) -> Result<Self, Error> {
        const ACCOUNT: &str = "ck8s-refmanager";
        let kubeconfig = cluster_admin_kubeconfig(env, ACCOUNT).await?;
        let mut command = Command::new(binary);
        command.arg("--kubeconfig").arg(kubeconfig);
        Ok(Self {
            name: "reference",
            user: format!("system:serviceaccount:{NAMESPACE}:{ACCOUNT}"),
            command,
            ready_marker: "READY",
            first_reconcile_marker: "first-reconcile",
        })
    }
}

/// What one contender cost.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct IdleFigures {
    pub name: String,
    /// From spawn to caches synced, and to the first reconcile done.
    pub ready_seconds: Option<f64>,
    pub first_reconcile_seconds: Option<f64>,
    pub startup_window_seconds: f64,
    pub idle_window_seconds: f64,
    /// Requests in the start-up window (from spawn) and in the idle window after it.
    pub startup_requests: Requests,
    pub idle_requests: Requests,
    /// The most established connections to the management API server at any sample (every
    /// 100 ms), in the start-up window and in the idle window.
    pub startup_connections_max: usize,
    pub idle_connections_max: usize,
    /// At the end of the start-up window and at the end of the idle window.
    pub memory_after_startup: Memory,
    pub memory_after_idle: Memory,
    pub startup_cpu_seconds: f64,
    pub idle_cpu_seconds: f64,
}

impl IdleFigures {
    pub fn idle_requests_per_minute(&self) -> f64 {
        self.idle_requests.other as f64 * 60.0 / self.idle_window_seconds.max(1.0)
    }

    pub fn idle_lease_requests_per_minute(&self) -> f64 {
        self.idle_requests.leases as f64 * 60.0 / self.idle_window_seconds.max(1.0)
    }

    pub fn idle_cpu_per_minute(&self) -> f64 {
        self.idle_cpu_seconds * 60.0 / self.idle_window_seconds.max(1.0)
    }
}

/// The management API server's port (from the admin kubeconfig).
pub fn management_port(env: &Environment) -> u16 {
    env.management_kubeconfig_yaml
        .lines()
        .find_map(|line| line.trim().strip_prefix("server: https://127.0.0.1:"))
        .and_then(|port| port.trim().parse().ok())
        .unwrap_or(0)
}

/// Starts `contender`, measures both windows, and stops it (SIGTERM: a Lease is released).
pub async fn measure(
    env: &Environment,
    audit: &mut AuditTail,
    contender: Contender,
    startup: Duration,
    idle: Duration,
) -> Result<IdleFigures, Error> {
    let port = management_port(env);
    let Contender {
        name,
        user,
        command,
        ready_marker,
        first_reconcile_marker,
    } = contender;
    let started_at = Timestamp::now();
    let started = Instant::now();
    let mut process = Process::spawn(&format!("bench-{name}"), command, &env.dir)?;
    let probe = ProcessProbe { pid: process.pid() };
    let mut figures = IdleFigures {
        name: name.to_owned(),
        startup_window_seconds: startup.as_secs_f64(),
        idle_window_seconds: idle.as_secs_f64(),
        ..IdleFigures::default()
    };
    let mut log = LogMarkers::new(process.log.clone());
    let mut cpu_before_idle = 0.0;
    for (window, end) in [(0, startup), (1, startup + idle)] {
        while started.elapsed() < end {
            alive(&mut process)?;
            let connections = probe.connections_to(port);
            let max = match window {
                0 => &mut figures.startup_connections_max,
                _ => &mut figures.idle_connections_max,
            };
            *max = (*max).max(connections);
            if figures.first_reconcile_seconds.is_none() || figures.ready_seconds.is_none() {
                log.scan();
            }
            figures.ready_seconds = figures
                .ready_seconds
                .or_else(|| log.first(ready_marker, started));
            figures.first_reconcile_seconds = figures
                .first_reconcile_seconds
                .or_else(|| log.first(first_reconcile_marker, started));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let memory = probe.memory().unwrap_or_default();
        let cpu = probe.cpu_seconds().unwrap_or_default();
        match window {
            0 => {
                figures.memory_after_startup = memory;
                figures.startup_cpu_seconds = cpu;
                cpu_before_idle = cpu;
            }
            _ => {
                figures.memory_after_idle = memory;
                figures.idle_cpu_seconds = cpu - cpu_before_idle;
            }
        }
    }
    let ended_at = Timestamp::now();
    process.terminate(Duration::from_secs(30));
    // The API server writes its audit events as requests complete.
    tokio::time::sleep(Duration::from_secs(2)).await;
    audit.refresh();
    let boundary = started_at
        .checked_add(jiff::SignedDuration::try_from(startup).unwrap_or_default())
        .unwrap_or(started_at);
    figures.startup_requests = audit.requests(&user, started_at, boundary);
    figures.idle_requests = audit.requests(&user, boundary, ended_at);
    Ok(figures)
}

/// When marker strings first appeared in a growing log file (seen when scanned, every 100 ms).
struct LogMarkers {
    path: PathBuf,
    text: String,
    seen: Vec<(String, Instant)>,
}

impl LogMarkers {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            text: String::new(),
            seen: Vec::new(),
        }
    }

    fn scan(&mut self) {
        self.text = std::fs::read_to_string(&self.path).unwrap_or_default();
    }

    /// Seconds from `since` to when `marker` was first seen in the log.
    fn first(&mut self, marker: &str, since: Instant) -> Option<f64> {
        if let Some((_, at)) = self.seen.iter().find(|(m, _)| m == marker) {
            return Some(at.duration_since(since).as_secs_f64());
        }
        if self.text.contains(marker) {
            let now = Instant::now();
            self.seen.push((marker.to_owned(), now));
            return Some(now.duration_since(since).as_secs_f64());
        }
        None
    }
}

/// A kubeconfig for a new ServiceAccount bound to cluster-admin (the provider's manager runs
/// with broad rights; what it reads is what it asks for, not what RBAC limits).
async fn cluster_admin_kubeconfig(env: &Environment, account: &str) -> Result<PathBuf, Error> {
    let client: Client = env.management().await?;
    let pp = PostParams::default();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    let sa: ServiceAccount = serde_json::from_value(json!({ "metadata": { "name": account } }))
        .map_err(|e| Error::Setup(e.to_string()))?;
    match accounts.create(&pp, &sa).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => return Err(Error::Kube(e)),
    }
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": { "name": account },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
        "subjects": [{ "kind": "ServiceAccount", "name": account, "namespace": NAMESPACE }]
    }))
    .map_err(|e| Error::Setup(e.to_string()))?;
    match Api::<ClusterRoleBinding>::all(client.clone())
        .create(&pp, &binding)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => return Err(Error::Kube(e)),
    }
    let token = controlplane::service_account_token(&accounts, account).await?;
    let yaml: String = env
        .management_kubeconfig_yaml
        .lines()
        .map(|line| match line.trim_start().strip_prefix("token: ") {
            Some(_) => format!("    token: {token}"),
            None => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let path = env.dir.join(format!("{account}.kubeconfig"));
    std::fs::write(&path, yaml).map_err(|e| Error::io(&path, e))?;
    Ok(path)
}
