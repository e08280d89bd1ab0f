//! An import's file (decision: its own crate, so the CSV and text-decoding crates are linked only by
//! the tiers that read files). A part's body read into rows: each row the flat input an upsert takes, or why it cannot be
//! one. A CSV cell is typed by the attribute its column fills (numbers, booleans, lists split
//! on `;`); an empty cell is absent, not null, so a sparse file never clears a value.

use platform::error::Code;
use serde_json::{Map, Number, Value};

use domain::attributes::attribute_type;
use domain::catalog::AttributeEntry;
use domain::imports::{Encoding, Format, MAX_PART_ROWS, MAX_ROW_BYTES, Settings, TOPICS, column_key};

/// One row of a part: its number as a spreadsheet shows it (a CSV part's header is row 1, its
/// first data row 2; an NDJSON part's lines from 1) and its input, or the error that makes it
/// fail without being decided.
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

/// Checks a part's text as a whole without holding its rows: a CSV part has its header (after
/// a `sep=` line, if any, that agrees with the delimiter given) and leaves no quoted cell open
/// (which would take every line after it), the part holds at most [`MAX_PART_ROWS`] rows, and
/// no row takes more than [`MAX_ROW_BYTES`]. Answers how many it holds.
pub fn count_rows(settings: &Settings, text: &str) -> Result<usize, String> {
    let rows = match settings.format {
        Format::Ndjson => {
            let mut rows = 0;
            for (index, line) in text.lines().enumerate() {
                if line.len() > MAX_ROW_BYTES {
                    return Err(row_too_long(index + 1, line.len()));
                }
                if !line.trim().is_empty() {
                    rows += 1;
                }
            }
            rows
        }
        Format::Csv => {
            let (body, layout) = csv_body(text, settings.delimiter)?;
            let mut reader = csv_reader(body, layout.delimiter);
            check_headers(&mut reader)?;
            let mut record = csv::ByteRecord::new();
            let mut rows = 0;
            // Where the last record read starts (the header's at 0), and its row number.
            let (mut last_start, mut last_row, mut next_start) = (0, 1, reader.position().byte());
            // A row that cannot be read still counts: it fails alone when decided.
            while !matches!(reader.read_byte_record(&mut record), Ok(false)) {
                rows += 1;
                (last_start, last_row, next_start) = (next_start, rows + 1, reader.position().byte());
                let bytes = usize::try_from(next_start.saturating_sub(last_start)).unwrap_or(usize::MAX);
                if bytes > MAX_ROW_BYTES {
                    return Err(row_too_long(last_row, bytes));
                }
                if rows > MAX_PART_ROWS {
                    break;
                }
            }
            if rows > MAX_PART_ROWS {
                return Err(too_many_rows());
            }
            // Only the last record can hold a quote never closed: it runs to the end.
            let start = layout.header_at.saturating_add(usize::try_from(last_start).unwrap_or(usize::MAX));
            let (before, last) = text.as_bytes().split_at(start.min(text.len()));
            let mut scan = QuoteScan::new(layout.delimiter);
            scan.feed(last);
            if let Some(open) = scan.open_quote() {
                let line = 1 + line_breaks(before) + open.line_breaks;
                return Err(unclosed_quote(last_row as u64, line, "the part"));
            }
            rows
        }
    };
    if rows > MAX_PART_ROWS {
        return Err(too_many_rows());
    }
    Ok(rows)
}

/// Row `row` (a line of an NDJSON part, a row of a CSV part as a spreadsheet numbers it)
/// takes `bytes`, over [`MAX_ROW_BYTES`].
fn row_too_long(row: usize, bytes: usize) -> String {
    format!(
        "row {row} of the part takes {} bytes; a row is at most {MAX_ROW_BYTES} bytes (1 MB), and nothing of the part \
         was stored",
        bytes
    )
}

fn too_many_rows() -> String {
    format!("a part holds at most {MAX_PART_ROWS} rows; this one has more")
}

/// A part's rows in order, one at a time (a row is built when it is reached, so a part of
/// 100,000 rows is never held as inputs at once). `Err` when a CSV part has no header.
pub fn rows<'a>(
    settings: &'a Settings,
    text: &'a str,
    attributes: &'a [AttributeEntry],
) -> Result<Box<dyn Iterator<Item = Row> + Send + 'a>, String> {
    match settings.format {
        Format::Ndjson => Ok(Box::new(ndjson(text))),
        Format::Csv => {
            csv(text, settings, attributes).map(|rows| Box::new(rows) as Box<dyn Iterator<Item = Row> + Send>)
        }
    }
}

fn check_headers(reader: &mut csv::Reader<&[u8]>) -> Result<csv::StringRecord, String> {
    let headers = reader.headers().map_err(|error| format!("the CSV header cannot be read: {error}"))?.clone();
    if headers.is_empty() || headers.iter().all(str::is_empty) {
        return Err("a CSV part starts with its header row".to_owned());
    }
    Ok(headers)
}

/// A CSV part's header cells, from its text ([`decode`]); `None` for NDJSON, whose rows name
/// their own keys.
pub fn headers(settings: &Settings, text: &str) -> Result<Option<Vec<String>>, String> {
    if settings.format != Format::Csv {
        return Ok(None);
    }
    let (body, layout) = csv_body(text, settings.delimiter)?;
    let mut reader = csv_reader(body, layout.delimiter);
    let headers = reader.headers().map_err(|error| format!("the CSV header cannot be read: {error}"))?;
    Ok(Some(headers.iter().map(str::to_owned).collect()))
}

/// A part's text: UTF-8 or UTF-16 when it starts with their byte order mark (which is
/// dropped), else `encoding`. Text that is not valid UTF-8 is refused naming its line and the
/// setting that reads it otherwise; windows-1252 reads any bytes.
pub fn decode(body: &[u8], encoding: Encoding) -> Result<std::borrow::Cow<'_, str>, String> {
    if let Some((bom, _)) = encoding_rs::Encoding::for_bom(body)
        && bom != encoding_rs::UTF_8
    {
        let (text, had_errors) = bom.decode_with_bom_removal(body);
        if had_errors {
            return Err(format!("the part is not valid {}: it starts with its byte order mark", bom.name()));
        }
        return Ok(text);
    }
    match encoding {
        Encoding::Windows1252 => Ok(encoding_rs::WINDOWS_1252.decode_without_bom_handling(body).0),
        Encoding::Utf8 => {
            let body = body.strip_prefix(b"\xef\xbb\xbf").unwrap_or(body);
            std::str::from_utf8(body).map(std::borrow::Cow::Borrowed).map_err(|error| {
                let line = body[..error.valid_up_to()].iter().filter(|byte| **byte == b'\n').count() + 1;
                format!(
                    "line {line} is not UTF-8 (byte {} of the part): if the file was saved by Excel or another \
                     Windows program, it is probably windows-1252: set encoding to windows-1252 \
                     (--encoding windows-1252)",
                    error.valid_up_to() + 1
                )
            })
        }
    }
}

/// How a CSV text is laid out before its rows: its delimiter, and where its header starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CsvLayout {
    pub delimiter: u8,
    /// The header's byte offset: after a UTF-8 byte order mark and a `sep=` line.
    pub header_at: usize,
    /// The header's line (1, or 2 after a `sep=` line).
    pub header_line: u64,
}

/// The layout of a CSV text (its start is enough: the first line or two). A first line
/// `sep=X`, as Excel writes and reads it, names the delimiter, and the header is the next line;
/// otherwise the delimiter is the one given, or the one of `,` `;` and tab that the header line
/// holds most of outside quotes (`,` when none). `Err` when a `sep=` line and the given
/// delimiter disagree.
pub fn csv_layout(text: &[u8], given: Option<u8>) -> Result<CsvLayout, String> {
    let bom = if text.starts_with(b"\xef\xbb\xbf") { 3 } else { 0 };
    let Some((named, length)) = separator_line(&text[bom..]) else {
        let delimiter = given.unwrap_or_else(|| delimiter(&text[bom..]));
        return Ok(CsvLayout { delimiter, header_at: bom, header_line: 1 });
    };
    match given {
        Some(given) if given != named => Err(format!(
            "the first line, sep={}, names {} as the delimiter, but the delimiter given is {}: leave the \
             delimiter (--delimiter) out, or remove that line",
            char::from(named),
            delimiter_name(named),
            delimiter_name(given)
        )),
        _ => Ok(CsvLayout { delimiter: named, header_at: bom + length, header_line: 2 }),
    }
}

/// Excel's first line `sep=X`: the delimiter it names (one ASCII character other than a quote)
/// and the bytes the line takes with its line break.
fn separator_line(text: &[u8]) -> Option<(u8, usize)> {
    let rest = text.strip_prefix(b"sep=")?;
    let (&named, after) = rest.split_first()?;
    if !(named.is_ascii_graphic() || named == b'\t') || named == b'"' {
        return None;
    }
    let line_break = match after {
        [] => 0,
        [b'\r', b'\n', ..] => 2,
        [b'\n' | b'\r', ..] => 1,
        _ => return None,
    };
    Some((named, 5 + line_break))
}

fn delimiter_name(delimiter: u8) -> String {
    match delimiter {
        b'\t' => "a tab".to_owned(),
        other => format!("\"{}\"", char::from(other)),
    }
}

/// The delimiter that a CSV text's first line holds most of outside quotes, of `,` `;` and tab
/// (`,` when none).
fn delimiter(text: &[u8]) -> u8 {
    let (mut counts, mut quoted) = ([0usize; 3], false);
    for &byte in text {
        match byte {
            b'"' => quoted = !quoted,
            b'\n' | b'\r' if !quoted => break,
            b',' if !quoted => counts[0] += 1,
            b';' if !quoted => counts[1] += 1,
            b'\t' if !quoted => counts[2] += 1,
            _ => {}
        }
    }
    let best = (0..3).max_by_key(|&index| (counts[index], std::cmp::Reverse(index))).unwrap_or(0);
    if counts[best] == 0 { b',' } else { [b',', b';', b'\t'][best] }
}

/// A CSV text from its header on (after a byte order mark and a `sep=` line), and its layout.
fn csv_body(text: &str, given: Option<u8>) -> Result<(&[u8], CsvLayout), String> {
    let layout = csv_layout(text.as_bytes(), given)?;
    Ok((text.as_bytes().get(layout.header_at..).unwrap_or_default(), layout))
}

fn csv_reader(body: &[u8], delimiter: u8) -> csv::Reader<&[u8]> {
    csv::ReaderBuilder::new().flexible(true).delimiter(delimiter).from_reader(body)
}

/// Follows CSV quoting (RFC 4180, as the `csv` crate reads it) over a text fed in pieces, to
/// find a quoted cell the text never closes: such a cell would take every line after it.
#[derive(Debug, Clone)]
pub struct QuoteScan {
    delimiter: u8,
    state: QuoteState,
    /// Bytes and line breaks fed so far.
    read: u64,
    line_breaks: u64,
    /// Where the quoted cell being read opened.
    opened: OpenQuote,
}

/// The quote that opens a cell: its byte offset in the text scanned, and the line breaks before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenQuote {
    pub offset: u64,
    pub line_breaks: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QuoteState {
    /// At the start of a cell, where a quote opens a quoted cell.
    CellStart,
    /// In a cell that did not start with a quote: quotes in it are text.
    Plain,
    Quoted,
    /// A quote inside a quoted cell: a second one is a quote of the text, anything else ends
    /// the quoted part.
    QuoteInQuoted,
}

impl QuoteScan {
    pub fn new(delimiter: u8) -> Self {
        Self { delimiter, state: QuoteState::CellStart, read: 0, line_breaks: 0, opened: OpenQuote::default() }
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            let ends_cell = byte == self.delimiter || byte == b'\n' || byte == b'\r';
            self.state = match (self.state, byte) {
                (QuoteState::CellStart, b'"') => {
                    self.opened = OpenQuote { offset: self.read, line_breaks: self.line_breaks };
                    QuoteState::Quoted
                }
                (QuoteState::Quoted, b'"') => QuoteState::QuoteInQuoted,
                (QuoteState::Quoted, _) => QuoteState::Quoted,
                (QuoteState::QuoteInQuoted, b'"') => QuoteState::Quoted,
                (_, _) if ends_cell => QuoteState::CellStart,
                (_, _) => QuoteState::Plain,
            };
            self.read += 1;
            if byte == b'\n' {
                self.line_breaks += 1;
            }
        }
    }

    /// The quote that opens a cell the text fed so far leaves open, if one does.
    pub fn open_quote(&self) -> Option<OpenQuote> {
        (self.state == QuoteState::Quoted).then_some(self.opened)
    }
}

fn line_breaks(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|byte| **byte == b'\n').count() as u64
}

/// The refusal of a text whose quoted cell is never closed, naming the row and the line where
/// it opens (`whole`: "the file" or "the part").
pub fn unclosed_quote(row: u64, line: u64, whole: &str) -> String {
    format!(
        "row {row} of {whole} (line {line}) opens a quoted cell that is never closed, so every line after it \
         would be read into that cell: close the quote, or write a quote inside a cell as two (\"\")"
    )
}

fn ndjson(text: &str) -> impl Iterator<Item = Row> + '_ {
    text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty()).map(|(index, line)| {
        let number = i32::try_from(index + 1).unwrap_or(i32::MAX);
        let input = match serde_json::from_str::<Value>(line.trim()) {
            Ok(value) => storable_object(value),
            Err(error) => {
                Err(RowError { code: Code::MalformedJson, message: format!("the line is not JSON: {error}") })
            }
        };
        Row { number, input }
    })
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

fn csv<'a>(
    text: &'a str,
    settings: &'a Settings,
    attributes: &'a [AttributeEntry],
) -> Result<impl Iterator<Item = Row> + 'a, String> {
    let (body, layout) = csv_body(text, settings.delimiter)?;
    let mut reader = csv_reader(body, layout.delimiter);
    let headers = check_headers(&mut reader)?;
    let keys: Vec<Option<String>> =
        headers.iter().map(|header| column_key(header, &settings.columns, attributes)).collect();
    Ok(reader.into_records().enumerate().map(move |(index, record)| {
        // As a spreadsheet numbers it: the header is row 1.
        let number = i32::try_from(index + 2).unwrap_or(i32::MAX);
        let input = match record {
            Err(error) => {
                Err(RowError { code: Code::InvalidBody, message: format!("the row cannot be read: {error}") })
            }
            Ok(record) if record.len() != keys.len() => {
                // A quote opened and closed rows later takes the rows between into one cell.
                let spans_lines = record.iter().any(|cell| cell.contains(['\n', '\r']));
                let hint = if spans_lines {
                    ": a quoted cell of it holds line breaks, so a quote may be missing or extra"
                } else {
                    ""
                };
                Err(RowError {
                    code: Code::InvalidBody,
                    message: format!("the row has {} fields; the header has {}{hint}", record.len(), keys.len()),
                })
            }
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
        Row { number, input }
    }))
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
        // An option written in another case is the option (`Pro` for `pro`).
        "select" => domain::attributes::options(&attribute.definition)
            .into_iter()
            .find(|option| option.eq_ignore_ascii_case(trimmed))
            .map(|option| Value::String(option.to_owned())),
        "multiselect" => {
            let options = domain::attributes::options(&attribute.definition);
            let canonical = |item: Value| match item
                .as_str()
                .and_then(|text| options.iter().find(|option| option.eq_ignore_ascii_case(text)))
            {
                Some(option) => Value::String((*option).to_owned()),
                None => item,
            };
            Some(Value::Array(list(cell).into_iter().map(canonical).collect()))
        }
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
    /// A whole part read at once, refused as the intake refuses it.
    fn read_part(settings: &Settings, body: &[u8], attributes: &[AttributeEntry]) -> Result<Vec<Row>, String> {
        let text = decode(body, settings.encoding)?;
        count_rows(settings, &text)?;
        rows(settings, &text, attributes).map(Iterator::collect)
    }

    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

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

    fn settings(format: Format, columns: BTreeMap<String, Option<String>>) -> Settings {
        Settings {
            schema: "contacts".to_owned(),
            format,
            file_name: None,
            consent_label: None,
            columns,
            encoding: Encoding::Utf8,
            delimiter: None,
        }
    }

    fn inputs(rows: &[Row]) -> Vec<Result<Value, Code>> {
        rows.iter().map(|row| row.input.clone().map(Value::Object).map_err(|error| error.code)).collect()
    }

    #[test]
    fn csv_cells_take_their_attribute_types_and_empty_cells_are_absent() {
        let body = "email,age,score,newsletter,tags,firstName,topics\n\
                    ada@example.com,36,4.5,yes,a;b,\"Ada, Countess\",news; offers\n\
                    bob@example.com,,,,,,\n";
        let rows =
            read_part(&settings(Format::Csv, BTreeMap::new()), body.as_bytes(), &attributes()).expect("the part reads");
        assert_eq!(
            inputs(&rows),
            [
                Ok(json!({"email": "ada@example.com", "age": 36, "score": 4.5, "newsletter": true,
                          "tags": ["a", "b"], "firstName": "Ada, Countess", "topics": ["news", "offers"]})),
                Ok(json!({"email": "bob@example.com"})),
            ]
        );
        assert_eq!(rows.iter().map(|row| row.number).collect::<Vec<_>>(), [2, 3], "the header is row 1");
    }

    #[test]
    fn a_bad_cell_stays_text_for_the_record_rules_and_a_short_row_fails_alone() {
        let body = "email,age\na@example.com,old\nb@example.com\nc@example.com,3\n";
        let rows =
            read_part(&settings(Format::Csv, BTreeMap::new()), body.as_bytes(), &attributes()).expect("the part reads");
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
        let rows =
            read_part(&settings(Format::Csv, columns.clone()), body.as_bytes(), &attributes()).expect("the part reads");
        assert_eq!(inputs(&rows), [Ok(json!({"email": "a@example.com"}))]);
    }

    #[test]
    fn a_row_over_one_megabyte_refuses_the_part_naming_the_row() {
        let long = "x".repeat(MAX_ROW_BYTES);
        // An NDJSON line just at the limit is read; one byte more refuses the part.
        let at_limit = format!("{{\"email\": \"a@example.com\"}}\n{}", &long[..MAX_ROW_BYTES]);
        let ndjson = settings(Format::Ndjson, BTreeMap::new());
        assert_eq!(count_rows(&ndjson, &at_limit), Ok(2));
        let over = format!("{{\"email\": \"a@example.com\"}}\n\n{{\"firstName\": \"{long}\"}}\n");
        let refused = count_rows(&ndjson, &over).expect_err("a line over 1 MB");
        assert!(refused.starts_with("row 3 of the part takes 1048593 bytes"), "{refused}");
        // A CSV row as a spreadsheet numbers it (the header is row 1).
        let csv = settings(Format::Csv, BTreeMap::new());
        let body = format!("email,firstName\na@example.com,Ada\nb@example.com,\"{long}\"\nc@example.com,Cy\n");
        let refused = count_rows(&csv, &body).expect_err("a row over 1 MB");
        assert!(refused.starts_with("row 3 of the part takes"), "{refused}");
        assert!(refused.contains("at most 1048576 bytes (1 MB)"), "{refused}");
        let fine = format!("email,firstName\na@example.com,\"{}\"\n", &long[..MAX_ROW_BYTES - 100]);
        assert_eq!(count_rows(&csv, &fine), Ok(1));
    }

    #[test]
    fn ndjson_rows_are_numbered_by_line_and_bad_lines_fail_alone() {
        let body = "{\"email\": \"a@example.com\"}\n\nnot json\n[1]\n{\"email\": \"b@example.com\"}";
        let rows = read_part(&settings(Format::Ndjson, BTreeMap::new()), body.as_bytes(), &[]).expect("the part reads");
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
        let rows =
            read_part(&settings(Format::Csv, BTreeMap::new()), body.as_bytes(), &attributes()).expect("the part reads");
        assert_eq!(inputs(&rows)[0], Err(Code::InvalidCharacter));
        assert!(inputs(&rows)[1].is_ok());
    }

    #[test]
    fn a_part_that_is_not_utf8_or_has_no_header_is_refused_whole() {
        let error =
            read_part(&settings(Format::Csv, BTreeMap::new()), b"email\na\xff@x.com\n", &[]).expect_err("refused");
        assert!(error.starts_with("line 2 is not UTF-8") && error.contains("windows-1252"), "{error}");
        assert!(read_part(&settings(Format::Csv, BTreeMap::new()), b"", &[]).is_err());
    }

    fn found_delimiter(text: &str, given: Option<u8>) -> u8 {
        csv_layout(text.as_bytes(), given).map(|layout| layout.delimiter).unwrap_or_default()
    }

    #[test]
    fn the_delimiter_is_found_in_the_header_or_given() {
        assert_eq!(found_delimiter("email;name;\"a,b\"\nx,y,z", None), b';');
        assert_eq!(found_delimiter("email\tname\n", None), b'\t');
        assert_eq!(found_delimiter("\"e;mail\",name\n", None), b',', "quoted delimiters do not count");
        assert_eq!(found_delimiter("email\n", None), b',');
        assert_eq!(found_delimiter("email;name\n", Some(b',')), b',');
        let body = "email;firstName\nada@example.com;\"Ada; Countess\"\n";
        let rows = read_part(&settings(Format::Csv, BTreeMap::new()), body.as_bytes(), &attributes()).expect("reads");
        assert_eq!(inputs(&rows), [Ok(json!({"email": "ada@example.com", "firstName": "Ada; Countess"}))]);
    }

    #[test]
    fn an_excel_sep_line_names_the_delimiter_and_the_header_is_the_next_line() {
        let plain = settings(Format::Csv, BTreeMap::new());
        // The header holds more commas than semicolons: the sep line decides.
        let body = "\u{feff}sep=;\r\nemail;firstName,middle\r\nada@example.com;Ada, Lovelace\r\n";
        let rows = read_part(&plain, body.as_bytes(), &attributes()).expect("the part reads");
        assert_eq!(inputs(&rows), [Ok(json!({"email": "ada@example.com", "firstName,middle": "Ada, Lovelace"}))]);
        assert_eq!(rows[0].number, 2, "the header is row 1, as Excel shows the file");
        assert_eq!(headers(&plain, body).expect("read"), Some(vec!["email".to_owned(), "firstName,middle".to_owned()]));
        let layout = csv_layout(b"sep=\t\nemail\tname\n", None).expect("a layout");
        assert_eq!(layout, CsvLayout { delimiter: b'\t', header_at: 6, header_line: 2 });
        // The same delimiter given agrees with it; another is refused, naming both.
        assert_eq!(csv_layout(b"sep=;\nemail;name\n", Some(b';')).map(|layout| layout.delimiter), Ok(b';'));
        let conflict = csv_layout(b"sep=;\nemail;name\n", Some(b',')).expect_err("refused");
        assert!(conflict.contains("sep=;") && conflict.contains("--delimiter"), "{conflict}");
        // Only a line of exactly sep and one character is one.
        for header in ["sep=;;\n", "sep=\n", "sep=\"\n", "Sep=;\n", "separator\n"] {
            assert_eq!(csv_layout(header.as_bytes(), None).map(|layout| layout.header_at), Ok(0), "{header:?}");
        }
    }

    #[test]
    fn a_quote_never_closed_refuses_the_part_naming_the_row_and_line_where_it_opens() {
        let plain = settings(Format::Csv, BTreeMap::new());
        let body = "email,firstName\n\
                    a@example.com,\"Ann\nof two lines\"\n\
                    b@example.com,\"Bob\n\
                    c@example.com,Cy\n\
                    d@example.com,Di\n";
        let error = read_part(&plain, body.as_bytes(), &attributes()).expect_err("refused");
        assert!(error.starts_with("row 3 of the part (line 4) opens a quoted cell that is never closed"), "{error}");
        // After a sep line, the row is the same and the line one further.
        let error = read_part(&plain, format!("sep=,\n{body}").as_bytes(), &attributes()).expect_err("refused");
        assert!(error.starts_with("row 3 of the part (line 5)"), "{error}");
        let crlf = body.replace('\n', "\r\n");
        let error = read_part(&plain, crlf.as_bytes(), &attributes()).expect_err("refused");
        assert!(error.starts_with("row 3 of the part (line 4)"), "{error}");
        let error = read_part(&plain, b"email,\"firstName\na@example.com,Ann\n", &[]).expect_err("refused");
        assert!(error.starts_with("row 1 of the part (line 1)"), "{error}");
        // Quotes inside cells are text, and doubled quotes inside quoted cells are quotes.
        let fine = "email,firstName\na@example.com,5\" screen\nb@example.com,\"say \"\"hi\"\"\"\n";
        let rows = read_part(&plain, fine.as_bytes(), &attributes()).expect("the part reads");
        assert_eq!(
            inputs(&rows),
            [
                Ok(json!({"email": "a@example.com", "firstName": "5\" screen"})),
                Ok(json!({"email": "b@example.com", "firstName": "say \"hi\""}))
            ]
        );
    }

    #[test]
    fn a_quote_scan_fed_in_pieces_finds_what_it_finds_whole() {
        let text = b"a;\"b\"\"\nc\";d\ne;\"f\r\ng";
        let mut whole = QuoteScan::new(b';');
        whole.feed(text);
        let mut pieces = QuoteScan::new(b';');
        text.chunks(1).for_each(|piece| pieces.feed(piece));
        assert_eq!(whole.open_quote(), Some(OpenQuote { offset: 14, line_breaks: 2 }));
        assert_eq!(pieces.open_quote(), whole.open_quote());
        let mut closed = QuoteScan::new(b';');
        closed.feed(b"a;\"b\";c\n");
        assert_eq!(closed.open_quote(), None);
    }

    #[test]
    fn a_row_whose_quotes_join_lines_says_so_when_its_fields_do_not_match_the_header() {
        let body =
            "email,firstName,plan\na@example.com,\"Ann,basic\nb@example.com,Bob\",basic,x\nc@example.com,Cy,basic\n";
        let rows =
            read_part(&settings(Format::Csv, BTreeMap::new()), body.as_bytes(), &attributes()).expect("the part reads");
        let error = rows[0].input.clone().expect_err("the joined row fails");
        assert_eq!(error.code, Code::InvalidBody);
        assert!(error.message.contains("a quote may be missing or extra"), "{}", error.message);
        assert!(rows[1].input.is_ok());
    }

    #[test]
    fn windows_1252_and_utf16_files_are_read_as_their_text() {
        let windows = b"email;firstName\r\njose@example.com;Jos\xe9 \x80\r\n";
        let mut latin = settings(Format::Csv, BTreeMap::new());
        latin.encoding = Encoding::Windows1252;
        let rows = read_part(&latin, windows, &attributes()).expect("reads");
        assert_eq!(inputs(&rows), [Ok(json!({"email": "jose@example.com", "firstName": "José €"}))]);
        assert!(read_part(&settings(Format::Csv, BTreeMap::new()), windows, &attributes()).is_err());
        let mut utf16 = vec![0xff, 0xfe];
        for unit in "email,firstName\nzoe@example.com,Zoë\n".encode_utf16() {
            utf16.extend_from_slice(&unit.to_le_bytes());
        }
        let rows = read_part(&settings(Format::Csv, BTreeMap::new()), &utf16, &attributes()).expect("reads");
        assert_eq!(inputs(&rows), [Ok(json!({"email": "zoe@example.com", "firstName": "Zoë"}))]);
    }

    #[test]
    fn select_options_match_in_any_case_and_become_the_option() {
        let attributes = vec![
            AttributeEntry {
                key: "plan".to_owned(),
                definition: json!({"type": "select", "options": ["pro", "free"]}),
            },
            AttributeEntry {
                key: "tags".to_owned(),
                definition: json!({"type": "multiselect", "options": ["a", "B"]}),
            },
        ];
        let body = "email,plan,tags\nx@example.com,Pro,A;b;c\n";
        let rows = read_part(&settings(Format::Csv, BTreeMap::new()), body.as_bytes(), &attributes).expect("reads");
        assert_eq!(inputs(&rows), [Ok(json!({"email": "x@example.com", "plan": "pro", "tags": ["a", "B", "c"]}))]);
    }

    #[test]
    fn a_header_names_its_field_in_any_case_and_spacing_unless_mapped() {
        let none = BTreeMap::new();
        let key = |header: &str| column_key(header, &none, &attributes());
        assert_eq!(key("Email").as_deref(), Some("email"));
        assert_eq!(key("E-mail").as_deref(), Some("email"));
        assert_eq!(key("First name").as_deref(), Some("firstName"));
        assert_eq!(key("first_name").as_deref(), Some("firstName"));
        assert_eq!(key("Email Address").as_deref(), Some("Email Address"), "no field by that name: refused later");
        let mapped = BTreeMap::from([("Email".to_owned(), None)]);
        assert_eq!(column_key("Email", &mapped, &attributes()), None, "an ignored column stays ignored");
    }
}
