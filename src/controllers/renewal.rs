//! Which CertificateRenewalPolicy governs a Machine. Policies are read from the watch cache (those
//! of the Machine's namespace, decoded one by one, so one unreadable object cannot hide the
//! others); the decision itself is `crate::policy::decide`.

use std::collections::BTreeMap;

use ck8s_certs_api::machine_certificates::{MachineCertificatesStatus, RenewalStatus};
use ck8s_certs_api::reasons::conditions;
use ck8s_certs_api::renewal_policy::CertificateRenewalPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::reflector::Store;

use super::patches::set_condition;
use crate::policy::spec::{self, ValidPolicy};

/// The policies that select a Machine.
pub enum Governing {
    /// No policy: manual refreshes only.
    None,
    /// One policy, usable or not (its error message).
    One {
        name: String,
        policy: Result<Box<ValidPolicy>, String>,
    },
    /// Several policies select the Machine: a configuration error, never a silent pick.
    Conflict(Vec<String>),
}

pub fn governing(
    policies: &Store<DynamicObject>,
    namespace: &str,
    cluster_labels: Option<&BTreeMap<String, String>>,
    machine_labels: &BTreeMap<String, String>,
) -> Governing {
    let mut in_namespace: Vec<_> = policies
        .state()
        .into_iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
        .collect();
    // Deterministic conflict messages.
    in_namespace.sort_by_key(|p| p.name_any());
    let mut matched = Vec::new();
    for object in in_namespace {
        let name = object.name_any();
        let policy: CertificateRenewalPolicy = match serde_json::to_value(object.as_ref())
            .and_then(serde_json::from_value)
        {
            Ok(policy) => policy,
            Err(err) => {
                // Unreadable (e.g. a duration the schema let through but the grammar rejects):
                // its selectors are unknown, so it governs nothing; say so in the log.
                tracing::warn!(policy = %name, error = %err, "Ignoring an unreadable CertificateRenewalPolicy");
                continue;
            }
        };
        let selects =
            spec::selector(&policy.spec).is_ok_and(|s| s.matches(cluster_labels, machine_labels));
        if selects {
            let checked = spec::validate(&policy.spec)
                .map(Box::new)
                .map_err(|invalid| invalid.to_string());
            matched.push((name, checked));
        }
    }
    match matched.len() {
        0 => Governing::None,
        1 => {
            let (name, policy) = matched.remove(0);
            Governing::One { name, policy }
        }
        _ => Governing::Conflict(matched.into_iter().map(|(name, _)| name).collect()),
    }
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

    /// One verdict summary and its condition.
    pub fn new(
        policy: &str,
        reason: &str,
        next: Option<jiff::Timestamp>,
        message: String,
        condition: &'static str,
    ) -> Self {
        Self {
            renewal: Some(RenewalStatus {
                policy: policy.to_owned(),
                reason: reason.to_owned(),
                next_renewal_time: next.map(Time),
                message: message.clone(),
            }),
            conditions: vec![(condition, reason.to_owned(), message)],
        }
    }

    /// Adds a condition (e.g. `WindowsIgnored` next to a deferral).
    pub fn with(mut self, condition: &'static str, reason: &str, message: String) -> Self {
        self.conditions
            .push((condition, reason.to_owned(), message));
        self
    }
}

/// Renewal conditions: only the current verdict's are shown.
pub const RENEWAL_CONDITIONS: [&str; 5] = [
    conditions::RENEWAL_DEFERRED,
    conditions::RENEWAL_DISABLED,
    conditions::RENEWAL_CONFIG_INVALID,
    conditions::RENEWAL_WINDOW_BYPASSED,
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
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(second).unwrap()
    }

    fn deferred_with_windows_ignored() -> Verdict {
        Verdict::new(
            "auto",
            "NotDue",
            Some(at(5_000)),
            "Renewal is not due".into(),
            conditions::RENEWAL_DEFERRED,
        )
        .with(
            conditions::WINDOWS_IGNORED,
            "Automatic",
            "windows are ignored".into(),
        )
    }

    #[test]
    fn an_unchanged_verdict_gives_an_equal_status_for_every_shape() {
        let verdicts = [
            Verdict::none(),
            deferred_with_windows_ignored(),
            Verdict::new(
                "off",
                "Disabled",
                None,
                "disabled".into(),
                conditions::RENEWAL_DISABLED,
            ),
            Verdict::new(
                "a,b",
                "ConfigInvalid",
                None,
                "conflict".into(),
                conditions::RENEWAL_CONFIG_INVALID,
            ),
        ];
        for verdict in verdicts {
            let first = with_verdict(&MachineCertificatesStatus::default(), &verdict, at(100));
            let again = with_verdict(&first, &verdict, at(200));
            assert_eq!(first, again, "{verdict:?}");
        }
    }

    #[test]
    fn a_new_verdict_replaces_the_old_conditions_and_keeps_other_ones() {
        let mut status = MachineCertificatesStatus::default();
        set_condition(
            &mut status,
            conditions::READY,
            true,
            "R",
            "ready".into(),
            at(1),
        );
        let deferred = with_verdict(&status, &deferred_with_windows_ignored(), at(100));
        assert_eq!(deferred.conditions.len(), 3);
        let disabled = with_verdict(
            &deferred,
            &Verdict::new(
                "off",
                "Disabled",
                None,
                "disabled".into(),
                conditions::RENEWAL_DISABLED,
            ),
            at(200),
        );
        let types: Vec<&str> = disabled
            .conditions
            .iter()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(types, [conditions::READY, conditions::RENEWAL_DISABLED]);
        assert_eq!(disabled.conditions[0].last_transition_time, Time(at(1)));
        assert_eq!(disabled.conditions[1].last_transition_time, Time(at(200)));
        let cleared = with_verdict(&disabled, &Verdict::none(), at(300));
        assert_eq!(cleared.renewal, None);
        assert_eq!(cleared.conditions.len(), 1);
    }

    #[test]
    fn a_deferral_whose_reason_changes_keeps_its_transition_time() {
        let first = with_verdict(
            &MachineCertificatesStatus::default(),
            &deferred_with_windows_ignored(),
            at(100),
        );
        let backoff = Verdict::new(
            "auto",
            "Backoff",
            Some(at(9_000)),
            "backing off".into(),
            conditions::RENEWAL_DEFERRED,
        );
        let second = with_verdict(&first, &backoff, at(200));
        let deferred = second
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::RENEWAL_DEFERRED)
            .unwrap();
        assert_eq!(
            (deferred.reason.as_str(), &deferred.last_transition_time),
            ("Backoff", &Time(at(100)))
        );
        assert!(
            second
                .conditions
                .iter()
                .all(|c| c.type_ != conditions::WINDOWS_IGNORED)
        );
    }
}
