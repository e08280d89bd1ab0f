//! Suppression writes (admin permission), on the command pipeline: create, batch create,
//! batch remove, delete.

use std::collections::{HashMap, HashSet};

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::{Caller, Permission};
use domain::suppressions::{scope, suppression_document};
use platform::error::ApiError;
use platform::error::Code;
use platform::events::LogEvent;
use platform::ids::new_id;
use platform::log::{AppendError, ExpectedVersion, Guard, NewEvent, StreamAppend};
use platform::proto::SuppressionAdded;
use serde_json::{Value, json};

use crate::State;
use crate::pipeline::{self, Actor, Answer, Command, Ctx, Decided, Decision, Given, Protection, Refusal as Lost};
use crate::suppressions::decide::{NewSuppression, decide_add, decide_remove, parse_new};
use crate::suppressions::store::{existing_keys, key_guard, load, load_many, removal_guard, stream_id};

/// Items a batch takes.
const BATCH_MAX: usize = 100;

/// The append of one new suppression, its uniqueness guard included.
struct Addition {
    stream: StreamAppend,
    guard: Guard,
    document: Value,
}

fn addition(caller: &Caller, new: &NewSuppression) -> Result<Addition, AppendError> {
    let suppression_id = new_id("sup");
    let added = decide_add(caller.space_id(), new, &suppression_id, platform::time::now_millis(), "api");
    let document = suppression_document(&added)
        .ok()
        .flatten()
        .ok_or_else(|| AppendError::Failed("could not build the suppression document".to_owned()))?;
    let occurred_at = platform::time::from_millis(added.created_at_ms);
    let subject_id = platform::crypto::email_subject(&new.identifier).map_err(AppendError::from)?;
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
    current: Option<&(i64, SuppressionAdded)>,
    now_ms: i64,
) -> Result<Removal, ApiError> {
    let version = current.map_or(0, |(version, _)| *version);
    let removed = decide_remove(caller.space_id(), suppression_id, current.map(|(_, added)| added), now_ms)?;
    let occurred_at = platform::time::from_millis(removed.removed_at_ms);
    let subject_id = match current {
        Some((_, added)) => domain::suppressions::subject_of(added).map_err(|error| ApiError::internal(&error))?,
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

/// A batch decided: its appends in one transaction, or, when it writes nothing, its answer.
fn batch_decision(streams: Vec<StreamAppend>, guards: Vec<Guard>, body: Value) -> Decided {
    let answer = Answer::json(StatusCode::OK, body);
    if streams.is_empty() { Decided::Answer(answer) } else { Decided::Append(Decision::new(streams, guards, answer)) }
}

/// A batch whose decision lost a race (a concurrent add or removal) is decided again.
fn batch_refused(error: AppendError) -> Lost {
    match error {
        AppendError::Conflict { code: Code::SuppressionAlreadyExists | Code::SuppressionNotFound, .. } => Lost::Again,
        error => Lost::default_for(error),
    }
}

fn lost_too_often() -> ApiError {
    ApiError::conflict(
        Code::ConcurrentModification,
        "the suppressions kept changing while this batch was applied; retry",
    )
}

/// `POST /contacts/suppressions`: one suppression; no idempotency. The identifier and reason
/// are unique in the space by the append's guard (409 `suppression_already_exists`).
struct CreateSuppression<'a> {
    caller: &'a Caller,
    new: NewSuppression,
}

impl Command for CreateSuppression<'_> {
    type Loaded = ();

    async fn load(&self, _: &Ctx<'_>) -> Result<(), ApiError> {
        Ok(())
    }

    fn decide(&self, (): (), _: &Given<'_>) -> Result<Decided, ApiError> {
        let Addition { stream, guard, document } =
            addition(self.caller, &self.new).map_err(crate::edge::append_error)?;
        Ok(Decided::Append(Decision::one(stream, vec![guard], StatusCode::CREATED, json!({ "data": document }))))
    }
}

pub async fn create(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Admin).await?;
    let body = api::http::read_json(&req, payload).await?;
    let command = CreateSuppression { caller: &caller, new: parse_new(&body)? };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Unkeyed, command).await
}

/// Reads `{<field>: [1..100 items]}`; any other field is 400 `unknown_field`.
fn batch_items(body: &Value, field: &str) -> Result<Vec<Value>, ApiError> {
    if let Some(object) = body.as_object() {
        let issues: Vec<platform::error::Issue> = object
            .keys()
            .filter(|key| key.as_str() != field)
            .map(|key| {
                platform::error::Issue::coded(
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
struct BatchCreate<'a> {
    caller: &'a Caller,
    parsed: Vec<Result<NewSuppression, ApiError>>,
}

impl Command for BatchCreate<'_> {
    type Loaded = HashSet<(String, String)>;

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let wanted: Vec<&NewSuppression> = self.parsed.iter().filter_map(|item| item.as_ref().ok()).collect();
        Ok(existing_keys(&ctx.db().await?, scope(self.caller.space_id()), &wanted).await?)
    }

    fn decide(&self, existing: Self::Loaded, _: &Given<'_>) -> Result<Decided, ApiError> {
        let mut seen = HashSet::new();
        let (mut results, mut streams, mut guards) = (Vec::new(), Vec::new(), Vec::new());
        for (index, item) in self.parsed.iter().enumerate() {
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
            let Addition { stream, guard, document } = addition(self.caller, new).map_err(crate::edge::append_error)?;
            results.push(json!({"index": index, "status": "created", "suppression": document}));
            streams.push(stream);
            guards.push(guard);
        }
        Ok(batch_decision(streams, guards, batch_body(results, &["created", "exists"])))
    }

    fn refused(&self, error: AppendError) -> Lost {
        batch_refused(error)
    }

    fn lost_too_often(&self) -> ApiError {
        lost_too_often()
    }
}

pub(crate) async fn batch_create(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Admin).await?;
    let body = api::http::read_json(&req, payload).await?;
    let items = batch_items(&body, "suppressions")?;
    let parsed = items.iter().map(|item| parse_new(item).map_err(ApiError::from)).collect();
    let command = BatchCreate { caller: &caller, parsed };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&body), command).await
}

/// `POST /contacts/suppressions/batch-remove`: per-id results, always 200; the removals are
/// appended in one transaction (with the idempotency outcome, when keyed). An id repeated in
/// the batch is `not_found` after its first removal.
struct BatchRemove<'a> {
    caller: &'a Caller,
    items: Vec<Value>,
}

impl Command for BatchRemove<'_> {
    type Loaded = HashMap<String, (i64, SuppressionAdded)>;

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let ids: Vec<String> = self.items.iter().filter_map(|item| item.as_str().map(str::to_owned)).collect();
        load_many(&ctx.db().await?, &ids).await.map_err(|error| ApiError::internal(&error))
    }

    fn decide(&self, current: Self::Loaded, given: &Given<'_>) -> Result<Decided, ApiError> {
        let mut seen = HashSet::new();
        let (mut results, mut streams, mut guards) = (Vec::new(), Vec::new(), Vec::new());
        for (index, item) in self.items.iter().enumerate() {
            let Some(id) = item.as_str() else {
                let error = ApiError::bad_request(Code::InvalidId, "each id must be a string");
                results.push(json!({"index": index, "status": "invalid", "error": error.body()["error"]}));
                continue;
            };
            let found = if seen.insert(id) { current.get(id) } else { None };
            match removal(self.caller, id, found, given.now_ms) {
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
        Ok(batch_decision(streams, guards, batch_body(results, &["removed"])))
    }

    fn refused(&self, error: AppendError) -> Lost {
        batch_refused(error)
    }

    fn lost_too_often(&self) -> ApiError {
        lost_too_often()
    }
}

pub(crate) async fn batch_remove(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Admin).await?;
    let body = api::http::read_json(&req, payload).await?;
    let items = batch_items(&body, "ids")?;
    let command = BatchRemove { caller: &caller, items };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&body), command).await
}

/// `DELETE /contacts/suppressions/{id}` (honours `Idempotency-Key`). One removed by someone else
/// meanwhile is found gone when decided again: 404.
struct DeleteSuppression<'a> {
    caller: &'a Caller,
    suppression_id: String,
}

impl Command for DeleteSuppression<'_> {
    type Loaded = Option<(i64, SuppressionAdded)>;

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        load(&ctx.db().await?, &self.suppression_id).await.map_err(|error| ApiError::internal(&error))
    }

    fn decide(&self, current: Self::Loaded, given: &Given<'_>) -> Result<Decided, ApiError> {
        let Removal { stream, guard } = removal(self.caller, &self.suppression_id, current.as_ref(), given.now_ms)?;
        let body = json!({ "data": { "id": self.suppression_id, "deleted": true } });
        Ok(Decided::Append(Decision::one(stream, vec![guard], StatusCode::OK, body)))
    }
}

pub async fn delete(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Admin).await?;
    // The path is the whole input: the body identity of a DELETE is empty.
    let command = DeleteSuppression { caller: &caller, suppression_id: path.into_inner() };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&Value::Null), command).await
}
