//! Reads of the `webhooks` read model, joined with the delivery counters.

use deadpool_postgres::Client;
use platform::error::ApiError;
use serde_json::Value;
use tokio_postgres::types::ToSql;

use crate::consistency::page_of_docs;

/// A webhook document with its counters (zero before the first attempt), from `w` (a
/// webhooks row) and `c` (its counters row, if any). Times are formatted as everywhere else.
const DOCUMENT: &str = "w.doc || jsonb_build_object(
         'totalCalls', COALESCE(c.total_calls, 0),
         'failedCalls', COALESCE(c.failed_calls, 0),
         'failedCallsInARow', COALESCE(c.failed_calls_in_a_row, 0),
         'lastCalledAt', to_char(c.last_called_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
         'lastCallErrorMessage', c.last_call_error_message)";

/// A page of the space's webhooks, newest first, with the total.
pub async fn page(
    client: &Client,
    webhooks: &str,
    space_id: &str,
    (limit, offset): (i64, i64),
) -> Result<(i64, Vec<Value>), ApiError> {
    let count_sql = format!("SELECT total FROM {webhooks}.webhook_counts WHERE space_id = $1");
    let rows_sql = format!(
        "SELECT {} FROM {webhooks}.webhooks w LEFT JOIN public.webhook_counters c USING (webhook_id)
         WHERE w.space_id = $1 ORDER BY w.created_at DESC, w.webhook_id DESC LIMIT $2 OFFSET $3",
        DOCUMENT
    );
    let params: [&(dyn ToSql + Sync); 1] = [&space_id];
    page_of_docs(client, &count_sql, &rows_sql, &params, (limit, offset)).await
}

/// One webhook of the space.
pub async fn get(client: &Client, webhooks: &str, space_id: &str, webhook_id: &str) -> Result<Option<Value>, ApiError> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT {} FROM {webhooks}.webhooks w LEFT JOIN public.webhook_counters c USING (webhook_id)
             WHERE w.space_id = $1 AND w.webhook_id = $2",
            DOCUMENT
        ))
        .await?;
    Ok(client.query_opt(&statement, &[&space_id, &webhook_id]).await?.map(|row| row.get(0)))
}

/// One delivery of the log, with its attempts.
pub struct DeliveryRow {
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub delivery_id: String,
    pub document: Value,
}

/// Up to `limit` deliveries of a webhook, newest first, after `after` (created at, id). The
/// delivery log lives in the delivery engine's outbox (`webhook_deliveries`,
/// `webhook_attempts`), not in a read model: it is the engine's own record of its side
/// effects, which no replay of the log could rebuild.
pub async fn deliveries(
    client: &Client,
    webhook_id: &str,
    after: Option<(chrono::DateTime<chrono::Utc>, String)>,
    limit: i64,
) -> Result<Vec<DeliveryRow>, ApiError> {
    let statement = client
        .prepare_cached(
            "SELECT d.delivery_id, d.created_at, d.type, d.state, d.attempts, d.next_attempt_at, d.finished_at,
                    d.last_status, d.last_error,
                    COALESCE((SELECT jsonb_agg(jsonb_build_object(
                                  'attempt', a.attempt,
                                  'attemptedAt', to_char(a.attempted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
                                  'statusCode', a.status, 'latencyMs', a.latency_ms, 'error', a.error)
                                ORDER BY a.attempt)
                              FROM webhook_attempts a WHERE a.delivery_id = d.delivery_id), '[]'::jsonb)
             FROM webhook_deliveries d
             WHERE d.webhook_id = $1 AND ($2::timestamptz IS NULL OR (d.created_at, d.delivery_id) < ($2, $3))
             ORDER BY d.created_at DESC, d.delivery_id DESC LIMIT $4",
        )
        .await?;
    let (after_at, after_id) = after.map_or((None, String::new()), |(at, id)| (Some(at), id));
    let rows = client.query(&statement, &[&webhook_id, &after_at, &after_id, &limit]).await?;
    let time = |row: &tokio_postgres::Row, index: usize| {
        row.get::<_, Option<chrono::DateTime<chrono::Utc>>>(index).map(platform::time::format_timestamp)
    };
    Ok(rows
        .iter()
        .map(|row| {
            let state: String = row.get(3);
            let created_at: chrono::DateTime<chrono::Utc> = row.get(1);
            let document = serde_json::json!({
                "id": row.get::<_, String>(0),
                "type": row.get::<_, String>(2),
                "status": state,
                "createdAt": platform::time::format_timestamp(created_at),
                "nextAttemptAt": if state == "pending" { time(row, 5) } else { None },
                "finishedAt": time(row, 6),
                "lastStatusCode": row.get::<_, Option<i32>>(7),
                "lastError": row.get::<_, Option<String>>(8),
                "attemptCount": row.get::<_, i32>(4),
                "attempts": row.get::<_, Value>(9),
            });
            DeliveryRow { created_at, delivery_id: row.get(0), document }
        })
        .collect())
}
