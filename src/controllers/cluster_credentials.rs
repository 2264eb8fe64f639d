//! Each Cluster with CK8s Machines, as its `ClusterCertificates` shows it:
//! - the management kubeconfig: when its certificates expire, a metric, and Warning Events on
//!   the Cluster ahead of time (`--kubeconfig-expiry-warning`). The Secret is read by name (least
//!   privilege: `get`, no watch), once per Cluster at start-up and then every
//!   `--kubeconfig-check-interval` (jittered per Cluster), and exactly when a certificate crosses
//!   the warning horizon or expires;
//! - what has already expired on its nodes, from its Machines' records, and how long its CA has
//!   left ([`expired`]).
//!
//! Nothing is written unless the answer changes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::events::{Event, EventType, Recorder};
use ck8s_certs_api::capi::{CLUSTER_NAME_LABEL, kubeconfig_secret_name};
use ck8s_certs_api::cluster_certificates::{
    CA_RUNWAY, CERTIFICATES_EXPIRED, ClusterCertificates, ClusterCertificatesStatus,
    KUBECONFIG_RENEWAL, KubeconfigStatus, NodesStatus, expired_reasons, reasons,
};
use ck8s_certs_api::machine::{CapiVersion, Cluster, Machine, MachineView};
use ck8s_certs_api::reasons::events;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use crate::metrics::{ClusterLabels, KubeconfigLabels, Metrics};
use crate::workload::WorkloadError;
use crate::workload::client_certificate::{self, Held, Refusal};
use crate::workload::credentials::{Certificate, KubeconfigExpiry, kubeconfig_expiry};
use expired::{Nodes, Verdict};

mod expired;
mod renewal;
mod start;

pub use renewal::Config as RenewalConfig;
pub use start::start;

const MANAGER: &str = "ck8s-certs-kubeconfig";

/// A reading younger than this is reused.
const RECHECK_AFTER: Duration = Duration::from_secs(600);

#[derive(Clone, Debug)]
pub struct Config {
    /// Warn this long before a certificate expires.
    pub warning: SignedDuration,
    /// Read each Secret at least this often.
    pub interval: Duration,
    /// Announce the cluster CA's end this long before it (`--ca-runway-warning`).
    pub ca_runway: SignedDuration,
    /// What the kubeconfig may use: one the refreshes would refuse is reported as unreadable.
    pub vetting: crate::workload::Vetting,
    /// `--renew-management-kubeconfig`, `--kubeconfig-renew-before`.
    pub renewal: RenewalConfig,
}

pub struct Context {
    /// The last reading per Cluster: Cluster and record events within [`RECHECK_AFTER`] (or the
    /// check interval, when shorter) of it
    /// are answered from it, so a busy Cluster (status updates) costs no extra reads.
    pub readings: Mutex<HashMap<(String, String), (std::time::Instant, Reading)>>,
    /// The last renewal attempt per Cluster: a due certificate that was not renewed is tried
    /// again no sooner than [`RECHECK_AFTER`] (a minute after a transient failure), however
    /// often the Cluster changes.
    pub attempts: Mutex<HashMap<(String, String), (std::time::Instant, renewal::Report)>>,
    /// What the workload API server's certificate looked like at the last fresh reading.
    pub api: Mutex<HashMap<(String, String), expired::Api>>,
    pub client: Client,
    pub capi: CapiVersion,
    pub machines: Store<Machine>,
    pub records: Store<ClusterCertificates>,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub config: Config,
    /// The time decisions are taken at.
    pub clock: crate::clock::SharedClock,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

impl Error {
    /// The `category` label of `ck8s_certs_reconcile_errors_total`.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Workload(_) => "workload",
            Self::Kube(_) => "kube",
        }
    }
}

pub fn error_policy(_cluster: Arc<Cluster>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %error, "Checking a management kubeconfig failed");
    Action::requeue(Duration::from_secs(60))
}

/// What the Secret told.
#[derive(Clone, Debug, PartialEq)]
pub enum Reading {
    Missing,
    Unreadable(String),
    Read {
        expiry: KubeconfigExpiry,
        /// Its client certificate, if the kubeconfig has the CK8s control-plane provider's
        /// shape (what renewal needs).
        held: Result<Held, Refusal>,
    },
}

/// The `Ready` condition's reason and message for `reading` at `now`; a warning Event reason
/// for the states an operator must act on.
pub fn verdict(
    reading: &Reading,
    secret: &str,
    warning: SignedDuration,
    now: Timestamp,
) -> (bool, &'static str, String, Option<&'static str>) {
    match reading {
        Reading::Missing => (
            false,
            reasons::MISSING,
            format!("Secret {secret} not found (the cluster may still be provisioning)"),
            None,
        ),
        Reading::Unreadable(reason) => (
            false,
            reasons::UNREADABLE,
            format!("The kubeconfig in Secret {secret} cannot be read: {reason}"),
            None,
        ),
        Reading::Read { expiry, .. } => match expiry
            .first()
            .map(|(which, at)| (placed(which, secret), at))
        {
            Some((which, at)) if at <= now => (
                false,
                reasons::EXPIRED,
                format!(
                    "The {which} expired at {at}: every certificate refresh of this cluster fails until the kubeconfig is renewed"
                ),
                Some(events::KUBECONFIG_EXPIRED),
            ),
            Some((which, at)) if at.duration_since(now) <= warning => (
                false,
                reasons::EXPIRING_SOON,
                format!(
                    "The {which} expires at {at}, in {:#}: then every certificate refresh of this cluster fails. Renew the kubeconfig before then",
                    round_to_hours(at.duration_since(now))
                ),
                Some(events::KUBECONFIG_EXPIRING),
            ),
            Some((which, at)) => (
                true,
                reasons::VALID,
                format!("The {which} expires at {at}"),
                None,
            ),
            None => (
                true,
                reasons::VALID,
                format!("The kubeconfig in Secret {secret} holds no certificate that expires"),
                None,
            ),
        },
    }
}

/// Which certificate, and where: "client certificate in Secret ns/c-kubeconfig", or the client
/// CA's own Secret.
fn placed(which: Certificate, secret: &str) -> String {
    match which {
        Certificate::ClientCa => format!(
            "{} in Secret {}-cca (it signs the client certificate of {secret})",
            which.describe(),
            secret.strip_suffix("-kubeconfig").unwrap_or(secret)
        ),
        _ => format!("{} in Secret {secret}", which.describe()),
    }
}

fn round_to_hours(duration: SignedDuration) -> jiff::Span {
    let hours = duration.as_secs().max(0) / 3600;
    jiff::Span::new().days(hours / 24).hours(hours % 24)
}

/// When to read the Secret again: at the next interval (jittered by up to a tenth, per
/// Cluster, so a fleet's reads spread out), or when a certificate crosses the warning horizon
/// or expires, whichever is first; never sooner than a minute.
pub fn next_check(
    reading: &Reading,
    warning: SignedDuration,
    interval: Duration,
    jitter_key: &str,
    now: Timestamp,
) -> Duration {
    let tenth = interval.as_secs() / 10;
    let jitter = if tenth == 0 {
        0
    } else {
        fnv1a(jitter_key) % tenth
    };
    let mut next = interval.saturating_sub(Duration::from_secs(jitter));
    if let Reading::Read { expiry, .. } = reading
        && let Some((_, at)) = expiry.first()
    {
        for instant in [at.checked_sub(warning).unwrap_or(at), at] {
            if instant > now
                && let Ok(until) = Duration::try_from(instant.duration_since(now))
            {
                next = next.min(until);
            }
        }
    }
    next.max(Duration::from_secs(60))
}

/// A stable hash (FNV-1a): the same jitter in every process and release.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The conditions besides the kubeconfig's renewal, and the Machines' records.
#[derive(Clone, Debug)]
pub struct Checks {
    pub ready: Verdict,
    pub expired: Verdict,
    pub runway: Verdict,
    pub nodes: NodesStatus,
}

/// The status showing `reading`, the `checks` and, with renewal on, its last `renewal` report;
/// conditions keep their transition time while unchanged.
pub fn status_for(
    old: &ClusterCertificatesStatus,
    reading: &Reading,
    secret: &str,
    checks: &Checks,
    renewal: Option<&renewal::Report>,
    now: Timestamp,
) -> ClusterCertificatesStatus {
    let expiry = match reading {
        Reading::Read { expiry, .. } => *expiry,
        _ => KubeconfigExpiry::default(),
    };
    let old_kubeconfig = old.kubeconfig.as_ref();
    // Ready first: it is what `kubectl get` shows and what the Events compare with.
    let mut conditions = vec![condition(old, "Ready", &checks.ready, now)];
    if let Some(report) = renewal {
        let verdict = Verdict {
            status: if report.ok { "True" } else { "False" },
            reason: report.reason,
            message: report.message.clone(),
        };
        conditions.push(condition(old, KUBECONFIG_RENEWAL, &verdict, now));
    }
    conditions.push(condition(old, CERTIFICATES_EXPIRED, &checks.expired, now));
    conditions.push(condition(old, CA_RUNWAY, &checks.runway, now));
    ClusterCertificatesStatus {
        kubeconfig: Some(KubeconfigStatus {
            secret: secret.to_owned(),
            client_certificate_expiry: expiry.client.map(Time),
            certificate_authority_expiry: expiry.ca.map(Time),
            client_certificate_authority_expiry: expiry.client_ca.map(Time),
            last_renewal_time: renewal
                .and_then(|r| r.renewed.map(Time))
                .or_else(|| old_kubeconfig.and_then(|k| k.last_renewal_time.clone())),
            next_renewal_time: renewal.and_then(|r| r.next.map(Time)),
        }),
        nodes: Some(checks.nodes.clone()),
        conditions,
    }
}

/// A condition of type `type_`, keeping its transition time from `old` while its status holds.
fn condition(
    old: &ClusterCertificatesStatus,
    type_: &str,
    verdict: &Verdict,
    now: Timestamp,
) -> Condition {
    let transition = old
        .conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == verdict.status)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.into(),
        status: verdict.status.to_owned(),
        reason: verdict.reason.to_owned(),
        message: verdict.message.clone(),
        last_transition_time: transition,
        observed_generation: None,
    }
}

/// The reason `status` gives condition `type_`.
fn reason_of<'a>(status: &'a ClusterCertificatesStatus, type_: &str) -> Option<&'a str> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.reason.as_str())
}

/// The CK8s Machines of this shard that belong to the Cluster: only Clusters with some are
/// checked (and so exactly one shard checks each).
fn ck8s_machines(machines: &Store<Machine>, namespace: &str, cluster: &str) -> Vec<MachineView> {
    machines
        .state()
        .iter()
        .filter(|m| {
            m.metadata.namespace.as_deref() == Some(namespace) && m.cluster() == Some(cluster)
        })
        .map(|m| MachineView::of(m))
        .filter(MachineView::is_ck8s)
        .collect()
}

pub async fn reconcile(cluster: Arc<Cluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    if cluster.metadata.deletion_timestamp.is_some() {
        forget(&ctx, &namespace, &name);
        return Ok(Action::await_change());
    }
    let machines = ck8s_machines(&ctx.machines, &namespace, &name);
    if machines.is_empty() {
        forget(&ctx, &namespace, &name);
        // Its Machines may come later without the Cluster changing: look again now and then
        // (from the cache: no read).
        return Ok(Action::requeue(ctx.config.interval));
    }
    let now = ctx.clock.now();
    let secret = format!("{namespace}/{}", kubeconfig_secret_name(&name));
    let key = (namespace.clone(), name.clone());
    let record = ctx
        .records
        .get(&kube::runtime::reflector::ObjectRef::new(&name).within(&namespace));
    let old = record
        .as_ref()
        .and_then(|r| r.status.clone())
        .unwrap_or_default();
    let mut reading = reading(&ctx, &key, &old, now).await?;
    let (report, retry) = renew_if_due(&ctx, &key, &mut reading, &secret, now).await?;
    export(&ctx.metrics, &namespace, &name, &reading);

    let (ready, reason, message, warn) = verdict(&reading, &secret, ctx.config.warning, now);
    let nodes = Nodes::of(&machines, now);
    let api = ctx
        .api
        .lock()
        .ok()
        .and_then(|probes| probes.get(&key).copied())
        .unwrap_or_default();
    let ca_end = match &reading {
        Reading::Read { expiry, .. } => expiry.ca,
        _ => None,
    };
    let checks = Checks {
        ready: Verdict {
            status: if ready { "True" } else { "False" },
            reason,
            message: message.clone(),
        },
        expired: expired::expired_verdict(&nodes, api),
        runway: expired::runway_verdict(ca_end, ctx.config.ca_runway, now),
        nodes: nodes.status(),
    };
    export_expired(
        &ctx.metrics,
        &namespace,
        &name,
        expired::expired_since(&nodes, api),
    );
    let status = status_for(&old, &reading, &secret, &checks, report.as_ref(), now);
    let renewal_was = reason_of(&old, KUBECONFIG_RENEWAL);
    if status != old {
        let warning = warn.map(|event| (event, reason, message));
        show(
            &ctx,
            &cluster,
            record.is_none(),
            &old,
            &status,
            &checks,
            warning,
        )
        .await?;
    }
    if let Some(report) = &report
        && let Some((kind, event, note)) = &report.event
        && (report.renewed.is_some() || renewal_was != Some(report.reason))
    {
        publish(
            &ctx,
            &cluster,
            *kind,
            event,
            note.clone(),
            "RenewKubeconfig",
        )
        .await;
    }
    let next = next_check(
        &reading,
        ctx.config.warning,
        ctx.config.interval,
        cluster.uid().as_deref().unwrap_or(&name),
        now,
    );
    let renewal_due = report.as_ref().and_then(|r| r.next);
    // A recorded expiry passing or the CA crossing the horizon changes a condition by the
    // clock alone.
    let changes = expired::next_change(&nodes, ca_end, ctx.config.ca_runway, now);
    Ok(Action::requeue(sooner(
        next,
        renewal_due,
        retry,
        changes,
        now,
    )))
}

/// The reading of the Cluster's kubeconfig: a recent one kept, else read now (`old`, the
/// status shown, gives the client CA's end recorded).
async fn reading(
    ctx: &Context,
    key: &(String, String),
    old: &ClusterCertificatesStatus,
    now: Timestamp,
) -> Result<Reading, Error> {
    let recent = ctx.readings.lock().ok().and_then(|readings| {
        readings
            .get(key)
            // A shorter check interval asks for fresher readings.
            .filter(|(at, _)| at.elapsed() < RECHECK_AFTER.min(ctx.config.interval))
            .map(|(_, reading)| reading.clone())
    });
    match recent {
        Some(reading) => Ok(reading),
        None => {
            let recorded_ca = old
                .kubeconfig
                .as_ref()
                .and_then(|k| k.client_certificate_authority_expiry.as_ref())
                .map(|t| t.0);
            fresh_reading(ctx, key, recorded_ca, now).await
        }
    }
}

/// Writes `status` (creating the record when there is `none` yet) and announces what changed
/// from `old`: the kubeconfig's `warning` (Event, the reason it shows, its message) when its
/// reason is new, and each check's changed condition.
async fn show(
    ctx: &Context,
    cluster: &Cluster,
    none: bool,
    old: &ClusterCertificatesStatus,
    status: &ClusterCertificatesStatus,
    checks: &Checks,
    warning: Option<(&'static str, &'static str, String)>,
) -> Result<(), Error> {
    let name = cluster.name_any();
    let api: Api<ClusterCertificates> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    if none {
        create(&api, cluster, &ctx.capi).await?;
    }
    let apply = json!({
        "apiVersion": ClusterCertificates::api_version(&()),
        "kind": ClusterCertificates::kind(&()),
        "status": status,
    });
    api.patch_status(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(apply),
    )
    .await?;
    let was = old.conditions.first().map(|c| c.reason.as_str());
    if let Some((event, reason, message)) = warning
        && was != Some(reason)
    {
        publish(
            ctx,
            cluster,
            EventType::Warning,
            event,
            message,
            "CheckKubeconfig",
        )
        .await;
    }
    for (kind, event, note) in condition_events(old, checks) {
        publish(ctx, cluster, kind, event, note, "CheckCertificates").await;
    }
    Ok(())
}

/// The soonest of the next check, the kubeconfig renewal's due time (at least a minute away),
/// a failed step's retry and the next change of a condition by the clock (at least a second
/// away).
fn sooner(
    next: Duration,
    renewal_due: Option<Timestamp>,
    retry: Option<Duration>,
    changes: Option<Timestamp>,
    now: Timestamp,
) -> Duration {
    let until = |at: Timestamp| Duration::try_from(at.duration_since(now)).ok();
    let mut next = next;
    if let Some(until) = renewal_due.and_then(until) {
        next = next.min(until.max(Duration::from_secs(60)));
    }
    if let Some(retry) = retry {
        next = next.min(retry);
    }
    if let Some(until) = changes.and_then(until) {
        next = next.min(until.max(Duration::from_secs(1)));
    }
    next
}

/// The management kubeconfig's renewal, when it is due: its report (`None`: nothing to say),
/// and how soon to look again after a failure. A renewed Secret is read again into `reading`;
/// the client CA's end a renewal read is kept in it.
async fn renew_if_due(
    ctx: &Context,
    key: &(String, String),
    reading: &mut Reading,
    secret: &str,
    now: Timestamp,
) -> Result<(Option<renewal::Report>, Option<Duration>), Error> {
    let mut retry = None;
    let report = match renewal::plan(ctx.config.renewal, reading, secret, now) {
        renewal::Plan::Silent => None,
        renewal::Plan::Report(report) => Some(report),
        renewal::Plan::Due => {
            let report = attempt(ctx, key, now).await;
            let known = match &*reading {
                Reading::Read { expiry, .. } => expiry.client_ca,
                _ => None,
            };
            let client_ca = report.client_ca_end.or(known);
            if report.renewed.is_some() {
                // What the Secret holds now (signed by the same client CA).
                *reading = fresh_reading(ctx, key, client_ca, now).await?;
            } else {
                if let Reading::Read { expiry, .. } = reading {
                    expiry.client_ca = client_ca;
                }
                // Kept where the next checks read from too, else they would show it unknown.
                if let Ok(mut readings) = ctx.readings.lock()
                    && let Some((_, kept)) = readings.get_mut(key)
                {
                    *kept = reading.clone();
                }
                if !report.ok {
                    retry = Some(if report.transient() {
                        Duration::from_secs(60)
                    } else {
                        RECHECK_AFTER
                    });
                }
            }
            Some(report)
        }
    };
    Ok((report, retry))
}

/// Reads the Secret and keeps the reading for [`RECHECK_AFTER`]; with renewal on, also the
/// client CA's end: `client_ca` when it is known (the record's status, a renewal's reading),
/// else read once from `<cluster>-cca` (unless a renewal is due, which reads it). That Secret
/// holds the CA's key, so it is read only then and when a renewal is due, not at every check.
async fn fresh_reading(
    ctx: &Context,
    key: &(String, String),
    client_ca: Option<Timestamp>,
    now: Timestamp,
) -> Result<Reading, Error> {
    let renewing = ctx.config.renewal.mode != client_certificate::Mode::Off;
    let (mut reading, kubeconfig) =
        read(&ctx.client, &key.0, &key.1, ctx.config.vetting, renewing).await?;
    let api = match kubeconfig {
        Some(kubeconfig) => probe_api(kubeconfig, now).await,
        None => expired::Api::Unknown,
    };
    if let Ok(mut probes) = ctx.api.lock() {
        probes.insert(key.clone(), api);
    }
    // The client CA's end, which no renewal can go past: only when renewal is on and the
    // kubeconfig is one it renews.
    if renewing
        && let Reading::Read {
            expiry,
            held: Ok(held),
        } = &mut reading
    {
        expiry.client_ca = match client_ca {
            Some(known) => Some(known),
            // Due: the renewal reads it (once) and tells.
            None if held.due_at(ctx.config.renewal.renew_before) <= now => None,
            None => client_ca_expiry(&ctx.client, &key.0, &key.1).await?,
        };
    }
    if let Ok(mut readings) = ctx.readings.lock() {
        readings.insert(key.clone(), (std::time::Instant::now(), reading.clone()));
    }
    Ok(reading)
}

/// A renewal of a due certificate, unless one was tried lately: a certificate that could not
/// be renewed is tried again after [`RECHECK_AFTER`] (a minute after a transient failure), not
/// at every change of its Cluster.
async fn attempt(ctx: &Context, key: &(String, String), now: Timestamp) -> renewal::Report {
    let recent = ctx.attempts.lock().ok().and_then(|attempts| {
        attempts
            .get(key)
            .filter(|(at, report)| {
                let wait = if report.transient() {
                    Duration::from_secs(60)
                } else {
                    RECHECK_AFTER
                };
                at.elapsed() < wait
            })
            .map(|(_, report)| report.clone())
    });
    if let Some(report) = recent {
        return report;
    }
    let report = renewal::renew(ctx, &key.0, &key.1, ctx.config.renewal, now).await;
    let result = match report.reason {
        _ if report.renewed.is_some() => "renewed",
        ck8s_certs_api::cluster_certificates::renewal_reasons::WOULD_RENEW => "dry_run",
        ck8s_certs_api::cluster_certificates::renewal_reasons::NOT_DUE => "not_due",
        _ if report.transient() => "failed",
        _ => "refused",
    };
    ctx.metrics
        .kubeconfig_renewals
        .get_or_create(&crate::metrics::ResultLabels {
            result: result.to_owned(),
        })
        .inc();
    if let Ok(mut attempts) = ctx.attempts.lock() {
        attempts.insert(key.clone(), (std::time::Instant::now(), report.clone()));
    }
    report
}

/// The Events the `checks` call for against the `old` status: once per change of reason, a
/// Warning when the cluster's certificates have expired or its CA runs short, a Normal Event
/// when they no longer are.
fn condition_events(
    old: &ClusterCertificatesStatus,
    checks: &Checks,
) -> Vec<(EventType, &'static str, String)> {
    let mut out = Vec::new();
    let was_expired = reason_of(old, CERTIFICATES_EXPIRED);
    if was_expired != Some(checks.expired.reason) {
        match checks.expired.status {
            "True" => out.push((
                EventType::Warning,
                events::CLUSTER_CERTIFICATES_EXPIRED,
                checks.expired.message.clone(),
            )),
            _ if was_expired == Some(expired_reasons::NODE_CERTIFICATES_EXPIRED) => out.push((
                EventType::Normal,
                events::CLUSTER_CERTIFICATES_RECOVERED,
                format!(
                    "No Machine of this cluster records expired certificates any more. {}",
                    checks.expired.message
                ),
            )),
            _ => {}
        }
    }
    if reason_of(old, CA_RUNWAY) != Some(checks.runway.reason) && checks.runway.status == "False" {
        out.push((
            EventType::Warning,
            events::CLUSTER_CA_ENDING,
            checks.runway.message.clone(),
        ));
    }
    out
}

async fn publish(
    ctx: &Context,
    cluster: &Cluster,
    type_: EventType,
    reason: &str,
    note: String,
    action: &str,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    if let Err(err) = ctx
        .recorder
        .publish(&event, &cluster.object_ref(&ctx.capi))
        .await
    {
        tracing::warn!(error = %err, "Publishing an Event failed");
    }
}

/// Drops what is known of a Cluster that is going or has no CK8s Machines left: its reading and
/// its expiry series (the shipped alerts would otherwise fire for a cluster that is gone).
fn forget(ctx: &Context, namespace: &str, cluster: &str) {
    let key = (namespace.to_owned(), cluster.to_owned());
    if let Ok(mut readings) = ctx.readings.lock() {
        readings.remove(&key);
    }
    if let Ok(mut attempts) = ctx.attempts.lock() {
        attempts.remove(&key);
    }
    if let Ok(mut probes) = ctx.api.lock() {
        probes.remove(&key);
    }
    export(&ctx.metrics, namespace, cluster, &Reading::Missing);
    export_expired(&ctx.metrics, namespace, cluster, None);
}

/// How often [`sweep`] runs.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// Forgets the Clusters that left the cache (deleted): a deleted object is never reconciled.
pub fn sweep(ctx: &Context, clusters: &Store<Cluster>) {
    let gone: Vec<(String, String)> = match ctx.readings.lock() {
        Ok(readings) => readings
            .keys()
            .filter(|(namespace, name)| {
                let key =
                    kube::runtime::reflector::ObjectRef::new_with(name, ctx.capi).within(namespace);
                clusters.get(&key).is_none()
            })
            .cloned()
            .collect(),
        Err(_) => return,
    };
    for (namespace, name) in gone {
        tracing::debug!(
            namespace,
            cluster = name,
            "Cluster gone: its kubeconfig expiry series too"
        );
        forget(ctx, &namespace, &name);
    }
}

/// How long the workload API server is given to answer [`probe_api`].
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the workload API server's certificate has expired: one `GET /readyz` with a client of
/// the kubeconfig just read (its answer does not matter, the TLS handshake does). Done with each
/// fresh reading of the Secret, so as often as the kubeconfig is checked.
async fn probe_api(kubeconfig: kube::config::Kubeconfig, now: Timestamp) -> expired::Api {
    let Ok(client) = crate::workload::uncached_client(kubeconfig).await else {
        return expired::Api::Unknown;
    };
    let Ok(request) = http::Request::get("/readyz").body(Vec::new()) else {
        return expired::Api::Unknown;
    };
    match tokio::time::timeout(PROBE_TIMEOUT, client.request_text(request)).await {
        Ok(Ok(_)) => expired::Api::Valid,
        // An answer, if not a happy one: the handshake went through.
        Ok(Err(kube::Error::Api(_))) => expired::Api::Valid,
        Ok(Err(err)) => match crate::workload::expired_certificate(&err) {
            // Without its NotAfter, the first time it was seen so.
            Some(at) => expired::Api::Expired(Some(at.unwrap_or(now))),
            None => expired::Api::Unknown,
        },
        Err(_) => expired::Api::Unknown,
    }
}

/// Reads `<cluster>-kubeconfig`; the vetted kubeconfig too when it could be read (to probe its
/// API server with).
async fn read(
    client: &Client,
    namespace: &str,
    cluster: &str,
    vetting: crate::workload::Vetting,
    renewing: bool,
) -> Result<(Reading, Option<kube::config::Kubeconfig>), Error> {
    let mut vetted = None;
    let reading = match crate::workload::kubeconfig_secret(client, namespace, cluster).await {
        Ok(object) => match crate::workload::kubeconfig_of(&object, namespace, vetting) {
            Ok(kubeconfig) => match kubeconfig_expiry(&kubeconfig) {
                Ok(expiry) => {
                    vetted = Some(kubeconfig);
                    Reading::Read {
                        expiry,
                        // Read for renewal only: off, nothing more is looked at.
                        held: match renewing {
                            true => renewal::text_of(
                                &object,
                                ck8s_certs_api::capi::KUBECONFIG_SECRET_KEY,
                            )
                            .ok_or_else(|| Refusal::Shape("it has no `value`".into()))
                            .and_then(|yaml| client_certificate::held(&yaml, cluster)),
                            false => Err(Refusal::Shape("renewal is off".into())),
                        },
                    }
                }
                Err(reason) => Reading::Unreadable(reason),
            },
            // The message names the Secret already.
            Err(WorkloadError::Kubeconfig { reason, .. }) => Reading::Unreadable(reason),
            Err(err) => Reading::Unreadable(err.to_string()),
        },
        Err(WorkloadError::Secret {
            source: kube::Error::Api(status),
            ..
        }) if status.code == 404 => Reading::Missing,
        Err(err) => return Err(err.into()),
    };
    Ok((reading, vetted))
}

/// NotAfter of `<cluster>-cca`'s certificate; `None` when there is none to read (a renewal says
/// why when it is due).
async fn client_ca_expiry(
    client: &Client,
    namespace: &str,
    cluster: &str,
) -> Result<Option<Timestamp>, Error> {
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), namespace);
    let name = ck8s_certs_api::capi::client_ca_secret_name(cluster);
    let secret = secrets.get_opt(&name).await?;
    Ok(secret
        .as_ref()
        .and_then(|s| renewal::text_of(s, "tls.crt"))
        .and_then(|pem| crate::workload::credentials::ca_not_after(pem.as_bytes(), "tls.crt").ok()))
}

/// Creates the Cluster's record, owned by it (it goes away with the Cluster and moves with it).
async fn create(
    api: &Api<ClusterCertificates>,
    cluster: &Cluster,
    capi: &CapiVersion,
) -> Result<(), kube::Error> {
    let name = cluster.name_any();
    let mut record = ClusterCertificates::new(
        &name,
        ck8s_certs_api::cluster_certificates::ClusterCertificatesSpec {
            cluster_name: name.clone(),
        },
    );
    record.metadata.namespace = cluster.namespace();
    record.metadata.labels = Some([(CLUSTER_NAME_LABEL.to_owned(), name.clone())].into());
    record.metadata.owner_references = Some(vec![OwnerReference {
        api_version: Cluster::api_version(capi).into_owned(),
        kind: Cluster::kind(capi).into_owned(),
        name,
        uid: cluster.uid().unwrap_or_default(),
        ..Default::default()
    }]);
    match api.create(&PostParams::default(), &record).await {
        Ok(_) => Ok(()),
        // Created meanwhile (the cache had not seen it yet).
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(err) => Err(err),
    }
}

fn export(metrics: &Metrics, namespace: &str, cluster: &str, reading: &Reading) {
    let expiry = match reading {
        Reading::Read { expiry, .. } => *expiry,
        _ => KubeconfigExpiry::default(),
    };
    for (which, at) in expiry.each() {
        let labels = KubeconfigLabels {
            namespace: namespace.to_owned(),
            cluster: cluster.to_owned(),
            certificate: which.label().to_owned(),
        };
        match at {
            Some(at) => {
                metrics
                    .kubeconfig_expiry
                    .get_or_create(&labels)
                    .set(at.as_second() as f64);
            }
            None => {
                metrics.kubeconfig_expiry.remove(&labels);
            }
        }
    }
}

/// The cluster's `expired since` series: present exactly while its node certificates are.
fn export_expired(metrics: &Metrics, namespace: &str, cluster: &str, since: Option<Timestamp>) {
    let labels = ClusterLabels {
        namespace: namespace.to_owned(),
        cluster: cluster.to_owned(),
    };
    match since {
        Some(at) => {
            metrics
                .cluster_expired_since
                .get_or_create(&labels)
                .set(at.as_second() as f64);
        }
        None => {
            metrics.cluster_expired_since.remove(&labels);
        }
    }
}

#[cfg(test)]
mod tests;
