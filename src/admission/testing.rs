//! What the admission tests share: the AdmissionReview the API server sends.

use serde_json::{Value, json};

/// The review of `operation` by `user` on `object` (`old`: its stored version, or null), of
/// `kind` (group, version, kind) served as `resource`, in namespace `fleet`.
pub fn review(
    kind: [&str; 3],
    resource: &str,
    operation: &str,
    user: Value,
    object: Value,
    old: Value,
) -> Value {
    let [group, version, kind] = kind;
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "req-1",
            "kind": { "group": group, "version": version, "kind": kind },
            "resource": { "group": group, "version": version, "resource": resource },
            "name": object["metadata"]["name"],
            "namespace": "fleet",
            "operation": operation,
            "userInfo": user,
            "object": object,
            "oldObject": old,
            "dryRun": false,
            "options": null
        }
    })
}

/// The review of `operation` by alice on CertificateRenewalPolicy `name` of `namespace` with
/// `spec` (`old`: the stored spec, if any).
pub fn policy_review(
    operation: &str,
    name: &str,
    namespace: &str,
    spec: Value,
    old: Option<Value>,
) -> Value {
    let policy = |spec: Value| {
        json!({
            "apiVersion": "certificates.ck8s.io/v1alpha1",
            "kind": "CertificateRenewalPolicy",
            "metadata": { "name": name, "namespace": namespace },
            "spec": spec,
        })
    };
    let mut review = review(
        [
            "certificates.ck8s.io",
            "v1alpha1",
            "CertificateRenewalPolicy",
        ],
        "certificaterenewalpolicies",
        operation,
        json!({ "username": "alice" }),
        policy(spec),
        old.map_or(Value::Null, policy),
    );
    review["request"]["namespace"] = json!(namespace);
    review
}
