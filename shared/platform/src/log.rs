//! The event log client: appends through a per-process batcher, and reads in position order.
//!
//! Positions come from the single `log_head` counter row, updated as the last statement but
//! one before COMMIT (the event rows follow it in one INSERT). Its row lock is held until the
//! commit is visible, so positions become visible in order and without gaps, and a follower
//! that reads `position > checkpoint` can never miss a late commit. To win back the group
//! commit that the lock costs, one task per process groups concurrent commands into one
//! transaction, each inside its own savepoint, so one command's lost race fails only itself.

use anyhow::Context;
use chrono::{DateTime, Utc};
use deadpool_postgres::{Pool, Transaction};
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::events::LogEvent;

/// Who and what caused an append.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    pub space_id: Option<String>,
    pub actor_key_id: Option<String>,
    pub actor_user_id: Option<String>,
    pub request_id: Option<String>,
    pub idempotency_key: Option<String>,
}

/// The version a stream must be at for the append to go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpectedVersion {
    /// The stream must not exist yet.
    NoStream,
    /// The stream must be at exactly this version.
    Exactly(i64),
    /// No expectation: append after whatever is there.
    Any,
}

#[derive(Debug, Clone)]
pub struct NewEvent {
    pub event: LogEvent,
    /// The data subject the event is about (record, user), for erasure and audit trails.
    pub subject_id: Option<String>,
    pub occurred_at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct StreamAppend {
    pub stream_id: String,
    pub expected: ExpectedVersion,
    pub events: Vec<NewEvent>,
}

impl StreamAppend {
    /// One event, about no data subject, on `stream_id` at `expected`, occurring at `at_ms`.
    pub fn one(stream_id: String, expected: ExpectedVersion, event: LogEvent, at_ms: i64) -> Self {
        Self {
            stream_id,
            expected,
            events: vec![NewEvent { event, subject_id: None, occurred_at: crate::time::from_millis(at_ms) }],
        }
    }
}

/// A guard's statement parameter.
pub type Param = Box<dyn ToSql + Send + Sync>;

/// A write-side claim run inside the command's savepoint (for example a unique identity).
/// A unique violation, or a row count other than the one required, fails the command with
/// `conflict`.
pub struct Guard {
    pub sql: &'static str,
    pub params: Vec<Box<dyn ToSql + Send + Sync>>,
    pub conflict: AppendError,
    /// When set, the statement must affect exactly this many rows.
    pub expect_rows: Option<u64>,
    /// The same claim as one row of a statement that many commands' claims share (see
    /// [`SetForm`]); `None` for a claim that only runs on its own.
    pub set: Option<SetForm>,
}

impl Guard {
    /// A statement that fails the command only on a unique violation.
    pub fn unique(sql: &'static str, params: Vec<Box<dyn ToSql + Send + Sync>>, conflict: AppendError) -> Self {
        Self { sql, params, conflict, expect_rows: None, set: None }
    }

    /// A statement that must affect exactly one row.
    pub fn exactly_one(sql: &'static str, params: Vec<Box<dyn ToSql + Send + Sync>>, conflict: AppendError) -> Self {
        Self { sql, params, conflict, expect_rows: Some(1), set: None }
    }

    /// A stream that a decision read but does not append to is still at `version` (0: it does
    /// not exist); otherwise the command fails with the internal `stream_moved` (decide again).
    pub fn stream_at(stream_id: &str, version: i64) -> Self {
        Self::exactly_one(
            "SELECT 1 WHERE COALESCE((SELECT version FROM streams WHERE stream_id = $1), 0) = $2",
            vec![Box::new(stream_id.to_owned()), Box::new(version)],
            AppendError::Conflict {
                code: crate::error::Code::StreamMoved,
                message: format!("{stream_id} changed while this write was decided; retry"),
            },
        )
    }

    /// The guard with its set form: `sql` takes one array per column of `row` (`$1` the first
    /// column's values, in the batch's order) and does for every row what the guard's own
    /// statement does for its parameters, affecting one row per guard when the guard expects
    /// one.
    pub fn with_set(mut self, sql: &'static str, row: Vec<SetValue>) -> Self {
        self.set = Some(SetForm { sql, row, expect_rows: self.expect_rows });
        self
    }

    /// As [`Guard::with_set`], for a guard whose row stands for a claim on several rows (so
    /// the set statement does not affect the rows the guard's own statement does): the set
    /// statement affects `rows` rows per guard when every claim holds.
    pub fn with_set_counting(self, sql: &'static str, row: Vec<SetValue>, rows: u64) -> Self {
        let mut guard = self.with_set(sql, row);
        if let Some(set) = guard.set.as_mut() {
            set.expect_rows = Some(rows);
        }
        guard
    }
}

/// A guard as one row of a multi-row statement. When every command of a batch has only
/// guards with set forms and only inserts (no guard that releases), the batch runs one
/// statement per set form instead of one per guard; if that statement is refused (a unique
/// violation, fewer rows than guards), the batch is written again a command at a time, so
/// exactly the commands that would have failed alone fail.
pub struct SetForm {
    pub sql: &'static str,
    pub row: Vec<SetValue>,
    /// The rows the set statement affects for this guard when it holds (`None`: any number,
    /// for a guard that only claims uniqueness).
    pub expect_rows: Option<u64>,
}

/// One column value of a [`SetForm`] row.
#[derive(Debug, Clone)]
pub enum SetValue {
    Text(Option<String>),
    BigInt(i64),
    Int(i32),
    Bytes(Vec<u8>),
    Json(serde_json::Value),
    Uuid(Uuid),
}

/// The values of one column of a set form, as the array parameter the statement takes.
enum SetColumn {
    Text(Vec<Option<String>>),
    BigInt(Vec<i64>),
    Int(Vec<i32>),
    Bytes(Vec<Vec<u8>>),
    Json(Vec<serde_json::Value>),
    Uuid(Vec<Uuid>),
}

impl SetColumn {
    fn of(first: &SetValue) -> Self {
        match first {
            SetValue::Text(_) => Self::Text(Vec::new()),
            SetValue::BigInt(_) => Self::BigInt(Vec::new()),
            SetValue::Int(_) => Self::Int(Vec::new()),
            SetValue::Bytes(_) => Self::Bytes(Vec::new()),
            SetValue::Json(_) => Self::Json(Vec::new()),
            SetValue::Uuid(_) => Self::Uuid(Vec::new()),
        }
    }

    /// Adds a value; false when it is not of the column's type.
    fn push(&mut self, value: &SetValue) -> bool {
        match (self, value) {
            (Self::Text(values), SetValue::Text(value)) => values.push(value.clone()),
            (Self::BigInt(values), SetValue::BigInt(value)) => values.push(*value),
            (Self::Int(values), SetValue::Int(value)) => values.push(*value),
            (Self::Bytes(values), SetValue::Bytes(value)) => values.push(value.clone()),
            (Self::Json(values), SetValue::Json(value)) => values.push(value.clone()),
            (Self::Uuid(values), SetValue::Uuid(value)) => values.push(*value),
            _ => return false,
        }
        true
    }

    fn param(&self) -> &(dyn ToSql + Sync) {
        match self {
            Self::Text(values) => values,
            Self::BigInt(values) => values,
            Self::Int(values) => values,
            Self::Bytes(values) => values,
            Self::Json(values) => values,
            Self::Uuid(values) => values,
        }
    }
}

/// One command's append: its streams and guards, atomic with each other.
pub struct AppendRequest {
    pub metadata: Metadata,
    pub streams: Vec<StreamAppend>,
    pub guards: Vec<Guard>,
}

impl AppendRequest {
    pub fn new(metadata: Metadata, streams: Vec<StreamAppend>, guards: Vec<Guard>) -> Self {
        Self { metadata, streams, guards }
    }

    /// The encoded size of the request's events.
    fn event_bytes(&self) -> usize {
        self.streams.iter().flat_map(|stream| &stream.events).map(|event| event.event.encoded_len()).sum()
    }

    /// A write the system makes on its own in a space (a worker's, not a caller's).
    pub fn in_space(space_id: &str, streams: Vec<StreamAppend>, guards: Vec<Guard>) -> Self {
        Self::new(Metadata::in_space(space_id), streams, guards)
    }
}

impl Metadata {
    /// The metadata of a write the system makes on its own in `space_id`: no key, user,
    /// request or idempotency key.
    pub fn in_space(space_id: &str) -> Self {
        Self { space_id: Some(space_id.to_owned()), ..Self::default() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Appended {
    /// Position of the command's last event (0 when it appended none).
    pub last_position: i64,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum AppendError {
    /// A stream was not at the expected version: another writer won the race.
    #[error("stream {stream_id} is not at the expected version")]
    WrongVersion { stream_id: String },
    /// A guard's claim collided with an existing one.
    #[error("{code}: {message}")]
    Conflict { code: crate::error::Code, message: String },
    /// The database refused the transaction; nothing was written.
    #[error("the log is unavailable: {0}")]
    Unavailable(String),
    /// The database refused a value of this command (a data exception, a program limit):
    /// retrying cannot help. Only this command fails; the rest of its batch commits.
    #[error("the database refused a value of the command: {0}")]
    Refused(String),
    /// A statement of this command failed for a reason of ours (a defect). Only this command
    /// fails.
    #[error("a statement of the command failed: {0}")]
    Failed(String),
    /// The connection failed during COMMIT: the append may or may not have happened.
    #[error("the outcome of the append is unknown: {0}")]
    OutcomeUnknown(String),
}

impl From<tokio_postgres::Error> for AppendError {
    fn from(error: tokio_postgres::Error) -> Self {
        match crate::db::classify(&error) {
            crate::db::Failure::Transient => Self::Unavailable(error.to_string()),
            crate::db::Failure::Refused => Self::Refused(error.to_string()),
            crate::db::Failure::Defect => Self::Failed(format!("{error:#}")),
        }
    }
}

impl From<deadpool_postgres::PoolError> for AppendError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        Self::Unavailable(error.to_string())
    }
}

impl From<anyhow::Error> for AppendError {
    /// Classifies a database failure inside `error`; anything else is a defect.
    fn from(error: anyhow::Error) -> Self {
        match error.downcast::<tokio_postgres::Error>() {
            Ok(database) => database.into(),
            Err(error) => match error.downcast::<deadpool_postgres::PoolError>() {
                Ok(pool) => pool.into(),
                Err(error) => Self::Failed(format!("{error:#}")),
            },
        }
    }
}

/// A stored event as followers read it.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub position: i64,
    pub event_id: Uuid,
    pub stream_id: String,
    pub stream_version: i64,
    pub event_type: String,
    pub payload: Vec<u8>,
    pub space_id: Option<String>,
    pub actor_key_id: Option<String>,
    pub subject_id: Option<String>,
    pub occurred_at: DateTime<Utc>,
    pub recorded_at: DateTime<Utc>,
}

/// The columns of `events` that [`StoredEvent::from_row`] reads, in its order.
pub const EVENT_COLUMNS: &str = "position, event_id, stream_id, stream_version, event_type, payload, space_id, \
                                 actor_key_id, subject_id, occurred_at, recorded_at";
/// How many columns [`EVENT_COLUMNS`] names.
const EVENT_COLUMN_COUNT: usize = 11;

impl StoredEvent {
    /// A row of `SELECT {EVENT_COLUMNS}`.
    pub fn from_row(row: &tokio_postgres::Row) -> Self {
        Self {
            position: row.get(0),
            event_id: row.get(1),
            stream_id: row.get(2),
            stream_version: row.get(3),
            event_type: row.get(4),
            payload: row.get(5),
            space_id: row.get(6),
            actor_key_id: row.get(7),
            subject_id: row.get(8),
            occurred_at: row.get(9),
            recorded_at: row.get(10),
        }
    }

    pub fn decode(&self) -> anyhow::Result<LogEvent> {
        LogEvent::decode(&self.event_type, &self.payload)
            .with_context(|| format!("decoding {} at position {}", self.event_type, self.position))
    }
}

/// The channel notified (after commit, once per batch) with the new head position.
pub const LOG_CHANNEL: &str = "log_appended";

struct Job {
    request: AppendRequest,
    reply: oneshot::Sender<Result<Appended, AppendError>>,
}

/// Handle to this process's append batcher.
#[derive(Clone)]
pub struct EventLog {
    jobs: mpsc::Sender<Job>,
}

impl EventLog {
    /// Starts the batcher task. `batch_max` bounds the commands grouped in one transaction,
    /// and [`BATCH_BYTES`] their events' bytes.
    pub fn start(pool: Pool, batch_max: usize) -> Self {
        Self::start_bounded(pool, batch_max, BATCH_BYTES)
    }

    /// Starts the batcher task with both bounds given (`APP__APPEND__*`).
    pub fn start_bounded(pool: Pool, batch_max: usize, batch_bytes: usize) -> Self {
        let (jobs, receiver) = mpsc::channel(batch_max.max(1) * 4);
        tokio::spawn(run_batcher(pool, receiver, batch_max.max(1), batch_bytes.max(1)));
        Self { jobs }
    }

    #[tracing::instrument(skip_all, fields(streams = request.streams.len()))]
    pub async fn append(&self, request: AppendRequest) -> Result<Appended, AppendError> {
        let (reply, outcome) = oneshot::channel();
        self.jobs
            .send(Job { request, reply })
            .await
            .map_err(|_| AppendError::Unavailable("the append batcher has stopped".to_owned()))?;
        outcome.await.map_err(|_| AppendError::OutcomeUnknown("the append batcher stopped mid-append".to_owned()))?
    }
}

/// The most event bytes one transaction writes (unless one command alone writes more). The
/// log's head row stays locked from the events' insert until the commit is flushed, and every
/// other process's append waits for it: a batch of 500 rendered emails (several megabytes)
/// held it for tens of milliseconds, which a live request beside a broadcast waited out.
pub const BATCH_BYTES: usize = 256 * 1024;

async fn run_batcher(pool: Pool, mut receiver: mpsc::Receiver<Job>, batch_max: usize, batch_bytes: usize) {
    let mut jobs = Vec::with_capacity(batch_max);
    while receiver.recv_many(&mut jobs, batch_max).await > 0 {
        for batch in by_bytes(std::mem::take(&mut jobs), batch_bytes) {
            append_batch(&pool, batch).await;
        }
    }
}

/// Splits `jobs`, in order, into batches of at most `bytes` of events each (a command larger
/// than that is a batch of its own).
fn by_bytes(jobs: Vec<Job>, bytes: usize) -> Vec<Vec<Job>> {
    if jobs.len() <= 1 {
        // A lone command (most live requests) is a batch whatever its size: nothing to measure.
        return if jobs.is_empty() { Vec::new() } else { vec![jobs] };
    }
    let mut batches: Vec<Vec<Job>> = Vec::new();
    let mut filled = 0;
    for job in jobs {
        let size = job.request.event_bytes();
        match batches.last_mut() {
            Some(batch) if filled + size <= bytes => batch.push(job),
            _ => {
                batches.push(vec![job]);
                filled = 0;
            }
        }
        filled += size;
    }
    batches
}

/// Row values of one event, positions assigned once the batch is known.
struct PendingRow {
    event_id: Uuid,
    stream_id: String,
    stream_version: i64,
    event_type: String,
    payload: Vec<u8>,
    metadata_index: usize,
    subject_id: Option<String>,
    occurred_at: DateTime<Utc>,
}

async fn append_batch(pool: &Pool, jobs: Vec<Job>) {
    let started = std::time::Instant::now();
    metrics::histogram!("append_batch_commands").record(jobs.len() as f64);
    let mut requests = Vec::with_capacity(jobs.len());
    let mut replies = Vec::with_capacity(jobs.len());
    for job in jobs {
        requests.push(job.request);
        replies.push(job.reply);
    }
    let outcomes = match write_batch(pool, &requests).await {
        Ok((outcomes, head)) => {
            if head > 0 {
                notify_appended(pool, head).await;
            }
            outcomes
        }
        Err(error) => requests.iter().map(|_| Err(error.clone())).collect(),
    };
    metrics::histogram!("append_batch_seconds").record(started.elapsed().as_secs_f64());
    for (reply, outcome) in replies.into_iter().zip(outcomes) {
        if let Err(error) = &outcome {
            let kind = match error {
                AppendError::WrongVersion { .. } | AppendError::Conflict { .. } => "refused",
                AppendError::Refused(_) | AppendError::Failed(_) => "failed",
                AppendError::Unavailable(_) | AppendError::OutcomeUnknown(_) => "unavailable",
            };
            metrics::counter!("append_failures_total", "kind" => kind).increment(1);
        }
        let _ = reply.send(outcome);
    }
}

/// Notifies followers after the commit, once per batch (never inside the append transaction).
async fn notify_appended(pool: &Pool, head: i64) {
    let Ok(client) = pool.get().await else { return };
    let payload = head.to_string();
    let notified = async {
        let statement = client.prepare_cached("SELECT pg_notify($1, $2)").await?;
        client.execute(&statement, &[&LOG_CHANNEL, &payload]).await
    };
    if let Err(error) = notified.await {
        tracing::warn!(%error, "could not notify followers; they fall back to polling");
    }
}

type BatchOutcome = (Vec<Result<Appended, AppendError>>, i64);

/// Writes a batch. The fast path writes the whole batch with one statement per table (see
/// [`SetBatch`]) when every command allows it, and otherwise sends every command's statements
/// at once (pipelined); neither uses savepoints. If any command is refused (lost race, guard
/// conflict) the transaction is rolled back and the batch is written again with a savepoint
/// per command, so only the refused commands fail.
async fn write_batch(pool: &Pool, requests: &[AppendRequest]) -> Result<BatchOutcome, AppendError> {
    let mut client = pool.get().await.map_err(|error| AppendError::Unavailable(error.to_string()))?;
    let first_try = match SetBatch::of(requests) {
        Some(batch) => write_set(&mut client, requests, batch).await,
        None => write_pipelined(&mut client, requests).await,
    };
    match first_try {
        Ok(outcome) => Ok(outcome),
        Err(Fallback::Isolate) => write_isolated(&mut client, requests).await,
        Err(Fallback::Fail(error)) => Err(error),
    }
}

enum Fallback {
    /// Some command was refused; write again with a savepoint per command.
    Isolate,
    Fail(AppendError),
}

async fn write_pipelined(
    client: &mut deadpool_postgres::Client,
    requests: &[AppendRequest],
) -> Result<BatchOutcome, Fallback> {
    let transaction = client.transaction().await.map_err(|error| Fallback::Fail(unavailable(error)))?;
    // The plan settings (`db::KEYED_PLANS`) go out first, pipelined with the statements
    // (polled first, sent first).
    let (keyed, staged) = tokio::join!(
        transaction.batch_execute(crate::db::KEYED_PLANS),
        futures_util::future::join_all(requests.iter().enumerate().map(|(index, request)| stage_request(
            &transaction,
            request,
            index
        )),)
    );
    keyed.map_err(|error| Fallback::Fail(unavailable(error)))?;
    let mut rows_per_request = Vec::with_capacity(requests.len());
    for outcome in staged {
        match outcome {
            Ok(rows) => rows_per_request.push(rows),
            Err(_) => {
                let _ = transaction.rollback().await;
                return Err(Fallback::Isolate);
            }
        }
    }
    let outcomes = rows_per_request.iter().map(|_| Some(Ok(()))).collect();
    finish_batch(transaction, requests, outcomes, rows_per_request).await.map_err(Fallback::Fail)
}

async fn write_isolated(
    client: &mut deadpool_postgres::Client,
    requests: &[AppendRequest],
) -> Result<BatchOutcome, AppendError> {
    let transaction = client.transaction().await.map_err(unavailable)?;
    transaction.batch_execute(crate::db::KEYED_PLANS).await.map_err(unavailable)?;
    let mut outcomes: Vec<Option<Result<(), AppendError>>> = Vec::with_capacity(requests.len());
    let mut rows_per_request: Vec<Vec<PendingRow>> = Vec::with_capacity(requests.len());
    for (index, request) in requests.iter().enumerate() {
        transaction.batch_execute("SAVEPOINT command").await.map_err(unavailable)?;
        match stage_request(&transaction, request, index).await {
            Ok(rows) => {
                transaction.batch_execute("RELEASE SAVEPOINT command").await.map_err(unavailable)?;
                rows_per_request.push(rows);
                outcomes.push(Some(Ok(())));
            }
            Err(Staging::Refused(error)) => {
                transaction.batch_execute("ROLLBACK TO SAVEPOINT command").await.map_err(unavailable)?;
                rows_per_request.push(Vec::new());
                outcomes.push(Some(Err(error)));
            }
            Err(Staging::Failed(error)) => return Err(unavailable(error)),
        }
    }
    finish_batch(transaction, requests, outcomes, rows_per_request).await
}

/// A batch written with one statement per table: every stream change of one kind in one
/// statement, every guard of one set form in one statement. Possible when no stream appears
/// twice in the batch and every guard has a set form.
struct SetBatch {
    /// `(request, stream)` indexes of the streams that must not exist yet.
    created: Vec<(usize, usize)>,
    /// `(request, stream, expected version)` of the streams that must be at a version.
    advanced: Vec<(usize, usize, i64)>,
    /// `(request, stream)` of the streams appended to whatever their version.
    extended: Vec<(usize, usize)>,
    /// Per set form (in order of first appearance): its statement, its columns and the rows
    /// it must affect (`None` when any guard of the form only guards uniqueness).
    guards: Vec<(&'static str, Vec<SetColumn>, Option<u64>)>,
}

impl SetBatch {
    fn of(requests: &[AppendRequest]) -> Option<Self> {
        let mut batch =
            SetBatch { created: Vec::new(), advanced: Vec::new(), extended: Vec::new(), guards: Vec::new() };
        let mut seen = std::collections::HashSet::new();
        for (index, request) in requests.iter().enumerate() {
            for (stream_index, stream) in request.streams.iter().enumerate() {
                if stream.events.is_empty() {
                    continue;
                }
                if !seen.insert(stream.stream_id.as_str()) {
                    return None;
                }
                match stream.expected {
                    ExpectedVersion::NoStream => batch.created.push((index, stream_index)),
                    ExpectedVersion::Exactly(version) => batch.advanced.push((index, stream_index, version)),
                    ExpectedVersion::Any => batch.extended.push((index, stream_index)),
                }
            }
            for guard in &request.guards {
                let set = guard.set.as_ref()?;
                let position = match batch.guards.iter().position(|(sql, _, _)| *sql == set.sql) {
                    Some(position) => position,
                    None => {
                        batch.guards.push((set.sql, set.row.iter().map(SetColumn::of).collect(), Some(0)));
                        batch.guards.len() - 1
                    }
                };
                let (_, columns, expected) = &mut batch.guards[position];
                if columns.len() != set.row.len() {
                    return None;
                }
                for (column, value) in columns.iter_mut().zip(&set.row) {
                    if !column.push(value) {
                        return None;
                    }
                }
                *expected = match (*expected, set.expect_rows) {
                    (Some(total), Some(rows)) => Some(total + rows),
                    _ => None,
                };
            }
        }
        Some(batch)
    }
}

/// Writes the batch with one statement per table; any refusal (a stream not at its version,
/// a unique violation, a guard affecting fewer rows than it must) sends the batch to the
/// command-at-a-time path.
async fn write_set(
    client: &mut deadpool_postgres::Client,
    requests: &[AppendRequest],
    batch: SetBatch,
) -> Result<BatchOutcome, Fallback> {
    let transaction = client.transaction().await.map_err(|error| Fallback::Fail(unavailable(error)))?;
    let stream = |(index, stream_index): (usize, usize)| &requests[index].streams[stream_index];
    let created_ids: Vec<&str> = batch.created.iter().map(|at| stream(*at).stream_id.as_str()).collect();
    let created_counts: Vec<i64> = batch.created.iter().map(|at| stream(*at).events.len() as i64).collect();
    let advanced_ids: Vec<&str> =
        batch.advanced.iter().map(|(index, at, _)| stream((*index, *at)).stream_id.as_str()).collect();
    let advanced_from: Vec<i64> = batch.advanced.iter().map(|(_, _, version)| *version).collect();
    let advanced_to: Vec<i64> =
        batch.advanced.iter().map(|(index, at, version)| version + stream((*index, *at)).events.len() as i64).collect();
    let extended_ids: Vec<&str> = batch.extended.iter().map(|at| stream(*at).stream_id.as_str()).collect();
    let extended_counts: Vec<i64> = batch.extended.iter().map(|at| stream(*at).events.len() as i64).collect();

    let create = async {
        if created_ids.is_empty() {
            return Ok(0);
        }
        let statement = transaction
            .prepare_cached("INSERT INTO streams (stream_id, version) SELECT * FROM unnest($1::text[], $2::bigint[])")
            .await?;
        transaction.execute(&statement, &[&created_ids, &created_counts]).await
    };
    let advance = async {
        if advanced_ids.is_empty() {
            return Ok(0);
        }
        let statement = transaction
            .prepare_cached(
                "UPDATE streams s SET version = v.next FROM unnest($1::text[], $2::bigint[], $3::bigint[])
                     AS v(stream_id, expected, next)
                 WHERE s.stream_id = v.stream_id AND s.version = v.expected",
            )
            .await?;
        transaction.execute(&statement, &[&advanced_ids, &advanced_from, &advanced_to]).await
    };
    let extend = async {
        if extended_ids.is_empty() {
            return Ok(Vec::new());
        }
        let statement = transaction
            .prepare_cached(
                "INSERT INTO streams (stream_id, version) SELECT * FROM unnest($1::text[], $2::bigint[])
                 ON CONFLICT (stream_id) DO UPDATE SET version = streams.version + EXCLUDED.version
                 RETURNING stream_id, version",
            )
            .await?;
        transaction.query(&statement, &[&extended_ids, &extended_counts]).await
    };
    let guards = futures_util::future::join_all(batch.guards.iter().map(|(sql, columns, _)| async {
        let statement = transaction.prepare_cached(sql).await?;
        let params: Vec<&(dyn ToSql + Sync)> = columns.iter().map(SetColumn::param).collect();
        transaction.execute(&statement, &params).await
    }));
    // The plan settings (`db::KEYED_PLANS`) go out first, pipelined with the statements
    // (polled first, sent first).
    let (keyed, created, advanced, extended, guarded) =
        tokio::join!(transaction.batch_execute(crate::db::KEYED_PLANS), create, advance, extend, guards);
    keyed.map_err(|error| Fallback::Fail(unavailable(error)))?;

    // Any failure, refused or not, goes to the command-at-a-time path, which tells whose it
    // was (after one failed statement the others fail as the transaction is aborted).
    let (created, advanced, extended) = (created.ok(), advanced.ok(), extended.ok());
    let guarded: Vec<Option<u64>> = guarded.into_iter().map(Result::ok).collect();
    if extended.is_none()
        || created != Some(created_ids.len() as u64)
        || advanced != Some(advanced_ids.len() as u64)
        || guarded
            .iter()
            .zip(&batch.guards)
            .any(|(rows, (_, _, expected))| rows.is_none() || expected.is_some_and(|expected| Some(expected) != *rows))
    {
        return refuse(transaction).await;
    }
    let extended_versions: std::collections::HashMap<String, i64> =
        extended.unwrap_or_default().iter().map(|row| (row.get(0), row.get(1))).collect();

    let mut rows_per_request: Vec<Vec<PendingRow>> = requests.iter().map(|_| Vec::new()).collect();
    for (index, request) in requests.iter().enumerate() {
        for stream in &request.streams {
            let count = stream.events.len() as i64;
            if count == 0 {
                continue;
            }
            let first_version = match stream.expected {
                ExpectedVersion::NoStream => 1,
                ExpectedVersion::Exactly(version) => version + 1,
                ExpectedVersion::Any => match extended_versions.get(&stream.stream_id) {
                    Some(version) => version - count + 1,
                    None => return refuse(transaction).await,
                },
            };
            rows_per_request[index].extend(pending_rows(stream, first_version, index));
        }
    }
    let outcomes = rows_per_request.iter().map(|_| Some(Ok(()))).collect();
    finish_batch(transaction, requests, outcomes, rows_per_request).await.map_err(Fallback::Fail)
}

/// Rolls back a batch that some command refused, to write it again a command at a time.
async fn refuse(transaction: Transaction<'_>) -> Result<BatchOutcome, Fallback> {
    let _ = transaction.rollback().await;
    Err(Fallback::Isolate)
}

/// The rows of a stream's events, from `first_version` on.
fn pending_rows(stream: &StreamAppend, first_version: i64, metadata_index: usize) -> Vec<PendingRow> {
    stream
        .events
        .iter()
        .enumerate()
        .map(|(offset, event)| PendingRow {
            event_id: Uuid::now_v7(),
            stream_id: stream.stream_id.clone(),
            stream_version: first_version + offset as i64,
            event_type: event.event.event_type().to_owned(),
            payload: event.event.encode(),
            metadata_index,
            subject_id: event.subject_id.clone(),
            occurred_at: event.occurred_at,
        })
        .collect()
}

/// Takes the positions, inserts the events and records each key's last position in one
/// statement (so the counter row is locked only from here to COMMIT), then commits.
async fn finish_batch(
    transaction: Transaction<'_>,
    requests: &[AppendRequest],
    outcomes: Vec<Option<Result<(), AppendError>>>,
    rows_per_request: Vec<Vec<PendingRow>>,
) -> Result<BatchOutcome, AppendError> {
    let total: i64 = rows_per_request.iter().map(|rows| rows.len() as i64).sum();
    // Each command's last event, as an ordinal (1-based) within the batch.
    let mut last_ordinals = vec![0_i64; requests.len()];
    let mut head = 0;
    if total > 0 {
        let mut columns = Columns::default();
        let mut ordinal = 0;
        for (index, rows) in rows_per_request.into_iter().enumerate() {
            for row in rows {
                let metadata = &requests[row.metadata_index].metadata;
                columns.push(row, metadata);
                ordinal += 1;
                last_ordinals[index] = ordinal;
            }
        }
        let mut key_latest: std::collections::BTreeMap<&str, i64> = std::collections::BTreeMap::new();
        for (request, ordinal) in requests.iter().zip(&last_ordinals) {
            if let Some(key_id) = request.metadata.actor_key_id.as_deref().filter(|_| *ordinal > 0) {
                let entry = key_latest.entry(key_id).or_insert(0);
                *entry = (*entry).max(*ordinal);
            }
        }
        let keys: Vec<&str> = key_latest.keys().copied().collect();
        let key_ordinals: Vec<i64> = key_latest.values().copied().collect();
        head = columns.insert(&transaction, total, &keys, &key_ordinals).await.map_err(unavailable)?;
    }
    transaction.commit().await.map_err(|error| {
        if error.as_db_error().is_some() { unavailable(error) } else { AppendError::OutcomeUnknown(error.to_string()) }
    })?;
    let first = head - total;
    let outcomes = outcomes
        .into_iter()
        .zip(last_ordinals)
        .map(|(outcome, ordinal)| match outcome {
            Some(Ok(())) => Ok(Appended { last_position: if ordinal > 0 { first + ordinal } else { 0 } }),
            Some(Err(error)) => Err(error),
            None => Err(AppendError::Unavailable("not attempted".to_owned())),
        })
        .collect();
    Ok((outcomes, head))
}

enum Staging {
    /// The command is refused (lost race, guard conflict); the batch goes on.
    Refused(AppendError),
    /// The transaction is unusable; the whole batch fails.
    Failed(tokio_postgres::Error),
}

impl From<tokio_postgres::Error> for Staging {
    /// A transient failure makes the transaction unusable for everyone in the batch; any other
    /// failure is this command's own (a refused value, a defect) and fails only it (its
    /// savepoint is rolled back).
    fn from(error: tokio_postgres::Error) -> Self {
        match crate::db::classify(&error) {
            crate::db::Failure::Transient => Self::Failed(error),
            crate::db::Failure::Refused => Self::Refused(AppendError::Refused(error.to_string())),
            crate::db::Failure::Defect => Self::Refused(AppendError::Failed(format!("{error:#}"))),
        }
    }
}

fn is_unique_violation(error: &tokio_postgres::Error) -> bool {
    error.code() == Some(&SqlState::UNIQUE_VIOLATION)
}

async fn stage_request(
    transaction: &Transaction<'_>,
    request: &AppendRequest,
    metadata_index: usize,
) -> Result<Vec<PendingRow>, Staging> {
    let mut rows = Vec::new();
    for stream in &request.streams {
        let count = stream.events.len() as i64;
        if count == 0 {
            continue;
        }
        let wrong_version = || Staging::Refused(AppendError::WrongVersion { stream_id: stream.stream_id.clone() });
        let first_version = match stream.expected {
            ExpectedVersion::NoStream => {
                let statement =
                    transaction.prepare_cached("INSERT INTO streams (stream_id, version) VALUES ($1, $2)").await?;
                match transaction.execute(&statement, &[&stream.stream_id, &count]).await {
                    Ok(_) => 1,
                    Err(error) if is_unique_violation(&error) => return Err(wrong_version()),
                    Err(error) => return Err(error.into()),
                }
            }
            ExpectedVersion::Exactly(version) => {
                let statement = transaction
                    .prepare_cached("UPDATE streams SET version = $3 WHERE stream_id = $1 AND version = $2")
                    .await?;
                let updated =
                    transaction.execute(&statement, &[&stream.stream_id, &version, &(version + count)]).await?;
                if updated != 1 {
                    return Err(wrong_version());
                }
                version + 1
            }
            ExpectedVersion::Any => {
                let statement = transaction
                    .prepare_cached(
                        "INSERT INTO streams (stream_id, version) VALUES ($1, $2)
                         ON CONFLICT (stream_id) DO UPDATE SET version = streams.version + EXCLUDED.version
                         RETURNING version",
                    )
                    .await?;
                let row = transaction.query_one(&statement, &[&stream.stream_id, &count]).await?;
                row.get::<_, i64>(0) - count + 1
            }
        };
        rows.extend(pending_rows(stream, first_version, metadata_index));
    }
    for guard in &request.guards {
        let params: Vec<&(dyn ToSql + Sync)> = guard.params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect();
        let statement = transaction.prepare_cached(guard.sql).await?;
        match transaction.execute(&statement, &params).await {
            Ok(rows) if guard.expect_rows.is_some_and(|expected| expected != rows) => {
                return Err(Staging::Refused(guard.conflict.clone()));
            }
            Ok(_) => {}
            Err(error) if is_unique_violation(&error) => return Err(Staging::Refused(guard.conflict.clone())),
            Err(error) => return Err(error.into()),
        }
    }
    Ok(rows)
}

#[derive(Default)]
struct Columns {
    event_id: Vec<Uuid>,
    stream_id: Vec<String>,
    stream_version: Vec<i64>,
    event_type: Vec<String>,
    payload: Vec<Vec<u8>>,
    space_id: Vec<Option<String>>,
    actor_key_id: Vec<Option<String>>,
    actor_user_id: Vec<Option<String>>,
    request_id: Vec<Option<String>>,
    idempotency_key: Vec<Option<String>>,
    subject_id: Vec<Option<String>>,
    occurred_at: Vec<DateTime<Utc>>,
}

impl Columns {
    fn push(&mut self, row: PendingRow, metadata: &Metadata) {
        self.event_id.push(row.event_id);
        self.stream_id.push(row.stream_id);
        self.stream_version.push(row.stream_version);
        self.event_type.push(row.event_type);
        self.payload.push(row.payload);
        self.space_id.push(metadata.space_id.clone());
        self.actor_key_id.push(metadata.actor_key_id.clone());
        self.actor_user_id.push(metadata.actor_user_id.clone());
        self.request_id.push(metadata.request_id.clone());
        self.idempotency_key.push(metadata.idempotency_key.clone());
        self.subject_id.push(row.subject_id);
        self.occurred_at.push(row.occurred_at);
    }

    /// Advances the head by `total`, inserts the events at the positions that frees, and
    /// records each key's last position (`key_ordinals` are 1-based within the batch).
    /// Returns the new head.
    async fn insert(
        &self,
        transaction: &Transaction<'_>,
        total: i64,
        keys: &[&str],
        key_ordinals: &[i64],
    ) -> Result<i64, tokio_postgres::Error> {
        let statement = transaction
            .prepare_cached(
                "WITH head AS (
                     UPDATE log_head SET position = position + $14 RETURNING position - $14 AS base
                 ),
                 inserted AS (
                     INSERT INTO events (position, event_id, stream_id, stream_version, event_type, payload, space_id,
                         actor_key_id, actor_user_id, request_id, idempotency_key, subject_id, occurred_at)
                     SELECT head.base + e.ordinal, e.event_id, e.stream_id, e.stream_version, e.event_type,
                            e.payload, e.space_id, e.actor_key_id, e.actor_user_id, e.request_id,
                            e.idempotency_key, e.subject_id, e.occurred_at
                     FROM head, unnest($1::uuid[], $2::text[], $3::bigint[], $4::text[], $5::bytea[], $6::text[],
                         $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::timestamptz[])
                         WITH ORDINALITY AS e(event_id, stream_id, stream_version, event_type, payload, space_id,
                         actor_key_id, actor_user_id, request_id, idempotency_key, subject_id, occurred_at, ordinal)
                     RETURNING position
                 ),
                 keys AS (
                     INSERT INTO key_positions (key_id, position)
                     SELECT k.key_id, head.base + k.ordinal FROM head, unnest($13::text[], $15::bigint[]) AS k(key_id, ordinal)
                     ON CONFLICT (key_id) DO UPDATE SET position = GREATEST(key_positions.position, EXCLUDED.position)
                 )
                 SELECT max(position) FROM inserted",
            )
            .await?;
        let row = transaction
            .query_one(
                &statement,
                &[
                    &self.event_id,
                    &self.stream_id,
                    &self.stream_version,
                    &self.event_type,
                    &self.payload,
                    &self.space_id,
                    &self.actor_key_id,
                    &self.actor_user_id,
                    &self.request_id,
                    &self.idempotency_key,
                    &self.subject_id,
                    &self.occurred_at,
                    &keys,
                    &total,
                    &key_ordinals,
                ],
            )
            .await?;
        Ok(row.get::<_, Option<i64>>(0).unwrap_or(0))
    }
}

fn unavailable(error: impl std::fmt::Display) -> AppendError {
    AppendError::Unavailable(error.to_string())
}

/// What a follower reads of the log after its checkpoint: the events of the types it wants,
/// and how far the read reached.
#[derive(Debug, Default)]
pub struct Followed {
    /// The events of the wanted types, in position order.
    pub events: Vec<StoredEvent>,
    /// How many positions the read passed over, wanted or not.
    pub read: usize,
    /// The last position the read passed over (the follower's next checkpoint), if it
    /// passed over any.
    pub last: Option<i64>,
}

/// Reads the events of the `wanted` types among the (at most `limit`) positions after
/// `position` up to the head. Every position up to the head is committed (each append moves
/// the head under its row lock until it commits), so the follower can advance to the end of
/// that span knowing it saw every event of its types there; the events of other types are not
/// read at all (every read model and follower reads every span of the log, and most events
/// are of types a follower does not read).
pub async fn read_wanted(
    client: &impl deadpool_postgres::GenericClient,
    position: i64,
    limit: i64,
    wanted: &[&str],
) -> Result<Followed, tokio_postgres::Error> {
    // One round trip: the span's end (the head, or the limit), and the wanted events in it;
    // an empty span or one without wanted events is one row of nulls beside its end.
    let columns = EVENT_COLUMNS.split(", ").map(|column| format!("e.{column}")).collect::<Vec<_>>().join(", ");
    let statement = client
        .prepare_cached(&format!(
            "SELECT {columns}, span.last
             FROM (SELECT least(position, $1::bigint + $2::bigint) AS last FROM log_head LIMIT 1) span
             LEFT JOIN LATERAL (SELECT {EVENT_COLUMNS} FROM events
                                WHERE event_type = ANY($3) AND position > $1 AND position <= span.last) e ON true
             ORDER BY e.position"
        ))
        .await?;
    let rows = client.query(&statement, &[&position, &limit.max(1), &wanted]).await?;
    let Some(last) = rows.first().map(|row| row.get::<_, i64>(EVENT_COLUMN_COUNT)).filter(|last| *last > position)
    else {
        return Ok(Followed::default());
    };
    Ok(Followed {
        events: rows.iter().filter(|row| row.get::<_, Option<i64>>(0).is_some()).map(StoredEvent::from_row).collect(),
        read: usize::try_from(last - position).unwrap_or(usize::MAX),
        last: Some(last),
    })
}

/// Every event of the streams `stream_ids`, in log order: what a decision reads of the
/// resources it is about (as new as every acknowledged write).
pub async fn read_streams(
    client: &impl deadpool_postgres::GenericClient,
    stream_ids: &[String],
) -> Result<Vec<StoredEvent>, tokio_postgres::Error> {
    let statement = client
        .prepare_cached(&format!("SELECT {EVENT_COLUMNS} FROM events WHERE stream_id = ANY($1) ORDER BY position"))
        .await?;
    let rows = client.query(&statement, &[&stream_ids]).await?;
    Ok(rows.iter().map(StoredEvent::from_row).collect())
}

/// The events of each stream after its given version, in log order: what a follower that
/// keeps a stream's fold between its steps reads of it (0 reads the whole stream).
pub async fn read_streams_after(
    client: &impl deadpool_postgres::GenericClient,
    stream_ids: &[String],
    after_versions: &[i64],
) -> Result<Vec<StoredEvent>, tokio_postgres::Error> {
    let columns = EVENT_COLUMNS.split(", ").map(|column| format!("e.{column}")).collect::<Vec<_>>().join(", ");
    let statement = client
        .prepare_cached(&format!(
            "SELECT {columns} FROM unnest($1::text[], $2::bigint[]) AS a(stream_id, after)
             JOIN events e ON e.stream_id = a.stream_id AND e.stream_version > a.after
             ORDER BY e.position"
        ))
        .await?;
    let rows = client.query(&statement, &[&stream_ids, &after_versions]).await?;
    Ok(rows.iter().map(StoredEvent::from_row).collect())
}

/// The current head position of the log.
pub async fn head(client: &impl deadpool_postgres::GenericClient) -> Result<i64, tokio_postgres::Error> {
    Ok(client.query_one("SELECT position FROM log_head", &[]).await?.get(0))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_batch_holds_at_most_its_bytes_of_events_in_order_and_a_large_command_goes_alone() {
        use super::{AppendRequest, ExpectedVersion, Job, Metadata, StreamAppend};
        let job = |bytes: usize| {
            let created = crate::proto::RecordCreated { record_id: "x".repeat(bytes), ..Default::default() };
            let stream = StreamAppend::one(
                format!("s{bytes}"),
                ExpectedVersion::Any,
                crate::events::LogEvent::RecordCreated(created),
                0,
            );
            let (reply, _) = tokio::sync::oneshot::channel();
            Job { request: AppendRequest::new(Metadata::default(), vec![stream], Vec::new()), reply }
        };
        let shape = |batches: Vec<Vec<Job>>| -> Vec<Vec<String>> {
            batches
                .iter()
                .map(|batch| batch.iter().map(|job| job.request.streams[0].stream_id.clone()).collect())
                .collect()
        };
        // 102 bytes each (a tag, a length and the id): nine fit in 1,000.
        let small: Vec<Job> = (0..10).map(|_| job(100)).collect();
        assert_eq!(super::by_bytes(small, 1000).iter().map(Vec::len).collect::<Vec<_>>(), vec![9, 1]);
        let mixed = vec![job(10), job(5000), job(11), job(12)];
        assert_eq!(
            shape(super::by_bytes(mixed, 1000)),
            vec![vec!["s10".to_owned()], vec!["s5000".to_owned()], vec!["s11".to_owned(), "s12".to_owned()]]
        );
        assert!(super::by_bytes(Vec::new(), 1000).is_empty());
    }

    #[test]
    fn the_event_column_count_is_the_columns_named() {
        assert_eq!(super::EVENT_COLUMNS.split(", ").count(), super::EVENT_COLUMN_COUNT);
    }
}
