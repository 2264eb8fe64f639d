//! ck8s-certs: keeps the certificates of Canonical Kubernetes nodes alive in place, for Cluster
//! API management clusters.
//!
//! `run` connects to the management cluster, finds which Cluster API version it serves, serves
//! the health and metrics endpoints, waits to lead (`leader`), then runs the controllers until
//! a stop signal (`shutdown`): new work stops, work in flight gets a grace period while the
//! Lease is still renewed, then the Lease is released. `preview::run` is the offline
//! `policy preview` subcommand; `main` picks one of the two.

pub mod admission;
pub mod capi_version;
pub mod cli;
pub mod clock;
pub mod controllers;
pub mod events;
pub mod failpoint;
pub mod health;
pub mod k8sd;
pub mod leader;
pub mod metrics;
pub mod plugin;
pub mod policy;
pub mod preview;
pub mod refresh;
pub mod serving;
pub mod shutdown;
pub mod telemetry;
#[cfg(test)]
pub(crate) mod testing;
pub mod text;
pub mod workload;

use kube::Client;

/// Errors that stop the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "building a Kubernetes client failed (set --kubeconfig or KUBECONFIG, or run in a cluster): {0}"
    )]
    Client(#[source] kube::Error),
    #[error("reaching the management cluster's API server failed: {0}")]
    Connect(#[source] kube::Error),
    #[error(transparent)]
    Capi(#[from] capi_version::DiscoveryError),
    #[error("serving health or metrics endpoints on {address} failed: {source}")]
    Health {
        address: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid renewal backoff flags: {0}")]
    Backoff(#[from] policy::BackoffError),
    #[error("invalid TTL flags: {0}")]
    TtlBand(#[from] refresh::band::InvertedBand),
    #[error("invalid leader election flags: {0}")]
    LeaderElection(#[from] leader::SettingsError),
    #[error("installing the signal handler failed: {0}")]
    Signal(#[source] std::io::Error),
    #[error("stopped acting because leadership was lost ({0}); restart to stand by again")]
    LeadershipLost(#[from] leader::Lost),
    #[error(transparent)]
    Webhook(#[from] admission::StartError),
    #[error("the controllers stopped unexpectedly")]
    ControllersStopped,
    #[error("the leader election task failed: {0}")]
    LeaderTask(String),
}

/// The pod's name (`POD_NAME`, from the Downward API), where the process runs in one.
pub fn pod_name() -> Option<String> {
    std::env::var("POD_NAME").ok().filter(|n| !n.is_empty())
}

/// Runs the controller until SIGTERM or SIGINT (or, with leader election, until leadership is
/// lost, which is an error: the process exits and its restart stands by again).
pub async fn run(args: cli::Args) -> Result<(), Error> {
    let shutdown = shutdown::Shutdown::on_signals().map_err(Error::Signal)?;
    // Bad flags fail before anything is served.
    let backoff = policy::Backoff::new(args.renewal_backoff_min, args.renewal_backoff_max)?;
    let renewal = policy::spec::Settings {
        strict: args.renewal_window_strict,
        backoff,
    };
    let band = refresh::band::TtlBand::new(args.min_ttl, args.max_ttl)?;
    let client = client(&args).await?;
    let mut elector = match args.leader_elect {
        true => Some(leader::Elector::new(
            client.clone(),
            leader_settings(&args, &client),
        )?),
        false => None,
    };
    let version = client.apiserver_version().await.map_err(Error::Connect)?;
    let machines = capi_version::discover(&client).await?;
    tracing::info!(
        kubernetes = %version.git_version,
        machine_api = %format!("{}/{}", ck8s_certs_api::capi::GROUP, machines.as_str()),
        namespace = args.namespace.as_deref().unwrap_or("<all>"),
        "Connected to the management cluster"
    );

    let not_bound = |address| move |source| Error::Health { address, source };
    let health = health::Health::default();
    let server = health::serve(args.health_bind_address, health.clone())
        .await
        .map_err(not_bound(args.health_bind_address))?;

    let metrics = std::sync::Arc::new(metrics::Metrics::default());
    let metrics_server = metrics::serve(args.metrics_bind_address, metrics.clone())
        .await
        .map_err(not_bound(args.metrics_bind_address))?;

    // Every replica serves the webhook: refresh requests must be marked whoever leads.
    let webhook = match args.webhook {
        true => {
            Some(admission::start(&client, webhook_settings(&args, &client, band, backoff)).await?)
        }
        false => None,
    };

    if let Some(elector) = &mut elector {
        // A standby is ready: it is connected and takes over when the leader goes.
        health.set_ready(true);
        tokio::select! {
            () = elector.acquire() => {}
            () = shutdown.stop.cancelled() => {
                tracing::info!("Stopped while standing by");
                return Ok(());
            }
        }
        // Not ready again until the caches are synced.
        health.set_ready(false);
        metrics.leader.set(1);
    }

    // Operations we carry out name our Lease, so other --watch-filter shards leave them to us.
    let carrier = elector
        .as_ref()
        .map(|e| ck8s_certs_api::machine_certificates::Carrier {
            lease: e.lease(),
            holder: e.identity().to_owned(),
        });
    // Checked right before every call that changes a node: a replica frozen or suspended past
    // its renew deadline does nothing after it wakes, whatever its tasks were about to do.
    let term = elector
        .as_ref()
        .map_or_else(leader::Term::always, leader::Elector::term);
    let mut holding = elector.map(Holding::start);
    let outcome = lead(
        controllers::run(
            client,
            machines,
            controllers::Settings::new(&args, renewal, band, pod_name()),
            metrics.clone(),
            health.clone(),
            shutdown.stop.clone(),
            carrier,
            term,
        ),
        holding.as_mut(),
        &shutdown,
        &health,
        args.shutdown_grace_period,
    )
    .await;
    metrics.leader.set(0);
    let elector = match (&outcome, holding) {
        (Ok(()), Some(holding)) => holding.stop().await,
        _ => None,
    };
    if let Some(mut elector) = elector {
        match elector.release().await {
            Ok(()) => tracing::info!(lease = %elector.lease(), "Released the leader Lease"),
            Err(err) => {
                tracing::warn!(lease = %elector.lease(), error = %err, "Releasing the leader Lease failed; a standby takes over when it expires")
            }
        }
    }
    server.abort();
    metrics_server.abort();
    if let Some(webhook) = webhook {
        webhook.abort();
    }
    outcome
}

/// The leader Lease, renewed on a task of its own. The controllers are one future, polled by
/// one task: a long stretch of reconciles there (hundreds of policies checked at a cold start)
/// held up the renewals in the same task, past the renew deadline, and the leader exited.
struct Holding {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<(leader::Elector, Option<leader::Lost>)>,
}

impl Holding {
    fn start(mut elector: leader::Elector) -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let lost = tokio::select! {
                lost = elector.hold() => Some(lost),
                () = stopped.cancelled() => None,
            };
            (elector, lost)
        });
        Self { stop, task }
    }

    /// Resolves when leadership is lost (never while it is held).
    async fn lost(&mut self) -> Error {
        match (&mut self.task).await {
            Ok((_, Some(lost))) => lost.into(),
            Ok((_, None)) => std::future::pending().await,
            Err(err) => Error::LeaderTask(err.to_string()),
        }
    }

    /// Stops renewing and hands the elector back, to release the Lease.
    async fn stop(self) -> Option<leader::Elector> {
        self.stop.cancel();
        self.task.await.ok().map(|(elector, _)| elector)
    }
}

/// Does the work while leading: until a stop signal, then drains in-flight work within the
/// grace period while the Lease is still renewed (so nobody else starts on the same node).
async fn lead(
    work: impl std::future::Future<Output = ()>,
    holding: Option<&mut Holding>,
    shutdown: &shutdown::Shutdown,
    health: &health::Health,
    grace: std::time::Duration,
) -> Result<(), Error> {
    let mut work = std::pin::pin!(work);
    let lost = async {
        match holding {
            Some(holding) => holding.lost().await,
            None => std::future::pending().await,
        }
    };
    let mut lost = std::pin::pin!(lost);
    let finished = tokio::select! {
        // The controllers end by themselves only once told to stop (graceful shutdown).
        () = &mut work => match shutdown.stop.is_cancelled() {
            true => true,
            false => return Err(Error::ControllersStopped),
        },
        lost = &mut lost => return Err(lost),
        () = shutdown.stop.cancelled() => false,
    };
    health.stopping();
    if finished {
        return Ok(());
    }
    tracing::info!(grace = ?grace, "Stopping: no new work starts; waiting for refreshes in flight");
    tokio::select! {
        () = &mut work => tracing::info!("Work in flight finished"),
        () = tokio::time::sleep(grace) => tracing::warn!("The shutdown grace period is over: abandoning work in flight (it is resumed from its record)"),
        () = shutdown.force.cancelled() => tracing::warn!("Second stop signal: abandoning work in flight (it is resumed from its record)"),
        lost = &mut lost => return Err(lost),
    }
    Ok(())
}

/// The controller's own namespace: its service account's (or the kubeconfig context's).
fn own_namespace(args: &cli::Args, client: &Client) -> String {
    args.leader_elect_namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned())
}

fn webhook_settings(
    args: &cli::Args,
    client: &Client,
    band: refresh::band::TtlBand,
    backoff: policy::Backoff,
) -> admission::Settings {
    let namespace = own_namespace(args, client);
    let service = &args.webhook_service;
    let mut names = vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ];
    names.extend(args.webhook_hosts.iter().filter(|h| !h.is_empty()).cloned());
    admission::Settings {
        address: args.webhook_bind_address,
        configuration: args.webhook_configuration.clone(),
        policy_configuration: args.webhook_policy_configuration.clone(),
        certificate: admission::certificate::Settings {
            namespace,
            secret: args.webhook_secret.clone(),
            names,
        },
        scope: admission::Scope {
            namespace: args.namespace.clone(),
            watch_filter: args.watch_filter.clone(),
            band,
            backoff,
        },
    }
}

fn leader_settings(args: &cli::Args, client: &Client) -> leader::Settings {
    let name = args.leader_elect_lease_name.clone().unwrap_or_else(|| {
        match &args.watch_filter {
            // Label values allow `_` and capitals, object names do not.
            Some(filter) => format!("ck8s-certs-{}", filter.to_lowercase().replace('_', "-")),
            None => "ck8s-certs".into(),
        }
    });
    leader::Settings {
        namespace: own_namespace(args, client),
        name,
        identity: leader::identity(pod_name()),
        lease_duration: args.leader_elect_lease_duration,
        renew_deadline: args.leader_elect_renew_deadline,
        retry_period: args.leader_elect_retry_period,
    }
}

async fn client(args: &cli::Args) -> Result<Client, Error> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|err| Error::Client(kube::Error::InferKubeconfig(err)))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|err| Error::Client(kube::Error::InferKubeconfig(err)))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|err| Error::Client(kube::Error::InferConfig(err)))?,
    };
    let mut config = config;
    config.headers.push((
        http::header::USER_AGENT,
        user_agent(args.watch_filter.as_deref()),
    ));
    Client::try_from(config).map_err(Error::Client)
}

/// `ck8s-certs/<version>`, and the shard (`watch-filter=<v>`) when sharded: the management API
/// server's audit log then tells which instance made a request (every shard shares one
/// ServiceAccount).
fn user_agent(watch_filter: Option<&str>) -> http::HeaderValue {
    let plain = concat!("ck8s-certs/", env!("CARGO_PKG_VERSION"));
    watch_filter
        .and_then(|filter| {
            http::HeaderValue::from_str(&format!("{plain} (watch-filter={filter})")).ok()
        })
        .unwrap_or(http::HeaderValue::from_static(plain))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;

    /// Work that, like the controllers, ends only after the stop signal, taking `drain` to
    /// finish what is in flight; `done` tells whether it got to the end.
    fn work(
        shutdown: &shutdown::Shutdown,
        drain: Duration,
        done: Arc<AtomicBool>,
    ) -> impl std::future::Future<Output = ()> + use<> {
        let stop = shutdown.stop.clone();
        async move {
            stop.cancelled().await;
            tokio::time::sleep(drain).await;
            done.store(true, Ordering::SeqCst);
        }
    }

    fn stop_after(shutdown: &shutdown::Shutdown, after: Duration) {
        let stop = shutdown.stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            stop.cancel();
        });
    }

    #[tokio::test(start_paused = true)]
    async fn work_in_flight_finishes_within_the_grace_period() {
        let shutdown = shutdown::Shutdown::default();
        let health = health::Health::default();
        health.set_ready(true);
        let done = Arc::new(AtomicBool::new(false));
        stop_after(&shutdown, Duration::from_secs(1));
        let work = work(&shutdown, Duration::from_secs(5), done.clone());
        lead(work, None, &shutdown, &health, Duration::from_secs(60))
            .await
            .unwrap();
        assert!(done.load(Ordering::SeqCst));
        assert!(!health.is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn work_that_ends_with_the_stop_signal_is_a_clean_stop() {
        let shutdown = shutdown::Shutdown::default();
        let done = Arc::new(AtomicBool::new(false));
        stop_after(&shutdown, Duration::from_secs(1));
        let work = work(&shutdown, Duration::ZERO, done.clone());
        let health = health::Health::default();
        lead(work, None, &shutdown, &health, Duration::from_secs(60))
            .await
            .unwrap();
        assert!(done.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn work_beyond_the_grace_period_or_a_second_signal_is_abandoned() {
        for force in [false, true] {
            let shutdown = shutdown::Shutdown::default();
            let done = Arc::new(AtomicBool::new(false));
            stop_after(&shutdown, Duration::from_secs(1));
            if force {
                let force = shutdown.force.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    force.cancel();
                });
            }
            let work = work(&shutdown, Duration::from_secs(600), done.clone());
            let started = tokio::time::Instant::now();
            let health = health::Health::default();
            lead(work, None, &shutdown, &health, Duration::from_secs(60))
                .await
                .unwrap();
            assert!(!done.load(Ordering::SeqCst));
            let expected = if force { 2 } else { 61 };
            assert_eq!(started.elapsed().as_secs(), expected);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn controllers_that_end_unasked_are_an_error() {
        let shutdown = shutdown::Shutdown::default();
        let health = health::Health::default();
        let result = lead(
            std::future::ready(()),
            None,
            &shutdown,
            &health,
            Duration::from_secs(60),
        )
        .await;
        assert!(matches!(result, Err(Error::ControllersStopped)));
    }

    #[test]
    fn the_user_agent_names_the_shard() {
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(user_agent(None), format!("ck8s-certs/{version}").as_str());
        assert_eq!(
            user_agent(Some("edge-eu")),
            format!("ck8s-certs/{version} (watch-filter=edge-eu)").as_str()
        );
        // Not a header value: the plain agent, never a failed start.
        assert_eq!(
            user_agent(Some("a\nb")),
            format!("ck8s-certs/{version}").as_str()
        );
    }
}
