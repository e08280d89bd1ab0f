//! Webhook writes (write permission): `POST /webhooks`, `PATCH /webhooks/{id}`, `DELETE
//! /webhooks/{id}` and `POST /webhooks/{id}/rotate-secret`, each under `Idempotency-Key`.
//! A body that sets a `custom filter` condition counts in the `ai` bucket instead of the
//! write bucket and spends one AI credit when the filter is made.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Map, Value, json};
use shared::ai::AiError;
use shared::auth::{Caller, Permission};
use shared::catalog::CATALOG;
use shared::error::{ApiError, Code, Issue};
use shared::events::LogEvent;
use shared::ids::new_id;
use shared::log::{AppendError, Appended, ExpectedVersion, Guard, StreamAppend};
use shared::proto;
use shared::ratelimit::Bucket;
use shared::webhooks::signing::Secret;
use shared::webhooks::state::{Counters, no_condition};

use super::decide::{self, Condition, NewWebhook};
use super::store::{self, WebhookState};
use crate::State;
use crate::edge::{append_error, respond};
use crate::idempotency::{self, Claim};

/// How often a write that lost a race on the webhook's stream is decided again.
const ATTEMPTS: usize = 3;

/// Authenticates (in the bucket the body asks for) and reads the body.
async fn prelude(
    req: &HttpRequest,
    payload: web::Payload,
    state: &State,
) -> Result<(Caller, Map<String, Value>), ApiError> {
    let body = shared::http::read_json_object(req, payload).await;
    let custom_filter = body.as_ref().is_ok_and(|body| {
        body.get("condition").and_then(|condition| condition.get("type")).and_then(Value::as_str)
            == Some("custom filter")
    });
    let bucket = if custom_filter { Bucket::Ai } else { Bucket::Write };
    let caller = state.authenticator.authorize_in(req, Permission::Write, bucket).await?;
    Ok((caller, body?))
}

fn internal(error: &anyhow::Error) -> ApiError {
    ApiError::internal(error)
}

/// Appends one webhook stream change with its guards (and the claim's completion).
async fn append(
    req: &HttpRequest,
    state: &State,
    caller: &Caller,
    claim: Option<&Claim>,
    stream: StreamAppend,
    guards: Vec<Guard>,
) -> Result<Appended, AppendError> {
    crate::edge::append(state, req, caller, claim, vec![stream], guards).await
}

fn change(webhook_id: &str, expected: ExpectedVersion, event: LogEvent, at_ms: i64) -> StreamAppend {
    StreamAppend::one(store::stream_id(webhook_id), expected, event, at_ms)
}

/// The id of the schema `reference` names, which must fit the trigger.
async fn resolve_schema(state: &State, caller: &Caller, new: &NewWebhook, reference: &str) -> Result<String, ApiError> {
    let models = state.read_models.wait_for(&[CATALOG], 0, state.settings.consistency_wait()).await?;
    let client = state.pool.get().await?;
    let schema = store::schema(&client, &models.schema(CATALOG), caller.space_id(), reference)
        .await?
        .ok_or_else(|| ApiError::not_found(Code::SchemaNotFound, format!("no schema {reference:?} in this space")))?;
    decide::check_schema(new.trigger, &schema.schema_type)?;
    Ok(schema.schema_id)
}

/// The condition to store for what the caller wrote, and the credits making it spent. A
/// custom filter is made once, here, by the AI provider; it needs a credit.
async fn resolve_condition(
    state: &State,
    caller: &Caller,
    condition: &Condition,
) -> Result<(proto::WebhookCondition, i64), ApiError> {
    let requirements = match condition {
        Condition::None => return Ok((no_condition(), 0)),
        Condition::Segment { segment_id } => {
            let client = state.pool.get().await?;
            crate::segments::http::load_live(&client, caller.space_id(), segment_id).await?;
            let condition = proto::WebhookCondition {
                r#type: "segment".to_owned(),
                description: String::new(),
                expression: String::new(),
                segment_id: segment_id.clone(),
            };
            return Ok((condition, 0));
        }
        Condition::CustomFilter { requirements } => requirements,
    };
    let models = state.read_models.wait_for(&[CATALOG], 0, state.settings.consistency_wait()).await?;
    let client = state.pool.get().await?;
    let credits = shared::catalog::credits(&client, &models.schema(CATALOG), caller.space_id()).await?;
    drop(client);
    if credits <= 0 {
        return Err(ApiError::new(
            StatusCode::PAYMENT_REQUIRED,
            Some(Code::InsufficientCredits),
            "the space has no AI credits left; a custom filter condition needs one",
        ));
    }
    match state.ai.filter(requirements).await {
        // A webhook's filter reads the delivered document alone: no events performed.
        Ok(filter) if !shared::filter::performed_parts(&filter).is_empty() => {
            let message = "`performed` is for segments: a webhook's custom filter reads the delivered data; \
                           use a segment condition instead";
            Err(ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, Some(Code::AiGenerationFailed), message)
                .with_issues(vec![Issue::coded("condition.requirements", Code::AiGenerationFailed, message)]))
        }
        Ok(filter) => Ok((
            proto::WebhookCondition {
                r#type: "custom filter".to_owned(),
                description: shared::filter::describe(&filter),
                expression: serde_json::to_string(&filter).map_err(|error| internal(&error.into()))?,
                segment_id: String::new(),
            },
            1,
        )),
        // Well-formed but not turned into a filter: the contract's 422 for a failed AI
        // generation. Nothing is spent or written.
        Err(AiError::Refused(reason) | AiError::Unfit(reason)) => {
            let message = format!("the requirements could not be turned into a filter: {reason}");
            Err(ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, Some(Code::AiGenerationFailed), message.clone())
                .with_issues(vec![Issue::coded("condition.requirements", Code::AiGenerationFailed, message)]))
        }
        Err(error) => Err(ApiError::unavailable(format!("{error}; retry with the same Idempotency-Key"))),
    }
}

/// A webhook of the caller's space that is not deleted; 404 otherwise (also for another
/// space's).
async fn load_live(state: &State, caller: &Caller, webhook_id: &str) -> Result<(i64, WebhookState), ApiError> {
    let client = state.pool.get().await?;
    let (version, current) = store::load(&client, webhook_id).await.map_err(|error| internal(&error))?;
    match current {
        Some(webhook) if !webhook.deleted && webhook.space_id == caller.space_id() => Ok((version, webhook)),
        _ => Err(ApiError::not_found(Code::WebhookNotFound, format!("no webhook {webhook_id:?} in this space"))),
    }
}

/// [`load_live`], and one its owner may change: 409 when an integration owns it.
async fn load_owned(state: &State, caller: &Caller, webhook_id: &str) -> Result<(i64, WebhookState), ApiError> {
    let (version, webhook) = load_live(state, caller, webhook_id).await?;
    if let Some(vendor) = &webhook.integration_vendor_name {
        return Err(ApiError::conflict(
            Code::WebhookIntegrationOwned,
            format!("webhook {webhook_id} is owned by the {vendor} integration; change it there"),
        ));
    }
    Ok((version, webhook))
}

/// Appends one request about a webhook that changes nothing of it (a replay, a test).
async fn append_request(
    req: &HttpRequest,
    state: &State,
    caller: &Caller,
    webhook_id: &str,
    event: LogEvent,
) -> Result<Appended, ApiError> {
    let now = shared::time::now_millis();
    let stream = change(webhook_id, ExpectedVersion::Any, event, now);
    append(req, state, caller, None, stream, Vec::new()).await.map_err(crate::edge::append_error)
}

/// `POST /webhooks/{id}/deliveries/{deliveryId}/replay`: attempts a delivery that is over
/// (delivered, failed or dropped) again, with the same id, URL and body, as soon as the
/// enqueue worker has put it back in the outbox.
#[tracing::instrument(skip_all)]
pub async fn replay_delivery(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = state.authenticator.authorize(&req, Permission::Write).await?;
    let (webhook_id, delivery_id) = path.into_inner();
    load_live(&state, &caller, &webhook_id).await?;
    let delivery_state =
        store::delivery_state(&state.pool.get().await?, &webhook_id, &delivery_id).await?.ok_or_else(|| {
            ApiError::not_found(Code::WebhookDeliveryNotFound, format!("no delivery {delivery_id:?} of this webhook"))
        })?;
    if delivery_state == "pending" {
        return Err(ApiError::conflict(
            Code::WebhookDeliveryPending,
            format!("delivery {delivery_id} is still queued; it is attempted without a replay"),
        ));
    }
    let event = LogEvent::WebhookDeliveryReplayRequested(proto::WebhookDeliveryReplayRequested {
        webhook_id: webhook_id.clone(),
        space_id: caller.space_id().to_owned(),
        delivery_id: delivery_id.clone(),
        requested_at_ms: shared::time::now_millis(),
    });
    let appended = append_request(&req, &state, &caller, &webhook_id, event).await?;
    let body = shared::http::data_body(json!({"id": delivery_id, "webhookId": webhook_id, "status": "pending"}), &[]);
    Ok(respond(StatusCode::ACCEPTED, &body, &new_id("op"), Some(appended)))
}

/// `POST /webhooks/{id}/test`: enqueues one `webhook.test` delivery.
#[tracing::instrument(skip_all)]
pub async fn test(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = state.authenticator.authorize(&req, Permission::Write).await?;
    let webhook_id = path.into_inner();
    load_live(&state, &caller, &webhook_id).await?;
    let event = LogEvent::WebhookTestRequested(proto::WebhookTestRequested {
        webhook_id: webhook_id.clone(),
        space_id: caller.space_id().to_owned(),
        requested_at_ms: shared::time::now_millis(),
    });
    let appended = append_request(&req, &state, &caller, &webhook_id, event).await?;
    let delivery_id = shared::webhooks::delivery_id(appended.last_position, &webhook_id);
    let body = shared::http::data_body(json!({"id": delivery_id, "webhookId": webhook_id, "status": "pending"}), &[]);
    Ok(respond(StatusCode::ACCEPTED, &body, &new_id("op"), Some(appended)))
}

fn lost_too_often() -> ApiError {
    ApiError::conflict(Code::ConcurrentModification, "the webhook kept changing while this write was applied; retry")
}

/// A new secret sealed under the webhook's key (the key created when `key` is `None`, with
/// the guard that stores it).
fn seal_secret(
    webhook_id: &str,
    space_id: &str,
    key: Option<shared::crypto::DataKey>,
) -> Result<(Secret, proto::Sealed, Option<Guard>), ApiError> {
    let subject = store::secret_subject(webhook_id);
    let (key, guard) = match key {
        Some(key) => (key, None),
        None => {
            let (key, wrapped) = shared::crypto::keyring()
                .and_then(|keyring| keyring.generate(&subject))
                .map_err(|error| internal(&error))?;
            (key, Some(store::store_secret_key(webhook_id, space_id, wrapped)))
        }
    };
    let secret = Secret::generate();
    let mut sealed = shared::events::seal(&subject, &proto::WebhookSecret { secret: secret.reveal() });
    shared::events::encrypt(&mut sealed, &key).map_err(|error| internal(&error))?;
    Ok((secret, sealed, guard))
}

#[tracing::instrument(skip_all)]
pub async fn create(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (caller, body) = prelude(&req, payload, &state).await?;
    let new = decide::parse_create(&body, state.settings.webhooks.allow_loopback)?;
    let (req, state, caller, new) = (&req, &**state, &caller, &new);
    idempotency::protect(state, req, caller, &Value::Object(body), |claim, operation_id| async move {
        let schema_id = match &new.schema {
            Some(reference) => resolve_schema(state, caller, new, reference).await?,
            None => String::new(),
        };
        let (condition, credits) = resolve_condition(state, caller, &new.condition).await?;
        let webhook_id = new_id("wh");
        let space_id = caller.space_id();
        let (secret, sealed, key_guard) = seal_secret(&webhook_id, space_id, None)?;
        let now = shared::time::now_millis();
        let event = LogEvent::WebhookCreated(proto::WebhookCreated {
            webhook_id: webhook_id.clone(),
            space_id: space_id.to_owned(),
            url: new.url.clone(),
            trigger: new.trigger.as_str().to_owned(),
            email_event_types: new.email_event_types.clone(),
            schema_id,
            condition: Some(condition),
            secret: Some(sealed),
            integration_vendor_name: String::new(),
            created_at_ms: now,
        });
        let webhook = WebhookState::apply(None, &event)
            .ok_or_else(|| internal(&anyhow::anyhow!("a created webhook has a state")))?;
        let mut document = webhook.document();
        Counters::default().merge_into(&mut document);
        document["signatureVerificationSecret"] = json!(secret.reveal());
        let body = shared::http::data_body(document, &[]);
        let guards = key_guard
            .into_iter()
            .chain((credits > 0).then(|| shared::admission::spend_guard(space_id, credits)))
            .chain(claim.as_ref().map(|claim| claim.completion(StatusCode::CREATED, &body)))
            .collect();
        let stream = change(&webhook_id, ExpectedVersion::NoStream, event, now);
        let appended = append(req, state, caller, claim.as_ref(), stream, guards).await.map_err(append_error)?;
        Ok(respond(StatusCode::CREATED, &body, &operation_id, Some(appended)))
    })
    .await
}

/// A change of an owned webhook, planned against its current state.
struct Planned {
    event: LogEvent,
    status: StatusCode,
    body: Value,
    guards: Vec<Guard>,
}

/// Plans a change against the webhook's current state (and the time of the change), then
/// appends it at the stream's version with the claim's completion; decides again when a
/// concurrent change won the race. `current` is the state already loaded, if any.
async fn change_owned(
    (req, state, caller): (&HttpRequest, &State, &Caller),
    webhook_id: &str,
    (claim, operation_id): (Option<&Claim>, &str),
    mut current: Option<(i64, WebhookState)>,
    mut plan: impl FnMut(&WebhookState, i64) -> Result<Planned, ApiError>,
) -> Result<HttpResponse, ApiError> {
    for _ in 0..ATTEMPTS {
        let (version, webhook) = match current.take() {
            Some(loaded) => loaded,
            None => load_owned(state, caller, webhook_id).await?,
        };
        let now = shared::time::now_millis();
        let Planned { event, status, body, guards } = plan(&webhook, now)?;
        let guards = guards.into_iter().chain(claim.map(|claim| claim.completion(status, &body))).collect();
        let stream = change(webhook_id, ExpectedVersion::Exactly(version), event, now);
        match append(req, state, caller, claim, stream, guards).await {
            Ok(appended) => return Ok(respond(status, &body, operation_id, Some(appended))),
            Err(AppendError::WrongVersion { .. }) => continue,
            Err(error) => return Err(append_error(error)),
        }
    }
    Err(lost_too_often())
}

#[tracing::instrument(skip_all, fields(webhook = %path.as_str()))]
pub async fn update(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (caller, body) = prelude(&req, payload, &state).await?;
    let (req, state, caller, webhook_id, input) = (&req, &**state, &caller, path.as_str(), &body);
    idempotency::protect(state, req, caller, &Value::Object(body.clone()), |claim, operation_id| async move {
        let (version, current) = load_owned(state, caller, webhook_id).await?;
        let update = decide::parse_update(input, current.trigger, state.settings.webhooks.allow_loopback)?;
        let (condition, credits) = match &update.condition {
            Some(condition) => {
                let (condition, credits) = resolve_condition(state, caller, condition).await?;
                (Some(condition), credits)
            }
            None => (None, 0),
        };
        let set_live = update.live == Some(true);
        let mut counters = store::counters(&state.pool.get().await?, webhook_id).await?;
        if set_live {
            counters.failed_calls_in_a_row = 0;
        }
        let context = (req, state, caller);
        let answer = (claim.as_ref(), operation_id.as_str());
        change_owned(context, webhook_id, answer, Some((version, current)), |current, now| {
            let event = LogEvent::WebhookUpdated(proto::WebhookUpdated {
                webhook_id: webhook_id.to_owned(),
                space_id: caller.space_id().to_owned(),
                url: update.url.clone(),
                email_event_types_set: update.email_event_types.is_some(),
                email_event_types: update.email_event_types.clone().unwrap_or_default(),
                condition: condition.clone(),
                status: update.live.map(|live| if live { "live" } else { "paused" }.to_owned()),
                updated_at_ms: now,
            });
            let next = WebhookState::apply(Some(current.clone()), &event)
                .ok_or_else(|| internal(&anyhow::anyhow!("an updated webhook has a state")))?;
            let mut document = next.document();
            counters.merge_into(&mut document);
            let guards = set_live
                .then(|| store::clear_failures(webhook_id))
                .into_iter()
                .chain((credits > 0).then(|| shared::admission::spend_guard(caller.space_id(), credits)))
                .collect();
            Ok(Planned { event, status: StatusCode::OK, body: shared::http::data_body(document, &[]), guards })
        })
        .await
    })
    .await
}

#[tracing::instrument(skip_all, fields(webhook = %path.as_str()))]
pub async fn delete(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = state.authenticator.authorize(&req, Permission::Write).await?;
    let (req, state, caller, webhook_id) = (&req, &**state, &caller, path.as_str());
    idempotency::protect(state, req, caller, &Value::Null, |claim, operation_id| async move {
        let answer = (claim.as_ref(), operation_id.as_str());
        change_owned((req, state, caller), webhook_id, answer, None, |_, now| {
            Ok(Planned {
                event: LogEvent::WebhookDeleted(proto::WebhookDeleted {
                    webhook_id: webhook_id.to_owned(),
                    space_id: caller.space_id().to_owned(),
                    deleted_at_ms: now,
                }),
                status: StatusCode::OK,
                body: shared::http::data_body(json!({"id": webhook_id, "deleted": true}), &[]),
                guards: vec![store::shred_secret_key(webhook_id), store::blank_recorded_secrets(webhook_id)],
            })
        })
        .await
    })
    .await
}

#[tracing::instrument(skip_all, fields(webhook = %path.as_str()))]
pub async fn rotate_secret(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = state.authenticator.authorize(&req, Permission::Write).await?;
    let (req, state, caller, webhook_id) = (&req, &**state, &caller, path.as_str());
    idempotency::protect(state, req, caller, &Value::Null, |claim, operation_id| async move {
        let current = load_owned(state, caller, webhook_id).await?;
        let key = store::secret_key(&state.pool.get().await?, webhook_id).await.map_err(|e| internal(&e))?;
        let grace_ms =
            i64::try_from(state.settings.webhooks.rotation_grace_seconds.saturating_mul(1000)).unwrap_or(i64::MAX);
        let answer = (claim.as_ref(), operation_id.as_str());
        change_owned((req, state, caller), webhook_id, answer, Some(current), |_, now| {
            let (secret, sealed, key_guard) = seal_secret(webhook_id, caller.space_id(), key.clone())?;
            let body = json!({
                "id": webhook_id,
                "signatureVerificationSecret": secret.reveal(),
                "updatedAt": shared::time::format_millis(now),
            });
            Ok(Planned {
                event: LogEvent::WebhookSecretRotated(proto::WebhookSecretRotated {
                    webhook_id: webhook_id.to_owned(),
                    space_id: caller.space_id().to_owned(),
                    secret: Some(sealed),
                    previous_valid_until_ms: now.saturating_add(grace_ms),
                    rotated_at_ms: now,
                }),
                status: StatusCode::OK,
                body: shared::http::data_body(body, &[]),
                guards: key_guard.into_iter().collect(),
            })
        })
        .await
    })
    .await
}
