//! The CertificateRenewalPolicy reconciler: tells the policy's author whether it is usable and
//! what it governs. Conditions `Valid` (the spec, with field paths), `Ready` (valid and not in
//! conflict with another policy over some Machine) and `PromiseKept` (the admission webhook's
//! check, `policy::promise`, for a policy written while the webhook was down or before it was
//! installed: reported only, its renewals go on), `matchedMachines`, `windowCount`. The Machine
//! reconciler applies policies; this one only reports on them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ck8s_certs_api::machine::{Cluster, Machine};
use ck8s_certs_api::reasons::events;
use ck8s_certs_api::renewal_policy::{
    CertificateRenewalPolicy, CertificateRenewalPolicyStatus, conditions, reasons,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use crate::controllers::governing_policy::{PolicyReadings, Reading, machines_in_namespace};
use crate::events::{Event, EventType, Recorder};
use crate::policy::breaker::{self as rules, Failure, Limit, Turn};
use crate::policy::promise::{self, Promise};
use crate::policy::{Backoff, spec};

mod breaker;
mod canaries;
mod start;

pub use breaker::Settings as BreakerSettings;
pub use start::start;

const MANAGER: &str = "ck8s-certs-policy";

pub struct Context {
    pub client: Client,
    pub capi: ck8s_certs_api::machine::CapiVersion,
    /// Every Machine, Cluster, policy and MachineCertificates (watch caches).
    pub machines: Store<Machine>,
    pub clusters: Store<Cluster>,
    pub policies: Store<DynamicObject>,
    pub certificates: super::stores::CertificateStore,
    pub recorder: Recorder,
    pub breakers: BreakerSettings,
    pub readings: Arc<PolicyReadings>,
    /// The time decisions are taken at.
    pub clock: crate::clock::SharedClock,
    /// How often each policy's report is computed again without a change.
    pub resync: Duration,
    /// `--renewal-backoff-min`/`-max`, which a promise is checked with.
    pub backoff: Backoff,
    /// Each policy's `PromiseKept` condition by UID, for the generation it was checked at: the
    /// check searches the windows, so it runs once per spec, not once per reconcile.
    pub promises: Promises,
}

/// The `PromiseKept` condition of a policy generation: status, reason, message.
type PromiseCondition = (&'static str, &'static str, String);

/// Checked promises by policy UID, with the generation checked.
#[derive(Default)]
pub struct Promises(Mutex<HashMap<String, (Option<i64>, PromiseCondition)>>);

impl Promises {
    /// The condition of `uid` at `generation`, checked with `check` unless known.
    fn of(
        &self,
        uid: Option<&str>,
        generation: Option<i64>,
        check: impl FnOnce() -> PromiseCondition,
    ) -> PromiseCondition {
        let Some(uid) = uid else {
            return check();
        };
        let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((checked, condition)) = known.get(uid)
            && *checked == generation
        {
            return condition.clone();
        }
        let condition = check();
        known.insert(uid.to_owned(), (generation, condition.clone()));
        condition
    }

    /// Forgets the policies that are gone, once more are known than `live` holds.
    fn forget_gone(&self, live: &[Arc<DynamicObject>]) {
        let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if known.len() > live.len() {
            let uids: std::collections::HashSet<&str> = live
                .iter()
                .filter_map(|policy| policy.metadata.uid.as_deref())
                .collect();
            known.retain(|uid, _| uids.contains(uid.as_str()));
        }
    }
}

/// `PromiseKept` for a policy (`None`: invalid), checked at `now`.
pub fn promise_condition(
    policy: Option<&spec::ValidPolicy>,
    backoff: Backoff,
    now: jiff::Timestamp,
) -> PromiseCondition {
    let Some(policy) = policy else {
        return (
            "Unknown",
            reasons::INVALID,
            "The spec is not valid (see the Valid condition): nothing to check".to_owned(),
        );
    };
    match promise::check(policy, backoff, now) {
        Ok(promise @ Promise::Nothing) => ("True", reasons::NOTHING_PROMISED, promise.to_string()),
        Ok(promise @ Promise::Kept(_)) => ("True", reasons::PROMISE_KEPT, promise.to_string()),
        Ok(promise @ Promise::Unproven(_)) => {
            ("Unknown", reasons::PROMISE_UNPROVEN, promise.to_string())
        }
        Err(broken) => (
            "False",
            reasons::PROMISE_BROKEN,
            format!(
                "Cannot keep its promise: {broken}; it renews as it says all the same (the admission webhook refuses such a policy when it is written)"
            ),
        ),
    }
}

pub fn error_policy(
    _policy: Arc<DynamicObject>,
    error: &kube::Error,
    _ctx: Arc<Context>,
) -> Action {
    tracing::warn!(error = %error, "Policy reconcile failed");
    Action::requeue(Duration::from_secs(15))
}

/// Whether a Machine change can change what a policy of its namespace reports: a new Machine,
/// other labels, another Cluster or bootstrap provider. Not its annotations or status, which
/// change with every refresh and renewal verdict: with hundreds of policies per namespace, each
/// such change re-checked them all against every Machine (docs/performance.md).
pub fn selects_differently(before: Option<&Machine>, machine: &Machine) -> bool {
    before.is_none_or(|before| {
        before.labels != machine.labels
            || before.cluster_name != machine.cluster_name
            || before.bootstrap != machine.bootstrap
    })
}

pub async fn reconcile(
    object: Arc<DynamicObject>,
    ctx: Arc<Context>,
) -> Result<Action, kube::Error> {
    let namespace = object.namespace().unwrap_or_default();
    let name = object.name_any();
    // A report computed while the Machine or Cluster cache still lists would count part of the
    // fleet, and be written, at every start.
    super::stores::synced(&ctx.machines).await;
    super::stores::synced(&ctx.clusters).await;
    let now = ctx.clock.now();
    let generation = object.metadata.generation;
    let raw = serde_json::to_value(object.as_ref()).unwrap_or_default();
    let policy: Result<CertificateRenewalPolicy, _> = serde_json::from_value(raw.clone());

    let checked = policy
        .as_ref()
        .ok()
        .map(|policy| spec::validate(&policy.spec));
    ctx.promises.forget_gone(&ctx.policies.state());
    let promised = ctx
        .promises
        .of(object.metadata.uid.as_deref(), generation, || {
            let valid = checked.as_ref().and_then(|checked| checked.as_ref().ok());
            promise_condition(valid, ctx.backoff, now)
        });
    let (valid, valid_message, window_count, selector) = validity(&policy, checked, &raw);

    let (matched, conflicts) = match &selector {
        Some(selector) => selection(&ctx, &namespace, &name, selector),
        None => Default::default(),
    };
    let (ready, ready_reason, ready_message) =
        readiness(valid, &valid_message, &conflicts, matched.len());

    // Read on its own: the status of a policy whose spec cannot be decoded is still compared,
    // so that reporting it costs one write, not one per resync.
    let old: CertificateRenewalPolicyStatus = raw
        .get("status")
        .and_then(|status| serde_json::from_value(status.clone()).ok())
        .unwrap_or_default();
    let condition = conditioner(&old, generation, now);
    let limits = (
        Limit::of_policy(
            policy
                .as_ref()
                .ok()
                .and_then(|p| p.spec.circuit_breaker.as_ref()),
        ),
        ctx.breakers.fleet,
    );
    let (breaker, turn) = breaker_at(&ctx, &object, &old, limits, now).await?;
    let (halted, halted_reason, halted_message) =
        halted_condition(breaker.as_ref(), limits, &namespace, &name);
    let canaries = ctx
        .readings
        .of(&object)
        .and_then(|reading| reading.valid().cloned())
        .and_then(|valid| canaries::report(&ctx, &object, &valid, &old, now));
    let mut status = CertificateRenewalPolicyStatus {
        observed_generation: generation,
        matched_machines: i32::try_from(matched.len()).ok(),
        window_count,
        breaker,
        conditions: vec![
            condition(
                conditions::VALID,
                truth(valid),
                if valid {
                    reasons::VALID
                } else {
                    reasons::INVALID
                },
                valid_message,
            ),
            condition(conditions::READY, truth(ready), ready_reason, ready_message),
            condition(conditions::PROMISE_KEPT, promised.0, promised.1, promised.2),
            condition(
                conditions::RENEWALS_HALTED,
                truth(halted),
                halted_reason,
                halted_message.clone(),
            ),
        ],
        canaries: None,
    };
    // The wait for pending canaries ends on its own.
    let mut after = ctx.resync;
    if let Some(report) = canaries {
        let (truth, reason, message) = report.condition;
        let passed = condition(conditions::CANARIES_PASSED, truth, reason, message);
        status.conditions.push(passed);
        status.canaries = Some(report.status);
        let left = report.until.map(|at| at.duration_since(now));
        let left = left.and_then(|left| Duration::try_from(left).ok());
        after = left.map_or(after, |left| after.min(left + Duration::from_secs(1)));
    }
    if status != old {
        write_status(&ctx, &namespace, &name, &status).await?;
    }
    announce_turn(&ctx, &object, turn, &status, limits, halted_message).await;
    // Changes of Machines, failures, renewals and the other policies are fed to this
    // controller; the resync only makes up for one missed (a policy deleted while the watch
    // was down).
    Ok(Action::requeue(after))
}

/// The policy's conditions as of `now`: each keeps its transition time from `old` while its
/// status stays.
fn conditioner<'a>(
    old: &'a CertificateRenewalPolicyStatus,
    generation: Option<i64>,
    now: jiff::Timestamp,
) -> impl Fn(&str, &str, &str, String) -> Condition + 'a {
    move |type_, status, reason, message| {
        let value = status.to_owned();
        let transition = old
            .conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == value)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or(Time(now));
        Condition {
            type_: type_.to_owned(),
            status: value,
            reason: reason.to_owned(),
            message,
            last_transition_time: transition,
            observed_generation: generation,
        }
    }
}

/// Whether the policy is valid (and the message that says so), its window count, and the
/// Machines it is meant to select: `checked` is its validation when it could be read.
fn validity(
    policy: &Result<CertificateRenewalPolicy, serde_json::Error>,
    checked: Option<Result<spec::ValidPolicy, crate::policy::InvalidPolicy>>,
    raw: &serde_json::Value,
) -> (bool, String, Option<i32>, Option<spec::MachineSelector>) {
    match policy {
        Ok(policy) => {
            let windows = i32::try_from(policy.spec.windows.len()).ok();
            match checked.unwrap_or_else(|| spec::validate(&policy.spec)) {
                Ok(valid) => (
                    true,
                    "The policy is valid".to_owned(),
                    windows,
                    Some(valid.selector.clone()),
                ),
                Err(invalid) => (
                    false,
                    invalid.to_string(),
                    windows,
                    spec::selector(&policy.spec).ok(),
                ),
            }
        }
        // Reported on the policy itself; its selectors, when readable, still tell which
        // Machines it was meant for (they show the same error).
        Err(err) => (
            false,
            format!("Renewal policy cannot be read: {err}"),
            None,
            super::governing_policy::readable_selector(raw),
        ),
    }
}

/// `RenewalsHalted`: whether the breaker is open, why, and the message.
fn halted_condition(
    breaker: Option<&ck8s_certs_api::renewal_policy::BreakerStatus>,
    limits: (Limit, Limit),
    namespace: &str,
    name: &str,
) -> (bool, &'static str, String) {
    match breaker {
        Some(open) if rules::is_open(open) => (
            true,
            match open.scope.as_deref() {
                Some("Fleet") => reasons::FLEET_BREAKER_OPEN,
                _ => reasons::BREAKER_OPEN,
            },
            rules::describe(open, limits, namespace, name, true),
        ),
        _ => (
            false,
            reasons::BREAKER_CLOSED,
            closed_message(breaker, limits),
        ),
    }
}

/// Writes the policy's status (server-side apply, as its one manager).
async fn write_status(
    ctx: &Context,
    namespace: &str,
    name: &str,
    status: &CertificateRenewalPolicyStatus,
) -> Result<(), kube::Error> {
    let apply = json!({
        "apiVersion": CertificateRenewalPolicy::api_version(&()),
        "kind": CertificateRenewalPolicy::kind(&()),
        "status": status,
    });
    Api::<DynamicObject>::namespaced_with(
        ctx.client.clone(),
        namespace,
        &ApiResource::erase::<CertificateRenewalPolicy>(&()),
    )
    .patch_status(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(apply),
    )
    .await
    .map(drop)
}

/// Announces a breaker that opened or was resumed (once the status says so).
async fn announce_turn(
    ctx: &Context,
    object: &DynamicObject,
    turn: Turn,
    status: &CertificateRenewalPolicyStatus,
    limits: (Limit, Limit),
    halted_message: String,
) {
    let (namespace, name) = (object.namespace().unwrap_or_default(), object.name_any());
    match turn {
        Turn::Stays => {}
        Turn::Opens => {
            tracing::warn!(policy = %format!("{namespace}/{name}"), "Automatic renewals halted");
            let (type_, reason) = (EventType::Warning, events::RENEWALS_HALTED);
            // An Event's note is short: the Machines and times, not each error.
            let note = status
                .breaker
                .as_ref()
                .map(|b| rules::describe(b, limits, &namespace, &name, false))
                .unwrap_or(halted_message);
            let note = crate::text::bounded(&note, 1000);
            announce(ctx, object, type_, reason, note).await;
        }
        Turn::Resumed { was_open } => {
            let note = status
                .breaker
                .as_ref()
                .map(|b| breaker::resumed_message(b, was_open))
                .unwrap_or_default();
            let (type_, reason) = (EventType::Normal, events::RENEWALS_RESUMED);
            announce(ctx, object, type_, reason, note).await;
        }
    }
}

/// The breaker of policy `object` at `now`: as its status holds it, resumed if asked, opened
/// by the failures of its Machines (or of the fleet's) within the limits.
async fn breaker_at(
    ctx: &Context,
    object: &DynamicObject,
    old: &CertificateRenewalPolicyStatus,
    limits: (Limit, Limit),
    now: jiff::Timestamp,
) -> Result<(Option<ck8s_certs_api::renewal_policy::BreakerStatus>, Turn), kube::Error> {
    let resume = breaker::resume(&ctx.client, &ctx.breakers, object, old.breaker.as_ref()).await?;
    let key = format!(
        "{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    );
    let period = limits.0.period.max(limits.1.period);
    let failed = breaker::failures(&ctx.certificates, &ctx.machines, ctx.capi, period, now);
    let ours: Vec<Failure> = failed
        .iter()
        .filter(|(policy, _)| policy.as_deref() == Some(key.as_str()))
        .map(|(_, failure)| failure.clone())
        .collect();
    let all: Vec<Failure> = failed.into_iter().map(|(_, failure)| failure).collect();
    Ok(rules::next(
        old.breaker.as_ref(),
        resume.as_ref(),
        limits,
        &ours,
        &all,
        now,
    ))
}

/// `RenewalsHalted` False: the limits, and the last resume.
fn closed_message(
    breaker: Option<&ck8s_certs_api::renewal_policy::BreakerStatus>,
    (policy, fleet): (Limit, Limit),
) -> String {
    let period =
        |limit: Limit| jiff::fmt::friendly::SpanPrinter::new().duration_to_string(&limit.period);
    let limit = |limit: Limit, whose: &str| match limit.failures {
        0 => format!("{whose}: off"),
        n => format!("{whose}: {n} failures within {}", period(limit)),
    };
    let mut message = format!(
        "Automatic renewals run; they stop after failed automatic renewals ({}; {})",
        limit(policy, "this policy"),
        limit(fleet, "the fleet"),
    );
    if let Some(breaker) = breaker
        && let (Some(at), Some(by)) = (&breaker.resumed_at, &breaker.resumed_by)
    {
        message.push_str(&format!(". Last resumed by {by} at {}", at.0));
    }
    message
}

/// Publishes an Event on the policy (a failure to publish is logged: the status says it too).
async fn announce(
    ctx: &Context,
    object: &DynamicObject,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Renew".into(),
        secondary: None,
    };
    let resource = ApiResource::erase::<CertificateRenewalPolicy>(&());
    if let Err(err) = ctx
        .recorder
        .publish(&event, &object.object_ref(&resource))
        .await
    {
        tracing::warn!(error = %err, "Publishing an Event failed");
    }
}

fn truth(value: bool) -> &'static str {
    if value { "True" } else { "False" }
}

/// The CK8s Machines of `namespace` that policy `name` selects (sorted), and by each other
/// policy of the namespace, those of them it selects too.
fn selection(
    ctx: &Context,
    namespace: &str,
    name: &str,
    selector: &spec::MachineSelector,
) -> (Vec<String>, BTreeMap<String, Vec<String>>) {
    let mut matched = Vec::new();
    let mut conflicts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let in_namespace = |o: &ObjectMeta| o.namespace.as_deref() == Some(namespace);
    // Decoded once per generation (shared with the Machine reconciler): a namespace's policies
    // are all re-checked together, each against all the others.
    let others: Vec<(String, Arc<Reading>)> = ctx
        .policies
        .state()
        .iter()
        .filter(|p| in_namespace(p.meta()))
        .filter(|p| p.name_any() != name)
        .filter_map(|p| Some((p.name_any(), ctx.readings.of(p)?)))
        .collect();
    for machine in machines_in_namespace(&ctx.machines, &ctx.clusters, namespace) {
        if !machine.machine.is_ck8s() || !machine.matched_by(selector) {
            continue;
        }
        let name = machine.machine.name_any();
        for (other, reading) in &others {
            if machine.selected_by(reading) {
                conflicts
                    .entry(other.clone())
                    .or_default()
                    .push(name.clone());
            }
        }
        matched.push(name);
    }
    // Deterministic messages.
    matched.sort();
    conflicts.values_mut().for_each(|names| names.sort());
    (matched, conflicts)
}

/// The Ready condition: invalid (`valid_message` says why), in conflict with other policies
/// over some Machines, or governing `matched` Machines.
fn readiness(
    valid: bool,
    valid_message: &str,
    conflicts: &BTreeMap<String, Vec<String>>,
    matched: usize,
) -> (bool, &'static str, String) {
    if !valid {
        return (false, reasons::INVALID, valid_message.to_owned());
    }
    if conflicts.is_empty() {
        return (
            true,
            reasons::ACTIVE,
            format!("Governs {matched} Machine(s)"),
        );
    }
    let detail: Vec<String> = conflicts
        .iter()
        .map(|(other, machines)| format!("{other} also selects {}", machines.join(", ")))
        .collect();
    (
        false,
        reasons::CONFLICT,
        format!(
            "{}: those Machines renew manually only until exactly one policy selects them",
            detail.join("; ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ck8s_certs_api::annotations::REFRESH_CERTIFICATES;

    fn machine(tier: &str, cluster: &str, annotations: serde_json::Value) -> Machine {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": { "name": "m", "namespace": "ns", "labels": { "tier": tier },
                "annotations": annotations },
            "spec": { "clusterName": cluster, "bootstrap": { "configRef": {
                "apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "CK8sConfig", "name": "m" } } },
        }))
        .expect("a Machine")
    }

    fn valid(fields: serde_json::Value) -> spec::ValidPolicy {
        let mut spec = json!({ "machineSelector": {} });
        for (key, value) in fields.as_object().unwrap() {
            spec[key] = value.clone();
        }
        spec::validate(&serde_json::from_value(spec).unwrap()).unwrap()
    }

    #[test]
    fn a_broken_promise_is_reported_not_enforced() {
        let now = "2026-11-25T12:00:00Z".parse().unwrap();
        let condition = |fields| promise_condition(Some(&valid(fields)), Backoff::default(), now);
        let (status, reason, message) =
            condition(json!({ "policy": "Automatic", "renewBefore": "12h" }));
        assert_eq!((status, reason), ("False", reasons::PROMISE_BROKEN));
        assert!(
            message.starts_with("Cannot keep its promise: renewBefore 12h leaves 0 attempts before the fail-safe point (expiry − 1d)"),
            "{message}"
        );
        assert!(message.ends_with("it renews as it says all the same (the admission webhook refuses such a policy when it is written)"));
        let (status, reason, message) = condition(json!({ "policy": "Automatic" }));
        assert_eq!((status, reason), ("True", reasons::PROMISE_KEPT));
        assert!(message.starts_with("At least 3 attempts start before the fail-safe point"));
        let (status, reason, _) = condition(json!({ "policy": "Disabled" }));
        assert_eq!((status, reason), ("True", reasons::NOTHING_PROMISED));
        let (status, reason, _) = promise_condition(None, Backoff::default(), now);
        assert_eq!((status, reason), ("Unknown", reasons::INVALID));
    }

    #[test]
    fn a_promise_is_checked_once_per_generation() {
        let promises = Promises::default();
        let checks = std::cell::Cell::new(0);
        let check = || {
            checks.set(checks.get() + 1);
            ("True", reasons::PROMISE_KEPT, String::new())
        };
        promises.of(Some("u"), Some(1), check);
        promises.of(Some("u"), Some(1), check);
        assert_eq!(checks.get(), 1);
        promises.of(Some("u"), Some(2), check);
        assert_eq!(checks.get(), 2);
        promises.forget_gone(&[]);
        promises.of(Some("u"), Some(2), check);
        assert_eq!(checks.get(), 3);
    }

    #[test]
    fn only_what_a_selector_reads_rechecks_the_policies() {
        let before = machine("edge", "c", json!({}));
        assert!(selects_differently(None, &before), "a new Machine");
        let annotated = machine("edge", "c", json!({ REFRESH_CERTIFICATES: "1y" }));
        assert_ne!(before.annotations, annotated.annotations);
        assert!(!selects_differently(Some(&before), &annotated));
        let relabelled = machine("core", "c", json!({}));
        assert!(selects_differently(Some(&before), &relabelled));
        let moved = machine("edge", "d", json!({}));
        assert!(selects_differently(Some(&before), &moved));
        let mut other_provider = before.clone();
        other_provider.bootstrap.kind = Some("KubeadmConfig".into());
        assert!(selects_differently(Some(&before), &other_provider));
    }
}
