//! Who may refresh now: one control plane per cluster at a time, and a bounded number of workers
//! (per cluster and overall).

use super::*;

/// In-memory concurrency limits (one controller replica acts at a time: leader election).
pub struct Locks {
    clusters: Mutex<HashMap<(String, String), Arc<ClusterLocks>>>,
    workers: Arc<Semaphore>,
}

pub(super) struct ClusterLocks {
    /// Control planes take it exclusively, workers shared: a control-plane refresh (with its
    /// settling, while k8sd restarts the control-plane services) never overlaps another refresh
    /// of its cluster, whose worker approvals and tunnels need that control plane. The lock is
    /// fair, so a waiting control plane goes before workers that arrive after it.
    nodes: Arc<tokio::sync::RwLock<()>>,
    workers: Arc<Semaphore>,
}

/// Held while a node is being refreshed.
pub enum Guard {
    ControlPlane(#[allow(dead_code)] tokio::sync::OwnedRwLockWriteGuard<()>),
    Worker(
        #[allow(dead_code)] tokio::sync::OwnedRwLockReadGuard<()>,
        #[allow(dead_code)] OwnedSemaphorePermit,
        #[allow(dead_code)] OwnedSemaphorePermit,
    ),
}

impl Locks {
    pub fn new(max_workers: usize) -> Self {
        Self {
            clusters: Mutex::new(HashMap::new()),
            workers: Arc::new(Semaphore::new(max_workers.max(1))),
        }
    }

    pub(super) async fn acquire(
        &self,
        namespace: &str,
        cluster: &str,
        role: Role,
        per_cluster: usize,
    ) -> Option<Guard> {
        let locks = {
            let mut map = match self.clusters.lock() {
                Ok(map) => map,
                Err(poisoned) => poisoned.into_inner(),
            };
            map.entry((namespace.to_owned(), cluster.to_owned()))
                .or_insert_with(|| {
                    Arc::new(ClusterLocks {
                        nodes: Arc::new(tokio::sync::RwLock::new(())),
                        workers: Arc::new(Semaphore::new(per_cluster.max(1))),
                    })
                })
                .clone()
        };
        match role {
            Role::ControlPlane => {
                Some(Guard::ControlPlane(locks.nodes.clone().write_owned().await))
            }
            // Acquiring fails only on a closed semaphore, and these are never closed.
            Role::Worker => Some(Guard::Worker(
                locks.nodes.clone().read_owned().await,
                locks.workers.clone().acquire_owned().await.ok()?,
                self.workers.clone().acquire_owned().await.ok()?,
            )),
        }
    }
}
