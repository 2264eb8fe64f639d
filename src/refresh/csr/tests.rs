//! The CSR check against CSRs made as k8sd makes them (rcgen), one field wrong at a time.

use std::net::{IpAddr, Ipv4Addr};

use base64::Engine;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};

use super::*;

const TTL: i64 = 31_536_000;
const SEED: i64 = 9_007_199_254_740_993;

fn worker() -> Worker {
    Worker::new(
        "w0",
        [
            ("InternalIP", "10.0.0.7"),
            ("ExternalIP", "203.0.113.7"),
            ("Hostname", "w0.example"),
            ("InternalIP", "not-an-ip"),
            ("Unknown", "10.9.9.9"),
        ],
    )
}

/// A PEM request with this subject and these SANs, signed by a fresh key.
fn request(cn: &str, org: Option<&str>, sans: Vec<SanType>) -> Vec<u8> {
    let mut params = CertificateParams::default();
    let mut subject = DistinguishedName::new();
    subject.push(DnType::CommonName, cn);
    if let Some(org) = org {
        subject.push(DnType::OrganizationName, org);
    }
    params.distinguished_name = subject;
    params.subject_alt_names = sans;
    let key = KeyPair::generate().unwrap();
    params
        .serialize_request(&key)
        .unwrap()
        .pem()
        .unwrap()
        .into_bytes()
}

fn dns(name: &str) -> SanType {
    SanType::DnsName(name.try_into().unwrap())
}

fn ip(address: &str) -> SanType {
    SanType::IpAddress(address.parse().unwrap())
}

/// The CSR of `kind` as the worker's own `run` creates it.
fn genuine(kind: Kind) -> CertificateSigningRequest {
    let (cn, org, usage, sans) = match kind {
        Kind::KubeletServing => (
            "system:node:w0",
            Some("system:nodes"),
            "server auth",
            vec![dns("w0"), ip("10.0.0.7")],
        ),
        Kind::KubeletClient => (
            "system:node:w0",
            Some("system:nodes"),
            "client auth",
            vec![],
        ),
        Kind::KubeProxyClient => ("system:kube-proxy", None, "client auth", vec![]),
    };
    CertificateSigningRequest {
        metadata: kube::api::ObjectMeta {
            name: Some(kind.name(SEED)),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request(cn, org, sans)),
            signer_name: kind.signer().into(),
            usages: Some(vec![
                "digital signature".into(),
                "key encipherment".into(),
                usage.into(),
            ]),
            expiration_seconds: Some(TTL as i32),
            username: Some("system:node:w0".into()),
            groups: Some(vec!["system:nodes".into(), "system:authenticated".into()]),
            ..Default::default()
        },
        status: None,
    }
}

/// The check of a CSR of worker `w0`, for the usual lifetime.
fn checked(kind: Kind, csr: &CertificateSigningRequest) -> Result<(), Mismatch> {
    check(kind, csr, &worker(), TTL)
}

fn field(result: Result<(), Mismatch>) -> &'static str {
    result.expect_err("a mismatch").field
}

fn serving_with(sans: Vec<SanType>) -> CertificateSigningRequest {
    let mut csr = genuine(Kind::KubeletServing);
    csr.spec.request = ByteString(request("system:node:w0", Some("system:nodes"), sans));
    csr
}

#[test]
fn names_are_k8sds() {
    assert_eq!(
        Kind::ALL.map(|k| k.name(3)),
        [
            "k8sd-3-worker-kubelet-serving",
            "k8sd-3-worker-kubelet-client",
            "k8sd-3-worker-kube-proxy-client"
        ]
    );
}

#[test]
fn the_worker_is_its_node_name_and_the_machines_addresses() {
    let w = worker();
    assert_eq!(w.names, ["w0", "w0.example"]);
    assert_eq!(
        w.ips,
        [
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7)),
            IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7))
        ]
    );
}

#[test]
fn the_three_csrs_of_the_workers_own_run_pass() {
    for kind in Kind::ALL {
        assert_eq!(checked(kind, &genuine(kind)), Ok(()), "{kind:?}");
    }
}

#[test]
fn a_csr_not_made_by_the_node_is_refused() {
    let mut csr = genuine(Kind::KubeletServing);
    csr.spec.username = Some("system:serviceaccount:tenant:builder".into());
    let mismatch = checked(Kind::KubeletServing, &csr).unwrap_err();
    assert_eq!(
        mismatch.to_string(),
        format!(
            "CSR {}: spec.username is \"system:serviceaccount:tenant:builder\", expected \"system:node:w0\"",
            Kind::KubeletServing.name(SEED)
        )
    );
    // Another node is not this one.
    csr.spec.username = Some("system:node:w1".into());
    assert_eq!(field(checked(Kind::KubeletServing, &csr)), "spec.username");
    csr.spec.username = None;
    assert_eq!(field(checked(Kind::KubeletServing, &csr)), "spec.username");

    let mut csr = genuine(Kind::KubeletClient);
    csr.spec.groups = Some(vec!["system:authenticated".into()]);
    assert_eq!(field(checked(Kind::KubeletClient, &csr)), "spec.groups");
}

#[test]
fn signer_usages_and_lifetime_are_the_ones_of_its_name() {
    // The serving CSR's content under the client CSR's name.
    let mut csr = genuine(Kind::KubeletServing);
    csr.spec.signer_name = Kind::KubeletClient.signer().into();
    assert_eq!(
        field(checked(Kind::KubeletServing, &csr)),
        "spec.signerName"
    );

    let mut csr = genuine(Kind::KubeletClient);
    csr.spec.usages = Some(vec![
        "digital signature".into(),
        "key encipherment".into(),
        "client auth".into(),
        "server auth".into(),
    ]);
    assert_eq!(field(checked(Kind::KubeletClient, &csr)), "spec.usages");
    csr.spec.usages = Some(vec!["client auth".into()]);
    assert_eq!(field(checked(Kind::KubeletClient, &csr)), "spec.usages");
    // Order does not matter.
    csr.spec.usages = Some(vec![
        "client auth".into(),
        "key encipherment".into(),
        "digital signature".into(),
    ]);
    assert_eq!(checked(Kind::KubeletClient, &csr), Ok(()));

    let mut csr = genuine(Kind::KubeProxyClient);
    csr.spec.expiration_seconds = Some(600);
    assert_eq!(
        field(checked(Kind::KubeProxyClient, &csr)),
        "spec.expirationSeconds"
    );
    csr.spec.expiration_seconds = None;
    assert_eq!(
        field(checked(Kind::KubeProxyClient, &csr)),
        "spec.expirationSeconds"
    );
}

#[test]
fn a_request_that_is_not_one_or_not_signed_by_its_key_is_refused() {
    let mut csr = genuine(Kind::KubeletClient);
    csr.spec.request = ByteString(b"hello".to_vec());
    assert_eq!(field(checked(Kind::KubeletClient, &csr)), "spec.request");

    // A valid request with its signature's last byte changed.
    let pem = request("system:node:w0", Some("system:nodes"), vec![]);
    let (_, block) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
    let mut der = block.contents.clone();
    *der.last_mut().unwrap() ^= 0x01;
    let body = base64::engine::general_purpose::STANDARD.encode(&der);
    csr.spec.request = ByteString(
        format!("-----BEGIN CERTIFICATE REQUEST-----\n{body}\n-----END CERTIFICATE REQUEST-----\n")
            .into_bytes(),
    );
    assert_eq!(
        field(checked(Kind::KubeletClient, &csr)),
        "spec.request signature"
    );
}

#[test]
fn the_subject_is_the_nodes() {
    let with_subject = |kind: Kind, cn: &str, org: Option<&str>| {
        let mut csr = genuine(kind);
        csr.spec.request = ByteString(request(cn, org, vec![]));
        checked(kind, &csr)
    };
    assert_eq!(
        field(with_subject(
            Kind::KubeletClient,
            "system:node:w1",
            Some("system:nodes")
        )),
        "subject"
    );
    assert_eq!(
        field(with_subject(
            Kind::KubeletClient,
            "system:node:w0",
            Some("system:masters")
        )),
        "subject"
    );
    assert_eq!(
        field(with_subject(Kind::KubeletClient, "system:node:w0", None)),
        "subject"
    );
    assert_eq!(
        field(with_subject(
            Kind::KubeProxyClient,
            "system:kube-proxy",
            Some("system:masters")
        )),
        "subject"
    );
    assert_eq!(
        field(with_subject(Kind::KubeProxyClient, "system:node:w0", None)),
        "subject"
    );
    // Nothing beyond CN and O.
    let mut params = CertificateParams::default();
    let mut subject = DistinguishedName::new();
    subject.push(DnType::CommonName, "system:kube-proxy");
    subject.push(DnType::OrganizationalUnitName, "extra");
    params.distinguished_name = subject;
    let key = KeyPair::generate().unwrap();
    let mut csr = genuine(Kind::KubeProxyClient);
    csr.spec.request = ByteString(
        params
            .serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap()
            .into_bytes(),
    );
    let mismatch = checked(Kind::KubeProxyClient, &csr).unwrap_err();
    assert_eq!(mismatch.field, "subject");
    assert!(mismatch.found.contains("2.5.4.11=extra"), "{mismatch}");
}

#[test]
fn a_serving_certificate_names_only_what_the_machine_owns() {
    // The attack: the cluster's API server name on a node's CSR.
    let attack = serving_with(vec![
        dns("w0"),
        dns("kubernetes.default.svc"),
        ip("10.0.0.7"),
    ]);
    let mismatch = checked(Kind::KubeletServing, &attack).unwrap_err();
    assert_eq!(mismatch.field, "subject alternative names");
    assert_eq!(mismatch.found, "DNS:kubernetes.default.svc");
    assert_eq!(
        mismatch.wanted,
        "only the worker's own names and addresses (w0, w0.example, 10.0.0.7, 203.0.113.7)"
    );
    // Someone else's address.
    let theirs = serving_with(vec![dns("w0"), ip("10.0.0.8"), ip("::1")]);
    let mismatch = checked(Kind::KubeletServing, &theirs).unwrap_err();
    assert_eq!(mismatch.found, "IP:10.0.0.8, IP:::1");
    // A URI is nothing a node has.
    let uri = SanType::URI("spiffe://cluster/ns/x".try_into().unwrap());
    assert_eq!(
        field(checked(Kind::KubeletServing, &serving_with(vec![uri]))),
        "subject alternative names"
    );
    // Every name and address of the Machine, in any case, and none at all, pass.
    let own = vec![
        dns("W0.Example"),
        dns("w0"),
        ip("203.0.113.7"),
        ip("10.0.0.7"),
    ];
    assert_eq!(checked(Kind::KubeletServing, &serving_with(own)), Ok(()));
    assert_eq!(checked(Kind::KubeletServing, &serving_with(vec![])), Ok(()));
}

#[test]
fn a_client_certificate_names_nothing() {
    let mut csr = genuine(Kind::KubeletClient);
    csr.spec.request = ByteString(request(
        "system:node:w0",
        Some("system:nodes"),
        vec![dns("w0")],
    ));
    let mismatch = checked(Kind::KubeletClient, &csr).unwrap_err();
    assert_eq!(mismatch.field, "subject alternative names");
    assert_eq!(mismatch.wanted, "none (a client certificate)");
}
