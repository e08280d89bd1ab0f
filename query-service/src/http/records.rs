//! `GET /schemas/{schema}/records` and `GET /schemas/{schema}/records/{id}`.

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::Value;
use shared::catalog::CATALOG;
use shared::error::ApiError;
use shared::http::{data_body, page_body, query_pairs};
use shared::pagination::PageRequest;

use super::schemas::find_or_404;
use super::{begin_read, respond};
use crate::State;

const RECORDS: &str = "records";

fn record_schema_or_404(schema: &shared::catalog::SchemaEntry, id_or_slug: &str) -> Result<(), ApiError> {
    if schema.schema_type == "event" {
        return Err(ApiError::not_found(
            "schema_not_found",
            format!("{id_or_slug:?} is an event schema; records live in contact and object schemas"),
        ));
    }
    Ok(())
}

pub async fn list(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let page = PageRequest::parse(&query_pairs(&req))?;
    let (caller, consistent) = begin_read(&state, &req, &[CATALOG, RECORDS]).await?;
    let client = state.pool.get().await?;
    let schema = find_or_404(&client, &consistent.schema(CATALOG), caller.space_id(), &path).await?;
    record_schema_or_404(&schema, &path)?;
    let r = consistent.schema(RECORDS);
    let total: i64 = client
        .query_opt(
            &format!("SELECT total FROM {r}.record_counts WHERE space_id = $1 AND schema_id = $2"),
            &[&caller.space_id(), &schema.schema_id],
        )
        .await?
        .map_or(0, |row| row.get(0));
    let rows = client
        .query(
            &format!(
                "SELECT doc FROM {r}.records WHERE space_id = $1 AND schema_id = $2
                 ORDER BY created_at, record_id LIMIT $3 OFFSET $4"
            ),
            &[&caller.space_id(), &schema.schema_id, &page.limit(), &page.offset()],
        )
        .await?;
    let items: Vec<Value> = rows.into_iter().map(|row| row.get(0)).collect();
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}

pub async fn get(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (schema_ref, record_id) = path.into_inner();
    let (caller, consistent) = begin_read(&state, &req, &[CATALOG, RECORDS]).await?;
    let client = state.pool.get().await?;
    let schema = find_or_404(&client, &consistent.schema(CATALOG), caller.space_id(), &schema_ref).await?;
    record_schema_or_404(&schema, &schema_ref)?;
    let r = consistent.schema(RECORDS);
    let document: Value = client
        .query_opt(
            &format!("SELECT doc FROM {r}.records WHERE record_id = $1 AND space_id = $2 AND schema_id = $3"),
            &[&record_id, &caller.space_id(), &schema.schema_id],
        )
        .await?
        .map(|row| row.get(0))
        .ok_or_else(|| ApiError::not_found("record_not_found", format!("no record {record_id:?} in this schema")))?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}
