//! `GET /ingest-failures`: the messages of the Segment-compatible ingest that could not be
//! applied, newest first, each with its write key, its type, why (a code and a reason) and the
//! message as sent, a page at a time by a cursor; `writeKey` (a write key's id or slug)
//! narrows it to one key. Kept 30 days.

use actix_web::{HttpRequest, HttpResponse, web};
use api::http::{query_pairs, query_value};
use platform::error::{ApiError, Code};
use serde_json::json;

use crate::State;
use crate::consistency::{authorize_read, consistent_read, respond};

/// The form of this list's cursor: a failure's id, or empty for the first page.
pub const CURSOR_PATTERN: &str = "^([1-9][0-9]{0,17})?$";

/// A failure's id as this list's cursor names it: digits only, no sign or space.
pub fn parse_cursor(text: &str) -> Option<i64> {
    (text.len() <= 18 && !text.starts_with('0') && text.bytes().all(|byte| byte.is_ascii_digit()))
        .then(|| text.parse().ok())
        .flatten()
}

pub async fn list(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let (caller, token) = authorize_read(&state, &req).await?;
    let query = query_pairs(&req);
    let (limit, warnings) = api::pagination::parse_limit(&query, 100)?;
    let after = match api::pagination::given_cursor(&query) {
        Some(cursor) => Some(parse_cursor(cursor).ok_or_else(|| {
            ApiError::of(Code::InvalidCursor, "cursor is the nextCursor of an earlier page of this list")
        })?),
        None => None,
    };
    let write_key = query_value(&query, "writeKey").map(str::to_owned);
    let space_id = caller.space_id().to_owned();
    let ((items, next_cursor), consistent) =
        consistent_read(&state, &caller, token, &[domain::catalog::CATALOG], |client, models| {
            let (space_id, write_key) = (space_id.clone(), write_key.clone());
            let catalog = models.schema(domain::catalog::CATALOG);
            Box::pin(async move {
                let write_key_id = match &write_key {
                    Some(write_key) => Some(
                        reads::catalog::resource_id_of(
                            client,
                            &catalog,
                            (domain::ingest::WRITE_KEY, &space_id),
                            write_key,
                        )
                        .await?
                        .unwrap_or_else(|| write_key.clone()),
                    ),
                    None => None,
                };
                Ok(reads::ingest::page(client, &space_id, write_key_id.as_deref(), after, limit).await?)
            })
        })
        .await?;
    Ok(respond(&consistent, warnings, |warnings| {
        let pagination = json!({"limit": limit, "hasMore": next_cursor.is_some(), "nextCursor": next_cursor});
        let mut body = json!({"data": items, "pagination": pagination});
        if !warnings.is_empty() {
            body["warnings"] = json!(warnings);
        }
        body
    }))
}
