//! `GET /segments`, `GET /segments/{id}` and `GET /segments/{id}/contacts`.

use actix_web::{HttpRequest, HttpResponse, web};
use api::http::{data_body, page_body, query_pairs};
use api::pagination::PageRequest;
use platform::error::{ApiError, Code};

use super::store;
use crate::State;
use crate::consistency::{authorize_read, consistent_read, respond};

const SEGMENTS: &str = "segments";
/// The most contacts one page of a segment's contacts holds, whatever `limit` asks.
pub(crate) const CONTACTS_PAGE_CAP: i64 = 100;

fn not_found(segment_id: &str) -> ApiError {
    ApiError::of(Code::SegmentNotFound, format!("no segment {segment_id:?} in this space"))
}

pub async fn list(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let page = PageRequest::parse(&query_pairs(&req))?;
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (limit, offset) = (page.limit(), page.offset());
    let ((total, items), consistent) = consistent_read(&state, &caller, token, &[SEGMENTS], |client, models| {
        let (g, space_id) = (models.schema(SEGMENTS), space_id.clone());
        Box::pin(async move { store::page(client, &g, &space_id, (limit, offset)).await })
    })
    .await?;
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}

pub async fn get(req: HttpRequest, path: web::Path<String>, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let segment_id = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (document, consistent) = consistent_read(&state, &caller, token, &[SEGMENTS], |client, models| {
        let (g, space_id, segment_id) = (models.schema(SEGMENTS), space_id.clone(), segment_id.clone());
        Box::pin(async move { store::segment(client, &g, &space_id, &segment_id).await })
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
        Box::pin(async move { store::contacts(client, &g, &space_id, &segment_id, (limit, offset)).await })
    })
    .await?;
    let (total, items) = found.ok_or_else(|| not_found(&segment_id))?;
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}
