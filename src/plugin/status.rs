//! `kubectl ck8s-certs status`: the clusters that need attention first (certificates already
//! expired, a CA near its end), then one line per CK8s Machine.

use std::collections::BTreeMap;
use std::io::Write;

use ck8s_certs_api::annotations::CERTIFICATES_EXPIRY;
use ck8s_certs_api::cluster_certificates::{
    CA_RUNWAY, CERTIFICATES_EXPIRED, ClusterCertificates, ClusterCertificatesStatus,
};
use ck8s_certs_api::machine::{Machine, MachineView};
use ck8s_certs_api::machine_certificates::{MachineCertificates, MachineCertificatesStatus, Phase};
use jiff::{SignedDuration, Timestamp};
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde::Serialize;

use super::output::{Cell, Tone, table, time_left, when};
use super::{Format, PluginError, Session};

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Only Machines with these labels (a label selector, as kubectl's -l).
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// Only the Machines of this Cluster.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Output format: a table for people, JSON or YAML for tools.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// What `status` shows of one Machine (also its JSON/YAML form).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub namespace: String,
    pub machine: String,
    pub cluster: String,
    /// control-plane or worker.
    pub role: &'static str,
    pub expiry: Option<Timestamp>,
    /// `89d 23h`, `expired`, or `-`.
    pub time_left: String,
    /// The next automatic renewal; `None` without one (no policy: `manual`; Disabled: `never`).
    pub next_renewal: Option<Timestamp>,
    /// The verdict's reason (NotDue, OutsideWindow, Backoff, Disabled, ConfigInvalid…), or
    /// `Manual` when no policy governs the Machine.
    pub why: String,
    pub policy: Option<String>,
    /// When the last refresh started, and who asked.
    pub last_refresh: Option<Timestamp>,
    pub last_origin: Option<String>,
    /// Pending, Running, Succeeded or Failed.
    pub result: Option<String>,
    pub error: Option<String>,
}

/// Expiry within this is shown as a warning.
const SOON: SignedDuration = SignedDuration::from_hours(14 * 24);

pub fn row(view: &MachineView, status: Option<&MachineCertificatesStatus>, now: Timestamp) -> Row {
    let expiry = status
        .and_then(|s| s.expiry.as_ref().map(|t| t.0))
        .or_else(|| {
            view.annotations
                .get(CERTIFICATES_EXPIRY)
                .and_then(|a| a.parse().ok())
        });
    let renewal = status.and_then(|s| s.renewal.as_ref());
    let operation = status.and_then(|s| s.operation.as_ref());
    Row {
        namespace: view.namespace.clone(),
        machine: view.name.clone(),
        cluster: view.cluster.clone().unwrap_or_default(),
        role: if view.control_plane {
            "control-plane"
        } else {
            "worker"
        },
        expiry,
        time_left: expiry.map_or_else(|| "-".to_owned(), |e| time_left(e, now)),
        next_renewal: renewal.and_then(|r| r.next_renewal_time.as_ref().map(|t| t.0)),
        why: renewal.map_or_else(|| "Manual".to_owned(), |r| r.reason.clone()),
        policy: renewal.and_then(|r| r.policy_ref.as_ref().map(|p| p.name.clone())),
        last_refresh: operation.map(|o| o.started_at.0),
        last_origin: operation.map(|o| format!("{:?}", o.origin)),
        result: operation.map(|o| format!("{:?}", o.phase)),
        error: operation.and_then(|o| o.error.clone()),
    }
}

pub const HEADERS: [&str; 10] = [
    "NAMESPACE",
    "MACHINE",
    "CLUSTER",
    "ROLE",
    "EXPIRY",
    "TIME LEFT",
    "NEXT RENEWAL",
    "WHY",
    "LAST REFRESH",
    "RESULT",
];

pub fn cells(row: &Row, now: Timestamp) -> Vec<Cell> {
    let left_tone = match row.expiry {
        Some(e) if e <= now => Tone::Bad,
        Some(e) if e.duration_since(now) <= SOON => Tone::Warning,
        _ => Tone::Plain,
    };
    let next = match (row.next_renewal, row.why.as_str()) {
        (Some(at), _) => when(at),
        (None, "Manual") => "manual".into(),
        (None, "Disabled") => "never".into(),
        (None, _) => "-".into(),
    };
    let why_tone = match row.why.as_str() {
        "ConfigInvalid" => Tone::Bad,
        "Backoff" | "OutsideWindow" | "Disabled" => Tone::Warning,
        _ => Tone::Plain,
    };
    let last = match (row.last_refresh, &row.last_origin) {
        (Some(at), Some(origin)) => format!("{} ({})", when(at), origin.to_lowercase()),
        _ => "-".into(),
    };
    let result = row.result.clone().unwrap_or_else(|| "-".into());
    let result_tone = if result == format!("{:?}", Phase::Failed) {
        Tone::Bad
    } else {
        Tone::Plain
    };
    vec![
        Cell::plain(&row.namespace),
        Cell::plain(&row.machine),
        Cell::plain(&row.cluster),
        Cell::plain(row.role),
        Cell::plain(row.expiry.map_or_else(|| "-".into(), when)),
        Cell::with(&row.time_left, left_tone),
        Cell::plain(next),
        Cell::with(&row.why, why_tone),
        Cell::plain(last),
        Cell::with(result, result_tone),
    ]
}

/// The CK8s Machines in scope with their records, sorted by namespace, cluster, name.
pub async fn rows(session: &Session, args: &StatusArgs) -> Result<Vec<Row>, PluginError> {
    let (machines, records): (Api<Machine>, Api<MachineCertificates>) = if args.all_namespaces {
        (
            Api::all_with(session.client.clone(), &session.capi),
            Api::all(session.client.clone()),
        )
    } else {
        (
            Api::namespaced_with(session.client.clone(), &session.namespace, &session.capi),
            Api::namespaced(session.client.clone(), &session.namespace),
        )
    };
    let mut params = ListParams::default();
    if let Some(selector) = &args.selector {
        params = params.labels(selector);
    }
    let machines = machines.list(&params).await?.items;
    let records: BTreeMap<(String, String), MachineCertificates> = records
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|r| ((r.namespace().unwrap_or_default(), r.name_any()), r))
        .collect();
    let now = Timestamp::now();
    let mut rows: Vec<Row> = machines
        .iter()
        .map(MachineView::of)
        .filter(|v| v.is_ck8s())
        .filter(|v| args.cluster.is_none() || v.cluster == args.cluster)
        .map(|view| {
            let record = records.get(&(view.namespace.clone(), view.name.clone()));
            row(&view, record.and_then(|r| r.status.as_ref()), now)
        })
        .collect();
    rows.sort_by(|a, b| {
        (&a.namespace, &a.cluster, &a.machine).cmp(&(&b.namespace, &b.cluster, &b.machine))
    });
    Ok(rows)
}

/// A cluster that needs attention before any of its Machines: its certificates have already
/// expired, or its CA ends within the controller's runway warning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attention {
    pub namespace: String,
    pub cluster: String,
    /// The condition's reason (NodeCertificatesExpired, CAEndingSoon, CAEnded).
    pub reason: String,
    /// What and when, in a few words.
    pub what: String,
}

pub const ATTENTION_HEADERS: [&str; 4] = ["NAMESPACE", "CLUSTER", "ATTENTION", "WHAT"];

/// What `status` (a cluster's `ClusterCertificates` status) says needs attention, worst first.
pub fn attention(
    namespace: &str,
    cluster: &str,
    status: &ClusterCertificatesStatus,
) -> Vec<Attention> {
    let mut out = Vec::new();
    let condition = |type_: &str| status.conditions.iter().find(|c| c.type_ == type_);
    let item = |reason: &str, what: String| Attention {
        namespace: namespace.to_owned(),
        cluster: cluster.to_owned(),
        reason: reason.to_owned(),
        what,
    };
    if let Some(c) = condition(CERTIFICATES_EXPIRED).filter(|c| c.status == "True") {
        let nodes = status.nodes.clone().unwrap_or_default();
        let what = match (nodes.earliest_expiry, nodes.earliest_machine) {
            (Some(at), Some(machine)) => format!(
                "node certificates expired at {} (Machine {machine}; {} expired)",
                when(at.0),
                nodes.expired
            ),
            _ => c.message.clone(),
        };
        out.push(item(&c.reason, what));
    }
    if let Some(c) = condition(CA_RUNWAY).filter(|c| c.status == "False") {
        let end = status
            .kubeconfig
            .as_ref()
            .and_then(|k| k.certificate_authority_expiry.as_ref());
        let what = match end {
            Some(end) => format!("cluster CA ends at {}; k8sd cannot rotate it", when(end.0)),
            None => c.message.clone(),
        };
        out.push(item(&c.reason, what));
    }
    out
}

/// The clusters in scope that need attention. A user who may not list ClusterCertificates
/// still gets the Machines.
async fn attentions(session: &Session, args: &StatusArgs) -> Result<Vec<Attention>, PluginError> {
    let api: Api<ClusterCertificates> = if args.all_namespaces {
        Api::all(session.client.clone())
    } else {
        Api::namespaced(session.client.clone(), &session.namespace)
    };
    let records = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(status)) if status.code == 403 => return Ok(Vec::new()),
        Err(err) => return Err(err.into()),
    };
    let mut out: Vec<Attention> = records
        .iter()
        .filter(|r| args.cluster.is_none() || args.cluster.as_deref() == Some(&r.name_any()))
        .filter_map(|r| {
            let status = r.status.as_ref()?;
            Some(attention(
                &r.namespace().unwrap_or_default(),
                &r.name_any(),
                status,
            ))
        })
        .flatten()
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.cluster).cmp(&(&b.namespace, &b.cluster)));
    Ok(out)
}

pub async fn run(
    session: &Session,
    args: &StatusArgs,
    out: &mut impl Write,
) -> Result<(), PluginError> {
    let rows = rows(session, args).await?;
    if super::output::structured_or_none(out, args.output, &rows, "No CK8s Machines found.")? {
        return Ok(());
    }
    let colour = super::output::colour();
    let clusters = attentions(session, args).await?;
    if !clusters.is_empty() {
        let cells: Vec<Vec<Cell>> = clusters
            .iter()
            .map(|a| {
                vec![
                    Cell::plain(&a.namespace),
                    Cell::plain(&a.cluster),
                    Cell::with(&a.reason, Tone::Bad),
                    Cell::plain(&a.what),
                ]
            })
            .collect();
        table(out, &ATTENTION_HEADERS, &cells, colour)?;
        writeln!(out)?;
    }
    let now = Timestamp::now();
    let cells: Vec<Vec<Cell>> = rows.iter().map(|r| cells(r, now)).collect();
    table(out, &HEADERS, &cells, colour)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use ck8s_certs_api::machine_certificates::{Operation, Origin, PolicyReference, RenewalStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    fn view() -> MachineView {
        MachineView {
            namespace: "edge".into(),
            name: "cp-0".into(),
            cluster: Some("store-12".into()),
            control_plane: true,
            ..Default::default()
        }
    }

    #[test]
    fn a_machine_without_a_record_shows_its_annotation_and_manual_renewal() {
        let mut view = view();
        view.annotations
            .insert(CERTIFICATES_EXPIRY.into(), "2027-01-01T00:00:00Z".into());
        let now: Timestamp = "2026-12-25T00:00:00Z".parse().unwrap();
        let row = row(&view, None, now);
        assert_eq!(row.time_left, "7d 0h");
        let texts: Vec<String> = cells(&row, now).into_iter().map(|c| c.text).collect();
        assert_eq!(
            texts,
            [
                "edge",
                "cp-0",
                "store-12",
                "control-plane",
                "2027-01-01T00:00:00Z",
                "7d 0h",
                "manual",
                "Manual",
                "-",
                "-"
            ]
        );
        assert_eq!(cells(&row, now)[5].tone, Tone::Warning);
    }

    #[test]
    fn a_dark_cluster_and_a_short_ca_runway_come_first_and_a_healthy_cluster_not_at_all() {
        use ck8s_certs_api::cluster_certificates::{KubeconfigStatus, NodesStatus};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        let condition = |type_: &str, status: &str, reason: &str| Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: "m".into(),
            last_transition_time: Time(at(0)),
            observed_generation: None,
        };
        let mut status = ClusterCertificatesStatus {
            kubeconfig: Some(KubeconfigStatus {
                certificate_authority_expiry: Some(Time(at(1_900_000_000))),
                ..Default::default()
            }),
            nodes: Some(NodesStatus {
                earliest_expiry: Some(Time(at(1_800_000_000))),
                earliest_machine: Some("cp-1".into()),
                expired: 2,
                unknown: 0,
            }),
            conditions: vec![
                condition("Ready", "True", "Valid"),
                condition(CERTIFICATES_EXPIRED, "True", "NodeCertificatesExpired"),
                condition(CA_RUNWAY, "False", "CAEndingSoon"),
            ],
        };
        let found = attention("edge", "store-12", &status);
        let texts: Vec<(&str, &str)> = found
            .iter()
            .map(|a| (a.reason.as_str(), a.what.as_str()))
            .collect();
        assert_eq!(
            texts,
            [
                (
                    "NodeCertificatesExpired",
                    "node certificates expired at 2027-01-15T08:00:00Z (Machine cp-1; 2 expired)"
                ),
                (
                    "CAEndingSoon",
                    "cluster CA ends at 2030-03-17T17:46:40Z; k8sd cannot rotate it"
                ),
            ]
        );
        status.conditions = vec![
            condition(CERTIFICATES_EXPIRED, "False", "NotExpired"),
            condition(CA_RUNWAY, "True", "Sufficient"),
        ];
        assert!(attention("edge", "store-12", &status).is_empty());
    }

    #[test]
    fn a_governed_machine_shows_its_verdict_and_last_refresh() {
        let status = MachineCertificatesStatus {
            expiry: Some(Time(at(2_000_000_000))),
            renewal: Some(RenewalStatus {
                policy_ref: Some(PolicyReference {
                    name: "fleet".into(),
                    observed_generation: Some(1),
                }),
                reason: "Backoff".into(),
                next_renewal_time: Some(Time(at(1_900_000_000))),
                ..Default::default()
            }),
            operation: Some(Operation {
                phase: Phase::Failed,
                error: Some("disk full".into()),
                ..Operation::pending(
                    Origin::Policy,
                    None,
                    None,
                    "1y".into(),
                    1,
                    Time(at(1_800_000_000)),
                )
            }),
            ..Default::default()
        };
        let now = at(1_850_000_000);
        let row = row(&view(), Some(&status), now);
        assert_eq!(row.policy.as_deref(), Some("fleet"));
        let cells = cells(&row, now);
        let texts: Vec<&str> = cells.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(
            &texts[4..],
            [
                "2033-05-18T03:33:20Z",
                "1736d 2h",
                "2030-03-17T17:46:40Z",
                "Backoff",
                "2027-01-15T08:00:00Z (policy)",
                "Failed"
            ]
        );
        assert_eq!((cells[7].tone, cells[9].tone), (Tone::Warning, Tone::Bad));
    }
}
