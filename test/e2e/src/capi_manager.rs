//! The real Cluster API core manager (Cluster, Machine, MachineSet and MachineDeployment
//! controllers, and CAPI's webhooks) beside the controller, when [`crate::EnvSpec::capi_manager`]
//! asks for it. It runs out of cluster against the management API server, built from the
//! environment's CAPI release by `hack/build-capi-manager.sh` (`make capi-manager`).
//!
//! What it is given, and why:
//! - No `--namespace`: the environment that runs it holds Cluster API objects in [`NAMESPACE`]
//!   only. With `--namespace`, v1.14's controllers read a multi-namespace cache that their
//!   read-after-write check cannot use: after its first write of a MachineSet, every
//!   MachineDeployment reconcile failed with "failed to cast MachineSet informer to
//!   SharedIndexInformer" (`util/controller/consistency.go`), and a template's annotations
//!   were never carried on.
//! - An identity of its own, ServiceAccount [`USER`], bound to the release's own ClusterRole
//!   (`config/rbac/role.yaml`, `manager-role`), not the admin: its rights are the ones it has in a
//!   real management cluster, and the audit log tells its writes from ours. The release binds an
//!   aggregated role; aggregation needs kube-controller-manager, which does not run here, so
//!   `manager-role` is bound directly (it already covers the infrastructure and bootstrap groups).
//! - Its webhook server, which cannot be turned off: a serving certificate from the environment's
//!   CA. Its Cluster, Machine, MachineSet and MachineDeployment webhooks are registered by URL for
//!   [`NAMESPACE`] only, so writes there (ours included) are defaulted and validated as in a real
//!   management cluster.
//! - Coherent objects in [`NAMESPACE`] before it starts ([`make_coherent`]): a Machine whose
//!   infrastructure is missing is failed for good, a MachineDeployment without a matching
//!   MachineSet rolls out new Machines.
//!
//! At rest it writes nothing; see `tests/capi_manager.rs` for what it does beside us.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ck8s_certs_api::capi;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::{Api, Client};
use serde_json::json;

use crate::crds::CapiVersion;
use crate::fixtures::{Role, ensure_namespace};
use crate::pki::{Ca, Leaf, Usage};
use crate::process::Process;
use crate::{Error, WorkloadCluster, controlplane, crds};

/// The only namespace the manager reconciles.
pub const NAMESPACE: &str = "capi";
/// Where its ServiceAccount lives.
pub const SYSTEM_NAMESPACE: &str = "capi-system";
pub const SERVICE_ACCOUNT: &str = "capi-manager";
/// Its user name in the audit log.
pub const USER: &str = "system:serviceaccount:capi-system:capi-manager";
/// The finalizer CAPI's Machine controller puts on every Machine it reconciles.
pub const MACHINE_FINALIZER: &str = "machine.cluster.x-k8s.io";
/// The field manager of the MachineSet controller's server-side applies to its Machines.
pub const MACHINE_SET_MANAGER: &str = "capi-machineset";
/// The label that ties a MachineSet, its selector and its Machines together.
pub const TEMPLATE_HASH_LABEL: &str = "machine-template-hash";
pub const SET_NAME_LABEL: &str = "cluster.x-k8s.io/set-name";
const REVISION_ANNOTATION: &str = "machinedeployment.clusters.x-k8s.io/revision";
/// The stub infrastructure group (the fixtures' refs already name DockerMachine(Template)s).
const INFRA_GROUP: &str = "infrastructure.cluster.x-k8s.io";
const INFRA_VERSION: &str = "v1beta1";

/// A running manager (its process belongs to the environment).
#[derive(Clone, Debug)]
pub struct CapiManager {
    pub version: String,
    pub log: PathBuf,
    pub health_port: u16,
    pub webhook_port: u16,
}

impl CapiManager {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Whether its `/readyz` answers 200 (it exits on fatal errors, so this also says it runs).
    pub async fn is_ready(&self) -> bool {
        reqwest::get(format!("http://127.0.0.1:{}/readyz", self.health_port))
            .await
            .is_ok_and(|r| r.status().is_success())
    }
}

/// An environment of one cluster `name` (two control planes, two workers) in [`NAMESPACE`],
/// with the manager.
pub fn spec(name: &str) -> crate::EnvSpec {
    let mut spec = crate::EnvSpec::standard();
    spec.clusters = vec![crate::fixtures::ClusterSpec {
        name: name.into(),
        namespace: NAMESPACE.into(),
        machine_prefix: name.into(),
        control_planes: 2,
        workers: 2,
        microcluster_port: None,
        extra_sans: Vec::new(),
        endpoint_host: format!("{name}.k8s.example.internal"),
    }];
    spec.capi_manager = true;
    spec
}

/// The MachineSet [`make_coherent`] creates for `cluster`'s MachineDeployment `<cluster>-md-0`.
pub fn machine_set_name(cluster: &str) -> String {
    format!("{cluster}-md-0-e2e00")
}

/// The manager binary of CAPI `version`: `$CK8S_E2E_CAPI_MANAGER`, else
/// `<cache>/bin/capi-manager-<version>` as hack/lib.sh builds it.
pub fn binary(version: &str) -> Result<PathBuf, Error> {
    crate::executable(
        "CK8S_E2E_CAPI_MANAGER",
        || {
            crate::cache_dir()
                .join("bin")
                .join(format!("capi-manager-{version}"))
        },
        "`make capi-manager` (make e2e does)",
    )
}

/// What [`start`] needs from [`crate::Environment::start`].
pub(crate) struct Start<'a> {
    pub mgmt: &'a Client,
    pub port: u16,
    pub ca: &'a Ca,
    pub dir: &'a Path,
    pub capi_version: &'a CapiVersion,
    /// The release's `config/crd/bases`; its `config/rbac` and `config/webhook` are beside it.
    pub crd_dir: &'a Path,
    pub clusters: &'a [WorkloadCluster],
}

/// Makes the clusters (all in [`NAMESPACE`]) coherent, starts the manager and registers its webhooks;
/// returns once it is ready.
pub(crate) async fn start(s: Start<'_>) -> Result<(Process, CapiManager), Error> {
    let version = s.capi_version.0.clone();
    let binary = binary(&version)?;
    let config = s.crd_dir.join("../..");
    // It watches every namespace (see the module doc): a cluster elsewhere is not made for it.
    if let Some(stray) = s.clusters.iter().find(|c| c.spec.namespace != NAMESPACE) {
        return Err(Error::Setup(format!(
            "cluster {} is in namespace {}: beside the Cluster API manager every cluster is in {NAMESPACE}",
            stray.spec.name, stray.spec.namespace
        )));
    }
    install_stubs(s.mgmt).await?;
    for cluster in s.clusters {
        make_coherent(s.mgmt, s.capi_version, cluster).await?;
    }
    let kubeconfig = identity(s.mgmt, s.port, &s.ca.pem, s.dir, &config).await?;

    let certificate = s.ca.issue(
        s.dir,
        Leaf {
            file_name: "capi-manager-webhook",
            common_name: "capi-manager-webhook",
            organization: None,
            ips: &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
            dns: &["localhost"],
            usage: Usage::Server,
        },
    )?;
    let file_name = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let health_port = controlplane::free_port()?;
    let webhook_port = controlplane::free_port()?;
    let diagnostics_port = controlplane::free_port()?;
    let mut command = std::process::Command::new(&binary);
    command
        .env("KUBECONFIG", &kubeconfig)
        .arg(format!("--webhook-port={webhook_port}"))
        .arg(format!("--webhook-cert-dir={}", s.dir.display()))
        .arg(format!(
            "--webhook-cert-name={}",
            file_name(&certificate.cert)
        ))
        .arg(format!(
            "--webhook-key-name={}",
            file_name(&certificate.key)
        ))
        .arg(format!("--health-addr=127.0.0.1:{health_port}"))
        .arg(format!(
            "--diagnostics-address=127.0.0.1:{diagnostics_port}"
        ))
        .arg("--insecure-diagnostics")
        // Its CRD migrator rewrites every object of its CRDs in every namespace.
        .arg("--skip-crd-migration-phases=StorageVersionMigration,CleanupManagedFields");
    let mut process = Process::spawn("capi-manager", command, s.dir)?;
    let manager = CapiManager {
        version,
        log: process.log.clone(),
        health_port,
        webhook_port,
    };
    let started = Instant::now();
    while !manager.is_ready().await {
        process.check_running()?;
        if started.elapsed() > Duration::from_secs(90) {
            return Err(Error::Timeout {
                what: "the Cluster API manager to be ready".into(),
                log: process.log_tail(30),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    register_webhooks(
        s.mgmt,
        &config.join("webhook/manifests.yaml"),
        webhook_port,
        &s.ca.pem,
    )
    .await?;
    touch(s.mgmt, s.capi_version).await?;
    Ok((process, manager))
}

fn api(client: &Client, group: &str, version: &str, kind: &str, ns: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    Api::namespaced_with(client.clone(), ns, &resource)
}

fn value<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, Error> {
    serde_json::from_value(value).map_err(|e| Error::Setup(e.to_string()))
}

/// Infrastructure and bootstrap template CRDs that no provider installs here: schemaless,
/// labelled with the versions that implement CAPI's contracts (v1.10 reads the `v1beta1` label,
/// v1.14 the `v1beta2` one). The CK8sConfig CRD gets its `v1beta1` contract label as well.
async fn install_stubs(mgmt: &Client) -> Result<(), Error> {
    let contracts = |version: &str| json!({ "cluster.x-k8s.io/v1beta1": version, "cluster.x-k8s.io/v1beta2": version });
    let crd = |group: &str, version: &str, kind: &str| -> Result<CustomResourceDefinition, Error> {
        let plural = format!("{}s", kind.to_lowercase());
        let open = json!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true });
        value(json!({
            "metadata": { "name": format!("{plural}.{group}"), "labels": contracts(version) },
            "spec": {
                "group": group,
                "names": { "kind": kind, "listKind": format!("{kind}List"), "plural": plural, "singular": kind.to_lowercase() },
                "scope": "Namespaced",
                "versions": [{
                    "name": version, "served": true, "storage": true,
                    "subresources": { "status": {} },
                    "schema": { "openAPIV3Schema": { "type": "object", "properties": { "spec": open, "status": open } } }
                }]
            }
        }))
    };
    crds::install(
        mgmt,
        vec![
            crd(INFRA_GROUP, INFRA_VERSION, "DockerCluster")?,
            crd(INFRA_GROUP, INFRA_VERSION, "DockerMachine")?,
            crd(INFRA_GROUP, INFRA_VERSION, "DockerMachineTemplate")?,
            crd(
                capi::CK8S_CONFIG_GROUP,
                capi::CK8S_CONFIG_VERSION,
                "CK8sConfigTemplate",
            )?,
        ],
    )
    .await?;
    Api::<CustomResourceDefinition>::all(mgmt.clone())
        .patch(
            &format!("ck8sconfigs.{}", capi::CK8S_CONFIG_GROUP),
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "metadata": { "labels": contracts(capi::CK8S_CONFIG_VERSION) } }),
            ),
        )
        .await
        .map_err(Error::Kube)?;
    Ok(())
}

/// Makes one fixture cluster look as CAPI and its providers would have left it, so that the
/// manager adopts it as it is and creates or deletes nothing:
/// - the Cluster's `spec.infrastructureRef` to a provisioned DockerCluster (CAPI's webhook
///   refuses a Cluster with neither an infrastructure nor a control plane ref);
/// - every Machine's DockerMachine, provisioned, with the `spec.providerID` of its Node (set on
///   the workload Node too) and the Machine's addresses;
/// - the MachineDeployment's templates, and the defaults its webhook would have set (the
///   rollout strategy; v1beta1: the template refs' namespace);
/// - a MachineSet as the MachineDeployment controller creates it (owned by it, with its
///   template and a `machine-template-hash` in its labels and selector), and that label and the
///   set name on the workers, which it then adopts.
async fn make_coherent(
    mgmt: &Client,
    capi_version: &CapiVersion,
    cluster: &WorkloadCluster,
) -> Result<(), Error> {
    let version = capi_version.storage_version();
    let v1beta2 = version == "v1beta2";
    let ns = cluster.spec.namespace.as_str();
    let name = cluster.spec.name.as_str();
    let pp = PostParams::default();

    let docker_clusters = api(mgmt, INFRA_GROUP, INFRA_VERSION, "DockerCluster", ns);
    docker_clusters
        .create(
            &pp,
            &value(json!({
                "apiVersion": format!("{INFRA_GROUP}/{INFRA_VERSION}"), "kind": "DockerCluster",
                "metadata": { "name": name, "namespace": ns, "labels": { capi::CLUSTER_NAME_LABEL: name } },
                "spec": { "controlPlaneEndpoint": { "host": cluster.spec.endpoint_host, "port": 6443 } }
            }))?,
        )
        .await
        .map_err(Error::Kube)?;
    docker_clusters
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "status": { "ready": true, "initialization": { "provisioned": true } } }),
            ),
        )
        .await
        .map_err(Error::Kube)?;
    // The reference in the Cluster's stored version: v1beta2 names the group, v1beta1 the version.
    let mut infra_ref = json!({ "kind": "DockerCluster", "name": name });
    if v1beta2 {
        infra_ref["apiGroup"] = json!(INFRA_GROUP);
    } else {
        infra_ref["apiVersion"] = json!(format!("{INFRA_GROUP}/{INFRA_VERSION}"));
        infra_ref["namespace"] = json!(ns);
    }
    api(mgmt, capi::GROUP, version, "Cluster", ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "infrastructureRef": infra_ref } })),
        )
        .await
        .map_err(Error::Kube)?;

    let workload = cluster.client().await?;
    let nodes: Api<Node> = Api::all(workload);
    let docker_machines = api(mgmt, INFRA_GROUP, INFRA_VERSION, "DockerMachine", ns);
    for node in &cluster.nodes {
        let provider_id = format!("e2e://{}", node.node);
        nodes
            .patch(
                &node.node,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "providerID": provider_id } })),
            )
            .await
            .map_err(Error::Kube)?;
        docker_machines
            .create(
                &pp,
                &value(json!({
                    "apiVersion": format!("{INFRA_GROUP}/{INFRA_VERSION}"), "kind": "DockerMachine",
                    "metadata": { "name": node.machine, "namespace": ns, "labels": { capi::CLUSTER_NAME_LABEL: name } },
                    "spec": { "providerID": provider_id }
                }))?,
            )
            .await
            .map_err(Error::Kube)?;
        // Both contracts' "provisioned": v1beta1 `ready`, v1beta2 `initialization.provisioned`.
        docker_machines
            .patch_status(
                &node.machine,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": {
                    "ready": true,
                    "initialization": { "provisioned": true },
                    "addresses": [{ "type": "InternalIP", "address": node.address.to_string() }]
                }})),
            )
            .await
            .map_err(Error::Kube)?;
    }

    let deployment = format!("{name}-md-0");
    for (group, version, kind) in [
        (INFRA_GROUP, INFRA_VERSION, "DockerMachineTemplate"),
        (
            capi::CK8S_CONFIG_GROUP,
            capi::CK8S_CONFIG_VERSION,
            "CK8sConfigTemplate",
        ),
    ] {
        api(mgmt, group, version, kind, ns)
            .create(
                &pp,
                &value(json!({
                    "apiVersion": format!("{group}/{version}"), "kind": kind,
                    "metadata": { "name": deployment, "namespace": ns },
                    "spec": { "template": { "spec": {} } }
                }))?,
            )
            .await
            .map_err(Error::Kube)?;
    }

    let deployments = api(mgmt, capi::GROUP, version, "MachineDeployment", ns);
    let strategy =
        json!({ "type": "RollingUpdate", "rollingUpdate": { "maxSurge": 1, "maxUnavailable": 0 } });
    let defaults = if v1beta2 {
        json!({ "spec": { "rollout": { "strategy": strategy } } })
    } else {
        json!({ "spec": {
            "strategy": strategy,
            "template": { "spec": {
                "bootstrap": { "configRef": { "namespace": ns } },
                "infrastructureRef": { "namespace": ns }
            }}
        }})
    };
    let md = deployments
        .patch(
            &deployment,
            &PatchParams::default(),
            &Patch::Merge(defaults),
        )
        .await
        .map_err(Error::Kube)?;

    let set = machine_set_name(name);
    let hash = "e2e00";
    let with_hash = |labels: &serde_json::Value| {
        let mut labels = labels.clone();
        labels[TEMPLATE_HASH_LABEL] = json!(hash);
        labels
    };
    let template_labels = &md.data["spec"]["template"]["metadata"]["labels"];
    let mut set_labels = with_hash(template_labels);
    set_labels[capi::DEPLOYMENT_NAME_LABEL] = json!(deployment);
    api(mgmt, capi::GROUP, version, "MachineSet", ns)
        .create(
            &pp,
            &value(json!({
                "apiVersion": format!("{}/{version}", capi::GROUP), "kind": "MachineSet",
                "metadata": {
                    "name": set, "namespace": ns, "labels": set_labels,
                    "annotations": { REVISION_ANNOTATION: "1" },
                    "ownerReferences": [{
                        "apiVersion": format!("{}/{version}", capi::GROUP), "kind": "MachineDeployment",
                        "name": deployment, "uid": md.metadata.uid, "controller": true, "blockOwnerDeletion": true
                    }]
                },
                "spec": {
                    "clusterName": name,
                    "replicas": cluster.spec.workers,
                    "selector": { "matchLabels": with_hash(&md.data["spec"]["selector"]["matchLabels"]) },
                    "template": {
                        "metadata": { "labels": with_hash(template_labels) },
                        "spec": md.data["spec"]["template"]["spec"]
                    }
                }
            }))?,
        )
        .await
        .map_err(Error::Kube)?;

    let machines = api(mgmt, capi::GROUP, version, "Machine", ns);
    for node in cluster.nodes.iter().filter(|n| n.role == Role::Worker) {
        machines
            .patch(
                &node.machine,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({ "metadata": { "labels": { TEMPLATE_HASH_LABEL: hash, SET_NAME_LABEL: set } } }),
                ),
            )
            .await
            .map_err(Error::Kube)?;
    }
    Ok(())
}

/// The manager's ServiceAccount, bound to the release's `manager-role`; returns a kubeconfig
/// with its token.
async fn identity(
    mgmt: &Client,
    port: u16,
    ca_pem: &str,
    dir: &Path,
    config: &Path,
) -> Result<PathBuf, Error> {
    let path = config.join("rbac/role.yaml");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let mut role: ClusterRole = serde_yaml::from_str(&text)
        .map_err(|e| Error::Setup(format!("{}: {e}", path.display())))?;
    role.metadata.name = Some(SERVICE_ACCOUNT.into());
    let pp = PostParams::default();
    Api::<ClusterRole>::all(mgmt.clone())
        .create(&pp, &role)
        .await
        .map_err(Error::Kube)?;
    let binding: ClusterRoleBinding = value(json!({
        "metadata": { "name": SERVICE_ACCOUNT },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": SERVICE_ACCOUNT },
        "subjects": [{ "kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": SYSTEM_NAMESPACE }]
    }))?;
    Api::<ClusterRoleBinding>::all(mgmt.clone())
        .create(&pp, &binding)
        .await
        .map_err(Error::Kube)?;
    ensure_namespace(mgmt, SYSTEM_NAMESPACE).await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(mgmt.clone(), SYSTEM_NAMESPACE);
    accounts
        .create(
            &pp,
            &value(json!({ "metadata": { "name": SERVICE_ACCOUNT } }))?,
        )
        .await
        .map_err(Error::Kube)?;
    let token = controlplane::service_account_token(&accounts, SERVICE_ACCOUNT).await?;
    let path = dir.join("capi-manager.kubeconfig");
    let yaml = controlplane::kubeconfig("management", port, ca_pem, &token);
    std::fs::write(&path, yaml).map_err(|e| Error::io(&path, e))?;
    Ok(path)
}

/// The release's webhook configurations (`config/webhook/manifests.yaml`), reduced to the kinds
/// the manager reconciles here, calling it on loopback, for [`NAMESPACE`] only.
async fn register_webhooks(
    mgmt: &Client,
    manifests: &Path,
    port: u16,
    ca_pem: &str,
) -> Result<(), Error> {
    use base64::Engine as _;
    let text = std::fs::read_to_string(manifests).map_err(|e| Error::io(manifests, e))?;
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let kinds = ["clusters", "machines", "machinesets", "machinedeployments"];
    for document in serde_yaml::Deserializer::from_str(&text) {
        let mut configuration: serde_json::Value = serde::Deserialize::deserialize(document)
            .map_err(|e| Error::Setup(format!("{}: {e}", manifests.display())))?;
        let Some(webhooks) = configuration["webhooks"].as_array_mut() else {
            continue;
        };
        webhooks.retain(|w| {
            w["rules"].as_array().is_some_and(|rules| {
                rules.iter().all(|r| {
                    r["resources"].as_array().is_some_and(|rs| {
                        rs.iter().all(|x| kinds.contains(&x.as_str().unwrap_or("")))
                    })
                })
            })
        });
        for webhook in webhooks.iter_mut() {
            let path = webhook["clientConfig"]["service"]["path"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            webhook["clientConfig"] = json!({
                "url": format!("https://127.0.0.1:{port}{path}"),
                "caBundle": ca_bundle
            });
            webhook["namespaceSelector"] =
                json!({ "matchLabels": { "kubernetes.io/metadata.name": NAMESPACE } });
        }
        let name = format!(
            "capi-{}",
            configuration["metadata"]["name"]
                .as_str()
                .unwrap_or("webhooks")
        );
        configuration["metadata"] = json!({ "name": name });
        match configuration["kind"].as_str() {
            Some("MutatingWebhookConfiguration") => {
                Api::<MutatingWebhookConfiguration>::all(mgmt.clone())
                    .create(&PostParams::default(), &value(configuration)?)
                    .await
                    .map_err(Error::Kube)?;
            }
            Some("ValidatingWebhookConfiguration") => {
                Api::<ValidatingWebhookConfiguration>::all(mgmt.clone())
                    .create(&PostParams::default(), &value(configuration)?)
                    .await
                    .map_err(Error::Kube)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// An empty patch of every CAPI object of [`NAMESPACE`] (as the admin), so that the defaults of
/// the webhooks registered after the objects were made are in place before tests count writes
/// (the Machine webhook sets e.g. the node deletion timeout on the next write, ours included).
async fn touch(mgmt: &Client, capi_version: &CapiVersion) -> Result<(), Error> {
    let version = capi_version.storage_version();
    for kind in ["Cluster", "MachineDeployment", "MachineSet", "Machine"] {
        let objects = api(mgmt, capi::GROUP, version, kind, NAMESPACE);
        for object in objects
            .list(&Default::default())
            .await
            .map_err(Error::Kube)?
        {
            let name = object.metadata.name.unwrap_or_default();
            objects
                .patch(&name, &PatchParams::default(), &Patch::Merge(json!({})))
                .await
                .map_err(Error::Kube)?;
        }
    }
    Ok(())
}

/// The managers of each field of `object`, as `manager (operation): fields` lines, to tell who
/// owns an annotation (e.g. the MachineSet controller's server-side apply).
pub fn field_managers(object: &DynamicObject) -> BTreeMap<String, String> {
    object
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|entry| {
            (
                format!(
                    "{} ({})",
                    entry.manager.clone().unwrap_or_default(),
                    entry.operation.clone().unwrap_or_default()
                ),
                entry
                    .fields_v1
                    .as_ref()
                    .map(|f| f.0.to_string())
                    .unwrap_or_default(),
            )
        })
        .collect()
}
