//! Controllers. `machine` reconciles CK8s Machines: it keeps their certificate expiry known and
//! carries out refresh requests, recording everything in the Machine's `MachineCertificates`.

pub mod cluster_credentials;
pub mod executor;
mod feeds;
pub mod fleet;
pub mod governing_policy;
pub mod history;
pub mod machine;
mod observe;
pub mod patches;
pub mod policy_status;
pub mod shard;
pub mod stores;

use std::sync::Arc;

use ck8s_certs_api::capi::{CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL, WATCH_FILTER_LABEL};
use ck8s_certs_api::certificate_refresh::{CertificateRefresh, labels as refresh_labels};
use ck8s_certs_api::cluster_certificates::ClusterCertificates;
use ck8s_certs_api::machine::{CapiVersion, Cluster, Machine};
use ck8s_certs_api::machine_deployment::MachineDeployment;
use ck8s_certs_api::renewal_policy::CertificateRenewalPolicy;
use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, controller, watcher};
use kube::{Api, Client, ResourceExt};

use tokio_util::sync::CancellationToken;

use crate::cli::Args;
use crate::health::Health;
use crate::metrics::{Controller as Timed, Metrics};
use crate::refresh::session::Timeouts;
use feeds::{
    FleetFeeds, PolicyFeeds, credentials_controller, fleet_controllers, policies_api,
    policy_controller, trim_request,
};
use observe::{CachedExpiries, observed};
use stores::SharedWatch;
pub use stores::Stores;

/// Runs the Machine controller until its stream ends.
// One argument per thing the process hands over; a struct of them would only rename them.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: Client,
    capi: CapiVersion,
    args: &Args,
    renewal: crate::policy::spec::Settings,
    metrics: Arc<crate::metrics::Metrics>,
    health: Health,
    stop: CancellationToken,
    carrier: Option<ck8s_certs_api::machine_certificates::Carrier>,
    term: crate::leader::Term,
) {
    let (machines, clusters, owned): (Api<Machine>, Api<Cluster>, Api<stores::CachedCertificates>) =
        match &args.namespace {
            Some(ns) => (
                Api::namespaced_with(client.clone(), ns, &capi),
                Api::namespaced_with(client.clone(), ns, &capi),
                Api::namespaced(client.clone(), ns),
            ),
            None => (
                Api::all_with(client.clone(), &capi),
                Api::all_with(client.clone(), &capi),
                Api::all(client.clone()),
            ),
        };
    let mut filtered = watcher::Config::default();
    if let Some(filter) = &args.watch_filter {
        filtered = filtered.labels(&format!("{WATCH_FILTER_LABEL}={filter}"));
    }
    // One watch per kind, shared by both controllers. With --watch-filter, Machines, their
    // MachineCertificates and the policies are those of this shard: a policy governs (and
    // reports on) the Machines of the shard whose label it carries (docs/sharding.md).
    let mut machine_watch = SharedWatch::<Machine>::with(capi);
    let mut cluster_watch = SharedWatch::<Cluster>::with(capi);
    let mut deployment_watch = SharedWatch::<MachineDeployment>::with(capi);
    let mut certificate_watch = SharedWatch::in_cache(stores::CertificateWriter::new());
    let mut cluster_record_watch = SharedWatch::<ClusterCertificates>::new();
    let policy_resource = ApiResource::erase::<CertificateRenewalPolicy>(&());
    let mut policy_watch = SharedWatch::<DynamicObject>::with(policy_resource.clone());
    let stores = Stores {
        machines: machine_watch.store.clone(),
        clusters: cluster_watch.store.clone(),
        deployments: deployment_watch.store.clone(),
        certificates: certificate_watch.store.clone(),
        policies: policy_watch.store.clone(),
        policy_readings: Default::default(),
    };
    let machine_events = machine_watch.subscribe();
    let policy_machine_events = machine_watch.subscribe_changes(policy_status::selects_differently);
    let cluster_events = cluster_watch.subscribe();
    let credential_cluster_events = cluster_watch.subscribe();
    let cluster_record_events = cluster_record_watch.subscribe();
    let cluster_records_store = cluster_record_watch.store.clone();
    let certificate_events = certificate_watch.subscribe();
    // Fleet requests (not the per-Machine records, which nothing reads back).
    let mut request_watch = SharedWatch::<CertificateRefresh>::new();
    let request_events = request_watch.subscribe();
    let requests_store = request_watch.store.clone();
    let fleet_machine_events = machine_watch.subscribe();
    let trigger_cluster_events = cluster_watch.subscribe();
    let trigger_deployment_events = deployment_watch.subscribe();
    let deployments: Api<MachineDeployment> = match &args.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &capi),
        None => Api::all_with(client.clone(), &capi),
    };
    let mut requests_config = watcher::Config::default().labels(&match &args.watch_filter {
        Some(filter) => format!("!{},{WATCH_FILTER_LABEL}={filter}", refresh_labels::MACHINE),
        None => format!("!{}", refresh_labels::MACHINE),
    });
    requests_config.bookmarks = true;
    let requests_api: Api<CertificateRefresh> = match &args.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let policy_events = policy_watch.subscribe_with_deletions(governing_policy::spec_changed);
    let policy_policy_events = policy_watch.subscribe();
    let policy_sibling_events =
        policy_watch.subscribe_with_deletions(governing_policy::spec_changed);
    let cluster_records: Api<ClusterCertificates> = match &args.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let watches = futures::future::join3(
        request_watch.run(requests_api, requests_config, trim_request),
        // Few, and cached compactly: not filtered, the trigger checks the label.
        deployment_watch.run(deployments, watcher::Config::default(), stores::keep),
        futures::future::join5(
            machine_watch.run(machines, filtered.clone(), stores::keep),
            cluster_watch.run(clusters, watcher::Config::default(), stores::keep),
            // One per Cluster (few): not filtered, the Machines decide which shard reports a Cluster.
            cluster_record_watch.run(cluster_records, watcher::Config::default(), stores::keep),
            certificate_watch.run(owned, filtered.clone(), stores::keep),
            policy_watch.run(policies_api(&client, args), filtered, stores::trim_policy),
        ),
    );

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
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "ck8s-certs".into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    // One clock for every controller.
    let clock = crate::clock::SystemClock::shared();
    let credentials = cluster_credentials::Context {
        clock: clock.clone(),
        readings: Default::default(),
        attempts: Default::default(),
        client: client.clone(),
        capi,
        machines: stores.machines.clone(),
        records: cluster_records_store,
        recorder: recorder.clone(),
        metrics: metrics.clone(),
        config: cluster_credentials::Config {
            warning: jiff::SignedDuration::try_from(args.kubeconfig_expiry_warning)
                .unwrap_or(jiff::SignedDuration::MAX),
            interval: args.kubeconfig_check_interval,
            vetting: args.kubeconfig_vetting(),
            renewal: cluster_credentials::RenewalConfig {
                mode: args.renew_management_kubeconfig,
                renew_before: args
                    .kubeconfig_renew_before
                    .and_then(|d| jiff::SignedDuration::try_from(d).ok()),
            },
        },
    };
    let fleet_ctx = Arc::new(fleet::Context {
        clock: clock.clone(),
        client: client.clone(),
        capi,
        stores: stores.clone(),
        requests: requests_store.clone(),
        workload: crate::workload::Clients::new(client.clone(), args.kubeconfig_vetting()),
        recorder: recorder.clone(),
        wait_timeout: args.refresh_wait_timeout,
        history: args.refresh_history,
        watch_filter: args.watch_filter.clone(),
        synced: synced_rx,
        control_planes: Default::default(),
    });
    // Refreshes that waited for their cluster are woken here when they can go.
    let (wakes, woken) = futures::channel::mpsc::unbounded::<executor::Waiter>();
    let woken = woken.map(move |w| ObjectRef::new_with(&w.machine, capi).within(&w.namespace));
    let ctx = Arc::new(machine::Context {
        clock: clock.clone(),
        reach: machine::Reach {
            client: client.clone(),
            capi,
            workload: crate::workload::Clients::new(client.clone(), args.kubeconfig_vetting()),
            config: machine::Config {
                transport: args.k8sd_transport,
                timeouts: Timeouts {
                    call: args.k8sd_timeout,
                    run: args.k8sd_run_timeout,
                },
                resync: args.resync_period,
                renewal,
                history: args.refresh_history,
            },
            k8sd_metrics: metrics.k8sd.clone(),
        },
        stores: stores.clone(),
        recorder,
        executor: executor::Executor::new(
            executor::Admission::new(
                args.max_worker_refreshes_per_cluster,
                args.max_worker_refreshes,
                Some(wakes),
            ),
            executor::Settings {
                wait_timeout: args.refresh_wait_timeout,
                tries: args.k8sd_attempts.max(1),
                settle_timeout: args.settle_timeout,
                run_timeout: args.k8sd_run_timeout,
            },
            stop.clone(),
            term,
            clock.clone(),
        ),
        outcomes: machine::KeptOutcomes::default(),
        shard: shard::Shard::new(client.clone(), carrier, clock.clone()),
        metrics: metrics.clone(),
        stop: stop.clone(),
    });
    // The expiry metric is read from the caches when scraped.
    metrics.expiry.read_from(CachedExpiries {
        machines: stores.machines.clone(),
        certificates: stores.certificates.clone(),
    });
    let metrics_of_policies = metrics;
    // A policy change re-checks the Machines it selected and those it selects now; a write of its
    // status alone (its generation unchanged, as its own controller writes `matchedMachines`)
    // re-checks none.
    let machines_of_policy = {
        let (stores, selections) = (
            stores.clone(),
            governing_policy::PolicySelections::default(),
        );
        move |policy: DynamicObject| {
            selections
                .concerned(&policy, &stores)
                .into_iter()
                .map(|c| ObjectRef::from_obj_with(c.machine.as_ref(), capi))
                .collect::<Vec<_>>()
        }
    };
    // A Cluster change (paused, endpoint) re-checks its Machines.
    let machines_of_cluster = {
        let store = stores.machines.clone();
        move |cluster: Cluster| {
            let (namespace, name) = (cluster.namespace(), cluster.name_any());
            store
                .state()
                .into_iter()
                .filter(|m| {
                    m.namespace() == namespace
                        && m.labels.get(CLUSTER_NAME_LABEL) == Some(name.as_str())
                })
                .map(|m| ObjectRef::from_obj_with(m.as_ref(), capi))
                .collect::<Vec<_>>()
        }
    };
    // A MachineCertificates belongs to the Machine of the same name (its owner; the cache keeps
    // no owner references).
    let machine_of_certificates = move |certificates: stores::CachedCertificates| {
        let namespace = certificates.namespace().unwrap_or_default();
        Some(ObjectRef::new_with(&certificates.name_any(), capi).within(&namespace))
    };
    let machine_controller =
        Controller::for_stream_with(machine_events, stores.machines.clone(), capi)
            .with_config(controller::Config::default().concurrency(args.concurrent_reconciles))
            .graceful_shutdown_on(stop.clone().cancelled_owned())
            .watches_stream_with(certificate_events, machine_of_certificates, ())
            .watches_stream_with(cluster_events, machines_of_cluster, capi)
            .watches_stream_with(policy_events, machines_of_policy, policy_resource.clone())
            .reconcile_on(woken)
            .run(
                |machine, ctx: Arc<machine::Context>| {
                    let metrics = ctx.metrics.clone();
                    observed(
                        metrics,
                        Timed::Machine,
                        machine::reconcile(machine, ctx),
                        machine::Error::category,
                    )
                },
                machine::error_policy,
                ctx,
            )
            .enumerate()
            .for_each(|(count, result)| async move {
                if count == 0 {
                    // Start-up time, for operators and `make bench`.
                    tracing::info!("First Machine reconciled");
                }
                if let Err(err) = result {
                    tracing::debug!(error = %err, "Reconcile error");
                }
            });
    let policy_controller = policy_controller(
        &client,
        capi,
        metrics_of_policies,
        PolicyFeeds {
            policies: policy_policy_events,
            siblings: policy_sibling_events,
            machines: policy_machine_events,
            stores: stores.clone(),
            clock: clock.clone(),
            resync: args.resync_period,
        },
        stop.clone(),
    );
    let credentials_controller = credentials_controller(
        credential_cluster_events,
        cluster_record_events,
        stores.clone(),
        credentials,
        stop.clone(),
    );
    let fleet_controllers = fleet_controllers(
        FleetFeeds {
            requests: request_events,
            machines: fleet_machine_events,
            clusters: trigger_cluster_events,
            deployments: trigger_deployment_events,
            store: requests_store,
        },
        fleet_ctx.clone(),
        stores.clone(),
        stop.clone(),
    );
    // The CK8s control plane kind is optional and may be installed after we start.
    let control_plane_triggers = feeds::control_plane_triggers(
        client.clone(),
        args.namespace.clone(),
        fleet_ctx,
        stop.clone(),
    );
    tokio::select! {
        _ = futures::future::join5(machine_controller, policy_controller, credentials_controller, fleet_controllers, control_plane_triggers) => {}
        _ = watches => tracing::error!("The watches ended unexpectedly"),
    }
    readiness.abort();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8sd::K8sdError;
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
