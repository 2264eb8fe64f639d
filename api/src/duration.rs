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
mod tests {
    use super::DurationErrorKind as E;
    use super::*;
    use proptest::prelude::*;

    fn ttl(input: &str) -> Result<i64, DurationErrorKind> {
        input
            .parse::<Ttl>()
            .map(Ttl::as_seconds)
            .map_err(|error| error.kind)
    }

    /// cluster-api-k8s `TTLToSeconds` (pkg/time/duration.go, as of ae5973f), input by input:
    /// what Go returns (`None` = error) and what we return. Rows where both accept give the
    /// same seconds; every row where the answers differ says why.
    #[test]
    fn cluster_api_k8s_parity() {
        const Y: i64 = 365 * DAY;
        const MO: i64 = 30 * DAY;
        type Row = (&'static str, Option<i64>, Result<i64, DurationErrorKind>);
        let same: &[Row] = &[
            // Hand-parsed units y, mo, d (Go lower-cases a one-letter unit: 1Y, 1D).
            ("1y", Some(Y), Ok(Y)),
            ("1Y", Some(Y), Ok(Y)),
            ("6mo", Some(6 * MO), Ok(6 * MO)),
            ("90d", Some(90 * DAY), Ok(90 * DAY)),
            ("1D", Some(DAY), Ok(DAY)),
            ("01y", Some(Y), Ok(Y)),
            ("100y", Some(100 * Y), Ok(100 * Y)),
            // One number and one unit handed to time.ParseDuration: h, m, s.
            ("12h", Some(12 * HOUR), Ok(12 * HOUR)),
            ("90m", Some(90 * MINUTE), Ok(90 * MINUTE)),
            ("30s", Some(30), Ok(30)),
            ("3600s", Some(3600), Ok(3600)),
            // Rejected by both.
            ("", None, Err(E::Empty)),
            ("0", None, Err(E::Zero)),
            ("y", None, Err(E::Unexpected('y'))),
            ("10", None, Err(E::MissingUnit("10".into()))),
            ("abc", None, Err(E::Unexpected('a'))),
            ("1x", None, Err(E::UnknownUnit("x".into()))),
            ("1.5h", None, Err(E::Fraction)),
            ("1e3s", None, Err(E::UnknownUnit("e".into()))),
            ("1ms", None, Err(E::UnknownUnit("ms".into()))),
            ("1ns", None, Err(E::UnknownUnit("ns".into()))),
            ("1us", None, Err(E::UnknownUnit("us".into()))),
            ("30M", None, Err(E::AmbiguousUnit)),
            ("99999999999999999999y", None, Err(E::TooLong)),
        ];
        let go_accepts_we_reject: &[Row] = &[
            // Go sends zero and negative lifetimes to the node (design.md §7.4).
            ("0s", Some(0), Err(E::Zero)),
            ("0d", Some(0), Err(E::Zero)),
            ("0y", Some(0), Err(E::Zero)),
            ("0mo", Some(0), Err(E::Zero)),
            ("-1h", Some(-HOUR), Err(E::Negative)),
            ("-1d", Some(-DAY), Err(E::Negative)),
            ("-1mo", Some(-MO), Err(E::Negative)),
            // strconv.Atoi takes a plus sign; we take digits only.
            ("+1h", Some(HOUR), Err(E::Unexpected('+'))),
            ("+1y", Some(Y), Err(E::Unexpected('+'))),
            // Over 10000y: Go multiplies without an overflow check; no date could hold it.
            ("300000y", Some(300_000 * Y), Err(E::TooLong)),
        ];
        let extensions: &[Row] = &[
            // Compounds, largest unit first.
            ("1h30m", None, Ok(HOUR + 30 * MINUTE)),
            ("1y6mo", None, Ok(Y + 6 * MO)),
            ("1d12h", None, Ok(DAY + 12 * HOUR)),
            (
                "1y2mo3w4d5h6m7s",
                None,
                Ok(Y + 2 * MO + 21 * DAY + 4 * DAY + 5 * HOUR + 367),
            ),
            // Weeks.
            ("1w", None, Ok(7 * DAY)),
            ("2W", None, Ok(14 * DAY)),
            // Surrounding ASCII whitespace.
            (" 1y", None, Ok(Y)),
            ("1y ", None, Ok(Y)),
            ("\t90d\n", None, Ok(90 * DAY)),
            // Case-insensitive units where Go's time.ParseDuration is case-sensitive.
            ("12H", None, Ok(12 * HOUR)),
            ("30S", None, Ok(30)),
            ("6MO", None, Ok(6 * MO)),
            ("6Mo", None, Ok(6 * MO)),
            ("6mO", None, Ok(6 * MO)),
            // Go's ParseDuration overflows past ~292 years of hours; we go to 10000y.
            ("2562048h", None, Ok(2_562_048 * HOUR)),
        ];
        for (input, go, ours) in same.iter().chain(go_accepts_we_reject).chain(extensions) {
            assert_eq!(&ttl(input), ours, "input {input:?}");
            let agree = match (go, ours) {
                (Some(go), Ok(ours)) => go == ours,
                (None, Err(_)) => true,
                _ => false,
            };
            let listed_as_same = same.iter().any(|(same, _, _)| same == input);
            assert_eq!(
                agree, listed_as_same,
                "input {input:?}: classify the row correctly"
            );
        }
    }

    #[test]
    fn ttl_table() {
        let rows: &[(&str, Result<i64, DurationErrorKind>)] = &[
            ("1y", Ok(31_536_000)),
            ("6mo", Ok(15_552_000)),
            ("90d", Ok(7_776_000)),
            ("12h", Ok(43_200)),
            ("1h30m", Ok(5_400)),
            ("1y6mo", Ok(47_088_000)),
            ("1w", Ok(604_800)),
            ("  1y6mo  ", Ok(47_088_000)),
            ("1Y6MO", Ok(47_088_000)),
            ("1H30m", Ok(5_400)),
            ("10000y", Ok(MAX_SECONDS)),
            ("0", Err(E::Zero)),
            ("0s", Err(E::Zero)),
            ("0h0m", Err(E::Zero)),
            ("-1h", Err(E::Negative)),
            ("abc", Err(E::Unexpected('a'))),
            ("1x", Err(E::UnknownUnit("x".into()))),
            ("1.5h", Err(E::Fraction)),
            ("1,5h", Err(E::Fraction)),
            ("99999999999999999999y", Err(E::TooLong)),
            ("9223372036854775807s", Err(E::TooLong)),
            ("29227716d", Err(E::TooLong)),
            ("10000y1s", Err(E::TooLong)),
            ("", Err(E::Empty)),
            ("   ", Err(E::Empty)),
            ("1h30", Err(E::MissingUnit("30".into()))),
            ("1h 30m", Err(E::Unexpected(' '))),
            ("30m1h", Err(E::UnitOrder("h"))),
            ("1h1h", Err(E::UnitOrder("h"))),
            ("6M", Err(E::AmbiguousUnit)),
            ("1month", Err(E::UnknownUnit("month".into()))),
            ("1hr", Err(E::UnknownUnit("hr".into()))),
            ("1h-30m", Err(E::Unexpected('-'))),
            ("１h", Err(E::Unexpected('１'))),
            ("1h\u{a0}", Err(E::Unexpected('\u{a0}'))),
        ];
        for (input, expected) in rows {
            assert_eq!(&ttl(input), expected, "input {input:?}");
        }
    }

    #[test]
    fn errors_name_the_input_the_reason_and_the_accepted_forms() {
        let error = "abc".parse::<Ttl>().unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid TTL \"abc\": unexpected character 'a'; expected a positive duration such as 1y, 6mo, 90d, 12h, 1h30m or 1y6mo (units: y=365d, mo=30d, w, d, h, m, s)"
        );
        let error = "-1h".parse::<PolicyDuration>().unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid duration \"-1h\": negative durations are not allowed; expected a positive duration such as 30d, 12h, 1h30m or 1w2d (units: y=365d, mo=30d, w, d, h, m, s)"
        );
        let error = "1x".parse::<FailSafeMargin>().unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid fail-safe margin \"1x\": unknown unit \"x\"; expected 0 (no fail-safe) or a positive duration such as 24h, 2d or 1d12h (units: y=365d, mo=30d, w, d, h, m, s)"
        );
        let long = "9".repeat(200);
        let message = long.parse::<Ttl>().unwrap_err().to_string();
        assert!(
            message.contains(&format!("\"{}…\"", "9".repeat(64))),
            "{message}"
        );
        let message = "1\nh".parse::<Ttl>().unwrap_err().to_string();
        assert!(message.starts_with("invalid TTL \"1\\nh\""), "{message}");
    }

    #[test]
    fn the_fail_safe_margin_may_be_zero_and_nothing_else_may() {
        for zero in ["0", "0s", " 0h ", "0d0h"] {
            assert_eq!(
                zero.parse::<FailSafeMargin>()
                    .map(FailSafeMargin::as_seconds),
                Ok(0)
            );
            assert_eq!(zero.parse::<PolicyDuration>().unwrap_err().kind, E::Zero);
            assert_eq!(zero.parse::<Ttl>().unwrap_err().kind, E::Zero);
        }
        assert_eq!(FailSafeMargin::from_seconds(0).unwrap().to_string(), "0s");
        assert_eq!(PolicyDuration::from_seconds(0).unwrap_err().kind, E::Zero);
        assert_eq!(Ttl::from_seconds(-1).unwrap_err().kind, E::Negative);
        assert_eq!(
            Ttl::from_seconds(MAX_SECONDS + 1).unwrap_err().kind,
            E::TooLong
        );
        assert_eq!(
            "-0s".parse::<FailSafeMargin>().unwrap_err().kind,
            E::Negative
        );
    }

    #[test]
    fn worker_lifetimes_fit_a_csr() {
        let fits = |_: Ttl| Ok(());
        let too_long = |ttl| Err(WorkerTtlError::TooLong(ttl));
        let too_short = |ttl| Err(WorkerTtlError::TooShort(ttl));
        type Expect = fn(Ttl) -> Result<(), WorkerTtlError>;
        let rows: &[(&str, Expect)] = &[
            ("2147483647s", fits),
            ("68y1mo5d3h14m7s", fits),
            ("2147483648s", too_long),
            ("100y", too_long),
            ("10m", fits),
            ("600s", fits),
            ("599s", too_short),
            ("1s", too_short),
            ("1y", fits),
        ];
        for (input, expected) in rows {
            let ttl: Ttl = input.parse().unwrap();
            assert_eq!(ttl.check_worker(), expected(ttl), "input {input}");
            assert_eq!(
                ttl.fits_worker_csr(),
                expected(ttl).is_ok(),
                "input {input}"
            );
        }
        let error = "100y".parse::<Ttl>().unwrap().check_worker().unwrap_err();
        assert_eq!(
            error.to_string(),
            "TTL 100y is too long for a worker node: workers get their certificates through CertificateSigningRequests whose spec.expirationSeconds is a 32-bit integer, so at most 2147483647 seconds (68y1mo5d3h14m7s)"
        );
        assert_eq!(
            "68y1mo5d3h14m7s".parse::<Ttl>().unwrap().as_seconds(),
            WORKER_TTL_MAX_SECONDS
        );
    }

    #[test]
    fn display_is_canonical() {
        let rows = [
            ("1y", "1y"),
            ("90d", "3mo"),
            ("365d", "1y"),
            ("14d", "2w"),
            ("35d", "1mo5d"),
            ("90m", "1h30m"),
            ("3600s", "1h"),
            ("1y6mo", "1y6mo"),
            (" 1Y6MO ", "1y6mo"),
            ("2147483647s", "68y1mo5d3h14m7s"),
        ];
        for (input, canonical) in rows {
            assert_eq!(
                input.parse::<Ttl>().unwrap().to_string(),
                canonical,
                "input {input}"
            );
        }
    }

    #[test]
    fn serde_uses_the_string_form() {
        let ttl: Ttl = serde_json::from_str("\"90d\"").unwrap();
        assert_eq!(ttl.as_seconds(), 90 * DAY);
        assert_eq!(serde_json::to_string(&ttl).unwrap(), "\"3mo\"");
        let error = serde_json::from_str::<PolicyDuration>("\"0s\"").unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("invalid duration \"0s\": it must be longer")
        );
        assert!(serde_json::from_str::<Ttl>("3600").is_err());
        let margin: FailSafeMargin = serde_json::from_str("\"0\"").unwrap();
        assert_eq!(margin.as_seconds(), 0);
    }

    #[test]
    fn a_spread_is_zero_or_positive_and_names_itself() {
        for (input, seconds) in [
            ("0", 0),
            ("0s", 0),
            ("15m", 900),
            ("2h30m", 9000),
            ("7d", 7 * DAY),
        ] {
            assert_eq!(
                input.parse::<Spread>().map(Spread::as_seconds),
                Ok(seconds),
                "{input}"
            );
        }
        assert_eq!(Spread::ZERO.to_string(), "0s");
        assert_eq!("90m".parse::<Spread>().unwrap().to_string(), "1h30m");
        let error = "-15m".parse::<Spread>().unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid spread \"-15m\": negative durations are not allowed; expected 0 (no staggering) or a positive duration such as 15m, 1h or 2h30m (units: y=365d, mo=30d, w, d, h, m, s)"
        );
        assert_eq!(
            Spread::from_seconds(-1).unwrap_err().kind,
            DurationErrorKind::Negative
        );
        let schema = serde_json::to_value(schemars::schema_for!(Spread)).unwrap();
        assert_eq!(schema["pattern"], MARGIN_PATTERN);
        assert_eq!(
            schema["x-kubernetes-validations"][0]["rule"],
            NON_EMPTY_RULE
        );
        assert_eq!(
            schema["x-kubernetes-validations"][0]["message"],
            SPREAD_NON_EMPTY_MESSAGE
        );
    }

    #[test]
    fn schema_is_an_inline_string_with_a_pattern() {
        let schema = serde_json::to_value(schemars::schema_for!(Ttl)).unwrap();
        assert_eq!(schema["type"], "string");
        assert_eq!(schema["pattern"], POSITIVE_PATTERN);
        assert_eq!(schema["x-kubernetes-validations"][0]["rule"], POSITIVE_RULE);
        let schema = serde_json::to_value(schemars::schema_for!(FailSafeMargin)).unwrap();
        assert_eq!(schema["pattern"], MARGIN_PATTERN);
        assert_eq!(
            schema["x-kubernetes-validations"][0]["rule"],
            NON_EMPTY_RULE
        );
    }

    /// What the API server lets through (the pattern, then the CEL rule, which is a regular
    /// expression too) is what the parser accepts, except above the upper bound.
    #[test]
    fn the_schema_accepts_what_the_parser_accepts() {
        // RE2's `\s` is ASCII whitespace: so is regex's without Unicode.
        let regex = |pattern: &str| regex::Regex::new(&format!("(?-u){pattern}")).unwrap();
        let positive = (regex(POSITIVE_PATTERN), regex("[1-9]"));
        let margin = (regex(MARGIN_PATTERN), regex("[0-9]"));
        let rows = [
            "1y",
            "30d",
            " 1h30m ",
            "\t90d\n",
            "0",
            "0s",
            "00h0m",
            "",
            "   ",
            "1.5h",
            "-1h",
            "+1h",
            "30 d",
            "1h1h",
            "30m1h",
            "6M",
            "1Y6MO",
            "01s",
            "1w2d",
            "10000y",
            "10001y",
            "99999999999999999999y",
        ];
        for input in rows {
            let accepts = |(pattern, rule): &(regex::Regex, regex::Regex)| {
                pattern.is_match(input) && rule.is_match(input)
            };
            let too_long = matches!(input, "10001y" | "99999999999999999999y");
            assert_eq!(
                accepts(&positive),
                input.parse::<Ttl>().is_ok() || too_long,
                "ttl {input:?}"
            );
            assert_eq!(
                accepts(&positive),
                input.parse::<PolicyDuration>().is_ok() || too_long,
                "duration {input:?}"
            );
            assert_eq!(
                accepts(&margin),
                input.parse::<FailSafeMargin>().is_ok() || too_long,
                "margin {input:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn parsing_never_panics(input in "\\PC*") {
            let _ = input.parse::<Ttl>();
            let _ = input.parse::<FailSafeMargin>();
        }

        #[test]
        fn parsing_near_misses_never_panics(input in "[ 0-9yYmMoOwWdDhHsS+.,-]{0,24}") {
            let _ = input.parse::<Ttl>();
            let _ = input.parse::<PolicyDuration>();
        }

        #[test]
        fn display_round_trips(seconds in 1..=MAX_SECONDS) {
            let ttl = Ttl::from_seconds(seconds).unwrap();
            prop_assert_eq!(ttl.to_string().parse::<Ttl>(), Ok(ttl));
            let margin = FailSafeMargin::from_seconds(seconds - 1).unwrap();
            prop_assert_eq!(margin.to_string().parse::<FailSafeMargin>(), Ok(margin));
        }

        #[test]
        fn compounds_add_up(y in 0..100i64, mo in 0..100i64, d in 0..1000i64, h in 0..100i64, s in 0..100_000i64) {
            let input = format!("{y}y{mo}mo{d}d{h}h{s}s");
            let seconds = y * 365 * DAY + mo * 30 * DAY + d * DAY + h * HOUR + s;
            let parsed = input.parse::<FailSafeMargin>().map(FailSafeMargin::as_seconds);
            prop_assert_eq!(parsed, Ok(seconds));
        }
    }
}
