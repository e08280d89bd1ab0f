//! Reads of the `workflows` read model: the space's workflows, one workflow with its
//! revisions, a workflow's runs and one run with a window of its step history.

use deadpool_postgres::Client;
use platform::error::ApiError;
use serde_json::Value;
use tokio_postgres::types::ToSql;

use super::revisions::{self, OpenRuns, Revision};
use super::stats::{self, Counters};
use super::window::{next_before, window};
use crate::consistency::page_of_docs;

/// A run as the API shows it, from `r` (a `runs` row).
const RUN: &str = "jsonb_build_object(
    'id', r.run_id, 'workflowId', r.workflow_id, 'status', r.status, 'contactId', r.contact_id,
    'trigger', jsonb_build_object('type', r.trigger_type, 'id', r.trigger_id),
    'requestedAt', to_char(r.requested_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'startedAt', to_char(r.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'finishedAt', to_char(r.finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'stepCount', r.step_count, 'currentStepId', r.current_step_id, 'error', r.error,
    'revision', r.revision, 'migrations', r.migrations)";

/// A history record as the API shows it, from `h`.
const RECORD: &str = "jsonb_build_object(
    'index', h.index, 'stepId', h.step_id, 'type', h.type, 'status', h.status,
    'startedAt', to_char(h.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'finishedAt', to_char(h.finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'error', h.error, 'emailId', h.email_id)";

/// A page of the space's workflows, by slug, with the total.
pub async fn page(
    client: &Client,
    w: &str,
    space_id: &str,
    (limit, offset): (i64, i64),
) -> Result<(i64, Vec<Value>), ApiError> {
    let count_sql = format!("SELECT total FROM {w}.workflow_counts WHERE space_id = $1");
    let rows_sql =
        format!("SELECT doc FROM {w}.workflows WHERE space_id = $1 ORDER BY slug, workflow_id LIMIT $2 OFFSET $3");
    let params: [&(dyn ToSql + Sync); 1] = [&space_id];
    page_of_docs(client, &count_sql, &rows_sql, &params, (limit, offset)).await
}

/// One workflow of the space, named by its id or its slug (an id wins), with its id.
pub async fn workflow(
    client: &Client,
    w: &str,
    space_id: &str,
    id_or_slug: &str,
) -> Result<Option<(String, Value)>, ApiError> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT workflow_id, doc FROM {w}.workflows WHERE space_id = $1 AND (workflow_id = $2 OR slug = $2)
             ORDER BY workflow_id = $2 DESC LIMIT 1"
        ))
        .await?;
    Ok(client.query_opt(&statement, &[&space_id, &id_or_slug]).await?.map(|row| (row.get(0), row.get(1))))
}

/// One workflow of the space (as [`workflow`] finds it) with its `revisions`.
pub async fn workflow_with_revisions(
    client: &Client,
    w: &str,
    space_id: &str,
    id_or_slug: &str,
) -> Result<Option<Value>, ApiError> {
    let Some((workflow_id, mut document)) = workflow(client, w, space_id, id_or_slug).await? else { return Ok(None) };
    document["revisions"] = revisions_of(client, w, &workflow_id).await?;
    Ok(Some(document))
}

/// The revisions of one workflow of the space (`revisions::document`); `None` when the space
/// has no such workflow.
pub async fn revisions(client: &Client, w: &str, space_id: &str, id_or_slug: &str) -> Result<Option<Value>, ApiError> {
    let Some((workflow_id, _)) = workflow(client, w, space_id, id_or_slug).await? else { return Ok(None) };
    revisions_of(client, w, &workflow_id).await.map(Some)
}

/// The workflow's revisions with their open runs, by step.
async fn revisions_of(client: &Client, w: &str, workflow_id: &str) -> Result<Value, ApiError> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT revision, status, in_flight,
                    to_char(defined_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')
             FROM {w}.revisions WHERE workflow_id = $1"
        ))
        .await?;
    let defined: Vec<Revision> = client
        .query(&statement, &[&workflow_id])
        .await?
        .iter()
        .map(|row| Revision { revision: row.get(0), status: row.get(1), in_flight: row.get(2), defined_at: row.get(3) })
        .collect();
    // The statuses of `runs_open_by_revision`'s predicate, so that this reads that index.
    let statement = client
        .prepare_cached(&format!(
            "SELECT revision, current_step_id, count(*) FROM {w}.runs
             WHERE workflow_id = $1 AND status IN ('waiting', 'running', 'sleeping') AND revision IS NOT NULL
             GROUP BY revision, current_step_id"
        ))
        .await?;
    let mut open_runs = OpenRuns::new();
    for row in client.query(&statement, &[&workflow_id]).await? {
        open_runs.entry(row.get(0)).or_default().insert(row.get(1), row.get(2));
    }
    Ok(revisions::document(defined, &open_runs))
}

/// The workflow's counts (`stats::document`); `None` when the space has no such workflow.
pub async fn stats(
    client: &Client,
    (w, m): (&str, &str),
    space_id: &str,
    id_or_slug: &str,
) -> Result<Option<Value>, ApiError> {
    let Some((workflow_id, workflow)) = workflow(client, w, space_id, id_or_slug).await? else { return Ok(None) };
    let workflow_id = workflow_id.as_str();
    let mut counters = Counters::default();
    let statement =
        client.prepare_cached(&format!("SELECT status, total FROM {w}.run_counts WHERE workflow_id = $1")).await?;
    for row in client.query(&statement, &[&workflow_id]).await? {
        counters.runs.insert(row.get(0), row.get(1));
    }
    let statement = client
        .prepare_cached(&format!("SELECT revision, status, total FROM {w}.revision_run_counts WHERE workflow_id = $1"))
        .await?;
    for row in client.query(&statement, &[&workflow_id]).await? {
        counters.by_revision.entry(row.get(0)).or_default().insert(row.get(1), row.get(2));
    }
    let statement = client
        .prepare_cached(&format!("SELECT step_id, measure, total FROM {w}.step_counts WHERE workflow_id = $1"))
        .await?;
    for row in client.query(&statement, &[&workflow_id]).await? {
        counters.steps.insert((row.get(0), row.get(1)), row.get(2));
    }
    let buckets: Vec<String> = workflow["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|step| step["type"] == "send_email")
        .filter_map(|step| step["id"].as_str().map(|id| format!("{workflow_id}/{id}")))
        .collect();
    let columns = stats::EMAIL_FIELDS.map(|(column, _)| column).join(", ");
    let statement = client
        .prepare_cached(&format!(
            "SELECT bucket_id, {columns} FROM {m}.email_counts WHERE bucket_kind = 'workflow_step' AND bucket_id = ANY($1)"
        ))
        .await?;
    for row in client.query(&statement, &[&buckets]).await? {
        let bucket: String = row.get(0);
        let step_id = bucket.rsplit_once('/').map_or(bucket.as_str(), |(_, step)| step).to_owned();
        let values = stats::EMAIL_FIELDS
            .iter()
            .enumerate()
            .map(|(index, (column, _))| ((*column).to_owned(), row.get::<_, i64>(index + 1)))
            .collect();
        counters.emails.insert(step_id, values);
    }
    Ok(Some(stats::document(&workflow, &counters)))
}

/// A page of the workflow's runs of `statuses`, newest first (by request time, then id), with
/// the total; `None` when the space has no such workflow.
pub async fn runs(
    client: &Client,
    w: &str,
    space_id: &str,
    (id_or_slug, statuses): (&str, &[String]),
    (limit, offset): (i64, i64),
) -> Result<Option<(i64, Vec<Value>)>, ApiError> {
    let Some((workflow_id, _)) = workflow(client, w, space_id, id_or_slug).await? else { return Ok(None) };
    let count_sql = format!(
        "SELECT COALESCE(sum(total), 0)::bigint FROM {w}.run_counts WHERE workflow_id = $1 AND status = ANY($2)"
    );
    let rows_sql = format!(
        "SELECT {RUN} FROM {w}.runs r WHERE r.workflow_id = $1 AND r.status = ANY($2)
         ORDER BY r.requested_at DESC, r.run_id DESC LIMIT $3 OFFSET $4"
    );
    let params: [&(dyn ToSql + Sync); 2] = [&workflow_id, &statuses];
    page_of_docs(client, &count_sql, &rows_sql, &params, (limit, offset)).await.map(Some)
}

/// A run of the workflow with the window of its step history before `before`; `None` when
/// the space has no such workflow, `Some(None)` when the workflow has no such run.
pub async fn run(
    client: &Client,
    w: &str,
    space_id: &str,
    (id_or_slug, run_id): (&str, &str),
    before: Option<i32>,
) -> Result<Option<Option<Value>>, ApiError> {
    let Some((workflow_id, _)) = workflow(client, w, space_id, id_or_slug).await? else { return Ok(None) };
    let statement = client
        .prepare_cached(&format!(
            "SELECT {RUN}, r.step_count FROM {w}.runs r
             WHERE r.workflow_id = $1 AND r.run_id = $2 AND r.space_id = $3"
        ))
        .await?;
    let Some(row) = client.query_opt(&statement, &[&workflow_id, &run_id, &space_id]).await? else {
        return Ok(Some(None));
    };
    let (mut document, step_count): (Value, i32) = (row.get(0), row.get(1));
    let (from, to) = window(step_count, before);
    let statement = client
        .prepare_cached(&format!(
            "SELECT COALESCE(jsonb_agg({RECORD} ORDER BY h.index), '[]'::jsonb) FROM {w}.history h
             WHERE h.run_id = $1 AND h.index BETWEEN $2 AND $3"
        ))
        .await?;
    let history: Value = client.query_one(&statement, &[&run_id, &from, &to]).await?.get(0);
    document["history"] = history;
    document["nextHistoryBeforeIndex"] = serde_json::json!(next_before((from, to)));
    Ok(Some(Some(document)))
}

/// Replay `replay_id` of workflow `id_or_slug`, from its stream in the log (its request, then
/// its report): `None` when the workflow is not in the space, `Some(None)` when the replay is
/// not one of its.
pub async fn replay(
    client: &Client,
    w: &str,
    space_id: &str,
    (id_or_slug, replay_id): (&str, &str),
) -> Result<Option<Option<Value>>, ApiError> {
    use platform::events::LogEvent;
    let Some((workflow_id, _)) = workflow(client, w, space_id, id_or_slug).await? else { return Ok(None) };
    let stream = domain::workflows::replay_stream_id(replay_id);
    let (mut requested, mut finished) = (None, None);
    for stored in platform::log::read_streams(client, &[stream]).await? {
        match stored.decode().map_err(|error| ApiError::internal(&error))? {
            LogEvent::WorkflowReplayRequested(event) => requested = Some(event),
            LogEvent::WorkflowReplayFinished(event) => finished = Some(event),
            _ => {}
        }
    }
    let requested = requested.filter(|event| event.workflow_id == workflow_id && event.space_id == space_id);
    Ok(Some(requested.map(|event| domain::workflows::replay_document(&event, finished.as_ref()))))
}
