//! The audit trail: every refresh of a Machine leaves a `CertificateRefresh` record (target the
//! Machine, owned by it), and the last `--refresh-history` records per Machine are kept. A
//! record is created when its refresh reaches the node (the seed is recorded; a refused request
//! gets one at once) and its outcome is written before the Machine shows it, so a crash in
//! between records it on the next reconcile (the same name: the writes are idempotent).

use ck8s_certs_api::certificate_refresh::{
    CertificateRefresh, CertificateRefreshSpec, CertificateRefreshStatus, MachinePhase,
    MachineProgress, RequestPhase, Target, labels,
};
use kube::api::{DeleteParams, ObjectMeta};

use super::*;

/// A record's name: the Machine's and the operation's start (unique per Machine: one operation
/// at a time, and a start is recorded to the second).
pub fn record_name(machine: &str, op: &Operation) -> String {
    // Object names are at most 253 characters; Machine names may be as long.
    let machine: String = machine.chars().take(230).collect();
    format!("{machine}-{}", op.started_at.0.as_second())
}

/// The record of a finished operation (its status goes in a second write).
pub fn record(view: &MachineView, capi: CapiVersion, op: &Operation) -> CertificateRefresh {
    let mut labels: std::collections::BTreeMap<String, String> =
        [CLUSTER_NAME_LABEL, WATCH_FILTER_LABEL]
            .into_iter()
            .filter_map(|key| view.labels.get(key).map(|v| (key.to_owned(), v.clone())))
            .collect();
    labels.insert(labels::MACHINE.to_owned(), label_value(&view.name));
    if let Some(fleet) = &op.fleet {
        labels.insert(labels::FLEET.to_owned(), label_value(fleet));
    }
    CertificateRefresh {
        metadata: ObjectMeta {
            name: Some(record_name(&view.name, op)),
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
            max_parallel_workers: None,
            continue_on_failure: false,
            suspend: false,
        },
        status: None,
    }
}

/// The status of a finished operation's record.
pub fn record_status(machine: &str, role: Role, op: &Operation) -> CertificateRefreshStatus {
    let succeeded = op.phase == Phase::Succeeded;
    let message = if succeeded {
        op.note.clone()
    } else {
        op.error.clone()
    };
    CertificateRefreshStatus {
        phase: Some(if succeeded {
            RequestPhase::Succeeded
        } else {
            RequestPhase::Failed
        }),
        machines: vec![MachineProgress {
            name: machine.to_owned(),
            role,
            phase: if succeeded {
                MachinePhase::Succeeded
            } else {
                MachinePhase::Failed
            },
            started_at: Some(op.started_at.clone()),
            finished_at: op.finished_at.clone(),
            new_expiry: op.new_expiry.clone(),
            message: message.clone(),
        }],
        progress: Some("1/1".into()),
        started_at: Some(op.started_at.clone()),
        finished_at: op.finished_at.clone(),
        new_expiry: op.new_expiry.clone(),
        message,
    }
}

/// Label values are at most 63 characters; longer names are cut (selection is then by prefix
/// only, which the record's spec.target names in full).
pub fn label_value(name: &str) -> String {
    name.chars().take(63).collect()
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

    /// Creates the record of an operation that reached its node (its seed is recorded). It
    /// exists while the refresh runs, so `clusterctl move` takes it along; [`Self::keep_history`]
    /// writes its outcome.
    pub(super) async fn open_record(&self, op: &Operation) -> Result<(), Error> {
        if self.ctx.config.history == 0 {
            return Ok(());
        }
        let params = PostParams {
            field_manager: Some(MANAGER.into()),
            ..Default::default()
        };
        match self
            .records()
            .create(&params, &record(&self.view, self.ctx.capi, op))
            .await
        {
            Ok(_) => Ok(()),
            // Created before a crash.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// Records a finished operation and drops the Machine's oldest records beyond
    /// `--refresh-history` (0: no records).
    pub(super) async fn keep_history(&self, op: &Operation) -> Result<(), Error> {
        let keep = self.ctx.config.history;
        if keep == 0 || !op.is_finished() {
            return Ok(());
        }
        let api = self.records();
        let name = record_name(&self.view.name, op);
        let status = json!({
            "apiVersion": CertificateRefresh::api_version(&()),
            "kind": CertificateRefresh::kind(&()),
            "status": record_status(&self.view.name, self.role(), op),
        });
        let params = PatchParams::apply(MANAGER).force();
        let patch = Patch::Apply(status);
        match api.patch_status(&name, &params, &patch).await {
            Ok(_) => {}
            // Not opened: refused before it started, or opened by an older version.
            Err(kube::Error::Api(status)) if status.code == 404 => {
                self.open_record(op).await?;
                api.patch_status(&name, &params, &patch).await?;
            }
            Err(err) => return Err(err.into()),
        }
        // Pruning is housekeeping: a failure leaves one record too many until the next refresh.
        let selector = format!("{}={}", labels::MACHINE, label_value(&self.view.name));
        match api
            .list_metadata(&ListParams::default().labels(&selector))
            .await
        {
            Ok(list) => {
                let records = list
                    .items
                    .into_iter()
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
            Err(err) => warn!(error = %err, "Could not list the refresh records to prune them"),
        }
        Ok(())
    }
}
