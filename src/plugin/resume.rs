//! `kubectl ck8s-certs resume <policy>`: resumes a CertificateRenewalPolicy's automatic renewals
//! after its circuit breaker opened. It writes the resume annotation and who asks (the user the
//! API server authenticates, from a SelfSubjectReview); the controller records both in the
//! policy's status, announces it and removes them. The requester-annotation admission policy
//! lets the annotation name only the writer, so the record cannot name someone else.

use std::io::Write;

use ck8s_certs_api::annotations::{REQUESTER, RESUME_RENEWALS};
use ck8s_certs_api::renewal_policy::CertificateRenewalPolicy;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

use super::{PluginError, Session};

#[derive(Debug, clap::Args)]
pub struct ResumeArgs {
    /// The CertificateRenewalPolicy (in --namespace).
    pub policy: String,
}

pub async fn run(
    session: &Session,
    args: &ResumeArgs,
    out: &mut impl Write,
) -> Result<(), PluginError> {
    let (client, namespace) = (&session.client, &session.namespace);
    let policies: Api<CertificateRenewalPolicy> = Api::namespaced(client.clone(), namespace);
    let Some(policy) = policies.get_opt(&args.policy).await? else {
        return Err(PluginError::NotFound(format!(
            "CertificateRenewalPolicy {namespace}/{} not found",
            args.policy
        )));
    };
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    let Some(user) = review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
    else {
        return Err(PluginError::Failed(
            "the API server did not say who you are (SelfSubjectReview): the resume would not be attributed".into(),
        ));
    };
    let at = jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .unwrap_or_else(|_| jiff::Timestamp::now());
    let patch = serde_json::json!({
        "metadata": { "annotations": { RESUME_RENEWALS: at.to_string(), REQUESTER: user } }
    });
    policies
        .patch(&args.policy, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|err| match err {
            kube::Error::Api(status) if status.code == 403 => PluginError::Forbidden(format!(
                "you may not resume CertificateRenewalPolicy {namespace}/{}: {}",
                args.policy, status.message
            )),
            other => PluginError::Api(other),
        })?;
    let breaker = policy.status.and_then(|s| s.breaker);
    let state = match breaker.as_ref().and_then(|b| b.opened_at.as_ref()) {
        Some(since) => format!("its circuit breaker, open since {}, closes", since.0),
        None => "its circuit breaker was closed; failures before now no longer count".to_owned(),
    };
    writeln!(
        out,
        "certificaterenewalpolicy {namespace}/{}: resumed as {user} ({state}); `kubectl get crp -n {namespace} {} -o yaml` shows status.breaker",
        args.policy, args.policy
    )?;
    Ok(())
}
