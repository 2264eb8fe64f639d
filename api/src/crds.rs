//! The CRD manifests this project installs, generated from the Rust types. `config/crd/bases`
//! holds the same YAML; a test fails when they drift.

use kube::CustomResourceExt;

use crate::certificate_refresh::CertificateRefresh;
use crate::cluster_certificates::ClusterCertificates;
use crate::machine_certificates::MachineCertificates;
use crate::renewal_policy::CertificateRenewalPolicy;

/// `(file name, YAML)` of every CRD.
pub fn all() -> Result<Vec<(String, String)>, serde_yaml::Error> {
    [
        MachineCertificates::crd(),
        CertificateRenewalPolicy::crd(),
        ClusterCertificates::crd(),
        CertificateRefresh::crd(),
    ]
    .into_iter()
    .map(|crd| {
        let name = format!("{}.yaml", crd.metadata.name.clone().unwrap_or_default());
        Ok((name, serde_yaml::to_string(&crd)?))
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    #[test]
    fn config_crd_bases_match_the_rust_types() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/crd/bases");
        for (file, yaml) in super::all().unwrap() {
            let on_disk = std::fs::read_to_string(dir.join(&file)).unwrap_or_default();
            assert!(
                on_disk == yaml,
                "config/crd/bases/{file} is stale: run `make manifests`"
            );
        }
    }
}
