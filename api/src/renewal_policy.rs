//! `CertificateRenewalPolicy`: when, if at all, the controller renews a group of Machines'
//! certificates on its own (design.md §3–4). Without a policy a Machine is renewed only on
//! request (the `refresh-certificates` annotation), which is CK8s's behaviour.
//!
//! This module owns the shape of the policy and the rules the API server can check. What the
//! fields mean over time (windows in their zones, DST, the fail-safe, backoff) is the controller's
//! `policy` module, which also re-checks everything below, so that the controller and the offline
//! `policy preview` reject the same objects with the same messages.
//!
//! # Which Machines a policy governs
//! Both selectors look only in the policy's namespace. A Machine matches when its Cluster
//! (`spec.clusterName`) matches `clusterSelector` (if set) **and** the Machine matches
//! `machineSelector` (if set). At least one must be set; an empty selector (`{}`) matches
//! everything, so `clusterSelector: {}` governs every Machine of the namespace. A Machine that two
//! policies match is governed by neither: the conflict is reported on both and on the Machine,
//! never settled by a silent pick.
//!
//! # Validation
//! In the schema, checked by the API server on every write:
//! - `policy` is one of the [`Mode`]s; `daysOfWeek` entries are full English day names;
//! - a window is either `start` + `end` (with optional `daysOfWeek`) or `schedule` + `duration`
//!   (CEL); `start` and `end` are exactly `HH:MM` (`24:00` only as an end), `start != end` (CEL);
//! - `renewBefore`, `ttl`, `failSafeMargin`, `spread` and a window's `duration` follow the
//!   duration grammar's syntax ([`crate::duration`]);
//! - at most one of `renewBefore` and `renewBeforePercentage` (CEL), the percentage 1 to 99;
//! - at least one selector (CEL); `Scheduled` has at least one window (CEL);
//! - at most [`MAX_WINDOWS`] windows, 7 days per window, `timezone` 1 to 64 characters,
//!   `schedule` 1 to [`MAX_SCHEDULE_LENGTH`] characters.
//!
//! Checked by the controller and reported in the `Valid` condition (a schema cannot): the time
//! zone is an exact IANA name of the bundled database, a `schedule` is a standard five-field cron
//! expression that fires at all, durations are positive and at most 10000y, `spread` is at most
//! [`MAX_SPREAD`], `renewBefore` is shorter than `ttl`, the label selectors are well formed.

use jiff::civil::Weekday;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use crate::duration::{FailSafeMargin, PolicyDuration, Spread, Ttl};

/// `renewBefore` when the policy sets neither it nor `renewBeforePercentage`: renew 30 days
/// before expiry.
pub const DEFAULT_RENEW_BEFORE: PolicyDuration = PolicyDuration::from_secs_const(30 * 86_400);

/// `ttl` when the policy omits it: one year, k8sd's own default lifetime.
pub const DEFAULT_TTL: Ttl = Ttl::from_secs_const(365 * 86_400);

/// `failSafeMargin` when the policy omits it: stop waiting for a window a day before expiry.
pub const DEFAULT_FAIL_SAFE_MARGIN: FailSafeMargin = FailSafeMargin::from_secs_const(86_400);

/// `spread` when the policy omits it: Machines that may renew at the same instant (a window
/// opening) start over a quarter of an hour, not in the same second. Short enough to fit any
/// realistic window and to be harmless to a small fleet; `0` turns staggering off.
pub const DEFAULT_SPREAD: Spread = Spread::from_secs_const(15 * 60);

/// The longest `spread`: a week, the period of a weekly window. A longer spread would only push
/// renewals towards the fail-safe point, which overrides it anyway.
pub const MAX_SPREAD: Spread = Spread::from_secs_const(7 * 86_400);

/// The most windows a policy may hold. A week of distinct daily slots fits many times over; the
/// bound keeps the API server's CEL cost estimate (per window) small.
pub const MAX_WINDOWS: usize = 32;

/// The longest `timezone` accepted by the schema; the longest IANA name has 32 characters.
pub const MAX_TIMEZONE_LENGTH: usize = 64;

/// The longest `schedule` accepted by the schema: five cron fields with generous lists.
pub const MAX_SCHEDULE_LENGTH: usize = 128;

/// The range of `renewBeforePercentage`, as cert-manager's (0, 100) exclusive.
pub const RENEW_BEFORE_PERCENTAGE_RANGE: std::ops::RangeInclusive<i32> = 1..=99;

/// Condition types on a `CertificateRenewalPolicy` (positive polarity).
pub mod conditions {
    /// The spec passes every check; when False, the message lists each problem with its field
    /// path, and the policy renews nothing.
    pub const VALID: &str = "Valid";
    /// The policy is valid and governs its Machines (none is claimed by another policy too).
    pub const READY: &str = "Ready";
    /// True while the circuit breaker is open: automatic renewals of the policy's Machines are
    /// stopped after failures until a person resumes them; the message lists the failures.
    pub const RENEWALS_HALTED: &str = "RenewalsHalted";
    /// The policy keeps its promise in the worst case: at least three attempts start before the
    /// fail-safe point when all fail, the windows open within every lifetime, and the third
    /// attempt starts before the expiry alert fires. False names the number that is wrong and
    /// what would work (the admission webhook refuses such a policy; one written without it
    /// still renews as it says).
    pub const PROMISE_KEPT: &str = "PromiseKept";
    /// Only with `spec.canary`: True while the policy's other Machines may renew (every canary
    /// renewed under this generation, or the wait for them ended); False while they wait for
    /// the canaries, and the message says for which and until when, or which canary failed.
    pub const CANARIES_PASSED: &str = "CanariesPassed";
}

/// Condition reasons on a `CertificateRenewalPolicy`.
pub mod reasons {
    /// `Valid` True.
    pub const VALID: &str = "Valid";
    /// `Valid` or `Ready` False: the spec has problems (the `Valid` message lists them).
    pub const INVALID: &str = "InvalidSpec";
    /// `Ready` True.
    pub const ACTIVE: &str = "Active";
    /// `Ready` False: another policy also selects some of this policy's Machines.
    pub const CONFLICT: &str = "ConflictingPolicies";
    /// `RenewalsHalted` True: this policy's automatic renewals failed too often.
    pub const BREAKER_OPEN: &str = "BreakerOpen";
    /// `RenewalsHalted` True: automatic renewals failed too often across the fleet.
    pub const FLEET_BREAKER_OPEN: &str = "FleetBreakerOpen";
    /// `RenewalsHalted` False: the breaker is closed.
    pub const BREAKER_CLOSED: &str = "BreakerClosed";
    /// `PromiseKept` True.
    pub const PROMISE_KEPT: &str = "PromiseKept";
    /// `PromiseKept` True: the policy is Disabled and promises nothing.
    pub const NOTHING_PROMISED: &str = "NothingPromised";
    /// `PromiseKept` False: the message says which number is wrong and what would work.
    pub const PROMISE_BROKEN: &str = "PromiseBroken";
    /// `PromiseKept` Unknown: the windows could not be checked (the message says why), or the
    /// spec is invalid (reason `InvalidSpec`).
    pub const PROMISE_UNPROVEN: &str = "PromiseUnproven";
    /// `CanariesPassed` True: every canary renewed under this generation, none is due.
    pub const CANARIES_RENEWED: &str = "CanariesRenewed";
    /// `CanariesPassed` True: some canaries did not renew under this generation, but the others
    /// waited `maxWait` for them.
    pub const CANARY_WAIT_ELAPSED: &str = "CanaryWaitElapsed";
    /// `CanariesPassed` True: no Machine of the policy is on a canary cluster.
    pub const NO_CANARIES: &str = "NoCanaries";
    /// `CanariesPassed` False: the others wait for canaries due or not yet renewed under this
    /// generation (named), until a stated time at the latest.
    pub const CANARIES_PENDING: &str = "CanariesPending";
    /// `CanariesPassed` False: a canary's automatic renewal failed under this generation: the
    /// others wait until it succeeds.
    pub const CANARY_FAILED: &str = "CanaryFailed";
}

/// Which Machines the policy governs, and when their certificates are renewed.
#[derive(CustomResource, KubeSchema, Clone, Debug, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "certificates.ck8s.io",
    version = "v1alpha1",
    kind = "CertificateRenewalPolicy",
    plural = "certificaterenewalpolicies",
    singular = "certificaterenewalpolicy",
    shortname = "crp",
    category = "cluster-api",
    // No Cluster owns a policy: without this, `clusterctl move` would leave the policies behind
    // and the moved Machines would go without renewals.
    label("clusterctl.cluster.x-k8s.io/move", ""),
    namespaced,
    doc = "When ck8s-certs renews the node certificates of the Machines it selects on its own: at any time, inside maintenance windows, or never. Without a policy, Machines are renewed only on request (the v1beta2.k8sd.io/refresh-certificates annotation).",
    status = "CertificateRenewalPolicyStatus",
    printcolumn = r#"{"name":"Policy","type":"string","jsonPath":".spec.policy"}"#,
    printcolumn = r#"{"name":"RenewBefore","type":"string","jsonPath":".spec.renewBefore"}"#,
    printcolumn = r#"{"name":"RenewBefore%","type":"integer","jsonPath":".spec.renewBeforePercentage","priority":1}"#,
    printcolumn = r#"{"name":"TTL","type":"string","jsonPath":".spec.ttl","priority":1}"#,
    printcolumn = r#"{"name":"Windows","type":"integer","jsonPath":".status.windowCount"}"#,
    printcolumn = r#"{"name":"Machines","type":"integer","jsonPath":".status.matchedMachines"}"#,
    printcolumn = r#"{"name":"Valid","type":"string","jsonPath":".status.conditions[?(@.type==\"Valid\")].status"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","priority":1}"#,
    printcolumn = r#"{"name":"Halted","type":"string","jsonPath":".status.conditions[?(@.type==\"RenewalsHalted\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(
    validation = Rule::new("has(self.clusterSelector) || has(self.machineSelector)")
        .message("at least one of clusterSelector and machineSelector must be set; an empty selector ({}) selects every Cluster or Machine of the namespace")
        .reason(Reason::FieldValueRequired),
    validation = Rule::new("self.policy != 'Scheduled' || (has(self.windows) && size(self.windows) > 0)")
        .message("policy Scheduled needs at least one window (use Automatic to renew at any time)")
        .field_path(".windows")
        .reason(Reason::FieldValueRequired),
    validation = Rule::new("!has(self.renewBefore) || !has(self.renewBeforePercentage)")
        .message("set at most one of renewBefore and renewBeforePercentage")
        .field_path(".renewBeforePercentage")
        .reason(Reason::FieldValueForbidden)
)]
#[serde(rename_all = "camelCase")]
pub struct CertificateRenewalPolicySpec {
    /// Selects Clusters of this namespace by label: their Machines are governed by this policy
    /// (and must also match machineSelector if it is set). `{}` selects every Cluster. At least
    /// one of clusterSelector and machineSelector must be set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,

    /// Selects Machines of this namespace by label (and their Cluster must also match
    /// clusterSelector if it is set). `{}` selects every Machine. A Machine selected by two
    /// policies is renewed by neither, and the conflict is reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_selector: Option<LabelSelector>,

    /// Automatic: renew when due (renewBefore ahead of expiry), at any time; windows, if any,
    /// are ignored. Scheduled: renew when due, but only inside the windows, unless expiry is
    /// within failSafeMargin. Disabled: never renew automatically (the refresh-certificates
    /// annotation still works). In every mode a manual request bypasses the policy.
    pub policy: Mode,

    /// How long before expiry renewal is due, such as 30d or 2w (units: y=365d, mo=30d, w, d,
    /// h, m, s). Must be shorter than ttl. Not with renewBeforePercentage. When neither is set:
    /// 30d.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<PolicyDuration>,

    /// How long before expiry renewal is due, as a percentage (1 to 99) of the certificates'
    /// lifetime (NotAfter - NotBefore), as in cert-manager: 33 renews a 1y certificate about
    /// 120 days before expiry. Not with renewBefore. When the lifetime's start is not known,
    /// the policy's ttl stands for the lifetime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 99))]
    pub renew_before_percentage: Option<i32>,

    /// Lifetime of the renewed certificates, such as 1y or 6mo. Workers accept 10m to 68y (CSR
    /// expirationSeconds is an int32). Default 1y.
    #[serde(default = "default_ttl")]
    pub ttl: Ttl,

    /// Maintenance windows (OR'ed) in which Scheduled renewals may start. Required for
    /// Scheduled; ignored by Automatic (a condition says so).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_WINDOWS))]
    pub windows: Vec<Window>,

    /// How long before expiry a Scheduled renewal stops waiting for a window, such as 24h or 2d.
    /// 0 waits until the certificates have expired. Default 24h.
    #[serde(default = "default_fail_safe_margin")]
    #[schemars(extend("default" = "24h"))]
    pub fail_safe_margin: FailSafeMargin,

    /// How far apart Machines that may start renewing at the same instant (a window opening,
    /// the same due time) are spread, such as 15m or 2h: each starts at its own offset in
    /// [0, spread), fixed by its UID; 0 turns staggering off. Scheduled: the offset counts from
    /// the window's opening (or the due time, if later) and is scaled down to stay inside that
    /// window. Within failSafeMargin of expiry the spread is ignored. At most 7d. Default 15m.
    #[serde(default = "default_spread")]
    #[schemars(extend("default" = "15m"))]
    pub spread: Spread,

    /// What is done with a worker whose last refresh found it cannot be refreshed in place (its
    /// kubelet.conf expired, so the API server refuses the CSRs it creates). Absent: it is
    /// reported (Ready=False, reason InPlaceImpossible) and not renewed automatically again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place_impossible: Option<InPlaceImpossible>,

    /// When automatic renewals stop on their own: after `failures` automatic renewals of this
    /// policy's Machines failed within `period` (a wrong ttl, a k8sd release that fails), the
    /// policy starts no more until a person resumes it (`kubectl ck8s-certs resume`). Manual
    /// requests still work. Absent: 3 failures within 30m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<CircuitBreaker>,

    /// Canary clusters: the Machines of Clusters that `clusterSelector` matches renew first.
    /// Each other Machine of the policy whose renewal is due waits while a canary's automatic
    /// renewal failed (until it succeeds, a person renews it, or the Machine's fail-safe point),
    /// while a canary is due and not yet renewed, and while a canary has not renewed since this
    /// generation of the policy was first seen; the last two for at most `maxWait`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<Canary>,
}

/// The policy's `canary`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Canary {
    /// The canary clusters, by the labels of their Cluster (among the policy's own Machines).
    pub cluster_selector: LabelSelector,
    /// How long the other Machines wait for a canary that is due, or has not renewed under this
    /// generation of the policy, such as 1d or 12h. Never for a canary whose renewal failed.
    /// Default 1d.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait: Option<PolicyDuration>,
}

/// The canaries' default wait: a day.
pub const DEFAULT_CANARY_MAX_WAIT: PolicyDuration = PolicyDuration::from_secs_const(24 * 3600);

/// The canaries of the policy's current generation, as the controller last saw them.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStatus {
    /// The generation of the policy they are tried for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// When the controller first saw that generation: a canary counts as renewed under it once
    /// a refresh of it succeeded after this, and `maxWait` counts from here.
    pub since: Time,
    /// The canary Machines.
    pub machines: i32,
    /// Of them, those renewed since `since`.
    pub renewed: i32,
}

/// The policy's `circuitBreaker`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CircuitBreaker {
    /// How many Machines' automatic renewals may fail within `period` before the policy stops
    /// (the one that reaches it stops it). 0 turns the breaker off. Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub failures: Option<i32>,

    /// How far back failures count, such as 30m or 2h. Default 30m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<PolicyDuration>,
}

/// The breaker's defaults: 3 failures within 30 minutes.
pub const DEFAULT_BREAKER_FAILURES: i32 = 3;
pub const DEFAULT_BREAKER_PERIOD: PolicyDuration = PolicyDuration::from_secs_const(30 * 60);

/// The policy's circuit breaker as last seen by the controller: open (automatic renewals
/// stopped, and why) or closed since the last resume.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BreakerStatus {
    /// When the breaker opened; absent while it is closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opened_at: Option<Time>,
    /// Policy: this policy's failures opened it; Fleet: failures across every policy
    /// (`--fleet-breaker-failures`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// The failures that opened it (at most 10, newest first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<BreakerFailure>,
    /// When a person last resumed the policy's automatic renewals: failures before it no longer
    /// count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_at: Option<Time>,
    /// Who resumed them, as the API server authenticated them (see docs/security.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_by: Option<String>,
    /// The value of the `certificates.ck8s.io/resume-renewals` annotation that resume was
    /// read from: the annotation stays, and only a new value resumes again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_request: Option<String>,
}

/// One failed automatic renewal the breaker counted.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BreakerFailure {
    /// The Machine, as namespace/name.
    pub machine: String,
    /// Its Cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// When its renewal failed.
    pub at: Time,
    /// What failed (the refresh's error, shortened).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The policy's `inPlaceImpossible`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InPlaceImpossible {
    /// Report (default): say so, and leave the Machine to a person. Replace: delete the Machine
    /// so that its MachineSet creates a new one; only a worker owned by a MachineSet, only once
    /// every control plane of its cluster was refreshed, one Machine of a cluster at a time and
    /// within maxUnavailable of its MachineDeployment. Writing Replace needs the right to delete
    /// Machines in the policy's namespace.
    #[serde(default)]
    pub action: InPlaceImpossibleAction,

    /// With Replace: how many Machines of one MachineDeployment may be being deleted at once
    /// (this one included, and any other deletion counted), as a number or a percentage of its
    /// Machines rounded down, such as 1 or 25%. 0 (or a percentage that rounds to 0) replaces
    /// none. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
}

/// The policy's `inPlaceImpossible.action`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum InPlaceImpossibleAction {
    /// Say so (Ready=False, reason InPlaceImpossible, with the command that replaces it).
    #[default]
    Report,
    /// Delete the Machine so that its MachineSet creates a new one.
    Replace,
}

fn default_ttl() -> Ttl {
    DEFAULT_TTL
}

fn default_fail_safe_margin() -> FailSafeMargin {
    DEFAULT_FAIL_SAFE_MARGIN
}

fn default_spread() -> Spread {
    DEFAULT_SPREAD
}

/// What the controller observed about the policy.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CertificateRenewalPolicyStatus {
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// How many Machines the policy selects (including any also selected by another policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_machines: Option<i32>,

    /// How many windows the observed spec holds (for the Windows column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_count: Option<i32>,

    /// The circuit breaker: open while automatic renewals are stopped after failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker: Option<BreakerStatus>,
    /// The canaries (`spec.canary`) of this generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canaries: Option<CanaryStatus>,

    /// Valid, Ready, PromiseKept and RenewalsHalted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The policy's `policy` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Mode {
    /// Renew when due, at any time.
    Automatic,
    /// Never renew automatically (manual requests still work).
    Disabled,
    /// Renew when due, inside the maintenance windows (with the fail-safe).
    Scheduled,
}

impl Mode {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Automatic => "Automatic",
            Self::Disabled => "Disabled",
            Self::Scheduled => "Scheduled",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Schema patterns for the two fields: `24:00` is only an end.
const START_PATTERN: &str = r"^([01][0-9]|2[0-3]):[0-5][0-9]$";
const END_PATTERN: &str = r"^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$";

/// A day of the week, as the CRD spells it: full English name, capitalised, case-sensitive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum DayOfWeek {
    Monday,
    Tuesday,
    Wednesday,
    Thursday,
    Friday,
    Saturday,
    Sunday,
}

impl From<DayOfWeek> for Weekday {
    fn from(day: DayOfWeek) -> Self {
        match day {
            DayOfWeek::Monday => Weekday::Monday,
            DayOfWeek::Tuesday => Weekday::Tuesday,
            DayOfWeek::Wednesday => Weekday::Wednesday,
            DayOfWeek::Thursday => Weekday::Thursday,
            DayOfWeek::Friday => Weekday::Friday,
            DayOfWeek::Saturday => Weekday::Saturday,
            DayOfWeek::Sunday => Weekday::Sunday,
        }
    }
}

/// A wall-clock time of day, exactly `HH:MM` with two digits each, `00:00` to `23:59`, or
/// `24:00` (only valid as a window's end; the controller's window validation checks that).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WallTime {
    /// Minutes since midnight, `0..=1440`.
    minutes: u16,
}

impl WallTime {
    /// `24:00`, the end of the day.
    pub const END_OF_DAY: WallTime = WallTime { minutes: 24 * 60 };

    /// `None` unless `hour:minute` is `00:00`..=`23:59` or `24:00`.
    pub const fn new(hour: u8, minute: u8) -> Option<Self> {
        if (hour < 24 && minute < 60) || (hour == 24 && minute == 0) {
            Some(WallTime {
                minutes: hour as u16 * 60 + minute as u16,
            })
        } else {
            None
        }
    }

    pub const fn hour(self) -> u8 {
        (self.minutes / 60) as u8
    }

    pub const fn minute(self) -> u8 {
        (self.minutes % 60) as u8
    }
}

/// A string that is not a valid [`WallTime`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid time {input:?}: expected HH:MM with two-digit hours and minutes, from 00:00 to 23:59, or 24:00 as an end"
)]
pub struct WallTimeError {
    pub input: String,
}

impl FromStr for WallTime {
    type Err = WallTimeError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let error = || WallTimeError {
            input: input.chars().take(16).collect(),
        };
        let &[h1, h2, b':', m1, m2] = input.as_bytes() else {
            return Err(error());
        };
        let digit = |byte: u8| byte.is_ascii_digit().then(|| byte - b'0');
        let (Some(h1), Some(h2), Some(m1), Some(m2)) = (digit(h1), digit(h2), digit(m1), digit(m2))
        else {
            return Err(error());
        };
        WallTime::new(h1 * 10 + h2, m1 * 10 + m2).ok_or_else(error)
    }
}

impl fmt::Display for WallTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02}:{:02}", self.hour(), self.minute())
    }
}

impl Serialize for WallTime {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for WallTime {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = Cow::<str>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for WallTime {
    fn schema_name() -> Cow<'static, str> {
        "WallTime".into()
    }

    fn inline_schema() -> bool {
        true
    }

    /// `maxLength` is implied by the pattern, but the API server's CEL cost estimate (for the
    /// `start != end` rule) only reads `maxLength`.
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string", "pattern": END_PATTERN, "maxLength": 5 })
    }
}

/// A maintenance window, in one of two forms: every selected day from `start` to `end`, or
/// from each instant of a cron `schedule` for `duration`; wall-clock time in `timezone`.
#[derive(KubeSchema, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[x_kube(
    validation = Rule::new("has(self.schedule) ? !has(self.start) && !has(self.end) && (!has(self.daysOfWeek) || size(self.daysOfWeek) == 0) : has(self.start) && has(self.end)")
        .message("a window is either start and end (with optional daysOfWeek), or schedule and duration")
        .reason(Reason::FieldValueInvalid),
    validation = Rule::new("has(self.schedule) == has(self.duration)")
        .message("schedule and duration go together: the window opens at each instant of the schedule and stays open for the duration")
        .field_path(".duration")
        .reason(Reason::FieldValueRequired),
    validation = Rule::new("!has(self.start) || !has(self.end) || self.start != self.end")
        .message("end must differ from start: the window would be empty; a whole day is 00:00 to 24:00")
        .field_path(".end")
)]
#[serde(rename_all = "camelCase")]
pub struct Window {
    /// Days on which the window opens (full English names, such as Monday); an occurrence
    /// belongs to the day it starts. Omitted or empty: every day. Only with start and end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7))]
    pub days_of_week: Vec<DayOfWeek>,
    /// Opening wall-clock time, HH:MM (00:00 to 23:59). With end; not with schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(START_PATTERN))]
    pub start: Option<WallTime>,
    /// Closing wall-clock time, exclusive, HH:MM or 24:00. Earlier than start: the next day.
    /// Must differ from start (a whole day is 00:00 to 24:00).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(END_PATTERN))]
    pub end: Option<WallTime>,
    /// When the window opens, as a standard five-field cron expression (minute hour
    /// day-of-month month day-of-week, such as "0 22 * * 1-5"; names such as MON or JAN and
    /// @daily, @weekly, @monthly, @yearly, @hourly are accepted). With duration; not with
    /// start, end or daysOfWeek.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_SCHEDULE_LENGTH))]
    pub schedule: Option<String>,
    /// How long the window stays open after each instant of schedule, in wall-clock time, such
    /// as 4h or 2d (units: y=365d, mo=30d, w, d, h, m, s): "0 22 * * *" with 4h closes at
    /// 02:00 even on a daylight-saving night.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<PolicyDuration>,
    /// IANA time zone name, exactly as in the tz database (such as Europe/London); the zone
    /// database is built into the controller. Omitted: UTC. A start, end or schedule instant
    /// that falls in a daylight-saving gap opens or closes at the first instant after the gap;
    /// in a repeated hour, at the earlier instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_TIMEZONE_LENGTH))]
    pub timezone: Option<String>,
}

impl Window {
    /// A `daysOfWeek`/`start`/`end` window.
    pub fn daily(
        days: Vec<DayOfWeek>,
        start: WallTime,
        end: WallTime,
        timezone: Option<String>,
    ) -> Self {
        Self {
            days_of_week: days,
            start: Some(start),
            end: Some(end),
            timezone,
            ..Self::default()
        }
    }

    /// A `schedule`/`duration` window.
    pub fn scheduled(
        schedule: impl Into<String>,
        duration: PolicyDuration,
        timezone: Option<String>,
    ) -> Self {
        Self {
            schedule: Some(schedule.into()),
            duration: Some(duration),
            timezone,
            ..Self::default()
        }
    }
}

#[cfg(test)]
mod tests;
