//! The canaries as the policy controller reports them: `status.canaries` (the generation they
//! are tried for, since when, how many renewed) and condition `CanariesPassed`, which says
//! whether the policy's other Machines renew or wait, and for what.

use ck8s_certs_api::renewal_policy::{CanaryStatus, CertificateRenewalPolicyStatus, reasons};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::DynamicObject;

use super::Context;
use crate::controllers::governing_policy::canary_machines;
use crate::policy::canary::{self, Hold, Standing};
use crate::policy::spec::{Settings, ValidPolicy};

/// What is reported of a policy's canaries.
pub struct Report {
    pub status: CanaryStatus,
    /// `CanariesPassed`: status, reason, message.
    pub condition: (&'static str, &'static str, String),
    /// When the report changes on its own (a wait ends).
    pub until: Option<jiff::Timestamp>,
}

/// The report on `policy`'s canaries at `now` (`None`: it has none configured).
pub fn report(
    ctx: &Context,
    object: &DynamicObject,
    policy: &ValidPolicy,
    old: &CertificateRenewalPolicyStatus,
    now: jiff::Timestamp,
) -> Option<Report> {
    let max_wait = policy.canary.as_ref()?.max_wait;
    let generation = object.metadata.generation;
    let since = old
        .canaries
        .as_ref()
        .filter(|c| c.generation == generation)
        .map_or(now, |c| c.since.0);
    let settings = Settings {
        strict: false,
        backoff: ctx.backoff,
    };
    let canaries = canary_machines(
        &ctx.machines,
        &ctx.clusters,
        &ctx.certificates,
        &object.namespace().unwrap_or_default(),
        policy,
        settings,
    );
    let standing = canary::standing(&canaries, since, max_wait, now);
    let renewed = canaries
        .iter()
        .filter(|c| c.renewed_at.is_some_and(|at| at >= since))
        .count();
    let (status, reason) = match &standing {
        Standing::NoCanaries => ("True", reasons::NO_CANARIES),
        Standing::Renewed => ("True", reasons::CANARIES_RENEWED),
        Standing::WaitElapsed => ("True", reasons::CANARY_WAIT_ELAPSED),
        Standing::Hold(Hold::Failed { .. }) => ("False", reasons::CANARY_FAILED),
        Standing::Hold(Hold::Pending { .. }) => ("False", reasons::CANARIES_PENDING),
    };
    let until = match &standing {
        Standing::Hold(hold) => hold.until(),
        _ => None,
    };
    Some(Report {
        status: CanaryStatus {
            generation,
            since: Time(since),
            machines: i32::try_from(canaries.len()).unwrap_or(i32::MAX),
            renewed: i32::try_from(renewed).unwrap_or(i32::MAX),
        },
        condition: (status, reason, standing.to_string()),
        until,
    })
}
