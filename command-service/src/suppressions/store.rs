//! A suppression's current state for decisions: its addition, and whether it was removed.

use deadpool_postgres::GenericClient;
use shared::events::LogEvent;
use shared::proto;

pub fn stream_id(suppression_id: &str) -> String {
    format!("suppression/{suppression_id}")
}

/// The stream of a suppression authored in the workspace file.
pub fn authored_stream_id(suppression_id: &str) -> String {
    format!("authoring/suppression/{suppression_id}")
}

/// `(stream version, the addition)` of a live suppression; `None` if unknown or removed.
pub async fn load(
    client: &impl GenericClient,
    suppression_id: &str,
) -> anyhow::Result<Option<(i64, proto::SuppressionAdded)>> {
    let statement = client
        .prepare_cached(
            "SELECT stream_version, event_type, payload FROM events WHERE stream_id = ANY($1) ORDER BY stream_version",
        )
        .await?;
    let streams = vec![stream_id(suppression_id), authored_stream_id(suppression_id)];
    let rows = client.query(&statement, &[&streams]).await?;
    let mut current = None;
    for row in rows {
        match LogEvent::decode(row.get(1), row.get(2))? {
            LogEvent::SuppressionAdded(added) => current = Some((row.get(0), added)),
            LogEvent::SuppressionRemoved(_) => current = None,
            _ => {}
        }
    }
    Ok(current)
}

/// [`load`] for many suppressions in one statement: the live ones by id.
pub async fn load_many(
    client: &impl GenericClient,
    suppression_ids: &[String],
) -> anyhow::Result<std::collections::HashMap<String, (i64, proto::SuppressionAdded)>> {
    let mut current = std::collections::HashMap::new();
    if suppression_ids.is_empty() {
        return Ok(current);
    }
    let streams: Vec<String> = suppression_ids.iter().flat_map(|id| [stream_id(id), authored_stream_id(id)]).collect();
    let statement = client
        .prepare_cached(
            "SELECT stream_version, event_type, payload FROM events WHERE stream_id = ANY($1)
             ORDER BY stream_id, stream_version",
        )
        .await?;
    for row in client.query(&statement, &[&streams]).await? {
        match LogEvent::decode(row.get(1), row.get(2))? {
            LogEvent::SuppressionAdded(added) => {
                current.insert(added.suppression_id.clone(), (row.get(0), added));
            }
            LogEvent::SuppressionRemoved(removed) => {
                current.remove(&removed.suppression_id);
            }
            _ => {}
        }
    }
    Ok(current)
}
