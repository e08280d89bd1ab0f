//! The intake's decisions on a request: its import id, a part's number and media type, and a
//! completion's body; and why the intake refuses a write. The rows themselves are decided by
//! the projector's `imports` worker (`projector/src/workers/imports/wave.rs`); whether a
//! create, a part or a completion repeats or conflicts with what is stored is decided under
//! the import row's lock (`store.rs`).

use domain::imports::{self, Format};
use platform::error::Code;
use serde_json::{Map, Value};

/// Why the intake refuses a request. The HTTP edge maps each to the contract's answer: a
/// conflict with the import's state is 409 `import_conflict`, an unknown import 404.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("no import {0:?} in this space")]
    NotFound(String),
    #[error("import {0:?} exists with other settings and has written rows; choose another import id")]
    OtherSettings(String),
    #[error("part {part} of import {import_id:?} was received with another body")]
    OtherBody { import_id: String, part: i32 },
    #[error("import {0:?} is complete; it takes no more parts")]
    Closed(String),
    #[error(
        "import {0:?} is completed; it and its results are removed when their retention ends \
         (APP__IMPORTS__RETENTION_SECONDS, 30 days by default)"
    )]
    Completed(String),
    #[error("part {part} of import {import_id:?} was sent twice at once; retry")]
    SentTwice { import_id: String, part: i32 },
    #[error("import {import_id:?} was completed with {total} parts")]
    CompletedWith { import_id: String, total: i32 },
    #[error(
        "import {import_id:?} has {received} parts (up to part {highest}); send parts 1 to {parts} before completing"
    )]
    PartsMissing { import_id: String, received: i64, highest: i32, parts: i32 },
    #[error("an import id is 1 to 128 letters, digits and . _ : - (chosen by the caller, so a retry is safe)")]
    InvalidId,
    #[error("a part number is 1 to {}", imports::MAX_PARTS)]
    InvalidPart,
    /// A part sent as another media type than its import's format takes (415).
    #[error("import {import_id:?} takes {} parts; send Content-Type: {}", format.as_str(), wanted(*format))]
    WrongMediaType { import_id: String, format: Format },
    /// A part that cannot be read as its import's format (400 `invalid_body`).
    #[error("{0}")]
    Unreadable(String),
    /// A completion's body names another field than `parts` (400).
    #[error("{0} is not a field of a completion")]
    UnknownField(String),
    #[error("parts (how many parts the import has) is required")]
    MissingParts,
    #[error("parts must be 1 to {}", imports::MAX_PARTS)]
    InvalidParts,
}

/// The media type a part of `format` is named by in a refusal.
fn wanted(format: Format) -> &'static str {
    match format {
        Format::Csv => "text/csv",
        Format::Ndjson => "application/x-ndjson",
    }
}

/// An import id the caller chose.
pub(crate) fn check_id(import_id: &str) -> Result<(), Refusal> {
    if imports::valid_import_id(import_id) { Ok(()) } else { Err(Refusal::InvalidId) }
}

/// A part's number from its path segment.
pub(crate) fn part_number(segment: &str) -> Result<i32, Refusal> {
    segment.parse().ok().filter(|part| (1..=imports::MAX_PARTS).contains(part)).ok_or(Refusal::InvalidPart)
}

/// Whether a part sent as `content_type` (the header's value, if any) may be a part of an
/// import of `format`.
pub(crate) fn check_media_type(import_id: &str, format: Format, content_type: Option<&str>) -> Result<(), Refusal> {
    let media_type =
        content_type.and_then(|value| value.split(';').next()).map(|value| value.trim().to_ascii_lowercase());
    let media_type = media_type.unwrap_or_default();
    let accepted = match format {
        Format::Csv => media_type == "text/csv",
        Format::Ndjson => {
            ["application/x-ndjson", "application/jsonl", "application/json-lines"].contains(&media_type.as_str())
        }
    };
    if accepted { Ok(()) } else { Err(Refusal::WrongMediaType { import_id: import_id.to_owned(), format }) }
}

/// A completion's `{parts}`: how many parts the import has.
pub(crate) fn completion_parts(body: &Map<String, Value>) -> Result<i32, Refusal> {
    if let Some(other) = body.keys().find(|key| *key != "parts") {
        return Err(Refusal::UnknownField(other.clone()));
    }
    let value = body.get("parts").ok_or(Refusal::MissingParts)?;
    // JSON Schema's integers include 2.0.
    let whole = value.as_f64().filter(|n| n.fract() == 0.0 && n.abs() < 1e9).map(|n| n as i64);
    value
        .as_i64()
        .or(whole)
        .and_then(|n| i32::try_from(n).ok())
        .filter(|n| (1..=imports::MAX_PARTS).contains(n))
        .ok_or(Refusal::InvalidParts)
}

impl platform::refusal::Answered for Refusal {}

/// A refused import request as the contract answers it.
impl platform::refusal::Refusal for Refusal {
    fn code(&self) -> Code {
        match self {
            Self::NotFound(_) => Code::ImportNotFound,
            Self::InvalidId | Self::InvalidPart => Code::InvalidId,
            Self::WrongMediaType { .. } => Code::UnsupportedMediaType,
            Self::Unreadable(_) => Code::InvalidBody,
            Self::UnknownField(_) => Code::UnknownField,
            Self::MissingParts => Code::MissingField,
            Self::InvalidParts => Code::InvalidField,
            Self::OtherSettings(_)
            | Self::OtherBody { .. }
            | Self::Closed(_)
            | Self::Completed(_)
            | Self::SentTwice { .. }
            | Self::CompletedWith { .. }
            | Self::PartsMissing { .. } => Code::ImportConflict,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_import_id_and_a_part_number_are_checked() {
        assert_eq!(check_id("crm-2026.11:a_b"), Ok(()));
        assert_eq!(check_id(""), Err(Refusal::InvalidId));
        assert_eq!(check_id("a/b"), Err(Refusal::InvalidId));
        assert_eq!(part_number("1"), Ok(1));
        for bad in ["0", "-1", "x", &(imports::MAX_PARTS + 1).to_string()] {
            assert_eq!(part_number(bad), Err(Refusal::InvalidPart), "{bad}");
        }
    }

    #[test]
    fn a_part_is_sent_as_its_formats_media_type() {
        assert_eq!(check_media_type("i", Format::Csv, Some("text/csv; charset=utf-8")), Ok(()));
        assert_eq!(check_media_type("i", Format::Ndjson, Some("Application/JSONL")), Ok(()));
        let refused = check_media_type("i", Format::Csv, Some("application/json"));
        assert_eq!(refused, Err(Refusal::WrongMediaType { import_id: "i".into(), format: Format::Csv }));
        let message = refused.err().map(|refusal| refusal.to_string());
        assert_eq!(message.as_deref(), Some("import \"i\" takes csv parts; send Content-Type: text/csv"));
        assert!(check_media_type("i", Format::Ndjson, None).is_err());
    }

    #[test]
    fn a_completion_names_its_parts_only() {
        let body = |value: Value| value.as_object().cloned().unwrap_or_default();
        assert_eq!(completion_parts(&body(json!({"parts": 3}))), Ok(3));
        assert_eq!(completion_parts(&body(json!({"parts": 2.0}))), Ok(2));
        assert_eq!(completion_parts(&body(json!({}))), Err(Refusal::MissingParts));
        assert_eq!(completion_parts(&body(json!({"parts": 0}))), Err(Refusal::InvalidParts));
        assert_eq!(completion_parts(&body(json!({"parts": "3"}))), Err(Refusal::InvalidParts));
        assert_eq!(completion_parts(&body(json!({"parts": 1, "x": 1}))), Err(Refusal::UnknownField("x".into())));
    }
}
