use super::*;

const DAY: i64 = 86_400;

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).unwrap()
}

fn read(client: Option<i64>, ca: Option<i64>) -> Reading {
    Reading::Read {
        expiry: KubeconfigExpiry {
            client: client.map(at),
            ca: ca.map(at),
            client_ca: None,
        },
        held: Err(Refusal::Shape("a token".into())),
    }
}

/// The kind and reason of each Event that going from `old` to `checks` publishes.
fn announced(old: &ClusterCertificatesStatus, checks: &Checks) -> Vec<(EventType, &'static str)> {
    condition_events(old, checks)
        .into_iter()
        .map(|(kind, reason, _)| (kind, reason))
        .collect()
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

fn checks(reading: &Reading, nodes: &expired::Nodes, now: Timestamp) -> Checks {
    let (ready, reason, message, _) = verdict(reading, "s", WARNING, now);
    let ca = match reading {
        Reading::Read { expiry, .. } => expiry.ca,
        _ => None,
    };
    Checks {
        ready: Verdict {
            status: if ready { "True" } else { "False" },
            reason,
            message,
        },
        expired: expired::expired_verdict(nodes, expired::Api::Unknown),
        runway: expired::runway_verdict(ca, SignedDuration::from_hours(365 * 24), now),
        nodes: nodes.status(),
    }
}

#[test]
fn an_unchanged_reading_gives_an_equal_status_however_much_later() {
    let reading = read(Some(NOW + 100 * DAY), Some(NOW + 900 * DAY));
    let nodes = expired::Nodes::default();
    let first = status_for(
        &ClusterCertificatesStatus::default(),
        &reading,
        "s",
        &checks(&reading, &nodes, at(NOW)),
        None,
        at(NOW),
    );
    let again = status_for(
        &first,
        &reading,
        "s",
        &checks(&reading, &nodes, at(NOW + 7 * DAY)),
        None,
        at(NOW + 7 * DAY),
    );
    assert_eq!(first, again);
    assert_eq!(
        first.kubeconfig.unwrap().client_certificate_expiry,
        Some(Time(at(NOW + 100 * DAY)))
    );
    let types: Vec<&str> = first.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, ["Ready", "CertificatesExpired", "CARunway"]);
}

#[test]
fn a_cluster_that_went_dark_warns_once_and_says_when_it_recovered() {
    let reading = read(Some(NOW + 100 * DAY), Some(NOW + 3000 * DAY));
    let mut view = MachineView {
        name: "cp-0".into(),
        ..Default::default()
    };
    view.annotations.insert(
        ck8s_certs_api::annotations::CERTIFICATES_EXPIRY.into(),
        at(NOW - DAY).to_string(),
    );
    let dark = expired::Nodes::of([&view], at(NOW));
    let healthy = status_for(
        &ClusterCertificatesStatus::default(),
        &reading,
        "s",
        &checks(&reading, &expired::Nodes::default(), at(NOW)),
        None,
        at(NOW),
    );
    let dark_checks = checks(&reading, &dark, at(NOW));
    assert_eq!(
        announced(&healthy, &dark_checks),
        [(EventType::Warning, "ClusterCertificatesExpired")]
    );
    let still = status_for(&healthy, &reading, "s", &dark_checks, None, at(NOW));
    assert!(condition_events(&still, &checks(&reading, &dark, at(NOW + 60))).is_empty());
    view.annotations.insert(
        ck8s_certs_api::annotations::CERTIFICATES_EXPIRY.into(),
        at(NOW + 300 * DAY).to_string(),
    );
    let recovered = checks(&reading, &expired::Nodes::of([&view], at(NOW)), at(NOW));
    assert_eq!(
        announced(&still, &recovered),
        [(EventType::Normal, "ClusterCertificatesRecovered")]
    );
}

#[test]
fn a_ca_within_the_runway_warns_once_per_reason() {
    let reading = read(Some(NOW + 100 * DAY), Some(NOW + 300 * DAY));
    let nodes = expired::Nodes::default();
    let first = checks(&reading, &nodes, at(NOW));
    assert_eq!(
        (first.runway.status, first.runway.reason),
        ("False", "CAEndingSoon")
    );
    assert_eq!(
        announced(&ClusterCertificatesStatus::default(), &first),
        [(EventType::Warning, "ClusterCAEnding")]
    );
    let status = status_for(
        &ClusterCertificatesStatus::default(),
        &reading,
        "s",
        &first,
        None,
        at(NOW),
    );
    assert!(condition_events(&status, &checks(&reading, &nodes, at(NOW + DAY))).is_empty());
    let ended = checks(&reading, &nodes, at(NOW + 300 * DAY));
    assert_eq!(condition_events(&status, &ended).len(), 1);
}

/// A Cluster's expiry series goes with the Cluster: the shipped alerts would otherwise fire for
/// clusters that are gone.
#[tokio::test]
async fn the_series_of_a_deleted_cluster_are_dropped_by_the_sweep() {
    let client =
        kube::Client::try_from(kube::Config::new("https://127.0.0.1:1".parse().unwrap())).unwrap();
    let metrics = Arc::new(Metrics::default());
    let ctx = Context {
        readings: Default::default(),
        attempts: Default::default(),
        api: Default::default(),
        client: client.clone(),
        capi: CapiVersion::V1Beta2,
        machines: kube::runtime::reflector::store::Writer::<Machine>::new(CapiVersion::V1Beta2)
            .as_reader(),
        records: kube::runtime::reflector::store::Writer::<ClusterCertificates>::new(())
            .as_reader(),
        recorder: Recorder::new(
            client,
            crate::events::Reporter {
                controller: "test".into(),
                instance: None,
            },
        ),
        metrics: metrics.clone(),
        config: Config {
            warning: WARNING,
            interval: Duration::from_secs(3600),
            ca_runway: SignedDuration::from_hours(365 * 24),
            vetting: Default::default(),
            renewal: Default::default(),
        },
        clock: crate::clock::SystemClock::shared(),
    };
    for cluster in ["gone", "kept"] {
        let reading = read(Some(NOW + 100 * DAY), Some(NOW + 900 * DAY));
        export(&metrics, "ns", cluster, &reading);
        ctx.readings.lock().unwrap().insert(
            ("ns".into(), cluster.into()),
            (std::time::Instant::now(), reading),
        );
    }
    let series = |cluster: &str| {
        metrics
            .encode()
            .unwrap()
            .lines()
            .filter(|l| {
                l.starts_with("ck8s_certs_kubeconfig_expiry_timestamp_seconds{")
                    && l.contains(&format!("cluster=\"{cluster}\""))
            })
            .count()
    };
    assert_eq!((series("gone"), series("kept")), (2, 2));
    // Only "kept" is still in the cache.
    let mut clusters =
        kube::runtime::reflector::store::Writer::<Cluster>::new(CapiVersion::V1Beta2);
    let kept: Cluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": { "name": "kept", "namespace": "ns" },
        "spec": {},
    }))
    .unwrap();
    clusters.apply_watcher_event(&kube::runtime::watcher::Event::Apply(kept));
    sweep(&ctx, &clusters.as_reader());
    assert_eq!((series("gone"), series("kept")), (0, 2));
    assert_eq!(ctx.readings.lock().unwrap().len(), 1);
}

#[test]
fn a_client_ca_ending_first_is_named_with_its_own_secret() {
    let reading = Reading::Read {
        expiry: KubeconfigExpiry {
            client: Some(at(NOW + 100 * DAY)),
            ca: Some(at(NOW + 900 * DAY)),
            client_ca: Some(at(NOW + 20 * DAY)),
        },
        held: Err(Refusal::Shape("x".into())),
    };
    let (ready, reason, message, warn) = verdict(&reading, "ns/c-kubeconfig", WARNING, at(NOW));
    assert_eq!(
        (ready, reason, warn),
        (
            false,
            reasons::EXPIRING_SOON,
            Some(events::KUBECONFIG_EXPIRING)
        )
    );
    assert!(
        message.starts_with(
            "The client CA certificate in Secret ns/c-cca (it signs the client certificate of ns/c-kubeconfig) expires at"
        ),
        "{message}"
    );
}
