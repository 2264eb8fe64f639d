//! Which Cluster API version the management cluster serves. Machines are read as v1beta2 where
//! the API server serves it (CAPI ≥ v1.11) and as v1beta1 otherwise (CAPI v1.9, v1.10).

use ck8s_certs_api::capi::{GROUP, VERSIONS};
use ck8s_certs_api::machine::CapiVersion;
use kube::Client;

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("discovering the {GROUP} API group failed: {0}")]
    Api(#[source] kube::Error),
    #[error(
        "the management cluster serves no Machine API of group {GROUP} in versions {VERSIONS:?}: \
         install Cluster API (v1.9 or later) first"
    )]
    NoMachineApi,
}

/// Finds the preferred served Machine version.
pub async fn discover(client: &Client) -> Result<CapiVersion, DiscoveryError> {
    let group = match kube::discovery::group(client, GROUP).await {
        Ok(group) => group,
        Err(kube::Error::Api(status)) if status.code == 404 => {
            return Err(DiscoveryError::NoMachineApi);
        }
        Err(err) => return Err(DiscoveryError::Api(err)),
    };
    VERSIONS
        .iter()
        .find_map(|version| {
            group
                .versioned_resources(version)
                .into_iter()
                .any(|(resource, _)| resource.kind == "Machine")
                .then_some(*version)
        })
        .and_then(CapiVersion::from_version)
        .ok_or(DiscoveryError::NoMachineApi)
}
