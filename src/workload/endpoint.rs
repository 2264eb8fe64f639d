//! Where a node's k8sd is, as seen from its workload cluster.

use std::net::{IpAddr, SocketAddr};

use ck8s_certs_api::k8sd::{PROXY_LABEL_SELECTOR, PROXY_NAMESPACE};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::{Api, Client};

use super::WorkloadError;
use crate::k8sd::Route;
use crate::k8sd::client::Target;

/// How the controller reaches k8sd (`--k8sd-transport`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// Port-forward through the workload API server to the node's k8sd-proxy pod.
    #[default]
    PortForward,
    /// Connect to the node's InternalIP and microcluster port.
    Direct,
}

/// A node's k8sd endpoint.
pub struct Endpoint {
    pub target: Target,
    pub route: Route,
    pub ready: bool,
}

fn api_error(cluster: &str, what: String) -> impl FnOnce(kube::Error) -> WorkloadError + '_ {
    move |source| WorkloadError::Api {
        cluster: cluster.to_owned(),
        what,
        source,
    }
}

/// Resolves `node`'s endpoint in the workload cluster.
pub async fn resolve(
    client: &Client,
    cluster: &str,
    node: &str,
    microcluster_port: u16,
    transport: Transport,
) -> Result<Endpoint, WorkloadError> {
    // The Node and its k8sd-proxy pod are read at once (errors in that order).
    let nodes: Api<Node> = Api::all(client.clone());
    let proxy = async {
        match transport {
            Transport::Direct => Ok(None),
            Transport::PortForward => {
                let pods: Api<Pod> = Api::namespaced(client.clone(), PROXY_NAMESPACE);
                let params = ListParams::default()
                    .labels(PROXY_LABEL_SELECTOR)
                    .fields(&format!("spec.nodeName={node}"));
                let list = pods
                    .list(&params)
                    .await
                    .map_err(api_error(cluster, "k8sd-proxy pods".to_owned()))?;
                Ok(Some((pods, list)))
            }
        }
    };
    let (object, proxy) = futures::join!(nodes.get(node), proxy);
    let object = object.map_err(api_error(cluster, format!("Node {node}")))?;
    let proxy = proxy?;
    let status = object.status.unwrap_or_default();
    let address = status
        .addresses
        .unwrap_or_default()
        .into_iter()
        .find(|a| a.type_ == "InternalIP")
        .and_then(|a| a.address.parse::<IpAddr>().ok())
        .ok_or_else(|| {
            WorkloadError::Node(format!(
                "Node {node} of cluster {cluster} has no InternalIP address yet"
            ))
        })?;
    let ready = status
        .conditions
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let target = Target {
        node: node.to_owned(),
        address,
        port: microcluster_port,
    };
    let route = match proxy {
        None => Route::Direct {
            address: SocketAddr::new(address, microcluster_port),
        },
        Some((pods, list)) => {
            let pod = list
                .items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .and_then(|p| p.metadata.name)
                .ok_or_else(|| {
                    WorkloadError::Node(format!(
                        "no Running pod labelled {PROXY_LABEL_SELECTOR} in {PROXY_NAMESPACE} on node {node} of cluster {cluster}: \
                         the k8sd-proxy DaemonSet must run on every node"
                    ))
                })?;
            Route::PortForward { pods, pod }
        }
    };
    Ok(Endpoint {
        target,
        route,
        ready,
    })
}
