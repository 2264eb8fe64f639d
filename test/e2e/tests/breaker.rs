//! The circuit breaker of automatic renewals, against the real environment: failed automatic
//! renewals of three Machines under one policy stop its automatic renewals (the policy says why,
//! with the failures); no further automatic `run` reaches k8sd, not even for a Machine that
//! becomes due afterwards; a manual annotation still works; only a person's resume (with
//! `kubectl ck8s-certs resume`, attributed through the requester-annotation admission policy)
//! lets automatic renewals go on.

use std::time::{Duration, Instant};

use ck8s_certs::k8sd::wire::path;
use ck8s_certs_api::annotations::{REQUESTER, RESUME_RENEWALS};
use ck8s_certs_api::machine_certificates::Origin;
use ck8s_certs_api::renewal_policy::{CertificateRenewalPolicy, CertificateRenewalPolicyStatus};
use ck8s_certs_e2e::fixtures::NodeInfo;
use ck8s_certs_e2e::sim::{Endpoint, Fault};
use ck8s_certs_e2e::{Binaries, Environment, shared};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(120);
const POLICY: &str = "breaker";

async fn policy_status(
    env: &Environment,
    done: impl Fn(&CertificateRenewalPolicyStatus) -> bool,
) -> CertificateRenewalPolicyStatus {
    env.policy_status_until("fleet", POLICY, TIMEOUT, "waited for", done)
        .await
}

fn halted(status: &CertificateRenewalPolicyStatus) -> Option<&str> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == "RenewalsHalted" && c.status == "True")
        .map(|c| c.message.as_str())
}

/// `run` calls the simulator recorded on each of `nodes`.
async fn runs(env: &Environment, nodes: &[&NodeInfo]) -> Vec<usize> {
    let mut counts = Vec::new();
    for node in nodes {
        let calls = env.calls(node).await;
        counts.push(calls.iter().filter(|c| c.path == path::RUN).count());
    }
    counts
}

async fn select(env: &Environment, node: &NodeInfo) {
    env.patch_machine(
        node,
        json!({ "metadata": { "labels": { "e2e-policy": POLICY } } }),
    )
    .await;
}

/// Waits for an Event about the policy with `reason` whose note satisfies `note` (Events are
/// published after the status is written).
async fn wait_policy_event(env: &Environment, reason: &str, note: impl Fn(&str) -> bool) {
    let api: Api<Event> = Api::namespaced(env.management().await.unwrap(), "fleet");
    let fields = format!("regarding.kind=CertificateRenewalPolicy,regarding.name={POLICY}");
    let start = Instant::now();
    loop {
        let events = api
            .list(&ListParams::default().fields(&fields))
            .await
            .unwrap()
            .items;
        if events.iter().any(|e| {
            e.reason.as_deref() == Some(reason) && note(e.note.as_deref().unwrap_or_default())
        }) {
            return;
        }
        assert!(start.elapsed() < TIMEOUT, "no {reason} Event: {events:#?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn three_failed_automatic_renewals_stop_the_policy_until_a_person_resumes_it() {
    let env = shared().await;
    env.install_admission_policies().await;
    let failing = [
        env.cluster("alpha").node("alpha-cp-0").clone(),
        env.cluster("beta").node("beta-cp-0").clone(),
        env.cluster("trio").node("trio-cp-0").clone(),
    ];
    let late = env.cluster("solo").node("solo-cp-0").clone();
    let mut faults = Vec::new();
    for node in &failing {
        let disk_full = Fault::error(500, "failed to generate certificates: disk full");
        faults.push(
            env.sim
                .inject(&disk_full.on(node).at(Endpoint::Run))
                .await
                .unwrap(),
        );
    }
    env.isolate_fresh(failing.iter().chain([&late]), POLICY)
        .await;
    env.create_policy(
        "fleet",
        POLICY,
        POLICY,
        json!({ "policy": "Automatic", "renewBefore": "100d", "ttl": "1y", "spread": "0s",
                "circuitBreaker": { "failures": 3, "period": "30m" } }),
    )
    .await;
    for node in &failing {
        select(&env, node).await;
    }
    let controller = env.start_controller(
        POLICY,
        &[
            "--requester-policy=ck8s-certs-requester-annotation",
            // Failed Machines are tried again within seconds: each still counts once.
            "--renewal-backoff-min=3s",
            "--renewal-backoff-max=6s",
        ],
    );

    // The third Machine's failure opens the breaker: the policy lists the failures.
    let status = policy_status(&env, |s| halted(s).is_some()).await;
    let breaker = status.breaker.clone().unwrap();
    assert_eq!(breaker.scope.as_deref(), Some("Policy"));
    let mut listed: Vec<&str> = breaker
        .failures
        .iter()
        .map(|f| f.machine.as_str())
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        ["fleet/alpha-cp-0", "fleet/beta-cp-0", "fleet/trio-cp-0"]
    );
    assert!(
        breaker
            .failures
            .iter()
            .all(|f| f.message.contains("disk full")),
        "{breaker:#?}"
    );
    let message = halted(&status).unwrap();
    assert!(
        message.starts_with("Automatic renewals stopped: 3 automatic renewal(s) failed within 30m under this policy (fleet/"),
        "{message}"
    );
    assert!(
        message.ends_with("resume with `kubectl ck8s-certs resume -n fleet breaker`"),
        "{message}"
    );

    // Every Machine of the policy is held, named for it, those that failed and one that became
    // due only now: nothing automatic reaches k8sd any more.
    select(&env, &late).await;
    for node in failing.iter().chain([&late]) {
        env.wait_for_status(node, TIMEOUT, "held by the breaker", |s| {
            s.renewal
                .as_ref()
                .is_some_and(|r| r.reason == "RenewalsHalted")
        })
        .await;
    }
    let everyone: Vec<&NodeInfo> = failing.iter().chain([&late]).collect();
    let before = runs(&env, &everyone).await;
    assert_eq!(before[3], 0, "the late Machine was never run");
    let held = env
        .machine_certificates(&late)
        .await
        .unwrap()
        .status
        .unwrap();
    let reason = held.renewal.unwrap();
    assert!(
        reason
            .message
            .contains("the circuit breaker of CertificateRenewalPolicy breaker is open"),
        "{reason:#?}"
    );
    assert!(
        controller
            .metric("ck8s_certs_renewals_halted_since_timestamp_seconds{namespace=\"fleet\",policy=\"breaker\",scope=\"policy\"}")
            .await
            .is_some()
    );
    wait_policy_event(&env, "CertificatesRenewalsHalted", |note| {
        note.starts_with("Automatic renewals stopped: 3 automatic renewal(s) failed within 30m")
    })
    .await;

    // A manual request still works, while the others stay held.
    env.annotate_refresh(&late, "1y").await;
    env.wait_for_done(&late, TIMEOUT).await;
    let manual = env
        .machine_certificates(&late)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(manual.operation.unwrap().origin, Origin::Manual);
    let after = runs(&env, &everyone).await;
    assert_eq!(
        after[..3],
        before[..3],
        "no automatic run while the breaker is open"
    );

    // A resume naming someone else is refused by the admission policy.
    let policies: Api<CertificateRenewalPolicy> =
        Api::namespaced(env.management().await.unwrap(), "fleet");
    let forged = json!({ "metadata": { "annotations": { RESUME_RENEWALS: "now", REQUESTER: "someone-else" } } });
    let refused = policies
        .patch(POLICY, &PatchParams::default(), &Patch::Merge(&forged))
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("may name only yourself"),
        "{refused}"
    );

    // The cause fixed, a person resumes with the plugin: recorded as that user, announced, and
    // the failed Machines are renewed automatically again.
    for fault in &faults {
        env.sim.clear_fault(fault).await.unwrap();
    }
    let plugin = env.dir.join("bin/kubectl-ck8s_certs");
    if !plugin.exists() {
        std::fs::create_dir_all(plugin.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(Binaries::controller().unwrap(), &plugin).unwrap();
    }
    let output = std::process::Command::new(&plugin)
        .args(["resume", "-n", "fleet", POLICY])
        .env("KUBECONFIG", &env.management_kubeconfig)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{said} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        said.starts_with("certificaterenewalpolicy fleet/breaker: resumed as "),
        "{said}"
    );
    let status = policy_status(&env, |s| halted(s).is_none()).await;
    let breaker = status.breaker.unwrap();
    let user = breaker.resumed_by.clone().unwrap();
    assert!(
        said.contains(&format!("resumed as {user} ")),
        "{said} / {user}"
    );
    assert!(!user.contains("unverified"), "{user}");
    for node in &failing {
        env.wait_for_status(node, TIMEOUT, "renewed after the resume", |s| {
            s.operation.as_ref().is_some_and(|op| {
                op.origin == Origin::Policy
                    && op.phase == ck8s_certs_api::machine_certificates::Phase::Succeeded
            })
        })
        .await;
    }
    let resumed =
        format!("Automatic renewals resumed by {user}: failures before now no longer count");
    wait_policy_event(&env, "CertificatesRenewalsResumed", |note| note == resumed).await;
}
