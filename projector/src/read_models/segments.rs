//! The segments read model: each segment of a space as the API shows it, and its membership,
//! maintained incrementally. A contact is evaluated again only when something about it changes
//! (its record, a topic subscription, an event it performed, an email it opened or clicked, a
//! time window of a `performed`, `opened` or `clicked` condition opening or closing), against the segments of its space; a new segment is
//! evaluated once against the space's contacts. Nothing scans every contact per request.
//!
//! To evaluate, the model keeps its own copy of what filters read: each contact's document
//! with its subscriptions, the times of the events it performed, and its opens and clicks
//! (with what sent the email, and a click's target opened from its seal). Membership at a log event
//! is evaluated as of that event's recording time, so a rebuild from the log gives the same
//! membership. A `performed ... in the last` window that opens or closes with no new event is
//! brought into the log by the `segment_windows` timer, which this model schedules for the
//! earliest such moment of each contact (see `workers/segments.rs`, "Segments").

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use anyhow::Context;
use deadpool_postgres::Transaction;
use filter::{Engagement, Facts, Filter, SUBSCRIPTIONS};
use platform::events::LogEvent;
use platform::log::StoredEvent;
use platform::time::from_millis;
use serde_json::{Map, Value, json};

/// The timer kind that re-evaluates a contact when a window opens or closes.
pub(crate) const WINDOW_TIMER: &str = "segment_windows";

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
CREATE TABLE {s}.contact_engagement (
    contact_id text NOT NULL,
    position bigint NOT NULL,
    opened boolean NOT NULL,
    at_ms bigint NOT NULL,
    machine boolean NOT NULL,
    template_id text NOT NULL,
    broadcast_id text NOT NULL,
    workflow_id text NOT NULL,
    step_id text NOT NULL,
    -- A click's `ClickedLink` as the log seals it: the target is read only while evaluating.
    link bytea NOT NULL,
    PRIMARY KEY (contact_id, position)
);
CREATE TABLE {s}.members (
    segment_id text NOT NULL,
    contact_id text NOT NULL,
    joined_at timestamptz NOT NULL,
    PRIMARY KEY (segment_id, contact_id)
);
CREATE INDEX ON {s}.members (contact_id);
CREATE TABLE {s}.entries (
    segment_id text NOT NULL,
    position bigint NOT NULL,
    contact_id text NOT NULL,
    PRIMARY KEY (segment_id, position, contact_id)
);
CREATE INDEX ON {s}.entries (contact_id);
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
    "EmailOpened.v1",
    "EmailClicked.v1",
];

/// What a batch changes, gathered in log order before anything is written.
#[derive(Default)]
struct Batch {
    /// New segments: (event, its time, its position).
    created: Vec<(platform::proto::SegmentCreated, i64, i64)>,
    deleted_segments: Vec<String>,
    /// The last document of each contact written in the batch: (space, schema, document).
    documents: BTreeMap<String, (String, String, Value)>,
    /// Subscription changes per contact, merged in order: (space, topic → status).
    subscriptions: BTreeMap<String, (String, Map<String, Value>)>,
    /// Events performed: (contact, event id, event schema, occurred at).
    performed: Vec<(String, String, String, i64)>,
    /// Opens and clicks: (contact, log position, what filters read of it but a click's target,
    /// and that target as sealed in the log).
    engaged: Vec<(String, i64, Engagement, Vec<u8>)>,
    deleted_contacts: BTreeSet<String>,
    /// Contacts to evaluate again, with their space and the time and position of their last
    /// change.
    touched: BTreeMap<String, Touched>,
}

struct Touched {
    space_id: String,
    at_ms: i64,
    position: i64,
}

impl Batch {
    fn touch(&mut self, contact_id: &str, space_id: &str, at_ms: i64, position: i64) {
        let entry = self.touched.entry(contact_id.to_owned()).or_insert_with(|| Touched {
            space_id: space_id.to_owned(),
            at_ms,
            position,
        });
        entry.at_ms = entry.at_ms.max(at_ms);
        entry.position = entry.position.max(position);
    }
}

/// Applies a batch set-wise: the batch's changes are written first, then each contact it
/// touched is evaluated once against its space's segments, and each new segment once against
/// its space's other contacts. A pair of contact and segment is evaluated as of the later of
/// the contact's last change in the batch and the segment's creation, with the contact's
/// facts at the end of the batch: what evaluating event by event would have left, whatever
/// the batch boundaries, so a rebuild gives the same membership.
pub(super) async fn apply(transaction: &Transaction<'_>, s: &str, events: &[StoredEvent]) -> anyhow::Result<()> {
    let relevant: Vec<&StoredEvent> =
        events.iter().filter(|event| EVENT_TYPES.contains(&event.event_type.as_str())).collect();
    if relevant.is_empty() {
        return Ok(());
    }
    let subjects: Vec<String> = relevant.iter().filter_map(|event| event.subject_id.clone()).collect();
    // The batch's statements take arrays of the batch's contacts, segments and members, and
    // find their rows by key: the read model is keyed (`ReadModel::keyed`).
    let keys = platform::crypto::load_keys(transaction, &subjects).await?;
    let mut batch = Batch::default();
    for event in relevant {
        let now_ms = event.recorded_at.timestamp_millis();
        match event.decode()? {
            LogEvent::SegmentCreated(created) => batch.created.push((created, now_ms, event.position)),
            LogEvent::SegmentDeleted(deleted) => batch.deleted_segments.push(deleted.segment_id),
            LogEvent::SegmentWindowElapsed(elapsed) => {
                batch.touch(&elapsed.contact_id, &elapsed.space_id, elapsed.at_ms.max(now_ms), event.position);
            }
            LogEvent::RecordCreated(created) if created.schema_type == "contact" => {
                let document = domain::records::record_document(&created, &keys)?;
                batch.touch(&created.record_id, &created.space_id, now_ms, event.position);
                batch.documents.insert(created.record_id, (created.space_id, created.schema_id, document));
            }
            LogEvent::RecordUpdated(updated) if updated.schema_type == "contact" => {
                let document = domain::records::RecordState::from_updated(&updated, &keys)?.document();
                batch.touch(&updated.record_id, &updated.space_id, now_ms, event.position);
                batch.documents.insert(updated.record_id, (updated.space_id, updated.schema_id, document));
            }
            LogEvent::RecordDeletionRequested(requested) if requested.schema_type == "contact" => {
                batch.documents.remove(&requested.record_id);
                batch.subscriptions.remove(&requested.record_id);
                batch.touched.remove(&requested.record_id);
                batch.performed.retain(|(contact_id, ..)| *contact_id != requested.record_id);
                batch.engaged.retain(|(contact_id, ..)| *contact_id != requested.record_id);
                batch.deleted_contacts.insert(requested.record_id);
            }
            LogEvent::SubscriptionChanged(changed) => {
                batch.touch(&changed.contact_id, &changed.space_id, now_ms, event.position);
                let entry = batch
                    .subscriptions
                    .entry(changed.contact_id)
                    .or_insert_with(|| (changed.space_id.clone(), Map::new()));
                entry.1.insert(changed.topic_id, Value::String(changed.status));
            }
            LogEvent::EventAccepted(accepted) if accepted.readiness == "ready" && !accepted.contact_id.is_empty() => {
                batch.touch(&accepted.contact_id, &accepted.space_id, now_ms, event.position);
                batch.performed.push((accepted.contact_id, accepted.id, accepted.schema_id, accepted.occurred_at_ms));
            }
            LogEvent::EventReadinessChanged(changed) if changed.state == "ready" => {
                // The acceptance is earlier in the log, on the event's own stream.
                let accepted = reads::business_events::accepted(transaction, &changed.id).await?;
                if let Some(accepted) = accepted.filter(|accepted| !accepted.contact_id.is_empty()) {
                    batch.touch(&accepted.contact_id, &accepted.space_id, now_ms, event.position);
                    batch.performed.push((
                        accepted.contact_id,
                        accepted.id,
                        accepted.schema_id,
                        accepted.occurred_at_ms,
                    ));
                }
            }
            LogEvent::EmailOpened(opened) => {
                batch.touch(&opened.contact_id, &opened.space_id, now_ms, event.position);
                let engagement = engagement(opened.source.as_ref(), opened.at_ms, &opened.machine);
                let engagement = Engagement { opened: true, ..engagement };
                batch.engaged.push((opened.contact_id, event.position, engagement, Vec::new()));
            }
            LogEvent::EmailClicked(clicked) => {
                batch.touch(&clicked.contact_id, &clicked.space_id, now_ms, event.position);
                let engagement = engagement(clicked.source.as_ref(), clicked.at_ms, &clicked.machine);
                let link = clicked.link.as_ref().map(prost::Message::encode_to_vec).unwrap_or_default();
                batch.engaged.push((clicked.contact_id, event.position, engagement, link));
            }
            _ => {}
        }
    }
    write(transaction, s, &batch).await?;
    evaluate(transaction, s, &batch).await
}

/// What filters read of an open or a click (a click unless the caller says otherwise), but a
/// click's target.
fn engagement(source: Option<&platform::proto::EmailSource>, at_ms: i64, machine: &str) -> Engagement {
    let source = source.cloned().unwrap_or_default();
    let of = |origin: &str| if source.origin == origin { source.parent_id.clone() } else { String::new() };
    Engagement {
        opened: false,
        at_ms,
        machine: !machine.is_empty(),
        broadcast_id: of("broadcast"),
        workflow_id: of("workflow"),
        step_id: source.step_id.clone(),
        template_id: source.template_id,
        url: String::new(),
    }
}

/// Writes the batch's changes: segments, documents, subscriptions, events, deletions.
async fn write(transaction: &Transaction<'_>, s: &str, batch: &Batch) -> anyhow::Result<()> {
    for (created, ..) in &batch.created {
        let filter: Value = serde_json::from_str(&created.filter_json).context("a segment's filter")?;
        let doc = json!({
            "id": created.segment_id,
            "name": created.name,
            "definition": created.definition,
            "description": created.description,
            "createdAt": platform::time::format_millis(created.created_at_ms),
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
        transaction.execute(&statement, &[&created.segment_id, &created.space_id, &created_at, &filter, &doc]).await?;
    }
    if !batch.deleted_segments.is_empty() {
        let statement = transaction
            .prepare_cached(&format!(
                "WITH gone AS (DELETE FROM {s}.segments WHERE segment_id = ANY($1) RETURNING space_id),
                 members AS (DELETE FROM {s}.members WHERE segment_id = ANY($1)),
                 entries AS (DELETE FROM {s}.entries WHERE segment_id = ANY($1)),
                 counted AS (SELECT space_id, count(*) AS n FROM gone GROUP BY space_id)
                 UPDATE {s}.segment_counts c SET total = c.total - counted.n FROM counted WHERE c.space_id = counted.space_id"
            ))
            .await?;
        transaction.execute(&statement, &[&batch.deleted_segments]).await?;
    }
    if !batch.documents.is_empty() {
        let mut ids = Vec::new();
        let mut spaces = Vec::new();
        let mut schemas = Vec::new();
        let mut documents = Vec::new();
        for (contact_id, (space_id, schema_id, document)) in &batch.documents {
            ids.push(contact_id);
            spaces.push(space_id);
            schemas.push(schema_id);
            documents.push(document);
        }
        let statement = transaction
            .prepare_cached(&format!(
                "INSERT INTO {s}.contacts (contact_id, space_id, schema_id, doc)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[])
                 ON CONFLICT (contact_id) DO UPDATE SET schema_id = EXCLUDED.schema_id, doc = EXCLUDED.doc"
            ))
            .await?;
        transaction.execute(&statement, &[&ids, &spaces, &schemas, &documents]).await?;
    }
    if !batch.subscriptions.is_empty() {
        let mut ids = Vec::new();
        let mut spaces = Vec::new();
        let mut changes = Vec::new();
        for (contact_id, (space_id, topics)) in &batch.subscriptions {
            ids.push(contact_id);
            spaces.push(space_id);
            changes.push(Value::Object(topics.clone()));
        }
        let statement = transaction
            .prepare_cached(&format!(
                "INSERT INTO {s}.contacts (contact_id, space_id, subscriptions)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::jsonb[])
                 ON CONFLICT (contact_id) DO UPDATE SET subscriptions = contacts.subscriptions || EXCLUDED.subscriptions"
            ))
            .await?;
        transaction.execute(&statement, &[&ids, &spaces, &changes]).await?;
    }
    if !batch.performed.is_empty() {
        let mut contacts = Vec::new();
        let mut event_ids = Vec::new();
        let mut schemas = Vec::new();
        let mut occurred = Vec::new();
        for (contact_id, event_id, schema_id, at_ms) in &batch.performed {
            contacts.push(contact_id);
            event_ids.push(event_id);
            schemas.push(schema_id);
            occurred.push(*at_ms);
        }
        let statement = transaction
            .prepare_cached(&format!(
                "INSERT INTO {s}.contact_events (contact_id, event_id, schema_id, occurred_at_ms)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) ON CONFLICT DO NOTHING"
            ))
            .await?;
        transaction.execute(&statement, &[&contacts, &event_ids, &schemas, &occurred]).await?;
    }
    if !batch.engaged.is_empty() {
        write_engagement(transaction, s, &batch.engaged).await?;
    }
    if !batch.deleted_contacts.is_empty() {
        let deleted: Vec<&String> = batch.deleted_contacts.iter().collect();
        let statement = transaction
            .prepare_cached(&format!(
                "WITH gone AS (DELETE FROM {s}.members WHERE contact_id = ANY($1) RETURNING segment_id),
                 counted AS (SELECT segment_id, count(*) AS n FROM gone GROUP BY segment_id),
                 contact AS (DELETE FROM {s}.contacts WHERE contact_id = ANY($1)),
                 events AS (DELETE FROM {s}.contact_events WHERE contact_id = ANY($1)),
                 engagement AS (DELETE FROM {s}.contact_engagement WHERE contact_id = ANY($1)),
                 entries AS (DELETE FROM {s}.entries WHERE contact_id = ANY($1))
                 UPDATE {s}.segments g SET member_count = g.member_count - counted.n FROM counted
                 WHERE g.segment_id = counted.segment_id"
            ))
            .await?;
        transaction.execute(&statement, &[&deleted]).await?;
    }
    Ok(())
}

/// Stores opens and clicks of the contacts the model holds.
async fn write_engagement(
    transaction: &Transaction<'_>,
    s: &str,
    engaged: &[(String, i64, Engagement, Vec<u8>)],
) -> anyhow::Result<()> {
    let contacts: Vec<&str> = engaged.iter().map(|(contact_id, ..)| contact_id.as_str()).collect();
    let positions: Vec<i64> = engaged.iter().map(|(_, position, ..)| *position).collect();
    let column = |pick: fn(&Engagement) -> &str| -> Vec<&str> { engaged.iter().map(|(_, _, e, _)| pick(e)).collect() };
    let opened: Vec<bool> = engaged.iter().map(|(_, _, e, _)| e.opened).collect();
    let at_ms: Vec<i64> = engaged.iter().map(|(_, _, e, _)| e.at_ms).collect();
    let machine: Vec<bool> = engaged.iter().map(|(_, _, e, _)| e.machine).collect();
    let templates = column(|e| &e.template_id);
    let broadcasts = column(|e| &e.broadcast_id);
    let workflows = column(|e| &e.workflow_id);
    let steps = column(|e| &e.step_id);
    let links: Vec<&[u8]> = engaged.iter().map(|(.., link)| link.as_slice()).collect();
    let statement = transaction
        .prepare_cached(&format!(
            "INSERT INTO {s}.contact_engagement
                 (contact_id, position, opened, at_ms, machine, template_id, broadcast_id, workflow_id, step_id, link)
             SELECT e.* FROM unnest($1::text[], $2::bigint[], $3::bool[], $4::bigint[], $5::bool[], $6::text[],
                                    $7::text[], $8::text[], $9::text[], $10::bytea[])
                 AS e(contact_id, position, opened, at_ms, machine, template_id, broadcast_id, workflow_id, step_id, link)
             -- Only a contact the model holds: one whose deletion was requested keeps nothing.
             WHERE EXISTS (SELECT 1 FROM {s}.contacts c WHERE c.contact_id = e.contact_id)
             ON CONFLICT DO NOTHING"
        ))
        .await?;
    transaction
        .execute(
            &statement,
            &[&contacts, &positions, &opened, &at_ms, &machine, &templates, &broadcasts, &workflows, &steps, &links],
        )
        .await?;
    Ok(())
}

/// Memberships to add: segment, contact, the time and the log position of the join.
#[derive(Default)]
struct Joins {
    segment_ids: Vec<String>,
    contact_ids: Vec<String>,
    at: Vec<chrono::DateTime<chrono::Utc>>,
    positions: Vec<i64>,
}

/// Memberships to add and remove, and window timers to schedule, gathered across a batch.
#[derive(Default)]
struct Outcome {
    joins: Joins,
    leaves: (Vec<String>, Vec<String>),
    /// Contact → (space, the earliest moment a window changes for it).
    windows: BTreeMap<String, (String, i64)>,
}

impl Outcome {
    fn record(&mut self, segment_id: &str, contact_id: &str, member: bool, (at_ms, position): (i64, i64)) {
        if member {
            self.joins.segment_ids.push(segment_id.to_owned());
            self.joins.contact_ids.push(contact_id.to_owned());
            self.joins.at.push(from_millis(at_ms));
            self.joins.positions.push(position);
        } else {
            self.leaves.0.push(segment_id.to_owned());
            self.leaves.1.push(contact_id.to_owned());
        }
    }

    fn window(&mut self, contact_id: &str, space_id: &str, at_ms: Option<i64>) {
        if let Some(at_ms) = at_ms {
            let entry = self.windows.entry(contact_id.to_owned()).or_insert_with(|| (space_id.to_owned(), at_ms));
            entry.1 = entry.1.min(at_ms);
        }
    }

    async fn save(self, transaction: &Transaction<'_>, s: &str) -> anyhow::Result<()> {
        if !self.joins.segment_ids.is_empty() {
            join(transaction, s, &self.joins).await?;
        }
        if !self.leaves.0.is_empty() {
            leave(transaction, s, &self.leaves.0, &self.leaves.1).await?;
        }
        schedule_windows(transaction, &self.windows).await
    }
}

/// Evaluates what the batch touched: its contacts against their spaces' segments, and its new
/// segments against the rest of their spaces.
async fn evaluate(transaction: &Transaction<'_>, s: &str, batch: &Batch) -> anyhow::Result<()> {
    let created_at: HashMap<&str, (i64, i64)> = batch
        .created
        .iter()
        .map(|(created, at_ms, position)| (created.segment_id.as_str(), (*at_ms, *position)))
        .collect();
    let mut spaces: BTreeSet<&str> = batch.touched.values().map(|touched| touched.space_id.as_str()).collect();
    spaces.extend(batch.created.iter().map(|(created, ..)| created.space_id.as_str()));
    let by_space = segments_of(transaction, s, &spaces).await?;
    if by_space.is_empty() {
        return Ok(());
    }
    let mut outcome = Outcome::default();
    let touched: Vec<String> = batch
        .touched
        .iter()
        .filter(|(_, touched)| by_space.contains_key(&touched.space_id))
        .map(|(id, _)| id.clone())
        .collect();
    let links = reads_links(by_space.values().flatten().map(|(_, filter)| filter.as_ref()));
    for (contact_id, contact) in facts(transaction, s, &touched, links).await? {
        let Some(touched) = batch.touched.get(&contact_id) else { continue };
        let space_id = &touched.space_id;
        let mut next_change = None;
        for (segment_id, filter) in by_space.get(space_id).into_iter().flatten() {
            let (at_ms, position) = created_at.get(segment_id.as_str()).map_or(
                (touched.at_ms, touched.position),
                |(created_ms, created_position)| {
                    ((*created_ms).max(touched.at_ms), (*created_position).max(touched.position))
                },
            );
            let facts = contact.facts(at_ms);
            let member = filter::matches_facts(filter, &facts);
            outcome.record(segment_id, &contact_id, member, (at_ms, position));
            next_change = earliest(next_change, filter::next_change_ms(filter, &facts));
        }
        outcome.window(&contact_id, space_id, next_change);
    }
    outcome.save(transaction, s).await?;
    for (created, at_ms, position) in &batch.created {
        let Some((_, filter)) = by_space
            .get(&created.space_id)
            .and_then(|segments| segments.iter().find(|(segment_id, _)| *segment_id == created.segment_id))
        else {
            continue;
        };
        let segment = (created.space_id.as_str(), created.segment_id.as_str(), filter.as_ref());
        evaluate_space(transaction, s, segment, &batch.touched, (*at_ms, *position)).await?;
    }
    Ok(())
}

/// The contacts' facts as the batch left them (those with a document).
async fn facts(
    transaction: &Transaction<'_>,
    s: &str,
    contact_ids: &[String],
    links: bool,
) -> anyhow::Result<Vec<(String, Contact)>> {
    if contact_ids.is_empty() {
        return Ok(Vec::new());
    }
    let statement = transaction
        .prepare_cached(&format!(
            "SELECT contact_id, doc, subscriptions FROM {s}.contacts WHERE contact_id = ANY($1) AND doc IS NOT NULL"
        ))
        .await?;
    let rows = transaction.query(&statement, &[&contact_ids]).await?;
    let mut times = event_times(transaction, s, contact_ids).await?;
    let mut engagement = engagement_of(transaction, s, contact_ids, links).await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let contact_id: String = row.get(0);
            let events = times.remove(&contact_id).unwrap_or_default();
            let engagement = engagement.remove(&contact_id).unwrap_or_default();
            let contact = Contact::new(row.get(1), row.get(2), events, engagement);
            (contact_id, contact)
        })
        .collect())
}

/// A contact as filters read it.
struct Contact {
    /// The record document with `subscriptions` set to the topic states.
    document: Value,
    /// Event times by event schema id.
    events: HashMap<String, Vec<i64>>,
    /// Opens and clicks of its emails.
    engagement: Vec<Engagement>,
}

impl Contact {
    fn new(
        mut document: Value,
        subscriptions: Value,
        events: HashMap<String, Vec<i64>>,
        engagement: Vec<Engagement>,
    ) -> Self {
        if let Value::Object(fields) = &mut document {
            fields.insert(SUBSCRIPTIONS.to_owned(), subscriptions);
        }
        Self { document, events, engagement }
    }

    fn facts(&self, now_ms: i64) -> Facts<'_> {
        Facts { document: &self.document, events: &self.events, engagement: &self.engagement, now_ms }
    }
}

/// Parsed filters by segment id: a segment's filter never changes, so each is parsed once per
/// process (a deleted segment's entry is only never asked for again).
static FILTERS: std::sync::LazyLock<std::sync::Mutex<HashMap<String, Arc<Filter>>>> =
    std::sync::LazyLock::new(Default::default);

/// The segments of `spaces`, with their filters, by space.
async fn segments_of(
    transaction: &Transaction<'_>,
    s: &str,
    spaces: &BTreeSet<&str>,
) -> anyhow::Result<HashMap<String, Vec<(String, Arc<Filter>)>>> {
    if spaces.is_empty() {
        return Ok(HashMap::new());
    }
    let spaces: Vec<&str> = spaces.iter().copied().collect();
    let statement = transaction
        .prepare_cached(&format!("SELECT space_id, segment_id, filter FROM {s}.segments WHERE space_id = ANY($1)"))
        .await?;
    let rows = transaction.query(&statement, &[&spaces]).await?;
    let mut cache = FILTERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut by_space: HashMap<String, Vec<(String, Arc<Filter>)>> = HashMap::new();
    for row in rows {
        let id: String = row.get(1);
        let filter = match cache.get(&id) {
            Some(filter) => Arc::clone(filter),
            None => {
                let filter = Arc::new(
                    filter::from_json(&row.get::<_, Value>(2))
                        .with_context(|| format!("the stored filter of segment {id}"))?,
                );
                cache.insert(id.clone(), Arc::clone(&filter));
                filter
            }
        };
        by_space.entry(row.get(0)).or_default().push((id, filter));
    }
    Ok(by_space)
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

/// Whether some filter reads the targets of clicks (`clicked a link containing`).
fn reads_links<'a>(filters: impl IntoIterator<Item = &'a Filter>) -> bool {
    filters
        .into_iter()
        .any(|filter| filter::engaged_parts(filter).iter().any(|engaged| engaged.link_contains.is_some()))
}

/// The opens and clicks of `contact_ids`, by contact; with `links`, each click's target opened
/// from its seal (none once the contact's key is shredded).
async fn engagement_of(
    transaction: &Transaction<'_>,
    s: &str,
    contact_ids: &[String],
    links: bool,
) -> anyhow::Result<HashMap<String, Vec<Engagement>>> {
    let statement = transaction
        .prepare_cached(&format!(
            "SELECT contact_id, opened, at_ms, machine, template_id, broadcast_id, workflow_id, step_id,
                    CASE WHEN $2 THEN link ELSE ''::bytea END
             FROM {s}.contact_engagement WHERE contact_id = ANY($1) ORDER BY contact_id, position"
        ))
        .await?;
    let rows = transaction.query(&statement, &[&contact_ids, &links]).await?;
    let keys = if links { platform::crypto::load_keys(transaction, contact_ids).await? } else { Default::default() };
    let mut by_contact: HashMap<String, Vec<Engagement>> = HashMap::new();
    for row in rows {
        let link: &[u8] = row.get(8);
        let url = if link.is_empty() {
            String::new()
        } else {
            let sealed = <platform::proto::Sealed as prost::Message>::decode(link)?;
            let opened = platform::events::open::<platform::proto::ClickedLink>(Some(&sealed), &keys)?;
            opened.map(|link| link.url).unwrap_or_default()
        };
        by_contact.entry(row.get(0)).or_default().push(Engagement {
            opened: row.get(1),
            at_ms: row.get(2),
            machine: row.get(3),
            template_id: row.get(4),
            broadcast_id: row.get(5),
            workflow_id: row.get(6),
            step_id: row.get(7),
            url,
        });
    }
    Ok(by_contact)
}

/// Evaluates a new segment against every contact of its space that the batch did not touch
/// (those were evaluated with it already), a page at a time, as of its creation.
async fn evaluate_space(
    transaction: &Transaction<'_>,
    s: &str,
    (space_id, segment_id, filter): (&str, &str, &Filter),
    touched: &BTreeMap<String, Touched>,
    (at_ms, position): (i64, i64),
) -> anyhow::Result<()> {
    let statement = transaction
        .prepare_cached(&format!(
            "SELECT contact_id, doc, subscriptions FROM {s}.contacts
             WHERE space_id = $1 AND contact_id > $2 AND doc IS NOT NULL ORDER BY contact_id LIMIT $3"
        ))
        .await?;
    let needs_events = !filter::performed_parts(filter).is_empty();
    let needs_engagement = !filter::engaged_parts(filter).is_empty();
    let mut after = String::new();
    loop {
        let rows = transaction.query(&statement, &[&space_id, &after, &PAGE]).await?;
        let Some(last) = rows.last().map(|row| row.get::<_, String>(0)) else { break };
        let ids: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
        let mut times = if needs_events { event_times(transaction, s, &ids).await? } else { HashMap::new() };
        let mut engagement = if needs_engagement {
            engagement_of(transaction, s, &ids, reads_links([filter])).await?
        } else {
            HashMap::new()
        };
        let mut outcome = Outcome::default();
        for row in rows {
            let contact_id: String = row.get(0);
            if touched.contains_key(&contact_id) {
                continue;
            }
            let events = times.remove(&contact_id).unwrap_or_default();
            let engagement = engagement.remove(&contact_id).unwrap_or_default();
            let contact = Contact::new(row.get(1), row.get(2), events, engagement);
            let facts = contact.facts(at_ms);
            if filter::matches_facts(filter, &facts) {
                outcome.record(segment_id, &contact_id, true, (at_ms, position));
            }
            outcome.window(&contact_id, space_id, filter::next_change_ms(filter, &facts));
        }
        outcome.save(transaction, s).await?;
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

/// Adds the memberships of `joins` that are not there yet, counts them, and records each as
/// an entry at its position (what segment triggers of workflows follow).
async fn join(transaction: &Transaction<'_>, s: &str, joins: &Joins) -> anyhow::Result<()> {
    let statement = transaction
        .prepare_cached(&format!(
            "WITH joins AS (
                 SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::bigint[])
                     AS j(segment_id, contact_id, joined_at, position)),
             added AS (
                 INSERT INTO {s}.members (segment_id, contact_id, joined_at)
                 SELECT segment_id, contact_id, joined_at FROM joins
                 ON CONFLICT DO NOTHING RETURNING segment_id, contact_id),
             entered AS (
                 INSERT INTO {s}.entries (segment_id, position, contact_id)
                 SELECT j.segment_id, j.position, j.contact_id FROM joins j JOIN added a USING (segment_id, contact_id)
                 ON CONFLICT DO NOTHING),
             counted AS (SELECT segment_id, count(*) AS n FROM added GROUP BY segment_id)
             UPDATE {s}.segments g SET member_count = g.member_count + counted.n FROM counted
             WHERE g.segment_id = counted.segment_id"
        ))
        .await?;
    let Joins { segment_ids, contact_ids, at, positions } = joins;
    transaction.execute(&statement, &[segment_ids, contact_ids, at, positions]).await?;
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

/// Schedules each contact's window timer for its moment (keeping an earlier one), in one
/// statement. A timer that comes early, or is scheduled by a version being rebuilt, only
/// evaluates the contact again: harmless.
async fn schedule_windows(
    transaction: &Transaction<'_>,
    windows: &BTreeMap<String, (String, i64)>,
) -> anyhow::Result<()> {
    if windows.is_empty() {
        return Ok(());
    }
    let mut keys = Vec::new();
    let mut due = Vec::new();
    let mut payloads = Vec::new();
    for (contact_id, (space_id, at_ms)) in windows {
        keys.push(contact_id);
        due.push(from_millis(*at_ms));
        payloads.push(json!({"spaceId": space_id, "contactId": contact_id}));
    }
    crate::timers::schedule_earliest(transaction, WINDOW_TIMER, &keys, &due, &payloads).await?;
    Ok(())
}

read_model! {
    /// Segments and their membership.
    Segments = "segments", batch, keyed = true
}
