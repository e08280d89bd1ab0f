//! `GET /schemas/{schema}/records` and `GET /schemas/{schema}/records/{id}`.

use actix_web::{HttpRequest, HttpResponse, web};
use api::http::{data_body, page_body, query_pairs};
use api::pagination::PageRequest;
use domain::catalog::CATALOG;
use platform::error::ApiError;
use platform::error::Code;
use serde_json::Value;

use super::store;
use crate::State;
use crate::consistency::{authorize_read, consistent_row, consistent_rows, respond};
use crate::schemas::http::schema_not_found;
use platform::readmodel::{CHECK_WIDTH, Consistent};

const RECORDS: &str = "records";

/// Records live in contact and object schemas; an event schema has none. `schema_type` is
/// the type of the schema named, `None` when there is none.
fn record_schema(schema_type: Option<&str>, id_or_slug: &str) -> Result<(), ApiError> {
    match schema_type {
        Some("event") => Err(ApiError::not_found(
            Code::SchemaNotFound,
            format!("{id_or_slug:?} is an event schema; records live in contact and object schemas"),
        )),
        Some(_) => Ok(()),
        None => Err(schema_not_found(id_or_slug)),
    }
}

/// One statement: the consistency check, the schema, the total and the page.
pub async fn list(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let page = PageRequest::parse(&query_pairs(&req))?;
    let (caller, token) = authorize_read(&state, &req).await?;
    let schema_ref = path.into_inner();
    let (limit, offset) = (page.limit(), page.offset());
    let sql = |models: &Consistent| store::page_sql(&models.schema(CATALOG), &models.schema(RECORDS));
    let (rows, consistent) =
        consistent_rows(&state, &caller, token, &[CATALOG, RECORDS], sql, &[&schema_ref, &limit, &offset]).await?;
    let first = rows.first().ok_or_else(|| ApiError::unavailable("the page query returned no row"))?;
    record_schema(first.get(CHECK_WIDTH), &schema_ref)?;
    let total = first.get::<_, Option<i64>>(CHECK_WIDTH + 1).unwrap_or(0);
    let items: Vec<Value> = rows.iter().filter_map(|row| row.get::<_, Option<Value>>(CHECK_WIDTH + 2)).collect();
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}

/// One statement: the consistency check, the schema and the record.
pub async fn get(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (schema_ref, record_id) = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let columns = |models: &Consistent| store::record_columns(&models.schema(CATALOG), &models.schema(RECORDS));
    let (row, consistent) =
        consistent_row(&state, &caller, token, &[CATALOG, RECORDS], columns, &[&schema_ref, &record_id]).await?;
    record_schema(row.get(CHECK_WIDTH), &schema_ref)?;
    let document = row
        .get::<_, Option<Value>>(CHECK_WIDTH + 1)
        .ok_or_else(|| ApiError::not_found(Code::RecordNotFound, format!("no record {record_id:?} in this schema")))?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}
