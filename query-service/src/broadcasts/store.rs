//! Reads of the `broadcasts` read model, and of the broadcast engine's runs and recipients.

use deadpool_postgres::Client;
use platform::error::ApiError;
use serde_json::Value;
use tokio_postgres::types::ToSql;

use crate::consistency::page_of_docs;

/// A run as the API shows it, with its counts, from `r` (a `broadcast_runs` row).
const RUN: &str = "jsonb_build_object(
    'id', r.run_id, 'broadcastId', r.broadcast_id, 'status', r.status, 'templateId', r.template_id,
    'senderId', r.sender_id, 'audience', r.audience,
    'startAt', to_char(r.start_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'requestedAt', to_char(r.requested_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'startedAt', to_char(r.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'finishedAt', to_char(r.finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    'error', r.error,
    'counts', (
        SELECT jsonb_build_object(
            'audience', r.audience_count,
            'pending', count(*) FILTER (WHERE x.state = 'pending'),
            'queued', count(*) FILTER (WHERE x.state = 'scheduled' AND o.state IN ('pending', 'attempting')),
            'sent', count(*) FILTER (WHERE o.state = 'sent'),
            'failed', count(*) FILTER (WHERE o.state = 'failed'),
            'outcomeUnknown', count(*) FILTER (WHERE o.state = 'unknown'),
            'skipped', jsonb_build_object(
                'notSubscribed', count(*) FILTER (WHERE x.reason = 'not_subscribed'),
                'suppressed', count(*) FILTER (WHERE x.reason = 'suppressed'),
                'allowance', count(*) FILTER (WHERE x.reason = 'allowance'),
                'noAddress', count(*) FILTER (WHERE x.reason = 'no_address'),
                'gone', count(*) FILTER (WHERE x.reason = 'gone')))
        FROM broadcast_recipients x LEFT JOIN email_outbox o ON o.email_id = x.email_id
        WHERE x.run_id = r.run_id))";

/// A page of the space's broadcasts, by slug, with the total.
pub async fn page(
    client: &Client,
    b: &str,
    space_id: &str,
    (limit, offset): (i64, i64),
) -> Result<(i64, Vec<Value>), ApiError> {
    let count_sql = format!("SELECT total FROM {b}.broadcast_counts WHERE space_id = $1");
    let rows_sql =
        format!("SELECT doc FROM {b}.broadcasts WHERE space_id = $1 ORDER BY slug, broadcast_id LIMIT $2 OFFSET $3");
    let params: [&(dyn ToSql + Sync); 1] = [&space_id];
    page_of_docs(client, &count_sql, &rows_sql, &params, (limit, offset)).await
}

/// One broadcast of the space.
pub async fn broadcast(
    client: &Client,
    b: &str,
    space_id: &str,
    broadcast_id: &str,
) -> Result<Option<Value>, ApiError> {
    let statement = client
        .prepare_cached(&format!("SELECT doc FROM {b}.broadcasts WHERE space_id = $1 AND broadcast_id = $2"))
        .await?;
    Ok(client.query_opt(&statement, &[&space_id, &broadcast_id]).await?.map(|row| row.get(0)))
}

/// A page of the broadcast's runs, newest first (by request time, then id), with the total;
/// `None` when the space has no such broadcast.
pub async fn runs(
    client: &Client,
    b: &str,
    space_id: &str,
    broadcast_id: &str,
    (limit, offset): (i64, i64),
) -> Result<Option<(i64, Vec<Value>)>, ApiError> {
    if broadcast(client, b, space_id, broadcast_id).await?.is_none() {
        return Ok(None);
    }
    let count_sql = "SELECT count(*) FROM broadcast_runs WHERE broadcast_id = $1";
    let rows_sql = format!(
        "SELECT {RUN} FROM broadcast_runs r WHERE r.broadcast_id = $1
         ORDER BY r.requested_at DESC, r.run_id DESC LIMIT $2 OFFSET $3"
    );
    let params: [&(dyn ToSql + Sync); 1] = [&broadcast_id];
    page_of_docs(client, count_sql, &rows_sql, &params, (limit, offset)).await.map(Some)
}

/// A run of the broadcast; `None` when the space has no such broadcast, `Some(None)` when the
/// broadcast has no such run.
pub async fn run(
    client: &Client,
    b: &str,
    space_id: &str,
    (broadcast_id, run_id): (&str, &str),
) -> Result<Option<Option<Value>>, ApiError> {
    if broadcast(client, b, space_id, broadcast_id).await?.is_none() {
        return Ok(None);
    }
    let statement = client
        .prepare_cached(&format!("SELECT {RUN} FROM broadcast_runs r WHERE r.broadcast_id = $1 AND r.run_id = $2"))
        .await?;
    Ok(Some(client.query_opt(&statement, &[&broadcast_id, &run_id]).await?.map(|row| row.get::<_, Value>(0))))
}
