//! `PATCH /broadcasts/{id}` and `POST /broadcasts/{id}/send`, on the command pipeline.
//!
//! Both decide on the broadcast as the log holds it (`store::load`): its authored definition
//! and every update, with the versions of both streams. The append goes at the broadcast
//! stream's version and requires the authoring stream unchanged, so an update and a send that
//! race are ordered: the send's run takes the audience, template and sender either wholly
//! before or wholly after the update, and two updates of different fields both survive. While
//! a run is scheduled or sending, an update is refused, and so is another send (409
//! `broadcast_run_active`), by a guard that holds even against a concurrent request.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::{Caller, Permission};
use domain::email::broadcasts::{document, stream_id};
use domain::email::resources::{Audience, BROADCAST};
use platform::error::{ApiError, Code};
use platform::events::LogEvent;
use platform::log::{AppendError, ExpectedVersion, Guard, StreamAppend};
use platform::proto;
use serde_json::{Value, json};

use super::decide::{self, AudienceFound, Update};
use super::store::{self, Loaded};
use crate::State;
use crate::pipeline::{self, Actor, Ctx, Decided, Decision, Given, Legacy, Protection, Refusal};

/// Whether `audience` names a live segment or a topic of the space, and the guard that keeps a
/// segment's stream where it was read (its deletion meanwhile makes the command decide again).
async fn audience_found(
    ctx: &Ctx<'_>,
    space_id: &str,
    audience: &Audience,
) -> Result<(AudienceFound, Option<Guard>), ApiError> {
    let found = |yes: bool| if yes { AudienceFound::Yes } else { AudienceFound::No };
    match audience {
        Audience::Segment { segment_id } => {
            let client = ctx.db().await?;
            let loaded = crate::segments::store::load(&client, segment_id).await.map_err(|e| ApiError::internal(&e))?;
            match loaded {
                Some((version, owner)) if owner == space_id => Ok((
                    AudienceFound::Yes,
                    Some(Guard::stream_at(&crate::segments::store::stream_id(segment_id), version)),
                )),
                _ => Ok((AudienceFound::No, None)),
            }
        }
        Audience::Topic { topic_id } => {
            let catalog = ctx.catalog().await?;
            let client = ctx.db().await?;
            let topic = reads::catalog::resource_by_id(&client, &catalog, "topic", topic_id).await?;
            Ok((found(topic.is_some_and(|(owner, _, _)| owner == space_id)), None))
        }
    }
}

/// Which audience a command checks.
enum Checked<'a> {
    /// The one an update names, if it names one.
    Named(Option<&'a Audience>),
    /// The broadcast's own.
    Own,
}

/// The broadcast from the log (`None`: not one of the space's), and what is known of the
/// audience the command checks.
async fn load_with_audience(
    ctx: &Ctx<'_>,
    space_id: &str,
    broadcast_id: &str,
    checked: Checked<'_>,
) -> Result<Option<(Loaded, AudienceFound, Option<Guard>)>, ApiError> {
    let client = ctx.db().await?;
    let loaded = store::load(&client, space_id, broadcast_id).await.map_err(|error| ApiError::internal(&error))?;
    drop(client);
    let Some(loaded) = loaded else { return Ok(None) };
    let audience = match checked {
        Checked::Named(audience) => audience,
        Checked::Own => Some(&loaded.current.definition.audience),
    };
    let (found, guard) = match audience {
        Some(audience) => audience_found(ctx, space_id, audience).await?,
        None => (AudienceFound::Yes, None),
    };
    Ok(Some((loaded, found, guard)))
}

/// The broadcast's own stream at the version it was loaded at, and its authoring stream
/// unchanged.
fn at_loaded(broadcast_id: &str, loaded: &Loaded, event: LogEvent, now: i64) -> (StreamAppend, Guard) {
    let expected = match loaded.version {
        0 => ExpectedVersion::NoStream,
        version => ExpectedVersion::Exactly(version),
    };
    let stream = StreamAppend::one(stream_id(broadcast_id), expected, event, now);
    (stream, Guard::stream_at(&store::authored_stream(broadcast_id), loaded.authored_version))
}

/// A guard that names the run-active conflict answers 409 `broadcast_run_active`.
fn refused(error: AppendError) -> Refusal {
    match error {
        AppendError::Conflict { code: Code::BroadcastRunActive, .. } => {
            Refusal::Fail(decide::Refusal::RunActive.into())
        }
        error => Refusal::default_for(error),
    }
}

struct UpdateBroadcast<'a> {
    caller: &'a Caller,
    broadcast_id: String,
    update: Update,
}

impl Legacy for UpdateBroadcast<'_> {
    type Loaded = Option<(Loaded, AudienceFound, Option<Guard>)>;

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let audience = Checked::Named(self.update.audience.as_ref());
        load_with_audience(ctx, self.caller.space_id(), &self.broadcast_id, audience).await
    }

    fn decide(&self, loaded: Self::Loaded, given: &Given<'_>) -> Result<Decided, ApiError> {
        let (space_id, broadcast_id) = (self.caller.space_id(), self.broadcast_id.as_str());
        let current = loaded.as_ref().map(|(loaded, _, _)| &loaded.current);
        if let Some(current) = current {
            decide::check_echoed(&self.update, &document(broadcast_id, &current.definition, given.now_ms))?;
        }
        let found = loaded.as_ref().map_or(AudienceFound::Yes, |(_, found, _)| *found);
        let (event, next) = decide::decide_update(broadcast_id, space_id, current, &self.update, found, given.now_ms)?;
        let Some((loaded, _, audience_guard)) = loaded else {
            return Err(ApiError::internal(&anyhow::anyhow!("an update decided without its broadcast")));
        };
        let body = api::http::data_body(document(broadcast_id, &next, given.now_ms), &[]);
        let (stream, authored) = at_loaded(broadcast_id, &loaded, LogEvent::BroadcastUpdated(event), given.now_ms);
        let guards = [store::no_active_run(broadcast_id), authored].into_iter().chain(audience_guard).collect();
        Ok(Decided::Append(Decision::one(stream, guards, StatusCode::OK, body)))
    }

    fn refused(&self, error: AppendError) -> Refusal {
        refused(error)
    }
}

#[tracing::instrument(skip_all, fields(broadcast = %path.as_str()))]
pub async fn update(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (caller, body) =
        pipeline::authorize_with_body(&req, payload, &state, Permission::Write, pipeline::request_bucket(&req)).await?;
    let update = decide::parse_update(&body)?;
    let broadcast_id = pipeline::authored_id(&state, (BROADCAST, caller.space_id()), path.into_inner()).await?;
    let command = UpdateBroadcast { caller: &caller, broadcast_id, update };
    let body = Value::Object(body);
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&body), command).await
}

/// A run as the API shows it when it was just requested.
fn requested_run(run: &proto::BroadcastRunRequested, audience: &Audience) -> Value {
    json!({
        "id": run.run_id,
        "broadcastId": run.broadcast_id,
        "status": "scheduled",
        "templateId": run.template_id,
        "senderId": Some(&run.sender_id).filter(|id| !id.is_empty()),
        "audience": audience,
        "startAt": platform::time::format_millis(run.start_at_ms),
        "requestedAt": platform::time::format_millis(run.requested_at_ms),
        "startedAt": null,
        "finishedAt": null,
        "error": null,
        "counts": {"audience": null, "pending": 0, "queued": 0, "held": 0, "sent": 0, "failed": 0, "outcomeUnknown": 0,
                   "bounced": 0, "complained": 0, "unsubscribed": 0, "opened": 0, "clicked": 0,
                   "openRate": null, "clickRate": null,
                   "skipped": {"notSubscribed": 0, "suppressed": 0, "allowance": 0, "noAddress": 0, "gone": 0,
                               "frequencyCap": 0, "quietHours": 0}},
    })
}

struct SendBroadcast<'a> {
    caller: &'a Caller,
    broadcast_id: String,
}

impl Legacy for SendBroadcast<'_> {
    type Loaded = Option<(Loaded, AudienceFound, Option<Guard>)>;

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        load_with_audience(ctx, self.caller.space_id(), &self.broadcast_id, Checked::Own).await
    }

    fn decide(&self, loaded: Self::Loaded, given: &Given<'_>) -> Result<Decided, ApiError> {
        let (space_id, broadcast_id) = (self.caller.space_id(), self.broadcast_id.as_str());
        let current = loaded.as_ref().map(|(loaded, _, _)| &loaded.current);
        let found = loaded.as_ref().map_or(AudienceFound::Yes, |(_, found, _)| *found);
        let run_id = platform::ids::new_id("bcr");
        let run = decide::decide_send(broadcast_id, space_id, current, found, (&run_id, given.now_ms))?;
        let Some((loaded, _, audience_guard)) = loaded else {
            return Err(ApiError::internal(&anyhow::anyhow!("a send decided without its broadcast")));
        };
        let audience = &loaded.current.definition.audience;
        let body = api::http::data_body(requested_run(&run, audience), &[]);
        let audience = serde_json::to_value(audience).map_err(|error| ApiError::internal(&error.into()))?;
        let mut guards = store::run_guards(&run, audience);
        let (stream, authored) = at_loaded(broadcast_id, &loaded, LogEvent::BroadcastRunRequested(run), given.now_ms);
        guards.push(authored);
        guards.extend(audience_guard);
        Ok(Decided::Append(Decision::one(stream, guards, StatusCode::ACCEPTED, body)))
    }

    fn refused(&self, error: AppendError) -> Refusal {
        refused(error)
    }
}

#[tracing::instrument(skip_all, fields(broadcast = %path.as_str()))]
pub async fn send(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let broadcast_id = pipeline::authored_id(&state, (BROADCAST, caller.space_id()), path.into_inner()).await?;
    let command = SendBroadcast { caller: &caller, broadcast_id };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&Value::Null), command).await
}
