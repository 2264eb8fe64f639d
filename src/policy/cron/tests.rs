//! Schedule-window tests: what is accepted, cron semantics pinned (day fields, Sunday as 7,
//! nicknames), occurrences across DST in New York, London and Lord Howe (a 30-minute shift),
//! agreement with the `daysOfWeek`/`start`/`end` form, exhaustively around each transition and
//! by proptest.

use super::*;
use crate::policy::testing::{ZONES, arbitrary_instant, cron_window, utc, window};
use crate::policy::window::DayOfWeek::{self, *};
use crate::policy::window::{
    ValidWindow, ValidateWindow, WallTime, Window, first_containing, next_start_after,
    upcoming_starts,
};
use proptest::prelude::*;

fn valid(schedule: &str, duration: &str, zone: Option<&str>) -> ValidWindow {
    cron_window(schedule, duration, zone)
        .validate(0)
        .unwrap_or_else(|errors| panic!("{schedule}: {errors:?}"))
}

fn daily(days: &[DayOfWeek], start: &str, end: &str, zone: Option<&str>) -> ValidWindow {
    window(days, start, end, zone).validate(0).unwrap()
}

/// (window, instant, expected contains, expected next start after the instant).
type Row<'a> = (&'a ValidWindow, &'a str, bool, Option<&'a str>);

fn check(rows: &[Row]) {
    for (i, (window, t, inside, next)) in rows.iter().enumerate() {
        let t = utc(t);
        assert_eq!(window.contains(t), *inside, "row {i}: contains({t})");
        assert_eq!(
            window.next_start_after(t),
            next.map(utc),
            "row {i}: next_start_after({t})"
        );
    }
}

/// The next `count` starts after `after`, in UTC.
fn starts(window: &ValidWindow, after: &str, count: usize) -> Vec<String> {
    upcoming_starts(std::slice::from_ref(window), utc(after), count)
        .iter()
        .map(|start| start.timestamp().to_string())
        .collect()
}

fn errors(window: &Window) -> Vec<String> {
    window
        .validate(2)
        .err()
        .unwrap_or_default()
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn standard_five_field_expressions_are_accepted() {
    for schedule in [
        "0 22 * * 1-5",
        "*/15 * * * *",
        "0 0-6/2 * * *",
        "30 1 1,15 * *",
        "0 22 * * mon-fri",
        "0 22 * * MON,WED,FRI",
        "0 3 * jan-mar,oct SUN",
        "0 0 29 2 *",
        "0 0 31 2 1",
        "0 0 * * 7",
        "  0 22 * * *  ",
        "@hourly",
        "@daily",
        "@weekly",
        "@monthly",
        "@yearly",
        "@ANNUALLY",
    ] {
        assert!(
            cron_window(schedule, "1h", None).validate(0).is_ok(),
            "{schedule}"
        );
    }
}

#[test]
fn rejected_schedules_name_the_field_and_the_accepted_forms() {
    const FORMS: &str = "expected five fields, minute hour day-of-month month day-of-week, such as \"0 22 * * 1-5\" (0-59, 0-23, 1-31, 1-12 or JAN-DEC, 0-7 or SUN-SAT; *, values, ranges a-b, steps */n, comma lists), or one of @hourly, @daily, @weekly, @monthly, @yearly";
    let never = |schedule: &str| {
        format!(
            "windows[2].schedule: {schedule:?} never fires: no date has that day of the month in that month (such as February 31st)"
        )
    };
    let not_standard = |schedule: &str, token: &str| {
        format!(
            "windows[2].schedule: {schedule:?} uses {token:?}, which standard five-field cron does not have: {FORMS}"
        )
    };
    let rows: &[(&str, String)] = &[
        ("0 0 31 2 *", never("0 0 31 2 *")),
        ("0 0 30 2 *", never("0 0 30 2 *")),
        ("0 0 31 4,6,9,11 *", never("0 0 31 4,6,9,11 *")),
        ("0 0 L * *", not_standard("0 0 L * *", "L")),
        ("0 0 15W * *", not_standard("0 0 15W * *", "15W")),
        ("0 0 * * 5#3", not_standard("0 0 * * 5#3", "5#3")),
        ("0 0 ? * *", not_standard("0 0 ? * *", "?")),
        ("0 0 * * +1", not_standard("0 0 * * +1", "+1")),
        ("0 0 * MON *", not_standard("0 0 * MON *", "MON")),
        ("0 0 * * JAN", not_standard("0 0 * * JAN", "JAN")),
        ("@reboot", not_standard("@reboot", "@reboot")),
        ("@every 1h", not_standard("@every 1h", "@every 1h")),
    ];
    for (schedule, expected) in rows {
        assert_eq!(
            errors(&cron_window(schedule, "1h", None)),
            std::slice::from_ref(expected),
            "{schedule}"
        );
    }
    for (schedule, reason) in [
        ("", "CronPattern cannot be an empty string."),
        (
            "0 22 * *",
            "Invalid pattern: Pattern must have 5 fields when seconds are disallowed.",
        ),
        (
            "0 0 22 * * *",
            "Invalid pattern: Pattern must have 5 fields when seconds are disallowed.",
        ),
        ("61 * * * *", "Component error"),
        ("0 24 * * *", "Component error"),
        ("0 0 0 * *", "Component error"),
        ("0 0 * 13 *", "Component error"),
        ("0 0 * * 8", "Component error"),
        // Matched nothing, and took ~4 s to be found never to fire (`make fuzz`).
        (", * * * *", "an empty entry in the comma list \",\""),
        ("1,,2 * * * *", "an empty entry in the comma list \"1,,2\""),
        ("0 0 * * 1,", "an empty entry in the comma list \"1,\""),
    ] {
        let errors = errors(&cron_window(schedule, "1h", None));
        assert_eq!(errors.len(), 1, "{schedule}: {errors:?}");
        let prefix = format!("windows[2].schedule: {schedule:?} is not a cron schedule (");
        assert!(errors[0].starts_with(&prefix), "{errors:?}");
        assert!(errors[0].contains(reason), "{errors:?}");
        assert!(errors[0].ends_with(&format!("): {FORMS}")), "{errors:?}");
    }
}

#[test]
fn a_window_has_exactly_one_form() {
    const FORMS: &str =
        "a window is either start and end (with optional daysOfWeek), or schedule and duration";
    let base = cron_window("0 22 * * *", "4h", None);
    let with = |change: &dyn Fn(&mut Window)| {
        let mut window = base.clone();
        change(&mut window);
        errors(&window)
    };
    assert_eq!(
        with(&|w: &mut Window| w.start = Some("22:00".parse().unwrap())),
        [format!(
            "windows[2].schedule: cannot be combined with start, end or daysOfWeek: {FORMS}"
        )]
    );
    assert_eq!(
        with(&|w: &mut Window| w.days_of_week = vec![Monday]),
        [format!(
            "windows[2].schedule: cannot be combined with start, end or daysOfWeek: {FORMS}"
        )]
    );
    assert_eq!(
        with(&|w: &mut Window| w.duration = None),
        [format!(
            "windows[2].duration: is required with schedule: {FORMS}"
        )]
    );
    assert_eq!(
        with(&|w: &mut Window| {
            w.schedule = None;
            w.duration = None;
        }),
        [
            format!("windows[2].start: is required: {FORMS}"),
            format!("windows[2].end: is required: {FORMS}"),
        ]
    );
    let mut daily_with_duration = window(&[], "01:00", "02:00", None);
    daily_with_duration.duration = Some("1h".parse().unwrap());
    assert_eq!(
        errors(&daily_with_duration),
        [format!(
            "windows[2].duration: only goes with schedule (how long the window stays open after each instant of the schedule): {FORMS}"
        )]
    );
    let mut start_only = window(&[], "01:00", "02:00", None);
    start_only.end = None;
    assert_eq!(
        errors(&start_only),
        [format!("windows[2].end: is required with start: {FORMS}")]
    );
    // The zone is checked in both forms, and every problem is reported.
    assert_eq!(
        errors(&cron_window("0 0 31 2 *", "1h", Some("europe/london"))),
        [
            "windows[2].schedule: \"0 0 31 2 *\" never fires: no date has that day of the month in that month (such as February 31st)",
            "windows[2].timezone: \"europe/london\" is not an IANA time zone name: names are case-sensitive, did you mean \"Europe/London\"?",
        ]
    );
}

#[test]
fn cron_semantics_are_pinned() {
    // 2026-11-25 is a Wednesday; 2026-12-13 a Sunday.
    let after = "2026-11-25T12:00:00Z";
    // Both day fields restricted: either matches (Vixie cron), the 13th or a Friday.
    assert_eq!(
        starts(&valid("0 0 13 * 5", "1h", None), "2026-12-01T00:00:00Z", 5),
        [
            "2026-12-04T00:00:00Z",
            "2026-12-11T00:00:00Z",
            "2026-12-13T00:00:00Z",
            "2026-12-18T00:00:00Z",
            "2026-12-25T00:00:00Z",
        ]
    );
    // A step is a restriction: odd days or Mondays (the 14th and 21st are even Mondays).
    assert_eq!(
        starts(&valid("0 0 */2 * 1", "1h", None), "2026-12-12T00:00:00Z", 5),
        [
            "2026-12-13T00:00:00Z",
            "2026-12-14T00:00:00Z",
            "2026-12-15T00:00:00Z",
            "2026-12-17T00:00:00Z",
            "2026-12-19T00:00:00Z",
        ]
    );
    // `*/1` (or a list with `*` in it) leaves a day field unrestricted, as CronJob (robfig/cron
    // v3) reads it: Mondays only, not every day.
    for schedule in ["0 0 */1 * 1", "0 0 *,3 * 1", "0 0 * * 1"] {
        assert_eq!(
            starts(&valid(schedule, "1h", None), "2026-12-01T00:00:00Z", 2),
            ["2026-12-07T00:00:00Z", "2026-12-14T00:00:00Z"],
            "{schedule}"
        );
    }
    // And the other way round: the day of the month alone decides.
    assert_eq!(
        starts(
            &valid("0 0 13 * */1", "1h", None),
            "2026-12-01T00:00:00Z",
            2
        ),
        ["2026-12-13T00:00:00Z", "2027-01-13T00:00:00Z"]
    );
    // One day field `*`: the other alone decides.
    assert_eq!(
        starts(&valid("0 0 * * 5", "1h", None), "2026-12-01T00:00:00Z", 2),
        ["2026-12-04T00:00:00Z", "2026-12-11T00:00:00Z"]
    );
    // 7 and 0 are Sunday; @weekly is Sunday midnight, @daily midnight, @hourly every hour.
    for schedule in ["0 0 * * 7", "0 0 * * 0", "0 0 * * sun", "@weekly"] {
        assert_eq!(
            starts(&valid(schedule, "1h", None), after, 1),
            ["2026-11-29T00:00:00Z"],
            "{schedule}"
        );
    }
    assert_eq!(
        starts(&valid("@daily", "1h", None), after, 1),
        ["2026-11-26T00:00:00Z"]
    );
    assert_eq!(
        starts(&valid("@hourly", "1m", None), after, 2),
        ["2026-11-25T13:00:00Z", "2026-11-25T14:00:00Z"]
    );
    assert_eq!(
        starts(&valid("@monthly", "1h", None), after, 1),
        ["2026-12-01T00:00:00Z"]
    );
    assert_eq!(
        starts(&valid("@yearly", "1h", None), after, 1),
        ["2027-01-01T00:00:00Z"]
    );
    // February 29th: leap years only.
    assert_eq!(
        starts(&valid("0 0 29 2 *", "1h", None), after, 2),
        ["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"]
    );
    // 2100 is no leap year: eight years to the next one (cert-manager once searched less far).
    assert_eq!(
        starts(&valid("0 0 29 2 *", "1h", None), "2096-03-01T00:00:00Z", 1),
        ["2104-02-29T00:00:00Z"]
    );
}

#[test]
fn occurrences_in_utc_and_overlapping_firings() {
    // Weeknights 22:00-02:00: Friday's runs into Saturday, Saturday's does not exist.
    let weeknights = valid("0 22 * * 1-5", "4h", None);
    // Every 20 minutes for 30: occurrences overlap, so the window is always open.
    let overlapping = valid("*/20 * * * *", "30m", None);
    // Longer than a day: Saturday 00:00 to Monday 00:00.
    let weekend = valid("0 0 * * 6", "2d", None);
    check(&[
        (
            &weeknights,
            "2026-11-27T21:59:59Z",
            false,
            Some("2026-11-27T22:00:00Z"),
        ),
        (
            &weeknights,
            "2026-11-27T22:00:00Z",
            true,
            Some("2026-11-30T22:00:00Z"),
        ),
        (
            &weeknights,
            "2026-11-28T01:59:59Z",
            true,
            Some("2026-11-30T22:00:00Z"),
        ),
        (
            &weeknights,
            "2026-11-28T02:00:00Z",
            false,
            Some("2026-11-30T22:00:00Z"),
        ),
        (
            &weeknights,
            "2026-11-28T23:00:00Z",
            false,
            Some("2026-11-30T22:00:00Z"),
        ),
        (
            &overlapping,
            "2026-11-25T12:29:59Z",
            true,
            Some("2026-11-25T12:40:00Z"),
        ),
        (
            &overlapping,
            "2026-11-25T12:00:00.5Z",
            true,
            Some("2026-11-25T12:20:00Z"),
        ),
        (
            &weekend,
            "2026-11-27T23:59:59Z",
            false,
            Some("2026-11-28T00:00:00Z"),
        ),
        (
            &weekend,
            "2026-11-29T23:59:59Z",
            true,
            Some("2026-12-05T00:00:00Z"),
        ),
        (
            &weekend,
            "2026-11-30T00:00:00Z",
            false,
            Some("2026-12-05T00:00:00Z"),
        ),
    ]);
    // A duration past the end of the calendar: the occurrence never closes.
    let long = valid("0 0 1 1 *", "10000y", None);
    assert!(long.contains(utc("2030-06-01T00:00:00Z")));
}

#[test]
fn new_york_gap_and_repeated_hour() {
    // 2026-03-08: 02:00 EST becomes 03:00 EDT at 07:00Z. 2026-11-01: 02:00 EDT becomes
    // 01:00 EST at 06:00Z; 01:00-02:00 happens at 05:00Z (EDT) and again at 06:00Z (EST).
    let ny = Some("America/New_York");
    let in_gap = valid("30 2 * * *", "1h", ny);
    let collapses = valid("0 2 * * *", "1h", ny);
    let in_fold = valid("15 1 * * *", "30m", ny);
    let quarter_hours = valid("*/15 * * * *", "5m", ny);
    let hourly = valid("0 * * * *", "1h", ny);
    check(&[
        // 02:30 does not exist on 03-08: the window opens at 03:00 EDT, closes at 03:30 EDT.
        (
            &in_gap,
            "2026-03-08T06:59:59Z",
            false,
            Some("2026-03-08T07:00:00Z"),
        ),
        (
            &in_gap,
            "2026-03-08T07:00:00Z",
            true,
            Some("2026-03-09T06:30:00Z"),
        ),
        (
            &in_gap,
            "2026-03-08T07:29:59Z",
            true,
            Some("2026-03-09T06:30:00Z"),
        ),
        (
            &in_gap,
            "2026-03-08T07:30:00Z",
            false,
            Some("2026-03-09T06:30:00Z"),
        ),
        // The day before, 02:30 EST.
        (
            &in_gap,
            "2026-03-07T07:30:00Z",
            true,
            Some("2026-03-08T07:00:00Z"),
        ),
        // 02:00-03:00 falls wholly in the gap: no occurrence that day.
        (
            &collapses,
            "2026-03-08T06:00:00Z",
            false,
            Some("2026-03-09T06:00:00Z"),
        ),
        (
            &collapses,
            "2026-03-08T07:00:00Z",
            false,
            Some("2026-03-09T06:00:00Z"),
        ),
        (
            &collapses,
            "2026-03-07T07:30:00Z",
            true,
            Some("2026-03-09T06:00:00Z"),
        ),
        // 01:15-01:45 on 11-01 is the first (EDT) one only.
        (
            &in_fold,
            "2026-11-01T05:15:00Z",
            true,
            Some("2026-11-02T06:15:00Z"),
        ),
        (
            &in_fold,
            "2026-11-01T05:44:59Z",
            true,
            Some("2026-11-02T06:15:00Z"),
        ),
        (
            &in_fold,
            "2026-11-01T06:15:00Z",
            false,
            Some("2026-11-02T06:15:00Z"),
        ),
        (
            &in_fold,
            "2026-11-01T05:14:59Z",
            false,
            Some("2026-11-01T05:15:00Z"),
        ),
        // Every quarter hour for 5 minutes: the firings of the repeated hour count once, at
        // their earlier (EDT) instants, so the second pass opens nothing: next is 02:00 EST.
        (
            &quarter_hours,
            "2026-11-01T05:45:00Z",
            true,
            Some("2026-11-01T07:00:00Z"),
        ),
        (
            &quarter_hours,
            "2026-11-01T05:50:00Z",
            false,
            Some("2026-11-01T07:00:00Z"),
        ),
        (
            &quarter_hours,
            "2026-11-01T06:00:00Z",
            false,
            Some("2026-11-01T07:00:00Z"),
        ),
        (
            &quarter_hours,
            "2026-11-01T06:46:00Z",
            false,
            Some("2026-11-01T07:00:00Z"),
        ),
        (
            &quarter_hours,
            "2026-11-01T07:00:00Z",
            true,
            Some("2026-11-01T07:15:00Z"),
        ),
        // Hourly for an hour: 01:00 EDT lasts until 02:00 EST, across the repeated hour.
        (
            &hourly,
            "2026-11-01T05:00:00Z",
            true,
            Some("2026-11-01T07:00:00Z"),
        ),
        (
            &hourly,
            "2026-11-01T06:30:00Z",
            true,
            Some("2026-11-01T07:00:00Z"),
        ),
        (
            &hourly,
            "2026-11-01T07:00:00Z",
            true,
            Some("2026-11-01T08:00:00Z"),
        ),
        // In the gap: 01:00 EST lasts until the end of the gap, 02:00 collapses, 03:00 EDT next.
        (
            &hourly,
            "2026-03-08T06:59:59Z",
            true,
            Some("2026-03-08T07:00:00Z"),
        ),
        (
            &hourly,
            "2026-03-08T07:00:00Z",
            true,
            Some("2026-03-08T08:00:00Z"),
        ),
    ]);
}

#[test]
fn london_gap_and_repeated_hour() {
    // 2026-03-29: 01:00 GMT becomes 02:00 BST at 01:00Z. 2026-10-25: 02:00 BST becomes 01:00
    // GMT at 01:00Z, so 01:00-02:00 happens at 00:00Z and again at 01:00Z. Both are Sundays.
    let london = Some("Europe/London");
    let gap = valid("30 1 * * 0", "1h", london);
    let fold = valid("15 1 * * SUN", "30m", london);
    let every_ten = valid("*/10 * * * *", "10m", london);
    check(&[
        (
            &gap,
            "2026-03-29T00:59:59Z",
            false,
            Some("2026-03-29T01:00:00Z"),
        ),
        (
            &gap,
            "2026-03-29T01:00:00Z",
            true,
            Some("2026-04-05T00:30:00Z"),
        ),
        (
            &gap,
            "2026-03-29T01:29:59Z",
            true,
            Some("2026-04-05T00:30:00Z"),
        ),
        (
            &gap,
            "2026-03-29T01:30:00Z",
            false,
            Some("2026-04-05T00:30:00Z"),
        ),
        (
            &fold,
            "2026-10-25T00:15:00Z",
            true,
            Some("2026-11-01T01:15:00Z"),
        ),
        (
            &fold,
            "2026-10-25T00:44:59Z",
            true,
            Some("2026-11-01T01:15:00Z"),
        ),
        (
            &fold,
            "2026-10-25T01:15:00Z",
            false,
            Some("2026-11-01T01:15:00Z"),
        ),
        (
            &fold,
            "2026-10-24T23:00:00Z",
            false,
            Some("2026-10-25T00:15:00Z"),
        ),
        // Tiling the clock: open throughout the repeated hour; 01:50 BST lasts until 02:00 GMT.
        (
            &every_ten,
            "2026-10-25T00:55:00Z",
            true,
            Some("2026-10-25T02:00:00Z"),
        ),
        (
            &every_ten,
            "2026-10-25T01:30:00Z",
            true,
            Some("2026-10-25T02:00:00Z"),
        ),
        (
            &every_ten,
            "2026-10-25T02:00:00Z",
            true,
            Some("2026-10-25T02:10:00Z"),
        ),
        // And through the gap: 00:50 GMT lasts until 02:00 BST, the end of the gap.
        (
            &every_ten,
            "2026-03-29T00:59:59Z",
            true,
            Some("2026-03-29T01:00:00Z"),
        ),
        (
            &every_ten,
            "2026-03-29T01:00:00Z",
            true,
            Some("2026-03-29T01:10:00Z"),
        ),
    ]);
}

#[test]
fn lord_howe_half_hour_shift() {
    // Lord Howe Island moves by 30 minutes: +10:30 standard, +11 in summer.
    // 2026-10-04 02:00 +10:30 (15:30Z on 10-03) becomes 02:30 +11: a 30-minute gap.
    // 2026-04-05 02:00 +11 (15:00Z on 04-04) becomes 01:30 +10:30: 01:30-02:00 repeats,
    // first at 14:30Z (+11), then at 15:00Z (+10:30).
    let lord_howe = Some("Australia/Lord_Howe");
    let gap = valid("15 2 * * *", "45m", lord_howe);
    let fold = valid("45 1 * * *", "30m", lord_howe);
    let every_ten = valid("*/10 * * * *", "10m", lord_howe);
    let short = valid("*/10 * * * *", "5m", lord_howe);
    check(&[
        (
            &gap,
            "2026-10-03T15:29:59Z",
            false,
            Some("2026-10-03T15:30:00Z"),
        ),
        (
            &gap,
            "2026-10-03T15:30:00Z",
            true,
            Some("2026-10-04T15:15:00Z"),
        ),
        (
            &gap,
            "2026-10-03T15:59:59Z",
            true,
            Some("2026-10-04T15:15:00Z"),
        ),
        (
            &gap,
            "2026-10-03T16:00:00Z",
            false,
            Some("2026-10-04T15:15:00Z"),
        ),
        // Starts at the first 01:45 (+11), ends at 02:15 (+10:30): 75 minutes that day.
        (
            &fold,
            "2026-04-04T14:45:00Z",
            true,
            Some("2026-04-05T15:15:00Z"),
        ),
        (
            &fold,
            "2026-04-04T15:44:59Z",
            true,
            Some("2026-04-05T15:15:00Z"),
        ),
        (
            &fold,
            "2026-04-04T15:45:00Z",
            false,
            Some("2026-04-05T15:15:00Z"),
        ),
        // 01:50 (+11) lasts until 02:00 (+10:30), across the repeated half hour.
        (
            &every_ten,
            "2026-04-04T15:10:00Z",
            true,
            Some("2026-04-04T15:30:00Z"),
        ),
        (
            &short,
            "2026-04-04T14:52:00Z",
            true,
            Some("2026-04-04T15:30:00Z"),
        ),
        (
            &short,
            "2026-04-04T15:10:00Z",
            false,
            Some("2026-04-04T15:30:00Z"),
        ),
        // In the gap: the firings 02:00 to 02:20 collapse (they would close before 02:30);
        // 02:30 +11 opens at 15:30Z.
        (
            &short,
            "2026-10-03T15:29:00Z",
            false,
            Some("2026-10-03T15:30:00Z"),
        ),
        (
            &short,
            "2026-10-03T15:30:00Z",
            true,
            Some("2026-10-03T15:40:00Z"),
        ),
    ]);
}

/// Pairs of windows that mean the same: (schedule, duration, days, start, end).
const EQUIVALENT: &[(&str, &str, &[DayOfWeek], &str, &str)] = &[
    (
        "0 22 * * 1-5",
        "4h",
        &[Monday, Tuesday, Wednesday, Thursday, Friday],
        "22:00",
        "02:00",
    ),
    ("0 22 * * 6", "4h", &[Saturday], "22:00", "02:00"),
    ("30 1 * * *", "1h", &[], "01:30", "02:30"),
    ("0 2 * * 0", "1h", &[Sunday], "02:00", "03:00"),
    ("45 1 * * *", "30m", &[], "01:45", "02:15"),
    ("15 2 * * *", "45m", &[], "02:15", "03:00"),
    ("0 0 * * *", "24h", &[], "00:00", "24:00"),
    ("0 23 * * sun", "90m", &[Sunday], "23:00", "00:30"),
    ("30 0 * * 6,0", "23h", &[Saturday, Sunday], "00:30", "23:30"),
];

#[test]
fn the_two_forms_agree_minute_by_minute_around_every_transition() {
    // Every minute (and the second before it) from 12 hours before to 12 hours after each 2026
    // transition of the three zones: every window above opens or closes in that span.
    for zone in ["America/New_York", "Europe/London", "Australia/Lord_Howe"] {
        let tz = TimeZone::get(zone).unwrap();
        let transitions = tz
            .following(utc("2026-01-01T00:00:00Z"))
            .take_while(|transition| transition.timestamp() < utc("2027-01-01T00:00:00Z"))
            .map(|transition| transition.timestamp())
            .collect::<Vec<_>>();
        assert_eq!(transitions.len(), 2, "{zone}");
        for (schedule, duration, days, start, end) in EQUIVALENT {
            let cron = valid(schedule, duration, Some(zone));
            let daily = daily(days, start, end, Some(zone));
            for transition in &transitions {
                for minute in -12 * 60..=12 * 60 {
                    for offset in [0, -1] {
                        let t = *transition + SignedDuration::from_secs(minute * 60 + offset);
                        assert_eq!(
                            cron.contains(t),
                            daily.contains(t),
                            "{zone} {schedule} contains({t})"
                        );
                        assert_eq!(
                            cron.next_start_after(t),
                            daily.next_start_after(t),
                            "{zone} {schedule} next_start_after({t})"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn schedules_that_tile_the_clock_are_always_open() {
    for zone in ZONES {
        for (schedule, duration) in [
            ("* * * * *", "1m"),
            ("0 * * * *", "1h"),
            ("*/15 * * * *", "15m"),
            ("0 0 * * *", "24h"),
        ] {
            let window = valid(schedule, duration, Some(*zone));
            let tz = TimeZone::get(zone).unwrap();
            // Around the first transitions of 2011 (Apia skipped 2011-12-30, its third) and 2026.
            for year_start in ["2011-01-01T00:00:00Z", "2026-01-01T00:00:00Z"] {
                for transition in tz.following(utc(year_start)).take(3) {
                    for minute in -120..=120 {
                        let t = transition.timestamp() + SignedDuration::from_mins(minute);
                        assert!(window.contains(t), "{zone} {schedule} at {t}");
                    }
                }
            }
        }
    }
}

#[test]
fn several_windows_of_both_forms() {
    let windows = [
        daily(&[Tuesday], "02:00", "04:00", None),
        valid("0 1 * * *", "2h", None),
        valid("30 2 * * *", "1h", Some("Europe/London")),
    ];
    // Tuesday 2026-11-24 02:30Z: all three open, the first in list order is reported.
    assert_eq!(
        first_containing(&windows, utc("2026-11-24T02:30:00Z")),
        Some(0)
    );
    assert_eq!(
        first_containing(&windows, utc("2026-11-25T02:30:00Z")),
        Some(1)
    );
    assert_eq!(
        first_containing(&windows, utc("2026-11-25T03:15:00Z")),
        Some(2)
    );
    assert_eq!(
        first_containing(&windows, utc("2026-11-25T03:30:00Z")),
        None
    );
    let next = next_start_after(&windows, utc("2026-11-25T03:30:00Z")).unwrap();
    assert_eq!(
        (next.index, next.timestamp()),
        (1, utc("2026-11-26T01:00:00Z"))
    );
    // A tie between the forms goes to the first in list order.
    let tie = [
        valid("0 2 * * 2", "1h", None),
        daily(&[Tuesday], "02:00", "03:00", None),
    ];
    let next = next_start_after(&tie, utc("2026-11-20T00:00:00Z")).unwrap();
    assert_eq!(
        (next.index, next.timestamp()),
        (0, utc("2026-11-24T02:00:00Z"))
    );
    assert_eq!(
        next.to_string(),
        "2026-11-24 02:00 UTC (2026-11-24T02:00:00Z)"
    );
}

#[test]
fn the_end_of_the_calendar_is_not_a_panic() {
    let window = valid("0 1 * * *", "1h", Some("Europe/London"));
    assert_eq!(window.next_start_after(Timestamp::MAX), None);
    assert!(!window.contains(Timestamp::MAX));
    assert!(!window.contains(Timestamp::MIN));
    // croner's calendar starts in year 1: the first start is then.
    let first = window.next_start_after(Timestamp::MIN).unwrap();
    assert_eq!(
        (
            first.in_tz("Europe/London").unwrap().year(),
            window.contains(first)
        ),
        (1, true)
    );
}

/// A `daysOfWeek`/`start`/`end` window and the schedule window that means the same.
fn equivalent_pair() -> impl Strategy<Value = (Window, Window)> {
    let days = proptest::sample::subsequence(
        vec![
            Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday,
        ],
        0..=7,
    );
    (
        days,
        0u16..1440,
        1u16..=1440,
        proptest::sample::select(ZONES),
        any::<bool>(),
    )
        // 24 hours from any time but midnight has no start/end spelling (start == end).
        .prop_filter("expressible as start/end", |(_, start, length, _, _)| {
            *length < 1440 || *start == 0
        })
        .prop_map(|(days, start, length, zone, names)| {
            let zone = (zone != "UTC").then(|| zone.to_owned());
            let wall = |minutes: u16| WallTime::new((minutes / 60) as u8, (minutes % 60) as u8);
            let end = match start + length {
                1440 => WallTime::END_OF_DAY,
                sum => wall(sum % 1440).unwrap(),
            };
            let daily = Window::daily(days.clone(), wall(start).unwrap(), end, zone.clone());
            let day_field = match days.is_empty() {
                true => "*".to_owned(),
                false => days
                    .iter()
                    .map(|&day| {
                        let sunday_zero = jiff::civil::Weekday::from(day).to_sunday_zero_offset();
                        match names {
                            true => ["sun", "Mon", "TUE", "wed", "Thu", "FRI", "sat"]
                                [usize::from(sunday_zero.unsigned_abs())]
                            .to_owned(),
                            false => sunday_zero.to_string(),
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(","),
            };
            let schedule = format!("{} {} * * {day_field}", start % 60, start / 60);
            let duration = PolicyDuration::from_seconds(i64::from(length) * 60).unwrap();
            (daily, Window::scheduled(schedule, duration, zone))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// A schedule window and its `daysOfWeek`/`start`/`end` twin decide the same, alone and
    /// in a list with another window.
    #[test]
    fn the_two_forms_decide_the_same((daily, cron) in equivalent_pair(), t in arbitrary_instant()) {
        let daily = daily.validate(0).unwrap();
        let cron = cron.validate(0).unwrap();
        prop_assert_eq!(daily.contains(t), cron.contains(t));
        prop_assert_eq!(daily.next_start_after(t), cron.next_start_after(t));
        let other = self::daily(&[Wednesday], "12:00", "13:00", Some("Asia/Kolkata"));
        let daily_list = [other.clone(), daily];
        let cron_list = [other, cron];
        prop_assert_eq!(first_containing(&daily_list, t), first_containing(&cron_list, t));
        prop_assert_eq!(
            next_start_after(&daily_list, t).map(|start| (start.index, start.timestamp())),
            next_start_after(&cron_list, t).map(|start| (start.index, start.timestamp()))
        );
    }

    /// Whatever the schedule: the next start is open, strictly later, and nothing between
    /// is a start (checked minute by minute over the following two hours for frequent ones).
    #[test]
    fn next_start_is_open_and_never_goes_backwards(
        minute in prop_oneof![Just("*/7".to_owned()), Just("0".to_owned()), (0u8..60).prop_map(|m| m.to_string())],
        hour in prop_oneof![Just("*".to_owned()), Just("1-3".to_owned()), (0u8..24).prop_map(|h| h.to_string())],
        duration in 1i64..600,
        zone in proptest::sample::select(ZONES),
        t in arbitrary_instant(),
        step in 0i64..(3 * 86_400),
    ) {
        let schedule = format!("{minute} {hour} * * *");
        let window = valid(&schedule, &format!("{duration}m"), Some(zone));
        let next = window.next_start_after(t).unwrap();
        prop_assert!(next > t);
        prop_assert!(window.contains(next));
        let later = Timestamp::from_second(t.as_second() + step).unwrap();
        prop_assert!(window.next_start_after(later).unwrap() >= next);
    }

    /// The occurrence an instant belongs to is the first, in firing order, that contains it:
    /// checked against walking back firing by firing, around daylight-saving transitions.
    #[test]
    fn the_earliest_containing_occurrence_is_the_first_to_contain(
        schedule in proptest::sample::select(&["* * * * *", "*/15 * * * *", "0 * * * *", "30 1-3 * * *", "0 2 * * *"][..]),
        minutes in 1i64..=180,
        zone in proptest::sample::select(ZONES),
        t in arbitrary_instant(),
        around in -240i64..240,
    ) {
        let tz = TimeZone::get(zone).unwrap();
        let near = tz.following(t).next().map_or(t, |transition| transition.timestamp());
        let t = near + SignedDuration::from_mins(around);
        let cron = CronWindow::parse(schedule, PolicyDuration::from_seconds(minutes * 60).unwrap()).unwrap();
        let (bound, inclusive) = wall_bound(&tz, t);
        // Walk back from the latest firing while occurrences still contain t.
        let mut firing = cron.previous_firing(bound, inclusive);
        let mut first = None;
        for _ in 0..400 {
            let Some(current) = firing else { break };
            match cron.occurrence(&tz, current) {
                Some(occurrence) if occurrence.contains(t) => first = Some(occurrence),
                // Collapsed in a gap: earlier ones end no later, keep looking past it.
                None => {}
                Some(_) => break,
            }
            firing = cron.previous_firing(current, false);
        }
        prop_assert_eq!(cron.earliest_containing(&tz, t), first);
        prop_assert_eq!(first.is_some(), cron.contains(&tz, t));
    }
}
