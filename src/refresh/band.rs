//! The lifetimes the controller asks k8sd for: `--min-ttl` to `--max-ttl` (1d to 1y unless
//! set). The grammar alone let anyone who may ask for a refresh (the ask-only `refresh` verb)
//! choose any lifetime: `1m` cuts Cluster API and this controller off from a cluster within
//! minutes (recovery is manual, on the nodes); `10000y` gives certificates that never rotate.
//! k8sd caps neither. The admission webhook and the controller both decide with
//! [`TtlBand::check`], so both refuse with the same message, which names the band and its flag.
//!
//! An automatic renewal is not refused: its policy's `ttl` is brought into the band
//! ([`TtlBand::clamp`]), since a refused renewal lets certificates expire.
//!
//! The band is the same for control planes and workers; a worker's TTL must also fit a
//! CertificateSigningRequest (10m to 68y, [`Ttl::check_worker`]), checked first.
//!
//! No lifetime may outlive the cluster's CA either ([`CaEnd`]): k8sd signs past its CA's
//! NotAfter, and such a certificate stops being trusted when the CA ends, whatever it says. A
//! manual refresh that asks for more is refused; an automatic one is cut to the CA's end.

use jiff::Timestamp;

use crate::policy::Ttl;

/// `--min-ttl`'s default: a certificate that ends within a day of its refresh is an outage
/// waiting to happen (`m` typed for months).
pub const DEFAULT_MIN_TTL: Ttl = Ttl::from_secs_const(86_400);

/// `--max-ttl`'s default: what CK8s issues at bootstrap and the policies' default `ttl`.
pub const DEFAULT_MAX_TTL: Ttl = Ttl::from_secs_const(365 * 86_400);

/// The lifetimes a refresh may ask for, both ends included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TtlBand {
    min: Ttl,
    max: Ttl,
}

impl Default for TtlBand {
    fn default() -> Self {
        Self {
            min: DEFAULT_MIN_TTL,
            max: DEFAULT_MAX_TTL,
        }
    }
}

/// The flags name a band with nothing in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("--min-ttl {min} is longer than --max-ttl {max}")]
pub struct InvertedBand {
    pub min: Ttl,
    pub max: Ttl,
}

/// A TTL outside the band.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OutsideBand {
    #[error("TTL {ttl} is below the minimum {min} (--min-ttl)")]
    BelowMin { ttl: Ttl, min: Ttl },
    #[error("TTL {ttl} is above the maximum {max} (--max-ttl)")]
    AboveMax { ttl: Ttl, max: Ttl },
}

impl TtlBand {
    /// From the flags; refused when `min` is longer than `max` (at start, before anything runs).
    pub fn new(min: Ttl, max: Ttl) -> Result<Self, InvertedBand> {
        if min > max {
            return Err(InvertedBand { min, max });
        }
        Ok(Self { min, max })
    }

    pub fn min(self) -> Ttl {
        self.min
    }

    pub fn max(self) -> Ttl {
        self.max
    }

    /// Whether `ttl` may be asked for; both ends are inside.
    pub fn check(self, ttl: Ttl) -> Result<(), OutsideBand> {
        if ttl < self.min {
            Err(OutsideBand::BelowMin { ttl, min: self.min })
        } else if ttl > self.max {
            Err(OutsideBand::AboveMax { ttl, max: self.max })
        } else {
            Ok(())
        }
    }

    /// The lifetime an automatic renewal asks for: its policy's `ttl`, brought into the band
    /// (with why, when it was). A renewal is not refused: certificates left to expire are worse
    /// than ones of another lifetime; the record's note says what happened.
    pub fn clamp(self, ttl: Ttl) -> (Ttl, Option<OutsideBand>) {
        match self.check(ttl) {
            Ok(()) => (ttl, None),
            Err(outside) => (ttl.clamp(self.min, self.max), Some(outside)),
        }
    }

    /// `from 1d to 1y`, for the hint that follows a refusal.
    pub fn describe(self) -> String {
        format!("from {} to {}", self.min, self.max)
    }

    /// Why a request (`spec.ttl`, or a fleet trigger's TTL) is refused, if it is: the admission
    /// webhook denies its creation and the controller fails it with this same text. A TTL
    /// the grammar refuses is the controller's to report (`None` here).
    pub fn refuse_request(self, ttl: &str) -> Option<String> {
        let ttl: Ttl = ttl.parse().ok()?;
        let error = self.check(ttl).err()?;
        Some(format!(
            "Refused before anything started: {error}; create a new request with a TTL {}",
            self.describe()
        ))
    }
}

/// The end of the cluster's CA (the `certificate-authority-data` of `<cluster>-kubeconfig`,
/// which the CK8s provider writes from `<cluster>-ca`; read without the CA's key), and where it
/// was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaEnd {
    pub at: Timestamp,
    /// `the cluster CA in Secret ns/c-kubeconfig`, for messages.
    pub source: String,
}

/// The shortest lifetime an automatic renewal is cut to: a CA that ends sooner is beyond what a
/// refresh can help (k8sd has no CA rotation).
const SHORTEST_BEFORE_CA_END: i64 = 3600;

impl CaEnd {
    /// Why a manual refresh of `ttl` started at `now` is refused: it would outlive the CA.
    pub fn refuse(&self, ttl: Ttl, now: Timestamp) -> Option<String> {
        let end = now.checked_add(ttl.as_duration()).ok()?;
        if end <= self.at {
            return None;
        }
        let fits = self.longest(now);
        Some(format!(
            "TTL {ttl} would end at {}, after {} ends at {}: certificates are not trusted past their CA, and k8sd would sign them anyway; {}",
            end.round(jiff::Unit::Second).unwrap_or(end),
            self.source,
            self.at,
            match fits {
                Some(fits) => format!(
                    "ask for at most {}, or renew the cluster's CA first",
                    days_and_hours(fits)
                ),
                None => "renew the cluster's CA first: no refresh in place can help (docs/troubleshooting.md)".to_owned(),
            }
        ))
    }

    /// The lifetime an automatic renewal asks for: `ttl`, or cut to the CA's end (whole hours),
    /// with why; `Err` when the CA ends within the hour (or has ended).
    pub fn clamp(&self, ttl: Ttl, now: Timestamp) -> Result<(Ttl, Option<String>), String> {
        let Some(fits) = self.longest(now) else {
            return Err(format!(
                "{} ends at {}: no certificate it signs can last, and k8sd cannot renew a CA; renew the cluster's CA first (docs/troubleshooting.md)",
                self.source, self.at
            ));
        };
        if ttl <= fits {
            return Ok((ttl, None));
        }
        Ok((
            fits,
            Some(format!(
                "{ttl} would outlive {}, which ends at {}: {} was asked for",
                self.source,
                self.at,
                days_and_hours(fits)
            )),
        ))
    }

    /// The longest lifetime from `now` that ends by the CA's end, in whole hours; `None` under
    /// an hour.
    fn longest(&self, now: Timestamp) -> Option<Ttl> {
        let left = self.at.duration_since(now).as_secs();
        let hours = left - left.rem_euclid(3600);
        (hours >= SHORTEST_BEFORE_CA_END)
            .then(|| Ttl::from_seconds(hours).ok())
            .flatten()
    }
}

/// `3649d23h`: a lifetime cut to whole hours, in the units a person counts it in (the grammar's
/// own form would say `9y12mo4d23h`). The grammar reads it back.
fn days_and_hours(ttl: Ttl) -> String {
    let hours = ttl.as_seconds() / 3600;
    match (hours / 24, hours % 24) {
        (0, h) => format!("{h}h"),
        (d, 0) => format!("{d}d"),
        (d, h) => format!("{d}d{h}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ttl(text: &str) -> Ttl {
        text.parse().expect("a TTL")
    }

    #[test]
    fn the_default_band_is_a_day_to_a_year_both_ends_included() {
        let band = TtlBand::default();
        assert_eq!((band.min(), band.max()), (ttl("1d"), ttl("1y")));
        for inside in [
            "1d",
            "24h",
            "86400s",
            "30d",
            "90d",
            "1y",
            "365d",
            "364d23h59m59s",
        ] {
            assert_eq!(band.check(ttl(inside)), Ok(()), "{inside}");
        }
        assert_eq!(
            band.check(ttl("23h59m59s")),
            Err(OutsideBand::BelowMin {
                ttl: ttl("23h59m59s"),
                min: ttl("1d")
            })
        );
        assert_eq!(
            band.check(ttl("1y1s")),
            Err(OutsideBand::AboveMax {
                ttl: ttl("1y1s"),
                max: ttl("1y")
            })
        );
    }

    #[test]
    fn the_refusal_names_the_value_the_bound_and_its_flag() {
        let band = TtlBand::default();
        assert_eq!(
            band.check(ttl("1m")).unwrap_err().to_string(),
            "TTL 1m is below the minimum 1d (--min-ttl)"
        );
        assert_eq!(
            band.check(ttl("10000y")).unwrap_err().to_string(),
            "TTL 10000y is above the maximum 1y (--max-ttl)"
        );
        assert_eq!(band.describe(), "from 1d to 1y");
    }

    #[test]
    fn a_band_may_be_one_value_but_not_empty() {
        let one = TtlBand::new(ttl("30d"), ttl("30d")).expect("one value");
        assert_eq!(one.check(ttl("30d")), Ok(()));
        assert!(one.check(ttl("29d23h59m59s")).is_err());
        assert!(one.check(ttl("30d1s")).is_err());
        assert_eq!(
            TtlBand::new(ttl("1y"), ttl("1d")).unwrap_err().to_string(),
            "--min-ttl 1y is longer than --max-ttl 1d"
        );
    }

    #[test]
    fn a_request_outside_the_band_is_refused_and_an_unparsable_one_left_to_the_grammar() {
        let band = TtlBand::default();
        assert_eq!(
            band.refuse_request("1m").as_deref(),
            Some(
                "Refused before anything started: TTL 1m is below the minimum 1d (--min-ttl); create a new request with a TTL from 1d to 1y"
            )
        );
        assert!(band.refuse_request("10000y").is_some());
        assert_eq!(band.refuse_request("1d"), None);
        assert_eq!(band.refuse_request(" 1y "), None);
        assert_eq!(band.refuse_request("1yr"), None);
        assert_eq!(band.refuse_request(""), None);
    }

    #[test]
    fn an_automatic_renewal_is_brought_into_the_band_not_refused() {
        let band = TtlBand::default();
        assert_eq!(band.clamp(ttl("90d")), (ttl("90d"), None));
        assert_eq!(band.clamp(ttl("1d")), (ttl("1d"), None));
        assert_eq!(band.clamp(ttl("1y")), (ttl("1y"), None));
        let (short, why) = band.clamp(ttl("1h"));
        assert_eq!(short, ttl("1d"));
        assert!(matches!(why, Some(OutsideBand::BelowMin { .. })));
        let (long, why) = band.clamp(ttl("10000y"));
        assert_eq!(long, ttl("1y"));
        assert!(matches!(why, Some(OutsideBand::AboveMax { .. })));
    }

    #[test]
    fn a_wide_band_reaches_the_grammar_s_ends() {
        let wide = TtlBand::new(ttl("1s"), ttl("10000y")).expect("wide");
        assert_eq!(wide.check(ttl("1s")), Ok(()));
        assert_eq!(wide.check(ttl("10000y")), Ok(()));
    }

    fn at(text: &str) -> Timestamp {
        text.parse().expect("a timestamp")
    }

    fn ca(end: &str) -> CaEnd {
        CaEnd {
            at: at(end),
            source: "the cluster CA in Secret fleet/c-kubeconfig".into(),
        }
    }

    #[test]
    fn a_manual_lifetime_past_the_cluster_ca_is_refused_with_what_fits() {
        let now = at("2026-01-01T00:00:00Z");
        let ca = ca("2026-12-01T12:30:00Z");
        assert_eq!(ca.refuse(ttl("30d"), now), None);
        // Ending exactly with the CA is inside.
        assert_eq!(ca.refuse(ttl("334d12h30m"), now), None);
        assert_eq!(
            ca.refuse(ttl("1y"), now).as_deref(),
            Some(
                "TTL 1y would end at 2027-01-01T00:00:00Z, after the cluster CA in Secret fleet/c-kubeconfig ends at 2026-12-01T12:30:00Z: certificates are not trusted past their CA, and k8sd would sign them anyway; ask for at most 334d12h, or renew the cluster's CA first"
            )
        );
        // A CA that has ended (or ends within the hour): nothing fits.
        let ended = ca.refuse(ttl("1d"), at("2026-12-01T12:00:00Z")).unwrap();
        assert!(ended.ends_with("renew the cluster's CA first: no refresh in place can help (docs/troubleshooting.md)"), "{ended}");
    }

    #[test]
    fn an_automatic_lifetime_is_cut_to_the_cluster_ca_in_whole_hours() {
        let now = at("2026-01-01T00:00:00Z");
        let ca = ca("2026-03-01T05:59:59Z");
        assert_eq!(ca.clamp(ttl("30d"), now), Ok((ttl("30d"), None)));
        let (cut, why) = ca.clamp(ttl("1y"), now).unwrap();
        assert_eq!(cut, ttl("59d5h"));
        assert_eq!(
            why.as_deref(),
            Some(
                "1y would outlive the cluster CA in Secret fleet/c-kubeconfig, which ends at 2026-03-01T05:59:59Z: 59d5h was asked for"
            )
        );
        // An hour left is still given; less is refused, as is a CA that has ended.
        assert_eq!(
            ca.clamp(ttl("1y"), at("2026-03-01T04:59:59Z"))
                .map(|(t, _)| t),
            Ok(ttl("1h"))
        );
        for late in ["2026-03-01T05:00:00Z", "2026-03-02T00:00:00Z"] {
            let refused = ca.clamp(ttl("1y"), at(late)).unwrap_err();
            assert!(
                refused.contains("k8sd cannot renew a CA"),
                "{late}: {refused}"
            );
        }
    }
}
