//! A CertificateRenewalPolicy that cannot keep its promise is refused when it is written, by the
//! controller's policy webhook as `config/webhook/policies.yaml` installs it (against the real
//! API server, which calls the webhook over TLS with the caBundle the controller put in); one
//! that can is admitted and shows `PromiseKept`.

use std::time::{Duration, Instant};

use ck8s_certs_api::capi::WATCH_FILTER_LABEL;
use ck8s_certs_api::renewal_policy::CertificateRenewalPolicy;
use ck8s_certs_e2e::{controlplane, shared_of};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

const FILTER: &str = "promise";
/// The shipped name: the controller's role may write the caBundle of that one only.
const CONFIGURATION: &str = "ck8s-certs-policy-promise";
const TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_policy_that_cannot_keep_its_promise_is_refused_at_admission() {
    // Only the management cluster is used; alpha brings its namespace, fleet.
    let env = shared_of(&["alpha"]).await;
    let client = env.management().await.unwrap();
    // The shipped configuration, calling the test controller, for this test's policies only.
    let port = controlplane::free_port().unwrap();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../config/webhook/policies.yaml"
    );
    let mut shipped: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    shipped["metadata"]["name"] = json!(CONFIGURATION);
    let webhook = &mut shipped["webhooks"][0];
    let route = webhook["clientConfig"]["service"]["path"].clone();
    webhook["clientConfig"] = json!({
        "url": format!("https://127.0.0.1:{port}{}", route.as_str().unwrap())
    });
    webhook["objectSelector"] = json!({ "matchLabels": { WATCH_FILTER_LABEL: FILTER } });
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let _ = configurations
        .delete(CONFIGURATION, &DeleteParams::default())
        .await;
    configurations
        .create(
            &PostParams::default(),
            &serde_json::from_value(shipped).unwrap(),
        )
        .await
        .unwrap();
    // The trigger webhooks' configuration too: the controller puts its CA there first.
    env.install_webhook_configuration(Some(FILTER), port).await;
    let address = format!("--webhook-bind-address=127.0.0.1:{port}");
    let configuration = format!("--webhook-policy-configuration={CONFIGURATION}");
    let _controller = env.start_controller(
        FILTER,
        &[
            "--webhook=true",
            &address,
            "--webhook-hosts=127.0.0.1",
            &configuration,
        ],
    );
    // The controller puts its CA into the configuration's caBundle.
    let start = Instant::now();
    loop {
        let configuration = configurations.get(CONFIGURATION).await.unwrap();
        let bundle = configuration.webhooks.unwrap_or_default()[0]
            .client_config
            .ca_bundle
            .clone();
        if bundle.is_some_and(|b| !b.0.is_empty()) {
            break;
        }
        assert!(start.elapsed() < TIMEOUT, "no caBundle");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // renewBefore 2d with the fail-safe's 24h leaves one day for attempts 1h, 2h, 4h … apart
    // inside windows of an hour a week: refused, saying which number and what would work.
    let policies: Api<CertificateRenewalPolicy> = Api::namespaced(client.clone(), "fleet");
    let policy = |name: &str, spec: serde_json::Value| -> CertificateRenewalPolicy {
        let mut spec = spec;
        spec["machineSelector"] = json!({ "matchLabels": { "e2e-policy": name } });
        serde_json::from_value(json!({
            "apiVersion": "certificates.ck8s.io/v1alpha1",
            "kind": "CertificateRenewalPolicy",
            "metadata": { "name": name, "namespace": "fleet",
                          "labels": { WATCH_FILTER_LABEL: FILTER } },
            "spec": spec,
        }))
        .unwrap()
    };
    let weekly = json!([{ "daysOfWeek": ["Sunday"], "start": "02:00", "end": "03:00",
                          "timezone": "UTC" }]);
    let broken = policy(
        "weekly-2d",
        json!({ "policy": "Scheduled", "renewBefore": "2d", "ttl": "1y", "windows": weekly }),
    );
    let error = policies
        .create(&PostParams::default(), &broken)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("CertificateRenewalPolicy fleet/weekly-2d cannot keep its promise: renewBefore 2d leaves"),
        "{error}"
    );
    assert!(error.contains("a renewBefore of at least"), "{error}");
    assert!(
        policies.get_opt("weekly-2d").await.unwrap().is_none(),
        "nothing was written"
    );

    // The same windows with two months ahead: admitted, and its status says the promise holds.
    let kept = policy(
        "weekly-60d",
        json!({ "policy": "Scheduled", "renewBefore": "60d", "ttl": "1y", "windows": weekly }),
    );
    policies
        .create(&PostParams::default(), &kept)
        .await
        .unwrap();
    let start = Instant::now();
    loop {
        let status = policies.get("weekly-60d").await.unwrap().status;
        let promise = status
            .unwrap_or_default()
            .conditions
            .into_iter()
            .find(|c| c.type_ == "PromiseKept");
        if let Some(promise) = promise {
            assert_eq!(
                (promise.status.as_str(), promise.reason.as_str()),
                ("True", "PromiseKept"),
                "{promise:?}"
            );
            break;
        }
        assert!(start.elapsed() < TIMEOUT, "no PromiseKept condition");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let _ = configurations
        .delete(CONFIGURATION, &DeleteParams::default())
        .await;
}
