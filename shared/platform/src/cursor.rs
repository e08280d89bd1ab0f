//! Keyset cursors of lists ordered by (time, id): where the next page starts, as the last
//! row's time (an integer, in the unit the list orders by) and id, `<time>.<id>`.

use crate::error::{ApiError, Code};

/// What such a cursor looks like, as the OpenAPI document's `pattern` of the lists that take
/// one says it: the empty value (the first page; see `api::pagination::given_cursor`) or
/// digits, a dot and an id. [`decode`] reads nothing else.
pub const PATTERN: &str = r"^([0-9]+\.[^\x00]+)?$";

/// The cursor after the row at `at` with id `id`.
pub fn encode(at: i64, id: &str) -> String {
    format!("{at}.{id}")
}

/// A cursor read back exactly as given (no sign, no white space around it), or 400
/// `invalid_cursor`.
pub fn decode(raw: &str) -> Result<(i64, String), ApiError> {
    let (at, id) = raw.split_once('.').ok_or_else(malformed)?;
    if at.is_empty() || !at.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(malformed());
    }
    let at = at.parse().map_err(|_| malformed())?;
    if id.is_empty() || !crate::storable::is_storable(id) {
        return Err(malformed());
    }
    Ok((at, id.to_owned()))
}

/// The refusal of a cursor no list returned.
pub fn malformed() -> ApiError {
    ApiError::of(Code::InvalidCursor, "cursor must be a nextCursor this list returned")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_and_a_forged_one_is_refused() {
        assert_eq!(
            decode(&encode(1_700_000_000_123, "imp_1.a")).expect("reads back"),
            (1_700_000_000_123, "imp_1.a".into())
        );
        for raw in ["", "12", "x.imp_1", "12.", "12.a\u{0}b", "+12.a", "-12.a", " 12.a", "99999999999999999999.a"] {
            assert_eq!(decode(raw).expect_err(raw).code(), Some(Code::InvalidCursor), "{raw:?}");
        }
    }
}
