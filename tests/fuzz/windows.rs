//! Maintenance windows and the policy spec that holds them: a `CertificateRenewalPolicy` spec
//! as JSON (what the API server hands the controller; `policy preview` reads the same shape),
//! deserialised (`WallTime`, `DayOfWeek`, the durations), checked by `policy::validate` (both
//! window forms, zones, selectors, durations against each other), then, when valid, asked what
//! the controller asks: the decision for a Machine at a few instants and expiries (node answers
//! reach the whole calendar), the next openings, the occurrence an instant belongs to.

use std::collections::BTreeMap;

use ck8s_certs::policy::window::{self, ValidateWindow};
use ck8s_certs::policy::{Failures, Settings, decide, requeue_at, validate};
use ck8s_certs_api::renewal_policy::CertificateRenewalPolicySpec;
use jiff::Timestamp;
use serde_json::{Value, json};

use super::cron::instant;
use super::harness::{Rng, hash};
use super::{cron, mutate, ttl};

pub const WORDS: &[&str] = &[
    "Automatic",
    "Scheduled",
    "Disabled",
    "Monday",
    "Friday",
    "Sunday",
    "monday",
    "00:00",
    "23:59",
    "24:00",
    "22:00",
    "04:00",
    "25:00",
    "7:00",
    "Europe/London",
    "europe/london",
    "America/New_York",
    "Etc/Unknown",
    "UTC",
    "utc",
    "Pacific/Apia",
    "Australia/Lord_Howe",
    "env",
    "prod",
    "In",
    "NotIn",
    "Exists",
    "DoesNotExist",
    "Gt",
    "cluster.x-k8s.io/cluster-name",
    "example.com/",
    "a/b/c",
    "-a",
];

/// Mostly a valid duration: one bad field fails the whole spec's decoding, and the paths past
/// decoding are the ones worth fuzzing.
fn duration(rng: &mut Rng, zero: bool) -> &'static str {
    const VALID: &[&str] = &[
        "1y",
        "6mo",
        "90d",
        "30d",
        "2w",
        "24h",
        "12h",
        "1h30m",
        "15m",
        "1s",
        "7d",
        "8d",
        "10000y",
        "9999y11mo",
    ];
    match rng.below(20) {
        0 => rng.pick(ttl::WORDS),
        1 if zero => rng.pick(&["0", "0s"]),
        _ => rng.pick(VALID),
    }
}

/// A label key or value: mostly valid, so that selectors compile.
fn label(rng: &mut Rng) -> String {
    match rng.below(20) {
        0 => mutate::string(rng, WORDS),
        1 => rng.pick(&["", "-a", "a/b/c", "Example.com/x"]).to_owned(),
        _ => rng
            .pick(&["env", "prod", "tier", "a", "example.com/team", "x-y_z.1"])
            .to_owned(),
    }
}

fn time(rng: &mut Rng) -> String {
    match rng.below(100) {
        0 => rng
            .pick(&[
                "24:00", "00:00", "23:59", "25:00", "7:00", "07:0", "12:60", "", "ab:cd",
            ])
            .to_string(),
        _ => format!("{:02}:{:02}", rng.between(0, 23), rng.between(0, 59)),
    }
}

fn window(rng: &mut Rng) -> Value {
    let mut w = serde_json::Map::new();
    let daily = rng.chance(60);
    if daily || rng.chance(3) {
        if rng.chance(70) {
            let days: Vec<&str> = (0..rng.below(9))
                .map(|_| match rng.below(100) != 0 {
                    true => rng.pick(&[
                        "Monday",
                        "Tuesday",
                        "Wednesday",
                        "Thursday",
                        "Friday",
                        "Saturday",
                        "Sunday",
                    ]),
                    false => rng.pick(&["monday", "Mon", ""]),
                })
                .collect();
            w.insert("daysOfWeek".into(), json!(days));
        }
        if rng.chance(95) {
            w.insert("start".into(), json!(time(rng)));
        }
        if rng.chance(95) {
            w.insert("end".into(), json!(time(rng)));
        }
    }
    if !daily || rng.chance(3) {
        if rng.chance(95) {
            // Rarely one that never fires: rejecting it costs a search of the calendar.
            let schedule = match rng.below(50) {
                0 => rng
                    .pick(&["0 0 31 2 *", "0 0 30 2 *", "@reboot", "0 0 L * *"])
                    .to_owned(),
                1..=20 => rng
                    .pick(&[
                        "@daily",
                        "@weekly",
                        "0 22 * * 1-5",
                        "*/15 * * * *",
                        "30 1 * * 0",
                    ])
                    .to_owned(),
                _ => cron::generate_text(rng),
            };
            w.insert("schedule".into(), json!(schedule));
        }
        if rng.chance(95) {
            w.insert("duration".into(), json!(duration(rng, false)));
        }
    }
    if rng.chance(80) {
        let zone = match rng.below(20) {
            0 => mutate::string(rng, WORDS),
            1 | 2 => rng
                .pick(&["europe/london", "Etc/Unknown", "", "Mars/Olympus"])
                .to_owned(),
            _ => rng
                .pick(&[
                    "Europe/London",
                    "America/New_York",
                    "UTC",
                    "Pacific/Apia",
                    "Australia/Lord_Howe",
                    "Asia/Kathmandu",
                    "America/Santiago",
                    "Antarctica/Troll",
                    "EST5EDT",
                    "Etc/GMT+14",
                ])
                .to_owned(),
        };
        w.insert("timezone".into(), json!(zone));
    }
    Value::Object(w)
}

fn selector(rng: &mut Rng) -> Value {
    let mut s = serde_json::Map::new();
    if rng.chance(60) {
        let labels: serde_json::Map<String, Value> = (0..rng.below(3))
            .map(|_| (label(rng), json!(label(rng))))
            .collect();
        s.insert("matchLabels".into(), Value::Object(labels));
    }
    if rng.chance(40) {
        let expressions: Vec<Value> = (0..rng.below(3))
            .map(|_| {
                let operator = match rng.chance(90) {
                    true => rng.pick(&["In", "NotIn", "Exists", "DoesNotExist"]),
                    false => rng.pick(&["Gt", "", "in"]),
                };
                // Values go with In and NotIn only, mostly.
                let count = match (operator, rng.chance(90)) {
                    ("In" | "NotIn", true) => 1 + rng.below(3),
                    (_, true) => 0,
                    (_, false) => rng.below(3),
                };
                let values: Vec<String> = (0..count).map(|_| label(rng)).collect();
                json!({"key": label(rng), "operator": operator, "values": values})
            })
            .collect();
        s.insert("matchExpressions".into(), json!(expressions));
    }
    Value::Object(s)
}

/// A spec near what people write: both window forms, durations, selectors.
fn spec(rng: &mut Rng) -> Value {
    // Half of the specs hold together (durations that fit each other, a selector), so that the
    // decision itself is reached; the rest mix anything.
    let sensible = rng.chance(50);
    let mut s = serde_json::Map::new();
    for field in ["clusterSelector", "machineSelector"] {
        if rng.chance(60) {
            s.insert(field.into(), selector(rng));
        }
    }
    if sensible && !s.contains_key("clusterSelector") {
        s.insert("clusterSelector".into(), json!({}));
    }
    s.insert(
        "policy".into(),
        json!(match rng.below(50) {
            0 if !sensible => "scheduled",
            _ => rng.pick(&["Automatic", "Scheduled", "Scheduled", "Disabled"]),
        }),
    );
    for field in ["ttl", "renewBefore", "failSafeMargin", "spread"] {
        let value = match (sensible, field) {
            (true, "ttl") => rng.pick(&["1y", "90d", "6mo", "8760h"]),
            (true, "renewBefore") => rng.pick(&["30d", "2w", "24h", "1s"]),
            (true, "failSafeMargin") => rng.pick(&["0", "24h", "48h", "1y"]),
            (true, _) => rng.pick(&["0", "15m", "1h", "7d"]),
            (false, field) => duration(rng, matches!(field, "failSafeMargin" | "spread")),
        };
        if rng.chance(70) {
            s.insert(field.into(), json!(value));
        }
    }
    if rng.chance(20) {
        if sensible {
            s.remove("renewBefore");
        }
        s.insert(
            "renewBeforePercentage".into(),
            json!(match sensible {
                true => rng.pick(&[1, 33, 50, 99]),
                false => rng.pick(&[-1, 0, 1, 33, 99, 100, i64::from(i32::MAX), i64::MAX]),
            }),
        );
    }
    let count = match sensible {
        true => rng.pick(&[1, 1, 2, 3]),
        false => rng.pick(&[0, 1, 1, 1, 2, 2, 3, 5, 8, 32, 33]),
    };
    let windows: Vec<Value> = (0..count).map(|_| window(rng)).collect();
    s.insert("windows".into(), Value::Array(windows));
    Value::Object(s)
}

pub fn generate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    match rng.below(20) {
        0..=5 => {
            let seed = rng.pick_ref(corpus).clone();
            mutate::json_bytes(rng, &seed, WORDS, corpus)
        }
        6..=16 => serde_json::to_vec(&spec(rng)).unwrap_or_default(),
        17 | 18 => {
            let seed = serde_json::to_vec(&spec(rng)).unwrap_or_default();
            mutate::json_bytes(rng, &seed, WORDS, corpus)
        }
        _ => mutate::deep_text(rng),
    }
}

pub fn check(input: &[u8]) -> &'static str {
    let Ok(spec) = serde_json::from_slice::<CertificateRenewalPolicySpec>(input) else {
        return "not a spec";
    };
    let mut rng = Rng::new(hash(input));
    // Each window alone, as the decision's checks and the policy status see it.
    let mut valid = Vec::new();
    for (index, w) in spec.windows.iter().enumerate() {
        match w.validate(index) {
            Ok(v) => valid.push(v),
            Err(errors) => errors.iter().for_each(|e| {
                let _ = e.to_string();
            }),
        }
    }
    for v in &valid {
        let t = instant(&mut rng);
        let contains = v.contains(t);
        let occurrence = v.occurrence_containing(t);
        assert_eq!(
            contains,
            occurrence.is_some(),
            "contains and occurrence_containing disagree at {t}"
        );
        if let Some(next) = v.next_start_after(t) {
            assert!(next > t, "the next start {next} is not after {t}");
        }
    }
    let t = instant(&mut rng);
    let _ = window::first_containing(&valid, t);
    let _ = window::opened_first(&valid, t).map(|o| o.opening().to_string());
    let _ = window::next_start_after(&valid, t).map(|s| s.to_string());

    match validate(&spec) {
        Ok(policy) => {
            let _ = policy.selector.to_string();
            let labels: BTreeMap<String, String> =
                BTreeMap::from([("env".into(), "prod".into()), ("tier".into(), "a".into())]);
            let _ = policy.selector.matches(Some(&labels), &labels);
            let _ = policy
                .upcoming_starts(instant(&mut rng), 3)
                .iter()
                .map(ToString::to_string)
                .count();
            for _ in 0..2 {
                let expiry = rng.chance(90).then(|| instant(&mut rng));
                let failures = Failures {
                    count: rng
                        .chance(30)
                        .then(|| rng.pick(&[0, 1, 5, 62, 63, 64, i64::MAX, -1, i64::MIN])),
                    last_failure: rng.chance(30).then(|| instant(&mut rng)),
                };
                let settings = Settings {
                    strict: rng.chance(20),
                    ..Settings::default()
                };
                let input = policy
                    .input(expiry, failures, settings)
                    .with_lifetime_start(rng.chance(30).then(|| instant(&mut rng)))
                    .with_stagger_key(
                        rng.chance(70)
                            .then_some("6f1b1c1e-8a1d-4c44-9b8e-1f2e3d4c5b6a"),
                    );
                let now = match rng.chance(50) {
                    true => instant(&mut rng),
                    false => Timestamp::from_second(1_780_000_000).unwrap_or(Timestamp::UNIX_EPOCH),
                };
                let decision = decide(&input, now);
                let _ = decision.to_string();
                let _ = decision.is_warning();
                let _ = requeue_at(&decision);
            }
            match valid.is_empty() {
                true => "valid, no windows",
                false => "valid, windows",
            }
        }
        Err(invalid) => {
            let _ = invalid.to_string();
            match valid.is_empty() {
                true => "invalid",
                false => "invalid, some windows valid",
            }
        }
    }
}
