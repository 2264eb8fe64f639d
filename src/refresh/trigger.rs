//! A refresh trigger as a user writes it (`v1beta2.k8sd.io/refresh-certificates=<ttl>`): what it
//! asks for or why it is refused, and the command that asks for a refresh now. The admission
//! webhook and the Machine reconciler both decide with these, so both say the same thing.

use ck8s_certs_api::annotations::REFRESH_CERTIFICATES;
use ck8s_certs_api::machine::MachineView;
use ck8s_certs_api::renewal_policy::DEFAULT_TTL;

use super::band::{OutsideBand, TtlBand};
use crate::policy::{DurationError, Ttl, WorkerTtlError};

/// Why a manual trigger is refused before anything happens on the node. The reconciler fails
/// the request with [`message`](Self::message); the admission webhook denies the write that sets
/// the trigger with the same text, so both say the same thing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TriggerRefusal {
    #[error("Refusing to refresh: {0}; annotate again with a valid TTL")]
    Ttl(DurationError),
    #[error("Refusing to refresh: {0}; annotate again with a TTL from 10m to 68y")]
    WorkerTtl(WorkerTtlError),
    #[error("Refusing to refresh: {error}; annotate again with a TTL {}", .band.describe())]
    Band { error: OutsideBand, band: TtlBand },
}

impl TriggerRefusal {
    /// The refusal as the Machine's reports show it: the reason, then how to renew now.
    pub fn message(&self, machine: &MachineView) -> String {
        // The hint's TTL must itself be accepted: the default, brought into a narrower band.
        let ttl = match self {
            Self::Band { band, .. } => DEFAULT_TTL.clamp(band.min(), band.max()),
            _ => DEFAULT_TTL,
        };
        with_hint(self.to_string(), &renew_now_hint(machine, &ttl.to_string()))
    }
}

/// The TTL a manual trigger asks for, or why it is refused: the grammar and its bounds, for a
/// worker the lifetimes a CertificateSigningRequest can carry, then the controller's band
/// (`--min-ttl`, `--max-ttl`). Decided from the Machine alone (the role is its control-plane
/// label), so the admission webhook can refuse exactly what the reconciler would.
pub fn check_trigger(
    machine: &MachineView,
    trigger: &str,
    band: TtlBand,
) -> Result<Ttl, TriggerRefusal> {
    let ttl: Ttl = trigger.parse().map_err(TriggerRefusal::Ttl)?;
    if !machine.control_plane {
        ttl.check_worker().map_err(TriggerRefusal::WorkerTtl)?;
    }
    band.check(ttl)
        .map_err(|error| TriggerRefusal::Band { error, band })?;
    Ok(ttl)
}

/// The command that renews a Machine's certificates now, whatever the policy says: appended to
/// every message that explains why a renewal does not happen (or failed).
pub fn renew_now_hint(machine: &MachineView, ttl: &str) -> String {
    format!(
        "Renew now: kubectl annotate machines.cluster.x-k8s.io {} -n {} {REFRESH_CERTIFICATES}={ttl} --overwrite",
        machine.name, machine.namespace
    )
}

/// `message` followed by `hint` as its last sentence.
pub fn with_hint(message: String, hint: &str) -> String {
    format!("{}. {hint}", message.trim_end().trim_end_matches('.'))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn machine() -> MachineView {
        MachineView {
            namespace: "ns".into(),
            name: "m".into(),
            control_plane: true,
            annotations: BTreeMap::new(),
            ..Default::default()
        }
    }

    #[test]
    fn a_trigger_is_checked_by_the_grammar_and_for_a_worker_by_the_csr_range() {
        // A band wider than the CSR range, so that only the grammar and the CSR range decide.
        let control_plane = machine();
        let worker = MachineView {
            control_plane: false,
            ..machine()
        };
        assert_eq!(
            check_trigger(&control_plane, "1y", TtlBand::default()).map(Ttl::as_seconds),
            Ok(365 * 86_400)
        );
        for bad in ["1yr", "", "0", "-1h", "1.5h", "1M"] {
            assert!(
                matches!(
                    check_trigger(&worker, bad, wide()),
                    Err(TriggerRefusal::Ttl(_))
                ),
                "{bad:?}"
            );
        }
        // Only a worker's certificates come through CSRs (10m to 68y).
        for ttl in ["5m", "69y"] {
            assert!(check_trigger(&control_plane, ttl, wide()).is_ok(), "{ttl}");
            assert!(
                matches!(
                    check_trigger(&worker, ttl, wide()),
                    Err(TriggerRefusal::WorkerTtl(_))
                ),
                "{ttl}"
            );
        }
        let refusal = check_trigger(&worker, "5m", wide()).unwrap_err();
        let message = refusal.message(&worker);
        assert!(
            message.starts_with("Refusing to refresh: TTL 5m is too short for a worker node")
                && message.ends_with(
                    ". Renew now: kubectl annotate machines.cluster.x-k8s.io m -n ns v1beta2.k8sd.io/refresh-certificates=1y --overwrite"
                ),
            "{message}"
        );
    }

    fn wide() -> TtlBand {
        TtlBand::new("1s".parse().unwrap(), "10000y".parse().unwrap()).unwrap()
    }

    #[test]
    fn a_trigger_outside_the_band_is_refused_with_the_band_in_the_message() {
        let control_plane = machine();
        let worker = MachineView {
            control_plane: false,
            ..machine()
        };
        let band = TtlBand::default();
        for view in [&control_plane, &worker] {
            // Both ends are inside; a second beyond either is not.
            for inside in ["1d", "24h", "1y", "365d"] {
                assert!(check_trigger(view, inside, band).is_ok(), "{inside}");
            }
            // (A worker's 1m and 10000y are the CSR range's refusal, below.)
            for outside in ["23h59m59s", "1y1s"] {
                assert!(
                    matches!(
                        check_trigger(view, outside, band),
                        Err(TriggerRefusal::Band { .. })
                    ),
                    "{outside}"
                );
            }
            // Unparsable is the grammar's refusal, not the band's.
            assert!(matches!(
                check_trigger(view, "1yr", band),
                Err(TriggerRefusal::Ttl(_))
            ));
        }
        let message = check_trigger(&control_plane, "1m", band)
            .unwrap_err()
            .message(&control_plane);
        assert!(
            message.starts_with(
                "Refusing to refresh: TTL 1m is below the minimum 1d (--min-ttl); annotate again with a TTL from 1d to 1y. Renew now:"
            ),
            "{message}"
        );
        let message = check_trigger(&control_plane, "10000y", band)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("TTL 10000y is above the maximum 1y (--max-ttl)"),
            "{message}"
        );
        // A worker's CSR range is checked first: outside it the CSR is named, whatever the band.
        for ttl in ["1m", "10000y"] {
            assert!(matches!(
                check_trigger(&worker, ttl, band),
                Err(TriggerRefusal::WorkerTtl(_))
            ));
        }
        let low = TtlBand::new("1m".parse().unwrap(), "1y".parse().unwrap()).unwrap();
        assert!(check_trigger(&control_plane, "5m", low).is_ok());
        assert!(matches!(
            check_trigger(&worker, "5m", low),
            Err(TriggerRefusal::WorkerTtl(_))
        ));
    }
}
