//! The vocabulary and API types of ck8s-certs, shared by the controller and its tests.
//!
//! This crate owns names and shapes, not behaviour: the Machine annotations that form the
//! compatibility surface with existing Canonical Kubernetes (CK8s) tooling, the Cluster API
//! labels and narrow object views we read, the management-cluster Secret names of a CK8s
//! cluster, k8sd constants, Event reasons and condition types, and the custom resources with the
//! value types their fields share with the controller (the duration grammar, windows).

pub mod annotations;
pub mod capi;
pub mod certificate_refresh;
pub mod cluster_certificates;
pub mod control_plane;
pub mod crds;
pub mod duration;
pub mod k8sd;
pub mod machine;
pub mod machine_certificates;
pub mod machine_deployment;
pub mod names;
pub mod reasons;
pub mod renewal_policy;
