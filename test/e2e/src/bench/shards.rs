//! Two shards over the fleet, deployed and labelled as docs/sharding.md says: what each costs
//! against one instance, one fleet request per shard at once, and, from the audit log, that no
//! shard wrote anything of the other shard's clusters.
//!
//! The shards share one ServiceAccount (as the runbook deploys them); the audit log tells them
//! apart by the User-Agent each sends (`ck8s-certs/<version> (watch-filter=<v>)`).

use std::time::{Duration, Instant};

use ck8s_certs_api::capi::WATCH_FILTER_LABEL;
use ck8s_certs_api::certificate_refresh::{CertificateRefresh, RequestPhase};
use jiff::Timestamp;
use kube::Api;
use kube::api::{ApiResource, PostParams};
use serde_json::json;

use super::idle::Contender;
use super::probe::{AuditTail, Memory, ProcessProbe, Requests};
use super::{alive, settle, wait_for_log};
use crate::controlplane::AuditEvent;
use crate::process::Process;
use crate::{Environment, Error};

/// The shards' filter values; cluster `i` goes to shard `i % 2`.
pub const SHARDS: [&str; 2] = ["a", "b"];

/// What one shard cost and did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ShardFigures {
    pub filter: String,
    pub machines: usize,
    /// Its first start after the clusters were labelled into it (it relabels their records).
    pub first_start_writes: usize,
    /// Its cold start beside the other shard: from spawn to the first reconcile.
    pub first_reconcile_seconds: Option<f64>,
    pub startup_requests: Requests,
    pub memory: Memory,
    pub startup_cpu_seconds: f64,
    /// Its fleet request: phase, progress and wall time.
    pub request_phase: String,
    pub request_progress: String,
    pub request_seconds: f64,
    /// Its writes while both requests ran.
    pub request_writes: usize,
}

/// Both shards.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ShardsFigures {
    pub shards: Vec<ShardFigures>,
    pub startup_window_seconds: f64,
    /// Writes, by any shard, to an object of a cluster of the other shard (named after it),
    /// over the whole phase: must be 0.
    pub wrong_shard_writes: usize,
    /// Writes by the shards over the whole phase whose object names a fleet cluster.
    pub attributed_writes: usize,
}

/// Labels every cluster and its Machines into a shard, as docs/sharding.md's "Moving a cluster
/// between shards" does with `kubectl label` (here as the same merge patches).
async fn label(env: &Environment) -> Result<(), Error> {
    let client = env.management().await?;
    let version = env.spec.capi_version.storage_version();
    let gvk = |kind: &str| {
        ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
            ck8s_certs_api::capi::GROUP,
            version,
            kind,
        ))
    };
    let (cluster, machine) = (gvk("Cluster"), gvk("Machine"));
    let mut patches = Vec::new();
    for (index, workload) in env.clusters.iter().enumerate() {
        let shard = SHARDS[index % SHARDS.len()];
        let patch = json!({ "metadata": { "labels": { WATCH_FILTER_LABEL: shard } } });
        let namespace = &workload.spec.namespace;
        let names = std::iter::once((&cluster, &workload.spec.name))
            .chain(workload.nodes.iter().map(|node| (&machine, &node.machine)));
        for (resource, name) in names {
            patches.push((
                resource.clone(),
                namespace.clone(),
                name.clone(),
                patch.clone(),
            ));
        }
    }
    super::fleet::patch_all(&client, patches).await
}

/// The shard `event` came from, by its User-Agent.
fn shard_of(event: &AuditEvent) -> Option<&'static str> {
    SHARDS.into_iter().find(|shard| {
        event
            .user_agent
            .contains(&format!("(watch-filter={shard})"))
    })
}

/// The shard of the fleet cluster an object is named after (`c012`, `c012-…`, `c012-cp-0.…`).
fn shard_of_name(env: &Environment, name: &str) -> Option<&'static str> {
    env.clusters
        .iter()
        .enumerate()
        .find_map(|(index, cluster)| {
            let rest = name.strip_prefix(cluster.spec.name.as_str())?;
            (rest.is_empty() || rest.starts_with(['-', '.']))
                .then_some(SHARDS[index % SHARDS.len()])
        })
}

fn shard_contender(
    env: &Environment,
    binary: &std::path::Path,
    extra: &[String],
    shard: &str,
) -> Result<Contender, Error> {
    let mut args = extra.to_vec();
    args.push(format!("--watch-filter={shard}"));
    Contender::ours(env, binary, &args)
}

/// Runs the whole phase.
pub async fn measure(
    env: &Environment,
    audit: &mut AuditTail,
    binary: &std::path::Path,
    extra: &[String],
    startup: Duration,
) -> Result<ShardsFigures, Error> {
    let phase_started_at = Timestamp::now();
    label(env).await?;
    let mut figures = ShardsFigures {
        startup_window_seconds: startup.as_secs_f64(),
        ..ShardsFigures::default()
    };
    for (index, shard) in SHARDS.into_iter().enumerate() {
        figures.shards.push(ShardFigures {
            filter: shard.to_owned(),
            machines: env
                .clusters
                .iter()
                .enumerate()
                .filter(|(i, _)| i % SHARDS.len() == index)
                .map(|(_, c)| c.nodes.len())
                .sum(),
            ..ShardFigures::default()
        });
    }

    // First start after labelling: each shard relabels its clusters' records.
    let started_at = Timestamp::now();
    let mut processes = Vec::new();
    for shard in SHARDS {
        let contender = shard_contender(env, binary, extra, shard)?;
        let mut process = Process::spawn(
            &format!("bench-shard-{shard}-first"),
            contender.command,
            &env.dir,
        )?;
        wait_for_log(&mut process, contender.first_reconcile_marker).await?;
        processes.push((process, contender.user));
    }
    for (process, user) in &mut processes {
        settle(audit, process, user).await?;
    }
    for (process, _) in &mut processes {
        process.terminate(Duration::from_secs(30));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    audit.refresh();
    for shard in &mut figures.shards {
        let filter = shard.filter.clone();
        shard.first_start_writes = audit
            .requests_where(
                |e| shard_of(e) == Some(filter.as_str()),
                started_at,
                Timestamp::now(),
            )
            .writes;
    }

    // Cold start of both at once, and a start-up window.
    let started_at = Timestamp::now();
    let started = Instant::now();
    let mut running = Vec::new();
    for shard in SHARDS {
        let contender = shard_contender(env, binary, extra, shard)?;
        let process = Process::spawn(&format!("bench-shard-{shard}"), contender.command, &env.dir)?;
        running.push((process, contender.first_reconcile_marker));
    }
    let mut first_reconcile = vec![None; SHARDS.len()];
    while started.elapsed() < startup {
        for (index, (process, marker)) in running.iter_mut().enumerate() {
            alive(process)?;
            if first_reconcile[index].is_none()
                && std::fs::read_to_string(&process.log).is_ok_and(|log| log.contains(*marker))
            {
                first_reconcile[index] = Some(started.elapsed().as_secs_f64());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let window_end = Timestamp::now();
    for (index, shard) in figures.shards.iter_mut().enumerate() {
        let probe = ProcessProbe {
            pid: running[index].0.pid(),
        };
        shard.first_reconcile_seconds = first_reconcile[index];
        shard.memory = probe.memory().unwrap_or_default();
        shard.startup_cpu_seconds = probe.cpu_seconds().unwrap_or_default();
    }

    // One fleet request per shard, at once: the first cluster of each.
    let client = env.management().await?;
    let requests_at = Timestamp::now();
    let mut targets = Vec::new();
    for (index, shard) in SHARDS.into_iter().enumerate() {
        let Some(cluster) = env.clusters.get(index) else {
            continue;
        };
        let api: Api<CertificateRefresh> = Api::namespaced(client.clone(), &cluster.spec.namespace);
        let name = format!("bench-shard-{shard}");
        let request: CertificateRefresh = serde_json::from_value(json!({
            "apiVersion": "certificates.ck8s.io/v1alpha1", "kind": "CertificateRefresh",
            "metadata": { "name": name, "labels": { WATCH_FILTER_LABEL: shard } },
            "spec": {
                "target": { "cluster": cluster.spec.name }, "ttl": "1y", "origin": "Manual",
                "maxParallelWorkers": 10, "continueOnFailure": true,
            },
        }))
        .map_err(|e| Error::Setup(e.to_string()))?;
        api.create(&PostParams::default(), &request)
            .await
            .map_err(Error::Kube)?;
        targets.push((index, api, name, Instant::now()));
    }
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut pending = targets;
    while !pending.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        for (process, _) in &mut running {
            alive(process)?;
        }
        let mut still = Vec::new();
        for (index, api, name, created) in pending {
            let status = api.get(&name).await.map_err(Error::Kube)?.status;
            let phase = status.as_ref().and_then(|s| s.phase);
            let finished = matches!(phase, Some(RequestPhase::Succeeded | RequestPhase::Failed));
            let shard = &mut figures.shards[index];
            shard.request_phase = phase.map(|p| format!("{p:?}")).unwrap_or_default();
            shard.request_progress = status.and_then(|s| s.progress).unwrap_or_default();
            shard.request_seconds = created.elapsed().as_secs_f64();
            if !finished {
                still.push((index, api, name, created));
            }
        }
        pending = still;
    }
    let requests_end = Timestamp::now();
    for (process, _) in &mut running {
        process.terminate(Duration::from_secs(30));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    audit.refresh();

    for shard in &mut figures.shards {
        let filter = shard.filter.clone();
        let mine = |e: &AuditEvent| shard_of(e) == Some(filter.as_str());
        shard.startup_requests = audit.requests_where(mine, started_at, window_end);
        shard.request_writes = audit.requests_where(mine, requests_at, requests_end).writes;
    }
    let phase_end = Timestamp::now();
    for event in &audit.events {
        let Some(shard) = shard_of(event) else {
            continue;
        };
        let Some(at) = event.received() else { continue };
        if at < phase_started_at || at >= phase_end || !event.is_write() {
            continue;
        }
        let Some(owner) = event
            .object_ref
            .as_ref()
            .and_then(|o| shard_of_name(env, &o.name))
        else {
            continue;
        };
        figures.attributed_writes += 1;
        if owner != shard {
            figures.wrong_shard_writes += 1;
        }
    }
    Ok(figures)
}
