//! Human output: aligned tables (kubectl's style: upper-case headers, two spaces between
//! columns), short durations, and colour only on a terminal (and never with `NO_COLOR`).

use std::io::Write;

use jiff::{SignedDuration, Timestamp};

/// A cell and how it should stand out on a terminal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cell {
    pub text: String,
    pub tone: Tone,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tone {
    Plain,
    Warning,
    Bad,
}

impl Cell {
    /// Text read from objects others may have written: control characters are shown escaped,
    /// never sent to the terminal.
    pub fn plain(text: impl Into<String>) -> Self {
        Self::with(text, Tone::Plain)
    }

    pub fn with(text: impl Into<String>, tone: Tone) -> Self {
        Self {
            text: crate::text::printable(&text.into()),
            tone,
        }
    }
}

/// Whether to colour standard output.
pub fn colour() -> bool {
    crate::cli::environment::colour()
}

/// Writes `rows` under `headers`, columns padded to their widest cell.
pub fn table(
    out: &mut impl Write,
    headers: &[&str],
    rows: &[Vec<Cell>],
    colour: bool,
) -> std::io::Result<()> {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.text.chars().count());
        }
    }
    let last = headers.len().saturating_sub(1);
    let line = |cells: Vec<(String, Tone)>| {
        let mut text = String::new();
        for (i, (cell, tone)) in cells.into_iter().enumerate() {
            let pad = if i == last {
                0
            } else {
                widths[i] - cell.chars().count() + 2
            };
            let painted = match (colour, tone) {
                (true, Tone::Warning) => format!("\x1b[33m{cell}\x1b[0m"),
                (true, Tone::Bad) => format!("\x1b[31m{cell}\x1b[0m"),
                _ => cell,
            };
            text.push_str(&painted);
            text.push_str(&" ".repeat(pad));
        }
        text
    };
    writeln!(
        out,
        "{}",
        line(
            headers
                .iter()
                .map(|h| (h.to_string(), Tone::Plain))
                .collect()
        )
    )?;
    for row in rows {
        writeln!(
            out,
            "{}",
            line(row.iter().map(|c| (c.text.clone(), c.tone)).collect())
        )?;
    }
    Ok(())
}

/// `89d 23h`, `5h 3m`, `42s`; `-` for nothing, `expired` for the past.
pub fn time_left(until: Timestamp, now: Timestamp) -> String {
    let left = until.duration_since(now);
    if left <= SignedDuration::ZERO {
        return "expired".into();
    }
    short(left)
}

/// The two largest units of a positive duration.
pub fn short(duration: SignedDuration) -> String {
    let seconds = duration.as_secs().max(0);
    let (days, hours, minutes) = (seconds / 86_400, seconds / 3_600 % 24, seconds / 60 % 60);
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{seconds}s"),
        (0, 0, m) => format!("{m}m"),
        (0, h, m) => format!("{h}h {m}m"),
        (d, h, _) => format!("{d}d {h}h"),
    }
}

/// Writes `rows` as JSON or YAML when asked, or `none` when there are none: whether that was
/// all there is to write (else the caller prints its table).
pub fn structured_or_none<T: serde::Serialize>(
    out: &mut impl Write,
    format: super::Format,
    rows: &[T],
    none: &str,
) -> Result<bool, super::PluginError> {
    if structured(out, format, &rows)? {
        return Ok(true);
    }
    if rows.is_empty() {
        writeln!(out, "{none}")?;
        return Ok(true);
    }
    Ok(false)
}

/// Writes `rows` as JSON or YAML and returns true; false for a table (the caller draws it).
pub fn structured<T: serde::Serialize>(
    out: &mut impl Write,
    format: super::Format,
    rows: &T,
) -> Result<bool, super::PluginError> {
    let failed = |e: String| super::PluginError::Failed(e);
    let text = match format {
        super::Format::Table => return Ok(false),
        super::Format::Json => {
            serde_json::to_string_pretty(rows).map_err(|e| failed(e.to_string()))? + "\n"
        }
        super::Format::Yaml => serde_yaml::to_string(rows).map_err(|e| failed(e.to_string()))?,
    };
    out.write_all(text.as_bytes())?;
    Ok(true)
}

/// RFC 3339 in UTC, seconds.
pub fn when(at: Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_colour_only_when_asked() {
        let rows = vec![
            vec![Cell::plain("a"), Cell::with("failed", Tone::Bad)],
            vec![Cell::plain("longer"), Cell::plain("ok")],
        ];
        let mut out = Vec::new();
        table(&mut out, &["NAME", "RESULT"], &rows, false).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "NAME    RESULT\na       failed\nlonger  ok\n"
        );
        let mut out = Vec::new();
        table(&mut out, &["NAME", "RESULT"], &rows, true).unwrap();
        assert!(
            String::from_utf8(out)
                .unwrap()
                .contains("\x1b[31mfailed\x1b[0m")
        );
    }

    #[test]
    fn durations_are_short() {
        let now = Timestamp::from_second(1_000_000).unwrap();
        let later = |s: i64| Timestamp::from_second(1_000_000 + s).unwrap();
        assert_eq!(time_left(later(-1), now), "expired");
        assert_eq!(time_left(later(0), now), "expired");
        assert_eq!(time_left(later(42), now), "42s");
        assert_eq!(time_left(later(5 * 3600 + 180), now), "5h 3m");
        assert_eq!(
            time_left(later(89 * 86_400 + 23 * 3600 + 59), now),
            "89d 23h"
        );
        assert_eq!(when(now), "1970-01-12T13:46:40Z");
    }
}
