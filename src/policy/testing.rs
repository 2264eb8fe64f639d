//! Test helpers shared by the policy tests: fixed instants, window builders, proptest
//! strategies.

use jiff::Timestamp;
use proptest::prelude::*;

use super::duration::PolicyDuration;
use super::window::{DayOfWeek, WallTime, Window};

/// An RFC 3339 instant, such as `2026-11-24T02:00:00Z`.
pub fn utc(text: &str) -> Timestamp {
    text.parse().unwrap()
}

/// A `daysOfWeek`/`start`/`end` window as the CRD would hold it.
pub fn window(days: &[DayOfWeek], start: &str, end: &str, zone: Option<&str>) -> Window {
    Window::daily(
        days.to_vec(),
        start.parse().unwrap(),
        end.parse().unwrap(),
        zone.map(str::to_owned),
    )
}

/// A `schedule`/`duration` window as the CRD would hold it.
pub fn cron_window(schedule: &str, duration: &str, zone: Option<&str>) -> Window {
    Window::scheduled(schedule, duration.parse().unwrap(), zone.map(str::to_owned))
}

/// Zones with the awkward cases: DST gaps and folds, half-hour and 45-minute offsets and
/// shifts, transitions at midnight (Santiago, Havana), a skipped day (Apia, 2011).
pub const ZONES: &[&str] = &[
    "UTC",
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "Asia/Kathmandu",
    "Pacific/Chatham",
    "America/Santiago",
    "America/Havana",
    "Pacific/Apia",
    "America/St_Johns",
];

/// Any valid window: any days, any start and end minute (different), a zone from [`ZONES`].
pub fn arbitrary_window() -> impl Strategy<Value = Window> {
    use DayOfWeek::*;
    let days = proptest::sample::subsequence(
        vec![
            Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday,
        ],
        0..=7,
    );
    let minute = |range: std::ops::RangeInclusive<u16>| {
        range.prop_map(|m| WallTime::new((m / 60) as u8, (m % 60) as u8).unwrap())
    };
    (
        days,
        minute(0..=1439),
        minute(1..=1440),
        proptest::sample::select(ZONES),
    )
        .prop_filter("start != end", |(_, start, end, _)| start != end)
        .prop_map(|(days, start, end, zone)| {
            Window::daily(days, start, end, (zone != "UTC").then(|| zone.to_owned()))
        })
}

/// Instants from 2000 to 2037, where every zone in [`ZONES`] has whole-minute offsets.
pub fn arbitrary_instant() -> impl Strategy<Value = Timestamp> {
    (946_684_800i64..2_114_380_800).prop_map(|s| Timestamp::from_second(s).unwrap())
}

/// A schedule window: hourly, every quarter of an hour or at one time a day, on weekdays, one
/// day or every day, open from 1 minute to 26 hours (so occurrences may overlap), in a zone from
/// [`ZONES`].
pub fn arbitrary_cron_window() -> impl Strategy<Value = Window> {
    let minute = prop_oneof![
        Just("*/15".to_owned()),
        Just("0".to_owned()),
        (0u8..60).prop_map(|m| m.to_string()),
    ];
    let hour = prop_oneof![
        Just("*".to_owned()),
        Just("1-3".to_owned()),
        (0u8..24).prop_map(|h| h.to_string()),
    ];
    let day = proptest::sample::select(&["*", "1-5", "6"][..]);
    (
        minute,
        hour,
        day,
        1i64..=26 * 60,
        proptest::sample::select(ZONES),
    )
        .prop_map(|(minute, hour, day, minutes, zone)| {
            Window::scheduled(
                format!("{minute} {hour} * * {day}"),
                PolicyDuration::from_seconds(minutes * 60).unwrap(),
                (zone != "UTC").then(|| zone.to_owned()),
            )
        })
}

/// A window of either form.
pub fn arbitrary_any_window() -> impl Strategy<Value = Window> {
    prop_oneof![arbitrary_window(), arbitrary_cron_window()]
}
