//! Reads of the `segments` read model: the space's segments, one segment, its members.

use deadpool_postgres::Client;
use platform::error::ApiError;
use serde_json::Value;
use tokio_postgres::types::ToSql;

use crate::consistency::page_of_docs;

/// A segment as the API shows it.
const DOCUMENT: &str = "g.doc || jsonb_build_object('memberCount', g.member_count)";

/// A page of the space's segments, newest first, with the total.
pub async fn page(
    client: &Client,
    g: &str,
    space_id: &str,
    (limit, offset): (i64, i64),
) -> Result<(i64, Vec<Value>), ApiError> {
    let count_sql = format!("SELECT total FROM {g}.segment_counts WHERE space_id = $1");
    let rows_sql = format!(
        "SELECT {DOCUMENT} FROM {g}.segments g WHERE g.space_id = $1
         ORDER BY g.created_at DESC, g.segment_id DESC LIMIT $2 OFFSET $3"
    );
    let params: [&(dyn ToSql + Sync); 1] = [&space_id];
    page_of_docs(client, &count_sql, &rows_sql, &params, (limit, offset)).await
}

/// One segment of the space.
pub async fn segment(client: &Client, g: &str, space_id: &str, segment_id: &str) -> Result<Option<Value>, ApiError> {
    let statement = client
        .prepare_cached(&format!("SELECT {DOCUMENT} FROM {g}.segments g WHERE g.space_id = $1 AND g.segment_id = $2"))
        .await?;
    Ok(client.query_opt(&statement, &[&space_id, &segment_id]).await?.map(|row| row.get(0)))
}

/// A page of the segment's contacts as record documents, by contact id, with the member
/// count; `None` when the space has no such segment.
pub async fn contacts(
    client: &Client,
    g: &str,
    space_id: &str,
    segment_id: &str,
    (limit, offset): (i64, i64),
) -> Result<Option<(i64, Vec<Value>)>, ApiError> {
    if segment(client, g, space_id, segment_id).await?.is_none() {
        return Ok(None);
    }
    let count_sql = format!("SELECT member_count FROM {g}.segments WHERE segment_id = $1");
    let rows_sql = format!(
        "SELECT c.doc FROM {g}.members m JOIN {g}.contacts c USING (contact_id)
         WHERE m.segment_id = $1 ORDER BY m.contact_id LIMIT $2 OFFSET $3"
    );
    let params: [&(dyn ToSql + Sync); 1] = [&segment_id];
    page_of_docs(client, &count_sql, &rows_sql, &params, (limit, offset)).await.map(Some)
}
