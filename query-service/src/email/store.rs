//! The email resources of a space in the catalog read model (`resources`, by kind).

use std::collections::BTreeMap;

use deadpool_postgres::Client;
use platform::error::ApiError;
use serde_json::Value;
use tokio_postgres::types::ToSql;

/// A resource row: its id, revision and definition.
pub(super) struct Row {
    pub id: String,
    pub revision: i64,
    pub definition: Value,
}

fn row(row: tokio_postgres::Row) -> Row {
    Row { id: row.get(0), revision: row.get(1), definition: row.get(2) }
}

/// A page of a space's resources of `kind`, by slug, with the total.
pub(super) async fn page(
    client: &Client,
    catalog: &str,
    space_id: &str,
    kind: &str,
    (limit, offset): (i64, i64),
) -> Result<(i64, Vec<Row>), ApiError> {
    let count = client
        .prepare_cached(&format!("SELECT count(*) FROM {catalog}.resources WHERE space_id = $1 AND kind = $2"))
        .await?;
    let rows = client
        .prepare_cached(&format!(
            "SELECT resource_id, revision, definition FROM {catalog}.resources WHERE space_id = $1 AND kind = $2
             ORDER BY definition->>'slug', resource_id LIMIT $3 OFFSET $4"
        ))
        .await?;
    let params: [&(dyn ToSql + Sync); 4] = [&space_id, &kind, &limit, &offset];
    let (total, rows) = tokio::join!(client.query_one(&count, &params[..2]), client.query(&rows, &params));
    Ok((total?.get(0), rows?.into_iter().map(row).collect()))
}

/// One resource of the space.
pub(super) async fn get(
    client: &Client,
    catalog: &str,
    space_id: &str,
    kind: &str,
    id: &str,
) -> Result<Option<Row>, ApiError> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT resource_id, revision, definition FROM {catalog}.resources
             WHERE space_id = $1 AND kind = $2 AND resource_id = $3"
        ))
        .await?;
    Ok(client.query_opt(&statement, &[&space_id, &kind, &id]).await?.map(row))
}

/// What domain verification last found for `domain_ids`: domain → purpose →
/// `{found, checkedAt}` (the verification worker's table, `domain_checks`).
pub(super) async fn domain_checks(
    client: &Client,
    domain_ids: &[String],
) -> Result<BTreeMap<String, BTreeMap<String, Value>>, ApiError> {
    let mut checks: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
    if domain_ids.is_empty() {
        return Ok(checks);
    }
    let statement = client
        .prepare_cached(
            "SELECT domain_id, purpose, jsonb_build_object('found', found, 'checkedAt',
                    to_char(checked_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'))
             FROM domain_checks WHERE domain_id = ANY($1)",
        )
        .await?;
    for row in client.query(&statement, &[&domain_ids]).await? {
        checks.entry(row.get(0)).or_default().insert(row.get(1), row.get(2));
    }
    Ok(checks)
}
