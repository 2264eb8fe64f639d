//! Beside the CK8s bootstrap provider, whose CertificatesReconciler reacts to the same trigger
//! (design.md section 8; modelled by `test/bootstrapdouble`): our admission webhook marks a new
//! request `in-progress` in the very write that sets the trigger, so that reconciler stands aside
//! and exactly one controller — ours — refreshes each node. With ours down, the trigger is
//! refused, and nothing is refreshed at all.
//!
//! The double watches `cluster.x-k8s.io/v1beta1` Machines like the provider; with the CRDs of a
//! Cluster API release that stores v1beta2 (and has no conversion webhook here), it runs only
//! against the v1.10 CRDs. The webhook part runs against every release.

use std::time::Duration;

use ck8s_certs::k8sd::wire::path;
use ck8s_certs_api::annotations::{
    CERTIFICATES_EXPIRY, REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS, REFRESH_REQUEST,
};
use ck8s_certs_e2e::fixtures::NodeInfo;
use ck8s_certs_e2e::sim;
use ck8s_certs_e2e::{Environment, shared_of};
use kube::api::{Patch, PatchParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(120);
const FILTER: &str = "coexist";

/// `kubectl annotate`: the Machine as the write left it, or the API server's refusal.
async fn annotate(
    env: &Environment,
    node: &NodeInfo,
    ttl: &str,
) -> Result<std::collections::BTreeMap<String, String>, kube::Error> {
    let api = env.machine_api(env.management().await.unwrap(), &node.namespace);
    let patch = json!({ "metadata": { "annotations": { REFRESH_CERTIFICATES: ttl } } });
    let params = PatchParams {
        field_manager: Some("kubectl-annotate".into()),
        ..Default::default()
    };
    api.patch(&node.machine, &params, &Patch::Merge(&patch))
        .await
        .map(|m| m.metadata.annotations.unwrap_or_default())
}

/// Answered `run`s of `node` so far.
async fn answered_runs(env: &Environment, node: &NodeInfo) -> Vec<i64> {
    sim::answered_runs(&env.sim.calls(&node.cluster, &node.node).await.unwrap())
}

#[tokio::test]
async fn beside_the_bootstrap_provider_exactly_one_controller_refreshes_and_without_ours_nothing_does()
 {
    let env = shared_of(&["alpha"]).await;
    let nodes = env
        .isolated("alpha", ["alpha-cp-0", "alpha-md-0-w0"], FILTER)
        .await;
    let controller = env.start_controller_with_webhook(FILTER, &[]).await;
    // Our expiry first, so the double (which writes a missing one itself) has nothing to write.
    for node in &nodes {
        env.wait_for_machine(node, TIMEOUT, |a| a.contains_key(CERTIFICATES_EXPIRY))
            .await;
    }
    let with_double = env.spec.capi_version.storage_version() == "v1beta1";
    let double = match with_double {
        true => Some(env.start_bootstrap_double(FILTER).await),
        false => None,
    };

    for node in &nodes {
        let written = annotate(&env, node, "1y")
            .await
            .expect("the trigger is accepted");
        assert_eq!(
            written.get(REFRESH_CERTIFICATES_STATUS).map(String::as_str),
            Some("in-progress"),
            "{}: in-progress in the same write as the trigger: {written:#?}",
            node.machine
        );
        assert!(written.contains_key(REFRESH_REQUEST), "{written:#?}");
        let annotations = env.wait_for_refresh(node, TIMEOUT).await;
        assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "done");
        let op = env.operation(node).await;
        assert_eq!(
            op.request.as_deref(),
            written.get(REFRESH_REQUEST).map(String::as_str)
        );
        let ran = answered_runs(&env, node).await;
        assert_eq!(ran, [op.seed.unwrap()], "{}: one run, ours", node.machine);
    }
    if let Some(double) = &double {
        // Give its informer time to see the final state too.
        tokio::time::sleep(Duration::from_secs(2)).await;
        for node in &nodes {
            assert!(
                double.skipped(node),
                "{}: {:#?}",
                node.machine,
                double.records_for(node)
            );
            assert!(
                !double.started_refresh(node),
                "{:#?}",
                double.records_for(node)
            );
            assert!(!double.wrote(node), "{:#?}", double.records_for(node));
        }
        let calls = env.sim.calls("alpha", &nodes[0].node).await.unwrap();
        println!(
            "beside the double: {} plan(s) on the control plane, the double recorded {:?}",
            calls.iter().filter(|c| c.path == path::PLAN).count(),
            double
                .records_for(&nodes[0])
                .iter()
                .map(|r| format!("{}:{}", r.step, r.outcome))
                .collect::<Vec<_>>()
        );
    }

    // Ours down: a new trigger is refused, with a message naming the webhook.
    controller.crash();
    let before: Vec<Vec<i64>> = {
        let mut out = Vec::new();
        for node in &nodes {
            out.push(answered_runs(&env, node).await);
        }
        out
    };
    let refused = annotate(&env, &nodes[0], "2y")
        .await
        .expect_err("refused while no replica serves the webhook");
    let message = refused.to_string();
    assert!(
        message.contains("refresh-trigger.certificates.ck8s.io"),
        "{message}"
    );
    println!("with ours down the trigger is refused: {message}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let annotations = env.machine_annotations(&nodes[0]).await;
    assert!(
        !annotations.contains_key(REFRESH_CERTIFICATES),
        "{annotations:#?}"
    );
    for (node, before) in nodes.iter().zip(&before) {
        assert_eq!(
            &answered_runs(&env, node).await,
            before,
            "nothing refreshed"
        );
    }
    if let Some(double) = &double {
        for node in &nodes {
            assert!(
                !double.started_refresh(node),
                "{:#?}",
                double.records_for(node)
            );
        }
    }

    // Back up: the same TTL as before is a new request (its own name), refreshed once more.
    let _controller = env.start_controller_with_webhook(FILTER, &[]).await;
    let written = annotate(&env, &nodes[0], "1y")
        .await
        .expect("accepted again");
    assert_eq!(written[REFRESH_CERTIFICATES_STATUS], "in-progress");
    let annotations = env.wait_for_refresh(&nodes[0], TIMEOUT).await;
    assert_eq!(annotations[REFRESH_CERTIFICATES_STATUS], "done");
    assert_eq!(
        answered_runs(&env, &nodes[0]).await.len(),
        before[0].len() + 1
    );
}
