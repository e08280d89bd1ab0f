//! Webhook writes (write permission), on the command pipeline: `POST /webhooks`, `PATCH
//! /webhooks/{id}`, `DELETE /webhooks/{id}` and `POST /webhooks/{id}/rotate-secret`, each under
//! `Idempotency-Key`, and the owner's tools (replay a delivery, send a test). Each decides on
//! the webhook's stream and appends at its version. A body that sets a `custom filter`
//! condition counts in the `ai` bucket instead of the write bucket and spends one AI credit
//! when the filter is made (once per request, whatever the attempts).

use std::cell::OnceCell;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use ai_provider::AiError;
use api::auth::{Caller, Permission};
use api::ratelimit::Bucket;
use domain::webhooks::signing::Secret;
use domain::webhooks::state::{Counters, no_condition};
use platform::error::{ApiError, Code, Issue};
use platform::events::LogEvent;
use platform::ids::new_id;
use platform::log::{ExpectedVersion, Guard, StreamAppend};
use platform::proto;
use serde_json::{Map, Value, json};

use super::decide::{self, Condition, NewWebhook, Update};
use super::store::{self, WebhookState};
use crate::State;
use crate::pipeline::{self, Actor, Answer, Ctx, Decided, Decision, Given, Legacy, Protection, Then};

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

fn internal(error: &anyhow::Error) -> ApiError {
    ApiError::internal(error)
}

fn change(webhook_id: &str, expected: ExpectedVersion, event: LogEvent, at_ms: i64) -> StreamAppend {
    StreamAppend::one(store::stream_id(webhook_id), expected, event, at_ms)
}

/// The id of the schema `reference` names, which must fit the trigger.
async fn resolve_schema(ctx: &Ctx<'_>, caller: &Caller, new: &NewWebhook, reference: &str) -> Result<String, ApiError> {
    let catalog = ctx.catalog().await?;
    let client = ctx.db().await?;
    let schema = store::schema(&client, &catalog, caller.space_id(), reference)
        .await?
        .ok_or_else(|| ApiError::not_found(Code::SchemaNotFound, format!("no schema {reference:?} in this space")))?;
    decide::check_schema(new.trigger, &schema.schema_type)?;
    Ok(schema.schema_id)
}

/// A condition to store, the credits making it spent, and the guard that keeps a named
/// segment's stream where it was read.
#[derive(Clone)]
struct Resolved {
    condition: proto::WebhookCondition,
    credits: i64,
    segment_guard: Option<(String, i64)>,
}

impl Resolved {
    fn guard(&self) -> Option<Guard> {
        self.segment_guard.as_ref().map(|(stream, version)| Guard::stream_at(stream, *version))
    }
}

/// The condition to store for what the caller wrote. A custom filter is made once per request
/// (`made` keeps it across attempts) by the AI provider; it needs a credit.
async fn resolve_condition(
    ctx: &Ctx<'_>,
    caller: &Caller,
    condition: &Condition,
    made: &OnceCell<Resolved>,
) -> Result<Resolved, ApiError> {
    let requirements = match condition {
        Condition::None => return Ok(Resolved { condition: no_condition(), credits: 0, segment_guard: None }),
        Condition::Segment { segment_id } => {
            let client = ctx.db().await?;
            let version = crate::segments::store::load_live(&client, caller.space_id(), segment_id).await?;
            let condition = proto::WebhookCondition {
                r#type: "segment".to_owned(),
                description: String::new(),
                expression: String::new(),
                segment_id: segment_id.clone(),
            };
            let segment_guard = Some((crate::segments::store::stream_id(segment_id), version));
            return Ok(Resolved { condition, credits: 0, segment_guard });
        }
        Condition::CustomFilter { requirements } => requirements,
    };
    if let Some(resolved) = made.get() {
        return Ok(resolved.clone());
    }
    let catalog = ctx.catalog().await?;
    let credits = reads::catalog::credits(&ctx.db().await?, &catalog, caller.space_id()).await?;
    if credits <= 0 {
        return Err(ApiError::new(
            StatusCode::PAYMENT_REQUIRED,
            Some(Code::InsufficientCredits),
            "the space has no AI credits left; a custom filter condition needs one",
        ));
    }
    let made_now = match ctx.state.ai.filter(requirements).await {
        // A webhook's filter reads the delivered document alone: no events performed, no
        // emails opened or clicked.
        Ok(filter) if !filter::performed_parts(&filter).is_empty() || !filter::engaged_parts(&filter).is_empty() => {
            let message = "`performed`, `opened` and `clicked` are for segments: a webhook's custom filter reads \
                           the delivered data; use a segment condition instead";
            Err(ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, Some(Code::AiGenerationFailed), message)
                .with_issues(vec![Issue::coded("condition.requirements", Code::AiGenerationFailed, message)]))
        }
        Ok(filter) => Ok(Resolved {
            condition: proto::WebhookCondition {
                r#type: "custom filter".to_owned(),
                description: filter::describe(&filter),
                expression: serde_json::to_string(&filter).map_err(|error| internal(&error.into()))?,
                segment_id: String::new(),
            },
            credits: 1,
            segment_guard: None,
        }),
        // Well-formed but not turned into a filter: the contract's 422 for a failed AI
        // generation. Nothing is spent or written.
        Err(AiError::Refused(reason) | AiError::Unfit(reason)) => {
            let message = format!("the requirements could not be turned into a filter: {reason}");
            Err(ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, Some(Code::AiGenerationFailed), message.clone())
                .with_issues(vec![Issue::coded("condition.requirements", Code::AiGenerationFailed, message)]))
        }
        Err(error) => Err(ApiError::unavailable(format!("{error}; retry with the same Idempotency-Key"))),
    }?;
    Ok(made.get_or_init(|| made_now).clone())
}

/// A webhook of the caller's space that is not deleted; 404 otherwise (also for another
/// space's).
async fn load_live(ctx: &Ctx<'_>, caller: &Caller, webhook_id: &str) -> Result<(i64, WebhookState), ApiError> {
    let client = ctx.db().await?;
    let (version, current) = store::load(&client, webhook_id).await.map_err(|error| internal(&error))?;
    match current {
        Some(webhook) if !webhook.deleted && webhook.space_id == caller.space_id() => Ok((version, webhook)),
        _ => Err(ApiError::not_found(Code::WebhookNotFound, format!("no webhook {webhook_id:?} in this space"))),
    }
}

/// [`load_live`], and one its owner may change: 409 when an integration owns it.
async fn load_owned(ctx: &Ctx<'_>, caller: &Caller, webhook_id: &str) -> Result<(i64, WebhookState), ApiError> {
    let (version, webhook) = load_live(ctx, caller, webhook_id).await?;
    if let Some(vendor) = &webhook.integration_vendor_name {
        return Err(ApiError::conflict(
            Code::WebhookIntegrationOwned,
            format!(
                "webhook {webhook_id} is owned by the {vendor} integration: change it there, or in the workspace \
                 file that declares it (an apply without it deletes it)"
            ),
        ));
    }
    Ok((version, webhook))
}

/// A delivery as the owner's tools show it when it was just queued again.
fn pending_delivery(delivery_id: &str, webhook_id: &str) -> Value {
    api::http::data_body(json!({"id": delivery_id, "webhookId": webhook_id, "status": "pending"}), &[])
}

/// `POST /webhooks/{id}/deliveries/{deliveryId}/replay`: attempts a delivery that is over
/// (delivered, failed or dropped) again, with the same id, URL and body, as soon as the
/// enqueue worker has put it back in the outbox.
struct ReplayDelivery<'a> {
    caller: &'a Caller,
    webhook_id: String,
    delivery_id: String,
}

impl Legacy for ReplayDelivery<'_> {
    type Loaded = ();

    async fn load(&self, ctx: &Ctx<'_>) -> Result<(), ApiError> {
        load_live(ctx, self.caller, &self.webhook_id).await?;
        let delivery_state =
            store::delivery_state(&ctx.db().await?, &self.webhook_id, &self.delivery_id).await?.ok_or_else(|| {
                ApiError::not_found(
                    Code::WebhookDeliveryNotFound,
                    format!("no delivery {:?} of this webhook", self.delivery_id),
                )
            })?;
        if delivery_state == "pending" {
            return Err(ApiError::conflict(
                Code::WebhookDeliveryPending,
                format!("delivery {} is still queued; it is attempted without a replay", self.delivery_id),
            ));
        }
        Ok(())
    }

    fn decide(&self, (): (), given: &Given<'_>) -> Result<Decided, ApiError> {
        let event = LogEvent::WebhookDeliveryReplayRequested(proto::WebhookDeliveryReplayRequested {
            webhook_id: self.webhook_id.clone(),
            space_id: self.caller.space_id().to_owned(),
            delivery_id: self.delivery_id.clone(),
            requested_at_ms: given.now_ms,
        });
        let stream = change(&self.webhook_id, ExpectedVersion::Any, event, given.now_ms);
        let body = pending_delivery(&self.delivery_id, &self.webhook_id);
        Ok(Decided::Append(Decision::one(stream, Vec::new(), StatusCode::ACCEPTED, body)))
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
    let command = ReplayDelivery { caller: &caller, webhook_id, delivery_id };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Unkeyed, command).await
}

/// `POST /webhooks/{id}/test`: enqueues one `webhook.test` delivery, whose id follows from the
/// request's position in the log.
struct TestWebhook<'a> {
    caller: &'a Caller,
    webhook_id: String,
}

impl Legacy for TestWebhook<'_> {
    type Loaded = ();

    async fn load(&self, ctx: &Ctx<'_>) -> Result<(), ApiError> {
        load_live(ctx, self.caller, &self.webhook_id).await.map(|_| ())
    }

    fn decide(&self, (): (), given: &Given<'_>) -> Result<Decided, ApiError> {
        let event = LogEvent::WebhookTestRequested(proto::WebhookTestRequested {
            webhook_id: self.webhook_id.clone(),
            space_id: self.caller.space_id().to_owned(),
            requested_at_ms: given.now_ms,
        });
        let stream = change(&self.webhook_id, ExpectedVersion::Any, event, given.now_ms);
        let webhook_id = self.webhook_id.clone();
        let answer = move |appended: platform::log::Appended| {
            let delivery_id = domain::webhooks::delivery_id(appended.last_position, &webhook_id);
            Answer::json(StatusCode::ACCEPTED, pending_delivery(&delivery_id, &webhook_id))
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
    let command = TestWebhook { caller: &caller, webhook_id: path.into_inner() };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Unkeyed, command).await
}

/// A new secret sealed under the webhook's key (the key created when `key` is `None`, with
/// the guard that stores it).
fn seal_secret(
    webhook_id: &str,
    space_id: &str,
    key: Option<platform::crypto::DataKey>,
) -> Result<(Secret, proto::Sealed, Option<Guard>), ApiError> {
    let subject = store::secret_subject(webhook_id);
    let (key, guard) = match key {
        Some(key) => (key, None),
        None => {
            let (key, wrapped) = platform::crypto::keyring()
                .and_then(|keyring| keyring.generate(&subject))
                .map_err(|error| internal(&error))?;
            (key, Some(store::store_secret_key(webhook_id, space_id, wrapped)))
        }
    };
    let secret = Secret::from_random(platform::crypto::random_bytes());
    let mut sealed = platform::events::seal(&subject, &proto::WebhookSecret { secret: secret.reveal() });
    platform::events::encrypt(&mut sealed, &key).map_err(|error| internal(&error))?;
    Ok((secret, sealed, guard))
}

/// `POST /webhooks`.
struct CreateWebhook<'a> {
    caller: &'a Caller,
    new: NewWebhook,
    condition: OnceCell<Resolved>,
}

impl Legacy for CreateWebhook<'_> {
    type Loaded = (String, Resolved);

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let schema_id = match &self.new.schema {
            Some(reference) => resolve_schema(ctx, self.caller, &self.new, reference).await?,
            None => String::new(),
        };
        Ok((schema_id, resolve_condition(ctx, self.caller, &self.new.condition, &self.condition).await?))
    }

    fn decide(&self, (schema_id, resolved): Self::Loaded, given: &Given<'_>) -> Result<Decided, ApiError> {
        let (new, now) = (&self.new, given.now_ms);
        let webhook_id = new_id("wh");
        let space_id = self.caller.space_id();
        let (secret, sealed, key_guard) = seal_secret(&webhook_id, space_id, None)?;
        let event = LogEvent::WebhookCreated(proto::WebhookCreated {
            webhook_id: webhook_id.clone(),
            space_id: space_id.to_owned(),
            url: new.url.clone(),
            trigger: new.trigger.as_str().to_owned(),
            email_event_types: new.email_event_types.clone(),
            schema_id,
            condition: Some(resolved.condition.clone()),
            secret: Some(sealed),
            integration_vendor_name: String::new(),
            created_at_ms: now,
        });
        let webhook = WebhookState::apply(None, &event)
            .ok_or_else(|| internal(&anyhow::anyhow!("a created webhook has a state")))?;
        let mut document = webhook.document();
        Counters::default().merge_into(&mut document);
        document["signatureVerificationSecret"] = json!(secret.reveal());
        let body = api::http::data_body(document, &[]);
        let guards = key_guard
            .into_iter()
            .chain((resolved.credits > 0).then(|| domain::admission::spend_guard(space_id, resolved.credits)))
            .chain(resolved.guard())
            .collect();
        let stream = change(&webhook_id, ExpectedVersion::NoStream, event, now);
        Ok(Decided::Append(Decision::one(stream, guards, StatusCode::CREATED, body)))
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
    let command = CreateWebhook { caller: &caller, new, condition: OnceCell::new() };
    let body = Value::Object(body);
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&body), command).await
}

/// `PATCH /webhooks/{id}`: decided on the webhook's stream, appended at its version.
struct UpdateWebhook<'a> {
    caller: &'a Caller,
    webhook_id: String,
    input: Map<String, Value>,
    condition: OnceCell<Resolved>,
}

impl Legacy for UpdateWebhook<'_> {
    type Loaded = (i64, WebhookState, Update, Option<Resolved>, Counters);

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let (version, current) = load_owned(ctx, self.caller, &self.webhook_id).await?;
        let allow_loopback = ctx.state.settings.webhooks.allow_loopback;
        let update = decide::parse_update(&self.input, &current.document(), current.trigger, allow_loopback)?;
        let resolved = match &update.condition {
            Some(condition) => Some(resolve_condition(ctx, self.caller, condition, &self.condition).await?),
            None => None,
        };
        let counters = store::counters(&ctx.db().await?, &self.webhook_id).await?;
        Ok((version, current, update, resolved, counters))
    }

    fn decide(&self, loaded: Self::Loaded, given: &Given<'_>) -> Result<Decided, ApiError> {
        let (version, current, update, resolved, mut counters) = loaded;
        let (webhook_id, now) = (self.webhook_id.as_str(), given.now_ms);
        if update == Update::default() {
            // The body only echoed the webhook as shown: nothing changes.
            let mut document = current.document();
            counters.merge_into(&mut document);
            return Ok(Decided::Answer(Answer::json(StatusCode::OK, api::http::data_body(document, &[]))));
        }
        let set_live = update.live == Some(true);
        if set_live {
            counters.failed_calls_in_a_row = 0;
        }
        let event = LogEvent::WebhookUpdated(proto::WebhookUpdated {
            webhook_id: webhook_id.to_owned(),
            space_id: self.caller.space_id().to_owned(),
            url: update.url.clone(),
            email_event_types_set: update.email_event_types.is_some(),
            email_event_types: update.email_event_types.clone().unwrap_or_default(),
            condition: resolved.as_ref().map(|resolved| resolved.condition.clone()),
            status: update.live.map(|live| if live { "live" } else { "paused" }.to_owned()),
            updated_at_ms: now,
        });
        let next = WebhookState::apply(Some(current), &event)
            .ok_or_else(|| internal(&anyhow::anyhow!("an updated webhook has a state")))?;
        let mut document = next.document();
        counters.merge_into(&mut document);
        let credits = resolved.as_ref().map_or(0, |resolved| resolved.credits);
        let guards = set_live
            .then(|| store::clear_failures(webhook_id))
            .into_iter()
            .chain((credits > 0).then(|| domain::admission::spend_guard(self.caller.space_id(), credits)))
            .chain(resolved.as_ref().and_then(Resolved::guard))
            .collect();
        let stream = change(webhook_id, ExpectedVersion::Exactly(version), event, now);
        let body = api::http::data_body(document, &[]);
        Ok(Decided::Append(Decision::one(stream, guards, StatusCode::OK, body)))
    }

    fn lost_too_often(&self) -> ApiError {
        lost_too_often()
    }
}

fn lost_too_often() -> ApiError {
    ApiError::conflict(Code::ConcurrentModification, "the webhook kept changing while this write was applied; retry")
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
    let command =
        UpdateWebhook { caller: &caller, webhook_id: path.into_inner(), input: body, condition: OnceCell::new() };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&identity), command).await
}

/// `DELETE /webhooks/{id}`: shreds the key of its secrets and blanks recorded answers that
/// hold one.
struct DeleteWebhook<'a> {
    caller: &'a Caller,
    webhook_id: String,
}

impl Legacy for DeleteWebhook<'_> {
    type Loaded = i64;

    async fn load(&self, ctx: &Ctx<'_>) -> Result<i64, ApiError> {
        Ok(load_owned(ctx, self.caller, &self.webhook_id).await?.0)
    }

    fn decide(&self, version: i64, given: &Given<'_>) -> Result<Decided, ApiError> {
        let webhook_id = self.webhook_id.as_str();
        let event = LogEvent::WebhookDeleted(proto::WebhookDeleted {
            webhook_id: webhook_id.to_owned(),
            space_id: self.caller.space_id().to_owned(),
            deleted_at_ms: given.now_ms,
        });
        let stream = change(webhook_id, ExpectedVersion::Exactly(version), event, given.now_ms);
        let guards = vec![store::shred_secret_key(webhook_id), store::blank_recorded_secrets(webhook_id)];
        let body = api::http::data_body(json!({"id": webhook_id, "deleted": true}), &[]);
        Ok(Decided::Append(Decision::one(stream, guards, StatusCode::OK, body)))
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
    let command = DeleteWebhook { caller: &caller, webhook_id: path.into_inner() };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&Value::Null), command).await
}

/// `POST /webhooks/{id}/rotate-secret`: a new secret; the previous one signs too for the grace
/// period.
struct RotateSecret<'a> {
    caller: &'a Caller,
    webhook_id: String,
    grace_ms: i64,
}

impl Legacy for RotateSecret<'_> {
    type Loaded = (i64, Option<platform::crypto::DataKey>);

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let (version, _) = load_owned(ctx, self.caller, &self.webhook_id).await?;
        let key = store::secret_key(&ctx.db().await?, &self.webhook_id).await.map_err(|error| internal(&error))?;
        Ok((version, key))
    }

    fn decide(&self, (version, key): Self::Loaded, given: &Given<'_>) -> Result<Decided, ApiError> {
        let (webhook_id, now) = (self.webhook_id.as_str(), given.now_ms);
        let (secret, sealed, key_guard) = seal_secret(webhook_id, self.caller.space_id(), key)?;
        let body = json!({
            "id": webhook_id,
            "signatureVerificationSecret": secret.reveal(),
            "updatedAt": platform::time::format_millis(now),
        });
        let event = LogEvent::WebhookSecretRotated(proto::WebhookSecretRotated {
            webhook_id: webhook_id.to_owned(),
            space_id: self.caller.space_id().to_owned(),
            secret: Some(sealed),
            previous_valid_until_ms: now.saturating_add(self.grace_ms),
            rotated_at_ms: now,
        });
        let stream = change(webhook_id, ExpectedVersion::Exactly(version), event, now);
        let body = api::http::data_body(body, &[]);
        Ok(Decided::Append(Decision::one(stream, key_guard.into_iter().collect(), StatusCode::OK, body)))
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
    let command = RotateSecret { caller: &caller, webhook_id: path.into_inner(), grace_ms };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&Value::Null), command).await
}
