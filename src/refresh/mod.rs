//! The k8sd side of one certificate refresh.
//!
//! ```text
//! control plane:  plan ──► run(seed, ttl, SANs)
//! worker:         plan ──► run(seed, ttl) on the worker   ┐ concurrently: run blocks until
//!                          approve(seed) on a control plane ┘ approve has approved its CSRs
//! ```
//!
//! [`flow`] holds the sequencing, retries and result interpretation, generic over
//! [`NodeApi`]/[`ApproveApi`] so it is unit-tested with fakes; [`session`] implements those traits
//! over a real k8sd connection; [`csr`] is what may be approved. Persisting progress (the seed before `run`, the attempt count) is
//! the controller's job: the flow calls back before every `run`.

pub mod band;
pub mod csr;
pub mod flow;
pub mod session;
pub mod trigger;

use std::future::Future;

use crate::k8sd::K8sdError;
use crate::k8sd::wire::{PlanResponse, RunRequest, RunResponse};

/// The calls a refresh makes to the node being refreshed.
pub trait NodeApi: Send {
    fn plan(&mut self) -> impl Future<Output = Result<PlanResponse, K8sdError>> + Send;
    fn run(
        &mut self,
        request: &RunRequest,
    ) -> impl Future<Output = Result<RunResponse, K8sdError>> + Send;
    /// The fingerprint of the certificate the node presented (trust on first use), once known.
    fn fingerprint(&self) -> Option<String> {
        None
    }
}

/// What the workload cluster holds of a worker's CSRs of one seed, checked ([`csr::check`]).
#[derive(Debug)]
pub enum Verification {
    /// All three exist and pass: they may be approved.
    Verified,
    /// Not all exist yet (`run` creates them), or they cannot be read now: why.
    Pending(String),
    /// One does not pass: none may be approved.
    Unverified(csr::Mismatch),
}

/// Approving a worker's CSRs: `approve` is sent to a control-plane node of the same cluster,
/// and only for CSRs that were read from the workload cluster and verified first (k8sd approves
/// by name, without looking).
pub trait ApproveApi: Send {
    fn approve(&mut self, seed: i64) -> impl Future<Output = Result<(), K8sdError>> + Send;
    /// Reads the worker's CSRs of `seed` and checks those that exist against the worker, whose
    /// `run` asked for `expiration_seconds`.
    fn verify(
        &mut self,
        seed: i64,
        expiration_seconds: i64,
    ) -> impl Future<Output = Verification> + Send;
    /// Denies the CSRs of `seed` that are not decided yet, saying why: the worker's `run` then
    /// ends (it fails on a denied CSR) instead of waiting for its deadline, and nothing approves
    /// them later. Best effort: a failure is logged.
    fn deny(&mut self, seed: i64, why: &csr::Mismatch) -> impl Future<Output = ()> + Send;
}
