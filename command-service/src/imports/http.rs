//! An import's intake: `PUT /imports/{importId}` (create, with its settings),
//! `PUT /imports/{importId}/parts/{part}` (one part of the file, CSV or NDJSON, up to the body
//! limit) and `POST /imports/{importId}/complete` (no more parts). Each is safe to retry: the
//! import id and the part numbers are the caller's, a repeat with the same content answers as
//! the first did, and another content under them is 409 `import_conflict`. The rows are
//! decided later by the projector's `imports` worker; `GET /imports/{importId}` follows them.

use actix_web::http::StatusCode;
use actix_web::http::header::CONTENT_TYPE;
use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::Permission;
use domain::imports;
use platform::error::ApiError;
use platform::refusal::answered;
use serde_json::json;

use super::decide::{self, Refusal};
use super::store;
use crate::State;
use crate::pipeline;
use crate::write_contexts::{self, Kind};

fn not_found(import_id: &str) -> ApiError {
    Refusal::NotFound(import_id.to_owned()).into()
}

/// `PUT /imports/{importId}`: creates the import (201), or answers the existing one when the
/// settings are the same (200).
pub async fn create(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let body = api::http::read_json_object(&req, payload).await?;
    let import_id = path.into_inner();
    decide::check_id(&import_id)?;
    let settings = imports::parse_settings(body).map_err(answered)?;
    let context = write_contexts::at_edge(&state, Kind::Record, caller.space_id(), &settings.schema).await?;
    imports::check_columns(&settings, &context.schema.schema_type, &context.attributes).map_err(answered)?;
    let mut client = state.pool.get().await?;
    let created =
        store::create(&mut client, (caller.space_id(), &import_id), &context.schema, &settings, Some(caller.key_id()))
            .await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    let document =
        reads::imports::document(&client, caller.space_id(), &import_id).await?.ok_or_else(|| not_found(&import_id))?;
    Ok(HttpResponse::build(status).json(json!({ "data": document })))
}

/// `DELETE /imports/{importId}`: abandons an import that is not completed (its parts and row
/// results dropped; records its rows wrote stay).
pub async fn delete(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let import_id = path.into_inner();
    let mut client = state.pool.get().await?;
    store::delete(&mut client, (caller.space_id(), &import_id)).await?;
    Ok(HttpResponse::Ok().json(json!({"data": {"id": import_id, "deleted": true}})))
}

/// `PUT /imports/{importId}/parts/{part}`: stores one part (202), or answers the stored one
/// when the body is the same (200). The whole part is refused (400) when it cannot be read as
/// the import's format; a row that cannot is a failed row of the import.
pub async fn put_part(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let (import_id, part) = path.into_inner();
    let part = decide::part_number(&part)?;
    let space_id = caller.space_id();
    let (schema_id, settings) = store::load(&state.pool.get().await?, space_id, &import_id).await?;
    let content_type = req.headers().get(CONTENT_TYPE).and_then(|value| value.to_str().ok());
    decide::check_media_type(&import_id, settings.format, content_type)?;
    let body = api::http::read_bytes(&req, payload).await?;
    let context = write_contexts::at_edge(&state, Kind::Record, space_id, &schema_id).await?;
    let invalid = Refusal::Unreadable;
    // The part is checked whole (its encoding, header and size) without holding its rows:
    // they are read one at a time when they are decided.
    let text = import_file::decode(&body, settings.encoding).map_err(invalid)?;
    let rows = import_file::count_rows(&settings, &text).map_err(invalid)?;
    if let Some(headers) = import_file::headers(&settings, &text).map_err(invalid)? {
        let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
        imports::check_header(&headers, &settings, &context.schema.schema_type, &context.attributes)
            .map_err(answered)?;
    }
    drop(text);
    let rows_count = i32::try_from(rows).unwrap_or(i32::MAX);
    let mut client = state.pool.get().await?;
    let (status, rows_count) =
        match store::store_part(&mut client, (space_id, &import_id), part, &body, rows_count).await? {
            Some(stored_rows) => (StatusCode::OK, stored_rows),
            None => (StatusCode::ACCEPTED, rows_count),
        };
    platform::db::release(client, body.len());
    Ok(HttpResponse::build(status).json(json!({"data": {"importId": import_id, "part": part, "rows": rows_count}})))
}

/// `POST /imports/{importId}/complete` `{parts}`: no more parts; parts 1 to `parts` must all
/// have been received. A repeat with the same count answers the same.
pub async fn complete(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let body = api::http::read_json_object(&req, payload).await?;
    let import_id = path.into_inner();
    let parts = decide::completion_parts(&body)?;
    let space_id = caller.space_id();
    let mut client = state.pool.get().await?;
    store::close(&mut client, (space_id, &import_id), parts).await?;
    let document =
        reads::imports::document(&client, space_id, &import_id).await?.ok_or_else(|| not_found(&import_id))?;
    Ok(HttpResponse::Ok().json(json!({ "data": document })))
}
