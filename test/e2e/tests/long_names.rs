//! Machine names of every valid length. Cluster API Machine names are often long (cluster,
//! deployment and hashes); the label that selects a Machine's refresh records must be valid for
//! any of them, and siblings whose names share the first 63 characters must keep their own
//! records. Here two workers of one MachineDeployment are named with 70 characters, the 63rd a
//! `-` (a label value cut there is invalid, and the two would share it).

use std::time::Duration;

use ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS;
use ck8s_certs_api::certificate_refresh::{CertificateRefresh, labels};
use ck8s_certs_e2e::fixtures::{NodeInfo, Role};
use ck8s_certs_e2e::sim::runs;
use ck8s_certs_e2e::{EnvSpec, Environment, shared_with};
use kube::Api;
use kube::api::ListParams;

const TIMEOUT: Duration = Duration::from_secs(120);
const FILTER: &str = "long-names";
/// 62 characters: the workers are `<prefix>-md-0-w0` and `…-w1`, 70 characters, `-` at 63.
const PREFIX: &str = "edge-eu-west.site-0042.production.ck8s.example.pool-a1b2c3d4e5";

fn spec() -> EnvSpec {
    let mut spec = EnvSpec::standard_of(&["alpha"]);
    for cluster in &mut spec.clusters {
        cluster.machine_prefix = PREFIX.into();
    }
    spec
}

/// The Machine's records, selected as the controller and `kubectl ck8s-certs history` select
/// them (the label), checked against their target.
async fn records(env: &Environment, node: &NodeInfo) -> Vec<CertificateRefresh> {
    let api: Api<CertificateRefresh> =
        Api::namespaced(env.management().await.unwrap(), &node.namespace);
    let selector = format!("{}={}", labels::MACHINE, labels::value(&node.machine));
    let listed = api
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items;
    for record in &listed {
        assert_eq!(
            record.spec.target.machine.as_deref(),
            Some(node.machine.as_str()),
            "a record selected for {} targets another Machine",
            node.machine
        );
    }
    listed
}

#[tokio::test]
async fn a_machine_named_past_63_characters_is_refreshed_again_and_again_beside_its_sibling() {
    let env = shared_with(spec).await;
    let workers: Vec<NodeInfo> = env
        .cluster("alpha")
        .nodes
        .iter()
        .filter(|n| n.role == Role::Worker)
        .take(2)
        .cloned()
        .collect();
    let [first, sibling] = [&workers[0], &workers[1]];
    for node in [first, sibling] {
        assert_eq!(node.machine.len(), 70, "{}", node.machine);
        assert_eq!(node.machine.as_bytes()[62], b'-', "{}", node.machine);
        env.isolate(node, FILTER).await;
        env.sim.clear_calls("alpha", &node.node).await.unwrap();
    }
    let _controller = env.start_controller(FILTER, &["--refresh-history", "2"]);

    env.annotate_refresh(sibling, "1y").await;
    let annotations = env.wait_for_refresh(sibling, TIMEOUT).await;
    assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "done");

    for round in 1..=3 {
        env.annotate_refresh(first, "1y").await;
        let annotations = env.wait_for_refresh(first, TIMEOUT).await;
        assert_eq!(
            annotations[REFRESH_CERTIFICATES_STATUS], "done",
            "refresh {round}: {annotations:#?}"
        );
        let calls = env.sim.calls("alpha", &first.node).await.unwrap();
        assert_eq!(runs(&calls).len(), round, "one run per refresh");
    }

    // The first keeps its newest two records (pruning runs after the Machine shows the outcome);
    // the sibling, whose name shares 68 characters, keeps its own.
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let kept = records(&env, first).await.len();
        if kept == 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{kept} records kept of {}",
            first.machine
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(records(&env, sibling).await.len(), 1);
    let sibling_calls = env.sim.calls("alpha", &sibling.node).await.unwrap();
    assert_eq!(runs(&sibling_calls).len(), 1);
}
