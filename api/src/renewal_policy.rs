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
//! - `start` and `end` are exactly `HH:MM` (`24:00` only as an end), `start != end` (CEL);
//! - `renewBefore`, `ttl` and `failSafeMargin` follow the duration grammar's syntax
//!   ([`crate::duration`]);
//! - at least one selector (CEL); `Scheduled` has at least one window (CEL);
//! - at most [`MAX_WINDOWS`] windows, 7 days per window, `timezone` 1 to 64 characters.
//!
//! Checked by the controller and reported in the `Valid` condition (a schema cannot): the time
//! zone is an exact IANA name of the bundled database, durations are positive and at most 10000y,
//! `renewBefore` is shorter than `ttl`, the label selectors are well formed.

use jiff::civil::Weekday;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use crate::duration::{FailSafeMargin, PolicyDuration, Ttl};

/// `renewBefore` when the policy omits it: renew 30 days before expiry.
pub const DEFAULT_RENEW_BEFORE: PolicyDuration = PolicyDuration::from_secs_const(30 * 86_400);

/// `ttl` when the policy omits it: one year, k8sd's own default lifetime.
pub const DEFAULT_TTL: Ttl = Ttl::from_secs_const(365 * 86_400);

/// `failSafeMargin` when the policy omits it: stop waiting for a window a day before expiry.
pub const DEFAULT_FAIL_SAFE_MARGIN: FailSafeMargin = FailSafeMargin::from_secs_const(86_400);

/// The most windows a policy may hold. A week of distinct daily slots fits many times over; the
/// bound keeps the API server's CEL cost estimate (per window) small.
pub const MAX_WINDOWS: usize = 32;

/// The longest `timezone` accepted by the schema; the longest IANA name has 32 characters.
pub const MAX_TIMEZONE_LENGTH: usize = 64;

/// Condition types on a `CertificateRenewalPolicy` (positive polarity).
pub mod conditions {
    /// The spec passes every check; when False, the message lists each problem with its field
    /// path, and the policy renews nothing.
    pub const VALID: &str = "Valid";
    /// The policy is valid and governs its Machines (none is claimed by another policy too).
    pub const READY: &str = "Ready";
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
    namespaced,
    doc = "When ck8s-certs renews the node certificates of the Machines it selects on its own: at any time, inside maintenance windows, or never. Without a policy, Machines are renewed only on request (the v1beta2.k8sd.io/refresh-certificates annotation).",
    status = "CertificateRenewalPolicyStatus",
    printcolumn = r#"{"name":"Policy","type":"string","jsonPath":".spec.policy"}"#,
    printcolumn = r#"{"name":"RenewBefore","type":"string","jsonPath":".spec.renewBefore"}"#,
    printcolumn = r#"{"name":"TTL","type":"string","jsonPath":".spec.ttl","priority":1}"#,
    printcolumn = r#"{"name":"Windows","type":"integer","jsonPath":".status.windowCount"}"#,
    printcolumn = r#"{"name":"Machines","type":"integer","jsonPath":".status.matchedMachines"}"#,
    printcolumn = r#"{"name":"Valid","type":"string","jsonPath":".status.conditions[?(@.type==\"Valid\")].status"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(
    validation = Rule::new("has(self.clusterSelector) || has(self.machineSelector)")
        .message("at least one of clusterSelector and machineSelector must be set; an empty selector ({}) selects every Cluster or Machine of the namespace")
        .reason(Reason::FieldValueRequired),
    validation = Rule::new("self.policy != 'Scheduled' || (has(self.windows) && size(self.windows) > 0)")
        .message("policy Scheduled needs at least one window (use Automatic to renew at any time)")
        .field_path(".windows")
        .reason(Reason::FieldValueRequired)
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
    /// h, m, s). Must be shorter than ttl. Default 30d.
    #[serde(default = "default_renew_before")]
    #[schemars(extend("default" = "30d"))]
    pub renew_before: PolicyDuration,

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
}

fn default_renew_before() -> PolicyDuration {
    DEFAULT_RENEW_BEFORE
}

fn default_ttl() -> Ttl {
    DEFAULT_TTL
}

fn default_fail_safe_margin() -> FailSafeMargin {
    DEFAULT_FAIL_SAFE_MARGIN
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

    /// Valid and Ready.
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

/// A maintenance window: every selected day from `start` to `end`, wall-clock time in
/// `timezone`.
#[derive(KubeSchema, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[x_kube(
    validation = Rule::new("self.start != self.end")
        .message("end must differ from start: the window would be empty; a whole day is 00:00 to 24:00")
        .field_path(".end")
)]
#[serde(rename_all = "camelCase")]
pub struct Window {
    /// Days on which the window opens (full English names, such as Monday); an occurrence
    /// belongs to the day it starts. Omitted or empty: every day.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7))]
    pub days_of_week: Vec<DayOfWeek>,
    /// Opening wall-clock time, HH:MM (00:00 to 23:59).
    #[schemars(pattern(START_PATTERN))]
    pub start: WallTime,
    /// Closing wall-clock time, exclusive, HH:MM or 24:00. Earlier than start: the next day.
    /// Must differ from start (a whole day is 00:00 to 24:00).
    #[schemars(pattern(END_PATTERN))]
    pub end: WallTime,
    /// IANA time zone name, exactly as in the tz database (such as Europe/London); the zone
    /// database is built into the controller. Omitted: UTC. A start or end that falls in a
    /// daylight-saving gap opens or closes at the first instant after the gap; in a repeated
    /// hour, at the earlier instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_TIMEZONE_LENGTH))]
    pub timezone: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::DayOfWeek::*;
    use super::*;
    use kube::CustomResourceExt;
    use serde_json::{Value, json};

    fn window(days: &[DayOfWeek], start: &str, end: &str, zone: Option<&str>) -> Window {
        Window {
            days_of_week: days.to_vec(),
            start: start.parse().unwrap(),
            end: end.parse().unwrap(),
            timezone: zone.map(str::to_owned),
        }
    }

    #[test]
    fn wall_times_are_exactly_hh_mm() {
        let rows: &[(&str, Option<(u8, u8)>)] = &[
            ("00:00", Some((0, 0))),
            ("09:05", Some((9, 5))),
            ("23:59", Some((23, 59))),
            ("24:00", Some((24, 0))),
            ("9:00", None),
            ("09:0", None),
            ("24:30", None),
            ("25:00", None),
            ("12:60", None),
            ("12:00:00", None),
            ("12h00", None),
            (" 12:00", None),
            ("", None),
            ("+1:00", None),
            ("１２:00", None),
        ];
        for (input, expected) in rows {
            let parsed = input
                .parse::<WallTime>()
                .map(|t| (t.hour(), t.minute()))
                .ok();
            assert_eq!(parsed, *expected, "input {input:?}");
        }
        assert_eq!(
            "9:00".parse::<WallTime>().unwrap_err().to_string(),
            "invalid time \"9:00\": expected HH:MM with two-digit hours and minutes, from 00:00 to 23:59, or 24:00 as an end"
        );
        assert_eq!("07:30".parse::<WallTime>().unwrap().to_string(), "07:30");
    }

    #[test]
    fn the_crd_form_uses_camel_case_and_full_day_names() {
        let json = r#"{"daysOfWeek":["Monday","Sunday"],"start":"22:00","end":"02:00","timezone":"Europe/London"}"#;
        let parsed: Window = serde_json::from_str(json).unwrap();
        assert_eq!(
            parsed,
            window(&[Monday, Sunday], "22:00", "02:00", Some("Europe/London"))
        );
        assert_eq!(serde_json::to_string(&parsed).unwrap(), json);
        let minimal: Window = serde_json::from_str(r#"{"start":"00:00","end":"24:00"}"#).unwrap();
        assert_eq!(minimal, window(&[], "00:00", "24:00", None));
        assert_eq!(
            serde_json::to_string(&minimal).unwrap(),
            r#"{"start":"00:00","end":"24:00"}"#
        );

        let rejected = [
            (
                r#"{"daysOfWeek":["Funday"],"start":"01:00","end":"02:00"}"#,
                "unknown variant `Funday`, expected one of `Monday`",
            ),
            (
                r#"{"daysOfWeek":["monday"],"start":"01:00","end":"02:00"}"#,
                "unknown variant `monday`",
            ),
            (r#"{"start":"9:00","end":"10:00"}"#, "invalid time \"9:00\""),
            (
                r#"{"start":"01:00","end":"24:30"}"#,
                "invalid time \"24:30\"",
            ),
            (
                r#"{"start":"12:60","end":"13:00"}"#,
                "invalid time \"12:60\"",
            ),
            (r#"{"start":"01:00"}"#, "missing field `end`"),
        ];
        for (json, message) in rejected {
            let error = serde_json::from_str::<Window>(json)
                .unwrap_err()
                .to_string();
            assert!(error.contains(message), "{json}: {error}");
        }
    }

    /// The policy's schema as the API server gets it.
    fn spec_schema() -> Value {
        let crd = serde_json::to_value(CertificateRenewalPolicy::crd()).unwrap();
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].clone()
    }

    #[test]
    fn the_schema_restricts_start_and_end_separately() {
        let window = &spec_schema()["properties"]["windows"]["items"];
        let properties = &window["properties"];
        assert_eq!(properties["start"]["pattern"], START_PATTERN);
        assert_eq!(properties["end"]["pattern"], END_PATTERN);
        assert_eq!(properties["start"]["type"], "string");
        let days = serde_json::to_string(&properties["daysOfWeek"]).unwrap();
        assert!(days.contains("Wednesday"), "{days}");
        assert_eq!(window["required"], json!(["end", "start"]));
        assert_eq!(
            window["x-kubernetes-validations"][0]["rule"],
            "self.start != self.end"
        );
    }

    #[test]
    fn the_schema_carries_defaults_enums_bounds_and_cel_rules() {
        let spec = spec_schema();
        let properties = &spec["properties"];
        assert_eq!(spec["required"], json!(["policy"]));
        assert_eq!(
            properties["policy"]["enum"],
            json!(["Automatic", "Disabled", "Scheduled"])
        );
        // As users write them (serialising would print the canonical 1mo and 1d).
        assert_eq!(properties["renewBefore"]["default"], "30d");
        assert_eq!(properties["ttl"]["default"], "1y");
        assert_eq!(properties["failSafeMargin"]["default"], "24h");
        for (field, default) in [
            ("renewBefore", DEFAULT_RENEW_BEFORE.as_seconds()),
            ("failSafeMargin", DEFAULT_FAIL_SAFE_MARGIN.as_seconds()),
        ] {
            let text = properties[field]["default"].as_str().unwrap();
            let parsed: FailSafeMargin = text.parse().unwrap();
            assert_eq!(parsed.as_seconds(), default, "{field}");
        }
        assert_eq!(properties["windows"]["maxItems"], MAX_WINDOWS);
        let rules: Vec<&str> = spec["x-kubernetes-validations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|rule| rule["rule"].as_str().unwrap())
            .collect();
        assert_eq!(
            rules,
            [
                "has(self.clusterSelector) || has(self.machineSelector)",
                "self.policy != 'Scheduled' || (has(self.windows) && size(self.windows) > 0)",
            ]
        );
    }

    #[test]
    fn omitted_fields_take_their_defaults() {
        let spec: CertificateRenewalPolicySpec =
            serde_json::from_value(json!({"clusterSelector": {}, "policy": "Automatic"})).unwrap();
        assert_eq!(spec.renew_before, DEFAULT_RENEW_BEFORE);
        assert_eq!(spec.ttl, DEFAULT_TTL);
        assert_eq!(spec.fail_safe_margin, DEFAULT_FAIL_SAFE_MARGIN);
        assert!(spec.windows.is_empty());
        assert_eq!(spec.machine_selector, None);
        assert_eq!(spec.cluster_selector, Some(LabelSelector::default()));
    }
}
