//! Whether a renewal policy can keep its promise (issue 38, "Policies proven at admission"):
//! renew the certificates it governs before they expire, with room for failures, and before the
//! shipped expiry alert fires. The admission webhook refuses a policy that cannot
//! ([`crate::admission::policies`]); the policy controller reports it in the `PromiseKept`
//! condition, for a policy written while the webhook was down, without holding its renewals.
//!
//! # The promise
//! An `Automatic` or `Scheduled` policy keeps its promise when, in the worst case,
//! - the windows open within every lifetime (`ttl`) of the certificates: no closed stretch of
//!   the windows is as long as `ttl`;
//! - at least [`PROMISED_ATTEMPTS`] automatic attempts start before the fail-safe point
//!   (`expiry − failSafeMargin`) when every one of them fails: two failures in a row, from a
//!   node restarting to a k8sd hiccup, still leave an attempt inside the windows;
//! - the last of those attempts starts before `CK8sCertsNodeCertificatesExpiringSoon` fires
//!   ([`EXPIRING_SOON`] before expiry, `config/monitoring`), so the alert means that renewal
//!   failed, not that it has not been tried yet. Not for a `ttl` of at most [`EXPIRING_SOON`]:
//!   such certificates are inside the alert's range from the moment they are issued, whatever
//!   the policy, so refusing the policy would refuse short lifetimes altogether (the refusal
//!   and the kept promise say so).
//!
//! `Disabled` promises nothing and is admitted.
//!
//! # The worst case, by simulation
//! The worst case is not modelled beside the decision: it is [`decide`] itself, stepped as the
//! Machine controller steps it (every deferral's `until`, every failure recorded as
//! `failedAttempts` + `lastFailureTime`), so the proof and the controller cannot disagree. The
//! lifetime is the policy's `ttl` (the certificates a renewal under it issues), the due time
//! `expiry − renewBefore` or `renewBeforePercentage` of `ttl` before expiry, as the decision
//! derives it. The worst case takes
//! - every attempt failing, its failure recorded [`ATTEMPT_LENGTH`] after it started (a later
//!   failure delays every later attempt);
//! - the last place in the `spread` ([`StaggerKey::LAST`]);
//! - with `canary`, a Machine that is not a canary and waits `maxWait` for them after it is due
//!   (a failed canary holds it longer, until its fail-safe point: that stop of the line is
//!   deliberate, like the circuit breaker's, and no promise covers it);
//! - under `Scheduled`, the worst due instant `D` from `now` on: see [`scheduled`]. `Automatic`
//!   has no windows: every due instant gives the same attempts.
//!
//! Attempts are simulated with the fail-safe point out of the way and counted against the real
//! one afterwards: before it, neither the fail-safe nor `--renewal-window-strict` changes
//! anything (both only decide what happens at or after it: a bypass of the windows, hourly
//! retries), so the check assumes neither and holds for both.
//!
//! Not in the worst case: the gates, the breaker and the canaries of issue 38, which hold a
//! renewal for reasons outside the policy, and a controller that is down.
//!
//! [`check`] explains a refusal with the worst case (its due time, the delay of the third
//! attempt, a value that would work); [`admission`] decides the same without searching for the
//! worst once a breaking due time is found (the property test's pace).

use std::fmt;
use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};

use super::backoff::{Backoff, Failures, saturating_add};
use super::decision::{Decision, Input, Mode, decide};
use super::duration::{FailSafeMargin, PolicyDuration, Ttl};
use super::spec::{Settings, ValidPolicy};
use super::stagger::StaggerKey;
use super::window::{ValidWindow, opened_first};

mod scheduled;

/// How many attempts must start before the fail-safe point when all fail.
pub const PROMISED_ATTEMPTS: usize = 3;

/// The shipped alert whose range the third attempt must start before.
pub const EXPIRING_SOON_ALERT: &str = "CK8sCertsNodeCertificatesExpiringSoon";

/// How long before expiry [`EXPIRING_SOON_ALERT`] fires (its expression in
/// `config/monitoring/prometheusrule.yaml`; a test keeps the two equal).
pub const EXPIRING_SOON: SignedDuration = SignedDuration::from_hours(14 * 24);

/// How long after its start a failed attempt is recorded (`lastFailureTime`, from which the
/// backoff counts). A refresh that fails does so within its timeouts: with the defaults, up to
/// 2m to reach the node, 5 tries of a 5m `run` and 10m of waiting for a node that restarts,
/// 47m in all; an hour covers them.
pub const ATTEMPT_LENGTH: SignedDuration = SignedDuration::from_hours(1);

/// How far the simulation looks for attempts after a due time: a lifetime, and no more than
/// the 400 years after which the Gregorian calendar (and so every schedule) repeats.
const MAX_HORIZON: SignedDuration = SignedDuration::from_hours(400 * 365 * 24);

/// A bound on `decide` calls for one attempt: a deferral ends in an attempt, or, with windows,
/// in a window opening and then an attempt; a few more for a slot in a window.
const STEPS_PER_ATTEMPT: usize = 8;

/// What a policy promises, once checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Promise {
    /// `Disabled`: nothing is renewed automatically, so nothing is promised.
    Nothing,
    /// The promise holds in the worst case.
    Kept(Kept),
    /// The windows could not be checked within the check's bounds (occurrences that overlap by
    /// the thousand): admitted, and said so.
    Unproven(String),
}

/// The worst case of a policy that keeps its promise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub terms: Terms,
    /// When the third attempt starts after the due time, at worst.
    pub third: SignedDuration,
    /// Whether `third` is the worst case found, or a bound on it.
    pub exact: bool,
}

/// A promise the policy cannot keep: the message names the number that is wrong and what
/// would work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Broken {
    #[error(
        "the windows stay closed for {} from {} to {}, at least the certificates' lifetime (ttl {}): certificates issued at {} would expire before a window opens; open the windows more often, or give a ttl longer than {}",
        human(gap.length), gap.from, gap.to, terms.ttl, gap.from, human(gap.length)
    )]
    NeverOpens { terms: Terms, gap: Gap },
    #[error(
        "{} leaves {} before the fail-safe point (expiry − {}) in the worst case: the {} would {}; {}",
        terms.renew_before, attempts(usize::from(*fits)), human(terms.margin.as_duration()),
        ordinal(PROMISED_ATTEMPTS), start(*third, *due, terms), suggest(*suggestion, terms, "would leave 3")
    )]
    TooFewAttempts {
        terms: Terms,
        /// The attempts that start before the fail-safe point in the worst case (of the
        /// first three).
        fits: u8,
        third: Option<SignedDuration>,
        /// The due instant of the worst case, under `Scheduled`.
        due: Option<Timestamp>,
        suggestion: Option<Suggestion>,
    },
    #[error(
        "the {EXPIRING_SOON_ALERT} alert fires {} before expiry, before the {} attempt in the worst case: with {} it starts {} ({} after due{}{}); {} (certificates whose ttl is at most {} are exempt: the alert fires for them throughout their lifetime)",
        human(EXPIRING_SOON), ordinal(PROMISED_ATTEMPTS), terms.renew_before,
        from_expiry(terms.renew_before.length - *third), human(*third), when(*due), waited(terms),
        suggest(*suggestion, terms, "would start it before the alert"), human(EXPIRING_SOON)
    )]
    AlertFirst {
        terms: Terms,
        third: SignedDuration,
        due: Option<Timestamp>,
        suggestion: Option<Suggestion>,
    },
}

/// A closed stretch of the windows: no window is open from `from` (inclusive) to `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    pub length: SignedDuration,
    pub from: Timestamp,
    pub to: Timestamp,
}

/// The numbers of a policy the promise is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    pub ttl: Ttl,
    pub renew_before: RenewBefore,
    pub margin: FailSafeMargin,
    /// `canary.maxWait` in seconds, which a Machine that is not a canary may wait first (0:
    /// none; seconds keep [`Broken`] small).
    pub canary_wait: i64,
}

/// How the policy sets the due time, and how long before expiry that is for a lifetime of
/// `ttl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenewBefore {
    pub written: Written,
    pub length: SignedDuration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Duration(PolicyDuration),
    /// Neither `renewBefore` nor `renewBeforePercentage`: 30d.
    Default,
    Percentage(i32),
}

/// A value of the policy's own field that would keep the promise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suggestion {
    RenewBefore(PolicyDuration),
    Percentage(i32),
}

impl Terms {
    pub fn of(policy: &ValidPolicy) -> Self {
        let ttl = policy.ttl;
        let written = match (policy.renew_before, policy.renew_before_percentage) {
            (Some(duration), _) => Written::Duration(duration),
            (None, Some(percentage)) => Written::Percentage(percentage),
            (None, None) => Written::Default,
        };
        // As the decision derives it from a lifetime of `ttl`.
        let due = Input::new(policy.mode, None).with_lifetime_start(Some(Timestamp::UNIX_EPOCH));
        let due = Input {
            renew_before: policy.renew_before,
            renew_before_percentage: policy.renew_before_percentage,
            ttl: Some(ttl),
            ..due
        };
        let expiry = saturating_add(Timestamp::UNIX_EPOCH, ttl.as_duration());
        Self {
            ttl,
            renew_before: RenewBefore {
                written,
                length: expiry.duration_since(due.due_at(expiry)),
            },
            margin: policy.fail_safe_margin,
            canary_wait: policy
                .canary
                .as_ref()
                .map_or(0, |canary| canary.max_wait.as_secs()),
        }
    }

    /// From the due time to the fail-safe point; negative when the margin is the longer.
    fn room(&self) -> SignedDuration {
        self.renew_before.length - self.margin.as_duration()
    }

    /// Whether the alert is checked (see the module docs).
    fn alert_applies(&self) -> bool {
        self.ttl.as_duration() > EXPIRING_SOON
    }

    /// The value of the policy's field that leaves the third attempt `third` after due before
    /// the fail-safe point and, where it applies, before the alert; `None` when none shorter
    /// than `ttl` would.
    fn suggestion(&self, third: Option<SignedDuration>) -> Option<Suggestion> {
        let third = third?;
        let one = SignedDuration::from_secs(1);
        let mut needed = third + self.margin.as_duration() + one;
        if self.alert_applies() {
            needed = needed.max(third + EXPIRING_SOON);
        }
        let ttl = self.ttl.as_duration();
        match self.renew_before.written {
            Written::Percentage(_) => {
                let seconds = needed.as_secs();
                let percent = (seconds.saturating_mul(100) + ttl.as_secs() - 1) / ttl.as_secs();
                (percent <= 99).then_some(Suggestion::Percentage(percent as i32))
            }
            Written::Duration(_) | Written::Default => {
                let rounded = round_up(needed);
                (rounded < ttl)
                    .then(|| PolicyDuration::from_seconds(rounded.as_secs()).ok())
                    .flatten()
                    .map(Suggestion::RenewBefore)
            }
        }
    }

    /// The delay of the third attempt after due from which the promise is broken: the
    /// fail-safe point, or the alert's instant when it comes first.
    fn threshold(&self) -> SignedDuration {
        let room = self.room();
        match self.alert_applies() {
            true => {
                room.min(self.renew_before.length - EXPIRING_SOON + SignedDuration::from_nanos(1))
            }
            false => room,
        }
    }

    /// Kept or broken, for the worst case `worst`: found (`exact`), or a bound on it.
    fn judge(self, worst: Worst, exact: bool) -> Result<Promise, Broken> {
        self.judge_within(worst, SignedDuration::ZERO)
            .map(|kept| match kept {
                Promise::Kept(kept) => Promise::Kept(Kept { exact, ..kept }),
                other => other,
            })
    }

    /// [`Self::judge`] for a worst case found to within `slack` (the suggestion allows for it).
    fn judge_within(self, worst: Worst, slack: SignedDuration) -> Result<Promise, Broken> {
        let room = self.room();
        let fits = worst
            .late
            .iter()
            .take_while(|late| late.is_some_and(|late| late < room))
            .count();
        let third = worst.late[PROMISED_ATTEMPTS - 1];
        let suggestion = self.suggestion(third.map(|third| third + slack));
        let third = match third {
            Some(third) if fits >= PROMISED_ATTEMPTS => third,
            _ => {
                return Err(Broken::TooFewAttempts {
                    terms: self,
                    fits: u8::try_from(fits).unwrap_or(u8::MAX),
                    third,
                    due: worst.due,
                    suggestion,
                });
            }
        };
        if self.alert_applies() && third > self.renew_before.length - EXPIRING_SOON {
            return Err(Broken::AlertFirst {
                terms: self,
                third,
                due: worst.due,
                suggestion,
            });
        }
        Ok(Promise::Kept(Kept {
            terms: self,
            third,
            exact: true,
        }))
    }
}

/// Up to whole hours, or whole days from two days on: a value to write, not to compute with.
fn round_up(duration: SignedDuration) -> SignedDuration {
    let unit = match duration < SignedDuration::from_hours(48) {
        true => 3600,
        false => 86_400,
    };
    let seconds = duration.as_secs();
    SignedDuration::from_secs(
        seconds.div_euclid(unit) * unit + unit * i64::from(seconds % unit != 0),
    )
}

/// Checks `policy` against its promise for certificates whose renewal is due from `now` on,
/// with the controller's `backoff` (`--renewal-backoff-min`/`-max`). Pure: the same policy,
/// backoff and `now` give the same answer.
pub fn check(policy: &ValidPolicy, backoff: Backoff, now: Timestamp) -> Result<Promise, Broken> {
    judge(policy, backoff, now, true)
}

/// [`check`]'s answer without the worst case of a refusal: a refusal names the first due time
/// found that breaks the promise, with its numbers. What is admitted is the same (the property
/// test's pace).
#[cfg(test)]
pub(crate) fn admission(
    policy: &ValidPolicy,
    backoff: Backoff,
    now: Timestamp,
) -> Result<Promise, Broken> {
    judge(policy, backoff, now, false)
}

fn judge(
    policy: &ValidPolicy,
    backoff: Backoff,
    now: Timestamp,
    worst: bool,
) -> Result<Promise, Broken> {
    // Whole seconds, as every instant a policy names: a due time in a message reads as one.
    let now = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let terms = Terms::of(policy);
    let mut simulator = Simulator::new(policy, backoff);
    match policy.mode {
        Mode::Disabled => Ok(Promise::Nothing),
        Mode::Automatic => {
            let run = simulator.run(now);
            let worst = Worst {
                late: run.late(),
                due: None,
            };
            terms.judge(worst, true)
        }
        Mode::Scheduled => {
            let windows = match scheduled::Windows::scan(&simulator, now) {
                Ok(windows) => windows,
                Err(why) => return Ok(Promise::Unproven(why)),
            };
            if let Some(gap) = windows.gap_of(terms.ttl.as_duration()) {
                return Err(Broken::NeverOpens { terms, gap });
            }
            // Most policies keep their promise by the bound alone.
            let longest = (windows.longest_gap(), windows.longest_occurrence());
            let bound = simulator.bounds(longest.0, longest.1)[PROMISED_ATTEMPTS - 1];
            if let Ok(kept) = terms.judge(Worst::bounded(bound), false) {
                return Ok(kept);
            }
            // Whether any due time breaks it; then, for the message, how badly, or by how much
            // it is kept.
            let goal = scheduled::Goal::Decide {
                threshold: terms.threshold(),
            };
            let (found, kept) = match windows.search(&mut simulator, goal, Worst::none()) {
                Err(scheduled::Stop::Budget(why)) => return Ok(Promise::Unproven(why)),
                Ok(found) => match found.proven {
                    Some(bound) => (found.worst, Some(bound)),
                    None => return Ok(Promise::Unproven("no bound was found".into())),
                },
                Err(scheduled::Stop::Reached(reached)) => (reached, None),
            };
            if !worst {
                return match kept {
                    Some(bound) => terms.judge(Worst::bounded(bound), false),
                    None => terms.judge_within(found, scheduled::TOLERANCE),
                };
            }
            let goal = scheduled::Goal::Worst { room: terms.room() };
            let (worst, complete) = match windows.search(&mut simulator, goal, found.clone()) {
                Ok(searched) => (searched.worst, true),
                Err(scheduled::Stop::Reached(worst)) => (worst, true),
                Err(scheduled::Stop::Budget(_)) => (found, false),
            };
            match (kept, complete) {
                // The bound the decision proved, where the worst case could not be pinned down.
                (Some(bound), false) => terms.judge(Worst::bounded(bound), false),
                (Some(bound), true) => match terms.judge_within(worst, scheduled::TOLERANCE) {
                    Ok(kept) => Ok(kept),
                    // Cannot happen (the decision found none); keep what it proved.
                    Err(_) => terms.judge(Worst::bounded(bound), false),
                },
                (None, _) => match terms.judge_within(worst, scheduled::TOLERANCE) {
                    Err(broken) => Err(broken),
                    Ok(_) => Ok(Promise::Unproven(
                        "the worst case was not found again".into(),
                    )),
                },
            }
        }
    }
}

/// How late after due each of the first attempts starts in the worst case (`None`: not within
/// a lifetime), and the due instant of the latest third attempt when due times were searched.
#[derive(Debug, Clone, Default)]
pub(crate) struct Worst {
    late: [Option<SignedDuration>; PROMISED_ATTEMPTS],
    due: Option<Timestamp>,
}

impl Worst {
    /// Nothing found yet.
    fn none() -> Self {
        Self {
            late: [Some(SignedDuration::MIN); PROMISED_ATTEMPTS],
            due: None,
        }
    }

    /// Every attempt within `bound` after due.
    fn bounded(bound: SignedDuration) -> Self {
        Self {
            late: [Some(bound); PROMISED_ATTEMPTS],
            due: None,
        }
    }
}

/// Steps `decide` through the failing attempts of one lifetime.
pub(crate) struct Simulator {
    /// The policy's input with the fail-safe point out of the way, the last place in the
    /// spread, and no failures yet.
    input: Input,
    windows: Arc<[ValidWindow]>,
    horizon: SignedDuration,
    backoff: Backoff,
    spread: SignedDuration,
    /// How long a Machine that is not a canary may wait for the canaries after it is due
    /// (`canary.maxWait`; zero without canaries): its first attempt starts no earlier.
    canaries: SignedDuration,
    /// Simulations run, for the check's own bound.
    runs: usize,
}

/// The attempts of one simulated lifetime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Run {
    pub due: Timestamp,
    pub starts: [Option<Timestamp>; PROMISED_ATTEMPTS],
    /// For each attempt, the window occurrence it started in (position in the list, opening):
    /// while these stay the same, moving the due time moves no attempt by more than itself.
    pub places: [Option<(usize, Timestamp)>; PROMISED_ATTEMPTS],
}

impl Run {
    fn late(&self) -> [Option<SignedDuration>; PROMISED_ATTEMPTS] {
        self.starts
            .map(|start| start.map(|start| start.duration_since(self.due)))
    }
}

impl Simulator {
    fn new(policy: &ValidPolicy, backoff: Backoff) -> Self {
        let settings = Settings {
            strict: false,
            backoff,
        };
        let mut input = policy.input(None, Failures::default(), settings);
        let windows = input
            .checked
            .as_ref()
            .map(|checked| checked.0.clone())
            .unwrap_or_else(|| Arc::from([]));
        let horizon = policy.ttl.as_duration().min(MAX_HORIZON);
        // Due `horizon` before an expiry `horizon` after the due time, whose fail-safe point is
        // the expiry: nothing the fail-safe does comes before it.
        input.renew_before = PolicyDuration::from_seconds(horizon.as_secs()).ok();
        input.renew_before_percentage = None;
        input.fail_safe_margin = Some(FailSafeMargin::from_secs_const(0));
        input.stagger = Some(StaggerKey::LAST);
        // Checked already: `decide` reads the checked windows.
        input.windows = Vec::new();
        Self {
            input,
            windows,
            horizon,
            backoff,
            spread: policy.spread.as_duration(),
            canaries: policy
                .canary
                .as_ref()
                .map_or(SignedDuration::ZERO, |canary| canary.max_wait),
            runs: 0,
        }
    }

    /// The attempts after a due time of `due`, all failing.
    fn run(&mut self, due: Timestamp) -> Run {
        self.runs += 1;
        let mut run = Run {
            due,
            starts: [None; PROMISED_ATTEMPTS],
            places: [None; PROMISED_ATTEMPTS],
        };
        let Ok(end) = due.checked_add(self.horizon) else {
            return run;
        };
        self.input.expiry = Some(end);
        self.input.failures = Failures::default();
        let mut now = saturating_add(due, self.canaries);
        'attempts: for attempt in 0..PROMISED_ATTEMPTS {
            for _ in 0..STEPS_PER_ATTEMPT {
                match decide(&self.input, now) {
                    Decision::RenewNow(_) => {
                        run.starts[attempt] = Some(now);
                        run.places[attempt] = opened_first(&self.windows, now)
                            .map(|occurrence| (occurrence.index, occurrence.start.timestamp()));
                        let failed = saturating_add(now, ATTEMPT_LENGTH);
                        self.input.failures = Failures {
                            count: Some(attempt as i64 + 1),
                            last_failure: Some(failed),
                        };
                        now = failed;
                        continue 'attempts;
                    }
                    Decision::Defer(deferral) if deferral.until > now && deferral.until < end => {
                        now = deferral.until;
                    }
                    _ => break 'attempts,
                }
            }
            break;
        }
        run
    }

    /// How far after a due time each attempt can start at most, given that no window stays
    /// closed longer than `longest_closed` nor is open longer than `longest_open` (a slot in the
    /// spread lies inside its window's occurrence; see [`scheduled`]).
    fn bounds(
        &self,
        longest_closed: SignedDuration,
        longest_open: SignedDuration,
    ) -> [SignedDuration; PROMISED_ATTEMPTS] {
        let wait = longest_closed + self.spread.min(longest_open);
        let mut bound = self.canaries;
        std::array::from_fn(|attempt| {
            if attempt > 0 {
                bound += ATTEMPT_LENGTH + self.backoff.delay(Some(attempt as i64));
            }
            bound += wait;
            bound
        })
    }

    /// How far after a due time the third attempt can reach (a second more), within the
    /// simulated horizon: what a piece of due times can meet.
    fn reach(
        &self,
        longest_closed: SignedDuration,
        longest_open: SignedDuration,
    ) -> SignedDuration {
        (self.bounds(longest_closed, longest_open)[PROMISED_ATTEMPTS - 1]
            + SignedDuration::from_secs(1))
        .min(self.horizon)
    }
}

/// A duration as the policy's fields write it (`1d14h`, `5h14m59s`, `0s`).
fn human(duration: SignedDuration) -> String {
    match FailSafeMargin::from_seconds(duration.as_secs().max(0)) {
        Ok(duration) => duration.to_string(),
        Err(_) => format!("{}s", duration.as_secs()),
    }
}

/// `5d before expiry`, or `2h after expiry` for a negative `before`.
fn from_expiry(before: SignedDuration) -> String {
    match before.is_negative() {
        true => format!("{} after expiry", human(-before)),
        false => format!("{} before expiry", human(before)),
    }
}

fn ordinal(n: usize) -> String {
    match n {
        1 => "1st".into(),
        2 => "2nd".into(),
        3 => "3rd".into(),
        n => format!("{n}th"),
    }
}

fn attempts(n: usize) -> String {
    match n {
        1 => "1 attempt".into(),
        n => format!("{n} attempts"),
    }
}

fn when(due: Option<Timestamp>) -> String {
    due.map(|due| format!(", such as when due at {due}"))
        .unwrap_or_default()
}

/// When the worst case's third attempt starts, for the refusal.
/// `, counting canary.maxWait …` when the worst case waits for canaries first.
fn waited(terms: &Terms) -> String {
    match terms.canary_wait {
        0 => String::new(),
        seconds => format!(
            ", counting canary.maxWait {} waited for the canaries first",
            human(SignedDuration::from_secs(seconds))
        ),
    }
}

fn start(third: Option<SignedDuration>, due: Option<Timestamp>, terms: &Terms) -> String {
    match third {
        Some(third) => format!(
            "start {} after due{}{}",
            human(third),
            when(due),
            waited(terms)
        ),
        None => format!(
            "not start within the certificates' lifetime (ttl {}) after due{}",
            terms.ttl,
            when(due)
        ),
    }
}

fn suggest(suggestion: Option<Suggestion>, terms: &Terms, effect: &str) -> String {
    match suggestion {
        Some(Suggestion::RenewBefore(duration)) => {
            format!("a renewBefore of at least {duration} {effect}")
        }
        Some(Suggestion::Percentage(percent)) => {
            format!("a renewBeforePercentage of at least {percent} {effect}")
        }
        None => format!(
            "no {} short enough for the ttl ({}) {effect}: open the windows more often or for longer, or give a longer ttl",
            match terms.renew_before.written {
                Written::Percentage(_) => "renewBeforePercentage",
                Written::Duration(_) | Written::Default => "renewBefore",
            },
            terms.ttl
        ),
    }
}

impl fmt::Display for RenewBefore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.written {
            Written::Duration(duration) => write!(f, "renewBefore {duration}"),
            Written::Default => write!(f, "renewBefore {} (the default)", human(self.length)),
            Written::Percentage(percent) => write!(
                f,
                "renewBeforePercentage {percent} ({} of the ttl)",
                human(self.length)
            ),
        }
    }
}

impl fmt::Display for Kept {
    /// The `PromiseKept` message.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let terms = &self.terms;
        write!(
            f,
            "At least {PROMISED_ATTEMPTS} attempts start before the fail-safe point (expiry − {}) in the worst case: the {} {}{} after due, {} before it",
            human(terms.margin.as_duration()),
            ordinal(PROMISED_ATTEMPTS),
            if self.exact { "" } else { "at most " },
            human(self.third),
            human(terms.room() - self.third),
        )?;
        match terms.alert_applies() {
            true => write!(
                f,
                ", and {} before the {EXPIRING_SOON_ALERT} alert ({} before expiry)",
                human(terms.renew_before.length - EXPIRING_SOON - self.third),
                human(EXPIRING_SOON)
            ),
            false => write!(
                f,
                "; the {EXPIRING_SOON_ALERT} alert is not checked: with a ttl of {} (at most {}) it fires for these certificates throughout their lifetime",
                terms.ttl,
                human(EXPIRING_SOON)
            ),
        }
    }
}

impl fmt::Display for Promise {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Nothing => f.write_str(
                "The policy is Disabled: it renews nothing automatically and promises nothing",
            ),
            Self::Kept(kept) => kept.fmt(f),
            Self::Unproven(why) => write!(f, "The windows could not be checked: {why}"),
        }
    }
}

#[cfg(test)]
mod tests;
