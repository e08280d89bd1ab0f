//! The webhook decision: validating a create or an update body, and matching a webhook's
//! trigger with the schema it names. Pure: the schema lookup happens in the store and comes
//! in as an argument.

use domain::webhooks::{EMAIL_EVENT_TYPES, Trigger, target};
use platform::error::{Code, Issue};
use serde_json::{Map, Value};

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
pub enum Condition {
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

/// Why a webhook request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The body is not a valid webhook; `issues` names every problem (400 `invalid_webhook`).
    #[error("{message}")]
    Invalid { message: String, issues: Vec<Issue> },
}

fn invalid(issues: Vec<Issue>) -> Refusal {
    Refusal::Invalid { message: Issue::summary(&issues, "this webhook"), issues }
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn body(value: Value) -> Map<String, Value> {
        value.as_object().cloned().expect("an object")
    }

    fn keys(refusal: Refusal) -> Vec<String> {
        let Refusal::Invalid { issues, .. } = refusal;
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
}
