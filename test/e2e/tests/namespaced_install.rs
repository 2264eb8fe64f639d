//! The namespaced install (`config/namespaced`, issue 36): the controller's rights over Machines,
//! Clusters, Secrets, requests and its records are a Role in the one namespace it handles; its
//! ClusterRole keeps only what is cluster-scoped. The controller runs with exactly the rendered
//! rules under a ServiceAccount of its own, refreshes a worker of that namespace (its approver
//! found, its CSRs verified), and may read no Secret of another namespace.

use std::time::Duration;

use ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS;
use ck8s_certs_e2e::controller::{NAMESPACE, SERVICE_ACCOUNT};
use ck8s_certs_e2e::shared_of;
use ck8s_certs_e2e::users::{Grant, kubeconfig_of};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

const FILTER: &str = "namespaced";
const ACCOUNT: &str = "ck8s-certs-namespaced";
const TIMEOUT: Duration = Duration::from_secs(90);

/// The rules of the object `kind`/`name` that `kubectl kustomize config/namespaced` renders.
fn rendered_rules(kind: &str, name: &str) -> serde_json::Value {
    let kubectl = ck8s_certs_e2e::tool("CK8S_E2E_KUBECTL", "kubectl", "KUBE_VERSION");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = std::process::Command::new(kubectl)
        .arg("kustomize")
        .arg(root.join("config/namespaced"))
        .output()
        .expect("kubectl kustomize");
    assert!(
        output.status.success(),
        "kubectl kustomize config/namespaced"
    );
    let text = String::from_utf8(output.stdout).expect("UTF-8");
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("YAML"))
        .find(|object: &serde_json::Value| {
            object["kind"] == kind && object["metadata"]["name"] == name
        })
        .unwrap_or_else(|| panic!("config/namespaced renders no {kind} {name}"))["rules"]
        .clone()
}

#[tokio::test]
async fn a_controller_with_the_namespaced_rights_refreshes_its_namespace_and_reads_no_other() {
    let env = shared_of(&["beta", "gamma"]).await;
    let [worker] = env.isolated("beta", ["beta-md-0-w1"], FILTER).await;
    assert_eq!(worker.namespace, "fleet", "the overlay's namespace");
    let admin = env.management().await.unwrap();
    let post = PostParams::default();

    // Its own ServiceAccount with the overlay's narrow ClusterRole...
    let (as_controller, _) = env
        .user(
            NAMESPACE,
            ACCOUNT,
            Grant::ClusterRules(rendered_rules("ClusterRole", "ck8s-certs-manager-role")),
        )
        .await;
    // ...its Role in the namespace it handles...
    let role: Role = serde_json::from_value(json!({
        "metadata": { "name": ACCOUNT, "namespace": "fleet" },
        "rules": rendered_rules("Role", "ck8s-certs-manager-role"),
    }))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), "fleet")
        .create(&post, &role)
        .await
        .unwrap();
    let bind = |namespace: &str, role: &str| -> RoleBinding {
        serde_json::from_value(json!({
            "metadata": { "name": format!("{ACCOUNT}-{role}"), "namespace": namespace },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role },
            "subjects": [{ "kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE }],
        }))
        .unwrap()
    };
    Api::<RoleBinding>::namespaced(admin.clone(), "fleet")
        .create(&post, &bind("fleet", ACCOUNT))
        .await
        .unwrap();
    // ...and the leader-election and webhook Roles of its own namespace, as installed.
    for suffix in ["leader-election", "webhook"] {
        Api::<RoleBinding>::namespaced(admin.clone(), NAMESPACE)
            .create(
                &post,
                &bind(NAMESPACE, &format!("{SERVICE_ACCOUNT}-{suffix}")),
            )
            .await
            .unwrap();
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), NAMESPACE);
    let mut kubeconfig = kubeconfig_of(&accounts, &env.management_kubeconfig_yaml, ACCOUNT).await;
    // Its own namespace (its Lease, the webhook's Secret), as in a pod.
    for context in &mut kubeconfig.contexts {
        if let Some(context) = context.context.as_mut() {
            context.namespace = Some(NAMESPACE.into());
        }
    }
    let path = env.dir.join("namespaced-controller.kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&kubeconfig).unwrap()).unwrap();

    // Another namespace's Secrets are out of its reach.
    match Api::<Secret>::namespaced(as_controller, "edge")
        .get("gamma-kubeconfig")
        .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("read another namespace's kubeconfig: {other:?}"),
    }

    let controller = env.start_controller_as(&path, FILTER, &["--namespace=fleet"]);
    env.annotate_refresh(&worker, "1y").await;
    let annotations = env.wait_for_refresh(&worker, TIMEOUT).await;
    assert_eq!(
        annotations[REFRESH_CERTIFICATES_STATUS],
        "done",
        "{}",
        controller.log()
    );
    // Refusals, not any "403" (a random port such as 41403 is logged).
    let log = controller.log();
    let refused = ["code: 403", "403 Forbidden", "forbidden", "Forbidden"];
    assert!(!refused.iter().any(|r| log.contains(r)), "{log}");
}
