//! The broadcasts read model: each broadcast as authored with the API's changes folded over it
//! (`domain::email::broadcasts`), and the number per space for list totals. The definition is
//! kept beside the document, for the changes that follow.

use deadpool_postgres::Transaction;
use domain::email::broadcasts::{apply_update, document};
use domain::email::resources::{BROADCAST, BroadcastDef};
use platform::events::LogEvent;
use platform::log::StoredEvent;

pub(super) const DDL: &str = "
CREATE TABLE {s}.broadcasts (
    broadcast_id text PRIMARY KEY,
    space_id text NOT NULL,
    slug text NOT NULL,
    definition jsonb NOT NULL,
    doc jsonb NOT NULL
);
CREATE INDEX ON {s}.broadcasts (space_id, slug);
CREATE TABLE {s}.broadcast_counts (space_id text PRIMARY KEY, total bigint NOT NULL);
";

pub(super) const EVENT_TYPES: &[&str] = &["ResourceDefined.v1", "BroadcastUpdated.v1"];

pub(super) async fn apply(transaction: &Transaction<'_>, s: &str, event: &StoredEvent) -> anyhow::Result<()> {
    let at_ms = event.recorded_at.timestamp_millis();
    let (broadcast_id, space_id, definition) = match event.decode()? {
        LogEvent::ResourceDefined(resource) if resource.kind == BROADCAST => {
            let definition: BroadcastDef = serde_json::from_str(&resource.definition_json)?;
            (resource.resource_id, resource.space_id, definition)
        }
        LogEvent::BroadcastUpdated(update) => {
            let statement = transaction
                .prepare_cached(&format!("SELECT definition FROM {s}.broadcasts WHERE broadcast_id = $1"))
                .await?;
            let Some(row) = transaction.query_opt(&statement, &[&update.broadcast_id]).await? else { return Ok(()) };
            let current: BroadcastDef = serde_json::from_value(row.get(0))?;
            (update.broadcast_id.clone(), update.space_id.clone(), apply_update(current, &update))
        }
        _ => return Ok(()),
    };
    let statement = transaction
        .prepare_cached(&format!(
            "WITH written AS (
                 INSERT INTO {s}.broadcasts (broadcast_id, space_id, slug, definition, doc) VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (broadcast_id) DO UPDATE SET slug = EXCLUDED.slug, definition = EXCLUDED.definition,
                     doc = EXCLUDED.doc
                 RETURNING space_id, (xmax = 0) AS inserted)
             INSERT INTO {s}.broadcast_counts (space_id, total) SELECT space_id, 1 FROM written WHERE inserted
             ON CONFLICT (space_id) DO UPDATE SET total = broadcast_counts.total + 1"
        ))
        .await?;
    let doc = document(&broadcast_id, &definition, at_ms);
    transaction
        .execute(&statement, &[&broadcast_id, &space_id, &definition.slug, &serde_json::to_value(&definition)?, &doc])
        .await?;
    Ok(())
}

read_model! {
    /// Broadcasts as authored and changed.
    Broadcasts = "broadcasts", each
}
