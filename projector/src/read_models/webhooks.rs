//! The webhooks read model: each webhook of a space as the API shows it (without its
//! counters, which the delivery engine keeps in `webhook_counters` and reads join), and the
//! number of webhooks per space for list totals.

use deadpool_postgres::Transaction;
use platform::log::StoredEvent;
use platform::time::from_millis;

pub(super) const DDL: &str = "
CREATE TABLE {s}.webhooks (
    webhook_id text PRIMARY KEY,
    space_id text NOT NULL,
    created_at timestamptz NOT NULL,
    doc jsonb NOT NULL
);
CREATE INDEX ON {s}.webhooks (space_id, created_at DESC, webhook_id DESC);
CREATE TABLE {s}.webhook_counts (space_id text PRIMARY KEY, total bigint NOT NULL);
";

pub(super) const EVENT_TYPES: &[&str] =
    &["WebhookCreated.v1", "WebhookUpdated.v1", "WebhookPaused.v1", "WebhookSecretRotated.v1", "WebhookDeleted.v1"];

pub(super) async fn apply(transaction: &Transaction<'_>, s: &str, event: &StoredEvent) -> anyhow::Result<()> {
    // The webhook as of this event: its stream folded up to its position, so a replay builds
    // the same rows.
    let decoded = event.decode()?;
    let Some(webhook_id) = domain::webhooks::state::webhook_of(&decoded) else { return Ok(()) };
    let (_, state) = reads::webhooks::load_at(transaction, webhook_id, event.position).await?;
    let Some(webhook) = state else { return Ok(()) };
    if webhook.deleted {
        let statement = transaction
            .prepare_cached(&format!(
                "WITH deleted AS (DELETE FROM {s}.webhooks WHERE webhook_id = $1 RETURNING space_id)
                 UPDATE {s}.webhook_counts c SET total = c.total - 1 FROM deleted WHERE c.space_id = deleted.space_id"
            ))
            .await?;
        transaction.execute(&statement, &[&webhook.webhook_id]).await?;
        return Ok(());
    }
    let statement = transaction
        .prepare_cached(&format!(
            "WITH written AS (
                 INSERT INTO {s}.webhooks (webhook_id, space_id, created_at, doc) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (webhook_id) DO UPDATE SET doc = EXCLUDED.doc
                 RETURNING space_id, (xmax = 0) AS inserted)
             INSERT INTO {s}.webhook_counts (space_id, total) SELECT space_id, 1 FROM written WHERE inserted
             ON CONFLICT (space_id) DO UPDATE SET total = webhook_counts.total + 1"
        ))
        .await?;
    transaction
        .execute(
            &statement,
            &[&webhook.webhook_id, &webhook.space_id, &from_millis(webhook.created_at_ms), &webhook.document()],
        )
        .await?;
    Ok(())
}

read_model! {
    /// The webhooks of each space.
    Webhooks = "webhooks", each
}
