//! The preview's output: text for people, JSON for scripts.

use std::fmt::Write as _;

use ck8s_certs_api::renewal_policy::conditions;

use super::Report;
use crate::policy::decision::WINDOWS_IGNORED_MESSAGE;

/// The report for people.
pub fn render_text(report: &Report) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = write_text(&mut out, report);
    out
}

pub(super) fn write_text(out: &mut String, report: &Report) -> std::fmt::Result {
    let policy = &report.policy;
    let name = match (&policy.namespace, &policy.name) {
        (Some(namespace), Some(name)) => format!("{namespace}/{name}"),
        (None, Some(name)) => name.clone(),
        _ => "<unnamed>".to_owned(),
    };
    writeln!(out, "Policy:        {name}")?;
    if let Some(selects) = &policy.selects {
        writeln!(out, "Selects:       {selects}")?;
    }
    if let Some(mode) = &policy.mode {
        writeln!(out, "Mode:          {mode}")?;
    }
    let decision = &report.decision;
    if let Some(renew_before) = &policy.renew_before {
        write!(out, "Renew before:  {renew_before}")?;
        match decision.due_at {
            Some(due_at) => writeln!(out, " (due at {due_at})")?,
            None => writeln!(out)?,
        }
    }
    if let Some(ttl) = &policy.ttl {
        writeln!(out, "TTL:           {ttl}")?;
    }
    if let Some(margin) = &policy.fail_safe_margin {
        write!(out, "Fail-safe:     {margin}")?;
        match decision.fail_safe_at {
            Some(at) => writeln!(out, " before expiry (from {at})")?,
            None => writeln!(out, " before expiry")?,
        }
    }
    if let Some(spread) = &policy.spread {
        write!(out, "Spread:        {spread}")?;
        match (spread.as_str(), &report.machine_uid) {
            ("0s", _) => writeln!(
                out,
                " (off: Machines allowed at the same instant start together)"
            )?,
            (_, Some(_)) => writeln!(out, " (the times below are this Machine's)")?,
            (_, None) => writeln!(
                out,
                " (each Machine starts at its own offset in it, from its UID; --machine-uid shows one Machine's times)"
            )?,
        }
    }
    writeln!(out, "Expiry:        {}", report.expiry)?;
    writeln!(out, "Now:           {}", report.now)?;
    if let Some(uid) = &report.machine_uid {
        writeln!(out, "Machine UID:   {uid}")?;
    }
    if let Some(failures) = &report.failures {
        let count = failures
            .count
            .map_or_else(|| "unknown".to_owned(), |count| count.to_string());
        match failures.last_failure_time {
            Some(last) => writeln!(out, "Failures:      {count}, last at {last}")?,
            None => writeln!(out, "Failures:      {count}")?,
        }
    }
    if report.strict {
        writeln!(out, "Strict:        yes (windows are never bypassed)")?;
    }
    writeln!(out)?;

    let headline = match (decision.action, decision.reason, decision.until) {
        ("RenewNow", Some(reason), _) => format!("Renew now ({reason})"),
        ("Defer", Some(reason), Some(until)) => format!("Defer until {until} ({reason})"),
        ("Defer", Some(reason), None) => format!("Defer indefinitely ({reason})"),
        ("Disabled", ..) => "Disabled".to_owned(),
        ("NoExpiry", ..) => "Nothing to do (expiry unknown)".to_owned(),
        ("Invalid", ..) => format!(
            "Invalid: no automatic renewal until the policy is fixed (condition {} is False)",
            conditions::VALID
        ),
        (action, ..) => action.to_owned(),
    };
    let warning = match decision.warning && decision.action != "Invalid" {
        true => " [Warning]",
        false => "",
    };
    writeln!(out, "Decision:      {headline}{warning}")?;
    match decision.errors.as_slice() {
        // The message, one problem per line.
        [_, _, ..] => {
            writeln!(out, "               Renewal policy is invalid:")?;
            for error in &decision.errors {
                writeln!(out, "               - {error}")?;
            }
        }
        _ => writeln!(out, "               {}", decision.message)?,
    }
    if decision.windows_ignored {
        writeln!(out, "               {WINDOWS_IGNORED_MESSAGE}")?;
    }
    if let Some(requeue_at) = decision.requeue_at {
        writeln!(out, "Next check:    {requeue_at}")?;
    }

    if !report.window_starts.is_empty() {
        writeln!(out)?;
        writeln!(out, "Next window starts after {}:", report.now)?;
        for start in &report.window_starts {
            let local = start.at.strftime("%a %Y-%m-%d %H:%M %Z").to_string();
            writeln!(
                out,
                "  windows[{}]  {local:<28} {:<20} {}",
                start.window, start.timezone, start.utc
            )?;
        }
    }
    Ok(())
}

/// The report for scripts.
pub fn render_json(report: &Report) -> String {
    // A struct of strings, numbers and timestamps always serialises.
    serde_json::to_string_pretty(report).unwrap_or_default() + "\n"
}
