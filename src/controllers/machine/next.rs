//! What a reconcile does next, from what it has read so far: a pure function of a [`Summary`]
//! (the Machine, its Cluster, its MachineCertificates, the request it names, the refresh this
//! process parked for it) and the time. One exhaustive match, in the style of kube-runtime's
//! finalizer: the reconcile reads, asks, and either reads more, rests, or acts.
//!
//! A reconcile starts from the watch caches. A Machine at rest whose caches show what settling
//! it would show is done there, at no request; anything else is read live. A stale cache is a
//! case here, not an exception: a step that shows an outcome on the Machine (`Record`) is taken
//! only on the Machine read from the API server.

use ck8s_certs_api::annotations::{
    IN_FLIGHT_REFRESH, REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS, RefreshStatus,
};
use ck8s_certs_api::machine::{ClusterView, MachineView};
use ck8s_certs_api::machine_certificates::{MachineCertificatesStatus, Operation};
use jiff::Timestamp;

use super::rest::{After, Planned, Renewals, Settled, settle};
use super::step::{Step, decide_waiting};
use crate::controllers::executor::{Parked, WAITING_RECHECK};

/// Where a pass read what it knows, least to most expensive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// The watch caches: no request.
    Cache,
    /// The Cluster, the MachineCertificates and the request the Machine names from the API
    /// server; the Machine from the cache.
    Live,
    /// The Machine from the API server too.
    Fresh,
}

/// The Machine's MachineCertificates as read.
// One per reconcile, never in a collection: boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Certificates {
    /// None: the cache has none yet, or (live) none and none is created (the Machine is being
    /// deleted, its Cluster paused).
    Missing,
    /// A status this version cannot read (read live, where the error is reported).
    Unreadable,
    Read {
        status: Option<MachineCertificatesStatus>,
        /// `metadata.generation`: the conditions' `observedGeneration` (from the cache: the one
        /// its conditions were last written with).
        generation: Option<i64>,
        /// Its [`status_digest`](crate::controllers::stores::status_digest).
        digest: u64,
    },
}

/// What a reconcile knows so far.
pub struct Summary<'a> {
    pub source: Source,
    pub machine: &'a MachineView,
    pub cluster: Option<&'a ClusterView>,
    pub certificates: &'a Certificates,
    /// The operation of the request the Machine names as in flight (read live only).
    pub request: Option<&'a Operation>,
    /// The refresh this process parked for the request the Machine names.
    pub parked: Option<&'a Parked>,
    /// An outcome whose write to its request failed is kept, to be written first.
    pub kept_outcome: bool,
    /// The renewal verdict's inputs (a Machine at rest from the caches).
    pub renewals: &'a Renewals<'a>,
    /// What settling the Machine at rest from the caches would write (read live only).
    pub planned: Option<&'a Planned>,
}

/// What the reconcile does next.
// One per pass of a reconcile: boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Next {
    /// Nothing to write: look again then.
    Rest(After),
    /// Read what this source gives, then ask again.
    Read(Source),
    /// Carry the step out on what was read.
    Act(Step),
    /// Read live; write this plan of a Machine at rest when the API server shows what it was
    /// computed from.
    Confirm(Box<Planned>),
    /// Write what the caches' pass planned for this step of rest (the API server shows the
    /// same).
    Show(Step, Box<Settled>),
}

/// The next step of a reconcile that knows `summary`, at `now`.
pub fn next(summary: &Summary<'_>, now: Timestamp) -> Next {
    let Summary {
        source,
        machine,
        cluster,
        certificates,
        request,
        parked,
        kept_outcome,
        renewals,
        planned,
    } = summary;
    let read = match certificates {
        Certificates::Read {
            status,
            generation,
            digest,
        } => Some((status.as_ref(), *generation, *digest)),
        Certificates::Missing | Certificates::Unreadable => None,
    };
    let waiting = parked.and_then(|p| p.op.as_ref());
    match (source, parked, read) {
        // Parked, still asked for and still unable to go: nothing worth reading.
        (Source::Cache, Some(parked), _)
            if parked.blocked && waiting.is_none_or(|op| still_asked(machine, op)) =>
        {
            Next::Rest(After::Requeue(WAITING_RECHECK))
        }
        // Woken, with the caches showing what it left (the Machine still asking for it, the
        // status as it last saw it): it goes on without reading anything.
        (Source::Cache, Some(parked), Some((status, Some(_), digest)))
            if waiting.is_some()
                && parked.seen == Some(digest)
                && !kept_outcome
                && cluster.is_some() =>
        {
            match decide_waiting(machine, *cluster, status, None, waiting) {
                step @ Step::Continue(_) => Next::Act(step),
                _ => Next::Read(Source::Live),
            }
        }
        // A request in flight is read live; so is a MachineCertificates the cache lacks or
        // cannot read.
        (Source::Cache, _, None) => Next::Read(Source::Live),
        (Source::Cache, _, Some(_)) if machine.annotation(IN_FLIGHT_REFRESH).is_some() => {
            Next::Read(Source::Live)
        }
        // At rest from the caches when settling writes nothing; what it writes is planned here
        // and written once read live. A Cluster the cache lacks is looked up live before it is
        // reported missing.
        (Source::Cache, _, Some((status, _, digest))) => {
            let step = decide_waiting(machine, *cluster, status, None, None);
            let current = status.cloned().unwrap_or_default();
            match settle(&step, machine, *cluster, &current, renewals, now) {
                _ if step == Step::ClusterMissing => Next::Read(Source::Live),
                Some(settled) if settled.quiet(&current) => Next::Rest(settled.after),
                Some(settled) => Next::Confirm(Box::new(Planned {
                    step,
                    digest,
                    cluster: cluster.cloned(),
                    settled,
                })),
                None => Next::Read(Source::Live),
            }
        }
        // Live: none is there and none was created (deleting, or its Cluster paused).
        (Source::Live | Source::Fresh, _, None) => Next::Rest(After::Change),
        (Source::Live | Source::Fresh, _, Some((status, _, digest))) => {
            match decide_waiting(machine, *cluster, status, *request, waiting) {
                // Recording shows an outcome on the Machine (done, the trigger removed) because
                // the Machine still shows the refresh: a cache behind would show our own
                // in-progress after a newer request was taken up.
                Step::Record(_) if *source == Source::Live => Next::Read(Source::Fresh),
                step => match planned {
                    // The API server shows what the caches' plan was computed from.
                    Some(p)
                        if p.step == step
                            && p.digest == digest
                            && p.cluster.as_ref() == *cluster =>
                    {
                        Next::Show(step, Box::new(p.settled.clone()))
                    }
                    _ => Next::Act(step),
                },
            }
        }
    }
}

/// Whether the Machine still asks for the parked `op`: the same trigger (none for a policy's),
/// shown in progress.
fn still_asked(machine: &MachineView, op: &Operation) -> bool {
    machine.annotation(REFRESH_CERTIFICATES_STATUS) == Some(RefreshStatus::InProgress.as_str())
        && machine.annotation(REFRESH_CERTIFICATES) == op.trigger.as_deref()
}

#[cfg(test)]
mod tests;
