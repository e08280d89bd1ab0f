//! The webhook decisions: validating a create or an update body, matching a webhook's trigger
//! with the schema it names, and what each write appends and answers (create, update,
//! delete, rotate a secret, replay a delivery, send a test). Pure: the schema lookup, the
//! AI provider's filter and the new secret's random bytes come from the shell's load, and
//! ids and data keys from `Given`.

use std::cell::OnceCell;

use domain::webhooks::signing::Secret;
use filter::Filter;
use platform::error::{Code, Issue};
use platform::events::LogEvent;
use platform::fresh::Fresh;
use platform::ids::SpaceId;
use platform::log::{ExpectedVersion, Guard, StreamAppend};
use platform::proto;
use serde_json::{Map, Value, json};

use platform::crypto::DataKey;

use super::store::{self, Counters, WebhookState};
use crate::decision::{Decide, Given, Outcome, Reply};

mod input;

pub(crate) use input::*;

/// Why a webhook request is refused. The HTTP edge maps each to the contract's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The body is not a valid webhook; `issues` names every problem (400 `invalid_webhook`).
    #[error("{message}")]
    Invalid { message: String, issues: Vec<Issue> },
    /// No such webhook in the caller's space, or deleted (404 `webhook_not_found`).
    #[error("no webhook {0:?} in this space")]
    NotFound(String),
    /// An integration owns the webhook: its owner may not change it (409
    /// `webhook_integration_owned`).
    #[error(
        "webhook {webhook_id} is owned by the {vendor} integration: change it there, or in the workspace \
         file that declares it (an apply without it deletes it)"
    )]
    IntegrationOwned { webhook_id: String, vendor: String },
    /// `schemaId` names no schema of the space (404 `schema_not_found`).
    #[error("no schema {0:?} in this space")]
    SchemaNotFound(String),
    /// No such delivery of the webhook (404 `webhook_delivery_not_found`).
    #[error("no delivery {0:?} of this webhook")]
    DeliveryNotFound(String),
    /// The delivery is still queued (409 `webhook_delivery_pending`).
    #[error("delivery {0} is still queued; it is attempted without a replay")]
    DeliveryPending(String),
    /// A custom filter needs an AI credit and the space has none (402 `insufficient_credits`).
    #[error("the space has no AI credits left; a custom filter condition needs one")]
    NoCredits,
    /// The filter made of the requirements tests events performed or emails opened or clicked,
    /// which a webhook's filter cannot (422 `ai_generation_failed`).
    #[error(
        "`performed`, `opened` and `clicked` are for segments: a webhook's custom filter reads the delivered \
         data; use a segment condition instead"
    )]
    FilterNotOnData,
    /// The requirements were well-formed but not turned into a filter (422
    /// `ai_generation_failed`).
    #[error("the requirements could not be turned into a filter: {0}")]
    FilterNotMade(String),
    /// Every attempt lost a race with another change of the webhook (409
    /// `concurrent_modification`).
    #[error("the webhook kept changing while this write was applied; retry")]
    KeptChanging,
    /// What the decision needs could not be made (500).
    #[error("{0}")]
    Failed(String),
}

fn invalid(issues: Vec<Issue>) -> Refusal {
    Refusal::Invalid { message: Issue::summary(&issues, "this webhook"), issues }
}

fn failed(message: impl Into<String>) -> Refusal {
    Refusal::Failed(message.into())
}

/// One event on the webhook's stream.
fn change(webhook_id: &str, expected: ExpectedVersion, event: LogEvent, at_ms: i64) -> StreamAppend {
    StreamAppend::one(store::stream_id(webhook_id), expected, event, at_ms)
}

/// A webhook of the caller's space (`space_id`) that is not deleted; not found otherwise (also
/// for another space's).
pub(crate) fn live<'w>(
    webhook_id: &str,
    space_id: &str,
    webhook: Option<&'w WebhookState>,
) -> Result<&'w WebhookState, Refusal> {
    match webhook {
        Some(webhook) if !webhook.deleted && webhook.space_id == space_id => Ok(webhook),
        _ => Err(Refusal::NotFound(webhook_id.to_owned())),
    }
}

/// [`live`], and one its owner may change: refused when an integration owns it.
pub(crate) fn owned<'w>(
    webhook_id: &str,
    space_id: &str,
    webhook: Option<&'w WebhookState>,
) -> Result<&'w WebhookState, Refusal> {
    let webhook = live(webhook_id, space_id, webhook)?;
    match &webhook.integration_vendor_name {
        Some(vendor) => Err(Refusal::IntegrationOwned { webhook_id: webhook_id.to_owned(), vendor: vendor.clone() }),
        None => Ok(webhook),
    }
}

/// A condition to store, the credits making it spent, and the guard that keeps a named
/// segment's stream where it was read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Resolved {
    pub condition: proto::WebhookCondition,
    pub credits: i64,
    /// A named segment's stream and the version it was read at.
    pub segment_guard: Option<(String, i64)>,
}

impl Resolved {
    /// No condition.
    pub(crate) fn none() -> Self {
        Self { condition: domain::webhooks::state::no_condition(), credits: 0, segment_guard: None }
    }

    /// A segment condition on `segment_id`, whose stream `segment_stream` was read at `version`.
    pub(crate) fn segment(segment_id: &str, segment_stream: String, version: i64) -> Self {
        let condition = proto::WebhookCondition {
            r#type: "segment".to_owned(),
            description: String::new(),
            expression: String::new(),
            segment_id: segment_id.to_owned(),
        };
        Self { condition, credits: 0, segment_guard: Some((segment_stream, version)) }
    }

    fn guard(&self) -> Option<Guard> {
        self.segment_guard.as_ref().map(|(stream, version)| Guard::stream_at(stream, *version))
    }
}

/// The custom filter condition the AI provider made of the requirements; it spends a credit.
pub(crate) fn custom_filter(filter: &Filter) -> Result<Resolved, Refusal> {
    // A webhook's filter reads the delivered document alone: no events performed, no
    // emails opened or clicked.
    if !filter::performed_parts(filter).is_empty() || !filter::engaged_parts(filter).is_empty() {
        return Err(Refusal::FilterNotOnData);
    }
    Ok(Resolved {
        condition: proto::WebhookCondition {
            r#type: "custom filter".to_owned(),
            description: filter::describe(filter),
            expression: serde_json::to_string(filter).map_err(|error| failed(error.to_string()))?,
            segment_id: String::new(),
        },
        credits: 1,
        segment_guard: None,
    })
}

/// A delivery as the owner's tools show it when it was just queued again.
pub(crate) fn pending_delivery(delivery_id: &str, webhook_id: &str) -> Value {
    json!({"id": delivery_id, "webhookId": webhook_id, "status": "pending"})
}

/// The data key of a webhook's secrets: `key`, or a new one (when `key` is `None`) with the
/// guard that stores it.
fn secret_key(
    webhook_id: &str,
    space_id: &str,
    key: Option<DataKey>,
    fresh: &mut dyn Fresh,
) -> Result<(DataKey, Option<Guard>), Refusal> {
    match key {
        Some(key) => Ok((key, None)),
        None => {
            let (key, wrapped) =
                fresh.data_key(&store::secret_subject(webhook_id)).map_err(|error| failed(format!("{error:#}")))?;
            Ok((key, Some(store::store_secret_key(webhook_id, space_id, wrapped))))
        }
    }
}

/// `secret` sealed under the webhook's key.
fn seal_secret(webhook_id: &str, secret: &Secret, key: &DataKey) -> Result<proto::Sealed, Refusal> {
    let subject = store::secret_subject(webhook_id);
    let mut sealed = platform::events::seal(&subject, &proto::WebhookSecret { secret: secret.reveal() });
    platform::events::encrypt(&mut sealed, key).map_err(|error| failed(format!("{error:#}")))?;
    Ok(sealed)
}

/// `POST /webhooks/{id}/deliveries/{deliveryId}/replay`: attempts a delivery that is over
/// (delivered, failed or dropped) again, with the same id, URL and body, as soon as the
/// enqueue worker has put it back in the outbox.
pub(crate) struct ReplayDelivery {
    pub space_id: SpaceId,
    pub webhook_id: String,
    pub delivery_id: String,
}

/// What a replay decides on: the webhook, and its delivery's state (`pending`, `delivered`,
/// `failed`, `dropped`; `None` when it has no such delivery).
pub(crate) struct Replaying {
    pub webhook: Option<WebhookState>,
    pub delivery_state: Option<String>,
}

impl Decide for ReplayDelivery {
    type Loaded = Replaying;
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, loaded: Replaying, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        live(&self.webhook_id, &self.space_id, loaded.webhook.as_ref())?;
        match loaded.delivery_state.as_deref() {
            None => return Err(Refusal::DeliveryNotFound(self.delivery_id.clone())),
            Some("pending") => return Err(Refusal::DeliveryPending(self.delivery_id.clone())),
            Some(_) => {}
        }
        let event = LogEvent::WebhookDeliveryReplayRequested(proto::WebhookDeliveryReplayRequested {
            webhook_id: self.webhook_id.clone(),
            space_id: self.space_id.clone().into(),
            delivery_id: self.delivery_id.clone(),
            requested_at_ms: given.now_ms,
        });
        let stream = change(&self.webhook_id, ExpectedVersion::Any, event, given.now_ms);
        let body = pending_delivery(&self.delivery_id, &self.webhook_id);
        Ok(Outcome::one(stream, Vec::new(), Reply::accepted(body)))
    }
}

/// `POST /webhooks/{id}/test`: enqueues one `webhook.test` delivery, whose id follows from the
/// request's position in the log.
pub(crate) struct TestWebhook {
    pub space_id: SpaceId,
    pub webhook_id: String,
}

/// A test requested: its append; the answer names the delivery by where the append lands.
pub(crate) struct TestRequested {
    pub stream: StreamAppend,
}

impl Decide for TestWebhook {
    type Loaded = Option<WebhookState>;
    type Outcome = TestRequested;
    type Refusal = Refusal;

    fn decide(&self, webhook: Option<WebhookState>, given: &mut Given<'_>) -> Result<TestRequested, Refusal> {
        live(&self.webhook_id, &self.space_id, webhook.as_ref())?;
        let event = LogEvent::WebhookTestRequested(proto::WebhookTestRequested {
            webhook_id: self.webhook_id.clone(),
            space_id: self.space_id.clone().into(),
            requested_at_ms: given.now_ms,
        });
        Ok(TestRequested { stream: change(&self.webhook_id, ExpectedVersion::Any, event, given.now_ms) })
    }
}

/// `POST /webhooks`.
pub(crate) struct CreateWebhook {
    pub space_id: SpaceId,
    pub new: NewWebhook,
    /// The custom filter made for this request, kept across its attempts (by the shell).
    pub condition: OnceCell<Resolved>,
}

/// What a create decides on: the schema's id (empty for `email event`), the condition to
/// store, and the new secret (drawn by the shell).
pub(crate) struct Creating {
    pub schema_id: String,
    pub resolved: Resolved,
    pub secret: Secret,
}

impl Decide for CreateWebhook {
    type Loaded = Creating;
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, loaded: Creating, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let Creating { schema_id, resolved, secret } = loaded;
        let (new, now, space_id) = (&self.new, given.now_ms, self.space_id.as_str());
        let webhook_id = given.fresh.id("wh");
        let (key, key_guard) = secret_key(&webhook_id, space_id, None, given.fresh)?;
        let sealed = seal_secret(&webhook_id, &secret, &key)?;
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
        let webhook = WebhookState::apply(None, &event).ok_or_else(|| failed("a created webhook has a state"))?;
        let mut document = webhook.document();
        Counters::default().merge_into(&mut document);
        document["signatureVerificationSecret"] = json!(secret.reveal());
        let body = document;
        let guards = key_guard
            .into_iter()
            .chain((resolved.credits > 0).then(|| domain::admission::spend_guard(space_id, resolved.credits)))
            .chain(resolved.guard())
            .collect();
        let stream = change(&webhook_id, ExpectedVersion::NoStream, event, now);
        Ok(Outcome::one(stream, guards, Reply::created(body)))
    }
}

/// `PATCH /webhooks/{id}`: decided on the webhook's stream, appended at its version.
pub(crate) struct UpdateWebhook {
    pub space_id: SpaceId,
    pub webhook_id: String,
    pub input: Map<String, Value>,
    /// The custom filter made for this request, kept across its attempts (by the shell).
    pub condition: OnceCell<Resolved>,
}

/// What an update decides on: the webhook (its owner's to change) at its stream's version,
/// the validated update, the condition to store if it sets one, and the delivery counters.
pub(crate) struct Updating {
    pub version: i64,
    pub current: WebhookState,
    pub update: Update,
    pub resolved: Option<Resolved>,
    pub counters: Counters,
}

impl Decide for UpdateWebhook {
    type Loaded = Updating;
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, loaded: Updating, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let Updating { version, current, update, resolved, mut counters } = loaded;
        let (webhook_id, now) = (self.webhook_id.as_str(), given.now_ms);
        if update == Update::default() {
            // The body only echoed the webhook as shown: nothing changes.
            let mut document = current.document();
            counters.merge_into(&mut document);
            return Ok(Outcome::Answer(Reply::ok(document)));
        }
        let set_live = update.live == Some(true);
        if set_live {
            counters.failed_calls_in_a_row = 0;
        }
        let event = LogEvent::WebhookUpdated(proto::WebhookUpdated {
            webhook_id: webhook_id.to_owned(),
            space_id: self.space_id.clone().into(),
            url: update.url.clone(),
            email_event_types_set: update.email_event_types.is_some(),
            email_event_types: update.email_event_types.clone().unwrap_or_default(),
            condition: resolved.as_ref().map(|resolved| resolved.condition.clone()),
            status: update.live.map(|live| if live { "live" } else { "paused" }.to_owned()),
            updated_at_ms: now,
        });
        let next =
            WebhookState::apply(Some(current), &event).ok_or_else(|| failed("an updated webhook has a state"))?;
        let mut document = next.document();
        counters.merge_into(&mut document);
        let credits = resolved.as_ref().map_or(0, |resolved| resolved.credits);
        let guards = set_live
            .then(|| store::clear_failures(webhook_id))
            .into_iter()
            .chain((credits > 0).then(|| domain::admission::spend_guard(&self.space_id, credits)))
            .chain(resolved.as_ref().and_then(Resolved::guard))
            .collect();
        let stream = change(webhook_id, ExpectedVersion::Exactly(version), event, now);
        let body = document;
        Ok(Outcome::one(stream, guards, Reply::ok(body)))
    }
}

/// `DELETE /webhooks/{id}`: shreds the key of its secrets and blanks recorded answers that
/// hold one.
pub(crate) struct DeleteWebhook {
    pub space_id: SpaceId,
    pub webhook_id: String,
}

impl Decide for DeleteWebhook {
    /// The webhook's stream version and state.
    type Loaded = (i64, Option<WebhookState>);
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, (version, webhook): Self::Loaded, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let webhook_id = self.webhook_id.as_str();
        owned(webhook_id, &self.space_id, webhook.as_ref())?;
        let event = LogEvent::WebhookDeleted(proto::WebhookDeleted {
            webhook_id: webhook_id.to_owned(),
            space_id: self.space_id.clone().into(),
            deleted_at_ms: given.now_ms,
        });
        let stream = change(webhook_id, ExpectedVersion::Exactly(version), event, given.now_ms);
        let guards = vec![store::shred_secret_key(webhook_id), store::blank_recorded_secrets(webhook_id)];
        let body = json!({"id": webhook_id, "deleted": true});
        Ok(Outcome::one(stream, guards, Reply::ok(body)))
    }
}

/// `POST /webhooks/{id}/rotate-secret`: a new secret; the previous one signs too for the grace
/// period.
pub(crate) struct RotateSecret {
    pub space_id: SpaceId,
    pub webhook_id: String,
    pub grace_ms: i64,
}

/// What a rotation decides on: the webhook at its stream's version, the data key of its
/// secrets (`None` when it has none, or when the webhook is not its owner's to change), and
/// the new secret (drawn by the shell).
pub(crate) struct Rotating {
    pub version: i64,
    pub webhook: Option<WebhookState>,
    pub key: Option<DataKey>,
    pub secret: Secret,
}

impl Decide for RotateSecret {
    type Loaded = Rotating;
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, loaded: Rotating, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let Rotating { version, webhook, key, secret } = loaded;
        let (webhook_id, now) = (self.webhook_id.as_str(), given.now_ms);
        owned(webhook_id, &self.space_id, webhook.as_ref())?;
        let (key, key_guard) = secret_key(webhook_id, &self.space_id, key, given.fresh)?;
        let sealed = seal_secret(webhook_id, &secret, &key)?;
        let body = json!({
            "id": webhook_id,
            "signatureVerificationSecret": secret.reveal(),
            "updatedAt": platform::time::format_millis(now),
        });
        let event = LogEvent::WebhookSecretRotated(proto::WebhookSecretRotated {
            webhook_id: webhook_id.to_owned(),
            space_id: self.space_id.clone().into(),
            secret: Some(sealed),
            previous_valid_until_ms: now.saturating_add(self.grace_ms),
            rotated_at_ms: now,
        });
        let stream = change(webhook_id, ExpectedVersion::Exactly(version), event, now);
        Ok(Outcome::one(stream, key_guard.into_iter().collect(), Reply::ok(body)))
    }
}

impl platform::refusal::Answered for Refusal {}

/// A refused webhook write as the contract answers it.
impl platform::refusal::Refusal for Refusal {
    fn code(&self) -> Code {
        match self {
            Self::Invalid { .. } => Code::InvalidWebhook,
            Self::NotFound(_) => Code::WebhookNotFound,
            Self::IntegrationOwned { .. } => Code::WebhookIntegrationOwned,
            Self::SchemaNotFound(_) => Code::SchemaNotFound,
            Self::DeliveryNotFound(_) => Code::WebhookDeliveryNotFound,
            Self::DeliveryPending(_) => Code::WebhookDeliveryPending,
            Self::NoCredits => Code::InsufficientCredits,
            Self::FilterNotOnData | Self::FilterNotMade(_) => Code::AiGenerationFailed,
            Self::KeptChanging => Code::ConcurrentModification,
            Self::Failed(_) => Code::InternalError,
        }
    }

    fn issues(&self) -> Vec<Issue> {
        match self {
            Self::Invalid { issues, .. } => issues.clone(),
            Self::FilterNotOnData | Self::FilterNotMade(_) => {
                vec![Issue::coded("condition.requirements", Code::AiGenerationFailed, self.to_string())]
            }
            _ => Vec::new(),
        }
    }

    fn is_defect(&self) -> bool {
        matches!(self, Self::Failed(_))
    }
}

#[cfg(test)]
mod tests {
    use domain::webhooks::Trigger;
    use serde_json::json;

    use super::*;
    use crate::decision::harness::{NOW_MS, given};
    use crate::decision::{Body, Status};
    use platform::fresh::Counted;

    fn body(value: Value) -> Map<String, Value> {
        value.as_object().cloned().expect("an object")
    }

    fn keys(refusal: Refusal) -> Vec<String> {
        let Refusal::Invalid { issues, .. } = refusal else { panic!("not invalid: {refusal:?}") };
        issues.into_iter().filter_map(|issue| issue.key).collect()
    }

    #[test]
    fn given_a_contact_trigger_when_created_with_a_schema_then_it_is_accepted() {
        let created = parse_create(
            &body(
                json!({"url": "https://hooks.example.com/in", "trigger": "contact upserted", "schemaId": "contacts"}),
            ),
            false,
        )
        .expect("valid");
        assert_eq!(created.trigger, Trigger::ContactUpserted);
        assert_eq!(created.schema.as_deref(), Some("contacts"));
        assert_eq!(created.condition, Condition::None);
        assert!(created.email_event_types.is_empty());
    }

    #[test]
    fn given_an_email_trigger_then_types_are_required_and_the_schema_must_be_null() {
        let ok = parse_create(
            &body(json!({"url": "https://h.example.com", "trigger": "email event", "emailEventTypes": ["sent", "bounced"], "schemaId": null})),
            false,
        )
        .expect("valid");
        assert_eq!(ok.email_event_types, ["sent", "bounced"]);
        assert_eq!(ok.schema, None);
        let missing = parse_create(&body(json!({"url": "https://h.example.com", "trigger": "email event"})), false);
        assert_eq!(keys(missing.expect_err("refused")), ["emailEventTypes"]);
        let empty = parse_create(
            &body(json!({"url": "https://h.example.com", "trigger": "email event", "emailEventTypes": []})),
            false,
        );
        assert_eq!(keys(empty.expect_err("refused")), ["emailEventTypes"]);
        let with_schema = parse_create(
            &body(
                json!({"url": "https://h.example.com", "trigger": "email event", "emailEventTypes": ["sent"], "schemaId": "contacts"}),
            ),
            false,
        );
        assert_eq!(keys(with_schema.expect_err("refused")), ["schemaId"]);
        let unknown_type = parse_create(
            &body(json!({"url": "https://h.example.com", "trigger": "email event", "emailEventTypes": ["delivered"]})),
            false,
        );
        assert_eq!(keys(unknown_type.expect_err("refused")), ["emailEventTypes"]);
    }

    #[test]
    fn given_a_record_trigger_then_the_schema_is_required_and_email_types_refused() {
        let missing = parse_create(&body(json!({"url": "https://h.example.com", "trigger": "object deleted"})), false);
        assert_eq!(keys(missing.expect_err("refused")), ["schemaId"]);
        let typed = parse_create(
            &body(
                json!({"url": "https://h.example.com", "trigger": "event fired", "schemaId": "signup", "emailEventTypes": ["sent"]}),
            ),
            false,
        );
        assert_eq!(keys(typed.expect_err("refused")), ["emailEventTypes"]);
    }

    #[test]
    fn every_problem_is_named_at_once() {
        let refused = parse_create(
            &body(
                json!({"url": "ftp://x", "trigger": "contact created", "condition": {"type": "sometimes"}, "extra": 1}),
            ),
            false,
        )
        .expect_err("refused");
        let mut named = keys(refused);
        named.sort();
        assert_eq!(named, ["condition.type", "extra", "trigger", "url"]);
        let empty = parse_create(&Map::new(), false).expect_err("refused");
        assert_eq!(keys(empty), ["url", "trigger"]);
    }

    #[test]
    fn inward_targets_are_refused_unless_loopback_is_allowed() {
        let local = json!({"url": "http://127.0.0.1:9000/hook", "trigger": "contact deleted", "schemaId": "contacts"});
        assert_eq!(keys(parse_create(&body(local.clone()), false).expect_err("refused")), ["url"]);
        assert!(parse_create(&body(local), true).is_ok());
        let metadata = json!({"url": "http://169.254.169.254/", "trigger": "contact deleted", "schemaId": "contacts"});
        assert_eq!(keys(parse_create(&body(metadata), true).expect_err("refused")), ["url"]);
    }

    #[test]
    fn custom_filters_carry_bounded_requirements() {
        let base = |condition: Value| {
            parse_create(
                &body(
                    json!({"url": "https://h.example.com", "trigger": "contact upserted", "schemaId": "contacts", "condition": condition}),
                ),
                false,
            )
        };
        assert_eq!(
            base(json!({"type": "custom filter", "requirements": "plan is pro"})).expect("valid").condition,
            Condition::CustomFilter { requirements: "plan is pro".into() }
        );
        assert!(base(json!({"type": "custom filter", "requirements": " "})).is_err());
        assert!(base(json!({"type": "custom filter"})).is_err());
        assert!(
            base(json!({"type": "custom filter", "requirements": "a".repeat(MAX_REQUIREMENTS_CHARS + 1)})).is_err()
        );
        assert!(base(json!({"type": "none", "requirements": "x"})).is_err());
        assert!(base(json!("none")).is_err());
    }

    /// A webhook as a `GET` shows it, with `trigger`.
    fn shown(trigger: Trigger) -> Value {
        let email = trigger == Trigger::EmailEvent;
        json!({
            "id": "wh_1", "createdAt": "2026-11-01T00:00:00.000Z", "updatedAt": "2026-11-02T00:00:00.000Z",
            "url": "https://example.com/hook", "trigger": trigger.as_str(),
            "emailEventTypes": if email { json!(["bounced"]) } else { json!([]) },
            "schemaId": if email { Value::Null } else { json!("sch_1") },
            "condition": {"type": "custom filter", "description": "plan is pro"},
            "status": "live", "pauseReason": null, "totalCalls": 3, "failedCalls": 1, "failedCallsInARow": 0,
            "lastCalledAt": null, "lastCallErrorMessage": null,
        })
    }

    fn update(value: Value, trigger: Trigger) -> Result<Update, Refusal> {
        parse_update(&body(value), &shown(trigger), trigger, false)
    }

    #[test]
    fn given_an_update_then_trigger_and_schema_cannot_change_and_something_must() {
        let refused = update(json!({"trigger": "contact deleted"}), Trigger::ContactUpserted);
        assert_eq!(keys(refused.expect_err("refused")), ["trigger"]);
        let refused = update(json!({"schemaId": "companies"}), Trigger::ContactUpserted);
        assert_eq!(keys(refused.expect_err("refused")), ["schemaId"]);
        assert!(update(json!({}), Trigger::ContactUpserted).is_err(), "an empty update");
        let paused = update(json!({"status": "paused"}), Trigger::ContactUpserted).expect("valid");
        assert_eq!(paused, Update { live: Some(false), ..Update::default() });
        assert!(update(json!({"status": "stopped"}), Trigger::ContactUpserted).is_err());
        assert_eq!(
            keys(update(json!({"nickname": "x"}), Trigger::ContactUpserted).expect_err("refused")),
            ["nickname"]
        );
    }

    #[test]
    fn given_the_webhook_as_shown_then_it_is_accepted_and_only_its_edits_change() {
        for trigger in [Trigger::ContactUpserted, Trigger::EmailEvent] {
            let mut edited = shown(trigger);
            edited["url"] = json!("https://example.com/other");
            // Counters and times the server keeps may have moved since the read.
            edited["totalCalls"] = json!(99);
            edited["updatedAt"] = json!("2030-01-01T00:00:00.000Z");
            let parsed = update(edited, trigger).expect("the returned shape is accepted");
            let expected =
                Update { url: Some("https://example.com/other".into()), live: Some(true), ..Update::default() };
            assert_eq!(parsed, expected, "the shown condition and email types are no change");
        }
        let echo = update(
            json!({"condition": {"type": "custom filter", "description": "plan is pro"}}),
            Trigger::ContactUpserted,
        );
        assert_eq!(echo.expect("an echo"), Update::default(), "only an echo: nothing to change");
        let mut moved = shown(Trigger::ContactUpserted);
        moved["trigger"] = json!("contact deleted");
        moved["createdAt"] = json!("2020-01-01T00:00:00.000Z");
        assert_eq!(keys(update(moved, Trigger::ContactUpserted).expect_err("refused")), ["createdAt", "trigger"]);
        let described = json!({"condition": {"type": "custom filter", "description": "plan is free"}});
        assert!(update(described, Trigger::ContactUpserted).is_err(), "a filter changes by its requirements");
    }

    #[test]
    fn given_an_update_then_email_types_follow_the_trigger() {
        let types = update(json!({"emailEventTypes": ["complained"]}), Trigger::EmailEvent).expect("valid");
        assert_eq!(types.email_event_types, Some(vec!["complained".to_owned()]));
        assert!(update(json!({"emailEventTypes": []}), Trigger::EmailEvent).is_err());
        assert!(update(json!({"emailEventTypes": ["sent"]}), Trigger::ContactUpserted).is_err());
    }

    #[test]
    fn the_schema_must_be_of_the_triggers_type() {
        assert!(check_schema(Trigger::ContactUpserted, "contact").is_ok());
        assert!(check_schema(Trigger::ObjectDeleted, "object").is_ok());
        assert!(check_schema(Trigger::EventFired, "event").is_ok());
        assert_eq!(keys(check_schema(Trigger::ContactUpserted, "object").expect_err("refused")), ["schemaId"]);
        assert_eq!(keys(check_schema(Trigger::EventFired, "contact").expect_err("refused")), ["schemaId"]);
        assert!(check_schema(Trigger::EmailEvent, "contact").is_err());
    }
    /// A webhook of `space_id` (owned by `vendor`'s integration when given).
    fn webhook(space_id: &str, vendor: Option<&str>) -> WebhookState {
        WebhookState {
            webhook_id: "wh_1".into(),
            space_id: space_id.into(),
            url: "https://example.com/hook".into(),
            trigger: Trigger::ContactUpserted,
            email_event_types: Vec::new(),
            schema_id: Some("sch_1".into()),
            condition: domain::webhooks::state::no_condition(),
            live: true,
            pause: None,
            integration_vendor_name: vendor.map(str::to_owned),
            created_at_ms: 1_000,
            updated_at_ms: 1_000,
            secret_version: 1,
            deleted: false,
        }
    }

    fn deleted() -> WebhookState {
        WebhookState { deleted: true, ..webhook("spc_1", None) }
    }

    fn secret() -> Secret {
        Secret::from_random([7; 32])
    }

    /// The append of a decided outcome.
    fn appended(outcome: &Outcome) -> &crate::decision::Writes {
        match outcome {
            Outcome::Append(writes) => writes,
            _ => panic!("an append was expected"),
        }
    }

    /// The events of `outcome` with their sealed secrets taken out (sealed under a fresh
    /// nonce), and those secrets.
    fn without_secrets(outcome: &Outcome) -> (Vec<LogEvent>, Vec<proto::Sealed>) {
        let mut secrets = Vec::new();
        let events = outcome
            .events()
            .into_iter()
            .cloned()
            .map(|mut event| {
                match &mut event {
                    LogEvent::WebhookCreated(created) => secrets.extend(created.secret.take()),
                    LogEvent::WebhookSecretRotated(rotated) => secrets.extend(rotated.secret.take()),
                    _ => {}
                }
                event
            })
            .collect();
        (events, secrets)
    }

    /// The secret sealed in `sealed`, opened with `key`.
    fn opened(sealed: &proto::Sealed, key: &DataKey) -> String {
        use prost::Message;
        let Some(proto::sealed::Body::Ciphertext(ciphertext)) = &sealed.body else { panic!("not encrypted") };
        let bytes = key.decrypt(&sealed.subject_id, ciphertext).expect("opens with the webhook's key");
        proto::WebhookSecret::decode(bytes.as_slice()).expect("a secret").secret
    }

    #[test]
    fn a_delivery_that_is_over_is_replayed_and_one_still_queued_or_unknown_is_refused() {
        let replay =
            ReplayDelivery { space_id: "spc_1".into(), webhook_id: "wh_1".into(), delivery_id: "whd_1".into() };
        let loaded = |webhook: Option<WebhookState>, state: Option<&str>| Replaying {
            webhook,
            delivery_state: state.map(str::to_owned),
        };
        let reply = given(loaded(Some(webhook("spc_1", None)), Some("failed"))).when(&replay).then_events(&[
            LogEvent::WebhookDeliveryReplayRequested(proto::WebhookDeliveryReplayRequested {
                webhook_id: "wh_1".into(),
                space_id: "spc_1".into(),
                delivery_id: "whd_1".into(),
                requested_at_ms: NOW_MS,
            }),
        ]);
        assert_eq!(reply.status, Status::Accepted);
        assert_eq!(
            reply.body,
            Body::Data { data: json!({"id": "whd_1", "webhookId": "wh_1", "status": "pending"}), warnings: Vec::new() }
        );
        let not_found = Refusal::NotFound("wh_1".into());
        given(loaded(None, None)).when(&replay).then_refused(not_found.clone());
        given(loaded(Some(webhook("spc_2", None)), Some("failed"))).when(&replay).then_refused(not_found.clone());
        given(loaded(Some(deleted()), Some("failed"))).when(&replay).then_refused(not_found);
        given(loaded(Some(webhook("spc_1", None)), None))
            .when(&replay)
            .then_refused(Refusal::DeliveryNotFound("whd_1".into()));
        given(loaded(Some(webhook("spc_1", None)), Some("pending")))
            .when(&replay)
            .then_refused(Refusal::DeliveryPending("whd_1".into()));
    }

    #[test]
    fn a_test_is_requested_on_the_webhooks_stream_of_a_live_webhook_only() {
        let command = TestWebhook { space_id: "spc_1".into(), webhook_id: "wh_1".into() };
        let TestRequested { stream } = given(Some(webhook("spc_1", None))).when(&command).decided();
        assert_eq!((stream.stream_id.as_str(), stream.expected), ("webhook-wh_1", ExpectedVersion::Any));
        let events: Vec<_> = stream.events.into_iter().map(|new| new.event).collect();
        assert_eq!(
            events,
            [LogEvent::WebhookTestRequested(proto::WebhookTestRequested {
                webhook_id: "wh_1".into(),
                space_id: "spc_1".into(),
                requested_at_ms: NOW_MS,
            })]
        );
        given(Some(deleted())).when(&command).then_refused(Refusal::NotFound("wh_1".into()));
        given(None).when(&command).then_refused(Refusal::NotFound("wh_1".into()));
    }

    fn new_webhook(condition: Condition) -> CreateWebhook {
        let new = NewWebhook {
            url: "https://example.com/hook".into(),
            trigger: Trigger::ContactUpserted,
            email_event_types: Vec::new(),
            schema: Some("contacts".into()),
            condition,
        };
        CreateWebhook { space_id: "spc_1".into(), new, condition: OnceCell::new() }
    }

    #[test]
    fn a_new_webhook_takes_a_fresh_id_and_a_new_key_and_answers_its_secret_once() {
        let loaded = Creating { schema_id: "sch_1".into(), resolved: Resolved::none(), secret: secret() };
        let outcome = given(loaded).when(&new_webhook(Condition::None)).decided();
        let (events, secrets) = without_secrets(&outcome);
        assert_eq!(
            events,
            [LogEvent::WebhookCreated(proto::WebhookCreated {
                webhook_id: "wh_1".into(),
                space_id: "spc_1".into(),
                url: "https://example.com/hook".into(),
                trigger: "contact upserted".into(),
                email_event_types: Vec::new(),
                schema_id: "sch_1".into(),
                condition: Some(domain::webhooks::state::no_condition()),
                secret: None,
                integration_vendor_name: String::new(),
                created_at_ms: NOW_MS,
            })]
        );
        let [sealed] = secrets.as_slice() else { panic!("one sealed secret") };
        assert_eq!(sealed.subject_id, "webhook-wh_1");
        assert!(matches!(sealed.body, Some(proto::sealed::Body::Ciphertext(_))), "the secret is encrypted");
        let writes = appended(&outcome);
        assert_eq!(writes.streams[0].expected, ExpectedVersion::NoStream);
        assert_eq!(writes.guards.len(), 1, "the new key is stored with the webhook");
        assert_eq!(writes.reply.status, Status::Created);
        let data = &writes.reply.json()["data"];
        assert_eq!((&data["id"], &data["status"], &data["totalCalls"]), (&json!("wh_1"), &json!("live"), &json!(0)));
        assert_eq!(data["signatureVerificationSecret"], json!(secret().reveal()));
    }

    #[test]
    fn a_new_webhook_with_a_filter_spends_its_credit_and_a_segment_condition_keeps_the_segment() {
        let filter = custom_filter(&filter::parse_plain("plan is pro").expect("a filter")).expect("a webhook's filter");
        assert_eq!((filter.condition.r#type.as_str(), filter.credits), ("custom filter", 1));
        let loaded = Creating { schema_id: "sch_1".into(), resolved: filter, secret: secret() };
        let requirements = Condition::CustomFilter { requirements: "plan is pro".into() };
        let outcome = given(loaded).when(&new_webhook(requirements)).decided();
        assert_eq!(appended(&outcome).guards.len(), 2, "the key and the credit spent");
        let segment = Resolved::segment("seg_1", "segment-seg_1".into(), 4);
        let loaded = Creating { schema_id: "sch_1".into(), resolved: segment, secret: secret() };
        let outcome = given(loaded).when(&new_webhook(Condition::Segment { segment_id: "seg_1".into() })).decided();
        assert_eq!(appended(&outcome).guards.len(), 2, "the key and the segment's version");
        assert_eq!(
            appended(&outcome).reply.json()["data"]["condition"],
            json!({"type": "segment", "segmentId": "seg_1"})
        );
    }

    #[test]
    fn a_filter_about_events_performed_or_emails_engaged_with_is_for_segments() {
        for requirements in ["performed purchase", "opened an email in the last 7 days"] {
            let filter = filter::parse_plain(requirements).expect("a filter");
            assert_eq!(custom_filter(&filter), Err(Refusal::FilterNotOnData), "{requirements}");
        }
    }

    fn updating(update: Update) -> Updating {
        Updating { version: 3, current: webhook("spc_1", None), update, resolved: None, counters: Counters::default() }
    }

    #[test]
    fn an_update_appends_its_changes_at_the_webhooks_version_and_an_echo_changes_nothing() {
        let command = UpdateWebhook {
            space_id: "spc_1".into(),
            webhook_id: "wh_1".into(),
            input: Map::new(),
            condition: OnceCell::new(),
        };
        let paused = Update { live: Some(false), ..Update::default() };
        let reply =
            given(updating(paused)).when(&command).then_events(&[LogEvent::WebhookUpdated(proto::WebhookUpdated {
                webhook_id: "wh_1".into(),
                space_id: "spc_1".into(),
                url: None,
                email_event_types_set: false,
                email_event_types: Vec::new(),
                condition: None,
                status: Some("paused".into()),
                updated_at_ms: NOW_MS,
            })]);
        assert_eq!((reply.status, &reply.json()["data"]["status"]), (Status::Ok, &json!("paused")));

        let outcome = given(updating(Update { live: Some(true), ..Update::default() })).when(&command).decided();
        let writes = appended(&outcome);
        assert_eq!(writes.streams[0].expected, ExpectedVersion::Exactly(3));
        assert_eq!(writes.guards.len(), 1, "setting it live clears the failure count");
        assert_eq!(writes.reply.json()["data"]["failedCallsInARow"], json!(0));

        let echo = given(updating(Update::default())).when(&command).then_answers();
        assert_eq!(echo.json()["data"], {
            let mut document = webhook("spc_1", None).document();
            Counters::default().merge_into(&mut document);
            document
        });
    }

    #[test]
    fn a_deletion_shreds_the_key_and_only_the_owner_of_a_live_webhook_deletes_it() {
        let command = DeleteWebhook { space_id: "spc_1".into(), webhook_id: "wh_1".into() };
        let deletion = LogEvent::WebhookDeleted(proto::WebhookDeleted {
            webhook_id: "wh_1".into(),
            space_id: "spc_1".into(),
            deleted_at_ms: NOW_MS,
        });
        let reply = given((2, Some(webhook("spc_1", None)))).when(&command).then_events(&[deletion]);
        assert_eq!(reply.body, Body::Data { data: json!({"id": "wh_1", "deleted": true}), warnings: Vec::new() });
        let outcome = given((2, Some(webhook("spc_1", None)))).when(&command).decided();
        assert_eq!(
            (appended(&outcome).guards.len(), appended(&outcome).streams[0].expected),
            (2, ExpectedVersion::Exactly(2))
        );
        given((2, Some(webhook("spc_1", Some("acme")))))
            .when(&command)
            .then_refused(Refusal::IntegrationOwned { webhook_id: "wh_1".into(), vendor: "acme".into() });
        given((2, Some(webhook("spc_2", None)))).when(&command).then_refused(Refusal::NotFound("wh_1".into()));
        given((3, Some(deleted()))).when(&command).then_refused(Refusal::NotFound("wh_1".into()));
    }

    #[test]
    fn a_rotation_seals_the_new_secret_under_the_webhooks_key_and_keeps_the_old_one_for_the_grace() {
        let command = RotateSecret { space_id: "spc_1".into(), webhook_id: "wh_1".into(), grace_ms: 60_000 };
        let (key, _) = Counted::new().expect("test keys").data_key("webhook-wh_1").expect("a key");
        let loaded =
            Rotating { version: 5, webhook: Some(webhook("spc_1", None)), key: Some(key.clone()), secret: secret() };
        let outcome = given(loaded).when(&command).decided();
        let (events, secrets) = without_secrets(&outcome);
        assert_eq!(
            events,
            [LogEvent::WebhookSecretRotated(proto::WebhookSecretRotated {
                webhook_id: "wh_1".into(),
                space_id: "spc_1".into(),
                secret: None,
                previous_valid_until_ms: NOW_MS + 60_000,
                rotated_at_ms: NOW_MS,
            })]
        );
        assert_eq!(opened(&secrets[0], &key), secret().reveal());
        let writes = appended(&outcome);
        assert_eq!((writes.guards.len(), writes.streams[0].expected), (0, ExpectedVersion::Exactly(5)));
        assert_eq!(
            writes.reply.body,
            Body::Data {
                data: json!({
                    "id": "wh_1",
                    "signatureVerificationSecret": secret().reveal(),
                    "updatedAt": platform::time::format_millis(NOW_MS),
                }),
                warnings: Vec::new()
            }
        );

        let keyless = Rotating { version: 5, webhook: Some(webhook("spc_1", None)), key: None, secret: secret() };
        let outcome = given(keyless).when(&command).decided();
        assert_eq!(appended(&outcome).guards.len(), 1, "a webhook without a key gets a new one, stored");

        let owned = Rotating { version: 5, webhook: Some(webhook("spc_1", Some("acme"))), key: None, secret: secret() };
        given(owned)
            .when(&command)
            .then_refused(Refusal::IntegrationOwned { webhook_id: "wh_1".into(), vendor: "acme".into() });
    }
}
