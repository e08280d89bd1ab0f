//! The eraser: drives record deletion operations from `pending` (or `blocked`) to
//! `completed`.
//!
//! For each open operation it (1) destroys the record's data key and blanks the write side's
//! copies of its data (recorded idempotent responses; identity claims went with the request),
//! once, then (2) waits until every projection version that holds data (live, being rebuilt, or
//! retired but not yet dropped) has passed the deletion's position, and (3) appends
//! `RecordDeletionCompleted`. Step 1 is idempotent and commits before step 3, so a completed
//! operation always means the key is gone. Several projector processes may run the eraser:
//! the guard on `record_deletions` lets exactly one completion (or block) through.
//!
//! It runs on the worker runtime under the lease `eraser`. It looks for open operations when a
//! deletion's request notifies it (in the request's transaction), when a read model reports
//! progress, and every [`RECHECK`] (a notification lost while its listener reconnected); a
//! wake-up after a look that found none, with no request since, runs no statement.
//!
//! An operation that waits longer than the configured time, because a projection is stuck
//! (failing on an event, or a rebuild that was abandoned), becomes `blocked` with the reason;
//! it completes by itself once that projection passes the position or the abandoned version
//! is dropped.
//!
//! # Erasure (crypto-shredding)
//!
//! The log is append-only, so personal data is made unreadable instead of deleted.
//!
//! - **Keys.** When a record is created, the command service makes a 256-bit data key, encrypts
//!   the record's `Sealed` personal data with AES-256-GCM under it (the subject id is bound in
//!   as associated data), and stores the key wrapped by the master key (`APP__MASTER_KEY`) in
//!   `subject_keys`, by a guard in the same transaction as the `RecordCreated` event. Later
//!   writes load the key with the record's state (one statement) and encrypt with it. Readers
//!   (projections, the audit trail) load the keys of the subjects in what they read; a seal
//!   whose key is gone opens as "erased", the same way on every replay.
//! - **Request.** `DELETE` appends `RecordDeletionRequested` to the record's stream at its
//!   current version (so it wins or loses cleanly against a concurrent write), inserts the
//!   operation into `record_deletions` and deletes the record's `record_identities` rows, all in
//!   one transaction. From then on the record's latest event says it is being deleted: writes,
//!   upserts by id and a second DELETE get 409 `record_deletion_pending`; reads no longer find it
//!   (the records projection deletes its row); its identity values are free for new records.
//! - **Erase and prove.** The eraser (a worker of its own on the runtime, under the lease
//!   `eraser`; any number of projector processes may run it) takes open operations and (1) deletes the subject key, the
//!   identity rows and blanks recorded idempotent responses about the record, committing that
//!   first; (2) checks that every projection version that can hold data, `live` and `building`
//!   ones and `retired` ones whose schema still exists, has passed the deletion's position;
//!   (3) appends `RecordDeletionCompleted` (ids and positions only) with a guard moving the
//!   operation to `completed`, so exactly one completion is recorded. The `deletions` read
//!   model serves `GET /record-deletions/{operationId}`.
//! - **Blocked.** If step 2 keeps failing for longer than `APP__ERASURE__BLOCKED_AFTER_MILLIS`
//!   (60 s), the eraser appends `RecordDeletionBlocked` with the reason (which read model,
//!   version and position). This is the "unresolved work" here: a projection failing on an
//!   event, or a rebuild abandoned half-way. It needs no separate reconciliation step: once the
//!   projection is repaired and passes the position, or the abandoned version is dropped, the
//!   next pass completes the operation. The key is already gone while blocked.
//! - **What is proven, and what is not.** The test suite dumps the whole database with
//!   `pg_dump` after completion and finds neither the address nor the name, in text or as
//!   bytea hex. Outside that proof: dead row versions stay in table files until (auto)vacuum
//!   and in WAL and backups until they rotate; the erased subject's ciphertext stays in the log
//!   forever, unreadable without the destroyed key. Suppression entries for the contact's
//!   address are kept on purpose: they exist to keep honouring a "do not contact" and must
//!   outlive the contact. The body hash of an idempotency record is a SHA-256 of the request,
//!   not the request.
//! - **Replay.** A rebuild after erasure projects the record with empty personal fields and
//!   then deletes it at its deletion event: the same read models as before (tested).

use platform::error::Code;
use std::time::Duration;

use deadpool_postgres::Pool;
use platform::events::LogEvent;
use platform::log::{AppendError, AppendRequest, EventLog, ExpectedVersion, Guard, Metadata, NewEvent, StreamAppend};

/// How many open operations one pass looks at.
const PASS_LIMIT: i64 = 100;

struct Open {
    operation_id: String,
    record_id: String,
    space_id: String,
    schema_id: String,
    state: String,
    waited: Duration,
    /// The request's log position, once step 1 is done.
    position: Option<i64>,
}

/// One pass over the open deletion operations. Returns how many completed.
pub(crate) async fn run_pass(pool: &Pool, log: &EventLog, blocked_after: Duration) -> anyhow::Result<usize> {
    let client = pool.get().await?;
    let rows = client
        .query(
            "SELECT operation_id, record_id, space_id, schema_id, state,
                    (extract(epoch FROM clock_timestamp() - requested_at) * 1000)::bigint, position
             FROM record_deletions WHERE state <> 'completed' ORDER BY requested_at LIMIT $1",
            &[&PASS_LIMIT],
        )
        .await?;
    drop(client);
    let mut completed = 0;
    for row in rows {
        let open = Open {
            operation_id: row.get(0),
            record_id: row.get(1),
            space_id: row.get(2),
            schema_id: row.get(3),
            state: row.get(4),
            waited: Duration::from_millis(u64::try_from(row.get::<_, i64>(5)).unwrap_or(0)),
            position: row.get(6),
        };
        match advance(pool, log, &open, blocked_after).await {
            Ok(true) => completed += 1,
            Ok(false) => {}
            Err(error) => tracing::warn!(
                operation = %open.operation_id,
                error = format!("{error:#}"),
                "could not advance a record deletion; retrying"
            ),
        }
    }
    Ok(completed)
}

/// Advances one operation; `true` when it completed.
async fn advance(pool: &Pool, log: &EventLog, open: &Open, blocked_after: Duration) -> anyhow::Result<bool> {
    let mut client = pool.get().await?;
    let stream_id = format!("record/{}", open.record_id);
    let deletion_position = match open.position {
        Some(position) => position,
        None => erase(&mut client, open, &stream_id).await?,
    };

    // 2. Every projection version that holds data must have passed the deletion, and applied
    // it: a deletion event that was dead-lettered removed nothing. A dead letter is named
    // before a version that is only behind: it is the blocker that needs an operator. (Deletion events are applied
    // even in a quarantined space, so a quarantine elsewhere does not hold erasure back.)
    let laggard = client
        .query_opt(
            "SELECT p.name, p.version, p.position, d.error FROM projections p
             LEFT JOIN projection_dead_letters d ON d.name = p.name AND d.version = p.version
                 AND d.position = $1 AND d.resolved_at IS NULL
             WHERE (p.position < $1 OR d.position IS NOT NULL)
               AND (p.status IN ('live', 'building', 'halted')
                    OR (p.status = 'retired' AND to_regnamespace('rm_' || p.name || '_v' || p.version) IS NOT NULL))
             ORDER BY d.position IS NULL, p.position LIMIT 1",
            &[&deletion_position],
        )
        .await?;
    drop(client);
    let metadata = Metadata::in_space(&open.space_id);
    let now = platform::time::now_millis();
    if let Some(laggard) = laggard {
        if open.state == "pending" && open.waited >= blocked_after {
            let (name, version, position) =
                (laggard.get::<_, String>(0), laggard.get::<_, i32>(1), laggard.get::<_, i64>(2));
            let reason = match laggard.get::<_, Option<String>>(3) {
                Some(_) => format!(
                    "blocked: read model {name} version {version} could not apply the deletion at position \
                     {deletion_position} (a dead letter); the deletion completes by itself once an operator has \
                     fixed and retried it"
                ),
                None => format!(
                    "blocked: read model {name} version {version} is at log position {position} and has not passed \
                     the deletion at position {deletion_position}; the deletion completes by itself once it does (or \
                     once that version is dropped)"
                ),
            };
            let event = LogEvent::RecordDeletionBlocked(platform::proto::RecordDeletionBlocked {
                operation_id: open.operation_id.clone(),
                record_id: open.record_id.clone(),
                space_id: open.space_id.clone(),
                reason,
                blocked_at_ms: now,
                schema_id: open.schema_id.clone(),
            });
            let guard = transition(
                &open.operation_id,
                "UPDATE record_deletions SET state = 'blocked' WHERE operation_id = $1 AND state = 'pending'",
            );
            append(log, metadata, &stream_id, &open.record_id, event, guard).await?;
        }
        return Ok(false);
    }

    // 3. Proven: record it.
    let event = LogEvent::RecordDeletionCompleted(platform::proto::RecordDeletionCompleted {
        operation_id: open.operation_id.clone(),
        record_id: open.record_id.clone(),
        space_id: open.space_id.clone(),
        deletion_position,
        completed_at_ms: now,
        schema_id: open.schema_id.clone(),
    });
    let guard = transition(
        &open.operation_id,
        "UPDATE record_deletions SET state = 'completed', completed_at = now()
         WHERE operation_id = $1 AND state <> 'completed'",
    );
    append(log, metadata, &stream_id, &open.record_id, event, guard).await
}

/// Step 1, once per operation: destroys the record's data key, blanks recorded idempotent
/// responses about it (its identity claims went with the request), clears the input digests
/// of event receipts about it and erases the aliases bound to it, and notes the request's
/// log position, all in one transaction. Returns that position.
async fn erase(client: &mut deadpool_postgres::Client, open: &Open, stream_id: &str) -> anyhow::Result<i64> {
    let transaction = client.transaction().await?;
    let requested = transaction
        .query_opt(
            "SELECT position FROM events WHERE stream_id = $1 AND event_type = 'RecordDeletionRequested.v1'",
            &[&stream_id],
        )
        .await?;
    let Some(requested) = requested else { anyhow::bail!("no RecordDeletionRequested event for {}", open.record_id) };
    let position: i64 = requested.get(0);
    transaction.execute("DELETE FROM subject_keys WHERE subject_id = $1", &[&open.record_id]).await?;
    transaction.execute(domain::records::BLANK_IDEMPOTENT_RESPONSES, &[&open.record_id]).await?;
    // Events about the record: their receipts keep no digest of the erased input (a retry of
    // such an occurrence is 409 event_erased), and aliases bound to it are erased.
    transaction
        .execute("UPDATE event_receipts SET input_digest = NULL WHERE subject_id = $1", &[&open.record_id])
        .await?;
    transaction
        .execute(
            "UPDATE identity_aliases SET erased = true, contact_id = NULL WHERE contact_id = $1",
            &[&open.record_id],
        )
        .await?;
    transaction
        .execute(
            "UPDATE record_deletions SET position = $2, erased_at = now() WHERE operation_id = $1",
            &[&open.operation_id, &position],
        )
        .await?;
    transaction.commit().await?;
    Ok(position)
}

fn transition(operation_id: &str, sql: &'static str) -> Guard {
    Guard::exactly_one(
        sql,
        vec![Box::new(operation_id.to_owned())],
        AppendError::Conflict { code: Code::DeletionMovedOn, message: String::new() },
    )
}

/// Appends a transition; `false` (not an error) when another eraser got there first.
async fn append(
    log: &EventLog,
    metadata: Metadata,
    stream_id: &str,
    record_id: &str,
    event: LogEvent,
    guard: Guard,
) -> anyhow::Result<bool> {
    let outcome = log
        .append(AppendRequest::new(
            metadata,
            vec![StreamAppend {
                stream_id: stream_id.to_owned(),
                expected: ExpectedVersion::Any,
                events: vec![NewEvent {
                    event,
                    subject_id: Some(record_id.to_owned()),
                    occurred_at: chrono::Utc::now(),
                }],
            }],
            vec![guard],
        ))
        .await;
    match outcome {
        Ok(_) => Ok(true),
        Err(AppendError::Conflict { code: Code::DeletionMovedOn, .. }) => Ok(false),
        Err(error) => Err(error.into()),
    }
}

/// The eraser's lease and checkpoint name; its checkpoint counts the deletions it completed,
/// not a log position.
pub(crate) const LEASE: &str = "eraser";

/// How long a look that found no open operation stands for, when no request notified since.
const RECHECK: Duration = Duration::from_secs(10);

/// The eraser on the worker runtime.
pub(crate) struct Eraser {
    pool: Pool,
    log: EventLog,
    blocked_after: Duration,
    lease: crate::runtime::LeaseName,
    /// When the last look that found no open operation began (`None`: one was open).
    none_open: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Eraser {
    pub(crate) fn new(pool: Pool, log: EventLog, blocked_after: Duration) -> Self {
        Self {
            pool,
            log,
            blocked_after,
            lease: crate::runtime::LeaseName::new(LEASE),
            none_open: std::sync::Mutex::new(None),
        }
    }

    /// Whether the last look found no open operation, began after the last request's
    /// notification arrived, and is younger than [`RECHECK`]: then nothing can be open but an
    /// operation whose notification was lost.
    fn none_open_still(&self) -> bool {
        let none_open = *self.none_open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let requested = crate::runtime::last_notified(domain::records::DELETIONS_CHANNEL);
        none_open
            .is_some_and(|looked| looked.elapsed() < RECHECK && requested.is_none_or(|requested| requested < looked))
    }

    async fn pass(&self) -> anyhow::Result<crate::runtime::Outcome> {
        if self.none_open_still() {
            return Ok(crate::runtime::Outcome::Idle);
        }
        let mut client = self.pool.get().await?;
        // One statement on the partial index of open operations, without the lease.
        let looked = std::time::Instant::now();
        let open =
            client.prepare_cached("SELECT EXISTS (SELECT 1 FROM record_deletions WHERE state <> 'completed')").await?;
        metrics::counter!("eraser_looks_total").increment(1);
        let any_open = client.query_one(&open, &[]).await?.get::<_, bool>(0);
        *self.none_open.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = (!any_open).then_some(looked);
        if !any_open {
            return Ok(crate::runtime::Outcome::Idle);
        }
        let Some(lease) = crate::runtime::Lease::acquire(&mut client, &self.lease).await? else {
            return Ok(crate::runtime::Outcome::Idle);
        };
        let completed = run_pass(&self.pool, &self.log, self.blocked_after).await?;
        let checkpoint = lease.checkpoint + i64::try_from(completed).unwrap_or(0);
        lease.commit(checkpoint).await?;
        metrics::counter!("erasures_completed_total").increment(completed as u64);
        Ok(if completed > 0 { crate::runtime::Outcome::Progressed } else { crate::runtime::Outcome::Idle })
    }
}

impl crate::runtime::Worker for Eraser {
    fn name(&self) -> String {
        "eraser".to_owned()
    }

    fn channels(&self) -> &'static [&'static str] {
        &[domain::records::DELETIONS_CHANNEL, platform::readmodel::PROGRESS_CHANNEL]
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_millis(500)
    }

    fn step(&self) -> futures_util::future::BoxFuture<'_, anyhow::Result<crate::runtime::Outcome>> {
        Box::pin(self.pass())
    }

    fn lag(&self) -> futures_util::future::BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(async {
            let client = self.pool.get().await?;
            let open: i64 =
                client.query_one("SELECT count(*) FROM record_deletions WHERE state <> 'completed'", &[]).await?.get(0);
            metrics::gauge!("erasures_open").set(open as f64);
            Ok(None)
        })
    }
}
