//! Wall-clock time as the protocols carry it (`*_unix_ms` fields, records,
//! history): milliseconds since the Unix epoch. Durations and deadlines
//! use `Instant`; this is only for timestamps people and scripts read.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 for a time before it).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Now, in milliseconds since the Unix epoch.
pub fn now_unix_ms() -> u64 {
    unix_ms(SystemTime::now())
}
