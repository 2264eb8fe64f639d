//! Event reasons and condition types. The `CertificatesRefresh*` Event reasons are the ones the
//! CK8s provider already emits; users' alerts match on them, so they are kept.

/// Event reasons on the Machine.
pub mod events {
    /// A refresh started (Normal).
    pub const REFRESH_IN_PROGRESS: &str = "CertificatesRefreshInProgress";
    /// A refresh succeeded, with the new expiry (Normal).
    pub const REFRESH_DONE: &str = "CertificatesRefreshDone";
    /// A refresh failed (the message is its error), or its request was withdrawn before it
    /// started (Warning).
    pub const REFRESH_FAILED: &str = "CertificatesRefreshFailed";
    /// A CSR of a worker's refresh did not pass the controller's check (requester, signer,
    /// usages, subject, SANs, lifetime, signature): nothing was approved, the seed's CSRs were
    /// denied, and the refresh planned again (Warning).
    pub const UNVERIFIED_CSR: &str = "UnverifiedCSR";
    /// The node signed a lifetime materially different from the requested one (Warning).
    pub const LIFETIME_MISMATCH: &str = "CertificatesLifetimeMismatch";
    /// A renewal policy holds a due renewal back: backoff, outside the windows, its staggered slot
    /// (Normal; Warning inside the fail-safe margin).
    pub const RENEWAL_DEFERRED: &str = "CertificatesRenewalDeferred";
    /// A renewal policy governs the Machine and its next renewal is not due yet (Normal).
    pub const RENEWAL_SCHEDULED: &str = "CertificatesRenewalScheduled";
    /// The governing policy disables automatic renewal (Normal; Warning inside the fail-safe
    /// margin).
    pub const RENEWAL_DISABLED: &str = "CertificatesRenewalDisabled";
    /// The governing policy, or several conflicting ones, cannot be applied (Warning).
    pub const RENEWAL_CONFIG_INVALID: &str = "CertificatesRenewalConfigInvalid";
    /// A worker that could not be refreshed in place was deleted so that its MachineSet creates
    /// a new one, as its renewal policy says (`inPlaceImpossible: Replace`); on the Machine and
    /// its Cluster (Warning).
    pub const MACHINE_REPLACED: &str = "CertificatesMachineReplaced";
    /// A worker's renewal policy asks to replace it, but the admission policy that lets only
    /// a user who may delete Machines ask that did not check the policy's last write (missing,
    /// or installed after it): nothing is deleted; once per reason (Warning).
    pub const MACHINE_REPLACE_REFUSED: &str = "CertificatesMachineReplaceRefused";
    /// A renewal runs outside the windows because expiry is within the fail-safe margin
    /// (Warning).
    pub const RENEWAL_WINDOW_BYPASSED: &str = "CertificatesRenewalWindowBypassed";
    /// On the Cluster: a certificate of the management kubeconfig (`<cluster>-kubeconfig`)
    /// expires within `--kubeconfig-expiry-warning` (Warning).
    pub const KUBECONFIG_EXPIRING: &str = "KubeconfigCertificateExpiring";
    /// On the Cluster: a certificate of the management kubeconfig has expired (Warning).
    pub const KUBECONFIG_EXPIRED: &str = "KubeconfigCertificateExpired";
    /// On the Cluster: Machines of the cluster record node certificates that have expired: the
    /// cluster went dark past its expiry (Warning).
    pub const CLUSTER_CERTIFICATES_EXPIRED: &str = "ClusterCertificatesExpired";
    /// On the Cluster: no Machine of a cluster that had expired certificates records one any
    /// more (Normal).
    pub const CLUSTER_CERTIFICATES_RECOVERED: &str = "ClusterCertificatesRecovered";
    /// On the Cluster: the cluster CA ends within `--ca-runway-warning`, or has ended; k8sd
    /// cannot rotate it (Warning).
    pub const CLUSTER_CA_ENDING: &str = "ClusterCAEnding";
    /// On the Cluster (`--renew-management-kubeconfig`): the client certificate was renewed in
    /// place (Normal).
    pub const KUBECONFIG_RENEWED: &str = "KubeconfigCertificateRenewed";
    /// On the Cluster: a dry run would have renewed the client certificate (Normal).
    pub const KUBECONFIG_WOULD_RENEW: &str = "KubeconfigCertificateWouldRenew";
    /// On the Cluster: the client certificate cannot be renewed, and why (Warning, once per new
    /// reason).
    pub const KUBECONFIG_NOT_RENEWED: &str = "KubeconfigCertificateNotRenewed";
    /// Reading the node's certificate expiry failed (other than the node still starting)
    /// (Warning).
    pub const EXPIRY_UNKNOWN: &str = "CertificatesExpiryUnknown";
    /// A trigger was not acted on: its owner applies it again after the refresh it asked for
    /// (a machine template, a GitOps tool) (Warning).
    pub const REFRESH_REFUSED: &str = "CertificatesRefreshRefused";
    /// On a CertificateRenewalPolicy: its circuit breaker opened, automatic renewals stopped
    /// (the failures listed) (Warning).
    pub const RENEWALS_HALTED: &str = "CertificatesRenewalsHalted";
    /// On a CertificateRenewalPolicy: a person resumed its automatic renewals (who) (Normal).
    pub const RENEWALS_RESUMED: &str = "CertificatesRenewalsResumed";
}

/// Condition types on MachineCertificates (positive polarity).
pub mod conditions {
    /// The node's certificates are known and no refresh has failed since the last success.
    pub const READY: &str = "Ready";
    /// A refresh is in flight.
    pub const REFRESHING: &str = "Refreshing";
    /// A due renewal is held back (backoff, outside the windows, its staggered slot). Not set
    /// while the renewal is simply not due: that is the healthy steady state.
    pub const RENEWAL_DEFERRED: &str = "RenewalDeferred";
    /// The policy disables automatic renewal.
    pub const RENEWAL_DISABLED: &str = "RenewalDisabled";
    /// The policy (or several conflicting ones) cannot be applied.
    pub const RENEWAL_CONFIG_INVALID: &str = "RenewalConfigInvalid";
    /// A renewal ran outside the windows because expiry was within the fail-safe margin; True
    /// until a later refresh succeeds (`status.lastWindowBypass`).
    pub const RENEWAL_WINDOW_BYPASSED: &str = "RenewalWindowBypassed";
    /// The policy is Automatic but has windows, which Automatic ignores.
    pub const WINDOWS_IGNORED: &str = "WindowsIgnored";
    /// A due renewal is more than a day past the instant its policy planned it for (its due
    /// time, moved into the windows and the spread), whatever holds it (failures and backoff,
    /// a pre-flight gate, a worker that cannot be refreshed in place); its reason is the
    /// verdict's, its transition time since when.
    pub const RENEWAL_OVERDUE: &str = "RenewalOverdue";
    /// The Machine's trigger is refused: its owner applies it again after each refresh.
    pub const TRIGGER_REFUSED: &str = "TriggerRefused";
}

/// Condition reasons.
pub mod condition_reasons {
    /// `Ready` True: the node's certificate expiry was read.
    pub const EXPIRY_KNOWN: &str = "ExpiryKnown";
    /// `Ready` False: the node's certificate expiry cannot be read.
    pub const EXPIRY_UNKNOWN: &str = "ExpiryUnknown";
    /// `Ready` False: the Machine has no node yet.
    pub const NO_NODE: &str = "WaitingForNode";
    /// `Ready`: the Machine or its Cluster is paused; nothing is done until it is unpaused.
    pub const PAUSED: &str = "Paused";
    /// `Ready` True after a refresh succeeded.
    pub const REFRESHED: &str = "Refreshed";
    /// `Ready` False: the last refresh failed.
    pub const REFRESH_FAILED: &str = "RefreshFailed";
    /// `Ready` False: a worker cannot be refreshed in place (the API server refused its own
    /// client certificate, `kubelet.conf`, which has expired): replace the Machine.
    pub const IN_PLACE_IMPOSSIBLE: &str = "InPlaceImpossible";
    /// `RenewalDeferred` True: a due renewal waits while a Machine of its cluster is being
    /// deleted (a pre-flight gate).
    pub const GATE_MACHINE_DELETING: &str = "MachineDeleting";
    /// `RenewalDeferred` True: … while a Machine of its cluster is to be remediated.
    pub const GATE_REMEDIATION_REQUESTED: &str = "RemediationRequested";
    /// `RenewalDeferred` True: … while a Machine of its cluster is upgraded in place.
    pub const GATE_IN_PLACE_UPGRADE: &str = "InPlaceUpgrade";
    /// `RenewalDeferred` True: … while a MachineDeployment of its cluster rolls out.
    pub const GATE_ROLLING_OUT: &str = "RollingOut";
    /// `RenewalDeferred` True: … while another control-plane Node of its cluster is not Ready
    /// (or a control-plane Machine has no Node yet), as the workload API shows it.
    pub const GATE_CONTROL_PLANE_NOT_READY: &str = "ControlPlaneNotReady";
    /// `RenewalDeferred` True: … while the workload API server's `/readyz` does not answer ok.
    pub const GATE_API_NOT_READY: &str = "ApiNotReady";
    /// `RenewalDeferred` True: the circuit breaker of the governing policy is open (automatic
    /// renewals failed too often); held until a person resumes the policy, fail-safe or not.
    pub const RENEWALS_HALTED: &str = "RenewalsHalted";
    /// `RenewalDeferred` True: a due renewal of a Machine that is not on a canary cluster of its
    /// policy waits for the canaries to renew first (`spec.canary`), until the policy's
    /// `maxWait` at the latest.
    pub const CANARIES_PENDING: &str = "CanariesPending";
    /// `RenewalDeferred` True: … waits because a canary's automatic renewal failed under the
    /// policy's current generation, until that canary renews.
    pub const CANARY_FAILED: &str = "CanaryFailed";
    /// The pre-flight gates, in the order they are told.
    pub const GATES: [&str; 6] = [
        GATE_MACHINE_DELETING,
        GATE_REMEDIATION_REQUESTED,
        GATE_IN_PLACE_UPGRADE,
        GATE_ROLLING_OUT,
        GATE_API_NOT_READY,
        GATE_CONTROL_PLANE_NOT_READY,
    ];
    /// `Refreshing` True: a refresh runs or waits.
    pub const REFRESH_IN_PROGRESS: &str = "RefreshInProgress";
    /// `Refreshing` False: no refresh in flight.
    pub const IDLE: &str = "Idle";
    /// `TriggerRefused` True: the trigger is applied again by the owner of the refresh it
    /// asked for.
    pub const REAPPLIED: &str = "ReappliedByOwner";
}
