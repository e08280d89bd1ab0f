//! The end that every way of writing a batch shares: the rows of its events, numbered from each
//! stream's first new version, and the one statement that takes their positions and inserts
//! them, then the commit.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::append::{AppendError, AppendRequest, Appended, Metadata, StreamAppend};

/// Row values of one event, positions assigned once the batch is known.
pub(super) struct PendingRow {
    event_id: Uuid,
    stream_id: String,
    stream_version: i64,
    event_type: String,
    payload: Vec<u8>,
    metadata_index: usize,
    subject_id: Option<String>,
    occurred_at: DateTime<Utc>,
}

pub(super) type BatchOutcome = (Vec<Result<Appended, AppendError>>, i64);

pub(super) enum Fallback {
    /// Some command was refused; write again with a savepoint per command.
    Isolate,
    Fail(AppendError),
}

/// The rows of a stream's events, from `first_version` on.
pub(super) fn pending_rows(stream: &StreamAppend, first_version: i64, metadata_index: usize) -> Vec<PendingRow> {
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
/// statement (so the counter row is locked only from here to COMMIT), and commits.
///
/// The COMMIT goes out right behind that statement, before its answer is back: the counter
/// row's lock is then held for the statement and the commit's flush, and never while this
/// process reads the answer and gets round to sending the COMMIT. Under load that wait was the
/// longest part of the hold: a process busy rendering and signing a broadcast's emails kept
/// every other process's appends waiting on it (docs/benchmarks.md, "Live creates beside a
/// broadcast"). See [`commit_behind`] for what each pair of answers means. The transaction is
/// one a write opened with `db::BEGIN_KEYED`; on every path it is over when this returns, or
/// its connection is broken.
pub(super) async fn finish_batch(
    client: &deadpool_postgres::Client,
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
        let statement = match Columns::prepare(client).await {
            Ok(statement) => statement,
            Err(error) => {
                let _ = client.batch_execute("ROLLBACK").await;
                return Err(unavailable(error));
            }
        };
        head = commit_behind(client, columns.insert(client, &statement, total, &keys, &key_ordinals)).await?;
    } else {
        client.batch_execute("COMMIT").await.map_err(commit_failed)?;
    }
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

/// Sends the transaction's COMMIT right behind `last`, its last statement, once that is on
/// its way, and answers `last`'s result once both are answered:
/// - both succeeded: committed;
/// - the statement failed in the database: the transaction was aborted, and its COMMIT rolled
///   it back (a definite failure);
/// - the COMMIT failed in the database: rolled back;
/// - either answer was lost (the connection broke): the outcome is unknown, since the COMMIT
///   may have been carried out.
///
/// `last` must send its statement on its first poll (a prepared statement: tokio-postgres sends
/// a request when its future is first polled, and in that order). If it ends on that first poll
/// (it failed before anything was sent), nothing is pipelined: it commits what succeeded, and
/// rolls back after a failure.
async fn commit_behind(
    client: &deadpool_postgres::Client,
    last: impl Future<Output = Result<i64, tokio_postgres::Error>>,
) -> Result<i64, AppendError> {
    let mut last = std::pin::pin!(last);
    let first_poll = std::future::poll_fn(|context| std::task::Poll::Ready(last.as_mut().poll(context))).await;
    if let std::task::Poll::Ready(ended) = first_poll {
        let head = match ended {
            Ok(head) => head,
            Err(error) => {
                let _ = client.batch_execute("ROLLBACK").await;
                return Err(unavailable(error));
            }
        };
        client.batch_execute("COMMIT").await.map_err(commit_failed)?;
        return Ok(head);
    }
    let (answered, committed) = tokio::join!(last, client.batch_execute("COMMIT"));
    match (answered, committed) {
        (Ok(head), Ok(())) => Ok(head),
        (Err(error), _) if error.as_db_error().is_some() => Err(unavailable(error)),
        (Err(error), _) => Err(AppendError::OutcomeUnknown(error.to_string())),
        (Ok(_), Err(error)) => Err(commit_failed(error)),
    }
}

/// A failed COMMIT: a refusal by the database rolled the transaction back; a lost answer
/// leaves its outcome unknown.
fn commit_failed(error: tokio_postgres::Error) -> AppendError {
    if error.as_db_error().is_some() { unavailable(error) } else { AppendError::OutcomeUnknown(error.to_string()) }
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

    /// The statement of [`Columns::insert`].
    async fn prepare(client: &deadpool_postgres::Client) -> Result<tokio_postgres::Statement, tokio_postgres::Error> {
        client
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
            .await
    }

    /// Advances the head by `total`, inserts the events at the positions that frees, and
    /// records each key's last position (`key_ordinals` are 1-based within the batch).
    /// Returns the new head. Sends its statement (`prepare`d) on its first poll.
    async fn insert(
        &self,
        client: &deadpool_postgres::Client,
        statement: &tokio_postgres::Statement,
        total: i64,
        keys: &[&str],
        key_ordinals: &[i64],
    ) -> Result<i64, tokio_postgres::Error> {
        let row = client
            .query_one(
                statement,
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

pub(super) fn unavailable(error: impl std::fmt::Display) -> AppendError {
    AppendError::Unavailable(error.to_string())
}

#[cfg(test)]
mod tests {
    use super::{Columns, pending_rows};
    use crate::events::LogEvent;
    use crate::log::{ExpectedVersion, Metadata, NewEvent, StreamAppend};

    fn stream() -> StreamAppend {
        let event = |record_id: &str, subject: Option<&str>, at_ms: i64| NewEvent {
            event: LogEvent::RecordCreated(crate::proto::RecordCreated {
                record_id: record_id.to_owned(),
                ..Default::default()
            }),
            subject_id: subject.map(str::to_owned),
            occurred_at: crate::time::from_millis(at_ms),
        };
        StreamAppend {
            stream_id: "rec_1".to_owned(),
            expected: ExpectedVersion::Exactly(4),
            events: vec![
                event("a", Some("con_1"), 10),
                event("b", None, 20),
                NewEvent { event: LogEvent::Unknown("Future.v9".to_owned()), ..event("", Some("con_2"), 30) },
            ],
        }
    }

    #[test]
    fn a_streams_rows_are_numbered_from_its_first_version_and_carry_the_commands_index() {
        let stream = stream();
        let rows = pending_rows(&stream, 5, 2);
        assert_eq!(rows.iter().map(|row| row.stream_version).collect::<Vec<_>>(), vec![5, 6, 7]);
        assert!(rows.iter().all(|row| row.metadata_index == 2 && row.stream_id == "rec_1"));
        for (row, event) in rows.iter().zip(&stream.events) {
            assert_eq!(row.event_type, event.event.event_type());
            assert_eq!(row.payload, event.event.encode());
            assert_eq!(row.subject_id, event.subject_id);
            assert_eq!(row.occurred_at, event.occurred_at);
        }
        assert_eq!(rows[2].event_type, "Future.v9");
        let ids: std::collections::HashSet<_> = rows.iter().map(|row| row.event_id).collect();
        assert_eq!(ids.len(), 3, "every event has an id of its own");
        assert_eq!(pending_rows(&stream, 1, 0)[0].stream_version, 1);
        let empty = StreamAppend { events: Vec::new(), ..stream };
        assert!(pending_rows(&empty, 1, 0).is_empty());
    }

    #[test]
    fn the_columns_of_a_batch_take_each_rows_values_and_its_commands_metadata() {
        let stream = stream();
        let caller = Metadata {
            space_id: Some("spc_1".to_owned()),
            actor_key_id: Some("key_1".to_owned()),
            actor_user_id: Some("usr_1".to_owned()),
            request_id: Some("req_1".to_owned()),
            idempotency_key: Some("idem_1".to_owned()),
        };
        let worker = Metadata::in_space("spc_2");
        let mut columns = Columns::default();
        let mut rows = pending_rows(&stream, 5, 0).into_iter();
        columns.push(rows.next().expect("a row"), &caller);
        columns.push(rows.next().expect("a row"), &worker);
        assert_eq!(columns.stream_version, vec![5, 6]);
        assert_eq!(columns.stream_id, vec!["rec_1".to_owned(), "rec_1".to_owned()]);
        assert_eq!(columns.event_type, vec!["RecordCreated.v1".to_owned(), "RecordCreated.v1".to_owned()]);
        assert_eq!(columns.payload[1], stream.events[1].event.encode());
        assert_eq!(columns.subject_id, vec![Some("con_1".to_owned()), None]);
        assert_eq!(columns.occurred_at, vec![crate::time::from_millis(10), crate::time::from_millis(20)]);
        assert_eq!(columns.space_id, vec![Some("spc_1".to_owned()), Some("spc_2".to_owned())]);
        assert_eq!(columns.actor_key_id, vec![Some("key_1".to_owned()), None]);
        assert_eq!(columns.actor_user_id, vec![Some("usr_1".to_owned()), None]);
        assert_eq!(columns.request_id, vec![Some("req_1".to_owned()), None]);
        assert_eq!(columns.idempotency_key, vec![Some("idem_1".to_owned()), None]);
        assert_eq!(columns.event_id.len(), 2);
    }
}
