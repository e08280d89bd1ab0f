//! Record writes, on the command pipeline: `POST /schemas/{schema}/records` (strict create),
//! `POST /schemas/{schema}/records/upsert`, `PATCH /schemas/{schema}/records/{id}` and `DELETE
//! /schemas/{schema}/records/{id}`. Each decides on the record's stream (and the identity
//! guards), and appends at its version.

use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::Permission;
use platform::error::{ApiError, Code};
use platform::log::AppendError;
use platform::refusal::answered;
use serde_json::Value;

use super::decide::{CreateRecord, DeleteRecord, Refusal, UpdateRecord, UpsertRecord, check_credits, write_schema};
use super::load::{context, load_in_schema, load_topics, load_update, load_upsert};
use super::topics::Wanted;
use crate::State;
use crate::decision::Outcome;
use crate::pipeline::{self, Actor, Command, Ctx, Decided, Protection, Refusal as Lost, Shell};
use crate::write_contexts::{self, Kind};

/// A lost race on the record's stream or on an identity claim: decide again.
fn refused(error: AppendError) -> Lost {
    match error {
        AppendError::Conflict { code: Code::IdentifierConflict, .. } => Lost::Again,
        error => Lost::default_for(error),
    }
}

fn lost_too_often() -> ApiError {
    Refusal::KeptChanging.into()
}

impl Command for CreateRecord {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let context = context(ctx, &self.space_id, &self.schema_ref).await?;
        let topics = match &self.topics {
            Some(_) => Some(load_topics(ctx, &self.space_id, None).await?),
            None => None,
        };
        Ok((context, topics))
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
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
    let mut input = api::http::read_json_object(&req, payload).await?;
    let schema_ref = path.into_inner();
    // The schema is resolved before the idempotency claim, as for every record write.
    let context = write_contexts::at_edge(&state, Kind::Record, caller.space_id(), &schema_ref).await?;
    let body = Value::Object(input.clone());
    let topics = Wanted::take(&context.schema.schema_type, &mut input).map_err(answered)?;
    let command = CreateRecord { space_id: caller.space_id().into(), schema_ref, input, topics };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&body), command).await
}

impl Command for UpsertRecord {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let context = context(ctx, &self.space_id, &self.schema_ref).await?;
        let schema = write_schema(&context, &self.space_id);
        check_credits(&schema, context.credits).map_err(Refusal::from)?;
        let loaded = load_upsert(ctx, &schema, self.input.clone()).await?;
        let topics = match &self.topics {
            Some(_) => {
                let contact_id = loaded.target.as_ref().map(|(_, record, _)| record.record_id.as_str());
                Some(load_topics(ctx, &self.space_id, contact_id).await?)
            }
            None => None,
        };
        Ok((context, loaded, topics))
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }

    fn refused(&self, error: AppendError) -> Lost {
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
    let mut input = api::http::read_json_object(&req, payload).await?;
    let schema_ref = path.into_inner();
    let context = write_contexts::at_edge(&state, Kind::Record, caller.space_id(), &schema_ref).await?;
    let body = Value::Object(input.clone());
    let topics = Wanted::take(&context.schema.schema_type, &mut input).map_err(answered)?;
    let command = UpsertRecord { space_id: caller.space_id().into(), schema_ref, input, topics };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&body), command).await
}

impl Command for UpdateRecord {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let context = context(ctx, &self.space_id, &self.schema_ref).await?;
        let schema = write_schema(&context, &self.space_id);
        check_credits(&schema, context.credits).map_err(Refusal::from)?;
        let (input, target, owners) = load_update(ctx, &schema, &self.record_id, self.input.clone()).await?;
        let topics = match &self.topics {
            Some(_) => Some(load_topics(ctx, &self.space_id, Some(&self.record_id)).await?),
            None => None,
        };
        Ok((context, input, target, owners, topics))
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }

    fn refused(&self, error: AppendError) -> Lost {
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
    let context = write_contexts::at_edge(&state, Kind::Record, caller.space_id(), &schema_ref).await?;
    let topics = Wanted::take(&context.schema.schema_type, &mut input).map_err(answered)?;
    let command = UpdateRecord { space_id: caller.space_id().into(), schema_ref, record_id, input, topics };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Unkeyed, command).await
}

impl Command for DeleteRecord {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let context = context(ctx, &self.space_id, &self.schema_ref).await?;
        let schema = write_schema(&context, &self.space_id);
        let (version, _, _) = load_in_schema(&ctx.db().await?, &schema, &self.record_id).await?;
        Ok((context, version))
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
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
    let command = DeleteRecord { space_id: caller.space_id().into(), schema_ref, record_id };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Unkeyed, command).await
}
