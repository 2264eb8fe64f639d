//! A webhook under a flood of connections still answers, and a webhook outage refuses what
//! users ask and stops nothing the controller does by itself.
//!
//! The flood: a client holding more connections than the webhook has places (from several
//! addresses, each under the per-address cap), each kept alive with a request every second. A
//! new connection takes an idle one's place (`src/serving.rs`), so the API server's call for a
//! trigger is answered and renewals carry on.
//!
//! Every refresh writes a CertificateRefresh record before `run`. The request webhook
//! (`refresh-request.certificates.ck8s.io`, `failurePolicy: Fail`) used to intercept those
//! records too, so while no replica answered it (a crash loop, a NetworkPolicy, a client holding
//! every connection) no certificate of the fleet was renewed. Its `matchConditions` now leave the
//! controller's own creates out, and the admission policies (installed here as shipped) still
//! admit them.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ck8s_certs_api::annotations::{REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS};
use ck8s_certs_api::certificate_refresh::CertificateRefresh;
use ck8s_certs_api::machine_certificates::{Origin, Phase};
use ck8s_certs_e2e::{controlplane, shared_of, webhook};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;

const FILTER: &str = "outage";
const TIMEOUT: Duration = Duration::from_secs(90);

/// Source addresses of the flood, and connections from each: 160 in all, above the webhook's
/// 128 places, 20 from each address, under its 32 per address.
const FLOOD_SOURCES: u8 = 8;
const FLOOD_PER_SOURCE: usize = 20;

/// Holds `FLOOD_PER_SOURCE` TLS connections from each of `FLOOD_SOURCES` loopback addresses to
/// `server`, each sending a request every second, and opens a new one whenever one is closed.
async fn flood(server: SocketAddr, ca_pem: &[u8]) -> Vec<JoinHandle<()>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.expect("the CA in PEM")).expect("a CA");
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = TlsConnector::from(Arc::new(config));
    let mut holders = Vec::new();
    for source in 0..FLOOD_SOURCES {
        let source = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 10 + source));
        for _ in 0..FLOOD_PER_SOURCE {
            let connector = connector.clone();
            holders.push(tokio::spawn(async move {
                loop {
                    let _ = hold(&connector, source, server).await;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }));
        }
    }
    holders
}

/// One connection of the flood, kept alive until the server closes it.
async fn hold(connector: &TlsConnector, source: IpAddr, server: SocketAddr) -> std::io::Result<()> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    let tcp = socket.connect(server).await?;
    let name = ServerName::IpAddress(server.ip().into());
    let mut tls = connector.connect(name, tcp).await?;
    let mut buf = [0u8; 4096];
    loop {
        tls.write_all(b"GET /flood HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        if tls.read(&mut buf).await? == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test]
async fn under_a_flood_the_webhook_answers_and_while_it_is_down_only_users_are_refused() {
    let env = shared_of(&["alpha", "beta"]).await;
    let [flooded_manual, flooded_automatic] = env
        .isolated("beta", ["beta-md-0-w0", "beta-md-0-w1"], FILTER)
        .await;
    let [manual, automatic] = env
        .isolated("alpha", ["alpha-md-0-w0", "alpha-md-0-w1"], FILTER)
        .await;
    env.install_admission_policies().await;
    let _controller = env.start_controller_with_request_webhook(FILTER, &[]).await;
    let client = env.management().await.unwrap();

    // The flood, against the webhook's own address and CA.
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let configuration = configurations.get(webhook::CONFIGURATION).await.unwrap();
    let entry = configuration
        .webhooks
        .iter()
        .flatten()
        .next()
        .expect("a webhook");
    let url = entry.client_config.url.as_deref().expect("a URL");
    let address: SocketAddr = url
        .trim_start_matches("https://")
        .split('/')
        .next()
        .and_then(|a| a.parse().ok())
        .expect("a loopback address in the URL");
    let ca = entry.client_config.ca_bundle.as_ref().expect("a caBundle");
    let holders = flood(address, &ca.0).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    // A trigger is answered by the webhook (marked in-progress in the same write), and an
    // automatic renewal that falls due meanwhile completes.
    env.machine_api(client.clone(), &flooded_manual.namespace)
        .patch(
            &flooded_manual.machine,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { REFRESH_CERTIFICATES: "1y" } } })),
        )
        .await
        .expect("a trigger during the flood");
    assert_eq!(
        env.machine_annotations(&flooded_manual)
            .await
            .get(REFRESH_CERTIFICATES_STATUS)
            .map(String::as_str),
        Some("in-progress"),
        "the webhook marked the trigger"
    );
    env.create_policy_in(
        FILTER,
        &flooded_automatic.namespace,
        "flood",
        "flood",
        json!({ "policy": "Automatic", "renewBefore": "100d", "ttl": "1y" }),
    )
    .await;
    env.patch_machine(
        &flooded_automatic,
        json!({ "metadata": { "labels": { "e2e-policy": "flood" } } }),
    )
    .await;
    for node in [&flooded_manual, &flooded_automatic] {
        env.wait_for_machine(node, TIMEOUT, |a| {
            a.get(REFRESH_CERTIFICATES_STATUS).map(String::as_str) == Some("done")
        })
        .await;
    }
    for holder in holders {
        holder.abort();
    }

    // The outage: every entry of the configuration calls a port nobody listens on.
    let dead = controlplane::free_port().unwrap();
    let mut configuration = configurations.get(webhook::CONFIGURATION).await.unwrap();
    for entry in configuration.webhooks.iter_mut().flatten() {
        let url = entry.client_config.url.as_deref().expect("a URL");
        let path = url.splitn(4, '/').nth(3).unwrap_or_default();
        entry.client_config.url = Some(format!("https://127.0.0.1:{dead}/{path}"));
    }
    configurations
        .replace(webhook::CONFIGURATION, &Default::default(), &configuration)
        .await
        .unwrap();
    // The API server's webhook informer sees the change within a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A user's trigger is refused, and the API server says which webhook it could not reach.
    let refused = env
        .machine_api(client.clone(), &manual.namespace)
        .patch(
            &manual.machine,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { REFRESH_CERTIFICATES: "1y" } } })),
        )
        .await
        .expect_err("a trigger while the webhook is down");
    let message = refused.to_string();
    assert!(
        message.contains("refresh-trigger.certificates.ck8s.io"),
        "{message}"
    );
    assert!(
        !env.machine_annotations(&manual)
            .await
            .contains_key(REFRESH_CERTIFICATES),
        "nothing stored"
    );

    // An automatic renewal that falls due meanwhile is carried out: its record is created
    // without the webhook and admitted by the policies.
    env.create_policy(
        &automatic.namespace,
        "outage",
        FILTER,
        json!({ "policy": "Automatic", "renewBefore": "100d", "ttl": "1y" }),
    )
    .await;
    env.patch_machine(
        &automatic,
        json!({ "metadata": { "labels": { "e2e-policy": FILTER } } }),
    )
    .await;
    env.wait_for_machine(&automatic, TIMEOUT, |a| {
        a.get(REFRESH_CERTIFICATES_STATUS).map(String::as_str) == Some("done")
    })
    .await;
    let status = env
        .wait_for_status(&automatic, TIMEOUT, "the renewal recorded", |s| {
            s.operation
                .as_ref()
                .is_some_and(|op| op.phase == Phase::Succeeded)
        })
        .await;
    let op = status.operation.expect("an operation");
    assert_eq!(op.origin, Origin::Policy);
    let records: Api<CertificateRefresh> = Api::namespaced(client, &automatic.namespace);
    let record = records
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|r| r.spec.target.machine.as_deref() == Some(automatic.machine.as_str()))
        .expect("the renewal's record");
    // Nobody asked for it: it names no requester, and the policy that did.
    assert_eq!(record.spec.requester, None, "{record:?}");
    assert_eq!(
        record.spec.requested_by.as_deref(),
        Some("CertificateRenewalPolicy/outage")
    );
}
