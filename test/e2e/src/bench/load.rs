//! The controller under load: a batch of worker refreshes at its concurrency, and how fast it
//! reacts to one annotation with every Machine of the fleet cached.

use std::time::{Duration, Instant};

use ck8s_certs_api::annotations::REFRESH_CERTIFICATES;
use futures::{StreamExt, TryStreamExt};
use jiff::Timestamp;
use kube::Client;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::fleet::StatusWatch;
use super::probe::AuditTail;
use crate::fixtures::NodeInfo;
use crate::sim::Fault;
use crate::{Environment, Error};

/// The refresh batch.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RefreshFigures {
    pub refreshes: usize,
    pub concurrency: usize,
    pub k8sd_latency_ms: f64,
    pub restart_seconds: f64,
    /// First annotation sent → last refresh finished.
    pub wall_seconds: f64,
    /// ⌈refreshes / concurrency⌉ × (plan + run + approve at the k8sd latency + the node's
    /// restart): what a controller that is never the bottleneck would take.
    pub bound_seconds: f64,
    pub done: usize,
    pub failed: usize,
    pub unfinished: usize,
    pub k8sd_calls_per_refresh: f64,
    pub api_writes_per_refresh: f64,
    pub api_requests_per_refresh: f64,
    /// Where the refreshes held their places.
    pub held: HeldFigures,
}

/// How long each refresh held its place, in phases (means in ms over the refreshes whose calls
/// were all seen), from the simulated nodes' calls and the management API server's audit log:
/// a place is taken right before the refresh reads its node's CK8sConfig (the last such read
/// before its `plan`), and given back when `run` answers.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct HeldFigures {
    pub refreshes: usize,
    /// Taking the place → `plan` sent: the node reached (its reads, its tunnel).
    pub reach_ms: f64,
    pub plan_ms: f64,
    /// `plan` answered → `run` sent: a worker's approver found, the seed recorded.
    pub record_ms: f64,
    /// `run` sent → answered (`approve` beside it).
    pub run_ms: f64,
    /// The whole: taking the place → `run` answered.
    pub held_ms: f64,
    /// Σ held ÷ (concurrency × (last `run` answered − first place taken)): how full the places
    /// were over the batch (1: never one free).
    pub places_busy: f64,
}

/// One refresh's moments, as the node and the API server saw them.
#[derive(Default)]
struct Moments {
    placed: Option<Timestamp>,
    plan: Option<(Timestamp, Timestamp)>,
    run: Option<(Timestamp, Timestamp)>,
}

/// [`HeldFigures`] of `nodes` from `calls` and the audited requests of `user`.
fn held_places(
    nodes: &[&NodeInfo],
    calls: &[crate::sim::CallRecord],
    audit: &AuditTail,
    user: &str,
    concurrency: usize,
) -> HeldFigures {
    use std::collections::HashMap;
    let span = |c: &crate::sim::CallRecord| {
        let start: Timestamp = c.started_at.parse().ok()?;
        let end = start
            .checked_add(jiff::SignedDuration::from_secs_f64(c.duration_ms / 1000.0))
            .ok()?;
        Some((start, end))
    };
    let mut moments: HashMap<(&str, &str), Moments> = nodes
        .iter()
        .map(|n| ((n.cluster.as_str(), n.node.as_str()), Moments::default()))
        .collect();
    for call in calls {
        let Some(m) = moments.get_mut(&(call.cluster.as_str(), call.node.as_str())) else {
            continue;
        };
        match call.path.as_str() {
            ck8s_certs::k8sd::wire::path::PLAN => m.plan = span(call),
            ck8s_certs::k8sd::wire::path::RUN => m.run = span(call),
            _ => {}
        }
    }
    let by_config: HashMap<(&str, &str), (&str, &str)> = nodes
        .iter()
        .map(|n| {
            (
                (n.namespace.as_str(), n.config_name.as_str()),
                (n.cluster.as_str(), n.node.as_str()),
            )
        })
        .collect();
    for event in audit
        .events
        .iter()
        .filter(|e| e.user.username == user && e.verb == "get")
    {
        let Some(object) = &event.object_ref else {
            continue;
        };
        let Some(key) = by_config.get(&(object.namespace.as_str(), object.name.as_str())) else {
            continue;
        };
        let (Some(at), Some(m)) = (event.received(), moments.get_mut(key)) else {
            continue;
        };
        if m.plan.is_some_and(|(plan, _)| at <= plan) && m.placed.is_none_or(|p| p < at) {
            m.placed = Some(at);
        }
    }
    let ms = |from: Timestamp, to: Timestamp| to.duration_since(from).as_secs_f64() * 1000.0;
    let mut figures = HeldFigures::default();
    let (mut first, mut last): (Option<Timestamp>, Option<Timestamp>) = (None, None);
    for m in moments.values() {
        let (Some(placed), Some((plan, planned)), Some((run, ran))) = (m.placed, m.plan, m.run)
        else {
            continue;
        };
        figures.refreshes += 1;
        figures.reach_ms += ms(placed, plan);
        figures.plan_ms += ms(plan, planned);
        figures.record_ms += ms(planned, run);
        figures.run_ms += ms(run, ran);
        figures.held_ms += ms(placed, ran);
        first = Some(first.map_or(placed, |f| f.min(placed)));
        last = Some(last.map_or(ran, |l| l.max(ran)));
    }
    let n = figures.refreshes.max(1) as f64;
    if let (Some(first), Some(last)) = (first, last) {
        figures.places_busy = figures.held_ms / (concurrency.max(1) as f64 * ms(first, last));
    }
    for mean in [
        &mut figures.reach_ms,
        &mut figures.plan_ms,
        &mut figures.record_ms,
        &mut figures.run_ms,
        &mut figures.held_ms,
    ] {
        *mean /= n;
    }
    figures
}

/// Annotate → in-progress latency.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct LatencyFigures {
    pub samples: usize,
    pub missed: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// Workers waiting for the control planes of their clusters.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct WaitingFigures {
    /// Workers annotated while a control plane of their cluster was being refreshed.
    pub workers: usize,
    pub clusters: usize,
    /// The length of the measurement, after every worker was taken up.
    pub window_seconds: f64,
    /// The controller's CPU time over the window.
    pub cpu_seconds: f64,
    /// API requests of the controller over the window.
    pub api_requests: usize,
    /// `run`s the waiting workers received in the window (0: they waited).
    pub worker_runs: usize,
    /// When, in seconds after the control planes were annotated, the window opened, the
    /// control planes' last `plan` was sent (their refreshes fail at its timeout) and the first
    /// waiting worker got its `run`: how many runs fall in the window turns on these instants.
    pub window_opened_seconds: f64,
    pub last_control_plane_plan_seconds: Option<f64>,
    pub first_worker_run_seconds: Option<f64>,
}

/// Calls of one worker refresh on the critical path: plan and run on the worker, approve on a
/// control plane.
const CALLS_PER_WORKER_REFRESH: u32 = 3;

/// `kubectl annotate machine <m> v1beta2.k8sd.io/refresh-certificates=1y`, on one client.
pub async fn annotate(env: &Environment, client: &Client, node: &NodeInfo) -> Result<(), Error> {
    env.machine_api(client.clone(), &node.namespace)
        .patch(
            &node.machine,
            &PatchParams {
                field_manager: Some("kubectl-annotate".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({ "metadata": { "annotations": { REFRESH_CERTIFICATES: "1y" } } })),
        )
        .await
        .map(drop)
        .map_err(Error::Kube)
}

/// What waiting costs: one control plane per cluster is refreshed while its `plan` hangs (it is
/// tried again, and stays pending, for about a minute), and `workers` of those clusters are
/// annotated at once; over `window` (after they have been taken up) the controller's CPU time
/// and API requests are measured while the workers wait for their control planes.
pub async fn waiting_cost(
    env: &Environment,
    audit: &mut AuditTail,
    user: &str,
    pid: u32,
    control_planes: &[&NodeInfo],
    workers: &[&NodeInfo],
    window: Duration,
) -> Result<WaitingFigures, Error> {
    use crate::sim::Endpoint;
    let client = env.management().await?;
    let annotated = Timestamp::now();
    for node in control_planes {
        env.sim
            .inject(&Fault::hang().on(node).at(Endpoint::Plan))
            .await
            .map_err(|e| Error::Sim(e.to_string()))?;
    }
    for node in control_planes {
        annotate(env, &client, node).await?;
    }
    futures::stream::iter(workers.iter().map(|node| annotate(env, &client, node)))
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    // Every worker taken up (in-progress) before the window opens.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let probe = super::probe::ProcessProbe { pid };
    let window_opened = Timestamp::now().duration_since(annotated).as_secs_f64();
    let runs_before = worker_runs(env, workers).await?;
    let cpu_before = probe.cpu_seconds().unwrap_or_default();
    let from = Timestamp::now();
    tokio::time::sleep(window).await;
    let cpu = probe.cpu_seconds().unwrap_or_default() - cpu_before;
    audit.refresh();
    let requests = audit.requests(user, from, Timestamp::now()).other;
    let runs = worker_runs(env, workers).await? - runs_before;
    let calls = env
        .sim
        .calls("", "")
        .await
        .map_err(|e| Error::Sim(e.to_string()))?;
    let after_annotation = |nodes: &[&NodeInfo], path: &str, last: bool| {
        let nodes: std::collections::HashSet<(&str, &str)> = nodes
            .iter()
            .map(|n| (n.cluster.as_str(), n.node.as_str()))
            .collect();
        let offsets = calls
            .iter()
            .filter(|c| c.path == path && nodes.contains(&(c.cluster.as_str(), c.node.as_str())))
            .filter_map(|c| c.started_at.parse::<Timestamp>().ok())
            .filter(|at| *at >= annotated)
            .map(|at| at.duration_since(annotated).as_secs_f64());
        if last {
            offsets.reduce(f64::max)
        } else {
            offsets.reduce(f64::min)
        }
    };
    use ck8s_certs::k8sd::wire::path;
    Ok(WaitingFigures {
        workers: workers.len(),
        clusters: control_planes.len(),
        window_seconds: window.as_secs_f64(),
        cpu_seconds: cpu,
        api_requests: requests,
        worker_runs: runs,
        window_opened_seconds: window_opened,
        last_control_plane_plan_seconds: after_annotation(control_planes, path::PLAN, true),
        first_worker_run_seconds: after_annotation(workers, path::RUN, false),
    })
}

/// `run`s received so far by `workers`.
async fn worker_runs(env: &Environment, workers: &[&NodeInfo]) -> Result<usize, Error> {
    let calls = env
        .sim
        .calls("", "")
        .await
        .map_err(|e| Error::Sim(e.to_string()))?;
    let names: std::collections::HashSet<(&str, &str)> = workers
        .iter()
        .map(|n| (n.cluster.as_str(), n.node.as_str()))
        .collect();
    Ok(calls
        .iter()
        .filter(|c| {
            c.path == ck8s_certs::k8sd::wire::path::RUN
                && names.contains(&(c.cluster.as_str(), c.node.as_str()))
        })
        .count())
}

/// Refreshes `nodes` all at once and waits until each finished (or `timeout`).
#[allow(clippy::too_many_arguments)]
pub async fn refresh_batch(
    env: &Environment,
    audit: &mut AuditTail,
    watch: &StatusWatch,
    user: &str,
    nodes: &[&NodeInfo],
    concurrency: usize,
    latency: Duration,
    timeout: Duration,
) -> Result<RefreshFigures, Error> {
    env.sim.clear_calls("", "").await?;
    let started_at = Timestamp::now();
    let started = Instant::now();
    let client = env.management().await?;
    futures::stream::iter(nodes)
        .map(|node| annotate(env, &client, node))
        .buffer_unordered(16)
        .try_collect::<()>()
        .await?;
    let deadline = started + timeout;
    let mut last = started;
    let (mut done, mut failed, mut unfinished) = (0, 0, 0);
    for node in nodes {
        let left = deadline.saturating_duration_since(Instant::now());
        match watch
            .wait_for(&node.namespace, &node.machine, left, |seen| {
                seen.finished().map(|at| (at, seen.done.is_some()))
            })
            .await
        {
            Some((at, ok)) => {
                last = last.max(at);
                if ok { done += 1 } else { failed += 1 }
            }
            None => unfinished += 1,
        }
    }
    let ended_at = Timestamp::now();
    let wall = last.duration_since(started).as_secs_f64();
    let calls = env.sim.calls("", "").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    audit.refresh();
    let requests = audit.requests(user, started_at, ended_at);
    let held = held_places(nodes, &calls, audit, user, concurrency);
    let n = nodes.len().max(1) as f64;
    let rounds = nodes.len().div_ceil(concurrency.max(1)) as f64;
    let restart = env.spec.restart_seconds as f64;
    Ok(RefreshFigures {
        refreshes: nodes.len(),
        concurrency,
        k8sd_latency_ms: latency.as_secs_f64() * 1000.0,
        restart_seconds: restart,
        wall_seconds: wall,
        bound_seconds: rounds
            * (f64::from(CALLS_PER_WORKER_REFRESH) * latency.as_secs_f64() + restart),
        done,
        failed,
        unfinished,
        k8sd_calls_per_refresh: calls.len() as f64 / n,
        api_writes_per_refresh: requests.writes as f64 / n,
        api_requests_per_refresh: requests.other as f64 / n,
        held,
    })
}

/// Annotates `nodes` one after another (each once the previous one showed `in-progress`) and
/// measures annotate → `in-progress` as a watching user sees it.
pub async fn in_progress_latency(
    env: &Environment,
    watch: &StatusWatch,
    nodes: &[&NodeInfo],
) -> Result<LatencyFigures, Error> {
    let client = env.management().await?;
    let mut latencies = Vec::new();
    let mut missed = 0;
    for node in nodes {
        let sent = Instant::now();
        annotate(env, &client, node).await?;
        match watch
            .wait_for(
                &node.namespace,
                &node.machine,
                Duration::from_secs(10),
                |seen| seen.in_progress,
            )
            .await
        {
            Some(at) => latencies.push(at.saturating_duration_since(sent).as_secs_f64() * 1000.0),
            None => missed += 1,
        }
    }
    latencies.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        if latencies.is_empty() {
            return f64::NAN;
        }
        let index = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[index]
    };
    Ok(LatencyFigures {
        samples: latencies.len(),
        missed,
        p50_ms: quantile(0.50),
        p99_ms: quantile(0.99),
        max_ms: latencies.last().copied().unwrap_or(f64::NAN),
    })
}

/// The per-call k8sd latency on every node.
pub async fn set_k8sd_latency(env: &Environment, latency: Duration) -> Result<(), Error> {
    if !latency.is_zero() {
        env.sim.inject(&Fault::latency(latency)).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::Role;

    fn node(name: &str) -> NodeInfo {
        NodeInfo {
            cluster: "c".into(),
            namespace: "ns".into(),
            machine: format!("m-{name}"),
            node: name.into(),
            role: Role::Worker,
            address: std::net::Ipv4Addr::LOCALHOST,
            microcluster_port: 2380,
            proxy_pod: String::new(),
            config_name: format!("m-{name}-cfg"),
        }
    }

    fn call(node: &str, path: &str, at: &str, ms: f64) -> crate::sim::CallRecord {
        serde_json::from_value(json!({
            "cluster": "c", "node": node, "endpoint": "x", "method": "POST", "path": path,
            "headers": [], "body": "", "status": 200, "startedAt": at, "durationMs": ms,
        }))
        .unwrap()
    }

    fn get(user: &str, name: &str, at: &str) -> String {
        json!({
            "verb": "get", "user": { "username": user }, "stage": "ResponseComplete",
            "objectRef": { "resource": "ck8sconfigs", "namespace": "ns", "name": name },
            "requestReceivedTimestamp": at,
        })
        .to_string()
    }

    #[test]
    fn a_place_is_held_from_the_last_config_read_before_plan_to_run_s_answer() {
        use ck8s_certs::k8sd::wire::path;
        let (a, b) = (node("a"), node("b"));
        let calls = [
            call("a", path::PLAN, "2026-01-01T00:00:01Z", 50.0),
            call("a", path::RUN, "2026-01-01T00:00:01.100Z", 100.0),
            call("b", path::PLAN, "2026-01-01T00:00:02Z", 50.0),
            call("b", path::RUN, "2026-01-01T00:00:02.050Z", 150.0),
            // Not a refreshed node's: ignored.
            call("z", path::PLAN, "2026-01-01T00:00:00Z", 50.0),
        ];
        let dir = std::env::temp_dir().join(format!("held-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("audit.log");
        let lines = [
            // Read while queued, then right after taking its place: the latter counts.
            get("us", "m-a-cfg", "2026-01-01T00:00:00Z"),
            get("us", "m-a-cfg", "2026-01-01T00:00:00.800Z"),
            // After its plan (the outcome recorded): not the place taken.
            get("us", "m-a-cfg", "2026-01-01T00:00:01.300Z"),
            get("someone", "m-b-cfg", "2026-01-01T00:00:01.900Z"),
            get("us", "m-b-cfg", "2026-01-01T00:00:01.700Z"),
        ];
        std::fs::write(&log, lines.join("\n") + "\n").unwrap();
        let mut audit = AuditTail::new(log);
        audit.refresh();
        let held = held_places(&[&a, &b], &calls, &audit, "us", 2);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(held.refreshes, 2);
        // a: 200 reach, 50 plan, 50 record, 100 run = 400; b: 300, 50, 0, 150 = 500.
        let close = |x: f64, y: f64| (x - y).abs() < 0.5;
        assert!(close(held.reach_ms, 250.0), "{held:?}");
        assert!(close(held.plan_ms, 50.0), "{held:?}");
        assert!(close(held.record_ms, 25.0), "{held:?}");
        assert!(close(held.run_ms, 125.0), "{held:?}");
        assert!(close(held.held_ms, 450.0), "{held:?}");
        // 900 ms held of 2 places × (2.2 s − 0.8 s).
        assert!(close(held.places_busy * 1000.0, 900.0 / 2.8), "{held:?}");
    }
}
