//! Which Machines a request's `spec.target` names: a pure reading of the target, shared by the
//! planner (what to refuse and how to say it) and the reconciler (which Machines to take).

use ck8s_certs_api::capi::{CONTROL_PLANE_NAME_LABEL, DEPLOYMENT_NAME_LABEL};
use ck8s_certs_api::certificate_refresh::Target;
use ck8s_certs_api::machine::MachineView;
use kube::core::{Selector, SelectorExt};

use crate::policy::spec::compile_selector;

#[derive(Clone, Debug, PartialEq)]
pub enum Scope {
    Machine(String),
    Cluster(String),
    MachineDeployment(String),
    ControlPlane(String),
    Selector(Selector),
}

impl Scope {
    /// The target as a scope; `Err` says why it names nothing (the API server's validation
    /// should have caught both: an older CRD, or a request written around it).
    pub fn of(target: &Target) -> Result<Self, String> {
        let named = [
            target.machine.clone().map(Self::Machine),
            target.cluster.clone().map(Self::Cluster),
            target
                .machine_deployment
                .clone()
                .map(Self::MachineDeployment),
            target.control_plane.clone().map(Self::ControlPlane),
        ];
        let mut scopes: Vec<Self> = named.into_iter().flatten().collect();
        if let Some(selector) = &target.selector {
            let compiled =
                compile_selector("spec.target.selector", selector).map_err(|errors| {
                    let problems: Vec<String> = errors.iter().map(ToString::to_string).collect();
                    format!(
                        "Refused: {}; create a new request with a valid selector",
                        problems.join("; ")
                    )
                })?;
            scopes.push(Self::Selector(compiled));
        }
        match <[Self; 1]>::try_from(scopes) {
            Ok([scope]) => Ok(scope),
            Err(_) => Err(
                "Refused: spec.target must name exactly one of machine, cluster, machineDeployment, controlPlane and selector".into(),
            ),
        }
    }

    /// Whether the scope takes this Machine (of the request's namespace).
    pub fn selects(&self, machine: &MachineView) -> bool {
        let label = |key: &str| machine.labels.get(key).map(String::as_str);
        match self {
            Self::Machine(name) => machine.name == *name,
            Self::Cluster(name) => machine.cluster.as_deref() == Some(name),
            Self::MachineDeployment(name) => label(DEPLOYMENT_NAME_LABEL) == Some(name),
            Self::ControlPlane(name) => label(CONTROL_PLANE_NAME_LABEL) == Some(name),
            Self::Selector(selector) => selector.matches(&machine.labels),
        }
    }

    /// Whether it can name more than one Machine (requests of those queue per cluster).
    pub fn is_fleet(&self) -> bool {
        !matches!(self, Self::Machine(_))
    }

    /// The target in words, for statuses and Events.
    pub fn describe(&self) -> String {
        match self {
            Self::Machine(name) => format!("Machine {name}"),
            Self::Cluster(name) => format!("Cluster {name}"),
            Self::MachineDeployment(name) => format!("MachineDeployment {name}"),
            Self::ControlPlane(name) => format!("control plane {name}"),
            Self::Selector(selector) => format!("the selector {:?}", selector.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

    use super::*;

    fn machine(name: &str, cluster: &str, labels: &[(&str, &str)]) -> MachineView {
        MachineView {
            name: name.into(),
            cluster: Some(cluster.into()),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
            ..Default::default()
        }
    }

    #[test]
    fn each_target_selects_its_machines() {
        let worker = machine("w-0", "a", &[(DEPLOYMENT_NAME_LABEL, "a-md-0")]);
        let cp = machine("cp-0", "a", &[(CONTROL_PLANE_NAME_LABEL, "a-cp")]);
        let other = machine(
            "w-0",
            "b",
            &[(DEPLOYMENT_NAME_LABEL, "b-md-0"), ("tier", "edge")],
        );
        let scope = |target: Target| Scope::of(&target).unwrap();
        let deployment = scope(Target {
            machine_deployment: Some("a-md-0".into()),
            ..Default::default()
        });
        assert!(deployment.selects(&worker) && !deployment.selects(&cp));
        let control_plane = scope(Target {
            control_plane: Some("a-cp".into()),
            ..Default::default()
        });
        assert!(control_plane.selects(&cp) && !control_plane.selects(&worker));
        let cluster = scope(Target {
            cluster: Some("a".into()),
            ..Default::default()
        });
        assert!(cluster.selects(&worker) && cluster.selects(&cp) && !cluster.selects(&other));
        let selector = scope(Target {
            selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "In".into(),
                    values: Some(vec!["edge".into()]),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert!(selector.selects(&other) && !selector.selects(&worker));
        assert_eq!(selector.describe(), r#"the selector "tier in (edge)""#);
        assert!(
            !scope(Target {
                machine: Some("w-0".into()),
                ..Default::default()
            })
            .is_fleet()
        );
    }

    #[test]
    fn a_target_naming_nothing_or_two_things_or_a_bad_selector_is_refused() {
        assert!(Scope::of(&Target::default()).is_err());
        assert!(
            Scope::of(&Target {
                machine: Some("m".into()),
                cluster: Some("c".into()),
                ..Default::default()
            })
            .is_err()
        );
        let bad = Scope::of(&Target {
            selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "In".into(),
                    values: None,
                }]),
                ..Default::default()
            }),
            ..Default::default()
        })
        .unwrap_err();
        assert!(
            bad.starts_with("Refused: spec.target.selector.matchExpressions[0].values"),
            "{bad}"
        );
    }
}
