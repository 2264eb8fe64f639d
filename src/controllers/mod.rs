//! Controllers. `machine` reconciles CK8s Machines: it keeps their certificate expiry known and
//! carries out refresh requests, journaling each in the `CertificateRefresh` the Machine names
//! (the seed before `run`, then the outcome) and keeping the Machine's `MachineCertificates`
//! (expiry, conditions, a copy of the last finished operation);
//! `policy_status` reports on renewal policies, `cluster_credentials` on each Cluster's
//! management kubeconfig, `fleet` carries out refreshes of whole clusters. Each has a `start`
//! beside it that subscribes it to the shared [`watches`]; [`run`] starts them all.

pub mod admission_policy;
pub mod cluster_credentials;
pub mod executor;
pub mod fleet;
pub mod governing_policy;
pub mod history;
pub mod machine;
mod observe;
mod panics;
pub mod patches;
pub mod policy_status;
mod settings;
pub mod shard;
pub mod shared;
pub mod stores;
pub mod watches;

use std::sync::Arc;

use crate::events::{Recorder, Reporter};
use ck8s_certs_api::machine::CapiVersion;
use ck8s_certs_api::machine_certificates::Carrier;
use kube::Client;
use tokio_util::sync::CancellationToken;

use crate::health::Health;
use crate::metrics::Metrics;
use observe::CachedExpiries;
pub use settings::Settings;
pub use shared::Shared;
pub use stores::Stores;
use watches::Watches;

/// Runs the controllers until their streams end.
// One argument per thing the process hands over; a struct of them would only rename them.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: Client,
    capi: CapiVersion,
    settings: Settings,
    metrics: Arc<Metrics>,
    health: Health,
    stop: CancellationToken,
    carrier: Option<Carrier>,
    term: crate::leader::Term,
) {
    let mut watches = Watches::new(capi, settings.watch_buffer);
    let stores = watches.stores();
    // Ready once every cache holds a full list: reconcilers then act on complete information.
    let (synced_tx, synced_rx) = tokio::sync::watch::channel(false);
    let readiness = {
        let stores = stores.clone();
        tokio::spawn(async move {
            stores.synced().await;
            tracing::info!("Caches synced: reconciling");
            synced_tx.send_replace(true);
            health.set_ready(true);
        })
    };
    let reporter = Reporter {
        controller: "ck8s-certs".into(),
        instance: settings.instance.clone(),
    };
    let shared = Shared {
        recorder: Recorder::new(client.clone(), reporter),
        clock: crate::clock::SystemClock::shared(),
        client,
        capi,
        stores,
        metrics,
        stop,
    };
    // The expiry metric is read from the caches when scraped.
    shared.metrics.expiry.read_from(CachedExpiries {
        machines: shared.stores.machines.clone(),
        certificates: shared.stores.certificates.clone(),
    });
    shared
        .metrics
        .halted
        .read_from(observe::CachedHalts(shared.stores.policies.clone()));
    let fleet = Arc::new(settings.fleet_context(&shared, &watches, synced_rx));
    let backoff = settings.machine.config.renewal.backoff;
    let controllers = futures::future::join5(
        machine::start(&mut watches, &shared, settings.machine, carrier, term),
        policy_status::start(
            &mut watches,
            &shared,
            settings.resync,
            settings.breakers,
            backoff,
        ),
        cluster_credentials::start(&mut watches, &shared, settings.credentials),
        fleet::start(&mut watches, fleet.clone(), shared.stop.clone()),
        // The CK8s control plane kind is optional and may be installed after we start.
        fleet::control_plane_triggers(
            shared.client.clone(),
            settings.scope.namespace.clone(),
            fleet,
            shared.stop.clone(),
        ),
    );
    tokio::select! {
        _ = controllers => {}
        () = watches.run(&shared.client, capi, &settings.scope) => {
            tracing::error!("The watches ended unexpectedly");
        }
    }
    readiness.abort();
}

#[cfg(test)]
mod tests {
    use kube::runtime::controller;

    use super::observe::observed;
    use super::*;
    use crate::k8sd::K8sdError;
    use crate::metrics::Controller as Timed;
    use crate::metrics::Metrics;
    use crate::workload::WorkloadError;

    fn kube_error() -> kube::Error {
        kube::Error::LinesCodecMaxLineLengthExceeded
    }

    /// The `category` label of ck8s_certs_reconcile_errors_total: one snake_case name per kind
    /// of failure, never a message.
    #[test]
    fn machine_reconcile_errors_have_bounded_snake_case_categories() {
        let cases = [
            (machine::Error::Kube(kube_error()), "kube"),
            (
                machine::Error::Shard(shard::ShardError::Lease {
                    lease: "l".into(),
                    source: kube_error(),
                }),
                "kube",
            ),
            (
                machine::Error::Workload(WorkloadError::Node("no node".into())),
                "workload",
            ),
            (
                machine::Error::Expiry(K8sdError::Connect {
                    node: "n".into(),
                    route: "r".into(),
                    reason: "refused".into(),
                }),
                "connect",
            ),
            (
                machine::Error::Expiry(K8sdError::Api {
                    endpoint: "e".into(),
                    status: 401,
                    message: "invalid token".into(),
                }),
                "api",
            ),
        ];
        for (error, category) in cases {
            assert_eq!(error.category(), category, "{error}");
        }
    }

    #[tokio::test]
    async fn observed_reconciles_record_time_and_the_error_category() {
        let metrics = Arc::new(Metrics::default());
        let ok = observed(
            metrics.clone(),
            Timed::Machine,
            async { Ok::<_, machine::Error>(controller::Action::await_change()) },
            machine::Error::category,
        )
        .await;
        assert!(ok.is_ok());
        let failed = observed(
            metrics.clone(),
            Timed::Machine,
            async {
                Err::<controller::Action, _>(machine::Error::Workload(WorkloadError::Node(
                    "x".into(),
                )))
            },
            machine::Error::category,
        )
        .await;
        assert!(failed.is_err());
        let text = metrics.encode().unwrap();
        for line in [
            "ck8s_certs_reconcile_duration_seconds_count{controller=\"machine\"} 2",
            "ck8s_certs_reconcile_errors_total{controller=\"machine\",category=\"workload\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
