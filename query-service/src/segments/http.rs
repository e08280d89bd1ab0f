//! `GET /segments`, `GET /segments/{id}` and `GET /segments/{id}/contacts`.

use actix_web::{HttpRequest, HttpResponse, web};
use api::http::{data_body, page_body, query_pairs};
use api::pagination::PageRequest;
use deadpool_postgres::Client;
use platform::error::{ApiError, Code};
use serde_json::Value;
use tokio_postgres::types::ToSql;

use crate::State;
use crate::consistency::{authorize_read, consistent_read, page_of_docs, respond};

const SEGMENTS: &str = "segments";
/// The most contacts one page of a segment's contacts holds, whatever `limit` asks.
pub const CONTACTS_PAGE_CAP: i64 = 100;

/// A segment as the API shows it.
const DOCUMENT: &str = "g.doc || jsonb_build_object('memberCount', g.member_count)";

fn not_found(segment_id: &str) -> ApiError {
    ApiError::not_found(Code::SegmentNotFound, format!("no segment {segment_id:?} in this space"))
}

pub async fn list(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let page = PageRequest::parse(&query_pairs(&req))?;
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (limit, offset) = (page.limit(), page.offset());
    let ((total, items), consistent) = consistent_read(&state, &caller, token, &[SEGMENTS], |client, models| {
        let (g, space_id) = (models.schema(SEGMENTS), space_id.clone());
        Box::pin(async move {
            let count_sql = format!("SELECT total FROM {g}.segment_counts WHERE space_id = $1");
            let rows_sql = format!(
                "SELECT {DOCUMENT} FROM {g}.segments g WHERE g.space_id = $1
                 ORDER BY g.created_at DESC, g.segment_id DESC LIMIT $2 OFFSET $3"
            );
            let params: [&(dyn ToSql + Sync); 1] = [&space_id];
            page_of_docs(client, &count_sql, &rows_sql, &params, (limit, offset)).await
        })
    })
    .await?;
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}

async fn segment(client: &Client, g: &str, space_id: &str, segment_id: &str) -> Result<Option<Value>, ApiError> {
    let statement = client
        .prepare_cached(&format!("SELECT {DOCUMENT} FROM {g}.segments g WHERE g.space_id = $1 AND g.segment_id = $2"))
        .await?;
    Ok(client.query_opt(&statement, &[&space_id, &segment_id]).await?.map(|row| row.get(0)))
}

pub async fn get(req: HttpRequest, path: web::Path<String>, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let segment_id = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (document, consistent) = consistent_read(&state, &caller, token, &[SEGMENTS], |client, models| {
        let (g, space_id, segment_id) = (models.schema(SEGMENTS), space_id.clone(), segment_id.clone());
        Box::pin(async move { segment(client, &g, &space_id, &segment_id).await })
    })
    .await?;
    let document = document.ok_or_else(|| not_found(&segment_id))?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}

/// The segment's contacts as record documents, by contact id; a page holds at most
/// [`CONTACTS_PAGE_CAP`] rows whatever `limit` says, and `pagination.limit` reports the
/// applied size.
pub async fn contacts(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let segment_id = path.into_inner();
    let mut page = PageRequest::parse(&query_pairs(&req))?;
    page.cap_silently(CONTACTS_PAGE_CAP);
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (limit, offset) = (page.limit(), page.offset());
    let (found, consistent) = consistent_read(&state, &caller, token, &[SEGMENTS], |client, models| {
        let (g, space_id, segment_id) = (models.schema(SEGMENTS), space_id.clone(), segment_id.clone());
        Box::pin(async move {
            if segment(client, &g, &space_id, &segment_id).await?.is_none() {
                return Ok(None);
            }
            let count_sql = format!("SELECT member_count FROM {g}.segments WHERE segment_id = $1");
            let rows_sql = format!(
                "SELECT c.doc FROM {g}.members m JOIN {g}.contacts c USING (contact_id)
                 WHERE m.segment_id = $1 ORDER BY m.contact_id LIMIT $2 OFFSET $3"
            );
            let params: [&(dyn ToSql + Sync); 1] = [&segment_id];
            page_of_docs(client, &count_sql, &rows_sql, &params, (limit, offset)).await.map(Some)
        })
    })
    .await?;
    let (total, items) = found.ok_or_else(|| not_found(&segment_id))?;
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}
