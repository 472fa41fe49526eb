//! Timestamp encoding: RFC 3339, UTC, always nine fractional digits.
//!
//! Fixed width means text order equals time order (for years 0000..=9999) and every
//! `DateTime<Utc>` round-trips exactly, nanoseconds included.

use chrono::{DateTime, SecondsFormat, Utc};

use crate::error::{Result, StoreError};

pub(crate) fn fmt(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Nanos, true)
}

pub(crate) fn parse(s: &str) -> Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| StoreError::Corrupt(format!("bad timestamp {s:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn round_trips_exactly_and_sorts() {
        let a = Utc
            .timestamp_opt(1_700_000_000, 5)
            .single()
            .unwrap_or_default();
        let b = Utc
            .timestamp_opt(1_700_000_000, 100_000_000)
            .single()
            .unwrap_or_default();
        assert_eq!(fmt(a), "2023-11-14T22:13:20.000000005Z");
        assert_eq!(parse(&fmt(a)).ok(), Some(a));
        assert_eq!(parse(&fmt(b)).ok(), Some(b));
        assert!(fmt(a) < fmt(b));
        let now = Utc::now();
        assert_eq!(parse(&fmt(now)).ok(), Some(now));
        assert!(parse("yesterday").is_err());
    }
}
