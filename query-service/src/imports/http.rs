//! `GET /imports/{importId}` (the import, its status and counts) and
//! `GET /imports/{importId}/rows` (each row's result, in file order, a page at a time by a
//! cursor, filterable by `status`).

use actix_web::{HttpRequest, HttpResponse, web};
use api::http::{data_body, query_pairs, query_value};
use platform::error::{ApiError, Code};
use serde_json::{Value, json};

use crate::State;
use crate::consistency::{authorize_read, consistent_read, respond};

fn not_found(import_id: &str) -> ApiError {
    ApiError::of(Code::ImportNotFound, format!("no import {import_id:?} in this space"))
}

pub async fn get(req: HttpRequest, path: web::Path<String>, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let import_id = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (document, consistent) = consistent_read(&state, &caller, token, &[], |client, _| {
        let (space_id, import_id) = (space_id.clone(), import_id.clone());
        Box::pin(async move { Ok(reads::imports::document(client, &space_id, &import_id).await?) })
    })
    .await?;
    let document = document.ok_or_else(|| not_found(&import_id))?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}

/// `GET /imports`: the space's imports, newest first, a page at a time by a cursor.
pub async fn list(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let (caller, token) = authorize_read(&state, &req).await?;
    let query = query_pairs(&req);
    let (limit, warnings) = api::pagination::parse_limit(&query, 100)?;
    let after = api::pagination::given_cursor(&query).map(platform::cursor::decode).transpose()?;
    let space_id = caller.space_id().to_owned();
    let ((items, next_cursor), consistent) = consistent_read(&state, &caller, token, &[], |client, _| {
        let (space_id, after) = (space_id.clone(), after.clone());
        Box::pin(async move {
            let after = after.as_ref().map(|(at, id)| (*at, id.as_str()));
            Ok(reads::imports::page(client, &space_id, after, limit).await?)
        })
    })
    .await?;
    Ok(respond(&consistent, warnings, |warnings| cursor_page(items, limit, next_cursor, warnings)))
}

/// A page of a list read by cursor: `{data, pagination: {limit, hasMore, nextCursor}}`, and
/// `warnings` when there are any.
fn cursor_page(
    items: Vec<Value>,
    limit: i64,
    next_cursor: Option<String>,
    warnings: &[platform::error::Warning],
) -> Value {
    let pagination = json!({"limit": limit, "hasMore": next_cursor.is_some(), "nextCursor": next_cursor});
    let mut body = json!({"data": items, "pagination": pagination});
    if !warnings.is_empty() {
        body["warnings"] = json!(warnings);
    }
    body
}

const STATUSES: &[&str] = &["created", "updated", "unchanged", "failed"];

/// What a rows cursor looks like (the document's `pattern`): the empty value (the first
/// page) or `<part>.<row>`, digits only; [`parse_cursor`] reads nothing else.
pub const ROWS_CURSOR_PATTERN: &str = r"^([0-9]+\.[0-9]+)?$";

/// A position in the rows: `<part>.<row>`, the last row of the previous page, exactly as
/// given.
pub(crate) fn parse_cursor(raw: &str) -> Option<(i32, i32)> {
    let number = |text: &str| {
        let digits = !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit());
        digits.then(|| text.parse::<i32>().ok()).flatten()
    };
    let (part, row) = raw.split_once('.')?;
    Some((number(part)?, number(row)?))
}

pub async fn rows(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    // A missing or bad key is answered before a bad query.
    let (caller, token) = authorize_read(&state, &req).await?;
    let query = query_pairs(&req);
    let (limit, warnings) = api::pagination::parse_limit(&query, 1_000)?;
    let status = match query_value(&query, "status") {
        None => None,
        Some(status) if STATUSES.contains(&status) => Some(status.to_owned()),
        Some(other) => {
            return Err(ApiError::of(
                Code::InvalidQueryParameter,
                format!("status must be one of {}; got {other:?}", STATUSES.join(", ")),
            ));
        }
    };
    let after = match api::pagination::given_cursor(&query) {
        None => (0, 0),
        Some(raw) => parse_cursor(raw).ok_or_else(platform::cursor::malformed)?,
    };
    let import_id = path.into_inner();
    let space_id = caller.space_id().to_owned();
    let (page, consistent) = consistent_read(&state, &caller, token, &[], |client, _| {
        let (space_id, import_id, status) = (space_id.clone(), import_id.clone(), status.clone());
        Box::pin(async move {
            let exists = client
                .query_opt("SELECT 1 FROM imports WHERE space_id = $1 AND import_id = $2", &[&space_id, &import_id])
                .await?
                .is_some();
            if !exists {
                return Ok(None);
            }
            let rows = client
                .query(
                    "SELECT part, row_number, status, record_id, key_field, key_value, code, message, warnings
                     FROM import_rows WHERE space_id = $1 AND import_id = $2 AND (part, row_number) > ($3, $4)
                     AND ($5::text IS NULL OR status = $5) ORDER BY part, row_number LIMIT $6",
                    &[&space_id, &import_id, &after.0, &after.1, &status, &(limit + 1)],
                )
                .await?;
            Ok(Some(rows))
        })
    })
    .await?;
    let mut rows = page.ok_or_else(|| not_found(&import_id))?;
    let has_more = rows.len() > usize::try_from(limit).unwrap_or(usize::MAX);
    rows.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let next_cursor =
        has_more.then(|| rows.last().map(|row| format!("{}.{}", row.get::<_, i32>(0), row.get::<_, i32>(1)))).flatten();
    let items: Vec<Value> = rows
        .iter()
        .map(|row| {
            let key = row
                .get::<_, Option<String>>(4)
                .map(|field| json!({"field": field, "value": row.get::<_, Option<String>>(5)}));
            let error = row
                .get::<_, Option<String>>(6)
                .map(|code| json!({"code": code, "message": row.get::<_, Option<String>>(7)}));
            json!({
                "part": row.get::<_, i32>(0),
                "row": row.get::<_, i32>(1),
                "status": row.get::<_, String>(2),
                "recordId": row.get::<_, Option<String>>(3),
                "key": key,
                "error": error,
                "warnings": row.get::<_, Option<Value>>(8).unwrap_or_else(|| json!([])),
            })
        })
        .collect();
    Ok(respond(&consistent, warnings, |warnings| cursor_page(items, limit, next_cursor, warnings)))
}
