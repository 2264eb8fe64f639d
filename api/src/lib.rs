//! The vocabulary of ck8s-certs, shared by the controller and its tests.
//!
//! This crate owns names, not behaviour: the Machine annotations that form the compatibility
//! surface with existing Canonical Kubernetes (CK8s) tooling, the Cluster API labels we read,
//! the names of the management-cluster Secrets a CK8s cluster has, and the k8sd constants.
//! Custom resource types live here too as they are added.

pub mod annotations;
pub mod capi;
pub mod k8sd;
