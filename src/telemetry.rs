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
    let filter = with_quiet_bodies(filter.unwrap_or_else(|| args.log_level.clone()));
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

/// `filter` with kube-rs's client module at `error`, unless the filter names `kube_client`
/// itself: that module logs a whole answer's body when it cannot decode it (warn) or when a
/// request failed (debug), and a workload API server's answers are a tenant's text (up to the
/// 4 MiB a workload client reads). The controller logs those errors itself, without the body.
fn with_quiet_bodies(filter: String) -> String {
    if filter.contains("kube_client") {
        filter
    } else {
        format!("{filter},kube_client::client=error")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_rs_client_bodies_stay_out_of_the_log_unless_asked_for() {
        assert_eq!(
            with_quiet_bodies("info".into()),
            "info,kube_client::client=error"
        );
        assert_eq!(
            with_quiet_bodies("debug,ck8s_certs=trace".into()),
            "debug,ck8s_certs=trace,kube_client::client=error"
        );
        assert_eq!(
            with_quiet_bodies("kube_client=debug".into()),
            "kube_client=debug"
        );
        assert!(EnvFilter::try_new(with_quiet_bodies("info".into())).is_ok());
    }
}
