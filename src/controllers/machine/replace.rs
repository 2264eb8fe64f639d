//! Replacing a worker that cannot be refreshed in place, when its policy says so
//! (`inPlaceImpossible: {action: Replace}`): the Machine is deleted, so that its MachineSet
//! creates a new one. Whether it may go now is a pure function of what the cluster's Machines
//! show ([`may_replace`], table-tested below); the reads and the one delete are in
//! [`Act::replace`].

use std::time::Duration;

use ck8s_certs_api::annotations::{
    CERTIFICATES_EXPIRY, REFRESH_CERTIFICATES, REFRESH_CERTIFICATES_STATUS, RefreshStatus,
};
use ck8s_certs_api::capi::{CLUSTER_NAME_LABEL, DEPLOYMENT_NAME_LABEL, GROUP};
use ck8s_certs_api::machine::MachineView;
use ck8s_certs_api::reasons::events;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Preconditions};
use kube::core::GroupVersionKind;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use tracing::{info, warn};

use super::act::Act;
use super::report::Reporter;
use super::verdict::Replacement;
use super::{Context, Error};
use crate::controllers::admission_policy::{self, NotInForce};
use crate::events::EventType;
use crate::policy::spec::MaxUnavailable;
use ck8s_certs_api::renewal_policy::CertificateRenewalPolicy;

/// How soon a replacement held back looks again: what holds it (a control plane's refresh,
/// another Machine's deletion) takes minutes.
const HELD_RECHECK: Duration = Duration::from_secs(60);

/// What one Machine of the cluster shows, for [`may_replace`].
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Peer {
    pub name: String,
    pub control_plane: bool,
    pub deleting: bool,
    /// Its recorded expiry has passed.
    pub expired: bool,
    /// A refresh of it is asked for or running.
    pub refreshing: bool,
    /// Its MachineDeployment (`cluster.x-k8s.io/deployment-name`).
    pub deployment: Option<String>,
}

impl Peer {
    fn of(machine: &MachineView, now: Timestamp) -> Self {
        let expiry = machine
            .annotation(CERTIFICATES_EXPIRY)
            .and_then(|at| at.parse::<Timestamp>().ok());
        Self {
            name: machine.name.clone(),
            control_plane: machine.control_plane,
            deleting: machine.deleting,
            expired: expiry.is_some_and(|at| at <= now),
            refreshing: machine.annotation(REFRESH_CERTIFICATES).is_some()
                || machine.annotation(REFRESH_CERTIFICATES_STATUS)
                    == Some(RefreshStatus::InProgress.as_str()),
            deployment: machine.labels.get(DEPLOYMENT_NAME_LABEL).cloned(),
        }
    }
}

/// Why a Machine is not replaced now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Hold {
    /// Never a control plane (its replacement is the control plane provider's business).
    ControlPlane,
    /// Only a Machine a MachineSet owns is created again once deleted.
    NoMachineSet,
    /// Its recorded expiry has not passed: a refused CSR from a node whose certificates are
    /// current (an authentication outage of the workload API, say) is not taken for an expired
    /// kubelet.conf.
    NotExpired,
    /// A control plane of the cluster still has expired certificates or is being refreshed:
    /// the control planes are recovered first.
    ControlPlanes(String),
    /// Another Machine of the cluster is being deleted: one at a time per cluster.
    ClusterBusy(String),
    /// Its MachineDeployment already has as many Machines being deleted as allowed.
    Deployment {
        deployment: String,
        deleting: usize,
        allowed: usize,
    },
}

impl std::fmt::Display for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ControlPlane => f.write_str("it is a control plane, which is never replaced"),
            Self::NoMachineSet => f.write_str(
                "no MachineSet owns it, so nothing would create it again: replace it by hand",
            ),
            Self::NotExpired => f.write_str(
                "its recorded certificates have not expired, so its kubelet.conf is not known to have: refresh it by hand to see again",
            ),
            Self::ControlPlanes(name) => write!(
                f,
                "control plane {name} of its cluster is not refreshed yet: the control planes are recovered first"
            ),
            Self::ClusterBusy(name) => write!(
                f,
                "Machine {name} of its cluster is being deleted: one Machine of a cluster at a time"
            ),
            Self::Deployment {
                deployment,
                deleting,
                allowed,
            } => write!(
                f,
                "MachineDeployment {deployment} has {deleting} Machine(s) being deleted and inPlaceImpossible.maxUnavailable allows {allowed}"
            ),
        }
    }
}

/// Whether `machine` (owned by `owner`, if anyone) may be deleted now, given every Machine of
/// its cluster (`peers`, itself included) and the share of a MachineDeployment that may be
/// being deleted at once.
pub(super) fn may_replace(
    machine: &Peer,
    owner: Option<&OwnerReference>,
    peers: &[Peer],
    max_unavailable: MaxUnavailable,
) -> Result<(), Hold> {
    if machine.control_plane {
        return Err(Hold::ControlPlane);
    }
    if !owner.is_some_and(is_machine_set) {
        return Err(Hold::NoMachineSet);
    }
    if !machine.expired {
        return Err(Hold::NotExpired);
    }
    let others = || peers.iter().filter(|p| p.name != machine.name);
    if let Some(cp) =
        others().find(|p| p.control_plane && !p.deleting && (p.expired || p.refreshing))
    {
        return Err(Hold::ControlPlanes(cp.name.clone()));
    }
    if let Some(busy) = others().find(|p| p.deleting) {
        return Err(Hold::ClusterBusy(busy.name.clone()));
    }
    if let Some(deployment) = &machine.deployment {
        let members: Vec<&Peer> = peers
            .iter()
            .filter(|p| p.deployment.as_ref() == Some(deployment))
            .collect();
        let deleting = members.iter().filter(|p| p.deleting).count();
        let allowed = max_unavailable.of(members.len());
        if deleting + 1 > allowed {
            return Err(Hold::Deployment {
                deployment: deployment.clone(),
                deleting,
                allowed,
            });
        }
    } else if max_unavailable.of(1) == 0 {
        // A Machine of a MachineSet without a MachineDeployment: its MachineSet is its share.
        return Err(Hold::Deployment {
            deployment: "(none: its MachineSet)".into(),
            deleting: 0,
            allowed: 0,
        });
    }
    Ok(())
}

/// A Cluster API MachineSet that controls the Machine.
fn is_machine_set(owner: &OwnerReference) -> bool {
    owner.kind == "MachineSet"
        && owner.controller == Some(true)
        && owner.api_version.split_once('/').map(|(g, _)| g) == Some(GROUP)
}

impl Act<'_> {
    /// Deletes the Machine (so that its MachineSet creates a new one) when [`may_replace`]
    /// allows it, reading the Machine and its cluster's Machines live: a stale cache must not
    /// let two go at once. Deleted on the condition that it did not change since it was read.
    pub(super) async fn replace(&self, replacement: Replacement) -> Result<Action, Error> {
        let view = self.view;
        let now = self.ctx.clock.now();
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
            GROUP,
            self.ctx.capi().as_str(),
            "Machine",
        ));
        let machines: Api<DynamicObject> =
            Api::namespaced_with(self.ctx.client().clone(), &view.namespace, &resource);
        let Some(machine) = machines.get_opt(&view.name).await? else {
            return Ok(Action::await_change());
        };
        if machine.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let cluster = view.cluster.clone().unwrap_or_default();
        let listed = machines
            .list(&ListParams::default().labels(&format!("{CLUSTER_NAME_LABEL}={cluster}")))
            .await?;
        let peers: Vec<Peer> = listed
            .items
            .iter()
            .map(|m| Peer::of(&MachineView::from_dynamic(m), now))
            .collect();
        let this = Peer::of(&MachineView::from_dynamic(&machine), now);
        let owner = machine
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true));
        if let Err(hold) = may_replace(&this, owner, &peers, replacement.max_unavailable) {
            info!(why = %hold, policy = replacement.policy, "Not replaced yet");
            return Ok(Action::requeue(HELD_RECHECK));
        }
        if let Err(why) = policy_checked(self.ctx, view, &replacement).await? {
            return Ok(refused(self.ctx, &self.report, view, why).await);
        }
        let owner = owner.map(|o| o.name.clone()).unwrap_or_default();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: machine.uid(),
                resource_version: machine.resource_version(),
            }),
            ..DeleteParams::default()
        };
        match machines.delete(&view.name, &params).await {
            Ok(_) => {}
            // Changed since it was read (a person acted meanwhile): looked at again.
            Err(kube::Error::Api(status)) if status.code == 409 => {
                return Ok(Action::requeue(Duration::from_secs(5)));
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                return Ok(Action::await_change());
            }
            Err(err) => return Err(err.into()),
        }
        let message = format!(
            "Deleted Machine {} (owned by MachineSet {owner}), so that its MachineSet creates a new one: it could not be refreshed in place (its kubelet.conf expired), and CertificateRenewalPolicy {} replaces such workers (inPlaceImpossible: Replace)",
            view.name, replacement.policy
        );
        info!(
            policy = replacement.policy,
            machine_set = owner,
            "Deleted the Machine to be replaced"
        );
        self.ctx
            .replace_refusals
            .forget(&view.namespace, &view.name);
        self.ctx.metrics.machines_replaced.inc();
        self.report
            .event(
                EventType::Warning,
                events::MACHINE_REPLACED,
                message.clone(),
            )
            .await;
        self.report
            .cluster_event(
                &self.ctx.stores.clusters,
                EventType::Warning,
                events::MACHINE_REPLACED,
                message,
            )
            .await;
        Ok(Action::await_change())
    }
}

/// Whether the admission policy that lets only a user who may delete Machines ask for
/// Replace checked the renewal policy's last write (`--renewal-admission-policy`): a
/// policy written while it was missing makes nothing deleted. `Err`: an API error, retried.
async fn policy_checked(
    ctx: &Context,
    view: &MachineView,
    replacement: &Replacement,
) -> Result<Result<(), String>, Error> {
    let Some(admission) = ctx.config().renewal_admission_policy.as_deref() else {
        return Ok(Ok(()));
    };
    let namespace = &view.namespace;
    let policies: Api<CertificateRenewalPolicy> = Api::namespaced(ctx.client().clone(), namespace);
    // Read live: the cache keeps no managed fields, and it is the policy as it is now that
    // must have been checked.
    let Some(policy) = policies.get_opt(&replacement.policy).await? else {
        return Ok(Err(format!(
            "CertificateRenewalPolicy {} no longer exists",
            replacement.policy
        )));
    };
    let again = format!(
        "write it again as a user who may delete Machines in namespace {namespace}, e.g. `kubectl annotate certificaterenewalpolicies.certificates.ck8s.io -n {namespace} {} reviewed=$(date -u +%FT%TZ) --overwrite`",
        replacement.policy
    );
    let Some(written) = admission_policy::last_written(&policy.metadata) else {
        return Ok(Err(format!(
            "when CertificateRenewalPolicy {} was last written is not known (its managed fields were cleared), so whether the admission policy {admission} checked its writer is not known: {again}",
            replacement.policy
        )));
    };
    let client = ctx.client();
    Ok(
        match admission_policy::in_force(client, admission, Some(written)).await? {
            Ok(()) => Ok(()),
            Err(NotInForce::Missing(kind)) => Err(format!(
                "the {kind} {admission}, which lets only a user who may delete Machines ask a CertificateRenewalPolicy to replace them, is not installed, so nothing checked who wrote CertificateRenewalPolicy {}: reinstall ck8s-certs' admission policies (config/policy), then {again}",
                replacement.policy
            )),
            Err(NotInForce::Younger { written, since }) => Err(format!(
                "CertificateRenewalPolicy {} was last written at {written}, before the admission policy {admission} that checks who asks for Replace was in force (since {since}), so nothing checked its writer: {again}",
                replacement.policy
            )),
        },
    )
}

/// Says once (Warning Event, log) why the Machine is not replaced; looked at again at the
/// resync period (what changes it, a policy installed or written again, wakes nothing).
async fn refused(ctx: &Context, report: &Reporter<'_>, view: &MachineView, why: String) -> Action {
    let message = format!("Machine {} is not replaced: {why}", view.name);
    if ctx
        .replace_refusals
        .first(&view.namespace, &view.name, &message)
    {
        warn!(why, "Not replaced: the renewal policy was not checked");
        report
            .event(EventType::Warning, events::MACHINE_REPLACE_REFUSED, message)
            .await;
    }
    Action::requeue(ctx.config().resync)
}

/// The refusals to replace a Machine already announced, by Machine: each is said once, not at
/// every look again.
#[derive(Default)]
pub struct Refusals(std::sync::Mutex<std::collections::HashMap<(String, String), String>>);

impl Refusals {
    /// Whether `message` is new for the Machine (and so to be said); remembered.
    fn first(&self, namespace: &str, name: &str, message: &str) -> bool {
        let Ok(mut said) = self.0.lock() else {
            return true;
        };
        let key = (namespace.to_owned(), name.to_owned());
        if said.get(&key).map(String::as_str) == Some(message) {
            return false;
        }
        said.insert(key, message.to_owned());
        true
    }

    /// The Machine is gone: nothing to remember of it.
    fn forget(&self, namespace: &str, name: &str) {
        if let Ok(mut said) = self.0.lock() {
            said.remove(&(namespace.to_owned(), name.to_owned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(name: &str, control_plane: bool) -> Peer {
        Peer {
            name: name.into(),
            control_plane,
            deleting: false,
            expired: false,
            refreshing: false,
            deployment: (!control_plane).then(|| "md-0".to_owned()),
        }
    }

    fn machine_set(api_version: &str, controller: Option<bool>) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: "MachineSet".into(),
            name: "md-0-abc".into(),
            uid: "u".into(),
            controller,
            ..Default::default()
        }
    }

    /// What is asked, of which Machine and its owner: what is answered.
    type OwnerRow = (&'static str, Peer, Option<OwnerReference>, Result<(), Hold>);

    /// What is asked, of which cluster and share: what is answered.
    type ClusterRow = (&'static str, Vec<Peer>, MaxUnavailable, Result<(), Hold>);

    #[test]
    fn only_a_machine_set_worker_goes_and_only_when_its_cluster_and_deployment_allow() {
        let owned = machine_set("cluster.x-k8s.io/v1beta2", Some(true));
        let lost = Peer {
            expired: true,
            ..peer("w-2", false)
        };
        let cluster = || {
            vec![
                peer("cp-0", true),
                peer("cp-1", true),
                peer("w-0", false),
                peer("w-1", false),
                lost.clone(),
            ]
        };
        let one = MaxUnavailable::Count(1);
        // Which Machine, owned how, in a recovered cluster.
        let rows: [OwnerRow; 5] = [
            (
                "a worker of a MachineSet, all recovered",
                lost.clone(),
                Some(owned.clone()),
                Ok(()),
            ),
            (
                "a control plane: never",
                peer("cp-0", true),
                Some(owned.clone()),
                Err(Hold::ControlPlane),
            ),
            ("no owner", lost.clone(), None, Err(Hold::NoMachineSet)),
            (
                "owned, but not controlled, by a MachineSet",
                lost.clone(),
                Some(machine_set("cluster.x-k8s.io/v1beta2", None)),
                Err(Hold::NoMachineSet),
            ),
            (
                "a MachineSet of another API group",
                lost.clone(),
                Some(machine_set("example.com/v1", Some(true))),
                Err(Hold::NoMachineSet),
            ),
        ];
        for (name, machine, owner, expected) in rows {
            assert_eq!(
                may_replace(&machine, owner.as_ref(), &cluster(), one),
                expected,
                "{name}"
            );
        }
        // The worker of a MachineSet, in a cluster as `with` changes it, under a share.
        let with = |change: &dyn Fn(&mut Vec<Peer>)| {
            let mut peers = cluster();
            change(&mut peers);
            peers
        };
        let no_deletion = Err(Hold::Deployment {
            deployment: "md-0".into(),
            deleting: 0,
            allowed: 0,
        });
        let rows: [ClusterRow; 7] = [
            (
                "a control plane still expired",
                with(&|p| p[1].expired = true),
                one,
                Err(Hold::ControlPlanes("cp-1".into())),
            ),
            (
                "a control plane being refreshed",
                with(&|p| p[0].refreshing = true),
                one,
                Err(Hold::ControlPlanes("cp-0".into())),
            ),
            (
                "an expired control plane being deleted: not waited for, but one deletion at a time",
                with(&|p| {
                    p[1].expired = true;
                    p[1].deleting = true;
                }),
                MaxUnavailable::Count(5),
                Err(Hold::ClusterBusy("cp-1".into())),
            ),
            (
                "another Machine of the cluster being deleted",
                with(&|p| p[2].deleting = true),
                MaxUnavailable::Count(5),
                Err(Hold::ClusterBusy("w-0".into())),
            ),
            (
                "a worker expired too does not hold it (it is next)",
                with(&|p| p[2].expired = true),
                one,
                Ok(()),
            ),
            (
                "25% of three workers is none",
                cluster(),
                MaxUnavailable::Percent(25),
                no_deletion.clone(),
            ),
            (
                "0 replaces none",
                cluster(),
                MaxUnavailable::Count(0),
                no_deletion,
            ),
        ];
        for (name, peers, max, expected) in rows {
            assert_eq!(
                may_replace(&lost, Some(&owned), &peers, max),
                expected,
                "{name}"
            );
        }
        // Another deployment's deletions count against the cluster, not the deployment: one
        // Machine of a cluster at a time holds first.
        let mut peers = cluster();
        peers.push(Peer {
            deleting: true,
            deployment: Some("md-1".into()),
            ..peer("x-0", false)
        });
        assert_eq!(
            may_replace(&lost, Some(&owned), &peers, MaxUnavailable::Percent(100)),
            Err(Hold::ClusterBusy("x-0".into()))
        );
    }

    #[test]
    fn what_holds_it_is_said_plainly() {
        assert_eq!(
            Hold::Deployment {
                deployment: "md-0".into(),
                deleting: 1,
                allowed: 1
            }
            .to_string(),
            "MachineDeployment md-0 has 1 Machine(s) being deleted and inPlaceImpossible.maxUnavailable allows 1"
        );
        assert!(
            Hold::NoMachineSet
                .to_string()
                .contains("replace it by hand")
        );
    }
}
