//! Names derived from other names, valid for any valid input length. Kubernetes object names may
//! be 253 characters long, label values only 63, and Cluster API Machine names are often long
//! (cluster, deployment and two hashes). Cutting a name is not enough: the cut may end in `-` or
//! `.` (an invalid label value or name), and siblings that share the cut would share the
//! derived name. As Cluster API does for long label values, a long name becomes a readable
//! prefix and a hash of the whole name.

use sha2::{Digest, Sha256};

/// The longest label value.
pub const LABEL_VALUE_MAX: usize = 63;

/// Hex digits of the hash a long name ends with (40 bits: siblings never collide in practice).
const HASH_DIGITS: usize = 10;

/// `name` when it has at most `max` characters, else its first characters (without a trailing
/// `-` or `.`), `-`, and [`HASH_DIGITS`] hex digits of the whole name's SHA-256: at most `max`
/// characters, starting and ending with an alphanumeric character when `name` starts with one
/// (as valid object names do), and different for different names.
///
/// # Panics
/// Never for `max` above `HASH_DIGITS + 1`; the callers pass constants.
pub fn fit(name: &str, max: usize) -> String {
    if name.len() <= max {
        return name.to_owned();
    }
    let digest = Sha256::digest(name.as_bytes());
    let hash: String = digest
        .iter()
        .flat_map(|byte| [byte >> 4, byte & 0x0f])
        .take(HASH_DIGITS)
        .map(|nibble| char::from_digit(u32::from(nibble), 16).unwrap_or('0'))
        .collect();
    let room = max.saturating_sub(HASH_DIGITS + 1);
    // Object names are ASCII; cut on a character boundary all the same.
    let mut end = room.min(name.len());
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    let prefix = name[..end].trim_end_matches(['-', '.']);
    if prefix.is_empty() {
        hash
    } else {
        format!("{prefix}-{hash}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A label value: at most 63 characters, alphanumerics with `-`, `_`, `.` inside.
    fn is_label_value(value: &str) -> bool {
        let inner = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        value.len() <= 63
            && (value.is_empty()
                || (value.starts_with(|c: char| c.is_ascii_alphanumeric())
                    && value.ends_with(|c: char| c.is_ascii_alphanumeric())
                    && value.chars().all(inner)))
    }

    #[test]
    fn short_names_are_kept_as_they_are() {
        assert_eq!(fit("alpha-cp-0", 63), "alpha-cp-0");
        let exactly = "a".repeat(63);
        assert_eq!(fit(&exactly, 63), exactly);
    }

    #[test]
    fn a_long_name_cut_at_a_dash_or_dot_stays_a_valid_label_value() {
        // The 63rd character is `-` (the defect: the cut value was invalid, the create refused).
        let base = format!("{}-", "x".repeat(62));
        for name in [
            format!("{base}a1b2c3"),
            format!("{base}d4e5f6"),
            format!("{}.-{}", "y".repeat(50), "z".repeat(40)),
            "m".repeat(253),
        ] {
            let value = fit(&name, LABEL_VALUE_MAX);
            assert!(is_label_value(&value), "{name} -> {value}");
        }
    }

    #[test]
    fn siblings_sharing_a_long_prefix_get_different_values() {
        let base = format!("{}-", "x".repeat(62));
        let a = fit(&format!("{base}a1b2c3"), LABEL_VALUE_MAX);
        let b = fit(&format!("{base}d4e5f6"), LABEL_VALUE_MAX);
        assert_ne!(a, b);
        // Stable: the same name always gives the same value (records are selected by it).
        assert_eq!(a, fit(&format!("{base}a1b2c3"), LABEL_VALUE_MAX));
        assert!(a.starts_with("xxxxxxxx"), "{a}");
    }

    #[test]
    fn object_names_fit_their_limit() {
        let name = format!("{}-{}", "n".repeat(235), "tail");
        let fitted = fit(&name, 242);
        assert!(fitted.len() <= 242);
        assert_ne!(fitted, fit(&format!("{}-{}", "n".repeat(235), "liat"), 242));
    }
}
