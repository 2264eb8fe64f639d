//! The per-Machine gauges read from a source (the controller's caches) when scraped rather than
//! kept in the registry: the certificate expiry, one series per CK8s Machine, and since when a
//! renewal is overdue, one series per Machine whose renewal is.

use std::sync::{Arc, PoisonError, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::MetricType;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MachineLabels {
    pub namespace: String,
    pub cluster: String,
    pub machine: String,
    pub role: String,
}

/// `certificate_expiry_timestamp_seconds`: one series per CK8s Machine whose expiry is known,
/// read on each scrape from an [`ExpirySource`] (the controller's watch caches). Kept as a
/// family of gauges instead, the series cost ~200 bytes a Machine (labels, gauge, map slot) and
/// outlived deleted Machines (docs/performance.md, step 3).
#[derive(Clone, Debug, Default)]
pub struct MachineExpiries {
    source: Arc<RwLock<Option<Arc<dyn ExpirySource>>>>,
}

/// One series of [`MachineExpiries`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MachineExpiry<'a> {
    pub namespace: &'a str,
    pub cluster: &'a str,
    pub machine: &'a str,
    /// `control-plane` or `worker`.
    pub role: &'a str,
    /// NotAfter, Unix seconds.
    pub expiry: f64,
    /// Since when its renewal is overdue (condition `RenewalOverdue`), Unix seconds.
    pub overdue_since: Option<f64>,
}

/// Where [`MachineExpiries`] reads its series from.
pub trait ExpirySource: std::fmt::Debug + Send + Sync + 'static {
    /// Whether there is no series at all (the family is then left out, like an empty one).
    fn is_empty(&self) -> bool;
    fn for_each(&self, series: &mut dyn FnMut(MachineExpiry<'_>));
}

/// Fixed series, with since when each is overdue: for tests and examples.
impl ExpirySource for Vec<(MachineLabels, f64, Option<f64>)> {
    fn is_empty(&self) -> bool {
        <[_]>::is_empty(self)
    }

    fn for_each(&self, series: &mut dyn FnMut(MachineExpiry<'_>)) {
        for (labels, expiry, overdue_since) in self {
            series(MachineExpiry {
                namespace: &labels.namespace,
                cluster: &labels.cluster,
                machine: &labels.machine,
                role: &labels.role,
                expiry: *expiry,
                overdue_since: *overdue_since,
            });
        }
    }
}

impl MachineExpiries {
    /// Exports the series of `source` from now on (instead of any earlier source's).
    pub fn read_from(&self, source: impl ExpirySource) {
        *self.source.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(source));
    }

    fn source(&self) -> Option<Arc<dyn ExpirySource>> {
        // A poisoned lock only means a panic while replacing the source: the value is whole.
        self.source
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Collector for MachineExpiries {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(source) = self.source() else {
            return Ok(());
        };
        if source.is_empty() {
            return Ok(());
        }
        // The registry ends the help of the metrics it holds with a period; collectors write
        // theirs as given.
        encode_family(
            &mut encoder,
            source.as_ref(),
            "certificate_expiry_timestamp_seconds",
            "NotAfter of a node's certificates, as a Unix timestamp.",
            |series| Some(series.expiry),
        )?;
        let mut overdue = false;
        source.for_each(&mut |series| overdue |= series.overdue_since.is_some());
        if !overdue {
            return Ok(());
        }
        encode_family(
            &mut encoder,
            source.as_ref(),
            "renewal_overdue_since_timestamp_seconds",
            "Since when a Machine's automatic renewal is more than a day past its planned instant (condition RenewalOverdue), as a Unix timestamp; only overdue Machines have a series.",
            |series| series.overdue_since,
        )
    }
}

/// One gauge family: a series for each Machine `value` gives a value for.
fn encode_family(
    encoder: &mut DescriptorEncoder,
    source: &dyn ExpirySource,
    name: &str,
    help: &str,
    value: fn(&MachineExpiry<'_>) -> Option<f64>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    let mut result = Ok(());
    source.for_each(&mut |series| {
        let Some(value) = value(&series).filter(|_| result.is_ok()) else {
            return;
        };
        // The label names and order of `MachineLabels`.
        let labels = [
            ("namespace", series.namespace),
            ("cluster", series.cluster),
            ("machine", series.machine),
            ("role", series.role),
        ];
        result = metric
            .encode_family(&labels)
            .and_then(|mut gauge| gauge.encode_gauge(&value));
    });
    result
}
