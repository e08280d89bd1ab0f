//! `GET /broadcasts`, `GET /broadcasts/{id}`, `GET /broadcasts/{id}/runs` and
//! `GET /broadcasts/{id}/runs/{runId}`.

use actix_web::{HttpRequest, HttpResponse, web};
use api::http::{data_body, page_body, query_pairs};
use api::pagination::PageRequest;
use deadpool_postgres::Client;
use platform::error::{ApiError, Code};
use serde_json::Value;
use tokio_postgres::types::ToSql;

use crate::State;
use crate::consistency::{authorize_read, consistent_read, page_of_docs, respond};

const BROADCASTS: &str = "broadcasts";

/// A run as the API shows it, with its counts, from `r` (a `broadcast_runs` row).
const RUN: &str = "jsonb_build_object(
    'id', r.run_id, 'broadcastId', r.broadcast_id, 'status', r.status, 'templateId', r.template_id,
    'senderId', r.sender_id, 'audience', r.audience,
    'startAt', to_char(r.start_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'requestedAt', to_char(r.requested_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'startedAt', to_char(r.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'finishedAt', to_char(r.finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'error', r.error,
    'counts', (
        SELECT jsonb_build_object(
            'audience', r.audience_count,
            'pending', count(*) FILTER (WHERE x.state = 'pending'),
            'queued', count(*) FILTER (WHERE x.state = 'scheduled' AND o.state IN ('pending', 'attempting')),
            'sent', count(*) FILTER (WHERE o.state = 'sent'),
            'failed', count(*) FILTER (WHERE o.state = 'failed'),
            'outcomeUnknown', count(*) FILTER (WHERE o.state = 'unknown'),
            'skipped', jsonb_build_object(
                'notSubscribed', count(*) FILTER (WHERE x.reason = 'not_subscribed'),
                'suppressed', count(*) FILTER (WHERE x.reason = 'suppressed'),
                'allowance', count(*) FILTER (WHERE x.reason = 'allowance'),
                'noAddress', count(*) FILTER (WHERE x.reason = 'no_address'),
                'gone', count(*) FILTER (WHERE x.reason = 'gone')))
        FROM broadcast_recipients x LEFT JOIN email_outbox o ON o.email_id = x.email_id
        WHERE x.run_id = r.run_id))";

fn not_found(broadcast_id: &str) -> ApiError {
    ApiError::not_found(Code::BroadcastNotFound, format!("no broadcast {broadcast_id:?} in this space"))
}

pub async fn list(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let page = PageRequest::parse(&query_pairs(&req))?;
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (limit, offset) = (page.limit(), page.offset());
    let ((total, items), consistent) = consistent_read(&state, &caller, token, &[BROADCASTS], |client, models| {
        let (b, space_id) = (models.schema(BROADCASTS), space_id.clone());
        Box::pin(async move {
            let count_sql = format!("SELECT total FROM {b}.broadcast_counts WHERE space_id = $1");
            let rows_sql = format!(
                "SELECT doc FROM {b}.broadcasts WHERE space_id = $1 ORDER BY slug, broadcast_id LIMIT $2 OFFSET $3"
            );
            let params: [&(dyn ToSql + Sync); 1] = [&space_id];
            page_of_docs(client, &count_sql, &rows_sql, &params, (limit, offset)).await
        })
    })
    .await?;
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}

async fn broadcast(client: &Client, b: &str, space_id: &str, broadcast_id: &str) -> Result<Option<Value>, ApiError> {
    let statement = client
        .prepare_cached(&format!("SELECT doc FROM {b}.broadcasts WHERE space_id = $1 AND broadcast_id = $2"))
        .await?;
    Ok(client.query_opt(&statement, &[&space_id, &broadcast_id]).await?.map(|row| row.get(0)))
}

pub async fn get(req: HttpRequest, path: web::Path<String>, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let broadcast_id = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (document, consistent) = consistent_read(&state, &caller, token, &[BROADCASTS], |client, models| {
        let (b, space_id, broadcast_id) = (models.schema(BROADCASTS), space_id.clone(), broadcast_id.clone());
        Box::pin(async move { broadcast(client, &b, &space_id, &broadcast_id).await })
    })
    .await?;
    let document = document.ok_or_else(|| not_found(&broadcast_id))?;
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
    let (found, consistent) = consistent_read(&state, &caller, token, &[BROADCASTS], |client, models| {
        let (b, space_id, broadcast_id) = (models.schema(BROADCASTS), space_id.clone(), broadcast_id.clone());
        Box::pin(async move {
            if broadcast(client, &b, &space_id, &broadcast_id).await?.is_none() {
                return Ok(None);
            }
            let count_sql = "SELECT count(*) FROM broadcast_runs WHERE broadcast_id = $1";
            let rows_sql = format!(
                "SELECT {RUN} FROM broadcast_runs r WHERE r.broadcast_id = $1
                 ORDER BY r.requested_at DESC, r.run_id DESC LIMIT $2 OFFSET $3"
            );
            let params: [&(dyn ToSql + Sync); 1] = [&broadcast_id];
            page_of_docs(client, count_sql, &rows_sql, &params, (limit, offset)).await.map(Some)
        })
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
    let (broadcast_id, run_id) = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (found, consistent) = consistent_read(&state, &caller, token, &[BROADCASTS], |client, models| {
        let (b, space_id, broadcast_id, run_id) =
            (models.schema(BROADCASTS), space_id.clone(), broadcast_id.clone(), run_id.clone());
        Box::pin(async move {
            if broadcast(client, &b, &space_id, &broadcast_id).await?.is_none() {
                return Ok(None);
            }
            let statement = client
                .prepare_cached(&format!(
                    "SELECT {RUN} FROM broadcast_runs r WHERE r.broadcast_id = $1 AND r.run_id = $2"
                ))
                .await?;
            Ok(Some(client.query_opt(&statement, &[&broadcast_id, &run_id]).await?.map(|row| row.get::<_, Value>(0))))
        })
    })
    .await?;
    let document = found.ok_or_else(|| not_found(&broadcast_id))?.ok_or_else(|| {
        ApiError::not_found(Code::BroadcastRunNotFound, format!("no run {run_id:?} of this broadcast"))
    })?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}
