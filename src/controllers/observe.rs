//! What the controllers export about themselves: the certificate expiry series, read from the
//! caches when scraped, and each reconcile's time and error category.

use std::sync::Arc;

use ck8s_certs_api::capi::{CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL};
use ck8s_certs_api::machine::Machine;
use kube::runtime::controller;
use kube::runtime::reflector::Store;

use crate::controllers::stores;
use crate::metrics::{Controller as Timed, Metrics, role_label};

/// The series of `certificate_expiry_timestamp_seconds`: each CK8s Machine in the cache whose
/// MachineCertificates' status knows its expiry (what each Machine's reconcile exported before
/// the series were read from the caches; a deleted Machine's series now goes with it).
pub(super) struct CachedExpiries {
    pub(super) machines: Store<Machine>,
    pub(super) certificates: stores::CertificateStore,
}

impl CachedExpiries {
    /// Each Machine with a known expiry: the expiry, and since when its renewal is overdue.
    fn series(&self) -> impl Iterator<Item = (Arc<Machine>, f64, Option<f64>)> + '_ {
        let seconds = |at: jiff::Timestamp| at.as_millisecond() as f64 / 1000.0;
        self.machines
            .state()
            .into_iter()
            .filter(|machine| machine.is_ck8s())
            .filter_map(move |machine| {
                let meta = &machine.metadata;
                let (namespace, name) = (meta.namespace.as_deref()?, meta.name.as_deref()?);
                let cached = self.certificates.get(namespace, name)?;
                let expiry = seconds(cached.expiry()?);
                Some((machine, expiry, cached.overdue_since().map(seconds)))
            })
    }
}

impl std::fmt::Debug for CachedExpiries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedExpiries").finish_non_exhaustive()
    }
}

impl crate::metrics::ExpirySource for CachedExpiries {
    fn is_empty(&self) -> bool {
        self.series().next().is_none()
    }

    fn for_each(&self, each: &mut dyn FnMut(crate::metrics::MachineExpiry<'_>)) {
        use ck8s_certs_api::machine_certificates::Role;
        for (machine, expiry, overdue_since) in self.series() {
            let meta = &machine.metadata;
            // As the Machine's view has it (`MachineView::of`).
            let cluster = machine
                .cluster_name
                .as_deref()
                .or_else(|| machine.labels.get(CLUSTER_NAME_LABEL));
            let role = match machine.labels.contains_key(CONTROL_PLANE_LABEL) {
                true => Role::ControlPlane,
                false => Role::Worker,
            };
            each(crate::metrics::MachineExpiry {
                namespace: meta.namespace.as_deref().unwrap_or_default(),
                cluster: cluster.unwrap_or_default(),
                machine: meta.name.as_deref().unwrap_or_default(),
                role: role_label(role),
                expiry,
                overdue_since,
            });
        }
    }
}

/// The series of `renewals_halted_since_timestamp_seconds`: each cached policy whose status
/// says its circuit breaker is open.
pub(super) struct CachedHalts(pub(super) Store<kube::api::DynamicObject>);

impl std::fmt::Debug for CachedHalts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedHalts").finish_non_exhaustive()
    }
}

impl crate::metrics::HaltedSource for CachedHalts {
    fn for_each(&self, each: &mut dyn FnMut(crate::metrics::HaltedPolicy<'_>)) {
        for policy in self.0.state() {
            let Some(since) = super::governing_policy::halted_since(&policy) else {
                continue;
            };
            let scope = match policy.data.pointer("/status/breaker/scope") {
                Some(serde_json::Value::String(scope)) if scope == "Fleet" => "fleet",
                _ => "policy",
            };
            let meta = &policy.metadata;
            each((
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default(),
                scope,
                since.as_millisecond() as f64 / 1000.0,
            ));
        }
    }
}

/// Runs one reconcile, recording its wall time and, when it fails, its error's category
/// (`ck8s_certs_reconcile_duration_seconds`, `ck8s_certs_reconcile_errors_total`); a panic is
/// category `panic` and a requeue ([`super::panics`]).
pub(super) async fn observed<E>(
    metrics: Arc<Metrics>,
    controller: Timed,
    reconcile: impl std::future::Future<Output = Result<controller::Action, E>>,
    category: fn(&E) -> &'static str,
) -> Result<controller::Action, E> {
    let started = std::time::Instant::now();
    let (result, failed) = match super::panics::contained(reconcile).await {
        Ok(result) => {
            let failed = result.as_ref().err().map(category);
            (result, failed)
        }
        Err(_) => (
            Ok(controller::Action::requeue(super::panics::RETRY_AFTER)),
            Some("panic"),
        ),
    };
    metrics.reconciled(controller, started.elapsed(), failed);
    result
}
