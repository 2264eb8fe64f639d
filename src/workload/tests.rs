use base64::Engine;
use bytes::Bytes;
use http_body_util::Full;
use k8s_openapi::ByteString;

use super::*;

/// Looks like a credential; must never reach a reason.
const SECRET: &str = "s3cr3t-VALUE-9f8e7d";

fn secret_with(kubeconfig: &str) -> Secret {
    let mut secret = Secret::default();
    secret.metadata.name = Some("alpha-kubeconfig".into());
    secret.metadata.namespace = Some("fleet".into());
    secret.data = Some(
        [(
            capi::KUBECONFIG_SECRET_KEY.to_owned(),
            ByteString(kubeconfig.as_bytes().to_vec()),
        )]
        .into(),
    );
    secret
}

fn kubeconfig_yaml(cluster: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {{ cluster: k, user: u }}\nclusters:\n- name: k\n  cluster:\n{cluster}\nusers:\n- name: u\n  user:\n{user}\n"
    )
}

const SERVER: &str = "    server: https://127.0.0.1:6443";

fn reason_of(error: WorkloadError) -> String {
    match error {
        WorkloadError::Kubeconfig {
            namespace,
            name,
            reason,
        } => {
            assert_eq!(
                (namespace.as_str(), name.as_str()),
                ("fleet", "alpha-kubeconfig")
            );
            reason
        }
        other => panic!("not a kubeconfig error: {other}"),
    }
}

#[test]
fn a_secret_looking_string_in_a_wrong_place_is_not_quoted() {
    let rows = [
        // A token where the list of users belongs.
        format!("apiVersion: v1\nusers: {SECRET}\n"),
        // A token as a mapping key where a string belongs.
        kubeconfig_yaml(SERVER, &format!("    token: {{ {SECRET}: 1 }}")),
        // A key pasted unindented into the document.
        format!(
            "{}-----BEGIN PRIVATE KEY-----\n{SECRET}\n",
            kubeconfig_yaml(SERVER, "    token: t")
        ),
        // Not YAML at all.
        format!("{{{{ {SECRET}"),
    ];
    for yaml in rows {
        let error = kubeconfig_of(&secret_with(&yaml), "fleet", Vetting::default()).unwrap_err();
        let text = error.to_string();
        assert!(
            text.starts_with("the kubeconfig in Secret fleet/alpha-kubeconfig is unusable: the value of key `value` is not a kubeconfig (YAML)"),
            "{text}"
        );
        assert!(!text.contains(SECRET), "{text}");
        assert!(!error.is_retryable());
    }
}

#[test]
fn a_refused_kubeconfig_names_the_secret_and_the_field_not_the_value() {
    let yaml = kubeconfig_yaml(
        SERVER,
        &format!("    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/{SECRET}"),
    );
    let error = kubeconfig_of(&secret_with(&yaml), "fleet", Vetting::default()).unwrap_err();
    let text = error.to_string();
    assert!(
        text.starts_with(
            "the kubeconfig in Secret fleet/alpha-kubeconfig is unusable: `tokenFile`"
        ),
        "{text}"
    );
    assert!(
        !text.contains(SECRET) && !text.contains("/var/run"),
        "{text}"
    );
    assert!(!error.is_retryable());

    let exec = kubeconfig_yaml(
        SERVER,
        &format!("    exec: {{ apiVersion: client.authentication.k8s.io/v1, command: {SECRET} }}"),
    );
    let reason =
        reason_of(kubeconfig_of(&secret_with(&exec), "fleet", Vetting::default()).unwrap_err());
    assert!(
        reason.contains("`exec`") && reason.contains("--insecure-kubeconfig-exec"),
        "{reason}"
    );
    assert!(!reason.contains(SECRET), "{reason}");
    assert!(kubeconfig_of(&secret_with(&exec), "fleet", Vetting { allow_exec: true }).is_ok());
}

fn forget_nothing() -> ForgetOnUnauthorized {
    ForgetOnUnauthorized {
        cache: Weak::new(),
        key: ("fleet".into(), "alpha".into()),
        id: 0,
    }
}

#[tokio::test]
async fn build_errors_are_fixed_reasons_without_the_kubeconfig() {
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    let pem = |label: &str| {
        b64(&format!(
            "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
            b64(SECRET)
        ))
    };
    let rows = [
        // Not base64.
        (
            format!("{SERVER}\n    certificate-authority-data: \"{SECRET}!\""),
            "    token: t".to_owned(),
            "`certificate-authority-data`",
        ),
        // Base64 of a certificate that is not one.
        (
            format!(
                "{SERVER}\n    certificate-authority-data: {}",
                pem("CERTIFICATE")
            ),
            "    token: t".to_owned(),
            "`certificate-authority-data`",
        ),
        (
            SERVER.to_owned(),
            format!(
                "    client-certificate-data: {}\n    client-key-data: {}",
                pem("CERTIFICATE"),
                pem("PRIVATE KEY")
            ),
            "client-",
        ),
        (
            SERVER.to_owned(),
            format!(
                "    client-certificate-data: \"{SECRET}!\"\n    client-key-data: {}",
                pem("PRIVATE KEY")
            ),
            "`client-certificate-data`",
        ),
    ];
    for (cluster, user, field) in rows {
        let yaml = kubeconfig_yaml(&cluster, &user);
        let kubeconfig = kubeconfig_of(&secret_with(&yaml), "fleet", Vetting::default())
            .expect("passes the vetting");
        let reason = build(kubeconfig, &forget_nothing())
            .await
            .err()
            .unwrap_or_else(|| panic!("{cluster} {user} built a client"));
        assert!(reason.contains(field), "{reason}");
        assert!(
            !reason.contains(SECRET) && !reason.contains(&b64(SECRET)),
            "{reason}"
        );
    }
}

/// A workload API server that answers every request with `status`.
struct Answer(http::StatusCode);

impl tower::Service<http::Request<kube::client::Body>> for Answer {
    type Response = http::Response<Full<Bytes>>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<kube::client::Body>) -> Self::Future {
        let body = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "no", "reason": "no", "code": self.0.as_u16(),
        });
        let mut response = http::Response::new(Full::new(Bytes::from(body.to_string())));
        *response.status_mut() = self.0;
        std::future::ready(Ok(response))
    }
}

fn clients() -> Clients {
    let management =
        kube::Client::try_from(kube::Config::new("https://127.0.0.1:1".parse().unwrap())).unwrap();
    Clients::new(management, Vetting::default())
}

/// A client of `alpha` answered `status` by its API server, cached under `id`.
fn cache_client(clients: &Clients, status: http::StatusCode, id: u64) -> Client {
    let key: Key = ("fleet".into(), "alpha".into());
    let forget = ForgetOnUnauthorized {
        cache: Arc::downgrade(&clients.cache),
        key: key.clone(),
        id,
    };
    let client = kube::client::ClientBuilder::new(Answer(status), "default")
        .with_layer(&forget)
        .build();
    clients.insert(key, "1".into(), client.clone(), id);
    client
}

fn cached_id(clients: &Clients) -> Option<u64> {
    let cache = clients.cache.lock().unwrap();
    cache.get(&("fleet".into(), "alpha".into())).map(|c| c.id)
}

#[tokio::test]
async fn a_401_forgets_the_client_that_got_it_and_nothing_else() {
    let clients = clients();
    for status in [
        http::StatusCode::FORBIDDEN,
        http::StatusCode::NOT_FOUND,
        http::StatusCode::INTERNAL_SERVER_ERROR,
    ] {
        let client = cache_client(&clients, status, 1);
        assert!(client.apiserver_version().await.is_err());
        assert_eq!(cached_id(&clients), Some(1), "{status}");
    }

    let client = cache_client(&clients, http::StatusCode::UNAUTHORIZED, 2);
    let error = client.apiserver_version().await.unwrap_err();
    assert!(matches!(error, kube::Error::Api(s) if s.code == 401));
    assert_eq!(cached_id(&clients), None);
    assert!(
        clients
            .cached(&("fleet".into(), "alpha".into()), "1")
            .is_none()
    );

    // A 401 that reaches an old client after a new one was built leaves the new one alone.
    let old = cache_client(&clients, http::StatusCode::UNAUTHORIZED, 3);
    cache_client(&clients, http::StatusCode::FORBIDDEN, 4);
    assert!(old.apiserver_version().await.is_err());
    assert_eq!(cached_id(&clients), Some(4));

    clients.forget("fleet", "alpha");
    assert_eq!(cached_id(&clients), None);
}

#[tokio::test]
async fn a_client_outliving_its_cache_does_not_keep_it() {
    let clients = clients();
    let client = cache_client(&clients, http::StatusCode::UNAUTHORIZED, 1);
    let cache = Arc::downgrade(&clients.cache);
    drop(clients);
    // The cache held the client, the client only a weak reference back.
    assert!(cache.upgrade().is_none());
    assert!(client.apiserver_version().await.is_err());
}

/// An expired server certificate is found however the TLS error is wrapped (an `io::Error`
/// hides the error it wraps from `source()`); other TLS errors are not taken for it.
#[test]
fn an_expired_server_certificate_is_found_in_the_error_chain() {
    use rustls::CertificateError;
    use rustls::pki_types::UnixTime;

    #[derive(Debug, thiserror::Error)]
    #[error("client error (Connect)")]
    struct Outer(#[source] std::io::Error);

    let not_after = UnixTime::since_unix_epoch(std::time::Duration::from_secs(1_800_000_000));
    let expired = rustls::Error::InvalidCertificate(CertificateError::ExpiredContext {
        time: UnixTime::since_unix_epoch(std::time::Duration::from_secs(1_900_000_000)),
        not_after,
    });
    let wrapped = Outer(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        expired,
    ));
    assert_eq!(
        expired_certificate(&wrapped),
        Some(Some(jiff::Timestamp::from_second(1_800_000_000).unwrap()))
    );
    let bare = rustls::Error::InvalidCertificate(CertificateError::Expired);
    assert_eq!(expired_certificate(&bare), Some(None));
    let unknown_issuer = Outer(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
    ));
    assert_eq!(expired_certificate(&unknown_issuer), None);
    let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
    assert_eq!(expired_certificate(&plain), None);
}
