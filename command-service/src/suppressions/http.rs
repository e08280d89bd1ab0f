//! Suppression writes (admin permission): create, batch create, batch remove, delete.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Value, json};
use shared::auth::{Caller, Permission};
use shared::error::ApiError;
use shared::error::Code;
use shared::events::LogEvent;
use shared::ids::new_id;
use shared::log::{AppendError, AppendRequest, ExpectedVersion, Guard, NewEvent, StreamAppend};
use shared::suppressions::{scope, suppression_document};

use crate::State;
use crate::idempotency::{self, Claim};
use crate::suppressions::decide::{NewSuppression, Refusal, decide_add, decide_remove, parse_new};
use crate::suppressions::store::{existing_keys, key_guard, load, load_many, removal_guard, stream_id};

/// Items a batch takes.
const BATCH_MAX: usize = 100;

/// How often a batch whose decision lost a race (a concurrent add or removal) is decided again.
const ATTEMPTS: usize = 3;

/// The append of one new suppression, its uniqueness guard included.
struct Addition {
    stream: StreamAppend,
    guard: Guard,
    document: Value,
}

fn addition(caller: &Caller, new: &NewSuppression) -> Result<Addition, AppendError> {
    let suppression_id = new_id("sup");
    let added = decide_add(caller.space_id(), new, &suppression_id, shared::time::now_millis(), "api");
    let document = suppression_document(&added)
        .ok()
        .flatten()
        .ok_or_else(|| AppendError::Failed("could not build the suppression document".to_owned()))?;
    let occurred_at = shared::time::from_millis(added.created_at_ms);
    let subject_id = shared::crypto::email_subject(&new.identifier).map_err(AppendError::from)?;
    Ok(Addition {
        stream: StreamAppend {
            stream_id: stream_id(&suppression_id),
            expected: ExpectedVersion::NoStream,
            events: vec![NewEvent {
                event: LogEvent::SuppressionAdded(added),
                subject_id: Some(subject_id),
                occurred_at,
            }],
        },
        guard: key_guard(scope(caller.space_id()), new, &suppression_id),
        document,
    })
}

/// The append of one removal, or why the suppression cannot be removed.
struct Removal {
    stream: StreamAppend,
    guard: Guard,
}

fn removal(
    caller: &Caller,
    suppression_id: &str,
    current: Option<&(i64, shared::proto::SuppressionAdded)>,
) -> Result<Removal, ApiError> {
    let version = current.map_or(0, |(version, _)| *version);
    let removed =
        decide_remove(caller.space_id(), suppression_id, current.map(|(_, added)| added), shared::time::now_millis())?;
    let occurred_at = shared::time::from_millis(removed.removed_at_ms);
    let subject_id = match current {
        Some((_, added)) => shared::suppressions::subject_of(added).map_err(|error| ApiError::internal(&error))?,
        None => None,
    };
    Ok(Removal {
        stream: StreamAppend {
            stream_id: stream_id(suppression_id),
            expected: ExpectedVersion::Exactly(version),
            events: vec![NewEvent { event: LogEvent::SuppressionRemoved(removed), subject_id, occurred_at }],
        },
        guard: removal_guard(suppression_id),
    })
}

/// An answer with `Consistency-Token` when something was written, and `Operation-Id` when
/// the operation has one.
fn answer(status: StatusCode, last_position: i64, body: &Value, operation_id: Option<&str>) -> HttpResponse {
    let mut response = HttpResponse::build(status);
    if last_position > 0 {
        response.insert_header(("Consistency-Token", last_position.to_string()));
    }
    if let Some(operation_id) = operation_id {
        response.insert_header(("Operation-Id", operation_id.to_owned()));
    }
    response.json(body)
}

/// A batch's body: per-item results and the summary counting items by the given statuses,
/// every other status counted as failed.
fn batch_body(results: Vec<Value>, counted: &[&str]) -> Value {
    let mut summary = serde_json::Map::new();
    for status in counted {
        let count = results.iter().filter(|result| result["status"] == *status).count();
        summary.insert((*status).to_owned(), json!(count));
    }
    let failed = results.iter().filter(|result| !counted.iter().any(|s| result["status"] == *s)).count();
    summary.insert("failed".to_owned(), json!(failed));
    json!({ "data": { "results": results, "summary": summary } })
}

/// A batch decided against the current state: its appends and the answer they make.
struct BatchPlan {
    streams: Vec<StreamAppend>,
    guards: Vec<Guard>,
    body: Value,
}

/// Appends a batch's writes with the claim's completion in one transaction, or, when it
/// writes nothing, records the answer; then answers 200.
async fn commit_batch(
    req: &HttpRequest,
    state: &State,
    caller: &Caller,
    (claim, operation_id): (Option<&Claim>, &str),
    BatchPlan { streams, guards, body }: BatchPlan,
) -> Result<HttpResponse, AppendError> {
    if streams.is_empty() {
        if let Some(claim) = claim {
            claim.record(state, StatusCode::OK, &body).await.map_err(|error| match error.code() {
                Some(Code::ServiceUnavailable) => AppendError::Unavailable(error.message().to_owned()),
                Some(Code::ValueNotStorable) => AppendError::Refused(error.message().to_owned()),
                _ => AppendError::Failed(error.message().to_owned()),
            })?;
        }
        return Ok(answer(StatusCode::OK, 0, &body, Some(operation_id)));
    }
    let guards = guards.into_iter().chain(claim.map(|claim| claim.completion(StatusCode::OK, &body))).collect();
    let appended = crate::edge::append(state, req, caller, claim, streams, guards).await?;
    Ok(answer(StatusCode::OK, appended.last_position, &body, Some(operation_id)))
}

/// Runs a batch under the caller's `Idempotency-Key`: decides it, commits it, and decides
/// again (up to `ATTEMPTS` times) when a concurrent write made the decision stale.
async fn run_batch<F, Fut>(
    req: &HttpRequest,
    state: &State,
    caller: &Caller,
    body: &Value,
    decide: F,
) -> Result<HttpResponse, ApiError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<BatchPlan, AppendError>>,
{
    idempotency::protect(state, req, caller, body, |claim, operation_id| async move {
        for _ in 0..ATTEMPTS {
            let outcome = match decide().await {
                Ok(plan) => commit_batch(req, state, caller, (claim.as_ref(), &operation_id), plan).await,
                Err(error) => Err(error),
            };
            if let Some(outcome) = batch_outcome(outcome) {
                return outcome;
            }
        }
        Err(lost_too_often())
    })
    .await
}

/// The outcome of a batch attempt: retry when the decision lost a race.
fn batch_outcome(outcome: Result<HttpResponse, AppendError>) -> Option<Result<HttpResponse, ApiError>> {
    match outcome {
        Ok(response) => Some(Ok(response)),
        Err(AppendError::WrongVersion { .. } | AppendError::Conflict { code: Code::SuppressionAlreadyExists, .. }) => {
            None
        }
        Err(AppendError::Conflict { code: Code::SuppressionNotFound, .. }) => None,
        Err(error) => Some(Err(crate::edge::append_error(error))),
    }
}

fn lost_too_often() -> ApiError {
    ApiError::conflict(
        Code::ConcurrentModification,
        "the suppressions kept changing while this batch was applied; retry",
    )
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
    let Addition { stream, guard, document } = addition(&caller, &new).map_err(crate::edge::append_error)?;
    let appended = state
        .event_log
        .append(AppendRequest {
            metadata: crate::edge::metadata(&req, &caller, None),
            streams: vec![stream],
            guards: vec![guard],
        })
        .await
        .map_err(crate::edge::append_error)?;
    Ok(answer(StatusCode::CREATED, appended.last_position, &json!({ "data": document }), None))
}

/// Reads `{<field>: [1..100 items]}`; any other field is 400 `unknown_field`.
fn batch_items(body: &Value, field: &str) -> Result<Vec<Value>, ApiError> {
    if let Some(object) = body.as_object() {
        let issues: Vec<shared::error::Issue> = object
            .keys()
            .filter(|key| key.as_str() != field)
            .map(|key| {
                shared::error::Issue::coded(
                    key,
                    Code::UnknownField,
                    format!("{key} is not a field; the body has {field}"),
                )
            })
            .collect();
        if let Some(first) = issues.first() {
            return Err(ApiError::bad_request(Code::UnknownField, first.message.clone()).with_issues(issues));
        }
    }
    let items = body.get(field).and_then(Value::as_array).ok_or_else(|| {
        ApiError::bad_request(Code::InvalidBody, format!("the body must be an object with an array {field:?}"))
    })?;
    if items.is_empty() || items.len() > BATCH_MAX {
        return Err(ApiError::bad_request(
            Code::InvalidBatchSize,
            format!("{field} must hold 1 to {BATCH_MAX} items; got {}", items.len()),
        ));
    }
    Ok(items.clone())
}

/// `POST /contacts/suppressions/batch`: per-item results, always 200. The new suppressions
/// are appended in one transaction (with the idempotency outcome, when keyed); an item whose
/// identifier and reason exist already (or repeat an earlier item) is `exists`.
pub async fn batch_create(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = state.authenticator.authorize(&req, Permission::Admin).await?;
    let body = shared::http::read_json(&req, payload).await?;
    let items = batch_items(&body, "suppressions")?;
    let parsed: Vec<Result<NewSuppression, ApiError>> =
        items.iter().map(|item| parse_new(item).map_err(ApiError::from)).collect();
    let (state, caller, parsed) = (&**state, &caller, &parsed);
    run_batch(&req, state, caller, &body, || async move {
        let wanted: Vec<&NewSuppression> = parsed.iter().filter_map(|item| item.as_ref().ok()).collect();
        let client = state.pool.get().await?;
        let existing = existing_keys(&client, scope(caller.space_id()), &wanted).await?;
        drop(client);
        let mut seen = std::collections::HashSet::new();
        let (mut results, mut streams, mut guards) = (Vec::new(), Vec::new(), Vec::new());
        for (index, item) in parsed.iter().enumerate() {
            let new = match item {
                Ok(new) => new,
                Err(error) => {
                    results.push(json!({"index": index, "status": "invalid", "error": error.body()["error"]}));
                    continue;
                }
            };
            let key = (new.identifier.clone(), new.reason.clone());
            if existing.contains(&key) || !seen.insert(key) {
                results.push(json!({"index": index, "status": "exists"}));
                continue;
            }
            let Addition { stream, guard, document } = addition(caller, new)?;
            results.push(json!({"index": index, "status": "created", "suppression": document}));
            streams.push(stream);
            guards.push(guard);
        }
        Ok(BatchPlan { streams, guards, body: batch_body(results, &["created", "exists"]) })
    })
    .await
}

/// `POST /contacts/suppressions/batch-remove`: per-id results, always 200; the removals are
/// appended in one transaction (with the idempotency outcome, when keyed). An id repeated in
/// the batch is `not_found` after its first removal.
pub async fn batch_remove(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = state.authenticator.authorize(&req, Permission::Admin).await?;
    let body = shared::http::read_json(&req, payload).await?;
    let items = batch_items(&body, "ids")?;
    let ids: Vec<String> = items.iter().filter_map(|item| item.as_str().map(str::to_owned)).collect();
    let (state, caller, items, ids) = (&**state, &caller, &items, &ids);
    run_batch(&req, state, caller, &body, || async move {
        let client = state.pool.get().await?;
        let current = load_many(&client, ids).await?;
        drop(client);
        let mut seen = std::collections::HashSet::new();
        let (mut results, mut streams, mut guards) = (Vec::new(), Vec::new(), Vec::new());
        for (index, item) in items.iter().enumerate() {
            let Some(id) = item.as_str() else {
                let error = ApiError::bad_request(Code::InvalidId, "each id must be a string");
                results.push(json!({"index": index, "status": "invalid", "error": error.body()["error"]}));
                continue;
            };
            let found = if seen.insert(id) { current.get(id) } else { None };
            match removal(caller, id, found) {
                Ok(Removal { stream, guard }) => {
                    results.push(json!({"index": index, "id": id, "status": "removed"}));
                    streams.push(stream);
                    guards.push(guard);
                }
                Err(error) => {
                    let status = match error.code() {
                        Some(Code::SuppressionNotFound) => "not_found",
                        Some(Code::SuppressionNotRemovable) => "not_removable",
                        _ => "failed",
                    };
                    results.push(json!({"index": index, "id": id, "status": status, "error": error.body()["error"]}));
                }
            }
        }
        Ok(BatchPlan { streams, guards, body: batch_body(results, &["removed"]) })
    })
    .await
}

/// `DELETE /contacts/suppressions/{id}` (honours `Idempotency-Key`).
pub async fn delete(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = state.authenticator.authorize(&req, Permission::Admin).await?;
    let suppression_id = path.into_inner();
    let (req, state, caller, suppression_id) = (&req, &**state, &caller, suppression_id.as_str());
    // The path is the whole input: the body identity of a DELETE is empty.
    idempotency::protect(state, req, caller, &Value::Null, |claim, operation_id| async move {
        let client = state.pool.get().await?;
        let current = load(&client, suppression_id).await.map_err(|error| ApiError::internal(&error))?;
        drop(client);
        let Removal { stream, guard } = removal(caller, suppression_id, current.as_ref())?;
        let body = json!({ "data": { "id": suppression_id, "deleted": true } });
        let guards =
            std::iter::once(guard).chain(claim.as_ref().map(|c| c.completion(StatusCode::OK, &body))).collect();
        let appended =
            crate::edge::append(state, req, caller, claim.as_ref(), vec![stream], guards).await.map_err(|error| {
                match error {
                    // Removed by someone else in the meantime.
                    AppendError::WrongVersion { .. } => Refusal::NotFound(suppression_id.to_owned()).into(),
                    other => crate::edge::append_error(other),
                }
            })?;
        Ok(answer(StatusCode::OK, appended.last_position, &body, Some(&operation_id)))
    })
    .await
}
