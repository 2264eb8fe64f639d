//! A workload kubeconfig must not turn the controller against the fleet: one whose user reads a
//! file of the controller's pod (`tokenFile`: its service-account token) or runs a command
//! (`exec`) is refused before anything connects, and the refresh fails naming the Secret and the
//! field. `--insecure-kubeconfig-exec` lets `exec` through.
//!
//! Its own test binary (and so its own environment): cluster `alpha`'s kubeconfig is replaced,
//! and put back at the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ck8s_certs_api::annotations::REFRESH_CERTIFICATES_STATUS;
use ck8s_certs_api::cluster_certificates::ClusterCertificates;
use ck8s_certs_e2e::fixtures::NodeInfo;
use ck8s_certs_e2e::{Environment, shared_of};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);

/// A TCP listener on 127.0.0.1 that counts the connections it accepts (and drops them).
struct Listener {
    port: u16,
    connections: Arc<AtomicUsize>,
}

impl Listener {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        Self { port, connections }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// `alpha`'s kubeconfig with `server` pointing at the listener and `user` as its user.
fn kubeconfig(env: &Environment, port: u16, user: serde_json::Value) -> String {
    let mut kubeconfig: serde_yaml::Value =
        serde_yaml::from_str(&env.cluster("alpha").kubeconfig_yaml).unwrap();
    kubeconfig["clusters"][0]["cluster"]["server"] = format!("https://127.0.0.1:{port}").into();
    kubeconfig["users"][0]["user"] = serde_yaml::to_value(user).unwrap();
    serde_yaml::to_string(&kubeconfig).unwrap()
}

/// An exec plugin that reports to the listener when it runs, then hands kube-rs a token.
fn exec_user(port: u16) -> serde_json::Value {
    let credential = r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"plugin-token"}}"#;
    json!({ "exec": {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": "bash",
        "args": ["-c", format!("echo > /dev/tcp/127.0.0.1/{port}; echo '{credential}'")],
        "interactiveMode": "Never",
    }})
}

async fn set_kubeconfig(env: &Environment, yaml: &str) {
    let secrets: Api<Secret> = Api::namespaced(env.management().await.unwrap(), "fleet");
    secrets
        .patch(
            "alpha-kubeconfig",
            &PatchParams::default(),
            &Patch::Merge(json!({ "stringData": { "value": yaml } })),
        )
        .await
        .unwrap();
}

/// Refreshes `node` and returns the failure it reports (operation error = Event note).
async fn refused_refresh(env: &Environment, node: &NodeInfo) -> String {
    env.annotate_refresh(node, "1y").await;
    let annotations = env.wait_for_refresh(node, TIMEOUT).await;
    assert_eq!(
        annotations[REFRESH_CERTIFICATES_STATUS], "failed",
        "{annotations:#?}"
    );
    let error = env.operation(node).await.error.unwrap();
    // Events carry whole seconds: look for this note rather than at the last one.
    let start = Instant::now();
    while !env.machine_events(node).await.iter().any(|e| {
        e.reason.as_deref() == Some("CertificatesRefreshFailed")
            && e.type_.as_deref() == Some("Warning")
            && e.note.as_deref() == Some(error.as_str())
    }) {
        assert!(start.elapsed() < TIMEOUT, "no Event with {error}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    error
}

async fn wait_unreadable(env: &Environment) -> String {
    let api: Api<ClusterCertificates> = Api::namespaced(env.management().await.unwrap(), "fleet");
    let start = Instant::now();
    loop {
        if let Some(condition) = api
            .get_opt("alpha")
            .await
            .unwrap()
            .and_then(|r| r.status)
            .and_then(|s| s.conditions.into_iter().next())
            .filter(|c| c.reason == "Unreadable")
        {
            return condition.message;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "ClusterCertificates alpha never Unreadable"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn a_kubeconfig_that_reads_the_controllers_files_or_runs_a_command_is_refused_before_any_connection()
 {
    let env = shared_of(&["alpha"]).await;
    let listener = Listener::start().await;
    let node = env.cluster("alpha").node("alpha-cp-0").clone();
    // Stands for /var/run/secrets/kubernetes.io/serviceaccount/token: a file that exists, so
    // that a controller that honoured `tokenFile` would send it to the listener.
    let token_path = std::env::temp_dir().join(format!(
        "ck8s-certs-e2e-{}-serviceaccount-token",
        std::process::id()
    ));
    std::fs::write(&token_path, "controller-service-account-token").unwrap();
    let token_file = token_path.to_str().unwrap();

    // tokenFile: the controller's own service-account token, for the listener.
    set_kubeconfig(
        &env,
        &kubeconfig(&env, listener.port, json!({ "tokenFile": token_file })),
    )
    .await;
    env.isolate(&node, "kubeconfig-refusal").await;
    let controller = env.start_controller("kubeconfig-refusal", &[]);
    let error = refused_refresh(&env, &node).await;
    assert!(
        error.contains("the kubeconfig in Secret fleet/alpha-kubeconfig is unusable: `tokenFile`")
            && error.contains("`token`"),
        "{error}"
    );
    assert!(!error.contains(token_file), "{error}");
    // The Cluster's record says the same.
    let message = wait_unreadable(&env).await;
    assert!(
        message.contains("fleet/alpha-kubeconfig") && message.contains("`tokenFile`"),
        "{message}"
    );

    // exec: a command in the controller's pod (it would call the listener). The same Machine
    // again, within minutes: its new failure is an Event of its own with the new message (kube's
    // Recorder used to raise the count of the first, which still named `tokenFile`).
    set_kubeconfig(
        &env,
        &kubeconfig(&env, listener.port, exec_user(listener.port)),
    )
    .await;
    let error = refused_refresh(&env, &node).await;
    assert!(
        error.contains("the kubeconfig in Secret fleet/alpha-kubeconfig is unusable: `exec`")
            && error.contains("--insecure-kubeconfig-exec"),
        "{error}"
    );
    assert!(!error.contains("/dev/tcp"), "{error}");
    let log = controller.log();
    assert!(
        !log.contains(token_file) && !log.contains("/dev/tcp") && !log.contains("plugin-token"),
        "the log quotes the kubeconfig"
    );
    std::fs::remove_file(&token_path).unwrap();
    drop(controller);
    assert_eq!(
        listener.connections(),
        0,
        "something connected to the kubeconfig's server or ran its plugin"
    );

    // --insecure-kubeconfig-exec: the plugin runs (and kube-rs then calls the listener).
    env.isolate(&node, "kubeconfig-exec").await;
    let _controller = env.start_controller("kubeconfig-exec", &["--insecure-kubeconfig-exec"]);
    env.annotate_refresh(&node, "1y").await;
    let start = Instant::now();
    while listener.connections() == 0 {
        assert!(
            start.elapsed() < TIMEOUT,
            "the exec plugin never ran with --insecure-kubeconfig-exec"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The real kubeconfig back: the waiting refresh goes through with a client built from it.
    set_kubeconfig(&env, &env.cluster("alpha").kubeconfig_yaml).await;
    let annotations = env.wait_for_refresh(&node, Duration::from_secs(180)).await;
    assert_eq!(
        annotations[REFRESH_CERTIFICATES_STATUS], "done",
        "{annotations:#?}"
    );
}
