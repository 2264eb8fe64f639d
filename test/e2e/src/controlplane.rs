//! Real control planes: one etcd and one kube-apiserver per cluster (management and workload
//! clusters alike), sharing the etcd under different prefixes. Loopback only, TLS from the
//! environment CA, RBAC on, an admin token, and the kubelet client settings that make
//! `pods/portforward` reach the simulated nodes.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::pki::{Ca, CertFiles};
use crate::process::Process;
use crate::{Binaries, Error};

/// A free TCP port on 127.0.0.1 (the kernel picks it; we release it for the child to bind).
pub fn free_port() -> Result<u16, Error> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| Error::io(Path::new("127.0.0.1:0"), e))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::io(Path::new("127.0.0.1:0"), e))
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
        .arg("--unsafe-no-fsync");
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
    pub kubelet_client: CertFiles,
    pub service_account: CertFiles,
    pub token_file: PathBuf,
    pub admin_token: String,
}

pub struct ApiServer {
    pub name: String,
    pub process: Process,
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
    ) -> Result<Self, Error> {
        let port = free_port()?;
        let mut command = Command::new(&bins.kube_apiserver);
        command
            .arg(format!("--etcd-servers={etcd}"))
            .arg(format!("--etcd-prefix=/{name}"))
            .arg(format!("--secure-port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg("--advertise-address=127.0.0.1")
            .arg(format!(
                "--cert-dir={}",
                dir.join(format!("{name}-certs")).display()
            ))
            .arg(format!("--tls-cert-file={}", pki.serving.cert.display()))
            .arg(format!(
                "--tls-private-key-file={}",
                pki.serving.key.display()
            ))
            .arg(format!("--client-ca-file={}", pki.ca.files.cert.display()))
            .arg(format!("--token-auth-file={}", pki.token_file.display()))
            .arg("--authorization-mode=RBAC")
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg(format!(
                "--service-account-key-file={}",
                pki.service_account.cert.display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                pki.service_account.key.display()
            ))
            .arg("--service-cluster-ip-range=10.96.0.0/16")
            .arg(format!(
                "--kubelet-client-certificate={}",
                pki.kubelet_client.cert.display()
            ))
            .arg(format!(
                "--kubelet-client-key={}",
                pki.kubelet_client.key.display()
            ))
            .arg(format!(
                "--kubelet-certificate-authority={}",
                pki.ca.files.cert.display()
            ))
            .arg("--kubelet-preferred-address-types=InternalIP")
            // No controller-manager runs, so nothing would create service account tokens.
            .arg("--disable-admission-plugins=ServiceAccount")
            .arg("--enable-priority-and-fairness=false")
            // Several API servers share one etcd: don't let them fight over the kubernetes endpoint.
            .arg("--endpoint-reconciler-type=none")
            .arg("--profiling=false")
            // Writes are audited so tests can count what the controller writes.
            .arg(format!(
                "--audit-policy-file={}",
                audit_policy(dir)?.display()
            ))
            .arg(format!(
                "--audit-log-path={}",
                dir.join(format!("audit-{name}.log")).display()
            ))
            .arg("--v=1");
        let process = Process::spawn(&format!("kube-apiserver-{name}"), command, dir)?;
        let kubeconfig_yaml = kubeconfig(name, port, &pki.ca.pem, &pki.admin_token);
        let kubeconfig = dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&kubeconfig, &kubeconfig_yaml).map_err(|e| Error::io(&kubeconfig, e))?;
        Ok(Self {
            name: name.to_owned(),
            process,
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
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| Error::Setup(e.to_string()))?;
            if let Ok(text) = client.request_text(request).await
                && text.trim() == "ok"
            {
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

/// Metadata-level audit of every write, nothing else.
fn audit_policy(dir: &Path) -> Result<PathBuf, Error> {
    let path = dir.join("audit-policy.yaml");
    if path.exists() {
        // Shared by the environment's API servers: written once, never while one reads it.
        return Ok(path);
    }
    let policy = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n  verbs: [create, update, patch, delete]\n- level: None\n";
    let partial = dir.join("audit-policy.yaml.partial");
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
    pub name: String,
    #[serde(default)]
    pub subresource: String,
}

/// The writes audited so far by the API server `name` (e.g. "management").
pub fn audited_writes(dir: &Path, name: &str) -> Vec<AuditEvent> {
    std::fs::read_to_string(dir.join(format!("audit-{name}.log")))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<AuditEvent>(line).ok())
        .filter(|e| e.stage == "ResponseComplete")
        .collect()
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
