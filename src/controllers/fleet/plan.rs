//! The fleet planner: what a fleet request does next, as a pure function of the request, what
//! the caches show of its Machines, and the time.
//!
//! Control planes go one at a time, each only once the previous one has finished and the
//! cluster API answers; then the workers, at most `maxParallelWorkers` at once. A Machine with a
//! refresh of someone else in flight waits for it (never two refreshes of one node). The first
//! failure stops the request (Machines already running finish) unless `continueOnFailure`.

use std::time::Duration;

use ck8s_certs_api::capi::CLUSTER_NAME_LABEL;
use ck8s_certs_api::certificate_refresh::{
    CertificateRefreshSpec, CertificateRefreshStatus, DEFAULT_MAX_PARALLEL_WORKERS, MachinePhase,
    MachineProgress, RequestPhase, Role,
};
use ck8s_certs_api::duration::Ttl;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::scope::Scope;

/// What the caches show of one Machine of the request's target.
#[derive(Clone, Debug, PartialEq)]
pub struct MachineState {
    pub name: String,
    pub role: Role,
    /// The Machine has a node (k8sd to talk to).
    pub node: bool,
    /// A refresh not of this request is requested or running on it.
    pub busy: bool,
    /// It carries this request's trigger (handed over, not yet finished).
    pub handed: bool,
    /// Its refresh for this request finished (and the Machine shows it).
    pub outcome: Option<Outcome>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Succeeded { expiry: Option<Time> },
    Failed { error: String },
}

/// How the workload cluster's API server answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Answers,
    /// Not at all, or with an error.
    Down,
    /// With a certificate that expired (a cluster switched off past its expiry): control planes
    /// are reached directly and their refresh renews it; workers need it.
    CertificateExpired,
}

/// Everything the planner reads besides the request.
#[derive(Clone, Debug)]
pub struct World {
    /// The target's CK8s Machines that are not being deleted; `None` when the target (the
    /// Cluster, or the Machine) is not there.
    pub machines: Option<Vec<MachineState>>,
    /// The distinct Clusters of those Machines (a request refreshes one cluster's).
    pub clusters: Vec<String>,
    /// An earlier unfinished request of the same cluster, which runs first.
    pub earlier: Option<String>,
    /// The Cluster is paused (`spec.paused`, or the paused annotation): no Machine starts.
    pub paused: bool,
    /// How the cluster API answered just now (`None`: not asked).
    pub api_answers: Option<Api>,
    /// Whether the request may hand Machines over (its requester's rights and the admission
    /// policy it was checked by, `authority.rs`), `Err` saying why not (`None`: not asked).
    pub authority: Option<Result<(), String>>,
    /// How long to wait for the cluster API after a control plane's refresh.
    pub wait_timeout: Duration,
    /// The lifetimes a request may ask for (`--min-ttl`, `--max-ttl`).
    pub band: crate::refresh::band::TtlBand,
    pub now: Timestamp,
}

/// An Event on the Cluster (or the Machine of a one-Machine request).
#[derive(Clone, Debug, PartialEq)]
pub struct Note {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub status: CertificateRefreshStatus,
    /// Machines to hand the trigger to, after the status is written.
    pub hand: Vec<String>,
    pub notes: Vec<Note>,
    /// Whether the cluster API must answer for the next step (the caller asks, then plans again).
    pub needs_api: bool,
    /// Whether the next step hands Machines over, which the request's authority must allow
    /// (the caller checks it, then plans again).
    pub needs_authority: bool,
}

pub mod reasons {
    pub const STARTED: &str = "CertificatesFleetRefreshStarted";
    pub const QUEUED: &str = "CertificatesFleetRefreshQueued";
    pub const MACHINE_DONE: &str = "CertificatesFleetMachineRefreshed";
    pub const MACHINE_FAILED: &str = "CertificatesFleetMachineFailed";
    pub const MACHINE_SKIPPED: &str = "CertificatesFleetMachineSkipped";
    pub const SUCCEEDED: &str = "CertificatesFleetRefreshSucceeded";
    pub const FAILED: &str = "CertificatesFleetRefreshFailed";
    pub const REFUSED: &str = "CertificatesFleetRefreshRefused";
}

/// The next step of a request.
pub fn plan(spec: &CertificateRefreshSpec, old: &CertificateRefreshStatus, world: &World) -> Plan {
    let mut plan = Plan {
        status: old.clone(),
        ..Plan::default()
    };
    if old.phase.is_some_and(RequestPhase::is_finished) {
        return plan;
    }
    let now = Time(world.now);
    if old.phase.is_none() || old.machines.is_empty() {
        if let Err(message) = accept(spec, world) {
            refuse(&mut plan, message, now);
            return plan;
        }
        if let Some(earlier) = &world.earlier {
            let message = format!(
                "Queued: CertificateRefresh {earlier} runs on this cluster first; this one starts when it ends"
            );
            if plan.status.phase != Some(RequestPhase::Pending) {
                plan.notes
                    .push(note(false, reasons::QUEUED, message.clone()));
            }
            plan.status.phase = Some(RequestPhase::Pending);
            plan.status.message = Some(message);
            return plan;
        }
        match &world.authority {
            None => {
                plan.needs_authority = true;
                return plan;
            }
            Some(Err(why)) => {
                refuse(&mut plan, why.clone(), now);
                return plan;
            }
            Some(Ok(())) => {}
        }
        let machines = world.machines.as_deref().unwrap_or_default();
        plan.status.machines = ordered(machines);
        plan.status.started_at = Some(now.clone());
        plan.status.phase = Some(RequestPhase::Running);
        let (cps, workers) = count_roles(&plan.status.machines);
        plan.notes.push(note(
            false,
            reasons::STARTED,
            format!(
                "Refreshing the certificates of {cps} control plane(s) one at a time, then {workers} worker(s), for {}{}",
                spec.ttl,
                spec.requester
                    .as_ref()
                    .map(|r| format!(", asked by {}", r.username))
                    .unwrap_or_default()
            ),
        ));
    }
    follow(&mut plan, world, now.clone());
    hand_again(&mut plan, world);
    let failed = first_failure(&plan.status.machines);
    let running = count(&plan.status.machines, MachinePhase::Running);
    if let Some(failed) = failed.as_ref().filter(|_| !spec.continue_on_failure) {
        if running == 0 {
            let message = format!(
                "Stopped: the refresh of Machine {failed} failed (continueOnFailure is false); the Machines not started were skipped"
            );
            skip_pending(
                &mut plan,
                &format!("Not started: the request stopped at Machine {failed}"),
                now.clone(),
            );
            finish(&mut plan, RequestPhase::Failed, message, now);
        } else {
            plan.status.message = Some(format!(
                "Stopping: the refresh of Machine {failed} failed; waiting for the {running} running to finish"
            ));
        }
        return progress(plan);
    }
    if plan.status.machines.iter().all(|m| m.phase.is_finished()) {
        let failures = count(&plan.status.machines, MachinePhase::Failed);
        let done = count(&plan.status.machines, MachinePhase::Succeeded);
        let skipped = count(&plan.status.machines, MachinePhase::Skipped);
        let (phase, message) = if failures == 0 {
            (
                RequestPhase::Succeeded,
                format!("Refreshed {done} Machine(s); {skipped} skipped"),
            )
        } else {
            (
                RequestPhase::Failed,
                format!("{failures} Machine(s) failed, {done} refreshed, {skipped} skipped"),
            )
        };
        finish(&mut plan, phase, message, now);
        return progress(plan);
    }
    if spec.suspend {
        plan.status.phase = Some(RequestPhase::Suspended);
        plan.status.message = Some(format!(
            "Suspended: {running} running Machine(s) finish, no other starts until spec.suspend is false"
        ));
        return progress(plan);
    }
    plan.status.phase = Some(RequestPhase::Running);
    if world.paused {
        plan.status.message = Some(format!(
            "Paused with its Cluster: {running} running Machine(s) finish, no other starts until the Cluster is resumed"
        ));
        return progress(plan);
    }
    start_next(&mut plan, spec, world, now);
    progress(plan)
}

/// Checks a new request: a TTL the Machines accept, a target with CK8s Machines.
fn accept(spec: &CertificateRefreshSpec, world: &World) -> Result<(), String> {
    let target = Scope::of(&spec.target)?.describe();
    let ttl: Ttl = spec.ttl.parse().map_err(|err| {
        format!("Refused before anything started: {err}; create a new request with a valid TTL such as 1y")
    })?;
    let Some(machines) = &world.machines else {
        return Err(format!("Refused: {target} does not exist"));
    };
    if machines.is_empty() {
        return Err(format!(
            "Nothing to refresh: {target} has no CK8s Machines (bootstrapped by CK8sConfig)"
        ));
    }
    if world.clusters.len() > 1 {
        return Err(format!(
            "Refused: {target} takes Machines of {} Clusters ({}); a request refreshes the Machines of one cluster: narrow it, e.g. with the label {CLUSTER_NAME_LABEL}",
            world.clusters.len(),
            world.clusters.join(", ")
        ));
    }
    if machines.iter().any(|m| m.role == Role::Worker)
        && let Err(err) = ttl.check_worker()
    {
        return Err(format!(
            "Refused before anything started: {err}; create a new request with a TTL from 10m to 68y"
        ));
    }
    // The admission webhook refuses these with the same text; this holds where it was
    // bypassed (not installed, down, an owner's write).
    if let Some(refusal) = world.band.refuse_request(&spec.ttl) {
        return Err(refusal);
    }
    Ok(())
}

fn refuse(plan: &mut Plan, message: String, now: Time) {
    plan.notes
        .push(note(true, reasons::REFUSED, message.clone()));
    plan.status.started_at.get_or_insert(now.clone());
    plan.status.phase = Some(RequestPhase::Failed);
    plan.status.finished_at = Some(now);
    plan.status.message = Some(message);
}

/// Control planes first, each group by name.
fn ordered(machines: &[MachineState]) -> Vec<MachineProgress> {
    let mut sorted: Vec<&MachineState> = machines.iter().collect();
    sorted.sort_by(|a, b| {
        (a.role != Role::ControlPlane, &a.name).cmp(&(b.role != Role::ControlPlane, &b.name))
    });
    sorted
        .into_iter()
        .map(|m| MachineProgress {
            name: m.name.clone(),
            role: m.role,
            phase: MachinePhase::Pending,
            started_at: None,
            finished_at: None,
            new_expiry: None,
            message: None,
        })
        .collect()
}

/// Ends `entry`'s part at `now` in `phase`, saying `message`.
fn finish_machine(
    entry: &mut MachineProgress,
    phase: MachinePhase,
    now: &Time,
    message: Option<String>,
) {
    entry.phase = phase;
    entry.finished_at = Some(now.clone());
    entry.message = message;
}

/// Skips `entry` at `now`, because the Machine `why` (`is gone`): the note that says so.
fn skip(entry: &mut MachineProgress, now: &Time, why: &str) -> Note {
    let message = format!("The Machine {why}");
    finish_machine(entry, MachinePhase::Skipped, now, Some(message));
    let message = format!("Machine {} {why}: skipped", entry.name);
    note(true, reasons::MACHINE_SKIPPED, message)
}

/// Takes in what happened to the Machines since the last step.
fn follow(plan: &mut Plan, world: &World, now: Time) {
    let states = world.machines.as_deref().unwrap_or_default();
    let mut notes = Vec::new();
    for entry in &mut plan.status.machines {
        if entry.phase.is_finished() {
            continue;
        }
        let state = states.iter().find(|s| s.name == entry.name);
        match (entry.phase, state) {
            (_, None) => {
                notes.push(skip(entry, &now, "is gone"));
            }
            (MachinePhase::Running, Some(state)) => match &state.outcome {
                Some(Outcome::Succeeded { expiry }) => {
                    finish_machine(entry, MachinePhase::Succeeded, &now, None);
                    entry.new_expiry = expiry.clone();
                    notes.push(note(
                        false,
                        reasons::MACHINE_DONE,
                        format!("Machine {} refreshed", entry.name),
                    ));
                }
                Some(Outcome::Failed { error }) => {
                    finish_machine(entry, MachinePhase::Failed, &now, Some(error.clone()));
                    notes.push(note(
                        true,
                        reasons::MACHINE_FAILED,
                        format!("The refresh of Machine {} failed: {error}", entry.name),
                    ));
                }
                None => {}
            },
            (MachinePhase::Pending, Some(state)) if !state.node => {
                notes.push(skip(entry, &now, "has no node yet"));
            }
            _ => {}
        }
    }
    plan.notes.extend(notes);
}

/// A Machine marked Running whose cache shows neither the trigger nor an outcome is handed the
/// trigger again (the caller checks live first): a restart between the status write and the
/// trigger, or a cache that has not caught up.
fn hand_again(plan: &mut Plan, world: &World) {
    let states = world.machines.as_deref().unwrap_or_default();
    for entry in &plan.status.machines {
        if entry.phase == MachinePhase::Running
            && let Some(s) = states.iter().find(|s| s.name == entry.name)
            && !s.handed
            && s.outcome.is_none()
        {
            plan.hand.push(entry.name.clone());
        }
    }
}

/// Hands the trigger to the next Machines the order allows.
fn start_next(plan: &mut Plan, spec: &CertificateRefreshSpec, world: &World, now: Time) {
    let states = world.machines.as_deref().unwrap_or_default();
    let state = |name: &str| states.iter().find(|s| s.name == name);
    let machines = &plan.status.machines;
    let cp_running = machines
        .iter()
        .any(|m| m.role == Role::ControlPlane && m.phase == MachinePhase::Running);
    if cp_running {
        plan.status.message = Some("Refreshing a control plane".into());
        return;
    }
    let next_cp = machines
        .iter()
        .position(|m| m.role == Role::ControlPlane && m.phase == MachinePhase::Pending);
    let candidates: Vec<usize> = match next_cp {
        Some(i) => vec![i],
        None => {
            let limit = spec
                .max_parallel_workers
                .unwrap_or(DEFAULT_MAX_PARALLEL_WORKERS)
                .max(1) as usize;
            let running = count(machines, MachinePhase::Running);
            machines
                .iter()
                .enumerate()
                .filter(|(_, m)| m.phase == MachinePhase::Pending)
                .filter(|(_, m)| state(&m.name).is_some_and(|s| !s.busy))
                .map(|(i, _)| i)
                .take(limit.saturating_sub(running))
                .collect()
        }
    };
    if candidates.is_empty() {
        let waiting: Vec<&str> = machines
            .iter()
            .filter(|m| m.phase == MachinePhase::Pending)
            .map(|m| m.name.as_str())
            .collect();
        if !waiting.is_empty() && count(machines, MachinePhase::Running) == 0 {
            plan.status.message = Some(format!(
                "Waiting: {} ha(s) a refresh of another request in flight",
                waiting.join(", ")
            ));
        } else {
            plan.status.message = Some("Refreshing workers".into());
        }
        return;
    }
    if let Some(i) = next_cp
        && state(&machines[i].name).is_some_and(|s| s.busy)
    {
        plan.status.message = Some(format!(
            "Waiting: control plane {} has a refresh of another request in flight",
            machines[i].name
        ));
        return;
    }
    if !authority_allows(plan, world, &now) || !api_allows(plan, world, next_cp.is_some(), &now) {
        return;
    }
    for i in candidates {
        let entry = &mut plan.status.machines[i];
        entry.phase = MachinePhase::Running;
        entry.started_at = Some(now.clone());
        plan.hand.push(entry.name.clone());
    }
    plan.status.message = Some(if next_cp.is_some() {
        "Refreshing a control plane".into()
    } else {
        "Refreshing workers".into()
    });
}

/// Whether the requester's rights, as they are now, allow a hand-over; when not, the plan says
/// what happens instead (read the rights first, or stop).
fn authority_allows(plan: &mut Plan, world: &World, now: &Time) -> bool {
    match &world.authority {
        None => {
            plan.needs_authority = true;
            false
        }
        Some(Err(why)) => {
            let running = count(&plan.status.machines, MachinePhase::Running);
            if running == 0 {
                skip_pending(plan, &format!("Not started: {why}"), now.clone());
                plan.notes.push(note(true, reasons::REFUSED, why.clone()));
                let message = format!("Stopped: {why}; the Machines not started were skipped");
                finish(plan, RequestPhase::Failed, message, now.clone());
            } else {
                plan.status.message = Some(format!(
                    "Stopping: {why}; waiting for the {running} running to finish"
                ));
            }
            false
        }
        Some(Ok(())) => true,
    }
}

/// Whether the cluster API answers, as every start needs; when not, the plan says what happens
/// instead (look first, wait, or stop after the wait timeout). `control_plane`: the next start
/// is a control plane's.
fn api_allows(plan: &mut Plan, world: &World, control_plane: bool, now: &Time) -> bool {
    // Every start waits for the cluster API to answer: after a control plane's refresh k8sd
    // restarts its services, and workers need a control plane to approve them.
    // An expired API certificate does not hold a control plane back: it is reached directly,
    // and its refresh is what renews the certificate.
    let api = match (world.api_answers, control_plane) {
        (Some(Api::CertificateExpired), true) => Some(Api::Answers),
        (Some(Api::CertificateExpired), false) => Some(Api::Down),
        (api, _) => api,
    };
    match api {
        None => {
            plan.needs_api = true;
            false
        }
        Some(Api::Down | Api::CertificateExpired) => {
            let since = plan
                .status
                .machines
                .iter()
                .filter(|m| m.role == Role::ControlPlane)
                .filter_map(|m| m.finished_at.as_ref())
                .max()
                .or(plan.status.started_at.as_ref())
                .map(|t| t.0)
                .unwrap_or(world.now);
            let waited = world.now.duration_since(since);
            if waited > jiff::SignedDuration::try_from(world.wait_timeout).unwrap_or_default() {
                let message = format!(
                    "Stopped: the cluster API did not answer within {}; the Machines not started were skipped",
                    humantime::format_duration(world.wait_timeout)
                );
                skip_pending(
                    plan,
                    "Not started: the cluster API did not answer",
                    now.clone(),
                );
                finish(plan, RequestPhase::Failed, message, now.clone());
            } else {
                plan.status.message = Some("Waiting for the cluster API to answer".into());
            }
            false
        }
        Some(Api::Answers) => true,
    }
}

fn skip_pending(plan: &mut Plan, why: &str, now: Time) {
    for entry in &mut plan.status.machines {
        if entry.phase == MachinePhase::Pending {
            entry.phase = MachinePhase::Skipped;
            entry.finished_at = Some(now.clone());
            entry.message = Some(why.to_owned());
        }
    }
}

fn finish(plan: &mut Plan, phase: RequestPhase, message: String, now: Time) {
    let warning = phase != RequestPhase::Succeeded;
    let reason = if warning {
        reasons::FAILED
    } else {
        reasons::SUCCEEDED
    };
    plan.notes.push(note(warning, reason, message.clone()));
    plan.status.phase = Some(phase);
    plan.status.finished_at = Some(now);
    plan.status.message = Some(message);
}

fn progress(mut plan: Plan) -> Plan {
    let machines = &plan.status.machines;
    let finished = machines.iter().filter(|m| m.phase.is_finished()).count();
    plan.status.progress = Some(format!("{finished}/{}", machines.len()));
    plan
}

fn first_failure(machines: &[MachineProgress]) -> Option<String> {
    machines
        .iter()
        .find(|m| m.phase == MachinePhase::Failed)
        .map(|m| m.name.clone())
}

fn count(machines: &[MachineProgress], phase: MachinePhase) -> usize {
    machines.iter().filter(|m| m.phase == phase).count()
}

fn count_roles(machines: &[MachineProgress]) -> (usize, usize) {
    let cps = machines
        .iter()
        .filter(|m| m.role == Role::ControlPlane)
        .count();
    (cps, machines.len() - cps)
}

fn note(warning: bool, reason: &'static str, message: String) -> Note {
    Note {
        warning,
        reason,
        message,
    }
}
