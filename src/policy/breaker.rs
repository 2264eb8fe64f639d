//! The circuit breaker of automatic renewals: when too many of them fail within a period (a
//! policy change that breaks every refresh, a k8sd release with a new failure), automatic
//! renewals stop until a person resumes them, instead of failing one cluster after another.
//!
//! Two breakers count the same failures: each policy's (its own Machines, `circuitBreaker` in
//! its spec) and the fleet's (every policy's Machines, `--fleet-breaker-failures`). Either one
//! opens a policy's breaker; only a resume closes it, and failures before the resume no longer
//! count. A failure is a Machine whose last automatic renewal failed (its `lastFailureTime`):
//! one Machine failing again and again after its backoff counts once, so a single broken node
//! does not stop a whole policy. Pure: the caller collects the failures and keeps the state.

use ck8s_certs_api::renewal_policy::{
    BreakerFailure, BreakerStatus, CircuitBreaker, DEFAULT_BREAKER_FAILURES, DEFAULT_BREAKER_PERIOD,
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// How many failures an open breaker lists.
pub const LISTED: usize = 10;

/// How many failures within how long open a breaker (`failures` 0: never).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    pub failures: usize,
    pub period: SignedDuration,
}

impl Limit {
    /// A policy's limit, its defaults filled in.
    pub fn of_policy(spec: Option<&CircuitBreaker>) -> Self {
        let failures = spec
            .and_then(|b| b.failures)
            .unwrap_or(DEFAULT_BREAKER_FAILURES);
        let period = spec
            .and_then(|b| b.period)
            .unwrap_or(DEFAULT_BREAKER_PERIOD);
        Self {
            failures: usize::try_from(failures).unwrap_or(0),
            period: SignedDuration::from_secs(period.as_seconds()),
        }
    }

    /// The failures among `failures` that count at `now`: within the period, after `since`.
    fn counted<'a>(
        &self,
        failures: &'a [Failure],
        since: Option<Timestamp>,
        now: Timestamp,
    ) -> Vec<&'a Failure> {
        let from = now.checked_sub(self.period).unwrap_or(Timestamp::MIN);
        let from = since.map_or(from, |since| from.max(since));
        failures
            .iter()
            .filter(|f| f.at > from && f.at <= now)
            .collect()
    }
}

/// A Machine whose last automatic renewal failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// namespace/name.
    pub machine: String,
    pub cluster: Option<String>,
    pub at: Timestamp,
    pub message: String,
}

/// Which breaker opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Policy,
    Fleet,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Policy => "Policy",
            Self::Fleet => "Fleet",
        }
    }
}

/// A resume asked for by a person: who, and the annotation's value it was read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resume {
    pub by: String,
    pub request: String,
}

/// What the breaker of one policy does at `now`.
#[derive(Clone, Debug, PartialEq)]
pub enum Turn {
    /// Nothing changes.
    Stays,
    /// It opens: automatic renewals stop.
    Opens,
    /// A person resumed it (it may have been closed already).
    Resumed { was_open: bool },
}

/// The breaker's state after `now`: `old` as the policy's status holds it, a `resume` asked for,
/// and the failures of the policy's Machines (`ours`) and of the fleet's (`all`).
pub fn next(
    old: Option<&BreakerStatus>,
    resume: Option<&Resume>,
    limits: (Limit, Limit),
    ours: &[Failure],
    all: &[Failure],
    now: Timestamp,
) -> (Option<BreakerStatus>, Turn) {
    let resumed_at = old.and_then(|b| b.resumed_at.as_ref()).map(|t| t.0);
    let was_open = old.is_some_and(is_open);
    if let Some(resume) = resume {
        let closed = BreakerStatus {
            resumed_at: Some(Time(now)),
            resumed_by: Some(resume.by.clone()),
            resume_request: Some(resume.request.clone()),
            ..BreakerStatus::default()
        };
        return (Some(closed), Turn::Resumed { was_open });
    }
    if was_open {
        return (old.cloned(), Turn::Stays);
    }
    let (policy, fleet) = limits;
    let tripped = [(Scope::Policy, policy, ours), (Scope::Fleet, fleet, all)]
        .into_iter()
        .find_map(|(scope, limit, failures)| {
            let counted = limit.counted(failures, resumed_at, now);
            (limit.failures > 0 && counted.len() >= limit.failures).then_some((scope, counted))
        });
    let Some((scope, mut counted)) = tripped else {
        return (old.cloned(), Turn::Stays);
    };
    counted.sort_by(|a, b| b.at.cmp(&a.at).then_with(|| a.machine.cmp(&b.machine)));
    let opened = BreakerStatus {
        opened_at: Some(Time(now)),
        scope: Some(scope.as_str().to_owned()),
        failures: counted
            .into_iter()
            .take(LISTED)
            .map(|f| BreakerFailure {
                machine: f.machine.clone(),
                cluster: f.cluster.clone(),
                at: Time(f.at),
                message: crate::text::bounded(&f.message, 300),
            })
            .collect(),
        ..old.cloned().unwrap_or_default()
    };
    (Some(opened), Turn::Opens)
}

/// Whether `breaker` stops automatic renewals.
pub fn is_open(breaker: &BreakerStatus) -> bool {
    breaker.opened_at.is_some()
}

/// The `RenewalsHalted` message of an open breaker of policy `namespace/name`: what failed
/// (with each refresh's error when `errors`; an Event's note holds at most 1,024 characters),
/// and how to resume.
pub fn describe(
    breaker: &BreakerStatus,
    limits: (Limit, Limit),
    namespace: &str,
    name: &str,
    errors: bool,
) -> String {
    let (limit, whose) = match breaker.scope.as_deref() {
        Some("Fleet") => (limits.1, "across the fleet"),
        _ => (limits.0, "under this policy"),
    };
    let failures: Vec<String> = breaker
        .failures
        .iter()
        .map(|f| {
            let at = f.at.0.round(jiff::Unit::Second).unwrap_or(f.at.0);
            match errors && !f.message.is_empty() {
                false => format!("{} at {at}", f.machine),
                true => format!("{} at {at}: {}", f.machine, f.message),
            }
        })
        .collect();
    format!(
        "Automatic renewals stopped: {} automatic renewal(s) failed within {} {whose} ({}). Manual requests still work. Once the cause is fixed, resume with `kubectl ck8s-certs resume -n {namespace} {name}`",
        limit.failures,
        jiff::fmt::friendly::SpanPrinter::new().duration_to_string(&limit.period),
        failures.join("; "),
    )
}

#[cfg(test)]
mod tests;
