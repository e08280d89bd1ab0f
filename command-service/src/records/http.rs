//! Record writes, on the command pipeline: `POST /schemas/{schema}/records` (strict create),
//! `POST /schemas/{schema}/records/upsert`, `PATCH /schemas/{schema}/records/{id}` and `DELETE
//! /schemas/{schema}/records/{id}`. Each decides on the record's stream (and the identity
//! guards), and appends at its version.

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::{Caller, Permission};
use domain::catalog::WriteContext;
use domain::records::{RecordState, record_document};
use platform::crypto::DataKey;
use platform::error::{ApiError, Code};
use platform::events::LogEvent;
use platform::ids::new_id;
use platform::log::{AppendError, ExpectedVersion, NewEvent, StreamAppend};
use serde_json::{Map, Value};

use super::write::{
    UpsertLoaded, Write, context, create_write, decide_record_update, decide_upsert, load_in_schema, load_update,
    load_upsert, write_schema,
};
use crate::State;
use crate::pipeline::{self, Actor, Answer, Ctx, Decided, Decision, Given, Legacy, Protection, Refusal};
use crate::records::decide::{Input, Owners, check_credits, decide_create, parse_input};
use crate::records::store::{deletion_guards, stream_id};
use crate::write_contexts::{self, Kind};

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

/// `POST /schemas/{schema}/records`: strict create.
struct CreateRecord<'a> {
    caller: &'a Caller,
    schema_ref: String,
    input: Map<String, Value>,
}

impl Legacy for CreateRecord<'_> {
    type Loaded = Arc<WriteContext>;

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Arc<WriteContext>, ApiError> {
        context(ctx, self.caller.space_id(), &self.schema_ref).await
    }

    fn decide(&self, context: Arc<WriteContext>, given: &Given<'_>) -> Result<Decided, ApiError> {
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
            create_write(schema.space_id, schema.schema_id, decision, &mut platform::fresh::Drawn)
                .map_err(crate::edge::append_error)?;
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

impl Legacy for UpsertRecord<'_> {
    type Loaded = (Arc<WriteContext>, UpsertLoaded);

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

/// `PATCH /schemas/{schema}/records/{id}` (does not honour `Idempotency-Key`).
struct UpdateRecord<'a> {
    caller: &'a Caller,
    schema_ref: String,
    record_id: String,
    input: Map<String, Value>,
}

impl Legacy for UpdateRecord<'_> {
    type Loaded = (Arc<WriteContext>, Input, (i64, RecordState, Option<DataKey>), Owners);

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

impl Legacy for DeleteRecord<'_> {
    type Loaded = (Arc<WriteContext>, i64);

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
