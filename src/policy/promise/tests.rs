use ck8s_certs_api::renewal_policy::CertificateRenewalPolicySpec;
use serde_json::{Value, json};

use super::*;
use crate::policy::spec::validate;
use crate::policy::testing::utc;

mod property;
mod shipped;

/// A Wednesday, when no zone of the table changes its offset.
const NOW: &str = "2026-11-25T12:00:00Z";

/// A policy selecting every Machine, with `fields` on top.
fn policy(fields: Value) -> ValidPolicy {
    let mut spec = json!({ "machineSelector": {} });
    for (key, value) in fields.as_object().cloned().unwrap_or_default() {
        spec[key] = value;
    }
    let spec: CertificateRenewalPolicySpec = serde_json::from_value(spec).unwrap();
    validate(&spec).unwrap()
}

fn checked_at(fields: Value, now: &str) -> Result<Promise, Broken> {
    check(&policy(fields), Backoff::default(), utc(now))
}

/// What a row expects: admitted (with a part of the `PromiseKept` message), or refused (with a
/// part of the refusal).
#[derive(Debug)]
enum Expect {
    Kept(&'static str),
    Nothing,
    Unproven(&'static str),
    Refused(&'static str),
}

/// The table: each row a policy (fields over `machineSelector: {}`), the instant it is checked
/// at, and what is expected.
fn rows() -> Vec<(&'static str, Value, &'static str, Expect)> {
    use Expect::*;
    let leap_day = json!([{ "schedule": "0 0 29 2 *", "duration": "1d" }]);
    let sunday_night = |zone: Option<&str>| json!([{ "daysOfWeek": ["Sunday"], "start": "01:00", "end": "02:00", "timezone": zone }]);
    let weeknights =
        json!([{ "schedule": "0 22 * * 1-5", "duration": "4h", "timezone": "Europe/Berlin" }]);
    vec![
        (
            "Automatic with the defaults: three attempts within hours of due",
            json!({ "policy": "Automatic" }),
            NOW,
            Kept(
                "the 3rd 5h14m59s after due, 4w18h45m1s before it, and 2w1d18h45m1s before the CK8sCertsNodeCertificatesExpiringSoon alert (2w before expiry)",
            ),
        ),
        (
            "Automatic with canaries: the others' first attempt may wait maxWait",
            json!({ "policy": "Automatic", "canary": { "clusterSelector": {}, "maxWait": "1d" } }),
            NOW,
            Kept("the 3rd 1d5h after due, 3w6d19h before it"),
        ),
        (
            "Automatic, the canaries waited for past the alert",
            json!({ "policy": "Automatic", "canary": { "clusterSelector": {}, "maxWait": "20d" } }),
            NOW,
            Refused(
                "with renewBefore 1mo (the default) it starts 1w2d19h before expiry (2w6d5h after due, counting canary.maxWait 2w6d waited for the canaries first); a renewBefore of at least 1mo5d",
            ),
        ),
        (
            "Disabled promises nothing",
            json!({ "policy": "Disabled", "renewBefore": "1h" }),
            NOW,
            Nothing,
        ),
        (
            "Automatic, renewBefore barely over the margin",
            json!({ "policy": "Automatic", "ttl": "1d", "renewBefore": "2h", "failSafeMargin": "1h" }),
            NOW,
            Refused(
                "renewBefore 2h leaves 1 attempt before the fail-safe point (expiry − 1h) in the worst case: the 3rd would start 5h14m59s after due; a renewBefore of at least 7h would leave 3",
            ),
        ),
        (
            "Automatic, renewBefore shorter than the margin",
            json!({ "policy": "Automatic", "renewBefore": "12h" }),
            NOW,
            Refused(
                "renewBefore 12h leaves 0 attempts before the fail-safe point (expiry − 1d) in the worst case: the 3rd would start 5h14m59s after due; a renewBefore of at least 2w1d would leave 3",
            ),
        ),
        (
            "Automatic, due after the alert fires",
            json!({ "policy": "Automatic", "ttl": "90d", "renewBefore": "7d" }),
            NOW,
            Refused(
                "the CK8sCertsNodeCertificatesExpiringSoon alert fires 2w before expiry, before the 3rd attempt in the worst case: with renewBefore 1w it starts 6d18h45m1s before expiry (5h14m59s after due); a renewBefore of at least 2w1d would start it before the alert (certificates whose ttl is at most 2w are exempt",
            ),
        ),
        (
            "Automatic, a ttl the alert covers whole",
            json!({ "policy": "Automatic", "ttl": "10d", "renewBefore": "5d" }),
            NOW,
            Kept(
                "the CK8sCertsNodeCertificatesExpiringSoon alert is not checked: with a ttl of 1w3d (at most 2w) it fires for these certificates throughout their lifetime",
            ),
        ),
        (
            "renewBeforePercentage, suggested as a percentage",
            json!({ "policy": "Automatic", "ttl": "1d", "renewBeforePercentage": 10, "failSafeMargin": "1h" }),
            NOW,
            Refused(
                "renewBeforePercentage 10 (2h24m of the ttl) leaves 1 attempt before the fail-safe point (expiry − 1h) in the worst case: the 3rd would start 5h14m59s after due; a renewBeforePercentage of at least 27 would leave 3",
            ),
        ),
        (
            "Scheduled nightly, by the bound alone",
            json!({ "policy": "Scheduled", "windows": [{ "start": "02:00", "end": "04:00" }] }),
            NOW,
            Kept("the 3rd at most 2d23h45m after due"),
        ),
        (
            "One hour on Sundays, two days to renew",
            json!({ "policy": "Scheduled", "renewBefore": "2d", "windows": [{ "daysOfWeek": ["Sunday"], "start": "02:00", "end": "03:00" }] }),
            NOW,
            Refused(
                "renewBefore 2d leaves 0 attempts before the fail-safe point (expiry − 1d) in the worst case: the 3rd would start 2w6d23h14m59s after due, such as when due at 2026-11-29T03:00:00Z; a renewBefore of at least 1mo5d would leave 3",
            ),
        ),
        (
            "Saturday mornings: two attempts fit in one window, the third waits a week",
            json!({ "policy": "Scheduled", "renewBefore": "10d", "windows": [{ "daysOfWeek": ["Saturday"], "start": "00:00", "end": "04:00" }] }),
            NOW,
            Refused(
                "renewBefore 1w3d leaves 2 attempts before the fail-safe point (expiry − 1d) in the worst case: the 3rd would start 1w6d20h14m59s after due, such as when due at 2026-11-28T04:00:00Z; a renewBefore of at least 4w would leave 3",
            ),
        ),
        (
            "Ten minutes a day, two days to renew",
            json!({ "policy": "Scheduled", "renewBefore": "2d", "windows": [{ "start": "03:00", "end": "03:10" }] }),
            NOW,
            Refused(
                "renewBefore 2d leaves 1 attempt before the fail-safe point (expiry − 1d) in the worst case: the 3rd would start 2d23h59m59s after due, such as when due at 2026-11-26T03:10:00Z",
            ),
        ),
        (
            "A weekly window and a ttl of five days",
            json!({ "policy": "Scheduled", "ttl": "5d", "renewBefore": "4d", "windows": [{ "daysOfWeek": ["Monday"], "start": "00:00", "end": "06:00" }] }),
            NOW,
            Refused(
                "the windows stay closed for 6d18h from 2026-11-30T06:00:00Z to 2026-12-07T00:00:00Z, at least the certificates' lifetime (ttl 5d): certificates issued at 2026-11-30T06:00:00Z would expire before a window opens; open the windows more often, or give a ttl longer than 6d18h",
            ),
        ),
        (
            "Leap days under a ttl of a year: closed for a lifetime from most instants",
            json!({ "policy": "Scheduled", "windows": leap_day }),
            NOW,
            Refused(
                "the windows stay closed for 1y3mo5d12h from 2026-11-25T12:00:00Z to 2028-02-29T00:00:00Z, at least the certificates' lifetime (ttl 1y)",
            ),
        ),
        (
            "Leap days under a ttl of 8y: 2100 is no leap year",
            json!({ "policy": "Scheduled", "ttl": "8y", "renewBefore": "7y", "windows": leap_day }),
            NOW,
            Refused(
                "the windows stay closed for 8y from 2096-03-01T00:00:00Z to 2104-02-29T00:00:00Z",
            ),
        ),
        (
            "Leap days from 2096-03-01: the next is 2104-02-29",
            json!({ "policy": "Scheduled", "ttl": "10y", "renewBefore": "5y", "windows": leap_day }),
            "2096-03-01T00:00:00Z",
            Refused(
                "renewBefore 5y leaves 0 attempts before the fail-safe point (expiry − 1d) in the worst case: the 3rd would start 8y5h",
            ),
        ),
        (
            "Leap days from 2096-03-01, with room for the eight years",
            json!({ "policy": "Scheduled", "ttl": "10y", "renewBefore": "9y", "windows": leap_day }),
            "2096-03-01T00:00:00Z",
            Kept(
                "At least 3 attempts start before the fail-safe point (expiry − 1d) in the worst case: the 3rd 8y5h29m58s after due, 12mo3d18h30m2s before it",
            ),
        ),
        (
            "Weeknights in Berlin, due ten days before expiry",
            json!({ "policy": "Scheduled", "ttl": "30d", "renewBefore": "10d", "windows": weeknights }),
            NOW,
            Refused(
                "the CK8sCertsNodeCertificatesExpiringSoon alert fires 2w before expiry, before the 3rd attempt in the worst case: with renewBefore 1w3d it starts 6d2h45m1s before expiry (3d21h14m59s after due, such as when due at",
            ),
        ),
        (
            "Weeknights in Berlin, due twenty days before expiry",
            json!({ "policy": "Scheduled", "ttl": "90d", "renewBefore": "20d", "windows": weeknights }),
            NOW,
            Kept("the 3rd 3d21h14m59s after due"),
        ),
        (
            "Sunday nights in London: the spring change closes one",
            json!({ "policy": "Scheduled", "ttl": "90d", "renewBefore": "36d", "windows": sunday_night(Some("Europe/London")) }),
            NOW,
            Refused(
                "with renewBefore 1mo6d it starts 1w1d1h45m1s before expiry (3w6d22h14m59s after due, such as when due at 2027-03-07T02:00:00Z)",
            ),
        ),
        (
            "Sunday nights in UTC: no change",
            json!({ "policy": "Scheduled", "ttl": "90d", "renewBefore": "36d", "windows": sunday_night(None) }),
            NOW,
            Kept("the 3rd at most 3w2h45m after due"),
        ),
        (
            "Every minute, open for a year each: too many to search",
            json!({ "policy": "Scheduled", "windows": [{ "schedule": "* * * * *", "duration": "1y" }] }),
            NOW,
            Unproven("more than 16384 of one window"),
        ),
        (
            "Two windows in two zones, three days to renew",
            json!({ "policy": "Scheduled", "renewBefore": "3d", "windows": [
                { "daysOfWeek": ["Monday", "Thursday"], "start": "22:00", "end": "02:00", "timezone": "America/New_York" },
                { "schedule": "0 12 1 * *", "duration": "2h" },
            ] }),
            NOW,
            Refused(
                "renewBefore 3d leaves 0 attempts before the fail-safe point (expiry − 1d) in the worst case",
            ),
        ),
    ]
}

#[test]
fn policies_are_admitted_or_refused_with_the_number_that_is_wrong() {
    let rows = rows();
    assert!(rows.len() >= 15);
    for (name, fields, now, expect) in rows {
        let answer = checked_at(fields, now);
        let matched = match (&expect, &answer) {
            (Expect::Kept(part), Ok(promise @ Promise::Kept(_))) => {
                promise.to_string().contains(part)
            }
            (Expect::Nothing, Ok(Promise::Nothing)) => true,
            (Expect::Unproven(part), Ok(Promise::Unproven(why))) => why.contains(part),
            (Expect::Refused(part), Err(broken)) => broken.to_string().contains(part),
            _ => false,
        };
        let shown = match &answer {
            Ok(promise) => format!("admitted: {promise}"),
            Err(broken) => format!("refused: {broken}"),
        };
        assert!(matched, "{name}: expected {expect:?}, {shown}");
    }
}

/// The constant is the shipped alert's: the two cannot drift apart.
#[test]
fn the_alert_lead_is_the_shipped_rule() {
    let rules: Value = serde_yaml::from_str(include_str!(
        "../../../config/monitoring/prometheusrule.yaml"
    ))
    .unwrap();
    let rule = rules["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_array().unwrap())
        .find(|rule| rule["alert"] == EXPIRING_SOON_ALERT)
        .unwrap();
    let expression = rule["expr"].as_str().unwrap();
    let (series, threshold) = expression.rsplit_once('<').unwrap();
    assert!(series.trim_end().ends_with("- time()"), "{expression}");
    let seconds: i64 = threshold
        .split('*')
        .map(|factor| factor.trim().parse::<i64>().unwrap())
        .product();
    assert_eq!(
        SignedDuration::from_secs(seconds),
        EXPIRING_SOON,
        "{expression}"
    );
}

/// Admission asks on every write: how long a check takes (printed, not asserted: run with
/// `--nocapture`, and in a release build for what the webhook sees).
#[test]
fn timings() {
    for (name, fields, now, _) in rows() {
        let policy = policy(fields);
        let rounds = 5;
        let started = std::time::Instant::now();
        for _ in 0..rounds {
            let _ = check(&policy, Backoff::default(), utc(now));
        }
        println!("{:>10.3?}  {name}", started.elapsed() / rounds);
    }
}
