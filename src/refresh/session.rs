//! [`NodeApi`] and [`ApproveApi`] over a real k8sd connection. One connection carries the whole
//! operation (plan then run); after any error it is dropped and the next call reconnects.

use std::time::Duration;

use super::{ApproveApi, NodeApi};
use crate::k8sd::client::{Auth, Target};
use crate::k8sd::wire::{ApproveRequest, PlanRequest, PlanResponse, RunRequest, RunResponse, path};
use crate::k8sd::{Connection, Fingerprint, K8sdError, Route, Token};
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
}

impl Session {
    /// A session authenticating with the node token (plan, run, certificates-expiry).
    pub fn node(
        target: Target,
        route: Route,
        pin: Option<Fingerprint>,
        token: Token,
        timeouts: Timeouts,
    ) -> Self {
        Self {
            target,
            route,
            pin,
            token,
            header: NODE_TOKEN_HEADER,
            timeouts,
            connection: None,
        }
    }

    /// A session authenticating with the cluster-wide CAPI token (approve).
    pub fn approver(
        target: Target,
        route: Route,
        pin: Option<Fingerprint>,
        token: Token,
        timeouts: Timeouts,
    ) -> Self {
        Self {
            target,
            route,
            pin,
            token,
            header: CAPI_AUTH_TOKEN_HEADER,
            timeouts,
            connection: None,
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
            let connection = Connection::open(
                self.target.clone(),
                &self.route,
                self.pin,
                self.timeouts.call,
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

    /// POSTs to `path`; on failure the connection is discarded so a retry starts clean.
    pub async fn call<Req: serde::Serialize + Sync, Resp: serde::de::DeserializeOwned>(
        &mut self,
        path: &str,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, K8sdError> {
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
        if result.is_err() {
            self.connection = None;
        }
        result
    }

    /// `GET /`: does k8sd answer?
    pub async fn probe(&mut self) -> Result<(), K8sdError> {
        let timeout = self.timeouts.call;
        let result = match self.connection().await {
            Ok(connection) => connection.probe(timeout).await.map(drop),
            Err(err) => Err(err),
        };
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
}

impl ApproveApi for Session {
    async fn approve(&mut self, seed: i64) -> Result<(), K8sdError> {
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
