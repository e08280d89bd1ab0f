//! What a record looks like on the wire, built from its log event by both the command
//! service (the write response) and the projector (the read model), so the two agree.

pub mod decide;
pub mod write;

use serde_json::{Map, Value, json};

use kernel::crypto::{DataKey, Keys};
use kernel::events::open;
use kernel::proto;
use kernel::time::format_millis;

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

    /// The record after an update that leaves it with `personal` (identities and values):
    /// the one rule every record update follows, API writes and AI auto-fill alike. Its
    /// `updatedAt` never goes backwards.
    pub fn after_update(&self, personal: proto::RecordPersonal, now_ms: i64) -> Self {
        Self { updated_at_ms: now_ms.max(self.updated_at_ms), personal: Some(personal), ..self.clone() }
    }

    /// This record's personal data with its custom values replaced by `values`.
    pub fn personal_with_values(&self, values: Map<String, Value>) -> proto::RecordPersonal {
        proto::RecordPersonal {
            values_json: Value::Object(values).to_string(),
            ..self.personal.clone().unwrap_or_default()
        }
    }

    /// The `RecordUpdated` that carries this (new) state, with its personal data `sealed`.
    pub fn updated_event(
        &self,
        sealed: proto::Sealed,
        changed_keys: Vec<String>,
        credits_spent: i64,
    ) -> proto::RecordUpdated {
        proto::RecordUpdated {
            record_id: self.record_id.clone(),
            space_id: self.space_id.clone(),
            schema_id: self.schema_id.clone(),
            schema_type: self.schema_type.clone(),
            source: self.source.clone(),
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.updated_at_ms,
            personal: Some(sealed),
            changed_keys,
            credits_spent,
            import: None,
            change_source: String::new(),
            change_source_id: String::new(),
        }
    }

    /// A record of `schema_type` made of `personal` alone (no stored identity, space or
    /// schema): what a template renders for data that is not stored (a preview's, `apply`'s
    /// sample), shaped as [`Self::document`] shapes a stored one.
    pub fn unstored(schema_type: &str, personal: proto::RecordPersonal) -> Self {
        Self {
            record_id: String::new(),
            space_id: String::new(),
            schema_id: String::new(),
            schema_type: schema_type.to_owned(),
            source: String::new(),
            created_at_ms: 0,
            updated_at_ms: 0,
            personal: Some(personal),
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

/// The document of a record that is not stored, of `schema_type`, from `fields` as given:
/// every platform field of [`RecordState::document`] present (null unless given), the given
/// fields beside them.
pub fn unstored_document(schema_type: &str, fields: &Map<String, Value>) -> Value {
    let mut document = match RecordState::unstored(schema_type, proto::RecordPersonal::default()).document() {
        Value::Object(document) => document,
        _ => Map::new(),
    };
    document.values_mut().for_each(|value| *value = Value::Null);
    document.extend(fields.clone());
    Value::Object(document)
}

/// The record document of a create event, its personal data opened with `keys`.
pub fn record_document(created: &proto::RecordCreated, keys: &Keys) -> anyhow::Result<Value> {
    Ok(RecordState::from_created(created, keys)?.document())
}

/// What a record deletion operation says while it is `pending`.
pub const DELETION_PENDING_MESSAGE: &str = "erasure in progress: the record's data key is being destroyed and every read \
     model is purging its copies; poll GET /v1/record-deletions/{operationId} until the status is completed";

/// Replaces every recorded idempotent response about record `$1` (a create or upsert answer,
/// which holds its personal data) by `{data: {id, erased: true}}`. Run as a guard in the
/// transaction that requests the record's deletion, so a replay after the DELETE never shows
/// the record, and again by the eraser (idempotent).
pub const BLANK_IDEMPOTENT_RESPONSES: &str = "UPDATE idempotency_records
     SET response = jsonb_build_object('data', jsonb_build_object('id', $1::text, 'erased', true))
     WHERE response -> 'data' ->> 'id' = $1::text AND NOT (response -> 'data' ? 'erased')";

/// The channel a deletion request notifies, in its own transaction, so that the eraser looks
/// for open operations when one was requested rather than after every append.
pub const DELETIONS_CHANNEL: &str = "record_deletion_requested";

/// The log stream of a record.
pub fn stream_id(record_id: &str) -> String {
    format!("record/{record_id}")
}

/// A record as its stream's latest event leaves it.
#[derive(Clone)]
pub enum Loaded {
    /// The record exists; `key` is its data key (absent only for records written before
    /// encryption, which get one on their next write).
    Live { state: RecordState, key: Option<DataKey> },
    /// A deletion operation is under way: the record is closed to conflicting work.
    Deleting { space_id: String, schema_id: String, operation_id: String },
    /// Erased.
    Deleted { space_id: String, schema_id: String },
}

impl Loaded {
    pub fn scope(&self) -> (&str, &str) {
        match self {
            Self::Live { state, .. } => (&state.space_id, &state.schema_id),
            Self::Deleting { space_id, schema_id, .. } | Self::Deleted { space_id, schema_id } => (space_id, schema_id),
        }
    }
}
