//! `ck8s-certs policy preview` as users run it: the built binary on the sample policies in
//! `config/samples`, its exit codes and its output formats.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

const EXPIRY: &str = "--expiry=2026-12-20T00:00:00Z";

fn sample(name: &str) -> String {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "config/samples",
        &format!("certificates_v1alpha1_certificaterenewalpolicy_{name}.yaml"),
    ]
    .iter()
    .collect();
    path.display().to_string()
}

/// Runs the binary with `args`, writing `stdin` to its standard input.
fn run(args: &[&str], stdin: &str) -> std::io::Result<Output> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ck8s-certs"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.as_bytes())?;
    }
    child.wait_with_output()
}

/// `policy preview -f <file> --expiry … <extra>`.
fn preview(file: &str, extra: &[&str]) -> std::io::Result<Output> {
    let args = [&["policy", "preview", "-f", file, EXPIRY], extra].concat();
    run(&args, "")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn every_sample_is_a_valid_policy() {
    for name in ["automatic", "scheduled", "disabled"] {
        let output = preview(&sample(name), &["--now=2026-11-20T12:00:00Z"]).unwrap();
        assert_eq!(output.status.code(), Some(0), "{name}: {output:?}");
        assert!(output.stderr.is_empty(), "{name}: {output:?}");
    }
}

#[test]
fn the_scheduled_sample_defers_to_friday_night_in_london() {
    let output = preview(&sample("scheduled"), &["--now=2026-11-20T12:00:00Z"]).unwrap();
    let text = stdout(&output);
    assert!(
        text.contains("Decision:      Defer until 2026-11-20T22:00:00Z (OutsideWindow)\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "  windows[1]  Wed 2026-11-25 01:00 GMT     Europe/London        2026-11-25T01:00:00Z\n"
        ),
        "{text}"
    );
}

#[test]
fn json_output_is_one_document() {
    let output = preview(
        &sample("automatic"),
        &["--now=2026-11-20T12:00:00Z", "-o", "json"],
    )
    .unwrap();
    assert_eq!(output.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["decision"]["action"], "RenewNow");
    assert_eq!(json["decision"]["reason"], "Due");
    assert_eq!(json["policy"]["mode"], "Automatic");
}

#[test]
fn an_invalid_policy_from_stdin_exits_2_with_the_messages() {
    let policy = "\
apiVersion: certificates.ck8s.io/v1alpha1
kind: CertificateRenewalPolicy
metadata:
  name: broken
spec:
  clusterSelector: {}
  policy: Scheduled
  windows:
    - start: \"22:00\"
      end: \"02:00\"
      timezone: Europe/Londn
";
    let output = run(&["policy", "preview", "-f", "-", EXPIRY], policy).unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let text = stdout(&output);
    assert!(
        text.contains("Renewal policy is invalid: windows[0].timezone: \"Europe/Londn\" is not an IANA time zone name"),
        "{text}"
    );
}

#[test]
fn usage_and_file_errors_exit_1() {
    let missing = preview("/nonexistent/policy.yaml", &[]).unwrap();
    assert_eq!(missing.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.starts_with("Error: reading /nonexistent/policy.yaml failed"),
        "{stderr}"
    );

    let no_expiry = run(&["policy", "preview", "-f", &sample("automatic")], "").unwrap();
    assert_eq!(no_expiry.status.code(), Some(1));
    let bad_time = preview(&sample("automatic"), &["--now=yesterday"]).unwrap();
    assert_eq!(bad_time.status.code(), Some(1));

    let help = run(&["policy", "preview", "--help"], "").unwrap();
    assert_eq!(help.status.code(), Some(0));
    assert!(stdout(&help).contains("--expiry <RFC3339>"));
}
