//! A worker's CSRs of one seed in its workload cluster: read and verified before `approve`
//! ([`crate::refresh::csr`]), denied when one does not pass. Read by name (three GETs per
//! try, no watch): the CSRs of a cluster are not ours to cache.

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::PostParams;
use kube::{Api, Client};
use tracing::{info, warn};

use crate::refresh::Verification;
use crate::refresh::csr::{self, Kind, Mismatch};

/// The reason of the Denied condition this controller puts on a CSR that did not pass.
pub const DENIED_REASON: &str = "UnverifiedByCK8sCerts";

/// The CSRs a worker's refreshes create, in its cluster.
pub struct WorkerCsrs {
    api: Api<CertificateSigningRequest>,
    cluster: String,
    worker: csr::Worker,
}

impl WorkerCsrs {
    pub fn new(client: Client, cluster: &str, worker: csr::Worker) -> Self {
        Self {
            api: Api::all(client),
            cluster: cluster.to_owned(),
            worker,
        }
    }

    /// Reads the three CSRs of `seed` and checks those that exist; a CSR that does not pass
    /// decides, whatever the others are.
    pub async fn verify(&self, seed: i64, lifetime: i64) -> Verification {
        let names = Kind::ALL.map(|k| k.name(seed));
        let reads =
            futures::future::join_all(names.iter().map(|name| self.api.get_opt(name))).await;
        let mut waiting = Vec::new();
        for ((kind, name), read) in Kind::ALL.into_iter().zip(&names).zip(reads) {
            match read {
                Ok(Some(found)) => {
                    if let Err(mismatch) = csr::check(kind, &found, &self.worker, lifetime) {
                        return Verification::Unverified(mismatch);
                    }
                }
                Ok(None) => waiting.push(format!("{name} not created yet")),
                Err(err) => waiting.push(format!(
                    "reading CSR {name} from workload cluster {} failed: {err}",
                    self.cluster
                )),
            }
        }
        if waiting.is_empty() {
            Verification::Verified
        } else {
            Verification::Pending(waiting.join("; "))
        }
    }

    /// Denies the CSRs of `seed` that are neither approved, denied nor failed.
    pub async fn deny(&self, seed: i64, why: &Mismatch) {
        for kind in Kind::ALL {
            let name = kind.name(seed);
            let result = match self.api.get_opt(&name).await {
                Ok(Some(found)) if undecided(&found) => {
                    let denied = with_denied(found, why);
                    self.api
                        .replace_subresource("approval", &name, &PostParams::default(), &denied)
                        .await
                        .map(drop)
                }
                Ok(_) => Ok(()),
                Err(err) => Err(err),
            };
            match result {
                Ok(()) => info!(
                    csr = name,
                    cluster = self.cluster,
                    "Denied a CSR of a refresh whose CSRs did not pass verification"
                ),
                Err(err) => {
                    warn!(csr = name, cluster = self.cluster, error = %err, "Denying a CSR that did not pass verification failed")
                }
            }
        }
    }
}

fn undecided(found: &CertificateSigningRequest) -> bool {
    let conditions = found.status.as_ref().and_then(|s| s.conditions.as_deref());
    !conditions
        .unwrap_or_default()
        .iter()
        .any(|c| c.status == "True" && matches!(c.type_.as_str(), "Approved" | "Denied" | "Failed"))
}

fn with_denied(mut found: CertificateSigningRequest, why: &Mismatch) -> CertificateSigningRequest {
    let status = found.status.get_or_insert_with(Default::default);
    status
        .conditions
        .get_or_insert_with(Vec::new)
        .push(CertificateSigningRequestCondition {
            type_: "Denied".into(),
            status: "True".into(),
            reason: Some(DENIED_REASON.into()),
            message: Some(crate::text::truncate(
                format!("ck8s-certs did not approve the CSRs of this refresh: {why}"),
                1000,
            )),
            last_update_time: Some(Time(jiff::Timestamp::now())),
            last_transition_time: None,
        });
    found
}
