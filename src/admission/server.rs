//! Serves the webhook over HTTPS (`POST /mutate-machine`). Every replica serves it, leader or
//! not: the answer is a pure function of the request. The serving certificate can be swapped
//! while serving (a renewal needs no restart).

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::Scope;
use super::certificate::Pem;

/// The path the MutatingWebhookConfiguration calls.
pub const PATH: &str = "/mutate-machine";

/// A TLS handshake that takes longer than this is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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

/// TLS connections, handshaken off the accept loop so that a slow client stalls nobody.
struct TlsListener {
    local: SocketAddr,
    connections: mpsc::Receiver<(TlsStream<tokio::net::TcpStream>, SocketAddr)>,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.connections.recv().await {
            Some(connection) => connection,
            // The accept loop ended (the server is being dropped): no more connections.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Starts serving on `address`; the task ends when aborted.
pub async fn serve(
    address: SocketAddr,
    certificates: Arc<Certificates>,
    scope: Scope,
) -> Result<JoinHandle<()>, ServeError> {
    let listen = |source| ServeError::Listen { address, source };
    let tcp = TcpListener::bind(address).await.map_err(listen)?;
    let local = tcp.local_addr().map_err(listen)?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| ServeError::Certificate(e.to_string()))?
    .with_no_client_auth()
    .with_cert_resolver(certificates);
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let (sender, connections) = mpsc::channel(64);
    let accepting = tokio::spawn(async move {
        loop {
            let (stream, peer) = match tcp.accept().await {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::debug!(error = %err, "Accepting a webhook connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (acceptor, sender) = (acceptor.clone(), sender.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => {
                        let _ = sender.send((tls, peer)).await;
                    }
                    Ok(Err(err)) => {
                        tracing::debug!(error = %err, %peer, "Webhook TLS handshake failed")
                    }
                    Err(_) => tracing::debug!(%peer, "Webhook TLS handshake timed out"),
                }
            });
        }
    });
    let app = Router::new()
        .route(PATH, post(mutate_machine))
        .with_state(Arc::new(scope));
    let listener = TlsListener { local, connections };
    tracing::info!(address = %local, path = PATH, "Serving the refresh-trigger admission webhook");
    Ok(tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            tracing::error!(error = %err, "The admission webhook server stopped");
        }
        accepting.abort();
    }))
}

async fn mutate_machine(
    State(scope): State<Arc<Scope>>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(err) => {
            return Json(AdmissionResponse::invalid(err.to_string()).into_review());
        }
    };
    Json(super::review(&request, &scope).into_review())
}
