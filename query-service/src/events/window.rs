//! The window of an events list request: `from`, `to`, `limit` and the cursor. A cursor
//! carries the resolved schema, window and limit it was issued for; a request that follows it
//! with other values gets 400 `invalid_cursor`, and omitted values are taken from the cursor
//! (so a defaulted `to` does not move while paging). Pure: the time comes in as an argument.
//! The window resolves before the schema is known (the page is read in the same statement
//! that resolves it); [`Window::follows`] then holds a cursor to its schema.

use api::http::query_value;
use api::pagination::{Warning, parse_limit};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Duration, SecondsFormat, Utc};
use platform::error::{ApiError, Code};
use serde::{Deserialize, Serialize};

/// The events list's page size cap.
pub const MAX_LIMIT: i64 = 200;
/// The window when `from` is omitted: the 7 days before `to`.
pub(crate) const DEFAULT_WINDOW_DAYS: i64 = 7;
/// Longer windows are clamped to this, with a warning.
pub(crate) const MAX_WINDOW_DAYS: i64 = 90;

/// The years 1 to 9999 in microseconds: what RFC 3339 can write (and PostgreSQL can hold).
const MIN_MICROS: i64 = -62_135_596_800_000_000;
const MAX_MICROS: i64 = 253_402_300_799_999_999;

/// What a cursor remembers: where the next page starts, and the resolved request it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Cursor {
    /// `occurredAt` (microseconds) and id of the last event returned.
    #[serde(rename = "a")]
    pub after_at: i64,
    #[serde(rename = "i")]
    pub after_id: String,
    #[serde(rename = "s")]
    pub schema_id: String,
    #[serde(rename = "f")]
    pub from: i64,
    #[serde(rename = "t")]
    pub to: i64,
    #[serde(rename = "l")]
    pub limit: i64,
}

impl Cursor {
    pub(crate) fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).unwrap_or_default())
    }

    pub(crate) fn decode(text: &str) -> Result<Self, ApiError> {
        let malformed = || ApiError::of(Code::InvalidCursor, "cursor is malformed; pass nextCursor as given");
        let bytes = api::pagination::opaque_cursor_bytes(text).ok_or_else(malformed)?;
        let cursor: Self = serde_json::from_slice(&bytes).map_err(|_| malformed())?;
        // A cursor is the caller's input too: what it holds must be storable and in range.
        let in_range = |micros: i64| (MIN_MICROS..=MAX_MICROS).contains(&micros);
        let sound = platform::storable::is_storable(&cursor.after_id)
            && platform::storable::is_storable(&cursor.schema_id)
            && [cursor.after_at, cursor.from, cursor.to].into_iter().all(in_range);
        if sound { Ok(cursor) } else { Err(malformed()) }
    }
}

/// The resolved window and page size of a list request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Window {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub limit: i64,
    pub after: Option<(DateTime<Utc>, String)>,
    /// The schema a followed cursor was issued for.
    pub cursor_schema: Option<String>,
    pub warnings: Vec<Warning>,
}

impl Window {
    /// Whether this window may list `schema_id`: a cursor only pages the schema it was issued for.
    pub(crate) fn follows(&self, schema_id: &str) -> Result<(), ApiError> {
        match &self.cursor_schema {
            Some(issued_for) if issued_for != schema_id => Err(other_request("schema")),
            _ => Ok(()),
        }
    }
}

fn other_request(what: &str) -> ApiError {
    ApiError::of(
        Code::InvalidCursor,
        format!("this cursor was issued for another {what}; keep schema, from, to and limit fixed while paging"),
    )
}

fn parse_time(name: &str, raw: &str) -> Result<DateTime<Utc>, ApiError> {
    DateTime::parse_from_rfc3339(raw.trim())
        .map(|at| at.with_timezone(&Utc))
        .map_err(|_| ApiError::of(Code::InvalidTimeRange, format!("{name} must be an RFC 3339 date-time; got {raw:?}")))
}

pub(crate) fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

fn from_micros(value: i64) -> Result<DateTime<Utc>, ApiError> {
    DateTime::from_timestamp_micros(value)
        .ok_or_else(|| ApiError::of(Code::InvalidCursor, "cursor is malformed; pass nextCursor as given"))
}

/// Resolves `from`, `to`, `limit` and `cursor` of a list request at `now`.
pub(crate) fn resolve_window(query: &[(String, String)], now: DateTime<Utc>) -> Result<Window, ApiError> {
    let (limit, mut warnings) = parse_limit(query, MAX_LIMIT)?;
    let explicit_limit = query_value(query, "limit").is_some();
    let from = query_value(query, "from").map(|raw| parse_time("from", raw)).transpose()?;
    let to = query_value(query, "to").map(|raw| parse_time("to", raw)).transpose()?;
    let cursor = api::pagination::given_cursor(query).map(Cursor::decode).transpose()?;
    if let Some(cursor) = cursor {
        if from.is_some_and(|from| micros(from) != cursor.from) {
            return Err(other_request("from"));
        }
        if to.is_some_and(|to| micros(to) != cursor.to) {
            return Err(other_request("to"));
        }
        if explicit_limit && limit != cursor.limit {
            return Err(other_request("limit"));
        }
        return Ok(Window {
            from: from_micros(cursor.from)?,
            to: from_micros(cursor.to)?,
            limit: cursor.limit.clamp(1, MAX_LIMIT),
            after: Some((from_micros(cursor.after_at)?, cursor.after_id)),
            cursor_schema: Some(cursor.schema_id),
            warnings,
        });
    }
    let to = to.unwrap_or(now);
    let mut from = from.unwrap_or(to - Duration::days(DEFAULT_WINDOW_DAYS));
    if from >= to {
        return Err(ApiError::of(Code::InvalidTimeRange, "from must be earlier than to"));
    }
    if to - from > Duration::days(MAX_WINDOW_DAYS) {
        from = to - Duration::days(MAX_WINDOW_DAYS);
        warnings.push(Warning {
            code: "time_range_clamped",
            message: format!(
                "the window is limited to {MAX_WINDOW_DAYS} days; from was moved to {}",
                from.to_rfc3339_opts(SecondsFormat::Millis, true)
            ),
        });
    }
    Ok(Window { from, to, limit, after: None, cursor_schema: None, warnings })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn now() -> DateTime<Utc> {
        parse_time("now", "2026-11-21T12:00:00Z").expect("time")
    }

    #[test]
    fn the_default_window_is_the_seven_days_before_to() {
        let window = resolve_window(&query(&[]), now()).expect("resolves");
        assert_eq!(window.to, now());
        assert_eq!(window.from, now() - Duration::days(7));
        assert_eq!(window.limit, 50);
        assert!(window.warnings.is_empty());
        let to = "2026-10-01T00:00:00Z";
        let window = resolve_window(&query(&[("to", to)]), now()).expect("resolves");
        assert_eq!(window.from, parse_time("to", to).expect("t") - Duration::days(7));
    }

    #[test]
    fn windows_over_ninety_days_are_clamped_with_a_warning() {
        let window = resolve_window(&query(&[("from", "2025-01-01T00:00:00Z")]), now()).expect("resolves");
        assert_eq!(window.from, now() - Duration::days(90));
        assert_eq!(window.warnings[0].code, "time_range_clamped");
    }

    #[test]
    fn bad_times_are_invalid_time_range() {
        for pairs in [
            vec![("from", "yesterday")],
            vec![("to", "2026-13-01T00:00:00Z")],
            vec![("from", "2026-11-21T12:00:00Z"), ("to", "2026-11-21T12:00:00Z")],
            vec![("from", "2026-11-22T00:00:00Z"), ("to", "2026-11-21T00:00:00Z")],
        ] {
            let error = resolve_window(&query(&pairs), now()).expect_err("invalid");
            assert_eq!(error.code(), Some(Code::InvalidTimeRange), "{pairs:?}");
        }
    }

    #[test]
    fn limits_are_capped_at_two_hundred() {
        let window = resolve_window(&query(&[("limit", "1000")]), now()).expect("resolves");
        assert_eq!(window.limit, 200);
        assert_eq!(window.warnings[0].code, "limit_clamped");
    }

    /// A cursor for schema `sch_1`, the last 7 days and limit 10.
    fn sound_cursor() -> Cursor {
        Cursor {
            after_at: micros(now()),
            after_id: "ev_9".into(),
            schema_id: "sch_1".into(),
            from: micros(now() - Duration::days(7)),
            to: micros(now()),
            limit: 10,
        }
    }

    #[test]
    fn cursors_round_trip_and_keep_the_request_fixed() {
        let cursor = sound_cursor();
        let text = cursor.encode();
        assert_eq!(Cursor::decode(&text).expect("decodes"), cursor);
        // Omitted values come from the cursor, even when `now` has moved on.
        let later = now() + Duration::minutes(5);
        let window = resolve_window(&query(&[("cursor", &text)]), later).expect("follows");
        assert_eq!((window.to, window.limit), (now(), 10));
        assert_eq!(window.after, Some((now(), "ev_9".to_owned())));
        // Repeating the same values is fine; other values are not.
        assert!(resolve_window(&query(&[("cursor", &text), ("limit", "10")]), later).is_ok());
        for pairs in
            [vec![("limit", "20")], vec![("to", "2026-11-20T00:00:00Z")], vec![("from", "2026-11-01T00:00:00Z")]]
        {
            let mut all = pairs.clone();
            all.push(("cursor", &text));
            let error = resolve_window(&query(&all), later).expect_err("other values");
            assert_eq!(error.code(), Some(Code::InvalidCursor));
        }
        let window = resolve_window(&query(&[("cursor", &text)]), later).expect("follows");
        assert!(window.follows("sch_1").is_ok());
        let error = window.follows("sch_2").expect_err("other schema");
        assert_eq!(error.code(), Some(Code::InvalidCursor));
    }

    #[test]
    fn malformed_cursors_are_invalid_cursor() {
        for text in ["%%%", "bm90IGpzb24", "e30"] {
            let error = resolve_window(&query(&[("cursor", text)]), now()).expect_err("malformed");
            assert_eq!(error.code(), Some(Code::InvalidCursor), "{text}");
        }
        // Well-formed JSON holding what the store cannot hold, or times out of range.
        let sound = sound_cursor();
        for crafted in [
            Cursor { after_id: "ev_\u{0}".into(), ..sound.clone() },
            Cursor { after_at: i64::MIN, ..sound.clone() },
            Cursor { to: MAX_MICROS + 1, ..sound.clone() },
        ] {
            let error = resolve_window(&query(&[("cursor", &crafted.encode())]), now()).expect_err("crafted");
            assert_eq!(error.code(), Some(Code::InvalidCursor), "{crafted:?}");
        }
    }
}
