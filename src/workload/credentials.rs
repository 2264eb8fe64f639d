//! When the credentials of a `<cluster>-kubeconfig` expire: the NotAfter of the client
//! certificate the current context authenticates with, and of the CA it trusts. The CK8s
//! control-plane provider issues that client certificate for a year and does not rotate it, so it
//! is usually the first credential of a fleet to die; once it has, the workload API server
//! refuses every request with a TLS error that names neither the Secret nor the date.

use base64::Engine;
use jiff::Timestamp;
use kube::config::Kubeconfig;

/// The kubeconfig's certificate expiries (`None`: it has no such certificate, e.g. it
/// authenticates with a token, or trusts the system roots).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KubeconfigExpiry {
    pub client: Option<Timestamp>,
    pub ca: Option<Timestamp>,
    /// The client CA that signs `client` (`<cluster>-cca`): read only with
    /// `--renew-management-kubeconfig`, which needs it.
    pub client_ca: Option<Timestamp>,
}

impl KubeconfigExpiry {
    /// The certificate that has expired at `now` (the client's first), and when.
    pub fn expired(&self, now: Timestamp) -> Option<(Certificate, Timestamp)> {
        self.each()
            .find_map(|(which, at)| at.filter(|at| *at <= now).map(|at| (which, at)))
    }

    /// The earliest expiry, with its certificate.
    pub fn first(&self) -> Option<(Certificate, Timestamp)> {
        self.each()
            .filter_map(|(which, at)| at.map(|at| (which, at)))
            .min_by_key(|(_, at)| *at)
    }

    /// Each certificate, the client's first.
    pub fn each(&self) -> impl Iterator<Item = (Certificate, Option<Timestamp>)> {
        [
            (Certificate::Client, self.client),
            (Certificate::Ca, self.ca),
            (Certificate::ClientCa, self.client_ca),
        ]
        .into_iter()
    }
}

/// Which certificate of a kubeconfig.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Certificate {
    Client,
    Ca,
    /// `<cluster>-cca`'s, not the kubeconfig's.
    ClientCa,
}

impl Certificate {
    /// For messages: "client certificate", "cluster CA certificate".
    pub fn describe(self) -> &'static str {
        match self {
            Self::Client => "client certificate",
            Self::Ca => "cluster CA certificate",
            Self::ClientCa => "client CA certificate",
        }
    }

    /// The metric label value.
    pub fn label(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Ca => "ca",
            Self::ClientCa => "client_ca",
        }
    }
}

/// Reads the current context's certificates. An error says what cannot be read (never the
/// certificate or key material itself).
pub fn kubeconfig_expiry(kubeconfig: &Kubeconfig) -> Result<KubeconfigExpiry, String> {
    let context_name = kubeconfig
        .current_context
        .as_deref()
        .or_else(|| kubeconfig.contexts.first().map(|c| c.name.as_str()))
        .ok_or("it has no context")?;
    let context = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| format!("its current context {context_name:?} is not defined"))?;
    let user = context.user.as_deref().and_then(|name| {
        kubeconfig
            .auth_infos
            .iter()
            .find(|a| a.name == name)
            .and_then(|a| a.auth_info.as_ref())
    });
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref());
    let client = user
        .and_then(|u| u.client_certificate_data.as_deref())
        .map(|data| not_after(data, "client-certificate-data", Bundle::First))
        .transpose()?;
    let ca = cluster
        .and_then(|c| c.certificate_authority_data.as_deref())
        .map(|data| not_after(data, "certificate-authority-data", Bundle::Latest))
        .transpose()?;
    Ok(KubeconfigExpiry {
        client,
        ca,
        client_ca: None,
    })
}

/// Which NotAfter of a PEM bundle counts.
enum Bundle {
    /// The leaf, first in a chain.
    First,
    /// The last to expire: a CA bundle is trusted while any of it is.
    Latest,
}

fn not_after(base64: &str, field: &str, bundle: Bundle) -> Result<Timestamp, String> {
    let pem = base64::engine::general_purpose::STANDARD
        .decode(base64.trim())
        .map_err(|_| format!("{field} is not base64"))?;
    pem_not_after(&pem, field, bundle)
}

/// The NotAfter of a CA certificate (PEM), e.g. `tls.crt` of `<cluster>-cca`.
pub fn ca_not_after(pem: &[u8], field: &str) -> Result<Timestamp, String> {
    pem_not_after(pem, field, Bundle::Latest)
}

fn pem_not_after(pem: &[u8], field: &str, bundle: Bundle) -> Result<Timestamp, String> {
    let mut expiries = Vec::new();
    for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let block = block.map_err(|_| format!("{field} is not PEM"))?;
        if block.label != "CERTIFICATE" {
            continue;
        }
        let certificate = block
            .parse_x509()
            .map_err(|_| format!("{field} holds a certificate that cannot be parsed"))?;
        let at = Timestamp::from_second(certificate.validity().not_after.timestamp())
            .map_err(|_| format!("{field} holds a certificate with an out-of-range NotAfter"))?;
        expiries.push(at);
    }
    let chosen = match bundle {
        Bundle::First => expiries.first().copied(),
        Bundle::Latest => expiries.iter().max().copied(),
    };
    chosen.ok_or_else(|| format!("{field} holds no certificate"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate(not_after: (i32, u8, u8)) -> String {
        let mut params = rcgen::CertificateParams::new(vec!["test".into()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2025, 1, 1);
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().pem()
    }

    fn b64(text: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(text)
    }

    fn kubeconfig(client: Option<&str>, ca: Option<&str>) -> Kubeconfig {
        let mut yaml = String::from(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: w, user: admin}\nclusters:\n- name: w\n  cluster:\n    server: https://127.0.0.1:6443\n",
        );
        if let Some(ca) = ca {
            yaml.push_str(&format!("    certificate-authority-data: {}\n", b64(ca)));
        }
        yaml.push_str("users:\n- name: admin\n  user:\n");
        match client {
            Some(client) => yaml.push_str(&format!(
                "    client-certificate-data: {}\n    client-key-data: {}\n",
                b64(client),
                b64("unused")
            )),
            None => yaml.push_str("    token: abc\n"),
        }
        Kubeconfig::from_yaml(&yaml).unwrap()
    }

    fn at(date: &str) -> Timestamp {
        format!("{date}T00:00:00Z").parse().unwrap()
    }

    #[test]
    fn reads_the_client_certificate_and_the_latest_ca_of_a_bundle() {
        let client = certificate((2027, 3, 1));
        let bundle = format!("{}{}", certificate((2030, 1, 1)), certificate((2035, 1, 1)));
        let expiry = kubeconfig_expiry(&kubeconfig(Some(&client), Some(&bundle))).unwrap();
        assert_eq!(
            expiry,
            KubeconfigExpiry {
                client: Some(at("2027-03-01")),
                ca: Some(at("2035-01-01")),
                client_ca: None,
            }
        );
        assert_eq!(
            expiry.first(),
            Some((Certificate::Client, at("2027-03-01")))
        );
        assert_eq!(expiry.expired(at("2027-02-28")), None);
        assert_eq!(
            expiry.expired(at("2027-03-01")),
            Some((Certificate::Client, at("2027-03-01")))
        );
    }

    #[test]
    fn a_token_kubeconfig_has_no_client_certificate() {
        let ca = certificate((2030, 1, 1));
        let expiry = kubeconfig_expiry(&kubeconfig(None, Some(&ca))).unwrap();
        assert_eq!(expiry.client, None);
        assert_eq!(expiry.first(), Some((Certificate::Ca, at("2030-01-01"))));
        assert_eq!(
            kubeconfig_expiry(&kubeconfig(None, None)).unwrap(),
            KubeconfigExpiry::default()
        );
    }

    #[test]
    fn unreadable_data_is_named_without_its_content() {
        let error = kubeconfig_expiry(&kubeconfig(Some("not a certificate"), None)).unwrap_err();
        assert_eq!(error, "client-certificate-data holds no certificate");
        let mut config = kubeconfig(None, None);
        config.clusters[0]
            .cluster
            .as_mut()
            .unwrap()
            .certificate_authority_data = Some("%%%".into());
        assert_eq!(
            kubeconfig_expiry(&config).unwrap_err(),
            "certificate-authority-data is not base64"
        );
        config.current_context = Some("elsewhere".into());
        assert_eq!(
            kubeconfig_expiry(&config).unwrap_err(),
            "its current context \"elsewhere\" is not defined"
        );
    }
}
