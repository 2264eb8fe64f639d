//! The duration grammar shared by the manual trigger (`refresh-certificates: <ttl>`) and the
//! renewal policy (`ttl`, `renewBefore`, `failSafeMargin`, `spread`, backoff flags).
//!
//! It lives in the API crate because the `CertificateRenewalPolicy` fields are these types (their
//! schema carries the grammar's pattern); the controller re-exports it as `policy::duration`.
//!
//! One grammar, four types that differ only in what they allow:
//! - [`Ttl`]: the lifetime asked of k8sd; positive. Workers have a narrower range, see
//!   [`Ttl::check_worker`].
//! - [`PolicyDuration`]: any other positive policy duration (`renewBefore`, backoff min/max).
//! - [`FailSafeMargin`]: like `PolicyDuration` but zero is allowed (written `0`, `0s`, `0h`, …),
//!   meaning "no fail-safe": windows are bypassed only once the certificates have expired.
//! - [`Spread`]: how far apart renewals that become allowed together are spread; zero is allowed
//!   and turns staggering off. Its upper bound (7d) is the policy's check, not the grammar's.
//!
//! # Grammar
//! ```text
//! duration  = ws* ( "0" | component+ ) ws*
//! component = digit+ unit
//! unit      = "y" (365d) | "mo" (30d) | "w" | "d" | "h" | "m" | "s"
//! ```
//! - Units are ASCII case-insensitive (`1Y`, `6MO`, `12H`), except that a lone capital `M` is
//!   rejected: it means months to some people and minutes to others, and a 6-minute lifetime
//!   taken for 6 months is an outage. Write `mo` or `m`.
//! - Components go from the largest unit to the smallest, each at most once (`1y6mo`, `1h30m`;
//!   not `30m1h`, not `1h1h`). This makes [`Display`](std::fmt::Display) canonical and catches
//!   typos. A component may exceed the next unit (`90m`, `36h`).
//! - Only ASCII whitespace around the value is ignored (the same set as `\s` in the CRD schema's
//!   pattern, which the API server checks with Go's RE2); none inside (`1h 30m` is rejected).
//! - No sign, no fraction, no exponent: `-1h`, `+1h`, `1.5h`, `1e3s` are rejected.
//! - At most [`MAX_SECONDS`] (10000y): jiff timestamps end in year 9999, so nothing longer can
//!   ever be added to a date, and every sum of two durations stays far from `i64` overflow.
//!
//! `y` and `mo` are fixed lengths, not calendar units: k8sd turns the seconds back into a date,
//! treating exact multiples of 365 days as years and of 30 days as months, so `1y` here is `1y`
//! there. The canonical form printed by `Display` follows the same units greedily (`90d` prints
//! as `3mo`, which is how k8sd will read it).
//!
//! # Compared with cluster-api-k8s
//! The CK8s CAPI provider parses the same annotation with `TTLToSeconds` (`pkg/time/duration.go`):
//! one number and one unit, `y`/`mo`/`d` by hand and the rest through Go's `time.ParseDuration`.
//! We accept every positive value it accepts, with the same number of seconds, except `+N…`
//! (a sign) and values over 10000y; we reject the zero and negative values it lets through to
//! the node; and we add compounds (`1y6mo`, `1h30m`), `w`, surrounding whitespace and upper-case
//! `H`/`S`/`MO`/`W`. The test table `cluster_api_k8s_parity` lists every row.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use jiff::SignedDuration;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

const MINUTE: i64 = 60;
const HOUR: i64 = 60 * MINUTE;
const DAY: i64 = 24 * HOUR;

/// Units from largest to smallest: the order components must follow, and the order `Display`
/// uses to print the canonical form.
const UNITS: [(&str, i64); 7] = [
    ("y", 365 * DAY),
    ("mo", 30 * DAY),
    ("w", 7 * DAY),
    ("d", DAY),
    ("h", HOUR),
    ("m", MINUTE),
    ("s", 1),
];

/// The longest accepted duration, 10000y in seconds (see the module docs).
pub const MAX_SECONDS: i64 = 10_000 * 365 * DAY;

/// The smallest `spec.expirationSeconds` the Kubernetes API accepts on a
/// CertificateSigningRequest (10 minutes; the API server rejects anything shorter).
pub const WORKER_TTL_MIN_SECONDS: i64 = 600;

/// The largest `spec.expirationSeconds` a CertificateSigningRequest can carry: it is an int32.
pub const WORKER_TTL_MAX_SECONDS: i64 = i32::MAX as i64;

const UNITS_HELP: &str = "units: y=365d, mo=30d, w, d, h, m, s";

/// The CRD schema pattern: the grammar's syntax (largest unit first, each at most once). RE2 (the
/// API server's regex engine) has no look-ahead to exclude zero and the empty string as well;
/// [`POSITIVE_RULE`] and [`NON_EMPTY_RULE`] do. Only the upper bound (10000y) is left to the
/// parser, so a value the API server accepts can fail to deserialise only when it is absurdly
/// long, and the controller must read these objects through `DeserializeGuard`.
const POSITIVE_PATTERN: &str = r"^\s*([0-9]+[yY])?([0-9]+[mM][oO])?([0-9]+[wW])?([0-9]+[dD])?([0-9]+[hH])?([0-9]+m)?([0-9]+[sS])?\s*$";
const MARGIN_PATTERN: &str = r"^\s*(0|([0-9]+[yY])?([0-9]+[mM][oO])?([0-9]+[wW])?([0-9]+[dD])?([0-9]+[hH])?([0-9]+m)?([0-9]+[sS])?)\s*$";

/// CEL rules completing the patterns. Once the pattern holds, a value is zero exactly when it
/// has no non-zero digit, and empty (or blank) exactly when it has no digit at all.
const POSITIVE_RULE: &str = "self.matches('[1-9]')";
const POSITIVE_MESSAGE: &str = "must be longer than zero, such as 30d, 12h or 1y";
const NON_EMPTY_RULE: &str = "self.matches('[0-9]')";
const NON_EMPTY_MESSAGE: &str = "must not be empty: write 0 to turn the fail-safe off";
const SPREAD_NON_EMPTY_MESSAGE: &str = "must not be empty: write 0 to turn staggering off";

/// The schema's `maxLength`: far above any valid value (`10000y11mo4w6d23h59m59s` has 23
/// characters), and it bounds the API server's CEL cost estimate.
const MAX_LENGTH: usize = 64;

/// Why a duration string was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DurationErrorKind {
    Empty,
    Negative,
    /// Zero where a positive duration is required.
    Zero,
    Fraction,
    /// A number with no unit after it (`90`, the `30` of `1h30`).
    MissingUnit(String),
    UnknownUnit(String),
    /// A lone capital `M`.
    AmbiguousUnit,
    /// A unit that repeats or comes after a smaller one.
    UnitOrder(&'static str),
    Unexpected(char),
    TooLong,
}

impl fmt::Display for DurationErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("it is empty"),
            Self::Negative => f.write_str("negative durations are not allowed"),
            Self::Zero => f.write_str("it must be longer than zero"),
            Self::Fraction => f.write_str("fractions are not allowed (write 1h30m, not 1.5h)"),
            Self::MissingUnit(number) => write!(f, "{number} has no unit"),
            Self::UnknownUnit(unit) => write!(f, "unknown unit {unit:?}"),
            Self::AmbiguousUnit => {
                f.write_str("unit \"M\" is ambiguous: write mo for months or m for minutes")
            }
            Self::UnitOrder(unit) => write!(
                f,
                "units must go from the largest to the smallest, each at most once ({unit:?} is out of place)"
            ),
            Self::Unexpected(found) => write!(f, "unexpected character {found:?}"),
            Self::TooLong => {
                f.write_str("it is longer than 10000y, the longest supported duration")
            }
        }
    }
}

/// What was being parsed, for the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurationSubject {
    Ttl,
    Duration,
    FailSafeMargin,
    Spread,
}

/// A rejected duration: which kind, the offending input, why, and the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {} {input:?}: {kind}; {}", self.subject_name(), self.expected())]
pub struct DurationError {
    pub subject: DurationSubject,
    /// The input, shortened to 64 characters so that a pasted blob cannot flood an Event.
    pub input: String,
    pub kind: DurationErrorKind,
}

impl DurationError {
    fn new(subject: DurationSubject, input: &str, kind: DurationErrorKind) -> Self {
        let input = match input.char_indices().nth(64) {
            Some((cut, _)) => format!("{}…", &input[..cut]),
            None => input.to_owned(),
        };
        Self {
            subject,
            input,
            kind,
        }
    }

    fn subject_name(&self) -> &'static str {
        match self.subject {
            DurationSubject::Ttl => "TTL",
            DurationSubject::Duration => "duration",
            DurationSubject::FailSafeMargin => "fail-safe margin",
            DurationSubject::Spread => "spread",
        }
    }

    fn expected(&self) -> String {
        match self.subject {
            DurationSubject::Ttl => format!(
                "expected a positive duration such as 1y, 6mo, 90d, 12h, 1h30m or 1y6mo ({UNITS_HELP})"
            ),
            DurationSubject::Duration => format!(
                "expected a positive duration such as 30d, 12h, 1h30m or 1w2d ({UNITS_HELP})"
            ),
            DurationSubject::FailSafeMargin => format!(
                "expected 0 (no fail-safe) or a positive duration such as 24h, 2d or 1d12h ({UNITS_HELP})"
            ),
            DurationSubject::Spread => format!(
                "expected 0 (no staggering) or a positive duration such as 15m, 1h or 2h30m ({UNITS_HELP})"
            ),
        }
    }
}

/// Parses the grammar into seconds (zero allowed; the types decide).
fn parse_seconds(input: &str) -> Result<i64, DurationErrorKind> {
    let text = input.trim_matches(|c: char| c.is_ascii_whitespace());
    if text.is_empty() {
        return Err(DurationErrorKind::Empty);
    }
    if text == "0" {
        return Ok(0);
    }
    let bytes = text.as_bytes();
    // Every index below only ever steps over ASCII bytes, so it stays on a char boundary.
    let unexpected = |at: usize| {
        let found = text[at..].chars().next().unwrap_or(' ');
        DurationErrorKind::Unexpected(found)
    };
    let mut at = 0;
    let mut total: i64 = 0;
    let mut previous: Option<usize> = None;
    while at < bytes.len() {
        let digits = at;
        while at < bytes.len() && bytes[at].is_ascii_digit() {
            at += 1;
        }
        if at == digits {
            return Err(match bytes[at] {
                b'-' if at == 0 => DurationErrorKind::Negative,
                _ => unexpected(at),
            });
        }
        let number = &text[digits..at];
        let letters = at;
        while at < bytes.len() && bytes[at].is_ascii_alphabetic() {
            at += 1;
        }
        let unit = &text[letters..at];
        if unit.is_empty() {
            return Err(match bytes.get(at) {
                None => DurationErrorKind::MissingUnit(number.to_owned()),
                Some(b'.' | b',') => DurationErrorKind::Fraction,
                Some(_) => unexpected(at),
            });
        }
        if unit == "M" {
            return Err(DurationErrorKind::AmbiguousUnit);
        }
        let Some(rank) = UNITS
            .iter()
            .position(|(name, _)| unit.eq_ignore_ascii_case(name))
        else {
            return Err(DurationErrorKind::UnknownUnit(unit.to_owned()));
        };
        if previous.is_some_and(|previous| rank <= previous) {
            return Err(DurationErrorKind::UnitOrder(UNITS[rank].0));
        }
        previous = Some(rank);
        // Only digits remain, so a failed parse can only be an overflow.
        total = number
            .parse::<i64>()
            .ok()
            .and_then(|value| value.checked_mul(UNITS[rank].1))
            .and_then(|seconds| total.checked_add(seconds))
            .ok_or(DurationErrorKind::TooLong)?;
    }
    if total > MAX_SECONDS {
        return Err(DurationErrorKind::TooLong);
    }
    Ok(total)
}

/// Prints seconds in the canonical form: greedy over the units, largest first.
fn write_canonical(f: &mut fmt::Formatter<'_>, seconds: i64) -> fmt::Result {
    if seconds == 0 {
        return f.write_str("0s");
    }
    let mut rest = seconds;
    for (name, size) in UNITS {
        let count = rest / size;
        if count > 0 {
            write!(f, "{count}{name}")?;
            rest %= size;
        }
    }
    Ok(())
}

/// The shared trait implementations of the duration types; they differ only in the subject
/// named by errors, whether zero is allowed (and the schema's message for an empty value, which
/// says what zero means), and the schema.
macro_rules! duration_type {
    ($type:ident, $subject:expr, $allow_zero:expr, $pattern:expr, $description:expr) => {
        duration_type!(
            $type,
            $subject,
            $allow_zero,
            $pattern,
            NON_EMPTY_MESSAGE,
            $description
        );
    };
    ($type:ident, $subject:expr, $allow_zero:expr, $pattern:expr, $empty_message:expr, $description:expr) => {
        impl $type {
            /// The duration in whole seconds.
            pub const fn as_seconds(self) -> i64 {
                self.0
            }

            /// The duration as a jiff duration, for timestamp arithmetic.
            pub const fn as_duration(self) -> SignedDuration {
                SignedDuration::from_secs(self.0)
            }

            /// Builds the value from seconds, with the same range checks as parsing.
            pub fn from_seconds(seconds: i64) -> Result<Self, DurationError> {
                let kind = if seconds < 0 {
                    Some(DurationErrorKind::Negative)
                } else if seconds == 0 && !$allow_zero {
                    Some(DurationErrorKind::Zero)
                } else if seconds > MAX_SECONDS {
                    Some(DurationErrorKind::TooLong)
                } else {
                    None
                };
                match kind {
                    Some(kind) => Err(DurationError::new($subject, &format!("{seconds}s"), kind)),
                    None => Ok(Self(seconds)),
                }
            }
        }

        impl FromStr for $type {
            type Err = DurationError;

            fn from_str(input: &str) -> Result<Self, Self::Err> {
                let error = |kind| DurationError::new($subject, input, kind);
                match parse_seconds(input) {
                    Ok(0) if !$allow_zero => Err(error(DurationErrorKind::Zero)),
                    Ok(seconds) => Ok(Self(seconds)),
                    Err(kind) => Err(error(kind)),
                }
            }
        }

        impl fmt::Display for $type {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write_canonical(f, self.0)
            }
        }

        impl Serialize for $type {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $type {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = Cow::<str>::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }

        impl JsonSchema for $type {
            fn schema_name() -> Cow<'static, str> {
                stringify!($type).into()
            }

            // Kubernetes structural schemas cannot use `$ref`.
            fn inline_schema() -> bool {
                true
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                let (rule, message) = match $allow_zero {
                    true => (NON_EMPTY_RULE, $empty_message),
                    false => (POSITIVE_RULE, POSITIVE_MESSAGE),
                };
                json_schema!({
                    "type": "string",
                    "pattern": $pattern,
                    "maxLength": MAX_LENGTH,
                    "x-kubernetes-validations": [{"rule": rule, "message": message}],
                    "description": $description,
                })
            }
        }
    };
}

/// A certificate lifetime to ask k8sd for, from the `refresh-certificates` annotation or a
/// policy's `ttl`. Always positive and at most [`MAX_SECONDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ttl(i64);

duration_type!(
    Ttl,
    DurationSubject::Ttl,
    false,
    POSITIVE_PATTERN,
    "Certificate lifetime such as 1y, 6mo, 90d, 12h, 1h30m or 1y6mo (units: y=365d, mo=30d, w, d, h, m, s). Workers accept 10m to 68y (CSR expirationSeconds is an int32)."
);

impl Ttl {
    /// For constants such as defaults.
    ///
    /// # Panics
    /// Unless `seconds` is in `1..=MAX_SECONDS`; in a `const`, that is a compile error.
    pub const fn from_secs_const(seconds: i64) -> Self {
        assert!(seconds > 0 && seconds <= MAX_SECONDS);
        Self(seconds)
    }

    /// Whether a worker can be given this lifetime: workers obtain certificates through
    /// CertificateSigningRequests, whose `spec.expirationSeconds` is an int32 of at least 600.
    pub fn fits_worker_csr(self) -> bool {
        (WORKER_TTL_MIN_SECONDS..=WORKER_TTL_MAX_SECONDS).contains(&self.0)
    }

    /// [`fits_worker_csr`](Self::fits_worker_csr), with the reason when it does not.
    pub fn check_worker(self) -> Result<(), WorkerTtlError> {
        if self.0 < WORKER_TTL_MIN_SECONDS {
            Err(WorkerTtlError::TooShort(self))
        } else if self.0 > WORKER_TTL_MAX_SECONDS {
            Err(WorkerTtlError::TooLong(self))
        } else {
            Ok(())
        }
    }
}

/// A TTL a worker node cannot be given (see [`Ttl::check_worker`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WorkerTtlError {
    #[error(
        "TTL {0} is too long for a worker node: workers get their certificates through CertificateSigningRequests whose spec.expirationSeconds is a 32-bit integer, so at most 2147483647 seconds (68y1mo5d3h14m7s)"
    )]
    TooLong(Ttl),
    #[error(
        "TTL {0} is too short for a worker node: the Kubernetes API rejects CertificateSigningRequests whose spec.expirationSeconds is below 600 seconds (10m)"
    )]
    TooShort(Ttl),
}

/// A positive policy duration: `renewBefore`, the backoff minimum and maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyDuration(i64);

duration_type!(
    PolicyDuration,
    DurationSubject::Duration,
    false,
    POSITIVE_PATTERN,
    "Positive duration such as 30d, 12h, 1h30m or 1w2d (units: y=365d, mo=30d, w, d, h, m, s)."
);

impl PolicyDuration {
    /// For constants such as defaults.
    ///
    /// # Panics
    /// Unless `seconds` is in `1..=MAX_SECONDS`; in a `const`, that is a compile error.
    pub const fn from_secs_const(seconds: i64) -> Self {
        assert!(seconds > 0 && seconds <= MAX_SECONDS);
        Self(seconds)
    }
}

/// How long before expiry automatic renewal stops waiting for a maintenance window. Zero is
/// allowed and means no fail-safe before expiry (windows are still bypassed once expired).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FailSafeMargin(i64);

duration_type!(
    FailSafeMargin,
    DurationSubject::FailSafeMargin,
    true,
    MARGIN_PATTERN,
    "How long before expiry renewal ignores maintenance windows, such as 24h or 2d; 0 turns the fail-safe off until expiry (units: y=365d, mo=30d, w, d, h, m, s)."
);

impl FailSafeMargin {
    /// For constants such as defaults.
    ///
    /// # Panics
    /// Unless `seconds` is in `0..=MAX_SECONDS`; in a `const`, that is a compile error.
    pub const fn from_secs_const(seconds: i64) -> Self {
        assert!(seconds >= 0 && seconds <= MAX_SECONDS);
        Self(seconds)
    }
}

/// A policy's `spread`: Machines allowed to renew at the same instant start at per-Machine
/// offsets within it. Zero is allowed and turns staggering off; the policy caps it at 7d (the
/// controller's check, so that the message names the field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Spread(i64);

duration_type!(
    Spread,
    DurationSubject::Spread,
    true,
    MARGIN_PATTERN,
    SPREAD_NON_EMPTY_MESSAGE,
    "How far apart Machines that may renew at the same instant are spread, such as 15m or 2h: each starts at its own offset below it; 0 turns staggering off (units: y=365d, mo=30d, w, d, h, m, s)."
);

impl Spread {
    /// No staggering.
    pub const ZERO: Spread = Spread(0);

    /// For constants such as defaults.
    ///
    /// # Panics
    /// Unless `seconds` is in `0..=MAX_SECONDS`; in a `const`, that is a compile error.
    pub const fn from_secs_const(seconds: i64) -> Self {
        assert!(seconds >= 0 && seconds <= MAX_SECONDS);
        Self(seconds)
    }
}

#[cfg(test)]
mod tests;
