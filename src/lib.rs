//! ck8s-certs: keeps the certificates of Canonical Kubernetes nodes alive in place, for Cluster
//! API management clusters.
//!
//! `run` connects to the management cluster, finds which Cluster API version it serves, and
//! serves the health endpoints until it is asked to stop. The refresh controllers plug in here.
//! `preview::run` is the offline `policy preview` subcommand; `main` picks one of the two.

pub mod capi;
pub mod cli;
pub mod controllers;
pub mod failpoint;
pub mod health;
pub mod k8sd;
pub mod metrics;
pub mod policy;
pub mod preview;
pub mod refresh;
pub mod telemetry;
pub mod workload;

use kube::Client;
use tokio::signal::unix::{SignalKind, signal};

/// Errors that stop the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "building a Kubernetes client failed (set --kubeconfig or KUBECONFIG, or run in a cluster): {0}"
    )]
    Client(#[source] kube::Error),
    #[error("reaching the management cluster's API server failed: {0}")]
    Connect(#[source] kube::Error),
    #[error(transparent)]
    Capi(#[from] capi::DiscoveryError),
    #[error("serving health or metrics endpoints on {address} failed: {source}")]
    Health {
        address: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid renewal backoff flags: {0}")]
    Backoff(#[from] policy::BackoffError),
    #[error("installing the signal handler failed: {0}")]
    Signal(#[source] std::io::Error),
}

/// Runs the controller until SIGTERM or SIGINT.
pub async fn run(args: cli::Args) -> Result<(), Error> {
    let client = client(&args).await?;
    let version = client.apiserver_version().await.map_err(Error::Connect)?;
    let machines = capi::discover(&client).await?;
    tracing::info!(
        kubernetes = %version.git_version,
        machine_api = %machines.api_version,
        namespace = args.namespace.as_deref().unwrap_or("<all>"),
        "Connected to the management cluster"
    );

    let health = health::Health::default();
    let server = health::serve(args.health_bind_address, health.clone())
        .await
        .map_err(|source| Error::Health {
            address: args.health_bind_address,
            source,
        })?;

    let backoff = policy::Backoff::new(args.renewal_backoff_min, args.renewal_backoff_max)?;
    let renewal = policy::spec::Settings {
        strict: args.renewal_window_strict,
        backoff,
    };
    let metrics = std::sync::Arc::new(metrics::Metrics::default());
    let metrics_server = metrics::serve(args.metrics_bind_address, metrics.clone())
        .await
        .map_err(|source| Error::Health {
            address: args.metrics_bind_address,
            source,
        })?;
    let controller = controllers::run(client, machines, &args, renewal, metrics, health.clone());
    let mut terminate = signal(SignalKind::terminate()).map_err(Error::Signal)?;
    tokio::select! {
        () = controller => tracing::info!("Controller stopped"),
        _ = terminate.recv() => tracing::info!("Stopping on SIGTERM"),
        _ = tokio::signal::ctrl_c() => tracing::info!("Stopping on SIGINT"),
    }
    health.set_ready(false);
    server.abort();
    metrics_server.abort();
    Ok(())
}

async fn client(args: &cli::Args) -> Result<Client, Error> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|err| Error::Client(kube::Error::InferKubeconfig(err)))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|err| Error::Client(kube::Error::InferKubeconfig(err)))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|err| Error::Client(kube::Error::InferConfig(err)))?,
    };
    Client::try_from(config).map_err(Error::Client)
}
