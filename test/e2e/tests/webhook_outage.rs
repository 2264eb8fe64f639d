//! A webhook outage refuses what users ask and stops nothing the controller does by itself.
//!
//! Every refresh writes a CertificateRefresh record before `run`. The request webhook
//! (`refresh-request.certificates.ck8s.io`, `failurePolicy: Fail`) used to intercept those
//! records too, so while no replica answered it (a crash loop, a NetworkPolicy, a client holding
//! every connection) no certificate of the fleet was renewed. Its `matchConditions` now leave the
//! controller's own creates out, and the admission policies (installed here as shipped) still
//! admit them.

use std::time::Duration;

use ck8s_certs_api::annotations::{REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS};
use ck8s_certs_api::certificate_refresh::CertificateRefresh;
use ck8s_certs_api::machine_certificates::{Origin, Phase};
use ck8s_certs_e2e::{controlplane, shared, webhook};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;

const FILTER: &str = "outage";
const TIMEOUT: Duration = Duration::from_secs(90);

#[tokio::test]
async fn while_the_webhook_is_down_automatic_renewals_carry_on_and_triggers_are_refused() {
    let env = shared().await;
    let [manual, automatic] = env
        .isolated("alpha", ["alpha-md-0-w0", "alpha-md-0-w1"], FILTER)
        .await;
    env.install_admission_policies().await;
    let _controller = env.start_controller_with_request_webhook(FILTER, &[]).await;
    let client = env.management().await.unwrap();

    // The outage: every entry of the configuration calls a port nobody listens on.
    let dead = controlplane::free_port().unwrap();
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let mut configuration = configurations.get(webhook::CONFIGURATION).await.unwrap();
    for entry in configuration.webhooks.iter_mut().flatten() {
        let url = entry.client_config.url.as_deref().expect("a URL");
        let path = url.splitn(4, '/').nth(3).unwrap_or_default();
        entry.client_config.url = Some(format!("https://127.0.0.1:{dead}/{path}"));
    }
    configurations
        .replace(webhook::CONFIGURATION, &Default::default(), &configuration)
        .await
        .unwrap();
    // The API server's webhook informer sees the change within a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A user's trigger is refused, and the API server says which webhook it could not reach.
    let refused = env
        .machine_api(client.clone(), &manual.namespace)
        .patch(
            &manual.machine,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { REFRESH_CERTIFICATES: "1y" } } })),
        )
        .await
        .expect_err("a trigger while the webhook is down");
    let message = refused.to_string();
    assert!(
        message.contains("refresh-trigger.certificates.ck8s.io"),
        "{message}"
    );
    assert!(
        !env.machine_annotations(&manual)
            .await
            .contains_key(REFRESH_CERTIFICATES),
        "nothing stored"
    );

    // An automatic renewal that falls due meanwhile is carried out: its record is created
    // without the webhook and admitted by the policies.
    env.create_policy(
        &automatic.namespace,
        "outage",
        FILTER,
        json!({ "policy": "Automatic", "renewBefore": "100d", "ttl": "1y" }),
    )
    .await;
    env.patch_machine(
        &automatic,
        json!({ "metadata": { "labels": { "e2e-policy": FILTER } } }),
    )
    .await;
    env.wait_for_machine(&automatic, TIMEOUT, |a| {
        a.get(REFRESH_CERTIFICATES_STATUS).map(String::as_str) == Some("done")
    })
    .await;
    let status = env
        .wait_for_status(&automatic, TIMEOUT, "the renewal recorded", |s| {
            s.operation
                .as_ref()
                .is_some_and(|op| op.phase == Phase::Succeeded)
        })
        .await;
    let op = status.operation.expect("an operation");
    assert_eq!(op.origin, Origin::Policy);
    let records: Api<CertificateRefresh> = Api::namespaced(client, &automatic.namespace);
    let record = records
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|r| r.spec.target.machine.as_deref() == Some(automatic.machine.as_str()))
        .expect("the renewal's record");
    // Nobody asked for it: it names no requester, and the policy that did.
    assert_eq!(record.spec.requester, None, "{record:?}");
    assert_eq!(
        record.spec.requested_by.as_deref(),
        Some("CertificateRenewalPolicy/outage")
    );
}
