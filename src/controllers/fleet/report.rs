//! What users see of a fleet request besides its status: Events on the object that asked for
//! it, the outcome in that object's annotations, and the finished requests kept as history.

use crate::events::{Event, EventType, Recorder};
use ck8s_certs_api::annotations::{FLEET_REQUEST, REFRESH_CERTIFICATES_STATUS, RefreshStatus};
use ck8s_certs_api::capi::{CK8S_CONTROL_PLANE_KIND, CLUSTER_NAME_LABEL};
use ck8s_certs_api::certificate_refresh::{CertificateRefresh, RequestPhase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::warn;

use super::{Context, Error, cluster_of, plan};
use crate::controllers::stores::get_capi;

/// The Cluster of a fleet request (or the Machine of a one-Machine request) Events go to.
pub(super) fn event_target(
    ctx: &Context,
    request: &CertificateRefresh,
    namespace: &str,
) -> k8s_openapi::api::core::v1::ObjectReference {
    // The object whose trigger created it (or which adopted it).
    if let Some(owner) = super::controller_of(request) {
        return k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(owner.api_version.clone()),
            kind: Some(owner.kind.clone()),
            name: Some(owner.name.clone()),
            namespace: Some(namespace.to_owned()),
            uid: Some(owner.uid.clone()),
            ..Default::default()
        };
    }
    if let Some(cluster) = cluster_of(ctx, request)
        && let Some(cached) = get_capi(&ctx.stores.clusters, ctx.capi, namespace, &cluster)
    {
        return cached.object_ref(&ctx.capi);
    }
    if let Some(machine) = &request.spec.target.machine
        && let Some(cached) = get_capi(&ctx.stores.machines, ctx.capi, namespace, machine)
    {
        return cached.object_ref(&ctx.capi);
    }
    request.object_ref(&())
}

pub(super) async fn publish(
    recorder: &Recorder,
    target: &k8s_openapi::api::core::v1::ObjectReference,
    note: &plan::Note,
) {
    let event = Event {
        type_: if note.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: note.reason.to_owned(),
        note: Some(note.message.chars().take(1000).collect()),
        action: "RefreshCertificates".into(),
        secondary: None,
    };
    if let Err(err) = recorder.publish(&event, target).await {
        warn!(error = %err, reason = note.reason, "Publishing an Event failed");
    }
}

/// The outcome on the Cluster, MachineDeployment or control plane object whose trigger created
/// the request, as on a Machine.
pub(super) async fn mirror_on_trigger(
    ctx: &Context,
    namespace: &str,
    owner: &OwnerReference,
    request: &str,
    phase: RequestPhase,
) -> Result<(), Error> {
    let annotations = match owner.kind.as_str() {
        "Cluster" => get_capi(&ctx.stores.clusters, ctx.capi, namespace, &owner.name)
            .map(|c| c.annotations.clone()),
        "MachineDeployment" => get_capi(&ctx.stores.deployments, ctx.capi, namespace, &owner.name)
            .map(|d| d.annotations.clone()),
        CK8S_CONTROL_PLANE_KIND => ctx
            .stores
            .control_planes
            .get(namespace, &owner.name)
            .map(|c| c.annotations.clone()),
        _ => None,
    };
    let Some(annotations) = annotations else {
        return Ok(());
    };
    if annotations.get(FLEET_REQUEST) != Some(request) {
        return Ok(());
    }
    let status = if phase == RequestPhase::Succeeded {
        RefreshStatus::Done
    } else {
        RefreshStatus::Failed
    };
    if annotations.get(REFRESH_CERTIFICATES_STATUS) == Some(status.as_str()) {
        return Ok(());
    }
    // Cluster API kinds in the version served now (an owner reference keeps the version of its
    // day); a control plane object in its own group and version.
    let (group, version) = owner
        .api_version
        .split_once('/')
        .unwrap_or(("", owner.api_version.as_str()));
    let version = if group == ck8s_certs_api::capi::GROUP {
        ctx.capi.as_str()
    } else {
        version
    };
    let gvk = GroupVersionKind::gvk(group, version, &owner.kind);
    let objects: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), namespace, &ApiResource::from_gvk(&gvk));
    let patch =
        json!({ "metadata": { "annotations": { REFRESH_CERTIFICATES_STATUS: status.as_str() }}});
    match objects
        .patch(&owner.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// Drops the oldest finished fleet requests of one owner (a Cluster, a MachineDeployment) beyond
/// `keep` (housekeeping: a failure only leaves one too many).
pub(super) async fn prune(api: &Api<CertificateRefresh>, cluster: &str, owner: &str, keep: usize) {
    let selector = format!(
        "{CLUSTER_NAME_LABEL}={cluster},!{}",
        ck8s_certs_api::certificate_refresh::labels::MACHINE
    );
    let list = match api.list(&ListParams::default().labels(&selector)).await {
        Ok(list) => list,
        Err(err) => {
            warn!(error = %err, "Could not list the fleet requests to prune them");
            return;
        }
    };
    let finished = list
        .items
        .into_iter()
        .filter(|r| r.owner_references().iter().any(|o| o.uid == owner))
        .filter(|r| r.is_finished())
        .filter_map(|r| {
            Some((
                r.metadata.name.clone()?,
                r.metadata.creation_timestamp.as_ref()?.0,
            ))
        })
        .collect();
    for old in crate::controllers::history::beyond(finished, keep.max(1)) {
        if let Err(err) = api.delete(&old, &DeleteParams::background()).await {
            warn!(request = old, error = %err, "Could not delete an old fleet request");
        }
    }
}
