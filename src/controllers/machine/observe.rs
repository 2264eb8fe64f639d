//! What a reconcile reads, once per source: the watch caches first, then (when [`next`] asks)
//! the API server. Everything read is kept in [`Observed`]; [`next`] decides on it.

use std::sync::Arc;

use ck8s_certs_api::annotations::IN_FLIGHT_REFRESH;
use ck8s_certs_api::capi::WATCH_FILTER_LABEL;
use ck8s_certs_api::certificate_refresh::CertificateRefresh;
use ck8s_certs_api::machine::{Cluster, ClusterView, Machine, MachineView};
use ck8s_certs_api::machine_certificates::{MachineCertificates, Operation, Role};
use jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tracing::info;

use super::journal::Requests;
use super::next::{self, Certificates, Next, Source, Summary};
use super::report::create_certificates;
use super::rest::{Planned, Renewals};
use super::{Context, Error, MANAGER};
use crate::controllers::executor::{Parked, Waiter};
use crate::controllers::stores;

/// What a reconcile has read of a Machine's state.
pub(super) struct Observed {
    pub source: Source,
    pub machine: Arc<Machine>,
    pub view: MachineView,
    pub cluster: Option<ClusterView>,
    pub certificates: Certificates,
    /// The operation of the request the Machine names as in flight (live only).
    pub request: Option<Operation>,
    pub parked: Option<Parked>,
    pub kept_outcome: bool,
    /// What the caches' pass planned to write for the Machine at rest.
    pub planned: Option<Planned>,
}

impl Observed {
    /// The Machine as the caches show it.
    pub fn cached(ctx: &Context, machine: Arc<Machine>) -> Self {
        let view = MachineView::of(&machine);
        let cluster = view.cluster.as_deref().and_then(|name| {
            stores::get_capi(&ctx.stores.clusters, ctx.capi(), &view.namespace, name)
        });
        let certificates = match stores::get(&ctx.stores.certificates, &view.namespace, &view.name)
        {
            None => Certificates::Missing,
            Some(cached) => match cached.status() {
                Err(_) => Certificates::Unreadable,
                // The generation its conditions were last written with: the spec (the
                // cluster's name) does not change.
                Ok(status) => Certificates::Read {
                    generation: status
                        .as_ref()
                        .and_then(|s| s.conditions.iter().find_map(|c| c.observed_generation)),
                    digest: cached.digest(),
                    status,
                },
            },
        };
        Self {
            source: Source::Cache,
            cluster: cluster.map(|c| ClusterView::of(&c)),
            certificates,
            request: None,
            parked: parked(ctx, &view),
            kept_outcome: ctx.outcomes.get(&view.namespace, &view.name).is_some(),
            planned: None,
            machine,
            view,
        }
    }

    /// What to do next with what is read so far.
    pub fn next(&self, ctx: &Context, now: Timestamp) -> Next {
        // Only a Machine at rest from the caches is judged by its verdict here.
        let governing = match self.source {
            Source::Cache => crate::controllers::governing_policy::governing(
                &ctx.stores.policies,
                &ctx.stores.policy_readings,
                &self.view.namespace,
                self.cluster.as_ref().map(|c| &c.labels),
                &self.view.labels,
            ),
            Source::Live | Source::Fresh => crate::controllers::governing_policy::Governing::None,
        };
        let gate = || {
            let labels = self.cluster.as_ref().map(|c| &c.labels);
            ctx.renewal_gate(&self.view, labels, &governing, now)
        };
        let renewals = Renewals {
            governing: &governing,
            settings: ctx.config().renewal,
            resync: ctx.config().resync,
            gate: &gate,
        };
        next::next(
            &Summary {
                source: self.source,
                machine: &self.view,
                cluster: self.cluster.as_ref(),
                certificates: &self.certificates,
                request: self.request.as_ref(),
                parked: self.parked.as_ref(),
                kept_outcome: self.kept_outcome,
                renewals: &renewals,
                planned: self.planned.as_ref(),
            },
            now,
        )
    }

    /// Reads what `source` gives: the Cluster, the MachineCertificates (created when missing,
    /// unless the Cluster is paused) and the request the Machine names from the API server,
    /// and for [`Source::Fresh`] the Machine itself first. `planned`: what the caches' pass
    /// planned, kept to be written if what is read shows the same.
    pub async fn read(
        self,
        ctx: &Context,
        source: Source,
        planned: Option<Planned>,
    ) -> Result<Self, Error> {
        let (machine, view, parked) = match source {
            Source::Fresh => {
                let api: Api<Machine> =
                    Api::namespaced_with(ctx.client().clone(), &self.view.namespace, &ctx.capi());
                let Some(fresh) = api.get_opt(&self.view.name).await? else {
                    // Gone: nothing left to do for it.
                    return Ok(Self {
                        source,
                        certificates: Certificates::Missing,
                        ..self
                    });
                };
                let view = MachineView::of(&fresh);
                let parked = parked(ctx, &view);
                (Arc::new(fresh), view, parked)
            }
            Source::Cache | Source::Live => (self.machine, self.view, self.parked),
        };
        let cluster = cluster(ctx, &view).await?;
        // Nothing is created for a paused Cluster: `clusterctl move` pauses it, then deletes
        // our objects before their Machines; one created in between would be left behind.
        let create = !cluster.as_ref().is_some_and(|c| c.paused);
        let certificates = match machine_certificates(ctx, &view, create).await? {
            None => Certificates::Missing,
            Some(mc) => Certificates::Read {
                digest: stores::status_digest(mc.status.as_ref()),
                generation: mc.metadata.generation,
                status: mc.status,
            },
        };
        // An outcome whose write failed is journaled before the request is read: resuming the
        // request as still Running would send the node a second `run`.
        if !matches!(certificates, Certificates::Missing) {
            write_kept_outcome(ctx, &view).await?;
        }
        let request = match view.annotation(IN_FLIGHT_REFRESH) {
            Some(name) if !matches!(certificates, Certificates::Missing) => {
                let api: Api<CertificateRefresh> =
                    Api::namespaced(ctx.client().clone(), &view.namespace);
                api.get_opt(name)
                    .await?
                    .and_then(|r| r.status)
                    .and_then(|s| s.operation)
            }
            _ => None,
        };
        Ok(Self {
            source,
            machine,
            view,
            cluster,
            certificates,
            request,
            parked,
            kept_outcome: false,
            planned,
        })
    }
}

/// The Machine's role.
pub(super) fn role(view: &MachineView) -> Role {
    if view.control_plane {
        Role::ControlPlane
    } else {
        Role::Worker
    }
}

/// The Machine as the executor knows it.
pub(super) fn waiter(view: &MachineView) -> Waiter {
    Waiter {
        namespace: view.namespace.clone(),
        machine: view.name.clone(),
    }
}

/// The refresh this process parked for the request the Machine names.
fn parked(ctx: &Context, view: &MachineView) -> Option<Parked> {
    let request = view.annotation(IN_FLIGHT_REFRESH)?;
    let pending = || super::connector::control_planes_pending(&ctx.stores.machines, view);
    ctx.executor
        .look(&waiter(view), request, role(view), pending)
}

async fn cluster(ctx: &Context, view: &MachineView) -> Result<Option<ClusterView>, Error> {
    let Some(name) = view.cluster.as_deref() else {
        return Ok(None);
    };
    let api: Api<Cluster> =
        Api::namespaced_with(ctx.client().clone(), &view.namespace, &ctx.capi());
    Ok(api.get_opt(name).await?.map(|c| ClusterView::of(&c)))
}

/// The Machine's MachineCertificates, created (owned by the Machine) when missing and
/// `create`.
async fn machine_certificates(
    ctx: &Context,
    view: &MachineView,
    create: bool,
) -> Result<Option<MachineCertificates>, Error> {
    let api: Api<MachineCertificates> = Api::namespaced(ctx.client().clone(), &view.namespace);
    if let Some(existing) = api.get_opt(&view.name).await? {
        // Sharding: the record follows its Machine into another shard's watch.
        let filter = |labels: &std::collections::BTreeMap<String, String>| {
            labels.get(WATCH_FILTER_LABEL).cloned()
        };
        let moved = crate::controllers::shard::label_patch(
            filter(&view.labels).as_deref(),
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
                api.patch(&view.name, &params, &Patch::Merge(patch)).await?,
            ));
        }
        return Ok(Some(existing));
    }
    if view.deleting || !create {
        return Ok(None);
    }
    Ok(create_certificates(ctx.client(), ctx.capi(), view).await?)
}

/// Writes an outcome kept after its write failed ([`outcome`](super::outcome)) into its
/// request, before the reconcile reads the request; an error stops the reconcile (it is tried
/// again later, and the node is never touched meanwhile).
async fn write_kept_outcome(ctx: &Context, view: &MachineView) -> Result<(), Error> {
    let outcomes = &ctx.outcomes;
    let Some((name, op)) = outcomes.get(&view.namespace, &view.name) else {
        return Ok(());
    };
    let requests = Requests {
        client: ctx.client(),
        capi: ctx.capi(),
        machine: view,
        role: role(view),
    };
    requests.write_named(&name, &op).await?;
    info!(
        request = name,
        "The kept outcome was written to its request"
    );
    outcomes.forget(&view.namespace, &view.name, &name);
    Ok(())
}
