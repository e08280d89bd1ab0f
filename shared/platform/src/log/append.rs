//! The types of an append: a command's streams, with their expected versions and events, and
//! its guards, with their set forms; and what the append answers ([`Appended`], [`AppendError`]).

use chrono::{DateTime, Utc};
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
    pub(super) fn event_bytes(&self) -> usize {
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
