use super::*;

/// What the CK8s control-plane provider writes (client certificate) plus a token, and a second,
/// unused context whose entries use everything that is refused.
const BASE: &str = r#"
apiVersion: v1
kind: Config
current-context: admin@alpha
contexts:
- name: admin@alpha
  context: { cluster: alpha, user: admin }
- name: other
  context: { cluster: elsewhere, user: plugin }
clusters:
- name: alpha
  cluster:
    server: https://10.0.0.1:6443
    certificate-authority-data: Q0EK
- name: elsewhere
  cluster:
    server: http://attacker.example.com
    certificate-authority: /etc/ca.crt
    proxy-url: http://proxy.example.com
users:
- name: admin
  user:
    client-certificate-data: Q0VSVAo=
    client-key-data: S0VZCg==
- name: plugin
  user:
    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
    exec: { apiVersion: client.authentication.k8s.io/v1, command: /bin/sh }
"#;

fn base() -> serde_yaml::Value {
    serde_yaml::from_str(BASE).unwrap()
}

fn kubeconfig(value: &serde_yaml::Value) -> Kubeconfig {
    Kubeconfig::from_yaml(&serde_yaml::to_string(value).unwrap()).unwrap()
}

fn user(value: &mut serde_yaml::Value) -> &mut serde_yaml::Value {
    &mut value["users"][0]["user"]
}

fn cluster(value: &mut serde_yaml::Value) -> &mut serde_yaml::Value {
    &mut value["clusters"][0]["cluster"]
}

fn remove(map: &mut serde_yaml::Value, key: &str) {
    map.as_mapping_mut().unwrap().remove(key);
}

fn vet_with(value: &serde_yaml::Value, vetting: Vetting) -> Result<(), Vec<Refusal>> {
    vet(&kubeconfig(value), vetting).map_err(|Refused(r)| r)
}

fn vet_default(value: &serde_yaml::Value) -> Result<(), Vec<Refusal>> {
    vet_with(value, Vetting::default())
}

#[test]
fn inline_credentials_are_accepted_and_other_contexts_do_not_matter() {
    assert_eq!(vet_default(&base()), Ok(()));

    let mut token = base();
    remove(user(&mut token), "client-certificate-data");
    remove(user(&mut token), "client-key-data");
    user(&mut token)["token"] = "abc".into();
    assert_eq!(vet_default(&token), Ok(()));

    // Both, as the e2e kubeconfigs have: fine.
    let mut both = base();
    user(&mut both)["token"] = "abc".into();
    assert_eq!(vet_default(&both), Ok(()));

    // No CA: the system roots; insecure-skip-tls-verify, tls-server-name and the like only
    // concern trust in the tenant's own server.
    let mut no_ca = base();
    remove(cluster(&mut no_ca), "certificate-authority-data");
    cluster(&mut no_ca)["tls-server-name"] = "alpha.internal".into();
    cluster(&mut no_ca)["insecure-skip-tls-verify"] = true.into();
    assert_eq!(vet_default(&no_ca), Ok(()));

    // A path in the URL (an API server behind a gateway), upper-case scheme.
    let mut path = base();
    cluster(&mut path)["server"] = "HTTPS://gateway.example.com/k8s/clusters/c-1".into();
    assert_eq!(vet_default(&path), Ok(()));
}

#[test]
fn each_refused_user_field_is_named() {
    let rows: &[(&str, serde_yaml::Value, Refusal)] = &[
        (
            "exec",
            serde_yaml::from_str("{ apiVersion: client.authentication.k8s.io/v1, command: cat }")
                .unwrap(),
            Refusal::Exec,
        ),
        (
            "auth-provider",
            serde_yaml::from_str("{ name: oidc, config: { id-token: x } }").unwrap(),
            Refusal::AuthProvider,
        ),
        (
            "tokenFile",
            "/var/run/secrets/kubernetes.io/serviceaccount/token".into(),
            Refusal::TokenFile,
        ),
        (
            "client-certificate",
            "/etc/tls.crt".into(),
            Refusal::ClientCertificateFile,
        ),
        ("client-key", "/etc/tls.key".into(), Refusal::ClientKeyFile),
        ("username", "admin".into(), Refusal::BasicAuth("username")),
        ("password", "hunter2".into(), Refusal::BasicAuth("password")),
        ("as", "system:admin".into(), Refusal::Impersonation("as")),
        ("as-uid", "0".into(), Refusal::Impersonation("as-uid")),
        (
            "as-groups",
            serde_yaml::from_str("[system:masters]").unwrap(),
            Refusal::Impersonation("as-groups"),
        ),
        (
            "as-user-extra",
            serde_yaml::from_str("{ scopes: [all] }").unwrap(),
            Refusal::Impersonation("as-user-extra"),
        ),
    ];
    for (field, value, refusal) in rows {
        let mut config = base();
        user(&mut config)[*field] = value.clone();
        assert_eq!(vet_default(&config), Err(vec![refusal.clone()]), "{field}");
        let reason = refusal.to_string();
        assert!(reason.contains(&format!("`{field}`")), "{reason}");
    }
}

#[test]
fn each_refused_cluster_field_is_named() {
    let rows: &[(&str, &str, Refusal)] = &[
        (
            "certificate-authority",
            "/etc/ca.crt",
            Refusal::CertificateAuthorityFile,
        ),
        ("proxy-url", "http://proxy.example.com", Refusal::ProxyUrl),
    ];
    for (field, value, refusal) in rows {
        let mut config = base();
        cluster(&mut config)[*field] = (*value).into();
        assert_eq!(vet_default(&config), Err(vec![refusal.clone()]), "{field}");
        assert!(refusal.to_string().contains(&format!("`{field}`")));
    }
}

#[test]
fn the_server_must_be_an_https_url() {
    for bad in [
        "http://10.0.0.1:6443",
        "10.0.0.1:6443",
        "unix:///var/run/k8s.sock",
        "https://",
        "not a url",
    ] {
        let mut config = base();
        cluster(&mut config)["server"] = bad.into();
        assert_eq!(
            vet_default(&config),
            Err(vec![Refusal::ServerNotHttps]),
            "{bad}"
        );
    }
    for missing in [None, Some("")] {
        let mut config = base();
        match missing {
            None => remove(cluster(&mut config), "server"),
            Some(empty) => cluster(&mut config)["server"] = empty.into(),
        }
        assert_eq!(vet_default(&config), Err(vec![Refusal::NoServer]));
    }
}

#[test]
fn the_current_context_must_resolve() {
    let mut none = base();
    remove(&mut none, "current-context");
    assert_eq!(vet_default(&none), Err(vec![Refusal::NoCurrentContext]));

    let mut unknown = base();
    unknown["current-context"] = "nowhere".into();
    assert_eq!(vet_default(&unknown), Err(vec![Refusal::UnknownContext]));

    let mut no_cluster = base();
    no_cluster["contexts"][0]["context"]["cluster"] = "nowhere".into();
    assert_eq!(vet_default(&no_cluster), Err(vec![Refusal::UnknownCluster]));

    let mut no_user = base();
    remove(&mut no_user["contexts"][0]["context"], "user");
    assert_eq!(vet_default(&no_user), Err(vec![Refusal::NoUser]));

    let mut unknown_user = base();
    unknown_user["contexts"][0]["context"]["user"] = "nobody".into();
    assert_eq!(vet_default(&unknown_user), Err(vec![Refusal::UnknownUser]));
}

#[test]
fn switching_to_a_refused_context_names_all_its_problems() {
    let mut other = base();
    other["current-context"] = "other".into();
    assert_eq!(
        vet_default(&other),
        Err(vec![
            Refusal::ServerNotHttps,
            Refusal::CertificateAuthorityFile,
            Refusal::ProxyUrl,
            Refusal::Exec,
            Refusal::TokenFile,
        ])
    );
    let reason = vet(&kubeconfig(&other), Vetting::default())
        .unwrap_err()
        .to_string();
    for field in [
        "`server`",
        "`certificate-authority`",
        "`proxy-url`",
        "`exec`",
        "`tokenFile`",
    ] {
        assert!(reason.contains(field), "{reason}");
    }
}

#[test]
fn credentials_must_be_complete() {
    let mut no_key = base();
    remove(user(&mut no_key), "client-key-data");
    assert_eq!(
        vet_default(&no_key),
        Err(vec![Refusal::CertificateWithoutKey])
    );

    let mut no_certificate = base();
    remove(user(&mut no_certificate), "client-certificate-data");
    assert_eq!(
        vet_default(&no_certificate),
        Err(vec![Refusal::KeyWithoutCertificate])
    );

    let mut nothing = base();
    nothing["users"][0]["user"] = serde_yaml::from_str("{}").unwrap();
    assert_eq!(vet_default(&nothing), Err(vec![Refusal::NoCredentials]));

    // A user entry without `user`: kube-rs would go on anonymously.
    let mut bare = base();
    remove(&mut bare["users"][0], "user");
    assert_eq!(vet_default(&bare), Err(vec![Refusal::UnknownUser]));

    // A refused source is reported alone, not also "no credentials".
    let mut file = base();
    file["users"][0]["user"] = serde_yaml::from_str("{ tokenFile: /t }").unwrap();
    assert_eq!(vet_default(&file), Err(vec![Refusal::TokenFile]));
}

#[test]
fn insecure_kubeconfig_exec_allows_exec_and_nothing_else() {
    let allow = Vetting { allow_exec: true };
    let mut exec = base();
    exec["users"][0]["user"] = serde_yaml::from_str(
        "{ exec: { apiVersion: client.authentication.k8s.io/v1, command: aws-iam-authenticator } }",
    )
    .unwrap();
    assert_eq!(vet_with(&exec, allow), Ok(()));
    assert_eq!(vet_default(&exec), Err(vec![Refusal::Exec]));

    let mut exec_and_file = exec.clone();
    user(&mut exec_and_file)["tokenFile"] = "/t".into();
    assert_eq!(
        vet_with(&exec_and_file, allow),
        Err(vec![Refusal::TokenFile])
    );

    let mut provider = base();
    user(&mut provider)["auth-provider"] = serde_yaml::from_str("{ name: gcp }").unwrap();
    assert_eq!(vet_with(&provider, allow), Err(vec![Refusal::AuthProvider]));

    let mut proxy = exec.clone();
    cluster(&mut proxy)["proxy-url"] = "http://p".into();
    assert_eq!(vet_with(&proxy, allow), Err(vec![Refusal::ProxyUrl]));
}

#[test]
fn duplicate_names_resolve_to_the_first_entry_as_in_kube() {
    let mut config = base();
    let users = config["users"].as_sequence_mut().unwrap();
    let evil: serde_yaml::Value =
        serde_yaml::from_str("{ name: admin, user: { tokenFile: /t } }").unwrap();
    users.insert(0, evil);
    assert_eq!(vet_default(&config), Err(vec![Refusal::TokenFile]));
}

#[test]
fn several_documents_are_vetted_as_kube_merges_them() {
    // kube-rs merges the documents, the first definition of a name winning.
    let yaml = format!(
        "{}---\nusers:\n- name: admin\n  user: {{ tokenFile: /t }}\n",
        serde_yaml::to_string(&base()).unwrap()
    );
    let merged = Kubeconfig::from_yaml(&yaml).unwrap();
    assert!(vet(&merged, Vetting::default()).is_ok());

    let mut first = base();
    remove(&mut first, "users");
    let yaml = format!(
        "{}---\nusers:\n- name: admin\n  user: {{ tokenFile: /t }}\n",
        serde_yaml::to_string(&first).unwrap()
    );
    let merged = Kubeconfig::from_yaml(&yaml).unwrap();
    assert_eq!(
        vet(&merged, Vetting::default()),
        Err(Refused(vec![Refusal::TokenFile]))
    );
}

#[test]
fn no_reason_quotes_a_value() {
    let secret = "s3cr3t-VALUE-9f8e7d";
    let mut config = base();
    config["current-context"] = "other".into();
    for field in [
        "tokenFile",
        "username",
        "password",
        "as",
        "client-certificate",
    ] {
        config["users"][1]["user"][field] = secret.into();
    }
    config["clusters"][1]["cluster"]["server"] = format!("http://{secret}").into();
    config["clusters"][1]["cluster"]["proxy-url"] = format!("http://{secret}").into();
    config["clusters"][1]["cluster"]["certificate-authority"] = secret.into();
    let reason = vet(&kubeconfig(&config), Vetting::default())
        .unwrap_err()
        .to_string();
    assert!(!reason.contains(secret), "{reason}");
    assert!(!reason.contains("/bin/sh"), "{reason}");
    assert!(!reason.contains("attacker"), "{reason}");
}

#[test]
fn a_parse_error_names_the_place_not_the_text() {
    let secret = "s3cr3t-VALUE-9f8e7d";
    let rows = [
        // A token where a list belongs.
        format!("users: {secret}\n"),
        // A mapping where a string belongs.
        format!("users:\n- name: admin\n  user:\n    token: {{ {secret}: 1 }}\n"),
        // Broken YAML.
        format!("clusters:\n- name: [\n  token: {secret}\n"),
        format!("\"{secret}"),
    ];
    for yaml in rows {
        let error = Kubeconfig::from_yaml(&yaml).unwrap_err();
        // The parser's own text quotes the input: that is why it is not used.
        let reason = parse_error_reason(&error);
        assert!(!reason.contains(secret), "{reason}");
        assert!(reason.starts_with("the value of key `value` is not a kubeconfig (YAML)"));
        assert!(reason.contains("line "), "{reason}");
    }
}
