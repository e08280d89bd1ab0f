//! Record state and identity owners for decisions.

use deadpool_postgres::GenericClient;
pub use shared::records::{Loaded, load_records, stream_id};

use crate::records::decide::Owners;

/// Who holds each of `identities` (`(key, value)`) in the schema.
pub async fn identity_owners(
    client: &impl GenericClient,
    space_id: &str,
    schema_id: &str,
    identities: &[(&str, String)],
) -> Result<Owners, tokio_postgres::Error> {
    if identities.is_empty() {
        return Ok(Owners::new());
    }
    let kinds: Vec<&str> = identities.iter().map(|(kind, _)| *kind).collect();
    let values: Vec<&str> = identities.iter().map(|(_, value)| value.as_str()).collect();
    let statement = client
        .prepare_cached(
            "SELECT i.kind, i.value, i.record_id FROM record_identities i
             JOIN unnest($3::text[], $4::text[]) AS q(kind, value) ON q.kind = i.kind AND q.value = i.value
             WHERE i.space_id = $1 AND i.schema_id = $2",
        )
        .await?;
    let rows = client.query(&statement, &[&space_id, &schema_id, &kinds, &values]).await?;
    Ok(rows.into_iter().map(|row| ((row.get(0), row.get(1)), row.get(2))).collect())
}
