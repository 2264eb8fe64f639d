use super::*;

const DAY: i64 = 86_400;

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).unwrap()
}

fn read(client: Option<i64>, ca: Option<i64>) -> Reading {
    Reading::Read(KubeconfigExpiry {
        client: client.map(at),
        ca: ca.map(at),
    })
}

const WARNING: SignedDuration = SignedDuration::from_hours(30 * 24);
const NOW: i64 = 1_800_000_000;

#[test]
fn the_first_certificate_to_expire_decides() {
    let secret = "ns/c-kubeconfig";
    let now = at(NOW);
    let cases = [
        (
            read(Some(NOW + 100 * DAY), Some(NOW + 900 * DAY)),
            true,
            reasons::VALID,
            None,
        ),
        (
            read(Some(NOW + 10 * DAY), Some(NOW + 900 * DAY)),
            false,
            reasons::EXPIRING_SOON,
            Some(events::KUBECONFIG_EXPIRING),
        ),
        (
            read(Some(NOW + 900 * DAY), Some(NOW + 30 * DAY)),
            false,
            reasons::EXPIRING_SOON,
            Some(events::KUBECONFIG_EXPIRING),
        ),
        (
            read(Some(NOW), None),
            false,
            reasons::EXPIRED,
            Some(events::KUBECONFIG_EXPIRED),
        ),
        (read(None, None), true, reasons::VALID, None),
        (Reading::Missing, false, reasons::MISSING, None),
        (
            Reading::Unreadable("x".into()),
            false,
            reasons::UNREADABLE,
            None,
        ),
    ];
    for (reading, ready, reason, event) in cases {
        let (r, why, message, warn) = verdict(&reading, secret, WARNING, now);
        assert_eq!(
            (r, why, warn),
            (ready, reason, event),
            "{reading:?}: {message}"
        );
    }
    let (_, _, message, _) = verdict(
        &read(Some(NOW + 10 * DAY + 3_600), None),
        secret,
        WARNING,
        now,
    );
    assert_eq!(
        message,
        "The client certificate in Secret ns/c-kubeconfig expires at 2027-01-25T09:00:00Z, in 10d 1h: then every certificate refresh of this cluster fails. Renew the kubeconfig before then"
    );
    let (_, _, message, _) = verdict(&read(Some(NOW - DAY), None), secret, WARNING, now);
    assert!(
        message.contains("expired at 2027-01-14T08:00:00Z"),
        "{message}"
    );
}

#[test]
fn the_next_check_is_the_interval_or_the_next_crossing() {
    let interval = Duration::from_secs(DAY as u64);
    let now = at(NOW);
    // Far from expiry: the interval, less a per-Cluster jitter of at most a tenth.
    let far = next_check(
        &read(Some(NOW + 400 * DAY), None),
        WARNING,
        interval,
        "u1",
        now,
    );
    assert!(far <= interval && far > interval * 9 / 10, "{far:?}");
    assert_eq!(
        far,
        next_check(
            &read(Some(NOW + 400 * DAY), None),
            WARNING,
            interval,
            "u1",
            now
        )
    );
    // The warning horizon is crossed in an hour: then.
    let crossing = next_check(
        &read(Some(NOW + 30 * DAY + 3_600), None),
        WARNING,
        interval,
        "u1",
        now,
    );
    assert_eq!(crossing, Duration::from_secs(3_600));
    // Inside the horizon: at expiry (here in 2 h).
    let expiring = next_check(&read(Some(NOW + 7_200), None), WARNING, interval, "u1", now);
    assert_eq!(expiring, Duration::from_secs(7_200));
    // Expired, missing: the interval; never below a minute.
    assert!(next_check(&read(Some(NOW - 5), None), WARNING, interval, "u1", now) > interval / 2);
    assert_eq!(
        next_check(&read(Some(NOW + 1), None), WARNING, interval, "u1", now),
        Duration::from_secs(60)
    );
}

#[test]
fn an_unchanged_reading_gives_an_equal_status() {
    let reading = read(Some(NOW + 10 * DAY), Some(NOW + 900 * DAY));
    let (ready, reason, message, _) = verdict(&reading, "s", WARNING, at(NOW));
    let first = status_for(
        &ClusterCertificatesStatus::default(),
        &reading,
        "s",
        (ready, reason, message.clone()),
        at(NOW),
    );
    let again = status_for(
        &first,
        &reading,
        "s",
        (ready, reason, message),
        at(NOW + 60),
    );
    assert_eq!(first, again);
    assert_eq!(
        first.kubeconfig.unwrap().client_certificate_expiry,
        Some(Time(at(NOW + 10 * DAY)))
    );
}
