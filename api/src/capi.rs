//! Cluster API names we read. We never own Machines or Clusters: we read them and patch only
//! the annotation keys of [`crate::annotations`].

/// API group of Cluster API core objects (Cluster, Machine).
pub const GROUP: &str = "cluster.x-k8s.io";

/// Machine / Cluster API versions, newest first. v1beta2 is served from CAPI v1.11 on; older
/// management clusters (v1.9, v1.10) only serve v1beta1.
pub const VERSIONS: [&str; 2] = ["v1beta2", "v1beta1"];

/// Label on every Machine naming its Cluster.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";

/// Label present (any value) on control-plane Machines.
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";

/// Label CAPI sets on the Machines of a MachineDeployment: its name.
pub const DEPLOYMENT_NAME_LABEL: &str = "cluster.x-k8s.io/deployment-name";

/// Label control plane providers set on their Machines: the control plane object's name.
pub const CONTROL_PLANE_NAME_LABEL: &str = "cluster.x-k8s.io/control-plane-name";

/// Asks Cluster API to remediate a Machine (as a MachineHealthCheck would): its owner replaces it.
pub const REMEDIATE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/remediate-machine";

/// Annotation that pauses reconciliation of a CAPI object (the same as `Cluster.spec.paused`).
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";

/// clusterctl's annotation: `clusterctl move` pauses the Cluster, then waits until no object it
/// moves carries this. We set it on a Machine while its refresh runs on the node, and on a fleet
/// `CertificateRefresh` until it ends (a move does not carry status, so its progress would be
/// lost).
pub const BLOCK_MOVE_ANNOTATION: &str = "clusterctl.cluster.x-k8s.io/block-move";

/// Our value of [`BLOCK_MOVE_ANNOTATION`]: we remove the annotation only when it is ours.
pub const BLOCK_MOVE_OWNER: &str = "ck8s-certs";

/// Set by `clusterctl move` on each object it is about to delete from the source management
/// cluster: a Machine carrying it is treated as being deleted (nothing starts, nothing is
/// created for it).
pub const DELETE_FOR_MOVE_ANNOTATION: &str = "clusterctl.cluster.x-k8s.io/delete-for-move";

/// clusterctl's label on a CRD whose objects `clusterctl move` moves even when no Cluster owns
/// them (renewal policies).
pub const CLUSTERCTL_MOVE_LABEL: &str = "clusterctl.cluster.x-k8s.io/move";

/// Label selecting which controller instance handles an object (`--watch-filter`).
pub const WATCH_FILTER_LABEL: &str = "cluster.x-k8s.io/watch-filter";

/// Label naming the provider on every object a provider installs.
pub const PROVIDER_LABEL: &str = "cluster.x-k8s.io/provider";

/// Secret `<cluster>-kubeconfig`, key `value`: the workload cluster's admin kubeconfig.
pub fn kubeconfig_secret_name(cluster: &str) -> String {
    format!("{cluster}-kubeconfig")
}

/// Key of the kubeconfig in [`kubeconfig_secret_name`].
pub const KUBECONFIG_SECRET_KEY: &str = "value";

/// The CK8s control-plane provider's client CA of a cluster (`tls.crt`, `tls.key`): it signs
/// the client certificate of `<cluster>-kubeconfig` and is the workload API server's
/// `--client-ca-file`.
pub fn client_ca_secret_name(cluster: &str) -> String {
    format!("{cluster}-cca")
}

/// API group, kind and plural of the CK8s control plane provider's control plane object. Its
/// version is discovered at start (the kind is optional: without it, the control-plane object's
/// trigger is off).
pub const CONTROL_PLANE_GROUP: &str = "controlplane.cluster.x-k8s.io";
pub const CK8S_CONTROL_PLANE_KIND: &str = "CK8sControlPlane";
pub const CK8S_CONTROL_PLANE_PLURAL: &str = "ck8scontrolplanes";

/// API group / version / kind of the CK8s bootstrap config that marks a Machine as a CK8s one.
pub const CK8S_CONFIG_GROUP: &str = "bootstrap.cluster.x-k8s.io";
pub const CK8S_CONFIG_VERSION: &str = "v1beta2";
pub const CK8S_CONFIG_KIND: &str = "CK8sConfig";
