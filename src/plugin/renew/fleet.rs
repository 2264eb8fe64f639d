//! `renew --cluster`: the Cluster's refresh trigger, which the controller turns into one fleet
//! `CertificateRefresh` (control planes one at a time, then workers); `--wait` follows that
//! request's progress, Machine by Machine.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use ck8s_certs_api::annotations::{FLEET_REQUEST, REFRESH_CERTIFICATES};
use ck8s_certs_api::capi::GROUP;
use ck8s_certs_api::certificate_refresh::{CertificateRefresh, MachinePhase, RequestPhase};
use ck8s_certs_api::machine::Cluster;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::super::{PluginError, Session};

/// Sets the Cluster's trigger; with `wait`, follows the request it becomes until it ends.
pub(super) async fn renew(
    session: &Session,
    cluster: &str,
    ttl: &str,
    params: &PatchParams,
    wait: Option<Duration>,
    out: &mut impl Write,
) -> Result<(), PluginError> {
    let clusters: Api<Cluster> =
        Api::namespaced_with(session.client.clone(), &session.namespace, &session.capi);
    let before = clusters
        .get_opt(cluster)
        .await?
        .ok_or_else(|| {
            PluginError::NotFound(format!(
                "Cluster {cluster} not found in namespace {}",
                session.namespace
            ))
        })?
        .annotations
        .get(FLEET_REQUEST)
        .map(str::to_owned);
    let patch = json!({ "metadata": { "annotations": { REFRESH_CERTIFICATES: ttl } } });
    clusters
        .patch(cluster, params, &Patch::Merge(patch))
        .await?;
    writeln!(
        out,
        "cluster.{GROUP}/{cluster} renewal requested ({ttl}): one CertificateRefresh, control planes one at a time, then workers"
    )?;
    let Some(timeout) = wait else {
        return Ok(());
    };
    let deadline = tokio::time::Instant::now() + timeout;
    let gave_up = || {
        PluginError::Failed(format!(
            "gave up waiting after {} (the controller carries on)",
            humantime::format_duration(timeout)
        ))
    };
    // The controller names the request on the Cluster once it made it.
    let asked = tokio::time::Instant::now();
    let mut said = false;
    let name = loop {
        let named = clusters
            .get_opt(cluster)
            .await?
            .and_then(|c| c.annotations.get(FLEET_REQUEST).map(str::to_owned));
        if let Some(name) = named.filter(|n| Some(n) != before.as_ref()) {
            break name;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(gave_up());
        }
        if !said && asked.elapsed() > Duration::from_secs(30) {
            said = true;
            writeln!(
                out,
                "no CertificateRefresh for it yet: is the controller running, and does its --watch-filter select Cluster {cluster} (label cluster.x-k8s.io/watch-filter)?"
            )?;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    writeln!(out, "certificaterefresh/{name}")?;
    let requests: Api<CertificateRefresh> =
        Api::namespaced(session.client.clone(), &session.namespace);
    let mut shown: BTreeMap<String, MachinePhase> = BTreeMap::new();
    loop {
        let status = requests
            .get_opt(&name)
            .await?
            .and_then(|r| r.status)
            .unwrap_or_default();
        for machine in &status.machines {
            if shown.get(&machine.name) == Some(&machine.phase) {
                continue;
            }
            shown.insert(machine.name.clone(), machine.phase);
            let line = match machine.phase {
                MachinePhase::Pending => continue,
                MachinePhase::Running => format!("{}: in-progress", machine.name),
                MachinePhase::Succeeded => format!(
                    "{}: done{}",
                    machine.name,
                    machine
                        .new_expiry
                        .as_ref()
                        .map(|e| format!(
                            ", certificates expire at {}",
                            super::super::output::when(e.0)
                        ))
                        .unwrap_or_default()
                ),
                MachinePhase::Failed => format!(
                    "{}: failed: {}",
                    machine.name,
                    machine.message.clone().unwrap_or_default()
                ),
                MachinePhase::Skipped => format!(
                    "{}: skipped{}",
                    machine.name,
                    machine
                        .message
                        .as_ref()
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default()
                ),
            };
            writeln!(out, "{line}")?;
        }
        match status.phase {
            Some(RequestPhase::Succeeded) => return Ok(()),
            Some(RequestPhase::Failed) => {
                return Err(PluginError::Failed(format!(
                    "certificaterefresh/{name} failed: {}",
                    status.message.unwrap_or_default()
                )));
            }
            _ => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(gave_up());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
