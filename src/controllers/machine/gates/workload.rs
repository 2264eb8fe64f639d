//! The gates the workload cluster itself shows: its API server ready (`GET /readyz` answers
//! ok) and every other control-plane Node Ready. An API server whose certificate expired holds
//! nothing: that is a dark cluster, whose recovery a refresh is. Looked at (one `GET /readyz`, then one `GET` per
//! other control-plane Node) only right before an automatic renewal starts, and remembered per
//! cluster for [`FRESH`]: the pure verdict sees a closed gate from there, and the Machines of one
//! cluster due together cost one look.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};

use super::Gate;

/// How long a look at a workload cluster stands for it.
pub const FRESH: Duration = Duration::from_secs(10);

/// A look at a workload cluster: when, and the gate it found closed.
type Look = (Timestamp, Option<Gate>);

/// The last look at each workload cluster, by namespace and name.
#[derive(Default)]
pub struct Looks(Mutex<HashMap<(String, String), Look>>);

impl Looks {
    /// The look at `namespace/cluster` taken within [`FRESH`] of `now`, if any.
    pub fn fresh(&self, namespace: &str, cluster: &str, now: Timestamp) -> Option<Option<Gate>> {
        let looks = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (at, gate) = looks.get(&(namespace.to_owned(), cluster.to_owned()))?;
        let age = Duration::try_from(now.duration_since(*at)).ok()?;
        (age < FRESH).then(|| gate.clone())
    }

    /// The gate a fresh look found closed.
    pub fn closed(&self, namespace: &str, cluster: &str, now: Timestamp) -> Option<Gate> {
        self.fresh(namespace, cluster, now).flatten()
    }

    fn keep(&self, namespace: &str, cluster: &str, now: Timestamp, gate: Option<Gate>) {
        let mut looks = self.0.lock().unwrap_or_else(|e| e.into_inner());
        looks.insert((namespace.to_owned(), cluster.to_owned()), (now, gate));
    }

    /// The gate closed in `namespace/cluster`: a fresh look's, else a new look through
    /// `client` (`Err`: the workload cluster could not even be asked), remembered.
    pub async fn look(
        &self,
        namespace: &str,
        cluster: &str,
        client: Option<Client>,
        control_planes: &[ControlPlane],
        now: Timestamp,
    ) -> Option<Gate> {
        if let Some(gate) = self.fresh(namespace, cluster, now) {
            return gate;
        }
        // A workload cluster that cannot even be asked holds nothing: the refresh says why.
        let gate = match client {
            Some(client) => look(&client, control_planes).await,
            None => None,
        };
        self.keep(namespace, cluster, now, gate.clone());
        gate
    }
}

/// Another control plane of the cluster: its Machine, and its Node once it has one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlPlane {
    pub machine: String,
    pub node: Option<String>,
}

/// What the workload API showed of a control plane's Node.
#[derive(Clone, Debug, PartialEq, Eq)]
enum NodeSeen {
    NoNode,
    Missing,
    Unreadable(String),
    /// Its `Ready` condition: status and reason (`None`: it has none).
    Ready(Option<(String, String)>),
}

/// One look: the API server's readiness first (without it nothing else can be read), then the
/// control planes' Nodes.
async fn look(client: &Client, control_planes: &[ControlPlane]) -> Option<Gate> {
    let readyz = match http::Request::get("/readyz").body(Vec::new()) {
        Ok(request) => client.request_text(request).await,
        // A static request: cannot fail; were it to, nothing is asked and nothing held.
        Err(_) => return None,
    };
    if let Err(err) = readyz {
        return api_gate(&err);
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let seen = futures::future::join_all(control_planes.iter().map(async |cp| {
        let seen = match &cp.node {
            None => NodeSeen::NoNode,
            Some(node) => match nodes.get_opt(node).await {
                Ok(None) => NodeSeen::Missing,
                Ok(Some(node)) => NodeSeen::Ready(ready_of(&node)),
                Err(err) => NodeSeen::Unreadable(err.to_string()),
            },
        };
        (cp, seen)
    }))
    .await;
    node_gate(&seen)
}

/// The gate a failed `/readyz` closes: an answer of its failing checks (5xx) does. A refusal
/// (401, 403) or no answer at all (the API down, unreachable, serving an expired certificate)
/// closes none, and nothing more is read: a refresh then waits for the API, or fails, as it
/// always did, and a dark cluster's recovery (a control plane reached directly renews the API)
/// is not held.
fn api_gate(failed: &kube::Error) -> Option<Gate> {
    // Refused (401, 403): the client's credentials, not the API's readiness; its refresh says
    // what is wrong with them.
    let kube::Error::Api(status) = failed else {
        return None;
    };
    if status.code < 500 {
        return None;
    }
    // Its body lists every check, the failed ones as `[-]name failed: …`.
    let failed: Vec<&str> = status
        .message
        .lines()
        .map(str::trim)
        .filter(|line| line.starts_with("[-]"))
        .collect();
    let said = match failed.is_empty() {
        true => status.message.trim().to_owned(),
        false => failed.join(", "),
    };
    let why = format!("answered {}: {said}", status.code);
    Some(Gate::ApiNotReady(format!(
        "the workload API server is not ready (GET /readyz {})",
        crate::text::truncate(why, 300)
    )))
}

/// The `Ready` condition of `node`: its status and reason.
fn ready_of(node: &Node) -> Option<(String, String)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

/// The first control plane (by Machine name) whose Node is not Ready, as a gate.
fn node_gate(seen: &[(&ControlPlane, NodeSeen)]) -> Option<Gate> {
    let mut not_ready: Vec<(&str, String)> = seen
        .iter()
        .filter_map(|(cp, seen)| {
            let machine = cp.machine.as_str();
            let node = cp.node.as_deref().unwrap_or_default();
            let why = match seen {
                NodeSeen::Ready(Some((status, _))) if status == "True" => return None,
                NodeSeen::NoNode => {
                    format!("control plane {machine} of the cluster has no Node yet")
                }
                NodeSeen::Missing => {
                    format!("control plane {machine}'s Node {node} is not in the workload cluster")
                }
                NodeSeen::Unreadable(err) => {
                    format!("control plane {machine}'s Node {node} could not be read ({err})")
                }
                NodeSeen::Ready(None) => {
                    format!("control plane {machine}'s Node {node} has no Ready condition")
                }
                NodeSeen::Ready(Some((status, reason))) => format!(
                    "control plane {machine}'s Node {node} is not Ready (Ready={status}, {reason})"
                ),
            };
            Some((machine, why))
        })
        .collect();
    not_ready.sort();
    not_ready
        .into_iter()
        .next()
        .map(|(_, why)| Gate::ControlPlaneNotReady(why))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cp(machine: &str, node: Option<&str>) -> ControlPlane {
        ControlPlane {
            machine: machine.into(),
            node: node.map(str::to_owned),
        }
    }

    fn ready(status: &str, reason: &str) -> NodeSeen {
        NodeSeen::Ready(Some((status.into(), reason.into())))
    }

    #[test]
    fn a_control_plane_node_not_ready_closes_the_gate_and_the_first_by_name_is_told() {
        let (a, b, c) = (
            cp("cp-a", Some("a")),
            cp("cp-b", Some("b")),
            cp("cp-c", None),
        );
        type Row<'a> = (&'a str, Vec<(&'a ControlPlane, NodeSeen)>, Option<&'a str>);
        let rows: Vec<Row> = vec![
            ("no other control plane", vec![], None),
            ("all Ready", vec![(&a, ready("True", "KubeletReady"))], None),
            (
                "one NotReady",
                vec![
                    (&b, ready("Unknown", "NodeStatusUnknown")),
                    (&a, ready("True", "KubeletReady")),
                ],
                Some("control plane cp-b's Node b is not Ready (Ready=Unknown, NodeStatusUnknown)"),
            ),
            (
                "the first by Machine name",
                vec![
                    (&b, NodeSeen::Missing),
                    (&a, ready("False", "KubeletNotReady")),
                ],
                Some("control plane cp-a's Node a is not Ready (Ready=False, KubeletNotReady)"),
            ),
            (
                "no Node yet",
                vec![(&c, NodeSeen::NoNode)],
                Some("control plane cp-c of the cluster has no Node yet"),
            ),
            (
                "no condition",
                vec![(&a, NodeSeen::Ready(None))],
                Some("control plane cp-a's Node a has no Ready condition"),
            ),
            (
                "unreadable",
                vec![(&a, NodeSeen::Unreadable("timed out".into()))],
                Some("control plane cp-a's Node a could not be read (timed out)"),
            ),
        ];
        for (name, seen, expected) in rows {
            let gate = node_gate(&seen);
            assert_eq!(
                gate,
                expected.map(|why| Gate::ControlPlaneNotReady(why.into())),
                "{name}"
            );
        }
    }

    #[test]
    fn a_readyz_failing_its_checks_closes_the_gate_naming_them_and_a_refusal_or_no_answer_none() {
        // What kube-apiserver answers while it shuts down (kube-rs keeps the text as message).
        let body = "[+]ping ok\n[+]log ok\n[-]shutdown failed: reason withheld\n[+]etcd ok\nreadyz check failed";
        let failed = kube::Error::Api(
            kube::core::Status::failure(body, "Failed to parse error data")
                .with_code(500)
                .boxed(),
        );
        assert_eq!(
            api_gate(&failed),
            Some(Gate::ApiNotReady(
                "the workload API server is not ready (GET /readyz answered 500: [-]shutdown failed: reason withheld)".into()
            ))
        );
        let forbidden = kube::Error::Api(
            kube::core::Status::failure("forbidden", "Forbidden")
                .with_code(403)
                .boxed(),
        );
        // No answer: nothing held (the refresh waits for the API itself, or fails).
        let refused = kube::Error::Service(Box::new(std::io::Error::other("connection refused")));
        assert_eq!(api_gate(&refused), None);
        assert_eq!(api_gate(&forbidden), None);
    }

    #[test]
    fn a_look_stands_for_its_cluster_for_a_while_and_no_longer() {
        let looks = Looks::default();
        let at: Timestamp = "2026-11-29T12:00:00Z".parse().unwrap();
        let gate = Gate::ApiNotReady("down".into());
        looks.keep("ns", "c", at, Some(gate.clone()));
        assert_eq!(looks.closed("ns", "c", at), Some(gate.clone()));
        let later = at + jiff::SignedDuration::from_secs(9);
        assert_eq!(looks.closed("ns", "c", later), Some(gate));
        assert_eq!(looks.closed("ns", "other", later), None);
        let stale = at + jiff::SignedDuration::from_secs(10);
        assert_eq!(looks.closed("ns", "c", stale), None);
        assert_eq!(looks.fresh("ns", "c", stale), None);
        looks.keep("ns", "c", stale, None);
        assert_eq!(looks.fresh("ns", "c", stale), Some(None));
    }
}
