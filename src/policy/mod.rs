//! Renewal policy: when may an automatic renewal run. Pure: no I/O, time is an argument.
//!
//! This module owns the rules of design.md §4 and nothing else: it never reads the clock, the
//! API server or a node. Controllers reduce their objects to an [`Input`] and execute the
//! [`Decision`]; the `policy preview` subcommand calls the same functions offline.
//!
//! ```text
//! CertificateRenewalPolicy.spec ──spec::validate──► ValidPolicy ──┐      (or InvalidPolicy:
//!                                (selectors, windows, durations)  │       the Valid condition)
//! MachineCertificates.status ──► expiry, failures ────────────────┤
//! flags ──► Settings { strict, backoff } ─────────────────────────┤ ValidPolicy::input
//!                                                                 ▼
//!            Input { expiry, mode, renewBefore, ttl, windows, failSafeMargin, spread, strict, … }
//!                   │ .with_stagger_key(Machine UID): its place in the spread
//!                   │ validate: windows (zones, times), Scheduled has windows, renewBefore < ttl,
//!                   │           spread ≤ 7d
//!                   ▼
//!            decide(input, now) ──► Decision ──► requeue_at(&decision)
//!                                    │           (the instant the answer can change)
//!                                    ├ NoExpiry            nothing to do yet
//!                                    ├ RenewNow(Due | FailSafeBypass)
//!                                    ├ Defer { until, NotDue | Backoff | OutsideWindow | Staggered, slot }
//!                                    ├ Disabled { inside_fail_safe }
//!                                    └ Invalid { errors with field paths }
//! ```
//!
//! - [`spec`]: a `CertificateRenewalPolicy` spec checked and turned into the policy half of an
//!   [`Input`], and which Machines it selects.
//! - [`duration`]: the TTL/duration grammar shared with the manual trigger (`1y6mo`, `1h30m`);
//!   it lives in the API crate with the CRD whose fields use it, and is re-exported here.
//! - [`window`]: maintenance windows in IANA zones, DST gaps and folds, several windows OR'ed.
//! - [`cron`]: the `schedule`/`duration` form of a window (a cron expression), beside
//!   `daysOfWeek`/`start`/`end`.
//! - [`backoff`]: exponential backoff from the persisted failure history.
//! - [`stagger`]: a Machine's fixed place in a policy's `spread` (from its UID).
//! - [`decision`]: the decision itself and its condition messages.
//! - [`canary`]: where a policy's other Machines stand while its canary clusters renew first.
//! - [`promise`]: whether a policy keeps its promise in the worst case (renewed before the
//!   fail-safe point with room for failures, before the expiry alert), proven by stepping
//!   [`decide`] through failing attempts; the admission webhook refuses a policy that does not.
//!
//! A manual request (`v1beta2.k8sd.io/refresh-certificates`) bypasses windows, `Disabled` and
//! backoff; only its TTL goes through this module ([`Ttl`]).

pub mod backoff;
pub mod breaker;
pub mod canary;
pub mod cron;
pub mod decision;
mod instants;
pub mod promise;
pub mod spec;
pub mod stagger;
pub mod window;

/// The duration grammar lives with the CRD types in the API crate.
pub use ck8s_certs_api::duration;

#[cfg(test)]
pub(crate) mod testing;

pub use backoff::{Backoff, BackoffError, Failures};
pub use cron::{CronProblem, CronWindow};
pub use decision::{
    Decision, DeferReason, Deferral, Input, InvalidPolicy, Mode, PolicyError, RenewReason, Renewal,
    Resume, decide, requeue_at,
};
pub use duration::{DurationError, FailSafeMargin, PolicyDuration, Spread, Ttl, WorkerTtlError};
pub use promise::{Broken, Promise, check as check_promise};
pub use spec::{MachineSelector, SelectorError, Settings, ValidPolicy, lifetime_start, validate};
pub use stagger::{Slot, StaggerKey};
pub use window::{
    DayOfWeek, ValidWindow, ValidateWindow, WallTime, Window, WindowError, WindowOccurrence,
    WindowStart, upcoming_starts,
};
