//! What a workload cluster's kubeconfig may ask of the controller.
//!
//! `<cluster>-kubeconfig` is written by whoever may write Secrets in the cluster's namespace, but
//! it is used inside the controller's pod, with the controller's files, binaries and network.
//! kube-rs honours everything a kubeconfig can say, so without this vetting a tenant could point
//! `tokenFile` at the controller's own service-account token and `server` at a host of theirs,
//! or have `exec` run a command in the controller's pod. Only what the CK8s control-plane
//! provider writes is accepted: the current context's cluster with an https `server` and, if
//! any, an inline CA; its user with inline credentials (`client-certificate-data` and
//! `client-key-data`, or `token`). `exec` only with `--insecure-kubeconfig-exec`.
//!
//! Only the current context is vetted: kube-rs uses nothing else (the controller never selects
//! another context). Reasons name the field and the fix, never a value of the kubeconfig.

use kube::config::{AuthInfo, Cluster, Kubeconfig, KubeconfigError};

/// What the controller allows beyond inline credentials.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Vetting {
    /// `--insecure-kubeconfig-exec`: users may run an `exec` credential plugin.
    pub allow_exec: bool,
}

/// One thing the controller will not do for a kubeconfig.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("it sets no `current-context`: name the context to use")]
    NoCurrentContext,
    #[error(
        "its `current-context` names no entry of `contexts` (with a `context`): add that context"
    )]
    UnknownContext,
    #[error(
        "the current context's `cluster` names no entry of `clusters` (with a `cluster`): add that cluster"
    )]
    UnknownCluster,
    #[error(
        "the current context's cluster has no `server`: set it to the workload API server's https:// URL"
    )]
    NoServer,
    #[error(
        "the current context's cluster has a `server` that is not an https:// URL: set it to the workload API server's https:// URL"
    )]
    ServerNotHttps,
    #[error(
        "`certificate-authority` names a file in the controller's pod: inline the CA as `certificate-authority-data` (base64 PEM)"
    )]
    CertificateAuthorityFile,
    #[error(
        "`proxy-url` would send the workload API traffic through another host: remove it (the controller connects to `server` directly)"
    )]
    ProxyUrl,
    #[error(
        "the current context names no `user`: add a user with inline credentials (`client-certificate-data` and `client-key-data`, or `token`)"
    )]
    NoUser,
    #[error(
        "the current context's `user` names no entry of `users` (with a `user`): add that user with inline credentials (`client-certificate-data` and `client-key-data`, or `token`)"
    )]
    UnknownUser,
    #[error(
        "`exec` would run a command in the controller's pod: write inline credentials instead (`client-certificate-data` and `client-key-data`, or `token`), as the CK8s control-plane provider does, or start the controller with --insecure-kubeconfig-exec if everyone who may write this Secret is trusted"
    )]
    Exec,
    #[error(
        "`auth-provider` would run an authentication provider in the controller's pod: write inline credentials instead (`client-certificate-data` and `client-key-data`, or `token`)"
    )]
    AuthProvider,
    #[error("`tokenFile` names a file in the controller's pod: put the token itself in `token`")]
    TokenFile,
    #[error(
        "`token` holds a character an HTTP header cannot carry (a line break or another control character): put the bare token there"
    )]
    TokenNotHeader,
    #[error(
        "`client-certificate` names a file in the controller's pod: inline the certificate as `client-certificate-data` (base64 PEM)"
    )]
    ClientCertificateFile,
    #[error(
        "`client-key` names a file in the controller's pod: inline the key as `client-key-data` (base64 PEM)"
    )]
    ClientKeyFile,
    #[error(
        "`{0}` (basic authentication) is not supported: use a client certificate (`client-certificate-data` and `client-key-data`) or a `token`"
    )]
    BasicAuth(&'static str),
    #[error(
        "`{0}` (impersonation) would act as another identity: remove it; the user's own credentials must carry the rights"
    )]
    Impersonation(&'static str),
    #[error(
        "`client-certificate-data` has no `client-key-data`: set both, or use a `token` instead"
    )]
    CertificateWithoutKey,
    #[error(
        "`client-key-data` has no `client-certificate-data`: set both, or use a `token` instead"
    )]
    KeyWithoutCertificate,
    #[error(
        "the current context's user has no credentials: set `client-certificate-data` and `client-key-data`, or `token`"
    )]
    NoCredentials,
}

/// Every [`Refusal`] of a kubeconfig (so that one edit fixes them all).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct Refused(pub Vec<Refusal>);

/// Accepts `kubeconfig` if the client kube-rs would build from it (current context, default
/// options) uses nothing but its `server`, an inline CA and inline credentials.
pub fn vet(kubeconfig: &Kubeconfig, vetting: Vetting) -> Result<(), Refused> {
    let refused = |refusal| Err(Refused(vec![refusal]));
    // Looked up as kube-rs does: the first entry of that name.
    let Some(context_name) = kubeconfig.current_context.as_deref() else {
        return refused(Refusal::NoCurrentContext);
    };
    let Some(context) = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
    else {
        return refused(Refusal::UnknownContext);
    };
    let Some(cluster) = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref())
    else {
        return refused(Refusal::UnknownCluster);
    };
    let mut refusals = vet_cluster(cluster);
    match context.user.as_deref() {
        // kube-rs would go on without credentials: say what is missing instead.
        None => refusals.push(Refusal::NoUser),
        Some(name) => match kubeconfig
            .auth_infos
            .iter()
            .find(|a| a.name == name)
            .and_then(|a| a.auth_info.as_ref())
        {
            None => refusals.push(Refusal::UnknownUser),
            Some(user) => refusals.extend(vet_user(user, vetting)),
        },
    }
    if refusals.is_empty() {
        Ok(())
    } else {
        Err(Refused(refusals))
    }
}

fn vet_cluster(cluster: &Cluster) -> Vec<Refusal> {
    let mut refusals = Vec::new();
    match cluster.server.as_deref().map(str::trim) {
        None | Some("") => refusals.push(Refusal::NoServer),
        Some(server) if !is_https(server) => refusals.push(Refusal::ServerNotHttps),
        Some(_) => {}
    }
    if cluster.certificate_authority.is_some() {
        refusals.push(Refusal::CertificateAuthorityFile);
    }
    if cluster.proxy_url.is_some() {
        refusals.push(Refusal::ProxyUrl);
    }
    refusals
}

fn is_https(server: &str) -> bool {
    server.parse::<http::Uri>().is_ok_and(|uri| {
        uri.scheme_str()
            .is_some_and(|s| s.eq_ignore_ascii_case("https"))
            && uri.host().is_some_and(|h| !h.is_empty())
    })
}

fn vet_user(user: &AuthInfo, vetting: Vetting) -> Vec<Refusal> {
    let mut refusals = Vec::new();
    if user.exec.is_some() && !vetting.allow_exec {
        refusals.push(Refusal::Exec);
    }
    if user.auth_provider.is_some() {
        refusals.push(Refusal::AuthProvider);
    }
    if user.token_file.is_some() {
        refusals.push(Refusal::TokenFile);
    }
    if user.client_certificate.is_some() {
        refusals.push(Refusal::ClientCertificateFile);
    }
    if user.client_key.is_some() {
        refusals.push(Refusal::ClientKeyFile);
    }
    if user.username.is_some() {
        refusals.push(Refusal::BasicAuth("username"));
    }
    if user.password.is_some() {
        refusals.push(Refusal::BasicAuth("password"));
    }
    for (field, set) in [
        ("as", user.impersonate.is_some()),
        ("as-uid", user.impersonate_uid.is_some()),
        ("as-groups", user.impersonate_groups.is_some()),
        ("as-user-extra", user.impersonate_user_extra.is_some()),
    ] {
        if set {
            refusals.push(Refusal::Impersonation(field));
        }
    }
    // Present counts, empty or not: kube-rs would use an empty value as it is.
    let certificate = user.client_certificate_data.is_some();
    let key = user.client_key_data.is_some();
    let token = user.token.is_some();
    match (certificate, key) {
        (true, false) => refusals.push(Refusal::CertificateWithoutKey),
        (false, true) => refusals.push(Refusal::KeyWithoutCertificate),
        _ => {}
    }
    // kube-rs sends it as `Authorization: Bearer <token>` and panics building the client when a
    // header cannot carry it (found by `make fuzz`).
    if token && !token_fits_a_header(user) {
        refusals.push(Refusal::TokenNotHeader);
    }
    // Only when nothing else was refused: a refused source of credentials is the news.
    let exec = user.exec.is_some() && vetting.allow_exec;
    let credentials = (certificate && key) || token || exec;
    if refusals.is_empty() && !credentials {
        refusals.push(Refusal::NoCredentials);
    }
    refusals
}

/// Whether `Authorization: Bearer <token>` is a valid header value. The token is a
/// `SecretString`; its serialised form is read, as this crate does not depend on `secrecy`.
fn token_fits_a_header(user: &AuthInfo) -> bool {
    serde_json::to_value(user)
        .ok()
        .as_ref()
        .and_then(|user| user.get("token"))
        .and_then(serde_json::Value::as_str)
        .is_some_and(|token| http::HeaderValue::from_str(&format!("Bearer {token}")).is_ok())
}

/// Why `Kubeconfig::from_yaml` failed, without the text of the error (the YAML parser quotes
/// the input, which may be a key or a token): where, if the parser knows.
pub fn parse_error_reason(error: &KubeconfigError) -> String {
    let what = "the value of key `value` is not a kubeconfig (YAML)";
    match error {
        KubeconfigError::Parse(e) => match e.location() {
            Some(at) => format!("{what}; line {}, column {}", at.line(), at.column()),
            None => what.to_owned(),
        },
        KubeconfigError::KindMismatch | KubeconfigError::ApiVersionMismatch => {
            "the value of key `value` holds several YAML documents that cannot be merged into one kubeconfig: keep one".to_owned()
        }
        _ => what.to_owned(),
    }
}

#[cfg(test)]
mod tests;
