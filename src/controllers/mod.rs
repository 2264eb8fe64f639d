//! Controllers. `machine` reconciles CK8s Machines: it keeps their certificate expiry known and
//! carries out refresh requests, recording everything in the Machine's `MachineCertificates`.

pub mod decide;
pub mod machine;
pub mod patches;
pub mod policy;
pub mod renewal;

use std::sync::Arc;

use ck8s_certs_api::capi::{CLUSTER_NAME_LABEL, GROUP, WATCH_FILTER_LABEL};
use ck8s_certs_api::machine_certificates::MachineCertificates;
use ck8s_certs_api::renewal_policy::CertificateRenewalPolicy;
use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, ResourceExt};

use tokio_util::sync::CancellationToken;

use crate::cli::Args;
use crate::health::Health;
use crate::refresh::flow::Retry;
use crate::refresh::session::Timeouts;

/// Runs the Machine controller until its stream ends.
pub async fn run(
    client: Client,
    machine_resource: ApiResource,
    args: &Args,
    renewal: crate::policy::spec::Settings,
    metrics: Arc<crate::metrics::Metrics>,
    health: Health,
    stop: CancellationToken,
) {
    let cluster_resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        GROUP,
        &machine_resource.version,
        "Cluster",
    ));
    let (machines, clusters, owned): (
        Api<DynamicObject>,
        Api<DynamicObject>,
        Api<MachineCertificates>,
    ) = match &args.namespace {
        Some(ns) => (
            Api::namespaced_with(client.clone(), ns, &machine_resource),
            Api::namespaced_with(client.clone(), ns, &cluster_resource),
            Api::namespaced(client.clone(), ns),
        ),
        None => (
            Api::all_with(client.clone(), &machine_resource),
            Api::all_with(client.clone(), &cluster_resource),
            Api::all(client.clone()),
        ),
    };
    let mut filtered = watcher::Config::default();
    if let Some(filter) = &args.watch_filter {
        filtered = filtered.labels(&format!("{WATCH_FILTER_LABEL}={filter}"));
    }
    let (policy_controller, policy_store) = policy_controller(
        &client,
        machines.clone(),
        &machine_resource,
        policies_api(&client, args),
        stop.clone(),
    );
    let controller = Controller::new_with(machines, filtered.clone(), machine_resource.clone())
        .graceful_shutdown_on(stop.clone().cancelled_owned());
    let store = controller.store();
    // Ready once both caches hold a full list: reconcilers then act on complete information.
    let machine_store = store.clone();
    let readiness = tokio::spawn(async move {
        synced(&machine_store).await;
        synced(&policy_store).await;
        tracing::info!("Caches synced: reconciling");
        health.set_ready(true);
    });
    let ctx = Arc::new(machine::Context {
        client: client.clone(),
        machine_resource: machine_resource.clone(),
        cluster_resource: cluster_resource.clone(),
        workload: crate::workload::Clients::new(client.clone()),
        machines: store.clone(),
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "ck8s-certs".into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        ),
        config: machine::Config {
            transport: args.k8sd_transport,
            timeouts: Timeouts {
                call: args.k8sd_timeout,
                run: args.k8sd_run_timeout,
            },
            retry: Retry {
                attempts: args.k8sd_attempts.max(1),
                ..Retry::default()
            },
            max_worker_refreshes_per_cluster: args.max_worker_refreshes_per_cluster,
            max_worker_refreshes: args.max_worker_refreshes,
            settle_timeout: args.settle_timeout,
            wait_timeout: args.refresh_wait_timeout,
            resync: args.resync_period,
            renewal,
        },
        locks: machine::Locks::new(args.max_worker_refreshes),
        metrics,
        stop,
    });
    let policies = policies_api(&client, args);
    // A policy change re-checks every Machine of its namespace.
    let machines_seen = store.clone();
    let policy_machine_resource = machine_resource.clone();
    let machines_of_namespace = move |policy: DynamicObject| {
        let namespace = policy.namespace();
        machines_seen
            .state()
            .into_iter()
            .filter(|m| m.namespace() == namespace)
            .map(|m| ObjectRef::from_obj_with(m.as_ref(), policy_machine_resource.clone()))
            .collect::<Vec<_>>()
    };
    // A Cluster change (paused, endpoint) re-checks its Machines.
    let machines_of_cluster = move |cluster: DynamicObject| {
        let (namespace, name) = (cluster.namespace(), cluster.name_any());
        store
            .state()
            .into_iter()
            .filter(|m| {
                m.namespace() == namespace && m.labels().get(CLUSTER_NAME_LABEL) == Some(&name)
            })
            .map(|m| ObjectRef::from_obj_with(m.as_ref(), machine_resource.clone()))
            .collect::<Vec<_>>()
    };
    let machine_controller = controller
        .owns(owned, filtered)
        .watches_with(
            clusters,
            cluster_resource,
            watcher::Config::default(),
            machines_of_cluster,
        )
        .watches_with(
            policies,
            ApiResource::erase::<CertificateRenewalPolicy>(&()),
            watcher::Config::default(),
            machines_of_namespace,
        )
        .run(machine::reconcile, machine::error_policy, ctx)
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(error = %err, "Reconcile error");
            }
        });
    tokio::join!(machine_controller, policy_controller);
    readiness.abort();
}

/// Waits until `store` holds a full list. The Controller itself also waits on the store, and a
/// store wakes only one waiter (kube-runtime's DelayedInit keeps one waker), so this polls.
async fn synced(store: &kube::runtime::reflector::Store<DynamicObject>) {
    loop {
        let poll = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            store.wait_until_ready(),
        );
        if let Ok(result) = poll.await {
            if result.is_err() {
                // The writer is gone: the controller stopped, readiness no longer matters.
                std::future::pending::<()>().await;
            }
            return;
        }
    }
}

fn policies_api(client: &Client, args: &Args) -> Api<DynamicObject> {
    let resource = ApiResource::erase::<CertificateRenewalPolicy>(&());
    match &args.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// Reports on every CertificateRenewalPolicy (not limited by --watch-filter: a policy's verdict
/// depends on all Machines of its namespace). A Machine or policy change re-checks the policies
/// of that namespace.
fn policy_controller(
    client: &Client,
    machines: Api<DynamicObject>,
    machine_resource: &ApiResource,
    policies: Api<DynamicObject>,
    stop: CancellationToken,
) -> (
    impl std::future::Future<Output = ()> + use<>,
    kube::runtime::reflector::Store<DynamicObject>,
) {
    let resource = ApiResource::erase::<CertificateRenewalPolicy>(&());
    let controller = Controller::new_with(
        policies.clone(),
        watcher::Config::default(),
        resource.clone(),
    )
    .graceful_shutdown_on(stop.cancelled_owned());
    let store = controller.store();
    let synced = store.clone();
    let in_namespace = {
        let resource = resource.clone();
        move |object: DynamicObject| {
            let namespace = object.namespace();
            store
                .state()
                .into_iter()
                .filter(|p| p.namespace() == namespace)
                .map(|p| ObjectRef::from_obj_with(p.as_ref(), resource.clone()))
                .collect::<Vec<_>>()
        }
    };
    let ctx = Arc::new(policy::Context {
        client: client.clone(),
        machine_resource: machine_resource.clone(),
    });
    let work = controller
        .watches_with(
            machines,
            machine_resource.clone(),
            watcher::Config::default(),
            in_namespace.clone(),
        )
        .watches_with(policies, resource, watcher::Config::default(), in_namespace)
        .run(policy::reconcile, policy::error_policy, ctx)
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(error = %err, "Policy reconcile error");
            }
        });
    (work, synced)
}
