//! A refresh that fails says what failed and what to do, never leaves the Machine in-progress,
//! never calls k8sd for bad input, retries what is transient, and never blocks other Machines.

use std::time::Duration;

use ck8s_certs::k8sd::wire::path;
use ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS;
use ck8s_certs_e2e::Environment;
use ck8s_certs_e2e::fixtures::NodeInfo;
use ck8s_certs_e2e::shared;
use ck8s_certs_e2e::sim::{Endpoint, Fault};

const TIMEOUT: Duration = Duration::from_secs(90);

async fn failure_of(env: &Environment, node: &NodeInfo) -> String {
    let annotations = env.wait_for_refresh(node, TIMEOUT).await;
    assert_eq!(
        annotations[REFRESH_CERTIFICATES_STATUS], "failed",
        "{annotations:#?}"
    );
    let mc = env.machine_certificates(node).await.unwrap();
    let error = mc.status.unwrap().operation.unwrap().error.unwrap();
    let events = env.machine_events(node).await;
    let event = events
        .iter()
        .rev()
        .find(|e| e.reason.as_deref() == Some("CertificatesRefreshFailed"))
        .expect("Failed event");
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.note.as_deref(), Some(error.as_str()));
    // Every failure ends with the command that retries.
    let hint = format!(
        "Renew now: kubectl annotate machines.cluster.x-k8s.io {} -n {} v1beta2.k8sd.io/refresh-certificates=",
        node.machine, node.namespace
    );
    let last_sentence = error.rsplit(". ").next().unwrap_or_default();
    assert!(
        last_sentence.starts_with(&hint) && last_sentence.ends_with(" --overwrite"),
        "{error}"
    );
    error
}

fn assert_no_secrets(env: &Environment, node: &NodeInfo, text: &str) {
    let tokens = &env.cluster(&node.cluster).tokens;
    assert!(!text.contains(&tokens.capi_auth_token));
    assert!(
        tokens
            .node_tokens
            .values()
            .all(|t| !text.contains(t.as_str()))
    );
}

#[tokio::test]
async fn a_k8sd_error_fails_the_refresh_with_its_text_and_annotating_again_retries() {
    let env = shared().await;
    let node = env.cluster("alpha").node("alpha-cp-0").clone();
    env.isolate(&node, "k8sd-500").await;
    let controller = env.start_controller("k8sd-500", &[]);
    let fault = env
        .sim
        .inject(
            &Fault::error(500, "failed to generate certificates: disk full")
                .on(&node)
                .at(Endpoint::Run),
        )
        .await
        .unwrap();
    env.annotate_refresh(&node, "1y").await;
    let error = failure_of(&env, &node).await;
    assert!(
        error.contains("run")
            && error.contains("disk full")
            && error.contains("annotate the Machine again"),
        "{error}"
    );
    assert_no_secrets(&env, &node, &error);
    assert_no_secrets(&env, &node, &controller.log());

    env.sim.clear_fault(&fault).await.unwrap();
    env.annotate_refresh(&node, "1y").await;
    let annotations = env.wait_for_refresh(&node, TIMEOUT).await;
    assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "done");
}

#[tokio::test]
async fn a_rejected_token_names_the_secret_to_check() {
    let env = shared().await;
    let node = env.cluster("alpha").node("alpha-cp-1").clone();
    env.isolate(&node, "k8sd-401").await;
    let _controller = env.start_controller("k8sd-401", &[]);
    env.sim
        .inject(
            &Fault::error(401, "invalid token")
                .on(&node)
                .at(Endpoint::Plan),
        )
        .await
        .unwrap();
    env.annotate_refresh(&node, "1y").await;
    let error = failure_of(&env, &node).await;
    assert!(
        error.contains("fleet/alpha-token") && error.contains("node-token-alpha-cp-1"),
        "{error}"
    );
    let calls = env.sim.calls("alpha", &node.node).await.unwrap();
    assert_eq!(
        calls.iter().filter(|c| c.path == path::PLAN).count(),
        1,
        "a 401 is not retried"
    );
    assert!(calls.iter().all(|c| c.path != path::RUN));
}

#[tokio::test]
async fn a_hung_node_times_out_and_does_not_block_another_machine() {
    let env = shared().await;
    let alpha = env.cluster("alpha");
    let hung = alpha.node("alpha-md-0-w0").clone();
    let healthy = alpha.node("alpha-md-0-w1").clone();
    for node in [&hung, &healthy] {
        env.isolate(node, "hang").await;
    }
    let _controller = env.start_controller(
        "hang",
        &[
            "--k8sd-timeout=1s",
            "--k8sd-attempts=2",
            "--max-worker-refreshes-per-cluster=2",
        ],
    );
    env.sim
        .inject(&Fault::hang().on(&hung).at(Endpoint::Plan))
        .await
        .unwrap();
    env.annotate_refresh(&hung, "1y").await;
    env.wait_for_call(&hung, path::PLAN, TIMEOUT, |_| true)
        .await;
    env.annotate_refresh(&healthy, "1y").await;
    let annotations = env.wait_for_refresh(&healthy, TIMEOUT).await;
    assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "done");
    let error = failure_of(&env, &hung).await;
    assert!(
        error.contains("no answer within 1s") && error.contains("k8sd-proxy"),
        "{error}"
    );
}

#[tokio::test]
async fn a_starting_node_is_retried_until_it_answers() {
    let env = shared().await;
    let node = env.cluster("beta").node("beta-cp-0").clone();
    env.isolate(&node, "503").await;
    let _controller = env.start_controller("503", &[]);
    env.sim
        .inject(&Fault::unavailable().on(&node).at(Endpoint::Plan).times(2))
        .await
        .unwrap();
    env.annotate_refresh(&node, "1y").await;
    let annotations = env.wait_for_refresh(&node, TIMEOUT).await;
    assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "done");
    let calls = env.sim.calls("beta", &node.node).await.unwrap();
    // Other tests may use this control plane to approve their workers: look at plan and run.
    let statuses: Vec<(String, u16)> = calls
        .iter()
        .filter(|c| c.path == path::PLAN || c.path == path::RUN)
        .map(|c| (c.endpoint.clone(), c.status))
        .collect();
    assert_eq!(
        statuses,
        [
            ("plan".into(), 503),
            ("plan".into(), 503),
            ("plan".into(), 200),
            ("run".into(), 200)
        ]
    );
}

#[tokio::test]
async fn a_denied_csr_fails_the_worker_refresh() {
    let env = shared().await;
    // The deny applies to a whole cluster: gamma, which no other test here uses.
    let node = env.cluster("gamma").node("alpha-md-0-w1").clone();
    env.isolate(&node, "csr-deny").await;
    let _controller = env.start_controller("csr-deny", &[]);
    let fault = env
        .sim
        .inject(&Fault::csr_deny().on_cluster("gamma"))
        .await
        .unwrap();
    env.annotate_refresh(&node, "1y").await;
    let error = failure_of(&env, &node).await;
    env.sim.clear_fault(&fault).await.unwrap();
    assert!(error.contains("denied"), "{error}");
}

#[tokio::test]
async fn a_reinstalled_node_fails_the_pin_until_the_operator_re_pins_it() {
    let env = shared().await;
    let node = env.cluster("beta").node("beta-md-0-w0").clone();
    env.isolate(&node, "repin").await;
    let _controller = env.start_controller("repin", &[]);
    env.wait_for_machine(&node, TIMEOUT, |a| {
        a.contains_key(ck8s_certs_api::annotations::CERTIFICATES_EXPIRY)
    })
    .await;
    let pinned = env
        .machine_certificates(&node)
        .await
        .unwrap()
        .status
        .unwrap()
        .k8sd_fingerprint
        .unwrap();
    env.sim.reinstall(&node, None).await.unwrap();

    env.annotate_refresh(&node, "1y").await;
    let error = failure_of(&env, &node).await;
    assert!(
        error.contains(&pinned) && error.contains("kubectl patch machinecertificates"),
        "{error}"
    );
    assert!(
        env.sim
            .calls("beta", &node.node)
            .await
            .unwrap()
            .iter()
            .all(|c| c.path != path::PLAN),
        "nothing sent to an unverified peer"
    );

    // The documented fix, as kubectl sends it.
    let api: kube::Api<ck8s_certs_api::machine_certificates::MachineCertificates> =
        kube::Api::namespaced(env.management().await.unwrap(), &node.namespace);
    let remove: json_patch::Patch = serde_json::from_value(
        serde_json::json!([{ "op": "remove", "path": "/status/k8sdFingerprint" }]),
    )
    .unwrap();
    api.patch_status(
        &node.machine,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::<()>::Json(remove),
    )
    .await
    .unwrap();
    env.annotate_refresh(&node, "1y").await;
    let annotations = env.wait_for_refresh(&node, TIMEOUT).await;
    assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "done");
    let repinned = env
        .machine_certificates(&node)
        .await
        .unwrap()
        .status
        .unwrap()
        .k8sd_fingerprint
        .unwrap();
    assert_eq!(
        repinned,
        env.sim.node(&node).await.unwrap().k8sd_fingerprint_sha256
    );
    assert_ne!(repinned, pinned);
}
