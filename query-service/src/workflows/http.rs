//! The workflow reads: the space's workflows, one workflow (with its revisions), its counts, its
//! revisions, a workflow's runs (newest first, filtered by status), one run with a window of
//! its step history, and a replay of the workflow (from its stream in the log).

use actix_web::{HttpRequest, HttpResponse, web};
use api::http::{data_body, page_body, query_pairs};
use api::pagination::PageRequest;
use platform::error::{ApiError, Code};

use super::store;
use crate::State;
use crate::consistency::{authorize_read, consistent_read, respond};

const WORKFLOWS: &str = "workflows";
/// The read model that counts a send step's emails.
const EMAILS: &str = "emails";
const STATUSES: [&str; 6] = ["waiting", "running", "sleeping", "completed", "exited", "failed"];

fn not_found(workflow_id: &str) -> ApiError {
    ApiError::of(Code::WorkflowNotFound, format!("no workflow {workflow_id:?} in this space"))
}

fn bad_query(message: String) -> ApiError {
    ApiError::of(Code::InvalidQueryParameter, message)
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

pub async fn list(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let page = PageRequest::parse(&query_pairs(&req))?;
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (limit, offset) = (page.limit(), page.offset());
    let ((total, items), consistent) = consistent_read(&state, &caller, token, &[WORKFLOWS], |client, models| {
        let (w, space_id) = (models.schema(WORKFLOWS), space_id.clone());
        Box::pin(async move { store::page(client, &w, &space_id, (limit, offset)).await })
    })
    .await?;
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}

/// The workflow, with its revisions (as `revisions` answers them).
pub async fn get(req: HttpRequest, path: web::Path<String>, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let workflow_id = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (document, consistent) = consistent_read(&state, &caller, token, &[WORKFLOWS], |client, models| {
        let (w, space_id, workflow_id) = (models.schema(WORKFLOWS), space_id.clone(), workflow_id.clone());
        Box::pin(async move { store::workflow_with_revisions(client, &w, &space_id, &workflow_id).await })
    })
    .await?;
    let document = document.ok_or_else(|| not_found(&workflow_id))?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}

/// The workflow's revisions, newest first: each as defined, whether it is the current one or
/// still holds runs, and where its open runs are.
pub async fn revisions(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let workflow_id = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (document, consistent) = consistent_read(&state, &caller, token, &[WORKFLOWS], |client, models| {
        let (w, space_id, workflow_id) = (models.schema(WORKFLOWS), space_id.clone(), workflow_id.clone());
        Box::pin(async move { store::revisions(client, &w, &space_id, &workflow_id).await })
    })
    .await?;
    let document = document.ok_or_else(|| not_found(&workflow_id))?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}

/// The workflow's counts: runs by status, and per step what runs did there.
pub async fn stats(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let workflow_id = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (document, consistent) = consistent_read(&state, &caller, token, &[WORKFLOWS, EMAILS], |client, models| {
        let (w, m) = (models.schema(WORKFLOWS), models.schema(EMAILS));
        let (space_id, workflow_id) = (space_id.clone(), workflow_id.clone());
        Box::pin(async move { store::stats(client, (&w, &m), &space_id, &workflow_id).await })
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
        Box::pin(async move { store::runs(client, &w, &space_id, (&workflow_id, &statuses), (limit, offset)).await })
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
        Box::pin(async move { store::run(client, &w, &space_id, (&workflow_id, &run_id), before).await })
    })
    .await?;
    let document = found
        .ok_or_else(|| not_found(&workflow_id))?
        .ok_or_else(|| ApiError::of(Code::WorkflowRunNotFound, format!("no run {run_id:?} of this workflow")))?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}

/// A replay of the workflow: `running` until its report is on the log.
pub async fn replay(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (workflow_id, replay_id) = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (found, consistent) = consistent_read(&state, &caller, token, &[WORKFLOWS], |client, models| {
        let (w, space_id, workflow_id, replay_id) =
            (models.schema(WORKFLOWS), space_id.clone(), workflow_id.clone(), replay_id.clone());
        Box::pin(async move { store::replay(client, &w, &space_id, (&workflow_id, &replay_id)).await })
    })
    .await?;
    let document = found.ok_or_else(|| not_found(&workflow_id))?.ok_or_else(|| {
        ApiError::of(Code::WorkflowReplayNotFound, format!("no replay {replay_id:?} of this workflow"))
    })?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}
