//! A tenant's workload API server that misbehaves fails its own cluster's refreshes and costs
//! the rest nothing.
//!
//! `<cluster>-kubeconfig` is the tenant's to write. Here two clusters' kubeconfigs point at a
//! server of the test's own (its CA in the kubeconfig, as the tenant would put it) that answers
//! every request with 200 and then either a body that never ends (`gamma`) or one byte every
//! 20 s (`trio`). Before the workload clients were bounded (`src/workload/bounded.rs`) the first
//! grew the controller's memory without end, and the second held its refresh places for as long
//! as it liked: the per-read timeout never fires on a drip.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use ck8s_certs_api::annotations::{REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS};
use ck8s_certs_api::capi;
use ck8s_certs_e2e::{Environment, shared_of};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

const FILTER: &str = "hostile";
const TIMEOUT: Duration = Duration::from_secs(180);
/// The controller's memory must stay under this however much the hostile servers send.
const RSS_LIMIT_KIB: u64 = 200 * 1024;

#[derive(Clone, Copy)]
enum Answer {
    /// A body that never ends, as fast as the client reads.
    Endless,
    /// One byte every 20 s.
    Drip,
}

/// Serves `answer` to every request over TLS on a new loopback port; returns the port and the
/// CA (PEM) a kubeconfig must name to trust it.
async fn hostile_server(answer: Answer) -> (u16, String) {
    let mut ca_params = rcgen::CertificateParams::default();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from_pem_slice(cert.pem().as_bytes()).unwrap()],
        PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap(),
    )
    .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = answer_requests(&mut tls, answer).await;
            });
        }
    });
    (port, ca.pem())
}

async fn answer_requests(
    tls: &mut (impl AsyncReadExt + AsyncWriteExt + Unpin),
    answer: Answer,
) -> std::io::Result<()> {
    // The request's head; what it asks does not matter.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if tls.read(&mut byte).await? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    tls.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    )
    .await?;
    let chunk = |data: &[u8]| {
        let mut framed = format!("{:x}\r\n", data.len()).into_bytes();
        framed.extend_from_slice(data);
        framed.extend_from_slice(b"\r\n");
        framed
    };
    tls.write_all(&chunk(br#"{"kind":"Node","metadata":{"name":""#))
        .await?;
    match answer {
        Answer::Endless => {
            let filler = chunk(&[b'x'; 64 * 1024]);
            loop {
                tls.write_all(&filler).await?;
            }
        }
        Answer::Drip => loop {
            tls.write_all(&chunk(b"x")).await?;
            tls.flush().await?;
            tokio::time::sleep(Duration::from_secs(20)).await;
        },
    }
}

/// Points `cluster`'s kubeconfig at `port`, trusting `ca`; its user stays as it was.
async fn redirect(env: &Environment, cluster: &str, port: u16, ca: &str) {
    let namespace = env.cluster(cluster).spec.namespace.clone();
    let secrets: Api<Secret> = Api::namespaced(env.management().await.unwrap(), &namespace);
    let name = capi::kubeconfig_secret_name(cluster);
    let secret = secrets.get(&name).await.unwrap();
    let data = secret.data.unwrap_or_default();
    let yaml = &data[capi::KUBECONFIG_SECRET_KEY].0;
    let mut kubeconfig: serde_yaml::Value = serde_yaml::from_slice(yaml).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(ca);
    kubeconfig["clusters"][0]["cluster"]["server"] = format!("https://127.0.0.1:{port}").into();
    kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"] = b64.into();
    let value = base64::engine::general_purpose::STANDARD
        .encode(serde_yaml::to_string(&kubeconfig).unwrap());
    secrets
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { capi::KUBECONFIG_SECRET_KEY: value } })),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn hostile_workload_api_servers_cost_the_healthy_cluster_nothing() {
    let env = shared_of(&["alpha", "gamma", "trio"]).await;
    let [healthy] = env.isolated("alpha", ["alpha-md-0-w0"], FILTER).await;
    let [endless] = env.isolated("gamma", ["alpha-md-0-w0"], FILTER).await;
    let [drip] = env.isolated("trio", ["trio-md-0-w0"], FILTER).await;
    let (port, ca) = hostile_server(Answer::Endless).await;
    redirect(&env, "gamma", port, &ca).await;
    let (port, ca) = hostile_server(Answer::Drip).await;
    redirect(&env, "trio", port, &ca).await;

    let mut controller = env.start_controller(FILTER, &[]);
    for node in [&endless, &drip, &healthy] {
        env.annotate_refresh(node, "1y").await;
    }
    // The healthy cluster's refresh completes while the others are being answered, and the
    // controller's memory stays small throughout, until both hostile clusters' calls have met
    // their bounds (a drip at 30 s per call).
    let started = Instant::now();
    let mut peak = 0;
    let mut healthy_took = None;
    let cut = |log: &str| {
        log.contains("answer is larger than 4194304 bytes")
            && log.contains("did not answer within 30s")
    };
    while started.elapsed() < TIMEOUT {
        if let Some(rss) = controller.process.rss_kib() {
            peak = peak.max(rss);
        }
        let done = env
            .machine_annotations(&healthy)
            .await
            .get(REFRESH_CERTIFICATES_STATUS)
            .is_some_and(|s| s == "done");
        if done && healthy_took.is_none() {
            healthy_took = Some(started.elapsed());
        }
        if healthy_took.is_some() && cut(&controller.log()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let healthy_took = healthy_took.expect("the healthy cluster's refresh completed");
    controller
        .process
        .check_running()
        .expect("the controller still runs");
    let log = controller.log();
    println!(
        "healthy refresh beside two hostile workload API servers: {:.1}s; controller VmRSS peak {} MiB",
        healthy_took.as_secs_f64(),
        peak / 1024
    );
    assert!(peak < RSS_LIMIT_KIB, "VmRSS peak {peak} KiB");
    let hostile: Vec<&str> = log.lines().filter(|l| l.contains("trio")).collect();
    assert!(
        log.contains("answer is larger than 4194304 bytes"),
        "the endless body was cut at the cap: {hostile:#?}"
    );
    assert!(
        log.contains("did not answer within 30s"),
        "the drip was cut at the deadline: {hostile:#?}"
    );
    // Their Machines still carry their triggers: they are retried, not forgotten.
    for node in [&endless, &drip] {
        assert!(
            env.machine_annotations(node)
                .await
                .contains_key(REFRESH_CERTIFICATES),
            "{}",
            node.machine
        );
    }
}
