//! `GET /schemas/{schema}/records` and `GET /schemas/{schema}/records/{id}`.

use actix_web::{HttpRequest, HttpResponse, web};
use shared::catalog::{CATALOG, SchemaEntry};
use shared::error::ApiError;
use shared::error::Code;
use shared::http::{data_body, page_body, query_pairs};
use shared::pagination::PageRequest;

use super::store;
use crate::State;
use crate::consistency::{authorize_read, consistent_read, respond};
use crate::schemas::http::schema_not_found;

const RECORDS: &str = "records";

/// Records live in contact and object schemas; an event schema has none.
fn record_schema(schema: Option<SchemaEntry>, id_or_slug: &str) -> Result<SchemaEntry, ApiError> {
    match schema {
        Some(schema) if schema.schema_type != "event" => Ok(schema),
        Some(_) => Err(ApiError::not_found(
            Code::SchemaNotFound,
            format!("{id_or_slug:?} is an event schema; records live in contact and object schemas"),
        )),
        None => Err(schema_not_found(id_or_slug)),
    }
}

pub async fn list(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let page = PageRequest::parse(&query_pairs(&req))?;
    let (caller, token) = authorize_read(&state, &req).await?;
    let (space_id, schema_ref) = (caller.space_id().to_owned(), path.into_inner());
    let (limit, offset) = (page.limit(), page.offset());
    let ((schema, total, items), consistent) =
        consistent_read(&state, &caller, token, &[CATALOG, RECORDS], |client, models| {
            let (c, r) = (models.schema(CATALOG), models.schema(RECORDS));
            let (space_id, schema_ref) = (space_id.clone(), schema_ref.clone());
            Box::pin(async move { store::page(client, (&c, &r), &space_id, &schema_ref, (limit, offset)).await })
        })
        .await?;
    record_schema(schema, &schema_ref)?;
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}

pub async fn get(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (schema_ref, record_id) = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let ((schema, document), consistent) =
        consistent_read(&state, &caller, token, &[CATALOG, RECORDS], |client, models| {
            let (c, r) = (models.schema(CATALOG), models.schema(RECORDS));
            let (space_id, schema_ref, record_id) = (space_id.clone(), schema_ref.clone(), record_id.clone());
            Box::pin(async move { store::get(client, (&c, &r), &space_id, &schema_ref, &record_id).await })
        })
        .await?;
    record_schema(schema, &schema_ref)?;
    let document = document
        .ok_or_else(|| ApiError::not_found(Code::RecordNotFound, format!("no record {record_id:?} in this schema")))?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}
