//! `GET /events` (the cursor list of ready events) and `GET /events/{schema}/{id}/status`.

use actix_web::{HttpRequest, HttpResponse, web};
use api::http::{data_body, query_pairs, query_value};
use chrono::{DateTime, Utc};
use domain::catalog::CATALOG;
use platform::error::{ApiError, Code};
use platform::readmodel::Consistent;
use serde_json::{Value, json};
use tokio_postgres::Row;

use super::store::{self, EventRow, SCHEMA_AT, event_document};
use super::window::{Cursor, micros, resolve_window};
use crate::State;
use crate::consistency::{authorize_read, consistent_rows, respond};
use crate::schemas::http::schema_not_found;

const EVENTS: &str = "events";

/// The id and slug of the event schema named, from the schema's columns of a row: 404 when
/// the space has no such schema, or when it is a contact or object schema (they have no events).
fn event_schema(row: &Row, id_or_slug: &str) -> Result<(String, String), ApiError> {
    let at = |offset: usize| SCHEMA_AT + offset;
    match row.get::<_, Option<&str>>(at(2)) {
        Some("event") => Ok((row.get(at(0)), row.get(at(1)))),
        Some(_) => Err(ApiError::of(Code::SchemaNotFound, format!("{id_or_slug:?} is not an event schema"))),
        None => Err(schema_not_found(id_or_slug)),
    }
}

/// One statement: the consistency check, the schema and the event.
pub async fn status(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (schema_ref, event_id) = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let sql = |models: &Consistent| store::status_sql(&models.schema(CATALOG), &models.schema(EVENTS));
    let (rows, consistent) =
        consistent_rows(&state, &caller, token, &[CATALOG, EVENTS], sql, &[&schema_ref, &event_id]).await?;
    let row = rows.first().ok_or_else(|| ApiError::unavailable("the status query returned no row"))?;
    let (schema_id, _) = event_schema(row, &schema_ref)?;
    let document = event_document(row)
        .filter(|event| event.schema_id == schema_id)
        .map(|event| event.document)
        .ok_or_else(|| ApiError::of(Code::EventNotFound, format!("no event {event_id:?} in this schema")))?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}

/// One statement: the consistency check, the schema and the page. The window is resolved
/// before the read; its errors answer after the schema's, as they did when the schema was
/// read first (a bad window reads an empty range).
pub async fn list(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let query = query_pairs(&req);
    let (caller, token) = authorize_read(&state, &req).await?;
    let schema_ref = query_value(&query, "schema")
        .filter(|value| !value.trim().is_empty())
        .ok_or_else(|| {
            ApiError::of(Code::InvalidQueryParameter, "schema is required: the id or slug of an event schema")
        })?
        .to_owned();
    let now = Utc::now();
    let window = resolve_window(&query, now);
    let (from, to, after, fetch) = match &window {
        Ok(window) => (window.from, window.to, window.after.clone(), window.limit + 1),
        Err(_) => (now, now, None, 1),
    };
    let (after_at, after_id): (Option<DateTime<Utc>>, Option<String>) = after.unzip();
    let sql = |models: &Consistent| store::page_sql(&models.schema(CATALOG), &models.schema(EVENTS));
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
        [&schema_ref, &from, &to, &after_at, &after_id, &fetch];
    let (rows, consistent) = consistent_rows(&state, &caller, token, &[CATALOG, EVENTS], sql, &params).await?;
    let first = rows.first().ok_or_else(|| ApiError::unavailable("the page query returned no row"))?;
    let (schema_id, slug) = event_schema(first, &schema_ref)?;
    let window = window?;
    window.follows(&schema_id)?;
    let mut events: Vec<EventRow> = rows.iter().filter_map(event_document).collect();
    let has_more = events.len() as i64 > window.limit;
    events.truncate(usize::try_from(window.limit).unwrap_or(0));
    let next_cursor = match events.last() {
        Some(last) if has_more => Some(
            Cursor {
                after_at: micros(last.occurred_at),
                after_id: last.id.clone(),
                schema_id: schema_id.clone(),
                from: micros(window.from),
                to: micros(window.to),
                limit: window.limit,
            }
            .encode(),
        ),
        _ => None,
    };
    let items: Vec<Value> = events
        .into_iter()
        .map(|EventRow { document: mut item, .. }| {
            item["schemaId"] = json!(schema_id);
            item["schemaSlug"] = json!(slug);
            item["createdAt"] = item["receivedAt"].clone();
            item
        })
        .collect();
    let pagination = json!({ "limit": window.limit, "nextCursor": next_cursor, "hasMore": has_more });
    Ok(respond(&consistent, window.warnings, |warnings| api::http::page_body(items, pagination, warnings)))
}
