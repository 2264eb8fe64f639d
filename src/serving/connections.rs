//! Who gets a connection place: the open connections, and the pure choice of which one makes
//! room for a new one.
//!
//! A place is not held by whoever came first. When the server is full, or a peer has all the
//! places one peer may hold, a new connection takes the place of an idle one (no request being
//! decided on it: between requests, in its handshake, or sending a request slowly), that peer's
//! own oldest first, else the oldest of all. So a client that opens every place and keeps them
//! alive (one request every few seconds on each) cannot keep the API server out: its next
//! connection closes one of those. Only when every connection that could go is deciding a request
//! (a few milliseconds each) is a new one turned away.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;
use tokio::time::Instant;

/// What a connection shares with the table: whether a request is being decided on it, and how
/// to ask it to close.
#[derive(Debug, Default)]
pub struct Shared {
    deciding: AtomicUsize,
    close: Notify,
}

impl Shared {
    /// Marks a request being decided until the guard is dropped.
    pub fn deciding(self: &Arc<Self>) -> Deciding {
        self.deciding.fetch_add(1, Ordering::AcqRel);
        Deciding(self.clone())
    }

    fn is_deciding(&self) -> bool {
        self.deciding.load(Ordering::Acquire) > 0
    }

    /// Resolves once the table asked this connection to make room (also when it asked before
    /// this was awaited).
    pub async fn closing(&self) {
        self.close.notified().await;
    }
}

/// A request being decided on a connection (see [`Shared::deciding`]).
#[derive(Debug)]
pub struct Deciding(Arc<Shared>);

impl Drop for Deciding {
    fn drop(&mut self) {
        self.0.deciding.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One open connection, as [`choose`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Open {
    pub id: u64,
    pub peer: IpAddr,
    pub accepted: Instant,
    pub deciding: bool,
}

/// What to do with a new connection from a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// There is room.
    Admit,
    /// Admit it in the place of this idle connection.
    Replace(u64),
    /// Every connection that could make room is deciding a request.
    Refuse,
}

/// The place for a new connection from `peer` among `open`, within `max` connections and
/// `max_per_peer` of one peer.
pub fn choose(open: &[Open], peer: IpAddr, max: usize, max_per_peer: usize) -> Choice {
    let own = open.iter().filter(|c| c.peer == peer).count();
    let oldest_idle = |of_peer: bool| {
        open.iter()
            .filter(|c| !c.deciding && (!of_peer || c.peer == peer))
            .min_by_key(|c| (c.accepted, c.id))
            .map(|c| c.id)
    };
    let victim = if own >= max_per_peer {
        oldest_idle(true)
    } else if open.len() >= max {
        oldest_idle(false)
    } else {
        return Choice::Admit;
    };
    victim.map_or(Choice::Refuse, Choice::Replace)
}

struct Entry {
    peer: IpAddr,
    accepted: Instant,
    shared: Arc<Shared>,
}

/// The open connections of one server.
#[derive(Default)]
pub struct Table {
    next: u64,
    open: HashMap<u64, Entry>,
}

impl Table {
    /// Makes room for a connection from `peer` as [`choose`] says, asking the connection it
    /// replaces to close (it leaves the table at once). `None`: turned away.
    pub fn admit(
        &mut self,
        peer: IpAddr,
        max: usize,
        max_per_peer: usize,
    ) -> Option<(u64, Arc<Shared>)> {
        let open: Vec<Open> = self
            .open
            .iter()
            .map(|(&id, e)| Open {
                id,
                peer: e.peer,
                accepted: e.accepted,
                deciding: e.shared.is_deciding(),
            })
            .collect();
        match choose(&open, peer, max, max_per_peer) {
            Choice::Refuse => return None,
            Choice::Replace(id) => {
                if let Some(replaced) = self.open.remove(&id) {
                    replaced.shared.close.notify_one();
                }
            }
            Choice::Admit => {}
        }
        let id = self.next;
        self.next += 1;
        let shared = Arc::new(Shared::default());
        self.open.insert(
            id,
            Entry {
                peer,
                accepted: Instant::now(),
                shared: shared.clone(),
            },
        );
        Some((id, shared))
    }

    /// The connection ended (a no-op when it was replaced).
    pub fn remove(&mut self, id: u64) {
        self.open.remove(&id);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.open.len()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::time::Duration;

    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    fn open(id: u64, peer: u8, age_s: u64, deciding: bool) -> Open {
        let now = Instant::now();
        Open {
            id,
            peer: ip(peer),
            accepted: now.checked_sub(Duration::from_secs(age_s)).unwrap_or(now),
            deciding,
        }
    }

    #[test]
    fn below_both_caps_a_connection_is_admitted() {
        assert_eq!(choose(&[], ip(1), 2, 2), Choice::Admit);
        let one = [open(0, 1, 5, false)];
        assert_eq!(choose(&one, ip(1), 2, 2), Choice::Admit);
        assert_eq!(choose(&one, ip(2), 2, 2), Choice::Admit);
    }

    #[test]
    fn a_full_server_replaces_its_oldest_idle_connection() {
        let full = [
            open(0, 1, 30, true),
            open(1, 1, 20, false),
            open(2, 2, 25, false),
            open(3, 2, 10, false),
        ];
        // Oldest idle of all: 2 (0 is older but deciding).
        assert_eq!(choose(&full, ip(3), 4, 4), Choice::Replace(2));
    }

    #[test]
    fn a_peer_at_its_cap_replaces_its_own_oldest_idle_connection() {
        let open_ = [
            open(0, 1, 30, false),
            open(1, 2, 25, false),
            open(2, 2, 10, false),
        ];
        // Room overall, but peer 2 holds its two: its own oldest goes, not peer 1's older one.
        assert_eq!(choose(&open_, ip(2), 8, 2), Choice::Replace(1));
        // Peer 1 is under its cap.
        assert_eq!(choose(&open_, ip(1), 8, 2), Choice::Admit);
    }

    #[test]
    fn when_nothing_that_could_go_is_idle_the_new_connection_is_refused() {
        let busy = [open(0, 1, 30, true), open(1, 2, 20, true)];
        assert_eq!(choose(&busy, ip(3), 2, 2), Choice::Refuse);
        // A peer at its cap with only deciding connections is refused even if others idle.
        let mixed = [open(0, 1, 30, true), open(1, 2, 20, false)];
        assert_eq!(choose(&mixed, ip(1), 8, 1), Choice::Refuse);
    }

    #[test]
    fn equal_ages_are_broken_by_the_order_of_arrival() {
        let now = Instant::now();
        let at = |id| Open {
            id,
            peer: ip(1),
            accepted: now,
            deciding: false,
        };
        assert_eq!(
            choose(&[at(7), at(3), at(5)], ip(2), 3, 3),
            Choice::Replace(3)
        );
    }

    #[tokio::test]
    async fn the_table_asks_the_replaced_connection_to_close_and_forgets_it() {
        let mut table = Table::default();
        let (first, first_shared) = table.admit(ip(1), 1, 1).unwrap();
        let deciding = first_shared.deciding();
        // Deciding: nothing to replace.
        assert!(table.admit(ip(2), 1, 1).is_none());
        drop(deciding);
        let (second, _) = table.admit(ip(2), 1, 1).unwrap();
        assert_ne!(first, second);
        assert_eq!(table.len(), 1);
        // Asked before it listened: the request is kept.
        tokio::time::timeout(Duration::from_secs(1), first_shared.closing())
            .await
            .expect("the replaced connection is asked to close");
        table.remove(first);
        assert_eq!(table.len(), 1);
    }
}
