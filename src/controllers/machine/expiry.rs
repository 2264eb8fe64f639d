//! Learning a node's certificate expiry from k8sd (`certificates-expiry`), quietly while the node
//! is still starting.

use std::time::Duration;

use crate::events::EventType;
use ck8s_certs_api::machine_certificates::MachineCertificatesStatus;
use ck8s_certs_api::reasons::{condition_reasons as why, conditions, events};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::Action;

use super::Error;
use super::act::Act;
use super::connector::{KubeConnector, pin_of};
use crate::controllers::executor::Failure;
use crate::controllers::patches::{MachineChanges, set_condition};
use crate::k8sd::wire::{CertificatesExpiryResponse, path};

impl Act<'_> {
    /// Reads the node's expiry through `certificates-expiry`; quiet while the node is starting.
    pub(super) async fn read_expiry(
        &self,
        mut status: MachineCertificatesStatus,
    ) -> Result<Action, Error> {
        let now = self.ctx.clock.now();
        let (view, role) = (self.view, self.requests.role);
        let pin = pin_of(
            status.k8sd_fingerprint.as_deref(),
            &view.namespace,
            &view.name,
        );
        let prepared = match pin {
            Ok(pin) => {
                let connector = KubeConnector {
                    reach: &self.ctx.reach,
                    machine: view,
                    cluster: &self.cluster,
                    pin,
                    role,
                    now,
                };
                connector.prepare().await
            }
            Err(failure) => Err(failure),
        };
        let mut node = match prepared {
            Ok(node) => node,
            // Not while the workload API's certificate is expired: that lasts until a control
            // plane is refreshed, and every look would cost reads for nothing.
            Err(Failure::Workload(err))
                if err.is_retryable() && err.server_certificate_expired().is_none() =>
            {
                return Ok(Action::requeue(Duration::from_secs(15)));
            }
            Err(failure) => {
                let message = failure.message(view);
                self.report
                    .set_ready(&mut status, false, why::EXPIRY_UNKNOWN, message, now)
                    .await?;
                return Ok(Action::requeue(Duration::from_secs(300)));
            }
        };
        let timeout = self.ctx.config().timeouts.call;
        match node
            .session
            .call::<_, CertificatesExpiryResponse>(
                path::CERTIFICATES_EXPIRY,
                &crate::k8sd::wire::CertificatesExpiryRequest {},
                timeout,
            )
            .await
        {
            Ok(answer) => {
                let Ok(expiry) = answer.expiry_date.parse::<Timestamp>() else {
                    let message = format!(
                        "k8sd on node {} answered an unreadable expiry date {:?}",
                        node.session.target().node,
                        answer.expiry_date
                    );
                    self.report
                        .set_ready(
                            &mut status,
                            false,
                            why::EXPIRY_UNKNOWN,
                            message.clone(),
                            now,
                        )
                        .await?;
                    self.report
                        .event(EventType::Warning, events::EXPIRY_UNKNOWN, message)
                        .await;
                    return Ok(Action::requeue(Duration::from_secs(300)));
                };
                status.expiry = Some(Time(expiry));
                status.role = Some(role);
                status.node_name = view.node_name.clone();
                status.k8sd_fingerprint = node.session.fingerprint().map(|f| f.to_string());
                set_condition(
                    &mut status,
                    conditions::READY,
                    true,
                    why::EXPIRY_KNOWN,
                    format!(
                        "Certificates expire at {}",
                        crate::controllers::patches::rfc3339(&Time(expiry))
                    ),
                    now,
                );
                self.report.write_status(&status).await?;
                self.report
                    .patch_machine(&MachineChanges {
                        expiry: status.expiry.as_ref(),
                        ..Default::default()
                    })
                    .await?;
                Ok(Action::requeue(self.ctx.config().resync))
            }
            // The node is still starting (503) or unreachable for now: try again soon, quietly.
            Err(err) if err.is_retryable() => Ok(Action::requeue(Duration::from_secs(15))),
            Err(err) => {
                let message = Failure::k8sd("certificates-expiry", err).message(view);
                if status.conditions.iter().all(|c| c.message != message) {
                    self.report
                        .event(EventType::Warning, events::EXPIRY_UNKNOWN, message.clone())
                        .await;
                }
                self.report
                    .set_ready(&mut status, false, why::EXPIRY_UNKNOWN, message, now)
                    .await?;
                Ok(Action::requeue(Duration::from_secs(300)))
            }
        }
    }
}
