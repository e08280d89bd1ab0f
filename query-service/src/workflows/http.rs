//! The workflow reads: the space's workflows, one workflow, a workflow's runs (newest first,
//! filtered by status) and one run with a window of its step history.

use actix_web::{HttpRequest, HttpResponse, web};
use api::http::{data_body, page_body, query_pairs};
use api::pagination::PageRequest;
use deadpool_postgres::Client;
use platform::error::{ApiError, Code};
use serde_json::Value;
use tokio_postgres::types::ToSql;

use super::window::{next_before, window};
use crate::State;
use crate::consistency::{authorize_read, consistent_read, page_of_docs, respond};

const WORKFLOWS: &str = "workflows";
const STATUSES: [&str; 6] = ["waiting", "running", "sleeping", "completed", "exited", "failed"];

/// A run as the API shows it, from `r` (a `runs` row).
const RUN: &str = "jsonb_build_object(
    'id', r.run_id, 'workflowId', r.workflow_id, 'status', r.status, 'contactId', r.contact_id,
    'trigger', jsonb_build_object('type', r.trigger_type, 'id', r.trigger_id),
    'requestedAt', to_char(r.requested_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'startedAt', to_char(r.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'finishedAt', to_char(r.finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'stepCount', r.step_count, 'currentStepId', r.current_step_id, 'error', r.error)";

/// A history record as the API shows it, from `h`.
const RECORD: &str = "jsonb_build_object(
    'index', h.index, 'stepId', h.step_id, 'type', h.type, 'status', h.status,
    'startedAt', to_char(h.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'finishedAt', to_char(h.finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'error', h.error)";

fn not_found(workflow_id: &str) -> ApiError {
    ApiError::not_found(Code::WorkflowNotFound, format!("no workflow {workflow_id:?} in this space"))
}

fn bad_query(message: String) -> ApiError {
    ApiError::bad_request(Code::InvalidQueryParameter, message)
}

/// The statuses `status` asks for (one value, a comma list, or repeated); `None`: every one.
fn parse_statuses(query: &[(String, String)]) -> Result<Option<Vec<String>>, ApiError> {
    let mut statuses: Vec<String> = Vec::new();
    for (_, value) in query.iter().filter(|(key, _)| key == "status") {
        for value in value.split(',').map(str::trim) {
            if !STATUSES.contains(&value) {
                return Err(bad_query(format!("status must be one of {}; got {value:?}", STATUSES.join(", "))));
            }
            if !statuses.iter().any(|status| status == value) {
                statuses.push(value.to_owned());
            }
        }
    }
    Ok((!statuses.is_empty()).then_some(statuses))
}

/// `history_before`: an integer of at least 1 (a larger one than any index reads to the end).
fn parse_before(query: &[(String, String)]) -> Result<Option<i32>, ApiError> {
    let Some((_, value)) = query.iter().rev().find(|(key, _)| key == "history_before") else { return Ok(None) };
    let digits = value.trim().strip_prefix('+').unwrap_or(value.trim());
    let positive =
        !digits.is_empty() && digits.bytes().all(|byte| byte.is_ascii_digit()) && digits.bytes().any(|b| b != b'0');
    if !positive {
        return Err(bad_query(format!(
            "history_before must be an integer of at least 1 (a nextHistoryBeforeIndex); got {value:?}"
        )));
    }
    Ok(Some(digits.parse::<i32>().unwrap_or(i32::MAX)))
}

async fn workflow(client: &Client, w: &str, space_id: &str, workflow_id: &str) -> Result<Option<Value>, ApiError> {
    let statement = client
        .prepare_cached(&format!("SELECT doc FROM {w}.workflows WHERE space_id = $1 AND workflow_id = $2"))
        .await?;
    Ok(client.query_opt(&statement, &[&space_id, &workflow_id]).await?.map(|row| row.get(0)))
}

pub async fn list(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let page = PageRequest::parse(&query_pairs(&req))?;
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (limit, offset) = (page.limit(), page.offset());
    let ((total, items), consistent) = consistent_read(&state, &caller, token, &[WORKFLOWS], |client, models| {
        let (w, space_id) = (models.schema(WORKFLOWS), space_id.clone());
        Box::pin(async move {
            let count_sql = format!("SELECT total FROM {w}.workflow_counts WHERE space_id = $1");
            let rows_sql = format!(
                "SELECT doc FROM {w}.workflows WHERE space_id = $1 ORDER BY slug, workflow_id LIMIT $2 OFFSET $3"
            );
            let params: [&(dyn ToSql + Sync); 1] = [&space_id];
            page_of_docs(client, &count_sql, &rows_sql, &params, (limit, offset)).await
        })
    })
    .await?;
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}

pub async fn get(req: HttpRequest, path: web::Path<String>, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let workflow_id = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (document, consistent) = consistent_read(&state, &caller, token, &[WORKFLOWS], |client, models| {
        let (w, space_id, workflow_id) = (models.schema(WORKFLOWS), space_id.clone(), workflow_id.clone());
        Box::pin(async move { workflow(client, &w, &space_id, &workflow_id).await })
    })
    .await?;
    let document = document.ok_or_else(|| not_found(&workflow_id))?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}

/// The workflow's runs, newest first (by request time, then id), of the statuses asked for.
pub async fn runs(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let workflow_id = path.into_inner();
    let query = query_pairs(&req);
    let page = PageRequest::parse(&query)?;
    let statuses = parse_statuses(&query)?;
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (limit, offset) = (page.limit(), page.offset());
    let (found, consistent) = consistent_read(&state, &caller, token, &[WORKFLOWS], |client, models| {
        let (w, space_id, workflow_id) = (models.schema(WORKFLOWS), space_id.clone(), workflow_id.clone());
        let statuses = statuses.clone().unwrap_or_else(|| STATUSES.iter().map(|s| (*s).to_owned()).collect());
        Box::pin(async move {
            if workflow(client, &w, &space_id, &workflow_id).await?.is_none() {
                return Ok(None);
            }
            let count_sql = format!(
                "SELECT COALESCE(sum(total), 0)::bigint FROM {w}.run_counts WHERE workflow_id = $1 AND status = ANY($2)"
            );
            let rows_sql = format!(
                "SELECT {RUN} FROM {w}.runs r WHERE r.workflow_id = $1 AND r.status = ANY($2)
                 ORDER BY r.requested_at DESC, r.run_id DESC LIMIT $3 OFFSET $4"
            );
            let params: [&(dyn ToSql + Sync); 2] = [&workflow_id, &statuses];
            page_of_docs(client, &count_sql, &rows_sql, &params, (limit, offset)).await.map(Some)
        })
    })
    .await?;
    let (total, items) = found.ok_or_else(|| not_found(&workflow_id))?;
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}

/// A run with its step-history window.
pub async fn run(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (workflow_id, run_id) = path.into_inner();
    let before = parse_before(&query_pairs(&req))?;
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (found, consistent) = consistent_read(&state, &caller, token, &[WORKFLOWS], |client, models| {
        let (w, space_id, workflow_id, run_id) =
            (models.schema(WORKFLOWS), space_id.clone(), workflow_id.clone(), run_id.clone());
        Box::pin(async move {
            if workflow(client, &w, &space_id, &workflow_id).await?.is_none() {
                return Ok(None);
            }
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
        })
    })
    .await?;
    let document = found
        .ok_or_else(|| not_found(&workflow_id))?
        .ok_or_else(|| ApiError::not_found(Code::WorkflowRunNotFound, format!("no run {run_id:?} of this workflow")))?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}
