//! The refresh-trigger admission webhook in the test environment: `config/webhook`'s
//! MutatingWebhookConfiguration as shipped, but for how the API server reaches the controller (a
//! loopback URL instead of the Service, which has no pods here) and an objectSelector on the
//! watch filter, so that only the test's Machines depend on it.
//!
//! The configuration's name is the one `config/rbac` lets the controller patch, so one test
//! binary uses one webhook-serving controller at a time.

use std::path::Path;
use std::time::{Duration, Instant};

use ck8s_certs_api::capi::WATCH_FILTER_LABEL;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

use crate::controller::Controller;
use crate::{Environment, controlplane};

/// The configuration's name (`config/default` prefixes `refresh-trigger`).
pub const CONFIGURATION: &str = "ck8s-certs-refresh-trigger";

impl Environment {
    /// Installs the webhook configuration for Machines labelled with `filter` and starts the
    /// controller serving it; returns once the controller has put its CA into the
    /// configuration (before that, the API server cannot call it and refuses new triggers).
    pub async fn start_controller_with_webhook(&self, filter: &str, extra: &[&str]) -> Controller {
        self.start_webhook_controller(filter, extra, false).await
    }

    /// [`start_controller_with_webhook`](Self::start_controller_with_webhook), with the entry
    /// that names the requester of every new CertificateRefresh (of any filter: one test at a
    /// time).
    pub async fn start_controller_with_request_webhook(
        &self,
        filter: &str,
        extra: &[&str],
    ) -> Controller {
        self.start_webhook_controller(filter, extra, true).await
    }

    async fn start_webhook_controller(
        &self,
        filter: &str,
        extra: &[&str],
        requests: bool,
    ) -> Controller {
        let port = controlplane::free_port().expect("free port");
        self.install_webhooks(Some(filter), port, requests).await;
        let address = format!("--webhook-bind-address=127.0.0.1:{port}");
        let mut args = vec![
            "--webhook=true",
            address.as_str(),
            "--webhook-hosts=127.0.0.1",
        ];
        args.extend_from_slice(extra);
        let controller = self.start_controller(filter, &args);
        self.wait_for_ca_bundle(Duration::from_secs(60)).await;
        controller
    }

    /// (Re)creates the configuration, calling `https://127.0.0.1:<port>/<path>`, for the
    /// Machines labelled with `filter` (every Machine when `None`). The entry that names the
    /// requester of new CertificateRefreshes (which carry no watch-filter label) is installed
    /// only without a filter, or by
    /// [`start_controller_with_request_webhook`](Self::start_controller_with_request_webhook).
    pub async fn install_webhook_configuration(&self, filter: Option<&str>, port: u16) {
        self.install_webhooks(filter, port, filter.is_none()).await
    }

    async fn install_webhooks(&self, filter: Option<&str>, port: u16, requests: bool) {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/webhook/manifests.yaml");
        let text = std::fs::read_to_string(&path).expect("config/webhook/manifests.yaml");
        let mut shipped: serde_json::Value = serde_yaml::from_str(&text).expect("YAML");
        shipped["metadata"]["name"] = json!(CONFIGURATION);
        let webhooks = shipped["webhooks"].as_array_mut().expect("webhooks");
        webhooks.retain(|w| {
            requests || w["clientConfig"]["service"]["path"] != "/mutate-certificaterefresh"
        });
        for webhook in webhooks.iter_mut() {
            let route = webhook["clientConfig"]["service"]["path"]
                .as_str()
                .expect("a service path")
                .to_owned();
            webhook["clientConfig"] = json!({ "url": format!("https://127.0.0.1:{port}{route}") });
            // The trigger entries see only objects labelled for this controller (as
            // `isolate_cluster` labels a Cluster and its MachineDeployment and control plane).
            let triggers = route != "/mutate-certificaterefresh";
            if let (Some(filter), true) = (filter, triggers) {
                webhook["objectSelector"] =
                    json!({ "matchLabels": { WATCH_FILTER_LABEL: filter } });
            }
        }
        let configuration: MutatingWebhookConfiguration =
            serde_json::from_value(shipped).expect("a MutatingWebhookConfiguration");
        let api: Api<MutatingWebhookConfiguration> =
            Api::all(self.management().await.expect("client"));
        let _ = api.delete(CONFIGURATION, &DeleteParams::default()).await;
        api.create(&PostParams::default(), &configuration)
            .await
            .expect("create the MutatingWebhookConfiguration");
    }

    /// Waits until every webhook of the configuration has a caBundle.
    pub async fn wait_for_ca_bundle(&self, timeout: Duration) {
        let api: Api<MutatingWebhookConfiguration> =
            Api::all(self.management().await.expect("client"));
        let start = Instant::now();
        loop {
            let set = api
                .get_opt(CONFIGURATION)
                .await
                .ok()
                .flatten()
                .is_some_and(|c| {
                    c.webhooks.unwrap_or_default().iter().all(|w| {
                        w.client_config
                            .ca_bundle
                            .as_ref()
                            .is_some_and(|b| !b.0.is_empty())
                    })
                });
            if set {
                return;
            }
            assert!(
                start.elapsed() < timeout,
                "the controller never set the webhook's caBundle"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Waits until admission policies created now count as in force for the controller (its
/// `SETTLE` after their creation, in whole seconds): what is written after this was checked.
pub async fn admission_settled() {
    let settle = ck8s_certs::controllers::admission_policy::SETTLE.unsigned_abs();
    tokio::time::sleep(settle + Duration::from_secs(1)).await;
}

impl Environment {
    /// Installs the provider's admission policies (`config/policy`, as kustomize renders them;
    /// the API server enforces them itself) and returns each object's API and name, to delete
    /// them again where other tests share the environment.
    pub async fn install_admission_policies(&self) -> Vec<(Api<kube::api::DynamicObject>, String)> {
        let client = self.management().await.expect("client");
        let kubectl = crate::tool("CK8S_E2E_KUBECTL", "kubectl", "KUBE_VERSION");
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let rendered = std::process::Command::new(kubectl)
            .arg("kustomize")
            .arg(root.join("config/policy"))
            .output()
            .expect("kubectl kustomize");
        assert!(rendered.status.success(), "{rendered:?}");
        let objects = crate::manifests::parse(&String::from_utf8_lossy(&rendered.stdout))
            .expect("config/policy renders");
        let installed = create_cluster_objects(&client, objects).await;
        admission_settled().await;
        installed
    }

    /// `config/kubeconfig-renewal`'s role (bound to the test controller's service account) and
    /// admission policy: what `--renew-management-kubeconfig=on` is installed with.
    pub async fn install_kubeconfig_renewal(&self) {
        let client = self.management().await.expect("client");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/kubeconfig-renewal");
        let mut objects = Vec::new();
        for file in ["role.yaml", "policy.yaml"] {
            let text = std::fs::read_to_string(dir.join(file)).expect("config/kubeconfig-renewal");
            objects
                .extend(crate::manifests::parse(&text).expect("config/kubeconfig-renewal parses"));
        }
        for object in &mut objects {
            if let Some(subjects) = object.data.get_mut("subjects") {
                subjects[0]["namespace"] = crate::controller::NAMESPACE.into();
            }
        }
        create_cluster_objects(&client, objects).await;
        // The API server's policy informer sees them within a moment.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Creates cluster-scoped `objects`; returns each one's API and name.
async fn create_cluster_objects(
    client: &kube::Client,
    objects: Vec<kube::api::DynamicObject>,
) -> Vec<(Api<kube::api::DynamicObject>, String)> {
    let mut installed = Vec::new();
    for object in objects {
        let types = object.types.clone().expect("typed objects");
        let (group, version) = types.api_version.split_once('/').expect("a group");
        let resource = kube::api::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
            group,
            version,
            &types.kind,
        ));
        let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
        match api.create(&PostParams::default(), &object).await {
            // Installed already by another test of the same environment.
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            other => {
                other.expect("create a cluster-scoped object");
            }
        }
        installed.push((api, object.metadata.name.clone().unwrap_or_default()));
    }
    installed
}
