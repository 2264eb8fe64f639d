//! Access to workload clusters from the management cluster.
//!
//! - [`Clients`]: a kube client per workload cluster, built from the `<cluster>-kubeconfig`
//!   Secret and cached until that Secret's resourceVersion changes (one GET per operation, no
//!   watch: least privilege is `get` on Secrets).
//! - [`tokens`]: the k8sd tokens of a Machine, read when needed and never cached or logged.
//! - [`endpoint`]: where a node's k8sd is: its InternalIP, microcluster port and route.

use std::collections::HashMap;
use std::sync::Mutex;

use ck8s_certs_api::{capi, k8sd};
use k8s_openapi::api::core::v1::Secret;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};

use crate::k8sd::Token;

pub mod credentials;
pub mod endpoint;

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
            // A node without an address or proxy pod yet is usually still starting.
            Self::Node(_) => true,
        }
    }
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
    cache: Mutex<HashMap<(String, String), Cached>>,
}

struct Cached {
    /// The kubeconfig Secret's resourceVersion the client was built from.
    version: String,
    client: Client,
    used: std::time::Instant,
}

impl Clients {
    pub const IDLE: std::time::Duration = std::time::Duration::from_secs(600);
    pub const MAX: usize = 64;

    pub fn new(management: Client) -> Self {
        Self {
            management,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The cached client for `key` built from `version`, if any; evicts idle clients.
    fn cached(&self, key: &(String, String), version: &str) -> Option<Client> {
        let mut cache = self.cache.lock().ok()?;
        cache.retain(|_, c| c.used.elapsed() < Self::IDLE);
        let cached = cache.get_mut(key).filter(|c| c.version == version)?;
        cached.used = std::time::Instant::now();
        Some(cached.client.clone())
    }

    fn insert(&self, key: (String, String), version: String, client: Client) {
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
            },
        );
    }

    /// The client of `cluster` in `namespace`; rebuilt when its kubeconfig Secret changed.
    /// Credentials that have expired are refused here with the Secret and the date, rather than
    /// by the workload API server with a bare TLS error.
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
        let kubeconfig = kubeconfig_of(&secret, namespace)?;
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
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| bad(e.to_string()))?;
        // A workload API server that stops answering must not stall a refresh forever.
        config.connect_timeout = Some(std::time::Duration::from_secs(10));
        config.read_timeout = Some(std::time::Duration::from_secs(60));
        let client = Client::try_from(config).map_err(|e| bad(e.to_string()))?;
        self.insert(key, version, client.clone());
        Ok(client)
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

/// The kubeconfig a `<cluster>-kubeconfig` Secret holds.
pub fn kubeconfig_of(secret: &Secret, namespace: &str) -> Result<Kubeconfig, WorkloadError> {
    let yaml = secret_value(secret, namespace, capi::KUBECONFIG_SECRET_KEY, "")?;
    Kubeconfig::from_yaml(&yaml).map_err(|e| WorkloadError::Kubeconfig {
        namespace: namespace.to_owned(),
        name: secret.metadata.name.clone().unwrap_or_default(),
        reason: e.to_string(),
    })
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
