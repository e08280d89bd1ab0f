//! The business events read model: one row per accepted event with its readiness and data
//! (for `GET /events/{schema}/{id}/status`), and the cursor index of ready events: a partial
//! index on `(space_id, schema_id, occurred_at DESC, id DESC)` over ready rows, so a page is
//! one index range scan whatever the number of events, and an event that becomes ready late
//! or has an old `occurredAt` appears at its place in every listing made after that.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::Transaction;
use platform::events::{LogEvent, open};
use platform::log::StoredEvent;
use platform::proto;
use platform::time::from_millis;
use serde_json::Value;

pub(super) const DDL: &str = "
CREATE TABLE {s}.events (
    id text PRIMARY KEY,
    space_id text NOT NULL,
    schema_id text NOT NULL,
    event_id text NOT NULL,
    received_at timestamptz NOT NULL,
    occurred_at timestamptz NOT NULL,
    ready_at timestamptz,
    state text NOT NULL,
    reason text,
    definition_revision bigint NOT NULL,
    contact_id text,
    object_id text,
    data jsonb
);
CREATE INDEX events_ready ON {s}.events (space_id, schema_id, occurred_at DESC, id DESC) WHERE state = 'ready';
CREATE INDEX events_contact ON {s}.events (contact_id) WHERE contact_id IS NOT NULL;
CREATE INDEX events_object ON {s}.events (object_id) WHERE object_id IS NOT NULL;
CREATE TABLE {s}.erased_subjects (record_id text PRIMARY KEY);
";

/// Event types this projection reads; everything else is skipped without decoding.
pub(super) const EVENT_TYPES: &[&str] = &["EventAccepted.v1", "EventReadinessChanged.v1", "RecordDeletionRequested.v1"];

#[derive(Default)]
struct Accepted {
    id: Vec<String>,
    space_id: Vec<String>,
    schema_id: Vec<String>,
    event_id: Vec<String>,
    received_at: Vec<DateTime<Utc>>,
    occurred_at: Vec<DateTime<Utc>>,
    ready_at: Vec<Option<DateTime<Utc>>>,
    state: Vec<String>,
    revision: Vec<i64>,
    contact_id: Vec<Option<String>>,
    object_id: Vec<Option<String>>,
    data: Vec<Option<Value>>,
}

/// A readiness change: `(state, changed at, reason, prepared values)`.
type Change = (String, DateTime<Utc>, Option<String>, Option<Value>);

fn values(data: Option<proto::EventData>) -> anyhow::Result<Option<Value>> {
    data.map(|data| serde_json::from_str(&data.values_json)).transpose().map_err(Into::into)
}

fn non_empty(text: String) -> Option<String> {
    Some(text).filter(|text| !text.is_empty())
}

/// Applies a batch set-wise. Data opens with the subject keys that still exist (an erased
/// subject's events read as `null` data), and every event whose subject record was deleted,
/// before or within this batch, ends up absent, the same way on every replay.
pub(super) async fn apply(transaction: &Transaction<'_>, schema: &str, events: &[StoredEvent]) -> anyhow::Result<()> {
    let relevant: Vec<&StoredEvent> =
        events.iter().filter(|event| EVENT_TYPES.contains(&event.event_type.as_str())).collect();
    let subjects: Vec<String> = relevant.iter().filter_map(|event| event.subject_id.clone()).collect();
    let keys = platform::crypto::load_keys(transaction, &subjects).await?;
    let mut accepted = Accepted::default();
    let mut changes: BTreeMap<String, Change> = BTreeMap::new();
    let mut deleted = Vec::new();
    for event in relevant {
        match event.decode()? {
            LogEvent::EventAccepted(event) => {
                let data = values(open::<proto::EventData>(event.data.as_ref(), &keys)?)?;
                let received_at = from_millis(event.received_at_ms);
                let ready = event.readiness == "ready";
                accepted.ready_at.push(ready.then_some(received_at));
                accepted.id.push(event.id);
                accepted.space_id.push(event.space_id);
                accepted.schema_id.push(event.schema_id);
                accepted.event_id.push(event.event_id);
                accepted.received_at.push(received_at);
                accepted.occurred_at.push(from_millis(event.occurred_at_ms));
                accepted.state.push(event.readiness);
                accepted.revision.push(event.definition_revision);
                accepted.contact_id.push(non_empty(event.contact_id));
                accepted.object_id.push(non_empty(event.object_id));
                accepted.data.push(data);
            }
            LogEvent::EventReadinessChanged(change) => {
                let prepared = values(open::<proto::EventData>(change.prepared.as_ref(), &keys)?)?;
                let at = from_millis(change.changed_at_ms);
                changes.insert(change.id, (change.state, at, non_empty(change.reason), prepared));
            }
            LogEvent::RecordDeletionRequested(requested) => deleted.push(requested.record_id),
            _ => {}
        }
    }
    if !accepted.id.is_empty() {
        insert(transaction, schema, &accepted).await?;
    }
    if !changes.is_empty() {
        let mut ids = Vec::new();
        let mut states = Vec::new();
        let mut at = Vec::new();
        let mut reasons = Vec::new();
        let mut prepared = Vec::new();
        for (id, (state, changed_at, reason, values)) in changes {
            ids.push(id);
            states.push(state);
            at.push(changed_at);
            reasons.push(reason);
            prepared.push(values.unwrap_or(Value::Object(Default::default())));
        }
        let statement = transaction
            .prepare_cached(&format!(
                "UPDATE {schema}.events e SET state = c.state, reason = c.reason, data = e.data || c.prepared,
                     ready_at = CASE WHEN c.state = 'ready' THEN c.at END
                 FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[], $5::jsonb[])
                     AS c(id, state, at, reason, prepared)
                 WHERE e.id = c.id"
            ))
            .await?;
        transaction.execute(&statement, &[&ids, &states, &at, &reasons, &prepared]).await?;
    }
    if !deleted.is_empty() {
        let statement = transaction
            .prepare_cached(&format!(
                "WITH erased AS (
                     INSERT INTO {schema}.erased_subjects (record_id) SELECT unnest($1::text[])
                     ON CONFLICT DO NOTHING)
                 DELETE FROM {schema}.events WHERE contact_id = ANY($1) OR object_id = ANY($1)"
            ))
            .await?;
        transaction.execute(&statement, &[&deleted]).await?;
    }
    Ok(())
}

async fn insert(transaction: &Transaction<'_>, schema: &str, accepted: &Accepted) -> anyhow::Result<()> {
    let statement = transaction
        .prepare_cached(&format!(
            "INSERT INTO {schema}.events (id, space_id, schema_id, event_id, received_at, occurred_at, ready_at, state,
                 definition_revision, contact_id, object_id, data)
             SELECT e.* FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[],
                 $6::timestamptz[], $7::timestamptz[], $8::text[], $9::bigint[], $10::text[], $11::text[], $12::jsonb[])
                 AS e(id, space_id, schema_id, event_id, received_at, occurred_at, ready_at, state,
                      definition_revision, contact_id, object_id, data)
             WHERE NOT EXISTS (SELECT 1 FROM {schema}.erased_subjects x
                               WHERE x.record_id = e.contact_id OR x.record_id = e.object_id)
             ON CONFLICT (id) DO NOTHING"
        ))
        .await?;
    transaction
        .execute(
            &statement,
            &[
                &accepted.id,
                &accepted.space_id,
                &accepted.schema_id,
                &accepted.event_id,
                &accepted.received_at,
                &accepted.occurred_at,
                &accepted.ready_at,
                &accepted.state,
                &accepted.revision,
                &accepted.contact_id,
                &accepted.object_id,
                &accepted.data,
            ],
        )
        .await?;
    Ok(())
}

read_model! {
    /// Business events with their readiness, and the cursor index of ready events.
    Events = "events", batch
}
