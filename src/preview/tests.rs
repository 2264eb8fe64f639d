//! Preview tests: the samples in `config/samples` at fixed instants, golden text, the JSON shape,
//! and every way a file can be wrong.

use std::path::Path;

use ck8s_certs_api::renewal_policy::CertificateRenewalPolicy;

use kube::CustomResourceExt;

use super::load::field_problems;
use super::*;
use crate::policy::decision::WINDOWS_IGNORED_MESSAGE;
use crate::policy::testing::utc;
use crate::testing::{assert_contains, assert_ends_with};
use serde_json::json;

const SCHEDULED: &str = include_str!(
    "../../config/samples/certificates_v1alpha1_certificaterenewalpolicy_scheduled.yaml"
);
const AUTOMATIC: &str = include_str!(
    "../../config/samples/certificates_v1alpha1_certificaterenewalpolicy_automatic.yaml"
);
const DISABLED: &str = include_str!(
    "../../config/samples/certificates_v1alpha1_certificaterenewalpolicy_disabled.yaml"
);

/// Certificates expiring on Sunday 2026-12-20 00:00Z, no failures, default settings.
fn scenario(now: &str) -> Scenario {
    Scenario {
        expiry: utc("2026-12-20T00:00:00Z"),
        now: utc(now),
        failures: Failures::default(),
        settings: Settings::default(),
        window_starts: 5,
        machine_uid: None,
    }
}

fn report(text: &str, scenario: &Scenario) -> Report {
    preview(&load(Path::new("policy.yaml"), text).unwrap(), scenario)
}

/// A policy object around a spec given as YAML lines.
fn policy(spec: &str) -> String {
    let spec: String = spec.lines().map(|line| format!("  {line}\n")).collect();
    format!(
        "apiVersion: certificates.ck8s.io/v1alpha1\nkind: CertificateRenewalPolicy\nmetadata:\n  name: test\nspec:\n{spec}"
    )
}

#[test]
fn scheduled_outside_the_windows_defers_to_the_next_opening() {
    // Due since 2026-11-20 00:00Z (a Friday); the Friday-night window opens at 22:00 GMT.
    let report = report(SCHEDULED, &scenario("2026-11-20T12:00:00Z"));
    assert_eq!(report.exit_code(), 0);
    assert_eq!(
        render_text(&report),
        "\
Policy:        default/nightly-london
Selects:       Machines whose Cluster matches \"env=prod\"
Mode:          Scheduled
Renew before:  1mo (due at 2026-11-20T00:00:00Z)
TTL:           1y
Fail-safe:     2d before expiry (from 2026-12-18T00:00:00Z)
Spread:        30m (each Machine starts at its own offset in it, from its UID; --machine-uid shows one Machine's times)
Expiry:        2026-12-20T00:00:00Z
Now:           2026-11-20T12:00:00Z

Decision:      Defer until 2026-11-20T22:00:00Z (OutsideWindow)
               Renewal deferred until the next maintenance window opens at 2026-11-20 22:00 Europe/London (2026-11-20T22:00:00Z)
Next check:    2026-11-20T22:00:00Z

Next window starts after 2026-11-20T12:00:00Z:
  windows[0]  Fri 2026-11-20 22:00 GMT     Europe/London        2026-11-20T22:00:00Z
  windows[0]  Sat 2026-11-21 22:00 GMT     Europe/London        2026-11-21T22:00:00Z
  windows[1]  Wed 2026-11-25 01:00 GMT     Europe/London        2026-11-25T01:00:00Z
  windows[0]  Fri 2026-11-27 22:00 GMT     Europe/London        2026-11-27T22:00:00Z
  windows[0]  Sat 2026-11-28 22:00 GMT     Europe/London        2026-11-28T22:00:00Z
"
    );
}

#[test]
fn a_machine_uid_shows_that_machines_slot_in_the_spread() {
    // machine-c's place in any spread is 0.387: 11m36s of the sample's 30m.
    let keyed = Scenario {
        machine_uid: Some("machine-c".to_owned()),
        window_starts: 1,
        ..scenario("2026-11-20T12:00:00Z")
    };
    let deferred = report(SCHEDULED, &keyed);
    assert_eq!(deferred.decision.until, Some(utc("2026-11-20T22:11:36Z")));
    assert_eq!(
        render_text(&deferred),
        "\
Policy:        default/nightly-london
Selects:       Machines whose Cluster matches \"env=prod\"
Mode:          Scheduled
Renew before:  1mo (due at 2026-11-20T00:00:00Z)
TTL:           1y
Fail-safe:     2d before expiry (from 2026-12-18T00:00:00Z)
Spread:        30m (the times below are this Machine's)
Expiry:        2026-12-20T00:00:00Z
Now:           2026-11-20T12:00:00Z
Machine UID:   machine-c

Decision:      Defer until 2026-11-20T22:11:36Z (OutsideWindow)
               Renewal deferred until the next maintenance window opens at 2026-11-20 22:00 Europe/London (2026-11-20T22:00:00Z); staggered, it will start at 2026-11-20T22:11:36Z: this Machine's slot is 11m36s after maintenance window windows[0] opened at 2026-11-20 22:00 Europe/London (2026-11-20T22:00:00Z), within a 30m spread
Next check:    2026-11-20T22:11:36Z

Next window starts after 2026-11-20T12:00:00Z:
  windows[0]  Fri 2026-11-20 22:00 GMT     Europe/London        2026-11-20T22:00:00Z
"
    );
    let json: serde_json::Value = serde_json::from_str(&render_json(&deferred)).unwrap();
    assert_eq!(json["machineUid"], "machine-c");
    assert_eq!(
        json["decision"]["slot"],
        json!({
            "at": "2026-11-20T22:11:36Z",
            "anchor": "2026-11-20T22:00:00Z",
            "offset": "11m36s",
            "span": "30m",
            "window": 0,
            "unstaggered": "2026-11-20T22:00:00Z",
        })
    );
    // Inside the window, before its slot: staggered.
    let inside = report(
        SCHEDULED,
        &Scenario {
            machine_uid: Some("machine-c".to_owned()),
            ..scenario("2026-11-20T22:05:00Z")
        },
    );
    assert_eq!(inside.decision.reason, Some("Staggered"));
    assert!(
        render_text(&inside)
            .contains("Decision:      Defer until 2026-11-20T22:11:36Z (Staggered)\n"),
        "{}",
        render_text(&inside)
    );
    // Without a UID the same instant renews: the preview shows when the spread begins.
    let unkeyed = report(SCHEDULED, &scenario("2026-11-20T22:05:00Z"));
    assert_eq!(unkeyed.decision.action, "RenewNow");
    assert_eq!(unkeyed.decision.slot.as_ref().map(|slot| slot.at), None);
    // A spread of 0s says so.
    let off = policy("clusterSelector: {}\npolicy: Automatic\nspread: 0s");
    assert!(render_text(&report_of(&off)).contains(
        "Spread:        0s (off: Machines allowed at the same instant start together)\n"
    ));
}

#[test]
fn a_spread_longer_than_a_week_is_invalid() {
    let text = policy("clusterSelector: {}\npolicy: Automatic\nspread: 8d");
    let report = report_of(&text);
    assert_eq!(report.exit_code(), EXIT_INVALID_POLICY);
    assert_eq!(
        report.decision.errors,
        [
            "spread: 1w1d is too long: at most 7d (Machines that may renew at the same instant start within this span; 0 turns staggering off)"
        ]
    );
    let negative = load(
        Path::new("p.yaml"),
        &policy("clusterSelector: {}\npolicy: Automatic\nspread: -5m"),
    )
    .unwrap();
    assert_eq!(
        negative.problems,
        [
            "spread: invalid spread \"-5m\": negative durations are not allowed; expected 0 (no staggering) or a positive duration such as 15m, 1h or 2h30m (units: y=365d, mo=30d, w, d, h, m, s)"
        ]
    );
}

#[test]
fn window_starts_are_in_summer_time_when_london_is() {
    let scenario = Scenario {
        expiry: utc("2026-07-20T00:00:00Z"),
        window_starts: 2,
        ..scenario("2026-06-22T12:00:00Z")
    };
    let report = report(SCHEDULED, &scenario);
    let starts: Vec<(String, String)> = report
        .window_starts
        .iter()
        .map(|start| (start.local.clone(), start.utc.to_string()))
        .collect();
    // Wednesday 01:00 BST is Tuesday 00:00 UTC.
    assert_eq!(
        starts,
        [
            (
                "2026-06-24T01:00:00+01:00[Europe/London]".to_owned(),
                "2026-06-24T00:00:00Z".to_owned()
            ),
            (
                "2026-06-26T22:00:00+01:00[Europe/London]".to_owned(),
                "2026-06-26T21:00:00Z".to_owned()
            ),
        ]
    );
    let text = render_text(&report);
    assert_contains(
        &text,
        "  windows[1]  Wed 2026-06-24 01:00 BST     Europe/London        2026-06-24T00:00:00Z\n",
    );
}

#[test]
fn schedule_windows_show_their_next_openings() {
    // Due since Friday 2026-11-20 00:00Z. Weeknights from 22:00 New York time for 4 hours, and
    // a start/end window: both forms in one list.
    let text = policy(
        "clusterSelector: {}\npolicy: Scheduled\nwindows:\n  - schedule: \"0 22 * * 1-5\"\n    duration: 4h\n    timezone: America/New_York\n  - daysOfWeek: [Sunday]\n    start: \"03:00\"\n    end: \"04:00\"",
    );
    let report = report(&text, &scenario("2026-11-20T12:00:00Z"));
    assert_eq!(report.exit_code(), 0, "{:?}", report.decision.errors);
    let text = render_text(&report);
    assert_contains(
        &text,
        "Decision:      Defer until 2026-11-21T03:00:00Z (OutsideWindow)\n               Renewal deferred until the next maintenance window opens at 2026-11-20 22:00 America/New_York (2026-11-21T03:00:00Z)\n",
    );
    assert_ends_with(
        &text,
        "\
Next window starts after 2026-11-20T12:00:00Z:
  windows[0]  Fri 2026-11-20 22:00 EST     America/New_York     2026-11-21T03:00:00Z
  windows[1]  Sun 2026-11-22 03:00 UTC     UTC                  2026-11-22T03:00:00Z
  windows[0]  Mon 2026-11-23 22:00 EST     America/New_York     2026-11-24T03:00:00Z
  windows[0]  Tue 2026-11-24 22:00 EST     America/New_York     2026-11-25T03:00:00Z
  windows[0]  Wed 2026-11-25 22:00 EST     America/New_York     2026-11-26T03:00:00Z
",
    );
}

#[test]
fn schedule_windows_across_the_repeated_hour_open_once() {
    // New York repeats 01:00-02:00 on 2026-11-01: 01:30 opens once, in summer time.
    let text = policy(
        "clusterSelector: {}\npolicy: Scheduled\nwindows:\n  - schedule: \"30 1 * * *\"\n    duration: 1h\n    timezone: America/New_York",
    );
    let scenario = Scenario {
        window_starts: 3,
        ..scenario("2026-10-30T12:00:00Z")
    };
    let text = render_text(&report(&text, &scenario));
    assert_ends_with(
        &text,
        "\
  windows[0]  Sat 2026-10-31 01:30 EDT     America/New_York     2026-10-31T05:30:00Z
  windows[0]  Sun 2026-11-01 01:30 EDT     America/New_York     2026-11-01T05:30:00Z
  windows[0]  Mon 2026-11-02 01:30 EST     America/New_York     2026-11-02T06:30:00Z
",
    );
}

#[test]
fn renew_before_percentage_takes_the_ttl_for_the_lifetime() {
    let text =
        policy("clusterSelector: {}\npolicy: Automatic\nrenewBeforePercentage: 10\nttl: 100d");
    let report = report(&text, &scenario("2026-11-20T12:00:00Z"));
    assert_eq!(
        report.policy.renew_before.as_deref(),
        Some("10% of the certificates' lifetime (taken as ttl, 3mo1w3d)")
    );
    // 10 days before the expiry of 2026-12-20.
    assert_eq!(report.decision.due_at, Some(utc("2026-12-10T00:00:00Z")));
    let both = policy(
        "clusterSelector: {}\npolicy: Automatic\nrenewBefore: 10d\nrenewBeforePercentage: 10",
    );
    let report = report_of(&both);
    assert_eq!(report.exit_code(), EXIT_INVALID_POLICY);
}

fn report_of(text: &str) -> Report {
    report(text, &scenario("2026-11-20T12:00:00Z"))
}

#[test]
fn inside_a_window_renews_now() {
    // Saturday 2026-11-21 02:00 GMT is inside Friday night's window.
    let report = report(SCHEDULED, &scenario("2026-11-21T02:00:00Z"));
    assert_eq!(report.decision.action, "RenewNow");
    assert_eq!(report.decision.reason, Some("Due"));
    assert_eq!(report.decision.window, Some(0));
    assert_eq!(report.decision.requeue_at, None);
    assert!(render_text(&report).contains("Decision:      Renew now (Due)\n"));
}

#[test]
fn within_the_fail_safe_margin_windows_are_bypassed_unless_strict() {
    let strict = Scenario {
        settings: Settings {
            strict: true,
            backoff: Backoff::default(),
        },
        // Friday 2026-12-18 12:00Z: inside the 48h margin (from 00:00), before the 22:00 window.
        ..scenario("2026-12-18T12:00:00Z")
    };
    let deferred = report(SCHEDULED, &strict);
    assert_eq!(deferred.decision.action, "Defer");
    assert_eq!(deferred.decision.reason, Some("OutsideWindow"));
    assert!(deferred.decision.warning);
    let text = render_text(&deferred);
    assert_contains(&text, "Strict:        yes (windows are never bypassed)\n");
    assert_contains(
        &text,
        "Decision:      Defer until 2026-12-18T22:00:00Z (OutsideWindow) [Warning]\n",
    );
    // Without strict windows, the same instant bypasses them.
    let bypass = report(SCHEDULED, &scenario("2026-12-18T12:00:00Z"));
    assert_eq!(bypass.decision.action, "RenewNow");
    assert_eq!(bypass.decision.reason, Some("FailSafeBypass"));
}

#[test]
fn automatic_and_disabled_samples() {
    let automatic = report(AUTOMATIC, &scenario("2026-11-19T12:00:00Z"));
    assert_eq!(automatic.decision.action, "Defer");
    assert_eq!(automatic.decision.reason, Some("NotDue"));
    assert_eq!(automatic.decision.until, Some(utc("2026-11-20T00:00:00Z")));
    assert!(automatic.window_starts.is_empty());
    assert_eq!(
        automatic.policy.selects.as_deref(),
        Some("Machines whose Cluster matches \"env in (dev,test)\"")
    );
    let disabled = report(DISABLED, &scenario("2026-12-19T12:00:00Z"));
    assert_eq!(disabled.decision.action, "Disabled");
    assert!(disabled.decision.warning);
    assert_eq!(
        disabled.decision.message,
        "Automatic renewal is disabled by the policy; certificates expire at 2026-12-20T00:00:00Z, within the fail-safe margin: renew them manually with the v1beta2.k8sd.io/refresh-certificates annotation"
    );
    assert_eq!(disabled.exit_code(), 0);
}

#[test]
fn automatic_with_windows_says_they_are_ignored() {
    let text = policy(
        "machineSelector: {}\npolicy: Automatic\nwindows:\n  - start: \"01:00\"\n    end: \"02:00\"",
    );
    let report = report(&text, &scenario("2026-11-20T12:00:00Z"));
    assert!(report.decision.windows_ignored);
    assert!(render_text(&report).contains(WINDOWS_IGNORED_MESSAGE));
}

#[test]
fn json_has_a_stable_shape() {
    let scenario = Scenario {
        failures: Failures {
            count: Some(3),
            last_failure: Some(utc("2026-12-18T11:30:00Z")),
        },
        window_starts: 1,
        ..scenario("2026-12-18T12:00:00Z")
    };
    let value: serde_json::Value =
        serde_json::from_str(&render_json(&report(SCHEDULED, &scenario))).unwrap();
    assert_eq!(
        value,
        json!({
            "policy": {
                "namespace": "default",
                "name": "nightly-london",
                "selects": "Machines whose Cluster matches \"env=prod\"",
                "mode": "Scheduled",
                "renewBefore": "1mo",
                "ttl": "1y",
                "failSafeMargin": "2d",
                "spread": "30m",
                "windows": 2,
            },
            "now": "2026-12-18T12:00:00Z",
            "expiry": "2026-12-20T00:00:00Z",
            "strict": false,
            "failures": {"count": 3, "lastFailureTime": "2026-12-18T11:30:00Z"},
            "decision": {
                "action": "Defer",
                "reason": "Backoff",
                "until": "2026-12-18T12:30:00Z",
                "resume": "FailSafeBypass",
                "dueAt": "2026-11-20T00:00:00Z",
                "failSafeAt": "2026-12-18T00:00:00Z",
                "warning": true,
                "windowsIgnored": false,
                "requeueAt": "2026-12-18T12:30:00Z",
                "message": "Renewal backed off after 3 failed attempts until 2026-12-18T12:30:00Z, then retrying outside the maintenance windows as certificates expire at 2026-12-20T00:00:00Z, within the fail-safe margin",
            },
            "windowStarts": [{
                "window": 0,
                "timezone": "Europe/London",
                "local": "2026-12-18T22:00:00+00:00[Europe/London]",
                "utc": "2026-12-18T22:00:00Z",
            }],
        })
    );
}

#[test]
fn an_invalid_policy_gets_the_controllers_message_and_exit_code_2() {
    let text = policy(
        "clusterSelector: {}\npolicy: Scheduled\nrenewBefore: 2y\nwindows:\n  - start: \"01:00\"\n    end: \"01:00\"\n    timezone: europe/london",
    );
    let report = report(&text, &scenario("2026-11-20T12:00:00Z"));
    assert_eq!(report.exit_code(), EXIT_INVALID_POLICY);
    let spec: CertificateRenewalPolicy = serde_yaml::from_str(&text).unwrap();
    let controller = validate(&spec.spec).unwrap_err();
    assert_eq!(report.decision.message, controller.to_string());
    assert_eq!(
        report.decision.errors,
        [
            "windows[0].end: must differ from start (01:00): the window would be empty; a whole day is 00:00 to 24:00",
            "windows[0].timezone: \"europe/london\" is not an IANA time zone name: names are case-sensitive, did you mean \"Europe/London\"?",
            "renewBefore: 2y must be shorter than ttl (1y), or every renewal would be due again at once",
        ]
    );
    assert!(report.window_starts.is_empty());
    assert_eq!(
        render_text(&report),
        "\
Policy:        test
Expiry:        2026-12-20T00:00:00Z
Now:           2026-11-20T12:00:00Z

Decision:      Invalid: no automatic renewal until the policy is fixed (condition Valid is False)
               Renewal policy is invalid:
               - windows[0].end: must differ from start (01:00): the window would be empty; a whole day is 00:00 to 24:00
               - windows[0].timezone: \"europe/london\" is not an IANA time zone name: names are case-sensitive, did you mean \"Europe/London\"?
               - renewBefore: 2y must be shorter than ttl (1y), or every renewal would be due again at once
"
    );
    let json: serde_json::Value = serde_json::from_str(&render_json(&report)).unwrap();
    assert_eq!(json["decision"]["action"], "Invalid");
    assert_eq!(json["decision"]["errors"].as_array().map(Vec::len), Some(3));
    assert_eq!(json["policy"], json!({"name": "test"}));
}

#[test]
fn one_invalid_field_is_one_line() {
    let text = policy("policy: Automatic");
    let report = report(&text, &scenario("2026-11-20T12:00:00Z"));
    assert!(
        render_text(&report).ends_with("\
Decision:      Invalid: no automatic renewal until the policy is fixed (condition Valid is False)
               Renewal policy is invalid: clusterSelector, machineSelector: at least one must be set; an empty selector ({}) selects every Cluster or Machine of the namespace
"),
        "{}",
        render_text(&report)
    );
}

#[test]
fn unknown_fields_are_invalid_like_kubectls_strict_validation() {
    let text = policy(
        "clusterSelector:\n  matchLabel: {env: prod}\npolicy: Automatic\nrenewbefore: 10d\nwindows:\n  - start: \"01:00\"\n    end: \"02:00\"\n    zone: UTC",
    );
    let loaded = load(Path::new("p.yaml"), &text).unwrap();
    assert_eq!(
        loaded.problems,
        [
            "clusterSelector.matchLabel: unknown field",
            "renewbefore: unknown field",
            "windows[0].zone: unknown field",
        ]
    );
    let report = preview(&loaded, &scenario("2026-11-20T12:00:00Z"));
    assert_eq!(report.exit_code(), EXIT_INVALID_POLICY);
    // Label values and matchLabels keys are free-form.
    let text =
        policy("clusterSelector:\n  matchLabels: {anything.example.com/x: y}\npolicy: Automatic");
    assert!(
        load(Path::new("p.yaml"), &text)
            .unwrap()
            .problems
            .is_empty()
    );
}

#[test]
fn values_of_the_wrong_form_are_reported_with_their_paths() {
    let text = policy(
        "clusterSelector: {}\npolicy: Sometimes\nrenewBefore: 1.5d\nttl: 0s\nwindows:\n  - daysOfWeek: [monday, Sunday]\n    start: \"9:00\"\n    end: \"24:30\"\n    timezone: 3\nfailSafeMargin: -1h",
    );
    let loaded = load(Path::new("p.yaml"), &text).unwrap();
    assert_eq!(loaded.spec, None);
    assert_eq!(
        loaded.problems,
        [
            "policy: unknown variant `Sometimes`, expected one of `Automatic`, `Disabled`, `Scheduled`",
            "renewBefore: invalid duration \"1.5d\": fractions are not allowed (write 1h30m, not 1.5h); expected a positive duration such as 30d, 12h, 1h30m or 1w2d (units: y=365d, mo=30d, w, d, h, m, s)",
            "ttl: invalid TTL \"0s\": it must be longer than zero; expected a positive duration such as 1y, 6mo, 90d, 12h, 1h30m or 1y6mo (units: y=365d, mo=30d, w, d, h, m, s)",
            "windows[0].daysOfWeek[0]: unknown variant `monday`, expected one of `Monday`, `Tuesday`, `Wednesday`, `Thursday`, `Friday`, `Saturday`, `Sunday`",
            "windows[0].start: invalid time \"9:00\": expected HH:MM with two-digit hours and minutes, from 00:00 to 23:59, or 24:00 as an end",
            "windows[0].end: invalid time \"24:30\": expected HH:MM with two-digit hours and minutes, from 00:00 to 23:59, or 24:00 as an end",
            "windows[0].timezone: invalid type: integer `3`, expected a string",
            "failSafeMargin: invalid fail-safe margin \"-1h\": negative durations are not allowed; expected 0 (no fail-safe) or a positive duration such as 24h, 2d or 1d12h (units: y=365d, mo=30d, w, d, h, m, s)",
        ]
    );
    let report = preview(&loaded, &scenario("2026-11-20T12:00:00Z"));
    assert_eq!(report.exit_code(), EXIT_INVALID_POLICY);
    assert_eq!(report.decision.errors, loaded.problems);
}

#[test]
fn every_field_of_the_schema_is_checked_with_its_path() {
    let crd = serde_json::to_value(CertificateRenewalPolicy::crd()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let windows = &spec["properties"]["windows"]["items"]["properties"];
    let fields = spec["properties"].as_object().unwrap().keys();
    let window_fields = windows.as_object().unwrap().keys();
    let cases = fields
        .map(|field| (format!("{field}: [[]]"), field.clone()))
        .chain(window_fields.map(|field| {
            (
                format!("windows:\n  - {field}: [[]]"),
                format!("windows[0].{field}"),
            )
        }));
    let mut checked = 0;
    for (yaml, path) in cases {
        let spec: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
        let problems = field_problems(&spec);
        assert_eq!(problems.len(), 1, "{yaml}: {problems:?}");
        // `windows[0].daysOfWeek` reports its first item: `windows[0].daysOfWeek[0]: …`.
        assert!(problems[0].starts_with(&path), "{problems:?}");
        checked += 1;
    }
    assert_eq!(checked, 12 + 6);
    let not_a_window: serde_yaml::Value = serde_yaml::from_str("windows: [3]").unwrap();
    assert_eq!(
        field_problems(&not_a_window),
        ["windows: invalid type: integer `3`, expected a YAML mapping"]
    );
}

#[test]
fn a_missing_spec_or_policy_is_invalid() {
    let no_spec = "apiVersion: certificates.ck8s.io/v1alpha1\nkind: CertificateRenewalPolicy\nmetadata:\n  name: x\n";
    let loaded = load(Path::new("p.yaml"), no_spec).unwrap();
    assert_eq!(loaded.problems.len(), 1);
    assert!(
        loaded.problems[0].starts_with("missing field `spec`"),
        "{:?}",
        loaded.problems
    );
    let loaded = load(Path::new("p.yaml"), &policy("clusterSelector: {}")).unwrap();
    assert!(
        loaded.problems[0].starts_with("missing field `policy`"),
        "{:?}",
        loaded.problems
    );
    assert_eq!(
        preview(&loaded, &scenario("2026-11-20T12:00:00Z")).exit_code(),
        2
    );
}

#[test]
fn the_file_must_hold_exactly_one_policy() {
    let namespace = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ops\n";
    let with_namespace = format!(
        "{namespace}---\n{}",
        policy("machineSelector: {}\npolicy: Automatic")
    );
    let loaded = load(Path::new("p.yaml"), &with_namespace).unwrap();
    assert!(loaded.problems.is_empty(), "{:?}", loaded.problems);
    assert_eq!(loaded.name.as_deref(), Some("test"));

    let error = load(Path::new("p.yaml"), namespace).unwrap_err();
    assert_eq!(
        error.to_string(),
        "p.yaml holds 0 certificates.ck8s.io/v1alpha1 CertificateRenewalPolicy objects, preview needs exactly one (found: v1 Namespace)"
    );
    let two = format!(
        "{}---\n{}",
        policy("policy: Automatic"),
        policy("policy: Disabled")
    );
    assert!(matches!(
        load(Path::new("p.yaml"), &two),
        Err(PreviewError::PolicyCount { count: 2, .. })
    ));
    let other_version = policy("policy: Automatic").replace("v1alpha1", "v1");
    assert!(load(Path::new("p.yaml"), &other_version).is_err());
    assert!(matches!(
        load(Path::new("p.yaml"), "a: [b\n"),
        Err(PreviewError::Yaml { .. })
    ));
    assert!(matches!(
        load(Path::new("p.yaml"), ""),
        Err(PreviewError::PolicyCount { count: 0, .. })
    ));
}

#[test]
fn json_files_work_too() {
    let text = r#"{"apiVersion": "certificates.ck8s.io/v1alpha1", "kind": "CertificateRenewalPolicy",
        "metadata": {"name": "j", "namespace": "ops"},
        "spec": {"machineSelector": {}, "policy": "Disabled"}}"#;
    let report = report(text, &scenario("2026-11-20T12:00:00Z"));
    assert_eq!(report.decision.action, "Disabled");
    assert_eq!(report.policy.name.as_deref(), Some("j"));
}

#[test]
fn execute_reads_the_file_and_maps_errors_to_exit_codes() {
    let dir = std::env::temp_dir().join(format!("ck8s-certs-preview-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("policy.yaml");
    std::fs::write(&file, policy("policy: Automatic")).unwrap();
    let args = |file: &Path| PreviewArgs {
        file: file.to_owned(),
        expiry: utc("2026-12-20T00:00:00Z"),
        now: None,
        failures: None,
        last_failure: None,
        strict: false,
        machine_uid: None,
        backoff_min: crate::policy::backoff::DEFAULT_MIN,
        backoff_max: crate::policy::backoff::DEFAULT_MAX,
        window_starts: 5,
        output: OutputFormat::Json,
    };
    let (output, code) = execute(&args(&file), utc("2026-11-20T12:00:00Z")).unwrap();
    assert_eq!(code, EXIT_INVALID_POLICY);
    let json: serde_json::Value = serde_json::from_str(&output).unwrap();
    assert_eq!(json["now"], "2026-11-20T12:00:00Z");

    let missing = execute(
        &args(&dir.join("missing.yaml")),
        utc("2026-11-20T12:00:00Z"),
    );
    assert!(matches!(missing, Err(PreviewError::Read { .. })));

    let mut inverted = args(&file);
    inverted.backoff_min = crate::policy::backoff::DEFAULT_MAX;
    inverted.backoff_max = crate::policy::backoff::DEFAULT_MIN;
    let error = execute(&inverted, utc("2026-11-20T12:00:00Z")).unwrap_err();
    assert_eq!(
        error.to_string(),
        "the backoff minimum (1d8h) must not be longer than the maximum (1h)"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
