//! What may be approved. k8sd's CAPI `approve` adds `Approved` to the three
//! `k8sd-<seed>-worker-*` CSRs **by name**, with none of the checks its own auto-approver runs,
//! and its signer then copies the SANs from the request. Whoever can create CSRs in the workload
//! cluster and learns a seed could otherwise have the cluster's CA sign a serving certificate
//! for `kubernetes.default.svc` through our `approve`. So before `approve` the controller reads
//! the seed's CSRs and checks each against what a worker's `run` creates (k8sd
//! `refreshCertsRunWorker`): made by the node itself, for the signer and usages of its name,
//! with the node's subject, SANs only from the Machine's own addresses, the lifetime asked,
//! and a request signed by the key it carries. [`check`] is that rule, pure.

use std::net::IpAddr;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::{OID_X509_COMMON_NAME, OID_X509_ORGANIZATION_NAME};
use x509_parser::prelude::{FromDer, X509CertificationRequest};

/// The group every node's client certificate carries.
const NODES_GROUP: &str = "system:nodes";

/// The three CSRs of a worker refresh, in the order k8sd names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    KubeletServing,
    KubeletClient,
    KubeProxyClient,
}

impl Kind {
    pub const ALL: [Kind; 3] = [
        Kind::KubeletServing,
        Kind::KubeletClient,
        Kind::KubeProxyClient,
    ];

    /// `k8sd-<seed>-worker-…`, as k8sd names it.
    pub fn name(self, seed: i64) -> String {
        let suffix = match self {
            Kind::KubeletServing => "kubelet-serving",
            Kind::KubeletClient => "kubelet-client",
            Kind::KubeProxyClient => "kube-proxy-client",
        };
        format!("k8sd-{seed}-worker-{suffix}")
    }

    fn signer(self) -> &'static str {
        match self {
            Kind::KubeletServing => "k8sd.io/kubelet-serving",
            Kind::KubeletClient => "k8sd.io/kubelet-client",
            Kind::KubeProxyClient => "k8sd.io/kube-proxy-client",
        }
    }

    fn usages(self) -> [&'static str; 3] {
        let purpose = match self {
            Kind::KubeletServing => "server auth",
            Kind::KubeletClient | Kind::KubeProxyClient => "client auth",
        };
        ["digital signature", "key encipherment", purpose]
    }

    /// The subject's common name and organizations.
    fn subject(self, node: &str) -> (String, Vec<&'static str>) {
        match self {
            Kind::KubeletServing | Kind::KubeletClient => {
                (format!("system:node:{node}"), vec![NODES_GROUP])
            }
            Kind::KubeProxyClient => ("system:kube-proxy".into(), Vec::new()),
        }
    }
}

/// The worker as Cluster API knows it (not as the node says it is): its Node's name and the
/// Machine's `status.addresses`, which the infrastructure provider writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Worker {
    pub node: String,
    /// DNS names a serving certificate may carry: the Node's name and the Machine's
    /// `Hostname`, `InternalDNS` and `ExternalDNS` addresses.
    pub names: Vec<String>,
    /// The Machine's `InternalIP` and `ExternalIP` addresses.
    pub ips: Vec<IpAddr>,
}

impl Worker {
    /// From the Node's name and the Machine's `status.addresses` (type, address) pairs; an
    /// address that does not parse is left out (and so not allowed).
    pub fn new<'a>(node: &str, addresses: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut worker = Worker {
            node: node.to_owned(),
            names: vec![node.to_owned()],
            ips: Vec::new(),
        };
        for (kind, address) in addresses {
            match kind {
                "InternalIP" | "ExternalIP" => worker.ips.extend(address.parse::<IpAddr>()),
                "Hostname" | "InternalDNS" | "ExternalDNS" => worker.names.push(address.to_owned()),
                _ => {}
            }
        }
        worker.names.sort();
        worker.names.dedup();
        worker
    }
}

/// Why a CSR was not approved: which CSR, which field, what it holds and what was expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("CSR {csr}: {field} is {found}, expected {wanted}")]
pub struct Mismatch {
    pub csr: String,
    pub field: &'static str,
    pub found: String,
    pub wanted: String,
}

/// Checks the CSR `csr` of `kind` against what `worker`'s own `run` asking for
/// `expiration_seconds` creates.
pub fn check(
    kind: Kind,
    csr: &CertificateSigningRequest,
    worker: &Worker,
    expiration_seconds: i64,
) -> Result<(), Mismatch> {
    let name = csr.metadata.name.clone().unwrap_or_default();
    let mismatch = |field: &'static str, found: String, wanted: String| Mismatch {
        csr: name.clone(),
        field,
        found,
        wanted,
    };
    let spec = &csr.spec;
    let requester = format!("system:node:{}", worker.node);
    let username = spec.username.as_deref().unwrap_or_default();
    if username != requester {
        return Err(mismatch(
            "spec.username",
            quoted(username),
            quoted(&requester),
        ));
    }
    let groups = spec.groups.as_deref().unwrap_or_default();
    if !groups.iter().any(|g| g == NODES_GROUP) {
        return Err(mismatch(
            "spec.groups",
            list(groups),
            format!("to include {}", quoted(NODES_GROUP)),
        ));
    }
    if spec.signer_name != kind.signer() {
        return Err(mismatch(
            "spec.signerName",
            quoted(&spec.signer_name),
            quoted(kind.signer()),
        ));
    }
    let mut usages: Vec<&str> = spec
        .usages
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(String::as_str)
        .collect();
    usages.sort_unstable();
    let mut wanted_usages = kind.usages();
    wanted_usages.sort_unstable();
    if usages != wanted_usages {
        return Err(mismatch("spec.usages", list(&usages), list(&wanted_usages)));
    }
    if spec.expiration_seconds.map(i64::from) != Some(expiration_seconds) {
        return Err(mismatch(
            "spec.expirationSeconds",
            spec.expiration_seconds
                .map_or_else(|| "unset".into(), |s| s.to_string()),
            expiration_seconds.to_string(),
        ));
    }
    check_request(kind, &spec.request.0, worker)
        .map_err(|(field, found, wanted)| mismatch(field, found, wanted))
}

/// A field, what it holds, what was expected.
type Found = (&'static str, String, String);

/// The PKCS#10 request itself: signed by its own key, the node's subject, SANs the worker owns.
fn check_request(kind: Kind, pem: &[u8], worker: &Worker) -> Result<(), Found> {
    let unreadable = |why: String| ("spec.request", why, "a PEM certificate request".into());
    let (_, block) =
        x509_parser::pem::parse_x509_pem(pem).map_err(|e| unreadable(format!("not PEM ({e})")))?;
    let (_, request) = X509CertificationRequest::from_der(&block.contents)
        .map_err(|e| unreadable(format!("not a certificate request ({e})")))?;
    request.verify_signature().map_err(|e| {
        (
            "spec.request signature",
            format!("invalid ({e})"),
            "signed by the request's own key".into(),
        )
    })?;

    let (common_name, organizations) = kind.subject(&worker.node);
    let subject = &request.certification_request_info.subject;
    let mut names = Vec::new();
    let mut orgs = Vec::new();
    let mut other = Vec::new();
    for attribute in subject.iter_attributes() {
        let value = attribute.as_str().unwrap_or("?").to_owned();
        match attribute.attr_type() {
            oid if *oid == OID_X509_COMMON_NAME => names.push(value),
            oid if *oid == OID_X509_ORGANIZATION_NAME => orgs.push(value),
            oid => other.push(format!("{oid}={value}")),
        }
    }
    orgs.sort();
    let wanted_subject = format!("CN={common_name} O={}", organizations.join(","));
    if names != [common_name.as_str()] || orgs != organizations || !other.is_empty() {
        let found = format!("CN={} O={}{}", names.join(","), orgs.join(","), {
            if other.is_empty() {
                String::new()
            } else {
                format!(" {}", other.join(" "))
            }
        });
        return Err(("subject", found, wanted_subject));
    }

    let mut sans = Vec::new();
    for extension in request.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = extension {
            sans.extend(san.general_names.iter().map(San::of));
        }
    }
    let foreign: Vec<String> = sans
        .iter()
        .filter(|san| !(kind == Kind::KubeletServing && san.owned_by(worker)))
        .map(San::to_string)
        .collect();
    if !foreign.is_empty() {
        let wanted = match kind {
            Kind::KubeletServing => format!(
                "only the worker's own names and addresses ({})",
                worker
                    .names
                    .iter()
                    .cloned()
                    .chain(worker.ips.iter().map(IpAddr::to_string))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            _ => "none (a client certificate)".into(),
        };
        return Err(("subject alternative names", foreign.join(", "), wanted));
    }
    Ok(())
}

/// One subject alternative name.
enum San {
    Dns(String),
    Ip(Option<IpAddr>),
    Other(String),
}

impl San {
    fn of(name: &GeneralName<'_>) -> Self {
        match name {
            GeneralName::DNSName(dns) => San::Dns((*dns).to_owned()),
            GeneralName::IPAddress(bytes) => San::Ip(match bytes.len() {
                4 => <[u8; 4]>::try_from(*bytes).ok().map(IpAddr::from),
                16 => <[u8; 16]>::try_from(*bytes).ok().map(IpAddr::from),
                _ => None,
            }),
            other => San::Other(other.to_string()),
        }
    }

    fn owned_by(&self, worker: &Worker) -> bool {
        match self {
            // DNS names compare without case (RFC 4343), as TLS clients match them.
            San::Dns(dns) => worker.names.iter().any(|n| n.eq_ignore_ascii_case(dns)),
            San::Ip(Some(ip)) => worker.ips.contains(ip),
            San::Ip(None) | San::Other(_) => false,
        }
    }
}

impl std::fmt::Display for San {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            San::Dns(dns) => write!(f, "DNS:{}", crate::text::truncate(dns.clone(), 100)),
            San::Ip(Some(ip)) => write!(f, "IP:{ip}"),
            San::Ip(None) => f.write_str("IP:<malformed>"),
            San::Other(other) => f.write_str(&crate::text::truncate(other.clone(), 100)),
        }
    }
}

fn quoted(text: &str) -> String {
    format!("{:?}", crate::text::truncate(text.to_owned(), 200))
}

fn list<S: AsRef<str>>(items: &[S]) -> String {
    let items: Vec<String> = items.iter().map(|s| quoted(s.as_ref())).collect();
    format!("[{}]", items.join(", "))
}

#[cfg(test)]
mod tests;
