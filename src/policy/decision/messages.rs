//! How decisions read: the messages of renewals and deferrals (conditions, Events, `policy
//! preview`), which say when, why and what happens next.

use std::fmt;

use jiff::{SignedDuration, Timestamp};

use super::invalid::write_invalid;
use super::{Decision, DeferReason, Deferral, RenewReason, Renewal, Resume};
use crate::policy::duration::Spread;
use crate::policy::stagger::Slot;

/// The message shown when `Automatic` has windows (the `WindowsIgnored` condition).
pub const WINDOWS_IGNORED_MESSAGE: &str =
    "Policy Automatic ignores its maintenance windows: use Scheduled to renew only inside them";

pub(super) fn failed_attempts(count: Option<i64>) -> String {
    match count {
        Some(count) if count > 1 => format!("{count} failed attempts"),
        // One, or a count missing or mangled by an older version.
        _ => "a failed attempt".to_owned(),
    }
}

impl fmt::Display for Renewal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason {
            RenewReason::Due => {
                write!(
                    f,
                    "Renewing certificates: due since {}, expiring at {}",
                    self.due_at, self.expires_at
                )?;
                if let Some(index) = self.window {
                    write!(f, ", inside maintenance window windows[{index}]")?;
                }
                Ok(())
            }
            RenewReason::FailSafeBypass => write!(
                f,
                "Renewing certificates outside the maintenance windows: they expire at {}, within the fail-safe margin since {}",
                self.expires_at, self.fail_safe_at
            ),
        }
    }
}

/// `<until>: this Machine's slot is 7m13s after maintenance window windows[0] opened at …,
/// within a 15m spread`: when the renewal starts, and the slot, the spread and the window it
/// belongs to; when the fail-safe point comes first, says so.
pub(super) fn write_staggered(
    f: &mut fmt::Formatter<'_>,
    slot: &Slot,
    until: Timestamp,
    due_at: Timestamp,
) -> fmt::Result {
    if until < slot.at {
        write!(
            f,
            "{until}, when expiry comes within the fail-safe margin, which overrides the spread: this Machine's slot, at {}, is ",
            slot.at
        )?;
    } else {
        write!(f, "{until}: this Machine's slot is ")?;
    }
    write!(f, "{} after ", seconds(slot.offset))?;
    match &slot.window {
        Some(window) if slot.anchor > window.start.timestamp() => write!(
            f,
            "the due time {due_at}, inside maintenance window windows[{}] (open since {})",
            window.index,
            window.opening()
        )?,
        Some(window) => write!(
            f,
            "maintenance window windows[{}] opened at {}",
            window.index,
            window.opening()
        )?,
        None => write!(f, "the due time {due_at}")?,
    }
    write!(f, ", within a {} spread", slot.spread)?;
    if let Some(window) = slot.window.as_ref().filter(|_| slot.scaled()) {
        write!(
            f,
            " scaled down to the {} left before the window closes at {}",
            seconds(slot.span),
            window.end
        )?;
    }
    Ok(())
}

/// Whole seconds in the duration grammar's canonical form (`7m13s`, `0s`).
pub(super) fn seconds(duration: SignedDuration) -> String {
    match Spread::from_seconds(duration.as_secs()) {
        Ok(spread) => spread.to_string(),
        Err(_) => format!("{}s", duration.as_secs()),
    }
}

impl fmt::Display for Deferral {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let (DeferReason::Staggered, Some(slot)) = (self.reason, &self.slot) {
            f.write_str("Renewal staggered until ")?;
            write_staggered(f, slot, self.until, self.due_at)?;
            return self.write_fail_safe(f);
        }
        // The instant the cause ends; with a slot, the spread moves the start on to `until`.
        let until = self
            .slot
            .as_ref()
            .map_or(self.until, |slot| slot.unstaggered);
        match (self.reason, &self.resume) {
            (DeferReason::NotDue, resume) => {
                write!(
                    f,
                    "Renewal is not due until {} (certificates expire at {})",
                    self.due_at, self.expires_at
                )?;
                match resume {
                    Resume::Due => {}
                    Resume::BackoffEnds => write!(
                        f,
                        "; after {}, it will start when the backoff ends at {until}",
                        failed_attempts(self.failed_attempts)
                    )?,
                    Resume::WindowOpens(start) => write!(
                        f,
                        "; it will start when the next maintenance window opens at {start}"
                    )?,
                    Resume::FailSafeBypass => write!(
                        f,
                        "; it will start then outside the maintenance windows, as expiry is within the fail-safe margin"
                    )?,
                    Resume::Never => {
                        f.write_str("; no maintenance window opens before the year 10000")?
                    }
                }
            }
            (DeferReason::Backoff, resume) => {
                let attempts = failed_attempts(self.failed_attempts);
                match resume {
                    Resume::Due | Resume::BackoffEnds => {
                        write!(f, "Renewal backed off after {attempts} until {until}")?
                    }
                    Resume::WindowOpens(start) => write!(
                        f,
                        "Renewal backed off after {attempts}; retrying when the next maintenance window opens at {start}"
                    )?,
                    Resume::FailSafeBypass => write!(
                        f,
                        "Renewal backed off after {attempts} until {until}, then retrying outside the maintenance windows as certificates expire at {}, within the fail-safe margin",
                        self.expires_at
                    )?,
                    Resume::Never => write!(
                        f,
                        "Renewal backed off after {attempts}; no maintenance window opens before the year 10000"
                    )?,
                }
            }
            (DeferReason::OutsideWindow, resume) => match resume {
                Resume::WindowOpens(start) => write!(
                    f,
                    "Renewal deferred until the next maintenance window opens at {start}"
                )?,
                Resume::FailSafeBypass => write!(
                    f,
                    "Renewal deferred until {until}, when expiry is within the fail-safe margin and the maintenance windows are bypassed"
                )?,
                Resume::Due | Resume::BackoffEnds => write!(f, "Renewal deferred until {until}")?,
                Resume::Never => f.write_str(
                    "Renewal deferred: no maintenance window opens before the year 10000",
                )?,
            },
            // Only with a slot, handled above; answered rather than assumed.
            (DeferReason::Staggered, _) => write!(f, "Renewal staggered until {until}")?,
        }
        if let Some(slot) = &self.slot {
            f.write_str("; staggered, it will start at ")?;
            write_staggered(f, slot, self.until, self.due_at)?;
        }
        self.write_fail_safe(f)
    }
}

impl Deferral {
    /// `; certificates expire at …, within the fail-safe margin` when a Warning is due.
    fn write_fail_safe(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Unless the message names the expiry already.
        if self.inside_fail_safe
            && self.reason != DeferReason::NotDue
            && self.resume != Resume::FailSafeBypass
        {
            write!(
                f,
                "; certificates expire at {}, within the fail-safe margin",
                self.expires_at
            )?;
            if self.reason == DeferReason::OutsideWindow {
                f.write_str(", but strict windows forbid a bypass")?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for Decision {
    /// A condition message: capitalised, no final period, with the next time.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoExpiry { .. } => {
                f.write_str("Certificate expiry is not known yet, so no renewal is scheduled")
            }
            Self::RenewNow(renewal) => renewal.fmt(f),
            Self::Defer(deferral) => deferral.fmt(f),
            Self::Disabled {
                expires_at,
                inside_fail_safe,
                ..
            } => {
                f.write_str("Automatic renewal is disabled by the policy")?;
                match (expires_at, inside_fail_safe) {
                    (Some(expires_at), true) => write!(
                        f,
                        "; certificates expire at {expires_at}, within the fail-safe margin: renew them manually with the {} annotation",
                        ck8s_certs_api::annotations::REFRESH_CERTIFICATES
                    ),
                    (Some(expires_at), false) => {
                        write!(f, "; certificates expire at {expires_at}")
                    }
                    (None, _) => Ok(()),
                }
            }
            Self::Invalid { errors } => write_invalid(f, errors),
        }
    }
}
