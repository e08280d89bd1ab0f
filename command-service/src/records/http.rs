//! Record writes: `POST /schemas/{schema}/records` (strict create), `POST
//! /schemas/{schema}/records/upsert` and `PATCH /schemas/{schema}/records/{id}`.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Map, Value};
use shared::auth::{Caller, Permission};
use shared::catalog::{self, AttributeEntry, SchemaEntry, WriteContext};
use shared::crypto::{self, DataKey};
use shared::error::ApiError;
use shared::error::Code;
use shared::events::LogEvent;
use shared::ids::new_id;
use shared::log::{AppendError, AppendRequest, Appended, ExpectedVersion, Guard, NewEvent, StreamAppend};
use shared::proto::Sealed;
use shared::records::{RecordState, record_document};

use crate::State;
use crate::edge::{append_error, respond};
use crate::idempotency::{self, Claim};
use crate::records::decide::{
    Change, CreateDecision, Input, Match, Owners, UpdateDecision, WriteSchema, check_credits, decide_create,
    decide_update, live_target, match_upsert, parse_input,
};
use crate::records::store::{Loaded, claim, deletion_guards, identity_owners, load_records, release, stream_id};
use crate::write_contexts::{self, Kind};

/// How often a write that lost a race (stream version, identity claim) is decided again.
const ATTEMPTS: usize = 3;

/// What every record write loads before deciding.
struct Prelude {
    caller: Caller,
    input: Map<String, Value>,
    schema: SchemaEntry,
    attributes: Vec<AttributeEntry>,
    credits: i64,
}

impl Prelude {
    fn write_schema(&self) -> WriteSchema<'_> {
        WriteSchema {
            schema_id: &self.schema.schema_id,
            space_id: &self.caller.space.space_id,
            schema_type: &self.schema.schema_type,
            attributes: &self.attributes,
        }
    }
}

async fn prelude(
    req: &HttpRequest,
    payload: web::Payload,
    state: &State,
    schema_ref: &str,
) -> Result<Prelude, ApiError> {
    let caller = state.authenticator.authorize(req, Permission::Write).await?;
    let input = shared::http::read_json_object(req, payload).await?;
    let (schema, attributes, credits) = write_context(state, caller.space_id(), schema_ref).await?;
    Ok(Prelude { caller, input, schema, attributes, credits })
}

/// The contact or object schema `schema_ref` (id or slug) of the space, its attributes and
/// the space's AI credits; 404 `schema_not_found` otherwise.
pub(crate) async fn write_context(
    state: &State,
    space_id: &str,
    schema_ref: &str,
) -> Result<(SchemaEntry, Vec<AttributeEntry>, i64), ApiError> {
    let context = write_contexts::fresh(state, Kind::Record, space_id, schema_ref).await?;
    Ok((context.schema, context.attributes, context.credits))
}

/// Identity values of the input, to look up their holders.
fn identity_values(input: &Input) -> Vec<(&'static str, String)> {
    input.identities.iter().filter_map(|(key, value)| value.clone().map(|value| (*key, value))).collect()
}

/// The completion guard of a claimed operation whose answer will be `status` and `body`.
fn completion(claim: Option<&Claim>, status: StatusCode, body: &Value) -> Option<Guard> {
    claim.map(|claim| claim.completion(status, body))
}

/// A record write ready to append: its stream and guards.
pub(crate) struct Write {
    pub stream: StreamAppend,
    pub guards: Vec<Guard>,
    /// The data key the record's personal data is encrypted under.
    pub key: DataKey,
}

/// The write of a new record (its personal data encrypted under a fresh key).
fn create_write(space_id: &str, schema_id: &str, decision: CreateDecision) -> Result<Write, AppendError> {
    let mut decision = decision;
    let record_id = decision.event.record_id.clone();
    let (key, key_guard) = encrypt_personal(&mut decision.event.personal, None, &record_id, space_id)?;
    let guards = decision
        .identities
        .iter()
        .map(|identity| claim(space_id, schema_id, &record_id, identity))
        .chain(key_guard)
        .collect();
    let occurred_at = shared::time::from_millis(decision.event.created_at_ms);
    let stream = StreamAppend {
        stream_id: stream_id(&record_id),
        expected: ExpectedVersion::NoStream,
        events: vec![NewEvent {
            event: LogEvent::RecordCreated(decision.event),
            subject_id: Some(record_id),
            occurred_at,
        }],
    };
    Ok(Write { stream, guards, key })
}

/// The write of an update at `version`.
fn update_write(
    space_id: &str,
    schema_id: &str,
    (version, key): (i64, Option<DataKey>),
    change: Change,
) -> Result<Write, AppendError> {
    let Change { mut event, state: new_state, claims, releases, .. } = change;
    let record_id = new_state.record_id.clone();
    let (key, key_guard) = encrypt_personal(&mut event.personal, key, &record_id, space_id)?;
    let guards = releases
        .iter()
        .map(|identity| release(space_id, schema_id, &record_id, identity))
        .chain(claims.iter().map(|identity| claim(space_id, schema_id, &record_id, identity)))
        .chain(key_guard)
        .collect();
    let occurred_at = shared::time::from_millis(event.updated_at_ms);
    let stream = StreamAppend {
        stream_id: stream_id(&record_id),
        expected: ExpectedVersion::Exactly(version),
        events: vec![NewEvent { event: LogEvent::RecordUpdated(event), subject_id: Some(record_id), occurred_at }],
    };
    Ok(Write { stream, guards, key })
}

/// Appends one record write with the operation's completion guard.
async fn append_write(
    req: &HttpRequest,
    state: &State,
    caller: &Caller,
    write: Result<Write, AppendError>,
    idempotency: (Option<&Claim>, Option<Guard>),
) -> Result<Appended, AppendError> {
    let Write { stream, mut guards, .. } = write?;
    guards.extend(idempotency.1);
    crate::edge::append(state, req, caller, idempotency.0, vec![stream], guards).await
}

/// An upsert decided: the status and record it answers with, and the write (none when
/// nothing changes).
pub(crate) struct PlannedUpsert {
    pub status: StatusCode,
    pub record: RecordState,
    pub warnings: Vec<shared::pagination::Warning>,
    pub write: Option<Result<Write, AppendError>>,
    /// The data key of an unchanged record (a write carries its own).
    pub key: Option<DataKey>,
}

/// Decides an upsert of `input` in `schema` (rule 3 of the contract's record rules) without
/// appending it, so that other writes can join its append (a template send's context).
pub(crate) async fn plan_upsert(
    state: &State,
    schema: &WriteSchema<'_>,
    input: Map<String, Value>,
    now: i64,
) -> Result<PlannedUpsert, ApiError> {
    let input = parse_input(schema, input)?;
    let client = state.pool.get().await?;
    let owners = identity_owners(&client, schema.space_id, schema.schema_id, &identity_values(&input)).await?;
    let target = match &input.id {
        Some(record_id) => Match::Existing(record_id.clone()),
        None => {
            let holders: Vec<String> = owners.values().cloned().collect();
            let states: Vec<RecordState> = load_records(&client, &holders)
                .await?
                .into_iter()
                .filter_map(|(_, _, loaded)| match loaded {
                    Loaded::Live { state, .. } => Some(state),
                    _ => None,
                })
                .collect();
            match_upsert(schema.schema_type, &input, &owners, &states)
        }
    };
    match target {
        Match::Existing(record_id) => {
            let (version, current, key) = load_in_schema(&client, schema, &record_id).await?;
            drop(client);
            let UpdateDecision::Changed(change) = decide_update(schema, &current, input, &owners, now)? else {
                return Ok(PlannedUpsert {
                    status: StatusCode::OK,
                    record: current,
                    warnings: Vec::new(),
                    write: None,
                    key,
                });
            };
            let (record, warnings) = (change.state.clone(), change.warnings.clone());
            let write = update_write(schema.space_id, schema.schema_id, (version, key), *change);
            Ok(PlannedUpsert { status: StatusCode::OK, record, warnings, write: Some(write), key: None })
        }
        Match::New => {
            drop(client);
            let record_id = new_id(if schema.schema_type == "contact" { "con" } else { "obj" });
            let decision = decide_create(schema, input, &owners, &record_id, now)?;
            let record = RecordState::from_created(&decision.event, &Default::default())
                .map_err(|error| ApiError::internal(&error))?;
            let warnings = decision.warnings.clone();
            let write = create_write(schema.space_id, schema.schema_id, decision);
            Ok(PlannedUpsert { status: StatusCode::CREATED, record, warnings, write: Some(write), key: None })
        }
    }
}

/// Encrypts a record event's personal data under the record's data key. A record without a
/// key (a new one, or one written before encryption) gets a fresh key, stored by the returned
/// guard in the same transaction as the event.
fn encrypt_personal(
    personal: &mut Option<Sealed>,
    key: Option<DataKey>,
    record_id: &str,
    space_id: &str,
) -> Result<(DataKey, Option<Guard>), AppendError> {
    let failed = AppendError::from;
    let (key, guard) = match key {
        Some(key) => (key, None),
        None => {
            let (key, wrapped) = crypto::keyring().and_then(|keyring| keyring.generate(record_id)).map_err(failed)?;
            (key, Some(crate::records::store::store_key(record_id, space_id, wrapped)))
        }
    };
    if let Some(personal) = personal.as_mut() {
        shared::events::encrypt(personal, &key).map_err(failed)?;
    }
    Ok((key, guard))
}

fn is_lost_race(error: &AppendError) -> bool {
    matches!(error, AppendError::WrongVersion { .. } | AppendError::Conflict { code: Code::IdentifierConflict, .. })
}

fn lost_too_often() -> ApiError {
    ApiError::conflict(Code::ConcurrentModification, "the record kept changing while this write was applied; retry")
}

#[tracing::instrument(skip_all, fields(schema = %path.as_str()))]
pub async fn create(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = state.authenticator.authorize(&req, Permission::Write).await?;
    let input = shared::http::read_json_object(&req, payload).await?;
    let (req, state, schema_ref, body) = (&req, &**state, path.as_str(), Value::Object(input.clone()));
    // The schema is resolved before the idempotency claim, as for every record write.
    let context = write_contexts::current(state, Kind::Record, caller.space_id(), schema_ref).await?;
    let (caller, input) = (&caller, &input);
    idempotency::protect(state, req, caller, &body, |claim, operation_id| async move {
        let (claim, operation_id) = (claim.as_ref(), operation_id.as_str());
        write_contexts::decide(state, Kind::Record, (caller.space_id(), schema_ref), context, |context, revision| {
            create_once(req, state, caller, (context, revision), input.clone(), (claim, operation_id))
        })
        .await
    })
    .await
}

/// A strict create decided on `context`, appended with the catalog revision guard when the
/// context was kept (`revision`).
async fn create_once(
    req: &HttpRequest,
    state: &State,
    caller: &Caller,
    (context, revision): (WriteContext, Option<i64>),
    input: Map<String, Value>,
    (claim, operation_id): (Option<&Claim>, &str),
) -> Result<HttpResponse, ApiError> {
    let schema = WriteSchema {
        schema_id: &context.schema.schema_id,
        space_id: caller.space_id(),
        schema_type: &context.schema.schema_type,
        attributes: &context.attributes,
    };
    check_credits(&schema, context.credits)?;
    let input = parse_input(&schema, input)?;
    // A strict create needs no lookup of identity holders: the identity guards in its
    // append are the uniqueness check, and a collision is 409 identifier_conflict.
    let record_id = new_id(if schema.schema_type == "contact" { "con" } else { "obj" });
    let decision = decide_create(&schema, input, &Owners::new(), &record_id, shared::time::now_millis())?;
    let document = record_document(&decision.event, &Default::default()).map_err(|error| ApiError::internal(&error))?;
    let body = shared::http::data_body(document, &[]);
    let guard = completion(claim, StatusCode::CREATED, &body);
    let write = create_write(schema.space_id, schema.schema_id, decision).map(|mut write| {
        write.guards.extend(revision.map(catalog::revision_guard));
        write
    });
    let appended = append_write(req, state, caller, write, (claim, guard)).await.map_err(append_error)?;
    Ok(respond(StatusCode::CREATED, &body, operation_id, Some(appended)))
}

#[tracing::instrument(skip_all, fields(schema = %path.as_str()))]
pub async fn upsert(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let prelude = prelude(&req, payload, &state, &path).await?;
    let (req, state, prelude, body) = (&req, &**state, &prelude, Value::Object(prelude.input.clone()));
    idempotency::protect(state, req, &prelude.caller, &body, |claim, operation_id| async move {
        upsert_attempts(req, state, prelude, claim.as_ref(), &operation_id).await
    })
    .await
}

async fn upsert_attempts(
    req: &HttpRequest,
    state: &State,
    prelude: &Prelude,
    claim: Option<&Claim>,
    operation_id: &str,
) -> Result<HttpResponse, ApiError> {
    let schema = prelude.write_schema();
    check_credits(&schema, prelude.credits)?;
    for _ in 0..ATTEMPTS {
        let planned = plan_upsert(state, &schema, prelude.input.clone(), shared::time::now_millis()).await?;
        let body = shared::http::data_body(planned.record.document(), &planned.warnings);
        let Some(write) = planned.write else {
            if let Some(claim) = claim {
                claim.record(state, StatusCode::OK, &body).await?;
            }
            return Ok(respond(StatusCode::OK, &body, operation_id, None));
        };
        let guard = completion(claim, planned.status, &body);
        match append_write(req, state, &prelude.caller, write, (claim, guard)).await {
            Ok(appended) => return Ok(respond(planned.status, &body, operation_id, Some(appended))),
            Err(error) if is_lost_race(&error) => continue,
            Err(error) => return Err(append_error(error)),
        }
    }
    Err(lost_too_often())
}

/// Decides an update of the live record `record_id` of `schema` with `input` (rule 6)
/// without appending it; `None` when nothing changes.
pub(crate) async fn plan_update(
    state: &State,
    schema: &WriteSchema<'_>,
    record_id: &str,
    input: Map<String, Value>,
    now: i64,
) -> Result<Option<Write>, ApiError> {
    let input = parse_input(schema, input)?;
    let client = state.pool.get().await?;
    let (version, current, key) = load_in_schema(&client, schema, record_id).await?;
    let owners = identity_owners(&client, schema.space_id, schema.schema_id, &identity_values(&input)).await?;
    drop(client);
    match decide_update(schema, &current, input, &owners, now)? {
        UpdateDecision::Unchanged => Ok(None),
        UpdateDecision::Changed(change) => update_write(schema.space_id, schema.schema_id, (version, key), *change)
            .map(Some)
            .map_err(crate::edge::append_error),
    }
}

/// The record's stream version, state and data key, if it is a live record of `schema`;
/// else 404, or 409 while its deletion is under way.
async fn load_in_schema(
    client: &deadpool_postgres::Client,
    schema: &WriteSchema<'_>,
    record_id: &str,
) -> Result<(i64, RecordState, Option<DataKey>), ApiError> {
    let loaded = load_records(client, &[record_id.to_owned()])
        .await?
        .into_iter()
        .find(|(id, _, _)| id == record_id)
        .map(|(_, version, loaded)| (version, loaded));
    Ok(live_target(schema, record_id, loaded)?)
}

#[tracing::instrument(skip_all, fields(schema = %path.0, record = %path.1))]
pub async fn update(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    // PATCH does not honour Idempotency-Key.
    let operation_id = new_id("op");
    let (schema_ref, record_id) = path.into_inner();
    let mut prelude = prelude(&req, payload, &state, &schema_ref).await?;
    // The path id overrides a body id.
    prelude.input.remove("id");
    let schema = prelude.write_schema();
    check_credits(&schema, prelude.credits)?;
    let with_id = |error: ApiError| error.with_header("Operation-Id", operation_id.clone());
    for _ in 0..ATTEMPTS {
        let input = parse_input(&schema, prelude.input.clone())?;
        let client = state.pool.get().await?;
        let (version, current, key) = load_in_schema(&client, &schema, &record_id).await.map_err(with_id)?;
        let owners = identity_owners(&client, schema.space_id, schema.schema_id, &identity_values(&input)).await?;
        drop(client);
        let UpdateDecision::Changed(change) =
            decide_update(&schema, &current, input, &owners, shared::time::now_millis())?
        else {
            let body = shared::http::data_body(current.document(), &[]);
            return Ok(respond(StatusCode::OK, &body, &operation_id, None));
        };
        let body = shared::http::data_body(change.state.document(), &change.warnings);
        let write = update_write(schema.space_id, schema.schema_id, (version, key), *change);
        match append_write(&req, &state, &prelude.caller, write, (None, None)).await {
            Ok(appended) => return Ok(respond(StatusCode::OK, &body, &operation_id, Some(appended))),
            Err(error) if is_lost_race(&error) => continue,
            Err(error) => return Err(with_id(crate::edge::append_error(error))),
        }
    }
    Err(with_id(lost_too_often()))
}

/// `DELETE /schemas/{schema}/records/{id}`: starts the deletion operation and answers 200 with
/// it while `pending`. The record leaves every read at once; its erasure is proven when the
/// operation reaches `completed` (see ARCHITECTURE.md, Erasure). Does not honour
/// `Idempotency-Key`: a repeated DELETE gets 409 while pending and 404 afterwards.
#[tracing::instrument(skip_all, fields(schema = %path.0, record = %path.1))]
pub async fn delete(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let operation_id = new_id("op");
    let with_id = |error: ApiError| error.with_header("Operation-Id", operation_id.clone());
    let (schema_ref, record_id) = path.into_inner();
    let caller = state.authenticator.authorize(&req, Permission::Write).await?;
    let (schema, attributes, _) = write_context(&state, caller.space_id(), &schema_ref).await.map_err(with_id)?;
    let write_schema = WriteSchema {
        schema_id: &schema.schema_id,
        space_id: caller.space_id(),
        schema_type: &schema.schema_type,
        attributes: &attributes,
    };
    for _ in 0..ATTEMPTS {
        let client = state.pool.get().await?;
        let (version, _, _) = load_in_schema(&client, &write_schema, &record_id).await.map_err(with_id)?;
        drop(client);
        let requested = shared::proto::RecordDeletionRequested {
            operation_id: operation_id.clone(),
            record_id: record_id.clone(),
            space_id: caller.space_id().to_owned(),
            schema_id: schema.schema_id.clone(),
            schema_type: schema.schema_type.clone(),
            requested_at_ms: shared::time::now_millis(),
        };
        let occurred_at = shared::time::from_millis(requested.requested_at_ms);
        let guards = deletion_guards(&operation_id, &record_id, caller.space_id(), &schema.schema_id);
        let appended = state
            .event_log
            .append(AppendRequest {
                metadata: crate::edge::metadata(&req, &caller, None),
                streams: vec![StreamAppend {
                    stream_id: stream_id(&record_id),
                    expected: ExpectedVersion::Exactly(version),
                    events: vec![NewEvent {
                        event: LogEvent::RecordDeletionRequested(requested),
                        subject_id: Some(record_id.clone()),
                        occurred_at,
                    }],
                }],
                guards,
            })
            .await;
        match appended {
            Ok(appended) => {
                let body = serde_json::json!({
                    "data": { "operationId": operation_id, "status": "pending", "message": shared::records::DELETION_PENDING_MESSAGE }
                });
                return Ok(respond(StatusCode::OK, &body, &operation_id, Some(appended)));
            }
            Err(AppendError::WrongVersion { .. }) => continue,
            Err(error) => return Err(with_id(crate::edge::append_error(error))),
        }
    }
    Err(with_id(lost_too_often()))
}
