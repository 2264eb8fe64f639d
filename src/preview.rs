//! `ck8s-certs policy preview`: what a `CertificateRenewalPolicy` file would do, offline.
//!
//! ```text
//! file ──load──► Loaded { name, spec, problems } ──preview(loaded, scenario)──► Report ──► text | JSON
//!   │              problems: fields the CRD lacks,       │ policy::spec::validate
//!   │              values of the wrong form (serde)      │ policy::decide, requeue_at
//!   ▼                                                    │ upcoming window starts
//! not one policy, unreadable: PreviewError (exit 1)      ▼
//!                                                   invalid: exit 2, else 0
//! ```
//!
//! The decision and its messages come from [`crate::policy`], exactly as the controller computes
//! them; an invalid policy gets the message of the controller's `Valid` / `RenewalConfigInvalid`
//! conditions. The file is also checked for what the API server would refuse before the
//! controller ever saw it: fields the CRD does not know (kubectl's strict field validation) and
//! values of the wrong form, with their paths relative to `spec`, as in the controller's messages.
//!
//! [`run`] is the only part that touches the outside world (the file, the clock, stdout); the
//! rest is pure and tested with a fixed `now`.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;

use jiff::{Timestamp, Zoned};

use serde::Serialize;

use crate::cli::{OutputFormat, PreviewArgs};
use crate::policy::decision::DEFAULT_RENEW_BEFORE;
use crate::policy::spec::{Settings, ValidPolicy, validate};
use crate::policy::{
    Backoff, BackoffError, Decision, Failures, InvalidPolicy, PolicyError, Resume, Slot, Spread,
    WindowStart, decide, requeue_at,
};

/// Exit code of a policy the controller would report invalid.
pub const EXIT_INVALID_POLICY: u8 = 2;

/// Exit code of bad arguments or a file that cannot be read as a policy.
pub const EXIT_ERROR: u8 = 1;

/// Why there is nothing to preview (exit code [`EXIT_ERROR`]).
#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    #[error("reading {path} failed: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid YAML: {source}")]
    Yaml {
        path: PathBuf,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("{path} holds {count} {KIND} objects, preview needs exactly one (found: {found})")]
    PolicyCount {
        path: PathBuf,
        count: usize,
        found: String,
    },
    #[error("{0}")]
    Backoff(#[from] BackoffError),
}

/// The Machine-side facts and controller settings of a preview.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub expiry: Timestamp,
    pub now: Timestamp,
    pub failures: Failures,
    pub settings: Settings,
    pub window_starts: usize,
    /// The Machine's UID, for its place in the spread; `None`: no staggering.
    pub machine_uid: Option<String>,
}

/// Everything the preview prints, in text or as JSON (this is the JSON shape).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub policy: PolicySummary,
    pub now: Timestamp,
    pub expiry: Timestamp,
    pub strict: bool,
    /// `--machine-uid`: the times are that Machine's, at its place in the spread.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine_uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failures: Option<FailureSummary>,
    pub decision: DecisionSummary,
    /// The next window openings after `now`, whatever the decision (empty without windows).
    pub window_starts: Vec<StartSummary>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicySummary {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The rest is absent when the policy is invalid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selects: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fail_safe_margin: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spread: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub windows: Option<usize>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FailureSummary {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_failure_time: Option<Timestamp>,
}

/// The decision, flattened for scripts.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DecisionSummary {
    /// `RenewNow`, `Defer`, `Disabled`, `NoExpiry` or `Invalid`.
    pub action: &'static str,
    /// `RenewNow`: `Due` or `FailSafeBypass`; `Defer`: `NotDue`, `Backoff`, `OutsideWindow` or
    /// `Staggered`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// `Defer`: the earliest instant a renewal will start if nothing changes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<Timestamp>,
    /// `Defer`: what lets it start then: `Due`, `BackoffEnds`, `WindowOpens`,
    /// `FailSafeBypass` or `Never`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume: Option<&'static str>,
    /// The window (index in `spec.windows`) that contains now, or that opens at `until`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub due_at: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fail_safe_at: Option<Timestamp>,
    /// Expiry is within the fail-safe margin and nothing is renewing: the controller warns.
    pub warning: bool,
    /// `Automatic` with windows: they do not apply.
    pub windows_ignored: bool,
    /// When the controller would look again if nothing changes (`None`: only a change to the
    /// objects brings it back).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requeue_at: Option<Timestamp>,
    /// The condition message the controller would write.
    pub message: String,
    /// `Invalid`: each problem with its field path.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// `Defer` with `--machine-uid`, when the spread moves the start past `unstaggered`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<SlotSummary>,
}

/// The Machine's place in the spread.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlotSummary {
    /// When the Machine's turn comes (`until` is earlier only when the fail-safe point is).
    pub at: Timestamp,
    /// The instant the offset counts from: the due time, or the window's opening if later.
    pub anchor: Timestamp,
    /// `at − anchor`, such as `7m13s`.
    pub offset: String,
    /// The span the offset was taken from: the spread, or what the window leaves of it.
    pub span: String,
    /// The window (index in `spec.windows`) the slot lies in, under `Scheduled`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
    /// When the renewal would start without the spread.
    pub unstaggered: Timestamp,
}

/// One window opening.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StartSummary {
    /// Index in `spec.windows`.
    pub window: usize,
    /// The window's zone (`UTC` when it has none).
    pub timezone: String,
    /// Wall-clock time in that zone, RFC 9557 (offset and zone).
    pub local: String,
    pub utc: Timestamp,
    #[serde(skip)]
    pub at: Zoned,
}

impl Report {
    pub fn is_invalid(&self) -> bool {
        self.decision.action == "Invalid"
    }

    /// The process exit code: [`EXIT_INVALID_POLICY`] for an invalid policy, else 0.
    pub fn exit_code(&self) -> u8 {
        match self.is_invalid() {
            true => EXIT_INVALID_POLICY,
            false => 0,
        }
    }
}

/// Decides for the loaded policy, as the controller would.
pub fn preview(loaded: &Loaded, scenario: &Scenario) -> Report {
    let problems = &loaded.problems;
    let (decision, policy) = match loaded.spec.as_ref().map(validate) {
        Some(Ok(policy)) if problems.is_empty() => {
            let input = policy
                .input(Some(scenario.expiry), scenario.failures, scenario.settings)
                .with_stagger_key(scenario.machine_uid.as_deref());
            (summarize(&decide(&input, scenario.now)), Some(policy))
        }
        Some(Ok(_)) | None => (invalid(problems, Vec::new()), None),
        Some(Err(invalid_policy)) => (invalid(problems, invalid_policy.errors), None),
    };
    let failures = &scenario.failures;
    Report {
        policy: policy_summary(loaded, policy.as_ref()),
        now: scenario.now,
        expiry: scenario.expiry,
        strict: scenario.settings.strict,
        machine_uid: scenario.machine_uid.clone(),
        failures: (failures.count.is_some() || failures.last_failure.is_some()).then_some(
            FailureSummary {
                count: failures.count,
                last_failure_time: failures.last_failure,
            },
        ),
        decision,
        window_starts: policy
            .map(|policy| {
                policy
                    .upcoming_starts(scenario.now, scenario.window_starts)
                    .iter()
                    .map(start_summary)
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// The invalid decision. Problems found while reading the file come first, then validation's;
/// without the former, the message is exactly the controller's.
fn invalid(problems: &[String], errors: Vec<PolicyError>) -> DecisionSummary {
    let mut all = problems.to_vec();
    all.extend(errors.iter().map(ToString::to_string));
    let message = match problems.is_empty() {
        true => InvalidPolicy { errors }.to_string(),
        false => format!("Renewal policy is invalid: {}", all.join("; ")),
    };
    DecisionSummary {
        action: "Invalid",
        reason: None,
        until: None,
        resume: None,
        window: None,
        due_at: None,
        fail_safe_at: None,
        warning: true,
        windows_ignored: false,
        requeue_at: None,
        message,
        errors: all,
        slot: None,
    }
}

fn summarize(decision: &Decision) -> DecisionSummary {
    let mut summary = DecisionSummary {
        action: "",
        reason: None,
        until: None,
        resume: None,
        window: None,
        due_at: None,
        fail_safe_at: None,
        warning: decision.is_warning(),
        windows_ignored: decision.windows_ignored(),
        requeue_at: requeue_at(decision),
        message: decision.to_string(),
        errors: Vec::new(),
        slot: None,
    };
    match decision {
        Decision::NoExpiry { .. } => summary.action = "NoExpiry",
        Decision::RenewNow(renewal) => {
            summary.action = "RenewNow";
            summary.reason = Some(renewal.reason.as_str());
            summary.window = renewal.window;
            summary.due_at = Some(renewal.due_at);
            summary.fail_safe_at = Some(renewal.fail_safe_at);
        }
        Decision::Defer(deferral) => {
            summary.action = "Defer";
            summary.reason = Some(deferral.reason.as_str());
            summary.resume = Some(match &deferral.resume {
                Resume::Due => "Due",
                Resume::BackoffEnds => "BackoffEnds",
                Resume::WindowOpens(start) => {
                    summary.window = Some(start.index);
                    "WindowOpens"
                }
                Resume::FailSafeBypass => "FailSafeBypass",
                Resume::Never => "Never",
            });
            summary.until = (deferral.resume != Resume::Never).then_some(deferral.until);
            summary.slot = deferral.slot.as_deref().map(slot_summary);
            summary.due_at = Some(deferral.due_at);
            summary.fail_safe_at = Some(deferral.fail_safe_at);
        }
        Decision::Disabled { fail_safe_at, .. } => {
            summary.action = "Disabled";
            summary.fail_safe_at = *fail_safe_at;
        }
        Decision::Invalid { errors } => {
            summary.action = "Invalid";
            summary.errors = errors.iter().map(ToString::to_string).collect();
        }
    }
    summary
}

fn slot_summary(slot: &Slot) -> SlotSummary {
    let text = |duration: jiff::SignedDuration| match Spread::from_seconds(duration.as_secs()) {
        Ok(spread) => spread.to_string(),
        Err(_) => format!("{}s", duration.as_secs()),
    };
    SlotSummary {
        at: slot.at,
        anchor: slot.anchor,
        offset: text(slot.offset),
        span: text(slot.span),
        window: slot.window.as_ref().map(|window| window.index),
        unstaggered: slot.unstaggered,
    }
}

fn policy_summary(loaded: &Loaded, policy: Option<&ValidPolicy>) -> PolicySummary {
    PolicySummary {
        namespace: loaded.namespace.clone(),
        name: loaded.name.clone(),
        selects: policy.map(|policy| policy.selector.to_string()),
        mode: policy.map(|policy| policy.mode.to_string()),
        renew_before: policy.map(renew_before),
        ttl: policy.map(|policy| policy.ttl.to_string()),
        fail_safe_margin: policy.map(|policy| policy.fail_safe_margin.to_string()),
        spread: policy.map(|policy| policy.spread.to_string()),
        windows: policy.map(|policy| policy.windows.len()),
    }
}

/// `renewBefore` (or its default), or the percentage and what stands for the lifetime: the
/// preview knows only the expiry, so the policy's `ttl` does (as for certificates no recorded
/// refresh issued).
fn renew_before(policy: &ValidPolicy) -> String {
    match (policy.renew_before, policy.renew_before_percentage) {
        (None, Some(percentage)) => format!(
            "{percentage}% of the certificates' lifetime (taken as ttl, {})",
            policy.ttl
        ),
        (renew_before, _) => renew_before.unwrap_or(DEFAULT_RENEW_BEFORE).to_string(),
    }
}

fn start_summary(start: &WindowStart) -> StartSummary {
    StartSummary {
        window: start.index,
        timezone: start.at.time_zone().iana_name().unwrap_or("UTC").to_owned(),
        local: start.at.to_string(),
        utc: start.timestamp(),
        at: start.at.clone(),
    }
}

/// Runs the subcommand: reads the file, previews at `--now` (default: the clock), prints.
pub fn run(args: &PreviewArgs) -> ExitCode {
    // Whole seconds, like the instants the controller stores.
    let now = Timestamp::now();
    let now = now.round(jiff::Unit::Second).unwrap_or(now);
    match execute(args, now) {
        Ok((output, code)) => {
            print!("{output}");
            ExitCode::from(code)
        }
        Err(error) => {
            eprintln!("Error: {error}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Everything [`run`] does but printing: the output and the exit code.
pub fn execute(args: &PreviewArgs, clock: Timestamp) -> Result<(String, u8), PreviewError> {
    let read_error = |source| PreviewError::Read {
        path: args.file.clone(),
        source,
    };
    let text = if args.file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(read_error)?;
        text
    } else {
        std::fs::read_to_string(&args.file).map_err(read_error)?
    };
    let loaded = load(&args.file, &text)?;
    let scenario = Scenario {
        expiry: args.expiry,
        now: args.now.unwrap_or(clock),
        failures: Failures {
            count: args.failures,
            last_failure: args.last_failure,
        },
        settings: Settings {
            strict: args.strict,
            backoff: Backoff::new(args.backoff_min, args.backoff_max)?,
        },
        window_starts: args.window_starts.into(),
        machine_uid: args.machine_uid.clone(),
    };
    let report = preview(&loaded, &scenario);
    let output = match args.output {
        OutputFormat::Text => render_text(&report),
        OutputFormat::Json => render_json(&report),
    };
    Ok((output, report.exit_code()))
}

mod load;
mod render;

use load::KIND;
pub use load::{Loaded, load};
pub use render::{render_json, render_text};

#[cfg(test)]
mod tests;
