//! `kubectl annotate cluster <c> v1beta2.k8sd.io/refresh-certificates=<ttl>`: one fleet
//! `CertificateRefresh` per annotation, in two Cluster writes so that a restart between them
//! creates that request and not a second one:
//! 1. the request's name is set aside on the Cluster (`certificates.ck8s.io/fleet-request-pending`);
//! 2. the request is created (an existing one of that name is the same), then the trigger is
//!    replaced by `certificates.ck8s.io/fleet-request: <name>` and `in-progress`.
//!
//! The request checks its TTL and its Machines itself (a bad TTL fails it at once, with an
//! Event on the Cluster and `failed` in the Cluster's status annotation).

use std::sync::Arc;

use ck8s_certs_api::annotations::{
    FLEET_REQUEST, FLEET_REQUEST_PENDING, REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS,
    RefreshStatus,
};
use ck8s_certs_api::capi::{
    BLOCK_MOVE_ANNOTATION, BLOCK_MOVE_OWNER, CLUSTER_NAME_LABEL, WATCH_FILTER_LABEL,
};
use ck8s_certs_api::certificate_refresh::{
    CertificateRefresh, CertificateRefreshSpec, Origin, Target,
};
use ck8s_certs_api::machine::Cluster;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::{info, warn};

use super::{Context, Error, MANAGER};

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

/// The pure decision on a Cluster's trigger annotations; `now` names a new request.
pub fn step(
    cluster: &str,
    trigger: Option<&str>,
    pending: Option<&str>,
    now: jiff::Timestamp,
) -> Step {
    match (trigger, pending) {
        (Some(ttl), None) => Step::Reserve {
            ttl: ttl.to_owned(),
            name: request_name(cluster, now),
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

/// `<cluster>-<unix seconds>` (names at most 253 characters).
pub fn request_name(cluster: &str, now: jiff::Timestamp) -> String {
    let cluster: String = cluster.chars().take(230).collect();
    format!("{cluster}-{}", now.as_second())
}

pub fn error_policy(_: Arc<Cluster>, err: &Error, _: Arc<Context>) -> Action {
    warn!(error = %err, "Handling a Cluster's refresh trigger failed; retrying");
    Action::requeue(std::time::Duration::from_secs(5))
}

pub async fn reconcile(cluster: Arc<Cluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    if let Some(later) = super::not_synced(&ctx) {
        return Ok(later);
    }
    let annotations = &cluster.annotations;
    let trigger = annotations.get(REFRESH_CERTIFICATES);
    let pending = annotations.get(FLEET_REQUEST_PENDING);
    if cluster.paused || cluster.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if let Some(filter) = &ctx.watch_filter
        && cluster.labels().get(WATCH_FILTER_LABEL) != Some(filter)
    {
        return Ok(Action::await_change());
    }
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let clusters: Api<Cluster> = Api::namespaced_with(ctx.client.clone(), &namespace, &ctx.capi);
    let uid = cluster.uid().unwrap_or_default();
    let (ttl, request) = match step(&name, trigger, pending, jiff::Timestamp::now()) {
        Step::Nothing => return Ok(Action::await_change()),
        Step::Withdraw { name: request } => {
            let ops = vec![
                test("/metadata/uid", &uid),
                test(&pointer(FLEET_REQUEST_PENDING), &request),
                json!({ "op": "remove", "path": pointer(FLEET_REQUEST_PENDING) }),
            ];
            patch(&clusters, &name, ops).await?;
            return Ok(Action::await_change());
        }
        Step::Reserve { ttl, name: request } => {
            let ops = vec![
                test("/metadata/uid", &uid),
                test(&pointer(REFRESH_CERTIFICATES), &ttl),
                json!({ "op": "add", "path": pointer(FLEET_REQUEST_PENDING), "value": request }),
            ];
            if !patch(&clusters, &name, ops).await? {
                return Ok(Action::await_change());
            }
            (ttl, request)
        }
        Step::Create { ttl, name: request } => (ttl, request),
    };
    let api: Api<CertificateRefresh> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut labels: std::collections::BTreeMap<String, String> = cluster
        .labels()
        .iter()
        .filter(|(k, _)| k.as_str() == WATCH_FILTER_LABEL)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert(CLUSTER_NAME_LABEL.to_owned(), name.clone());
    let object = CertificateRefresh {
        metadata: ObjectMeta {
            name: Some(request.clone()),
            namespace: Some(namespace.clone()),
            labels: Some(labels),
            // Held from the start: a move must not carry a request whose progress it drops.
            annotations: Some(
                [(
                    BLOCK_MOVE_ANNOTATION.to_owned(),
                    BLOCK_MOVE_OWNER.to_owned(),
                )]
                .into(),
            ),
            owner_references: Some(vec![OwnerReference {
                api_version: Cluster::api_version(&ctx.capi).into_owned(),
                kind: "Cluster".into(),
                name: name.clone(),
                uid: uid.clone(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..Default::default()
        },
        spec: CertificateRefreshSpec {
            target: Target {
                cluster: Some(name.clone()),
                ..Default::default()
            },
            ttl: ttl.clone(),
            origin: Origin::Manual,
            requested_by: cluster.trigger_manager.clone(),
            max_parallel_workers: None,
            continue_on_failure: false,
            suspend: false,
        },
        status: None,
    };
    let params = PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    match api.create(&params, &object).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(err) => return Err(err.into()),
    }
    let ops = vec![
        test("/metadata/uid", &uid),
        test(&pointer(REFRESH_CERTIFICATES), &ttl),
        json!({ "op": "remove", "path": pointer(REFRESH_CERTIFICATES) }),
        json!({ "op": "remove", "path": pointer(FLEET_REQUEST_PENDING) }),
        json!({ "op": "add", "path": pointer(FLEET_REQUEST), "value": request }),
        json!({ "op": "add", "path": pointer(REFRESH_CERTIFICATES_STATUS), "value": RefreshStatus::InProgress.as_str() }),
    ];
    if patch(&clusters, &name, ops).await? {
        info!(cluster = name, request, ttl, "Fleet refresh requested");
        let event = Event {
            type_: EventType::Normal,
            reason: "CertificatesFleetRefreshRequested".into(),
            note: Some(format!(
                "CertificateRefresh {request} refreshes the certificates of the cluster's Machines for {ttl}; follow it with `kubectl get certificaterefresh {request} -n {namespace}`"
            )),
            action: "RefreshCertificates".into(),
            secondary: None,
        };
        if let Err(err) = ctx
            .recorder
            .publish(&event, &cluster.object_ref(&ctx.capi))
            .await
        {
            warn!(error = %err, "Publishing an Event failed");
        }
    }
    Ok(Action::await_change())
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

/// Applies a guarded JSON Patch; `false` when a guard failed (the Cluster changed meanwhile: the
/// next reconcile sees the change) or the Cluster is gone.
async fn patch(clusters: &Api<Cluster>, name: &str, ops: Vec<Value>) -> Result<bool, Error> {
    let patch: json_patch::Patch = match serde_json::from_value(Value::Array(ops)) {
        Ok(patch) => patch,
        Err(err) => {
            warn!(error = %err, "Building a Cluster patch failed");
            return Ok(false);
        }
    };
    match clusters
        .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 422 || status.code == 404 => Ok(false),
        Err(err) => Err(err.into()),
    }
}
