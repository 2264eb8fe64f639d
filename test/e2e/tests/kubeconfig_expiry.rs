//! The credential that usually expires first: the client certificate of a Cluster's
//! `<cluster>-kubeconfig`. Ten days before: a Warning Event on the Cluster, `ClusterCertificates`
//! Ready=False ExpiringSoon, the metric. Expired: a refresh fails with a message naming the Secret
//! and the date, not a TLS error. With `--renew-management-kubeconfig`, renewed in place with the
//! cluster's client CA (`<cluster>-cca`).
//!
//! `alpha`'s kubeconfig keeps authenticating with its token; the client certificate added to it
//! is self-signed, which is all the expiry check reads. `beta`'s authenticates with a client
//! certificate alone, signed by the CA the workload API servers trust for clients, which its
//! `beta-cca` holds as the CK8s control-plane provider's would. Its own test binary (and so its
//! own environment): those kubeconfigs are replaced.

use std::time::{Duration, Instant};

use base64::Engine;
use ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS;
use ck8s_certs_api::cluster_certificates::ClusterCertificates;
use ck8s_certs_e2e::{Environment, shared};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
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
    env.write_kubeconfig("alpha", &serde_yaml::to_string(&kubeconfig).unwrap())
        .await;
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
    let status = record.status.clone().unwrap();
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
        record.metadata.owner_references.as_ref().unwrap()[0].kind,
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
    // Renewal is off by default: no client CA read, nothing said of it.
    assert!(secret_requests(&env, "alpha-cca").is_empty());
    assert!(renewal_condition(&record).is_none());
    assert!(
        record
            .status
            .as_ref()
            .and_then(|s| s.kubeconfig.as_ref())
            .is_some_and(|k| k.next_renewal_time.is_none()
                && k.client_certificate_authority_expiry.is_none())
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

async fn record(env: &Environment, namespace: &str, cluster: &str) -> Option<ClusterCertificates> {
    let api: Api<ClusterCertificates> = Api::namespaced(env.management().await.unwrap(), namespace);
    api.get_opt(cluster).await.unwrap()
}

fn renewal_condition(record: &ClusterCertificates) -> Option<Condition> {
    record
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "KubeconfigRenewal")
        .cloned()
}

async fn wait_renewal(
    env: &Environment,
    namespace: &str,
    cluster: &str,
    done: impl Fn(&ClusterCertificates) -> bool,
) -> ClusterCertificates {
    let start = Instant::now();
    loop {
        if let Some(record) = record(env, namespace, cluster).await
            && done(&record)
        {
            return record;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "ClusterCertificates {namespace}/{cluster}: {:#?}",
            record(env, namespace, cluster).await.and_then(|r| r.status)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The management API server's audited requests on Secrets named `name`.
fn secret_requests(env: &Environment, name: &str) -> Vec<String> {
    ck8s_certs_e2e::controlplane::audited_requests(
        &std::fs::read_to_string(env.dir.join("audit-management.log")).unwrap_or_default(),
    )
    .filter(|e| {
        e.object_ref
            .as_ref()
            .is_some_and(|o| o.resource == "secrets" && o.name == name)
    })
    .map(|e| format!("{} ({})", e.verb, e.code().unwrap_or(0)))
    .collect()
}

/// A dry run does everything but the write, and says what it would have done.
#[tokio::test]
async fn a_dry_run_writes_nothing_and_says_what_it_would_do() {
    let env = shared().await;
    env.make_kubeconfig_due("trio").await;
    let secrets: Api<Secret> = Api::namespaced(env.management().await.unwrap(), "fleet");
    let before = secrets.get("trio-kubeconfig").await.unwrap();
    env.isolate_cluster("trio", "dry-run").await;
    env.install_kubeconfig_renewal().await;
    let controller = env.start_controller("dry-run", &["--renew-management-kubeconfig=dry-run"]);
    let record = wait_renewal(&env, "fleet", "trio", |r| renewal_condition(r).is_some()).await;
    let condition = renewal_condition(&record).unwrap();
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("True", "WouldRenew")
    );
    assert!(
        condition
            .message
            .contains("would be replaced by one signed by fleet/trio-cca")
            && condition
                .message
                .contains("which the workload API server accepted"),
        "{}",
        condition.message
    );
    assert!(
        record
            .status
            .unwrap()
            .kubeconfig
            .unwrap()
            .last_renewal_time
            .is_none()
    );
    let start = Instant::now();
    while !env
        .cluster_events("fleet", "trio")
        .await
        .iter()
        .any(|e| e.reason.as_deref() == Some("KubeconfigCertificateWouldRenew"))
    {
        assert!(
            start.elapsed() < TIMEOUT,
            "no WouldRenew Event on the Cluster"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        controller
            .metric("ck8s_certs_kubeconfig_renewals_total{result=\"dry_run\"}")
            .await,
        Some(1.0)
    );
    assert_eq!(
        secrets
            .get("trio-kubeconfig")
            .await
            .unwrap()
            .metadata
            .resource_version,
        before.metadata.resource_version
    );
}

#[tokio::test]
async fn a_due_client_certificate_is_renewed_in_place_and_other_shapes_are_left_alone() {
    let env = shared().await;
    let client = env.management().await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "fleet");
    let now = jiff::Timestamp::now();
    let day = jiff::SignedDuration::from_hours(24);
    let (yaml, cert) = env.make_kubeconfig_due("beta").await;
    let ca = |file: &str| std::fs::read_to_string(env.dir.join(file)).unwrap();
    let before = secrets.get("beta-kubeconfig").await.unwrap();
    let gamma_before = Api::<Secret>::namespaced(client.clone(), "edge")
        .get("gamma-kubeconfig")
        .await
        .unwrap();
    // solo's holds the provider's certificate (public: anyone may have a copy) beside a key that
    // is not its own, and its client CA is there: renewing it would hand whoever stored it a
    // working key for kubernetes-admin.
    let (solo_yaml, solo_cert) = env.make_kubeconfig_due("solo").await;
    let foreign_key = rcgen::KeyPair::generate().unwrap().serialize_pem();
    let stolen =
        ck8s_certs_e2e::kubeconfigs::with_client_certificate(&solo_yaml, &solo_cert, &foreign_key);
    let solo_before = secrets
        .patch(
            "solo-kubeconfig",
            &PatchParams::default(),
            &Patch::Merge(json!({ "stringData": { "value": stolen } })),
        )
        .await
        .unwrap();
    let nodes = env.isolate_cluster("beta", "renewal").await;
    env.isolate_cluster("gamma", "renewal").await;
    env.isolate_cluster("solo", "renewal").await;
    env.install_kubeconfig_renewal().await;
    let controller = env.start_controller("renewal", &["--renew-management-kubeconfig"]);

    let renewed = wait_renewal(&env, "fleet", "beta", |r| {
        r.status
            .as_ref()
            .and_then(|s| s.kubeconfig.as_ref())
            .is_some_and(|k| k.last_renewal_time.is_some())
    })
    .await;
    let status = renewed.status.clone().unwrap();
    let kubeconfig = status.kubeconfig.unwrap();
    let expiry = kubeconfig.client_certificate_expiry.unwrap().0;
    // The same lifetime, 300 days, from now.
    assert!(
        (expiry.duration_since(now) - day * 300).abs() < jiff::SignedDuration::from_mins(5),
        "{expiry}"
    );
    // The client CA's end is shown with renewal on (the environment's CA: ten years).
    assert!(kubeconfig.client_certificate_authority_expiry.is_some());
    let next = kubeconfig.next_renewal_time.unwrap().0;
    assert!(
        (expiry.duration_since(next) - day * 150).abs() < jiff::SignedDuration::from_mins(10),
        "{next}"
    );
    let condition = renewal_condition(&renewed).unwrap();
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("True", "NotDue")
    );

    // The Secret: only `value` changed, and in it only the user's certificate and key.
    let after = secrets.get("beta-kubeconfig").await.unwrap();
    assert_eq!(
        after.metadata.owner_references,
        before.metadata.owner_references
    );
    assert_eq!(after.metadata.labels, before.metadata.labels);
    assert_eq!(after.type_, before.type_);
    let new_yaml = String::from_utf8(after.data.as_ref().unwrap()["value"].0.clone()).unwrap();
    let mut new: serde_yaml::Value = serde_yaml::from_str(&new_yaml).unwrap();
    let user = new["users"][0]["user"].clone();
    let decode = |v: &serde_yaml::Value| {
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap()
    };
    let new_cert = decode(&user["client-certificate-data"]);
    assert_ne!(new_cert, cert.as_bytes());
    let (_, pem) = x509_parser::pem::parse_x509_pem(&new_cert).unwrap();
    let new_x509 = pem.parse_x509().unwrap();
    let ca_pem = ca("ca.crt");
    let (_, ca_block) = x509_parser::pem::parse_x509_pem(ca_pem.as_bytes()).unwrap();
    let ca_x509 = ca_block.parse_x509().unwrap();
    assert!(
        new_x509
            .verify_signature(Some(ca_x509.public_key()))
            .is_ok()
    );
    let (_, old_block) = x509_parser::pem::parse_x509_pem(cert.as_bytes()).unwrap();
    assert_eq!(
        new_x509.subject().as_raw(),
        old_block.parse_x509().unwrap().subject().as_raw()
    );
    new["users"][0]["user"] =
        serde_yaml::from_str::<serde_yaml::Value>(&yaml).unwrap()["users"][0]["user"].clone();
    assert_eq!(
        new,
        serde_yaml::from_str::<serde_yaml::Value>(&yaml).unwrap()
    );

    // `kubectl --kubeconfig` from the Secret works with it...
    let file = env.dir.join("beta-renewed.kubeconfig");
    std::fs::write(&file, &new_yaml).unwrap();
    assert_eq!(
        ck8s_certs_e2e::kubeconfigs::whoami(&file),
        "kubernetes-admin"
    );
    // ...and so does the controller's own client: a refresh of one of its nodes.
    let node = nodes.iter().find(|n| n.machine == "beta-cp-0").unwrap();
    env.annotate_refresh(node, "1y").await;
    let annotations = env.wait_for_refresh(node, TIMEOUT).await;
    assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "done");

    let start = Instant::now();
    while !env.cluster_events("fleet", "beta").await.iter().any(|e| {
        e.reason.as_deref() == Some("KubeconfigCertificateRenewed")
            && e.note
                .as_deref()
                .is_some_and(|n| n.contains("fleet/beta-cca"))
    }) {
        assert!(start.elapsed() < TIMEOUT, "no Renewed Event on the Cluster");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        controller
            .metric("ck8s_certs_kubeconfig_renewals_total{result=\"renewed\"}")
            .await,
        Some(1.0),
        "{}",
        controller.metrics().await
    );

    // gamma's kubeconfig authenticates with a token: left alone, and said why.
    let gamma = wait_renewal(&env, "edge", "gamma", |r| renewal_condition(r).is_some()).await;
    let condition = renewal_condition(&gamma).unwrap();
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", "NotProviderShape")
    );
    assert!(
        condition.message.contains("authenticates with token"),
        "{}",
        condition.message
    );
    assert_eq!(
        Api::<Secret>::namespaced(client, "edge")
            .get("gamma-kubeconfig")
            .await
            .unwrap()
            .metadata
            .resource_version,
        gamma_before.metadata.resource_version
    );
    // gamma's client CA is never read: its kubeconfig is not renewable.
    let gets = |name: &str| {
        secret_requests(&env, name)
            .into_iter()
            .filter(|r| r.starts_with("get"))
            .collect::<Vec<_>>()
    };
    // The client CA (it holds the CA's key): read once, by the renewal, which also tells its end.
    assert_eq!(gets("beta-cca"), ["get (200)"]);
    assert!(secret_requests(&env, "gamma-cca").is_empty());

    // solo's is not renewed, and says why; its Secret and its client CA are never touched.
    let solo = wait_renewal(&env, "fleet", "solo", |r| renewal_condition(r).is_some()).await;
    let condition = renewal_condition(&solo).unwrap();
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", "KeyMismatch")
    );
    assert!(
        condition
            .message
            .contains("`client-key-data` is not the private key of `client-certificate-data`"),
        "{}",
        condition.message
    );
    assert_eq!(
        secrets
            .get("solo-kubeconfig")
            .await
            .unwrap()
            .metadata
            .resource_version,
        solo_before.metadata.resource_version
    );
    assert!(gets("solo-cca").is_empty());
    assert_eq!(
        secret_requests(&env, "beta-kubeconfig")
            .iter()
            .filter(|r| r.starts_with("patch"))
            .collect::<Vec<_>>(),
        ["patch (200)", "patch (200)"],
        "the test's own patch, then the renewal"
    );
}

/// The right to patch Secrets that config/kubeconfig-renewal grants the controller is confined
/// by its admission policy to the `value` of `<cluster>-kubeconfig` Secrets.
#[tokio::test]
async fn the_controller_may_change_nothing_but_a_kubeconfig_s_value() {
    let env = shared().await;
    env.install_kubeconfig_renewal().await;
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&env.management_kubeconfig_yaml).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    config.auth_info.impersonate = Some(format!(
        "system:serviceaccount:{}:{}",
        ck8s_certs_e2e::controller::NAMESPACE,
        ck8s_certs_e2e::controller::SERVICE_ACCOUNT
    ));
    // Secrets of this test alone: a kubeconfig one as Cluster API writes them, another, and a
    // kubeconfig one that is not Cluster API's (no type, no cluster label).
    let admin: Api<Secret> = Api::namespaced(env.management().await.unwrap(), "edge");
    for (name, capi) in [
        ("policed-kubeconfig", true),
        ("policed-token", true),
        ("foreign-kubeconfig", false),
    ] {
        let mut secret = json!({
            "metadata": { "name": name },
            "stringData": { "value": "v" }
        });
        if capi {
            secret["type"] = json!("cluster.x-k8s.io/secret");
            secret["metadata"]["labels"] = json!({ "cluster.x-k8s.io/cluster-name": "policed" });
        }
        admin
            .create(
                &Default::default(),
                &serde_json::from_value(secret).unwrap(),
            )
            .await
            .unwrap();
    }
    let secrets: Api<Secret> = Api::namespaced(kube::Client::try_from(config).unwrap(), "edge");
    let refused = |patch: serde_json::Value, name: &'static str| {
        let secrets = secrets.clone();
        async move {
            match secrets
                .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Err(kube::Error::Api(status)) if status.code == 403 => status.message,
                other => panic!("{name}: expected a refusal, got {other:?}"),
            }
        }
    };
    let other = refused(json!({ "stringData": { "value": "x" } }), "policed-token").await;
    assert!(
        other.contains("writes no Secret but a <cluster>-kubeconfig"),
        "{other}"
    );
    let key = refused(
        json!({ "stringData": { "extra": "x" } }),
        "policed-kubeconfig",
    )
    .await;
    assert!(key.contains("changes only the `value`"), "{key}");
    let label = refused(
        json!({ "metadata": { "labels": { "x": "y" } } }),
        "policed-kubeconfig",
    )
    .await;
    assert!(label.contains("changes no label"), "{label}");
    for change in [
        json!({ "metadata": { "finalizers": ["example.com/keep"] } }),
        json!({ "immutable": true }),
    ] {
        let refusal = refused(change, "policed-kubeconfig").await;
        assert!(refusal.contains("finalizer or immutability"), "{refusal}");
    }
    let foreign = refused(
        json!({ "stringData": { "value": "x" } }),
        "foreign-kubeconfig",
    )
    .await;
    assert!(
        foreign.contains("writes only Cluster API kubeconfig Secrets"),
        "{foreign}"
    );
    // The value itself: admitted.
    secrets
        .patch(
            "policed-kubeconfig",
            &PatchParams::default(),
            &Patch::Merge(json!({ "stringData": { "value": "renewed" } })),
        )
        .await
        .unwrap();
}
