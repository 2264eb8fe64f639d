use clap::Parser;

use ck8s_certs::cli::Args;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // kube's rustls TLS and the k8sd client need a process-wide crypto provider before any TLS.
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    let args = Args::parse();
    ck8s_certs::telemetry::init(&args.log)?;
    ck8s_certs::run(args).await?;
    Ok(())
}
