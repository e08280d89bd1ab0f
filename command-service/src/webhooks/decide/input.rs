//! The webhook bodies read and checked: a create's and an update's fields, the trigger's
//! schema, the target URL, the email event types and the condition.

use domain::webhooks::{EMAIL_EVENT_TYPES, Trigger, target};
use platform::error::{Code, Issue};
use serde_json::{Map, Value};

use super::{Refusal, invalid};

/// The fields a create accepts.
pub(crate) const CREATE_FIELDS: [&str; 5] = ["url", "trigger", "emailEventTypes", "schemaId", "condition"];
/// The fields an update accepts (trigger and schema cannot change).
pub(crate) const UPDATE_FIELDS: [&str; 4] = ["url", "emailEventTypes", "condition", "status"];
/// Fields of the webhook as returned that an update takes when they are unchanged.
pub(crate) const FIXED_FIELDS: [&str; 5] = ["id", "createdAt", "trigger", "schemaId", "integrationVendorName"];
/// Fields of the webhook as returned that the server keeps: an update ignores them.
pub(crate) const KEPT_FIELDS: [&str; 7] = [
    "updatedAt",
    "pauseReason",
    "totalCalls",
    "failedCalls",
    "failedCallsInARow",
    "lastCalledAt",
    "lastCallErrorMessage",
];
/// The most characters of a custom filter's requirements.
pub(crate) const MAX_REQUIREMENTS_CHARS: usize = 2000;

/// A webhook's delivery condition as the caller wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Condition {
    None,
    /// Free text that the AI provider turns into a filter once (decision D5).
    CustomFilter {
        requirements: String,
    },
    /// Deliver only for contacts in the segment: triggers about a contact only.
    Segment {
        segment_id: String,
    },
}

/// The triggers whose occurrences concern one contact, which a segment condition can test.
pub(crate) const SEGMENT_TRIGGERS: [Trigger; 3] = [Trigger::ContactUpserted, Trigger::EventFired, Trigger::EmailEvent];

fn check_segment_trigger(trigger: Trigger, condition: Option<&Condition>, issues: &mut Vec<Issue>) {
    if matches!(condition, Some(Condition::Segment { .. })) && !SEGMENT_TRIGGERS.contains(&trigger) {
        issues.push(Issue::coded(
            "condition.type",
            Code::InvalidField,
            format!(
                "a segment condition tests the contact an occurrence is about; trigger `{}` has none \
                 (use contact upserted, event fired or email event)",
                trigger.as_str()
            ),
        ));
    }
}

/// A validated create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NewWebhook {
    pub url: String,
    pub trigger: Trigger,
    pub email_event_types: Vec<String>,
    /// The schema's id or slug as given; `None` for `email event`.
    pub schema: Option<String>,
    pub condition: Condition,
}

/// A validated update: each field present only when the caller sent it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Update {
    pub url: Option<String>,
    pub email_event_types: Option<Vec<String>>,
    pub condition: Option<Condition>,
    /// `true` for `live`, `false` for `paused`.
    pub live: Option<bool>,
}

/// Validates a create body. `allow_loopback` is the deployment's setting for local targets.
pub(crate) fn parse_create(body: &Map<String, Value>, allow_loopback: bool) -> Result<NewWebhook, Refusal> {
    let mut issues = unknown_fields(body, &CREATE_FIELDS);
    let url = match body.get("url") {
        None | Some(Value::Null) => {
            issues.push(Issue::coded("url", Code::MissingField, "url is required"));
            None
        }
        Some(value) => url(value, allow_loopback, &mut issues),
    };
    let trigger = match body.get("trigger") {
        Some(Value::String(text)) => Trigger::parse(text).or_else(|| {
            let names: Vec<&str> = Trigger::ALL.iter().map(|trigger| trigger.as_str()).collect();
            issues.push(Issue::coded(
                "trigger",
                Code::InvalidField,
                format!("trigger must be one of {}", names.join(", ")),
            ));
            None
        }),
        None | Some(Value::Null) => {
            issues.push(Issue::coded("trigger", Code::MissingField, "trigger is required"));
            None
        }
        Some(_) => {
            issues.push(Issue::coded("trigger", Code::InvalidField, "trigger must be a string"));
            None
        }
    };
    let email_event_types = match body.get("emailEventTypes") {
        None | Some(Value::Null) => None,
        Some(value) => email_event_types(value, &mut issues),
    };
    let schema = match body.get("schemaId") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) if !platform::storable::is_blank(text) => Some(text.clone()),
        Some(_) => {
            issues.push(Issue::coded("schemaId", Code::InvalidField, "schemaId must be a schema id or slug"));
            None
        }
    };
    let condition = match body.get("condition") {
        None | Some(Value::Null) => Some(Condition::None),
        Some(value) => condition(value, &mut issues),
    };
    if let Some(trigger) = trigger {
        check_segment_trigger(trigger, condition.as_ref(), &mut issues);
        let email = trigger == Trigger::EmailEvent;
        let has_types = email_event_types.as_ref().is_some_and(|types: &Vec<String>| !types.is_empty());
        if email && !has_types && !issues.iter().any(|issue| issue.key.as_deref() == Some("emailEventTypes")) {
            issues.push(Issue::coded(
                "emailEventTypes",
                Code::MissingField,
                "emailEventTypes is required and non-empty when trigger is `email event`",
            ));
        }
        if !email && has_types {
            issues.push(Issue::coded(
                "emailEventTypes",
                Code::InvalidField,
                "emailEventTypes is only for trigger `email event`",
            ));
        }
        if email && body.get("schemaId").is_some_and(|value| !value.is_null()) {
            issues.push(Issue::coded(
                "schemaId",
                Code::InvalidField,
                "schemaId must be null for trigger `email event`",
            ));
        }
        if !email && body.get("schemaId").is_none_or(Value::is_null) {
            issues.push(Issue::coded(
                "schemaId",
                Code::MissingField,
                format!("schemaId is required for trigger `{}`", trigger.as_str()),
            ));
        }
    }
    match (url, trigger, condition) {
        (Some(url), Some(trigger), Some(condition)) if issues.is_empty() => Ok(NewWebhook {
            url,
            trigger,
            email_event_types: email_event_types.unwrap_or_default(),
            schema: if trigger == Trigger::EmailEvent { None } else { schema },
            condition,
        }),
        _ => Err(invalid(issues)),
    }
}

/// Validates an update body against the webhook as a `GET` shows it (`shown`, whose trigger is
/// `trigger`). The body may be that document, edited: its fixed fields are accepted unchanged,
/// its kept fields ignored, and a condition or an `emailEventTypes` equal to the shown one is
/// no change (a custom filter shows its description, not its requirements). A body that only
/// echoes the webhook gives an empty update: nothing to change.
pub(crate) fn parse_update(
    body: &Map<String, Value>,
    shown: &Value,
    trigger: Trigger,
    allow_loopback: bool,
) -> Result<Update, Refusal> {
    let mut body = body.clone();
    let sent = !body.is_empty();
    let echoed = crate::echo::take_echoed(&mut body, &FIXED_FIELDS, &KEPT_FIELDS);
    let mut issues = Vec::new();
    for (key, _) in crate::echo::changed(&echoed, shown) {
        let message = match key {
            "trigger" | "schemaId" => format!("{key} cannot change; create a new webhook instead"),
            _ => format!("{key} is set by the platform; it cannot change"),
        };
        issues.push(Issue::coded(key, Code::UnknownField, message));
    }
    body.retain(|key, value| {
        !(matches!(key.as_str(), "condition" | "emailEventTypes") && shown.get(key) == Some(value))
    });
    for key in body.keys().filter(|key| !UPDATE_FIELDS.contains(&key.as_str())) {
        issues.push(Issue::coded(key, Code::UnknownField, format!("{key} is not a field of a webhook update")));
    }
    let mut update = Update::default();
    if let Some(value) = body.get("url") {
        update.url = url(value, allow_loopback, &mut issues);
    }
    if let Some(value) = body.get("emailEventTypes") {
        if trigger == Trigger::EmailEvent {
            match email_event_types(value, &mut issues) {
                Some(types) if types.is_empty() => issues.push(Issue::coded(
                    "emailEventTypes",
                    Code::InvalidField,
                    "emailEventTypes must not be empty for trigger `email event`",
                )),
                types => update.email_event_types = types,
            }
        } else {
            issues.push(Issue::coded(
                "emailEventTypes",
                Code::InvalidField,
                "emailEventTypes is only for trigger `email event`",
            ));
        }
    }
    if let Some(value) = body.get("condition") {
        update.condition = condition(value, &mut issues);
        check_segment_trigger(trigger, update.condition.as_ref(), &mut issues);
    }
    if let Some(value) = body.get("status") {
        match value.as_str() {
            Some("live") => update.live = Some(true),
            Some("paused") => update.live = Some(false),
            _ => issues.push(Issue::coded("status", Code::InvalidField, "status must be `live` or `paused`")),
        }
    }
    if issues.is_empty() && !sent {
        issues.push(Issue {
            key: None,
            code: Some(Code::MissingField),
            message: "an update needs at least one of url, emailEventTypes, condition, status".to_owned(),
        });
    }
    if issues.is_empty() { Ok(update) } else { Err(invalid(issues)) }
}

/// Whether the schema `schemaId` names (of `schema_type`) fits the trigger.
pub(crate) fn check_schema(trigger: Trigger, schema_type: &str) -> Result<(), Refusal> {
    match trigger.schema_type() {
        Some(expected) if expected == schema_type => Ok(()),
        Some(expected) => Err(invalid(vec![Issue::coded(
            "schemaId",
            Code::InvalidField,
            format!(
                "trigger `{}` needs {} schema; this is {} schema",
                trigger.as_str(),
                article(expected),
                article(schema_type)
            ),
        )])),
        None => Err(invalid(vec![Issue::coded(
            "schemaId",
            Code::InvalidField,
            "schemaId must be null for trigger `email event`",
        )])),
    }
}

/// `a contact`, `an object`, `an event`.
fn article(schema_type: &str) -> String {
    let an = schema_type.starts_with(['a', 'e', 'i', 'o', 'u']);
    format!("{} {schema_type}", if an { "an" } else { "a" })
}

fn unknown_fields(body: &Map<String, Value>, allowed: &[&str]) -> Vec<Issue> {
    body.keys()
        .filter(|key| !allowed.contains(&key.as_str()))
        .map(|key| Issue::coded(key, Code::UnknownField, format!("{key} is not a field of a webhook")))
        .collect()
}

fn url(value: &Value, allow_loopback: bool, issues: &mut Vec<Issue>) -> Option<String> {
    let Some(text) = value.as_str() else {
        issues.push(Issue::coded("url", Code::InvalidField, "url must be a string"));
        return None;
    };
    match target::url_refusal(text, allow_loopback) {
        None => Some(text.to_owned()),
        Some(refusal) => {
            issues.push(Issue::coded("url", Code::InvalidField, format!("url {}", refusal.message())));
            None
        }
    }
}

fn email_event_types(value: &Value, issues: &mut Vec<Issue>) -> Option<Vec<String>> {
    let message = format!("emailEventTypes must be a list of distinct values among {}", EMAIL_EVENT_TYPES.join(", "));
    let Some(items) = value.as_array() else {
        issues.push(Issue::coded("emailEventTypes", Code::InvalidField, message));
        return None;
    };
    let mut types: Vec<String> = Vec::new();
    for item in items {
        match item.as_str() {
            Some(text) if EMAIL_EVENT_TYPES.contains(&text) && !types.iter().any(|known| known == text) => {
                types.push(text.to_owned());
            }
            _ => {
                issues.push(Issue::coded("emailEventTypes", Code::InvalidField, message));
                return None;
            }
        }
    }
    Some(types)
}

fn condition(value: &Value, issues: &mut Vec<Issue>) -> Option<Condition> {
    let Some(object) = value.as_object() else {
        issues.push(Issue::coded("condition", Code::InvalidField, "condition must be an object with a type"));
        return None;
    };
    let fields: Vec<&str> = object.keys().map(String::as_str).collect();
    match object.get("type").and_then(Value::as_str) {
        Some("none") if fields == ["type"] => Some(Condition::None),
        Some("custom filter") if fields.iter().all(|field| ["type", "requirements"].contains(field)) => {
            match object.get("requirements").and_then(Value::as_str) {
                Some(text) if !platform::storable::is_blank(text) && text.chars().count() <= MAX_REQUIREMENTS_CHARS => {
                    Some(Condition::CustomFilter { requirements: text.to_owned() })
                }
                _ => {
                    let message = format!(
                        "condition.requirements must be non-blank text of at most {MAX_REQUIREMENTS_CHARS} characters"
                    );
                    issues.push(Issue::coded("condition.requirements", Code::InvalidField, message));
                    None
                }
            }
        }
        Some("segment") if fields.iter().all(|field| ["type", "segmentId"].contains(field)) => {
            match object.get("segmentId").and_then(Value::as_str) {
                Some(id)
                    if !platform::storable::is_blank(id) && platform::storable::is_storable(id) && id.len() <= 100 =>
                {
                    Some(Condition::Segment { segment_id: id.to_owned() })
                }
                _ => {
                    issues.push(Issue::coded(
                        "condition.segmentId",
                        Code::InvalidField,
                        "condition.segmentId must be a segment id",
                    ));
                    None
                }
            }
        }
        Some("none" | "custom filter" | "segment") => {
            issues.push(Issue::coded("condition", Code::UnknownField, "condition has fields its type does not take"));
            None
        }
        _ => {
            issues.push(Issue::coded(
                "condition.type",
                Code::InvalidField,
                "condition.type must be `none`, `custom filter` or `segment`",
            ));
            None
        }
    }
}
