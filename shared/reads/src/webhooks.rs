//! A webhook's state folded from its stream, and the counters the delivery engine keeps.

use domain::webhooks::state::{Counters, WebhookState, stream_id};
use platform::events::LogEvent;

/// `(stream version, state)` of a webhook from its stream; version 0 when it has none.
pub async fn load(
    client: &impl deadpool_postgres::GenericClient,
    webhook_id: &str,
) -> anyhow::Result<(i64, Option<WebhookState>)> {
    load_at(client, webhook_id, i64::MAX).await
}

/// [`load`] as of log position `position`: the state a follower of the log sees there, the
/// same on every replay.
pub async fn load_at(
    client: &impl deadpool_postgres::GenericClient,
    webhook_id: &str,
    position: i64,
) -> anyhow::Result<(i64, Option<WebhookState>)> {
    let statement = client
        .prepare_cached(
            "SELECT stream_version, event_type, payload FROM events WHERE stream_id = $1 AND position <= $2
             ORDER BY stream_version",
        )
        .await?;
    let mut current = (0, None);
    for row in client.query(&statement, &[&stream_id(webhook_id), &position]).await? {
        current = (row.get(0), WebhookState::apply(current.1, &LogEvent::decode(row.get(1), row.get(2))?));
    }
    Ok(current)
}

/// Counters from a row's five [`Counters::COLUMNS`] starting at column `first`.
pub fn counters(row: &tokio_postgres::Row, first: usize) -> Counters {
    Counters {
        total_calls: row.get::<_, Option<i64>>(first).unwrap_or(0),
        failed_calls: row.get::<_, Option<i64>>(first + 1).unwrap_or(0),
        failed_calls_in_a_row: row.get::<_, Option<i64>>(first + 2).unwrap_or(0),
        last_called_at: row
            .get::<_, Option<chrono::DateTime<chrono::Utc>>>(first + 3)
            .map(platform::time::format_timestamp),
        last_call_error_message: row.get(first + 4),
    }
}
