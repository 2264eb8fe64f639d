//! What every controller is started with: the management cluster, the watch caches, the Event
//! recorder, the clock, the metrics and the stop signal.

use std::sync::Arc;

use crate::events::Recorder;
use ck8s_certs_api::machine::CapiVersion;
use kube::Client;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::controllers::stores::Stores;
use crate::metrics::Metrics;

/// What every controller is started with.
#[derive(Clone)]
pub struct Shared {
    pub client: Client,
    /// The Cluster API version Machines and Clusters are read in.
    pub capi: CapiVersion,
    /// The watch caches.
    pub stores: Stores,
    pub recorder: Recorder,
    /// One clock for every controller.
    pub clock: SharedClock,
    pub metrics: Arc<Metrics>,
    pub stop: CancellationToken,
}
