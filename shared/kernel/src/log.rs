//! The types of an append: a command's streams, with their expected versions and events, and
//! its guards, with their set forms; and what the append answers ([`Appended`], [`AppendError`]).
//! A decision builds them as data; `platform::log` writes them (its batcher and commit paths
//! are described there) and classifies a database's failure into an [`AppendError`].

use chrono::{DateTime, Utc};
use postgres_types::ToSql;
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
    pub fn event_bytes(&self) -> usize {
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

#[cfg(test)]
mod tests {
    use super::{AppendError, AppendRequest, ExpectedVersion, Guard, Metadata, NewEvent, SetValue, StreamAppend};
    use crate::error::Code;
    use crate::events::LogEvent;

    fn conflict() -> AppendError {
        AppendError::Conflict { code: Code::IdentifierConflict, message: "taken".to_owned() }
    }

    fn created(record_id: &str) -> NewEvent {
        let created = crate::proto::RecordCreated { record_id: record_id.to_owned(), ..Default::default() };
        NewEvent { event: LogEvent::RecordCreated(created), subject_id: None, occurred_at: crate::time::from_millis(0) }
    }

    #[test]
    fn a_unique_guard_requires_no_row_count_and_an_exactly_one_guard_requires_one() {
        let unique = Guard::unique("INSERT INTO a VALUES ($1)", vec![Box::new("x".to_owned())], conflict());
        assert_eq!(unique.expect_rows, None);
        assert!(unique.set.is_none());
        assert_eq!((unique.sql, unique.params.len()), ("INSERT INTO a VALUES ($1)", 1));
        let one =
            Guard::exactly_one("UPDATE a SET b = $2 WHERE c = $1", vec![Box::new(1_i64), Box::new(2_i64)], conflict());
        assert_eq!(one.expect_rows, Some(1));
        assert!(one.set.is_none());
        assert_eq!(one.params.len(), 2);
        assert!(matches!(one.conflict, AppendError::Conflict { code: Code::IdentifierConflict, .. }));
    }

    #[test]
    fn a_stream_at_guard_requires_one_row_and_fails_as_stream_moved_naming_the_stream() {
        let guard = Guard::stream_at("rec_1", 3);
        assert_eq!(guard.expect_rows, Some(1));
        assert_eq!(guard.params.len(), 2);
        assert!(guard.set.is_none());
        match guard.conflict {
            AppendError::Conflict { code, message } => {
                assert_eq!(code, Code::StreamMoved);
                assert!(message.starts_with("rec_1 "), "{message}");
            }
            other => panic!("a stream_at guard conflicts as stream_moved, not {other:?}"),
        }
    }

    #[test]
    fn a_set_form_expects_the_rows_its_guard_expects() {
        let row = || vec![SetValue::Text(Some("x".to_owned())), SetValue::BigInt(7)];
        let unique = Guard::unique("INSERT 1", Vec::new(), conflict()).with_set("INSERT SET", row());
        let set = unique.set.as_ref().expect("a set form");
        assert_eq!((set.sql, set.row.len(), set.expect_rows), ("INSERT SET", 2, None));
        assert_eq!(unique.expect_rows, None);

        let one = Guard::exactly_one("UPDATE 1", Vec::new(), conflict()).with_set("UPDATE SET", row());
        let set = one.set.as_ref().expect("a set form");
        assert_eq!((set.sql, set.expect_rows), ("UPDATE SET", Some(1)));
        assert_eq!(one.expect_rows, Some(1));
        assert!(matches!(set.row[1], SetValue::BigInt(7)));
    }

    #[test]
    fn a_counting_set_form_expects_its_own_rows_and_leaves_the_guards_count_alone() {
        let one = Guard::exactly_one("UPDATE 1", Vec::new(), conflict()).with_set_counting(
            "UPDATE SET",
            vec![SetValue::Int(1)],
            3,
        );
        assert_eq!(one.set.as_ref().and_then(|set| set.expect_rows), Some(3));
        assert_eq!(one.expect_rows, Some(1));
        let unique = Guard::unique("INSERT 1", Vec::new(), conflict()).with_set_counting(
            "INSERT SET",
            vec![SetValue::Int(1)],
            2,
        );
        assert_eq!(unique.set.as_ref().and_then(|set| set.expect_rows), Some(2));
        assert_eq!(unique.expect_rows, None);
    }

    #[test]
    fn a_requests_event_bytes_are_the_encoded_lengths_of_all_its_streams_events() {
        let first = StreamAppend {
            stream_id: "a".to_owned(),
            expected: ExpectedVersion::Any,
            events: vec![created("r1"), created(&"x".repeat(100))],
        };
        let second = StreamAppend {
            stream_id: "b".to_owned(),
            expected: ExpectedVersion::NoStream,
            events: vec![created("r333"), NewEvent { event: LogEvent::Unknown("Future.v9".to_owned()), ..created("") }],
        };
        let encoded: usize =
            [&first, &second].iter().flat_map(|stream| &stream.events).map(|e| e.event.encode().len()).sum();
        let request = AppendRequest::new(Metadata::default(), vec![first, second], Vec::new());
        // A tag and a length before each id: 4 + 102 + 6, and nothing for an unknown event.
        assert_eq!(request.event_bytes(), 112);
        assert_eq!(request.event_bytes(), encoded);
        assert_eq!(AppendRequest::new(Metadata::default(), Vec::new(), Vec::new()).event_bytes(), 0);
    }

    #[test]
    fn a_write_in_a_space_carries_the_space_and_nothing_of_a_caller() {
        let request = AppendRequest::in_space("spc_1", Vec::new(), vec![Guard::stream_at("s", 0)]);
        assert_eq!(request.metadata.space_id.as_deref(), Some("spc_1"));
        assert_eq!(request.metadata.actor_key_id, None);
        assert_eq!(request.metadata.actor_user_id, None);
        assert_eq!(request.metadata.request_id, None);
        assert_eq!(request.metadata.idempotency_key, None);
        assert_eq!(request.guards.len(), 1);
    }

    #[test]
    fn one_event_on_a_stream_is_about_no_subject_and_occurs_at_the_given_millisecond() {
        let event = created("r1").event;
        let stream =
            StreamAppend::one("rec_1".to_owned(), ExpectedVersion::Exactly(4), event.clone(), 1_700_000_000_123);
        assert_eq!((stream.stream_id.as_str(), stream.expected), ("rec_1", ExpectedVersion::Exactly(4)));
        assert_eq!(stream.events.len(), 1);
        assert_eq!(stream.events[0].event, event);
        assert_eq!(stream.events[0].subject_id, None);
        assert_eq!(stream.events[0].occurred_at.timestamp_millis(), 1_700_000_000_123);
    }
}
