//! Command-line flags. Every flag can also be set through the environment variable named in its
//! help, so a Deployment can be configured either way.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;

use crate::telemetry::LogArgs;

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

    #[command(flatten)]
    pub log: LogArgs,
}
