//! Bulk imports: an import's settings, its parts read into rows (`parse`), and what decides a
//! row beyond the record rules every upsert follows (`decide`). Pure: the command service
//! takes imports and parts in, the projector's `imports` worker decides their rows.

pub mod decide;

use std::collections::BTreeMap;

use kernel::error::{Code, Issue};
use serde_json::{Map, Value};

use crate::catalog::AttributeEntry;

/// How an import's parts are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// RFC 4180 CSV; every part starts with its header row.
    Csv,
    /// One JSON object per line, each the body an upsert takes.
    Ndjson,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Ndjson => "ndjson",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "csv" => Some(Format::Csv),
            "ndjson" => Some(Format::Ndjson),
            _ => None,
        }
    }
}

/// How an import's parts are encoded when they carry no byte order mark (with one, UTF-8 and
/// UTF-16 are read whatever this says).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    #[default]
    Utf8,
    /// What Excel and other Windows programs save in western Europe and the Americas
    /// (`windows-1252`; `latin1` and `iso-8859-1` name it too, as the WHATWG encodings do).
    Windows1252,
}

impl Encoding {
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Utf8 => "utf-8",
            Encoding::Windows1252 => "windows-1252",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text.to_ascii_lowercase().as_str() {
            "utf-8" | "utf8" => Some(Encoding::Utf8),
            "windows-1252" | "cp1252" | "latin1" | "latin-1" | "iso-8859-1" => Some(Encoding::Windows1252),
            _ => None,
        }
    }
}

/// A CSV delimiter as given: `,` `;` or a tab (`\t` or `tab`).
pub fn parse_delimiter(text: &str) -> Option<u8> {
    match text {
        "," => Some(b','),
        ";" => Some(b';'),
        "\t" | "\\t" | "tab" => Some(b'\t'),
        _ => None,
    }
}

fn delimiter_text(delimiter: u8) -> &'static str {
    match delimiter {
        b';' => ";",
        b'\t' => "\t",
        _ => ",",
    }
}

/// What an import is told when it is created.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The schema id or slug, as given.
    pub schema: String,
    pub format: Format,
    /// The file the rows come from, for the audit trail.
    pub file_name: Option<String>,
    /// The consent source: without one the import grants no consent and no subscription.
    pub consent_label: Option<String>,
    /// CSV header -> the key it fills (`None`: the column is ignored). A header not named
    /// here fills the key of its own name.
    pub columns: BTreeMap<String, Option<String>>,
    /// How parts without a byte order mark are encoded.
    pub encoding: Encoding,
    /// A CSV part's delimiter; `None`: found in its header line (`,` `;` or tab).
    pub delimiter: Option<u8>,
}

/// The advisory lock the `imports` worker holds while it decides a part (one process at a
/// time), which an import started again under its id takes too, so no part is decided while
/// its import is replaced.
pub const WORKER_LOCK: i64 = 0x696d_706f_7274; // "import"

/// Rows a part may hold.
pub const MAX_PART_ROWS: usize = 100_000;
/// The bytes one row may take (an NDJSON line, a CSV record): a row of megabytes is a mistake,
/// and would sit in memory on every side.
pub const MAX_ROW_BYTES: usize = 1024 * 1024;
/// Parts an import may have.
pub const MAX_PARTS: i32 = 100_000;
const MAX_LABEL: usize = 200;

/// Whether `id` may name an import: 1 to 128 of letters, digits and `._:-`.
pub fn valid_import_id(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
}

/// Why an import's settings, or a part's header, are refused: 400 with the first problem's
/// code and message, every problem in `issues`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refused {
    pub code: Code,
    pub message: String,
    pub issues: Vec<Issue>,
}

impl Refused {
    fn new(code: Code, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), issues: Vec::new() }
    }

    fn with_issues(mut self, issues: Vec<Issue>) -> Self {
        self.issues = issues;
        self
    }
}

impl kernel::refusal::Refusal for Refused {
    fn code(&self) -> Code {
        self.code
    }

    fn issues(&self) -> Vec<Issue> {
        self.issues.clone()
    }
}

/// Reads the body of an import's create: `{schema, format, fileName?, consent?: {label},
/// columns?}`. Any other field is 400 `unknown_field`.
pub fn parse_settings(body: Map<String, Value>) -> Result<Settings, Refused> {
    let mut issues = Vec::new();
    let mut schema = None;
    let mut format = None;
    let mut file_name = None;
    let mut consent_label = None;
    let mut columns = BTreeMap::new();
    let mut encoding = Encoding::default();
    let mut delimiter = None;
    let mut format_given = false;
    for (key, value) in body {
        match key.as_str() {
            "schema" => match value {
                Value::String(text) if !text.is_empty() => schema = Some(text),
                _ => issues.push(Issue::coded("schema", Code::InvalidField, "schema must be a schema id or slug")),
            },
            "format" => {
                format_given = true;
                match value.as_str() {
                    Some(text) if Format::parse(text).is_some() => format = Format::parse(text),
                    Some(text) if ["xlsx", "xls", "ods"].contains(&text.to_ascii_lowercase().as_str()) => {
                        issues.push(Issue::coded(
                            "format",
                            Code::InvalidField,
                            format!(
                                "{text} files are not read: save the sheet as CSV (in Excel: File > Save As > CSV \
                                 UTF-8) and import that with format csv"
                            ),
                        ))
                    }
                    _ => issues.push(Issue::coded("format", Code::InvalidField, "format must be csv or ndjson")),
                }
            }
            "encoding" => match value {
                Value::Null => {}
                _ => match value.as_str().and_then(Encoding::parse) {
                    Some(parsed) => encoding = parsed,
                    None => issues.push(Issue::coded(
                        "encoding",
                        Code::InvalidField,
                        "encoding must be utf-8 or windows-1252 (latin1); UTF-16 is read from its byte order mark",
                    )),
                },
            },
            "delimiter" => match value {
                Value::Null => {}
                _ => match value.as_str().and_then(parse_delimiter) {
                    Some(parsed) => delimiter = Some(parsed),
                    None => issues.push(Issue::coded(
                        "delimiter",
                        Code::InvalidField,
                        "delimiter must be \",\", \";\" or \"\\t\" (a tab); leave it out to find it from the header",
                    )),
                },
            },
            "fileName" => match value {
                Value::Null => {}
                Value::String(text) if text.chars().count() <= MAX_LABEL => file_name = Some(text),
                _ => issues.push(Issue::coded(
                    "fileName",
                    Code::InvalidField,
                    format!("fileName must be a string of at most {MAX_LABEL} characters"),
                )),
            },
            "consent" => match value {
                Value::Null => {}
                Value::Object(consent) => match (consent.get("label"), consent.len()) {
                    (Some(Value::String(label)), 1) if !label.is_empty() && label.chars().count() <= MAX_LABEL => {
                        consent_label = Some(label.clone())
                    }
                    _ => issues.push(Issue::coded(
                        "consent",
                        Code::InvalidField,
                        format!(
                            "consent must be {{\"label\": \"...\"}}: how and when these people agreed (1 to {MAX_LABEL} characters)"
                        ),
                    )),
                },
                _ => issues.push(Issue::coded("consent", Code::InvalidField, "consent must be an object with a label")),
            },
            "columns" => match value {
                Value::Null => {}
                Value::Object(map) => {
                    for (header, target) in map {
                        match target {
                            Value::Null => {
                                columns.insert(header, None);
                            }
                            Value::String(target) if !target.is_empty() => {
                                columns.insert(header, Some(target));
                            }
                            _ => issues.push(Issue::coded(
                                "columns",
                                Code::InvalidField,
                                format!("columns.{header} must be the key the column fills, or null to ignore it"),
                            )),
                        }
                    }
                }
                _ => issues.push(Issue::coded(
                    "columns",
                    Code::InvalidField,
                    "columns must map CSV headers to the keys they fill",
                )),
            },
            _ => issues.push(Issue::coded(&key, Code::UnknownField, format!("{key} is not a field of an import"))),
        }
    }
    let (schema, format) = match (schema, format) {
        (Some(schema), Some(format)) if issues.is_empty() => (schema, format),
        (schema, format) => {
            if schema.is_none() {
                issues.push(Issue::coded("schema", Code::MissingField, "schema is required"));
            }
            if format.is_none() && !format_given {
                issues.push(Issue::coded("format", Code::MissingField, "format is required (csv or ndjson)"));
            }
            let first = &issues[0];
            let code = first.code.unwrap_or(Code::InvalidField);
            let message = first.message.clone();
            return Err(Refused::new(code, message).with_issues(issues));
        }
    };
    if format == Format::Ndjson && (!columns.is_empty() || delimiter.is_some()) {
        return Err(Refused::new(Code::InvalidField, "columns and delimiter apply to csv imports only"));
    }
    Ok(Settings { schema, format, file_name, consent_label, columns, encoding, delimiter })
}

/// The keys a row of a schema of `schema_type` may fill: the record's `id` (to match it by),
/// its writable platform fields (the identities), its writable attributes and, for contacts,
/// `topics`.
fn fillable(key: &str, schema_type: &str, attributes: &[AttributeEntry]) -> bool {
    key == "id"
        || crate::records::base_attributes(schema_type).iter().any(|(base, _, writable)| *writable && *base == key)
        || attributes.iter().any(|attribute| attribute.key == key && crate::catalog::is_writable(&attribute.definition))
        || (schema_type == "contact" && key == TOPICS)
}

/// What the schema's rows may fill, for a message: its identities and attributes.
fn fillable_list(schema_type: &str, attributes: &[AttributeEntry]) -> String {
    fillable_keys(schema_type, attributes).join(", ")
}

/// The field a mistyped or differently written column most likely means ("emial", "E-Mail",
/// "First Name"), when one is close enough to say so.
fn closest_field<'a>(header: &str, schema_type: &str, attributes: &'a [AttributeEntry]) -> Option<&'a str> {
    let folded =
        |text: &str| text.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect::<String>();
    let header = folded(header);
    if header.is_empty() {
        return None;
    }
    fillable_keys(schema_type, attributes)
        .into_iter()
        .map(|key| (key, strsim::jaro_winkler(&header, &folded(key))))
        .filter(|(_, score)| *score >= 0.85)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(key, _)| key)
}

fn fillable_keys<'a>(schema_type: &str, attributes: &'a [AttributeEntry]) -> Vec<&'a str> {
    let base = crate::records::base_attributes(schema_type).iter().filter(|(_, _, writable)| *writable);
    let mut keys: Vec<&str> = std::iter::once("id").chain(base.map(|(key, _, _)| *key)).collect();
    keys.extend(
        attributes
            .iter()
            .filter(|a| crate::catalog::is_writable(&a.definition))
            .map(|attribute| attribute.key.as_str()),
    );
    if schema_type == "contact" {
        keys.push(TOPICS);
    }
    keys
}

fn refused(issues: Vec<Issue>) -> Result<(), Refused> {
    let Some(first) = issues.first() else { return Ok(()) };
    let (code, message) = (first.code.unwrap_or(Code::InvalidField), first.message.clone());
    Err(Refused::new(code, message).with_issues(issues))
}

/// Checks an import's column map against its schema before anything is stored: every column
/// fills a key rows may fill (400 `unknown_attribute` naming `columns.<header>`), and no two
/// columns fill the same key (400 `invalid_field`).
pub fn check_columns(settings: &Settings, schema_type: &str, attributes: &[AttributeEntry]) -> Result<(), Refused> {
    let mut issues = Vec::new();
    let mut filled: BTreeMap<&str, &str> = BTreeMap::new();
    for (header, key) in &settings.columns {
        let Some(key) = key else { continue };
        if !fillable(key, schema_type, attributes) {
            issues.push(Issue::coded(
                format!("columns.{header}"),
                Code::UnknownAttribute,
                match closest_field(key, schema_type, attributes) {
                    Some(field) => format!(
                        "column {header:?} is mapped to {key:?}, which is not a field of this schema; did you mean \
                         {field:?}?"
                    ),
                    None => format!(
                        "column {header:?} is mapped to {key:?}, which is not a field of this schema (it has: {})",
                        fillable_list(schema_type, attributes)
                    ),
                },
            ));
        }
        if let Some(other) = filled.insert(key, header) {
            issues.push(Issue::coded(
                format!("columns.{header}"),
                Code::InvalidField,
                format!("columns {other:?} and {header:?} both fill {key:?}; map one of them elsewhere or to null"),
            ));
        }
    }
    refused(issues)
}

/// Checks a CSV part's header against the import's column map and schema before any of its
/// rows is stored: every column fills a key rows may fill or is ignored (400
/// `unknown_attribute` naming the column), no two columns fill the same key (400
/// `invalid_field`), and one fills an identity the rows are matched by (400 `missing_field`).
/// NDJSON parts name their keys per row, which the rows' own checks refuse.
pub fn check_header(
    headers: &[&str],
    settings: &Settings,
    schema_type: &str,
    attributes: &[AttributeEntry],
) -> Result<(), Refused> {
    if headers.iter().any(|header| !kernel::storable::is_storable(header)) {
        return Err(Refused::new(
            Code::InvalidCharacter,
            "a column name of the header holds a NUL character, which cannot be stored",
        ));
    }
    let mut issues = Vec::new();
    let mut filled: BTreeMap<String, &str> = BTreeMap::new();
    for header in headers {
        let header = header.trim();
        let Some(key) = column_key(header, &settings.columns, attributes) else { continue };
        if !fillable(&key, schema_type, attributes) {
            let message = match closest_field(header, schema_type, attributes) {
                Some(field) => format!(
                    "column {header:?} fills no field of this schema; did you mean {field:?}? Map it (columns \
                     {{\"{header}\": \"{field}\"}}, or --column \"{header}={field}\"), or ignore it (null, or --column \
                     \"{header}=\")"
                ),
                None => format!(
                    "column {header:?} fills no field of this schema (it has: {}): map it to one (columns \
                     {{\"{header}\": \"<field>\"}}, or --column \"{header}=<field>\"), or ignore it (null, or --column \
                     \"{header}=\")",
                    fillable_list(schema_type, attributes)
                ),
            };
            issues.push(Issue::coded(header, Code::UnknownAttribute, message));
        } else if let Some(other) = filled.insert(key.clone(), header) {
            issues.push(Issue::coded(
                header,
                Code::InvalidField,
                format!("columns {other:?} and {header:?} both fill {key:?}; map one of them elsewhere or ignore it"),
            ));
        }
    }
    let identities: Vec<&str> =
        std::iter::once("id").chain(crate::records::decide::identity_keys(schema_type).iter().copied()).collect();
    if issues.is_empty() && !identities.iter().any(|identity| filled.contains_key(*identity)) {
        issues.push(Issue::coded(
            "columns",
            Code::MissingField,
            format!(
                "no column fills {}: each row is matched by one of them (map a column to it)",
                identities.join(", ")
            ),
        ));
    }
    refused(issues)
}

impl Settings {
    /// The settings as stored and shown: `schema` as the id it resolved to.
    /// `encoding` and `delimiter` appear only when given (so the documents, and digests, of
    /// imports made before them stay the same).
    pub fn document(&self, schema_id: &str) -> Value {
        let mut document = serde_json::json!({
            "schema": schema_id,
            "format": self.format.as_str(),
            "fileName": self.file_name,
            "consent": self.consent_label.as_ref().map(|label| serde_json::json!({"label": label})),
            "columns": (!self.columns.is_empty()).then_some(&self.columns),
        });
        if self.encoding != Encoding::Utf8 {
            document["encoding"] = Value::from(self.encoding.as_str());
        }
        if let Some(delimiter) = self.delimiter {
            document["delimiter"] = Value::from(delimiter_text(delimiter));
        }
        document
    }

    /// The settings back from their stored document.
    pub fn from_document(document: &Value) -> Option<Self> {
        Some(Settings {
            schema: document.get("schema")?.as_str()?.to_owned(),
            format: Format::parse(document.get("format")?.as_str()?)?,
            file_name: document.get("fileName").and_then(Value::as_str).map(str::to_owned),
            consent_label: document.pointer("/consent/label").and_then(Value::as_str).map(str::to_owned),
            columns: document
                .get("columns")
                .and_then(Value::as_object)
                .map(|columns| {
                    columns.iter().map(|(header, key)| (header.clone(), key.as_str().map(str::to_owned))).collect()
                })
                .unwrap_or_default(),
            encoding: document.get("encoding").and_then(Value::as_str).and_then(Encoding::parse).unwrap_or_default(),
            delimiter: document.get("delimiter").and_then(Value::as_str).and_then(parse_delimiter),
        })
    }
}

/// The key of a row that lists the topics it subscribes to.
pub const TOPICS: &str = "topics";

/// The key a CSV column fills: the one its header is mapped to (`None`: ignored), else the
/// field its header names, matched without regard to case, spaces, `_` and `-` when it is not
/// a field's exact key (`Email` fills `email`, `First name` fills `firstName`), else the
/// header itself (which the header's check refuses).
pub fn column_key(
    header: &str,
    columns: &BTreeMap<String, Option<String>>,
    attributes: &[AttributeEntry],
) -> Option<String> {
    let header = header.trim();
    if let Some(target) = columns.get(header) {
        return target.clone();
    }
    let loose = |text: &str| -> String {
        text.chars().filter(|c| !matches!(c, ' ' | '_' | '-')).flat_map(char::to_lowercase).collect()
    };
    // The record's id and the writable platform fields of either record type (the header's
    // check then refuses one its schema does not have), `topics`, and the attributes.
    let platform = ["contact", "object"].into_iter().flat_map(crate::records::base_attributes);
    let fields: Vec<&str> = std::iter::once("id")
        .chain(platform.filter(|(_, _, writable)| *writable).map(|(key, _, _)| *key))
        .chain([TOPICS])
        .chain(attributes.iter().map(|attribute| attribute.key.as_str()))
        .collect();
    if fields.contains(&header) {
        return Some(header.to_owned());
    }
    let wanted = loose(header);
    let mut matching = fields.iter().filter(|field| loose(field) == wanted);
    match (matching.next(), matching.next()) {
        (Some(field), None) => Some((*field).to_owned()),
        _ => Some(header.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn settings(body: Value) -> Result<Settings, Refused> {
        parse_settings(body.as_object().cloned().unwrap_or_default())
    }

    #[test]
    fn settings_need_a_schema_and_a_format_and_name_unknown_fields() {
        let error = settings(json!({"format": "csv"})).expect_err("refused");
        assert_eq!(error.code, Code::MissingField);
        assert_eq!(
            settings(json!({"schema": "contacts", "format": "xml"})).expect_err("refused").code,
            Code::InvalidField
        );
        // A spreadsheet is one clear error, not also "format is required".
        let xlsx = settings(json!({"schema": "contacts", "format": "xlsx"})).expect_err("refused");
        assert_eq!(xlsx.issues.len(), 1, "{:?}", xlsx.issues);
        assert!(xlsx.message.contains("save the sheet as CSV"), "{}", xlsx.message);
        let error = settings(json!({"schema": "contacts", "format": "csv", "consnt": {}})).expect_err("refused");
        assert_eq!(error.code, Code::UnknownField);
    }

    #[test]
    fn a_consent_source_is_a_label_and_nothing_else() {
        let ok = settings(json!({"schema": "c", "format": "csv", "consent": {"label": "signup form 2025"}}))
            .expect("valid settings");
        assert_eq!(ok.consent_label.as_deref(), Some("signup form 2025"));
        for bad in [json!({}), json!({"label": ""}), json!({"label": "x", "at": 1}), json!("yes")] {
            let error = settings(json!({"schema": "c", "format": "csv", "consent": bad})).expect_err("refused");
            assert_eq!(error.code, Code::InvalidField);
        }
    }

    #[test]
    fn settings_round_trip_through_their_document() {
        let parsed = settings(json!({
            "schema": "contacts", "format": "csv", "fileName": "list.csv",
            "consent": {"label": "listmonk export"}, "columns": {"E-mail": "email", "junk": null},
            "encoding": "latin1", "delimiter": ";"
        }))
        .expect("valid settings");
        assert_eq!((parsed.encoding, parsed.delimiter), (Encoding::Windows1252, Some(b';')));
        let back = Settings::from_document(&parsed.document("sch_1")).expect("valid settings");
        assert_eq!(back, Settings { schema: "sch_1".to_owned(), ..parsed });
        // Without them, the document is what it was before they existed (its digest too).
        let plain = settings(json!({"schema": "contacts", "format": "csv"})).expect("valid settings");
        let document = plain.document("sch_1");
        assert!(document.get("encoding").is_none() && document.get("delimiter").is_none(), "{document}");
    }

    #[test]
    fn a_column_that_fills_no_field_names_the_field_it_most_likely_means() {
        let attributes = ["firstName", "plan"]
            .map(|key| AttributeEntry { key: key.to_owned(), definition: json!({"type": "string"}) })
            .to_vec();
        let plain = settings(json!({"schema": "contacts", "format": "csv"})).expect("valid settings");
        for (header, meant) in
            [("emial", "email"), ("Email Adress", "email"), ("frist_name", "firstName"), ("plna", "plan")]
        {
            let error = check_header(&[header], &plain, "contact", &attributes).expect_err("refused");
            assert_eq!(error.code, Code::UnknownAttribute);
            assert!(error.message.contains(&format!("did you mean {meant:?}")), "{header}: {}", error.message);
        }
        let mapped = settings(json!({"schema": "contacts", "format": "csv", "columns": {"E-mail": "emial"}}))
            .expect("valid settings");
        let error = check_columns(&mapped, "contact", &attributes).expect_err("refused");
        assert!(error.message.contains("did you mean \"email\""), "{}", error.message);
        // Nothing close: the fields are listed instead.
        let error = check_header(&["Vorname"], &plain, "contact", &attributes).expect_err("refused");
        assert!(!error.message.contains("did you mean"), "{}", error.message);
        assert!(error.message.contains("it has: id, userId, email"), "{}", error.message);
    }

    #[test]
    fn import_ids_are_short_and_plain() {
        assert!(valid_import_id("sync-2026-11-27T10:00"));
        assert!(!valid_import_id(""));
        assert!(!valid_import_id("a/b"));
        assert!(!valid_import_id(&"x".repeat(129)));
    }
}
