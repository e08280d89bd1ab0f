//! `PATCH /broadcasts/{id}` and `POST /broadcasts/{id}/send`, on the command pipeline.
//!
//! Both decide on the broadcast as the log holds it (`store::load`): its authored definition
//! and every update, with the versions of both streams. The append goes at the broadcast
//! stream's version and requires the authoring stream unchanged, so an update and a send that
//! race are ordered: the send's run takes the audience, template and sender either wholly
//! before or wholly after the update, and two updates of different fields both survive. While
//! a run is scheduled or sending, an update is refused, and so is another send (409
//! `broadcast_run_active`), by a guard that holds even against a concurrent request.

use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::Permission;
use domain::email::experiments::{ExperimentDef, Metric};
use domain::email::resources::{Audience, BROADCAST, SenderDef, TemplateDef};
use platform::error::{ApiError, Code};
use platform::log::{AppendError, Guard};
use serde_json::Value;

use super::decide::{self, AudienceFound, Broadcast, ExperimentFacts, SendBroadcast, TemplateFacts, UpdateBroadcast};
use super::store;
use crate::State;
use crate::decision::Outcome;
use crate::pipeline::{self, Actor, Command, Ctx, Decided, Protection, Refusal, Shell};

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
            let loaded = crate::segments::store::load(&client, segment_id).await.map_err(ApiError::from)?;
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

/// What the space's catalog holds of the templates and senders `experiment` names, and of the
/// broadcast's own template (`own_template`).
async fn experiment_facts(
    ctx: &Ctx<'_>,
    space_id: &str,
    experiment: &ExperimentDef,
    own_template: &str,
) -> Result<ExperimentFacts, ApiError> {
    let catalog = ctx.catalog().await?;
    let client = ctx.db().await?;
    let mut facts = ExperimentFacts::default();
    let named = experiment.variants.iter().filter_map(|variant| variant.template_id.as_deref());
    for template_id in named.chain([own_template]) {
        let found = reads::catalog::resource_by_id(&client, &catalog, "template", template_id).await?;
        let Some((_, _, definition)) = found.filter(|(owner, _, _)| owner == space_id) else { continue };
        let Ok(template) = serde_json::from_value::<TemplateDef>(definition) else { continue };
        let template_facts = TemplateFacts {
            broadcastable: template.kind == "marketing" && template.data.len() == 1,
            localized: !template.locales.is_empty(),
        };
        if template_id == own_template {
            facts.own_template_localized = template_facts.localized;
        }
        facts.templates.insert(template_id.to_owned(), template_facts);
    }
    for sender_id in experiment.variants.iter().filter_map(|variant| variant.sender_id.as_deref()) {
        let found = reads::catalog::resource_by_id(&client, &catalog, "sender", sender_id).await?;
        let Some((_, _, definition)) = found.filter(|(owner, _, _)| owner == space_id) else { continue };
        let Ok(sender) = serde_json::from_value::<SenderDef>(definition) else { continue };
        facts.senders.insert(sender_id.to_owned(), sender.postal_address.is_some());
    }
    if let Metric::Conversion { schema_id, .. } = &experiment.metric {
        let schema = reads::catalog::find_schema(&client, &catalog, space_id, schema_id).await?;
        facts.conversion_schema_found =
            schema.is_some_and(|schema| schema.schema_id == *schema_id && schema.schema_type == "event");
    }
    Ok(facts)
}

/// The broadcast from the log (`None`: not one of the space's), and what is known of the
/// audience the command checks and of what an update's `experiment` names.
async fn load_with_audience(
    ctx: &Ctx<'_>,
    space_id: &str,
    broadcast_id: &str,
    (checked, experiment): (Checked<'_>, Option<&ExperimentDef>),
) -> Result<Broadcast, ApiError> {
    let client = ctx.db().await?;
    let loaded = store::load(&client, space_id, broadcast_id).await.map_err(ApiError::from)?;
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
    let facts = match experiment {
        Some(experiment) => experiment_facts(ctx, space_id, experiment, &loaded.current.definition.template_id).await?,
        None => ExperimentFacts::default(),
    };
    Ok(Some((loaded, found, guard, facts)))
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

impl Command for UpdateBroadcast {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Broadcast, ApiError> {
        let audience = Checked::Named(self.update.audience.as_ref());
        let experiment = self.update.experiment.as_ref().and_then(Option::as_ref);
        load_with_audience(ctx, &self.space_id, &self.broadcast_id, (audience, experiment)).await
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
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
    let command = UpdateBroadcast { space_id: caller.space_id().into(), broadcast_id, update };
    let body = Value::Object(body);
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&body), command).await
}

impl Command for SendBroadcast {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Broadcast, ApiError> {
        load_with_audience(ctx, &self.space_id, &self.broadcast_id, (Checked::Own, None)).await
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
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
    let command = SendBroadcast { space_id: caller.space_id().into(), broadcast_id };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&Value::Null), command).await
}
