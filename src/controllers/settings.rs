//! The controllers' settings, built once from the command line.

use std::time::Duration;

use super::shared::Shared;
use super::watches::{Scope, Watches};
use super::{cluster_credentials, executor, fleet, machine, policy_status};
use crate::cli::Args;
use crate::refresh::session::Timeouts;

/// Everything the controllers are configured with.
#[derive(Clone, Debug)]
pub struct Settings {
    pub scope: Scope,
    pub machine: machine::start::Settings,
    pub credentials: cluster_credentials::Config,
    /// How long a fleet refresh waits for a Machine that does not go on.
    pub fleet_wait_timeout: Duration,
    /// The admission policy a request made by hand must be younger than (`--request-policy`).
    pub request_policy: Option<String>,
    /// Finished refresh records kept (`--refresh-history`).
    pub history: usize,
    /// The re-check period of idle Machines and policies.
    pub resync: Duration,
    /// This instance's name in the Events it records (the pod's).
    pub instance: Option<String>,
    /// How far a controller may fall behind a watch (`--watch-buffer`).
    pub watch_buffer: usize,
    /// The fleet-wide circuit breaker, and how resumes are attributed.
    pub breakers: policy_status::BreakerSettings,
}

impl Settings {
    /// `renewal`: the checked renewal flags; `band`: the checked TTL flags; `instance`: the
    /// pod's name.
    pub fn new(
        args: &Args,
        renewal: crate::policy::spec::Settings,
        band: crate::refresh::band::TtlBand,
        instance: Option<String>,
    ) -> Self {
        let vetting = args.kubeconfig_vetting();
        Self {
            watch_buffer: usize::from(args.watch_buffer),
            breakers: policy_status::BreakerSettings {
                fleet: crate::policy::breaker::Limit {
                    failures: usize::try_from(args.fleet_breaker_failures).unwrap_or(usize::MAX),
                    period: jiff::SignedDuration::try_from(args.fleet_breaker_period)
                        .unwrap_or(jiff::SignedDuration::MAX),
                },
                requester_policy: named(&args.requester_policy),
            },
            scope: Scope {
                namespace: args.namespace.clone(),
                watch_filter: args.watch_filter.clone(),
            },
            machine: machine::start::Settings {
                config: machine::Config {
                    transport: args.k8sd_transport,
                    timeouts: Timeouts {
                        call: args.k8sd_timeout,
                        run: args.k8sd_run_timeout,
                    },
                    resync: args.resync_period,
                    renewal,
                    history: args.refresh_history,
                    band,
                    renewal_admission_policy: named(&args.renewal_admission_policy),
                },
                executor: executor::Settings {
                    wait_timeout: args.refresh_wait_timeout,
                    tries: args.k8sd_attempts.max(1),
                    settle_timeout: args.settle_timeout,
                    run_timeout: args.k8sd_run_timeout,
                    connect_timeout: args.node_connect_timeout,
                },
                workers_per_cluster: args.max_worker_refreshes_per_cluster,
                workers: args.max_worker_refreshes,
                concurrency: args.concurrent_reconciles,
                vetting,
            },
            credentials: cluster_credentials::Config {
                warning: jiff::SignedDuration::try_from(args.kubeconfig_expiry_warning)
                    .unwrap_or(jiff::SignedDuration::MAX),
                interval: args.kubeconfig_check_interval,
                ca_runway: jiff::SignedDuration::try_from(args.ca_runway_warning)
                    .unwrap_or(jiff::SignedDuration::MAX),
                vetting,
                renewal: cluster_credentials::RenewalConfig {
                    mode: args.renew_management_kubeconfig,
                    renew_before: args
                        .kubeconfig_renew_before
                        .and_then(|d| jiff::SignedDuration::try_from(d).ok()),
                },
            },
            fleet_wait_timeout: args.refresh_wait_timeout,
            request_policy: named(&args.request_policy),
            history: args.refresh_history,
            resync: args.resync_period,
            instance,
        }
    }

    /// The fleet controllers' context. `synced`: turns true once every cache is synced.
    pub(super) fn fleet_context(
        &self,
        shared: &Shared,
        watches: &Watches,
        synced: tokio::sync::watch::Receiver<bool>,
    ) -> fleet::Context {
        fleet::Context {
            clock: shared.clock.clone(),
            client: shared.client.clone(),
            capi: shared.capi,
            stores: shared.stores.clone(),
            requests: watches.requests.store.clone(),
            workload: crate::workload::Clients::new(shared.client.clone(), self.machine.vetting),
            recorder: shared.recorder.clone(),
            wait_timeout: self.fleet_wait_timeout,
            request_policy: self.request_policy.clone(),
            band: self.machine.config.band,
            history: self.history,
            watch_filter: self.scope.watch_filter.clone(),
            synced,
        }
    }
}

/// A flag naming an object, unless empty.
fn named(flag: &str) -> Option<String> {
    Some(flag.trim().to_owned()).filter(|name| !name.is_empty())
}
