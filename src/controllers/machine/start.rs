//! The Machine controller's wiring: what it watches and what wakes a Machine's reconcile (its
//! MachineCertificates, its Cluster, a policy that selects it, a refresh that may go on).

use std::sync::Arc;

use ck8s_certs_api::capi::CLUSTER_NAME_LABEL;
use ck8s_certs_api::machine::{CapiVersion, Cluster};
use ck8s_certs_api::machine_certificates::Carrier;
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, controller};

use super::gates;
use super::{Config, Context, Error, KeptOutcomes, Reach, error_policy, reconcile};
use crate::controllers::executor::{self, Admission, Executor, Waiter};
use crate::controllers::governing_policy::{self, PolicySelections};
use crate::controllers::observe::observed;
use crate::controllers::shard::Shard;
use crate::controllers::shared::Shared;
use crate::controllers::stores::CachedCertificates;
use crate::controllers::watches::{Watches, policy_resource};
use crate::metrics::Controller as Timed;

/// The Machine controller's settings, from the command line.
#[derive(Clone, Debug)]
pub struct Settings {
    pub config: Config,
    pub executor: executor::Settings,
    /// Worker refreshes at once per cluster, and in all.
    pub workers_per_cluster: usize,
    pub workers: usize,
    pub concurrency: u16,
    pub vetting: crate::workload::Vetting,
}

/// Subscribes the Machine controller to `watches`; the future runs it.
pub fn start(
    watches: &mut Watches,
    shared: &Shared,
    settings: Settings,
    carrier: Option<Carrier>,
    term: crate::leader::Term,
) -> impl Future<Output = ()> + use<> {
    let (client, capi, stores, clock, stop) = (
        &shared.client,
        shared.capi,
        &shared.stores,
        &shared.clock,
        &shared.stop,
    );
    // Refreshes that waited for their cluster are woken here when they can go.
    let (wakes, woken) = futures::channel::mpsc::unbounded::<Waiter>();
    let woken = woken.map(move |w| ObjectRef::new_with(&w.machine, capi).within(&w.namespace));
    let concurrency = settings.concurrency;
    let ctx = Arc::new(Context {
        reach: Reach {
            client: client.clone(),
            capi,
            workload: crate::workload::Clients::new(client.clone(), settings.vetting),
            config: settings.config,
            k8sd_metrics: shared.metrics.k8sd.clone(),
            term: term.clone(),
        },
        executor: Executor::new(
            Admission::new(settings.workers_per_cluster, settings.workers, Some(wakes)),
            settings.executor,
            stop.clone(),
            term,
            clock.clone(),
        ),
        outcomes: KeptOutcomes::default(),
        replace_refusals: Default::default(),
        workload_gates: Default::default(),
        canary_gates: Default::default(),
        shard: Shard::new(client.clone(), carrier, clock.clone()),
        stores: stores.clone(),
        recorder: shared.recorder.clone(),
        metrics: shared.metrics.clone(),
        clock: clock.clone(),
        stop: stop.clone(),
    });
    let policy_events = watches
        .policies
        .subscribe_with_deletions(governing_policy::verdict_input_changed);
    Controller::for_stream_with(watches.machines.subscribe(), stores.machines.clone(), capi)
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .watches_stream_with(
            watches.certificates.subscribe(),
            machine_of_certificates(capi),
            (),
        )
        .watches_stream_with(
            watches.clusters.subscribe(),
            machines_of_cluster(stores, capi),
            capi,
        )
        .watches_stream_with(
            policy_events,
            machines_of_policy(stores, capi),
            policy_resource(),
        )
        .watches_stream_with(
            watches
                .machines
                .subscribe_with_deletions(gates::machine_gate_changed),
            held_by_machine(stores, capi),
            capi,
        )
        .watches_stream_with(
            watches
                .deployments
                .subscribe_changes(gates::deployment_gate_changed),
            held_by_deployment(stores, capi),
            capi,
        )
        .reconcile_on(woken)
        .run(
            |machine, ctx: Arc<Context>| {
                let metrics = ctx.metrics.clone();
                observed(
                    metrics,
                    Timed::Machine,
                    reconcile(machine, ctx),
                    Error::category,
                )
            },
            error_policy,
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
        })
}

/// A MachineCertificates belongs to the Machine of the same name (its owner; the cache keeps no
/// owner references).
fn machine_of_certificates(
    capi: CapiVersion,
) -> impl Fn(CachedCertificates) -> Option<ObjectRef<ck8s_certs_api::machine::Machine>> {
    move |certificates| {
        let namespace = certificates.namespace().unwrap_or_default();
        Some(ObjectRef::new_with(&certificates.name_any(), capi).within(&namespace))
    }
}

/// A Cluster change (paused, endpoint) re-checks its Machines.
fn machines_of_cluster(
    stores: &crate::controllers::stores::Stores,
    capi: CapiVersion,
) -> impl Fn(Cluster) -> Vec<ObjectRef<ck8s_certs_api::machine::Machine>> + use<> {
    let store = stores.machines.clone();
    move |cluster| {
        let (namespace, name) = (cluster.namespace(), cluster.name_any());
        store
            .state()
            .into_iter()
            .filter(|m| {
                m.namespace() == namespace && m.labels.get(CLUSTER_NAME_LABEL) == Some(&name)
            })
            .map(|m| ObjectRef::from_obj_with(m.as_ref(), capi))
            .collect()
    }
}

/// A Machine that may have opened (or closed) a gate of its cluster re-checks the Machines a gate
/// holds there.
fn held_by_machine(
    stores: &crate::controllers::stores::Stores,
    capi: CapiVersion,
) -> impl Fn(ck8s_certs_api::machine::Machine) -> Vec<ObjectRef<ck8s_certs_api::machine::Machine>> + use<>
{
    let held = held_in(stores, capi);
    move |machine| held(machine.namespace(), machine.cluster())
}

/// The same for a MachineDeployment whose rollout began or ended.
fn held_by_deployment(
    stores: &crate::controllers::stores::Stores,
    capi: CapiVersion,
) -> impl Fn(
    ck8s_certs_api::machine_deployment::MachineDeployment,
) -> Vec<ObjectRef<ck8s_certs_api::machine::Machine>>
+ use<> {
    let held = held_in(stores, capi);
    move |deployment| held(deployment.namespace(), deployment.cluster_name.as_deref())
}

/// The Machines a gate holds in a cluster (none without one).
fn held_in(
    stores: &crate::controllers::stores::Stores,
    capi: CapiVersion,
) -> impl Fn(Option<String>, Option<&str>) -> Vec<ObjectRef<ck8s_certs_api::machine::Machine>> + use<>
{
    let stores = stores.clone();
    move |namespace, cluster| {
        let (Some(namespace), Some(cluster)) = (namespace, cluster) else {
            return Vec::new();
        };
        gates::held_in_cluster(&stores, &namespace, cluster)
            .map(|m| ObjectRef::from_obj_with(m.as_ref(), capi))
            .collect()
    }
}

/// A policy change re-checks the Machines it selected and those it selects now; a write of its
/// status alone (its generation unchanged, as its own controller writes `matchedMachines`)
/// re-checks none, unless its circuit breaker opened or closed: then those it selects.
fn machines_of_policy(
    stores: &crate::controllers::stores::Stores,
    capi: CapiVersion,
) -> impl Fn(DynamicObject) -> Vec<ObjectRef<ck8s_certs_api::machine::Machine>> + use<> {
    let (stores, selections) = (stores.clone(), PolicySelections::default());
    move |policy| {
        let caches = stores.policy_caches();
        let mut concerned = selections.concerned(&policy, &caches);
        // The same generation: its circuit breaker opened or closed (what let it through).
        if concerned.is_empty() {
            concerned = selections.selected_now(&policy, &caches);
        }
        concerned
            .into_iter()
            .map(|c| ObjectRef::from_obj_with(c.machine.as_ref(), capi))
            .collect()
    }
}
