//! Whether a request may still make the controller act, checked by the controller itself right
//! before it hands Machines over: the admission policies decide who may create a request, but
//! they can be missing (`clusterctl upgrade` deletes and re-creates a provider's components;
//! Kubernetes below 1.30 has none), and rights can be revoked after a request was admitted.
//!
//! - A request made by hand (no controlling owner: not made by the controller from a trigger)
//!   must name its requester and, before it starts, the admission policy that checks its author
//!   (`--request-policy`) and its binding must exist and be older than the request: one created
//!   while they were missing was never checked, whatever it names. (Without `--request-policy`
//!   the operator enforces the same rules some other way, and neither is looked at.)
//! - Before every hand-over of a request made by hand, a SubjectAccessReview for its requester
//!   (username, uid, groups, as the webhook wrote them) must allow `patch` or `refresh` on the
//!   target, as the policy checks at admission and as cert-manager checks a CertificateRequest's
//!   requester at approval. (A request made from a trigger names its author by username only:
//!   the trigger's write itself was authorized.)
//!
//! The check is I/O; what the planner does with its verdict is pure (`plan::World::authority`).

use ck8s_certs_api::capi::{CK8S_CONTROL_PLANE_PLURAL, CONTROL_PLANE_GROUP, GROUP};
use ck8s_certs_api::certificate_refresh::CertificateRefresh;
use ck8s_certs_api::machine_certificates::Requester;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};

use super::scope::Scope;
use crate::controllers::admission_policy::{NotInForce, in_force};

/// What a request asks to change: the group, resource and name (empty: every Machine of the
/// namespace, for a selector) the policy checks the author's rights on.
pub fn target_resource(scope: &Scope) -> (&'static str, &'static str, String) {
    match scope {
        Scope::Machine(name) => (GROUP, "machines", name.clone()),
        Scope::Cluster(name) => (GROUP, "clusters", name.clone()),
        Scope::MachineDeployment(name) => (GROUP, "machinedeployments", name.clone()),
        Scope::ControlPlane(name) => (CONTROL_PLANE_GROUP, CK8S_CONTROL_PLANE_PLURAL, name.clone()),
        Scope::Selector(_) => (GROUP, "machines", String::new()),
    }
}

/// Why `request` may not hand Machines over now (`Ok(Err)`), or that it may (`Ok(Ok)`). An API
/// error (`Err`) is retried, never a refusal. `starting`: the request has not started yet (the
/// admission policy's age is checked only then: a running request was admitted under it).
pub async fn check(
    client: &Client,
    policy: Option<&str>,
    request: &CertificateRefresh,
    starting: bool,
) -> Result<Result<(), String>, kube::Error> {
    let by_hand = !request
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true));
    if by_hand && let Some(policy) = policy {
        if request.spec.requester.is_none() {
            // The policy refuses a request without one: this one was made past it.
            return Ok(Err(format!(
                "Refused: spec.requester is missing, so nobody can be held to have asked; the admission webhook writes it and the admission policy {policy} requires it, so this request was made past them: create it again with both installed"
            )));
        }
        if starting && let Err(why) = policy_in_force(client, policy, request).await? {
            return Ok(Err(why));
        }
    }
    // A request the controller made from a trigger: the trigger's write was authorized by the
    // API server with the writer's whole identity (patch on the object). Its author is kept by
    // name only, too little for a SubjectAccessReview (rights granted through groups would look
    // revoked).
    let Some(requester) = request.spec.requester.as_ref().filter(|_| by_hand) else {
        return Ok(Ok(()));
    };
    let scope = match Scope::of(&request.spec.target) {
        Ok(scope) => scope,
        // The planner refuses it with this message.
        Err(why) => return Ok(Err(why)),
    };
    let (group, resource, name) = target_resource(&scope);
    let namespace = request.namespace().unwrap_or_default();
    for verb in ["patch", "refresh"] {
        if allowed(client, requester, group, resource, &namespace, &name, verb).await? {
            return Ok(Ok(()));
        }
    }
    let what = if name.is_empty() {
        format!("the Machines of namespace {namespace}")
    } else {
        format!("{resource}.{group} {name} in namespace {namespace}")
    };
    Ok(Err(format!(
        "Refused: its requester {} may not refresh {what} (now): that needs patch or refresh on {resource}.{group}; the controller checks it before each Machine is handed over, so rights revoked after the request was made count",
        requester.username
    )))
}

/// The policy and its binding exist and are older than `request`.
async fn policy_in_force(
    client: &Client,
    policy: &str,
    request: &CertificateRefresh,
) -> Result<Result<(), String>, kube::Error> {
    let created = request.creation_timestamp().map(|t| t.0);
    Ok(in_force(client, policy, created).await?.map_err(|why| match why {
        NotInForce::Missing(kind) => format!(
            "Refused: the {kind} {policy}, which checks who may ask for a refresh and that a request names its real author, is not installed, so nothing checked this request; reinstall ck8s-certs' admission policies (config/policy), then create the request again"
        ),
        NotInForce::Younger { written, since } => format!(
            "Refused: the request was created at {written}, before the admission policy {policy} that checks its author was in force (since {since}), so nothing checked it; create it again"
        ),
    }))
}

/// Whether `requester` may `verb` the resource, as the API server's authorizer says.
async fn allowed(
    client: &Client,
    requester: &Requester,
    group: &str,
    resource: &str,
    namespace: &str,
    name: &str,
    verb: &str,
) -> Result<bool, kube::Error> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(requester.username.clone()),
            uid: requester.uid.clone(),
            groups: Some(requester.groups.clone()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                namespace: Some(namespace.to_owned()),
                name: Some(name.to_owned()).filter(|n| !n.is_empty()),
                verb: Some(verb.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answered = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answered.status.is_some_and(|s| s.allowed))
}
