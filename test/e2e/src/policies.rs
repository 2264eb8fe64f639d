//! CertificateRenewalPolicies for tests: created in the management cluster, selecting Machines
//! by the label `e2e-policy=<selector>`.

use ck8s_certs_api::capi::WATCH_FILTER_LABEL;
use std::time::{Duration, Instant};

use ck8s_certs_api::renewal_policy::{CertificateRenewalPolicy, CertificateRenewalPolicyStatus};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, PostParams};
use serde_json::json;

use crate::Environment;

impl Environment {
    /// The status of policy `namespace/name` once `done` holds (polled; fails after `timeout`
    /// saying `what` it waited for, with the status).
    pub async fn policy_status_until(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
        what: &str,
        done: impl Fn(&CertificateRenewalPolicyStatus) -> bool,
    ) -> CertificateRenewalPolicyStatus {
        let client = self.management().await.expect("client");
        let api: Api<CertificateRenewalPolicy> = Api::namespaced(client, namespace);
        let start = Instant::now();
        loop {
            let status = api.get(name).await.unwrap().status.unwrap_or_default();
            if done(&status) {
                return status;
            }
            assert!(
                start.elapsed() < timeout,
                "policy {namespace}/{name}, {what}: {status:#?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Creates policy `name` with `spec`, selecting Machines labelled `e2e-policy=<selector>`,
    /// in the watch-filter shard of the same name (the controller `start_controller(selector)`
    /// starts sees it).
    pub async fn create_policy(
        &self,
        namespace: &str,
        name: &str,
        selector: &str,
        spec: serde_json::Value,
    ) {
        self.create_policy_in(selector, namespace, name, selector, spec)
            .await;
    }

    /// [`Self::create_policy`] in watch-filter shard `filter`. The spec is sent as given: it may
    /// be one the schema accepts and the controller cannot read.
    pub async fn create_policy_in(
        &self,
        filter: &str,
        namespace: &str,
        name: &str,
        selector: &str,
        spec: serde_json::Value,
    ) {
        let mut spec = spec;
        spec["machineSelector"] = json!({ "matchLabels": { "e2e-policy": selector } });
        let resource = ApiResource::erase::<CertificateRenewalPolicy>(&());
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": resource.api_version, "kind": resource.kind,
            "metadata": { "name": name, "namespace": namespace, "labels": { WATCH_FILTER_LABEL: filter } },
            "spec": spec,
        }))
        .expect("a policy object");
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.management().await.expect("client"),
            namespace,
            &resource,
        );
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
