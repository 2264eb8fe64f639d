//! The time decisions are taken at. The controllers read it from their context, never from the
//! system clock directly, so a test can hold time still or move it.

use std::sync::{Arc, Mutex, PoisonError};

use jiff::Timestamp;

/// Where the controllers read the time.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
}

/// A clock as the controllers hold it.
pub type SharedClock = Arc<dyn Clock>;

/// The system's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

impl SystemClock {
    pub fn shared() -> SharedClock {
        Arc::new(Self)
    }
}

/// A clock that says what it was last set to (tests).
#[derive(Debug)]
pub struct FixedClock(Mutex<Timestamp>);

impl FixedClock {
    pub fn new(at: Timestamp) -> Self {
        Self(Mutex::new(at))
    }

    pub fn set(&self, at: Timestamp) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = at;
    }
}

impl Clock for FixedClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_clock_stays_where_it_is_set() {
        let clock = FixedClock::new(Timestamp::UNIX_EPOCH);
        assert_eq!(clock.now(), Timestamp::UNIX_EPOCH);
        let later = Timestamp::from_second(1_800_000_000).unwrap();
        clock.set(later);
        assert_eq!(clock.now(), later);
        assert!(
            SystemClock.now()
                > later
                    .checked_sub(jiff::SignedDuration::from_hours(24 * 365 * 10))
                    .unwrap()
        );
    }
}
