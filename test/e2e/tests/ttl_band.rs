//! The lifetimes a refresh may ask for (`--min-ttl`, `--max-ttl`; issue 36 item 5): a user with
//! the shipped `ck8s-certs-requester` ClusterRole (`config/rbac/requester_role.yaml`, the ask-only
//! `refresh` verb) under the provider's admission policies (`config/policy`) and webhook
//! (`config/webhook`), as in a cluster. `1m` on a control plane would cut Cluster API and the
//! controller off from the cluster within minutes; `10000y` would never rotate.

use std::time::{Duration, Instant};

use ck8s_certs::k8sd::wire::path;
use ck8s_certs_api::annotations::{
    CERTIFICATES_EXPIRY, FLEET_REQUEST_PENDING, REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS,
};
use ck8s_certs_api::capi::PAUSED_ANNOTATION;
use ck8s_certs_api::certificate_refresh::{CertificateRefresh, RequestPhase, Requester, Target};
use ck8s_certs_api::machine_certificates::{Origin, Phase};
use ck8s_certs_e2e::fixtures::{NodeInfo, manual_request};
use ck8s_certs_e2e::users::Grant;
use ck8s_certs_e2e::webhook::CONFIGURATION;
use ck8s_certs_e2e::{Environment, shared_of};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// The standard clusters these tests use; the others are not started.
const CLUSTERS: &[&str] = &["alpha", "trio"];

const FILTER: &str = "ttl-band";
const TIMEOUT: Duration = Duration::from_secs(90);
/// The ClusterRole's name as `config/default` installs it.
const REQUESTER_ROLE: &str = "ck8s-certs-requester";

/// A ServiceAccount of `namespace` bound there (RoleBinding) to the shipped requester
/// ClusterRole, and a client that authenticates as it; with its username.
async fn requester(env: &Environment, namespace: &str, name: &str) -> (Client, String) {
    let admin = env.management().await.unwrap();
    let post = PostParams::default();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../config/rbac/requester_role.yaml");
    let mut role: ClusterRole =
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    role.metadata.name = Some(REQUESTER_ROLE.into());
    match Api::<ClusterRole>::all(admin.clone())
        .create(&post, &role)
        .await
    {
        Ok(_) => {}
        // Installed by an earlier run against the same environment.
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(err) => panic!("create the requester ClusterRole: {err}"),
    }
    env.user(namespace, name, Grant::ClusterRole(REQUESTER_ROLE))
        .await
}

fn request_for(
    name: &str,
    node: &NodeInfo,
    ttl: &str,
    requester: Option<&str>,
) -> CertificateRefresh {
    let target = Target {
        machine: Some(node.machine.clone()),
        ..Default::default()
    };
    let mut request = manual_request(name, target, FILTER);
    request.spec.ttl = ttl.into();
    request.spec.requester = requester.map(|username| Requester {
        username: username.into(),
        ..Default::default()
    });
    request
}

/// The request once it is finished.
async fn finished(requests: &Api<CertificateRefresh>, name: &str) -> CertificateRefresh {
    let start = Instant::now();
    loop {
        let request = requests.get(name).await.unwrap();
        let phase = request.status.as_ref().and_then(|s| s.phase);
        if matches!(phase, Some(RequestPhase::Succeeded | RequestPhase::Failed)) {
            return request;
        }
        assert!(start.elapsed() < TIMEOUT, "{request:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn runs(env: &Environment, node: &NodeInfo) -> Vec<serde_json::Value> {
    env.calls(node)
        .await
        .iter()
        .filter(|c| c.path == path::RUN)
        .map(|c| serde_json::from_str(&c.body).unwrap())
        .collect()
}

#[tokio::test]
async fn a_requester_s_lifetime_outside_the_band_is_refused_at_admission_and_by_the_controller() {
    let env = shared_of(CLUSTERS).await;
    let [cp] = env.isolated("alpha", ["alpha-cp-0"], FILTER).await;
    let namespace = cp.namespace.clone();
    env.install_admission_policies().await;
    // The shipped band (1d to 1y): the environment widens --max-ttl for tests that ask 2y.
    let band = ["--min-ttl=1d", "--max-ttl=1y"];
    let controller = env
        .start_controller_with_request_webhook(FILTER, &band)
        .await;
    env.wait_for_machine(&cp, TIMEOUT, |a| a.contains_key(CERTIFICATES_EXPIRY))
        .await;
    let (carol, carol_name) = requester(&env, &namespace, "carol").await;
    let as_carol: Api<CertificateRefresh> = Api::namespaced(carol, &namespace);
    let post = PostParams::default();
    env.sim.clear_calls(&cp.cluster, &cp.node).await.unwrap();

    // At admission: denied, the bound and its flag named, nothing stored.
    for (name, ttl, says) in [
        (
            "carol-1m",
            "1m",
            "TTL 1m is below the minimum 1d (--min-ttl)",
        ),
        (
            "carol-10000y",
            "10000y",
            "TTL 10000y is above the maximum 1y (--max-ttl)",
        ),
    ] {
        match as_carol
            .create(&post, &request_for(name, &cp, ttl, None))
            .await
        {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{status:?}");
                assert!(
                    status.message.contains(says) && status.message.contains("a TTL from 1d to 1y"),
                    "{}",
                    status.message
                );
                println!("{ttl} refused at admission: {}", status.message);
            }
            other => panic!("{ttl} was not refused: {other:?}"),
        }
        assert!(
            as_carol.get_opt(name).await.unwrap().is_none(),
            "{name} was stored"
        );
    }

    // In the band: admitted under her name and carried out for exactly that lifetime.
    let created = as_carol
        .create(&post, &request_for("carol-30d", &cp, "30d", None))
        .await
        .unwrap();
    assert_eq!(
        created.spec.requester.map(|r| r.username).as_deref(),
        Some(carol_name.as_str())
    );
    let done = finished(&as_carol, "carol-30d").await;
    assert_eq!(
        done.status.as_ref().and_then(|s| s.phase),
        Some(RequestPhase::Succeeded),
        "{done:#?}"
    );
    let asked = runs(&env, &cp).await;
    assert_eq!(asked.len(), 1, "{asked:#?}");
    assert_eq!(asked[0]["expiration-seconds"], 30 * 86_400);

    // A trigger on the Machine (here by the admin: the requester role may not patch Machines)
    // is denied the same way, and nothing is stored.
    let machines = env.machine_api(env.management().await.unwrap(), &namespace);
    let trigger = |ttl: &str| {
        Patch::Merge(json!({ "metadata": { "annotations": { REFRESH_CERTIFICATES: ttl } } }))
    };
    match machines
        .patch(&cp.machine, &PatchParams::default(), &trigger("10000y"))
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(
                status
                    .message
                    .contains("TTL 10000y is above the maximum 1y (--max-ttl); annotate again with a TTL from 1d to 1y"),
                "{}",
                status.message
            );
        }
        other => panic!("10000y on the Machine was not refused: {other:?}"),
    }
    assert!(
        !env.machine_annotations(&cp)
            .await
            .contains_key(REFRESH_CERTIFICATES)
    );

    // The webhook bypassed (a cluster without it, or a caller the request webhook does not
    // see): the controller refuses the same requests itself, before any call to k8sd.
    let configurations: Api<MutatingWebhookConfiguration> =
        Api::all(env.management().await.unwrap());
    configurations
        .delete(CONFIGURATION, &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    env.sim.clear_calls(&cp.cluster, &cp.node).await.unwrap();
    for (name, ttl, says) in [
        (
            "carol-1m-direct",
            "1m",
            "TTL 1m is below the minimum 1d (--min-ttl)",
        ),
        (
            "carol-10000y-direct",
            "10000y",
            "TTL 10000y is above the maximum 1y (--max-ttl)",
        ),
    ] {
        // Without the webhook, the policy admits only a request that names its maker.
        as_carol
            .create(&post, &request_for(name, &cp, ttl, Some(&carol_name)))
            .await
            .unwrap();
        let refused = finished(&as_carol, name).await;
        let status = refused.status.clone().unwrap_or_default();
        assert_eq!(status.phase, Some(RequestPhase::Failed), "{refused:#?}");
        let message = status.message.unwrap_or_default();
        assert!(
            message.contains(says) && message.contains("a TTL from 1d to 1y"),
            "{message}"
        );
        println!("{ttl} refused by the controller: {message}");
    }
    // A trigger written while the webhook is away (here by the admin, who may patch Machines):
    // the Machine's refresh fails at once, naming the band.
    env.annotate_refresh(&cp, "1m").await;
    let annotations = env.wait_for_refresh(&cp, TIMEOUT).await;
    assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "failed");
    let error = env.operation(&cp).await.error.unwrap_or_default();
    assert!(
        error.contains("TTL 1m is below the minimum 1d (--min-ttl)"),
        "{error}"
    );
    let calls = runs(&env, &cp).await;
    assert!(calls.is_empty(), "k8sd was asked to run: {calls:#?}");

    // A fleet trigger written while the webhook was away names no author. In an install whose
    // controller is not the service account the request webhook's matchCondition exempts (another
    // namespace or name), the request the controller makes for it reaches the webhook, is stamped
    // with the controller's name and denied (422): the trigger is failed once, with the
    // reason, and not tried again every few seconds.
    drop(controller);
    env.isolate_cluster(&cp.cluster, FILTER).await;
    let admin = env.management().await.unwrap();
    let clusters = env.cluster_api(admin.clone(), &namespace);
    // Paused, so that the trigger waits until the webhook is set up as such an install's.
    clusters
        .patch(
            &cp.cluster,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": {
                REFRESH_CERTIFICATES: "1m", PAUSED_ANNOTATION: "true" } } })),
        )
        .await
        .unwrap();
    let controller = env
        .start_controller_with_request_webhook(FILTER, &band)
        .await;
    let installed = configurations.get(CONFIGURATION).await.unwrap();
    let index = installed
        .webhooks
        .unwrap_or_default()
        .iter()
        .position(|w| w.name == "refresh-request.certificates.ck8s.io")
        .expect("the request webhook");
    let unexempt: json_patch::Patch = serde_json::from_value(json!([
        { "op": "test", "path": format!("/webhooks/{index}/name"), "value": "refresh-request.certificates.ck8s.io" },
        { "op": "remove", "path": format!("/webhooks/{index}/matchConditions") }
    ]))
    .unwrap();
    configurations
        .patch(
            CONFIGURATION,
            &PatchParams::default(),
            &Patch::<()>::Json(unexempt),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    clusters
        .patch(
            &cp.cluster,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { PAUSED_ANNOTATION: null } } })),
        )
        .await
        .unwrap();
    let start = Instant::now();
    let annotations = loop {
        let cluster = clusters.get(&cp.cluster).await.unwrap();
        let annotations = cluster.metadata.annotations.unwrap_or_default();
        if annotations
            .get(REFRESH_CERTIFICATES_STATUS)
            .map(String::as_str)
            == Some("failed")
        {
            break annotations;
        }
        assert!(start.elapsed() < TIMEOUT, "{annotations:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        !annotations.contains_key(REFRESH_CERTIFICATES)
            && !annotations.contains_key(FLEET_REQUEST_PENDING),
        "{annotations:#?}"
    );
    // The Event is published after the annotation is written: looked for until it is there.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin, &namespace);
    let start = Instant::now();
    let notes = loop {
        let notes: Vec<String> = events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some("CertificatesRefreshFailed")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&cp.cluster)
            })
            .filter_map(|e| e.note)
            .collect();
        if notes
            .iter()
            .any(|n| n.contains("TTL 1m is below the minimum 1d (--min-ttl)"))
        {
            break notes;
        }
        assert!(start.elapsed() < TIMEOUT, "{notes:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!("fleet trigger refused: {notes:?}");
    tokio::time::sleep(Duration::from_secs(6)).await;
    let log = controller.log();
    assert_eq!(
        log.matches("Handling a fleet refresh trigger failed")
            .count(),
        0,
        "retried"
    );
    assert_eq!(log.matches("Fleet refresh trigger refused").count(), 1);

    // A renewal policy's ttl outside the band (writing one takes more than `refresh`): the
    // automatic renewal is not refused, which would leave the certificates to expire; it asks
    // for the nearest bound, and its record says why.
    env.sim.clear_calls(&cp.cluster, &cp.node).await.unwrap();
    let op = renewed_by_policy(
        &env,
        &cp,
        FILTER,
        "ttl-band-2y",
        json!({ "renewBefore": "100d", "ttl": "2y" }),
    )
    .await;
    assert_eq!(op.ttl, "1y");
    assert_eq!(
        op.note.as_deref(),
        Some(
            "CertificateRenewalPolicy ttl-band-2y asks for 2y, but TTL 2y is above the maximum 1y (--max-ttl): 1y was asked for"
        ),
        "{op:#?}"
    );
    let asked = runs(&env, &cp).await;
    assert_eq!(asked.len(), 1, "{asked:#?}");
    assert_eq!(asked[0]["expiration-seconds"], 365 * 86_400);
}

/// The operation of the automatic renewal of `cp` under a new Automatic policy `name` (without
/// spread) of instance `filter`, with `spec`'s `renewBefore` and `ttl`, once it succeeded.
async fn renewed_by_policy(
    env: &Environment,
    cp: &NodeInfo,
    filter: &str,
    name: &str,
    spec: serde_json::Value,
) -> ck8s_certs_api::machine_certificates::Operation {
    let mut spec = spec;
    spec["policy"] = json!("Automatic");
    spec["spread"] = json!("0s");
    env.create_policy_in(filter, &cp.namespace, name, name, spec)
        .await;
    env.patch_machine(
        cp,
        json!({ "metadata": { "labels": { "e2e-policy": name } } }),
    )
    .await;
    let status = env
        .wait_for_status(cp, TIMEOUT, "the policy's renewal", |s| {
            s.operation
                .as_ref()
                .is_some_and(|op| op.origin == Origin::Policy && op.phase == Phase::Succeeded)
        })
        .await;
    status.operation.expect("the renewal's operation")
}

/// The end of `cluster`'s CA as its ClusterCertificates record shows it (from its kubeconfig's
/// CA data), once the controller wrote it.
async fn recorded_ca_end(env: &Environment, namespace: &str, cluster: &str) -> jiff::Timestamp {
    let records: Api<ck8s_certs_api::cluster_certificates::ClusterCertificates> =
        Api::namespaced(env.management().await.unwrap(), namespace);
    let start = Instant::now();
    loop {
        if let Some(at) = records
            .get_opt(cluster)
            .await
            .unwrap()
            .and_then(|r| r.status?.kubeconfig?.certificate_authority_expiry)
        {
            return at.0;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "no CA end recorded for {cluster}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// k8sd signs past its CA's end, and such a certificate is not trusted once the CA ends. Even in
/// a band widened to 20 years, a manual refresh that would outlive the cluster CA (ten years from
/// the environment's start, as CK8s makes them) is refused before anything is sent to the node, naming the CA and what fits;
/// an automatic renewal asks for no more than the CA has left, and its record says why.
#[tokio::test]
async fn no_lifetime_outlives_the_cluster_ca() {
    let env = shared_of(CLUSTERS).await;
    let [cp] = env.isolated("trio", ["trio-cp-0"], "ca-end").await;
    let _controller = env.start_controller("ca-end", &["--max-ttl=20y"]);
    let ca_end = recorded_ca_end(&env, &cp.namespace, &cp.cluster).await;
    env.sim.clear_calls(&cp.cluster, &cp.node).await.unwrap();

    env.annotate_refresh(&cp, "11y").await;
    let annotations = env.wait_for_refresh(&cp, TIMEOUT).await;
    assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "failed");
    let error = env.operation(&cp).await.error.unwrap_or_default();
    assert!(
        error.contains(&format!(
            "after the cluster CA (certificate-authority-data of Secret fleet/trio-kubeconfig) ends at {ca_end}"
        )) && error.contains("ask for at most"),
        "{error}"
    );
    let calls = runs(&env, &cp).await;
    assert!(calls.is_empty(), "k8sd was asked to run: {calls:#?}");

    let op = renewed_by_policy(
        &env,
        &cp,
        "ca-end",
        "ca-end-15y",
        json!({ "renewBefore": "14y", "ttl": "15y" }),
    )
    .await;
    let note = op.note.clone().unwrap_or_default();
    assert!(
        note.starts_with("15y would outlive the cluster CA") && note.ends_with("h was asked for"),
        "{op:#?}"
    );
    assert_eq!(
        op.ttl_seconds.map(|s| s % 3600),
        Some(0),
        "whole hours: {op:#?}"
    );
    let asked = runs(&env, &cp).await;
    assert_eq!(asked.len(), 1, "{asked:#?}");
    let seconds = asked[0]["expiration-seconds"].as_i64().unwrap();
    let ends = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(seconds);
    assert!(
        ends <= ca_end && ca_end.duration_since(ends) < jiff::SignedDuration::from_hours(2),
        "asked for {seconds} s: ends at {ends}, the CA at {ca_end}"
    );
}
