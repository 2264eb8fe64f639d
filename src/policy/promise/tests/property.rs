//! No admitted policy misses its promise: random policies (either mode, windows of both forms in
//! zones with daylight saving, durations around the windows' spacing) are decided as admission
//! decides them until 1000 are admitted (from a fixed seed), and each admitted one runs 100
//! lifetimes of its certificates as the Machine controller runs them: 100,000 cases.
//!
//! A case is one lifetime: certificates issued by the renewal that ended the last lifetime (the
//! chain of a Machine under the policy, so that due times fall where renewals put them), or now
//! and then at a random instant of the next two years with a new Machine (its place in the
//! spread) and strictness; every attempt fails, each recorded a random time after its start, up
//! to [`ATTEMPT_LENGTH`]; and a random failure sequence (at most two failures in a row) says
//! which attempt succeeds and issues the next certificates (attempts are the same up to it
//! whatever comes after). Then, for every lifetime:
//! - at least three attempts start before the fail-safe point, so the one that succeeds does
//!   and no certificate expires;
//! - the third starts before the expiry alert fires (ttl over 14d).

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

use super::*;
use crate::policy::testing::ZONES;
use crate::policy::window::{DayOfWeek, WallTime, Window};

const DAYS: [DayOfWeek; 7] = [
    DayOfWeek::Monday,
    DayOfWeek::Tuesday,
    DayOfWeek::Wednesday,
    DayOfWeek::Thursday,
    DayOfWeek::Friday,
    DayOfWeek::Saturday,
    DayOfWeek::Sunday,
];

/// Admitted policies per run and lifetimes per policy: 100,000 cases.
const POLICIES: u32 = 1000;
const LIFETIMES: usize = 100;

/// Certificates are issued within two years of it (and due from it on).
const FROM: &str = "2026-11-25T12:00:00Z";

/// The spec fields a random policy is built from.
#[derive(Debug, Clone)]
struct Spec {
    automatic: bool,
    ttl: &'static str,
    renew_before: RenewBeforeField,
    margin: &'static str,
    spread: &'static str,
    windows: Vec<Window>,
}

#[derive(Debug, Clone)]
enum RenewBeforeField {
    Duration(&'static str),
    Percentage(i32),
}

impl Spec {
    /// `None` when the spec is not valid (a renewBefore not shorter than the ttl).
    fn policy(&self) -> Option<ValidPolicy> {
        let mut spec = json!({
            "machineSelector": {},
            "policy": if self.automatic { "Automatic" } else { "Scheduled" },
            "ttl": self.ttl,
            "failSafeMargin": self.margin,
            "spread": self.spread,
            "windows": self.windows,
        });
        match self.renew_before {
            RenewBeforeField::Duration(duration) => spec["renewBefore"] = json!(duration),
            RenewBeforeField::Percentage(percent) => spec["renewBeforePercentage"] = json!(percent),
        }
        let spec: CertificateRenewalPolicySpec = serde_json::from_value(spec).ok()?;
        validate(&spec).ok()
    }
}

/// Windows as people write them, spaced from minutes to weeks apart: daily windows of a few
/// minutes to almost a day on some days, and schedules every hour, every few hours, every day,
/// on weekdays or one day, once a month or on leap days, in zones with daylight saving.
fn window() -> impl Strategy<Value = Window> {
    let zone =
        prop::sample::select(ZONES).prop_map(|zone| (zone != "UTC").then(|| zone.to_owned()));
    let length = prop::sample::select(&[10, 30, 60, 120, 240, 480, 720, 1380][..]);
    let daily = (
        prop::sample::subsequence(DAYS.to_vec(), 1..=7),
        0u16..1440,
        length,
        zone.clone(),
    )
        .prop_map(|(days, start, minutes, zone)| {
            let wall = |m: u16| WallTime::new((m / 60) as u8, (m % 60) as u8).unwrap();
            let end = (start + minutes) % 1440;
            let end = if end == 0 {
                WallTime::END_OF_DAY
            } else {
                wall(end)
            };
            Window::daily(days, wall(start), end, zone)
        });
    let schedule = prop::sample::select(
        &[
            "0 * * * *",
            "30 */6 * * *",
            "0 2 * * *",
            "15 22 * * 1-5",
            "0 3 * * 6",
            "0 0 * * 0",
            "0 4 1 * *",
            "0 0 29 2 *",
        ][..],
    );
    let duration = prop::sample::select(&["5m", "20m", "1h", "2h", "4h", "6h", "1d"][..]);
    let cron = (schedule, duration, zone).prop_map(|(schedule, duration, zone)| {
        Window::scheduled(schedule, duration.parse().unwrap(), zone)
    });
    prop_oneof![3 => daily, 2 => cron]
}

fn spec() -> impl Strategy<Value = Spec> {
    let ttl = prop::sample::select(&["1d", "3d", "1w", "2w", "15d", "30d", "90d", "1y", "10y"][..]);
    let renew_before = prop_oneof![
        4 => prop::sample::select(
            &["2h", "6h", "1d", "2d", "3d", "5d", "8d", "15d", "16d", "20d", "22d", "30d", "45d", "5y", "9y"][..]
        )
        .prop_map(RenewBeforeField::Duration),
        1 => (5i32..=60).prop_map(RenewBeforeField::Percentage),
    ];
    (
        prop::bool::weighted(0.15),
        ttl,
        renew_before,
        prop::sample::select(&["0", "1h", "1d", "2d"][..]),
        prop::sample::select(&["0", "15m", "2h", "1d"][..]),
        prop::collection::vec(window(), 1..=2),
    )
        .prop_map(
            |(automatic, ttl, renew_before, margin, spread, windows)| Spec {
                automatic,
                ttl,
                renew_before,
                margin,
                spread,
                windows,
            },
        )
}

/// One lifetime: whether the chain starts again (then when the certificates are issued, the
/// Machine, strictness), and each attempt's outcome and length.
#[derive(Debug, Clone)]
struct Lifetime {
    restart: Option<(i64, u32, bool)>,
    /// `true`: the attempt succeeds. At most two failures in a row.
    outcomes: [bool; PROMISED_ATTEMPTS],
    /// Seconds, each at most `ATTEMPT_LENGTH`.
    lengths: [i64; PROMISED_ATTEMPTS],
}

fn lifetime() -> impl Strategy<Value = Lifetime> {
    let two_years: i64 = 2 * 365 * 86_400;
    let length = 0..=ATTEMPT_LENGTH.as_secs();
    let restart = prop::option::weighted(0.1, (0..two_years, any::<u32>(), any::<bool>()));
    (
        restart,
        any::<[bool; PROMISED_ATTEMPTS]>(),
        [length.clone(), length.clone(), length],
    )
        .prop_map(|(restart, mut outcomes, lengths)| {
            outcomes[2] = outcomes[2] || !(outcomes[0] || outcomes[1]);
            Lifetime {
                restart,
                outcomes,
                lengths,
            }
        })
}

/// A Machine's certificates, as its status records them.
#[derive(Debug, Clone, Copy)]
struct Certificates {
    /// The start of the refresh that issued them (`lifetime_start`).
    issued: Timestamp,
    expiry: Timestamp,
}

/// A bound on the deferrals before an attempt.
const STEPS: usize = 64;

/// The first three attempts on `certificates` of the Machine `uid`, all failing, as the
/// controller steps them: the start and end of each.
fn attempts(
    policy: &ValidPolicy,
    certificates: Certificates,
    (uid, strict): (u32, bool),
    lengths: [i64; PROMISED_ATTEMPTS],
) -> Result<Vec<(Timestamp, Timestamp)>, String> {
    let settings = Settings {
        strict,
        backoff: Backoff::default(),
    };
    let mut input = policy
        .input(Some(certificates.expiry), Failures::default(), settings)
        .with_lifetime_start(Some(certificates.issued))
        .with_stagger_key(Some(&format!("machine-{uid}")));
    let mut now = certificates.issued;
    let mut made = Vec::new();
    for _ in 0..STEPS {
        match decide(&input, now) {
            Decision::RenewNow(_) => {
                let end = now + SignedDuration::from_secs(lengths[made.len()]);
                made.push((now, end));
                if made.len() == PROMISED_ATTEMPTS {
                    return Ok(made);
                }
                input.failures = Failures {
                    count: Some(made.len() as i64),
                    last_failure: Some(end),
                };
                now = end;
            }
            Decision::Defer(deferral)
                if deferral.until > now && deferral.until != Timestamp::MAX =>
            {
                now = deferral.until;
            }
            other => return Err(format!("stuck at {now}: {other:?}, after {made:?}")),
        }
    }
    Err(format!("no 3rd attempt after {STEPS} deferrals: {made:?}"))
}

/// Runs the lifetimes of one Machine's chain under `policy`, checking the promise for each.
fn keeps(policy: &ValidPolicy, lifetimes: &[Lifetime]) -> Result<(), String> {
    let ttl = policy.ttl.as_duration();
    let margin = policy.fail_safe_margin.as_duration();
    let (mut certificates, mut machine) = (None, (0, false));
    for (index, lifetime) in lifetimes.iter().enumerate() {
        let current = match (lifetime.restart, certificates) {
            (None, Some(certificates)) => certificates,
            (restart, _) => {
                let (offset, uid, strict) = restart.unwrap_or((0, 0, false));
                machine = (uid, strict);
                let issued = utc(FROM) + SignedDuration::from_secs(offset);
                Certificates {
                    issued,
                    expiry: issued + ttl,
                }
            }
        };
        let context = || format!("lifetime {index} of {current:?}, Machine {machine:?}");
        let made = attempts(policy, current, machine, lifetime.lengths)
            .map_err(|why| format!("{why}\n{}", context()))?;
        let fail_safe = current.expiry - margin;
        let (third, _) = made[PROMISED_ATTEMPTS - 1];
        if third >= fail_safe {
            return Err(format!(
                "the 3rd attempt at {third}, after the fail-safe point {fail_safe}: {made:?}\n{}",
                context()
            ));
        }
        let alert = current.expiry - EXPIRING_SOON;
        if ttl > EXPIRING_SOON && third > alert {
            return Err(format!(
                "the 3rd attempt at {third}, after the alert fires at {alert}\n{}",
                context()
            ));
        }
        // The attempt that succeeds issues the next certificates: the node signs during the
        // refresh, so they run from its end, and count from its start (`lifetime_start`).
        let succeeds = lifetime.outcomes.iter().position(|&ok| ok).unwrap_or(2);
        let (start, end) = made[succeeds];
        certificates = Some(Certificates {
            issued: start,
            expiry: end + ttl,
        });
    }
    Ok(())
}

#[test]
fn no_admitted_policy_misses_its_promise() {
    let mut runner = TestRunner::deterministic();
    let (specs, lifetimes) = (spec(), prop::collection::vec(lifetime(), LIFETIMES));
    let (mut admitted, mut refused, mut unproven, mut cases) = (0, 0, 0, 0);
    let started = std::time::Instant::now();
    while admitted < POLICIES {
        let spec = specs.new_tree(&mut runner).unwrap().current();
        let Some(policy) = spec.policy() else {
            continue;
        };
        match admission(&policy, Backoff::default(), utc(FROM)) {
            Ok(Promise::Kept(_)) => admitted += 1,
            Ok(Promise::Unproven(_)) => {
                unproven += 1;
                continue;
            }
            Ok(Promise::Nothing) => continue,
            Err(_) => {
                refused += 1;
                continue;
            }
        }
        let lifetimes = lifetimes.new_tree(&mut runner).unwrap().current();
        if let Err(why) = keeps(&policy, &lifetimes) {
            panic!("{why}\npolicy: {spec:#?}");
        }
        cases += lifetimes.len();
    }
    println!(
        "{cases} lifetimes of {admitted} admitted policies ({refused} refused, {unproven} unproven) in {:?}",
        started.elapsed()
    );
    assert!(cases >= 100_000);
    // Refusals too: the policies come close to the bounds.
    assert!(refused >= POLICIES / 4, "{refused}");
}
