//! `CK8S_CERTS_RENEWAL_WINDOW_STRICT` as the built binary reads it: every spelling the flag
//! accepts is accepted from the environment too, and anything else stops the binary before it
//! does anything. The `policy preview` subcommand is the vehicle: it needs no cluster, and clap
//! reads and checks the controller's environment variables whatever the subcommand. (Setting the
//! variable in this test process instead would race with the other tests' threads.)

use std::path::PathBuf;
use std::process::{Command, Output};

const VARIABLE: &str = "CK8S_CERTS_RENEWAL_WINDOW_STRICT";

fn preview_with(value: &str) -> std::io::Result<Output> {
    let sample: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "config/samples/certificates_v1alpha1_certificaterenewalpolicy_automatic.yaml",
    ]
    .iter()
    .collect();
    Command::new(env!("CARGO_BIN_EXE_ck8s-certs"))
        .args(["policy", "preview", "-f"])
        .arg(sample)
        .args([
            "--expiry=2026-12-20T00:00:00Z",
            "--now=2026-11-20T12:00:00Z",
        ])
        .env(VARIABLE, value)
        .output()
}

#[test]
fn the_environment_variable_takes_the_flags_values() {
    for value in ["true", "false", "yes", "no", "on", "off", "1", "0"] {
        let output = preview_with(value).unwrap();
        assert_eq!(
            output.status.code(),
            Some(0),
            "{VARIABLE}={value}: {output:?}"
        );
    }
    for value in ["maybe", "enabled"] {
        let output = preview_with(value).unwrap();
        // The binary's exit code for bad arguments.
        assert_eq!(
            output.status.code(),
            Some(1),
            "{VARIABLE}={value}: {output:?}"
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("invalid value '{value}'"))
                && stderr.contains("--renewal-window-strict"),
            "{stderr}"
        );
    }
}
