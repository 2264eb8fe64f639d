//! Writes. On Machines we only ever touch the annotation keys we own, with JSON Patches guarded by
//! the Machine's uid (never a replaced or recreated Machine) and, for the trigger, by a `test` on
//! the value we acted on (a re-annotation with another TTL is not lost).

use std::collections::BTreeMap;

use ck8s_certs_api::annotations::{
    CERTIFICATES_EXPIRY, FLEET_REQUEST, FORCE_REFRESH, IN_FLIGHT_REFRESH, REFRESH_CERTIFICATES,
    REFRESH_CERTIFICATES_STATUS, REQUESTER, RefreshStatus,
};
use ck8s_certs_api::capi::{BLOCK_MOVE_ANNOTATION, BLOCK_MOVE_OWNER};
use ck8s_certs_api::machine::MachineView;
use ck8s_certs_api::machine_certificates::MachineCertificatesStatus;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Value, json};

/// RFC 3339 in UTC with second precision, as the CK8s provider writes the expiry annotation.
pub fn rfc3339(time: &Time) -> String {
    time.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// `~` and `/` escaped for a JSON Pointer (annotation keys contain `/`).
fn pointer(key: &str) -> String {
    format!(
        "/metadata/annotations/{}",
        key.replace('~', "~0").replace('/', "~1")
    )
}

/// What to change on the Machine.
///
/// clusterctl's block-move annotation follows the status: set with `in-progress`, removed (when
/// ours) with `done` or `failed`, so that a `clusterctl move` waits for a refresh on the node.
/// So does the name of the request carrying the refresh ([`IN_FLIGHT_REFRESH`]).
#[derive(Clone, Debug, Default)]
pub struct MachineChanges<'a> {
    pub status: Option<RefreshStatus>,
    /// With `in-progress`: the `CertificateRefresh` that carries the refresh.
    pub request: Option<&'a str>,
    /// Written only if the Machine is still at this resourceVersion (the one the change was
    /// decided on): taking a refresh up is then a claim two controller instances cannot both win.
    pub unchanged_since: Option<&'a str>,
    /// Remove our block-move annotation without a status change (the Cluster was paused before
    /// anything ran on the node).
    pub release_move: bool,
    pub expiry: Option<&'a Time>,
    /// Remove the trigger if it still has exactly this value.
    pub remove_trigger: Option<&'a str>,
    /// Remove the fleet request's mark (`certificates.ck8s.io/fleet-request`), which the Machine
    /// as we saw it carries.
    pub remove_fleet: bool,
}

/// How to apply [`MachineChanges`].
#[derive(Clone, Debug, PartialEq)]
pub enum MachinePatch {
    /// A JSON Patch: per-key changes, guarded by `test`s.
    Json(Value),
    /// A merge patch, for a Machine we saw without annotations: a JSON Patch would have to add
    /// the whole map and could wipe a key added meanwhile (the user's trigger), a merge patch
    /// merges keys. The uid in it is a precondition.
    Merge(Value),
}

/// The patch applying `changes` to `machine` as we last saw it.
pub fn machine_patch(machine: &MachineView, changes: &MachineChanges<'_>) -> MachinePatch {
    let mut set = BTreeMap::new();
    if let Some(status) = changes.status {
        set.insert(REFRESH_CERTIFICATES_STATUS, status.as_str().to_owned());
    }
    if changes.status == Some(RefreshStatus::InProgress) {
        set.insert(BLOCK_MOVE_ANNOTATION, BLOCK_MOVE_OWNER.to_owned());
        if let Some(request) = changes.request {
            set.insert(IN_FLIGHT_REFRESH, request.to_owned());
        }
    }
    let ended = changes
        .status
        .is_some_and(|s| s != RefreshStatus::InProgress);
    let release_request = ended && machine.annotation(IN_FLIGHT_REFRESH).is_some();
    let release_move = (changes.release_move
        || changes
            .status
            .is_some_and(|s| s != RefreshStatus::InProgress))
        && machine.annotation(BLOCK_MOVE_ANNOTATION) == Some(BLOCK_MOVE_OWNER);
    if let Some(expiry) = changes.expiry {
        set.insert(CERTIFICATES_EXPIRY, rfc3339(expiry));
    }
    if machine.annotations.is_empty() && changes.remove_trigger.is_none() && !changes.remove_fleet {
        // (No annotations: no block-move of ours to release either.)
        let mut metadata = json!({ "uid": machine.uid, "annotations": set });
        if let Some(version) = changes.unchanged_since {
            metadata["resourceVersion"] = json!(version);
        }
        return MachinePatch::Merge(json!({ "metadata": metadata }));
    }
    let mut ops = vec![json!({ "op": "test", "path": "/metadata/uid", "value": machine.uid })];
    if let Some(version) = changes.unchanged_since {
        ops.push(json!({ "op": "test", "path": "/metadata/resourceVersion", "value": version }));
    }
    for (key, value) in &set {
        ops.push(json!({ "op": "add", "path": pointer(key), "value": value }));
    }
    if let Some(trigger) = changes.remove_trigger {
        ops.push(json!({ "op": "test", "path": pointer(REFRESH_CERTIFICATES), "value": trigger }));
        ops.push(json!({ "op": "remove", "path": pointer(REFRESH_CERTIFICATES) }));
        // Its author goes with it (the operation keeps who asked): a later trigger written
        // without the webhook must not inherit them.
        if machine.annotation(REQUESTER).is_some() {
            ops.push(json!({ "op": "remove", "path": pointer(REQUESTER) }));
        }
        // So is a force: the next request is held by a closed gate again.
        if machine.annotation(FORCE_REFRESH).is_some() {
            ops.push(json!({ "op": "remove", "path": pointer(FORCE_REFRESH) }));
        }
    }
    if changes.remove_fleet && machine.annotation(FLEET_REQUEST).is_some() {
        ops.push(json!({ "op": "remove", "path": pointer(FLEET_REQUEST) }));
    }
    if release_request {
        ops.push(json!({ "op": "remove", "path": pointer(IN_FLIGHT_REFRESH) }));
    }
    if release_move {
        // Only ours: a block-move another provider set meanwhile fails the test, and the retry
        // sees it.
        ops.push(json!({ "op": "test", "path": pointer(BLOCK_MOVE_ANNOTATION), "value": BLOCK_MOVE_OWNER }));
        ops.push(json!({ "op": "remove", "path": pointer(BLOCK_MOVE_ANNOTATION) }));
    }
    MachinePatch::Json(Value::Array(ops))
}

/// The Machine as [`machine_patch`] leaves it (the annotations we change), for the writes that
/// follow in the same reconcile.
pub fn patched(machine: &MachineView, changes: &MachineChanges<'_>) -> MachineView {
    let mut after = machine.clone();
    let annotations = &mut after.annotations;
    if let Some(status) = changes.status {
        annotations.insert(
            REFRESH_CERTIFICATES_STATUS.to_owned(),
            status.as_str().to_owned(),
        );
        if status == RefreshStatus::InProgress {
            annotations.insert(
                BLOCK_MOVE_ANNOTATION.to_owned(),
                BLOCK_MOVE_OWNER.to_owned(),
            );
            if let Some(request) = changes.request {
                annotations.insert(IN_FLIGHT_REFRESH.to_owned(), request.to_owned());
            }
        } else {
            annotations.remove(IN_FLIGHT_REFRESH);
        }
    }
    let release = changes.release_move
        || changes
            .status
            .is_some_and(|s| s != RefreshStatus::InProgress);
    if release
        && annotations.get(BLOCK_MOVE_ANNOTATION).map(String::as_str) == Some(BLOCK_MOVE_OWNER)
    {
        annotations.remove(BLOCK_MOVE_ANNOTATION);
    }
    if let Some(expiry) = changes.expiry {
        annotations.insert(CERTIFICATES_EXPIRY.to_owned(), rfc3339(expiry));
    }
    if let Some(trigger) = changes.remove_trigger
        && annotations.get(REFRESH_CERTIFICATES).map(String::as_str) == Some(trigger)
    {
        annotations.remove(REFRESH_CERTIFICATES);
        annotations.remove(REQUESTER);
        annotations.remove(FORCE_REFRESH);
    }
    if changes.remove_fleet {
        annotations.remove(FLEET_REQUEST);
    }
    after
}

/// Sets a condition, keeping `lastTransitionTime` when the status did not change.
pub fn set_condition(
    status: &mut MachineCertificatesStatus,
    type_: &str,
    value: bool,
    reason: &str,
    message: String,
    now: Timestamp,
) {
    let value = if value { "True" } else { "False" }.to_owned();
    let existing = status.conditions.iter().position(|c| c.type_ == type_);
    let transition = match existing.map(|i| &status.conditions[i]) {
        Some(old) if old.status == value => old.last_transition_time.clone(),
        _ => Time(now),
    };
    // Stamped when written (the object's generation); kept here so that an unchanged condition
    // compares equal and costs no write.
    let observed_generation = existing.and_then(|i| status.conditions[i].observed_generation);
    let condition = Condition {
        type_: type_.to_owned(),
        status: value,
        reason: reason.to_owned(),
        message,
        last_transition_time: transition,
        observed_generation,
    };
    match existing {
        Some(i) => status.conditions[i] = condition,
        None => status.conditions.push(condition),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(annotations: &[(&str, &str)]) -> MachineView {
        MachineView {
            namespace: "ns".into(),
            name: "m".into(),
            uid: Some("u-1".into()),
            cluster: Some("c".into()),
            control_plane: false,
            bootstrap_kind: None,
            bootstrap_group: None,
            bootstrap_name: None,
            node_name: None,
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            labels: Default::default(),
            deleting: false,
            ..Default::default()
        }
    }

    /// A JSON patch: the test of the Machine's uid that each one starts with, then `ops`.
    fn json_patch(ops: serde_json::Value) -> MachinePatch {
        let uid = json!({ "op": "test", "path": "/metadata/uid", "value": "u-1" });
        let ops = ops.as_array().unwrap().iter().cloned();
        MachinePatch::Json(std::iter::once(uid).chain(ops).collect())
    }

    #[test]
    fn the_final_patch_is_guarded_by_uid_and_trigger_value() {
        let expiry = Time(Timestamp::from_second(1_900_000_000).unwrap());
        assert_eq!(
            machine_patch(
                &view(&[(REFRESH_CERTIFICATES, "1y")]),
                &MachineChanges {
                    status: Some(RefreshStatus::Done),
                    expiry: Some(&expiry),
                    remove_trigger: Some("1y"),
                    ..Default::default()
                },
            ),
            json_patch(json!([
                { "op": "add", "path": "/metadata/annotations/machine.cluster.x-k8s.io~1certificates-expiry", "value": "2030-03-17T17:46:40Z" },
                { "op": "add", "path": "/metadata/annotations/v1beta2.k8sd.io~1refresh-certificates-status", "value": "done" },
                { "op": "test", "path": "/metadata/annotations/v1beta2.k8sd.io~1refresh-certificates", "value": "1y" },
                { "op": "remove", "path": "/metadata/annotations/v1beta2.k8sd.io~1refresh-certificates" }
            ]))
        );
    }

    #[test]
    fn taking_a_refresh_up_names_its_request_on_the_machine_as_read_and_the_outcome_drops_it() {
        let announce = MachineChanges {
            status: Some(RefreshStatus::InProgress),
            request: Some("m-1800000000"),
            unchanged_since: Some("42"),
            ..Default::default()
        };
        assert_eq!(
            machine_patch(&view(&[(REFRESH_CERTIFICATES, "1y")]), &announce),
            json_patch(json!([
                { "op": "test", "path": "/metadata/resourceVersion", "value": "42" },
                { "op": "add", "path": "/metadata/annotations/certificates.ck8s.io~1certificate-refresh", "value": "m-1800000000" },
                { "op": "add", "path": "/metadata/annotations/clusterctl.cluster.x-k8s.io~1block-move", "value": "ck8s-certs" },
                { "op": "add", "path": "/metadata/annotations/v1beta2.k8sd.io~1refresh-certificates-status", "value": "in-progress" }
            ]))
        );
        // A Machine without annotations: a merge patch, the resourceVersion its precondition.
        assert_eq!(
            machine_patch(&view(&[]), &announce),
            MachinePatch::Merge(json!({ "metadata": {
                "uid": "u-1",
                "resourceVersion": "42",
                "annotations": {
                    "certificates.ck8s.io/certificate-refresh": "m-1800000000",
                    "clusterctl.cluster.x-k8s.io/block-move": "ck8s-certs",
                    "v1beta2.k8sd.io/refresh-certificates-status": "in-progress",
                },
            }}))
        );
        let announced = patched(&view(&[(REFRESH_CERTIFICATES, "1y")]), &announce);
        assert_eq!(
            announced.annotation(IN_FLIGHT_REFRESH),
            Some("m-1800000000")
        );
        let done = MachineChanges {
            status: Some(RefreshStatus::Done),
            ..Default::default()
        };
        let MachinePatch::Json(ops) = machine_patch(&announced, &done) else {
            panic!("a JSON patch");
        };
        assert!(
            ops.as_array().is_some_and(|ops| ops.contains(
                &json!({ "op": "remove", "path": "/metadata/annotations/certificates.ck8s.io~1certificate-refresh" })
            )),
            "{ops:#}"
        );
        assert_eq!(
            patched(&announced, &done).annotation(IN_FLIGHT_REFRESH),
            None
        );
    }

    #[test]
    fn block_move_is_set_with_in_progress_and_released_with_the_outcome_when_ours() {
        assert_eq!(
            machine_patch(
                &view(&[(REFRESH_CERTIFICATES, "1y")]),
                &MachineChanges {
                    status: Some(RefreshStatus::InProgress),
                    ..Default::default()
                },
            ),
            json_patch(json!([
                { "op": "add", "path": "/metadata/annotations/clusterctl.cluster.x-k8s.io~1block-move", "value": "ck8s-certs" },
                { "op": "add", "path": "/metadata/annotations/v1beta2.k8sd.io~1refresh-certificates-status", "value": "in-progress" }
            ]))
        );
        let release = json_patch(json!([
            { "op": "add", "path": "/metadata/annotations/v1beta2.k8sd.io~1refresh-certificates-status", "value": "failed" },
            { "op": "test", "path": "/metadata/annotations/clusterctl.cluster.x-k8s.io~1block-move", "value": "ck8s-certs" },
            { "op": "remove", "path": "/metadata/annotations/clusterctl.cluster.x-k8s.io~1block-move" }
        ]));
        let failed = MachineChanges {
            status: Some(RefreshStatus::Failed),
            ..Default::default()
        };
        assert_eq!(
            machine_patch(&view(&[(BLOCK_MOVE_ANNOTATION, BLOCK_MOVE_OWNER)]), &failed),
            release
        );
        // In one reconcile, the final patch sees what the announcement set.
        let announced = patched(
            &view(&[(REFRESH_CERTIFICATES, "1y")]),
            &MachineChanges {
                status: Some(RefreshStatus::InProgress),
                ..Default::default()
            },
        );
        assert_eq!(
            announced.annotation(BLOCK_MOVE_ANNOTATION),
            Some(BLOCK_MOVE_OWNER)
        );
        let MachinePatch::Json(ops) = machine_patch(&announced, &failed) else {
            panic!("a JSON patch");
        };
        assert_eq!(
            ops.as_array().and_then(|ops| ops.last()),
            Some(
                &json!({ "op": "remove", "path": "/metadata/annotations/clusterctl.cluster.x-k8s.io~1block-move" })
            )
        );
        // Another provider's block-move is not ours to remove.
        assert_eq!(
            machine_patch(&view(&[(BLOCK_MOVE_ANNOTATION, "capd")]), &failed),
            json_patch(json!([
                { "op": "add", "path": "/metadata/annotations/v1beta2.k8sd.io~1refresh-certificates-status", "value": "failed" }
            ]))
        );
        // Paused before the node was touched: released, the status left as it is.
        assert_eq!(
            machine_patch(
                &view(&[(BLOCK_MOVE_ANNOTATION, BLOCK_MOVE_OWNER)]),
                &MachineChanges {
                    release_move: true,
                    ..Default::default()
                }
            ),
            json_patch(json!([
                { "op": "test", "path": "/metadata/annotations/clusterctl.cluster.x-k8s.io~1block-move", "value": "ck8s-certs" },
                { "op": "remove", "path": "/metadata/annotations/clusterctl.cluster.x-k8s.io~1block-move" }
            ]))
        );
    }

    #[test]
    fn a_machine_seen_without_annotations_is_merge_patched_so_a_new_trigger_survives() {
        let expiry = Time(Timestamp::from_second(0).unwrap());
        assert_eq!(
            machine_patch(
                &view(&[]),
                &MachineChanges {
                    expiry: Some(&expiry),
                    ..Default::default()
                },
            ),
            MachinePatch::Merge(
                json!({ "metadata": { "uid": "u-1", "annotations": { CERTIFICATES_EXPIRY: "1970-01-01T00:00:00Z" } } })
            )
        );
    }

    #[test]
    fn conditions_keep_their_transition_time_while_unchanged() {
        let mut status = MachineCertificatesStatus::default();
        let t0 = Timestamp::from_second(100).unwrap();
        let t1 = Timestamp::from_second(200).unwrap();
        set_condition(&mut status, "Ready", true, "A", "a".into(), t0);
        set_condition(&mut status, "Ready", true, "B", "b".into(), t1);
        assert_eq!(status.conditions[0].last_transition_time, Time(t0));
        assert_eq!(status.conditions[0].reason, "B");
        set_condition(&mut status, "Ready", false, "C", "c".into(), t1);
        assert_eq!(status.conditions[0].last_transition_time, Time(t1));
        assert_eq!(status.conditions.len(), 1);
    }
}
