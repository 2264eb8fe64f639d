//! Window tests: validation messages, occurrences in UTC and across DST, several windows.

use super::DayOfWeek::*;
use super::*;
use crate::policy::testing::{
    arbitrary_any_window, arbitrary_instant, arbitrary_window, cron_window, utc, window,
};
use jiff::civil::date;
use proptest::prelude::*;

fn valid(days: &[DayOfWeek], start: &str, end: &str, zone: Option<&str>) -> ValidWindow {
    window(days, start, end, zone).validate(0).unwrap()
}

/// A wall time in a zone, unambiguous (tests pick such times).
fn at(zone: &str, y: i16, mo: i8, d: i8, h: i8, mi: i8) -> Timestamp {
    date(y, mo, d)
        .at(h, mi, 0, 0)
        .to_zoned(TimeZone::get(zone).unwrap())
        .unwrap()
        .timestamp()
}

// The wall-time grammar, the CRD form (camelCase, day names) and the schema are tested with
// the types in `ck8s_certs_api::renewal_policy`.

#[test]
fn validation_names_the_field_and_the_reason() {
    let rows: &[(Window, &[&str])] = &[
        (
            window(&[], "24:00", "01:00", None),
            &[
                "windows[2].start: 24:00 is only allowed as an end; a window that opens at midnight starts at 00:00",
            ],
        ),
        (
            window(&[], "09:00", "09:00", None),
            &[
                "windows[2].end: must differ from start (09:00): the window would be empty; a whole day is 00:00 to 24:00",
            ],
        ),
        (
            window(&[], "01:00", "02:00", Some("")),
            &[
                "windows[2].timezone: must not be empty: omit it for UTC, or give an IANA name such as Europe/London",
            ],
        ),
        (
            window(&[], "01:00", "02:00", Some("europe/london")),
            &[
                "windows[2].timezone: \"europe/london\" is not an IANA time zone name: names are case-sensitive, did you mean \"Europe/London\"?",
            ],
        ),
        (
            window(&[], "01:00", "02:00", Some("utc")),
            &[
                "windows[2].timezone: \"utc\" is not an IANA time zone name: names are case-sensitive, did you mean \"UTC\"?",
            ],
        ),
        (
            window(&[], "01:00", "02:00", Some("Etc/Unknown")),
            &[
                "windows[2].timezone: \"Etc/Unknown\" stands for an unknown time zone, not a real one: give an IANA name such as Europe/London, or omit it for UTC",
            ],
        ),
        (
            window(&[], "01:00", "02:00", Some("Mars/Olympus_Mons")),
            &[
                "windows[2].timezone: \"Mars/Olympus_Mons\" is not an IANA time zone name (such as UTC, Europe/London or America/New_York)",
            ],
        ),
        (
            window(&[], "01:00", "02:00", Some(" UTC")),
            &[
                "windows[2].timezone: \" UTC\" is not an IANA time zone name (such as UTC, Europe/London or America/New_York)",
            ],
        ),
        (
            window(&[], "01:00", "02:00", Some("+05:30")),
            &[
                "windows[2].timezone: \"+05:30\" is not an IANA time zone name (such as UTC, Europe/London or America/New_York)",
            ],
        ),
        (
            window(&[], "24:00", "24:00", Some("")),
            &[
                "windows[2].start: 24:00 is only allowed as an end; a window that opens at midnight starts at 00:00",
                "windows[2].timezone: must not be empty: omit it for UTC, or give an IANA name such as Europe/London",
            ],
        ),
    ];
    for (window, expected) in rows {
        let errors: Vec<String> = window
            .validate(2)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(&errors, expected);
    }
    for zone in [
        "UTC",
        "Etc/UTC",
        "Europe/London",
        "America/New_York",
        "Asia/Kolkata",
        "Australia/Lord_Howe",
        "US/Eastern",
        "Asia/Calcutta",
    ] {
        assert!(
            window(&[], "01:00", "02:00", Some(zone))
                .validate(0)
                .is_ok(),
            "{zone}"
        );
    }
    let all = validate_windows(&[
        window(&[], "01:00", "02:00", None),
        window(&[], "03:00", "03:00", None),
        window(&[], "01:00", "02:00", Some("Nowhere")),
    ]);
    let paths: Vec<String> = all
        .unwrap_err()
        .into_iter()
        .map(|error| error.path)
        .collect();
    assert_eq!(paths, ["windows[1].end", "windows[2].timezone"]);
}

/// (window, instant, expected contains, expected next start after the instant).
type Row = (ValidWindow, Timestamp, bool, Option<Timestamp>);

fn check(rows: &[Row]) {
    for (i, (window, t, inside, next)) in rows.iter().enumerate() {
        assert_eq!(window.contains(*t), *inside, "row {i}: contains({t})");
        assert_eq!(
            window.next_start_after(*t),
            *next,
            "row {i}: next_start_after({t})"
        );
    }
}

#[test]
fn windows_in_utc_across_midnight_and_the_week() {
    // 2026-11-22 is a Sunday.
    let sunday_night = valid(&[Sunday], "22:00", "02:00", None);
    let friday_to_midnight = valid(&[Friday], "22:00", "24:00", None);
    let saturday_all_day = valid(&[Saturday], "00:00", "24:00", None);
    let every_day = valid(&[], "09:00", "17:00", None);
    let sunday = Some(utc("2026-11-22T22:00:00Z"));
    let next_sunday = Some(utc("2026-11-29T22:00:00Z"));
    check(&[
        (
            sunday_night.clone(),
            utc("2026-11-22T21:59:59Z"),
            false,
            sunday,
        ),
        (
            sunday_night.clone(),
            utc("2026-11-22T22:00:00Z"),
            true,
            next_sunday,
        ),
        (
            sunday_night.clone(),
            utc("2026-11-22T23:30:00Z"),
            true,
            next_sunday,
        ),
        // Monday early morning belongs to Sunday's window.
        (
            sunday_night.clone(),
            utc("2026-11-23T01:59:59Z"),
            true,
            next_sunday,
        ),
        (
            sunday_night.clone(),
            utc("2026-11-23T02:00:00Z"),
            false,
            next_sunday,
        ),
        (
            sunday_night.clone(),
            utc("2026-11-23T22:30:00Z"),
            false,
            next_sunday,
        ),
        // Sunday early morning would belong to Saturday's, which is not selected.
        (
            sunday_night.clone(),
            utc("2026-11-29T00:30:00Z"),
            false,
            next_sunday,
        ),
        (
            friday_to_midnight.clone(),
            utc("2026-11-27T23:59:59Z"),
            true,
            Some(utc("2026-12-04T22:00:00Z")),
        ),
        (
            friday_to_midnight.clone(),
            utc("2026-11-28T00:00:00Z"),
            false,
            Some(utc("2026-12-04T22:00:00Z")),
        ),
        (
            saturday_all_day.clone(),
            utc("2026-11-28T00:00:00Z"),
            true,
            Some(utc("2026-12-05T00:00:00Z")),
        ),
        (
            saturday_all_day.clone(),
            utc("2026-11-28T23:59:59Z"),
            true,
            Some(utc("2026-12-05T00:00:00Z")),
        ),
        (
            saturday_all_day.clone(),
            utc("2026-11-29T00:00:00Z"),
            false,
            Some(utc("2026-12-05T00:00:00Z")),
        ),
        (
            saturday_all_day.clone(),
            utc("2026-11-27T23:59:59Z"),
            false,
            Some(utc("2026-11-28T00:00:00Z")),
        ),
        // Empty daysOfWeek: every day.
        (
            every_day.clone(),
            utc("2026-11-28T08:00:00Z"),
            false,
            Some(utc("2026-11-28T09:00:00Z")),
        ),
        (
            every_day.clone(),
            utc("2026-11-29T16:59:59Z"),
            true,
            Some(utc("2026-11-30T09:00:00Z")),
        ),
        (
            every_day.clone(),
            utc("2026-11-29T17:00:00Z"),
            false,
            Some(utc("2026-11-30T09:00:00Z")),
        ),
    ]);
}

#[test]
fn new_york_spring_forward_gap() {
    // 2026-03-08: 02:00 EST becomes 03:00 EDT at 07:00Z; 02:00-03:00 does not exist.
    let ny = Some("America/New_York");
    let starts_in_gap = valid(&[], "02:30", "04:00", ny);
    let inside_gap = valid(&[], "02:00", "02:30", ny);
    let ends_in_gap = valid(&[Saturday], "22:00", "02:30", ny);
    check(&[
        (
            starts_in_gap.clone(),
            utc("2026-03-08T06:59:59Z"),
            false,
            Some(utc("2026-03-08T07:00:00Z")),
        ),
        (
            starts_in_gap.clone(),
            utc("2026-03-08T07:00:00Z"),
            true,
            Some(utc("2026-03-09T06:30:00Z")),
        ),
        (
            starts_in_gap.clone(),
            utc("2026-03-08T07:59:59Z"),
            true,
            Some(utc("2026-03-09T06:30:00Z")),
        ),
        (
            starts_in_gap.clone(),
            utc("2026-03-08T08:00:00Z"),
            false,
            Some(utc("2026-03-09T06:30:00Z")),
        ),
        // The day before: ordinary EST.
        (
            starts_in_gap.clone(),
            utc("2026-03-07T07:30:00Z"),
            true,
            Some(utc("2026-03-08T07:00:00Z")),
        ),
        // Start and end both in the gap: no occurrence on 03-08.
        (
            inside_gap.clone(),
            utc("2026-03-08T05:00:00Z"),
            false,
            Some(utc("2026-03-09T06:00:00Z")),
        ),
        (
            inside_gap.clone(),
            utc("2026-03-08T07:00:00Z"),
            false,
            Some(utc("2026-03-09T06:00:00Z")),
        ),
        (
            inside_gap.clone(),
            utc("2026-03-07T07:15:00Z"),
            true,
            Some(utc("2026-03-09T06:00:00Z")),
        ),
        // An end in the gap is the first instant after it: 03:00 EDT.
        (
            ends_in_gap.clone(),
            utc("2026-03-08T03:00:00Z"),
            true,
            Some(utc("2026-03-15T02:00:00Z")),
        ),
        (
            ends_in_gap.clone(),
            utc("2026-03-08T06:59:59Z"),
            true,
            Some(utc("2026-03-15T02:00:00Z")),
        ),
        (
            ends_in_gap.clone(),
            utc("2026-03-08T07:00:00Z"),
            false,
            Some(utc("2026-03-15T02:00:00Z")),
        ),
    ]);
}

#[test]
fn new_york_fall_back_repeated_hour() {
    // 2026-11-01: 02:00 EDT becomes 01:00 EST at 06:00Z; 01:00-02:00 happens twice
    // (05:00Z-06:00Z EDT, then 06:00Z-07:00Z EST).
    let ny = Some("America/New_York");
    let in_repeated_hour = valid(&[], "01:00", "01:30", ny);
    let across = valid(&[], "01:30", "03:00", ny);
    check(&[
        (
            in_repeated_hour.clone(),
            utc("2026-11-01T05:00:00Z"),
            true,
            Some(utc("2026-11-02T06:00:00Z")),
        ),
        (
            in_repeated_hour.clone(),
            utc("2026-11-01T05:29:59Z"),
            true,
            Some(utc("2026-11-02T06:00:00Z")),
        ),
        // The second 01:00-01:30 (EST) is not in the window: the earlier instant counts.
        (
            in_repeated_hour.clone(),
            utc("2026-11-01T06:15:00Z"),
            false,
            Some(utc("2026-11-02T06:00:00Z")),
        ),
        (
            in_repeated_hour.clone(),
            utc("2026-11-01T04:59:59Z"),
            false,
            Some(utc("2026-11-01T05:00:00Z")),
        ),
        (
            across.clone(),
            utc("2026-11-01T05:30:00Z"),
            true,
            Some(utc("2026-11-02T06:30:00Z")),
        ),
        (
            across.clone(),
            utc("2026-11-01T06:10:00Z"),
            true,
            Some(utc("2026-11-02T06:30:00Z")),
        ),
        (
            across.clone(),
            utc("2026-11-01T07:59:59Z"),
            true,
            Some(utc("2026-11-02T06:30:00Z")),
        ),
        (
            across.clone(),
            utc("2026-11-01T08:00:00Z"),
            false,
            Some(utc("2026-11-02T06:30:00Z")),
        ),
    ]);
}

#[test]
fn london_gap_and_repeated_hour() {
    // 2026-03-29: 01:00 GMT becomes 02:00 BST at 01:00Z. 2026-10-25: 02:00 BST becomes
    // 01:00 GMT at 01:00Z, so 01:00-02:00 happens at 00:00Z and again at 01:00Z.
    let london = Some("Europe/London");
    let gap = valid(&[Sunday], "01:30", "02:30", london);
    let fold = valid(&[Sunday], "01:15", "01:45", london);
    check(&[
        (
            gap.clone(),
            utc("2026-03-29T00:59:59Z"),
            false,
            Some(utc("2026-03-29T01:00:00Z")),
        ),
        (
            gap.clone(),
            utc("2026-03-29T01:00:00Z"),
            true,
            Some(utc("2026-04-05T00:30:00Z")),
        ),
        (
            gap.clone(),
            utc("2026-03-29T01:29:59Z"),
            true,
            Some(utc("2026-04-05T00:30:00Z")),
        ),
        (
            gap.clone(),
            utc("2026-03-29T01:30:00Z"),
            false,
            Some(utc("2026-04-05T00:30:00Z")),
        ),
        (
            fold.clone(),
            utc("2026-10-25T00:15:00Z"),
            true,
            Some(utc("2026-11-01T01:15:00Z")),
        ),
        (
            fold.clone(),
            utc("2026-10-25T00:44:59Z"),
            true,
            Some(utc("2026-11-01T01:15:00Z")),
        ),
        (
            fold.clone(),
            utc("2026-10-25T01:15:00Z"),
            false,
            Some(utc("2026-11-01T01:15:00Z")),
        ),
        (
            fold.clone(),
            utc("2026-10-24T23:00:00Z"),
            false,
            Some(utc("2026-10-25T00:15:00Z")),
        ),
    ]);
}

#[test]
fn lord_howe_half_hour_shift() {
    // Lord Howe Island moves by 30 minutes: +10:30 standard, +11 in summer.
    // 2026-10-04 02:00 +10:30 (15:30Z on 10-03) becomes 02:30 +11: a 30-minute gap.
    // 2026-04-05 02:00 +11 (15:00Z on 04-04) becomes 01:30 +10:30: 01:30-02:00 repeats.
    let lord_howe = Some("Australia/Lord_Howe");
    let gap = valid(&[], "02:15", "03:00", lord_howe);
    let fold = valid(&[], "01:45", "02:15", lord_howe);
    check(&[
        (
            gap.clone(),
            utc("2026-10-03T15:29:59Z"),
            false,
            Some(utc("2026-10-03T15:30:00Z")),
        ),
        (
            gap.clone(),
            utc("2026-10-03T15:30:00Z"),
            true,
            Some(utc("2026-10-04T15:15:00Z")),
        ),
        (
            gap.clone(),
            utc("2026-10-03T15:59:59Z"),
            true,
            Some(utc("2026-10-04T15:15:00Z")),
        ),
        (
            gap.clone(),
            utc("2026-10-03T16:00:00Z"),
            false,
            Some(utc("2026-10-04T15:15:00Z")),
        ),
        // Starts at the first 01:45 (+11), ends at 02:15 (+10:30): 75 minutes that day.
        (
            fold.clone(),
            utc("2026-04-04T14:45:00Z"),
            true,
            Some(utc("2026-04-05T15:15:00Z")),
        ),
        (
            fold.clone(),
            utc("2026-04-04T15:44:59Z"),
            true,
            Some(utc("2026-04-05T15:15:00Z")),
        ),
        (
            fold.clone(),
            utc("2026-04-04T15:45:00Z"),
            false,
            Some(utc("2026-04-05T15:15:00Z")),
        ),
    ]);
}

#[test]
fn kolkata_non_hour_offset() {
    // +05:30 all year: 09:00 IST is 03:30Z. 2026-11-23 is a Monday.
    let office = valid(
        &[Monday, Tuesday, Wednesday, Thursday, Friday],
        "09:00",
        "17:00",
        Some("Asia/Kolkata"),
    );
    check(&[
        (
            office.clone(),
            utc("2026-11-23T03:29:59Z"),
            false,
            Some(utc("2026-11-23T03:30:00Z")),
        ),
        (
            office.clone(),
            utc("2026-11-23T03:30:00Z"),
            true,
            Some(utc("2026-11-24T03:30:00Z")),
        ),
        (
            office.clone(),
            utc("2026-11-23T11:29:59Z"),
            true,
            Some(utc("2026-11-24T03:30:00Z")),
        ),
        (
            office.clone(),
            utc("2026-11-23T11:30:00Z"),
            false,
            Some(utc("2026-11-24T03:30:00Z")),
        ),
        (
            office.clone(),
            utc("2026-11-27T12:00:00Z"),
            false,
            Some(utc("2026-11-30T03:30:00Z")),
        ),
    ]);
    assert_eq!(
        office.next_start_after(at("Asia/Kolkata", 2026, 11, 28, 10, 0)),
        Some(at("Asia/Kolkata", 2026, 11, 30, 9, 0))
    );
}

#[test]
fn several_windows_report_the_first_in_list_order() {
    let windows = [
        valid(
            &[Monday, Tuesday, Wednesday, Thursday, Friday],
            "01:00",
            "05:00",
            None,
        ),
        valid(&[], "00:00", "03:00", None),
        valid(&[], "02:00", "04:00", Some("Europe/London")),
    ];
    // Tuesday 2026-11-24: all three are open at 02:30Z.
    assert_eq!(
        first_containing(&windows, utc("2026-11-24T02:30:00Z")),
        Some(0)
    );
    // Saturday: the weekday window is closed.
    assert_eq!(
        first_containing(&windows, utc("2026-11-28T02:30:00Z")),
        Some(1)
    );
    assert_eq!(
        first_containing(&windows, utc("2026-11-28T03:30:00Z")),
        Some(2)
    );
    assert_eq!(
        first_containing(&windows, utc("2026-11-28T04:00:00Z")),
        None
    );
    let next = next_start_after(&windows, utc("2026-11-28T04:00:00Z")).unwrap();
    assert_eq!(
        (next.index, next.timestamp()),
        (1, utc("2026-11-29T00:00:00Z"))
    );
    // Monday 01:00Z: window 0 opens; the others opened earlier.
    let next = next_start_after(&windows, utc("2026-11-29T23:30:00Z")).unwrap();
    assert_eq!(
        (next.index, next.timestamp()),
        (1, utc("2026-11-30T00:00:00Z"))
    );
    let next = next_start_after(&windows, utc("2026-11-30T00:00:00Z")).unwrap();
    assert_eq!(
        (next.index, next.timestamp()),
        (0, utc("2026-11-30T01:00:00Z"))
    );
    // A tie goes to the first in list order.
    let tie = [
        valid(&[], "03:00", "04:00", None),
        valid(&[], "03:00", "05:00", None),
    ];
    let next = next_start_after(&tie[..], utc("2026-11-30T00:00:00Z")).unwrap();
    assert_eq!(next.index, 0);
    let reversed = [tie[1].clone(), tie[0].clone()];
    assert_eq!(
        next_start_after(&reversed, utc("2026-11-30T00:00:00Z"))
            .unwrap()
            .index,
        0
    );
    assert_eq!(next_start_after(&[], utc("2026-11-30T00:00:00Z")), None);
}

#[test]
fn window_starts_print_in_their_zone_and_in_utc() {
    let windows = [valid(&[Tuesday], "02:00", "04:00", Some("Europe/London"))];
    let next = next_start_after(&windows, utc("2026-11-20T00:00:00Z")).unwrap();
    assert_eq!(
        next.to_string(),
        "2026-11-24 02:00 Europe/London (2026-11-24T02:00:00Z)"
    );
    let windows = [valid(&[], "09:00", "10:00", Some("Asia/Kolkata"))];
    let next = next_start_after(&windows, utc("2026-11-20T00:00:00Z")).unwrap();
    assert_eq!(
        next.to_string(),
        "2026-11-20 09:00 Asia/Kolkata (2026-11-20T03:30:00Z)"
    );
    let windows = [valid(&[], "09:00", "10:00", None)];
    let next = upcoming_starts(&windows, utc("2026-11-20T09:00:00Z"), 2);
    let printed: Vec<String> = next.iter().map(ToString::to_string).collect();
    assert_eq!(
        printed,
        [
            "2026-11-21 09:00 UTC (2026-11-21T09:00:00Z)",
            "2026-11-22 09:00 UTC (2026-11-22T09:00:00Z)"
        ]
    );
}

#[test]
fn the_end_of_the_calendar_is_not_a_panic() {
    let window = valid(&[], "01:00", "02:00", Some("Europe/London"));
    assert_eq!(window.next_start_after(Timestamp::MAX), None);
    assert!(!window.contains(Timestamp::MAX));
    assert!(!window.contains(Timestamp::MIN));
    assert!(window.next_start_after(Timestamp::MIN).is_some());
}

#[test]
fn an_instant_belongs_to_the_occurrence_that_opened_first() {
    let short = window(&[], "01:00", "01:10", None);
    let long = window(&[], "01:00", "05:00", None);
    let earlier = window(&[], "00:30", "02:00", None);
    let validate = |windows: &[Window]| validate_windows(windows).unwrap();
    let t = utc("2026-11-24T01:05:00Z");
    let found = |windows: &[Window]| {
        opened_first(&validate(windows), t).map(|o| (o.index, o.start.timestamp(), o.end))
    };
    // Same opening: the one that closes last, whatever the list order.
    assert_eq!(
        found(&[short.clone(), long.clone()]),
        Some((1, utc("2026-11-24T01:00:00Z"), utc("2026-11-24T05:00:00Z")))
    );
    // An earlier opening wins over a later close.
    assert_eq!(
        found(&[short.clone(), long.clone(), earlier.clone()]),
        Some((2, utc("2026-11-24T00:30:00Z"), utc("2026-11-24T02:00:00Z")))
    );
    // Identical occurrences: list order.
    assert_eq!(
        found(&[long.clone(), long.clone()]).map(|(index, ..)| index),
        Some(0)
    );
    assert_eq!(found(&[window(&[], "02:00", "03:00", None)]), None);
    let occurrence = opened_first(&validate(&[long]), t).unwrap();
    assert_eq!(
        occurrence.opening().to_string(),
        "2026-11-24 01:00 UTC (2026-11-24T01:00:00Z)"
    );
}

#[test]
fn overlapping_schedule_occurrences_belong_to_the_first_opened() {
    // Every quarter of an hour for an hour: four occurrences contain any instant.
    let window = cron_window("*/15 * * * *", "1h", Some("Europe/London"))
        .validate(0)
        .unwrap();
    let t = utc("2026-11-24T10:20:00Z");
    assert_eq!(
        window.occurrence_containing(t),
        Some(Occurrence {
            start: utc("2026-11-24T09:30:00Z"),
            end: utc("2026-11-24T10:30:00Z"),
        })
    );
    // Exactly at an end, the next one.
    assert_eq!(
        window
            .occurrence_containing(utc("2026-11-24T10:30:00Z"))
            .map(|o| o.start),
        Some(utc("2026-11-24T09:45:00Z"))
    );
    // A day-long occurrence a minute: 1440 overlap; found without walking them.
    let dense = cron_window("* * * * *", "1d", None).validate(0).unwrap();
    assert_eq!(
        dense.occurrence_containing(t).map(|o| o.start),
        Some(utc("2026-11-23T10:21:00Z"))
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn next_start_is_the_earliest_start_after(w in arbitrary_window(), t in arbitrary_instant()) {
        let window = w.validate(0).unwrap();
        let next = window.next_start_after(t).unwrap();
        prop_assert!(next > t);
        prop_assert!(window.contains(next));
        // Brute force over a wide range of dates.
        let local = window.zone.to_datetime(t).date();
        let earliest = dates(days_before(local, 10), 40)
            .filter_map(|date| window.occurrence(date))
            .map(|occurrence| occurrence.start)
            .filter(|&start| start > t)
            .min();
        prop_assert_eq!(Some(next), earliest);
    }

    #[test]
    fn next_start_never_goes_backwards(w in arbitrary_window(), t in arbitrary_instant(), step in 0i64..(9 * 86_400)) {
        let window = w.validate(0).unwrap();
        let later = Timestamp::from_second(t.as_second() + step).unwrap();
        prop_assert!(window.next_start_after(t) <= window.next_start_after(later));
    }

    /// A wall time names the first instant at which the zone's clock reaches it: itself
    /// when it exists (the earlier one in a repeated hour), else the end of the gap.
    #[test]
    fn wall_times_resolve_to_the_first_instant_the_clock_reaches_them(
        zone in proptest::sample::select(crate::policy::testing::ZONES),
        t in arbitrary_instant(),
        minutes in -150i64..150,
    ) {
        // Wall times around the zone's next transition, where gaps and folds are.
        let zone = TimeZone::get(zone).unwrap();
        let near = zone.following(t).next().map_or(t, |transition| transition.timestamp());
        let wall = zone.to_datetime(near) + jiff::SignedDuration::from_mins(minutes);
        let wall = wall.with().second(0).subsec_nanosecond(0).build().unwrap();
        let resolved = resolve(&zone, wall).unwrap();
        let clock = |t: Timestamp| zone.to_datetime(t);
        prop_assert!(clock(resolved) >= wall);
        prop_assert!(clock(resolved) == wall || zone.to_ambiguous_timestamp(wall).is_ambiguous());
        // No earlier instant in the previous three hours shows the wall time or later.
        for back in 1..=180 {
            let earlier = resolved - jiff::SignedDuration::from_mins(back);
            prop_assert!(clock(earlier) < wall, "{} already shows {wall}", earlier);
        }
        prop_assert!(clock(resolved - jiff::SignedDuration::from_secs(1)) < wall);
    }

    #[test]
    fn contains_agrees_with_the_occurrences(w in arbitrary_window(), t in arbitrary_instant()) {
        let window = w.validate(0).unwrap();
        let local = window.zone.to_datetime(t).date();
        let inside = dates(days_before(local, 10), 20)
            .filter_map(|date| window.occurrence(date))
            .any(|occurrence| occurrence.contains(t));
        prop_assert_eq!(window.contains(t), inside);
    }

    /// The occurrence an instant belongs to exists exactly when the window is open, contains
    /// the instant, and stays the same while time moves on inside it: an offset counted from
    /// its start does not move. The same holds for the choice among several windows.
    #[test]
    fn the_occurrence_of_an_instant_stays_put(
        w in arbitrary_any_window(),
        other in arbitrary_any_window(),
        t in arbitrary_instant(),
        fraction in 0.0f64..1.0,
    ) {
        let later_inside = |end: Timestamp| {
            let room = end.duration_since(t).as_secs_f64();
            let later = t + jiff::SignedDuration::from_secs_f64(room * fraction);
            later.min(end - jiff::SignedDuration::from_nanos(1)).max(t)
        };
        let window = w.validate(0).unwrap();
        let occurrence = window.occurrence_containing(t);
        prop_assert_eq!(occurrence.is_some(), window.contains(t));
        if let Some(occurrence) = occurrence {
            prop_assert!(occurrence.contains(t));
            let later = later_inside(occurrence.end);
            prop_assert_eq!(window.occurrence_containing(later), Some(occurrence));
        }
        let list = validate_windows(&[w, other]).unwrap();
        let first = opened_first(&list, t);
        prop_assert_eq!(first.is_some(), first_containing(&list, t).is_some());
        if let Some(first) = first {
            let later = later_inside(first.end);
            prop_assert_eq!(opened_first(&list, later), Some(first));
        }
    }
}
