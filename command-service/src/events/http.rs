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
//! Long because it still holds, beside the handlers, the decisions of a fire and of a batch
//! (each item's check against its receipt, the abort plan of `onError: abort`); they belong
//! in `decide.rs`, as pure functions the handlers call, and move there with the other
//! commands' decisions.

use platform::error::Code;
use std::cell::Cell;
use std::collections::HashMap;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::{Caller, Permission};
use domain::catalog::{self, AttributeEntry, SchemaEntry};
use domain::records::Loaded;
use platform::crypto::DataKey;
use platform::error::ApiError;
use platform::events::LogEvent;
use platform::ids::new_id;
use platform::log::{AppendError, AppendRequest, Appended, ExpectedVersion, Guard, NewEvent, StreamAppend};
use platform::proto;
use platform::settings::ScopeLimits;
use serde_json::{Map, Value, json};

use crate::State;
use crate::events::decide::{
    AdmissionRefusal, Earlier, EventRefusal, EventSchema, FireInput, compare_with_receipt, first_refusal, parse_fire,
};
use crate::events::store::{
    ADMISSION_REFUSED, EVENT_ID_TAKEN, NewReceipt, Receipt, SUBJECT_DELETING, admission_guard, admission_state,
    ensure_scopes, find_receipts, load_subjects, receipts_guard, subjects_guard,
};
use crate::pipeline::{self, ATTEMPTS, Actor, Answer, Ctx, Decided, Decision, Given, Legacy, Protection, Refusal};
use crate::write_contexts::{self, Kind};

/// The most events in one batch.
pub(crate) const MAX_BATCH: usize = 500;

/// What every fire needs, loaded once per request.
#[derive(Clone)]
struct Context {
    caller: Caller,
    schema: SchemaEntry,
    attributes: Vec<AttributeEntry>,
    credits: i64,
    scopes: Vec<(String, ScopeLimits)>,
    /// The catalog revision a context from the process cache was read at: the fire appends
    /// only if the catalog is still there (`catalog::revision_guard`).
    revision: Option<i64>,
}

/// A batch's context, read at the edge; its appends carry the catalog revision guard.
async fn context(req: &HttpRequest, state: &State, schema_ref: &str) -> Result<Context, ApiError> {
    let caller = pipeline::authorize(req, state, Permission::Write).await?;
    let context = write_contexts::at_edge(state, Kind::Event, caller.space_id(), schema_ref).await?;
    let revision = context.revision;
    admitted(state, caller, context, Some(revision)).await
}

/// A fire's context from a catalog context: its admission scopes, created when new.
/// `revision` is the catalog revision the fire must append at (a cached context), if any.
async fn admitted(
    state: &State,
    caller: Caller,
    context: std::sync::Arc<catalog::WriteContext>,
    revision: Option<i64>,
) -> Result<Context, ApiError> {
    let catalog::WriteContext { schema, attributes, credits, .. } = std::sync::Arc::unwrap_or_clone(context);
    let scopes = domain::admission::scopes(&state.settings.events.admission, caller.space_id(), &schema.schema_id);
    if state.new_admission_scopes(&scopes) {
        let client = state.pool.get().await?;
        ensure_scopes(&client, &scopes).await?;
    }
    Ok(Context { caller, schema, attributes, credits, scopes, revision })
}

fn parse_item(context: &Context, input: Map<String, Value>, now_ms: i64) -> Result<FireInput, ApiError> {
    let schema = EventSchema { attributes: &context.attributes };
    Ok(parse_fire(schema, input, now_ms, || uuid::Uuid::new_v4().to_string())?)
}

/// A valid item, ready to be decided.
struct Candidate {
    index: usize,
    input: FireInput,
    digest: String,
}

/// A batch item parsed into a candidate.
fn parse_candidate(context: &Context, index: usize, item: Value, now_ms: i64) -> Result<Candidate, ApiError> {
    let input = match item {
        Value::Object(input) => input,
        _ => return Err(ApiError::bad_request(Code::InvalidEventInput, "each event must be a JSON object")),
    };
    candidate(index, parse_item(context, input, now_ms)?)
}

fn candidate(index: usize, input: FireInput) -> Result<Candidate, ApiError> {
    let canonical = crate::canonical::canonical_json(&input.normalized());
    let digest =
        platform::crypto::keyed_digest("event-input", &canonical).map_err(|error| ApiError::internal(&error))?;
    Ok(Candidate { index, input, digest })
}

/// What became of one item.
enum Outcome {
    /// Accepted now or earlier (`receipt` carries `isDuplicate`).
    Accepted {
        receipt: Value,
        position: i64,
    },
    Failed {
        error: ApiError,
        retry_after_ms: Option<u64>,
    },
}

impl Outcome {
    fn failed(error: ApiError) -> Self {
        Self::Failed { error, retry_after_ms: None }
    }

    fn refused(refusal: AdmissionRefusal) -> Self {
        Self::Failed { error: ApiError::from(refusal), retry_after_ms: Some(refusal.retry_after_ms()) }
    }
}

fn duplicate(receipt: &Receipt) -> Value {
    let mut body = receipt.receipt.clone();
    body["isDuplicate"] = Value::Bool(true);
    body
}

/// How an item stands against the receipt held under its eventId, if any.
fn against_receipt(candidate: &Candidate, receipt: &Receipt) -> Outcome {
    match compare_with_receipt(receipt.input_digest.as_deref(), receipt.subject_erased, &candidate.digest) {
        Earlier::Duplicate => Outcome::Accepted { receipt: duplicate(receipt), position: 0 },
        Earlier::Conflict => Outcome::failed(EventRefusal::IdConflict(candidate.input.event_id.clone()).into()),
        Earlier::Erased => Outcome::failed(EventRefusal::Erased(candidate.input.event_id.clone()).into()),
    }
}

/// The subject's data key (`None`: no subject, or a record written before encryption), or
/// why the item cannot name it.
fn check_subject(
    input: &FireInput,
    space_id: &str,
    subjects: &HashMap<String, Loaded>,
) -> Result<Option<DataKey>, ApiError> {
    let (id, kind) = match (&input.contact_id, &input.object_id) {
        (Some(id), _) => (id, "contact"),
        (None, Some(id)) => (id, "object"),
        (None, None) => return Ok(None),
    };
    match subjects.get(id) {
        Some(Loaded::Live { state, key }) if state.space_id == space_id && state.schema_type == kind => Ok(key.clone()),
        Some(Loaded::Deleting { .. }) => Err(ApiError::conflict(
            Code::RecordDeletionPending,
            format!("{kind} {id:?} is being deleted; it accepts no more events"),
        )),
        _ => Err(ApiError::not_found(Code::RecordNotFound, format!("no {kind} {id:?} in this space"))),
    }
}

/// The log event and receipt of a new occurrence whose subject (if any) is in `subjects`.
fn new_occurrence(
    context: &Context,
    candidate: &Candidate,
    subjects: &HashMap<String, Loaded>,
    now_ms: i64,
) -> Result<(StreamAppend, NewReceipt), ApiError> {
    let key = check_subject(&candidate.input, context.caller.space_id(), subjects)?;
    accepted(context, &candidate.input, &candidate.digest, key.as_ref(), now_ms)
}

/// The log event and receipt of a new occurrence; 402 when it needs preparation and the
/// space has no credits (a duplicate recovers its receipt whatever the credits).
fn accepted(
    context: &Context,
    input: &FireInput,
    digest: &str,
    key: Option<&DataKey>,
    now_ms: i64,
) -> Result<(StreamAppend, NewReceipt), ApiError> {
    if !input.pending_keys.is_empty() && context.credits <= 0 {
        return Err(ApiError::insufficient_credits());
    }
    let id = new_id("ev");
    let values = Value::Object(input.values.clone()).to_string();
    let subject = input.subject().map(str::to_owned);
    let mut data = platform::events::seal(subject.as_deref().unwrap_or(&id), &proto::EventData { values_json: values });
    if let Some(key) = key {
        platform::events::encrypt(&mut data, key).map_err(|error| ApiError::internal(&error))?;
    }
    let occurred_at_ms = input.occurred_at_ms.unwrap_or(now_ms);
    let event = proto::EventAccepted {
        id: id.clone(),
        space_id: context.caller.space_id().to_owned(),
        schema_id: context.schema.schema_id.clone(),
        event_id: input.event_id.clone(),
        occurred_at_ms,
        received_at_ms: now_ms,
        contact_id: input.contact_id.clone().unwrap_or_default(),
        object_id: input.object_id.clone().unwrap_or_default(),
        definition_revision: context.schema.revision,
        readiness: input.readiness().to_owned(),
        data: Some(data),
        pending_keys: input.pending_keys.clone(),
    };
    let receipt = json!({
        "accepted": 1,
        "id": id,
        "eventId": input.event_id,
        "isDuplicate": false,
        "readinessAtAcceptance": input.readiness(),
    });
    let stream = StreamAppend {
        stream_id: domain::business_events::stream_id(&id),
        expected: ExpectedVersion::NoStream,
        events: vec![NewEvent {
            event: LogEvent::EventAccepted(event),
            subject_id: subject.clone(),
            occurred_at: platform::time::from_millis(occurred_at_ms),
        }],
    };
    let new_receipt = NewReceipt {
        event_id: input.event_id.clone(),
        id,
        input_digest: digest.to_owned(),
        subject_id: subject,
        receipt,
        pending: !input.pending_keys.is_empty(),
    };
    Ok((stream, new_receipt))
}

/// The append of some new occurrences, all or nothing.
fn acceptance(req: &HttpRequest, context: &Context, new: Vec<(StreamAppend, NewReceipt)>) -> AppendRequest {
    let (streams, guards) = acceptance_parts(context, new);
    AppendRequest::new(crate::edge::metadata(req, &context.caller, None), streams, guards)
}

/// The streams and guards of some new occurrences.
fn acceptance_parts(context: &Context, new: Vec<(StreamAppend, NewReceipt)>) -> (Vec<StreamAppend>, Vec<Guard>) {
    let (streams, receipts): (Vec<StreamAppend>, Vec<NewReceipt>) = new.into_iter().unzip();
    let count = receipts.len() as i64;
    let pending = receipts.iter().filter(|receipt| receipt.pending).count() as i64;
    let subjects: Vec<String> = receipts.iter().filter_map(|receipt| receipt.subject_id.clone()).collect();
    let mut guards: Vec<Guard> = vec![receipts_guard(context.caller.space_id(), &context.schema.schema_id, &receipts)];
    if !subjects.is_empty() {
        guards.push(subjects_guard(subjects));
    }
    guards.push(admission_guard(&context.scopes, count, pending));
    guards.extend(context.revision.map(catalog::revision_guard));
    (streams, guards)
}

/// Receipts and subjects of `candidates`, in two statements.
async fn lookups(
    state: &State,
    context: &Context,
    candidates: &[&Candidate],
) -> Result<(HashMap<String, Receipt>, HashMap<String, Loaded>), ApiError> {
    let client = state.pool.get().await?;
    let event_ids: Vec<String> = candidates.iter().map(|c| c.input.event_id.clone()).collect();
    let subject_ids: Vec<String> = candidates.iter().filter_map(|c| c.input.subject().map(str::to_owned)).collect();
    let (receipts, subjects) = tokio::join!(
        find_receipts(&client, context.caller.space_id(), &context.schema.schema_id, &event_ids),
        load_subjects(&client, &subject_ids)
    );
    Ok((receipts?, subjects.map_err(|error| ApiError::internal(&error))?))
}

/// Accepts candidates each on its own (a single fire, or a batch with `onError: continue`).
/// Candidates sharing an eventId are decided one after another, so a repeat inside a batch
/// is a duplicate of (or a conflict with) the first.
async fn accept_each(
    req: &HttpRequest,
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
            todo = accept_round(req, state, context, todo, optimistic && attempt == 0, &mut outcomes).await?;
        }
        for candidate in todo {
            outcomes.insert(
                candidate.index,
                Outcome::failed(ApiError::conflict(
                    Code::ConcurrentModification,
                    "this eventId was being fired concurrently; retry",
                )),
            );
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
    req: &HttpRequest,
    state: &State,
    context: &Context,
    todo: Vec<&'a Candidate>,
    optimistic: bool,
    outcomes: &mut HashMap<usize, Outcome>,
) -> Result<Vec<&'a Candidate>, ApiError> {
    let (receipts, subjects) =
        if optimistic { (HashMap::new(), HashMap::new()) } else { lookups(state, context, &todo).await? };
    let now_ms = platform::time::now_millis();
    let mut appending = Vec::new();
    let mut again = Vec::new();
    for candidate in todo {
        if let Some(receipt) = receipts.get(&candidate.input.event_id) {
            outcomes.insert(candidate.index, against_receipt(candidate, receipt));
            continue;
        }
        match new_occurrence(context, candidate, &subjects, now_ms) {
            Ok(new) => appending.push((candidate, new)),
            // Without its receipt looked up, a refusal may be a duplicate's: decide again.
            Err(_) if optimistic => again.push(candidate),
            Err(error) => {
                outcomes.insert(candidate.index, Outcome::failed(error));
            }
        }
    }
    // Fast path: all new occurrences in one command. If every one is admitted this is the
    // same outcome as committing each on its own; if any is refused, nothing was written and
    // each is appended on its own below, so only the refused ones fail.
    if appending.len() > 1 {
        let new: Vec<(StreamAppend, NewReceipt)> =
            appending.iter().map(|(_, (stream, receipt))| (stream.clone(), receipt.clone())).collect();
        if let Ok(Appended { last_position }) = state.event_log.append(acceptance(req, context, new)).await {
            for (candidate, (_, receipt)) in appending {
                outcomes
                    .insert(candidate.index, Outcome::Accepted { receipt: receipt.receipt, position: last_position });
            }
            return Ok(Vec::new());
        }
    }
    let appends = appending.into_iter().map(|(candidate, new)| {
        let receipt = new.1.receipt.clone();
        let request = acceptance(req, context, vec![new]);
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
                let error = ApiError::conflict(
                    Code::RecordDeletionPending,
                    "the event's subject is being deleted; it accepts no more events",
                );
                outcomes.insert(candidate.index, Outcome::failed(error));
            }
            Err(error) => {
                outcomes.insert(candidate.index, Outcome::failed(crate::edge::append_error(error)));
            }
        }
    }
    if optimistic && !refused.is_empty() {
        let (receipts, _) = lookups(state, context, &refused).await?;
        refused.retain(|candidate| match receipts.get(&candidate.input.event_id) {
            Some(receipt) => {
                outcomes.insert(candidate.index, against_receipt(candidate, receipt));
                false
            }
            None => true,
        });
    }
    if !refused.is_empty() {
        let client = state.pool.get().await?;
        let scopes = admission_state(&client, &context.scopes).await?;
        for candidate in refused {
            match first_refusal(&scopes, &[!candidate.input.pending_keys.is_empty()]) {
                Some((_, refusal)) => {
                    outcomes.insert(candidate.index, Outcome::refused(refusal));
                }
                // Capacity came back since: decide it again.
                None => again.push(candidate),
            }
        }
    }
    Ok(again)
}

/// A single fire. The first attempt at an occurrence about no record appends before anything
/// is looked up: its receipt's unique key and its admission guard refuse exactly what the
/// lookup would have found (a taken eventId) or admission would refuse, and whatever is
/// refused is decided again from the lookup. One round trip and one transaction less per fire.
struct FireEvent<'a> {
    caller: &'a Caller,
    schema_ref: String,
    input: Map<String, Value>,
    /// An append was refused admission: the next attempt looks the receipt up (a duplicate
    /// costs nothing, even with an empty bucket) and reads the admission state.
    admission_refused: Cell<bool>,
}

/// What a fire decides on.
struct Fire {
    context: Context,
    candidate: Candidate,
    /// `None`: not looked up (the optimistic first attempt).
    lookups: Option<(HashMap<String, Receipt>, HashMap<String, Loaded>)>,
    admission: Option<Vec<crate::events::decide::ScopeState>>,
}

impl Legacy for FireEvent<'_> {
    type Loaded = Fire;

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Fire, ApiError> {
        let space_id = self.caller.space_id();
        let context = write_contexts::current(ctx, Kind::Event, space_id, &self.schema_ref).await?;
        let mut context = admitted(ctx.state, self.caller.clone(), context, None).await?;
        let parsed = parse_item(&context, self.input.clone(), platform::time::now_millis())?;
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

    fn decide(&self, fire: Fire, given: &Given<'_>) -> Result<Decided, ApiError> {
        let Fire { context, candidate, lookups, admission } = fire;
        let (receipts, subjects) =
            lookups.as_ref().map_or((None, None), |(receipts, subjects)| (Some(receipts), Some(subjects)));
        if let Some(receipt) = receipts.and_then(|receipts| receipts.get(&candidate.input.event_id)) {
            return match against_receipt(&candidate, receipt) {
                Outcome::Accepted { receipt, .. } => {
                    Ok(Decided::Answer(Answer::json(StatusCode::ACCEPTED, json!({ "data": receipt }))))
                }
                Outcome::Failed { error, .. } => Err(error),
            };
        }
        if let Some(scopes) = &admission
            && let Some((_, refusal)) = first_refusal(scopes, &[!candidate.input.pending_keys.is_empty()])
        {
            return Err(refusal.into());
        }
        let no_subjects = HashMap::new();
        match new_occurrence(&context, &candidate, subjects.unwrap_or(&no_subjects), given.now_ms) {
            Ok((stream, receipt)) => {
                let body = json!({ "data": receipt.receipt });
                let (streams, guards) = acceptance_parts(&context, vec![(stream, receipt)]);
                Ok(Decided::Append(Decision::new(streams, guards, Answer::json(StatusCode::ACCEPTED, body))))
            }
            // Without its receipt looked up, a refusal may be a duplicate's: decide again.
            Err(_) if lookups.is_none() => Ok(Decided::Again),
            Err(error) => Err(error),
        }
    }

    fn refused(&self, error: AppendError) -> Refusal {
        match error {
            AppendError::Conflict { code: EVENT_ID_TAKEN, .. } => Refusal::Again,
            AppendError::Conflict { code: ADMISSION_REFUSED, .. } => {
                self.admission_refused.set(true);
                Refusal::Again
            }
            AppendError::Conflict { code: SUBJECT_DELETING, .. } => Refusal::Fail(ApiError::conflict(
                Code::RecordDeletionPending,
                "the event's subject is being deleted; it accepts no more events",
            )),
            error => Refusal::default_for(error),
        }
    }

    fn attempts(&self) -> usize {
        // The optimistic first attempt, then the contract's.
        ATTEMPTS + 1
    }

    fn lost_too_often(&self) -> ApiError {
        ApiError::conflict(Code::ConcurrentModification, "this eventId was being fired concurrently; retry")
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
    let command = FireEvent { caller: &caller, schema_ref, input, admission_refused: Cell::new(false) };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Unkeyed, command).await
}

/// `onError` of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnError {
    Continue,
    Abort,
}

fn parse_batch(body: Value) -> Result<(Vec<Value>, OnError), ApiError> {
    let Value::Object(mut body) = body else {
        return Err(ApiError::bad_request(Code::InvalidBody, "the request body must be a JSON object"));
    };
    let on_error = match body.remove("onError") {
        None | Some(Value::Null) => OnError::Continue,
        Some(Value::String(mode)) if mode == "continue" => OnError::Continue,
        Some(Value::String(mode)) if mode == "abort" => OnError::Abort,
        Some(_) => return Err(ApiError::bad_request(Code::InvalidBatch, "onError must be \"continue\" or \"abort\"")),
    };
    let events = match body.remove("events") {
        Some(Value::Array(events)) => events,
        Some(_) => return Err(ApiError::bad_request(Code::InvalidBatch, "events must be an array of event inputs")),
        None => {
            return Err(ApiError::bad_request(Code::InvalidBatch, "events is required: an array of 1 to 500 inputs"));
        }
    };
    if let Some(key) = body.keys().next() {
        return Err(ApiError::bad_request(
            Code::InvalidBatch,
            format!("unknown field {key:?}; a batch has events and onError"),
        ));
    }
    if events.is_empty() || events.len() > MAX_BATCH {
        return Err(ApiError::bad_request(
            Code::InvalidBatchSize,
            format!("a batch has 1 to {MAX_BATCH} events; got {}", events.len()),
        ));
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
        OnError::Continue => batch_continue(&req, &state, &context, events).await,
        OnError::Abort => batch_abort(&req, &state, &context, events).await,
    }
}

async fn batch_continue(
    req: &HttpRequest,
    state: &State,
    context: &Context,
    events: Vec<Value>,
) -> Result<HttpResponse, ApiError> {
    let count = events.len();
    let now_ms = platform::time::now_millis();
    let mut outcomes = HashMap::new();
    let mut candidates = Vec::new();
    for (index, event) in events.into_iter().enumerate() {
        match parse_candidate(context, index, event, now_ms) {
            Ok(candidate) => candidates.push(candidate),
            Err(error) => {
                outcomes.insert(index, Outcome::failed(error));
            }
        }
    }
    outcomes.extend(accept_each(req, state, context, candidates).await?);
    let mut results = Vec::with_capacity(count);
    let (mut accepted, mut failed, mut position) = (0, 0, 0);
    for index in 0..count {
        match outcomes.remove(&index) {
            Some(Outcome::Accepted { receipt, position: at }) => {
                accepted += 1;
                position = position.max(at);
                results.push(accepted_item(index, &receipt));
            }
            Some(Outcome::Failed { error, retry_after_ms }) => {
                failed += 1;
                results.push(failed_item(index, &error, retry_after_ms));
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

async fn batch_abort(
    req: &HttpRequest,
    state: &State,
    context: &Context,
    events: Vec<Value>,
) -> Result<HttpResponse, ApiError> {
    let now_ms = platform::time::now_millis();
    // Validation stops at the first invalid item: later ones are not attempted.
    let mut candidates = Vec::new();
    let mut invalid = None;
    for (index, event) in events.into_iter().enumerate() {
        match parse_candidate(context, index, event, now_ms) {
            Ok(candidate) => candidates.push(candidate),
            Err(error) => {
                invalid = Some((index, Outcome::failed(error)));
                break;
            }
        }
    }
    for _ in 0..ATTEMPTS {
        let refs: Vec<&Candidate> = candidates.iter().collect();
        let (receipts, subjects) = lookups(state, context, &refs).await?;
        let mut planned: Vec<Planned> = Vec::new();
        let mut new = Vec::new();
        let mut new_indexes = Vec::new();
        let mut firsts: HashMap<&str, usize> = HashMap::new();
        let mut failure = None;
        for candidate in &candidates {
            let event_id = candidate.input.event_id.as_str();
            if let Some(receipt) = receipts.get(event_id) {
                match against_receipt(candidate, receipt) {
                    Outcome::Accepted { receipt, .. } => planned.push(Planned::Existing(receipt)),
                    failed => {
                        failure = Some((candidate.index, failed));
                        break;
                    }
                }
                continue;
            }
            if let Some(&first) = firsts.get(event_id) {
                if candidates[first].digest == candidate.digest {
                    planned.push(Planned::RepeatOf(first));
                    continue;
                }
                failure =
                    Some((candidate.index, Outcome::failed(EventRefusal::IdConflict(event_id.to_owned()).into())));
                break;
            }
            match new_occurrence(context, candidate, &subjects, now_ms) {
                Ok(item) => {
                    firsts.insert(event_id, candidate.index);
                    planned.push(Planned::New(item.1.receipt.clone()));
                    new_indexes.push((candidate.index, !candidate.input.pending_keys.is_empty()));
                    new.push(item);
                }
                Err(error) => {
                    failure = Some((candidate.index, Outcome::failed(error)));
                    break;
                }
            }
        }
        let failure = match failure.or_else(|| invalid.take()) {
            Some(failure) => Some(failure),
            None if new.is_empty() => None,
            None => match state.event_log.append(acceptance(req, context, new)).await {
                Ok(appended) => return Ok(abort_success(&planned, appended.last_position)),
                Err(AppendError::Conflict { code: EVENT_ID_TAKEN, .. }) => continue,
                Err(AppendError::Conflict { code: ADMISSION_REFUSED, .. }) => {
                    let client = state.pool.get().await?;
                    let scopes = admission_state(&client, &context.scopes).await?;
                    let needs: Vec<bool> = new_indexes.iter().map(|(_, needs)| *needs).collect();
                    match first_refusal(&scopes, &needs) {
                        Some((ordinal, refusal)) => Some((new_indexes[ordinal].0, Outcome::refused(refusal))),
                        None => continue,
                    }
                }
                Err(AppendError::Conflict { code: SUBJECT_DELETING, .. }) => {
                    let error = ApiError::conflict(
                        Code::RecordDeletionPending,
                        "a subject of this batch is being deleted; it accepts no more events",
                    );
                    let index = first_deleting(state, &candidates).await?.unwrap_or(0);
                    Some((index, Outcome::failed(error)))
                }
                Err(error) => return Err(crate::edge::append_error(error)),
            },
        };
        return Ok(match failure {
            Some((failed_index, outcome)) => abort_failure(&planned, failed_index, outcome),
            None => abort_success(&planned, 0),
        });
    }
    Err(ApiError::conflict(Code::ConcurrentModification, "eventIds of this batch were being fired concurrently; retry"))
}

/// The index of the first candidate whose subject's deletion has started.
async fn first_deleting(state: &State, candidates: &[Candidate]) -> Result<Option<usize>, ApiError> {
    let subject_ids: Vec<String> = candidates.iter().filter_map(|c| c.input.subject().map(str::to_owned)).collect();
    let client = state.pool.get().await?;
    let subjects = load_subjects(&client, &subject_ids).await.map_err(|error| ApiError::internal(&error))?;
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
        Outcome::Failed { error, retry_after_ms } => failed_item(failed_index, &error, retry_after_ms),
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
