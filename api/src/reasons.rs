//! Event reasons and condition types. The `CertificatesRefresh*` Event reasons are the ones the
//! CK8s provider already emits; users' alerts match on them, so they are kept.

/// Event reasons on the Machine.
pub mod events {
    pub const REFRESH_IN_PROGRESS: &str = "CertificatesRefreshInProgress";
    pub const REFRESH_DONE: &str = "CertificatesRefreshDone";
    pub const REFRESH_FAILED: &str = "CertificatesRefreshFailed";
    /// The node signed a lifetime materially different from the requested one.
    pub const LIFETIME_MISMATCH: &str = "CertificatesLifetimeMismatch";
    /// Reading the node's certificate expiry failed (other than the node still starting).
    pub const EXPIRY_UNKNOWN: &str = "CertificatesExpiryUnknown";
}

/// Condition types on MachineCertificates (positive polarity).
pub mod conditions {
    /// The node's certificates are known and no refresh has failed since the last success.
    pub const READY: &str = "Ready";
    /// A refresh is in flight.
    pub const REFRESHING: &str = "Refreshing";
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
}
