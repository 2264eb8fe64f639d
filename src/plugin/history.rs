//! `kubectl ck8s-certs history [<machine>] [--cluster <c>]`: who refreshed what, when, with which
//! TTL, and how it went: the CertificateRefresh records (one per finished Machine refresh, the
//! last `--refresh-history` kept per Machine) and the fleet requests, newest first.

use std::io::Write;

use ck8s_certs_api::capi::CLUSTER_NAME_LABEL;
use ck8s_certs_api::certificate_refresh::{CertificateRefresh, Target, labels};
use jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde::Serialize;

use super::output::{Cell, Tone, table, when};
use super::{Format, PluginError, Session};

#[derive(Debug, clap::Args)]
pub struct HistoryArgs {
    /// Only this Machine's refreshes.
    pub machine: Option<String>,
    /// Only the refreshes of this Cluster's Machines, and its fleet requests.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Output format: a table for people, JSON or YAML for tools.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// One refresh (also its JSON/YAML form).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub namespace: String,
    pub name: String,
    /// The Machine, or `cluster/<name>` for a fleet request.
    pub target: String,
    pub ttl: String,
    pub origin: String,
    pub requested_by: Option<String>,
    /// The user who asked, as authenticated at admission.
    pub requester: Option<String>,
    pub started: Option<Timestamp>,
    pub finished: Option<Timestamp>,
    /// Pending, Running, Suspended, Succeeded or Failed.
    pub result: String,
    /// Fleet requests: finished Machines of all.
    pub progress: Option<String>,
    pub new_expiry: Option<Timestamp>,
    pub message: Option<String>,
}

const HEADERS: [&str; 8] = [
    "NAMESPACE",
    "TARGET",
    "TTL",
    "ORIGIN",
    "REQUESTED BY",
    "STARTED",
    "RESULT",
    "NEW EXPIRY",
];

pub fn entry(request: &CertificateRefresh) -> Entry {
    let status = request.status.clone().unwrap_or_default();
    let spec = &request.spec;
    Entry {
        namespace: request.namespace().unwrap_or_default(),
        name: request.name_any(),
        target: target(&spec.target),
        ttl: spec.ttl.clone(),
        origin: format!("{:?}", spec.origin),
        requested_by: spec.requested_by.clone(),
        requester: spec.requester.as_ref().map(|r| r.username.clone()),
        started: status
            .started_at
            .map(|t| t.0)
            .or_else(|| request.creation_timestamp().map(|t| t.0)),
        finished: status.finished_at.map(|t| t.0),
        // A Machine's record is created when its refresh starts and finished with its status.
        result: status.phase.map_or_else(
            || match spec.target.machine {
                Some(_) => "Running".to_owned(),
                None => "Pending".to_owned(),
            },
            |p| format!("{p:?}"),
        ),
        progress: status.progress,
        new_expiry: status.new_expiry.map(|t| t.0),
        message: status.message,
    }
}

/// A Machine by its name; a fleet target as `<kind>/<name>`.
fn target(target: &Target) -> String {
    let kinds = [
        ("cluster", &target.cluster),
        ("machinedeployment", &target.machine_deployment),
        ("controlplane", &target.control_plane),
    ];
    if let Some(machine) = &target.machine {
        return machine.clone();
    }
    if let Some((kind, Some(name))) = kinds.into_iter().find(|(_, name)| name.is_some()) {
        return format!("{kind}/{name}");
    }
    match &target.selector {
        Some(selector) => format!(
            "selector/{}",
            crate::policy::spec::compile_selector("selector", selector)
                .map(|s| s.to_string())
                .unwrap_or_else(|_| "invalid".into())
        ),
        None => "-".into(),
    }
}

fn cells(entry: &Entry) -> Vec<Cell> {
    let tone = match entry.result.as_str() {
        "Failed" => Tone::Bad,
        "Succeeded" => Tone::Plain,
        _ => Tone::Warning,
    };
    let result = match (&entry.progress, entry.target.contains('/')) {
        (Some(progress), true) => format!("{} {progress}", entry.result),
        _ => entry.result.clone(),
    };
    vec![
        Cell::plain(&entry.namespace),
        Cell::plain(&entry.target),
        Cell::plain(&entry.ttl),
        Cell::plain(&entry.origin),
        // The user when known (with the tool or object they went through), else the tool.
        Cell::plain(match (&entry.requester, &entry.requested_by) {
            (Some(user), Some(by)) => format!("{user} ({by})"),
            (Some(user), None) => user.clone(),
            (None, Some(by)) => by.clone(),
            (None, None) => "-".into(),
        }),
        Cell::plain(entry.started.map_or_else(|| "-".into(), when)),
        Cell::with(result, tone),
        Cell::plain(entry.new_expiry.map_or_else(|| "-".into(), when)),
    ]
}

/// The requests in scope, newest first.
pub async fn entries(session: &Session, args: &HistoryArgs) -> Result<Vec<Entry>, PluginError> {
    let api: Api<CertificateRefresh> = if args.all_namespaces {
        Api::all(session.client.clone())
    } else {
        Api::namespaced(session.client.clone(), &session.namespace)
    };
    let mut params = ListParams::default();
    if let Some(machine) = &args.machine {
        params = params.labels(&format!("{}={}", labels::MACHINE, labels::value(machine)));
    } else if let Some(cluster) = &args.cluster {
        params = params.labels(&format!("{CLUSTER_NAME_LABEL}={cluster}"));
    }
    let mut entries: Vec<Entry> = api
        .list(&params)
        .await?
        .items
        .iter()
        .filter(|r| {
            args.machine
                .as_ref()
                .is_none_or(|m| r.spec.target.machine.as_ref() == Some(m))
        })
        .map(entry)
        .collect();
    entries.sort_by(|a, b| (b.started, &b.name).cmp(&(a.started, &a.name)));
    Ok(entries)
}

pub async fn run(
    session: &Session,
    args: &HistoryArgs,
    out: &mut impl Write,
) -> Result<(), PluginError> {
    let entries = entries(session, args).await?;
    if super::output::structured_or_none(out, args.output, &entries, "No refreshes recorded.")? {
        return Ok(());
    }
    let rows: Vec<Vec<Cell>> = entries.iter().map(cells).collect();
    table(out, &HEADERS, &rows, super::output::colour())?;
    for entry in entries.iter().filter(|e| e.result == "Failed") {
        if let Some(message) = &entry.message {
            let message = crate::text::printable(message);
            writeln!(out, "\n{} {}: {message}", entry.target, entry.name)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use ck8s_certs_api::certificate_refresh::{
        CertificateRefreshSpec, CertificateRefreshStatus, Origin, RequestPhase, Target,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap()
    }

    fn request(
        name: &str,
        machine: Option<&str>,
        phase: RequestPhase,
        start: i64,
    ) -> CertificateRefresh {
        let mut request = CertificateRefresh::new(
            name,
            CertificateRefreshSpec {
                target: Target {
                    machine: machine.map(str::to_owned),
                    cluster: machine.is_none().then(|| "c".to_owned()),
                    ..Default::default()
                },
                ttl: "1y".into(),
                origin: if machine.is_some() {
                    Origin::Fleet
                } else {
                    Origin::Manual
                },
                requested_by: Some("kubectl-annotate".into()),
                requester: Some(ck8s_certs_api::machine_certificates::Requester {
                    username: "alice".into(),
                    ..Default::default()
                }),
                max_parallel_workers: None,
                continue_on_failure: false,
                suspend: false,
            },
        );
        request.metadata.namespace = Some("ns".into());
        request.status = Some(CertificateRefreshStatus {
            phase: Some(phase),
            progress: Some("2/3".into()),
            started_at: Some(Time(at(start))),
            message: Some("disk full".into()),
            ..Default::default()
        });
        request
    }

    #[test]
    fn a_table_of_refreshes_with_the_failures_explained() {
        let entries = [
            entry(&request("c-1", None, RequestPhase::Running, 10)),
            entry(&request("m-1", Some("m"), RequestPhase::Failed, 5)),
        ];
        let rows: Vec<Vec<Cell>> = entries.iter().map(cells).collect();
        let mut out = Vec::new();
        table(&mut out, &HEADERS, &rows, false).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "NAMESPACE  TARGET     TTL  ORIGIN  REQUESTED BY              STARTED               RESULT       NEW EXPIRY\n\
             ns         cluster/c  1y   Manual  alice (kubectl-annotate)  2027-01-15T08:00:10Z  Running 2/3  -\n\
             ns         m          1y   Fleet   alice (kubectl-annotate)  2027-01-15T08:00:05Z  Failed       -\n"
        );
    }
}
