//! Reads of records from the records read model (`records`) and the catalog (`catalog`).

use deadpool_postgres::Client;
use serde_json::Value;
use shared::catalog::{self, SchemaEntry};
use shared::error::ApiError;
use tokio_postgres::types::ToSql;

use crate::consistency::page_of_docs;

/// The schema id of `reference` (id or slug) in space `space`, as a SQL subquery over catalog
/// `catalog` (`space` and `reference` are placeholders).
fn schema_id_subquery(catalog: &str, space: &str, reference: &str) -> String {
    format!(
        "(SELECT schema_id FROM {catalog}.schemas WHERE space_id = {space} AND (schema_id = {reference} OR slug = {reference})
          ORDER BY (schema_id = {reference}) DESC LIMIT 1)"
    )
}

/// The schema `schema_ref` and a page of its records, oldest first, with the total.
pub async fn page(
    client: &Client,
    (catalog, records): (&str, &str),
    space_id: &str,
    schema_ref: &str,
    (limit, offset): (i64, i64),
) -> Result<(Option<SchemaEntry>, i64, Vec<Value>), ApiError> {
    let schema_id = schema_id_subquery(catalog, "$1", "$2");
    let count = format!("SELECT total FROM {records}.record_counts WHERE space_id = $1 AND schema_id = {schema_id}");
    let rows = format!(
        "SELECT doc FROM {records}.records WHERE space_id = $1 AND schema_id = {schema_id}
         ORDER BY created_at, record_id LIMIT $3 OFFSET $4"
    );
    let params: [&(dyn ToSql + Sync); 2] = [&space_id, &schema_ref];
    let (schema, page) = tokio::join!(
        catalog::find_schema(client, catalog, space_id, schema_ref),
        page_of_docs(client, &count, &rows, &params, (limit, offset)),
    );
    let (total, items) = page?;
    Ok((schema?, total, items))
}

/// The schema `schema_ref` and the document of its record `record_id`.
pub async fn get(
    client: &Client,
    (catalog, records): (&str, &str),
    space_id: &str,
    schema_ref: &str,
    record_id: &str,
) -> Result<(Option<SchemaEntry>, Option<Value>), ApiError> {
    let schema_id = schema_id_subquery(catalog, "$2", "$3");
    let fetch = client
        .prepare_cached(&format!(
            "SELECT doc FROM {records}.records WHERE record_id = $1 AND space_id = $2 AND schema_id = {schema_id}"
        ))
        .await?;
    let fetch_params: [&(dyn ToSql + Sync); 3] = [&record_id, &space_id, &schema_ref];
    let (schema, record) = tokio::join!(
        catalog::find_schema(client, catalog, space_id, schema_ref),
        client.query_opt(&fetch, &fetch_params),
    );
    Ok((schema?, record?.map(|row| row.get::<_, Value>(0))))
}
