//! Who asked for a refresh: the requester written at admission, as cert-manager writes a
//! CertificateRequest's `spec.username`.
//!
//! - A CertificateRefresh created without `spec.requester` gets it from the admission request's
//!   `userInfo` (username, uid, groups): who the API server authenticated, not what the client
//!   claims. One that has it is left as it is: the `ck8s-certs-requests` admission policy
//!   (config/policy/requests.yaml) refuses it unless it names its creator, or the creator is the
//!   controller (whose records name the user who wrote the trigger), and refuses a request from
//!   a user who may not change what it targets.
//! - The user who writes a refresh trigger is written into [`REQUESTER`] in the same write (see
//!   [`super::decide`]); the `ck8s-certs-requester-annotation` policy refuses any other write of
//!   it that names someone else than the writer.

use ck8s_certs_api::annotations::REQUESTER;
use ck8s_certs_api::certificate_refresh::labels as refresh_labels;
use ck8s_certs_api::machine_certificates::Requester;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, Operation};
use serde_json::json;

use crate::refresh::band::TtlBand;

/// The user an admission request comes from, `None` when the API server names nobody.
pub fn requester(request: &AdmissionRequest<DynamicObject>) -> Option<Requester> {
    let user = &request.user_info;
    let username = user.username.clone().filter(|u| !u.is_empty())?;
    Some(Requester {
        username,
        uid: user.uid.clone().filter(|u| !u.is_empty()),
        groups: user.groups.clone().unwrap_or_default(),
    })
}

/// The patch that names the creator of a new CertificateRefresh as its requester; `None` when
/// it names one already (the admission policy checks it) or for any other write.
pub fn stamp_request(request: &AdmissionRequest<DynamicObject>) -> Option<json_patch::Patch> {
    if request.operation != Operation::Create || request.kind.kind != "CertificateRefresh" {
        return None;
    }
    let object = request.object.as_ref()?;
    if !object.data["spec"]["requester"].is_null() {
        return None;
    }
    let requester = requester(request)?;
    let ops = if object.data["spec"].is_object() {
        json!([{ "op": "add", "path": "/spec/requester", "value": requester }])
    } else {
        // Malformed (no spec): the schema refuses it; nothing to add to.
        return None;
    };
    serde_json::from_value(ops).ok()
}

/// Why a new CertificateRefresh is refused at admission, if it is: a `spec.ttl` outside the
/// band, with the message the controller would fail it with. Not for the controller's own
/// writes, which never wait on this and are checked where they are acted on: its records of
/// Machine refreshes (labelled with their Machine, never acted on; a refused trigger's record
/// keeps the refused TTL) and its fleet requests, which name the trigger's author as requester
/// (only the controller may name someone else: the `ck8s-certs-requests` policy).
pub fn refuse_request(
    request: &AdmissionRequest<DynamicObject>,
    object: &DynamicObject,
    band: TtlBand,
) -> Option<String> {
    if request.operation != Operation::Create {
        return None;
    }
    let record = object
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(refresh_labels::MACHINE));
    let named = object.data["spec"]["requester"]["username"].as_str();
    let for_someone_else =
        named.is_some_and(|named| Some(named) != request.user_info.username.as_deref());
    if record || for_someone_else {
        return None;
    }
    band.refuse_request(object.data["spec"]["ttl"].as_str()?)
}

/// The patch operation that names the author of a trigger in the annotations of the object
/// being written (they exist: the trigger is one of them).
pub fn trigger_author(request: &AdmissionRequest<DynamicObject>) -> Option<serde_json::Value> {
    let username = requester(request)?.username;
    let path = format!("/metadata/annotations/{}", REQUESTER.replace('/', "~1"));
    Some(json!({ "op": "add", "path": path, "value": username }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review(
        operation: &str,
        object: serde_json::Value,
        user: serde_json::Value,
    ) -> AdmissionRequest<DynamicObject> {
        let review = crate::admission::testing::review(
            ["certificates.ck8s.io", "v1alpha1", "CertificateRefresh"],
            "certificaterefreshes",
            operation,
            user,
            object,
            serde_json::Value::Null,
        );
        let review: kube::core::admission::AdmissionReview<DynamicObject> =
            serde_json::from_value(review).expect("review");
        review.try_into().expect("request")
    }

    fn refresh(spec: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "certificates.ck8s.io/v1alpha1", "kind": "CertificateRefresh",
            "metadata": { "name": "r", "namespace": "fleet" },
            "spec": spec
        })
    }

    fn alice() -> serde_json::Value {
        json!({ "username": "alice", "uid": "a-1", "groups": ["ops", "system:authenticated"] })
    }

    #[test]
    fn a_new_request_is_stamped_with_who_made_it() {
        let request = review(
            "CREATE",
            refresh(json!({ "target": { "machine": "m" }, "ttl": "1y", "origin": "Manual" })),
            alice(),
        );
        let patch = serde_json::to_value(stamp_request(&request).expect("a patch")).unwrap();
        assert_eq!(
            patch,
            json!([{ "op": "add", "path": "/spec/requester", "value":
                { "username": "alice", "uid": "a-1", "groups": ["ops", "system:authenticated"] } }])
        );
    }

    #[test]
    fn a_named_requester_is_left_to_the_policy_and_updates_are_not_stamped() {
        let named = refresh(
            json!({ "target": { "machine": "m" }, "ttl": "1y", "origin": "Manual",
            "requester": { "username": "bob" } }),
        );
        assert!(stamp_request(&review("CREATE", named, alice())).is_none());
        let plain =
            refresh(json!({ "target": { "machine": "m" }, "ttl": "1y", "origin": "Manual" }));
        assert!(stamp_request(&review("UPDATE", plain.clone(), alice())).is_none());
        // Nobody authenticated: nothing to write (the policy refuses the request).
        assert!(stamp_request(&review("CREATE", plain, json!({}))).is_none());
    }

    #[test]
    fn a_trigger_s_author_is_its_writer() {
        let request = review("UPDATE", refresh(json!({})), alice());
        assert_eq!(
            trigger_author(&request),
            Some(
                json!({ "op": "add", "path": "/metadata/annotations/certificates.ck8s.io~1requester", "value": "alice" })
            )
        );
        assert_eq!(
            trigger_author(&review("UPDATE", refresh(json!({})), json!({}))),
            None
        );
    }
}
