//! The admission webhook: a request body as `POST /mutate-machine` or
//! `POST /mutate-certificaterefresh` receives it, decoded as the handler does
//! (`AdmissionReview<DynamicObject>`, the `apiVersion`/`kind` check, the request taken out of the
//! review), then `admission::review` under a few scopes, and the answer serialised as it is sent.
//! The writes reviewed: a Machine's trigger, a fleet trigger (Cluster, MachineDeployment,
//! CK8sControlPlane) and a new CertificateRefresh. When the decision marks the object, its JSON
//! patch must apply to the object it was made for (the API server rejects the write otherwise),
//! must change nothing but our own annotations and `spec.requester`, and any author it writes
//! (the requester annotation, `spec.requester`) is the user the API server authenticated.

use ck8s_certs::admission::{self, Decision, Scope};
use ck8s_certs_api::annotations::{REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS, REQUESTER};
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

/// A Cluster, MachineDeployment or CK8sControlPlane, with or without a fleet trigger.
fn fleet_object(rng: &mut Rng, kind: &str, api_version: &str) -> Value {
    let mut metadata = json!({
        "name": rng.pick(&["alpha", "alpha-md-0", ""]),
        "namespace": "fleet",
        "annotations": annotations(rng),
    });
    if rng.chance(10) {
        metadata["annotations"] = json!(null);
    }
    json!({ "apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": {} })
}

/// A CertificateRefresh as a user (or the controller) creates it.
fn certificate_refresh(rng: &mut Rng) -> Value {
    let target = match rng.below(4) {
        0 => json!({ "machine": "alpha-cp-0" }),
        1 => json!({ "cluster": "alpha" }),
        2 => json!({ "machineDeployment": "alpha-md-0" }),
        _ => json!({ "machine": rng.pick(&["", "~1", "a/b"]) }),
    };
    let ttl = match rng.chance(80) {
        true => rng.pick(ttl::WORDS).to_string(),
        false => mutate::string(rng, ttl::WORDS),
    };
    let mut spec =
        json!({ "target": target, "ttl": ttl, "origin": rng.pick(&["Manual", "Policy", "x"]) });
    match rng.below(5) {
        0 => spec["requester"] = json!({ "username": "alice", "groups": ["system:authenticated"] }),
        1 => spec["requester"] = json!({ "username": "mallory" }),
        2 => spec["requestedBy"] = json!("admin"),
        _ => {}
    }
    let mut metadata = json!({ "name": "r-1", "namespace": "fleet" });
    if rng.chance(20) {
        metadata["labels"] = json!({ "certificates.ck8s.io/machine": "alpha-cp-0" });
    }
    let mut object = json!({
        "apiVersion": "certificates.ck8s.io/v1alpha1",
        "kind": "CertificateRefresh",
        "metadata": metadata,
        "spec": spec,
    });
    if rng.chance(5) {
        object["spec"] = json!(rng.pick(&["x", "7"]));
    }
    object
}

/// Who writes: a user, the controller, a node, or nobody the API server could name.
fn user_info(rng: &mut Rng) -> Value {
    match rng.below(8) {
        0 => json!({}),
        1 => json!({ "username": "" }),
        2 => json!({ "username": "system:serviceaccount:ck8s-certs-system:ck8s-certs-manager" }),
        3 => json!({ "username": "system:node:alpha-cp-0", "groups": ["system:nodes"] }),
        4 => json!({ "username": mutate::string(rng, WORDS), "uid": "u", "groups": [7] }),
        _ => json!({ "username": "alice", "uid": "a-1", "groups": ["system:authenticated"] }),
    }
}

/// A review near what the API server sends for a Machine write, a fleet trigger's write or a
/// new CertificateRefresh.
fn review(rng: &mut Rng) -> Value {
    let (group, version, kind, resource) = match rng.below(10) {
        0..=5 => ("cluster.x-k8s.io", "v1beta1", "Machine", "machines"),
        6 => ("cluster.x-k8s.io", "v1beta2", "Cluster", "clusters"),
        7 => (
            "cluster.x-k8s.io",
            "v1beta2",
            "MachineDeployment",
            "machinedeployments",
        ),
        8 => (
            "controlplane.cluster.x-k8s.io",
            "v1beta2",
            "CK8sControlPlane",
            "ck8scontrolplanes",
        ),
        _ => (
            "certificates.ck8s.io",
            "v1alpha1",
            "CertificateRefresh",
            "certificaterefreshes",
        ),
    };
    let make = |rng: &mut Rng| match kind {
        "Machine" => machine(rng),
        "CertificateRefresh" => certificate_refresh(rng),
        _ => fleet_object(rng, kind, &format!("{group}/{version}")),
    };
    let object = make(rng);
    let old = match rng.below(6) {
        0 => Value::Null,
        1 => object.clone(),
        _ => make(rng),
    };
    json!({
        "apiVersion": if rng.chance(90) { REVIEW_API_VERSION } else { "admission.k8s.io/v1beta1" },
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "name": "alpha-cp-0",
            "namespace": "fleet",
            // Requests are only ever created (the webhook sees no other operation of theirs).
            "operation": match kind {
                "CertificateRefresh" if rng.chance(80) => "CREATE",
                _ => rng.pick(&["CREATE", "UPDATE", "UPDATE", "UPDATE", "UPDATE", "DELETE", "CONNECT"]),
            },
            "userInfo": user_info(rng),
            "object": object,
            "oldObject": old,
            "dryRun": rng.chance(10),
        },
    })
}

/// The annotations a mark may write (ours), besides `spec.requester` of a new request.
fn ours(key: &str) -> bool {
    key.starts_with("certificates.ck8s.io/") || key == REFRESH_CERTIFICATES_STATUS
}

/// `doc` without what a mark may change.
fn without_ours(doc: &Value) -> Value {
    let mut doc = doc.clone();
    if let Some(annotations) = doc
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.retain(|key, _| !ours(key));
        if annotations.is_empty() {
            doc["metadata"]["annotations"] = Value::Null;
        }
    } else if let Some(metadata) = doc.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.insert("annotations".into(), Value::Null);
    }
    if let Some(spec) = doc.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("requester");
    }
    doc
}

/// The properties of a mark: only our keys change, and every author it writes is the user the
/// API server authenticated.
fn check_mark(request: &AdmissionRequest<DynamicObject>, before: &Value, after: &Value) {
    assert_eq!(
        without_ours(before),
        without_ours(after),
        "the mark changed more than our annotations and spec.requester"
    );
    let user = request.user_info.username.as_deref();
    let wrote = |pointer: &str| {
        let then = before.pointer(pointer);
        let now = after.pointer(pointer);
        (now != then).then_some(now).flatten()
    };
    let author = format!("/metadata/annotations/{}", REQUESTER.replace('/', "~1"));
    for written in [wrote(&author), wrote("/spec/requester/username")]
        .into_iter()
        .flatten()
    {
        assert_eq!(
            written.as_str(),
            user,
            "an author other than the user who wrote it"
        );
    }
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
            (Decision::Mark { .. }, _) => match request.kind.kind.as_str() {
                "Machine" => "mark machine",
                "CertificateRefresh" => "mark request",
                _ => "mark fleet trigger",
            },
            (Decision::Deny(_), "pass") => "deny",
            (_, label) => label,
        };
        if let Decision::Mark { patch, .. } = decision
            && let Some(object) = &request.object
        {
            let before = match serde_json::to_value(object) {
                Ok(doc) => doc,
                Err(err) => panic!("the object does not serialise: {err}"),
            };
            let mut after = before.clone();
            if let Err(err) = json_patch::patch(&mut after, &patch) {
                panic!("the patch {patch:?} does not apply to the object: {err}");
            }
            check_mark(&request, &before, &after);
        }
    }
    label
}
