//! Talking to a CK8s node's k8sd daemon.
//!
//! Flow of one exchange: a [`transport::Route`] opens a byte stream to the node (a port-forward
//! through the workload API server to the node's `k8sd-proxy` pod, or a TCP connection to the
//! node address); [`client::Connection`] runs TLS over it with [`tls::PinningVerifier`] and
//! HTTP/1.1 (hyper) on top, so both transports share one HTTP path; [`envelope`] turns k8sd's
//! response envelope into a typed result or a [`K8sdError`]. [`wire`] holds the exact request and
//! response bodies.
//!
//! This module does not decide *when* to call k8sd, nor read tokens or endpoints from the
//! cluster: callers hand it a route, a token and a timeout.

pub mod client;
pub mod envelope;
pub mod error;
pub mod tls;
pub mod transport;
pub mod wire;

pub use client::{Connection, RawResponse};
pub use error::K8sdError;
pub use tls::Fingerprint;
pub use transport::Route;
pub use wire::Token;

/// NotAfter of a PEM certificate (the first one in `pem`), e.g. a signed CSR's.
pub fn certificate_not_after(pem: &[u8]) -> Option<jiff::Timestamp> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    let certificate = block.parse_x509().ok()?;
    jiff::Timestamp::from_second(certificate.validity().not_after.timestamp()).ok()
}
