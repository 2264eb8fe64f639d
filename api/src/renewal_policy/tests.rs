use super::DayOfWeek::*;
use super::*;
use kube::CustomResourceExt;
use serde_json::{Value, json};

fn window(days: &[DayOfWeek], start: &str, end: &str, zone: Option<&str>) -> Window {
    Window::daily(
        days.to_vec(),
        start.parse().unwrap(),
        end.parse().unwrap(),
        zone.map(str::to_owned),
    )
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
        (
            r#"{"schedule":"0 22 * * *","duration":"0h"}"#,
            "it must be longer than zero",
        ),
        (
            r#"{"schedule":"0 22 * * *","duration":"4 hours"}"#,
            "4 hours",
        ),
    ];
    for (json, message) in rejected {
        let error = serde_json::from_str::<Window>(json)
            .unwrap_err()
            .to_string();
        assert!(error.contains(message), "{json}: {error}");
    }
}

#[test]
fn a_schedule_window_is_schedule_duration_and_timezone() {
    let json = r#"{"schedule":"0 22 * * 1-5","duration":"4h","timezone":"Europe/London"}"#;
    let parsed: Window = serde_json::from_str(json).unwrap();
    assert_eq!(
        parsed,
        Window::scheduled(
            "0 22 * * 1-5",
            "4h".parse().unwrap(),
            Some("Europe/London".to_owned())
        )
    );
    assert_eq!(parsed.start, None);
    assert_eq!(serde_json::to_string(&parsed).unwrap(), json);
    // Mixed or partial forms deserialise; the CEL rules and the controller reject them.
    let mixed: Window =
        serde_json::from_str(r#"{"start":"01:00","schedule":"0 1 * * *"}"#).unwrap();
    assert_eq!(mixed.start, Some("01:00".parse().unwrap()));
    assert_eq!(mixed.duration, None);
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
    // Either form: nothing is required by itself, the CEL rules tie the fields together.
    assert_eq!(window.get("required"), None);
    let rules: Vec<&str> = window["x-kubernetes-validations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rule| rule["rule"].as_str().unwrap())
        .collect();
    assert_eq!(
        rules,
        [
            "has(self.schedule) ? !has(self.start) && !has(self.end) && (!has(self.daysOfWeek) || size(self.daysOfWeek) == 0) : has(self.start) && has(self.end)",
            "has(self.schedule) == has(self.duration)",
            "!has(self.start) || !has(self.end) || self.start != self.end",
        ]
    );
    assert_eq!(properties["schedule"]["type"], "string");
    assert_eq!(properties["schedule"]["maxLength"], MAX_SCHEDULE_LENGTH);
    assert_eq!(properties["duration"]["type"], "string");
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
    // renewBefore has no schema default: renewBeforePercentage may replace it, and the two
    // are exclusive. The controller applies DEFAULT_RENEW_BEFORE when neither is set.
    assert_eq!(properties["renewBefore"].get("default"), None);
    assert_eq!(properties["renewBeforePercentage"]["minimum"], 1.0);
    assert_eq!(properties["renewBeforePercentage"]["maximum"], 99.0);
    assert_eq!(properties["ttl"]["default"], "1y");
    assert_eq!(properties["failSafeMargin"]["default"], "24h");
    let margin = properties["failSafeMargin"]["default"].as_str().unwrap();
    let margin: FailSafeMargin = margin.parse().unwrap();
    assert_eq!(margin, DEFAULT_FAIL_SAFE_MARGIN);
    assert_eq!(properties["spread"]["default"], "15m");
    let spread: Spread = properties["spread"]["default"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(spread, DEFAULT_SPREAD);
    assert_eq!(
        properties["spread"]["pattern"],
        properties["failSafeMargin"]["pattern"]
    );
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
            "!has(self.renewBefore) || !has(self.renewBeforePercentage)",
        ]
    );
}

#[test]
fn omitted_fields_take_their_defaults() {
    let spec: CertificateRenewalPolicySpec =
        serde_json::from_value(json!({"clusterSelector": {}, "policy": "Automatic"})).unwrap();
    assert_eq!(spec.renew_before, None);
    assert_eq!(spec.renew_before_percentage, None);
    assert_eq!(spec.ttl, DEFAULT_TTL);
    assert_eq!(spec.fail_safe_margin, DEFAULT_FAIL_SAFE_MARGIN);
    assert_eq!(spec.spread, DEFAULT_SPREAD);
    assert!(spec.windows.is_empty());
    assert_eq!(spec.machine_selector, None);
    assert_eq!(spec.cluster_selector, Some(LabelSelector::default()));
}
