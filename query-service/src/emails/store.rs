//! Reads of the `emails` read model.

use deadpool_postgres::Client;
use platform::error::ApiError;
use serde_json::Value;

/// The story of an email of the space.
pub(crate) async fn email(client: &Client, m: &str, space_id: &str, email_id: &str) -> Result<Option<Value>, ApiError> {
    let statement =
        client.prepare_cached(&format!("SELECT doc FROM {m}.emails WHERE space_id = $1 AND email_id = $2")).await?;
    Ok(client.query_opt(&statement, &[&space_id, &email_id]).await?.map(|row| row.get(0)))
}
