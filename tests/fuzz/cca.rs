//! A cluster's client CA Secret, `<cluster>-cca`, as `--renew-management-kubeconfig` reads it:
//! `tls.crt` through `credentials::ca_not_after` (the CA's end, shown in the status), then
//! `tls.crt` and `tls.key` through `client_certificate::issue` for a held certificate of the
//! provider's shape. Whoever may write Secrets in a cluster's namespace writes these bytes.
//!
//! An input is `tls.crt`, a NUL byte, then `tls.key`. The corpus is made at run time (rcgen; the
//! RSA one is the unit tests' fixture, the provider's PKCS#1 form): matching CA and key, a key
//! of another certificate, a leaf in the CA's place, a CA that did not sign the held
//! certificate, a bundle. Whatever is issued must chain to the `tls.crt` given, keep the held
//! certificate's subject, and end no later than the CA.

use std::sync::OnceLock;

use base64::Engine;
use ck8s_certs::workload::client_certificate::{self, Held};
use ck8s_certs::workload::credentials::ca_not_after;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::harness::Rng;
use super::mutate;

/// The unit tests' client CA and the kubeconfig certificate it signed (CN kubernetes-admin,
/// O system:masters), as the CK8s provider writes them (RSA, PKCS#1).
const CA: &str = include_str!("../../src/workload/client_certificate/cca.crt");
const CA_KEY: &str = include_str!("../../src/workload/client_certificate/cca.key");
const ADMIN: &str = include_str!("../../src/workload/client_certificate/admin.crt");
const ADMIN_KEY: &str = include_str!("../../src/workload/client_certificate/admin.key");

pub const WORDS: &[&str] = &[
    "-----BEGIN CERTIFICATE-----",
    "-----END CERTIFICATE-----",
    "-----BEGIN RSA PRIVATE KEY-----",
    "-----END RSA PRIVATE KEY-----",
    "-----BEGIN PRIVATE KEY-----",
    "-----END PRIVATE KEY-----",
    "-----BEGIN EC PRIVATE KEY-----",
    "\n",
    "\0",
    "=",
];

/// The held certificate every input is issued for (the provider's kubeconfig).
fn held() -> &'static Held {
    static HELD: OnceLock<Held> = OnceLock::new();
    HELD.get_or_init(|| {
        let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: alpha\n  cluster:\n    server: https://10.0.0.1:6443\ncontexts:\n- name: alpha-admin@alpha\n  context:\n    cluster: alpha\n    user: alpha-admin\ncurrent-context: alpha-admin@alpha\nusers:\n- name: alpha-admin\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(ADMIN),
            b64(ADMIN_KEY)
        );
        match client_certificate::held(&yaml, "alpha") {
            Ok(held) => held,
            Err(err) => panic!("the fixture kubeconfig is not held: {err}"),
        }
    })
}

fn input(crt: &str, key: &str) -> Vec<u8> {
    let mut bytes = crt.as_bytes().to_vec();
    bytes.push(0);
    bytes.extend_from_slice(key.as_bytes());
    bytes
}

/// An ECDSA CA (PKCS#8 key) of the same name as the fixture's, which did not sign the held
/// certificate, and a leaf it signed.
fn other_ca() -> (String, String, String, String) {
    let made = (|| {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "kubernetes");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key)?;
        let ca_pem = (ca.pem(), key.serialize_pem());
        let issuer = Issuer::new(params, key);
        let leaf_key = KeyPair::generate()?;
        let mut leaf = CertificateParams::default();
        leaf.distinguished_name.push(DnType::CommonName, "leaf");
        let leaf = leaf.signed_by(&leaf_key, &issuer)?;
        Ok::<_, rcgen::Error>((ca_pem.0, ca_pem.1, leaf.pem(), leaf_key.serialize_pem()))
    })();
    match made {
        Ok(made) => made,
        Err(err) => panic!("making the fuzzing CA: {err}"),
    }
}

pub fn corpus() -> Vec<Vec<u8>> {
    let (other, other_key, leaf, leaf_key) = other_ca();
    vec![
        input(CA, CA_KEY),
        input(CA, &other_key),
        input(&other, &other_key),
        input(&leaf, &leaf_key),
        input(ADMIN, ADMIN_KEY),
        input(&format!("{CA}{other}"), CA_KEY),
        input(&format!("{other}{CA}"), CA_KEY),
        input(CA, ""),
        input("", CA_KEY),
    ]
}

pub fn generate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut input = rng.pick_ref(corpus).clone();
    match rng.below(10) {
        // Whole PEM blocks swapped between inputs.
        0..=2 => {
            let other = rng.pick_ref(corpus);
            let split = |bytes: &[u8]| {
                let at = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
                (
                    bytes[..at].to_vec(),
                    bytes[(at + 1).min(bytes.len())..].to_vec(),
                )
            };
            let (crt, _) = split(&input);
            let (_, key) = split(other);
            let mut swapped = crt;
            swapped.push(0);
            swapped.extend(key);
            swapped
        }
        // The base64 inside a block changed, so that the DER under it is what varies.
        3..=6 => {
            let lines: Vec<usize> = input
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == b'\n')
                .map(|(i, _)| i)
                .collect();
            if lines.len() > 2 {
                let at = lines[1 + rng.below(lines.len() - 2)] + 1 + rng.below(60);
                if at < input.len() {
                    input[at] = *rng.pick_ref(
                        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
                    );
                }
            }
            input
        }
        _ => {
            mutate::bytes(rng, &mut input, WORDS, corpus);
            input
        }
    }
}

pub fn check(input: &[u8]) -> &'static str {
    let at = input.iter().position(|b| *b == 0).unwrap_or(input.len());
    let crt = &input[..at];
    let key = &input[(at + 1).min(input.len())..];
    let ca_end = ca_not_after(crt, "tls.crt").map(|end| end.as_second());
    let (Ok(crt), Ok(key)) = (std::str::from_utf8(crt), std::str::from_utf8(key)) else {
        return "not UTF-8";
    };
    let held = held();
    // Before the fixture CA ends (2034), after the held certificate's start.
    let now = jiff::Timestamp::from_second(1_780_000_000).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    match client_certificate::issue(held, "fleet/alpha-cca", crt, key, None, now) {
        Ok(issued) => {
            // The first certificate of `tls.crt` signs (the status shows the latest of a
            // bundle, and none when one of them cannot be read).
            let _ = ca_end;
            let signer = pem_der(crt);
            let Ok((_, signer)) = X509Certificate::from_der(&signer) else {
                panic!("issued with a tls.crt whose first certificate does not parse");
            };
            let signer_end = signer.validity().not_after.timestamp();
            assert!(
                issued.not_after.as_second() <= signer_end,
                "issued past the CA's end"
            );
            let new = pem_der(&issued.certificate_pem);
            let Ok((_, new)) = X509Certificate::from_der(&new) else {
                panic!("an issued certificate that does not parse");
            };
            let signed_by_given = x509_parser::pem::Pem::iter_from_buffer(crt.as_bytes())
                .filter_map(Result::ok)
                .filter(|block| block.label == "CERTIFICATE")
                .any(|block| {
                    X509Certificate::from_der(&block.contents)
                        .is_ok_and(|(_, ca)| new.verify_signature(Some(ca.public_key())).is_ok())
                });
            assert!(
                signed_by_given,
                "issued by something else than the tls.crt given"
            );
            let held_der = pem_der(ADMIN);
            let Ok((_, old)) = X509Certificate::from_der(&held_der) else {
                panic!("the fixture does not parse");
            };
            assert_eq!(
                new.subject().as_raw(),
                old.subject().as_raw(),
                "another subject"
            );
            "issued"
        }
        Err(refusal) => {
            let _ = refusal.to_string();
            match refusal.reason() {
                "OtherIssuer" => "refused: other issuer",
                "ClientCAEnding" => "refused: CA ending",
                "ClientCAUnusable" => "refused: CA unusable",
                _ => "refused: other",
            }
        }
    }
}

fn pem_der(pem: &str) -> Vec<u8> {
    x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes())
        .filter_map(Result::ok)
        .find(|block| block.label == "CERTIFICATE")
        .map(|block| block.contents)
        .unwrap_or_default()
}
