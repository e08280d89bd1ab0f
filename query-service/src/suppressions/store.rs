//! Reads of the suppression list from read model version schema `suppressions`.

use deadpool_postgres::Client;
use platform::error::ApiError;
use serde_json::Value;
use tokio_postgres::types::ToSql;

use crate::consistency::page_of_docs;

/// A page of the suppressions of `scopes` (the caller's space and `global`), newest first,
/// only those of `identifier` when given, with the total.
pub async fn page(
    client: &Client,
    suppressions: &str,
    scopes: &[String],
    identifier: Option<&str>,
    (limit, offset): (i64, i64),
) -> Result<(i64, Vec<Value>), ApiError> {
    let (count_sql, rows_sql) = match identifier {
        // One identifier has a handful of rows: counting them is cheap.
        Some(_) => (
            format!("SELECT count(*) FROM {suppressions}.suppressions WHERE scope = ANY($1) AND identifier = $2"),
            format!(
                "SELECT doc FROM {suppressions}.suppressions WHERE scope = ANY($1) AND identifier = $2
                 ORDER BY created_at DESC, suppression_id DESC LIMIT $3 OFFSET $4"
            ),
        ),
        None => (
            format!(
                "SELECT COALESCE(sum(total), 0)::bigint FROM {suppressions}.suppression_counts
                 WHERE scope = ANY($1) AND $2::text IS NULL"
            ),
            format!(
                "SELECT doc FROM {suppressions}.suppressions WHERE scope = ANY($1) AND $2::text IS NULL
                 ORDER BY created_at DESC, suppression_id DESC LIMIT $3 OFFSET $4"
            ),
        ),
    };
    let params: [&(dyn ToSql + Sync); 2] = [&scopes, &identifier];
    page_of_docs(client, &count_sql, &rows_sql, &params, (limit, offset)).await
}
