//! The controller's HTTP servers (the admission webhooks over TLS, metrics and health in plain
//! HTTP) and how each holds up under abuse, within [`Limits`]. Their ports are reachable by
//! whatever can reach the pod (the API server's source cannot be narrowed in general: see
//! `config/network-policy`), so one client must not be able to take a server from everyone else:
//! - a TLS handshake, the headers of each request and each whole request are timed; a connection
//!   on which nothing moves is closed, and every connection is closed after
//!   [`Limits::max_connection_age`] (once its request in flight is answered);
//! - connections are capped overall and per peer; a new one beyond a cap takes the place of an
//!   idle one ([`connections`]), so holding every place keeps nobody out;
//! - a body over the limit is refused by its Content-Length before a byte of it is read, and a
//!   request's body is read before it takes one of the places where requests are decided, so
//!   slow bodies hold no such place.

pub mod connections;
mod watched;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use connections::{Shared, Table};
use watched::Watched;

/// What a server gives each client before it lets go. The defaults are what the controller runs
/// with; `idle_timeout` must exceed `request_timeout`, or a request still being decided would
/// look idle.
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
    /// From a request's headers to its answer: its body, a free place, the decision. The API
    /// server gives up on a webhook after the configuration's `timeoutSeconds` (10) anyway.
    pub request_timeout: Duration,
    /// An AdmissionReview of one Machine is a few KiB.
    pub max_body_bytes: usize,
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections open at once from one address.
    pub max_connections_per_peer: usize,
    /// A connection is closed this long after it was accepted, once its request in flight is
    /// answered: nobody keeps a place for good.
    pub max_connection_age: Duration,
    /// Requests being decided at once (their bodies read); one beyond waits for a place within
    /// its `request_timeout`, else gets a 503.
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
            max_connections_per_peer: 32,
            max_connection_age: Duration::from_secs(600),
            max_requests: 16,
        }
    }
}

/// Serves `app` on `listener` (over TLS with `tls`) within `limits`, until the task is aborted
/// (connections already accepted end by their own timeouts).
pub fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: Router,
    limits: Limits,
) -> JoinHandle<()> {
    let app = guarded(app, &limits);
    let table = Arc::new(Mutex::new(Table::default()));
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors, typically: let some connections end.
                    tracing::debug!(error = %err, "Accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let admitted = table.lock().unwrap_or_else(PoisonError::into_inner).admit(
                peer.ip(),
                limits.max_connections,
                limits.max_connections_per_peer,
            );
            let Some((id, shared)) = admitted else {
                tracing::debug!(%peer, "Every connection place is deciding a request: refused");
                continue;
            };
            let (tls, app, limits, table) =
                (tls.clone(), app.clone(), limits.clone(), table.clone());
            tokio::spawn(async move {
                connection(stream, peer, tls, app, &limits, &shared).await;
                table
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(id);
            });
        }
    })
}

/// One connection: the handshake, then HTTP/1.1 requests until the client closes it, a timeout
/// does, its age is reached or its place is given to another.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    app: Router,
    limits: &Limits,
    shared: &Arc<Shared>,
) {
    let _ = stream.set_nodelay(true);
    let stream = Watched::new(stream, limits.idle_timeout);
    let aged = Instant::now() + limits.max_connection_age;
    let Some(acceptor) = tls else {
        http(stream, peer, app, limits, shared, aged).await;
        return;
    };
    let handshake = tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream));
    let tls = tokio::select! {
        done = handshake => match done {
            Ok(Ok(tls)) => tls,
            Ok(Err(err)) => {
                tracing::debug!(error = %err, %peer, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake timed out");
                return;
            }
        },
        () = shared.closing() => return,
    };
    http(tls, peer, app, limits, shared, aged).await;
}

async fn http<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    stream: S,
    peer: SocketAddr,
    app: Router,
    limits: &Limits,
    shared: &Arc<Shared>,
    aged: Instant,
) {
    let marked = shared.clone();
    // Each request carries its connection's marker: the guard marks when one is being decided.
    let service = hyper::service::service_fn(move |request: hyper::Request<_>| {
        let mut request = request.map(Body::new);
        request.extensions_mut().insert(marked.clone());
        app.clone().oneshot(request)
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(served);
    let ended = tokio::select! {
        ended = served.as_mut() => ended,
        // Replaced (it was idle) or aged: the request in flight, if any, is answered first.
        () = shared.closing() => {
            served.as_mut().graceful_shutdown();
            served.await
        }
        () = tokio::time::sleep_until(aged) => {
            served.as_mut().graceful_shutdown();
            served.await
        }
    };
    if let Err(err) = ended {
        tracing::debug!(error = %err, %peer, "Connection ended");
    }
}

/// `app` behind [`guard_request`].
fn guarded(app: Router, limits: &Limits) -> Router {
    let guard = Arc::new(Guard {
        limits: limits.clone(),
        requests: Arc::new(Semaphore::new(limits.max_requests)),
    });
    // Outermost: every request (a wrong path too) is sized, read, capped and timed.
    app.layer(axum::middleware::from_fn_with_state(guard, guard_request))
}

struct Guard {
    limits: Limits,
    requests: Arc<Semaphore>,
}

/// Refuses a body declared too large before reading it, reads the body, then decides the request
/// in one of the `max_requests` places, all within `request_timeout`.
async fn guard_request(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    let limit = guard.limits.max_body_bytes;
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {limit} bytes"),
        )
            .into_response()
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return too_large();
    }
    let deadline = Instant::now() + guard.limits.request_timeout;
    let timed_out = || {
        (
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request was not received within {}s",
                guard.limits.request_timeout.as_secs_f64()
            ),
        )
            .into_response()
    };
    let (parts, body) = request.into_parts();
    // A chunked body is cut at the limit as it is read.
    let body = match tokio::time::timeout_at(deadline, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => return too_large(),
        Err(_) => return timed_out(),
    };
    let place = tokio::time::timeout_at(deadline, guard.requests.clone().acquire_owned()).await;
    let Ok(Ok(_place)) = place else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many requests in flight",
        )
            .into_response();
    };
    let _deciding = parts.extensions.get::<Arc<Shared>>().map(Shared::deciding);
    let request = Request::from_parts(parts, Body::from(body));
    match tokio::time::timeout_at(deadline, next.run(request)).await {
        Ok(response) => response,
        Err(_) => timed_out(),
    }
}
