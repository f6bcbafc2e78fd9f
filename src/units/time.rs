//! Points in time as an operator writes them, and the wall clock: the journal stamps each
//! entry with the milliseconds since the Unix epoch when walrus journaled it, and
//! `--until TIME` names one as RFC 3339 (`2026-12-03T21:18:45Z`, with a fraction of a
//! second and an offset if wanted: `2026-12-03T22:18:45.250+01:00`), the form walrus's own
//! log and output use.

use chrono::{DateTime, SecondsFormat, Utc};

use super::UnitsError;

/// The wall clock now, in milliseconds since the Unix epoch (0 before it: a clock that far
/// off stamps nothing meaningful anyway).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The wall clock now, in whole seconds since the Unix epoch (as [`now_ms`]).
pub fn now_secs() -> i64 {
    (now_ms() / 1000) as i64
}

/// Parses an RFC 3339 time into milliseconds since the Unix epoch; a fraction finer than a
/// millisecond is cut (the journal's stamps are whole milliseconds).
pub fn parse_time(text: &str) -> Result<u64, UnitsError> {
    let t = DateTime::parse_from_rfc3339(text.trim()).map_err(|e| UnitsError::Time {
        text: text.to_string(),
        reason: e.to_string(),
    })?;
    u64::try_from(t.timestamp_millis()).map_err(|_| UnitsError::BeforeEpoch {
        text: text.to_string(),
    })
}

/// `ms` since the Unix epoch as RFC 3339 in UTC, to the millisecond.
pub fn format_time(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(DateTime::<Utc>::from_timestamp_millis)
        .map_or_else(
            || format!("{ms} ms after the Unix epoch"),
            |t| t.to_rfc3339_opts(SecondsFormat::Millis, true),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_read_and_written_as_rfc_3339() {
        let ms = 1_796_332_725_250;
        assert_eq!(format_time(ms), "2026-12-03T21:18:45.250Z");
        for text in [
            "2026-12-03T21:18:45.250Z",
            "2026-12-03T22:18:45.250+01:00",
            "2026-12-03t21:18:45.250z",
            " 2026-12-03T21:18:45.250999Z ",
        ] {
            assert_eq!(parse_time(text), Ok(ms), "{text}");
        }
        assert_eq!(parse_time(&format_time(ms)), Ok(ms));
        for bad in [
            "2026-12-03T21:18:45",
            "yesterday",
            "",
            "1969-12-31T23:59:59Z",
        ] {
            let e = parse_time(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }
}
