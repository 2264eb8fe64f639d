//! `MachineCertificates`: one per CK8s Machine (same name and namespace, owned by it). It is the
//! controller's memory for that Machine's node certificates: what expires when, which k8sd
//! certificate is trusted, and a copy of the last refresh operation finished.
//!
//! The operation in flight is journaled in the Machine's CertificateRefresh (the seed before
//! `run`), so after a crash the controller knows exactly which k8sd flow may be in flight and
//! never starts a second one by accident; its `Refreshing` condition here names that request.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "certificates.ck8s.io";
pub const VERSION: &str = "v1alpha1";

#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "certificates.ck8s.io",
    version = "v1alpha1",
    kind = "MachineCertificates",
    plural = "machinecertificates",
    singular = "machinecertificates",
    shortname = "mcerts",
    category = "cluster-api",
    namespaced,
    status = "MachineCertificatesStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterName"}"#,
    printcolumn = r#"{"name":"Role","type":"string","jsonPath":".status.role"}"#,
    printcolumn = r#"{"name":"Expiry","type":"string","jsonPath":".status.expiry"}"#,
    printcolumn = r#"{"name":"Refreshing","type":"string","jsonPath":".status.conditions[?(@.type==\"Refreshing\")].reason"}"#,
    printcolumn = r#"{"name":"Result","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Next Renewal","type":"string","jsonPath":".status.renewal.nextRenewalTime"}"#,
    printcolumn = r#"{"name":"Why","type":"string","jsonPath":".status.renewal.reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MachineCertificatesSpec {
    /// The Cluster the Machine belongs to (`Machine.spec.clusterName`).
    pub cluster_name: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineCertificatesStatus {
    /// ControlPlane or Worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,

    /// The workload-cluster Node of the Machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,

    /// When the node's certificates expire: the NotAfter reported by the last refresh, or
    /// k8sd's `certificates-expiry` before any refresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiry: Option<Time>,

    /// SHA-256 fingerprint of the node's k8sd serving certificate, pinned on first use. After a
    /// node reinstall, remove it (see the troubleshooting docs) to trust the new certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k8sd_fingerprint: Option<String>,

    /// The renewal policy governing this Machine and what it decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewal: Option<RenewalStatus>,

    /// Automatic renewals that failed since the last success (drives the backoff; any
    /// successful refresh resets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_attempts: Option<i64>,

    /// When the last automatic renewal failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_time: Option<Time>,

    /// The last automatic renewal that bypassed the maintenance windows (expiry was near), until
    /// a later refresh succeeds: the one event an operator must notice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_window_bypass: Option<WindowBypass>,

    /// A copy of the last refresh finished (the one in flight is in the CertificateRefresh the
    /// Machine names; an unfinished one here was written by an older version and is resumed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<Operation>,

    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A renewal policy's verdict for this Machine: which policy governs it, in which mode, and what
/// happens next. Rewritten at each verdict; the lasting records are `lastWindowBypass` and the
/// operation's `matchedWindow`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RenewalStatus {
    /// The governing CertificateRenewalPolicy (same namespace). Absent when several policies
    /// select this Machine (`conflictingPolicies`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_ref: Option<PolicyReference>,
    /// The governing policy's mode: Automatic, Scheduled or Disabled (absent when it cannot be
    /// read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The policies that all select this Machine: none of them renews it until exactly one does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicting_policies: Vec<String>,
    /// Whether the policy's maintenance windows can be used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<WindowsStatus>,
    /// RenewNow, NotDue, Staggered, Backoff, OutsideWindow, Disabled, ConfigInvalid.
    pub reason: String,
    /// The earliest instant a renewal will start if nothing changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_renewal_time: Option<Time>,
    pub message: String,
}

/// A CertificateRenewalPolicy of the Machine's namespace, as last read.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyReference {
    pub name: String,
    /// The policy's `metadata.generation` the verdict was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The governing policy's windows.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WindowsStatus {
    /// False when a window is invalid: no automatic renewal until it is fixed (`message`).
    pub valid: bool,
    /// How many windows the policy has (Automatic ignores them).
    pub count: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// An automatic renewal that started outside every maintenance window because expiry was
/// within the fail-safe margin. Kept until a later refresh succeeds.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WindowBypass {
    pub time: Time,
    /// The certificates' expiry at the time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiry: Option<Time>,
    pub message: String,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum Role {
    ControlPlane,
    Worker,
}

/// Who asked for a refresh.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum Origin {
    /// The `v1beta2.k8sd.io/refresh-certificates` annotation.
    Manual,
    /// A CertificateRenewalPolicy.
    Policy,
    /// A CertificateRefresh of the Machine's whole cluster.
    Fleet,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum Phase {
    /// Accepted; `plan` not yet answered (nothing has changed on the node).
    Pending,
    /// `run` may have been sent with `seed`; its outcome is not yet recorded.
    Running,
    Succeeded,
    Failed,
}

/// Who asked for a refresh, as the API server authenticated them: written at admission from
/// the request's `userInfo` (the user who wrote the trigger, or who created the request); a
/// client cannot set it to anyone but itself (the `ck8s-certs-requests` admission policy).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Requester {
    pub username: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

/// One refresh of one node.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    pub origin: Origin,
    /// The field manager that set the trigger annotation (e.g. `kubectl-annotate`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// The user who asked, as authenticated at admission (see [`Requester`]); absent where no
    /// admission webhook saw the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requester: Option<Requester>,
    /// The trigger annotation value this operation acts on. The trigger is removed only while it
    /// still holds this value, so a re-annotation with another TTL is not lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    /// The `certificates.ck8s.io/refresh-request` annotation the trigger came with (set by the
    /// admission webhook), which tells a new request with an equal TTL from this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// The fleet `CertificateRefresh` this refresh is part of (origin Fleet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<String>,
    /// Requested lifetime as written (e.g. `1y`).
    pub ttl: String,
    /// Requested lifetime in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<i64>,
    /// The seed k8sd's `plan` returned (an int64: never store it as a float).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    pub phase: Phase,
    /// How many times `run` was (or, after a crash, may have been) sent for this operation, each
    /// time with a new seed.
    #[serde(default)]
    pub run_attempts: u32,
    /// When the last seed was recorded, right before its `run` was sent. A `run` can take up to
    /// the run timeout on the node: another leader taking the operation over (a handover, a
    /// restart) does not plan again before that much time has passed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seeded_at: Option<Time>,
    pub started_at: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// The certificates' new NotAfter, as `run` reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_expiry: Option<Time>,
    /// What went wrong and what to do, for a failed operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Anything else worth knowing about the outcome (e.g. the node signed a longer lifetime
    /// than asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// For an automatic renewal under a Scheduled policy: the maintenance window it started in
    /// (`windows[i]` and its description).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_window: Option<String>,
    /// How the node's k8sd was reached: a port-forward through the workload API to its
    /// k8sd-proxy pod, or a direct connection (with why, e.g. the workload API server's
    /// certificate expired).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
    /// The renewal started outside every maintenance window because expiry was within the
    /// fail-safe margin (`status.lastWindowBypass` is kept until another refresh succeeds).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bypassed_windows: bool,
    /// The controller instance carrying the operation out, written with the seed before `run`
    /// is sent to the node. Another instance (another `--watch-filter` shard the Machine was moved to) does
    /// not take the operation over while this one still holds its Lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carrier: Option<Carrier>,
}

/// A controller instance: its leader-election Lease (which names the watch filter) and the
/// process holding that Lease.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Carrier {
    /// `<namespace>/<name>` of the Lease, e.g. `ck8s-certs-system/ck8s-certs-shard-a`.
    pub lease: String,
    /// The Lease's holder identity when the operation was taken up.
    pub holder: String,
}

impl Operation {
    /// A new operation, accepted at `now`, before anything is sent to the node.
    pub fn pending(
        origin: Origin,
        requested_by: Option<String>,
        trigger: Option<String>,
        ttl: String,
        ttl_seconds: i64,
        now: Time,
    ) -> Self {
        Self {
            origin,
            requested_by,
            requester: None,
            trigger,
            request: None,
            fleet: None,
            ttl,
            ttl_seconds: Some(ttl_seconds),
            seed: None,
            phase: Phase::Pending,
            run_attempts: 0,
            seeded_at: None,
            started_at: now,
            finished_at: None,
            new_expiry: None,
            error: None,
            note: None,
            matched_window: None,
            transport: None,
            bypassed_windows: false,
            carrier: None,
        }
    }

    pub fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Succeeded | Phase::Failed)
    }
}
