//! At rest nothing is written: for every renewal verdict, a Machine whose situation does not
//! change costs zero API writes, however often it is reconciled. Writes are counted in the
//! management API server's audit log while reconciles are provoked (a short resync period, and
//! edits of the Clusters and policies the Machines depend on).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ck8s_certs_api::machine_certificates::MachineCertificatesStatus;
use ck8s_certs_api::renewal_policy::CertificateRenewalPolicy;
use ck8s_certs_e2e::controlplane::audited_writes;
use ck8s_certs_e2e::fixtures::NodeInfo;
use ck8s_certs_e2e::policies::closed_window;
use ck8s_certs_e2e::sim::{Endpoint, Fault, runs};
use ck8s_certs_e2e::{Environment, shared_of};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(120);
const FILTER: &str = "steady";
const CONTROLLER: &str = "system:serviceaccount:ck8s-certs-system:ck8s-certs-manager";

/// The verdict each Machine settles on, by `status.renewal.reason` (`None`: no policy).
struct Case {
    verdict: &'static str,
    node: NodeInfo,
    reason: Option<&'static str>,
}

async fn settled(env: &Environment, case: &Case) -> MachineCertificatesStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = env
            .machine_certificates(&case.node)
            .await
            .and_then(|m| m.status)
        {
            let reason = status.renewal.as_ref().map(|r| r.reason.as_str());
            if status.expiry.is_some() && reason == case.reason {
                return status;
            }
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "{}: {} never showed {:?}",
            case.verdict,
            case.node.machine,
            case.reason
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// How [`writes_since`] names a Machine's objects (its MachineCertificates has its name).
fn key(node: &NodeInfo) -> String {
    format!("{}/{}", node.namespace, node.machine)
}

/// Writes by the controller since `from`, per `namespace/name` (Lease renewals excluded: they are the
/// cost of leader election, not of any Machine).
fn writes_since(env: &Environment, from: usize) -> (usize, BTreeMap<String, Vec<String>>) {
    let all = audited_writes(&env.dir, "management");
    let mut by_object: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for write in all
        .iter()
        .skip(from)
        .filter(|w| w.user.username == CONTROLLER)
    {
        let Some(object) = &write.object_ref else {
            continue;
        };
        if object.resource == "leases" {
            continue;
        }
        by_object
            .entry(format!("{}/{}", object.namespace, object.name))
            .or_default()
            .push(format!(
                "{} {}/{}",
                write.verb, object.resource, object.subresource
            ));
    }
    (all.len(), by_object)
}

#[tokio::test]
async fn a_machine_whose_situation_does_not_change_costs_zero_writes_for_every_verdict() {
    let env = shared_of(&["alpha", "beta", "gamma"]).await;
    // Simulated nodes start with 90-day certificates: renewBefore 100d is due, 30d is not.
    #[rustfmt::skip]
    let cases = [
        ("no policy", "gamma", "alpha-cp-0", None),
        ("Automatic", "alpha", "alpha-cp-0", Some("NotDue")),
        ("Automatic with windows", "alpha", "alpha-cp-1", Some("NotDue")),
        ("Disabled", "alpha", "alpha-md-0-w0", Some("Disabled")),
        ("Scheduled, deferred to a window", "alpha", "alpha-md-0-w1", Some("OutsideWindow")),
        ("Scheduled, inside a window", "beta", "beta-cp-0", Some("NotDue")),
        ("invalid", "beta", "beta-cp-1", Some("ConfigInvalid")),
        ("conflicting policies", "beta", "beta-md-0-w0", Some("ConfigInvalid")),
        ("backoff", "beta", "beta-md-0-w1", Some("Backoff")),
    ]
    .map(|(verdict, cluster, machine, reason)| Case {
        verdict,
        node: env.cluster(cluster).node(machine).clone(),
        reason,
    });
    let specs = [
        (
            "auto",
            json!({ "policy": "Automatic", "renewBefore": "30d" }),
        ),
        (
            "auto-windows",
            json!({ "policy": "Automatic", "renewBefore": "30d", "windows": closed_window() }),
        ),
        ("off", json!({ "policy": "Disabled" })),
        (
            "closed",
            json!({ "policy": "Scheduled", "renewBefore": "100d", "failSafeMargin": "1d", "windows": closed_window() }),
        ),
        (
            "open",
            json!({ "policy": "Scheduled", "renewBefore": "30d", "windows": [{ "start": "00:00", "end": "24:00" }] }),
        ),
        (
            "broken",
            json!({ "policy": "Scheduled", "renewBefore": "100d", "windows": [{ "start": "01:00", "end": "02:00", "timezone": "Mars/Olympus_Mons" }] }),
        ),
        (
            "twin-a",
            json!({ "policy": "Automatic", "renewBefore": "30d" }),
        ),
        (
            "failing",
            json!({ "policy": "Automatic", "renewBefore": "100d" }),
        ),
    ];
    for (name, spec) in specs {
        let selector = if name == "twin-a" { "twins" } else { name };
        env.create_policy_in(FILTER, "fleet", &format!("steady-{name}"), selector, spec)
            .await;
    }
    env.create_policy_in(
        FILTER,
        "fleet",
        "steady-twin-b",
        "twins",
        json!({ "policy": "Disabled" }),
    )
    .await;
    let selectors = [
        None,
        Some("auto"),
        Some("auto-windows"),
        Some("off"),
        Some("closed"),
        Some("open"),
        Some("broken"),
        Some("twins"),
        Some("failing"),
    ];
    for (case, selector) in cases.iter().zip(selectors) {
        env.isolate(&case.node, FILTER).await;
        if let Some(selector) = selector {
            env.patch_machine(
                &case.node,
                json!({ "metadata": { "labels": { "e2e-policy": selector } } }),
            )
            .await;
        }
    }
    // The failing Machine's renewal fails once, then backs off for an hour.
    let backoff = &cases[8].node;
    env.sim
        .inject(&Fault::error(500, "disk full").on(backoff).at(Endpoint::Run))
        .await
        .unwrap();
    let _controller = env.start_controller(
        FILTER,
        &[
            "--resync-period=3s",
            "--renewal-backoff-min=1h",
            "--k8sd-attempts=1",
            // The management API server restarts below: the leader keeps its Lease through it
            // (past the renew deadline a leader exits by design, and is restarted).
            "--leader-elect-lease-duration=90s",
            "--leader-elect-renew-deadline=60s",
        ],
    );
    for case in &cases {
        settled(&env, case).await;
    }
    // Let Events and the policy status of the settling phase land.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let (start, _) = writes_since(&env, 0);
    let before: Vec<MachineCertificatesStatus> = {
        let mut out = Vec::new();
        for case in &cases {
            out.push(settled(&env, case).await);
        }
        out
    };
    // Provoke reconciles of every Machine: Cluster edits re-check their Machines (a policy's
    // annotation edit, no new generation, re-checks none); the resync period does the rest.
    let client = env.management().await.unwrap();
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "fleet",
        &ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
            ck8s_certs_api::capi::GROUP,
            env.spec.capi_version.storage_version(),
            "Cluster",
        )),
    );
    let policies: Api<CertificateRenewalPolicy> = Api::namespaced(client, "fleet");
    for round in 0..5 {
        let touch =
            json!({ "metadata": { "annotations": { "e2e.ck8s.io/touch": round.to_string() } } });
        for cluster in ["alpha", "beta"] {
            clusters
                .patch(cluster, &PatchParams::default(), &Patch::Merge(&touch))
                .await
                .unwrap();
        }
        policies
            .patch(
                "steady-auto",
                &PatchParams::default(),
                &Patch::Merge(&touch),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    let (_, writes) = writes_since(&env, start);
    let mut report = Vec::new();
    for (case, old) in cases.iter().zip(&before) {
        let count = writes.get(&key(&case.node)).map_or(0, Vec::len);
        report.push(format!("{}: {count}", case.verdict));
        assert_eq!(
            env.machine_certificates(&case.node)
                .await
                .and_then(|m| m.status)
                .as_ref(),
            Some(old),
            "{}: the status changed at rest",
            case.verdict
        );
    }
    println!(
        "API writes per Machine over 20 s at rest (resync 3 s, 5 rounds of Cluster and policy edits): {report:?}"
    );
    assert!(writes.is_empty(), "writes at rest: {writes:#?}");

    // The leader's Lease requests are served at the `leader-election` priority level
    // (config/flowcontrol), apart from its other requests.
    let metrics = env
        .management()
        .await
        .unwrap()
        .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
        .await
        .unwrap();
    let schema = format!(
        "flow_schema=\"{}\"",
        ck8s_certs_e2e::controller::FLOW_SCHEMA
    );
    let lease_requests: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_flowcontrol_dispatched_requests_total{"))
        .filter(|l| l.contains(&schema) && l.contains("priority_level=\"leader-election\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(lease_requests > 0.0, "no request in {schema}");

    // A restart of the management API server: every watch breaks and each cache lists again.
    // That changes nothing either, and a refresh asked for as soon as the server is back (the
    // watches may still be backing off: the change then arrives with the relist) is carried
    // out once.
    let (start, _) = writes_since(&env, 0);
    let refreshed = &cases[0].node;
    env.sim
        .clear_calls(&refreshed.cluster, &refreshed.node)
        .await
        .unwrap();
    env.restart_management_apiserver(TIMEOUT).await.unwrap();
    env.annotate_refresh(refreshed, "1y").await;
    let annotations = env.wait_for_refresh(refreshed, TIMEOUT).await;
    assert_eq!(
        annotations[ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS],
        "done"
    );
    let calls = env.calls(refreshed).await;
    assert_eq!(runs(&calls).len(), 1, "one run after the restart");
    // Let a late relist and its reconciles land.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (_, mut writes) = writes_since(&env, start);
    writes.retain(|object, _| cases[1..].iter().any(|c| key(&c.node) == *object));
    assert!(writes.is_empty(), "writes after the restart: {writes:#?}");
}
