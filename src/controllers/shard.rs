//! Sharding by `--watch-filter`: which controller instance carries out a Machine's operation
//! when the Machine moves between shards, and keeping its MachineCertificates in the Machine's
//! shard.
//!
//! Each instance (one per watch filter) holds its own leader Lease, so two instances act at
//! once. A Machine relabelled while a refresh of its node is in flight would otherwise be taken
//! up by the new shard as an interrupted operation (a second `plan` and `run` on a node that is
//! still being refreshed), which the one-refresh-at-a-time promise forbids. So:
//! - an operation names its [`Carrier`] (Lease and holder) in its request (the
//!   `CertificateRefresh` the Machine names), written with the resourceVersion just read as a
//!   precondition, in the write that records an attempt's seed before its `run` (`plan` changes
//!   nothing on the node) ([`Shard::claim`]): of two instances starting at once, one wins;
//! - an instance finding an unfinished operation of another carrier leaves it alone while that
//!   carrier still holds its Lease ([`verdict`]); the Machine's `Refreshing` condition then says
//!   who carries it out;
//! - the instance whose Machine left its filter finishes what it started (its reconcile is not
//!   cancelled by the watch) and records it.
//!
//! Lease expiry is judged as in [`crate::leader`]: by how long the record stayed unchanged on
//! our own clock, never by the holder's `renewTime`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ck8s_certs_api::capi::WATCH_FILTER_LABEL;
use ck8s_certs_api::certificate_refresh::{CertificateRefresh, CertificateRefreshStatus};
use ck8s_certs_api::machine_certificates::{Carrier, MachineCertificates, Operation};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::leader::{Claim, claim};

/// How soon an instance that leaves an operation to another carrier looks again.
pub const RECHECK: Duration = Duration::from_secs(2);

/// How long a finished operation of another, live carrier is left for it to show on the
/// Machine (it does so right after recording the outcome) before any instance may.
pub const RECORD_GRACE: Duration = Duration::from_secs(30);

/// What an instance may do with an operation found in a Machine's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Ours, ownerless (written before sharding existed), or its carrier is gone.
    Proceed,
    /// Another live instance carries it out: look again after `retry`.
    Leave { carrier: Carrier, retry: Duration },
}

/// Decides from the operation, our own identity and the carrier's Lease as last read (with how
/// long that record stayed unchanged in our observation). Pure.
///
/// The carrier is live while its Lease is held by the same holder and not expired. A carrier
/// whose Lease we hold is a previous leader of our own shard, and one whose Lease changed
/// holder has stopped (crash or hand-over): the operation is then resumed from the record, as
/// after any crash.
pub fn verdict(
    op: &Operation,
    ours: Option<&Carrier>,
    lease: Option<&LeaseSpec>,
    unchanged_for: Duration,
) -> Verdict {
    let Some(carrier) = op.carrier.as_ref() else {
        return Verdict::Proceed;
    };
    if ours.is_some_and(|ours| ours.lease == carrier.lease) {
        return Verdict::Proceed;
    }
    let Some(spec) = lease else {
        return Verdict::Proceed;
    };
    if spec.holder_identity.as_deref() != Some(carrier.holder.as_str()) {
        return Verdict::Proceed;
    }
    // `claim` answers for a candidate that is not the holder: Wait while the Lease is current.
    let candidate = ours.map_or("", |o| o.holder.as_str());
    match claim(Some(spec), candidate, unchanged_for) {
        Claim::Wait(left) => Verdict::Leave {
            carrier: carrier.clone(),
            retry: left.clamp(Duration::from_millis(100), RECHECK),
        },
        Claim::Take | Claim::Renew => Verdict::Proceed,
    }
}

/// Whether a finished operation is still left to its carrier to show on the Machine: only just
/// after it finished. A carrier that cannot finish the job (it failed to patch the Machine and
/// no longer sees it) must not block the new shard for long.
pub fn leave_record(op: &Operation, now: Timestamp) -> bool {
    op.finished_at.as_ref().is_some_and(|finished| {
        now.duration_since(finished.0)
            .try_into()
            .is_ok_and(|age: Duration| age < RECORD_GRACE)
    })
}

/// The merge patch that brings a MachineCertificates' watch-filter label to the Machine's
/// (`None` when it already matches): a filtered instance watches only MachineCertificates of its
/// own shard. A Machine without the label removes it.
pub fn label_patch(machine: Option<&str>, certificates: Option<&str>) -> Option<Value> {
    (machine != certificates)
        .then(|| json!({ "metadata": { "labels": { WATCH_FILTER_LABEL: machine } } }))
}

/// The message of the `Refreshing` condition while another instance carries the operation out.
pub fn leave_message(carrier: &Carrier) -> String {
    format!(
        "Carried out by {} (holder {}), another controller instance: this one takes over only if that Lease expires or changes holder",
        carrier.lease, carrier.holder
    )
}

#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("reading Lease {lease} failed: {source}")]
    Lease {
        lease: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// Our identity and what we observed of other instances' Leases.
pub struct Shard {
    client: Client,
    ours: Option<Carrier>,
    /// Per Lease: the record last read and when (our clock) it last changed.
    observed: Mutex<HashMap<String, (Option<LeaseSpec>, Instant)>>,
    /// The time decisions are taken at.
    clock: crate::clock::SharedClock,
}

/// What [`Shard::claim`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Claimed {
    /// The record now names us; go on.
    Ours,
    /// Another instance claimed or changed the record since it was read: look again.
    Lost,
}

impl Shard {
    /// `ours` is `None` without leader election (no Lease: nobody can be told to wait for us).
    pub fn new(client: Client, ours: Option<Carrier>, clock: crate::clock::SharedClock) -> Self {
        Self {
            client,
            ours,
            observed: Mutex::new(HashMap::new()),
            clock,
        }
    }

    pub fn ours(&self) -> Option<Carrier> {
        self.ours.clone()
    }

    /// The verdict on `op`, reading its carrier's Lease when it is another instance's.
    pub async fn check(&self, op: &Operation) -> Result<Verdict, ShardError> {
        let Some(carrier) = op.carrier.as_ref() else {
            return Ok(Verdict::Proceed);
        };
        if self.ours.as_ref().is_some_and(|o| o.lease == carrier.lease) {
            return Ok(Verdict::Proceed);
        }
        let (spec, unchanged_for) = self.observe(&carrier.lease).await?;
        Ok(verdict(
            op,
            self.ours.as_ref(),
            spec.as_ref(),
            unchanged_for,
        ))
    }

    async fn observe(&self, lease: &str) -> Result<(Option<LeaseSpec>, Duration), ShardError> {
        let Some((namespace, name)) = lease.split_once('/') else {
            // Not a Lease we could read: nobody can be waited for.
            return Ok((None, Duration::ZERO));
        };
        let read = Api::<Lease>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|source| ShardError::Lease {
                lease: lease.to_owned(),
                source,
            })?;
        let spec = read.and_then(|l| l.spec);
        let now = Instant::now();
        let mut observed = match self.observed.lock() {
            Ok(map) => map,
            Err(poisoned) => poisoned.into_inner(),
        };
        let entry = observed
            .entry(lease.to_owned())
            .or_insert_with(|| (spec.clone(), now));
        if entry.0 != spec {
            *entry = (spec.clone(), now);
        }
        Ok((spec, now.duration_since(entry.1)))
    }

    /// Names us as the carrier of `op` in its request (`CertificateRefresh` `name`), on the
    /// condition that the request did not change since it was read fresh here and holds no
    /// other unfinished operation than `op` itself. `status` is the request's status as `op`
    /// makes it. The write is a server-side apply of the whole status carrying that
    /// resourceVersion, which the API server takes as a precondition (409 on a change).
    pub async fn claim(
        &self,
        namespace: &str,
        name: &str,
        op: &mut Operation,
        status: impl Fn(&Operation) -> CertificateRefreshStatus,
        manager: &str,
    ) -> Result<Claimed, ShardError> {
        let Some(ours) = self.ours.clone() else {
            return Ok(Claimed::Ours);
        };
        let api: Api<CertificateRefresh> = Api::namespaced(self.client.clone(), namespace);
        let Some(fresh) = api.get_opt(name).await? else {
            return Ok(Claimed::Lost);
        };
        let current = fresh.status.as_ref().and_then(|s| s.operation.as_ref());
        // Another unfinished operation: left alone while its carrier lives (a stale one of
        // ours, or of a carrier that is gone, is replaced).
        if let Some(current) = current
            && !current.is_finished()
            && !same_operation(current, op)
            && matches!(self.check(current).await?, Verdict::Leave { .. })
        {
            return Ok(Claimed::Lost);
        }
        op.carrier = Some(ours);
        Ok(
            match write_unchanged(&api, &fresh, &status(op), manager).await? {
                true => Claimed::Ours,
                false => Claimed::Lost,
            },
        )
    }

    /// Shows in the `Refreshing` condition that another instance carries the operation out,
    /// written only if the record did not change since read here (never over the carrier's
    /// own progress).
    pub async fn show_left(
        &self,
        namespace: &str,
        name: &str,
        carrier: &Carrier,
        manager: &str,
    ) -> Result<(), ShardError> {
        let api: Api<MachineCertificates> = Api::namespaced(self.client.clone(), namespace);
        let Some(fresh) = api.get_opt(name).await? else {
            return Ok(());
        };
        let mut status = fresh.status.clone().unwrap_or_default();
        let message = leave_message(carrier);
        let shown = status.conditions.iter().any(|c| {
            c.type_ == ck8s_certs_api::reasons::conditions::REFRESHING && c.message == message
        });
        if shown {
            return Ok(());
        }
        super::patches::set_condition(
            &mut status,
            ck8s_certs_api::reasons::conditions::REFRESHING,
            true,
            ck8s_certs_api::reasons::condition_reasons::REFRESH_IN_PROGRESS,
            message,
            self.clock.now(),
        );
        // Not written when the carrier wrote first: shown at the next look, if still needed.
        write_unchanged(&api, &fresh, &status, manager).await?;
        Ok(())
    }
}

/// Writes `status` over `fresh`'s on the condition that the record did not change since it was
/// read: a server-side apply carrying its resourceVersion, which the API server takes as a
/// precondition. `false`: it changed (409), nothing was written.
async fn write_unchanged<K>(
    api: &Api<K>,
    fresh: &K,
    status: &impl serde::Serialize,
    manager: &str,
) -> Result<bool, ShardError>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let apply = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": { "resourceVersion": fresh.meta().resource_version },
        "status": status,
    });
    let params = PatchParams::apply(manager).force();
    match api
        .patch_status(&fresh.name_any(), &params, &Patch::Apply(apply))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(err) => Err(err.into()),
    }
}

/// What a reconcile is about to do with an operation that may carry another instance's name.
#[derive(Clone, Copy, Debug)]
pub enum Acting<'a> {
    /// Go on with an interrupted operation.
    Resume(&'a Operation),
    /// Show a finished operation.
    Record(&'a Operation),
}

/// Before `acting`: how long to leave the Machine alone because another live instance carries
/// out (or has just finished and is recording) its operation, shown in the record. `None`: go
/// on.
pub async fn gate(
    shard: &Shard,
    acting: Acting<'_>,
    namespace: &str,
    name: &str,
    manager: &str,
) -> Result<Option<Duration>, ShardError> {
    let op = match acting {
        Acting::Resume(op) => op,
        Acting::Record(op) if leave_record(op, shard.clock.now()) => op,
        Acting::Record(_) => return Ok(None),
    };
    match shard.check(op).await? {
        Verdict::Proceed => Ok(None),
        Verdict::Leave { carrier, retry } => {
            tracing::info!(lease = %carrier.lease, holder = %carrier.holder, "The operation is carried out by another controller instance; leaving it to it");
            if !op.is_finished() {
                shard.show_left(namespace, name, &carrier, manager).await?;
            }
            Ok(Some(retry))
        }
    }
}

/// The same operation (an interrupted one being resumed): same start and request.
fn same_operation(a: &Operation, b: &Operation) -> bool {
    a.started_at == b.started_at && a.trigger == b.trigger && a.origin == b.origin
}

#[cfg(test)]
mod tests;
