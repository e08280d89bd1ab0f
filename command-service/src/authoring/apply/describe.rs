//! What an apply changes, as a person reads it: each stream's latest event beside the one
//! appended, with secrets, key material and sealed data not shown, and the named resources
//! created, changed or removed.

use std::sync::LazyLock;

use platform::events::LogEvent;
use prost_reflect::{DescriptorPool, DynamicMessage, Kind, MapKey, ReflectMessage, Value as Field};
use serde_json::{Map, Value};

/// One stream an apply appends to: what its latest event was and what is appended.
#[derive(Debug, Clone)]
pub struct Change {
    pub stream_id: String,
    /// The type of the event appended.
    pub event_type: String,
    /// The stream's latest event before, as text (`None`: a new stream).
    pub before: Option<String>,
    /// The event appended, as text.
    pub after: String,
}

/// A resource an apply creates, changes or removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Touched {
    /// `created`, `changed` or `removed`.
    pub action: &'static str,
    pub kind: String,
    /// The slug in the workspace file (a key's name; empty where the file names none).
    pub slug: String,
    pub id: String,
}

/// What `event` does to a named resource, if it names one.
pub(super) fn touched(event: &LogEvent, existed: bool) -> Option<Touched> {
    let action = if existed { "changed" } else { "created" };
    let of = |action: &'static str, kind: &str, slug: &str, id: &str| Touched {
        action,
        kind: kind.to_owned(),
        slug: slug.to_owned(),
        id: id.to_owned(),
    };
    Some(match event {
        LogEvent::SpaceDefined(space) => of(action, "space", &space.slug, &space.space_id),
        LogEvent::SchemaDefined(schema) => of(action, "schema", &schema.slug, &schema.schema_id),
        LogEvent::ResourceDefined(resource) => {
            let slug = serde_json::from_str::<Value>(&resource.definition_json)
                .ok()
                .and_then(|definition| definition.get("slug").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or_default();
            of(action, &resource.kind.replace('_', " "), &slug, &resource.resource_id)
        }
        LogEvent::WebhookCreated(created) => of("created", "webhook", "", &created.webhook_id),
        LogEvent::WebhookUpdated(updated) => of("changed", "webhook", "", &updated.webhook_id),
        LogEvent::WebhookDeleted(deleted) => of("removed", "webhook", "", &deleted.webhook_id),
        LogEvent::ApiKeyIssued(issued) => of(action, "api key", &issued.name, &issued.key_id),
        LogEvent::ApiKeyRevoked(revoked) => of("removed", "api key", "", &revoked.key_id),
        _ => return None,
    })
}

/// How a value an event description does not show reads (secrets, key material, ciphertext,
/// sealed personal data), and how it reads when the apply changes it.
const NOT_SHOWN: &str = "(not shown)";
const CHANGED: &str = "(changed)";

/// Fields (of an authored definition, or of an event by their JSON names) that hold secrets or
/// key material.
const SECRET_KEYS: &[&str] = &["signing", "wrappedKey", "privateKey", "ciphertext", "secret", "keyHash"];

/// The message that holds personal data sealed under a data subject's key: never shown.
const SEALED: &str = "platform.events.v1.Sealed";

/// The package of the log's event messages.
const EVENTS_PACKAGE: &str = "platform.events.v1";

/// The log's event schemas, read once from the descriptors the build compiled them to.
static EVENT_SCHEMAS: LazyLock<Option<DescriptorPool>> =
    LazyLock::new(|| DescriptorPool::decode(platform::proto::FILE_DESCRIPTOR_SET).ok());

/// The stream's latest event and the event appended, as text for a person comparing them:
/// indented JSON, one field per line (an authored definition as its JSON, under a line naming
/// the resource), and what must not be shown (secrets, key material, ciphertext, sealed
/// personal data) replaced by `(not shown)`, or by `(changed)` in the new event when it
/// differs from before.
pub fn describe_change(before: Option<&LogEvent>, after: &LogEvent) -> (Option<String>, String) {
    let before = before.map(hidden_and_text);
    let (hidden_after, text_after) = hidden_and_text(after);
    let mut after = text_after;
    for (index, (name, value)) in hidden_after.iter().enumerate() {
        let same = before.as_ref().is_some_and(|(hidden, _)| {
            hidden.iter().filter(|(other, _)| other == name).nth(occurrence(&hidden_after, index)).map(|(_, v)| v)
                == Some(value)
        });
        let shown = if same || before.is_none() { NOT_SHOWN } else { CHANGED };
        after = after.replacen(&placeholder(index), shown, 1);
    }
    let before = before.map(|(hidden, mut text)| {
        for index in 0..hidden.len() {
            text = text.replacen(&placeholder(index), NOT_SHOWN, 1);
        }
        text
    });
    (before, after)
}

/// How many fields named like the `index`th come before it.
fn occurrence(hidden: &[(String, String)], index: usize) -> usize {
    hidden[..index].iter().filter(|(name, _)| *name == hidden[index].0).count()
}

fn placeholder(index: usize) -> String {
    format!("⟦hidden {index}⟧")
}

/// An event's text with each hidden value replaced by a numbered placeholder, and the hidden
/// values (field name, value) in the order of the placeholders.
fn hidden_and_text(event: &LogEvent) -> (Vec<(String, String)>, String) {
    let mut hidden = Vec::new();
    if let LogEvent::ResourceDefined(resource) = event {
        let mut definition = serde_json::from_str::<Value>(&resource.definition_json).unwrap_or(Value::Null);
        hide_json(&mut definition, &mut hidden);
        let definition = serde_json::to_string_pretty(&definition).unwrap_or_default();
        let text =
            format!("{} {} (revision {})\n{definition}\n", resource.kind, resource.resource_id, resource.revision);
        return (hidden, text);
    }
    let json = event_json(event, &mut hidden);
    (hidden, format!("{}\n", serde_json::to_string_pretty(&json).unwrap_or_default()))
}

/// An event as JSON, read by its schema: every field by its JSON name (a oneof's members and
/// optional fields only when set, a message field that is not set `null`), a text field that
/// holds JSON (`definitionJson`) as that JSON, and what must not be shown as a placeholder.
fn event_json(event: &LogEvent, hidden: &mut Vec<(String, String)>) -> Value {
    let name = event.event_type();
    let descriptor = EVENT_SCHEMAS.as_ref().and_then(|schemas| {
        let message = name.strip_suffix(".v1").unwrap_or(name);
        schemas.get_message_by_name(&format!("{EVENTS_PACKAGE}.{message}"))
    });
    let Some(message) = descriptor.and_then(|descriptor| DynamicMessage::decode(descriptor, &event.encode()[..]).ok())
    else {
        // A type this build has no schema for (the log's `Unknown`): its name is all there is.
        return serde_json::json!({ "eventType": name });
    };
    message_json(&message, hidden)
}

fn message_json(message: &DynamicMessage, hidden: &mut Vec<(String, String)>) -> Value {
    let mut object = Map::new();
    for field in message.descriptor().fields() {
        let set = message.has_field(&field);
        if field.containing_oneof().is_some() && !set {
            continue;
        }
        let name = field.json_name().to_owned();
        let single_message = !field.is_list() && !field.is_map() && field.kind().as_message().is_some();
        let value = if single_message && !set {
            Value::Null
        } else {
            field_json(&name, &field.kind(), &message.get_field(&field), hidden)
        };
        object.insert(name, value);
    }
    Value::Object(object)
}

/// One field's value; `kind` is the field's type (a list's or map's items' for their items).
fn field_json(name: &str, kind: &Kind, value: &Field, hidden: &mut Vec<(String, String)>) -> Value {
    let sealed = matches!(value, Field::Message(message) if message.descriptor().full_name() == SEALED);
    if SECRET_KEYS.contains(&name) || sealed {
        return hide(name, value, hidden);
    }
    match value {
        Field::Bool(flag) => Value::Bool(*flag),
        Field::I32(number) => Value::from(*number),
        Field::I64(number) => Value::from(*number),
        Field::U32(number) => Value::from(*number),
        Field::U64(number) => Value::from(*number),
        Field::F32(number) => Value::from(*number),
        Field::F64(number) => Value::from(*number),
        Field::String(text) if name.ends_with("Json") => match serde_json::from_str::<Value>(text) {
            Ok(mut json) => {
                hide_json(&mut json, hidden);
                json
            }
            Err(_) => Value::String(text.clone()),
        },
        Field::String(text) => Value::String(text.clone()),
        // Bytes are key material or ciphertext, never text to read.
        Field::Bytes(_) => hide(name, value, hidden),
        Field::EnumNumber(number) => kind
            .as_enum()
            .and_then(|descriptor| descriptor.get_value(*number))
            .map_or_else(|| Value::from(*number), |value| Value::String(value.name().to_owned())),
        Field::Message(message) => message_json(message, hidden),
        Field::List(items) => Value::Array(items.iter().map(|item| field_json(name, kind, item, hidden)).collect()),
        Field::Map(entries) => {
            let value_kind = kind.as_message().map(|entry| entry.map_entry_value_field().kind());
            let mut sorted: Vec<(String, &Field)> = entries.iter().map(|(key, item)| (map_key(key), item)).collect();
            sorted.sort_by(|a, b| a.0.cmp(&b.0));
            let object = sorted
                .into_iter()
                .map(|(key, item)| {
                    let item = field_json(name, value_kind.as_ref().unwrap_or(kind), item, hidden);
                    (key, item)
                })
                .collect();
            Value::Object(object)
        }
    }
}

/// A placeholder for `value`, which is kept (as text) to tell whether an apply changes it.
fn hide(name: &str, value: &Field, hidden: &mut Vec<(String, String)>) -> Value {
    let shown = Value::String(placeholder(hidden.len()));
    hidden.push((name.to_owned(), format!("{value:?}")));
    shown
}

fn map_key(key: &MapKey) -> String {
    match key {
        MapKey::Bool(flag) => flag.to_string(),
        MapKey::I32(number) => number.to_string(),
        MapKey::I64(number) => number.to_string(),
        MapKey::U32(number) => number.to_string(),
        MapKey::U64(number) => number.to_string(),
        MapKey::String(text) => text.clone(),
    }
}

/// Replaces the values of [`SECRET_KEYS`] in an authored definition by placeholders.
fn hide_json(value: &mut Value, hidden: &mut Vec<(String, String)>) {
    match value {
        Value::Object(object) => {
            for (key, field) in object.iter_mut() {
                if SECRET_KEYS.contains(&key.as_str()) && !field.is_null() {
                    let shown = std::mem::replace(field, Value::String(placeholder(hidden.len())));
                    hidden.push((key.clone(), shown.to_string()));
                } else {
                    hide_json(field, hidden);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| hide_json(item, hidden)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use platform::proto;

    use super::*;

    fn webhook(url: &str, secret: &[u8]) -> LogEvent {
        LogEvent::WebhookCreated(proto::WebhookCreated {
            webhook_id: "wh_1".into(),
            url: url.into(),
            secret: Some(proto::Sealed {
                body: Some(proto::sealed::Body::Ciphertext(secret.to_vec())),
                subject_id: "webhook-wh_1".into(),
            }),
            ..Default::default()
        })
    }

    /// The description as JSON, which it must be.
    fn parsed(text: &str) -> Value {
        serde_json::from_str(text).unwrap_or_else(|error| panic!("not JSON ({error}):\n{text}"))
    }

    #[test]
    fn a_sealed_field_is_one_line_not_shown_and_marked_changed_only_when_it_changed() {
        let (none, text) = describe_change(None, &webhook("https://a.example", &[1, 2, 3]));
        assert!(none.is_none());
        assert_eq!(parsed(&text)["secret"], "(not shown)", "{text}");
        assert!(text.lines().any(|line| line.trim() == r#""secret": "(not shown)","#), "one line:\n{text}");
        assert!(!text.contains("iphertext") && !text.contains("subject"), "{text}");

        let before = webhook("https://a.example", &[1, 2, 3]);
        let (old, new) = describe_change(Some(&before), &webhook("https://b.example", &[1, 2, 3]));
        assert_eq!(parsed(&new)["secret"], "(not shown)");
        assert_eq!(parsed(&old.expect("a stream that existed"))["secret"], "(not shown)");
        let (_, new) = describe_change(Some(&before), &webhook("https://a.example", &[9, 9, 9]));
        assert_eq!(parsed(&new)["secret"], "(changed)", "{new}");
    }

    /// `--dry-run` promises indented JSON: every event an apply appends reads as JSON, its
    /// fields by their JSON names one per line, whatever the resource (the webhook's, the
    /// key's and the user's events were a Rust debug dump).
    #[test]
    fn every_event_an_apply_appends_is_indented_json() {
        let sealed = |subject: &str| proto::Sealed {
            body: Some(proto::sealed::Body::Clear(b"ada@example.com".to_vec())),
            subject_id: subject.into(),
        };
        let events = [
            LogEvent::SpaceDefined(proto::SpaceDefined {
                space_id: "spc_1".into(),
                slug: "alpha".into(),
                name: "Alpha".into(),
            }),
            LogEvent::UserDefined(proto::UserDefined { user_id: "usr_1".into(), personal: Some(sealed("usr_1")) }),
            LogEvent::MembershipGranted(proto::MembershipGranted {
                user_id: "usr_1".into(),
                space_id: "spc_1".into(),
                role: "admin".into(),
            }),
            LogEvent::MembershipRevoked(proto::MembershipRevoked { user_id: "usr_1".into(), space_id: "spc_1".into() }),
            LogEvent::ApiKeyIssued(proto::ApiKeyIssued {
                key_id: "key_1".into(),
                name: "ci".into(),
                key_hash: "5e884898da28047151d0e56f8dc62927".into(),
                ..Default::default()
            }),
            LogEvent::ApiKeyRevoked(proto::ApiKeyRevoked { key_id: "key_1".into() }),
            LogEvent::SchemaDefined(proto::SchemaDefined {
                schema_id: "sch_1".into(),
                slug: "contacts".into(),
                attributes: vec![proto::AttributeDefinition {
                    key: "plan".into(),
                    definition_json: r#"{"type":"string","signing":"s3cret"}"#.into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            LogEvent::AiCreditsSet(proto::AiCreditsSet { space_id: "spc_1".into(), balance: 100 }),
            webhook("https://a.example", &[1, 2, 3]),
            LogEvent::WebhookUpdated(proto::WebhookUpdated {
                webhook_id: "wh_1".into(),
                url: Some("https://b.example".into()),
                ..Default::default()
            }),
            LogEvent::WebhookDeleted(proto::WebhookDeleted { webhook_id: "wh_1".into(), ..Default::default() }),
        ];
        for event in &events {
            let (_, text) = describe_change(None, event);
            let json = parsed(&text);
            let object = json.as_object().unwrap_or_else(|| panic!("an object:\n{text}"));
            let indented = serde_json::to_string_pretty(&json).expect("JSON");
            assert_eq!(text, format!("{indented}\n"), "indented JSON, one field per line");
            assert!(!object.is_empty() && object.keys().all(|key| !key.contains('_')), "JSON names:\n{text}");
            assert!(!text.contains("ada@example.com") && !text.contains("s3cret"), "{text}");
        }
        let (_, schema) = describe_change(None, &events[6]);
        let attribute = &parsed(&schema)["attributes"][0];
        assert_eq!(attribute["definitionJson"], serde_json::json!({"type": "string", "signing": "(not shown)"}));
        let (_, key) = describe_change(None, &events[4]);
        assert_eq!(parsed(&key)["keyHash"], "(not shown)");
        let (_, user) = describe_change(None, &events[1]);
        assert_eq!(parsed(&user)["personal"], "(not shown)");
        let (_, updated) = describe_change(None, &events[9]);
        assert_eq!(parsed(&updated)["url"], "https://b.example");
        assert!(parsed(&updated).get("status").is_none(), "an optional field not set is left out:\n{updated}");
    }

    #[test]
    fn secrets_in_an_authored_definition_are_named_not_shown() {
        let resource = |private: &str| {
            LogEvent::ResourceDefined(proto::ResourceDefined {
                kind: "domain".into(),
                resource_id: "dom_1".into(),
                definition_json:
                    serde_json::json!({"slug": "main", "dkim": {"privateKey": private, "wrappedKey": "AAAA",
                    "publicKey": "MIIB"}})
                    .to_string(),
                revision: 1,
                ..Default::default()
            })
        };
        let (_, text) = describe_change(None, &resource("c2VjcmV0"));
        assert!(text.contains("\"privateKey\": \"(not shown)\"") && text.contains("\"wrappedKey\": \"(not shown)\""));
        assert!(text.contains("MIIB") && !text.contains("c2VjcmV0") && !text.contains("AAAA"), "{text}");
        let (_, text) = describe_change(Some(&resource("c2VjcmV0")), &resource("b3RoZXI="));
        assert!(text.contains("\"privateKey\": \"(changed)\"") && text.contains("\"wrappedKey\": \"(not shown)\""));
    }
}
