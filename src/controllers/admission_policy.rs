//! Whether one of ck8s-certs' admission policies checked an object. The policies decide who may
//! write what makes the controller act, but they can be missing (`clusterctl upgrade` deletes
//! and re-creates a provider's components; Kubernetes below 1.30 has none): before the
//! controller acts on what only a policy guards, it asks whether that policy and its binding
//! (of the same name) exist and were in force, a few seconds after their creation, when the
//! object was last written.

use jiff::Timestamp;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::{Api, Client, ResourceExt};

/// How long after its creation an admission policy counts as in force. API servers load a new
/// policy through an informer, each on its own (a write a moment after the creation can pass
/// unchecked), and creation times and managed-field times are whole seconds (a write in the same
/// second may precede it): 3 s of whole seconds is at least 2 s in fact. Failing closed costs a
/// user who wrote within those seconds one more write.
pub const SETTLE: jiff::SignedDuration = jiff::SignedDuration::from_secs(3);

/// Why an admission policy cannot have checked an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotInForce {
    /// The policy (`ValidatingAdmissionPolicy`) or its binding is not installed.
    Missing(&'static str),
    /// The object was written at `written`, before the policy and its binding were both in
    /// force (`since`: the younger one's creation plus [`SETTLE`]).
    Younger {
        written: Timestamp,
        since: Timestamp,
    },
}

/// Whether the admission policy `name` and its binding exist and were in force when the object
/// was written (`written`; `None`: not known, not compared). An API error is the caller's to
/// retry, never a refusal.
pub async fn in_force(
    client: &Client,
    name: &str,
    written: Option<Timestamp>,
) -> Result<Result<(), NotInForce>, kube::Error> {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let (found, bound) = futures::try_join!(policies.get_opt(name), bindings.get_opt(name))?;
    let (found, bound) = match (found, bound) {
        (None, _) => return Ok(Err(NotInForce::Missing("ValidatingAdmissionPolicy"))),
        (_, None) => return Ok(Err(NotInForce::Missing("ValidatingAdmissionPolicyBinding"))),
        (Some(found), Some(bound)) => (found, bound),
    };
    Ok(checked(
        written,
        [found.creation_timestamp(), bound.creation_timestamp()],
    ))
}

/// Whether an object written at `written` (`None`: not known, not compared) was written after
/// the policy and binding created at `created` were in force.
fn checked(written: Option<Timestamp>, created: [Option<Time>; 2]) -> Result<(), NotInForce> {
    let since = created.into_iter().flatten().map(|t| t.0).max();
    match (written, since.and_then(|at| at.checked_add(SETTLE).ok())) {
        (Some(written), Some(since)) if written < since => {
            Err(NotInForce::Younger { written, since })
        }
        _ => Ok(()),
    }
}

/// When the object itself (not a subresource such as its status) was last written, as its
/// managed fields record: every write that changes a field stamps its manager's entry. `None`
/// when no entry says (the managed fields were cleared).
pub fn last_written(meta: &ObjectMeta) -> Option<Timestamp> {
    meta.managed_fields
        .iter()
        .flatten()
        .filter(|entry| entry.subresource.as_deref().unwrap_or_default().is_empty())
        .filter_map(|entry| entry.time.as_ref().map(|t| t.0))
        .max()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};

    use super::*;

    fn entry(at: &str, subresource: Option<&str>) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some("someone".into()),
            operation: Some("Update".into()),
            subresource: subresource.map(str::to_owned),
            time: Some(Time(at.parse().unwrap())),
            ..ManagedFieldsEntry::default()
        }
    }

    #[test]
    fn the_last_write_is_the_newest_entry_of_the_object_itself() {
        let meta = |entries: Vec<ManagedFieldsEntry>| ObjectMeta {
            managed_fields: Some(entries),
            ..ObjectMeta::default()
        };
        let written = last_written(&meta(vec![
            entry("2026-01-01T00:00:00Z", None),
            entry("2026-03-01T00:00:00Z", Some("")),
            // The controller's status writes change nothing a policy checks.
            entry("2026-06-01T00:00:00Z", Some("status")),
        ]));
        assert_eq!(written, Some("2026-03-01T00:00:00Z".parse().unwrap()));
        let cleared = meta(vec![ManagedFieldsEntry::default()]);
        assert_eq!(last_written(&cleared), None);
        assert_eq!(last_written(&ObjectMeta::default()), None);
    }

    #[test]
    fn a_write_counts_as_checked_only_once_both_objects_had_settled() {
        let at = |s: &str| Some(Time(s.parse().unwrap()));
        let written = |s: &str| Some(s.parse::<Timestamp>().unwrap());
        let created = [at("2026-11-29T19:11:50Z"), at("2026-11-29T19:11:52Z")];
        let since: Timestamp = "2026-11-29T19:11:55Z".parse().unwrap();
        // The same whole second as the younger creation (the write may have come first), and
        // the seconds API servers take to load it: not checked.
        for early in [
            "2026-11-29T19:11:40Z",
            "2026-11-29T19:11:52Z",
            "2026-11-29T19:11:54Z",
        ] {
            assert_eq!(
                checked(written(early), created.clone()),
                Err(NotInForce::Younger {
                    written: early.parse().unwrap(),
                    since
                }),
                "{early}"
            );
        }
        assert_eq!(
            checked(written("2026-11-29T19:11:55Z"), created.clone()),
            Ok(())
        );
        assert_eq!(checked(None, created), Ok(()));
        assert_eq!(
            checked(written("2026-11-29T19:11:40Z"), [None, None]),
            Ok(())
        );
    }
}
