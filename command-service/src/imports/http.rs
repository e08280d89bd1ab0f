//! An import's intake: `PUT /imports/{importId}` (create, with its settings),
//! `PUT /imports/{importId}/parts/{part}` (one part of the file, CSV or NDJSON, up to the body
//! limit) and `POST /imports/{importId}/complete` (no more parts). Each is safe to retry: the
//! import id and the part numbers are the caller's, a repeat with the same content answers as
//! the first did, and another content under them is 409 `import_conflict`. The rows are
//! decided later by the projector's `imports` worker; `GET /imports/{importId}` follows them.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::Permission;
use domain::imports::{self, Format, Settings};
use platform::error::{ApiError, Code};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::State;
use crate::pipeline;
use crate::write_contexts::{self, Kind};

fn not_found(import_id: &str) -> ApiError {
    ApiError::not_found(Code::ImportNotFound, format!("no import {import_id:?} in this space"))
}

fn check_id(import_id: &str) -> Result<(), ApiError> {
    if imports::valid_import_id(import_id) {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            Code::InvalidId,
            "an import id is 1 to 128 letters, digits and . _ : - (chosen by the caller, so a retry is safe)",
        ))
    }
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
    check_id(&import_id)?;
    let settings = imports::parse_settings(body)?;
    let context = write_contexts::at_edge(&state, Kind::Record, caller.space_id(), &settings.schema).await?;
    let schema_id = context.schema.schema_id.clone();
    let document = settings.document(&schema_id);
    let digest = Sha256::digest(document.to_string().as_bytes()).to_vec();
    let client = state.pool.get().await?;
    let inserted = client
        .execute(
            "INSERT INTO imports (space_id, import_id, schema_id, schema_type, format, settings, settings_digest,
                                  actor_key_id, created_at_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING",
            &[
                &caller.space_id(),
                &import_id,
                &schema_id,
                &context.schema.schema_type,
                &settings.format.as_str(),
                &document,
                &digest,
                &caller.key_id(),
                &platform::time::now_millis(),
            ],
        )
        .await?;
    let existing: Vec<u8> = client
        .query_opt(
            "SELECT settings_digest FROM imports WHERE space_id = $1 AND import_id = $2",
            &[&caller.space_id(), &import_id],
        )
        .await?
        .map(|row| row.get(0))
        .ok_or_else(|| not_found(&import_id))?;
    if existing != digest {
        return Err(ApiError::conflict(
            Code::ImportConflict,
            format!("import {import_id:?} exists with other settings; choose another import id"),
        ));
    }
    let status = if inserted == 1 { StatusCode::CREATED } else { StatusCode::OK };
    let document = domain::imports::status::document(&client, caller.space_id(), &import_id)
        .await?
        .ok_or_else(|| not_found(&import_id))?;
    Ok(HttpResponse::build(status).json(json!({ "data": document })))
}

/// What a part's request names, as the database holds it.
struct Import {
    schema_id: String,
    settings: Settings,
}

async fn load(client: &deadpool_postgres::Client, space_id: &str, import_id: &str) -> Result<Import, ApiError> {
    let row = client
        .query_opt(
            "SELECT schema_id, settings FROM imports WHERE space_id = $1 AND import_id = $2",
            &[&space_id, &import_id],
        )
        .await?
        .ok_or_else(|| not_found(import_id))?;
    let settings = Settings::from_document(&row.get::<_, Value>(1))
        .ok_or_else(|| ApiError::internal(&anyhow::anyhow!("import {import_id} has unreadable settings")))?;
    Ok(Import { schema_id: row.get(0), settings })
}

/// The media types a part of each format may be sent as.
fn accepts(format: Format, req: &HttpRequest) -> bool {
    let media_type = req
        .headers()
        .get(actix_web::http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .map(|value| value.trim().to_ascii_lowercase())
        .unwrap_or_default();
    match format {
        Format::Csv => media_type == "text/csv",
        Format::Ndjson => {
            ["application/x-ndjson", "application/jsonl", "application/json-lines"].contains(&media_type.as_str())
        }
    }
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
    let part: i32 = part.parse().ok().filter(|part| (1..=imports::MAX_PARTS).contains(part)).ok_or_else(|| {
        ApiError::bad_request(Code::InvalidId, format!("a part number is 1 to {}", imports::MAX_PARTS))
    })?;
    let space_id = caller.space_id();
    let import = load(&state.pool.get().await?, space_id, &import_id).await?;
    if !accepts(import.settings.format, &req) {
        let wanted = match import.settings.format {
            Format::Csv => "text/csv",
            Format::Ndjson => "application/x-ndjson",
        };
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Some(Code::UnsupportedMediaType),
            format!(
                "import {import_id:?} takes {} parts; send Content-Type: {wanted}",
                import.settings.format.as_str()
            ),
        ));
    }
    let body = api::http::read_bytes(&req, payload).await?;
    let context = write_contexts::at_edge(&state, Kind::Record, space_id, &import.schema_id).await?;
    let rows = imports::parse::read_part(import.settings.format, &body, &import.settings.columns, &context.attributes)
        .map_err(|message| ApiError::bad_request(Code::InvalidBody, message))?;
    let digest = Sha256::digest(&body).to_vec();
    let rows_count = i32::try_from(rows.len()).unwrap_or(i32::MAX);
    let mut client = state.pool.get().await?;
    let transaction = client.transaction().await?;
    // Held until the part is in: a completion waits for it, so no part lands after one.
    let closed: bool = transaction
        .query_one(
            "SELECT parts_total IS NOT NULL FROM imports WHERE space_id = $1 AND import_id = $2 FOR SHARE",
            &[&space_id, &import_id],
        )
        .await?
        .get(0);
    let existing = transaction
        .query_opt(
            "SELECT digest, rows FROM import_parts WHERE space_id = $1 AND import_id = $2 AND part = $3",
            &[&space_id, &import_id, &part],
        )
        .await?;
    let (status, rows_count) = match existing {
        Some(row) if row.get::<_, Vec<u8>>(0) == digest => (StatusCode::OK, row.get::<_, i32>(1)),
        Some(_) => {
            return Err(ApiError::conflict(
                Code::ImportConflict,
                format!("part {part} of import {import_id:?} was received with another body"),
            ));
        }
        None if closed => {
            return Err(ApiError::conflict(
                Code::ImportConflict,
                format!("import {import_id:?} is complete; it takes no more parts"),
            ));
        }
        None => {
            // A concurrent upload of the same part loses here: it is told to retry, and its
            // retry is answered as a repeat when its body is the same.
            let inserted = transaction
                .execute(
                    "INSERT INTO import_parts (space_id, import_id, part, body, digest, rows, received_at_ms)
                     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
                    &[&space_id, &import_id, &part, &&body[..], &digest, &rows_count, &platform::time::now_millis()],
                )
                .await?;
            if inserted == 0 {
                return Err(ApiError::conflict(
                    Code::ImportConflict,
                    format!("part {part} of import {import_id:?} was sent twice at once; retry"),
                ));
            }
            (StatusCode::ACCEPTED, rows_count)
        }
    };
    transaction.commit().await?;
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
    if let Some(other) = body.keys().find(|key| *key != "parts") {
        return Err(ApiError::bad_request(Code::UnknownField, format!("{other} is not a field of a completion")));
    }
    let parts = match body.get("parts") {
        Some(value) => {
            // JSON Schema's integers include 2.0.
            let whole = value.as_f64().filter(|n| n.fract() == 0.0 && n.abs() < 1e9).map(|n| n as i64);
            value
                .as_i64()
                .or(whole)
                .and_then(|n| i32::try_from(n).ok())
                .filter(|n| (1..=imports::MAX_PARTS).contains(n))
        }
        None => {
            return Err(ApiError::bad_request(Code::MissingField, "parts (how many parts the import has) is required"));
        }
    }
    .ok_or_else(|| ApiError::bad_request(Code::InvalidField, format!("parts must be 1 to {}", imports::MAX_PARTS)))?;
    let space_id = caller.space_id();
    let mut client = state.pool.get().await?;
    let transaction = client.transaction().await?;
    // Waits for parts being stored, and keeps new ones out until the import is closed.
    let total: Option<i32> = transaction
        .query_opt(
            "SELECT parts_total FROM imports WHERE space_id = $1 AND import_id = $2 FOR UPDATE",
            &[&space_id, &import_id],
        )
        .await?
        .ok_or_else(|| not_found(&import_id))?
        .get(0);
    let row = transaction
        .query_one(
            "SELECT count(*), COALESCE(max(part), 0) FROM import_parts WHERE space_id = $1 AND import_id = $2",
            &[&space_id, &import_id],
        )
        .await?;
    let (received, highest): (i64, i32) = (row.get(0), row.get(1));
    match total {
        Some(total) if total == parts => {}
        Some(total) => {
            return Err(ApiError::conflict(
                Code::ImportConflict,
                format!("import {import_id:?} was completed with {total} parts"),
            ));
        }
        None if received != i64::from(parts) || highest != parts => {
            return Err(ApiError::conflict(
                Code::ImportConflict,
                format!(
                    "import {import_id:?} has {received} parts (up to part {highest}); send parts 1 to {parts} before completing"
                ),
            ));
        }
        None => {
            transaction
                .execute(
                    "UPDATE imports SET parts_total = $3, closed_at_ms = $4 WHERE space_id = $1 AND import_id = $2",
                    &[&space_id, &import_id, &parts, &platform::time::now_millis()],
                )
                .await?;
        }
    }
    transaction.commit().await?;
    let document =
        domain::imports::status::document(&client, space_id, &import_id).await?.ok_or_else(|| not_found(&import_id))?;
    Ok(HttpResponse::Ok().json(json!({ "data": document })))
}
