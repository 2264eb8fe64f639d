//! Crash points for the end-to-end suite: with `CK8S_CERTS_FAILPOINTS=<name>[,<name>…]` in its
//! environment the process aborts when it reaches a named point, so tests can prove that a crash
//! at exactly that step loses nothing. Unset in production, where `hit` is one lookup in an
//! empty list.

use std::sync::OnceLock;

/// After the attempt's seed is journaled in the status of the Machine's CertificateRefresh,
/// before `run` is sent.
pub const AFTER_SEED_RECORDED: &str = "after-seed-recorded";
/// After `run` answered, before its outcome is written: the outcome is known only to the node.
pub const AFTER_RUN_ANSWERED: &str = "after-run-answered";
/// After the outcome is journaled in the Machine's CertificateRefresh, before MachineCertificates
/// (its copy of the operation) and the Machine are written.
pub const AFTER_OUTCOME_RECORDED: &str = "after-outcome-recorded";

fn enabled() -> &'static [String] {
    static POINTS: OnceLock<Vec<String>> = OnceLock::new();
    POINTS.get_or_init(crate::cli::environment::failpoints)
}

/// Aborts the process if `name` is enabled.
pub fn hit(name: &str) {
    if enabled().iter().any(|p| p == name) {
        eprintln!("failpoint {name} reached: aborting");
        std::process::abort();
    }
}
