//! Record state and identity owners for decisions.

use deadpool_postgres::GenericClient;
use shared::crypto::{self, DataKey, Keys};
use shared::events::LogEvent;
use shared::records::RecordState;

use crate::domain::records::Owners;

pub fn stream_id(record_id: &str) -> String {
    format!("record/{record_id}")
}

/// Who holds each of `identities` (`(key, value)`) in the schema.
pub async fn identity_owners(
    client: &impl GenericClient,
    space_id: &str,
    schema_id: &str,
    identities: &[(&str, String)],
) -> Result<Owners, tokio_postgres::Error> {
    if identities.is_empty() {
        return Ok(Owners::new());
    }
    let kinds: Vec<&str> = identities.iter().map(|(kind, _)| *kind).collect();
    let values: Vec<&str> = identities.iter().map(|(_, value)| value.as_str()).collect();
    let statement = client
        .prepare_cached(
            "SELECT i.kind, i.value, i.record_id FROM record_identities i
             JOIN unnest($3::text[], $4::text[]) AS q(kind, value) ON q.kind = i.kind AND q.value = i.value
             WHERE i.space_id = $1 AND i.schema_id = $2",
        )
        .await?;
    let rows = client.query(&statement, &[&space_id, &schema_id, &kinds, &values]).await?;
    Ok(rows.into_iter().map(|row| ((row.get(0), row.get(1)), row.get(2))).collect())
}

/// A record as its stream's latest event leaves it.
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

/// The stream version and state of each of `record_ids` that was ever written, with its
/// data key, in one statement.
pub async fn load_records(client: &impl GenericClient, record_ids: &[String]) -> anyhow::Result<Vec<(i64, Loaded)>> {
    if record_ids.is_empty() {
        return Ok(Vec::new());
    }
    let streams: Vec<String> = record_ids.iter().map(|id| stream_id(id)).collect();
    let statement = client
        .prepare_cached(
            "SELECT l.stream_version, l.event_type, l.payload, k.wrapped_key, l.subject_id FROM (
                 SELECT DISTINCT ON (stream_id) stream_version, event_type, payload, subject_id FROM events
                 WHERE stream_id = ANY($1) ORDER BY stream_id, stream_version DESC) l
             LEFT JOIN subject_keys k ON k.subject_id = l.subject_id",
        )
        .await?;
    let rows = client.query(&statement, &[&streams]).await?;
    let mut loaded = Vec::with_capacity(rows.len());
    for row in rows {
        let mut keys = Keys::default();
        let key = match (row.get::<_, Option<&[u8]>>(3), row.get::<_, Option<String>>(4)) {
            (Some(wrapped), Some(subject_id)) => {
                let key = crypto::keyring()?.unwrap_key(&subject_id, wrapped)?;
                keys.insert(subject_id, key.clone());
                Some(key)
            }
            _ => None,
        };
        let record = match LogEvent::decode(row.get(1), row.get(2))? {
            LogEvent::RecordCreated(created) => {
                Loaded::Live { state: RecordState::from_created(&created, &keys)?, key }
            }
            LogEvent::RecordUpdated(updated) => {
                Loaded::Live { state: RecordState::from_updated(&updated, &keys)?, key }
            }
            LogEvent::RecordDeletionRequested(requested) => Loaded::Deleting {
                space_id: requested.space_id,
                schema_id: requested.schema_id,
                operation_id: requested.operation_id,
            },
            LogEvent::RecordDeletionBlocked(blocked) => Loaded::Deleting {
                space_id: blocked.space_id,
                schema_id: blocked.schema_id,
                operation_id: blocked.operation_id,
            },
            LogEvent::RecordDeletionCompleted(completed) => {
                Loaded::Deleted { space_id: completed.space_id, schema_id: completed.schema_id }
            }
            _ => continue,
        };
        loaded.push((row.get(0), record));
    }
    Ok(loaded)
}
