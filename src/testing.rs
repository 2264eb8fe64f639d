//! Assertions the unit tests share.

/// Asserts that `text` starts with `start`, showing all of `text` if not.
#[track_caller]
pub fn assert_starts_with(text: &str, start: &str) {
    assert!(
        text.starts_with(start),
        "{text:?} does not start with {start:?}"
    );
}

/// Asserts that `text` holds `part`, showing all of `text` if not.
#[track_caller]
pub fn assert_contains(text: &str, part: &str) {
    assert!(text.contains(part), "{text:?} does not contain {part:?}");
}

/// Asserts that `text` ends with `end`, showing all of `text` if not.
#[track_caller]
pub fn assert_ends_with(text: &str, end: &str) {
    assert!(text.ends_with(end), "{text:?} does not end with {end:?}");
}
