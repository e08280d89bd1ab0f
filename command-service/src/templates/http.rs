//! `POST /templates/{templateId}/send`.
//!
//! 1. The body is `{data: {<key>: {record fields}}}`; stored content cannot be replaced.
//! 2. Each context record is upserted by identity precedence (or its `id`), decided together.
//! 3. The recipient (the template's `recipient` key) is checked: suppressions for every
//!    template, consent and the topic subscription for marketing (422, D9).
//! 4. The template is rendered; `EmailScheduled` (content sealed under the contact's key) is
//!    appended with the context records, the outbox row and the allowance count, in one
//!    transaction (402 `email_limit_reached` when the month's allowance is used up).
//! 5. The message is handed to the relay inline and the outcome recorded; the answer is
//!    200 `{emailId, status, error}`. A hand-off whose end is unknown answers 503
//!    `idempotency_outcome_unknown` and is never retried blindly.

use std::collections::BTreeMap;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::Value;
use shared::auth::{Caller, Permission};
use shared::catalog::{self, CATALOG};
use shared::email::outbox::{self, Handed, Prepared};
pub use shared::email::send::{Authored, EmailTo, Scheduled};
use shared::email::{render, send};
use shared::error::{ApiError, Code};
use shared::events::LogEvent;
use shared::log::{AppendError, Guard};

use super::decide::{self, Recipient};
use crate::State;
use crate::edge::{append_error, respond};
use crate::idempotency::{self, Claim};
use crate::records::decide::WriteSchema;
use crate::records::http::{PlannedUpsert, plan_upsert, write_context};

/// How often a send whose context records lost a race is decided again.
const ATTEMPTS: usize = 3;

/// The template of the caller's space with its sender, domain and the space's allowance, in
/// one read of the catalog.
pub async fn load_authored(state: &State, space_id: &str, template_id: &str) -> Result<Authored, ApiError> {
    let models = state.read_models.wait_for(&[CATALOG], 0, state.settings.consistency_wait()).await?;
    let client = state.pool.get().await?;
    Authored::load(&client, &models.schema(CATALOG), space_id, template_id)
        .await
        .map_err(|error| ApiError::internal(&error))?
        .ok_or_else(|| {
            ApiError::not_found(Code::TemplateNotFound, format!("no template {template_id:?} in this space"))
        })
}

#[tracing::instrument(skip_all, fields(template = %path.as_str()))]
pub async fn send(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = state.authenticator.authorize(&req, Permission::Write).await?;
    let body = shared::http::read_json_object(&req, payload).await?;
    let context = decide::context(&body)?;
    let (req, state, caller, template_id) = (&req, &**state, &caller, path.into_inner());
    idempotency::protect(state, req, caller, &Value::Object(body), |claim, operation_id| async move {
        send_attempts(req, state, caller, &template_id, &context, claim.as_ref(), &operation_id).await
    })
    .await
}

#[allow(clippy::too_many_arguments, reason = "one request's parts, passed down once")]
async fn send_attempts(
    req: &HttpRequest,
    state: &State,
    caller: &Caller,
    template_id: &str,
    context: &BTreeMap<String, serde_json::Map<String, Value>>,
    claim: Option<&Claim>,
    operation_id: &str,
) -> Result<HttpResponse, ApiError> {
    let space_id = caller.space_id();
    let authored = load_authored(state, space_id, template_id).await?;
    decide::check_keys(&authored.template, context)?;
    // The schema of each context key, read once: it does not change between attempts.
    let mut schemas = BTreeMap::new();
    for (key, expected) in &authored.template.data {
        schemas.insert(key, write_context(state, space_id, &expected.schema_id).await?);
    }
    for _ in 0..ATTEMPTS {
        let now = shared::time::now_millis();
        let mut planned: BTreeMap<String, (PlannedUpsert, Vec<String>, &[catalog::AttributeEntry])> = BTreeMap::new();
        for (key, (schema, attributes, credits)) in &schemas {
            let write_schema =
                WriteSchema { schema_id: &schema.schema_id, space_id, schema_type: &schema.schema_type, attributes };
            // A context record is a record write: AI auto-fill needs credits, as on an upsert.
            crate::records::decide::check_credits(&write_schema, *credits)?;
            let input = context.get(*key).cloned().unwrap_or_default();
            let upsert = plan_upsert(state, &write_schema, input, now).await?;
            let keys = attributes.iter().map(|attribute| attribute.key.clone()).collect();
            planned.insert((*key).clone(), (upsert, keys, attributes.as_slice()));
        }
        let Some((recipient_upsert, _, recipient_attributes)) = planned.get(&authored.template.recipient) else {
            return Err(ApiError::internal(&anyhow::anyhow!("the recipient key was not planned")));
        };
        let contact = &recipient_upsert.record;
        let Some(address) = contact.personal.as_ref().and_then(|personal| personal.email.clone()) else {
            return Err(ApiError::bad_request(
                Code::RecipientMissing,
                format!("the {:?} record has no email address to send to", authored.template.recipient),
            ));
        };
        let client = state.pool.get().await?;
        let consent_keys = decide::consent_keys(recipient_attributes);
        let values = contact.values();
        let recipient = Recipient {
            suppressed: shared::email::is_suppressed(&client, space_id, &address).await?,
            consent: (!consent_keys.is_empty())
                .then(|| consent_keys.iter().all(|key| values.get(key) == Some(&Value::Bool(true)))),
            subscription: match &authored.template.topic_id {
                Some(topic_id) => shared::email::subscriptions(&client, &contact.record_id)
                    .await
                    .map_err(|error| ApiError::internal(&error))?
                    .remove(topic_id),
                None => None,
            },
        };
        drop(client);
        decide::gate(&authored.template, &recipient)?;
        let documents: BTreeMap<String, (Value, Vec<String>)> = planned
            .iter()
            .map(|(key, (upsert, keys, _))| (key.clone(), (upsert.record.document(), keys.clone())))
            .collect();
        let template = &authored.template;
        let rendered =
            render::render(&template.subject, &template.html, &template.text, &decide::render_context(&documents))
                .map_err(|error| {
                    ApiError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        Some(Code::TemplateRenderFailed),
                        format!("the template does not render: {error}"),
                    )
                })?;
        let contact_id = contact.record_id.clone();
        // The content is sealed under the contact's data key: the key its write carries, or
        // the one it already has.
        let mut streams = Vec::new();
        let mut guards: Vec<Guard> = Vec::new();
        let mut contact_key = None;
        for (key, (upsert, _, _)) in planned {
            let is_recipient = key == authored.template.recipient;
            match upsert.write {
                Some(write) => {
                    let write = write.map_err(append_error)?;
                    if is_recipient {
                        contact_key = Some(write.key.clone());
                    }
                    streams.push(write.stream);
                    guards.extend(write.guards);
                }
                None if is_recipient => contact_key = upsert.key,
                None => {}
            }
        }
        let Some(contact_key) = contact_key else {
            return Err(ApiError::internal(&anyhow::anyhow!("the recipient {contact_id} has no data key")));
        };
        let scheduled = schedule(
            state,
            &authored,
            EmailTo { space_id, contact_id: &contact_id, address: &address, key: &contact_key },
            &rendered,
            ("template", ""),
            now,
        )?;
        let (email_id, prepared) = (scheduled.prepared.parties.email_id.clone(), scheduled.prepared);
        streams.push(scheduled.stream);
        guards.push(outbox::insert_guard(&email_id, space_id, claim.map(Claim::parts)));
        if let Some(allowance) = &authored.allowance {
            guards.push(send::allowance_guard(space_id, now, allowance.monthly));
        }
        let appended = crate::edge::append(state, req, caller, claim, streams, guards).await;
        let appended = match appended {
            Ok(appended) => appended,
            Err(AppendError::WrongVersion { .. }) => continue,
            Err(AppendError::Conflict { code: Code::IdentifierConflict, .. }) => continue,
            Err(AppendError::Conflict { code: Code::EmailLimitReached, .. }) => {
                return Err(ApiError::new(
                    StatusCode::PAYMENT_REQUIRED,
                    Some(Code::EmailLimitReached),
                    "the space's email allowance for this month is used up; nothing was sent",
                ));
            }
            Err(error) => return Err(append_error(error)),
        };
        return match hand_off(state, &prepared).await {
            // The token covers the outcome too (a bounce's suppression, for one).
            Some((body, recorded)) => Ok(respond(StatusCode::OK, &body, operation_id, Some(recorded.max(appended)))),
            None => {
                // Stored, but the relay may or may not have the message: never "retry".
                Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    Some(Code::OutcomeUnknown),
                    "the email was stored but its hand-off's outcome is unknown; it is never sent again blindly: \
                     reconcile before a new send",
                )
                .unconfirmed()
                .with_header("Operation-Id", operation_id.to_owned()))
            }
        };
    }
    Err(ApiError::conflict(
        Code::ConcurrentModification,
        "the context records kept changing while the send was applied; retry",
    ))
}

/// Schedules `rendered` from the authored template for `to` under a new email id (see
/// `shared::email::send::schedule`).
pub fn schedule(
    state: &State,
    authored: &Authored,
    to: EmailTo<'_>,
    rendered: &render::Rendered,
    origin: (&str, &str),
    now: i64,
) -> Result<Scheduled, ApiError> {
    let email_id = shared::ids::new_id("em");
    send::schedule(&email_id, authored, to, rendered, origin, (now, &state.settings.email.public_base_url))
        .map_err(|error| ApiError::internal(&error))
}

/// Hands an appended email to the relay inline and records the outcome; the answer to give,
/// or `None` when the outcome is unknown (another hand-off has it, or the exchange broke off
/// after the message was sent). The outbox worker finishes what this leaves.
pub async fn hand_off(state: &State, prepared: &Prepared) -> Option<(Value, shared::log::Appended)> {
    if state.settings.email.handoff_delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(state.settings.email.handoff_delay_ms)).await;
    }
    let email_id = &prepared.parties.email_id;
    let lease = match outbox::claim(&state.pool, email_id, state.settings.email_lease()).await {
        Ok(Some(lease)) => lease,
        Ok(None) => return None,
        Err(error) => {
            tracing::warn!(error = %format!("{error:#}"), email = %email_id, "could not claim the hand-off; the outbox worker will");
            return None;
        }
    };
    match outbox::hand_off(&state.pool, &state.event_log, &state.mailer, &lease, prepared, None).await {
        Handed::Recorded(event, appended) if matches!(*event, LogEvent::EmailSent(_)) => {
            Some((outbox::answer(email_id, None), appended))
        }
        Handed::Recorded(event, appended) => match *event {
            LogEvent::EmailFailed(failed) => {
                Some((outbox::answer(email_id, Some((&failed.code, &failed.message))), appended))
            }
            _ => None,
        },
        _ => None,
    }
}
