//! Users other than the admin, for tests of who may do what: a ServiceAccount bound in its
//! namespace to a Role of given rules or to a ClusterRole, or cluster-wide to rules of its own,
//! and a client that authenticates as it (a bound token, as `kubectl` with that account's token
//! would). In the management cluster ([`Environment::user`]) or a workload cluster
//! ([`WorkloadCluster::user`]: a tenant).

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;

use crate::{Environment, WorkloadCluster};

/// What a user is granted in its namespace.
pub enum Grant<'a> {
    /// A Role of these rules (JSON, as in a Role's `rules`).
    Rules(serde_json::Value),
    /// The ClusterRole of this name, bound in the namespace.
    ClusterRole(&'a str),
    /// A ClusterRole of these rules, bound cluster-wide (for cluster-scoped objects).
    ClusterRules(serde_json::Value),
}

impl Environment {
    /// ServiceAccount `name` of `namespace` in the management cluster with `grant`, and a client
    /// that authenticates as it; with its username.
    pub async fn user(&self, namespace: &str, name: &str, grant: Grant<'_>) -> (Client, String) {
        let admin = self.management().await.expect("client");
        service_account(
            admin,
            &self.management_kubeconfig_yaml,
            namespace,
            name,
            grant,
        )
        .await
    }
}

impl WorkloadCluster {
    /// ServiceAccount `name` of `namespace` in this workload cluster with `grant`, and a
    /// client that authenticates as it; with its username.
    pub async fn user(&self, namespace: &str, name: &str, grant: Grant<'_>) -> (Client, String) {
        let admin = self.client().await.expect("client");
        service_account(admin, &self.kubeconfig_yaml, namespace, name, grant).await
    }
}

async fn service_account(
    admin: Client,
    kubeconfig_yaml: &str,
    namespace: &str,
    name: &str,
    grant: Grant<'_>,
) -> (Client, String) {
    let post = PostParams::default();
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let account: ServiceAccount =
        serde_json::from_value(json!({ "metadata": { "name": name } })).expect("an account");
    accounts
        .create(&post, &account)
        .await
        .expect("create the ServiceAccount");
    let role = |kind: &str, role: &str| json!({ "apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role });
    let subjects = json!([{ "kind": "ServiceAccount", "name": name, "namespace": namespace }]);
    let rules_named = |rules| json!({ "metadata": { "name": name }, "rules": rules });
    let binding = json!({ "metadata": { "name": name }, "subjects": subjects });
    let with_role = |role_ref| {
        let mut binding = binding.clone();
        binding["roleRef"] = role_ref;
        binding
    };
    match grant {
        Grant::Rules(rules) => {
            let created: Role = serde_json::from_value(rules_named(rules)).expect("a Role");
            Api::<Role>::namespaced(admin.clone(), namespace)
                .create(&post, &created)
                .await
                .expect("create the Role");
            let binding: RoleBinding =
                serde_json::from_value(with_role(role("Role", name))).expect("a RoleBinding");
            Api::<RoleBinding>::namespaced(admin, namespace)
                .create(&post, &binding)
                .await
                .expect("create the RoleBinding");
        }
        Grant::ClusterRole(cluster_role) => {
            let binding: RoleBinding =
                serde_json::from_value(with_role(role("ClusterRole", cluster_role)))
                    .expect("a RoleBinding");
            Api::<RoleBinding>::namespaced(admin, namespace)
                .create(&post, &binding)
                .await
                .expect("create the RoleBinding");
        }
        Grant::ClusterRules(rules) => {
            let created: ClusterRole =
                serde_json::from_value(rules_named(rules)).expect("a ClusterRole");
            Api::<ClusterRole>::all(admin.clone())
                .create(&post, &created)
                .await
                .expect("create the ClusterRole");
            let binding: ClusterRoleBinding =
                serde_json::from_value(with_role(role("ClusterRole", name)))
                    .expect("a ClusterRoleBinding");
            Api::<ClusterRoleBinding>::all(admin)
                .create(&post, &binding)
                .await
                .expect("create the ClusterRoleBinding");
        }
    }
    let config = kubeconfig_of(&accounts, kubeconfig_yaml, name).await;
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default())
        .await
        .expect("a client configuration");
    (
        Client::try_from(config).expect("a client"),
        format!("system:serviceaccount:{namespace}:{name}"),
    )
}

/// The message of a write the API server refused as forbidden (403: an admission policy or
/// RBAC); panics if it was not refused so.
pub fn refused(result: Result<impl std::fmt::Debug, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{status:?}");
            status.message
        }
        other => panic!("not refused: {other:?}"),
    }
}

/// `kubeconfig_yaml` (the admin's) authenticating as ServiceAccount `name` of `accounts` instead
/// (a bound token of an hour).
pub async fn kubeconfig_of(
    accounts: &Api<ServiceAccount>,
    kubeconfig_yaml: &str,
    name: &str,
) -> kube::config::Kubeconfig {
    let request: TokenRequest =
        serde_json::from_value(json!({ "spec": { "expirationSeconds": 3600, "audiences": [] } }))
            .expect("a TokenRequest");
    let token = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .expect("a token")
        .status
        .expect("a token's status")
        .token;
    let mut config = kube::config::Kubeconfig::from_yaml(kubeconfig_yaml).expect("the kubeconfig");
    for user in &mut config.auth_infos {
        if let Some(auth) = user.auth_info.as_mut() {
            auth.token = Some(token.clone().into());
            auth.client_certificate_data = None;
            auth.client_key_data = None;
        }
    }
    config
}
