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
//! over a real k8sd connection. Persisting progress (the seed before `run`, the attempt count) is
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

/// The approve call, sent to a control-plane node of the same cluster.
pub trait ApproveApi: Send {
    fn approve(&mut self, seed: i64) -> impl Future<Output = Result<(), K8sdError>> + Send;
}
