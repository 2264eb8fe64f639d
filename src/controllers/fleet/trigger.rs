//! `kubectl annotate cluster <c> v1beta2.k8sd.io/refresh-certificates=<ttl>` (or the same on a
//! MachineDeployment or a CK8sControlPlane): one fleet `CertificateRefresh` per annotation, owned
//! by the annotated object, in two writes on it so that a restart between them creates that
//! request and not a second one:
//! 1. the request's name is set aside on the object (`certificates.ck8s.io/fleet-request-pending`);
//! 2. the request is created (an existing one of that name is the same), then the trigger is
//!    replaced by `certificates.ck8s.io/fleet-request: <name>` and `in-progress`.
//!
//! The request checks its TTL and its Machines itself (a bad TTL fails it at once, with an
//! Event on the annotated object and `failed` in its status annotation).

use std::sync::Arc;

use crate::events::{Event, EventType};
use ck8s_certs_api::annotations::{
    FLEET_REQUEST, FLEET_REQUEST_PENDING, REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS,
    REQUESTER, RefreshStatus,
};
use ck8s_certs_api::capi::{
    BLOCK_MOVE_ANNOTATION, BLOCK_MOVE_OWNER, CK8S_CONTROL_PLANE_KIND, CLUSTER_NAME_LABEL,
    CONTROL_PLANE_GROUP, GROUP, WATCH_FILTER_LABEL,
};
use ck8s_certs_api::certificate_refresh::{
    CertificateRefresh, CertificateRefreshSpec, Origin, Requester, Target,
};
use ck8s_certs_api::control_plane::ControlPlane;
use ck8s_certs_api::machine::{Cluster, Pairs};
use ck8s_certs_api::machine_deployment::MachineDeployment;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::controllers::stores::get_capi;

use super::{Context, Error, MANAGER, owner_ref};

/// What to do about a Cluster's annotations.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    Nothing,
    /// Set the new request's name aside.
    Reserve {
        ttl: String,
        name: String,
    },
    /// Create the reserved request and acknowledge the trigger.
    Create {
        ttl: String,
        name: String,
    },
    /// The trigger was withdrawn before its request was created.
    Withdraw {
        name: String,
    },
}

/// The pure decision on an object's trigger annotations; `now` names a new request, after
/// `last` (the request its trigger last created), so that two triggers in one second get two
/// requests.
pub fn step(
    object: &str,
    trigger: Option<&str>,
    pending: Option<&str>,
    last: Option<&str>,
    now: jiff::Timestamp,
) -> Step {
    match (trigger, pending) {
        (Some(ttl), None) => Step::Reserve {
            ttl: ttl.to_owned(),
            name: request_name(object, last, now),
        },
        (Some(ttl), Some(name)) => Step::Create {
            ttl: ttl.to_owned(),
            name: name.to_owned(),
        },
        (None, Some(name)) => Step::Withdraw {
            name: name.to_owned(),
        },
        (None, None) => Step::Nothing,
    }
}

/// `<object>-<unix seconds>`, later than `last` (names at most 253 characters).
pub fn request_name(object: &str, last: Option<&str>, now: jiff::Timestamp) -> String {
    let object: String = object.chars().take(230).collect();
    let after_last = last
        .and_then(|l| l.strip_prefix(&format!("{object}-")))
        .and_then(|secs| secs.parse::<i64>().ok())
        .map_or(i64::MIN, |secs| secs.saturating_add(1));
    format!("{object}-{}", now.as_second().max(after_last))
}

pub fn error_policy<K>(_: Arc<K>, err: &Error, _: Arc<Context>) -> Action {
    warn!(error = %err, "Handling a fleet refresh trigger failed; retrying");
    Action::requeue(std::time::Duration::from_secs(5))
}

/// An object whose annotation asks for a fleet refresh, as the handler needs it.
struct Triggered<'a> {
    /// To patch its annotations.
    api: Api<DynamicObject>,
    kind: &'static str,
    namespace: String,
    name: String,
    uid: String,
    labels: &'a std::collections::BTreeMap<String, String>,
    annotations: &'a Pairs,
    trigger_manager: Option<String>,
    /// The Cluster whose Machines it names.
    cluster: String,
    /// Paused (itself or its Cluster), or being deleted: nothing starts.
    idle: bool,
    target: Target,
    owner: OwnerReference,
    reference: ObjectReference,
}

/// A kind whose objects may carry the fleet refresh trigger: `kubectl annotate cluster …`,
/// `… machinedeployment …`, `… ck8scontrolplane …` (the last watched once the kind is served).
pub trait Triggering: Resource + ResourceExt + Send + Sync + 'static {
    const KIND: &'static str;
    /// The version it is served in (`None`: not yet).
    fn served(ctx: &Context) -> Option<Self::DynamicType>;
    /// Its group, version and kind, to patch its annotations.
    fn gvk(version: &Self::DynamicType) -> GroupVersionKind;
    /// The annotations the trigger is read from.
    fn trigger_annotations(&self) -> &Pairs;
    fn trigger_manager(&self) -> Option<String>;
    /// The Cluster whose Machines it names.
    fn cluster(&self) -> Option<String>;
    /// Paused itself (its Cluster's pause is looked up).
    fn paused(&self) -> bool;
    /// The request's target naming it.
    fn target(name: String) -> Target;
}

/// The trigger's kinds differ in how their version is served, their group, where they name
/// their Cluster and the request's target field; the rest is the same fields.
macro_rules! triggering {
    ($type:ty, $kind:expr, $group:expr, served: |$ctx:ident| $served:expr,
     version: |$v:ident| $version:expr, cluster: |$o:ident| $cluster:expr, target: $field:ident) => {
        impl Triggering for $type {
            const KIND: &'static str = $kind;
            fn served($ctx: &Context) -> Option<Self::DynamicType> {
                $served
            }
            fn gvk($v: &Self::DynamicType) -> GroupVersionKind {
                GroupVersionKind::gvk($group, $version, Self::KIND)
            }
            fn trigger_annotations(&self) -> &Pairs {
                &self.annotations
            }
            fn trigger_manager(&self) -> Option<String> {
                self.trigger_manager.clone()
            }
            fn cluster(&self) -> Option<String> {
                let $o = self;
                $cluster
            }
            fn paused(&self) -> bool {
                self.paused
            }
            fn target(name: String) -> Target {
                Target {
                    $field: Some(name),
                    ..Default::default()
                }
            }
        }
    };
}

triggering!(Cluster, "Cluster", GROUP, served: |ctx| Some(ctx.capi),
    version: |v| v.as_str(), cluster: |o| Some(o.name_any()), target: cluster);
triggering!(MachineDeployment, "MachineDeployment", GROUP, served: |ctx| Some(ctx.capi),
    version: |v| v.as_str(), cluster: |o| o.cluster_name.clone(), target: machine_deployment);
triggering!(ControlPlane, CK8S_CONTROL_PLANE_KIND, CONTROL_PLANE_GROUP,
    served: |ctx| ctx.stores.control_planes.version().cloned(),
    version: |v| &v.0, cluster: |o| o.cluster_name.clone(), target: control_plane);

/// Handles the trigger on `object`, once the caches are synced.
pub async fn reconcile<K: Triggering>(object: Arc<K>, ctx: Arc<Context>) -> Result<Action, Error> {
    if let Some(later) = super::not_synced(&ctx) {
        return Ok(later);
    }
    let Some(version) = K::served(&ctx) else {
        return Ok(Action::await_change());
    };
    let namespace = object.namespace().unwrap_or_default();
    let name = object.name_any();
    let empty = Default::default();
    let (Some(owner), Some(cluster)) = (owner_ref(object.as_ref(), &version), object.cluster())
    else {
        return Ok(Action::await_change());
    };
    let cluster_paused =
        get_capi(&ctx.stores.clusters, ctx.capi, &namespace, &cluster).is_some_and(|c| c.paused);
    let resource = ApiResource::from_gvk(&K::gvk(&version));
    let triggered = Triggered {
        api: Api::namespaced_with(ctx.client.clone(), &namespace, &resource),
        kind: K::KIND,
        uid: object.uid().unwrap_or_default(),
        labels: object.meta().labels.as_ref().unwrap_or(&empty),
        annotations: object.trigger_annotations(),
        trigger_manager: object.trigger_manager(),
        idle: object.paused() || cluster_paused || object.meta().deletion_timestamp.is_some(),
        target: K::target(name.clone()),
        owner,
        reference: object.object_ref(&version),
        cluster,
        namespace,
        name,
    };
    handle(&ctx, triggered).await
}

async fn handle(ctx: &Context, object: Triggered<'_>) -> Result<Action, Error> {
    let annotations = object.annotations;
    let trigger = annotations.get(REFRESH_CERTIFICATES);
    let pending = annotations.get(FLEET_REQUEST_PENDING);
    if object.idle {
        return Ok(Action::await_change());
    }
    if let Some(filter) = &ctx.watch_filter
        && object.labels.get(WATCH_FILTER_LABEL) != Some(filter)
    {
        return Ok(Action::await_change());
    }
    let Triggered {
        api: objects,
        namespace,
        name,
        uid,
        ..
    } = &object;
    let last = annotations.get(FLEET_REQUEST);
    let (ttl, request) = match step(name, trigger, pending, last, ctx.clock.now()) {
        Step::Nothing => return Ok(Action::await_change()),
        Step::Withdraw { name: request } => {
            patch(objects, name, withdrawn(uid, &request)).await?;
            return Ok(Action::await_change());
        }
        Step::Reserve { ttl, name: request } => {
            let ops = vec![
                test("/metadata/uid", uid),
                test(&pointer(REFRESH_CERTIFICATES), &ttl),
                json!({ "op": "add", "path": pointer(FLEET_REQUEST_PENDING), "value": request }),
            ];
            if !patch(objects, name, ops).await? {
                return Ok(Action::await_change());
            }
            (ttl, request)
        }
        Step::Create { ttl, name: request } => (ttl, request),
    };
    let api: Api<CertificateRefresh> = Api::namespaced(ctx.client.clone(), namespace);
    let request_object = request_of(&object, &request, &ttl);
    let params = PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    match api.create(&params, &request_object).await {
        Ok(_) => {}
        // Created before a restart: the same request. A request of that name of another object
        // (a Cluster and a MachineDeployment of one name): reserve another name.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let existing = api.get_opt(&request).await?;
            if !existing.is_some_and(|r| r.owner_references().iter().any(|o| o.uid == *uid)) {
                patch(objects, name, withdrawn(uid, &request)).await?;
                return Ok(Action::requeue(std::time::Duration::from_secs(1)));
            }
        }
        // Invalid (a TTL outside the band, denied by the admission webhook): the trigger is
        // refused with the API server's message, not tried again every few seconds.
        Err(kube::Error::Api(status)) if status.code == 400 || status.code == 422 => {
            refuse(ctx, &object, &ttl, &status.message).await?;
            return Ok(Action::await_change());
        }
        Err(err) => return Err(err.into()),
    }
    let mut ops = vec![
        test("/metadata/uid", uid),
        test(&pointer(REFRESH_CERTIFICATES), &ttl),
        json!({ "op": "remove", "path": pointer(REFRESH_CERTIFICATES) }),
        json!({ "op": "remove", "path": pointer(FLEET_REQUEST_PENDING) }),
        json!({ "op": "add", "path": pointer(FLEET_REQUEST), "value": request }),
        json!({ "op": "add", "path": pointer(REFRESH_CERTIFICATES_STATUS), "value": RefreshStatus::InProgress.as_str() }),
    ];
    ops.extend(forget_requester(object.annotations));
    if patch(objects, name, ops).await? {
        info!(
            kind = object.kind,
            name, request, ttl, "Fleet refresh requested"
        );
        let event = Event {
            type_: EventType::Normal,
            reason: "CertificatesFleetRefreshRequested".into(),
            note: Some(format!(
                "CertificateRefresh {request} refreshes the certificates of the {}'s Machines for {ttl}; follow it with `kubectl get certificaterefresh {request} -n {namespace}`",
                object.kind
            )),
            action: "RefreshCertificates".into(),
            secondary: None,
        };
        if let Err(err) = ctx.recorder.publish(&event, &object.reference).await {
            warn!(error = %err, "Publishing an Event failed");
        }
    }
    Ok(Action::await_change())
}

/// Removes the trigger's author with the trigger (in the same guarded patch): who asked belongs
/// to that trigger and its request, and a later trigger written without the webhook must not
/// inherit it.
fn forget_requester(annotations: &Pairs) -> Option<serde_json::Value> {
    annotations
        .get(REQUESTER)
        .map(|_| json!({ "op": "remove", "path": pointer(REQUESTER) }))
}

/// Takes the trigger `ttl` off `object` as failed, with a Warning Event saying why: its request
/// could not be created (`message`, the API server's).
async fn refuse(
    ctx: &Context,
    object: &Triggered<'_>,
    ttl: &str,
    message: &str,
) -> Result<(), Error> {
    let mut ops = vec![
        test("/metadata/uid", &object.uid),
        test(&pointer(REFRESH_CERTIFICATES), ttl),
        json!({ "op": "remove", "path": pointer(REFRESH_CERTIFICATES) }),
        json!({ "op": "remove", "path": pointer(FLEET_REQUEST_PENDING) }),
        json!({ "op": "add", "path": pointer(REFRESH_CERTIFICATES_STATUS), "value": RefreshStatus::Failed.as_str() }),
    ];
    ops.extend(forget_requester(object.annotations));
    if !patch(&object.api, &object.name, ops).await? {
        return Ok(());
    }
    warn!(kind = object.kind, name = %object.name, ttl, reason = message, "Fleet refresh trigger refused");
    let event = Event {
        type_: EventType::Warning,
        reason: ck8s_certs_api::reasons::events::REFRESH_FAILED.into(),
        // Events take 1 KiB notes; the API server's message is bounded by no one.
        note: Some(crate::text::truncate(
            format!(
                "The {} refresh trigger {ttl} was refused: {message}",
                object.kind
            ),
            1024,
        )),
        action: "RefreshCertificates".into(),
        secondary: None,
    };
    if let Err(err) = ctx.recorder.publish(&event, &object.reference).await {
        warn!(error = %err, "Publishing an Event failed");
    }
    Ok(())
}

/// The fleet request `name` that `object`'s trigger asks for (`ttl`), owned by it.
fn request_of(object: &Triggered<'_>, name: &str, ttl: &str) -> CertificateRefresh {
    let mut labels: std::collections::BTreeMap<String, String> = object
        .labels
        .iter()
        .filter(|(k, _)| k.as_str() == WATCH_FILTER_LABEL)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert(CLUSTER_NAME_LABEL.to_owned(), object.cluster.clone());
    CertificateRefresh {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(object.namespace.clone()),
            labels: Some(labels),
            // Held from the start: a move must not carry a request whose progress it drops.
            annotations: Some(
                [(
                    BLOCK_MOVE_ANNOTATION.to_owned(),
                    BLOCK_MOVE_OWNER.to_owned(),
                )]
                .into(),
            ),
            owner_references: Some(vec![object.owner.clone()]),
            ..Default::default()
        },
        spec: CertificateRefreshSpec {
            target: object.target.clone(),
            ttl: ttl.to_owned(),
            origin: Origin::Manual,
            requested_by: object.trigger_manager.clone(),
            requester: object.annotations.get(REQUESTER).map(|username| Requester {
                username: username.to_owned(),
                ..Default::default()
            }),
            max_parallel_workers: None,
            continue_on_failure: false,
            suspend: false,
        },
        status: None,
    }
}

/// The patch that withdraws the reservation of request `name` on the object of `uid`.
fn withdrawn(uid: &str, request: &str) -> Vec<serde_json::Value> {
    vec![
        test("/metadata/uid", uid),
        test(&pointer(FLEET_REQUEST_PENDING), request),
        json!({ "op": "remove", "path": pointer(FLEET_REQUEST_PENDING) }),
    ]
}

fn pointer(key: &str) -> String {
    format!(
        "/metadata/annotations/{}",
        key.replace('~', "~0").replace('/', "~1")
    )
}

fn test(path: &str, value: &str) -> Value {
    json!({ "op": "test", "path": path, "value": value })
}

/// Applies a guarded JSON Patch; `false` when a guard failed (the object changed meanwhile: the
/// next reconcile sees the change) or the object is gone.
async fn patch(objects: &Api<DynamicObject>, name: &str, ops: Vec<Value>) -> Result<bool, Error> {
    let patch: json_patch::Patch = match serde_json::from_value(Value::Array(ops)) {
        Ok(patch) => patch,
        Err(err) => {
            warn!(error = %err, "Building a trigger patch failed");
            return Ok(false);
        }
    };
    match objects
        .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 422 || status.code == 404 => Ok(false),
        Err(err) => Err(err.into()),
    }
}
