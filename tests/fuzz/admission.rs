//! The admission webhook: a request body as `POST /mutate-machine` receives it, decoded as the
//! handler does (`AdmissionReview<DynamicObject>`, the `apiVersion`/`kind` check, the request
//! taken out of the review), then `admission::review` under a few scopes, and the answer
//! serialised as it is sent. When the decision marks the Machine, its JSON patch must apply to
//! the object it was made for (the API server rejects the write otherwise).

use ck8s_certs::admission::{self, Decision, Scope};
use ck8s_certs_api::annotations::REFRESH_CERTIFICATES;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use serde_json::{Value, json};

use super::harness::{Rng, hash};
use super::{mutate, ttl};

/// What the handler accepts (`src/admission/server.rs`).
const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";

pub const WORDS: &[&str] = &[
    "admission.k8s.io/v1",
    "admission.k8s.io/v1beta1",
    "AdmissionReview",
    "CREATE",
    "UPDATE",
    "DELETE",
    "CONNECT",
    "Machine",
    "cluster.x-k8s.io/v1beta1",
    "cluster.x-k8s.io/v1beta2",
    "CK8sConfig",
    "KubeadmConfig",
    "bootstrap.cluster.x-k8s.io",
    "v1beta2.k8sd.io/refresh-certificates",
    "v1beta2.k8sd.io/refresh-certificates-status",
    "certificates.ck8s.io/refresh-request",
    "cluster.x-k8s.io/paused",
    "cluster.x-k8s.io/control-plane",
    "cluster.x-k8s.io/watch-filter",
    "clusterctl.cluster.x-k8s.io/delete-for-move",
    "Apply",
    "Update",
    "FieldsV1",
    "f:metadata",
    "f:annotations",
    "f:v1beta2.k8sd.io/refresh-certificates",
    "1y",
    "5m",
    "1yr",
    "fleet",
    "~",
    "/",
];

fn annotations(rng: &mut Rng) -> Value {
    let mut map = serde_json::Map::new();
    if rng.chance(85) {
        let ttl = match rng.chance(80) {
            true => rng.pick(ttl::WORDS).to_string(),
            false => mutate::string(rng, ttl::WORDS),
        };
        map.insert(REFRESH_CERTIFICATES.into(), json!(ttl));
    }
    for (key, value) in [
        ("v1beta2.k8sd.io/refresh-certificates-status", "in-progress"),
        ("cluster.x-k8s.io/paused", ""),
        ("clusterctl.cluster.x-k8s.io/delete-for-move", ""),
        ("certificates.ck8s.io/refresh-request", "req-0"),
        ("a~b/c", "x"),
    ] {
        if rng.chance(10) {
            map.insert(key.into(), json!(value));
        }
    }
    Value::Object(map)
}

fn machine(rng: &mut Rng) -> Value {
    let mut labels = serde_json::Map::new();
    if rng.chance(50) {
        labels.insert("cluster.x-k8s.io/control-plane".into(), json!(""));
    }
    if rng.chance(30) {
        labels.insert(
            "cluster.x-k8s.io/watch-filter".into(),
            json!(rng.pick(&["shard-a", "shard-b"])),
        );
    }
    if rng.chance(30) {
        labels.insert("cluster.x-k8s.io/cluster-name".into(), json!("alpha"));
    }
    // Mostly a CK8s Machine: the others are passed at once.
    let ck8s = rng.chance(85);
    let kind = if ck8s { "CK8sConfig" } else { "KubeadmConfig" };
    let config_ref = match (rng.chance(50), ck8s) {
        (true, true) => {
            json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": kind, "name": "m"})
        }
        (false, true) => {
            json!({"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": kind, "name": "m"})
        }
        (_, false) => {
            json!({"apiVersion": rng.pick(&["bootstrap.cluster.x-k8s.io", "", "/", "x/y/z"]), "apiGroup": rng.pick(&["", "bootstrap.cluster.x-k8s.io"]), "kind": rng.pick(&[kind, "CK8sConfig"]), "name": "m"})
        }
    };
    let mut metadata = json!({
        "name": rng.pick(&["alpha-cp-0", "m", ""]),
        "namespace": rng.pick(&["fleet", "default"]),
        "uid": "5e0c8a9e-1c4d-4b8e-9a7f-0d2c3b4a5f6e",
        "annotations": annotations(rng),
        "labels": labels,
    });
    if rng.chance(10) {
        metadata["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    if rng.chance(40) {
        metadata["managedFields"] = json!([{
            "manager": rng.pick(&["kubectl-annotate", "capi-machineset", "argocd"]),
            "operation": rng.pick(&["Apply", "Update", "apply", ""]),
            "apiVersion": "cluster.x-k8s.io/v1beta1",
            "time": "2026-01-01T00:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:annotations": {format!("f:{REFRESH_CERTIFICATES}"): {}}}},
        }]);
    }
    let mut object = json!({
        "apiVersion": rng.pick(&["cluster.x-k8s.io/v1beta1", "cluster.x-k8s.io/v1beta2"]),
        "kind": "Machine",
        "metadata": metadata,
        "spec": {"clusterName": "alpha", "bootstrap": {"configRef": config_ref}},
    });
    if rng.chance(80) {
        object["status"] = json!({"nodeRef": {"name": "alpha-cp-0"}});
    }
    object
}

/// A review near what the API server sends for a Machine write.
fn review(rng: &mut Rng) -> Value {
    let object = machine(rng);
    let old = match rng.below(6) {
        0 => Value::Null,
        1 => object.clone(),
        _ => machine(rng),
    };
    json!({
        "apiVersion": if rng.chance(90) { REVIEW_API_VERSION } else { "admission.k8s.io/v1beta1" },
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "cluster.x-k8s.io", "version": "v1beta1", "kind": "Machine"},
            "resource": {"group": "cluster.x-k8s.io", "version": "v1beta1", "resource": "machines"},
            "name": "alpha-cp-0",
            "namespace": "fleet",
            "operation": rng.pick(&["CREATE", "UPDATE", "UPDATE", "UPDATE", "UPDATE", "DELETE", "CONNECT"]),
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": rng.chance(10),
        },
    })
}

pub fn generate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    match rng.below(20) {
        0..=5 => {
            let seed = rng.pick_ref(corpus).clone();
            mutate::json_bytes(rng, &seed, WORDS, corpus)
        }
        6..=15 => serde_json::to_vec(&review(rng)).unwrap_or_default(),
        16..=18 => {
            let seed = serde_json::to_vec(&review(rng)).unwrap_or_default();
            mutate::json_bytes(rng, &seed, WORDS, corpus)
        }
        _ => mutate::deep_text(rng),
    }
}

pub fn check(input: &[u8]) -> &'static str {
    let Ok(review) = serde_json::from_slice::<AdmissionReview<DynamicObject>>(input) else {
        return "not a review";
    };
    if review.types.kind != "AdmissionReview" || review.types.api_version != REVIEW_API_VERSION {
        return "other version";
    }
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(err) => {
            let _ = err.to_string();
            return "no request";
        }
    };
    let h = hash(input);
    let scopes = [
        Scope::default(),
        Scope {
            namespace: Some("fleet".into()),
            watch_filter: h.is_multiple_of(2).then(|| "shard-a".into()),
            ..Scope::default()
        },
    ];
    let mut label = "pass";
    for scope in &scopes {
        let answer = admission::review(&request, scope).into_review();
        if let Err(err) = serde_json::to_vec(&answer) {
            panic!("the answer does not serialise: {err}");
        }
        let decision = admission::decide(&request, scope);
        label = match (&decision, label) {
            (Decision::Mark { .. }, _) => "mark",
            (Decision::Deny(_), "pass") => "deny",
            (_, label) => label,
        };
        if let Decision::Mark { patch, .. } = decision
            && let Some(object) = &request.object
        {
            let mut doc = match serde_json::to_value(object) {
                Ok(doc) => doc,
                Err(err) => panic!("the object does not serialise: {err}"),
            };
            if let Err(err) = json_patch::patch(&mut doc, &patch) {
                panic!("the patch {patch:?} does not apply to the object: {err}");
            }
        }
    }
    label
}
