//! The records read model: one row per record with its wire document, and per-schema counts
//! so list totals never need `COUNT(*)`.

use deadpool_postgres::Transaction;
use shared::events::LogEvent;
use shared::log::StoredEvent;
use shared::records::record_document;
use shared::time::from_millis;

pub(super) const DDL: &str = "
CREATE TABLE {s}.records (
    record_id text PRIMARY KEY,
    space_id text NOT NULL,
    schema_id text NOT NULL,
    created_at timestamptz NOT NULL,
    doc jsonb NOT NULL
);
CREATE INDEX ON {s}.records (space_id, schema_id, created_at, record_id);
CREATE TABLE {s}.record_counts (
    space_id text NOT NULL,
    schema_id text NOT NULL,
    total bigint NOT NULL,
    PRIMARY KEY (space_id, schema_id)
);
";

pub(super) async fn apply(transaction: &Transaction<'_>, schema: &str, event: &StoredEvent) -> anyhow::Result<()> {
    if let LogEvent::RecordCreated(created) = event.decode()? {
        let document = record_document(&created)?;
        let inserted = transaction
            .execute(
                &format!(
                    "INSERT INTO {schema}.records (record_id, space_id, schema_id, created_at, doc)
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (record_id) DO NOTHING"
                ),
                &[
                    &created.record_id,
                    &created.space_id,
                    &created.schema_id,
                    &from_millis(created.created_at_ms),
                    &document,
                ],
            )
            .await?;
        if inserted == 1 {
            transaction
                .execute(
                    &format!(
                        "INSERT INTO {schema}.record_counts (space_id, schema_id, total) VALUES ($1, $2, 1)
                         ON CONFLICT (space_id, schema_id) DO UPDATE SET total = record_counts.total + 1"
                    ),
                    &[&created.space_id, &created.schema_id],
                )
                .await?;
        }
    }
    Ok(())
}
