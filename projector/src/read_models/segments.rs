//! The segments read model: each segment of a space as the API shows it, and its membership,
//! maintained incrementally. A contact is evaluated again only when something about it changes
//! (its record, a topic subscription, an event it performed, a time window of a `performed`
//! condition opening or closing), against the segments of its space; a new segment is
//! evaluated once against the space's contacts. Nothing scans every contact per request.
//!
//! To evaluate, the model keeps its own copy of what filters read: each contact's document
//! with its subscriptions, and the times of the events it performed. Membership at a log event
//! is evaluated as of that event's recording time, so a rebuild from the log gives the same
//! membership. A `performed ... in the last` window that opens or closes with no new event is
//! brought into the log by the `segment_windows` timer, which this model schedules for the
//! earliest such moment of each contact (see ARCHITECTURE.md, "Segments").

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use anyhow::Context;
use deadpool_postgres::Transaction;
use serde_json::{Map, Value, json};
use shared::events::LogEvent;
use shared::filter::{Facts, Filter, SUBSCRIPTIONS};
use shared::log::StoredEvent;
use shared::time::from_millis;

/// The timer kind that re-evaluates a contact when a window opens or closes.
pub const WINDOW_TIMER: &str = "segment_windows";

/// Contacts read per page when a new segment is evaluated against its space.
const PAGE: i64 = 1_000;

pub(super) const DDL: &str = "
CREATE TABLE {s}.segments (
    segment_id text PRIMARY KEY,
    space_id text NOT NULL,
    created_at timestamptz NOT NULL,
    filter jsonb NOT NULL,
    doc jsonb NOT NULL,
    member_count bigint NOT NULL DEFAULT 0
);
CREATE INDEX ON {s}.segments (space_id, created_at DESC, segment_id DESC);
CREATE TABLE {s}.segment_counts (space_id text PRIMARY KEY, total bigint NOT NULL);
CREATE TABLE {s}.contacts (
    contact_id text PRIMARY KEY,
    space_id text NOT NULL,
    schema_id text,
    doc jsonb,
    subscriptions jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX ON {s}.contacts (space_id, contact_id);
CREATE TABLE {s}.contact_events (
    contact_id text NOT NULL,
    event_id text NOT NULL,
    schema_id text NOT NULL,
    occurred_at_ms bigint NOT NULL,
    PRIMARY KEY (contact_id, event_id)
);
CREATE TABLE {s}.members (
    segment_id text NOT NULL,
    contact_id text NOT NULL,
    joined_at timestamptz NOT NULL,
    PRIMARY KEY (segment_id, contact_id)
);
CREATE INDEX ON {s}.members (contact_id);
";

pub(super) const EVENT_TYPES: &[&str] = &[
    "SegmentCreated.v1",
    "SegmentDeleted.v1",
    "SegmentWindowElapsed.v1",
    "RecordCreated.v1",
    "RecordUpdated.v1",
    "RecordDeletionRequested.v1",
    "SubscriptionChanged.v1",
    "EventAccepted.v1",
    "EventReadinessChanged.v1",
];

pub(super) async fn apply(transaction: &Transaction<'_>, s: &str, event: &StoredEvent) -> anyhow::Result<()> {
    let now_ms = event.recorded_at.timestamp_millis();
    match event.decode()? {
        LogEvent::SegmentCreated(created) => {
            let filter: Value = serde_json::from_str(&created.filter_json).context("a segment's filter")?;
            let doc = json!({
                "id": created.segment_id,
                "name": created.name,
                "definition": created.definition,
                "description": created.description,
                "createdAt": shared::time::format_millis(created.created_at_ms),
            });
            let statement = transaction
                .prepare_cached(&format!(
                    "WITH written AS (
                         INSERT INTO {s}.segments (segment_id, space_id, created_at, filter, doc)
                         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (segment_id) DO NOTHING RETURNING space_id)
                     INSERT INTO {s}.segment_counts (space_id, total) SELECT space_id, 1 FROM written
                     ON CONFLICT (space_id) DO UPDATE SET total = segment_counts.total + 1"
                ))
                .await?;
            let created_at = from_millis(created.created_at_ms);
            transaction
                .execute(&statement, &[&created.segment_id, &created.space_id, &created_at, &filter, &doc])
                .await?;
            evaluate_space(transaction, s, &created.space_id, &created.segment_id, now_ms).await
        }
        LogEvent::SegmentDeleted(deleted) => {
            let statement = transaction
                .prepare_cached(&format!(
                    "WITH gone AS (DELETE FROM {s}.segments WHERE segment_id = $1 RETURNING space_id),
                     members AS (DELETE FROM {s}.members WHERE segment_id = $1)
                     UPDATE {s}.segment_counts c SET total = c.total - 1 FROM gone WHERE c.space_id = gone.space_id"
                ))
                .await?;
            transaction.execute(&statement, &[&deleted.segment_id]).await?;
            Ok(())
        }
        LogEvent::SegmentWindowElapsed(elapsed) => {
            evaluate_contact(transaction, s, &elapsed.space_id, &elapsed.contact_id, elapsed.at_ms.max(now_ms)).await
        }
        LogEvent::RecordCreated(created) if created.schema_type == "contact" => {
            let keys = shared::crypto::load_keys(transaction, std::slice::from_ref(&created.record_id)).await?;
            let document = shared::records::record_document(&created, &keys)?;
            let contact = (created.space_id.as_str(), created.schema_id.as_str(), created.record_id.as_str());
            store_document(transaction, s, contact, &document).await?;
            evaluate_contact(transaction, s, &created.space_id, &created.record_id, now_ms).await
        }
        LogEvent::RecordUpdated(updated) if updated.schema_type == "contact" => {
            let keys = shared::crypto::load_keys(transaction, std::slice::from_ref(&updated.record_id)).await?;
            let document = shared::records::RecordState::from_updated(&updated, &keys)?.document();
            let contact = (updated.space_id.as_str(), updated.schema_id.as_str(), updated.record_id.as_str());
            store_document(transaction, s, contact, &document).await?;
            evaluate_contact(transaction, s, &updated.space_id, &updated.record_id, now_ms).await
        }
        LogEvent::RecordDeletionRequested(requested) if requested.schema_type == "contact" => {
            let statement = transaction
                .prepare_cached(&format!(
                    "WITH gone AS (DELETE FROM {s}.members WHERE contact_id = $1 RETURNING segment_id),
                     counted AS (SELECT segment_id, count(*) AS n FROM gone GROUP BY segment_id),
                     contact AS (DELETE FROM {s}.contacts WHERE contact_id = $1),
                     events AS (DELETE FROM {s}.contact_events WHERE contact_id = $1)
                     UPDATE {s}.segments g SET member_count = g.member_count - counted.n FROM counted
                     WHERE g.segment_id = counted.segment_id"
                ))
                .await?;
            transaction.execute(&statement, &[&requested.record_id]).await?;
            Ok(())
        }
        LogEvent::SubscriptionChanged(changed) => {
            let statement = transaction
                .prepare_cached(&format!(
                    "INSERT INTO {s}.contacts (contact_id, space_id, subscriptions) VALUES ($1, $2, jsonb_build_object($3::text, $4::text))
                     ON CONFLICT (contact_id) DO UPDATE
                     SET subscriptions = contacts.subscriptions || jsonb_build_object($3::text, $4::text)"
                ))
                .await?;
            transaction
                .execute(&statement, &[&changed.contact_id, &changed.space_id, &changed.topic_id, &changed.status])
                .await?;
            evaluate_contact(transaction, s, &changed.space_id, &changed.contact_id, now_ms).await
        }
        LogEvent::EventAccepted(accepted) if accepted.readiness == "ready" && !accepted.contact_id.is_empty() => {
            performed(transaction, s, &accepted, now_ms).await
        }
        LogEvent::EventReadinessChanged(changed) if changed.state == "ready" => {
            // The acceptance is earlier in the log, on the event's own stream.
            let accepted = crate::workers::webhooks::enqueue::accepted_event(transaction, &changed.id).await?;
            let Some(accepted) = accepted.filter(|accepted| !accepted.contact_id.is_empty()) else { return Ok(()) };
            performed(transaction, s, &accepted, now_ms).await
        }
        _ => Ok(()),
    }
}

/// Records that the event's contact performed it, and evaluates the contact again.
async fn performed(
    transaction: &Transaction<'_>,
    s: &str,
    accepted: &shared::proto::EventAccepted,
    now_ms: i64,
) -> anyhow::Result<()> {
    let statement = transaction
        .prepare_cached(&format!(
            "INSERT INTO {s}.contact_events (contact_id, event_id, schema_id, occurred_at_ms) VALUES ($1, $2, $3, $4)
             ON CONFLICT DO NOTHING"
        ))
        .await?;
    transaction
        .execute(&statement, &[&accepted.contact_id, &accepted.id, &accepted.schema_id, &accepted.occurred_at_ms])
        .await?;
    evaluate_contact(transaction, s, &accepted.space_id, &accepted.contact_id, now_ms).await
}

/// Keeps a contact's record document (and its schema, which the broadcast engine's consent
/// check reads); `(space, schema, contact)`.
async fn store_document(
    transaction: &Transaction<'_>,
    s: &str,
    (space_id, schema_id, contact_id): (&str, &str, &str),
    document: &Value,
) -> anyhow::Result<()> {
    let statement = transaction
        .prepare_cached(&format!(
            "INSERT INTO {s}.contacts (contact_id, space_id, schema_id, doc) VALUES ($1, $2, $3, $4)
             ON CONFLICT (contact_id) DO UPDATE SET schema_id = EXCLUDED.schema_id, doc = EXCLUDED.doc"
        ))
        .await?;
    transaction.execute(&statement, &[&contact_id, &space_id, &schema_id, document]).await?;
    Ok(())
}

/// A contact as filters read it.
struct Contact {
    /// The record document with `subscriptions` set to the topic states.
    document: Value,
    /// Event times by event schema id.
    events: HashMap<String, Vec<i64>>,
}

impl Contact {
    fn new(mut document: Value, subscriptions: Value, events: HashMap<String, Vec<i64>>) -> Self {
        if let Value::Object(fields) = &mut document {
            fields.insert(SUBSCRIPTIONS.to_owned(), subscriptions);
        }
        Self { document, events }
    }

    fn facts(&self, now_ms: i64) -> Facts<'_> {
        Facts { document: &self.document, events: &self.events, now_ms }
    }
}

/// Parsed filters by segment id: a segment's filter never changes, so each is parsed once per
/// process (a deleted segment's entry is only never asked for again).
static FILTERS: std::sync::LazyLock<std::sync::Mutex<HashMap<String, Arc<Filter>>>> =
    std::sync::LazyLock::new(Default::default);

/// The segments of a space (or the one named), with their filters.
async fn segments(
    transaction: &Transaction<'_>,
    s: &str,
    space_id: &str,
    only: Option<&str>,
) -> anyhow::Result<Vec<(String, Arc<Filter>)>> {
    let statement = transaction
        .prepare_cached(&format!(
            "SELECT segment_id, filter FROM {s}.segments WHERE space_id = $1 AND ($2::text IS NULL OR segment_id = $2)"
        ))
        .await?;
    let rows = transaction.query(&statement, &[&space_id, &only]).await?;
    let mut cache = FILTERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    rows.into_iter()
        .map(|row| {
            let id: String = row.get(0);
            if let Some(filter) = cache.get(&id) {
                return Ok((id, Arc::clone(filter)));
            }
            let filter = Arc::new(
                shared::filter::from_json(&row.get::<_, Value>(1))
                    .with_context(|| format!("the stored filter of segment {id}"))?,
            );
            cache.insert(id.clone(), Arc::clone(&filter));
            Ok((id, filter))
        })
        .collect()
}

/// The event times of `contact_ids`, by contact and event schema.
async fn event_times(
    transaction: &Transaction<'_>,
    s: &str,
    contact_ids: &[String],
) -> anyhow::Result<HashMap<String, HashMap<String, Vec<i64>>>> {
    let statement = transaction
        .prepare_cached(&format!(
            "SELECT contact_id, schema_id, array_agg(occurred_at_ms ORDER BY occurred_at_ms)
             FROM {s}.contact_events WHERE contact_id = ANY($1) GROUP BY contact_id, schema_id"
        ))
        .await?;
    let mut times: HashMap<String, HashMap<String, Vec<i64>>> = HashMap::new();
    for row in transaction.query(&statement, &[&contact_ids]).await? {
        times.entry(row.get(0)).or_default().insert(row.get(1), row.get(2));
    }
    Ok(times)
}

/// Evaluates one contact against every segment of its space as of `now_ms`.
async fn evaluate_contact(
    transaction: &Transaction<'_>,
    s: &str,
    space_id: &str,
    contact_id: &str,
    now_ms: i64,
) -> anyhow::Result<()> {
    let segments = segments(transaction, s, space_id, None).await?;
    if segments.is_empty() {
        return Ok(());
    }
    let statement = transaction
        .prepare_cached(&format!("SELECT doc, subscriptions FROM {s}.contacts WHERE contact_id = $1"))
        .await?;
    let row = transaction.query_opt(&statement, &[&contact_id]).await?;
    let Some((Some(document), subscriptions)) = row.map(|row| (row.get::<_, Option<Value>>(0), row.get(1))) else {
        // Subscriptions or events of a contact whose record is not (or no longer) here.
        return Ok(());
    };
    let mut events = event_times(transaction, s, &[contact_id.to_owned()]).await?;
    let contact = Contact::new(document, subscriptions, events.remove(contact_id).unwrap_or_default());
    let facts = contact.facts(now_ms);
    let mut joined = Vec::new();
    let mut left = Vec::new();
    let mut next_change: Option<i64> = None;
    for (segment_id, filter) in &segments {
        if shared::filter::matches_facts(filter, &facts) {
            joined.push(segment_id.clone());
        } else {
            left.push(segment_id.clone());
        }
        next_change = earliest(next_change, shared::filter::next_change_ms(filter, &facts));
    }
    let contacts = vec![contact_id.to_owned()];
    if !joined.is_empty() {
        let segment_ids = joined;
        let contact_ids = vec![contact_id.to_owned(); segment_ids.len()];
        join(transaction, s, &segment_ids, &contact_ids, now_ms).await?;
    }
    if !left.is_empty() {
        let contact_ids = vec![contact_id.to_owned(); left.len()];
        leave(transaction, s, &left, &contact_ids).await?;
    }
    schedule_windows(transaction, space_id, &contacts, next_change).await
}

/// Evaluates a new segment against every contact of its space, a page at a time.
async fn evaluate_space(
    transaction: &Transaction<'_>,
    s: &str,
    space_id: &str,
    segment_id: &str,
    now_ms: i64,
) -> anyhow::Result<()> {
    let Some((_, filter)) = segments(transaction, s, space_id, Some(segment_id)).await?.pop() else { return Ok(()) };
    let statement = transaction
        .prepare_cached(&format!(
            "SELECT contact_id, doc, subscriptions FROM {s}.contacts
             WHERE space_id = $1 AND contact_id > $2 AND doc IS NOT NULL ORDER BY contact_id LIMIT $3"
        ))
        .await?;
    let mut after = String::new();
    loop {
        let rows = transaction.query(&statement, &[&space_id, &after, &PAGE]).await?;
        let Some(last) = rows.last().map(|row| row.get::<_, String>(0)) else { break };
        let ids: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
        let needs_events = !shared::filter::performed_parts(&filter).is_empty();
        let mut times = if needs_events { event_times(transaction, s, &ids).await? } else { HashMap::new() };
        let mut members = Vec::new();
        // Contacts by the earliest moment a window of this segment changes for them.
        let mut windows: BTreeMap<i64, Vec<String>> = BTreeMap::new();
        for row in rows {
            let contact_id: String = row.get(0);
            let events = times.remove(&contact_id).unwrap_or_default();
            let contact = Contact::new(row.get(1), row.get(2), events);
            let facts = contact.facts(now_ms);
            if shared::filter::matches_facts(&filter, &facts) {
                members.push(contact_id.clone());
            }
            if let Some(at) = shared::filter::next_change_ms(&filter, &facts) {
                windows.entry(at).or_default().push(contact_id);
            }
        }
        if !members.is_empty() {
            let segment_ids = vec![segment_id.to_owned(); members.len()];
            join(transaction, s, &segment_ids, &members, now_ms).await?;
        }
        for (at, contacts) in windows {
            schedule_windows(transaction, space_id, &contacts, Some(at)).await?;
        }
        after = last;
    }
    Ok(())
}

fn earliest(left: Option<i64>, right: Option<i64>) -> Option<i64> {
    match (left, right) {
        (Some(left), Some(right)) => Some(left.min(right)),
        (left, right) => left.or(right),
    }
}

/// Adds memberships (pairs of `segment_ids[i]`, `contact_ids[i]`) that are not there yet, and
/// counts them.
async fn join(
    transaction: &Transaction<'_>,
    s: &str,
    segment_ids: &[String],
    contact_ids: &[String],
    now_ms: i64,
) -> anyhow::Result<()> {
    let statement = transaction
        .prepare_cached(&format!(
            "WITH added AS (
                 INSERT INTO {s}.members (segment_id, contact_id, joined_at)
                 SELECT segment_id, contact_id, $3 FROM unnest($1::text[], $2::text[]) AS m(segment_id, contact_id)
                 ON CONFLICT DO NOTHING RETURNING segment_id),
             counted AS (SELECT segment_id, count(*) AS n FROM added GROUP BY segment_id)
             UPDATE {s}.segments g SET member_count = g.member_count + counted.n FROM counted
             WHERE g.segment_id = counted.segment_id"
        ))
        .await?;
    transaction.execute(&statement, &[&segment_ids, &contact_ids, &from_millis(now_ms)]).await?;
    Ok(())
}

/// Removes memberships that are there, and counts them.
async fn leave(
    transaction: &Transaction<'_>,
    s: &str,
    segment_ids: &[String],
    contact_ids: &[String],
) -> anyhow::Result<()> {
    let statement = transaction
        .prepare_cached(&format!(
            "WITH gone AS (
                 DELETE FROM {s}.members m USING unnest($1::text[], $2::text[]) AS l(segment_id, contact_id)
                 WHERE m.segment_id = l.segment_id AND m.contact_id = l.contact_id RETURNING m.segment_id),
             counted AS (SELECT segment_id, count(*) AS n FROM gone GROUP BY segment_id)
             UPDATE {s}.segments g SET member_count = g.member_count - counted.n FROM counted
             WHERE g.segment_id = counted.segment_id"
        ))
        .await?;
    transaction.execute(&statement, &[&segment_ids, &contact_ids]).await?;
    Ok(())
}

/// Schedules the window timer of each contact for `at` (keeping an earlier one). A timer
/// that comes early, or is scheduled by a version being rebuilt, only evaluates the contact
/// again: harmless.
async fn schedule_windows(
    transaction: &Transaction<'_>,
    space_id: &str,
    contact_ids: &[String],
    at: Option<i64>,
) -> anyhow::Result<()> {
    let Some(at) = at else { return Ok(()) };
    let unique: BTreeSet<&String> = contact_ids.iter().collect();
    let payloads: Vec<Value> = unique
        .iter()
        .map(|contact_id| {
            Value::Object(Map::from_iter([
                ("spaceId".to_owned(), json!(space_id)),
                ("contactId".to_owned(), json!(contact_id)),
            ]))
        })
        .collect();
    let keys: Vec<&String> = unique.into_iter().collect();
    crate::timers::schedule_earliest(transaction, WINDOW_TIMER, &keys, from_millis(at), &payloads).await?;
    Ok(())
}

read_model! {
    /// Segments and their membership.
    Segments = "segments", each
}
