//! `POST /workflows/{referenceId}`, `POST /workflows/{id}/pause` and `POST
//! /workflows/{id}/unpause`, on the command pipeline.
//!
//! A trigger decides on the workflow as the catalog holds it (its revision guards the append)
//! and, when the input names a contact, on the contact as its stream holds it (upserted like a
//! record, in the same append). The run's input is sealed under the contact's data key (or a
//! key of the run's own), so erasing the contact shreds it. Pause and unpause decide on the
//! workflow's stream and append at its version.

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::{Caller, Permission};
use domain::workflows::{run_stream_id, stream_id};
use platform::error::ApiError;
use platform::events::LogEvent;
use platform::log::{ExpectedVersion, Guard, NewEvent, StreamAppend};
use platform::proto;
use prost::Message;
use serde_json::Value;

use super::decide::{self, Input, PauseChange, Refusal, requested_run};
use super::store::{self, Found, NewRun};
use crate::State;
use crate::pipeline::{self, Actor, Answer, Ctx, Decided, Decision, Given, Legacy, Protection};
use crate::records::decide::{UpsertLoaded, WriteSchema, decide_upsert};
use crate::records::load::{load_upsert, write_context};
use crate::records::write::Write;

fn internal(error: &anyhow::Error) -> ApiError {
    ApiError::internal(error)
}

/// `POST /workflows/{referenceId}`.
struct TriggerWorkflow<'a> {
    caller: &'a Caller,
    reference_id: String,
    input: Input,
}

/// What a trigger decides on.
struct Trigger {
    found: Arc<Found>,
    /// The contact's schema and what its upsert read, when the input names a contact.
    contact: Option<(std::sync::Arc<domain::catalog::WriteContext>, UpsertLoaded)>,
}

impl Legacy for TriggerWorkflow<'_> {
    type Loaded = Trigger;

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Trigger, ApiError> {
        let space_id = self.caller.space_id();
        let found = match ctx.state.workflows.get(space_id, &self.reference_id) {
            Some((revision, found)) => {
                ctx.kept_catalog(revision);
                found
            }
            None => {
                let catalog = ctx.catalog().await?;
                let (revision, found) = store::by_reference(&ctx.db().await?, &catalog, space_id, &self.reference_id)
                    .await
                    .map_err(|error| internal(&error))?;
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
                crate::records::decide::check_credits(&schema, context.credits)?;
                let loaded = load_upsert(ctx, &schema, contact.clone()).await?;
                Some((context, loaded))
            }
            None => None,
        };
        Ok(Trigger { found, contact })
    }

    fn decide(&self, trigger: Trigger, given: &Given<'_>) -> Result<Decided, ApiError> {
        let Trigger { found, contact } = trigger;
        let (space_id, now) = (self.caller.space_id(), given.now_ms);
        let run_id = platform::ids::new_id("run");
        let mut streams = Vec::new();
        let mut guards: Vec<Guard> = Vec::new();
        // The key the input is sealed under: the contact's, or one of the run's own.
        let (contact_id, key) = match contact {
            Some((context, loaded)) => {
                let schema = write_schema(&context, space_id);
                let planned = decide_upsert(&schema, loaded, now, &mut platform::fresh::Drawn)?;
                let contact_id = planned.record.record_id.clone();
                let key = match planned.write {
                    Some(write) => {
                        let Write { stream, guards: write_guards, key } = write.map_err(crate::edge::append_error)?;
                        streams.push(stream);
                        guards.extend(write_guards);
                        Some(key)
                    }
                    None => planned.key,
                };
                (Some(contact_id), key)
            }
            None => (None, None),
        };
        let subject = contact_id.clone().unwrap_or_else(|| run_id.clone());
        let key = match key {
            Some(key) => key,
            None => {
                let (key, wrapped) = platform::crypto::keyring()
                    .and_then(|keyring| keyring.generate(&subject))
                    .map_err(|error| internal(&error))?;
                guards.push(crate::records::store::store_key(&subject, space_id, wrapped));
                key
            }
        };
        let mut input = platform::events::seal(&subject, &proto::WorkflowInput { json: self.input.input.to_string() });
        platform::events::encrypt(&mut input, &key).map_err(|error| internal(&error))?;
        guards.push(store::insert_run(NewRun {
            run_id: &run_id,
            workflow_id: &found.workflow_id,
            space_id,
            revision: found.revision,
            contact_id: contact_id.as_deref(),
            input: input.encode_to_vec(),
            requested_at_ms: now,
        }));
        let requested = proto::WorkflowRunRequested {
            run_id: run_id.clone(),
            workflow_id: found.workflow_id.clone(),
            space_id: space_id.to_owned(),
            workflow_revision: found.revision,
            trigger: "webhook".to_owned(),
            trigger_id: self.reference_id.clone(),
            contact_id: contact_id.clone().unwrap_or_default(),
            input: Some(input),
            requested_at_ms: now,
        };
        streams.push(StreamAppend {
            stream_id: run_stream_id(&run_id),
            expected: ExpectedVersion::NoStream,
            events: vec![NewEvent {
                event: LogEvent::WorkflowRunRequested(requested),
                subject_id: contact_id.clone(),
                occurred_at: platform::time::from_millis(now),
            }],
        });
        let run = requested_run(&run_id, &found.workflow_id, contact_id.as_deref(), &self.reference_id, now);
        let answer = Answer::json(StatusCode::ACCEPTED, api::http::data_body(run, &[]));
        Ok(Decided::Append(Decision::new(streams, guards, answer)))
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

fn write_schema<'a>(context: &'a domain::catalog::WriteContext, space_id: &'a str) -> WriteSchema<'a> {
    WriteSchema {
        schema_id: &context.schema.schema_id,
        space_id,
        schema_type: &context.schema.schema_type,
        attributes: &context.attributes,
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
    let command = TriggerWorkflow { caller: &caller, reference_id: path.into_inner(), input };
    let body = Value::Object(body);
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&body), command).await
}

/// `POST /workflows/{id}/pause` (`pause`) and `/unpause`.
struct SetPaused<'a> {
    caller: &'a Caller,
    workflow_id: String,
    pause: bool,
}

impl Legacy for SetPaused<'_> {
    /// The workflow, and its stream's version and pause.
    type Loaded = (Found, i64, bool);

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let catalog = ctx.catalog().await?;
        let client = ctx.db().await?;
        let found = store::by_id(&client, &catalog, self.caller.space_id(), &self.workflow_id)
            .await
            .map_err(|error| internal(&error))?
            .ok_or_else(|| Refusal::NotFound(self.workflow_id.clone()))?;
        let (version, paused) =
            store::pause_state(&client, &self.workflow_id).await.map_err(|error| internal(&error))?;
        Ok((found, version, paused))
    }

    fn decide(&self, (found, version, paused): Self::Loaded, given: &Given<'_>) -> Result<Decided, ApiError> {
        let (workflow_id, space_id, now) = (&self.workflow_id, self.caller.space_id(), given.now_ms);
        let change = decide::decide_pause(workflow_id, &found.definition, paused, self.pause)?;
        let document = found.definition.document(workflow_id, found.revision, self.pause);
        let body = api::http::data_body(document, &[]);
        if change == PauseChange::Same {
            return Ok(Decided::Answer(Answer::json(StatusCode::OK, body)));
        }
        let event = match self.pause {
            true => LogEvent::WorkflowPaused(proto::WorkflowPaused {
                workflow_id: workflow_id.clone(),
                space_id: space_id.to_owned(),
                at_ms: now,
            }),
            false => LogEvent::WorkflowUnpaused(proto::WorkflowUnpaused {
                workflow_id: workflow_id.clone(),
                space_id: space_id.to_owned(),
                at_ms: now,
            }),
        };
        let expected = if version == 0 { ExpectedVersion::NoStream } else { ExpectedVersion::Exactly(version) };
        let stream = StreamAppend::one(stream_id(workflow_id), expected, event, now);
        let mut guards = vec![store::control(workflow_id, space_id, self.pause)];
        if !self.pause {
            guards.push(store::wake_parked(workflow_id));
        }
        Ok(Decided::Append(Decision::one(stream, guards, StatusCode::OK, body)))
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
    let command = SetPaused { caller: &caller, workflow_id, pause };
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
