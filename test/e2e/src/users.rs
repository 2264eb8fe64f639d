//! Users of the management cluster other than the admin, for tests of who may do what: a
//! ServiceAccount bound in its namespace to a Role of given rules or to a ClusterRole, and a
//! client that authenticates as it (a bound token, as `kubectl` with that account's token would).

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;

use crate::Environment;

/// What a user is granted in its namespace.
pub enum Grant<'a> {
    /// A Role of these rules (JSON, as in a Role's `rules`).
    Rules(serde_json::Value),
    /// The ClusterRole of this name, bound in the namespace.
    ClusterRole(&'a str),
}

impl Environment {
    /// ServiceAccount `name` of `namespace` with `grant` there, and a client that authenticates
    /// as it; with its username.
    pub async fn user(&self, namespace: &str, name: &str, grant: Grant<'_>) -> (Client, String) {
        let admin = self.management().await.expect("client");
        let post = PostParams::default();
        let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
        let account: ServiceAccount =
            serde_json::from_value(json!({ "metadata": { "name": name } })).expect("an account");
        accounts
            .create(&post, &account)
            .await
            .expect("create the ServiceAccount");
        let role_ref = match grant {
            Grant::Rules(rules) => {
                let role: Role =
                    serde_json::from_value(json!({ "metadata": { "name": name }, "rules": rules }))
                        .expect("a Role");
                Api::<Role>::namespaced(admin.clone(), namespace)
                    .create(&post, &role)
                    .await
                    .expect("create the Role");
                json!({ "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name })
            }
            Grant::ClusterRole(role) => {
                json!({ "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role })
            }
        };
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": { "name": name },
            "roleRef": role_ref,
            "subjects": [{ "kind": "ServiceAccount", "name": name, "namespace": namespace }]
        }))
        .expect("a RoleBinding");
        Api::<RoleBinding>::namespaced(admin, namespace)
            .create(&post, &binding)
            .await
            .expect("create the RoleBinding");
        let request: TokenRequest = serde_json::from_value(
            json!({ "spec": { "expirationSeconds": 3600, "audiences": [] } }),
        )
        .expect("a TokenRequest");
        let token = accounts
            .create_token_request(name, &post, &request)
            .await
            .expect("a token")
            .status
            .expect("a token's status")
            .token;
        let mut config = kube::config::Kubeconfig::from_yaml(&self.management_kubeconfig_yaml)
            .expect("the management kubeconfig");
        for user in &mut config.auth_infos {
            if let Some(auth) = user.auth_info.as_mut() {
                auth.token = Some(token.clone().into());
                auth.client_certificate_data = None;
                auth.client_key_data = None;
            }
        }
        let config = kube::Config::from_custom_kubeconfig(config, &Default::default())
            .await
            .expect("a client configuration");
        (
            Client::try_from(config).expect("a client"),
            format!("system:serviceaccount:{namespace}:{name}"),
        )
    }
}
