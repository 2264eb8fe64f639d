//! A fleet refresh beside the CK8s bootstrap provider (design.md section 8): a fleet request
//! hands each Machine the same trigger annotation a user writes, so our admission webhook must
//! mark it `in-progress` in that very write, and the provider's CertificatesReconciler (modelled
//! by `test/bootstrapdouble`) must stand aside for every Machine of the cluster. Exactly one
//! `run` per node, ours.
//!
//! Its own environment (one cluster): the webhook configuration is one per management cluster,
//! and `coexistence.rs` takes it down on purpose. The double watches `cluster.x-k8s.io/v1beta1`
//! Machines, so it runs against the v1.10 CRDs only; the webhook part runs on every release.

use std::time::Duration;

use ck8s_certs_api::annotations::{
    CERTIFICATES_EXPIRY, FLEET_REQUEST, REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS,
};
use ck8s_certs_api::certificate_refresh::{CertificateRefresh, RequestPhase};
use ck8s_certs_e2e::shared_of;
use ck8s_certs_e2e::sim::answered_runs;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(180);
const FILTER: &str = "coexist-fleet";

#[tokio::test]
async fn a_fleet_refresh_beside_the_bootstrap_provider_is_carried_out_by_us_alone() {
    let env = shared_of(&["alpha"]).await;
    let nodes = env.isolate_cluster("alpha", FILTER).await;
    let _controller = env.start_controller_with_webhook(FILTER, &[]).await;
    // Our expiry first, so the double (which writes a missing one itself) has nothing to write.
    for node in &nodes {
        env.wait_for_machine(node, TIMEOUT, |a| a.contains_key(CERTIFICATES_EXPIRY))
            .await;
    }
    let double = match env.spec.capi_version.storage_version() {
        "v1beta1" => Some(env.start_bootstrap_double(FILTER).await),
        _ => None,
    };

    let management = env.management().await.unwrap();
    let clusters = env.cluster_api(management.clone(), "fleet");
    clusters
        .patch(
            "alpha",
            &PatchParams {
                field_manager: Some("kubectl-annotate".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({ "metadata": { "annotations": { REFRESH_CERTIFICATES: "1y" } } })),
        )
        .await
        .unwrap();
    let annotations = env
        .wait_for_annotations(&clusters, "alpha", TIMEOUT, |a| {
            a.get(REFRESH_CERTIFICATES_STATUS).map(String::as_str) == Some("done")
        })
        .await;
    let name = &annotations[FLEET_REQUEST];
    let request = Api::<CertificateRefresh>::namespaced(management, "fleet")
        .get(name)
        .await
        .unwrap();
    let status = request.status.unwrap();
    assert_eq!(status.phase, Some(RequestPhase::Succeeded), "{status:#?}");
    assert_eq!(status.progress.as_deref(), Some("4/4"));

    for node in &nodes {
        let op = env.operation(node).await;
        assert_eq!(op.fleet.as_deref(), Some(name.as_str()), "{op:#?}");
        // Named by the webhook: the trigger the fleet wrote and `in-progress` came in one write.
        assert!(op.request.is_some(), "{}: {op:#?}", node.machine);
        let ran = answered_runs(&env.sim.calls(&node.cluster, &node.node).await.unwrap());
        assert_eq!(ran, [op.seed.unwrap()], "{}: one run, ours", node.machine);
    }
    if let Some(double) = &double {
        // Give its informer time to see the final state too.
        tokio::time::sleep(Duration::from_secs(2)).await;
        for node in &nodes {
            let records = double.records_for(node);
            assert!(double.skipped(node), "{}: {records:#?}", node.machine);
            assert!(!double.started_refresh(node), "{records:#?}");
            assert!(!double.wrote(node), "{records:#?}");
        }
    }
}
