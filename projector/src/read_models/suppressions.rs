//! The suppressions read model: every live suppression (space-scoped and global) with its
//! document, and counters per scope for list totals.

use deadpool_postgres::Transaction;
use domain::suppressions::{scope, suppression_document};
use platform::events::LogEvent;
use platform::log::StoredEvent;
use platform::time::from_millis;

pub(super) const DDL: &str = "
CREATE TABLE {s}.suppressions (
    suppression_id text PRIMARY KEY,
    scope text NOT NULL,
    identifier text NOT NULL,
    reason text NOT NULL,
    created_at timestamptz NOT NULL,
    doc jsonb NOT NULL
);
CREATE INDEX ON {s}.suppressions (scope, created_at DESC, suppression_id DESC);
CREATE INDEX ON {s}.suppressions (identifier, scope);
CREATE TABLE {s}.suppression_counts (scope text PRIMARY KEY, total bigint NOT NULL);
";

pub(super) const EVENT_TYPES: &[&str] = &["SuppressionAdded.v1", "SuppressionRemoved.v1"];

pub(super) async fn apply(transaction: &Transaction<'_>, s: &str, event: &StoredEvent) -> anyhow::Result<()> {
    match event.decode()? {
        LogEvent::SuppressionAdded(added) => {
            let Some(document) = suppression_document(&added)? else { return Ok(()) };
            let identifier = document["identifier"].as_str().unwrap_or_default().to_owned();
            let statement = transaction
                .prepare_cached(&format!(
                    "WITH inserted AS (
                         INSERT INTO {s}.suppressions (suppression_id, scope, identifier, reason, created_at, doc)
                         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (suppression_id) DO NOTHING RETURNING scope)
                     INSERT INTO {s}.suppression_counts (scope, total) SELECT scope, 1 FROM inserted
                     ON CONFLICT (scope) DO UPDATE SET total = suppression_counts.total + 1"
                ))
                .await?;
            transaction
                .execute(
                    &statement,
                    &[
                        &added.suppression_id,
                        &scope(&added.space_id),
                        &identifier,
                        &added.reason,
                        &from_millis(added.created_at_ms),
                        &document,
                    ],
                )
                .await?;
        }
        LogEvent::SuppressionRemoved(removed) => {
            let statement = transaction
                .prepare_cached(&format!(
                    "WITH deleted AS (DELETE FROM {s}.suppressions WHERE suppression_id = $1 RETURNING scope)
                     UPDATE {s}.suppression_counts c SET total = c.total - 1 FROM deleted WHERE c.scope = deleted.scope"
                ))
                .await?;
            transaction.execute(&statement, &[&removed.suppression_id]).await?;
        }
        _ => {}
    }
    Ok(())
}

read_model! {
    /// The email suppression list, space-scoped and global.
    Suppressions = "suppressions", each
}
