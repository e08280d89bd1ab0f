//! Suppression writes (admin permission): create, batch create, batch remove, delete.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Value, json};
use shared::auth::{Caller, Permission};
use shared::error::ApiError;
use shared::events::LogEvent;
use shared::ids::new_id;
use shared::log::{AppendError, AppendRequest, Appended, ExpectedVersion, Guard, NewEvent, StreamAppend};
use shared::suppressions::{scope, suppression_document};

use crate::State;
use crate::domain::suppressions::{NewSuppression, Refusal, decide_add, decide_remove, parse_new};
use crate::store::suppressions::{load, stream_id};

/// Items a batch takes.
const BATCH_MAX: usize = 100;

/// Adds one suppression; `Ok((document, appended))` or the append's refusal.
async fn add(
    req: &HttpRequest,
    state: &State,
    caller: &Caller,
    new: &NewSuppression,
) -> Result<(Value, Appended), AppendError> {
    let suppression_id = new_id("sup");
    let added = decide_add(caller.space_id(), new, &suppression_id, shared::time::now_millis(), "api");
    let document = suppression_document(&added)
        .ok()
        .flatten()
        .ok_or_else(|| AppendError::Unavailable("could not build the suppression document".to_owned()))?;
    let occurred_at = shared::time::from_millis(added.created_at_ms);
    let appended = state
        .event_log
        .append(AppendRequest {
            metadata: super::metadata(req, caller, None),
            streams: vec![StreamAppend {
                stream_id: stream_id(&suppression_id),
                expected: ExpectedVersion::NoStream,
                events: vec![NewEvent { event: LogEvent::SuppressionAdded(added), subject_id: None, occurred_at }],
            }],
            guards: vec![Guard {
                expect_rows: None,
                sql: "INSERT INTO suppression_keys (scope, identifier, reason, suppression_id) VALUES ($1, $2, $3, $4)",
                params: vec![
                    Box::new(scope(caller.space_id()).to_owned()),
                    Box::new(new.identifier.clone()),
                    Box::new(new.reason.clone()),
                    Box::new(suppression_id.clone()),
                ],
                conflict: AppendError::Conflict {
                    code: "suppression_already_exists",
                    message: format!("{} is already suppressed with reason {}", new.identifier, new.reason),
                },
            }],
        })
        .await?;
    Ok((document, appended))
}

/// Removes one suppression of the caller's space.
async fn remove(req: &HttpRequest, state: &State, caller: &Caller, suppression_id: &str) -> Result<Appended, ApiError> {
    let client = state.pool.get().await?;
    let current = load(&client, suppression_id).await.map_err(|error| ApiError::internal(&error))?;
    drop(client);
    let version = current.as_ref().map_or(0, |(version, _)| *version);
    let removed =
        decide_remove(caller.space_id(), current.as_ref().map(|(_, added)| added), shared::time::now_millis())
            .map_err(|refusal| refusal_error(refusal, suppression_id))?;
    let occurred_at = shared::time::from_millis(removed.removed_at_ms);
    state
        .event_log
        .append(AppendRequest {
            metadata: super::metadata(req, caller, None),
            streams: vec![StreamAppend {
                stream_id: stream_id(suppression_id),
                expected: ExpectedVersion::Exactly(version),
                events: vec![NewEvent { event: LogEvent::SuppressionRemoved(removed), subject_id: None, occurred_at }],
            }],
            guards: vec![Guard {
                expect_rows: None,
                sql: "DELETE FROM suppression_keys WHERE suppression_id = $1",
                params: vec![Box::new(suppression_id.to_owned())],
                conflict: AppendError::Conflict { code: "suppression_not_found", message: String::new() },
            }],
        })
        .await
        .map_err(|error| match error {
            // Removed by someone else in the meantime.
            AppendError::WrongVersion { .. } => refusal_error(Refusal::NotFound, suppression_id),
            other => super::append_error(other),
        })
}

fn refusal_error(refusal: Refusal, suppression_id: &str) -> ApiError {
    match refusal {
        Refusal::NotFound => {
            ApiError::not_found("suppression_not_found", format!("no suppression {suppression_id:?} in this space"))
        }
        Refusal::NotRemovable => ApiError::conflict(
            "suppression_not_removable",
            "only manual and legal suppressions of your space can be removed; global and provider (bounce, \
             complaint) suppressions cannot",
        ),
    }
}

/// An answer with `Consistency-Token` when something was written.
fn answer(status: StatusCode, last_position: i64, body: &Value) -> HttpResponse {
    let mut response = HttpResponse::build(status);
    if last_position > 0 {
        response.insert_header(("Consistency-Token", last_position.to_string()));
    }
    response.json(body)
}

/// A batch's 200: per-item results (each with the position it wrote, 0 for none) and the
/// summary counting items by the given statuses, every other status counted as failed.
fn batch_answer(outcomes: Vec<(Value, i64)>, counted: &[&str]) -> HttpResponse {
    let mut summary = serde_json::Map::new();
    for status in counted {
        let count = outcomes.iter().filter(|(result, _)| result["status"] == *status).count();
        summary.insert((*status).to_owned(), json!(count));
    }
    let failed = outcomes.iter().filter(|(result, _)| !counted.iter().any(|s| result["status"] == *s)).count();
    summary.insert("failed".to_owned(), json!(failed));
    let last_position = outcomes.iter().map(|(_, position)| *position).max().unwrap_or(0);
    let results: Vec<Value> = outcomes.into_iter().map(|(result, _)| result).collect();
    answer(StatusCode::OK, last_position, &json!({ "data": { "results": results, "summary": summary } }))
}

/// `POST /contacts/suppressions`: one suppression; no idempotency.
pub async fn create(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = state.authenticator.authorize(&req, Permission::Admin).await?;
    let body = shared::http::read_json(&req, payload).await?;
    let new = parse_new(&body)?;
    let (document, appended) = add(&req, &state, &caller, &new).await.map_err(super::append_error)?;
    Ok(answer(StatusCode::CREATED, appended.last_position, &json!({ "data": document })))
}

/// Reads `{<field>: [1..100 items]}`.
fn batch_items(body: &Value, field: &str) -> Result<Vec<Value>, ApiError> {
    let items = body.get(field).and_then(Value::as_array).ok_or_else(|| {
        ApiError::bad_request("invalid_body", format!("the body must be an object with an array {field:?}"))
    })?;
    if items.is_empty() || items.len() > BATCH_MAX {
        return Err(ApiError::bad_request(
            "invalid_batch_size",
            format!("{field} must hold 1 to {BATCH_MAX} items; got {}", items.len()),
        ));
    }
    Ok(items.clone())
}

/// `POST /contacts/suppressions/batch`: each item on its own; always 200.
pub async fn batch_create(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = state.authenticator.authorize(&req, Permission::Admin).await?;
    let body = shared::http::read_json(&req, payload).await?;
    let items = batch_items(&body, "suppressions")?;
    let outcomes = futures_util::future::join_all(items.iter().enumerate().map(|(index, item)| {
        let (req, state, caller) = (&req, &state, &caller);
        async move {
            let new = match parse_new(item) {
                Ok(new) => new,
                Err(error) => {
                    return (json!({"index": index, "status": "invalid", "error": error.body()["error"]}), 0);
                }
            };
            match add(req, state, caller, &new).await {
                Ok((document, appended)) => {
                    (json!({"index": index, "status": "created", "suppression": document}), appended.last_position)
                }
                Err(AppendError::Conflict { code: "suppression_already_exists", .. }) => {
                    (json!({"index": index, "status": "exists"}), 0)
                }
                Err(other) => {
                    let error = super::append_error(other);
                    (json!({"index": index, "status": "failed", "error": error.body()["error"]}), 0)
                }
            }
        }
    }))
    .await;
    Ok(batch_answer(outcomes, &["created", "exists"]))
}

/// `POST /contacts/suppressions/batch-remove`: each id on its own; always 200.
pub async fn batch_remove(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = state.authenticator.authorize(&req, Permission::Admin).await?;
    let body = shared::http::read_json(&req, payload).await?;
    let items = batch_items(&body, "ids")?;
    let outcomes = futures_util::future::join_all(items.iter().enumerate().map(|(index, item)| {
        let (req, state, caller) = (&req, &state, &caller);
        async move {
            let Some(id) = item.as_str() else {
                let error = ApiError::bad_request("invalid_id", "each id must be a string");
                return (json!({"index": index, "status": "invalid", "error": error.body()["error"]}), 0);
            };
            match remove(req, state, caller, id).await {
                Ok(appended) => (json!({"index": index, "id": id, "status": "removed"}), appended.last_position),
                Err(error) => {
                    let status = match error.code() {
                        Some("suppression_not_found") => "not_found",
                        Some("suppression_not_removable") => "not_removable",
                        _ => "failed",
                    };
                    (json!({"index": index, "id": id, "status": status, "error": error.body()["error"]}), 0)
                }
            }
        }
    }))
    .await;
    Ok(batch_answer(outcomes, &["removed"]))
}

/// `DELETE /contacts/suppressions/{id}`.
pub async fn delete(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = state.authenticator.authorize(&req, Permission::Admin).await?;
    let appended = remove(&req, &state, &caller, &path).await?;
    Ok(answer(StatusCode::OK, appended.last_position, &json!({ "data": { "id": path.as_str(), "deleted": true } })))
}
