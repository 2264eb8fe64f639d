//! What a decision takes besides the time: the policy as given (durations parsed, windows as
//! written), the Machine's certificates and failure history; and the checks that make a policy
//! usable.

use ck8s_certs_api::renewal_policy::{
    DEFAULT_FAIL_SAFE_MARGIN, DEFAULT_RENEW_BEFORE, DEFAULT_SPREAD, DEFAULT_TTL, MAX_SPREAD, Mode,
    RENEW_BEFORE_PERCENTAGE_RANGE,
};
use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};

use super::invalid::PolicyError;
use crate::policy::backoff::{Backoff, Failures, saturating_sub};
use crate::policy::duration::{FailSafeMargin, PolicyDuration, Spread, Ttl};
use crate::policy::stagger::StaggerKey;
use crate::policy::window::{ValidWindow, Window, validate_windows};

/// Everything the decision depends on, besides `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// The observed certificate expiry, if known.
    pub expiry: Option<Timestamp>,
    pub mode: Mode,
    /// `None`: [`DEFAULT_RENEW_BEFORE`], unless `renew_before_percentage` is set.
    pub renew_before: Option<PolicyDuration>,
    /// `renewBeforePercentage`: due this percentage (1 to 99) of the lifetime before expiry.
    pub renew_before_percentage: Option<i32>,
    /// When the certificates' lifetime began: the start of the refresh that issued them
    /// ([`lifetime_start`](super::spec::lifetime_start)). `None`: not known.
    pub lifetime_start: Option<Timestamp>,
    /// The policy's `ttl`: checked against `renewBefore`, and the lifetime when its start is not
    /// known. `None`: [`DEFAULT_TTL`].
    pub ttl: Option<Ttl>,
    pub windows: Vec<Window>,
    /// `None`: [`DEFAULT_FAIL_SAFE_MARGIN`].
    pub fail_safe_margin: Option<FailSafeMargin>,
    /// `--renewal-window-strict`: never bypass the windows.
    pub strict: bool,
    pub failures: Failures,
    pub backoff: Backoff,
    /// `spread`. `None`: [`DEFAULT_SPREAD`].
    pub spread: Option<Spread>,
    /// This Machine's place in a spread ([`Self::with_stagger_key`]). `None`: no staggering,
    /// as when there is no Machine (a preview without one).
    pub stagger: Option<StaggerKey>,
    /// The windows as checked when the policy was read ([`ValidPolicy::input`](crate::policy::spec::ValidPolicy::input)):
    /// the input is valid and [`decide`](super::decide) checks nothing again. `None`: checked
    /// by `decide`.
    pub checked: Option<Checked>,
}

/// Windows checked once, shared by every input of their policy.
#[derive(Debug, Clone)]
pub struct Checked(pub Arc<[ValidWindow]>);

/// Checked windows are what `windows` says, which inputs compare already.
impl PartialEq for Checked {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Checked {}

impl Input {
    /// An input with no windows, default durations, no failures, not strict.
    pub fn new(mode: Mode, expiry: Option<Timestamp>) -> Self {
        Self {
            expiry,
            mode,
            renew_before: None,
            renew_before_percentage: None,
            lifetime_start: None,
            ttl: None,
            windows: Vec::new(),
            fail_safe_margin: None,
            strict: false,
            failures: Failures::default(),
            backoff: Backoff::default(),
            spread: None,
            stagger: None,
            checked: None,
        }
    }

    /// `renewBefore` as set, or the default; the percentage, when set, replaces it.
    pub fn renew_before(&self) -> PolicyDuration {
        self.renew_before.unwrap_or(DEFAULT_RENEW_BEFORE)
    }

    /// The same input with the certificates' lifetime start (for `renewBeforePercentage`).
    pub fn with_lifetime_start(self, lifetime_start: Option<Timestamp>) -> Self {
        Self {
            lifetime_start,
            ..self
        }
    }

    /// The same input for the Machine with this stagger key (its UID), which fixes its place in
    /// the spread; `None` turns staggering off.
    pub fn with_stagger_key(self, key: Option<&str>) -> Self {
        Self {
            stagger: key.map(StaggerKey::new),
            ..self
        }
    }

    /// `spread` as set, or the default.
    pub fn spread(&self) -> Spread {
        self.spread.unwrap_or(DEFAULT_SPREAD)
    }

    /// The certificates' lifetime, NotBefore to NotAfter: from [`Self::lifetime_start`] when
    /// it is known and before expiry, else the policy's `ttl` (the lifetime the policy gives
    /// the certificates it renews; k8sd's default when `ttl` is omitted).
    pub fn lifetime(&self, expires_at: Timestamp) -> SignedDuration {
        match self.lifetime_start {
            Some(start) if start < expires_at => expires_at.duration_since(start),
            _ => self.ttl.unwrap_or(DEFAULT_TTL).as_duration(),
        }
    }

    /// When renewal is due: `renewBefore` (or its default) before expiry, or
    /// `renewBeforePercentage` of the lifetime before expiry (whole seconds, rounded down).
    pub fn due_at(&self, expires_at: Timestamp) -> Timestamp {
        let before = match (self.renew_before, self.renew_before_percentage) {
            (None, Some(percentage)) => {
                let seconds = self.lifetime(expires_at).as_secs();
                // At most ~20000 years of seconds times 99: far from overflow; saturate anyway.
                SignedDuration::from_secs(seconds.saturating_mul(percentage.into()) / 100)
            }
            _ => self.renew_before().as_duration(),
        };
        saturating_sub(expires_at, before)
    }

    pub fn fail_safe_margin(&self) -> FailSafeMargin {
        self.fail_safe_margin.unwrap_or(DEFAULT_FAIL_SAFE_MARGIN)
    }

    /// Checks the policy; every problem is reported.
    pub fn validate(&self) -> Result<Vec<ValidWindow>, Vec<PolicyError>> {
        let mut errors = Vec::new();
        let windows = validate_windows(&self.windows).unwrap_or_else(|problems| {
            errors.extend(problems.into_iter().map(PolicyError::Window));
            Vec::new()
        });
        if self.mode == Mode::Scheduled && self.windows.is_empty() {
            errors.push(PolicyError::NoWindows);
        }
        if self.renew_before.is_some() && self.renew_before_percentage.is_some() {
            errors.push(PolicyError::RenewBeforeTwice);
        }
        if let Some(percentage) = self.renew_before_percentage
            && !RENEW_BEFORE_PERCENTAGE_RANGE.contains(&percentage)
        {
            errors.push(PolicyError::RenewBeforePercentage(percentage));
        }
        // A percentage of the lifetime is always shorter than it.
        if let Some(ttl) = self.ttl
            && self.renew_before_percentage.is_none()
            && self.renew_before().as_seconds() >= ttl.as_seconds()
        {
            errors.push(PolicyError::RenewBeforeNotShorterThanTtl {
                renew_before: self.renew_before(),
                ttl,
            });
        }
        if self.spread() > MAX_SPREAD {
            errors.push(PolicyError::SpreadTooLong(self.spread()));
        }
        if errors.is_empty() {
            Ok(windows)
        } else {
            Err(errors)
        }
    }
}
