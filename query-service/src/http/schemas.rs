//! `GET /schemas`, `GET /schemas/{schema}`, `GET /schemas/{schema}/attributes`.

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::Value;
use shared::catalog::{self, CATALOG, SchemaEntry};
use shared::error::ApiError;
use shared::error::Code;
use shared::http::{data_body, page_body, query_pairs};
use shared::pagination::PageRequest;
use tokio_postgres::types::ToSql;

use super::{authorize_read, consistent_read, page_of_docs, respond};
use crate::State;

const SCHEMA_TYPES: [&str; 3] = ["contact", "object", "event"];

fn parse_types(query: &[(String, String)]) -> Result<Vec<String>, ApiError> {
    let mut types: Vec<String> = Vec::new();
    for (key, value) in query.iter().filter(|(key, _)| key == "type") {
        // Every value of a given `type` must be a schema type: `type=` or `type=contact,` is
        // refused rather than read as "no filter".
        for value in value.split(',').map(str::trim) {
            if !SCHEMA_TYPES.contains(&value) {
                return Err(ApiError::bad_request(
                    Code::InvalidQueryParameter,
                    format!("{key} must be contact, object or event; got {value:?}"),
                ));
            }
            if !types.iter().any(|t| t == value) {
                types.push(value.to_owned());
            }
        }
    }
    if types.is_empty() {
        types = SCHEMA_TYPES.iter().map(|t| (*t).to_owned()).collect();
    }
    Ok(types)
}

pub async fn list(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let query = query_pairs(&req);
    let page = PageRequest::parse(&query)?;
    let types = parse_types(&query)?;
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (limit, offset) = (page.limit(), page.offset());
    let ((total, items), consistent) = consistent_read(&state, &caller, token, &[CATALOG], |client, models| {
        let (s, space_id, types) = (models.schema(CATALOG), space_id.clone(), types.clone());
        Box::pin(async move {
            let count = format!(
                "SELECT COALESCE(sum(total), 0)::bigint FROM {s}.schema_counts WHERE space_id = $1 AND schema_type = ANY($2)"
            );
            let rows = format!(
                "SELECT doc FROM {s}.schemas WHERE space_id = $1 AND schema_type = ANY($2)
                 ORDER BY created_at, schema_id LIMIT $3 OFFSET $4"
            );
            let params: [&(dyn ToSql + Sync); 2] = [&space_id, &types];
            page_of_docs(client, &count, &rows, &params, (limit, offset)).await
        })
    })
    .await?;
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}

pub fn schema_not_found(id_or_slug: &str) -> ApiError {
    ApiError::not_found(Code::SchemaNotFound, format!("no schema {id_or_slug:?} in this space"))
}

pub async fn get(req: HttpRequest, path: web::Path<String>, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let (caller, token) = authorize_read(&state, &req).await?;
    let (space_id, schema_ref) = (caller.space_id().to_owned(), path.into_inner());
    let (schema, consistent) = consistent_read(&state, &caller, token, &[CATALOG], |client, models| {
        let (s, space_id, schema_ref) = (models.schema(CATALOG), space_id.clone(), schema_ref.clone());
        Box::pin(async move { Ok(catalog::find_schema(client, &s, &space_id, &schema_ref).await?) })
    })
    .await?;
    let schema = schema.ok_or_else(|| schema_not_found(&schema_ref))?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(schema.doc, warnings)))
}

pub async fn attributes(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let page = PageRequest::parse(&query_pairs(&req))?;
    let (caller, token) = authorize_read(&state, &req).await?;
    let (space_id, schema_ref) = (caller.space_id().to_owned(), path.into_inner());
    let (limit, offset) = (page.limit(), page.offset());
    let ((schema, items), consistent) = consistent_read(&state, &caller, token, &[CATALOG], |client, models| {
        let (s, space_id, schema_ref) = (models.schema(CATALOG), space_id.clone(), schema_ref.clone());
        Box::pin(async move {
            let rows = client
                .prepare_cached(&format!(
                    "SELECT doc FROM {s}.attributes WHERE schema_id = (
                         SELECT schema_id FROM {s}.schemas WHERE space_id = $1 AND (schema_id = $2 OR slug = $2)
                         ORDER BY (schema_id = $2) DESC LIMIT 1)
                     ORDER BY ordinal LIMIT $3 OFFSET $4"
                ))
                .await?;
            let rows_params: [&(dyn ToSql + Sync); 4] = [&space_id, &schema_ref, &limit, &offset];
            let (schema, rows): (Result<Option<SchemaEntry>, _>, _) = tokio::join!(
                catalog::find_schema(client, &s, &space_id, &schema_ref),
                client.query(&rows, &rows_params),
            );
            let items: Vec<Value> = rows?.into_iter().map(|row| row.get(0)).collect();
            Ok((schema?, items))
        })
    })
    .await?;
    let schema = schema.ok_or_else(|| schema_not_found(&schema_ref))?;
    let pagination = page.pagination(items.len(), schema.attribute_count);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}
