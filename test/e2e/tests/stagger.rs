//! Staggered renewals at fleet scale: 200 Machines that become due at the same window opening
//! start spread over the policy's `spread`, each at its own slot (never before it), instead of
//! all at once; Machines whose certificates are inside the fail-safe margin ignore the spread.
//!
//! Its own environment: 5 clusters × 50 Machines (three control planes each). Simulated nodes start
//! with 90-day certificates: `renewBefore: 100d` makes every Machine due.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ck8s_certs::k8sd::wire::path;
use ck8s_certs::policy::StaggerKey;
use ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS;
use ck8s_certs_api::capi::{CLUSTER_NAME_LABEL, WATCH_FILTER_LABEL};
use ck8s_certs_api::renewal_policy::CertificateRenewalPolicy;
use ck8s_certs_e2e::Environment;
use ck8s_certs_e2e::bench::fleet::Fleet;
use ck8s_certs_e2e::controlplane::Audit;
use ck8s_certs_e2e::fixtures::NodeInfo;
use jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

const FILTER: &str = "stagger";
const SPREAD_SECONDS: i64 = 60;

async fn create_policy(env: &Environment, name: &str, clusters: &[&str], spec: serde_json::Value) {
    let mut spec = spec;
    spec["machineSelector"] = json!({ "matchExpressions": [
        { "key": CLUSTER_NAME_LABEL, "operator": "In", "values": clusters }
    ] });
    let policy: CertificateRenewalPolicy = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": "fleet-0", "labels": { WATCH_FILTER_LABEL: FILTER } },
        "spec": spec,
    }))
    .unwrap();
    Api::<CertificateRenewalPolicy>::namespaced(env.management().await.unwrap(), "fleet-0")
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
}

/// When `node`'s refresh sent `plan`, once it is done.
async fn planned(env: &Environment, node: &NodeInfo, deadline: Instant) -> Timestamp {
    loop {
        if env
            .machine_annotations(node)
            .await
            .get(REFRESH_CERTIFICATES_STATUS)
            .map(String::as_str)
            == Some("done")
        {
            let calls = env.sim.calls(&node.cluster, &node.node).await.unwrap();
            let plan = calls
                .iter()
                .find(|c| c.path == path::PLAN)
                .expect("a plan call");
            return plan.started_at.parse().unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "{} was not renewed in time",
            node.machine
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn machines_due_at_one_opening_start_spread_over_the_policy_spread_and_the_fail_safe_wins() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Three control planes a cluster: refreshing the only one would restart the workload API
    // server, which the clusters of this fleet share.
    let mut spec = Fleet::new(5, 50, 3).spec();
    spec.machine_annotations = BTreeMap::new();
    spec.audit = Audit::Writes;
    let env = Environment::start(spec).await.unwrap();
    let nodes: Vec<NodeInfo> = env.clusters.iter().flat_map(|c| c.nodes.clone()).collect();
    for node in &nodes {
        env.isolate(node, FILTER).await;
    }
    let (spread, near): (Vec<&NodeInfo>, Vec<&NodeInfo>) =
        nodes.iter().partition(|n| n.cluster != "c004");
    assert_eq!((spread.len(), near.len()), (200, 50));

    // A window opening at a whole minute at least 75 s away (every Machine's expiry is read
    // first), open for 30 minutes.
    let now = Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC);
    let mut opening = now
        .round(
            jiff::ZonedRound::new()
                .smallest(jiff::Unit::Minute)
                .mode(jiff::RoundMode::Ceil),
        )
        .unwrap();
    while opening.duration_since(&now) < SignedDuration::from_secs(75) {
        opening = opening.checked_add(SignedDuration::from_mins(1)).unwrap();
    }
    let close = opening.checked_add(SignedDuration::from_mins(30)).unwrap();
    let window = json!([{ "start": opening.strftime("%H:%M").to_string(), "end": close.strftime("%H:%M").to_string() }]);
    create_policy(
        &env,
        "at-opening",
        &["c000", "c001", "c002", "c003"],
        json!({ "policy": "Scheduled", "renewBefore": "100d", "failSafeMargin": "1d",
                "spread": format!("{SPREAD_SECONDS}s"), "windows": window }),
    )
    .await;
    // Inside the fail-safe margin (100d > 90d) and inside an all-day window: an hour's spread
    // must not hold them back.
    create_policy(
        &env,
        "near-expiry",
        &["c004"],
        json!({ "policy": "Scheduled", "renewBefore": "100d", "failSafeMargin": "100d",
                "spread": "1h", "windows": [{ "start": "00:00", "end": "24:00" }] }),
    )
    .await;
    let started = Timestamp::now();
    // One replica: no leader election, whose short test timings a loaded machine (250 nodes
    // reading their expiry at once) can miss.
    let controller = env.start_controller(
        FILTER,
        &["--max-worker-refreshes=20", "--leader-elect=false"],
    );

    // The fail-safe wins: all 50 within a minute of the start, not over the hour.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut near_times = Vec::new();
    for node in &near {
        near_times.push(planned(&env, node, deadline).await);
    }
    let last_near = near_times.iter().max().unwrap();
    assert!(
        last_near.duration_since(started) < SignedDuration::from_secs(60),
        "the last Machine inside the fail-safe margin started {} after the controller",
        last_near.duration_since(started)
    );

    // The others: never before their slot, spread over the minute after the opening.
    let opening = opening.timestamp();
    let deadline = Instant::now()
        + Duration::try_from(opening.duration_since(Timestamp::now())).unwrap_or_default()
        + Duration::from_secs(SPREAD_SECONDS as u64 + 90);
    let mut times = Vec::new();
    for node in &spread {
        let at = planned(&env, node, deadline).await;
        let uid = env.machine_uid(node).await;
        let slot =
            opening + SignedDuration::from_secs(StaggerKey::new(&uid).offset(SPREAD_SECONDS));
        // The simulator's clock is this machine's; a second for its timestamp's precision.
        assert!(
            at >= slot - SignedDuration::from_secs(1),
            "{} started at {at}, before its slot {slot}",
            node.machine
        );
        times.push((at, slot, node.machine.clone()));
    }
    times.sort();
    let first = times.first().unwrap().0;
    let last = times.last().unwrap().0;
    let mut per_second: BTreeMap<i64, usize> = BTreeMap::new();
    for (at, _, _) in &times {
        *per_second.entry(at.as_second()).or_default() += 1;
    }
    let busiest = per_second.values().max().copied().unwrap_or_default();
    let late = times
        .iter()
        .map(|(at, slot, _)| at.duration_since(*slot))
        .max()
        .unwrap();
    println!(
        "opening {opening}; 200 renewals started from {first} to {last} ({:#} after the opening to the last); at most {busiest} in one second; latest start {late:#} after its slot",
        last.duration_since(opening)
    );
    println!(
        "fail-safe: 50 renewals started from {} to {last_near}",
        near_times.iter().min().unwrap()
    );
    assert!(
        last.duration_since(first) >= SignedDuration::from_secs(SPREAD_SECONDS * 3 / 4),
        "200 renewals bunched between {first} and {last}"
    );
    assert!(
        busiest <= 20,
        "{busiest} renewals started in the same second"
    );
    drop(controller);
    env.stop();
}
