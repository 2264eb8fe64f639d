//! Automatic renewal under CertificateRenewalPolicies, against the real environment. Simulated
//! nodes start with 90-day certificates, so `renewBefore` / `failSafeMargin` around 100d put a
//! Machine "due" or "inside the fail-safe margin" right away; backoff uses seconds.

use std::time::{Duration, Instant};

use ck8s_certs::k8sd::wire::path;
use ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS;
use ck8s_certs_api::machine_certificates::{
    MachineCertificatesStatus, Origin, Phase, PolicyReference, WindowsStatus,
};
use ck8s_certs_api::renewal_policy::CertificateRenewalPolicy;
use ck8s_certs_e2e::fixtures::NodeInfo;
use ck8s_certs_e2e::policies::closed_window;
use ck8s_certs_e2e::sim::{Endpoint, Fault};
use ck8s_certs_e2e::{Environment, shared_of};
use kube::Api;
use kube::api::{ApiResource, DynamicObject};
use serde_json::json;

/// The standard clusters these tests use; the others are not started.
const CLUSTERS: &[&str] = &["alpha", "beta", "gamma"];

const TIMEOUT: Duration = Duration::from_secs(90);

/// Waits until the policy's status satisfies `done`.
async fn wait_policy(
    env: &Environment,
    namespace: &str,
    name: &str,
    done: impl Fn(&ck8s_certs_api::renewal_policy::CertificateRenewalPolicyStatus) -> bool,
) -> ck8s_certs_api::renewal_policy::CertificateRenewalPolicyStatus {
    // Read as a plain object: the spec may be one this version cannot decode.
    let api: Api<DynamicObject> = Api::namespaced_with(
        env.management().await.unwrap(),
        namespace,
        &ApiResource::erase::<CertificateRenewalPolicy>(&()),
    );
    let start = Instant::now();
    loop {
        let object = api.get(name).await.unwrap();
        let status = object
            .data
            .get("status")
            .map(|s| serde_json::from_value(s.clone()).unwrap())
            .unwrap_or_default();
        if done(&status) {
            return status;
        }
        assert!(start.elapsed() < TIMEOUT, "policy {name}: {status:#?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn policy_condition<'a>(
    status: &'a ck8s_certs_api::renewal_policy::CertificateRenewalPolicyStatus,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

async fn select(env: &Environment, node: &NodeInfo, selector: &str) {
    env.isolate(node, selector).await;
    env.patch_machine(
        node,
        json!({ "metadata": { "labels": { "e2e-policy": selector } } }),
    )
    .await;
}

/// The command every deferral, Disabled and failure message ends with.
fn hint(node: &NodeInfo, ttl: &str) -> String {
    format!(
        "Renew now: kubectl annotate machines.cluster.x-k8s.io {} -n {} v1beta2.k8sd.io/refresh-certificates={ttl} --overwrite",
        node.machine, node.namespace
    )
}

fn condition<'a>(
    status: &'a MachineCertificatesStatus,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

async fn event_reasons(env: &Environment, node: &NodeInfo) -> Vec<(String, String)> {
    env.machine_events(node)
        .await
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.type_.unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn an_automatic_policy_renews_before_expiry_without_an_annotation() {
    let env = shared_of(CLUSTERS).await;
    let node = env.cluster("alpha").node("alpha-cp-0").clone();
    env.create_policy(
        "fleet",
        "auto",
        "auto",
        json!({ "policy": "Automatic", "renewBefore": "100d", "ttl": "1y" }),
    )
    .await;
    select(&env, &node, "auto").await;
    let controller = env.start_controller("auto", &[]);
    let annotations = env
        .wait_for_machine(&node, TIMEOUT, |a| {
            a.get(REFRESH_CERTIFICATES_STATUS).map(String::as_str) == Some("done")
        })
        .await;
    assert!(annotations.contains_key(ck8s_certs_api::annotations::CERTIFICATES_EXPIRY));
    let status = env
        .wait_for_status(&node, TIMEOUT, "the next renewal", |s| {
            s.renewal.as_ref().is_some_and(|r| r.reason == "NotDue")
        })
        .await;
    let op = status.operation.clone().unwrap();
    assert_eq!(
        (op.origin, op.phase, op.ttl.as_str()),
        (Origin::Policy, Phase::Succeeded, "1y")
    );
    assert_eq!(
        op.requested_by.as_deref(),
        Some("CertificateRenewalPolicy/auto")
    );
    // Next renewal: new expiry − renewBefore, plus this Machine's offset in the default 15m
    // spread (from its UID).
    let expiry = status.expiry.clone().unwrap().0;
    let next = status.renewal.clone().unwrap().next_renewal_time.unwrap().0;
    let uid = env.machine_uid(&node).await;
    let offset = ck8s_certs::policy::StaggerKey::new(&uid).offset(15 * 60);
    assert_eq!(
        next,
        expiry - jiff::SignedDuration::from_hours(100 * 24)
            + jiff::SignedDuration::from_secs(offset)
    );
    // The status contract: the policy (reference, generation, mode), its windows, and a
    // healthy steady state: Ready, no renewal condition, every condition stamped.
    let renewal = status.renewal.clone().unwrap();
    assert_eq!(
        renewal.policy_ref,
        Some(PolicyReference {
            name: "auto".into(),
            observed_generation: Some(1)
        })
    );
    assert_eq!(renewal.policy.as_deref(), Some("Automatic"));
    assert_eq!(
        renewal.windows,
        Some(WindowsStatus {
            valid: true,
            count: 0,
            message: None
        })
    );
    assert!(
        renewal.message.ends_with(&hint(&node, "1y")),
        "{}",
        renewal.message
    );
    let ready = condition(&status, "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "Refreshed")
    );
    assert!(
        status
            .conditions
            .iter()
            .all(|c| c.type_ != "RenewalDeferred"),
        "{:?}",
        status.conditions
    );
    assert!(
        status
            .conditions
            .iter()
            .all(|c| c.observed_generation == Some(1)),
        "{:?}",
        status.conditions
    );
    assert_eq!(op.matched_window, None, "Automatic ignores windows");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        event_reasons(&env, &node)
            .await
            .contains(&("CertificatesRenewalScheduled".into(), "Normal".into()))
    );
    let runs = env
        .calls(&node)
        .await
        .into_iter()
        .filter(|c| c.path == path::RUN)
        .count();
    assert_eq!(runs, 1);

    // What Prometheus sees.
    let series = format!(
        "ck8s_certs_certificate_expiry_timestamp_seconds{{namespace=\"fleet\",cluster=\"alpha\",machine=\"{}\",role=\"control-plane\"}}",
        node.machine
    );
    assert_eq!(
        controller.metric(&series).await,
        Some(expiry.as_second() as f64),
        "{}",
        controller.metrics().await
    );
    assert_eq!(
        controller
            .metric("ck8s_certs_renewals_started_total{origin=\"policy\"}")
            .await,
        Some(1.0)
    );
    assert_eq!(
        controller
            .metric("ck8s_certs_renewals_succeeded_total{origin=\"policy\"}")
            .await,
        Some(1.0)
    );
    assert_eq!(
        controller
            .metric("ck8s_certs_refresh_duration_seconds_count{origin=\"policy\",role=\"control-plane\",result=\"succeeded\"}")
            .await,
        Some(1.0)
    );
    // Not due is not a deferral.
    assert_eq!(
        controller
            .metric("ck8s_certs_renewal_deferred_total{reason=\"not_due\"}")
            .await,
        None
    );
    assert_eq!(
        controller.metric("ck8s_certs_operations_in_progress").await,
        Some(0.0)
    );
    // Every k8sd call, counted and timed where it went over the wire: the one run the node saw,
    // the plan before it and the expiry read; and the reconciles that carried them.
    assert_eq!(
        controller
            .metric("ck8s_certs_k8sd_requests_total{endpoint=\"run\",outcome=\"success\"}")
            .await,
        Some(runs as f64),
        "{}",
        controller.metrics().await
    );
    assert_eq!(
        controller
            .metric("ck8s_certs_k8sd_request_duration_seconds_count{endpoint=\"run\"}")
            .await,
        Some(runs as f64)
    );
    for series in [
        "ck8s_certs_k8sd_requests_total{endpoint=\"plan\",outcome=\"success\"}",
        "ck8s_certs_k8sd_requests_total{endpoint=\"certificates_expiry\",outcome=\"success\"}",
        "ck8s_certs_k8sd_request_duration_seconds_count{endpoint=\"plan\"}",
        "ck8s_certs_reconcile_duration_seconds_count{controller=\"machine\"}",
        "ck8s_certs_reconcile_duration_seconds_count{controller=\"policy\"}",
    ] {
        assert!(
            controller.metric(series).await.is_some_and(|v| v >= 1.0),
            "{series} in\n{}",
            controller.metrics().await
        );
    }
}

#[tokio::test]
async fn a_disabled_policy_warns_inside_the_fail_safe_margin_and_a_manual_request_still_works() {
    let env = shared_of(CLUSTERS).await;
    let node = env.cluster("alpha").node("alpha-cp-1").clone();
    env.create_policy(
        "fleet",
        "off",
        "off",
        json!({ "policy": "Disabled", "renewBefore": "100d", "failSafeMargin": "100d" }),
    )
    .await;
    select(&env, &node, "off").await;
    let _controller = env.start_controller("off", &[]);
    let status = env
        .wait_for_status(&node, TIMEOUT, "RenewalDisabled", |s| {
            condition(s, "RenewalDisabled").is_some()
        })
        .await;
    let message = &condition(&status, "RenewalDisabled").unwrap().message;
    assert!(message.contains("renew them manually"), "{message}");
    assert!(message.ends_with(&hint(&node, "1y")), "{message}");
    assert_eq!(
        status.renewal.as_ref().and_then(|r| r.policy.as_deref()),
        Some("Disabled")
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        event_reasons(&env, &node)
            .await
            .contains(&("CertificatesRenewalDisabled".into(), "Warning".into()))
    );
    assert!(env.calls(&node).await.iter().all(|c| c.path != path::PLAN));

    env.annotate_refresh(&node, "1y").await;
    let annotations = env.wait_for_refresh(&node, TIMEOUT).await;
    assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "done");
}

/// A window on a day that is neither today nor tomorrow (UTC), so it is not open now.
#[tokio::test]
async fn a_scheduled_policy_defers_to_the_next_window_and_bypasses_it_only_inside_the_fail_safe_margin()
 {
    let env = shared_of(CLUSTERS).await;
    let [deferred, bypassed] = env.nodes("alpha", ["alpha-md-0-w0", "alpha-md-0-w1"]);
    let [strict] = env.nodes("beta", ["beta-cp-0"]);
    env.create_policy("fleet", "night", "night", json!({ "policy": "Scheduled", "renewBefore": "100d", "failSafeMargin": "1d", "windows": closed_window() })).await;
    env.create_policy("fleet", "night-close", "night-close", json!({ "policy": "Scheduled", "renewBefore": "100d", "failSafeMargin": "100d", "windows": closed_window() })).await;
    env.create_policy("fleet", "night-strict", "night-strict", json!({ "policy": "Scheduled", "renewBefore": "100d", "failSafeMargin": "100d", "windows": closed_window() })).await;
    select(&env, &deferred, "night").await;
    select(&env, &bypassed, "night-close").await;
    select(&env, &strict, "night-strict").await;
    let _a = env.start_controller("night", &[]);
    let bypassing = env.start_controller("night-close", &[]);
    let _c = env.start_controller("night-strict", &["--renewal-window-strict"]);

    let status = env
        .wait_for_status(&deferred, TIMEOUT, "OutsideWindow", |s| {
            s.renewal
                .as_ref()
                .is_some_and(|r| r.reason == "OutsideWindow")
        })
        .await;
    let renewal = status.renewal.clone().unwrap();
    assert!(
        renewal.message.contains("Europe/London") && renewal.message.contains("maintenance window"),
        "{}",
        renewal.message
    );
    assert!(
        renewal.message.ends_with(&hint(&deferred, "1y")),
        "{}",
        renewal.message
    );
    assert_eq!(renewal.policy.as_deref(), Some("Scheduled"));
    assert_eq!(
        renewal.windows.as_ref().map(|w| (w.valid, w.count)),
        Some((true, 1))
    );
    let held = condition(&status, "RenewalDeferred").unwrap();
    assert_eq!(
        (held.status.as_str(), held.reason.as_str()),
        ("True", "OutsideWindow")
    );
    let next = renewal
        .next_renewal_time
        .unwrap()
        .0
        .to_zoned(jiff::tz::TimeZone::get("Europe/London").unwrap());
    // The window opens at 01:00; the Machine starts at its offset in the default 15m spread.
    let opening = next.with().minute(0).second(0).build().unwrap();
    assert_eq!(opening.hour(), 1, "{next}");
    let uid = env.machine_uid(&deferred).await;
    let offset = ck8s_certs::policy::StaggerKey::new(&uid).offset(15 * 60);
    assert_eq!(
        next.timestamp(),
        opening.timestamp() + jiff::SignedDuration::from_secs(offset),
        "{next}"
    );
    // A manual request does not wait for the window.
    env.annotate_refresh(&deferred, "1y").await;
    assert_eq!(
        env.wait_for_refresh(&deferred, TIMEOUT).await[REFRESH_CERTIFICATES_STATUS],
        "done"
    );

    env.wait_for_machine(&bypassed, TIMEOUT, |a| {
        a.get(REFRESH_CERTIFICATES_STATUS).map(String::as_str) == Some("done")
    })
    .await;
    // Said once: the bypass Event and metric come with the take-up, not with each verdict.
    assert_eq!(
        event_reasons(&env, &bypassed)
            .await
            .iter()
            .filter(|(r, _)| r == "CertificatesRenewalWindowBypassed")
            .count(),
        1
    );
    assert_eq!(
        bypassing
            .metric("ck8s_certs_renewal_bypassed_total{reason=\"expiry_imminent\"}")
            .await,
        Some(1.0)
    );
    // The bypass stays on record after the renewal is done and the next one is not due...
    let status = env
        .wait_for_status(&bypassed, TIMEOUT, "the bypass on record", |s| {
            s.operation
                .as_ref()
                .is_some_and(|o| o.phase == Phase::Succeeded)
                && s.renewal.as_ref().is_some_and(|r| r.reason != "RenewNow")
        })
        .await;
    let record = status.last_window_bypass.clone().expect("lastWindowBypass");
    assert!(record.message.contains("fail-safe"), "{}", record.message);
    let condition_ = condition(&status, "RenewalWindowBypassed").expect("RenewalWindowBypassed");
    assert_eq!(
        (condition_.status.as_str(), condition_.reason.as_str()),
        ("True", "FailSafeBypass")
    );
    assert_eq!(status.operation.as_ref().unwrap().matched_window, None);
    // ...until a later refresh succeeds.
    env.annotate_refresh(&bypassed, "1y").await;
    env.wait_for_refresh(&bypassed, TIMEOUT).await;
    let status = env
        .wait_for_status(&bypassed, TIMEOUT, "the bypass forgotten", |s| {
            s.last_window_bypass.is_none()
        })
        .await;
    assert!(
        condition(&status, "RenewalWindowBypassed").is_none(),
        "{:?}",
        status.conditions
    );

    let status = env
        .wait_for_status(&strict, TIMEOUT, "strict deferral", |s| {
            s.renewal
                .as_ref()
                .is_some_and(|r| r.reason == "OutsideWindow")
        })
        .await;
    assert!(
        status.operation.is_none(),
        "strict: no renewal outside the window"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        event_reasons(&env, &strict)
            .await
            .contains(&("CertificatesRenewalDeferred".into(), "Warning".into()))
    );
}

#[tokio::test]
async fn invalid_and_conflicting_policies_are_shown_on_the_machine_and_nothing_runs() {
    let env = shared_of(CLUSTERS).await;
    let invalid = env.cluster("beta").node("beta-cp-1").clone();
    let conflicted = env.cluster("beta").node("beta-md-0-w0").clone();
    env.create_policy(
        "fleet",
        "mars",
        "mars",
        json!({ "policy": "Scheduled", "renewBefore": "100d",
        "windows": [{ "start": "01:00", "end": "02:00", "timezone": "Mars/Olympus_Mons" }] }),
    )
    .await;
    // Disabled: alone after twin-b's deletion below, it must not start a renewal.
    env.create_policy(
        "fleet",
        "twin-a",
        "twins",
        json!({ "policy": "Disabled", "renewBefore": "100d" }),
    )
    .await;
    env.create_policy(
        "fleet",
        "twin-b",
        "twins",
        json!({ "policy": "Automatic", "renewBefore": "100d" }),
    )
    .await;
    // A duration the schema lets through but the controller cannot read.
    env.create_policy(
        "edge",
        "unreadable",
        "unreadable",
        json!({ "policy": "Automatic", "renewBefore": "99999999999999999999999y" }),
    )
    .await;
    let unreadable = env.cluster("gamma").node("alpha-cp-1").clone();
    select(&env, &invalid, "mars").await;
    select(&env, &conflicted, "twins").await;
    select(&env, &unreadable, "unreadable").await;
    let _a = env.start_controller("mars", &[]);
    let _b = env.start_controller("twins", &[]);
    let _c = env.start_controller("unreadable", &[]);
    let status = env
        .wait_for_status(&unreadable, TIMEOUT, "an unreadable policy", |s| {
            condition(s, "RenewalConfigInvalid").is_some()
        })
        .await;
    let message = &condition(&status, "RenewalConfigInvalid").unwrap().message;
    assert!(message.contains("cannot be read"), "{message}");
    assert!(message.ends_with(&hint(&unreadable, "1y")), "{message}");
    assert_eq!(
        status
            .renewal
            .as_ref()
            .and_then(|r| r.policy_ref.as_ref())
            .map(|p| p.name.as_str()),
        Some("unreadable")
    );
    let policy = wait_policy(&env, "edge", "unreadable", |s| {
        policy_condition(s, "Valid").is_some()
    })
    .await;
    let valid = policy_condition(&policy, "Valid").unwrap();
    assert_eq!(valid.status, "False");
    assert!(
        valid.message.contains("cannot be read"),
        "{}",
        valid.message
    );
    assert_eq!(policy.matched_machines, Some(1));
    let status = env
        .wait_for_status(&invalid, TIMEOUT, "RenewalConfigInvalid", |s| {
            condition(s, "RenewalConfigInvalid").is_some()
        })
        .await;
    let message = &condition(&status, "RenewalConfigInvalid").unwrap().message;
    assert!(
        message.contains("windows[0].timezone") && message.contains("Mars/Olympus_Mons"),
        "{message}"
    );
    assert_eq!(
        status
            .renewal
            .as_ref()
            .and_then(|r| r.windows.as_ref())
            .map(|w| w.valid),
        Some(false)
    );
    let status = env
        .wait_for_status(&conflicted, TIMEOUT, "conflict", |s| {
            condition(s, "RenewalConfigInvalid").is_some()
        })
        .await;
    let message = &condition(&status, "RenewalConfigInvalid").unwrap().message;
    assert!(
        message.contains("twin-a") && message.contains("twin-b"),
        "{message}"
    );
    assert_eq!(
        status
            .renewal
            .as_ref()
            .map(|r| r.conflicting_policies.clone()),
        Some(vec!["twin-a".to_owned(), "twin-b".to_owned()])
    );
    // The policies say so too: the invalid one is not Valid, both conflicting ones not Ready.
    let status = wait_policy(&env, "fleet", "mars", |s| {
        policy_condition(s, "Valid").is_some()
    })
    .await;
    let valid = policy_condition(&status, "Valid").unwrap();
    assert_eq!(
        (valid.status.as_str(), valid.reason.as_str()),
        ("False", "InvalidSpec")
    );
    assert!(
        valid.message.contains("windows[0].timezone"),
        "{}",
        valid.message
    );
    for (name, other) in [("twin-a", "twin-b"), ("twin-b", "twin-a")] {
        let status = wait_policy(&env, "fleet", name, |s| {
            policy_condition(s, "Ready").is_some_and(|c| c.reason == "ConflictingPolicies")
        })
        .await;
        let ready = policy_condition(&status, "Ready").unwrap();
        assert!(
            ready.message.contains(other) && ready.message.contains(&conflicted.machine),
            "{}",
            ready.message
        );
        assert_eq!(status.matched_machines, Some(1));
    }
    for node in [&invalid, &conflicted] {
        assert!(env.calls(node).await.iter().all(|c| c.path != path::PLAN));
    }
    // One twin deleted: the Machine it selected and the twin it conflicted with are re-checked
    // at once, not at the next resync (an hour).
    let resource = ApiResource::erase::<CertificateRenewalPolicy>(&());
    let policies: Api<DynamicObject> =
        Api::namespaced_with(env.management().await.unwrap(), "fleet", &resource);
    policies
        .delete("twin-b", &Default::default())
        .await
        .unwrap();
    let status = env
        .wait_for_status(&conflicted, TIMEOUT, "twin-a alone", |s| {
            s.renewal.as_ref().is_some_and(|r| {
                r.conflicting_policies.is_empty()
                    && r.policy_ref.as_ref().is_some_and(|p| p.name == "twin-a")
            })
        })
        .await;
    assert!(
        condition(&status, "RenewalConfigInvalid").is_none(),
        "{status:#?}"
    );
    let status = wait_policy(&env, "fleet", "twin-a", |s| {
        policy_condition(s, "Ready").is_some_and(|c| c.reason != "ConflictingPolicies")
    })
    .await;
    assert_eq!(status.matched_machines, Some(1));
}

#[tokio::test]
async fn a_failing_node_backs_off_exponentially_across_restarts_and_recovers() {
    let env = shared_of(CLUSTERS).await;
    let node = env.cluster("beta").node("beta-md-0-w1").clone();
    env.create_policy(
        "fleet",
        "flaky",
        "flaky",
        json!({ "policy": "Automatic", "renewBefore": "100d" }),
    )
    .await;
    select(&env, &node, "flaky").await;
    let fault = env
        .sim
        .inject(&Fault::error(500, "disk full").on(&node).at(Endpoint::Run))
        .await
        .unwrap();
    let flags = [
        "--renewal-backoff-min=2s",
        "--renewal-backoff-max=1h",
        "--k8sd-attempts=1",
    ];
    let first = env.start_controller("flaky", &flags);
    // The verdict after a failure is written by the reconcile that follows it.
    let status = env
        .wait_for_status(
            &node,
            TIMEOUT,
            "two failures and the backoff verdict",
            |s| {
                s.failed_attempts >= Some(2)
                    && s.renewal.as_ref().is_some_and(|r| r.reason == "Backoff")
            },
        )
        .await;
    assert!(
        first
            .metric("ck8s_certs_renewals_failed_total{origin=\"policy\"}")
            .await
            >= Some(2.0)
    );
    first.crash();
    let n = status.failed_attempts.unwrap();
    let renewal = status.renewal.clone().unwrap();
    assert_eq!(renewal.reason, "Backoff", "{renewal:?}");
    let last = status.last_failure_time.clone().unwrap().0;
    let delay = jiff::SignedDuration::from_secs(2 * (1 << (n - 1)));
    assert_eq!(renewal.next_renewal_time.unwrap().0, last + delay);
    // The failure says when the controller tries again by itself, and where to read more.
    let error = status
        .operation
        .as_ref()
        .and_then(|o| o.error.clone())
        .unwrap_or_default();
    assert!(
        error.contains(&format!(
            "tries again by itself, not before {}",
            last + delay
        )) && error.contains(&format!(
            "Details: kubectl ck8s-certs explain {}",
            node.machine
        )),
        "{error}"
    );

    // Restarted, it remembers: the count keeps growing from where it was.
    let _second = env.start_controller("flaky", &flags);
    let status = env
        .wait_for_status(&node, TIMEOUT, "one more failure", |s| {
            s.failed_attempts > Some(n)
        })
        .await;
    assert_eq!(status.failed_attempts, Some(n + 1));
    // A manual request does not wait for the backoff (the next automatic attempt is 8 s or more
    // away); its success resets the failure history.
    env.sim.clear_fault(&fault).await.unwrap();
    let asked = Instant::now();
    env.annotate_refresh(&node, "1y").await;
    let annotations = env.wait_for_refresh(&node, TIMEOUT).await;
    assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "done");
    assert!(
        asked.elapsed() < Duration::from_secs(6),
        "waited {:?}",
        asked.elapsed()
    );
    let status = env
        .wait_for_status(&node, TIMEOUT, "recovery", |s| {
            s.operation
                .as_ref()
                .is_some_and(|o| o.phase == Phase::Succeeded)
        })
        .await;
    assert_eq!(status.operation.unwrap().origin, Origin::Manual);
    assert_eq!(
        (status.failed_attempts, status.last_failure_time),
        (None, None)
    );
}

/// The next whole minute (UTC) at least 5 s away, and two minutes after it.
fn next_minute() -> (jiff::Zoned, jiff::Zoned) {
    let now = jiff::Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC);
    let mut start = now
        .round(
            jiff::ZonedRound::new()
                .smallest(jiff::Unit::Minute)
                .mode(jiff::RoundMode::Ceil),
        )
        .unwrap();
    if start.duration_since(&now) < jiff::SignedDuration::from_secs(5) {
        start = start
            .checked_add(jiff::SignedDuration::from_mins(1))
            .unwrap();
    }
    let end = start
        .checked_add(jiff::SignedDuration::from_mins(2))
        .unwrap();
    (start, end)
}

/// Starts a controller for `policy` (already selecting `node`), checks the renewal is deferred
/// to `start`, starts then, and names `window` as the one it matched.
async fn defers_then_renews_at(
    env: &Environment,
    node: &NodeInfo,
    policy: &str,
    start: &jiff::Zoned,
    window: String,
) {
    select(env, node, policy).await;
    let _controller = env.start_controller(policy, &[]);
    let status = env
        .wait_for_status(node, TIMEOUT, "OutsideWindow", |s| {
            s.renewal
                .as_ref()
                .is_some_and(|r| r.reason == "OutsideWindow")
        })
        .await;
    assert_eq!(
        status.renewal.unwrap().next_renewal_time.unwrap().0,
        start.timestamp()
    );
    let annotations = env
        .wait_for_machine(node, TIMEOUT, |a| {
            a.get(REFRESH_CERTIFICATES_STATUS).map(String::as_str) == Some("done")
        })
        .await;
    assert!(annotations.contains_key(ck8s_certs_api::annotations::CERTIFICATES_EXPIRY));
    let plan = env
        .calls(node)
        .await
        .into_iter()
        .find(|c| c.path == path::PLAN)
        .unwrap();
    let planned: jiff::Timestamp = plan.started_at.parse().unwrap();
    assert!(
        planned >= start.timestamp(),
        "renewed at {planned}, before the window opened at {start}"
    );
    assert!(
        planned < start.timestamp() + jiff::SignedDuration::from_secs(5),
        "renewed at {planned}, not when the window opened at {start}"
    );
    // The window that matched stays on the operation's record.
    let status = env
        .wait_for_status(node, TIMEOUT, "the matched window", |s| {
            s.operation
                .as_ref()
                .is_some_and(|o| o.phase == Phase::Succeeded)
        })
        .await;
    assert_eq!(status.operation.unwrap().matched_window, Some(window));
}

#[tokio::test]
async fn a_scheduled_renewal_starts_when_the_window_opens() {
    let env = shared_of(CLUSTERS).await;
    let node = env.cluster("gamma").node("alpha-cp-0").clone();
    let (start, end) = next_minute();
    let (from, to) = (
        start.strftime("%H:%M").to_string(),
        end.strftime("%H:%M").to_string(),
    );
    let window = json!([{ "start": from, "end": to, "timezone": "UTC" }]);
    env.create_policy("edge", "next-minute", "next-minute", json!({ "policy": "Scheduled", "renewBefore": "100d", "failSafeMargin": "1d", "spread": "0s", "windows": window })).await;
    let matched = format!("windows[0] (every day {from}-{to} UTC)");
    defers_then_renews_at(&env, &node, "next-minute", &start, matched).await;
}

#[tokio::test]
async fn a_cron_window_defers_the_renewal_and_it_starts_at_the_opening() {
    let env = shared_of(CLUSTERS).await;
    let node = env.cluster("gamma").node("alpha-md-0-w0").clone();
    let (start, _) = next_minute();
    let schedule = format!("{} {} * * *", start.minute(), start.hour());
    let window = json!([{ "schedule": schedule, "duration": "2m", "timezone": "UTC" }]);
    env.create_policy("edge", "next-minute-cron", "next-minute-cron", json!({ "policy": "Scheduled", "renewBefore": "100d", "failSafeMargin": "1d", "spread": "0s", "windows": window })).await;
    let matched = format!("windows[0] (\"{schedule}\" for 2m UTC)");
    defers_then_renews_at(&env, &node, "next-minute-cron", &start, matched).await;
}
