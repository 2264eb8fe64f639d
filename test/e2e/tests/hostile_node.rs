//! A node cannot exhaust the controller's memory: k8sd answers are read up to a cap (1 MiB), so a
//! node that streams a 100 MiB answer fails its own refresh with a message that says why, gets no
//! `run` after such a `plan`, and the controller — which serves the whole fleet — keeps a small
//! peak memory and goes on refreshing healthy nodes.

use std::time::{Duration, Instant};

use ck8s_certs::k8sd::client::MAX_ANSWER_BYTES;
use ck8s_certs::k8sd::wire::path;
use ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS;
use ck8s_certs_e2e::fixtures::NodeInfo;
use ck8s_certs_e2e::sim::{Endpoint, Fault};
use ck8s_certs_e2e::{Environment, shared};

const TIMEOUT: Duration = Duration::from_secs(90);
/// What the hostile node answers: 100 times the cap.
const HUGE: u64 = 100 << 20;
/// The controller's peak resident memory must stay far below the answer it was sent.
const PEAK_BOUND_KIB: u64 = 200 << 10;

/// `VmHWM` (peak resident set) of a process, in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|line| {
            line.strip_prefix("VmHWM:")?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .expect("VmHWM in /proc/<pid>/status")
}

/// Says the answer was too large: not a decode error of a body read in full.
fn assert_too_large(error: &str, step: &str) {
    assert!(
        error.contains(&format!("Refreshing failed at {step}"))
            && error.contains(&format!("larger than {MAX_ANSWER_BYTES} bytes"))
            && !error.contains("not a k8sd envelope")
            && !error.contains("unexpected metadata"),
        "{error}"
    );
}

/// What the node simulator logged of its huge answers: the bytes it got out before the client
/// left, one entry per answer so far.
fn huge_answers_sent(env: &Environment) -> Vec<u64> {
    let log = std::fs::read_to_string(env.dir.join("nodesim.log")).unwrap_or_default();
    log.lines()
        .filter_map(|line| {
            let rest = line.split("k8sd huge answer: ").nth(1)?;
            rest.split(' ').next()?.parse().ok()
        })
        .collect()
}

/// Injects `fault` on `node`, annotates a refresh and waits for it to fail; says how long that
/// took. Returns the failure.
async fn failure_with(env: &Environment, node: &NodeInfo, fault: Fault, what: &str) -> String {
    let started = Instant::now();
    env.sim.inject(&fault.on(node)).await.unwrap();
    env.annotate_refresh(node, "1y").await;
    let error = env.refresh_failure(node, TIMEOUT).await;
    println!("{what}: failed after {:?}: {error}", started.elapsed());
    error
}

async fn wait_for_huge_answers(env: &Environment, count: usize) -> Vec<u64> {
    let start = Instant::now();
    loop {
        let sent = huge_answers_sent(env);
        if sent.len() >= count || start.elapsed() > TIMEOUT {
            return sent;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_node_answering_100_mib_fails_its_refresh_without_exhausting_the_controller() {
    let env = shared().await;
    let machines = ["alpha-md-0-w0", "alpha-cp-1", "alpha-md-0-w1"];
    let [hostile_worker, hostile_control_plane, healthy] =
        env.isolated("alpha", machines, "hostile").await;
    let mut controller = env.start_controller("hostile", &[]);
    controller.wait_until_ready(TIMEOUT).await;
    let started_kib = peak_kib(controller.process.pid());

    // A worker whose plan answers 100 MiB (200, a k8sd envelope padded inside a string).
    let huge_plan = Fault::huge(HUGE).at(Endpoint::Plan);
    let plan_error = failure_with(&env, &hostile_worker, huge_plan, "huge plan answer").await;
    let calls = env.calls(&hostile_worker).await;
    let plans: Vec<_> = calls.iter().filter(|c| c.path == path::PLAN).collect();
    assert!(
        !plans.is_empty() && plans.iter().all(|c| c.fault == "huge"),
        "{calls:#?}"
    );
    assert!(
        calls.iter().all(|c| c.path != path::RUN),
        "a run followed a huge plan answer: {calls:#?}"
    );
    println!("plan calls to the hostile worker: {}", plans.len());

    // A control plane whose run answers a 100 MiB error (500): error bodies are capped too.
    let huge_error = Fault::huge(HUGE).with_status(500).at(Endpoint::Run);
    let run_error = failure_with(
        &env,
        &hostile_control_plane,
        huge_error,
        "huge run error answer",
    )
    .await;
    let runs: Vec<_> = env
        .calls(&hostile_control_plane)
        .await
        .into_iter()
        .filter(|c| c.path == path::RUN)
        .collect();
    assert!(
        !runs.is_empty() && runs.iter().all(|c| c.fault == "huge" && c.status == 500),
        "{runs:#?}"
    );

    // What the nodes got out: the controller hung up long before the end, not drained them.
    let sent = wait_for_huge_answers(&env, plans.len() + runs.len()).await;
    println!("bytes the node got out before the controller hung up: {sent:?} of {HUGE} each");

    let peak = peak_kib(controller.process.pid());
    println!(
        "controller VmHWM: {} KiB ({} MiB) after the huge answers, {} KiB once ready; bound {} MiB",
        peak,
        peak >> 10,
        started_kib,
        PEAK_BOUND_KIB >> 10
    );
    assert_too_large(&plan_error, "plan");
    assert_too_large(&run_error, "run");
    assert_eq!(sent.len(), plans.len() + runs.len(), "{sent:?}");
    assert!(sent.iter().all(|&n| n < HUGE), "{sent:?}");
    assert!(peak < PEAK_BOUND_KIB, "VmHWM {peak} KiB");
    // It never held an answer: its peak grew by far less than one of them.
    assert!(
        (peak - started_kib) << 10 < HUGE / 2,
        "VmHWM grew from {started_kib} to {peak} KiB"
    );

    // The controller keeps working: a healthy worker is refreshed.
    controller
        .process
        .check_running()
        .expect("controller alive");
    env.annotate_refresh(&healthy, "1y").await;
    let annotations = env.wait_for_refresh(&healthy, TIMEOUT).await;
    assert_eq!(
        annotations[REFRESH_CERTIFICATES_STATUS], "done",
        "{annotations:#?}"
    );
    let calls = env.calls(&healthy).await;
    assert!(calls.iter().all(|c| c.fault.is_empty()), "{calls:#?}");
    println!(
        "controller VmHWM at the end: {} KiB",
        peak_kib(controller.process.pid())
    );
}
