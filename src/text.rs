//! Text as it is shown to people: bounded, whatever a node or a user sent.

/// `text` cut to at most `max` bytes, with an ellipsis when cut.
pub fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        // Room for the ellipsis, three bytes in UTF-8.
        let mut end = max.saturating_sub('…'.len_utf8());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// `text` made safe to keep in a status, condition or Event and to show: control characters
/// (terminal escapes, NULs, line breaks) become spaces, and at most `max` characters are kept.
/// For text that others wrote: a node's k8sd errors, a workload API server's answers.
pub fn bounded(text: &str, max: usize) -> String {
    let mut out: String = text
        .chars()
        .take(max)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().nth(max).is_some() {
        out.pop();
        out.push('…');
    }
    out
}

/// `text` as a terminal shows it harmlessly: control characters escaped (`\u{1b}`), the rest
/// as it is. For what the plugin prints from objects others may have written.
pub fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| match c.is_control() {
            true => c.escape_default().to_string(),
            false => c.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_others_is_bounded_and_printable() {
        let hostile = "run failed\u{1b}[2J\u{1b}]0;owned\u{7}\r\nnext\0";
        let kept = bounded(hostile, 1000);
        assert!(!kept.chars().any(char::is_control), "{kept:?}");
        assert!(kept.starts_with("run failed") && kept.contains("next"));
        assert_eq!(bounded(&"x".repeat(5000), 10).chars().count(), 10);
        assert!(bounded(&"x".repeat(5000), 10).ends_with('…'));
        assert_eq!(bounded("short", 10), "short");
        assert_eq!(bounded("exactly10!", 10), "exactly10!");
        let shown = printable(hostile);
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert!(shown.contains("\\u{1b}[2J"), "{shown}");
        assert_eq!(printable("plain text"), "plain text");
    }
}
