//! Running the controller under test against the environment, with exactly the rights of
//! `config/rbac` (a ServiceAccount token, not the admin), and helpers to drive Machines the way
//! users do (`kubectl annotate`).
//!
//! Tests isolate with Cluster API's own mechanism: each labels its Machines with
//! `cluster.x-k8s.io/watch-filter=<test>` and runs a controller with `--watch-filter=<test>`, so
//! several controllers share the environment without touching each other's Machines.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ck8s_certs_api::capi::WATCH_FILTER_LABEL;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::fixtures::{NodeInfo, ensure_namespace};
use crate::process::Process;
use crate::{Binaries, Environment, Error, controlplane};

pub const NAMESPACE: &str = "ck8s-certs-system";
pub const SERVICE_ACCOUNT: &str = "ck8s-certs-manager";
/// The webhook's Secret as the components ship it (empty; the controller fills it).
pub const WEBHOOK_SECRET: &str = "ck8s-certs-webhook-cert";
/// The FlowSchema of `config/flowcontrol` as `config/default` names it.
pub const FLOW_SCHEMA: &str = "ck8s-certs-leader-election";

/// Creates the controller's ServiceAccount with the ClusterRole of `config/rbac/role.yaml` and
/// the leader election and webhook Roles of `config/rbac` (in the ServiceAccount's namespace, as
/// in a cluster), and returns a kubeconfig for it whose context namespace is that
/// namespace, like an in-cluster configuration.
pub async fn service_account_kubeconfig(
    mgmt: &Client,
    server_port: u16,
    ca_pem: &str,
    dir: &Path,
) -> Result<(PathBuf, String), Error> {
    let mut role: ClusterRole = rbac_file("role.yaml")?;
    role.metadata.name = Some(SERVICE_ACCOUNT.into());
    ensure_namespace(mgmt, NAMESPACE).await?;
    let pp = PostParams::default();
    Api::<ClusterRole>::all(mgmt.clone())
        .create(&pp, &role)
        .await
        .map_err(Error::Kube)?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": { "name": SERVICE_ACCOUNT },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": SERVICE_ACCOUNT },
        "subjects": [{ "kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE }]
    }))
    .map_err(|e| Error::Setup(e.to_string()))?;
    Api::<ClusterRoleBinding>::all(mgmt.clone())
        .create(&pp, &binding)
        .await
        .map_err(Error::Kube)?;
    // The namespaced Roles of config/rbac, bound in the ServiceAccount's namespace.
    for (file, suffix) in [
        ("leader_election_role.yaml", "leader-election"),
        ("webhook_role.yaml", "webhook"),
    ] {
        let name = format!("{SERVICE_ACCOUNT}-{suffix}");
        let mut role: Role = rbac_file(file)?;
        role.metadata.name = Some(name.clone());
        role.metadata.namespace = Some(NAMESPACE.into());
        Api::<Role>::namespaced(mgmt.clone(), NAMESPACE)
            .create(&pp, &role)
            .await
            .map_err(Error::Kube)?;
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": { "name": name },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
            "subjects": [{ "kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE }]
        }))
        .map_err(|e| Error::Setup(e.to_string()))?;
        Api::<RoleBinding>::namespaced(mgmt.clone(), NAMESPACE)
            .create(&pp, &binding)
            .await
            .map_err(Error::Kube)?;
    }
    // The webhook's Secret, shipped empty (config/webhook/secret.yaml): the controller may
    // update it, not create it.
    let mut secret: k8s_openapi::api::core::v1::Secret = config_file("webhook/secret.yaml")?;
    secret.metadata.name = Some(WEBHOOK_SECRET.into());
    secret.metadata.namespace = Some(NAMESPACE.into());
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(mgmt.clone(), NAMESPACE)
        .create(&pp, &secret)
        .await
        .map_err(Error::Kube)?;
    // The FlowSchema of config/flowcontrol, which names the ServiceAccount as installed.
    let mut schema: DynamicObject = config_file("flowcontrol/flowschema.yaml")?;
    schema.metadata.name = Some(FLOW_SCHEMA.into());
    let flow_schemas = ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "flowcontrol.apiserver.k8s.io",
        "v1",
        "FlowSchema",
    ));
    Api::<DynamicObject>::all_with(mgmt.clone(), &flow_schemas)
        .create(&pp, &schema)
        .await
        .map_err(Error::Kube)?;
    let accounts: Api<ServiceAccount> = Api::namespaced(mgmt.clone(), NAMESPACE);
    let account: ServiceAccount =
        serde_json::from_value(json!({ "metadata": { "name": SERVICE_ACCOUNT } }))
            .map_err(|e| Error::Setup(e.to_string()))?;
    accounts.create(&pp, &account).await.map_err(Error::Kube)?;
    let token = controlplane::service_account_token(&accounts, SERVICE_ACCOUNT).await?;
    let yaml = controlplane::kubeconfig("management", server_port, ca_pem, &token).replace(
        "  context:\n",
        &format!("  context:\n    namespace: {NAMESPACE}\n"),
    );
    let path = dir.join("controller.kubeconfig");
    std::fs::write(&path, &yaml).map_err(|e| Error::io(&path, e))?;
    Ok((path, yaml))
}

fn rbac_file<T: serde::de::DeserializeOwned>(name: &str) -> Result<T, Error> {
    config_file(&format!("rbac/{name}"))
}

fn config_file<T: serde::de::DeserializeOwned>(name: &str) -> Result<T, Error> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../config")
        .join(name);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    serde_yaml::from_str(&text).map_err(|e| Error::Setup(format!("{}: {e}", path.display())))
}

/// A running controller process, killed on drop.
pub struct Controller {
    pub process: Process,
    pub health_port: u16,
    pub metrics_port: u16,
}

impl Controller {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.process.log).unwrap_or_default()
    }

    /// The Prometheus exposition text of `/metrics`.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("http://127.0.0.1:{}/metrics", self.metrics_port))
            .await
            .expect("scrape")
            .text()
            .await
            .expect("metrics text")
    }

    /// The value of the sample whose line starts with `series` (name and labels as exposed).
    pub async fn metric(&self, series: &str) -> Option<f64> {
        self.metrics()
            .await
            .lines()
            .find(|line| line.starts_with(series) && line[series.len()..].starts_with(' '))
            .and_then(|line| line.rsplit(' ').next()?.parse().ok())
    }

    /// Whether this replica leads (its `ck8s_certs_leader` gauge is 1).
    pub async fn is_leader(&self) -> bool {
        let url = format!("http://127.0.0.1:{}/metrics", self.metrics_port);
        match reqwest::get(url).await {
            Ok(response) => response
                .text()
                .await
                .is_ok_and(|text| text.lines().any(|l| l == "ck8s_certs_leader 1")),
            Err(_) => false,
        }
    }

    /// Whether `/readyz` answers 200.
    pub async fn is_ready(&self) -> bool {
        reqwest::get(format!("http://127.0.0.1:{}/readyz", self.health_port))
            .await
            .is_ok_and(|r| r.status().is_success())
    }

    /// Waits until this replica leads; panics with its log after `timeout`.
    pub async fn wait_until_leader(&self, timeout: Duration) {
        self.wait_until(true, timeout).await
    }

    /// Waits until `/readyz` answers 200; panics with its log after `timeout`.
    pub async fn wait_until_ready(&self, timeout: Duration) {
        self.wait_until(false, timeout).await
    }

    async fn wait_until(&self, leader: bool, timeout: Duration) {
        let start = Instant::now();
        loop {
            let holds = match leader {
                true => self.is_leader().await,
                false => self.is_ready().await,
            };
            if holds {
                return;
            }
            assert!(
                start.elapsed() < timeout,
                "{} did not become {}:\n{}",
                self.process.name,
                if leader { "leader" } else { "ready" },
                self.process.log_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops it abruptly (a crash).
    pub fn crash(mut self) {
        self.process.kill();
    }

    /// Waits until the process exited by itself (a failpoint aborted it).
    pub async fn wait_for_exit(&mut self, timeout: Duration) {
        let start = Instant::now();
        while self.process.check_running().is_ok() {
            assert!(
                start.elapsed() < timeout,
                "the controller did not exit:\n{}",
                self.process.log_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Controller {
    /// A failing test shows what the controller said.
    fn drop(&mut self) {
        self.process.report_if_panicking();
    }
}

impl Environment {
    /// Starts the controller with the ServiceAccount's rights, handling only Machines labelled
    /// with `filter`. Extra flags are appended.
    pub fn start_controller(&self, filter: &str, extra: &[&str]) -> Controller {
        self.start_controller_with_env(filter, extra, &[])
    }

    /// [`Self::start_controller`] with extra environment variables (e.g. failpoints).
    pub fn start_controller_with_env(
        &self,
        filter: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Controller {
        self.spawn_controller(&self.controller_kubeconfig, filter, extra, env)
    }

    /// [`Self::start_controller`] with the rights of the kubeconfig at `kubeconfig` instead of
    /// the ServiceAccount's.
    pub fn start_controller_as(
        &self,
        kubeconfig: &Path,
        filter: &str,
        extra: &[&str],
    ) -> Controller {
        self.spawn_controller(kubeconfig, filter, extra, &[])
    }

    /// [`Self::start_controller`] on the second management cluster ([`crate::MoveTarget`]).
    pub fn start_controller_on_move_target(&self, filter: &str, extra: &[&str]) -> Controller {
        let target = self.move_target.as_ref().expect("a move target");
        self.spawn_controller(&target.controller_kubeconfig, filter, extra, &[])
    }

    fn spawn_controller(
        &self,
        kubeconfig: &Path,
        filter: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Controller {
        let health_port = controlplane::free_port().expect("free port");
        let metrics_port = controlplane::free_port().expect("free port");
        let mut command =
            std::process::Command::new(Binaries::controller().expect("controller binary"));
        command
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--watch-filter")
            .arg(filter)
            .arg("--health-bind-address")
            .arg(format!("127.0.0.1:{health_port}"))
            .arg("--metrics-bind-address")
            .arg(format!("127.0.0.1:{metrics_port}"))
            .args(extra);
        // Test defaults, unless the test sets the flag itself. Leader election is on (one Lease
        // per watch filter) with short timings, so a restart after a crash waits seconds.
        for default in [
            "--k8sd-timeout=5s",
            "--k8sd-run-timeout=20s",
            "--settle-timeout=20s",
            "--leader-elect-lease-duration=6s",
            "--leader-elect-renew-deadline=4s",
            "--leader-elect-retry-period=500ms",
            "--shutdown-grace-period=20s",
            // Served only where a test installs the webhook configuration: see
            // `start_controller_with_webhook`.
            "--webhook=false",
            // Tests ask for 2y to tell a refresh's lifetime from the 1y default; the shipped
            // band (1d to 1y) is tested by tests/ttl_band.rs, which sets it.
            "--max-ttl=10y",
            // The admission policies are installed only where a test installs them
            // (`install_admission_policies`); tests/request_checks.rs,
            // tests/capi_replace.rs and tests/breaker.rs set them.
            "--request-policy=",
            "--renewal-admission-policy=",
            "--requester-policy=",
            // Subscriptions of a few objects: one that a controller reads only once the caches
            // are synced keeps them from syncing here, not only on a fleet of thousands.
            "--watch-buffer=4",
        ] {
            let name = default.split('=').next().unwrap_or(default);
            if !extra.iter().any(|arg| arg.split('=').next() == Some(name)) {
                command.arg(default);
            }
        }
        command.env("RUST_LOG", "info,ck8s_certs=debug");
        for (key, value) in env {
            command.env(key, value);
        }
        let name = format!(
            "controller-{filter}-{}",
            controlplane::free_port().unwrap_or(0)
        );
        let process = Process::spawn(&name, command, &self.dir).expect("controller starts");
        Controller {
            process,
            health_port,
            metrics_port,
        }
    }

    /// Labels `node`'s Machine so that the controller with `filter` handles it.
    pub async fn isolate(&self, node: &NodeInfo, filter: &str) {
        self.patch_machine(
            node,
            json!({ "metadata": { "labels": { WATCH_FILTER_LABEL: filter } } }),
        )
        .await;
    }

    /// Copies of the nodes of workload cluster `cluster` whose Machines are `machines`, in that
    /// order.
    pub fn nodes<const N: usize>(&self, cluster: &str, machines: [&str; N]) -> [NodeInfo; N] {
        let cluster = self.cluster(cluster);
        machines.map(|machine| cluster.node(machine).clone())
    }

    /// [`Self::nodes`], each Machine labelled for the controller with `filter` ([`Self::isolate`]).
    pub async fn isolated<const N: usize>(
        &self,
        cluster: &str,
        machines: [&str; N],
        filter: &str,
    ) -> [NodeInfo; N] {
        let nodes = self.nodes(cluster, machines);
        self.isolate_all(&nodes, filter).await;
        nodes
    }

    /// Labels the Machines of `nodes` for the controller with `filter` ([`Self::isolate`]).
    pub async fn isolate_all<'a>(
        &self,
        nodes: impl IntoIterator<Item = &'a NodeInfo>,
        filter: &str,
    ) {
        for node in nodes {
            self.isolate(node, filter).await;
        }
    }

    /// [`Self::isolate_all`], and the simulator forgets the calls it recorded on those nodes:
    /// what a test counts afterwards is its own.
    pub async fn isolate_fresh<'a>(
        &self,
        nodes: impl IntoIterator<Item = &'a NodeInfo>,
        filter: &str,
    ) {
        for node in nodes {
            self.isolate(node, filter).await;
            self.sim
                .clear_calls(&node.cluster, &node.node)
                .await
                .unwrap_or_else(|e| panic!("clearing the calls on {}: {e}", node.node));
        }
    }

    /// Labels a Cluster, its MachineDeployment and its Machines for the controller with `filter`.
    pub async fn isolate_cluster(&self, cluster: &str, filter: &str) -> Vec<NodeInfo> {
        let nodes = self.cluster(cluster).nodes.clone();
        self.isolate_all(&nodes, filter).await;
        let namespace = self.cluster(cluster).spec.namespace.clone();
        let client = self.management().await.expect("client");
        let label =
            Patch::Merge(json!({ "metadata": { "labels": { WATCH_FILTER_LABEL: filter } } }));
        self.cluster_api(client.clone(), &namespace)
            .patch(cluster, &PatchParams::default(), &label)
            .await
            .expect("label the Cluster");
        self.machine_deployment_api(client.clone(), &namespace)
            .patch(&format!("{cluster}-md-0"), &PatchParams::default(), &label)
            .await
            .expect("label the MachineDeployment");
        if !self.spec.control_plane_crd {
            return nodes;
        }
        self.control_plane_api(client, &namespace)
            .patch(
                &crate::fixtures::control_plane_name(cluster),
                &PatchParams::default(),
                &label,
            )
            .await
            .expect("label the CK8sControlPlane");
        nodes
    }

    /// A Cluster API kind (`Cluster`, `MachineDeployment`, `Machine`) in the served version.
    pub fn capi_api(&self, client: Client, namespace: &str, kind: &str) -> Api<DynamicObject> {
        let resource = ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
            ck8s_certs_api::capi::GROUP,
            self.spec.capi_version.storage_version(),
            kind,
        ));
        Api::namespaced_with(client, namespace, &resource)
    }

    pub fn cluster_api(&self, client: Client, namespace: &str) -> Api<DynamicObject> {
        self.capi_api(client, namespace, "Cluster")
    }

    pub fn machine_deployment_api(&self, client: Client, namespace: &str) -> Api<DynamicObject> {
        self.capi_api(client, namespace, "MachineDeployment")
    }

    /// The clusters' CK8sControlPlanes (`<cluster>-control-plane`).
    pub fn control_plane_api(&self, client: Client, namespace: &str) -> Api<DynamicObject> {
        let resource = ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
            ck8s_certs_api::capi::CONTROL_PLANE_GROUP,
            crate::fixtures::CK8S_CONTROL_PLANE_VERSION,
            ck8s_certs_api::capi::CK8S_CONTROL_PLANE_KIND,
        ));
        Api::namespaced_with(client, namespace, &resource)
    }

    pub fn machine_api(&self, client: Client, namespace: &str) -> Api<DynamicObject> {
        self.capi_api(client, namespace, "Machine")
    }

    pub async fn patch_machine(&self, node: &NodeInfo, patch: serde_json::Value) {
        let api = self.machine_api(self.management().await.expect("client"), &node.namespace);
        api.patch(
            &node.machine,
            &PatchParams {
                field_manager: Some("kubectl-annotate".into()),
                ..Default::default()
            },
            &Patch::Merge(patch),
        )
        .await
        .expect("patch Machine");
    }

    /// `kubectl annotate machine <m> v1beta2.k8sd.io/refresh-certificates=<ttl>`.
    pub async fn annotate_refresh(&self, node: &NodeInfo, ttl: &str) {
        self.patch_machine(
            node,
            json!({ "metadata": { "annotations": { ck8s_certs_api::annotations::REFRESH_CERTIFICATES: ttl } } }),
        )
        .await;
    }

    /// [`Self::annotate_refresh`] through `machines`: with another user's client, or on another
    /// management cluster.
    pub async fn annotate_refresh_through(
        &self,
        machines: &Api<DynamicObject>,
        node: &NodeInfo,
        ttl: &str,
    ) {
        let annotation = json!({ "metadata": { "annotations": {
            ck8s_certs_api::annotations::REFRESH_CERTIFICATES: ttl
        } } });
        machines
            .patch(
                &node.machine,
                &PatchParams::default(),
                &Patch::Merge(annotation),
            )
            .await
            .expect("annotate the Machine");
    }

    /// The Machine's `metadata.uid`: its place in a policy's `spread`.
    pub async fn machine_uid(&self, node: &NodeInfo) -> String {
        let api = self.machine_api(self.management().await.expect("client"), &node.namespace);
        api.get(&node.machine)
            .await
            .expect("get Machine")
            .metadata
            .uid
            .expect("a Machine has a UID")
    }

    pub async fn machine_annotations(&self, node: &NodeInfo) -> BTreeMap<String, String> {
        let api = self.machine_api(self.management().await.expect("client"), &node.namespace);
        api.get(&node.machine)
            .await
            .expect("get Machine")
            .metadata
            .annotations
            .unwrap_or_default()
    }

    /// Waits until the Machine's annotations satisfy `done`; panics with them after `timeout`.
    pub async fn wait_for_machine(
        &self,
        node: &NodeInfo,
        timeout: Duration,
        done: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> BTreeMap<String, String> {
        let start = Instant::now();
        loop {
            let annotations = self.machine_annotations(node).await;
            if done(&annotations) {
                return annotations;
            }
            assert!(
                start.elapsed() < timeout,
                "timed out waiting on Machine {}: {annotations:#?}",
                node.machine
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until `done` holds for the annotations of the object `name` of `api` (a Cluster,
    /// a MachineDeployment, a CK8sControlPlane, a Machine).
    pub async fn wait_for_annotations(
        &self,
        api: &Api<DynamicObject>,
        name: &str,
        timeout: Duration,
        done: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> BTreeMap<String, String> {
        let start = Instant::now();
        loop {
            let annotations = api
                .get(name)
                .await
                .expect("get the object")
                .metadata
                .annotations
                .unwrap_or_default();
            if done(&annotations) {
                return annotations;
            }
            assert!(
                start.elapsed() < timeout,
                "timed out waiting on {name}: {annotations:#?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until the simulator recorded a call on `node` to `path` matching `pred`.
    pub async fn wait_for_call(
        &self,
        node: &NodeInfo,
        path: &str,
        timeout: Duration,
        pred: impl Fn(&crate::sim::CallRecord) -> bool,
    ) -> crate::sim::CallRecord {
        let start = Instant::now();
        loop {
            let calls = self
                .sim
                .calls(&node.cluster, &node.node)
                .await
                .expect("calls");
            if let Some(call) = calls.into_iter().find(|c| c.path == path && pred(c)) {
                return call;
            }
            assert!(start.elapsed() < timeout, "no {path} call on {}", node.node);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The calls the simulator recorded on `node`, oldest first.
    pub async fn calls(&self, node: &NodeInfo) -> Vec<crate::sim::CallRecord> {
        self.sim
            .calls(&node.cluster, &node.node)
            .await
            .unwrap_or_else(|e| panic!("the calls on {}: {e}", node.node))
    }

    /// `kubectl annotate` a refresh of `ttl` ([`Self::annotate_refresh`]), then waits until
    /// `node` holds its call to `path` (recorded, not answered yet: a latency fault holds it).
    pub async fn annotate_until_held(
        &self,
        node: &NodeInfo,
        ttl: &str,
        path: &str,
        timeout: Duration,
    ) -> crate::sim::CallRecord {
        self.annotate_refresh(node, ttl).await;
        self.wait_for_call(node, path, timeout, |c| c.status == 0)
            .await
    }

    /// Holds `node`'s next call to `endpoint` back for `delay` (a latency fault, once), annotates
    /// a refresh of `1y` and waits until the node holds that call
    /// ([`Self::annotate_until_held`]).
    pub async fn annotate_held_at(
        &self,
        node: &NodeInfo,
        endpoint: crate::sim::Endpoint,
        delay: Duration,
        timeout: Duration,
    ) -> crate::sim::CallRecord {
        self.sim
            .delay_next(node, endpoint, delay)
            .await
            .unwrap_or_else(|e| panic!("holding back {endpoint:?} on {}: {e}", node.node));
        self.annotate_until_held(node, "1y", endpoint.path(), timeout)
            .await
    }

    /// Waits for the refresh to end ([`Self::wait_for_refresh`]) and checks that it ended `done`;
    /// returns the Machine's annotations.
    pub async fn wait_for_done(
        &self,
        node: &NodeInfo,
        timeout: Duration,
    ) -> BTreeMap<String, String> {
        let annotations = self.wait_for_refresh(node, timeout).await;
        assert_eq!(
            annotations[ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS],
            "done",
            "{}/{}: {annotations:#?}",
            node.namespace,
            node.machine
        );
        annotations
    }

    /// Waits for the refresh to fail; returns its message, checked to be the same in the
    /// MachineCertificates status and the Warning Event.
    pub async fn refresh_failure(&self, node: &NodeInfo, timeout: Duration) -> String {
        let annotations = self.wait_for_refresh(node, timeout).await;
        assert_eq!(
            annotations[ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS],
            "failed",
            "{annotations:#?}"
        );
        let mc = self
            .machine_certificates(node)
            .await
            .expect("MachineCertificates");
        let error = mc
            .status
            .and_then(|s| s.operation)
            .and_then(|o| o.error)
            .expect("the operation's error");
        let events = self.machine_events(node).await;
        let event = events
            .iter()
            .rev()
            .find(|e| e.reason.as_deref() == Some("CertificatesRefreshFailed"))
            .expect("Failed event");
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert_eq!(event.note.as_deref(), Some(error.as_str()));
        error
    }

    /// Waits for the refresh status annotation to become `done` or `failed`.
    pub async fn wait_for_refresh(
        &self,
        node: &NodeInfo,
        timeout: Duration,
    ) -> BTreeMap<String, String> {
        self.wait_for_machine(node, timeout, |a| {
            matches!(
                a.get(ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS)
                    .map(String::as_str),
                Some("done" | "failed")
            ) && !a.contains_key(ck8s_certs_api::annotations::REFRESH_CERTIFICATES)
        })
        .await
    }

    /// Events about Cluster `cluster` of `namespace`.
    pub async fn cluster_events(&self, namespace: &str, cluster: &str) -> Vec<Event> {
        let api: Api<Event> = Api::namespaced(self.management().await.expect("client"), namespace);
        api.list(
            &ListParams::default()
                .fields(&format!("regarding.kind=Cluster,regarding.name={cluster}")),
        )
        .await
        .expect("list Events")
        .items
    }

    /// Events about `node`'s Machine, oldest first.
    pub async fn machine_events(&self, node: &NodeInfo) -> Vec<Event> {
        let api: Api<Event> =
            Api::namespaced(self.management().await.expect("client"), &node.namespace);
        let mut events: Vec<Event> = api
            .list(&ListParams::default().fields(&format!("regarding.name={}", node.machine)))
            .await
            .expect("list events")
            .items;
        events.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
        events
    }

    /// The reasons of the Machine's Events, oldest first.
    pub async fn event_reasons(&self, node: &NodeInfo) -> Vec<String> {
        self.machine_events(node)
            .await
            .into_iter()
            .filter_map(|e| e.reason)
            .collect()
    }

    /// Who (the controller's POD_NAME) reported the Machine's Events with `reason`, oldest
    /// first.
    pub async fn event_reporters(&self, node: &NodeInfo, reason: &str) -> Vec<String> {
        self.machine_events(node)
            .await
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(|e| e.reporting_instance)
            .collect()
    }

    pub async fn machine_certificates(
        &self,
        node: &NodeInfo,
    ) -> Option<ck8s_certs_api::machine_certificates::MachineCertificates> {
        let api: Api<ck8s_certs_api::machine_certificates::MachineCertificates> =
            Api::namespaced(self.management().await.expect("client"), &node.namespace);
        api.get_opt(&node.machine)
            .await
            .expect("get MachineCertificates")
    }

    /// Waits until `check` holds for `node`'s MachineCertificates; panics with `what` and the
    /// last one read after `timeout`.
    pub async fn wait_for_certificates(
        &self,
        node: &NodeInfo,
        timeout: Duration,
        what: &str,
        check: impl Fn(&ck8s_certs_api::machine_certificates::MachineCertificates) -> bool,
    ) -> ck8s_certs_api::machine_certificates::MachineCertificates {
        let start = Instant::now();
        loop {
            let certificates = self.machine_certificates(node).await;
            if let Some(certificates) = certificates.as_ref().filter(|c| check(c)) {
                return certificates.clone();
            }
            assert!(
                start.elapsed() < timeout,
                "{}: timed out waiting for {what}: {certificates:#?}",
                node.machine
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// [`Self::wait_for_certificates`] on their status: returns it once `check` holds.
    pub async fn wait_for_status(
        &self,
        node: &NodeInfo,
        timeout: Duration,
        what: &str,
        check: impl Fn(&ck8s_certs_api::machine_certificates::MachineCertificatesStatus) -> bool,
    ) -> ck8s_certs_api::machine_certificates::MachineCertificatesStatus {
        self.wait_for_certificates(node, timeout, what, |c| {
            c.status.as_ref().is_some_and(&check)
        })
        .await
        .status
        .unwrap_or_default()
    }

    /// Waits until CertificateRefresh `name` of `namespace` has finished (a final phase);
    /// returns it.
    pub async fn finished_request(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> ck8s_certs_api::certificate_refresh::CertificateRefresh {
        let api: Api<ck8s_certs_api::certificate_refresh::CertificateRefresh> =
            Api::namespaced(self.management().await.expect("client"), namespace);
        let start = Instant::now();
        loop {
            let request = api.get(name).await.expect("get CertificateRefresh");
            if request
                .status
                .as_ref()
                .and_then(|s| s.phase)
                .is_some_and(ck8s_certs_api::certificate_refresh::RequestPhase::is_finished)
            {
                return request;
            }
            assert!(
                start.elapsed() < timeout,
                "request {name} did not finish: {:?}",
                request.status
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The operation of the `CertificateRefresh` the Machine names as in flight (the journal of
    /// its refresh), once the refresh reached the node (its seed is recorded there).
    pub async fn in_flight(
        &self,
        node: &NodeInfo,
    ) -> Option<ck8s_certs_api::machine_certificates::Operation> {
        let annotations = self.machine_annotations(node).await;
        let request = annotations.get(ck8s_certs_api::annotations::IN_FLIGHT_REFRESH)?;
        let api: Api<ck8s_certs_api::certificate_refresh::CertificateRefresh> =
            Api::namespaced(self.management().await.expect("client"), &node.namespace);
        api.get_opt(request)
            .await
            .expect("get CertificateRefresh")
            .and_then(|r| r.status)
            .and_then(|s| s.operation)
    }

    /// The Machine's current operation ([`Self::in_flight`]) or, when none is in flight, the
    /// last one (its copy in the MachineCertificates).
    pub async fn operation(
        &self,
        node: &NodeInfo,
    ) -> ck8s_certs_api::machine_certificates::Operation {
        if let Some(op) = self.in_flight(node).await {
            return op;
        }
        self.machine_certificates(node)
            .await
            .and_then(|m| m.status)
            .and_then(|s| s.operation)
            .unwrap_or_else(|| panic!("{} has no operation record", node.machine))
    }
}
