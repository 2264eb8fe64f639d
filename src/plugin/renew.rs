//! `kubectl ck8s-certs renew`: the same request as `kubectl annotate machine <m>
//! v1beta2.k8sd.io/refresh-certificates=<ttl>` for one or more Machines, or as `kubectl annotate
//! cluster <c> …` for a whole Cluster (one CertificateRefresh: its control planes one at a time,
//! then its workers), checked before anything is written.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use ck8s_certs_api::annotations::{REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS};
use ck8s_certs_api::capi::{CLUSTER_NAME_LABEL, GROUP};
use ck8s_certs_api::duration::Ttl;
use ck8s_certs_api::machine::{Machine, MachineView};
use ck8s_certs_api::machine_certificates::MachineCertificates;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{PluginError, Session};

mod fleet;

/// The field manager of the annotation (`requestedBy` in the operation record).
const MANAGER: &str = "kubectl-ck8s-certs";

#[derive(Debug, clap::Args)]
pub struct RenewArgs {
    /// Machines to renew.
    #[arg(required_unless_present = "cluster", conflicts_with = "cluster")]
    pub machines: Vec<String>,
    /// Renew every CK8s Machine of this Cluster (control planes first, one at a time).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Lifetime of the new certificates (y=365d, mo=30d, w, d, h, m, s; workers 10m to 68y).
    #[arg(long, default_value = "1y")]
    pub ttl: String,
    /// Wait for the outcome, printing progress.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up after this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30m")]
    pub timeout: Duration,
}

/// What `--wait` reports of one Machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stage {
    Requested,
    InProgress,
    Done,
    Failed,
}

/// The state of a renewal requested on a Machine, from its annotations: finished once the
/// controller has taken the trigger away and said how it went.
pub fn stage(annotations: &BTreeMap<String, String>) -> Stage {
    let status = annotations
        .get(REFRESH_CERTIFICATES_STATUS)
        .map(String::as_str);
    match (annotations.contains_key(REFRESH_CERTIFICATES), status) {
        (false, Some("done")) => Stage::Done,
        (false, Some("failed")) => Stage::Failed,
        (_, Some("in-progress")) => Stage::InProgress,
        _ => Stage::Requested,
    }
}

/// Whether the user may patch `resource` (`machines`, `clusters`) of Cluster API here.
async fn may_patch(session: &Session, resource: &str) -> Result<bool, PluginError> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(GROUP.into()),
                resource: Some(resource.into()),
                verb: Some("patch".into()),
                namespace: Some(session.namespace.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(session.client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

pub async fn run(
    session: &Session,
    args: &RenewArgs,
    out: &mut impl Write,
) -> Result<(), PluginError> {
    let ttl: Ttl = args
        .ttl
        .parse()
        .map_err(|e| PluginError::Usage(format!("--ttl: {e}")))?;
    let api: Api<Machine> =
        Api::namespaced_with(session.client.clone(), &session.namespace, &session.capi);
    let targets: Vec<MachineView> = match &args.cluster {
        Some(cluster) => {
            let params = ListParams::default().labels(&format!("{CLUSTER_NAME_LABEL}={cluster}"));
            let found: Vec<MachineView> = api
                .list(&params)
                .await?
                .items
                .iter()
                .map(MachineView::of)
                .filter(|v| v.is_ck8s() && !v.deleting)
                .collect();
            if found.is_empty() {
                return Err(PluginError::NotFound(format!(
                    "Cluster {cluster} has no CK8s Machines in namespace {}",
                    session.namespace
                )));
            }
            found
        }
        None => {
            let mut found = Vec::new();
            for name in &args.machines {
                let machine = api.get_opt(name).await?.ok_or_else(|| {
                    PluginError::NotFound(format!(
                        "Machine {name} not found in namespace {}",
                        session.namespace
                    ))
                })?;
                let view = MachineView::of(&machine);
                if !view.is_ck8s() {
                    return Err(PluginError::NotFound(format!(
                        "Machine {name} is not a CK8s Machine (its bootstrap is not a CK8sConfig)"
                    )));
                }
                found.push(view);
            }
            found
        }
    };
    // Everything is checked before anything is written: never a half-requested cluster.
    if let Some(worker) = targets.iter().find(|v| !v.control_plane)
        && let Err(err) = ttl.check_worker()
    {
        return Err(PluginError::Usage(format!(
            "--ttl {}: {err} (Machine {} is a worker)",
            args.ttl, worker.name
        )));
    }
    let resource = match &args.cluster {
        Some(_) => "clusters",
        None => "machines",
    };
    if !may_patch(session, resource).await? {
        return Err(PluginError::Forbidden(format!(
            "forbidden: you may not patch {resource}.{GROUP} in namespace {ns}, which renewing needs (the request is the {REFRESH_CERTIFICATES} annotation); nothing was changed. Ask for that right, or ask someone who has it to run: kubectl ck8s-certs renew {what} -n {ns} --ttl {ttl}",
            ns = session.namespace,
            what = match &args.cluster {
                Some(cluster) => format!("--cluster {cluster}"),
                None => args.machines.join(" "),
            },
            ttl = args.ttl,
        )));
    }
    let params = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    if let Some(cluster) = &args.cluster {
        return fleet::renew(
            session,
            cluster,
            &args.ttl,
            &params,
            args.wait.then_some(args.timeout),
            out,
        )
        .await;
    }
    for target in &targets {
        let patch = json!({ "metadata": { "annotations": { REFRESH_CERTIFICATES: args.ttl } } });
        api.patch(&target.name, &params, &Patch::Merge(patch))
            .await?;
        writeln!(
            out,
            "machine.{GROUP}/{} renewal requested ({})",
            target.name, args.ttl
        )?;
    }
    if !args.wait {
        return Ok(());
    }
    wait(session, &api, &targets, args.timeout, out).await
}

async fn wait(
    session: &Session,
    api: &Api<Machine>,
    targets: &[MachineView],
    timeout: Duration,
    out: &mut impl Write,
) -> Result<(), PluginError> {
    let records: Api<MachineCertificates> =
        Api::namespaced(session.client.clone(), &session.namespace);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut shown: BTreeMap<String, Stage> = BTreeMap::new();
    let mut failed = Vec::new();
    loop {
        let mut open = 0;
        for target in targets {
            if matches!(shown.get(&target.name), Some(Stage::Done | Stage::Failed)) {
                continue;
            }
            let Some(machine) = api.get_opt(&target.name).await? else {
                writeln!(out, "{}: deleted", target.name)?;
                shown.insert(target.name.clone(), Stage::Failed);
                failed.push(target.name.clone());
                continue;
            };
            let now = stage(&MachineView::of(&machine).annotations);
            if shown.get(&target.name) != Some(&now) {
                let detail = match now {
                    Stage::Done | Stage::Failed => {
                        let op = records
                            .get_opt(&target.name)
                            .await?
                            .and_then(|r| r.status)
                            .and_then(|s| s.operation);
                        match (&now, op) {
                            (Stage::Done, Some(op)) => op
                                .new_expiry
                                .map(|e| {
                                    format!(", certificates expire at {}", super::output::when(e.0))
                                })
                                .unwrap_or_default(),
                            (Stage::Failed, Some(op)) => {
                                format!(": {}", op.error.unwrap_or_default())
                            }
                            _ => String::new(),
                        }
                    }
                    _ => String::new(),
                };
                let word = match now {
                    Stage::Requested => "requested",
                    Stage::InProgress => "in-progress",
                    Stage::Done => "done",
                    Stage::Failed => "failed",
                };
                let detail = crate::text::printable(&detail);
                writeln!(out, "{}: {word}{detail}", target.name)?;
                if now == Stage::Failed {
                    failed.push(target.name.clone());
                }
                shown.insert(target.name.clone(), now.clone());
            }
            if !matches!(now, Stage::Done | Stage::Failed) {
                open += 1;
            }
        }
        if open == 0 {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(PluginError::Failed(format!(
                "gave up waiting after {}: {open} Machine(s) not finished (the controller carries on)",
                humantime::format_duration(timeout)
            )));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(PluginError::Failed(format!(
            "the renewal of {} failed",
            failed.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_renewal_is_finished_only_once_the_trigger_is_gone() {
        let cases = [
            (
                annotations(&[(REFRESH_CERTIFICATES, "1y")]),
                Stage::Requested,
            ),
            // The status of the previous refresh, not ours yet.
            (
                annotations(&[
                    (REFRESH_CERTIFICATES, "1y"),
                    (REFRESH_CERTIFICATES_STATUS, "done"),
                ]),
                Stage::Requested,
            ),
            (
                annotations(&[
                    (REFRESH_CERTIFICATES, "1y"),
                    (REFRESH_CERTIFICATES_STATUS, "in-progress"),
                ]),
                Stage::InProgress,
            ),
            (
                annotations(&[(REFRESH_CERTIFICATES_STATUS, "done")]),
                Stage::Done,
            ),
            (
                annotations(&[(REFRESH_CERTIFICATES_STATUS, "failed")]),
                Stage::Failed,
            ),
        ];
        for (annotations, expected) in cases {
            assert_eq!(stage(&annotations), expected, "{annotations:?}");
        }
    }
}
