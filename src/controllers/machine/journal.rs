//! Every refresh of a Machine is a `CertificateRefresh` (target the Machine, owned by it): the
//! journal of the refresh while it runs, its record once finished. The Machine names it from the
//! moment the refresh is taken up ([`IN_FLIGHT_REFRESH`]); it is created when the refresh
//! reaches the node, and its status holds the operation (the seed before `run`, then the
//! outcome, written before anything else shows it), so a restart resumes or records it from
//! there. A refused request gets one at once. The last `--refresh-history` finished ones per
//! Machine are kept: the audit trail.

use crate::events::EventType;
use ck8s_certs_api::annotations::IN_FLIGHT_REFRESH;
use ck8s_certs_api::capi::{CLUSTER_NAME_LABEL, WATCH_FILTER_LABEL};
use ck8s_certs_api::certificate_refresh::{
    CertificateRefresh, CertificateRefreshSpec, CertificateRefreshStatus, MachinePhase,
    MachineProgress, RequestPhase, Target, labels,
};
use ck8s_certs_api::machine::{CapiVersion, MachineView};
use ck8s_certs_api::machine_certificates::{MachineCertificatesStatus, Operation, Phase, Role};
use ck8s_certs_api::reasons::{condition_reasons as why, conditions};
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};
use serde_json::json;
use tracing::warn;

use super::report::{Reporter, owner};
use super::{Error, MANAGER};
use crate::controllers::executor::{self, Failure};
use crate::controllers::patches::set_condition;
use crate::controllers::shard::{Claimed, Shard};
use crate::metrics::Metrics;

/// A record's name: the Machine's and the operation's start (unique per Machine: one operation
/// at a time, and a start is recorded to the second).
pub fn record_name(machine: &str, op: &Operation) -> String {
    // Object names are at most 253 characters and Machine names may be as long: room for `-`
    // and the start's ten digits.
    let machine = ck8s_certs_api::names::fit(machine, 253 - 11);
    format!("{machine}-{}", op.started_at.0.as_second())
}

/// The request object of an operation, named `name` (its status goes in a second write).
pub fn record(
    view: &MachineView,
    capi: CapiVersion,
    name: &str,
    op: &Operation,
) -> CertificateRefresh {
    let mut labels: std::collections::BTreeMap<String, String> =
        [CLUSTER_NAME_LABEL, WATCH_FILTER_LABEL]
            .into_iter()
            .filter_map(|key| view.labels.get(key).map(|v| (key.to_owned(), v.clone())))
            .collect();
    labels.insert(labels::MACHINE.to_owned(), labels::value(&view.name));
    if let Some(fleet) = &op.fleet {
        labels.insert(labels::FLEET.to_owned(), labels::value(fleet));
    }
    CertificateRefresh {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(view.namespace.clone()),
            labels: Some(labels),
            owner_references: Some(vec![owner(view, capi)]),
            ..Default::default()
        },
        spec: CertificateRefreshSpec {
            target: Target {
                machine: Some(view.name.clone()),
                ..Default::default()
            },
            ttl: op.ttl.clone(),
            origin: op.origin,
            requested_by: op.requested_by.clone(),
            requester: op.requester.clone(),
            max_parallel_workers: None,
            continue_on_failure: false,
            suspend: false,
        },
        status: None,
    }
}

/// The request's status as `op` makes it: Running from its first recorded seed, then finished.
pub fn record_status(machine: &str, role: Role, op: &Operation) -> CertificateRefreshStatus {
    let (phase, machine_phase) = match op.phase {
        Phase::Pending | Phase::Running => (RequestPhase::Running, MachinePhase::Running),
        Phase::Succeeded => (RequestPhase::Succeeded, MachinePhase::Succeeded),
        Phase::Failed => (RequestPhase::Failed, MachinePhase::Failed),
    };
    let message = match op.phase {
        Phase::Succeeded => op.note.clone(),
        Phase::Failed => op.error.clone(),
        Phase::Pending | Phase::Running => {
            op.seed.map(|seed| format!("Refreshing with seed {seed}"))
        }
    };
    let done = if op.is_finished() { "1/1" } else { "0/1" };
    CertificateRefreshStatus {
        phase: Some(phase),
        machines: vec![MachineProgress {
            name: machine.to_owned(),
            role,
            phase: machine_phase,
            started_at: Some(op.started_at.clone()),
            finished_at: op.finished_at.clone(),
            new_expiry: op.new_expiry.clone(),
            message: message.clone(),
        }],
        progress: Some(done.into()),
        started_at: Some(op.started_at.clone()),
        finished_at: op.finished_at.clone(),
        new_expiry: op.new_expiry.clone(),
        message,
        operation: Some(op.clone()),
    }
}

/// A Machine's CertificateRefresh records.
#[derive(Clone, Copy)]
pub(super) struct Requests<'a> {
    pub client: &'a Client,
    pub capi: CapiVersion,
    pub machine: &'a MachineView,
    pub role: Role,
}

impl Requests<'_> {
    fn api(&self) -> Api<CertificateRefresh> {
        Api::namespaced(self.client.clone(), &self.machine.namespace)
    }

    /// The name of the request carrying `op`: the one the Machine names (given when the refresh
    /// was taken up), else one derived from the operation (refused before it started, or taken
    /// up by an older version, which kept it in the MachineCertificates only).
    pub fn name(&self, op: &Operation) -> String {
        request_name(self.machine, op)
    }

    /// Creates the request of an operation reaching its node (idempotent: created before a crash,
    /// or by another instance that then lost the claim). It exists while the refresh runs, so
    /// `clusterctl move` (which finds objects before it waits for our block-move) takes it along.
    pub async fn open(&self, op: &Operation) -> Result<(), Error> {
        let params = PostParams {
            field_manager: Some(MANAGER.into()),
            ..Default::default()
        };
        let name = self.name(op);
        match self
            .api()
            .create(&params, &record(self.machine, self.capi, &name, op))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// Writes `op` into its request's status (the whole status, server-side apply), creating the
    /// request when it is not there (refused before it started, or taken up by an older version).
    pub async fn write(&self, op: &Operation) -> Result<(), Error> {
        self.write_named(&self.name(op), op).await
    }

    /// [`write`](Self::write) into the request `name`.
    pub async fn write_named(&self, name: &str, op: &Operation) -> Result<(), Error> {
        let api = self.api();
        let status = json!({
            "apiVersion": CertificateRefresh::api_version(&()),
            "kind": CertificateRefresh::kind(&()),
            "status": record_status(&self.machine.name, self.role, op),
        });
        let params = PatchParams::apply(MANAGER).force();
        let patch = Patch::Apply(status);
        match api.patch_status(name, &params, &patch).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => {
                self.open(op).await?;
                api.patch_status(name, &params, &patch).await?;
                Ok(())
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Drops the Machine's oldest records beyond `keep` (`--refresh-history`; 0: none kept),
    /// once its refresh has ended (none is in flight). Housekeeping: a failure leaves one record
    /// too many until the next refresh.
    pub async fn prune(&self, keep: usize) {
        let api = self.api();
        let selector = format!("{}={}", labels::MACHINE, labels::value(&self.machine.name));
        let list = match api
            .list_metadata(&ListParams::default().labels(&selector))
            .await
        {
            Ok(list) => list,
            Err(err) => {
                warn!(error = %err, "Could not list the refresh records to prune them");
                return;
            }
        };
        // Only this Machine's own: a label value is a hash for long names, and the owner is
        // what tells siblings (and a re-created Machine of the same name) apart.
        let ours = |r: &kube::core::PartialObjectMeta<CertificateRefresh>| {
            r.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| Some(&o.uid) == self.machine.uid.as_ref())
        };
        let records = list
            .items
            .into_iter()
            .filter(ours)
            .filter_map(|r| {
                let created = r.metadata.creation_timestamp.as_ref()?.0;
                Some((r.metadata.name?, created))
            })
            .collect();
        for old in crate::controllers::history::beyond(records, keep) {
            if let Err(err) = api.delete(&old, &DeleteParams::background()).await {
                warn!(record = old, error = %err, "Could not delete an old refresh record");
            }
        }
    }
}

/// The name of the request carrying `op` for `machine` (see [`Requests::name`]).
pub(super) fn request_name(machine: &MachineView, op: &Operation) -> String {
    machine
        .annotation(IN_FLIGHT_REFRESH)
        .map_or_else(|| record_name(&machine.name, op), str::to_owned)
}

/// The request's status is the journal: the seed is recorded there before `run`. The
/// MachineCertificates shows the refresh in its Refreshing condition (naming the request and
/// seed), written in the same step with the pinned k8sd certificate of a node met for the first
/// time.
pub(super) struct RequestJournal<'a> {
    pub requests: Requests<'a>,
    pub reporter: Reporter<'a>,
    pub shard: &'a Shard,
    pub metrics: &'a Metrics,
    pub clock: &'a dyn crate::clock::Clock,
    pub status: &'a mut MachineCertificatesStatus,
    /// Whether the request exists.
    pub opened: bool,
}

impl RequestJournal<'_> {
    /// Records an attempt (its seed) in the request's status before its `run` is sent, creating
    /// the request first if it is not there yet. With a Lease, the same write names us as the
    /// operation's carrier, on the condition that the request did not change since it was read
    /// (sharding): of two instances that planned at once (`plan` changes nothing on the node),
    /// only one records and runs.
    async fn record_attempt(&mut self, op: &mut Operation) -> Result<(), Failure> {
        if !self.opened {
            self.requests.open(op).await?;
            self.opened = true;
        }
        if self.shard.ours().is_none() {
            return Ok(self.requests.write(op).await?);
        }
        let name = self.requests.name(op);
        let (machine, role) = (&self.requests.machine.name, self.requests.role);
        let status = |op: &Operation| record_status(machine, role, op);
        let namespace = &self.requests.machine.namespace;
        match self
            .shard
            .claim(namespace, &name, op, status, MANAGER)
            .await
        {
            Ok(Claimed::Ours) => Ok(()),
            Ok(Claimed::Lost) => Err(Failure::Superseded),
            Err(err) => Err(Error::from(err).into()),
        }
    }

    /// Shows in the Refreshing condition that the refresh runs (with its request and seed) or
    /// waits (with what for); written only when it changes.
    async fn show_refreshing(&mut self, message: String) -> Result<(), Failure> {
        let before = self.status.clone();
        let now = self.clock.now();
        set_condition(
            self.status,
            conditions::REFRESHING,
            true,
            why::REFRESH_IN_PROGRESS,
            message,
            now,
        );
        Ok(self.reporter.update_status(&before, self.status).await?)
    }
}

impl executor::Journal for RequestJournal<'_> {
    async fn record(
        &mut self,
        op: &mut Operation,
        fingerprint: Option<String>,
    ) -> Result<(), Failure> {
        self.status.k8sd_fingerprint = fingerprint;
        self.record_attempt(op).await?;
        crate::failpoint::hit(crate::failpoint::AFTER_SEED_RECORDED);
        if op.run_attempts == 1 {
            self.metrics
                .renewals_started
                .get_or_create(&crate::metrics::origin(op.origin))
                .inc();
        }
        let request = self.requests.name(op);
        let seed = op.seed.unwrap_or_default();
        let message = format!(
            "CertificateRefresh {request}: refreshing with seed {seed} (run {} of at most {})",
            op.run_attempts,
            executor::MAX_RUN_SENDS
        );
        self.show_refreshing(message).await
    }

    async fn unverified(&mut self, op: &Operation, mismatch: &crate::refresh::csr::Mismatch) {
        self.metrics.unverified_csrs.inc();
        let seed = op.seed.unwrap_or_default();
        let next = if op.run_attempts >= executor::MAX_RUN_SENDS {
            "that was the refresh's last run".to_owned()
        } else {
            format!(
                "the refresh plans again with a new seed (run {} of at most {} done)",
                op.run_attempts,
                executor::MAX_RUN_SENDS
            )
        };
        let note = format!(
            "{mismatch}. No CSR of seed {seed} was approved, and those still undecided were denied; {next}; {}",
            executor::unverified_hint(mismatch)
        );
        self.reporter
            .event(EventType::Warning, executor::UNVERIFIED_CSR, note)
            .await;
    }

    async fn waiting(&mut self, op: &Operation, note: &str) -> Result<(), Failure> {
        let request = self.requests.name(op);
        self.show_refreshing(format!("CertificateRefresh {request}: {note}"))
            .await
    }

    fn seen(&self) -> Option<u64> {
        self.reporter.seen.get()
    }
}
