//! Structured logging. Text for people, JSON for log pipelines; the level comes from
//! `--log-level`, or `RUST_LOG` for per-module filters.

use clap::{Args, ValueEnum};
use tracing_subscriber::EnvFilter;

#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, env = "CK8S_CERTS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log level (error, warn, info, debug, trace) or a RUST_LOG-style filter such as
    /// `info,ck8s_certs::k8sd=debug`. RUST_LOG, when set, wins.
    #[arg(long, env = "CK8S_CERTS_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("invalid log filter {filter:?}: {source}")]
    Filter {
        filter: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("a global logger was already installed")]
    AlreadyInstalled,
}

/// Installs the global logger: `filter` (`RUST_LOG`) over `--log-level` when given, colours
/// when `ansi`.
pub fn init(args: &LogArgs, filter: Option<String>, ansi: bool) -> Result<(), TelemetryError> {
    let filter = filter.unwrap_or_else(|| args.log_level.clone());
    let env_filter =
        EnvFilter::try_new(&filter).map_err(|source| TelemetryError::Filter { filter, source })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_ansi(ansi);
    let result = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|_| TelemetryError::AlreadyInstalled)
}
