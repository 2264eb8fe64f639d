//! How the end of an operation changes the Machine's status: a pure function of the status, the
//! operation, how it ended and `now`, table-tested below. [`outcome`](super::outcome) writes the
//! answer in one status write, then shows it on the Machine.
//!
//! - Succeeded: the new expiry is the observed one, the backoff ends (any success does), a
//!   fail-safe bypass of another operation is forgotten; `Ready` True (Refreshed).
//! - Failed: an automatic (Policy) attempt counts for the backoff, remembered in the status so
//!   it survives restarts; a manual or fleet one does not (a person is watching it); `Ready`
//!   False (RefreshFailed, or InPlaceImpossible for a worker that must be replaced) with the
//!   message.
//! - Either way `Refreshing` goes False and the operation is recorded finished.

use ck8s_certs_api::machine_certificates::{MachineCertificatesStatus, Operation, Origin, Phase};
use ck8s_certs_api::reasons::{condition_reasons as why, conditions};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::controllers::governing_policy::{forget_window_bypass, show_window_bypass};
use crate::controllers::patches::{rfc3339, set_condition};

/// How an operation ended, for the status.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Ending {
    /// `run` answered; `op.new_expiry` holds the node's new expiry.
    Succeeded,
    /// It failed: the message users see (what went wrong and how to renew now).
    Failed(String),
    /// It failed in a way no refresh can fix (a worker whose kubelet.conf expired): the message
    /// says how to replace the Machine. Counted like a failure.
    Impossible(String),
}

/// How a finished `op` ended (to record it again after a crash).
pub(super) fn ending_of(op: &Operation) -> Ending {
    match op.phase {
        Phase::Succeeded => Ending::Succeeded,
        _ => Ending::Failed(op.error.clone().unwrap_or_default()),
    }
}

/// Records the end of `op` in `status` (and in `op`).
pub(super) fn conclude(
    status: &mut MachineCertificatesStatus,
    op: &mut Operation,
    ending: Ending,
    now: Timestamp,
) {
    op.finished_at = Some(Time(now));
    let ending_is_impossible = matches!(ending, Ending::Impossible(_));
    match ending {
        Ending::Succeeded => {
            op.phase = Phase::Succeeded;
            status.failed_attempts = None;
            status.last_failure_time = None;
            forget_window_bypass(status, op);
            show_window_bypass(status, now);
            status.expiry = op.new_expiry.clone();
            let expiry = op.new_expiry.as_ref().map(rfc3339).unwrap_or_default();
            set_condition(
                status,
                conditions::READY,
                true,
                why::REFRESHED,
                format!("Certificates refreshed; they expire at {expiry}"),
                now,
            );
        }
        Ending::Failed(message) | Ending::Impossible(message) => {
            let reason = match ending_is_impossible {
                true => why::IN_PLACE_IMPOSSIBLE,
                false => why::REFRESH_FAILED,
            };
            if op.origin == Origin::Policy {
                status.failed_attempts =
                    Some(status.failed_attempts.unwrap_or(0).max(0).saturating_add(1));
                status.last_failure_time = Some(Time(now));
            }
            op.phase = Phase::Failed;
            op.error = Some(message.clone());
            set_condition(status, conditions::READY, false, reason, message, now);
        }
    }
    set_condition(
        status,
        conditions::REFRESHING,
        false,
        why::IDLE,
        "No refresh in progress".into(),
        now,
    );
    status.operation = Some(op.clone());
}

#[cfg(test)]
mod tests {
    use ck8s_certs_api::machine_certificates::WindowBypass;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    use super::*;

    const STARTED: i64 = 1_800_000_000;
    const NOW: i64 = STARTED + 60;
    const NEW_EXPIRY: i64 = STARTED + 365 * 86_400;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(second).unwrap())
    }

    fn running(origin: Origin, bypassed_windows: bool) -> Operation {
        Operation {
            seed: Some(7),
            phase: Phase::Running,
            run_attempts: 1,
            bypassed_windows,
            ..Operation::pending(origin, None, None, "1y".into(), 31_536_000, at(STARTED))
        }
    }

    /// A Machine two automatic failures into its backoff, refreshing, with an earlier bypass.
    fn backing_off() -> MachineCertificatesStatus {
        let mut status = MachineCertificatesStatus {
            expiry: Some(at(STARTED + 86_400)),
            failed_attempts: Some(2),
            last_failure_time: Some(at(STARTED - 3_600)),
            last_window_bypass: Some(WindowBypass {
                time: at(STARTED - 7_200),
                expiry: Some(at(STARTED + 86_400)),
                message: "Renewed outside its windows: expiry within the fail-safe margin".into(),
            }),
            ..Default::default()
        };
        set_condition(
            &mut status,
            conditions::REFRESHING,
            true,
            why::REFRESH_IN_PROGRESS,
            "Refreshing with seed 7".into(),
            Timestamp::from_second(STARTED).unwrap(),
        );
        status
    }

    fn condition<'a>(status: &'a MachineCertificatesStatus, type_: &str) -> &'a Condition {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .unwrap_or_else(|| panic!("no {type_} in {:?}", status.conditions))
    }

    /// The Ready condition's status, reason and message.
    fn ready(status: &MachineCertificatesStatus) -> (&str, &str, &str) {
        let ready = condition(status, conditions::READY);
        (
            ready.status.as_str(),
            ready.reason.as_str(),
            ready.message.as_str(),
        )
    }

    fn conclude_at_now(status: &mut MachineCertificatesStatus, op: &mut Operation, ending: Ending) {
        conclude(status, op, ending, Timestamp::from_second(NOW).unwrap());
    }

    #[test]
    fn a_success_records_the_new_expiry_and_ends_the_backoff() {
        for origin in [Origin::Manual, Origin::Policy, Origin::Fleet] {
            let mut status = backing_off();
            let mut op = running(origin, false);
            op.new_expiry = Some(at(NEW_EXPIRY));
            conclude_at_now(&mut status, &mut op, Ending::Succeeded);

            assert_eq!(op.phase, Phase::Succeeded);
            assert_eq!(op.finished_at, Some(at(NOW)));
            assert_eq!(status.operation.as_ref(), Some(&op));
            assert_eq!(status.expiry, Some(at(NEW_EXPIRY)));
            assert_eq!(status.failed_attempts, None, "{origin:?}");
            assert_eq!(status.last_failure_time, None);
            let message = format!(
                "Certificates refreshed; they expire at {}",
                rfc3339(&at(NEW_EXPIRY))
            );
            assert_eq!(ready(&status), ("True", why::REFRESHED, message.as_str()));
            let refreshing = condition(&status, conditions::REFRESHING);
            assert_eq!(refreshing.status, "False");
            assert_eq!(refreshing.reason, why::IDLE);
            assert_eq!(refreshing.last_transition_time, at(NOW));
        }
    }

    #[test]
    fn a_success_forgets_an_earlier_bypass_but_keeps_its_own() {
        let mut status = backing_off();
        let mut op = running(Origin::Policy, false);
        conclude_at_now(&mut status, &mut op, Ending::Succeeded);
        assert_eq!(status.last_window_bypass, None);
        assert!(
            !status
                .conditions
                .iter()
                .any(|c| c.type_ == conditions::RENEWAL_WINDOW_BYPASSED && c.status == "True"),
            "{:?}",
            status.conditions
        );

        let mut status = backing_off();
        let kept = status.last_window_bypass.clone();
        let mut op = running(Origin::Policy, true);
        conclude_at_now(&mut status, &mut op, Ending::Succeeded);
        assert_eq!(status.last_window_bypass, kept);
        let bypassed = condition(&status, conditions::RENEWAL_WINDOW_BYPASSED);
        assert_eq!(bypassed.status, "True");
    }

    #[test]
    fn an_automatic_failure_counts_for_the_backoff_and_a_manual_or_fleet_one_does_not() {
        let cases = [
            (Origin::Policy, Some(3), Some(at(NOW))),
            (Origin::Manual, Some(2), Some(at(STARTED - 3_600))),
            (Origin::Fleet, Some(2), Some(at(STARTED - 3_600))),
        ];
        for (origin, attempts, last_failure) in cases {
            let mut status = backing_off();
            let expiry = status.expiry.clone();
            let mut op = running(origin, false);
            conclude_at_now(&mut status, &mut op, Ending::Failed("k8sd refused".into()));

            assert_eq!(op.phase, Phase::Failed);
            assert_eq!(op.error.as_deref(), Some("k8sd refused"));
            assert_eq!(op.finished_at, Some(at(NOW)));
            assert_eq!(status.operation.as_ref(), Some(&op));
            assert_eq!(status.failed_attempts, attempts, "{origin:?}");
            assert_eq!(status.last_failure_time, last_failure, "{origin:?}");
            assert_eq!(status.expiry, expiry, "a failure keeps the known expiry");
            assert_eq!(
                ready(&status),
                ("False", why::REFRESH_FAILED, "k8sd refused")
            );
            assert_eq!(condition(&status, conditions::REFRESHING).status, "False");
        }
    }

    #[test]
    fn a_worker_that_must_be_replaced_fails_with_its_own_reason_and_counts_like_a_failure() {
        let mut status = backing_off();
        let mut op = running(Origin::Policy, false);
        conclude_at_now(
            &mut status,
            &mut op,
            Ending::Impossible("replace it".into()),
        );
        assert_eq!(op.phase, Phase::Failed);
        assert_eq!(status.failed_attempts, Some(3));
        assert_eq!(
            ready(&status),
            ("False", why::IN_PLACE_IMPOSSIBLE, "replace it")
        );
    }

    #[test]
    fn the_first_automatic_failure_starts_the_count_and_a_bad_count_is_mended() {
        for (stored, counted) in [
            (None, 1),
            (Some(0), 1),
            (Some(-4), 1),
            (Some(i64::MAX), i64::MAX),
        ] {
            let mut status = MachineCertificatesStatus {
                failed_attempts: stored,
                ..Default::default()
            };
            let mut op = running(Origin::Policy, false);
            conclude_at_now(&mut status, &mut op, Ending::Failed("no answer".into()));
            assert_eq!(status.failed_attempts, Some(counted), "{stored:?}");
        }
    }
}
