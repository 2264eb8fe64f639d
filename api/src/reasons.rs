//! Event reasons and condition types. The `CertificatesRefresh*` Event reasons are the ones the
//! CK8s provider already emits; users' alerts match on them, so they are kept.

/// Event reasons on the Machine.
pub mod events {
    pub const REFRESH_IN_PROGRESS: &str = "CertificatesRefreshInProgress";
    pub const REFRESH_DONE: &str = "CertificatesRefreshDone";
    pub const REFRESH_FAILED: &str = "CertificatesRefreshFailed";
    /// The node signed a lifetime materially different from the requested one.
    pub const LIFETIME_MISMATCH: &str = "CertificatesLifetimeMismatch";
    /// A renewal policy decided something new (deferred, disabled, invalid).
    pub const RENEWAL_DEFERRED: &str = "CertificatesRenewalDeferred";
    /// A renewal policy governs the Machine and its next renewal is not due yet (Normal).
    pub const RENEWAL_SCHEDULED: &str = "CertificatesRenewalScheduled";
    pub const RENEWAL_DISABLED: &str = "CertificatesRenewalDisabled";
    pub const RENEWAL_CONFIG_INVALID: &str = "CertificatesRenewalConfigInvalid";
    pub const RENEWAL_WINDOW_BYPASSED: &str = "CertificatesRenewalWindowBypassed";
    /// On the Cluster: a certificate of the management kubeconfig (`<cluster>-kubeconfig`)
    /// expires within the warning horizon, or has expired.
    pub const KUBECONFIG_EXPIRING: &str = "KubeconfigCertificateExpiring";
    pub const KUBECONFIG_EXPIRED: &str = "KubeconfigCertificateExpired";
    /// On the Cluster (`--renew-management-kubeconfig`): the client certificate was renewed in
    /// place (Normal); a dry run would have renewed it (Normal); it cannot be renewed, and why
    /// (Warning, once per new reason).
    pub const KUBECONFIG_RENEWED: &str = "KubeconfigCertificateRenewed";
    pub const KUBECONFIG_WOULD_RENEW: &str = "KubeconfigCertificateWouldRenew";
    pub const KUBECONFIG_NOT_RENEWED: &str = "KubeconfigCertificateNotRenewed";
    /// Reading the node's certificate expiry failed (other than the node still starting).
    pub const EXPIRY_UNKNOWN: &str = "CertificatesExpiryUnknown";
    /// A trigger was not acted on: its owner applies it again after the refresh it asked for
    /// (a machine template, a GitOps tool).
    pub const REFRESH_REFUSED: &str = "CertificatesRefreshRefused";
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
    /// The Machine's trigger is refused: its owner applies it again after each refresh.
    pub const TRIGGER_REFUSED: &str = "TriggerRefused";
}

/// Condition reasons.
pub mod condition_reasons {
    pub const EXPIRY_KNOWN: &str = "ExpiryKnown";
    pub const EXPIRY_UNKNOWN: &str = "ExpiryUnknown";
    pub const NO_NODE: &str = "WaitingForNode";
    pub const PAUSED: &str = "Paused";
    pub const REFRESHED: &str = "Refreshed";
    pub const REFRESH_FAILED: &str = "RefreshFailed";
    pub const REFRESH_IN_PROGRESS: &str = "RefreshInProgress";
    pub const IDLE: &str = "Idle";
    /// The trigger is applied again by the owner of the refresh it asked for.
    pub const REAPPLIED: &str = "ReappliedByOwner";
}
