//! What an apply changes, as a person reads it: each stream's latest event beside the one
//! appended, with secrets, key material and sealed data not shown, and the named resources
//! created, changed or removed.

use platform::events::LogEvent;
use serde_json::Value;

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

/// Fields of an authored definition that hold secrets or key material.
const SECRET_KEYS: &[&str] = &["signing", "wrappedKey", "privateKey", "ciphertext", "secret", "keyHash"];

/// Fields of an event (as its debug text names them) that hold secrets or key material.
const SECRET_FIELDS: &[&str] = &["key_hash", "wrapped_key", "secret", "ciphertext"];

/// The stream's latest event and the event appended, as text for a person comparing them:
/// fields one per line, an authored definition as indented JSON, and what must not be shown
/// (secrets, key material, ciphertext, sealed personal data) replaced by `(not shown)`, or by
/// `(changed)` in the new event when it differs from before.
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
    let debug = format!("{event:#?}");
    let lines: Vec<&str> = debug.lines().collect();
    let mut text = String::new();
    let mut index = 0;
    while index < lines.len() {
        let line = lines[index];
        let trimmed = line.trim();
        let indent = &line[..line.len() - line.trim_start().len()];
        let name = trimmed.split_once(':').map(|(name, _)| name.trim()).unwrap_or_default();
        // A sealed value (`field: Some(` then `Sealed {` ... `},` then `),`): one line.
        if trimmed.ends_with(": Some(") && lines.get(index + 1).is_some_and(|next| next.trim() == "Sealed {") {
            let closes = |at: &usize| lines[*at].starts_with(&format!("{indent})"));
            let end = (index + 2..lines.len()).find(closes).unwrap_or(lines.len() - 1);
            let value = lines[index..=end].join("\n");
            text.push_str(&format!("{indent}{name}: {},\n", placeholder(hidden.len())));
            hidden.push((name.to_owned(), value));
            index = end + 1;
            continue;
        }
        // A list of byte values, or a secret field: one line, its value not shown.
        let bytes = trimmed.ends_with(": [")
            && lines.get(index + 1).is_some_and(|next| next.trim().trim_end_matches(',').parse::<u8>().is_ok());
        if SECRET_FIELDS.contains(&name) || bytes {
            let end = if trimmed.ends_with('[') {
                (index + 1..lines.len()).find(|&at| lines[at].trim().starts_with(']')).unwrap_or(lines.len() - 1)
            } else {
                index
            };
            let value = lines[index..=end].join("\n");
            text.push_str(&format!("{indent}{name}: {},\n", placeholder(hidden.len())));
            hidden.push((name.to_owned(), value));
            index = end + 1;
            continue;
        }
        text.push_str(line);
        text.push('\n');
        index += 1;
    }
    (hidden, text)
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

    #[test]
    fn a_sealed_field_is_one_line_not_shown_and_marked_changed_only_when_it_changed() {
        let (none, text) = describe_change(None, &webhook("https://a.example", &[1, 2, 3]));
        assert!(none.is_none());
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        let at = lines.iter().position(|line| *line == "secret: (not shown),").expect("the secret's line");
        assert!(lines[at + 1].starts_with("integration_vendor_name"), "the sealed value is one line:\n{text}");
        assert!(!text.contains("Ciphertext") && !text.contains("subject_id"), "{text}");

        let before = webhook("https://a.example", &[1, 2, 3]);
        let (old, new) = describe_change(Some(&before), &webhook("https://b.example", &[1, 2, 3]));
        assert!(new.contains("secret: (not shown)") && old.is_some_and(|old| old.contains("secret: (not shown)")));
        let (_, new) = describe_change(Some(&before), &webhook("https://a.example", &[9, 9, 9]));
        assert!(new.contains("secret: (changed)"), "{new}");
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
