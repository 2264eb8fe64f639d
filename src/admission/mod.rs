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
//! [`mutate`] is the pure decision; [`server`] serves it over TLS; [`certificate`] keeps the
//! serving certificate (in a Secret, shared by the replicas) and the configuration's caBundle.

pub mod certificate;
pub mod server;

use ck8s_certs_api::annotations::{
    REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS, REFRESH_REQUEST, RefreshStatus,
};
use ck8s_certs_api::capi::WATCH_FILTER_LABEL;
use ck8s_certs_api::machine::MachineView;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use serde_json::json;

/// Everything the webhook needs, from the flags.
#[derive(Clone, Debug)]
pub struct Settings {
    pub address: std::net::SocketAddr,
    /// The MutatingWebhookConfiguration whose caBundle we keep.
    pub configuration: String,
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

/// How often the serving certificate is checked for renewal.
const RENEWAL_CHECK: std::time::Duration = std::time::Duration::from_secs(12 * 3600);

/// Gets (or creates) the serving certificate, starts serving, and keeps the certificate and
/// the configuration's caBundle current: renewed a month before it ends, put back whenever the
/// configuration is re-applied without it (clusterctl upgrade, kubectl apply). Fails when the
/// certificate cannot be had or the address cannot be bound; a missing configuration is only
/// logged (the webhook is then not called, and requests are not marked).
pub async fn start(
    client: &kube::Client,
    settings: Settings,
) -> Result<tokio::task::JoinHandle<()>, StartError> {
    let pem = certificate::ensure(client, &settings.certificate).await?;
    let certificates = server::Certificates::new(&pem)?;
    let server = server::serve(
        settings.address,
        certificates.clone(),
        settings.scope.clone(),
    )
    .await?;
    let client = client.clone();
    Ok(tokio::spawn(async move {
        let keeper = keep_current(&client, &settings, certificates, pem);
        keeper.await;
        server.abort();
    }))
}

/// Watches the configuration (re-injecting the caBundle when it differs) and renews the
/// certificate on a timer. Runs until aborted.
async fn keep_current(
    client: &kube::Client,
    settings: &Settings,
    certificates: std::sync::Arc<server::Certificates>,
    mut pem: certificate::Pem,
) {
    use futures::StreamExt;
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use kube::runtime::{WatchStreamExt, watcher};
    let api: kube::Api<MutatingWebhookConfiguration> = kube::Api::all(client.clone());
    let config =
        watcher::Config::default().fields(&format!("metadata.name={}", settings.configuration));
    let changes = watcher(api, config).default_backoff().applied_objects();
    futures::pin_mut!(changes);
    let mut renewal = tokio::time::interval(RENEWAL_CHECK);
    renewal.tick().await;
    loop {
        tokio::select! {
            change = changes.next() => match change {
                Some(Ok(_)) => inject(client, settings, &pem).await,
                Some(Err(err)) => tracing::warn!(configuration = %settings.configuration, error = %err, "Watching the MutatingWebhookConfiguration failed; retrying"),
                None => return,
            },
            _ = renewal.tick() => match certificate::ensure(client, &settings.certificate).await {
                Ok(renewed) if renewed != pem => {
                    match certificates.replace(&renewed) {
                        Ok(()) => {
                            pem = renewed;
                            inject(client, settings, &pem).await;
                        }
                        Err(err) => tracing::error!(error = %err, "Using the renewed webhook certificate failed"),
                    }
                }
                Ok(_) => {}
                Err(err) => tracing::warn!(error = %err, "Checking the webhook certificate failed; next check in 12h"),
            },
        }
    }
}

async fn inject(client: &kube::Client, settings: &Settings, pem: &certificate::Pem) {
    match certificate::inject_ca_bundle(client, &settings.configuration, &pem.ca).await {
        Ok(true) => {
            tracing::info!(configuration = %settings.configuration, "Set the webhook's caBundle")
        }
        Ok(false) => {}
        Err(err) => {
            tracing::warn!(error = %err, "Setting the webhook's caBundle failed; retried on the next change")
        }
    }
}

/// Which Machines this controller handles (`--namespace`, `--watch-filter`): requests for others
/// are left alone, for the controller that handles them.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    pub namespace: Option<String>,
    pub watch_filter: Option<String>,
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

/// The JSON Patch that marks a new refresh request as ours, or `None` when the write is not one
/// (no trigger, an unchanged trigger, not a CK8s Machine, not in our scope).
pub fn mutate(
    request: &AdmissionRequest<DynamicObject>,
    scope: &Scope,
) -> Option<json_patch::Patch> {
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return None;
    }
    let machine = MachineView::from_dynamic(request.object.as_ref()?);
    if !machine.is_ck8s() || !scope.covers(&machine) {
        return None;
    }
    let trigger = machine.annotation(REFRESH_CERTIFICATES)?;
    let before = request
        .old_object
        .as_ref()
        .map(MachineView::from_dynamic)
        .and_then(|old| old.annotation(REFRESH_CERTIFICATES).map(str::to_owned));
    if before.as_deref() == Some(trigger) {
        return None;
    }
    let key = |k: &str| {
        format!(
            "/metadata/annotations/{}",
            k.replace('~', "~0").replace('/', "~1")
        )
    };
    // The annotations map exists: it holds the trigger.
    serde_json::from_value(json!([
        { "op": "add", "path": key(REFRESH_CERTIFICATES_STATUS), "value": RefreshStatus::InProgress.as_str() },
        { "op": "add", "path": key(REFRESH_REQUEST), "value": request.uid },
    ]))
    .ok()
}

/// The answer to one review: always allowed (we never refuse a Machine write), patched when
/// [`mutate`] says so.
pub fn review(request: &AdmissionRequest<DynamicObject>, scope: &Scope) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    match mutate(request, scope) {
        None => response,
        Some(patch) => {
            tracing::info!(
                Machine = %format!("{}/{}", request.namespace.as_deref().unwrap_or(""), request.name),
                request = %request.uid,
                "Marking a new refresh request in-progress at admission"
            );
            match response.with_patch(patch) {
                Ok(patched) => patched,
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

    fn machine(annotations: serde_json::Value, labels: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1",
            "kind": "Machine",
            "metadata": { "name": "m", "namespace": "fleet", "uid": "u", "annotations": annotations, "labels": labels },
            "spec": {
                "clusterName": "c",
                "bootstrap": { "configRef": { "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "CK8sConfig", "name": "m" } }
            }
        })
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

    fn applied(patch: &json_patch::Patch, mut object: serde_json::Value) -> serde_json::Value {
        json_patch::patch(&mut object, patch).unwrap();
        object["metadata"]["annotations"].clone()
    }

    #[test]
    fn a_new_trigger_is_marked_in_progress_and_named_in_the_same_write() {
        let new = machine(json!({ REFRESH_CERTIFICATES: "1y" }), json!({}));
        let old = machine(json!({}), json!({}));
        let patch = mutate(
            &request("UPDATE", new.clone(), Some(old)),
            &Scope::default(),
        )
        .unwrap();
        assert_eq!(
            applied(&patch, new),
            json!({ REFRESH_CERTIFICATES: "1y", REFRESH_CERTIFICATES_STATUS: "in-progress", REFRESH_REQUEST: "req-1" })
        );
    }

    #[test]
    fn a_changed_trigger_and_a_machine_created_with_one_are_new_requests() {
        let new = machine(
            json!({ REFRESH_CERTIFICATES: "90d", REFRESH_CERTIFICATES_STATUS: "done" }),
            json!({}),
        );
        let old = machine(
            json!({ REFRESH_CERTIFICATES: "1y", REFRESH_CERTIFICATES_STATUS: "in-progress" }),
            json!({}),
        );
        let patch = mutate(
            &request("UPDATE", new.clone(), Some(old)),
            &Scope::default(),
        )
        .unwrap();
        assert_eq!(
            applied(&patch, new)[REFRESH_CERTIFICATES_STATUS],
            "in-progress"
        );
        let created = machine(json!({ REFRESH_CERTIFICATES: "1y" }), json!({}));
        assert!(mutate(&request("CREATE", created, None), &Scope::default()).is_some());
    }

    #[test]
    fn other_writes_are_left_alone() {
        let with = machine(json!({ REFRESH_CERTIFICATES: "1y" }), json!({}));
        let without = machine(json!({}), json!({}));
        let scope = Scope::default();
        // The trigger unchanged (our own status writes), removed, or never there.
        assert!(mutate(&request("UPDATE", with.clone(), Some(with.clone())), &scope).is_none());
        assert!(
            mutate(
                &request("UPDATE", without.clone(), Some(with.clone())),
                &scope
            )
            .is_none()
        );
        assert!(mutate(&request("UPDATE", without.clone(), Some(without)), &scope).is_none());
        // Not a CK8s Machine.
        let mut foreign = with.clone();
        foreign["spec"]["bootstrap"]["configRef"]["kind"] = json!("KubeadmConfig");
        assert!(mutate(&request("CREATE", foreign, None), &scope).is_none());
    }

    #[test]
    fn requests_outside_our_scope_are_left_for_the_controller_that_handles_them() {
        let labelled = machine(
            json!({ REFRESH_CERTIFICATES: "1y" }),
            json!({ WATCH_FILTER_LABEL: "a" }),
        );
        let mine = Scope {
            namespace: Some("fleet".into()),
            watch_filter: Some("a".into()),
        };
        assert!(mutate(&request("CREATE", labelled.clone(), None), &mine).is_some());
        let other_filter = Scope {
            watch_filter: Some("b".into()),
            ..Scope::default()
        };
        assert!(mutate(&request("CREATE", labelled.clone(), None), &other_filter).is_none());
        let other_namespace = Scope {
            namespace: Some("edge".into()),
            ..Scope::default()
        };
        assert!(mutate(&request("CREATE", labelled, None), &other_namespace).is_none());
    }

    #[test]
    fn a_review_is_always_allowed() {
        let new = machine(json!({ REFRESH_CERTIFICATES: "1y" }), json!({}));
        let response = review(&request("CREATE", new, None), &Scope::default());
        assert!(response.allowed);
        assert!(response.patch.is_some());
    }
}
