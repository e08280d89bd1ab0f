//! `POST /emails/{emailId}/preferences`: the recipient's choices from the preference page
//! (the page behind the email's unsubscribe link). Public like the unsubscribe link: the
//! email id, only ever sent to its recipient, names the contact and the space.
//!
//! Two choices: each topic of the space subscribed or not, or everything left (every topic
//! unsubscribed and the marketing consent withdrawn). Each change is a logged
//! `SubscriptionChanged` with source `preferences` (and a consent change a record update
//! carried by the email), so the audit trail shows it. Leaving the email's topic, or
//! everything, is an opt-out through the email as the one-click link's is (D11): the email's
//! `EmailUnsubscribed`, once, which its run's or step's count and `email.unsubscribed` follow. Subscribing to a topic from the page also grants
//! the email consent the contact had withdrawn: it is the recipient's own, explicit choice.
//! A choice that changes nothing writes nothing and answers the same.
//!
//! Body: JSON `{"topics": {"top_…": "subscribed" | "unsubscribed"}}` or
//! `{"unsubscribeAll": true}`; or what the page posts, urlencoded: `action=save` with one
//! `top_…=subscribed|unsubscribed` per topic, or `action=unsubscribe_all`. The page's post is
//! answered with a page, JSON with JSON.

use std::collections::BTreeMap;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use platform::error::{ApiError, Code, Issue};
use serde_json::{Map, Value, json};

use super::consent::{Source, set_email_consent, subscription_changes};
use super::unsubscribe::{self, Email};
use crate::State;
use crate::pipeline::{self, Actor, Answer, Ctx, Decided, Decision, Given, Legacy, Protection};
use crate::records::write::Write;

/// What the recipient chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// Each named topic subscribed (`true`) or not.
    Topics(BTreeMap<String, bool>),
    /// Every topic left and the marketing consent withdrawn.
    LeaveAll,
}

/// Parses a body into a choice (pure). A urlencoded body is the page's form.
pub fn parse(fields: &Map<String, Value>, urlencoded: bool) -> Result<Choice, ApiError> {
    let invalid = |issues: Vec<Issue>| {
        let message = issues.first().map_or_else(String::new, |issue| issue.message.clone());
        ApiError::bad_request(Code::InvalidPreferences, message).with_issues(issues)
    };
    let status = |key: &str, value: &Value| match value.as_str() {
        Some("subscribed") => Ok(true),
        Some("unsubscribed") => Ok(false),
        _ => Err(Issue::for_key(key, format!("{key} must be \"subscribed\" or \"unsubscribed\""))),
    };
    let mut issues = Vec::new();
    if urlencoded {
        let action = fields.get("action").and_then(Value::as_str).unwrap_or("save");
        let mut topics = BTreeMap::new();
        for (key, value) in fields.iter().filter(|(key, _)| *key != "action") {
            if !key.starts_with("top_") {
                issues.push(Issue::for_key(key, format!("{key} is not a topic")));
                continue;
            }
            match status(key, value) {
                Ok(subscribed) => {
                    topics.insert(key.clone(), subscribed);
                }
                Err(issue) => issues.push(issue),
            }
        }
        return match (action, issues.is_empty()) {
            ("unsubscribe_all", _) => Ok(Choice::LeaveAll),
            ("save", true) => Ok(Choice::Topics(topics)),
            ("save", false) => Err(invalid(issues)),
            (other, _) => Err(invalid(vec![Issue::for_key(
                "action",
                format!("action must be \"save\" or \"unsubscribe_all\"; got {other:?}"),
            )])),
        };
    }
    for key in fields.keys().filter(|key| !["topics", "unsubscribeAll"].contains(&key.as_str())) {
        issues.push(Issue::for_key(key, format!("{key} is not a field of a preference change")));
    }
    let leave_all = match fields.get("unsubscribeAll") {
        None | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(_) => {
            issues.push(Issue::for_key("unsubscribeAll", "unsubscribeAll must be a boolean"));
            false
        }
    };
    let mut topics = BTreeMap::new();
    match fields.get("topics") {
        None => {}
        Some(Value::Object(given)) => {
            for (topic_id, value) in given {
                let key = format!("topics.{topic_id}");
                match status(&key, value) {
                    Ok(subscribed) => {
                        topics.insert(topic_id.clone(), subscribed);
                    }
                    Err(issue) => issues.push(issue),
                }
            }
        }
        Some(_) => issues.push(Issue::for_key("topics", "topics must be an object of topic ids to statuses")),
    }
    if leave_all && !topics.is_empty() {
        issues.push(Issue::for_key("topics", "give either topics or unsubscribeAll, not both"));
    }
    if !leave_all && topics.is_empty() && issues.is_empty() {
        issues.push(Issue::for_key("topics", "name at least one topic, or set unsubscribeAll"));
    }
    if !issues.is_empty() {
        return Err(invalid(issues));
    }
    Ok(if leave_all { Choice::LeaveAll } else { Choice::Topics(topics) })
}

/// What a change decides on.
struct Loaded {
    email: Email,
    /// The space's topics: id → name.
    topics: BTreeMap<String, String>,
    /// The contact's subscriptions: topic id → status.
    subscribed: BTreeMap<String, String>,
    /// The consent change the choice needs (granted or withdrawn), when it changes anything.
    consent: Option<Write>,
}

struct ChangePreferences {
    email_id: String,
    choice: Choice,
    browser: bool,
}

impl Legacy for ChangePreferences {
    type Loaded = Loaded;

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Loaded, ApiError> {
        let email =
            unsubscribe::load(ctx, &self.email_id).await?.ok_or_else(|| unsubscribe::not_found(&self.email_id))?;
        let (space_id, contact_id) = (&email.scheduled.space_id, &email.scheduled.contact_id);
        let catalog = ctx.catalog().await?;
        let client = ctx.db().await?;
        let topics: BTreeMap<String, String> = reads::email::topics(&client, &catalog, space_id)
            .await
            .map_err(|error| ApiError::internal(&error))?
            .into_iter()
            .map(|(topic_id, topic)| (topic_id, topic.name))
            .collect();
        let subscribed =
            reads::email::subscriptions(&client, contact_id).await.map_err(|error| ApiError::internal(&error))?;
        drop(client);
        if let Choice::Topics(chosen) = &self.choice {
            let unknown: Vec<Issue> = chosen
                .keys()
                .filter(|topic_id| !topics.contains_key(*topic_id))
                .map(|topic_id| {
                    Issue::for_key(format!("topics.{topic_id}"), format!("no topic {topic_id:?} in this space"))
                })
                .collect();
            if !unknown.is_empty() {
                return Err(ApiError::bad_request(Code::InvalidPreferences, "a topic is not one of the space's")
                    .with_issues(unknown));
            }
        }
        let consent = match &self.choice {
            Choice::LeaveAll => Some(false),
            Choice::Topics(chosen) if chosen.values().any(|subscribed| *subscribed) => Some(true),
            Choice::Topics(_) => None,
        };
        let consent = match consent {
            Some(consented) => {
                let source = Source { kind: "preferences", id: &self.email_id };
                set_email_consent(ctx, (space_id, contact_id), consented, source, platform::time::now_millis()).await?
            }
            None => None,
        };
        Ok(Loaded { email, topics, subscribed, consent })
    }

    fn decide(&self, loaded: Loaded, given: &Given<'_>) -> Result<Decided, ApiError> {
        let Loaded { email, topics, subscribed, consent } = loaded;
        let (space_id, contact_id) = (email.scheduled.space_id.as_str(), email.scheduled.contact_id.as_str());
        let wanted: BTreeMap<&String, bool> = match &self.choice {
            Choice::LeaveAll => topics.keys().map(|topic_id| (topic_id, false)).collect(),
            Choice::Topics(chosen) => chosen.iter().map(|(topic_id, subscribed)| (topic_id, *subscribed)).collect(),
        };
        let status_of = |topic_id: &String| subscribed.get(topic_id).map(String::as_str);
        let is_subscribed = |topic_id: &String| status_of(topic_id) == Some("subscribed");
        // A subscription still waiting for its double opt-in is not one yet: choosing it on the
        // page subscribes, and leaving it ends the wait.
        let to_subscribe: Vec<&String> =
            wanted.iter().filter(|(topic_id, want)| **want && !is_subscribed(topic_id)).map(|(id, _)| *id).collect();
        let to_leave: Vec<&String> = wanted
            .iter()
            .filter(|(topic_id, want)| !**want && matches!(status_of(topic_id), Some("subscribed" | "pending")))
            .map(|(id, _)| *id)
            .collect();
        let mut after: BTreeMap<&String, bool> =
            topics.keys().map(|topic_id| (topic_id, is_subscribed(topic_id))).collect();
        after.extend(wanted.iter().map(|(topic_id, want)| (*topic_id, *want)));
        let answer = self.answer(&topics, &after);
        let mut streams = Vec::new();
        let mut guards = Vec::new();
        if let Some(write) = consent {
            streams.push(write.stream);
            guards.extend(write.guards);
        }
        let now = given.now_ms;
        let source = || Source { kind: "preferences", id: &self.email_id };
        streams.extend(subscription_changes((space_id, contact_id), &to_subscribe, "subscribed", source(), now));
        streams.extend(subscription_changes((space_id, contact_id), &to_leave, "unsubscribed", source(), now));
        if streams.is_empty() {
            return Ok(Decided::Answer(answer));
        }
        // An opt-out made through this email counts as the one-click link's does: leaving its
        // topic, or leaving everything (D11).
        let topic = &email.scheduled.topic_id;
        let opted_out = match &self.choice {
            Choice::LeaveAll => true,
            Choice::Topics(_) => !topic.is_empty() && to_leave.contains(&topic),
        };
        if opted_out && !email.unsubscribed {
            streams.push(unsubscribe::unsubscribed(&self.email_id, &email, now));
        }
        Ok(Decided::Append(Decision::new(streams, guards, answer).in_space(space_id)))
    }

    fn lost_too_often(&self) -> ApiError {
        ApiError::conflict(Code::ConcurrentModification, "the recipient's preferences kept changing; retry")
    }
}

impl ChangePreferences {
    /// The answer: every topic of the space with its status after the change.
    fn answer(&self, topics: &BTreeMap<String, String>, after: &BTreeMap<&String, bool>) -> Answer {
        let status = |subscribed: bool| if subscribed { "subscribed" } else { "unsubscribed" };
        if self.browser {
            let kept: Vec<&str> = after
                .iter()
                .filter(|(_, subscribed)| **subscribed)
                .filter_map(|(topic_id, _)| topics.get(*topic_id).map(String::as_str))
                .collect();
            let (title, text) = match (&self.choice, kept.is_empty()) {
                (Choice::LeaveAll, _) => (
                    "You are unsubscribed from everything",
                    "You will no longer receive marketing email from us.".to_owned(),
                ),
                (Choice::Topics(_), true) => {
                    ("Your preferences are saved", "You are not subscribed to any topic.".to_owned())
                }
                (Choice::Topics(_), false) => {
                    ("Your preferences are saved", format!("You are subscribed to: {}.", kept.join(", ")))
                }
            };
            let message = api::pages::Message::success(title, &[text.as_str()])
                .with_link("unsubscribe", "Back to your email preferences");
            return Answer::html(StatusCode::OK, message.page());
        }
        let subscriptions: Map<String, Value> =
            after.iter().map(|(topic_id, subscribed)| ((*topic_id).clone(), json!(status(*subscribed)))).collect();
        Answer::json(
            StatusCode::OK,
            json!({"data": {
                "emailId": self.email_id,
                "unsubscribedFromAll": self.choice == Choice::LeaveAll,
                "topics": subscriptions,
            }}),
        )
    }
}

#[tracing::instrument(skip_all, fields(email = %path.as_str()))]
pub async fn post(
    path: web::Path<String>,
    state: web::Data<State>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    let urlencoded = api::http::is_urlencoded(&req);
    let browser = api::pages::wants_html(&req, urlencoded);
    let email_id = path.into_inner();
    let result = async {
        if !platform::storable::is_storable(&email_id) || !email_id.starts_with("em_") {
            return Err(unsubscribe::not_found(&email_id));
        }
        let (fields, urlencoded) = api::http::read_form_or_json(&req, payload).await?;
        let choice = parse(&fields, urlencoded)?;
        let command = ChangePreferences { email_id, choice, browser };
        pipeline::execute(&state, &req, Actor::Public, Protection::Unkeyed, command).await
    }
    .await;
    api::pages::answer(browser, result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(value: Value) -> Map<String, Value> {
        value.as_object().cloned().expect("an object")
    }

    #[test]
    fn the_page_form_is_read_as_topics_or_leaving_all() {
        let saved = parse(&fields(json!({"action": "save", "top_a": "subscribed", "top_b": "unsubscribed"})), true);
        assert_eq!(saved.ok(), Some(Choice::Topics([("top_a".to_owned(), true), ("top_b".to_owned(), false)].into())));
        let all = parse(&fields(json!({"action": "unsubscribe_all", "top_a": "subscribed"})), true);
        assert_eq!(all.ok(), Some(Choice::LeaveAll));
        let code = |value: Value, urlencoded: bool| parse(&fields(value), urlencoded).err().and_then(|e| e.code());
        assert_eq!(code(json!({"action": "save", "top_a": "maybe"}), true), Some(Code::InvalidPreferences));
        assert_eq!(code(json!({"action": "save", "colour": "red"}), true), Some(Code::InvalidPreferences));
        assert_eq!(code(json!({"action": "shout"}), true), Some(Code::InvalidPreferences));
    }

    #[test]
    fn a_json_body_names_topics_or_unsubscribe_all_but_not_both() {
        let topics = parse(&fields(json!({"topics": {"top_a": "unsubscribed"}})), false);
        assert_eq!(topics.ok(), Some(Choice::Topics([("top_a".to_owned(), false)].into())));
        assert_eq!(parse(&fields(json!({"unsubscribeAll": true})), false).ok(), Some(Choice::LeaveAll));
        for invalid in [
            json!({}),
            json!({"unsubscribeAll": false}),
            json!({"unsubscribeAll": "yes"}),
            json!({"topics": []}),
            json!({"topics": {"top_a": true}}),
            json!({"topics": {"top_a": "subscribed"}, "unsubscribeAll": true}),
            json!({"topics": {"top_a": "subscribed"}, "colour": "red"}),
        ] {
            let refused = parse(&fields(invalid.clone()), false).expect_err("refused");
            assert_eq!(refused.code(), Some(Code::InvalidPreferences), "{invalid}");
            assert!(!refused.issues().is_empty(), "{invalid}");
        }
    }
}
