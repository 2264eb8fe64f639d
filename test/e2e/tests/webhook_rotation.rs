//! The webhook's CA rotated the documented way (the Secret emptied) under two replicas that
//! both serve the webhook: they converge on the new Secret without a restart, the caBundle is
//! written once (new CA and the replaced one together, so a replica still serving the old
//! certificate is trusted), and a new trigger is admitted throughout. Then a Secret whose
//! serving key does not match its certificate is re-issued by the same CA, with no caBundle
//! write.
//!
//! The configuration calls replica A (its URL names one port); B's certificate is checked by a
//! TLS handshake of our own, as the API server would make it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ck8s_certs_api::annotations::{REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS};
use ck8s_certs_e2e::controller::{Controller, NAMESPACE};
use ck8s_certs_e2e::controlplane::{self, AuditEvent, audited_writes};
use ck8s_certs_e2e::fixtures::NodeInfo;
use ck8s_certs_e2e::webhook::CONFIGURATION;
use ck8s_certs_e2e::{Environment, shared_of};
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;

const FILTER: &str = "webhook-rotation";
const SECRET: &str = "ck8s-certs-webhook-cert";
const CONTROLLER: &str = "system:serviceaccount:ck8s-certs-system:ck8s-certs-manager";
const TIMEOUT: Duration = Duration::from_secs(60);
/// How long writes are counted after the Secret is emptied.
const WINDOW: Duration = Duration::from_secs(30);

/// The Secret's entry `key` as text.
async fn entry(env: &Environment, key: &str) -> Option<String> {
    let secrets: Api<Secret> = Api::namespaced(env.management().await.unwrap(), NAMESPACE);
    let secret = secrets.get_opt(SECRET).await.unwrap()?;
    let value = secret.data.unwrap_or_default().get(key)?.0.clone();
    Some(String::from_utf8(value).unwrap())
}

async fn configuration(env: &Environment) -> MutatingWebhookConfiguration {
    Api::<MutatingWebhookConfiguration>::all(env.management().await.unwrap())
        .get(CONFIGURATION)
        .await
        .unwrap()
}

/// Every entry's caBundle (all entries of the test configuration are ours).
async fn bundles(env: &Environment) -> Vec<String> {
    configuration(env)
        .await
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .map(|w| {
            String::from_utf8(w.client_config.ca_bundle.unwrap_or_default().0).unwrap_or_default()
        })
        .collect()
}

/// The port replica A serves on: the one the configuration calls.
async fn configured_port(env: &Environment) -> u16 {
    let url = configuration(env).await.webhooks.unwrap()[0]
        .client_config
        .url
        .clone()
        .unwrap();
    let authority = url
        .trim_start_matches("https://")
        .split('/')
        .next()
        .unwrap();
    authority.rsplit(':').next().unwrap().parse().unwrap()
}

/// The certificate served on `port` (DER) when verified against `ca` alone, for the name the
/// API server dials (127.0.0.1), or why the handshake failed.
async fn served(port: u16, ca: &str) -> Result<Vec<u8>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    tokio::task::spawn_blocking(move || {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let name = ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
        let mut tls =
            rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let mut tcp = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(5))
            .map_err(|e| e.to_string())?;
        tcp.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        while tls.is_handshaking() {
            tls.complete_io(&mut tcp).map_err(|e| e.to_string())?;
        }
        tls.peer_certificates()
            .and_then(|chain| chain.first())
            .map(|leaf| leaf.to_vec())
            .ok_or_else(|| "no certificate served".to_owned())
    })
    .await
    .map_err(|e| e.to_string())?
}

fn der(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

/// Waits until both replicas serve the Secret's certificate, verified against its CA alone.
async fn both_serve_the_secret(env: &Environment, ports: [u16; 2], replicas: &[&Controller]) {
    let start = Instant::now();
    loop {
        let (ca, cert) = (entry(env, "ca.crt").await, entry(env, "tls.crt").await);
        let mut why = String::from("no Secret");
        if let (Some(ca), Some(cert)) = (ca, cert) {
            let mut all = true;
            for port in ports {
                match served(port, &ca).await {
                    Ok(leaf) if leaf == der(&cert) => {}
                    Ok(_) => (all, why) = (false, format!("{port}: another certificate")),
                    Err(err) => (all, why) = (false, format!("{port}: {err}")),
                }
            }
            if all {
                return;
            }
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "the replicas did not serve the Secret's certificate ({why}):\n{}",
            replicas
                .iter()
                .map(|r| r.process.log_tail(30))
                .collect::<Vec<_>>()
                .join("\n---\n")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A new trigger, every 500 ms, as a server-side dry run (it goes through the webhook, and
/// nothing is stored, so no refresh starts): what the API server answered each time.
fn keep_annotating(
    env: Arc<Environment>,
    node: NodeInfo,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Result<(), String>>> {
    tokio::spawn(async move {
        let api = env.machine_api(env.management().await.unwrap(), &node.namespace);
        let params = PatchParams {
            dry_run: true,
            field_manager: Some("kubectl-annotate".into()),
            ..Default::default()
        };
        let patch = json!({ "metadata": { "annotations": { REFRESH_CERTIFICATES: "1y" } } });
        let mut answers = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let answer = match api
                .patch(&node.machine, &params, &Patch::Merge(&patch))
                .await
            {
                // Marked in-progress: the webhook was called and answered.
                Ok(m)
                    if m.annotations()
                        .get(REFRESH_CERTIFICATES_STATUS)
                        .map(String::as_str)
                        == Some("in-progress") =>
                {
                    Ok(())
                }
                Ok(m) => Err(format!("admitted unmarked: {:?}", m.annotations())),
                Err(err) => Err(err.to_string()),
            };
            answers.push(answer);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        answers
    })
}

/// The resourceVersions the configuration goes through, as a watch sees them.
fn record_versions(
    env: Arc<Environment>,
    seen: Arc<Mutex<Vec<String>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<MutatingWebhookConfiguration> = Api::all(env.management().await.unwrap());
        let config = watcher::Config::default().fields(&format!("metadata.name={CONFIGURATION}"));
        let events = watcher(api, config);
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) = event {
                let version = c.resource_version().unwrap_or_default();
                let mut seen = seen.lock().unwrap();
                if seen.last() != Some(&version) {
                    seen.push(version);
                }
            }
        }
    })
}

/// The controller's writes since audit event `from`: (verb, resource, name, code).
fn controller_writes(env: &Environment, from: usize) -> Vec<(String, String, String, u16)> {
    audited_writes(&env.dir, "management")
        .into_iter()
        .skip(from)
        .filter(|w| w.user.username == CONTROLLER)
        .filter_map(|w: AuditEvent| {
            let code = w.code().unwrap_or(0);
            let object = w.object_ref?;
            matches!(
                object.resource.as_str(),
                "mutatingwebhookconfigurations" | "secrets"
            )
            .then(|| (w.verb, object.resource, object.name, code))
        })
        .collect()
}

fn count(writes: &[(String, String, String, u16)], verb: &str, resource: &str, ok: bool) -> usize {
    writes
        .iter()
        .filter(|(v, r, _, code)| v == verb && r == resource && (*code < 300) == ok)
        .count()
}

#[tokio::test]
async fn two_replicas_converge_on_a_rotated_ca_with_one_ca_bundle_write_and_no_refused_trigger() {
    let env = shared_of(&["alpha"]).await;
    let node = env.cluster("alpha").node("alpha-md-0-w0").clone();
    env.isolate(&node, FILTER).await;
    let a = env.start_controller_with_webhook(FILTER, &[]).await;
    let a_port = configured_port(&env).await;
    let b_port = controlplane::free_port().unwrap();
    let b_address = format!("--webhook-bind-address=127.0.0.1:{b_port}");
    let b = env.start_controller(
        FILTER,
        &["--webhook=true", &b_address, "--webhook-hosts=127.0.0.1"],
    );
    b.wait_until_ready(TIMEOUT).await;
    let ports = [a_port, b_port];
    both_serve_the_secret(&env, ports, &[&a, &b]).await;
    let old_ca = entry(&env, "ca.crt").await.unwrap();
    assert!(bundles(&env).await.iter().all(|b| *b == old_ca));

    let stop = Arc::new(AtomicBool::new(false));
    let annotating = keep_annotating(env.clone(), node.clone(), stop.clone());
    let versions = Arc::new(Mutex::new(Vec::new()));
    let recording = record_versions(env.clone(), versions.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = versions.lock().unwrap().len();
    let audit_from = audited_writes(&env.dir, "management").len();

    // The documented rotation: empty the Secret (the controller may not create one); no restart.
    let secrets: Api<Secret> = Api::namespaced(env.management().await.unwrap(), NAMESPACE);
    let emptied: json_patch::Patch =
        serde_json::from_value(json!([{ "op": "remove", "path": "/data" }])).unwrap();
    secrets
        .patch(SECRET, &PatchParams::default(), &Patch::<()>::Json(emptied))
        .await
        .unwrap();
    let deleted = Instant::now();
    let new_ca = loop {
        match entry(&env, "ca.crt").await {
            Some(ca) if ca != old_ca => break ca,
            _ => {}
        }
        assert!(deleted.elapsed() < TIMEOUT, "no new Secret");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    both_serve_the_secret(&env, ports, &[&a, &b]).await;
    let converged = deleted.elapsed();
    // Both CAs in the bundle: the new one first, the replaced one kept for a day.
    let bundle = format!("{new_ca}{old_ca}");
    assert!(
        bundles(&env).await.iter().all(|b| *b == bundle),
        "{:#?}",
        bundles(&env).await
    );
    assert_eq!(
        entry(&env, "ca.previous.crt").await.as_deref(),
        Some(old_ca.as_str())
    );
    let until: jiff::Timestamp = entry(&env, "ca.previous.until")
        .await
        .unwrap()
        .parse()
        .unwrap();
    let hours = until.duration_since(jiff::Timestamp::now()).as_hours();
    assert!((23..=24).contains(&hours), "kept for {hours}h");
    let logs = format!("{}{}", a.log(), b.log());
    assert!(
        logs.contains("the Secret is missing or empty"),
        "no reason logged"
    );

    tokio::time::sleep(WINDOW.saturating_sub(deleted.elapsed())).await;
    let rotation_versions = versions.lock().unwrap()[before..].to_vec();
    let rotation_writes = controller_writes(&env, audit_from);
    println!(
        "rotation: both replicas serve the new certificate {converged:?} after the delete; over {WINDOW:?}: configuration versions {rotation_versions:?}, controller writes {rotation_writes:?}"
    );
    assert_eq!(
        rotation_versions.len(),
        1,
        "one caBundle change: {rotation_versions:?}"
    );
    assert_eq!(
        count(
            &rotation_writes,
            "patch",
            "mutatingwebhookconfigurations",
            true
        ),
        1,
        "{rotation_writes:#?}"
    );
    // The emptied Secret is filled by one replica (the other's update, if any, is refused as
    // stale and it reads the winner's); nothing creates a Secret.
    assert_eq!(
        count(&rotation_writes, "update", "secrets", true),
        1,
        "{rotation_writes:#?}"
    );
    assert_eq!(
        count(&rotation_writes, "create", "secrets", true)
            + count(&rotation_writes, "create", "secrets", false),
        0,
        "{rotation_writes:#?}"
    );

    // A serving key that is not its certificate's: re-issued by the same CA, no bundle write.
    let audit_from = audited_writes(&env.dir, "management").len();
    let before = versions.lock().unwrap().len();
    let old_cert = entry(&env, "tls.crt").await.unwrap();
    let other_key = rcgen::KeyPair::generate().unwrap().serialize_pem();
    let tamper = json!({ "data": { "tls.key": ByteString(other_key.into_bytes()) } });
    secrets
        .patch(SECRET, &PatchParams::default(), &Patch::Merge(&tamper))
        .await
        .unwrap();
    let tampered = Instant::now();
    loop {
        if entry(&env, "tls.crt").await.is_some_and(|c| c != old_cert) {
            break;
        }
        assert!(tampered.elapsed() < TIMEOUT, "not re-issued");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    both_serve_the_secret(&env, ports, &[&a, &b]).await;
    let reissued = tampered.elapsed();
    assert_eq!(
        entry(&env, "ca.crt").await.as_deref(),
        Some(new_ca.as_str())
    );
    let logs = format!("{}{}", a.log(), b.log());
    assert!(
        logs.contains("the serving key does not match the serving certificate"),
        "no reason logged"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let reissue_writes = controller_writes(&env, audit_from);
    let reissue_versions = versions.lock().unwrap()[before..].to_vec();
    println!(
        "re-issue: both replicas serve the re-issued certificate {reissued:?} after the tampering; configuration versions {reissue_versions:?}, controller writes {reissue_writes:?}"
    );
    assert!(reissue_versions.is_empty(), "{reissue_versions:?}");
    assert_eq!(
        count(&reissue_writes, "update", "secrets", true),
        1,
        "{reissue_writes:#?}"
    );

    stop.store(true, Ordering::Relaxed);
    let answers = annotating.await.unwrap();
    recording.abort();
    let refused: Vec<&String> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    println!(
        "{} triggers admitted through the webhook, {} refused",
        answers.len() - refused.len(),
        refused.len()
    );
    assert!(answers.len() >= 60, "{} triggers", answers.len());
    assert!(refused.is_empty(), "refused: {refused:#?}");
}
