//! Serves the admission webhooks over HTTPS: the trigger webhooks on `POST /mutate-machine`
//! (Machines; Clusters, MachineDeployments and CK8sControlPlanes) and the request webhook on
//! `POST /mutate-certificaterefresh`, one handler for both. Every replica serves them, leader or
//! not: the answer is a pure function of the request. The serving certificate can be swapped
//! while serving (a renewal needs no restart).
//!
//! The port is reachable by whatever can reach the pod (the API server's source cannot be
//! narrowed in general: see `config/network-policy`), so the server holds under abuse, within
//! [`Limits`]: TLS 1.2 or 1.3 only; a TLS handshake, the headers of each request and each whole
//! request are timed; a connection on which nothing moves is closed; connections and requests
//! in flight are capped (a connection beyond the cap waits, unaccepted, until one ends); a body
//! over 1 MiB is refused (by its Content-Length before a byte of it is read); anything but an
//! `admission.k8s.io/v1` AdmissionReview on one of those two paths gets a 4xx.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::{Instant, Sleep};
use tokio_rustls::TlsAcceptor;

use super::Scope;
use super::certificate::Pem;

/// The path the MutatingWebhookConfiguration calls for trigger writes (on Machines, and on
/// Clusters, MachineDeployments and CK8sControlPlanes).
pub const PATH: &str = "/mutate-machine";

/// The path it calls for new CertificateRefreshes (their requester is written). Served by the
/// same handler: the decision goes by the request's kind.
pub const REQUESTS_PATH: &str = "/mutate-certificaterefresh";

/// The only review version the configuration asks for (`admissionReviewVersions: ["v1"]`).
const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";

/// The TLS versions served: 1.3 and 1.2 (what the API server speaks); older ones are refused in
/// the handshake.
pub const TLS_VERSIONS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

/// What the server gives each client before it lets go. The defaults are what the controller
/// runs with; `idle_timeout` must exceed `request_timeout`, or a request still being decided
/// would look idle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// A TLS handshake that takes longer is dropped.
    pub handshake_timeout: Duration,
    /// From the moment the server waits for a request to the end of its headers. It also bounds
    /// how long a kept-alive connection may wait for its next request (hyper starts it then).
    pub header_read_timeout: Duration,
    /// A connection on which no byte moves either way for this long is closed (for example a
    /// client that stops reading its answer).
    pub idle_timeout: Duration,
    /// From a request's headers to its answer: a free request place, the body, the decision.
    /// The API server gives up after the configuration's `timeoutSeconds` (10) anyway.
    pub request_timeout: Duration,
    /// An AdmissionReview of one Machine is a few KiB.
    pub max_body_bytes: usize,
    /// Connections open at once (each accepted one holds a place until it ends).
    pub max_connections: usize,
    /// Requests being read and decided at once; one beyond waits for a place within its
    /// `request_timeout`, else gets a 503.
    pub max_requests: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(10),
            max_body_bytes: 1024 * 1024,
            max_connections: 128,
            max_requests: 16,
        }
    }
}

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
    let app = router(scope, &limits);
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    tracing::info!(address = %local, path = PATH, "Serving the refresh-trigger admission webhook");
    Ok(tokio::spawn(async move {
        loop {
            // Beyond the cap, connections wait unaccepted in the listen backlog: a well-behaved
            // one gets in as soon as a slow one is timed out.
            let Ok(place) = connections.clone().acquire_owned().await else {
                return;
            };
            let (stream, peer) = match tcp.accept().await {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors, typically: let some connections end.
                    tracing::debug!(error = %err, "Accepting a webhook connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (acceptor, app, limits) = (acceptor.clone(), app.clone(), limits.clone());
            tokio::spawn(async move {
                connection(stream, peer, acceptor, app, &limits).await;
                drop(place);
            });
        }
    }))
}

/// One connection: the handshake, then HTTP/1.1 requests until the client closes it or a timeout
/// does.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    app: Router,
    limits: &Limits,
) {
    let _ = stream.set_nodelay(true);
    let stream = Watched::new(stream, limits.idle_timeout);
    let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(err)) => {
            tracing::debug!(error = %err, %peer, "Webhook TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "Webhook TLS handshake timed out");
            return;
        }
    };
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
        .await;
    if let Err(err) = served {
        tracing::debug!(error = %err, %peer, "Webhook connection ended");
    }
}

/// The routes, behind the body limit and [`guard`].
fn router(scope: Scope, limits: &Limits) -> Router {
    let guard = Arc::new(Guard {
        limits: limits.clone(),
        requests: Arc::new(Semaphore::new(limits.max_requests)),
    });
    Router::new()
        .route(PATH, post(mutate_machine))
        .route(REQUESTS_PATH, post(mutate_machine))
        .with_state(Arc::new(scope))
        // A chunked body is cut at the limit (413) as it is read.
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        // Outermost: every request (a wrong path too) is sized, capped and timed.
        .layer(axum::middleware::from_fn_with_state(guard, guard_request))
}

struct Guard {
    limits: Limits,
    requests: Arc<Semaphore>,
}

/// Refuses a body declared too large before reading it, then runs the request in one of the
/// `max_requests` places, all within `request_timeout`.
async fn guard_request(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let limit = guard.limits.max_body_bytes;
    if declared.is_some_and(|length| length > limit as u64) {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {limit} bytes"),
        )
            .into_response();
    }
    let deadline = Instant::now() + guard.limits.request_timeout;
    let place = tokio::time::timeout_at(deadline, guard.requests.clone().acquire_owned()).await;
    let Ok(Ok(_place)) = place else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many webhook requests in flight",
        )
            .into_response();
    };
    match tokio::time::timeout_at(deadline, next.run(request)).await {
        Ok(response) => response,
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request was not received within {}s",
                guard.limits.request_timeout.as_secs_f64()
            ),
        )
            .into_response(),
    }
}

/// Not JSON: 400 (axum's `Json`); JSON of another shape: 422; no `Content-Type:
/// application/json`: 415; too large: 413. A well-formed review gets its answer.
async fn mutate_machine(
    State(scope): State<Arc<Scope>>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Response {
    if review.types.kind != "AdmissionReview" || review.types.api_version != REVIEW_API_VERSION {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("expected an {REVIEW_API_VERSION} AdmissionReview"),
        )
            .into_response();
    }
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(err) => return (StatusCode::UNPROCESSABLE_ENTITY, err.to_string()).into_response(),
    };
    Json(super::review(&request, &scope).into_review()).into_response()
}

/// A connection that fails with `TimedOut` once no byte has moved either way for `idle` while
/// the server waits on it.
struct Watched<S> {
    inner: S,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl<S> Watched<S> {
    fn new(inner: S, idle: Duration) -> Self {
        Self {
            inner,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
        }
    }

    fn moved(&mut self) {
        let next = Instant::now() + self.idle;
        self.deadline.as_mut().reset(next);
    }

    /// What a pending read or write becomes: still pending, or timed out.
    fn waiting<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "nothing moved on the webhook connection",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    this.moved();
                }
                Poll::Ready(result)
            }
            Poll::Pending => this.waiting(cx),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write(cx, data) {
            Poll::Ready(result) => {
                if matches!(result, Ok(written) if written > 0) {
                    this.moved();
                }
                Poll::Ready(result)
            }
            Poll::Pending => this.waiting(cx),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Pending => this.waiting(cx),
            ready => ready,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_shutdown(cx) {
            Poll::Pending => this.waiting(cx),
            ready => ready,
        }
    }
}

#[cfg(test)]
mod tests;
