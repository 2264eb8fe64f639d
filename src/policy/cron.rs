//! Schedule windows: a window given as `schedule` (a standard five-field cron expression) +
//! `duration` + `timezone` instead of `daysOfWeek`/`start`/`end`, the shape cert-manager 1.21
//! proposes for its renewal windows.
//!
//! This module owns the schedule form: which expressions are accepted, and when a window of
//! that form is open. The expression is parsed by the `croner` crate (its jiff backend, no
//! chrono); occurrences are worked out here, in civil (wall-clock) time in the window's zone,
//! so that gaps and repeated hours follow the same rules as the other form ([`super::window`]
//! owns the zone lookup, the wall-time resolution and the list-level functions).
//!
//! # Accepted expressions
//! Five fields, `minute hour day-of-month month day-of-week`: minute 0–59, hour 0–23,
//! day-of-month 1–31, month 1–12 or `JAN`–`DEC`, day-of-week 0–7 or `SUN`–`SAT` (0 and 7 are
//! Sunday), each `*`, a value, a range `a-b`, a step `*/n` or `a-b/n`, or a comma list of those;
//! names are case-insensitive. `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily` and
//! `@hourly` stand for their usual five fields. When both day fields are restricted, a day
//! matches if either matches, the classic cron rule: `0 0 13 * 5` fires on every 13th and every
//! Friday. A day field is unrestricted when it is `*`, `*/1` or a list with one of them, as
//! Kubernetes CronJob (robfig/cron v3) reads it; a step such as `*/2` is a restriction.
//!
//! Rejected: seconds or year fields, the Quartz/croner extensions (`L`, `W`, `#`, `?`, a `+`
//! day-of-week), `@reboot`, and expressions that never fire (`0 0 31 2 *`, February 31st).
//!
//! # Semantics
//! - A *firing* is a wall-clock minute in the window's zone that the expression matches. The
//!   occurrence it starts covers `[firing, firing + duration)`, both ends read as wall-clock
//!   times in the zone: `duration` is wall-clock time, like `end` in the other form, so
//!   `0 22 * * 1-5` + `4h` is exactly Monday–Friday 22:00–02:00, also on a daylight-saving
//!   night (when 3 or 5 hours elapse), and `0 0 * * *` + `24h` is open without a break.
//! - A wall time in a spring-forward gap resolves to the first instant after the gap, a wall
//!   time in a repeated hour to its earlier instant; ends as starts. An occurrence whose start
//!   and end resolve to the same instant does not exist.
//! - **Repeated hour**: a firing whose wall time occurs twice counts once, at its earlier
//!   instant. A schedule firing every minute or every hour does not open again during the second
//!   pass of the repeated hour; the occurrence whose wall-clock end lies after the repeated hour
//!   covers it instead. So schedules whose occurrences tile the clock (`* * * * *` + `1m`,
//!   `0 * * * *` + `1h`, `*/15 * * * *` + `15m`) stay open without a break, and one with gaps
//!   between occurrences (`*/15 * * * *` + `5m`) stays closed for the second pass: a renewal
//!   waits at most that hour, once a year. The alternative (Vixie cron's: interval jobs run in
//!   both passes) would make a start earlier in wall time than one already passed, so starts
//!   would no longer grow with the wall time they name; the decision's "next start" and
//!   requeue, and the equivalence with the other form, rely on that order. One rule for both
//!   forms, the one design.md §4 states.

use std::fmt;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::civil::{DateTime, date};
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{SignedDuration, Timestamp};

use super::duration::PolicyDuration;
use super::instants::{Occurrence, resolve};

/// The accepted forms, for error messages.
const ACCEPTED: &str = "expected five fields, minute hour day-of-month month day-of-week, such as \"0 22 * * 1-5\" (0-59, 0-23, 1-31, 1-12 or JAN-DEC, 0-7 or SUN-SAT; *, values, ranges a-b, steps */n, comma lists), or one of @hourly, @daily, @weekly, @monthly, @yearly";

const NICKNAMES: [&str; 6] = [
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@hourly",
];
const MONTH_NAMES: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const DAY_NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// The Gregorian calendar repeats every 400 years, weekdays included (146097 days is a whole
/// number of weeks): an expression that fires at all fires within any 400 years.
const CALENDAR_CYCLE_YEARS: i16 = 400;

/// How many collapsed occurrences (firings inside a gap) `next_start_after` skips before giving
/// up. Each skip passes a whole gap, so this is hundreds of years of daylight-saving changes.
const MAX_SKIPS: usize = 1000;

/// What is wrong with a `schedule`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CronProblem {
    /// Not an expression the parser accepts (wrong number of fields, out-of-range values).
    Syntax { schedule: String, reason: String },
    /// An extension of the parser that standard cron does not have.
    NotStandard { schedule: String, token: String },
    /// Well formed, but no date matches (such as `0 0 31 2 *`).
    NeverFires { schedule: String },
}

impl fmt::Display for CronProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Syntax { schedule, reason } => {
                write!(
                    f,
                    "{schedule:?} is not a cron schedule ({reason}): {ACCEPTED}"
                )
            }
            Self::NotStandard { schedule, token } => write!(
                f,
                "{schedule:?} uses {token:?}, which standard five-field cron does not have: {ACCEPTED}"
            ),
            Self::NeverFires { schedule } => write!(
                f,
                "{schedule:?} never fires: no date has that day of the month in that month (such as February 31st)"
            ),
        }
    }
}

/// A checked `schedule` + `duration`.
#[derive(Debug, Clone)]
pub struct CronWindow {
    cron: Cron,
    /// Wall-clock length of each occurrence.
    duration: SignedDuration,
}

/// Shortens `text` for messages: schedules come from users and are bounded by the schema, but
/// the preview reads files no API server has seen.
fn quoted(text: &str) -> String {
    text.chars().take(128).collect()
}

/// Rejects what croner accepts beyond standard cron, naming the first offending token. Only a
/// filter: croner does the parsing. Expressions that do not have five fields are left to croner,
/// whose message says how many it wants.
fn check_standard(schedule: &str) -> Result<(), CronProblem> {
    let trimmed = schedule.trim();
    let not_standard = |token: &str| CronProblem::NotStandard {
        schedule: quoted(schedule),
        token: quoted(token),
    };
    if trimmed.starts_with('@') {
        return match NICKNAMES
            .iter()
            .any(|nickname| nickname.eq_ignore_ascii_case(trimmed))
        {
            true => Ok(()),
            false => Err(not_standard(trimmed)),
        };
    }
    let fields: Vec<&str> = trimmed.split_ascii_whitespace().collect();
    if fields.len() != 5 {
        return Ok(());
    }
    for (index, field) in fields.iter().enumerate() {
        // croner skips empty list entries, so `,` matches nothing, and finding out that such a
        // schedule never fires searches the calendar for seconds (found by `make fuzz`).
        if field.split(',').any(str::is_empty) {
            return Err(CronProblem::Syntax {
                schedule: quoted(schedule),
                reason: format!("an empty entry in the comma list {:?}", quoted(field)),
            });
        }
        for atom in field.split([',', '-', '/']) {
            let upper = atom.to_ascii_uppercase();
            let standard = atom.is_empty()
                || atom == "*"
                || atom.bytes().all(|b| b.is_ascii_digit())
                || (index == 3 && MONTH_NAMES.contains(&upper.as_str()))
                || (index == 4 && DAY_NAMES.contains(&upper.as_str()));
            if !standard {
                return Err(not_standard(atom));
            }
        }
    }
    Ok(())
}

/// `schedule` with a day field that holds every value written `*`: a field with `*` or `*/1`
/// among its list entries is unrestricted for Kubernetes CronJob (robfig/cron v3 marks it with
/// its star bit), so the other day field alone decides; croner reads only a bare `*` so.
fn unrestricted_days(schedule: &str) -> String {
    let fields: Vec<&str> = schedule.split_ascii_whitespace().collect();
    if fields.len() != 5 {
        return schedule.to_owned();
    }
    let every = |field: &str| field.split(',').any(|entry| entry == "*" || entry == "*/1");
    fields
        .iter()
        .enumerate()
        .map(|(index, field)| match index {
            2 | 4 if every(field) => "*",
            _ => field,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The latest wall time (whole seconds) whose instant in `zone` is at or before `t`, and
/// whether it is itself included: firings up to it start at or before `t`, later ones after.
///
/// Usually the wall clock at `t`. In the second pass of a repeated hour, every wall time of
/// that hour has already happened (at its earlier instant), so the bound is the end of the
/// repeated range, exclusive.
fn wall_bound(zone: &TimeZone, t: Timestamp) -> (DateTime, bool) {
    let wall = zone.to_datetime(t);
    // Firings are whole minutes: 22:00:00.5 is after a 22:00 firing, as 22:00:00 is.
    let wall = wall.with().subsec_nanosecond(0).build().unwrap_or(wall);
    if let AmbiguousOffset::Fold { before, after } = zone.to_ambiguous_timestamp(wall).offset()
        && zone.to_offset(t) == after
        && let Some(transition) = t
            .checked_add(SignedDuration::from_nanos(1))
            .ok()
            .and_then(|later| zone.preceding(later).next())
    {
        return (before.to_datetime(transition.timestamp()), false);
    }
    (wall, true)
}

/// croner counts years from 1; jiff's calendar starts at -9999.
fn first_wall_time() -> DateTime {
    date(1, 1, 1).at(0, 0, 0, 0)
}

impl CronWindow {
    /// Parses `schedule` (see the module docs for what is accepted) and checks that it fires.
    pub fn parse(schedule: &str, duration: PolicyDuration) -> Result<Self, CronProblem> {
        check_standard(schedule)?;
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build()
            .parse(&unrestricted_days(schedule))
            .map_err(|error| CronProblem::Syntax {
                schedule: quoted(schedule),
                reason: error.to_string(),
            })?;
        let window = Self {
            cron,
            duration: duration.as_duration(),
        };
        let origin = date(2000, 1, 1).at(0, 0, 0, 0);
        match window.next_firing(origin, true) {
            Some(firing) if firing.year() < origin.year() + CALENDAR_CYCLE_YEARS => Ok(window),
            _ => Err(CronProblem::NeverFires {
                schedule: quoted(schedule),
            }),
        }
    }

    /// The first firing after `wall` (or at it, if `inclusive`); `None` past croner's calendar
    /// (year 5000) or jiff's.
    fn next_firing(&self, wall: DateTime, inclusive: bool) -> Option<DateTime> {
        let (wall, inclusive) = match wall < first_wall_time() {
            true => (first_wall_time(), true),
            false => (wall, inclusive),
        };
        self.cron.find_next_occurrence(&wall, inclusive).ok()
    }

    /// The last firing before `wall` (or at it, if `inclusive`).
    fn previous_firing(&self, wall: DateTime, inclusive: bool) -> Option<DateTime> {
        if wall < first_wall_time() {
            return None;
        }
        self.cron.find_previous_occurrence(&wall, inclusive).ok()
    }

    /// The occurrence a firing starts, unless it collapses in a gap. An end past the end of the
    /// calendar never comes.
    pub fn occurrence(&self, zone: &TimeZone, firing: DateTime) -> Option<Occurrence> {
        let start = resolve(zone, firing)?;
        let end = firing
            .checked_add(self.duration)
            .ok()
            .and_then(|end| resolve(zone, end))
            .unwrap_or(Timestamp::MAX);
        (start < end).then_some(Occurrence { start, end })
    }

    /// Whether `t` is inside an occurrence (start inclusive, end exclusive).
    ///
    /// Wall-time resolution never goes backwards, so the latest occurrence to start at or
    /// before `t` also ends last among them: it alone decides.
    pub fn contains(&self, zone: &TimeZone, t: Timestamp) -> bool {
        let (bound, inclusive) = wall_bound(zone, t);
        self.previous_firing(bound, inclusive)
            .and_then(|firing| self.occurrence(zone, firing))
            .is_some_and(|occurrence| occurrence.contains(t))
    }

    /// The occurrence that contains `t` and started first (occurrences overlap when `duration`
    /// is longer than the time between firings); `None` exactly when [`Self::contains`] is
    /// false.
    ///
    /// Only a firing whose wall time plus `duration` is after the wall clock at `t` can end after
    /// `t` (resolution never goes backwards), and starts grow with firings: so the first firing
    /// from there whose occurrence contains `t` is the one. Usually the first one tried; a gap or
    /// a repeated hour may skip a few.
    pub fn earliest_containing(&self, zone: &TimeZone, t: Timestamp) -> Option<Occurrence> {
        let (bound, inclusive) = wall_bound(zone, t);
        let last_firing = self.previous_firing(bound, inclusive)?;
        let last = self
            .occurrence(zone, last_firing)
            .filter(|occurrence| occurrence.contains(t))?;
        let wall = zone.to_datetime(t);
        // Truncating can only add candidates, each of which is checked.
        let wall = wall.with().subsec_nanosecond(0).build().unwrap_or(wall);
        let Some(mut firing) = wall
            .checked_sub(self.duration)
            .ok()
            .and_then(|from| self.next_firing(from, false))
        else {
            return Some(last);
        };
        for _ in 0..MAX_SKIPS {
            if firing >= last_firing {
                break;
            }
            if let Some(occurrence) = self.occurrence(zone, firing)
                && occurrence.contains(t)
            {
                return Some(occurrence);
            }
            match self.next_firing(firing, false) {
                Some(next) => firing = next,
                None => break,
            }
        }
        Some(last)
    }

    /// The earliest occurrence start strictly after `t`; `None` past the end of the calendar.
    pub fn next_start_after(&self, zone: &TimeZone, t: Timestamp) -> Option<Timestamp> {
        self.next_occurrence_after(zone, t)
            .map(|occurrence| occurrence.start)
    }

    /// The occurrence with the earliest start strictly after `t`; `None` past the end of the
    /// calendar.
    pub fn next_occurrence_after(&self, zone: &TimeZone, t: Timestamp) -> Option<Occurrence> {
        let (bound, inclusive) = wall_bound(zone, t);
        let mut firing = self.next_firing(bound, !inclusive)?;
        for _ in 0..MAX_SKIPS {
            match self.occurrence(zone, firing) {
                Some(occurrence) if occurrence.start > t => return Some(occurrence),
                // Cannot happen after the bound; answered rather than assumed.
                Some(_) => firing = self.next_firing(firing, false)?,
                None => {
                    // Collapsed in a gap: so does every firing until the wall time at the end
                    // of the gap minus the duration.
                    let gap_end = zone.to_datetime(resolve(zone, firing)?);
                    let skip_to = gap_end
                        .checked_sub(self.duration)
                        .ok()
                        .filter(|&wall| wall > firing)
                        .unwrap_or(firing);
                    firing = self.next_firing(skip_to, false)?;
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests;
