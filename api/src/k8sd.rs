//! Facts about the CK8s node daemon k8sd that both the controller and the tests depend on.
//! The wire protocol itself lives in the controller's `k8sd` module.

/// Port of the `k8sd-proxy` pod: always 2380, whatever the node's microcluster port.
pub const PROXY_POD_PORT: u16 = 2380;

/// Default microcluster (k8sd) port under Cluster API.
pub const DEFAULT_MICROCLUSTER_PORT: u16 = 2380;

/// Namespace and label of the `k8sd-proxy` DaemonSet's pods in a workload cluster.
pub const PROXY_NAMESPACE: &str = "kube-system";
pub const PROXY_LABEL_SELECTOR: &str = "app=k8sd-proxy";

/// Secret `<cluster>-token` in the management cluster: `node-token-<machine>` per node, `value`
/// for the cluster-wide `capi-auth-token`.
pub fn token_secret_name(cluster: &str) -> String {
    format!("{cluster}-token")
}

/// Key of a Machine's node token in [`token_secret_name`].
pub fn node_token_key(machine: &str) -> String {
    format!("node-token-{machine}")
}

/// Key of the cluster-wide CAPI auth token in [`token_secret_name`].
pub const CAPI_AUTH_TOKEN_KEY: &str = "value";

/// Request header carrying the per-machine token.
pub const NODE_TOKEN_HEADER: &str = "node-token";

/// Request header carrying the cluster-wide token (used by `approve`).
pub const CAPI_AUTH_TOKEN_HEADER: &str = "capi-auth-token";
