//! A worker's CSRs as the workload API returns them, through `refresh::csr::check` under each of
//! the three names: whoever may create CSRs in a workload cluster writes these objects, and the
//! check parses their PEM, DER, subject and extensions before anything is approved.
//!
//! The corpus is made at run time (rcgen; no key sits in the repository): the three CSRs of a
//! genuine worker refresh, a tenant's forgery naming the API server, IPv6 and URI SANs, an
//! unsigned-looking request. Generated inputs mutate the JSON, or the request inside it (its PEM
//! text or its DER).

use base64::Engine;
use ck8s_certs::refresh::csr::{Kind, Worker, check as check_csr};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};
use serde_json::{Value, json};

use super::harness::Rng;
use super::mutate;

const LIFETIME: i64 = 31_536_000;

pub const WORDS: &[&str] = &[
    "system:node:w0",
    "system:nodes",
    "system:kube-proxy",
    "system:masters",
    "k8sd.io/kubelet-serving",
    "k8sd.io/kubelet-client",
    "k8sd.io/kube-proxy-client",
    "digital signature",
    "key encipherment",
    "server auth",
    "client auth",
    "-----BEGIN CERTIFICATE REQUEST-----",
    "-----END CERTIFICATE REQUEST-----",
    "kubernetes.default.svc",
    "10.0.0.7",
];

fn worker() -> Worker {
    Worker::new(
        "w0",
        [("InternalIP", "10.0.0.7"), ("Hostname", "w0.example")],
    )
}

fn request(cn: &str, org: Option<&str>, sans: Vec<SanType>) -> String {
    let mut params = CertificateParams::default();
    let mut subject = DistinguishedName::new();
    subject.push(DnType::CommonName, cn);
    if let Some(org) = org {
        subject.push(DnType::OrganizationName, org);
    }
    params.distinguished_name = subject;
    params.subject_alt_names = sans;
    let made = KeyPair::generate()
        .and_then(|key| params.serialize_request(&key))
        .and_then(|request| request.pem());
    match made {
        Ok(pem) => pem,
        Err(err) => panic!("making a fuzzing CSR: {err}"),
    }
}

fn object(kind: Kind, username: &str, pem: &str, usage: &str) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let signer = match kind {
        Kind::KubeletServing => "k8sd.io/kubelet-serving",
        Kind::KubeletClient => "k8sd.io/kubelet-client",
        Kind::KubeProxyClient => "k8sd.io/kube-proxy-client",
    };
    serde_json::to_vec(&json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": { "name": kind.name(7), "uid": "1c9c0f3e", "resourceVersion": "42" },
        "spec": {
            "request": b64.encode(pem),
            "signerName": signer,
            "usages": ["digital signature", "key encipherment", usage],
            "expirationSeconds": LIFETIME,
            "username": username,
            "groups": ["system:nodes", "system:authenticated"],
            "uid": "node-uid",
            "extra": { "authentication.kubernetes.io/credential-id": ["X509SHA256=ab"] }
        },
        "status": { "conditions": [{ "type": "Approved", "status": "True", "reason": "K8sdApprove",
            "lastUpdateTime": "2027-01-01T00:00:00Z" }] }
    }))
    .unwrap_or_default()
}

pub fn corpus() -> Vec<Vec<u8>> {
    let dns = |name: &str| match name.try_into() {
        Ok(name) => SanType::DnsName(name),
        Err(err) => panic!("{name}: {err}"),
    };
    let ip = |address: &str| match address.parse() {
        Ok(address) => SanType::IpAddress(address),
        Err(err) => panic!("{address}: {err}"),
    };
    let uri = match "spiffe://x/y".try_into() {
        Ok(uri) => SanType::URI(uri),
        Err(err) => panic!("a URI: {err}"),
    };
    let node = "system:node:w0";
    let serving = request(node, Some("system:nodes"), vec![dns("w0"), ip("10.0.0.7")]);
    vec![
        object(Kind::KubeletServing, node, &serving, "server auth"),
        object(
            Kind::KubeletClient,
            node,
            &request(node, Some("system:nodes"), vec![]),
            "client auth",
        ),
        object(
            Kind::KubeProxyClient,
            node,
            &request("system:kube-proxy", None, vec![]),
            "client auth",
        ),
        object(
            Kind::KubeletServing,
            "system:serviceaccount:tenant:builder",
            &request(
                node,
                Some("system:nodes"),
                vec![dns("w0"), dns("kubernetes.default.svc")],
            ),
            "server auth",
        ),
        object(
            Kind::KubeletServing,
            node,
            &request(node, Some("system:nodes"), vec![ip("fe80::1"), uri]),
            "server auth",
        ),
    ]
}

/// The request inside a CSR object, mutated as PEM text or as DER.
fn mutate_request(rng: &mut Rng, object: &[u8]) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let Ok(mut root) = serde_json::from_slice::<Value>(object) else {
        return object.to_vec();
    };
    let Some(pem) = root["spec"]["request"]
        .as_str()
        .and_then(|r| b64.decode(r).ok())
    else {
        return object.to_vec();
    };
    let mutated = match rng.chance(50) {
        true => {
            let mut text = pem;
            mutate::bytes(rng, &mut text, WORDS, &[]);
            text
        }
        false => match x509_parser::pem::parse_x509_pem(&pem) {
            Ok((_, block)) => {
                let mut der = block.contents;
                mutate::bytes(rng, &mut der, &[], &[]);
                format!(
                    "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
                    b64.encode(der)
                )
                .into_bytes()
            }
            Err(_) => pem,
        },
    };
    root["spec"]["request"] = json!(b64.encode(mutated));
    serde_json::to_vec(&root).unwrap_or_default()
}

pub fn generate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let seed = rng.pick_ref(corpus);
    match rng.below(3) {
        0 => mutate::json_bytes(rng, seed, WORDS, corpus),
        _ => mutate_request(rng, seed),
    }
}

pub fn check(input: &[u8]) -> &'static str {
    let Ok(csr) = serde_json::from_slice::<CertificateSigningRequest>(input) else {
        return "not a CSR";
    };
    let worker = worker();
    // Under every name; the tally counts how far the serving check got (the field it refused).
    let mut outcome = "passed";
    for kind in Kind::ALL {
        if let Err(mismatch) = check_csr(kind, &csr, &worker, LIFETIME) {
            // The message is built from what the tenant wrote: it must format.
            let _ = mismatch.to_string();
            if kind == Kind::KubeletServing {
                outcome = mismatch.field;
            }
        }
    }
    outcome
}
