//! The ingest's failures list: the messages of the Segment-compatible ingest that could not
//! be applied, newest first, and how many there were lately (for `platform status`).

use deadpool_postgres::GenericClient;
use serde_json::{Value, json};

/// A page of the space's failures (of one write key, when given), newest first, after the
/// failure `after` (the last of the previous page), and the next page's cursor.
pub async fn page(
    client: &impl GenericClient,
    space_id: &str,
    write_key_id: Option<&str>,
    after: Option<i64>,
    limit: i64,
) -> Result<(Vec<Value>, Option<String>), tokio_postgres::Error> {
    let statement = client
        .prepare_cached(
            "SELECT failure_id, write_key_id, message_id, message_type, code, reason, message,
                    to_char(received_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')
             FROM ingest_failures
             WHERE space_id = $1 AND ($2::text IS NULL OR write_key_id = $2) AND ($3::bigint IS NULL OR failure_id < $3)
             ORDER BY failure_id DESC LIMIT $4",
        )
        .await?;
    let rows = client.query(&statement, &[&space_id, &write_key_id, &after, &(limit + 1)]).await?;
    let more = rows.len() > usize::try_from(limit).unwrap_or(usize::MAX);
    let mut items = Vec::with_capacity(rows.len());
    let mut last = None;
    for row in rows.iter().take(usize::try_from(limit).unwrap_or(usize::MAX)) {
        let failure_id: i64 = row.get(0);
        last = Some(failure_id);
        let message_id: String = row.get(2);
        items.push(json!({
            "id": failure_id.to_string(),
            "writeKeyId": row.get::<_, String>(1),
            "messageId": (!message_id.is_empty()).then_some(message_id),
            "type": row.get::<_, String>(3),
            "code": row.get::<_, String>(4),
            "reason": row.get::<_, String>(5),
            "message": row.get::<_, Value>(6),
            "receivedAt": row.get::<_, String>(7),
        }));
    }
    Ok((items, last.filter(|_| more).map(|id| id.to_string())))
}

/// The failures of the last 24 hours, over every space.
pub async fn recent_count(client: &impl GenericClient) -> Result<i64, tokio_postgres::Error> {
    let row = client
        .query_one("SELECT count(*) FROM ingest_failures WHERE received_at > now() - interval '24 hours'", &[])
        .await?;
    Ok(row.get(0))
}
