//! How many finished refresh records are kept: the audit trail of `--refresh-history`, pruned
//! the same way for a Machine's records and a fleet request's.

use jiff::Timestamp;

/// Of records `(name, created)`, those beyond the newest `keep`.
pub fn beyond(mut records: Vec<(String, Timestamp)>, keep: usize) -> Vec<String> {
    records.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
    records
        .into_iter()
        .skip(keep)
        .map(|(name, _)| name)
        .collect()
}
