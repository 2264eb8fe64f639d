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
    move |source| WorkloadError::api(cluster, what, source)
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
    let (pods, list) = match proxy {
        Some((pods, list)) => (Some(pods), Some(list.items)),
        None => (None, None),
    };
    let located = located(object, list, cluster, node)?;
    let target = Target {
        node: node.to_owned(),
        address: located.address,
        port: microcluster_port,
    };
    let route = match (pods, located.pod) {
        (Some(pods), Some(pod)) => Route::PortForward { pods, pod },
        _ => Route::Direct {
            address: SocketAddr::new(located.address, microcluster_port),
        },
    };
    Ok(Endpoint {
        target,
        route,
        ready: located.ready,
    })
}

/// `node`'s k8sd reached directly at the InternalIP its Machine reports (`status.addresses`,
/// the infrastructure provider's), for when the workload API cannot be used: its serving
/// certificate expired, so neither the Node nor a port-forward is there to be had.
pub fn direct_from_machine(
    machine: &serde_json::Value,
    node: &str,
    microcluster_port: u16,
) -> Result<Endpoint, WorkloadError> {
    let address = machine
        .pointer("/status/addresses")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter(|a| a.get("type").and_then(serde_json::Value::as_str) == Some("InternalIP"))
        .find_map(|a| a.get("address")?.as_str()?.parse::<IpAddr>().ok())
        .ok_or_else(|| {
            WorkloadError::Node(format!(
                "the Machine of node {node} reports no InternalIP in status.addresses, so its k8sd cannot be reached directly"
            ))
        })?;
    Ok(Endpoint {
        target: Target {
            node: node.to_owned(),
            address,
            port: microcluster_port,
        },
        route: Route::Direct {
            address: SocketAddr::new(address, microcluster_port),
        },
        ready: true,
    })
}

/// What a Node and its k8sd-proxy pods (read through a port-forward transport) say about where
/// its k8sd is.
#[derive(Debug, PartialEq, Eq)]
pub struct Located {
    /// The node's InternalIP.
    pub address: IpAddr,
    /// Its Running k8sd-proxy pod, when the pods were read.
    pub pod: Option<String>,
    pub ready: bool,
}

/// Where `node`'s k8sd is, from its Node object and, for a port-forward, its k8sd-proxy pods.
/// Pure: both are the workload API server's answers (a tenant's), read as they came.
pub fn located(
    object: Node,
    pods: Option<Vec<Pod>>,
    cluster: &str,
    node: &str,
) -> Result<Located, WorkloadError> {
    let status = object.status.unwrap_or_default();
    let address = status
        .addresses
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.type_ == "InternalIP")
        .find_map(|a| a.address.parse::<IpAddr>().ok())
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
    let pod = match pods {
        None => None,
        Some(items) => Some(
            items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .and_then(|p| p.metadata.name)
                .ok_or_else(|| {
                    WorkloadError::Node(format!(
                        "no Running pod labelled {PROXY_LABEL_SELECTOR} in {PROXY_NAMESPACE} on node {node} of cluster {cluster}: \
                         the k8sd-proxy DaemonSet must run on every node"
                    ))
                })?,
        ),
    };
    Ok(Located {
        address,
        pod,
        ready,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(status: serde_json::Value) -> Node {
        serde_json::from_value(
            serde_json::json!({ "metadata": { "name": "w0" }, "status": status }),
        )
        .expect("a Node")
    }

    fn pod(name: &str, phase: &str, deleting: bool) -> Pod {
        let mut pod =
            serde_json::json!({ "metadata": { "name": name }, "status": { "phase": phase } });
        if deleting {
            pod["metadata"]["deletionTimestamp"] = serde_json::json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(pod).expect("a Pod")
    }

    #[test]
    fn the_internal_ip_ready_and_a_running_proxy_pod_that_is_not_going_away() {
        let status = serde_json::json!({
            "addresses": [
                { "type": "Hostname", "address": "w0" },
                { "type": "InternalIP", "address": "not an address" },
                { "type": "InternalIP", "address": "10.0.0.7" },
            ],
            "conditions": [{ "type": "Ready", "status": "True" }],
        });
        let pods = vec![
            pod("old", "Running", true),
            pod("pending", "Pending", false),
            pod("proxy", "Running", false),
        ];
        let located = located(node(status), Some(pods), "c", "w0").expect("located");
        assert_eq!(
            located,
            Located {
                address: "10.0.0.7".parse().expect("an address"),
                pod: Some("proxy".into()),
                ready: true,
            }
        );
    }

    #[test]
    fn a_machine_s_first_parseable_internal_ip_is_the_direct_route() {
        let machine = serde_json::json!({ "status": { "addresses": [
            { "type": "ExternalIP", "address": "203.0.113.9" },
            { "type": "InternalIP", "address": "bad" },
            { "type": "InternalIP", "address": "10.0.0.8" },
        ]}});
        let endpoint = direct_from_machine(&machine, "cp-1", 6400).expect("an endpoint");
        assert_eq!(
            endpoint.route.to_string(),
            "direct connection to 10.0.0.8:6400"
        );
        assert_eq!(endpoint.target.port, 6400);
        let none = direct_from_machine(&serde_json::json!({ "status": {} }), "cp-1", 6400)
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            none.as_deref(),
            Some(
                "the Machine of node cp-1 reports no InternalIP in status.addresses, so its k8sd cannot be reached directly"
            )
        );
    }

    #[test]
    fn no_address_or_no_running_proxy_pod_is_said_plainly() {
        let none = located(node(serde_json::json!({})), None, "c", "w0").unwrap_err();
        assert_eq!(
            none.to_string(),
            "Node w0 of cluster c has no InternalIP address yet"
        );
        let status =
            serde_json::json!({ "addresses": [{ "type": "InternalIP", "address": "10.0.0.7" }] });
        let gone = located(
            node(status.clone()),
            Some(vec![pod("p", "Running", true)]),
            "c",
            "w0",
        );
        assert!(
            gone.unwrap_err()
                .to_string()
                .contains("no Running pod labelled")
        );
        // Direct: no pods read, not Ready without the condition.
        let direct = located(node(status), None, "c", "w0").expect("located");
        assert_eq!((direct.pod, direct.ready), (None, false));
    }
}
