//! `--renew-management-kubeconfig`: the client certificate of `<cluster>-kubeconfig` renewed in
//! place when it is due, with the cluster's client CA (`<cluster>-cca`).
//!
//! The CA's Secret is read only when a renewal is due, and the Secret is written only after the
//! workload API server accepted the new certificate (`/version` with it), in one merge patch
//! guarded by the resourceVersion read: the CK8s control-plane provider, a person or a
//! `clusterctl move` changing the Secret meanwhile wins, and the next check starts over.

use crate::events::EventType;
use ck8s_certs_api::capi::kubeconfig_secret_name;
use ck8s_certs_api::cluster_certificates::renewal_reasons as why;
use ck8s_certs_api::reasons::events;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::{Context, Reading};
use crate::workload::client_certificate::{self, Held, Mode, Refusal};

/// The field manager of the Secret's renewed `value`.
const MANAGER: &str = "ck8s-certs-kubeconfig-renewal";

/// The type Cluster API gives the Secrets it writes (`<cluster>-kubeconfig` among them).
const CAPI_SECRET_TYPE: &str = "cluster.x-k8s.io/secret";

/// How long the new certificate is given to answer `/version`.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    pub mode: Mode,
    /// Renew this long before the end instead of at half the lifetime.
    pub renew_before: Option<SignedDuration>,
}

/// What the `KubeconfigRenewal` condition and the status say after a check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub ok: bool,
    pub reason: &'static str,
    pub message: String,
    /// The Event: type, reason and note (published for a new condition reason, or a renewal).
    pub event: Option<(EventType, &'static str, String)>,
    pub next: Option<Timestamp>,
    /// Set when this check renewed the certificate.
    pub renewed: Option<Timestamp>,
    /// NotAfter of `<cluster>-cca`, when this check read it (only a due renewal reads it).
    pub client_ca_end: Option<Timestamp>,
}

impl Report {
    /// A dry run's report: what would have been written.
    fn would_renew(message: String) -> Self {
        Self {
            ok: true,
            reason: why::WOULD_RENEW,
            event: Some((
                EventType::Normal,
                events::KUBECONFIG_WOULD_RENEW,
                message.clone(),
            )),
            message,
            next: None,
            renewed: None,
            client_ca_end: None,
        }
    }

    fn not_due(secret: &str, held: &Held, due: Timestamp) -> Self {
        Self {
            ok: true,
            reason: why::NOT_DUE,
            message: format!(
                "The client certificate in Secret {secret} expires at {}; it is renewed in place from {due}",
                held.not_after
            ),
            event: None,
            next: Some(due),
            renewed: None,
            client_ca_end: None,
        }
    }

    /// A reason that may pass on its own: tried again sooner than a refusal.
    pub fn transient(&self) -> bool {
        self.reason == why::FAILED
    }

    fn refused(secret: &str, refusal: &Refusal) -> Self {
        Self::not_renewed(
            refusal.reason(),
            format!("The client certificate in Secret {secret} is not renewed: {refusal}"),
        )
    }

    fn not_renewed(reason: &'static str, message: String) -> Self {
        Self {
            ok: false,
            reason,
            event: Some((
                EventType::Warning,
                events::KUBECONFIG_NOT_RENEWED,
                message.clone(),
            )),
            message,
            next: None,
            renewed: None,
            client_ca_end: None,
        }
    }
}

/// What to do with `reading` at `now`: nothing to say (the kubeconfig is missing or unreadable:
/// `Ready` says so), a refusal, not due yet, or due. Pure.
pub enum Plan {
    Silent,
    Report(Report),
    Due,
}

pub fn plan(config: Config, reading: &Reading, secret: &str, now: Timestamp) -> Plan {
    if config.mode == Mode::Off {
        return Plan::Silent;
    }
    let Reading::Read { held, .. } = reading else {
        return Plan::Silent;
    };
    match held {
        Err(refusal) => Plan::Report(Report::refused(secret, refusal)),
        Ok(held) => {
            let due = held.due_at(config.renew_before);
            if due <= now {
                return Plan::Due;
            }
            Plan::Report(Report::not_due(secret, held, due))
        }
    }
}

/// Renews the due certificate of `cluster` (or, in a dry run, does everything but the write).
/// The report carries the client CA's end when the CA was read.
pub async fn renew(
    ctx: &Context,
    namespace: &str,
    cluster: &str,
    config: Config,
    now: Timestamp,
) -> Report {
    let mut client_ca_end = None;
    let report = renew_with(ctx, namespace, cluster, config, now, &mut client_ca_end).await;
    Report {
        client_ca_end,
        ..report
    }
}

async fn renew_with(
    ctx: &Context,
    namespace: &str,
    cluster: &str,
    config: Config,
    now: Timestamp,
    client_ca_end: &mut Option<Timestamp>,
) -> Report {
    let name = kubeconfig_secret_name(cluster);
    let secret = format!("{namespace}/{name}");
    let ca_name = ck8s_certs_api::capi::client_ca_secret_name(cluster);
    let ca_secret = format!("{namespace}/{ca_name}");
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    // Read again: what is replaced is what is there now, guarded by its resourceVersion.
    let (version, yaml) = match kubeconfig(&secrets, &name, &secret, cluster).await {
        Ok(current) => current,
        Err(report) => return report,
    };
    let held = match client_certificate::held(&yaml, cluster) {
        Ok(held) => held,
        Err(refusal) => return Report::refused(&secret, &refusal),
    };
    // Renewed meanwhile (another replica before a hand-over, a person): nothing to do.
    let due = held.due_at(config.renew_before);
    if due > now {
        return Report::not_due(&secret, &held, due);
    }
    let (ca_pem, ca_key) = match client_ca(&secrets, &ca_name, &secret).await {
        Ok(ca) => ca,
        Err(report) => return report,
    };
    *client_ca_end = crate::workload::credentials::ca_not_after(ca_pem.as_bytes(), "tls.crt").ok();
    let issued = match client_certificate::issue(
        &held,
        &ca_secret,
        &ca_pem,
        &ca_key,
        config.renew_before,
        now,
    ) {
        Ok(issued) => issued,
        Err(refusal) => return Report::refused(&secret, &refusal),
    };
    let renewed = match client_certificate::replaced(&yaml, &held.user, &issued) {
        Ok(renewed) => renewed,
        Err(refusal) => return Report::refused(&secret, &refusal),
    };
    if let Err(reason) = accepted(&renewed, ctx.config.vetting).await {
        return Report::not_renewed(
            why::NOT_ACCEPTED,
            format!(
                "The client certificate in Secret {secret} is not renewed: the workload API server did not accept a new one signed by {ca_secret} ({reason}); nothing was written. Check that {ca_secret} is the CA of the API server's --client-ca-file"
            ),
        );
    }
    // What the next checks will read: the same due time, so the status stays as written.
    let renewed_held = match client_certificate::held(&renewed, cluster) {
        Ok(held) => held,
        Err(refusal) => return Report::refused(&secret, &refusal),
    };
    let due = renewed_held.due_at(config.renew_before);
    if config.mode == Mode::DryRun {
        let message = format!(
            "Dry run: the client certificate in Secret {secret} (expires at {}) would be replaced by one signed by {ca_secret}, valid until {}, which the workload API server accepted; nothing was written (--renew-management-kubeconfig=dry-run)",
            held.not_after, issued.not_after
        );
        return Report::would_renew(message);
    }
    let written = write(&secrets, &name, &secret, &version, renewed).await;
    match written {
        Ok(()) => Report {
            event: Some((
                EventType::Normal,
                events::KUBECONFIG_RENEWED,
                format!(
                    "The client certificate in Secret {secret} (it would have expired at {}) was renewed in place with {ca_secret}: valid until {}",
                    held.not_after, issued.not_after
                ),
            )),
            renewed: Some(now),
            ..Report::not_due(&secret, &renewed_held, due)
        },
        Err(report) => report,
    }
}

/// The kubeconfig Secret `name` (`secret`: its namespace/name) as it is now: its
/// resourceVersion and kubeconfig; the report of why it is not renewed otherwise.
async fn kubeconfig(
    secrets: &Api<Secret>,
    name: &str,
    secret: &str,
    cluster: &str,
) -> Result<(String, String), Report> {
    let object = match secrets.get(name).await {
        Ok(object) => object,
        Err(err) => {
            return Err(Report::not_renewed(
                why::FAILED,
                format!("Reading Secret {secret} failed, tried again at the next check: {err}"),
            ));
        }
    };
    // Only what Cluster API writes (the admission policy holds the same where it is installed).
    let labelled = object
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(ck8s_certs_api::capi::CLUSTER_NAME_LABEL))
        .is_some_and(|c| c == cluster);
    if object.type_.as_deref() != Some(CAPI_SECRET_TYPE) || !labelled {
        let refusal = Refusal::Shape(format!(
            "it is not a Cluster API kubeconfig Secret (type {CAPI_SECRET_TYPE}, label {}={cluster})",
            ck8s_certs_api::capi::CLUSTER_NAME_LABEL
        ));
        return Err(Report::refused(secret, &refusal));
    }
    let Some(version) = object.metadata.resource_version.clone() else {
        return Err(Report::not_renewed(
            why::FAILED,
            format!("Secret {secret} has no resourceVersion"),
        ));
    };
    match text_of(&object, ck8s_certs_api::capi::KUBECONFIG_SECRET_KEY) {
        Some(yaml) => Ok((version, yaml)),
        None => Err(Report::refused(
            secret,
            &Refusal::Shape("it has no `value`".into()),
        )),
    }
}

/// Writes the `renewed` kubeconfig into Secret `name` as long as it is still at `version`;
/// the report of why not otherwise.
async fn write(
    secrets: &Api<Secret>,
    name: &str,
    secret: &str,
    version: &str,
    renewed: String,
) -> Result<(), Report> {
    let patch = json!({
        "metadata": { "resourceVersion": version },
        "stringData": { ck8s_certs_api::capi::KUBECONFIG_SECRET_KEY: renewed },
    });
    let params = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    match secrets.patch(name, &params, &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Err(Report::not_renewed(
            why::FAILED,
            format!(
                "Secret {secret} changed while its client certificate was renewed; nothing was written, tried again at the next check"
            ),
        )),
        Err(err) => Err(Report::not_renewed(
            why::FAILED,
            format!("Writing Secret {secret} failed, tried again at the next check: {err}"),
        )),
    }
}

/// The client CA (`tls.crt`, `tls.key`) of Secret `ca_name`, which signs the kubeconfig's
/// client certificate in Secret `secret`; the report of why not otherwise.
async fn client_ca(
    secrets: &Api<Secret>,
    ca_name: &str,
    secret: &str,
) -> Result<(String, String), Report> {
    let ca_secret = format!("{}/{ca_name}", secrets.namespace().unwrap_or_default());
    let ca = match secrets.get_opt(ca_name).await {
        Ok(Some(ca)) => ca,
        Ok(None) => {
            return Err(Report::not_renewed(
                why::CLIENT_CA_MISSING,
                format!(
                    "The client certificate in Secret {secret} is not renewed: the client CA Secret {ca_secret} is not there (the CK8s control-plane provider writes it with the cluster)"
                ),
            ));
        }
        Err(err) => {
            return Err(Report::not_renewed(
                why::FAILED,
                format!("Reading Secret {ca_secret} failed, tried again at the next check: {err}"),
            ));
        }
    };
    let (Some(ca_pem), Some(ca_key)) = (text_of(&ca, "tls.crt"), text_of(&ca, "tls.key")) else {
        return Err(Report::not_renewed(
            why::CLIENT_CA_MISSING,
            format!(
                "The client certificate in Secret {secret} is not renewed: the client CA Secret {ca_secret} lacks `tls.crt` or `tls.key`"
            ),
        ));
    };
    Ok((ca_pem, ca_key))
}

/// The text of `key` of a Secret (from `data`).
pub(super) fn text_of(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .filter(|v| !v.trim().is_empty())
}

/// Whether the workload API server answers `/version` to a client of `kubeconfig`: the new
/// certificate is accepted (a certificate of an unknown CA is refused with 401).
async fn accepted(kubeconfig: &str, vetting: crate::workload::Vetting) -> Result<(), String> {
    let client = crate::workload::probe_client(kubeconfig, vetting).await?;
    match tokio::time::timeout(PROBE_TIMEOUT, client.apiserver_version()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(kube::Error::Api(status))) => Err(format!("it answered {}", status.code)),
        Ok(Err(err)) => Err(crate::text::truncate(err.to_string(), 200)),
        Err(_) => Err(format!(
            "no answer within {}",
            humantime::format_duration(PROBE_TIMEOUT)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::credentials::KubeconfigExpiry;

    #[test]
    fn off_says_nothing_and_unreadable_kubeconfigs_are_left_to_ready() {
        let secret = "ns/c-kubeconfig";
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let refused = Reading::Read {
            expiry: KubeconfigExpiry::default(),
            held: Err(Refusal::Shape("x".into())),
        };
        let off = Config::default();
        assert!(matches!(plan(off, &refused, secret, now), Plan::Silent));
        let on = Config {
            mode: Mode::On,
            renew_before: None,
        };
        assert!(matches!(
            plan(on, &Reading::Missing, secret, now),
            Plan::Silent
        ));
        assert!(matches!(
            plan(on, &Reading::Unreadable("x".into()), secret, now),
            Plan::Silent
        ));
        let Plan::Report(report) = plan(on, &refused, secret, now) else {
            panic!("a refusal is reported");
        };
        assert_eq!((report.ok, report.reason), (false, why::NOT_PROVIDER_SHAPE));
    }
}
