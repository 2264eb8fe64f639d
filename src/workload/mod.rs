//! Access to workload clusters from the management cluster.
//!
//! - [`Clients`]: a kube client per workload cluster, built from the `<cluster>-kubeconfig`
//!   Secret once [`kubeconfig::vet`] accepts it, and cached until that Secret's resourceVersion
//!   changes or the workload API server answers 401 (one GET per operation, no watch: least
//!   privilege is `get` on Secrets).
//! - [`tokens`]: the k8sd tokens of a Machine, read when needed and never cached or logged.
//! - [`endpoint`]: where a node's k8sd is: its InternalIP, microcluster port and route.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use ck8s_certs_api::{capi, k8sd};
use k8s_openapi::api::core::v1::Secret;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};

use crate::k8sd::Token;

mod bounded;
pub mod client_certificate;
pub mod credentials;
pub mod csrs;
pub mod endpoint;
pub mod kubeconfig;

pub use kubeconfig::Vetting;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("reading Secret {namespace}/{name} failed: {source}")]
    Secret {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("Secret {namespace}/{name} has no key {key:?}{hint}")]
    MissingKey {
        namespace: String,
        name: String,
        key: String,
        hint: &'static str,
    },
    #[error("the kubeconfig in Secret {namespace}/{name} is unusable: {reason}")]
    Kubeconfig {
        namespace: String,
        name: String,
        reason: String,
    },
    #[error(
        "the {certificate} in Secret {namespace}/{name} expired at {at}: the workload cluster's API server refuses it. Renew that kubeconfig (docs/troubleshooting.md, \"The management kubeconfig expired\")"
    )]
    KubeconfigExpired {
        namespace: String,
        name: String,
        certificate: &'static str,
        at: jiff::Timestamp,
    },
    #[error("reading {what} from workload cluster {cluster} failed: {source}")]
    Api {
        cluster: String,
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "the API server of workload cluster {cluster} serves a certificate that expired{}: nothing can be read through it until a control plane is refreshed (a control plane whose k8sd certificate is pinned is reached directly meanwhile; docs/refresh.md, \"When certificates have already expired\")",
        at.map(|at| format!(" at {at}")).unwrap_or_default()
    )]
    ApiCertificateExpired {
        cluster: String,
        at: Option<jiff::Timestamp>,
    },
    #[error("{0}")]
    Node(String),
}

impl WorkloadError {
    /// Whether a later attempt may succeed on its own (API hiccups), as opposed to a
    /// misconfiguration a person must fix.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Secret { source, .. } | Self::Api { source, .. } => match source {
                kube::Error::Api(status) => status.code >= 500 || status.code == 429,
                _ => true,
            },
            Self::MissingKey { .. } | Self::Kubeconfig { .. } | Self::KubeconfigExpired { .. } => {
                false
            }
            // A control plane's refresh renews it: a worker's refresh waits for that (control
            // planes themselves are reached directly meanwhile).
            Self::ApiCertificateExpired { .. } => true,
            // A node without an address or proxy pod yet is usually still starting.
            Self::Node(_) => true,
        }
    }
}

impl WorkloadError {
    /// Whether a workload API read failed because the API server's certificate has expired (a
    /// cluster switched off past its expiry): `Some`, with the certificate's NotAfter when TLS
    /// told it.
    pub fn server_certificate_expired(&self) -> Option<Option<jiff::Timestamp>> {
        match self {
            Self::ApiCertificateExpired { at, .. } => Some(*at),
            Self::Api { source, .. } => expired_certificate(source),
            _ => None,
        }
    }

    /// A failed read of `what` from workload cluster `cluster`, named for what it is when the
    /// API server's certificate expired.
    pub fn api(cluster: &str, what: String, source: kube::Error) -> Self {
        match expired_certificate(&source) {
            Some(at) => Self::ApiCertificateExpired {
                cluster: cluster.to_owned(),
                at,
            },
            None => Self::Api {
                cluster: cluster.to_owned(),
                what,
                source,
            },
        }
    }
}

/// Finds an expired-certificate TLS error in `error`'s chain. `io::Error::source` skips the
/// error it wraps (it returns that error's source), so an io::Error is followed into what it
/// wraps instead.
pub fn expired_certificate(
    error: &(dyn std::error::Error + 'static),
) -> Option<Option<jiff::Timestamp>> {
    use rustls::CertificateError;
    let mut next = Some(error);
    while let Some(error) = next {
        match error.downcast_ref::<rustls::Error>() {
            Some(rustls::Error::InvalidCertificate(CertificateError::Expired)) => {
                return Some(None);
            }
            Some(rustls::Error::InvalidCertificate(CertificateError::ExpiredContext {
                not_after,
                ..
            })) => {
                let seconds = i64::try_from(not_after.as_secs()).ok();
                return Some(seconds.and_then(|s| jiff::Timestamp::from_second(s).ok()));
            }
            Some(_) => return None,
            None => {}
        }
        // tokio-rustls wraps the TLS error in an io::Error, which hyper-rustls wraps in another.
        next = match error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => error.source(),
        };
    }
    None
}

async fn get_secret(mgmt: &Client, namespace: &str, name: &str) -> Result<Secret, WorkloadError> {
    let secrets: Api<Secret> = Api::namespaced(mgmt.clone(), namespace);
    secrets
        .get(name)
        .await
        .map_err(|source| WorkloadError::Secret {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            source,
        })
}

fn secret_value(
    secret: &Secret,
    namespace: &str,
    key: &str,
    hint: &'static str,
) -> Result<String, WorkloadError> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| WorkloadError::MissingKey {
            namespace: namespace.to_owned(),
            name,
            key: key.to_owned(),
            hint,
        })
}

/// Workload cluster clients, cached per cluster while refreshes use them: a client (and its
/// connections) idle for [`Clients::IDLE`] is dropped, and at most [`Clients::MAX`] are kept
/// (the least recently used goes first), so a fleet of hundreds of clusters holds clients only
/// for those being refreshed.
pub struct Clients {
    management: Client,
    vetting: Vetting,
    cache: Arc<Cache>,
    /// Tells the clients apart, so that a late 401 of a replaced client does not evict the new.
    next_id: AtomicU64,
}

type Key = (String, String);
type Cache = Mutex<HashMap<Key, Cached>>;

struct Cached {
    /// The kubeconfig Secret's resourceVersion the client was built from.
    version: String,
    client: Client,
    used: std::time::Instant,
    id: u64,
}

impl Clients {
    pub const IDLE: std::time::Duration = std::time::Duration::from_secs(600);
    pub const MAX: usize = 64;

    pub fn new(management: Client, vetting: Vetting) -> Self {
        Self {
            management,
            vetting,
            cache: Arc::new(Mutex::new(HashMap::new())),
            next_id: AtomicU64::new(0),
        }
    }

    /// The cached client for `key` built from `version`, if any; evicts idle clients.
    fn cached(&self, key: &Key, version: &str) -> Option<Client> {
        let mut cache = self.cache.lock().ok()?;
        cache.retain(|_, c| c.used.elapsed() < Self::IDLE);
        let cached = cache.get_mut(key).filter(|c| c.version == version)?;
        cached.used = std::time::Instant::now();
        Some(cached.client.clone())
    }

    fn insert(&self, key: Key, version: String, client: Client, id: u64) {
        let Ok(mut cache) = self.cache.lock() else {
            return;
        };
        if !cache.contains_key(&key) && cache.len() >= Self::MAX {
            let oldest = cache
                .iter()
                .min_by_key(|(_, c)| c.used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                cache.remove(&oldest);
            }
        }
        cache.insert(
            key,
            Cached {
                version,
                client,
                used: std::time::Instant::now(),
                id,
            },
        );
    }

    /// Drops the cached client of `cluster` in `namespace`: the next [`Clients::get`] builds it
    /// again from the Secret. Clients built here forget themselves when the workload API server
    /// answers 401 Unauthorized (credentials revoked or rotated).
    pub fn forget(&self, namespace: &str, cluster: &str) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.remove(&(namespace.to_owned(), cluster.to_owned()));
        }
    }

    /// The client of `cluster` in `namespace`; rebuilt when its kubeconfig Secret changed.
    /// A kubeconfig that would make the controller read its own files, run a command or act as
    /// another identity is refused before anything is built ([`kubeconfig::vet`]). Credentials
    /// that have expired are refused here with the Secret and the date, rather than by the
    /// workload API server with a bare TLS error.
    pub async fn get(&self, namespace: &str, cluster: &str) -> Result<Client, WorkloadError> {
        let name = capi::kubeconfig_secret_name(cluster);
        let secret = get_secret(&self.management, namespace, &name).await?;
        let version = secret.metadata.resource_version.clone().unwrap_or_default();
        let key = (namespace.to_owned(), cluster.to_owned());
        let bad = |reason: String| WorkloadError::Kubeconfig {
            namespace: namespace.to_owned(),
            name: name.clone(),
            reason,
        };
        let kubeconfig = kubeconfig_of(&secret, namespace, self.vetting)?;
        if let Some((certificate, at)) = credentials::kubeconfig_expiry(&kubeconfig)
            .map_err(&bad)?
            .expired(jiff::Timestamp::now())
        {
            return Err(WorkloadError::KubeconfigExpired {
                namespace: namespace.to_owned(),
                name,
                certificate: certificate.describe(),
                at,
            });
        }
        if let Some(client) = self.cached(&key, &version) {
            return Ok(client);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let forget = ForgetOnUnauthorized {
            cache: Arc::downgrade(&self.cache),
            key: key.clone(),
            id,
        };
        let client = build(kubeconfig, &forget)
            .await
            .map_err(|r| bad(r.to_owned()))?;
        self.insert(key, version, client.clone(), id);
        Ok(client)
    }
}

/// A client of the kubeconfig `yaml` (vetted), cached nowhere: to try a credential before it
/// is written. The error names fields only.
pub async fn probe_client(yaml: &str, vetting: Vetting) -> Result<Client, String> {
    let kubeconfig = Kubeconfig::from_yaml(yaml).map_err(|e| kubeconfig::parse_error_reason(&e))?;
    kubeconfig::vet(&kubeconfig, vetting).map_err(|e| e.to_string())?;
    uncached_client(kubeconfig).await
}

/// [`probe_client`] of a kubeconfig already read and vetted ([`kubeconfig_of`]).
pub async fn uncached_client(kubeconfig: Kubeconfig) -> Result<Client, String> {
    let forget_nothing = ForgetOnUnauthorized {
        cache: Weak::new(),
        key: Default::default(),
        id: 0,
    };
    build(kubeconfig, &forget_nothing)
        .await
        .map_err(str::to_owned)
}

/// A client of a vetted kubeconfig, with `forget` as its outermost layer. The error is a fixed
/// reason: kube-rs's texts may quote the kubeconfig (PEM, paths, names).
async fn build(
    kubeconfig: Kubeconfig,
    forget: &ForgetOnUnauthorized,
) -> Result<Client, &'static str> {
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| config_error_reason(&e))?;
    // A workload API server that stops answering must not stall a refresh forever.
    config.connect_timeout = Some(std::time::Duration::from_secs(10));
    config.read_timeout = Some(std::time::Duration::from_secs(60));
    Ok(kube::client::ClientBuilder::try_from(config)
        .map_err(|e| client_error_reason(&e))?
        .with_layer(&bounded::BoundedLayer(bounded::Bounds::default()))
        .with_layer(forget)
        .build())
}

/// Why kube-rs could not make a configuration of a vetted kubeconfig, naming fields only.
fn config_error_reason(error: &kube::config::KubeconfigError) -> &'static str {
    use kube::config::KubeconfigError as E;
    match error {
        E::MissingClusterUrl | E::ParseClusterUrl(_) => {
            "`server` is not a valid URL: set it to the workload API server's https:// URL"
        }
        E::LoadCertificateAuthority(_) | E::ParseCertificates(_) => {
            "`certificate-authority-data` is not base64-encoded PEM certificates"
        }
        E::LoadClientCertificate(_) => "`client-certificate-data` is not base64-encoded PEM",
        E::LoadClientKey(_) => "`client-key-data` is not base64-encoded PEM",
        _ => {
            "kube-rs cannot make a client configuration of it (its error is not shown: it may quote the kubeconfig)"
        }
    }
}

/// Why kube-rs could not build a client of a vetted kubeconfig's configuration.
fn client_error_reason(error: &kube::Error) -> &'static str {
    match error {
        kube::Error::RustlsTls(_) => {
            "the TLS set-up failed: check `client-certificate-data` and `client-key-data` (base64 PEM; the key PKCS#8, RSA or EC), `certificate-authority-data` and `tls-server-name`"
        }
        kube::Error::Auth(_) => "the user's credentials cannot be loaded",
        // The client identity is loaded only now.
        kube::Error::InferKubeconfig(e) => config_error_reason(e),
        _ => {
            "kube-rs cannot build a client of it (its error is not shown: it may quote the kubeconfig)"
        }
    }
}

/// A layer of each workload client: a 401 Unauthorized from the workload API server forgets
/// that client, so the next use builds it again from the Secret (the Secret may have been
/// rotated meanwhile, or a freshly built client may authenticate again). Every request of the
/// client passes here, port-forwards included, so no caller has to remember it.
#[derive(Clone)]
struct ForgetOnUnauthorized {
    /// Weak: the cache holds the client that holds this layer.
    cache: Weak<Cache>,
    key: Key,
    id: u64,
}

impl ForgetOnUnauthorized {
    fn forget(&self) {
        let Some(cache) = self.cache.upgrade() else {
            return;
        };
        let Ok(mut cache) = cache.lock() else {
            return;
        };
        // Only the client that got the 401, not one built since.
        if cache.get(&self.key).is_some_and(|c| c.id == self.id) {
            cache.remove(&self.key);
            tracing::info!(
                namespace = self.key.0,
                cluster = self.key.1,
                "The workload API server answered 401 Unauthorized: the cluster's client is built again from its kubeconfig Secret at the next use"
            );
        }
    }
}

impl<S> tower::Layer<S> for ForgetOnUnauthorized {
    type Service = ForgetOnUnauthorizedService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ForgetOnUnauthorizedService {
            inner,
            forget: self.clone(),
        }
    }
}

struct ForgetOnUnauthorizedService<S> {
    inner: S,
    forget: ForgetOnUnauthorized,
}

impl<S, Request, Body> tower::Service<Request> for ForgetOnUnauthorizedService<S>
where
    S: tower::Service<Request, Response = http::Response<Body>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    Body: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let response = self.inner.call(request);
        let forget = self.forget.clone();
        Box::pin(async move {
            let response = response.await?;
            if response.status() == http::StatusCode::UNAUTHORIZED {
                forget.forget();
            }
            Ok(response)
        })
    }
}

/// `<cluster>-kubeconfig` as read.
pub async fn kubeconfig_secret(
    mgmt: &Client,
    namespace: &str,
    cluster: &str,
) -> Result<Secret, WorkloadError> {
    get_secret(mgmt, namespace, &capi::kubeconfig_secret_name(cluster)).await
}

/// The kubeconfig a `<cluster>-kubeconfig` Secret holds, once [`kubeconfig::vet`] accepts it.
/// Neither a parse error nor a refusal quotes the kubeconfig.
pub fn kubeconfig_of(
    secret: &Secret,
    namespace: &str,
    vetting: Vetting,
) -> Result<Kubeconfig, WorkloadError> {
    let yaml = secret_value(secret, namespace, capi::KUBECONFIG_SECRET_KEY, "")?;
    let bad = |reason: String| WorkloadError::Kubeconfig {
        namespace: namespace.to_owned(),
        name: secret.metadata.name.clone().unwrap_or_default(),
        reason,
    };
    let kubeconfig =
        Kubeconfig::from_yaml(&yaml).map_err(|e| bad(kubeconfig::parse_error_reason(&e)))?;
    kubeconfig::vet(&kubeconfig, vetting).map_err(|e| bad(e.to_string()))?;
    Ok(kubeconfig)
}

/// The two k8sd tokens a refresh of `machine` needs.
pub struct Tokens {
    pub node: Token,
    pub capi_auth: Token,
}

/// Reads `<cluster>-token`: `node-token-<machine>` and `value`.
pub async fn tokens(
    mgmt: &Client,
    namespace: &str,
    cluster: &str,
    machine: &str,
) -> Result<Tokens, WorkloadError> {
    let secret = get_secret(mgmt, namespace, &k8sd::token_secret_name(cluster)).await?;
    let hint = " (the CK8s bootstrap provider writes it when the node joins)";
    Ok(Tokens {
        node: Token::new(secret_value(
            &secret,
            namespace,
            &k8sd::node_token_key(machine),
            hint,
        )?),
        capi_auth: Token::new(secret_value(
            &secret,
            namespace,
            k8sd::CAPI_AUTH_TOKEN_KEY,
            hint,
        )?),
    })
}

#[cfg(test)]
mod tests;
