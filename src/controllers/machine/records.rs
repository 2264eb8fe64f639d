//! The Machine reconciler's writes: its MachineCertificates (created with the Machine as owner),
//! the status (server-side apply of the whole status), our annotation keys on the Machine, Events.

use ck8s_certs_api::capi::{CLUSTER_NAME_LABEL, WATCH_FILTER_LABEL};
use ck8s_certs_api::machine::{Machine, MachineView};
use ck8s_certs_api::machine_certificates::{
    MachineCertificates, MachineCertificatesSpec, MachineCertificatesStatus,
};
use ck8s_certs_api::reasons::conditions;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};
use serde_json::json;
use tracing::warn;

use super::{Error, MANAGER, Mode, Reconciler};
use crate::controllers::executor::truncate;
use crate::controllers::patches::{MachineChanges, MachinePatch, machine_patch, set_condition};

impl Reconciler<'_> {
    /// The Machine's MachineCertificates, created (owned by the Machine) when missing and
    /// `create`.
    pub(super) async fn machine_certificates(
        &self,
        create: bool,
    ) -> Result<Option<MachineCertificates>, Error> {
        let api = self.certificates();
        if let Some(existing) = api.get_opt(&self.view.name).await? {
            // Sharding: the record follows its Machine into another shard's watch.
            let filter = |labels: &std::collections::BTreeMap<String, String>| {
                labels.get(WATCH_FILTER_LABEL).cloned()
            };
            let moved = crate::controllers::shard::label_patch(
                filter(&self.view.labels).as_deref(),
                existing
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(filter)
                    .as_deref(),
            );
            if let Some(patch) = moved {
                let params = PatchParams {
                    field_manager: Some(MANAGER.into()),
                    ..Default::default()
                };
                return Ok(Some(
                    api.patch(&self.view.name, &params, &Patch::Merge(patch))
                        .await?,
                ));
            }
            return Ok(Some(existing));
        }
        if self.view.deleting || !create {
            return Ok(None);
        }
        self.create_record(&self.view).await
    }

    /// Creates `machine`'s MachineCertificates as its own reconcile would (owned by the
    /// Machine, with its cluster and watch-filter labels); one created meanwhile is read back.
    pub(super) async fn create_record(
        &self,
        machine: &MachineView,
    ) -> Result<Option<MachineCertificates>, Error> {
        let api = self.certificates();
        let mut mc = MachineCertificates::new(
            &machine.name,
            MachineCertificatesSpec {
                cluster_name: machine.cluster.clone().unwrap_or_default(),
            },
        );
        mc.metadata.namespace = Some(machine.namespace.clone());
        // The cluster label for selection, the watch-filter label so a filtered controller sees it.
        let labels = [CLUSTER_NAME_LABEL, WATCH_FILTER_LABEL]
            .into_iter()
            .filter_map(|key| machine.labels.get(key).map(|v| (key.to_owned(), v.clone())));
        mc.metadata.labels = Some(labels.collect());
        mc.metadata.owner_references = Some(vec![OwnerReference {
            api_version: Machine::api_version(&self.ctx.capi).into_owned(),
            kind: "Machine".into(),
            name: machine.name.clone(),
            uid: machine.uid.clone().unwrap_or_default(),
            controller: Some(true),
            // true would need update permission on machines/finalizers.
            block_owner_deletion: None,
        }]);
        match api
            .create(
                &PostParams {
                    field_manager: Some(MANAGER.into()),
                    ..Default::default()
                },
                &mc,
            )
            .await
        {
            Ok(created) => Ok(Some(created)),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                Ok(api.get_opt(&machine.name).await?)
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Writes the whole status with server-side apply: fields we no longer set (a cleared
    /// failure history, the previous operation's error) are removed, which a merge patch of a
    /// struct that skips `None` would silently keep.
    pub(super) async fn write_status(
        &self,
        status: &MachineCertificatesStatus,
    ) -> Result<(), Error> {
        self.live_only()?;
        let mut status = status.clone();
        for condition in &mut status.conditions {
            condition.observed_generation = self.generation;
        }
        let apply = json!({
            "apiVersion": MachineCertificates::api_version(&()),
            "kind": MachineCertificates::kind(&()),
            "status": status,
        });
        let written = self
            .certificates()
            .patch_status(
                &self.view.name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(apply),
            )
            .await?;
        self.seen.set(written.status.as_ref());
        Ok(())
    }

    pub(super) async fn set_ready(
        &self,
        status: &mut MachineCertificatesStatus,
        ready: bool,
        reason: &str,
        message: String,
        now: Timestamp,
    ) -> Result<(), Error> {
        let before = status.clone();
        set_condition(status, conditions::READY, ready, reason, message, now);
        if *status != before {
            self.write_status(status).await?;
        }
        Ok(())
    }

    pub(super) async fn patch_machine(&self, changes: &MachineChanges<'_>) -> Result<(), Error> {
        self.live_only()?;
        match self.apply_machine_patch(&self.view, changes).await {
            Ok(()) => Ok(()),
            // A failed `test`: the trigger changed (a new request) or the Machine was replaced.
            // Apply the rest; the new trigger is handled by the next reconcile.
            Err(kube::Error::Api(status))
                if status.code == 422 && changes.remove_trigger.is_some() =>
            {
                let without = MachineChanges {
                    remove_trigger: None,
                    ..changes.clone()
                };
                Ok(self.apply_machine_patch(&self.view, &without).await?)
            }
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// Applies `changes` to the Machine, as `view` shows it.
    pub(super) async fn apply_machine_patch(
        &self,
        view: &MachineView,
        changes: &MachineChanges<'_>,
    ) -> Result<(), kube::Error> {
        let params = PatchParams {
            field_manager: Some(MANAGER.into()),
            ..Default::default()
        };
        let machines = self.machines();
        match machine_patch(view, changes) {
            MachinePatch::Json(ops) => {
                let ops: json_patch::Patch =
                    serde_json::from_value(ops).map_err(kube::Error::SerdeError)?;
                machines
                    .patch(&self.view.name, &params, &Patch::<()>::Json(ops))
                    .await?;
            }
            MachinePatch::Merge(body) => {
                machines
                    .patch(&self.view.name, &params, &Patch::Merge(body))
                    .await?;
            }
        }
        Ok(())
    }

    pub(super) async fn event(&self, type_: EventType, reason: &str, note: String) {
        if self.mode == Mode::Cache {
            // Unreachable: every Event follows a write or `live_only` (which stop cache mode).
            warn!(reason, "An Event from cached state was not published");
            return;
        }
        let reference = self.machine.object_ref(&self.ctx.capi);
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(truncate(note, 1000)),
            action: "RefreshCertificates".into(),
            secondary: None,
        };
        if let Err(err) = self.ctx.recorder.publish(&event, &reference).await {
            warn!(error = %err, reason, "Publishing an Event failed");
        }
    }
}
