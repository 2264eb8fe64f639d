//! Workload kubeconfig Secrets: the bytes of `<cluster>-kubeconfig`'s key `value`, through
//! `workload::kubeconfig_of` (UTF-8, `Kubeconfig::from_yaml`, `kubeconfig::vet` with and without
//! `--insecure-kubeconfig-exec`), then `credentials::kubeconfig_expiry` (base64, PEM and X.509
//! of the client certificate and CA), as the credentials controller and the client cache read
//! them, then, once accepted, the kube-rs client is built from it as `workload::Clients` does
//! (no connection); and as `--renew-management-kubeconfig` reads it (`client_certificate::held`,
//! then `issue` against a client CA). Whoever may write Secrets in a cluster's namespace writes
//! these bytes.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use base64::Engine;
use ck8s_certs::workload::client_certificate;
use ck8s_certs::workload::credentials::kubeconfig_expiry;
use ck8s_certs::workload::kubeconfig::vet;
use ck8s_certs::workload::{Vetting, WorkloadError, kubeconfig_of};
use ck8s_certs_api::capi::KUBECONFIG_SECRET_KEY;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::ObjectMeta;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};

use super::harness::Rng;
use super::mutate;

pub const WORDS: &[&str] = &[
    "apiVersion: v1",
    "kind: Config",
    "current-context",
    "contexts",
    "clusters",
    "users",
    "server",
    "https://10.0.0.1:6443",
    "http://",
    "certificate-authority-data",
    "certificate-authority",
    "client-certificate-data",
    "client-key-data",
    "token",
    "tokenFile",
    "exec",
    "auth-provider",
    "proxy-url",
    "as",
    "username",
    "---",
    "...",
    "&a",
    "*a",
    "<<: *a",
    "!!binary",
    "!!str",
    "!!map",
    "? ",
    "|",
    ">-",
    "%YAML 1.2",
    "-----BEGIN CERTIFICATE-----",
    "-----END CERTIFICATE-----",
    "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t",
    "====",
];

/// A PEM block of `label` around `der`, base64 again for the kubeconfig field.
fn pem_field(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    let body = b64.encode(der);
    let pem = format!("-----BEGIN {label}-----\n{body}\n-----END {label}-----\n");
    b64.encode(pem)
}

/// A throwaway client certificate and its key (base64 PEM), made at run time so that no key
/// sits in the repository.
fn identity() -> &'static (String, String) {
    static IDENTITY: OnceLock<(String, String)> = OnceLock::new();
    IDENTITY.get_or_init(|| {
        let b64 = base64::engine::general_purpose::STANDARD;
        match rcgen::generate_simple_self_signed(vec!["kubernetes-admin".to_owned()]) {
            Ok(made) => (
                b64.encode(made.cert.pem()),
                b64.encode(made.signing_key.serialize_pem()),
            ),
            Err(err) => panic!("making the fuzzing identity: {err}"),
        }
    })
}

/// A throwaway client CA (PEM certificate and key) for the renewal stage.
fn client_ca() -> &'static (String, String) {
    static CA: OnceLock<(String, String)> = OnceLock::new();
    CA.get_or_init(|| {
        let made = rcgen::KeyPair::generate().and_then(|key| {
            let mut params = rcgen::CertificateParams::new(Vec::new())?;
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            let certificate = params.self_signed(&key)?;
            Ok((certificate.pem(), key.serialize_pem()))
        });
        match made {
            Ok(made) => made,
            Err(err) => panic!("making the fuzzing client CA: {err}"),
        }
    })
}

/// `client-key-data`: the real key, its DER mutated (what the key parser sees), or anything a
/// certificate field may hold.
fn key_data(rng: &mut Rng, real: &[String]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = &identity().1;
    match rng.below(10) {
        0..=4 => key.clone(),
        5 | 6 => {
            let pem = b64.decode(key).unwrap_or_default();
            let mut der = match x509_parser::pem::parse_x509_pem(&pem) {
                Ok((_, block)) => block.contents,
                Err(_) => pem,
            };
            mutate::bytes(rng, &mut der, &[], &[]);
            pem_field(
                rng.pick(&["PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY"]),
                &der,
            )
        }
        _ => certificate_data(rng, real),
    }
}

/// The certificate fields: a real certificate of the corpus (whose base64 is mutated at times),
/// random DER, or a truncated one.
fn certificate_data(rng: &mut Rng, real: &[String]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    let real_pem = |rng: &mut Rng| b64.decode(rng.pick_ref(real)).unwrap_or_default();
    match rng.below(10) {
        0..=2 if !real.is_empty() => rng.pick_ref(real).clone(),
        // The DER inside mutated: what the X.509 parser sees.
        3..=5 if !real.is_empty() => {
            let pem = real_pem(rng);
            let mut der = match x509_parser::pem::parse_x509_pem(&pem) {
                Ok((_, block)) => block.contents,
                Err(_) => pem,
            };
            mutate::bytes(rng, &mut der, &[], &[]);
            pem_field("CERTIFICATE", &der)
        }
        6 if !real.is_empty() => {
            let mut pem = real_pem(rng);
            mutate::bytes(rng, &mut pem, &[], &[]);
            b64.encode(pem)
        }
        7 => {
            let der: Vec<u8> = (0..rng.below(600)).map(|_| rng.next() as u8).collect();
            pem_field(
                rng.pick(&["CERTIFICATE", "PRIVATE KEY", "EC PRIVATE KEY", "X"]),
                &der,
            )
        }
        8 => mutate::string(rng, WORDS),
        _ => pem_field("CERTIFICATE", &[0x30, 0x82, 0xff, 0xff, 0x30]),
    }
}

/// A kubeconfig shaped like the CK8s control-plane provider's, with fields added, removed and
/// swapped for ones the vetting refuses.
fn kubeconfig(rng: &mut Rng, real: &[String]) -> Value {
    let mut user = serde_json::Map::new();
    if rng.chance(75) {
        let (certificate, key) = match rng.chance(40) {
            // A matching pair, for the client to be built.
            true => (identity().0.clone(), key_data(rng, real)),
            false => (certificate_data(rng, real), key_data(rng, real)),
        };
        user.insert("client-certificate-data".into(), json!(certificate));
        user.insert("client-key-data".into(), json!(key));
    }
    if rng.chance(40) {
        user.insert("token".into(), json!("0123456789abcdef0123456789abcdef"));
    }
    for (key, value) in [
        (
            "tokenFile",
            json!("/var/run/secrets/kubernetes.io/serviceaccount/token"),
        ),
        ("client-certificate", json!("/etc/passwd")),
        ("client-key", json!("/etc/shadow")),
        ("username", json!("admin")),
        ("password", json!("x")),
        ("as", json!("system:admin")),
        ("as-groups", json!(["system:masters"])),
        (
            "exec",
            json!({"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/sh", "args": ["-c", "true"]}),
        ),
        ("auth-provider", json!({"name": "oidc", "config": {}})),
    ] {
        if rng.chance(2) {
            user.insert(key.into(), value);
        }
    }
    let mut cluster = serde_json::Map::new();
    cluster.insert(
        "server".into(),
        json!(match rng.chance(85) {
            true => rng.pick(&[
                "https://10.0.0.1:6443",
                "https://[fd00::1]:6443",
                "https://cp.example.com",
                "HTTPS://x",
            ]),
            false => rng.pick(&["http://10.0.0.1:6443", "https://", "//x", "", "https://a b"]),
        }),
    );
    if rng.chance(80) {
        cluster.insert(
            "certificate-authority-data".into(),
            json!(certificate_data(rng, real)),
        );
    }
    if rng.chance(2) {
        cluster.insert("certificate-authority".into(), json!("/etc/ssl/ca.pem"));
    }
    if rng.chance(2) {
        cluster.insert("proxy-url".into(), json!("http://attacker:3128"));
    }
    if rng.chance(5) {
        cluster.insert("insecure-skip-tls-verify".into(), json!(true));
    }
    let mut config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "alpha", "cluster": cluster}],
        "contexts": [{"name": "alpha-admin@alpha", "context": {"cluster": "alpha", "user": "alpha-admin"}}],
        "users": [{"name": "alpha-admin", "user": user}],
        "current-context": "alpha-admin@alpha",
        "preferences": {},
    });
    if rng.chance(10) {
        config["current-context"] = json!(rng.pick(&["nope", ""]));
    }
    config
}

/// Certificates (base64 PEM) taken from the corpus's kubeconfigs.
fn real_certificates(corpus: &[Vec<u8>]) -> Vec<String> {
    corpus
        .iter()
        .filter_map(|c| Kubeconfig::from_yaml(&String::from_utf8_lossy(c)).ok())
        .flat_map(|k| {
            let clusters = k
                .clusters
                .into_iter()
                .filter_map(|c| c.cluster?.certificate_authority_data);
            let users = k
                .auth_infos
                .into_iter()
                .filter_map(|a| a.auth_info?.client_certificate_data);
            clusters.chain(users).collect::<Vec<_>>()
        })
        .collect()
}

/// Anchors and aliases that expand to a lot, and other YAML that parsers struggle with.
fn yaml_oddity(rng: &mut Rng) -> Vec<u8> {
    match rng.below(200) {
        // Rare: serde_yaml caps the expansion, but reaching the cap takes ~100 ms a parse.
        0 => {
            // "Billion laughs": each level refers to the previous one ten times.
            let mut text = String::from(
                "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
            );
            let levels = 2 + rng.below(8);
            for level in 1..levels {
                let prev = (b'a' + (level - 1) as u8) as char;
                let name = (b'a' + level as u8) as char;
                let refs = vec![format!("*{prev}"); 9].join(",");
                text.push_str(&format!("{name}: &{name} [{refs}]\n"));
            }
            text.into_bytes()
        }
        1..=40 => b"clusters: &c [*c]\n".to_vec(),
        41..=120 => {
            // Many documents: kube-rs merges them.
            let doc = "apiVersion: v1\nkind: Config\nclusters: []\n---\n";
            doc.repeat(1 + rng.below(200)).into_bytes()
        }
        _ => mutate::deep_text(rng),
    }
}

pub fn generate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    // Parsed once: the corpus is the same for every input of a run.
    static REAL: OnceLock<Vec<String>> = OnceLock::new();
    let real = REAL.get_or_init(|| real_certificates(corpus));
    match rng.below(20) {
        0..=3 => {
            let mut input = rng.pick_ref(corpus).clone();
            mutate::bytes(rng, &mut input, WORDS, corpus);
            input
        }
        4..=12 => {
            let config = kubeconfig(rng, real);
            match rng.chance(70) {
                true => serde_yaml::to_string(&config)
                    .unwrap_or_default()
                    .into_bytes(),
                // JSON is YAML too, and some tools write kubeconfigs that way.
                false => serde_json::to_vec(&config).unwrap_or_default(),
            }
        }
        13..=15 => {
            let mut config = kubeconfig(rng, real);
            mutate::json(rng, &mut config, WORDS);
            let mut text = serde_yaml::to_string(&config)
                .unwrap_or_default()
                .into_bytes();
            if rng.chance(30) {
                mutate::bytes(rng, &mut text, WORDS, corpus);
            }
            text.truncate(mutate::MAX_INPUT);
            text
        }
        16 | 17 => yaml_oddity(rng),
        _ => {
            let seed = serde_json::to_vec(&kubeconfig(rng, real)).unwrap_or_default();
            mutate::json_bytes(rng, &seed, WORDS, corpus)
        }
    }
}

/// What `workload::Clients` does with an accepted kubeconfig, short of connecting: kube-rs reads
/// the server URL, the CA and the client certificate and key (PEM) into a rustls client. Only
/// for kubeconfigs vetted without `exec` (nothing runs, no file is read).
fn client_of(kubeconfig: Kubeconfig) -> bool {
    thread_local! {
        static RUNTIME: Option<tokio::runtime::Runtime> =
            tokio::runtime::Builder::new_current_thread().enable_all().build().ok();
    }
    RUNTIME.with(|runtime| {
        let Some(runtime) = runtime else {
            panic!("no tokio runtime for the client stage");
        };
        let _entered = runtime.enter();
        let config = runtime.block_on(kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &KubeConfigOptions::default(),
        ));
        config.is_ok_and(|config| kube::client::ClientBuilder::try_from(config).is_ok())
    })
}

pub fn check(input: &[u8]) -> &'static str {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("alpha-kubeconfig".into()),
            namespace: Some("fleet".into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            KUBECONFIG_SECRET_KEY.to_owned(),
            ByteString(input.to_vec()),
        )])),
        ..Secret::default()
    };
    let mut label = "refused";
    for vetting in [Vetting::default(), Vetting { allow_exec: true }] {
        match kubeconfig_of(&secret, "fleet", vetting) {
            Ok(kubeconfig) if !vetting.allow_exec => {
                let expiry = kubeconfig_expiry(&kubeconfig);
                label = match (expiry, client_of(kubeconfig)) {
                    (Ok(_), true) => "accepted, client built",
                    (Ok(_), false) => "accepted, client refused",
                    (Err(_), true) => "accepted, certificate unreadable, client built",
                    (Err(_), false) => "accepted, certificate unreadable",
                };
            }
            Ok(kubeconfig) => match kubeconfig_expiry(&kubeconfig) {
                Ok(expiry) => {
                    if label == "refused" {
                        label = "accepted with exec";
                    }
                    let _ = expiry.first();
                    let _ = expiry.expired(jiff::Timestamp::now());
                }
                Err(reason) => {
                    let _ = reason.len();
                }
            },
            Err(err) => {
                if matches!(err, WorkloadError::MissingKey { .. }) {
                    label = "not UTF-8 or empty";
                }
                let _ = err.to_string();
            }
        }
    }
    // Refused kubeconfigs are still read for their expiry in places; and vetting must hold up
    // on whatever parses, not only on what `kubeconfig_of` lets through.
    if let Ok(text) = std::str::from_utf8(input)
        && let Ok(kubeconfig) = Kubeconfig::from_yaml(text.trim())
    {
        let _ = vet(&kubeconfig, Vetting::default()).map_err(|e| e.to_string());
        let _ = kubeconfig_expiry(&kubeconfig);
    } else if label == "refused" {
        label = "not a kubeconfig";
    }
    // --renew-management-kubeconfig reads the same bytes for the certificate it renews.
    if let Ok(text) = std::str::from_utf8(input)
        && let Ok(held) = client_certificate::held(text, "alpha")
    {
        let _ = held.due_at(None);
        let (ca, key) = client_ca();
        let issued = client_certificate::issue(
            &held,
            "fleet/alpha-cca",
            ca,
            key,
            None,
            jiff::Timestamp::now(),
        );
        if let Ok(issued) = issued {
            let _ = client_certificate::replaced(text, &held.user, &issued);
        }
    }
    label
}
