//! `clusterctl move` and fleet requests: a request holds clusterctl's block-move until it ends
//! (its progress is status, which a move drops), records its outcome where a move keeps it (an
//! annotation), and is restored from that outcome on the management cluster it was moved to.

use ck8s_certs_api::annotations::REQUEST_OUTCOME;
use ck8s_certs_api::capi::{BLOCK_MOVE_ANNOTATION, BLOCK_MOVE_OWNER};
use ck8s_certs_api::certificate_refresh::{CertificateRefresh, RequestPhase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::{Context, Error, MANAGER};
use crate::controllers::stores::get_capi;

/// While a request is unfinished it carries clusterctl's block-move: `clusterctl move` does not
/// carry status, so a request moved mid-way would lose its progress and start over. A request
/// made by hand is also adopted by its Cluster (as CAPI adopts a stand-alone Machine), so that
/// it moves and goes away with it.
pub(super) async fn hold_move(
    ctx: &Context,
    api: &Api<CertificateRefresh>,
    request: &CertificateRefresh,
    cluster: Option<&str>,
) -> Result<(), Error> {
    let mut metadata = serde_json::Map::new();
    if !request.annotations().contains_key(BLOCK_MOVE_ANNOTATION) {
        metadata.insert(
            "annotations".into(),
            json!({ BLOCK_MOVE_ANNOTATION: BLOCK_MOVE_OWNER }),
        );
    }
    let namespace = request.namespace().unwrap_or_default();
    if request.owner_references().is_empty()
        && let Some(owner) = cluster
            .and_then(|c| get_capi(&ctx.stores.clusters, ctx.capi, &namespace, c))
            .and_then(|c| owner_ref(c.as_ref(), &ctx.capi))
    {
        metadata.insert("ownerReferences".into(), json!([owner]));
    }
    if metadata.is_empty() {
        return Ok(());
    }
    patch_request(api, &request.name_any(), json!({ "metadata": metadata })).await
}

/// `object` as a request's controlling owner. Without `blockOwnerDeletion`: that would need
/// update rights on the owner's finalizers.
pub fn owner_ref<K: Resource>(object: &K, dt: &K::DynamicType) -> Option<OwnerReference> {
    let mut owner = object.controller_owner_ref(dt)?;
    owner.block_owner_deletion = None;
    Some(owner)
}

/// A finished request: releases the block-move (when ours) and records the outcome where a
/// move keeps it (an annotation).
pub(super) async fn release_move(
    api: &Api<CertificateRefresh>,
    request: &CertificateRefresh,
    phase: RequestPhase,
) -> Result<(), Error> {
    let annotations = request.annotations();
    let ours = annotations.get(BLOCK_MOVE_ANNOTATION).map(String::as_str) == Some(BLOCK_MOVE_OWNER);
    if !ours && annotations.get(REQUEST_OUTCOME).map(String::as_str) == Some(phase.as_str()) {
        return Ok(());
    }
    let mut changes = serde_json::Map::new();
    changes.insert(REQUEST_OUTCOME.into(), json!(phase.as_str()));
    if ours {
        changes.insert(BLOCK_MOVE_ANNOTATION.into(), serde_json::Value::Null);
    }
    let patch = json!({ "metadata": { "annotations": changes } });
    patch_request(api, &request.name_any(), patch).await
}

async fn patch_request(
    api: &Api<CertificateRefresh>,
    name: &str,
    patch: serde_json::Value,
) -> Result<(), Error> {
    let params = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    match api.patch(name, &params, &Patch::Merge(patch)).await {
        Ok(_) => Ok(()),
        // Deleted meanwhile: nothing left to block or record.
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// A finished request that arrived without its status (`clusterctl move`): the phase, from its
/// outcome annotation, and where the details are.
pub(super) async fn restore_status(
    api: &Api<CertificateRefresh>,
    name: &str,
    phase: RequestPhase,
) -> Result<(), Error> {
    let status = ck8s_certs_api::certificate_refresh::CertificateRefreshStatus {
        phase: Some(phase),
        message: Some(format!(
            "{} before it was moved to this management cluster; clusterctl move does not carry status, so the per-Machine detail is in the Machines' own CertificateRefresh records",
            phase.as_str()
        )),
        ..Default::default()
    };
    let patch = json!({
        "apiVersion": CertificateRefresh::api_version(&()),
        "kind": CertificateRefresh::kind(&()),
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(patch),
    )
    .await?;
    Ok(())
}
