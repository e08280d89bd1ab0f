//! The emails read model: each email's story (`domain::email::story`), for `GET
//! /emails/{id}` and a contact's list of emails (`GET /emails?contactId=`, with the number of
//! each contact's emails kept beside them). One row per email, folded from its stream;
//! each row keeps the log position it has applied, so an event is never folded twice. A
//! contact's rows go when its deletion is requested, like its record.
//!
//! Each row also keeps what the delivery log filters and shows beside the story: its status,
//! the broadcast run or the workflow and step that sent it, whether a person opened it,
//! clicked in it or unsubscribed through it, and the address it was sent (or refused) to
//! (opened with the contact's key from the sealed content when it is scheduled, or from the
//! sealed recipient of a send refused before it was rendered; none once the contact is
//! erased).
//!
//! Beside the stories, the counts of each broadcast run and each workflow send step
//! (`email_counts`): every event adds the difference it makes to its email's tally
//! (`story::Tally`), so an email counts once per fact. Counts hold no personal data and stay
//! when a contact is erased.
//!
//! And the clicks of each link of those buckets (`link_counts`), by the experiment variant
//! that sent the email (and whether in the test or as the winner) and the link's position
//! among its tracked links: every click, and
//! the link's first click in an email (its unique clickers), a person's and a machine's
//! apart. No target is kept: `GET /broadcasts/{id}/runs/{runId}/links` opens one clicker's
//! from the log to name the link.

use std::collections::BTreeMap;

use deadpool_postgres::Transaction;
use domain::email::story::{self, Story, Tally};
use platform::events::LogEvent;
use platform::log::StoredEvent;

pub(super) const DDL: &str = "
CREATE TABLE {s}.emails (
    email_id text PRIMARY KEY,
    space_id text NOT NULL,
    contact_id text NOT NULL,
    scheduled_at timestamptz NOT NULL,
    position bigint NOT NULL,
    doc jsonb NOT NULL,
    status text NOT NULL,
    address text,
    broadcast_run_id text,
    workflow_id text,
    step_id text,
    opened boolean NOT NULL,
    clicked boolean NOT NULL,
    unsubscribed boolean NOT NULL
);
CREATE INDEX ON {s}.emails (contact_id, scheduled_at DESC, email_id DESC);
CREATE INDEX ON {s}.emails (space_id, scheduled_at DESC, email_id DESC);
CREATE INDEX ON {s}.emails (broadcast_run_id, scheduled_at DESC, email_id DESC) WHERE broadcast_run_id IS NOT NULL;
CREATE INDEX ON {s}.emails (workflow_id, step_id, scheduled_at DESC, email_id DESC) WHERE workflow_id IS NOT NULL;
CREATE TABLE {s}.contact_email_counts (
    contact_id text PRIMARY KEY,
    space_id text NOT NULL,
    total bigint NOT NULL
);
CREATE TABLE {s}.email_counts (
    bucket_kind text NOT NULL,
    bucket_id text NOT NULL,
    space_id text NOT NULL,
    scheduled bigint NOT NULL DEFAULT 0,
    sent bigint NOT NULL DEFAULT 0,
    failed bigint NOT NULL DEFAULT 0,
    outcome_unknown bigint NOT NULL DEFAULT 0,
    bounced bigint NOT NULL DEFAULT 0,
    complained bigint NOT NULL DEFAULT 0,
    unsubscribed bigint NOT NULL DEFAULT 0,
    opened bigint NOT NULL DEFAULT 0,
    clicked bigint NOT NULL DEFAULT 0,
    held bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (bucket_kind, bucket_id)
);
";

/// The per-link counts, added after the read model's first release.
const ADDITIONS: &str = "
CREATE TABLE IF NOT EXISTS {s}.link_counts (
    bucket_kind text NOT NULL,
    bucket_id text NOT NULL,
    variant text NOT NULL,
    cohort text NOT NULL,
    position integer NOT NULL,
    space_id text NOT NULL,
    clicks bigint NOT NULL,
    clickers bigint NOT NULL,
    machine_clicks bigint NOT NULL,
    machine_clickers bigint NOT NULL,
    PRIMARY KEY (bucket_kind, bucket_id, variant, cohort, position)
);
";

pub(super) const EVENT_TYPES: &[&str] = &[
    "EmailScheduled.v1",
    "EmailSent.v1",
    "EmailFailed.v1",
    "EmailOutcomeUnknown.v1",
    "EmailBounced.v1",
    "EmailComplained.v1",
    "EmailUnsubscribed.v1",
    "EmailOpened.v1",
    "EmailClicked.v1",
    "EmailSkipped.v1",
    "EmailHeld.v1",
    "EmailReleased.v1",
    "RecordDeletionRequested.v1",
];

/// A row being folded: the story, its space and the position it has applied, and the address
/// opened from its `EmailScheduled` in this batch.
struct Row {
    story: Story,
    space_id: String,
    position: i64,
    changed: bool,
    address: Option<String>,
}

pub(super) async fn apply(transaction: &Transaction<'_>, s: &str, events: &[StoredEvent]) -> anyhow::Result<()> {
    let mut decoded = Vec::with_capacity(events.len());
    for stored in events {
        decoded.push((stored, stored.decode()?));
    }
    let wanted: Vec<String> =
        decoded.iter().filter_map(|(_, event)| event.email_id()).map(str::to_owned).collect::<Vec<_>>();
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    // The batch's statements find their rows by key, given arrays of them: the read model is
    // keyed (`ReadModel::keyed`).
    if !wanted.is_empty() {
        let statement = transaction
            .prepare_cached(&format!(
                "SELECT email_id, space_id, position, doc FROM {s}.emails WHERE email_id = ANY($1)"
            ))
            .await?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&wanted];
        for row in transaction.query(&statement, &params).await? {
            let story: Story = serde_json::from_value(row.get(3))?;
            let row = Row { story, space_id: row.get(1), position: row.get(2), changed: false, address: None };
            rows.insert(row.story.id.clone(), row);
        }
    }
    // The addresses of the emails scheduled or refused in this batch, opened with their
    // contacts' keys.
    let scheduled_contacts: Vec<String> = decoded
        .iter()
        .filter_map(|(_, event)| match event {
            LogEvent::EmailScheduled(scheduled) => Some(scheduled.contact_id.clone()),
            LogEvent::EmailSkipped(skipped) if skipped.recipient.is_some() => Some(skipped.contact_id.clone()),
            _ => None,
        })
        .collect();
    let keys = if scheduled_contacts.is_empty() {
        platform::crypto::Keys::default()
    } else {
        platform::crypto::load_keys(transaction, &scheduled_contacts).await?
    };
    let mut erased: Vec<String> = Vec::new();
    let mut counts: Counts = BTreeMap::new();
    let mut links: LinkCounts = BTreeMap::new();
    for (stored, event) in &decoded {
        if let LogEvent::RecordDeletionRequested(requested) = event {
            erased.push(requested.record_id.clone());
            rows.retain(|_, row| row.story.contact_id != requested.record_id);
            continue;
        }
        let Some(email_id) = event.email_id() else { continue };
        let current = rows.remove(email_id);
        if current.as_ref().is_some_and(|row| row.position >= stored.position) {
            rows.extend(current.map(|row| (email_id.to_owned(), row)));
            continue;
        }
        let space_id = match (&current, event) {
            (_, LogEvent::EmailScheduled(scheduled)) => scheduled.space_id.clone(),
            (_, LogEvent::EmailSkipped(skipped)) => skipped.space_id.clone(),
            (Some(row), _) => row.space_id.clone(),
            (None, _) => continue,
        };
        let before = Tally::of(current.as_ref().map(|row| &row.story));
        let address = match event {
            LogEvent::EmailScheduled(scheduled) => {
                let content: Option<platform::proto::EmailContent> =
                    platform::events::open(scheduled.content.as_ref(), &keys)?;
                content.map(|content| content.to_address)
            }
            LogEvent::EmailSkipped(skipped) if skipped.recipient.is_some() => {
                let recipient: Option<platform::proto::EmailRecipient> =
                    platform::events::open(skipped.recipient.as_ref(), &keys)?;
                recipient.map(|recipient| recipient.address)
            }
            _ => current.as_ref().and_then(|row| row.address.clone()),
        };
        if let Some(story) = story::apply(current.map(|row| row.story), event) {
            if let Some(bucket) = story::bucket(&story) {
                let delta = Tally::of(Some(&story)).minus(&before);
                if let LogEvent::EmailClicked(clicked) = event
                    && clicked.link_position > 0
                {
                    let text = |key: &str| story.origin[key].as_str().unwrap_or_default().to_owned();
                    let key =
                        (bucket.0, bucket.1.clone(), text("variant"), text("cohort"), clicked.link_position as i32);
                    let sum = links.entry(key).or_insert_with(|| (space_id.clone(), [0; 4]));
                    let person = usize::from(!clicked.machine.is_empty()) * 2;
                    sum.1[person] += 1;
                    sum.1[person + 1] += i64::from(clicked.first);
                }
                let sum = counts.entry(bucket).or_insert_with(|| (space_id.clone(), [0; 10]));
                for (total, change) in sum.1.iter_mut().zip(delta) {
                    *total += change;
                }
            }
            rows.insert(
                email_id.to_owned(),
                Row { story, space_id, position: stored.position, changed: true, address },
            );
        }
    }
    write_counts(transaction, s, &counts).await?;
    write_link_counts(transaction, s, &links).await?;
    let changed: Vec<&Row> = rows.values().filter(|row| row.changed).collect();
    if !changed.is_empty() {
        let ids: Vec<&str> = changed.iter().map(|row| row.story.id.as_str()).collect();
        let spaces: Vec<&str> = changed.iter().map(|row| row.space_id.as_str()).collect();
        let contacts: Vec<&str> = changed.iter().map(|row| row.story.contact_id.as_str()).collect();
        let at: Vec<&str> = changed.iter().map(|row| row.story.scheduled_at.as_str()).collect();
        let positions: Vec<i64> = changed.iter().map(|row| row.position).collect();
        let docs = changed.iter().map(|row| serde_json::to_value(&row.story)).collect::<Result<Vec<_>, _>>()?;
        let columns: Vec<Columns> = changed.iter().map(|row| Columns::of(&row.story)).collect();
        let statuses: Vec<&str> = changed.iter().map(|row| row.story.status.as_str()).collect();
        let addresses: Vec<Option<&str>> = changed.iter().map(|row| row.address.as_deref()).collect();
        let runs: Vec<Option<&str>> = columns.iter().map(|c| c.broadcast_run_id).collect();
        let workflows: Vec<Option<&str>> = columns.iter().map(|c| c.workflow_id).collect();
        let steps: Vec<Option<&str>> = columns.iter().map(|c| c.step_id).collect();
        let opened: Vec<bool> = changed.iter().map(|row| row.story.engagement.human_opens > 0).collect();
        let clicked: Vec<bool> = changed.iter().map(|row| row.story.engagement.human_clicks > 0).collect();
        let unsubscribed: Vec<bool> = changed.iter().map(|row| row.story.unsubscribed).collect();
        let statement = transaction
            .prepare_cached(&format!(
                "WITH written AS (
                     INSERT INTO {s}.emails (email_id, space_id, contact_id, scheduled_at, position, doc, status,
                                             address, broadcast_run_id, workflow_id, step_id, opened, clicked,
                                             unsubscribed)
                     SELECT *
                     FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::bigint[], $6::jsonb[],
                                 $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::bool[],
                                 $13::bool[], $14::bool[])
                     ON CONFLICT (email_id) DO UPDATE SET position = EXCLUDED.position, doc = EXCLUDED.doc,
                         status = EXCLUDED.status, address = COALESCE(EXCLUDED.address, emails.address),
                         opened = EXCLUDED.opened, clicked = EXCLUDED.clicked, unsubscribed = EXCLUDED.unsubscribed
                     RETURNING contact_id, space_id, (xmax = 0) AS inserted)
                 INSERT INTO {s}.contact_email_counts (contact_id, space_id, total)
                 SELECT contact_id, space_id, count(*) FROM written WHERE inserted GROUP BY contact_id, space_id
                 ON CONFLICT (contact_id) DO UPDATE SET total = contact_email_counts.total + EXCLUDED.total"
            ))
            .await?;
        let at = at
            .iter()
            .map(|at| chrono::DateTime::parse_from_rfc3339(at).map(|at| at.with_timezone(&chrono::Utc)))
            .collect::<Result<Vec<_>, _>>()?;
        transaction
            .execute(
                &statement,
                &[
                    &ids,
                    &spaces,
                    &contacts,
                    &at,
                    &positions,
                    &docs,
                    &statuses,
                    &addresses,
                    &runs,
                    &workflows,
                    &steps,
                    &opened,
                    &clicked,
                    &unsubscribed,
                ],
            )
            .await?;
    }
    if !erased.is_empty() {
        let statement = transaction
            .prepare_cached(&format!(
                "WITH emails AS (DELETE FROM {s}.emails WHERE contact_id = ANY($1))
                 DELETE FROM {s}.contact_email_counts WHERE contact_id = ANY($1)"
            ))
            .await?;
        transaction.execute(&statement, &[&erased]).await?;
    }
    Ok(())
}

/// What sent a story, as the delivery log filters it.
struct Columns<'a> {
    broadcast_run_id: Option<&'a str>,
    workflow_id: Option<&'a str>,
    step_id: Option<&'a str>,
}

impl<'a> Columns<'a> {
    fn of(story: &'a Story) -> Self {
        let text = |key: &str| story.origin[key].as_str().filter(|text| !text.is_empty());
        match text("type") {
            Some("broadcast") => Self { broadcast_run_id: text("broadcastRunId"), workflow_id: None, step_id: None },
            Some("workflow") => {
                Self { broadcast_run_id: None, workflow_id: text("workflowId"), step_id: text("stepId") }
            }
            _ => Self { broadcast_run_id: None, workflow_id: None, step_id: None },
        }
    }
}

/// Changes to the counts of each bucket: (kind, id) → (space, a change per `Tally` field).
type Counts = BTreeMap<(&'static str, String), (String, [i64; 10])>;

/// Adds the batch's changes to the counts, one statement for all buckets.
async fn write_counts(transaction: &Transaction<'_>, s: &str, counts: &Counts) -> anyhow::Result<()> {
    let changed: Vec<_> = counts.iter().filter(|(_, (_, delta))| delta.iter().any(|change| *change != 0)).collect();
    if changed.is_empty() {
        return Ok(());
    }
    let kinds: Vec<&str> = changed.iter().map(|((kind, _), _)| *kind).collect();
    let ids: Vec<&str> = changed.iter().map(|((_, id), _)| id.as_str()).collect();
    let spaces: Vec<&str> = changed.iter().map(|(_, (space, _))| space.as_str()).collect();
    let column = |field: usize| -> Vec<i64> { changed.iter().map(|(_, (_, delta))| delta[field]).collect() };
    let columns: Vec<Vec<i64>> = (0..Tally::FIELDS.len()).map(column).collect();
    let fields = Tally::FIELDS.join(", ");
    let updates = Tally::FIELDS
        .iter()
        .map(|field| format!("{field} = email_counts.{field} + EXCLUDED.{field}"))
        .collect::<Vec<_>>();
    let statement = transaction
        .prepare_cached(&format!(
            "INSERT INTO {s}.email_counts (bucket_kind, bucket_id, space_id, {fields})
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], {})
             ON CONFLICT (bucket_kind, bucket_id) DO UPDATE SET {}",
            (4..4 + Tally::FIELDS.len()).map(|n| format!("${n}::bigint[]")).collect::<Vec<_>>().join(", "),
            updates.join(", ")
        ))
        .await?;
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&kinds, &ids, &spaces];
    params.extend(columns.iter().map(|column| column as &(dyn tokio_postgres::types::ToSql + Sync)));
    transaction.execute(&statement, &params).await?;
    Ok(())
}

/// Changes to the clicks of each link: (kind, id, variant, cohort, position) → (space,
/// [clicks, clickers, machine clicks, machine clickers]).
type LinkCounts = BTreeMap<(&'static str, String, String, String, i32), (String, [i64; 4])>;

/// Adds the batch's clicks to the links' counts, one statement for all links.
async fn write_link_counts(transaction: &Transaction<'_>, s: &str, links: &LinkCounts) -> anyhow::Result<()> {
    if links.is_empty() {
        return Ok(());
    }
    let kinds: Vec<&str> = links.keys().map(|key| key.0).collect();
    let ids: Vec<&str> = links.keys().map(|key| key.1.as_str()).collect();
    let variants: Vec<&str> = links.keys().map(|key| key.2.as_str()).collect();
    let cohorts: Vec<&str> = links.keys().map(|key| key.3.as_str()).collect();
    let positions: Vec<i32> = links.keys().map(|key| key.4).collect();
    let spaces: Vec<&str> = links.values().map(|(space, _)| space.as_str()).collect();
    let column = |field: usize| -> Vec<i64> { links.values().map(|(_, delta)| delta[field]).collect() };
    let statement = transaction
        .prepare_cached(&format!(
            "INSERT INTO {s}.link_counts (bucket_kind, bucket_id, variant, cohort, position, space_id, clicks,
                                          clickers, machine_clicks, machine_clickers)
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::text[],
                                  $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[])
             ON CONFLICT (bucket_kind, bucket_id, variant, cohort, position) DO UPDATE SET
                 clicks = link_counts.clicks + EXCLUDED.clicks,
                 clickers = link_counts.clickers + EXCLUDED.clickers,
                 machine_clicks = link_counts.machine_clicks + EXCLUDED.machine_clicks,
                 machine_clickers = link_counts.machine_clickers + EXCLUDED.machine_clickers"
        ))
        .await?;
    let (clicks, clickers, machine_clicks, machine_clickers) = (column(0), column(1), column(2), column(3));
    transaction
        .execute(
            &statement,
            &[
                &kinds,
                &ids,
                &variants,
                &cohorts,
                &positions,
                &spaces,
                &clicks,
                &clickers,
                &machine_clicks,
                &machine_clickers,
            ],
        )
        .await?;
    Ok(())
}

read_model! {
    /// Each email's story.
    Emails = "emails", batch, additions = ADDITIONS, keyed = true
}
