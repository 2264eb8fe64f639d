//! The credentials controller's wiring: each Cluster's management kubeconfig checked once every
//! cache is synced (which Clusters have CK8s Machines is read from the Machine cache), a record
//! changed by someone else set right from the last reading, and a periodic sweep.

use std::sync::Arc;

use ck8s_certs_api::annotations::CERTIFICATES_EXPIRY;
use ck8s_certs_api::cluster_certificates::ClusterCertificates;
use ck8s_certs_api::machine::Machine;
use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, controller};

use super::{Config, Context, Error, SWEEP_INTERVAL, error_policy, reconcile, sweep};
use crate::controllers::observe::observed;
use crate::controllers::shared::Shared;
use crate::controllers::watches::Watches;
use crate::metrics::Controller as Timed;

/// Whether a Machine's `certificates-expiry` changed (or it came or went).
fn recorded_expiry_changed(old: Option<&Machine>, new: &Machine) -> bool {
    // The cached Machine's own maps: its `metadata` keeps neither labels nor annotations.
    let recorded = |m: &Machine| m.annotations.get(CERTIFICATES_EXPIRY).map(str::to_owned);
    old.is_none_or(|old| recorded(old) != recorded(new))
}

/// Subscribes the credentials controller to `watches`; the future runs it.
pub fn start(
    watches: &mut Watches,
    shared: &Shared,
    config: Config,
) -> impl Future<Output = ()> + use<> {
    let clusters = watches.clusters.subscribe();
    let records = watches.cluster_records.subscribe();
    // A Machine's recorded expiry changes its Cluster's `CertificatesExpired` (a refresh, a
    // Machine replaced); nothing else of a Machine does.
    let machines = watches
        .machines
        .subscribe_with_deletions(recorded_expiry_changed);
    shared
        .metrics
        .ca_runway_warning
        .set(config.ca_runway.as_secs_f64());
    let (capi, stores, metrics, stop) = (
        shared.capi,
        shared.stores.clone(),
        shared.metrics.clone(),
        shared.stop.clone(),
    );
    let ctx = Context {
        clock: shared.clock.clone(),
        readings: Default::default(),
        attempts: Default::default(),
        api: Default::default(),
        client: shared.client.clone(),
        capi,
        machines: stores.machines.clone(),
        records: watches.cluster_records.store.clone(),
        recorder: shared.recorder.clone(),
        metrics: metrics.clone(),
        config,
    };
    // A record changed or deleted by someone else is set right from the last reading.
    let cluster_of_record = move |record: ClusterCertificates| {
        let namespace = record.namespace().unwrap_or_default();
        Some(ObjectRef::new_with(&record.name_any(), capi).within(&namespace))
    };
    let cluster_of_machine = move |machine: Machine| {
        let namespace = machine.namespace().unwrap_or_default();
        let cluster = machine.cluster()?;
        Some(ObjectRef::new_with(cluster, capi).within(&namespace))
    };
    let ctx = Arc::new(ctx);
    let sweeper = {
        let (ctx, stores, stop) = (ctx.clone(), stores.clone(), stop.clone());
        async move {
            stores.synced().await;
            let mut every = tokio::time::interval(SWEEP_INTERVAL);
            loop {
                tokio::select! {
                    _ = every.tick() => sweep(&ctx, &stores.clusters),
                    () = stop.cancelled() => break,
                }
            }
        }
    };
    // The subscriptions are read from the start (see `fleet::start`); each reconcile waits for
    // every cache to hold a full list instead, so a Cluster is checked with all its Machines.
    let controller = Controller::for_stream_with(clusters, stores.clusters.clone(), capi)
        // Secret reads are few and need not be fast: keep them gentle on the API server.
        .with_config(controller::Config::default().concurrency(2))
        .graceful_shutdown_on(stop.cancelled_owned())
        .watches_stream_with(records, cluster_of_record, ())
        .watches_stream_with(machines, cluster_of_machine, capi)
        .run(
            move |cluster, ctx| {
                let (stores, metrics) = (stores.clone(), metrics.clone());
                async move {
                    stores.synced().await;
                    let checked = reconcile(cluster, ctx);
                    observed(metrics, Timed::Kubeconfig, checked, Error::category).await
                }
            },
            error_policy,
            ctx,
        )
        .for_each(|_| async {});
    async move {
        futures::future::join(controller, sweeper).await;
    }
}
