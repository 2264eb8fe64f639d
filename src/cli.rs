//! Command-line flags. Every flag can also be set through the environment variable named in its
//! help, so a Deployment can be configured either way.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::telemetry::LogArgs;
use crate::workload::endpoint::Transport;

#[derive(Debug, Parser)]
#[command(
    name = "ck8s-certs",
    version,
    about = "Refreshes Canonical Kubernetes node certificates in place for Cluster API"
)]
pub struct Args {
    /// Kubeconfig of the management cluster. Default: $KUBECONFIG, ~/.kube/config, or the
    /// in-cluster service account.
    #[arg(long, env = "CK8S_CERTS_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Only handle Machines in this namespace. Default: all namespaces.
    #[arg(long, env = "CK8S_CERTS_NAMESPACE")]
    pub namespace: Option<String>,

    /// Only handle objects whose `cluster.x-k8s.io/watch-filter` label has this value
    /// (Cluster API's convention for running several instances of a provider).
    #[arg(long, env = "CK8S_CERTS_WATCH_FILTER")]
    pub watch_filter: Option<String>,

    /// Address of the /healthz and /readyz endpoints.
    #[arg(
        long,
        env = "CK8S_CERTS_HEALTH_BIND_ADDRESS",
        default_value = "0.0.0.0:8081"
    )]
    pub health_bind_address: SocketAddr,

    /// How to reach each node's k8sd: `port-forward` through the workload cluster's API server to
    /// the node's k8sd-proxy pod, or `direct` to the node's InternalIP (only when the
    /// management cluster can route to the nodes).
    #[arg(long, env = "CK8S_CERTS_K8SD_TRANSPORT", value_enum, default_value_t = Transport::PortForward)]
    pub k8sd_transport: Transport,

    /// Deadline of each k8sd call except `run`, including connecting (e.g. 10s).
    #[arg(long, env = "CK8S_CERTS_K8SD_TIMEOUT", value_parser = humantime::parse_duration, default_value = "10s")]
    pub k8sd_timeout: Duration,

    /// Deadline of k8sd's `run`. A worker's `run` waits until its CSRs are approved and signed.
    #[arg(long, env = "CK8S_CERTS_K8SD_RUN_TIMEOUT", value_parser = humantime::parse_duration, default_value = "5m")]
    pub k8sd_run_timeout: Duration,

    /// Attempts per k8sd call when it fails transiently (node starting, connection lost, timeout).
    #[arg(long, env = "CK8S_CERTS_K8SD_ATTEMPTS", default_value_t = 5)]
    pub k8sd_attempts: u32,

    /// Worker refreshes at once in one cluster (control planes are always one at a time).
    #[arg(
        long,
        env = "CK8S_CERTS_MAX_WORKER_REFRESHES_PER_CLUSTER",
        default_value_t = 2
    )]
    pub max_worker_refreshes_per_cluster: usize,

    /// Worker refreshes at once across all clusters.
    #[arg(long, env = "CK8S_CERTS_MAX_WORKER_REFRESHES", default_value_t = 10)]
    pub max_worker_refreshes: usize,

    /// After a control-plane refresh, how long to wait for its k8sd to answer again (it restarts
    /// the control-plane services) before the next control plane of that cluster may start.
    #[arg(long, env = "CK8S_CERTS_SETTLE_TIMEOUT", value_parser = humantime::parse_duration, default_value = "5m")]
    pub settle_timeout: Duration,

    /// How often idle Machines are re-checked (everything else is event-driven).
    #[arg(long, env = "CK8S_CERTS_RESYNC_PERIOD", value_parser = humantime::parse_duration, default_value = "1h")]
    pub resync_period: Duration,

    #[command(flatten)]
    pub log: LogArgs,
}
