//! Kubeconfigs of the CK8s control-plane provider's shape for the kubeconfig renewal tests
//! (`kubeconfig_expiry.rs`, and `release.rs`, which installs the renewal as the docs say): a
//! client certificate signed by the CA the workload API servers trust for clients, which a
//! `<cluster>-cca` Secret holds as the provider's would.

use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::Environment;

/// A client certificate of the environment's CA (the workload API servers' `--client-ca-file`),
/// as the CK8s control-plane provider issues it, valid from `not_before` to `not_after`.
pub fn provider_certificate(
    env: &Environment,
    not_before: jiff::Timestamp,
    not_after: jiff::Timestamp,
) -> (String, String) {
    let ca_pem = std::fs::read_to_string(env.dir.join("ca.crt")).expect("the environment's CA");
    let ca_key = rcgen::KeyPair::from_pem(
        &std::fs::read_to_string(env.dir.join("ca.key")).expect("the environment's CA key"),
    )
    .expect("a CA key");
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key).expect("a CA");
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:masters");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kubernetes-admin");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let offset = |at: jiff::Timestamp| {
        time::OffsetDateTime::from_unix_timestamp(at.as_second()).expect("a date")
    };
    params.not_before = offset(not_before);
    params.not_after = offset(not_after);
    let key = rcgen::KeyPair::generate().expect("a key");
    let certificate = params.signed_by(&key, &issuer).expect("a certificate");
    (certificate.pem(), key.serialize_pem())
}

/// `yaml` whose only user authenticates with `cert` and `key` alone.
pub fn with_client_certificate(yaml: &str, cert: &str, key: &str) -> String {
    let mut kubeconfig: serde_yaml::Value = serde_yaml::from_str(yaml).expect("a kubeconfig");
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    kubeconfig["users"][0]["user"] = serde_yaml::to_value(json!({
        "client-certificate-data": b64(cert),
        "client-key-data": b64(key),
    }))
    .expect("YAML");
    serde_yaml::to_string(&kubeconfig).expect("YAML")
}

/// Who the workload API server takes the kubeconfig `file` for (`kubectl auth whoami`); panics
/// with kubectl's error when it is refused.
pub fn whoami(file: &std::path::Path) -> String {
    let output =
        std::process::Command::new(crate::tool("CK8S_E2E_KUBECTL", "kubectl", "KUBE_VERSION"))
            .arg("--kubeconfig")
            .arg(file)
            .args([
                "auth",
                "whoami",
                "-o",
                "jsonpath={.status.userInfo.username}",
            ])
            .output()
            .expect("kubectl");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

impl Environment {
    /// Replaces the kubeconfig in `<cluster>-kubeconfig` (namespace fleet) with `yaml`.
    pub async fn write_kubeconfig(&self, cluster: &str, yaml: &str) {
        let secrets: Api<Secret> =
            Api::namespaced(self.management().await.expect("a client"), "fleet");
        secrets
            .patch(
                &format!("{cluster}-kubeconfig"),
                &PatchParams::default(),
                &Patch::Merge(json!({ "stringData": { "value": yaml } })),
            )
            .await
            .expect("patch the kubeconfig Secret");
    }

    /// Gives `cluster` (namespace fleet) a kubeconfig whose client certificate, of the client CA
    /// it gets as `<cluster>-cca`, has 100 of its 300 days left (due); returns the kubeconfig
    /// and the certificate.
    pub async fn make_kubeconfig_due(&self, cluster: &str) -> (String, String) {
        let secrets: Api<Secret> =
            Api::namespaced(self.management().await.expect("a client"), "fleet");
        let now = jiff::Timestamp::now();
        let day = jiff::SignedDuration::from_hours(24);
        let whole = |at: jiff::Timestamp| {
            jiff::Timestamp::from_second(at.as_second()).expect("a timestamp")
        };
        let (cert, key) =
            provider_certificate(self, whole(now - day * 200), whole(now + day * 100));
        let yaml = with_client_certificate(&self.cluster(cluster).kubeconfig_yaml, &cert, &key);
        self.write_kubeconfig(cluster, &yaml).await;
        let ca = |file: &str| std::fs::read_to_string(self.dir.join(file)).expect("the CA");
        secrets
            .create(
                &Default::default(),
                &serde_json::from_value(json!({
                    "metadata": {
                        "name": format!("{cluster}-cca"),
                        "labels": { "cluster.x-k8s.io/cluster-name": cluster }
                    },
                    "stringData": { "tls.crt": ca("ca.crt"), "tls.key": ca("ca.key") }
                }))
                .expect("a Secret"),
            )
            .await
            .expect("create the client CA Secret");
        (yaml, cert)
    }
}
