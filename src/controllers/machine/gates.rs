//! Pre-flight gates of an automatic renewal (issue 38): what the management cluster's caches
//! show of a cluster busy with something that restarts or replaces its nodes, and what the
//! workload cluster itself shows of its health ([`workload`]: its control-plane Nodes Ready, its
//! API server ready). A due renewal waits while a gate is closed, unless its certificates are
//! within the fail-safe margin: then, as with a closed window, it goes anyway (and so does every
//! renewal of a cluster whose certificates expired). Pure over the cached objects; the verdict
//! shows which gate, and the condition's transition time since when.

use std::fmt;

use ck8s_certs_api::annotations::{IN_PLACE_UPGRADE_IN_PROGRESS, IN_PLACE_UPGRADE_STATUS};
use ck8s_certs_api::capi::{CK8S_CONTROL_PLANE_KIND, REMEDIATE_MACHINE_ANNOTATION};
use ck8s_certs_api::control_plane::ControlPlane;
use ck8s_certs_api::machine::Machine;
use ck8s_certs_api::machine_deployment::MachineDeployment;
use ck8s_certs_api::reasons::condition_reasons as why;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::controllers::stores::Stores;

pub mod canaries;
pub mod workload;

/// What holds a cluster's automatic renewals back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// A Machine of the cluster is being deleted (a scale-down, a remediation, a replacement).
    MachineDeleting(String),
    /// A Machine of the cluster is to be remediated: asked by `cluster.x-k8s.io/remediate-machine`,
    /// or left to its owner by a MachineHealthCheck (condition `OwnerRemediated` False).
    RemediationRequested(String),
    /// The CK8s provider upgrades a Machine of the cluster in place, which restarts the services
    /// a refresh restarts.
    InPlaceUpgrade(String),
    /// A MachineDeployment or the CK8sControlPlane of the cluster rolls out (replaces its
    /// Machines): its kind and name.
    RollingOut(&'static str, String),
    /// Another control plane of the cluster is not Ready (what of it, said whole).
    ControlPlaneNotReady(String),
    /// The workload API server is not ready (what it answered, said whole).
    ApiNotReady(String),
    /// The Machine is not on a canary cluster of its policy, and waits for the canaries
    /// (automatic renewals only: a manual refresh never waits for them).
    Canary(crate::policy::canary::Hold),
}

impl Gate {
    /// The verdict's reason (and, in snake case, the metric's label).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MachineDeleting(_) => why::GATE_MACHINE_DELETING,
            Self::RemediationRequested(_) => why::GATE_REMEDIATION_REQUESTED,
            Self::InPlaceUpgrade(_) => why::GATE_IN_PLACE_UPGRADE,
            Self::RollingOut(..) => why::GATE_ROLLING_OUT,
            Self::ControlPlaneNotReady(_) => why::GATE_CONTROL_PLANE_NOT_READY,
            Self::ApiNotReady(_) => why::GATE_API_NOT_READY,
            Self::Canary(crate::policy::canary::Hold::Failed { .. }) => why::CANARY_FAILED,
            Self::Canary(crate::policy::canary::Hold::Pending { .. }) => why::CANARIES_PENDING,
        }
    }
}

impl fmt::Display for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MachineDeleting(name) => {
                write!(f, "Machine {name} of the cluster is being deleted")
            }
            Self::RemediationRequested(name) => {
                write!(f, "Machine {name} of the cluster is to be remediated")
            }
            Self::InPlaceUpgrade(name) => {
                write!(
                    f,
                    "Machine {name} of the cluster is being upgraded in place"
                )
            }
            Self::RollingOut(kind, name) => {
                write!(f, "{kind} {name} of the cluster is rolling out")
            }
            Self::ControlPlaneNotReady(what) | Self::ApiNotReady(what) => f.write_str(what),
            Self::Canary(hold) => hold.fmt(f),
        }
    }
}

/// The first closed gate among a cluster's `machines`, `deployments` and `control_planes`, in a
/// fixed order (deletions, remediations, in-place upgrades, rollouts; by name within each), so
/// that the same cluster always names the same gate.
pub fn closed<'a>(
    machines: impl IntoIterator<Item = &'a Machine>,
    deployments: impl IntoIterator<Item = &'a MachineDeployment>,
    control_planes: impl IntoIterator<Item = &'a ControlPlane>,
) -> Option<Gate> {
    let mut found: Vec<Gate> = Vec::new();
    for machine in machines {
        let name = || machine.metadata.name.clone().unwrap_or_default();
        if machine.metadata.deletion_timestamp.is_some() {
            found.push(Gate::MachineDeleting(name()));
        } else if machine
            .annotations
            .contains_key(REMEDIATE_MACHINE_ANNOTATION)
            || machine.owner_remediation
        {
            found.push(Gate::RemediationRequested(name()));
        } else if machine.annotations.get(IN_PLACE_UPGRADE_STATUS)
            == Some(IN_PLACE_UPGRADE_IN_PROGRESS)
        {
            found.push(Gate::InPlaceUpgrade(name()));
        }
    }
    let name = |meta: &ObjectMeta| meta.name.clone().unwrap_or_default();
    found.extend(
        deployments
            .into_iter()
            .filter(|md| md.rolling_out)
            .map(|md| Gate::RollingOut("MachineDeployment", name(&md.metadata))),
    );
    found.extend(
        control_planes
            .into_iter()
            .filter(|cp| cp.rolling_out)
            .map(|cp| Gate::RollingOut(CK8S_CONTROL_PLANE_KIND, name(&cp.metadata))),
    );
    found.into_iter().min_by(|a, b| {
        let rank = |g: &Gate| why::GATES.iter().position(|r| *r == g.reason());
        rank(a)
            .cmp(&rank(b))
            .then_with(|| a.to_string().cmp(&b.to_string()))
    })
}

/// [`closed`] over the cached Machines and MachineDeployments of cluster `namespace/cluster`.
/// It scans every cached object: it is asked only for a Machine whose renewal is due.
pub fn of_cluster(stores: &Stores, namespace: &str, cluster: &str) -> Option<Gate> {
    let ours = |ns: Option<&String>, name: Option<&str>| {
        ns.map(String::as_str) == Some(namespace) && name == Some(cluster)
    };
    let machines = stores.machines.state();
    let deployments = stores.deployments.state();
    let control_planes = stores.control_planes.state();
    closed(
        machines
            .iter()
            .filter(|m| ours(m.metadata.namespace.as_ref(), m.cluster()))
            .map(AsRef::as_ref),
        deployments
            .iter()
            .filter(|md| ours(md.metadata.namespace.as_ref(), md.cluster_name.as_deref()))
            .map(AsRef::as_ref),
        control_planes
            .iter()
            .filter(|cp| ours(cp.metadata.namespace.as_ref(), cp.cluster_name.as_deref()))
            .map(AsRef::as_ref),
    )
}

/// What of a Machine opens or closes a gate of its cluster.
fn gate_state(machine: &Machine) -> (bool, bool, bool) {
    (
        machine.metadata.deletion_timestamp.is_some(),
        machine
            .annotations
            .contains_key(REMEDIATE_MACHINE_ANNOTATION)
            || machine.owner_remediation,
        machine.annotations.get(IN_PLACE_UPGRADE_STATUS) == Some(IN_PLACE_UPGRADE_IN_PROGRESS),
    )
}

/// Whether a Machine's change may open or close a gate of its cluster (a Machine first seen
/// only when it holds one: the first list passes every Machine).
pub fn machine_gate_changed(old: Option<&Machine>, new: &Machine) -> bool {
    match old {
        Some(old) => gate_state(old) != gate_state(new),
        None => gate_state(new) != (false, false, false),
    }
}

/// Whether a MachineDeployment's change may open or close a gate of its cluster.
pub fn deployment_gate_changed(old: Option<&MachineDeployment>, new: &MachineDeployment) -> bool {
    old.map_or(new.rolling_out, |old| old.rolling_out != new.rolling_out)
}

/// The Machines of cluster `namespace/cluster` whose renewal a gate holds now (their recorded
/// verdict names one): looked at again when a gate of the cluster may have opened, rather than
/// at their next re-check.
pub fn held_in_cluster<'a>(
    stores: &'a Stores,
    namespace: &'a str,
    cluster: &'a str,
) -> impl Iterator<Item = std::sync::Arc<Machine>> + 'a {
    stores
        .machines
        .state()
        .into_iter()
        .filter(move |m| {
            m.metadata.namespace.as_deref() == Some(namespace) && m.cluster() == Some(cluster)
        })
        .filter(|m| {
            let name = m.metadata.name.as_deref().unwrap_or_default();
            stores
                .certificates
                .get(namespace, name)
                .and_then(|cached| cached.status().ok().flatten())
                .and_then(|status| status.renewal)
                .is_some_and(|renewal| why::GATES.contains(&renewal.reason.as_str()))
        })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn machine(name: &str, annotations: serde_json::Value, deleting: bool) -> Machine {
        let mut metadata = json!({ "name": name, "namespace": "ns", "annotations": annotations });
        if deleting {
            metadata["deletionTimestamp"] = json!("2026-11-29T10:00:00Z");
        }
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": metadata, "spec": { "clusterName": "c" },
        }))
        .unwrap()
    }

    fn named(name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        }
    }

    fn deployment(name: &str, rolling_out: bool) -> MachineDeployment {
        MachineDeployment {
            rolling_out,
            metadata: named(name),
            ..Default::default()
        }
    }

    fn control_plane(name: &str, rolling_out: bool) -> ControlPlane {
        ControlPlane {
            rolling_out,
            metadata: named(name),
            ..Default::default()
        }
    }

    /// What is asked, the cluster's Machines, MachineDeployments and control planes: the gate
    /// found.
    type Row<'a> = (
        &'static str,
        Vec<&'a Machine>,
        Vec<&'a MachineDeployment>,
        Vec<&'a ControlPlane>,
        Option<Gate>,
    );

    #[test]
    fn each_gate_is_told_and_the_same_cluster_always_names_the_same_one() {
        let idle = machine("w-0", json!({}), false);
        let upgrading = machine(
            "w-1",
            json!({ IN_PLACE_UPGRADE_STATUS: IN_PLACE_UPGRADE_IN_PROGRESS }),
            false,
        );
        let upgraded = machine("w-2", json!({ IN_PLACE_UPGRADE_STATUS: "done" }), false);
        let remediate = machine("cp-1", json!({ REMEDIATE_MACHINE_ANNOTATION: "" }), false);
        let deleting = machine("w-3", json!({}), true);
        let quiet = deployment("md-0", false);
        let rolling = deployment("md-1", true);
        let steady = control_plane("c-cp", false);
        let replacing = control_plane("c-cp", true);
        // Left by a MachineHealthCheck to its MachineSet, which has not deleted it yet.
        let unhealthy: Machine = serde_json::from_value(json!({
            "metadata": { "name": "w-4", "namespace": "ns" }, "spec": { "clusterName": "c" },
            "status": { "conditions": [{ "type": "OwnerRemediated", "status": "False" }] },
        }))
        .unwrap();
        let rows: Vec<Row> = vec![
            (
                "nothing going on",
                vec![&idle, &upgraded],
                vec![&quiet],
                vec![&steady],
                None,
            ),
            (
                "an in-place upgrade in progress",
                vec![&idle, &upgrading],
                vec![&quiet],
                vec![],
                Some(Gate::InPlaceUpgrade("w-1".into())),
            ),
            (
                "a remediation asked for",
                vec![&remediate, &upgrading],
                vec![],
                vec![],
                Some(Gate::RemediationRequested("cp-1".into())),
            ),
            (
                "a remediation left to the owner",
                vec![&idle, &unhealthy, &upgrading],
                vec![],
                vec![],
                Some(Gate::RemediationRequested("w-4".into())),
            ),
            (
                "a deletion comes first",
                vec![&upgrading, &remediate, &deleting],
                vec![&rolling],
                vec![&replacing],
                Some(Gate::MachineDeleting("w-3".into())),
            ),
            (
                "a rollout",
                vec![&idle],
                vec![&quiet, &rolling],
                vec![&steady],
                Some(Gate::RollingOut("MachineDeployment", "md-1".into())),
            ),
            (
                "a control-plane rollout",
                vec![&idle],
                vec![&quiet],
                vec![&replacing],
                Some(Gate::RollingOut("CK8sControlPlane", "c-cp".into())),
            ),
        ];
        for (name, machines, deployments, control_planes, expected) in rows {
            assert_eq!(
                closed(machines, deployments, control_planes),
                expected,
                "{name}"
            );
        }
        // The order of the cache does not change the answer.
        let a = machine("a", json!({}), true);
        let b = machine("b", json!({}), true);
        assert_eq!(closed([&b, &a], [], []), closed([&a, &b], [], []));
        // What wakes the held Machines: a gate that may have opened or closed, nothing else.
        assert!(machine_gate_changed(Some(&upgrading), &upgraded));
        assert!(machine_gate_changed(Some(&idle), &deleting));
        assert!(!machine_gate_changed(Some(&idle), &upgraded));
        assert!(!machine_gate_changed(None, &idle));
        assert!(machine_gate_changed(None, &remediate));
        assert!(machine_gate_changed(Some(&idle), &unhealthy));
        assert!(deployment_gate_changed(Some(&rolling), &quiet));
        assert!(!deployment_gate_changed(Some(&quiet), &quiet));
        assert!(!deployment_gate_changed(None, &quiet));
        assert_eq!(
            Gate::InPlaceUpgrade("w-1".into()).to_string(),
            "Machine w-1 of the cluster is being upgraded in place"
        );
    }
}
