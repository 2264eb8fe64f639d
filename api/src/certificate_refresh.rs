//! `CertificateRefresh`: one refresh, of one Machine or of a whole cluster.
//!
//! - **Fleet requests** (`target.cluster`) are created by `kubectl annotate cluster <c>
//!   v1beta2.k8sd.io/refresh-certificates=<ttl>` (or by hand). The fleet controller refreshes
//!   the cluster's control planes one at a time, each waiting until its node and the cluster API
//!   answer again, then the workers, at most `maxParallelWorkers` at once; it stops at the first
//!   failure unless `continueOnFailure`. `suspend` pauses it between Machines; deleting the
//!   request cancels the Machines that have not started.
//! - **Machine records** (`target.machine`): every refresh of a Machine, whatever started it,
//!   leaves one, owned by the Machine; the last `--refresh-history` finished ones per Machine are
//!   kept, so `kubectl get certificaterefreshes -n <ns>` is the audit trail.
//!
//! The spec is immutable but for `suspend`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::machine_certificates::{Operation, Origin, Requester, Role};

/// Worker refreshes at once of a fleet request, when `maxParallelWorkers` is not set.
pub const DEFAULT_MAX_PARALLEL_WORKERS: u32 = 2;

#[derive(CustomResource, KubeSchema, Clone, Debug, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "certificates.ck8s.io",
    version = "v1alpha1",
    kind = "CertificateRefresh",
    plural = "certificaterefreshes",
    singular = "certificaterefresh",
    shortname = "crefresh",
    category = "cluster-api",
    namespaced,
    doc = "One certificate refresh: of one Machine (a record kept as history, whatever started the refresh), or of every Machine of a Cluster (control planes one at a time, then workers).",
    status = "CertificateRefreshStatus",
    printcolumn = r#"{"name":"Machine","type":"string","jsonPath":".spec.target.machine"}"#,
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.target.cluster"}"#,
    printcolumn = r#"{"name":"TTL","type":"string","jsonPath":".spec.ttl"}"#,
    printcolumn = r#"{"name":"Origin","type":"string","jsonPath":".spec.origin"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Done","type":"string","jsonPath":".status.progress"}"#,
    printcolumn = r#"{"name":"New Expiry","type":"string","jsonPath":".status.newExpiry","priority":1}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.message","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(
    validation = Rule::new("self.target == oldSelf.target && self.ttl == oldSelf.ttl && self.origin == oldSelf.origin && self.continueOnFailure == oldSelf.continueOnFailure && has(self.requestedBy) == has(oldSelf.requestedBy) && (!has(self.requestedBy) || self.requestedBy == oldSelf.requestedBy) && has(self.requester) == has(oldSelf.requester) && (!has(self.requester) || self.requester == oldSelf.requester) && has(self.maxParallelWorkers) == has(oldSelf.maxParallelWorkers) && (!has(self.maxParallelWorkers) || self.maxParallelWorkers == oldSelf.maxParallelWorkers)")
        .message("a CertificateRefresh cannot be changed once created, except spec.suspend; create a new one")
        .reason(Reason::FieldValueForbidden)
)]
#[serde(rename_all = "camelCase")]
pub struct CertificateRefreshSpec {
    /// What to refresh: one Machine, or every CK8s Machine of a Cluster, a MachineDeployment, a
    /// control plane or a label selector (of this namespace).
    pub target: Target,
    /// How long the new certificates are valid, such as `1y` or `90d` (what the
    /// `v1beta2.k8sd.io/refresh-certificates` annotation takes).
    #[schemars(length(min = 1, max = 32))]
    pub ttl: String,
    /// What started the refresh: Manual (an annotation, on a Machine or on a cluster,
    /// MachineDeployment or control plane, or a request made by hand), Policy (a
    /// CertificateRenewalPolicy; Machine records only) or Fleet (the record of a Machine refreshed
    /// for a fleet request).
    pub origin: Origin,
    /// Who asked: the field manager that set the annotation (e.g. `kubectl-annotate`), the
    /// policy (`CertificateRenewalPolicy/<name>`) or the fleet request
    /// (`CertificateRefresh/<name>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// The user who asked, as the API server authenticated them. Written at admission from who
    /// creates the request (leave it out); the controller writes the user who set the trigger.
    /// Nobody else may name anyone but themselves, and it never changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requester: Option<Requester>,
    /// Fleet requests: worker refreshes at once (control planes are always one at a time).
    /// Default 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub max_parallel_workers: Option<u32>,
    /// Fleet requests: carry on with the other Machines after one fails (default false: stop at
    /// the first failure; Machines already running finish).
    #[serde(default)]
    pub continue_on_failure: bool,
    /// Fleet requests: true pauses between Machines (those running finish); false resumes.
    #[serde(default)]
    pub suspend: bool,
}

#[derive(KubeSchema, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[x_kube(
    validation = Rule::new("[has(self.machine), has(self.cluster), has(self.machineDeployment), has(self.controlPlane), has(self.selector)].filter(x, x).size() == 1")
        .message("set exactly one of machine, cluster, machineDeployment, controlPlane and selector")
        .reason(Reason::FieldValueInvalid)
)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// One Machine of this namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// Every CK8s Machine of this Cluster of this namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// Every CK8s Machine of this MachineDeployment of this namespace (the Machines labelled
    /// `cluster.x-k8s.io/deployment-name=<name>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_deployment: Option<String>,
    /// Every CK8s Machine of this control plane object (e.g. a CK8sControlPlane) of this
    /// namespace (the Machines labelled `cluster.x-k8s.io/control-plane-name=<name>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<String>,
    /// Every CK8s Machine of this namespace whose labels match; they must all belong to one
    /// Cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CertificateRefreshStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<RequestPhase>,
    /// One entry per Machine, in the order they are refreshed (control planes first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machines: Vec<MachineProgress>,
    /// Finished Machines of all, e.g. `3/7`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Machine records: the new certificates' expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_expiry: Option<Time>,
    /// What happened, in words; for a failure, what went wrong and what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Machine requests: the refresh of the node as it is carried out. Its seed is written here
    /// before `run` is sent (with the instance carrying it out), so after a crash the controller
    /// knows which k8sd flow may be in flight and never starts a second one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<Operation>,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum RequestPhase {
    /// Accepted, waiting: for another fleet request of the cluster to end.
    Pending,
    Running,
    /// `spec.suspend`: no Machine starts until it is false again.
    Suspended,
    Succeeded,
    /// Refused before anything started (bad TTL, nothing to refresh), or a Machine failed.
    Failed,
}

impl RequestPhase {
    pub fn is_finished(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Suspended => "Suspended",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
        }
    }

    /// A finished phase by name (the [`crate::annotations::REQUEST_OUTCOME`] annotation).
    pub fn finished_from(name: &str) -> Option<Self> {
        [Self::Succeeded, Self::Failed]
            .into_iter()
            .find(|p| p.as_str() == name)
    }
}

impl CertificateRefresh {
    /// The phase it ended in: from the status, or, when the status is gone (`clusterctl move`
    /// does not carry it), from the [`crate::annotations::REQUEST_OUTCOME`] annotation.
    pub fn outcome(&self) -> Option<RequestPhase> {
        self.status
            .as_ref()
            .and_then(|s| s.phase)
            .filter(|p| p.is_finished())
            .or_else(|| {
                self.metadata
                    .annotations
                    .as_ref()?
                    .get(crate::annotations::REQUEST_OUTCOME)
                    .and_then(|name| RequestPhase::finished_from(name))
            })
    }

    pub fn is_finished(&self) -> bool {
        self.outcome().is_some()
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineProgress {
    pub name: String,
    pub role: Role,
    pub phase: MachinePhase,
    /// When the Machine was handed its refresh (the trigger annotation set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_expiry: Option<Time>,
    /// Why it failed or was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum MachinePhase {
    Pending,
    Running,
    Succeeded,
    Failed,
    /// Not refreshed: the Machine went away, or the request stopped at a failure first.
    Skipped,
}

impl MachinePhase {
    pub fn is_finished(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Skipped)
    }
}

/// Labels of requests, for selecting a Machine's history and a cluster's fleet requests.
pub mod labels {
    /// The Machine a record is of.
    pub const MACHINE: &str = "certificates.ck8s.io/machine";
    /// The fleet request a Machine's refresh belongs to.
    pub const FLEET: &str = "certificates.ck8s.io/fleet-request";

    /// The value of [`MACHINE`] or [`FLEET`] for an object named `name`: the name when it is a
    /// valid label value, else a readable prefix and a hash of the whole name
    /// ([`crate::names::fit`]), so every valid name of any length selects its own records.
    pub fn value(name: &str) -> String {
        crate::names::fit(name, crate::names::LABEL_VALUE_MAX)
    }
}
