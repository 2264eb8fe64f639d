//! Instants of wall-clock times, which windows and cron schedules share: the instant a wall time
//! names in a time zone (a time in a spring-forward gap opens at the first instant after the
//! gap; in a repeated autumn hour the earlier instant counts), and one occurrence of a window.

use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone};

/// One occurrence of a window: `[start, end)`, never empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Occurrence {
    pub start: Timestamp,
    pub end: Timestamp,
}

impl Occurrence {
    pub fn contains(&self, t: Timestamp) -> bool {
        self.start <= t && t < self.end
    }
}

/// The instant a wall time names in `zone` (see the module docs for gaps and folds).
pub fn resolve(zone: &TimeZone, wall: DateTime) -> Option<Timestamp> {
    match zone.to_ambiguous_timestamp(wall).offset() {
        AmbiguousOffset::Unambiguous { offset } => offset.to_timestamp(wall).ok(),
        // A repeated hour: the offset in force before the clocks went back gives the earlier
        // instant.
        AmbiguousOffset::Fold { before, .. } => before.to_timestamp(wall).ok(),
        // A gap: read with the offset after the change, the wall time lands before the
        // transition; the transition itself is the first instant after the gap.
        AmbiguousOffset::Gap { after, .. } => {
            let before_transition = after.to_timestamp(wall).ok()?;
            zone.following(before_transition)
                .next()
                .map(|transition| transition.timestamp())
        }
    }
}
