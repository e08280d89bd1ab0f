//! Webhook writes (write permission), on the command pipeline: `POST /webhooks`, `PATCH
//! /webhooks/{id}`, `DELETE /webhooks/{id}` and `POST /webhooks/{id}/rotate-secret`, each under
//! `Idempotency-Key`, and the owner's tools (replay a delivery, send a test). Each decides on
//! the webhook's stream and appends at its version. A body that sets a `custom filter`
//! condition counts in the `ai` bucket instead of the write bucket and spends one AI credit
//! when the filter is made (once per request, whatever the attempts). The decisions are in
//! [`super::decide`].

use std::cell::OnceCell;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use ai_provider::AiError;
use api::auth::{Caller, Permission};
use api::ratelimit::Bucket;
use domain::webhooks::signing::Secret;
use platform::error::ApiError;
use serde_json::{Map, Value};

use super::decide::{
    self, Condition, CreateWebhook, Creating, DeleteWebhook, NewWebhook, Refusal, ReplayDelivery, Replaying, Resolved,
    RotateSecret, Rotating, TestRequested, TestWebhook, UpdateWebhook, Updating, pending_delivery,
};
use super::store::{self, WebhookState};
use crate::State;
use crate::decision::Outcome;
use crate::pipeline::{self, Actor, Answer, Command, Ctx, Decided, Decision, Protection, Shell, Then};

/// Authenticates (in the bucket the body asks for) and reads the body.
async fn prelude(
    req: &HttpRequest,
    payload: web::Payload,
    state: &State,
) -> Result<(Caller, Map<String, Value>), ApiError> {
    pipeline::authorize_with_body(req, payload, state, Permission::Write, |body| {
        let custom_filter = body.is_ok_and(|body| {
            body.get("condition").and_then(|condition| condition.get("type")).and_then(Value::as_str)
                == Some("custom filter")
        });
        if custom_filter { Bucket::Ai } else { Bucket::Write }
    })
    .await
}

/// The id of the schema `reference` names, which must fit the trigger.
async fn resolve_schema(ctx: &Ctx<'_>, space_id: &str, new: &NewWebhook, reference: &str) -> Result<String, ApiError> {
    let catalog = ctx.catalog().await?;
    let client = ctx.db().await?;
    let schema = store::schema(&client, &catalog, space_id, reference)
        .await?
        .ok_or_else(|| Refusal::SchemaNotFound(reference.to_owned()))?;
    decide::check_schema(new.trigger, &schema.schema_type)?;
    Ok(schema.schema_id)
}

/// The condition to store for what the caller wrote. A custom filter is made once per request
/// (`made` keeps it across attempts) by the AI provider; it needs a credit.
async fn resolve_condition(
    ctx: &Ctx<'_>,
    space_id: &str,
    condition: &Condition,
    made: &OnceCell<Resolved>,
) -> Result<Resolved, ApiError> {
    let requirements = match condition {
        Condition::None => return Ok(Resolved::none()),
        Condition::Segment { segment_id } => {
            let client = ctx.db().await?;
            let version = crate::segments::store::load_live(&client, space_id, segment_id).await?;
            return Ok(Resolved::segment(segment_id, crate::segments::store::stream_id(segment_id), version));
        }
        Condition::CustomFilter { requirements } => requirements,
    };
    if let Some(resolved) = made.get() {
        return Ok(resolved.clone());
    }
    let catalog = ctx.catalog().await?;
    let credits = reads::catalog::credits(&ctx.db().await?, &catalog, space_id).await?;
    if credits <= 0 {
        return Err(Refusal::NoCredits.into());
    }
    let made_now = match ctx.state.ai.filter(requirements).await {
        Ok(filter) => decide::custom_filter(&filter).map_err(ApiError::from),
        // Well-formed but not turned into a filter: the contract's 422 for a failed AI
        // generation. Nothing is spent or written.
        Err(AiError::Refused(reason) | AiError::Unfit(reason)) => Err(Refusal::FilterNotMade(reason).into()),
        Err(error) => Err(ApiError::unavailable(format!("{error}; retry with the same Idempotency-Key"))),
    }?;
    Ok(made.get_or_init(|| made_now).clone())
}

/// The webhook's stream version and state (`None` when it was never created).
async fn load_webhook(ctx: &Ctx<'_>, webhook_id: &str) -> Result<(i64, Option<WebhookState>), ApiError> {
    store::load(&ctx.db().await?, webhook_id).await.map_err(ApiError::from)
}

fn lost_too_often() -> ApiError {
    Refusal::KeptChanging.into()
}

impl Command for ReplayDelivery {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Replaying, ApiError> {
        let (_, webhook) = load_webhook(ctx, &self.webhook_id).await?;
        // A webhook not found is refused before its deliveries are read.
        let delivery_state = match decide::live(&self.webhook_id, &self.space_id, webhook.as_ref()) {
            Ok(_) => store::delivery_state(&ctx.db().await?, &self.webhook_id, &self.delivery_id).await?,
            Err(_) => None,
        };
        Ok(Replaying { webhook, delivery_state })
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }
}

#[tracing::instrument(skip_all)]
pub(crate) async fn replay_delivery(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let (webhook_id, delivery_id) = path.into_inner();
    let command = ReplayDelivery { space_id: caller.space_id().into(), webhook_id, delivery_id };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Unkeyed, command).await
}

impl Command for TestWebhook {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Option<WebhookState>, ApiError> {
        Ok(load_webhook(ctx, &self.webhook_id).await?.1)
    }

    /// The delivery's id follows from where the append lands.
    fn answer(&self, TestRequested { stream }: TestRequested, _: &Shell<'_>) -> Result<Decided, ApiError> {
        let webhook_id = self.webhook_id.clone();
        let answer = move |appended: platform::log::Appended| {
            let delivery_id = domain::webhooks::delivery_id(appended.last_position, &webhook_id);
            Answer::json(StatusCode::ACCEPTED, api::http::data_body(pending_delivery(&delivery_id, &webhook_id), &[]))
        };
        let decision = Decision::one(stream, Vec::new(), StatusCode::ACCEPTED, Value::Null);
        Ok(Decided::Append(decision.then(Then::Answer(Box::new(answer)))))
    }
}

#[tracing::instrument(skip_all)]
pub async fn test(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let command = TestWebhook { space_id: caller.space_id().into(), webhook_id: path.into_inner() };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Unkeyed, command).await
}

/// A new secret, drawn from the system's randomness.
fn new_secret() -> Secret {
    Secret::from_random(platform::crypto::random_bytes())
}

impl Command for CreateWebhook {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Creating, ApiError> {
        let schema_id = match &self.new.schema {
            Some(reference) => resolve_schema(ctx, &self.space_id, &self.new, reference).await?,
            None => String::new(),
        };
        let resolved = resolve_condition(ctx, &self.space_id, &self.new.condition, &self.condition).await?;
        Ok(Creating { schema_id, resolved, secret: new_secret() })
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }
}

#[tracing::instrument(skip_all)]
pub async fn create(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (caller, body) = prelude(&req, payload, &state).await?;
    let new = decide::parse_create(&body, state.settings.webhooks.allow_loopback)?;
    let command = CreateWebhook { space_id: caller.space_id().into(), new, condition: OnceCell::new() };
    let body = Value::Object(body);
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&body), command).await
}

impl Command for UpdateWebhook {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Updating, ApiError> {
        let (version, webhook) = load_webhook(ctx, &self.webhook_id).await?;
        // Refused before the body is checked against it or a filter is made.
        let current = decide::owned(&self.webhook_id, &self.space_id, webhook.as_ref())?.clone();
        let allow_loopback = ctx.state.settings.webhooks.allow_loopback;
        let update = decide::parse_update(&self.input, &current.document(), current.trigger, allow_loopback)?;
        let resolved = match &update.condition {
            Some(condition) => Some(resolve_condition(ctx, &self.space_id, condition, &self.condition).await?),
            None => None,
        };
        let counters = store::counters(&ctx.db().await?, &self.webhook_id).await?;
        Ok(Updating { version, current, update, resolved, counters })
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }

    fn lost_too_often(&self) -> ApiError {
        lost_too_often()
    }
}

#[tracing::instrument(skip_all, fields(webhook = %path.as_str()))]
pub async fn update(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (caller, body) = prelude(&req, payload, &state).await?;
    let identity = Value::Object(body.clone());
    let command = UpdateWebhook {
        space_id: caller.space_id().into(),
        webhook_id: path.into_inner(),
        input: body,
        condition: OnceCell::new(),
    };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&identity), command).await
}

impl Command for DeleteWebhook {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<(i64, Option<WebhookState>), ApiError> {
        load_webhook(ctx, &self.webhook_id).await
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }

    fn lost_too_often(&self) -> ApiError {
        lost_too_often()
    }
}

#[tracing::instrument(skip_all, fields(webhook = %path.as_str()))]
pub async fn delete(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let command = DeleteWebhook { space_id: caller.space_id().into(), webhook_id: path.into_inner() };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&Value::Null), command).await
}

impl Command for RotateSecret {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Rotating, ApiError> {
        let (version, webhook) = load_webhook(ctx, &self.webhook_id).await?;
        // A webhook not its owner's to change is refused before its key is read.
        let key = match decide::owned(&self.webhook_id, &self.space_id, webhook.as_ref()) {
            Ok(_) => store::secret_key(&ctx.db().await?, &self.webhook_id).await.map_err(ApiError::from)?,
            Err(_) => None,
        };
        Ok(Rotating { version, webhook, key, secret: new_secret() })
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }

    fn lost_too_often(&self) -> ApiError {
        lost_too_often()
    }
}

#[tracing::instrument(skip_all, fields(webhook = %path.as_str()))]
pub(crate) async fn rotate_secret(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let grace_ms =
        i64::try_from(state.settings.webhooks.rotation_grace_seconds.saturating_mul(1000)).unwrap_or(i64::MAX);
    let command = RotateSecret { space_id: caller.space_id().into(), webhook_id: path.into_inner(), grace_ms };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&Value::Null), command).await
}
