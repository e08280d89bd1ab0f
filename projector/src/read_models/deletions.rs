//! Record deletion operations and their status, for `GET /record-deletions/{operationId}`.
//! No personal data: ids, states and messages only.

use deadpool_postgres::Transaction;
use platform::events::LogEvent;
use platform::log::StoredEvent;
use platform::time::from_millis;

pub(super) const DDL: &str = "
CREATE TABLE {s}.deletions (
    operation_id text PRIMARY KEY,
    space_id text NOT NULL,
    schema_id text NOT NULL,
    record_id text NOT NULL,
    status text NOT NULL,
    message text NOT NULL,
    requested_at timestamptz NOT NULL,
    completed_at timestamptz
);
";

pub(super) const EVENT_TYPES: &[&str] =
    &["RecordDeletionRequested.v1", "RecordDeletionBlocked.v1", "RecordDeletionCompleted.v1"];

/// What a completed deletion says.
pub(crate) const COMPLETED_MESSAGE: &str =
    "erasure complete: the record's data key is destroyed and no read model holds its data";

pub(super) async fn apply(transaction: &Transaction<'_>, schema: &str, event: &StoredEvent) -> anyhow::Result<()> {
    match event.decode()? {
        LogEvent::RecordDeletionRequested(requested) => {
            let statement = transaction
                .prepare_cached(&format!(
                    "INSERT INTO {schema}.deletions
                         (operation_id, space_id, schema_id, record_id, status, message, requested_at)
                     VALUES ($1, $2, $3, $4, 'pending', $5, $6) ON CONFLICT (operation_id) DO NOTHING"
                ))
                .await?;
            transaction
                .execute(
                    &statement,
                    &[
                        &requested.operation_id,
                        &requested.space_id,
                        &requested.schema_id,
                        &requested.record_id,
                        &domain::records::DELETION_PENDING_MESSAGE,
                        &from_millis(requested.requested_at_ms),
                    ],
                )
                .await?;
        }
        LogEvent::RecordDeletionBlocked(blocked) => {
            let statement = transaction
                .prepare_cached(&format!(
                    "UPDATE {schema}.deletions SET status = 'blocked', message = $2
                     WHERE operation_id = $1 AND status <> 'completed'"
                ))
                .await?;
            transaction.execute(&statement, &[&blocked.operation_id, &blocked.reason]).await?;
        }
        LogEvent::RecordDeletionCompleted(completed) => {
            let statement = transaction
                .prepare_cached(&format!(
                    "UPDATE {schema}.deletions SET status = 'completed', message = $2, completed_at = $3
                     WHERE operation_id = $1"
                ))
                .await?;
            transaction
                .execute(
                    &statement,
                    &[&completed.operation_id, &COMPLETED_MESSAGE, &from_millis(completed.completed_at_ms)],
                )
                .await?;
        }
        _ => {}
    }
    Ok(())
}

read_model! {
    /// Record deletion operations and their status.
    Deletions = "deletions", each
}
