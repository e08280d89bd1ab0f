//! The workflows read model: each workflow as authored with its pause state and API document,
//! each run with its status, and each run's step history (one record per execution, from its
//! `WorkflowStepStarted` and `WorkflowStepFinished`). One read model, so that one consistency
//! check covers a workflow and its runs. Totals are maintained counters. Every fold takes its
//! times from the events' own fields, so a rebuild gives the same rows.

use deadpool_postgres::Transaction;
use serde_json::{Value, json};
use shared::events::LogEvent;
use shared::log::StoredEvent;
use shared::workflows::{WORKFLOW, WorkflowDef};

pub(super) const DDL: &str = "
CREATE TABLE {s}.workflows (
    workflow_id text PRIMARY KEY,
    space_id text NOT NULL,
    slug text NOT NULL,
    revision bigint NOT NULL,
    definition jsonb NOT NULL,
    paused boolean NOT NULL DEFAULT false,
    doc jsonb NOT NULL
);
CREATE INDEX ON {s}.workflows (space_id, slug);
CREATE TABLE {s}.workflow_counts (space_id text PRIMARY KEY, total bigint NOT NULL);
CREATE TABLE {s}.runs (
    run_id text PRIMARY KEY,
    workflow_id text NOT NULL,
    space_id text NOT NULL,
    status text NOT NULL,
    contact_id text,
    trigger_type text NOT NULL,
    trigger_id text NOT NULL,
    requested_at timestamptz NOT NULL,
    started_at timestamptz,
    finished_at timestamptz,
    step_count integer NOT NULL DEFAULT 0,
    current_step_id text,
    error jsonb
);
CREATE INDEX ON {s}.runs (workflow_id, requested_at DESC, run_id DESC);
CREATE INDEX ON {s}.runs (workflow_id, status, requested_at DESC, run_id DESC);
CREATE TABLE {s}.run_counts (
    workflow_id text NOT NULL,
    status text NOT NULL,
    total bigint NOT NULL,
    PRIMARY KEY (workflow_id, status)
);
CREATE TABLE {s}.history (
    run_id text NOT NULL,
    index integer NOT NULL,
    step_id text NOT NULL,
    type text NOT NULL,
    status text NOT NULL,
    started_at timestamptz NOT NULL,
    finished_at timestamptz,
    error jsonb,
    PRIMARY KEY (run_id, index)
);
";

pub(super) const EVENT_TYPES: &[&str] = &[
    "ResourceDefined.v1",
    "WorkflowPaused.v1",
    "WorkflowUnpaused.v1",
    "WorkflowRunRequested.v1",
    "WorkflowRunStarted.v1",
    "WorkflowStepStarted.v1",
    "WorkflowRunSleeping.v1",
    "WorkflowStepFinished.v1",
    "WorkflowRunPaused.v1",
    "WorkflowRunResumed.v1",
    "WorkflowRunFinished.v1",
];

fn at(ms: i64) -> chrono::DateTime<chrono::Utc> {
    shared::time::from_millis(ms)
}

fn error_of(code: &str, message: &str) -> Option<Value> {
    (!code.is_empty()).then(|| json!({"code": code, "message": message}))
}

pub(super) async fn apply(transaction: &Transaction<'_>, s: &str, event: &StoredEvent) -> anyhow::Result<()> {
    match event.decode()? {
        LogEvent::ResourceDefined(resource) if resource.kind == WORKFLOW => {
            let definition: WorkflowDef = serde_json::from_str(&resource.definition_json)?;
            let paused: bool = transaction
                .query_opt(
                    &format!("SELECT paused FROM {s}.workflows WHERE workflow_id = $1"),
                    &[&resource.resource_id],
                )
                .await?
                .is_some_and(|row| row.get(0));
            let doc = definition.document(&resource.resource_id, resource.revision, paused);
            let statement = transaction
                .prepare_cached(&format!(
                    "WITH written AS (
                         INSERT INTO {s}.workflows (workflow_id, space_id, slug, revision, definition, paused, doc)
                         VALUES ($1, $2, $3, $4, $5, false, $6)
                         ON CONFLICT (workflow_id) DO UPDATE SET slug = EXCLUDED.slug, revision = EXCLUDED.revision,
                             definition = EXCLUDED.definition, doc = EXCLUDED.doc
                         RETURNING space_id, (xmax = 0) AS inserted)
                     INSERT INTO {s}.workflow_counts (space_id, total) SELECT space_id, 1 FROM written WHERE inserted
                     ON CONFLICT (space_id) DO UPDATE SET total = workflow_counts.total + 1"
                ))
                .await?;
            let stored = serde_json::to_value(&definition)?;
            transaction
                .execute(
                    &statement,
                    &[&resource.resource_id, &resource.space_id, &definition.slug, &resource.revision, &stored, &doc],
                )
                .await?;
        }
        LogEvent::WorkflowPaused(paused) => set_paused(transaction, s, &paused.workflow_id, true).await?,
        LogEvent::WorkflowUnpaused(unpaused) => set_paused(transaction, s, &unpaused.workflow_id, false).await?,
        LogEvent::WorkflowRunRequested(requested) => {
            let contact_id = Some(requested.contact_id.clone()).filter(|id| !id.is_empty());
            let inserted = transaction
                .execute(
                    &format!(
                        "INSERT INTO {s}.runs (run_id, workflow_id, space_id, status, contact_id, trigger_type, trigger_id,
                             requested_at)
                         VALUES ($1, $2, $3, 'waiting', $4, $5, $6, $7) ON CONFLICT (run_id) DO NOTHING"
                    ),
                    &[
                        &requested.run_id,
                        &requested.workflow_id,
                        &requested.space_id,
                        &contact_id,
                        &requested.trigger,
                        &requested.trigger_id,
                        &at(requested.requested_at_ms),
                    ],
                )
                .await?;
            if inserted == 1 {
                count(transaction, s, &requested.workflow_id, "waiting", 1).await?;
            }
        }
        LogEvent::WorkflowRunStarted(started) => {
            set_status(transaction, s, &started.run_id, "running", Some(started.at_ms), None).await?;
        }
        LogEvent::WorkflowStepStarted(started) => {
            transaction
                .execute(
                    &format!(
                        "INSERT INTO {s}.history (run_id, index, step_id, type, status, started_at)
                         VALUES ($1, $2, $3, $4, 'running', $5) ON CONFLICT (run_id, index) DO NOTHING"
                    ),
                    &[&started.run_id, &started.index, &started.step_id, &started.step_type, &at(started.at_ms)],
                )
                .await?;
            transaction
                .execute(
                    &format!(
                        "UPDATE {s}.runs SET step_count = GREATEST(step_count, $2), current_step_id = $3 WHERE run_id = $1"
                    ),
                    &[&started.run_id, &started.index, &started.step_id],
                )
                .await?;
        }
        LogEvent::WorkflowRunSleeping(sleeping) => {
            set_status(transaction, s, &sleeping.run_id, "sleeping", None, None).await?;
        }
        LogEvent::WorkflowStepFinished(finished) => {
            let error = error_of(&finished.error_code, &finished.error_message);
            transaction
                .execute(
                    &format!(
                        "INSERT INTO {s}.history (run_id, index, step_id, type, status, started_at, finished_at, error)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                         ON CONFLICT (run_id, index) DO UPDATE SET status = EXCLUDED.status,
                             finished_at = EXCLUDED.finished_at, error = EXCLUDED.error"
                    ),
                    &[
                        &finished.run_id,
                        &finished.index,
                        &finished.step_id,
                        &finished.step_type,
                        &finished.status,
                        &at(finished.started_at_ms),
                        &at(finished.at_ms),
                        &error,
                    ],
                )
                .await?;
            let next = Some(finished.next_step_id.clone()).filter(|id| !id.is_empty());
            transaction
                .execute(
                    &format!(
                        "UPDATE {s}.runs SET step_count = GREATEST(step_count, $2), current_step_id = $3 WHERE run_id = $1"
                    ),
                    &[&finished.run_id, &finished.index, &next],
                )
                .await?;
            set_status(transaction, s, &finished.run_id, "running", None, None).await?;
        }
        LogEvent::WorkflowRunPaused(paused) => {
            set_status(transaction, s, &paused.run_id, "waiting", None, None).await?
        }
        LogEvent::WorkflowRunResumed(resumed) => {
            set_status(transaction, s, &resumed.run_id, "running", None, None).await?;
        }
        LogEvent::WorkflowRunFinished(finished) => {
            let error = error_of(&finished.error_code, &finished.error_message);
            set_status(transaction, s, &finished.run_id, &finished.status, None, Some((finished.at_ms, error))).await?;
        }
        _ => {}
    }
    Ok(())
}

async fn set_paused(transaction: &Transaction<'_>, s: &str, workflow_id: &str, paused: bool) -> anyhow::Result<()> {
    let row = transaction
        .query_opt(&format!("SELECT revision, definition FROM {s}.workflows WHERE workflow_id = $1"), &[&workflow_id])
        .await?;
    let Some(row) = row else { return Ok(()) };
    let definition: WorkflowDef = serde_json::from_value(row.get(1))?;
    let doc = definition.document(workflow_id, row.get(0), paused);
    transaction
        .execute(
            &format!("UPDATE {s}.workflows SET paused = $2, doc = $3 WHERE workflow_id = $1"),
            &[&workflow_id, &paused, &doc],
        )
        .await?;
    Ok(())
}

/// Moves a run to `status` (keeping the counters), with its start or its end.
async fn set_status(
    transaction: &Transaction<'_>,
    s: &str,
    run_id: &str,
    status: &str,
    started_at_ms: Option<i64>,
    finished: Option<(i64, Option<Value>)>,
) -> anyhow::Result<()> {
    let row = transaction
        .query_opt(&format!("SELECT workflow_id, status FROM {s}.runs WHERE run_id = $1 FOR UPDATE"), &[&run_id])
        .await?;
    let Some(row) = row else { return Ok(()) };
    let (workflow_id, previous): (String, String) = (row.get(0), row.get(1));
    // A finished run stays finished (a replayed batch changes nothing).
    if ["completed", "exited", "failed"].contains(&previous.as_str()) {
        return Ok(());
    }
    let (finished_at, error) = match &finished {
        Some((at_ms, error)) => (Some(at(*at_ms)), error.clone()),
        None => (None, None),
    };
    transaction
        .execute(
            &format!(
                "UPDATE {s}.runs SET status = $2, started_at = COALESCE(started_at, $3),
                     finished_at = COALESCE($4, finished_at), error = COALESCE($5, error),
                     current_step_id = CASE WHEN $4::timestamptz IS NULL THEN current_step_id END
                 WHERE run_id = $1"
            ),
            &[&run_id, &status, &started_at_ms.map(at), &finished_at, &error],
        )
        .await?;
    if previous != status {
        count(transaction, s, &workflow_id, &previous, -1).await?;
        count(transaction, s, &workflow_id, status, 1).await?;
    }
    Ok(())
}

async fn count(transaction: &Transaction<'_>, s: &str, workflow_id: &str, status: &str, by: i64) -> anyhow::Result<()> {
    transaction
        .execute(
            &format!(
                "INSERT INTO {s}.run_counts (workflow_id, status, total) VALUES ($1, $2, $3)
                 ON CONFLICT (workflow_id, status) DO UPDATE SET total = run_counts.total + EXCLUDED.total"
            ),
            &[&workflow_id, &status, &by],
        )
        .await?;
    Ok(())
}

read_model! {
    /// Workflows, their runs and their step histories.
    Workflows = "workflows", each
}
