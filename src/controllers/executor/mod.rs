//! The refresh executor: carries one accepted refresh out on its node, and nothing else. It
//! meets the Machine reconciler only through [`Accepted`] (what to do), [`Finished`] (what came
//! of it) and three narrow seams: the [`Connector`] to the node's k8sd, the [`Journal`] (the
//! request's status: the seed before `run`) and the clock. It never sleeps for a turn: a
//! refresh that must wait gives its reconcile slot back and is woken, or looked at again, when
//! it can go.
//!
//! ```text
//! execute(Accepted) ──► a worker not on its node yet, a control plane of its cluster pending?
//!    │                        └─yes─► Wait (woken when the control plane leaves the cluster)
//!    ▼
//! Admission::turn (a control plane alone in its cluster; workers bounded; the place kept
//!    │                for it 5 s)  └─busy─► Wait (woken when a place frees)
//!    ▼
//! Connector::node (∥ ::approver for a worker; nothing sent to the node), in all within
//!    │   --node-connect-timeout, no place held ─ not answering ─► Wait 1 s … 8 s,
//!    │                                            up to --refresh-wait-timeout
//!    ▼
//! Admission::try_enter (the place taken now; taken meanwhile ─► Wait, as above)
//!    ▼
//! attempts: plan ─► Journal::record(seed) ─► run (∥ approve) ─ no answer ─► new plan (≤ 3 runs)
//!    │        └─ plan not answering ─► Wait (as above; timeouts tried --k8sd-retries times)
//!    ▼
//! Ran { op, settle } | Failed { op, failure } | Stopping | Superseded
//!    └─ a control plane's Settle keeps its cluster until the node answers again (its own task)
//! ```
//!
//! What a waiting refresh needs to go on (its operation before the seed, its wait budget) is
//! kept in memory, and shown to the reconciler by [`Executor::look`]; after a restart the
//! journal has the rest.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ck8s_certs_api::annotations::FORCE_REFRESH;
use ck8s_certs_api::machine_certificates::{Operation, Role};
use jiff::Timestamp;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::clock::{Clock, SharedClock};
use crate::k8sd::K8sdError;
use crate::policy::Ttl;
use crate::refresh::{ApproveApi, NodeApi};

pub mod admission;
mod attempts;
mod failure;
#[cfg(test)]
mod scripted;

pub use admission::{Admission, Busy, Guard, Waiter};
pub use failure::{ApiError, Failure, UNVERIFIED_CSR, Wait, deadline_after, unverified_hint};

/// `run` is sent at most this many times per operation (across retries and restarts), each time
/// after a new `plan`. A second send only happens when the first one's outcome is unknown.
pub const MAX_RUN_SENDS: u32 = 3;

/// A waiting refresh that was not woken is looked at again after this long (a wake-up can be
/// lost, and some waits have no one to wake them: a control plane pending but not started).
pub const WAITING_RECHECK: Duration = Duration::from_secs(10);

/// A refresh a pre-flight gate holds is looked at again after this long: the gates are other
/// objects' state, whose changes do not wake it.
const GATE_RECHECK: Duration = Duration::from_secs(30);

/// How the executor waits, from the command line.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How long a refresh waits for a node, a control plane or a workload cluster API that does
    /// not answer (k8sd restarts services after a refresh), and for the control planes of its
    /// cluster (a worker), before it fails or goes on.
    pub wait_timeout: Duration,
    /// Calls to a node that time out are tried this many times in all.
    pub tries: u32,
    /// After a control-plane `run`, how long to wait for the node's k8sd to answer again before
    /// another refresh of that cluster may start.
    pub settle_timeout: Duration,
    /// How long a `run` may take on the node (`--k8sd-run-timeout`).
    pub run_timeout: Duration,
    /// How long reaching a node may take in all (`--node-connect-timeout`).
    pub connect_timeout: Duration,
}

/// A refresh taken up by the Machine reconciler, to be carried out on its node.
#[derive(Clone, Debug)]
pub struct Accepted {
    pub namespace: String,
    pub machine: String,
    pub cluster: String,
    pub node: String,
    pub role: Role,
    /// The lifetime asked for, checked.
    pub ttl: Ttl,
    /// The name of the request carrying it.
    pub request: String,
    /// The operation as journaled (or, before its seed, as taken up).
    pub op: Operation,
    /// For a worker: a control plane of its cluster is being refreshed or asked to be.
    pub control_planes_pending: bool,
    /// A pre-flight gate of its cluster that holds it (a manual refresh not forced), said
    /// whole: it waits, before anything is sent to its node.
    pub gate: Option<String>,
}

/// What came of [`Executor::execute`].
pub enum Finished<N> {
    /// `run` answered: `op` is Succeeded. A control plane's `settle` keeps its cluster until
    /// the node answers again: start it once the outcome is recorded.
    Ran {
        op: Operation,
        settle: Option<Settle<N>>,
    },
    /// The operation failed: `op` as last journaled.
    Failed { op: Operation, failure: Failure },
    /// Not now: look again after `after` (or when woken); `why` says what it waits for.
    Wait { after: Duration, why: String },
    /// The process is stopping and nothing was sent for this operation.
    Stopping,
    /// Another instance carries it out.
    Superseded,
}

/// The node, and what its `run` needs.
pub struct NodeSession<N> {
    pub node: N,
    /// A control plane's extra SANs (its CK8sConfig's, its name, the Cluster endpoint).
    pub extra_sans: Vec<String>,
    /// How the node's k8sd is reached (`op.transport`): a port-forward to its k8sd-proxy pod,
    /// or a direct connection and why.
    pub reached_by: String,
}

/// The way to the node's k8sd (and to a control plane that approves a worker's CSRs).
/// Both are asked at once for a worker: looking for a Ready control plane that answers takes
/// several reads and a tunnel of its own.
pub trait Connector: Sync {
    type Node: NodeApi + Probe + 'static;
    type Approver: ApproveApi;
    fn node(&self) -> impl Future<Output = Result<NodeSession<Self::Node>, Failure>> + Send;
    fn approver(&self) -> impl Future<Output = Result<Self::Approver, Failure>> + Send;
}

/// Whether a node's k8sd answers (after a restart).
pub trait Probe: Send {
    fn probe(&mut self) -> impl Future<Output = Result<(), K8sdError>> + Send;
}

/// What the executor persists and shows.
pub trait Journal: Send {
    /// A digest of what the Machine's reconcile last read or wrote of its state, kept while
    /// the refresh waits: woken with the caches showing that same state, it goes on without
    /// reading anything ([`Parked::seen`]).
    fn seen(&self) -> Option<u64>;
    /// Persists `op` (its new seed and attempt count) before the attempt's `run` is sent, with
    /// the node's certificate fingerprint. An error stops the operation there.
    fn record(
        &mut self,
        op: &mut Operation,
        fingerprint: Option<String>,
    ) -> impl Future<Output = Result<(), Failure>> + Send;
    /// A CSR of the attempt's seed did not pass verification (see [`attempts::Journal`]).
    fn unverified(
        &mut self,
        op: &Operation,
        mismatch: &crate::refresh::csr::Mismatch,
    ) -> impl Future<Output = ()> + Send;
    /// Shows that the refresh waits, once per wait (`op.note` holds `note`).
    fn waiting(
        &mut self,
        op: &Operation,
        note: &str,
    ) -> impl Future<Output = Result<(), Failure>> + Send;
}

impl Probe for crate::refresh::session::Session {
    async fn probe(&mut self) -> Result<(), K8sdError> {
        crate::refresh::session::Session::probe(self).await
    }
}

/// Keeps a control plane's cluster after its refresh until its k8sd answers again.
pub struct Settle<N> {
    guard: Guard,
    node: N,
    name: String,
    timeout: Duration,
}

impl<N: Probe + 'static> Settle<N> {
    /// Probes the node every second, in a task of its own, until it answers or the settle
    /// timeout passes; then the cluster is free.
    pub fn spawn(self) {
        let Self {
            guard,
            mut node,
            name,
            timeout,
        } = self;
        tokio::spawn(async move {
            let settled = tokio::time::timeout(timeout, async {
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if node.probe().await.is_ok() {
                        break;
                    }
                }
            })
            .await;
            if settled.is_err() {
                warn!(
                    node = name,
                    "k8sd did not answer again within the settle timeout after a refresh"
                );
            }
            drop(guard);
        });
    }
}

/// A refresh this process parked for a Machine, as [`Executor::look`] shows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parked {
    /// Its operation, while nothing of it is journaled (before its first seed).
    pub op: Option<Operation>,
    /// What its reconcile last saw of the Machine's state ([`Journal::seen`]).
    pub seen: Option<u64>,
    /// It still could not go now (its cluster's admission says no, or a control plane goes
    /// first): reading anything would be wasted.
    pub blocked: bool,
}

/// A refresh waiting between reconciles.
struct Waiting {
    request: String,
    cluster: String,
    /// The operation, while nothing of it is journaled (before its first seed).
    op: Option<Operation>,
    wait: Wait,
    /// What it was last shown waiting for (shown once per cause).
    shown: Option<String>,
    /// When it first waited for the control planes of its cluster.
    waiting_for_control_planes: Option<tokio::time::Instant>,
    /// What the reconciler that parked it last saw of the Machine's state ([`Journal::seen`]).
    seen: Option<u64>,
    /// The last seed whose `run` this process sent (and saw end) before it parked.
    sent: Option<i64>,
    /// A seed whose `run` someone else sent (another leader, this process before a restart),
    /// and when this process first saw it: the wait for that `run` is measured from here.
    sighted: Option<(i64, tokio::time::Instant)>,
}

pub struct Executor {
    admission: Admission,
    parked: Mutex<HashMap<Waiter, Waiting>>,
    settings: Settings,
    clock: SharedClock,
    stop: CancellationToken,
    /// This replica's term as leader: nothing is sent to a node outside it.
    term: crate::leader::Term,
}

impl Executor {
    pub fn new(
        admission: Admission,
        settings: Settings,
        stop: CancellationToken,
        term: crate::leader::Term,
        clock: SharedClock,
    ) -> Self {
        Self {
            admission,
            parked: Mutex::default(),
            settings,
            clock,
            stop,
            term,
        }
    }

    fn parked(&self) -> MutexGuard<'_, HashMap<Waiter, Waiting>> {
        self.parked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The refresh parked for `who`'s `request`, if one is. Whether it is still blocked is
    /// decided now; one still blocked stays noted as waiting, its place in line kept: one that
    /// only looked again would otherwise be forgotten after [`admission::WAITER_TTL`] and no
    /// longer woken when a place frees (in a long queue it then waited for the end of the
    /// queue). `control_planes_pending`: whether a control plane of its cluster is refreshed
    /// or asked to be (asked only for a worker that waits for them).
    pub fn look(
        &self,
        who: &Waiter,
        request: &str,
        role: Role,
        control_planes_pending: impl FnOnce() -> bool,
    ) -> Option<Parked> {
        let (cluster, waiting_for_control_planes, parked) = match self.parked().get(who) {
            Some(p) if p.request == request => (
                p.cluster.clone(),
                p.waiting_for_control_planes,
                Parked {
                    op: p.op.clone(),
                    seen: p.seen,
                    blocked: false,
                },
            ),
            _ => return None,
        };
        let control_planes_first = waiting_for_control_planes
            .is_some_and(|since| since.elapsed() < self.settings.wait_timeout);
        let blocked = !self
            .admission
            .would_enter(&who.namespace, &cluster, role, who)
            || (role == Role::Worker && control_planes_first && control_planes_pending());
        if blocked {
            self.admission
                .note_waiting(&who.namespace, &cluster, role, who);
        }
        Some(Parked { blocked, ..parked })
    }

    /// Forgets what waits for `who` (its refresh ended or was withdrawn).
    pub fn forget(&self, who: &Waiter) {
        if let Some(parked) = self.parked().remove(who) {
            self.admission.forget(&who.namespace, &parked.cluster, who);
        }
    }

    /// Carries `accepted` out as far as it can go now.
    pub async fn execute<C: Connector, J: Journal>(
        &self,
        accepted: Accepted,
        connector: &C,
        journal: &mut J,
    ) -> Finished<C::Node> {
        let Accepted {
            namespace,
            machine,
            cluster,
            node: node_name,
            role,
            ttl,
            request,
            mut op,
            control_planes_pending: pending,
            gate,
        } = accepted;
        let who = Waiter { namespace, machine };
        let mut parked = self.unpark(&who, &request, &cluster);

        let held = self.held(&who, &mut parked, &op, role, &cluster, pending, gate);
        if let Some((after, why)) = held {
            return self.park(who, parked, op, journal, why, after).await;
        }
        // Its turn is checked first (the place kept for it a few seconds), its place taken only
        // once the node is reached: reaching it (the workload cluster's reads, a tunnel, for a
        // worker an approver) is the tenant's to slow down, and a place held meanwhile would
        // keep every other refresh out.
        if let Err(busy) = self.admission.turn(&who.namespace, &cluster, role, &who) {
            return self.queued(who, parked, op, journal, &busy);
        }
        if self.stopping(&op) {
            self.admission.pass(&who);
            self.forget_parked(&who);
            return Finished::Stopping;
        }
        let (session, approver) = self.connect(connector, role).await;
        let session = match session {
            Ok(session) => session,
            Err(failure) => {
                self.admission.pass(&who);
                return self
                    .wait_or_fail(who, parked, op, journal, "the workload cluster", failure)
                    .await;
            }
        };
        op.transport = Some(session.reached_by.clone());
        let mut node = session.node;
        let mut approver = match approver.transpose() {
            Ok(approver) => approver,
            Err(failure) => {
                self.admission.pass(&who);
                let what = "a Ready control-plane node";
                return self
                    .wait_or_fail(who, parked, op, journal, what, failure)
                    .await;
            }
        };
        let guard = match self
            .admission
            .try_enter(&who.namespace, &cluster, role, &who)
        {
            Ok(guard) => guard,
            // Taken meanwhile (its kept place lapsed): nothing was sent to the node, so the
            // sessions are let go and it waits for its turn again.
            Err(busy) => return self.queued(who, parked, op, journal, &busy),
        };
        if self.stopping(&op) {
            self.forget_parked(&who);
            return Finished::Stopping;
        }
        let extra_sans = (role == Role::ControlPlane).then_some(session.extra_sans);
        let mut attempts_journal = AttemptsJournal {
            journal,
            wait: &mut parked.wait,
            shown: &mut parked.shown,
            timeout: self.settings.wait_timeout,
            tries: self.settings.tries,
            stop: &self.stop,
            term: &self.term,
            clock: self.clock.as_ref(),
        };
        let result = attempts::carry_out(
            &mut node,
            approver.as_mut(),
            &mut op,
            ttl,
            extra_sans,
            &mut attempts_journal,
        )
        .await;
        match result {
            Ok(()) => {
                self.forget_parked(&who);
                let settle = (role == Role::ControlPlane).then(|| Settle {
                    guard,
                    node,
                    name: node_name,
                    timeout: self.settings.settle_timeout,
                });
                Finished::Ran { op, settle }
            }
            Err(Failure::Wait(after)) => {
                let why = parked.shown.clone().unwrap_or_default();
                parked.sent = op.seed;
                self.keep(who, parked, op, journal.seen());
                Finished::Wait { after, why }
            }
            Err(failure) => {
                self.forget_parked(&who);
                match failure {
                    Failure::Stopping => Finished::Stopping,
                    Failure::Superseded => Finished::Superseded,
                    failure => Finished::Failed { op, failure },
                }
            }
        }
    }

    /// Queued for its cluster's turn: not written anywhere (with a whole cluster queued, a
    /// status write per waiting refresh would slow the queue itself); the Machine shows
    /// in-progress, and Refreshing turns True when it reaches its node.
    fn queued<N, J: Journal>(
        &self,
        who: Waiter,
        parked: Waiting,
        op: Operation,
        journal: &J,
        busy: &Busy,
    ) -> Finished<N> {
        info!(why = %busy, "Queued");
        self.keep(who, parked, op, journal.seen());
        Finished::Wait {
            after: WAITING_RECHECK,
            why: busy.to_string(),
        }
    }

    /// Whether nothing more may be sent for `op`: nothing was sent to the node yet and the
    /// process is stopping, or this replica no longer leads (the next leader goes on from the
    /// request).
    fn stopping(&self, op: &Operation) -> bool {
        (op.seed.is_none() && self.stop.is_cancelled()) || !self.term.leading()
    }

    /// [`connect`] within `--node-connect-timeout` in all: past it, the node counts as not
    /// answering (waited for, then a failure).
    async fn connect<C: Connector>(
        &self,
        connector: &C,
        role: Role,
    ) -> (
        Result<NodeSession<C::Node>, Failure>,
        Option<Result<C::Approver, Failure>>,
    ) {
        let limit = self.settings.connect_timeout;
        match tokio::time::timeout(limit, connect(connector, role)).await {
            Ok(connected) => connected,
            Err(_) => {
                let why = format!(
                    "reaching the node{} took longer than {} (--node-connect-timeout): its workload cluster's API server or the node answers too slowly",
                    if role == Role::Worker {
                        " and a control plane to approve its CSRs"
                    } else {
                        ""
                    },
                    humantime::format_duration(limit)
                );
                (Err(Failure::Unavailable(why)), None)
            }
        }
    }

    /// Why `op` waits before it may even ask for its cluster's place, and for how long: a `run`
    /// that may still be running on the node (a seed whose `run` this process saw end is
    /// planned again at once, as within the attempts; one sent by someone else, or before a
    /// restart, is waited out), or, for a worker, the control planes of its cluster, which go
    /// first up to the wait timeout (a cluster annotated in one command refreshes its control
    /// planes before its workers, whose approvals need them).
    #[allow(clippy::too_many_arguments)]
    fn held(
        &self,
        who: &Waiter,
        parked: &mut Waiting,
        op: &Operation,
        role: Role,
        cluster: &str,
        control_planes_pending: bool,
        gate: Option<String>,
    ) -> Option<(Duration, String)> {
        // A closed pre-flight gate, before anything was sent to its node.
        if let Some(gate) = gate.filter(|_| op.seed.is_none()) {
            let why = format!(
                "{gate} (a pre-flight gate): it starts once that ends, or now with {FORCE_REFRESH}=true on the Machine"
            );
            return Some((GATE_RECHECK, why));
        }
        if parked.sent.is_none_or(|sent| op.seed != Some(sent))
            && let Some(seed) = op.seed.filter(|_| !op.is_finished())
        {
            let first_seen = match parked.sighted {
                Some((sighted, at)) if sighted == seed => at,
                _ => parked.sighted.insert((seed, tokio::time::Instant::now())).1,
            };
            if let Some(held) = run_may_be_running(op, seed, self.settings.run_timeout, first_seen)
            {
                return Some(held);
            }
        }
        if role == Role::Worker && op.seed.is_none() && control_planes_pending {
            let since = *parked
                .waiting_for_control_planes
                .get_or_insert_with(tokio::time::Instant::now);
            if since.elapsed() < self.settings.wait_timeout {
                self.admission
                    .note_waiting(&who.namespace, cluster, role, who);
                let why = format!("the control planes of cluster {cluster} are refreshed first");
                return Some((WAITING_RECHECK, why));
            }
        }
        None
    }

    fn unpark(&self, who: &Waiter, request: &str, cluster: &str) -> Waiting {
        match self.parked().remove(who) {
            // What its reconciler saw is noted again when it parks again.
            Some(parked) if parked.request == request => Waiting {
                seen: None,
                ..parked
            },
            _ => Waiting {
                request: request.to_owned(),
                cluster: cluster.to_owned(),
                op: None,
                wait: Wait::new(self.settings.wait_timeout, self.settings.tries),
                shown: None,
                waiting_for_control_planes: None,
                seen: None,
                sent: None,
                sighted: None,
            },
        }
    }

    fn keep(&self, who: Waiter, mut parked: Waiting, op: Operation, seen: Option<u64>) {
        // Once a seed is journaled, the journal is the operation; only the budget is kept.
        parked.op = op.seed.is_none().then_some(op);
        parked.seen = seen;
        self.parked().insert(who, parked);
    }

    fn forget_parked(&self, who: &Waiter) {
        self.parked().remove(who);
    }

    /// Parks the refresh, shown as waiting for `why` (once per cause), and asks to be looked
    /// at again after `after`.
    async fn park<N, J: Journal>(
        &self,
        who: Waiter,
        mut parked: Waiting,
        op: Operation,
        journal: &mut J,
        why: String,
        after: Duration,
    ) -> Finished<N> {
        if let Err(failure) = show(journal, &mut parked.shown, &op, &why).await {
            self.forget_parked(&who);
            return Finished::Failed { op, failure };
        }
        self.keep(who, parked, op, journal.seen());
        Finished::Wait { after, why }
    }

    /// `failure` while reaching the node or its approver: waits (the cluster given back) while
    /// waiting may help and the budget lasts, else fails.
    async fn wait_or_fail<N, J: Journal>(
        &self,
        who: Waiter,
        mut parked: Waiting,
        op: Operation,
        journal: &mut J,
        what: &str,
        failure: Failure,
    ) -> Finished<N> {
        if !failure.unavailable() && !failure.timed_out() {
            self.forget_parked(&who);
            return Finished::Failed { op, failure };
        }
        match parked.wait.next(&failure) {
            Some(after) => {
                let why = match &failure {
                    Failure::Workload(err) if err.server_certificate_expired().is_some() => {
                        format!(
                            "a control plane's refresh, which renews {what}'s API: {}",
                            failure.cause()
                        )
                    }
                    _ => format!(
                        "{what}, which does not answer (restarting?): {}",
                        failure.cause()
                    ),
                };
                self.park(who, parked, op, journal, why, after).await
            }
            None => {
                self.forget_parked(&who);
                let failure = gave_up(what, self.settings.wait_timeout, failure);
                Finished::Failed { op, failure }
            }
        }
    }
}

/// The node's session and, for a worker, a control plane to approve its CSRs, both looked for
/// at once: finding a control plane that answers takes several reads and a tunnel of its own.
/// Nothing is sent to the node yet: its first `plan` waits for the cluster's place (a `plan`
/// sent before, with the place then taken by someone else, would be one call too many).
async fn connect<C: Connector>(
    connector: &C,
    role: Role,
) -> (
    Result<NodeSession<C::Node>, Failure>,
    Option<Result<C::Approver, Failure>>,
) {
    match role {
        Role::ControlPlane => (connector.node().await, None),
        Role::Worker => {
            // Boxed: both futures are large, and side by side they would not fit on a worker
            // thread's stack in a debug build.
            let (session, approver) =
                futures::join!(Box::pin(connector.node()), Box::pin(connector.approver()));
            (session, Some(approver))
        }
    }
}

/// For an operation taken over with a `run` of unknown outcome (another leader's, or ours
/// before a restart): that `run` may still be running on the node, and a new `plan` meanwhile
/// would restart the node's services a second time. It is waited out for the run timeout from
/// when this process first saw it, on its own monotonic clock: the `seededAt` it was recorded
/// with is the other replica's wall clock, which may be ahead of ours by any amount (a suspended
/// clock only makes this wait longer, which is the safe side). How long to wait, and why.
fn run_may_be_running(
    op: &Operation,
    seed: i64,
    run_timeout: Duration,
    first_seen: tokio::time::Instant,
) -> Option<(Duration, String)> {
    // Journaled before seeds carried their time (an older release): as then, not waited for.
    let at = op.seeded_at.as_ref()?;
    let left = run_timeout.saturating_sub(first_seen.elapsed());
    (!left.is_zero()).then(|| {
        (
            left,
            format!(
                "the run of seed {seed} (recorded at {} by the replica that sent it) may still be running on the node; a new plan waits --k8sd-run-timeout ({}) from when this replica took it over",
                at.0,
                humantime::format_duration(run_timeout)
            ),
        )
    })
}

/// The lifetime `op` asks for: its seconds, else its TTL as written (an operation journaled
/// without seconds). An operation without a valid lifetime fails before its node sees anything.
pub fn ttl_of(op: &Operation) -> Result<Ttl, Failure> {
    let checked = match op.ttl_seconds {
        Some(seconds) => Ttl::from_seconds(seconds).map_err(|e| e.to_string()),
        None => op.ttl.parse::<Ttl>().map_err(|e| e.to_string()),
    };
    checked.map_err(|error| {
        Failure::Message(format!(
            "The refresh's journal holds no valid certificate lifetime ({error}); nothing was sent to the node"
        ))
    })
}

/// The failure once waiting for `what` is over: a timed-out call as it is (its message has the
/// hint), anything else as "did not answer within".
fn gave_up(what: &str, timeout: Duration, failure: Failure) -> Failure {
    if failure.timed_out() {
        return failure;
    }
    Failure::Message(format!(
        "{what} did not answer within {} ({})",
        humantime::format_duration(timeout),
        failure.cause()
    ))
}

/// Shows the refresh waiting for `why`, unless that was the last thing shown.
async fn show<J: Journal>(
    journal: &mut J,
    shown: &mut Option<String>,
    op: &Operation,
    why: &str,
) -> Result<(), Failure> {
    if shown.as_deref() == Some(why) {
        return Ok(());
    }
    info!(why, "Waiting");
    journal.waiting(op, &format!("Waiting: {why}")).await?;
    *shown = Some(why.to_owned());
    Ok(())
}

/// The attempts' view of the journal: a `plan` that gets no answer ends them for now.
struct AttemptsJournal<'a, J> {
    journal: &'a mut J,
    wait: &'a mut Wait,
    shown: &'a mut Option<String>,
    timeout: Duration,
    tries: u32,
    stop: &'a CancellationToken,
    term: &'a crate::leader::Term,
    clock: &'a dyn Clock,
}

impl<J: Journal> attempts::Journal for AttemptsJournal<'_, J> {
    async fn record(
        &mut self,
        op: &mut Operation,
        fingerprint: Option<String>,
    ) -> Result<(), Failure> {
        self.journal.record(op, fingerprint).await
    }

    async fn wait(&mut self, op: &mut Operation, failure: &Failure) -> Result<(), Failure> {
        let what = "the node's k8sd";
        let Some(after) = self.wait.next(failure) else {
            return Err(if failure.timed_out() {
                Failure::Message(format!(
                    "{} ({} tries); check that the node is up and its k8sd-proxy pod is Running",
                    failure.cause(),
                    self.tries
                ))
            } else {
                gave_up(what, self.timeout, Failure::Message(failure.cause()))
            });
        };
        let why = format!(
            "{what}, which does not answer (restarting?): {}",
            failure.cause()
        );
        show(self.journal, self.shown, op, &why).await?;
        Err(Failure::Wait(after))
    }

    async fn unverified(&mut self, op: &Operation, mismatch: &crate::refresh::csr::Mismatch) {
        self.journal.unverified(op, mismatch).await;
    }

    fn stopping(&self) -> bool {
        self.stop.is_cancelled()
    }

    fn leading(&self) -> bool {
        self.term.leading()
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }
}

#[cfg(test)]
mod tests;
