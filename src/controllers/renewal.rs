//! Which CertificateRenewalPolicy governs a Machine. Policies are read per reconcile (listed in
//! the Machine's namespace and decoded one by one, so one unreadable object cannot hide the
//! others); the decision itself is `crate::policy::decide`.

use std::collections::BTreeMap;

use ck8s_certs_api::renewal_policy::CertificateRenewalPolicy;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, Client, ResourceExt};

use crate::policy::spec::{self, ValidPolicy};

/// The policies that select a Machine.
pub enum Governing {
    /// No policy: manual refreshes only.
    None,
    /// One policy, usable or not (its error message).
    One {
        name: String,
        policy: Result<Box<ValidPolicy>, String>,
    },
    /// Several policies select the Machine: a configuration error, never a silent pick.
    Conflict(Vec<String>),
}

pub async fn governing(
    client: &Client,
    namespace: &str,
    cluster_labels: Option<&BTreeMap<String, String>>,
    machine_labels: &BTreeMap<String, String>,
) -> Result<Governing, kube::Error> {
    let resource = ApiResource::erase::<CertificateRenewalPolicy>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    let mut matched = Vec::new();
    for object in api.list(&ListParams::default()).await?.items {
        let name = object.name_any();
        let policy: CertificateRenewalPolicy = match serde_json::to_value(&object)
            .and_then(serde_json::from_value)
        {
            Ok(policy) => policy,
            Err(err) => {
                // Unreadable (e.g. a duration the schema let through but the grammar rejects):
                // its selectors are unknown, so it governs nothing; say so in the log.
                tracing::warn!(policy = %name, error = %err, "Ignoring an unreadable CertificateRenewalPolicy");
                continue;
            }
        };
        let selects =
            spec::selector(&policy.spec).is_ok_and(|s| s.matches(cluster_labels, machine_labels));
        if selects {
            let checked = spec::validate(&policy.spec)
                .map(Box::new)
                .map_err(|invalid| invalid.to_string());
            matched.push((name, checked));
        }
    }
    Ok(match matched.len() {
        0 => Governing::None,
        1 => {
            let (name, policy) = matched.remove(0);
            Governing::One { name, policy }
        }
        _ => Governing::Conflict(matched.into_iter().map(|(name, _)| name).collect()),
    })
}
