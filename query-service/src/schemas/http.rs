//! `GET /schemas`, `GET /schemas/{schema}`, `GET /schemas/{schema}/attributes`.

use actix_web::{HttpRequest, HttpResponse, web};
use api::http::{data_body, page_body, query_pairs};
use api::pagination::PageRequest;
use domain::catalog::CATALOG;
use platform::error::ApiError;
use platform::error::Code;

use super::store;
use crate::State;
use crate::consistency::{authorize_read, consistent_read, respond};

const SCHEMA_TYPES: [&str; 3] = ["contact", "object", "event"];

fn parse_types(query: &[(String, String)]) -> Result<Vec<String>, ApiError> {
    let mut types: Vec<String> = Vec::new();
    for (key, value) in query.iter().filter(|(key, _)| key == "type") {
        // Every value of a given `type` must be a schema type: `type=` or `type=contact,` is
        // refused rather than read as "no filter".
        for value in value.split(',').map(str::trim) {
            if !SCHEMA_TYPES.contains(&value) {
                return Err(ApiError::of(
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
        let (catalog, space_id, types) = (models.schema(CATALOG), space_id.clone(), types.clone());
        Box::pin(async move { store::page(client, &catalog, &space_id, &types, (limit, offset)).await })
    })
    .await?;
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}

pub fn schema_not_found(id_or_slug: &str) -> ApiError {
    ApiError::of(Code::SchemaNotFound, format!("no schema {id_or_slug:?} in this space"))
}

pub async fn get(req: HttpRequest, path: web::Path<String>, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let (caller, token) = authorize_read(&state, &req).await?;
    let (space_id, schema_ref) = (caller.space_id().to_owned(), path.into_inner());
    let (schema, consistent) = consistent_read(&state, &caller, token, &[CATALOG], |client, models| {
        let (catalog, space_id, schema_ref) = (models.schema(CATALOG), space_id.clone(), schema_ref.clone());
        Box::pin(async move { store::find(client, &catalog, &space_id, &schema_ref).await })
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
        let (catalog, space_id, schema_ref) = (models.schema(CATALOG), space_id.clone(), schema_ref.clone());
        Box::pin(async move { store::attributes(client, &catalog, &space_id, &schema_ref, (limit, offset)).await })
    })
    .await?;
    let schema = schema.ok_or_else(|| schema_not_found(&schema_ref))?;
    let pagination = page.pagination(items.len(), schema.attribute_count);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}
