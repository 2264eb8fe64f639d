//! `make run` without a cluster: starts the embedded environment (a management cluster and two
//! CK8s workload clusters with simulated nodes), then the controller against it, and prints how
//! to try it. Ctrl-C (or SIGTERM) tears everything down.

use std::path::PathBuf;

use anyhow::Context;
use ck8s_certs_e2e::process::Process;
use ck8s_certs_e2e::{EnvSpec, Environment};
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    let controller: Option<PathBuf> = std::env::args()
        .skip_while(|a| a != "--controller")
        .nth(1)
        .map(PathBuf::from);

    eprintln!(
        "Starting the test environment (etcd, a management and five workload kube-apiservers, simulated nodes)…"
    );
    let env = Environment::start(EnvSpec::standard())
        .await
        .context("starting the test environment")?;
    let kubeconfig = env.management_kubeconfig.display().to_string();
    let m = &env.measurements;
    eprintln!(
        "Environment up in {:.1}s (API servers ready after {:.1}s), CAPI {} CRDs, files in {}",
        m.start.as_secs_f64(),
        m.control_planes_ready.as_secs_f64(),
        env.spec.capi_version.0,
        env.dir.display()
    );

    let mut controller = match controller {
        Some(path) => {
            // The refresh-trigger webhook as in a cluster, called on loopback.
            let webhook_port = ck8s_certs_e2e::controlplane::free_port()?;
            env.install_webhook_configuration(None, webhook_port).await;
            let mut command = std::process::Command::new(&path);
            command
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .arg("--health-bind-address")
                .arg("127.0.0.1:0")
                .arg(format!("--webhook-bind-address=127.0.0.1:{webhook_port}"))
                .arg("--webhook-hosts=127.0.0.1")
                // The provider's admission policies are not installed here: they know the
                // controller by its ServiceAccount, and this one runs as the admin.
                .arg("--request-policy=")
                .arg("--renewal-admission-policy=");
            Some(
                Process::spawn_foreground("ck8s-certs", command)
                    .with_context(|| format!("starting {}", path.display()))?,
            )
        }
        None => None,
    };

    let example = env.clusters.first().and_then(|c| c.nodes.first());
    println!("\nTry it:\n  export KUBECONFIG={kubeconfig}\n  kubectl get clusters,machines -A");
    if let Some(node) = example {
        println!(
            "  kubectl annotate machine -n {} {} v1beta2.k8sd.io/refresh-certificates=1y",
            node.namespace, node.machine
        );
    }
    for cluster in &env.clusters {
        println!(
            "  kubectl --kubeconfig {} get nodes,pods -A -o wide   # workload cluster {}",
            cluster.kubeconfig.display(),
            cluster.spec.name
        );
    }
    println!("Press Ctrl-C to stop and remove everything.");

    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    eprintln!("Stopping…");
    // The controller first, while the API server can still take its Lease release.
    if let Some(controller) = controller.as_mut() {
        controller.terminate(std::time::Duration::from_secs(10));
    }
    env.stop();
    Ok(())
}
