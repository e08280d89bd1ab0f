//! Reads of business events from read model version schema `events`: the cursor page of
//! ready events (one index range scan from the cursor, whatever the number of events) and one
//! event's status.

use chrono::{DateTime, Utc};
use deadpool_postgres::Client;
use serde_json::{Value, json};
use shared::error::ApiError;
use shared::time::format_timestamp;
use tokio_postgres::Row;

use super::window::Window;

fn timestamp_ms(row: &Row, index: usize) -> Option<String> {
    row.get::<_, Option<DateTime<Utc>>>(index).map(format_timestamp)
}

/// Columns both endpoints read, in the order [`event_document`] takes them.
const COLUMNS: &str = "id, schema_id, event_id, received_at, occurred_at, ready_at, state, definition_revision, \
                       contact_id, object_id, data, reason";

pub fn event_document(row: &Row) -> Value {
    json!({
        "id": row.get::<_, String>(0),
        "eventId": row.get::<_, String>(2),
        "receivedAt": timestamp_ms(row, 3),
        "occurredAt": timestamp_ms(row, 4),
        "readyAt": timestamp_ms(row, 5),
        "readinessState": row.get::<_, String>(6),
        "definitionRevision": row.get::<_, i64>(7).to_string(),
        "contactId": row.get::<_, Option<String>>(8),
        "objectId": row.get::<_, Option<String>>(9),
        "data": row.get::<_, Option<Value>>(10),
        "readinessReason": row.get::<_, Option<String>>(11),
    })
}

/// The rows of one page of the schema's ready events in `window`, newest first, one more than
/// its limit (to tell whether more follow).
pub async fn ready_page(
    client: &Client,
    events: &str,
    space_id: &str,
    schema_id: &str,
    window: &Window,
) -> Result<Vec<Row>, ApiError> {
    let (after_at, after_id) = match &window.after {
        Some((at, id)) => (Some(*at), Some(id.clone())),
        None => (None, None),
    };
    let statement = client
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM {events}.events
                 WHERE space_id = $1 AND schema_id = $2 AND state = 'ready'
                   AND occurred_at >= $3 AND occurred_at < $4
                   AND ($5::timestamptz IS NULL OR (occurred_at, id) < ($5, $6::text))
                 ORDER BY occurred_at DESC, id DESC LIMIT $7"
        ))
        .await?;
    let fetch = window.limit + 1;
    Ok(client
        .query(&statement, &[&space_id, &schema_id, &window.from, &window.to, &after_at, &after_id, &fetch])
        .await?)
}

/// The row of event `id` of the space, if any.
pub async fn status_row(client: &Client, events: &str, id: &str, space_id: &str) -> Result<Option<Row>, ApiError> {
    let fetch = client
        .prepare_cached(&format!("SELECT {COLUMNS} FROM {events}.events WHERE id = $1 AND space_id = $2"))
        .await?;
    Ok(client.query_opt(&fetch, &[&id, &space_id]).await?)
}
