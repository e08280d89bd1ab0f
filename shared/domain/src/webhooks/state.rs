//! A webhook as its stream (`webhook-<id>`) leaves it: the one fold of its log events that
//! the command service decides on, the `webhooks` read model shows and the delivery engine
//! follows.

use serde_json::{Value, json};

use kernel::events::LogEvent;
use kernel::proto;
use kernel::time::format_millis;

use super::Trigger;

/// The log stream of a webhook.
pub fn stream_id(webhook_id: &str) -> String {
    format!("webhook-{webhook_id}")
}

/// The data subject whose key seals a webhook's secrets: deleting the webhook shreds it.
pub fn secret_subject(webhook_id: &str) -> String {
    format!("webhook-{webhook_id}")
}

/// Why a webhook was paused by the delivery engine rather than by its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pause {
    /// `gone` (a receiver answered 410) or `failing` (the circuit breaker opened).
    pub reason: String,
    pub detail: String,
    pub paused_at_ms: i64,
}

/// A webhook's state.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookState {
    pub webhook_id: String,
    pub space_id: String,
    pub url: String,
    pub trigger: Trigger,
    pub email_event_types: Vec<String>,
    pub schema_id: Option<String>,
    pub condition: proto::WebhookCondition,
    pub live: bool,
    /// Set while paused by the delivery engine (a 410 or the circuit breaker).
    pub pause: Option<Pause>,
    pub integration_vendor_name: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// 1 for the first secret, one more for each rotation.
    pub secret_version: i32,
    pub deleted: bool,
}

impl WebhookState {
    /// The state after `event`; events of other kinds leave it as it is. An event before the
    /// webhook's creation (which a valid stream never holds) is ignored.
    pub fn apply(state: Option<Self>, event: &LogEvent) -> Option<Self> {
        match (state, event) {
            (_, LogEvent::WebhookCreated(created)) => Some(Self {
                webhook_id: created.webhook_id.clone(),
                space_id: created.space_id.clone(),
                url: created.url.clone(),
                trigger: Trigger::parse(&created.trigger).unwrap_or(Trigger::ContactUpserted),
                email_event_types: created.email_event_types.clone(),
                schema_id: Some(created.schema_id.clone()).filter(|id| !id.is_empty()),
                condition: created.condition.clone().unwrap_or_else(no_condition),
                live: true,
                pause: None,
                integration_vendor_name: Some(created.integration_vendor_name.clone()).filter(|name| !name.is_empty()),
                created_at_ms: created.created_at_ms,
                updated_at_ms: created.created_at_ms,
                secret_version: 1,
                deleted: false,
            }),
            (Some(mut state), LogEvent::WebhookUpdated(updated)) => {
                if let Some(url) = &updated.url {
                    state.url.clone_from(url);
                }
                if updated.email_event_types_set {
                    state.email_event_types.clone_from(&updated.email_event_types);
                }
                if let Some(condition) = &updated.condition {
                    state.condition = condition.clone();
                }
                match updated.status.as_deref() {
                    Some("live") => {
                        state.live = true;
                        state.pause = None;
                    }
                    Some("paused") => state.live = false,
                    _ => {}
                }
                state.updated_at_ms = state.updated_at_ms.max(updated.updated_at_ms);
                Some(state)
            }
            (Some(mut state), LogEvent::WebhookPaused(paused)) => {
                state.live = false;
                state.pause = Some(Pause {
                    reason: paused.reason.clone(),
                    detail: paused.detail.clone(),
                    paused_at_ms: paused.paused_at_ms,
                });
                state.updated_at_ms = state.updated_at_ms.max(paused.paused_at_ms);
                Some(state)
            }
            (Some(mut state), LogEvent::WebhookSecretRotated(rotated)) => {
                state.secret_version += 1;
                state.updated_at_ms = state.updated_at_ms.max(rotated.rotated_at_ms);
                Some(state)
            }
            (Some(mut state), LogEvent::WebhookDeleted(deleted)) => {
                state.deleted = true;
                state.updated_at_ms = state.updated_at_ms.max(deleted.deleted_at_ms);
                Some(state)
            }
            (state, _) => state,
        }
    }

    /// `live` or `paused`.
    pub fn status(&self) -> &'static str {
        if self.live { "live" } else { "paused" }
    }

    /// The webhook as the API shows it, without its counters (which the delivery engine keeps
    /// beside it) and never with its secret or the generated filter expression.
    pub fn document(&self) -> Value {
        let condition = match self.condition.r#type.as_str() {
            "custom filter" => json!({"type": "custom filter", "description": self.condition.description}),
            "segment" => json!({"type": "segment", "segmentId": self.condition.segment_id}),
            _ => json!({"type": "none"}),
        };
        let mut document = json!({
            "id": self.webhook_id,
            "createdAt": format_millis(self.created_at_ms),
            "updatedAt": format_millis(self.updated_at_ms),
            "url": self.url,
            "trigger": self.trigger.as_str(),
            "emailEventTypes": self.email_event_types,
            "schemaId": self.schema_id,
            "condition": condition,
            "status": self.status(),
            "pauseReason": self.pause.as_ref().map(|pause| json!({
                "reason": pause.reason,
                "detail": pause.detail,
                "pausedAt": format_millis(pause.paused_at_ms),
            })),
        });
        if let (Some(name), Some(object)) = (&self.integration_vendor_name, document.as_object_mut()) {
            object.insert("integrationVendorName".to_owned(), json!(name));
        }
        document
    }
}

/// The webhook a webhook event is about, if `event` is one.
pub fn webhook_of(event: &LogEvent) -> Option<&str> {
    Some(match event {
        LogEvent::WebhookCreated(e) => &e.webhook_id,
        LogEvent::WebhookUpdated(e) => &e.webhook_id,
        LogEvent::WebhookPaused(e) => &e.webhook_id,
        LogEvent::WebhookSecretRotated(e) => &e.webhook_id,
        LogEvent::WebhookDeleted(e) => &e.webhook_id,
        LogEvent::WebhookDeliveryReplayRequested(e) => &e.webhook_id,
        LogEvent::WebhookTestRequested(e) => &e.webhook_id,
        _ => return None,
    })
}

/// The condition of a webhook without one.
pub fn no_condition() -> proto::WebhookCondition {
    proto::WebhookCondition { r#type: "none".to_owned(), ..Default::default() }
}

/// The counters the delivery engine keeps for a webhook, merged into its document.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub total_calls: i64,
    pub failed_calls: i64,
    pub failed_calls_in_a_row: i64,
    pub last_called_at: Option<String>,
    pub last_call_error_message: Option<String>,
}

impl Counters {
    /// The columns a counters row is read from, in order (`webhook_counters`).
    pub const COLUMNS: &'static str =
        "total_calls, failed_calls, failed_calls_in_a_row, last_called_at, last_call_error_message";

    /// Adds the counters to a webhook document.
    pub fn merge_into(&self, document: &mut Value) {
        if let Some(object) = document.as_object_mut() {
            object.insert("totalCalls".to_owned(), json!(self.total_calls));
            object.insert("failedCalls".to_owned(), json!(self.failed_calls));
            object.insert("failedCallsInARow".to_owned(), json!(self.failed_calls_in_a_row));
            object.insert("lastCalledAt".to_owned(), json!(self.last_called_at));
            object.insert("lastCallErrorMessage".to_owned(), json!(self.last_call_error_message));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn created() -> LogEvent {
        LogEvent::WebhookCreated(proto::WebhookCreated {
            webhook_id: "wh_1".into(),
            space_id: "spc_1".into(),
            url: "https://example.com/hook".into(),
            trigger: "contact upserted".into(),
            schema_id: "sch_1".into(),
            created_at_ms: 1_000,
            ..Default::default()
        })
    }

    #[test]
    fn given_a_created_webhook_when_paused_by_the_engine_and_set_live_then_the_reason_clears() {
        let state = WebhookState::apply(None, &created());
        let paused = LogEvent::WebhookPaused(proto::WebhookPaused {
            webhook_id: "wh_1".into(),
            reason: "gone".into(),
            paused_at_ms: 2_000,
            ..Default::default()
        });
        let state = WebhookState::apply(state, &paused).expect("exists");
        assert_eq!(state.status(), "paused");
        assert_eq!(state.document()["pauseReason"]["reason"], "gone");
        let live = LogEvent::WebhookUpdated(proto::WebhookUpdated {
            webhook_id: "wh_1".into(),
            status: Some("live".into()),
            updated_at_ms: 3_000,
            ..Default::default()
        });
        let state = WebhookState::apply(Some(state), &live).expect("exists");
        assert_eq!(state.status(), "live");
        assert!(state.document()["pauseReason"].is_null());
        assert_eq!(state.document()["condition"], json!({"type": "none"}));
    }

    #[test]
    fn given_a_custom_filter_then_the_document_shows_its_description_never_its_expression() {
        let mut state = WebhookState::apply(None, &created()).expect("exists");
        state.condition = proto::WebhookCondition {
            r#type: "custom filter".into(),
            description: "plan is pro".into(),
            expression: r#"{"field":"plan"}"#.into(),
            segment_id: String::new(),
        };
        let text = state.document().to_string();
        assert!(text.contains("plan is pro"));
        assert!(!text.contains("field"), "{text}");
    }

    #[test]
    fn given_an_update_of_other_fields_then_unsent_fields_keep_their_values() {
        let state = WebhookState::apply(None, &created());
        let update = LogEvent::WebhookUpdated(proto::WebhookUpdated {
            webhook_id: "wh_1".into(),
            url: Some("https://example.com/new".into()),
            updated_at_ms: 500,
            ..Default::default()
        });
        let state = WebhookState::apply(state, &update).expect("exists");
        assert_eq!(state.url, "https://example.com/new");
        assert_eq!(state.schema_id.as_deref(), Some("sch_1"));
        assert_eq!(state.updated_at_ms, 1_000, "updatedAt never goes backwards");
    }
}
