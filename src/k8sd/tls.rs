//! TLS trust for k8sd: trust on first use.
//!
//! k8sd serves a self-signed certificate generated at node install, so there is no CA to verify
//! against. Rather than skip verification forever, the first connection records the
//! certificate's SHA-256 fingerprint and every later connection must present the same one.
//! Where pins are stored (the MachineCertificates status) is the caller's business: this module
//! only checks against the pin it is given and reports what it saw.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};

/// SHA-256 of a certificate's DER encoding, shown as lowercase hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    pub fn of(der: &[u8]) -> Self {
        Self(Sha256::digest(der).into())
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// Error of parsing a fingerprint: it must be 64 hex characters (colons allowed, as
/// `openssl x509 -fingerprint -sha256` prints them).
#[derive(Debug, thiserror::Error)]
#[error("a SHA-256 fingerprint is 64 hex characters, optionally separated by colons; got {0:?}")]
pub struct InvalidFingerprint(String);

impl FromStr for Fingerprint {
    type Err = InvalidFingerprint;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let compact: String = s.chars().filter(|c| *c != ':').collect();
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(compact.to_ascii_lowercase(), &mut bytes)
            .map_err(|_| InvalidFingerprint(s.to_owned()))?;
        Ok(Self(bytes))
    }
}

/// Accepts exactly the pinned certificate, or, with no pin, any certificate (first use); in both
/// cases remembers the fingerprint it saw so the caller can record or report it. Handshake
/// signatures are still verified, so the peer must hold the certificate's private key.
#[derive(Debug)]
pub struct PinningVerifier {
    pin: Option<Fingerprint>,
    seen: Mutex<Option<Fingerprint>>,
    provider: Arc<CryptoProvider>,
}

impl PinningVerifier {
    pub fn new(pin: Option<Fingerprint>, provider: Arc<CryptoProvider>) -> Self {
        Self {
            pin,
            seen: Mutex::new(None),
            provider,
        }
    }

    /// The fingerprint the server presented, once the handshake got that far.
    pub fn seen(&self) -> Option<Fingerprint> {
        self.seen.lock().map(|seen| *seen).unwrap_or(None)
    }

    pub fn pin(&self) -> Option<Fingerprint> {
        self.pin
    }
}

impl ServerCertVerifier for PinningVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let presented = Fingerprint::of(end_entity.as_ref());
        if let Ok(mut seen) = self.seen.lock() {
            *seen = Some(presented);
        }
        match self.pin {
            Some(pin) if pin != presented => Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            )),
            _ => Ok(ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_round_trip_through_hex_with_or_without_colons() {
        let fp = Fingerprint::of(b"certificate");
        let hex = fp.to_string();
        assert_eq!(hex.len(), 64);
        assert_eq!(hex.parse::<Fingerprint>().unwrap(), fp);
        let colons = hex
            .as_bytes()
            .chunks(2)
            .map(|pair| std::str::from_utf8(pair).unwrap().to_ascii_uppercase())
            .collect::<Vec<_>>()
            .join(":");
        assert_eq!(colons.parse::<Fingerprint>().unwrap(), fp);
        assert!("abc".parse::<Fingerprint>().is_err());
    }
}
