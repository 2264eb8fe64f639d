//! Renewal policy: when may a renewal run. Pure: no I/O, time is an argument.
