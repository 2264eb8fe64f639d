use ck8s_certs_api::machine_certificates::Phase;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;

fn carrier(lease: &str, holder: &str) -> Carrier {
    Carrier {
        lease: lease.into(),
        holder: holder.into(),
    }
}

fn op(by: Option<Carrier>) -> Operation {
    Operation {
        carrier: by,
        ..crate::controllers::machine::testing::op(Phase::Running, "1y")
    }
}

fn lease(holder: &str, seconds: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(seconds),
        ..LeaseSpec::default()
    }
}

const A: &str = "sys/ck8s-certs-a";
const B: &str = "sys/ck8s-certs-b";

/// What `b-1` of shard B decides for an operation `a-1` of shard A carries, with A's Lease as
/// `lease`, unchanged for `unchanged_for`.
fn seen_from_b(lease: Option<&LeaseSpec>, unchanged_for: Duration) -> Verdict {
    let theirs = op(Some(carrier(A, "a-1")));
    verdict(&theirs, Some(&carrier(B, "b-1")), lease, unchanged_for)
}

#[test]
fn an_operation_of_a_live_instance_of_another_shard_is_left_to_it() {
    let held = lease("a-1", 15);
    assert_eq!(
        seen_from_b(Some(&held), Duration::from_secs(3)),
        Verdict::Leave {
            carrier: carrier(A, "a-1"),
            retry: RECHECK
        }
    );
    // Close to expiry: look again just then.
    assert_eq!(
        seen_from_b(Some(&held), Duration::from_millis(14_500)),
        Verdict::Leave {
            carrier: carrier(A, "a-1"),
            retry: Duration::from_millis(500)
        }
    );
}

#[test]
fn an_operation_whose_carrier_is_gone_is_resumed() {
    // Expired on our clock, released, taken over by a standby, or deleted.
    for (lease, unchanged_for) in [
        (Some(lease("a-1", 15)), Duration::from_secs(15)),
        (Some(lease("", 15)), Duration::ZERO),
        (Some(lease("a-2", 15)), Duration::ZERO),
        (None, Duration::ZERO),
    ] {
        assert_eq!(
            seen_from_b(lease.as_ref(), unchanged_for),
            Verdict::Proceed,
            "{lease:?}"
        );
    }
}

#[test]
fn our_own_shard_and_ownerless_operations_resume_as_after_a_crash() {
    // A previous leader of our own Lease (we hold it now): resumed from the record.
    let previous = op(Some(carrier(B, "b-0")));
    let ours = carrier(B, "b-1");
    assert_eq!(
        verdict(
            &previous,
            Some(&ours),
            Some(&lease("b-1", 15)),
            Duration::ZERO
        ),
        Verdict::Proceed
    );
    // Written before operations named their carrier.
    assert_eq!(
        verdict(&op(None), Some(&ours), None, Duration::ZERO),
        Verdict::Proceed
    );
}

#[test]
fn without_leader_election_we_still_wait_for_a_live_carrier() {
    let theirs = op(Some(carrier(A, "a-1")));
    assert!(matches!(
        verdict(&theirs, None, Some(&lease("a-1", 15)), Duration::ZERO),
        Verdict::Leave { .. }
    ));
}

#[test]
fn a_finished_operation_is_left_to_its_carrier_to_show_only_briefly() {
    let now = Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs(1000);
    let mut done = op(Some(carrier(A, "a-1")));
    done.phase = Phase::Succeeded;
    done.finished_at = Some(Time(now - jiff::SignedDuration::from_secs(5)));
    assert!(leave_record(&done, now));
    done.finished_at = Some(Time(now - jiff::SignedDuration::from_secs(31)));
    assert!(!leave_record(&done, now));
    done.finished_at = None;
    assert!(!leave_record(&done, now));
}

#[test]
fn the_label_follows_the_machine() {
    assert_eq!(label_patch(Some("a"), Some("a")), None);
    assert_eq!(label_patch(None, None), None);
    assert_eq!(
        label_patch(Some("b"), Some("a")),
        Some(json!({ "metadata": { "labels": { WATCH_FILTER_LABEL: "b" } } }))
    );
    assert_eq!(
        label_patch(Some("b"), None),
        Some(json!({ "metadata": { "labels": { WATCH_FILTER_LABEL: "b" } } }))
    );
    // A merge patch removes a key set to null.
    assert_eq!(
        label_patch(None, Some("a")),
        Some(json!({ "metadata": { "labels": { WATCH_FILTER_LABEL: null } } }))
    );
}

#[test]
fn a_resumed_operation_is_the_same_one() {
    let recorded = op(Some(carrier(A, "a-1")));
    let mut resumed = recorded.clone();
    resumed.seed = Some(8);
    resumed.carrier = None;
    assert!(same_operation(&recorded, &resumed));
    let mut other = recorded.clone();
    other.started_at = Time(Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs(1));
    assert!(!same_operation(&recorded, &other));
}
