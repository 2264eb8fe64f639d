use super::*;

const NOW: i64 = 1_800_000_000;

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).unwrap()
}

fn failure(machine: &str, seconds_ago: i64) -> Failure {
    Failure {
        machine: format!("ns/{machine}"),
        cluster: Some("c".into()),
        at: at(NOW - seconds_ago),
        message: format!("{machine} failed"),
    }
}

fn limit(failures: usize, minutes: i64) -> Limit {
    Limit {
        failures,
        period: SignedDuration::from_mins(minutes),
    }
}

/// Policy: 3 in 30 minutes; fleet: 5 in 30 minutes.
const LIMITS: fn() -> (Limit, Limit) = || (limit(3, 30), limit(5, 30));

fn open_since(seconds_ago: i64) -> BreakerStatus {
    BreakerStatus {
        opened_at: Some(Time(at(NOW - seconds_ago))),
        scope: Some("Policy".into()),
        failures: vec![],
        ..BreakerStatus::default()
    }
}

#[test]
fn the_policys_breaker_opens_at_its_limit_within_the_period() {
    let two = [failure("a", 60), failure("b", 120)];
    assert_eq!(
        next(None, None, LIMITS(), &two, &two, at(NOW)),
        (None, Turn::Stays),
        "two failures of three"
    );
    let three = [failure("a", 60), failure("c", 30), failure("b", 120)];
    let (status, turn) = next(None, None, LIMITS(), &three, &three, at(NOW));
    assert_eq!(turn, Turn::Opens);
    let status = status.unwrap();
    assert!(is_open(&status));
    assert_eq!(status.scope.as_deref(), Some("Policy"));
    assert_eq!(status.opened_at, Some(Time(at(NOW))));
    let listed: Vec<&str> = status.failures.iter().map(|f| f.machine.as_str()).collect();
    assert_eq!(listed, ["ns/c", "ns/a", "ns/b"], "newest first");
    assert_eq!(status.failures[0].message, "c failed");
}

#[test]
fn failures_older_than_the_period_or_before_a_resume_do_not_count() {
    let failures = [failure("a", 60), failure("b", 120), failure("old", 31 * 60)];
    assert_eq!(
        next(None, None, LIMITS(), &failures, &failures, at(NOW)).1,
        Turn::Stays
    );
    let three = [failure("a", 60), failure("b", 120), failure("c", 600)];
    let resumed = BreakerStatus {
        resumed_at: Some(Time(at(NOW - 300))),
        resumed_by: Some("alice".into()),
        ..BreakerStatus::default()
    };
    let (status, turn) = next(Some(&resumed), None, LIMITS(), &three, &three, at(NOW));
    assert_eq!(turn, Turn::Stays, "c failed before the resume");
    assert_eq!(status.as_ref(), Some(&resumed));
    // One more after the resume: it opens, and still says who resumed it last.
    let four = [three.as_slice(), &[failure("d", 10)]].concat();
    let (status, turn) = next(Some(&resumed), None, LIMITS(), &four, &four, at(NOW));
    assert_eq!(turn, Turn::Opens);
    let status = status.unwrap();
    assert_eq!(status.failures.len(), 3);
    assert_eq!(status.resumed_by.as_deref(), Some("alice"));
}

#[test]
fn an_open_breaker_stays_open_until_resumed() {
    let open = open_since(3 * 3600);
    assert_eq!(
        next(Some(&open), None, LIMITS(), &[], &[], at(NOW)),
        (Some(open.clone()), Turn::Stays),
        "hours later, with no failure left in the period"
    );
    let resume = Resume {
        by: "alice".into(),
        request: "2027-01-15T08:00:00Z".into(),
    };
    let (status, turn) = next(Some(&open), Some(&resume), LIMITS(), &[], &[], at(NOW));
    assert_eq!(turn, Turn::Resumed { was_open: true });
    let status = status.unwrap();
    assert!(!is_open(&status));
    assert_eq!(status.resumed_at, Some(Time(at(NOW))));
    assert_eq!(status.resumed_by.as_deref(), Some("alice"));
    assert_eq!(
        status.resume_request.as_deref(),
        Some("2027-01-15T08:00:00Z")
    );
    assert!(status.failures.is_empty());
    // A resume of a closed breaker moves the point failures count from.
    let (_, turn) = next(None, Some(&resume), LIMITS(), &[], &[], at(NOW));
    assert_eq!(turn, Turn::Resumed { was_open: false });
}

#[test]
fn the_fleets_failures_open_every_policys_breaker() {
    let ours = [failure("a", 60)];
    let fleet: Vec<Failure> = (0..5).map(|i| failure(&format!("m{i}"), 60 + i)).collect();
    let (status, turn) = next(None, None, LIMITS(), &ours, &fleet, at(NOW));
    assert_eq!(turn, Turn::Opens);
    assert_eq!(status.unwrap().scope.as_deref(), Some("Fleet"));
    // Four across the fleet: under its limit.
    let (_, turn) = next(None, None, LIMITS(), &ours, &fleet[..4], at(NOW));
    assert_eq!(turn, Turn::Stays);
}

#[test]
fn a_limit_of_zero_turns_a_breaker_off() {
    let many: Vec<Failure> = (0..20).map(|i| failure(&format!("m{i}"), 60 + i)).collect();
    let off = (limit(0, 30), limit(0, 30));
    assert_eq!(next(None, None, off, &many, &many, at(NOW)).1, Turn::Stays);
    let fleet_off = (limit(3, 30), limit(0, 30));
    let (status, _) = next(None, None, fleet_off, &many, &many, at(NOW));
    let status = status.unwrap();
    assert_eq!(status.scope.as_deref(), Some("Policy"));
    assert_eq!(status.failures.len(), LISTED, "at most {LISTED} listed");
}

#[test]
fn a_policys_limit_defaults_to_three_in_thirty_minutes() {
    assert_eq!(Limit::of_policy(None), limit(3, 30));
    let spec = CircuitBreaker {
        failures: Some(5),
        period: None,
    };
    assert_eq!(Limit::of_policy(Some(&spec)), limit(5, 30));
    let off = CircuitBreaker {
        failures: Some(0),
        period: Some("2h".parse().unwrap()),
    };
    assert_eq!(Limit::of_policy(Some(&off)), limit(0, 120));
}

#[test]
fn the_halted_message_lists_the_failures_and_the_resume_command() {
    let three = [failure("a", 60), failure("b", 120), failure("c", 30)];
    let (status, _) = next(None, None, LIMITS(), &three, &three, at(NOW));
    let status = status.unwrap();
    let message = describe(&status, LIMITS(), "ns", "edge", true);
    crate::testing::assert_starts_with(
        &message,
        "Automatic renewals stopped: 3 automatic renewal(s) failed within 30m under this policy (ns/c at 2027-01-15T07:59:30Z: c failed; ns/a at 2027-01-15T07:59:00Z: a failed; ns/b at",
    );
    crate::testing::assert_ends_with(
        &message,
        "Manual requests still work. Once the cause is fixed, resume with `kubectl ck8s-certs resume -n ns edge`",
    );
    // An Event's note: the Machines and times only.
    let note = describe(&status, LIMITS(), "ns", "edge", false);
    crate::testing::assert_contains(
        &note,
        "(ns/c at 2027-01-15T07:59:30Z; ns/a at 2027-01-15T07:59:00Z; ns/b at 2027-01-15T07:58:00Z)",
    );
}
