//! A write key as its messages are applied with it, read from its `write_key` resource.

use std::collections::BTreeMap;

use serde_json::Value;

/// A write key as its messages are applied with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteKey {
    pub id: String,
    pub space_id: String,
    pub slug: String,
    /// The namespace of its anonymous ids (a contact track's `sourceId`).
    pub source: String,
    pub contact_schema_id: String,
    /// Event name → event schema id.
    pub events: BTreeMap<String, String>,
    pub page_schema_id: Option<String>,
    pub screen_schema_id: Option<String>,
    /// The object schema a group names a record of, and the contact attribute holding its id.
    pub group: Option<(String, String)>,
}

impl WriteKey {
    /// The write key of a `write_key` resource's definition; `None` when it is disabled.
    pub fn of(id: String, space_id: String, definition: &Value) -> Option<Self> {
        if definition["enabled"] == Value::Bool(false) {
            return None;
        }
        let text = |key: &str| definition.get(key).and_then(Value::as_str).map(str::to_owned);
        let events = definition["events"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(name, schema)| Some((name.clone(), schema.as_str()?.to_owned())))
            .collect();
        let group = definition.get("group").and_then(|group| {
            Some((group.get("schemaId")?.as_str()?.to_owned(), group.get("contactAttribute")?.as_str()?.to_owned()))
        });
        Some(Self {
            id,
            space_id,
            slug: text("slug")?,
            source: text("source")?,
            contact_schema_id: text("contactSchemaId")?,
            events,
            page_schema_id: text("pageSchemaId"),
            screen_schema_id: text("screenSchemaId"),
            group,
        })
    }
}
