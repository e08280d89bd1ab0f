//! How the `workflows` read model writes a batch's fold: the new and changed runs, the
//! counters by status, by revision and by step, and the history records, each set-wise in one
//! statement whatever the batch holds.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::Transaction;
use serde_json::Value;

use super::{Finished, Record, Run, at};

/// Adds `deltas` ((workflow, step, measure) → change) to the step counters, in one statement.
pub(super) async fn write_step_counts(
    transaction: &Transaction<'_>,
    s: &str,
    deltas: BTreeMap<(String, String, String), i64>,
) -> anyhow::Result<()> {
    if deltas.is_empty() {
        return Ok(());
    }
    let (mut workflow_ids, mut step_ids, mut measures, mut totals) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for ((workflow_id, step_id, measure), total) in deltas {
        workflow_ids.push(workflow_id);
        step_ids.push(step_id);
        measures.push(measure);
        totals.push(total);
    }
    let statement = transaction
        .prepare_cached(&format!(
            "WITH counted AS (
                 SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[])
                     AS c(workflow_id, step_id, measure, n))
             {}",
            ADD_STEP_COUNTS.replace("{s}", s)
        ))
        .await?;
    transaction.execute(&statement, &[&workflow_ids, &step_ids, &measures, &totals]).await?;
    Ok(())
}

/// What a batch leaves of runs, column by column: what the changed ones are updated with.
#[derive(Default)]
pub(super) struct ChangedRuns {
    run_ids: Vec<String>,
    statuses: Vec<String>,
    started_at: Vec<Option<DateTime<Utc>>>,
    finished_at: Vec<Option<DateTime<Utc>>>,
    errors: Vec<Option<Value>>,
    step_counts: Vec<i32>,
    current_step_ids: Vec<Option<String>>,
    revisions: Vec<Option<i64>>,
    migrations: Vec<Value>,
}

impl ChangedRuns {
    pub(super) fn push(&mut self, run_id: String, run: Run) {
        self.run_ids.push(run_id);
        self.statuses.push(run.status);
        self.started_at.push(run.started_at);
        self.finished_at.push(run.finished_at);
        self.errors.push(run.error);
        self.step_counts.push(run.step_count);
        self.current_step_ids.push(run.current_step_id);
        self.revisions.push(run.revision);
        self.migrations.push(Value::Array(run.migrations));
    }

    pub(super) async fn write(&self, transaction: &Transaction<'_>, s: &str) -> anyhow::Result<()> {
        if self.run_ids.is_empty() {
            return Ok(());
        }
        let statement = transaction
            .prepare_cached(&format!(
                "UPDATE {s}.runs r SET status = u.status, started_at = u.started_at, finished_at = u.finished_at,
                     error = u.error, step_count = u.step_count, current_step_id = u.current_step_id,
                     revision = u.revision, migrations = u.migrations
                 FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::timestamptz[], $5::jsonb[], $6::int4[],
                     $7::text[], $8::int8[], $9::jsonb[])
                     AS u(run_id, status, started_at, finished_at, error, step_count, current_step_id, revision,
                         migrations)
                 WHERE r.run_id = u.run_id"
            ))
            .await?;
        transaction.execute(&statement, &self.params()).await?;
        Ok(())
    }

    fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 9] {
        [
            &self.run_ids,
            &self.statuses,
            &self.started_at,
            &self.finished_at,
            &self.errors,
            &self.step_counts,
            &self.current_step_ids,
            &self.revisions,
            &self.migrations,
        ]
    }
}

/// Runs the batch requested: the columns of [`ChangedRuns`] and what a request sets.
#[derive(Default)]
pub(super) struct NewRuns {
    runs: ChangedRuns,
    workflow_ids: Vec<String>,
    space_ids: Vec<String>,
    contact_ids: Vec<Option<String>>,
    trigger_types: Vec<String>,
    trigger_ids: Vec<String>,
    requested_at: Vec<DateTime<Utc>>,
}

impl NewRuns {
    pub(super) fn push(&mut self, run_id: String, requested: platform::proto::WorkflowRunRequested, run: Run) {
        self.runs.push(run_id, run);
        self.workflow_ids.push(requested.workflow_id);
        self.space_ids.push(requested.space_id);
        self.contact_ids.push(Some(requested.contact_id).filter(|id| !id.is_empty()));
        self.trigger_types.push(requested.trigger);
        self.trigger_ids.push(requested.trigger_id);
        self.requested_at.push(at(requested.requested_at_ms));
    }

    pub(super) async fn write(&self, transaction: &Transaction<'_>, s: &str) -> anyhow::Result<()> {
        if self.runs.run_ids.is_empty() {
            return Ok(());
        }
        let statement = transaction
            .prepare_cached(&format!(
                "INSERT INTO {s}.runs (run_id, status, started_at, finished_at, error, step_count, current_step_id,
                     revision, migrations, workflow_id, space_id, contact_id, trigger_type, trigger_id, requested_at)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::timestamptz[], $5::jsonb[],
                     $6::int4[], $7::text[], $8::int8[], $9::jsonb[], $10::text[], $11::text[], $12::text[],
                     $13::text[], $14::text[], $15::timestamptz[])
                 ON CONFLICT (run_id) DO NOTHING"
            ))
            .await?;
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = self.runs.params().to_vec();
        params.extend([
            &self.workflow_ids as &(dyn tokio_postgres::types::ToSql + Sync),
            &self.space_ids,
            &self.contact_ids,
            &self.trigger_types,
            &self.trigger_ids,
            &self.requested_at,
        ]);
        transaction.execute(&statement, &params).await?;
        Ok(())
    }
}

/// Adds the batch's net moves between statuses to the counters, in one statement.
pub(super) async fn write_counts(
    transaction: &Transaction<'_>,
    s: &str,
    counts: BTreeMap<(String, String), i64>,
) -> anyhow::Result<()> {
    let (mut workflow_ids, mut statuses, mut deltas) = (Vec::new(), Vec::new(), Vec::new());
    for ((workflow_id, status), delta) in counts {
        if delta != 0 {
            workflow_ids.push(workflow_id);
            statuses.push(status);
            deltas.push(delta);
        }
    }
    if workflow_ids.is_empty() {
        return Ok(());
    }
    let statement = transaction
        .prepare_cached(&format!(
            "INSERT INTO {s}.run_counts (workflow_id, status, total)
             SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
             ON CONFLICT (workflow_id, status) DO UPDATE SET total = run_counts.total + EXCLUDED.total"
        ))
        .await?;
    transaction.execute(&statement, &[&workflow_ids, &statuses, &deltas]).await?;
    Ok(())
}

/// Adds the batch's net moves between revisions and statuses to the revision counters, in one
/// statement.
pub(super) async fn write_revision_counts(
    transaction: &Transaction<'_>,
    s: &str,
    counts: BTreeMap<(String, i64, String), i64>,
) -> anyhow::Result<()> {
    let (mut workflow_ids, mut revisions, mut statuses, mut deltas) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for ((workflow_id, revision, status), delta) in counts {
        if delta != 0 {
            workflow_ids.push(workflow_id);
            revisions.push(revision);
            statuses.push(status);
            deltas.push(delta);
        }
    }
    if workflow_ids.is_empty() {
        return Ok(());
    }
    let statement = transaction
        .prepare_cached(&format!(
            "INSERT INTO {s}.revision_run_counts (workflow_id, revision, status, total)
             SELECT * FROM unnest($1::text[], $2::int8[], $3::text[], $4::bigint[])
             ON CONFLICT (workflow_id, revision, status) DO UPDATE SET total = revision_run_counts.total + EXCLUDED.total"
        ))
        .await?;
    transaction.execute(&statement, &[&workflow_ids, &revisions, &statuses, &deltas]).await?;
    Ok(())
}

/// Adds the steps the statement before counted (`counted`: workflow, step, measure, n) to the
/// step counters.
const ADD_STEP_COUNTS: &str = "INSERT INTO {s}.step_counts (workflow_id, step_id, measure, total)
    SELECT workflow_id, step_id, measure, n FROM counted
    ON CONFLICT (workflow_id, step_id, measure) DO UPDATE SET total = step_counts.total + EXCLUDED.total";

/// Writes the batch's history records: started ones where absent, finished ones over what is
/// there (keeping its start). Each record written for the first time counts as a step
/// `entered`, each finished one under its status (a skipped one also under its reason), in
/// the same statements: a record is written once, so it is counted once. `owners` holds each
/// record's run (as run ids and their workflows' ids).
pub(super) async fn write_history(
    transaction: &Transaction<'_>,
    s: &str,
    records: BTreeMap<(String, i32), Record>,
    owners: &(Vec<String>, Vec<String>),
) -> anyhow::Result<()> {
    let (mut started, mut finished) = (HistoryColumns::default(), HistoryColumns::default());
    for ((run_id, index), record) in records {
        let columns = if record.finished.is_some() { &mut finished } else { &mut started };
        columns.push(run_id, index, record);
    }
    if !started.run_ids.is_empty() {
        let statement = transaction
            .prepare_cached(&format!(
                "WITH added AS (
                     INSERT INTO {s}.history (run_id, index, step_id, type, status, started_at, finished_at, error, email_id)
                     SELECT * FROM unnest($1::text[], $2::int4[], $3::text[], $4::text[], $5::text[],
                         $6::timestamptz[], $7::timestamptz[], $8::jsonb[], $9::text[])
                     ON CONFLICT (run_id, index) DO NOTHING RETURNING run_id, step_id),
                 counted AS (
                     SELECT r.workflow_id, a.step_id, 'entered' AS measure, count(*) AS n
                     FROM added a JOIN unnest($10::text[], $11::text[]) AS r(run_id, workflow_id) USING (run_id)
                     GROUP BY r.workflow_id, a.step_id)
                 {}",
                ADD_STEP_COUNTS.replace("{s}", s)
            ))
            .await?;
        started.execute(transaction, &statement, owners).await?;
    }
    if !finished.run_ids.is_empty() {
        let statement = transaction
            .prepare_cached(&format!(
                "WITH written AS (
                     INSERT INTO {s}.history (run_id, index, step_id, type, status, started_at, finished_at, error, email_id)
                     SELECT * FROM unnest($1::text[], $2::int4[], $3::text[], $4::text[], $5::text[],
                         $6::timestamptz[], $7::timestamptz[], $8::jsonb[], $9::text[])
                     ON CONFLICT (run_id, index) DO UPDATE SET status = EXCLUDED.status,
                         finished_at = EXCLUDED.finished_at, error = EXCLUDED.error, email_id = EXCLUDED.email_id
                     RETURNING run_id, step_id, status, COALESCE(error ->> 'gate', error ->> 'code') AS reason,
                         (xmax = 0) AS inserted),
                 measures AS (
                     SELECT run_id, step_id, 'entered' AS measure FROM written WHERE inserted
                     UNION ALL SELECT run_id, step_id, status FROM written
                     UNION ALL SELECT run_id, step_id, 'skipped:' || reason FROM written
                         WHERE status = 'skipped' AND reason IS NOT NULL),
                 counted AS (
                     SELECT r.workflow_id, m.step_id, m.measure, count(*) AS n
                     FROM measures m JOIN unnest($10::text[], $11::text[]) AS r(run_id, workflow_id) USING (run_id)
                     GROUP BY r.workflow_id, m.step_id, m.measure)
                 {}",
                ADD_STEP_COUNTS.replace("{s}", s)
            ))
            .await?;
        finished.execute(transaction, &statement, owners).await?;
    }
    Ok(())
}

/// History records, column by column.
#[derive(Default)]
struct HistoryColumns {
    run_ids: Vec<String>,
    indexes: Vec<i32>,
    step_ids: Vec<String>,
    types: Vec<String>,
    statuses: Vec<String>,
    started_at: Vec<DateTime<Utc>>,
    finished_at: Vec<Option<DateTime<Utc>>>,
    errors: Vec<Option<Value>>,
    email_ids: Vec<Option<String>>,
}

impl HistoryColumns {
    pub(super) fn push(&mut self, run_id: String, index: i32, record: Record) {
        let (status, finished_at, error, email_id) = match record.finished {
            Some(Finished { status, at, error, email_id }) => (status, Some(at), error, email_id),
            None => ("running".to_owned(), None, None, None),
        };
        self.run_ids.push(run_id);
        self.indexes.push(index);
        self.step_ids.push(record.step_id);
        self.types.push(record.step_type);
        self.statuses.push(status);
        self.started_at.push(record.started_at);
        self.finished_at.push(finished_at);
        self.errors.push(error);
        self.email_ids.push(email_id);
    }

    async fn execute(
        &self,
        transaction: &Transaction<'_>,
        statement: &tokio_postgres::Statement,
        owners: &(Vec<String>, Vec<String>),
    ) -> anyhow::Result<()> {
        transaction
            .execute(
                statement,
                &[
                    &self.run_ids,
                    &self.indexes,
                    &self.step_ids,
                    &self.types,
                    &self.statuses,
                    &self.started_at,
                    &self.finished_at,
                    &self.errors,
                    &self.email_ids,
                    &owners.0,
                    &owners.1,
                ],
            )
            .await?;
        Ok(())
    }
}
