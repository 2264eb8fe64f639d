//! Certificates of the environment: one CA signs the API servers' serving certificate, the
//! kubelet client certificate the API servers present to nodes, and each simulated kubelet's
//! serving certificate, like a kubeadm-style cluster. The simulator makes k8sd's self-signed
//! certificates itself, as real nodes do.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use crate::Error;

/// A certificate and key written as PEM files.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pub pem: String,
    pub files: CertFiles,
}

fn pki(err: rcgen::Error) -> Error {
    Error::Pki(err.to_string())
}

fn write(dir: &Path, name: &str, cert: &str, key: &str) -> Result<CertFiles, Error> {
    let files = CertFiles {
        cert: dir.join(format!("{name}.crt")),
        key: dir.join(format!("{name}.key")),
    };
    std::fs::write(&files.cert, cert).map_err(|e| Error::io(&files.cert, e))?;
    std::fs::write(&files.key, key).map_err(|e| Error::io(&files.key, e))?;
    Ok(files)
}

impl Ca {
    pub fn new(dir: &Path) -> Result<Self, Error> {
        let key = KeyPair::generate().map_err(pki)?;
        let mut params = CertificateParams::new(Vec::new()).map_err(pki)?;
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, "ck8s-certs test environment CA");
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // Ten years, as CK8s makes its CAs (rcgen's default, the year 4096, would hide every
        // lifetime that outlives its CA).
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(3650);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).map_err(pki)?;
        let pem = cert.pem();
        let files = write(dir, "ca", &pem, &key.serialize_pem())?;
        Ok(Self {
            issuer: Issuer::new(params, key),
            pem,
            files,
        })
    }

    /// Issues a leaf certificate into `<dir>/<leaf.file_name>.{crt,key}`.
    pub fn issue(&self, dir: &Path, leaf: Leaf<'_>) -> Result<CertFiles, Error> {
        self.issue_within(dir, leaf, None)
    }

    /// [`Self::issue`], a certificate that expired a day ago (valid for the year before): what
    /// a cluster switched off past its expiry serves.
    pub fn issue_expired(&self, dir: &Path, leaf: Leaf<'_>) -> Result<CertFiles, Error> {
        let now = time::OffsetDateTime::now_utc();
        let ended = now - time::Duration::days(1);
        self.issue_within(dir, leaf, Some((ended - time::Duration::days(365), ended)))
    }

    fn issue_within(
        &self,
        dir: &Path,
        leaf: Leaf<'_>,
        validity: Option<(time::OffsetDateTime, time::OffsetDateTime)>,
    ) -> Result<CertFiles, Error> {
        let Leaf {
            file_name,
            common_name,
            organization,
            ips,
            dns,
            usage,
        } = leaf;
        let key = KeyPair::generate().map_err(pki)?;
        let mut params = CertificateParams::new(Vec::new()).map_err(pki)?;
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, common_name);
        if let Some(org) = organization {
            name.push(DnType::OrganizationName, org);
        }
        params.distinguished_name = name;
        params.subject_alt_names = ips
            .iter()
            .map(|ip| SanType::IpAddress(*ip))
            .chain(
                dns.iter()
                    .filter_map(|d| d.to_string().try_into().ok().map(SanType::DnsName)),
            )
            .collect();
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = match usage {
            Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        };
        if let Some((not_before, not_after)) = validity {
            params.not_before = not_before;
            params.not_after = not_after;
        }
        let cert = params.signed_by(&key, &self.issuer).map_err(pki)?;
        write(dir, file_name, &cert.pem(), &key.serialize_pem())
    }
}

/// What a leaf certificate says; `ips` and `dns` become SANs.
pub struct Leaf<'a> {
    pub file_name: &'a str,
    pub common_name: &'a str,
    pub organization: Option<&'a str>,
    pub ips: &'a [IpAddr],
    pub dns: &'a [&'a str],
    pub usage: Usage,
}

#[derive(Clone, Copy, Debug)]
pub enum Usage {
    Server,
    Client,
}

/// An ECDSA P-256 key pair for service account tokens: the private key signs, the public key
/// (a separate file: the API server does not read public keys out of PKCS#8) verifies.
pub fn service_account_keys(dir: &Path) -> Result<CertFiles, Error> {
    let key = KeyPair::generate().map_err(pki)?;
    let files = CertFiles {
        cert: dir.join("sa.pub"),
        key: dir.join("sa.key"),
    };
    std::fs::write(&files.cert, key.public_key_pem()).map_err(|e| Error::io(&files.cert, e))?;
    std::fs::write(&files.key, key.serialize_pem()).map_err(|e| Error::io(&files.key, e))?;
    Ok(files)
}
