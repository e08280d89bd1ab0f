//! `topics` in a contact's record write (create, upsert and PATCH): the API's door to a
//! contact's topic subscriptions, so a developer who makes a contact can make it reachable by
//! the marketing mail of a topic in the same request, as an import row's `topics` column and a
//! form do. A list subscribes to each topic it names; an object sets each named topic
//! `subscribed` or `unsubscribed`. Topics are named by slug, name or id. Each change is a
//! `SubscriptionChanged` with source `api` and the write's operation id (the audit trail names
//! the key that made it); a topic already in the wanted state writes nothing. Subscribing
//! grants no consent: marketing mail needs the contact's email consent too. Pure: the facts
//! come from `load::load_topics`.

use std::collections::BTreeMap;

use platform::error::{Code, Issue};
use platform::log::StreamAppend;
use serde_json::{Map, Value};

use crate::emails::decide::subscriptions::{Source, subscription_changes};
use domain::records::decide::RecordRefusal;

/// The key of a contact write that holds its topics.
pub(crate) const TOPICS: &str = "topics";

/// The statuses a write asks for: each topic as the body names it, and whether it is wanted
/// subscribed, in the body's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wanted(Vec<(String, bool)>);

impl Wanted {
    /// Takes `topics` out of a write's `input` for a schema of `schema_type`: `None` when the
    /// body has none. On an object schema the key stays, to be refused as any unknown
    /// attribute is.
    pub(crate) fn take(schema_type: &str, input: &mut Map<String, Value>) -> Result<Option<Self>, RecordRefusal> {
        if schema_type != "contact" {
            return Ok(None);
        }
        let Some(topics) = input.remove(TOPICS) else { return Ok(None) };
        let refused = |message: &str| {
            RecordRefusal::invalid(Code::InvalidField, message.to_owned(), vec![Issue::for_key(TOPICS, message)])
        };
        let wanted = match topics {
            Value::Array(items) => items
                .into_iter()
                .map(|item| match item {
                    Value::String(topic) => Ok((topic, true)),
                    _ => Err(refused(SHAPE)),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Value::Object(statuses) => statuses
                .into_iter()
                .map(|(topic, status)| match status.as_str() {
                    Some("subscribed") => Ok((topic, true)),
                    Some("unsubscribed") => Ok((topic, false)),
                    _ => Err(refused(SHAPE)),
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => return Err(refused(SHAPE)),
        };
        Ok(Some(Self(wanted)))
    }
}

const SHAPE: &str = "topics is a list of topics to subscribe to, or an object of topics to \"subscribed\" or \
                     \"unsubscribed\"; name each topic by its slug, name or id";

/// What the decision reads about topics: the space's topics by each of their references (slug,
/// name and id, each to the id), and the contact's status in each (none for a new contact).
#[derive(Debug, Clone, Default)]
pub(crate) struct TopicFacts {
    pub by_reference: BTreeMap<String, String>,
    pub current: BTreeMap<String, String>,
}

/// The subscription changes `wanted` makes for contact `contact_id` of `space_id`: the
/// contact's subscriptions stream with one `SubscriptionChanged` per topic whose status
/// changes (source `api`, the write's `operation_id`), or `None` when none does. A topic the
/// space does not have refuses the write, naming it.
pub(crate) fn decide(
    wanted: &Wanted,
    facts: &TopicFacts,
    (space_id, contact_id): (&str, &str),
    operation_id: &str,
    now: i64,
) -> Result<Option<StreamAppend>, RecordRefusal> {
    let mut unknown = Vec::new();
    let mut statuses: BTreeMap<&String, bool> = BTreeMap::new();
    for (reference, subscribed) in &wanted.0 {
        match facts.by_reference.get(reference) {
            Some(topic_id) => {
                statuses.insert(topic_id, *subscribed);
            }
            None => unknown.push(Issue::coded(
                format!("{TOPICS}.{reference}"),
                Code::TopicNotFound,
                format!("the space has no topic {reference:?}"),
            )),
        }
    }
    if !unknown.is_empty() {
        let message = Issue::summary(&unknown, "topics");
        return Err(RecordRefusal::invalid(Code::InvalidField, message, unknown));
    }
    let status_of = |topic_id: &String| facts.current.get(topic_id).map(String::as_str);
    let to_subscribe: Vec<&String> = statuses
        .iter()
        .filter(|(topic_id, subscribed)| **subscribed && status_of(topic_id) != Some("subscribed"))
        .map(|(topic_id, _)| *topic_id)
        .collect();
    let to_leave: Vec<&String> = statuses
        .iter()
        .filter(|(topic_id, subscribed)| !**subscribed && matches!(status_of(topic_id), Some("subscribed" | "pending")))
        .map(|(topic_id, _)| *topic_id)
        .collect();
    let source = Source { kind: "api", id: operation_id };
    let mut changes = subscription_changes((space_id, contact_id), &to_subscribe, "subscribed", source, now);
    if let Some(left) = subscription_changes((space_id, contact_id), &to_leave, "unsubscribed", source, now) {
        match &mut changes {
            Some(stream) => stream.events.extend(left.events),
            None => changes = Some(left),
        }
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use platform::events::LogEvent;
    use platform::refusal::Refusal as _;
    use serde_json::json;

    fn facts(current: &[(&str, &str)]) -> TopicFacts {
        let by_reference = [("news", "top_1"), ("News", "top_1"), ("top_1", "top_1"), ("offers", "top_2")]
            .into_iter()
            .map(|(reference, id)| (reference.to_owned(), id.to_owned()))
            .collect();
        let current = current.iter().map(|(topic, status)| ((*topic).to_owned(), (*status).to_owned())).collect();
        TopicFacts { by_reference, current }
    }

    fn take(body: Value) -> Result<Option<Wanted>, RecordRefusal> {
        let mut input = body.as_object().cloned().expect("an object");
        let wanted = Wanted::take("contact", &mut input);
        assert!(!input.contains_key(TOPICS), "taken out of the record's input");
        wanted
    }

    /// The (topic, status, source, source id) of each change.
    fn changes(stream: Option<StreamAppend>) -> Vec<(String, String, String, String)> {
        stream
            .into_iter()
            .flat_map(|stream| stream.events)
            .filter_map(|event| match event.event {
                LogEvent::SubscriptionChanged(changed) => {
                    Some((changed.topic_id, changed.status, changed.source, changed.source_id))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_list_subscribes_by_slug_name_or_id_once_each_and_an_object_sets_each_status() {
        let wanted = take(json!({"email": "a@b.io", "topics": ["news", "News", "offers"]})).expect("valid");
        let stream = decide(&wanted.expect("topics"), &facts(&[]), ("spc_1", "con_1"), "op_1", 5).expect("decided");
        assert_eq!(stream.as_ref().map(|stream| stream.stream_id.as_str()), Some("subscriptions-con_1"));
        let subscribed = |topic: &str| (topic.to_owned(), "subscribed".to_owned(), "api".to_owned(), "op_1".to_owned());
        assert_eq!(changes(stream), [subscribed("top_1"), subscribed("top_2")]);

        let wanted = take(json!({"topics": {"news": "unsubscribed", "offers": "subscribed"}})).expect("valid");
        let current = facts(&[("top_1", "subscribed"), ("top_2", "subscribed")]);
        let stream = decide(&wanted.expect("topics"), &current, ("spc_1", "con_1"), "op_2", 5).expect("decided");
        let left = ("top_1".to_owned(), "unsubscribed".to_owned(), "api".to_owned(), "op_2".to_owned());
        assert_eq!(changes(stream), [left], "a topic already as wanted writes nothing");
    }

    #[test]
    fn nothing_changes_without_topics_or_when_every_topic_is_as_wanted() {
        assert_eq!(take(json!({"email": "a@b.io"})).expect("valid"), None);
        let wanted = take(json!({"topics": ["news"]})).expect("valid").expect("topics");
        let current = facts(&[("top_1", "subscribed")]);
        assert!(decide(&wanted, &current, ("spc_1", "con_1"), "op_1", 5).expect("decided").is_none());
        let mut object_input = json!({"topics": ["news"]}).as_object().cloned().expect("an object");
        assert_eq!(Wanted::take("object", &mut object_input).expect("valid"), None);
        assert!(object_input.contains_key(TOPICS), "an object schema's topics is an unknown attribute as before");
    }

    #[test]
    fn an_unknown_topic_or_a_bad_shape_is_refused_naming_it() {
        let wanted = take(json!({"topics": ["news", "nope"]})).expect("valid").expect("topics");
        let refused = decide(&wanted, &facts(&[]), ("spc_1", "con_1"), "op_1", 5).expect_err("refused");
        let RecordRefusal::Invalid { code, issues, .. } = refused else { panic!("invalid: {refused:?}") };
        assert_eq!(code, Code::InvalidField);
        assert_eq!((issues[0].key.as_deref(), issues[0].code), (Some("topics.nope"), Some(Code::TopicNotFound)));
        for bad in [json!({"topics": "news"}), json!({"topics": [1]}), json!({"topics": {"news": true}})] {
            let refused = take(bad.clone()).expect_err("refused");
            assert_eq!(refused.code(), Code::InvalidField, "{bad}");
        }
    }
}
