//! The set form of a batch: when no stream repeats and every guard has a set form, the batch is
//! written with one statement per table (the streams of each kind, the guards of each set form)
//! instead of one per command.

use deadpool_postgres::Transaction;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::append::{AppendRequest, ExpectedVersion, SetValue};
use super::commit::{BatchOutcome, Fallback, PendingRow, finish_batch, pending_rows, unavailable};

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

/// A batch written with one statement per table: every stream change of one kind in one
/// statement, every guard of one set form in one statement. Possible when no stream appears
/// twice in the batch and every guard has a set form.
pub(super) struct SetBatch {
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
    pub(super) fn of(requests: &[AppendRequest]) -> Option<Self> {
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
pub(super) async fn write_set(
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
