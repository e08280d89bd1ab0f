//! `POST /workflows/{referenceId}`, `POST /workflows/{id}/pause`, `POST
//! /workflows/{id}/unpause` and `POST /workflows/{id}/replays`, on the command pipeline.
//!
//! A trigger decides on the workflow as the catalog holds it (its revision guards the append)
//! and, when the input names a contact, on the contact as its stream holds it (upserted like a
//! record, in the same append). The run's input is sealed under the contact's data key (or a
//! key of the run's own), so erasing the contact shreds it. Pause and unpause decide on the
//! workflow's stream and append at its version.

use platform::refusal::answered;
use std::sync::Arc;

use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::Permission;
use platform::error::ApiError;
use serde_json::Value;

use super::decide::{self, Refusal, RequestReplay, SetPaused, Trigger, TriggerWorkflow};
use super::store::{self, Found};
use crate::State;
use crate::decision::Outcome;
use crate::pipeline::{self, Actor, Command, Ctx, Decided, Protection, Shell};
use crate::records::decide::write_schema;
use crate::records::load::{load_upsert, write_context};

impl Command for TriggerWorkflow<'_> {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Trigger, ApiError> {
        let space_id = self.space_id.as_str();
        let found = match ctx.state.workflows.get(space_id, &self.reference_id) {
            Some((revision, found)) => {
                ctx.kept_catalog(revision);
                found
            }
            None => {
                let catalog = ctx.catalog().await?;
                let (revision, found) = store::by_reference(&ctx.db().await?, &catalog, space_id, &self.reference_id)
                    .await
                    .map_err(ApiError::from)?;
                ctx.saw_catalog(revision);
                let found = Arc::new(found.ok_or_else(|| Refusal::NotFound(self.reference_id.clone()))?);
                ctx.state.workflows.put(space_id, &self.reference_id, revision, &found);
                found
            }
        };
        decide::check_trigger(&found.workflow_id, &found.definition)?;
        let contact = match &self.input.contact {
            Some(contact) => {
                let context = write_context(ctx, space_id, &found.definition.contact_schema_id).await?;
                let schema = write_schema(&context, space_id);
                crate::records::decide::check_credits(&schema, context.credits).map_err(answered)?;
                let loaded = load_upsert(ctx, &schema, contact.clone()).await?;
                Some((context, loaded))
            }
            None => None,
        };
        // A first attempt writes the run's first transition only while the workflow is not
        // paused (its row's guard); one that found it paused reads the pause.
        let paused = match ctx.attempt() {
            0 => None,
            _ => Some(store::paused(&ctx.db().await?, &found.workflow_id).await.map_err(ApiError::from)?),
        };
        Ok(Trigger { found, contact, paused })
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }

    fn refused(&self, error: platform::log::AppendError) -> pipeline::Refusal {
        match error {
            platform::log::AppendError::Conflict { code: platform::error::Code::IdentifierConflict, .. } => {
                pipeline::Refusal::Again
            }
            error => pipeline::Refusal::default_for(error),
        }
    }
}

#[tracing::instrument(skip_all, fields(reference = %path.as_str()))]
pub async fn trigger(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (caller, body) =
        pipeline::authorize_with_body(&req, payload, &state, Permission::Write, pipeline::request_bucket(&req)).await?;
    let input = decide::parse_input(body.clone())?;
    let command = TriggerWorkflow {
        space_id: caller.space_id().into(),
        reference_id: path.into_inner(),
        input,
        site: &state.site,
        retry_schedule_ms: &state.settings.webhooks.retry_schedule_ms,
    };
    let body = Value::Object(body);
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&body), command).await
}

impl Command for SetPaused {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<(Found, i64, bool), ApiError> {
        let catalog = ctx.catalog().await?;
        let client = ctx.db().await?;
        let found = store::by_id(&client, &catalog, &self.space_id, &self.workflow_id)
            .await
            .map_err(ApiError::from)?
            .ok_or_else(|| Refusal::NotFound(self.workflow_id.clone()))?;
        let (version, paused) = store::pause_state(&client, &self.workflow_id).await.map_err(ApiError::from)?;
        Ok((found, version, paused))
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }
}

async fn set_paused(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
    pause: bool,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let workflow_id =
        pipeline::authored_id(&state, (domain::workflows::WORKFLOW, caller.space_id()), path.into_inner()).await?;
    let command = SetPaused { space_id: caller.space_id().into(), workflow_id, pause };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&Value::Null), command).await
}

#[tracing::instrument(skip_all, fields(workflow = %path.as_str()))]
pub async fn pause(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    set_paused(req, path, state, true).await
}

#[tracing::instrument(skip_all, fields(workflow = %path.as_str()))]
pub async fn unpause(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    set_paused(req, path, state, false).await
}

impl Command for RequestReplay {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Found, ApiError> {
        let catalog = ctx.catalog().await?;
        let client = ctx.db().await?;
        let found = store::by_id(&client, &catalog, &self.space_id, &self.workflow_id)
            .await
            .map_err(ApiError::from)?
            .ok_or_else(|| Refusal::NotFound(self.workflow_id.clone()))?;
        Ok(found)
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }
}

/// `POST /workflows/{id}/replays`: asks for a dry run of the workflow against its space's log.
#[tracing::instrument(skip_all, fields(workflow = %path.as_str()))]
pub async fn replay(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (caller, body) =
        pipeline::authorize_with_body(&req, payload, &state, Permission::Write, pipeline::request_bucket(&req)).await?;
    let window_ms = decide::parse_replay(&body)?;
    let workflow_id =
        pipeline::authored_id(&state, (domain::workflows::WORKFLOW, caller.space_id()), path.into_inner()).await?;
    let command = RequestReplay { space_id: caller.space_id().into(), workflow_id, window_ms };
    let body = Value::Object(body);
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&body), command).await
}
