//! Schedule windows (`ck8s_certs::policy::cron`): `CronWindow::parse` (the standard-cron filter,
//! croner's parser, the does-it-ever-fire search), then the questions the decision asks of a
//! parsed schedule, in several zones and at instants from the start to the end of the calendar.

use std::sync::LazyLock;

use ck8s_certs::policy::cron::CronWindow;
use ck8s_certs::policy::{CronProblem, PolicyDuration};
use jiff::Timestamp;
use jiff::tz::{TimeZone, TimeZoneDatabase};

use super::harness::{Rng, hash};
use super::mutate;

pub const WORDS: &[&str] = &[
    "*",
    "*/15",
    "0",
    "22",
    "1-5",
    "MON-FRI",
    "JAN",
    "dec",
    "sun",
    "SAT",
    "7",
    "L",
    "W",
    "#",
    "?",
    "+",
    "5L",
    "15W",
    "1#3",
    "@daily",
    "@hourly",
    "@weekly",
    "@monthly",
    "@yearly",
    "@annually",
    "@reboot",
    "@every",
    "0 22 * * 1-5",
    "0 0 31 2 *",
    "0 0 29 2 1",
];

/// The durations a window may stay open (the field is a `PolicyDuration`).
const DURATIONS: &[&str] = &[
    "1s", "1m", "5m", "15m", "1h", "3h30m", "4h", "23h59m", "24h", "25h", "7d", "30d", "1y",
    "10000y",
];

/// Zones with daylight saving in both hemispheres, odd offsets, a skipped day (Pacific/Apia,
/// 2011-12-30) and UTC.
const ZONES: &[&str] = &[
    "UTC",
    "Europe/London",
    "America/New_York",
    "Australia/Lord_Howe",
    "Pacific/Apia",
    "Asia/Kathmandu",
    "America/Santiago",
    "Antarctica/Troll",
    "Africa/Casablanca",
];

pub static TIME_ZONES: LazyLock<Vec<TimeZone>> = LazyLock::new(|| {
    ZONES
        .iter()
        .map(|name| match TimeZoneDatabase::bundled().get(name) {
            Ok(zone) => zone,
            Err(err) => panic!("{name}: {err}"),
        })
        .collect()
});

/// An instant: near today mostly, on daylight-saving changes, or at the ends of the calendar.
pub fn instant(rng: &mut Rng) -> Timestamp {
    let second = match rng.below(8) {
        0 => Timestamp::MIN.as_second(),
        1 => Timestamp::MAX.as_second(),
        2 => rng.between(Timestamp::MIN.as_second(), Timestamp::MAX.as_second()),
        // Year 1 and year 5000: the ends of croner's calendar.
        3 => rng.between(-62_135_596_800 - 86_400, -62_135_596_800 + 86_400 * 400),
        4 => rng.between(95_617_584_000 - 86_400 * 400, 95_617_584_000 + 86_400),
        // Around the 2026 changes in Europe and the US, to the minute.
        5 => {
            rng.pick(&[1_774_746_000, 1_792_890_000, 1_773_036_000, 1_793_595_600])
                + rng.between(-7_200, 7_200)
        }
        _ => rng.between(1_700_000_000, 1_900_000_000),
    };
    let nanos = match rng.chance(20) {
        true => rng.between(0, 999_999_999) as i32,
        false => 0,
    };
    Timestamp::new(second, nanos).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn field(rng: &mut Rng, index: usize) -> String {
    let (low, high): (i64, i64) = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)][index % 5];
    let value = |rng: &mut Rng| match rng.below(30) {
        0 => rng
            .pick(&["60", "24", "32", "13", "8", "-1", "99999999999999999999"])
            .to_string(),
        1 if index == 3 => rng.pick(&["JAN", "feb", "Dec", "JANUARY"]).to_string(),
        1 if index == 4 => rng
            .pick(&["MON", "sun", "Sat", "FRI", "MONDAY"])
            .to_string(),
        _ => rng.between(low, high).to_string(),
    };
    // Mostly standard and in range, so that most schedules get past the parser.
    let atom = |rng: &mut Rng| match rng.below(30) {
        0..=9 => "*".to_owned(),
        10..=12 => format!(
            "*/{}",
            rng.pick(&["0", "1", "2", "7", "15", "59", "60", "1000"])
        ),
        13..=15 => format!("{}-{}", value(rng), value(rng)),
        16 | 17 => format!("{}-{}/{}", value(rng), value(rng), rng.between(0, 70)),
        18 => rng
            .pick(&["L", "W", "5L", "15W", "1#3", "?", "+1", "L-3", "LW"])
            .to_string(),
        _ => value(rng),
    };
    let mut text = atom(rng);
    for _ in 0..rng.below(3) * usize::from(rng.chance(30)) {
        text.push(',');
        text.push_str(&atom(rng));
    }
    text
}

pub fn generate_text(rng: &mut Rng) -> String {
    if rng.chance(10) {
        let nickname = rng.pick(&[
            "@yearly",
            "@annually",
            "@monthly",
            "@weekly",
            "@daily",
            "@hourly",
            "@DAILY",
            "@reboot",
            "@every 5m",
            "@midnight",
            "@",
        ]);
        return nickname.to_string();
    }
    let fields = match rng.chance(90) {
        true => 5,
        false => rng.pick(&[4, 6, 7, 0, 1]),
    };
    let separator = rng.pick(&[" ", " ", " ", "  ", "\t", " \u{a0}"]);
    (0..fields)
        .map(|i| field(rng, i))
        .collect::<Vec<_>>()
        .join(separator)
}

pub fn generate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut input = match rng.chance(40) {
        true => rng.pick_ref(corpus).clone(),
        false => generate_text(rng).into_bytes(),
    };
    if rng.chance(25) {
        mutate::bytes(rng, &mut input, WORDS, corpus);
    }
    input
}

/// Parses with a duration and asks the parsed window about a few instants in a few zones (all
/// chosen from the input's hash).
pub fn check(input: &[u8]) -> &'static str {
    let schedule = String::from_utf8_lossy(input);
    let h = hash(input);
    let mut rng = Rng::new(h);
    let duration: PolicyDuration = match rng.pick(DURATIONS).parse() {
        Ok(duration) => duration,
        Err(err) => panic!("a harness duration does not parse: {err}"),
    };
    match CronWindow::parse(&schedule, duration) {
        Ok(window) => {
            for _ in 0..2 {
                let zone = rng.pick_ref(&TIME_ZONES);
                let t = instant(&mut rng);
                let contains = window.contains(zone, t);
                let earliest = window.earliest_containing(zone, t);
                assert_eq!(
                    contains,
                    earliest.is_some(),
                    "contains and earliest_containing disagree at {t} in {zone:?}"
                );
                if let Some(next) = window.next_start_after(zone, t) {
                    assert!(next > t, "the next start {next} is not after {t}");
                }
            }
            "parsed"
        }
        Err(problem) => {
            let _ = problem.to_string();
            match problem {
                CronProblem::Syntax { .. } => "syntax",
                CronProblem::NotStandard { .. } => "not standard",
                CronProblem::NeverFires { .. } => "never fires",
            }
        }
    }
}
