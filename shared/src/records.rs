//! What a record looks like on the wire, built from its log event by both the command
//! service (the write response) and the projector (the read model), so the two agree.

use serde_json::{Map, Value, json};

use crate::crypto::Keys;
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

/// The communication channels a consent field (and an audit-trail entry) can name.
pub const CHANNELS: &[&str] = &["email", "sms", "push", "whatsapp"];

/// A record's state as its latest event holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordState {
    pub record_id: String,
    pub space_id: String,
    pub schema_id: String,
    pub schema_type: String,
    pub source: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// `None` once the personal data is erased.
    pub personal: Option<proto::RecordPersonal>,
}

impl RecordState {
    pub fn from_created(created: &proto::RecordCreated, keys: &Keys) -> anyhow::Result<Self> {
        Ok(Self {
            record_id: created.record_id.clone(),
            space_id: created.space_id.clone(),
            schema_id: created.schema_id.clone(),
            schema_type: created.schema_type.clone(),
            source: created.source.clone(),
            created_at_ms: created.created_at_ms,
            updated_at_ms: created.created_at_ms,
            personal: open(created.personal.as_ref(), keys)?,
        })
    }

    pub fn from_updated(updated: &proto::RecordUpdated, keys: &Keys) -> anyhow::Result<Self> {
        Ok(Self {
            record_id: updated.record_id.clone(),
            space_id: updated.space_id.clone(),
            schema_id: updated.schema_id.clone(),
            schema_type: updated.schema_type.clone(),
            source: updated.source.clone(),
            created_at_ms: updated.created_at_ms,
            updated_at_ms: updated.updated_at_ms,
            personal: open(updated.personal.as_ref(), keys)?,
        })
    }

    /// The custom values as a JSON object.
    pub fn values(&self) -> Map<String, Value> {
        match self.personal.as_ref().map(|p| serde_json::from_str::<Value>(&p.values_json)) {
            Some(Ok(Value::Object(values))) => values,
            _ => Map::new(),
        }
    }

    /// The record document: platform fields with custom values flattened beside them.
    pub fn document(&self) -> Value {
        let personal = self.personal.as_ref();
        let mut document = self.values();
        document.insert("id".into(), json!(self.record_id));
        document.insert("source".into(), json!(self.source));
        match self.schema_type.as_str() {
            "contact" => {
                document.insert("userId".into(), json!(personal.and_then(|p| p.user_id.clone())));
                document.insert("email".into(), json!(personal.and_then(|p| p.email.clone())));
                document.insert("phone".into(), json!(personal.and_then(|p| p.phone.clone())));
            }
            _ => {
                document.insert("externalId".into(), json!(personal.and_then(|p| p.external_id.clone())));
            }
        }
        document.insert("createdAt".into(), json!(format_millis(self.created_at_ms)));
        document.insert("updatedAt".into(), json!(format_millis(self.updated_at_ms)));
        Value::Object(document)
    }
}

/// The record document of a create event, its personal data opened with `keys`.
pub fn record_document(created: &proto::RecordCreated, keys: &Keys) -> anyhow::Result<Value> {
    Ok(RecordState::from_created(created, keys)?.document())
}

/// What a record deletion operation says while it is `pending`.
pub const DELETION_PENDING_MESSAGE: &str = "erasure in progress: the record's data key is being destroyed and every read \
     model is purging its copies; poll GET /v1/record-deletions/{operationId} until the status is completed";
