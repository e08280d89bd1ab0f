//! The Segment HTTP Tracking API's messages as this platform takes them (`POST
//! /v1/{identify,track,page,screen,group,alias,batch}`): the envelope's limits, a message read
//! into what it asks, its traits and properties matched to a schema's attributes, and a batch
//! split into clusters of messages that share an identity (decided in order within a cluster,
//! clusters side by side). Pure: the command service loads, decides and appends.

use std::collections::{BTreeMap, HashMap};

use chrono::DateTime;
use kernel::error::Code;
use serde_json::{Map, Value};

use crate::catalog::AttributeEntry;

/// The resource kind of a write key (the workspace file's `writeKeys`).
pub const WRITE_KEY: &str = "write_key";

/// The most bytes one message may take, as JSON (Segment's limit).
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024;
/// The most bytes a request's body may take, decoded (Segment's batch limit).
pub const MAX_BATCH_BYTES: usize = 500 * 1024;

/// What a message asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Identify,
    Track,
    Page,
    Screen,
    Group,
    Alias,
}

impl Kind {
    pub const ALL: [Kind; 6] = [Kind::Identify, Kind::Track, Kind::Page, Kind::Screen, Kind::Group, Kind::Alias];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Identify => "identify",
            Kind::Track => "track",
            Kind::Page => "page",
            Kind::Screen => "screen",
            Kind::Group => "group",
            Kind::Alias => "alias",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == text)
    }

    /// Whether the message records an event (track, page, screen).
    pub fn is_event(self) -> bool {
        matches!(self, Kind::Track | Kind::Page | Kind::Screen)
    }
}

/// Why a message is not applied: a code and a reason in words. Kept with the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub code: Code,
    pub reason: String,
}

impl Refused {
    pub fn new(code: Code, reason: impl Into<String>) -> Self {
        Self { code, reason: reason.into() }
    }
}

/// A message read: what it asks, of whom, and its data.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub kind: Kind,
    /// The message's id: the idempotency key of its effect (a track's eventId).
    pub message_id: String,
    pub user_id: Option<String>,
    pub anonymous_id: Option<String>,
    /// When it happened (`timestamp`), in milliseconds; `None`: when it is received.
    pub timestamp_ms: Option<i64>,
    /// `traits` (identify, group).
    pub traits: Map<String, Value>,
    /// `event` (track).
    pub event: Option<String>,
    /// `name` (page, screen).
    pub name: Option<String>,
    /// `category` (page).
    pub category: Option<String>,
    /// `properties` (track, page, screen).
    pub properties: Map<String, Value>,
    /// `groupId` (group).
    pub group_id: Option<String>,
    /// `previousId` (alias).
    pub previous_id: Option<String>,
}

/// An id as Segment's clients send it: a string, or a number written as one.
fn id_of(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(text) if !text.trim().is_empty() => Some(text.trim().to_owned()),
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    }
}

fn object_of(value: Option<&Value>) -> Result<Map<String, Value>, ()> {
    match value {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(object)) => Ok(object.clone()),
        Some(_) => Err(()),
    }
}

fn text_of(value: Option<&Value>) -> Option<String> {
    value.and_then(Value::as_str).map(str::trim).filter(|text| !text.is_empty()).map(str::to_owned)
}

/// The type a batch item names (its `type`), or the path's for a single message. `None`:
/// none, or one that is no message type (the whole request is refused, as Segment does).
pub fn kind_of(item: &Value, path_kind: Option<Kind>) -> Option<Kind> {
    match item.get("type") {
        Some(Value::String(kind)) => Kind::parse(kind),
        None if path_kind.is_some() => path_kind,
        _ => None,
    }
}

/// Reads one message of kind `kind`. `generated_id` names a message that has no
/// `messageId` (every Segment client sends one; without it the message is never a duplicate).
pub fn read(kind: Kind, item: &Value, generated_id: impl FnOnce() -> String) -> Result<Message, Refused> {
    let invalid = |reason: &str| Refused::new(Code::InvalidField, reason);
    let Value::Object(fields) = item else { return Err(invalid("a message is a JSON object")) };
    let message_id = match fields.get("messageId") {
        None | Some(Value::Null) => generated_id(),
        Some(text @ Value::String(_)) => {
            id_of(Some(text)).ok_or_else(|| invalid("messageId must be a non-empty string"))?
        }
        Some(_) => return Err(invalid("messageId must be a string")),
    };
    if message_id.chars().count() > 512 {
        return Err(invalid("messageId must be at most 512 characters"));
    }
    let timestamp_ms = match fields.get("timestamp").or_else(|| fields.get("originalTimestamp")) {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(
            DateTime::parse_from_rfc3339(text)
                .map_err(|_| invalid("timestamp must be an ISO 8601 date-time with its offset"))?
                .timestamp_millis(),
        ),
        Some(_) => return Err(invalid("timestamp must be an ISO 8601 date-time string")),
    };
    // Each field the message schema names holds its type, whatever the message's type uses.
    for name in ["userId", "anonymousId", "groupId", "previousId"] {
        if fields.get(name).is_some_and(|id| !(id.is_string() || id.is_number() || id.is_null())) {
            return Err(invalid(&format!("{name} must be a string or a number")));
        }
    }
    for name in ["event", "name", "category"] {
        if fields.get(name).is_some_and(|text| !(text.is_string() || text.is_null())) {
            return Err(invalid(&format!("{name} must be a string")));
        }
    }
    let traits = object_of(fields.get("traits")).map_err(|()| invalid("traits must be an object"))?;
    let properties = object_of(fields.get("properties")).map_err(|()| invalid("properties must be an object"))?;
    let message = Message {
        kind,
        message_id,
        user_id: id_of(fields.get("userId")),
        anonymous_id: id_of(fields.get("anonymousId")),
        timestamp_ms,
        traits,
        event: text_of(fields.get("event")),
        name: text_of(fields.get("name")),
        category: text_of(fields.get("category")),
        properties,
        group_id: id_of(fields.get("groupId")),
        previous_id: id_of(fields.get("previousId")),
    };
    for (id, name) in [
        (&message.user_id, "userId"),
        (&message.anonymous_id, "anonymousId"),
        (&message.group_id, "groupId"),
        (&message.previous_id, "previousId"),
    ] {
        if id.as_ref().is_some_and(|id| id.chars().count() > 512) {
            return Err(invalid(&format!("{name} must be at most 512 characters")));
        }
    }
    let missing = |what: &str| Refused::new(Code::MissingField, format!("a {} message needs {what}", kind.as_str()));
    match kind {
        Kind::Alias if message.previous_id.is_none() || message.user_id.is_none() => {
            Err(missing("previousId and userId"))
        }
        Kind::Alias => Ok(message),
        _ if message.user_id.is_none() && message.anonymous_id.is_none() => Err(missing("userId or anonymousId")),
        Kind::Track if message.event.is_none() => Err(missing("event (the event's name)")),
        Kind::Group if message.group_id.is_none() => Err(missing("groupId")),
        _ => Ok(message),
    }
}

/// A key folded for matching: its letters and digits, lowercased (`first_name`,
/// `First Name` and `firstName` are one key).
fn folded(key: &str) -> String {
    key.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect()
}

/// Traits or properties matched to a schema's writable attributes: the record (or event)
/// input they fill, and the rest, kept with the message. An attribute is matched by its key,
/// exactly or folded (`first_name` fills `firstName`); `identities` (`email`, `phone`, ...)
/// fill the identity fields of the same names.
pub fn matched(
    values: &Map<String, Value>,
    attributes: &[AttributeEntry],
    identities: &[&str],
) -> (Map<String, Value>, Map<String, Value>) {
    let writable: Vec<&AttributeEntry> =
        attributes.iter().filter(|attribute| crate::catalog::is_writable(&attribute.definition)).collect();
    let by_fold: HashMap<String, &str> = writable
        .iter()
        .map(|attribute| attribute.key.as_str())
        .chain(identities.iter().copied())
        .map(|key| (folded(key), key))
        .collect();
    let (mut input, mut rest) = (Map::new(), Map::new());
    for (key, value) in values {
        let target = identities
            .iter()
            .copied()
            .chain(writable.iter().map(|attribute| attribute.key.as_str()))
            .find(|target| *target == key)
            .or_else(|| by_fold.get(&folded(key)).copied());
        match target {
            // An exact key wins over a folded one naming the same attribute.
            Some(target) if !input.contains_key(target) || target == key => {
                input.insert(target.to_owned(), value.clone());
            }
            _ => {
                rest.insert(key.clone(), value.clone());
            }
        }
    }
    (input, rest)
}

/// The event schema a track's `event` name is recorded under: the write key's mapping, else
/// the schema whose slug is the name, or the name written as a slug (`Order Completed` is
/// `order-completed`).
pub fn event_schema_for<'a>(
    event: &str,
    mapping: &'a BTreeMap<String, String>,
    slugs: &'a BTreeMap<String, String>,
) -> Option<&'a String> {
    mapping.get(event).or_else(|| slugs.get(event)).or_else(|| slugs.get(&slug_of(event)))
}

/// `name` written as a slug: lowercase letters and digits, runs of anything else one `-`.
pub fn slug_of(name: &str) -> String {
    let mut slug = String::new();
    for c in name.trim().chars() {
        if c.is_alphanumeric() {
            slug.extend(c.to_lowercase());
        } else if !slug.ends_with('-') && !slug.is_empty() {
            slug.push('-');
        }
    }
    slug.trim_end_matches('-').to_owned()
}

/// The identities a message names (`user:` and `anon:` prefixed), which tie it to others.
fn identities_of(message: &Message) -> Vec<String> {
    let mut ids = Vec::new();
    ids.extend(message.user_id.iter().map(|id| format!("user:{id}")));
    ids.extend(message.anonymous_id.iter().map(|id| format!("anon:{id}")));
    ids.extend(message.previous_id.iter().map(|id| format!("anon:{id}")));
    ids
}

/// Splits messages (by index) into clusters: messages that share an identity, directly or
/// through others, are one cluster, in their order; clusters in the order of their first
/// message. A cluster is decided in order, so an identify, an alias and the events around
/// them land on the contact they name at that point of the batch.
pub fn clusters(messages: &[&Message]) -> Vec<Vec<usize>> {
    let mut parent: Vec<usize> = (0..messages.len()).collect();
    fn root(parent: &mut [usize], mut index: usize) -> usize {
        while parent[index] != index {
            parent[index] = parent[parent[index]];
            index = parent[index];
        }
        index
    }
    let mut first_with: HashMap<String, usize> = HashMap::new();
    for (index, message) in messages.iter().enumerate() {
        for id in identities_of(message) {
            match first_with.get(&id) {
                Some(&other) => {
                    let (a, b) = (root(&mut parent, index), root(&mut parent, other));
                    if a != b {
                        parent[a.max(b)] = a.min(b);
                    }
                }
                None => {
                    first_with.insert(id, index);
                }
            }
        }
    }
    let mut grouped: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for index in 0..messages.len() {
        let cluster = root(&mut parent, index);
        grouped.entry(cluster).or_default().push(index);
    }
    grouped.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read_ok(kind: Kind, item: Value) -> Message {
        read(kind, &item, || "generated".to_owned()).expect("a message")
    }

    #[test]
    fn a_message_is_read_with_its_ids_time_and_data_and_one_without_what_its_type_needs_is_refused() {
        let track = read_ok(
            Kind::Track,
            json!({"type": "track", "messageId": "m-1", "userId": 42, "event": "Order Completed",
                   "timestamp": "2026-12-01T10:00:00.250+01:00", "properties": {"total": 9.5}}),
        );
        assert_eq!((track.message_id.as_str(), track.user_id.as_deref()), ("m-1", Some("42")));
        assert_eq!(track.timestamp_ms, Some(1_796_115_600_250));
        assert_eq!(track.event.as_deref(), Some("Order Completed"));
        assert_eq!(track.properties["total"], json!(9.5));
        let generated = read_ok(Kind::Identify, json!({"anonymousId": "a-1", "traits": {"email": "a@b.io"}}));
        assert_eq!(generated.message_id, "generated");

        for (kind, item, code) in [
            (Kind::Track, json!({"messageId": "m", "event": "x"}), Code::MissingField),
            (Kind::Track, json!({"messageId": "m", "userId": "u"}), Code::MissingField),
            (Kind::Group, json!({"messageId": "m", "userId": "u"}), Code::MissingField),
            (Kind::Alias, json!({"messageId": "m", "userId": "u"}), Code::MissingField),
            (Kind::Identify, json!({"userId": "u", "traits": []}), Code::InvalidField),
            (Kind::Identify, json!({"userId": "u", "timestamp": "yesterday"}), Code::InvalidField),
            (Kind::Identify, json!("a string"), Code::InvalidField),
            // A field the type does not use still holds the schema's type.
            (Kind::Identify, json!({"userId": "u", "previousId": {}}), Code::InvalidField),
            (Kind::Alias, json!({"userId": "u", "previousId": "a", "groupId": [1]}), Code::InvalidField),
            (Kind::Page, json!({"userId": "u", "event": true}), Code::InvalidField),
            (Kind::Identify, json!({"userId": "u", "messageId": 7}), Code::InvalidField),
        ] {
            let refused = read(kind, &item, || "g".to_owned()).expect_err("refused");
            assert_eq!(refused.code, code, "{item}: {refused:?}");
        }
    }

    #[test]
    fn the_type_is_the_items_or_the_paths_and_an_unknown_one_is_none() {
        assert_eq!(kind_of(&json!({"type": "page"}), None), Some(Kind::Page));
        assert_eq!(kind_of(&json!({}), Some(Kind::Track)), Some(Kind::Track));
        assert_eq!(kind_of(&json!({}), None), None);
        assert_eq!(kind_of(&json!({"type": "purchase"}), None), None);
    }

    #[test]
    fn traits_fill_the_attributes_they_name_exactly_or_folded_and_the_rest_is_kept_apart() {
        let attributes = vec![
            AttributeEntry { key: "firstName".into(), definition: json!({"type": "string"}) },
            AttributeEntry { key: "plan".into(), definition: json!({"type": "string"}) },
            AttributeEntry { key: "score".into(), definition: json!({"type": "evaluated"}) },
        ];
        let traits = json!({"first_name": "Ada", "Plan": "pro", "email": "Ada@Example.com", "score": 3,
                            "favouriteColour": "green"});
        let (input, rest) = matched(traits.as_object().expect("an object"), &attributes, &["email", "phone"]);
        assert_eq!(Value::Object(input), json!({"firstName": "Ada", "plan": "pro", "email": "Ada@Example.com"}));
        assert_eq!(Value::Object(rest), json!({"score": 3, "favouriteColour": "green"}), "an evaluated one is kept");
    }

    #[test]
    fn an_event_name_finds_its_schema_by_the_mapping_its_slug_or_its_name_as_a_slug() {
        let mapping = BTreeMap::from([("Signed Up".to_owned(), "sch_signup".to_owned())]);
        let slugs = BTreeMap::from([
            ("order-completed".to_owned(), "sch_order".to_owned()),
            ("viewed".to_owned(), "sch_viewed".to_owned()),
        ]);
        assert_eq!(event_schema_for("Signed Up", &mapping, &slugs).map(String::as_str), Some("sch_signup"));
        assert_eq!(event_schema_for("Order Completed", &mapping, &slugs).map(String::as_str), Some("sch_order"));
        assert_eq!(event_schema_for("viewed", &mapping, &slugs).map(String::as_str), Some("sch_viewed"));
        assert_eq!(event_schema_for("Refunded", &mapping, &slugs), None);
        assert_eq!(slug_of("  Order -- Completed!  "), "order-completed");
    }

    #[test]
    fn messages_sharing_an_identity_through_others_are_one_cluster_in_their_order() {
        let message = |user: Option<&str>, anon: Option<&str>, previous: Option<&str>| Message {
            kind: Kind::Track,
            message_id: "m".into(),
            user_id: user.map(str::to_owned),
            anonymous_id: anon.map(str::to_owned),
            timestamp_ms: None,
            traits: Map::new(),
            event: None,
            name: None,
            category: None,
            properties: Map::new(),
            group_id: None,
            previous_id: previous.map(str::to_owned),
        };
        let messages = [
            message(None, Some("a1"), None),       // 0: a visitor
            message(Some("u2"), None, None),       // 1: another user
            message(Some("u1"), None, Some("a1")), // 2: alias a1 -> u1
            message(Some("u1"), None, None),       // 3: the visitor, known now
            message(Some("u2"), Some("a9"), None), // 4
            message(None, Some("a9"), None),       // 5
        ];
        let refs: Vec<&Message> = messages.iter().collect();
        assert_eq!(clusters(&refs), [vec![0, 2, 3], vec![1, 4, 5]]);
    }
}
