//! `GET /events` (the cursor list of ready events) and `GET /events/{schema}/{id}/status`.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::Utc;
use serde_json::{Value, json};
use shared::catalog::{self, CATALOG, SchemaEntry};
use shared::error::{ApiError, Code};
use shared::http::{data_body, query_pairs, query_value};

use super::store::{self, event_document};
use super::window::{Cursor, micros, resolve_window};
use crate::State;
use crate::consistency::{authorize_read, consistent_read, respond};
use crate::schemas::http::schema_not_found;

const EVENTS: &str = "events";

/// Event schemas only: a contact or object schema has no events.
fn event_schema(schema: Option<SchemaEntry>, id_or_slug: &str) -> Result<SchemaEntry, ApiError> {
    match schema {
        Some(schema) if schema.schema_type == "event" => Ok(schema),
        Some(_) => Err(ApiError::not_found(Code::SchemaNotFound, format!("{id_or_slug:?} is not an event schema"))),
        None => Err(schema_not_found(id_or_slug)),
    }
}

pub async fn status(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (schema_ref, event_id) = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let ((schema, row), consistent) = consistent_read(&state, &caller, token, &[CATALOG, EVENTS], |client, models| {
        let (c, e) = (models.schema(CATALOG), models.schema(EVENTS));
        let (space_id, schema_ref, event_id) = (space_id.clone(), schema_ref.clone(), event_id.clone());
        Box::pin(async move {
            let (schema, row) = tokio::join!(
                catalog::find_schema(client, &c, &space_id, &schema_ref),
                store::status_row(client, &e, &event_id, &space_id),
            );
            Ok((schema?, row?))
        })
    })
    .await?;
    let schema = event_schema(schema, &schema_ref)?;
    let document = row
        .filter(|row| row.get::<_, &str>(1) == schema.schema_id)
        .map(|row| event_document(&row))
        .ok_or_else(|| ApiError::not_found(Code::EventNotFound, format!("no event {event_id:?} in this schema")))?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}

pub async fn list(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let query = query_pairs(&req);
    let (caller, token) = authorize_read(&state, &req).await?;
    let schema_ref = query_value(&query, "schema")
        .filter(|value| !value.trim().is_empty())
        .ok_or_else(|| {
            ApiError::bad_request(Code::InvalidQueryParameter, "schema is required: the id or slug of an event schema")
        })?
        .to_owned();
    let space_id = caller.space_id().to_owned();
    let now = Utc::now();
    let ((schema, page), consistent) = consistent_read(&state, &caller, token, &[CATALOG, EVENTS], |client, models| {
        let (c, e) = (models.schema(CATALOG), models.schema(EVENTS));
        let (space_id, schema_ref, query) = (space_id.clone(), schema_ref.clone(), query.clone());
        Box::pin(async move {
            let Some(schema) = catalog::find_schema(client, &c, &space_id, &schema_ref).await? else {
                return Ok((None, None));
            };
            if schema.schema_type != "event" {
                return Ok((Some(schema), None));
            }
            let window = resolve_window(&query, &schema.schema_id, now)?;
            let rows = store::ready_page(client, &e, &space_id, &schema.schema_id, &window).await?;
            Ok((Some(schema), Some((window, rows))))
        })
    })
    .await?;
    let schema = event_schema(schema, &schema_ref)?;
    let Some((window, mut rows)) = page else { return Err(schema_not_found(&schema_ref)) };
    let has_more = rows.len() as i64 > window.limit;
    rows.truncate(usize::try_from(window.limit).unwrap_or(0));
    let next_cursor = match rows.last() {
        Some(last) if has_more => Some(
            Cursor {
                after_at: micros(last.get(4)),
                after_id: last.get(0),
                schema_id: schema.schema_id.clone(),
                from: micros(window.from),
                to: micros(window.to),
                limit: window.limit,
            }
            .encode(),
        ),
        _ => None,
    };
    let items: Vec<Value> = rows
        .iter()
        .map(|row| {
            let mut item = event_document(row);
            item["schemaId"] = json!(schema.schema_id);
            item["schemaSlug"] = json!(schema.slug);
            item["createdAt"] = item["receivedAt"].clone();
            item
        })
        .collect();
    let pagination = json!({ "limit": window.limit, "nextCursor": next_cursor, "hasMore": has_more });
    Ok(respond(&consistent, window.warnings, |warnings| shared::http::page_body(items, pagination, warnings)))
}
