//! Whether a due automatic renewal waits for its policy's canaries (`crate::policy::canary`), as
//! the caches show them. The answer is the same for every Machine of the policy that is not a
//! canary, and finding it scans the namespace's Machines: it is kept for a few seconds per
//! policy generation, so that a thousand Machines held together cost one scan, not a thousand.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use ck8s_certs_api::machine::MachineView;
use jiff::{SignedDuration, Timestamp};

use super::Gate;
use crate::controllers::governing_policy::{Governing, canary_machines};
use crate::controllers::stores::Stores;
use crate::policy::canary::{self, Standing};

/// How long one look at a policy's canaries stands.
const FRESH: SignedDuration = SignedDuration::from_secs(5);

/// A policy (namespace, name, generation) and the start of its canaries, as read.
type Key = (String, String, Option<i64>, Option<Timestamp>);

/// The last look at each policy's canaries: when, and what it found.
#[derive(Default)]
pub struct Looks(Mutex<HashMap<Key, (Timestamp, Option<Gate>)>>);

impl Looks {
    /// Whether `machine` (on a Cluster labelled `cluster_labels`) waits for the canaries of the
    /// policy that `governing` names.
    pub fn gate(
        &self,
        stores: &Stores,
        machine: &MachineView,
        cluster_labels: Option<&BTreeMap<String, String>>,
        governing: &Governing,
        settings: crate::policy::Settings,
        now: Timestamp,
    ) -> Option<Gate> {
        let Governing::One {
            info,
            policy: Ok(policy),
        } = governing
        else {
            return None;
        };
        let max_wait = policy.canary.as_ref()?.max_wait;
        if policy.is_canary(cluster_labels) {
            return None;
        }
        let key = (
            machine.namespace.clone(),
            info.name.clone(),
            info.generation,
            info.canaries_since,
        );
        let mut looks = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, gate)) = looks.get(&key)
            && now.duration_since(*at) < FRESH
            && *at <= now
        {
            return gate.clone();
        }
        let canaries = canary_machines(
            &stores.machines,
            &stores.clusters,
            &stores.certificates,
            &machine.namespace,
            policy,
            settings,
        );
        // Before the policy's status names this generation's start: from now, held meanwhile.
        let since = info.canaries_since.unwrap_or(now);
        let gate = match canary::standing(&canaries, since, max_wait, now) {
            Standing::Hold(hold) => Some(Gate::Canary(hold)),
            Standing::NoCanaries | Standing::Renewed | Standing::WaitElapsed => None,
        };
        // Looks at generations gone are dropped with the rest once stale.
        looks.retain(|_, (at, _)| now.duration_since(*at) < FRESH);
        looks.insert(key, (now, gate.clone()));
        gate
    }
}
