//! Offset pagination exactly as the contract says: `limit` default 50 clamped to 1..200 with a
//! warning, negative `offset` clamped to 0 with a warning, `offset` above 10000 rejected.

use platform::error::Code;
use serde_json::{Value, json};

use platform::error::ApiError;

pub(crate) const DEFAULT_LIMIT: i64 = 50;
pub const MAX_LIMIT: i64 = 200;
pub(crate) const MAX_OFFSET: i64 = 10_000;

pub use platform::error::Warning;

/// Limit and offset as applied, with the warnings their clamping produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRequest {
    limit: i64,
    offset: i64,
    pub warnings: Vec<Warning>,
}

impl PageRequest {
    pub fn limit(&self) -> i64 {
        self.limit
    }

    pub fn offset(&self) -> i64 {
        self.offset
    }

    /// Caps the page at `rows` without a warning of its own (a list whose pages are smaller
    /// than `limit` allows); a clamping warning already given says what is applied.
    pub fn cap_silently(&mut self, rows: i64) {
        if self.limit > rows {
            self.limit = rows;
            for warning in &mut self.warnings {
                if warning.code == "limit_clamped" {
                    warning.message = format!(
                        "limit must be between 1 and {MAX_LIMIT}; used {rows}, the most rows a page of this list holds"
                    );
                }
            }
        }
    }

    /// Parses `limit` and `offset` from query pairs.
    pub fn parse(query: &[(String, String)]) -> Result<Self, ApiError> {
        Self::parse_with_cap(query, MAX_LIMIT)
    }

    pub(crate) fn parse_with_cap(query: &[(String, String)], max_limit: i64) -> Result<Self, ApiError> {
        let (limit, mut warnings) = parse_limit(query, max_limit)?;
        let offset = match crate::query::query_value(query, "offset") {
            None => 0,
            Some(raw) => {
                let requested = parse_integer("offset", raw)?;
                if requested > MAX_OFFSET {
                    return Err(ApiError::of(
                        Code::OffsetTooLarge,
                        format!("offset must be at most {MAX_OFFSET}; got {requested}"),
                    ));
                }
                if requested < 0 {
                    warnings.push(Warning {
                        code: "offset_clamped",
                        message: format!("offset must not be negative; used 0 instead of {requested}"),
                    });
                    0
                } else {
                    requested
                }
            }
        };
        Ok(Self { limit, offset, warnings })
    }

    /// The pagination object for a page of `returned` rows out of `total_count`.
    pub fn pagination(&self, returned: usize, total_count: i64) -> Value {
        let returned = i64::try_from(returned).unwrap_or(i64::MAX);
        let has_more = self.offset + returned < total_count && self.offset + self.limit < MAX_OFFSET;
        json!({ "limit": self.limit, "offset": self.offset, "totalCount": total_count, "hasMore": has_more })
    }
}

/// The `cursor` of a list paged by cursor, as given: `None` when there is none or it is empty.
/// An empty cursor asks for the first page (a client's loop that starts with an empty cursor,
/// `?cursor=`), on every such list alike; the OpenAPI document's cursor patterns admit it.
/// Anything else is the list's to read exactly as given: no white space is trimmed.
pub fn given_cursor(query: &[(String, String)]) -> Option<&str> {
    crate::query::query_value(query, "cursor").filter(|raw| !raw.is_empty())
}

/// What an opaque cursor looks like (the document's `pattern` of the lists that issue one):
/// the empty value (the first page) or URL-safe base64, without padding, of a JSON object,
/// whose text therefore starts `eyJ` (`{"`). [`opaque_cursor_bytes`] reads nothing else.
pub const OPAQUE_CURSOR_PATTERN: &str = "^(eyJ[A-Za-z0-9_-]*)?$";

/// The JSON bytes of an opaque cursor (see [`OPAQUE_CURSOR_PATTERN`]), or `None` when the
/// text is not of that form.
pub fn opaque_cursor_bytes(text: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    if !text.starts_with("eyJ") {
        return None;
    }
    base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(text).ok()
}

/// `limit` from query pairs: `DEFAULT_LIMIT` when absent, clamped to `1..=max_limit` with a
/// warning, 400 `invalid_query_parameter` when it is not an integer.
pub fn parse_limit(query: &[(String, String)], max_limit: i64) -> Result<(i64, Vec<Warning>), ApiError> {
    let mut warnings = Vec::new();
    let limit = match crate::query::query_value(query, "limit") {
        None => DEFAULT_LIMIT,
        Some(raw) => {
            let requested = parse_integer("limit", raw)?;
            let applied = requested.clamp(1, max_limit);
            if applied != requested {
                warnings.push(Warning {
                    code: "limit_clamped",
                    message: format!("limit must be between 1 and {max_limit}; used {applied}"),
                });
            }
            applied
        }
    };
    Ok((limit, warnings))
}

/// An integer query value. Any integer is one: a value beyond the 64-bit range saturates
/// (the contract clamps `limit` and a negative `offset`, and refuses a large `offset`, for any
/// integer), so only what is not an integer at all is 400.
fn parse_integer(name: &str, raw: &str) -> Result<i64, ApiError> {
    let text = raw.trim();
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(ApiError::of(
            Code::InvalidQueryParameter,
            format!("{name} must be an integer; got {:?}", platform::storable::escaped(raw)),
        ));
    }
    Ok(text.parse::<i64>().unwrap_or(if text.starts_with('-') { i64::MIN } else { i64::MAX }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn defaults_are_fifty_and_zero_without_warnings() {
        let page = PageRequest::parse(&[]).expect("defaults parse");
        assert_eq!((page.limit(), page.offset()), (50, 0));
        assert!(page.warnings.is_empty());
    }

    #[test]
    fn limits_outside_range_are_clamped_with_warning() {
        let high = PageRequest::parse(&query(&[("limit", "500")])).expect("parses");
        assert_eq!(high.limit(), 200);
        assert_eq!(high.warnings[0].code, "limit_clamped");
        let low = PageRequest::parse(&query(&[("limit", "0")])).expect("parses");
        assert_eq!(low.limit(), 1);
        assert_eq!(low.warnings.len(), 1);
    }

    #[test]
    fn negative_offset_is_clamped_and_large_offset_rejected() {
        let negative = PageRequest::parse(&query(&[("offset", "-5")])).expect("parses");
        assert_eq!(negative.offset(), 0);
        assert_eq!(negative.warnings[0].code, "offset_clamped");
        let at_max = PageRequest::parse(&query(&[("offset", "10000")])).expect("10000 is allowed");
        assert_eq!(at_max.offset(), 10_000);
        let error = PageRequest::parse(&query(&[("offset", "10001")])).expect_err("too large");
        assert_eq!(error.code(), Some(Code::OffsetTooLarge));
    }

    #[test]
    fn non_integer_values_are_rejected() {
        for raw in ["ten", "", "1.5", "1e3", "-", "0x10"] {
            let error = PageRequest::parse(&query(&[("limit", raw)])).expect_err("not an integer");
            assert_eq!(error.code(), Some(Code::InvalidQueryParameter), "{raw:?}");
        }
    }

    #[test]
    fn integers_beyond_64_bits_are_clamped_or_too_large_like_any_other() {
        let huge = PageRequest::parse(&query(&[("limit", "114365333545700542119936")])).expect("an integer");
        assert_eq!(huge.limit(), 200);
        let very_negative =
            PageRequest::parse(&query(&[("limit", "-1286621620809"), ("offset", "-179327428177846990203256832")]))
                .expect("integers");
        assert_eq!((very_negative.limit(), very_negative.offset()), (1, 0));
        let error = PageRequest::parse(&query(&[("offset", "362881000000000000000000")])).expect_err("too large");
        assert_eq!(error.code(), Some(Code::OffsetTooLarge));
        assert_eq!(PageRequest::parse(&query(&[("offset", "+7")])).expect("signed").offset(), 7);
    }

    #[test]
    fn an_empty_cursor_is_the_first_page_and_an_opaque_one_is_read_as_given() {
        assert_eq!(given_cursor(&query(&[("cursor", "")])), None);
        assert_eq!(given_cursor(&query(&[])), None);
        assert_eq!(given_cursor(&query(&[("cursor", " ")])), Some(" "), "white space is not trimmed");
        assert_eq!(opaque_cursor_bytes("eyJhIjoxfQ").as_deref(), Some(&br#"{"a":1}"#[..]));
        // White space around it, padding, another alphabet, or JSON that is not an object.
        for text in [" eyJhIjoxfQ", "eyJhIjoxfQ ", "eyJhIjoxfQ==", "eyJhIjoxfQ+/", "WzEsIngiXQ", "bnVsbA", "null", ""] {
            assert_eq!(opaque_cursor_bytes(text), None, "{text:?}");
        }
    }

    #[test]
    fn has_more_needs_more_rows_and_next_offset_below_cap() {
        let page = PageRequest::parse(&query(&[("limit", "10"), ("offset", "0")])).expect("parses");
        assert_eq!(page.pagination(10, 11)["hasMore"], true);
        assert_eq!(page.pagination(10, 10)["hasMore"], false);
        let deep = PageRequest::parse(&query(&[("limit", "10"), ("offset", "9990")])).expect("parses");
        assert_eq!(deep.pagination(10, 50_000)["hasMore"], false);
        let almost = PageRequest::parse(&query(&[("limit", "10"), ("offset", "9980")])).expect("parses");
        assert_eq!(almost.pagination(10, 50_000)["hasMore"], true);
    }
}
