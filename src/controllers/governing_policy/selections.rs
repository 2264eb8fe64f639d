//! Which Machines a change of a CertificateRenewalPolicy concerns: those its previous
//! generation selected and those its new one selects. Not the whole namespace: with a hundred
//! policies in a namespace of a thousand Machines, re-checking the namespace on every edit made
//! an edit of each policy a hundred thousand Machine reconciles (docs/performance.md).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use ck8s_certs_api::machine::{Cluster, Machine};
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::reflector::Store;

use super::{PolicyReadings, Reading};
use crate::policy::spec::MachineSelector;

/// What one consumer was last shown of each policy (by UID): its generation and reading. Each
/// consumer keeps its own, as each is shown every change once.
#[derive(Default)]
pub struct PolicySelections(Mutex<HashMap<String, Shown>>);

struct Shown {
    generation: Option<i64>,
    reading: Arc<Reading>,
}

/// A Machine with the labels that policies select it by (one that a policy change concerns).
pub struct Concerned {
    pub machine: Arc<Machine>,
    cluster_labels: Option<Arc<BTreeMap<String, String>>>,
    labels: BTreeMap<String, String>,
}

impl Concerned {
    /// Whether the policy read as `reading` selects this Machine.
    pub(crate) fn selected_by(&self, reading: &Reading) -> bool {
        reading.selects(self.cluster_labels.as_deref(), &self.labels)
    }

    /// Whether this Machine is on a canary cluster of `policy`.
    pub fn is_canary(&self, policy: &crate::policy::ValidPolicy) -> bool {
        policy.is_canary(self.cluster_labels.as_deref())
    }

    /// Whether `selector` selects this Machine.
    pub fn matched_by(&self, selector: &MachineSelector) -> bool {
        selector.matches(self.cluster_labels.as_deref(), &self.labels)
    }
}

/// The Machines of `namespace` in the cache, each with the labels that policies select it by
/// (its own and its Cluster's).
pub fn in_namespace(
    machines: &Store<Machine>,
    clusters: &Store<Cluster>,
    namespace: &str,
) -> Vec<Concerned> {
    let here = |meta: &kube::core::ObjectMeta| meta.namespace.as_deref() == Some(namespace);
    let cluster_labels: HashMap<String, Arc<BTreeMap<String, String>>> = clusters
        .state()
        .iter()
        .filter(|c| here(&c.metadata))
        .map(|c| {
            let labels = c.metadata.labels.clone().unwrap_or_default();
            (c.name_any(), Arc::new(labels))
        })
        .collect();
    machines
        .state()
        .into_iter()
        .filter(|m| here(&m.metadata))
        .map(|machine| Concerned {
            cluster_labels: machine
                .cluster()
                .and_then(|c| cluster_labels.get(c))
                .cloned(),
            labels: machine.labels.to_map(),
            machine,
        })
        .collect()
}

/// The caches a change of a policy's selection is read from.
pub struct Caches<'a> {
    pub policies: &'a Store<DynamicObject>,
    pub readings: &'a PolicyReadings,
    pub machines: &'a Store<Machine>,
    pub clusters: &'a Store<Cluster>,
}

impl PolicySelections {
    /// The Machines of the cache that a change of `policy` concerns: those its generation shown
    /// before selected and those its current one selects. A write of its status alone (the
    /// generation already shown) concerns none; a policy gone from the cache (deleted) concerns
    /// those it selected.
    pub fn concerned(&self, policy: &DynamicObject, stores: &Caches<'_>) -> Vec<Concerned> {
        let Some(uid) = policy.metadata.uid.as_deref() else {
            return Vec::new();
        };
        let current = stores.policies.state();
        let deleted = !current
            .iter()
            .any(|p| p.metadata.uid.as_deref() == Some(uid));
        let (before, now) = {
            let mut shown = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            let readings = if deleted {
                let before = shown.remove(uid).map(|s| s.reading);
                // Deleted before it was ever shown: what it selected is what it says.
                (before.or_else(|| Reading::of(policy).map(Arc::new)), None)
            } else {
                let generation = policy.metadata.generation;
                if shown.get(uid).is_some_and(|s| s.generation == generation) {
                    return Vec::new();
                }
                let Some(reading) = stores.readings.of(policy) else {
                    return Vec::new();
                };
                let before = shown.insert(
                    uid.to_owned(),
                    Shown {
                        generation,
                        reading: reading.clone(),
                    },
                );
                (before.map(|s| s.reading), Some(reading))
            };
            // Deletions missed (say while the watch was down) are forgotten now and then.
            if shown.len() > current.len() + 16 {
                let uids: std::collections::HashSet<&str> = current
                    .iter()
                    .filter_map(|p| p.metadata.uid.as_deref())
                    .collect();
                shown.retain(|uid, _| uids.contains(uid.as_str()));
            }
            readings
        };
        selected(policy, stores, before, now)
    }

    /// The Machines `policy` selects now, whatever was shown before: those whose verdict a
    /// change of its status (its circuit breaker) concerns.
    pub fn selected_now(&self, policy: &DynamicObject, stores: &Caches<'_>) -> Vec<Concerned> {
        let now = stores.readings.of(policy);
        selected(policy, stores, None, now)
    }
}

/// The Machines of `policy`'s namespace that `before` or `now` selects.
fn selected(
    policy: &DynamicObject,
    stores: &Caches<'_>,
    before: Option<Arc<Reading>>,
    now: Option<Arc<Reading>>,
) -> Vec<Concerned> {
    let selects = |reading: &Option<Arc<Reading>>, machine: &Concerned| {
        reading.as_ref().is_some_and(|r| machine.selected_by(r))
    };
    in_namespace(
        stores.machines,
        stores.clusters,
        policy.namespace().as_deref().unwrap_or_default(),
    )
    .into_iter()
    .filter(|m| selects(&before, m) || selects(&now, m))
    .collect()
}
