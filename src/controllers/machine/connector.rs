//! Reaching k8sd: the node's session (endpoint, port, tokens, pinned certificate) and, for a
//! worker, a Ready control plane's to approve its CSRs. [`KubeConnector`] is the executor's
//! [`Connector`] over the management cluster's API and the workload clusters' clients.

use std::time::Duration;

use ck8s_certs_api::annotations::{
    CERTIFICATES_EXPIRY, REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS, RefreshStatus,
};
use ck8s_certs_api::capi::{
    CK8S_CONFIG_GROUP, CK8S_CONFIG_KIND, CK8S_CONFIG_VERSION, CLUSTER_NAME_LABEL,
    CONTROL_PLANE_LABEL, GROUP,
};
use ck8s_certs_api::k8sd::DEFAULT_MICROCLUSTER_PORT;
use ck8s_certs_api::machine::{CapiVersion, ClusterView, Machine, MachineView};
use ck8s_certs_api::machine_certificates::{MachineCertificates, Role};
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};

use super::Config;
use super::report::create_certificates;
use crate::controllers::executor::{Connector, Failure, NodeSession};
use crate::k8sd::{Fingerprint, K8sdError, Route};
use crate::metrics::K8sdCalls;
use crate::refresh::csr::{self, Mismatch};
use crate::refresh::session::{Credential, Session};
use crate::refresh::{ApproveApi, Verification};
use crate::workload;
use crate::workload::csrs::WorkerCsrs;
use crate::workload::endpoint;

/// The field manager of a pin written when a control plane is first used as an approver.
const APPROVER_MANAGER: &str = "ck8s-certs-approver";

/// The k8sd certificate fingerprint pinned for `machine` (`status.k8sdFingerprint`), `None`
/// before first use. Fails closed: a pin that cannot be read is an error, never "no pin" (which
/// would accept any certificate and hand the node's token to whoever answers).
pub(super) fn pin_of(
    fingerprint: Option<&str>,
    namespace: &str,
    machine: &str,
) -> Result<Option<Fingerprint>, Failure> {
    let Some(text) = fingerprint else {
        return Ok(None);
    };
    text.parse::<Fingerprint>().map(Some).map_err(|_| {
        Failure::Message(format!(
            "status.k8sdFingerprint of MachineCertificates {namespace}/{machine} is not a SHA-256 fingerprint ({}), so the node's k8sd cannot be verified and nothing is sent to it; set it to the fingerprint of the node's k8sd certificate (docs/refresh.md, \"Trust in k8sd's certificate\")",
            crate::text::truncate(text.to_owned(), 80)
        ))
    })
}

/// A control plane's session that approves a worker's CSRs, and those CSRs in the worker's
/// cluster, read and verified before every `approve` (k8sd approves by name, without looking).
pub(super) struct Approver {
    session: Session,
    csrs: WorkerCsrs,
}

impl ApproveApi for Approver {
    async fn approve(&mut self, seed: i64) -> Result<(), K8sdError> {
        self.session.approve(seed).await
    }

    async fn verify(&mut self, seed: i64, lifetime: i64) -> Verification {
        self.csrs.verify(seed, lifetime).await
    }

    async fn deny(&mut self, seed: i64, why: &Mismatch) {
        self.csrs.deny(seed, why).await;
    }
}

/// The clients and settings every connection to a node needs (one per controller).
pub struct Reach {
    pub client: Client,
    pub capi: CapiVersion,
    pub workload: workload::Clients,
    pub config: Config,
    pub k8sd_metrics: K8sdCalls,
    /// This replica's term: sessions write nothing to a node once it is over.
    pub term: crate::leader::Term,
}

/// The node's k8sd (and, for a worker, a control plane's to approve) for one refresh.
pub(super) struct KubeConnector<'a> {
    pub reach: &'a Reach,
    pub machine: &'a MachineView,
    pub cluster: &'a ClusterView,
    /// The node's pinned k8sd certificate.
    pub pin: Option<Fingerprint>,
    pub role: Role,
    /// This reconcile's instant: a control plane whose recorded expiry passed cannot approve.
    pub now: jiff::Timestamp,
}

/// What [`KubeConnector::prepare`] found out about the node.
pub(super) struct Node {
    pub session: Session,
    pub sans: Vec<String>,
    pub workload: Client,
    /// The route taken, for the record ([`NodeSession::reached_by`]).
    pub reached_by: String,
}

impl KubeConnector<'_> {
    /// Resolves the node, its tokens and SANs, and opens a session (nothing sent yet).
    pub async fn prepare(&self) -> Result<Node, Failure> {
        let (reach, view, role) = (self.reach, self.machine, self.role);
        let ns = &view.namespace;
        let cluster_name = view.cluster.clone().unwrap_or_default();
        let node_name = view.node_name.clone().unwrap_or_default();
        // Independent reads, at once (a refresh holds its place while it waits for them); a
        // failure is reported in this order whichever failed first.
        let (client, config, tokens) = futures::join!(
            async {
                reach
                    .workload
                    .get(ns, &cluster_name)
                    .await
                    .map_err(Failure::Workload)
            },
            async {
                ck8s_config_of(reach, view)
                    .await
                    .map_err(|e| Failure::Api(e.into()))
            },
            async {
                workload::tokens(&reach.client, ns, &cluster_name, &view.name)
                    .await
                    .map_err(Failure::Workload)
            },
        );
        let (client, config, tokens) = (client?, config?, tokens?);
        let port = config
            .as_ref()
            .and_then(|c| c.data.pointer("/spec/controlPlane/microclusterPort"))
            .and_then(serde_json::Value::as_u64)
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(DEFAULT_MICROCLUSTER_PORT);
        let mut sans: Vec<String> = config
            .as_ref()
            .and_then(|c| c.data.pointer("/spec/controlPlane/extraSANs"))
            .and_then(serde_json::Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str())
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        if role == Role::ControlPlane {
            // The CK8s provider adds the CK8sConfig's name when the node joins: keep it.
            if let Some(name) = &view.bootstrap_name {
                sans.push(name.clone());
            }
            if let Some(host) = &self.cluster.endpoint_host {
                sans.push(host.clone());
            }
            sans.dedup();
        }
        let resolved = endpoint::resolve(
            &client,
            &cluster_name,
            &node_name,
            port,
            reach.config.transport,
        )
        .await;
        let open = |endpoint: endpoint::Endpoint| {
            Session::new(
                endpoint.target,
                endpoint.route,
                self.pin,
                Credential::Node(tokens.node.clone()),
                reach.config.timeouts,
                reach.k8sd_metrics.clone(),
            )
            .fenced(reach.term.clone())
        };
        let (endpoint, mut reached_by) = match resolved {
            Ok(endpoint) => {
                let reached_by = endpoint.route.to_string();
                (endpoint, reached_by)
            }
            Err(err) => match (role, err.server_certificate_expired()) {
                (Role::ControlPlane, Some(ended)) => {
                    let bypass = Bypass::ApiCertificate(ended);
                    let endpoint = self.direct(&node_name, port, &bypass).await?;
                    let reached_by = bypass.reached_by(&endpoint.route);
                    (endpoint, reached_by)
                }
                _ => return Err(Failure::Workload(err)),
            },
        };
        let through_api = matches!(endpoint.route, Route::PortForward { .. });
        let mut session = open(endpoint);
        // Through a port-forward, the connection is opened now: the API server refuses one to a
        // kubelet whose serving certificate expired, and then the node is reached directly. Any
        // other failure is left to the first call, which tries again and counts it.
        if through_api
            && let Err(K8sdError::KubeletCertificateExpired { ended, .. }) = session.connect().await
        {
            let bypass = Bypass::KubeletCertificate(ended);
            let endpoint = self.direct(&node_name, port, &bypass).await?;
            reached_by = bypass.reached_by(&endpoint.route);
            session = open(endpoint);
        }
        Ok(Node {
            session,
            sans,
            workload: client,
            reached_by,
        })
    }

    /// The node's k8sd past the workload API ([`Bypass`]): directly, and only when its k8sd
    /// certificate is pinned (a first use over a path nobody vouched for would hand the node's
    /// token to whoever answers).
    async fn direct(
        &self,
        node: &str,
        port: u16,
        bypass: &Bypass,
    ) -> Result<endpoint::Endpoint, Failure> {
        let view = self.machine;
        let cause = bypass.cause(view.cluster.as_deref().unwrap_or_default(), node);
        if self.pin.is_none() {
            return Err(Failure::Message(format!(
                "{cause}, so node {node} cannot be reached through it; its k8sd could be reached directly, but no k8sd certificate is pinned in MachineCertificates {}/{} (status.k8sdFingerprint) to verify it, and nothing is sent to an unverified node. Pin it (docs/refresh.md, \"Trust in k8sd's certificate\") or refresh the node by hand (docs/refresh.md, \"When certificates have already expired\")",
                view.namespace, view.name
            )));
        }
        let endpoint = direct_endpoint(self.reach, view, node, port).await?;
        if let Route::Direct { address } = &endpoint.route
            && let Err(why) = reachable(address, self.reach.config.timeouts.call).await
        {
            return Err(Failure::Message(format!(
                "{cause}, and node {node}'s k8sd cannot be reached directly at {address} either ({why}): the management cluster may not route to the nodes' addresses. {} (docs/troubleshooting.md, \"A cluster whose certificates expired\")",
                bypass.by_hand()
            )));
        }
        tracing::info!(
            node,
            route = %endpoint.route,
            why = bypass.note(),
            "Reaching the node's k8sd directly"
        );
        Ok(endpoint)
    }

    /// A session to a Ready control-plane node of the same cluster that answers a probe.
    pub async fn approver(&self) -> Result<Approver, Failure> {
        let (reach, view) = (self.reach, self.machine);
        let ns = &view.namespace;
        let cluster = view.cluster.as_deref().unwrap_or_default();
        // Listed, not taken from our cache: the control planes need not be in our watch scope
        // (--watch-filter, --namespace) to approve a worker's CSRs.
        let selector = format!("{CLUSTER_NAME_LABEL}={cluster},{CONTROL_PLANE_LABEL}");
        let (client, tokens, listed, worker) = futures::join!(
            async {
                reach
                    .workload
                    .get(ns, cluster)
                    .await
                    .map_err(Failure::Workload)
            },
            async {
                workload::tokens(&reach.client, ns, cluster, &view.name)
                    .await
                    .map_err(Failure::Workload)
            },
            async {
                Api::<Machine>::namespaced_with(reach.client.clone(), ns, &reach.capi)
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map_err(|e| Failure::Api(e.into()))
            },
            worker_as_capi_knows_it(reach, view),
        );
        let (client, tokens, listed, worker) = (client?, tokens?, listed?, worker?);
        let mut candidates: Vec<MachineView> = listed
            .items
            .iter()
            .map(MachineView::of)
            .filter(|m| m.node_name.is_some() && !m.deleting)
            .collect();
        candidates.sort_by(|a, b| a.name.cmp(&b.name));
        let mut tried = Vec::new();
        // Whether any control plane was ruled out by something that may pass (not Ready, not
        // answering); a pin that is wrong or does not match waits for the operator instead.
        let mut transient = false;
        for machine in candidates {
            let node = machine.node_name.as_deref().unwrap_or_default();
            // Its certificates expired (its admin.conf, which `approve` uses, with them): it
            // approves once its own refresh renewed them, which comes first.
            if let Some(ended) = recorded_expiry(&machine).filter(|at| *at <= self.now) {
                transient = true;
                tried.push(format!(
                    "{node} (its certificates expired at {ended}; it approves once refreshed)"
                ));
                continue;
            }
            match approver_on(reach, &client, cluster, &tokens.capi_auth, &machine).await {
                Ok(session) => {
                    let csrs = WorkerCsrs::new(client, cluster, worker);
                    return Ok(Approver { session, csrs });
                }
                Err(ruled_out) => {
                    transient |= ruled_out.transient;
                    tried.push(format!("{node} ({})", ruled_out.why));
                }
            }
        }
        if transient || tried.is_empty() {
            return Err(Failure::Unavailable(format!(
                "No Ready control-plane node of cluster {cluster} answered, so the worker's CSRs cannot be approved (tried: {}); check the control-plane nodes and their k8sd-proxy pods",
                if tried.is_empty() {
                    "none found".to_owned()
                } else {
                    tried.join(", ")
                }
            )));
        }
        Err(Failure::Message(format!(
            "No control-plane node of cluster {cluster} can approve the worker's CSRs: none can be verified against its pinned k8sd certificate ({}); if a control plane was re-installed, check its k8sd certificate on the node and pin that fingerprint in its MachineCertificates (docs/refresh.md, \"Trust in k8sd's certificate\")",
            tried.join(", ")
        )))
    }
}

/// `view`'s Machine as the API server has it now: its `status.addresses` (which the cache does
/// not keep) are read from it.
async fn machine_live(reach: &Reach, view: &MachineView) -> Result<DynamicObject, Failure> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        GROUP,
        reach.capi.as_str(),
        "Machine",
    ));
    Api::<DynamicObject>::namespaced_with(reach.client.clone(), &view.namespace, &resource)
        .get(&view.name)
        .await
        .map_err(|e| Failure::Api(e.into()))
}

/// The worker's Node name and its Machine's `status.addresses` (read fresh: the cache keeps no
/// addresses), which a serving CSR's SANs must stay within. Cluster API copies them from the
/// infrastructure provider; the node itself cannot change them.
async fn worker_as_capi_knows_it(
    reach: &Reach,
    view: &MachineView,
) -> Result<csr::Worker, Failure> {
    let machine = machine_live(reach, view).await?;
    let addresses = machine
        .data
        .pointer("/status/addresses")
        .and_then(serde_json::Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let pairs = addresses
        .iter()
        .filter_map(|a| Some((a.get("type")?.as_str()?, a.get("address")?.as_str()?)));
    Ok(csr::Worker::new(
        view.node_name.as_deref().unwrap_or_default(),
        pairs,
    ))
}

/// Why a control plane cannot approve now; `transient`: it may pass (not Ready, not
/// answering), unlike a pin that is wrong or does not match, which waits for the operator.
struct RuledOut {
    why: String,
    transient: bool,
}

impl RuledOut {
    fn transient(why: impl Into<String>) -> Self {
        Self {
            why: why.into(),
            transient: true,
        }
    }
}

/// The expiry recorded on `machine` (`machine.cluster.x-k8s.io/certificates-expiry`).
fn recorded_expiry(machine: &MachineView) -> Option<jiff::Timestamp> {
    machine.annotation(CERTIFICATES_EXPIRY)?.parse().ok()
}

/// Why a node's k8sd is reached directly instead of through the workload API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bypass {
    /// The API server's own certificate expired (when it ended, if TLS told): nothing goes
    /// through it until a control plane's refresh renews it.
    ApiCertificate(Option<jiff::Timestamp>),
    /// The node's kubelet serving certificate expired: the API server refuses to port-forward
    /// to it until the node's refresh renews it.
    KubeletCertificate(Option<jiff::Timestamp>),
}

impl Bypass {
    fn cause(self, cluster: &str, node: &str) -> String {
        let since = |ended: Option<jiff::Timestamp>| {
            ended.map(|at| format!(" at {at}")).unwrap_or_default()
        };
        match self {
            Self::ApiCertificate(ended) => format!(
                "the API server of workload cluster {cluster} serves a certificate that expired{}",
                since(ended)
            ),
            Self::KubeletCertificate(ended) => format!(
                "the API server of workload cluster {cluster} refuses to port-forward to node {node}: its kubelet's serving certificate expired{}",
                since(ended)
            ),
        }
    }

    /// For the record of the route taken (`op.transport`) and the logs.
    fn note(self) -> &'static str {
        match self {
            Self::ApiCertificate(_) => "the workload API server's certificate expired",
            Self::KubeletCertificate(_) => "the node's kubelet serving certificate expired",
        }
    }

    fn reached_by(self, route: &Route) -> String {
        format!("{route} ({})", self.note())
    }

    /// What is left to a person when the node cannot be reached directly either.
    fn by_hand(self) -> &'static str {
        match self {
            Self::ApiCertificate(_) => "Refresh the control planes on the nodes themselves",
            Self::KubeletCertificate(_) => "Refresh the node on the node itself",
        }
    }
}

/// `view`'s k8sd, directly: at the InternalIP of its Machine (read live: the cache keeps no
/// addresses; Cluster API copies them from the infrastructure provider, the node cannot
/// change them).
async fn direct_endpoint(
    reach: &Reach,
    view: &MachineView,
    node: &str,
    port: u16,
) -> Result<endpoint::Endpoint, Failure> {
    let machine = machine_live(reach, view).await?;
    endpoint::direct_from_machine(&machine.data, node, port).map_err(Failure::Workload)
}

/// Whether the management cluster reaches `address` at all: one connection. If it does not,
/// waiting and trying again would not change that.
async fn reachable(address: &std::net::SocketAddr, timeout: Duration) -> Result<(), String> {
    tokio::time::timeout(timeout, tokio::net::TcpStream::connect(address))
        .await
        .map_err(|_| format!("no answer within {}", humantime::format_duration(timeout)))
        .and_then(|connected| connected.map(drop).map_err(|e| e.to_string()))
}

/// A session to control plane `machine` of `cluster` as approver, once it is Ready, answers a
/// probe and is verified against its pinned k8sd certificate (pinned now on first use).
async fn approver_on(
    reach: &Reach,
    client: &Client,
    cluster: &str,
    token: &crate::k8sd::Token,
    machine: &MachineView,
) -> Result<Session, RuledOut> {
    let ns = &machine.namespace;
    let node = machine.node_name.as_deref().unwrap_or_default();
    // A pin that cannot be read (or an API error reading it) rules the node out: the cluster's
    // approval token never goes to an unverified endpoint.
    let record = match certificates(reach, ns).get_opt(&machine.name).await {
        Ok(Some(record)) => Ok(Some(record)),
        // A control plane outside our scope (or not reconciled yet) gets its record here, so
        // that the certificate it presents on first use is kept.
        Ok(None) => create_certificates(&reach.client, reach.capi, machine).await,
        Err(err) => Err(err),
    };
    let record = match record {
        Ok(Some(record)) => record,
        Ok(None) => {
            return Err(RuledOut::transient(
                "its MachineCertificates could not be created",
            ));
        }
        Err(err) => {
            let why = format!("reading its pinned certificate failed: {err}");
            return Err(RuledOut::transient(why));
        }
    };
    let fingerprint = record
        .status
        .as_ref()
        .and_then(|s| s.k8sd_fingerprint.as_deref());
    let pin = pin_of(fingerprint, ns, &machine.name).map_err(|failure| RuledOut {
        why: failure.cause(),
        transient: false,
    })?;
    let port = microcluster_port_of(reach, machine).await;
    let endpoint = endpoint::resolve(client, cluster, node, port, reach.config.transport)
        .await
        .map_err(|_| RuledOut::transient("no endpoint"))?;
    if !endpoint.ready {
        return Err(RuledOut::transient("not Ready"));
    }
    let open = |endpoint: endpoint::Endpoint| {
        Session::new(
            endpoint.target,
            endpoint.route,
            pin,
            Credential::Approver(token.clone()),
            reach.config.timeouts,
            reach.k8sd_metrics.clone(),
        )
        .fenced(reach.term.clone())
    };
    let mut session = open(endpoint);
    let mut probed = session.probe().await;
    // Its kubelet's serving certificate expired (the API server refuses to port-forward to it):
    // a pinned control plane still approves, directly.
    if let Err(K8sdError::KubeletCertificateExpired { .. }) = &probed
        && pin.is_some()
    {
        let endpoint = direct_endpoint(reach, machine, node, port)
            .await
            .map_err(|failure| RuledOut::transient(failure.cause()))?;
        session = open(endpoint);
        probed = session.probe().await;
    }
    if let Err(err) = probed {
        return Err(RuledOut {
            // An expired kubelet without a pin waits for its own refresh, which renews it.
            transient: !matches!(err, K8sdError::PinMismatch { .. }),
            why: err.to_string(),
        });
    }
    // First use: the certificate is kept before the approval token is sent to it.
    if pin.is_none() {
        let seen = session.fingerprint();
        keep_approver_pin(reach, &record, seen)
            .await
            .map_err(RuledOut::transient)?;
    }
    Ok(session)
}

/// Pins `seen` on a control plane first used as an approver, in one write guarded by the
/// record's resourceVersion: the control plane's own reconcile may be pinning it at the same
/// moment, and whichever pin lands first is the one both must then match. Only that field
/// is written (a merge patch under its own field manager, so the record's owner keeps the
/// rest of its status).
async fn keep_approver_pin(
    reach: &Reach,
    record: &MachineCertificates,
    seen: Option<Fingerprint>,
) -> Result<(), String> {
    let Some(seen) = seen else {
        return Err("it presented no certificate to pin".to_owned());
    };
    let name = record.name_any();
    let api = certificates(reach, &record.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": record.resource_version()},
        "status": {"k8sdFingerprint": seen.to_string()},
    });
    let params = PatchParams {
        field_manager: Some(APPROVER_MANAGER.into()),
        ..PatchParams::default()
    };
    match api
        .patch_status(&name, &params, &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            // Changed meanwhile: usable only if what was pinned is what answered us.
            let pinned = api
                .get_opt(&name)
                .await
                .map_err(|err| format!("reading its pinned certificate failed: {err}"))?
                .and_then(|r| r.status)
                .and_then(|s| s.k8sd_fingerprint)
                .and_then(|text| text.parse::<Fingerprint>().ok());
            if pinned == Some(seen) {
                Ok(())
            } else {
                Err(format!(
                    "its certificate {seen} could not be pinned: MachineCertificates {name} changed meanwhile and does not pin it"
                ))
            }
        }
        Err(err) => Err(format!("pinning its k8sd certificate failed: {err}")),
    }
}

/// The microcluster port of `machine`'s CK8sConfig, else the default.
async fn microcluster_port_of(reach: &Reach, machine: &MachineView) -> u16 {
    ck8s_config_of(reach, machine)
        .await
        .ok()
        .flatten()
        .and_then(|c| {
            c.data
                .pointer("/spec/controlPlane/microclusterPort")
                .and_then(serde_json::Value::as_u64)
        })
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or(DEFAULT_MICROCLUSTER_PORT)
}

/// The CK8sConfig `machine` was bootstrapped from, if it names one and it is there.
async fn ck8s_config_of(
    reach: &Reach,
    machine: &MachineView,
) -> Result<Option<DynamicObject>, kube::Error> {
    let Some(name) = &machine.bootstrap_name else {
        return Ok(None);
    };
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        CK8S_CONFIG_GROUP,
        CK8S_CONFIG_VERSION,
        CK8S_CONFIG_KIND,
    ));
    Api::<DynamicObject>::namespaced_with(reach.client.clone(), &machine.namespace, &resource)
        .get_opt(name)
        .await
}

fn certificates(reach: &Reach, namespace: &str) -> Api<MachineCertificates> {
    Api::namespaced(reach.client.clone(), namespace)
}

/// Whether a control plane of `machine`'s cluster is being refreshed or asked to be (from the
/// cache): its workers wait for it. Cheap fields first: this runs on every look at a waiting
/// worker, over every cached Machine.
pub(super) fn control_planes_pending(machines: &Store<Machine>, machine: &MachineView) -> bool {
    let Some(cluster) = machine.cluster.as_deref() else {
        return false;
    };
    machines.state().iter().any(|m| {
        m.metadata.namespace.as_deref() == Some(machine.namespace.as_str())
            && m.labels.get(CONTROL_PLANE_LABEL).is_some()
            && m.labels.get(CLUSTER_NAME_LABEL) == Some(cluster)
            && m.metadata.name.as_deref() != Some(machine.name.as_str())
            && m.node_name.is_some()
            && m.metadata.deletion_timestamp.is_none()
            && (m.annotations.get(REFRESH_CERTIFICATES).is_some()
                || m.annotations.get(REFRESH_CERTIFICATES_STATUS)
                    == Some(RefreshStatus::InProgress.as_str()))
    })
}

impl Connector for KubeConnector<'_> {
    type Node = Session;
    type Approver = Approver;

    async fn node(&self) -> Result<NodeSession<Session>, Failure> {
        let node = self.prepare().await?;
        Ok(NodeSession {
            node: node.session.keeping(node.workload),
            extra_sans: node.sans,
            reached_by: node.reached_by,
        })
    }

    async fn approver(&self) -> Result<Approver, Failure> {
        KubeConnector::approver(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::pin_of;

    #[test]
    fn a_pin_is_read_or_refused_never_dropped() {
        let hex = "ab".repeat(32);
        assert_eq!(
            pin_of(None, "ns", "m").map(|p| p.is_some()).ok(),
            Some(false)
        );
        assert_eq!(
            pin_of(Some(&hex), "ns", "m").map(|p| p.is_some()).ok(),
            Some(true)
        );
        for bad in ["", "sha256:zz", "abcd", &"ab".repeat(33)] {
            let refused = pin_of(Some(bad), "ns", "m").err().map(|f| f.cause());
            assert!(
                refused
                    .as_deref()
                    .is_some_and(|m| m.contains("ns/m") && m.contains("nothing is sent to it")),
                "{bad:?}: {refused:?}"
            );
        }
    }
}
