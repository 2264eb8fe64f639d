//! [`NodeApi`] and [`ApproveApi`] over a real k8sd connection. One connection carries the whole
//! operation (plan then run); after any error it is dropped and the next call reconnects.
//!
//! Every call is counted and timed here, where the I/O happens (`ck8s_certs_k8sd_*` metrics),
//! connecting included: a call that has to open the tunnel first pays for it.

use std::time::Duration;

use super::NodeApi;
use crate::k8sd::client::{Auth, Target};
use crate::k8sd::wire::{ApproveRequest, PlanRequest, PlanResponse, RunRequest, RunResponse, path};
use crate::k8sd::{Connection, Fingerprint, K8sdError, Route, Token};
use crate::leader::Term;
use crate::metrics::{K8sdCalls, K8sdEndpoint, k8sd_outcome};
use ck8s_certs_api::k8sd::{CAPI_AUTH_TOKEN_HEADER, NODE_TOKEN_HEADER};

/// Per-call deadlines (`--k8sd-timeout`, `--k8sd-run-timeout`).
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// Connecting (port-forward + TLS), plan, approve, certificates-expiry, probes.
    pub call: Duration,
    /// `run`: on a worker it waits for its CSRs to be approved and signed.
    pub run: Duration,
}

pub struct Session {
    target: Target,
    route: Route,
    pin: Option<Fingerprint>,
    token: Token,
    header: &'static str,
    timeouts: Timeouts,
    connection: Option<Connection>,
    metrics: K8sdCalls,
    /// This replica's term: nothing is written to the node once it is over.
    fence: Term,
    /// The workload cluster's client its tunnels go through (port-forward), kept alive with it.
    _tunnel: Option<kube::Client>,
}

/// The token a session authenticates with.
pub enum Credential {
    /// The node's own token (plan, run, certificates-expiry).
    Node(Token),
    /// The cluster-wide CAPI token (approve).
    Approver(Token),
}

impl Session {
    /// A session to `target` through `route`, verified against `pin` (none: trust on first
    /// use), authenticating with `credential`; not connected yet.
    pub fn new(
        target: Target,
        route: Route,
        pin: Option<Fingerprint>,
        credential: Credential,
        timeouts: Timeouts,
        metrics: K8sdCalls,
    ) -> Self {
        let (header, token) = match credential {
            Credential::Node(token) => (NODE_TOKEN_HEADER, token),
            Credential::Approver(token) => (CAPI_AUTH_TOKEN_HEADER, token),
        };
        Self {
            target,
            route,
            pin,
            token,
            header,
            timeouts,
            connection: None,
            metrics,
            fence: Term::always(),
            _tunnel: None,
        }
    }

    /// The session, writing nothing to the node once `term` is over (see
    /// [`crate::k8sd::transport::Fenced`]).
    pub fn fenced(self, term: Term) -> Self {
        Self {
            fence: term,
            ..self
        }
    }

    /// The session, keeping `client` (its tunnels' way to the node) alive as long as it lives.
    pub fn keeping(self, client: kube::Client) -> Self {
        Self {
            _tunnel: Some(client),
            ..self
        }
    }

    /// The fingerprint of the certificate the node presented, once connected.
    pub fn fingerprint(&self) -> Option<Fingerprint> {
        self.connection
            .as_ref()
            .map(Connection::fingerprint)
            .or(self.pin)
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    async fn connection(&mut self) -> Result<&mut Connection, K8sdError> {
        if self.connection.is_none() {
            let connection = Connection::open_fenced(
                self.target.clone(),
                &self.route,
                self.pin,
                self.timeouts.call,
                &self.fence,
            )
            .await?;
            // Trust on first use: later connections in this session must present the same one.
            self.pin = Some(connection.fingerprint());
            self.connection = Some(connection);
        }
        self.connection.as_mut().ok_or_else(|| K8sdError::Connect {
            node: self.target.node.clone(),
            route: self.route.to_string(),
            reason: "no connection".into(),
        })
    }

    /// Opens the connection now rather than at the first call (the first call then uses it). A
    /// failure is not counted as a call: the connection is not kept, and the next call tries
    /// again and counts.
    pub async fn connect(&mut self) -> Result<(), K8sdError> {
        self.connection().await.map(drop)
    }

    /// POSTs to `path`; on failure the connection is discarded so a retry starts clean.
    pub async fn call<Req: serde::Serialize + Sync, Resp: serde::de::DeserializeOwned>(
        &mut self,
        path: &str,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, K8sdError> {
        let call = self.metrics.start(K8sdEndpoint::of_path(path));
        let token = self.token.clone();
        let header = self.header;
        let result = match self.connection().await {
            Ok(connection) => {
                connection
                    .call(
                        path,
                        Auth {
                            header,
                            token: &token,
                        },
                        request,
                        timeout,
                    )
                    .await
            }
            Err(err) => Err(err),
        };
        call.finish(k8sd_outcome(&result));
        if result.is_err() {
            self.connection = None;
        }
        result
    }

    /// `GET /`: does k8sd answer?
    pub async fn probe(&mut self) -> Result<(), K8sdError> {
        let call = self.metrics.start(K8sdEndpoint::Probe);
        let timeout = self.timeouts.call;
        let result = match self.connection().await {
            Ok(connection) => connection.probe(timeout).await.map(drop),
            Err(err) => Err(err),
        };
        call.finish(k8sd_outcome(&result));
        if result.is_err() {
            self.connection = None;
        }
        result
    }
}

impl NodeApi for Session {
    async fn plan(&mut self) -> Result<PlanResponse, K8sdError> {
        let timeout = self.timeouts.call;
        self.call(path::PLAN, &PlanRequest::default(), timeout)
            .await
    }

    async fn run(&mut self, request: &RunRequest) -> Result<RunResponse, K8sdError> {
        let timeout = self.timeouts.run;
        self.call(path::RUN, request, timeout).await
    }

    fn fingerprint(&self) -> Option<String> {
        Session::fingerprint(self).map(|f| f.to_string())
    }
}

impl Session {
    /// `approve` of a worker's CSRs of `seed`, sent to this control plane. Only for CSRs that
    /// were verified first ([`crate::refresh::ApproveApi`]).
    pub async fn approve(&mut self, seed: i64) -> Result<(), K8sdError> {
        let timeout = self.timeouts.call;
        self.call::<_, crate::k8sd::wire::ApproveResponse>(
            path::APPROVE,
            &ApproveRequest { seed },
            timeout,
        )
        .await
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn session(address: std::net::SocketAddr, metrics: &Metrics) -> Session {
        Session::new(
            Target {
                node: "n1".into(),
                address: address.ip(),
                port: address.port(),
            },
            Route::Direct { address },
            None,
            Credential::Node(Token::new("secret")),
            Timeouts {
                call: Duration::from_millis(300),
                run: Duration::from_millis(300),
            },
            metrics.k8sd.clone(),
        )
    }

    fn sample(metrics: &Metrics, series: &str) -> Option<String> {
        let text = metrics.encode().unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ').map(str::to_owned))
    }

    /// The metrics come from the real connection: a refused connection and a node that never
    /// answers the TLS handshake are told apart, each under its endpoint.
    #[tokio::test]
    async fn calls_are_counted_where_the_io_fails() {
        let metrics = Metrics::default();
        // Nothing listens on a port just released.
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        let mut refused = session(closed, &metrics);
        assert!(matches!(
            refused.plan().await,
            Err(K8sdError::Connect { .. })
        ));
        // Accepts, then stays silent: the TLS handshake runs into the call deadline.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = silent.local_addr().unwrap();
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((stream, _)) = silent.accept().await {
                open.push(stream);
            }
        });
        let mut mute = session(address, &metrics);
        let request = RunRequest {
            certificates: None,
            seed: 1,
            expiration_seconds: 3600,
            extra_sans: None,
        };
        assert!(matches!(
            mute.run(&request).await,
            Err(K8sdError::Timeout { .. })
        ));
        assert!(matches!(mute.probe().await, Err(K8sdError::Timeout { .. })));
        held.abort();

        for (series, value) in [
            (
                "ck8s_certs_k8sd_requests_total{endpoint=\"plan\",outcome=\"connect\"}",
                "1",
            ),
            (
                "ck8s_certs_k8sd_requests_total{endpoint=\"run\",outcome=\"timeout\"}",
                "1",
            ),
            (
                "ck8s_certs_k8sd_requests_total{endpoint=\"probe\",outcome=\"timeout\"}",
                "1",
            ),
            (
                "ck8s_certs_k8sd_request_duration_seconds_count{endpoint=\"run\"}",
                "1",
            ),
        ] {
            assert_eq!(
                sample(&metrics, series).as_deref(),
                Some(value),
                "{series} in\n{}",
                metrics.encode().unwrap()
            );
        }
        // The run waited for its deadline (300 ms): its time is in the histogram.
        let sum: f64 = sample(
            &metrics,
            "ck8s_certs_k8sd_request_duration_seconds_sum{endpoint=\"run\"}",
        )
        .and_then(|v| v.parse().ok())
        .unwrap();
        assert!((0.3..5.0).contains(&sum), "{sum}");
    }
}
