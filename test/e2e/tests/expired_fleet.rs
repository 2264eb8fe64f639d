//! The expired drill for a fleet (issue 37): twenty clusters switched off past their
//! certificates' expiry come back at once under an Automatic policy, each one control plane at
//! a time, while healthy clusters beside them are refreshed as usual. Its own test binary: its
//! own environment of 25 clusters on 5 workload kube-apiservers.

use std::time::{Duration, Instant};

use ck8s_certs_api::machine_certificates::Phase;
use ck8s_certs_e2e::drill::{check_recovered, expire_nodes, wait_pinned, wait_recovered};
use ck8s_certs_e2e::fixtures::{ClusterSpec, NodeInfo};
use ck8s_certs_e2e::{EnvSpec, Environment, shared_with};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);
/// Clusters that go dark, and healthy ones beside them.
const DARK: usize = 20;
const LIT: usize = 5;
/// Workload kube-apiservers, round robin: clusters `i` with `i % SERVERS == SERVERS - 1` are the
/// healthy ones, on a server of their own (the others share theirs with dark clusters only, so
/// that expiring a server darkens no healthy cluster).
const SERVERS: usize = 5;

fn lit(index: usize) -> bool {
    index % SERVERS == SERVERS - 1
}

fn spec() -> EnvSpec {
    let mut spec = EnvSpec::standard();
    let template = spec.clusters[0].clone();
    spec.clusters = (0..DARK + LIT)
        .map(|i| {
            let (name, size) = match lit(i) {
                true => (format!("lit-{}", i / SERVERS), 2),
                false => (format!("dark-{i:02}"), 3),
            };
            ClusterSpec {
                machine_prefix: name.clone(),
                endpoint_host: format!("{name}.k8s.example.internal"),
                name,
                control_planes: size,
                workers: size,
                ..template.clone()
            }
        })
        .collect();
    spec.workload_servers = Some(SERVERS);
    spec
}

/// Refreshes every node of `clusters` by hand at once; answers how long each cluster took (its
/// slowest node).
async fn refresh_by_hand(env: &Environment, clusters: &[String]) -> Vec<(String, Duration)> {
    let nodes: Vec<NodeInfo> = clusters
        .iter()
        .flat_map(|c| env.cluster(c).nodes.clone())
        .collect();
    let started = Instant::now();
    for node in &nodes {
        env.annotate_refresh(node, "1y").await;
    }
    let mut took: Vec<(String, Duration)> = clusters
        .iter()
        .map(|c| (c.clone(), Duration::ZERO))
        .collect();
    for node in &nodes {
        env.wait_for_done(node, Duration::from_secs(300)).await;
        let cluster = took.iter_mut().find(|(c, _)| *c == node.cluster).unwrap();
        cluster.1 = started.elapsed();
    }
    took
}

#[tokio::test]
async fn twenty_dark_clusters_come_back_at_once_and_healthy_ones_are_not_held_up() {
    let env = shared_with(spec).await;
    let names: Vec<String> = env.spec.clusters.iter().map(|c| c.name.clone()).collect();
    let mut nodes = Vec::new();
    for name in &names {
        nodes.extend(env.isolate_cluster(name, "fleet-drill").await);
    }
    let controller = env.start_controller("fleet-drill", &[]);
    wait_pinned(&env, &nodes).await;
    let lit_names: Vec<String> = (0..names.len())
        .filter(|i| lit(*i))
        .map(|i| names[i].clone())
        .collect();

    // Before: healthy clusters' refreshes with nothing else going on.
    let before = refresh_by_hand(&env, &lit_names[..2]).await;

    // Twenty clusters go dark: each dark server is started again with an expired certificate
    // (once, through its first cluster), and every cluster on it is told so.
    let started = Instant::now();
    let mut dark = Vec::new();
    for server in 0..SERVERS - 1 {
        let on_it: Vec<&String> = (server..names.len())
            .step_by(SERVERS)
            .map(|i| &names[i])
            .collect();
        env.expire_workload_api(on_it[0], TIMEOUT).await.unwrap();
        for name in &on_it[1..] {
            env.sim
                .set_api_certificate_expired(name, true)
                .await
                .unwrap();
        }
    }
    let dark_names: Vec<String> = (0..names.len())
        .filter(|i| !lit(*i))
        .map(|i| names[i].clone())
        .collect();
    for name in &dark_names {
        let lost = format!("{name}-md-0-w2");
        dark.push((
            name.clone(),
            expire_nodes(&env, &env.cluster(name).nodes, &lost).await,
        ));
    }
    println!("20 clusters made dark in {:?}", started.elapsed());

    let policy_at = Instant::now();
    env.create_policy(
        "fleet",
        "fleet-drill",
        "fleet-drill",
        json!({ "policy": "Automatic", "ttl": "1y" }),
    )
    .await;
    for name in &dark_names {
        for node in &env.cluster(name).nodes {
            env.patch_machine(
                node,
                json!({ "metadata": { "labels": { "e2e-policy": "fleet-drill" } } }),
            )
            .await;
        }
    }
    // Meanwhile, the healthy clusters are refreshed by hand.
    let (beside, recovered) = tokio::join!(refresh_by_hand(&env, &lit_names[2..]), async {
        let mut last = Vec::new();
        for (name, dark) in &dark {
            let done = wait_recovered(&env, name, dark, policy_at).await;
            last.push((name.clone(), done.iter().map(|(_, d)| *d).max().unwrap()));
        }
        last
    });
    println!(
        "fleet drill: 20 clusters recovered, the last {:?} after the policy; per cluster: {recovered:?}",
        recovered.iter().map(|(_, d)| *d).max().unwrap()
    );
    // How often a healthy cluster's worker waited for a place that dark clusters held.
    let held_up = controller
        .log()
        .lines()
        .filter(|l| l.contains("Machine=fleet/lit-") && l.contains("(--max-worker-refreshes)"))
        .count();
    println!(
        "healthy clusters' manual refreshes (each cluster's slowest node): alone {before:?}; beside the drill {beside:?}; their workers queued for a fleet-wide place {held_up} times"
    );
    for (name, dark) in &dark {
        check_recovered(&env, name, dark, false, false).await;
    }
    // The healthy clusters' refreshes went through the API as usual.
    for name in &lit_names {
        for node in &env.cluster(name).nodes {
            let operation = env
                .machine_certificates(node)
                .await
                .and_then(|m| m.status?.operation)
                .unwrap();
            assert_eq!(operation.phase, Phase::Succeeded, "{}", node.machine);
            let transport = operation.transport.unwrap_or_default();
            assert!(transport.starts_with("port-forward to pod"), "{transport}");
        }
    }
    // At most one control plane per cluster at a time (their runs never overlap within a
    // cluster) was checked per cluster by check_recovered.
    drop(controller);
}
