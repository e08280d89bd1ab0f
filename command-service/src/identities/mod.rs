//! Anonymous identity binding (`POST /event-identities`): `decide` holds the rules (pure),
//! `store` the reads and guards (SQL), `http` the handler.

pub mod decide;
pub mod http;
pub mod store;

use serde_json::Value;

/// A validated identity change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub source_id: String,
    pub subject_schema_id: String,
    pub anonymous_id: String,
    pub contact_id: Option<String>,
    pub operation_id: String,
    pub expected_revision: i64,
}

/// An operation already applied under the change's operationId: its body digest and result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub body_digest: String,
    pub result: Value,
}

/// The alias as the write side holds it (a new alias is at revision 0, bound to nobody).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Alias {
    pub contact_id: Option<String>,
    pub revision: i64,
    pub erased: bool,
}

/// What the write side knows of the contact a change binds to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Contact {
    /// A live record, in this space and schema.
    Live { space_id: String, schema_id: String },
    /// Its deletion has started.
    Deleting,
    /// Never written, deleted, or another kind of record.
    Missing,
}
