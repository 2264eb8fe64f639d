//! Command-line flags. Every controller flag can also be set through the environment variable
//! named in its help, so a Deployment can be configured either way.
//!
//! Without a subcommand the binary runs the controller; `policy preview` evaluates a policy file
//! offline ([`crate::preview`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use jiff::Timestamp;

use crate::policy::PolicyDuration;

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
    /// (Cluster API's convention for running several instances of a provider). Requests to the
    /// management cluster then carry the User-Agent `ck8s-certs/<version> (watch-filter=<value>)`.
    #[arg(long, env = "CK8S_CERTS_WATCH_FILTER")]
    pub watch_filter: Option<String>,

    /// Address of the /healthz and /readyz endpoints.
    #[arg(
        long,
        env = "CK8S_CERTS_HEALTH_BIND_ADDRESS",
        default_value = "0.0.0.0:8081"
    )]
    pub health_bind_address: SocketAddr,

    /// Address of the Prometheus /metrics endpoint.
    #[arg(
        long,
        env = "CK8S_CERTS_METRICS_BIND_ADDRESS",
        default_value = "0.0.0.0:8080"
    )]
    pub metrics_bind_address: SocketAddr,

    /// How to reach each node's k8sd: `port-forward` through the workload cluster's API server to
    /// the node's k8sd-proxy pod, or `direct` to the node's InternalIP (only when the
    /// management cluster can route to the nodes).
    #[arg(long, env = "CK8S_CERTS_K8SD_TRANSPORT", value_enum, default_value_t = Transport::PortForward)]
    pub k8sd_transport: Transport,

    /// Deadline of each k8sd call except `run`, including connecting (e.g. 10s).
    #[arg(long, env = "CK8S_CERTS_K8SD_TIMEOUT", value_parser = duration, default_value = "10s")]
    pub k8sd_timeout: Duration,

    /// Deadline of k8sd's `run`. A worker's `run` waits until its CSRs are approved and signed.
    #[arg(long, env = "CK8S_CERTS_K8SD_RUN_TIMEOUT", value_parser = duration, default_value = "5m")]
    pub k8sd_run_timeout: Duration,

    /// How long reaching a node may take in all before a refresh counts it as not answering
    /// (waited for up to --refresh-wait-timeout, then a failure): the workload cluster's reads,
    /// the tunnel to the node's k8sd-proxy pod and, for a worker, finding a Ready control plane
    /// to approve its CSRs. The cluster's refresh place is taken only after (kept for it 5 s).
    #[arg(long, env = "CK8S_CERTS_NODE_CONNECT_TIMEOUT", value_parser = duration, default_value = "2m")]
    pub node_connect_timeout: Duration,

    /// Tries of a k8sd call that times out (the refresh gives its slot back between tries); a
    /// node that refuses connections or answers 503 (restarting) is waited for up to
    /// --refresh-wait-timeout instead.
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

    /// Machine reconciles at once (bounded so that a start-up pass or a burst of changes on a
    /// large fleet queues instead of flooding the API server; refreshes waiting for their turn
    /// hold one each).
    #[arg(long, env = "CK8S_CERTS_CONCURRENT_RECONCILES", default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrent_reconciles: u16,

    /// After a control-plane refresh, how long to wait for its k8sd to answer again (it restarts
    /// the control-plane services) before the next control plane of that cluster may start.
    #[arg(long, env = "CK8S_CERTS_SETTLE_TIMEOUT", value_parser = duration, default_value = "5m")]
    pub settle_timeout: Duration,

    /// How long a refresh waits for a node, a Ready control plane or the workload cluster's API
    /// that does not answer (k8sd restarts services after every refresh; a single control plane
    /// takes the whole workload API with it) before it fails, and how long a worker waits for
    /// the control planes of its cluster before it goes anyway.
    #[arg(long, env = "CK8S_CERTS_REFRESH_WAIT_TIMEOUT", value_parser = duration, default_value = "10m")]
    pub refresh_wait_timeout: Duration,

    /// Finished refreshes kept per Machine as CertificateRefresh records (the audit trail of
    /// `kubectl get certificaterefreshes`, `kubectl ck8s-certs history`), and finished fleet
    /// requests kept per Cluster; 0 keeps no Machine records (a Machine's request then exists
    /// only while its refresh runs).
    #[arg(long, env = "CK8S_CERTS_REFRESH_HISTORY", default_value_t = 10)]
    pub refresh_history: usize,

    /// Warn (Event on the Cluster, `ClusterCertificates` Ready=False ExpiringSoon) this long
    /// before a certificate of a Cluster's management kubeconfig (`<cluster>-kubeconfig`)
    /// expires.
    #[arg(long, env = "CK8S_CERTS_KUBECONFIG_EXPIRY_WARNING", value_parser = duration, default_value = "30d")]
    pub kubeconfig_expiry_warning: Duration,

    /// How often each Cluster's `<cluster>-kubeconfig` Secret is read for its certificates'
    /// expiry, and its workload API server's certificate checked (one `GET /readyz`; jittered per
    /// Cluster; also read exactly when one crosses the warning horizon or expires).
    #[arg(long, env = "CK8S_CERTS_KUBECONFIG_CHECK_INTERVAL", value_parser = duration, default_value = "6h")]
    pub kubeconfig_check_interval: Duration,

    /// Announce a cluster CA this long before it ends (`ClusterCertificates` CARunway=False, an
    /// Event on the Cluster, the alert CK8sCertsClusterCAEndingSoon): k8sd cannot rotate a CA,
    /// so the cluster must be replaced before then.
    #[arg(long, env = "CK8S_CERTS_CA_RUNWAY_WARNING", value_parser = duration, default_value = "365d")]
    pub ca_runway_warning: Duration,

    /// Renew the client certificate of each Cluster's management kubeconfig
    /// (`<cluster>-kubeconfig`) in place when half its lifetime is left (or
    /// `--kubeconfig-renew-before`), signed by the cluster's client CA (`<cluster>-cca`): `off`
    /// (default: that Secret is never read), `dry-run` (everything but the write, shown in
    /// `ClusterCertificates`), `on`. Needs `patch` on Secrets: `kubectl apply -k
    /// config/kubeconfig-renewal` (a role and its admission policy). The bare flag means `on`.
    #[arg(
        long,
        env = "CK8S_CERTS_RENEW_MANAGEMENT_KUBECONFIG",
        value_enum,
        default_value_t = crate::workload::client_certificate::Mode::Off,
        num_args = 0..=1,
        default_missing_value = "on"
    )]
    pub renew_management_kubeconfig: crate::workload::client_certificate::Mode,

    /// With `--renew-management-kubeconfig`: renew when this much of the client certificate's
    /// life is left, instead of half its lifetime (at most half a year).
    #[arg(long, env = "CK8S_CERTS_KUBECONFIG_RENEW_BEFORE", value_parser = duration)]
    pub kubeconfig_renew_before: Option<Duration>,

    /// Let the users of workload kubeconfigs (`<cluster>-kubeconfig`) authenticate with an
    /// `exec` credential plugin. Off by default: anyone who may write that Secret could then run
    /// a command in the controller's pod. Every other refused field (`tokenFile`, file paths,
    /// `auth-provider`, `proxy-url`, basic authentication, impersonation) stays refused. The
    /// bare flag turns it on; `=true|false` and the environment variable take a value.
    #[arg(
        long,
        env = "CK8S_CERTS_INSECURE_KUBECONFIG_EXEC",
        default_value_t = false,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub insecure_kubeconfig_exec: bool,

    /// Changed objects a controller may fall behind a watch by before the watch waits for it
    /// (a test seam: the e2e suite runs with a few, so that a subscription read late, which
    /// would keep the caches from ever syncing on a large fleet, shows on a small one).
    #[arg(long, hide = true, default_value_t = 1024, value_parser = clap::value_parser!(u16).range(1..))]
    pub watch_buffer: u16,

    /// How often idle Machines and the policy reports (`status` of CertificateRenewalPolicies)
    /// are re-checked; changes are acted on when they happen.
    #[arg(long, env = "CK8S_CERTS_RESYNC_PERIOD", value_parser = duration, default_value = "1h")]
    pub resync_period: Duration,

    /// Never renew outside a Scheduled policy's windows, not even when expiry is within the
    /// fail-safe margin (a Warning Event says so instead). The bare flag turns it on;
    /// `--renewal-window-strict=true|false` (also yes/no, on/off, 1/0) and the environment
    /// variable take the same values.
    #[arg(
        long,
        env = "CK8S_CERTS_RENEWAL_WINDOW_STRICT",
        default_value_t = false,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub renewal_window_strict: bool,

    /// Delay before retrying after the first failed automatic renewal; it doubles with each
    /// further failure up to --renewal-backoff-max.
    #[arg(long, env = "CK8S_CERTS_RENEWAL_BACKOFF_MIN", default_value = "1h")]
    pub renewal_backoff_min: crate::policy::PolicyDuration,

    /// Longest delay between failed automatic renewals.
    #[arg(long, env = "CK8S_CERTS_RENEWAL_BACKOFF_MAX", default_value = "32h")]
    pub renewal_backoff_max: crate::policy::PolicyDuration,

    /// Shortest certificate lifetime a refresh may ask for (a trigger's TTL, a request's
    /// `spec.ttl`), in the policy grammar: shorter ones are refused at admission and by the
    /// controller, with this bound in the message.
    #[arg(long, env = "CK8S_CERTS_MIN_TTL", default_value = "1d")]
    pub min_ttl: crate::policy::Ttl,

    /// Longest certificate lifetime a refresh may ask for, in the policy grammar: longer ones are
    /// refused at admission and by the controller.
    #[arg(long, env = "CK8S_CERTS_MAX_TTL", default_value = "1y")]
    pub max_ttl: crate::policy::Ttl,

    /// The ValidatingAdmissionPolicy (and its binding, of the same name) that checks who may
    /// create a CertificateRefresh and that it names its real author. Before a request made by
    /// hand starts, the controller checks that both exist and are older than the request (one
    /// created while they were missing, as during `clusterctl upgrade` or below Kubernetes 1.30,
    /// was never checked and is refused). Empty: no such check, only where another admission
    /// control enforces the same rules. The controller's own SubjectAccessReview for the
    /// request's requester runs either way. The shipped ClusterRole may `get` only the policy
    /// and binding named `ck8s-certs-requests`: another name needs that rule changed too.
    #[arg(
        long,
        env = "CK8S_CERTS_REQUEST_POLICY",
        default_value = "ck8s-certs-requests"
    )]
    pub request_policy: String,

    /// The ValidatingAdmissionPolicy (and its binding, of the same name) that checks who may
    /// write a CertificateRenewalPolicy, and that only a user who may delete Machines asks one
    /// to replace them (`inPlaceImpossible: Replace`). Before such a policy makes the controller
    /// delete a Machine, the controller checks that both exist and are older than the policy's
    /// last write (one written while they were missing was never checked: nothing is deleted,
    /// and a Warning Event says how to have it checked). Empty: no such check, only where
    /// another admission control enforces the same rule. The shipped ClusterRole may `get` only
    /// the policy and binding named `ck8s-certs-renewal-policies`: another name needs that rule
    /// changed too.
    #[arg(
        long,
        env = "CK8S_CERTS_RENEWAL_ADMISSION_POLICY",
        default_value = "ck8s-certs-renewal-policies"
    )]
    pub renewal_admission_policy: String,

    /// The ValidatingAdmissionPolicy (and its binding, of the same name) that lets
    /// `certificates.ck8s.io/requester` name only the user who writes it. A resume of a
    /// renewal policy's automatic renewals (`kubectl ck8s-certs resume`) is recorded as that
    /// user's when both were in force at the resume's write, and as unverified otherwise.
    /// Empty: not checked. The shipped ClusterRole may `get` only the policy and binding named
    /// `ck8s-certs-requester-annotation`: another name needs that rule changed too.
    #[arg(
        long,
        env = "CK8S_CERTS_REQUESTER_POLICY",
        default_value = "ck8s-certs-requester-annotation"
    )]
    pub requester_policy: String,

    /// The fleet-wide circuit breaker: when this many Machines' automatic renewals failed within
    /// --fleet-breaker-period, under any policies, every policy stops its automatic renewals
    /// until a person resumes it (each policy also has a breaker of its own,
    /// `spec.circuitBreaker`). 0 turns it off.
    #[arg(long, env = "CK8S_CERTS_FLEET_BREAKER_FAILURES", default_value_t = 10)]
    pub fleet_breaker_failures: u32,

    /// How far back the fleet-wide circuit breaker counts failures.
    #[arg(long, env = "CK8S_CERTS_FLEET_BREAKER_PERIOD", value_parser = duration, default_value = "30m")]
    pub fleet_breaker_period: Duration,

    /// Serve the admission webhooks (every replica serves them): the trigger webhook marks a new
    /// `v1beta2.k8sd.io/refresh-certificates` request in-progress in the same write, so the CK8s
    /// bootstrap provider's reconciler stands aside; the fleet-trigger and request webhooks write
    /// who asked; the policy webhook refuses a CertificateRenewalPolicy that cannot keep its
    /// promise. Turn off only where that provider is not installed and no
    /// MutatingWebhookConfiguration points at the controller.
    #[arg(long, env = "CK8S_CERTS_WEBHOOK", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub webhook: bool,

    /// HTTPS address of the admission webhooks: `POST /mutate-machine` (the `refresh-trigger`
    /// and `fleet-trigger` webhooks), `POST /mutate-certificaterefresh` (the `refresh-request`
    /// webhook) and `POST /validate-certificaterenewalpolicy` (the `policy-promise` webhook).
    #[arg(
        long,
        env = "CK8S_CERTS_WEBHOOK_BIND_ADDRESS",
        default_value = "0.0.0.0:9443"
    )]
    pub webhook_bind_address: std::net::SocketAddr,

    /// The MutatingWebhookConfiguration whose caBundle the controller keeps.
    #[arg(
        long,
        env = "CK8S_CERTS_WEBHOOK_CONFIGURATION",
        default_value = "ck8s-certs-refresh-trigger"
    )]
    pub webhook_configuration: String,

    /// The ValidatingWebhookConfiguration of the policy webhook (`POST
    /// /validate-certificaterenewalpolicy`, which refuses a CertificateRenewalPolicy that cannot
    /// keep its promise), whose caBundle the controller keeps too.
    #[arg(
        long,
        env = "CK8S_CERTS_WEBHOOK_POLICY_CONFIGURATION",
        default_value = "ck8s-certs-policy-promise"
    )]
    pub webhook_policy_configuration: String,

    /// The Secret (in the controller's namespace) holding the webhook's CA and serving
    /// certificate: shipped empty with the components and filled by the first replica (created
    /// only where the controller may create Secrets), watched by every replica; the serving certificate is
    /// renewed 30 days before it ends, the CA with a third of its lifetime left.
    #[arg(
        long,
        env = "CK8S_CERTS_WEBHOOK_SECRET",
        default_value = "ck8s-certs-webhook-cert"
    )]
    pub webhook_secret: String,

    /// The Service in front of the webhook: the serving certificate names
    /// `<service>.<namespace>.svc`.
    #[arg(
        long,
        env = "CK8S_CERTS_WEBHOOK_SERVICE",
        default_value = "ck8s-certs-webhook-service"
    )]
    pub webhook_service: String,

    /// More names or IP addresses for the serving certificate (comma-separated), for a
    /// configuration that calls the webhook by URL.
    #[arg(long, env = "CK8S_CERTS_WEBHOOK_HOSTS", value_delimiter = ',')]
    pub webhook_hosts: Vec<String>,

    /// Take part in leader election, so that of several replicas only one acts at a time (the
    /// others stand by and take over when it stops or fails). Turn off only for a single replica.
    #[arg(long, env = "CK8S_CERTS_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: bool,

    /// Namespace of the leader election Lease. Default: the controller's own namespace (its
    /// service account's, or the kubeconfig context's), else `default`.
    #[arg(long, env = "CK8S_CERTS_LEADER_ELECT_NAMESPACE")]
    pub leader_elect_namespace: Option<String>,

    /// Name of the leader election Lease. Default: `ck8s-certs`, or `ck8s-certs-<watch filter>`
    /// with --watch-filter, so that instances for different filters do not exclude each other.
    #[arg(long, env = "CK8S_CERTS_LEADER_ELECT_LEASE_NAME")]
    pub leader_elect_lease_name: Option<String>,

    /// How long a standby waits, after the last renewal it saw, before taking the Lease over
    /// from a leader that stopped renewing (whole seconds).
    #[arg(long, env = "CK8S_CERTS_LEADER_ELECT_LEASE_DURATION", value_parser = duration, default_value = "15s")]
    pub leader_elect_lease_duration: Duration,

    /// How long the leader keeps acting without a successful renewal; it then stops and exits
    /// (the pod restarts as a standby). It sends nothing to a node after this long since the
    /// start of its last renewal, suspends included. Lease duration − renew deadline ≥ max(2 s,
    /// lease duration / 5). A management API server that answers no Lease request for longer
    /// (down, or saturated) makes the leader exit: raise it, with the lease duration, where the
    /// management API server may be away that long.
    #[arg(long, env = "CK8S_CERTS_LEADER_ELECT_RENEW_DEADLINE", value_parser = duration, default_value = "10s")]
    pub leader_elect_renew_deadline: Duration,

    /// Interval between attempts to take or renew the Lease (shorter than the renew deadline).
    #[arg(long, env = "CK8S_CERTS_LEADER_ELECT_RETRY_PERIOD", value_parser = duration, default_value = "2s")]
    pub leader_elect_retry_period: Duration,

    /// On SIGTERM or SIGINT no new work starts; refreshes already talking to a node get this
    /// long to finish and record their outcome before the Lease is released and the process
    /// exits. Keep it below the pod's terminationGracePeriodSeconds. A second signal skips it.
    #[arg(long, env = "CK8S_CERTS_SHUTDOWN_GRACE_PERIOD", value_parser = duration, default_value = "60s")]
    pub shutdown_grace_period: Duration,

    #[command(flatten)]
    pub log: LogArgs,

    /// A tool to run instead of the controller.
    #[command(subcommand)]
    pub command: Option<Command>,
}

impl Args {
    /// What workload kubeconfigs may use beyond inline credentials.
    pub fn kubeconfig_vetting(&self) -> crate::workload::Vetting {
        crate::workload::Vetting {
            allow_exec: self.insecure_kubeconfig_exec,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Work with CertificateRenewalPolicy files, offline.
    #[command(subcommand)]
    Policy(PolicyCommand),
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Show what a CertificateRenewalPolicy would do for a Machine whose certificates expire at
    /// --expiry: renew now, defer until when and why, disabled, or invalid (exit code 2, with the
    /// messages the controller would report). Lists the next window openings in each window's
    /// zone and in UTC. Exit code 1: bad arguments or an unreadable file.
    Preview(PreviewArgs),
}

#[derive(Debug, clap::Args)]
pub struct PreviewArgs {
    /// The CertificateRenewalPolicy as YAML or JSON (the whole object, as for kubectl apply);
    /// `-` reads standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub file: PathBuf,

    /// When the Machine's certificates expire (RFC 3339, such as 2026-12-20T00:00:00Z).
    #[arg(long, value_name = "RFC3339")]
    pub expiry: Timestamp,

    /// The instant to decide at (RFC 3339). Default: the current time.
    #[arg(long, value_name = "RFC3339")]
    pub now: Option<Timestamp>,

    /// Failed automatic renewals since the last success (MachineCertificates
    /// status.failedAttempts). Needs --last-failure.
    #[arg(
        long,
        value_name = "N",
        requires = "last_failure",
        allow_negative_numbers = true
    )]
    pub failures: Option<i64>,

    /// When the last automatic renewal failed (status.lastFailureTime, RFC 3339). Alone, it
    /// counts as one failure, as for objects written by older versions.
    #[arg(long, value_name = "RFC3339")]
    pub last_failure: Option<Timestamp>,

    /// Never bypass the windows, even within the fail-safe margin (the controller's strict
    /// windows setting).
    #[arg(long)]
    pub strict: bool,

    /// The Machine's UID (metadata.uid): the times are then that Machine's, at its place in the
    /// policy's spread. Without it, the preview shows when the spread begins.
    #[arg(long, value_name = "UID")]
    pub machine_uid: Option<String>,

    /// Delay after the first failed automatic renewal (the controller's backoff minimum).
    #[arg(long, value_name = "DURATION", default_value = "1h")]
    pub backoff_min: PolicyDuration,

    /// Longest delay between failed automatic renewals (the controller's backoff maximum).
    #[arg(long, value_name = "DURATION", default_value = "32h")]
    pub backoff_max: PolicyDuration,

    /// How many upcoming window openings to list.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u8).range(0..=50))]
    pub window_starts: u8,

    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    #[default]
    Text,
    Json,
}

/// A duration flag (`10s`, `5m`, `1h30m`, …), at most [`MAX_FLAG_DURATION`]: a larger one is a
/// typo, and deadlines computed from it would overflow the clock.
fn duration(text: &str) -> Result<std::time::Duration, String> {
    let value = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if value > MAX_FLAG_DURATION {
        return Err(format!(
            "{text} is longer than {}, the longest duration a flag takes",
            humantime::format_duration(MAX_FLAG_DURATION)
        ));
    }
    Ok(value)
}

/// Ten years.
const MAX_FLAG_DURATION: std::time::Duration = std::time::Duration::from_secs(10 * 365 * 86_400);

/// What the process environment says beyond the flags (which read their own variables): read
/// here only.
pub mod environment {
    use std::io::IsTerminal;

    /// `RUST_LOG`, when set and not empty: a log filter that takes precedence over `--log-level`.
    pub fn log_filter() -> Option<String> {
        std::env::var("RUST_LOG").ok().filter(|f| !f.is_empty())
    }

    /// Whether to colour standard output: a person at a terminal who did not set `NO_COLOR`
    /// (log collectors and pipes get plain text).
    pub fn colour() -> bool {
        std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
    }

    /// `CK8S_CERTS_FAILPOINTS=<name>[,<name>…]`: the crash points the e2e suite enables.
    pub fn failpoints() -> Vec<String> {
        std::env::var("CK8S_CERTS_FAILPOINTS")
            .map(|v| {
                v.split(',')
                    .map(|p| p.trim().to_owned())
                    .filter(|p| !p.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::backoff::{DEFAULT_MAX, DEFAULT_MIN};

    fn preview(args: &[&str]) -> Result<PreviewArgs, clap::Error> {
        let args = Args::try_parse_from(
            ["ck8s-certs", "policy", "preview"]
                .iter()
                .chain(args)
                .copied(),
        )?;
        match args.command {
            Some(Command::Policy(PolicyCommand::Preview(preview))) => Ok(preview),
            None => panic!("no subcommand parsed"),
        }
    }

    #[test]
    fn an_absurd_duration_flag_is_refused_with_the_limit() {
        let error = Args::try_parse_from(["ck8s-certs", "--refresh-wait-timeout", "500000000y"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("longest duration a flag takes"), "{error}");
        assert!(Args::try_parse_from(["ck8s-certs", "--refresh-wait-timeout", "5y"]).is_ok());
        assert!(Args::try_parse_from(["ck8s-certs", "--k8sd-timeout", "soon"]).is_err());
    }

    /// Every controller flag has an environment variable (the reference table, generated by
    /// `make docs`, shows it; the docs test checks that table).
    #[test]
    fn every_flag_has_an_env_var() {
        use clap::CommandFactory;
        let command = Args::command();
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            // Hidden flags are test seams, not settings.
            if matches!(long, "help" | "version") || arg.is_hide_set() {
                continue;
            }
            assert!(
                arg.get_env().is_some(),
                "--{long} has no environment variable"
            );
        }
    }

    #[test]
    fn kubeconfig_exec_is_refused_unless_allowed() {
        let exec = |args: &[&str]| {
            Args::try_parse_from(std::iter::once("ck8s-certs").chain(args.iter().copied()))
                .map(|args| args.kubeconfig_vetting().allow_exec)
                .unwrap()
        };
        assert!(!exec(&[]));
        assert!(exec(&["--insecure-kubeconfig-exec"]));
        assert!(exec(&["--insecure-kubeconfig-exec=true"]));
        assert!(!exec(&["--insecure-kubeconfig-exec=false"]));
    }

    #[test]
    fn leader_election_is_on_unless_turned_off() {
        let args = Args::try_parse_from(["ck8s-certs"]).unwrap();
        assert!(args.leader_elect);
        assert_eq!(args.shutdown_grace_period, Duration::from_secs(60));
        let args = Args::try_parse_from(["ck8s-certs", "--leader-elect=false"]).unwrap();
        assert!(!args.leader_elect);
        let args = Args::try_parse_from(["ck8s-certs", "--leader-elect"]).unwrap();
        assert!(args.leader_elect);
    }

    #[test]
    fn strict_windows_take_a_bare_flag_or_a_boolean() {
        let strict = |args: &[&str]| {
            Args::try_parse_from(std::iter::once("ck8s-certs").chain(args.iter().copied()))
                .map(|args| args.renewal_window_strict)
        };
        let rows: &[(&[&str], bool)] = &[
            (&[], false),
            (&["--renewal-window-strict"], true),
            (&["--renewal-window-strict=true"], true),
            (&["--renewal-window-strict=false"], false),
            (&["--renewal-window-strict=yes"], true),
            (&["--renewal-window-strict=no"], false),
            (&["--renewal-window-strict=on"], true),
            (&["--renewal-window-strict=off"], false),
            (&["--renewal-window-strict=1"], true),
            (&["--renewal-window-strict=0"], false),
            (&["--renewal-window-strict", "false"], false),
            (&["--renewal-window-strict", "true"], true),
            // A bare flag before another flag does not swallow it.
            (&["--renewal-window-strict", "--leader-elect=false"], true),
        ];
        for (args, expected) in rows {
            assert_eq!(strict(args).unwrap(), *expected, "{args:?}");
        }
        for bad in ["--renewal-window-strict=maybe", "--renewal-window-strict="] {
            assert!(strict(&[bad]).is_err(), "{bad}");
        }
        // The environment variable's value goes through the argument's value parser, as
        // `--flag=value` does. Setting a process environment variable in a multi-threaded test
        // is unsound, so the parser the argument names is exercised directly.
        use clap::CommandFactory;
        use clap::builder::TypedValueParser;
        let command = Args::command();
        let arg = command
            .get_arguments()
            .find(|arg| arg.get_id() == "renewal_window_strict")
            .unwrap();
        assert_eq!(
            arg.get_env(),
            Some(std::ffi::OsStr::new("CK8S_CERTS_RENEWAL_WINDOW_STRICT"))
        );
        let parser = clap::builder::BoolishValueParser::new();
        let parse =
            |value: &str| parser.parse_ref(&command, Some(arg), std::ffi::OsStr::new(value));
        for (value, expected) in [
            ("true", true),
            ("false", false),
            ("1", true),
            ("off", false),
        ] {
            assert_eq!(parse(value).unwrap(), expected, "{value}");
        }
        assert!(parse("enabled").is_err());
    }

    #[test]
    fn no_subcommand_runs_the_controller() {
        let args = Args::try_parse_from(["ck8s-certs", "--k8sd-attempts", "3"]).unwrap();
        assert!(args.command.is_none());
        assert_eq!(args.k8sd_attempts, 3);
    }

    #[test]
    fn preview_defaults_are_the_controllers() {
        let args = preview(&["-f", "p.yaml", "--expiry", "2026-12-20T00:00:00Z"]).unwrap();
        assert_eq!(args.backoff_min, DEFAULT_MIN);
        assert_eq!(args.backoff_max, DEFAULT_MAX);
        assert_eq!(args.output, OutputFormat::Text);
        assert_eq!(args.now, None);
        assert!(!args.strict);
    }

    #[test]
    fn preview_flags() {
        let args = preview(&[
            "--filename=-",
            "--expiry=2026-12-20T00:00:00+01:00",
            "--now=2026-11-20T12:00:00Z",
            "--failures=-1",
            "--last-failure=2026-11-20T11:00:00Z",
            "--strict",
            "-o",
            "json",
        ])
        .unwrap();
        assert_eq!(args.file, PathBuf::from("-"));
        assert_eq!(args.expiry.to_string(), "2026-12-19T23:00:00Z");
        assert_eq!(args.failures, Some(-1));
        assert!(args.strict);
        assert_eq!(args.output, OutputFormat::Json);
        let error = preview(&[
            "-f",
            "p.yaml",
            "--expiry",
            "2026-12-20T00:00:00Z",
            "--failures",
            "2",
        ])
        .unwrap_err();
        assert_eq!(
            error.kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
        assert!(preview(&["-f", "p.yaml", "--expiry", "tomorrow"]).is_err());
        assert!(
            preview(&[
                "-f",
                "p.yaml",
                "--expiry",
                "2026-12-20T00:00:00Z",
                "--backoff-min",
                "0s"
            ])
            .is_err()
        );
    }
}
