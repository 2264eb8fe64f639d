//! A node cannot exhaust the controller's memory: k8sd answers are read up to a cap (1 MiB), so a
//! node that streams a 100 MiB answer fails its own refresh with a message that says why, gets no
//! `run` after such a `plan`, and the controller — which serves the whole fleet — keeps a small
//! peak memory and goes on refreshing healthy nodes.
//!
//! A tenant of a workload cluster cannot have its own CSR approved through a worker's refresh:
//! k8sd's `approve` approves by name, so the controller checks the seed's CSRs first.

use std::time::{Duration, Instant};

use ck8s_certs::k8sd::client::MAX_ANSWER_BYTES;
use ck8s_certs::k8sd::wire::path;
use ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS;
use ck8s_certs_e2e::fixtures::{NodeInfo, Role};
use ck8s_certs_e2e::sim::{Endpoint, Fault};
use ck8s_certs_e2e::users::Grant;
use ck8s_certs_e2e::{Environment, shared_of};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

/// The standard clusters these tests use; the others are not started.
const CLUSTERS: &[&str] = &["alpha", "beta"];

const TIMEOUT: Duration = Duration::from_secs(90);
/// What the hostile node answers: 100 times the cap.
const HUGE: u64 = 100 << 20;
/// The controller's peak resident memory must stay far below the answer it was sent.
const PEAK_BOUND_KIB: u64 = 200 << 10;

/// `VmHWM` (peak resident set) of a process, in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|line| {
            line.strip_prefix("VmHWM:")?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .expect("VmHWM in /proc/<pid>/status")
}

/// Says the answer was too large: not a decode error of a body read in full.
fn assert_too_large(error: &str, step: &str) {
    assert!(
        error.contains(&format!("Refreshing failed at {step}"))
            && error.contains(&format!("larger than {MAX_ANSWER_BYTES} bytes"))
            && !error.contains("not a k8sd envelope")
            && !error.contains("unexpected metadata"),
        "{error}"
    );
}

/// What the node simulator logged of its huge answers: the bytes it got out before the client
/// left, one entry per answer so far.
fn huge_answers_sent(env: &Environment) -> Vec<u64> {
    let log = std::fs::read_to_string(env.dir.join("nodesim.log")).unwrap_or_default();
    log.lines()
        .filter_map(|line| {
            let rest = line.split("k8sd huge answer: ").nth(1)?;
            rest.split(' ').next()?.parse().ok()
        })
        .collect()
}

/// Injects `fault` on `node`, annotates a refresh and waits for it to fail; says how long that
/// took. Returns the failure.
async fn failure_with(env: &Environment, node: &NodeInfo, fault: Fault, what: &str) -> String {
    let started = Instant::now();
    env.sim.inject(&fault.on(node)).await.unwrap();
    env.annotate_refresh(node, "1y").await;
    let error = env.refresh_failure(node, TIMEOUT).await;
    println!("{what}: failed after {:?}: {error}", started.elapsed());
    error
}

async fn wait_for_huge_answers(env: &Environment, count: usize) -> Vec<u64> {
    let start = Instant::now();
    loop {
        let sent = huge_answers_sent(env);
        if sent.len() >= count || start.elapsed() > TIMEOUT {
            return sent;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_node_answering_100_mib_fails_its_refresh_without_exhausting_the_controller() {
    let env = shared_of(CLUSTERS).await;
    let machines = ["alpha-md-0-w0", "alpha-cp-1", "alpha-md-0-w1"];
    let [hostile_worker, hostile_control_plane, healthy] =
        env.isolated("alpha", machines, "hostile").await;
    let mut controller = env.start_controller("hostile", &[]);
    controller.wait_until_ready(TIMEOUT).await;
    let started_kib = peak_kib(controller.process.pid());

    // A worker whose plan answers 100 MiB (200, a k8sd envelope padded inside a string).
    let huge_plan = Fault::huge(HUGE).at(Endpoint::Plan);
    let plan_error = failure_with(&env, &hostile_worker, huge_plan, "huge plan answer").await;
    let calls = env.calls(&hostile_worker).await;
    let plans: Vec<_> = calls.iter().filter(|c| c.path == path::PLAN).collect();
    assert!(
        !plans.is_empty() && plans.iter().all(|c| c.fault == "huge"),
        "{calls:#?}"
    );
    assert!(
        calls.iter().all(|c| c.path != path::RUN),
        "a run followed a huge plan answer: {calls:#?}"
    );
    println!("plan calls to the hostile worker: {}", plans.len());

    // A control plane whose run answers a 100 MiB error (500): error bodies are capped too.
    let huge_error = Fault::huge(HUGE).with_status(500).at(Endpoint::Run);
    let run_error = failure_with(
        &env,
        &hostile_control_plane,
        huge_error,
        "huge run error answer",
    )
    .await;
    let runs: Vec<_> = env
        .calls(&hostile_control_plane)
        .await
        .into_iter()
        .filter(|c| c.path == path::RUN)
        .collect();
    assert!(
        !runs.is_empty() && runs.iter().all(|c| c.fault == "huge" && c.status == 500),
        "{runs:#?}"
    );

    // What the nodes got out: the controller hung up long before the end, not drained them.
    let sent = wait_for_huge_answers(&env, plans.len() + runs.len()).await;
    println!("bytes the node got out before the controller hung up: {sent:?} of {HUGE} each");

    let peak = peak_kib(controller.process.pid());
    println!(
        "controller VmHWM: {} KiB ({} MiB) after the huge answers, {} KiB once ready; bound {} MiB",
        peak,
        peak >> 10,
        started_kib,
        PEAK_BOUND_KIB >> 10
    );
    assert_too_large(&plan_error, "plan");
    assert_too_large(&run_error, "run");
    assert_eq!(sent.len(), plans.len() + runs.len(), "{sent:?}");
    assert!(sent.iter().all(|&n| n < HUGE), "{sent:?}");
    assert!(peak < PEAK_BOUND_KIB, "VmHWM {peak} KiB");
    // It never held an answer: its peak grew by far less than one of them.
    assert!(
        (peak - started_kib) << 10 < HUGE / 2,
        "VmHWM grew from {started_kib} to {peak} KiB"
    );

    // The controller keeps working: a healthy worker is refreshed.
    controller
        .process
        .check_running()
        .expect("controller alive");
    env.annotate_refresh(&healthy, "1y").await;
    let annotations = env.wait_for_refresh(&healthy, TIMEOUT).await;
    assert_eq!(
        annotations[REFRESH_CERTIFICATES_STATUS], "done",
        "{annotations:#?}"
    );
    let calls = env.calls(&healthy).await;
    assert!(calls.iter().all(|c| c.fault.is_empty()), "{calls:#?}");
    println!(
        "controller VmHWM at the end: {} KiB",
        peak_kib(controller.process.pid())
    );
}

/// A PEM certificate request for `common_name` in `organization` naming `dns`, signed by a fresh
/// key: what a tenant can make.
fn certificate_request(common_name: &str, organization: &str, dns: &[&str]) -> String {
    let mut params =
        rcgen::CertificateParams::new(dns.iter().map(|d| d.to_string()).collect::<Vec<_>>())
            .expect("SANs");
    let mut subject = rcgen::DistinguishedName::new();
    subject.push(rcgen::DnType::CommonName, common_name);
    subject.push(rcgen::DnType::OrganizationName, organization);
    params.distinguished_name = subject;
    let key = rcgen::KeyPair::generate().expect("a key");
    params
        .serialize_request(&key)
        .and_then(|r| r.pem())
        .expect("a request")
}

/// A tenant who may create CSRs in a workload cluster learns the seed of a worker's refresh
/// (it is in the request's status before `run` creates the CSRs) and creates the worker's
/// serving CSR under it first, naming the cluster's API server. Released k8sd's `approve` would
/// approve it by name and the signer would copy its SANs. The controller reads and checks the
/// seed's CSRs before every `approve`: none is sent for that seed, the tenant's CSR is denied,
/// an `UnverifiedCSR` Event says which field and whose CSR, and the refresh plans again and
/// succeeds with CSRs the node made.
#[tokio::test]
async fn a_tenants_csr_under_a_leaked_seed_is_never_approved_and_the_refresh_plans_again() {
    let env = shared_of(CLUSTERS).await;
    let [worker] = env.isolated("beta", ["beta-md-0-w0"], "csr-check").await;
    let _controller = env.start_controller("csr-check", &[]);
    let cluster = env.cluster("beta");
    let rules = json!([{
        "apiGroups": ["certificates.k8s.io"],
        "resources": ["certificatesigningrequests"],
        "verbs": ["create", "get", "list", "watch"]
    }]);
    let (tenant, tenant_name) = cluster
        .user("default", "csr-maker", Grant::ClusterRules(rules))
        .await;
    // The worker's first run waits before it creates its CSRs: the tenant's moment (a race it
    // can also win by watching CSRs; the wait makes the test certain).
    let wait = Fault::latency(Duration::from_secs(8))
        .at(Endpoint::Run)
        .times(1);
    env.sim.inject(&wait.on(&worker)).await.unwrap();
    for control_plane in cluster.nodes_with_role(Role::ControlPlane) {
        env.sim
            .clear_calls("beta", &control_plane.node)
            .await
            .unwrap();
    }
    env.annotate_refresh(&worker, "90d").await;

    let started = Instant::now();
    let leaked = loop {
        if let Some(seed) = env.in_flight(&worker).await.and_then(|op| op.seed) {
            break seed;
        }
        assert!(started.elapsed() < TIMEOUT, "no seed recorded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let name = format!("k8sd-{leaked}-worker-kubelet-serving");
    let node_name = format!("system:node:{}", worker.node);
    let request = certificate_request(
        &node_name,
        "system:nodes",
        &[
            &worker.node,
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ],
    );
    let forged: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "request": base64_encode(request.as_bytes()),
            "signerName": "k8sd.io/kubelet-serving",
            "usages": ["digital signature", "key encipherment", "server auth"],
            "expirationSeconds": 90 * 86_400
        }
    }))
    .unwrap();
    Api::<CertificateSigningRequest>::all(tenant)
        .create(&PostParams::default(), &forged)
        .await
        .expect("the tenant may create CSRs");
    println!(
        "tenant CSR {name} created {:?} after the refresh started",
        started.elapsed()
    );

    env.wait_for_done(&worker, TIMEOUT).await;
    let op = env.operation(&worker).await;
    assert_ne!(op.seed, Some(leaked), "{op:#?}");
    assert_eq!(op.run_attempts, 2, "{op:#?}");

    // No approve was sent for the leaked seed, to any control plane; the new one was approved.
    let mut approved = Vec::new();
    for control_plane in cluster.nodes_with_role(Role::ControlPlane) {
        let calls = env.sim.calls("beta", &control_plane.node).await.unwrap();
        approved.extend(
            calls
                .iter()
                .filter(|c| c.path == path::APPROVE)
                .map(|c| c.seed()),
        );
    }
    assert!(
        !approved.contains(&leaked),
        "approve sent for the leaked seed: {approved:?}"
    );
    assert!(approved.contains(&op.seed.unwrap()), "{approved:?}");

    // The tenant's CSR: denied by the controller, never approved, never signed.
    let csrs: Api<CertificateSigningRequest> = Api::all(cluster.client().await.unwrap());
    let status = csrs.get(&name).await.unwrap().status.unwrap_or_default();
    let conditions = status.conditions.unwrap_or_default();
    assert!(
        conditions.iter().any(|c| c.type_ == "Denied"
            && c.reason.as_deref() == Some(ck8s_certs::workload::csrs::DENIED_REASON)),
        "{conditions:#?}"
    );
    assert!(
        !conditions.iter().any(|c| c.type_ == "Approved"),
        "{conditions:#?}"
    );
    assert!(status.certificate.is_none());
    // The refresh's own CSRs were made by the node.
    let seed = op.seed.unwrap();
    let genuine = csrs
        .get(&format!("k8sd-{seed}-worker-kubelet-serving"))
        .await
        .unwrap();
    assert_eq!(genuine.spec.username.as_deref(), Some(node_name.as_str()));

    let events = env.machine_events(&worker).await;
    let event = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("UnverifiedCSR"))
        .unwrap_or_else(|| panic!("no UnverifiedCSR Event: {events:#?}"));
    let note = event.note.clone().unwrap_or_default();
    println!("UnverifiedCSR: {note}");
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        note.contains(&name) && note.contains("spec.username") && note.contains(&tenant_name),
        "{note}"
    );
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
