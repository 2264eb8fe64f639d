//! What has already expired in a cluster, and how long its CA has left: the two facts a cluster
//! switched off for a season comes back with. Pure: the Machines' records and the CA's end in,
//! conditions out.
//!
//! - A node certificate past its NotAfter means the node (and, for a control plane, the workload
//!   API) fails TLS; the Machines' `certificates-expiry` annotations say so without reaching the
//!   cluster, which is exactly what cannot be done then.
//! - k8sd has no CA rotation, and no refresh moves the CA: a cluster whose CA ends is beyond any
//!   in-place repair, so it is announced long before (`--ca-runway-warning`, a year by default).

use ck8s_certs_api::annotations::CERTIFICATES_EXPIRY;
use ck8s_certs_api::cluster_certificates::{
    NodesStatus, expired_reasons as expired, runway_reasons as runway,
};
use ck8s_certs_api::machine::MachineView;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::round_to_hours;

/// What a cluster's CK8s Machines record of their nodes' certificates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Nodes {
    /// The earliest recorded expiry and its Machine (the first by name among equals).
    pub earliest: Option<(Timestamp, String)>,
    /// Machines whose recorded expiry is at or before `now`.
    pub expired: u32,
    /// Machines with no readable record.
    pub unknown: u32,
}

impl Nodes {
    /// The records of `machines` (one cluster's CK8s Machines) at `now`.
    pub fn of<'a>(machines: impl IntoIterator<Item = &'a MachineView>, now: Timestamp) -> Self {
        let mut nodes = Self::default();
        for view in machines {
            let Some(at) = view
                .annotations
                .get(CERTIFICATES_EXPIRY)
                .and_then(|text| text.parse::<Timestamp>().ok())
            else {
                nodes.unknown += 1;
                continue;
            };
            if at <= now {
                nodes.expired += 1;
            }
            let earlier = match &nodes.earliest {
                None => true,
                Some((first, name)) => (at, &view.name) < (*first, name),
            };
            if earlier {
                nodes.earliest = Some((at, view.name.clone()));
            }
        }
        nodes
    }

    pub fn status(&self) -> NodesStatus {
        NodesStatus {
            earliest_expiry: self.earliest.as_ref().map(|(at, _)| Time(*at)),
            earliest_machine: self.earliest.as_ref().map(|(_, name)| name.clone()),
            expired: self.expired,
            unknown: self.unknown,
        }
    }

    /// Since when the cluster's certificates have been expired, if they are.
    pub fn expired_since(&self) -> Option<Timestamp> {
        match (&self.earliest, self.expired) {
            (Some((at, _)), 1..) => Some(*at),
            _ => None,
        }
    }
}

/// What the workload API server's certificate looked like at the last check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Api {
    /// Not checked, or the check told nothing about the certificate (unreachable, refused).
    #[default]
    Unknown,
    /// A TLS handshake succeeded.
    Valid,
    /// The server's certificate has expired (its NotAfter, when TLS said).
    Expired(Option<Timestamp>),
}

/// Since when the cluster's certificates have been expired, by its Machines' records or its
/// workload API, whichever is earlier.
pub fn expired_since(nodes: &Nodes, api: Api) -> Option<Timestamp> {
    let api = match api {
        Api::Expired(at) => at,
        _ => None,
    };
    nodes.expired_since().into_iter().chain(api).min()
}

/// A condition's status, reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// The `CertificatesExpired` condition of `nodes` and the workload `api`. Its messages name
/// instants, never "ago" or "in": a status that changed with the clock would be written at
/// every check.
pub fn expired_verdict(nodes: &Nodes, api: Api) -> Verdict {
    const WHAT_NOW: &str = "Control planes can be refreshed in place while their k8sd answers; a worker whose kubelet.conf expired cannot. See docs/refresh.md, \"When certificates have already expired\"";
    let api_expired = match api {
        Api::Expired(at) => Some(match at {
            Some(at) => {
                format!("the workload API server serves a certificate that expired at {at}")
            }
            None => "the workload API server serves an expired certificate".to_owned(),
        }),
        _ => None,
    };
    match (nodes.expired_since(), &nodes.earliest, api_expired) {
        (Some(since), Some((_, machine)), api) => {
            let others = match nodes.expired {
                0 | 1 => String::new(),
                n => format!(" ({n} Machines of this cluster in all)"),
            };
            let api = api.map(|a| format!("; {a}")).unwrap_or_default();
            Verdict {
                status: "True",
                reason: expired::NODE_CERTIFICATES_EXPIRED,
                message: format!(
                    "The certificates of Machine {machine} expired at {since}{others}{api}: its node fails TLS (for a control plane, so does the workload API). {WHAT_NOW}"
                ),
            }
        }
        (_, _, Some(api)) => Verdict {
            status: "True",
            reason: expired::API_CERTIFICATE_EXPIRED,
            message: format!(
                "{}{api}, although no Machine records an expiry that has passed: nothing reaches the nodes through it. {WHAT_NOW}",
                api.get(..1).unwrap_or_default().to_uppercase(),
                api = api.get(1..).unwrap_or_default()
            ),
        },
        _ => Verdict {
            status: "False",
            reason: expired::NOT_EXPIRED,
            message: match &nodes.earliest {
                Some((at, machine)) => {
                    format!("The earliest recorded expiry is Machine {machine}'s, at {at}")
                }
                None => "No Machine of this cluster records its certificates' expiry yet".into(),
            },
        },
    }
}

/// The `CARunway` condition at `now` of a CA that ends at `end` (`None`: unknown), warned about
/// `horizon` ahead (messages name instants only, as [`expired_verdict`]'s).
pub fn runway_verdict(end: Option<Timestamp>, horizon: SignedDuration, now: Timestamp) -> Verdict {
    const NO_ROTATION: &str = "k8sd cannot rotate a cluster CA and no refresh moves it: plan the cluster's replacement (or a manual CA rotation on every node) before then. See docs/refresh.md, \"The cluster CA\"";
    match end {
        None => Verdict {
            status: "Unknown",
            reason: runway::CA_UNKNOWN,
            message: "The kubeconfig names no readable cluster CA".into(),
        },
        Some(end) if end <= now => Verdict {
            status: "False",
            reason: runway::CA_ENDED,
            message: format!(
                "The cluster CA ended at {end}: no certificate it signed is trusted any more, and no refresh can repair the cluster in place. {NO_ROTATION}"
            ),
        },
        Some(end) if end.duration_since(now) <= horizon => Verdict {
            status: "False",
            reason: runway::CA_ENDING_SOON,
            message: format!(
                "The cluster CA ends at {end}, within --ca-runway-warning ({:#}); from then on no certificate it signed is trusted. {NO_ROTATION}",
                round_to_hours(horizon)
            ),
        },
        Some(end) => Verdict {
            status: "True",
            reason: runway::SUFFICIENT,
            message: format!("The cluster CA ends at {end}"),
        },
    }
}

/// The next instant after `now` at which either verdict changes by the clock alone: a recorded
/// expiry passing, the CA crossing the horizon or ending.
pub fn next_change(
    nodes: &Nodes,
    ca_end: Option<Timestamp>,
    horizon: SignedDuration,
    now: Timestamp,
) -> Option<Timestamp> {
    let node = nodes.earliest.as_ref().map(|(at, _)| *at);
    let ca = ca_end
        .into_iter()
        .flat_map(|end| [end.checked_sub(horizon).ok(), Some(end)]);
    node.into_iter()
        .chain(ca.flatten())
        .filter(|at| *at > now)
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_contains, assert_starts_with};

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn machine(name: &str, expiry: Option<&str>) -> MachineView {
        let mut view = MachineView {
            name: name.into(),
            ..Default::default()
        };
        if let Some(expiry) = expiry {
            view.annotations
                .insert(CERTIFICATES_EXPIRY.into(), expiry.into());
        }
        view
    }

    const NOW: &str = "2027-03-01T00:00:00Z";

    #[test]
    fn the_earliest_record_counts_and_the_unreadable_ones_are_unknown() {
        let machines = [
            machine("w-1", Some("2027-05-01T00:00:00Z")),
            machine("cp-0", Some("2027-04-01T00:00:00Z")),
            machine("w-2", None),
            machine("w-3", Some("next spring")),
        ];
        let nodes = Nodes::of(&machines, at(NOW));
        assert_eq!(
            nodes,
            Nodes {
                earliest: Some((at("2027-04-01T00:00:00Z"), "cp-0".into())),
                expired: 0,
                unknown: 2,
            }
        );
        assert_eq!(nodes.expired_since(), None);
        let verdict = expired_verdict(&nodes, Api::Unknown);
        assert_eq!((verdict.status, verdict.reason), ("False", "NotExpired"));
        assert_eq!(
            verdict.message,
            "The earliest recorded expiry is Machine cp-0's, at 2027-04-01T00:00:00Z"
        );
    }

    #[test]
    fn equal_expiries_name_the_first_machine_by_name_whatever_the_order() {
        let a = [
            machine("w-2", Some("2027-04-01T00:00:00Z")),
            machine("w-1", Some("2027-04-01T00:00:00Z")),
        ];
        let b = [a[1].clone(), a[0].clone()];
        assert_eq!(Nodes::of(&a, at(NOW)), Nodes::of(&b, at(NOW)));
        assert_eq!(Nodes::of(&a, at(NOW)).earliest.unwrap().1, "w-1");
    }

    #[test]
    fn an_expired_cluster_names_the_earliest_machine_since_when_and_how_many() {
        let machines = [
            machine("cp-0", Some("2027-02-01T00:00:00Z")),
            machine("cp-1", Some("2027-01-30T12:00:00Z")),
            machine("w-0", Some("2028-01-01T00:00:00Z")),
        ];
        let nodes = Nodes::of(&machines, at(NOW));
        assert_eq!((nodes.expired, nodes.unknown), (2, 0));
        assert_eq!(nodes.expired_since(), Some(at("2027-01-30T12:00:00Z")));
        let verdict = expired_verdict(&nodes, Api::Unknown);
        assert_eq!(
            (verdict.status, verdict.reason),
            ("True", "NodeCertificatesExpired")
        );
        assert_starts_with(
            &verdict.message,
            "The certificates of Machine cp-1 expired at 2027-01-30T12:00:00Z (2 Machines of this cluster in all)",
        );
        let status = nodes.status();
        assert_eq!(status.earliest_machine.as_deref(), Some("cp-1"));
        assert_eq!(status.expired, 2);
    }

    #[test]
    fn an_expired_workload_api_is_told_with_or_without_expired_records() {
        let api = Api::Expired(Some(at("2027-02-20T00:00:00Z")));
        let healthy = Nodes::of(&[machine("cp-0", Some("2027-06-01T00:00:00Z"))], at(NOW));
        let verdict = expired_verdict(&healthy, api);
        assert_eq!(
            (verdict.status, verdict.reason),
            ("True", "APIServerCertificateExpired")
        );
        assert_starts_with(
            &verdict.message,
            "The workload API server serves a certificate that expired at 2027-02-20T00:00:00Z, although no Machine records",
        );
        let dark = Nodes::of(&[machine("cp-0", Some("2027-02-01T00:00:00Z"))], at(NOW));
        let verdict = expired_verdict(&dark, api);
        assert_eq!(verdict.reason, "NodeCertificatesExpired");
        assert_contains(
            &verdict.message,
            "expired at 2027-02-01T00:00:00Z; the workload API server serves a certificate that expired at 2027-02-20T00:00:00Z:",
        );
        for api in [Api::Unknown, Api::Valid] {
            assert_eq!(expired_verdict(&healthy, api).status, "False");
        }
    }

    #[test]
    fn a_record_that_ends_exactly_now_has_expired() {
        let nodes = Nodes::of(&[machine("cp-0", Some(NOW))], at(NOW));
        assert_eq!(nodes.expired_since(), Some(at(NOW)));
        assert!(
            !expired_verdict(&nodes, Api::Unknown)
                .message
                .contains("in all")
        );
    }

    #[test]
    fn no_records_is_not_expired() {
        let nodes = Nodes::of(&[machine("cp-0", None)], at(NOW));
        let verdict = expired_verdict(&nodes, Api::Unknown);
        assert_eq!((verdict.status, verdict.reason), ("False", "NotExpired"));
        assert!(
            verdict
                .message
                .contains("records its certificates' expiry yet")
        );
        assert_eq!(
            next_change(&nodes, None, SignedDuration::ZERO, at(NOW)),
            None
        );
    }

    #[test]
    fn the_runway_is_sufficient_then_short_then_over() {
        let year = SignedDuration::from_hours(365 * 24);
        let end = at("2028-01-01T00:00:00Z");
        let cases = [
            (
                "2026-12-31T23:00:00Z",
                "True",
                "Sufficient",
                "ends at 2028-01-01T00:00:00Z",
            ),
            ("2027-01-01T00:00:00Z", "False", "CAEndingSoon", "(365d)"),
            (
                "2027-09-08T00:00:00Z",
                "False",
                "CAEndingSoon",
                "k8sd cannot rotate",
            ),
            ("2028-01-01T00:00:00Z", "False", "CAEnded", "ended at"),
        ];
        for (now, status, reason, text) in cases {
            let verdict = runway_verdict(Some(end), year, at(now));
            assert_eq!((verdict.status, verdict.reason), (status, reason), "{now}");
            assert!(verdict.message.contains(text), "{now}: {}", verdict.message);
        }
        let short = runway_verdict(Some(end), year, at("2027-09-08T00:00:00Z"));
        assert!(short.message.contains("k8sd cannot rotate a cluster CA"));
        let unknown = runway_verdict(None, year, at(NOW));
        assert_eq!((unknown.status, unknown.reason), ("Unknown", "CAUnknown"));
    }

    #[test]
    fn the_next_change_is_the_first_of_an_expiry_the_horizon_and_the_ca_end() {
        let year = SignedDuration::from_hours(365 * 24);
        let nodes = Nodes::of(&[machine("cp-0", Some("2027-06-01T00:00:00Z"))], at(NOW));
        let ca = Some(at("2028-01-01T00:00:00Z"));
        // The CA's horizon (2027-01-01) has passed; the node's expiry comes first.
        assert_eq!(
            next_change(&nodes, ca, year, at(NOW)),
            Some(at("2027-06-01T00:00:00Z"))
        );
        assert_eq!(
            next_change(&nodes, ca, year, at("2026-06-01T00:00:00Z")),
            Some(at("2027-01-01T00:00:00Z"))
        );
        assert_eq!(
            next_change(&nodes, ca, year, at("2027-07-01T00:00:00Z")),
            Some(at("2028-01-01T00:00:00Z"))
        );
        assert_eq!(
            next_change(&nodes, ca, year, at("2028-01-01T00:00:00Z")),
            None
        );
    }
}
