//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's semantics so that
//! `kubectl get lease` and other tools read it the same way.
//!
//! ```text
//! standby ──(lease free, expired or released)──► take ──► leader ──renew every retry period──┐
//!    ▲                                                      │  ▲                             │
//!    └────────── process exits ◄── lost: no renewal ◄───────┘  └─────────────────────────────┘
//!                                  within the renew deadline        shutdown ─► release
//! ```
//! Guarantees, given the usual assumption that clocks *advance* at the same rate (they need not
//! agree): a standby only takes a lease whose record has not changed for a whole
//! `leaseDurationSeconds` of its own clock; a leader stops acting when it has not renewed for
//! `renew_deadline` (< lease duration), so two replicas never act at once. Expiry is measured
//! from when this replica *observed* the record change, never from `renewTime`, which comes
//! from another machine's clock.
//!
//! The decision is [`claim`], a pure function; [`Elector`] does the API calls. Updates carry
//! the resourceVersion read, so two candidates racing for the same lease cannot both win.

use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};
use tracing::{info, warn};

pub mod term;
pub use term::{Term, boottime};

/// Timing and identity of one candidate.
#[derive(Clone, Debug)]
pub struct Settings {
    pub namespace: String,
    pub name: String,
    /// Unique per process: the pod name plus a random suffix.
    pub identity: String,
    /// How long a standby waits after the last change it saw before taking the lease.
    pub lease_duration: Duration,
    /// How long the leader keeps acting without a successful renewal.
    pub renew_deadline: Duration,
    /// Interval between attempts to take or renew.
    pub retry_period: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error(
        "--leader-elect-lease-duration ({lease:?}) must be longer than --leader-elect-renew-deadline ({renew:?})"
    )]
    LeaseNotLongerThanRenew { lease: Duration, renew: Duration },
    #[error(
        "--leader-elect-renew-deadline ({renew:?}) must be longer than --leader-elect-retry-period ({retry:?})"
    )]
    RenewNotLongerThanRetry { renew: Duration, retry: Duration },
    #[error(
        "--leader-elect-lease-duration ({lease:?}) must exceed --leader-elect-renew-deadline ({renew:?}) by at least {needed:?} (2s or a fifth of the lease, whichever is more): a leader stops acting at its renew deadline, and this margin is what covers its last call to a node and clock drift before a standby takes over"
    )]
    MarginTooSmall {
        lease: Duration,
        renew: Duration,
        needed: Duration,
    },
    #[error("--leader-elect-retry-period must be at least 100ms")]
    RetryTooShort,
    #[error(
        "--leader-elect-lease-duration must be a whole number of seconds from 1s to 1h (a Lease stores seconds)"
    )]
    LeaseDuration,
}

impl Settings {
    /// client-go's rules: lease > renew deadline > retry period, or a leader could lose the
    /// lease before it notices.
    pub fn validate(&self) -> Result<(), SettingsError> {
        let Settings {
            lease_duration: lease,
            renew_deadline: renew,
            retry_period: retry,
            ..
        } = self.clone();
        if lease.subsec_nanos() != 0 || lease < Duration::from_secs(1) || lease.as_secs() > 3600 {
            return Err(SettingsError::LeaseDuration);
        }
        if retry < Duration::from_millis(100) {
            return Err(SettingsError::RetryTooShort);
        }
        if lease <= renew {
            return Err(SettingsError::LeaseNotLongerThanRenew { lease, renew });
        }
        let needed = (lease / 5).max(Duration::from_secs(2));
        if lease - renew < needed {
            return Err(SettingsError::MarginTooSmall {
                lease,
                renew,
                needed,
            });
        }
        if renew <= retry {
            return Err(SettingsError::RenewNotLongerThanRetry { renew, retry });
        }
        Ok(())
    }

    fn lease_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

/// What a candidate may do with the lease as last read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Nobody holds it (never held, released, or expired): take it.
    Take,
    /// We hold it: renew.
    Renew,
    /// Someone else holds it for up to this long still.
    Wait(Duration),
}

/// Decides from the lease's spec, our identity and how long the record has stayed unchanged in
/// our own observation.
pub fn claim(spec: Option<&LeaseSpec>, identity: &str, unchanged_for: Duration) -> Claim {
    let Some(spec) = spec else {
        return Claim::Take;
    };
    match spec.holder_identity.as_deref() {
        None | Some("") => Claim::Take,
        Some(holder) if holder == identity => Claim::Renew,
        Some(_) => {
            // A holder that declares no duration gets client-go's default (15s); a negative one
            // is treated as already expired.
            let seconds = spec.lease_duration_seconds.unwrap_or(15).max(0);
            let duration = Duration::from_secs(u64::from(seconds.unsigned_abs()));
            match duration.checked_sub(unchanged_for) {
                Some(left) if !left.is_zero() => Claim::Wait(left),
                _ => Claim::Take,
            }
        }
    }
}

/// The record written when taking or renewing.
fn next_spec(previous: Option<&LeaseSpec>, settings: &Settings, now: Timestamp) -> LeaseSpec {
    let previous = previous.cloned().unwrap_or_default();
    let ours = previous.holder_identity.as_deref() == Some(settings.identity.as_str());
    LeaseSpec {
        holder_identity: Some(settings.identity.clone()),
        lease_duration_seconds: Some(settings.lease_seconds()),
        acquire_time: match ours {
            true => previous.acquire_time.clone(),
            false => Some(MicroTime(now)),
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(match ours {
            true => previous.lease_transitions.unwrap_or(0),
            false => previous.lease_transitions.unwrap_or(0).saturating_add(1),
        }),
        ..previous
    }
}

/// Why the leader stopped leading.
#[derive(Debug, thiserror::Error)]
pub enum Lost {
    #[error("Lease {lease} was not renewed within the renew deadline ({deadline:?}): {last_error}")]
    Deadline {
        lease: String,
        deadline: Duration,
        last_error: String,
    },
    #[error("Lease {lease} is now held by {holder}")]
    TakenOver { lease: String, holder: String },
}

/// One candidate for one Lease.
pub struct Elector {
    api: Api<Lease>,
    settings: Settings,
    /// The record last read and when (our clock) it last changed.
    observed: Option<(Option<LeaseSpec>, Instant)>,
    /// When (on [`boottime`]) the last renewal that succeeded was started.
    last_renewal: Option<Duration>,
    /// What the rest of the process checks before it acts.
    term: Term,
}

#[derive(Debug)]
enum Attempt {
    Leading,
    Standby {
        holder: String,
    },
    /// Another candidate wrote between our read and our write; the next read tells who.
    Conflict,
}

impl Elector {
    pub fn new(client: Client, settings: Settings) -> Result<Self, SettingsError> {
        settings.validate()?;
        Ok(Self {
            api: Api::namespaced(client, &settings.namespace),
            settings,
            observed: None,
            last_renewal: None,
            term: Term::none(),
        })
    }

    /// This candidate's term as leader: over from the moment a renewal is overdue, whether or
    /// not [`hold`](Self::hold) has noticed yet (a process stopped or suspended past it).
    pub fn term(&self) -> Term {
        self.term.clone()
    }

    /// What is left of the renew deadline since the last renewal.
    fn left(&self) -> Option<Duration> {
        self.last_renewal
            .and_then(|at| {
                self.settings
                    .renew_deadline
                    .checked_sub(boottime().saturating_sub(at))
            })
            .filter(|left| !left.is_zero())
    }

    fn lost(&mut self) {
        self.last_renewal = None;
        self.term.end();
    }

    pub fn lease(&self) -> String {
        format!("{}/{}", self.settings.namespace, self.settings.name)
    }

    pub fn identity(&self) -> &str {
        &self.settings.identity
    }

    /// Returns once this candidate leads. API errors are logged and retried; every attempt is
    /// bounded by the renew deadline.
    pub async fn acquire(&mut self) {
        let mut reported: Option<String> = None;
        loop {
            match self.attempt(self.settings.renew_deadline).await {
                Ok(Attempt::Leading) => {
                    info!(lease = %self.lease(), identity = %self.settings.identity, "Leading: this replica now does the work");
                    return;
                }
                Ok(Attempt::Standby { holder }) => {
                    if reported.as_deref() != Some(holder.as_str()) {
                        info!(lease = %self.lease(), leader = %holder, "Standing by: another replica leads");
                        reported = Some(holder);
                    }
                }
                Ok(Attempt::Conflict) => {}
                Err(err) => {
                    warn!(lease = %self.lease(), error = %err, "Taking the leader Lease failed; retrying")
                }
            }
            tokio::time::sleep(self.settings.retry_period).await;
        }
    }

    /// Renews every retry period while leading; returns when leadership is lost. The caller
    /// must stop acting at once. Every attempt is bounded by what is left of the renew deadline,
    /// so a hanging API server cannot keep us leading past it.
    pub async fn hold(&mut self) -> Lost {
        let mut last_error = String::from("no renewal was attempted");
        loop {
            let Some(left) = self.left() else {
                self.lost();
                return Lost::Deadline {
                    lease: self.lease(),
                    deadline: self.settings.renew_deadline,
                    last_error,
                };
            };
            tokio::time::sleep(self.settings.retry_period.min(left)).await;
            let left = self.left().unwrap_or_default();
            match self.attempt(left).await {
                Ok(Attempt::Leading) => {}
                Ok(Attempt::Standby { holder }) => {
                    self.lost();
                    return Lost::TakenOver {
                        lease: self.lease(),
                        holder,
                    };
                }
                Ok(Attempt::Conflict) => last_error = "a concurrent write to the Lease".into(),
                Err(err) => {
                    warn!(lease = %self.lease(), error = %err, "Renewing the leader Lease failed");
                    last_error = err.to_string();
                }
            }
        }
    }

    /// Gives the lease up so that a standby takes over at its next attempt instead of waiting
    /// for expiry (client-go's ReleaseOnCancel: empty holder, 1s duration).
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        // Nothing acts on our term once a standby may take it.
        self.term.end();
        let bounded = tokio::time::timeout(self.settings.renew_deadline, async {
            let lease = self.api.get(&self.settings.name).await?;
            let Some(spec) = lease.spec.as_ref() else {
                return Ok(());
            };
            if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
                return Ok(());
            }
            let now = MicroTime(Timestamp::now());
            let released = Lease {
                metadata: lease.metadata.clone(),
                spec: Some(LeaseSpec {
                    holder_identity: None,
                    lease_duration_seconds: Some(1),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: spec.lease_transitions,
                    ..spec.clone()
                }),
            };
            self.api
                .replace(&self.settings.name, &PostParams::default(), &released)
                .await
                .map(|_| ())
        })
        .await;
        self.lost();
        match bounded {
            Ok(result) => result,
            Err(_) => Err(timeout_error("releasing", self.settings.renew_deadline)),
        }
    }

    /// One read and, when allowed, one write, within `limit`.
    async fn attempt(&mut self, limit: Duration) -> Result<Attempt, kube::Error> {
        match tokio::time::timeout(limit, self.attempt_unbounded()).await {
            Ok(result) => result,
            Err(_) => Err(timeout_error("renewing", limit)),
        }
    }

    async fn attempt_unbounded(&mut self) -> Result<Attempt, kube::Error> {
        let started = boottime();
        let current = self.api.get_opt(&self.settings.name).await?;
        let spec = current.as_ref().and_then(|l| l.spec.clone());
        let now = Instant::now();
        let (spec, unchanged_since) = match (&self.observed, &spec) {
            (Some((seen, at)), _) if same_record(seen.as_ref(), spec.as_ref()) => (spec, *at),
            // Deleted by hand while another replica held it: that holder may still be acting,
            // so it is waited out from its last renewal we saw, as if the Lease were there.
            (Some((Some(seen), at)), None) if held_by_other(seen, &self.settings.identity) => {
                (Some(seen.clone()), *at)
            }
            _ => (spec, now),
        };
        self.observed = Some((spec.clone(), unchanged_since));
        match claim(
            spec.as_ref(),
            &self.settings.identity,
            now.duration_since(unchanged_since),
        ) {
            Claim::Wait(_) => {
                return Ok(Attempt::Standby {
                    holder: spec.and_then(|s| s.holder_identity).unwrap_or_default(),
                });
            }
            Claim::Take | Claim::Renew => {}
        }
        let next = next_spec(spec.as_ref(), &self.settings, Timestamp::now());
        let written = match current {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.settings.name.clone()),
                        namespace: Some(self.settings.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(next),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            Some(lease) => {
                // metadata carries the resourceVersion read: a concurrent writer makes this 409.
                let lease = Lease {
                    metadata: lease.metadata,
                    spec: Some(next),
                };
                self.api
                    .replace(&self.settings.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match written {
            Ok(lease) => {
                self.observed = Some((lease.spec, Instant::now()));
                self.last_renewal = Some(started);
                self.term.extend(started, self.settings.renew_deadline);
                Ok(Attempt::Leading)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Attempt::Conflict),
            Err(err) => Err(err),
        }
    }
}

fn held_by_other(spec: &LeaseSpec, identity: &str) -> bool {
    spec.holder_identity
        .as_deref()
        .is_some_and(|holder| !holder.is_empty() && holder != identity)
}

/// Two reads show the same record when holder and renew time agree (what a live holder changes).
fn same_record(a: Option<&LeaseSpec>, b: Option<&LeaseSpec>) -> bool {
    let key = |s: Option<&LeaseSpec>| {
        s.map(|s| {
            (
                s.holder_identity.clone(),
                s.renew_time.as_ref().map(|t| t.0),
                s.lease_duration_seconds,
            )
        })
    };
    key(a) == key(b)
}

fn timeout_error(what: &str, after: Duration) -> kube::Error {
    kube::Error::Service(
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{what} the leader Lease timed out after {after:?}"),
        )
        .into(),
    )
}

/// A process-unique identity: the pod name (or host name) and a random suffix, so a restarted
/// pod with the same name never mistakes its predecessor's lease for its own.
pub fn identity(pod: Option<String>) -> String {
    use std::hash::{BuildHasher, Hasher};
    let base = pod
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "ck8s-certs".into());
    // RandomState is seeded from the OS's randomness per process.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    format!("{base}_{:016x}", hasher.finish())
}

#[cfg(test)]
mod tests;
