//! The benchmark's results: one table (Markdown, so it pastes into docs/performance.md) and JSON.

use std::fmt::Write;

use super::idle::IdleFigures;
use super::load::{LatencyFigures, RefreshFigures, WaitingFigures};
use super::policies::PolicyFigures;
use super::relist::RelistFigures;
use super::shards::ShardsFigures;

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Report {
    pub command: String,
    pub machine: String,
    pub fleet: String,
    pub environment_seconds: f64,
    /// The controller's very first start on the fleet (it may create its status objects).
    pub first_start_seconds: f64,
    pub first_start_writes: usize,
    /// Whether the first start got quiet (false: cut off after an hour).
    pub first_start_quiet: bool,
    pub ours: IdleFigures,
    pub reference: Option<IdleFigures>,
    pub refresh: Option<RefreshFigures>,
    pub latency: Option<LatencyFigures>,
    pub waiting: Option<WaitingFigures>,
    pub policies: Option<PolicyFigures>,
    pub relist: Option<RelistFigures>,
    pub shards: Option<ShardsFigures>,
}

fn mib(kib: u64) -> String {
    format!("{:.0} MiB", kib as f64 / 1024.0)
}

fn seconds(s: Option<f64>) -> String {
    s.map_or("—".into(), |s| format!("{s:.2} s"))
}

fn ratio(ours: f64, theirs: f64) -> String {
    if theirs > 0.0 {
        format!("{:.2}", ours / theirs)
    } else if ours == 0.0 {
        "—".into()
    } else {
        "∞".into()
    }
}

impl Report {
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "Fleet: {}. Machine: {}.", self.fleet, self.machine);
        let _ = writeln!(out, "Command: `{}`", self.command);
        let _ = writeln!(
            out,
            "Environment up in {:.0} s; the controller's first start on the fleet: {:.0} s, {} writes{}.\n",
            self.environment_seconds,
            self.first_start_seconds,
            self.first_start_writes,
            match self.first_start_quiet {
                true => "",
                false => " (cut off before it was quiet: what follows is not the steady state)",
            }
        );
        let ours = &self.ours;
        let theirs = self.reference.clone().unwrap_or_default();
        let has_reference = self.reference.is_some();
        let _ = writeln!(out, "| | ck8s-certs | reference manager | ours / theirs |");
        let _ = writeln!(out, "|---|---|---|---|");
        let mut row = |name: &str, a: String, b: String, r: String| {
            let (b, r) = if has_reference {
                (b, r)
            } else {
                ("—".into(), "—".into())
            };
            let _ = writeln!(out, "| {name} | {a} | {b} | {r} |");
        };
        row(
            "cold start: caches synced",
            seconds(ours.ready_seconds),
            seconds(theirs.ready_seconds),
            String::new(),
        );
        row(
            "cold start: first reconcile",
            seconds(ours.first_reconcile_seconds),
            seconds(theirs.first_reconcile_seconds),
            String::new(),
        );
        let window = ours.startup_window_seconds;
        row(
            &format!("API requests in the first {window:.0} s (excl. Lease)"),
            ours.startup_requests.other.to_string(),
            theirs.startup_requests.other.to_string(),
            ratio(
                ours.startup_requests.other as f64,
                theirs.startup_requests.other as f64,
            ),
        );
        row(
            "… largest kinds",
            ours.startup_requests.top(3),
            theirs.startup_requests.top(3),
            String::new(),
        );
        row(
            "max TCP connections to the API server, start-up",
            ours.startup_connections_max.to_string(),
            theirs.startup_connections_max.to_string(),
            ratio(
                ours.startup_connections_max as f64,
                theirs.startup_connections_max as f64,
            ),
        );
        row(
            &format!("VmRSS at +{window:.0} s"),
            mib(ours.memory_after_startup.rss_kib),
            mib(theirs.memory_after_startup.rss_kib),
            ratio(
                ours.memory_after_startup.rss_kib as f64,
                theirs.memory_after_startup.rss_kib as f64,
            ),
        );
        let end = window + ours.idle_window_seconds;
        row(
            &format!("VmRSS at +{end:.0} s"),
            mib(ours.memory_after_idle.rss_kib),
            mib(theirs.memory_after_idle.rss_kib),
            ratio(
                ours.memory_after_idle.rss_kib as f64,
                theirs.memory_after_idle.rss_kib as f64,
            ),
        );
        row(
            "VmHWM (peak)",
            mib(ours.memory_after_idle.hwm_kib),
            mib(theirs.memory_after_idle.hwm_kib),
            ratio(
                ours.memory_after_idle.hwm_kib as f64,
                theirs.memory_after_idle.hwm_kib as f64,
            ),
        );
        row(
            "CPU seconds, start-up window",
            format!("{:.1}", ours.startup_cpu_seconds),
            format!("{:.1}", theirs.startup_cpu_seconds),
            ratio(ours.startup_cpu_seconds, theirs.startup_cpu_seconds),
        );
        row(
            "idle: CPU seconds per minute",
            format!("{:.2}", ours.idle_cpu_per_minute()),
            format!("{:.2}", theirs.idle_cpu_per_minute()),
            ratio(ours.idle_cpu_per_minute(), theirs.idle_cpu_per_minute()),
        );
        row(
            "idle: API requests per minute (excl. Lease)",
            format!("{:.1}", ours.idle_requests_per_minute()),
            format!("{:.1}", theirs.idle_requests_per_minute()),
            ratio(
                ours.idle_requests_per_minute(),
                theirs.idle_requests_per_minute(),
            ),
        );
        row(
            "idle: Lease requests per minute",
            format!("{:.1}", ours.idle_lease_requests_per_minute()),
            format!("{:.1}", theirs.idle_lease_requests_per_minute()),
            String::new(),
        );
        row(
            "idle: max TCP connections to the API server",
            ours.idle_connections_max.to_string(),
            theirs.idle_connections_max.to_string(),
            String::new(),
        );
        if let Some(r) = &self.refresh {
            let _ = writeln!(
                out,
                "\n{} worker refreshes at concurrency {} (k8sd latency {:.0} ms, node restart {:.0} s): \
                 {:.1} s wall, critical-path bound {:.1} s, ratio {:.2}; {} done, {} failed, {} unfinished; \
                 {:.1} k8sd calls, {:.1} API writes and {:.1} API requests per refresh.",
                r.refreshes,
                r.concurrency,
                r.k8sd_latency_ms,
                r.restart_seconds,
                r.wall_seconds,
                r.bound_seconds,
                r.wall_seconds / r.bound_seconds.max(f64::EPSILON),
                r.done,
                r.failed,
                r.unfinished,
                r.k8sd_calls_per_refresh,
                r.api_writes_per_refresh,
                r.api_requests_per_refresh,
            );
            let h = &r.held;
            let _ = writeln!(
                out,
                "A place held {:.0} ms on average ({} refreshes): reaching the node {:.0} ms, plan {:.0} ms, \
                 approver and seed record {:.0} ms, run ∥ approve {:.0} ms; the places were {:.0} % busy.",
                h.held_ms,
                h.refreshes,
                h.reach_ms,
                h.plan_ms,
                h.record_ms,
                h.run_ms,
                h.places_busy * 100.0,
            );
        }
        if let Some(w) = &self.waiting {
            let _ = writeln!(
                out,
                "\n{} workers of {} clusters waiting for their control planes: {:.2} CPU s over {:.0} s ({:.2} CPU s per minute), {} API requests, {} worker runs meanwhile.",
                w.workers,
                w.clusters,
                w.cpu_seconds,
                w.window_seconds,
                w.cpu_seconds * 60.0 / w.window_seconds.max(1.0),
                w.api_requests,
                w.worker_runs,
            );
            let at = |s: Option<f64>| s.map_or("—".to_owned(), |s| format!("{s:.1} s"));
            let _ = writeln!(
                out,
                "After the control planes were annotated: their last `plan` at {}, the first worker `run` at {} (the window: {:.1} s to {:.1} s).",
                at(w.last_control_plane_plan_seconds),
                at(w.first_worker_run_seconds),
                w.window_opened_seconds,
                w.window_opened_seconds + w.window_seconds,
            );
        }
        if let Some(l) = &self.latency {
            let _ = writeln!(
                out,
                "\nAnnotate → in-progress ({} samples, {} missed): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms.",
                l.samples, l.missed, l.p50_ms, l.p99_ms, l.max_ms
            );
        }
        if let Some(p) = &self.policies {
            let _ = writeln!(
                out,
                "\n{} CertificateRenewalPolicies governing {} Machines, every one edited at once: \
                 every verdict at the new generation in {:.1} s ({} not reached); {:.2} CPU s, \
                 {:.3} ms per Machine; {} requests ({} writes: {}).",
                p.policies,
                p.governed_machines,
                p.edit_seconds,
                p.unreached,
                p.edit_cpu_seconds,
                p.cpu_ms_per_machine(),
                p.edit_requests.other,
                p.edit_requests.writes,
                p.edit_requests.top(3),
            );
        }
        if let Some(r) = &self.relist {
            let _ = writeln!(
                out,
                "\nManagement API server restarted under the controller at rest: down {:.1} s; then {} requests \
                 ({}), {} writes, last list {} after its return, {} requests in the last {:.0} s of the \
                 {:.0} s window; {:.2} CPU s; VmRSS {} → {}, VmHWM {}; {} k8sd calls.",
                r.down_seconds,
                r.requests.other,
                r.requests.top(4),
                r.requests.writes,
                seconds(r.relist_seconds),
                r.late_requests,
                r.window_seconds / 2.0,
                r.window_seconds,
                r.cpu_seconds,
                mib(r.memory_before.rss_kib),
                mib(r.memory_after.rss_kib),
                mib(r.memory_after.hwm_kib),
                r.k8sd_calls,
            );
        }
        if let Some(s) = &self.shards {
            let _ = writeln!(
                out,
                "\nTwo shards, started at once (window {:.0} s); {} writes to objects of fleet clusters, {} of them to the other shard's:\n",
                s.startup_window_seconds, s.attributed_writes, s.wrong_shard_writes
            );
            let _ = writeln!(
                out,
                "| shard | Machines | first start after labelling: writes | first reconcile | requests in the window | VmRSS | VmHWM | CPU s | fleet request | its writes |"
            );
            let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
            for shard in &s.shards {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} | {:.2} | {} {} in {:.1} s | {} |",
                    shard.filter,
                    shard.machines,
                    shard.first_start_writes,
                    seconds(shard.first_reconcile_seconds),
                    shard.startup_requests.other,
                    mib(shard.memory.rss_kib),
                    mib(shard.memory.hwm_kib),
                    shard.startup_cpu_seconds,
                    shard.request_phase,
                    shard.request_progress,
                    shard.request_seconds,
                    shard.request_writes,
                );
            }
        }
        out
    }
}
