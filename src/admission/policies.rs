//! The policy webhook: a CertificateRenewalPolicy that cannot keep its promise is refused when
//! it is written (`POST /validate-certificaterenewalpolicy`, the ValidatingWebhookConfiguration
//! in `config/webhook/policies.yaml`), with the message of [`crate::policy::promise`]: which
//! number is wrong and what would work. Validating, not mutating: it judges the policy as it will
//! be stored, after every mutation and default.
//!
//! - Only a create, or an update that changes the spec, is judged: a policy admitted before the
//!   webhook (or while it was down) must stay writable (labels, a fix of another field through
//!   `kubectl edit` that keeps the spec) instead of being frozen by a refusal of what it was.
//!   The policy controller reports such a policy in its `PromiseKept` condition.
//! - An invalid spec is admitted as it is, with the problems as a warning: the schema refused
//!   what it can, and the `Valid` condition reports the rest where the controller reads it.
//! - A policy outside `--namespace`, or without the label of `--watch-filter`, is not ours: it
//!   governs nothing here (docs/sharding.md).
//!
//! The answer is a function of the request, the controller's backoff flags and `now` (the
//! worst case is searched for due times from `now` on).

use ck8s_certs_api::capi::WATCH_FILTER_LABEL;
use ck8s_certs_api::renewal_policy::CertificateRenewalPolicy;
use jiff::Timestamp;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};

use super::Scope;
use crate::policy::promise::{self, Promise};
use crate::policy::spec;

/// What the webhook does with one policy write.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Allowed, with warnings (none for a promise kept in full).
    Allow(Vec<String>),
    /// Refused, with the reason.
    Deny(String),
}

/// The decision for one admission request about a CertificateRenewalPolicy.
pub fn decide(
    request: &AdmissionRequest<DynamicObject>,
    scope: &Scope,
    now: Timestamp,
) -> Decision {
    if !matches!(request.operation, Operation::Create | Operation::Update)
        || request.kind.kind != "CertificateRenewalPolicy"
    {
        return Decision::Allow(Vec::new());
    }
    let Some(object) = request.object.as_ref() else {
        return Decision::Allow(Vec::new());
    };
    let namespace = request.namespace.as_deref().unwrap_or_default();
    let shard = object
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(WATCH_FILTER_LABEL));
    if scope
        .namespace
        .as_ref()
        .is_some_and(|ours| ours != namespace)
        || scope
            .watch_filter
            .as_ref()
            .is_some_and(|ours| Some(ours) != shard)
    {
        return Decision::Allow(Vec::new());
    }
    let spec_of = |object: &DynamicObject| object.data.get("spec").cloned();
    if request.operation == Operation::Update
        && request.old_object.as_ref().and_then(spec_of) == spec_of(object)
    {
        return Decision::Allow(Vec::new());
    }
    let policy: CertificateRenewalPolicy =
        match serde_json::to_value(object).and_then(serde_json::from_value) {
            Ok(policy) => policy,
            // The schema refuses what cannot be read; should it not, the Valid condition says so.
            Err(err) => {
                return Decision::Allow(vec![format!(
                    "The policy cannot be read ({err}): it renews nothing until fixed"
                )]);
            }
        };
    let valid = match spec::validate(&policy.spec) {
        Ok(valid) => valid,
        Err(invalid) => {
            return Decision::Allow(vec![format!(
                "The policy is not valid and renews nothing until fixed: {invalid}"
            )]);
        }
    };
    match promise::check(&valid, scope.backoff, now) {
        Ok(Promise::Kept(kept)) if kept.terms.ttl.as_duration() <= promise::EXPIRING_SOON => {
            Decision::Allow(vec![kept.to_string()])
        }
        Ok(Promise::Kept(_) | Promise::Nothing) => Decision::Allow(Vec::new()),
        Ok(unproven @ Promise::Unproven(_)) => Decision::Allow(vec![unproven.to_string()]),
        Err(broken) => Decision::Deny(format!(
            "CertificateRenewalPolicy {namespace}/{} cannot keep its promise: {broken}",
            request.name
        )),
    }
}

/// The answer to one review: allowed (with any warnings), or denied as invalid with the
/// reason.
pub fn review(
    request: &AdmissionRequest<DynamicObject>,
    scope: &Scope,
    now: Timestamp,
) -> AdmissionResponse {
    let mut response = AdmissionResponse::from(request);
    match decide(request, scope, now) {
        Decision::Allow(warnings) => {
            response.warnings = (!warnings.is_empty()).then_some(warnings);
            response
        }
        Decision::Deny(message) => {
            tracing::info!(
                policy = %format!("{}/{}", request.namespace.as_deref().unwrap_or(""), request.name),
                request = %request.uid,
                user = %request.user_info.username.as_deref().unwrap_or(""),
                reason = %message,
                "Denied a renewal policy that cannot keep its promise"
            );
            super::invalid(response, message)
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::admission::testing;
    use crate::policy::testing::utc;

    const NOW: &str = "2026-11-25T12:00:00Z";

    fn request(operation: &str, namespace: &str, spec: Value) -> AdmissionRequest<DynamicObject> {
        let review = testing::policy_review(operation, "p", namespace, spec, None);
        serde_json::from_value(review["request"].clone()).unwrap()
    }

    fn decided(namespace: &str, spec: Value, scope: &Scope) -> Decision {
        decide(&request("CREATE", namespace, spec), scope, utc(NOW))
    }

    #[test]
    fn what_is_admitted_and_how() {
        let scope = Scope::default();
        let automatic = |fields: Value| {
            let mut spec = json!({ "machineSelector": {}, "policy": "Automatic" });
            for (key, value) in fields.as_object().unwrap() {
                spec[key] = value.clone();
            }
            spec
        };
        assert_eq!(
            decided("fleet", automatic(json!({})), &scope),
            Decision::Allow(vec![])
        );
        // Nothing promised.
        let disabled = json!({ "machineSelector": {}, "policy": "Disabled", "renewBefore": "1h" });
        assert_eq!(decided("fleet", disabled, &scope), Decision::Allow(vec![]));
        // A short lifetime: admitted, and told that the alert is not checked.
        let Decision::Allow(warnings) = decided(
            "fleet",
            automatic(json!({ "ttl": "7d", "renewBefore": "3d" })),
            &scope,
        ) else {
            panic!("refused");
        };
        assert!(
            warnings[0].contains("alert is not checked: with a ttl of 1w (at most 2w)"),
            "{warnings:?}"
        );
        // Invalid: the Valid condition's business; admitted with its problems.
        let Decision::Allow(warnings) = decided(
            "fleet",
            automatic(json!({ "ttl": "1d", "renewBefore": "2d" })),
            &scope,
        ) else {
            panic!("refused");
        };
        assert!(
            warnings[0].starts_with("The policy is not valid and renews nothing until fixed: "),
            "{warnings:?}"
        );
        // Refused, with the number.
        let Decision::Deny(message) =
            decided("fleet", automatic(json!({ "renewBefore": "12h" })), &scope)
        else {
            panic!("admitted");
        };
        assert!(message.starts_with("CertificateRenewalPolicy fleet/p cannot keep its promise: renewBefore 12h leaves 0 attempts"), "{message}");
        // Another namespace than the controller's: not ours.
        let ours = Scope {
            namespace: Some("fleet".into()),
            ..Scope::default()
        };
        assert_eq!(
            decided(
                "elsewhere",
                automatic(json!({ "renewBefore": "12h" })),
                &ours
            ),
            Decision::Allow(vec![])
        );
        // Another shard's, or no shard's under a watch filter: not ours either.
        let shard = Scope {
            watch_filter: Some("a".into()),
            ..Scope::default()
        };
        assert_eq!(
            decided("fleet", automatic(json!({ "renewBefore": "12h" })), &shard),
            Decision::Allow(vec![])
        );
        // A deletion is never judged.
        let deleted = request(
            "DELETE",
            "fleet",
            automatic(json!({ "renewBefore": "12h" })),
        );
        assert_eq!(decide(&deleted, &scope, utc(NOW)), Decision::Allow(vec![]));
    }

    #[test]
    fn a_refusal_is_a_422_with_the_message() {
        let request = request(
            "CREATE",
            "fleet",
            json!({ "machineSelector": {}, "policy": "Automatic", "renewBefore": "12h" }),
        );
        let response = review(&request, &Scope::default(), utc(NOW));
        assert!(!response.allowed);
        assert_eq!(response.result.code, 422);
        assert!(
            response
                .result
                .message
                .contains("renewBefore 12h leaves 0 attempts")
        );
    }
}
