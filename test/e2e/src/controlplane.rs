//! Real control planes: one etcd and one kube-apiserver per cluster (management and workload
//! clusters alike), sharing the etcd under different prefixes. Loopback only, TLS from the
//! environment CA, RBAC on, an admin token, and the kubelet client settings that make
//! `pods/portforward` reach the simulated nodes.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::pki::{Ca, CertFiles};
use crate::process::{Process, Processes};
use crate::{Binaries, Error};

/// A free TCP port on 127.0.0.1 (the kernel picks it; we release it for the child to bind),
/// never one this process handed out before: the kernel may offer a released port again while
/// the child it went to is still starting (two controllers started at once once got the same
/// metrics port: "Address already in use").
pub fn free_port() -> Result<u16, Error> {
    static HANDED_OUT: Mutex<std::collections::BTreeSet<u16>> =
        Mutex::new(std::collections::BTreeSet::new());
    loop {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| Error::io(Path::new("127.0.0.1:0"), e))?;
        let port = listener
            .local_addr()
            .map(|a| a.port())
            .map_err(|e| Error::io(Path::new("127.0.0.1:0"), e))?;
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
        if handed_out.insert(port) {
            return Ok(port);
        }
    }
}

pub fn start_etcd(bins: &Binaries, dir: &Path) -> Result<(Process, String), Error> {
    let client = free_port()?;
    let peer = free_port()?;
    let url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let mut command = Command::new(&bins.etcd);
    command
        .arg("--name=e2e")
        .arg(format!("--data-dir={}", dir.join("etcd").display()))
        .arg(format!("--listen-client-urls={url}"))
        .arg(format!("--advertise-client-urls={url}"))
        .arg(format!("--listen-peer-urls={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .arg(format!("--initial-cluster=e2e={peer_url}"))
        .arg("--log-level=warn")
        // Test data is disposable: skipping fsync makes every API write much cheaper.
        .arg("--unsafe-no-fsync")
        // A benchmark fleet of 50,000 Machines outgrows the default 2 GiB backend between
        // compactions.
        .arg("--quota-backend-bytes=8589934592");
    let process = Process::spawn("etcd", command, dir)?;
    Ok((process, url))
}

/// Waits until etcd accepts connections.
pub async fn wait_for_etcd(
    process: &mut Process,
    url: &str,
    deadline: Duration,
) -> Result<(), Error> {
    let address: SocketAddr = url
        .trim_start_matches("http://")
        .parse()
        .map_err(|_| Error::Setup(format!("bad etcd url {url}")))?;
    let start = Instant::now();
    loop {
        process.check_running()?;
        if tokio::net::TcpStream::connect(address).await.is_ok() {
            return Ok(());
        }
        if start.elapsed() > deadline {
            return Err(Error::Timeout {
                what: "etcd to accept connections".into(),
                log: process.log_tail(20),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Files every API server shares.
pub struct SharedPki {
    pub ca: Ca,
    pub serving: CertFiles,
    /// The same names, expired: what the API server of a cluster switched off past its expiry
    /// serves ([`ApiServerRestarts`]' `expire-apiserver`).
    pub expired_serving: CertFiles,
    pub kubelet_client: CertFiles,
    pub service_account: CertFiles,
    pub token_file: PathBuf,
    pub admin_token: String,
}

/// How to start one child exactly the same way again (a restarted kube-apiserver keeps its
/// port, flags and log).
#[derive(Clone, Debug)]
pub struct Launch {
    /// The process name, e.g. `kube-apiserver-solo` (also its log file name).
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub log_dir: PathBuf,
}

impl Launch {
    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        command
    }

    /// First start: a fresh log.
    pub fn spawn(&self) -> Result<Process, Error> {
        Process::spawn(&self.name, self.command(), &self.log_dir)
    }

    /// A restart: the log goes on.
    pub fn respawn(&self) -> Result<Process, Error> {
        Process::respawn(&self.name, self.command(), &self.log_dir)
    }
}

pub struct ApiServer {
    pub name: String,
    pub process: Process,
    pub launch: Launch,
    pub port: u16,
    pub kubeconfig_yaml: String,
    pub kubeconfig: PathBuf,
}

impl ApiServer {
    pub fn start(
        bins: &Binaries,
        pki: &SharedPki,
        etcd: &str,
        name: &str,
        dir: &Path,
        audit: Audit,
    ) -> Result<Self, Error> {
        let port = free_port()?;
        let args: Vec<OsString> = [
            format!("--etcd-servers={etcd}"),
            format!("--etcd-prefix=/{name}"),
            format!("--secure-port={port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--cert-dir={}", dir.join(format!("{name}-certs")).display()),
            format!("--tls-cert-file={}", pki.serving.cert.display()),
            format!("--tls-private-key-file={}", pki.serving.key.display()),
            format!("--client-ca-file={}", pki.ca.files.cert.display()),
            format!("--token-auth-file={}", pki.token_file.display()),
            // Node: nodes create their CSRs (a worker refresh's, as k8sd makes them with the
            // node's own client) as a real cluster lets them.
            "--authorization-mode=Node,RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!(
                "--service-account-key-file={}",
                pki.service_account.cert.display()
            ),
            format!(
                "--service-account-signing-key-file={}",
                pki.service_account.key.display()
            ),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            format!(
                "--kubelet-client-certificate={}",
                pki.kubelet_client.cert.display()
            ),
            format!("--kubelet-client-key={}", pki.kubelet_client.key.display()),
            format!(
                "--kubelet-certificate-authority={}",
                pki.ca.files.cert.display()
            ),
            "--kubelet-preferred-address-types=InternalIP".into(),
            // No controller-manager runs, so nothing would create service account tokens.
            "--disable-admission-plugins=ServiceAccount".into(),
            // Management clusters run API Priority and Fairness (on by default since 1.20, GA in
            // 1.29): the controller's requests are classified there as in production, its Lease
            // requests by config/flowcontrol. The workload API servers only serve the simulator.
            format!(
                "--enable-priority-and-fairness={}",
                matches!(name, "management" | "move-target")
            ),
            // Several API servers share one etcd: don't let them fight over the kubernetes endpoint.
            "--endpoint-reconciler-type=none".into(),
            "--profiling=false".into(),
            // Only a SIGTERM waits (`drain-apiserver`); restarts kill.
            format!("--shutdown-delay-duration={}s", SHUTDOWN_DELAY.as_secs()),
            // Writes are audited so tests can count what the controller writes (benchmarks
            // count every request).
            format!(
                "--audit-policy-file={}",
                audit_policy(dir, audit)?.display()
            ),
            format!(
                "--audit-log-path={}",
                dir.join(format!("audit-{name}.log")).display()
            ),
            // Never rotated (0 would mean lumberjack's 100 MB, which a benchmark's log passes):
            // readers tail one file.
            "--audit-log-maxsize=100000".into(),
            "--v=1".into(),
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        let launch = Launch {
            name: format!("kube-apiserver-{name}"),
            program: bins.kube_apiserver.clone(),
            args,
            log_dir: dir.to_owned(),
        };
        let process = launch.spawn()?;
        let kubeconfig_yaml = kubeconfig(name, port, &pki.ca.pem, &pki.admin_token);
        let kubeconfig = dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&kubeconfig, &kubeconfig_yaml).map_err(|e| Error::io(&kubeconfig, e))?;
        Ok(Self {
            name: name.to_owned(),
            process,
            launch,
            port,
            kubeconfig_yaml,
            kubeconfig,
        })
    }

    pub async fn client(&self) -> Result<Client, Error> {
        client_from_kubeconfig(&self.kubeconfig_yaml).await
    }

    /// Waits until /readyz answers ok.
    pub async fn wait_ready(&mut self, deadline: Duration) -> Result<(), Error> {
        let client = self.client().await?;
        let start = Instant::now();
        loop {
            self.process.check_running()?;
            if is_ready(&client).await {
                return Ok(());
            }
            if start.elapsed() > deadline {
                return Err(Error::Timeout {
                    what: format!("kube-apiserver {} to become ready", self.name),
                    log: self.process.log_tail(30),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Whether the API server behind `client` answers /readyz with ok.
pub async fn is_ready(client: &Client) -> bool {
    let Ok(request) = http::Request::get("/readyz").body(Vec::new()) else {
        return false;
    };
    matches!(client.request_text(request).await, Ok(text) if text.trim() == "ok")
}

/// What an API server writes to its audit log, always at Metadata level.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Audit {
    /// Writes (create, update, patch, delete), and reads of Secrets: what tests count.
    #[default]
    Writes,
    /// Every request, reads and watches included: what benchmarks count.
    All,
}

fn audit_policy(dir: &Path, audit: Audit) -> Result<PathBuf, Error> {
    let (file, policy) = match audit {
        Audit::Writes => (
            "audit-policy.yaml",
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n  verbs: [create, update, patch, delete]\n- level: Metadata\n  verbs: [get]\n  resources: [{group: \"\", resources: [secrets]}]\n- level: None\n",
        ),
        Audit::All => (
            "audit-policy-all.yaml",
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
        ),
    };
    let path = dir.join(file);
    if path.exists() {
        // Shared by the environment's API servers: written once, never while one reads it.
        return Ok(path);
    }
    let partial = dir.join(format!("{file}.partial"));
    std::fs::write(&partial, policy).map_err(|e| Error::io(&partial, e))?;
    std::fs::rename(&partial, &path).map_err(|e| Error::io(&path, e))?;
    Ok(path)
}

/// One audited write.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    pub verb: String,
    pub user: AuditUser,
    #[serde(default)]
    pub object_ref: Option<AuditObject>,
    pub stage: String,
    #[serde(default)]
    pub request_received_timestamp: Option<String>,
    #[serde(default, rename = "requestURI")]
    pub request_uri: String,
    #[serde(default)]
    pub response_status: Option<AuditResponse>,
    #[serde(default)]
    pub user_agent: String,
}

/// How the API server answered an audited request.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct AuditResponse {
    #[serde(default)]
    pub code: Option<u16>,
}

#[derive(Clone, Debug, serde::Deserialize)]
pub struct AuditUser {
    pub username: String,
}

#[derive(Clone, Debug, serde::Deserialize)]
pub struct AuditObject {
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub subresource: String,
}

/// The writes audited so far by the API server `name` (e.g. "management").
pub fn audited_writes(dir: &Path, name: &str) -> Vec<AuditEvent> {
    audited_requests(
        &std::fs::read_to_string(dir.join(format!("audit-{name}.log"))).unwrap_or_default(),
    )
    .filter(AuditEvent::is_write)
    .collect()
}

/// One event per request in audit log text: a watch when it starts, anything else when it
/// completes.
pub fn audited_requests(log: &str) -> impl Iterator<Item = AuditEvent> + '_ {
    log.lines()
        .filter_map(|line| serde_json::from_str::<AuditEvent>(line).ok())
        .filter(|e| match e.verb.as_str() {
            "watch" => e.stage == "ResponseStarted",
            _ => e.stage == "ResponseComplete",
        })
}

impl AuditEvent {
    /// When the API server received the request.
    pub fn received(&self) -> Option<jiff::Timestamp> {
        self.request_received_timestamp.as_deref()?.parse().ok()
    }

    /// The HTTP status the API server answered (`None` when not audited).
    pub fn code(&self) -> Option<u16> {
        self.response_status.as_ref().and_then(|r| r.code)
    }

    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }
}

/// A token of the ServiceAccount `name` of `accounts`' namespace, valid for a day.
pub async fn service_account_token(
    accounts: &kube::Api<k8s_openapi::api::core::v1::ServiceAccount>,
    name: &str,
) -> Result<String, Error> {
    let request: k8s_openapi::api::authentication::v1::TokenRequest =
        serde_json::from_value(serde_json::json!({
            "spec": { "expirationSeconds": 86400, "audiences": [] }
        }))
        .map_err(|e| Error::Setup(e.to_string()))?;
    accounts
        .create_token_request(name, &kube::api::PostParams::default(), &request)
        .await
        .map_err(Error::Kube)?
        .status
        .map(|s| s.token)
        .ok_or_else(|| Error::Setup("the TokenRequest returned no token".into()))
}

/// A self-contained kubeconfig (CA data inline) for the admin token.
pub fn kubeconfig(name: &str, port: u16, ca_pem: &str, token: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority-data: {ca}\nusers:\n- name: {name}-admin\n  user:\n    token: {token}\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}-admin\ncurrent-context: {name}\n"
    )
}

pub async fn client_from_kubeconfig(yaml: &str) -> Result<Client, Error> {
    let kubeconfig =
        Kubeconfig::from_yaml(yaml).map_err(|e| Error::Setup(format!("kubeconfig: {e}")))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Setup(format!("kubeconfig: {e}")))?;
    Client::try_from(config).map_err(Error::Kube)
}

/// How often a workload cluster's kube-apiserver was restarted through the restart hook.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestartCount {
    /// Hook calls for this cluster (a call while a restart is under way joins that one).
    pub requested: u32,
    /// Restarts begun: the API server was killed.
    pub begun: u32,
    /// Restarts done: the API server was started again (it may not be ready yet).
    pub completed: u32,
}

impl RestartCount {
    pub fn in_progress(&self) -> bool {
        self.begun > self.completed
    }
}

/// How long a kube-apiserver stopped by SIGTERM keeps serving while its /readyz fails
/// (`--shutdown-delay-duration`; a kill is not delayed).
pub const SHUTDOWN_DELAY: Duration = Duration::from_secs(20);

/// How a restart stops the kube-apiserver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    Kill,
    /// Killed, then started serving an expired certificate.
    Expire,
    /// SIGTERM: not ready for [`SHUTDOWN_DELAY`], serving on, then gone.
    Drain,
}

/// Restarts workload clusters' kube-apiservers when the node simulator asks: a lone control
/// plane's `run` restarts its services, kube-apiserver included, and the whole workload API is
/// gone meanwhile. The hook is `POST /clusters/<name>/restart-apiserver` on loopback; the
/// management kube-apiserver restarts the same way on the environment's own request
/// ([`crate::Environment::restart_management_apiserver`]).
pub struct ApiServerRestarts {
    processes: Arc<Processes>,
    /// Per workload cluster name.
    launches: BTreeMap<String, Launch>,
    /// The serving certificate of an API server started as expired.
    expired_serving: CertFiles,
    down: Duration,
    counts: Mutex<BTreeMap<String, RestartCount>>,
    shutdown: tokio::sync::watch::Sender<bool>,
}

impl ApiServerRestarts {
    pub fn new(
        processes: Arc<Processes>,
        launches: BTreeMap<String, Launch>,
        expired_serving: CertFiles,
        down: Duration,
    ) -> Self {
        Self {
            processes,
            launches,
            expired_serving,
            down,
            counts: Mutex::new(BTreeMap::new()),
            shutdown: tokio::sync::watch::channel(false).0,
        }
    }

    pub fn count(&self, cluster: &str) -> RestartCount {
        self.counts
            .lock()
            .map(|c| c.get(cluster).copied().unwrap_or_default())
            .unwrap_or_default()
    }

    fn update<T>(&self, cluster: &str, f: impl FnOnce(&mut RestartCount) -> T) -> T {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        f(counts.entry(cluster.to_owned()).or_default())
    }

    /// `launch` with the expired serving certificate instead of the valid one.
    fn expired(&self, launch: &Launch) -> Launch {
        let mut expired = launch.clone();
        for arg in &mut expired.args {
            let text = arg.to_string_lossy();
            if text.starts_with("--tls-cert-file=") {
                *arg = format!("--tls-cert-file={}", self.expired_serving.cert.display()).into();
            } else if text.starts_with("--tls-private-key-file=") {
                *arg = format!(
                    "--tls-private-key-file={}",
                    self.expired_serving.key.display()
                )
                .into();
            }
        }
        expired
    }

    /// Stops the cluster's kube-apiserver (`how`), waits, starts it again with the same flags
    /// (port included) or, [`Stop::Expire`], serving an expired certificate. Runs on the hook's
    /// thread: the new child dies with that thread.
    async fn restart(self: Arc<Self>, cluster: String, how: Stop) {
        let Some(launch) = self.launches.get(&cluster) else {
            return;
        };
        let launch = match how {
            Stop::Expire => &self.expired(launch),
            Stop::Kill | Stop::Drain => launch,
        };
        let first = self.update(&cluster, |c| {
            c.requested += 1;
            if c.in_progress() {
                return false;
            }
            c.begun += 1;
            true
        });
        if !first {
            tracing::info!(%cluster, "kube-apiserver restart already under way");
            return;
        }
        tracing::info!(%cluster, down = ?self.down, "restarting the workload cluster's kube-apiserver");
        let process = self.processes.take(&launch.name);
        if let (Stop::Drain, Some(mut process)) = (how, process) {
            // SIGTERM: it fails /readyz for --shutdown-delay-duration while it serves on, as an
            // API server taken out of a load balancer does, then exits.
            let drained = tokio::task::spawn_blocking(move || {
                process.terminate(SHUTDOWN_DELAY + Duration::from_secs(30));
            });
            let _ = drained.await;
        }
        // Dropping the process kills it (SIGKILL to its group) and reaps it.
        tokio::time::sleep(self.down).await;
        if !self.processes.is_stopped() {
            match launch.respawn() {
                Ok(process) => {
                    self.processes.push(process);
                }
                Err(error) => {
                    tracing::error!(%cluster, %error, "kube-apiserver did not start again")
                }
            }
        }
        self.update(&cluster, |c| c.completed += 1);
    }

    /// Serves the restart hook on `listener` from a dedicated thread, which lives until
    /// [`ApiServerRestarts::stop`]; the restarted API servers are its children (their
    /// parent-death signal is tied to it).
    pub fn serve(self: &Arc<Self>, listener: TcpListener) -> Result<(), Error> {
        let address = listener
            .local_addr()
            .map_err(|e| Error::io(Path::new("restart hook"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io(Path::new("restart hook"), e))?;
        let this = Arc::clone(self);
        let mut shutdown = self.shutdown.subscribe();
        std::thread::Builder::new()
            .name("e2e-apiserver-restarts".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        tracing::error!(%error, "restart hook: no runtime");
                        return;
                    }
                };
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(error) => {
                            tracing::error!(%error, "restart hook: listener");
                            return;
                        }
                    };
                    loop {
                        tokio::select! {
                            _ = shutdown.changed() => break,
                            accepted = listener.accept() => {
                                if let Ok((stream, _)) = accepted {
                                    tokio::spawn(Arc::clone(&this).handle(stream));
                                }
                            }
                        }
                    }
                });
                // Restarts under way end with the runtime; their children were killed by stop.
            })
            .map_err(|e| Error::Spawn {
                name: "restart hook".into(),
                source: e,
            })?;
        tracing::debug!(%address, "restart hook listening");
        Ok(())
    }

    /// Ends the hook thread (the processes are killed by [`Processes::stop`]).
    pub fn stop(&self) {
        let _ = self.shutdown.send(true);
    }

    /// One hook request: HTTP/1.1, `POST /clusters/<name>/restart-apiserver` (or
    /// `expire-apiserver`: started again serving an expired certificate; `drain-apiserver`:
    /// stopped by SIGTERM, so not ready for [`SHUTDOWN_DELAY`] first), answered 202 at once (the
    /// restart goes on in the background).
    async fn handle(self: Arc<Self>, mut stream: tokio::net::TcpStream) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buffer = Vec::new();
        let head_end = loop {
            if let Some(end) = find(&buffer, b"\r\n\r\n") {
                break end + 4;
            }
            if buffer.len() > 16 * 1024 {
                return;
            }
            let mut chunk = [0u8; 4096];
            match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut chunk)).await {
                Ok(Ok(n)) if n > 0 => buffer.extend_from_slice(&chunk[..n]),
                _ => return,
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
        let content_length = head
            .lines()
            .filter_map(|line| line.split_once(':'))
            .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
            .and_then(|(_, value)| value.trim().parse::<usize>().ok())
            .unwrap_or(0)
            .min(64 * 1024);
        let mut body_read = buffer.len() - head_end;
        while body_read < content_length {
            let mut chunk = [0u8; 4096];
            match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut chunk)).await {
                Ok(Ok(n)) if n > 0 => body_read += n,
                _ => break,
            }
        }
        let mut request_line = head.lines().next().unwrap_or_default().split(' ');
        let method = request_line.next().unwrap_or_default();
        let path = request_line.next().unwrap_or_default();
        let segments: Vec<&str> = path.split('/').collect();
        let (status, body) = match (method, segments.as_slice()) {
            (
                "POST",
                [
                    "",
                    "clusters",
                    cluster,
                    action @ ("restart-apiserver" | "expire-apiserver" | "drain-apiserver"),
                ],
            ) if self.launches.contains_key(*cluster) => {
                let how = match *action {
                    "expire-apiserver" => Stop::Expire,
                    "drain-apiserver" => Stop::Drain,
                    _ => Stop::Kill,
                };
                tokio::spawn(Arc::clone(&self).restart((*cluster).to_owned(), how));
                (
                    "202 Accepted",
                    serde_json::json!({ "cluster": cluster, "downSeconds": self.down.as_secs_f64() }),
                )
            }
            ("POST", ["", "clusters", cluster, "restart-apiserver"]) => (
                "404 Not Found",
                serde_json::json!({ "error": format!("no workload cluster {cluster}") }),
            ),
            _ => (
                "404 Not Found",
                serde_json::json!({ "error": format!("no route {method} {path}") }),
            ),
        };
        let body = body.to_string();
        let response = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(response.as_bytes()).await;
        let _ = stream.shutdown().await;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expired_start_swaps_the_serving_certificate_and_nothing_else() {
        let launch = Launch {
            name: "kube-apiserver-trio".into(),
            program: "kube-apiserver".into(),
            args: [
                "--secure-port=6443",
                "--tls-cert-file=/d/apiserver.crt",
                "--tls-private-key-file=/d/apiserver.key",
            ]
            .into_iter()
            .map(OsString::from)
            .collect(),
            log_dir: "/d".into(),
        };
        let restarts = ApiServerRestarts::new(
            Arc::new(Processes::default()),
            BTreeMap::new(),
            CertFiles {
                cert: "/d/apiserver-expired.crt".into(),
                key: "/d/apiserver-expired.key".into(),
            },
            Duration::ZERO,
        );
        let expired = restarts.expired(&launch);
        assert_eq!(
            expired.args,
            [
                "--secure-port=6443",
                "--tls-cert-file=/d/apiserver-expired.crt",
                "--tls-private-key-file=/d/apiserver-expired.key",
            ]
            .map(OsString::from)
        );
        assert_eq!(expired.name, launch.name);
    }

    #[tokio::test]
    async fn the_restart_hook_kills_the_named_api_server_and_starts_it_again_with_the_same_command()
    {
        let dir = std::env::temp_dir().join(format!("ck8s-restart-hook-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let launch = Launch {
            name: "kube-apiserver-solo".into(),
            program: "/bin/sh".into(),
            args: ["-c", "echo started; exec sleep 600"]
                .into_iter()
                .map(OsString::from)
                .collect(),
            log_dir: dir.clone(),
        };
        let processes = Arc::new(Processes::default());
        processes.push(launch.spawn().unwrap());
        let first = processes.pid("kube-apiserver-solo").unwrap();
        let restarts = Arc::new(ApiServerRestarts::new(
            Arc::clone(&processes),
            BTreeMap::from([("solo".to_owned(), launch)]),
            CertFiles {
                cert: dir.join("expired.crt"),
                key: dir.join("expired.key"),
            },
            Duration::from_millis(300),
        ));
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let address = listener.local_addr().unwrap();
        restarts.serve(listener).unwrap();

        let http = reqwest::Client::new();
        // The status the hook answers a POST to `path`.
        let hook = |path: &str| {
            let sent = http
                .post(format!("http://{address}{path}"))
                .header("content-type", "application/json")
                .body("{}")
                .send();
            async move { sent.await.unwrap().status() }
        };
        assert_eq!(hook("/clusters/trio/restart-apiserver").await, 404);
        assert_eq!(hook("/clusters/solo").await, 404);
        assert_eq!(hook("/clusters/solo/restart-apiserver").await, 202);
        // A second call while the restart is under way joins it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(hook("/clusters/solo/restart-apiserver").await, 202);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(restarts.count("solo").in_progress());
        assert_eq!(processes.pid("kube-apiserver-solo"), None, "down meanwhile");

        let start = Instant::now();
        while restarts.count("solo").in_progress() {
            assert!(start.elapsed() < Duration::from_secs(10), "never restarted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            restarts.count("solo"),
            RestartCount {
                requested: 2,
                begun: 1,
                completed: 1
            }
        );
        let second = processes.pid("kube-apiserver-solo").expect("running again");
        assert_ne!(first, second);
        // The log goes on across the restart.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let log = std::fs::read_to_string(dir.join("kube-apiserver-solo.log")).unwrap();
        assert_eq!(log.matches("started").count(), 2, "{log}");
        assert_eq!(restarts.count("trio"), RestartCount::default());

        restarts.stop();
        processes.stop();
        assert!(
            !processes.push(launch_again(&dir)),
            "stopped: nothing starts"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn launch_again(dir: &Path) -> Process {
        let mut command = Command::new("/bin/sh");
        command.args(["-c", "exec sleep 600"]);
        Process::spawn("late", command, dir).unwrap()
    }
}
