//! Reads of the `webhooks` read model, joined with the delivery counters.

use deadpool_postgres::Client;
use serde_json::Value;
use shared::error::ApiError;
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
