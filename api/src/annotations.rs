//! Machine annotations. These keys are shared with the CK8s Cluster API provider and its users'
//! scripts: never rename them.

/// Requests a certificate refresh; the value is the new certificates' lifetime (e.g. `1y`).
/// Removed by the controller when the request has been handled.
pub const REFRESH_CERTIFICATES: &str = "v1beta2.k8sd.io/refresh-certificates";

/// Outcome of the last refresh request: one of [`RefreshStatus`]'s values.
pub const REFRESH_CERTIFICATES_STATUS: &str = "v1beta2.k8sd.io/refresh-certificates-status";

/// The node certificates' expiry, RFC 3339 in UTC. Upstream Cluster API key: CAPI copies it into
/// `Machine.status.certificatesExpiryDate` for control-plane Machines.
pub const CERTIFICATES_EXPIRY: &str = "machine.cluster.x-k8s.io/certificates-expiry";

/// The CK8s provider's in-place upgrade of a Machine (canonical/cluster-api-k8s,
/// `bootstrap/api/v1beta2/inplace_upgrade_consts.go`): `in-progress`, `done` or `failed`. While it
/// is in progress the upgrade restarts the services a refresh restarts.
pub const IN_PLACE_UPGRADE_STATUS: &str = "v1beta2.k8sd.io/in-place-upgrade-status";

/// [`IN_PLACE_UPGRADE_STATUS`] while the upgrade runs.
pub const IN_PLACE_UPGRADE_IN_PROGRESS: &str = "in-progress";

/// Set by ck8s-certs' admission webhook in the same write that sets or changes
/// [`REFRESH_CERTIFICATES`] (together with `in-progress`): the admission request's UID, which
/// names that request. The operation record keeps it, so a request re-added with the same TTL
/// after a refresh is told apart from the same request whose final patch did not land. Ours,
/// not shared with CK8s tooling.
pub const REFRESH_REQUEST: &str = "certificates.ck8s.io/refresh-request";

/// Set by ck8s-certs' admission webhook in the same write that sets or changes
/// [`REFRESH_CERTIFICATES`] (on a Machine, Cluster, MachineDeployment or CK8sControlPlane): the
/// username of who wrote it, as the API server authenticated them. The request made for the
/// trigger names that user (`spec.requester`). The `ck8s-certs-requests` admission policy
/// refuses any other write of it that names someone else than the writer. Ours.
pub const REQUESTER: &str = "certificates.ck8s.io/requester";

/// On a Machine, beside [`REFRESH_CERTIFICATES`]: `"true"` starts the refresh even while a
/// pre-flight gate of its cluster is closed (a Machine being deleted, a rollout, a control plane
/// not Ready…), which otherwise holds a manual refresh until it opens. The operation's note
/// records the gate it was forced past; removed with the trigger. Ours.
pub const FORCE_REFRESH: &str = "certificates.ck8s.io/force-refresh";

/// On a CertificateRenewalPolicy: resumes its automatic renewals after its circuit breaker
/// opened: each new value resumes once (`kubectl ck8s-certs resume` writes the time). Written
/// with [`REQUESTER`] naming who resumes (the requester-annotation admission policy lets it name
/// only the writer); the controller records both in the policy's status (`status.breaker`)
/// and leaves them.
pub const RESUME_RENEWALS: &str = "certificates.ck8s.io/resume-renewals";

/// On a Machine: the fleet `CertificateRefresh` its trigger was set by (the refresh is then of
/// origin Fleet and reported to that request); removed with the trigger. On a Cluster: the
/// request the Cluster's own trigger last created. Ours, not shared with CK8s tooling.
pub const FLEET_REQUEST: &str = "certificates.ck8s.io/fleet-request";

/// On a Machine: the `CertificateRefresh` that carries the refresh in flight. Set with
/// `in-progress` (in the write that takes the refresh up), removed with `done`/`failed`; the
/// request's status holds the refresh's seed and attempts, written before anything is sent to
/// the node, so a restart finds the refresh where it stopped. Ours, not shared with CK8s tooling.
pub const IN_FLIGHT_REFRESH: &str = "certificates.ck8s.io/certificate-refresh";

/// On a Cluster: the fleet request being created from its trigger (the first of two writes, so
/// that a restart in between creates that request, not a second one).
pub const FLEET_REQUEST_PENDING: &str = "certificates.ck8s.io/fleet-request-pending";

/// On a fleet `CertificateRefresh`: its final phase, set when it ends. `clusterctl move` does not
/// carry status; a moved request is known finished by this and never runs again.
pub const REQUEST_OUTCOME: &str = "certificates.ck8s.io/outcome";

/// Values of [`REFRESH_CERTIFICATES_STATUS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefreshStatus {
    InProgress,
    Done,
    Failed,
}

impl RefreshStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "in-progress",
            Self::Done => "done",
            Self::Failed => "failed",
        }
    }
}
