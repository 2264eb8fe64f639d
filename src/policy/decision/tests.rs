//! Decision tests. Unless a test says otherwise, certificates expire at [`EXPIRY`]
//! (Sunday 2026-12-20 00:00Z), so with the defaults renewal is due at 2026-11-20 00:00Z (a
//! Friday, 30 days before) and the fail-safe margin opens at 2026-12-19 00:00Z (24 hours before).

use super::*;
use crate::policy::backoff::FAIL_SAFE_RETRY;
use crate::policy::testing::{arbitrary_instant, arbitrary_window, utc, window};
use crate::policy::window::DayOfWeek::*;
use jiff::SignedDuration;
use proptest::prelude::*;

const EXPIRY: &str = "2026-12-20T00:00:00Z";
const DUE: &str = "2026-11-20T00:00:00Z";
const FAIL_SAFE: &str = "2026-12-19T00:00:00Z";

fn automatic() -> Input {
    Input::new(Mode::Automatic, Some(utc(EXPIRY)))
}

fn scheduled(windows: Vec<Window>) -> Input {
    Input {
        windows,
        ..Input::new(Mode::Scheduled, Some(utc(EXPIRY)))
    }
}

/// Tuesdays 02:00-04:00 in London (GMT in November and December).
fn tuesday_london() -> Window {
    window(&[Tuesday], "02:00", "04:00", Some("Europe/London"))
}

fn failed(count: Option<i64>, last: &str) -> Failures {
    Failures {
        count,
        last_failure: Some(utc(last)),
    }
}

fn deferral(decision: &Decision) -> &Deferral {
    match decision {
        Decision::Defer(deferral) => deferral,
        other => panic!("expected a deferral, got {other:?}"),
    }
}

fn renewal(decision: &Decision) -> &Renewal {
    match decision {
        Decision::RenewNow(renewal) => renewal,
        other => panic!("expected a renewal, got {other:?}"),
    }
}

/// What a decision boils down to, for tables: `renew` with its reason, or `defer` with the
/// reason and the instant.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Renew(RenewReason),
    Defer(DeferReason, Timestamp),
}

fn outcome(input: &Input, now: &str) -> Outcome {
    match decide(input, utc(now)) {
        Decision::RenewNow(renewal) => Outcome::Renew(renewal.reason),
        Decision::Defer(deferral) => Outcome::Defer(deferral.reason, deferral.until),
        other => panic!("at {now}: expected a renewal or a deferral, got {other:?}"),
    }
}

fn renew(reason: RenewReason) -> Outcome {
    Outcome::Renew(reason)
}

fn defer(reason: DeferReason, until: &str) -> Outcome {
    Outcome::Defer(reason, utc(until))
}

use DeferReason::{Backoff as InBackoff, NotDue, OutsideWindow};
use RenewReason::{Due, FailSafeBypass};

#[test]
fn automatic_renews_when_due() {
    let rows = [
        ("2026-11-01T00:00:00Z", defer(NotDue, DUE)),
        ("2026-11-19T23:59:59Z", defer(NotDue, DUE)),
        (DUE, renew(Due)),
        ("2026-11-20T00:00:01Z", renew(Due)),
        (FAIL_SAFE, renew(Due)),
        // Expired: still renew.
        ("2027-01-01T00:00:00Z", renew(Due)),
    ];
    for (now, expected) in rows {
        assert_eq!(outcome(&automatic(), now), expected, "at {now}");
    }
    let decision = decide(&automatic(), utc("2026-11-01T00:00:00Z"));
    assert_eq!(deferral(&decision).resume, Resume::Due);
    assert_eq!(requeue_at(&decision), Some(utc(DUE)));
    assert!(!decision.windows_ignored());
    assert_eq!(requeue_at(&decide(&automatic(), utc(DUE))), None);
}

#[test]
fn automatic_ignores_windows_and_says_so() {
    let input = Input {
        windows: vec![tuesday_london()],
        ..automatic()
    };
    // Friday 2026-11-20, no window open: renews anyway.
    let decision = decide(&input, utc("2026-11-20T12:00:00Z"));
    assert_eq!(renewal(&decision).reason, Due);
    assert_eq!(renewal(&decision).window, None);
    assert!(decision.windows_ignored());
    assert!(decide(&input, utc("2026-11-01T00:00:00Z")).windows_ignored());
    let unknown = Input {
        expiry: None,
        ..input.clone()
    };
    assert_eq!(
        decide(&unknown, utc(DUE)),
        Decision::NoExpiry {
            windows_ignored: true
        }
    );
    // Windows set under Automatic are still validated.
    let invalid = Input {
        windows: vec![window(&[], "01:00", "01:00", None)],
        ..automatic()
    };
    assert!(matches!(
        decide(&invalid, utc(DUE)),
        Decision::Invalid { .. }
    ));
    assert!(!decide(&scheduled(vec![tuesday_london()]), utc(DUE)).windows_ignored());
}

#[test]
fn scheduled_waits_for_a_window() {
    let input = scheduled(vec![tuesday_london()]);
    let rows = [
        // Not due; the due time (a Friday) is outside the window: the first window after it.
        (
            "2026-11-01T00:00:00Z",
            defer(NotDue, "2026-11-24T02:00:00Z"),
        ),
        // Due, outside the window.
        (
            "2026-11-20T12:00:00Z",
            defer(OutsideWindow, "2026-11-24T02:00:00Z"),
        ),
        (
            "2026-11-24T01:59:59Z",
            defer(OutsideWindow, "2026-11-24T02:00:00Z"),
        ),
        ("2026-11-24T02:00:00Z", renew(Due)),
        ("2026-11-24T03:59:59Z", renew(Due)),
        (
            "2026-11-24T04:00:00Z",
            defer(OutsideWindow, "2026-12-01T02:00:00Z"),
        ),
        // The last Tuesday before expiry closes on 12-15; the next one is after the fail-safe
        // point: wait for the fail-safe point instead.
        ("2026-12-15T04:00:00Z", defer(OutsideWindow, FAIL_SAFE)),
        (FAIL_SAFE, renew(FailSafeBypass)),
    ];
    for (now, expected) in rows {
        assert_eq!(outcome(&input, now), expected, "at {now}");
    }
    let decision = decide(&input, utc("2026-11-24T03:00:00Z"));
    assert_eq!(renewal(&decision).window, Some(0));
}

#[test]
fn a_due_time_inside_a_window_is_kept() {
    // Fridays 00:00-06:00 UTC: the due time 2026-11-20 00:00Z opens with the window.
    let input = scheduled(vec![window(&[Friday], "00:00", "06:00", None)]);
    let decision = decide(&input, utc("2026-11-10T00:00:00Z"));
    assert_eq!(
        (deferral(&decision).until, &deferral(&decision).resume),
        (utc(DUE), &Resume::Due)
    );
    assert_eq!(requeue_at(&decision), Some(utc(DUE)));
    assert_eq!(outcome(&input, DUE), renew(Due));
}

#[test]
fn the_fail_safe_boundary_is_inclusive() {
    // The last window before expiry closes on Tuesday 12-15 04:00Z.
    let input = scheduled(vec![window(&[Tuesday], "02:00", "04:00", None)]);
    let strict = Input {
        strict: true,
        ..input.clone()
    };
    let next_window = "2026-12-22T02:00:00Z";
    let rows = [
        (
            &input,
            "2026-12-18T23:59:59Z",
            defer(OutsideWindow, FAIL_SAFE),
        ),
        (&input, FAIL_SAFE, renew(FailSafeBypass)),
        (&input, "2026-12-19T00:00:01Z", renew(FailSafeBypass)),
        (
            &strict,
            "2026-12-18T23:59:59Z",
            defer(OutsideWindow, next_window),
        ),
        (&strict, FAIL_SAFE, defer(OutsideWindow, next_window)),
        (
            &strict,
            "2026-12-19T00:00:01Z",
            defer(OutsideWindow, next_window),
        ),
    ];
    for (input, now, expected) in rows {
        assert_eq!(
            outcome(input, now),
            expected,
            "strict {}, at {now}",
            input.strict
        );
    }

    let before = decide(&input, utc("2026-12-18T23:59:59Z"));
    assert_eq!(deferral(&before).resume, Resume::FailSafeBypass);
    assert!(!before.is_warning());
    assert_eq!(requeue_at(&before), Some(utc(FAIL_SAFE)));
    let bypass = decide(&input, utc(FAIL_SAFE));
    assert_eq!(renewal(&bypass).window, None);

    // Strict: no bypass; the margin opening is still a change (a Warning starts).
    let strict_before = decide(&strict, utc("2026-12-18T23:59:59Z"));
    assert!(!strict_before.is_warning());
    assert_eq!(requeue_at(&strict_before), Some(utc(FAIL_SAFE)));
    let strict_at = decide(&strict, utc(FAIL_SAFE));
    assert!(strict_at.is_warning());
    assert!(deferral(&strict_at).inside_fail_safe);
    assert_eq!(requeue_at(&strict_at), Some(utc(next_window)));
}

#[test]
fn a_window_opening_exactly_at_the_fail_safe_point_is_used() {
    // Saturday 2026-12-19 00:00Z is both the fail-safe point and a window start.
    let input = scheduled(vec![window(&[Saturday], "00:00", "01:00", None)]);
    let decision = decide(&input, utc("2026-12-15T00:00:00Z"));
    assert!(matches!(deferral(&decision).resume, Resume::WindowOpens(_)));
    assert_eq!(deferral(&decision).until, utc(FAIL_SAFE));
    assert_eq!(outcome(&input, FAIL_SAFE), renew(Due));
}

#[test]
fn a_zero_margin_bypasses_only_at_expiry() {
    let input = Input {
        fail_safe_margin: Some("0s".parse().unwrap()),
        ..scheduled(vec![window(&[Tuesday], "02:00", "04:00", None)])
    };
    let rows = [
        ("2026-12-15T04:00:00Z", defer(OutsideWindow, EXPIRY)),
        ("2026-12-19T23:59:59Z", defer(OutsideWindow, EXPIRY)),
        (EXPIRY, renew(FailSafeBypass)),
    ];
    for (now, expected) in rows {
        assert_eq!(outcome(&input, now), expected, "at {now}");
    }
}

#[test]
fn a_short_renew_before_keeps_not_due_inside_the_margin() {
    // renewBefore 12h < margin 24h: due at 2026-12-19 12:00Z, inside the margin already.
    let input = Input {
        renew_before: Some("12h".parse().unwrap()),
        ..scheduled(vec![tuesday_london()])
    };
    let rows = [
        (
            "2026-12-18T00:00:00Z",
            defer(NotDue, "2026-12-19T12:00:00Z"),
        ),
        (
            "2026-12-19T06:00:00Z",
            defer(NotDue, "2026-12-19T12:00:00Z"),
        ),
        ("2026-12-19T12:00:00Z", renew(FailSafeBypass)),
    ];
    for (now, expected) in rows {
        assert_eq!(outcome(&input, now), expected, "at {now}");
    }
    let decision = decide(&input, utc("2026-12-18T00:00:00Z"));
    assert_eq!(deferral(&decision).resume, Resume::FailSafeBypass);
    // The margin opens before the due time: the decision changes then (inside_fail_safe).
    assert_eq!(requeue_at(&decision), Some(utc(FAIL_SAFE)));
}

#[test]
fn disabled_never_renews_and_warns_inside_the_margin() {
    let input = Input {
        windows: vec![tuesday_london()],
        ..Input::new(Mode::Disabled, Some(utc(EXPIRY)))
    };
    let rows = [
        ("2026-11-24T03:00:00Z", false),
        ("2026-12-18T23:59:59Z", false),
        (FAIL_SAFE, true),
        ("2027-01-01T00:00:00Z", true),
    ];
    for (now, inside_fail_safe) in rows {
        let decision = decide(&input, utc(now));
        assert_eq!(
            decision,
            Decision::Disabled {
                expires_at: Some(utc(EXPIRY)),
                fail_safe_at: Some(utc(FAIL_SAFE)),
                inside_fail_safe
            },
            "at {now}"
        );
        assert_eq!(decision.is_warning(), inside_fail_safe);
        let requeue = (!inside_fail_safe).then(|| utc(FAIL_SAFE));
        assert_eq!(requeue_at(&decision), requeue, "at {now}");
        assert!(!decision.windows_ignored());
    }
    let unknown = Input {
        expiry: None,
        ..input.clone()
    };
    let decision = decide(&unknown, utc(DUE));
    assert_eq!(
        decision,
        Decision::Disabled {
            expires_at: None,
            fail_safe_at: None,
            inside_fail_safe: false
        }
    );
    assert_eq!(requeue_at(&decision), None);
    // Backoff is irrelevant when disabled.
    let failing = Input {
        failures: failed(Some(3), FAIL_SAFE),
        ..input
    };
    assert!(matches!(
        decide(&failing, utc(FAIL_SAFE)),
        Decision::Disabled { .. }
    ));
}

#[test]
fn an_unknown_expiry_means_nothing_to_do() {
    for mode in [Mode::Automatic, Mode::Scheduled] {
        let input = Input {
            expiry: None,
            windows: vec![tuesday_london()],
            failures: failed(Some(2), DUE),
            ..Input::new(mode, None)
        };
        let decision = decide(&input, utc(DUE));
        assert!(
            matches!(decision, Decision::NoExpiry { .. }),
            "{mode:?}: {decision:?}"
        );
        assert_eq!(requeue_at(&decision), None);
        assert!(!decision.is_warning());
    }
}

#[test]
fn an_invalid_policy_is_invalid_whatever_its_mode() {
    let bad = vec![
        tuesday_london(),
        window(&[], "24:00", "02:00", Some("europe/london")),
        window(&[], "03:00", "03:00", Some("Etc/Unknown")),
    ];
    for mode in [Mode::Automatic, Mode::Disabled, Mode::Scheduled] {
        for expiry in [None, Some(utc(EXPIRY))] {
            let input = Input {
                windows: bad.clone(),
                ..Input::new(mode, expiry)
            };
            let decision = decide(&input, utc(DUE));
            let Decision::Invalid { errors } = &decision else {
                panic!("{mode:?}: expected Invalid, got {decision:?}");
            };
            let paths: Vec<String> = errors
                .iter()
                .map(|error| match error {
                    PolicyError::Window(error) => error.path.clone(),
                    other => panic!("{other:?}"),
                })
                .collect();
            assert_eq!(
                paths,
                [
                    "windows[1].start",
                    "windows[1].timezone",
                    "windows[2].end",
                    "windows[2].timezone"
                ]
            );
            assert!(decision.is_warning());
            assert_eq!(requeue_at(&decision), None);
        }
    }
}

#[test]
fn policy_level_checks() {
    let no_windows = Input::new(Mode::Scheduled, Some(utc(EXPIRY)));
    assert_eq!(
        decide(&no_windows, utc(DUE)),
        Decision::Invalid {
            errors: vec![PolicyError::NoWindows]
        }
    );
    let ttl = |text: &str| Some(text.parse::<Ttl>().unwrap());
    let rows = [
        (ttl("30d"), Some("30d"), false),
        (ttl("29d"), None, false),
        (ttl("31d"), None, true),
        (ttl("1d"), Some("23h59m59s"), true),
        (None, Some("1y"), true),
    ];
    for (ttl, renew_before, valid) in rows {
        let input = Input {
            ttl,
            renew_before: renew_before.map(|text| text.parse().unwrap()),
            ..automatic()
        };
        assert_eq!(
            input.validate().is_ok(),
            valid,
            "ttl {ttl:?}, renewBefore {renew_before:?}"
        );
    }
    let input = Input {
        ttl: ttl("7d"),
        ..automatic()
    };
    assert_eq!(
        decide(&input, utc(DUE)).to_string(),
        "Renewal policy is invalid: renewBefore: 1mo must be shorter than ttl (1w), or every renewal would be due again at once"
    );
}

#[test]
fn backoff_after_failures() {
    let now = "2026-11-25T00:00:00Z";
    let last = "2026-11-24T23:30:00Z";
    let rows: &[(Failures, Outcome)] = &[
        (Failures::default(), renew(Due)),
        // A count without a failure time: no backoff.
        (
            Failures {
                count: Some(3),
                last_failure: None,
            },
            renew(Due),
        ),
        (failed(None, last), defer(InBackoff, "2026-11-25T00:30:00Z")),
        (
            failed(Some(0), last),
            defer(InBackoff, "2026-11-25T00:30:00Z"),
        ),
        (
            failed(Some(1), last),
            defer(InBackoff, "2026-11-25T00:30:00Z"),
        ),
        (
            failed(Some(6), last),
            defer(InBackoff, "2026-11-26T07:30:00Z"),
        ),
        (
            failed(Some(7), last),
            defer(InBackoff, "2026-11-26T07:30:00Z"),
        ),
        (
            failed(Some(1000), last),
            defer(InBackoff, "2026-11-26T07:30:00Z"),
        ),
        (
            failed(Some(i64::MAX), last),
            defer(InBackoff, "2026-11-26T07:30:00Z"),
        ),
        // Over: renew.
        (failed(Some(1), "2026-11-24T23:00:00Z"), renew(Due)),
        // A failure time in the future is taken at face value.
        (
            failed(Some(1), "2026-11-30T00:00:00Z"),
            defer(InBackoff, "2026-11-30T01:00:00Z"),
        ),
    ];
    for (failures, expected) in rows {
        let input = Input {
            failures: *failures,
            ..automatic()
        };
        assert_eq!(&outcome(&input, now), expected, "{failures:?}");
    }
    let input = Input {
        failures: failed(Some(1), last),
        ..automatic()
    };
    let decision = decide(&input, utc(now));
    assert_eq!(deferral(&decision).resume, Resume::BackoffEnds);
    assert_eq!(requeue_at(&decision), Some(utc("2026-11-25T00:30:00Z")));
}

#[test]
fn not_due_is_the_first_cause_even_with_a_longer_backoff() {
    let input = Input {
        failures: failed(Some(7), "2026-11-19T12:00:00Z"),
        ..automatic()
    };
    let decision = decide(&input, utc("2026-11-19T13:00:00Z"));
    let waiting = deferral(&decision);
    assert_eq!(
        (waiting.reason, &waiting.resume, waiting.until),
        (NotDue, &Resume::BackoffEnds, utc("2026-11-20T20:00:00Z"))
    );
}

#[test]
fn a_backoff_ending_outside_a_window_waits_for_the_next_window() {
    let input = Input {
        failures: failed(Some(2), "2026-11-24T03:00:00Z"),
        ..scheduled(vec![tuesday_london()])
    };
    // The attempt inside Tuesday's window failed at 03:00; backoff ends at 05:00, after the
    // window: the next one opens a week later.
    let decision = decide(&input, utc("2026-11-24T03:00:00Z"));
    let waiting = deferral(&decision);
    assert_eq!(
        (waiting.reason, waiting.until),
        (InBackoff, utc("2026-12-01T02:00:00Z"))
    );
    assert!(matches!(waiting.resume, Resume::WindowOpens(_)));
    // Once the backoff is over the reason becomes the window.
    assert_eq!(
        outcome(&input, "2026-11-24T05:00:00Z"),
        defer(OutsideWindow, "2026-12-01T02:00:00Z")
    );
    // A backoff ending inside the window: renew at its end.
    let input = Input {
        failures: failed(Some(1), "2026-11-24T02:10:00Z"),
        ..scheduled(vec![tuesday_london()])
    };
    let decision = decide(&input, utc("2026-11-24T02:10:00Z"));
    assert_eq!(deferral(&decision).until, utc("2026-11-24T03:10:00Z"));
    assert_eq!(deferral(&decision).resume, Resume::BackoffEnds);
    assert_eq!(outcome(&input, "2026-11-24T03:10:00Z"), renew(Due));
}

#[test]
fn inside_the_margin_a_failing_machine_is_retried_hourly() {
    let input = Input {
        failures: failed(Some(7), "2026-12-19T01:00:00Z"),
        ..scheduled(vec![tuesday_london()])
    };
    assert_eq!(
        outcome(&input, "2026-12-19T01:00:00Z"),
        defer(InBackoff, "2026-12-19T02:00:00Z")
    );
    assert_eq!(
        outcome(&input, "2026-12-19T02:00:00Z"),
        renew(FailSafeBypass)
    );
    // A long backoff that started before the margin is cut short when the margin opens.
    let input = Input {
        failures: failed(Some(7), "2026-12-18T12:00:00Z"),
        ..scheduled(vec![tuesday_london()])
    };
    assert_eq!(
        outcome(&input, "2026-12-18T13:00:00Z"),
        defer(InBackoff, FAIL_SAFE)
    );
    assert_eq!(FAIL_SAFE_RETRY, SignedDuration::from_hours(1));
    // Strict: hourly retries, but only inside windows.
    let strict = Input {
        strict: true,
        ..input
    };
    assert_eq!(
        outcome(&strict, "2026-12-18T13:00:00Z"),
        defer(InBackoff, "2026-12-22T02:00:00Z")
    );
}

#[test]
fn several_windows_report_the_first_open_one() {
    let input = scheduled(vec![
        window(
            &[Monday, Tuesday, Wednesday, Thursday, Friday],
            "01:00",
            "05:00",
            None,
        ),
        window(&[], "00:00", "03:00", None),
    ]);
    assert_eq!(
        renewal(&decide(&input, utc("2026-11-24T02:00:00Z"))).window,
        Some(0)
    );
    assert_eq!(
        renewal(&decide(&input, utc("2026-11-28T02:00:00Z"))).window,
        Some(1)
    );
    let decision = decide(&input, utc("2026-11-28T04:00:00Z"));
    let Resume::WindowOpens(start) = &deferral(&decision).resume else {
        panic!("{decision:?}")
    };
    assert_eq!(
        (start.index, start.timestamp()),
        (1, utc("2026-11-29T00:00:00Z"))
    );
}

#[test]
fn messages_name_the_cause_and_the_next_time() {
    let tuesday = scheduled(vec![tuesday_london()]);
    let strict = Input {
        strict: true,
        ..scheduled(vec![window(&[Tuesday], "02:00", "04:00", None)])
    };
    let failing = Input {
        failures: failed(Some(3), "2026-11-24T23:30:00Z"),
        ..automatic()
    };
    let rows: &[(&Input, &str, &str)] = &[
        (
            &tuesday,
            "2026-11-20T12:00:00Z",
            "Renewal deferred until the next maintenance window opens at 2026-11-24 02:00 Europe/London (2026-11-24T02:00:00Z)",
        ),
        (
            &tuesday,
            "2026-11-01T00:00:00Z",
            "Renewal is not due until 2026-11-20T00:00:00Z (certificates expire at 2026-12-20T00:00:00Z); it will start when the next maintenance window opens at 2026-11-24 02:00 Europe/London (2026-11-24T02:00:00Z)",
        ),
        (
            &tuesday,
            "2026-11-24T03:00:00Z",
            "Renewing certificates: due since 2026-11-20T00:00:00Z, expiring at 2026-12-20T00:00:00Z, inside maintenance window windows[0]",
        ),
        (
            &tuesday,
            "2026-12-15T04:00:00Z",
            "Renewal deferred until 2026-12-19T00:00:00Z, when expiry is within the fail-safe margin and the maintenance windows are bypassed",
        ),
        (
            &tuesday,
            FAIL_SAFE,
            "Renewing certificates outside the maintenance windows: they expire at 2026-12-20T00:00:00Z, within the fail-safe margin since 2026-12-19T00:00:00Z",
        ),
        (
            &strict,
            FAIL_SAFE,
            "Renewal deferred until the next maintenance window opens at 2026-12-22 02:00 UTC (2026-12-22T02:00:00Z); certificates expire at 2026-12-20T00:00:00Z, within the fail-safe margin, but strict windows forbid a bypass",
        ),
        (
            &automatic(),
            "2026-11-01T00:00:00Z",
            "Renewal is not due until 2026-11-20T00:00:00Z (certificates expire at 2026-12-20T00:00:00Z)",
        ),
        (
            &automatic(),
            DUE,
            "Renewing certificates: due since 2026-11-20T00:00:00Z, expiring at 2026-12-20T00:00:00Z",
        ),
        (
            &failing,
            "2026-11-25T00:00:00Z",
            "Renewal backed off after 3 failed attempts until 2026-11-25T03:30:00Z",
        ),
    ];
    for (input, now, message) in rows {
        assert_eq!(decide(input, utc(now)).to_string(), *message, "at {now}");
    }
    let retrying = Input {
        failures: failed(Some(2), "2026-11-24T03:00:00Z"),
        ..scheduled(vec![tuesday_london()])
    };
    let not_due_failing = Input {
        failures: failed(Some(7), "2026-11-19T12:00:00Z"),
        ..automatic()
    };
    let short = Input {
        renew_before: Some("12h".parse().unwrap()),
        ..scheduled(vec![tuesday_london()])
    };
    let failing_late = Input {
        failures: failed(Some(7), "2026-12-19T01:00:00Z"),
        ..scheduled(vec![tuesday_london()])
    };
    let more: &[(&Input, &str, &str)] = &[
        (
            &retrying,
            "2026-11-24T03:00:00Z",
            "Renewal backed off after 2 failed attempts; retrying when the next maintenance window opens at 2026-12-01 02:00 Europe/London (2026-12-01T02:00:00Z)",
        ),
        (
            &not_due_failing,
            "2026-11-19T13:00:00Z",
            "Renewal is not due until 2026-11-20T00:00:00Z (certificates expire at 2026-12-20T00:00:00Z); after 7 failed attempts, it will start when the backoff ends at 2026-11-20T20:00:00Z",
        ),
        (
            &short,
            "2026-12-19T06:00:00Z",
            "Renewal is not due until 2026-12-19T12:00:00Z (certificates expire at 2026-12-20T00:00:00Z); it will start then outside the maintenance windows, as expiry is within the fail-safe margin",
        ),
        (
            &failing_late,
            "2026-12-19T01:00:00Z",
            "Renewal backed off after 7 failed attempts until 2026-12-19T02:00:00Z, then retrying outside the maintenance windows as certificates expire at 2026-12-20T00:00:00Z, within the fail-safe margin",
        ),
    ];
    for (input, now, message) in more {
        assert_eq!(decide(input, utc(now)).to_string(), *message, "at {now}");
    }
    let disabled = Input::new(Mode::Disabled, Some(utc(EXPIRY)));
    assert_eq!(
        decide(&disabled, utc(DUE)).to_string(),
        "Automatic renewal is disabled by the policy; certificates expire at 2026-12-20T00:00:00Z"
    );
    assert_eq!(
        decide(&disabled, utc(FAIL_SAFE)).to_string(),
        "Automatic renewal is disabled by the policy; certificates expire at 2026-12-20T00:00:00Z, within the fail-safe margin: renew them manually with the v1beta2.k8sd.io/refresh-certificates annotation"
    );
    let invalid = scheduled(vec![window(&[], "09:00", "09:00", Some(""))]);
    assert_eq!(
        decide(&invalid, utc(DUE)).to_string(),
        "Renewal policy is invalid: windows[0].end: must differ from start (09:00): the window would be empty; a whole day is 00:00 to 24:00; windows[0].timezone: must not be empty: omit it for UTC, or give an IANA name such as Europe/London"
    );
    assert_eq!(
        decide(&Input::new(Mode::Automatic, None), utc(DUE)).to_string(),
        "Certificate expiry is not known yet, so no renewal is scheduled"
    );
    for message in rows.iter().map(|(_, _, message)| *message) {
        assert!(!message.ends_with('.'), "{message}");
    }
}

#[test]
fn extreme_instants_do_not_panic() {
    for expiry in [Timestamp::MIN, Timestamp::MAX] {
        for now in [Timestamp::MIN, Timestamp::MAX, utc(DUE)] {
            for strict in [false, true] {
                let input = Input {
                    strict,
                    failures: Failures {
                        count: Some(i64::MAX),
                        last_failure: Some(now),
                    },
                    renew_before: Some("10000y".parse().unwrap()),
                    fail_safe_margin: Some("10000y".parse().unwrap()),
                    ..scheduled(vec![tuesday_london()])
                };
                let input = Input {
                    expiry: Some(expiry),
                    ..input
                };
                let decision = decide(&input, now);
                let _ = requeue_at(&decision);
                let _ = decision.to_string();
            }
        }
    }
}

/// Whether a renewal may start at `t` under the rules, stated directly.
fn allowed(input: &Input, windows: &[ValidWindow], t: Timestamp) -> bool {
    let Some(expiry) = input.expiry else {
        return false;
    };
    let due_at = saturating_sub(expiry, input.renew_before().as_duration());
    let fail_safe_at = saturating_sub(expiry, input.fail_safe_margin().as_duration());
    let backoff_over = input
        .backoff
        .retry_at(&input.failures, Some(fail_safe_at))
        .is_none_or(|retry_at| t >= retry_at);
    let in_window = windows.iter().any(|window| window.contains(t));
    t >= due_at && backoff_over && (in_window || (!input.strict && t >= fail_safe_at))
}

fn arbitrary_input(now: Timestamp) -> impl Strategy<Value = Input> {
    let minutes = |range: std::ops::Range<i64>| range.prop_map(SignedDuration::from_mins);
    let failures = proptest::option::of((0i64..10, minutes(0..3 * 1440))).prop_map(move |f| {
        f.map_or_else(Failures::default, |(count, ago)| Failures {
            count: Some(count),
            last_failure: Some(now - ago),
        })
    });
    (
        proptest::collection::vec(arbitrary_window(), 1..=3),
        minutes(-1440..10 * 1440),
        1i64..10 * 86_400,
        0i64..3 * 86_400,
        any::<bool>(),
        failures,
    )
        .prop_map(
            move |(windows, expires_in, renew_before, margin, strict, failures)| Input {
                expiry: Some(now + expires_in),
                renew_before: Some(PolicyDuration::from_seconds(renew_before).unwrap()),
                fail_safe_margin: Some(FailSafeMargin::from_seconds(margin).unwrap()),
                strict,
                failures,
                ..scheduled(windows)
            },
        )
}

fn now_and_input() -> impl Strategy<Value = (Timestamp, Input)> {
    arbitrary_instant().prop_flat_map(|now| (Just(now), arbitrary_input(now)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// A deferral ends at the first instant a renewal is allowed: allowed at `until`, and not
    /// at any window start, the due time, the backoff end or the fail-safe point before it,
    /// nor at any instant of a 7-minute scan.
    #[test]
    fn deferrals_end_at_the_first_allowed_instant((now, input) in now_and_input()) {
        let windows = input.validate().unwrap();
        match decide(&input, now) {
            Decision::RenewNow(_) => prop_assert!(allowed(&input, &windows, now)),
            Decision::Defer(deferral) => {
                let until = deferral.until;
                prop_assert!(until > now);
                prop_assert!(deferral.resume != Resume::Never);
                prop_assert!(allowed(&input, &windows, until), "not allowed at {until}");
                if !input.strict && until > deferral.fail_safe_at {
                    // Only a late due time or an hourly retry may push past the fail-safe point.
                    let ready = input.backoff.retry_at(&input.failures, Some(deferral.fail_safe_at));
                    prop_assert!(until == deferral.due_at.max(ready.unwrap_or(deferral.due_at)).max(now));
                }
                let mut checkpoints = vec![now, deferral.due_at, deferral.fail_safe_at];
                checkpoints.extend(input.backoff.retry_at(&input.failures, Some(deferral.fail_safe_at)));
                for window in &windows {
                    let mut t = now;
                    while let Some(start) = window.next_start_after(t).filter(|&start| start < until) {
                        checkpoints.push(start);
                        t = start;
                    }
                }
                let step = SignedDuration::from_secs(7 * 60);
                let mut t = now;
                for _ in 0..2000 {
                    if t >= until { break; }
                    checkpoints.push(t);
                    t += step;
                }
                for t in checkpoints.into_iter().filter(|&t| now <= t && t < until) {
                    prop_assert!(!allowed(&input, &windows, t), "allowed at {t}, before {until}");
                }
            }
            other => prop_assert!(false, "unexpected {other:?}"),
        }
    }

    /// The reason is the first cause, and requeueing happens no later than `until`.
    #[test]
    fn reasons_and_requeues_are_consistent((now, input) in now_and_input()) {
        if let Decision::Defer(deferral) = decide(&input, now) {
            let backoff = input.backoff.retry_at(&input.failures, Some(deferral.fail_safe_at));
            let expected = if now < deferral.due_at {
                DeferReason::NotDue
            } else if backoff.is_some_and(|b| now < b) {
                DeferReason::Backoff
            } else {
                DeferReason::OutsideWindow
            };
            prop_assert_eq!(deferral.reason, expected);
            let requeue = requeue_at(&Decision::Defer(deferral.clone())).unwrap();
            prop_assert!(now < requeue && requeue <= deferral.until);
        }
    }
}
