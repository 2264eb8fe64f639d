//! Which CertificateRenewalPolicy governs a Machine, and how its verdict shows in the
//! Machine's status. Policies are read from the watch cache (those of the Machine's namespace,
//! decoded one by one, so one unreadable object cannot hide the others); the decision itself is
//! `crate::policy::decide`.
//!
//! The status contract (`status.renewal`): the governing policy (reference with the generation
//! read, and its mode), whether its windows are valid, the next renewal time and its reason. A
//! Machine at rest under a policy (reason `NotDue`) has no renewal condition: `Ready` and the
//! `Next Renewal` column are its healthy state, and `RenewalDeferred` means a due renewal is
//! being held back. A fail-safe bypass of the windows is kept in `lastWindowBypass` (and the
//! `RenewalWindowBypassed` condition) until a later refresh succeeds.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use ck8s_certs_api::machine_certificates::{
    MachineCertificatesStatus, Operation, PolicyReference, RenewalStatus, WindowsStatus,
};
use ck8s_certs_api::reasons::conditions;
use ck8s_certs_api::renewal_policy::{CertificateRenewalPolicy, MAX_WINDOWS, Mode, Window};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::reflector::Store;
use serde::Deserialize;

use super::patches::set_condition;
use crate::policy::spec::{self, ValidPolicy};

mod canaries;
mod selections;

pub use canaries::{canaries_since, canary_machines};
pub use selections::{Caches, Concerned, PolicySelections, in_namespace as machines_in_namespace};

/// The condition reason of a fail-safe bypass (also its `RenewReason`).
pub const FAIL_SAFE_BYPASS: &str = "FailSafeBypass";

/// A policy as read from the cache, usable or not.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyInfo {
    pub name: String,
    pub generation: Option<i64>,
    /// `None` when the policy cannot be read.
    pub mode: Option<Mode>,
    /// `None` when the policy cannot be read.
    pub windows: Option<WindowsStatus>,
    /// Since when its circuit breaker is open (automatic renewals stopped), as its status says.
    pub halted_since: Option<jiff::Timestamp>,
    /// When its current generation's canaries began, as its status says (`None`: not yet
    /// written, or no canaries).
    pub canaries_since: Option<jiff::Timestamp>,
}

#[cfg(test)]
impl PolicyInfo {
    /// A readable policy `name` of generation 1 with `spec`, its breaker closed and no canaries
    /// started (tests).
    pub fn of_spec(
        name: &str,
        spec: &ck8s_certs_api::renewal_policy::CertificateRenewalPolicySpec,
    ) -> Self {
        Self {
            name: name.to_owned(),
            generation: Some(1),
            mode: Some(spec.policy),
            windows: Some(windows_status(&spec.windows)),
            halted_since: None,
            canaries_since: None,
        }
    }
}

/// The policies that select a Machine.
pub enum Governing {
    /// No policy: manual refreshes only.
    None,
    /// One policy, usable or not (its error message).
    One {
        info: PolicyInfo,
        policy: Result<Arc<ValidPolicy>, String>,
    },
    /// Several policies select the Machine: a configuration error, never a silent pick.
    Conflict(Vec<String>),
}

/// Just the selectors of a policy: an object that cannot be decoded as a whole (say a duration
/// the schema let through but the grammar rejects) still tells which Machines it was meant for,
/// and those show its error instead of silently falling back to manual renewals.
#[derive(Deserialize)]
struct SelectorsOnly {
    spec: Selectors,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Selectors {
    #[serde(default)]
    cluster_selector: Option<LabelSelector>,
    #[serde(default)]
    machine_selector: Option<LabelSelector>,
}

/// The selectors of a policy object that cannot be decoded as a whole, when they can be read.
pub fn readable_selector(raw: &serde_json::Value) -> Option<spec::MachineSelector> {
    let only = SelectorsOnly::deserialize(raw).ok()?;
    let Selectors {
        cluster_selector,
        machine_selector,
    } = only.spec;
    // Without a selector it was meant for nothing (the CRD requires one).
    if cluster_selector.is_none() && machine_selector.is_none() {
        return None;
    }
    spec::selector_of(&cluster_selector, &machine_selector).ok()
}

/// A policy as decoded and checked, once per generation: what [`governing`] needs of it.
#[derive(Debug)]
pub(crate) enum Reading {
    /// Decoded: whom it selects (`None`: its selector is invalid, so it selects nothing here;
    /// its own status says why), its mode and windows, and whether it can be used.
    Decoded {
        selector: Option<spec::MachineSelector>,
        mode: Mode,
        windows: WindowsStatus,
        checked: Result<Arc<ValidPolicy>, String>,
    },
    /// Not decodable as a whole: whom it was meant for, when that can be read, and why not.
    Unreadable {
        selector: Option<spec::MachineSelector>,
        message: String,
    },
}

impl Reading {
    fn of(object: &DynamicObject) -> Option<Self> {
        let raw = match serde_json::to_value(object) {
            Ok(raw) => raw,
            Err(err) => {
                tracing::warn!(policy = %object.name_any(), error = %err, "Ignoring an unreadable CertificateRenewalPolicy");
                return None;
            }
        };
        Some(
            match serde_json::from_value::<CertificateRenewalPolicy>(raw.clone()) {
                Ok(policy) => Self::Decoded {
                    selector: spec::selector(&policy.spec).ok(),
                    mode: policy.spec.policy,
                    windows: windows_status(&policy.spec.windows),
                    checked: spec::validate(&policy.spec)
                        .map(Arc::new)
                        .map_err(|invalid| invalid.to_string()),
                },
                Err(err) => Self::Unreadable {
                    selector: readable_selector(&raw),
                    message: format!("Renewal policy cannot be read: {err}"),
                },
            },
        )
    }

    /// The policy checked, when it is valid.
    pub(crate) fn valid(&self) -> Option<&Arc<ValidPolicy>> {
        match self {
            Self::Decoded {
                checked: Ok(valid), ..
            } => Some(valid),
            _ => None,
        }
    }

    pub(crate) fn selects(
        &self,
        cluster_labels: Option<&BTreeMap<String, String>>,
        machine_labels: &BTreeMap<String, String>,
    ) -> bool {
        let (Self::Decoded { selector, .. } | Self::Unreadable { selector, .. }) = self;
        selector
            .as_ref()
            .is_some_and(|s| s.matches(cluster_labels, machine_labels))
    }
}

/// The policies of the cache, decoded and validated once per generation (a Machine reconcile
/// reads every policy of its namespace; decoding them each time cost a JSON round trip and three
/// window validations per policy per Machine).
#[derive(Default)]
pub struct PolicyReadings(Mutex<HashMap<String, Decoded>>);

/// A policy's reading and the generation it was read at, by UID.
type Decoded = (Option<i64>, Arc<Reading>);

impl PolicyReadings {
    /// The reading of `object`, decoded now only if its generation is new to us.
    pub(crate) fn of(&self, object: &DynamicObject) -> Option<Arc<Reading>> {
        // Borrowed for the lookup: every Machine reconcile asks for each policy of its namespace.
        let key: Cow<'_, str> = match &object.metadata.uid {
            Some(uid) => Cow::Borrowed(uid),
            None => Cow::Owned(format!(
                "{}/{}",
                object.namespace().unwrap_or_default(),
                object.name_any()
            )),
        };
        let generation = object.metadata.generation;
        let mut readings = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((seen, reading)) = readings.get(key.as_ref())
            && *seen == generation
        {
            return Some(reading.clone());
        }
        let reading = Arc::new(Reading::of(object)?);
        readings.insert(key.into_owned(), (generation, reading.clone()));
        Some(reading)
    }

    /// Forgets the readings of policies no longer in `current` (deleted): keys are UIDs.
    fn retain(&self, current: &std::collections::HashSet<String>) {
        let mut readings = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if readings.len() > current.len() {
            readings.retain(|key, _| current.contains(key));
        }
    }

    /// How many policies are held decoded (for tests).
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Since when `policy`'s circuit breaker is open, as its status says (read at each verdict: the
/// status changes without a new generation).
pub fn halted_since(policy: &DynamicObject) -> Option<jiff::Timestamp> {
    policy
        .data
        .pointer("/status/breaker/openedAt")
        .and_then(serde_json::Value::as_str)
        .and_then(|at| at.parse().ok())
}

/// [`spec_changed`], or its circuit breaker opened or closed: what can change a Machine's verdict.
pub fn verdict_input_changed(before: Option<&DynamicObject>, now: &DynamicObject) -> bool {
    spec_changed(before, now) || before.is_some_and(|b| halted_since(b) != halted_since(now))
}

/// Whether a policy's change (as the cache held it before, and now) can change a verdict: a new
/// policy or a new generation of its spec, not a write of its status alone (its own controller's
/// `matchedMachines`).
pub fn spec_changed(before: Option<&DynamicObject>, now: &DynamicObject) -> bool {
    before.is_none_or(|b| b.metadata.generation != now.metadata.generation)
}

pub fn governing(
    policies: &Store<DynamicObject>,
    readings: &PolicyReadings,
    namespace: &str,
    cluster_labels: Option<&BTreeMap<String, String>>,
    machine_labels: &BTreeMap<String, String>,
) -> Governing {
    let all = policies.state();
    if readings.len() > all.len() {
        readings.retain(&all.iter().filter_map(|p| p.metadata.uid.clone()).collect());
    }
    let in_namespace = all
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(namespace));
    let mut matched = Vec::new();
    for object in in_namespace {
        let Some(reading) = readings.of(object) else {
            continue;
        };
        if !reading.selects(cluster_labels, machine_labels) {
            continue;
        }
        let name = object.name_any();
        let generation = object.metadata.generation;
        let halted_since = halted_since(object);
        let canaries_since = canaries_since(object);
        match reading.as_ref() {
            Reading::Decoded {
                mode,
                windows,
                checked,
                ..
            } => {
                let info = PolicyInfo {
                    name,
                    generation,
                    mode: Some(*mode),
                    windows: Some(windows.clone()),
                    halted_since,
                    canaries_since,
                };
                matched.push((info, checked.clone()));
            }
            Reading::Unreadable { message, .. } => {
                let info = PolicyInfo {
                    name,
                    generation,
                    mode: None,
                    windows: None,
                    halted_since,
                    canaries_since,
                };
                matched.push((info, Err(message.clone())));
            }
        }
    }
    // Deterministic conflict messages (sorted once matched: a Machine has one policy or a few).
    matched.sort_by(|(a, _), (b, _)| a.name.cmp(&b.name));
    match matched.len() {
        0 => Governing::None,
        1 => {
            let (info, policy) = matched.remove(0);
            Governing::One { info, policy }
        }
        _ => Governing::Conflict(matched.into_iter().map(|(info, _)| info.name).collect()),
    }
}

/// Whether a policy's windows can be used, with the problems when they cannot.
pub fn windows_status(windows: &[Window]) -> WindowsStatus {
    let count = i32::try_from(windows.len()).unwrap_or(i32::MAX);
    let mut problems = Vec::new();
    if windows.len() > MAX_WINDOWS {
        problems.push(format!(
            "windows: {} windows, at most {MAX_WINDOWS} are allowed",
            windows.len()
        ));
    }
    if let Err(errors) = crate::policy::window::validate_windows(windows) {
        problems.extend(errors.iter().map(ToString::to_string));
    }
    WindowsStatus {
        valid: problems.is_empty(),
        count,
        message: (!problems.is_empty()).then(|| problems.join("; ")),
    }
}

/// `windows[i] (Saturday,Sunday 02:00-06:00 Europe/London)`: how a status names a window.
pub fn describe_window(windows: &[Window], index: usize) -> String {
    let Some(window) = windows.get(index) else {
        return format!("windows[{index}]");
    };
    let zone = window.timezone.as_deref().unwrap_or("UTC");
    let when = match (&window.schedule, &window.duration) {
        (Some(schedule), Some(duration)) => format!("\"{schedule}\" for {duration}"),
        _ => {
            let days = if window.days_of_week.is_empty() {
                "every day".to_owned()
            } else {
                window
                    .days_of_week
                    .iter()
                    .map(|d| format!("{d:?}"))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let time = |t: &Option<_>| t.as_ref().map(ToString::to_string).unwrap_or_default();
            format!("{days} {}-{}", time(&window.start), time(&window.end))
        }
    };
    format!("windows[{index}] ({when} {zone})")
}

/// What a renewal verdict shows in the status: the `renewal` summary and the renewal
/// conditions that should be `True` (every other renewal condition is removed).
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub renewal: Option<RenewalStatus>,
    /// `(type, reason, message)` of each condition to show.
    pub conditions: Vec<(&'static str, String, String)>,
}

impl Verdict {
    /// No policy governs the Machine: nothing to show.
    pub fn none() -> Self {
        Self {
            renewal: None,
            conditions: Vec::new(),
        }
    }

    /// One policy's verdict, with its condition if it has one (a Machine at rest has none).
    pub fn new(
        policy: &PolicyInfo,
        reason: &str,
        next: Option<jiff::Timestamp>,
        message: String,
        condition: Option<&'static str>,
    ) -> Self {
        Self {
            renewal: Some(RenewalStatus {
                policy_ref: Some(PolicyReference {
                    name: policy.name.clone(),
                    observed_generation: policy.generation,
                }),
                policy: policy.mode.map(|m| m.as_str().to_owned()),
                conflicting_policies: Vec::new(),
                windows: policy.windows.clone(),
                reason: reason.to_owned(),
                next_renewal_time: next.map(Time),
                message: message.clone(),
            }),
            conditions: condition
                .map(|c| (c, reason.to_owned(), message))
                .into_iter()
                .collect(),
        }
    }

    /// Several policies select the Machine.
    pub fn conflict(names: Vec<String>, message: String) -> Self {
        Self {
            renewal: Some(RenewalStatus {
                conflicting_policies: names,
                reason: CONFIG_INVALID.to_owned(),
                message: message.clone(),
                ..Default::default()
            }),
            conditions: vec![(
                conditions::RENEWAL_CONFIG_INVALID,
                CONFIG_INVALID.to_owned(),
                message,
            )],
        }
    }

    /// Adds a condition (e.g. `WindowsIgnored` next to a deferral).
    pub fn with(mut self, condition: &'static str, reason: &str, message: String) -> Self {
        self.conditions
            .push((condition, reason.to_owned(), message));
        self
    }
}

/// The reason of a verdict that cannot be applied.
pub const CONFIG_INVALID: &str = "ConfigInvalid";

/// Renewal conditions that show the current verdict only. `RenewalWindowBypassed` is not one of
/// them: it lasts as long as `lastWindowBypass` ([`show_window_bypass`]).
pub const RENEWAL_CONDITIONS: [&str; 5] = [
    conditions::RENEWAL_DEFERRED,
    conditions::RENEWAL_OVERDUE,
    conditions::RENEWAL_DISABLED,
    conditions::RENEWAL_CONFIG_INVALID,
    conditions::WINDOWS_IGNORED,
];

/// The status showing `verdict`, computed from `current` as a whole so that an unchanged verdict
/// gives back an equal status (and so no write): conditions that stay keep their place and their
/// `lastTransitionTime`, stale renewal conditions go.
pub fn with_verdict(
    current: &MachineCertificatesStatus,
    verdict: &Verdict,
    now: jiff::Timestamp,
) -> MachineCertificatesStatus {
    let mut status = current.clone();
    status.renewal = verdict.renewal.clone();
    status.conditions.retain(|c| {
        !RENEWAL_CONDITIONS.contains(&c.type_.as_str())
            || verdict.conditions.iter().any(|(t, _, _)| *t == c.type_)
    });
    for (type_, reason, message) in &verdict.conditions {
        set_condition(&mut status, type_, true, reason, message.clone(), now);
    }
    show_window_bypass(&mut status, now);
    status
}

/// Forgets a fail-safe bypass once another refresh (not the bypassing one) has succeeded.
pub fn forget_window_bypass(status: &mut MachineCertificatesStatus, succeeded: &Operation) {
    if !succeeded.bypassed_windows {
        status.last_window_bypass = None;
    }
}

/// `RenewalWindowBypassed` is True exactly while `lastWindowBypass` is set.
pub fn show_window_bypass(status: &mut MachineCertificatesStatus, now: jiff::Timestamp) {
    match status
        .last_window_bypass
        .as_ref()
        .map(|b| b.message.clone())
    {
        Some(message) => set_condition(
            status,
            conditions::RENEWAL_WINDOW_BYPASSED,
            true,
            FAIL_SAFE_BYPASS,
            message,
            now,
        ),
        None => status
            .conditions
            .retain(|c| c.type_ != conditions::RENEWAL_WINDOW_BYPASSED),
    }
}

#[cfg(test)]
mod tests;
