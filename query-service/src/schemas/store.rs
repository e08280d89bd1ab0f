//! Reads of schemas and attributes from catalog version schema `catalog`.

use deadpool_postgres::Client;
use domain::catalog::SchemaEntry;
use platform::error::ApiError;
use serde_json::Value;
use tokio_postgres::types::ToSql;

use crate::consistency::page_of_docs;

/// A page of the space's schemas of `types`, oldest first, with the total.
pub async fn page(
    client: &Client,
    catalog: &str,
    space_id: &str,
    types: &[String],
    (limit, offset): (i64, i64),
) -> Result<(i64, Vec<Value>), ApiError> {
    let count = format!(
        "SELECT COALESCE(sum(total), 0)::bigint FROM {catalog}.schema_counts WHERE space_id = $1 AND schema_type = ANY($2)"
    );
    let rows = format!(
        "SELECT doc FROM {catalog}.schemas WHERE space_id = $1 AND schema_type = ANY($2)
         ORDER BY created_at, schema_id LIMIT $3 OFFSET $4"
    );
    let params: [&(dyn ToSql + Sync); 2] = [&space_id, &types];
    page_of_docs(client, &count, &rows, &params, (limit, offset)).await
}

/// The schema `schema_ref` (id or slug) of the space.
pub async fn find(
    client: &Client,
    catalog: &str,
    space_id: &str,
    schema_ref: &str,
) -> Result<Option<SchemaEntry>, ApiError> {
    Ok(reads::catalog::find_schema(client, catalog, space_id, schema_ref).await?)
}

/// The schema `schema_ref` and a page of its attributes (base first, then custom).
pub async fn attributes(
    client: &Client,
    catalog: &str,
    space_id: &str,
    schema_ref: &str,
    (limit, offset): (i64, i64),
) -> Result<(Option<SchemaEntry>, Vec<Value>), ApiError> {
    let rows = client
        .prepare_cached(&format!(
            "SELECT doc FROM {catalog}.attributes WHERE schema_id = (
                 SELECT schema_id FROM {catalog}.schemas WHERE space_id = $1 AND (schema_id = $2 OR slug = $2)
                 ORDER BY (schema_id = $2) DESC LIMIT 1)
             ORDER BY ordinal LIMIT $3 OFFSET $4"
        ))
        .await?;
    let rows_params: [&(dyn ToSql + Sync); 4] = [&space_id, &schema_ref, &limit, &offset];
    let (schema, rows) = tokio::join!(
        reads::catalog::find_schema(client, catalog, space_id, schema_ref),
        client.query(&rows, &rows_params)
    );
    let items: Vec<Value> = rows?.into_iter().map(|row| row.get(0)).collect();
    Ok((schema?, items))
}
