//! What a record looks like on the wire, built from its log event by both the command
//! service (the write response) and the projector (the read model), so the two agree.

use serde_json::{Map, Value, json};

use crate::events::open;
use crate::proto;
use crate::time::format_millis;

/// Base (platform) attributes of each schema type: `(key, type, writable)`.
pub fn base_attributes(schema_type: &str) -> &'static [(&'static str, &'static str, bool)] {
    match schema_type {
        "contact" => &[
            ("id", "string", false),
            ("source", "string", false),
            ("userId", "string", true),
            ("email", "email", true),
            ("phone", "phone", true),
            ("createdAt", "datetime", false),
            ("updatedAt", "datetime", false),
        ],
        "object" => &[
            ("id", "string", false),
            ("source", "string", false),
            ("externalId", "string", true),
            ("createdAt", "datetime", false),
            ("updatedAt", "datetime", false),
        ],
        "event" => &[
            ("id", "string", false),
            ("eventId", "string", true),
            ("occurredAt", "datetime", true),
            ("receivedAt", "datetime", false),
            ("contactId", "string", true),
            ("objectId", "string", true),
        ],
        _ => &[],
    }
}

/// The record document: platform fields with custom values flattened beside them.
pub fn record_document(created: &proto::RecordCreated) -> anyhow::Result<Value> {
    let personal: Option<proto::RecordPersonal> = open(created.personal.as_ref())?;
    let mut document = Map::new();
    if let Some(personal) = &personal
        && let Ok(Value::Object(values)) = serde_json::from_str::<Value>(&personal.values_json)
    {
        document.extend(values);
    }
    document.insert("id".into(), json!(created.record_id));
    document.insert("source".into(), json!(created.source));
    match created.schema_type.as_str() {
        "contact" => {
            document.insert("userId".into(), json!(personal.as_ref().and_then(|p| p.user_id.clone())));
            document.insert("email".into(), json!(personal.as_ref().and_then(|p| p.email.clone())));
            document.insert("phone".into(), json!(personal.as_ref().and_then(|p| p.phone.clone())));
        }
        _ => {
            document.insert("externalId".into(), json!(personal.as_ref().and_then(|p| p.external_id.clone())));
        }
    }
    let created_at = format_millis(created.created_at_ms);
    document.insert("createdAt".into(), json!(created_at));
    document.insert("updatedAt".into(), json!(created_at));
    Ok(Value::Object(document))
}
