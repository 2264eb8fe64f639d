//! Text as it is shown to people: bounded, whatever a node or a user sent.

/// `text` cut to at most `max` bytes, with an ellipsis when cut.
pub fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max.saturating_sub(1);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}
