//! `kubectl ck8s-certs`: the operator's view of a fleet, as a kubectl plugin. The controller's
//! binary installed (or linked) under the name `kubectl-ck8s_certs` is the plugin: it reads the
//! user's kubeconfig and acts with the user's rights.
//!
//! - `status`: one table across namespaces and clusters (what expires when, what happens next,
//!   how the last refresh went);
//! - `explain <machine>`: why a renewal is deferred or failing, which policy governs it and what
//!   happens next;
//! - `renew <machine>… | --cluster <c>`: the same request as the annotation, optionally waiting;
//! - `history [<machine>] [--cluster <c>]`: the refreshes recorded, newest first;
//! - `policy preview`: what a policy file would decide, offline.

mod explain;
mod history;
mod output;
mod renew;
mod resume;
mod status;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::cli::PreviewArgs;

/// The executable name kubectl looks for (`kubectl ck8s-certs` runs `kubectl-ck8s_certs`).
pub const EXECUTABLE: &str = "kubectl-ck8s_certs";

/// Whether the process was started as the plugin.
pub fn invoked_as_plugin() -> bool {
    std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .is_some_and(|name| name == EXECUTABLE)
}

#[derive(Debug, Parser)]
#[command(
    name = "kubectl ck8s-certs",
    version,
    about = "Certificates of Canonical Kubernetes nodes managed by Cluster API: what expires when, what will happen, what went wrong, renew now"
)]
pub struct PluginArgs {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true, env = "KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,

    /// Namespace (default: the context's, else `default`).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,

    #[command(subcommand)]
    pub command: PluginCommand,
}

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// One line per CK8s Machine: role, expiry, time left, next renewal and why, the last refresh
    /// and its outcome.
    Status(status::StatusArgs),
    /// Why a Machine's renewal is deferred or failing, which policy governs it, what happens
    /// next and when.
    Explain(explain::ExplainArgs),
    /// Renew the certificates of Machines now (the `v1beta2.k8sd.io/refresh-certificates`
    /// annotation), optionally waiting for the outcome.
    Renew(renew::RenewArgs),
    /// Who refreshed what, when, with which TTL, and how it went (the CertificateRefresh
    /// records, newest first).
    History(history::HistoryArgs),
    /// CertificateRenewalPolicy files, offline.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Resume a CertificateRenewalPolicy's automatic renewals after its circuit breaker stopped
    /// them (recorded in its status with who resumed them).
    Resume(resume::ResumeArgs),
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// What a policy would decide for a Machine whose certificates expire at --expiry.
    Preview(PreviewArgs),
}

/// `-o`: human tables by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    #[default]
    Table,
    Json,
    Yaml,
}

/// Errors the plugin reports (exit code 1).
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("{0}")]
    Usage(String),
    #[error("loading the kubeconfig failed: {0}")]
    Kubeconfig(String),
    #[error(transparent)]
    Discovery(#[from] crate::capi_version::DiscoveryError),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("the API server answered: {0}")]
    Api(#[from] kube::Error),
    #[error("{0}")]
    Failed(String),
    #[error("writing the output failed: {0}")]
    Output(#[from] std::io::Error),
}

/// Runs the plugin with the process arguments.
pub fn main() -> ExitCode {
    let args = match PluginArgs::try_parse() {
        Ok(args) => args,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    if let PluginCommand::Policy(PolicyCommand::Preview(preview)) = &args.command {
        return crate::preview::run(preview);
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(1)
        }
    }
}

/// The user's client and the namespace to use.
pub struct Session {
    pub client: Client,
    pub namespace: String,
    pub capi: ck8s_certs_api::machine::CapiVersion,
}

async fn connect(args: &PluginArgs) -> Result<Session, PluginError> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).map_err(|e| PluginError::Kubeconfig(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options).await
        }
        None => kube::Config::from_kubeconfig(&options).await,
    }
    .map_err(|e| PluginError::Kubeconfig(e.to_string()))?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).map_err(|e| PluginError::Kubeconfig(e.to_string()))?;
    let capi = crate::capi_version::discover(&client).await?;
    Ok(Session {
        client,
        namespace,
        capi,
    })
}

async fn run(args: PluginArgs) -> Result<(), PluginError> {
    let session = connect(&args).await?;
    let mut out = std::io::stdout().lock();
    match &args.command {
        PluginCommand::Status(status) => status::run(&session, status, &mut out).await,
        PluginCommand::Explain(explain) => explain::run(&session, explain, &mut out).await,
        PluginCommand::Renew(renew) => renew::run(&session, renew, &mut out).await,
        PluginCommand::History(history) => history::run(&session, history, &mut out).await,
        PluginCommand::Resume(resume) => resume::run(&session, resume, &mut out).await,
        PluginCommand::Policy(_) => Ok(()),
    }
}
