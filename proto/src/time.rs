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

/// Days since 1970-01-01 of a proleptic Gregorian date (the civil-calendar
/// arithmetic of eras of 400 years, 146097 days each).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day counted from 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A timestamp in RFC 3339, UTC, to the millisecond:
/// `2026-12-05T15:25:03.042Z`. The form of the records people read (the
/// audit trail), sortable as text.
pub fn rfc3339(unix_ms: u64) -> String {
    let secs = (unix_ms / 1000) as i64;
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    let of_day = secs.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60,
        unix_ms % 1000
    )
}

/// Read an RFC 3339 timestamp (`2026-12-05T15:25:03Z`, with optional
/// fraction and a `Z` or `+hh:mm`/`-hh:mm` offset; `t` and `z` too) as
/// Unix milliseconds. None for anything else, or a time before 1970.
pub fn parse_rfc3339(text: &str) -> Option<u64> {
    let text = text.trim();
    let (date, rest) = text.split_once(['T', 't', ' '])?;
    let mut parts = date.splitn(3, '-');
    let year: i64 = digits(parts.next()?, 4)?;
    let month: u32 = digits(parts.next()?, 2)?;
    let day: u32 = digits(parts.next()?, 2)?;
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    // The offset starts at the first `Z`, `+` or `-` after the time.
    let split = rest.find(['Z', 'z', '+', '-'])?;
    let (time, offset) = rest.split_at(split);
    let (hms, fraction) = match time.split_once('.') {
        Some((hms, fraction)) => (hms, Some(fraction)),
        None => (time, None),
    };
    let mut hms = hms.splitn(3, ':');
    let hour: i64 = digits(hms.next()?, 2)?;
    let minute: i64 = digits(hms.next()?, 2)?;
    let second: i64 = digits(hms.next()?, 2)?;
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let millis: i64 = match fraction {
        None => 0,
        Some(f) if !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()) => {
            let padded: String = f.chars().chain("000".chars()).take(3).collect();
            padded.parse().ok()?
        }
        Some(_) => return None,
    };
    let offset_secs: i64 = match offset {
        "Z" | "z" => 0,
        _ => {
            let sign = if offset.starts_with('-') { -1 } else { 1 };
            let (h, m) = offset.get(1..)?.split_once(':')?;
            sign * (digits::<i64>(h, 2)? * 3600 + digits::<i64>(m, 2)? * 60)
        }
    };
    let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second
        - offset_secs;
    u64::try_from(secs * 1000 + millis).ok()
}

/// A field of exactly `len` ASCII digits.
fn digits<T: std::str::FromStr>(text: &str, len: usize) -> Option<T> {
    if text.len() != len || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_and_reads_offsets() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        let ms = 1_796_484_303_042; // 2026-12-05T15:25:03.042Z
        assert_eq!(rfc3339(ms), "2026-12-05T15:25:03.042Z");
        assert_eq!(parse_rfc3339(&rfc3339(ms)), Some(ms));
        assert_eq!(parse_rfc3339("2026-12-05T15:25:03Z"), Some(ms - 42));
        assert_eq!(parse_rfc3339("2026-12-05T16:25:03.042+01:00"), Some(ms));
        assert_eq!(parse_rfc3339("2026-12-05T10:25:03.042-05:00"), Some(ms));
        assert_eq!(
            parse_rfc3339("2024-02-29T00:00:00Z"),
            Some(1_709_164_800_000)
        );
        for bad in [
            "",
            "yesterday",
            "2026-12-05",
            "2026-13-05T00:00:00Z",
            "2026-12-05T25:00:00Z",
            "2026-12-05T15:25:03",
            "2026-12-05T15:25:03.Z",
            "1969-12-31T23:59:59Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }
}
