//! Queries over the catalog read model (spaces, users, memberships, keys, schemas,
//! attributes, credits), which both services use: the command service to authenticate and
//! validate, the query service to authenticate and answer.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::roles::Role;
use kernel::error::Code;
use kernel::log::{AppendError, Guard, SetValue};

pub const CATALOG: &str = "catalog";

/// An API key with its owner and the owner's memberships.
#[derive(Debug, Clone)]
pub struct KeyIdentity {
    pub key_id: String,
    pub name: String,
    pub key_display: String,
    pub created_at: DateTime<Utc>,
    pub user_id: String,
    pub user_name: String,
    pub user_email: String,
    pub bound_space_id: Option<String>,
    /// `(id, slug, name)` of the bound space, whether or not the owner is a member of it.
    pub bound_space: Option<(String, String, String)>,
    pub memberships: Vec<Membership>,
}

#[derive(Debug, Clone)]
pub struct Membership {
    pub space_id: String,
    pub slug: String,
    pub name: String,
    pub role: Role,
}

/// A schema of a space as the catalog holds it.
#[derive(Debug, Clone)]
pub struct SchemaEntry {
    pub schema_id: String,
    pub slug: String,
    pub schema_type: String,
    pub doc: Value,
    pub attribute_count: i64,
    /// The definition revision (`definitionRevision` of events accepted under it).
    pub revision: i64,
}

/// Whether callers may write an attribute: its definition type is not `evaluated` and it
/// has no `valueSource` (the contract's rule).
pub fn is_writable(definition: &Value) -> bool {
    definition.get("type").and_then(Value::as_str) != Some("evaluated")
        && definition.get("valueSource").is_none_or(Value::is_null)
}

/// Whether the attribute is filled by AI auto-fill.
pub fn has_auto_fill(definition: &Value) -> bool {
    match definition.get("autoFill") {
        Some(Value::Object(settings)) => settings.get("enabled").and_then(Value::as_bool).unwrap_or(true),
        Some(Value::Bool(enabled)) => *enabled,
        _ => false,
    }
}

/// A custom attribute's key and its public definition, for validating input.
#[derive(Debug, Clone)]
pub struct AttributeEntry {
    pub key: String,
    pub definition: Value,
}

/// What a record write or an event acceptance reads from the catalog.
#[derive(Debug, Clone)]
pub struct WriteContext {
    pub schema: SchemaEntry,
    /// The schema's custom attributes, in order.
    pub attributes: Vec<AttributeEntry>,
    /// The space's remaining AI credits (the authored grant less what the write side has
    /// recorded as spent), as read with the schema.
    pub credits: i64,
    /// The live catalog's revision when read (see [`revision_guard`]).
    pub revision: i64,
}

impl WriteContext {
    /// Whether a write to the schema may spend AI credits (a writable attribute with AI
    /// auto-fill): only then do its credits matter.
    pub fn spends_credits(&self) -> bool {
        self.attributes
            .iter()
            .any(|attribute| is_writable(&attribute.definition) && has_auto_fill(&attribute.definition))
    }
}

/// The guard that a write decided with catalog revision `revision` appends with: the live
/// catalog must still be at it. Fails the command with the internal `catalog_moved` when the
/// catalog changed since (the writer decides again with a fresh read; left unhandled, it is
/// answered 409 `concurrent_modification`).
pub fn revision_guard(revision: i64) -> Guard {
    Guard::exactly_one(
        "SELECT 1 FROM projections WHERE name = 'catalog' AND status = 'live' AND revision = $1",
        vec![Box::new(revision)],
        AppendError::Conflict { code: Code::CatalogMoved, message: CATALOG_CHANGED.to_owned() },
    )
    .with_set(
        "SELECT 1 FROM unnest($1::bigint[]) AS w(revision)
         JOIN projections p ON p.name = 'catalog' AND p.status = 'live' AND p.revision = w.revision",
        vec![SetValue::BigInt(revision)],
    )
}

/// The message of a write refused because the catalog changed after it was decided.
pub(crate) const CATALOG_CHANGED: &str = "the schema changed while this write was decided; retry";

/// Write contexts kept in process by (space, schema id or slug) until a write finds the
/// catalog changed ([`revision_guard`]); then the entries of older revisions are dropped.
/// The credits of a kept context are stale: a writer that needs them reads them afresh
/// (record writes to a schema with AI auto-fill are never kept).
pub type WriteContexts = Kept<WriteContext>;

/// Entries kept at most by a [`Kept`] (cleared when full: authored resources are few per
/// space).
const KEPT_MAX: usize = 10_000;

/// Authored resources kept in process by (space, key), each with the catalog revision it was
/// read at, so a command reads no catalog statement for them (a workflow by reference id, a
/// template with its sender and domain). A command decided on a kept entry appends with that
/// revision's guard ([`revision_guard`]), and the entries of older revisions are dropped once
/// a write finds the catalog moved on, as [`WriteContexts`] are.
pub struct Kept<T> {
    entries: std::sync::RwLock<KeptEntries<T>>,
}

/// Kept entries by (space, key): the catalog revision each was read at, and what was read.
type KeptEntries<T> = std::collections::HashMap<(String, String), (i64, std::sync::Arc<T>)>;

impl<T> Default for Kept<T> {
    fn default() -> Self {
        Self { entries: std::sync::RwLock::default() }
    }
}

impl<T> Kept<T> {
    /// The entry of `key` in the space and the catalog revision it was read at.
    pub fn get(&self, space_id: &str, key: &str) -> Option<(i64, std::sync::Arc<T>)> {
        let entries = self.entries.read().ok()?;
        entries
            .get(&(space_id.to_owned(), key.to_owned()))
            .map(|(revision, kept)| (*revision, std::sync::Arc::clone(kept)))
    }

    /// Keeps `value`, read at catalog revision `revision`.
    pub fn put(&self, space_id: &str, key: &str, revision: i64, value: &std::sync::Arc<T>) {
        if let Ok(mut entries) = self.entries.write() {
            if entries.len() >= KEPT_MAX {
                entries.clear();
            }
            entries.insert((space_id.to_owned(), key.to_owned()), (revision, std::sync::Arc::clone(value)));
        }
    }

    /// Drops the entries read at another catalog revision than `revision`.
    pub fn keep_revision(&self, revision: i64) {
        if let Ok(mut entries) = self.entries.write() {
            entries.retain(|_, (kept, _)| *kept == revision);
        }
    }
}

/// What a process keeps per catalog revision (every [`Kept`]), so that all of it can be
/// pruned together when the catalog moves on.
pub trait KeptByRevision {
    /// Drops what was read at another catalog revision than `revision`.
    fn keep_revision(&self, revision: i64);
}

impl<T> KeptByRevision for Kept<T> {
    fn keep_revision(&self, revision: i64) {
        Kept::keep_revision(self, revision);
    }
}
