//! The policy controller's wiring: a Machine change re-checks the policies of its namespace; a
//! policy change, those that select the Machines it concerns; a failed automatic renewal, the
//! policies whose circuit breaker counts it (its namespace's, or every policy with the fleet's
//! breaker on); a renewal (a new expiry), the policies of its namespace that have canaries.

use std::sync::Arc;
use std::time::Duration;

use ck8s_certs_api::machine::Machine;
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::Controller;
use kube::runtime::reflector::ObjectRef;

use super::{Context, error_policy, reconcile, selects_differently};
use crate::controllers::governing_policy::{self, PolicySelections};
use crate::controllers::observe::observed;
use crate::controllers::shared::Shared;
use crate::controllers::stores::{CachedCertificates, Stores};
use crate::controllers::watches::{Watches, policy_resource};
use crate::metrics::Controller as Timed;

/// Subscribes the policy controller to `watches`; the future runs it. `resync`: how often a
/// policy's report is computed again without a change; `backoff`: the renewal backoff flags, which
/// a policy's promise is checked with.
pub fn start(
    watches: &mut Watches,
    shared: &Shared,
    resync: Duration,
    breakers: super::BreakerSettings,
    backoff: crate::policy::Backoff,
) -> impl Future<Output = ()> + use<> {
    let (stores, metrics) = (&shared.stores, shared.metrics.clone());
    let machines = watches.machines.subscribe_changes(selects_differently);
    let failures = watches.certificates.subscribe_changes(failure_recorded);
    let renewals = watches.certificates.subscribe_changes(renewal_recorded);
    let policies = watches.policies.subscribe();
    // Changes of the policies' specs, and deletions: a change re-checks the other policies
    // that select the Machines it concerns (their conflicts).
    let siblings = watches
        .policies
        .subscribe_with_deletions(governing_policy::spec_changed);
    let fleet_wide = breakers.fleet.failures > 0;
    let ctx = Arc::new(Context {
        client: shared.client.clone(),
        capi: shared.capi,
        machines: stores.machines.clone(),
        clusters: stores.clusters.clone(),
        policies: stores.policies.clone(),
        certificates: stores.certificates.clone(),
        recorder: shared.recorder.clone(),
        breakers,
        readings: stores.policy_readings.clone(),
        clock: shared.clock.clone(),
        resync,
        backoff,
        promises: Default::default(),
    });
    let of_namespace = policies_of_namespace(stores);
    let of_failure = {
        let of_namespace = policies_of_namespace(stores);
        move |failed: CachedCertificates| match fleet_wide {
            true => of_namespace(None),
            false => of_namespace(failed.namespace()),
        }
    };
    Controller::for_stream_with(policies, stores.policies.clone(), policy_resource())
        .graceful_shutdown_on(shared.stop.clone().cancelled_owned())
        .watches_stream_with(
            machines,
            move |machine: Machine| of_namespace(machine.namespace()),
            shared.capi,
        )
        .watches_stream_with(siblings, policies_of_sibling(stores), policy_resource())
        .watches_stream_with(failures, of_failure, ())
        .watches_stream_with(renewals, with_canaries_of_namespace(stores), ())
        .run(
            move |object, ctx| {
                observed(
                    metrics.clone(),
                    Timed::Policy,
                    reconcile(object, ctx),
                    |_: &kube::Error| "kube",
                )
            },
            error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(error = %err, "Policy reconcile error");
            }
        })
}

/// Whether a MachineCertificates records a new failed automatic renewal (its
/// `lastFailureTime` changed to an instant): what the circuit breakers count.
fn failure_recorded(before: Option<&CachedCertificates>, now: &CachedCertificates) -> bool {
    let failed = |c: &CachedCertificates| c.last_failure();
    failed(now).is_some() && before.map(failed) != Some(failed(now))
}

/// Whether a MachineCertificates records new certificates (its expiry changed): what a
/// policy's canaries wait for.
fn renewal_recorded(before: Option<&CachedCertificates>, now: &CachedCertificates) -> bool {
    now.expiry().is_some() && before.map(CachedCertificates::expiry) != Some(now.expiry())
}

/// The policies of a renewed Machine's namespace that have canaries.
fn with_canaries_of_namespace(
    stores: &Stores,
) -> impl Fn(CachedCertificates) -> Vec<ObjectRef<DynamicObject>> + use<> {
    let store = stores.policies.clone();
    move |renewed| {
        store
            .state()
            .into_iter()
            .filter(|p| p.namespace() == renewed.namespace())
            .filter(|p| p.data.pointer("/spec/canary").is_some())
            .map(|p| ObjectRef::from_obj_with(p.as_ref(), policy_resource()))
            .collect()
    }
}

/// The policies of a namespace (of every namespace for `None`).
fn policies_of_namespace(
    stores: &Stores,
) -> impl Fn(Option<String>) -> Vec<ObjectRef<DynamicObject>> + use<> {
    let store = stores.policies.clone();
    move |namespace| {
        store
            .state()
            .into_iter()
            .filter(|p| namespace.is_none() || p.namespace() == namespace)
            .map(|p| ObjectRef::from_obj_with(p.as_ref(), policy_resource()))
            .collect()
    }
}

/// The other policies of `policy`'s namespace that select a Machine it selected or selects.
fn policies_of_sibling(
    stores: &Stores,
) -> impl Fn(DynamicObject) -> Vec<ObjectRef<DynamicObject>> + use<> {
    let (stores, selections) = (stores.clone(), PolicySelections::default());
    move |policy| {
        let concerned = selections.concerned(&policy, &stores.policy_caches());
        if concerned.is_empty() {
            return Vec::new();
        }
        let namespace = policy.namespace();
        stores
            .policies
            .state()
            .into_iter()
            .filter(|p| p.namespace() == namespace && p.metadata.uid != policy.metadata.uid)
            .filter(|p| {
                stores
                    .policy_readings
                    .of(p)
                    .is_some_and(|r| concerned.iter().any(|m| m.selected_by(&r)))
            })
            .map(|p| ObjectRef::from_obj_with(p.as_ref(), policy_resource()))
            .collect()
    }
}
