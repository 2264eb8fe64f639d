//! How bytes reach a node's k8sd.
//!
//! - [`Route::PortForward`] (default): a `pods/portforward` through the *workload* API server to
//!   port 2380 of the node's `k8sd-proxy` pod, which relays to k8sd on the host. Works wherever
//!   the management cluster can reach the workload API server, which CAPI requires anyway.
//! - [`Route::Direct`]: TCP to the node's address and microcluster port, for management clusters
//!   that route to nodes.
//!
//! Both yield a plain byte stream; TLS and HTTP run on top of it in [`super::client`], so the two
//! transports share every byte of the HTTP path.

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::error::K8sdError;
use crate::leader::Term;
use ck8s_certs_api::k8sd::PROXY_POD_PORT;

/// A bidirectional byte stream to k8sd.
pub trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

/// Where a node's k8sd is reached. Built once per operation, so the size of the port-forward
/// variant (it holds a client) does not matter.
#[derive(Clone)]
#[allow(clippy::large_enum_variant)]
pub enum Route {
    /// Port-forward to the node's `k8sd-proxy` pod (in `kube-system` of the workload cluster).
    PortForward { pods: Api<Pod>, pod: String },
    /// Direct TCP to the node.
    Direct { address: SocketAddr },
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::PortForward { pod, .. } => {
                write!(f, "port-forward to pod {pod}:{PROXY_POD_PORT}")
            }
            Self::Direct { address } => write!(f, "direct connection to {address}"),
        }
    }
}

impl Route {
    /// Opens a fresh stream. The caller bounds the time it may take.
    pub async fn open(&self, node: &str) -> Result<Box<dyn Stream>, K8sdError> {
        let fail = |reason: String| K8sdError::Connect {
            node: node.to_owned(),
            route: self.to_string(),
            reason,
        };
        match self {
            Self::Direct { address } => {
                let stream = TcpStream::connect(address)
                    .await
                    .map_err(|err| fail(err.to_string()))?;
                // Small request/response exchanges: don't wait to coalesce.
                stream
                    .set_nodelay(true)
                    .map_err(|err| fail(err.to_string()))?;
                Ok(Box::new(stream))
            }
            Self::PortForward { pods, pod } => {
                let mut forwarder =
                    pods.portforward(pod, &[PROXY_POD_PORT])
                        .await
                        .map_err(|err| match kubelet_certificate_expired(&err) {
                            Some(ended) => K8sdError::KubeletCertificateExpired {
                                node: node.to_owned(),
                                ended,
                            },
                            None => fail(err.to_string()),
                        })?;
                let stream = forwarder
                    .take_stream(PROXY_POD_PORT)
                    .ok_or_else(|| fail("the port-forward opened no stream".to_owned()))?;
                // The forwarder's task pumps the websocket; it ends once the stream is closed.
                // Its join error after a finished exchange ("Sending after closing is not
                // allowed") only says the remote closed first, so it is not reported.
                tokio::spawn(async move {
                    if let Err(err) = forwarder.join().await {
                        tracing::trace!(error = %err, "port-forward ended");
                    }
                });
                Ok(Box::new(stream))
            }
        }
    }
}

/// Whether the API server refused a port-forward because the node's kubelet serves an expired
/// certificate: `Some`, with its NotAfter when the message tells it. kube-apiserver answers 500
/// with Go's x509 error as text: "error dialing backend: tls: failed to verify certificate:
/// x509: certificate has expired or is not yet valid: current time <t> is after <NotAfter>".
fn kubelet_certificate_expired(error: &kube::Error) -> Option<Option<jiff::Timestamp>> {
    const EXPIRED: &str = "x509: certificate has expired or is not yet valid: ";
    let kube::Error::Api(status) = error else {
        return None;
    };
    let message = status.message.as_str();
    let (_, detail) = message.split_once(EXPIRED)?;
    // "… is before <NotBefore>" is a certificate not valid yet (a clock problem), not this.
    let (_, ended) = detail.split_once(" is after ")?;
    if !message.starts_with("error dialing backend") {
        return None;
    }
    Some(ended.split_whitespace().next().and_then(|t| t.parse().ok()))
}

/// A stream to k8sd whose every write first looks at this replica's term, and fails once it is
/// over. The executor checks the term before it records a seed and before `run`/`approve`, but a
/// replica frozen right after that check (SIGSTOP, a suspended VM, a stalled host) would still
/// send when it resumes, after a standby took over; and a retried `approve` is sent with no check
/// of its own. Here the last look is in the write that puts the bytes on the wire.
pub struct Fenced {
    inner: Box<dyn Stream>,
    term: Term,
}

impl Fenced {
    pub fn new(inner: Box<dyn Stream>, term: Term) -> Self {
        Self { inner, term }
    }
}

/// The error of a write after the term ended.
fn not_leading() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        "this replica no longer leads: nothing more is sent to the node",
    )
}

impl AsyncRead for Fenced {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Fenced {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if !self.term.leading() {
            return Poll::Ready(Err(not_leading()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if !self.term.leading() {
            return Poll::Ready(Err(not_leading()));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn nothing_is_written_once_the_term_is_over() {
        let term = Term::always();
        let (ours, mut node) = tokio::io::duplex(64);
        let mut fenced = Fenced::new(Box::new(ours), term.clone());
        fenced.write_all(b"plan").await.expect("leading: written");
        let mut got = [0u8; 4];
        node.read_exact(&mut got).await.expect("the node reads it");
        assert_eq!(&got, b"plan");
        term.end();
        let refused = fenced.write_all(b"run").await.expect_err("not leading");
        assert_eq!(refused.kind(), std::io::ErrorKind::PermissionDenied);
        drop(fenced);
        let mut rest = Vec::new();
        node.read_to_end(&mut rest).await.expect("closed");
        assert!(rest.is_empty(), "the node got {rest:?}");
    }

    fn refused(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            message: message.to_owned(),
            ..Default::default()
        }))
    }

    #[test]
    fn an_expired_kubelet_is_told_from_what_the_api_server_answers() {
        // As kube-apiserver v1.34 answered a port-forward to a kubelet serving an expired
        // certificate (e2e, node simulator).
        let expired = refused(
            500,
            "error dialing backend: tls: failed to verify certificate: x509: certificate has expired or is not yet valid: current time 2026-11-29T09:39:34Z is after 2026-11-28T09:39:02Z",
        );
        assert_eq!(
            kubelet_certificate_expired(&expired),
            Some(Some("2026-11-28T09:39:02Z".parse().unwrap()))
        );
        let unreadable = refused(
            500,
            "error dialing backend: tls: failed to verify certificate: x509: certificate has expired or is not yet valid: current time now is after then",
        );
        assert_eq!(kubelet_certificate_expired(&unreadable), Some(None));
        for other in [
            // Not valid yet: a clock, not an expiry.
            refused(
                500,
                "error dialing backend: tls: failed to verify certificate: x509: certificate has expired or is not yet valid: current time 2026-11-29T09:39:34Z is before 2026-12-28T09:39:02Z",
            ),
            refused(
                500,
                "error dialing backend: dial tcp 10.0.0.1:10250: connect: connection refused",
            ),
            refused(
                500,
                "error dialing backend: tls: failed to verify certificate: x509: certificate signed by unknown authority",
            ),
            // A pod's own message is not the API server's dial.
            refused(
                404,
                "pods \"x509: certificate has expired or is not yet valid: current time a is after b\" not found",
            ),
            kube::Error::LinesCodecMaxLineLengthExceeded,
        ] {
            assert_eq!(kubelet_certificate_expired(&other), None, "{other}");
        }
    }
}
