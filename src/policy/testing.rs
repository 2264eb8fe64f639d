//! Test helpers shared by the policy tests: fixed instants, window builders, proptest
//! strategies.

use jiff::Timestamp;
use proptest::prelude::*;

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
