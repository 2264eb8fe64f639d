//! Exponential backoff after failed automatic renewals.
//!
//! After automatic failure `n ≥ 1` the next attempt may start at
//! `lastFailureTime + min(max, min · 2^(n−1))` (defaults 1h and 32h). The inputs come from
//! `MachineCertificates.status` (`failedAttempts`, `lastFailureTime`), so the backoff is a
//! function of time and persisted state only: a restart or a spurious reconcile neither resets
//! nor shortens it, and failing machines are released at their own times, not all at once.
//!
//! Edge cases (design.md, settled details):
//! - A `lastFailureTime` with a missing, zero or negative count (objects written by older
//!   versions) waits `min`.
//! - A count without `lastFailureTime` means no backoff: there is nothing to wait from.
//! - A `lastFailureTime` in the future is taken at face value.
//! - No overflow for any count (`i64::MAX` included): the delay saturates at `max`, the instant
//!   at the end of jiff's calendar.
//! - Inside the fail-safe margin the delay is `min(delay, 1h)` ([`FAIL_SAFE_RETRY`]), so a
//!   failing machine close to expiry is still tried at least hourly. The cap applies from the
//!   instant the margin opens: a long backoff that would end after that point ends at the later
//!   of the margin opening and `lastFailureTime + min(delay, 1h)`.
//!
//! Success resets the history (the caller clears the status fields). The same delays serve the
//! manual flow's transient retries through [`Backoff::delay`].

use std::cmp::{max, min};

use jiff::{SignedDuration, Timestamp};

use super::duration::PolicyDuration;

/// Default first delay (the `--renewal-backoff-min` flag's default).
pub const DEFAULT_MIN: PolicyDuration = PolicyDuration::from_secs_const(3600);

/// Default longest delay (the `--renewal-backoff-max` flag's default): six doublings of 1h.
pub const DEFAULT_MAX: PolicyDuration = PolicyDuration::from_secs_const(32 * 3600);

/// The longest delay once expiry is within the fail-safe margin.
pub const FAIL_SAFE_RETRY: SignedDuration = SignedDuration::from_hours(1);

/// The failure history persisted in `MachineCertificates.status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Failures {
    /// `failedAttempts`: consecutive failed automatic attempts since the last success.
    pub count: Option<i64>,
    /// `lastFailureTime`.
    pub last_failure: Option<Timestamp>,
}

/// Backoff settings: the delay after the first failure and the longest delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    min: PolicyDuration,
    max: PolicyDuration,
}

/// `min` longer than `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the backoff minimum ({min}) must not be longer than the maximum ({max})")]
pub struct BackoffError {
    pub min: PolicyDuration,
    pub max: PolicyDuration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            min: DEFAULT_MIN,
            max: DEFAULT_MAX,
        }
    }
}

impl Backoff {
    pub fn new(min: PolicyDuration, max: PolicyDuration) -> Result<Self, BackoffError> {
        if min > max {
            return Err(BackoffError { min, max });
        }
        Ok(Self { min, max })
    }

    pub fn min(&self) -> PolicyDuration {
        self.min
    }

    pub fn max(&self) -> PolicyDuration {
        self.max
    }

    /// The delay after failure number `count`: `min(max, min · 2^(count−1))`; a missing or
    /// non-positive count counts as 1.
    pub fn delay(&self, count: Option<i64>) -> SignedDuration {
        let doublings = count.unwrap_or(1).max(1) - 1;
        let seconds = u32::try_from(doublings)
            .ok()
            .and_then(|doublings| 1i64.checked_shl(doublings))
            .filter(|&factor| factor > 0)
            .and_then(|factor| self.min.as_seconds().checked_mul(factor))
            .map_or(self.max.as_seconds(), |seconds| {
                seconds.min(self.max.as_seconds())
            });
        SignedDuration::from_secs(seconds)
    }

    /// When the next automatic attempt may start, or `None` when there is no backoff (no
    /// `lastFailureTime`). `fail_safe_at` is the instant the fail-safe margin opens, if any.
    pub fn retry_at(
        &self,
        failures: &Failures,
        fail_safe_at: Option<Timestamp>,
    ) -> Option<Timestamp> {
        let last = failures.last_failure?;
        let delay = self.delay(failures.count);
        let plain = saturating_add(last, delay);
        Some(match fail_safe_at {
            Some(fail_safe_at) if plain > fail_safe_at => max(
                fail_safe_at,
                saturating_add(last, min(delay, FAIL_SAFE_RETRY)),
            ),
            _ => plain,
        })
    }
}

/// `t + d`, clamped to jiff's calendar.
pub(crate) fn saturating_add(t: Timestamp, d: SignedDuration) -> Timestamp {
    t.checked_add(d).unwrap_or(if d.is_negative() {
        Timestamp::MIN
    } else {
        Timestamp::MAX
    })
}

/// `t − d`, clamped to jiff's calendar.
pub(crate) fn saturating_sub(t: Timestamp, d: SignedDuration) -> Timestamp {
    t.checked_sub(d).unwrap_or(if d.is_negative() {
        Timestamp::MAX
    } else {
        Timestamp::MIN
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::utc;

    const HOUR: i64 = 3600;

    fn hours(h: i64) -> SignedDuration {
        SignedDuration::from_hours(h)
    }

    #[test]
    fn delays_double_from_min_up_to_max() {
        let backoff = Backoff::default();
        let rows: &[(Option<i64>, i64)] = &[
            (None, 1),
            (Some(i64::MIN), 1),
            (Some(-5), 1),
            (Some(0), 1),
            (Some(1), 1),
            (Some(2), 2),
            (Some(3), 4),
            (Some(4), 8),
            (Some(5), 16),
            (Some(6), 32),
            (Some(7), 32),
            (Some(63), 32),
            (Some(64), 32),
            (Some(65), 32),
            (Some(1000), 32),
            (Some(u32::MAX.into()), 32),
            (Some(i64::from(u32::MAX) + 2), 32),
            (Some(i64::MAX), 32),
        ];
        for &(count, expected) in rows {
            assert_eq!(backoff.delay(count), hours(expected), "count {count:?}");
        }
    }

    #[test]
    fn extreme_settings_do_not_overflow() {
        let one_second = PolicyDuration::from_seconds(1).unwrap();
        let longest = "10000y".parse::<PolicyDuration>().unwrap();
        let wide = Backoff::new(one_second, longest).unwrap();
        assert_eq!(wide.delay(Some(1)), SignedDuration::from_secs(1));
        assert_eq!(wide.delay(Some(31)), SignedDuration::from_secs(1 << 30));
        for count in [38, 39, 62, 63, 64, 65, 1000, i64::MAX] {
            assert!(
                wide.delay(Some(count)) <= longest.as_duration(),
                "count {count}"
            );
        }
        assert_eq!(wide.delay(Some(64)), longest.as_duration());
        let failures = Failures {
            count: Some(i64::MAX),
            last_failure: Some(Timestamp::MAX),
        };
        assert_eq!(wide.retry_at(&failures, None), Some(Timestamp::MAX));
        assert_eq!(
            wide.retry_at(&failures, Some(Timestamp::MIN)),
            Some(Timestamp::MAX)
        );
    }

    #[test]
    fn min_must_not_exceed_max() {
        let two_hours = "2h".parse().unwrap();
        let one_hour = "1h".parse().unwrap();
        let error = Backoff::new(two_hours, one_hour).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the backoff minimum (2h) must not be longer than the maximum (1h)"
        );
        assert!(Backoff::new(one_hour, one_hour).is_ok());
    }

    #[test]
    fn retry_times_follow_the_last_failure() {
        let backoff = Backoff::default();
        let last = utc("2026-11-20T10:00:00Z");
        let rows: &[(Failures, Option<&str>)] = &[
            (Failures::default(), None),
            // A count without a failure time: nothing to wait from.
            (
                Failures {
                    count: Some(3),
                    last_failure: None,
                },
                None,
            ),
            // A failure time without a count (older versions): min.
            (
                Failures {
                    count: None,
                    last_failure: Some(last),
                },
                Some("2026-11-20T11:00:00Z"),
            ),
            (
                Failures {
                    count: Some(0),
                    last_failure: Some(last),
                },
                Some("2026-11-20T11:00:00Z"),
            ),
            (
                Failures {
                    count: Some(1),
                    last_failure: Some(last),
                },
                Some("2026-11-20T11:00:00Z"),
            ),
            (
                Failures {
                    count: Some(6),
                    last_failure: Some(last),
                },
                Some("2026-11-21T18:00:00Z"),
            ),
            (
                Failures {
                    count: Some(7),
                    last_failure: Some(last),
                },
                Some("2026-11-21T18:00:00Z"),
            ),
            (
                Failures {
                    count: Some(1000),
                    last_failure: Some(last),
                },
                Some("2026-11-21T18:00:00Z"),
            ),
        ];
        for (failures, expected) in rows {
            assert_eq!(
                backoff.retry_at(failures, None),
                expected.map(utc),
                "{failures:?}"
            );
        }
        // A failure time in the future is taken at face value.
        let future = Failures {
            count: Some(2),
            last_failure: Some(utc("2030-01-01T00:00:00Z")),
        };
        assert_eq!(
            backoff.retry_at(&future, None),
            Some(utc("2030-01-01T02:00:00Z"))
        );
    }

    #[test]
    fn the_fail_safe_margin_caps_the_delay_at_an_hour() {
        let backoff = Backoff::default();
        let fail_safe_at = utc("2026-11-20T12:00:00Z");
        let at = |count: i64, last: &str| {
            let failures = Failures {
                count: Some(count),
                last_failure: Some(utc(last)),
            };
            backoff.retry_at(&failures, Some(fail_safe_at))
        };
        let rows: &[(i64, &str, &str)] = &[
            // Ends before the margin opens: unchanged.
            (3, "2026-11-20T07:00:00Z", "2026-11-20T11:00:00Z"),
            (3, "2026-11-20T08:00:00Z", "2026-11-20T12:00:00Z"),
            // Would end after it: the margin's opening releases it ...
            (3, "2026-11-20T09:00:00Z", "2026-11-20T12:00:00Z"),
            (7, "2026-11-20T10:00:00Z", "2026-11-20T12:00:00Z"),
            // ... unless the last failure is less than an hour before it.
            (7, "2026-11-20T11:30:00Z", "2026-11-20T12:30:00Z"),
            // A failure inside the margin waits at most an hour.
            (7, "2026-11-20T13:00:00Z", "2026-11-20T14:00:00Z"),
            (1000, "2026-11-21T00:00:00Z", "2026-11-21T01:00:00Z"),
        ];
        for &(count, last, expected) in rows {
            assert_eq!(
                at(count, last),
                Some(utc(expected)),
                "count {count}, last {last}"
            );
        }
        // A minimum below an hour stays below an hour.
        let quick = Backoff::new("10m".parse().unwrap(), "32h".parse().unwrap()).unwrap();
        let failures = Failures {
            count: Some(1),
            last_failure: Some(utc("2026-11-20T13:00:00Z")),
        };
        assert_eq!(
            quick.retry_at(&failures, Some(fail_safe_at)),
            Some(utc("2026-11-20T13:10:00Z"))
        );
        assert_eq!(FAIL_SAFE_RETRY.as_secs(), HOUR);
    }

    #[test]
    fn saturating_arithmetic_stays_in_the_calendar() {
        assert_eq!(saturating_add(Timestamp::MAX, hours(1)), Timestamp::MAX);
        assert_eq!(saturating_sub(Timestamp::MIN, hours(1)), Timestamp::MIN);
        assert_eq!(saturating_add(Timestamp::MIN, hours(-1)), Timestamp::MIN);
        assert_eq!(saturating_sub(Timestamp::MAX, hours(-1)), Timestamp::MAX);
    }
}
