//! Canaries first, against the real environment (issue 38): one policy over five clusters, two
//! of them canaries (`spec.canary.clusterSelector`). With a canary's `run` failing, the other
//! three do not start (no `run` reaches them) and the policy and the Machines say why; once that
//! canary renews on its retry, the others renew, each after both canaries' refreshes ended.
//! Its own test binary: five clusters of its own.

use std::time::{Duration, Instant};

use ck8s_certs::k8sd::wire::path;
use ck8s_certs_api::machine_certificates::{MachineCertificatesStatus, Phase};
use ck8s_certs_api::renewal_policy::CertificateRenewalPolicyStatus;
use ck8s_certs_e2e::fixtures::{ClusterSpec, NodeInfo};
use ck8s_certs_e2e::sim::{Endpoint, Fault};
use ck8s_certs_e2e::{EnvSpec, Environment, shared_with};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(120);
const POLICY: &str = "canary";
const NAMESPACE: &str = "fleet";
const CANARIES: [&str; 2] = ["canary-a", "canary-b"];
const OTHERS: [&str; 3] = ["other-a", "other-b", "other-c"];

/// Five clusters of two control planes (a refresh never takes a workload API down) on two
/// workload API servers.
fn spec() -> EnvSpec {
    let mut spec = EnvSpec::standard();
    let template = spec.clusters[0].clone();
    spec.clusters = CANARIES
        .iter()
        .chain(&OTHERS)
        .map(|name| ClusterSpec {
            name: (*name).to_owned(),
            namespace: NAMESPACE.into(),
            machine_prefix: (*name).to_owned(),
            control_planes: 2,
            workers: 0,
            endpoint_host: format!("{name}.k8s.example.internal"),
            ..template.clone()
        })
        .collect();
    spec.workload_servers = Some(2);
    spec
}

fn condition<'a>(status: &'a CertificateRenewalPolicyStatus, type_: &str) -> Option<&'a Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

async fn policy_until(
    env: &Environment,
    what: &str,
    done: impl Fn(&CertificateRenewalPolicyStatus) -> bool,
) -> CertificateRenewalPolicyStatus {
    env.policy_status_until(NAMESPACE, POLICY, TIMEOUT, what, done)
        .await
}

/// `run` calls the simulator recorded on `node`.
async fn runs(env: &Environment, node: &NodeInfo) -> usize {
    let calls = env.calls(node).await;
    calls.iter().filter(|c| c.path == path::RUN).count()
}

fn succeeded(status: &MachineCertificatesStatus) -> bool {
    status
        .operation
        .as_ref()
        .is_some_and(|op| op.phase == Phase::Succeeded)
}

#[tokio::test]
async fn the_others_renew_only_after_both_canaries_and_wait_while_one_fails() {
    let env = shared_with(spec).await;
    let node = |cluster: &str| {
        env.cluster(cluster)
            .node(&format!("{cluster}-cp-0"))
            .clone()
    };
    let canaries: Vec<NodeInfo> = CANARIES.iter().map(|c| node(c)).collect();
    let others: Vec<NodeInfo> = OTHERS.iter().map(|c| node(c)).collect();
    let client = env.management().await.unwrap();
    for cluster in CANARIES {
        env.cluster_api(client.clone(), NAMESPACE)
            .patch(
                cluster,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": { "tier": "canary" } } })),
            )
            .await
            .unwrap();
    }
    let failing = &canaries[1];
    let fault = env
        .sim
        .inject(
            &Fault::error(500, "failed to generate certificates: disk full")
                .on(failing)
                .at(Endpoint::Run),
        )
        .await
        .unwrap();
    env.isolate_fresh(canaries.iter().chain(&others), POLICY)
        .await;
    env.create_policy(
        NAMESPACE,
        POLICY,
        POLICY,
        json!({ "policy": "Automatic", "renewBefore": "100d", "ttl": "1y", "spread": "0s",
                "canary": { "clusterSelector": { "matchLabels": { "tier": "canary" } },
                            "maxWait": "1h" } }),
    )
    .await;
    for node in canaries.iter().chain(&others) {
        env.patch_machine(
            node,
            json!({ "metadata": { "labels": { "e2e-policy": POLICY } } }),
        )
        .await;
    }
    let _controller = env.start_controller(
        POLICY,
        // The failing canary is tried again within seconds (each failure counts once toward
        // the circuit breaker: it stays closed).
        &["--renewal-backoff-min=3s", "--renewal-backoff-max=6s"],
    );

    // One canary renewed, the other failed: the policy says which, the others are held for it.
    env.wait_for_status(&canaries[0], TIMEOUT, "the canary renewed", succeeded)
        .await;
    let status = policy_until(&env, "the failed canary named", |s| {
        condition(s, "CanariesPassed").is_some_and(|c| c.reason == "CanaryFailed")
    })
    .await;
    let held = condition(&status, "CanariesPassed").unwrap();
    assert_eq!(held.status, "False");
    assert!(
        held.message.contains(&format!(
            "the automatic renewal of canary Machine {NAMESPACE}/{} failed at",
            failing.machine
        )),
        "{held:#?}"
    );
    let canary_status = status.canaries.clone().unwrap();
    assert_eq!((canary_status.machines, canary_status.renewed), (2, 1));
    for other in &others {
        let status = env
            .wait_for_status(other, TIMEOUT, "held for the canary", |s| {
                s.renewal
                    .as_ref()
                    .is_some_and(|r| r.reason == "CanaryFailed")
            })
            .await;
        let message = status.renewal.unwrap().message;
        assert!(
            message.contains(&format!("canary Machine {NAMESPACE}/{}", failing.machine)),
            "{message}"
        );
    }
    // The failing canary was tried more than once meanwhile; nothing reached the others.
    let start = Instant::now();
    while runs(&env, failing).await < 2 {
        assert!(start.elapsed() < TIMEOUT, "the canary is not retried");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for other in &others {
        assert_eq!(runs(&env, other).await, 0, "{} was run", other.machine);
    }

    // The cause fixed: the canary renews on its retry, and only then the others.
    env.sim.clear_fault(&fault).await.unwrap();
    let mut canaries_ended = Vec::new();
    for canary in &canaries {
        let status = env
            .wait_for_status(canary, TIMEOUT, "the canary renewed", succeeded)
            .await;
        canaries_ended.push(status.operation.unwrap().finished_at.unwrap().0);
    }
    let last_canary = canaries_ended.into_iter().max().unwrap();
    for other in &others {
        let status = env
            .wait_for_status(other, TIMEOUT, "renewed after the canaries", succeeded)
            .await;
        let started = status.operation.unwrap().started_at.0;
        assert!(
            started >= last_canary,
            "{} started at {started}, before the last canary ended at {last_canary}",
            other.machine
        );
        assert_eq!(runs(&env, other).await, 1, "{}", other.machine);
    }
    let status = policy_until(&env, "the canaries passed", |s| {
        condition(s, "CanariesPassed").is_some_and(|c| c.status == "True")
    })
    .await;
    assert_eq!(
        condition(&status, "CanariesPassed").unwrap().reason,
        "CanariesRenewed"
    );
    assert_eq!(status.canaries.unwrap().renewed, 2);
}
