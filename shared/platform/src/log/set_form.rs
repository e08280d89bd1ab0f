//! The set form of a batch: when no stream repeats and every guard has a set form, the batch is
//! written with one statement per table (the streams of each kind, the guards of each set form)
//! instead of one per command.

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
    // The transaction is opened by its first statements: its BEGIN goes out with them (it is
    // polled first, so sent first), not as a round trip of its own, after which the
    // transaction would sit idle while this process waits for a core to send the rest. Every
    // path below ends it (COMMIT or ROLLBACK) or leaves its connection broken, and the caller
    // closes a connection whose write did not end (`batcher::write_batch`). The other ways of
    // writing a batch open theirs the same way.
    let client: &deadpool_postgres::Client = client;
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
        let statement = client
            .prepare_cached("INSERT INTO streams (stream_id, version) SELECT * FROM unnest($1::text[], $2::bigint[])")
            .await?;
        client.execute(&statement, &[&created_ids, &created_counts]).await
    };
    let advance = async {
        if advanced_ids.is_empty() {
            return Ok(0);
        }
        let statement = client
            .prepare_cached(
                "UPDATE streams s SET version = v.next FROM unnest($1::text[], $2::bigint[], $3::bigint[])
                     AS v(stream_id, expected, next)
                 WHERE s.stream_id = v.stream_id AND s.version = v.expected",
            )
            .await?;
        client.execute(&statement, &[&advanced_ids, &advanced_from, &advanced_to]).await
    };
    let extend = async {
        if extended_ids.is_empty() {
            return Ok(Vec::new());
        }
        let statement = client
            .prepare_cached(
                "INSERT INTO streams (stream_id, version) SELECT * FROM unnest($1::text[], $2::bigint[])
                 ON CONFLICT (stream_id) DO UPDATE SET version = streams.version + EXCLUDED.version
                 RETURNING stream_id, version",
            )
            .await?;
        client.query(&statement, &[&extended_ids, &extended_counts]).await
    };
    let guards = futures_util::future::join_all(batch.guards.iter().map(|(sql, columns, _)| async {
        let statement = client.prepare_cached(sql).await?;
        let params: Vec<&(dyn ToSql + Sync)> = columns.iter().map(SetColumn::param).collect();
        client.execute(&statement, &params).await
    }));
    // The BEGIN and the plan settings (`db::BEGIN_KEYED`) go out first, pipelined with the
    // statements (polled first, sent first).
    let (begun, created, advanced, extended, guarded) =
        tokio::join!(client.batch_execute(crate::db::BEGIN_KEYED), create, advance, extend, guards);
    if let Err(error) = begun {
        let _ = client.batch_execute("ROLLBACK").await;
        return Err(Fallback::Fail(unavailable(error)));
    }

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
        return refuse(client).await;
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
                    None => return refuse(client).await,
                },
            };
            rows_per_request[index].extend(pending_rows(stream, first_version, index));
        }
    }
    let outcomes = rows_per_request.iter().map(|_| Some(Ok(()))).collect();
    finish_batch(client, requests, outcomes, rows_per_request).await.map_err(Fallback::Fail)
}

/// Rolls back a batch that some command refused, to write it again a command at a time.
async fn refuse(client: &deadpool_postgres::Client) -> Result<BatchOutcome, Fallback> {
    client.batch_execute("ROLLBACK").await.map_err(|error| Fallback::Fail(unavailable(error)))?;
    Err(Fallback::Isolate)
}

#[cfg(test)]
mod tests {
    use super::{SetBatch, SetColumn};
    use crate::error::Code;
    use crate::log::{AppendError, AppendRequest, ExpectedVersion, Guard, Metadata, NewEvent, SetValue, StreamAppend};

    fn stream(stream_id: &str, expected: ExpectedVersion, events: usize) -> StreamAppend {
        let event = NewEvent {
            event: crate::events::LogEvent::RecordCreated(crate::proto::RecordCreated::default()),
            subject_id: None,
            occurred_at: crate::time::from_millis(0),
        };
        StreamAppend { stream_id: stream_id.to_owned(), expected, events: vec![event; events] }
    }

    fn request(streams: Vec<StreamAppend>, guards: Vec<Guard>) -> AppendRequest {
        AppendRequest::new(Metadata::default(), streams, guards)
    }

    fn conflict() -> AppendError {
        AppendError::Conflict { code: Code::IdentifierConflict, message: "taken".to_owned() }
    }

    fn claim(sql: &'static str, row: Vec<SetValue>) -> Guard {
        Guard::exactly_one("UPDATE one", Vec::new(), conflict()).with_set(sql, row)
    }

    fn unique(sql: &'static str, row: Vec<SetValue>) -> Guard {
        Guard::unique("INSERT one", Vec::new(), conflict()).with_set(sql, row)
    }

    fn texts(column: &SetColumn) -> Vec<Option<String>> {
        match column {
            SetColumn::Text(values) => values.clone(),
            _ => panic!("not a text column"),
        }
    }

    fn big_ints(column: &SetColumn) -> Vec<i64> {
        match column {
            SetColumn::BigInt(values) => values.clone(),
            _ => panic!("not a bigint column"),
        }
    }

    #[test]
    fn a_set_batch_takes_one_statement_per_form_in_order_of_first_appearance_with_the_rows_summed() {
        let text = |value: &str| SetValue::Text(Some(value.to_owned()));
        let requests = vec![
            request(
                Vec::new(),
                vec![
                    claim("CLAIM", vec![text("a"), SetValue::BigInt(1)]),
                    Guard::exactly_one("UPDATE one", Vec::new(), conflict()).with_set_counting(
                        "RELEASE",
                        vec![SetValue::BigInt(9)],
                        3,
                    ),
                ],
            ),
            request(Vec::new(), vec![claim("CLAIM", vec![text("b"), SetValue::BigInt(2)])]),
        ];
        let batch = SetBatch::of(&requests).expect("every guard has a set form");
        let forms: Vec<(&str, usize, Option<u64>)> =
            batch.guards.iter().map(|(sql, columns, rows)| (*sql, columns.len(), *rows)).collect();
        assert_eq!(forms, vec![("CLAIM", 2, Some(2)), ("RELEASE", 1, Some(3))]);
        let claims = &batch.guards[0].1;
        assert_eq!(texts(&claims[0]), vec![Some("a".to_owned()), Some("b".to_owned())]);
        assert_eq!(big_ints(&claims[1]), vec![1, 2]);
        assert_eq!(big_ints(&batch.guards[1].1[0]), vec![9]);
    }

    #[test]
    fn a_set_form_with_a_uniqueness_only_guard_expects_any_number_of_rows() {
        for guards in [
            vec![unique("CLAIM", vec![SetValue::Int(1)]), claim("CLAIM", vec![SetValue::Int(2)])],
            vec![claim("CLAIM", vec![SetValue::Int(1)]), unique("CLAIM", vec![SetValue::Int(2)])],
        ] {
            let batch = SetBatch::of(&[request(Vec::new(), guards)]).expect("a set form");
            assert_eq!(batch.guards.len(), 1);
            assert_eq!(batch.guards[0].2, None);
        }
        let counted = SetBatch::of(&[request(Vec::new(), vec![claim("CLAIM", vec![SetValue::Int(1)])])]);
        assert_eq!(counted.expect("a set form").guards[0].2, Some(1));
    }

    #[test]
    fn there_is_no_set_batch_when_a_stream_repeats_or_a_guard_has_no_set_form_or_a_row_does_not_fit_its_form() {
        let any = ExpectedVersion::Any;
        let across = [request(vec![stream("s", any, 1)], Vec::new()), request(vec![stream("s", any, 2)], Vec::new())];
        assert!(SetBatch::of(&across).is_none(), "a stream in two commands");
        let within = [request(vec![stream("s", any, 1), stream("s", ExpectedVersion::Exactly(1), 1)], Vec::new())];
        assert!(SetBatch::of(&within).is_none(), "a stream twice in one command");
        let bare = [request(Vec::new(), vec![Guard::unique("INSERT one", Vec::new(), conflict())])];
        assert!(SetBatch::of(&bare).is_none(), "a guard without a set form");
        let wider = [request(
            Vec::new(),
            vec![claim("CLAIM", vec![SetValue::Int(1)]), claim("CLAIM", vec![SetValue::Int(2), SetValue::Int(3)])],
        )];
        assert!(SetBatch::of(&wider).is_none(), "a row wider than its form's");
        let retyped = [
            request(Vec::new(), vec![claim("CLAIM", vec![SetValue::Int(1)])]),
            request(Vec::new(), vec![claim("CLAIM", vec![SetValue::BigInt(1)])]),
        ];
        assert!(SetBatch::of(&retyped).is_none(), "a value of another type than its column's");
        // A stream named again without events is not written, so it does not repeat.
        let empty = [request(vec![stream("s", any, 1)], Vec::new()), request(vec![stream("s", any, 0)], Vec::new())];
        assert!(SetBatch::of(&empty).is_some());
    }

    #[test]
    fn a_set_batch_sorts_the_streams_by_what_they_expect_and_skips_those_without_events() {
        let requests = [
            request(
                vec![
                    stream("a", ExpectedVersion::NoStream, 1),
                    stream("b", ExpectedVersion::Exactly(4), 2),
                    stream("e", ExpectedVersion::Any, 0),
                ],
                Vec::new(),
            ),
            request(vec![stream("c", ExpectedVersion::Any, 1), stream("d", ExpectedVersion::NoStream, 3)], Vec::new()),
        ];
        let batch = SetBatch::of(&requests).expect("no stream repeats");
        assert_eq!(batch.created, vec![(0, 0), (1, 1)]);
        assert_eq!(batch.advanced, vec![(0, 1, 4)]);
        assert_eq!(batch.extended, vec![(1, 0)]);
        assert!(batch.guards.is_empty());
    }

    #[test]
    fn a_set_column_takes_only_values_of_its_first_values_type_and_binds_as_that_types_array() {
        use tokio_postgres::types::Type;
        let cases = [
            (SetValue::Text(None), Type::TEXT_ARRAY, SetValue::BigInt(1)),
            (SetValue::BigInt(1), Type::INT8_ARRAY, SetValue::Int(1)),
            (SetValue::Int(1), Type::INT4_ARRAY, SetValue::BigInt(1)),
            (SetValue::Bytes(vec![1]), Type::BYTEA_ARRAY, SetValue::Text(None)),
            (SetValue::Json(serde_json::json!({"a": 1})), Type::JSONB_ARRAY, SetValue::Text(Some("{}".to_owned()))),
            (SetValue::Uuid(uuid::Uuid::nil()), Type::UUID_ARRAY, SetValue::Text(None)),
        ];
        for (first, array, other) in cases {
            let mut column = SetColumn::of(&first);
            assert!(column.push(&first), "{first:?} goes into its own column");
            assert!(column.push(&first));
            assert!(!column.push(&other), "{other:?} is refused by a column of {first:?}");
            let mut out = Default::default();
            assert!(column.param().to_sql_checked(&array, &mut out).is_ok(), "{first:?} binds as {array}");
            let mut out = Default::default();
            assert!(column.param().to_sql_checked(&Type::TEXT, &mut out).is_err(), "{first:?} binds as an array");
        }
        let mut ints = SetColumn::of(&SetValue::Int(0));
        for value in [3, 1, 2] {
            assert!(ints.push(&SetValue::Int(value)));
        }
        assert!(matches!(&ints, SetColumn::Int(values) if values == &[3, 1, 2]), "values are kept in order");
    }
}
