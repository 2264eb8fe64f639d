//! `make bench`: see `ck8s_certs_e2e::bench` and docs/performance.md.

use anyhow::Context;
use ck8s_certs_e2e::bench::{self, Options};
use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    let options = Options::parse();
    let report = bench::run(&options).await.context("benchmark")?;
    println!("{}", report.table());
    eprintln!("bench: results in {}", options.output.display());
    Ok(())
}
