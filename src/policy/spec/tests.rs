use super::*;
use crate::policy::testing::utc;
use crate::policy::{Decision, DeferReason, decide, requeue_at};
use ck8s_certs_api::renewal_policy::{DEFAULT_FAIL_SAFE_MARGIN, DEFAULT_RENEW_BEFORE};
use jiff::SignedDuration;
use serde_json::json;

fn spec(value: serde_json::Value) -> CertificateRenewalPolicySpec {
    serde_json::from_value(value).unwrap()
}

fn messages(value: serde_json::Value) -> Vec<String> {
    validate(&spec(value))
        .unwrap_err()
        .errors
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn a_valid_spec_becomes_the_policy_half_of_an_input() {
    let policy = validate(&spec(json!({
        "clusterSelector": {"matchLabels": {"env": "prod"}},
        "policy": "Scheduled",
        "renewBefore": "14d",
        "ttl": "6mo",
        "windows": [{"daysOfWeek": ["Sunday"], "start": "22:00", "end": "02:00", "timezone": "Europe/London"}],
        "failSafeMargin": "2d",
    })))
    .unwrap();
    let failures = Failures {
        count: Some(2),
        last_failure: Some(utc("2026-11-01T00:00:00Z")),
    };
    let settings = Settings {
        strict: true,
        backoff: Backoff::default(),
    };
    let input = policy.input(Some(utc("2026-12-20T00:00:00Z")), failures, settings);
    assert_eq!(input.mode, Mode::Scheduled);
    assert_eq!(input.renew_before().to_string(), "2w");
    assert_eq!(input.ttl.map(|ttl| ttl.to_string()), Some("6mo".into()));
    assert_eq!(input.fail_safe_margin().to_string(), "2d");
    assert_eq!(input.windows, policy.windows);
    assert_eq!(input.failures, failures);
    assert!(input.strict);
    assert!(!policy.windows_ignored());
    // 2026-11-22 is a Sunday: the first opening after Saturday noon.
    let starts = policy.upcoming_starts(utc("2026-11-21T12:00:00Z"), 2);
    let starts: Vec<String> = starts.iter().map(ToString::to_string).collect();
    assert_eq!(
        starts,
        [
            "2026-11-22 22:00 Europe/London (2026-11-22T22:00:00Z)",
            "2026-11-29 22:00 Europe/London (2026-11-29T22:00:00Z)",
        ]
    );
}

#[test]
fn omitted_durations_are_the_defaults() {
    let policy = validate(&spec(json!({"machineSelector": {}, "policy": "Automatic"}))).unwrap();
    assert_eq!(policy.renew_before, None);
    assert_eq!(policy.renew_before_percentage, None);
    let input = policy.input(None, Failures::default(), Settings::default());
    assert_eq!(input.renew_before(), DEFAULT_RENEW_BEFORE);
    assert_eq!(
        input.due_at(utc("2026-12-20T00:00:00Z")),
        utc("2026-11-20T00:00:00Z")
    );
    assert_eq!(policy.fail_safe_margin, DEFAULT_FAIL_SAFE_MARGIN);
    assert_eq!(policy.ttl.to_string(), "1y");
    assert!(
        policy
            .upcoming_starts(utc("2026-11-21T12:00:00Z"), 5)
            .is_empty()
    );
}

#[test]
fn renew_before_percentage_is_a_share_of_the_lifetime() {
    let policy = validate(&spec(json!({
        "machineSelector": {},
        "policy": "Automatic",
        "renewBeforePercentage": 25,
        "ttl": "100d",
    })))
    .unwrap();
    let expiry = utc("2026-12-20T00:00:00Z");
    let input = policy.input(Some(expiry), Failures::default(), Settings::default());
    // Lifetime start unknown: the policy's ttl (100d) is the lifetime, due 25d before.
    assert_eq!(input.lifetime(expiry), SignedDuration::from_hours(100 * 24));
    assert_eq!(input.due_at(expiry), utc("2026-11-25T00:00:00Z"));
    // Known start: a 40-day lifetime, due 10 days before expiry.
    let known = input
        .clone()
        .with_lifetime_start(Some(utc("2026-11-10T00:00:00Z")));
    assert_eq!(known.due_at(expiry), utc("2026-12-10T00:00:00Z"));
    // Whole seconds, rounded down: 25% of 40d + 4s is 10d + 1s; of 40d + 3s, 10d + 0.75s.
    let four = input
        .clone()
        .with_lifetime_start(Some(utc("2026-11-09T23:59:56Z")));
    assert_eq!(four.due_at(expiry), utc("2026-12-09T23:59:59Z"));
    let three = input
        .clone()
        .with_lifetime_start(Some(utc("2026-11-09T23:59:57Z")));
    assert_eq!(three.due_at(expiry), utc("2026-12-10T00:00:00Z"));
    // A start at or after expiry is not a lifetime: the ttl stands in.
    let nonsense = input.clone().with_lifetime_start(Some(expiry));
    assert_eq!(nonsense.due_at(expiry), utc("2026-11-25T00:00:00Z"));
    // The decision uses it.
    let decision = crate::policy::decide(&known, utc("2026-12-01T00:00:00Z"));
    assert_eq!(requeue_at(&decision), Some(utc("2026-12-10T00:00:00Z")));
    // renewBefore not shorter than ttl is not checked against a percentage's default.
    let short_ttl = spec(json!({
        "machineSelector": {}, "policy": "Automatic", "renewBeforePercentage": 50, "ttl": "7d",
    }));
    assert!(validate(&short_ttl).is_ok());
}

#[test]
fn the_lifetime_starts_with_the_refresh_that_issued_the_certificates() {
    use ck8s_certs_api::machine_certificates::{Operation, Origin};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let expiry = Time(utc("2027-11-20T00:00:30Z"));
    let operation = |phase, new_expiry: Option<&Time>| Operation {
        phase,
        new_expiry: new_expiry.cloned(),
        finished_at: Some(Time(utc("2026-11-20T00:01:00Z"))),
        ..Operation::pending(
            Origin::Policy,
            None,
            None,
            "1y".into(),
            365 * 86_400,
            Time(utc("2026-11-20T00:00:00Z")),
        )
    };
    let status = |operation: Option<Operation>, expiry: Option<&Time>| MachineCertificatesStatus {
        operation,
        expiry: expiry.cloned(),
        ..Default::default()
    };
    let issued = status(
        Some(operation(Phase::Succeeded, Some(&expiry))),
        Some(&expiry),
    );
    assert_eq!(lifetime_start(&issued), Some(utc("2026-11-20T00:00:00Z")));
    let other = Time(utc("2030-01-01T00:00:00Z"));
    for (status, why) in [
        (
            status(None, Some(&expiry)),
            "no refresh recorded (bootstrap certificates)",
        ),
        (
            status(Some(operation(Phase::Failed, None)), Some(&expiry)),
            "the last refresh failed",
        ),
        (
            status(Some(operation(Phase::Running, None)), Some(&expiry)),
            "a refresh in flight",
        ),
        (
            status(
                Some(operation(Phase::Succeeded, Some(&expiry))),
                Some(&other),
            ),
            "the expiry changed since (read from k8sd)",
        ),
        (
            status(Some(operation(Phase::Succeeded, Some(&expiry))), None),
            "no expiry",
        ),
    ] {
        assert_eq!(lifetime_start(&status), None, "{why}");
    }
}

#[test]
fn automatic_with_windows_ignores_them() {
    let policy = validate(&spec(json!({
        "machineSelector": {},
        "policy": "Automatic",
        "windows": [{"start": "01:00", "end": "02:00"}],
    })))
    .unwrap();
    assert!(policy.windows_ignored());
}

#[test]
fn every_problem_is_reported_with_its_field_path() {
    let rows: &[(serde_json::Value, &[&str])] = &[
        (
            json!({"policy": "Automatic"}),
            &[
                "clusterSelector, machineSelector: at least one must be set; an empty selector ({}) selects every Cluster or Machine of the namespace",
            ],
        ),
        (
            json!({"clusterSelector": {}, "policy": "Scheduled"}),
            &[
                "windows: policy Scheduled needs at least one window (use Automatic to renew at any time)",
            ],
        ),
        (
            json!({"clusterSelector": {}, "policy": "Automatic", "renewBefore": "1y", "ttl": "1y"}),
            &[
                "renewBefore: 1y must be shorter than ttl (1y), or every renewal would be due again at once",
            ],
        ),
        (
            json!({"clusterSelector": {}, "policy": "Automatic", "renewBefore": "10d", "renewBeforePercentage": 20}),
            &[
                "renewBeforePercentage: set at most one of renewBefore (a duration before expiry) and renewBeforePercentage (a percentage of the certificates' lifetime)",
            ],
        ),
        (
            json!({"clusterSelector": {}, "policy": "Automatic", "renewBeforePercentage": 0}),
            &[
                "renewBeforePercentage: 0 is out of range: give a percentage of the certificates' lifetime from 1 to 99",
            ],
        ),
        (
            json!({"clusterSelector": {}, "policy": "Automatic", "renewBeforePercentage": 100}),
            &[
                "renewBeforePercentage: 100 is out of range: give a percentage of the certificates' lifetime from 1 to 99",
            ],
        ),
        (
            json!({"clusterSelector": {}, "policy": "Scheduled", "windows": [
                {"schedule": "0 0 31 2 *", "duration": "4h"},
                {"schedule": "0 22 * * 1-5", "start": "22:00", "end": "02:00", "duration": "4h"},
            ]}),
            &[
                "windows[0].schedule: \"0 0 31 2 *\" never fires: no date has that day of the month in that month (such as February 31st)",
                "windows[1].schedule: cannot be combined with start, end or daysOfWeek: a window is either start and end (with optional daysOfWeek), or schedule and duration",
            ],
        ),
        // An invalid window makes the policy invalid whatever its mode.
        (
            json!({"clusterSelector": {}, "policy": "Disabled", "windows": [
                {"start": "01:00", "end": "02:00", "timezone": "europe/london"},
                {"start": "24:00", "end": "01:00"},
                {"start": "03:00", "end": "03:00", "timezone": ""},
            ]}),
            &[
                "windows[0].timezone: \"europe/london\" is not an IANA time zone name: names are case-sensitive, did you mean \"Europe/London\"?",
                "windows[1].start: 24:00 is only allowed as an end; a window that opens at midnight starts at 00:00",
                "windows[2].end: must differ from start (03:00): the window would be empty; a whole day is 00:00 to 24:00",
                "windows[2].timezone: must not be empty: omit it for UTC, or give an IANA name such as Europe/London",
            ],
        ),
        (
            json!({
                "clusterSelector": {"matchLabels": {"-bad": "ok", "env": "not ok"}},
                "machineSelector": {"matchExpressions": [
                    {"key": "tier", "operator": "Equals", "values": ["a"]},
                    {"key": "tier", "operator": "In"},
                    {"key": "Example.com/tier", "operator": "Exists", "values": ["a"]},
                    {"key": "example.com/tier", "operator": "NotIn", "values": ["ok", "a b"]},
                ]},
                "policy": "Automatic",
            }),
            &[
                "clusterSelector.matchLabels: key \"-bad\" is not a valid label key: the name must be 1 to 63 characters, alphanumeric at both ends, with -, _ or . inside",
                "clusterSelector.matchLabels: value \"not ok\" of \"env\" is not a valid label value: at most 63 characters, alphanumeric at both ends, with -, _ or . inside",
                "machineSelector.matchExpressions[0].operator: \"Equals\" is not an operator: use In, NotIn, Exists or DoesNotExist",
                "machineSelector.matchExpressions[1].values: must be non-empty when the operator is In",
                "machineSelector.matchExpressions[2].key: \"Example.com/tier\" is not a valid label key: its prefix must be a DNS subdomain (such as example.com)",
                "machineSelector.matchExpressions[2].values: must be empty when the operator is Exists",
                "machineSelector.matchExpressions[3].values[1]: \"a b\" is not a valid label value: at most 63 characters, alphanumeric at both ends, with -, _ or . inside",
            ],
        ),
    ];
    for (value, expected) in rows {
        assert_eq!(&messages(value.clone()), expected, "{value}");
    }
    let too_many: Vec<_> = (0..=MAX_WINDOWS)
        .map(|_| json!({"start": "01:00", "end": "02:00"}))
        .collect();
    assert_eq!(
        messages(json!({"clusterSelector": {}, "policy": "Scheduled", "windows": too_many})),
        ["windows: 33 windows, at most 32 are allowed"]
    );
}

#[test]
fn the_message_is_the_same_as_the_decisions() {
    let value = json!({"clusterSelector": {}, "policy": "Scheduled", "renewBefore": "2y"});
    let invalid = validate(&spec(value)).unwrap_err();
    let message = invalid.to_string();
    assert_eq!(
        message,
        "Renewal policy is invalid: windows: policy Scheduled needs at least one window (use Automatic to renew at any time); renewBefore: 2y must be shorter than ttl (1y), or every renewal would be due again at once"
    );
    assert_eq!(Decision::from(invalid).to_string(), message);
}

#[test]
fn the_input_decides_like_the_policy_says() {
    let policy = validate(&spec(json!({
        "clusterSelector": {},
        "policy": "Scheduled",
        "windows": [{"daysOfWeek": ["Tuesday"], "start": "02:00", "end": "04:00", "timezone": "Europe/London"}],
    })))
    .unwrap();
    let input = policy.input(
        Some(utc("2026-12-20T00:00:00Z")),
        Failures::default(),
        Settings::default(),
    );
    // Due on Friday 2026-11-20: the next window is Tuesday 2026-11-24 02:00 GMT.
    match decide(&input, utc("2026-11-20T12:00:00Z")) {
        Decision::Defer(deferral) => {
            assert_eq!(deferral.reason, DeferReason::OutsideWindow);
            assert_eq!(deferral.until, utc("2026-11-24T02:00:00Z"));
        }
        other => panic!("expected a deferral, got {other:?}"),
    }
}

#[test]
fn a_machine_matches_when_both_selectors_that_are_set_match() {
    let prod = labels(&[("env", "prod")]);
    let dev = labels(&[("env", "dev")]);
    let workers = labels(&[("role", "worker")]);
    let none = labels(&[]);
    let selector = |value: serde_json::Value| {
        let mut value = value;
        value["policy"] = json!("Automatic");
        validate(&spec(value)).unwrap().selector
    };
    let by_cluster = selector(json!({"clusterSelector": {"matchLabels": {"env": "prod"}}}));
    let by_machine = selector(json!({"machineSelector": {"matchLabels": {"role": "worker"}}}));
    let both = selector(json!({
        "clusterSelector": {"matchLabels": {"env": "prod"}},
        "machineSelector": {"matchExpressions": [{"key": "role", "operator": "In", "values": ["worker"]}]},
    }));
    let every_cluster = selector(json!({"clusterSelector": {}}));
    let every_machine = selector(json!({"machineSelector": {}}));
    type Row<'a> = (
        &'a MachineSelector,
        Option<&'a BTreeMap<String, String>>,
        &'a BTreeMap<String, String>,
        bool,
    );
    let rows: &[Row] = &[
        (&by_cluster, Some(&prod), &none, true),
        (&by_cluster, Some(&dev), &workers, false),
        // The Cluster is unknown: a cluster selector cannot match.
        (&by_cluster, None, &workers, false),
        (&by_machine, None, &workers, true),
        (&by_machine, Some(&prod), &none, false),
        (&both, Some(&prod), &workers, true),
        (&both, Some(&prod), &none, false),
        (&both, Some(&dev), &workers, false),
        (&every_cluster, Some(&none), &none, true),
        (&every_cluster, None, &none, false),
        (&every_machine, None, &none, true),
    ];
    for (i, (selector, cluster, machine, expected)) in rows.iter().enumerate() {
        assert_eq!(selector.matches(*cluster, machine), *expected, "row {i}");
    }
    assert_eq!(
        both.to_string(),
        "Machines whose Cluster matches \"env=prod\" and that match \"role in (worker)\""
    );
    assert_eq!(
        by_machine.to_string(),
        "Machines that match \"role=worker\""
    );
    assert_eq!(every_cluster.to_string(), "every Machine");
    assert_eq!(
        both.cluster().map(ToString::to_string),
        Some("env=prod".into())
    );
}

#[test]
fn label_syntax_follows_the_api_server() {
    for key in ["a", "app.kubernetes.io/name", "x_y.z-1", &"a".repeat(63)] {
        assert_eq!(check_label_key(key), Ok(()), "{key}");
    }
    for key in [
        "",
        "-a",
        "a-",
        "a/b/c",
        "A.com/x",
        "/x",
        "x/",
        &"a".repeat(64),
    ] {
        assert!(check_label_key(key).is_err(), "{key}");
    }
    for value in ["", "prod", "v1.2_3-a"] {
        assert_eq!(check_label_value(value), Ok(()), "{value}");
    }
    for value in ["-x", "a b", "é", &"a".repeat(64)] {
        assert!(check_label_value(value).is_err(), "{value}");
    }
}

#[test]
fn a_policy_s_input_carries_its_checked_windows_and_decides_as_a_bare_one() {
    let policy = validate(&spec(json!({
        "machineSelector": {},
        "policy": "Scheduled",
        "windows": [
            {"daysOfWeek": ["Sunday"], "start": "22:00", "end": "02:00", "timezone": "Europe/London"},
            {"schedule": "0 3 * * 1-5", "duration": "2h", "timezone": "America/New_York"},
        ],
    })))
    .unwrap();
    let input = policy.input(
        Some(utc("2026-12-20T00:00:00Z")),
        Failures::default(),
        Settings::default(),
    );
    // Checked when the policy was read: `decide` checks nothing again.
    assert!(input.checked.is_some());
    let bare = Input {
        checked: None,
        ..input.clone()
    };
    for now in [
        "2026-11-28T12:00:00Z",
        "2026-11-29T22:30:00Z",
        "2026-12-01T08:30:00Z",
        "2026-12-19T23:00:00Z",
    ] {
        assert_eq!(decide(&input, utc(now)), decide(&bare, utc(now)), "{now}");
    }
}

#[test]
fn replacing_workers_is_opted_into_with_a_share_of_a_machine_deployment() {
    let with = |impossible: serde_json::Value| {
        validate(&spec(json!({
            "machineSelector": {}, "policy": "Automatic", "inPlaceImpossible": impossible,
        })))
    };
    let replace = |impossible: serde_json::Value| with(impossible).map(|p| p.replace);
    assert_eq!(
        validate(&spec(json!({"machineSelector": {}, "policy": "Automatic"})))
            .unwrap()
            .replace,
        None
    );
    assert_eq!(replace(json!({"action": "Report"})).unwrap(), None);
    assert_eq!(
        replace(json!({"action": "Replace"})).unwrap(),
        Some(MaxUnavailable::Count(1))
    );
    assert_eq!(
        replace(json!({"action": "Replace", "maxUnavailable": 0})).unwrap(),
        Some(MaxUnavailable::Count(0))
    );
    assert_eq!(
        replace(json!({"action": "Replace", "maxUnavailable": "25%"})).unwrap(),
        Some(MaxUnavailable::Percent(25))
    );
    for bad in [
        json!(-1),
        json!("25"),
        json!("101%"),
        json!("x%"),
        json!("-5%"),
    ] {
        let errors = with(json!({"action": "Replace", "maxUnavailable": bad}))
            .unwrap_err()
            .errors;
        assert!(
            matches!(errors.as_slice(), [PolicyError::MaxUnavailable(_)]),
            "{bad}: {errors:?}"
        );
    }
    // Rounded down, as CAPI's maxUnavailable is: 25% of 3 Machines is none.
    let cases = [
        (MaxUnavailable::Count(1), 3, 1),
        (MaxUnavailable::Count(2), 1, 2),
        (MaxUnavailable::Percent(25), 3, 0),
        (MaxUnavailable::Percent(25), 4, 1),
        (MaxUnavailable::Percent(100), 5, 5),
        (MaxUnavailable::Percent(0), 5, 0),
    ];
    for (max, machines, allowed) in cases {
        assert_eq!(max.of(machines), allowed, "{max:?} of {machines}");
    }
}
