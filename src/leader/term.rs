//! How long this replica may still act as the leader, on a clock that keeps counting while the
//! machine is suspended. `Instant` (CLOCK_MONOTONIC) stops during a host or VM suspend: a
//! leader resumed after one would believe its term still runs while a standby, whose clock
//! went on, has taken over. CLOCK_BOOTTIME does not stop. A stopped process (SIGSTOP) is
//! covered by either clock: it only has to look before it acts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Until when (on [`boottime`]) this replica leads, shared by the elector that extends it and
/// everything that must not act without it.
#[derive(Clone, Debug)]
pub struct Term(Arc<AtomicU64>);

/// No term: not leading.
const NONE: u64 = 0;
/// A replica without leader election leads for ever.
const ALWAYS: u64 = u64::MAX;

impl Term {
    /// A replica that runs without leader election: it always leads.
    pub fn always() -> Self {
        Self(Arc::new(AtomicU64::new(ALWAYS)))
    }

    /// A candidate that does not lead (yet).
    pub fn none() -> Self {
        Self(Arc::new(AtomicU64::new(NONE)))
    }

    /// Leads until `renewed_at + renew_deadline` (both on [`boottime`]): `renewed_at` is when
    /// the renewal that succeeded was *started*, so the term never outlasts what the standby
    /// can see of it.
    pub fn extend(&self, renewed_at: Duration, renew_deadline: Duration) {
        let until = renewed_at.saturating_add(renew_deadline);
        self.0.store(nanos(until).max(1), Ordering::SeqCst);
    }

    /// Leads no more.
    pub fn end(&self) {
        self.0.store(NONE, Ordering::SeqCst);
    }

    /// What is left of the term now, `None` once it is over.
    pub fn left(&self) -> Option<Duration> {
        self.left_at(boottime())
    }

    /// Whether this replica may act now. Checked right before every side effect on a node.
    pub fn leading(&self) -> bool {
        self.left().is_some()
    }

    fn left_at(&self, now: Duration) -> Option<Duration> {
        match self.0.load(Ordering::SeqCst) {
            NONE => None,
            ALWAYS => Some(Duration::MAX),
            until => Duration::from_nanos(until)
                .checked_sub(now)
                .filter(|left| !left.is_zero()),
        }
    }
}

fn nanos(at: Duration) -> u64 {
    u64::try_from(at.as_nanos()).unwrap_or(ALWAYS - 1)
}

/// Time since boot, suspends included (Linux CLOCK_BOOTTIME).
#[cfg(target_os = "linux")]
pub fn boottime() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

/// Elsewhere (development only): the monotonic clock since the first call.
#[cfg(not(target_os = "linux"))]
pub fn boottime() -> Duration {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn a_term_ends_at_its_deadline_or_when_ended() {
        let term = Term::none();
        assert_eq!(term.left_at(S(100)), None);
        term.extend(S(100), S(10));
        assert_eq!(term.left_at(S(100)), Some(S(10)));
        assert_eq!(term.left_at(S(109)), Some(S(1)));
        assert_eq!(term.left_at(S(110)), None);
        assert_eq!(term.left_at(S(500)), None, "a suspend past the term");
        term.extend(S(108), S(10));
        assert_eq!(term.left_at(S(110)), Some(S(8)));
        term.end();
        assert_eq!(term.left_at(S(110)), None);
    }

    #[test]
    fn without_election_a_replica_always_leads() {
        assert_eq!(Term::always().left_at(S(u64::MAX / 4)), Some(Duration::MAX));
    }

    #[test]
    fn the_boot_clock_advances() {
        let before = boottime();
        std::thread::sleep(Duration::from_millis(5));
        assert!(boottime() > before);
        assert!(before > Duration::ZERO);
    }
}
