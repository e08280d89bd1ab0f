//! `import <file> --schema <slug>`: the operator's bulk import. Checks the arguments, the
//! schema and the whole file first, so that whatever refuses it does so before anything is
//! stored; then streams the file (CSV with its header, or NDJSON) into the import tables in
//! parts of at most [`PART_BYTES`] and [`PART_ROWS`], each cut at a row boundary and given the
//! header again, so a file of any size never sits in memory; then completes the import and
//! follows the `imports` worker with a progress bar until every row has its result, and prints
//! a summary with the failed rows. Its exit code says how it ended ([`Outcome::exit_code`]).
//!
//! The import id defaults to one derived from the file's path, size and modification time, so
//! running the same command again after an interruption resumes the same import (parts already
//! stored are skipped), and a changed file is a new import.

use platform::refusal::answered;
use std::cell::RefCell;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use deadpool_postgres::GenericClient;
use domain::imports::{Format, Settings};
use platform::settings::Settings as AppSettings;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::file::{self, CsvHead, TemporaryFile};
use super::store;

/// A part's size bound: well under the API's body limit, and what the importer holds at once.
const PART_BYTES: usize = 4 * 1024 * 1024;
/// A part's row bound.
const PART_ROWS: usize = 20_000;
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
    /// The CSV delimiter: `,` `;` or `tab` (by default named by the file's `sep=` first line,
    /// as Excel writes it, or found in the header line).
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

/// How the command ended, as its exit code tells a script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Every row has its result and some were imported (others may have failed).
    Imported,
    /// The file is stored and the import completed, not followed (`--no-wait`).
    Stored,
    /// Every row failed: nothing was imported.
    EveryRowFailed,
    /// Refused, or not read, before anything was stored.
    NothingStored,
    /// Stopped on an error after the import was created; what was stored stays.
    Stopped,
    /// Interrupted (Ctrl-C).
    Interrupted,
}

impl Outcome {
    /// 0 when rows were imported (or stored, with `--no-wait`), 1 when every row failed, 2
    /// when nothing was stored (the file, the arguments or the import's state refused, or the
    /// file or the database could not be read), 3 when it stopped on an error once the import
    /// was created, 130 when interrupted (as a shell reports Ctrl-C).
    fn exit_code(self) -> u8 {
        match self {
            Outcome::Imported | Outcome::Stored => 0,
            Outcome::EveryRowFailed => 1,
            Outcome::NothingStored => 2,
            Outcome::Stopped => 3,
            Outcome::Interrupted => 130,
        }
    }
}

/// Runs the import and says how it ended (see [`Outcome::exit_code`]). Ctrl-C stops the
/// command, not the import: what it leaves is printed.
pub async fn import(arguments: Import, settings: &AppSettings) -> std::process::ExitCode {
    let stage = RefCell::new(Stage::Checking);
    // The import's future is dropped with this block, before anything is printed (a progress
    // bar it holds is left as it was).
    let ended = tokio::select! {
        biased;
        Ok(()) = tokio::signal::ctrl_c() => None,
        ended = import_file(arguments, settings, &stage) => Some(ended),
    };
    let outcome = match ended {
        None => {
            eprintln!("{}", interrupted(&stage.borrow()));
            Outcome::Interrupted
        }
        Some(Ok(outcome)) => outcome,
        Some(Err(stop)) => stop.report(),
    };
    std::process::ExitCode::from(outcome.exit_code())
}

/// Where the command is, for what an interruption leaves behind.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stage {
    /// Reading the arguments, the schema and the file: nothing is stored.
    Checking,
    /// Storing the file into the import: `parts` of its parts are in.
    Storing { import_id: String, parts: usize },
    /// The file is stored and the import completed: the imports worker decides its rows.
    Following { import_id: String },
}

/// What Ctrl-C at `stage` leaves, in a sentence for the terminal.
fn interrupted(stage: &Stage) -> String {
    match stage {
        Stage::Checking => "interrupted: nothing was stored".to_owned(),
        Stage::Storing { import_id, parts: 0 } => format!(
            "interrupted before import {import_id} held any of the file; run the same command again to store it and \
             follow the import (left empty, it is dropped after a day)"
        ),
        Stage::Storing { import_id, parts } => format!(
            "interrupted while storing the file: import {import_id} holds {} of it, whose rows are decided on the \
             server; run the same command again to store the rest and follow the import (left unfinished, it is \
             dropped after a day)",
            match parts {
                1 => "1 part".to_owned(),
                parts => format!("{parts} parts"),
            }
        ),
        Stage::Following { import_id } => format!(
            "interrupted: import {import_id} goes on on the server; run the same command again to follow it (or GET \
             /v1/imports/{import_id})"
        ),
    }
}

/// Why the command stopped before its end.
#[derive(Debug)]
enum Stop {
    /// The arguments, the file or the import's state refused before anything was stored: what
    /// to show, a line each.
    Refused(Vec<String>),
    /// Stopped before anything was stored: the file or the database could not be read.
    NotStored(anyhow::Error),
    /// Stopped on an error after the import was created: the whole sentence to show.
    Stopped(String),
}

impl Stop {
    fn refused(message: impl Into<String>) -> Self {
        Stop::Refused(vec![message.into()])
    }

    /// A refusal of the API's rules: its issues' messages (the schema's field list once), or
    /// its message.
    fn from_api(refusal: &platform::error::ApiError) -> Self {
        let messages: Vec<&str> = refusal.issues().iter().map(|issue| issue.message.as_str()).collect();
        if messages.is_empty() {
            return Stop::refused(refusal.message());
        }
        Stop::Refused(once_each_field_list(&messages))
    }

    fn report(self) -> Outcome {
        match self {
            Stop::Refused(messages) => {
                eprintln!("refused, nothing was stored:");
                for message in messages {
                    eprintln!("  {message}");
                }
                Outcome::NothingStored
            }
            Stop::NotStored(error) => {
                eprintln!("stopped, nothing was stored: {error:#}");
                Outcome::NothingStored
            }
            Stop::Stopped(message) => {
                eprintln!("{message}");
                Outcome::Stopped
            }
        }
    }
}

impl From<anyhow::Error> for Stop {
    fn from(error: anyhow::Error) -> Self {
        Stop::NotStored(error)
    }
}

impl From<tokio_postgres::Error> for Stop {
    fn from(error: tokio_postgres::Error) -> Self {
        Stop::NotStored(error.into())
    }
}

impl From<file::Rejected> for Stop {
    fn from(rejected: file::Rejected) -> Self {
        match rejected {
            file::Rejected::Refused(message) => Stop::refused(message),
            file::Rejected::Unreadable(error) => Stop::NotStored(error),
        }
    }
}

impl From<std::io::Error> for Stop {
    fn from(error: std::io::Error) -> Self {
        Stop::NotStored(error.into())
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

/// What the arguments say, read before anything else.
#[derive(Debug)]
struct Options {
    format: Format,
    encoding: domain::imports::Encoding,
    delimiter: Option<u8>,
    columns: std::collections::BTreeMap<String, Option<String>>,
}

/// Reads the arguments; a spreadsheet, or an option out of its values, is refused.
fn options(arguments: &Import) -> Result<Options, Stop> {
    let extension = arguments.file.extension().and_then(|extension| extension.to_str()).map(str::to_ascii_lowercase);
    if matches!(extension.as_deref(), Some("xlsx" | "xls" | "ods")) && arguments.format.is_none() {
        return Err(Stop::refused(
            "spreadsheet files are not read: save the sheet as CSV (in Excel: File > Save As > CSV UTF-8) and import \
             that",
        ));
    }
    let format = match arguments.format.as_deref() {
        Some(format) => Format::parse(format).ok_or_else(|| Stop::refused("--format is csv or ndjson"))?,
        None => match extension.as_deref() {
            Some("ndjson" | "jsonl") => Format::Ndjson,
            _ => Format::Csv,
        },
    };
    let encoding = match arguments.encoding.as_deref() {
        Some(encoding) => domain::imports::Encoding::parse(encoding).ok_or_else(|| {
            Stop::refused("--encoding is utf-8 or windows-1252 (latin1); UTF-16 is read from its byte order mark")
        })?,
        None => domain::imports::Encoding::Utf8,
    };
    let delimiter = match arguments.delimiter.as_deref() {
        Some(delimiter) => Some(
            domain::imports::parse_delimiter(delimiter)
                .ok_or_else(|| Stop::refused("--delimiter is \",\", \";\" or tab"))?,
        ),
        None => None,
    };
    if format == Format::Ndjson && delimiter.is_some() {
        return Err(Stop::refused("--delimiter applies to CSV files only"));
    }
    let mut columns = std::collections::BTreeMap::new();
    for column in &arguments.columns {
        let (header, key) =
            column.split_once('=').ok_or_else(|| Stop::refused("--column is Header=key (Header= ignores it)"))?;
        columns.insert(header.to_owned(), (!key.is_empty()).then(|| key.to_owned()));
    }
    if format == Format::Ndjson && !columns.is_empty() {
        return Err(Stop::refused("--column applies to CSV files only"));
    }
    if let Some(id) = &arguments.id
        && !domain::imports::valid_import_id(id)
    {
        return Err(Stop::refused("--id is 1 to 128 letters, digits and . _ : -"));
    }
    Ok(Options { format, encoding, delimiter, columns })
}

/// The import checked whole, ready to be stored: nothing is stored yet.
struct Prepared {
    client: deadpool_postgres::Client,
    space_id: String,
    import_id: String,
    schema: domain::catalog::SchemaEntry,
    settings: Settings,
    /// The file read: the one named, or its UTF-8 copy (kept until the parts are stored).
    source: PathBuf,
    _utf8_copy: Option<TemporaryFile>,
    /// A CSV file's layout and the bytes every part starts with.
    head: Option<CsvHead>,
}

/// Checks everything that can refuse the import before any of it is stored: the arguments,
/// the space and the schema, the column map, the file's header and each of its rows.
async fn prepare(arguments: &Import, settings: &AppSettings) -> Result<Prepared, Stop> {
    let options = options(arguments)?;
    let metadata =
        std::fs::metadata(&arguments.file).with_context(|| format!("cannot read {}", arguments.file.display()))?;
    let pool = platform::db::pool(settings.database_url()?, 2)?;
    let client = pool.get().await.context("cannot reach the database")?;
    let catalog = platform::readmodel::live_schema(&client, domain::catalog::CATALOG)
        .await?
        .context("the catalog has no live version: run migrate and apply a workspace first")?;
    let space_id = space(&client, &catalog, arguments.space.as_deref()).await?;
    let context = reads::catalog::write_context(&client, &catalog, &space_id, &arguments.schema)
        .await?
        .filter(|context| context.schema.schema_type != "event")
        .ok_or_else(|| Stop::refused(format!("no contact or object schema {:?} in the space", arguments.schema)))?;
    let import_settings = Settings {
        schema: context.schema.schema_id.clone(),
        format: options.format,
        file_name: arguments.file.file_name().and_then(|name| name.to_str()).map(str::to_owned),
        consent_label: arguments.consent.clone(),
        columns: options.columns,
        encoding: options.encoding,
        delimiter: options.delimiter,
    };
    domain::imports::check_columns(&import_settings, &context.schema.schema_type, &context.attributes)
        .map_err(|refusal| Stop::from_api(&answered(refusal)))?;
    // A UTF-16 file (its byte order mark says so) is read as UTF-8, written beside it first.
    let utf8_copy = file::utf16_as_utf8(&arguments.file)?;
    let source = utf8_copy.as_ref().map_or(arguments.file.clone(), |copy| copy.path().to_path_buf());
    let utf8 = options.encoding == domain::imports::Encoding::Utf8;
    let head = match options.format {
        Format::Csv => Some(file::csv_head(&source, options.delimiter, utf8)?),
        Format::Ndjson => None,
    };
    if let Some(head) = &head {
        // The header as the server reads each part's: the same reading, the same rules.
        let text = import_file::decode(&head.prefix, options.encoding).map_err(Stop::refused)?;
        if let Some(headers) = import_file::headers(&import_settings, &text).map_err(Stop::refused)? {
            let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
            domain::imports::check_header(&headers, &import_settings, &context.schema.schema_type, &context.attributes)
                .map_err(|refusal| Stop::from_api(&answered(refusal)))?;
        }
    }
    // The whole file, on a thread of its own so that Ctrl-C is heard meanwhile.
    let cancelled = Arc::new(AtomicBool::new(false));
    let _cancel_when_dropped = CancelWhenDropped(cancelled.clone());
    let (path, layout) = (source.clone(), head.as_ref().map(|head| head.layout));
    tokio::task::spawn_blocking(move || file::check_rows(&path, layout, utf8, &cancelled))
        .await
        .context("checking the file")??;
    let import_id = match &arguments.id {
        Some(id) => id.clone(),
        None => derived_id(&arguments.file, &metadata)?,
    };
    Ok(Prepared {
        client,
        space_id,
        import_id,
        schema: context.schema,
        settings: import_settings,
        source,
        _utf8_copy: utf8_copy,
        head,
    })
}

/// Sets its flag when dropped: a check on a blocking thread then stops at its next row.
struct CancelWhenDropped(Arc<AtomicBool>);

impl Drop for CancelWhenDropped {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

async fn import_file(arguments: Import, settings: &AppSettings, stage: &RefCell<Stage>) -> Result<Outcome, Stop> {
    let Prepared { mut client, space_id, import_id, schema, settings: import_settings, source, _utf8_copy, head } =
        prepare(&arguments, settings).await?;
    // From here on an interruption may leave the import behind (its create may be committed).
    *stage.borrow_mut() = Stage::Storing { import_id: import_id.clone(), parts: 0 };
    let created = store::create(&mut client, (&space_id, &import_id), &schema, &import_settings, None).await.map_err(
        |failed| match failed {
            store::Failed::Refusal(refusal) => Stop::refused(format!("{refusal} (--id)")),
            // Its commit may have been lost with the connection: the import may exist.
            failed => stopped_storing(&import_id, failed.into(), true),
        },
    )?;
    let format = import_settings.format;
    eprintln!("import {import_id}: {} into {} ({})", arguments.file.display(), arguments.schema, format.as_str());

    let mut parts = Parts {
        client: &mut client,
        space_id: &space_id,
        import_id: &import_id,
        stored: 0,
        starts: Vec::new(),
        stored_now: 0,
        most_rows: arguments.part_rows.max(1),
        stage,
    };
    let stored = store_file(&source, head.as_ref(), &mut parts).await;
    let (starts, stored_now) = (std::mem::take(&mut parts.starts), parts.stored_now);
    let total_parts = match stored {
        Ok(total_parts) => total_parts,
        Err(error) => return Err(stopped_storing(&import_id, error, created || stored_now > 0)),
    };
    if let Err(failed) = store::close(&mut client, (&space_id, &import_id), total_parts).await {
        return Err(stopped_storing(&import_id, failed.into(), created || stored_now > 0));
    }
    *stage.borrow_mut() = Stage::Following { import_id: import_id.clone() };
    if arguments.no_wait {
        println!("stored {total_parts} parts; follow it with GET /v1/imports/{import_id}");
        return Ok(Outcome::Stored);
    }
    follow(&client, &space_id, &import_id, &starts).await.map_err(|error| {
        Stop::Stopped(format!(
            "import {import_id}: following it failed: {error:#}; it goes on on the server: run the same command \
             again to follow it"
        ))
    })
}

/// Why storing the file stopped. A refusal of the import's state (a part stored before with
/// another body, an import completed with other parts) when this run stored nothing is a
/// refusal: the file is not the one the import holds.
fn stopped_storing(import_id: &str, error: anyhow::Error, stored_something: bool) -> Stop {
    match error.downcast_ref::<store::Failed>() {
        Some(store::Failed::Refusal(refusal)) if !stored_something => Stop::refused(format!(
            "{refusal}: this file is not the one import {import_id} was given; pass another --id"
        )),
        Some(store::Failed::Refusal(refusal)) => {
            Stop::Stopped(format!("import {import_id} stopped: {refusal}; pass another --id"))
        }
        _ => Stop::Stopped(format!(
            "import {import_id} stopped: {error:#}; what was stored stays: run the same command again to go on"
        )),
    }
}

/// Stores the file in parts, with a progress bar; answers how many parts it has.
async fn store_file(source: &Path, head: Option<&CsvHead>, parts: &mut Parts<'_>) -> anyhow::Result<i32> {
    let length = std::fs::metadata(source)?.len();
    let mut progress = platform::progress::Progress::new("storing the file", length, "bytes");
    match head {
        Some(head) => split_csv(source, head, parts, &mut progress).await?,
        None => split_lines(std::fs::File::open(source)?, parts, &mut progress).await?,
    }
    progress.finish(length);
    let total_parts = i32::try_from(parts.starts.len())?;
    // The check found rows; a file emptied since has none.
    anyhow::ensure!(total_parts > 0, "the file holds no rows any more");
    Ok(total_parts)
}

/// Where the parts go, and the first data row of each (for the summary's row numbers).
struct Parts<'a> {
    client: &'a mut deadpool_postgres::Client,
    space_id: &'a str,
    import_id: &'a str,
    stored: usize,
    starts: Vec<i64>,
    /// Parts this run stored (a rerun finds the others stored).
    stored_now: usize,
    most_rows: usize,
    stage: &'a RefCell<Stage>,
}

impl Parts<'_> {
    /// Stores a part (the file was checked whole before: see [`prepare`]).
    async fn store(&mut self, body: &[u8], rows: usize) -> anyhow::Result<()> {
        let part = i32::try_from(self.starts.len() + 1)?;
        self.starts.push(i64::try_from(self.stored)?);
        self.stored += rows;
        let rows = i32::try_from(rows)?;
        let stored_before = store::store_part(self.client, (self.space_id, self.import_id), part, body, rows).await?;
        if stored_before.is_none() {
            self.stored_now += 1;
        }
        *self.stage.borrow_mut() = Stage::Storing { import_id: self.import_id.to_owned(), parts: self.starts.len() };
        Ok(())
    }
}

/// Cuts a CSV file at record boundaries (a quoted field may hold line breaks, so the records
/// are read with the file's delimiter), each part with the file's head (its `sep=` line and
/// header) in front.
async fn split_csv(
    source: &Path,
    head: &CsvHead,
    parts: &mut Parts<'_>,
    progress: &mut platform::progress::Progress,
) -> anyhow::Result<()> {
    let data_at = u64::try_from(head.prefix.len())?;
    let mut file = std::fs::File::open(source)?;
    file.seek(SeekFrom::Start(data_at))?;
    let mut bytes = std::fs::File::open(source)?;
    let mut reader = file::csv_records(BufReader::new(file), head.layout.delimiter);
    let mut record = csv::ByteRecord::new();
    let mut prefix = head.prefix.clone();
    if !prefix.ends_with(b"\n") {
        prefix.push(b'\n');
    }
    let (mut start, mut rows) = (data_at, 0);
    let mut part = Vec::with_capacity(PART_BYTES + prefix.len());
    loop {
        let more = reader.read_byte_record(&mut record)?;
        let end = data_at + reader.position().byte();
        if more {
            rows += 1;
        }
        if rows > 0 && (!more || rows >= parts.most_rows || usize::try_from(end - start)? >= PART_BYTES) {
            part.clear();
            part.extend_from_slice(&prefix);
            bytes.seek(SeekFrom::Start(start))?;
            let length = usize::try_from(end - start)?;
            part.resize(prefix.len() + length, 0);
            bytes.read_exact(&mut part[prefix.len()..])?;
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
) -> anyhow::Result<Outcome> {
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
) -> anyhow::Result<Outcome> {
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
        let code = row.get::<_, Option<&str>>(2).unwrap_or("");
        let message = row_message(code, row.get::<_, Option<&str>>(3).unwrap_or(""));
        println!("  row {}{key}: {code}: {message}", start + i64::from(number));
    }
    let failed_total = rows["failed"].as_i64().unwrap_or(0);
    if failed_total > SHOWN_FAILURES {
        println!("  ... and {} more: GET /v1/imports/{import_id}/rows?status=failed", failed_total - SHOWN_FAILURES);
    }
    let total = rows["total"].as_i64().unwrap_or(0);
    if total > 0 && failed_total == total {
        eprintln!(
            "every row failed: nothing was imported. Fix the file, or the schema (then the same file again is this \
             import again: give it a new id, --id {import_id}-2, to decide its rows anew), and run the command again"
        );
        return Ok(Outcome::EveryRowFailed);
    }
    Ok(Outcome::Imported)
}

/// A failed row's message as the command shows it: where the API's message names a setting of
/// the import, the command names its own option.
fn row_message(code: &str, message: &str) -> String {
    if code == platform::error::Code::ConsentSourceRequired.as_str() {
        return "the row grants consent or subscribes to topics, and no consent source was given: pass --consent \
                \"<source>\" (how and when these people agreed)"
            .to_owned();
    }
    message.to_owned()
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
async fn space(client: &impl GenericClient, catalog: &str, named: Option<&str>) -> Result<String, Stop> {
    let spaces: Vec<(String, String)> = client
        .query(&format!("SELECT space_id, slug FROM {catalog}.spaces ORDER BY slug"), &[])
        .await
        .context("reading the spaces")?
        .into_iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let slugs = || spaces.iter().map(|(_, slug)| slug.as_str()).collect::<Vec<_>>().join(", ");
    match named {
        Some(named) => spaces
            .iter()
            .find(|(id, slug)| id == named || slug == named)
            .map(|(id, _)| id.clone())
            .ok_or_else(|| Stop::refused(format!("no space {named:?}: --space is one of {}", slugs()))),
        None if spaces.len() == 1 => Ok(spaces[0].0.clone()),
        None => Err(Stop::refused(format!("name the space with --space ({})", slugs()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Command {
        #[command(flatten)]
        import: Import,
    }

    fn arguments(line: &[&str]) -> Import {
        use clap::Parser;
        Command::try_parse_from(std::iter::once("import").chain(line.iter().copied())).expect("valid arguments").import
    }

    /// The refusal's lines, or why it is no refusal.
    fn refused<T: std::fmt::Debug>(result: Result<T, Stop>) -> Vec<String> {
        match result {
            Err(Stop::Refused(messages)) => messages,
            other => panic!("not a refusal: {other:?}"),
        }
    }

    #[test]
    fn each_way_the_command_ends_has_its_exit_code() {
        let codes = [
            Outcome::Imported,
            Outcome::Stored,
            Outcome::EveryRowFailed,
            Outcome::NothingStored,
            Outcome::Stopped,
            Outcome::Interrupted,
        ]
        .map(Outcome::exit_code);
        assert_eq!(codes, [0, 0, 1, 2, 3, 130]);
        // Whatever stops it before anything is stored is exit 2, refused or not read.
        assert_eq!(Stop::refused("a refusal").report(), Outcome::NothingStored);
        assert_eq!(Stop::NotStored(anyhow::anyhow!("no database")).report(), Outcome::NothingStored);
        assert_eq!(Stop::Stopped("import x stopped".to_owned()).report(), Outcome::Stopped);
    }

    #[test]
    fn a_spreadsheet_and_options_out_of_their_values_are_refused_before_anything_is_read() {
        let sheet = refused(options(&arguments(&["people.xlsx", "--schema", "contacts"])));
        assert!(sheet[0].contains("save the sheet as CSV"), "{sheet:?}");
        for (line, expected) in [
            (&["people.csv", "--schema", "contacts", "--format", "xml"][..], "--format is csv or ndjson"),
            (&["people.csv", "--schema", "contacts", "--encoding", "ebcdic"], "--encoding is utf-8"),
            (&["people.csv", "--schema", "contacts", "--delimiter", "|"], "--delimiter is"),
            (&["people.csv", "--schema", "contacts", "--column", "Email"], "--column is Header=key"),
            (&["people.ndjson", "--schema", "contacts", "--column", "a=b"], "applies to CSV files only"),
            (&["people.csv", "--schema", "contacts", "--id", "a/b"], "--id is 1 to 128"),
        ] {
            let messages = refused(options(&arguments(line)));
            assert!(messages[0].contains(expected), "{line:?}: {messages:?}");
        }
        let read = options(&arguments(&["people.csv", "--schema", "contacts", "--delimiter", ";"])).expect("options");
        assert_eq!((read.format, read.delimiter), (Format::Csv, Some(b';')));
    }

    #[test]
    fn ctrl_c_says_what_it_leaves_at_each_stage() {
        assert_eq!(interrupted(&Stage::Checking), "interrupted: nothing was stored");
        let creating = interrupted(&Stage::Storing { import_id: "file-people-1".to_owned(), parts: 0 });
        assert!(creating.starts_with("interrupted before import file-people-1 held any of the file"), "{creating}");
        let storing = interrupted(&Stage::Storing { import_id: "file-people-1".to_owned(), parts: 1 });
        assert!(storing.contains("import file-people-1 holds 1 part of it"), "{storing}");
        assert!(storing.contains("run the same command again to store the rest"), "{storing}");
        let following = interrupted(&Stage::Following { import_id: "file-people-1".to_owned() });
        assert_eq!(
            following,
            "interrupted: import file-people-1 goes on on the server; run the same command again to follow it (or \
             GET /v1/imports/file-people-1)"
        );
    }

    #[test]
    fn a_row_without_a_consent_source_names_the_commands_option() {
        let message = row_message(
            "consent_source_required",
            "the row grants consent or subscribes to topics, and the import states no consent source (consent.label)",
        );
        assert!(message.contains("--consent \"<source>\"") && !message.contains("consent.label"), "{message}");
        assert_eq!(row_message("missing_field", "no key"), "no key");
    }

    #[test]
    fn a_conflict_with_what_the_import_holds_is_a_refusal_when_this_run_stored_nothing() {
        let conflict = || {
            anyhow::Error::from(store::Failed::Refusal(super::super::decide::Refusal::OtherBody {
                import_id: "weekly".to_owned(),
                part: 1,
            }))
        };
        let messages = refused(Err::<(), _>(stopped_storing("weekly", conflict(), false)));
        assert!(messages[0].ends_with("pass another --id"), "{messages:?}");
        assert!(matches!(stopped_storing("weekly", conflict(), true), Stop::Stopped(_)));
        let Stop::Stopped(message) = stopped_storing("weekly", anyhow::anyhow!("connection reset"), true) else {
            panic!("stopped")
        };
        assert!(message.contains("run the same command again"), "{message}");
    }

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
