//! k8sd's response envelope. Every answer, success or error, is wrapped in it:
//!
//! ```json
//! {"type":"sync","status":"Success","status_code":200,"operation":"","error_code":0,"error":"","metadata":<payload>}
//! {"type":"error","status":"","status_code":0,"operation":"","error_code":404,"error":"not found","metadata":null}
//! ```
//!
//! A response is a failure when the HTTP status is not 200, the body is not JSON, or `error` is
//! not empty; `metadata` is read only on success.

use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::error::K8sdError;

#[derive(Debug, Deserialize)]
struct Envelope {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    error_code: u16,
    #[serde(default)]
    error: String,
    #[serde(default)]
    metadata: serde_json::Value,
}

/// Turns an HTTP status and body into the payload `T` or a typed error.
pub fn decode<T: DeserializeOwned>(
    endpoint: &str,
    status: u16,
    body: &[u8],
) -> Result<T, K8sdError> {
    let envelope: Result<Envelope, _> = serde_json::from_slice(body);
    let envelope = match envelope {
        Ok(envelope) => envelope,
        Err(err) if status == 200 => {
            return Err(K8sdError::InvalidResponse {
                endpoint: endpoint.to_owned(),
                reason: format!("the body is not a k8sd envelope: {err}"),
            });
        }
        // A non-JSON error page (a proxy in the way, say): keep the status and a bounded excerpt.
        Err(_) => {
            return Err(K8sdError::Api {
                endpoint: endpoint.to_owned(),
                status,
                message: excerpt(body),
            });
        }
    };
    if status != 200 || !envelope.error.is_empty() || envelope.kind == "error" {
        let status = if status == 200 && envelope.error_code != 0 {
            envelope.error_code
        } else {
            status
        };
        // The node's own words, kept in statuses and Events and shown: bounded, no escapes.
        return Err(K8sdError::Api {
            endpoint: endpoint.to_owned(),
            status,
            message: crate::text::bounded(&envelope.error, MAX_ERROR_CHARS),
        });
    }
    serde_json::from_value(envelope.metadata).map_err(|err| K8sdError::InvalidResponse {
        endpoint: endpoint.to_owned(),
        reason: format!("unexpected metadata: {err}"),
    })
}

/// The most of a node's error message that is kept.
pub const MAX_ERROR_CHARS: usize = 1000;

/// At most 200 characters of a body, for error messages.
fn excerpt(body: &[u8]) -> String {
    crate::text::bounded(&String::from_utf8_lossy(body), 201)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8sd::wire::{PlanResponse, RunResponse};

    const SUCCESS_RUN: &str = r#"{"type":"sync","status":"Success","status_code":200,"operation":"","error_code":0,"error":"","metadata":{"expiration-seconds":1798761600}}"#;

    #[test]
    fn success_yields_the_metadata() {
        let run: RunResponse = decode("run", 200, SUCCESS_RUN.as_bytes()).unwrap();
        assert_eq!(run.expiration_seconds, 1_798_761_600);
    }

    #[test]
    fn root_probe_metadata_is_a_list() {
        let body = r#"{"type":"sync","status":"Success","status_code":200,"operation":"","error_code":0,"error":"","metadata":["/1.0"]}"#;
        let paths: Vec<String> = decode("root", 200, body.as_bytes()).unwrap();
        assert_eq!(paths, ["/1.0"]);
    }

    #[test]
    fn documented_errors_keep_status_and_message() {
        for (status, message) in [
            (503, "Database is not yet initialized"),
            (401, r#"missing header "node-token""#),
            (401, "invalid token"),
            (400, "failed to parse request: json: unknown field \"x\""),
            (404, "not found"),
            (501, "method GET not implemented"),
            (
                500,
                "failed to approve worker node CSR: CSR k8sd-1-worker-kubelet-serving is already approved",
            ),
        ] {
            let body = serde_json::json!({
                "type": "error", "status": "", "status_code": 0, "operation": "",
                "error_code": status, "error": message, "metadata": null
            })
            .to_string();
            let err = decode::<PlanResponse>("plan", status, body.as_bytes()).unwrap_err();
            match err {
                K8sdError::Api {
                    status: got,
                    message: text,
                    ..
                } => {
                    assert_eq!(got, status);
                    assert_eq!(text, message);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    #[test]
    fn non_json_success_is_an_invalid_response() {
        let err = decode::<RunResponse>("run", 200, br#"{"type":"sync","status":"#).unwrap_err();
        assert!(matches!(err, K8sdError::InvalidResponse { .. }), "{err:?}");
    }

    #[test]
    fn an_error_string_in_a_200_is_a_failure() {
        let body = r#"{"type":"sync","status":"Success","status_code":200,"operation":"","error_code":0,"error":"boom","metadata":null}"#;
        assert!(matches!(
            decode::<RunResponse>("run", 200, body.as_bytes()),
            Err(K8sdError::Api { status: 200, .. })
        ));
    }

    #[test]
    fn a_success_without_the_expected_field_is_invalid_not_zero() {
        let body = r#"{"type":"sync","status":"Success","status_code":200,"operation":"","error_code":0,"error":"","metadata":{}}"#;
        assert!(matches!(
            decode::<RunResponse>("run", 200, body.as_bytes()),
            Err(K8sdError::InvalidResponse { .. })
        ));
    }

    #[test]
    fn non_json_error_pages_are_excerpted() {
        let page = "x".repeat(500);
        let Err(K8sdError::Api {
            status, message, ..
        }) = decode::<RunResponse>("run", 502, page.as_bytes())
        else {
            panic!("expected an API error");
        };
        assert_eq!(status, 502);
        assert_eq!(message.chars().count(), 201);
    }

    #[test]
    fn a_nodes_error_is_kept_bounded_and_without_escapes() {
        let long = format!("\u{1b}[31mdenied\u{1b}[0m\r\n{}", "x".repeat(1 << 20));
        let body = serde_json::json!({
            "type": "error", "status": "", "status_code": 0, "operation": "",
            "error_code": 500, "error": long, "metadata": null
        })
        .to_string();
        let Err(K8sdError::Api { message, .. }) =
            decode::<RunResponse>("run", 500, body.as_bytes())
        else {
            panic!("an API error");
        };
        assert_eq!(message.chars().count(), MAX_ERROR_CHARS);
        assert!(!message.chars().any(char::is_control), "{message:?}");
        assert!(message.contains("[31mdenied"), "{message:?}");
    }
}
