//! Record writes, on the command pipeline: `POST /schemas/{schema}/records` (strict create),
//! `POST /schemas/{schema}/records/upsert`, `PATCH /schemas/{schema}/records/{id}` and `DELETE
//! /schemas/{schema}/records/{id}`. Each decides on the record's stream (and the identity
//! guards), and appends at its version.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::{Caller, Permission};
use domain::catalog::WriteContext;
use domain::records::{RecordState, record_document};
use platform::crypto::{self, DataKey};
use platform::error::ApiError;
use platform::error::Code;
use platform::events::LogEvent;
use platform::ids::new_id;
use platform::log::{AppendError, ExpectedVersion, Guard, NewEvent, StreamAppend};
use platform::proto::Sealed;
use serde_json::{Map, Value};

use crate::State;
use crate::pipeline::{self, Actor, Answer, Command, Ctx, Decided, Decision, Given, Protection, Refusal};
use crate::records::decide::{
    Change, CreateDecision, Input, Match, Owners, UpdateDecision, WriteSchema, check_credits, check_echoed,
    decide_create, decide_update, live_target, match_upsert, parse_input,
};
use crate::records::store::{Loaded, claim, deletion_guards, identity_owners, load_records, release, stream_id};
use crate::write_contexts::{self, Kind};

/// The record schema of a write and the space it is in, as a decision takes it.
fn write_schema<'a>(context: &'a WriteContext, space_id: &'a str) -> WriteSchema<'a> {
    WriteSchema {
        schema_id: &context.schema.schema_id,
        space_id,
        schema_type: &context.schema.schema_type,
        attributes: &context.attributes,
    }
}

/// Identity values of the input, to look up their holders.
fn identity_values(input: &Input) -> Vec<(&'static str, String)> {
    input.identities.iter().filter_map(|(key, value)| value.clone().map(|value| (*key, value))).collect()
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
    let occurred_at = platform::time::from_millis(decision.event.created_at_ms);
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
    let occurred_at = platform::time::from_millis(event.updated_at_ms);
    let stream = StreamAppend {
        stream_id: stream_id(&record_id),
        expected: ExpectedVersion::Exactly(version),
        events: vec![NewEvent { event: LogEvent::RecordUpdated(event), subject_id: Some(record_id), occurred_at }],
    };
    Ok(Write { stream, guards, key })
}

/// An upsert decided: the status and record it answers with, and the write (none when
/// nothing changes).
pub(crate) struct PlannedUpsert {
    pub status: StatusCode,
    pub record: RecordState,
    pub warnings: Vec<api::pagination::Warning>,
    pub write: Option<Result<Write, AppendError>>,
    /// The data key of an unchanged record (a write carries its own).
    pub key: Option<DataKey>,
}

/// What an upsert reads: its input, the identity holders, and the record it updates (its
/// stream version, state and data key), or `None` for a new record.
pub(crate) struct UpsertLoaded {
    input: Input,
    owners: Owners,
    target: Option<(i64, RecordState, Option<DataKey>)>,
}

/// Reads what an upsert of `input` in `schema` (rule 3 of the contract's record rules) decides
/// on: the holders of its identities, and the record they (or its `id`) select.
pub(crate) async fn load_upsert(
    ctx: &Ctx<'_>,
    schema: &WriteSchema<'_>,
    input: Map<String, Value>,
) -> Result<UpsertLoaded, ApiError> {
    let input = parse_input(schema, input)?;
    let client = ctx.db().await?;
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
    let target = match target {
        Match::Existing(record_id) => Some(load_in_schema(&client, schema, &record_id).await?),
        Match::New => None,
    };
    Ok(UpsertLoaded { input, owners, target })
}

/// Decides an upsert on what [`load_upsert`] read, without appending it, so that other writes
/// can join its append (a template send's context).
pub(crate) fn decide_upsert(
    schema: &WriteSchema<'_>,
    loaded: UpsertLoaded,
    now: i64,
) -> Result<PlannedUpsert, ApiError> {
    let UpsertLoaded { input, owners, target } = loaded;
    match target {
        Some((version, current, key)) => {
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
        None => {
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
        platform::events::encrypt(personal, &key).map_err(failed)?;
    }
    Ok((key, guard))
}

/// A lost race on the record's stream or on an identity claim: decide again.
fn refused(error: AppendError) -> Refusal {
    match error {
        AppendError::Conflict { code: Code::IdentifierConflict, .. } => Refusal::Again,
        error => Refusal::default_for(error),
    }
}

fn lost_too_often() -> ApiError {
    ApiError::conflict(Code::ConcurrentModification, "the record kept changing while this write was applied; retry")
}

/// The catalog context of a record write to `schema_ref`: kept by this process, or read now.
async fn context(ctx: &Ctx<'_>, space_id: &str, schema_ref: &str) -> Result<WriteContext, ApiError> {
    write_contexts::current(ctx, Kind::Record, space_id, schema_ref).await
}

/// The contact or object schema `schema_ref` (id or slug) of the space, its attributes and
/// the space's AI credits, read from the catalog now; 404 `schema_not_found` otherwise.
pub(crate) async fn write_context(ctx: &Ctx<'_>, space_id: &str, schema_ref: &str) -> Result<WriteContext, ApiError> {
    write_contexts::fresh(ctx, Kind::Record, space_id, schema_ref).await
}

/// Decides an upsert on what it reads now (see [`load_upsert`] and [`decide_upsert`]).
pub(crate) async fn plan_upsert(
    ctx: &Ctx<'_>,
    schema: &WriteSchema<'_>,
    input: Map<String, Value>,
    now: i64,
) -> Result<PlannedUpsert, ApiError> {
    let loaded = load_upsert(ctx, schema, input).await?;
    decide_upsert(schema, loaded, now)
}

/// `POST /schemas/{schema}/records`: strict create.
struct CreateRecord<'a> {
    caller: &'a Caller,
    schema_ref: String,
    input: Map<String, Value>,
}

impl Command for CreateRecord<'_> {
    type Loaded = WriteContext;

    async fn load(&self, ctx: &Ctx<'_>) -> Result<WriteContext, ApiError> {
        context(ctx, self.caller.space_id(), &self.schema_ref).await
    }

    fn decide(&self, context: WriteContext, given: &Given<'_>) -> Result<Decided, ApiError> {
        let schema = write_schema(&context, self.caller.space_id());
        check_credits(&schema, context.credits)?;
        let input = parse_input(&schema, self.input.clone())?;
        // A strict create needs no lookup of identity holders: the identity guards in its
        // append are the uniqueness check, and a collision is 409 identifier_conflict.
        let record_id = new_id(if schema.schema_type == "contact" { "con" } else { "obj" });
        let decision = decide_create(&schema, input, &Owners::new(), &record_id, given.now_ms)?;
        let document =
            record_document(&decision.event, &Default::default()).map_err(|error| ApiError::internal(&error))?;
        let body = api::http::data_body(document, &[]);
        let Write { stream, guards, .. } =
            create_write(schema.space_id, schema.schema_id, decision).map_err(crate::edge::append_error)?;
        Ok(Decided::Append(Decision::one(stream, guards, StatusCode::CREATED, body)))
    }
}

#[tracing::instrument(skip_all, fields(schema = %path.as_str()))]
pub async fn create(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let input = api::http::read_json_object(&req, payload).await?;
    let schema_ref = path.into_inner();
    // The schema is resolved before the idempotency claim, as for every record write.
    write_contexts::at_edge(&state, Kind::Record, caller.space_id(), &schema_ref).await?;
    let body = Value::Object(input.clone());
    let command = CreateRecord { caller: &caller, schema_ref, input };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&body), command).await
}

/// `POST /schemas/{schema}/records/upsert`.
struct UpsertRecord<'a> {
    caller: &'a Caller,
    schema_ref: String,
    input: Map<String, Value>,
}

impl Command for UpsertRecord<'_> {
    type Loaded = (WriteContext, UpsertLoaded);

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let context = context(ctx, self.caller.space_id(), &self.schema_ref).await?;
        let schema = write_schema(&context, self.caller.space_id());
        check_credits(&schema, context.credits)?;
        let loaded = load_upsert(ctx, &schema, self.input.clone()).await?;
        Ok((context, loaded))
    }

    fn decide(&self, (context, loaded): Self::Loaded, given: &Given<'_>) -> Result<Decided, ApiError> {
        let schema = write_schema(&context, self.caller.space_id());
        let planned = decide_upsert(&schema, loaded, given.now_ms)?;
        let body = api::http::data_body(planned.record.document(), &planned.warnings);
        let Some(write) = planned.write else { return Ok(Decided::Answer(Answer::json(StatusCode::OK, body))) };
        let Write { stream, guards, .. } = write.map_err(crate::edge::append_error)?;
        Ok(Decided::Append(Decision::one(stream, guards, planned.status, body)))
    }

    fn refused(&self, error: AppendError) -> Refusal {
        refused(error)
    }

    fn lost_too_often(&self) -> ApiError {
        lost_too_often()
    }
}

#[tracing::instrument(skip_all, fields(schema = %path.as_str()))]
pub async fn upsert(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let input = api::http::read_json_object(&req, payload).await?;
    let schema_ref = path.into_inner();
    write_contexts::at_edge(&state, Kind::Record, caller.space_id(), &schema_ref).await?;
    let body = Value::Object(input.clone());
    let command = UpsertRecord { caller: &caller, schema_ref, input };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&body), command).await
}

/// Decides an update of the live record `record_id` of `schema` with `input` (rule 6)
/// without appending it, on what it reads now; `None` when nothing changes.
pub(crate) async fn plan_update(
    ctx: &Ctx<'_>,
    schema: &WriteSchema<'_>,
    record_id: &str,
    input: Map<String, Value>,
    now: i64,
) -> Result<Option<Write>, ApiError> {
    let (input, target, owners) = load_update(ctx, schema, record_id, input).await?;
    decide_record_update(schema, input, target, &owners, now).map(|decided| decided.map(|(write, _)| write))
}

/// What an update reads: the input, the record (stream version, state, data key) and the
/// holders of the identities the input sets.
async fn load_update(
    ctx: &Ctx<'_>,
    schema: &WriteSchema<'_>,
    record_id: &str,
    mut input: Map<String, Value>,
) -> Result<(Input, (i64, RecordState, Option<DataKey>), Owners), ApiError> {
    // The body may be the record as read: its `createdAt` is taken when unchanged, its
    // `updatedAt` ignored.
    let echoed = crate::echo::take_echoed(&mut input, &["createdAt"], &["updatedAt"]);
    let input = parse_input(schema, input)?;
    let client = ctx.db().await?;
    let target = load_in_schema(&client, schema, record_id).await?;
    check_echoed(&echoed, &target.1)?;
    let owners = identity_owners(&client, schema.space_id, schema.schema_id, &identity_values(&input)).await?;
    Ok((input, target, owners))
}

/// An update decided: the write and the record after it, or `None` when nothing changes.
fn decide_record_update(
    schema: &WriteSchema<'_>,
    input: Input,
    (version, current, key): (i64, RecordState, Option<DataKey>),
    owners: &Owners,
    now: i64,
) -> Result<Option<(Write, Value)>, ApiError> {
    match decide_update(schema, &current, input, owners, now)? {
        UpdateDecision::Unchanged => Ok(None),
        UpdateDecision::Changed(change) => {
            let body = api::http::data_body(change.state.document(), &change.warnings);
            let write = update_write(schema.space_id, schema.schema_id, (version, key), *change)
                .map_err(crate::edge::append_error)?;
            Ok(Some((write, body)))
        }
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

/// `PATCH /schemas/{schema}/records/{id}` (does not honour `Idempotency-Key`).
struct UpdateRecord<'a> {
    caller: &'a Caller,
    schema_ref: String,
    record_id: String,
    input: Map<String, Value>,
}

impl Command for UpdateRecord<'_> {
    type Loaded = (WriteContext, Input, (i64, RecordState, Option<DataKey>), Owners);

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let context = context(ctx, self.caller.space_id(), &self.schema_ref).await?;
        let schema = write_schema(&context, self.caller.space_id());
        check_credits(&schema, context.credits)?;
        let (input, target, owners) = load_update(ctx, &schema, &self.record_id, self.input.clone()).await?;
        Ok((context, input, target, owners))
    }

    fn decide(&self, (context, input, target, owners): Self::Loaded, given: &Given<'_>) -> Result<Decided, ApiError> {
        let schema = write_schema(&context, self.caller.space_id());
        let unchanged = api::http::data_body(target.1.document(), &[]);
        match decide_record_update(&schema, input, target, &owners, given.now_ms)? {
            None => Ok(Decided::Answer(Answer::json(StatusCode::OK, unchanged))),
            Some((Write { stream, guards, .. }, body)) => {
                Ok(Decided::Append(Decision::one(stream, guards, StatusCode::OK, body)))
            }
        }
    }

    fn refused(&self, error: AppendError) -> Refusal {
        refused(error)
    }

    fn lost_too_often(&self) -> ApiError {
        lost_too_often()
    }
}

#[tracing::instrument(skip_all, fields(schema = %path.0, record = %path.1))]
pub async fn update(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (schema_ref, record_id) = path.into_inner();
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let mut input = api::http::read_json_object(&req, payload).await?;
    // The path id overrides a body id.
    input.remove("id");
    let command = UpdateRecord { caller: &caller, schema_ref, record_id, input };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Unkeyed, command).await
}

/// `DELETE /schemas/{schema}/records/{id}`: starts the deletion operation and answers 200 with
/// it while `pending`. The record leaves every read at once; its erasure is proven when the
/// operation reaches `completed` (see ARCHITECTURE.md, Erasure). Does not honour
/// `Idempotency-Key`: a repeated DELETE gets 409 while pending and 404 afterwards.
struct DeleteRecord<'a> {
    caller: &'a Caller,
    schema_ref: String,
    record_id: String,
}

impl Command for DeleteRecord<'_> {
    type Loaded = (WriteContext, i64);

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let context = context(ctx, self.caller.space_id(), &self.schema_ref).await?;
        let schema = write_schema(&context, self.caller.space_id());
        let (version, _, _) = load_in_schema(&ctx.db().await?, &schema, &self.record_id).await?;
        Ok((context, version))
    }

    fn decide(&self, (context, version): Self::Loaded, given: &Given<'_>) -> Result<Decided, ApiError> {
        let (record_id, space_id) = (&self.record_id, self.caller.space_id());
        let operation_id = given.operation_id;
        let requested = platform::proto::RecordDeletionRequested {
            operation_id: operation_id.to_owned(),
            record_id: record_id.clone(),
            space_id: space_id.to_owned(),
            schema_id: context.schema.schema_id.clone(),
            schema_type: context.schema.schema_type.clone(),
            requested_at_ms: given.now_ms,
        };
        let stream = StreamAppend {
            stream_id: stream_id(record_id),
            expected: ExpectedVersion::Exactly(version),
            events: vec![NewEvent {
                event: LogEvent::RecordDeletionRequested(requested),
                subject_id: Some(record_id.clone()),
                occurred_at: platform::time::from_millis(given.now_ms),
            }],
        };
        let guards = deletion_guards(operation_id, record_id, space_id, &context.schema.schema_id);
        let body = serde_json::json!({
            "data": { "operationId": operation_id, "status": "pending", "message": domain::records::DELETION_PENDING_MESSAGE }
        });
        Ok(Decided::Append(Decision::one(stream, guards, StatusCode::OK, body)))
    }

    fn lost_too_often(&self) -> ApiError {
        lost_too_often()
    }
}

#[tracing::instrument(skip_all, fields(schema = %path.0, record = %path.1))]
pub async fn delete(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (schema_ref, record_id) = path.into_inner();
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let command = DeleteRecord { caller: &caller, schema_ref, record_id };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Unkeyed, command).await
}
