//! Prometheus metrics (`--metrics-bind-address`, path `/metrics`). Labels are bounded: origin,
//! reason, role, endpoint, outcome, controller and category are small fixed sets; the
//! per-machine expiry gauge is the one per-object family, because "what expires when" is what the
//! fleet dashboard needs, and it is read from the controller's caches when scraped
//! ([`MachineExpiries`]). `config/monitoring` holds the alerts and dashboard built on them.
//!
//! Names follow Prometheus conventions: the `ck8s_certs` prefix comes from the registry, and
//! counters get their `_total` suffix from the encoder, so `renewal_deferred` is exported as
//! `ck8s_certs_renewal_deferred_total`. Label values are snake_case (`outside_window`).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

mod expiry;
mod halted;

pub use expiry::{ExpirySource, MachineExpiries, MachineExpiry, MachineLabels};
pub use halted::{HaltedPolicies, HaltedPolicy, HaltedSource};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OriginLabels {
    /// manual or policy.
    pub origin: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefreshLabels {
    pub origin: String,
    pub role: String,
    /// succeeded or failed.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KubeconfigLabels {
    pub namespace: String,
    pub cluster: String,
    /// client, ca or client_ca (`<cluster>-cca`'s, with `--renew-management-kubeconfig` only).
    pub certificate: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    pub namespace: String,
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct K8sdCallLabels {
    /// [`K8sdEndpoint::as_str`].
    pub endpoint: String,
    /// `success`, a [`K8sdError::category`](crate::k8sd::K8sdError::category), or `cancelled`.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    pub endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// [`Controller::as_str`].
    pub controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileErrorLabels {
    pub controller: String,
    /// The error's `category()`: a small fixed set of snake_case names.
    pub category: String,
}

/// The k8sd endpoints a call can go to, as the `endpoint` label names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum K8sdEndpoint {
    /// `GET /`: is k8sd answering (approver selection, settling after a refresh).
    Probe,
    CertificatesExpiry,
    Plan,
    Run,
    Approve,
    /// Any other path, so that the label stays bounded whatever a caller sends.
    Other,
}

impl K8sdEndpoint {
    pub const ALL: [Self; 6] = [
        Self::Probe,
        Self::CertificatesExpiry,
        Self::Plan,
        Self::Run,
        Self::Approve,
        Self::Other,
    ];

    /// The endpoint of a request path (`/1.0/x/capi/refresh-certs/plan` → `Plan`).
    pub fn of_path(path: &str) -> Self {
        use crate::k8sd::wire::path;
        match path {
            path::ROOT => Self::Probe,
            path::CERTIFICATES_EXPIRY => Self::CertificatesExpiry,
            path::PLAN => Self::Plan,
            path::RUN => Self::Run,
            path::APPROVE => Self::Approve,
            _ => Self::Other,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Probe => "probe",
            Self::CertificatesExpiry => "certificates_expiry",
            Self::Plan => "plan",
            Self::Run => "run",
            Self::Approve => "approve",
            Self::Other => "other",
        }
    }
}

/// The `outcome` label of a finished k8sd call.
pub fn k8sd_outcome<T>(result: &Result<T, crate::k8sd::K8sdError>) -> &'static str {
    match result {
        Ok(_) => "success",
        Err(err) => err.category(),
    }
}

/// The `outcome` of a call whose caller stopped waiting (a worker's `approve` when `run`
/// answered first, a refresh dropped at shutdown): counted, not timed.
pub const K8SD_CANCELLED: &str = "cancelled";

/// The k8sd call metrics, handed to every k8sd session (cheap to clone: the families are shared).
#[derive(Clone, Debug)]
pub struct K8sdCalls {
    pub requests: Family<K8sdCallLabels, Counter>,
    pub duration: Family<EndpointLabels, Histogram>,
}

impl Default for K8sdCalls {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            duration: Family::new_with_constructor(|| {
                // 5 ms … ~15 min: a probe through a port-forward takes tens of ms, a worker's
                // `run` waits for its CSRs up to --k8sd-run-timeout (5 min by default).
                Histogram::new(exponential_buckets(0.005, 3.0, 12))
            }),
        }
    }
}

impl K8sdCalls {
    /// Starts timing one call; [`K8sdCall::finish`] records it.
    pub fn start(&self, endpoint: K8sdEndpoint) -> K8sdCall {
        K8sdCall {
            calls: self.clone(),
            endpoint,
            started: Instant::now(),
            finished: false,
        }
    }
}

/// One k8sd call in flight. Dropped unfinished, it counts as [`K8SD_CANCELLED`].
#[must_use = "a call that is not finished counts as cancelled"]
pub struct K8sdCall {
    calls: K8sdCalls,
    endpoint: K8sdEndpoint,
    started: Instant,
    finished: bool,
}

impl K8sdCall {
    /// Records the call's outcome and duration.
    pub fn finish(mut self, outcome: &'static str) {
        self.finished = true;
        self.calls
            .duration
            .get_or_create(&EndpointLabels {
                endpoint: self.endpoint.as_str().to_owned(),
            })
            .observe(self.started.elapsed().as_secs_f64());
        self.count(outcome);
    }

    fn count(&self, outcome: &'static str) {
        self.calls
            .requests
            .get_or_create(&K8sdCallLabels {
                endpoint: self.endpoint.as_str().to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }
}

impl Drop for K8sdCall {
    fn drop(&mut self) {
        if !self.finished {
            self.count(K8SD_CANCELLED);
        }
    }
}

/// The controllers whose reconciles are timed (the `controller` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Controller {
    Machine,
    Policy,
    /// The management kubeconfig reader (`ClusterCertificates`).
    Kubeconfig,
}

impl Controller {
    pub const ALL: [Self; 3] = [Self::Machine, Self::Policy, Self::Kubeconfig];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Machine => "machine",
            Self::Policy => "policy",
            Self::Kubeconfig => "kubeconfig",
        }
    }
}

/// Every value of each bounded label: `(family, label, values)`, the family without the
/// `ck8s_certs_` prefix. The metrics table of docs/reference.md is generated from these and the
/// registry (`make docs`), and the docs' `label="value"` selectors are checked against them;
/// the tests check the code's producers against them. Labels not listed (`namespace`,
/// `cluster`, `machine`) name objects.
pub fn label_values() -> Vec<(&'static str, &'static str, Vec<&'static str>)> {
    const ROLES: [&str; 2] = ["control-plane", "worker"];
    const ORIGINS: [&str; 3] = ["manual", "policy", "fleet"];
    let endpoints: Vec<&str> = K8sdEndpoint::ALL.iter().map(|e| e.as_str()).collect();
    let controllers: Vec<&str> = Controller::ALL.iter().map(|c| c.as_str()).collect();
    let k8sd = crate::k8sd::K8sdError::CATEGORIES;
    let outcomes = [&["success"][..], &k8sd[..], &[K8SD_CANCELLED][..]].concat();
    // Reconcile errors: the management API, the workload cluster, reading the expiry (k8sd), or
    // a reconcile that panicked (src/controllers/panics.rs).
    let categories = [&["kube", "workload"][..], &k8sd[..], &["panic"][..]].concat();
    vec![
        (
            "certificate_expiry_timestamp_seconds",
            "role",
            ROLES.to_vec(),
        ),
        (
            "renewal_overdue_since_timestamp_seconds",
            "role",
            ROLES.to_vec(),
        ),
        (
            "renewals_halted_since_timestamp_seconds",
            "scope",
            vec!["policy", "fleet"],
        ),
        (
            "kubeconfig_expiry_timestamp_seconds",
            "certificate",
            vec!["client", "ca", "client_ca"],
        ),
        (
            "kubeconfig_renewals",
            "result",
            vec!["renewed", "dry_run", "refused", "failed", "not_due"],
        ),
        ("renewals_started", "origin", ORIGINS.to_vec()),
        ("renewals_succeeded", "origin", ORIGINS.to_vec()),
        ("renewals_failed", "origin", ORIGINS.to_vec()),
        (
            "renewal_deferred",
            "reason",
            vec![
                "backoff",
                "outside_window",
                "staggered",
                "in_place_impossible",
                "machine_deleting",
                "remediation_requested",
                "in_place_upgrade",
                "rolling_out",
                "api_not_ready",
                "control_plane_not_ready",
                "renewals_halted",
                "canaries_pending",
                "canary_failed",
            ],
        ),
        ("renewal_bypassed", "reason", vec!["expiry_imminent"]),
        ("renewal_config_invalid", "reason", vec!["config_invalid"]),
        ("refresh_duration_seconds", "origin", ORIGINS.to_vec()),
        ("refresh_duration_seconds", "role", ROLES.to_vec()),
        (
            "refresh_duration_seconds",
            "result",
            vec!["succeeded", "failed"],
        ),
        ("k8sd_requests", "endpoint", endpoints.clone()),
        ("k8sd_requests", "outcome", outcomes),
        ("k8sd_request_duration_seconds", "endpoint", endpoints),
        (
            "reconcile_duration_seconds",
            "controller",
            controllers.clone(),
        ),
        ("reconcile_errors", "controller", controllers),
        ("reconcile_errors", "category", categories),
    ]
}

/// Every metric the controller exports.
pub struct Metrics {
    registry: Registry,
    pub expiry: MachineExpiries,
    /// The policies whose circuit breaker is open, read from the policy cache when scraped.
    pub halted: HaltedPolicies,
    /// NotAfter of each Cluster's `<cluster>-kubeconfig` certificates.
    pub kubeconfig_expiry: Family<KubeconfigLabels, Gauge<f64, AtomicU64>>,
    /// `--renew-management-kubeconfig` attempts by `result`: `renewed`, `dry_run`, `refused`,
    /// `failed`, `not_due` (renewed meanwhile by someone else).
    pub kubeconfig_renewals: Family<ResultLabels, Counter>,
    /// Since when a cluster's node certificates have been expired (the earliest recorded
    /// expiry that passed); no series while none has.
    pub cluster_expired_since: Family<ClusterLabels, Gauge<f64, AtomicU64>>,
    /// `--ca-runway-warning`, in seconds: the shipped CA alert compares each cluster CA's end
    /// with it, so the flag is the alert's one setting.
    pub ca_runway_warning: Gauge<f64, AtomicU64>,
    pub renewals_started: Family<OriginLabels, Counter>,
    pub renewals_succeeded: Family<OriginLabels, Counter>,
    pub renewals_failed: Family<OriginLabels, Counter>,
    /// `reason`: [`reason_label`] of the verdict (`backoff`, `outside_window`,
    /// `staggered`).
    pub renewal_deferred: Family<ReasonLabels, Counter>,
    /// `reason`: [`expiry_imminent`], the one reason the windows are bypassed.
    pub renewal_bypassed: Family<ReasonLabels, Counter>,
    /// Machines deleted to be replaced (`inPlaceImpossible: Replace`).
    pub machines_replaced: Counter,
    pub refresh_duration: Family<RefreshLabels, Histogram>,
    pub in_progress: Gauge,
    pub policy_invalid: Family<ReasonLabels, Counter>,
    /// Worker refresh attempts whose CSRs did not pass verification (none approved).
    pub unverified_csrs: Counter,
    pub leader: Gauge,
    pub k8sd: K8sdCalls,
    pub reconcile_duration: Family<ControllerLabels, Histogram>,
    pub reconcile_errors: Family<ReconcileErrorLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("ck8s_certs");
        let expiry = MachineExpiries::default();
        registry.register_collector(Box::new(expiry.clone()));
        let halted = HaltedPolicies::default();
        registry.register_collector(Box::new(halted.clone()));
        let kubeconfig_expiry = Family::<KubeconfigLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "kubeconfig_expiry_timestamp_seconds",
            "NotAfter of the management kubeconfig's certificates of a workload cluster (<cluster>-kubeconfig: certificate client or ca), and of the client CA that signs its client certificate (<cluster>-cca: certificate client_ca, with --renew-management-kubeconfig only), as a Unix timestamp",
            kubeconfig_expiry.clone(),
        );
        let kubeconfig_renewals = Family::<ResultLabels, Counter>::default();
        registry.register(
            "kubeconfig_renewals",
            "Renewals of management kubeconfig client certificates tried (--renew-management-kubeconfig), by result: renewed, dry_run, refused, failed, not_due",
            kubeconfig_renewals.clone(),
        );
        let cluster_expired_since = Family::<ClusterLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "cluster_certificates_expired_since_timestamp_seconds",
            "Since when node certificates of a workload cluster have been expired (the earliest expiry its Machines record that has passed), as a Unix timestamp; no series while none has",
            cluster_expired_since.clone(),
        );
        let ca_runway_warning = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "ca_runway_warning_seconds",
            "--ca-runway-warning in seconds: how long before a cluster CA ends it is announced (ClusterCertificates CARunway, alert CK8sCertsClusterCAEndingSoon)",
            ca_runway_warning.clone(),
        );
        let renewals_started = Family::<OriginLabels, Counter>::default();
        registry.register(
            "renewals_started",
            "Certificate refreshes started, by origin",
            renewals_started.clone(),
        );
        let renewals_succeeded = Family::<OriginLabels, Counter>::default();
        registry.register(
            "renewals_succeeded",
            "Certificate refreshes that succeeded, by origin",
            renewals_succeeded.clone(),
        );
        let renewals_failed = Family::<OriginLabels, Counter>::default();
        registry.register(
            "renewals_failed",
            "Certificate refreshes that failed, by origin",
            renewals_failed.clone(),
        );
        let renewal_deferred = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "renewal_deferred",
            "Renewal verdicts that held a due renewal back, by reason (backoff, outside_window, staggered; in_place_impossible: a worker that must be replaced; machine_deleting, remediation_requested, in_place_upgrade, rolling_out, api_not_ready, control_plane_not_ready: a closed pre-flight gate of its cluster; renewals_halted: its policy's circuit breaker is open; canaries_pending, canary_failed: it waits for its policy's canaries), counted when the verdict changes",
            renewal_deferred.clone(),
        );
        let renewal_bypassed = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "renewal_bypassed",
            "Renewals run outside the maintenance windows, by reason (expiry_imminent: expiry was within the fail-safe margin)",
            renewal_bypassed.clone(),
        );
        let machines_replaced = Counter::default();
        registry.register(
            "machines_replaced",
            "Machines deleted so that their MachineSet creates new ones, because they could not be refreshed in place and their renewal policy says inPlaceImpossible: Replace",
            machines_replaced.clone(),
        );
        let refresh_duration = Family::<RefreshLabels, Histogram>::new_with_constructor(|| {
            // 0.1 s … ~27 min: a control-plane refresh takes about a second, a worker's waits
            // for CSR approval.
            Histogram::new(exponential_buckets(0.1, 2.0, 15))
        });
        registry.register(
            "refresh_duration_seconds",
            "Wall time of certificate refreshes",
            refresh_duration.clone(),
        );
        let in_progress = Gauge::default();
        registry.register(
            "operations_in_progress",
            "Certificate refreshes in flight",
            in_progress.clone(),
        );
        let policy_invalid = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "renewal_config_invalid",
            "Renewal verdicts that found the governing policy unusable (invalid or conflicting), counted when the verdict changes",
            policy_invalid.clone(),
        );
        let unverified_csrs = Counter::default();
        registry.register(
            "unverified_csrs",
            "Worker refresh attempts whose CSRs did not pass the controller's check (requester, signer, usages, subject, SANs, lifetime, signature): none was approved, their seed's CSRs were denied",
            unverified_csrs.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica leads (does the work), 0 while it stands by",
            leader.clone(),
        );
        let k8sd = K8sdCalls::default();
        registry.register(
            "k8sd_requests",
            "Calls to a node's k8sd, by endpoint and outcome (success, or the error's category)",
            k8sd.requests.clone(),
        );
        registry.register(
            "k8sd_request_duration_seconds",
            "Wall time of calls to a node's k8sd, connecting included, by endpoint",
            k8sd.duration.clone(),
        );
        let reconcile_duration =
            Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
                // 1 ms … ~80 min (0.001 × 3^14 s): a reconcile at rest reads caches only; one
                // carrying a refresh lasts as long as the refresh (a worker's waits for its turn
                // and CSRs).
                Histogram::new(exponential_buckets(0.001, 3.0, 15))
            });
        registry.register(
            "reconcile_duration_seconds",
            "Wall time of reconciles, by controller (machine, policy, kubeconfig)",
            reconcile_duration.clone(),
        );
        let reconcile_errors = Family::<ReconcileErrorLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Reconciles that failed (and are retried), by controller and error category",
            reconcile_errors.clone(),
        );
        // Alerts use increase(), which misses the first sample of a series that did not exist
        // before: start the counters whose label values are known at 0.
        for reason in [
            crate::policy::DeferReason::Backoff,
            crate::policy::DeferReason::OutsideWindow,
            crate::policy::DeferReason::Staggered,
        ] {
            let _ = renewal_deferred.get_or_create(&reason_label(reason.as_str()));
        }
        // The verdict's own hold of a Machine that must be replaced (not a policy's deferral).
        let _ = renewal_deferred.get_or_create(&reason_label(
            ck8s_certs_api::reasons::condition_reasons::IN_PLACE_IMPOSSIBLE,
        ));
        // And its holds for a closed pre-flight gate.
        for gate in ck8s_certs_api::reasons::condition_reasons::GATES {
            let _ = renewal_deferred.get_or_create(&reason_label(gate));
        }
        // And its holds under a policy whose circuit breaker is open, or whose canaries go first.
        for reason in [
            ck8s_certs_api::reasons::condition_reasons::RENEWALS_HALTED,
            ck8s_certs_api::reasons::condition_reasons::CANARIES_PENDING,
            ck8s_certs_api::reasons::condition_reasons::CANARY_FAILED,
        ] {
            let _ = renewal_deferred.get_or_create(&reason_label(reason));
        }
        let _ = renewal_bypassed.get_or_create(&expiry_imminent());
        for origin in [
            ck8s_certs_api::machine_certificates::Origin::Manual,
            ck8s_certs_api::machine_certificates::Origin::Policy,
            ck8s_certs_api::machine_certificates::Origin::Fleet,
        ] {
            let labels = self::origin(origin);
            let _ = renewals_started.get_or_create(&labels);
            let _ = renewals_succeeded.get_or_create(&labels);
            let _ = renewals_failed.get_or_create(&labels);
        }
        Self {
            registry,
            expiry,
            halted,
            kubeconfig_expiry,
            kubeconfig_renewals,
            cluster_expired_since,
            ca_runway_warning,
            renewals_started,
            renewals_succeeded,
            renewals_failed,
            renewal_deferred,
            renewal_bypassed,
            machines_replaced,
            refresh_duration,
            in_progress,
            policy_invalid,
            unverified_csrs,
            leader,
            k8sd,
            reconcile_duration,
            reconcile_errors,
        }
    }
}

impl Metrics {
    /// Records one reconcile of `controller`: its wall time, and its error's category if it
    /// failed.
    pub fn reconciled(
        &self,
        controller: Controller,
        elapsed: Duration,
        error: Option<&'static str>,
    ) {
        let controller = controller.as_str().to_owned();
        self.reconcile_duration
            .get_or_create(&ControllerLabels {
                controller: controller.clone(),
            })
            .observe(elapsed.as_secs_f64());
        if let Some(category) = error {
            self.reconcile_errors
                .get_or_create(&ReconcileErrorLabels {
                    controller,
                    category: category.to_owned(),
                })
                .inc();
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Labels of an origin, as metric label values.
pub fn origin(origin: ck8s_certs_api::machine_certificates::Origin) -> OriginLabels {
    use ck8s_certs_api::machine_certificates::Origin;
    OriginLabels {
        origin: match origin {
            Origin::Manual => "manual",
            Origin::Policy => "policy",
            Origin::Fleet => "fleet",
        }
        .to_owned(),
    }
}

/// The `reason` label of a verdict, from its reason as conditions spell it (`NotDue`,
/// `OutsideWindow`, `PolicyConflict`): snake_case, as Prometheus label values are.
pub fn reason_label(reason: &str) -> ReasonLabels {
    let mut snake = String::with_capacity(reason.len() + 4);
    for (i, c) in reason.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            snake.push('_');
        }
        snake.push(c.to_ascii_lowercase());
    }
    ReasonLabels { reason: snake }
}

/// The `reason` label of a window bypass: expiry within the fail-safe margin.
pub fn expiry_imminent() -> ReasonLabels {
    ReasonLabels {
        reason: "expiry_imminent".to_owned(),
    }
}

/// Serves `/metrics` on `address` in the background.
pub async fn serve(
    address: std::net::SocketAddr,
    metrics: Arc<Metrics>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use axum::http::StatusCode;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = metrics.clone();
            async move {
                match metrics.encode() {
                    Ok(text) => (
                        StatusCode::OK,
                        [(
                            "content-type",
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        text,
                    ),
                    Err(_) => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        [("content-type", "text/plain")],
                        String::new(),
                    ),
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(address).await?;
    tracing::info!(address = %listener.local_addr()?, "Serving metrics");
    // With the webhook's limits: a scraper that holds connections keeps no one else out.
    Ok(crate::serving::serve(
        listener,
        None,
        app,
        crate::serving::Limits::default(),
    ))
}

#[cfg(test)]
mod tests;

/// A role as a metric label value.
pub fn role_label(role: ck8s_certs_api::machine_certificates::Role) -> &'static str {
    use ck8s_certs_api::machine_certificates::Role;
    match role {
        Role::ControlPlane => "control-plane",
        Role::Worker => "worker",
    }
}
