//! A policy that cannot be applied: every problem, with its field path, in the one message
//! users see wherever the policy is reported invalid.

use std::fmt;

use super::Decision;
use crate::policy::duration::{PolicyDuration, Spread, Ttl};
use crate::policy::window::WindowError;

/// A reason the policy is invalid, with the field path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Neither selector is set (also a CEL rule of the CRD).
    #[error(
        "clusterSelector, machineSelector: at least one must be set; an empty selector ({{}}) selects every Cluster or Machine of the namespace"
    )]
    NoSelector,
    #[error(transparent)]
    Selector(#[from] SelectorError),
    /// More windows than the CRD allows (`maxItems`).
    #[error("windows: {count} windows, at most {max} are allowed")]
    TooManyWindows { count: usize, max: usize },
    #[error(transparent)]
    Window(WindowError),
    #[error(
        "windows: policy Scheduled needs at least one window (use Automatic to renew at any time)"
    )]
    NoWindows,
    #[error(
        "renewBefore: {renew_before} must be shorter than ttl ({ttl}), or every renewal would be due again at once"
    )]
    RenewBeforeNotShorterThanTtl {
        renew_before: PolicyDuration,
        ttl: Ttl,
    },
    /// Both `renewBefore` and `renewBeforePercentage` (also a CEL rule of the CRD).
    #[error(
        "renewBeforePercentage: set at most one of renewBefore (a duration before expiry) and renewBeforePercentage (a percentage of the certificates' lifetime)"
    )]
    RenewBeforeTwice,
    /// Outside 1..=99 (also the CRD schema's bounds).
    #[error(
        "renewBeforePercentage: {0} is out of range: give a percentage of the certificates' lifetime from 1 to 99"
    )]
    RenewBeforePercentage(i32),
    /// Longer than [`MAX_SPREAD`] (not in the schema: durations are strings there).
    #[error(
        "spread: {0} is too long: at most 7d (Machines that may renew at the same instant start within this span; 0 turns staggering off)"
    )]
    SpreadTooLong(Spread),
    /// `inPlaceImpossible.maxUnavailable` neither a count nor a percentage from 0% to 100%.
    #[error(
        "inPlaceImpossible.maxUnavailable: {0:?} is neither a number of Machines (0 or more) nor a percentage of a MachineDeployment's Machines (0% to 100%)"
    )]
    MaxUnavailable(String),
}

/// Every problem of an invalid policy. Its message is the one users see wherever the policy is
/// reported invalid: the policy's `Valid` condition, a Machine's `RenewalConfigInvalid`
/// condition ([`Decision::Invalid`] prints the same) and `policy preview`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct InvalidPolicy {
    /// At least one, in field order.
    pub errors: Vec<PolicyError>,
}

impl fmt::Display for InvalidPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_invalid(f, &self.errors)
    }
}

impl From<InvalidPolicy> for Decision {
    fn from(invalid: InvalidPolicy) -> Self {
        Decision::Invalid {
            errors: invalid.errors,
        }
    }
}

/// `Renewal policy is invalid: <error>; <error>`.
pub(super) fn write_invalid(f: &mut fmt::Formatter<'_>, errors: &[PolicyError]) -> fmt::Result {
    f.write_str("Renewal policy is invalid: ")?;
    for (i, error) in errors.iter().enumerate() {
        if i > 0 {
            f.write_str("; ")?;
        }
        write!(f, "{error}")?;
    }
    Ok(())
}

/// A label selector the API server would reject, with its field path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct SelectorError {
    /// Such as `machineSelector.matchExpressions[0].operator`.
    pub path: String,
    pub problem: String,
}
