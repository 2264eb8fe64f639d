//! The webhook's serving certificate, managed by the controller itself.
//!
//! Why not cert-manager (as CAPI's own providers do): this webhook guards a single annotation,
//! must work on every management cluster the controller runs on (and in this project's e2e
//! environment, where the real path is proven), and an extra dependency that has to be up
//! before the first refresh request would be one more way to refuse requests. So: a private CA
//! and a serving certificate kept in one Secret of the controller's namespace, created by
//! whichever replica comes first (create-or-read, so replicas agree), the serving certificate
//! re-issued by the same CA a month before it expires, and the CA put into the
//! MutatingWebhookConfiguration's `caBundle` only when it differs (no write at rest).

use std::net::IpAddr;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use serde_json::json;

/// The CA outlives many serving certificates; it is replaced (with a caBundle update) only when
/// the Secret is deleted or unreadable.
const CA_DAYS: i64 = 3650;
const SERVING_DAYS: i64 = 365;
/// A serving certificate this close to its end is re-issued.
const RENEW_BEFORE: SignedDuration = SignedDuration::from_hours(30 * 24);

const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const TLS_CERT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
/// The names the serving certificate was issued for, comma-separated.
const NAMES: &str = "names";

#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("{action} Secret {namespace}/{name} failed: {source}")]
    Secret {
        action: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("updating the caBundle of MutatingWebhookConfiguration {name} failed: {source}")]
    Configuration {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("generating the webhook certificate failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("Secret {namespace}/{name} kept changing while it was being written")]
    Contended { namespace: String, name: String },
}

/// Where the certificate lives and what it must name.
#[derive(Clone, Debug)]
pub struct Settings {
    pub namespace: String,
    pub secret: String,
    /// DNS names (`<service>.<namespace>.svc`, …) and addresses the API server dials.
    pub names: Vec<String>,
}

/// The PEM files of a serving certificate and its CA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pem {
    pub ca: String,
    pub cert: String,
    pub key: String,
}

/// The serving certificate from the Secret, creating or renewing it as needed.
pub async fn ensure(client: &Client, settings: &Settings) -> Result<Pem, CertificateError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.namespace);
    let failed = |action, source| CertificateError::Secret {
        action,
        namespace: settings.namespace.clone(),
        name: settings.secret.clone(),
        source,
    };
    // Replicas starting together race for the Secret: the loser reads the winner's.
    for _ in 0..5 {
        let now = Timestamp::now();
        let existing = secrets
            .get_opt(&settings.secret)
            .await
            .map_err(|e| failed("reading", e))?;
        let Some(mut secret) = existing else {
            let pem = issue(None, &settings.names, now)?;
            let secret = Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some(settings.secret.clone()),
                    namespace: Some(settings.namespace.clone()),
                    ..Default::default()
                },
                type_: Some("kubernetes.io/tls".into()),
                data: Some(data(&pem.0, &pem.1, &settings.names)),
                ..Default::default()
            };
            match secrets.create(&PostParams::default(), &secret).await {
                Ok(_) => return Ok(pem.0),
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(err) => return Err(failed("creating", err)),
            }
        };
        let stored = Stored::read(&secret);
        if let Some(pem) = stored.usable(&settings.names, now) {
            return Ok(pem);
        }
        let renewed = issue(stored.ca(), &settings.names, now)?;
        tracing::info!(secret = %settings.secret, "Issuing a new webhook serving certificate");
        secret.data = Some(data(&renewed.0, &renewed.1, &settings.names));
        // The resourceVersion read above makes this a compare-and-swap.
        match secrets
            .replace(&settings.secret, &PostParams::default(), &secret)
            .await
        {
            Ok(_) => return Ok(renewed.0),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(err) => return Err(failed("updating", err)),
        }
    }
    Err(CertificateError::Contended {
        namespace: settings.namespace.clone(),
        name: settings.secret.clone(),
    })
}

/// Puts `ca` into every webhook of the configuration whose caBundle differs; `Ok(false)` when
/// nothing had to change.
pub async fn inject_ca_bundle(
    client: &Client,
    configuration: &str,
    ca: &str,
) -> Result<bool, CertificateError> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let failed = |source| CertificateError::Configuration {
        name: configuration.to_owned(),
        source,
    };
    let current = api.get(configuration).await.map_err(failed)?;
    let want = ByteString(ca.as_bytes().to_vec());
    let ops: Vec<serde_json::Value> = current
        .webhooks
        .unwrap_or_default()
        .iter()
        .enumerate()
        .filter(|(_, w)| w.client_config.ca_bundle.as_ref() != Some(&want))
        .map(|(i, _)| json!({ "op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": want }))
        .collect();
    if ops.is_empty() {
        return Ok(false);
    }
    let patch: json_patch::Patch =
        serde_json::from_value(json!(ops)).map_err(|e| failed(kube::Error::SerdeError(e)))?;
    api.patch(
        configuration,
        &PatchParams::default(),
        &Patch::<()>::Json(patch),
    )
    .await
    .map_err(failed)?;
    Ok(true)
}

/// What a Secret holds, as far as it can be read.
struct Stored {
    ca_cert: Option<String>,
    ca_key: Option<KeyPair>,
    cert: Option<String>,
    key: Option<String>,
    names: Option<String>,
}

impl Stored {
    fn read(secret: &Secret) -> Self {
        let text = |key: &str| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
        };
        Self {
            ca_cert: text(CA_CERT),
            ca_key: text(CA_KEY).and_then(|k| KeyPair::from_pem(&k).ok()),
            cert: text(TLS_CERT),
            key: text(TLS_KEY),
            names: text(NAMES),
        }
    }

    /// The stored serving certificate, if it names `names` and is not due for renewal.
    fn usable(&self, names: &[String], now: Timestamp) -> Option<Pem> {
        let (ca, cert, key) = (self.ca_cert.clone()?, self.cert.clone()?, self.key.clone()?);
        self.ca_key.as_ref()?;
        let not_after = crate::k8sd::certificate_not_after(cert.as_bytes())?;
        let fresh = not_after.duration_since(now) > RENEW_BEFORE;
        (fresh && self.names.as_deref() == Some(names.join(",").as_str())).then_some(Pem {
            ca,
            cert,
            key,
        })
    }

    /// The CA, when both its certificate and key are readable.
    fn ca(&self) -> Option<(String, &KeyPair)> {
        crate::k8sd::certificate_not_after(self.ca_cert.as_deref()?.as_bytes())?;
        Some((self.ca_cert.clone()?, self.ca_key.as_ref()?))
    }
}

fn data(
    pem: &Pem,
    ca_key: &str,
    names: &[String],
) -> std::collections::BTreeMap<String, ByteString> {
    [
        (CA_CERT, pem.ca.clone()),
        (CA_KEY, ca_key.to_owned()),
        (TLS_CERT, pem.cert.clone()),
        (TLS_KEY, pem.key.clone()),
        (NAMES, names.join(",")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), ByteString(v.into_bytes())))
    .collect()
}

/// The CA's parameters; rebuilt identically to sign with a stored CA key.
fn ca_params(now: Timestamp) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "ck8s-certs webhook CA");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    set_validity(&mut params, now, CA_DAYS);
    Ok(params)
}

/// Valid from yesterday (clock skew) for `days` days, in whole UTC days.
fn set_validity(params: &mut CertificateParams, now: Timestamp, days: i64) {
    let date = |t: Timestamp| {
        let d = t.to_zoned(jiff::tz::TimeZone::UTC).date();
        rcgen::date_time_ymd(i32::from(d.year()), d.month() as u8, d.day() as u8)
    };
    let day = SignedDuration::from_hours(24);
    params.not_before = date(now.saturating_sub(day).unwrap_or(now));
    params.not_after = date(now.saturating_add(day * days as i32).unwrap_or(now));
}

/// A serving certificate for `names` signed by `ca` (a new CA when `None`), with the CA key's
/// PEM.
fn issue(
    ca: Option<(String, &KeyPair)>,
    names: &[String],
    now: Timestamp,
) -> Result<(Pem, String), rcgen::Error> {
    let generated;
    let (ca_pem, ca_key) = match ca {
        Some((pem, key)) => (pem, key),
        None => {
            let key = KeyPair::generate()?;
            let certificate = ca_params(now)?.self_signed(&key)?;
            generated = key;
            (certificate.pem(), &generated)
        }
    };
    let issuer = Issuer::new(ca_params(now)?, ca_key);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = {
        let mut name = DistinguishedName::new();
        name.push(
            DnType::CommonName,
            names.first().map_or("ck8s-certs-webhook", String::as_str),
        );
        name
    };
    params.subject_alt_names = names
        .iter()
        .map(|n| match n.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => n.clone().try_into().map(SanType::DnsName),
        })
        .collect::<Result<_, _>>()?;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    set_validity(&mut params, now, SERVING_DAYS);
    let cert = params.signed_by(&key, &issuer)?;
    Ok((
        Pem {
            ca: ca_pem,
            cert: cert.pem(),
            key: key.serialize_pem(),
        },
        ca_key.serialize_pem(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec![
            "ck8s-certs-webhook-service.ck8s-certs-system.svc".into(),
            "127.0.0.1".into(),
        ]
    }

    fn secret_of(pem: &Pem, ca_key: &str, names: &[String]) -> Secret {
        Secret {
            data: Some(data(pem, ca_key, names)),
            ..Default::default()
        }
    }

    #[test]
    fn a_stored_certificate_is_used_until_a_month_before_it_ends() {
        let now = Timestamp::now();
        let (pem, ca_key) = issue(None, &names(), now).unwrap();
        let stored = Stored::read(&secret_of(&pem, &ca_key, &names()));
        assert_eq!(stored.usable(&names(), now), Some(pem.clone()));
        let late = now + SignedDuration::from_hours(24 * (SERVING_DAYS - 20));
        assert_eq!(
            stored.usable(&names(), late),
            None,
            "renewed before it ends"
        );
        assert_eq!(
            stored.usable(&names()[..1], now),
            None,
            "other names: re-issued"
        );
    }

    #[test]
    fn a_renewed_certificate_keeps_the_ca_so_the_ca_bundle_stays_valid() {
        let now = Timestamp::now();
        let (first, ca_key) = issue(None, &names(), now).unwrap();
        let stored = Stored::read(&secret_of(&first, &ca_key, &names()));
        let (renewed, same_key) = issue(stored.ca(), &names(), now).unwrap();
        assert_eq!(renewed.ca, first.ca);
        assert_eq!(same_key, ca_key);
        assert_ne!(renewed.cert, first.cert);
        // The new leaf verifies against the stored CA.
        let (_, ca) = x509_parser::pem::parse_x509_pem(first.ca.as_bytes()).unwrap();
        let (_, leaf) = x509_parser::pem::parse_x509_pem(renewed.cert.as_bytes()).unwrap();
        let (ca, leaf) = (ca.parse_x509().unwrap(), leaf.parse_x509().unwrap());
        assert!(leaf.verify_signature(Some(ca.public_key())).is_ok());
        assert_eq!(leaf.issuer(), ca.subject());
    }

    #[test]
    fn an_unreadable_secret_gets_a_new_ca() {
        let stored = Stored::read(&Secret::default());
        assert!(stored.ca().is_none());
        assert!(stored.usable(&names(), Timestamp::now()).is_none());
    }
}
