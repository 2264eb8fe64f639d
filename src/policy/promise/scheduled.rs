//! The worst case under `Scheduled` windows, in two steps.
//!
//! **A bound.** Each attempt waits at most for a closed stretch of the windows, its slot in the
//! spread and, after a failure, the attempt's length and its backoff: the `k`-th starts at most
//! `k × (longest closed stretch + min(spread, longest occurrence)) + Σ (ATTEMPT_LENGTH + backoff)`
//! after due (inside a window, the slot lies within the spread after the later of the window's
//! opening and the due time, and inside that occurrence; outside, the next opening comes within
//! the longest closed stretch). A policy whose bound keeps the promise is admitted without more
//! work, which is most of them.
//!
//! **An exact search**, for the others: the worst due instant `D`, over every `D` of the scanned
//! horizon, with two facts about the simulated attempts (the property test checks that what
//! they prove holds):
//! - each attempt's start is non-decreasing in `D` (a later due time never makes an attempt
//!   earlier: every step, the window it falls in, the slot in the spread, the backoff, moves
//!   forward with it);
//! - while every attempt stays in the same window occurrence, an attempt moves by at most as
//!   much as `D` (it is the due time plus a fixed delay, a slot that moves with the due time or
//!   less, or an instant that does not move). So its delay after due does not grow, and over an
//!   interval of due times whose ends put each attempt in the same occurrence, the delays are
//!   largest at the start of the interval.
//!
//! So the worst delays are found where some attempt moves to a later occurrence, which
//! bisection finds between two due times whose attempts lie in different occurrences (or stops
//! early when no due time between them can beat the worst found). The instants where an
//! occurrence starts or ends cut the due times into pieces; two pieces with the same occurrences
//! around them, relative to their start, as far as the third attempt can reach, give the same
//! delays, so each such pattern is searched once: a week of daily windows is a few pieces, a
//! daylight-saving change a few more. A search that needs more than [`MAX_RUNS`] simulations
//! stops: the policy is refused if what was found already breaks the promise, and admitted as
//! unproven otherwise.
//!
//! # The scanned horizon
//! The windows' occurrences are listed from `now` for at least [`MIN_SCAN`] (every weekday) and
//! then for 400 years or a few hundred occurrences per window (every leap day to the year 2426,
//! a month's days for decades), and around each daylight-saving change of a window's zone in
//! the coming year, whose gaps and repeated hours can close a window for a day. Their longest
//! closed stretch is the bound's, and the lifetime's check's.

use std::collections::HashSet;

use jiff::{SignedDuration, Timestamp};

use super::{Gap, PROMISED_ATTEMPTS, Run, Simulator, Worst};
use crate::policy::backoff::{saturating_add, saturating_sub};
use crate::policy::window::ValidWindow;

/// How far the first scan looks: the Gregorian calendar repeats every 400 years.
const SCAN: SignedDuration = SignedDuration::from_hours(400 * 365 * 24);

/// The first scan covers at least a week and a day, whatever the count: every weekday, and a
/// window of each day seen twice.
const MIN_SCAN: SignedDuration = SignedDuration::from_hours(8 * 24);

/// Occurrences listed by the first scan beyond [`MIN_SCAN`], shared among the windows (each gets
/// at least [`MIN_PER_WINDOW`]).
const SCAN_OCCURRENCES: usize = 512;
const MIN_PER_WINDOW: usize = 64;

/// The most occurrences of one window a scan lists: a window opening every minute fills a week
/// and a day with 11,520. More (a long duration every minute, all open at once) is not searched.
const MAX_PER_WINDOW: usize = 16_384;

/// How far ahead daylight-saving changes are looked for (the rules repeat yearly), and how much
/// of the time around each is scanned at least (more when the attempts reach further).
const CHANGES_AHEAD: SignedDuration = SignedDuration::from_hours(366 * 24);
const AROUND_CHANGE: SignedDuration = SignedDuration::from_hours(8 * 24);

/// A bound on simulations in an exact search, so that no policy can make the check run away
/// (each is a few `decide` calls). Daily windows need tens; an odd schedule, hundreds.
const MAX_RUNS: usize = 3_000;

const SECOND: SignedDuration = SignedDuration::from_secs(1);

/// One occurrence of one window.
#[derive(Debug, Clone, Copy)]
struct Occurrence {
    start: Timestamp,
    end: Timestamp,
    window: usize,
}

/// The occurrences of the windows from `from` until `complete`.
struct Scan {
    /// Sorted by start; every occurrence that starts before `complete` and is open at or after
    /// `from` is listed.
    occurrences: Vec<Occurrence>,
    from: Timestamp,
    complete: Timestamp,
    /// Closed stretches, each longer than every earlier one.
    gaps: Vec<Gap>,
    longest_gap: SignedDuration,
    longest_occurrence: SignedDuration,
}

/// The windows' occurrences from `now` on: the first scan and those around the coming
/// daylight-saving changes it does not reach.
pub(super) struct Windows {
    scans: Vec<Scan>,
}

impl Windows {
    /// Lists the occurrences; `Err` with the reason when there are too many to search.
    pub(super) fn scan(simulator: &Simulator, now: Timestamp) -> Result<Self, String> {
        let windows = &simulator.windows;
        let per_window = (SCAN_OCCURRENCES / windows.len().max(1)).max(MIN_PER_WINDOW);
        let first = scan(
            windows,
            now,
            saturating_add(now, SCAN),
            saturating_add(now, MIN_SCAN),
            per_window,
        )?;
        // Around a change, every due time whose attempts can meet it.
        let reach = simulator.reach(first.longest_gap, first.longest_occurrence);
        let around = AROUND_CHANGE.max(reach + SignedDuration::from_hours(24));
        let mut scans = vec![first];
        for change in changes(windows, now) {
            let until = saturating_add(change, around);
            if until < scans[0].complete {
                continue;
            }
            let from = saturating_sub(change, around);
            scans.push(scan(windows, from, until, until, MAX_PER_WINDOW)?);
        }
        Ok(Self { scans })
    }

    /// The longest closed stretch of the windows.
    pub(super) fn longest_gap(&self) -> SignedDuration {
        self.scans
            .iter()
            .map(|scan| scan.longest_gap)
            .max()
            .unwrap_or_default()
    }

    /// The earliest closed stretch at least `length` long, if any.
    pub(super) fn gap_of(&self, length: SignedDuration) -> Option<Gap> {
        self.scans
            .iter()
            .flat_map(|scan| scan.gaps.iter())
            .filter(|gap| gap.length >= length)
            .min_by_key(|gap| gap.from)
            .copied()
    }

    /// The longest occurrence: no slot in the spread lies further from its window's opening.
    pub(super) fn longest_occurrence(&self) -> SignedDuration {
        self.scans
            .iter()
            .map(|scan| scan.longest_occurrence)
            .max()
            .unwrap_or_default()
    }

    /// Searches the due times of the scans for `goal`.
    pub(super) fn search(
        &self,
        simulator: &mut Simulator,
        goal: Goal,
        worst: Worst,
    ) -> Result<Found, Stop> {
        let reach = simulator.reach(self.longest_gap(), self.longest_occurrence());
        let mut search = Search {
            budget: simulator.runs + MAX_RUNS,
            simulator,
            goal,
            seen: HashSet::new(),
            worst,
            proven: Some(SignedDuration::ZERO),
        };
        // The usual worst first: due as a window closes.
        self.scans
            .iter()
            .flat_map(|scan| scan.closings())
            .take(64)
            .try_for_each(|due| search.evaluate(due).map(drop))?;
        for scan in &self.scans {
            search.pieces(scan, reach)?;
        }
        if search.worst.due.is_none() {
            return Err(Stop::Budget(
                "the windows' occurrences ran out of the check's bounds before a due time could be searched".into(),
            ));
        }
        Ok(Found {
            worst: search.worst,
            proven: search.proven,
        })
    }
}

/// What a search looks for.
#[derive(Debug, Clone, Copy)]
pub(super) enum Goal {
    /// Whether a due time delays the third attempt by `threshold` or more: the search stops at
    /// the first, and prunes what cannot reach it.
    Decide { threshold: SignedDuration },
    /// The worst delay of the third attempt, to within [`TOLERANCE`], and whether the others
    /// start `room` or more after due.
    Worst { room: SignedDuration },
}

/// How close to the worst delays a [`Goal::Worst`] search comes: a minute, not a second, halves
/// the bisection where attempts move with the due time.
pub(super) const TOLERANCE: SignedDuration = SignedDuration::from_secs(1);

/// A search that ran to its end.
pub(super) struct Found {
    /// The worst delays found (real due times).
    pub worst: Worst,
    /// No due time delays the third attempt more than this (`None`: unbounded).
    pub proven: Option<SignedDuration>,
}

/// A search that stopped early.
pub(super) enum Stop {
    /// [`Goal::Decide`] found a due time at the threshold: its attempts.
    Reached(Worst),
    /// The bound on simulations: why.
    Budget(String),
}

impl Scan {
    /// The instants at which a closed stretch begins.
    fn closings(&self) -> impl Iterator<Item = Timestamp> + '_ {
        self.gaps_all().map(|(from, _)| from)
    }

    /// Every closed stretch within the scan.
    fn gaps_all(&self) -> impl Iterator<Item = (Timestamp, Timestamp)> + '_ {
        let mut open_until = self.from;
        self.occurrences.iter().filter_map(move |occurrence| {
            let gap = (occurrence.start > open_until).then_some((open_until, occurrence.start));
            open_until = open_until.max(occurrence.end);
            gap
        })
    }
}

/// The daylight-saving (and other offset) changes of the windows' zones in the coming year.
fn changes(windows: &[ValidWindow], now: Timestamp) -> Vec<Timestamp> {
    let until = saturating_add(now, CHANGES_AHEAD);
    let mut changes: Vec<Timestamp> = windows
        .iter()
        .flat_map(|window| {
            window
                .time_zone()
                .following(now)
                .map(|transition| transition.timestamp())
                .take_while(move |&at| at <= until)
        })
        .collect();
    changes.sort_unstable();
    changes.dedup();
    changes
}

/// Lists the occurrences of `windows` that are open from `from` on and start before `until`:
/// every one that starts before `at_least`, then at most `cap` per window; `complete` is cut to
/// the earliest window that ran out.
fn scan(
    windows: &[ValidWindow],
    from: Timestamp,
    until: Timestamp,
    at_least: Timestamp,
    cap: usize,
) -> Result<Scan, String> {
    let mut occurrences = Vec::new();
    let mut complete = until;
    let at_least = at_least.min(until);
    // The window that opens most often first: it cuts `complete` before a rare one is listed
    // for decades.
    let mut order: Vec<usize> = (0..windows.len()).collect();
    order.sort_by_cached_key(|&index| {
        windows[index]
            .occurrences_after(from)
            .nth(3)
            .map(|o| o.start)
    });
    for index in order {
        let window = &windows[index];
        // An occurrence open at `from` counts; so does every later one that opened before it.
        let begin = window
            .occurrence_containing(from)
            .and_then(|open| open.start.checked_sub(SignedDuration::from_nanos(1)).ok())
            .unwrap_or(from);
        let mut listed = 0;
        for occurrence in window.occurrences_after(begin) {
            if occurrence.start >= complete {
                break;
            }
            occurrences.push(Occurrence {
                start: occurrence.start,
                end: occurrence.end,
                window: index,
            });
            listed += 1;
            if (listed >= cap && occurrence.start >= at_least) || listed >= MAX_PER_WINDOW {
                complete = complete.min(occurrence.start);
                break;
            }
        }
    }
    if complete < at_least {
        return Err(format!(
            "window occurrences come too thick: more than {MAX_PER_WINDOW} of one window open within {} from {from}",
            super::human(at_least.duration_since(from))
        ));
    }
    occurrences.retain(|occurrence| occurrence.start < complete);
    occurrences.sort_by_key(|o| (o.start, o.end, o.window));
    let mut scan = Scan {
        longest_occurrence: occurrences
            .iter()
            .map(|o| o.end.duration_since(o.start))
            .max()
            .unwrap_or_default(),
        occurrences,
        from,
        complete,
        gaps: Vec::new(),
        longest_gap: SignedDuration::ZERO,
    };
    let open_until = scan
        .occurrences
        .iter()
        .map(|o| o.end)
        .fold(from, Timestamp::max);
    // Closed until the end of the scan at least.
    let tail = (open_until < complete).then_some((open_until, complete));
    let gaps: Vec<(Timestamp, Timestamp)> = scan.gaps_all().chain(tail).collect();
    for (from, to) in gaps {
        let length = to.duration_since(from);
        if length > scan.longest_gap {
            scan.longest_gap = length;
            scan.gaps.push(Gap { length, from, to });
        }
    }
    Ok(scan)
}

/// The occurrences around a piece of due times, relative to its start: equal for two pieces,
/// equal delays.
type Pattern = Vec<(i128, i128, usize)>;

struct Search<'a> {
    simulator: &'a mut Simulator,
    /// The simulator's run count at which the search stops.
    budget: usize,
    goal: Goal,
    seen: HashSet<Pattern>,
    worst: Worst,
    /// No due time pruned or evaluated so far delays the third attempt more (`None`: unbounded).
    proven: Option<SignedDuration>,
}

impl Search<'_> {
    /// Searches every piece of `scan` whose pattern is new, as far as the third attempt can
    /// `reach` after a due time.
    fn pieces(&mut self, scan: &Scan, reach: SignedDuration) -> Result<(), Stop> {
        let mut cuts: Vec<Timestamp> = std::iter::once(scan.from)
            .chain(scan.occurrences.iter().flat_map(|o| [o.start, o.end]))
            .filter(|&cut| scan.from <= cut && cut < scan.complete)
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        // Consecutive new pieces are searched together: one bound may prune them all.
        let mut run: Option<(Timestamp, Timestamp)> = None;
        for piece in cuts.windows(2) {
            let (start, end) = (piece[0], piece[1]);
            // What the attempts of every due time in the piece can meet.
            let Some(horizon) = end.checked_add(reach).ok().filter(|h| *h <= scan.complete) else {
                break;
            };
            if self.seen.insert(pattern(scan, start, horizon)) {
                run = Some((run.map_or(start, |(from, _)| from), end));
            } else if let Some((from, to)) = run.take() {
                self.range(from, to)?;
            }
        }
        if let Some((from, to)) = run {
            self.range(from, to)?;
        }
        Ok(())
    }

    /// Searches the due times from `from` to `to`.
    fn range(&mut self, from: Timestamp, to: Timestamp) -> Result<(), Stop> {
        let first = self.evaluate(from)?;
        let last = self.evaluate(to)?;
        self.bisect(first, last)
    }

    /// Searches the due times between the two evaluated ones.
    fn bisect(&mut self, first: Run, last: Run) -> Result<(), Stop> {
        let mut pending = vec![(first, last)];
        while let Some((first, last)) = pending.pop() {
            let third = |run: &Run| run.late()[PROMISED_ATTEMPTS - 1];
            let width = last.due.duration_since(first.due);
            // Each attempt in the same occurrence at both ends: the delays are largest at
            // `first`, already counted; so with no whole second between them.
            if first.places == last.places || width <= SECOND {
                self.prove(third(&first));
                continue;
            }
            // An attempt starts at most where it does for the later due time, and the due time
            // is at least the earlier one.
            let most =
                |start: &Option<Timestamp>| start.map(|start| start.duration_since(first.due));
            let pruned = match self.goal {
                Goal::Decide { threshold } => {
                    let most = most(&last.starts[PROMISED_ATTEMPTS - 1]);
                    let below = most.is_some_and(|most| most < threshold);
                    if below {
                        self.prove(most);
                    }
                    below
                }
                // The third attempt's worst delay to within the tolerance; of the others, only
                // whether they can start before the fail-safe point (how many attempts fit).
                Goal::Worst { room } => {
                    let (third, others) = last.starts.split_last().unwrap_or((&None, &[]));
                    let worst = self.worst.late[PROMISED_ATTEMPTS - 1];
                    !later(most(third), worst.map(|worst| worst + TOLERANCE))
                        && others.iter().zip(&self.worst.late).all(|(start, worst)| {
                            most(start).is_some_and(|most| most < room)
                                || !worst.is_some_and(|worst| worst < room)
                        })
                }
            };
            if pruned {
                continue;
            }
            let middle = first.due + SignedDuration::from_secs(width.as_secs() / 2);
            let middle = self.evaluate(middle)?;
            pending.push((middle.clone(), last));
            pending.push((first, middle));
        }
        Ok(())
    }

    /// Counts `third` as a delay no due time of some interval exceeds.
    fn prove(&mut self, third: Option<SignedDuration>) {
        if later(third, self.proven) {
            self.proven = third;
        }
    }

    fn evaluate(&mut self, due: Timestamp) -> Result<Run, Stop> {
        if self.simulator.runs >= self.budget {
            return Err(Stop::Budget(format!(
                "finding the worst case took more than {MAX_RUNS} simulated renewals"
            )));
        }
        let run = self.simulator.run(due);
        let late = run.late();
        let third = late[PROMISED_ATTEMPTS - 1];
        if later(third, self.worst.late[PROMISED_ATTEMPTS - 1]) || self.worst.due.is_none() {
            self.worst.due = Some(due);
        }
        for (worst, late) in self.worst.late.iter_mut().zip(late) {
            if later(late, *worst) {
                *worst = late;
            }
        }
        if let Goal::Decide { threshold } = self.goal
            && third.is_none_or(|third| third >= threshold)
        {
            return Err(Stop::Reached(Worst {
                late,
                due: Some(due),
            }));
        }
        Ok(run)
    }
}

/// Whether delay `a` is later than `b`; `None` is never.
fn later(a: Option<SignedDuration>, b: Option<SignedDuration>) -> bool {
    match (a, b) {
        (None, None) => false,
        (None, Some(_)) => true,
        (Some(_), None) => false,
        (Some(a), Some(b)) => a > b,
    }
}

/// The occurrences open after `start` that start before `horizon`, relative to `start`.
fn pattern(scan: &Scan, start: Timestamp, horizon: Timestamp) -> Pattern {
    let earliest = saturating_sub(start, scan.longest_occurrence);
    let first = scan.occurrences.partition_point(|o| o.start < earliest);
    let relative = |t: Timestamp| t.duration_since(start).as_nanos();
    scan.occurrences[first..]
        .iter()
        .take_while(|o| o.start < horizon)
        .filter(|o| o.end > start)
        .map(|o| (relative(o.start), relative(o.end), o.window))
        .collect()
}
