//! `make bench`: what the controller costs on a fleet, side by side with a reference manager
//! built the way the CK8s bootstrap provider's is (`test/refmanager`).
//!
//! One run: the environment with a fleet of N clusters × M Machines in steady state
//! ([`fleet`]); then each contender alone against it — cold start, start-up window, idle window
//! ([`idle`]); then the controller under load — a batch of refreshes at its concurrency, and
//! annotate → `in-progress` latency ([`load`]), with many renewal policies an edit of them all
//! ([`policies`]); then a restart of the management API server
//! under the controller at rest ([`relist`]); last, two shards ([`shards`]). [`report`] prints one table with the ratios.

pub mod fleet;
pub mod idle;
pub mod load;
pub mod policies;
pub mod probe;
pub mod relist;
pub mod report;
pub mod shards;

use std::path::PathBuf;
use std::time::Duration;

/// `make bench` flags (`cargo run --release -p ck8s-certs-e2e --bin bench -- --help`).
#[derive(Clone, Debug, clap::Parser)]
#[command(about = "Measures ck8s-certs on a simulated fleet, beside a reference Go manager")]
pub struct Options {
    /// Workload clusters in the fleet (at most 250).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(1..=250))]
    pub clusters: u8,
    /// Machines per cluster (at most 250).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u8).range(1..=250))]
    pub machines: u8,
    /// Control-plane Machines per cluster; the rest are workers.
    #[arg(long, default_value_t = 3)]
    pub control_planes: usize,
    /// Latency the simulated k8sd adds to every call.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "50ms")]
    pub k8sd_latency: Duration,
    /// Length of the start-up window after each contender starts.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "120s")]
    pub startup_window: Duration,
    /// Length of the idle window that follows it.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub idle_window: Duration,
    /// Worker refreshes in the load phase (0 skips it).
    #[arg(long, default_value_t = 1000)]
    pub refreshes: usize,
    /// `--max-worker-refreshes` of the controller (unset: its default).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Annotate → in-progress samples (0 skips them).
    #[arg(long, default_value_t = 100)]
    pub latency_samples: usize,
    /// Workers annotated while a control plane of each cluster is pending, for the cost of
    /// waiting (0 skips it).
    #[arg(long, default_value_t = 1000)]
    pub waiting: usize,
    /// How long the waiting workers are measured.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "45s")]
    pub waiting_window: Duration,
    /// CertificateRenewalPolicies over the fleet (0: none): set up before the controller's first
    /// start, then every one edited at once and followed to every Machine it governs.
    #[arg(long, default_value_t = 0)]
    pub policies: usize,
    /// How long the controller is watched after a restart of the management API server (0
    /// skips the phase).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub relist_window: Duration,
    /// Finish with two shards (`--watch-filter`, deployed and labelled as docs/sharding.md
    /// says) over the fleet, each running a fleet request at once. Labels the whole fleet: last.
    #[arg(long)]
    pub shards: bool,
    /// Skip the reference manager.
    #[arg(long)]
    pub no_reference: bool,
    /// The controller binary (a release build: `cargo build --release --bin ck8s-certs`).
    #[arg(long, env = "CK8S_BENCH_CONTROLLER", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/release/ck8s-certs"))]
    pub controller: PathBuf,
    /// The reference manager binary (`make refmanager`).
    #[arg(long, env = "CK8S_BENCH_REFMANAGER", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/bin/refmanager"))]
    pub refmanager: PathBuf,
    /// Extra flags for the controller, e.g. `--controller-arg=--max-worker-refreshes-per-cluster=4`.
    #[arg(long = "controller-arg", allow_hyphen_values = true)]
    pub controller_args: Vec<String>,
    /// Keep the refresh batch's raw material in this folder: the simulated nodes' k8sd calls
    /// (`k8sd-calls.json`), the management API server's audit log and the controller's log.
    #[arg(long)]
    pub traces: Option<PathBuf>,
    /// Where the JSON results go (also printed as a table).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/bench/results.json"))]
    pub output: PathBuf,
}

/// The controller's default `--max-worker-refreshes` (`src/cli.rs`).
pub const DEFAULT_CONCURRENCY: usize = 10;

/// Runs every phase and returns the report (also written to [`Options::output`]).
pub async fn run(options: &Options) -> Result<report::Report, crate::Error> {
    use std::time::Instant;

    use crate::Error;
    use crate::fixtures::Role;

    let mut needed = vec![&options.controller];
    if !options.no_reference {
        needed.push(&options.refmanager);
    }
    for binary in needed {
        if !binary.is_file() {
            return Err(Error::Setup(format!(
                "{} is missing: run `make bench` (it builds it)",
                binary.display()
            )));
        }
    }
    let fleet = fleet::Fleet::new(
        usize::from(options.clusters),
        usize::from(options.machines),
        options.control_planes,
    );
    let machines = fleet.clusters * fleet.machines;
    eprintln!(
        "bench: starting the environment: {} clusters × {} Machines on {} workload API server(s)…",
        fleet.clusters, fleet.machines, fleet.workload_servers
    );
    let started = Instant::now();
    let env = crate::Environment::start(fleet.spec()).await?;
    let mut report = report::Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: machine_description(),
        fleet: format!(
            "{} clusters × {} Machines = {machines} ({} control planes per cluster), {} workload API server(s), CAPI {} CRDs",
            fleet.clusters,
            fleet.machines,
            fleet.control_planes,
            fleet.workload_servers,
            env.spec.capi_version.0
        ),
        environment_seconds: started.elapsed().as_secs_f64(),
        ..report::Report::default()
    };
    eprintln!(
        "bench: environment up in {:.0} s",
        report.environment_seconds
    );
    let mut audit = probe::AuditTail::new(env.dir.join("audit-management.log"));
    let policies = match options.policies {
        0 => None,
        count => {
            eprintln!("bench: {count} CertificateRenewalPolicies, Machines labelled for them…");
            Some(policies::set_up(&env, count).await?)
        }
    };

    // The first start may create status objects for every Machine: not the steady state.
    eprintln!("bench: the controller's first start (until it has been quiet for 10 s)…");
    let ours = idle::Contender::ours(&env, &options.controller, &options.controller_args)?;
    let user = ours.user.clone();
    let (seconds, writes, quiet) = first_start(&env, &mut audit, ours).await?;
    report.first_start_seconds = seconds;
    report.first_start_writes = writes;
    report.first_start_quiet = quiet;
    save(&options.output, &report)?;

    eprintln!("bench: ck8s-certs, cold start and idle…");
    let ours = idle::Contender::ours(&env, &options.controller, &options.controller_args)?;
    report.ours = idle::measure(
        &env,
        &mut audit,
        ours,
        options.startup_window,
        options.idle_window,
    )
    .await?;
    save(&options.output, &report)?;
    if !options.no_reference {
        eprintln!("bench: the reference manager, cold start and idle…");
        let reference = idle::Contender::reference(&env, &options.refmanager).await?;
        report.reference = Some(
            idle::measure(
                &env,
                &mut audit,
                reference,
                options.startup_window,
                options.idle_window,
            )
            .await?,
        );
    }

    if let Some(set) = &policies {
        eprintln!("bench: ck8s-certs, every policy edited at once…");
        let contender = idle::Contender::ours(&env, &options.controller, &options.controller_args)?;
        report.policies = Some(policies::measure_edit(&env, &mut audit, contender, set).await?);
        save(&options.output, &report)?;
    }

    if options.refreshes > 0 || options.latency_samples > 0 || options.waiting > 0 {
        eprintln!("bench: ck8s-certs under load…");
        let mut args = options.controller_args.clone();
        if let Some(c) = options.concurrency {
            args.push(format!("--max-worker-refreshes={c}"));
        }
        let contender = idle::Contender::ours(&env, &options.controller, &args)?;
        let mut process =
            crate::process::Process::spawn("bench-ck8s-certs-load", contender.command, &env.dir)?;
        wait_for_log(&mut process, contender.first_reconcile_marker).await?;
        let watch = fleet::StatusWatch::start(&env, env.management().await?).await;
        load::set_k8sd_latency(&env, options.k8sd_latency).await?;
        // Round-robin over the clusters: a batch taken cluster by cluster would be held to
        // `--max-worker-refreshes-per-cluster` (2) instead of measuring the overall concurrency.
        let per_cluster: Vec<Vec<&crate::fixtures::NodeInfo>> = env
            .clusters
            .iter()
            .map(|c| c.nodes_with_role(Role::Worker).collect())
            .collect();
        let deepest = per_cluster.iter().map(Vec::len).max().unwrap_or(0);
        let workers: Vec<&crate::fixtures::NodeInfo> = (0..deepest)
            .flat_map(|i| {
                per_cluster
                    .iter()
                    .filter_map(move |nodes| nodes.get(i).copied())
            })
            .collect();
        let batch = options.refreshes.min(workers.len());
        let samples = options.latency_samples.min(workers.len() - batch);
        if batch > 0 {
            let concurrency = options.concurrency.unwrap_or(DEFAULT_CONCURRENCY);
            let timeout = Duration::from_secs(600)
                + options.k8sd_latency * 3 * batch as u32
                + Duration::from_secs(env.spec.restart_seconds * batch as u64);
            report.refresh = Some(
                load::refresh_batch(
                    &env,
                    &mut audit,
                    &watch,
                    &user,
                    &workers[..batch],
                    concurrency,
                    options.k8sd_latency,
                    timeout,
                )
                .await?,
            );
            if let Some(dir) = &options.traces {
                keep_traces(&env, dir, &process.log).await?;
            }
        }
        if samples > 0 {
            // From the far end of the fleet: Machines no refresh has touched.
            let picked: Vec<&crate::fixtures::NodeInfo> =
                workers.iter().rev().take(samples).copied().collect();
            report.latency = Some(load::in_progress_latency(&env, &watch, &picked).await?);
        }
        let spare = &workers[batch..workers.len() - samples];
        let waiting = options.waiting.min(spare.len());
        if waiting > 0 {
            let control_planes: Vec<&crate::fixtures::NodeInfo> = env
                .clusters
                .iter()
                .filter_map(|c| c.nodes_with_role(Role::ControlPlane).next())
                .collect();
            report.waiting = Some(
                load::waiting_cost(
                    &env,
                    &mut audit,
                    &user,
                    process.pid(),
                    &control_planes,
                    &spare[..waiting],
                    options.waiting_window,
                )
                .await?,
            );
        }
        process.terminate(Duration::from_secs(30));
    }

    if !options.relist_window.is_zero() {
        eprintln!("bench: ck8s-certs across a restart of the management API server…");
        let contender = idle::Contender::ours(&env, &options.controller, &options.controller_args)?;
        report.relist =
            Some(relist::measure(&env, &mut audit, contender, options.relist_window).await?);
        save(&options.output, &report)?;
    }

    if options.shards {
        eprintln!("bench: two shards…");
        report.shards = Some(
            shards::measure(
                &env,
                &mut audit,
                &options.controller,
                &options.controller_args,
                options.startup_window,
            )
            .await?,
        );
    }

    save(&options.output, &report)?;
    env.stop();
    Ok(report)
}

/// Copies the refresh batch's k8sd calls, audit log and controller log into `dir`.
async fn keep_traces(
    env: &crate::Environment,
    dir: &std::path::Path,
    controller_log: &std::path::Path,
) -> Result<(), crate::Error> {
    use crate::Error;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let calls = env.sim.calls("", "").await?;
    let json = serde_json::to_vec(&calls).map_err(|e| Error::Setup(e.to_string()))?;
    let out = dir.join("k8sd-calls.json");
    std::fs::write(&out, json).map_err(|e| Error::io(&out, e))?;
    for (from, name) in [
        (env.dir.join("audit-management.log"), "audit-management.log"),
        (controller_log.to_path_buf(), "controller.log"),
    ] {
        std::fs::copy(&from, dir.join(name)).map_err(|e| Error::io(&from, e))?;
    }
    Ok(())
}

/// Writes the results so far: each phase's figures are kept even if a later phase fails.
fn save(output: &std::path::Path, report: &report::Report) -> Result<(), crate::Error> {
    use crate::Error;
    if let Some(parent) = output.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    let json = serde_json::to_string_pretty(report).map_err(|e| Error::Setup(e.to_string()))?;
    std::fs::write(output, json).map_err(|e| Error::io(output, e))
}

/// Runs the controller until it has been quiet (no writes) for 10 s after its first
/// reconcile; returns how long that took, how many writes it made, and whether it got quiet
/// (the wait ends after an hour: the later phases then do not meet a fleet at rest).
async fn first_start(
    env: &crate::Environment,
    audit: &mut probe::AuditTail,
    contender: idle::Contender,
) -> Result<(f64, usize, bool), crate::Error> {
    use std::time::Instant;
    let started_at = jiff::Timestamp::now();
    let started = Instant::now();
    let mut process =
        crate::process::Process::spawn("bench-ck8s-certs-first", contender.command, &env.dir)?;
    wait_for_log(&mut process, contender.first_reconcile_marker).await?;
    let quiet = jiff::SignedDuration::from_secs(10);
    let got_quiet = loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        alive(&mut process)?;
        audit.refresh();
        let now = jiff::Timestamp::now();
        let recent = audit.requests(&contender.user, now - quiet, now).writes;
        if recent == 0 && started.elapsed() > Duration::from_secs(15) {
            break true;
        }
        if started.elapsed() > Duration::from_secs(3600) {
            break false;
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    process.terminate(Duration::from_secs(30));
    audit.refresh();
    let writes = audit
        .requests(&contender.user, started_at, jiff::Timestamp::now())
        .writes;
    Ok((seconds, writes, got_quiet))
}

/// Waits (up to 5 minutes) until `marker` shows in the process's log.
async fn wait_for_log(
    process: &mut crate::process::Process,
    marker: &str,
) -> Result<(), crate::Error> {
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        alive(process)?;
        if std::fs::read_to_string(&process.log).is_ok_and(|log| log.contains(marker)) {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(crate::Error::Timeout {
                what: format!("{} to log {marker:?}", process.name),
                log: process.log_tail(30),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// CPU model and count, memory: absolute numbers move between machines.
fn machine_description() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_owned())
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().strip_suffix("kB"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    format!(
        "{cpus} × {model}, {:.0} GiB",
        memory as f64 / 1024.0 / 1024.0
    )
}

/// Whether a contender still runs; if not, the error carries its last log lines (the
/// environment's folder, and so its log, goes away with the run).
fn alive(process: &mut crate::process::Process) -> Result<(), crate::Error> {
    process
        .check_running()
        .map_err(|e| crate::Error::Setup(format!("{e}:\n{}", process.log_tail(40))))
}

/// Waits until the controller made no request (Leases aside) for 10 s, at least 15 s and at
/// most 10 minutes: what follows then meets a controller at rest.
async fn settle(
    audit: &mut probe::AuditTail,
    process: &mut crate::process::Process,
    user: &str,
) -> Result<(), crate::Error> {
    use std::time::Instant;
    let started = Instant::now();
    let quiet = jiff::SignedDuration::from_secs(10);
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        alive(process)?;
        audit.refresh();
        let now = jiff::Timestamp::now();
        let recent = audit.requests(user, now - quiet, now).other;
        if (recent == 0 && started.elapsed() > Duration::from_secs(15))
            || started.elapsed() > Duration::from_secs(600)
        {
            return Ok(());
        }
    }
}
