//! The refresh-trigger admission webhook: one controller acts on a refresh request, even beside
//! the CK8s bootstrap provider.
//!
//! Every CK8s management cluster runs the CK8s bootstrap provider, whose CertificatesReconciler
//! reacts to the same trigger annotation and has no switch to turn it off. It reads Machines
//! from its informer cache and stands aside only when it sees `in-progress` next to a trigger
//! (design.md section 8, item 2). So the trigger and `in-progress` must appear in one write, before
//! any informer sees the Machine: a mutating webhook on Machines adds, in the same write that
//! sets or changes `v1beta2.k8sd.io/refresh-certificates`,
//! - `v1beta2.k8sd.io/refresh-certificates-status: in-progress`, and
//! - `certificates.ck8s.io/refresh-request: <admission request UID>`, which names the request
//!   (the operation record keeps it; see `controllers::machine::step`).
//!
//! The MutatingWebhookConfiguration (`config/webhook`) limits calls to writes that set or change
//! the trigger (`matchConditions`) and uses `failurePolicy: Fail`: while no replica serves the
//! webhook, a new trigger is refused with the API server's message instead of being handled by
//! the other reconciler. Everything else about a Machine never waits for us.
//!
//! The same call refuses a trigger the controller would refuse (a TTL outside the grammar or its
//! bounds, a worker TTL a CertificateSigningRequest cannot carry, a TTL outside `--min-ttl` to
//! `--max-ttl`, also on a fleet trigger or a new CertificateRefresh: `refresh::trigger::check_trigger`, decided
//! from the Machine alone), with the message the controller would report, so a typo fails at the
//! keyboard and nothing is stored. A trigger on a Machine being created, or set through
//! server-side apply, is accepted with that message as a warning instead: its owner (a MachineSet
//! or control-plane provider copying a machine template, a GitOps tool) would otherwise be
//! stalled, and the controller refuses it as before. Accepted values that probably do not do what
//! was meant (a TTL under a day where the band allows one, a paused Machine, one without a node) come back as admission
//! warnings, which kubectl prints. The controller keeps its own checks for clusters without the
//! webhook.
//!
//! [`decide`] is the pure decision; [`server`] serves it over TLS; [`certificate`] keeps the
//! serving certificate (in a Secret, shared by the replicas) and the configurations' caBundle.
//! The same server answers the policy webhook, a validating one of its own ([`policies`]: a
//! CertificateRenewalPolicy that cannot keep its promise is refused).

pub mod certificate;
pub mod policies;
pub mod requests;
pub mod server;
#[cfg(test)]
mod testing;

use ck8s_certs_api::annotations::{
    REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS, REFRESH_REQUEST, RefreshStatus,
};
use ck8s_certs_api::capi::{PAUSED_ANNOTATION, WATCH_FILTER_LABEL};
use ck8s_certs_api::machine::MachineView;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use serde_json::json;

use crate::policy::Ttl;
use crate::refresh::band::TtlBand;
use crate::refresh::trigger::check_trigger;

/// Everything the webhook needs, from the flags.
#[derive(Clone, Debug)]
pub struct Settings {
    pub address: std::net::SocketAddr,
    /// The MutatingWebhookConfiguration whose caBundle we keep.
    pub configuration: String,
    /// The ValidatingWebhookConfiguration of the policy webhook, whose caBundle we keep too.
    pub policy_configuration: String,
    pub certificate: certificate::Settings,
    pub scope: Scope,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("admission webhook: {0}")]
    Certificate(#[from] certificate::CertificateError),
    #[error("admission webhook: {0}")]
    Serve(#[from] server::ServeError),
}

/// How often the Secret is checked even without a change (renewal, the replaced CA's end).
const RENEWAL_CHECK: std::time::Duration = std::time::Duration::from_secs(12 * 3600);

/// Between writing (or seeing) a new caBundle and serving a certificate of the new CA: the API
/// servers' caches of the configuration catch up first.
const BUNDLE_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// A failed Secret check or caBundle write is tried again after this long.
const RETRY: std::time::Duration = std::time::Duration::from_secs(30);

/// Gets (or creates) the serving certificate, starts serving, and keeps the certificate and
/// the configuration's caBundle current: the Secret is watched (every replica serves what it
/// holds, re-issued when it fails its checks or nears its end), and the caBundle is put back
/// whenever the configuration is re-applied without it (clusterctl upgrade, kubectl apply).
/// Fails when the certificate cannot be had or the address cannot be bound; a missing
/// configuration is only logged (the webhook is then not called, and requests are not marked).
pub async fn start(
    client: &kube::Client,
    settings: Settings,
) -> Result<tokio::task::JoinHandle<()>, StartError> {
    let current = certificate::ensure(client, &settings.certificate, None).await?;
    let certificates = server::Certificates::new(&current.pem)?;
    let server = server::serve(
        settings.address,
        certificates.clone(),
        settings.scope.clone(),
        server::Limits::default(),
    )
    .await?;
    let client = client.clone();
    Ok(tokio::spawn(async move {
        let keeper = keep_current(&client, &settings, certificates, current);
        keeper.await;
        server.abort();
    }))
}

/// Watches the Secret and the configuration, and checks the Secret on a timer: serves what the
/// Secret holds and writes the caBundle it implies where the configuration differs. A write is
/// always preceded by a fresh read of the Secret, so a replica never writes a bundle it merely
/// remembers (two replicas holding different ones would overwrite each other forever). Runs
/// until aborted.
async fn keep_current(
    client: &kube::Client,
    settings: &Settings,
    certificates: std::sync::Arc<server::Certificates>,
    mut current: certificate::Current,
) {
    use futures::StreamExt;
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    use k8s_openapi::api::core::v1::Secret;
    use kube::runtime::{WatchStreamExt, watcher};
    let by_name = |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
    let configurations: kube::Api<MutatingWebhookConfiguration> = kube::Api::all(client.clone());
    let configuration = watcher(configurations, by_name(&settings.configuration))
        .default_backoff()
        .applied_objects();
    let policy_configurations: kube::Api<ValidatingWebhookConfiguration> =
        kube::Api::all(client.clone());
    let policy_configuration = watcher(
        policy_configurations,
        by_name(&settings.policy_configuration),
    )
    .default_backoff()
    .applied_objects();
    let secrets: kube::Api<Secret> =
        kube::Api::namespaced(client.clone(), &settings.certificate.namespace);
    // Raw events: a deleted Secret (the documented CA rotation) matters as much as a changed one.
    let secret = watcher(secrets, by_name(&settings.certificate.secret)).default_backoff();
    futures::pin_mut!(configuration, policy_configuration, secret);
    let mut renewal = tokio::time::interval(RENEWAL_CHECK);
    renewal.tick().await;
    let retry = tokio::time::sleep(RETRY);
    tokio::pin!(retry);
    let mut retrying = false;
    loop {
        // Whether the configuration is to be checked even if the Secret's bundle did not change.
        let configuration_too = tokio::select! {
            change = configuration.next() => match change {
                Some(Ok(seen)) if certificate::bundle_differs(&seen, &current.bundle) => true,
                Some(Ok(_)) => continue,
                Some(Err(err)) => {
                    tracing::warn!(configuration = %settings.configuration, error = %err, "Watching the MutatingWebhookConfiguration failed; retrying");
                    continue;
                }
                None => return,
            },
            change = policy_configuration.next() => match change {
                Some(Ok(seen)) if certificate::bundle_differs(&seen, &current.bundle) => true,
                Some(Ok(_)) => continue,
                Some(Err(err)) => {
                    tracing::warn!(configuration = %settings.policy_configuration, error = %err, "Watching the ValidatingWebhookConfiguration failed; retrying");
                    continue;
                }
                None => return,
            },
            change = secret.next() => match change {
                Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone)) => false,
                Some(Ok(_)) => continue,
                Some(Err(err)) => {
                    tracing::warn!(secret = %settings.certificate.secret, error = %err, "Watching the webhook certificate Secret failed; retrying");
                    continue;
                }
                None => return,
            },
            _ = renewal.tick() => false,
            _ = &mut retry, if retrying => true,
        };
        retrying = !refresh(
            client,
            settings,
            &certificates,
            &mut current,
            configuration_too,
        )
        .await;
        if retrying {
            retry.as_mut().reset(tokio::time::Instant::now() + RETRY);
        }
    }
}

/// Reads the Secret (re-issuing what fails its checks), puts its bundle into the configuration
/// if it changed (or `configuration_too`), then serves its certificate: in that order, so the
/// API server trusts a new CA before any replica serves a certificate of it. `false` when
/// something failed and is to be tried again (the certificate served so far stays).
async fn refresh(
    client: &kube::Client,
    settings: &Settings,
    certificates: &server::Certificates,
    current: &mut certificate::Current,
    configuration_too: bool,
) -> bool {
    let fresh = match certificate::ensure(client, &settings.certificate, Some(&current.pem)).await {
        Ok(fresh) => fresh,
        Err(err) => {
            tracing::warn!(error = %err, "Checking the webhook certificate failed; retrying in 30s");
            return false;
        }
    };
    let new_bundle = fresh.bundle != current.bundle;
    let mut policies = true;
    if new_bundle || configuration_too {
        use k8s_openapi::api::admissionregistration::v1::{
            MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
        };
        let bundle = &fresh.bundle;
        if !inject::<MutatingWebhookConfiguration>(client, &settings.configuration, bundle).await {
            return false;
        }
        // The policy webhook's configuration does not hold the certificate back: while it
        // lacks the bundle, policies are written unchecked (its failurePolicy is Ignore), and
        // it is tried again in 30s.
        policies = inject::<ValidatingWebhookConfiguration>(
            client,
            &settings.policy_configuration,
            bundle,
        )
        .await;
        if new_bundle {
            tokio::time::sleep(BUNDLE_SETTLE).await;
        }
    }
    if fresh.pem != current.pem {
        if let Err(err) = certificates.replace(&fresh.pem) {
            tracing::error!(error = %err, "Using the webhook certificate of the Secret failed; retrying in 30s");
            return false;
        }
        tracing::info!(secret = %settings.certificate.secret, new_ca = fresh.pem.ca != current.pem.ca, "Serving the webhook certificate of the Secret");
    }
    *current = fresh;
    policies
}

/// Writes `bundle` where the configuration differs; `false` when that failed.
async fn inject<C: certificate::Configuration>(
    client: &kube::Client,
    configuration: &str,
    bundle: &str,
) -> bool {
    use certificate::Injected;
    let kind = C::KIND;
    match certificate::inject_ca_bundle::<C>(client, configuration, bundle).await {
        Ok(Injected::Written) => {
            tracing::info!(%kind, %configuration, "Set the webhook's caBundle");
            true
        }
        Ok(Injected::AlreadySet) => true,
        Ok(Injected::NoConfiguration) => {
            tracing::debug!(%kind, %configuration, "No webhook configuration to set the caBundle of");
            true
        }
        Err(err) => {
            tracing::warn!(error = %err, "Setting the webhook's caBundle failed; retrying in 30s");
            false
        }
    }
}

/// Which Machines this controller handles (`--namespace`, `--watch-filter`): requests for others
/// are left alone, for the controller that handles them.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    pub namespace: Option<String>,
    pub watch_filter: Option<String>,
    /// The lifetimes a refresh may ask for (`--min-ttl`, `--max-ttl`), as the controller checks.
    pub band: TtlBand,
    /// `--renewal-backoff-min`/`-max`: the backoff a policy's promise is checked with.
    pub backoff: crate::policy::Backoff,
}

impl Scope {
    fn covers(&self, machine: &MachineView) -> bool {
        self.namespace
            .as_ref()
            .is_none_or(|ns| *ns == machine.namespace)
            && self
                .watch_filter
                .as_ref()
                .is_none_or(|f| machine.labels.get(WATCH_FILTER_LABEL) == Some(f))
    }
}

/// What the webhook does with one write.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Not a new refresh request of ours (no trigger, an unchanged or removed one, not a CK8s
    /// Machine, not in our scope): allowed as it is.
    Pass,
    /// A new request: marked ours in the same write, with warnings for a value that is accepted
    /// but probably not what was meant.
    Mark {
        patch: json_patch::Patch,
        warnings: Vec<String>,
    },
    /// A trigger the controller would refuse: the write is denied with the message the
    /// controller would report, so nothing is stored and `kubectl annotate` fails at once.
    Deny(String),
}

/// A TTL this short is accepted but warned about: the node's certificates would expire within
/// a day of the refresh (often `m`, minutes, typed for months).
const SHORT_TTL_SECONDS: i64 = 24 * 3600;

/// The decision for one admission request. Pure: the request is all it reads.
pub fn decide(request: &AdmissionRequest<DynamicObject>, scope: &Scope) -> Decision {
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return Decision::Pass;
    }
    let Some(object) = request.object.as_ref() else {
        return Decision::Pass;
    };
    match request.kind.kind.as_str() {
        "Machine" => {}
        "CertificateRefresh" => {
            if let Some(refusal) = requests::refuse_request(request, object, scope.band) {
                return Decision::Deny(refusal);
            }
            return mark(requests::stamp_request(request), Vec::new());
        }
        // A fleet trigger (on a Cluster, MachineDeployment or CK8sControlPlane): its author is
        // written, and a TTL outside the band refused; the fleet request it becomes checks the
        // rest and reports.
        _ => return fleet_trigger(request, object, scope.band),
    }
    let machine = MachineView::from_dynamic(object);
    if !machine.is_ck8s() || !scope.covers(&machine) {
        return Decision::Pass;
    }
    let Some(trigger) = machine.annotation(REFRESH_CERTIFICATES) else {
        return Decision::Pass;
    };
    let before = request
        .old_object
        .as_ref()
        .map(MachineView::from_dynamic)
        .and_then(|old| old.annotation(REFRESH_CERTIFICATES).map(str::to_owned));
    // Unchanged (our own status writes; a bad value stored before the webhook was installed
    // must not make the Machine unwritable).
    if before.as_deref() == Some(trigger) {
        return Decision::Pass;
    }
    let warnings = if machine.deleting {
        // The controller leaves a Machine that is going away alone: nothing to refuse.
        vec![format!(
            "Machine {} is being deleted: its certificates will not be refreshed",
            machine.name
        )]
    } else {
        // Set when the Machine is created (by a MachineSet or a control-plane provider copying a
        // template written before the template-trigger policy), or through server-side apply (an
        // owner that asserts it: Cluster API syncing a template, a GitOps tool): a denial would
        // stall that owner (Cluster API's MachineSet creates no Machines while one cannot be
        // synced), so the controller refuses the trigger instead, and the writer is told why.
        let owned = request.operation == Operation::Create || machine.trigger_applied;
        match check_trigger(&machine, trigger, scope.band) {
            Ok(ttl) => surprises(&machine, trigger, ttl),
            Err(refusal) if owned => vec![refusal.message(&machine)],
            Err(refusal) => return Decision::Deny(refusal.message(&machine)),
        }
    };
    let key = |k: &str| {
        format!(
            "/metadata/annotations/{}",
            k.replace('~', "~0").replace('/', "~1")
        )
    };
    // The annotations map exists: it holds the trigger.
    let mut ops = vec![
        json!({ "op": "add", "path": key(REFRESH_CERTIFICATES_STATUS), "value": RefreshStatus::InProgress.as_str() }),
        json!({ "op": "add", "path": key(REFRESH_REQUEST), "value": request.uid }),
    ];
    ops.extend(requests::trigger_author(request));
    // String values always make a patch; should they not, allow the write unmarked.
    mark(serde_json::from_value(json!(ops)).ok(), warnings)
}

/// A new or changed trigger on a Cluster, MachineDeployment or CK8sControlPlane: marked with
/// its author.
fn fleet_trigger(
    request: &AdmissionRequest<DynamicObject>,
    object: &DynamicObject,
    band: TtlBand,
) -> Decision {
    let trigger = |o: &DynamicObject| {
        o.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REFRESH_CERTIFICATES))
            .cloned()
    };
    let Some(now) = trigger(object) else {
        return Decision::Pass;
    };
    if request.old_object.as_ref().and_then(trigger).as_ref() == Some(&now) {
        return Decision::Pass;
    }
    // As for a Machine: an owner's write (a create, server-side apply) is warned, not stalled;
    // the fleet request it becomes is then refused with the same message.
    let mut warnings = Vec::new();
    if let Some(refusal) = band.refuse_request(&now) {
        let owned = request.operation == Operation::Create
            || MachineView::trigger_set_by_apply(&object.metadata);
        if !owned {
            return Decision::Deny(refusal);
        }
        warnings.push(refusal);
    }
    let author = requests::trigger_author(request).map(|op| json!([op]));
    mark(
        author.and_then(|ops| serde_json::from_value(ops).ok()),
        warnings,
    )
}

fn mark(patch: Option<json_patch::Patch>, warnings: Vec<String>) -> Decision {
    match patch {
        Some(patch) => Decision::Mark { patch, warnings },
        None => Decision::Pass,
    }
}

/// Warnings for a valid trigger that will not do what a person probably expects, decided from
/// the Machine alone (no API reads: the answer stays a pure function of the request).
fn surprises(machine: &MachineView, trigger: &str, ttl: Ttl) -> Vec<String> {
    let mut warnings = Vec::new();
    if ttl.as_seconds() < SHORT_TTL_SECONDS {
        let minutes = trigger
            .trim()
            .strip_suffix('m')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        warnings.push(format!(
            "TTL {trigger}: the new certificates will expire {ttl} after the refresh, in less than a day{}",
            if minutes {
                " (m is minutes; months are mo, e.g. 6mo)"
            } else {
                ""
            }
        ));
    }
    if machine.annotation(PAUSED_ANNOTATION).is_some() {
        warnings.push(format!(
            "Machine {} is paused ({PAUSED_ANNOTATION}): the refresh starts once that annotation is removed",
            machine.name
        ));
    }
    if machine.node_name.is_none() {
        warnings.push(format!(
            "Machine {} has no node yet (status.nodeRef): the refresh starts once it has one",
            machine.name
        ));
    }
    warnings
}

/// The answer to one review: allowed unchanged, allowed and marked ours (with any warnings), or
/// denied as invalid with the controller's message.
/// `response` refused with `message` as 422 Invalid, as for a field the API server itself
/// rejects: kubectl prints "The request is invalid: …" with our message.
fn invalid(response: AdmissionResponse, message: String) -> AdmissionResponse {
    let mut denied = response.deny(message);
    denied.result.code = 422;
    denied.result.reason = "Invalid".into();
    denied
}

pub fn review(request: &AdmissionRequest<DynamicObject>, scope: &Scope) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    let machine = || {
        format!(
            "{}/{}",
            request.namespace.as_deref().unwrap_or(""),
            request.name
        )
    };
    match decide(request, scope) {
        Decision::Pass => response,
        Decision::Deny(message) => {
            tracing::info!(
                Machine = %machine(),
                request = %request.uid,
                user = %request.user_info.username.as_deref().unwrap_or(""),
                reason = %message,
                "Denied a refresh trigger the controller would refuse"
            );
            invalid(response, message)
        }
        Decision::Mark { patch, warnings } => {
            tracing::info!(
                kind = %request.kind.kind,
                object = %machine(),
                request = %request.uid,
                user = %request.user_info.username.as_deref().unwrap_or(""),
                "Marking a new refresh request at admission"
            );
            match response.with_patch(patch) {
                Ok(mut patched) => {
                    patched.warnings = (!warnings.is_empty()).then_some(warnings);
                    patched
                }
                // Serialising a patch of two strings cannot fail; should it, allow unmarked.
                Err(err) => {
                    tracing::warn!(error = %err, "Could not serialise the admission patch");
                    AdmissionResponse::from(request)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every lifetime the grammar allows, so that the other checks are tested alone; the band's
    /// own test uses the flags' defaults.
    fn wide() -> Scope {
        Scope {
            band: TtlBand::new("1s".parse().unwrap(), "10000y".parse().unwrap()).unwrap(),
            ..Scope::default()
        }
    }

    fn machine(annotations: serde_json::Value, labels: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1",
            "kind": "Machine",
            "metadata": { "name": "m", "namespace": "fleet", "uid": "u", "annotations": annotations, "labels": labels },
            "spec": {
                "clusterName": "c",
                "bootstrap": { "configRef": { "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "CK8sConfig", "name": "m" } }
            },
            "status": { "nodeRef": { "name": "n" } }
        })
    }

    /// A control-plane Machine (the role is its label).
    fn control_plane(annotations: serde_json::Value) -> serde_json::Value {
        machine(annotations, json!({ "cluster.x-k8s.io/control-plane": "" }))
    }

    fn worker(annotations: serde_json::Value) -> serde_json::Value {
        machine(annotations, json!({}))
    }

    /// The trigger last set by `manager` through `operation` (`Apply` or `Update`).
    fn set_by(mut object: serde_json::Value, manager: &str, operation: &str) -> serde_json::Value {
        object["metadata"]["managedFields"] = json!([{
            "manager": manager,
            "operation": operation,
            "apiVersion": "cluster.x-k8s.io/v1beta1",
            "time": "2026-01-01T00:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": { "f:metadata": { "f:annotations": { format!("f:{REFRESH_CERTIFICATES}"): {} } } }
        }]);
        object
    }

    fn request(
        operation: &str,
        object: serde_json::Value,
        old: Option<serde_json::Value>,
    ) -> AdmissionRequest<DynamicObject> {
        serde_json::from_value(json!({
            "uid": "req-1",
            "kind": { "group": "cluster.x-k8s.io", "version": "v1beta1", "kind": "Machine" },
            "resource": { "group": "cluster.x-k8s.io", "version": "v1beta1", "resource": "machines" },
            "name": "m",
            "namespace": "fleet",
            "operation": operation,
            "userInfo": { "username": "alice" },
            "object": object,
            "oldObject": old,
        }))
        .unwrap()
    }

    /// An update that sets the trigger to `ttl` on `object` (which had none).
    fn annotate(object: impl Fn(serde_json::Value) -> serde_json::Value, ttl: &str) -> Decision {
        let new = object(json!({ REFRESH_CERTIFICATES: ttl }));
        let old = object(json!({}));
        decide(&request("UPDATE", new, Some(old)), &wide())
    }

    fn applied(patch: &json_patch::Patch, mut object: serde_json::Value) -> serde_json::Value {
        json_patch::patch(&mut object, patch).unwrap();
        object["metadata"]["annotations"].clone()
    }

    /// What the controller would report for `ttl` on `object`.
    fn controller_message(object: &serde_json::Value, ttl: &str) -> String {
        let view = MachineView::from_dynamic(&serde_json::from_value(object.clone()).unwrap());
        check_trigger(&view, ttl, wide().band)
            .unwrap_err()
            .message(&view)
    }

    fn marked(decision: Decision) -> (json_patch::Patch, Vec<String>) {
        match decision {
            Decision::Mark { patch, warnings } => (patch, warnings),
            other => panic!("not marked: {other:?}"),
        }
    }

    #[test]
    fn a_new_trigger_is_marked_in_progress_and_named_in_the_same_write() {
        let new = control_plane(json!({ REFRESH_CERTIFICATES: "1y" }));
        let old = control_plane(json!({}));
        let (patch, warnings) = marked(decide(&request("UPDATE", new.clone(), Some(old)), &wide()));
        assert_eq!(
            applied(&patch, new),
            json!({ REFRESH_CERTIFICATES: "1y", REFRESH_CERTIFICATES_STATUS: "in-progress", REFRESH_REQUEST: "req-1",
                ck8s_certs_api::annotations::REQUESTER: "alice" })
        );
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn a_fleet_trigger_is_marked_with_its_author_only_when_it_changes() {
        let cluster = |annotations: serde_json::Value| {
            json!({ "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": { "name": "c", "namespace": "fleet", "annotations": annotations } })
        };
        let as_cluster = |mut request: AdmissionRequest<DynamicObject>| {
            request.kind.kind = "Cluster".into();
            request
        };
        let new = cluster(json!({ REFRESH_CERTIFICATES: "1y" }));
        let (patch, _) = marked(decide(
            &as_cluster(request("UPDATE", new.clone(), Some(cluster(json!({}))))),
            &wide(),
        ));
        assert_eq!(
            applied(&patch, new.clone()),
            json!({ REFRESH_CERTIFICATES: "1y", ck8s_certs_api::annotations::REQUESTER: "alice" })
        );
        assert_eq!(
            decide(
                &as_cluster(request("UPDATE", new.clone(), Some(new))),
                &wide()
            ),
            Decision::Pass
        );
    }

    /// The flags' defaults: 1d to 1y.
    fn band() -> Scope {
        Scope::default()
    }

    #[test]
    fn a_trigger_outside_the_band_is_denied_with_the_controllers_message() {
        let controller = |object: &serde_json::Value, ttl: &str| {
            let view = MachineView::from_dynamic(&serde_json::from_value(object.clone()).unwrap());
            check_trigger(&view, ttl, band().band)
                .unwrap_err()
                .message(&view)
        };
        for object in [control_plane, worker] {
            let update = |ttl: &str| {
                let new = object(json!({ REFRESH_CERTIFICATES: ttl }));
                decide(&request("UPDATE", new, Some(object(json!({})))), &band())
            };
            let mut refused = vec![
                ("23h59m59s", "below the minimum 1d (--min-ttl)"),
                ("1y1s", "TTL 1y1s is above the maximum 1y (--max-ttl)"),
            ];
            // A worker's 1m and 10000y are outside what its CSRs can carry, which is said first.
            if object(json!({}))["metadata"]["labels"]
                .get("cluster.x-k8s.io/control-plane")
                .is_some()
            {
                refused.push(("1m", "TTL 1m is below the minimum 1d (--min-ttl)"));
                refused.push(("10000y", "TTL 10000y is above the maximum 1y (--max-ttl)"));
            }
            for (ttl, why) in refused {
                let Decision::Deny(message) = update(ttl) else {
                    panic!("{ttl} was not denied");
                };
                let stored = object(json!({ REFRESH_CERTIFICATES: ttl }));
                assert_eq!(message, controller(&stored, ttl));
                assert!(
                    message.contains(why) && message.contains("a TTL from 1d to 1y"),
                    "{message}"
                );
            }
            for ttl in ["1d", "24h", "90d", "1y", "365d"] {
                let (_, warnings) = marked(update(ttl));
                assert!(warnings.is_empty(), "{ttl}: {warnings:?}");
            }
            // An owner's write (a Machine created with it) is warned: the controller refuses it.
            let created = object(json!({ REFRESH_CERTIFICATES: "1m" }));
            let (_, warnings) = marked(decide(&request("CREATE", created.clone(), None), &band()));
            assert_eq!(warnings, [controller(&created, "1m")]);
        }
    }

    #[test]
    fn a_request_or_fleet_trigger_outside_the_band_is_denied_but_the_controllers_are_not() {
        let refresh = |ttl: &str, labels: serde_json::Value, requester: serde_json::Value| {
            let review = crate::admission::testing::review(
                ["certificates.ck8s.io", "v1alpha1", "CertificateRefresh"],
                "certificaterefreshes",
                "CREATE",
                json!({ "username": "alice", "uid": "a-1" }),
                json!({ "apiVersion": "certificates.ck8s.io/v1alpha1", "kind": "CertificateRefresh",
                    "metadata": { "name": "r", "namespace": "fleet", "labels": labels },
                    "spec": { "target": { "machine": "m" }, "ttl": ttl, "origin": "Manual",
                        "requester": requester } }),
                serde_json::Value::Null,
            );
            let review: kube::core::admission::AdmissionReview<DynamicObject> =
                serde_json::from_value(review).unwrap();
            let request: AdmissionRequest<DynamicObject> = review.try_into().unwrap();
            decide(&request, &band())
        };
        let no_one = serde_json::Value::Null;
        let alice = json!({ "username": "alice" });
        for ttl in ["1m", "10000y"] {
            // Made by hand, the requester left out or naming its maker.
            for requester in [&no_one, &alice] {
                let Decision::Deny(message) = refresh(ttl, json!({}), requester.clone()) else {
                    panic!("{ttl} was not denied");
                };
                assert_eq!(Some(message), band().band.refuse_request(ttl));
            }
            // The controller's: a Machine's record (never acted on), a fleet request naming the
            // trigger's author. Checked where they are acted on.
            let record = json!({ ck8s_certs_api::certificate_refresh::labels::MACHINE: "m" });
            assert!(!matches!(
                refresh(ttl, record, no_one.clone()),
                Decision::Deny(_)
            ));
            assert!(!matches!(
                refresh(ttl, json!({}), json!({ "username": "bob" })),
                Decision::Deny(_)
            ));
        }
        assert!(matches!(
            refresh("1y", json!({}), no_one.clone()),
            Decision::Mark { .. }
        ));
        // An unparsable TTL is left to the controller, which names the grammar.
        assert!(!matches!(
            refresh("1yr", json!({}), no_one),
            Decision::Deny(_)
        ));

        let cluster = |ttl: &str| {
            json!({ "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": { "name": "c", "namespace": "fleet",
                    "annotations": { REFRESH_CERTIFICATES: ttl } } })
        };
        let as_cluster = |operation: &str, object: serde_json::Value| {
            let mut request = request(operation, object, None);
            request.kind.kind = "Cluster".into();
            decide(&request, &band())
        };
        let Decision::Deny(message) = as_cluster("UPDATE", cluster("1m")) else {
            panic!("a fleet trigger of 1m was not denied");
        };
        assert!(
            message.contains("below the minimum 1d (--min-ttl)"),
            "{message}"
        );
        let (_, warnings) = marked(as_cluster("CREATE", cluster("10000y")));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        let (_, warnings) = marked(as_cluster("UPDATE", cluster("1y")));
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn a_changed_trigger_and_a_machine_created_with_one_are_new_requests() {
        let new =
            worker(json!({ REFRESH_CERTIFICATES: "90d", REFRESH_CERTIFICATES_STATUS: "done" }));
        let old = worker(
            json!({ REFRESH_CERTIFICATES: "1y", REFRESH_CERTIFICATES_STATUS: "in-progress" }),
        );
        let (patch, _) = marked(decide(&request("UPDATE", new.clone(), Some(old)), &wide()));
        assert_eq!(
            applied(&patch, new)[REFRESH_CERTIFICATES_STATUS],
            "in-progress"
        );
        let created = worker(json!({ REFRESH_CERTIFICATES: "1y" }));
        marked(decide(&request("CREATE", created, None), &wide()));
    }

    #[test]
    fn every_valid_ttl_is_accepted_without_a_warning() {
        for ttl in [
            "1y", "6mo", "90d", "2w", "36h", "1d12h30m", "1y6mo", " 1Y ", "10000y",
        ] {
            let (_, warnings) = marked(annotate(control_plane, ttl));
            assert!(warnings.is_empty(), "{ttl}: {warnings:?}");
        }
        // A worker: from 10m (CSR minimum; under a day, so warned) to 68y (int32 seconds).
        for ttl in ["1d", "1y", "68y"] {
            let (_, warnings) = marked(annotate(worker, ttl));
            assert!(warnings.is_empty(), "{ttl}: {warnings:?}");
        }
    }

    #[test]
    fn a_trigger_outside_the_grammar_is_denied_with_the_controllers_message() {
        for ttl in [
            "1yr", "abc", "", " ", "1.5h", "1,5h", "-1h", "+1h", "0", "0s", "90", "1M", "30m1h",
            "1h1h", "1h 30m", "1e3s", "1 y", "１y",
        ] {
            let object = control_plane(json!({ REFRESH_CERTIFICATES: ttl }));
            let Decision::Deny(message) = annotate(control_plane, ttl) else {
                panic!("{ttl:?} was not denied");
            };
            assert_eq!(message, controller_message(&object, ttl), "{ttl:?}");
            assert!(
                message.starts_with("Refusing to refresh: invalid TTL")
                    && message.contains("expected a positive duration such as 1y")
                    && message.ends_with(
                        ". Renew now: kubectl annotate machines.cluster.x-k8s.io m -n fleet v1beta2.k8sd.io/refresh-certificates=1y --overwrite"
                    ),
                "{ttl:?}: {message}"
            );
        }
        // Pinned once: the text a person sees for the typo the docs use.
        let Decision::Deny(message) = annotate(worker, "1yr") else {
            panic!("1yr was not denied");
        };
        assert!(
            message.starts_with(
                "Refusing to refresh: invalid TTL \"1yr\": unknown unit \"yr\"; expected a positive duration such as 1y, 6mo, 90d, 12h, 1h30m or 1y6mo"
            ),
            "{message}"
        );
    }

    #[test]
    fn a_trigger_out_of_bounds_is_denied_with_the_controllers_message() {
        // Longer than the grammar allows, for any node.
        for object in [control_plane, worker] {
            let Decision::Deny(message) = annotate(object, "10001y") else {
                panic!("10001y was not denied");
            };
            assert!(message.contains("longer than 10000y"), "{message}");
        }
        // What a worker's CSR cannot carry; a control plane takes it.
        for (ttl, why) in [
            ("69y", "too long for a worker node"),
            ("9m", "too short for a worker node"),
            ("599s", "too short for a worker node"),
        ] {
            let object = worker(json!({ REFRESH_CERTIFICATES: ttl }));
            let Decision::Deny(message) = annotate(worker, ttl) else {
                panic!("{ttl} was not denied on a worker");
            };
            assert_eq!(message, controller_message(&object, ttl));
            assert!(
                message.contains(why)
                    && message.contains("annotate again with a TTL from 10m to 68y"),
                "{message}"
            );
            marked(annotate(control_plane, ttl));
        }
        let (_, warnings) = marked(annotate(worker, "10m"));
        assert_eq!(warnings.len(), 1, "under a day: {warnings:?}");
    }

    #[test]
    fn a_short_ttl_is_accepted_with_a_warning() {
        let (_, warnings) = marked(annotate(control_plane, "6m"));
        assert_eq!(
            warnings,
            [
                "TTL 6m: the new certificates will expire 6m after the refresh, in less than a day (m is minutes; months are mo, e.g. 6mo)"
            ]
        );
        let (_, warnings) = marked(annotate(control_plane, "23h59m"));
        assert_eq!(
            warnings,
            [
                "TTL 23h59m: the new certificates will expire 23h59m after the refresh, in less than a day"
            ]
        );
        let (_, warnings) = marked(annotate(control_plane, "24h"));
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn a_paused_machine_or_one_without_a_node_is_marked_with_a_warning() {
        let paused = |annotations: serde_json::Value| {
            let mut object = control_plane(annotations);
            object["metadata"]["annotations"][PAUSED_ANNOTATION] = json!("");
            object
        };
        let (_, warnings) = marked(annotate(paused, "1y"));
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("is paused"), "{warnings:?}");
        let nodeless = |annotations: serde_json::Value| {
            let mut object = worker(annotations);
            object["status"] = json!({});
            object
        };
        let (_, warnings) = marked(annotate(nodeless, "1y"));
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("has no node yet"), "{warnings:?}");
        // A bad value on either is still refused.
        assert!(matches!(annotate(nodeless, "1yr"), Decision::Deny(_)));
    }

    #[test]
    fn a_bad_trigger_an_owner_sets_is_accepted_with_the_controllers_message_as_a_warning() {
        // Machines are created by their owners (a MachineSet, a control-plane provider), and
        // Cluster API syncs a template's annotations by server-side apply: denying would stop
        // them from creating Machines.
        for object in [
            worker(json!({ REFRESH_CERTIFICATES: "1yr" })),
            set_by(
                worker(json!({ REFRESH_CERTIFICATES: "1yr" })),
                "kubectl-create",
                "Update",
            ),
        ] {
            let (_, warnings) = marked(decide(&request("CREATE", object.clone(), None), &wide()));
            assert_eq!(warnings, [controller_message(&object, "1yr")]);
        }
        let applied_trigger = |a: serde_json::Value| set_by(worker(a), "capi-machineset", "Apply");
        let object = applied_trigger(json!({ REFRESH_CERTIFICATES: "69y" }));
        let (_, warnings) = marked(annotate(applied_trigger, "69y"));
        assert_eq!(warnings, [controller_message(&object, "69y")]);
        // The same value set by an ordinary write (kubectl annotate, kubectl apply) is denied.
        let annotated = |a: serde_json::Value| set_by(worker(a), "kubectl-annotate", "Update");
        assert!(matches!(annotate(annotated, "1yr"), Decision::Deny(_)));
    }

    #[test]
    fn other_writes_are_left_alone() {
        let scope = Scope::default();
        for ttl in ["1y", "1yr"] {
            let with = worker(json!({ REFRESH_CERTIFICATES: ttl }));
            let without = worker(json!({}));
            // The trigger unchanged (our own status writes; a bad value stored before the
            // webhook was installed), removed, or never there.
            let unchanged = request("UPDATE", with.clone(), Some(with.clone()));
            assert_eq!(decide(&unchanged, &scope), Decision::Pass, "{ttl}");
            let removed = request("UPDATE", without.clone(), Some(with.clone()));
            assert_eq!(decide(&removed, &scope), Decision::Pass, "{ttl}");
            let never = request("UPDATE", without.clone(), Some(without.clone()));
            assert_eq!(decide(&never, &scope), Decision::Pass, "{ttl}");
            // Not a CK8s Machine: not ours to mark or refuse.
            let mut foreign = with.clone();
            foreign["spec"]["bootstrap"]["configRef"]["kind"] = json!("KubeadmConfig");
            assert_eq!(
                decide(&request("CREATE", foreign, None), &scope),
                Decision::Pass,
                "{ttl}"
            );
            // Neither a create nor an update.
            let deleted = request("DELETE", with.clone(), Some(with.clone()));
            assert_eq!(decide(&deleted, &scope), Decision::Pass, "{ttl}");
        }
    }

    #[test]
    fn a_machine_being_deleted_is_not_refused_but_warned_about() {
        let deleting = |annotations: serde_json::Value| {
            let mut object = worker(annotations);
            object["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            object
        };
        for ttl in ["1y", "1yr"] {
            let (_, warnings) = marked(annotate(deleting, ttl));
            assert_eq!(warnings.len(), 1, "{ttl}");
            assert!(warnings[0].contains("being deleted"), "{warnings:?}");
        }
    }

    #[test]
    fn requests_outside_our_scope_are_left_for_the_controller_that_handles_them() {
        let labelled = |ttl: &str| {
            machine(
                json!({ REFRESH_CERTIFICATES: ttl }),
                json!({ WATCH_FILTER_LABEL: "a" }),
            )
        };
        let mine = Scope {
            namespace: Some("fleet".into()),
            watch_filter: Some("a".into()),
            band: wide().band,
            ..Scope::default()
        };
        let update = |ttl: &str| {
            let old = machine(json!({}), json!({ WATCH_FILTER_LABEL: "a" }));
            request("UPDATE", labelled(ttl), Some(old))
        };
        marked(decide(&update("1y"), &mine));
        assert!(matches!(decide(&update("1yr"), &mine), Decision::Deny(_)));
        let other_filter = Scope {
            watch_filter: Some("b".into()),
            ..wide()
        };
        let other_namespace = Scope {
            namespace: Some("edge".into()),
            ..wide()
        };
        for scope in [other_filter, other_namespace] {
            for ttl in ["1y", "1yr"] {
                let decision = decide(&update(ttl), &scope);
                assert_eq!(decision, Decision::Pass, "{ttl} {scope:?}");
            }
        }
    }

    #[test]
    fn a_review_allows_marks_with_warnings_or_denies_as_invalid() {
        let new = control_plane(json!({ REFRESH_CERTIFICATES: "1y" }));
        let response = review(&request("CREATE", new, None), &wide());
        assert!(response.allowed);
        assert!(response.patch.is_some());
        assert_eq!(response.warnings, None);

        let short = control_plane(json!({ REFRESH_CERTIFICATES: "1h" }));
        let response = review(&request("CREATE", short, None), &wide());
        assert!(response.allowed && response.patch.is_some());
        assert_eq!(response.warnings.map(|w| w.len()), Some(1));

        let bad = control_plane(json!({ REFRESH_CERTIFICATES: "1yr" }));
        let before = control_plane(json!({}));
        let response = review(&request("UPDATE", bad.clone(), Some(before)), &wide());
        assert!(!response.allowed);
        assert!(response.patch.is_none());
        assert_eq!(response.result.code, 422);
        assert_eq!(response.result.reason, "Invalid");
        assert_eq!(response.result.message, controller_message(&bad, "1yr"));
        assert_eq!(response.uid, "req-1");

        let untouched = worker(json!({}));
        let response = review(&request("CREATE", untouched, None), &wide());
        assert!(response.allowed && response.patch.is_none());
    }
}
