//! The broadcast decisions: validating an update body, and when a run starts. Pure.

use serde_json::{Map, Value};
use shared::email::resources::Audience;
use shared::error::{Code, Issue};

/// The fields an update accepts.
pub const UPDATE_FIELDS: [&str; 3] = ["name", "audience", "scheduledAt"];
/// The most characters of a broadcast's name.
pub const MAX_NAME_CHARS: usize = 200;

/// A validated update: each field present only when the caller sent it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Update {
    pub name: Option<String>,
    pub audience: Option<Audience>,
    /// `Some(None)` clears the schedule.
    pub scheduled_at_ms: Option<Option<i64>>,
}

/// Why a broadcast request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The body is not a valid update; `issues` names every problem (400 `invalid_broadcast`).
    #[error("{message}")]
    Invalid { message: String, issues: Vec<Issue> },
}

fn invalid(issues: Vec<Issue>) -> Refusal {
    Refusal::Invalid { message: Issue::summary(&issues, "this broadcast update"), issues }
}

fn audience(value: &Value, issues: &mut Vec<Issue>) -> Option<Audience> {
    let id = |key: &str| {
        value.get(key).and_then(Value::as_str).filter(|id| !id.trim().is_empty() && id.len() <= 100).map(str::to_owned)
    };
    let fields: Vec<&str> =
        value.as_object().map(|object| object.keys().map(String::as_str).collect()).unwrap_or_default();
    match (id("segmentId"), id("topicId"), fields.len()) {
        (Some(segment_id), None, 1) if shared::storable::is_storable(&segment_id) => {
            Some(Audience::Segment { segment_id })
        }
        (None, Some(topic_id), 1) if shared::storable::is_storable(&topic_id) => Some(Audience::Topic { topic_id }),
        _ => {
            issues.push(Issue::coded(
                "audience",
                Code::InvalidField,
                "audience must be {\"segmentId\": \"seg_...\"} or {\"topicId\": \"top_...\"}",
            ));
            None
        }
    }
}

/// Validates an update body: at least one of `name`, `audience` and `scheduledAt` (an RFC 3339
/// time, or null to send at once).
pub fn parse_update(body: &Map<String, Value>) -> Result<Update, Refusal> {
    let mut issues: Vec<Issue> = body
        .keys()
        .filter(|key| !UPDATE_FIELDS.contains(&key.as_str()))
        .map(|key| {
            let message = match key.as_str() {
                "templateId" | "senderId" | "slug" => {
                    format!("{key} is authored in the application; it cannot change here")
                }
                _ => format!("{key} is not a field of a broadcast update"),
            };
            Issue::coded(key, Code::UnknownField, message)
        })
        .collect();
    let mut update = Update::default();
    match body.get("name") {
        None => {}
        Some(Value::String(name))
            if !name.trim().is_empty()
                && name.chars().count() <= MAX_NAME_CHARS
                && shared::storable::is_storable(name) =>
        {
            update.name = Some(name.trim().to_owned());
        }
        Some(_) => issues.push(Issue::coded(
            "name",
            Code::InvalidField,
            format!("name must be non-blank text of at most {MAX_NAME_CHARS} characters"),
        )),
    }
    if let Some(value) = body.get("audience") {
        update.audience = audience(value, &mut issues);
    }
    match body.get("scheduledAt") {
        None => {}
        Some(Value::Null) => update.scheduled_at_ms = Some(None),
        Some(Value::String(text)) => match chrono::DateTime::parse_from_rfc3339(text) {
            Ok(at) if at.timestamp_millis() > 0 => update.scheduled_at_ms = Some(Some(at.timestamp_millis())),
            _ => issues.push(Issue::coded(
                "scheduledAt",
                Code::InvalidField,
                "scheduledAt must be an RFC 3339 date-time after 1970 (or null to send at once)",
            )),
        },
        Some(_) => issues.push(Issue::coded("scheduledAt", Code::InvalidField, "scheduledAt must be a string or null")),
    }
    if issues.is_empty() && update == Update::default() {
        issues.push(Issue {
            key: None,
            code: Some(Code::MissingField),
            message: "an update needs at least one of name, audience, scheduledAt".to_owned(),
        });
    }
    if issues.is_empty() { Ok(update) } else { Err(invalid(issues)) }
}

/// When a run requested at `now` starts: at the schedule when it is still ahead, else at once.
pub fn start_at(scheduled_at_ms: Option<i64>, now: i64) -> i64 {
    scheduled_at_ms.filter(|at| *at > now).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(value: Value) -> Map<String, Value> {
        value.as_object().cloned().expect("an object")
    }

    #[test]
    fn given_an_update_when_parsed_then_each_field_is_checked() {
        let update =
            parse_update(&body(json!({"name": " Launch ", "audience": {"segmentId": "seg_1"}, "scheduledAt": null})))
                .expect("valid");
        assert_eq!(update.name.as_deref(), Some("Launch"));
        assert_eq!(update.audience, Some(Audience::Segment { segment_id: "seg_1".into() }));
        assert_eq!(update.scheduled_at_ms, Some(None));
        let at = parse_update(&body(json!({"scheduledAt": "2030-01-02T03:04:05Z"}))).expect("valid");
        assert_eq!(at.scheduled_at_ms, Some(Some(1_893_553_445_000)));
        for bad in [
            json!({}),
            json!({"templateId": "tpl_1"}),
            json!({"name": ""}),
            json!({"audience": {"segmentId": "seg_1", "topicId": "top_1"}}),
            json!({"audience": "everyone"}),
            json!({"scheduledAt": "tomorrow"}),
        ] {
            assert!(matches!(parse_update(&body(bad.clone())), Err(Refusal::Invalid { .. })), "{bad}");
        }
    }

    #[test]
    fn given_a_schedule_when_a_run_is_requested_then_it_starts_then_or_at_once_if_past() {
        assert_eq!(start_at(Some(5_000), 1_000), 5_000);
        assert_eq!(start_at(Some(500), 1_000), 1_000);
        assert_eq!(start_at(None, 1_000), 1_000);
    }
}
