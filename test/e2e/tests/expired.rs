//! Clusters whose certificates have already expired, or whose CA nears its end (issue 37): what
//! the management cluster can tell without reaching them. Its own test binary (and so its own
//! environment): it replaces a kubeconfig and rewrites Machines' records.

use std::time::{Duration, Instant};

use base64::Engine;
use ck8s_certs_api::annotations::CERTIFICATES_EXPIRY;
use ck8s_certs_api::cluster_certificates::ClusterCertificates;
use ck8s_certs_e2e::drill::{
    at, check_recovered, go_dark, own_by_machine_set, ready_condition, refreshing, wait_pinned,
    wait_recovered,
};
use ck8s_certs_e2e::{EnvSpec, Environment, shared_with};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);

/// The standard environment and `dusk` (fleet, 3 control planes, 3 workers, like `trio`) for
/// the drill without a policy: each test of this binary has a cluster of its own.
fn spec() -> EnvSpec {
    let mut spec = EnvSpec::standard();
    let mut dusk = spec.clusters[0].clone();
    dusk.name = "dusk".into();
    dusk.machine_prefix = "dusk".into();
    dusk.endpoint_host = "dusk.k8s.example.internal".into();
    (dusk.control_planes, dusk.workers) = (3, 3);
    spec.clusters.push(dusk);
    spec
}

async fn shared() -> std::sync::Arc<Environment> {
    shared_with(spec).await
}

/// A CA certificate (PEM) ending at `not_after`: what `certificate-authority-data` would hold
/// for a cluster whose CA is near its end.
fn ca_certificate(not_after: jiff::Timestamp) -> String {
    let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kubernetes-ca");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.not_before = rcgen::date_time_ymd(2017, 1, 1);
    params.not_after = time::OffsetDateTime::from_unix_timestamp(not_after.as_second()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    params.self_signed(&key).unwrap().pem()
}

/// Writes by the controllers to ClusterCertificates `namespace/name` since audit entry `from`
/// (other tests of this binary run beside).
fn record_writes_since(env: &Environment, from: usize, record: &str) -> (usize, Vec<String>) {
    let all = ck8s_certs_e2e::controlplane::audited_writes(&env.dir, "management");
    let writes = all
        .iter()
        .skip(from)
        .filter(|w| {
            w.user
                .username
                .starts_with("system:serviceaccount:ck8s-certs-system:")
        })
        .filter_map(|w| w.object_ref.as_ref())
        .filter(|o| o.resource == "clustercertificates")
        .map(|o| (format!("{}/{}", o.namespace, o.name), o.subresource.clone()))
        .filter(|(name, _)| name == record)
        .map(|(name, subresource)| format!("{name} {subresource}"))
        .collect();
    (all.len(), writes)
}

/// A cluster switched off past its certificates' expiry, whose CA also ends within the year:
/// both are told from what the management cluster holds (the Machines' records, the kubeconfig's
/// CA data), without reaching the cluster: conditions, Events, metrics, the plugin's first
/// lines. A Machine change that is not its record costs no write; the record moving past now
/// again says the cluster recovered.
#[tokio::test]
async fn a_cluster_gone_dark_past_its_expiry_and_a_ca_near_its_end_are_announced() {
    let env = shared().await;
    let client = env.management().await.unwrap();
    let now = jiff::Timestamp::now();
    let day = jiff::SignedDuration::from_hours(24);
    let whole = |t: jiff::Timestamp| jiff::Timestamp::from_second(t.as_second()).unwrap();
    let ca_end = whole(now + 300 * day);
    let expired_at = whole(now - 2 * day);

    // solo's kubeconfig now trusts a CA that ends in 300 days (the workload API is then
    // unreachable with it, as it would be for a cluster that is down).
    let solo = env.cluster("solo");
    let mut kubeconfig: serde_yaml::Value = serde_yaml::from_str(&solo.kubeconfig_yaml).unwrap();
    kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"] =
        base64::engine::general_purpose::STANDARD
            .encode(ca_certificate(ca_end))
            .into();
    env.write_kubeconfig("solo", &serde_yaml::to_string(&kubeconfig).unwrap())
        .await;
    let nodes = env.isolate_cluster("solo", "dark").await;
    let record_expiry = |at: jiff::Timestamp| json!({ "metadata": { "annotations": { CERTIFICATES_EXPIRY: at.to_string() } } });
    for node in &nodes {
        let at = match node.machine.as_str() {
            "solo-md-0-w1" => expired_at,
            _ => whole(now + 100 * day),
        };
        env.patch_machine(node, record_expiry(at)).await;
    }
    let controller = env.start_controller("dark", &[]);

    let api: Api<ClusterCertificates> = Api::namespaced(client.clone(), "fleet");
    let condition = |record: &ClusterCertificates, type_: &str| -> Option<Condition> {
        record
            .status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .cloned()
    };
    let start = Instant::now();
    let record = loop {
        if let Some(record) = api.get_opt("solo").await.unwrap()
            && condition(&record, "CertificatesExpired").is_some_and(|c| c.status == "True")
            && condition(&record, "CARunway").is_some_and(|c| c.status == "False")
        {
            break record;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "solo's record never told: {:#?}\n{}",
            api.get_opt("solo").await.unwrap().and_then(|r| r.status),
            controller
                .log()
                .lines()
                .filter(|l| !l.contains("ReadExpiry"))
                .take(40)
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let expired = condition(&record, "CertificatesExpired").unwrap();
    assert_eq!(expired.reason, "NodeCertificatesExpired");
    assert!(
        expired.message.starts_with(&format!(
            "The certificates of Machine solo-md-0-w1 expired at {expired_at}: its node fails TLS"
        )),
        "{}",
        expired.message
    );
    let runway = condition(&record, "CARunway").unwrap();
    assert_eq!(runway.reason, "CAEndingSoon");
    assert!(
        runway.message.starts_with(&format!(
            "The cluster CA ends at {ca_end}, within --ca-runway-warning (365d)"
        )) && runway.message.contains("k8sd cannot rotate a cluster CA"),
        "{}",
        runway.message
    );
    let status = record.status.unwrap();
    let recorded = status.nodes.unwrap();
    assert_eq!(
        (
            recorded.earliest_machine.as_deref(),
            recorded.earliest_expiry.map(|t| t.0),
            recorded.expired,
            recorded.unknown
        ),
        (Some("solo-md-0-w1"), Some(expired_at), 1, 0)
    );
    assert_eq!(
        status
            .kubeconfig
            .unwrap()
            .certificate_authority_expiry
            .map(|t| t.0),
        Some(ca_end)
    );

    // Events on the Cluster, once each.
    let start = Instant::now();
    loop {
        let reasons: Vec<String> = env
            .cluster_events("fleet", "solo")
            .await
            .into_iter()
            .filter_map(|e| e.reason)
            .collect();
        if reasons.iter().any(|r| r == "ClusterCertificatesExpired")
            && reasons.iter().any(|r| r == "ClusterCAEnding")
        {
            break;
        }
        assert!(start.elapsed() < TIMEOUT, "no Events: {reasons:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The metrics the two alerts read.
    let metrics = controller.metrics().await;
    assert!(
        metrics.contains(&format!(
            "ck8s_certs_cluster_certificates_expired_since_timestamp_seconds{{namespace=\"fleet\",cluster=\"solo\"}} {}",
            expired_at.as_second()
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains("ck8s_certs_ca_runway_warning_seconds 31536000"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "ck8s_certs_kubeconfig_expiry_timestamp_seconds{{namespace=\"fleet\",cluster=\"solo\",certificate=\"ca\"}} {}",
            ca_end.as_second()
        )),
        "{metrics}"
    );

    // The plugin names the cluster before its Machines.
    let plugin = env.dir.join("bin/kubectl-ck8s_certs");
    if !plugin.exists() {
        std::fs::create_dir_all(plugin.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(ck8s_certs_e2e::Binaries::controller().unwrap(), &plugin)
            .unwrap();
    }
    let output = std::process::Command::new(&plugin)
        .args(["status", "-n", "fleet", "--cluster", "solo"])
        .env("KUBECONFIG", &env.management_kubeconfig)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("NAMESPACE  CLUSTER  ATTENTION"),
        "{text}"
    );
    assert!(
        lines[1].contains("NodeCertificatesExpired")
            && lines[1].contains(&format!(
                "node certificates expired at {expired_at} (Machine solo-md-0-w1; 1 expired)"
            )),
        "{text}"
    );
    assert!(
        lines[2].contains("CAEndingSoon")
            && lines[2].contains(&format!("cluster CA ends at {ca_end}")),
        "{text}"
    );
    assert!(lines[4].starts_with("NAMESPACE  MACHINE"), "{text}");

    // Nothing changed that the record shows: a Machine's label, the Cluster's annotation.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (mark, _) = record_writes_since(&env, 0, "fleet/solo");
    env.patch_machine(
        &nodes[0],
        json!({ "metadata": { "labels": { "e2e-touched": "1" } } }),
    )
    .await;
    env.cluster_api(client.clone(), "fleet")
        .patch(
            "solo",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { "e2e-touched": "1" } } })),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (_, writes) = record_writes_since(&env, mark, "fleet/solo");
    assert!(writes.is_empty(), "writes with nothing changed: {writes:?}");

    // The expired node is refreshed (its record moves on): recovered.
    let cp1 = nodes.iter().find(|n| n.machine == "solo-md-0-w1").unwrap();
    env.patch_machine(cp1, record_expiry(whole(now + 200 * day)))
        .await;
    let start = Instant::now();
    loop {
        let record = api.get("solo").await.unwrap();
        if condition(&record, "CertificatesExpired").is_some_and(|c| c.reason == "NotExpired") {
            break;
        }
        assert!(start.elapsed() < TIMEOUT, "solo never recovered");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let start = Instant::now();
    while !env
        .cluster_events("fleet", "solo")
        .await
        .iter()
        .any(|e| e.reason.as_deref() == Some("ClusterCertificatesRecovered"))
    {
        assert!(start.elapsed() < TIMEOUT, "no recovery Event");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let metrics = controller.metrics().await;
    assert!(
        !metrics.contains("ck8s_certs_cluster_certificates_expired_since_timestamp_seconds{"),
        "{metrics}"
    );
}

/// A cluster switched off past its expiry whose workload API now serves an expired certificate
/// (the real kube-apiserver, started again with it): nothing reaches a node through that API.
/// A worker's refresh waits, saying why, with no k8sd call; a control plane whose k8sd
/// certificate is pinned is refreshed directly (the Machine's address, the microcluster port,
/// the pin), its record says so, and its refresh renews what the API server serves; then the
/// waiting worker goes on through the API: control planes first, workers after.
#[tokio::test]
async fn an_expired_workload_api_is_passed_by_reaching_a_pinned_control_plane_directly() {
    let env = shared().await;
    let nodes = env.isolate_cluster("alpha", "drill").await;
    let cp = nodes.iter().find(|n| n.machine == "alpha-cp-1").unwrap();
    let worker = nodes.iter().find(|n| n.machine == "alpha-md-0-w0").unwrap();
    // Checked every minute (the workload API's certificate with it), not every 6 hours.
    let _controller = env.start_controller("drill", &["--kubeconfig-check-interval=1m"]);
    // The cluster was healthy once: each node's k8sd certificate pinned at first contact.
    wait_pinned(&env, &nodes).await;

    env.expire_workload_api("alpha", TIMEOUT).await.unwrap();
    let expired_at = Instant::now();

    // A worker cannot be reached past the dead API: it waits, and says why.
    env.sim.clear_calls("alpha", &worker.node).await.unwrap();
    env.sim.clear_calls("alpha", &cp.node).await.unwrap();
    env.annotate_refresh(worker, "1y").await;
    let waiting = env
        .wait_for_status(worker, TIMEOUT, "the worker waiting for the API", |s| {
            refreshing(s).contains("Waiting: a control plane's refresh")
        })
        .await;
    assert!(
        refreshing(&waiting).contains(
            "which renews the workload cluster's API: the API server of workload cluster alpha serves a certificate that expired at"
        ),
        "{}",
        refreshing(&waiting)
    );
    assert!(
        env.calls(worker).await.is_empty(),
        "k8sd calls on the worker"
    );

    // The cluster says so at its next check, although no Machine records an expired
    // certificate.
    let records: Api<ClusterCertificates> =
        Api::namespaced(env.management().await.unwrap(), "fleet");
    let expired = loop {
        let record = records.get_opt("alpha").await.unwrap();
        if let Some(condition) = record
            .and_then(|r| r.status)
            .and_then(|s| {
                s.conditions
                    .into_iter()
                    .find(|c| c.type_ == "CertificatesExpired")
            })
            .filter(|c| c.status == "True")
        {
            break condition;
        }
        assert!(
            expired_at.elapsed() < Duration::from_secs(150),
            "alpha's record never said its API's certificate expired"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(expired.reason, "APIServerCertificateExpired");
    assert!(
        expired
            .message
            .starts_with("The workload API server serves a certificate that expired at "),
        "{}",
        expired.message
    );

    // A control plane is refreshed directly.
    let cp_at = Instant::now();
    env.annotate_refresh(cp, "1y").await;
    env.wait_for_done(cp, Duration::from_secs(120)).await;
    let cp_took = cp_at.elapsed();
    let operation = env
        .machine_certificates(cp)
        .await
        .and_then(|m| m.status?.operation)
        .unwrap();
    let transport = operation.transport.unwrap_or_default();
    assert!(
        transport.starts_with(&format!("direct connection to {}:", cp.address))
            && transport.ends_with("(the workload API server's certificate expired)"),
        "{transport}"
    );
    let cp_calls = env.calls(cp).await;
    let runs = ck8s_certs_e2e::sim::runs(&cp_calls);
    assert_eq!(runs.len(), 1, "{cp_calls:#?}");

    // Its refresh renewed what the API server serves.
    let start = Instant::now();
    loop {
        let client = env.cluster("alpha").client().await.unwrap();
        if ck8s_certs_e2e::controlplane::is_ready(&client).await {
            break;
        }
        assert!(start.elapsed() < TIMEOUT, "alpha's API never came back");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        !env.sim
            .cluster("alpha")
            .await
            .unwrap()
            .api_certificate_expired
    );

    // The waiting worker goes on, through the API as usual, after the control plane.
    env.wait_for_done(worker, Duration::from_secs(180)).await;
    println!(
        "manual drill: control plane refreshed directly in {cp_took:?}; the waiting worker done {:?} after the control plane's trigger",
        cp_at.elapsed()
    );
    let transport = env
        .machine_certificates(worker)
        .await
        .and_then(|m| m.status?.operation?.transport)
        .unwrap_or_default();
    assert!(transport.starts_with("port-forward to pod"), "{transport}");
    let worker_calls = env.calls(worker).await;
    let first = worker_calls.first().expect("the worker's calls");
    assert!(
        at(&first.started_at) > at(&runs[0].started_at),
        "the worker's first call ({}) before the control plane's run ({})",
        first.started_at,
        runs[0].started_at
    );
}

/// A worker whose kubelet.conf client certificate has expired: its `run` cannot create its CSRs
/// (the real API server refuses the client, 401), so it cannot be refreshed in place. The
/// refresh ends at that first `run` with no new plan, `Ready` says InPlaceImpossible, and the
/// message gives the command that replaces the Machine.
#[tokio::test]
async fn a_worker_whose_kubelet_conf_expired_is_told_to_be_replaced_after_one_run() {
    let env = shared().await;
    let [worker] = env.isolated("beta", ["beta-md-0-w1"], "replace").await;
    let _controller = env.start_controller("replace", &[]);
    env.wait_for_status(&worker, TIMEOUT, "the k8sd pin", |s| {
        s.k8sd_fingerprint.is_some() && s.expiry.is_some()
    })
    .await;
    env.sim
        .set_client_certificate_expired(&worker, true)
        .await
        .unwrap();
    env.sim.clear_calls("beta", &worker.node).await.unwrap();

    env.annotate_refresh(&worker, "1y").await;
    let error = env.refresh_failure(&worker, Duration::from_secs(120)).await;
    assert!(
        error.starts_with(
            "The node cannot be refreshed in place: its cluster's API server refused the node's own client certificate (kubelet.conf)"
        ) && error.contains("failed to create CSR for k8sd-")
            && error.contains("Replace the Machine: `kubectl delete machine -n fleet beta-md-0-w1`"),
        "{error}"
    );
    let ready = ready_condition(&env, &worker).await;
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "InPlaceImpossible")
    );
    let calls = env.calls(&worker).await;
    let plans = calls.iter().filter(|c| c.path.ends_with("/plan")).count();
    assert_eq!(
        (plans, ck8s_certs_e2e::sim::runs(&calls).len()),
        (1, 1),
        "{calls:#?}"
    );
}

/// Past an expired workload API, a control plane the management cluster cannot reach directly
/// (its k8sd refuses every connection here, as an address nothing routes to would): the refresh
/// fails at once, after one connection tried, saying so and where the manual steps are; nothing
/// reaches k8sd and nothing is retried.
#[tokio::test]
async fn a_control_plane_out_of_reach_past_an_expired_api_fails_at_once_saying_so() {
    let env = shared().await;
    let nodes = env.isolate_cluster("gamma", "unreachable").await;
    let cp = nodes.iter().find(|n| n.machine == "alpha-cp-0").unwrap();
    let _controller = env.start_controller("unreachable", &[]);
    env.wait_for_status(cp, TIMEOUT, "the k8sd pin", |s| {
        s.k8sd_fingerprint.is_some() && s.expiry.is_some()
    })
    .await;
    env.expire_workload_api("gamma", TIMEOUT).await.unwrap();
    env.sim
        .inject(&ck8s_certs_e2e::sim::Fault::refuse().on(cp))
        .await
        .unwrap();
    env.sim.clear_calls("gamma", &cp.node).await.unwrap();

    let started = Instant::now();
    env.annotate_refresh(cp, "1y").await;
    let error = env.refresh_failure(cp, TIMEOUT).await;
    let took = started.elapsed();
    assert!(
        error.contains(
            "the API server of workload cluster gamma serves a certificate that expired at "
        ) && error.contains(&format!(
            "and node {}'s k8sd cannot be reached directly at {}:",
            cp.node, cp.address
        )) && error.contains("the management cluster may not route to the nodes' addresses")
            && error.contains("docs/troubleshooting.md, \"A cluster whose certificates expired\""),
        "{error}"
    );
    assert!(env.calls(cp).await.is_empty(), "a k8sd call got through");
    // Not waited for (that message would say "did not answer within" the wait timeout).
    println!("a control plane out of reach failed {took:?} after its trigger");
    env.sim.clear_faults("gamma").await.unwrap();
}

/// The expired drill (issue 37) under an Automatic policy, with no annotation at all: trio (3
/// control planes, 3 workers) switched off past its certificates' expiry, one worker's
/// kubelet.conf expired with them. Every node is due (its record says expired, whatever
/// the windows say); the control planes come back one at a time over the direct path, then
/// the workers, and the worker that cannot be refreshed in place says so.
#[tokio::test]
async fn under_an_automatic_policy_a_dark_cluster_comes_back_by_itself() {
    let env = shared().await;
    let nodes = env.isolate_cluster("trio", "auto-drill").await;
    let _controller = env.start_controller("auto-drill", &[]);
    wait_pinned(&env, &nodes).await;
    let dark = go_dark(&env, "trio", &nodes, "trio-md-0-w2").await;
    let machine_set = own_by_machine_set(&env, &dark.lost).await;
    let audit_from = ck8s_certs_e2e::controlplane::audited_writes(&env.dir, "management").len();

    let policy_at = Instant::now();
    env.create_policy(
        "fleet",
        "auto-drill",
        "auto-drill",
        json!({
            "policy": "Automatic", "ttl": "1y",
            "inPlaceImpossible": { "action": "Replace" },
        }),
    )
    .await;
    for node in &nodes {
        env.patch_machine(
            node,
            json!({ "metadata": { "labels": { "e2e-policy": "auto-drill" } } }),
        )
        .await;
    }
    let done_after = wait_recovered(&env, "trio", &dark, policy_at).await;
    println!("automatic drill, each node after the policy (waited for in turn): {done_after:?}");
    check_recovered(&env, "trio", &dark, true, true).await;
    // The policy replaces the lost worker (Replace): its Machine is deleted, once, by the
    // controller, and that is said on the Machine and the Cluster.
    let machines = env.machine_api(env.management().await.unwrap(), "fleet");
    let start = Instant::now();
    while machines
        .get_opt(&dark.lost.machine)
        .await
        .unwrap()
        .is_some()
    {
        assert!(
            start.elapsed() < TIMEOUT,
            "the lost worker was not replaced"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!(
        "the lost worker's Machine was deleted {:?} after the policy",
        policy_at.elapsed()
    );
    // Nothing else of the cluster is deleted meanwhile (one at a time), and it is not deleted
    // twice.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let deletes: Vec<String> = ck8s_certs_e2e::controlplane::audited_writes(&env.dir, "management")
        .into_iter()
        .skip(audit_from)
        .filter(|w| w.verb == "delete")
        .filter_map(|w| w.object_ref)
        .filter(|o| o.resource == "machines")
        .map(|o| format!("{}/{}", o.namespace, o.name))
        .collect();
    assert_eq!(deletes, [format!("fleet/{}", dark.lost.machine)]);
    let events = env.cluster_events("fleet", "trio").await;
    let replaced = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("CertificatesMachineReplaced"))
        .unwrap_or_else(|| {
            panic!("no CertificatesMachineReplaced Event on the Cluster: {events:#?}")
        });
    let note = replaced.note.clone().unwrap_or_default();
    assert!(
        note.starts_with(&format!(
            "Deleted Machine trio-md-0-w2 (owned by MachineSet {machine_set}), so that its MachineSet creates a new one"
        )) && note.contains("CertificateRenewalPolicy auto-drill replaces such workers"),
        "{note}"
    );
}

/// The drill without a policy: one annotation of the Cluster (a fleet request) recovers it.
#[tokio::test]
async fn without_a_policy_one_cluster_annotation_recovers_a_dark_cluster() {
    let env = shared().await;
    let nodes = env.isolate_cluster("dusk", "dusk").await;
    let _controller = env.start_controller("dusk", &[]);
    wait_pinned(&env, &nodes).await;
    // The last worker, so that the request (which stops at its first failure) reaches the
    // others first.
    let dark = go_dark(&env, "dusk", &nodes, "dusk-md-0-w2").await;

    let annotated = Instant::now();
    env.cluster_api(env.management().await.unwrap(), "fleet")
        .patch(
            "dusk",
            &PatchParams {
                field_manager: Some("kubectl-annotate".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({ "metadata": { "annotations": {
                ck8s_certs_api::annotations::REFRESH_CERTIFICATES: "1y"
            } } })),
        )
        .await
        .unwrap();
    let done_after = wait_recovered(&env, "dusk", &dark, annotated).await;
    println!("drill without a policy, each node after the Cluster's annotation: {done_after:?}");
    check_recovered(&env, "dusk", &dark, true, false).await;
}
