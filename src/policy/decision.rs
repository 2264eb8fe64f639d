//! The renewal decision: given a machine's expiry, its policy, its failure history and `now`,
//! renew now, defer until an instant (and why), stay disabled, or report the policy invalid.
//!
//! # Rules (design.md §4 and its settled details)
//! - Validation first: an invalid window (or another invalid field) makes the policy
//!   [`Decision::Invalid`] whatever its mode. So does `Scheduled` without windows, a
//!   `renewBefore` not shorter than the policy's `ttl` (every renewal would be due again at
//!   once, restarting the node's services in a loop), and a `spread` longer than 7d. The checks
//!   only a whole spec allows (selectors, the number of windows) are
//!   [`validate`](super::spec::validate)'s.
//! - `Disabled`: never renews automatically; [`Decision::Disabled`] says whether expiry is
//!   within the fail-safe margin, for a Warning.
//! - No known expiry: [`Decision::NoExpiry`], nothing to do and no requeue. The expiry is
//!   recorded by another controller; its write brings the object back.
//! - Due time `D = expiry − renewBefore` (default 30d), or with `renewBeforePercentage` `p`,
//!   `D = expiry − p% × lifetime` (cert-manager's rule), the lifetime running from
//!   [`Input::lifetime_start`] to expiry; when that start is not known (or not before expiry),
//!   the policy's `ttl` stands for the lifetime (see [`Input::lifetime`]). Fail-safe point
//!   `F = expiry − failSafeMargin` (default 24h; a zero margin puts `F` at expiry);
//!   backoff end `B` from [`Backoff::retry_at`](super::backoff::Backoff::retry_at).
//! - `Automatic` renews from `max(D, B)`, ignoring windows ([`Decision::windows_ignored`] tells
//!   when the policy has some).
//! - `Scheduled` renews at the earliest instant `T ≥ now` with `T ≥ D`, `T ≥ B`, and `T` inside a
//!   window or (unless strict) `T ≥ F`, where the windows are bypassed and the renewal says so
//!   ([`RenewReason::FailSafeBypass`]). If `renewBefore` is shorter than the margin, not-due
//!   still wins until `D`.
//! - Staggering (`spread` `s`, default 15m; `0s` turns it off; only with a per-Machine key,
//!   [`Input::with_stagger_key`]): Machines allowed to start at the same instant start at
//!   their own offsets. The offset counts from an anchor `A` that does not move as `now`
//!   advances: `D` under `Automatic`; under `Scheduled`, `max(O.start, D)`, where `O` is the
//!   window occurrence containing `T` that opened first ([`opened_first`]). It is
//!   `floor(u × n)` whole seconds, `u ∈ [0, 1)` fixed by the key ([`StaggerKey`]) and
//!   `n = min(s, O.end − A)` (under `Automatic`, `n = s`): scaled down, never clipped, so the
//!   slot `P = A + offset` stays strictly inside `O`. The renewal starts at `S = max(T, P)`
//!   (a backoff ending after the slot, or a controller that was down past it, wins), but
//!   unless strict never after `max(F, T)`: near expiry the spread is ignored. Not applied
//!   when `T` is a fail-safe bypass. Strict keeps the spread, which never leaves `O`.
//! - A deferral's `until` is that `S` (`T` without staggering): the earliest instant at which a
//!   renewal will actually start if nothing changes. Requeue exactly then ([`requeue_at`]). It
//!   is never after `F` unless the policy is strict, the due time itself is after `F`, or a
//!   failure inside the margin holds the next attempt for up to an hour. Its `reason` names the
//!   first cause: not due, then backoff, then outside the windows, then the spread alone
//!   ([`DeferReason::Staggered`]: `T ≤ now < S`). When the spread moves `until` past `T`, the
//!   deferral carries the [`Slot`].
//!
//! A manual request (the `refresh-certificates` annotation) bypasses all of this — windows,
//! `Disabled`, backoff — and is the caller's business: this module is only asked about automatic
//! renewals.
//!
//! Comparisons are inclusive at each boundary: due at `D`, backoff over at `B`, inside the
//! margin at `F`, inside a window at its start, the Machine's turn at its slot `P`.

use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};

use super::backoff::{saturating_add, saturating_sub};
pub use super::stagger::{Slot, StaggerKey};
use super::window::{ValidWindow, WindowStart, first_containing, next_start_after, opened_first};

/// The policy's `policy` field and the defaults of omitted fields, from the CRD.
pub use ck8s_certs_api::renewal_policy::{
    DEFAULT_FAIL_SAFE_MARGIN, DEFAULT_RENEW_BEFORE, DEFAULT_SPREAD, MAX_SPREAD, Mode,
};

/// Why a renewal starts now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RenewReason {
    /// Due, past any backoff, and inside a window (or windows do not apply).
    Due,
    /// Due and outside every window, but expiry is within the fail-safe margin: the windows are
    /// bypassed (`RenewalWindowBypassed`).
    FailSafeBypass,
}

/// The first cause of a deferral.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeferReason {
    NotDue,
    Backoff,
    OutsideWindow,
    /// Nothing but the spread: the renewal could start now, and waits for this Machine's slot.
    Staggered,
}

/// What lets the renewal start at a deferral's `until`, or, when the deferral has a [`Slot`],
/// at the un-staggered instant [`Slot::unstaggered`] that the spread moves to `until`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resume {
    /// The due time, which is inside a window (or windows do not apply).
    Due,
    /// The end of the backoff, which is inside a window (or windows do not apply).
    BackoffEnds,
    /// A maintenance window opens.
    WindowOpens(WindowStart),
    /// Expiry is within the fail-safe margin and the renewal will bypass the windows.
    FailSafeBypass,
    /// Strict windows, and none opens before the end of jiff's calendar (year 9999): only
    /// reachable at the very end of time, but answered rather than assumed away.
    Never,
}

impl RenewReason {
    /// For condition reasons and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Due => "Due",
            Self::FailSafeBypass => "FailSafeBypass",
        }
    }
}

impl DeferReason {
    /// For condition reasons and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotDue => "NotDue",
            Self::Backoff => "Backoff",
            Self::OutsideWindow => "OutsideWindow",
            Self::Staggered => "Staggered",
        }
    }
}

/// Start a renewal now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewal {
    pub reason: RenewReason,
    /// The first window (list order) that contains `now`, under `Scheduled`.
    pub window: Option<usize>,
    pub expires_at: Timestamp,
    pub due_at: Timestamp,
    pub fail_safe_at: Timestamp,
    pub windows_ignored: bool,
}

/// Do not renew before `until`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deferral {
    /// The earliest instant a renewal will start if nothing changes ([`Timestamp::MAX`] with
    /// [`Resume::Never`]).
    pub until: Timestamp,
    pub reason: DeferReason,
    pub resume: Resume,
    pub expires_at: Timestamp,
    pub due_at: Timestamp,
    pub fail_safe_at: Timestamp,
    /// Expiry is within the fail-safe margin now (a Warning: the machine is close to expiry
    /// and not being renewed).
    pub inside_fail_safe: bool,
    /// `failedAttempts`, for the message.
    pub failed_attempts: Option<i64>,
    pub windows_ignored: bool,
    /// Set when the spread moves `until` past the instant the renewal would otherwise start
    /// (boxed: it is large, and most deferrals have none).
    pub slot: Option<Box<Slot>>,
}

/// The answer for one machine at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The expiry is not known yet: nothing to do.
    NoExpiry {
        windows_ignored: bool,
    },
    RenewNow(Renewal),
    Defer(Deferral),
    /// `Disabled`; `inside_fail_safe` asks for a Warning.
    Disabled {
        expires_at: Option<Timestamp>,
        fail_safe_at: Option<Timestamp>,
        inside_fail_safe: bool,
    },
    /// `RenewalConfigInvalid`: no automatic renewal until the policy is fixed.
    Invalid {
        errors: Vec<PolicyError>,
    },
}

impl Decision {
    /// `Automatic` with windows set: they do not apply (the `WindowsIgnored` condition).
    pub fn windows_ignored(&self) -> bool {
        match self {
            Self::NoExpiry { windows_ignored } => *windows_ignored,
            Self::RenewNow(renewal) => renewal.windows_ignored,
            Self::Defer(deferral) => deferral.windows_ignored,
            Self::Disabled { .. } | Self::Invalid { .. } => false,
        }
    }

    /// Whether the decision deserves a Warning: the policy is invalid, or expiry is within the
    /// fail-safe margin and no renewal is starting.
    pub fn is_warning(&self) -> bool {
        match self {
            Self::Invalid { .. } => true,
            Self::Disabled {
                inside_fail_safe, ..
            } => *inside_fail_safe,
            Self::Defer(deferral) => deferral.inside_fail_safe,
            Self::NoExpiry { .. } | Self::RenewNow(_) => false,
        }
    }
}

/// Decides what to do about one machine at `now`. Pure: same input, same answer.
pub fn decide(input: &Input, now: Timestamp) -> Decision {
    // A policy's input was checked when the policy was read: only a bare input is checked here.
    let windows: Arc<[ValidWindow]> = match &input.checked {
        Some(checked) => checked.0.clone(),
        None => match input.validate() {
            Ok(windows) => windows.into(),
            Err(errors) => return Decision::Invalid { errors },
        },
    };
    let windows_ignored = input.mode == Mode::Automatic && !windows.is_empty();
    let Some(expires_at) = input.expiry else {
        return match input.mode {
            Mode::Disabled => Decision::Disabled {
                expires_at: None,
                fail_safe_at: None,
                inside_fail_safe: false,
            },
            Mode::Automatic | Mode::Scheduled => Decision::NoExpiry { windows_ignored },
        };
    };
    let fail_safe_at = saturating_sub(expires_at, input.fail_safe_margin().as_duration());
    let inside_fail_safe = now >= fail_safe_at;
    let scheduled = match input.mode {
        Mode::Disabled => {
            return Decision::Disabled {
                expires_at: Some(expires_at),
                fail_safe_at: Some(fail_safe_at),
                inside_fail_safe,
            };
        }
        Mode::Automatic => false,
        Mode::Scheduled => true,
    };
    let due_at = input.due_at(expires_at);
    let backoff_until = input.backoff.retry_at(&input.failures, Some(fail_safe_at));

    // The earliest instant that is due and past the backoff, and which of the two it is.
    let (ready, ready_resume) = match backoff_until {
        Some(backoff_until) if backoff_until > due_at => (backoff_until, Resume::BackoffEnds),
        _ => (due_at, Resume::Due),
    };
    let ready = ready.max(now);
    let (start_at, resume) = if !scheduled || first_containing(&windows, ready).is_some() {
        (ready, ready_resume)
    } else if !input.strict && ready >= fail_safe_at {
        (ready, Resume::FailSafeBypass)
    } else {
        match next_start_after(&windows, ready) {
            Some(start) if input.strict || start.timestamp() <= fail_safe_at => {
                (start.timestamp(), Resume::WindowOpens(start))
            }
            _ if !input.strict => (fail_safe_at, Resume::FailSafeBypass),
            _ => (Timestamp::MAX, Resume::Never),
        }
    };
    let slot = match &resume {
        // A bypass is the fail-safe itself; `Never` never starts.
        Resume::FailSafeBypass | Resume::Never => None,
        Resume::Due | Resume::BackoffEnds | Resume::WindowOpens(_) => {
            slot(input, scheduled, &windows, due_at, start_at)
        }
    };
    // The fail-safe wins over the spread, unless strict (whose slot never leaves the window).
    let latest = match input.strict {
        true => Timestamp::MAX,
        false => fail_safe_at.max(start_at),
    };
    let (start_at, slot) = match slot {
        Some(slot) if slot.at > start_at && latest > start_at => (slot.at.min(latest), Some(slot)),
        _ => (start_at, None),
    };

    if start_at <= now {
        let window = if scheduled {
            first_containing(&windows, now)
        } else {
            None
        };
        let reason = match (scheduled, window) {
            (true, None) => RenewReason::FailSafeBypass,
            _ => RenewReason::Due,
        };
        return Decision::RenewNow(Renewal {
            reason,
            window,
            expires_at,
            due_at,
            fail_safe_at,
            windows_ignored,
        });
    }
    let reason = if slot.as_ref().is_some_and(|slot| slot.unstaggered <= now) {
        DeferReason::Staggered
    } else if now < due_at {
        DeferReason::NotDue
    } else if backoff_until.is_some_and(|backoff_until| now < backoff_until) {
        DeferReason::Backoff
    } else {
        DeferReason::OutsideWindow
    };
    Decision::Defer(Deferral {
        until: start_at,
        reason,
        resume,
        expires_at,
        due_at,
        fail_safe_at,
        inside_fail_safe,
        failed_attempts: input.failures.count,
        windows_ignored,
        slot: slot.map(Box::new),
    })
}

/// This Machine's slot for a renewal that could start at `start_at` (a due time, a backoff end
/// or a window instant, not a bypass), or `None` without a key or with a zero spread. See the
/// staggering rule in the module docs.
fn slot(
    input: &Input,
    scheduled: bool,
    windows: &[ValidWindow],
    due_at: Timestamp,
    start_at: Timestamp,
) -> Option<Slot> {
    let key = input.stagger?;
    let spread = input.spread();
    if spread.as_seconds() <= 0 {
        return None;
    }
    let (anchor, room, window) = if scheduled {
        // `start_at` is inside a window here; `None` would only mean that it is not.
        let occurrence = opened_first(windows, start_at)?;
        let anchor = occurrence.start.timestamp().max(due_at);
        // Whole seconds, rounded down, so that the slot stays before the end.
        let room = occurrence.end.duration_since(anchor).as_secs();
        (anchor, room, Some(occurrence))
    } else {
        (due_at, i64::MAX, None)
    };
    let span = spread.as_seconds().min(room).max(0);
    let offset = SignedDuration::from_secs(key.offset(span));
    Some(Slot {
        at: saturating_add(anchor, offset),
        anchor,
        offset,
        spread,
        span: SignedDuration::from_secs(span),
        window,
        unstaggered: start_at,
    })
}

/// The next instant at which the decision can change if nothing else does, or `None` when only
/// a change to the object can change it (renewing now, invalid, no expiry, disabled inside the
/// margin). A deferral wakes at `until`, or earlier when the fail-safe margin opens first.
pub fn requeue_at(decision: &Decision) -> Option<Timestamp> {
    match decision {
        Decision::Defer(deferral) => {
            let until = (deferral.resume != Resume::Never).then_some(deferral.until);
            let margin_opens = (!deferral.inside_fail_safe).then_some(deferral.fail_safe_at);
            until.into_iter().chain(margin_opens).min()
        }
        Decision::Disabled {
            fail_safe_at,
            inside_fail_safe: false,
            ..
        } => *fail_safe_at,
        Decision::NoExpiry { .. }
        | Decision::RenewNow(_)
        | Decision::Disabled { .. }
        | Decision::Invalid { .. } => None,
    }
}

mod input;
mod invalid;
mod messages;

pub use input::{Checked, Input};
pub use invalid::{InvalidPolicy, PolicyError, SelectorError};

pub use messages::WINDOWS_IGNORED_MESSAGE;

#[cfg(test)]
mod tests;
