//! `GET /broadcasts`, `GET /broadcasts/{id}`, `GET /broadcasts/{id}/runs`,
//! `GET /broadcasts/{id}/runs/{runId}` and `GET /broadcasts/{id}/runs/{runId}/links`.

use actix_web::{HttpRequest, HttpResponse, web};
use api::http::{data_body, page_body, query_pairs};
use api::pagination::PageRequest;
use platform::error::{ApiError, Code};

use super::store;
use crate::State;
use crate::consistency::{authorize_read, consistent_read, respond};

const BROADCASTS: &str = "broadcasts";
/// The read model that counts a run's emails.
const EMAILS: &str = "emails";
/// The read model of business events, where an experiment's conversions are found.
const EVENTS: &str = "events";

fn not_found(broadcast_id: &str) -> ApiError {
    ApiError::of(Code::BroadcastNotFound, format!("no broadcast {broadcast_id:?} in this space"))
}

pub async fn list(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let page = PageRequest::parse(&query_pairs(&req))?;
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (limit, offset) = (page.limit(), page.offset());
    let ((total, items), consistent) = consistent_read(&state, &caller, token, &[BROADCASTS], |client, models| {
        let (b, space_id) = (models.schema(BROADCASTS), space_id.clone());
        Box::pin(async move { store::page(client, &b, &space_id, (limit, offset)).await })
    })
    .await?;
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}

pub async fn get(req: HttpRequest, path: web::Path<String>, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let broadcast_id = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (document, consistent) = consistent_read(&state, &caller, token, &[BROADCASTS], |client, models| {
        let (b, space_id, broadcast_id) = (models.schema(BROADCASTS), space_id.clone(), broadcast_id.clone());
        Box::pin(async move { store::broadcast(client, &b, &space_id, &broadcast_id).await })
    })
    .await?;
    let (_, document) = document.ok_or_else(|| not_found(&broadcast_id))?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}

/// The broadcast's runs, newest first (by request time, then id).
pub async fn runs(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let broadcast_id = path.into_inner();
    let page = PageRequest::parse(&query_pairs(&req))?;
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (limit, offset) = (page.limit(), page.offset());
    let (found, consistent) = consistent_read(&state, &caller, token, &[BROADCASTS, EMAILS], |client, models| {
        let (b, m) = (models.schema(BROADCASTS), models.schema(EMAILS));
        let (space_id, broadcast_id) = (space_id.clone(), broadcast_id.clone());
        Box::pin(async move { store::runs(client, (&b, &m), &space_id, &broadcast_id, (limit, offset)).await })
    })
    .await?;
    let (total, items) = found.ok_or_else(|| not_found(&broadcast_id))?;
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}

pub async fn run(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    of_run(req, path, state, store::OfRun::Run).await
}

/// The clicks of each link of a run, by cohort, variant and position.
pub async fn links(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    of_run(req, path, state, store::OfRun::Links).await
}

/// What `read` shows of a run of the broadcast.
async fn of_run(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<State>,
    read: store::OfRun,
) -> Result<HttpResponse, ApiError> {
    let (broadcast_id, run_id) = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let models = [BROADCASTS, EMAILS, EVENTS];
    let (found, consistent) = consistent_read(&state, &caller, token, &models, |client, models| {
        let (b, m, v) = (models.schema(BROADCASTS), models.schema(EMAILS), models.schema(EVENTS));
        let (space_id, broadcast_id, run_id) = (space_id.clone(), broadcast_id.clone(), run_id.clone());
        Box::pin(async move { store::of_run(client, (&b, &m, &v), &space_id, (&broadcast_id, &run_id), read).await })
    })
    .await?;
    let document = found
        .ok_or_else(|| not_found(&broadcast_id))?
        .ok_or_else(|| ApiError::of(Code::BroadcastRunNotFound, format!("no run {run_id:?} of this broadcast")))?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}
