//! The webhook's serving certificate, managed by the controller itself.
//!
//! Why not cert-manager (as CAPI's own providers do): this webhook guards a single annotation,
//! must work on every management cluster the controller runs on (and in this project's e2e
//! environment, where the real path is proven), and an extra dependency that has to be up
//! before the first refresh request would be one more way to refuse requests. So: a private CA
//! and a serving certificate kept in one Secret of the controller's namespace, created by
//! whichever replica comes first (create-or-read, so replicas agree).
//!
//! The Secret is the one thing the replicas share, and everything follows from it:
//! - every replica serves the Secret's serving certificate, reloaded whenever the Secret changes
//!   (`super::keep_current` watches it);
//! - the configuration's `caBundle` is a pure function of the Secret ([`Current::bundle`]: its
//!   CA, then the CA it replaced, `ca.previous.crt`, for a day after a rotation), written only
//!   where it differs, so replicas that read the same Secret agree and at most one writes;
//! - a Secret is checked before it is used ([`plan`]): the CA is ours, a CA, matches its key and
//!   has more than a third of its lifetime left; the serving certificate matches its key, is
//!   signed by the CA, names every name this replica is called by and has more than 30 days
//!   left. What fails is re-issued, with a log line saying why: the serving certificate by the
//!   same CA, or a new CA (a rotation: the old one stays in the bundle while replicas move over).
//!
//! Nothing is written that the next check would replace again: two replicas re-issuing in turn
//! would never stop.

use std::collections::BTreeMap;
use std::net::IpAddr;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use serde_json::json;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

/// The CA outlives many serving certificates; it is replaced when a third of its life is left
/// (or the Secret is deleted or fails its checks).
const CA_DAYS: i64 = 3650;
const SERVING_DAYS: i64 = 365;
/// A serving certificate this close to its end is re-issued.
const RENEW_BEFORE: SignedDuration = SignedDuration::from_hours(30 * 24);
/// How long a replaced CA stays in the caBundle. Every replica reloads the Secret when it
/// changes (a watch) and checks it every 12 hours anyway: a day covers two of those checks.
pub const PREVIOUS_CA_KEPT: SignedDuration = SignedDuration::from_hours(24);
/// The subject of every CA this controller issues; a serving certificate is signed with this
/// name as its issuer, so a CA with another subject could not be issued from.
const CA_NAME: &str = "ck8s-certs webhook CA";
/// The webhook entries of the configuration that this controller serves (the others, added by
/// someone else, keep their own caBundle).
pub const OWN_WEBHOOK_SUFFIX: &str = ".certificates.ck8s.io";

const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const TLS_CERT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
/// The names the serving certificate was issued for, comma-separated (informational: its
/// subjectAltNames are what is checked).
const NAMES: &str = "names";
/// The CA that `ca.crt` replaced, kept in the caBundle until `ca.previous.until` (RFC 3339).
const PREVIOUS_CA: &str = "ca.previous.crt";
const PREVIOUS_UNTIL: &str = "ca.previous.until";

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
    #[error("updating the caBundle of {kind} {name} failed: {source}")]
    Configuration {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("generating the webhook certificate failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("a newly issued webhook certificate fails its own check ({0}); nothing was written")]
    SelfCheck(Why),
    #[error("Secret {namespace}/{name} kept changing while it was being written")]
    Contended { namespace: String, name: String },
    /// The Secret is gone, and the controller may not create Secrets (its role lets it update
    /// only this one, which ships with its components).
    #[error(
        "Secret {namespace}/{name} is missing and the controller may not create it: it ships empty with the provider's components (config/webhook/secret.yaml); create it empty again (`kubectl create secret generic -n {namespace} {name}`) and the controller fills it"
    )]
    MissingSecret { namespace: String, name: String },
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

/// What a checked Secret says: the certificate to serve, and the caBundle the configuration's
/// own entries must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Current {
    pub pem: Pem,
    pub bundle: String,
}

/// Why a Secret is not used as it is (a log line: never key material).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Why {
    #[error("the Secret is missing or empty")]
    Missing,
    #[error("the CA certificate or key cannot be read")]
    CaUnreadable,
    #[error("the CA is not one this controller issued (subject, CA flag or self-signature)")]
    NotOurCa,
    #[error("the CA key does not match the CA certificate")]
    CaKeyMismatch,
    #[error("the CA ends at {0}, with less than a third of its lifetime left")]
    CaEnding(Timestamp),
    #[error("the serving certificate or key cannot be read")]
    ServingUnreadable,
    #[error("the serving key does not match the serving certificate")]
    ServingKeyMismatch,
    #[error("the serving certificate is not signed by the CA")]
    NotSignedByCa,
    #[error("the serving certificate ends at {0}, within 30 days")]
    ServingEnding(Timestamp),
    #[error("the serving certificate does not name {0}")]
    Unnamed(String),
    #[error("the replaced CA's time in the caBundle is over")]
    PreviousOver,
}

/// What to do with a Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Plan {
    /// Serve it as it is.
    Keep(Current),
    /// Usable, but the replaced CA's day is over (or its entry unreadable): remove it.
    DropPrevious,
    /// A new serving certificate by the same CA.
    Reissue(Why),
    /// A new CA (and serving certificate); the old CA stays in the bundle for a while.
    Rotate(Why),
}

/// The serving certificate and bundle from the Secret, re-issuing what fails its checks. `held`
/// is what this replica serves now: when the Secret is gone, its CA is the one replicas may
/// still serve from, so it stays in the bundle.
pub async fn ensure(
    client: &Client,
    settings: &Settings,
    held: Option<&Pem>,
) -> Result<Current, CertificateError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.namespace);
    let failed = |action, source| CertificateError::Secret {
        action,
        namespace: settings.namespace.clone(),
        name: settings.secret.clone(),
        source,
    };
    // Replicas starting (or reacting to a change) together race for the Secret: the loser
    // reads the winner's.
    for _ in 0..5 {
        let now = Timestamp::now();
        let existing = secrets
            .get_opt(&settings.secret)
            .await
            .map_err(|e| failed("reading", e))?;
        let stored = existing.as_ref().map(Stored::read).unwrap_or_default();
        // Empty: as shipped (config/webhook/secret.yaml), or emptied to rotate the CA.
        let decided = match existing {
            Some(_) if !stored.is_empty() => plan(&stored, &settings.names, now),
            _ => Plan::Rotate(Why::Missing),
        };
        let data = match decided {
            Plan::Keep(current) => return Ok(current),
            Plan::DropPrevious => {
                tracing::info!(secret = %settings.secret, reason = %Why::PreviousOver, "Removing the replaced webhook CA from the caBundle");
                stored.without_previous()
            }
            Plan::Reissue(why) => {
                tracing::info!(secret = %settings.secret, reason = %why, "Issuing a new webhook serving certificate");
                reissued(&stored, &settings.names, now)?
            }
            Plan::Rotate(why) => {
                let previous = previous_ca(held.map(|p| p.ca.as_str()), &stored, now);
                let keeps_previous = previous.is_some();
                match why {
                    // An install, or the documented rotation.
                    Why::Missing => {
                        tracing::info!(secret = %settings.secret, reason = %why, keeps_previous, "Issuing a new webhook CA")
                    }
                    _ => {
                        tracing::warn!(secret = %settings.secret, reason = %why, keeps_previous, "Issuing a new webhook CA")
                    }
                }
                rotated(previous.as_deref(), &settings.names, now)?
            }
        };
        let current = match plan(&Stored::from_data(Some(&data)), &settings.names, now) {
            Plan::Keep(current) => current,
            Plan::Reissue(why) | Plan::Rotate(why) => return Err(CertificateError::SelfCheck(why)),
            Plan::DropPrevious => return Err(CertificateError::SelfCheck(Why::PreviousOver)),
        };
        let written = match existing {
            None => {
                let secret = Secret {
                    metadata: kube::api::ObjectMeta {
                        name: Some(settings.secret.clone()),
                        namespace: Some(settings.namespace.clone()),
                        ..Default::default()
                    },
                    type_: Some("kubernetes.io/tls".into()),
                    data: Some(data),
                    ..Default::default()
                };
                secrets
                    .create(&PostParams::default(), &secret)
                    .await
                    .map_err(|e| ("creating", e))
            }
            Some(mut secret) => {
                secret.data = Some(data);
                // The resourceVersion read above makes this a compare-and-swap.
                secrets
                    .replace(&settings.secret, &PostParams::default(), &secret)
                    .await
                    .map_err(|e| ("updating", e))
            }
        };
        match written {
            Ok(_) => return Ok(current),
            Err((_, kube::Error::Api(status))) if status.code == 409 => continue,
            Err(("creating", kube::Error::Api(status))) if status.code == 403 => {
                return Err(CertificateError::MissingSecret {
                    namespace: settings.namespace.clone(),
                    name: settings.secret.clone(),
                });
            }
            Err((action, err)) => return Err(failed(action, err)),
        }
    }
    Err(CertificateError::Contended {
        namespace: settings.namespace.clone(),
        name: settings.secret.clone(),
    })
}

/// What a caBundle write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Injected {
    Written,
    /// Every entry of ours already held the bundle (or there is none of ours).
    AlreadySet,
    /// No such configuration: the webhook is not called.
    NoConfiguration,
}

/// A webhook configuration whose entries of ours call this controller: the trigger webhooks'
/// MutatingWebhookConfiguration and the policy webhook's ValidatingWebhookConfiguration.
pub trait Configuration:
    kube::Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + serde::Serialize
    + Send
    + Sync
    + 'static
{
    type Entry: Entry;
    /// For messages.
    const KIND: &'static str;
    fn entries(&self) -> &[Self::Entry];
}

/// One entry of a webhook configuration.
pub trait Entry {
    fn name(&self) -> &str;
    fn client_config(&self) -> &WebhookClientConfig;
}

impl Configuration for MutatingWebhookConfiguration {
    type Entry = MutatingWebhook;
    const KIND: &'static str = "MutatingWebhookConfiguration";
    fn entries(&self) -> &[MutatingWebhook] {
        self.webhooks.as_deref().unwrap_or_default()
    }
}

impl Configuration for ValidatingWebhookConfiguration {
    type Entry = ValidatingWebhook;
    const KIND: &'static str = "ValidatingWebhookConfiguration";
    fn entries(&self) -> &[ValidatingWebhook] {
        self.webhooks.as_deref().unwrap_or_default()
    }
}

impl Entry for MutatingWebhook {
    fn name(&self) -> &str {
        &self.name
    }
    fn client_config(&self) -> &WebhookClientConfig {
        &self.client_config
    }
}

impl Entry for ValidatingWebhook {
    fn name(&self) -> &str {
        &self.name
    }
    fn client_config(&self) -> &WebhookClientConfig {
        &self.client_config
    }
}

/// Puts `bundle` into each of our entries of the configuration whose caBundle differs.
pub async fn inject_ca_bundle<C: Configuration>(
    client: &Client,
    configuration: &str,
    bundle: &str,
) -> Result<Injected, CertificateError> {
    let api: Api<C> = Api::all(client.clone());
    let failed = |source| CertificateError::Configuration {
        kind: C::KIND,
        name: configuration.to_owned(),
        source,
    };
    let mut attempts = 0;
    loop {
        attempts += 1;
        let Some(current) = api.get_opt(configuration).await.map_err(failed)? else {
            return Ok(Injected::NoConfiguration);
        };
        let ops = bundle_patch(current.entries(), bundle);
        if ops.is_empty() {
            return Ok(Injected::AlreadySet);
        }
        let patch: json_patch::Patch =
            serde_json::from_value(json!(ops)).map_err(|e| failed(kube::Error::SerdeError(e)))?;
        match api
            .patch(
                configuration,
                &PatchParams::default(),
                &Patch::<()>::Json(patch),
            )
            .await
        {
            Ok(_) => return Ok(Injected::Written),
            // A `test` failed: the configuration changed since it was read (another replica set
            // the same bundle, or entries moved). Read it again.
            Err(kube::Error::Api(status)) if status.code == 422 && attempts < 3 => continue,
            Err(err) => return Err(failed(err)),
        }
    }
}

/// Whether any of our entries of `configuration` lacks `bundle`.
pub fn bundle_differs(configuration: &impl Configuration, bundle: &str) -> bool {
    !bundle_patch(configuration.entries(), bundle).is_empty()
}

/// The JSON patch that sets `bundle` on each of our entries that lacks it. Entries are addressed
/// by index, so each `add` is guarded by a `test` of the entry's name at that index and of the
/// caBundle read: if the configuration changed in between (entries re-ordered, another replica
/// already wrote), the whole patch fails instead of setting the wrong entry or writing twice.
pub fn bundle_patch(webhooks: &[impl Entry], bundle: &str) -> Vec<serde_json::Value> {
    let want = ByteString(bundle.as_bytes().to_vec());
    let mut ops = Vec::new();
    for (i, webhook) in webhooks.iter().enumerate() {
        let ours = webhook.name().ends_with(OWN_WEBHOOK_SUFFIX);
        let read = &webhook.client_config().ca_bundle;
        if !ours || read.as_ref() == Some(&want) {
            continue;
        }
        let path = format!("/webhooks/{i}/clientConfig/caBundle");
        ops.push(
            json!({ "op": "test", "path": format!("/webhooks/{i}/name"), "value": webhook.name() }),
        );
        if let Some(read) = read {
            ops.push(json!({ "op": "test", "path": path, "value": read }));
        }
        ops.push(json!({ "op": "add", "path": path, "value": want }));
    }
    ops
}

/// What a Secret holds, as text.
#[derive(Clone, Debug, Default)]
struct Stored {
    ca_cert: Option<String>,
    ca_key: Option<String>,
    cert: Option<String>,
    key: Option<String>,
    previous: Option<String>,
    previous_until: Option<String>,
    /// Every other key, kept as it is.
    other: BTreeMap<String, ByteString>,
}

impl Stored {
    /// Nothing of ours in it (other keys are kept, but do not count).
    fn is_empty(&self) -> bool {
        [
            &self.ca_cert,
            &self.ca_key,
            &self.cert,
            &self.key,
            &self.previous,
            &self.previous_until,
        ]
        .iter()
        .all(|field| field.is_none())
    }

    fn read(secret: &Secret) -> Self {
        Self::from_data(secret.data.as_ref())
    }

    fn from_data(data: Option<&BTreeMap<String, ByteString>>) -> Self {
        let text = |key: &str| {
            data.and_then(|d| d.get(key))
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
        };
        let known = [
            CA_CERT,
            CA_KEY,
            TLS_CERT,
            TLS_KEY,
            PREVIOUS_CA,
            PREVIOUS_UNTIL,
        ];
        Self {
            ca_cert: text(CA_CERT),
            ca_key: text(CA_KEY),
            cert: text(TLS_CERT),
            key: text(TLS_KEY),
            previous: text(PREVIOUS_CA),
            previous_until: text(PREVIOUS_UNTIL),
            other: data
                .into_iter()
                .flatten()
                .filter(|(k, _)| !known.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    /// The caBundle this Secret implies: its CA, then the replaced one while it is kept. A
    /// function of the Secret alone, so every replica that read it agrees.
    fn bundle(&self) -> Option<String> {
        let ca = self.ca_cert.as_deref()?;
        let mut bundle = ends_with_newline(ca);
        if let Some(previous) = self.previous.as_deref().filter(|p| parses(p)) {
            bundle.push_str(&ends_with_newline(previous));
        }
        Some(bundle)
    }

    /// The replaced CA is due to go: its day is over, or it (or its date) cannot be read.
    fn previous_over(&self, now: Timestamp) -> bool {
        if self.previous.is_none() && self.previous_until.is_none() {
            return false;
        }
        let until = self
            .previous_until
            .as_deref()
            .and_then(|u| u.trim().parse::<Timestamp>().ok());
        let readable = self.previous.as_deref().is_some_and(parses);
        !readable || until.is_none_or(|until| now >= until)
    }

    fn without_previous(&self) -> BTreeMap<String, ByteString> {
        let mut data = self.data();
        data.remove(PREVIOUS_CA);
        data.remove(PREVIOUS_UNTIL);
        data
    }

    fn data(&self) -> BTreeMap<String, ByteString> {
        let mut data = self.other.clone();
        for (key, value) in [
            (CA_CERT, &self.ca_cert),
            (CA_KEY, &self.ca_key),
            (TLS_CERT, &self.cert),
            (TLS_KEY, &self.key),
            (PREVIOUS_CA, &self.previous),
            (PREVIOUS_UNTIL, &self.previous_until),
        ] {
            if let Some(value) = value {
                data.insert(key.to_owned(), ByteString(value.clone().into_bytes()));
            }
        }
        data
    }
}

/// The checks, in order: the CA (a failure needs a new CA), the serving certificate (a new one
/// by the same CA), then the replaced CA's time. Pure: the Secret, the names and the time.
fn plan(stored: &Stored, names: &[String], now: Timestamp) -> Plan {
    let ca_block = stored.ca_cert.as_deref().and_then(pem_block);
    let Some(ca) = ca_block.as_ref().and_then(|b| b.parse_x509().ok()) else {
        return Plan::Rotate(Why::CaUnreadable);
    };
    let Some(ca_key) = stored
        .ca_key
        .as_deref()
        .and_then(|k| KeyPair::from_pem(k).ok())
    else {
        return Plan::Rotate(Why::CaUnreadable);
    };
    if let Err(why) = check_ca(&ca, &ca_key, now) {
        return Plan::Rotate(why);
    }
    let leaf_block = stored.cert.as_deref().and_then(pem_block);
    let leaf = leaf_block.as_ref().and_then(|b| b.parse_x509().ok());
    let key = stored
        .key
        .as_deref()
        .and_then(|k| KeyPair::from_pem(k).ok());
    let (Some(leaf), Some(key)) = (leaf, key) else {
        return Plan::Reissue(Why::ServingUnreadable);
    };
    if let Err(why) = check_serving(&ca, &leaf, &key, names, now) {
        return Plan::Reissue(why);
    }
    if stored.previous_over(now) {
        return Plan::DropPrevious;
    }
    match (
        stored.ca_cert.clone(),
        stored.cert.clone(),
        stored.key.clone(),
        stored.bundle(),
    ) {
        (Some(ca), Some(cert), Some(key), Some(bundle)) => Plan::Keep(Current {
            pem: Pem { ca, cert, key },
            bundle,
        }),
        // Unreachable: each was parsed above.
        _ => Plan::Rotate(Why::CaUnreadable),
    }
}

fn check_ca(ca: &X509Certificate<'_>, key: &KeyPair, now: Timestamp) -> Result<(), Why> {
    let subject = ca.subject();
    let ours = subject.iter_attributes().count() == 1
        && subject
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            == Some(CA_NAME);
    if !ours || !ca.is_ca() || ca.issuer() != ca.subject() || ca.verify_signature(None).is_err() {
        return Err(Why::NotOurCa);
    }
    if !key_matches(key, ca) {
        return Err(Why::CaKeyMismatch);
    }
    let (from, until) = validity(ca).ok_or(Why::CaUnreadable)?;
    if ca_due(from, until, now) {
        return Err(Why::CaEnding(until));
    }
    Ok(())
}

fn check_serving(
    ca: &X509Certificate<'_>,
    leaf: &X509Certificate<'_>,
    key: &KeyPair,
    names: &[String],
    now: Timestamp,
) -> Result<(), Why> {
    if !key_matches(key, leaf) {
        return Err(Why::ServingKeyMismatch);
    }
    if leaf.issuer() != ca.subject() || leaf.verify_signature(Some(ca.public_key())).is_err() {
        return Err(Why::NotSignedByCa);
    }
    let (_, until) = validity(leaf).ok_or(Why::ServingUnreadable)?;
    if until.duration_since(now) <= RENEW_BEFORE {
        return Err(Why::ServingEnding(until));
    }
    let named = subject_alt_names(leaf);
    if let Some(missing) = names.iter().find(|n| !named.contains(&normal(n))) {
        return Err(Why::Unnamed(missing.clone()));
    }
    Ok(())
}

/// Less than a third of the CA's lifetime is left (or none): replace it while every
/// certificate it signed is still good, well before anything fails.
fn ca_due(not_before: Timestamp, not_after: Timestamp, now: Timestamp) -> bool {
    let lifetime = not_after.duration_since(not_before);
    not_after.duration_since(now) < lifetime / 3
}

/// The key is the certificate's: their public keys are the same bytes.
fn key_matches(key: &KeyPair, certificate: &X509Certificate<'_>) -> bool {
    key.public_key_raw() == certificate.public_key().subject_public_key.data.as_ref()
}

fn validity(certificate: &X509Certificate<'_>) -> Option<(Timestamp, Timestamp)> {
    let validity = certificate.validity();
    Some((
        Timestamp::from_second(validity.not_before.timestamp()).ok()?,
        Timestamp::from_second(validity.not_after.timestamp()).ok()?,
    ))
}

fn pem_block(pem: &str) -> Option<x509_parser::pem::Pem> {
    x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .ok()
        .map(|(_, block)| block)
}

fn parses(pem: &str) -> bool {
    pem_block(pem).is_some_and(|b| b.parse_x509().is_ok())
}

fn ends_with_newline(pem: &str) -> String {
    format!("{}\n", pem.trim_end())
}

/// A name as the certificate carries it: an address in its canonical form, a DNS name in
/// lower case.
fn normal(name: &str) -> String {
    match name.parse::<IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => name.to_ascii_lowercase(),
    }
}

fn subject_alt_names(certificate: &X509Certificate<'_>) -> Vec<String> {
    let Ok(Some(extension)) = certificate.subject_alternative_name() else {
        return Vec::new();
    };
    extension
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => Some(dns.to_ascii_lowercase()),
            GeneralName::IPAddress(bytes) => match bytes.len() {
                4 => <[u8; 4]>::try_from(*bytes).ok().map(IpAddr::from),
                16 => <[u8; 16]>::try_from(*bytes).ok().map(IpAddr::from),
                _ => None,
            }
            .map(|ip| ip.to_string()),
            _ => None,
        })
        .collect()
}

/// The CA to keep in the bundle beside a new one: the one this replica serves from (the bundle
/// holds it: replicas load a certificate only once its CA is there), else the Secret's own, if
/// it is a certificate still valid.
fn previous_ca(held: Option<&str>, stored: &Stored, now: Timestamp) -> Option<String> {
    [held, stored.ca_cert.as_deref()]
        .into_iter()
        .flatten()
        .find(|pem| {
            pem_block(pem)
                .and_then(|b| b.parse_x509().ok().and_then(|c| validity(&c)))
                .is_some_and(|(_, until)| now < until)
        })
        .map(ends_with_newline)
}

/// A new CA and serving certificate, keeping `previous` in the bundle for [`PREVIOUS_CA_KEPT`].
fn rotated(
    previous: Option<&str>,
    names: &[String],
    now: Timestamp,
) -> Result<BTreeMap<String, ByteString>, rcgen::Error> {
    let ca_key = KeyPair::generate()?;
    let ca = ca_params(now)?.self_signed(&ca_key)?;
    let (cert, key) = serving(&ca_key, names, now)?;
    let until = now.saturating_add(PREVIOUS_CA_KEPT).unwrap_or(now);
    let stored = Stored {
        ca_cert: Some(ca.pem()),
        ca_key: Some(ca_key.serialize_pem()),
        cert: Some(cert),
        key: Some(key),
        previous: previous.map(str::to_owned),
        previous_until: previous.map(|_| until.to_string()),
        other: names_entry(names),
    };
    Ok(stored.data())
}

/// A new serving certificate by the stored CA, for our names and every name the old one had
/// (another replica may be called by them: dropping them would have it re-issue in turn). The
/// replaced CA goes too if its time is over.
fn reissued(
    stored: &Stored,
    names: &[String],
    now: Timestamp,
) -> Result<BTreeMap<String, ByteString>, rcgen::Error> {
    let ca_key = KeyPair::from_pem(stored.ca_key.as_deref().unwrap_or_default())?;
    let mut all: Vec<String> = names.to_vec();
    let old = stored.cert.as_deref().and_then(pem_block);
    if let Some(old) = old.as_ref().and_then(|b| b.parse_x509().ok()) {
        for name in subject_alt_names(&old) {
            if !all.iter().any(|n| normal(n) == name) {
                all.push(name);
            }
        }
    }
    let (cert, key) = serving(&ca_key, &all, now)?;
    let mut renewed = stored.clone();
    renewed.cert = Some(cert);
    renewed.key = Some(key);
    renewed.other.extend(names_entry(&all));
    if stored.previous_over(now) {
        renewed.previous = None;
        renewed.previous_until = None;
    }
    Ok(renewed.data())
}

fn names_entry(names: &[String]) -> BTreeMap<String, ByteString> {
    BTreeMap::from([(NAMES.to_owned(), ByteString(names.join(",").into_bytes()))])
}

/// The CA's parameters; rebuilt identically to sign with a stored CA key (its subject is
/// checked to be [`CA_NAME`]).
fn ca_params(now: Timestamp) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, CA_NAME);
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

/// A serving certificate for `names` signed by the CA key, and its key, as PEM.
fn serving(
    ca_key: &KeyPair,
    names: &[String],
    now: Timestamp,
) -> Result<(String, String), rcgen::Error> {
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
    Ok((cert.pem(), key.serialize_pem()))
}

#[cfg(test)]
mod tests;
