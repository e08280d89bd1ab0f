//! `GET /schemas/{schema}/records` and `GET /schemas/{schema}/records/{id}`.

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::Value;
use shared::catalog::{self, CATALOG, SchemaEntry};
use shared::error::ApiError;
use shared::error::Code;
use shared::http::{data_body, page_body, query_pairs};
use shared::pagination::PageRequest;
use tokio_postgres::types::ToSql;

use super::schemas::schema_not_found;
use super::{authorize_read, consistent_read, page_of_docs, respond};
use crate::State;

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

/// The schema id of `$2` (id or slug) in space `$1`, as a SQL subquery over catalog `c`.
fn schema_id_subquery(c: &str, space: &str, reference: &str) -> String {
    format!(
        "(SELECT schema_id FROM {c}.schemas WHERE space_id = {space} AND (schema_id = {reference} OR slug = {reference})
          ORDER BY (schema_id = {reference}) DESC LIMIT 1)"
    )
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
            Box::pin(async move {
                let schema_id = schema_id_subquery(&c, "$1", "$2");
                let count =
                    format!("SELECT total FROM {r}.record_counts WHERE space_id = $1 AND schema_id = {schema_id}");
                let rows = format!(
                    "SELECT doc FROM {r}.records WHERE space_id = $1 AND schema_id = {schema_id}
                     ORDER BY created_at, record_id LIMIT $3 OFFSET $4"
                );
                let params: [&(dyn ToSql + Sync); 2] = [&space_id, &schema_ref];
                let (schema, page) = tokio::join!(
                    catalog::find_schema(client, &c, &space_id, &schema_ref),
                    page_of_docs(client, &count, &rows, &params, (limit, offset)),
                );
                let (total, items) = page?;
                Ok((schema?, total, items))
            })
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
            Box::pin(async move {
                let schema_id = schema_id_subquery(&c, "$2", "$3");
                let fetch = client
                    .prepare_cached(&format!(
                        "SELECT doc FROM {r}.records WHERE record_id = $1 AND space_id = $2 AND schema_id = {schema_id}"
                    ))
                    .await?;
                let fetch_params: [&(dyn ToSql + Sync); 3] = [&record_id, &space_id, &schema_ref];
                let (schema, record) = tokio::join!(
                    catalog::find_schema(client, &c, &space_id, &schema_ref),
                    client.query_opt(&fetch, &fetch_params),
                );
                Ok((schema?, record?.map(|row| row.get::<_, Value>(0))))
            })
        })
        .await?;
    record_schema(schema, &schema_ref)?;
    let document = document
        .ok_or_else(|| ApiError::not_found(Code::RecordNotFound, format!("no record {record_id:?} in this schema")))?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}
