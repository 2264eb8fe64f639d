//! The environment end to end: a real workload API server port-forwards to a simulated node's
//! k8sd, which speaks the wire protocol exactly. These tests pin the behaviour every later
//! controller test relies on.

use std::time::Duration;

use ck8s_certs::k8sd::wire::{
    self, ApproveRequest, PlanRequest, PlanResponse, RunRequest, RunResponse, path,
};
use ck8s_certs::k8sd::{K8sdError, Token, client::Auth};
use ck8s_certs_e2e::fixtures::Role;
use ck8s_certs_e2e::k8sd::{CAPI, NODE, TIMEOUT};
use ck8s_certs_e2e::sim::{Endpoint, Fault};
use ck8s_certs_e2e::{Environment, shared_of};
use http::Method;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Api;

/// The standard clusters these tests use; the others are not started.
const CLUSTERS: &[&str] = &["alpha", "beta"];

fn post_json(body: &str) -> Option<Vec<u8>> {
    Some(body.as_bytes().to_vec())
}

#[tokio::test]
async fn get_root_through_the_workload_port_forward_reaches_exactly_the_chosen_node() {
    let env = shared_of(CLUSTERS).await;
    // Each test uses its own nodes: a `run` elsewhere restarts that node's k8sd.
    let node = env.cluster("beta").node("beta-md-0-w0").clone();

    let mut k8sd = env.k8sd(&node).await;
    let response = k8sd
        .raw(Method::GET, path::ROOT, &[], None, TIMEOUT)
        .await
        .unwrap();
    assert_eq!(response.status, 200);
    let envelope: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
    assert_eq!(
        envelope,
        serde_json::json!({
            "type": "sync", "status": "Success", "status_code": 200, "operation": "",
            "error_code": 0, "error": "", "metadata": ["/1.0"]
        })
    );
    // A second request on the same connection (keep-alive through the tunnel).
    assert_eq!(k8sd.probe(TIMEOUT).await.unwrap(), ["/1.0"]);

    let state = env.sim.node(&node).await.unwrap();
    assert_eq!(
        k8sd.fingerprint().to_string(),
        state.k8sd_fingerprint_sha256
    );
    let calls = env.sim.calls("", "").await.unwrap();
    let here: Vec<_> = calls
        .iter()
        .filter(|c| c.cluster == "beta" && c.node == node.node)
        .collect();
    assert!(here.len() >= 2, "{calls:#?}");
    // Tests run concurrently: other nodes may see calls, but nothing of ours lands elsewhere.
    assert!(here.iter().all(|c| c.path == "/" && c.method == "GET"));
}

#[tokio::test]
async fn the_direct_transport_reaches_the_node_address_and_microcluster_port() {
    let env = shared_of(CLUSTERS).await;
    let node = env.cluster("beta").node("beta-cp-0").clone();
    assert_eq!(
        node.microcluster_port, 6543,
        "beta uses a non-default microcluster port"
    );
    let mut k8sd = env
        .connect(&node, &Environment::direct_route(&node), None)
        .await
        .unwrap();
    assert_eq!(k8sd.probe(TIMEOUT).await.unwrap(), ["/1.0"]);

    // The same certificate is served whichever way the bytes travel, so a pin taken over one
    // transport holds over the other.
    let pin = k8sd.fingerprint();
    let route = env.port_forward_route(&node).await.unwrap();
    let mut pinned = env.connect(&node, &route, Some(pin)).await.unwrap();
    assert_eq!(pinned.probe(TIMEOUT).await.unwrap(), ["/1.0"]);
}

#[tokio::test]
async fn a_pin_mismatch_fails_the_handshake_with_both_fingerprints() {
    let env = shared_of(CLUSTERS).await;
    let node = env.cluster("alpha").node("alpha-md-0-w1").clone();
    let wrong = ck8s_certs::k8sd::Fingerprint::of(b"some other certificate");
    let route = env.port_forward_route(&node).await.unwrap();
    let err = env
        .connect(&node, &route, Some(wrong))
        .await
        .err()
        .expect("mismatch");
    match err {
        K8sdError::PinMismatch {
            pinned, presented, ..
        } => {
            assert_eq!(pinned, wrong);
            assert_eq!(
                presented.to_string(),
                env.sim.node(&node).await.unwrap().k8sd_fingerprint_sha256
            );
        }
        other => panic!("expected a pin mismatch, got {other}"),
    }
}

#[tokio::test]
async fn an_unknown_json_field_is_a_400_from_strict_decoding() {
    let env = shared_of(CLUSTERS).await;
    let node = env.cluster("alpha").node("alpha-cp-0").clone();
    let token = env.node_token(&node);
    let mut k8sd = env.k8sd(&node).await;
    let headers = [(NODE, token_value(&token))];
    let response = k8sd
        .raw(
            Method::POST,
            path::PLAN,
            &headers,
            post_json(r#"{"certificates":null,"bogus":1}"#),
            TIMEOUT,
        )
        .await
        .unwrap();
    let err = response.decode::<PlanResponse>("plan").unwrap_err();
    assert!(
        matches!(&err, K8sdError::Api { status: 400, message, .. } if message.starts_with("failed to parse request")),
        "{err}"
    );
    // An empty body is a 400 too.
    let response = k8sd
        .raw(Method::POST, path::PLAN, &headers, None, TIMEOUT)
        .await
        .unwrap();
    assert_eq!(response.status, 400);
    // The exact documented request succeeds.
    let plan = node_plan(&mut k8sd, &token, TIMEOUT).await.unwrap();
    assert_eq!(
        plan.certificate_signing_requests, None,
        "a control plane names no CSRs"
    );
}

#[tokio::test]
async fn tokens_are_checked_against_this_nodes_machine() {
    let env = shared_of(CLUSTERS).await;
    let [node, other_machine] = env.nodes("alpha", ["alpha-md-0-w0", "alpha-md-0-w1"]);
    let mut k8sd = env.k8sd(&node).await;
    let expect_401 = |err: K8sdError, text: &str| match err {
        K8sdError::Api {
            status: 401,
            message,
            ..
        } => assert_eq!(message, text),
        other => panic!("expected 401 {text:?}, got {other}"),
    };
    expect_401(
        plan(&mut k8sd, vec![]).await,
        r#"missing header "node-token""#,
    );
    expect_401(
        plan(&mut k8sd, vec![(NODE, "0".repeat(32))]).await,
        "invalid token",
    );
    let foreign = token_value(&env.node_token(&other_machine)).to_owned();
    expect_401(
        plan(&mut k8sd, vec![(NODE, foreign)]).await,
        "invalid token",
    );
    // The cluster-wide token is not a node token either.
    let capi = token_value(&env.capi_auth_token("alpha")).to_owned();
    expect_401(plan(&mut k8sd, vec![(NODE, capi)]).await, "invalid token");
    // A beta node's token on alpha: same machine index, other cluster.
    let beta_twin = env.cluster("beta").node("beta-md-0-w0").clone();
    let beta_token = token_value(&env.node_token(&beta_twin)).to_owned();
    expect_401(
        plan(&mut k8sd, vec![(NODE, beta_token)]).await,
        "invalid token",
    );
}

#[tokio::test]
async fn a_worker_refresh_runs_plan_then_run_alongside_approve_and_signs_three_csrs() {
    let env = shared_of(CLUSTERS).await;
    let beta = env.cluster("beta");
    let worker = beta.node("beta-md-0-w1").clone();
    let control_plane = beta
        .nodes_with_role(Role::ControlPlane)
        .next()
        .unwrap()
        .clone();
    let node_token = env.node_token(&worker);
    let capi_token = env.capi_auth_token("beta");

    let mut on_worker = env.k8sd(&worker).await;
    let plan = node_plan(&mut on_worker, &node_token, TIMEOUT)
        .await
        .unwrap();
    let seed = plan.seed;
    let names = [
        format!("k8sd-{seed}-worker-kubelet-serving"),
        format!("k8sd-{seed}-worker-kubelet-client"),
        format!("k8sd-{seed}-worker-kube-proxy-client"),
    ];
    assert_eq!(
        plan.certificate_signing_requests.as_deref(),
        Some(&names[..])
    );

    let mut on_control_plane = env.k8sd(&control_plane).await;
    let ttl = 90 * 24 * 3600;
    let run_request = RunRequest {
        certificates: None,
        seed,
        expiration_seconds: ttl,
        extra_sans: None,
    };
    let run = on_worker.call::<_, RunResponse>(
        path::RUN,
        node_auth(&node_token),
        &run_request,
        Duration::from_secs(60),
    );
    let approve_request = ApproveRequest { seed };
    let approve = on_control_plane.call::<_, wire::ApproveResponse>(
        path::APPROVE,
        Auth {
            header: CAPI,
            token: &capi_token,
        },
        &approve_request,
        Duration::from_secs(60),
    );
    let (run, approve) = tokio::join!(run, approve);
    approve.unwrap();
    let run = run.unwrap();

    let csrs: Api<CertificateSigningRequest> = Api::all(beta.client().await.unwrap());
    for name in &names {
        let csr = csrs.get(name).await.unwrap();
        assert_eq!(csr.spec.expiration_seconds, Some(ttl as i32), "{name}");
        assert!(csr.spec.signer_name.starts_with("k8sd.io/"), "{name}");
        let status = csr.status.unwrap_or_default();
        let conditions = status.conditions.unwrap_or_default();
        assert!(
            conditions.iter().any(|c| c.type_ == "Approved"
                && c.status == "True"
                && c.reason.as_deref() == Some("ApprovedByCK8sCAPI")),
            "{name}: {conditions:?}"
        );
        let pem = status.certificate.expect("signed").0;
        let (_, der) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
        let cert = der.parse_x509().unwrap();
        // Published k8sd's signer ignores spec.expirationSeconds and signs for ten years.
        let lifetime =
            cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
        assert!(lifetime > 9 * 365 * 24 * 3600, "{name}: {lifetime}s");
    }

    // run answers the new kubelet certificate's NotAfter as a Unix timestamp, which is also
    // the node's current certificate.
    let state = env.sim.node(&worker).await.unwrap();
    let not_after = jiff::Timestamp::from_second(run.expiration_seconds).unwrap();
    assert_eq!(
        state.cert_not_after.parse::<jiff::Timestamp>().unwrap(),
        not_after
    );
    assert!(not_after > jiff::Timestamp::now() + jiff::SignedDuration::from_hours(9 * 365 * 24));

    // Only this worker ran, and the approve went to the chosen control plane of the same cluster.
    let calls = env.sim.calls("", "").await.unwrap();
    let runs: Vec<_> = calls
        .iter()
        .filter(|c| c.path == path::RUN && c.body.contains(&seed.to_string()))
        .collect();
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert_eq!(
        (runs[0].cluster.as_str(), runs[0].node.as_str()),
        ("beta", worker.node.as_str())
    );
    assert_eq!(
        runs[0].headers,
        [
            "content-length",
            "content-type",
            "host",
            "node-token",
            "user-agent"
        ]
    );
    let approves: Vec<_> = calls
        .iter()
        .filter(|c| c.path == path::APPROVE && c.body.contains(&seed.to_string()))
        .collect();
    assert_eq!(approves.len(), 1);
    assert_eq!(approves[0].node, control_plane.node);
    assert!(
        calls
            .iter()
            .all(|c| !c.body.contains(token_value(&node_token))),
        "bodies carry no tokens"
    );
}

#[tokio::test]
async fn an_injected_hang_times_out_on_the_client_side() {
    let env = shared_of(CLUSTERS).await;
    let node = env.cluster("alpha").node("alpha-cp-1").clone();
    let id = env
        .sim
        .inject(&Fault::hang().on(&node).at(Endpoint::Plan))
        .await
        .unwrap();
    let token = env.node_token(&node);
    let mut k8sd = env.k8sd(&node).await;
    let started = std::time::Instant::now();
    let err = node_plan(&mut k8sd, &token, Duration::from_millis(800))
        .await
        .unwrap_err();
    env.sim.clear_fault(&id).await.unwrap();
    assert!(matches!(err, K8sdError::Timeout { .. }), "{err}");
    assert!(err.is_retryable());
    assert!(started.elapsed() < Duration::from_secs(5));

    // Cleared: a new connection works again.
    let mut k8sd = env.k8sd(&node).await;
    node_plan(&mut k8sd, &token, TIMEOUT).await.unwrap();
}

#[tokio::test]
async fn injected_faults_surface_as_typed_errors() {
    let env = shared_of(CLUSTERS).await;
    let node = env.cluster("alpha").node("alpha-md-0-w1").clone();
    let token = env.node_token(&node);
    let auth = node_auth(&token);
    type Check = Box<dyn Fn(&K8sdError) -> bool>;
    let cases: Vec<(Fault, Check)> = vec![
        (
            Fault::unavailable(),
            Box::new(|e| {
                matches!(e, K8sdError::Api { status: 503, message, .. } if message == "Database is not yet initialized")
                    && e.is_retryable()
            }),
        ),
        (
            Fault::error(500, "boom"),
            Box::new(|e| {
                matches!(e, K8sdError::Api { status: 500, message, .. } if message == "boom")
                    && !e.is_retryable()
            }),
        ),
        (
            Fault::malformed(),
            Box::new(|e| matches!(e, K8sdError::InvalidResponse { .. })),
        ),
        (
            Fault::drop_connection(),
            Box::new(|e| matches!(e, K8sdError::Http { .. }) && e.is_retryable()),
        ),
    ];
    for (fault, expected) in cases {
        let kind = fault.kind.clone();
        let id = env
            .sim
            .inject(&fault.on(&node).at(Endpoint::Plan).times(1))
            .await
            .unwrap();
        let mut k8sd = env.k8sd(&node).await;
        let err = k8sd
            .call::<_, PlanResponse>(path::PLAN, auth, &PlanRequest::default(), TIMEOUT)
            .await
            .unwrap_err();
        env.sim.clear_fault(&id).await.ok();
        assert!(expected(&err), "{kind}: {err:?}");
    }
}

#[tokio::test]
async fn a_control_plane_run_issues_a_certificate_with_the_requested_lifetime_and_sans() {
    let env = shared_of(CLUSTERS).await;
    let beta = env.cluster("beta");
    let node = beta.node("beta-cp-1").clone();
    let token = env.node_token(&node);
    let auth = node_auth(&token);
    let mut k8sd = env.k8sd(&node).await;
    let plan: PlanResponse = k8sd
        .call(path::PLAN, auth, &PlanRequest::default(), TIMEOUT)
        .await
        .unwrap();
    let before = jiff::Timestamp::now();
    let sans = vec![
        "beta-api.example.com".to_owned(),
        "10.20.30.40".to_owned(),
        "beta.k8s.example.internal".to_owned(),
    ];
    let run: RunResponse = k8sd
        .call(
            path::RUN,
            auth,
            &RunRequest {
                certificates: None,
                seed: plan.seed,
                expiration_seconds: 3600,
                extra_sans: Some(sans.clone()),
            },
            TIMEOUT,
        )
        .await
        .unwrap();
    let not_after = jiff::Timestamp::from_second(run.expiration_seconds).unwrap();
    let expected = before + jiff::SignedDuration::from_secs(3600);
    assert!(
        not_after.duration_since(expected).abs() < jiff::SignedDuration::from_secs(10),
        "{not_after} vs {expected}"
    );
    let state = env.sim.node(&node).await.unwrap();
    for san in &sans {
        assert!(
            state.cert_sans.contains(san),
            "{san} missing from {:?}",
            state.cert_sans
        );
    }
    // The database certificates' expiry does not move with a refresh.
    assert_ne!(
        state.database_expiry.parse::<jiff::Timestamp>().unwrap(),
        not_after
    );
}

/// POSTs a valid plan body with exactly `headers`; returns the error it must produce.
async fn plan(
    k8sd: &mut ck8s_certs::k8sd::Connection,
    headers: Vec<(&'static str, String)>,
) -> K8sdError {
    let refs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    k8sd.raw(
        Method::POST,
        path::PLAN,
        &refs,
        post_json(r#"{"certificates":null}"#),
        TIMEOUT,
    )
    .await
    .unwrap()
    .decode::<PlanResponse>("plan")
    .unwrap_err()
}

/// A node's own credentials: its `node-token`.
fn node_auth(token: &Token) -> Auth<'_> {
    Auth {
        header: NODE,
        token,
    }
}

/// The documented `plan` request (an empty one) as the node itself.
async fn node_plan(
    k8sd: &mut ck8s_certs::k8sd::Connection,
    token: &Token,
    timeout: Duration,
) -> Result<PlanResponse, K8sdError> {
    k8sd.call(
        path::PLAN,
        node_auth(token),
        &PlanRequest::default(),
        timeout,
    )
    .await
}

fn token_value(token: &Token) -> &str {
    token.expose()
}
