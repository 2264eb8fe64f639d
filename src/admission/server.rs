//! Serves the admission webhooks over HTTPS: the trigger webhooks on `POST /mutate-machine`
//! (Machines; Clusters, MachineDeployments and CK8sControlPlanes) and the request webhook on
//! `POST /mutate-certificaterefresh`, one handler for both; the policy webhook on
//! `POST /validate-certificaterenewalpolicy` ([`super::policies`]). Every replica serves them,
//! leader or not: the answer is a pure function of the request (and, for a policy, of the time).
//! The serving certificate can be swapped while serving (a renewal needs no restart).
//!
//! The server's connection handling and limits under abuse are [`crate::serving`]'s: TLS 1.2 or
//! 1.3 only here, and anything but an `admission.k8s.io/v1` AdmissionReview on one of those
//! paths gets a 4xx.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

pub use crate::serving::Limits;

use super::Scope;
use super::certificate::Pem;

/// The path the MutatingWebhookConfiguration calls for trigger writes (on Machines, and on
/// Clusters, MachineDeployments and CK8sControlPlanes).
pub const PATH: &str = "/mutate-machine";

/// The path it calls for new CertificateRefreshes (their requester is written). Served by the
/// same handler: the decision goes by the request's kind.
pub const REQUESTS_PATH: &str = "/mutate-certificaterefresh";

/// The path the ValidatingWebhookConfiguration calls for CertificateRenewalPolicy writes.
pub const POLICIES_PATH: &str = "/validate-certificaterenewalpolicy";

/// The only review version the configuration asks for (`admissionReviewVersions: ["v1"]`).
const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";

/// The TLS versions served: 1.3 and 1.2 (what the API server speaks); older ones are refused in
/// the handshake.
pub const TLS_VERSIONS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("the webhook certificate cannot be used: {0}")]
    Certificate(String),
    #[error("listening on {address} failed: {source}")]
    Listen {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The current serving certificate.
#[derive(Debug)]
pub struct Certificates(RwLock<Arc<CertifiedKey>>);

impl Certificates {
    pub fn new(pem: &Pem) -> Result<Arc<Self>, ServeError> {
        Ok(Arc::new(Self(RwLock::new(certified_key(pem)?))))
    }

    /// Serves `pem` from the next handshake on.
    pub fn replace(&self, pem: &Pem) -> Result<(), ServeError> {
        let key = certified_key(pem)?;
        match self.0.write() {
            Ok(mut current) => *current = key,
            Err(poisoned) => *poisoned.into_inner() = key,
        }
        Ok(())
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(match self.0.read() {
            Ok(current) => current.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        })
    }
}

fn certified_key(pem: &Pem) -> Result<Arc<CertifiedKey>, ServeError> {
    let invalid = |e: &dyn std::fmt::Display| ServeError::Certificate(e.to_string());
    let chain = CertificateDer::pem_slice_iter(pem.cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(&e))?;
    let key = PrivateKeyDer::from_pem_slice(pem.key.as_bytes()).map_err(|e| invalid(&e))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| invalid(&e))?;
    Ok(Arc::new(CertifiedKey::new(chain, signing)))
}

/// Starts serving on `address` within `limits`; the accept loop ends when the task is aborted
/// (connections already accepted end by their own timeouts).
pub async fn serve(
    address: SocketAddr,
    certificates: Arc<Certificates>,
    scope: Scope,
    limits: Limits,
) -> Result<JoinHandle<()>, ServeError> {
    let listen = |source| ServeError::Listen { address, source };
    let tcp = TcpListener::bind(address).await.map_err(listen)?;
    let local = tcp.local_addr().map_err(listen)?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(TLS_VERSIONS)
    .map_err(|e| ServeError::Certificate(e.to_string()))?
    .with_no_client_auth()
    .with_cert_resolver(certificates);
    let acceptor = TlsAcceptor::from(Arc::new(config));
    tracing::info!(address = %local, path = PATH, "Serving the refresh-trigger admission webhook");
    Ok(crate::serving::serve(
        tcp,
        Some(acceptor),
        router(scope, &limits),
        limits,
    ))
}

/// The routes; a chunked body is cut at the limit (413) as it is read.
fn router(scope: Scope, limits: &Limits) -> Router {
    Router::new()
        .route(PATH, post(mutate_machine))
        .route(REQUESTS_PATH, post(mutate_machine))
        .route(POLICIES_PATH, post(validate_policy))
        .with_state(Arc::new(scope))
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
}

/// Not JSON: 400 (axum's `Json`); JSON of another shape: 422; no `Content-Type:
/// application/json`: 415; too large: 413. A well-formed review gets its answer.
async fn mutate_machine(
    State(scope): State<Arc<Scope>>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Response {
    match request_of(review) {
        Ok(request) => Json(super::review(&request, &scope).into_review()).into_response(),
        Err(why) => (StatusCode::UNPROCESSABLE_ENTITY, why).into_response(),
    }
}

/// As [`mutate_machine`], for a CertificateRenewalPolicy: its promise is checked from now on,
/// off the async workers (searching odd windows takes a while).
async fn validate_policy(
    State(scope): State<Arc<Scope>>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Response {
    let request = match request_of(review) {
        Ok(request) => request,
        Err(why) => return (StatusCode::UNPROCESSABLE_ENTITY, why).into_response(),
    };
    let now = jiff::Timestamp::now();
    let checked =
        tokio::task::spawn_blocking(move || super::policies::review(&request, &scope, now)).await;
    match checked {
        Ok(response) => Json(response.into_review()).into_response(),
        // A panic in the check: the API server's failurePolicy (Ignore) decides.
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response(),
    }
}

/// The request of a well-formed review, or why another is unprocessable (a 422).
fn request_of(
    review: AdmissionReview<DynamicObject>,
) -> Result<AdmissionRequest<DynamicObject>, String> {
    if review.types.kind != "AdmissionReview" || review.types.api_version != REVIEW_API_VERSION {
        return Err(format!("expected an {REVIEW_API_VERSION} AdmissionReview"));
    }
    review
        .try_into()
        .map_err(|err: kube::core::admission::ConvertAdmissionReviewError| err.to_string())
}

#[cfg(test)]
mod tests;
