//! Firing business events: `POST /events/{schema}` and `POST /events/{schema}/batch`.
//!
//! An occurrence is named by its eventId within the space and event schema. The receipts
//! table is the index of eventIds: a fire whose eventId has a receipt is a duplicate (same
//! normalised input: the original receipt, nothing admitted) or a conflict. A new occurrence
//! is appended as `EventAccepted` together with its receipt row and its admission (token
//! buckets and caps of the fleet, space and schema), in one transaction; so a lost race, a
//! refused admission or an aborted batch leaves nothing behind. `Idempotency-Key` plays no
//! part here.
//!
//! A fire's decision (and each batch item's) is [`crate::events::decide::decide_fire`]; a
//! single fire ([`FireEvent`]) and a batch ([`FireBatch`], both `onError` modes, and the
//! ingest's events of known contacts) are commands of the pipeline, and this module loads what
//! they need and renders a batch's results.

use platform::error::Code;
use std::cell::Cell;
use std::collections::HashMap;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::Permission;
use domain::catalog;
use domain::records::Loaded;
use platform::error::ApiError;
use platform::log::AppendError;
use serde_json::{Value, json};

use crate::State;
use crate::decision;
use crate::events::decide::batch::{Batch, BatchOutcome, FireBatch, Item, OnError};
use crate::events::decide::{Candidate, EventRefusal, Fire, FireContext, FireEvent, FireInput, parse_fire};
use crate::events::store::{
    ADMISSION_REFUSED, EVENT_ID_TAKEN, Receipt, SUBJECT_DELETING, admission_state, ensure_scopes, find_receipts,
    load_subjects,
};
use crate::pipeline::{self, ATTEMPTS, Actor, Command, Ctx, Protection, Refusal, Shell};
use crate::write_contexts::{self, Kind};

/// The most events in one batch.
pub(crate) const MAX_BATCH: usize = 500;

/// A fire's context from a catalog context: its admission scopes, created when new.
async fn admitted(
    state: &State,
    space_id: &str,
    context: std::sync::Arc<catalog::WriteContext>,
) -> Result<FireContext, ApiError> {
    let catalog::WriteContext { schema, attributes, credits, .. } = std::sync::Arc::unwrap_or_clone(context);
    let scopes = domain::admission::scopes(&state.settings.events.admission, space_id, &schema.schema_id);
    if state.new_admission_scopes(&scopes) {
        let client = state.pool.get().await?;
        ensure_scopes(&client, &scopes).await?;
    }
    Ok(FireContext { space_id: space_id.into(), schema, attributes, credits, scopes })
}

/// A parsed input with the keyed digest of its normalised payload.
fn candidate(input: FireInput) -> Result<Candidate, ApiError> {
    let canonical = crate::canonical::canonical_json(&input.normalized());
    let digest = platform::crypto::keyed_digest("event-input", &canonical).map_err(ApiError::from)?;
    Ok(Candidate { input, digest })
}

/// Receipts and subjects of `candidates`, in two statements.
async fn lookups(
    state: &State,
    context: &FireContext,
    candidates: &[&Candidate],
) -> Result<(HashMap<String, Receipt>, HashMap<String, Loaded>), ApiError> {
    let client = state.pool.get().await?;
    let event_ids: Vec<String> = candidates.iter().map(|c| c.input.event_id.clone()).collect();
    let subject_ids: Vec<String> = candidates.iter().filter_map(|c| c.input.subject().map(str::to_owned)).collect();
    let (receipts, subjects) = tokio::join!(
        find_receipts(&client, &context.space_id, &context.schema.schema_id, &event_ids),
        load_subjects(&client, &subject_ids)
    );
    Ok((receipts?, subjects.map_err(ApiError::from)?))
}

impl Command for FireEvent {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Fire, ApiError> {
        let space_id = &self.space_id;
        let context = write_contexts::current(ctx, Kind::Event, space_id, &self.schema_ref).await?;
        let mut context = admitted(ctx.state, space_id, context).await?;
        // A generated eventId is drawn when the fire is decided.
        let parsed = parse_fire(context.event_schema(), self.input.clone(), platform::time::now_millis(), String::new)?;
        // A kept context's credits are stale: an event that needs preparation reads them now.
        if ctx.kept() && !parsed.pending_keys.is_empty() {
            let catalog = ctx.catalog().await?;
            context.credits = reads::catalog::credits(&ctx.db().await?, &catalog, space_id).await?;
        }
        let candidate = candidate(parsed)?;
        let optimistic = ctx.attempt() == 0 && candidate.input.subject().is_none() && !self.admission_refused.get();
        let lookups = match optimistic {
            true => None,
            false => Some(lookups(ctx.state, &context, &[&candidate]).await?),
        };
        let admission = match self.admission_refused.get() {
            true => Some(admission_state(&ctx.db().await?, &context.scopes).await?),
            false => None,
        };
        Ok(Fire { context, candidate, lookups, admission })
    }

    fn answer(&self, outcome: decision::Outcome, _: &Shell<'_>) -> Result<pipeline::Decided, ApiError> {
        Ok(outcome.into())
    }

    fn refused(&self, error: AppendError) -> Refusal {
        match error {
            AppendError::Conflict { code: EVENT_ID_TAKEN, .. } => Refusal::Again,
            AppendError::Conflict { code: ADMISSION_REFUSED, .. } => {
                self.admission_refused.set(true);
                Refusal::Again
            }
            AppendError::Conflict { code: SUBJECT_DELETING, .. } => Refusal::Fail(EventRefusal::SubjectDeleting.into()),
            error => Refusal::default_for(error),
        }
    }

    fn attempts(&self) -> usize {
        // The optimistic first attempt, then the contract's.
        ATTEMPTS + 1
    }

    fn lost_too_often(&self) -> ApiError {
        EventRefusal::Concurrent.into()
    }
}

#[tracing::instrument(skip_all, fields(schema = %path.as_str()))]
pub async fn fire(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let schema_ref = path.into_inner();
    // The schema is checked before the body, as the contract's order says.
    write_contexts::at_edge(&state, Kind::Event, caller.space_id(), &schema_ref).await?;
    let input = api::http::read_json_object(&req, payload).await?;
    let space_id = caller.space_id().to_owned();
    let command = FireEvent { space_id: space_id.into(), schema_ref, input, admission_refused: Cell::new(false) };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Unkeyed, command).await
}

fn parse_batch(body: Value) -> Result<(Vec<Value>, OnError), EventRefusal> {
    let Value::Object(mut body) = body else {
        return Err(EventRefusal::invalid(Code::InvalidBody, "the request body must be a JSON object"));
    };
    let on_error = match body.remove("onError") {
        None | Some(Value::Null) => OnError::Continue,
        Some(Value::String(mode)) if mode == "continue" => OnError::Continue,
        Some(Value::String(mode)) if mode == "abort" => OnError::Abort,
        Some(_) => return Err(EventRefusal::invalid(Code::InvalidBatch, "onError must be \"continue\" or \"abort\"")),
    };
    let events = match body.remove("events") {
        Some(Value::Array(events)) => events,
        Some(_) => return Err(EventRefusal::invalid(Code::InvalidBatch, "events must be an array of event inputs")),
        None => {
            return Err(EventRefusal::invalid(Code::InvalidBatch, "events is required: an array of 1 to 500 inputs"));
        }
    };
    if let Some(key) = body.keys().next() {
        return Err(EventRefusal::invalid(
            Code::InvalidBatch,
            format!("unknown field {key:?}; a batch has events and onError"),
        ));
    }
    if events.is_empty() || events.len() > MAX_BATCH {
        let message = format!("a batch has 1 to {MAX_BATCH} events; got {}", events.len());
        return Err(EventRefusal::invalid(Code::InvalidBatchSize, message));
    }
    Ok((events, on_error))
}

fn accepted_item(index: usize, receipt: &Value) -> Value {
    json!({
        "index": index,
        "status": "accepted",
        "id": receipt["id"],
        "eventId": receipt["eventId"],
        "isDuplicate": receipt["isDuplicate"],
        "readinessAtAcceptance": receipt["readinessAtAcceptance"],
    })
}

/// A refused item: its error, and when to retry a refused admission.
fn refused_item(index: usize, refusal: EventRefusal) -> Value {
    let retry_after_ms = refusal.retry_after_ms();
    failed_item(index, &ApiError::from(refusal), retry_after_ms)
}

fn failed_item(index: usize, error: &ApiError, retry_after_ms: Option<u64>) -> Value {
    let mut item = json!({ "index": index, "status": "failed", "error": error.body()["error"] });
    if let Some(retry) = retry_after_ms {
        item["retryAfterMilliseconds"] = json!(retry);
    }
    item
}

#[tracing::instrument(skip_all, fields(schema = %path.as_str()))]
pub async fn batch(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let schema_ref = path.into_inner();
    // The schema is checked before the body, as the contract's order says.
    write_contexts::at_edge(&state, Kind::Event, caller.space_id(), &schema_ref).await?;
    let (events, on_error) = parse_batch(api::http::read_json(&req, payload).await?)?;
    let space_id = caller.space_id().into();
    let command = FireBatch { space_id, schema_ref, events, on_error, admission_refused: Cell::new(false) };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Unkeyed, command).await
}

impl Command for FireBatch {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Batch, ApiError> {
        let space_id = &self.space_id;
        let context = write_contexts::current(ctx, Kind::Event, space_id, &self.schema_ref).await?;
        let mut context = admitted(ctx.state, space_id, context).await?;
        let now_ms = platform::time::now_millis();
        let mut items = Vec::with_capacity(self.events.len());
        for event in &self.events {
            // A generated eventId is drawn when the batch is decided.
            let item = match event {
                Value::Object(input) => parse_fire(context.event_schema(), input.clone(), now_ms, String::new),
                _ => Err(EventRefusal::invalid(Code::InvalidEventInput, "each event must be a JSON object")),
            };
            let item = match item {
                Ok(input) => Ok(candidate(input)?),
                Err(refusal) => Err(refusal),
            };
            let invalid = item.is_err();
            items.push(item);
            // An aborting batch is not attempted past its first invalid item.
            if invalid && self.on_error == OnError::Abort {
                break;
            }
        }
        let candidates: Vec<&Candidate> = items.iter().filter_map(|item| item.as_ref().ok()).collect();
        // A kept context's credits are stale: a batch with an event that needs preparation
        // reads them now.
        if ctx.kept() && candidates.iter().any(|candidate| !candidate.input.pending_keys.is_empty()) {
            let catalog = ctx.catalog().await?;
            context.credits = reads::catalog::credits(&ctx.db().await?, &catalog, space_id).await?;
        }
        let (receipts, subjects) = lookups(ctx.state, &context, &candidates).await?;
        let admission = match self.admission_refused.get() {
            true => Some(admission_state(&ctx.db().await?, &context.scopes).await?),
            false => None,
        };
        Ok(Batch { context, items, receipts, subjects, admission })
    }

    fn answer(&self, outcome: BatchOutcome, _: &Shell<'_>) -> Result<pipeline::Decided, ApiError> {
        Ok(match outcome {
            BatchOutcome::Accepted { items, streams, guards } => {
                let answer = pipeline::Answer::json(StatusCode::OK, batch_body(&items));
                match streams.is_empty() {
                    true => pipeline::Decided::Answer(answer),
                    false => pipeline::Decided::Append(pipeline::Decision::new(streams, guards, answer)),
                }
            }
            BatchOutcome::Aborted { items } => pipeline::Decided::Answer(pipeline::Answer::json(
                StatusCode::UNPROCESSABLE_ENTITY,
                aborted_body(&items),
            )),
        })
    }

    fn refused(&self, error: AppendError) -> Refusal {
        match error {
            // An eventId taken meanwhile, or a subject whose deletion began: read again.
            AppendError::Conflict { code: EVENT_ID_TAKEN | SUBJECT_DELETING, .. } => Refusal::Again,
            AppendError::Conflict { code: ADMISSION_REFUSED, .. } => {
                self.admission_refused.set(true);
                Refusal::Again
            }
            error => Refusal::default_for(error),
        }
    }

    fn attempts(&self) -> usize {
        // One attempt more than a command's: one may go to reading the admission state.
        ATTEMPTS + 1
    }

    fn lost_too_often(&self) -> ApiError {
        EventRefusal::BatchConcurrent.into()
    }
}

/// The receipt of the item at `index`, following a repeat to its first occurrence.
fn receipt_of(items: &[Item], index: usize) -> Option<&Value> {
    match items.get(index)? {
        Item::Existing(receipt) | Item::New(receipt) => Some(receipt),
        Item::RepeatOf(first) => receipt_of(items, *first),
        Item::Refused(_) => None,
    }
}

/// The result of the item at `index`. In an aborted batch (`aborted`) its new occurrences are
/// `rolled_back`; duplicates of receipts that existed before stay `accepted`.
fn item_result(items: &[Item], index: usize, aborted: bool) -> Value {
    let receipt = || receipt_of(items, index).cloned().unwrap_or(Value::Null);
    match &items[index] {
        Item::Refused(refusal) => refused_item(index, refusal.clone()),
        Item::New(_) | Item::RepeatOf(_) if aborted => {
            json!({ "index": index, "status": "rolled_back", "eventId": receipt()["eventId"] })
        }
        Item::RepeatOf(_) => {
            let mut receipt = receipt();
            receipt["isDuplicate"] = Value::Bool(true);
            accepted_item(index, &receipt)
        }
        Item::Existing(receipt) | Item::New(receipt) => accepted_item(index, receipt),
    }
}

/// Every item's result, and the summary counted from them.
fn results(items: &[Item], aborted: bool) -> (Vec<Value>, Value) {
    let results: Vec<Value> = (0..items.len()).map(|index| item_result(items, index, aborted)).collect();
    let count = |status: &str| results.iter().filter(|result| result["status"] == status).count();
    let summary = json!({ "accepted": count("accepted"), "failed": count("failed") });
    (results, summary)
}

/// 200: every item's result and the summary.
fn batch_body(items: &[Item]) -> Value {
    let (results, summary) = results(items, false);
    json!({ "data": { "results": results, "summary": summary } })
}

/// 422 as a data result: the failing item (the last) is `failed`, later items are not
/// attempted (and not listed).
fn aborted_body(items: &[Item]) -> Value {
    let (results, summary) = results(items, true);
    json!({ "data": { "results": results, "summary": summary, "failedIndex": items.len().saturating_sub(1) } })
}
