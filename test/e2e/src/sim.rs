//! The node simulator (`test/nodesim`, Go): its configuration, and a client for its control API
//! (fault injection, call records, node state, cluster annotations). It behaves like released
//! k8sd; see `test/nodesim/README.md`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::Error;
use crate::fixtures::{KUBELET_PORT, NodeInfo, Role};
use crate::pki::CertFiles;
use crate::process::Process;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    pub control: SocketAddr,
    #[serde(rename = "kubeletClientCA")]
    pub kubelet_client_ca: PathBuf,
    pub management_kubeconfig: PathBuf,
    pub restart_seconds: u64,
    /// `http://host:port` the simulator calls (`POST /clusters/<name>/restart-apiserver`) when
    /// the only control plane of a cluster restarted its services.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart_hook: Option<String>,
    pub clusters: Vec<ClusterConfig>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterConfig {
    pub name: String,
    pub namespace: String,
    pub kubeconfig: PathBuf,
    #[serde(rename = "honourCSRExpiration")]
    pub honour_csr_expiration: bool,
    /// The cluster's initial k8sd annotations (e.g. [`AUTO_APPROVE`]).
    pub annotations: BTreeMap<String, String>,
    pub nodes: Vec<NodeConfig>,
}

/// The k8sd cluster annotation that makes the control plane's CSR signer approve the workers'
/// `k8sd.io/*` CSRs itself (so a later `approve` fails).
pub const AUTO_APPROVE: &str = "k8sd/v1alpha1/csrsigning/auto-approve";

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeConfig {
    pub name: String,
    pub machine: String,
    pub role: Role,
    pub address: String,
    pub kubelet_port: u16,
    pub microcluster_port: u16,
    pub proxy_pod: String,
    pub kubelet_cert: PathBuf,
    pub kubelet_key: PathBuf,
    /// The same kubelet certificate, expired: served while the node's certificates are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubelet_expired_cert: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubelet_expired_key: Option<PathBuf>,
    pub initial_cert_lifetime_seconds: u64,
    pub approve_mode: String,
    pub run_answers_duration: bool,
}

impl NodeConfig {
    pub fn new(node: &NodeInfo, kubelet: &CertFiles, expired_kubelet: Option<&CertFiles>) -> Self {
        Self {
            name: node.node.clone(),
            machine: node.machine.clone(),
            role: node.role,
            address: node.address.to_string(),
            kubelet_port: KUBELET_PORT,
            microcluster_port: node.microcluster_port,
            proxy_pod: node.proxy_pod.clone(),
            kubelet_cert: kubelet.cert.clone(),
            kubelet_key: kubelet.key.clone(),
            kubelet_expired_cert: expired_kubelet.map(|c| c.cert.clone()),
            kubelet_expired_key: expired_kubelet.map(|c| c.key.clone()),
            // Initial certificates as if the cluster were 9 months into a 1-year lifetime.
            initial_cert_lifetime_seconds: 90 * 24 * 3600,
            approve_mode: "watch".into(),
            run_answers_duration: false,
        }
    }
}

/// Waits until the simulator printed `READY` (all listeners bound).
pub async fn wait_ready(process: &mut Process, deadline: Duration) -> Result<(), Error> {
    let start = Instant::now();
    loop {
        process.check_running()?;
        let log = std::fs::read_to_string(&process.log).unwrap_or_default();
        if log.lines().any(|l| l.trim() == "READY") {
            return Ok(());
        }
        if start.elapsed() > deadline {
            return Err(Error::Timeout {
                what: "the node simulator to listen".into(),
                log: process.log_tail(30),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn write_config(path: &Path, config: &Config) -> Result<(), Error> {
    let text = serde_json::to_string_pretty(config).map_err(|e| Error::Setup(e.to_string()))?;
    std::fs::write(path, text).map_err(|e| Error::io(path, e))
}

/// Which k8sd endpoint a fault or record concerns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Endpoint {
    Root,
    Expiry,
    Plan,
    Run,
    Approve,
}

impl Endpoint {
    /// The endpoint's k8sd path, as call records name it.
    pub fn path(self) -> &'static str {
        use ck8s_certs::k8sd::wire::path;
        match self {
            Self::Root => path::ROOT,
            Self::Expiry => path::CERTIFICATES_EXPIRY,
            Self::Plan => path::PLAN,
            Self::Run => path::RUN,
            Self::Approve => path::APPROVE,
        }
    }
}

/// A fault to inject; build with the constructors, scope with `cluster`/`node`/`endpoint`.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fault {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cluster: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub node: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<Endpoint>,
    pub kind: String,
    pub delay_ms: u64,
    pub status: u16,
    pub message: String,
    pub count: u32,
    /// The size of a `huge` answer; not sent otherwise, so a simulator built before the kind
    /// still accepts the other faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

impl Fault {
    fn kind(kind: &str) -> Self {
        Self {
            kind: kind.into(),
            ..Self::default()
        }
    }
    pub fn latency(delay: Duration) -> Self {
        Self {
            delay_ms: delay.as_millis() as u64,
            ..Self::kind("latency")
        }
    }
    pub fn error(status: u16, message: &str) -> Self {
        Self {
            status,
            message: message.into(),
            ..Self::kind("error")
        }
    }
    pub fn hang() -> Self {
        Self::kind("hang")
    }
    pub fn drop_connection() -> Self {
        Self::kind("drop")
    }
    pub fn malformed() -> Self {
        Self::kind("malformed")
    }
    pub fn unavailable() -> Self {
        Self::kind("unavailable")
    }
    pub fn refuse() -> Self {
        Self::kind("refuse")
    }
    pub fn csr_deny() -> Self {
        Self::kind("csr-deny")
    }
    /// The next `run` that completes its work (new certificates on disk) closes the connection
    /// instead of answering: like an answer lost on the way back, the node skips its restart and
    /// keeps serving the old certificates. Runs that fail answer normally and leave it in place.
    pub fn drop_answer() -> Self {
        Self {
            endpoint: Some(Endpoint::Run),
            ..Self::kind("drop-answer")
        }
    }
    /// A hostile node: answers 200 with a body of `bytes` bytes (a k8sd envelope whose one
    /// string is padded), streamed in chunks without Content-Length, so only reading tells its
    /// size. [`Fault::with_status`] makes it an error answer instead.
    pub fn huge(bytes: u64) -> Self {
        Self {
            bytes: Some(bytes),
            ..Self::kind("huge")
        }
    }
    /// The HTTP status a `huge` (or `error`) fault answers.
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }
    pub fn on(mut self, node: &NodeInfo) -> Self {
        self.cluster = node.cluster.clone();
        self.node = node.node.clone();
        self
    }
    pub fn on_cluster(mut self, cluster: &str) -> Self {
        self.cluster = cluster.into();
        self
    }
    pub fn at(mut self, endpoint: Endpoint) -> Self {
        self.endpoint = Some(endpoint);
        self
    }
    pub fn times(mut self, count: u32) -> Self {
        self.count = count;
        self
    }
}

/// One k8sd request as the simulator saw it. Header *names* only: values are never recorded.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CallRecord {
    pub cluster: String,
    pub node: String,
    pub endpoint: String,
    pub method: String,
    pub path: String,
    pub headers: Vec<String>,
    pub body: String,
    pub status: u16,
    #[serde(default)]
    pub fault: String,
    pub started_at: String,
    pub duration_ms: f64,
}

impl CallRecord {
    /// The seed a `run` or `approve` carried (panics on another body: a test bug).
    pub fn seed(&self) -> i64 {
        serde_json::from_str::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|body| body["seed"].as_i64())
            .unwrap_or_else(|| panic!("no seed in {}", self.body))
    }
}

/// The `run` calls among `calls`, in order.
pub fn runs(calls: &[CallRecord]) -> Vec<&CallRecord> {
    calls
        .iter()
        .filter(|c| c.path == ck8s_certs::k8sd::wire::path::RUN)
        .collect()
}

/// The seeds of the `run`s among `calls` that were answered (200), in order.
pub fn answered_runs(calls: &[CallRecord]) -> Vec<i64> {
    runs(calls)
        .into_iter()
        .filter(|c| c.status == 200)
        .map(CallRecord::seed)
        .collect()
}

/// A simulated node's state.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeState {
    pub cluster: String,
    pub node: String,
    pub machine: String,
    pub role: Role,
    pub address: String,
    pub microcluster_port: u16,
    pub cert_not_after: String,
    pub cert_not_before: String,
    #[serde(rename = "certSANs")]
    pub cert_sans: Vec<String>,
    pub database_expiry: String,
    #[serde(rename = "k8sdFingerprintSHA256")]
    pub k8sd_fingerprint_sha256: String,
    /// NotAfter of the certificate the last `run` wrote to disk. `cert_not_after` is what the
    /// node serves: the two differ after a `run` whose answer was lost (no restart).
    pub disk_cert_not_after: String,
    /// Service restarts (one per delivered `run` answer).
    pub restarts: u32,
    /// Seeds of the runs that wrote certificates (answered or not).
    #[serde(default)]
    pub seeds_run: Option<Vec<i64>>,
    /// The node's certificates are expired and its kubelet serves an expired certificate
    /// ([`SimControl::set_certificates_expired`]), until a `run` renews them.
    #[serde(default)]
    pub certificates_expired: bool,
}

impl NodeState {
    /// Whether the node serves what its last `run` wrote.
    pub fn serves_disk(&self) -> bool {
        self.cert_not_after == self.disk_cert_not_after
    }
}

/// A simulated workload cluster's state.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterState {
    pub name: String,
    pub namespace: String,
    pub control_planes: u32,
    pub annotations: BTreeMap<String, String>,
    /// Service restarts of the cluster's only control plane, each of which asked the
    /// environment to restart the cluster's kube-apiserver.
    #[serde(rename = "apiserverRestarts")]
    pub apiserver_restarts: u32,
    /// The workload API serves an expired certificate until a control plane's refresh.
    #[serde(rename = "apiCertificateExpired", default)]
    pub api_certificate_expired: bool,
}

/// Client of the simulator's control API. A large fleet runs several simulator processes (each
/// process holds two listening sockets per node, and a process may open only so many files);
/// the client then sends each request to the process that plays the cluster it names, and
/// requests naming no cluster to all of them.
#[derive(Clone)]
pub struct SimControl {
    /// The control API of each process.
    bases: Vec<String>,
    /// Which process plays a cluster (absent with one process).
    routes: std::collections::HashMap<String, usize>,
    http: reqwest::Client,
}

impl SimControl {
    pub fn new(address: SocketAddr) -> Self {
        Self::sharded(vec![(address, Vec::new())])
    }

    /// One client for several processes, each with the clusters it plays.
    pub fn sharded(parts: Vec<(SocketAddr, Vec<String>)>) -> Self {
        // No pooling: each test has its own runtime, and a pooled connection would die with the
        // runtime of the test that opened it.
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap_or_default();
        let mut routes = std::collections::HashMap::new();
        let mut bases = Vec::new();
        for (index, (address, clusters)) in parts.into_iter().enumerate() {
            bases.push(format!("http://{address}"));
            if index > 0 || !clusters.is_empty() {
                routes.extend(clusters.into_iter().map(|c| (c, index)));
            }
        }
        Self {
            bases,
            routes,
            http,
        }
    }

    /// The processes a request about `cluster` goes to (all for "").
    fn targets(&self, cluster: &str) -> Vec<(usize, &str)> {
        match self.routes.get(cluster) {
            Some(&index) if !cluster.is_empty() => vec![(index, self.bases[index].as_str())],
            _ => self.bases.iter().map(String::as_str).enumerate().collect(),
        }
    }

    /// The process playing `cluster` (the first when unknown).
    fn base_of(&self, cluster: &str) -> &str {
        let index = self.routes.get(cluster).copied().unwrap_or(0);
        &self.bases[index]
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, Error> {
        let response = request
            .send()
            .await
            .map_err(|e| Error::Sim(e.to_string()))?;
        if !response.status().is_success() {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            return Err(Error::Sim(format!("{status}: {text}")));
        }
        Ok(response)
    }

    async fn get_all<T: serde::de::DeserializeOwned>(
        &self,
        cluster: &str,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<Vec<T>, Error> {
        let mut all = Vec::new();
        for (_, base) in self.targets(cluster) {
            let response = self
                .send(self.http.get(format!("{base}{path}")).query(query))
                .await?;
            let part: Vec<T> = response
                .json()
                .await
                .map_err(|e| Error::Sim(e.to_string()))?;
            all.extend(part);
        }
        Ok(all)
    }

    /// Injects a fault; returns its id (with several processes, one id per process it went to).
    pub async fn inject(&self, fault: &Fault) -> Result<String, Error> {
        let targets = self.targets(&fault.cluster);
        let mut ids = Vec::new();
        for &(index, base) in &targets {
            let response = self
                .send(self.http.post(format!("{base}/faults")).json(fault))
                .await?;
            let body: serde_json::Value = response
                .json()
                .await
                .map_err(|e| Error::Sim(e.to_string()))?;
            let id = body["id"]
                .as_str()
                .ok_or_else(|| Error::Sim(format!("no id in {body}")))?;
            ids.push(match self.bases.len() {
                1 => id.to_owned(),
                _ => format!("{index}:{id}"),
            });
        }
        Ok(ids.join(","))
    }

    /// Holds `node`'s next call to `endpoint` back for `delay` (a latency fault, once); returns
    /// the fault's id.
    pub async fn delay_next(
        &self,
        node: &NodeInfo,
        endpoint: Endpoint,
        delay: Duration,
    ) -> Result<String, Error> {
        self.inject(&Fault::latency(delay).on(node).at(endpoint).times(1))
            .await
    }

    pub async fn clear_fault(&self, id: &str) -> Result<(), Error> {
        for part in id.split(',') {
            let (base, id) = match part.split_once(':') {
                Some((index, id)) => {
                    let index: usize = index
                        .parse()
                        .map_err(|_| Error::Sim(format!("not a fault id: {part}")))?;
                    let base = self
                        .bases
                        .get(index)
                        .ok_or_else(|| Error::Sim(format!("not a fault id: {part}")))?;
                    (base.as_str(), id)
                }
                None => (self.bases[0].as_str(), part),
            };
            self.send(self.http.delete(format!("{base}/faults/{id}")))
                .await?;
        }
        Ok(())
    }

    pub async fn clear_faults(&self, cluster: &str) -> Result<(), Error> {
        for (_, base) in self.targets(cluster) {
            self.send(
                self.http
                    .delete(format!("{base}/faults"))
                    .query(&[("cluster", cluster)]),
            )
            .await?;
        }
        Ok(())
    }

    /// Calls recorded on `node` of `cluster` (empty strings match all).
    pub async fn calls(&self, cluster: &str, node: &str) -> Result<Vec<CallRecord>, Error> {
        self.get_all(cluster, "/calls", &[("cluster", cluster), ("node", node)])
            .await
    }

    pub async fn clear_calls(&self, cluster: &str, node: &str) -> Result<(), Error> {
        for (_, base) in self.targets(cluster) {
            self.send(
                self.http
                    .delete(format!("{base}/calls"))
                    .query(&[("cluster", cluster), ("node", node)]),
            )
            .await?;
        }
        Ok(())
    }

    pub async fn nodes(&self) -> Result<Vec<NodeState>, Error> {
        self.get_all("", "/nodes", &[]).await
    }

    pub async fn node(&self, node: &NodeInfo) -> Result<NodeState, Error> {
        self.get_all::<NodeState>(&node.cluster, "/nodes", &[])
            .await?
            .into_iter()
            .find(|n| n.cluster == node.cluster && n.node == node.node)
            .ok_or_else(|| Error::Sim(format!("no node {} in cluster {}", node.node, node.cluster)))
    }

    pub async fn clusters(&self) -> Result<Vec<ClusterState>, Error> {
        self.get_all("", "/clusters", &[]).await
    }

    pub async fn cluster(&self, cluster: &str) -> Result<ClusterState, Error> {
        self.get_all::<ClusterState>(cluster, "/clusters", &[])
            .await?
            .into_iter()
            .find(|c| c.name == cluster)
            .ok_or_else(|| Error::Sim(format!("no cluster {cluster}")))
    }

    /// Replaces the k8sd annotations of `cluster` (as `k8s set annotations=…` on its nodes).
    pub async fn set_annotations(
        &self,
        cluster: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<ClusterState, Error> {
        let response = self
            .send(
                self.http
                    .put(format!(
                        "{}/clusters/{cluster}/annotations",
                        self.base_of(cluster)
                    ))
                    .json(annotations),
            )
            .await?;
        response.json().await.map_err(|e| Error::Sim(e.to_string()))
    }

    /// Tells the simulator that `cluster`'s workload API now serves an expired certificate: the
    /// next control plane whose refresh restarts its services has it renewed (through the
    /// restart hook).
    pub async fn set_api_certificate_expired(
        &self,
        cluster: &str,
        expired: bool,
    ) -> Result<ClusterState, Error> {
        let response = self
            .send(
                self.http
                    .put(format!(
                        "{}/clusters/{cluster}/api-certificate",
                        self.base_of(cluster)
                    ))
                    .json(&serde_json::json!({ "expired": expired })),
            )
            .await?;
        response.json().await.map_err(|e| Error::Sim(e.to_string()))
    }

    /// Turns k8sd's CSR auto-approver of `cluster` on or off (its other annotations stay).
    pub async fn set_auto_approve(&self, cluster: &str, on: bool) -> Result<(), Error> {
        let mut annotations = self.cluster(cluster).await?.annotations;
        if on {
            annotations.insert(AUTO_APPROVE.to_owned(), "true".to_owned());
        } else {
            annotations.remove(AUTO_APPROVE);
        }
        self.set_annotations(cluster, &annotations).await.map(drop)
    }

    /// Lets `node`'s kubelet.conf client certificate expire (or not): its worker `run` then
    /// fails as released k8sd's does when the API server refuses that client.
    pub async fn set_client_certificate_expired(
        &self,
        node: &NodeInfo,
        expired: bool,
    ) -> Result<(), Error> {
        self.send(
            self.http
                .put(format!(
                    "{}/nodes/{}/{}/client-certificate",
                    self.base_of(&node.cluster),
                    node.cluster,
                    node.node
                ))
                .json(&serde_json::json!({ "expired": expired })),
        )
        .await
        .map(drop)
    }

    /// Lets every certificate of `node` expire (or gives it fresh ones): what k8sd reports and
    /// serves ends when the node's expired kubelet certificate ended, and its kubelet serves that
    /// certificate for real, so the workload API server refuses to port-forward to it. A
    /// delivered `run` renews them. Answers the node's new state.
    pub async fn set_certificates_expired(
        &self,
        node: &NodeInfo,
        expired: bool,
    ) -> Result<NodeState, Error> {
        let response = self
            .send(
                self.http
                    .put(format!(
                        "{}/nodes/{}/{}/certificates",
                        self.base_of(&node.cluster),
                        node.cluster,
                        node.node
                    ))
                    .json(&serde_json::json!({ "expired": expired })),
            )
            .await?;
        response.json().await.map_err(|e| Error::Sim(e.to_string()))
    }

    /// Simulates a node reinstall: new k8sd certificate, new initial certificates.
    pub async fn reinstall(
        &self,
        node: &NodeInfo,
        initial_lifetime: Option<Duration>,
    ) -> Result<(), Error> {
        let body = match initial_lifetime {
            Some(lifetime) => json!({ "initialCertLifetimeSeconds": lifetime.as_secs() }),
            None => json!({}),
        };
        self.send(
            self.http
                .post(format!(
                    "{}/nodes/{}/{}/reinstall",
                    self.base_of(&node.cluster),
                    node.cluster,
                    node.node
                ))
                .json(&body),
        )
        .await
        .map(drop)
    }
}
