//! Many CertificateRenewalPolicies over the fleet: what they cost each Machine reconcile, and
//! how long an edit of every policy takes to reach every Machine it governs.
//!
//! The policies go round-robin over the fleet's namespaces; each Machine of a namespace is
//! labelled for one of its namespace's policies, evenly, so each Machine has exactly one. They
//! mix the three shapes users write: Scheduled with day/time windows in several time zones,
//! Scheduled with a cron window, Automatic. Nothing is due (the fleet's certificates have 300
//! days left), so no refresh starts: only verdicts are computed and written.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ck8s_certs_api::machine_certificates::MachineCertificates;
use ck8s_certs_api::renewal_policy::CertificateRenewalPolicy;
use futures::{StreamExt, TryStreamExt};
use jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use super::idle::Contender;
use super::probe::{AuditTail, ProcessProbe, Requests};
use super::{alive, settle, wait_for_log};
use crate::process::Process;
use crate::{Environment, Error};

/// The Machine label the bench's policies select on.
pub const POLICY_LABEL: &str = "bench.ck8s-certs.io/policy";

/// The policies of a run and the Machines they govern.
#[derive(Clone, Debug, Default)]
pub struct PolicySet {
    /// (namespace, name) of each policy.
    pub policies: Vec<(String, String)>,
    /// Machines labelled for a policy.
    pub governed: usize,
}

/// Creates `count` policies and labels the fleet's Machines for them (before the controller's
/// first start, which then writes every governed Machine's verdict).
pub async fn set_up(env: &Environment, count: usize) -> Result<PolicySet, Error> {
    let client = env.management().await?;
    let mut namespaces: Vec<String> = env
        .clusters
        .iter()
        .map(|c| c.spec.namespace.clone())
        .collect();
    namespaces.dedup();
    let mut per_namespace: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut set = PolicySet::default();
    for index in 0..count {
        let namespace = &namespaces[index % namespaces.len()];
        let name = format!("bench-{index:04}");
        per_namespace
            .entry(namespace.as_str())
            .or_default()
            .push(name.clone());
        set.policies.push((namespace.clone(), name));
    }
    let resource = ApiResource::erase::<CertificateRenewalPolicy>(&());
    futures::stream::iter(set.policies.iter().enumerate())
        .map(|(index, (namespace, name))| {
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), namespace, &resource);
            let object = json!({
                "apiVersion": resource.api_version, "kind": resource.kind,
                "metadata": { "name": name, "namespace": namespace },
                "spec": policy_spec(index, name),
            });
            async move {
                let object: DynamicObject =
                    serde_json::from_value(object).map_err(|e| Error::Setup(e.to_string()))?;
                api.create(&PostParams::default(), &object)
                    .await
                    .map(drop)
                    .map_err(Error::Kube)
            }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await?;

    let machine = ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        ck8s_certs_api::capi::GROUP,
        env.spec.capi_version.storage_version(),
        "Machine",
    ));
    let mut labels = Vec::new();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for node in env.clusters.iter().flat_map(|c| c.nodes.iter()) {
        let Some(policies) = per_namespace.get(node.namespace.as_str()) else {
            continue;
        };
        let index = seen.entry(node.namespace.as_str()).or_default();
        let policy = &policies[*index % policies.len()];
        *index += 1;
        let patch = json!({ "metadata": { "labels": { POLICY_LABEL: policy } } });
        labels.push((
            machine.clone(),
            node.namespace.clone(),
            node.machine.clone(),
            patch,
        ));
    }
    set.governed = labels.len();
    super::fleet::patch_all(&client, labels).await?;
    Ok(set)
}

/// Policy `index`'s spec: the three shapes in turn, selecting its own Machines.
fn policy_spec(index: usize, name: &str) -> serde_json::Value {
    const ZONES: [&str; 4] = ["Europe/London", "America/New_York", "Asia/Tokyo", "UTC"];
    let zone = ZONES[index % ZONES.len()];
    let selector = json!({ "matchLabels": { POLICY_LABEL: name } });
    match index % 3 {
        0 => json!({
            "machineSelector": selector, "policy": "Scheduled", "renewBefore": "30d",
            "windows": [
                { "daysOfWeek": ["Saturday", "Sunday"], "start": "22:00", "end": "04:00", "timezone": zone },
                { "daysOfWeek": ["Wednesday"], "start": "01:00", "end": "03:00", "timezone": zone },
            ],
        }),
        1 => json!({
            "machineSelector": selector, "policy": "Scheduled", "renewBefore": "30d",
            "windows": [{ "schedule": format!("{} 2 * * 6", index % 60), "duration": "3h", "timezone": zone }],
        }),
        _ => json!({ "machineSelector": selector, "policy": "Automatic", "renewBefore": "30d" }),
    }
}

/// What an edit of every policy cost.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PolicyFigures {
    pub policies: usize,
    pub governed_machines: usize,
    /// From the first edit sent to every governed Machine's verdict naming the new generation.
    pub edit_seconds: f64,
    /// Governed Machines whose verdict did not reach the new generation within the timeout.
    pub unreached: usize,
    /// The controller's CPU from the first edit until it was quiet again.
    pub edit_cpu_seconds: f64,
    /// The controller's requests meanwhile.
    pub edit_requests: Requests,
}

impl PolicyFigures {
    /// CPU per governed Machine's new verdict, in milliseconds.
    pub fn cpu_ms_per_machine(&self) -> f64 {
        self.edit_cpu_seconds * 1000.0 / self.governed_machines.max(1) as f64
    }
}

/// Starts the controller, lets it settle, edits every policy at once (`renewBefore` 30d → 31d:
/// a new generation, the same outcome), and waits until every governed Machine's verdict names
/// the new generation.
pub async fn measure_edit(
    env: &Environment,
    audit: &mut AuditTail,
    contender: Contender,
    set: &PolicySet,
) -> Result<PolicyFigures, Error> {
    let user = contender.user.clone();
    let client = env.management().await?;
    let mut process = Process::spawn("bench-ck8s-certs-policies", contender.command, &env.dir)?;
    let probe = ProcessProbe { pid: process.pid() };
    wait_for_log(&mut process, contender.first_reconcile_marker).await?;
    settle(audit, &mut process, &user).await?;
    let verdicts = Verdicts::watch(client.clone()).await;

    let cpu_before = probe.cpu_seconds().unwrap_or_default();
    let edited_at = Timestamp::now();
    let edited = Instant::now();
    let resource = ApiResource::erase::<CertificateRenewalPolicy>(&());
    let generations: HashMap<(String, String), i64> = futures::stream::iter(&set.policies)
        .map(|(namespace, name)| {
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), namespace, &resource);
            async move {
                let patch = json!({ "spec": { "renewBefore": "31d" } });
                let object = api
                    .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .map_err(Error::Kube)?;
                Ok::<_, Error>((
                    (namespace.clone(), name.clone()),
                    object.metadata.generation.unwrap_or_default(),
                ))
            }
        })
        .buffer_unordered(8)
        .try_collect()
        .await?;
    let deadline = Duration::from_secs(600);
    let mut unreached = set.governed;
    while edited.elapsed() < deadline {
        alive(&mut process)?;
        unreached = set.governed.saturating_sub(verdicts.reached(&generations));
        if unreached == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let edit_seconds = edited.elapsed().as_secs_f64();
    settle(audit, &mut process, &user).await?;
    let edit_cpu_seconds = probe.cpu_seconds().unwrap_or_default() - cpu_before;
    let ended_at = Timestamp::now();
    process.terminate(Duration::from_secs(30));
    tokio::time::sleep(Duration::from_secs(2)).await;
    audit.refresh();
    Ok(PolicyFigures {
        policies: set.policies.len(),
        governed_machines: set.governed,
        edit_seconds,
        unreached,
        edit_cpu_seconds,
        edit_requests: audit.requests(&user, edited_at, ended_at),
    })
}

/// (namespace, Machine) → (its governing policy, the generation its verdict was computed from).
type Seen = HashMap<(String, String), (String, i64)>;

/// Every MachineCertificates' governing policy and the generation its verdict was computed
/// from, from one watch.
#[derive(Clone, Default)]
struct Verdicts {
    seen: Arc<Mutex<Seen>>,
}

impl Verdicts {
    async fn watch(client: Client) -> Self {
        let api: Api<MachineCertificates> = Api::all(client);
        let verdicts = Self::default();
        let seen = Arc::clone(&verdicts.seen);
        super::fleet::watch_applied(api, move |object: MachineCertificates| {
            let reference = object
                .status
                .as_ref()
                .and_then(|s| s.renewal.as_ref())
                .and_then(|r| r.policy_ref.as_ref());
            let Some(reference) = reference else { return };
            let entry = (
                reference.name.clone(),
                reference.observed_generation.unwrap_or_default(),
            );
            let key = (object.namespace().unwrap_or_default(), object.name_any());
            seen.lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, entry);
        })
        .await;
        verdicts
    }

    /// Machines whose verdict names their policy's generation in `generations`.
    fn reached(&self, generations: &HashMap<(String, String), i64>) -> usize {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.iter()
            .filter(|((namespace, _), (policy, generation))| {
                generations
                    .get(&(namespace.clone(), policy.clone()))
                    .is_some_and(|g| g == generation)
            })
            .count()
    }
}
