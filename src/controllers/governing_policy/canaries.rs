//! A policy's canaries as the caches show them (the rules: `crate::policy::canary`): its CK8s
//! Machines on Clusters that `canary.clusterSelector` matches, each reduced to when it became due,
//! failed and last renewed; and when the policy's current generation was first seen, as its
//! status says (the policy controller writes it).

use ck8s_certs_api::machine::{Cluster, Machine};
use ck8s_certs_api::machine_certificates::Phase;
use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::reflector::Store;

use super::selections::in_namespace;
use crate::controllers::stores::CertificateStore;
use crate::policy::canary::CanaryMachine;
use crate::policy::spec::{Settings, ValidPolicy};
use crate::policy::{Failures, lifetime_start};

/// The canary Machines of `policy` (valid, of `namespace`) in the caches, sorted by name.
pub fn canary_machines(
    machines: &Store<Machine>,
    clusters: &Store<Cluster>,
    certificates: &CertificateStore,
    namespace: &str,
    policy: &ValidPolicy,
    settings: Settings,
) -> Vec<CanaryMachine> {
    if policy.canary.is_none() {
        return Vec::new();
    }
    let mut found: Vec<CanaryMachine> = in_namespace(machines, clusters, namespace)
        .into_iter()
        .filter(|m| m.machine.is_ck8s() && m.matched_by(&policy.selector) && m.is_canary(policy))
        .map(|m| {
            let name = m.machine.name_any();
            let status = certificates
                .get(namespace, &name)
                .and_then(|cached| cached.status().ok().flatten())
                .unwrap_or_default();
            let expiry = status.expiry.as_ref().map(|t| t.0);
            let due_at = expiry.map(|expiry| {
                policy
                    .input(Some(expiry), Failures::default(), settings)
                    .with_lifetime_start(lifetime_start(&status))
                    .due_at(expiry)
            });
            let failed_at = status
                .last_failure_time
                .as_ref()
                .filter(|_| status.failed_attempts.unwrap_or_default() > 0)
                .map(|t| t.0);
            let renewed_at = status
                .operation
                .as_ref()
                .filter(|op| op.phase == Phase::Succeeded)
                .and_then(|op| op.finished_at.as_ref())
                .map(|t| t.0);
            CanaryMachine {
                machine: format!("{namespace}/{name}"),
                due_at,
                failed_at,
                renewed_at,
            }
        })
        .collect();
    found.sort_by(|a, b| a.machine.cmp(&b.machine));
    found
}

/// When the controller first saw `policy`'s current generation with its canaries, as its status
/// says; `None` when the status speaks of another generation (not written yet).
pub fn canaries_since(policy: &DynamicObject) -> Option<Timestamp> {
    let canaries = policy.data.pointer("/status/canaries")?;
    let generation = canaries
        .get("generation")
        .and_then(serde_json::Value::as_i64);
    (generation == policy.metadata.generation)
        .then(|| canaries.get("since")?.as_str()?.parse().ok())
        .flatten()
}
