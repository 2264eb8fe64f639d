//! One HTTP/1.1 connection to a node's k8sd: TLS with a pinned certificate over any
//! [`Route`], then requests in k8sd's envelope. A connection can carry several requests
//! (plan then run), so an operation opens one tunnel, not one per call.
//!
//! Every call takes a timeout; after any error the connection's state is unknown, so callers
//! open a new one instead of reusing it.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_rustls::TlsConnector;

use super::envelope;
use super::error::K8sdError;
use super::tls::{Fingerprint, PinningVerifier};
use super::transport::{Fenced, Route};
use super::wire::{Token, path};
use crate::leader::Term;

/// The most of an answer that is read. k8sd's answers are a few hundred bytes; a node that sends
/// more is not k8sd, and must not exhaust the controller's memory (it serves the whole fleet).
pub const MAX_ANSWER_BYTES: usize = 1 << 20;

/// Where a node's k8sd is, as HTTP sees it. Through a port-forward the address only sets the
/// Host header and TLS server name; with the direct route it is also where we connect.
#[derive(Clone, Debug)]
pub struct Target {
    /// Node name, for messages and logs.
    pub node: String,
    /// The node's InternalIP (what k8sd's certificate is issued for).
    pub address: IpAddr,
    /// The microcluster port (k8sd's own port on the node).
    pub port: u16,
}

/// The header/token pair a call authenticates with.
#[derive(Clone, Copy, Debug)]
pub struct Auth<'a> {
    pub header: &'static str,
    pub token: &'a Token,
}

/// An HTTP answer as received, for probes and tests that need more than the payload.
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub status: u16,
    pub body: Bytes,
}

impl RawResponse {
    /// Decodes the envelope, as [`Connection::call`] does.
    pub fn decode<T: DeserializeOwned>(&self, endpoint: &str) -> Result<T, K8sdError> {
        envelope::decode(endpoint, self.status, &self.body)
    }
}

pub struct Connection {
    target: Target,
    sender: SendRequest<Full<Bytes>>,
    fingerprint: Fingerprint,
}

impl Connection {
    /// Opens the route, runs TLS (accepting only `pin` when given) and the HTTP/1.1 handshake,
    /// all within `timeout`.
    pub async fn open(
        target: Target,
        route: &Route,
        pin: Option<Fingerprint>,
        timeout: Duration,
    ) -> Result<Self, K8sdError> {
        Self::open_fenced(target, route, pin, timeout, &Term::always()).await
    }

    /// [`Self::open`], every write of the connection checking `fence` first (nothing is sent
    /// once this replica's term is over: [`Fenced`]).
    pub async fn open_fenced(
        target: Target,
        route: &Route,
        pin: Option<Fingerprint>,
        timeout: Duration,
        fence: &Term,
    ) -> Result<Self, K8sdError> {
        let node = target.node.clone();
        tokio::time::timeout(timeout, Self::open_inner(target, route, pin, fence))
            .await
            .map_err(|_| K8sdError::Timeout {
                node,
                endpoint: "connect".to_owned(),
                timeout,
            })?
    }

    async fn open_inner(
        target: Target,
        route: &Route,
        pin: Option<Fingerprint>,
        fence: &Term,
    ) -> Result<Self, K8sdError> {
        let stream = Fenced::new(route.open(&target.node).await?, fence.clone());

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = Arc::new(PinningVerifier::new(pin, provider.clone()));
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|err| K8sdError::Tls {
                node: target.node.clone(),
                source: std::io::Error::other(err),
            })?
            .dangerous()
            .with_custom_certificate_verifier(verifier.clone())
            .with_no_client_auth();
        let tls = TlsConnector::from(Arc::new(config))
            .connect(ServerName::IpAddress(target.address.into()), stream)
            .await
            .map_err(|source| match (verifier.pin(), verifier.seen()) {
                (Some(pinned), Some(presented)) if pinned != presented => K8sdError::PinMismatch {
                    node: target.node.clone(),
                    pinned,
                    presented,
                },
                // The peer went away mid-handshake: through a port-forward this is how a k8sd
                // that is restarting (or a relay that cannot reach it) looks. Not a TLS problem.
                _ if matches!(
                    source.kind(),
                    std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
                ) =>
                {
                    K8sdError::Connect {
                        node: target.node.clone(),
                        route: route.to_string(),
                        reason: format!("the connection closed during the TLS handshake ({source}); k8sd may be restarting"),
                    }
                }
                _ => K8sdError::Tls { node: target.node.clone(), source },
            })?;
        let fingerprint = verifier.seen().ok_or_else(|| K8sdError::Tls {
            node: target.node.clone(),
            source: std::io::Error::other("the server presented no certificate"),
        })?;

        let (sender, connection) = http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|source| K8sdError::Http {
                node: target.node.clone(),
                endpoint: "connect".to_owned(),
                source,
            })?;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "k8sd connection closed");
            }
        });
        Ok(Self {
            target,
            sender,
            fingerprint,
        })
    }

    /// Fingerprint of the certificate k8sd presented (to pin it on first use).
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// `GET /`: the probe. k8sd answers the list of API versions, `["/1.0"]`.
    pub async fn probe(&mut self, timeout: Duration) -> Result<Vec<String>, K8sdError> {
        self.raw(Method::GET, path::ROOT, &[], None, timeout)
            .await?
            .decode("probe")
    }

    /// POSTs `request` as JSON to `path` and decodes the envelope's payload.
    pub async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &mut self,
        path: &str,
        auth: Auth<'_>,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, K8sdError> {
        let body = serde_json::to_vec(request).map_err(|err| K8sdError::InvalidResponse {
            endpoint: path.to_owned(),
            reason: format!("could not encode the request: {err}"),
        })?;
        self.raw(
            Method::POST,
            path,
            &[(auth.header, auth.token.expose())],
            Some(body),
            timeout,
        )
        .await?
        .decode(path)
    }

    /// One request with exactly the given headers and body; the answer is not interpreted.
    pub async fn raw(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<RawResponse, K8sdError> {
        let Target {
            node,
            address,
            port,
        } = &self.target;
        let authority = match address {
            IpAddr::V4(ip) => format!("{ip}:{port}"),
            IpAddr::V6(ip) => format!("[{ip}]:{port}"),
        };
        let http_error = |source| K8sdError::Http {
            node: node.clone(),
            endpoint: path.to_owned(),
            source,
        };
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, authority)
            .header(
                header::USER_AGENT,
                concat!("ck8s-certs/", env!("CARGO_PKG_VERSION")),
            );
        if body.is_some() {
            builder = builder.header(header::CONTENT_TYPE, "application/json");
        }
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let request = builder
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|err| K8sdError::InvalidResponse {
                endpoint: path.to_owned(),
                reason: format!("could not build the request: {err}"),
            })?;

        let exchange = async {
            self.sender.ready().await.map_err(http_error)?;
            let response = self
                .sender
                .send_request(request)
                .await
                .map_err(http_error)?;
            let status = response.status().as_u16();
            let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|err| match err.downcast::<hyper::Error>() {
                    Ok(err) => http_error(*err),
                    Err(_) => K8sdError::InvalidResponse {
                        endpoint: path.to_owned(),
                        reason: format!(
                            "the answer is larger than {MAX_ANSWER_BYTES} bytes; k8sd answers a few hundred"
                        ),
                    },
                })?
                .to_bytes();
            Ok(RawResponse { status, body })
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| K8sdError::Timeout {
                node: node.clone(),
                endpoint: path.to_owned(),
                timeout,
            })?
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A TLS server that answers every connection's first request with `body`.
    async fn serve(body: Vec<u8>) -> SocketAddr {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let body = body.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let mut request = [0u8; 4096];
                    let _ = tls.read(&mut request).await;
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    let _ = tls.write_all(head.as_bytes()).await;
                    let _ = tls.write_all(&body).await;
                    let _ = tls.flush().await;
                });
            }
        });
        address
    }

    async fn probe(address: SocketAddr) -> Result<Vec<String>, K8sdError> {
        let target = Target {
            node: "n1".into(),
            address: address.ip(),
            port: address.port(),
        };
        let timeout = Duration::from_secs(10);
        let mut connection = Connection::open(target, &Route::Direct { address }, None, timeout)
            .await
            .unwrap();
        connection.probe(timeout).await
    }

    #[tokio::test]
    async fn an_answer_beyond_the_cap_is_refused_unread() {
        let envelope = br#"{"type":"sync","status":"Success","status_code":200,"operation":"","error_code":0,"error":"","metadata":["/1.0"]}"#;
        assert_eq!(
            probe(serve(envelope.to_vec()).await).await.unwrap(),
            ["/1.0"]
        );

        let mut huge = envelope.to_vec();
        huge.resize(MAX_ANSWER_BYTES + 1, b' ');
        match probe(serve(huge).await).await {
            Err(K8sdError::InvalidResponse { reason, .. }) => {
                assert!(reason.contains("larger than"), "{reason}");
            }
            other => panic!("expected a refused answer, got {other:?}"),
        }
    }
}
