//! Maintenance windows: when, in wall-clock time, a policy lets automatic renewals start.
//!
//! [`Window`] is the form a `CertificateRenewalPolicy` holds; it and its field types live in the
//! API crate (`ck8s_certs_api::renewal_policy`) and are re-exported here. A window is either
//! `daysOfWeek`/`start`/`end` (this module) or `schedule`/`duration` (a cron expression,
//! [`super::cron`]), both in `timezone`. The field types catch what a schema can (`HH:MM`, day
//! names); [`ValidateWindow::validate`] checks the rest (exactly one form, `24:00` as a start,
//! `start == end`, the schedule, the time zone) and yields a [`ValidWindow`], the only form the
//! other functions take. Errors name the field path, such as `windows[1].start`.
//!
//! # Semantics (design.md §4, settled details)
//! - An occurrence belongs to the day it starts: `daysOfWeek` selects start days (omitted or
//!   empty: every day). `end < start` rolls over to the next day; `24:00` as an end is the next
//!   day's midnight. The end is exclusive: an occurrence covers `[start, end)`.
//! - Wall times are read in the window's IANA zone (default UTC) from jiff's bundled database,
//!   so answers do not depend on the host's `/usr/share/zoneinfo` (containers often lack it).
//! - A wall time that falls in a spring-forward gap resolves to the first instant after the gap
//!   (cron-like), a wall time in a repeated hour to its earlier instant; this applies to ends
//!   as to starts. So `01:00`–`01:30` on the autumn change covers only the first `01:00`–`01:30`,
//!   and an occurrence whose start and end both fall in one gap collapses to a single instant:
//!   it does not exist that day.
//! - Zones are exact IANA names. jiff looks names up case-insensitively and knows `Etc/Unknown`;
//!   we reject a case variant (`europe/london`) with a suggestion, `Etc/Unknown`, and `""`.
//! - Several windows are OR'ed, whatever their form: [`first_containing`] reports the first in
//!   list order, [`next_start_after`] the earliest start (the first in list order on a tie).
//! - The occurrence an instant belongs to, for staggering ([`opened_first`]): of the occurrences
//!   that contain it, the one that opened first (then the one that closes last, then list
//!   order). Unlike the first in list order, this choice does not change while the instant moves
//!   forward inside that occurrence, so an offset counted from its start stays put.
//!
//! The same rules hold for schedule windows, whose `duration` is wall-clock time; the cron
//! module says what a firing in a repeated hour does.

use std::fmt;
use std::sync::LazyLock;

use jiff::Timestamp;
use jiff::Zoned;
use jiff::civil::{Date, DateTime, Time, Weekday};
use jiff::tz::{TimeZone, TimeZoneDatabase};

pub use ck8s_certs_api::renewal_policy::{DayOfWeek, WallTime, WallTimeError, Window};

use super::cron::{CronProblem, CronWindow};
pub use super::instants::{Occurrence, resolve};

/// How many days around an instant's local date may hold an occurrence that contains it. An
/// occurrence lasts at most a wall-clock day, but a gap can push its end further (Pacific/Apia
/// skipped all of 2011-12-30) and a fold at midnight can put its start on the previous local
/// date; a few days either way cover every zone at the cost of a few lookups.
const DAYS_BACK: usize = 3;
const DAYS_AHEAD: usize = 1;

/// How far ahead to look for the next start. Any selected weekday recurs within 7 days; an
/// occurrence collapsed by a gap (a few days a year at most) skips a week; three weeks is ample.
const SEARCH_DAYS: usize = 22;

/// The civil datetime `time` names on `date`: `24:00` is the next day's midnight.
fn wall_time_on(time: WallTime, date: Date) -> Option<DateTime> {
    if time == WallTime::END_OF_DAY {
        return Some(date.tomorrow().ok()?.to_datetime(Time::midnight()));
    }
    let time = Time::new(time.hour() as i8, time.minute() as i8, 0, 0).ok()?;
    Some(date.to_datetime(time))
}

/// What is wrong with one field of a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowProblem {
    /// `start: "24:00"`.
    StartAtEndOfDay,
    /// `start == end`.
    Empty(WallTime),
    /// `timezone: ""`.
    EmptyTimeZone,
    /// `timezone: "Etc/Unknown"`.
    UnknownPlaceholder,
    /// A name that matches an IANA name only when case is ignored.
    TimeZoneCase {
        given: String,
        expected: &'static str,
    },
    UnknownTimeZone(String),
    /// A field of one form set in a window of the other (`schedule` with `start`).
    MixedForms,
    /// A field missing: `with` names the field that needs it, `None` when neither form is set.
    Required {
        with: Option<&'static str>,
    },
    /// `duration` without `schedule`.
    DurationWithoutSchedule,
    Schedule(CronProblem),
}

/// The two forms, for messages.
const FORMS: &str =
    "a window is either start and end (with optional daysOfWeek), or schedule and duration";

impl fmt::Display for WindowProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StartAtEndOfDay => f.write_str(
                "24:00 is only allowed as an end; a window that opens at midnight starts at 00:00",
            ),
            Self::Empty(time) => write!(
                f,
                "must differ from start ({time}): the window would be empty; a whole day is 00:00 to 24:00"
            ),
            Self::EmptyTimeZone => f.write_str(
                "must not be empty: omit it for UTC, or give an IANA name such as Europe/London",
            ),
            Self::UnknownPlaceholder => f.write_str(
                "\"Etc/Unknown\" stands for an unknown time zone, not a real one: give an IANA name such as Europe/London, or omit it for UTC",
            ),
            Self::TimeZoneCase { given, expected } => write!(
                f,
                "{given:?} is not an IANA time zone name: names are case-sensitive, did you mean {expected:?}?"
            ),
            Self::UnknownTimeZone(given) => write!(
                f,
                "{given:?} is not an IANA time zone name (such as UTC, Europe/London or America/New_York)"
            ),
            Self::MixedForms => write!(f, "cannot be combined with start, end or daysOfWeek: {FORMS}"),
            Self::Required { with: Some(with) } => write!(f, "is required with {with}: {FORMS}"),
            Self::Required { with: None } => write!(f, "is required: {FORMS}"),
            Self::DurationWithoutSchedule => write!(
                f,
                "only goes with schedule (how long the window stays open after each instant of the schedule): {FORMS}"
            ),
            Self::Schedule(problem) => problem.fmt(f),
        }
    }
}

/// One invalid field: its path (such as `windows[1].timezone`) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct WindowError {
    pub path: String,
    pub problem: WindowProblem,
}

/// A checked window, ready to answer questions about instants.
#[derive(Debug, Clone)]
pub struct ValidWindow {
    form: Form,
    zone: TimeZone,
}

#[derive(Debug, Clone)]
enum Form {
    /// `daysOfWeek`/`start`/`end`.
    Daily {
        /// Selected start days, indexed by `Weekday::to_monday_zero_offset`.
        days: [bool; 7],
        start: WallTime,
        end: WallTime,
    },
    /// `schedule`/`duration` (boxed: a parsed cron expression is a few hundred bytes).
    Schedule(Box<CronWindow>),
}

/// The next opening of one of several windows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowStart {
    /// The window's position in the policy's list.
    pub index: usize,
    /// The instant, in the window's zone (for messages).
    pub at: Zoned,
}

impl WindowStart {
    pub fn timestamp(&self) -> Timestamp {
        self.at.timestamp()
    }
}

impl fmt::Display for WindowStart {
    /// `2026-11-24 02:00 Europe/London (2026-11-24T02:00:00Z)`: the wall time users wrote the
    /// window in, and UTC, which also settles the wall time in a repeated hour.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let wall = self.at.datetime();
        write!(f, "{} {:02}:{:02}", wall.date(), wall.hour(), wall.minute())?;
        if wall.second() != 0 {
            write!(f, ":{:02}", wall.second())?;
        }
        let zone = self.at.time_zone().iana_name().unwrap_or("UTC");
        write!(f, " {zone} ({})", self.at.timestamp())
    }
}

/// Validation of a [`Window`] (a trait because the type lives in the API crate).
pub trait ValidateWindow {
    /// Checks the rules the field types cannot; `index` is the window's position in the
    /// policy's list, for the paths in errors. All problems are reported, not just the first.
    fn validate(&self, index: usize) -> Result<ValidWindow, Vec<WindowError>>;
}

impl ValidateWindow for Window {
    fn validate(&self, index: usize) -> Result<ValidWindow, Vec<WindowError>> {
        let mut errors = Vec::new();
        let mut problem = |field: &str, problem| {
            errors.push(WindowError {
                path: format!("windows[{index}].{field}"),
                problem,
            });
        };
        let daily = self.start.is_some() || self.end.is_some() || !self.days_of_week.is_empty();
        let form = match (
            self.start,
            self.end,
            self.schedule.as_deref(),
            self.duration,
        ) {
            (Some(start), Some(end), None, None) => {
                if start == WallTime::END_OF_DAY {
                    problem("start", WindowProblem::StartAtEndOfDay);
                } else if start == end {
                    problem("end", WindowProblem::Empty(start));
                }
                let mut days = [self.days_of_week.is_empty(); 7];
                for &day in &self.days_of_week {
                    days[day_index(day.into())] = true;
                }
                Some(Form::Daily { days, start, end })
            }
            (None, None, Some(schedule), Some(duration)) if !daily => {
                match CronWindow::parse(schedule, duration) {
                    Ok(window) => Some(Form::Schedule(Box::new(window))),
                    Err(error) => {
                        problem("schedule", WindowProblem::Schedule(error));
                        None
                    }
                }
            }
            (start, end, schedule, duration) => {
                if schedule.is_some() {
                    if daily {
                        problem("schedule", WindowProblem::MixedForms);
                    }
                    if duration.is_none() {
                        problem(
                            "duration",
                            WindowProblem::Required {
                                with: Some("schedule"),
                            },
                        );
                    }
                } else {
                    if duration.is_some() {
                        problem("duration", WindowProblem::DurationWithoutSchedule);
                    }
                    let with = |other: Option<WallTime>, name| other.map(|_| name);
                    if start.is_none() {
                        problem(
                            "start",
                            WindowProblem::Required {
                                with: with(end, "end"),
                            },
                        );
                    }
                    if end.is_none() {
                        problem(
                            "end",
                            WindowProblem::Required {
                                with: with(start, "start"),
                            },
                        );
                    }
                }
                None
            }
        };
        let zone = match self.timezone.as_deref() {
            None => Some(TimeZone::UTC),
            Some(name) => lookup_zone(name)
                .map_err(|error| problem("timezone", error))
                .ok(),
        };
        match (form, zone) {
            (Some(form), Some(zone)) if errors.is_empty() => Ok(ValidWindow { form, zone }),
            _ => Err(errors),
        }
    }
}

/// Validates a policy's windows, reporting every problem of every window.
pub fn validate_windows(windows: &[Window]) -> Result<Vec<ValidWindow>, Vec<WindowError>> {
    let mut valid = Vec::with_capacity(windows.len());
    let mut errors = Vec::new();
    for (index, window) in windows.iter().enumerate() {
        match window.validate(index) {
            Ok(window) => valid.push(window),
            Err(mut problems) => errors.append(&mut problems),
        }
    }
    if errors.is_empty() {
        Ok(valid)
    } else {
        Err(errors)
    }
}

/// Every zone name in the bundled database, sorted, for exact (case-sensitive) lookups.
static ZONE_NAMES: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut names: Vec<String> = TimeZoneDatabase::bundled()
        .available()
        .map(|name| name.as_str().to_owned())
        .collect();
    names.sort_unstable();
    names
});

fn lookup_zone(name: &str) -> Result<TimeZone, WindowProblem> {
    if name.is_empty() {
        return Err(WindowProblem::EmptyTimeZone);
    }
    // jiff resolves this name to its "unknown zone" placeholder, which behaves like UTC.
    if name.eq_ignore_ascii_case("Etc/Unknown") {
        return Err(WindowProblem::UnknownPlaceholder);
    }
    if ZONE_NAMES
        .binary_search_by(|known| known.as_str().cmp(name))
        .is_ok()
    {
        return TimeZoneDatabase::bundled()
            .get(name)
            .map_err(|_| WindowProblem::UnknownTimeZone(name.to_owned()));
    }
    match ZONE_NAMES
        .iter()
        .find(|known| known.eq_ignore_ascii_case(name))
    {
        Some(known) => Err(WindowProblem::TimeZoneCase {
            given: name.to_owned(),
            expected: known.as_str(),
        }),
        None => Err(WindowProblem::UnknownTimeZone(
            name.chars().take(64).collect(),
        )),
    }
}

fn day_index(day: Weekday) -> usize {
    day.to_monday_zero_offset().unsigned_abs().into()
}

/// `count` consecutive dates from `first`, stopping at the end of the calendar.
fn dates(first: Date, count: usize) -> impl Iterator<Item = Date> {
    std::iter::successors(Some(first), |date| date.tomorrow().ok()).take(count)
}

fn days_before(date: Date, days: usize) -> Date {
    (0..days)
        .try_fold(date, |date, _| date.yesterday())
        .unwrap_or(Date::MIN)
}

impl ValidWindow {
    pub fn time_zone(&self) -> &TimeZone {
        &self.zone
    }

    /// The occurrence that starts on `date` (local to the window's zone), if the day is
    /// selected and the occurrence does not collapse in a gap. Only for `daysOfWeek`/`start`/
    /// `end` windows: a schedule window's occurrences start at its firings, any number a day.
    pub fn occurrence(&self, date: Date) -> Option<Occurrence> {
        let Form::Daily { days, start, end } = &self.form else {
            return None;
        };
        if !days[day_index(date.weekday())] {
            return None;
        }
        let start_at = resolve(&self.zone, wall_time_on(*start, date)?)?;
        let end_date = if end < start {
            date.tomorrow().ok()?
        } else {
            date
        };
        let end_at = resolve(&self.zone, wall_time_on(*end, end_date)?)?;
        (start_at < end_at).then_some(Occurrence {
            start: start_at,
            end: end_at,
        })
    }

    /// The occurrence that contains `t` and opened first, if any: a schedule window's
    /// occurrences may overlap; a `daysOfWeek`/`start`/`end` window's never do. `Some` exactly
    /// when [`Self::contains`] holds.
    pub fn occurrence_containing(&self, t: Timestamp) -> Option<Occurrence> {
        if let Form::Schedule(cron) = &self.form {
            return cron.earliest_containing(&self.zone, t);
        }
        self.occurrences_around(t)
            .find(|occurrence| occurrence.contains(t))
    }

    /// Whether `t` is inside an occurrence (start inclusive, end exclusive).
    pub fn contains(&self, t: Timestamp) -> bool {
        if let Form::Schedule(cron) = &self.form {
            return cron.contains(&self.zone, t);
        }
        self.occurrences_around(t)
            .any(|occurrence| occurrence.contains(t))
    }

    /// A `daysOfWeek`/`start`/`end` window's occurrences on the local dates around `t`: every
    /// one that can contain it.
    fn occurrences_around(&self, t: Timestamp) -> impl Iterator<Item = Occurrence> + '_ {
        let local = self.zone.to_datetime(t).date();
        dates(days_before(local, DAYS_BACK), DAYS_BACK + 1 + DAYS_AHEAD)
            .filter_map(|date| self.occurrence(date))
    }

    /// The earliest occurrence start strictly after `t`, so that calling it again with the
    /// result moves on to the next one. `None` only past the end of jiff's calendar (year 9999).
    ///
    /// A `t` that is itself a start is not returned: `contains(t)` answers for it.
    pub fn next_start_after(&self, t: Timestamp) -> Option<Timestamp> {
        if let Form::Schedule(cron) = &self.form {
            return cron.next_start_after(&self.zone, t);
        }
        let local = self.zone.to_datetime(t).date();
        // Starts never decrease from one date to the next (wall-time resolution is monotonic),
        // so the first one after `t` in date order is the earliest.
        dates(days_before(local, DAYS_BACK), DAYS_BACK + SEARCH_DAYS)
            .filter_map(|date| self.occurrence(date))
            .map(|occurrence| occurrence.start)
            .find(|&start| start > t)
    }
}

impl ValidWindow {
    /// The occurrences that start strictly after `t`, earliest first, until the end of jiff's
    /// calendar: what a policy's promise is checked against ([`super::promise`]).
    pub fn occurrences_after(&self, t: Timestamp) -> impl Iterator<Item = Occurrence> + '_ {
        let mut after = t;
        std::iter::from_fn(move || {
            let next = match &self.form {
                Form::Schedule(cron) => cron.next_occurrence_after(&self.zone, after)?,
                // As in `next_start_after`: the first start after `after` in date order.
                Form::Daily { .. } => {
                    let local = self.zone.to_datetime(after).date();
                    dates(days_before(local, DAYS_BACK), DAYS_BACK + SEARCH_DAYS)
                        .filter_map(|date| self.occurrence(date))
                        .find(|occurrence| occurrence.start > after)?
                }
            };
            after = next.start;
            Some(next)
        })
    }
}

/// The first window, in list order, that contains `t`.
pub fn first_containing(windows: &[ValidWindow], t: Timestamp) -> Option<usize> {
    windows.iter().position(|window| window.contains(t))
}

/// An occurrence of one of several windows, with the window's position in the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowOccurrence {
    pub index: usize,
    /// The opening, in the window's zone (for messages).
    pub start: Zoned,
    /// Exclusive.
    pub end: Timestamp,
}

impl WindowOccurrence {
    /// The opening as a [`WindowStart`], for messages.
    pub fn opening(&self) -> WindowStart {
        WindowStart {
            index: self.index,
            at: self.start.clone(),
        }
    }
}

/// The occurrence `t` belongs to, among all windows: of those that contain `t`, the one that
/// opened first; on a tie, the one that closes last (the most room), then the first in list
/// order. While `t` moves forward inside it, no other occurrence can take its place: one that
/// opened earlier, or as early and closes later, and contains a later `t` contained the earlier
/// one too.
pub fn opened_first(windows: &[ValidWindow], t: Timestamp) -> Option<WindowOccurrence> {
    let (index, occurrence) = windows
        .iter()
        .enumerate()
        .filter_map(|(index, window)| Some((index, window.occurrence_containing(t)?)))
        .min_by_key(|&(index, occurrence)| {
            (occurrence.start, std::cmp::Reverse(occurrence.end), index)
        })?;
    Some(WindowOccurrence {
        index,
        start: occurrence.start.to_zoned(windows[index].zone.clone()),
        end: occurrence.end,
    })
}

/// The earliest start strictly after `t` among `windows`; on a tie, the first in list order.
pub fn next_start_after(windows: &[ValidWindow], t: Timestamp) -> Option<WindowStart> {
    let (index, start) = windows
        .iter()
        .enumerate()
        .filter_map(|(index, window)| Some((index, window.next_start_after(t)?)))
        .min_by_key(|&(index, start)| (start, index))?;
    Some(WindowStart {
        index,
        at: start.to_zoned(windows[index].zone.clone()),
    })
}

/// The next `count` openings after `t`, for previews.
pub fn upcoming_starts(windows: &[ValidWindow], t: Timestamp, count: usize) -> Vec<WindowStart> {
    std::iter::successors(next_start_after(windows, t), |previous| {
        next_start_after(windows, previous.timestamp())
    })
    .take(count)
    .collect()
}

#[cfg(test)]
mod tests;
