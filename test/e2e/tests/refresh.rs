//! Manual certificate refresh end to end: `kubectl annotate machine … refresh-certificates=<ttl>`
//! against real API servers and simulated nodes, with the controller running under the
//! least-privilege rights of `config/rbac`.

use std::collections::BTreeMap;
use std::time::Duration;

use ck8s_certs::k8sd::wire::path;
use ck8s_certs_api::annotations::{
    CERTIFICATES_EXPIRY, IN_FLIGHT_REFRESH, REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS,
};
use ck8s_certs_api::certificate_refresh::{CertificateRefresh, RequestPhase, labels};
use ck8s_certs_api::machine_certificates::Phase;
use ck8s_certs_e2e::fixtures::{NodeInfo, Role};
use ck8s_certs_e2e::sim::{Endpoint, runs};
use ck8s_certs_e2e::{Environment, shared_of};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Api;

/// The standard clusters these tests use; the others are not started.
const CLUSTERS: &[&str] = &["alpha", "beta", "gamma", "trio"];

const REFRESH_TIMEOUT: Duration = Duration::from_secs(90);

fn posts(calls: &[ck8s_certs_e2e::sim::CallRecord]) -> Vec<&str> {
    calls
        .iter()
        .filter(|c| c.method == "POST")
        .map(|c| c.path.as_str())
        .collect()
}

/// Annotates a refresh of `ttl` and waits until it is done; says how long it took.
async fn timed_refresh(env: &Environment, node: &NodeInfo, ttl: &str) -> BTreeMap<String, String> {
    let started = std::time::Instant::now();
    env.annotate_refresh(node, ttl).await;
    let annotations = env.wait_for_done(node, REFRESH_TIMEOUT).await;
    let what = match node.role {
        Role::ControlPlane => "control-plane",
        Role::Worker => "worker",
    };
    println!(
        "{what} refresh took {:.2}s",
        started.elapsed().as_secs_f64()
    );
    annotations
}

#[tokio::test]
async fn a_control_plane_refresh_touches_only_that_node_and_records_the_new_expiry() {
    let env = shared_of(CLUSTERS).await;
    let filter = "cp-refresh";
    let [node] = env.nodes("alpha", ["alpha-cp-0"]);
    env.isolate_fresh([&node], filter).await;
    let before_calls = env.sim.calls("", "").await.unwrap().len();
    let _controller = env.start_controller(filter, &[]);

    let annotations = timed_refresh(&env, &node, "1y").await;
    assert!(!annotations.contains_key(REFRESH_CERTIFICATES));

    // The expiry is the node's new certificate's NotAfter, RFC 3339 in UTC.
    let state = env.sim.node(&node).await.unwrap();
    let not_after: jiff::Timestamp = state.cert_not_after.parse().unwrap();
    assert_eq!(
        annotations[CERTIFICATES_EXPIRY],
        not_after.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    );
    let year = jiff::SignedDuration::from_hours(365 * 24);
    assert!(
        (not_after.duration_since(jiff::Timestamp::now()) - year).abs()
            < jiff::SignedDuration::from_mins(5)
    );
    // SANs: CK8sConfig extraSANs (none on alpha) + the CK8sConfig name + the Cluster endpoint.
    assert!(
        state.cert_sans.contains(&node.config_name),
        "{:?}",
        state.cert_sans
    );
    assert!(
        state
            .cert_sans
            .contains(&"alpha.k8s.example.internal".to_owned()),
        "{:?}",
        state.cert_sans
    );

    // Exactly plan then run on this node, and no k8sd POST anywhere else.
    let calls = env.sim.calls("", "").await.unwrap();
    let here: Vec<_> = calls
        .iter()
        .filter(|c| c.node == node.node)
        .cloned()
        .collect();
    assert_eq!(posts(&here), [path::PLAN, path::RUN], "{here:#?}");
    let elsewhere: Vec<_> = calls[before_calls.min(calls.len())..]
        .iter()
        .filter(|c| c.node != node.node && c.method == "POST" && c.body.contains("seed"))
        .filter(|c| {
            c.cluster == "beta"
                || c.body.contains(&format!(
                    "{}",
                    state
                        .seeds_run
                        .clone()
                        .unwrap_or_default()
                        .last()
                        .copied()
                        .unwrap_or(-1)
                ))
        })
        .collect();
    assert!(elsewhere.is_empty(), "{elsewhere:#?}");

    let mc = env
        .machine_certificates(&node)
        .await
        .expect("MachineCertificates");
    let status = mc.status.unwrap();
    let op = status.operation.unwrap();
    assert_eq!(op.phase, Phase::Succeeded);
    assert_eq!(op.run_attempts, 1);
    assert_eq!(op.requested_by.as_deref(), Some("kubectl-annotate"));
    assert_eq!(
        status.k8sd_fingerprint.as_deref(),
        Some(state.k8sd_fingerprint_sha256.as_str())
    );
    let reasons = env.event_reasons(&node).await;
    assert!(
        reasons.contains(&"CertificatesRefreshInProgress".into())
            && reasons.contains(&"CertificatesRefreshDone".into()),
        "{reasons:?}"
    );
}

#[tokio::test]
async fn a_worker_refresh_gets_three_approved_signed_csrs_and_reports_the_lifetime_it_got() {
    let env = shared_of(CLUSTERS).await;
    let filter = "worker-refresh";
    let [node] = env.isolated("beta", ["beta-md-0-w0"], filter).await;
    let _controller = env.start_controller(filter, &[]);
    env.sim.clear_calls("beta", &node.node).await.unwrap();
    timed_refresh(&env, &node, "90d").await;

    let mc = env.machine_certificates(&node).await.unwrap();
    let op = mc.status.unwrap().operation.unwrap();
    let seed = op.seed.unwrap();
    let workload = env.cluster("beta").client().await.unwrap();
    let csrs: Api<CertificateSigningRequest> = Api::all(workload);
    for suffix in [
        "worker-kubelet-serving",
        "worker-kubelet-client",
        "worker-kube-proxy-client",
    ] {
        let csr = csrs.get(&format!("k8sd-{seed}-{suffix}")).await.unwrap();
        // Made by the node itself, as k8sd's run makes them: what the controller checked.
        let requester = format!("system:node:{}", node.node);
        assert_eq!(csr.spec.username.as_deref(), Some(requester.as_str()));
        let status = csr.status.unwrap();
        assert!(
            status
                .conditions
                .unwrap()
                .iter()
                .any(|c| c.type_ == "Approved")
        );
        assert!(status.certificate.is_some());
    }
    // Published k8sd signs for ten years whatever was asked: said in the record and an Event.
    let note = op.note.unwrap_or_default();
    assert!(note.contains("90 days"), "{note}");
    let reasons = env.event_reasons(&node).await;
    assert!(
        reasons.contains(&"CertificatesLifetimeMismatch".into()),
        "{reasons:?}"
    );
    let calls = env.sim.calls("beta", &node.node).await.unwrap();
    assert_eq!(posts(&calls), [path::PLAN, path::RUN]);
}

#[tokio::test]
async fn a_bad_ttl_fails_at_once_without_calling_k8sd_and_names_the_accepted_forms() {
    let env = shared_of(CLUSTERS).await;
    let [node] = env.isolated("alpha", ["alpha-md-0-w0"], "bad-ttl").await;
    let _controller = env.start_controller("bad-ttl", &[]);
    // Let the controller read the expiry first, so the only k8sd traffic left is what a bad TTL causes.
    env.wait_for_machine(&node, Duration::from_secs(30), |a| {
        a.contains_key(CERTIFICATES_EXPIRY)
    })
    .await;
    for ttl in ["abc", "0", "-1h", "69y"] {
        env.sim.clear_calls("alpha", &node.node).await.unwrap();
        env.annotate_refresh(&node, ttl).await;
        let annotations = env.wait_for_refresh(&node, Duration::from_secs(30)).await;
        assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "failed", "{ttl}");
        let mc = env.machine_certificates(&node).await.unwrap();
        let error = mc.status.unwrap().operation.unwrap().error.unwrap();
        assert!(error.contains(ttl), "{ttl}: {error}");
        if ttl == "69y" {
            assert!(error.contains("32-bit"), "{error}");
        } else {
            assert!(
                error.contains("1y") && error.contains("90d"),
                "{ttl}: {error}"
            );
        }
        assert!(
            posts(&env.sim.calls("alpha", &node.node).await.unwrap()).is_empty(),
            "{ttl}: k8sd was called"
        );
    }
    let events = env.machine_events(&node).await;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("CertificatesRefreshFailed"))
    );
}

/// Numbers for the notes: k8sd calls and API writes per refresh, wall time, controller memory.
/// The refresh's journal is its request: the Machine names it while the refresh runs, its
/// status holds the seed that was sent, and (with `--refresh-history 0`) it goes when the
/// refresh ends.
#[tokio::test]
async fn a_refresh_is_journaled_in_its_request_and_without_history_none_is_kept() {
    let env = shared_of(CLUSTERS).await;
    // Not a control plane of beta or alpha: the worker tests of this file, run at the same
    // time, pick those as approvers, and one restarting under an approve costs a worker a
    // second `run` (which `refresh_costs` counts).
    let [node] = env.isolated("trio", ["trio-cp-0"], "journal").await;
    let _controller = env.start_controller("journal", &["--refresh-history", "0"]);
    env.annotate_held_at(
        &node,
        Endpoint::Run,
        Duration::from_secs(3),
        REFRESH_TIMEOUT,
    )
    .await;

    let annotations = env.machine_annotations(&node).await;
    assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "in-progress");
    let name = annotations[IN_FLIGHT_REFRESH].clone();
    let requests: Api<CertificateRefresh> =
        Api::namespaced(env.management().await.unwrap(), &node.namespace);
    let request = requests.get(&name).await.unwrap();
    assert_eq!(
        request.spec.target.machine.as_deref(),
        Some(node.machine.as_str())
    );
    let status = request.status.expect("the seed is recorded before run");
    assert_eq!(status.phase, Some(RequestPhase::Running), "{status:#?}");
    let op = status.operation.expect("the operation");
    let calls = env.calls(&node).await;
    let sent = runs(&calls);
    assert_eq!(sent.len(), 1, "{sent:#?}");
    assert_eq!((op.phase, op.run_attempts), (Phase::Running, 1));
    assert_eq!(
        op.seed,
        Some(sent[0].seed()),
        "the seed sent is the one recorded"
    );
    // The MachineCertificates keeps no unfinished operation (its `operation` is the copy of the
    // last finished one); it shows the refresh in flight in its Refreshing condition, naming
    // the request and the seed.
    let certificates = env
        .machine_certificates(&node)
        .await
        .and_then(|m| m.status)
        .unwrap_or_default();
    let copy = certificates.operation.as_ref();
    assert!(copy.is_none_or(|c| c.is_finished()), "{copy:#?}");
    let refreshing = certificates
        .conditions
        .iter()
        .find(|c| c.type_ == "Refreshing")
        .expect("a Refreshing condition");
    assert_eq!(refreshing.status, "True", "{refreshing:#?}");
    assert!(
        refreshing
            .message
            .contains(&format!("CertificateRefresh {name}"))
            && refreshing
                .message
                .contains(&format!("seed {}", sent[0].seed())),
        "{refreshing:#?}"
    );

    let annotations = env.wait_for_done(&node, REFRESH_TIMEOUT).await;
    assert!(
        !annotations.contains_key(IN_FLIGHT_REFRESH),
        "{annotations:#?}"
    );
    let last = env.operation(&node).await;
    assert_eq!((last.phase, last.seed), (Phase::Succeeded, op.seed));
    // No history kept: the request went with the end of its refresh.
    let selector = format!("{}={}", labels::MACHINE, node.machine);
    let deadline = std::time::Instant::now() + REFRESH_TIMEOUT;
    loop {
        let left = requests
            .list_metadata(&kube::api::ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items
            .len();
        if left == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{left} record(s) kept"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn refresh_costs() {
    let env = shared_of(CLUSTERS).await;
    let filter = "costs";
    let [cp, worker] = env.nodes("beta", ["beta-cp-1", "beta-md-0-w1"]);
    env.isolate_fresh([&cp, &worker], filter).await;
    let controller = env.start_controller(filter, &[]);
    // Let the controller settle (MachineCertificates created, expiry read) before measuring.
    for node in [&cp, &worker] {
        env.wait_for_machine(node, REFRESH_TIMEOUT, |a| {
            a.contains_key(CERTIFICATES_EXPIRY)
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let user = "system:serviceaccount:ck8s-certs-system:ck8s-certs-manager";
    // The worker first: after a control plane, its cluster is held while the node settles, and
    // a worker refreshed then waits (and shows it, one more write).
    for (node, ttl, k8sd_posts) in [(&worker, "30d", 3), (&cp, "1y", 2)] {
        let calls_before = env.sim.calls("beta", "").await.unwrap().len();
        let writes_before =
            ck8s_certs_e2e::controlplane::audited_writes(&env.dir, "management").len();
        let started = std::time::Instant::now();
        env.annotate_refresh(node, ttl).await;
        env.wait_for_done(node, REFRESH_TIMEOUT).await;
        let elapsed = started.elapsed();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let calls = env.sim.calls("beta", "").await.unwrap();
        let posts: Vec<_> = calls[calls_before..]
            .iter()
            .filter(|c| c.method == "POST")
            .map(|c| c.endpoint.clone())
            .collect();
        let writes: Vec<String> =
            ck8s_certs_e2e::controlplane::audited_writes(&env.dir, "management")[writes_before..]
                .iter()
                .filter(|w| w.user.username == user)
                // Lease renewals are the cost of leader election, not of a refresh. The other
                // tests of this file run their controllers as the same user at the same time:
                // only the objects of this Machine count (the Machine and its
                // MachineCertificates by its name, its records `<machine>-…`, its Events
                // `<machine>.…`; the audit log names created objects too).
                .filter(|w| {
                    w.object_ref.as_ref().is_some_and(|o| {
                        o.resource != "leases"
                            && (o.name == node.machine
                                || o.name.starts_with(&format!("{}-", node.machine))
                                || o.name.starts_with(&format!("{}.", node.machine)))
                    })
                })
                .filter_map(|w| {
                    w.object_ref.as_ref().map(|o| {
                        format!(
                            "{} {}{}",
                            w.verb,
                            o.resource,
                            if o.subresource.is_empty() {
                                String::new()
                            } else {
                                format!("/{}", o.subresource)
                            }
                        )
                    })
                })
                .collect();
        let object_writes = writes.iter().filter(|w| !w.contains("events")).count();
        println!(
            "{:?} refresh: {:.2}s, k8sd POSTs {posts:?}, API writes {} ({object_writes} Machine/status + {} events): {writes:?}",
            node.role,
            elapsed.as_secs_f64(),
            writes.len(),
            writes.len() - object_writes
        );
        assert_eq!(posts.len(), k8sd_posts, "{posts:?}");
        // Why each write: the Machine in-progress (naming its request), the request created
        // (a status subresource ignores status on create), its status with the seed before
        // `run`, the MachineCertificates showing the refresh (Refreshing=True naming the
        // request), the request's status with the outcome (the journal first), the
        // MachineCertificates' expiry and conditions, the Machine done.
        assert_eq!(
            object_writes, 7,
            "2 Machine patches + the request's create and 2 status writes + 2 MachineCertificates status: {writes:?}"
        );
        for (write, times) in [
            ("patch machines", 2),
            ("create certificaterefreshes", 1),
            ("patch certificaterefreshes/status", 2),
            ("patch machinecertificates/status", 2),
        ] {
            assert_eq!(
                writes.iter().filter(|w| *w == write).count(),
                times,
                "{write}: {writes:?}"
            );
        }
        // In that order: the seed in the request before `run`, the outcome in the request
        // before anything else shows it.
        let objects: Vec<&str> = writes
            .iter()
            .map(String::as_str)
            .filter(|w| !w.contains("events"))
            .collect();
        assert_eq!(
            objects,
            [
                "patch machines",
                "create certificaterefreshes",
                "patch certificaterefreshes/status",
                "patch machinecertificates/status",
                "patch certificaterefreshes/status",
                "patch machinecertificates/status",
                "patch machines",
            ],
            "{writes:?}"
        );
    }
    println!(
        "controller RSS: {} KiB",
        controller.process.rss_kib().unwrap_or_default()
    );
}

#[tokio::test]
async fn machines_with_the_same_name_in_two_namespaces_never_mix() {
    let env = shared_of(CLUSTERS).await;
    let [fleet] = env.nodes("alpha", ["alpha-cp-1"]);
    let [edge] = env.nodes("gamma", ["alpha-cp-1"]);
    assert_eq!(fleet.machine, edge.machine);
    assert_ne!(
        (&fleet.namespace, &fleet.node),
        (&edge.namespace, &edge.node)
    );
    for node in [&fleet, &edge] {
        env.isolate(node, "twins").await;
    }
    let _controller = env.start_controller("twins", &[]);
    env.annotate_refresh(&fleet, "1y").await;
    env.annotate_refresh(&edge, "2y").await;
    for (node, ttl_seconds) in [(&fleet, 365 * 86_400), (&edge, 2 * 365 * 86_400)] {
        let annotations = env.wait_for_done(node, REFRESH_TIMEOUT).await;
        let calls = env.calls(node).await;
        let runs: Vec<_> = calls.iter().filter(|c| c.path == path::RUN).collect();
        assert_eq!(runs.len(), 1, "{}: {runs:#?}", node.cluster);
        let body: serde_json::Value = serde_json::from_str(&runs[0].body).unwrap();
        assert_eq!(body["expiration-seconds"], ttl_seconds, "{}", node.cluster);
        let state = env.sim.node(node).await.unwrap();
        let not_after: jiff::Timestamp = state.cert_not_after.parse().unwrap();
        assert_eq!(
            annotations[CERTIFICATES_EXPIRY],
            not_after.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
        );
    }
}
