//! `GET /schemas`, `GET /schemas/{schema}`, `GET /schemas/{schema}/attributes`.

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::Value;
use shared::catalog::{self, CATALOG, SchemaEntry};
use shared::error::ApiError;
use shared::http::{data_body, page_body, query_pairs};
use shared::pagination::PageRequest;

use super::{begin_read, respond};
use crate::State;

const SCHEMA_TYPES: [&str; 3] = ["contact", "object", "event"];

pub async fn list(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let query = query_pairs(&req);
    let page = PageRequest::parse(&query)?;
    let mut types: Vec<String> = Vec::new();
    for (key, value) in &query {
        if key == "type" {
            for value in value.split(',').map(str::trim).filter(|v| !v.is_empty()) {
                if !SCHEMA_TYPES.contains(&value) {
                    return Err(ApiError::bad_request(
                        "invalid_query_parameter",
                        format!("type must be contact, object or event; got {value:?}"),
                    ));
                }
                if !types.iter().any(|t| t == value) {
                    types.push(value.to_owned());
                }
            }
        }
    }
    if types.is_empty() {
        types = SCHEMA_TYPES.iter().map(|t| (*t).to_owned()).collect();
    }
    let (caller, consistent) = begin_read(&state, &req, &[CATALOG]).await?;
    let s = consistent.schema(CATALOG);
    let client = state.pool.get().await?;
    let total: i64 = client
        .query_one(
            &format!("SELECT COALESCE(sum(total), 0)::bigint FROM {s}.schema_counts WHERE space_id = $1 AND schema_type = ANY($2)"),
            &[&caller.space_id(), &types],
        )
        .await?
        .get(0);
    let rows = client
        .query(
            &format!(
                "SELECT doc FROM {s}.schemas WHERE space_id = $1 AND schema_type = ANY($2)
                 ORDER BY created_at, schema_id LIMIT $3 OFFSET $4"
            ),
            &[&caller.space_id(), &types, &page.limit(), &page.offset()],
        )
        .await?;
    let items: Vec<Value> = rows.into_iter().map(|row| row.get(0)).collect();
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}

/// Finds the addressed schema or answers 404 `schema_not_found`.
pub async fn find_or_404(
    client: &deadpool_postgres::Client,
    catalog_schema: &str,
    space_id: &str,
    id_or_slug: &str,
) -> Result<SchemaEntry, ApiError> {
    catalog::find_schema(client, catalog_schema, space_id, id_or_slug)
        .await?
        .ok_or_else(|| ApiError::not_found("schema_not_found", format!("no schema {id_or_slug:?} in this space")))
}

pub async fn get(req: HttpRequest, path: web::Path<String>, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let (caller, consistent) = begin_read(&state, &req, &[CATALOG]).await?;
    let client = state.pool.get().await?;
    let schema = find_or_404(&client, &consistent.schema(CATALOG), caller.space_id(), &path).await?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(schema.doc, warnings)))
}

pub async fn attributes(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let page = PageRequest::parse(&query_pairs(&req))?;
    let (caller, consistent) = begin_read(&state, &req, &[CATALOG]).await?;
    let s = consistent.schema(CATALOG);
    let client = state.pool.get().await?;
    let schema = find_or_404(&client, &s, caller.space_id(), &path).await?;
    let rows = client
        .query(
            &format!("SELECT doc FROM {s}.attributes WHERE schema_id = $1 ORDER BY ordinal LIMIT $2 OFFSET $3"),
            &[&schema.schema_id, &page.limit(), &page.offset()],
        )
        .await?;
    let items: Vec<Value> = rows.into_iter().map(|row| row.get(0)).collect();
    let pagination = page.pagination(items.len(), schema.attribute_count);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}
