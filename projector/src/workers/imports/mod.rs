//! The `imports` worker: decides the rows of imports' parts and appends their record writes.
//!
//! A step takes one waiting part (one process at a time, by an advisory lock held for the
//! step): the lowest part of an import whose earlier parts are all done, so a file's rows are
//! decided in order. It reads the part's rows as it decides them (never all at once), skips
//! those that already have a result, and decides the rest a wave at a time
//! (`domain::imports::decide`): the wave's identity holders, records and suppressed addresses
//! in one statement each, then one append per written row,
//! all sent at once so the log's batcher writes them as sets. A row's result is inserted by a
//! guard of its own append: a row has a result exactly when its write is in the log, so a step
//! killed anywhere resumes at the first row without one, and no row is written twice. Rows that
//! write nothing (unchanged, failed) get their results in one statement. Once every row has
//! one, the part's body is dropped.
//!
//! # Imports
//!
//! An import (`docs/decisions.md`, Bulk imports) brings a file of records in: through the API
//! (`PUT /imports/{id}`, its parts, `POST .../complete`) or the operator's `platform import`,
//! which writes the same tables directly.
//!
//! **Taking it in** (`command-service/src/imports/`). The create checks the column map against
//! the schema (`domain::imports::check_columns`) and stores the settings in `imports` with their
//! digest (a repeat compares it; other settings start an import that wrote no record again,
//! under the worker's advisory lock). A part is checked whole at the edge without building its
//! rows (`import-file`: decoded from UTF-8, UTF-16 by its mark or windows-1252, its
//! delimiter named by Excel's `sep=` first line or found in the header, no quoted cell left
//! open, its rows counted, at most 100,000; the header checked by
//! `check_header` before anything is stored; a row that cannot be read fails later, alone) and stored in `import_parts` with its digest, under a `FOR SHARE`
//! lock of the import's row that `complete` takes `FOR UPDATE`, so no part lands after the
//! import is closed. `GET /imports` lists the space's imports and `DELETE /imports/{id}` drops
//! one not completed (under the same lock). The CLI first checks everything that can refuse the
//! import, before it creates it: the column map, the header (read as the intake reads a part's),
//! then the whole file on a blocking thread (UTF-8, no row over 1 MB, no quoted cell left open;
//! a UTF-16 file is read through a UTF-8 copy), so a refusal leaves nothing behind; then it cuts
//! a file of any size at record boundaries (the `csv` reader's byte positions, with the file's
//! delimiter; line ends for NDJSON) into parts of at most 4 MB or 20,000 rows, each with the
//! file's `sep=` line and header, holding one part at a time.
//!
//! **Deciding rows** (`projector/src/workers/imports/`, worker `imports`, one process at a
//! time by an advisory lock held for a step). A step takes the lowest waiting part of an import
//! whose earlier parts are done, so a file's rows are decided in order. It reads the rows as it
//! decides them (`parse::rows`, an iterator: never a whole part at once), skips those with a
//! result (`import_rows`), and decides the rest in waves of 1,000 (100 while it yields to live
//! requests, below) (`domain::imports::decide`, pure): each row checked (the record rules' validation, a key to
//! be matched by, a consent source for any consent it grants), then matched and decided as an
//! upsert on what the wave read in one statement each: the identity holders, their records
//! (stream version, state, data key), and the suppressed addresses. A row that shares an
//! identity value or a record with an earlier row of the wave waits for the next wave, which
//! reads what the earlier one wrote. Each written row is its own append (its stream at the
//! version read, its identity claims and key guard, and the guard inserting its result),
//! all sent at once: the log's batcher groups them into transactions and, their guards having
//! set forms, writes each group with one statement per table; one row's lost race fails only
//! that row, which is decided again (five times at most, then `concurrent_modification`).
//! Rows that write nothing (unchanged, failed) get their results in one statement. At full
//! pace the next wave is decided while a wave's appends are written, so that deciding and
//! writing use the two cores together: its rows that touch what the appends write (one of
//! their identity values, or a record they write or whose value they may give up), and every
//! later row that touches one of those, wait for a later wave (`wave::waiting`); and when a row
//! in flight loses a race, the wave decided beside it is decided again after that row. Each wave
//! updates the part's counts; the last sets them from the results, drops the part's body and
//! stamps `done_at_ms`. The same worker sweeps what imports leave behind (`imports/expiry.rs`,
//! at most every minute, under its lock): one never completed that received nothing for
//! `APP__IMPORTS__RECEIVING_EXPIRY_SECONDS`, and one completed `APP__IMPORTS__RETENTION_SECONDS`
//! ago, are dropped with their parts and row results. After each wave the worker yields to
//! live requests: every command service (and the single-node process) writes its request rate
//! to `live_load` (`api::live_load`, every half second in which it served some), and the worker waits up to
//! `APP__IMPORTS__LIVE_YIELD` times the wave's time in proportion to the rate. Meanwhile its
//! waves are of 100 rows: the batcher's transactions of a wave hold the log's head until they
//! commit, and live appends wait behind them.
//!
//! **Exactly once across kill -9.** A row's result is inserted by its own append's guard, so a
//! row has a result exactly when its write is in the log; a step killed anywhere (or a
//! database restart) leaves the part's body, and the next step resumes at the first row without
//! a result. Rows that wrote nothing are decided again to the same answer. The process-level
//! test kills the worker and then PostgreSQL mid-import and counts records, `RecordCreated`
//! events, identities and `contact upserted` deliveries: each exactly once per row.
//!
//! **Provenance.** The appends carry the import's key in their metadata (none for the CLI) and
//! `RecordCreated/RecordUpdated.import` (id, consent label, file name); creates have
//! `source: import`. The audit trail shows it on consent entries (`importSource`). A row's
//! topics become `SubscriptionChanged` (source `import`) on the contact's subscriptions stream,
//! in the row's append, for each topic the wave read it was not subscribed to.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::time::Duration;

use anyhow::Context;
use deadpool_postgres::{GenericClient, Pool};
use domain::catalog::WriteContext;
use domain::imports::Settings;
use domain::imports::decide::{self, Checked, Facts, Provenance, Writes};
use domain::records::decide::WriteSchema;
use domain::records::write::identity_values;
use futures_util::future::BoxFuture;
use import_file as parse;
use platform::error::Code;
use platform::fresh::Drawn;
use platform::log::{AppendRequest, EventLog, Metadata};
use serde_json::Value;

use crate::runtime::{Outcome as StepOutcome, Worker};

/// Rows decided together.
const WAVE: usize = 1_000;
/// Rows decided together while the API servers serve requests. The log's batcher groups a
/// wave's appends into a few large transactions, each holding the log's head until its commit
/// (WAL flush included), and live writes queue behind them: beside
/// single creates at a steady 50/s, a CRM export in waves of 1,000 left their p99 at 7–10×
/// quiet, in waves of 250 at 2×, of 100 at 1.4×, for about a tenth less of the import's pace
/// (docs/benchmarks.md, issue 70, item 6).
const LIVE_WAVE: usize = 100;
/// How long to sleep when no part waits.
const POLL: Duration = Duration::from_millis(500);
/// One process at a time decides parts.
const LOCK: i64 = domain::imports::WORKER_LOCK;

mod expiry;
mod wave;

use wave::{Busy, Row, RowKeys, RowResult, Settled, Sorted, Tally};

pub struct Imports {
    pool: Pool,
    log: EventLog,
    expiry: expiry::Expiry,
    /// `APP__IMPORTS__LIVE_YIELD`.
    live_yield: f64,
}

impl Imports {
    pub fn new(pool: Pool, log: EventLog, settings: &platform::settings::ImportSettings) -> Self {
        Self { pool, log, expiry: expiry::Expiry::new(settings.clone()), live_yield: settings.live_yield }
    }

    async fn step(&self) -> anyhow::Result<StepOutcome> {
        self.expiry.sweep(&self.pool, platform::time::now_millis()).await?;
        let mut client = self.pool.get().await?;
        let waiting =
            client.query_opt("SELECT 1 FROM import_parts WHERE body IS NOT NULL LIMIT 1", &[]).await?.is_some();
        if !waiting {
            return Ok(StepOutcome::Idle);
        }
        let transaction = client.transaction().await?;
        transaction.batch_execute("SET LOCAL idle_in_transaction_session_timeout = 0").await?;
        if !transaction.query_one("SELECT pg_try_advisory_xact_lock($1)", &[&LOCK]).await?.get::<_, bool>(0) {
            return Ok(StepOutcome::Idle);
        }
        // The lowest waiting part of an import whose parts before it all arrived and are done.
        let Some(row) = transaction
            .query_opt(
                "SELECT p.space_id, p.import_id, p.part, p.body, i.schema_id, i.settings, i.actor_key_id
                 FROM import_parts p JOIN imports i ON i.space_id = p.space_id AND i.import_id = p.import_id
                 WHERE p.body IS NOT NULL
                 AND (SELECT count(*) FROM import_parts q WHERE q.space_id = p.space_id AND q.import_id = p.import_id
                      AND q.part < p.part AND q.body IS NULL) = p.part - 1
                 ORDER BY p.received_at_ms LIMIT 1",
                &[],
            )
            .await?
        else {
            return Ok(StepOutcome::Idle);
        };
        let part = Part {
            space_id: row.get(0),
            import_id: row.get(1),
            part: row.get(2),
            schema_id: row.get(4),
            actor_key_id: row.get(6),
        };
        let settings = Settings::from_document(&row.get::<_, Value>(5)).context("an import's settings")?;
        let body: Vec<u8> = row.get(3);
        drop(row);
        self.decide_part(&part, &settings, &body).await?;
        transaction.commit().await?;
        platform::db::release(client, body.len());
        Ok(StepOutcome::Progressed)
    }

    async fn decide_part(&self, part: &Part, settings: &Settings, body: &[u8]) -> anyhow::Result<()> {
        let client = self.pool.get().await?;
        let catalog = platform::readmodel::live_schema(&client, domain::catalog::CATALOG)
            .await?
            .context("the catalog has no live version")?;
        let context = reads::catalog::write_context(&client, &catalog, &part.space_id, &part.schema_id).await?;
        let mut tally = Tally::default();
        let done: HashSet<i32> = client
            .query(
                "SELECT row_number, status FROM import_rows WHERE space_id = $1 AND import_id = $2 AND part = $3",
                &[&part.space_id, &part.import_id, &part.part],
            )
            .await?
            .into_iter()
            .map(|row| {
                tally.count(row.get::<_, &str>(1));
                row.get(0)
            })
            .collect();
        let attributes = context.as_ref().map(|context| context.attributes.as_slice()).unwrap_or_default();
        // The part's rows are read as they are decided, a wave at a time: a part of 100,000
        // rows is never held as inputs at once.
        let text = parse::decode(body, settings.encoding);
        let mut rows = match text
            .as_deref()
            .map_err(String::clone)
            .and_then(|text| parse::rows(settings, text, attributes))
        {
            Ok(rows) => rows,
            Err(message) => {
                // The intake read it; only a changed parser could refuse it now.
                tracing::error!(import = %part.import_id, part = part.part, %message, "a stored part cannot be read");
                Box::new(std::iter::empty())
            }
        };
        let mut pending: VecDeque<Row> = VecDeque::new();
        let mut results = Vec::new();
        let provenance = Provenance {
            import_id: part.import_id.clone(),
            consent_label: settings.consent_label.clone(),
            file_name: settings.file_name.clone(),
        };
        let mut exhausted = false;
        let mut wave_size = api::live_load::first_step(&self.pool, self.live_yield, WAVE, LIVE_WAVE).await?;
        // The wave decided beside the last one's appends, to append next.
        let mut decided: Option<Decided> = None;
        loop {
            // Rows decided again come first; the rows are topped up from the part to two waves
            // (the one to decide now and the one to decide beside its appends), and the
            // results of rows that cannot be read are recorded a wave at a time too.
            while pending.len() < 2 * WAVE && results.len() < WAVE {
                let Some(row) = rows.next() else {
                    exhausted = true;
                    break;
                };
                if done.contains(&row.number) {
                    continue;
                }
                match row.input {
                    Ok(input) => pending.push_back((row.number, input, 0)),
                    Err(error) => results.push(RowResult::failed(row.number, None, error.code, error.message)),
                }
            }
            if context.is_none() {
                for (number, _, _) in pending.drain(..) {
                    let message = "the import's schema no longer exists".to_owned();
                    results.push(RowResult::failed(number, None, Code::SchemaNotFound, message));
                }
            }
            self.record(part, std::mem::take(&mut results), &mut tally).await?;
            let Some(context) = context.as_ref() else {
                if exhausted {
                    break;
                }
                continue;
            };
            let started = std::time::Instant::now();
            let mut current = match decided.take() {
                Some(current) => current,
                None if pending.is_empty() => {
                    if exhausted {
                        break;
                    }
                    continue;
                }
                None => {
                    let wave: Vec<_> = pending.drain(..pending.len().min(wave_size)).collect();
                    let mut current = self.decide_wave(part, (&catalog, context), &provenance, wave, None).await?;
                    requeue(&mut pending, std::mem::take(&mut current.later));
                    current
                }
            };
            self.record(part, std::mem::take(&mut current.results), &mut tally).await?;
            // While this wave's appends are written, the next wave is decided (at full pace
            // only: while live requests are served, one wave at a time), on what the appends
            // cannot change: its rows that touch them wait (`wave::waiting`).
            let next_wave: Option<Vec<Row>> =
                (wave_size == WAVE && !pending.is_empty()).then(|| pending.drain(..pending.len().min(WAVE)).collect());
            let busy = &current.busy;
            let (written, next) = tokio::join!(self.write_wave(part, std::mem::take(&mut current.appends)), async {
                match next_wave {
                    Some(wave) => {
                        Some(self.decide_wave(part, (&catalog, context), &provenance, wave, Some(busy)).await)
                    }
                    None => None,
                }
            });
            let written = written?;
            for status in written.counted {
                tally.count(status);
            }
            self.record(part, written.lost, &mut tally).await?;
            match next.transpose()? {
                // A row of this wave lost a race and is decided again: the next wave, decided
                // before that, is decided again after it.
                Some(next) if !written.again.is_empty() => {
                    requeue(&mut pending, written.again.into_iter().chain(next.rows).collect());
                }
                Some(mut next) => {
                    requeue(&mut pending, std::mem::take(&mut next.later));
                    decided = Some(next);
                }
                None => requeue(&mut pending, written.again),
            }
            self.save_tally(part, &tally, false).await?;
            let paused = api::live_load::yield_to_live(
                &self.pool,
                started.elapsed(),
                self.live_yield,
                "import_live_yield_milliseconds_total",
            )
            .await?;
            wave_size = api::live_load::next_step(paused, WAVE, LIVE_WAVE);
        }
        self.finish(part).await
    }

    /// Decides one wave: the results of its rows that write nothing, the appends of those that
    /// write, and the rows to decide in a later wave. `in_flight`: what a wave still appending
    /// writes, when this one is decided beside it; its rows that touch that wait.
    async fn decide_wave(
        &self,
        part: &Part,
        (catalog, context): (&str, &WriteContext),
        provenance: &Provenance,
        wave: Vec<Row>,
        in_flight: Option<&Busy>,
    ) -> anyhow::Result<Decided> {
        let schema = WriteSchema {
            schema_id: &context.schema.schema_id,
            space_id: &part.space_id,
            schema_type: &context.schema.schema_type,
            attributes: &context.attributes,
        };
        // Beside a wave in flight, the rows are kept whole: if that wave has rows to decide
        // again, this one is decided again after them.
        let rows = if in_flight.is_some() { wave.clone() } else { Vec::new() };
        let mut results = Vec::new();
        let mut checked = Vec::new();
        let mut kept = Vec::new();
        for (number, raw, attempts) in wave {
            match decide::check(&schema, provenance, raw.clone()) {
                Ok(row) => {
                    checked.push(row);
                    kept.push((number, raw, attempts));
                }
                Err((key, code, message)) => results.push(RowResult::failed(number, key, code, message)),
            }
        }
        let client = self.pool.get().await?;
        let read = read_facts(&client, catalog, &schema, &checked).await?;
        drop(client);
        let mut keys: Vec<RowKeys> = checked.iter().map(|row| RowKeys::of(&row.input, &read.owners)).collect();
        let mut later = Vec::new();
        if let Some(busy) = in_flight {
            let waits = wave::waiting(&keys, busy);
            let (mut going, mut going_rows, mut going_keys) = (Vec::new(), Vec::new(), Vec::new());
            for (((row, raw), row_keys), waits) in checked.into_iter().zip(kept).zip(keys).zip(waits) {
                if waits {
                    later.push(raw);
                } else {
                    going.push(row);
                    going_rows.push(raw);
                    going_keys.push(row_keys);
                }
            }
            (checked, kept, keys) = (going, going_rows, going_keys);
        }
        Ok(decided(&schema, provenance, &read, (checked, kept, keys), Parts { results, later, rows }))
    }

    /// Appends a decided wave's writes, each row its own append, all sent at once; answers
    /// the statuses of the rows written, the results of rows that lost too many races, and
    /// the rows to decide again (lost a race), in order.
    async fn write_wave(&self, part: &Part, appends: Vec<(Row, RowResult, Writes)>) -> anyhow::Result<Written> {
        let metadata = Metadata {
            space_id: Some(part.space_id.clone()),
            actor_key_id: part.actor_key_id.clone(),
            ..Metadata::default()
        };
        let sent = futures_util::future::join_all(appends.into_iter().map(|(row, result, writes)| {
            let mut guards = writes.guards;
            guards.push(result.guard(&part.space_id, &part.import_id, part.part));
            let request = AppendRequest::new(metadata.clone(), writes.streams, guards);
            async move { (row, result, self.log.append(request).await) }
        }))
        .await;
        let mut written = Written::default();
        for (row, result, appended) in sent {
            match wave::settle(row, &result, appended.map(drop))? {
                Settled::Counted(status) => written.counted.push(status),
                Settled::Again(row) => written.again.push(row),
                Settled::Lost(failed) => written.lost.push(failed),
                Settled::Taken => {}
            }
        }
        written.again.sort_by_key(|(number, _, _)| *number);
        Ok(written)
    }

    /// Inserts the results of rows that write nothing.
    async fn record(&self, part: &Part, results: Vec<RowResult>, tally: &mut Tally) -> anyhow::Result<()> {
        if results.is_empty() {
            return Ok(());
        }
        let client = self.pool.get().await?;
        let numbers: Vec<i32> = results.iter().map(|result| result.number).collect();
        let statuses: Vec<&str> = results.iter().map(|result| result.status).collect();
        let records: Vec<Option<&str>> = results.iter().map(|result| result.record_id.as_deref()).collect();
        let fields: Vec<Option<&str>> =
            results.iter().map(|result| result.key.as_ref().map(|(field, _)| *field)).collect();
        let values: Vec<Option<&str>> =
            results.iter().map(|result| result.key.as_ref().map(|(_, value)| value.as_str())).collect();
        let codes: Vec<Option<&str>> = results.iter().map(|result| result.code.map(|code| code.as_str())).collect();
        let messages: Vec<Option<&str>> = results.iter().map(|result| result.message.as_deref()).collect();
        let warnings: Vec<&Value> = results.iter().map(|result| &result.warnings).collect();
        let inserted = client
            .execute(
                "INSERT INTO import_rows (space_id, import_id, part, row_number, status, record_id, key_field,
                                          key_value, code, message, warnings)
                 SELECT $1, $2, $3, * FROM unnest($4::int[], $5::text[], $6::text[], $7::text[], $8::text[],
                                                  $9::text[], $10::text[], $11::jsonb[])
                 ON CONFLICT DO NOTHING",
                &[
                    &part.space_id,
                    &part.import_id,
                    &part.part,
                    &numbers,
                    &statuses,
                    &records,
                    &fields,
                    &values,
                    &codes,
                    &messages,
                    &warnings,
                ],
            )
            .await?;
        if inserted as usize == results.len() {
            for result in &results {
                tally.count(result.status);
            }
        }
        Ok(())
    }

    async fn save_tally(&self, part: &Part, tally: &Tally, done: bool) -> anyhow::Result<()> {
        let client = self.pool.get().await?;
        client
            .execute(
                "UPDATE import_parts SET created = $4, updated = $5, unchanged = $6, failed = $7,
                        body = CASE WHEN $8 THEN NULL ELSE body END,
                        done_at_ms = CASE WHEN $8 THEN $9 ELSE done_at_ms END
                 WHERE space_id = $1 AND import_id = $2 AND part = $3",
                &[
                    &part.space_id,
                    &part.import_id,
                    &part.part,
                    &tally.created,
                    &tally.updated,
                    &tally.unchanged,
                    &tally.failed,
                    &done,
                    &platform::time::now_millis(),
                ],
            )
            .await?;
        Ok(())
    }

    /// Every row has its result: the counts are read back from them (the truth after any
    /// crash), and the part's body leaves.
    async fn finish(&self, part: &Part) -> anyhow::Result<()> {
        let client = self.pool.get().await?;
        let mut tally = Tally::default();
        for row in client
            .query(
                "SELECT status, count(*)::int FROM import_rows WHERE space_id = $1 AND import_id = $2 AND part = $3
                 GROUP BY status",
                &[&part.space_id, &part.import_id, &part.part],
            )
            .await?
        {
            tally.add(row.get(0), row.get(1));
        }
        self.save_tally(part, &tally, true).await?;
        tracing::info!(import = %part.import_id, part = part.part, created = tally.created, updated = tally.updated,
            unchanged = tally.unchanged, failed = tally.failed, "import part decided");
        Ok(())
    }
}

impl Worker for Imports {
    fn name(&self) -> String {
        "imports".to_owned()
    }

    fn channels(&self) -> &'static [&'static str] {
        &[]
    }

    fn poll_interval(&self) -> Duration {
        POLL
    }

    fn step(&self) -> BoxFuture<'_, anyhow::Result<StepOutcome>> {
        Box::pin(Imports::step(self))
    }

    fn lag(&self) -> BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(async { Ok(None) })
    }
}

/// A wave decided and not yet appended.
struct Decided {
    /// The results of its rows that write nothing (unchanged, failed).
    results: Vec<RowResult>,
    /// Its rows that write, each with its result (inserted by its append's guard) and writes.
    appends: Vec<(Row, RowResult, Writes)>,
    /// Its rows to decide in a later wave, in order: deferred by the decision, or waiting for
    /// the wave in flight.
    later: Vec<Row>,
    /// What its appends write (and its deferred rows will), for the wave decided beside them.
    busy: Busy,
    /// All its rows, when it was decided beside a wave in flight (else none).
    rows: Vec<Row>,
}

/// What became of a wave's appends.
#[derive(Default)]
struct Written {
    /// The statuses of the rows written.
    counted: Vec<&'static str>,
    /// The rows to decide again (each lost a race), in order.
    again: Vec<Row>,
    /// The results of rows that lost too many races.
    lost: Vec<RowResult>,
}

/// Puts `rows` (earlier in the part than any row left in `pending`) back at its front, in order.
fn requeue(pending: &mut VecDeque<Row>, mut rows: Vec<Row>) {
    rows.sort_by_key(|(number, _, _)| *number);
    for row in rows.into_iter().rev() {
        pending.push_front(row);
    }
}

/// What a wave's decision adds its outcomes to: the results and later rows so far, and the
/// wave's rows when it was decided beside a wave in flight.
struct Parts {
    results: Vec<RowResult>,
    later: Vec<Row>,
    rows: Vec<Row>,
}

/// The decision of a wave's rows that go ahead (checked, as read, with their keys), on what
/// the wave read.
fn decided(
    schema: &WriteSchema<'_>,
    provenance: &Provenance,
    read: &Read,
    (checked, kept, keys): (Vec<Checked>, Vec<Row>, Vec<RowKeys>),
    Parts { mut results, mut later, rows }: Parts,
) -> Decided {
    let facts = Facts {
        owners: &read.owners,
        records: &read.records,
        suppressed: &read.suppressed,
        topics: &read.topics,
        subscriptions: &read.subscriptions,
    };
    let outcomes = decide::decide_wave(schema, provenance, checked, &facts, (platform::time::now_millis(), &mut Drawn));
    let mut busy = Busy::default();
    for (keys, outcome) in keys.into_iter().zip(&outcomes) {
        match outcome {
            decide::Outcome::Created { record_id, .. } | decide::Outcome::Updated { record_id, .. } => {
                busy.add(&keys.with_record(record_id));
            }
            decide::Outcome::Deferred => busy.add(&keys),
            decide::Outcome::Unchanged { .. } | decide::Outcome::Failed { .. } => {}
        }
    }
    let Sorted { retry, results: decided, appends } = wave::sort(kept, outcomes);
    results.extend(decided);
    later.extend(retry);
    later.sort_by_key(|(number, _, _)| *number);
    Decided { results, appends, later, busy, rows }
}

/// The part a step decides.
struct Part {
    space_id: String,
    import_id: String,
    part: i32,
    schema_id: String,
    actor_key_id: Option<String>,
}

/// What a wave decides on (see [`Facts`]).
struct Read {
    owners: domain::records::decide::Owners,
    records: BTreeMap<String, (i64, domain::records::Loaded)>,
    suppressed: HashSet<String>,
    topics: BTreeMap<String, String>,
    subscriptions: BTreeMap<String, BTreeMap<String, String>>,
}

/// What a wave decides on: the holders of its identity values, the records they and its ids
/// name, which of its addresses are suppressed, and (when a row lists topics) the space's
/// topics and those records' subscriptions.
async fn read_facts(
    client: &impl GenericClient,
    catalog: &str,
    schema: &WriteSchema<'_>,
    rows: &[Checked],
) -> anyhow::Result<Read> {
    let values: BTreeSet<(&'static str, String)> = rows.iter().flat_map(|row| identity_values(&row.input)).collect();
    let values: Vec<(&str, String)> = values.into_iter().collect();
    let owners = reads::records::identity_owners(client, schema.space_id, schema.schema_id, &values).await?;
    let ids: BTreeSet<String> =
        owners.values().cloned().chain(rows.iter().filter_map(|row| row.input.id.clone())).collect();
    let ids: Vec<String> = ids.into_iter().collect();
    let records = reads::records::load_records(client, &ids)
        .await?
        .into_iter()
        .map(|(record_id, version, loaded)| (record_id, (version, loaded)))
        .collect();
    let emails: Vec<&str> = values.iter().filter(|(key, _)| *key == "email").map(|(_, value)| value.as_str()).collect();
    let suppressed = mail::facts::suppressed(client, schema.space_id, &emails).await?;
    let (mut topics, mut subscriptions) = (BTreeMap::new(), BTreeMap::new());
    if rows.iter().any(|row| !row.topics.is_empty()) {
        for (topic_id, topic) in reads::email::topics(client, catalog, schema.space_id).await? {
            topics.insert(topic.slug, topic_id.clone());
            topics.insert(topic.name, topic_id.clone());
            topics.insert(topic_id.clone(), topic_id);
        }
        subscriptions = reads::email::subscriptions_of(client, &ids).await?;
    }
    Ok(Read { owners, records, suppressed, topics, subscriptions })
}
