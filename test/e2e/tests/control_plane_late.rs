//! The refresh trigger on a CK8sControlPlane when the CK8s control plane provider is installed
//! after ck8s-certs (`clusterctl init` installs all providers in one go, in no order we control):
//! the controller keeps looking for the kind, then watches it, and the annotation refreshes the
//! cluster's control planes one at a time, and nothing else.
//!
//! Its own environment: a management cluster without the CK8sControlPlane CRD at the start.

use std::time::Duration;

use ck8s_certs_api::annotations::{
    CERTIFICATES_EXPIRY, FLEET_REQUEST, REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS,
};
use ck8s_certs_api::capi::WATCH_FILTER_LABEL;
use ck8s_certs_api::certificate_refresh::{CertificateRefresh, RequestPhase};
use ck8s_certs_e2e::fixtures::{Role, control_plane_name, create_control_plane};
use ck8s_certs_e2e::sim::runs;
use ck8s_certs_e2e::{CONTROL_PLANE_CRD, EnvSpec, crds, shared_with};
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

/// The controller looks again after 10 s, 20 s, 40 s…: well inside this.
const TIMEOUT: Duration = Duration::from_secs(150);
const FILTER: &str = "late-cp";

fn spec() -> EnvSpec {
    let mut spec = EnvSpec::standard_of(&["alpha"]);
    spec.control_plane_crd = false;
    spec
}

#[tokio::test]
async fn a_control_plane_kind_installed_after_the_start_is_watched_and_its_trigger_works() {
    let env = shared_with(spec).await;
    let nodes = env.isolate_cluster("alpha", FILTER).await;
    let _controller = env.start_controller(FILTER, &[]);
    // Running (and not finding the kind) before the provider comes.
    for node in &nodes {
        env.wait_for_machine(node, TIMEOUT, |a| a.contains_key(CERTIFICATES_EXPIRY))
            .await;
    }

    // The provider arrives: its CRD, then the cluster's CK8sControlPlane.
    let management = env.management().await.unwrap();
    let crd_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    let crd = crds::read_dir(&crd_dir)
        .unwrap()
        .into_iter()
        .filter(|c| c.metadata.name.as_deref() == Some(CONTROL_PLANE_CRD))
        .collect();
    crds::install(&management, crd).await.unwrap();
    let cluster = env
        .cluster_api(management.clone(), "fleet")
        .get("alpha")
        .await
        .unwrap();
    let version = env.spec.capi_version.storage_version();
    create_control_plane(
        &management,
        &env.cluster("alpha").spec,
        version,
        cluster.uid().as_deref(),
    )
    .await
    .unwrap();
    let control_planes = env.control_plane_api(management.clone(), "fleet");
    let name = control_plane_name("alpha");
    control_planes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { WATCH_FILTER_LABEL: FILTER } } })),
        )
        .await
        .unwrap();

    control_planes
        .patch(
            &name,
            &PatchParams {
                field_manager: Some("kubectl-annotate".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({ "metadata": { "annotations": { REFRESH_CERTIFICATES: "1y" } } })),
        )
        .await
        .unwrap();
    let annotations = env
        .wait_for_annotations(&control_planes, &name, TIMEOUT, |a| {
            a.get(REFRESH_CERTIFICATES_STATUS).map(String::as_str) == Some("done")
        })
        .await;
    assert!(!annotations.contains_key(REFRESH_CERTIFICATES));
    let request = Api::<CertificateRefresh>::namespaced(management, "fleet")
        .get(&annotations[FLEET_REQUEST])
        .await
        .unwrap();
    assert_eq!(
        request.spec.target.control_plane.as_deref(),
        Some(name.as_str())
    );
    assert_eq!(request.owner_references()[0].kind, "CK8sControlPlane");
    let status = request.status.unwrap();
    assert_eq!(status.phase, Some(RequestPhase::Succeeded), "{status:#?}");
    assert_eq!(status.progress.as_deref(), Some("2/2"));
    for node in &nodes {
        let calls = env.sim.calls(&node.cluster, &node.node).await.unwrap();
        let expected = usize::from(node.role == Role::ControlPlane);
        assert_eq!(runs(&calls).len(), expected, "{}", node.machine);
    }
}
