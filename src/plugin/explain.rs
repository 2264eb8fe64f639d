//! `kubectl ck8s-certs explain <machine>`: the whole story of one Machine in plain words.

use std::io::Write;

use ck8s_certs_api::annotations::IN_FLIGHT_REFRESH;
use ck8s_certs_api::certificate_refresh::CertificateRefresh;
use ck8s_certs_api::cluster_certificates::ClusterCertificates;
use ck8s_certs_api::machine::{Machine, MachineView};
use ck8s_certs_api::machine_certificates::{
    MachineCertificates, MachineCertificatesStatus, Operation,
};
use jiff::Timestamp;
use kube::Api;
use serde::Serialize;

use super::output::{time_left, when};
use super::{Format, PluginError, Session};

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// The Machine.
    pub machine: String,
    /// Output format: a table for people, JSON or YAML for tools.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// Everything `explain` knows (also its JSON/YAML form).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub namespace: String,
    pub machine: String,
    pub cluster: Option<String>,
    pub node: Option<String>,
    pub role: &'static str,
    pub status: Option<MachineCertificatesStatus>,
    /// The refresh in flight: the operation of the `CertificateRefresh` the Machine names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<InFlight>,
    pub cluster_certificates: Option<ClusterCertificates>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InFlight {
    pub request: String,
    pub operation: Option<Operation>,
}

/// The lines `explain` prints.
pub fn lines(explanation: &Explanation, now: Timestamp) -> Vec<String> {
    let mut lines = vec![format!(
        "Machine {}/{} ({} of cluster {}, node {})",
        explanation.namespace,
        explanation.machine,
        explanation.role,
        explanation.cluster.as_deref().unwrap_or("<none>"),
        explanation.node.as_deref().unwrap_or("<none yet>"),
    )];
    let status = explanation.status.clone().unwrap_or_default();
    match status.expiry.as_ref() {
        Some(expiry) => lines.push(format!(
            "Certificates: expire at {} ({} left)",
            when(expiry.0),
            time_left(expiry.0, now)
        )),
        None => lines.push("Certificates: expiry not known yet".into()),
    }
    match status.renewal.as_ref() {
        None => lines.push(
            "Policy: none selects this Machine; certificates are renewed only on request".into(),
        ),
        Some(renewal) => {
            let policy = match (&renewal.policy_ref, &renewal.conflicting_policies) {
                (Some(reference), _) => format!(
                    "{} ({}, generation {})",
                    reference.name,
                    renewal.policy.as_deref().unwrap_or("unreadable"),
                    reference
                        .observed_generation
                        .map_or_else(|| "?".into(), |g| g.to_string())
                ),
                (None, names) => format!("conflict between {}", names.join(", ")),
            };
            lines.push(format!("Policy: {policy}"));
            if let Some(windows) = &renewal.windows
                && windows.count > 0
            {
                lines.push(format!(
                    "Windows: {} ({})",
                    windows.count,
                    match &windows.message {
                        Some(message) if !windows.valid => format!("invalid: {message}"),
                        _ => "valid".into(),
                    }
                ));
            }
            let next = renewal
                .next_renewal_time
                .as_ref()
                .map_or_else(|| "none".into(), |t| when(t.0));
            lines.push(format!("Next renewal: {next} ({})", renewal.reason));
            lines.push(format!("  {}", renewal.message));
        }
    }
    if let Some(bypass) = &status.last_window_bypass {
        lines.push(format!(
            "Window bypass: {} ({})",
            when(bypass.time.0),
            bypass.message
        ));
    }
    if let Some(failed) = status.failed_attempts.filter(|n| *n > 0) {
        lines.push(format!(
            "Automatic renewals failed {failed} time(s) since the last success{}",
            status
                .last_failure_time
                .as_ref()
                .map(|t| format!(", last at {}", when(t.0)))
                .unwrap_or_default()
        ));
    }
    if let Some(in_flight) = &explanation.in_flight {
        let mut line = format!(
            "Refresh in flight: CertificateRefresh {}",
            in_flight.request
        );
        match &in_flight.operation {
            Some(op) => line.push_str(&format!(
                ", {:?} for {}, started {}, seed {}, run sent {} time(s){}",
                op.origin,
                op.ttl,
                when(op.started_at.0),
                op.seed.map_or_else(|| "-".into(), |s| s.to_string()),
                op.run_attempts,
                op.carrier
                    .as_ref()
                    .map(|c| format!(", carried out by {}", c.lease))
                    .unwrap_or_default()
            )),
            None => line.push_str(", not on the node yet"),
        }
        lines.push(line);
    }
    match &status.operation {
        None => lines.push("Last refresh: none recorded".into()),
        Some(op) => {
            let mut line = format!(
                "Last refresh: {:?}, {:?} for {}, started {}",
                op.phase,
                op.origin,
                op.ttl,
                when(op.started_at.0)
            );
            if let Some(by) = &op.requested_by {
                line.push_str(&format!(" by {by}"));
            }
            if let Some(finished) = &op.finished_at {
                line.push_str(&format!(", finished {}", when(finished.0)));
            }
            if let Some(window) = &op.matched_window {
                line.push_str(&format!(", in {window}"));
            }
            lines.push(line);
            if let Some(error) = &op.error {
                lines.push(format!("  {error}"));
            }
        }
    }
    for condition in &status.conditions {
        lines.push(format!(
            "Condition {}={} ({}): {}",
            condition.type_, condition.status, condition.reason, condition.message
        ));
    }
    if let Some(status) = explanation
        .cluster_certificates
        .as_ref()
        .and_then(|r| r.status.as_ref())
    {
        if let Some(ready) = status.conditions.iter().find(|c| c.type_ == "Ready") {
            lines.push(format!(
                "Cluster kubeconfig: {} ({})",
                ready.message, ready.reason
            ));
        }
        // --renew-management-kubeconfig: when it was renewed and when it will be, or why not.
        if let Some(renewal) = status
            .conditions
            .iter()
            .find(|c| c.type_ == ck8s_certs_api::cluster_certificates::KUBECONFIG_RENEWAL)
        {
            let kubeconfig = status.kubeconfig.as_ref();
            let at = |t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
                t.map_or_else(|| "never".to_owned(), |t| t.0.to_string())
            };
            lines.push(format!(
                "Kubeconfig renewal: last {}, next {} ({})",
                at(kubeconfig.and_then(|k| k.last_renewal_time.as_ref())),
                kubeconfig
                    .and_then(|k| k.next_renewal_time.as_ref())
                    .map_or_else(|| "not planned".to_owned(), |t| t.0.to_string()),
                renewal.reason
            ));
            if renewal.status != "True" {
                lines.push(format!("  {}", renewal.message));
            }
        }
    }
    lines.push(format!(
        "Renew now: kubectl ck8s-certs renew {} -n {}",
        explanation.machine, explanation.namespace
    ));
    lines
}

pub async fn run(
    session: &Session,
    args: &ExplainArgs,
    out: &mut impl Write,
) -> Result<(), PluginError> {
    let machines: Api<Machine> =
        Api::namespaced_with(session.client.clone(), &session.namespace, &session.capi);
    let machine = machines.get_opt(&args.machine).await?.ok_or_else(|| {
        PluginError::NotFound(format!(
            "Machine {} not found in namespace {}",
            args.machine, session.namespace
        ))
    })?;
    let view = MachineView::of(&machine);
    if !view.is_ck8s() {
        return Err(PluginError::NotFound(format!(
            "Machine {}/{} is not a CK8s Machine (its bootstrap is not a CK8sConfig)",
            view.namespace, view.name
        )));
    }
    let records: Api<MachineCertificates> =
        Api::namespaced(session.client.clone(), &session.namespace);
    let status = records.get_opt(&args.machine).await?.and_then(|r| r.status);
    let in_flight = match view.annotation(IN_FLIGHT_REFRESH) {
        Some(name) => {
            let requests: Api<CertificateRefresh> =
                Api::namespaced(session.client.clone(), &session.namespace);
            let operation = requests
                .get_opt(name)
                .await?
                .and_then(|r| r.status)
                .and_then(|s| s.operation);
            Some(InFlight {
                request: name.to_owned(),
                operation: operation.filter(|op| !op.is_finished()),
            })
        }
        None => None,
    };
    let cluster_certificates = match &view.cluster {
        Some(cluster) => {
            let api: Api<ClusterCertificates> =
                Api::namespaced(session.client.clone(), &session.namespace);
            // Optional: an older controller has none, a narrower role may not read them.
            api.get_opt(cluster).await.ok().flatten()
        }
        None => None,
    };
    let explanation = Explanation {
        namespace: view.namespace.clone(),
        machine: view.name.clone(),
        cluster: view.cluster.clone(),
        node: view.node_name.clone(),
        role: if view.control_plane {
            "control plane"
        } else {
            "worker"
        },
        status,
        in_flight,
        cluster_certificates,
    };
    if super::output::structured(out, args.output, &explanation)? {
        return Ok(());
    }
    // Lines quote statuses, conditions and Events others may have written.
    for line in lines(&explanation, Timestamp::now()) {
        writeln!(out, "{}", crate::text::printable(&line))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use ck8s_certs_api::machine_certificates::{
        Operation, Origin, Phase, PolicyReference, RenewalStatus, WindowsStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    #[test]
    fn a_deferred_machine_is_explained_with_its_policy_and_what_happens_next() {
        let at = |s: &str| Time(s.parse().unwrap());
        let explanation = Explanation {
            namespace: "edge".into(),
            machine: "w-1".into(),
            cluster: Some("store-12".into()),
            node: Some("node-1".into()),
            role: "worker",
            status: Some(MachineCertificatesStatus {
                expiry: Some(at("2027-01-10T00:00:00Z")),
                renewal: Some(RenewalStatus {
                    policy_ref: Some(PolicyReference {
                        name: "nightly".into(),
                        observed_generation: Some(4),
                    }),
                    policy: Some("Scheduled".into()),
                    windows: Some(WindowsStatus {
                        valid: true,
                        count: 2,
                        message: None,
                    }),
                    reason: "OutsideWindow".into(),
                    next_renewal_time: Some(at("2027-01-02T01:00:00Z")),
                    message: "Renewal is due, waiting for a window".into(),
                    ..Default::default()
                }),
                operation: Some(Operation {
                    phase: Phase::Succeeded,
                    finished_at: Some(at("2026-01-10T00:01:00Z")),
                    ..Operation::pending(
                        Origin::Manual,
                        Some("kubectl-annotate".into()),
                        Some("1y".into()),
                        "1y".into(),
                        1,
                        at("2026-01-10T00:00:00Z"),
                    )
                }),
                ..Default::default()
            }),
            in_flight: None,
            cluster_certificates: None,
        };
        let lines = lines(&explanation, "2027-01-01T00:00:00Z".parse().unwrap());
        assert_eq!(
            lines,
            [
                "Machine edge/w-1 (worker of cluster store-12, node node-1)",
                "Certificates: expire at 2027-01-10T00:00:00Z (9d 0h left)",
                "Policy: nightly (Scheduled, generation 4)",
                "Windows: 2 (valid)",
                "Next renewal: 2027-01-02T01:00:00Z (OutsideWindow)",
                "  Renewal is due, waiting for a window",
                "Last refresh: Succeeded, Manual for 1y, started 2026-01-10T00:00:00Z by kubectl-annotate, finished 2026-01-10T00:01:00Z",
                "Renew now: kubectl ck8s-certs renew w-1 -n edge",
            ]
        );
    }

    #[test]
    fn a_refresh_in_flight_is_read_from_its_request() {
        let at = |s: &str| Time(s.parse().unwrap());
        let running = Operation {
            phase: Phase::Running,
            seed: Some(42),
            run_attempts: 1,
            ..Operation::pending(
                Origin::Policy,
                None,
                None,
                "90d".into(),
                1,
                at("2027-01-01T00:00:00Z"),
            )
        };
        let mut explanation = Explanation {
            namespace: "edge".into(),
            machine: "w-1".into(),
            cluster: Some("store-12".into()),
            node: Some("node-1".into()),
            role: "worker",
            status: None,
            in_flight: Some(InFlight {
                request: "w-1-1798761600".into(),
                operation: Some(running),
            }),
            cluster_certificates: None,
        };
        let now = "2027-01-01T00:01:00Z".parse().unwrap();
        assert_eq!(
            lines(&explanation, now)[2..4],
            [
                "Policy: none selects this Machine; certificates are renewed only on request",
                "Refresh in flight: CertificateRefresh w-1-1798761600, Policy for 90d, started 2027-01-01T00:00:00Z, seed 42, run sent 1 time(s)",
            ]
        );
        explanation.in_flight = Some(InFlight {
            request: "w-1-1798761600".into(),
            operation: None,
        });
        assert_eq!(
            lines(&explanation, now)[3],
            "Refresh in flight: CertificateRefresh w-1-1798761600, not on the node yet"
        );
    }

    #[test]
    fn the_cluster_s_kubeconfig_and_its_renewal_are_shown() {
        use ck8s_certs_api::cluster_certificates::{
            ClusterCertificatesSpec, ClusterCertificatesStatus, KubeconfigStatus,
        };
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        let at = |s: &str| Time(s.parse().unwrap());
        let condition = |type_: &str, status: &str, reason: &str, message: &str| Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: at("2027-01-01T00:00:00Z"),
            observed_generation: None,
        };
        let mut record = ClusterCertificates::new(
            "store-12",
            ClusterCertificatesSpec {
                cluster_name: "store-12".into(),
            },
        );
        record.status = Some(ClusterCertificatesStatus {
            kubeconfig: Some(KubeconfigStatus {
                secret: "edge/store-12-kubeconfig".into(),
                last_renewal_time: Some(at("2026-07-01T00:00:00Z")),
                next_renewal_time: Some(at("2027-01-01T00:00:00Z")),
                ..Default::default()
            }),
            nodes: None,
            conditions: vec![
                condition(
                    "Ready",
                    "True",
                    "Valid",
                    "The client certificate expires at X",
                ),
                condition(
                    "KubeconfigRenewal",
                    "False",
                    "NotAccepted",
                    "The client certificate is not renewed: refused",
                ),
            ],
        });
        let explanation = Explanation {
            namespace: "edge".into(),
            machine: "w-1".into(),
            cluster: Some("store-12".into()),
            node: None,
            role: "worker",
            status: None,
            in_flight: None,
            cluster_certificates: Some(record),
        };
        let lines = lines(&explanation, "2027-01-02T00:00:00Z".parse().unwrap());
        assert_eq!(
            lines[lines.len() - 4..lines.len() - 1],
            [
                "Cluster kubeconfig: The client certificate expires at X (Valid)",
                "Kubeconfig renewal: last 2026-07-01T00:00:00Z, next 2027-01-01T00:00:00Z (NotAccepted)",
                "  The client certificate is not renewed: refused",
            ]
        );
    }
}
