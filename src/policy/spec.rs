//! From a `CertificateRenewalPolicy` spec to what the decision takes: the one check of a policy.
//!
//! ```text
//! CertificateRenewalPolicySpec ──validate──► ValidPolicy ──input(expiry, failures, settings)──► Input
//!                                  │          ├ selector.matches(cluster labels, machine labels)
//!                                  │          └ upcoming_starts(after, n)
//!                                  └──► InvalidPolicy { errors with field paths }
//! ```
//!
//! [`validate`] serves the policy controller (its `Valid` condition), the Machine controller (a
//! Machine under an invalid policy is `RenewalConfigInvalid`, with the same message) and the
//! offline `policy preview`. It re-checks the rules the CRD schema already enforces (a selector
//! is set, `Scheduled` has windows, `start != end`, at most `MAX_WINDOWS` windows): the preview
//! reads files no API server has seen, and objects may predate a schema rule. It adds what only
//! code can check: time zones against the bundled database, `renewBefore` shorter than `ttl`,
//! `spread` at most 7d, and label selectors as the API server would validate them (operators,
//! values, key and value syntax), since the CRD schema takes `LabelSelector` as plain strings.
//!
//! Not checked here: whether `ttl` fits a worker (a CSR's `expirationSeconds` is an int32 of at
//! least 600 s); that depends on the Machine, see [`Ttl::check_worker`].

use std::collections::BTreeMap;
use std::fmt;

use ck8s_certs_api::machine_certificates::{MachineCertificatesStatus, Phase};
use ck8s_certs_api::renewal_policy::{CertificateRenewalPolicySpec, MAX_WINDOWS};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};

use super::backoff::{Backoff, Failures};
use super::decision::{Input, InvalidPolicy, Mode, PolicyError};
use super::duration::{FailSafeMargin, PolicyDuration, Spread, Ttl};
use super::window::{ValidWindow, Window, WindowStart, upcoming_starts};

/// Controller-wide settings the decision takes besides the policy (command-line flags).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settings {
    /// `--renewal-window-strict`: never bypass the windows.
    pub strict: bool,
    pub backoff: Backoff,
}

/// A checked policy: the policy half of an [`Input`], and which Machines it governs.
#[derive(Debug, Clone)]
pub struct ValidPolicy {
    pub selector: MachineSelector,
    pub mode: Mode,
    /// As set; `None` with neither it nor the percentage set means the default (30d).
    pub renew_before: Option<PolicyDuration>,
    pub renew_before_percentage: Option<i32>,
    pub ttl: Ttl,
    pub windows: Vec<Window>,
    pub fail_safe_margin: FailSafeMargin,
    pub spread: Spread,
    valid_windows: Vec<ValidWindow>,
}

impl ValidPolicy {
    /// The decision's input for one Machine: its certificates' expiry (if known) and its
    /// automatic-renewal failure history. The lifetime start is not known here: add it with
    /// [`Input::with_lifetime_start`] and [`lifetime_start`] for `renewBeforePercentage`
    /// (without it, the policy's `ttl` stands for the lifetime). Nor is the Machine: add its
    /// UID with [`Input::with_stagger_key`] for its place in the `spread` (without it, no
    /// staggering).
    pub fn input(
        &self,
        expiry: Option<Timestamp>,
        failures: Failures,
        settings: Settings,
    ) -> Input {
        Input {
            expiry,
            mode: self.mode,
            renew_before: self.renew_before,
            renew_before_percentage: self.renew_before_percentage,
            lifetime_start: None,
            ttl: Some(self.ttl),
            windows: self.windows.clone(),
            fail_safe_margin: Some(self.fail_safe_margin),
            strict: settings.strict,
            failures,
            backoff: settings.backoff,
            spread: Some(self.spread),
            stagger: None,
        }
    }

    /// `Automatic` with windows: they do not apply (the `WindowsIgnored` condition).
    pub fn windows_ignored(&self) -> bool {
        self.mode == Mode::Automatic && !self.windows.is_empty()
    }

    /// The next `count` window openings strictly after `after`, earliest first, each in its
    /// window's zone (for messages and the preview). Empty without windows.
    pub fn upcoming_starts(&self, after: Timestamp, count: usize) -> Vec<WindowStart> {
        upcoming_starts(&self.valid_windows, after, count)
    }
}

/// Checks a policy spec; every problem is reported, in field order, with its path.
pub fn validate(spec: &CertificateRenewalPolicySpec) -> Result<ValidPolicy, InvalidPolicy> {
    let mut errors = Vec::new();
    if spec.cluster_selector.is_none() && spec.machine_selector.is_none() {
        errors.push(PolicyError::NoSelector);
    }
    let mut compile = |field: &'static str, selector: &Option<LabelSelector>| {
        let selector = selector.as_ref()?;
        compile_selector(field, selector)
            .map_err(|problems| errors.extend(problems.into_iter().map(PolicyError::Selector)))
            .ok()
    };
    let selector = MachineSelector {
        cluster: compile("clusterSelector", &spec.cluster_selector),
        machine: compile("machineSelector", &spec.machine_selector),
    };
    if spec.windows.len() > MAX_WINDOWS {
        errors.push(PolicyError::TooManyWindows {
            count: spec.windows.len(),
            max: MAX_WINDOWS,
        });
    }
    let mut policy = ValidPolicy {
        selector,
        mode: spec.policy,
        renew_before: spec.renew_before,
        renew_before_percentage: spec.renew_before_percentage,
        ttl: spec.ttl,
        windows: spec.windows.clone(),
        fail_safe_margin: spec.fail_safe_margin,
        spread: spec.spread,
        valid_windows: Vec::new(),
    };
    // Windows, Scheduled without windows, renewBefore against ttl, the spread's bound: the
    // decision's own checks.
    match policy
        .input(None, Failures::default(), Settings::default())
        .validate()
    {
        Ok(windows) => policy.valid_windows = windows,
        Err(problems) => errors.extend(problems),
    }
    if errors.is_empty() {
        Ok(policy)
    } else {
        Err(InvalidPolicy { errors })
    }
}

/// When the lifetime of a Machine's current certificates began, as far as its status tells:
/// the start of the refresh that issued them, that is the last operation if it succeeded and
/// reported the expiry the status holds. The start is taken rather than the end because the
/// node signs during the operation: the lifetime comes out at most the operation's length too
/// long, which makes a percentage due slightly early, never late.
///
/// `None` for certificates no recorded refresh issued (those of the node's bootstrap, or an
/// expiry read from k8sd since): then the policy's `ttl` stands for the lifetime
/// ([`Input::lifetime`]).
pub fn lifetime_start(status: &MachineCertificatesStatus) -> Option<Timestamp> {
    let operation = status.operation.as_ref()?;
    let expiry = status.expiry.as_ref()?;
    (operation.phase == Phase::Succeeded && operation.new_expiry.as_ref() == Some(expiry))
        .then_some(operation.started_at.0)
}

/// The selectors of a policy alone, so that even an otherwise invalid policy can say which
/// Machines it was meant for (they then show its configuration error).
pub fn selector(
    spec: &CertificateRenewalPolicySpec,
) -> Result<MachineSelector, Vec<SelectorError>> {
    selector_of(&spec.cluster_selector, &spec.machine_selector)
}

/// [`selector`] from the two fields alone (of a policy that cannot be decoded as a whole).
pub fn selector_of(
    cluster_selector: &Option<LabelSelector>,
    machine_selector: &Option<LabelSelector>,
) -> Result<MachineSelector, Vec<SelectorError>> {
    let mut errors = Vec::new();
    let mut compile = |field: &'static str, selector: &Option<LabelSelector>| {
        let selector = selector.as_ref()?;
        compile_selector(field, selector)
            .map_err(|problems| errors.extend(problems))
            .ok()
    };
    let selector = MachineSelector {
        cluster: compile("clusterSelector", cluster_selector),
        machine: compile("machineSelector", machine_selector),
    };
    if errors.is_empty() {
        Ok(selector)
    } else {
        Err(errors)
    }
}

/// Which Machines of the policy's namespace a policy governs: those whose Cluster matches
/// `clusterSelector` (if set) and which match `machineSelector` (if set).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineSelector {
    cluster: Option<Selector>,
    machine: Option<Selector>,
}

impl MachineSelector {
    /// `clusterSelector`, for listing or watching Clusters.
    pub fn cluster(&self) -> Option<&Selector> {
        self.cluster.as_ref()
    }

    /// `machineSelector`, for listing or watching Machines.
    pub fn machine(&self) -> Option<&Selector> {
        self.machine.as_ref()
    }

    /// Whether a Machine is governed. `cluster_labels` are the labels of the Machine's Cluster,
    /// `None` when that Cluster is not known (then a `clusterSelector` cannot match).
    pub fn matches(
        &self,
        cluster_labels: Option<&BTreeMap<String, String>>,
        machine_labels: &BTreeMap<String, String>,
    ) -> bool {
        let cluster = match &self.cluster {
            None => true,
            Some(selector) => cluster_labels.is_some_and(|labels| selector.matches(labels)),
        };
        cluster
            && self
                .machine
                .as_ref()
                .is_none_or(|selector| selector.matches(machine_labels))
    }
}

impl fmt::Display for MachineSelector {
    /// `Machines whose Cluster matches "env=prod" and that match "tier in (a,b)"`, or
    /// `every Machine` when the selectors that are set are empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let clause = |selector: &Option<Selector>| {
            selector
                .as_ref()
                .filter(|selector| !selector.selects_all())
                .map(|selector| format!("{:?}", selector.to_string()))
        };
        match (clause(&self.cluster), clause(&self.machine)) {
            _ if self.cluster.is_none() && self.machine.is_none() => f.write_str("no Machine"),
            (None, None) => f.write_str("every Machine"),
            (Some(cluster), None) => write!(f, "Machines whose Cluster matches {cluster}"),
            (None, Some(machine)) => write!(f, "Machines that match {machine}"),
            (Some(cluster), Some(machine)) => write!(
                f,
                "Machines whose Cluster matches {cluster} and that match {machine}"
            ),
        }
    }
}

/// A label selector the API server would reject, with its field path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct SelectorError {
    /// Such as `machineSelector.matchExpressions[0].operator`.
    pub path: String,
    pub problem: String,
}

/// Checks a selector as the API server's `ValidateLabelSelector` does, then compiles it.
fn compile_selector(
    field: &'static str,
    selector: &LabelSelector,
) -> Result<Selector, Vec<SelectorError>> {
    let mut errors = Vec::new();
    let mut problem = |path: String, problem: String| errors.push(SelectorError { path, problem });
    for (key, value) in selector.match_labels.iter().flatten() {
        let path = format!("{field}.matchLabels");
        if let Err(why) = check_label_key(key) {
            problem(path.clone(), format!("key {key:?} {why}"));
        }
        if let Err(why) = check_label_value(value) {
            problem(path, format!("value {value:?} of {key:?} {why}"));
        }
    }
    for (index, requirement) in selector.match_expressions.iter().flatten().enumerate() {
        let path = format!("{field}.matchExpressions[{index}]");
        if let Err(why) = check_label_key(&requirement.key) {
            problem(
                format!("{path}.key"),
                format!("{:?} {why}", requirement.key),
            );
        }
        let values = requirement.values.as_deref().unwrap_or_default();
        match requirement.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => problem(
                format!("{path}.values"),
                format!(
                    "must be non-empty when the operator is {}",
                    requirement.operator
                ),
            ),
            "Exists" | "DoesNotExist" if !values.is_empty() => problem(
                format!("{path}.values"),
                format!(
                    "must be empty when the operator is {}",
                    requirement.operator
                ),
            ),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => problem(
                format!("{path}.operator"),
                format!("{other:?} is not an operator: use In, NotIn, Exists or DoesNotExist"),
            ),
        }
        for (i, value) in values.iter().enumerate() {
            if let Err(why) = check_label_value(value) {
                problem(format!("{path}.values[{i}]"), format!("{value:?} {why}"));
            }
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    // Cannot fail after the checks above; reported rather than assumed.
    Selector::try_from(selector.clone()).map_err(|error| {
        vec![SelectorError {
            path: field.to_owned(),
            problem: error.to_string(),
        }]
    })
}

/// The name part of a label key, and a label value when not empty: at most 63 characters,
/// alphanumeric at both ends, `-`, `_`, `.` inside.
fn is_label_name(text: &str) -> bool {
    let bytes = text.as_bytes();
    let inner = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    matches!(
        (bytes.first(), bytes.last()),
        (Some(first), Some(last)) if first.is_ascii_alphanumeric() && last.is_ascii_alphanumeric()
    ) && bytes.len() <= 63
        && bytes.iter().all(inner)
}

/// A DNS subdomain (RFC 1123), the optional prefix of a label key: at most 253 characters,
/// dot-separated lower-case alphanumeric labels with `-` inside.
fn is_dns_subdomain(text: &str) -> bool {
    text.len() <= 253
        && text.split('.').all(|label| {
            let bytes = label.as_bytes();
            matches!(
                (bytes.first(), bytes.last()),
                (Some(first), Some(last)) if is_lower_alnum(*first) && is_lower_alnum(*last)
            ) && bytes.iter().all(|&b| is_lower_alnum(b) || b == b'-')
        })
}

fn is_lower_alnum(byte: u8) -> bool {
    byte.is_ascii_lowercase() || byte.is_ascii_digit()
}

fn check_label_key(key: &str) -> Result<(), &'static str> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if prefix.is_some_and(|prefix| !is_dns_subdomain(prefix)) {
        return Err(
            "is not a valid label key: its prefix must be a DNS subdomain (such as example.com)",
        );
    }
    if !is_label_name(name) {
        return Err(
            "is not a valid label key: the name must be 1 to 63 characters, alphanumeric at both ends, with -, _ or . inside",
        );
    }
    Ok(())
}

fn check_label_value(value: &str) -> Result<(), &'static str> {
    if value.is_empty() || is_label_name(value) {
        Ok(())
    } else {
        Err(
            "is not a valid label value: at most 63 characters, alphanumeric at both ends, with -, _ or . inside",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::utc;
    use crate::policy::{Decision, DeferReason, decide, requeue_at};
    use ck8s_certs_api::renewal_policy::{DEFAULT_FAIL_SAFE_MARGIN, DEFAULT_RENEW_BEFORE};
    use jiff::SignedDuration;
    use serde_json::json;

    fn spec(value: serde_json::Value) -> CertificateRenewalPolicySpec {
        serde_json::from_value(value).unwrap()
    }

    fn messages(value: serde_json::Value) -> Vec<String> {
        validate(&spec(value))
            .unwrap_err()
            .errors
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_valid_spec_becomes_the_policy_half_of_an_input() {
        let policy = validate(&spec(json!({
            "clusterSelector": {"matchLabels": {"env": "prod"}},
            "policy": "Scheduled",
            "renewBefore": "14d",
            "ttl": "6mo",
            "windows": [{"daysOfWeek": ["Sunday"], "start": "22:00", "end": "02:00", "timezone": "Europe/London"}],
            "failSafeMargin": "2d",
        })))
        .unwrap();
        let failures = Failures {
            count: Some(2),
            last_failure: Some(utc("2026-11-01T00:00:00Z")),
        };
        let settings = Settings {
            strict: true,
            backoff: Backoff::default(),
        };
        let input = policy.input(Some(utc("2026-12-20T00:00:00Z")), failures, settings);
        assert_eq!(input.mode, Mode::Scheduled);
        assert_eq!(input.renew_before().to_string(), "2w");
        assert_eq!(input.ttl.map(|ttl| ttl.to_string()), Some("6mo".into()));
        assert_eq!(input.fail_safe_margin().to_string(), "2d");
        assert_eq!(input.windows, policy.windows);
        assert_eq!(input.failures, failures);
        assert!(input.strict);
        assert!(!policy.windows_ignored());
        // 2026-11-22 is a Sunday: the first opening after Saturday noon.
        let starts = policy.upcoming_starts(utc("2026-11-21T12:00:00Z"), 2);
        let starts: Vec<String> = starts.iter().map(ToString::to_string).collect();
        assert_eq!(
            starts,
            [
                "2026-11-22 22:00 Europe/London (2026-11-22T22:00:00Z)",
                "2026-11-29 22:00 Europe/London (2026-11-29T22:00:00Z)",
            ]
        );
    }

    #[test]
    fn omitted_durations_are_the_defaults() {
        let policy =
            validate(&spec(json!({"machineSelector": {}, "policy": "Automatic"}))).unwrap();
        assert_eq!(policy.renew_before, None);
        assert_eq!(policy.renew_before_percentage, None);
        let input = policy.input(None, Failures::default(), Settings::default());
        assert_eq!(input.renew_before(), DEFAULT_RENEW_BEFORE);
        assert_eq!(
            input.due_at(utc("2026-12-20T00:00:00Z")),
            utc("2026-11-20T00:00:00Z")
        );
        assert_eq!(policy.fail_safe_margin, DEFAULT_FAIL_SAFE_MARGIN);
        assert_eq!(policy.ttl.to_string(), "1y");
        assert!(
            policy
                .upcoming_starts(utc("2026-11-21T12:00:00Z"), 5)
                .is_empty()
        );
    }

    #[test]
    fn renew_before_percentage_is_a_share_of_the_lifetime() {
        let policy = validate(&spec(json!({
            "machineSelector": {},
            "policy": "Automatic",
            "renewBeforePercentage": 25,
            "ttl": "100d",
        })))
        .unwrap();
        let expiry = utc("2026-12-20T00:00:00Z");
        let input = policy.input(Some(expiry), Failures::default(), Settings::default());
        // Lifetime start unknown: the policy's ttl (100d) is the lifetime, due 25d before.
        assert_eq!(input.lifetime(expiry), SignedDuration::from_hours(100 * 24));
        assert_eq!(input.due_at(expiry), utc("2026-11-25T00:00:00Z"));
        // Known start: a 40-day lifetime, due 10 days before expiry.
        let known = input
            .clone()
            .with_lifetime_start(Some(utc("2026-11-10T00:00:00Z")));
        assert_eq!(known.due_at(expiry), utc("2026-12-10T00:00:00Z"));
        // Whole seconds, rounded down: 25% of 40d + 4s is 10d + 1s; of 40d + 3s, 10d + 0.75s.
        let four = input
            .clone()
            .with_lifetime_start(Some(utc("2026-11-09T23:59:56Z")));
        assert_eq!(four.due_at(expiry), utc("2026-12-09T23:59:59Z"));
        let three = input
            .clone()
            .with_lifetime_start(Some(utc("2026-11-09T23:59:57Z")));
        assert_eq!(three.due_at(expiry), utc("2026-12-10T00:00:00Z"));
        // A start at or after expiry is not a lifetime: the ttl stands in.
        let nonsense = input.clone().with_lifetime_start(Some(expiry));
        assert_eq!(nonsense.due_at(expiry), utc("2026-11-25T00:00:00Z"));
        // The decision uses it.
        let decision = crate::policy::decide(&known, utc("2026-12-01T00:00:00Z"));
        assert_eq!(requeue_at(&decision), Some(utc("2026-12-10T00:00:00Z")));
        // renewBefore not shorter than ttl is not checked against a percentage's default.
        let short_ttl = spec(json!({
            "machineSelector": {}, "policy": "Automatic", "renewBeforePercentage": 50, "ttl": "7d",
        }));
        assert!(validate(&short_ttl).is_ok());
    }

    #[test]
    fn the_lifetime_starts_with_the_refresh_that_issued_the_certificates() {
        use ck8s_certs_api::machine_certificates::{Operation, Origin};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let expiry = Time(utc("2027-11-20T00:00:30Z"));
        let operation = |phase, new_expiry: Option<&Time>| Operation {
            phase,
            new_expiry: new_expiry.cloned(),
            finished_at: Some(Time(utc("2026-11-20T00:01:00Z"))),
            ..Operation::pending(
                Origin::Policy,
                None,
                None,
                "1y".into(),
                365 * 86_400,
                Time(utc("2026-11-20T00:00:00Z")),
            )
        };
        let status =
            |operation: Option<Operation>, expiry: Option<&Time>| MachineCertificatesStatus {
                operation,
                expiry: expiry.cloned(),
                ..Default::default()
            };
        let issued = status(
            Some(operation(Phase::Succeeded, Some(&expiry))),
            Some(&expiry),
        );
        assert_eq!(lifetime_start(&issued), Some(utc("2026-11-20T00:00:00Z")));
        let other = Time(utc("2030-01-01T00:00:00Z"));
        for (status, why) in [
            (
                status(None, Some(&expiry)),
                "no refresh recorded (bootstrap certificates)",
            ),
            (
                status(Some(operation(Phase::Failed, None)), Some(&expiry)),
                "the last refresh failed",
            ),
            (
                status(Some(operation(Phase::Running, None)), Some(&expiry)),
                "a refresh in flight",
            ),
            (
                status(
                    Some(operation(Phase::Succeeded, Some(&expiry))),
                    Some(&other),
                ),
                "the expiry changed since (read from k8sd)",
            ),
            (
                status(Some(operation(Phase::Succeeded, Some(&expiry))), None),
                "no expiry",
            ),
        ] {
            assert_eq!(lifetime_start(&status), None, "{why}");
        }
    }

    #[test]
    fn automatic_with_windows_ignores_them() {
        let policy = validate(&spec(json!({
            "machineSelector": {},
            "policy": "Automatic",
            "windows": [{"start": "01:00", "end": "02:00"}],
        })))
        .unwrap();
        assert!(policy.windows_ignored());
    }

    #[test]
    fn every_problem_is_reported_with_its_field_path() {
        let rows: &[(serde_json::Value, &[&str])] = &[
            (
                json!({"policy": "Automatic"}),
                &[
                    "clusterSelector, machineSelector: at least one must be set; an empty selector ({}) selects every Cluster or Machine of the namespace",
                ],
            ),
            (
                json!({"clusterSelector": {}, "policy": "Scheduled"}),
                &[
                    "windows: policy Scheduled needs at least one window (use Automatic to renew at any time)",
                ],
            ),
            (
                json!({"clusterSelector": {}, "policy": "Automatic", "renewBefore": "1y", "ttl": "1y"}),
                &[
                    "renewBefore: 1y must be shorter than ttl (1y), or every renewal would be due again at once",
                ],
            ),
            (
                json!({"clusterSelector": {}, "policy": "Automatic", "renewBefore": "10d", "renewBeforePercentage": 20}),
                &[
                    "renewBeforePercentage: set at most one of renewBefore (a duration before expiry) and renewBeforePercentage (a percentage of the certificates' lifetime)",
                ],
            ),
            (
                json!({"clusterSelector": {}, "policy": "Automatic", "renewBeforePercentage": 0}),
                &[
                    "renewBeforePercentage: 0 is out of range: give a percentage of the certificates' lifetime from 1 to 99",
                ],
            ),
            (
                json!({"clusterSelector": {}, "policy": "Automatic", "renewBeforePercentage": 100}),
                &[
                    "renewBeforePercentage: 100 is out of range: give a percentage of the certificates' lifetime from 1 to 99",
                ],
            ),
            (
                json!({"clusterSelector": {}, "policy": "Scheduled", "windows": [
                    {"schedule": "0 0 31 2 *", "duration": "4h"},
                    {"schedule": "0 22 * * 1-5", "start": "22:00", "end": "02:00", "duration": "4h"},
                ]}),
                &[
                    "windows[0].schedule: \"0 0 31 2 *\" never fires: no date has that day of the month in that month (such as February 31st)",
                    "windows[1].schedule: cannot be combined with start, end or daysOfWeek: a window is either start and end (with optional daysOfWeek), or schedule and duration",
                ],
            ),
            // An invalid window makes the policy invalid whatever its mode.
            (
                json!({"clusterSelector": {}, "policy": "Disabled", "windows": [
                    {"start": "01:00", "end": "02:00", "timezone": "europe/london"},
                    {"start": "24:00", "end": "01:00"},
                    {"start": "03:00", "end": "03:00", "timezone": ""},
                ]}),
                &[
                    "windows[0].timezone: \"europe/london\" is not an IANA time zone name: names are case-sensitive, did you mean \"Europe/London\"?",
                    "windows[1].start: 24:00 is only allowed as an end; a window that opens at midnight starts at 00:00",
                    "windows[2].end: must differ from start (03:00): the window would be empty; a whole day is 00:00 to 24:00",
                    "windows[2].timezone: must not be empty: omit it for UTC, or give an IANA name such as Europe/London",
                ],
            ),
            (
                json!({
                    "clusterSelector": {"matchLabels": {"-bad": "ok", "env": "not ok"}},
                    "machineSelector": {"matchExpressions": [
                        {"key": "tier", "operator": "Equals", "values": ["a"]},
                        {"key": "tier", "operator": "In"},
                        {"key": "Example.com/tier", "operator": "Exists", "values": ["a"]},
                        {"key": "example.com/tier", "operator": "NotIn", "values": ["ok", "a b"]},
                    ]},
                    "policy": "Automatic",
                }),
                &[
                    "clusterSelector.matchLabels: key \"-bad\" is not a valid label key: the name must be 1 to 63 characters, alphanumeric at both ends, with -, _ or . inside",
                    "clusterSelector.matchLabels: value \"not ok\" of \"env\" is not a valid label value: at most 63 characters, alphanumeric at both ends, with -, _ or . inside",
                    "machineSelector.matchExpressions[0].operator: \"Equals\" is not an operator: use In, NotIn, Exists or DoesNotExist",
                    "machineSelector.matchExpressions[1].values: must be non-empty when the operator is In",
                    "machineSelector.matchExpressions[2].key: \"Example.com/tier\" is not a valid label key: its prefix must be a DNS subdomain (such as example.com)",
                    "machineSelector.matchExpressions[2].values: must be empty when the operator is Exists",
                    "machineSelector.matchExpressions[3].values[1]: \"a b\" is not a valid label value: at most 63 characters, alphanumeric at both ends, with -, _ or . inside",
                ],
            ),
        ];
        for (value, expected) in rows {
            assert_eq!(&messages(value.clone()), expected, "{value}");
        }
        let too_many: Vec<_> = (0..=MAX_WINDOWS)
            .map(|_| json!({"start": "01:00", "end": "02:00"}))
            .collect();
        assert_eq!(
            messages(json!({"clusterSelector": {}, "policy": "Scheduled", "windows": too_many})),
            ["windows: 33 windows, at most 32 are allowed"]
        );
    }

    #[test]
    fn the_message_is_the_same_as_the_decisions() {
        let value = json!({"clusterSelector": {}, "policy": "Scheduled", "renewBefore": "2y"});
        let invalid = validate(&spec(value)).unwrap_err();
        let message = invalid.to_string();
        assert_eq!(
            message,
            "Renewal policy is invalid: windows: policy Scheduled needs at least one window (use Automatic to renew at any time); renewBefore: 2y must be shorter than ttl (1y), or every renewal would be due again at once"
        );
        assert_eq!(Decision::from(invalid).to_string(), message);
    }

    #[test]
    fn the_input_decides_like_the_policy_says() {
        let policy = validate(&spec(json!({
            "clusterSelector": {},
            "policy": "Scheduled",
            "windows": [{"daysOfWeek": ["Tuesday"], "start": "02:00", "end": "04:00", "timezone": "Europe/London"}],
        })))
        .unwrap();
        let input = policy.input(
            Some(utc("2026-12-20T00:00:00Z")),
            Failures::default(),
            Settings::default(),
        );
        // Due on Friday 2026-11-20: the next window is Tuesday 2026-11-24 02:00 GMT.
        match decide(&input, utc("2026-11-20T12:00:00Z")) {
            Decision::Defer(deferral) => {
                assert_eq!(deferral.reason, DeferReason::OutsideWindow);
                assert_eq!(deferral.until, utc("2026-11-24T02:00:00Z"));
            }
            other => panic!("expected a deferral, got {other:?}"),
        }
    }

    #[test]
    fn a_machine_matches_when_both_selectors_that_are_set_match() {
        let prod = labels(&[("env", "prod")]);
        let dev = labels(&[("env", "dev")]);
        let workers = labels(&[("role", "worker")]);
        let none = labels(&[]);
        let selector = |value: serde_json::Value| {
            let mut value = value;
            value["policy"] = json!("Automatic");
            validate(&spec(value)).unwrap().selector
        };
        let by_cluster = selector(json!({"clusterSelector": {"matchLabels": {"env": "prod"}}}));
        let by_machine = selector(json!({"machineSelector": {"matchLabels": {"role": "worker"}}}));
        let both = selector(json!({
            "clusterSelector": {"matchLabels": {"env": "prod"}},
            "machineSelector": {"matchExpressions": [{"key": "role", "operator": "In", "values": ["worker"]}]},
        }));
        let every_cluster = selector(json!({"clusterSelector": {}}));
        let every_machine = selector(json!({"machineSelector": {}}));
        type Row<'a> = (
            &'a MachineSelector,
            Option<&'a BTreeMap<String, String>>,
            &'a BTreeMap<String, String>,
            bool,
        );
        let rows: &[Row] = &[
            (&by_cluster, Some(&prod), &none, true),
            (&by_cluster, Some(&dev), &workers, false),
            // The Cluster is unknown: a cluster selector cannot match.
            (&by_cluster, None, &workers, false),
            (&by_machine, None, &workers, true),
            (&by_machine, Some(&prod), &none, false),
            (&both, Some(&prod), &workers, true),
            (&both, Some(&prod), &none, false),
            (&both, Some(&dev), &workers, false),
            (&every_cluster, Some(&none), &none, true),
            (&every_cluster, None, &none, false),
            (&every_machine, None, &none, true),
        ];
        for (i, (selector, cluster, machine, expected)) in rows.iter().enumerate() {
            assert_eq!(selector.matches(*cluster, machine), *expected, "row {i}");
        }
        assert_eq!(
            both.to_string(),
            "Machines whose Cluster matches \"env=prod\" and that match \"role in (worker)\""
        );
        assert_eq!(
            by_machine.to_string(),
            "Machines that match \"role=worker\""
        );
        assert_eq!(every_cluster.to_string(), "every Machine");
        assert_eq!(
            both.cluster().map(ToString::to_string),
            Some("env=prod".into())
        );
    }

    #[test]
    fn label_syntax_follows_the_api_server() {
        for key in ["a", "app.kubernetes.io/name", "x_y.z-1", &"a".repeat(63)] {
            assert_eq!(check_label_key(key), Ok(()), "{key}");
        }
        for key in [
            "",
            "-a",
            "a-",
            "a/b/c",
            "A.com/x",
            "/x",
            "x/",
            &"a".repeat(64),
        ] {
            assert!(check_label_key(key).is_err(), "{key}");
        }
        for value in ["", "prod", "v1.2_3-a"] {
            assert_eq!(check_label_value(value), Ok(()), "{value}");
        }
        for value in ["-x", "a b", "é", &"a".repeat(64)] {
            assert!(check_label_value(value).is_err(), "{value}");
        }
    }
}
