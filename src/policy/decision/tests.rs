//! Decision tests. Unless a test says otherwise, certificates expire at [`EXPIRY`]
//! (Sunday 2026-12-20 00:00Z), so with the defaults renewal is due at 2026-11-20 00:00Z (a
//! Friday, 30 days before) and the fail-safe margin opens at 2026-12-19 00:00Z (24 hours before).

use super::*;
use crate::policy::backoff::{FAIL_SAFE_RETRY, Failures};
use crate::policy::duration::{FailSafeMargin, PolicyDuration, Spread, Ttl};
use crate::policy::testing::{arbitrary_instant, arbitrary_window, utc, window};
use crate::policy::window::DayOfWeek::*;
use crate::policy::window::Window;
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

// Staggering. Unless a test says otherwise the Machine is `machine-c`, whose place in any spread
// is 0.387: 5m48s of 15m, 23m12s of 1h (see `StaggerKey`; pinned by `stagger::tests`).

const UID: &str = "machine-c";

/// `input` with `spread`, for the Machine with UID `key`.
fn staggered(input: Input, spread: &str, key: &str) -> Input {
    Input {
        spread: Some(spread.parse().unwrap()),
        ..input
    }
    .with_stagger_key(Some(key))
}

/// The offset of `key` in a span of `seconds`.
fn offset(key: &str, seconds: i64) -> SignedDuration {
    SignedDuration::from_secs(StaggerKey::new(key).offset(seconds))
}

/// Checks that every decision from `from` (inclusive) to `until` (exclusive), second by second,
/// is a deferral with `reason` until exactly `until`, and the one at `until` a renewal.
fn staggered_until(input: &Input, from: Timestamp, until: Timestamp, reason: DeferReason) {
    let mut t = from;
    while t < until {
        let decision = decide(input, t);
        assert_eq!(
            (deferral(&decision).reason, deferral(&decision).until),
            (reason, until),
            "at {t}"
        );
        // Exactly then, or when the margin opens first (strict windows warn then).
        let margin = Some(deferral(&decision).fail_safe_at)
            .filter(|_| !deferral(&decision).inside_fail_safe);
        assert_eq!(
            requeue_at(&decision),
            Some(margin.map_or(until, |margin| margin.min(until))),
            "at {t}"
        );
        t += SignedDuration::from_secs(1);
    }
    assert_eq!(renewal(&decide(input, until)).reason, Due, "at {until}");
}

#[test]
fn the_machines_offset_is_its_own_and_spread_evenly() {
    assert_eq!(offset(UID, 900), SignedDuration::from_secs(348));
    assert_eq!(offset(UID, 3600), SignedDuration::from_secs(1392));
    // UIDs as Kubernetes writes them, and names one character apart: both spread evenly over
    // ten 90-second buckets (100 expected in each; 70 and 130 are three standard deviations).
    let uids = (0..1000u64).map(|i| {
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            i.wrapping_mul(0x9e37_79b9),
            i % 0xffff,
            i % 0xfff,
            (i * 7) % 0xfff,
            i.wrapping_mul(0x5851_f42d_4c95_7f2d) & 0xffff_ffff_ffff
        )
    });
    let names = (0..1000).map(|i| format!("machine-{i}"));
    for keys in [uids.collect::<Vec<_>>(), names.collect()] {
        let mut buckets = [0usize; 10];
        for key in &keys {
            let input = staggered(automatic(), "15m", key);
            let decision = decide(&input, utc(DUE));
            // Deterministic: the same answer every time, from the key alone.
            assert_eq!(decide(&input, utc(DUE)), decision);
            let start = match &decision {
                Decision::RenewNow(_) => utc(DUE),
                Decision::Defer(deferral) => {
                    assert_eq!(deferral.reason, DeferReason::Staggered, "{key}");
                    deferral.until
                }
                other => panic!("{key}: {other:?}"),
            };
            let offset = start.duration_since(utc(DUE));
            assert_eq!(offset, self::offset(key, 900), "{key}");
            assert!(
                SignedDuration::ZERO <= offset && offset < SignedDuration::from_mins(15),
                "{key}: {offset:?}"
            );
            assert_eq!(start.subsec_nanosecond(), 0, "whole seconds");
            buckets[usize::try_from(offset.as_secs() / 90).unwrap()] += 1;
        }
        assert!(
            buckets.iter().all(|&count| (70..=130).contains(&count)),
            "{buckets:?}"
        );
        let distinct: std::collections::BTreeSet<_> =
            keys.iter().map(|key| offset(key, 900)).collect();
        assert!(distinct.len() > 550, "{} distinct offsets", distinct.len());
    }
}

#[test]
fn the_slot_counts_from_the_window_opening_and_does_not_move_as_now_advances() {
    let input = staggered(scheduled(vec![tuesday_london()]), "1h", UID);
    let opening = utc("2026-11-24T02:00:00Z");
    let slot = utc("2026-11-24T02:23:12Z");
    // Not due yet, then due outside the window: both until the slot.
    assert_eq!(
        outcome(&input, "2026-11-01T00:00:00Z"),
        defer(NotDue, "2026-11-24T02:23:12Z")
    );
    let decision = decide(&input, utc("2026-11-20T12:00:00Z"));
    assert_eq!(deferral(&decision).reason, OutsideWindow);
    assert_eq!(deferral(&decision).until, slot);
    assert_eq!(requeue_at(&decision), Some(slot));
    let Resume::WindowOpens(start) = &deferral(&decision).resume else {
        panic!("{decision:?}")
    };
    assert_eq!(start.timestamp(), opening);
    let recorded = deferral(&decision).slot.clone().unwrap();
    assert_eq!(
        (
            recorded.at,
            recorded.anchor,
            recorded.offset,
            recorded.span,
            recorded.unstaggered
        ),
        (
            slot,
            opening,
            SignedDuration::from_secs(1392),
            SignedDuration::from_hours(1),
            opening
        )
    );
    let window = recorded.window.unwrap();
    assert_eq!(
        (window.index, window.start.timestamp(), window.end),
        (0, opening, utc("2026-11-24T04:00:00Z"))
    );
    assert_eq!(recorded.spread.to_string(), "1h");
    // From the opening, second by second: staggered until the slot, renewing exactly at it.
    staggered_until(&input, opening, slot, DeferReason::Staggered);
    assert_eq!(
        outcome(&input, "2026-11-24T02:23:11.999Z"),
        defer(DeferReason::Staggered, "2026-11-24T02:23:12Z")
    );
    assert_eq!(renewal(&decide(&input, slot)).window, Some(0));
    // The controller was down past the slot: renew at once.
    assert_eq!(outcome(&input, "2026-11-24T03:59:59Z"), renew(Due));
    // Other Machines have other slots in the same window.
    for key in ["machine-a", "machine-b", "uid-1"] {
        let other = staggered(scheduled(vec![tuesday_london()]), "1h", key);
        let slot = opening + offset(key, 3600);
        assert_eq!(
            outcome(&other, "2026-11-20T12:00:00Z"),
            Outcome::Defer(OutsideWindow, slot),
            "{key}"
        );
    }
}

#[test]
fn a_due_time_inside_the_window_is_the_anchor() {
    // Due at 02:30 on Tuesday, inside the window that opened at 02:00.
    let input = Input {
        expiry: Some(utc("2026-12-24T02:30:00Z")),
        ..staggered(scheduled(vec![tuesday_london()]), "1h", UID)
    };
    let due = utc("2026-11-24T02:30:00Z");
    // The window closes at 04:00: 90 minutes of room, the whole spread fits.
    assert_eq!(
        outcome(&input, "2026-11-24T02:00:00Z"),
        Outcome::Defer(NotDue, due + offset(UID, 3600))
    );
    staggered_until(&input, due, due + offset(UID, 3600), DeferReason::Staggered);
}

#[test]
fn a_short_window_scales_the_offset_down_to_stay_inside() {
    // Ten minutes on Tuesdays; a one-hour spread is scaled to the ten minutes.
    let short = || scheduled(vec![window(&[Tuesday], "02:00", "02:10", None)]);
    let opening = utc("2026-11-24T02:00:00Z");
    let close = utc("2026-11-24T02:10:00Z");
    let input = staggered(short(), "1h", UID);
    let slot = opening + offset(UID, 600);
    assert_eq!(slot, utc("2026-11-24T02:03:52Z"));
    assert_eq!(
        outcome(&input, "2026-11-20T12:00:00Z"),
        Outcome::Defer(OutsideWindow, slot)
    );
    let decision = decide(&input, opening);
    let recorded = deferral(&decision).slot.clone().unwrap();
    assert!(recorded.scaled());
    assert_eq!(recorded.span, SignedDuration::from_mins(10));
    staggered_until(&input, opening, slot, DeferReason::Staggered);
    // Every Machine's slot lies inside the window: scaled, not clipped to its last second.
    let mut last_second = 0;
    for i in 0..1000 {
        let key = format!("machine-{i}");
        let input = staggered(short(), "1h", &key);
        let start = match decide(&input, opening) {
            Decision::RenewNow(_) => opening,
            Decision::Defer(deferral) => deferral.until,
            other => panic!("{other:?}"),
        };
        assert!(opening <= start && start < close, "{key}: {start}");
        assert_eq!(start, opening + offset(&key, 600));
        last_second += usize::from(start == close - SignedDuration::from_secs(1));
    }
    assert!(
        last_second < 10,
        "{last_second} Machines in the last second"
    );
    // Due inside the window: only what is left of it after the due time.
    let late = Input {
        expiry: Some(utc("2026-12-24T02:05:00Z")),
        ..staggered(short(), "1h", UID)
    };
    let due = utc("2026-11-24T02:05:00Z");
    assert_eq!(
        outcome(&late, "2026-11-24T02:05:00Z"),
        Outcome::Defer(DeferReason::Staggered, due + offset(UID, 300))
    );
    // A spread shorter than the window is not scaled.
    let fits = staggered(short(), "5m", UID);
    assert_eq!(
        outcome(&fits, "2026-11-24T02:00:00Z"),
        Outcome::Defer(DeferReason::Staggered, opening + offset(UID, 300))
    );
}

#[test]
fn an_overnight_window_keeps_the_slot_across_midnight() {
    // Fridays and Saturdays 22:00-04:00 London (GMT in November): six hours, an 8h spread is
    // scaled to them.
    let overnight = window(&[Friday, Saturday], "22:00", "04:00", Some("Europe/London"));
    let input = staggered(scheduled(vec![overnight]), "8h", UID);
    let opening = utc("2026-11-20T22:00:00Z");
    let slot = opening + offset(UID, 6 * 3600);
    assert_eq!(slot, utc("2026-11-21T00:19:13Z"));
    assert_eq!(
        outcome(&input, "2026-11-20T12:00:00Z"),
        Outcome::Defer(OutsideWindow, slot)
    );
    // Still Friday's occurrence after midnight.
    assert_eq!(
        outcome(&input, "2026-11-21T00:00:00Z"),
        Outcome::Defer(DeferReason::Staggered, slot)
    );
    staggered_until(
        &input,
        utc("2026-11-21T00:19:00Z"),
        slot,
        DeferReason::Staggered,
    );
}

#[test]
fn schedule_windows_are_staggered_like_the_others() {
    // Weeknights from 22:00 New York time for 4 hours, OR'ed with Sundays 03:00-04:00 UTC.
    let windows = vec![
        crate::policy::testing::cron_window("0 22 * * 1-5", "4h", Some("America/New_York")),
        window(&[Sunday], "03:00", "04:00", None),
    ];
    let input = staggered(scheduled(windows), "1h", UID);
    // Friday 22:00 EST is Saturday 03:00Z.
    let opening = utc("2026-11-21T03:00:00Z");
    assert_eq!(
        outcome(&input, "2026-11-20T12:00:00Z"),
        Outcome::Defer(OutsideWindow, opening + offset(UID, 3600))
    );
    staggered_until(
        &input,
        opening,
        opening + offset(UID, 3600),
        DeferReason::Staggered,
    );
    // Sunday's one-hour window: its own opening.
    let sunday = utc("2026-11-22T03:00:00Z");
    assert_eq!(
        outcome(&input, "2026-11-21T12:00:00Z"),
        Outcome::Defer(OutsideWindow, sunday + offset(UID, 3600))
    );
}

#[test]
fn overlapping_schedule_occurrences_do_not_move_the_slot() {
    // Open all the time: every quarter of an hour for an hour. The Machine (place 0.976) was
    // due long ago and is first looked at 10:20: its slot counts from 09:30, the opening of
    // the occurrence that contains 10:20 and opened first, and stays there as later ones open.
    let windows = vec![crate::policy::testing::cron_window(
        "*/15 * * * *",
        "1h",
        None,
    )];
    let input = staggered(scheduled(windows), "1h", "machine-a");
    let slot = utc("2026-11-24T09:30:00Z") + offset("machine-a", 3600);
    assert_eq!(slot, utc("2026-11-24T10:28:32Z"));
    staggered_until(
        &input,
        utc("2026-11-24T10:20:00Z"),
        slot,
        DeferReason::Staggered,
    );
    // machine-c's slot in that occurrence (09:53:12) has passed: it renews at once.
    let early = staggered(
        scheduled(vec![crate::policy::testing::cron_window(
            "*/15 * * * *",
            "1h",
            None,
        )]),
        "1h",
        UID,
    );
    assert_eq!(outcome(&early, "2026-11-24T10:20:00Z"), renew(Due));
}

#[test]
fn daylight_saving_days_scale_to_the_time_that_elapses() {
    // Sundays 01:00-03:00 New York: on 2026-03-08 the clocks skip 02:00-03:00, so the window
    // lasts one hour (06:00Z-07:00Z) and a 2h spread is scaled to it.
    let spring = |key: &str| {
        let input = Input {
            expiry: Some(utc("2026-04-01T00:00:00Z")),
            ..scheduled(vec![window(
                &[Sunday],
                "01:00",
                "03:00",
                Some("America/New_York"),
            )])
        };
        staggered(input, "2h", key)
    };
    let opening = utc("2026-03-08T06:00:00Z");
    for key in [UID, "machine-a", "machine-b"] {
        let slot = opening + offset(key, 3600);
        assert!(slot < utc("2026-03-08T07:00:00Z"), "{key}: {slot}");
        assert_eq!(
            outcome(&spring(key), "2026-03-07T12:00:00Z"),
            Outcome::Defer(OutsideWindow, slot),
            "{key}"
        );
    }
    // On 2026-11-01 they repeat 01:00-02:00: three hours elapse (05:00Z-08:00Z), the whole 3h
    // spread fits, and a slot may fall in the repeated hour.
    let autumn = Input {
        expiry: Some(utc("2026-11-20T00:00:00Z")),
        ..staggered(
            scheduled(vec![window(
                &[Sunday],
                "01:00",
                "03:00",
                Some("America/New_York"),
            )]),
            "3h",
            UID,
        )
    };
    let opening = utc("2026-11-01T05:00:00Z");
    let slot = opening + offset(UID, 3 * 3600);
    assert_eq!(
        slot,
        utc("2026-11-01T06:09:36Z"),
        "01:09:36 EST, the second pass"
    );
    assert_eq!(
        outcome(&autumn, "2026-10-31T12:00:00Z"),
        Outcome::Defer(OutsideWindow, slot)
    );
    staggered_until(
        &autumn,
        utc("2026-11-01T06:00:00Z"),
        slot,
        DeferReason::Staggered,
    );
}

#[test]
fn automatic_counts_from_the_due_time() {
    let input = staggered(automatic(), "15m", UID);
    let slot = utc(DUE) + offset(UID, 900);
    assert_eq!(slot, utc("2026-11-20T00:05:48Z"));
    let decision = decide(&input, utc("2026-11-01T00:00:00Z"));
    assert_eq!(
        (deferral(&decision).reason, deferral(&decision).until),
        (NotDue, slot)
    );
    assert_eq!(deferral(&decision).resume, Resume::Due);
    assert_eq!(requeue_at(&decision), Some(slot));
    staggered_until(&input, utc(DUE), slot, DeferReason::Staggered);
    // Down past the slot: at once.
    assert_eq!(outcome(&input, "2026-11-21T00:00:00Z"), renew(Due));
    // Windows do not matter to Automatic.
    let with_windows = Input {
        windows: vec![tuesday_london()],
        ..input.clone()
    };
    assert_eq!(
        outcome(&with_windows, DUE),
        Outcome::Defer(DeferReason::Staggered, slot)
    );
    assert!(decide(&with_windows, utc(DUE)).windows_ignored());
}

#[test]
fn the_fail_safe_overrides_the_spread() {
    // Automatic, renewBefore 1d and a margin of 23h55m: the fail-safe point is five minutes
    // after the due time, before machine-c's slot (5m48s).
    let tight = |key: &str| {
        let input = Input {
            renew_before: Some("1d".parse().unwrap()),
            fail_safe_margin: Some("23h55m".parse().unwrap()),
            ..automatic()
        };
        staggered(input, "15m", key)
    };
    let due = utc("2026-12-19T00:00:00Z");
    let fail_safe = utc("2026-12-19T00:05:00Z");
    let input = tight(UID);
    assert_eq!(
        outcome(&input, "2026-12-18T00:00:00Z"),
        Outcome::Defer(NotDue, fail_safe)
    );
    let decision = decide(&input, due);
    assert_eq!(deferral(&decision).until, fail_safe);
    assert_eq!(
        deferral(&decision).slot.as_ref().unwrap().at,
        due + offset(UID, 900)
    );
    staggered_until(&input, due, fail_safe, DeferReason::Staggered);
    // machine-b's slot (1m51s) comes first: it keeps it.
    assert_eq!(
        outcome(&tight("machine-b"), "2026-12-19T00:00:00Z"),
        Outcome::Defer(DeferReason::Staggered, due + offset("machine-b", 900))
    );
    // renewBefore shorter than the margin: due inside the margin, no spread at all.
    let late = staggered(
        Input {
            renew_before: Some("12h".parse().unwrap()),
            ..automatic()
        },
        "15m",
        UID,
    );
    assert_eq!(
        outcome(&late, "2026-12-19T06:00:00Z"),
        defer(NotDue, "2026-12-19T12:00:00Z")
    );
    assert_eq!(outcome(&late, "2026-12-19T12:00:00Z"), renew(Due));

    // Scheduled: a window opening five minutes before the fail-safe point (2026-12-19 00:00Z).
    let late_friday = || window(&[Friday], "23:55", "01:00", None);
    let input = staggered(scheduled(vec![late_friday()]), "15m", UID);
    let opening = utc("2026-12-18T23:55:00Z");
    assert_eq!(
        outcome(&input, "2026-12-18T12:00:00Z"),
        Outcome::Defer(OutsideWindow, utc(FAIL_SAFE))
    );
    staggered_until(&input, opening, utc(FAIL_SAFE), DeferReason::Staggered);
    // At the fail-safe point it is inside the window: an ordinary renewal, not a bypass.
    assert_eq!(renewal(&decide(&input, utc(FAIL_SAFE))).window, Some(0));
    // Already inside the margin when the window opens: no spread.
    let inside = staggered(
        scheduled(vec![window(&[Saturday], "06:00", "07:00", None)]),
        "15m",
        UID,
    );
    assert_eq!(
        outcome(&inside, "2026-12-18T12:00:00Z"),
        defer(OutsideWindow, FAIL_SAFE)
    );
    assert_eq!(outcome(&inside, FAIL_SAFE), renew(FailSafeBypass));
}

#[test]
fn strict_windows_keep_the_spread_inside_the_window() {
    let late_friday = || window(&[Friday], "23:55", "01:00", None);
    let input = Input {
        strict: true,
        ..staggered(scheduled(vec![late_friday()]), "15m", UID)
    };
    let opening = utc("2026-12-18T23:55:00Z");
    let slot = opening + offset(UID, 900);
    assert_eq!(slot, utc("2026-12-19T00:00:48Z"));
    assert_eq!(
        outcome(&input, "2026-12-18T12:00:00Z"),
        Outcome::Defer(OutsideWindow, slot)
    );
    staggered_until(&input, opening, slot, DeferReason::Staggered);
    // Inside the margin and waiting for its slot: a Warning.
    let decision = decide(&input, utc(FAIL_SAFE));
    assert!(deferral(&decision).inside_fail_safe);
    assert!(decision.is_warning());
    assert_eq!(
        decision.to_string(),
        "Renewal staggered until 2026-12-19T00:00:48Z: this Machine's slot is 5m48s after maintenance window windows[0] opened at 2026-12-18 23:55 UTC (2026-12-18T23:55:00Z), within a 15m spread; certificates expire at 2026-12-20T00:00:00Z, within the fail-safe margin"
    );
    // A window shorter than the spread, inside the margin: still inside it.
    let short = Input {
        strict: true,
        ..staggered(
            scheduled(vec![window(&[Saturday], "06:00", "06:02", None)]),
            "15m",
            "machine-a",
        )
    };
    let opening = utc("2026-12-19T06:00:00Z");
    let slot = opening + offset("machine-a", 120);
    assert!(slot < utc("2026-12-19T06:02:00Z"));
    assert_eq!(
        outcome(&short, FAIL_SAFE),
        Outcome::Defer(OutsideWindow, slot)
    );
}

#[test]
fn a_backoff_ending_after_the_slot_wins() {
    let with_failure = |last: &str| Input {
        failures: failed(Some(1), last),
        ..staggered(scheduled(vec![tuesday_london()]), "1h", UID)
    };
    let slot = utc("2026-11-24T02:23:12Z");
    // Failed at 01:40: backoff until 02:40, after the slot: start at 02:40, no slot.
    let late = with_failure("2026-11-24T01:40:00Z");
    let decision = decide(&late, utc("2026-11-24T02:00:00Z"));
    assert_eq!(
        (deferral(&decision).reason, deferral(&decision).until),
        (InBackoff, utc("2026-11-24T02:40:00Z"))
    );
    assert_eq!(deferral(&decision).slot, None);
    assert_eq!(outcome(&late, "2026-11-24T02:40:00Z"), renew(Due));
    // Failed at 01:10: backoff until 02:10, before the slot: the slot.
    let early = with_failure("2026-11-24T01:10:00Z");
    let decision = decide(&early, utc("2026-11-24T02:00:00Z"));
    assert_eq!(
        (deferral(&decision).reason, deferral(&decision).until),
        (InBackoff, slot)
    );
    assert_eq!(
        deferral(&decision)
            .slot
            .as_ref()
            .map(|slot| slot.unstaggered),
        Some(utc("2026-11-24T02:10:00Z"))
    );
    staggered_until(
        &early,
        utc("2026-11-24T02:10:00Z"),
        slot,
        DeferReason::Staggered,
    );
}

#[test]
fn a_zero_spread_or_no_machine_is_todays_behaviour() {
    let inputs = [
        automatic(),
        scheduled(vec![tuesday_london()]),
        Input {
            strict: true,
            ..scheduled(vec![window(&[Friday], "23:55", "01:00", None)])
        },
        Input {
            failures: failed(Some(1), "2026-11-24T01:10:00Z"),
            ..scheduled(vec![tuesday_london()])
        },
    ];
    let instants = [
        "2026-11-01T00:00:00Z",
        DUE,
        "2026-11-20T12:00:00Z",
        "2026-11-24T02:00:00Z",
        "2026-11-24T02:10:00Z",
        "2026-12-18T23:56:00Z",
        FAIL_SAFE,
    ];
    for input in &inputs {
        for now in instants {
            let today = decide(input, utc(now));
            // A key with a zero spread.
            assert_eq!(
                decide(&staggered(input.clone(), "0s", UID), utc(now)),
                today
            );
            // The default spread without a key (a preview without a Machine).
            let unkeyed = Input {
                spread: None,
                ..input.clone()
            }
            .with_stagger_key(None);
            assert_eq!(decide(&unkeyed, utc(now)), today);
        }
    }
    assert_eq!(automatic().spread(), DEFAULT_SPREAD);
    assert_eq!(DEFAULT_SPREAD.to_string(), "15m");
}

#[test]
fn the_spread_is_at_most_a_week() {
    let week = Input {
        spread: Some("7d".parse().unwrap()),
        ..automatic()
    };
    assert!(week.validate().is_ok());
    let longer = Input {
        spread: Some("7d1s".parse().unwrap()),
        ..scheduled(vec![tuesday_london()])
    };
    assert_eq!(
        decide(&longer, utc(DUE)).to_string(),
        "Renewal policy is invalid: spread: 1w1s is too long: at most 7d (Machines that may renew at the same instant start within this span; 0 turns staggering off)"
    );
}

#[test]
fn staggered_messages_name_the_slot_the_spread_and_the_window() {
    let tuesday = staggered(scheduled(vec![tuesday_london()]), "1h", UID);
    let due_inside = Input {
        expiry: Some(utc("2026-12-24T02:30:00Z")),
        ..tuesday.clone()
    };
    let short = staggered(
        scheduled(vec![window(&[Tuesday], "02:00", "02:10", None)]),
        "1h",
        UID,
    );
    let tight = staggered(
        Input {
            renew_before: Some("1d".parse().unwrap()),
            fail_safe_margin: Some("23h55m".parse().unwrap()),
            ..automatic()
        },
        "15m",
        UID,
    );
    let backoff = Input {
        failures: failed(Some(1), "2026-11-24T01:10:00Z"),
        ..tuesday.clone()
    };
    let automatic = staggered(automatic(), "15m", UID);
    let rows: &[(&Input, &str, &str)] = &[
        (
            &tuesday,
            "2026-11-24T02:10:00Z",
            "Renewal staggered until 2026-11-24T02:23:12Z: this Machine's slot is 23m12s after maintenance window windows[0] opened at 2026-11-24 02:00 Europe/London (2026-11-24T02:00:00Z), within a 1h spread",
        ),
        (
            &tuesday,
            "2026-11-20T12:00:00Z",
            "Renewal deferred until the next maintenance window opens at 2026-11-24 02:00 Europe/London (2026-11-24T02:00:00Z); staggered, it will start at 2026-11-24T02:23:12Z: this Machine's slot is 23m12s after maintenance window windows[0] opened at 2026-11-24 02:00 Europe/London (2026-11-24T02:00:00Z), within a 1h spread",
        ),
        (
            &tuesday,
            "2026-11-01T00:00:00Z",
            "Renewal is not due until 2026-11-20T00:00:00Z (certificates expire at 2026-12-20T00:00:00Z); it will start when the next maintenance window opens at 2026-11-24 02:00 Europe/London (2026-11-24T02:00:00Z); staggered, it will start at 2026-11-24T02:23:12Z: this Machine's slot is 23m12s after maintenance window windows[0] opened at 2026-11-24 02:00 Europe/London (2026-11-24T02:00:00Z), within a 1h spread",
        ),
        (
            &due_inside,
            "2026-11-24T02:30:00Z",
            "Renewal staggered until 2026-11-24T02:53:12Z: this Machine's slot is 23m12s after the due time 2026-11-24T02:30:00Z, inside maintenance window windows[0] (open since 2026-11-24 02:00 Europe/London (2026-11-24T02:00:00Z)), within a 1h spread",
        ),
        (
            &short,
            "2026-11-24T02:00:00Z",
            "Renewal staggered until 2026-11-24T02:03:52Z: this Machine's slot is 3m52s after maintenance window windows[0] opened at 2026-11-24 02:00 UTC (2026-11-24T02:00:00Z), within a 1h spread scaled down to the 10m left before the window closes at 2026-11-24T02:10:00Z",
        ),
        (
            &tight,
            "2026-12-19T00:00:00Z",
            "Renewal staggered until 2026-12-19T00:05:00Z, when expiry comes within the fail-safe margin, which overrides the spread: this Machine's slot, at 2026-12-19T00:05:48Z, is 5m48s after the due time 2026-12-19T00:00:00Z, within a 15m spread",
        ),
        (
            &backoff,
            "2026-11-24T02:00:00Z",
            "Renewal backed off after a failed attempt until 2026-11-24T02:10:00Z; staggered, it will start at 2026-11-24T02:23:12Z: this Machine's slot is 23m12s after maintenance window windows[0] opened at 2026-11-24 02:00 Europe/London (2026-11-24T02:00:00Z), within a 1h spread",
        ),
        (
            &automatic,
            "2026-11-01T00:00:00Z",
            "Renewal is not due until 2026-11-20T00:00:00Z (certificates expire at 2026-12-20T00:00:00Z); staggered, it will start at 2026-11-20T00:05:48Z: this Machine's slot is 5m48s after the due time 2026-11-20T00:00:00Z, within a 15m spread",
        ),
        (
            &automatic,
            DUE,
            "Renewal staggered until 2026-11-20T00:05:48Z: this Machine's slot is 5m48s after the due time 2026-11-20T00:00:00Z, within a 15m spread",
        ),
    ];
    for (input, now, message) in rows {
        assert_eq!(decide(input, utc(now)).to_string(), *message, "at {now}");
        assert!(!message.ends_with('.'), "{message}");
    }
    assert_eq!(DeferReason::Staggered.as_str(), "Staggered");
    assert_eq!(
        crate::metrics::reason_label(DeferReason::Staggered.as_str()).reason,
        "staggered"
    );
}

#[test]
fn extreme_instants_do_not_panic_with_a_spread() {
    let windows = vec![
        tuesday_london(),
        crate::policy::testing::cron_window("*/15 * * * *", "1h", Some("Pacific/Apia")),
    ];
    for mode in [Mode::Automatic, Mode::Scheduled] {
        for expiry in [Timestamp::MIN, Timestamp::MAX, utc(EXPIRY)] {
            for now in [Timestamp::MIN, Timestamp::MAX, utc(DUE)] {
                for strict in [false, true] {
                    let input = Input {
                        mode,
                        strict,
                        expiry: Some(expiry),
                        windows: windows.clone(),
                        renew_before: Some("10000y".parse().unwrap()),
                        fail_safe_margin: Some("0s".parse().unwrap()),
                        ..staggered(automatic(), "7d", UID)
                    };
                    let decision = decide(&input, now);
                    let _ = requeue_at(&decision);
                    let _ = decision.to_string();
                }
            }
        }
    }
}

/// A policy of either mode with windows of either form, a spread of up to four hours (zero
/// included), and a Machine.
fn arbitrary_staggered_input(now: Timestamp) -> impl Strategy<Value = Input> {
    let minutes = |range: std::ops::Range<i64>| range.prop_map(SignedDuration::from_mins);
    let failures = proptest::option::of((0i64..10, minutes(0..3 * 1440))).prop_map(move |f| {
        f.map_or_else(Failures::default, |(count, ago)| Failures {
            count: Some(count),
            last_failure: Some(now - ago),
        })
    });
    (
        proptest::collection::vec(crate::policy::testing::arbitrary_any_window(), 1..=3),
        any::<bool>(),
        minutes(-1440..10 * 1440),
        1i64..10 * 86_400,
        0i64..3 * 86_400,
        any::<bool>(),
        failures,
        prop_oneof![Just(0i64), 1i64..=4 * 3600],
        any::<u32>(),
    )
        .prop_map(
            move |(
                windows,
                automatic,
                expires_in,
                renew_before,
                margin,
                strict,
                failures,
                spread,
                machine,
            )| {
                let mode = match automatic {
                    true => Mode::Automatic,
                    false => Mode::Scheduled,
                };
                Input {
                    expiry: Some(now + expires_in),
                    renew_before: Some(PolicyDuration::from_seconds(renew_before).unwrap()),
                    fail_safe_margin: Some(FailSafeMargin::from_seconds(margin).unwrap()),
                    strict,
                    failures,
                    windows,
                    spread: Some(Spread::from_seconds(spread).unwrap()),
                    ..Input::new(mode, None)
                }
                .with_stagger_key(Some(&format!("machine-{machine}")))
            },
        )
}

/// When the renewal starts if nothing changes: now, `until`, or never.
fn start_of(decision: &Decision, now: Timestamp) -> Option<Timestamp> {
    match decision {
        Decision::RenewNow(_) => Some(now),
        Decision::Defer(deferral) if deferral.resume != Resume::Never => Some(deferral.until),
        _ => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The staggered start is never before the un-staggered one, is inside a window under
    /// Scheduled (unless the fail-safe bypasses them), never after `max(F, T)` unless strict,
    /// and does not move as `now` advances towards it: deciding again at any instant before it
    /// defers until it, and at it renews.
    #[test]
    fn the_staggered_start_is_bounded_and_stable(
        (now, input) in arbitrary_instant().prop_flat_map(|now| (Just(now), arbitrary_staggered_input(now))),
        fraction in 0.0f64..1.0,
    ) {
        let windows = input.validate().unwrap();
        let plain_input = input.clone().with_stagger_key(None);
        let plain = decide(&plain_input, now);
        let decision = decide(&input, now);
        let (plain_start, start) = (start_of(&plain, now), start_of(&decision, now));
        prop_assert_eq!(plain_start.is_some(), start.is_some());
        let (Some(unstaggered), Some(start)) = (plain_start, start) else { return Ok(()) };
        prop_assert!(start >= unstaggered, "{start} before {unstaggered}");
        let fail_safe_at = match &decision {
            Decision::RenewNow(renewal) => renewal.fail_safe_at,
            Decision::Defer(deferral) => deferral.fail_safe_at,
            other => return Err(TestCaseError::fail(format!("{other:?}"))),
        };
        if !input.strict {
            prop_assert!(start <= fail_safe_at.max(unstaggered), "{start} after the fail-safe point");
        }
        let in_window = windows.iter().any(|window| window.contains(start));
        if input.mode == Mode::Scheduled {
            prop_assert!(in_window || (!input.strict && start >= fail_safe_at), "{start} outside the windows");
        }
        match &decision {
            Decision::Defer(deferral) => {
                prop_assert_eq!(deferral.slot.is_some(), start > unstaggered);
                if let Some(slot) = &deferral.slot {
                    prop_assert!(slot.offset < slot.spread.as_duration() && slot.offset >= SignedDuration::ZERO);
                    prop_assert!(slot.span <= slot.spread.as_duration());
                    prop_assert_eq!(slot.unstaggered, unstaggered);
                    if input.mode == Mode::Scheduled {
                        let window = slot.window.as_ref().unwrap();
                        prop_assert!(window.start.timestamp() <= slot.anchor && slot.at < window.end);
                        prop_assert!(in_window);
                    }
                }
                // The same until from any instant before it, and a renewal at it.
                let seconds = start.duration_since(now).as_secs_f64() * fraction;
                let later = (now + SignedDuration::from_secs_f64(seconds)).min(start - SignedDuration::from_nanos(1)).max(now);
                let again = decide(&input, later);
                prop_assert_eq!(start_of(&again, later), Some(start), "at {}: {:?}", later, again);
                if let Decision::Defer(again) = &again
                    && later >= unstaggered
                    && start > unstaggered
                {
                    // Only the spread holds it back by then.
                    prop_assert_eq!(again.reason, DeferReason::Staggered);
                }
                let at_start = decide(&input, start);
                prop_assert!(matches!(at_start, Decision::RenewNow(_)), "at {start}: {at_start:?}");
            }
            _ => prop_assert_eq!(start, unstaggered),
        }
    }

    /// A zero spread is exactly today's behaviour.
    #[test]
    fn a_zero_spread_changes_nothing(
        (now, input) in arbitrary_instant().prop_flat_map(|now| (Just(now), arbitrary_staggered_input(now))),
    ) {
        let zero = Input { spread: Some(Spread::ZERO), ..input.clone() };
        prop_assert_eq!(decide(&zero, now), decide(&input.with_stagger_key(None), now));
    }
}
