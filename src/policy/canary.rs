//! Canaries (issue 38): a policy's Machines on canary clusters (`spec.canary.clusterSelector`)
//! renew first, and the others wait for them. Pure: the canaries' records and the time in, where
//! the others stand out; the Machine reconciler holds a due non-canary renewal by it, and the
//! policy controller reports it in the policy's `CanariesPassed` condition.
//!
//! The others wait while
//! - a canary's last automatic renewal failed under this generation of the policy (after
//!   `since`): until it succeeds (a retry, or a person renewing it by hand); not bounded by
//!   `maxWait`: a change that breaks canaries would break the others too;
//! - a canary is due and not renewed yet, for at most `maxWait` after it became due: canaries
//!   go first in every round, not only after a change;
//! - a canary has not renewed since this generation was first seen, for at most `maxWait` after
//!   that: a change (a new `ttl`) is tried on canaries first.
//!
//! Like a gate, a hold ends at the other Machine's fail-safe point (its caller's rule).

use std::fmt;

use jiff::{SignedDuration, Timestamp};

/// A canary Machine as its record shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanaryMachine {
    /// `namespace/name`.
    pub machine: String,
    /// When its renewal became due (its certificates' due time), when known.
    pub due_at: Option<Timestamp>,
    /// When its last attempt failed, while its last attempt failed.
    pub failed_at: Option<Timestamp>,
    /// When a refresh of it last succeeded.
    pub renewed_at: Option<Timestamp>,
}

/// Where the policy's other Machines stand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// The policy has no canary Machines: nothing to wait for.
    NoCanaries,
    /// Every canary renewed under this generation and none is due.
    Renewed,
    /// Some canaries did not renew under this generation, but `maxWait` has passed.
    WaitElapsed,
    /// The others wait.
    Hold(Hold),
}

/// Why the others wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// A canary's automatic renewal failed under this generation (the first, by name).
    Failed { machine: String, at: Timestamp },
    /// Canaries are due or have not renewed under this generation (at most [`SHOWN`] named,
    /// of `count`): the others go once they have, and at `until` at the latest.
    Pending {
        machines: Vec<String>,
        count: usize,
        until: Timestamp,
    },
}

/// How many pending canaries a message names.
pub const SHOWN: usize = 5;

/// Where the others stand at `now`, for `canaries` of a generation first seen at `since`.
pub fn standing(
    canaries: &[CanaryMachine],
    since: Timestamp,
    max_wait: SignedDuration,
    now: Timestamp,
) -> Standing {
    if canaries.is_empty() {
        return Standing::NoCanaries;
    }
    let mut sorted: Vec<&CanaryMachine> = canaries.iter().collect();
    sorted.sort_by(|a, b| a.machine.cmp(&b.machine));
    if let Some((machine, at)) = sorted
        .iter()
        .find_map(|c| c.failed_at.filter(|at| *at >= since).map(|at| (c, at)))
    {
        return Standing::Hold(Hold::Failed {
            machine: machine.machine.clone(),
            at,
        });
    }
    let renewed = |c: &CanaryMachine| c.renewed_at.is_some_and(|at| at >= since);
    // Each canary still awaited, and until when at the latest.
    let awaited: Vec<(&str, Timestamp)> = sorted
        .iter()
        .filter_map(|c| {
            let due = c
                .due_at
                .filter(|due| *due <= now)
                .map(|due| due.saturating_add(max_wait).unwrap_or(due));
            let untried = (!renewed(c)).then(|| since.saturating_add(max_wait).unwrap_or(since));
            let until = [due, untried].into_iter().flatten().max()?;
            (now < until).then_some((c.machine.as_str(), until))
        })
        .collect();
    if let Some(until) = awaited.iter().map(|(_, until)| *until).max() {
        return Standing::Hold(Hold::Pending {
            machines: awaited
                .iter()
                .take(SHOWN)
                .map(|(m, _)| (*m).to_owned())
                .collect(),
            count: awaited.len(),
            until,
        });
    }
    match sorted.iter().all(|c| renewed(c)) {
        true => Standing::Renewed,
        false => Standing::WaitElapsed,
    }
}

impl Hold {
    /// When the hold may end on its own (a failed canary: never; its retries wake the others).
    pub fn until(&self) -> Option<Timestamp> {
        match self {
            Self::Failed { .. } => None,
            Self::Pending { until, .. } => Some(*until),
        }
    }
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed { machine, at } => write!(
                f,
                "the automatic renewal of canary Machine {machine} failed at {at} (the others wait until it succeeds: fix the cause and renew it, or wait for its retry)"
            ),
            Self::Pending {
                machines,
                count,
                until,
            } => {
                let more = count.saturating_sub(machines.len());
                let more = match more {
                    0 => String::new(),
                    n => format!(" and {n} more"),
                };
                write!(
                    f,
                    "the canaries renew first: {}{more} not yet renewed (waited for until {until} at the latest)",
                    machines.join(", ")
                )
            }
        }
    }
}

impl fmt::Display for Standing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoCanaries => f.write_str("No Machine of the policy is on a canary cluster"),
            Self::Renewed => {
                f.write_str("Every canary renewed under this generation of the policy")
            }
            Self::WaitElapsed => f.write_str(
                "Some canaries have not renewed under this generation of the policy, but maxWait has passed: the others renew",
            ),
            Self::Hold(hold) => write!(f, "The other Machines wait: {hold}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(hours: i64) -> Timestamp {
        Timestamp::UNIX_EPOCH + SignedDuration::from_hours(1_000_000 + hours)
    }

    fn canary(name: &str) -> CanaryMachine {
        CanaryMachine {
            machine: format!("ns/{name}"),
            due_at: None,
            failed_at: None,
            renewed_at: None,
        }
    }

    const WAIT: SignedDuration = SignedDuration::from_hours(24);

    #[test]
    fn the_others_wait_for_due_untried_and_failed_canaries_each_as_long_as_it_says() {
        let since = at(0);
        let renewed = |name, hours| CanaryMachine {
            renewed_at: Some(at(hours)),
            ..canary(name)
        };
        let due = |name, hours| CanaryMachine {
            due_at: Some(at(hours)),
            ..renewed(name, -100)
        };
        let failed = |name, hours| CanaryMachine {
            failed_at: Some(at(hours)),
            ..due(name, 0)
        };
        let pending = |names: &[&str], count, until| {
            Standing::Hold(Hold::Pending {
                machines: names.iter().map(|n| format!("ns/{n}")).collect(),
                count,
                until,
            })
        };
        let cases: Vec<(&str, Vec<CanaryMachine>, i64, Standing)> = vec![
            ("no canaries", vec![], 1, Standing::NoCanaries),
            (
                "all renewed under this generation, none due",
                vec![renewed("a", 1), renewed("b", 2)],
                3,
                Standing::Renewed,
            ),
            (
                "one not renewed since the generation: wait until since + maxWait",
                vec![renewed("a", 1), renewed("b", -5)],
                3,
                pending(&["b"], 1, at(24)),
            ),
            (
                "the wait for an untried canary ends",
                vec![renewed("a", 1), renewed("b", -5)],
                24,
                Standing::WaitElapsed,
            ),
            (
                "a due canary goes first in a later round, for maxWait after it became due",
                vec![renewed("a", 1), due("b", 500)],
                510,
                pending(&["b"], 1, at(524)),
            ),
            (
                "…and no longer",
                vec![renewed("a", 1), due("b", 500)],
                524,
                Standing::WaitElapsed,
            ),
            (
                "a canary not yet due holds nothing once renewed under the generation",
                vec![CanaryMachine {
                    due_at: Some(at(600)),
                    ..renewed("a", 1)
                }],
                510,
                Standing::Renewed,
            ),
            (
                "a failure under this generation holds, past maxWait",
                vec![renewed("a", 1), failed("b", 2)],
                1000,
                Standing::Hold(Hold::Failed {
                    machine: "ns/b".into(),
                    at: at(2),
                }),
            ),
            (
                "a failure before the generation does not: the change may be the fix",
                vec![renewed("a", 1), failed("b", -2)],
                3,
                pending(&["b"], 1, at(24)),
            ),
            (
                "the first failed canary by name is named",
                vec![failed("z", 3), failed("c", 5)],
                6,
                Standing::Hold(Hold::Failed {
                    machine: "ns/c".into(),
                    at: at(5),
                }),
            ),
            (
                "pending canaries are named in order, the latest until kept",
                vec![due("c", 10), canary("a"), renewed("b", 1)],
                12,
                pending(&["a", "c"], 2, at(34)),
            ),
        ];
        for (case, canaries, now, expected) in cases {
            assert_eq!(
                standing(&canaries, since, WAIT, at(now)),
                expected,
                "{case}"
            );
        }
    }

    #[test]
    fn a_hold_says_whom_it_waits_for_and_until_when() {
        let many: Vec<CanaryMachine> = (0..8).map(|i| canary(&format!("m{i}"))).collect();
        let Standing::Hold(hold) = standing(&many, at(0), WAIT, at(1)) else {
            panic!("held");
        };
        assert_eq!(hold.until(), Some(at(24)));
        assert_eq!(
            hold.to_string(),
            format!(
                "the canaries renew first: ns/m0, ns/m1, ns/m2, ns/m3, ns/m4 and 3 more not yet renewed (waited for until {} at the latest)",
                at(24)
            )
        );
        let failed = Hold::Failed {
            machine: "ns/m".into(),
            at: at(2),
        };
        assert_eq!(failed.until(), None);
        assert!(
            failed
                .to_string()
                .starts_with("the automatic renewal of canary Machine ns/m failed at")
        );
    }
}
