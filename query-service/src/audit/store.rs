//! What the audit trail reads from the log: a record's events (with its data key) and the
//! suppression events of the addresses it has held.

use deadpool_postgres::Client;
use platform::crypto::Keys;
use platform::error::ApiError;
use platform::log::{EVENT_COLUMNS, StoredEvent};

/// Every event about `record_id`, in log order, and its data key (if not erased).
pub(crate) async fn record_events(client: &Client, record_id: &str) -> Result<(Vec<StoredEvent>, Keys), ApiError> {
    let statement = client
        .prepare_cached(&format!("SELECT {EVENT_COLUMNS} FROM events WHERE subject_id = $1 ORDER BY position"))
        .await?;
    let rows = client.query(&statement, &[&record_id]).await?;
    let keys = platform::crypto::load_keys(client, &[record_id.to_owned()]).await?;
    Ok((rows.iter().map(StoredEvent::from_row).collect(), keys))
}

/// The suppression events whose subjects are `subjects` (address digests), in log order.
pub async fn suppression_events(client: &Client, subjects: &[String]) -> Result<Vec<StoredEvent>, ApiError> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE subject_id = ANY($1)
               AND event_type IN ('SuppressionAdded.v1', 'SuppressionRemoved.v1') ORDER BY position"
        ))
        .await?;
    let rows = client.query(&statement, &[&subjects]).await?;
    Ok(rows.iter().map(StoredEvent::from_row).collect())
}
