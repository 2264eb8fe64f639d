//! What a Machine's refreshes show: its MachineCertificates (created with the Machine as owner;
//! the status written whole with server-side apply), our annotation keys on the Machine, and
//! Events about it.

use std::sync::{Mutex, PoisonError};

use crate::events::{Event, EventType, Recorder};
use ck8s_certs_api::capi::{CLUSTER_NAME_LABEL, WATCH_FILTER_LABEL};
use ck8s_certs_api::machine::{CapiVersion, Machine, MachineView};
use ck8s_certs_api::machine_certificates::{
    MachineCertificates, MachineCertificatesSpec, MachineCertificatesStatus,
};
use ck8s_certs_api::reasons::conditions;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};
use serde_json::json;
use tracing::warn;

use super::{Error, MANAGER};
use crate::controllers::patches::{MachineChanges, MachinePatch, machine_patch, set_condition};
use crate::text::truncate;

/// Writes what a Machine's reconcile shows, about the Machine as last read or written.
#[derive(Clone, Copy)]
pub(super) struct Reporter<'a> {
    pub client: &'a Client,
    pub capi: CapiVersion,
    pub recorder: &'a Recorder,
    pub machine: &'a MachineView,
    /// The Machine the Events are about.
    pub reference: &'a ObjectReference,
    /// The MachineCertificates' `metadata.generation`: the conditions' `observedGeneration`.
    pub generation: Option<i64>,
    pub seen: &'a Seen,
}

/// A digest of the MachineCertificates' status as a reconcile last read or wrote it: a refresh
/// that parks notes it, and when woken goes on from the cache if the cache shows that status.
#[derive(Default)]
pub(super) struct Seen(Mutex<Option<u64>>);

impl Seen {
    pub fn set(&self, status: Option<&MachineCertificatesStatus>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(crate::controllers::stores::status_digest(status));
    }

    pub fn get(&self) -> Option<u64> {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Reporter<'_> {
    fn certificates(&self) -> Api<MachineCertificates> {
        Api::namespaced(self.client.clone(), &self.machine.namespace)
    }

    /// Writes the whole status with server-side apply: fields we no longer set (a cleared
    /// failure history, the previous operation's error) are removed, which a merge patch of a
    /// struct that skips `None` would silently keep.
    pub async fn write_status(&self, status: &MachineCertificatesStatus) -> Result<(), Error> {
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
                &self.machine.name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(apply),
            )
            .await?;
        self.seen.set(written.status.as_ref());
        Ok(())
    }

    /// Writes `desired` when it differs from `current`.
    pub async fn update_status(
        &self,
        current: &MachineCertificatesStatus,
        desired: &MachineCertificatesStatus,
    ) -> Result<(), Error> {
        if desired != current {
            self.write_status(desired).await?;
        }
        Ok(())
    }

    /// Sets the Ready condition, written only when it changes.
    pub async fn set_ready(
        &self,
        status: &mut MachineCertificatesStatus,
        ready: bool,
        reason: &str,
        message: String,
        now: Timestamp,
    ) -> Result<(), Error> {
        let before = status.clone();
        set_condition(status, conditions::READY, ready, reason, message, now);
        self.update_status(&before, status).await
    }

    pub async fn patch_machine(&self, changes: &MachineChanges<'_>) -> Result<(), Error> {
        match self.apply_machine_patch(self.machine, changes).await {
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
                Ok(self.apply_machine_patch(self.machine, &without).await?)
            }
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// Applies `changes` to the Machine, as `view` shows it.
    pub async fn apply_machine_patch(
        &self,
        view: &MachineView,
        changes: &MachineChanges<'_>,
    ) -> Result<(), kube::Error> {
        let params = PatchParams {
            field_manager: Some(MANAGER.into()),
            ..Default::default()
        };
        let machines: Api<Machine> =
            Api::namespaced_with(self.client.clone(), &view.namespace, &self.capi);
        let patch = match machine_patch(view, changes) {
            MachinePatch::Json(ops) => {
                let ops: json_patch::Patch =
                    serde_json::from_value(ops).map_err(kube::Error::SerdeError)?;
                Patch::<serde_json::Value>::Json(ops)
            }
            MachinePatch::Merge(body) => Patch::Merge(body),
        };
        machines.patch(&view.name, &params, &patch).await?;
        Ok(())
    }

    /// An Event about the Machine's Cluster (as cached), when it is known.
    pub async fn cluster_event(
        &self,
        clusters: &kube::runtime::reflector::Store<ck8s_certs_api::machine::Cluster>,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let view = self.machine;
        let Some(cluster) = view.cluster.as_deref().and_then(|name| {
            crate::controllers::stores::get_capi(clusters, self.capi, &view.namespace, name)
        }) else {
            return;
        };
        let reference = cluster.object_ref(&self.capi);
        self.publish(&reference, type_, reason, note).await;
    }

    pub async fn event(&self, type_: EventType, reason: &str, note: String) {
        self.publish(self.reference, type_, reason, note).await;
    }

    async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(truncate(note, 1000)),
            action: "RefreshCertificates".into(),
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&event, regarding).await {
            warn!(error = %err, reason, "Publishing an Event failed");
        }
    }
}

/// Creates `machine`'s MachineCertificates as its own reconcile would (owned by the Machine,
/// with its cluster and watch-filter labels); one created meanwhile is read back.
pub(super) async fn create_certificates(
    client: &Client,
    capi: CapiVersion,
    machine: &MachineView,
) -> Result<Option<MachineCertificates>, kube::Error> {
    let api: Api<MachineCertificates> = Api::namespaced(client.clone(), &machine.namespace);
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
    mc.metadata.owner_references = Some(vec![owner(machine, capi)]);
    let params = PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    match api.create(&params, &mc).await {
        Ok(created) => Ok(Some(created)),
        Err(kube::Error::Api(status)) if status.code == 409 => api.get_opt(&machine.name).await,
        Err(err) => Err(err),
    }
}

/// The Machine as the controlling owner of our objects about it (garbage-collected with it).
pub(super) fn owner(machine: &MachineView, capi: CapiVersion) -> OwnerReference {
    OwnerReference {
        api_version: Machine::api_version(&capi).into_owned(),
        kind: "Machine".into(),
        name: machine.name.clone(),
        uid: machine.uid.clone().unwrap_or_default(),
        controller: Some(true),
        // true would need update permission on machines/finalizers.
        block_owner_deletion: None,
    }
}
