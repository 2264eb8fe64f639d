use super::*;
use crate::policy::DeferReason;

/// Asserts that each of `lines` is a whole line of the exposition `text`.
#[track_caller]
fn assert_lines<L: AsRef<str>>(text: &str, lines: impl IntoIterator<Item = L>) {
    for line in lines {
        let line = line.as_ref();
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
}

#[test]
fn deferral_and_bypass_counters_have_conventional_names_and_labels() {
    let metrics = Metrics::default();
    for reason in [
        DeferReason::NotDue,
        DeferReason::Backoff,
        DeferReason::OutsideWindow,
        DeferReason::Staggered,
    ] {
        metrics
            .renewal_deferred
            .get_or_create(&reason_label(reason.as_str()))
            .inc();
    }
    metrics
        .renewal_bypassed
        .get_or_create(&expiry_imminent())
        .inc();
    let text = metrics.encode().unwrap();
    assert_lines(
        &text,
        [
            "# TYPE ck8s_certs_renewal_deferred counter",
            "ck8s_certs_renewal_deferred_total{reason=\"not_due\"} 1",
            "ck8s_certs_renewal_deferred_total{reason=\"backoff\"} 1",
            "ck8s_certs_renewal_deferred_total{reason=\"outside_window\"} 1",
            "ck8s_certs_renewal_deferred_total{reason=\"staggered\"} 1",
            "# TYPE ck8s_certs_renewal_bypassed counter",
            "ck8s_certs_renewal_bypassed_total{reason=\"expiry_imminent\"} 1",
        ],
    );
    // Nothing of the old names is left.
    assert!(!text.contains("renewals_deferred"), "{text}");
    assert!(!text.contains("window_bypass"), "{text}");
}

/// What every label value of this module must look like: bounded, snake_case.
fn snake(value: &str) -> bool {
    !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

#[test]
fn k8sd_paths_map_to_a_fixed_set_of_endpoints() {
    use crate::k8sd::wire::path;
    for (path, label) in [
        (path::ROOT, "probe"),
        (path::CERTIFICATES_EXPIRY, "certificates_expiry"),
        (path::PLAN, "plan"),
        (path::RUN, "run"),
        (path::APPROVE, "approve"),
        ("/1.0/x/capi/something-new", "other"),
        ("/1.0/x/capi/refresh-certs/plan?x=1", "other"),
    ] {
        assert_eq!(K8sdEndpoint::of_path(path).as_str(), label, "{path}");
    }
    for endpoint in K8sdEndpoint::ALL {
        assert!(snake(endpoint.as_str()), "{endpoint:?}");
    }
}

#[test]
fn k8sd_outcomes_are_success_or_an_error_category() {
    use crate::k8sd::K8sdError;
    use crate::k8sd::tls::Fingerprint;
    let fingerprint: Fingerprint = "00".repeat(32).parse().unwrap();
    let errors = [
        K8sdError::Connect {
            node: "n".into(),
            route: "r".into(),
            reason: "refused".into(),
        },
        K8sdError::Tls {
            node: "n".into(),
            source: std::io::Error::other("bad"),
        },
        K8sdError::PinMismatch {
            node: "n".into(),
            pinned: fingerprint,
            presented: fingerprint,
        },
        K8sdError::Timeout {
            node: "n".into(),
            endpoint: "/1.0/x/capi/refresh-certs/run".into(),
            timeout: Duration::from_secs(1),
        },
        K8sdError::Api {
            endpoint: "plan".into(),
            status: 401,
            message: "invalid token".into(),
        },
        K8sdError::InvalidResponse {
            endpoint: "run".into(),
            reason: "x".into(),
        },
    ];
    let outcomes: Vec<&str> = errors
        .into_iter()
        .map(|e| k8sd_outcome::<()>(&Err(e)))
        .collect();
    assert_eq!(
        outcomes,
        [
            "connect",
            "tls",
            "pin_mismatch",
            "timeout",
            "api",
            "invalid_response"
        ]
    );
    assert_eq!(k8sd_outcome(&Ok::<_, K8sdError>(())), "success");
    assert!(snake(K8SD_CANCELLED));
}

#[test]
fn k8sd_calls_are_counted_by_endpoint_and_outcome_and_timed_by_endpoint() {
    let metrics = Metrics::default();
    metrics.k8sd.start(K8sdEndpoint::Plan).finish("success");
    metrics.k8sd.start(K8sdEndpoint::Plan).finish("timeout");
    metrics.k8sd.start(K8sdEndpoint::Run).finish("success");
    // A caller that stopped waiting: counted, not timed.
    drop(metrics.k8sd.start(K8sdEndpoint::Approve));
    let text = metrics.encode().unwrap();
    assert_lines(
        &text,
        [
            "# TYPE ck8s_certs_k8sd_requests counter",
            "ck8s_certs_k8sd_requests_total{endpoint=\"plan\",outcome=\"success\"} 1",
            "ck8s_certs_k8sd_requests_total{endpoint=\"plan\",outcome=\"timeout\"} 1",
            "ck8s_certs_k8sd_requests_total{endpoint=\"run\",outcome=\"success\"} 1",
            "ck8s_certs_k8sd_requests_total{endpoint=\"approve\",outcome=\"cancelled\"} 1",
            "# TYPE ck8s_certs_k8sd_request_duration_seconds histogram",
            "ck8s_certs_k8sd_request_duration_seconds_count{endpoint=\"plan\"} 2",
            "ck8s_certs_k8sd_request_duration_seconds_count{endpoint=\"run\"} 1",
        ],
    );
    assert!(
        !text.contains("k8sd_request_duration_seconds_count{endpoint=\"approve\"}"),
        "{text}"
    );
}

#[test]
fn reconciles_are_timed_by_controller_and_errors_counted_by_category() {
    let metrics = Metrics::default();
    metrics.reconciled(Controller::Machine, Duration::from_millis(3), None);
    metrics.reconciled(Controller::Machine, Duration::from_secs(2), Some("kube"));
    metrics.reconciled(Controller::Policy, Duration::from_millis(1), Some("kube"));
    let text = metrics.encode().unwrap();
    assert_lines(
        &text,
        [
            "# TYPE ck8s_certs_reconcile_duration_seconds histogram",
            "ck8s_certs_reconcile_duration_seconds_count{controller=\"machine\"} 2",
            "ck8s_certs_reconcile_duration_seconds_count{controller=\"policy\"} 1",
            "# TYPE ck8s_certs_reconcile_errors counter",
            "ck8s_certs_reconcile_errors_total{controller=\"machine\",category=\"kube\"} 1",
            "ck8s_certs_reconcile_errors_total{controller=\"policy\",category=\"kube\"} 1",
        ],
    );
}

#[test]
fn counters_with_known_labels_start_at_zero_so_that_the_first_event_shows_in_increase() {
    let text = Metrics::default().encode().unwrap();
    assert_lines(
        &text,
        [
            "ck8s_certs_renewal_deferred_total{reason=\"backoff\"} 0",
            "ck8s_certs_renewal_deferred_total{reason=\"outside_window\"} 0",
            "ck8s_certs_renewal_deferred_total{reason=\"staggered\"} 0",
            "ck8s_certs_renewal_bypassed_total{reason=\"expiry_imminent\"} 0",
        ],
    );
    for name in ["started", "succeeded", "failed"] {
        for origin in ["manual", "policy"] {
            let line = format!("ck8s_certs_renewals_{name}_total{{origin=\"{origin}\"}} 0");
            assert_lines(&text, [line]);
        }
    }
}

/// The expiry series read from a source are encoded exactly as the family of gauges they
/// replaced encoded them, and an empty source leaves the family out like an empty family.
#[test]
fn expiry_series_encode_like_the_family_of_gauges() {
    let series = vec![
        (
            MachineLabels {
                namespace: "fleet".into(),
                cluster: "alpha".into(),
                machine: "alpha-cp-0".into(),
                role: "control-plane".into(),
            },
            1_798_761_600.0,
            None,
        ),
        (
            MachineLabels {
                namespace: "fleet".into(),
                cluster: "beta".into(),
                machine: "beta-md-0-w1".into(),
                role: "worker".into(),
            },
            1_798_761_600.5,
            None,
        ),
    ];
    let mut registry = Registry::with_prefix("ck8s_certs");
    let family = Family::<MachineLabels, Gauge<f64, AtomicU64>>::default();
    registry.register(
        "certificate_expiry_timestamp_seconds",
        "NotAfter of a node's certificates, as a Unix timestamp",
        family.clone(),
    );
    for (labels, expiry, _) in &series {
        family.get_or_create(labels).set(*expiry);
    }
    let mut expected = String::new();
    prometheus_client::encoding::text::encode(&mut expected, &registry).unwrap();

    let metrics = Metrics::default();
    let text = metrics.encode().unwrap();
    assert!(!text.contains("certificate_expiry"), "{text}");
    metrics.expiry.read_from(series);
    let text = metrics.encode().unwrap();
    let expected: Vec<&str> = expected.lines().filter(|l| *l != "# EOF").collect();
    assert_eq!(expected.len(), 4, "{expected:?}");
    assert_lines(&text, expected);
    metrics.expiry.read_from(Vec::new());
    assert!(!metrics.encode().unwrap().contains("certificate_expiry"));
    assert!(!text.contains("renewal_overdue"), "{text}");
    // An overdue Machine has a series of its own in the second family; the others none.
    let labels = |machine: &str| MachineLabels {
        namespace: "fleet".into(),
        cluster: "alpha".into(),
        machine: machine.into(),
        role: "worker".into(),
    };
    metrics.expiry.read_from(vec![
        (labels("w-0"), 1_798_761_600.0, Some(1_790_000_000.0)),
        (labels("w-1"), 1_798_761_600.0, None),
    ]);
    let text = metrics.encode().unwrap();
    assert_lines(
        &text,
        vec![
            "# TYPE ck8s_certs_renewal_overdue_since_timestamp_seconds gauge",
            r#"ck8s_certs_renewal_overdue_since_timestamp_seconds{namespace="fleet",cluster="alpha",machine="w-0",role="worker"} 1790000000.0"#,
        ],
    );
    assert!(!text.contains(r#"renewal_overdue_since_timestamp_seconds{namespace="fleet",cluster="alpha",machine="w-1""#), "{text}");
}

/// The values the code produces are the ones [`label_values`] lists (and so the docs).
#[test]
fn producers_give_only_listed_label_values() {
    use crate::workload::credentials::Certificate;
    use ck8s_certs_api::machine_certificates::{Origin, Role};
    let values = label_values();
    let listed = |family: &str, label: &str, value: &str| {
        assert!(
            values
                .iter()
                .any(|(f, l, v)| *f == family && *l == label && v.contains(&value)),
            "{family}{{{label}=\"{value}\"}} is not in label_values()"
        );
    };
    for role in [Role::ControlPlane, Role::Worker] {
        listed(
            "certificate_expiry_timestamp_seconds",
            "role",
            role_label(role),
        );
        listed("refresh_duration_seconds", "role", role_label(role));
    }
    for certificate in [Certificate::Client, Certificate::Ca, Certificate::ClientCa] {
        listed(
            "kubeconfig_expiry_timestamp_seconds",
            "certificate",
            certificate.label(),
        );
    }
    for o in [Origin::Manual, Origin::Policy, Origin::Fleet] {
        for family in ["renewals_started", "refresh_duration_seconds"] {
            listed(family, "origin", &origin(o).origin);
        }
    }
    for reason in [
        DeferReason::Backoff,
        DeferReason::OutsideWindow,
        DeferReason::Staggered,
    ] {
        listed(
            "renewal_deferred",
            "reason",
            &reason_label(reason.as_str()).reason,
        );
    }
    listed("renewal_bypassed", "reason", &expiry_imminent().reason);
    listed(
        "renewal_config_invalid",
        "reason",
        &reason_label(crate::controllers::governing_policy::CONFIG_INVALID).reason,
    );
    for endpoint in K8sdEndpoint::ALL {
        listed("k8sd_requests", "endpoint", endpoint.as_str());
    }
    listed("k8sd_requests", "outcome", K8SD_CANCELLED);
    for controller in Controller::ALL {
        listed("reconcile_errors", "controller", controller.as_str());
    }
}
