//! Record state and identity owners for decisions.

use deadpool_postgres::GenericClient;
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

/// The current state and stream version of each record that exists.
pub async fn load_records(
    client: &impl GenericClient,
    record_ids: &[String],
) -> anyhow::Result<Vec<(i64, RecordState)>> {
    if record_ids.is_empty() {
        return Ok(Vec::new());
    }
    let streams: Vec<String> = record_ids.iter().map(|id| stream_id(id)).collect();
    let statement = client
        .prepare_cached(
            "SELECT DISTINCT ON (stream_id) stream_version, event_type, payload FROM events
             WHERE stream_id = ANY($1) ORDER BY stream_id, stream_version DESC",
        )
        .await?;
    let rows = client.query(&statement, &[&streams]).await?;
    let mut states = Vec::with_capacity(rows.len());
    for row in rows {
        let state = match LogEvent::decode(row.get(1), row.get(2))? {
            LogEvent::RecordCreated(created) => RecordState::from_created(&created)?,
            LogEvent::RecordUpdated(updated) => RecordState::from_updated(&updated)?,
            _ => continue,
        };
        states.push((row.get(0), state));
    }
    Ok(states)
}
