//! k8sd answers: an HTTP status and a body, as `k8sd::envelope::decode` receives them (the
//! client reads at most 1 MiB), decoded as each payload the controller asks for, then used as
//! the controller uses them: `run`'s `expiration-seconds` interpreted (Unix time or, from older
//! k8sd, a lifetime) and compared with the request, `certificates-expiry`'s date parsed.
//!
//! An input is two bytes of status (big-endian) and the body. Corpus files are named
//! `<status>-<what>.json`.

use std::time::Duration;

use ck8s_certs::k8sd::K8sdError;
use ck8s_certs::k8sd::envelope::decode;
use ck8s_certs::k8sd::wire::{
    ApproveResponse, CertificatesExpiryResponse, PlanResponse, RunResponse,
};
use ck8s_certs::refresh::flow::{interpret_run, lifetime_mismatch};
use jiff::Timestamp;
use serde_json::{Value, json};

use super::cron::instant;
use super::harness::{Rng, hash};
use super::mutate;

pub const WORDS: &[&str] = &[
    "sync",
    "error",
    "Success",
    "metadata",
    "error_code",
    "expiration-seconds",
    "expiry-date",
    "seconds",
    "certificate-signing-requests",
    "2027-01-01T00:00:00Z",
    "2027-01-01T00:00:00.123456789+01:00",
    "9999-12-31T23:59:59Z",
    "-009999-01-01T00:00:00Z",
    "2027-02-30T00:00:00Z",
    "1798761600",
    "Database is not yet initialized",
    "/1.0",
];

/// `expiry-date`s: RFC 3339 as k8sd writes it, the ends of the calendar, an impossible day.
const DATES: &[&str] = &[
    "2035-11-20T09:12:44Z",
    "2027-01-01T00:00:00.123456789+01:00",
    "9999-12-31T23:59:59Z",
    "-009999-01-01T00:00:00Z",
    "2027-02-30T00:00:00Z",
    "2027-01-01 00:00:00",
    "1798761600",
];

const STATUSES: &[u16] = &[
    200, 200, 200, 400, 401, 404, 500, 501, 502, 503, 504, 0, 999, 65535,
];

/// The corpus: `<status>-<what>.json` gives the status.
pub fn corpus() -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/k8sd");
    let mut files: Vec<_> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries.filter_map(|e| Some(e.ok()?.path())).collect(),
        Err(err) => panic!("reading the corpus {}: {err}", dir.display()),
    };
    files.sort();
    files
        .iter()
        .map(|file| {
            let status: u16 = file
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.split('-').next())
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("{}: name it <status>-<what>.json", file.display()));
            let body =
                std::fs::read(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
            with_status(status, body)
        })
        .collect()
}

fn with_status(status: u16, body: Vec<u8>) -> Vec<u8> {
    let mut input = status.to_be_bytes().to_vec();
    input.extend(body);
    input
}

fn split(input: &[u8]) -> (u16, &[u8]) {
    match input {
        [a, b, body @ ..] => (u16::from_be_bytes([*a, *b]), body),
        _ => (200, input),
    }
}

/// `expiration-seconds` or a seed: a Unix time of this century, an old k8sd's lifetime, or an
/// edge.
fn seconds(rng: &mut Rng) -> Value {
    match rng.below(4) {
        0 => json!(rng.between(1_700_000_000, 2_100_000_000)),
        1 => json!(rng.between(1, 999_999_999)),
        2 => json!(rng.between(0, i64::MAX)),
        _ => mutate::number(rng),
    }
}

fn payload(rng: &mut Rng) -> Value {
    let seed = || json!(9_223_372_036_854_775_806_i64);
    match rng.below(6) {
        0 => json!({"expiration-seconds": seconds(rng)}),
        1 => {
            json!({"seconds": seconds(rng), "certificate-signing-requests": match rng.below(3) {
                0 => Value::Null,
                1 => json!(["k8sd-1-worker-kubelet-serving", "k8sd-1-worker-kubelet-client", "k8sd-1-worker-kube-proxy-client"]),
                _ => json!([mutate::value(rng, WORDS, 1)]),
            }})
        }
        2 => json!({"expiry-date": match rng.chance(80) {
            true => rng.pick(DATES),
            false => rng.pick(WORDS),
        }}),
        3 => json!({}),
        4 => json!(["/1.0"]),
        _ => json!({"seed": seed(), "whatever": mutate::value(rng, WORDS, 2)}),
    }
}

fn envelope(rng: &mut Rng) -> Value {
    match rng.chance(70) {
        true => json!({
            "type": "sync", "status": "Success", "status_code": 200, "operation": "",
            "error_code": 0, "error": "", "metadata": payload(rng),
        }),
        false => json!({
            "type": "error", "status": "", "status_code": 0, "operation": "",
            "error_code": match rng.chance(80) {
                true => json!(rng.pick(&[400, 401, 404, 500, 501, 502, 503, 504])),
                false => mutate::number(rng),
            }, "error": mutate::string(rng, WORDS), "metadata": Value::Null,
        }),
    }
}

pub fn generate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    // Mostly the status that goes with the body (200 with a success envelope).
    let mut status = 200;
    let body = match rng.below(10) {
        0..=3 => {
            let seed: &Vec<u8> = rng.pick_ref(corpus);
            let (seed_status, body) = split(seed);
            status = seed_status;
            let bodies: Vec<Vec<u8>> = corpus.iter().map(|c| split(c).1.to_vec()).collect();
            mutate::json_bytes(rng, body, WORDS, &bodies)
        }
        4..=7 => {
            let envelope = envelope(rng);
            if let Some(code) = envelope["error_code"].as_u64().filter(|c| *c != 0) {
                status = code as u16;
            }
            serde_json::to_vec(&envelope).unwrap_or_default()
        }
        8 => {
            let body = serde_json::to_vec(&envelope(rng)).unwrap_or_default();
            mutate::json_bytes(rng, &body, WORDS, &[])
        }
        _ => match rng.chance(50) {
            true => mutate::deep_text(rng),
            // A proxy's error page, or a binary blob.
            false => (0..rng.below(4096)).map(|_| rng.next() as u8).collect(),
        },
    };
    if rng.chance(15) {
        status = match rng.chance(80) {
            true => rng.pick(STATUSES),
            false => rng.next() as u16,
        };
    }
    with_status(status, body)
}

/// What the controller reads of an error: its text, whether to retry, its metric label.
fn use_error(err: &K8sdError) {
    let _ = err.to_string();
    let _ = err.is_retryable();
    let _ = err.category();
}

pub fn check(input: &[u8]) -> &'static str {
    let (status, body) = split(input);
    let mut rng = Rng::new(hash(input));
    let mut label = "refused";

    match decode::<RunResponse>("run", status, body) {
        Ok(run) => {
            label = "run";
            for answered_at in [instant(&mut rng), Timestamp::MIN, Timestamp::MAX] {
                match interpret_run(&run, answered_at) {
                    Ok(outcome) => {
                        // The controller's TTLs are 1 s to 10000y; it started shortly before.
                        let requested = Duration::from_secs(
                            rng.between(1, ck8s_certs_api::duration::MAX_SECONDS) as u64,
                        );
                        let _ = lifetime_mismatch(requested, answered_at, outcome.not_after);
                        let _ = lifetime_mismatch(requested, instant(&mut rng), outcome.not_after);
                    }
                    Err(err) => use_error(&err),
                }
            }
        }
        Err(err) => {
            if matches!(err, K8sdError::Api { .. }) {
                label = "error envelope";
            }
            use_error(&err);
        }
    }
    match decode::<PlanResponse>("plan", status, body) {
        Ok(plan) => {
            label = "plan";
            let _ = format!("k8sd-{}-worker-kubelet-serving", plan.seed);
            let _ = plan.certificate_signing_requests.map(|names| names.len());
        }
        Err(err) => use_error(&err),
    }
    match decode::<CertificatesExpiryResponse>("certificates-expiry", status, body) {
        Ok(answer) => {
            label = match answer.expiry_date.parse::<Timestamp>() {
                Ok(_) => "expiry",
                Err(_) => "expiry, bad date",
            };
        }
        Err(err) => use_error(&err),
    }
    match decode::<ApproveResponse>("approve", status, body) {
        Ok(_) if label == "refused" => label = "approve",
        Ok(_) => {}
        Err(err) => use_error(&err),
    }
    match decode::<Vec<String>>("probe", status, body) {
        Ok(_) => label = "probe",
        Err(err) => use_error(&err),
    }
    label
}
