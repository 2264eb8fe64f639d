//! `ClusterCertificates`: one per Cluster the controller works on (same name and namespace, owned
//! by it). It shows the credential that usually expires first in a CK8s fleet: the client
//! certificate of the management cluster's `<cluster>-kubeconfig`, which the CK8s control-plane
//! provider issues for one year and does not rotate. When it expires, every refresh of the
//! cluster fails; this object (and a Warning Event on the Cluster, and a metric) says so ahead of
//! time.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "certificates.ck8s.io",
    version = "v1alpha1",
    kind = "ClusterCertificates",
    plural = "clustercertificates",
    singular = "clustercertificates",
    shortname = "ccerts",
    category = "cluster-api",
    namespaced,
    status = "ClusterCertificatesStatus",
    printcolumn = r#"{"name":"Kubeconfig Expiry","type":"string","jsonPath":".status.kubeconfig.clientCertificateExpiry"}"#,
    printcolumn = r#"{"name":"CA Expiry","type":"string","jsonPath":".status.kubeconfig.certificateAuthorityExpiry"}"#,
    printcolumn = r#"{"name":"Next Renewal","type":"string","priority":1,"jsonPath":".status.kubeconfig.nextRenewalTime"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterCertificatesSpec {
    /// The Cluster (same name; kept for `kubectl get` and selectors).
    pub cluster_name: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterCertificatesStatus {
    /// The management cluster's credential for the workload cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<KubeconfigStatus>,

    /// What the cluster's CK8s Machines record of their nodes' certificates
    /// (`machine.cluster.x-k8s.io/certificates-expiry`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodesStatus>,

    /// `Ready` (first): the kubeconfig is readable and its certificates are not within the
    /// warning horizon (`--kubeconfig-expiry-warning`) of expiry. Reasons: Valid, ExpiringSoon,
    /// Expired, Unreadable, Missing. `KubeconfigRenewal` (with `--renew-management-kubeconfig`
    /// only): whether the client certificate can be renewed in place; reasons in
    /// [`renewal_reasons`]. `CertificatesExpired`: True once a node's recorded certificates
    /// have expired (the cluster went dark past its expiry); reasons in [`expired_reasons`].
    /// `CARunway`: False once the cluster CA ends within `--ca-runway-warning`; reasons in
    /// [`runway_reasons`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KubeconfigStatus {
    /// `<namespace>/<cluster>-kubeconfig`.
    pub secret: String,
    /// NotAfter of the client certificate the kubeconfig authenticates with (absent when it
    /// authenticates otherwise, e.g. with a token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate_expiry: Option<Time>,
    /// NotAfter of the cluster CA the kubeconfig trusts (the latest, for a bundle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority_expiry: Option<Time>,
    /// NotAfter of the client CA (`<cluster>-cca`) that signs the client certificate: no
    /// renewal goes past it. Read only with `--renew-management-kubeconfig`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate_authority_expiry: Option<Time>,
    /// When the client certificate was last renewed in place (`--renew-management-kubeconfig`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_renewal_time: Option<Time>,
    /// When the client certificate is due for renewal (with `--renew-management-kubeconfig`
    /// only): half its lifetime before its end, or `--kubeconfig-renew-before`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_renewal_time: Option<Time>,
}

/// What a cluster's CK8s Machines record of their nodes' certificates.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodesStatus {
    /// The earliest `certificates-expiry` recorded on the cluster's CK8s Machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earliest_expiry: Option<Time>,
    /// The Machine that records it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earliest_machine: Option<String>,
    /// How many of the cluster's Machines record an expiry that has passed.
    #[serde(default)]
    pub expired: u32,
    /// How many record none (yet) or one that cannot be read.
    #[serde(default)]
    pub unknown: u32,
}

/// `Ready` condition reasons.
pub mod reasons {
    pub const VALID: &str = "Valid";
    pub const EXPIRING_SOON: &str = "ExpiringSoon";
    pub const EXPIRED: &str = "Expired";
    pub const UNREADABLE: &str = "Unreadable";
    pub const MISSING: &str = "Missing";
}

/// The condition type that says whether some of the cluster's node certificates have expired.
pub const CERTIFICATES_EXPIRED: &str = "CertificatesExpired";

/// `CertificatesExpired` condition reasons (and the reasons of its Events on the Cluster).
pub mod expired_reasons {
    /// False: no Machine of the cluster records an expiry that has passed.
    pub const NOT_EXPIRED: &str = "NotExpired";
    /// True: Machines of the cluster record certificates that expired (the message names the
    /// earliest, when, and how many).
    pub const NODE_CERTIFICATES_EXPIRED: &str = "NodeCertificatesExpired";
    /// True: the workload API server serves an expired certificate, found at the last
    /// kubeconfig check (`--kubeconfig-check-interval`), while no Machine records an expiry
    /// that has passed.
    pub const API_CERTIFICATE_EXPIRED: &str = "APIServerCertificateExpired";
}

/// The condition type that says whether the cluster CA has long enough to live: k8sd cannot
/// rotate a CA, so a cluster whose CA ends is beyond any in-place repair.
pub const CA_RUNWAY: &str = "CARunway";

/// `CARunway` condition reasons.
pub mod runway_reasons {
    /// True: the CA ends after `--ca-runway-warning` from now.
    pub const SUFFICIENT: &str = "Sufficient";
    /// False: the CA ends within `--ca-runway-warning`.
    pub const CA_ENDING_SOON: &str = "CAEndingSoon";
    /// False: the CA has ended.
    pub const CA_ENDED: &str = "CAEnded";
    /// Unknown: the kubeconfig cannot be read, or names no CA.
    pub const CA_UNKNOWN: &str = "CAUnknown";
}

/// The condition type that says whether the kubeconfig's client certificate is renewed in place.
pub const KUBECONFIG_RENEWAL: &str = "KubeconfigRenewal";

/// `KubeconfigRenewal` condition reasons (and the reasons of its Events).
pub mod renewal_reasons {
    /// True: the certificate is not due yet (`status.kubeconfig.nextRenewalTime`), also right
    /// after it was renewed (`status.kubeconfig.lastRenewalTime`).
    pub const NOT_DUE: &str = "NotDue";
    /// True, dry run: a certificate was issued and accepted by the workload API server, and not
    /// written.
    pub const WOULD_RENEW: &str = "WouldRenew";
    /// False: the Secret is not the CK8s control-plane provider's kubeconfig; left alone.
    pub const NOT_PROVIDER_SHAPE: &str = "NotProviderShape";
    /// False: `<cluster>-cca` is not there or has no `tls.crt`/`tls.key`.
    pub const CLIENT_CA_MISSING: &str = "ClientCAMissing";
    /// False: `<cluster>-cca` cannot sign (not a CA, key of another certificate, unreadable).
    pub const CLIENT_CA_UNUSABLE: &str = "ClientCAUnusable";
    /// False: the certificate held was not signed by `<cluster>-cca`.
    pub const OTHER_ISSUER: &str = "OtherIssuer";
    /// False: `client-key-data` is not the key of `client-certificate-data`. Whoever stored it
    /// does not hold the certificate's key; renewing would give them a key for its identity.
    pub const KEY_MISMATCH: &str = "KeyMismatch";
    /// False: `<cluster>-cca` ends too soon for a certificate worth issuing.
    pub const CLIENT_CA_ENDING: &str = "ClientCAEnding";
    /// False: the workload API server did not accept the new certificate; nothing was written.
    pub const NOT_ACCEPTED: &str = "NotAccepted";
    /// False: reading or writing a Secret failed, or it changed meanwhile (tried again a minute
    /// later at the soonest).
    pub const FAILED: &str = "RenewalFailed";
}
