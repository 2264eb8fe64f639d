//! Reaching a simulated node's k8sd the way the controller does: find the node's `k8sd-proxy`
//! pod in the workload cluster and port-forward to it, or connect to the node address directly.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ck8s_certs::k8sd::client::Target;
use ck8s_certs::k8sd::{Connection, Fingerprint, K8sdError, Route, Token};
use ck8s_certs_api::k8sd::{
    CAPI_AUTH_TOKEN_HEADER, NODE_TOKEN_HEADER, PROXY_LABEL_SELECTOR, PROXY_NAMESPACE,
};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

use crate::fixtures::NodeInfo;
use crate::{Environment, Error};

pub const TIMEOUT: Duration = Duration::from_secs(10);

impl Environment {
    /// The port-forward route to `node`'s k8sd, found by label and `spec.nodeName` as a user's
    /// controller must (pod names are generated).
    pub async fn port_forward_route(&self, node: &NodeInfo) -> Result<Route, Error> {
        let client = self.cluster(&node.cluster).client().await?;
        let pods: Api<Pod> = Api::namespaced(client, PROXY_NAMESPACE);
        let list = pods
            .list(
                &ListParams::default()
                    .labels(PROXY_LABEL_SELECTOR)
                    .fields(&format!("spec.nodeName={}", node.node)),
            )
            .await
            .map_err(Error::Kube)?;
        let pod = list
            .items
            .into_iter()
            .find_map(|p| p.metadata.name)
            .ok_or_else(|| Error::Setup(format!("no k8sd-proxy pod on node {}", node.node)))?;
        Ok(Route::PortForward { pods, pod })
    }

    pub fn direct_route(node: &NodeInfo) -> Route {
        Route::Direct {
            address: SocketAddr::new(IpAddr::V4(node.address), node.microcluster_port),
        }
    }

    /// Opens a k8sd connection to `node` over `route` (trust on first use).
    pub async fn connect(
        &self,
        node: &NodeInfo,
        route: &Route,
        pin: Option<Fingerprint>,
    ) -> Result<Connection, K8sdError> {
        let target = Target {
            node: node.node.clone(),
            address: IpAddr::V4(node.address),
            port: node.microcluster_port,
        };
        Connection::open(target, route, pin, TIMEOUT).await
    }

    /// Port-forward connection, panicking on failure (test convenience).
    pub async fn k8sd(&self, node: &NodeInfo) -> Connection {
        let route = self
            .port_forward_route(node)
            .await
            .expect("k8sd-proxy route");
        self.connect(node, &route, None)
            .await
            .expect("k8sd connection")
    }

    /// The node token of `node`'s Machine, as the management Secret holds it.
    pub fn node_token(&self, node: &NodeInfo) -> Token {
        Token::new(self.cluster(&node.cluster).tokens.node_tokens[&node.machine].clone())
    }

    pub fn capi_auth_token(&self, cluster: &str) -> Token {
        Token::new(self.cluster(cluster).tokens.capi_auth_token.clone())
    }
}

/// The header names the endpoints authenticate with.
pub const NODE: &str = NODE_TOKEN_HEADER;
pub const CAPI: &str = CAPI_AUTH_TOKEN_HEADER;
