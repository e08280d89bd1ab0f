//! Reads of record deletion operations from read model version schema `deletions`.

use deadpool_postgres::Client;
use platform::error::ApiError;
use platform::time::format_timestamp;
use serde_json::{Value, json};

/// The status document of operation `operation_id` of the space, if any.
pub async fn get(
    client: &Client,
    deletions: &str,
    operation_id: &str,
    space_id: &str,
) -> Result<Option<Value>, ApiError> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT operation_id, status, message, record_id, schema_id, requested_at, completed_at
             FROM {deletions}.deletions WHERE operation_id = $1 AND space_id = $2"
        ))
        .await?;
    let row = client.query_opt(&statement, &[&operation_id, &space_id]).await?;
    Ok(row.map(|row| {
        json!({
            "operationId": row.get::<_, String>(0),
            "status": row.get::<_, String>(1),
            "message": row.get::<_, String>(2),
            "recordId": row.get::<_, String>(3),
            "schemaId": row.get::<_, String>(4),
            "requestedAt": format_timestamp(row.get(5)),
            "completedAt": row.get::<_, Option<chrono::DateTime<chrono::Utc>>>(6).map(format_timestamp),
        })
    }))
}
