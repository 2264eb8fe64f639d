//! CertificateRenewalPolicies for tests: created in the management cluster, selecting Machines
//! by the label `e2e-policy=<selector>`.

use ck8s_certs_api::renewal_policy::CertificateRenewalPolicy;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

use crate::Environment;

impl Environment {
    /// Creates policy `name` with `spec`, selecting Machines labelled `e2e-policy=<selector>`.
    pub async fn create_policy(
        &self,
        namespace: &str,
        name: &str,
        selector: &str,
        spec: serde_json::Value,
    ) {
        let mut spec = spec;
        spec["machineSelector"] = json!({ "matchLabels": { "e2e-policy": selector } });
        let object: CertificateRenewalPolicy = serde_json::from_value(
            json!({ "metadata": { "name": name, "namespace": namespace }, "spec": spec }),
        )
        .expect("a valid policy");
        let api: Api<CertificateRenewalPolicy> =
            Api::namespaced(self.management().await.expect("client"), namespace);
        api.create(&PostParams::default(), &object)
            .await
            .expect("create CertificateRenewalPolicy");
    }
}

/// A window that is not open today or tomorrow: three days from now, 01:00-02:00 London time.
pub fn closed_window() -> serde_json::Value {
    let days = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let today = jiff::Timestamp::now()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .weekday()
        .to_monday_zero_offset() as usize;
    json!([{ "daysOfWeek": [days[(today + 3) % 7]], "start": "01:00", "end": "02:00", "timezone": "Europe/London" }])
}
