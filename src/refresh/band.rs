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
}
