//! What a CK8s fleet under Cluster API looks like, as objects.
//!
//! Management cluster, per workload cluster: a Cluster, a MachineDeployment `<cluster>-md-0`
//! (its workers), a CK8sControlPlane `<cluster>-control-plane` (its control planes), Machines (control planes and workers,
//! labelled, owned by the Cluster, with a `CK8sConfig` bootstrap configRef and a `status.nodeRef`), their CK8sConfigs
//! (owned by the Machine), and the Secrets `<cluster>-kubeconfig` and `<cluster>-token`.
//! Workload cluster: a Ready Node per Machine (its own loopback InternalIP, kubelet port) and a
//! Running `k8sd-proxy` pod on each node. Machine and node names differ on purpose (the node is
//! named after its address, like cloud hostnames), so code that confuses them fails.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ck8s_certs_api::certificate_refresh::{
    CertificateRefresh, CertificateRefreshSpec, Origin, Target,
};
use ck8s_certs_api::{capi, k8sd};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::{Api, Client};
use rand::Rng;
use rand::distr::Alphanumeric;
use serde_json::json;

use crate::Error;
use crate::crds::CapiVersion;

pub const KUBELET_PORT: u16 = 10250;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    ControlPlane,
    Worker,
}

/// The shape of one workload cluster.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    pub name: String,
    pub namespace: String,
    /// Machines are named `<prefix>-cp-N` / `<prefix>-md-0-wN`; usually the cluster name, but two
    /// clusters in different namespaces may share it so that their Machines have equal names.
    pub machine_prefix: String,
    pub control_planes: usize,
    pub workers: usize,
    /// CK8sConfig `spec.controlPlane.microclusterPort`; `None` leaves it unset (k8sd on 2380).
    pub microcluster_port: Option<u16>,
    /// CK8sConfig `spec.controlPlane.extraSANs` of control-plane nodes.
    pub extra_sans: Vec<String>,
    /// Cluster `spec.controlPlaneEndpoint.host`.
    pub endpoint_host: String,
}

/// One simulated node and the Machine it belongs to.
#[derive(Clone, Debug, serde::Serialize)]
pub struct NodeInfo {
    pub cluster: String,
    pub namespace: String,
    pub machine: String,
    pub node: String,
    pub role: Role,
    pub address: Ipv4Addr,
    pub microcluster_port: u16,
    pub proxy_pod: String,
    pub config_name: String,
}

impl ClusterSpec {
    /// Machines and nodes of this cluster; `network` is the cluster's `127.E.C.0/24`.
    pub fn nodes(&self, env_octet: u8, cluster_octet: u8) -> Vec<NodeInfo> {
        let roles = std::iter::repeat_n(Role::ControlPlane, self.control_planes)
            .chain(std::iter::repeat_n(Role::Worker, self.workers));
        let mut counters = [0usize; 2];
        roles
            .enumerate()
            .map(|(i, role)| {
                let index = &mut counters[usize::from(role == Role::Worker)];
                let machine = match role {
                    Role::ControlPlane => format!("{}-cp-{index}", self.machine_prefix),
                    Role::Worker => format!("{}-md-0-w{index}", self.machine_prefix),
                };
                *index += 1;
                let address = Ipv4Addr::new(127, env_octet, cluster_octet, (i + 1) as u8);
                let [_, e, c, n] = address.octets();
                NodeInfo {
                    cluster: self.name.clone(),
                    namespace: self.namespace.clone(),
                    // Control-plane providers name the CK8sConfig after the Machine; MachineDeployments
                    // generate it from a template.
                    config_name: match role {
                        Role::ControlPlane => machine.clone(),
                        Role::Worker => format!("{machine}-{}", suffix()),
                    },
                    machine,
                    node: format!("ip-127-{e}-{c}-{n}"),
                    role,
                    address,
                    microcluster_port: self
                        .microcluster_port
                        .unwrap_or(k8sd::DEFAULT_MICROCLUSTER_PORT),
                    proxy_pod: format!("k8sd-proxy-{}", pod_suffix(address)),
                }
            })
            .collect()
    }
}

/// The version of the test environment's CK8sControlPlane CRD (`crds/`), the provider's.
pub const CK8S_CONTROL_PLANE_VERSION: &str = "v1beta2";

/// A cluster's CK8sControlPlane, and the `cluster.x-k8s.io/control-plane-name` of its control
/// planes.
pub fn control_plane_name(cluster: &str) -> String {
    format!("{cluster}-control-plane")
}

/// A CertificateRefresh of `target` for `1y`, as a user writes one by hand (origin `Manual`,
/// nothing else set), labelled for the controller with `filter`; callers set what else they
/// need before they create it.
pub fn manual_request(name: &str, target: Target, filter: &str) -> CertificateRefresh {
    let mut request = CertificateRefresh::new(
        name,
        CertificateRefreshSpec {
            target,
            ttl: "1y".into(),
            origin: Origin::Manual,
            requested_by: None,
            requester: None,
            max_parallel_workers: None,
            continue_on_failure: false,
            suspend: false,
        },
    );
    request.metadata.labels =
        Some([(capi::WATCH_FILTER_LABEL.to_owned(), filter.to_owned())].into());
    request
}

/// Five lowercase alphanumerics like a DaemonSet pod's, unique per node of an environment:
/// workload clusters may share a kube-apiserver (`kube-system` then holds thousands of proxy
/// pods), where random ones collide now and then.
fn pod_suffix(address: Ipv4Addr) -> String {
    let [_, _, cluster, node] = address.octets();
    let mut n = u32::from(cluster) << 8 | u32::from(node);
    let mut suffix = String::new();
    for _ in 0..5 {
        let digit = char::from_digit(n % 36, 36).unwrap_or('0');
        suffix.insert(0, digit);
        n /= 36;
    }
    suffix
}

/// Five lowercase alphanumerics, like generated names.
fn suffix() -> String {
    rand::rng()
        .sample_iter(Alphanumeric)
        .map(|c| (c as char).to_ascii_lowercase())
        .take(5)
        .collect()
}

/// 32 hex characters, the shape of k8sd tokens.
pub fn token() -> String {
    hex::encode(rand::rng().random::<[u8; 16]>())
}

fn dynamic_api(
    client: &Client,
    group: &str,
    version: &str,
    kind: &str,
    namespace: &str,
) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    Api::namespaced_with(client.clone(), namespace, &resource)
}

async fn create_dynamic(
    api: &Api<DynamicObject>,
    value: serde_json::Value,
) -> Result<DynamicObject, Error> {
    let object: DynamicObject =
        serde_json::from_value(value).map_err(|e| Error::Setup(e.to_string()))?;
    api.create(&PostParams::default(), &object)
        .await
        .map_err(Error::Kube)
}

/// A provisioned Machine's status, as CAPI's Machine controller writes it.
fn machine_status(v1beta2: bool, node: &NodeInfo) -> serde_json::Value {
    let node_ref = if v1beta2 {
        json!({ "name": node.node })
    } else {
        json!({ "apiVersion": "v1", "kind": "Node", "name": node.node })
    };
    json!({
        "nodeRef": node_ref,
        "phase": "Running",
        "addresses": [{ "type": "InternalIP", "address": node.address.to_string() }]
    })
}

/// Writes the status CAPI's controllers rebuild after `clusterctl move` (which does not carry
/// status): the Machines' (node) and the Cluster's (provisioned, control plane initialized: what
/// `clusterctl move` checks before it starts).
pub async fn write_provisioned_status(
    client: &Client,
    capi_version: &CapiVersion,
    cluster: &str,
    nodes: &[NodeInfo],
) -> Result<(), Error> {
    let version = capi_version.storage_version();
    let v1beta2 = version == "v1beta2";
    for node in nodes {
        let machines = dynamic_api(client, capi::GROUP, version, "Machine", &node.namespace);
        patch_status(&machines, &node.machine, machine_status(v1beta2, node)).await?;
    }
    let Some(namespace) = nodes.first().map(|n| n.namespace.as_str()) else {
        return Ok(());
    };
    let clusters = dynamic_api(client, capi::GROUP, version, "Cluster", namespace);
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let condition = json!({
        "type": "ControlPlaneInitialized", "status": "True", "reason": "Initialized",
        "message": "", "lastTransitionTime": now
    });
    let status = if v1beta2 {
        json!({ "initialization": { "infrastructureProvisioned": true, "controlPlaneInitialized": true }, "conditions": [condition] })
    } else {
        json!({ "infrastructureReady": true, "controlPlaneReady": true })
    };
    patch_status(&clusters, cluster, status).await
}

async fn patch_status(
    api: &Api<DynamicObject>,
    name: &str,
    status: serde_json::Value,
) -> Result<(), Error> {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .map_err(Error::Kube)?;
    Ok(())
}

pub async fn ensure_namespace(client: &Client, name: &str) -> Result<(), Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({ "metadata": { "name": name } }))
        .map_err(|e| Error::Setup(e.to_string()))?;
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(Error::Kube(e)),
    }
}

/// Tokens of one cluster, as stored in `<cluster>-token`.
#[derive(Clone, Debug)]
pub struct ClusterTokens {
    pub capi_auth_token: String,
    pub node_tokens: BTreeMap<String, String>,
}

/// Creates the management-cluster objects of one workload cluster.
pub async fn create_management_objects(
    client: &Client,
    capi_version: &CapiVersion,
    spec: &ClusterSpec,
    nodes: &[NodeInfo],
    workload_kubeconfig: &str,
    machine_annotations: &BTreeMap<String, String>,
    with_control_plane: bool,
) -> Result<ClusterTokens, Error> {
    let ns = spec.namespace.as_str();
    ensure_namespace(client, ns).await?;
    let version = capi_version.storage_version();
    let v1beta2 = version == "v1beta2";
    let cluster_label = json!({ capi::CLUSTER_NAME_LABEL: spec.name });

    let clusters = dynamic_api(client, capi::GROUP, version, "Cluster", ns);
    let cluster = create_dynamic(
        &clusters,
        json!({
            "apiVersion": format!("{}/{version}", capi::GROUP), "kind": "Cluster",
            "metadata": { "name": spec.name, "namespace": ns, "labels": cluster_label },
            "spec": {
                "controlPlaneEndpoint": { "host": spec.endpoint_host, "port": 6443 },
                "clusterNetwork": { "pods": { "cidrBlocks": ["10.1.0.0/16"] }, "services": { "cidrBlocks": ["10.152.183.0/24"] } }
            }
        }),
    )
    .await?;

    // Its workers' MachineDeployment (no controller acts on it: its Machines are made below).
    let deployment = format!("{}-md-0", spec.name);
    let (config_template, infra_template) = if v1beta2 {
        (
            json!({ "apiGroup": capi::CK8S_CONFIG_GROUP, "kind": "CK8sConfigTemplate", "name": deployment }),
            json!({ "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachineTemplate", "name": deployment }),
        )
    } else {
        (
            json!({ "apiVersion": format!("{}/{}", capi::CK8S_CONFIG_GROUP, capi::CK8S_CONFIG_VERSION), "kind": "CK8sConfigTemplate", "name": deployment }),
            json!({ "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerMachineTemplate", "name": deployment }),
        )
    };
    let deployment_labels =
        json!({ capi::CLUSTER_NAME_LABEL: spec.name, capi::DEPLOYMENT_NAME_LABEL: deployment });
    create_dynamic(
        &dynamic_api(client, capi::GROUP, version, "MachineDeployment", ns),
        json!({
            "apiVersion": format!("{}/{version}", capi::GROUP), "kind": "MachineDeployment",
            "metadata": {
                "name": deployment, "namespace": ns, "labels": { capi::CLUSTER_NAME_LABEL: spec.name },
                "ownerReferences": [{
                    "apiVersion": format!("{}/{version}", capi::GROUP), "kind": "Cluster",
                    "name": spec.name, "uid": cluster.metadata.uid
                }]
            },
            "spec": {
                "clusterName": spec.name,
                "replicas": spec.workers,
                "selector": { "matchLabels": deployment_labels },
                "template": {
                    "metadata": { "labels": deployment_labels },
                    "spec": {
                        "clusterName": spec.name,
                        "version": "v1.34.4",
                        "bootstrap": { "configRef": config_template },
                        "infrastructureRef": infra_template
                    }
                }
            }
        }),
    )
    .await?;

    // Its control planes' CK8sControlPlane.
    if with_control_plane {
        create_control_plane(client, spec, version, cluster.metadata.uid.as_deref()).await?;
    }

    let machines = dynamic_api(client, capi::GROUP, version, "Machine", ns);
    let configs = dynamic_api(
        client,
        capi::CK8S_CONFIG_GROUP,
        capi::CK8S_CONFIG_VERSION,
        capi::CK8S_CONFIG_KIND,
        ns,
    );
    for node in nodes {
        // As CAPI and the control plane provider label them.
        let mut labels = json!({ capi::CLUSTER_NAME_LABEL: spec.name });
        match node.role {
            Role::ControlPlane => {
                labels[capi::CONTROL_PLANE_LABEL] = json!("");
                labels[capi::CONTROL_PLANE_NAME_LABEL] = json!(control_plane_name(&spec.name));
            }
            Role::Worker => {
                labels[capi::DEPLOYMENT_NAME_LABEL] = json!(deployment);
            }
        }
        let (config_ref, infra_ref) = if v1beta2 {
            (
                json!({ "apiGroup": capi::CK8S_CONFIG_GROUP, "kind": capi::CK8S_CONFIG_KIND, "name": node.config_name }),
                json!({ "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": node.machine }),
            )
        } else {
            (
                json!({ "apiVersion": format!("{}/{}", capi::CK8S_CONFIG_GROUP, capi::CK8S_CONFIG_VERSION), "kind": capi::CK8S_CONFIG_KIND, "name": node.config_name, "namespace": ns }),
                json!({ "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerMachine", "name": node.machine, "namespace": ns }),
            )
        };
        let machine = create_dynamic(
            &machines,
            json!({
                "apiVersion": format!("{}/{version}", capi::GROUP), "kind": "Machine",
                "metadata": {
                    "name": node.machine, "namespace": ns, "labels": labels, "annotations": machine_annotations,
                    // As CAPI's Machine controller adopts a Machine that no MachineSet or control
                    // plane owns (`clusterctl move` follows these).
                    "ownerReferences": [{
                        "apiVersion": format!("{}/{version}", capi::GROUP), "kind": "Cluster",
                        "name": spec.name, "uid": cluster.metadata.uid
                    }]
                },
                "spec": {
                    "clusterName": spec.name,
                    "version": "v1.34.4",
                    "bootstrap": { "configRef": config_ref, "dataSecretName": node.config_name },
                    "infrastructureRef": infra_ref
                }
            }),
        )
        .await?;
        patch_status(&machines, &node.machine, machine_status(v1beta2, node)).await?;

        let mut control_plane = serde_json::Map::new();
        if let Some(port) = spec.microcluster_port {
            control_plane.insert("microclusterPort".into(), json!(port));
        }
        if node.role == Role::ControlPlane && !spec.extra_sans.is_empty() {
            control_plane.insert("extraSANs".into(), json!(spec.extra_sans));
        }
        create_dynamic(
            &configs,
            json!({
                "apiVersion": format!("{}/{}", capi::CK8S_CONFIG_GROUP, capi::CK8S_CONFIG_VERSION), "kind": capi::CK8S_CONFIG_KIND,
                "metadata": {
                    "name": node.config_name, "namespace": ns,
                    "labels": { capi::CLUSTER_NAME_LABEL: spec.name },
                    "ownerReferences": [{
                        "apiVersion": format!("{}/{version}", capi::GROUP), "kind": "Machine",
                        "name": node.machine, "uid": machine.metadata.uid, "controller": true, "blockOwnerDeletion": true
                    }]
                },
                "spec": { "controlPlane": control_plane, "files": [] }
            }),
        )
        .await?;
    }

    let tokens = ClusterTokens {
        capi_auth_token: token(),
        node_tokens: nodes.iter().map(|n| (n.machine.clone(), token())).collect(),
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let mut token_data: BTreeMap<String, String> = tokens
        .node_tokens
        .iter()
        .map(|(m, t)| (k8sd::node_token_key(m), t.clone()))
        .collect();
    token_data.insert(
        k8sd::CAPI_AUTH_TOKEN_KEY.into(),
        tokens.capi_auth_token.clone(),
    );
    for (name, data) in [
        (
            capi::kubeconfig_secret_name(&spec.name),
            BTreeMap::from([(
                capi::KUBECONFIG_SECRET_KEY.to_owned(),
                workload_kubeconfig.to_owned(),
            )]),
        ),
        (k8sd::token_secret_name(&spec.name), token_data),
    ] {
        // Owned as the CK8s control plane provider owns them (through its control plane object,
        // itself owned by the Cluster): `clusterctl move` takes them along.
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": ns, "labels": { capi::CLUSTER_NAME_LABEL: spec.name },
                "ownerReferences": [{
                    "apiVersion": format!("{}/{version}", capi::GROUP), "kind": "Cluster",
                    "name": spec.name, "uid": cluster.metadata.uid, "controller": true
                }]
            },
            "type": "cluster.x-k8s.io/secret",
            "stringData": data
        }))
        .map_err(|e| Error::Setup(e.to_string()))?;
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .map_err(Error::Kube)?;
    }
    Ok(tokens)
}

/// Creates the workload-cluster objects: Nodes and `k8sd-proxy` pods with their status set
/// through the status subresource (no kubelet or scheduler runs).
pub async fn create_workload_objects(client: &Client, nodes: &[NodeInfo]) -> Result<(), Error> {
    let node_api: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), k8sd::PROXY_NAMESPACE);
    let now = jiff::Timestamp::now().to_string();
    for node in nodes {
        let mut labels =
            json!({ "kubernetes.io/hostname": node.node, "kubernetes.io/os": "linux" });
        if node.role == Role::ControlPlane {
            labels["node-role.kubernetes.io/control-plane"] = json!("");
        }
        let object: Node =
            serde_json::from_value(json!({ "metadata": { "name": node.node, "labels": labels } }))
                .map_err(|e| Error::Setup(e.to_string()))?;
        node_api
            .create(&PostParams::default(), &object)
            .await
            .map_err(Error::Kube)?;
        node_api
            .patch_status(
                &node.node,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": {
                    "addresses": [
                        { "type": "InternalIP", "address": node.address.to_string() },
                        { "type": "Hostname", "address": node.node }
                    ],
                    "daemonEndpoints": { "kubeletEndpoint": { "Port": KUBELET_PORT } },
                    "conditions": [{
                        "type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": now, "lastTransitionTime": now
                    }],
                    "nodeInfo": {
                        "kubeletVersion": "v1.34.4", "kubeProxyVersion": "v1.34.4", "osImage": "Ubuntu 24.04 LTS",
                        "architecture": "amd64", "operatingSystem": "linux", "containerRuntimeVersion": "containerd://1.7.28",
                        "kernelVersion": "6.8.0", "machineID": "", "systemUUID": "", "bootID": ""
                    }
                }})),
            )
            .await
            .map_err(Error::Kube)?;

        let pod: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": node.proxy_pod, "namespace": k8sd::PROXY_NAMESPACE,
                "labels": { "app": "k8sd-proxy" }
            },
            "spec": {
                "nodeName": node.node,
                "hostNetwork": true,
                "containers": [{
                    "name": "k8sd-proxy",
                    "image": "ghcr.io/canonical/k8s-snap/k8sd-proxy:latest",
                    "ports": [{ "containerPort": k8sd::PROXY_POD_PORT, "name": "k8sd" }]
                }]
            }
        }))
        .map_err(|e| Error::Setup(e.to_string()))?;
        pods.create(&PostParams::default(), &pod)
            .await
            .map_err(Error::Kube)?;
        pods.patch_status(
            &node.proxy_pod,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": {
                "phase": "Running",
                "hostIP": node.address.to_string(),
                "podIP": node.address.to_string(),
                "startTime": now,
                "conditions": [
                    { "type": "Ready", "status": "True", "lastTransitionTime": now },
                    { "type": "ContainersReady", "status": "True", "lastTransitionTime": now }
                ]
            }})),
        )
        .await
        .map_err(Error::Kube)?;
    }
    Ok(())
}

/// The CK8sControlPlane `<cluster>-control-plane` of a cluster, labelled and owned (by its
/// Cluster `uid`, in `capi_version`) as CAPI's Cluster controller does with the control plane it
/// references (no controller acts on it).
pub async fn create_control_plane(
    client: &Client,
    spec: &ClusterSpec,
    capi_version: &str,
    uid: Option<&str>,
) -> Result<(), Error> {
    let ns = spec.namespace.as_str();
    create_dynamic(
        &dynamic_api(
            client,
            capi::CONTROL_PLANE_GROUP,
            CK8S_CONTROL_PLANE_VERSION,
            capi::CK8S_CONTROL_PLANE_KIND,
            ns,
        ),
        json!({
            "apiVersion": format!("{}/{CK8S_CONTROL_PLANE_VERSION}", capi::CONTROL_PLANE_GROUP),
            "kind": capi::CK8S_CONTROL_PLANE_KIND,
            "metadata": {
                "name": control_plane_name(&spec.name), "namespace": ns,
                "labels": { capi::CLUSTER_NAME_LABEL: spec.name },
                "ownerReferences": [{
                    "apiVersion": format!("{}/{capi_version}", capi::GROUP), "kind": "Cluster",
                    "name": spec.name, "uid": uid, "controller": true
                }]
            },
            "spec": { "replicas": spec.control_planes, "version": "v1.34.4" }
        }),
    )
    .await?;
    Ok(())
}
