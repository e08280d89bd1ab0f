//! Timestamps: RFC 3339 UTC with millisecond precision (decision D2). The clock is
//! `platform::time::now_millis`.

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};

pub fn format_timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

pub fn from_millis(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

pub fn format_millis(ms: i64) -> String {
    format_timestamp(from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_with_milliseconds_and_z() {
        assert_eq!(format_millis(1_795_276_181_123), "2026-11-21T15:49:41.123Z");
    }
}
