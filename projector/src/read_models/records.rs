//! The records read model: one row per record with its wire document, and per-schema counts
//! so list totals never need `COUNT(*)`.

use deadpool_postgres::Transaction;
use domain::records::{RecordState, record_document};
use platform::events::LogEvent;
use platform::log::StoredEvent;
use platform::time::from_millis;

pub(super) const DDL: &str = "
CREATE TABLE {s}.records (
    record_id text PRIMARY KEY,
    space_id text NOT NULL,
    schema_id text NOT NULL,
    created_at timestamptz NOT NULL,
    doc jsonb NOT NULL
);
CREATE TABLE {s}.record_counts (
    space_id text NOT NULL,
    schema_id text NOT NULL,
    total bigint NOT NULL,
    PRIMARY KEY (space_id, schema_id)
);
";

/// The list's order; `apply` reads records by id alone.
const READ_INDEXES: &str = "CREATE INDEX ON {s}.records (space_id, schema_id, created_at, record_id);";

/// Event types this projection reads; everything else is skipped without decoding.
pub(super) const EVENT_TYPES: &[&str] = &["RecordCreated.v1", "RecordUpdated.v1", "RecordDeletionRequested.v1"];

/// Applies a batch set-wise: new records are inserted and the counters grow by the rows
/// actually inserted, updates replace documents, deletions remove rows and shrink the
/// counters by the rows actually removed, so applying the same events twice changes nothing.
/// Personal data opens with the data keys that still exist: a record whose key is destroyed
/// (erased) is projected with its personal fields empty, the same way on every replay, and
/// its deletion, later in the log, removes the row.
pub(super) async fn apply(transaction: &Transaction<'_>, schema: &str, events: &[StoredEvent]) -> anyhow::Result<()> {
    let relevant: Vec<&StoredEvent> =
        events.iter().filter(|event| EVENT_TYPES.contains(&event.event_type.as_str())).collect();
    let subjects: Vec<String> = relevant.iter().filter_map(|event| event.subject_id.clone()).collect();
    let keys = platform::crypto::load_keys(transaction, &subjects).await?;
    let mut deleted = Vec::new();
    let mut record_ids = Vec::new();
    let mut space_ids = Vec::new();
    let mut schema_ids = Vec::new();
    let mut created_at = Vec::new();
    let mut documents = Vec::new();
    // Updates carry the whole new state: only the last one of a record in the batch matters.
    let mut updated: std::collections::BTreeMap<String, serde_json::Value> = std::collections::BTreeMap::new();
    for event in relevant {
        match event.decode()? {
            LogEvent::RecordCreated(created) => {
                documents.push(record_document(&created, &keys)?);
                created_at.push(from_millis(created.created_at_ms));
                record_ids.push(created.record_id);
                space_ids.push(created.space_id);
                schema_ids.push(created.schema_id);
            }
            LogEvent::RecordUpdated(update) => {
                let state = RecordState::from_updated(&update, &keys)?;
                updated.insert(update.record_id, state.document());
            }
            LogEvent::RecordDeletionRequested(requested) => {
                updated.remove(&requested.record_id);
                deleted.push(requested.record_id);
            }
            _ => {}
        }
    }
    if !record_ids.is_empty() {
        insert_records(transaction, schema, &record_ids, &space_ids, &schema_ids, &created_at, &documents).await?;
    }
    if !updated.is_empty() {
        let (ids, docs): (Vec<String>, Vec<serde_json::Value>) = updated.into_iter().unzip();
        let statement = transaction
            .prepare_cached(&format!(
                "UPDATE {schema}.records r SET doc = u.doc FROM unnest($1::text[], $2::jsonb[]) AS u(record_id, doc)
                 WHERE r.record_id = u.record_id"
            ))
            .await?;
        transaction.execute(&statement, &[&ids, &docs]).await?;
    }
    if !deleted.is_empty() {
        let statement = transaction
            .prepare_cached(&format!(
                "WITH gone AS (
                     DELETE FROM {schema}.records r USING unnest($1::text[]) AS d(record_id)
                     WHERE r.record_id = d.record_id RETURNING r.space_id, r.schema_id),
                 counted AS (SELECT space_id, schema_id, count(*) AS n FROM gone GROUP BY space_id, schema_id)
                 UPDATE {schema}.record_counts c SET total = c.total - counted.n FROM counted
                 WHERE c.space_id = counted.space_id AND c.schema_id = counted.schema_id"
            ))
            .await?;
        transaction.execute(&statement, &[&deleted]).await?;
    }
    Ok(())
}

async fn insert_records(
    transaction: &Transaction<'_>,
    schema: &str,
    record_ids: &[String],
    space_ids: &[String],
    schema_ids: &[String],
    created_at: &[chrono::DateTime<chrono::Utc>],
    documents: &[serde_json::Value],
) -> anyhow::Result<()> {
    let statement = transaction
        .prepare_cached(&format!(
            "WITH inserted AS (
                 INSERT INTO {schema}.records (record_id, space_id, schema_id, created_at, doc)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::jsonb[])
                 ON CONFLICT (record_id) DO NOTHING
                 RETURNING space_id, schema_id)
             INSERT INTO {schema}.record_counts (space_id, schema_id, total)
             SELECT space_id, schema_id, count(*) FROM inserted GROUP BY space_id, schema_id
             ON CONFLICT (space_id, schema_id) DO UPDATE SET total = record_counts.total + EXCLUDED.total"
        ))
        .await?;
    transaction.execute(&statement, &[&record_ids, &space_ids, &schema_ids, &created_at, &documents]).await?;
    Ok(())
}

read_model! {
    /// Contact and object records, with per-schema counters for list totals.
    Records = "records", batch, read_indexes = READ_INDEXES
}
