//! Staggering: where one Machine starts within a policy's `spread`.
//!
//! A Machine's place in any spread is a fraction `u` in `[0, 1)` fixed by its key (the
//! Machine's UID): the first 8 bytes of SHA-256(key) read as a big-endian integer, over 2^64.
//! SHA-256 because it gives the same answer in every process, on every platform and in every Rust
//! version (std's hasher is seeded per process and may change), and spreads keys that differ in one
//! character as evenly as random ones. Its offset within a span of `n` whole seconds is
//! `floor(u × n)`: uniform over `[0, n)` (up to a bias of `n / 2^64`), and the same fraction of any
//! span, so a window too short for the spread keeps the fleet's order and evenness.
//!
//! Where the span starts (the anchor), how short windows scale it and how the fail-safe overrides
//! it are the decision's rules ([`super::decision`]).

use jiff::{SignedDuration, Timestamp};
use sha2::{Digest, Sha256};

use super::duration::Spread;
use super::window::WindowOccurrence;

/// A Machine's fixed place in every spread (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StaggerKey(u64);

impl StaggerKey {
    /// The last place in every spread: the Machine that starts latest, the worst case a
    /// policy's promise is checked for ([`super::promise`]).
    pub const LAST: StaggerKey = StaggerKey(u64::MAX);

    /// The place of the Machine with this key (its UID).
    pub fn new(key: &str) -> Self {
        let digest = Sha256::digest(key.as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        Self(u64::from_be_bytes(first))
    }

    /// The offset, in whole seconds, within a span of `span` seconds: `floor(u × span)`, in
    /// `[0, span)`; 0 for an empty or negative span.
    pub fn offset(self, span: i64) -> i64 {
        let Ok(span) = u64::try_from(span) else {
            return 0;
        };
        // u64 × u64 fits in u128; shifted back by 64 bits it is below `span`, so fits in i64.
        let scaled = (u128::from(self.0) * u128::from(span)) >> 64;
        i64::try_from(scaled).unwrap_or(0)
    }
}

/// Where a Machine's renewal starts within a spread, when staggering holds it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// When this Machine may start: `anchor + offset`.
    pub at: Timestamp,
    /// The instant the offset counts from, the same for every Machine allowed to renew at it:
    /// the due time, or under `Scheduled` the later of the window's opening and the due time.
    pub anchor: Timestamp,
    /// `at − anchor`, whole seconds.
    pub offset: SignedDuration,
    /// The policy's `spread`.
    pub spread: Spread,
    /// The span the offset was taken from: the spread, or less when the window closes sooner.
    pub span: SignedDuration,
    /// `Scheduled`: the window occurrence the slot lies in.
    pub window: Option<WindowOccurrence>,
    /// The instant the renewal would start without staggering.
    pub unstaggered: Timestamp,
}

impl Slot {
    /// Whether the window left less room than the spread, so the offset was scaled down.
    pub fn scaled(&self) -> bool {
        self.span < self.spread.as_duration()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_across_processes_and_versions() {
        // SHA-256 of the UTF-8 bytes: fixed values, so a change of hash shows up here.
        let uid = "4b8e7c3e-0f1d-4a52-9d5e-2f0c7a1b9e33";
        let key = StaggerKey::new(uid);
        assert_eq!(key, StaggerKey::new(uid));
        let digest = Sha256::digest(uid.as_bytes());
        assert_eq!(key.0, u64::from_be_bytes(digest[..8].try_into().unwrap()));
        assert_eq!(StaggerKey::new("").0, 0xe3b0_c442_98fc_1c14);
        assert_ne!(StaggerKey::new("a"), StaggerKey::new("b"));
    }

    #[test]
    fn offsets_are_a_fraction_of_the_span() {
        let zero = StaggerKey(0);
        let top = StaggerKey(u64::MAX);
        let half = StaggerKey(1 << 63);
        assert_eq!(zero.offset(900), 0);
        assert_eq!(top.offset(900), 899);
        assert_eq!(half.offset(900), 450);
        assert_eq!(half.offset(1), 0);
        for key in [zero, top, half] {
            assert_eq!(key.offset(0), 0);
            assert_eq!(key.offset(-5), 0);
            assert!(key.offset(i64::MAX) < i64::MAX);
        }
        // The same fraction of a shorter span.
        assert_eq!(half.offset(600), 300);
    }
}
