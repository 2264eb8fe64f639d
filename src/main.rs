use std::process::ExitCode;

use clap::Parser;

use ck8s_certs::cli::{Args, Command, PolicyCommand};

/// jemalloc instead of glibc's malloc: glibc kept a quarter of the controller's heap as free
/// fragments after the start-up pass (docs/performance.md, step 3).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Exit code of bad arguments and of a controller that stopped on an error.
const EXIT_ERROR: u8 = 1;

fn main() -> ExitCode {
    // Installed as `kubectl-ck8s_certs`, this binary is the kubectl plugin.
    if ck8s_certs::plugin::invoked_as_plugin() {
        return ck8s_certs::plugin::main();
    }
    let mut args = match Args::try_parse() {
        Ok(args) => args,
        Err(error) => {
            // --help and --version print to stdout and succeed; usage errors exit 1, so that
            // `policy preview` keeps exit code 2 for an invalid policy.
            let _ = error.print();
            return match error.use_stderr() {
                true => ExitCode::from(EXIT_ERROR),
                false => ExitCode::SUCCESS,
            };
        }
    };
    match args.command.take() {
        Some(Command::Policy(PolicyCommand::Preview(preview))) => {
            ck8s_certs::preview::run(&preview)
        }
        None => match controller(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                // Every error message already names its cause; no backtrace for users.
                eprintln!("Error: {error}");
                ExitCode::from(EXIT_ERROR)
            }
        },
    }
}

fn controller(args: Args) -> anyhow::Result<()> {
    // kube's rustls TLS and the k8sd client need a process-wide crypto provider before any TLS.
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    use ck8s_certs::cli::environment;
    ck8s_certs::telemetry::init(&args.log, environment::log_filter(), environment::colour())?;
    // Room beyond tokio's 2 MiB for polling a reconcile's nested futures (a debug build's
    // frames are large): running out aborts the process. Untouched stack costs no memory.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(8 << 20)
        .build()?;
    let result = runtime.block_on(ck8s_certs::run(args));
    // Exit at once, above all after leadership was lost: dropping the runtime would wait for
    // its blocking tasks (a DNS lookup, a file read) first.
    runtime.shutdown_background();
    Ok(result?)
}
