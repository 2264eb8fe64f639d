//! The circuit breakers as the policy controller keeps them (the rules: `crate::policy::breaker`):
//! the failures read from the MachineCertificates cache, a resume read from the policy's
//! annotations (left in place: each new value resumes once, so the controller needs no write of
//! the policy itself) and attributed, and what is announced when a breaker is resumed.

use ck8s_certs_api::annotations::{REQUESTER, RESUME_RENEWALS};
use ck8s_certs_api::machine::Machine;
use ck8s_certs_api::renewal_policy::BreakerStatus;
use jiff::{SignedDuration, Timestamp};
use kube::api::DynamicObject;
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};

use crate::controllers::admission_policy::{self, NotInForce};
use crate::controllers::stores::{self, CertificateStore};
use crate::policy::breaker::{Failure, Limit, Resume};

/// The fleet-wide breaker and how resumes are attributed (flags).
#[derive(Clone, Debug)]
pub struct Settings {
    /// `--fleet-breaker-failures` within `--fleet-breaker-period` (0 failures: off).
    pub fleet: Limit,
    /// The admission policy that lets `certificates.ck8s.io/requester` name only its writer
    /// (`--requester-policy`); `None`: not checked.
    pub requester_policy: Option<String>,
}

/// The failed automatic renewals of the last `period` up to `now` (of this shard's Machines),
/// each with the policy that governed it (`namespace/name`).
pub fn failures(
    certificates: &CertificateStore,
    machines: &Store<Machine>,
    capi: ck8s_certs_api::machine::CapiVersion,
    period: SignedDuration,
    now: Timestamp,
) -> Vec<(Option<String>, Failure)> {
    let after = now.checked_sub(period).unwrap_or(Timestamp::MIN);
    certificates
        .failed_after(after)
        .into_iter()
        .filter_map(|(namespace, name, cached)| {
            let at = cached.last_failure()?;
            let status = cached.status().ok().flatten()?;
            let policy = status
                .renewal
                .as_ref()
                .and_then(|r| r.policy_ref.as_ref())
                .map(|p| format!("{namespace}/{}", p.name));
            let cluster = stores::get_capi(machines, capi, &namespace, &name)
                .and_then(|m| m.cluster().map(str::to_owned));
            let message = status.operation.and_then(|op| op.error).unwrap_or_default();
            let failure = Failure {
                machine: format!("{namespace}/{name}"),
                cluster,
                at,
                message,
            };
            Some((policy, failure))
        })
        .collect()
}

/// A resume newly asked for on `policy` (its annotation, with a value `breaker` has not acted
/// on), attributed: to the user its `certificates.ck8s.io/requester` names when the admission
/// policy that lets it name only its writer was in force at the policy's last write; said
/// unverified otherwise.
pub async fn resume(
    client: &Client,
    settings: &Settings,
    policy: &DynamicObject,
    breaker: Option<&BreakerStatus>,
) -> Result<Option<Resume>, kube::Error> {
    let annotations = policy.annotations();
    let Some(request) = annotations.get(RESUME_RENEWALS) else {
        return Ok(None);
    };
    if breaker.and_then(|b| b.resume_request.as_ref()) == Some(request) {
        return Ok(None);
    }
    let request = request.clone();
    let named = annotations.get(REQUESTER).cloned();
    let by = match (named, &settings.requester_policy) {
        (None, _) => format!("someone who did not say ({REQUESTER} not set)"),
        (Some(user), None) => user,
        (Some(user), Some(admission)) => {
            let written = admission_policy::last_written(&policy.metadata);
            match admission_policy::in_force(client, admission, written).await? {
                Ok(()) => user,
                Err(NotInForce::Missing(kind)) => {
                    format!("{user} (unverified: {kind} {admission} is not installed)")
                }
                Err(NotInForce::Younger { since, .. }) => {
                    format!(
                        "{user} (unverified: written before {admission} was in force at {since})"
                    )
                }
            }
        }
    };
    Ok(Some(Resume { by, request }))
}

/// The Event of a resume.
pub fn resumed_message(breaker: &BreakerStatus, was_open: bool) -> String {
    let by = breaker.resumed_by.as_deref().unwrap_or("someone");
    match was_open {
        true => format!("Automatic renewals resumed by {by}: failures before now no longer count"),
        false => format!(
            "Resumed by {by} while automatic renewals were running: failures before now no longer count"
        ),
    }
}
