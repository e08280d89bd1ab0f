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
//! A fire's decision (and each batch item's) is [`crate::events::decide::decide_fire`]; this
//! module loads what it needs, and runs a batch's rounds and appends.

use platform::error::Code;
use std::cell::Cell;
use std::collections::HashMap;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::Permission;
use domain::catalog;
use domain::records::Loaded;
use platform::error::ApiError;
use platform::fresh::Drawn;
use platform::log::{AppendError, AppendRequest, Appended, Metadata, StreamAppend};
use serde_json::{Map, Value, json};

use crate::State;
use crate::decision;
use crate::events::decide::{
    Candidate, EventRefusal, Fire, FireContext, FireEvent, FireInput, Fired, Known, acceptance_parts, against_receipt,
    decide_fire, first_refusal, generated_event_id, parse_fire,
};
use crate::events::store::{
    ADMISSION_REFUSED, EVENT_ID_TAKEN, NewReceipt, Receipt, SUBJECT_DELETING, admission_state, ensure_scopes,
    find_receipts, load_subjects,
};
use crate::pipeline::{self, ATTEMPTS, Actor, Command, Ctx, Protection, Refusal, Shell};
use crate::write_contexts::{self, Kind};

/// The most events in one batch.
pub(crate) const MAX_BATCH: usize = 500;

/// What every fire of a batch needs, loaded once per request: who writes (what its appends
/// record) and what its fires decide on.
struct Context {
    metadata: Metadata,
    fire: FireContext,
}

/// A batch's context, read at the edge; its appends carry the catalog revision guard.
async fn context(req: &HttpRequest, state: &State, schema_ref: &str) -> Result<Context, ApiError> {
    let caller = pipeline::authorize(req, state, Permission::Write).await?;
    let metadata = crate::edge::metadata(req, &caller, None);
    context_of(state, metadata, (caller.space_id(), schema_ref)).await
}

/// The context of fires by `metadata`'s writer in event schema `schema_ref` of `space_id`.
async fn context_of(
    state: &State,
    metadata: Metadata,
    (space_id, schema_ref): (&str, &str),
) -> Result<Context, ApiError> {
    let context = write_contexts::at_edge(state, Kind::Event, space_id, schema_ref).await?;
    let revision = context.revision;
    let fire = admitted(state, space_id, context, Some(revision)).await?;
    Ok(Context { metadata, fire })
}

/// Fires `inputs` (event inputs of event schema `schema_ref` of `space_id`) for a writer that
/// is no API key (the ingest's write key, named by `metadata`), each on its own as a batch with
/// `onError: continue` fires its items (receipts and subjects looked up for all at once, the
/// new ones appended together when all are admitted): each one's receipt, or why it was not
/// accepted (an admission refusal is a 429 with its `Retry-After`).
pub(crate) async fn fire_each(
    state: &State,
    metadata: Metadata,
    (space_id, schema_ref): (&str, &str),
    inputs: Vec<Map<String, Value>>,
) -> Result<Vec<Result<Value, ApiError>>, ApiError> {
    let context = context_of(state, metadata, (space_id, schema_ref)).await?;
    let count = inputs.len();
    let now_ms = platform::time::now_millis();
    let mut outcomes = HashMap::new();
    let mut candidates = Vec::new();
    for (index, input) in inputs.into_iter().enumerate() {
        match parse_candidate(&context.fire, index, Value::Object(input), now_ms) {
            Ok(candidate) => candidates.push(candidate),
            Err(outcome) => {
                outcomes.insert(index, outcome);
            }
        }
    }
    outcomes.extend(accept_each(state, &context, candidates).await?);
    Ok((0..count)
        .map(|index| match outcomes.remove(&index) {
            Some(Outcome::Accepted { receipt, .. }) => Ok(receipt),
            Some(Outcome::Refused(refusal)) => Err(refusal.into()),
            Some(Outcome::Failed(error)) => Err(error),
            None => Err(ApiError::internal(&anyhow::anyhow!("event {index} of a fire produced no outcome"))),
        })
        .collect())
}

/// A fire's context from a catalog context: its admission scopes, created when new.
/// `revision` is the catalog revision the fire must append at (a cached context), if any.
async fn admitted(
    state: &State,
    space_id: &str,
    context: std::sync::Arc<catalog::WriteContext>,
    revision: Option<i64>,
) -> Result<FireContext, ApiError> {
    let catalog::WriteContext { schema, attributes, credits, .. } = std::sync::Arc::unwrap_or_clone(context);
    let scopes = domain::admission::scopes(&state.settings.events.admission, space_id, &schema.schema_id);
    if state.new_admission_scopes(&scopes) {
        let client = state.pool.get().await?;
        ensure_scopes(&client, &scopes).await?;
    }
    Ok(FireContext { space_id: space_id.into(), schema, attributes, credits, scopes, revision })
}

/// A batch item parsed into a candidate (a generated eventId drawn now), or what became of it.
fn parse_candidate(context: &FireContext, index: usize, item: Value, now_ms: i64) -> Result<Candidate, Outcome> {
    let input = match item {
        Value::Object(input) => input,
        _ => {
            return Err(Outcome::Refused(EventRefusal::invalid(
                Code::InvalidEventInput,
                "each event must be a JSON object",
            )));
        }
    };
    let input = parse_fire(context.event_schema(), input, now_ms, || generated_event_id(&mut Drawn))
        .map_err(Outcome::Refused)?;
    candidate(index, input).map_err(Outcome::Failed)
}

/// A parsed input with the keyed digest of its normalised payload.
fn candidate(index: usize, input: FireInput) -> Result<Candidate, ApiError> {
    let canonical = crate::canonical::canonical_json(&input.normalized());
    let digest = platform::crypto::keyed_digest("event-input", &canonical).map_err(ApiError::from)?;
    Ok(Candidate { index, input, digest })
}

/// What became of one item.
enum Outcome {
    /// Accepted now or earlier (`receipt` carries `isDuplicate`).
    Accepted { receipt: Value, position: i64 },
    /// Refused (an admission refusal says when to retry).
    Refused(EventRefusal),
    /// Its append failed.
    Failed(ApiError),
}

impl From<Result<Value, EventRefusal>> for Outcome {
    /// An item decided on its receipt.
    fn from(decided: Result<Value, EventRefusal>) -> Self {
        match decided {
            Ok(receipt) => Self::Accepted { receipt, position: 0 },
            Err(refusal) => Self::Refused(refusal),
        }
    }
}

/// The append of some new occurrences, all or nothing.
fn acceptance(context: &Context, new: Vec<(StreamAppend, NewReceipt)>) -> AppendRequest {
    let (streams, guards) = acceptance_parts(&context.fire, new);
    AppendRequest::new(context.metadata.clone(), streams, guards)
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

/// Accepts candidates each on its own (a single fire, or a batch with `onError: continue`).
/// Candidates sharing an eventId are decided one after another, so a repeat inside a batch
/// is a duplicate of (or a conflict with) the first.
async fn accept_each(
    state: &State,
    context: &Context,
    candidates: Vec<Candidate>,
) -> Result<HashMap<usize, Outcome>, ApiError> {
    let mut outcomes = HashMap::new();
    let mut rounds: Vec<Vec<Candidate>> = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for candidate in candidates {
        let round = seen.entry(candidate.input.event_id.clone()).or_insert(0);
        if rounds.len() <= *round {
            rounds.push(Vec::new());
        }
        rounds[*round].push(candidate);
        *round += 1;
    }
    for round in rounds {
        let mut todo: Vec<&Candidate> = round.iter().collect();
        // A lone occurrence about no record is appended before anything is looked up: its
        // receipt's unique key and its admission guard refuse exactly what the lookup would
        // have found (a taken eventId) or admission would refuse, and whatever is refused is
        // decided again from the lookup. One round trip and one transaction less per fire.
        let optimistic = todo.len() == 1 && todo.iter().all(|candidate| candidate.input.subject().is_none());
        for attempt in 0..ATTEMPTS + usize::from(optimistic) {
            if todo.is_empty() {
                break;
            }
            todo = accept_round(state, context, todo, optimistic && attempt == 0, &mut outcomes).await?;
        }
        for candidate in todo {
            outcomes.insert(candidate.index, Outcome::Refused(EventRefusal::Concurrent));
        }
    }
    Ok(outcomes)
}

/// One attempt at candidates with distinct eventIds. Returns those that lost a race and must
/// be decided again. `optimistic`: candidates about no record, appended without looking up
/// their receipts first; a taken eventId or a refused decision (which may be a duplicate's)
/// is decided again, and a refused admission is checked against the receipts before it
/// answers 429 (a duplicate costs nothing, even with an empty bucket).
async fn accept_round<'a>(
    state: &State,
    context: &Context,
    todo: Vec<&'a Candidate>,
    optimistic: bool,
    outcomes: &mut HashMap<usize, Outcome>,
) -> Result<Vec<&'a Candidate>, ApiError> {
    let (receipts, subjects) =
        if optimistic { (HashMap::new(), HashMap::new()) } else { lookups(state, &context.fire, &todo).await? };
    let now_ms = platform::time::now_millis();
    let mut appending = Vec::new();
    let mut again = Vec::new();
    for candidate in todo {
        let known = Known { receipt: receipts.get(&candidate.input.event_id), subjects: &subjects, admission: None };
        match decide_fire(&context.fire, candidate, known, now_ms, &mut Drawn) {
            Ok(Fired::Duplicate(receipt)) => {
                outcomes.insert(candidate.index, Outcome::Accepted { receipt, position: 0 });
            }
            Ok(Fired::New(stream, receipt)) => appending.push((candidate, (stream, receipt))),
            // Without its receipt looked up, a refusal may be a duplicate's: decide again.
            Err(_) if optimistic => again.push(candidate),
            Err(refusal) => {
                outcomes.insert(candidate.index, Outcome::Refused(refusal));
            }
        }
    }
    // Fast path: all new occurrences in one command. If every one is admitted this is the
    // same outcome as committing each on its own; if any is refused, nothing was written and
    // each is appended on its own below, so only the refused ones fail.
    if appending.len() > 1 {
        let new: Vec<(StreamAppend, NewReceipt)> =
            appending.iter().map(|(_, (stream, receipt))| (stream.clone(), receipt.clone())).collect();
        if let Ok(Appended { last_position }) = state.event_log.append(acceptance(context, new)).await {
            for (candidate, (_, receipt)) in appending {
                outcomes
                    .insert(candidate.index, Outcome::Accepted { receipt: receipt.receipt, position: last_position });
            }
            return Ok(Vec::new());
        }
    }
    let appends = appending.into_iter().map(|(candidate, new)| {
        let receipt = new.1.receipt.clone();
        let request = acceptance(context, vec![new]);
        async move { (candidate, receipt, state.event_log.append(request).await) }
    });
    let results = futures_util::future::join_all(appends).await;
    let mut refused = Vec::new();
    for (candidate, receipt, result) in results {
        match result {
            Ok(Appended { last_position }) => {
                outcomes.insert(candidate.index, Outcome::Accepted { receipt, position: last_position });
            }
            Err(AppendError::Conflict { code: EVENT_ID_TAKEN, .. }) => again.push(candidate),
            Err(AppendError::Conflict { code: ADMISSION_REFUSED, .. }) => refused.push(candidate),
            Err(AppendError::Conflict { code: SUBJECT_DELETING, .. }) => {
                outcomes.insert(candidate.index, Outcome::Refused(EventRefusal::SubjectDeleting));
            }
            Err(error) => {
                outcomes.insert(candidate.index, Outcome::Failed(error.into()));
            }
        }
    }
    if optimistic && !refused.is_empty() {
        let (receipts, _) = lookups(state, &context.fire, &refused).await?;
        refused.retain(|candidate| match receipts.get(&candidate.input.event_id) {
            Some(receipt) => {
                outcomes.insert(candidate.index, against_receipt(candidate, receipt).into());
                false
            }
            None => true,
        });
    }
    if !refused.is_empty() {
        let client = state.pool.get().await?;
        let scopes = admission_state(&client, &context.fire.scopes).await?;
        for candidate in refused {
            match first_refusal(&scopes, &[!candidate.input.pending_keys.is_empty()]) {
                Some((_, refusal)) => {
                    outcomes.insert(candidate.index, Outcome::Refused(EventRefusal::NotAdmitted(refusal)));
                }
                // Capacity came back since: decide it again.
                None => again.push(candidate),
            }
        }
    }
    Ok(again)
}

impl Command for FireEvent {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Fire, ApiError> {
        let space_id = &self.space_id;
        let context = write_contexts::current(ctx, Kind::Event, space_id, &self.schema_ref).await?;
        let mut context = admitted(ctx.state, space_id, context, None).await?;
        // A generated eventId is drawn when the fire is decided.
        let parsed = parse_fire(context.event_schema(), self.input.clone(), platform::time::now_millis(), String::new)?;
        // A kept context's credits are stale: an event that needs preparation reads them now.
        if ctx.kept() && !parsed.pending_keys.is_empty() {
            let catalog = ctx.catalog().await?;
            context.credits = reads::catalog::credits(&ctx.db().await?, &catalog, space_id).await?;
        }
        let candidate = candidate(0, parsed)?;
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

/// `onError` of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnError {
    Continue,
    Abort,
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
    let context = context(&req, &state, &path).await?;
    let (events, on_error) = parse_batch(api::http::read_json(&req, payload).await?)?;
    match on_error {
        OnError::Continue => batch_continue(&state, &context, events).await,
        OnError::Abort => batch_abort(&state, &context, events).await,
    }
}

async fn batch_continue(state: &State, context: &Context, events: Vec<Value>) -> Result<HttpResponse, ApiError> {
    let count = events.len();
    let now_ms = platform::time::now_millis();
    let mut outcomes = HashMap::new();
    let mut candidates = Vec::new();
    for (index, event) in events.into_iter().enumerate() {
        match parse_candidate(&context.fire, index, event, now_ms) {
            Ok(candidate) => candidates.push(candidate),
            Err(outcome) => {
                outcomes.insert(index, outcome);
            }
        }
    }
    outcomes.extend(accept_each(state, context, candidates).await?);
    let mut results = Vec::with_capacity(count);
    let (mut accepted, mut failed, mut position) = (0, 0, 0);
    for index in 0..count {
        match outcomes.remove(&index) {
            Some(Outcome::Accepted { receipt, position: at }) => {
                accepted += 1;
                position = position.max(at);
                results.push(accepted_item(index, &receipt));
            }
            Some(Outcome::Refused(refusal)) => {
                failed += 1;
                results.push(refused_item(index, refusal));
            }
            Some(Outcome::Failed(error)) => {
                failed += 1;
                results.push(failed_item(index, &error, None));
            }
            None => {
                failed += 1;
                let error = ApiError::internal(&anyhow::anyhow!("batch item {index} produced no outcome"));
                results.push(failed_item(index, &error, None));
            }
        }
    }
    let body = json!({ "data": { "results": results, "summary": { "accepted": accepted, "failed": failed } } });
    Ok(batch_response(StatusCode::OK, position, &body))
}

fn batch_response(status: StatusCode, position: i64, body: &Value) -> HttpResponse {
    let mut response = HttpResponse::build(status);
    if position > 0 {
        response.insert_header(("Consistency-Token", position.to_string()));
    }
    response.json(body)
}

/// What an item of an aborting batch is, before the append.
enum Planned {
    /// A duplicate of a receipt that already existed: stays accepted whatever happens.
    Existing(Value),
    /// A new occurrence (the receipt it will have).
    New(Value),
    /// A repeat, inside this batch, of the new occurrence at that index.
    RepeatOf(usize),
}

async fn batch_abort(state: &State, context: &Context, events: Vec<Value>) -> Result<HttpResponse, ApiError> {
    let now_ms = platform::time::now_millis();
    // Validation stops at the first invalid item: later ones are not attempted.
    let mut candidates = Vec::new();
    let mut invalid = None;
    for (index, event) in events.into_iter().enumerate() {
        match parse_candidate(&context.fire, index, event, now_ms) {
            Ok(candidate) => candidates.push(candidate),
            Err(outcome) => {
                invalid = Some((index, outcome));
                break;
            }
        }
    }
    for _ in 0..ATTEMPTS {
        let refs: Vec<&Candidate> = candidates.iter().collect();
        let (receipts, subjects) = lookups(state, &context.fire, &refs).await?;
        let mut planned: Vec<Planned> = Vec::new();
        let mut new = Vec::new();
        let mut new_indexes = Vec::new();
        let mut firsts: HashMap<&str, usize> = HashMap::new();
        let mut failure = None;
        for candidate in &candidates {
            let event_id = candidate.input.event_id.as_str();
            let receipt = receipts.get(event_id);
            if receipt.is_none()
                && let Some(&first) = firsts.get(event_id)
            {
                if candidates[first].digest == candidate.digest {
                    planned.push(Planned::RepeatOf(first));
                    continue;
                }
                failure = Some((candidate.index, Outcome::Refused(EventRefusal::IdConflict(event_id.to_owned()))));
                break;
            }
            let known = Known { receipt, subjects: &subjects, admission: None };
            match decide_fire(&context.fire, candidate, known, now_ms, &mut Drawn) {
                Ok(Fired::Duplicate(receipt)) => planned.push(Planned::Existing(receipt)),
                Ok(Fired::New(stream, receipt)) => {
                    firsts.insert(event_id, candidate.index);
                    planned.push(Planned::New(receipt.receipt.clone()));
                    new_indexes.push((candidate.index, !candidate.input.pending_keys.is_empty()));
                    new.push((stream, receipt));
                }
                Err(refusal) => {
                    failure = Some((candidate.index, Outcome::Refused(refusal)));
                    break;
                }
            }
        }
        let failure = match failure.or_else(|| invalid.take()) {
            Some(failure) => Some(failure),
            None if new.is_empty() => None,
            None => match state.event_log.append(acceptance(context, new)).await {
                Ok(appended) => return Ok(abort_success(&planned, appended.last_position)),
                Err(AppendError::Conflict { code: EVENT_ID_TAKEN, .. }) => continue,
                Err(AppendError::Conflict { code: ADMISSION_REFUSED, .. }) => {
                    let client = state.pool.get().await?;
                    let scopes = admission_state(&client, &context.fire.scopes).await?;
                    let needs: Vec<bool> = new_indexes.iter().map(|(_, needs)| *needs).collect();
                    match first_refusal(&scopes, &needs) {
                        Some((ordinal, refusal)) => {
                            Some((new_indexes[ordinal].0, Outcome::Refused(EventRefusal::NotAdmitted(refusal))))
                        }
                        None => continue,
                    }
                }
                Err(AppendError::Conflict { code: SUBJECT_DELETING, .. }) => {
                    let index = first_deleting(state, &candidates).await?.unwrap_or(0);
                    Some((index, Outcome::Refused(EventRefusal::BatchSubjectDeleting)))
                }
                Err(error) => return Err(error.into()),
            },
        };
        return Ok(match failure {
            Some((failed_index, outcome)) => abort_failure(&planned, failed_index, outcome),
            None => abort_success(&planned, 0),
        });
    }
    Err(EventRefusal::BatchConcurrent.into())
}

/// The index of the first candidate whose subject's deletion has started.
async fn first_deleting(state: &State, candidates: &[Candidate]) -> Result<Option<usize>, ApiError> {
    let subject_ids: Vec<String> = candidates.iter().filter_map(|c| c.input.subject().map(str::to_owned)).collect();
    let client = state.pool.get().await?;
    let subjects = load_subjects(&client, &subject_ids).await.map_err(ApiError::from)?;
    Ok(candidates
        .iter()
        .find(|c| c.input.subject().is_some_and(|id| !matches!(subjects.get(id), Some(Loaded::Live { .. }))))
        .map(|c| c.index))
}

fn planned_receipt(planned: &[Planned], index: usize) -> Option<&Value> {
    match planned.get(index)? {
        Planned::Existing(receipt) | Planned::New(receipt) => Some(receipt),
        Planned::RepeatOf(first) => planned_receipt(planned, *first),
    }
}

fn abort_success(planned: &[Planned], position: i64) -> HttpResponse {
    let results: Vec<Value> = (0..planned.len())
        .map(|index| {
            let mut receipt = planned_receipt(planned, index).cloned().unwrap_or(Value::Null);
            if matches!(planned[index], Planned::RepeatOf(_)) {
                receipt["isDuplicate"] = Value::Bool(true);
            }
            accepted_item(index, &receipt)
        })
        .collect();
    let body = json!({ "data": { "results": results, "summary": { "accepted": planned.len(), "failed": 0 } } });
    batch_response(StatusCode::OK, position, &body)
}

/// 422 as a data result: earlier new acceptances are `rolled_back`, duplicates of receipts
/// that existed before stay `accepted`, the failing item is `failed`, later items are not
/// attempted (and not listed).
fn abort_failure(planned: &[Planned], failed_index: usize, outcome: Outcome) -> HttpResponse {
    let mut results = Vec::with_capacity(failed_index + 1);
    let mut accepted = 0;
    for (index, plan) in planned.iter().enumerate().take(failed_index) {
        match plan {
            Planned::Existing(receipt) => {
                accepted += 1;
                results.push(accepted_item(index, receipt));
            }
            Planned::New(receipt) => {
                results.push(json!({ "index": index, "status": "rolled_back", "eventId": receipt["eventId"] }))
            }
            Planned::RepeatOf(first) => {
                let event_id = planned_receipt(planned, *first).map(|r| r["eventId"].clone()).unwrap_or(Value::Null);
                results.push(json!({ "index": index, "status": "rolled_back", "eventId": event_id }));
            }
        }
    }
    let failed = match outcome {
        Outcome::Refused(refusal) => refused_item(failed_index, refusal),
        Outcome::Failed(error) => failed_item(failed_index, &error, None),
        Outcome::Accepted { .. } => json!({ "index": failed_index, "status": "failed" }),
    };
    results.push(failed);
    let body = json!({
        "data": {
            "results": results,
            "summary": { "accepted": accepted, "failed": 1 },
            "failedIndex": failed_index,
        }
    });
    batch_response(StatusCode::UNPROCESSABLE_ENTITY, 0, &body)
}
