//! Every refresh of a Machine is a `CertificateRefresh` (target the Machine, owned by it): the
//! journal of the refresh while it runs, its record once finished. The Machine names it from the
//! moment the refresh is taken up ([`IN_FLIGHT_REFRESH`]); it is created when the refresh
//! reaches the node, and its status holds the operation (the seed before `run`, then the
//! outcome, written before anything else shows it), so a restart resumes or records it from
//! there. A refused request gets one at once. The last `--refresh-history` finished ones per
//! Machine are kept: the audit trail.

use ck8s_certs_api::capi::{CLUSTER_NAME_LABEL, WATCH_FILTER_LABEL};
use ck8s_certs_api::machine::{CapiVersion, Machine, MachineView};
use ck8s_certs_api::machine_certificates::{Operation, Phase, Role};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource};
use serde_json::json;
use tracing::warn;

use super::{Error, MANAGER, Reconciler};

use ck8s_certs_api::annotations::IN_FLIGHT_REFRESH;
use ck8s_certs_api::certificate_refresh::{
    CertificateRefresh, CertificateRefreshSpec, CertificateRefreshStatus, MachinePhase,
    MachineProgress, RequestPhase, Target, labels,
};
use kube::api::{DeleteParams, ObjectMeta};

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
            owner_references: Some(vec![OwnerReference {
                api_version: Machine::api_version(&capi).into_owned(),
                kind: "Machine".into(),
                name: view.name.clone(),
                uid: view.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
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

/// Of records `(name, created)`, those beyond the newest `keep`.
pub fn beyond(mut records: Vec<(String, Timestamp)>, keep: usize) -> Vec<String> {
    records.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
    records
        .into_iter()
        .skip(keep)
        .map(|(name, _)| name)
        .collect()
}

impl Reconciler<'_> {
    fn records(&self) -> Api<CertificateRefresh> {
        Api::namespaced(self.ctx.client.clone(), &self.view.namespace)
    }

    /// The name of the request carrying `op`: the one the Machine names (given when the refresh
    /// was taken up), else one derived from the operation (refused before it started, or taken
    /// up by an older version, which kept it in the MachineCertificates only).
    pub(super) fn request_name(&self, op: &Operation) -> String {
        self.view
            .annotation(IN_FLIGHT_REFRESH)
            .map_or_else(|| record_name(&self.view.name, op), str::to_owned)
    }

    /// The request the Machine names, read live (`None`: not created yet, or none named).
    pub(super) async fn in_flight_request(&self) -> Result<Option<CertificateRefresh>, Error> {
        let Some(name) = self.view.annotation(IN_FLIGHT_REFRESH) else {
            return Ok(None);
        };
        Ok(self.records().get_opt(name).await?)
    }

    /// Creates the request of an operation reaching its node (idempotent: created before a crash,
    /// or by another instance that then lost the claim). It exists while the refresh runs, so
    /// `clusterctl move` (which finds objects before it waits for our block-move) takes it along.
    pub(super) async fn open_record(&self, op: &Operation) -> Result<(), Error> {
        let params = PostParams {
            field_manager: Some(MANAGER.into()),
            ..Default::default()
        };
        let name = self.request_name(op);
        match self
            .records()
            .create(&params, &record(&self.view, self.ctx.capi, &name, op))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// Writes `op` into its request's status (the whole status, server-side apply), creating the
    /// request when it is not there (refused before it started, or taken up by an older version).
    pub(super) async fn write_record(&self, op: &Operation) -> Result<(), Error> {
        self.write_record_named(&self.request_name(op), op).await
    }

    /// [`write_record`](Self::write_record) into the request `name`.
    pub(super) async fn write_record_named(&self, name: &str, op: &Operation) -> Result<(), Error> {
        self.live_only()?;
        let api = self.records();
        let status = json!({
            "apiVersion": CertificateRefresh::api_version(&()),
            "kind": CertificateRefresh::kind(&()),
            "status": record_status(&self.view.name, self.role(), op),
        });
        let params = PatchParams::apply(MANAGER).force();
        let patch = Patch::Apply(status);
        match api.patch_status(name, &params, &patch).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => {
                self.open_record(op).await?;
                api.patch_status(name, &params, &patch).await?;
                Ok(())
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Drops the Machine's oldest records beyond `--refresh-history` (0: none kept), once its
    /// refresh has ended (none is in flight). Housekeeping: a failure leaves one record too many
    /// until the next refresh.
    pub(super) async fn prune_history(&self) {
        let keep = self.ctx.config.history;
        let api = self.records();
        let selector = format!("{}={}", labels::MACHINE, labels::value(&self.view.name));
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
                .any(|o| Some(&o.uid) == self.view.uid.as_ref())
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
        for old in beyond(records, keep) {
            if let Err(err) = api.delete(&old, &DeleteParams::background()).await {
                warn!(record = old, error = %err, "Could not delete an old refresh record");
            }
        }
    }
}
