//! `import <file> --schema <slug>`: the operator's bulk import. Streams the file (CSV with its
//! header, or NDJSON) into the import tables in parts of at most [`PART_BYTES`] and
//! [`PART_ROWS`], each cut at a row boundary and given the header again, so a file of any size
//! never sits in memory; then completes the import and follows the `imports` worker with a
//! progress bar until every row has its result, and prints a summary with the failed rows.
//!
//! The import id defaults to one derived from the file's path, size and modification time, so
//! running the same command again after an interruption resumes the same import (parts already
//! stored are skipped), and a changed file is a new import.

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use deadpool_postgres::GenericClient;
use domain::imports::{Format, Settings};
use platform::settings::Settings as AppSettings;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::store;

/// A part's size bound: well under the API's body limit, and what the importer holds at once.
const PART_BYTES: usize = 4 * 1024 * 1024;
/// A part's row bound.
const PART_ROWS: usize = 20_000;
/// The most one row of a file may take: far beyond what its cells may hold (a `text` value is
/// at most 65,536 characters), and refused before its part is stored.
const ROW_BYTES: u64 = 1024 * 1024;
/// Failed rows the summary lists.
const SHOWN_FAILURES: i64 = 20;

/// Import a CSV or NDJSON file into a contact or object schema, through the `imports` worker
/// of a running projector. Each row is an upsert (matched by userId, email or phone;
/// externalId for objects).
#[derive(clap::Args)]
pub struct Import {
    file: PathBuf,
    /// The contact or object schema (slug or id).
    #[arg(long)]
    schema: String,
    /// The space (slug or id); may be left out when there is only one.
    #[arg(long)]
    space: Option<String>,
    /// `csv` or `ndjson`; by default from the file's extension (`.ndjson`, `.jsonl`: ndjson).
    #[arg(long)]
    format: Option<String>,
    /// The consent source: how and when the people in the file agreed. Without it, rows that
    /// grant consent fail (`consent_source_required`).
    #[arg(long)]
    consent: Option<String>,
    /// A CSV column's key, as `Header=key` (repeatable); `Header=` ignores the column.
    #[arg(long = "column")]
    columns: Vec<String>,
    /// The CSV delimiter: `,` `;` or `tab` (by default found in the header line).
    #[arg(long)]
    delimiter: Option<String>,
    /// The file's encoding when it has no byte order mark: `utf-8` (the default) or
    /// `windows-1252` (`latin1`), what Excel saves on Windows. UTF-16 is read from its mark.
    #[arg(long)]
    encoding: Option<String>,
    /// The import's id (default: derived from the file, so a rerun resumes).
    #[arg(long)]
    id: Option<String>,
    /// Stop once the file is stored, without following the worker.
    #[arg(long)]
    no_wait: bool,
    /// Rows a part holds at most (smaller parts for tests).
    #[arg(long, default_value_t = PART_ROWS, hide = true)]
    part_rows: usize,
}

/// How the command ends: 0 when rows were imported (some may have failed), 1 on an error or
/// when every row failed, 2 when the file and the settings were refused before any row was
/// stored (an unknown column, a column mapped twice, no identity column).
pub async fn import(arguments: Import, settings: &AppSettings) -> anyhow::Result<std::process::ExitCode> {
    match import_file(arguments, settings).await {
        Err(error) => match error.downcast::<Refused>() {
            Ok(Refused(refusal)) => {
                eprintln!("refused, nothing was stored:");
                if refusal.issues().is_empty() {
                    eprintln!("  {}", refusal.message());
                }
                let messages: Vec<&str> = refusal.issues().iter().map(|issue| issue.message.as_str()).collect();
                for message in once_each_field_list(&messages) {
                    eprintln!("  {message}");
                }
                Ok(std::process::ExitCode::from(2))
            }
            Err(error) => Err(error),
        },
        Ok(code) => Ok(code),
    }
}

/// The refusal's messages as the terminal shows them: the schema's field list, which every
/// unknown column's message carries (each API issue stands alone), only in the first.
fn once_each_field_list(messages: &[&str]) -> Vec<String> {
    let mut shown: Option<&str> = None;
    messages
        .iter()
        .map(|message| {
            let list = message.find(" (it has: ").and_then(|start| {
                let end = message[start..].find(')')? + start + 1;
                Some((start, end))
            });
            match list {
                Some((start, end)) if shown == Some(&message[start..end]) => {
                    format!("{}{}", &message[..start], &message[end..])
                }
                Some((start, end)) => {
                    shown = Some(&message[start..end]);
                    (*message).to_owned()
                }
                None => (*message).to_owned(),
            }
        })
        .collect()
}

/// The settings or the file refused before any row was stored.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.message())]
struct Refused(platform::error::ApiError);

async fn import_file(arguments: Import, settings: &AppSettings) -> anyhow::Result<std::process::ExitCode> {
    let file = std::fs::File::open(&arguments.file).with_context(|| format!("opening {}", arguments.file.display()))?;
    let metadata = file.metadata()?;
    let extension = arguments.file.extension().and_then(|extension| extension.to_str()).map(str::to_ascii_lowercase);
    if matches!(extension.as_deref(), Some("xlsx" | "xls" | "ods")) && arguments.format.is_none() {
        bail!(
            "spreadsheet files are not read: save the sheet as CSV (in Excel: File > Save As > CSV UTF-8) and import that"
        );
    }
    let format = match arguments.format.as_deref() {
        Some(format) => Format::parse(format).context("--format is csv or ndjson")?,
        None => match extension.as_deref() {
            Some("ndjson" | "jsonl") => Format::Ndjson,
            _ => Format::Csv,
        },
    };
    let encoding = match arguments.encoding.as_deref() {
        Some(encoding) => domain::imports::Encoding::parse(encoding)
            .context("--encoding is utf-8 or windows-1252 (latin1); UTF-16 is read from its byte order mark")?,
        None => domain::imports::Encoding::Utf8,
    };
    let delimiter = match arguments.delimiter.as_deref() {
        Some(delimiter) => {
            Some(domain::imports::parse_delimiter(delimiter).context("--delimiter is \",\", \";\" or tab")?)
        }
        None => None,
    };
    if format == Format::Ndjson && delimiter.is_some() {
        bail!("--delimiter applies to CSV files only");
    }
    // A UTF-16 file (its byte order mark says so) is read as UTF-8, written beside it first.
    let utf8_copy = utf16_as_utf8(&arguments.file)?;
    let source = utf8_copy.as_ref().map_or(arguments.file.clone(), |copy| copy.path().to_path_buf());
    check_file(&source, format, encoding == domain::imports::Encoding::Utf8)?;
    let mut columns = std::collections::BTreeMap::new();
    for column in &arguments.columns {
        let (header, key) = column.split_once('=').context("--column is Header=key (Header= ignores it)")?;
        columns.insert(header.to_owned(), (!key.is_empty()).then(|| key.to_owned()));
    }
    if format == Format::Ndjson && !columns.is_empty() {
        bail!("--column applies to CSV files only");
    }
    let import_id = match &arguments.id {
        Some(id) => id.clone(),
        None => derived_id(&arguments.file, &metadata)?,
    };
    anyhow::ensure!(domain::imports::valid_import_id(&import_id), "--id is 1 to 128 letters, digits and . _ : -");
    let pool = platform::db::pool(settings.database_url()?, 2)?;
    let mut client = pool.get().await?;
    let catalog = platform::readmodel::live_schema(&client, domain::catalog::CATALOG)
        .await?
        .context("the catalog has no live version: run migrate and apply a workspace first")?;
    let space_id = space(&client, &catalog, arguments.space.as_deref()).await?;
    let context = reads::catalog::write_context(&client, &catalog, &space_id, &arguments.schema)
        .await?
        .filter(|context| context.schema.schema_type != "event")
        .with_context(|| format!("no contact or object schema {:?} in the space", arguments.schema))?;
    let import_settings = Settings {
        schema: context.schema.schema_id.clone(),
        format,
        file_name: arguments.file.file_name().and_then(|name| name.to_str()).map(str::to_owned),
        consent_label: arguments.consent.clone(),
        columns,
        encoding,
        delimiter,
    };
    domain::imports::check_columns(&import_settings, &context.schema.schema_type, &context.attributes)
        .map_err(Refused)?;
    let refused = |failed: store::Failed| anyhow::anyhow!("{failed}; pass another --id");
    store::create(&mut client, (&space_id, &import_id), &context.schema, &import_settings, None)
        .await
        .map_err(refused)?;
    eprintln!("import {import_id}: {} into {} ({})", arguments.file.display(), arguments.schema, format.as_str());

    let file = std::fs::File::open(&source).with_context(|| format!("opening {}", source.display()))?;
    let metadata = file.metadata()?;
    let mut progress = platform::progress::Progress::new("storing the file", metadata.len(), "bytes");
    let mut parts = Parts {
        client: &mut client,
        space_id: &space_id,
        import_id: &import_id,
        stored: 0,
        starts: Vec::new(),
        most_rows: arguments.part_rows.max(1),
        check: (&import_settings, &context),
    };
    match format {
        Format::Csv => split_csv(file, std::fs::File::open(&source)?, &mut parts, &mut progress).await?,
        Format::Ndjson => split_lines(file, &mut parts, &mut progress).await?,
    }
    progress.finish(metadata.len());
    let starts = parts.starts;
    let total_parts = i32::try_from(starts.len())?;
    anyhow::ensure!(total_parts > 0, "the file holds no rows");
    store::close(&mut client, (&space_id, &import_id), total_parts).await.map_err(refused)?;
    if arguments.no_wait {
        println!("stored {total_parts} parts; follow it with GET /v1/imports/{import_id}");
        return Ok(std::process::ExitCode::SUCCESS);
    }
    follow(&client, &space_id, &import_id, &starts).await
}

/// Where the parts go, and the first data row of each (for the summary's row numbers).
struct Parts<'a> {
    client: &'a mut deadpool_postgres::Client,
    space_id: &'a str,
    import_id: &'a str,
    stored: usize,
    starts: Vec<i64>,
    most_rows: usize,
    /// What a CSV part's header is checked against before the part is stored.
    check: (&'a Settings, &'a domain::catalog::WriteContext),
}

impl Parts<'_> {
    /// Stores a part (the file was checked whole before: see [`check_file`]).
    async fn store(&mut self, body: &[u8], rows: usize) -> anyhow::Result<()> {
        let (settings, context) = self.check;
        // Every part starts with the file's header: the first one's is checked for all.
        if self.starts.is_empty() {
            let text = import_file::decode(body, settings.encoding).map_err(anyhow::Error::msg)?;
            if let Some(headers) = import_file::headers(settings, &text).map_err(anyhow::Error::msg)? {
                let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
                domain::imports::check_header(&headers, settings, &context.schema.schema_type, &context.attributes)
                    .map_err(Refused)?;
            }
        }
        let part = i32::try_from(self.starts.len() + 1)?;
        self.starts.push(i64::try_from(self.stored)?);
        self.stored += rows;
        let rows = i32::try_from(rows)?;
        store::store_part(self.client, (self.space_id, self.import_id), part, body, rows)
            .await
            .map_err(|failed| anyhow::anyhow!("{failed}: the file changed since; pass another --id"))?;
        Ok(())
    }
}

/// Cuts a CSV file at record boundaries (a quoted field may hold line breaks), each part with
/// the header in front. `bytes` is the file opened again (its own offset), to read each part's
/// bytes from.
async fn split_csv(
    file: std::fs::File,
    mut bytes: std::fs::File,
    parts: &mut Parts<'_>,
    progress: &mut platform::progress::Progress,
) -> anyhow::Result<()> {
    let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(BufReader::new(file));
    let mut record = csv::ByteRecord::new();
    anyhow::ensure!(reader.read_byte_record(&mut record)?, "the file is empty; a CSV file starts with its header");
    let header_end = reader.position().byte();
    let mut header = vec![0; usize::try_from(header_end)?];
    bytes.read_exact(&mut header)?;
    if !header.ends_with(b"\n") {
        header.push(b'\n');
    }
    let (mut start, mut rows) = (header_end, 0);
    let mut part = Vec::with_capacity(PART_BYTES + header.len());
    loop {
        let more = reader.read_byte_record(&mut record)?;
        let end = reader.position().byte();
        if more {
            rows += 1;
        }
        if rows > 0 && (!more || rows >= parts.most_rows || usize::try_from(end - start)? >= PART_BYTES) {
            part.clear();
            part.extend_from_slice(&header);
            bytes.seek(SeekFrom::Start(start))?;
            let length = usize::try_from(end - start)?;
            part.resize(header.len() + length, 0);
            bytes.read_exact(&mut part[header.len()..])?;
            parts.store(&part, rows).await?;
            progress.set(end);
            (start, rows) = (end, 0);
        }
        if !more {
            return Ok(());
        }
    }
}

/// Cuts an NDJSON file at line ends.
async fn split_lines(
    file: std::fs::File,
    parts: &mut Parts<'_>,
    progress: &mut platform::progress::Progress,
) -> anyhow::Result<()> {
    let mut reader = BufReader::new(file);
    let (mut part, mut rows, mut read) = (Vec::with_capacity(PART_BYTES), 0, 0_u64);
    let mut line = Vec::new();
    loop {
        line.clear();
        let length = reader.read_until(b'\n', &mut line)?;
        read += length as u64;
        if length > 0 {
            part.extend_from_slice(&line);
            rows += 1;
        }
        if rows > 0 && (length == 0 || rows >= parts.most_rows || part.len() >= PART_BYTES) {
            parts.store(&part, rows).await?;
            progress.set(read);
            part.clear();
            rows = 0;
        }
        if length == 0 {
            return Ok(());
        }
    }
}

/// Follows the worker until every row has its result, then prints the summary.
async fn follow(
    client: &impl GenericClient,
    space_id: &str,
    import_id: &str,
    starts: &[i64],
) -> anyhow::Result<std::process::ExitCode> {
    let document = |client| reads::imports::document(client, space_id, import_id);
    let first = document(client).await?.context("the import vanished")?;
    let total = first["rows"]["total"].as_u64().unwrap_or(0);
    let mut progress = platform::progress::Progress::new("importing", total, "rows");
    let (mut last_done, mut last_change) = (u64::MAX, Instant::now());
    loop {
        let status = document(client).await?.context("the import vanished")?;
        let done = total.saturating_sub(status["rows"]["pending"].as_u64().unwrap_or(0));
        progress.set(done);
        if status["status"] == "completed" {
            progress.finish(done);
            return summary(client, space_id, import_id, &status, starts).await;
        }
        if done != last_done {
            (last_done, last_change) = (done, Instant::now());
        } else if last_change.elapsed() > Duration::from_secs(15) {
            progress.note("no row decided for 15 s: is a projector with the imports worker running?");
            last_change = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn summary(
    client: &impl GenericClient,
    space_id: &str,
    import_id: &str,
    status: &Value,
    starts: &[i64],
) -> anyhow::Result<std::process::ExitCode> {
    let rows = &status["rows"];
    println!(
        "import {import_id}: {} rows: {} created, {} updated, {} unchanged, {} failed",
        rows["total"], rows["created"], rows["updated"], rows["unchanged"], rows["failed"]
    );
    let failed = client
        .query(
            "SELECT part, row_number, code, message, key_field, key_value FROM import_rows
             WHERE space_id = $1 AND import_id = $2 AND status = 'failed' ORDER BY part, row_number LIMIT $3",
            &[&space_id, &import_id, &SHOWN_FAILURES],
        )
        .await?;
    for row in &failed {
        let part: i32 = row.get(0);
        let number: i32 = row.get(1);
        let start = usize::try_from(part - 1).ok().and_then(|index| starts.get(index)).copied().unwrap_or(0);
        let key = match (row.get::<_, Option<&str>>(4), row.get::<_, Option<&str>>(5)) {
            (Some(field), Some(value)) => format!(" ({field} {value})"),
            _ => String::new(),
        };
        println!(
            "  row {}{key}: {}: {}",
            start + i64::from(number),
            row.get::<_, Option<&str>>(2).unwrap_or(""),
            row.get::<_, Option<&str>>(3).unwrap_or("")
        );
    }
    let failed_total = rows["failed"].as_i64().unwrap_or(0);
    if failed_total > SHOWN_FAILURES {
        println!("  ... and {} more: GET /v1/imports/{import_id}/rows?status=failed", failed_total - SHOWN_FAILURES);
    }
    let total = rows["total"].as_i64().unwrap_or(0);
    if total > 0 && failed_total == total {
        eprintln!("every row failed: nothing was imported");
        return Ok(std::process::ExitCode::FAILURE);
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// A copy, in UTF-8, of a file that starts with a UTF-16 byte order mark (removed when
/// dropped); `None` for any other file, which is read as it is.
fn utf16_as_utf8(path: &Path) -> anyhow::Result<Option<TemporaryFile>> {
    use std::io::Write;
    let mut file = std::fs::File::open(path)?;
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
        anyhow::ensure!(!had_errors, "the file starts as {} but is not valid {}", encoding.name(), encoding.name());
        out.write_all(text.as_bytes())?;
        if last {
            out.flush()?;
            return Ok(Some(copy));
        }
    }
}

/// A file removed when dropped.
struct TemporaryFile(PathBuf);

impl TemporaryFile {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TemporaryFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Checks the whole file before any part is stored, in one pass over its records (CSV) or
/// lines (NDJSON): none takes more than [`ROW_BYTES`] (a cell of megabytes is a mistake, and
/// would sit in memory on every side), and, when it is read as UTF-8, each is UTF-8 (a refusal
/// names the line and the setting that reads the file otherwise).
fn check_file(path: &Path, format: Format, utf8: bool) -> anyhow::Result<()> {
    let refused = |code, message: String| Refused(platform::error::ApiError::bad_request(code, message)).into();
    let too_long = |row: u64, bytes: u64| {
        refused(
            platform::error::Code::ValueTooLong,
            format!(
                "row {row} of the file takes {} MB; a row is at most 1 MB (a text cell holds at most {} characters)",
                bytes.div_ceil(1024 * 1024),
                domain::attributes::MAX_TEXT
            ),
        )
    };
    let not_utf8 = |line: u64| {
        refused(
            platform::error::Code::InvalidBody,
            format!(
                "line {line} of the file is not UTF-8: if it was saved by Excel or another Windows program, it is \
                 probably windows-1252: pass --encoding windows-1252"
            ),
        )
    };
    let mut file = BufReader::new(std::fs::File::open(path)?);
    match format {
        Format::Csv => {
            let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(file);
            let mut record = csv::ByteRecord::new();
            let (mut previous_end, mut row, mut line) = (0_u64, 0_u64, 1_u64);
            while reader.read_byte_record(&mut record)? {
                row += 1;
                let end = reader.position().byte();
                if end - previous_end > ROW_BYTES {
                    return Err(too_long(row, end - previous_end));
                }
                if utf8 && std::str::from_utf8(record.as_slice()).is_err() {
                    return Err(not_utf8(line));
                }
                // The next record starts on the line after this one's last (a quoted cell may
                // hold line breaks).
                let breaks = record.as_slice().iter().filter(|byte| **byte == b'\n').count() as u64;
                (previous_end, line) = (end, line + 1 + breaks);
            }
        }
        Format::Ndjson => {
            let (mut line, mut number) = (Vec::new(), 0_u64);
            while {
                line.clear();
                file.read_until(b'\n', &mut line)? > 0
            } {
                number += 1;
                if line.len() as u64 > ROW_BYTES {
                    return Err(too_long(number, line.len() as u64));
                }
                if utf8 && std::str::from_utf8(&line).is_err() {
                    return Err(not_utf8(number));
                }
            }
        }
    }
    Ok(())
}

/// An id for the file as it is now: its path, size and modification time.
fn derived_id(path: &Path, metadata: &std::fs::Metadata) -> anyhow::Result<String> {
    let canonical = std::fs::canonicalize(path)?;
    let modified = metadata.modified()?.duration_since(std::time::UNIX_EPOCH)?.as_nanos();
    let digest = Sha256::digest(format!("{}\n{}\n{modified}", canonical.display(), metadata.len()));
    let stem: String = path
        .file_stem()
        .and_then(|stem| stem.to_str())
        .unwrap_or("file")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "._-".contains(*c))
        .take(80)
        .collect();
    Ok(format!("file-{stem}-{}", &hex::encode(digest)[..12]))
}

/// The space named (slug or id), or the only one.
async fn space(client: &impl GenericClient, catalog: &str, named: Option<&str>) -> anyhow::Result<String> {
    let spaces: Vec<(String, String)> = client
        .query(&format!("SELECT space_id, slug FROM {catalog}.spaces ORDER BY slug"), &[])
        .await?
        .into_iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    match named {
        Some(named) => spaces
            .iter()
            .find(|(id, slug)| id == named || slug == named)
            .map(|(id, _)| id.clone())
            .with_context(|| format!("no space {named:?}")),
        None if spaces.len() == 1 => Ok(spaces[0].0.clone()),
        None => {
            let slugs: Vec<&str> = spaces.iter().map(|(_, slug)| slug.as_str()).collect();
            bail!("name the space with --space ({})", slugs.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_schemas_field_list_is_shown_once_however_many_columns_fill_none() {
        let messages = [
            "column \"a\" fills no field of this schema (it has: id, email): map it",
            "column \"emial\" fills no field of this schema; did you mean \"email\"? Map it",
            "column \"b\" fills no field of this schema (it has: id, email): map it",
        ];
        assert_eq!(
            super::once_each_field_list(&messages),
            [
                "column \"a\" fills no field of this schema (it has: id, email): map it",
                "column \"emial\" fills no field of this schema; did you mean \"email\"? Map it",
                "column \"b\" fills no field of this schema: map it",
            ]
        );
    }
}
