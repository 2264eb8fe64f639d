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
use std::time::Duration;

use ck8s_certs_api::machine_certificates::Role;
use futures::channel::mpsc;
use tokio::time::Instant;

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
    waiting: Vec<Queued>,
}

/// A refresh waiting for its cluster.
struct Queued {
    who: Waiter,
    role: Role,
    /// When it last asked (it is forgotten [`WAITER_TTL`] after).
    asked: Instant,
    /// When it first asked: a place freed overall goes to the worker of another cluster that
    /// has waited longest.
    since: Instant,
}

impl ClusterState {
    fn idle(&self) -> bool {
        !self.control_plane && self.workers == 0 && self.waiting.is_empty()
    }

    fn control_plane_waiting(&self, except: &Waiter) -> bool {
        self.waiting
            .iter()
            .any(|q| q.role == Role::ControlPlane && q.who != *except)
    }

    /// Forgets the waiters that stopped asking.
    fn forget_lapsed(&mut self, now: Instant) {
        self.waiting
            .retain(|q| now.duration_since(q.asked) < WAITER_TTL);
    }

    fn note_waiting(&mut self, who: &Waiter, role: Role, now: Instant) {
        match self.waiting.iter_mut().find(|q| q.who == *who) {
            Some(entry) => {
                entry.role = role;
                entry.asked = now;
            }
            None => self.waiting.push(Queued {
                who: who.clone(),
                role,
                asked: now,
                since: now,
            }),
        }
    }
}

type ClusterKey = (String, String);

#[derive(Default)]
struct State {
    clusters: HashMap<ClusterKey, ClusterState>,
    workers: usize,
    /// Waiters woken for a place that frees, and when: the place is theirs for [`INVITED_FOR`],
    /// so the other waiters that look meanwhile (every [`super::WAITING_RECHECK`]) do not race
    /// them for it.
    invited: HashMap<Waiter, (ClusterKey, Role, Instant)>,
}

/// How long a place stays kept for the waiter woken for it.
pub const INVITED_FOR: Duration = Duration::from_secs(5);

impl State {
    /// Forgets invitations older than [`INVITED_FOR`].
    fn expire(&mut self, now: Instant) {
        self.invited
            .retain(|_, (_, _, at)| now.duration_since(*at) < INVITED_FOR);
    }

    /// Places kept for others than `who`: in `cluster`, and overall (workers); and whether a
    /// control plane of `cluster` other than `who` is invited.
    fn kept(&self, cluster: &ClusterKey, who: &Waiter) -> (usize, usize, bool) {
        let mut in_cluster = 0;
        let mut overall = 0;
        let mut control_plane = false;
        for (waiter, (key, role, _)) in &self.invited {
            if waiter == who {
                continue;
            }
            match role {
                Role::Worker => {
                    overall += 1;
                    in_cluster += usize::from(key == cluster);
                }
                Role::ControlPlane => control_plane |= key == cluster,
            }
        }
        (in_cluster, overall, control_plane)
    }
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
        let mut state = inner.lock();
        let key = inner.check(&mut state, namespace, cluster, role, who)?;
        state.invited.remove(who);
        let entry = state.clusters.entry(key.clone()).or_default();
        entry.waiting.retain(|q| q.who != *who);
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

    /// Whether it is `who`'s turn: what [`Self::try_enter`] decides, without taking the place.
    /// The place is kept for `who` for [`INVITED_FOR`] while it reaches its node, as for a
    /// woken waiter: long enough for a node that answers (so that the others do not race it
    /// for the place and reach their nodes for nothing), too short for a slow one to keep the
    /// others out. Noted as waiting when not.
    pub fn turn(
        &self,
        namespace: &str,
        cluster: &str,
        role: Role,
        who: &Waiter,
    ) -> Result<(), Busy> {
        let inner = &self.0;
        let mut state = inner.lock();
        let key = inner.check(&mut state, namespace, cluster, role, who)?;
        state
            .invited
            .insert(who.clone(), (key, role, Instant::now()));
        Ok(())
    }

    /// `who` will not take the place its [`Self::turn`] kept (it did not reach its node).
    pub fn pass(&self, who: &Waiter) {
        self.0.lock().invited.remove(who);
    }

    /// Whether `try_enter` would let `who` go now (nothing is noted).
    pub fn would_enter(&self, namespace: &str, cluster: &str, role: Role, who: &Waiter) -> bool {
        let inner = &self.0;
        let mut state = inner.lock();
        state.expire(Instant::now());
        let key = (namespace.to_owned(), cluster.to_owned());
        inner.busy(&state, &key, role, who).is_none()
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
            entry.waiting.retain(|q| q.who != *who);
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

    /// `cluster`'s key when `who` may go now as `role`, else why not (and `who` noted waiting).
    fn check(
        &self,
        state: &mut State,
        namespace: &str,
        cluster: &str,
        role: Role,
        who: &Waiter,
    ) -> Result<ClusterKey, Busy> {
        let now = Instant::now();
        state.expire(now);
        let key = (namespace.to_owned(), cluster.to_owned());
        if let Some(entry) = state.clusters.get_mut(&key) {
            entry.forget_lapsed(now);
        }
        if let Some(busy) = self.busy(state, &key, role, who) {
            state
                .clusters
                .entry(key)
                .or_default()
                .note_waiting(who, role, now);
            return Err(busy);
        }
        Ok(key)
    }

    /// Why `who` may not go now as `role` in `cluster`, counting the places kept for waiters
    /// already woken.
    fn busy(&self, state: &State, cluster: &ClusterKey, role: Role, who: &Waiter) -> Option<Busy> {
        let (kept_here, kept_overall, control_plane_invited) = state.kept(cluster, who);
        let idle = ClusterState::default();
        let entry = state.clusters.get(cluster).unwrap_or(&idle);
        match role {
            Role::ControlPlane if entry.control_plane || control_plane_invited => {
                Some(Busy::ControlPlane)
            }
            Role::ControlPlane if entry.workers > 0 => Some(Busy::Workers),
            Role::ControlPlane => None,
            Role::Worker if entry.control_plane => Some(Busy::ControlPlane),
            Role::Worker if control_plane_invited || entry.control_plane_waiting(who) => {
                Some(Busy::ControlPlaneWaiting)
            }
            Role::Worker if entry.workers + kept_here >= self.per_cluster => {
                Some(Busy::ClusterWorkers(self.per_cluster))
            }
            Role::Worker if state.workers + kept_overall >= self.max_workers => {
                Some(Busy::AllWorkers(self.max_workers))
            }
            Role::Worker => None,
        }
    }

    /// `role` left `cluster`: the waiters that can go now are woken, in the order they asked: a
    /// control plane alone once no worker is left, else workers up to the free places (a
    /// worker place freed overall, with no worker of this cluster waiting for it, wakes the
    /// worker of another cluster that has waited longest).
    fn leave(&self, cluster: &ClusterKey, role: Role) {
        let mut woken: Vec<(Waiter, ClusterKey, Role)> = Vec::new();
        {
            let mut state = self.lock();
            let now = Instant::now();
            state.expire(now);
            if role == Role::Worker {
                state.workers = state.workers.saturating_sub(1);
            }
            let invited_workers = state
                .invited
                .values()
                .filter(|(_, role, _)| *role == Role::Worker)
                .count();
            let free_overall = self
                .max_workers
                .saturating_sub(state.workers + invited_workers);
            let kept_here = state
                .invited
                .values()
                .filter(|(key, role, _)| key == cluster && *role == Role::Worker)
                .count();
            let State {
                clusters, invited, ..
            } = &mut *state;
            if let Some(entry) = clusters.get_mut(cluster) {
                entry.forget_lapsed(now);
                match role {
                    Role::ControlPlane => entry.control_plane = false,
                    Role::Worker => entry.workers = entry.workers.saturating_sub(1),
                }
                let places = self
                    .per_cluster
                    .saturating_sub(entry.workers + kept_here)
                    .min(free_overall);
                woken.extend(
                    wake_in(entry, places, invited)
                        .into_iter()
                        .map(|(w, role)| (w, cluster.clone(), role)),
                );
                if entry.idle() {
                    clusters.remove(cluster);
                }
            }
            if role == Role::Worker && woken.is_empty() && free_overall > 0 {
                // A worker place freed overall: the worker that has waited longest elsewhere
                // (the first in line of each cluster that has a place).
                let other = clusters
                    .iter()
                    .filter_map(|(key, entry)| {
                        let first = entry
                            .waiting
                            .iter()
                            .find(|q| q.role == Role::Worker && !invited.contains_key(&q.who))?;
                        let kept = invited
                            .values()
                            .filter(|(k, role, _)| k == key && *role == Role::Worker)
                            .count();
                        (key != cluster
                            && !entry.control_plane
                            && entry.workers + kept < self.per_cluster)
                            .then_some((first, key))
                    })
                    .min_by_key(|(first, _)| first.since)
                    .map(|(first, key)| (first.who.clone(), key.clone(), Role::Worker));
                woken.extend(other);
            }
            for (waiter, key, role) in &woken {
                invited.insert(waiter.clone(), (key.clone(), *role, now));
            }
        }
        if let Some(wakes) = &self.wakes {
            for (waiter, _, _) in woken {
                let _ = wakes.unbounded_send(waiter);
            }
        }
    }
}

/// Those of `entry`'s waiters that can go now, with their role: a control plane alone once no
/// worker is left, else workers up to `places`, skipping those woken already. They stay noted
/// as waiting until they enter (a woken control plane keeps its turn before the workers) or
/// stop asking.
fn wake_in(
    entry: &ClusterState,
    places: usize,
    invited: &HashMap<Waiter, (ClusterKey, Role, Instant)>,
) -> Vec<(Waiter, Role)> {
    if entry.control_plane {
        return Vec::new();
    }
    if let Some(Queued { who: first, .. }) =
        entry.waiting.iter().find(|q| q.role == Role::ControlPlane)
    {
        return match (entry.workers, invited.contains_key(first)) {
            (0, false) => vec![(first.clone(), Role::ControlPlane)],
            _ => Vec::new(),
        };
    }
    entry
        .waiting
        .iter()
        .filter(|q| !invited.contains_key(&q.who))
        .take(places)
        .map(|q| (q.who.clone(), q.role))
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
    fn a_freed_place_is_kept_for_the_waiter_woken_for_it() {
        let (admission, mut rx) = admission(1, 10);
        let running = admission
            .try_enter("ns", "c", Role::Worker, &who("w-0"))
            .unwrap();
        for waiter in ["w-1", "w-2"] {
            assert!(
                admission
                    .try_enter("ns", "c", Role::Worker, &who(waiter))
                    .is_err()
            );
        }
        drop(running);
        assert_eq!(woken(&mut rx), ["w-1"]);
        // The other waiter, looking meanwhile, finds the place taken...
        assert!(!admission.would_enter("ns", "c", Role::Worker, &who("w-2")));
        assert_eq!(
            admission
                .try_enter("ns", "c", Role::Worker, &who("w-2"))
                .err(),
            Some(Busy::ClusterWorkers(1))
        );
        // ...the woken one goes.
        assert!(admission.would_enter("ns", "c", Role::Worker, &who("w-1")));
        let next = admission
            .try_enter("ns", "c", Role::Worker, &who("w-1"))
            .unwrap();
        drop(next);
        assert_eq!(woken(&mut rx), ["w-2"]);
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
    fn a_freed_place_overall_goes_to_the_cluster_whose_worker_waited_longest() {
        let (admission, mut rx) = admission(5, 1);
        let a0 = admission
            .try_enter("ns", "a", Role::Worker, &who("a-0"))
            .unwrap();
        // Ten clusters queue one worker each, in this order; asking again keeps the place.
        let clusters: Vec<String> = (0..10).map(|i| format!("q{i}")).collect();
        for cluster in &clusters {
            let worker = who(&format!("{cluster}-w"));
            assert!(
                admission
                    .try_enter("ns", cluster, Role::Worker, &worker)
                    .is_err()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        for cluster in clusters.iter().rev() {
            let worker = who(&format!("{cluster}-w"));
            assert!(
                admission
                    .try_enter("ns", cluster, Role::Worker, &worker)
                    .is_err()
            );
        }
        drop(a0);
        assert_eq!(woken(&mut rx), ["q0-w"]);
        let q0 = admission
            .try_enter("ns", "q0", Role::Worker, &who("q0-w"))
            .unwrap();
        drop(q0);
        assert_eq!(woken(&mut rx), ["q1-w"]);
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
