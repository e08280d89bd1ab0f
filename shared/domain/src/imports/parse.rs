//! A part's body read into rows: each row the flat input an upsert takes, or why it cannot be
//! one. A CSV cell is typed by the attribute its column fills (numbers, booleans, lists split
//! on `;`); an empty cell is absent, not null, so a sparse file never clears a value.

use std::collections::BTreeMap;

use platform::error::Code;
use serde_json::{Map, Number, Value};

use super::{Format, MAX_PART_ROWS};
use crate::attributes::attribute_type;
use crate::catalog::AttributeEntry;

/// The key of a row that lists the topics it subscribes to.
pub const TOPICS: &str = "topics";

/// One row of a part: its number (a CSV part's data rows from 1, an NDJSON part's lines from
/// 1) and its input, or the error that makes it fail without being decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub number: i32,
    pub input: Result<Map<String, Value>, RowError>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowError {
    pub code: Code,
    pub message: String,
}

/// Reads a part. `Err` (the whole part refused) when it is not UTF-8, a CSV part has no
/// header, or it holds more than [`MAX_PART_ROWS`] rows.
pub fn read_part(
    format: Format,
    body: &[u8],
    columns: &BTreeMap<String, Option<String>>,
    attributes: &[AttributeEntry],
) -> Result<Vec<Row>, String> {
    let text = std::str::from_utf8(body).map_err(|error| format!("the part is not UTF-8: {error}"))?;
    let rows = match format {
        Format::Ndjson => ndjson(text),
        Format::Csv => csv(text, columns, attributes)?,
    };
    if rows.len() > MAX_PART_ROWS {
        return Err(format!("a part holds at most {MAX_PART_ROWS} rows; this one has {}", rows.len()));
    }
    Ok(rows)
}

/// A CSV part's header cells (`None` for NDJSON, whose rows name their own keys).
pub fn headers(format: Format, body: &[u8]) -> Result<Option<Vec<String>>, String> {
    if format != Format::Csv {
        return Ok(None);
    }
    let text = std::str::from_utf8(body).map_err(|error| format!("the part is not UTF-8: {error}"))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut reader = csv::ReaderBuilder::new().flexible(true).from_reader(text.as_bytes());
    let headers = reader.headers().map_err(|error| format!("the CSV header cannot be read: {error}"))?;
    Ok(Some(headers.iter().map(str::to_owned).collect()))
}

fn ndjson(text: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let number = i32::try_from(index + 1).unwrap_or(i32::MAX);
        let input = match serde_json::from_str::<Value>(line) {
            Ok(value) => storable_object(value),
            Err(error) => {
                Err(RowError { code: Code::MalformedJson, message: format!("the line is not JSON: {error}") })
            }
        };
        rows.push(Row { number, input });
    }
    rows
}

/// A row's input: a JSON object that holds nothing the API refuses at its edge either (a NUL,
/// a lone surrogate).
fn storable_object(value: Value) -> Result<Map<String, Value>, RowError> {
    if let Some(issue) = platform::storable::json_issues(&value).into_iter().next() {
        return Err(RowError { code: Code::InvalidCharacter, message: issue.message });
    }
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(RowError { code: Code::InvalidBody, message: "the line must be a JSON object".to_owned() }),
    }
}

fn csv(
    text: &str,
    columns: &BTreeMap<String, Option<String>>,
    attributes: &[AttributeEntry],
) -> Result<Vec<Row>, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut reader = csv::ReaderBuilder::new().flexible(true).from_reader(text.as_bytes());
    let headers = reader.headers().map_err(|error| format!("the CSV header cannot be read: {error}"))?.clone();
    if headers.is_empty() || headers.iter().all(str::is_empty) {
        return Err("a CSV part starts with its header row".to_owned());
    }
    let keys: Vec<Option<String>> = headers
        .iter()
        .map(|header| {
            let header = header.trim();
            match columns.get(header) {
                Some(target) => target.clone(),
                None => Some(header.to_owned()),
            }
        })
        .collect();
    let mut rows = Vec::new();
    for (index, record) in reader.records().enumerate() {
        let number = i32::try_from(index + 1).unwrap_or(i32::MAX);
        let input = match record {
            Err(error) => {
                Err(RowError { code: Code::InvalidBody, message: format!("the row cannot be read: {error}") })
            }
            Ok(record) if record.len() != keys.len() => Err(RowError {
                code: Code::InvalidBody,
                message: format!("the row has {} fields; the header has {}", record.len(), keys.len()),
            }),
            Ok(record) => {
                let mut input = Map::new();
                for (key, cell) in keys.iter().zip(record.iter()) {
                    let Some(key) = key else { continue };
                    if cell.is_empty() {
                        continue;
                    }
                    input.insert(key.clone(), typed_cell(key, cell, attributes));
                }
                storable_object(Value::Object(input))
            }
        };
        rows.push(Row { number, input });
    }
    Ok(rows)
}

/// A CSV cell as the JSON value its key takes. A cell that is not of its attribute's type, or
/// whose key is no attribute, stays a string: the record rules then refuse the row, naming
/// the key as a single upsert would.
fn typed_cell(key: &str, cell: &str, attributes: &[AttributeEntry]) -> Value {
    if key == TOPICS {
        return Value::Array(list(cell));
    }
    let Some(attribute) = attributes.iter().find(|attribute| attribute.key == key) else {
        return Value::String(cell.to_owned());
    };
    let trimmed = cell.trim();
    let typed = match attribute_type(&attribute.definition) {
        "number" => trimmed.parse::<f64>().ok().and_then(Number::from_f64).map(Value::Number),
        "integer" => trimmed.parse::<i64>().ok().map(Value::from),
        "boolean" => match trimmed.to_ascii_lowercase().as_str() {
            "true" | "yes" | "1" => Some(Value::Bool(true)),
            "false" | "no" | "0" => Some(Value::Bool(false)),
            _ => None,
        },
        "multiselect" => Some(Value::Array(list(cell))),
        "json" => serde_json::from_str(cell).ok(),
        _ => None,
    };
    typed.unwrap_or_else(|| Value::String(cell.to_owned()))
}

/// A `;`-separated list cell.
fn list(cell: &str) -> Vec<Value> {
    cell.split(';').map(str::trim).filter(|item| !item.is_empty()).map(|item| Value::String(item.to_owned())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attributes() -> Vec<AttributeEntry> {
        [
            ("age", json!({"type": "integer"})),
            ("score", json!({"type": "number"})),
            ("newsletter", json!({"type": "boolean", "consent": {"channel": "email"}})),
            ("tags", json!({"type": "multiselect", "options": ["a", "b"]})),
            ("firstName", json!({"type": "string"})),
        ]
        .into_iter()
        .map(|(key, definition)| AttributeEntry { key: key.to_owned(), definition })
        .collect()
    }

    fn inputs(rows: &[Row]) -> Vec<Result<Value, Code>> {
        rows.iter().map(|row| row.input.clone().map(Value::Object).map_err(|error| error.code)).collect()
    }

    #[test]
    fn csv_cells_take_their_attribute_types_and_empty_cells_are_absent() {
        let body = "email,age,score,newsletter,tags,firstName,topics\n\
                    ada@example.com,36,4.5,yes,a;b,\"Ada, Countess\",news; offers\n\
                    bob@example.com,,,,,,\n";
        let rows = read_part(Format::Csv, body.as_bytes(), &BTreeMap::new(), &attributes()).expect("the part reads");
        assert_eq!(
            inputs(&rows),
            [
                Ok(json!({"email": "ada@example.com", "age": 36, "score": 4.5, "newsletter": true,
                          "tags": ["a", "b"], "firstName": "Ada, Countess", "topics": ["news", "offers"]})),
                Ok(json!({"email": "bob@example.com"})),
            ]
        );
        assert_eq!(rows.iter().map(|row| row.number).collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn a_bad_cell_stays_text_for_the_record_rules_and_a_short_row_fails_alone() {
        let body = "email,age\na@example.com,old\nb@example.com\nc@example.com,3\n";
        let rows = read_part(Format::Csv, body.as_bytes(), &BTreeMap::new(), &attributes()).expect("the part reads");
        assert_eq!(
            inputs(&rows),
            [
                Ok(json!({"email": "a@example.com", "age": "old"})),
                Err(Code::InvalidBody),
                Ok(json!({"email": "c@example.com", "age": 3}))
            ]
        );
    }

    #[test]
    fn columns_rename_and_drop_headers() {
        let columns = BTreeMap::from([("E-mail".to_owned(), Some("email".to_owned())), ("junk".to_owned(), None)]);
        let body = "\u{feff}E-mail,junk\na@example.com,x\n";
        let rows = read_part(Format::Csv, body.as_bytes(), &columns, &attributes()).expect("the part reads");
        assert_eq!(inputs(&rows), [Ok(json!({"email": "a@example.com"}))]);
    }

    #[test]
    fn ndjson_rows_are_numbered_by_line_and_bad_lines_fail_alone() {
        let body = "{\"email\": \"a@example.com\"}\n\nnot json\n[1]\n{\"email\": \"b@example.com\"}";
        let rows = read_part(Format::Ndjson, body.as_bytes(), &BTreeMap::new(), &[]).expect("the part reads");
        assert_eq!(rows.iter().map(|row| row.number).collect::<Vec<_>>(), [1, 3, 4, 5]);
        assert_eq!(
            inputs(&rows),
            [
                Ok(json!({"email": "a@example.com"})),
                Err(Code::MalformedJson),
                Err(Code::InvalidBody),
                Ok(json!({"email": "b@example.com"}))
            ]
        );
    }

    #[test]
    fn a_row_holding_a_nul_fails_alone() {
        let body = "email,firstName\na@example.com,A\u{0}da\nb@example.com,Bob\n";
        let rows = read_part(Format::Csv, body.as_bytes(), &BTreeMap::new(), &attributes()).expect("the part reads");
        assert_eq!(inputs(&rows)[0], Err(Code::InvalidCharacter));
        assert!(inputs(&rows)[1].is_ok());
    }

    #[test]
    fn a_part_that_is_not_utf8_or_has_no_header_is_refused_whole() {
        assert!(read_part(Format::Csv, b"\xff\xfe", &BTreeMap::new(), &[]).is_err());
        assert!(read_part(Format::Csv, b"", &BTreeMap::new(), &[]).is_err());
    }
}
