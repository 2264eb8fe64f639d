//! The management kubeconfig's client certificate, renewed in place
//! (`--renew-management-kubeconfig`): the pure parts.
//!
//! The CK8s control-plane provider writes `<cluster>-kubeconfig` with a client certificate that
//! it signs with the cluster's client CA (`<cluster>-cca`) for a year, and never renews it
//! (design.md section 9). KubeadmControlPlane renews its clusters' certificate when half its
//! lifetime is left; so does this, with the same CA, the same subject (so the same user and
//! groups in the workload cluster) and the same lifetime. Here: whether a kubeconfig has the
//! provider's shape, when its certificate is due, a new certificate, and the kubeconfig with it.
//! Nothing here quotes key material in an error.

use base64::Engine;
use jiff::{SignedDuration, Timestamp};
use rcgen::{
    CertificateParams, DistinguishedName, DnType, DnValue, ExtendedKeyUsagePurpose, Issuer,
    KeyPair, KeyUsagePurpose,
};
use serde_yaml::Value;
use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer;
use x509_parser::x509::X509Name;

/// What `--renew-management-kubeconfig` asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Nothing is read beyond the expiry check, nothing is written.
    #[default]
    Off,
    /// Everything up to the write (a certificate issued and tried against the workload API
    /// server); the Secret is left as it is and the status says what would have been done.
    DryRun,
    /// Renewed in place.
    On,
}

/// New certificates start this long before they are issued: clocks of the management and
/// workload clusters may disagree a little.
const BACKDATE: SignedDuration = SignedDuration::from_secs(300);

/// The client certificate of a kubeconfig with the CK8s control-plane provider's shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The kubeconfig user holding it (`<cluster>-admin`).
    pub user: String,
    pub not_before: Timestamp,
    pub not_after: Timestamp,
    /// The certificate (DER).
    der: Vec<u8>,
}

impl Held {
    /// When it is due: `renew_before` ahead of its end, or else when half its lifetime is left
    /// (as KubeadmControlPlane does).
    pub fn due_at(&self, renew_before: Option<SignedDuration>) -> Timestamp {
        due_at(self.not_before, self.not_after, renew_before)
    }
}

/// The lifetime of the certificates the CK8s control-plane provider issues, and so the longest
/// one issued here. Its certificates start when their CA does (CAPI v1.9's `NewSignedCert`), not
/// when they are issued: NotAfter − NotBefore of one written a year after its cluster was made
/// says two years.
pub const PROVIDER_LIFETIME: SignedDuration = SignedDuration::from_hours(365 * 24);

/// See [`Held::due_at`]. Half the lifetime is at most half of [`PROVIDER_LIFETIME`], what
/// KubeadmControlPlane waits for (`ClientCertificateRenewalDuration`).
pub fn due_at(
    not_before: Timestamp,
    not_after: Timestamp,
    renew_before: Option<SignedDuration>,
) -> Timestamp {
    let ahead = renew_before
        .unwrap_or_else(|| (not_after.duration_since(not_before) / 2).min(PROVIDER_LIFETIME / 2));
    not_after
        .checked_sub(ahead)
        .unwrap_or(not_before)
        .max(not_before)
}

/// Why a kubeconfig's certificate is left as it is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not what the CK8s control-plane provider writes: somebody else's credential.
    #[error("it is not the kubeconfig the CK8s control-plane provider writes: {0}")]
    Shape(String),
    /// `<cluster>-cca` cannot sign (absent key, not a CA, key of another certificate...).
    #[error("{0}")]
    Ca(String),
    /// The certificate held was not signed by the client CA: it came from elsewhere.
    #[error(
        "the client certificate was not signed by the client CA in {0}: it was issued elsewhere, so a certificate of that CA may not be accepted in its place"
    )]
    OtherIssuer(String),
    /// The key stored beside the certificate is not its key: whoever stored the kubeconfig
    /// does not prove they hold the certificate, so no new key is issued for its identity.
    #[error(
        "`client-key-data` is not the private key of `client-certificate-data`: whoever stored this kubeconfig does not hold the certificate's key, and a renewal would give them a working key for its identity. Store the provider's kubeconfig again (or delete the Secret so the provider writes it)"
    )]
    KeyMismatch,
    /// The client CA ends too soon for a certificate worth issuing.
    #[error(
        "the client CA in {secret} expires at {at}: a certificate it signs cannot outlive it, so renewing now would not help. Renew the client CA first"
    )]
    CaEnding { secret: String, at: Timestamp },
}

impl Refusal {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        use ck8s_certs_api::cluster_certificates::renewal_reasons as why;
        match self {
            Self::Shape(_) => why::NOT_PROVIDER_SHAPE,
            Self::Ca(_) => why::CLIENT_CA_UNUSABLE,
            Self::OtherIssuer(_) => why::OTHER_ISSUER,
            Self::KeyMismatch => why::KEY_MISMATCH,
            Self::CaEnding { .. } => why::CLIENT_CA_ENDING,
        }
    }
}

fn shape(reason: impl Into<String>) -> Refusal {
    Refusal::Shape(reason.into())
}

/// The identity the CK8s control-plane provider's kubeconfig authenticates as (CAPI's
/// `util/kubeconfig`): CN `kubernetes-admin`, O `system:masters`. Only that one is renewed:
/// a client CA may once have signed certificates for others, and a renewal must not bring any
/// of them back to life.
const PROVIDER_SUBJECT: [(&[u64], &str); 2] = [
    (&[2, 5, 4, 3], "kubernetes-admin"),
    (&[2, 5, 4, 10], "system:masters"),
];

/// The client certificate of the kubeconfig `yaml` (already vetted) of `cluster`, when it has
/// the provider's shape: one user, `<cluster>-admin`, the current context's, authenticating
/// with an inline client certificate for the provider's identity ([`PROVIDER_SUBJECT`]) and
/// that certificate's own key, and nothing else. The key is what proves that whoever stored
/// the kubeconfig holds the certificate (a certificate is public).
pub fn held(yaml: &str, cluster: &str) -> Result<Held, Refusal> {
    let document = document(yaml)?;
    let expected = format!("{cluster}-admin");
    let users = document
        .get("users")
        .and_then(Value::as_sequence)
        .ok_or_else(|| shape("it has no `users`"))?;
    let [entry] = users.as_slice() else {
        return Err(shape(format!(
            "it has {} users, the provider writes one ({expected})",
            users.len()
        )));
    };
    let name = entry.get("name").and_then(Value::as_str).unwrap_or("");
    if name != expected {
        return Err(shape(format!(
            "its user is not named {expected} as the provider names it"
        )));
    }
    let current = document
        .get("current-context")
        .and_then(Value::as_str)
        .unwrap_or("");
    let context_user = document
        .get("contexts")
        .and_then(Value::as_sequence)
        .and_then(|contexts| {
            contexts
                .iter()
                .find(|c| c.get("name").and_then(Value::as_str) == Some(current))
        })
        .and_then(|c| c.get("context"))
        .and_then(|c| c.get("user"))
        .and_then(Value::as_str);
    if context_user != Some(expected.as_str()) {
        return Err(shape(format!(
            "its current context does not use the user {expected}"
        )));
    }
    let user = entry
        .get("user")
        .and_then(Value::as_mapping)
        .ok_or_else(|| shape(format!("the user {expected} has no credentials")))?;
    let mut fields: Vec<&str> = user.keys().filter_map(Value::as_str).collect();
    fields.sort_unstable();
    if fields != ["client-certificate-data", "client-key-data"] {
        return Err(shape(format!(
            "the user {expected} authenticates with {}, not with a client certificate and key alone",
            if fields.is_empty() {
                "nothing".to_owned()
            } else {
                fields.join(", ")
            }
        )));
    }
    let pem = decoded(user, "client-certificate-data")
        .ok_or_else(|| shape("`client-certificate-data` is not base64"))?;
    let der = first_certificate(&pem)
        .ok_or_else(|| shape("`client-certificate-data` holds no readable certificate"))?;
    let (_, certificate) = X509Certificate::from_der(&der)
        .map_err(|_| shape("`client-certificate-data` holds no readable certificate"))?;
    let (not_before, not_after) = validity(&certificate)
        .ok_or_else(|| shape("the client certificate's validity is out of range"))?;
    if !is_provider_subject(certificate.subject()) {
        return Err(shape(
            "its client certificate is not for kubernetes-admin in system:masters, the identity the provider's kubeconfig has",
        ));
    }
    let key = decoded(user, "client-key-data")
        .and_then(|pem| signing_key(std::str::from_utf8(&pem).ok()?))
        .ok_or_else(|| {
            shape(
                "`client-key-data` is not a private key in a form the provider writes (PEM: an RSA key as PKCS#1 or PKCS#8, an ECDSA P-256/P-384 or Ed25519 key as PKCS#8)",
            )
        })?;
    if key.public_key_raw() != certificate.public_key().subject_public_key.data.as_ref() {
        return Err(Refusal::KeyMismatch);
    }
    Ok(Held {
        user: expected,
        not_before,
        not_after,
        der,
    })
}

/// The provider's kubeconfigs are a few KiB; a document is read whole (to be written back
/// whole), and a large, deeply nested one would take seconds of the controller's CPU at every
/// check.
pub const MAX_KUBECONFIG_BYTES: usize = 64 * 1024;

/// `yaml` as a YAML document, when it is no larger than the provider's could be.
fn document(yaml: &str) -> Result<Value, Refusal> {
    if yaml.len() > MAX_KUBECONFIG_BYTES {
        return Err(shape(format!(
            "it is {} KiB long, the provider's are a few KiB (at most {} KiB are read)",
            yaml.len() / 1024,
            MAX_KUBECONFIG_BYTES / 1024
        )));
    }
    serde_yaml::from_str(yaml).map_err(|_| shape("it is not YAML"))
}

/// The bytes of a kubeconfig user's base64 field `key`.
fn decoded(user: &serde_yaml::Mapping, key: &str) -> Option<Vec<u8>> {
    let data = user.get(key)?.as_str()?;
    base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .ok()
}

/// Whether `name` is exactly [`PROVIDER_SUBJECT`]: each attribute once, nothing else, in any
/// order.
fn is_provider_subject(name: &X509Name<'_>) -> bool {
    let mut found = [false; PROVIDER_SUBJECT.len()];
    for attribute in name.iter_attributes() {
        let Some(arcs) = attribute.attr_type().iter() else {
            return false;
        };
        let arcs: Vec<u64> = arcs.collect();
        let Some(at) = PROVIDER_SUBJECT.iter().position(|(oid, value)| {
            *oid == arcs.as_slice() && attribute.as_str().ok() == Some(*value)
        }) else {
            return false;
        };
        if std::mem::replace(&mut found[at], true) {
            return false;
        }
    }
    found.iter().all(|f| *f)
}

/// The DER of the first certificate in PEM text.
fn first_certificate(pem: &[u8]) -> Option<Vec<u8>> {
    x509_parser::pem::Pem::iter_from_buffer(pem)
        .filter_map(Result::ok)
        .find(|block| block.label == "CERTIFICATE")
        .map(|block| block.contents)
}

fn validity(certificate: &X509Certificate<'_>) -> Option<(Timestamp, Timestamp)> {
    let validity = certificate.validity();
    Some((
        Timestamp::from_second(validity.not_before.timestamp()).ok()?,
        Timestamp::from_second(validity.not_after.timestamp()).ok()?,
    ))
}

/// A certificate issued in place of a [`Held`] one.
pub struct Issued {
    pub certificate_pem: String,
    /// Never logged, never shown.
    pub key_pem: String,
    pub not_after: Timestamp,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// A new certificate for `held`, signed by the client CA (`ca_pem`, `ca_key_pem` from `secret`):
/// the same subject, a new key, the same lifetime (at most a year, and no longer than the CA's),
/// client authentication only. Refused when the CA cannot sign, did not sign `held`, or ends so
/// soon that the new certificate would not outlast `held` or would be due at once.
pub fn issue(
    held: &Held,
    secret: &str,
    ca_pem: &str,
    ca_key_pem: &str,
    renew_before: Option<SignedDuration>,
    now: Timestamp,
) -> Result<Issued, Refusal> {
    let ca_der = first_certificate(ca_pem.as_bytes())
        .ok_or_else(|| Refusal::Ca(format!("`tls.crt` of {secret} holds no certificate")))?;
    let (_, ca) = X509Certificate::from_der(&ca_der)
        .map_err(|_| Refusal::Ca(format!("`tls.crt` of {secret} cannot be parsed")))?;
    let ca_key = signing_key(ca_key_pem).ok_or_else(|| {
        Refusal::Ca(format!(
            "`tls.key` of {secret} is not a private key this renewal can sign with (PEM: an RSA key as PKCS#1 or PKCS#8, an ECDSA P-256/P-384 or Ed25519 key as PKCS#8)"
        ))
    })?;
    if ca_key.public_key_raw() != ca.public_key().subject_public_key.data.as_ref() {
        return Err(Refusal::Ca(format!(
            "`tls.key` of {secret} is not the key of its `tls.crt`"
        )));
    }
    if !ca.is_ca() {
        return Err(Refusal::Ca(format!(
            "`tls.crt` of {secret} is not a CA certificate"
        )));
    }
    let (_, old) = X509Certificate::from_der(&held.der)
        .map_err(|_| shape("`client-certificate-data` holds no readable certificate"))?;
    if old.issuer() != ca.subject() || old.verify_signature(Some(ca.public_key())).is_err() {
        return Err(Refusal::OtherIssuer(secret.to_owned()));
    }
    let (_, ca_until) = validity(&ca)
        .ok_or_else(|| Refusal::Ca(format!("the validity of {secret} is out of range")))?;
    let lifetime = held
        .not_after
        .duration_since(held.not_before)
        .min(PROVIDER_LIFETIME);
    let not_before = now.checked_sub(BACKDATE).unwrap_or(now);
    let not_after = now.checked_add(lifetime).unwrap_or(ca_until).min(ca_until);
    // Nothing gained (the held one lasts as long), or due again at once: renew the CA first.
    if not_after <= held.not_after || due_at(not_before, not_after, renew_before) <= now {
        return Err(Refusal::CaEnding {
            secret: secret.to_owned(),
            at: ca_until,
        });
    }
    let subject = distinguished_name(old.subject())?;
    // rcgen re-encodes the CA's name too (and panics on an empty RDN): check it first.
    distinguished_name(ca.subject())
        .map_err(|_| Refusal::Ca(format!("the subject of {secret} has an unusual form")))?;
    let issuer = Issuer::from_ca_cert_der(&ca_der.clone().into(), ca_key)
        .map_err(|_| Refusal::Ca(format!("`tls.crt` of {secret} cannot be used to sign")))?;
    let key = KeyPair::generate().map_err(|e| Refusal::Ca(format!("no key was made: {e}")))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = subject;
    params.not_before = offset(not_before);
    params.not_after = offset(not_after);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    let certificate = params
        .signed_by(&key, &issuer)
        .map_err(|e| Refusal::Ca(format!("signing with {secret} failed: {e}")))?;
    // Exactly the same subject, exactly under the CA's name, or nothing.
    let (_, new) = X509Certificate::from_der(certificate.der())
        .map_err(|_| Refusal::Ca("the new certificate cannot be read back".to_owned()))?;
    if new.subject().as_raw() != old.subject().as_raw() {
        return Err(shape(
            "the client certificate's subject cannot be reproduced exactly (its string types or attributes are unusual), so a new one would name another user",
        ));
    }
    if new.issuer().as_raw() != ca.subject().as_raw()
        || new.verify_signature(Some(ca.public_key())).is_err()
    {
        return Err(Refusal::Ca(format!(
            "a certificate signed with {secret} does not chain to its `tls.crt`"
        )));
    }
    Ok(Issued {
        certificate_pem: certificate.pem(),
        key_pem: key.serialize_pem(),
        not_after: Timestamp::from_second(new.validity().not_after.timestamp())
            .unwrap_or(not_after),
    })
}

/// The CA's key as rcgen signs with it. rcgen (with ring) reads PKCS#8 only; the provider
/// writes RSA keys as PKCS#1 (`RSA PRIVATE KEY`), which are wrapped as PKCS#8 here.
fn signing_key(pem: &str) -> Option<KeyPair> {
    let block = x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes())
        .filter_map(Result::ok)
        .find(|b| b.label.ends_with("PRIVATE KEY"))?;
    let pkcs8 = match block.label.as_str() {
        "PRIVATE KEY" => block.contents,
        "RSA PRIVATE KEY" => pkcs8_of_rsa(&block.contents),
        _ => return None,
    };
    KeyPair::try_from(pkcs8.as_slice()).ok()
}

/// PrivateKeyInfo { version 0, rsaEncryption, the PKCS#1 key } (RFC 5208, RFC 8017 A.1).
fn pkcs8_of_rsa(pkcs1: &[u8]) -> Vec<u8> {
    const RSA_ENCRYPTION: &[u64] = &[1, 2, 840, 113_549, 1, 1, 1];
    yasna::construct_der(|writer| {
        writer.write_sequence(|writer| {
            writer.next().write_u8(0);
            writer.next().write_sequence(|writer| {
                writer
                    .next()
                    .write_oid(&yasna::models::ObjectIdentifier::from_slice(RSA_ENCRYPTION));
                writer.next().write_null();
            });
            writer.next().write_bytes(pkcs1);
        });
    })
}

fn offset(at: Timestamp) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(at.as_second())
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// `name` as rcgen writes it: each attribute in order with its string type. Refused when rcgen
/// could not write it back the same (an RDN of several or no attributes, an attribute twice).
fn distinguished_name(name: &X509Name<'_>) -> Result<DistinguishedName, Refusal> {
    use x509_parser::der_parser::asn1_rs::Tag;
    let unusual =
        || shape("the client certificate's subject has a form this renewal cannot reproduce");
    let mut dn = DistinguishedName::new();
    let mut seen = Vec::new();
    for rdn in name.iter() {
        let mut attributes = rdn.iter();
        let (Some(attribute), None) = (attributes.next(), attributes.next()) else {
            return Err(unusual());
        };
        let arcs: Vec<u64> = attribute.attr_type().iter().ok_or_else(unusual)?.collect();
        let kind = match arcs.as_slice() {
            [2, 5, 4, 3] => DnType::CommonName,
            [2, 5, 4, 6] => DnType::CountryName,
            [2, 5, 4, 7] => DnType::LocalityName,
            [2, 5, 4, 8] => DnType::StateOrProvinceName,
            [2, 5, 4, 10] => DnType::OrganizationName,
            [2, 5, 4, 11] => DnType::OrganizationalUnitName,
            _ => DnType::CustomDnType(arcs),
        };
        if seen.contains(&kind) {
            return Err(unusual());
        }
        let data = attribute.attr_value().data;
        let text = std::str::from_utf8(data).map_err(|_| unusual())?;
        let value = match attribute.attr_value().header.tag() {
            Tag::PrintableString => {
                DnValue::PrintableString(text.try_into().map_err(|_| unusual())?)
            }
            Tag::Utf8String => DnValue::Utf8String(text.to_owned()),
            Tag::Ia5String => DnValue::Ia5String(text.try_into().map_err(|_| unusual())?),
            _ => return Err(unusual()),
        };
        seen.push(kind.clone());
        dn.push(kind, value);
    }
    Ok(dn)
}

/// `yaml` with `user`'s client certificate and key replaced by `issued`'s; everything else as
/// it was (entries, order, other fields).
pub fn replaced(yaml: &str, user: &str, issued: &Issued) -> Result<String, Refusal> {
    let mut document = document(yaml)?;
    let entry = document
        .get_mut("users")
        .and_then(Value::as_sequence_mut)
        .and_then(|users| {
            users
                .iter_mut()
                .find(|u| u.get("name").and_then(Value::as_str) == Some(user))
        })
        .and_then(|u| u.get_mut("user"))
        .and_then(Value::as_mapping_mut)
        .ok_or_else(|| shape(format!("it has no user {user}")))?;
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    entry.insert(
        "client-certificate-data".into(),
        b64(&issued.certificate_pem).into(),
    );
    entry.insert("client-key-data".into(), b64(&issued.key_pem).into());
    serde_yaml::to_string(&document).map_err(|_| shape("it cannot be written back"))
}

#[cfg(test)]
mod tests;
