//! The server as the API server (and anyone else who can reach the port) meets it: started on
//! 127.0.0.1:0 with a test certificate, spoken to over real TLS. Timings are short limits with
//! generous bounds on what is asserted; "does not happen" is only asserted while the limits that
//! would end it are far away.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ck8s_certs_api::annotations::REFRESH_CERTIFICATES;
use rustls::pki_types::ServerName;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::*;

/// Bounds on what must happen; far above the limits under test.
const SOON: Duration = Duration::from_secs(15);
/// A limit under test: short enough to wait out.
const SHORT: Duration = Duration::from_millis(300);

struct Server {
    address: SocketAddr,
    ca: String,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Long limits but for those a test sets.
fn relaxed() -> Limits {
    Limits {
        handshake_timeout: Duration::from_secs(60),
        header_read_timeout: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(120),
        request_timeout: Duration::from_secs(60),
        ..Limits::default()
    }
}

/// [`relaxed`] limits, but for what `set` changes.
fn relaxed_but(set: impl FnOnce(&mut Limits)) -> Limits {
    let mut limits = relaxed();
    set(&mut limits);
    limits
}

async fn start(limits: Limits) -> Server {
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let pem = Pem {
        ca: generated.cert.pem(),
        cert: generated.cert.pem(),
        key: generated.signing_key.serialize_pem(),
    };
    let certificates = Certificates::new(&pem).unwrap();
    let address: SocketAddr = "127.0.0.1:0".parse().unwrap();
    // Bind first to learn the port: serve binds the address it is given.
    let probe = std::net::TcpListener::bind(address).unwrap();
    let address = probe.local_addr().unwrap();
    drop(probe);
    let task = serve(address, certificates, Scope::default(), limits)
        .await
        .unwrap();
    Server {
        address,
        ca: pem.ca,
        task,
    }
}

fn client_config(ca: &str, versions: &[&'static rustls::SupportedProtocolVersion]) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

async fn connect_with(
    server: &Server,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(server.address).await?;
    let name = ServerName::try_from("localhost").unwrap();
    client_config(&server.ca, versions).connect(name, tcp).await
}

async fn connect(server: &Server) -> TlsStream<TcpStream> {
    connect_with(server, TLS_VERSIONS).await.unwrap()
}

/// Everything the server sends until it closes the connection (or `SOON` passes).
/// Asserts that the server closes `stream` soon, with nothing sent.
async fn assert_closed(stream: &mut (impl AsyncReadExt + Unpin)) {
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(SOON, stream.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0) | Err(_))),
        "not closed: {closed:?}"
    );
}

async fn read_all(stream: &mut (impl AsyncReadExt + Unpin)) -> String {
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    let _ = tokio::time::timeout(SOON, async {
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// The status code of an HTTP answer.
fn status(answer: &str) -> u16 {
    answer
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"))
}

fn body(answer: &str) -> &str {
    answer.split_once("\r\n\r\n").map_or("", |(_, body)| body)
}

/// A request with `Connection: close`, as raw bytes.
fn http(method: &str, path: &str, content_type: Option<&str>, body: &[u8]) -> Vec<u8> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(content_type) = content_type {
        head.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    head.push_str("\r\n");
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    request
}

/// One request on a new connection; the answer.
async fn exchange(server: &Server, request: &[u8]) -> String {
    let mut stream = connect(server).await;
    stream.write_all(request).await.unwrap();
    read_all(&mut stream).await
}

/// The review of `kubectl annotate machine m <trigger>=<ttl>`.
fn review_json(ttl: &str) -> Vec<u8> {
    let machine = |annotations: serde_json::Value| {
        json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1",
            "kind": "Machine",
            "metadata": { "name": "m", "namespace": "fleet", "annotations": annotations },
            "spec": {
                "clusterName": "c",
                "bootstrap": { "configRef": { "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "CK8sConfig", "name": "m" } }
            },
            "status": { "nodeRef": { "name": "n" } }
        })
    };
    serde_json::to_vec(&crate::admission::testing::review(
        ["cluster.x-k8s.io", "v1beta1", "Machine"],
        "machines",
        "UPDATE",
        json!({ "username": "alice" }),
        machine(json!({ REFRESH_CERTIFICATES: ttl })),
        machine(json!({})),
    ))
    .unwrap()
}

fn review_request(ttl: &str) -> Vec<u8> {
    http("POST", PATH, Some("application/json"), &review_json(ttl))
}

/// The `response` of an answered review.
fn response_of(answer: &str) -> serde_json::Value {
    assert_eq!(status(answer), 200, "{answer}");
    let review: serde_json::Value = serde_json::from_str(body(answer)).unwrap();
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(review["kind"], "AdmissionReview");
    review["response"].clone()
}

#[tokio::test]
async fn a_review_is_answered_marked_or_denied() {
    let server = start(relaxed()).await;
    let response = response_of(&exchange(&server, &review_request("1y")).await);
    assert_eq!(response["uid"], "req-1");
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    let response = response_of(&exchange(&server, &review_request("1yr")).await);
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 422);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Refusing to refresh: invalid TTL \"1yr\""),
        "{response}"
    );
}

/// The review of writing a CertificateRenewalPolicy with `spec` (`old`: the stored spec of an
/// update).
fn policy_review(
    operation: &str,
    spec: serde_json::Value,
    old: Option<serde_json::Value>,
) -> Vec<u8> {
    let review = crate::admission::testing::policy_review(operation, "nightly", "fleet", spec, old);
    http(
        "POST",
        POLICIES_PATH,
        Some("application/json"),
        &serde_json::to_vec(&review).unwrap(),
    )
}

#[tokio::test]
async fn a_policy_that_cannot_keep_its_promise_is_refused() {
    let server = start(relaxed()).await;
    let nightly = |renew_before: &str| {
        json!({
            "machineSelector": {},
            "policy": "Scheduled",
            "renewBefore": renew_before,
            "windows": [{ "daysOfWeek": ["Sunday"], "start": "02:00", "end": "03:00" }],
        })
    };
    // Weekly windows and two days to renew: none opens before the fail-safe point at worst.
    let response =
        response_of(&exchange(&server, &policy_review("CREATE", nightly("2d"), None)).await);
    assert_eq!(response["uid"], "req-1");
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 422);
    assert_eq!(response["status"]["reason"], "Invalid");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "CertificateRenewalPolicy fleet/nightly cannot keep its promise: renewBefore 2d leaves 0 attempts before the fail-safe point (expiry − 1d) in the worst case: the 3rd would start 2w6d23h14m59s after due"
        ),
        "{message}"
    );
    assert!(
        message.contains("a renewBefore of at least 1mo5d would leave 3"),
        "{message}"
    );

    // Enough time for three Sundays.
    let response =
        response_of(&exchange(&server, &policy_review("CREATE", nightly("5w"), None)).await);
    assert_eq!(response["allowed"], true, "{response}");
    assert!(response["warnings"].is_null(), "{response}");

    // Stored before the webhook: a write that keeps the spec is not judged again.
    let response = response_of(
        &exchange(
            &server,
            &policy_review("UPDATE", nightly("2d"), Some(nightly("2d"))),
        )
        .await,
    );
    assert_eq!(response["allowed"], true, "{response}");
    // Changing it is.
    let response = response_of(
        &exchange(
            &server,
            &policy_review("UPDATE", nightly("3d"), Some(nightly("2d"))),
        )
        .await,
    );
    assert_eq!(response["allowed"], false, "{response}");
}

#[tokio::test]
async fn garbage_is_answered_with_a_4xx() {
    let server = start(relaxed()).await;
    let json = Some("application/json");
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("not JSON", http("POST", PATH, json, b"hello"), 400),
        ("an empty body", http("POST", PATH, json, b""), 400),
        ("truncated JSON", http("POST", PATH, json, b"{\"kind\":"), 400),
        ("a JSON number", http("POST", PATH, json, b"42"), 422),
        (
            "another kind",
            http("POST", PATH, json, br#"{"apiVersion":"v1","kind":"Pod"}"#),
            422,
        ),
        (
            "a v1beta1 review",
            http(
                "POST",
                PATH,
                json,
                &serde_json::to_vec(&{
                    let mut review: serde_json::Value =
                        serde_json::from_slice(&review_json("1y")).unwrap();
                    review["apiVersion"] = json!("admission.k8s.io/v1beta1");
                    review
                })
                .unwrap(),
            ),
            422,
        ),
        (
            "a review without a request",
            http(
                "POST",
                PATH,
                json,
                br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
            ),
            422,
        ),
        (
            "a request that is not one",
            http(
                "POST",
                PATH,
                json,
                br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":7}}"#,
            ),
            422,
        ),
        (
            "no content type",
            http("POST", PATH, None, &review_json("1y")),
            415,
        ),
        (
            "a wrong path",
            http("POST", "/mutate-pod", json, &review_json("1y")),
            404,
        ),
        ("a wrong method", http("GET", PATH, None, b""), 405),
        ("not HTTP", b"\x00\x01hello\r\n\r\n".to_vec(), 400),
    ];
    for (what, request, expected) in cases {
        let answer = exchange(&server, &request).await;
        assert_eq!(status(&answer), expected, "{what}: {answer}");
    }
    // Still serving.
    response_of(&exchange(&server, &review_request("1y")).await);
}

#[tokio::test]
async fn an_oversize_body_is_refused_without_being_read() {
    let server = start(relaxed_but(|limits| limits.max_body_bytes = 64 * 1024)).await;
    // Declared: refused from the headers alone, though no byte of the body was sent.
    let mut stream = connect(&server).await;
    let head = format!(
        "POST {PATH} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        1024 * 1024
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let answer = read_all(&mut stream).await;
    assert_eq!(status(&answer), 413, "{answer}");
    // Chunked: cut at the limit as it is read (the connection may close before the whole body
    // is sent; it never gets a 200).
    let mut stream = connect(&server).await;
    let head = format!(
        "POST {PATH} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b' '; 16 * 1024];
    for _ in 0..8 {
        let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), &chunk, b"\r\n"].concat();
        if stream.write_all(&framed).await.is_err() {
            break;
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let answer = read_all(&mut stream).await;
    if !answer.is_empty() {
        assert_eq!(status(&answer), 413, "{answer}");
    }
    // A review under the limit still gets through.
    response_of(&exchange(&server, &review_request("1y")).await);
}

#[tokio::test]
async fn only_tls_1_2_and_1_3_are_served() {
    let server = start(relaxed()).await;
    for version in TLS_VERSIONS {
        let stream = connect_with(&server, &[*version]).await.unwrap();
        assert_eq!(stream.get_ref().1.protocol_version(), Some(version.version));
    }
    // The same ClientHello (no supported_versions extension, so its version is the legacy
    // one), as TLS 1.2 and as TLS 1.1: the first gets a ServerHello, the second an alert.
    assert_eq!(first_record(&server, 0x0303).await[..1], [0x16]);
    let refused = first_record(&server, 0x0302).await;
    assert_eq!(refused[0], 0x15, "an alert record: {refused:?}");
    assert_eq!(refused[5..], [2, 70], "fatal protocol_version: {refused:?}");
}

/// The first 7 bytes the server answers to a minimal ClientHello of `version` (ECDHE-ECDSA with
/// AES-GCM on x25519, what the test certificate's P-256 key can serve).
async fn first_record(server: &Server, version: u16) -> [u8; 7] {
    let extension = |kind: u16, data: &[u8]| {
        let mut bytes = kind.to_be_bytes().to_vec();
        bytes.extend_from_slice(&(data.len() as u16).to_be_bytes());
        bytes.extend_from_slice(data);
        bytes
    };
    let extensions = [
        extension(0x000a, &[0x00, 0x02, 0x00, 0x1d]), // supported_groups: x25519
        extension(0x000b, &[0x01, 0x00]),             // ec_point_formats: uncompressed
        extension(0x000d, &[0x00, 0x02, 0x04, 0x03]), // signature_algorithms: ecdsa_p256_sha256
        extension(0x0017, &[]),                       // extended_master_secret
    ]
    .concat();
    let mut hello = version.to_be_bytes().to_vec();
    hello.extend_from_slice(&[7; 32]);
    hello.push(0); // no session id
    hello.extend_from_slice(&[0x00, 0x02, 0xc0, 0x2b]); // ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
    hello.extend_from_slice(&[0x01, 0x00]); // null compression
    hello.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
    hello.extend_from_slice(&extensions);
    let mut handshake = vec![0x01, 0];
    handshake.extend_from_slice(&(hello.len() as u16).to_be_bytes());
    handshake.extend_from_slice(&hello);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
    record.extend_from_slice(&handshake);
    let mut tcp = TcpStream::connect(server.address).await.unwrap();
    tcp.write_all(&record).await.unwrap();
    let mut answer = [0u8; 7];
    tokio::time::timeout(SOON, tcp.read_exact(&mut answer))
        .await
        .unwrap()
        .unwrap();
    answer
}

#[tokio::test]
async fn a_client_that_sends_nothing_is_dropped() {
    let server = start(relaxed_but(|limits| {
        limits.handshake_timeout = SHORT;
        limits.header_read_timeout = SHORT;
    }))
    .await;
    // After the handshake: dropped once the headers do not come.
    let mut silent = connect(&server).await;
    assert_closed(&mut silent).await;
    // Without a handshake.
    let mut tcp = TcpStream::connect(server.address).await.unwrap();
    assert_closed(&mut tcp).await;
    // Headers that stop half-way.
    let mut slow = connect(&server).await;
    slow.write_all(b"POST /mutate-machine HTTP/1.1\r\nHost: loc")
        .await
        .unwrap();
    let answer = read_all(&mut slow).await;
    assert!(answer.is_empty() || status(&answer) == 408, "{answer}");
}

#[tokio::test]
async fn a_request_whose_body_does_not_come_times_out() {
    let server = start(relaxed_but(|limits| limits.request_timeout = SHORT)).await;
    let mut stream = connect(&server).await;
    let head = format!(
        "POST {PATH} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let answer = read_all(&mut stream).await;
    assert_eq!(status(&answer), 408, "{answer}");
}

#[tokio::test]
async fn a_connection_on_which_nothing_moves_is_closed() {
    let server = start(relaxed_but(|limits| limits.idle_timeout = SHORT)).await;
    // The handshake done, then nothing: the header timeout is a minute away.
    let mut silent = connect(&server).await;
    assert_closed(&mut silent).await;
    // A connection in use is not idle.
    response_of(&exchange(&server, &review_request("1y")).await);
}

#[tokio::test]
async fn a_slow_body_holds_no_place_where_requests_are_decided() {
    let server = start(relaxed_but(|limits| limits.max_requests = 1)).await;
    // A body on its way, for a minute if it likes: it is read before a place is taken.
    let body = review_json("1y");
    let (first, rest) = body.split_at(10);
    let mut slow = connect(&server).await;
    let head = format!(
        "POST {PATH} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    slow.write_all(first).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The only place is free for a whole request meanwhile.
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        exchange(&server, &review_request("1y")),
    )
    .await
    .expect("answered while another body was on its way");
    response_of(&answer);
    slow.write_all(rest).await.unwrap();
    response_of(&read_all(&mut slow).await);
}

#[tokio::test]
async fn a_new_connection_takes_the_place_of_the_oldest_idle_one() {
    let server = start(relaxed_but(|limits| limits.max_connections = 2)).await;
    // Two idle connections take both places; a third is served, and the oldest is closed.
    let mut first = connect(&server).await;
    let _second = connect(&server).await;
    let answer = tokio::time::timeout(SOON, exchange(&server, &review_request("1y")))
        .await
        .expect("served in an idle connection's place");
    response_of(&answer);
    assert_closed(&mut first).await;

    // One peer holds at most its share: its own oldest idle connection makes room, though
    // there are places overall.
    let server = start(relaxed_but(|limits| limits.max_connections_per_peer = 2)).await;
    let mut first = connect(&server).await;
    let _second = connect(&server).await;
    response_of(&exchange(&server, &review_request("1y")).await);
    assert_closed(&mut first).await;

    // Silent clients (no handshake, or nothing after it) are idle too: a well-behaved request
    // gets through at once however many there are.
    let server = start(relaxed_but(|limits| limits.max_connections = 2)).await;
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(TcpStream::connect(server.address).await.unwrap());
    }
    let answer = tokio::time::timeout(SOON, exchange(&server, &review_request("1y")))
        .await
        .expect("served in a silent client's place");
    response_of(&answer);
}

#[tokio::test]
async fn a_connection_is_closed_at_its_age_once_its_request_is_answered() {
    let server = start(relaxed_but(|limits| limits.max_connection_age = SHORT)).await;
    let mut kept = connect(&server).await;
    // Kept alive (no Connection: close), and used before its age.
    let mut request = review_request("1y");
    let text = String::from_utf8_lossy(&request).replace("Connection: close\r\n", "");
    request = text.into_bytes();
    kept.write_all(&request).await.unwrap();
    // Answered, then closed by the server, though every timeout is a minute away.
    let mut answer = Vec::new();
    let ended = tokio::time::timeout(SOON, kept.read_to_end(&mut answer)).await;
    assert!(ended.is_ok(), "not closed at its age");
    assert_eq!(status(&String::from_utf8_lossy(&answer)), 200);
}
