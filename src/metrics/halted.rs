//! `renewals_halted_since_timestamp_seconds`: one series per CertificateRenewalPolicy whose
//! circuit breaker is open, read from the policy cache when scraped, so that a resumed or
//! deleted policy leaves no series behind.

use std::sync::{Arc, PoisonError, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

/// One open breaker: the policy's namespace and name, which breaker opened it (`policy` or
/// `fleet`), and since when, Unix seconds.
pub type HaltedPolicy<'a> = (&'a str, &'a str, &'a str, f64);

/// Where [`HaltedPolicies`] reads its series from.
pub trait HaltedSource: std::fmt::Debug + Send + Sync + 'static {
    fn for_each(&self, series: &mut dyn FnMut(HaltedPolicy<'_>));
}

/// Fixed series: for tests and examples.
impl HaltedSource for Vec<(String, String, String, f64)> {
    fn for_each(&self, series: &mut dyn FnMut(HaltedPolicy<'_>)) {
        for (namespace, policy, scope, since) in self {
            series((namespace, policy, scope, *since));
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct HaltedPolicies {
    source: Arc<RwLock<Option<Arc<dyn HaltedSource>>>>,
}

impl HaltedPolicies {
    /// Exports the series of `source` from now on.
    pub fn read_from(&self, source: impl HaltedSource) {
        *self.source.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(source));
    }
}

impl Collector for HaltedPolicies {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // A poisoned lock only means a panic while replacing the source: the value is whole.
        let source = self
            .source
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(source) = source else {
            return Ok(());
        };
        let mut any = false;
        source.for_each(&mut |_| any = true);
        if !any {
            return Ok(());
        }
        let mut metric = encoder.encode_descriptor(
            "renewals_halted_since_timestamp_seconds",
            "Since when a CertificateRenewalPolicy's circuit breaker is open (its automatic renewals stopped after failures, scope policy or fleet), as a Unix timestamp; only halted policies have a series.",
            None,
            MetricType::Gauge,
        )?;
        let mut result = Ok(());
        source.for_each(&mut |(namespace, policy, scope, since)| {
            if result.is_err() {
                return;
            }
            let labels = [
                ("namespace", namespace),
                ("policy", policy),
                ("scope", scope),
            ];
            result = metric
                .encode_family(&labels)
                .and_then(|mut gauge| gauge.encode_gauge(&since));
        });
        result
    }
}
