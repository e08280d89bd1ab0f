//! Records as the log holds them: each one's latest state with its data key, and who holds
//! an identity in a schema.

use deadpool_postgres::GenericClient;

use domain::records::decide::Owners;
use domain::records::{Loaded, RecordState, stream_id};
use platform::crypto::Keys;
use platform::events::LogEvent;

/// `(record id, stream version, state)` of each of `record_ids` that was ever written, from
/// the latest event of its stream, with its data key; in one statement, which reads one event
/// a record (the newest, from the end of its stream's index) however long its history. Used by decisions
/// about records and about what names them (events, aliases), and by the preparation worker.
pub async fn load_records(
    client: &impl GenericClient,
    record_ids: &[String],
) -> anyhow::Result<Vec<(String, i64, Loaded)>> {
    if record_ids.is_empty() {
        return Ok(Vec::new());
    }
    let streams: Vec<String> = record_ids.iter().map(|id| stream_id(id)).collect();
    let statement = client
        .prepare_cached(
            "SELECT l.stream_version, l.event_type, l.payload, k.wrapped_key, l.subject_id, l.stream_id
             FROM (SELECT DISTINCT unnest($1::text[])) AS s(stream_id)
             CROSS JOIN LATERAL (
                 SELECT stream_version, event_type, payload, subject_id, stream_id FROM events
                 WHERE stream_id = s.stream_id ORDER BY stream_version DESC LIMIT 1) l
             LEFT JOIN subject_keys k ON k.subject_id = l.subject_id",
        )
        .await?;
    let rows = client.query(&statement, &[&streams]).await?;
    let mut loaded = Vec::with_capacity(rows.len());
    for row in rows {
        let mut keys = Keys::default();
        let key = match (row.get::<_, Option<&[u8]>>(3), row.get::<_, Option<String>>(4)) {
            (Some(wrapped), Some(subject_id)) => {
                let key = platform::crypto::keyring()?.unwrap_key(&subject_id, wrapped)?;
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
        let stream: &str = row.get(5);
        let record_id = stream.strip_prefix("record/").unwrap_or(stream).to_owned();
        loaded.push((record_id, row.get(0), record));
    }
    Ok(loaded)
}

/// Who holds each of `identities` (`(key, value)`) in the schema.
pub async fn identity_owners(
    client: &impl GenericClient,
    space_id: &str,
    schema_id: &str,
    identities: &[(&str, String)],
) -> Result<Owners, tokio_postgres::Error> {
    let mut owners = identity_owners_of(client, space_id, &[(schema_id, identities)]).await?;
    Ok(owners.pop().unwrap_or_default())
}

/// Who holds each identity of each schema of `asked` (`(schema id, [(key, value)])`), in one
/// statement for every schema: the owners in the order of `asked`.
pub async fn identity_owners_of(
    client: &impl GenericClient,
    space_id: &str,
    asked: &[(&str, &[(&str, String)])],
) -> Result<Vec<Owners>, tokio_postgres::Error> {
    let mut owners = vec![Owners::new(); asked.len()];
    // Which of `asked` each probe is for, by its place in the arrays.
    let (mut asker, mut schemas, mut kinds, mut values) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (index, (schema_id, identities)) in asked.iter().enumerate() {
        for (kind, value) in identities.iter() {
            asker.push(index);
            schemas.push(*schema_id);
            kinds.push(*kind);
            values.push(value.as_str());
        }
    }
    if schemas.is_empty() {
        return Ok(owners);
    }
    // One primary-key probe per identity: the fence (OFFSET 0) keeps the planner from
    // probing on (space, schema) alone and filtering, as it does while the table has no
    // statistics.
    let statement = client
        .prepare_cached(
            "SELECT q.n, i.kind, i.value, i.record_id
             FROM unnest($2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS q(schema_id, kind, value, n)
             CROSS JOIN LATERAL (SELECT * FROM record_identities i WHERE i.space_id = $1
                                 AND i.schema_id = q.schema_id AND i.kind = q.kind AND i.value = q.value
                                 OFFSET 0) i",
        )
        .await?;
    for row in client.query(&statement, &[&space_id, &schemas, &kinds, &values]).await? {
        let probe = usize::try_from(row.get::<_, i64>(0) - 1).ok();
        if let Some(owners) = probe.and_then(|probe| asker.get(probe)).and_then(|index| owners.get_mut(*index)) {
            owners.insert((row.get(1), row.get(2)), row.get(3));
        }
    }
    Ok(owners)
}
