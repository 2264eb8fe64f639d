//! A refresh that fails says what failed and what to do, never leaves the Machine in-progress,
//! never calls k8sd for bad input, retries what is transient, and never blocks other Machines.

use std::time::Duration;

use ck8s_certs::k8sd::wire::path;
use ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS;
use ck8s_certs_e2e::Environment;
use ck8s_certs_e2e::fixtures::NodeInfo;
use ck8s_certs_e2e::shared;
use ck8s_certs_e2e::sim::{Endpoint, Fault};
use kube::Api;

const TIMEOUT: Duration = Duration::from_secs(90);

async fn failure_of(env: &Environment, node: &NodeInfo) -> String {
    let error = env.refresh_failure(node, TIMEOUT).await;
    // Every failure ends with the command that retries, then where to read more.
    let hint = format!(
        "Renew now: kubectl annotate machines.cluster.x-k8s.io {} -n {} v1beta2.k8sd.io/refresh-certificates=",
        node.machine, node.namespace
    );
    let details = format!(
        "Details: kubectl ck8s-certs explain {} -n {} (CertificateRefresh {}-",
        node.machine, node.namespace, node.machine
    );
    let mut sentences = error.rsplit(". ");
    let (last, retry) = (
        sentences.next().unwrap_or_default(),
        sentences.next().unwrap_or_default(),
    );
    assert!(
        last.starts_with(&details) && retry.starts_with(&hint) && retry.ends_with(" --overwrite"),
        "{error}"
    );
    error
}

/// Injects `fault`, annotates a refresh of `node` and waits for it to fail ([`failure_of`]);
/// returns the fault's id and the failure.
async fn failure_with(env: &Environment, node: &NodeInfo, fault: Fault) -> (String, String) {
    let id = env.sim.inject(&fault).await.unwrap();
    env.annotate_refresh(node, "1y").await;
    (id, failure_of(env, node).await)
}

/// Hangs `hung`'s `plan` and annotates it; once that call is in, annotates `other`, which is
/// refreshed meanwhile. Returns the failure of the hung refresh.
async fn hung_beside(env: &Environment, hung: &NodeInfo, other: &NodeInfo) -> String {
    env.sim
        .inject(&Fault::hang().on(hung).at(Endpoint::Plan))
        .await
        .unwrap();
    env.annotate_refresh(hung, "1y").await;
    env.wait_for_call(hung, path::PLAN, TIMEOUT, |_| true).await;
    env.annotate_refresh(other, "1y").await;
    env.wait_for_done(other, TIMEOUT).await;
    failure_of(env, hung).await
}

/// The k8sd certificate pinned for `node`, if any.
async fn pinned(env: &Environment, node: &NodeInfo) -> Option<String> {
    env.machine_certificates(node)
        .await
        .and_then(|r| r.status)
        .and_then(|s| s.k8sd_fingerprint)
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
    let [node] = env.isolated("alpha", ["alpha-cp-0"], "k8sd-500").await;
    let controller = env.start_controller("k8sd-500", &[]);
    let disk_full = Fault::error(500, "failed to generate certificates: disk full").on(&node);
    let (fault, error) = failure_with(&env, &node, disk_full.at(Endpoint::Run)).await;
    assert!(
        error.contains("run")
            && error.contains("disk full")
            && error.contains("Renew now: kubectl annotate machines.cluster.x-k8s.io")
            && error.contains(&format!(
                "Details: kubectl ck8s-certs explain {}",
                node.machine
            )),
        "{error}"
    );
    assert_no_secrets(&env, &node, &error);
    assert_no_secrets(&env, &node, &controller.log());

    env.sim.clear_fault(&fault).await.unwrap();
    env.annotate_refresh(&node, "1y").await;
    env.wait_for_done(&node, TIMEOUT).await;
}

#[tokio::test]
async fn a_rejected_token_names_the_secret_to_check() {
    let env = shared().await;
    let [node] = env.isolated("alpha", ["alpha-cp-1"], "k8sd-401").await;
    let _controller = env.start_controller("k8sd-401", &[]);
    let rejected = Fault::error(401, "invalid token")
        .on(&node)
        .at(Endpoint::Plan);
    let (_, error) = failure_with(&env, &node, rejected).await;
    assert!(
        error.contains("fleet/alpha-token") && error.contains("node-token-alpha-cp-1"),
        "{error}"
    );
    let calls = env.calls(&node).await;
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
    let [hung, healthy] = env.nodes("alpha", ["alpha-md-0-w0", "alpha-md-0-w1"]);
    env.isolate_all([&hung, &healthy], "hang").await;
    let _controller = env.start_controller(
        "hang",
        &[
            "--k8sd-timeout=1s",
            "--k8sd-attempts=2",
            "--max-worker-refreshes-per-cluster=2",
        ],
    );
    let error = hung_beside(&env, &hung, &healthy).await;
    assert!(
        error.contains("no answer within 1s") && error.contains("k8sd-proxy"),
        "{error}"
    );
}

#[tokio::test]
async fn a_starting_node_is_retried_until_it_answers() {
    let env = shared().await;
    let [node] = env.isolated("beta", ["beta-cp-0"], "503").await;
    let _controller = env.start_controller("503", &[]);
    env.sim
        .inject(&Fault::unavailable().on(&node).at(Endpoint::Plan).times(2))
        .await
        .unwrap();
    env.annotate_refresh(&node, "1y").await;
    env.wait_for_done(&node, TIMEOUT).await;
    let calls = env.calls(&node).await;
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
    let [node] = env.isolated("gamma", ["alpha-md-0-w1"], "csr-deny").await;
    let _controller = env.start_controller("csr-deny", &[]);
    let (fault, error) = failure_with(&env, &node, Fault::csr_deny().on_cluster("gamma")).await;
    env.sim.clear_fault(&fault).await.unwrap();
    assert!(error.contains("denied"), "{error}");
}

#[tokio::test]
async fn a_reinstalled_node_fails_the_pin_until_the_operator_re_pins_it() {
    let env = shared().await;
    let [node] = env.isolated("beta", ["beta-md-0-w0"], "repin").await;
    let _controller = env.start_controller("repin", &[]);
    env.wait_for_machine(&node, TIMEOUT, |a| {
        a.contains_key(ck8s_certs_api::annotations::CERTIFICATES_EXPIRY)
    })
    .await;
    let pin = pinned(&env, &node).await.unwrap();
    env.sim.reinstall(&node, None).await.unwrap();

    env.annotate_refresh(&node, "1y").await;
    let error = failure_of(&env, &node).await;
    assert!(
        error.contains(&pin) && error.contains("kubectl patch machinecertificates"),
        "{error}"
    );
    assert!(
        env.calls(&node).await.iter().all(|c| c.path != path::PLAN),
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
    env.wait_for_done(&node, TIMEOUT).await;
    let repinned = pinned(&env, &node).await.unwrap();
    assert_eq!(
        repinned,
        env.sim.node(&node).await.unwrap().k8sd_fingerprint_sha256
    );
    assert_ne!(repinned, pin);
}

/// A control plane first used to approve a worker's CSRs (outside the controller's scope, so
/// never pinned by its own expiry read) keeps the certificate it presented: after a reinstall
/// behind the operator's back, the cluster's approval token is not sent to it.
#[tokio::test]
async fn an_approver_s_first_use_certificate_is_kept() {
    let env = shared().await;
    let [control_plane] = env.nodes("solo", ["solo-cp-0"]);
    let [worker] = env.isolated("solo", ["solo-md-0-w0"], "approver-pin").await;
    let _controller = env.start_controller("approver-pin", &["--k8sd-attempts=2"]);
    assert!(
        pinned(&env, &control_plane).await.is_none(),
        "the control plane is outside every instance's scope: nothing pinned it"
    );

    env.annotate_refresh(&worker, "1y").await;
    env.wait_for_done(&worker, TIMEOUT).await;
    let pin = pinned(&env, &control_plane).await;
    let presented = env
        .sim
        .node(&control_plane)
        .await
        .unwrap()
        .k8sd_fingerprint_sha256;
    assert_eq!(pin.as_deref(), Some(presented.as_str()));

    env.sim.reinstall(&control_plane, None).await.unwrap();
    env.sim
        .clear_calls("solo", &control_plane.node)
        .await
        .unwrap();
    env.annotate_refresh(&worker, "1y").await;
    let error = failure_of(&env, &worker).await;
    assert!(
        error.contains(&presented) && error.contains(&control_plane.node),
        "{error}"
    );
    assert_no_secrets(&env, &worker, &error);
    assert!(
        env.calls(&control_plane)
            .await
            .iter()
            .all(|c| c.path != path::APPROVE),
        "the approval token never went to the unverified control plane"
    );
}

/// A worker whose node hangs gives its cluster back between its tries: a control plane of the
/// same cluster annotated after it is refreshed before the worker's tries end (by order of the
/// calls the nodes saw, not by a timed assertion).
#[tokio::test]
async fn a_hung_worker_does_not_hold_back_its_cluster_s_control_plane() {
    let env = shared().await;
    let [hung, control_plane] = env.nodes("trio", ["trio-md-0-w2", "trio-cp-2"]);
    env.isolate_fresh([&hung, &control_plane], "hung-worker")
        .await;
    let _controller =
        env.start_controller("hung-worker", &["--k8sd-timeout=2s", "--k8sd-attempts=3"]);
    let error = hung_beside(&env, &hung, &control_plane).await;
    assert!(error.contains("(3 tries)"), "{error}");

    let started = |call: &ck8s_certs_e2e::sim::CallRecord| -> jiff::Timestamp {
        call.started_at.parse().unwrap()
    };
    let cp_calls = env.calls(&control_plane).await;
    let cp_run = cp_calls
        .iter()
        .find(|c| c.path == path::RUN)
        .map(started)
        .expect("the control plane's run");
    let plans: Vec<jiff::Timestamp> = env
        .calls(&hung)
        .await
        .iter()
        .filter(|c| c.path == path::PLAN)
        .map(started)
        .collect();
    assert_eq!(plans.len(), 3, "{plans:?}");
    assert!(
        cp_run < plans[2],
        "the control plane ran at {cp_run}, after the worker's last try at {}",
        plans[2]
    );
}

/// After `run` answered, the management API refusing our outcome write costs the node no second
/// `run`: the write is tried again in place, then kept and written before anything else.
#[tokio::test]
async fn a_refused_outcome_write_never_sends_run_twice() {
    use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
    let env = shared().await;
    let [node] = env.nodes("trio", ["trio-md-0-w1"]);
    env.isolate_fresh([&node], "outcome-write").await;
    let management = env.management().await.unwrap();
    // The API server refuses this Machine's request a Succeeded status until it is allowed.
    let allow = "e2e.ck8s.io/allow-outcome";
    let policy_resource = |kind: &str, plural: &str| ApiResource {
        group: "admissionregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "admissionregistration.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    let name = "e2e-refuse-outcome";
    let policy: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": { "name": name },
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": { "resourceRules": [{
                "apiGroups": ["certificates.ck8s.io"], "apiVersions": ["*"],
                "operations": ["UPDATE"], "resources": ["certificaterefreshes/status"],
            }]},
            "validations": [{
                "expression": format!(
                    "!has(object.spec.target.machine) || object.spec.target.machine != '{}' || !has(object.status) || !has(object.status.operation) || object.status.operation.phase != 'Succeeded' || (has(object.metadata.annotations) && '{allow}' in object.metadata.annotations)",
                    node.machine
                ),
                "message": "refused by the test: the outcome write fails",
            }],
        },
    }))
    .unwrap();
    let binding: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": { "name": name },
        "spec": { "policyName": name, "validationActions": ["Deny"] },
    }))
    .unwrap();
    let policies: Api<DynamicObject> = Api::all_with(
        management.clone(),
        &policy_resource("ValidatingAdmissionPolicy", "validatingadmissionpolicies"),
    );
    let bindings: Api<DynamicObject> = Api::all_with(
        management.clone(),
        &policy_resource(
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
        ),
    );
    policies
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    // Policies take effect after the API server's informer sees them.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let _controller = env.start_controller("outcome-write", &[]);
    env.annotate_refresh(&node, "1y").await;
    // Refused until the in-place tries are spent (5 within ~15 s): the outcome is then kept.
    let refused = |request: &str| {
        ck8s_certs_e2e::controlplane::audited_writes(&env.dir, "management")
            .iter()
            .filter(|w| {
                w.object_ref.as_ref().is_some_and(|o| {
                    o.resource == "certificaterefreshes"
                        && o.subresource == "status"
                        && o.name == request
                }) && w.code().is_some_and(|c| c >= 400)
            })
            .count()
    };
    let deadline = std::time::Instant::now() + TIMEOUT;
    let request = loop {
        let annotations = env.machine_annotations(&node).await;
        if let Some(request) = annotations.get(ck8s_certs_api::annotations::IN_FLIGHT_REFRESH)
            && refused(request) >= 5
        {
            break request.clone();
        }
        assert!(std::time::Instant::now() < deadline, "{annotations:#?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let calls = env.calls(&node).await;
    assert_eq!(ck8s_certs_e2e::sim::answered_runs(&calls).len(), 1);
    assert_eq!(
        env.machine_annotations(&node).await[REFRESH_CERTIFICATES_STATUS],
        "in-progress"
    );

    // Allowed again: the kept outcome is written, and shown; the node saw one run.
    let requests: Api<ck8s_certs_api::certificate_refresh::CertificateRefresh> =
        Api::namespaced(management.clone(), &node.namespace);
    requests
        .patch(
            &request,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "metadata": { "annotations": { allow: "" } } })),
        )
        .await
        .unwrap();
    env.wait_for_done(&node, TIMEOUT).await;
    let calls = env.calls(&node).await;
    assert_eq!(
        ck8s_certs_e2e::sim::runs(&calls).len(),
        1,
        "one run reached the node: {calls:#?}"
    );
    let journaled = requests.get(&request).await.unwrap();
    assert_eq!(
        journaled
            .status
            .and_then(|s| s.operation)
            .map(|op| op.phase),
        Some(ck8s_certs_api::machine_certificates::Phase::Succeeded)
    );
    let _ = bindings.delete(name, &Default::default()).await;
    let _ = policies.delete(name, &Default::default()).await;
}
