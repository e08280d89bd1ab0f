//! Reads of business events from read model version schema `events`, each one statement with
//! the consistency check: the cursor page of ready events (one index range scan from the
//! cursor, whatever the number of events) and one event's status. Both resolve the schema
//! named (by id or slug) in the same statement.

use chrono::{DateTime, Utc};
use platform::readmodel::{CHECK_SQL, CHECK_WIDTH};
use platform::time::format_timestamp;
use serde_json::{Value, json};
use tokio_postgres::Row;

/// Where the schema's columns start in a row of [`page_sql`] or [`status_sql`]: its id, slug
/// and type (all null when the space has no such schema).
pub(crate) const SCHEMA_AT: usize = CHECK_WIDTH;
/// Where the event's columns start, in the order [`event_document`] takes them (all null when
/// there is no event).
pub(crate) const EVENT_AT: usize = CHECK_WIDTH + 3;

/// The schema `$4` (id or slug) of space `$3`, as a one-row (or empty) common table expression.
fn schema_cte(catalog: &str) -> String {
    format!(
        "s AS (SELECT schema_id, slug, schema_type FROM {catalog}.schemas
               WHERE space_id = $3 AND (schema_id = $4 OR slug = $4) ORDER BY (schema_id = $4) DESC LIMIT 1)"
    )
}

fn timestamp_ms(row: &Row, index: usize) -> Option<String> {
    row.get::<_, Option<DateTime<Utc>>>(index).map(format_timestamp)
}

/// Columns both endpoints read, in the order [`event_document`] takes them.
const COLUMNS: &str = "id, schema_id, event_id, received_at, occurred_at, ready_at, state, definition_revision, \
                       contact_id, object_id, data, reason";

/// An event read: what a page or the status needs besides the public document.
pub(crate) struct EventRow {
    pub id: String,
    pub schema_id: String,
    pub occurred_at: DateTime<Utc>,
    pub document: Value,
}

/// The event whose columns start at [`EVENT_AT`], if the row has one.
pub(crate) fn event_document(row: &Row) -> Option<EventRow> {
    let at = |offset: usize| EVENT_AT + offset;
    let id = row.get::<_, Option<String>>(at(0))?;
    let document = json!({
        "id": &id,
        "eventId": row.get::<_, String>(at(2)),
        "receivedAt": timestamp_ms(row, at(3)),
        "occurredAt": timestamp_ms(row, at(4)),
        "readyAt": timestamp_ms(row, at(5)),
        "readinessState": row.get::<_, String>(at(6)),
        "definitionRevision": row.get::<_, i64>(at(7)).to_string(),
        "contactId": row.get::<_, Option<String>>(at(8)),
        "objectId": row.get::<_, Option<String>>(at(9)),
        "data": row.get::<_, Option<Value>>(at(10)),
        "readinessReason": row.get::<_, Option<String>>(at(11)),
    });
    Some(EventRow { id, schema_id: row.get(at(1)), occurred_at: row.get(at(4)), document })
}

/// One page of the ready events of schema `$4` in space `$3`, newest first, in the window
/// `$5`..`$6` after the cursor position `$7`, `$8` (both null on the first page), `$9` rows
/// (one more than the page's limit, to tell whether more follow). One row per event, or one
/// row without an event when there are none; events only when the schema is an event schema.
pub(crate) fn page_sql(catalog: &str, events: &str) -> String {
    format!(
        "WITH c AS ({CHECK_SQL}), {schema}
         SELECT c.*, s.schema_id, s.slug, s.schema_type, e.* FROM c LEFT JOIN s ON true LEFT JOIN LATERAL (
             SELECT {COLUMNS} FROM {events}.events
              WHERE space_id = $3 AND schema_id = s.schema_id AND s.schema_type = 'event' AND state = 'ready'
                AND occurred_at >= $5 AND occurred_at < $6
                AND ($7::timestamptz IS NULL OR (occurred_at, id) < ($7, $8::text))
              ORDER BY occurred_at DESC, id DESC LIMIT $9) e ON true
         ORDER BY e.occurred_at DESC, e.id DESC",
        schema = schema_cte(catalog)
    )
}

/// Event `$5` of space `$3`, whatever its schema, and schema `$4`. One row.
pub(crate) fn status_sql(catalog: &str, events: &str) -> String {
    format!(
        "WITH c AS ({CHECK_SQL}), {schema}
         SELECT c.*, s.schema_id, s.slug, s.schema_type, e.* FROM c LEFT JOIN s ON true LEFT JOIN LATERAL (
             SELECT {COLUMNS} FROM {events}.events WHERE id = $5 AND space_id = $3) e ON true",
        schema = schema_cte(catalog)
    )
}
