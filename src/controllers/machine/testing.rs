//! What the Machine reconciler's tests are made of: a CK8s control-plane Machine with its node,
//! and the operations of its refreshes.

use std::collections::BTreeMap;

use ck8s_certs_api::machine::MachineView;
use ck8s_certs_api::machine_certificates::{Operation, Origin, Phase};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Control plane `ns/m` of cluster `c` on node `n`, bootstrapped by CK8s, with `annotations`.
pub fn machine(annotations: &[(&str, &str)]) -> MachineView {
    MachineView {
        namespace: "ns".into(),
        name: "m".into(),
        uid: Some("uid".into()),
        cluster: Some("c".into()),
        control_plane: true,
        bootstrap_kind: Some("CK8sConfig".into()),
        bootstrap_group: Some("bootstrap.cluster.x-k8s.io".into()),
        bootstrap_name: Some("m".into()),
        node_name: Some("n".into()),
        annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        labels: BTreeMap::new(),
        deleting: false,
        ..Default::default()
    }
}

/// An operation for `trigger` in `phase`: seed 42, one `run` sent.
pub fn op(phase: Phase, trigger: &str) -> Operation {
    Operation {
        seed: Some(42),
        phase,
        run_attempts: 1,
        ..Operation::pending(
            Origin::Manual,
            None,
            Some(trigger.into()),
            trigger.into(),
            3600,
            Time(Timestamp::UNIX_EPOCH),
        )
    }
}
