//! `GET /webhooks` and `GET /webhooks/{id}`.

use actix_web::{HttpRequest, HttpResponse, web};
use api::http::{data_body, page_body, query_pairs};
use api::pagination::PageRequest;
use platform::error::{ApiError, Code};

use super::store;
use crate::State;
use crate::consistency::{authorize_read, consistent_read, respond};

const WEBHOOKS: &str = "webhooks";

pub async fn list(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let page = PageRequest::parse(&query_pairs(&req))?;
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (limit, offset) = (page.limit(), page.offset());
    let ((total, items), consistent) = consistent_read(&state, &caller, token, &[WEBHOOKS], |client, models| {
        let (w, space_id) = (models.schema(WEBHOOKS), space_id.clone());
        Box::pin(async move { store::page(client, &w, &space_id, (limit, offset)).await })
    })
    .await?;
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}

pub async fn get(req: HttpRequest, path: web::Path<String>, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let webhook_id = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (document, consistent) = consistent_read(&state, &caller, token, &[WEBHOOKS], |client, models| {
        let (w, space_id, webhook_id) = (models.schema(WEBHOOKS), space_id.clone(), webhook_id.clone());
        Box::pin(async move { store::get(client, &w, &space_id, &webhook_id).await })
    })
    .await?;
    let document = document
        .ok_or_else(|| ApiError::of(Code::WebhookNotFound, format!("no webhook {webhook_id:?} in this space")))?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}

/// Where the next page of a delivery log starts.
#[derive(serde::Serialize, serde::Deserialize)]
struct DeliveryCursor {
    /// The last delivery's creation time (microseconds) and id.
    t: i64,
    i: String,
}

fn decode_cursor(text: &str) -> Result<(chrono::DateTime<chrono::Utc>, String), ApiError> {
    let malformed = || ApiError::of(Code::InvalidCursor, "cursor is malformed; pass nextCursor as given");
    let bytes = api::pagination::opaque_cursor_bytes(text).ok_or_else(malformed)?;
    let cursor: DeliveryCursor = serde_json::from_slice(&bytes).map_err(|_| malformed())?;
    let at = chrono::DateTime::from_timestamp_micros(cursor.t).ok_or_else(malformed)?;
    if !platform::storable::is_storable(&cursor.i) {
        return Err(malformed());
    }
    Ok((at, cursor.i))
}

fn encode_cursor(at: chrono::DateTime<chrono::Utc>, id: &str) -> String {
    use base64::Engine;
    let cursor = DeliveryCursor { t: at.timestamp_micros(), i: id.to_owned() };
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(&cursor).unwrap_or_default())
}

/// The most deliveries a page holds.
const DELIVERIES_MAX_LIMIT: i64 = 100;

/// `GET /webhooks/{id}/deliveries`: the webhook's deliveries, newest first, each with its
/// attempts (time, status code, latency, error; never a body or a secret), in cursor pages.
pub async fn deliveries(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let query = query_pairs(&req);
    let (limit, warnings) = api::pagination::parse_limit(&query, DELIVERIES_MAX_LIMIT)?;
    let after = api::pagination::given_cursor(&query).map(decode_cursor).transpose()?;
    let webhook_id = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (rows, consistent) = consistent_read(&state, &caller, token, &[WEBHOOKS], |client, models| {
        let (w, space_id, webhook_id, after) =
            (models.schema(WEBHOOKS), space_id.clone(), webhook_id.clone(), after.clone());
        Box::pin(async move {
            if store::get(client, &w, &space_id, &webhook_id).await?.is_none() {
                return Ok(None);
            }
            store::deliveries(client, &webhook_id, after, limit + 1).await.map(Some)
        })
    })
    .await?;
    let mut rows =
        rows.ok_or_else(|| ApiError::of(Code::WebhookNotFound, format!("no webhook {webhook_id:?} in this space")))?;
    let has_more = i64::try_from(rows.len()).unwrap_or(i64::MAX) > limit;
    rows.truncate(usize::try_from(limit).unwrap_or(0));
    let next_cursor =
        if has_more { rows.last().map(|row| encode_cursor(row.created_at, &row.delivery_id)) } else { None };
    let items: Vec<serde_json::Value> = rows.into_iter().map(|row| row.document).collect();
    Ok(respond(&consistent, warnings, |warnings| {
        let mut body = serde_json::json!({
            "data": items,
            "pagination": {"limit": limit, "hasMore": has_more, "nextCursor": next_cursor},
        });
        if !warnings.is_empty() {
            body["warnings"] = serde_json::json!(warnings);
        }
        body
    }))
}
