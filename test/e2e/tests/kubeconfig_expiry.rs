//! The credential that usually expires first: the client certificate of a Cluster's
//! `<cluster>-kubeconfig`. Ten days before: a Warning Event on the Cluster, `ClusterCertificates`
//! Ready=False ExpiringSoon, the metric. Expired: a refresh fails with a message naming the Secret
//! and the date, not a TLS error.
//!
//! The test kubeconfigs keep authenticating with their token; the client certificate added to
//! them is self-signed, which is all the controller reads. Its own test binary (and so its own
//! environment): cluster `alpha`'s kubeconfig is replaced.

use std::time::{Duration, Instant};

use base64::Engine;
use ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS;
use ck8s_certs_api::cluster_certificates::ClusterCertificates;
use ck8s_certs_e2e::{Environment, shared};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);

/// A self-signed client certificate (PEM) and its key, expiring at `not_after`.
fn client_certificate(not_after: jiff::Timestamp) -> (String, String) {
    let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "capi-admin");
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = time::OffsetDateTime::from_unix_timestamp(not_after.as_second()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let certificate = params.self_signed(&key).unwrap();
    (certificate.pem(), key.serialize_pem())
}

/// Replaces `alpha-kubeconfig` with the cluster's kubeconfig plus a client certificate.
async fn set_kubeconfig(env: &Environment, not_after: jiff::Timestamp) {
    let alpha = env.cluster("alpha");
    let mut kubeconfig: serde_yaml::Value = serde_yaml::from_str(&alpha.kubeconfig_yaml).unwrap();
    let (cert, key) = client_certificate(not_after);
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    let user = &mut kubeconfig["users"][0]["user"];
    user["client-certificate-data"] = b64(&cert).into();
    user["client-key-data"] = b64(&key).into();
    let secrets: Api<Secret> = Api::namespaced(env.management().await.unwrap(), "fleet");
    secrets
        .patch(
            "alpha-kubeconfig",
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "stringData": { "value": serde_yaml::to_string(&kubeconfig).unwrap() } }),
            ),
        )
        .await
        .unwrap();
}

async fn cluster_events(env: &Environment) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(env.management().await.unwrap(), "fleet");
    api.list(&ListParams::default().fields("regarding.kind=Cluster,regarding.name=alpha"))
        .await
        .unwrap()
        .items
}

async fn wait_record(env: &Environment, reason: &str) -> ClusterCertificates {
    let api: Api<ClusterCertificates> = Api::namespaced(env.management().await.unwrap(), "fleet");
    let start = Instant::now();
    loop {
        if let Some(record) = api.get_opt("alpha").await.unwrap()
            && record
                .status
                .as_ref()
                .and_then(|s| s.conditions.first())
                .is_some_and(|c| c.reason == reason)
        {
            return record;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "ClusterCertificates alpha never {reason}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn an_expiring_management_kubeconfig_is_announced_and_an_expired_one_named_when_a_refresh_fails()
 {
    let env = shared().await;
    let node = env.cluster("alpha").node("alpha-cp-0").clone();
    let in_ten_days = jiff::Timestamp::from_second(
        (jiff::Timestamp::now() + jiff::SignedDuration::from_hours(240)).as_second(),
    )
    .unwrap();
    set_kubeconfig(&env, in_ten_days).await;
    env.isolate(&node, "kubeconfig").await;
    let controller = env.start_controller("kubeconfig", &[]);

    let record = wait_record(&env, "ExpiringSoon").await;
    let status = record.status.unwrap();
    let kubeconfig = status.kubeconfig.unwrap();
    assert_eq!(kubeconfig.secret, "fleet/alpha-kubeconfig");
    assert_eq!(
        kubeconfig.client_certificate_expiry.map(|t| t.0),
        Some(in_ten_days)
    );
    assert!(kubeconfig.certificate_authority_expiry.is_some());
    let ready = &status.conditions[0];
    assert_eq!(ready.status, "False");
    assert!(
        ready.message.contains("fleet/alpha-kubeconfig") && ready.message.contains("in 9d 23h"),
        "{}",
        ready.message
    );
    assert_eq!(
        record.metadata.owner_references.unwrap()[0].kind,
        "Cluster",
        "goes away (and moves) with its Cluster"
    );
    let start = Instant::now();
    while !cluster_events(&env).await.iter().any(|e| {
        e.reason.as_deref() == Some("KubeconfigCertificateExpiring")
            && e.type_.as_deref() == Some("Warning")
    }) {
        assert!(start.elapsed() < TIMEOUT, "no Warning Event on the Cluster");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        controller
            .metric("ck8s_certs_kubeconfig_expiry_timestamp_seconds{namespace=\"fleet\",cluster=\"alpha\",certificate=\"client\"}")
            .await,
        Some(in_ten_days.as_second() as f64),
        "{}",
        controller.metrics().await
    );

    // Expired: the refresh fails before any TLS handshake, naming the Secret and the date.
    let yesterday = jiff::Timestamp::from_second(
        (jiff::Timestamp::now() - jiff::SignedDuration::from_hours(24)).as_second(),
    )
    .unwrap();
    set_kubeconfig(&env, yesterday).await;
    env.annotate_refresh(&node, "1y").await;
    let annotations = env.wait_for_refresh(&node, TIMEOUT).await;
    assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "failed");
    let error = env.operation(&node).await.error.unwrap();
    assert!(
        error.contains("client certificate in Secret fleet/alpha-kubeconfig expired at")
            && error.contains(&yesterday.to_string()),
        "{error}"
    );
    // A restarted controller reads the Secret again and shows it expired.
    drop(controller);
    let _controller = env.start_controller("kubeconfig", &[]);
    wait_record(&env, "Expired").await;
    let start = Instant::now();
    while !cluster_events(&env)
        .await
        .iter()
        .any(|e| e.reason.as_deref() == Some("KubeconfigCertificateExpired"))
    {
        assert!(start.elapsed() < TIMEOUT, "no Expired Event on the Cluster");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
