//! The operator's file, read and checked whole before anything of it is stored (`cli.rs`
//! creates the import only once it passes): its CSV layout and header row, then every row in
//! one pass (its size, its encoding, a quoted cell never closed), each refusal naming the row
//! or line and what to change. A UTF-16 file is read through a UTF-8 copy.

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;

/// The most one row of a file may take: far beyond what its cells may hold (a `text` value is
/// at most 65,536 characters), and refused before its part is stored.
const ROW_BYTES: u64 = 1024 * 1024;

/// Why a file is not imported.
#[derive(Debug)]
pub(super) enum Rejected {
    /// For what it holds: the message says what to change.
    Refused(String),
    /// It could not be read.
    Unreadable(anyhow::Error),
}

fn refused(message: impl Into<String>) -> Rejected {
    Rejected::Refused(message.into())
}

impl From<anyhow::Error> for Rejected {
    fn from(error: anyhow::Error) -> Self {
        Rejected::Unreadable(error)
    }
}

impl From<std::io::Error> for Rejected {
    fn from(error: std::io::Error) -> Self {
        Rejected::Unreadable(error.into())
    }
}

/// A copy, in UTF-8, of a file that starts with a UTF-16 byte order mark (removed when
/// dropped); `None` for any other file, which is read as it is.
pub(super) fn utf16_as_utf8(path: &Path) -> Result<Option<TemporaryFile>, Rejected> {
    use std::io::Write;
    let mut file = std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut start = [0_u8; 3];
    let read = file.read(&mut start)?;
    let encoding = match encoding_rs::Encoding::for_bom(&start[..read]) {
        Some((encoding, _)) if encoding != encoding_rs::UTF_8 => encoding,
        _ => return Ok(None),
    };
    file.seek(SeekFrom::Start(0))?;
    let copy = TemporaryFile(std::env::temp_dir().join(format!("import-{}.csv", uuid::Uuid::now_v7().simple())));
    let mut out = std::io::BufWriter::new(std::fs::File::create(copy.path())?);
    let mut decoder = encoding.new_decoder_with_bom_removal();
    let (mut input, mut text) = (vec![0_u8; 64 * 1024], String::with_capacity(128 * 1024));
    loop {
        let read = file.read(&mut input)?;
        let last = read == 0;
        text.clear();
        let (_, _, had_errors) = decoder.decode_to_string(&input[..read], &mut text, last);
        if had_errors {
            return Err(refused(format!(
                "the file starts as {} (its byte order mark says so) but is not valid {}: save it again as CSV UTF-8",
                encoding.name(),
                encoding.name()
            )));
        }
        out.write_all(text.as_bytes())?;
        if last {
            out.flush()?;
            return Ok(Some(copy));
        }
    }
}

/// A file removed when dropped.
pub(super) struct TemporaryFile(PathBuf);

impl TemporaryFile {
    pub(super) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TemporaryFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A CSV file's layout, and the bytes every part starts with.
#[derive(Debug)]
pub(super) struct CsvHead {
    pub(super) layout: import_file::CsvLayout,
    /// The file up to its first row: any byte order mark, a `sep=` line and the header.
    pub(super) prefix: Vec<u8>,
}

/// A reader of a CSV file's records as the server reads a part's (no header of its own: the
/// caller counts it).
pub(super) fn csv_records<R: Read>(input: R, delimiter: u8) -> csv::Reader<R> {
    csv::ReaderBuilder::new().has_headers(false).flexible(true).delimiter(delimiter).from_reader(input)
}

/// Reads a CSV file's head: its layout (a `sep=` line names the delimiter, else `--delimiter`
/// or the header line does) and its header row, which a row must follow. The rows are
/// checked by [`check_rows`].
pub(super) fn csv_head(path: &Path, given: Option<u8>, utf8: bool) -> Result<CsvHead, Rejected> {
    let mut file = std::fs::File::open(path)?;
    let mut start = Vec::new();
    (&mut file).take(64 * 1024).read_to_end(&mut start)?;
    let layout = import_file::csv_layout(&start, given).map_err(refused)?;
    let header_at = u64::try_from(layout.header_at).context("the file's head")?;
    file.seek(SeekFrom::Start(header_at))?;
    let mut reader = csv_records(BufReader::new(&file), layout.delimiter);
    let mut record = csv::ByteRecord::new();
    if !reader.read_byte_record(&mut record).context("reading the header")? {
        return Err(refused("the file is empty: a CSV file starts with its header row"));
    }
    let header_end = header_at + reader.position().byte();
    if header_end - header_at > ROW_BYTES {
        return Err(too_long(1, header_end - header_at));
    }
    let is_last = !reader.read_byte_record(&mut csv::ByteRecord::new()).context("reading the file")?;
    drop(reader);
    let mut prefix = vec![0; usize::try_from(header_end).context("the file's head")?];
    file.seek(SeekFrom::Start(0))?;
    file.read_exact(&mut prefix)?;
    // A header ended by CR LF is read up to its CR: its LF belongs with it.
    let mut next = [0_u8];
    if prefix.ends_with(b"\r") && file.read(&mut next)? == 1 && next == *b"\n" {
        prefix.push(b'\n');
    }
    let header = prefix.get(layout.header_at..).unwrap_or_default();
    if utf8 && let Err(error) = std::str::from_utf8(header) {
        return Err(not_utf8(layout.header_line + line_breaks(&header[..error.valid_up_to()])));
    }
    if is_last {
        // The header runs to the end: a quote it opens and never closes may be why.
        if line_breaks(record.as_slice()) > 0
            && let Some(open) = open_quote_from(path, header_at, layout.delimiter)?
        {
            return Err(unclosed_quote(1, layout.header_line + open.line_breaks));
        }
        return Err(refused("the file holds its header and no rows: nothing to import"));
    }
    Ok(CsvHead { layout, prefix })
}

/// A row of megabytes is a mistake, and would sit in memory on every side.
fn too_long(row: u64, bytes: u64) -> Rejected {
    refused(format!(
        "row {row} of the file takes {} MB; a row is at most 1 MB (a text cell holds at most {} characters)",
        bytes.div_ceil(1024 * 1024),
        domain::attributes::MAX_TEXT
    ))
}

fn not_utf8(line: u64) -> Rejected {
    refused(format!(
        "line {line} of the file is not UTF-8: if it was saved by Excel or another Windows program, it is probably \
         windows-1252: pass --encoding windows-1252"
    ))
}

fn unclosed_quote(row: u64, line: u64) -> Rejected {
    refused(import_file::unclosed_quote(row, line, "the file"))
}

fn line_breaks(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|byte| **byte == b'\n').count() as u64
}

/// Checks the whole file before any of it is stored, in one pass over its records (CSV, read
/// from the header on with `layout`'s delimiter) or lines (NDJSON): none takes more than
/// [`ROW_BYTES`], each is UTF-8 when the file is read as UTF-8 (a refusal names the line and
/// the setting that reads the file otherwise), no quoted cell is left open (it would take
/// every line after it), and an NDJSON file holds a line. Stops early once `cancelled`.
pub(super) fn check_rows(
    path: &Path,
    layout: Option<import_file::CsvLayout>,
    utf8: bool,
    cancelled: &AtomicBool,
) -> Result<(), Rejected> {
    let interrupted = || Rejected::Unreadable(anyhow::anyhow!("interrupted"));
    let mut file = std::fs::File::open(path)?;
    let Some(layout) = layout else {
        let mut file = BufReader::new(file);
        let (mut line, mut number, mut rows) = (Vec::new(), 0_u64, 0_u64);
        while {
            line.clear();
            file.read_until(b'\n', &mut line)? > 0
        } {
            if cancelled.load(Ordering::Relaxed) {
                return Err(interrupted());
            }
            number += 1;
            if line.len() as u64 > ROW_BYTES {
                return Err(too_long(number, line.len() as u64));
            }
            if utf8 && std::str::from_utf8(&line).is_err() {
                return Err(not_utf8(number));
            }
            if !line.trim_ascii().is_empty() {
                rows += 1;
            }
        }
        if rows == 0 {
            return Err(refused("the file holds no rows: nothing to import"));
        }
        return Ok(());
    };
    let header_at = u64::try_from(layout.header_at).context("the file's head")?;
    file.seek(SeekFrom::Start(header_at))?;
    let mut reader = csv_records(BufReader::new(file), layout.delimiter);
    let mut record = csv::ByteRecord::new();
    // Each record's row (the header is row 1), and where it starts (after the line break that
    // ended the record before, or part of it: a line is found by counting, when one is named).
    let (mut row, mut start, mut last) = (0_u64, header_at, None);
    while reader.read_byte_record(&mut record).context("reading the file")? {
        if cancelled.load(Ordering::Relaxed) {
            return Err(interrupted());
        }
        row += 1;
        let end = header_at + reader.position().byte();
        if end - start > ROW_BYTES {
            // A quote never closed makes the last record run to the end of the file.
            let is_last = !reader.read_byte_record(&mut record).context("reading the file")?;
            return Err(match open_quote_from(path, start, layout.delimiter)? {
                Some(open) if is_last => unclosed_quote(row, line_at(path, start)? + open.line_breaks),
                _ => too_long(row, end - start),
            });
        }
        if utf8 && std::str::from_utf8(record.as_slice()).is_err() {
            let raw = bytes_at(path, start, end - start)?;
            let valid = std::str::from_utf8(&raw).err().map_or(raw.len(), |error| error.valid_up_to());
            return Err(not_utf8(line_at(path, start)? + line_breaks(&raw[..valid])));
        }
        last = Some((row, start));
        start = end;
    }
    // Only the last record can hold a quote never closed: it runs to the end of the file.
    if let Some((row, at)) = last
        && let Some(open) = open_quote_from(path, at, layout.delimiter)?
    {
        return Err(unclosed_quote(row, line_at(path, at)? + open.line_breaks));
    }
    Ok(())
}

/// The line of the file (from 1) that byte `offset` is on.
fn line_at(path: &Path, offset: u64) -> std::io::Result<u64> {
    let mut file = BufReader::new(std::fs::File::open(path)?).take(offset);
    let (mut breaks, mut buffer) = (0, vec![0; 64 * 1024]);
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            return Ok(1 + breaks);
        }
        breaks += line_breaks(&buffer[..read]);
    }
}

/// `length` bytes of the file from `offset`.
fn bytes_at(path: &Path, offset: u64, length: u64) -> Result<Vec<u8>, Rejected> {
    let mut file = std::fs::File::open(path)?;
    file.seek(SeekFrom::Start(offset))?;
    let mut bytes = vec![0; usize::try_from(length).context("a row's length")?];
    file.read_exact(&mut bytes)?;
    Ok(bytes)
}

/// The quote that opens a cell which the file, from `offset` on, never closes.
fn open_quote_from(path: &Path, offset: u64, delimiter: u8) -> std::io::Result<Option<import_file::OpenQuote>> {
    let mut file = std::fs::File::open(path)?;
    file.seek(SeekFrom::Start(offset))?;
    let mut scan = import_file::QuoteScan::new(delimiter);
    let mut buffer = vec![0; 64 * 1024];
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            return Ok(scan.open_quote());
        }
        scan.feed(&buffer[..read]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The refusal's message, or why it is no refusal.
    fn refused_by<T: std::fmt::Debug>(result: Result<T, Rejected>) -> String {
        match result {
            Err(Rejected::Refused(message)) => message,
            other => panic!("not a refusal: {other:?}"),
        }
    }

    /// A file of these bytes, removed when dropped.
    fn file(bytes: &[u8]) -> TemporaryFile {
        let file = TemporaryFile(std::env::temp_dir().join(format!("import-test-{}.csv", uuid::Uuid::now_v7())));
        std::fs::write(file.path(), bytes).expect("a scratch file");
        file
    }

    /// What the checks say of a CSV file read as UTF-8.
    fn checked(bytes: &[u8]) -> Result<CsvHead, Rejected> {
        let file = file(bytes);
        let head = csv_head(file.path(), None, true)?;
        check_rows(file.path(), Some(head.layout), true, &AtomicBool::new(false))?;
        Ok(head)
    }

    #[test]
    fn an_empty_file_a_header_without_rows_and_a_missing_file_store_nothing() {
        assert!(refused_by(checked(b"")).starts_with("the file is empty"));
        assert!(refused_by(checked(b"email,firstName\n")).starts_with("the file holds its header and no rows"));
        let missing = std::env::temp_dir().join("import-test-no-such-file.csv");
        assert!(matches!(utf16_as_utf8(&missing), Err(Rejected::Unreadable(_))));
        let ndjson = file(b"\n  \n");
        let message = refused_by(check_rows(ndjson.path(), None, true, &AtomicBool::new(false)));
        assert!(message.starts_with("the file holds no rows"), "{message}");
    }

    #[test]
    fn an_excel_sep_line_names_the_delimiter_and_rides_in_front_of_every_part() {
        let bytes = b"sep=;\r\nemail;firstName\r\nada@example.com;\"Ada,\r\nLovelace\"\r\nbob@example.com;Bob\r\n";
        let head = checked(bytes).expect("the file reads");
        assert_eq!(head.layout.delimiter, b';');
        assert_eq!(head.prefix, b"sep=;\r\nemail;firstName\r\n");
        // A delimiter given against the file's own is refused, naming both.
        let file = file(bytes);
        let conflict = refused_by(csv_head(file.path(), Some(b','), true));
        assert!(conflict.contains("sep=;") && conflict.contains("--delimiter"), "{conflict}");
    }

    #[test]
    fn a_quote_never_closed_is_refused_naming_the_row_and_line_where_it_opens() {
        let bytes = b"email,firstName\n\
                      ada@example.com,\"Ada\nof two lines\"\n\
                      bob@example.com,\"Bob\n\
                      carl@example.com,Carl\n\
                      dora@example.com,Dora\n";
        let message = refused_by(checked(bytes));
        assert!(
            message.starts_with("row 3 of the file (line 4) opens a quoted cell that is never closed"),
            "{message}"
        );
        // Past the size of a row, it is still named for what it is.
        let mut long = b"email,firstName\nada@example.com,Ada\nbob@example.com,\"Bob\n".to_vec();
        long.extend(b"carl@example.com,Carl\n".repeat(60_000));
        let message = refused_by(checked(&long));
        assert!(message.starts_with("row 3 of the file (line 3) opens a quoted cell"), "{message}");
        // A header that opens one, and a file whose quotes close, are told apart.
        let message = refused_by(checked(b"email,\"firstName\nada@example.com,Ada\n"));
        assert!(message.starts_with("row 1 of the file (line 1) opens a quoted cell"), "{message}");
        checked(b"email,firstName\nada@example.com,\"Ada \"\"the Countess\"\"\"\n").expect("the file reads");
    }

    #[test]
    fn a_line_that_is_not_utf8_is_named_with_the_option_that_reads_it() {
        let message = refused_by(checked(b"email;firstName\r\njose@example.com;\"Jos\nJos\xe9\"\r\n"));
        assert!(message.starts_with("line 3 of the file is not UTF-8"), "{message}");
        assert!(message.contains("--encoding windows-1252"), "{message}");
    }
}
