//! Who may refresh now: one control plane per cluster at a time (alone: k8sd restarts the
//! control-plane services, which a worker's approvals and tunnels need), a bounded number of
//! workers per cluster and overall.
//!
//! Nobody waits here: [`Admission::try_enter`] answers at once. A refresh that may not go now
//! is noted as waiting and gives its reconcile slot back; when a holder leaves, the waiters that
//! can go are woken (their Machine is reconciled again, [`Admission::wakes`]). A waiting control
//! plane goes before workers that arrive after it. Waiters that stopped asking are forgotten
//! after [`WAITER_TTL`], and a cluster with no holder and no waiter is dropped from the map.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use ck8s_certs_api::machine_certificates::Role;
use futures::channel::mpsc;

/// A waiter that has not asked again for this long is forgotten (it asks at least every
/// [`super::WAITING_RECHECK`]).
pub const WAITER_TTL: Duration = Duration::from_secs(60);

/// A Machine, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Waiter {
    pub namespace: String,
    pub machine: String,
}

/// Why a refresh may not go now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Busy {
    /// Another control plane of the cluster is being refreshed (or is settling).
    ControlPlane,
    /// A control plane waits for the workers of its cluster to finish.
    Workers,
    /// A control plane of the cluster waits, and goes first.
    ControlPlaneWaiting,
    /// The cluster already refreshes its most workers at once.
    ClusterWorkers(usize),
    /// The controller already refreshes its most workers at once.
    AllWorkers(usize),
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ControlPlane => {
                f.write_str("another control plane of the cluster is being refreshed")
            }
            Self::Workers => f.write_str("the workers of the cluster being refreshed finish first"),
            Self::ControlPlaneWaiting => f.write_str("a control plane of the cluster goes first"),
            Self::ClusterWorkers(max) => write!(
                f,
                "{max} worker(s) of the cluster are being refreshed (--max-worker-refreshes-per-cluster)"
            ),
            Self::AllWorkers(max) => write!(
                f,
                "{max} worker(s) are being refreshed (--max-worker-refreshes)"
            ),
        }
    }
}

#[derive(Default)]
struct ClusterState {
    control_plane: bool,
    workers: usize,
    /// In the order they first asked.
    waiting: Vec<(Waiter, Role, Instant)>,
}

impl ClusterState {
    fn idle(&self) -> bool {
        !self.control_plane && self.workers == 0 && self.waiting.is_empty()
    }

    fn control_plane_waiting(&self, except: &Waiter) -> bool {
        self.waiting
            .iter()
            .any(|(w, role, _)| *role == Role::ControlPlane && w != except)
    }

    fn note_waiting(&mut self, who: &Waiter, role: Role, now: Instant) {
        match self.waiting.iter_mut().find(|(w, _, _)| w == who) {
            Some(entry) => {
                entry.1 = role;
                entry.2 = now;
            }
            None => self.waiting.push((who.clone(), role, now)),
        }
    }
}

type ClusterKey = (String, String);

#[derive(Default)]
struct State {
    clusters: HashMap<ClusterKey, ClusterState>,
    workers: usize,
}

struct Inner {
    state: Mutex<State>,
    per_cluster: usize,
    max_workers: usize,
    wakes: Option<mpsc::UnboundedSender<Waiter>>,
}

/// In-memory admission of refreshes (one controller replica acts at a time: leader election).
#[derive(Clone)]
pub struct Admission(Arc<Inner>);

/// Held while a node is being refreshed (and, for a control plane, while it settles); leaving
/// wakes the waiters that can go.
pub struct Guard {
    admission: Arc<Inner>,
    cluster: ClusterKey,
    role: Role,
}

impl Admission {
    /// `wakes`: where the Machines to reconcile again are sent when they can go.
    pub fn new(
        per_cluster: usize,
        max_workers: usize,
        wakes: Option<mpsc::UnboundedSender<Waiter>>,
    ) -> Self {
        Self(Arc::new(Inner {
            state: Mutex::default(),
            per_cluster: per_cluster.max(1),
            max_workers: max_workers.max(1),
            wakes,
        }))
    }

    /// Enters `who`'s refresh (a node of `cluster` in `namespace`, as `role`), or says why not
    /// and notes it as waiting.
    pub fn try_enter(
        &self,
        namespace: &str,
        cluster: &str,
        role: Role,
        who: &Waiter,
    ) -> Result<Guard, Busy> {
        let inner = &self.0;
        let now = Instant::now();
        let mut state = inner.lock();
        let key = (namespace.to_owned(), cluster.to_owned());
        let workers_total = state.workers;
        let entry = state.clusters.entry(key.clone()).or_default();
        entry
            .waiting
            .retain(|(_, _, asked)| now.duration_since(*asked) < WAITER_TTL);
        let busy = match role {
            Role::ControlPlane if entry.control_plane => Some(Busy::ControlPlane),
            Role::ControlPlane if entry.workers > 0 => Some(Busy::Workers),
            Role::ControlPlane => None,
            Role::Worker if entry.control_plane => Some(Busy::ControlPlane),
            Role::Worker if entry.control_plane_waiting(who) => Some(Busy::ControlPlaneWaiting),
            Role::Worker if entry.workers >= inner.per_cluster => {
                Some(Busy::ClusterWorkers(inner.per_cluster))
            }
            Role::Worker if workers_total >= inner.max_workers => {
                Some(Busy::AllWorkers(inner.max_workers))
            }
            Role::Worker => None,
        };
        if let Some(busy) = busy {
            entry.note_waiting(who, role, now);
            return Err(busy);
        }
        entry.waiting.retain(|(w, _, _)| w != who);
        match role {
            Role::ControlPlane => entry.control_plane = true,
            Role::Worker => {
                entry.workers += 1;
                state.workers += 1;
            }
        }
        Ok(Guard {
            admission: inner.clone(),
            cluster: key,
            role,
        })
    }

    /// Whether `try_enter` would let `who` go now (nothing is noted).
    pub fn would_enter(&self, namespace: &str, cluster: &str, role: Role, who: &Waiter) -> bool {
        let inner = &self.0;
        let state = inner.lock();
        let Some(entry) = state
            .clusters
            .get(&(namespace.to_owned(), cluster.to_owned()))
        else {
            return role == Role::ControlPlane || state.workers < inner.max_workers;
        };
        match role {
            Role::ControlPlane => !entry.control_plane && entry.workers == 0,
            Role::Worker => {
                !entry.control_plane
                    && !entry.control_plane_waiting(who)
                    && entry.workers < inner.per_cluster
                    && state.workers < inner.max_workers
            }
        }
    }

    /// Notes `who` as waiting for `cluster` (for something else than a place: woken with the
    /// others when a holder leaves).
    pub fn note_waiting(&self, namespace: &str, cluster: &str, role: Role, who: &Waiter) {
        let mut state = self.0.lock();
        state
            .clusters
            .entry((namespace.to_owned(), cluster.to_owned()))
            .or_default()
            .note_waiting(who, role, Instant::now());
    }

    /// Forgets `who` as a waiter (its refresh ended or went elsewhere).
    pub fn forget(&self, namespace: &str, cluster: &str, who: &Waiter) {
        let mut state = self.0.lock();
        let key = (namespace.to_owned(), cluster.to_owned());
        if let Some(entry) = state.clusters.get_mut(&key) {
            entry.waiting.retain(|(w, _, _)| w != who);
            if entry.idle() {
                state.clusters.remove(&key);
            }
        }
    }

    /// Clusters known (held or waited for): for tests and metrics.
    pub fn clusters(&self) -> usize {
        self.0.lock().clusters.len()
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `role` left `cluster`: the waiters that can go now are woken, in the order they asked: a
    /// control plane alone once no worker is left, else workers up to the free places (a
    /// worker place freed overall also wakes a worker of another cluster).
    fn leave(&self, cluster: &ClusterKey, role: Role) {
        let mut woken = Vec::new();
        {
            let mut state = self.lock();
            if role == Role::Worker {
                state.workers = state.workers.saturating_sub(1);
            }
            let free_overall = self.max_workers.saturating_sub(state.workers);
            if let Some(entry) = state.clusters.get_mut(cluster) {
                let now = Instant::now();
                entry
                    .waiting
                    .retain(|(_, _, asked)| now.duration_since(*asked) < WAITER_TTL);
                match role {
                    Role::ControlPlane => entry.control_plane = false,
                    Role::Worker => entry.workers = entry.workers.saturating_sub(1),
                }
                woken = wake_in(entry, self.per_cluster, free_overall);
                if entry.idle() {
                    state.clusters.remove(cluster);
                }
            }
            if role == Role::Worker && woken.is_empty() && free_overall > 0 {
                // A worker place freed overall: the first worker waiting elsewhere for one.
                let other = state.clusters.iter().find_map(|(key, entry)| {
                    let first = entry
                        .waiting
                        .iter()
                        .position(|(_, role, _)| *role == Role::Worker)?;
                    (key != cluster && !entry.control_plane && entry.workers < self.per_cluster)
                        .then(|| entry.waiting[first].0.clone())
                });
                woken.extend(other);
            }
        }
        if let Some(wakes) = &self.wakes {
            for waiter in woken {
                let _ = wakes.unbounded_send(waiter);
            }
        }
    }
}

/// Those of `entry`'s waiters that can go now. They stay noted as waiting until they enter (a
/// woken control plane keeps its turn before the workers) or stop asking.
fn wake_in(entry: &ClusterState, per_cluster: usize, free_overall: usize) -> Vec<Waiter> {
    if entry.control_plane {
        return Vec::new();
    }
    if let Some((first, _, _)) = entry
        .waiting
        .iter()
        .find(|(_, role, _)| *role == Role::ControlPlane)
    {
        return match entry.workers {
            0 => vec![first.clone()],
            _ => Vec::new(),
        };
    }
    let places = per_cluster.saturating_sub(entry.workers).min(free_overall);
    entry
        .waiting
        .iter()
        .take(places)
        .map(|(w, _, _)| w.clone())
        .collect()
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.admission.leave(&self.cluster, self.role);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(machine: &str) -> Waiter {
        Waiter {
            namespace: "ns".into(),
            machine: machine.into(),
        }
    }

    fn admission(per_cluster: usize, max: usize) -> (Admission, mpsc::UnboundedReceiver<Waiter>) {
        let (tx, rx) = mpsc::unbounded();
        (Admission::new(per_cluster, max, Some(tx)), rx)
    }

    fn woken(rx: &mut mpsc::UnboundedReceiver<Waiter>) -> Vec<String> {
        let mut names = Vec::new();
        while let Ok(w) = rx.try_recv() {
            names.push(w.machine);
        }
        names
    }

    #[test]
    fn a_control_plane_is_alone_in_its_cluster_and_others_are_not_held_up() {
        let (admission, mut rx) = admission(2, 10);
        let cp = admission
            .try_enter("ns", "c", Role::ControlPlane, &who("cp-0"))
            .unwrap();
        assert_eq!(
            admission
                .try_enter("ns", "c", Role::ControlPlane, &who("cp-1"))
                .err(),
            Some(Busy::ControlPlane)
        );
        assert_eq!(
            admission
                .try_enter("ns", "c", Role::Worker, &who("w-0"))
                .err(),
            Some(Busy::ControlPlane)
        );
        // Another cluster goes at once.
        let other = admission.try_enter("ns", "d", Role::ControlPlane, &who("d-cp-0"));
        assert!(other.is_ok());
        drop(cp);
        // The waiting control plane alone is woken (it goes before the worker).
        assert_eq!(woken(&mut rx), ["cp-1"]);
        assert_eq!(
            admission
                .try_enter("ns", "c", Role::Worker, &who("w-0"))
                .err(),
            Some(Busy::ControlPlaneWaiting)
        );
        let cp1 = admission
            .try_enter("ns", "c", Role::ControlPlane, &who("cp-1"))
            .unwrap();
        drop(cp1);
        assert_eq!(woken(&mut rx), ["w-0"]);
    }

    #[test]
    fn a_waiting_control_plane_goes_before_workers_that_come_after_it() {
        let (admission, mut rx) = admission(2, 10);
        let w0 = admission
            .try_enter("ns", "c", Role::Worker, &who("w-0"))
            .unwrap();
        assert_eq!(
            admission
                .try_enter("ns", "c", Role::ControlPlane, &who("cp-0"))
                .err(),
            Some(Busy::Workers)
        );
        // A place is free for a second worker, but the control plane waits: the worker waits.
        assert_eq!(
            admission
                .try_enter("ns", "c", Role::Worker, &who("w-1"))
                .err(),
            Some(Busy::ControlPlaneWaiting)
        );
        assert!(!admission.would_enter("ns", "c", Role::Worker, &who("w-1")));
        drop(w0);
        assert_eq!(woken(&mut rx), ["cp-0"]);
    }

    #[test]
    fn workers_are_bounded_per_cluster_and_overall_and_woken_one_place_at_a_time() {
        let (admission, mut rx) = admission(2, 3);
        let a0 = admission
            .try_enter("ns", "a", Role::Worker, &who("a-0"))
            .unwrap();
        let _a1 = admission
            .try_enter("ns", "a", Role::Worker, &who("a-1"))
            .unwrap();
        assert_eq!(
            admission
                .try_enter("ns", "a", Role::Worker, &who("a-2"))
                .err(),
            Some(Busy::ClusterWorkers(2))
        );
        let _b0 = admission
            .try_enter("ns", "b", Role::Worker, &who("b-0"))
            .unwrap();
        assert_eq!(
            admission
                .try_enter("ns", "b", Role::Worker, &who("b-1"))
                .err(),
            Some(Busy::AllWorkers(3))
        );
        assert_eq!(
            admission
                .try_enter("ns", "a", Role::Worker, &who("a-3"))
                .err(),
            Some(Busy::ClusterWorkers(2))
        );
        drop(a0);
        // One place freed: the first waiter of that cluster.
        assert_eq!(woken(&mut rx), ["a-2"]);
    }

    #[test]
    fn a_freed_place_overall_wakes_a_worker_of_another_cluster() {
        let (admission, mut rx) = admission(5, 1);
        let a0 = admission
            .try_enter("ns", "a", Role::Worker, &who("a-0"))
            .unwrap();
        assert_eq!(
            admission
                .try_enter("ns", "b", Role::Worker, &who("b-0"))
                .err(),
            Some(Busy::AllWorkers(1))
        );
        drop(a0);
        assert_eq!(woken(&mut rx), ["b-0"]);
    }

    #[test]
    fn clusters_without_holders_or_waiters_are_dropped() {
        let (admission, _rx) = admission(2, 10);
        for i in 0..100 {
            let cluster = format!("c{i}");
            let guard = admission.try_enter("ns", &cluster, Role::ControlPlane, &who("cp"));
            drop(guard);
        }
        assert_eq!(admission.clusters(), 0);
        let held = admission
            .try_enter("ns", "x", Role::ControlPlane, &who("cp"))
            .unwrap();
        let _ = admission.try_enter("ns", "x", Role::Worker, &who("w"));
        admission.forget("ns", "x", &who("w"));
        assert_eq!(admission.clusters(), 1);
        drop(held);
        assert_eq!(admission.clusters(), 0);
    }
}
