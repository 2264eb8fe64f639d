//! k8sd request and response bodies, exactly as the `github.com/canonical/k8s-snap-api` v1.1.0
//! `api/v1` types serialize them. k8sd decodes requests strictly (an unknown or missing-brace
//! body is a 400), so requests carry exactly these fields; responses tolerate unknown fields.

use serde::{Deserialize, Serialize};

/// Paths of the endpoints (POST, JSON) and of the probe (GET).
pub mod path {
    pub const ROOT: &str = "/";
    pub const CERTIFICATES_EXPIRY: &str = "/1.0/x/capi/certificates-expiry";
    pub const PLAN: &str = "/1.0/x/capi/refresh-certs/plan";
    pub const RUN: &str = "/1.0/x/capi/refresh-certs/run";
    pub const APPROVE: &str = "/1.0/x/capi/refresh-certs/approve";
}

/// A k8sd authentication token (`node-token` or `capi-auth-token`). Its `Debug` never shows the
/// value, so it can sit inside structs that get logged.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret value, for the request header. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// `CertificatesExpiryRequest`: an empty object.
#[derive(Debug, Default, Serialize)]
pub struct CertificatesExpiryRequest {}

/// `CertificatesExpiryResponse`.
#[derive(Debug, Deserialize, PartialEq, Eq)]
pub struct CertificatesExpiryResponse {
    /// Earliest NotAfter among the node's database certificates, RFC 3339.
    #[serde(rename = "expiry-date")]
    pub expiry_date: String,
}

/// `ClusterAPICertificatesPlanRequest`. `certificates` is always sent, as `null` (all).
#[derive(Debug, Default, Serialize)]
pub struct PlanRequest {
    pub certificates: Option<Vec<String>>,
}

/// `ClusterAPICertificatesPlanResponse`. Quirk: the seed travels under the key `"seconds"`.
#[derive(Debug, Deserialize, PartialEq, Eq)]
pub struct PlanResponse {
    #[serde(rename = "seconds")]
    pub seed: i64,
    /// CSR names a worker will create; `null` on a control plane.
    #[serde(rename = "certificate-signing-requests", default)]
    pub certificate_signing_requests: Option<Vec<String>>,
}

/// `ClusterAPICertificatesRunRequest`.
#[derive(Debug, Serialize)]
pub struct RunRequest {
    pub certificates: Option<Vec<String>>,
    pub seed: i64,
    /// Requested lifetime in seconds.
    #[serde(rename = "expiration-seconds")]
    pub expiration_seconds: i64,
    #[serde(rename = "extra-sans")]
    pub extra_sans: Option<Vec<String>>,
}

impl RunRequest {
    /// The `run` of one attempt. The lifetime is a checked [`Ttl`](crate::policy::Ttl): a
    /// request never asks k8sd for a default or zero lifetime.
    pub fn new(seed: i64, ttl: crate::policy::Ttl, extra_sans: Option<Vec<String>>) -> Self {
        Self {
            certificates: None,
            seed,
            expiration_seconds: ttl.as_seconds(),
            extra_sans,
        }
    }
}

/// `ClusterAPICertificatesRunResponse`. Quirk: an absolute Unix timestamp (the new NotAfter),
/// not a duration, on current k8sd.
#[derive(Debug, Deserialize, PartialEq, Eq)]
pub struct RunResponse {
    #[serde(rename = "expiration-seconds")]
    pub expiration_seconds: i64,
}

/// `ClusterAPIApproveWorkerCSRRequest`.
#[derive(Debug, Serialize)]
pub struct ApproveRequest {
    pub seed: i64,
}

/// `ClusterAPIApproveWorkerCSRResponse`: an empty object; anything else is tolerated.
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
pub struct ApproveResponse {}

#[cfg(test)]
mod tests {
    use super::*;

    fn json<T: Serialize>(value: &T) -> String {
        serde_json::to_string(value).unwrap()
    }

    #[test]
    fn requests_serialize_to_exactly_the_documented_bytes() {
        assert_eq!(json(&CertificatesExpiryRequest {}), "{}");
        assert_eq!(json(&PlanRequest::default()), r#"{"certificates":null}"#);
        assert_eq!(
            json(&RunRequest {
                certificates: None,
                seed: 9_223_372_036_854_775_806,
                expiration_seconds: 31_536_000,
                extra_sans: Some(vec!["10.0.0.1".into(), "cp.example.com".into()]),
            }),
            r#"{"certificates":null,"seed":9223372036854775806,"expiration-seconds":31536000,"extra-sans":["10.0.0.1","cp.example.com"]}"#
        );
        assert_eq!(json(&ApproveRequest { seed: 42 }), r#"{"seed":42}"#);
    }

    #[test]
    fn plan_response_reads_the_seed_from_seconds_without_rounding() {
        let worker: PlanResponse = serde_json::from_str(
            r#"{"seconds":9007199254740993,"certificate-signing-requests":["k8sd-9007199254740993-worker-kubelet-serving"]}"#,
        )
        .unwrap();
        assert_eq!(worker.seed, 9_007_199_254_740_993);
        assert_eq!(worker.certificate_signing_requests.unwrap().len(), 1);

        let control_plane: PlanResponse =
            serde_json::from_str(r#"{"seconds":7,"certificate-signing-requests":null}"#).unwrap();
        assert_eq!(control_plane.certificate_signing_requests, None);
    }

    #[test]
    fn responses_tolerate_unknown_fields() {
        let run: RunResponse =
            serde_json::from_str(r#"{"expiration-seconds":1798761600,"new-field":true}"#).unwrap();
        assert_eq!(run.expiration_seconds, 1_798_761_600);
        let _: ApproveResponse = serde_json::from_str(r#"{"whatever":1}"#).unwrap();
    }

    #[test]
    fn a_missing_field_is_an_error_not_a_zero() {
        assert!(serde_json::from_str::<RunResponse>("{}").is_err());
        assert!(serde_json::from_str::<PlanResponse>("{}").is_err());
    }

    #[test]
    fn tokens_never_show_in_debug_output() {
        let token = Token::new("0123456789abcdef0123456789abcdef");
        assert_eq!(format!("{token:?}"), "Token(<redacted>)");
    }
}
