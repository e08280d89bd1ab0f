//! A dry run of a workflow against the log: what a definition (a draft, or a change to a live
//! journey) would have done over a past window of its space's log, decided by the engine's own
//! [`decide`] with the send decision and policy, with no effect anywhere.
//!
//! The replay reads the space's log from the first event recorded at or after the window's
//! start up to the log's head, in order, and plays what the engine's follower and engine would
//! have done, on a clock that is the log's: an event that became ready for a contact starts a
//! run of each of the definition's event triggers (under its re-entry rule, counting the
//! replay's own runs) and ends the `wait_for_event` steps waiting for it; a contact's entry
//! into a trigger's segment starts a run; a run the API requested of the same workflow starts
//! too; a contact's deletion ends its runs; a person's open or click of an email the replay
//! "sent" (the same email id as the live journey's, for a run of the same cause and step)
//! ends the waits for it. Between two events, each run due by then is advanced at its due
//! time. At the window's end the runs still open are counted by the step they are in.
//!
//! What it reads as it is now, not as it was: the contacts (their values, consent,
//! subscriptions and segments), the templates with their sender and the send policy, and the
//! suppression list. The send policy's frequency caps count the contact's recorded marketing
//! sends before each decision's time together with the replay's own (one email counted once).
//! No webhook is called: a call counts as answered `200` with no body. The month's allowance
//! is not counted.
//!
//! Memory: the open runs of the replay and bounded caches; the log is read in batches.

mod report;
mod sim;
mod store;

use std::time::Instant;

use deadpool_postgres::{GenericClient, Pool};
use domain::workflows::{Reentry, TriggerOn, WorkflowDef};
use platform::log::{EVENT_COLUMNS, StoredEvent};
use platform::settings::Settings;

pub use report::{Report, StepCounts, describe};
use sim::{Item, Sim, What};

/// Log events read per statement at most.
const BATCH: i64 = 5_000;
/// The events a replay plays; others are passed over unread.
const REPLAYED: &[&str] = &[
    "EventAccepted.v1",
    "EventReadinessChanged.v1",
    "RecordDeletionRequested.v1",
    "EmailOpened.v1",
    "EmailClicked.v1",
    "WorkflowRunRequested.v1",
];
/// Facts one decision may ask for at most (as the engine's).
const NEEDS_MAX: usize = 8;
/// Contacts (and addresses) kept read at most; the caches start again past it.
const CACHED_MAX: usize = 100_000;

/// What to replay: a definition of a workflow of a space over `[from_ms, to_ms]`.
pub struct Request<'a> {
    pub space_id: &'a str,
    /// The workflow's id: the runs' ids (and so their emails' ids) are derived from it, as the
    /// engine's are.
    pub workflow_id: &'a str,
    pub definition: &'a WorkflowDef,
    pub from_ms: i64,
    pub to_ms: i64,
    /// The last log position read (`None`: the log's head when the replay starts).
    pub until_position: Option<i64>,
}

/// Replays `request` against the log (reads only) and reports what the runs would have done.
pub async fn replay(pool: &Pool, settings: &Settings, request: Request<'_>) -> anyhow::Result<(Report, Elapsed)> {
    let started = Instant::now();
    let client = pool.get().await?;
    let site = mail::send::Site::from_settings(&settings.email)?;
    let (first, head) = window(&client, request.from_ms).await?;
    let last = request.until_position.map_or(head, |until| until.min(head));
    let mut sim = Sim::new(&request, (&site, &settings.webhooks.retry_schedule_ms), first - 1);
    let segments = segment_triggers(request.definition);
    let segments_schema = match segments.is_empty() {
        true => None,
        false => platform::readmodel::live_schema(&client, "segments").await?,
    };
    let mut after = first - 1;
    while after < last {
        let rows = client
            .query(
                &format!(
                    "SELECT {EVENT_COLUMNS} FROM events
                     WHERE position > $1 AND position <= $2 AND space_id = $3 AND event_type = ANY($4)
                     ORDER BY position LIMIT $5"
                ),
                &[&after, &last, &request.space_id, &REPLAYED, &BATCH],
            )
            .await?;
        let through = match rows.last() {
            Some(row) if rows.len() as i64 >= BATCH => row.get::<_, i64>(0),
            _ => last,
        };
        let mut items: Vec<Item> = Vec::new();
        sim.read(rows.len());
        for row in &rows {
            let stored = StoredEvent::from_row(row);
            let at = stored.recorded_at.timestamp_millis();
            items.push(Item { position: stored.position, at, what: What::Logged(Box::new(stored.decode()?)) });
        }
        if let Some(schema) = &segments_schema {
            for (segment_id, reentry) in &segments {
                for row in client
                    .query(
                        &format!(
                            "SELECT en.position, en.contact_id, e.recorded_at FROM {schema}.entries en
                             JOIN events e ON e.position = en.position
                             WHERE en.segment_id = $1 AND en.position > $2 AND en.position <= $3
                             ORDER BY en.position, en.contact_id"
                        ),
                        &[segment_id, &after, &through],
                    )
                    .await?
                {
                    let at: chrono::DateTime<chrono::Utc> = row.get(2);
                    items.push(Item {
                        position: row.get(0),
                        at: at.timestamp_millis(),
                        what: What::Entered {
                            segment_id: segment_id.clone(),
                            contact_id: row.get(1),
                            reentry: *reentry,
                        },
                    });
                }
            }
        }
        items.sort_by_key(|item| item.position);
        let batch = sim.prepare(&client, &items).await?;
        for item in items {
            sim.fire_until(&client, item.at).await?;
            sim.position = item.position;
            sim.handle(item, &batch)?;
        }
        after = through;
    }
    sim.fire_until(&client, request.to_ms).await?;
    let report = sim.finish();
    Ok((report, Elapsed { ms: started.elapsed().as_millis() as u64, events: (last - first + 1).max(0) }))
}

/// How long a replay took, over how many positions of the log.
#[derive(Debug, Clone, Copy)]
pub struct Elapsed {
    pub ms: u64,
    pub events: i64,
}

/// The positions of the window: the first event recorded at or after `from_ms` (found by
/// halving: positions are dense and recorded in order) and the log's head.
async fn window(client: &impl GenericClient, from_ms: i64) -> anyhow::Result<(i64, i64)> {
    let head: i64 = client.query_one("SELECT COALESCE(max(position), 0) FROM events", &[]).await?.get(0);
    let from = platform::time::from_millis(from_ms);
    let statement =
        client.prepare_cached("SELECT recorded_at FROM events WHERE position >= $1 ORDER BY position LIMIT 1").await?;
    let (mut low, mut high) = (1_i64, head + 1);
    while low < high {
        let middle = low + (high - low) / 2;
        let recorded: Option<chrono::DateTime<chrono::Utc>> =
            client.query_opt(&statement, &[&middle]).await?.map(|row| row.get(0));
        match recorded {
            Some(recorded) if recorded < from => low = middle + 1,
            _ => high = middle,
        }
    }
    Ok((low, head))
}

/// The definition's segment triggers: (segment, re-entry rule).
fn segment_triggers(definition: &WorkflowDef) -> Vec<(String, Reentry)> {
    definition
        .triggers
        .iter()
        .filter_map(|trigger| match &trigger.on {
            TriggerOn::Segment { segment_id } => Some((segment_id.clone(), trigger.reentry)),
            TriggerOn::Event { .. } => None,
        })
        .collect()
}
