//! `POST /templates/{templateId}/send`.
//!
//! 1. The body is `{data: {<key>: {record fields}}}`; stored content cannot be replaced.
//! 2. Each context record is upserted by identity precedence (or its `id`), decided together.
//! 3. The send decision (`mail::send::decide`) is asked about the recipient (the template's
//!    `recipient` key): suppressions for every template, consent and the topic subscription
//!    for marketing; a refusal answers 422 with the gate's code (D9).
//! 4. The template is rendered; `EmailScheduled` (content sealed under the contact's key) is
//!    appended with the context records, the outbox row and the allowance count, in one
//!    transaction (402 `email_limit_reached` when the month's allowance is used up).
//! 5. The message is handed to the relay inline and the outcome recorded; the answer is
//!    200 `{emailId, status, error}`. A hand-off whose end is unknown answers 503
//!    `idempotency_outcome_unknown` and is never retried blindly.

use std::collections::BTreeMap;
use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::{Caller, Permission};
use domain::catalog::AttributeEntry;
use mail::outbox;
use mail::send;
pub use mail::send::{Authored, EmailTo, Scheduled};
use platform::error::{ApiError, Code};
use platform::log::{AppendError, Guard};
use serde_json::{Map, Value, json};

use super::decide;
use crate::State;
use crate::edge::append_error;
use crate::pipeline::{self, Actor, Answer, Ctx, Decided, Decision, Given, Legacy, Protection, Refusal};
use crate::records::decide::{PlannedUpsert, WriteSchema};
use crate::records::load::plan_upsert;

/// The template of the caller's space with its sender, domain and the space's allowance: kept
/// by this process since an earlier send at the catalog's revision, or read now in one
/// statement (and kept). A send decided on a kept one appends with that revision's guard.
pub(crate) async fn load_authored(ctx: &Ctx<'_>, space_id: &str, template_id: &str) -> Result<Arc<Authored>, ApiError> {
    if let Some((revision, authored)) = ctx.state.templates.get(space_id, template_id) {
        ctx.kept_catalog(revision);
        return Ok(authored);
    }
    let catalog = ctx.catalog().await?;
    let authored = Authored::load(&ctx.db().await?, &catalog, space_id, template_id)
        .await
        .map_err(|error| ApiError::internal(&error))?
        .ok_or_else(|| {
            ApiError::not_found(Code::TemplateNotFound, format!("no template {template_id:?} in this space"))
        })?;
    let authored = Arc::new(authored);
    if let Some(revision) = ctx.catalog_revision_seen() {
        ctx.state.templates.put(space_id, template_id, revision, &authored);
    }
    Ok(authored)
}

/// A context record planned: its upsert, the schema's attribute keys and attributes.
struct Planned {
    upsert: PlannedUpsert,
    attributes: Vec<AttributeEntry>,
}

/// What is known about the recipient, as the send decision reads it.
struct RecipientFacts {
    address: Option<String>,
    suppressed: bool,
    consent: Option<bool>,
    subscription: Option<String>,
    /// The value of the send policy's time-zone attribute.
    zone: Option<String>,
    /// Its marketing sends within the policy's caps' windows.
    sent: Vec<send::Sent>,
}

/// What a send decides on.
struct Loaded {
    authored: Arc<Authored>,
    planned: BTreeMap<String, Planned>,
    recipient: RecipientFacts,
}

struct SendTemplate<'a> {
    caller: &'a Caller,
    template_id: String,
    context: BTreeMap<String, Map<String, Value>>,
    /// Where the unsubscribe and tracking links point.
    site: &'a mail::send::Site,
}

impl Legacy for SendTemplate<'_> {
    type Loaded = Loaded;

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Loaded, ApiError> {
        let space_id = self.caller.space_id();
        let authored = load_authored(ctx, space_id, &self.template_id).await?;
        decide::check_keys(&authored.template, &self.context)?;
        let now = platform::time::now_millis();
        let mut planned = BTreeMap::new();
        for (key, expected) in &authored.template.data {
            let context =
                crate::write_contexts::current(ctx, crate::write_contexts::Kind::Record, space_id, &expected.schema_id)
                    .await?;
            let schema = WriteSchema {
                schema_id: &context.schema.schema_id,
                space_id,
                schema_type: &context.schema.schema_type,
                attributes: &context.attributes,
            };
            // A context record is a record write: AI auto-fill needs credits, as on an upsert.
            crate::records::decide::check_credits(&schema, context.credits)?;
            let input = self.context.get(key).cloned().unwrap_or_default();
            let upsert = plan_upsert(ctx, &schema, input, now).await?;
            planned.insert(key.clone(), Planned { upsert, attributes: context.attributes.clone() });
        }
        let Some(recipient) = planned.get(&authored.template.recipient) else {
            return Err(ApiError::internal(&anyhow::anyhow!("the recipient key was not planned")));
        };
        let contact = &recipient.upsert.record;
        let address = contact.personal.as_ref().and_then(|personal| personal.email.clone());
        let client = ctx.db().await?;
        let consent_keys = decide::consent_keys(&recipient.attributes);
        let values = contact.values();
        let recipient = RecipientFacts {
            suppressed: match &address {
                Some(address) => reads::email::is_suppressed(&client, space_id, address).await?,
                None => false,
            },
            consent: send::email_consent(&consent_keys, |key| values.get(key)),
            subscription: match &authored.template.topic_id {
                Some(topic_id) => reads::email::subscriptions(&client, &contact.record_id)
                    .await
                    .map_err(|error| ApiError::internal(&error))?
                    .remove(topic_id),
                None => None,
            },
            zone: authored
                .policy
                .as_ref()
                .and_then(|policy| policy.time_zone.attribute.as_ref())
                .and_then(|attribute| values.get(attribute))
                .and_then(Value::as_str)
                .map(str::to_owned),
            sent: match authored.policy.as_ref().and_then(send::SendPolicy::lookback_ms) {
                Some(lookback) if authored.template.kind == "marketing" => {
                    let since = platform::time::now_millis() - lookback;
                    send::marketing_sends(&client, std::slice::from_ref(&contact.record_id), since)
                        .await?
                        .remove(&contact.record_id)
                        .unwrap_or_default()
                }
                _ => Vec::new(),
            },
            address,
        };
        Ok(Loaded { authored, planned, recipient })
    }

    fn decide(&self, loaded: Loaded, given: &Given<'_>) -> Result<Decided, ApiError> {
        let Loaded { authored, planned, recipient } = loaded;
        let (space_id, now) = (self.caller.space_id(), given.now_ms);
        let template = &authored.template;
        let facts = send::Facts {
            kind: send::Kind::of(&template.kind),
            topic_id: template.topic_id.as_deref(),
            contact: Some(send::Contact {
                address: recipient.address.as_deref(),
                suppressed: recipient.suppressed,
                consent: recipient.consent,
                subscription: recipient.subscription.as_deref(),
                zone: recipient.zone.as_deref(),
                sent: &recipient.sent,
            }),
            policy: authored.policy.as_ref(),
            allowance_refused: false,
            now_ms: now,
        };
        let held = match send::decide(&facts) {
            send::Verdict::Send => None,
            send::Verdict::Hold { until_ms, gate } => Some((until_ms, gate)),
            send::Verdict::Skip { gate, .. } => return Err(decide::refusal(gate)),
        };
        let address = recipient.address.unwrap_or_default();
        let documents: BTreeMap<String, (Value, Vec<String>)> = planned
            .iter()
            .map(|(key, planned)| {
                let keys = planned.attributes.iter().map(|attribute| attribute.key.clone()).collect();
                (key.clone(), (planned.upsert.record.document(), keys))
            })
            .collect();
        let email_id = platform::ids::new_id("em");
        let rendered = send::render_email(&authored, &email_id, decide::render_context(&documents), self.site)
            .map_err(|error| {
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    Some(Code::TemplateRenderFailed),
                    format!("the template does not render: {error}"),
                )
            })?;
        // The content is sealed under the contact's data key: the key its write carries, or
        // the one it already has.
        let mut streams = Vec::new();
        let mut guards: Vec<Guard> = Vec::new();
        let mut contact = None;
        for (key, planned) in planned {
            let is_recipient = key == template.recipient;
            let record_id = planned.upsert.record.record_id.clone();
            match planned.upsert.write {
                Some(write) => {
                    let write = write.map_err(append_error)?;
                    if is_recipient {
                        contact = Some((record_id, write.key.clone()));
                    }
                    streams.push(write.stream);
                    guards.extend(write.guards);
                }
                None if is_recipient => contact = planned.upsert.key.map(|key| (record_id, key)),
                None => {}
            }
        }
        let Some((contact_id, contact_key)) = contact else {
            return Err(ApiError::internal(&anyhow::anyhow!("the recipient has no data key")));
        };
        let to = EmailTo { space_id, contact_id: &contact_id, address: &address, key: &contact_key };
        let scheduled =
            send::schedule(&email_id, &authored, to, &rendered, send::Origin::template(), (now, &self.site.base_url))
                .map_err(|error| ApiError::internal(&error))?;
        if let Some((until_ms, gate)) = held {
            // Held by the send policy: stored now, decided again at `until_ms`; the answer is
            // final (the claim completes with it).
            let held = scheduled.hold(until_ms, gate, now);
            streams.push(held.stream);
            guards.push(held.guard);
            if let Some(allowance) = &authored.allowance {
                guards.push(send::allowance_guard(space_id, now, allowance.monthly));
            }
            let body = json!({"data": {
                "emailId": email_id,
                "status": "held",
                "notBefore": platform::time::format_millis(until_ms),
                "gate": gate.as_str(),
                "error": null,
            }});
            return Ok(Decided::Append(Decision::new(streams, guards, Answer::json(StatusCode::OK, body))));
        }
        streams.push(scheduled.stream);
        guards.extend(scheduled.guards);
        // The outbox row holds the send's claim: the hand-off records the answer.
        guards.push(outbox::insert_guard(&email_id, space_id, given.claim.map(|claim| claim.parts())));
        if let Some(allowance) = &authored.allowance {
            guards.push(send::allowance_guard(space_id, now, allowance.monthly));
        }
        let decision = Decision::new(streams, guards, Answer::json(StatusCode::OK, Value::Null));
        Ok(Decided::Append(decision.then(super::hand_off::now(scheduled.prepared))))
    }

    fn refused(&self, error: AppendError) -> Refusal {
        match error {
            AppendError::Conflict { code: Code::IdentifierConflict, .. } => Refusal::Again,
            AppendError::Conflict { code: Code::EmailLimitReached, .. } => Refusal::Fail(ApiError::new(
                StatusCode::PAYMENT_REQUIRED,
                Some(Code::EmailLimitReached),
                "the space's email allowance for this month is used up; nothing was sent",
            )),
            error => Refusal::default_for(error),
        }
    }

    fn lost_too_often(&self) -> ApiError {
        ApiError::conflict(
            Code::ConcurrentModification,
            "the context records kept changing while the send was applied; retry",
        )
    }
}

#[tracing::instrument(skip_all, fields(template = %path.as_str()))]
pub async fn send(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let body = api::http::read_json_object(&req, payload).await?;
    let context = decide::context(&body)?;
    let command = SendTemplate { caller: &caller, template_id: path.into_inner(), context, site: &state.site };
    let body = Value::Object(body);
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&body), command).await
}
