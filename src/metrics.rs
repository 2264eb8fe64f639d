//! Prometheus metrics (`--metrics-bind-address`, path `/metrics`). Labels are bounded: origin,
//! reason, role, endpoint and outcome are small fixed sets; the per-machine expiry gauge is the
//! one per-object family, because "what expires when" is what the fleet dashboard needs.
//!
//! Names follow Prometheus conventions: the `ck8s_certs` prefix comes from the registry, and
//! counters get their `_total` suffix from the encoder, so `renewal_deferred` is exported as
//! `ck8s_certs_renewal_deferred_total`. Label values are snake_case (`outside_window`).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MachineLabels {
    pub namespace: String,
    pub cluster: String,
    pub machine: String,
    pub role: String,
}

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
    /// client or ca.
    pub certificate: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

/// Every metric the controller exports.
pub struct Metrics {
    registry: Registry,
    pub expiry: Family<MachineLabels, Gauge<f64, AtomicU64>>,
    /// NotAfter of each Cluster's `<cluster>-kubeconfig` certificates.
    pub kubeconfig_expiry: Family<KubeconfigLabels, Gauge<f64, AtomicU64>>,
    pub renewals_started: Family<OriginLabels, Counter>,
    pub renewals_succeeded: Family<OriginLabels, Counter>,
    pub renewals_failed: Family<OriginLabels, Counter>,
    /// `reason`: [`reason_label`] of the verdict (`backoff`, `outside_window`,
    /// `staggered`).
    pub renewal_deferred: Family<ReasonLabels, Counter>,
    /// `reason`: [`expiry_imminent`], the one reason the windows are bypassed.
    pub renewal_bypassed: Family<ReasonLabels, Counter>,
    pub refresh_duration: Family<RefreshLabels, Histogram>,
    pub in_progress: Gauge,
    pub policy_invalid: Family<ReasonLabels, Counter>,
    pub leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("ck8s_certs");
        let expiry = Family::<MachineLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "NotAfter of a node's certificates, as a Unix timestamp",
            expiry.clone(),
        );
        let kubeconfig_expiry = Family::<KubeconfigLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "kubeconfig_expiry_timestamp_seconds",
            "NotAfter of the management kubeconfig's certificates of a workload cluster (<cluster>-kubeconfig: certificate client or ca), as a Unix timestamp",
            kubeconfig_expiry.clone(),
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
            "Renewal verdicts that held a due renewal back, by reason (backoff, outside_window, staggered), counted when the verdict changes",
            renewal_deferred.clone(),
        );
        let renewal_bypassed = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "renewal_bypassed",
            "Renewals run outside the maintenance windows, by reason (expiry_imminent: expiry was within the fail-safe margin)",
            renewal_bypassed.clone(),
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
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica leads (does the work), 0 while it stands by",
            leader.clone(),
        );
        Self {
            registry,
            expiry,
            kubeconfig_expiry,
            renewals_started,
            renewals_succeeded,
            renewals_failed,
            renewal_deferred,
            renewal_bypassed,
            refresh_duration,
            in_progress,
            policy_invalid,
            leader,
        }
    }
}

impl Metrics {
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
    Ok(tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            tracing::error!(error = %err, "Metrics server stopped");
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::DeferReason;

    #[test]
    fn deferral_and_bypass_counters_have_conventional_names_and_labels() {
        let metrics = Metrics::default();
        for reason in [
            DeferReason::NotDue,
            DeferReason::Backoff,
            DeferReason::OutsideWindow,
            DeferReason::Staggered,
        ] {
            metrics
                .renewal_deferred
                .get_or_create(&reason_label(reason.as_str()))
                .inc();
        }
        metrics
            .renewal_bypassed
            .get_or_create(&expiry_imminent())
            .inc();
        let text = metrics.encode().unwrap();
        for line in [
            "# TYPE ck8s_certs_renewal_deferred counter",
            "ck8s_certs_renewal_deferred_total{reason=\"not_due\"} 1",
            "ck8s_certs_renewal_deferred_total{reason=\"backoff\"} 1",
            "ck8s_certs_renewal_deferred_total{reason=\"outside_window\"} 1",
            "ck8s_certs_renewal_deferred_total{reason=\"staggered\"} 1",
            "# TYPE ck8s_certs_renewal_bypassed counter",
            "ck8s_certs_renewal_bypassed_total{reason=\"expiry_imminent\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        // Nothing of the old names is left.
        assert!(!text.contains("renewals_deferred"), "{text}");
        assert!(!text.contains("window_bypass"), "{text}");
    }
}
