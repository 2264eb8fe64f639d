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
use std::sync::Arc;

use ck8s_certs_api::machine_certificates::{MachineCertificatesStatus, Phase};
use ck8s_certs_api::renewal_policy::{
    CertificateRenewalPolicySpec, DEFAULT_CANARY_MAX_WAIT, InPlaceImpossibleAction, MAX_WINDOWS,
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::core::{Selector, SelectorExt};

use super::backoff::{Backoff, Failures};
pub use super::decision::SelectorError;
use super::decision::{Checked, Input, InvalidPolicy, Mode, PolicyError};
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
    /// `inPlaceImpossible: {action: Replace}`: the share of a MachineDeployment that may be
    /// being deleted at once; `None`: such workers are only reported.
    pub replace: Option<MaxUnavailable>,
    /// `canary`: the canary clusters, and how long the others wait for them.
    pub canary: Option<ValidCanary>,
    valid_windows: Arc<[ValidWindow]>,
}

/// A checked `canary`.
#[derive(Debug, Clone)]
pub struct ValidCanary {
    /// `canary.clusterSelector`, over the labels of a Machine's Cluster.
    pub clusters: Selector,
    /// `canary.maxWait`.
    pub max_wait: jiff::SignedDuration,
}

impl ValidPolicy {
    /// Whether a Machine whose Cluster has `cluster_labels` (`None`: not known) is a canary.
    pub fn is_canary(&self, cluster_labels: Option<&BTreeMap<String, String>>) -> bool {
        self.canary.as_ref().is_some_and(|canary| {
            cluster_labels.is_some_and(|labels| canary.clusters.matches(labels))
        })
    }
}

/// How many Machines of one MachineDeployment may be being deleted at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxUnavailable {
    Count(u32),
    /// Of the MachineDeployment's Machines, rounded down.
    Percent(u32),
}

impl Default for MaxUnavailable {
    fn default() -> Self {
        Self::Count(1)
    }
}

impl MaxUnavailable {
    /// `value` as the policy states it (`1`, `"25%"`), `None` when it is neither.
    pub fn parse(value: &IntOrString) -> Option<Self> {
        match value {
            IntOrString::Int(count) => u32::try_from(*count).ok().map(Self::Count),
            IntOrString::String(text) => {
                let percent = text.strip_suffix('%')?.parse::<u32>().ok()?;
                (percent <= 100).then_some(Self::Percent(percent))
            }
        }
    }

    /// The Machines that may be being deleted at once in a MachineDeployment of `machines`.
    pub fn of(self, machines: usize) -> usize {
        match self {
            Self::Count(count) => usize::try_from(count).unwrap_or(usize::MAX),
            Self::Percent(percent) => {
                machines.saturating_mul(usize::try_from(percent).unwrap_or(0)) / 100
            }
        }
    }
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
            checked: Some(Checked(self.valid_windows.clone())),
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
        replace: None,
        canary: None,
        valid_windows: Arc::from([]),
    };
    if let Some(canary) = &spec.canary {
        match compile_selector("canary.clusterSelector", &canary.cluster_selector) {
            Ok(clusters) => {
                policy.canary = Some(ValidCanary {
                    clusters,
                    max_wait: canary
                        .max_wait
                        .unwrap_or(DEFAULT_CANARY_MAX_WAIT)
                        .as_duration(),
                });
            }
            Err(problems) => errors.extend(problems.into_iter().map(PolicyError::Selector)),
        }
    }
    if let Some(impossible) = &spec.in_place_impossible
        && impossible.action == InPlaceImpossibleAction::Replace
    {
        match &impossible.max_unavailable {
            None => policy.replace = Some(MaxUnavailable::default()),
            Some(value) => match MaxUnavailable::parse(value) {
                Some(max) => policy.replace = Some(max),
                None => errors.push(PolicyError::MaxUnavailable(match value {
                    IntOrString::Int(count) => count.to_string(),
                    IntOrString::String(text) => text.clone(),
                })),
            },
        }
    }
    // Windows, Scheduled without windows, renewBefore against ttl, the spread's bound: the
    // decision's own checks.
    match policy
        .input(None, Failures::default(), Settings::default())
        .validate()
    {
        Ok(windows) => policy.valid_windows = windows.into(),
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

/// Checks a selector as the API server's `ValidateLabelSelector` does, then compiles it;
/// `field` names it in the errors.
pub fn compile_selector(
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
mod tests;
