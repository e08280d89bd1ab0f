//! The engine's log follower (worker `workflow_events`, under the lease of the same name):
//! what other parts of the log mean for runs.
//!
//! - An event that becomes ready for a contact (accepted `ready`, or prepared later) ends the
//!   `wait_for_event` steps of that contact waiting for its schema, when the wait began before
//!   the event (`waiting_after`), and starts a run of each published workflow it triggers, under
//!   the trigger's re-entry rule. The run's id is derived from (workflow, event), so a batch
//!   followed twice starts nothing twice.
//! - A contact's deletion makes its unfinished runs due at once: the engine ends them.
//!
//! The matches are written in the transaction that advances the follower's checkpoint; the
//! runs it starts are appended before that commit, so a crash in between only appends them
//! again, which their stream's version refuses.

use std::time::Duration;

use deadpool_postgres::{GenericClient, Pool};
use futures_util::future::BoxFuture;
use prost::Message;
use serde_json::{Value, json};
use shared::events::LogEvent;
use shared::log::{AppendError, AppendRequest, EventLog, ExpectedVersion, Guard, Metadata, NewEvent, StreamAppend};
use shared::proto;
use shared::workflows::{Reentry, WORKFLOW, WorkflowDef, run_stream_id};

use crate::runtime::{Lease, LeaseName, Outcome, Worker};

/// Log events read per step at most.
const BATCH: i64 = 1_000;

pub struct Follower {
    pool: Pool,
    log: EventLog,
    lease: LeaseName,
}

/// An event ready for a contact.
struct Ready {
    position: i64,
    event_id: String,
    space_id: String,
    schema_id: String,
    contact_id: String,
}

impl Follower {
    pub fn new(pool: Pool, log: EventLog) -> Self {
        Self { pool, log, lease: LeaseName::new("workflow_events") }
    }

    async fn step(&self) -> anyhow::Result<Outcome> {
        let mut client = self.pool.get().await?;
        let Some(lease) = Lease::acquire(&mut client, &self.lease).await? else { return Ok(Outcome::Idle) };
        let events = shared::log::read_after(lease.transaction(), lease.checkpoint, BATCH).await?;
        let Some(last) = events.last().map(|event| event.position) else { return Ok(Outcome::Idle) };
        let full = events.len() as i64 >= BATCH;
        let (mut ready, mut deleted) = (Vec::new(), Vec::new());
        for stored in &events {
            match stored.decode()? {
                LogEvent::EventAccepted(accepted)
                    if accepted.readiness == "ready" && !accepted.contact_id.is_empty() =>
                {
                    ready.push(Ready {
                        position: stored.position,
                        event_id: accepted.id,
                        space_id: accepted.space_id,
                        schema_id: accepted.schema_id,
                        contact_id: accepted.contact_id,
                    });
                }
                LogEvent::EventReadinessChanged(changed) if changed.state == "ready" => {
                    if let Some(contact_id) = contact_of_event(lease.transaction(), &changed.id).await? {
                        ready.push(Ready {
                            position: stored.position,
                            event_id: changed.id,
                            space_id: changed.space_id,
                            schema_id: changed.schema_id,
                            contact_id,
                        });
                    }
                }
                LogEvent::RecordDeletionRequested(requested) if requested.schema_type == "contact" => {
                    deleted.push(requested.record_id);
                }
                _ => {}
            }
        }
        // The runs the events start are appended first, while this transaction holds no row
        // of `workflow_runs` (an append of this process's batcher may wait on such a row).
        for ready in &ready {
            self.start_triggered(lease.transaction(), ready).await?;
        }
        for ready in &ready {
            lease
                .transaction()
                .execute(
                    "UPDATE workflow_runs SET matched_event = $3,
                         due_at = CASE WHEN paused THEN due_at ELSE clock_timestamp() END
                     WHERE contact_id = $1 AND waiting_schema = $2 AND status = 'sleeping' AND matched_event IS NULL
                       AND waiting_after < $4",
                    &[&ready.contact_id, &ready.schema_id, &ready.event_id, &ready.position],
                )
                .await?;
        }
        if !deleted.is_empty() {
            lease
                .transaction()
                .execute(
                    "UPDATE workflow_runs SET due_at = clock_timestamp()
                     WHERE contact_id = ANY($1) AND finished_at IS NULL AND NOT paused",
                    &[&deleted],
                )
                .await?;
        }
        lease.commit(last).await?;
        Ok(if full { Outcome::Progressed } else { Outcome::Idle })
    }

    /// Starts the runs of the published workflows `ready` triggers.
    async fn start_triggered(&self, transaction: &impl GenericClient, ready: &Ready) -> anyhow::Result<()> {
        let catalog = live_catalog(transaction).await?;
        let statement = format!(
            "SELECT resource_id, revision, definition FROM {catalog}.resources
             WHERE kind = $1 AND space_id = $2 AND definition ->> 'status' = 'published'
               AND definition -> 'triggers' @> jsonb_build_array(jsonb_build_object('eventSchemaId', $3::text))"
        );
        let rows = transaction.query(&statement, &[&WORKFLOW, &ready.space_id, &ready.schema_id]).await?;
        for row in rows {
            let workflow_id: String = row.get(0);
            let definition: WorkflowDef = serde_json::from_value(row.get::<_, Value>(2))?;
            let Some(trigger) = definition.triggers.iter().find(|trigger| trigger.event_schema_id == ready.schema_id)
            else {
                continue;
            };
            self.start(transaction, ready, (&workflow_id, row.get(1)), trigger.reentry).await?;
        }
        Ok(())
    }

    /// Starts the run of `workflow` the ready event triggers, unless its re-entry rule holds it
    /// back or it was started before.
    async fn start(
        &self,
        client: &impl GenericClient,
        ready: &Ready,
        (workflow_id, revision): (&str, i64),
        reentry: Reentry,
    ) -> anyhow::Result<()> {
        let held_back = match reentry {
            Reentry::Always => false,
            Reentry::Once => client
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM workflow_entries WHERE workflow_id = $1 AND contact_id = $2)",
                    &[&workflow_id, &ready.contact_id],
                )
                .await?
                .get(0),
            Reentry::OnceAtATime => client
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM workflow_entries e JOIN workflow_runs r ON r.run_id = e.run_id
                                    WHERE e.workflow_id = $1 AND e.contact_id = $2 AND r.finished_at IS NULL)",
                    &[&workflow_id, &ready.contact_id],
                )
                .await?
                .get(0),
        };
        if held_back {
            return Ok(());
        }
        let keys = shared::crypto::load_keys(client, std::slice::from_ref(&ready.contact_id)).await?;
        let Some(key) = keys.get(&ready.contact_id) else { return Ok(()) };
        let data = event_data(client, &ready.event_id, &keys).await?;
        let input = json!({"event": {"id": ready.event_id, "schemaId": ready.schema_id, "data": data}});
        let run_id = format!(
            "run_{}",
            &shared::ids::sha256_hex(&format!("workflow-trigger\u{1f}{workflow_id}\u{1f}{}", ready.event_id))[..32]
        );
        let now = shared::time::now_millis();
        let mut sealed = shared::events::seal(&ready.contact_id, &proto::WorkflowInput { json: input.to_string() });
        shared::events::encrypt(&mut sealed, key)?;
        let requested = proto::WorkflowRunRequested {
            run_id: run_id.clone(),
            workflow_id: workflow_id.to_owned(),
            space_id: ready.space_id.clone(),
            workflow_revision: revision,
            trigger: "event".to_owned(),
            trigger_id: ready.event_id.clone(),
            contact_id: ready.contact_id.clone(),
            input: Some(sealed.clone()),
            requested_at_ms: now,
        };
        let guards = vec![
            Guard::exactly_one(
                "INSERT INTO workflow_runs (run_id, workflow_id, space_id, revision, contact_id, status, version, due_at,
                     input, requested_at)
                 VALUES ($1, $2, $3, $4, $5, 'waiting', 1, clock_timestamp(), $6, clock_timestamp())",
                vec![
                    Box::new(run_id.clone()),
                    Box::new(workflow_id.to_owned()),
                    Box::new(ready.space_id.clone()),
                    Box::new(revision),
                    Box::new(ready.contact_id.clone()),
                    Box::new(sealed.encode_to_vec()),
                ],
                AppendError::Failed("could not record the run".to_owned()),
            ),
            Guard::exactly_one(
                "INSERT INTO workflow_entries (workflow_id, contact_id, run_id) VALUES ($1, $2, $3)",
                vec![Box::new(workflow_id.to_owned()), Box::new(ready.contact_id.clone()), Box::new(run_id.clone())],
                AppendError::Failed("could not record the run's entry".to_owned()),
            ),
        ];
        let stream = StreamAppend {
            stream_id: run_stream_id(&run_id),
            expected: ExpectedVersion::NoStream,
            events: vec![NewEvent {
                event: LogEvent::WorkflowRunRequested(requested),
                subject_id: Some(ready.contact_id.clone()),
                occurred_at: shared::time::from_millis(now),
            }],
        };
        let metadata = Metadata { space_id: Some(ready.space_id.clone()), ..Metadata::default() };
        match self.log.append(AppendRequest { metadata, streams: vec![stream], guards }).await {
            // Started by an earlier pass over the same event.
            Ok(_) | Err(AppendError::WrongVersion { .. }) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }
}

/// The contact an event is about, from its acceptance.
async fn contact_of_event(client: &impl GenericClient, event_id: &str) -> anyhow::Result<Option<String>> {
    let events = shared::log::read_streams(client, &[format!("event/{event_id}")]).await?;
    for stored in events {
        if let LogEvent::EventAccepted(accepted) = stored.decode()? {
            return Ok(Some(accepted.contact_id).filter(|id| !id.is_empty()));
        }
    }
    Ok(None)
}

/// An event's values (accepted and prepared), opened with its subject's key.
async fn event_data(client: &impl GenericClient, event_id: &str, keys: &shared::crypto::Keys) -> anyhow::Result<Value> {
    let mut values = serde_json::Map::new();
    for stored in shared::log::read_streams(client, &[format!("event/{event_id}")]).await? {
        let sealed = match stored.decode()? {
            LogEvent::EventAccepted(accepted) => accepted.data,
            LogEvent::EventReadinessChanged(changed) => changed.prepared,
            _ => None,
        };
        let opened: Option<proto::EventData> = shared::events::open(sealed.as_ref(), keys)?;
        if let Some(Value::Object(more)) = opened.and_then(|data| serde_json::from_str(&data.values_json).ok()) {
            values.extend(more);
        }
    }
    Ok(Value::Object(values))
}

async fn live_catalog(client: &impl GenericClient) -> anyhow::Result<String> {
    let row = client
        .query_opt("SELECT version FROM projections WHERE name = 'catalog' AND status = 'live'", &[])
        .await?
        .ok_or_else(|| anyhow::anyhow!("the catalog has no live version yet"))?;
    Ok(shared::readmodel::schema_name("catalog", row.get(0)))
}

impl Worker for Follower {
    fn name(&self) -> String {
        "workflow_events".to_owned()
    }

    fn channels(&self) -> &'static [&'static str] {
        &[shared::log::LOG_CHANNEL]
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_millis(250)
    }

    fn step(&self) -> BoxFuture<'_, anyhow::Result<Outcome>> {
        Box::pin(Follower::step(self))
    }

    fn lag(&self) -> BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(crate::runtime::lag_behind(
            &self.pool,
            "SELECT position FROM worker_checkpoints WHERE name = $1",
            "workflow_events",
        ))
    }
}
