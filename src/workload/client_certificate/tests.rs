use super::*;

/// As the CK8s control-plane provider makes them (CAPI v1.9 `util/certs`, written by Go's
/// crypto/x509): an RSA client CA with a PKCS#1 key, and the kubeconfig's client certificate,
/// CN kubernetes-admin, O system:masters, NotBefore the CA's (2024-12-31T23:55Z), NotAfter
/// 2026-06-01. `other-ca.*`: an unrelated CA of the same name.
const CA: &str = include_str!("cca.crt");
const CA_KEY: &str = include_str!("cca.key");
const ADMIN: &str = include_str!("admin.crt");
const ADMIN_KEY: &str = include_str!("admin.key");
const OTHER_CA: &str = include_str!("other-ca.crt");
const OTHER_CA_KEY: &str = include_str!("other-ca.key");

const SECRET: &str = "ns/c1-cca";

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn at(text: &str) -> Timestamp {
    text.parse().unwrap()
}

/// The provider's kubeconfig of cluster `c1`, with `user` as its user's fields.
fn kubeconfig(user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c1\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority-data: {ca}\ncontexts:\n- name: c1-admin@c1\n  context:\n    cluster: c1\n    user: c1-admin\ncurrent-context: c1-admin@c1\npreferences: {{}}\nusers:\n- name: c1-admin\n  user:\n{user}",
        ca = b64(CA),
    )
}

fn provider_kubeconfig() -> String {
    kubeconfig(&format!(
        "    client-certificate-data: {}\n    client-key-data: {}\n",
        b64(ADMIN),
        b64(ADMIN_KEY)
    ))
}

fn shape_refusal(yaml: &str) -> String {
    match held(yaml, "c1") {
        Err(Refusal::Shape(reason)) => reason,
        other => panic!("expected a shape refusal, got {other:?}"),
    }
}

#[test]
fn the_provider_s_kubeconfig_is_held() {
    let held = held(&provider_kubeconfig(), "c1").unwrap();
    assert_eq!(held.user, "c1-admin");
    assert_eq!(held.not_before, at("2024-12-31T23:55:00Z"));
    assert_eq!(held.not_after, at("2026-06-01T00:00:00Z"));
}

#[test]
fn other_shapes_are_refused_with_the_reason() {
    let cert = b64(ADMIN);
    let key = b64(ADMIN_KEY);
    let cases = [
        (
            kubeconfig("    token: abc\n"),
            "authenticates with token, not with a client certificate and key alone",
        ),
        (
            kubeconfig(&format!(
                "    client-certificate-data: {cert}\n    client-key-data: {key}\n    token: abc\n"
            )),
            "authenticates with client-certificate-data, client-key-data, token",
        ),
        (
            kubeconfig(&format!("    client-certificate-data: {cert}\n")),
            "authenticates with client-certificate-data,",
        ),
        (
            kubeconfig(&format!(
                "    client-certificate-data: {cert}\n    client-key-data: {key}\n- name: other\n  user:\n    token: abc\n"
            )),
            "it has 2 users",
        ),
        (
            provider_kubeconfig().replace("name: c1-admin\n", "name: admin\n"),
            "its user is not named c1-admin",
        ),
        (
            provider_kubeconfig().replace("current-context: c1-admin@c1", "current-context: x"),
            "its current context does not use the user c1-admin",
        ),
        (
            kubeconfig(&format!(
                "    client-certificate-data: '!!'\n    client-key-data: {key}\n"
            )),
            "`client-certificate-data` is not base64",
        ),
        (
            kubeconfig(&format!(
                "    client-certificate-data: {}\n    client-key-data: {key}\n",
                b64("not a certificate")
            )),
            "holds no readable certificate",
        ),
        ("users: 7".to_owned(), "it has no `users`"),
        (
            format!(
                "{}{}",
                provider_kubeconfig(),
                "#".repeat(MAX_KUBECONFIG_BYTES)
            ),
            "KiB long, the provider's are a few KiB",
        ),
        (": : :".to_owned(), "it is not YAML"),
    ];
    for (yaml, expected) in cases {
        let reason = shape_refusal(&yaml);
        assert!(reason.contains(expected), "{reason} / {expected}");
        assert!(
            !reason.contains(&key) && !reason.contains("abc"),
            "{reason}"
        );
    }
}

#[test]
fn due_at_half_the_lifetime_at_most_half_a_year_or_renew_before() {
    let day = SignedDuration::from_hours(24);
    // The provider's certificate says it lives 17 months (NotBefore is the CA's): half a year
    // before its end, as KubeadmControlPlane renews.
    let provider = held(&provider_kubeconfig(), "c1").unwrap();
    assert_eq!(
        provider.due_at(None),
        at("2026-06-01T00:00:00Z") - PROVIDER_LIFETIME / 2
    );
    // A short-lived certificate: at half its lifetime.
    let from = at("2026-01-01T00:00:00Z");
    assert_eq!(
        due_at(from, from + day * 30, None),
        at("2026-01-16T00:00:00Z")
    );
    assert_eq!(
        due_at(from, from + day * 30, Some(day * 3)),
        at("2026-01-28T00:00:00Z")
    );
    // More than the lifetime: due from its start.
    assert_eq!(due_at(from, from + day, Some(day * 3)), from);
}

#[test]
fn a_new_certificate_has_the_same_subject_and_ca_and_a_year() {
    let held = held(&provider_kubeconfig(), "c1").unwrap();
    let now = at("2026-01-10T12:00:00Z");
    let issued = issue(&held, SECRET, CA, CA_KEY, None, now).unwrap();
    assert_eq!(issued.not_after, now + PROVIDER_LIFETIME);

    let new_der = first_certificate(issued.certificate_pem.as_bytes()).unwrap();
    let (_, new) = X509Certificate::from_der(&new_der).unwrap();
    let (_, old) = X509Certificate::from_der(&held.der).unwrap();
    let ca_der = first_certificate(CA.as_bytes()).unwrap();
    let (_, ca) = X509Certificate::from_der(&ca_der).unwrap();
    assert_eq!(new.subject().as_raw(), old.subject().as_raw());
    assert_eq!(new.issuer().as_raw(), ca.subject().as_raw());
    assert!(new.verify_signature(Some(ca.public_key())).is_ok());
    assert_eq!(
        Timestamp::from_second(new.validity().not_before.timestamp()).unwrap(),
        now - BACKDATE
    );
    let usage = new.extended_key_usage().unwrap().unwrap().value;
    assert!(usage.client_auth && !usage.server_auth);
    assert!(!new.is_ca());
    // The key is new and is the certificate's.
    let key = KeyPair::from_pem(&issued.key_pem).unwrap();
    assert_eq!(
        key.public_key_raw(),
        new.public_key().subject_public_key.data.as_ref()
    );
    assert_ne!(issued.key_pem, ADMIN_KEY);
    assert!(!format!("{issued:?}").contains("PRIVATE"));
}

#[test]
fn the_new_certificate_ends_with_its_ca() {
    let held = held(&provider_kubeconfig(), "c1").unwrap();
    // The CA ends at 2034-12-29T23:55Z (ten 365-day years from 2025-01-01).
    let now = at("2034-01-01T00:00:00Z");
    let issued = issue(&held, SECRET, CA, CA_KEY, None, now).unwrap();
    assert_eq!(issued.not_after, at("2034-12-30T00:00:00Z"));
    // Due again, and the CA has nothing longer to give: renew the CA first.
    let yaml = replaced(&provider_kubeconfig(), "c1-admin", &issued).unwrap();
    let renewed = super::held(&yaml, "c1").unwrap();
    let late = at("2034-10-01T00:00:00Z");
    assert!(renewed.due_at(None) <= late);
    assert_eq!(
        issue(&renewed, SECRET, CA, CA_KEY, None, late).unwrap_err(),
        Refusal::CaEnding {
            secret: SECRET.into(),
            at: at("2034-12-30T00:00:00Z")
        }
    );
}

#[test]
fn a_ca_that_cannot_sign_or_did_not_sign_it_is_refused() {
    let held = held(&provider_kubeconfig(), "c1").unwrap();
    let now = at("2026-01-10T12:00:00Z");
    let refusal = |ca: &str, key: &str| issue(&held, SECRET, ca, key, None, now).unwrap_err();
    assert_eq!(
        refusal(OTHER_CA, OTHER_CA_KEY),
        Refusal::OtherIssuer(SECRET.into())
    );
    let mismatch = refusal(CA, OTHER_CA_KEY).to_string();
    assert!(
        mismatch.contains("is not the key of its `tls.crt`"),
        "{mismatch}"
    );
    let not_a_ca = refusal(ADMIN, ADMIN_KEY).to_string();
    assert!(not_a_ca.contains("is not a CA certificate"), "{not_a_ca}");
    let no_key = refusal(CA, "garbage").to_string();
    assert!(
        no_key.contains("`tls.key` of ns/c1-cca is not a private key"),
        "{no_key}"
    );
    let no_cert = refusal("garbage", CA_KEY).to_string();
    assert!(no_cert.contains("holds no certificate"), "{no_cert}");
    for text in [mismatch, not_a_ca, no_key, no_cert] {
        assert!(!text.contains("PRIVATE KEY-----"), "{text}");
    }
}

#[test]
fn a_pkcs8_ca_key_signs_too() {
    // An ECDSA client CA whose key is PKCS#8, as rcgen writes it.
    let ca_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, "kubernetes");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.not_before = rcgen::date_time_ymd(2025, 1, 1);
    params.not_after = rcgen::date_time_ymd(2035, 1, 1);
    let ca = params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(params, &ca_key);
    let mut leaf = CertificateParams::default();
    leaf.distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    leaf.distinguished_name
        .push(DnType::CommonName, "kubernetes-admin");
    leaf.not_before = rcgen::date_time_ymd(2025, 1, 1);
    leaf.not_after = rcgen::date_time_ymd(2025, 2, 1);
    let leaf_key = KeyPair::generate().unwrap();
    let admin = leaf.signed_by(&leaf_key, &issuer).unwrap();
    let yaml = kubeconfig(&format!(
        "    client-certificate-data: {}\n    client-key-data: {}\n",
        b64(&admin.pem()),
        b64(&leaf_key.serialize_pem())
    ));
    let held = held(&yaml, "c1").unwrap();
    let now = at("2025-01-20T00:00:00Z");
    let issued = issue(&held, SECRET, &ca.pem(), &ca_key.serialize_pem(), None, now).unwrap();
    // Its lifetime, 31 days.
    assert_eq!(issued.not_after, now + SignedDuration::from_hours(31 * 24));
}

#[test]
fn the_kubeconfig_keeps_everything_but_the_certificate_and_key() {
    let yaml = provider_kubeconfig();
    let held = held(&yaml, "c1").unwrap();
    let now = at("2026-01-10T12:00:00Z");
    let issued = issue(&held, SECRET, CA, CA_KEY, None, now).unwrap();
    let renewed = replaced(&yaml, &held.user, &issued).unwrap();
    let before: Value = serde_yaml::from_str(&yaml).unwrap();
    let mut after: Value = serde_yaml::from_str(&renewed).unwrap();
    let user = &mut after["users"][0]["user"];
    assert_eq!(
        user["client-certificate-data"].as_str(),
        Some(b64(&issued.certificate_pem).as_str())
    );
    assert_eq!(
        user["client-key-data"].as_str(),
        Some(b64(&issued.key_pem).as_str())
    );
    user["client-certificate-data"] = before["users"][0]["user"]["client-certificate-data"].clone();
    user["client-key-data"] = before["users"][0]["user"]["client-key-data"].clone();
    assert_eq!(after, before);
    // What the next check reads.
    let again = super::held(&renewed, "c1").unwrap();
    assert_eq!(again.not_after, issued.not_after);
    assert_eq!(again.not_before, now - BACKDATE);
}

/// A certificate for `subject` (CN, O) signed by the test client CA, and its key.
fn signed_for(subject: &[(DnType, &str)]) -> (String, String) {
    let ca_key = signing_key(CA_KEY).unwrap();
    let issuer =
        Issuer::from_ca_cert_der(&first_certificate(CA.as_bytes()).unwrap().into(), ca_key)
            .unwrap();
    let mut params = CertificateParams::default();
    for (kind, value) in subject {
        params.distinguished_name.push(kind.clone(), *value);
    }
    params.not_before = rcgen::date_time_ymd(2025, 1, 1);
    params.not_after = rcgen::date_time_ymd(2026, 1, 1);
    let key = KeyPair::generate().unwrap();
    let certificate = params.signed_by(&key, &issuer).unwrap();
    (certificate.pem(), key.serialize_pem())
}

fn with_credentials(certificate: &str, key: &str) -> String {
    kubeconfig(&format!(
        "    client-certificate-data: {}\n    client-key-data: {}\n",
        b64(certificate),
        b64(key)
    ))
}

#[test]
fn a_certificate_stored_without_its_own_key_is_not_renewed() {
    // The provider's certificate (public) beside a key of the tenant's: renewing it would
    // give the tenant a working key for kubernetes-admin.
    let foreign = KeyPair::generate().unwrap().serialize_pem();
    assert_eq!(
        held(&with_credentials(ADMIN, &foreign), "c1"),
        Err(Refusal::KeyMismatch)
    );
    assert_eq!(Refusal::KeyMismatch.reason(), "KeyMismatch");
    // Another certificate's key (the CA's), and no key at all.
    assert_eq!(
        held(&with_credentials(ADMIN, CA_KEY), "c1"),
        Err(Refusal::KeyMismatch)
    );
    let unreadable = shape_refusal(&with_credentials(ADMIN, "not a key"));
    assert!(
        unreadable.contains("`client-key-data` is not a private key"),
        "{unreadable}"
    );
    // The message never quotes the key.
    assert!(!Refusal::KeyMismatch.to_string().contains("PRIVATE"));
}

#[test]
fn only_the_provider_s_identity_is_renewed() {
    let cn = |v| (DnType::CommonName, v);
    let o = |v| (DnType::OrganizationName, v);
    // Either order of the two attributes is the provider's identity.
    for subject in [
        vec![cn("kubernetes-admin"), o("system:masters")],
        vec![o("system:masters"), cn("kubernetes-admin")],
    ] {
        let (certificate, key) = signed_for(&subject);
        assert!(
            held(&with_credentials(&certificate, &key), "c1").is_ok(),
            "{subject:?}"
        );
    }
    // Anyone else the client CA may once have signed for is not.
    for subject in [
        vec![cn("alice"), o("system:masters")],
        vec![cn("kubernetes-admin")],
        vec![cn("kubernetes-admin"), o("system:masters"), o("tenants")],
        vec![
            cn("kubernetes-admin"),
            o("system:masters"),
            (DnType::OrganizationalUnitName, "x"),
        ],
        vec![cn("kubernetes-admin"), o("system:nodes")],
    ] {
        let (certificate, key) = signed_for(&subject);
        let reason = shape_refusal(&with_credentials(&certificate, &key));
        assert!(
            reason.contains("not for kubernetes-admin in system:masters"),
            "{subject:?}: {reason}"
        );
    }
}
