//! The engine's log follower (worker `workflow_events`, under the lease of the same name):
//! what other parts of the log mean for runs.
//!
//! - An event that becomes ready for a contact (accepted `ready`, or prepared later) ends the
//!   `wait_for_event` steps of that contact waiting for its schema, when the wait began before
//!   the event (`waiting_after`), and starts a run of each published workflow it triggers, under
//!   the trigger's re-entry rule. The run's id is derived from (workflow, event), so a batch
//!   followed twice starts nothing twice.
//! - A person's open of an email (or click of one of its links) ends the `wait_for_engagement`
//!   steps waiting for it (`waiting_schema` `opened:<emailId>` or `clicked:<emailId>`), when
//!   the wait began before it; a wait that times out asks the log once more.
//! - A contact's deletion makes its unfinished runs due at once: the engine ends them.
//! - A contact that enters a segment (an entry the segments read model records at the log
//!   position of the change that made it a member) starts a run of each published workflow
//!   with a trigger on that segment, under the trigger's re-entry rule. Each trigger is
//!   followed from the position of the definition that published it
//!   (`workflow_segment_triggers`), so members from before then start nothing; the run's id is
//!   derived from (workflow, segment, contact, position).
//!
//! The matches are written in the transaction that advances the follower's checkpoint; the
//! runs it starts are appended before that commit, so a crash in between only appends them
//! again, which their stream's version refuses.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use deadpool_postgres::{GenericClient, Pool};
use domain::workflows::{ContactRuns, EngagementAction, Reentry, TriggerOn, WORKFLOW, WorkflowDef, run_stream_id};
use futures_util::future::BoxFuture;
use platform::events::LogEvent;
use platform::log::{
    AppendError, AppendRequest, EventLog, ExpectedVersion, Guard, NewEvent, StoredEvent, StreamAppend,
};
use platform::proto;
use prost::Message;
use serde_json::{Value, json};

use crate::runtime::{Lease, LeaseName, Looked, Outcome, Worker};

/// Log events read per step at most.
const BATCH: i64 = 1_000;
/// The events [`Follower::follow_log`] acts on; others are passed over unread.
const FOLLOWED: &[&str] = &[
    "EventAccepted.v1",
    "EventReadinessChanged.v1",
    "RecordDeletionRequested.v1",
    "EmailOpened.v1",
    "EmailClicked.v1",
];

pub(crate) struct Follower {
    pool: Pool,
    log: EventLog,
    lease: LeaseName,
    /// The inputs of the last segment pass that left nothing waiting and was committed: a pass
    /// on the same inputs finds nothing to do, so it is skipped.
    settled: Mutex<Option<PassInputs>>,
    /// The published segment triggers (workflow, segment) at a catalog version and revision,
    /// for [`Follower::look`].
    triggers: Mutex<Option<PublishedAt>>,
}

/// The published segment triggers, at the catalog version and revision they were read at.
type PublishedAt = ((i32, i64), Vec<(String, String)>);

/// What a segment pass depends on besides `workflow_segment_triggers`, which only the pass
/// writes: the segments read model's version and position, and the catalog's version and
/// revision.
#[derive(Clone, PartialEq, Eq)]
struct PassInputs {
    segments: (i32, i64),
    catalog: (i32, i64),
}

/// What a step's segment pass did.
enum Pass {
    /// Nothing: its inputs were those of the last settled pass (or a read model is not live).
    Skipped,
    /// It ran; with its inputs when it left no entries waiting, and whether it found entries
    /// (and so may have appended runs). One that found none wrote only the triggers' progress.
    Done { settled: Option<PassInputs>, entered: bool },
}

/// What a segment pass depends on now, or `None` while the segments or the catalog read model
/// has no live version. Prepared once per connection, as are the pass's other statements: it
/// runs after every append.
async fn pass_inputs(client: &impl GenericClient) -> anyhow::Result<Option<PassInputs>> {
    let statement = client
        .prepare_cached(
            "SELECT s.version, s.position, c.version, c.revision FROM projections s, projections c
             WHERE s.name = 'segments' AND s.status = 'live' AND c.name = 'catalog' AND c.status = 'live'",
        )
        .await?;
    let row = client.query_opt(&statement, &[]).await?;
    Ok(row.map(|row| PassInputs { segments: (row.get(0), row.get(1)), catalog: (row.get(2), row.get(3)) }))
}

/// A published workflow's segment trigger: the workflow, the segment, the workflow's space
/// and revision, and the trigger's re-entry rule.
type SegmentTrigger = (String, String, String, i64, Reentry);

/// The segment triggers of the published workflows, as catalog version `catalog` holds them.
async fn published_triggers(client: &impl GenericClient, catalog: i32) -> anyhow::Result<Vec<SegmentTrigger>> {
    let catalog = platform::readmodel::schema_name("catalog", catalog);
    let statement = client
        .prepare_cached(&format!(
            "SELECT resource_id, space_id, revision, definition FROM {catalog}.resources
             WHERE kind = $1 AND definition ->> 'status' = 'published'
               AND jsonb_path_exists(definition, '$.triggers[*].segmentId')"
        ))
        .await?;
    let mut triggers = Vec::new();
    for row in client.query(&statement, &[&WORKFLOW]).await? {
        let definition: WorkflowDef = serde_json::from_value(row.get::<_, Value>(3))?;
        for trigger in definition.triggers {
            if let TriggerOn::Segment { segment_id } = trigger.on {
                let (workflow_id, space_id, revision): (String, String, i64) = (row.get(0), row.get(1), row.get(2));
                triggers.push((workflow_id, segment_id, space_id, revision, trigger.reentry));
            }
        }
    }
    Ok(triggers)
}

/// Segment entries read per trigger and step at most.
const ENTRIES: usize = 1_000;

/// An event ready for a contact.
struct Ready {
    position: i64,
    event_id: String,
    space_id: String,
    schema_id: String,
    contact_id: String,
}

impl Follower {
    pub(crate) fn new(pool: Pool, log: EventLog) -> Self {
        Self {
            pool,
            log,
            lease: LeaseName::new("workflow_events"),
            settled: Mutex::new(None),
            triggers: Mutex::new(None),
        }
    }

    async fn step(&self) -> anyhow::Result<Outcome> {
        let mut client = self.pool.get().await?;
        let looked = match self.look(&client).await? {
            Looked::Done(outcome) => return Ok(outcome),
            Looked::Lease(look) => look,
        };
        let Some(lease) = Lease::acquire(&mut client, &self.lease).await? else { return Ok(Outcome::Idle) };
        let followed = crate::runtime::followed(&lease, looked, BATCH, FOLLOWED).await?;
        let full = followed.read as i64 >= BATCH;
        let last = followed.last.unwrap_or(lease.checkpoint);
        if !followed.events.is_empty() {
            self.follow_log(lease.transaction(), &followed.events).await?;
        }
        let pass = self.follow_segments(lease.transaction()).await?;
        match pass {
            Pass::Skipped if followed.read == 0 => {
                lease.rollback().await?;
                return Ok(Outcome::Idle);
            }
            // Nothing followed, and at most the triggers' progress written, which only this
            // worker reads.
            Pass::Skipped | Pass::Done { entered: false, .. } if followed.events.is_empty() => {
                lease.pass_over(last).await?
            }
            _ => lease.commit(last).await?,
        }
        let more_entries = match pass {
            Pass::Skipped => false,
            Pass::Done { settled: Some(inputs), .. } => {
                *self.settled.lock().unwrap_or_else(PoisonError::into_inner) = Some(inputs);
                false
            }
            Pass::Done { settled: None, .. } => true,
        };
        Ok(if full || more_entries { Outcome::Progressed } else { Outcome::Idle })
    }

    /// Looks at the next span and the segments' entries without the lease
    /// ([`crate::runtime::look`]), and passes over a span when neither holds anything for the
    /// follower: no event it follows, and a segment pass that would find nothing (its inputs
    /// those of the last settled pass, or every published trigger followed, none forgotten,
    /// and no entry after any trigger's progress). The triggers' progress then stays where it
    /// was; the next pass under the lease reads on from it. Anything else takes the lease.
    async fn look(&self, client: &deadpool_postgres::Client) -> anyhow::Result<Looked> {
        let (look, inputs) =
            tokio::try_join!(crate::runtime::look(client, &self.lease, BATCH, FOLLOWED), pass_inputs(client))?;
        let Some(look) = look else { return Ok(Looked::Lease(None)) };
        if !look.followed.events.is_empty() {
            return Ok(Looked::Lease(Some(look)));
        }
        let settled = self.settled.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(inputs) = &inputs
            && settled.as_ref() != Some(inputs)
            && !self.segments_quiet(client, inputs).await?
        {
            return Ok(Looked::Lease(Some(look)));
        }
        let looked = look.pass_over(client, &self.lease, BATCH).await?;
        if let (Looked::Done(_), Some(inputs)) = (&looked, inputs) {
            *self.settled.lock().unwrap_or_else(PoisonError::into_inner) = Some(inputs);
        }
        Ok(looked)
    }

    /// Whether a segment pass on `inputs` would find nothing to do: the triggers followed are
    /// those published (read from the catalog, kept while it stays at its revision), and no
    /// trigger's segment has an entry after its progress up to the segments read model's
    /// position.
    async fn segments_quiet(&self, client: &deadpool_postgres::Client, inputs: &PassInputs) -> anyhow::Result<bool> {
        let known = self
            .triggers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .filter(|(at, _)| *at == inputs.catalog)
            .map(|(_, triggers)| triggers.clone());
        let triggers = match known {
            Some(triggers) => triggers,
            None => {
                let published = published_triggers(client, inputs.catalog.0).await?;
                let triggers: Vec<(String, String)> = published.into_iter().map(|t| (t.0, t.1)).collect();
                *self.triggers.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some((inputs.catalog, triggers.clone()));
                triggers
            }
        };
        let segments = platform::readmodel::schema_name("segments", inputs.segments.0);
        let statement = client
            .prepare_cached(&format!(
                "WITH wanted AS (SELECT * FROM unnest($1::text[], $2::text[]) AS w(workflow_id, segment_id))
                 SELECT (SELECT count(*) FROM workflow_segment_triggers) = cardinality($1::text[])
                    AND (SELECT count(*) FROM workflow_segment_triggers JOIN wanted USING (workflow_id, segment_id))
                        = cardinality($1::text[])
                    AND NOT EXISTS (SELECT FROM workflow_segment_triggers t JOIN {segments}.entries e
                                    ON e.segment_id = t.segment_id AND e.position > t.through AND e.position <= $3)"
            ))
            .await?;
        let (workflow_ids, segment_ids): (Vec<&str>, Vec<&str>) =
            triggers.iter().map(|(workflow, segment)| (workflow.as_str(), segment.as_str())).unzip();
        Ok(client.query_one(&statement, &[&workflow_ids, &segment_ids, &inputs.segments.1]).await?.get(0))
    }

    /// What the log's events mean for runs: ready events and deleted contacts.
    async fn follow_log(&self, transaction: &impl GenericClient, events: &[StoredEvent]) -> anyhow::Result<()> {
        let (mut ready, mut deleted, mut engaged) = (Vec::new(), Vec::new(), Vec::new());
        for stored in events {
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
                    if let Some(contact_id) = contact_of_event(transaction, &changed.id).await? {
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
                // A person's open or click: a machine's ends no wait.
                LogEvent::EmailOpened(opened) if opened.machine.is_empty() => engaged.push((
                    opened.contact_id,
                    EngagementAction::Opened.waiting_key(&opened.email_id),
                    opened.email_id,
                    stored.position,
                )),
                LogEvent::EmailClicked(clicked) if clicked.machine.is_empty() => engaged.push((
                    clicked.contact_id,
                    EngagementAction::Clicked.waiting_key(&clicked.email_id),
                    clicked.email_id,
                    stored.position,
                )),
                _ => {}
            }
        }
        // The runs the events start are appended first, while this transaction holds no row
        // of `workflow_runs` (an append of this process's batcher may wait on such a row).
        for ready in &ready {
            self.start_triggered(transaction, ready).await?;
        }
        // Each wait a fact ends: (contact, what it waits for, what matched, the fact's position).
        let wakes =
            ready.iter().map(|ready| (&ready.contact_id, &ready.schema_id, &ready.event_id, ready.position)).chain(
                engaged
                    .iter()
                    .map(|(contact_id, waiting, email_id, position)| (contact_id, waiting, email_id, *position)),
            );
        for (contact_id, waiting, matched, position) in wakes {
            transaction
                .execute(
                    "UPDATE workflow_runs SET matched_event = $3,
                         due_at = CASE WHEN paused THEN due_at ELSE clock_timestamp() END
                     WHERE contact_id = $1 AND waiting_schema = $2 AND status = 'sleeping' AND matched_event IS NULL
                       AND waiting_after < $4",
                    &[contact_id, waiting, matched, &position],
                )
                .await?;
        }
        if !deleted.is_empty() {
            transaction
                .execute(
                    "UPDATE workflow_runs SET due_at = clock_timestamp()
                     WHERE contact_id = ANY($1) AND finished_at IS NULL AND NOT paused",
                    &[&deleted],
                )
                .await?;
        }
        Ok(())
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
            let Some(trigger) = definition.triggers.iter().find(|trigger| {
                matches!(&trigger.on, TriggerOn::Event { event_schema_id } if *event_schema_id == ready.schema_id)
            }) else {
                continue;
            };
            let start = Start {
                space_id: &ready.space_id,
                contact_id: &ready.contact_id,
                workflow: (&workflow_id, row.get(1)),
                reentry: trigger.reentry,
                cause: Cause::Event { event_id: &ready.event_id, schema_id: &ready.schema_id },
            };
            self.start(transaction, &start).await?;
        }
        Ok(())
    }

    /// Starts the runs of the segment triggers of published workflows for the contacts that
    /// entered their segments, as far as the segments read model has reached. Skipped when
    /// its inputs are those of the last pass that left nothing waiting.
    async fn follow_segments(&self, transaction: &impl GenericClient) -> anyhow::Result<Pass> {
        let Some(inputs) = pass_inputs(transaction).await? else { return Ok(Pass::Skipped) };
        if self.settled.lock().unwrap_or_else(PoisonError::into_inner).as_ref() == Some(&inputs) {
            return Ok(Pass::Skipped);
        }
        let segments = platform::readmodel::schema_name("segments", inputs.segments.0);
        let reached = inputs.segments.1;
        let triggers = published_triggers(transaction, inputs.catalog.0).await?;
        let workflow_ids: Vec<&str> = triggers.iter().map(|trigger| trigger.0.as_str()).collect();
        let segment_ids: Vec<&str> = triggers.iter().map(|trigger| trigger.1.as_str()).collect();
        // Triggers no longer published are forgotten; new ones start after the definition
        // that published them.
        let forget = transaction
            .prepare_cached(
                "DELETE FROM workflow_segment_triggers
                 WHERE (workflow_id, segment_id) NOT IN (SELECT * FROM unnest($1::text[], $2::text[]))",
            )
            .await?;
        transaction.execute(&forget, &[&workflow_ids, &segment_ids]).await?;
        let followed = transaction
            .prepare_cached(
                "WITH wanted AS (SELECT * FROM unnest($1::text[], $2::text[]) AS w(workflow_id, segment_id)),
                 added AS (
                     INSERT INTO workflow_segment_triggers (workflow_id, segment_id, through)
                     SELECT workflow_id, segment_id,
                            (SELECT coalesce(max(position), 0) FROM events WHERE stream_id = 'authoring/workflow/' || workflow_id)
                     FROM wanted ON CONFLICT DO NOTHING RETURNING workflow_id, segment_id, through)
                 SELECT workflow_id, segment_id, through FROM added
                 UNION ALL
                 SELECT t.workflow_id, t.segment_id, t.through FROM workflow_segment_triggers t JOIN wanted USING (workflow_id, segment_id)",
            )
            .await?;
        let rows = transaction.query(&followed, &[&workflow_ids, &segment_ids]).await?;
        let advance = transaction
            .prepare_cached(
                "UPDATE workflow_segment_triggers SET through = $3 WHERE workflow_id = $1 AND segment_id = $2",
            )
            .await?;
        let (mut more, mut entered) = (false, false);
        for row in rows {
            let (workflow_id, segment_id, through): (String, String, i64) = (row.get(0), row.get(1), row.get(2));
            if through >= reached {
                continue;
            }
            let Some((_, _, space_id, revision, reentry)) =
                triggers.iter().find(|trigger| trigger.0 == workflow_id && trigger.1 == segment_id)
            else {
                continue;
            };
            let (entries, done) = entries(transaction, &segments, &segment_id, (through, reached)).await?;
            entered |= !entries.is_empty();
            for (position, contact_id) in &entries {
                let start = Start {
                    space_id,
                    contact_id,
                    workflow: (&workflow_id, *revision),
                    reentry: *reentry,
                    cause: Cause::Segment { segment_id: &segment_id, position: *position },
                };
                self.start(transaction, &start).await?;
            }
            transaction.execute(&advance, &[&workflow_id, &segment_id, &done]).await?;
            more |= done < reached;
        }
        Ok(Pass::Done { settled: (!more).then_some(inputs), entered })
    }

    /// Starts the run of `start.workflow` for `start.contact_id`, unless its re-entry rule
    /// holds it back or it was started before. The rule counts every run of the workflow for
    /// the contact, whatever started it: a trigger of the workflow's incoming webhook (through
    /// the API), an event or a segment.
    async fn start(&self, client: &impl GenericClient, start: &Start<'_>) -> anyhow::Result<()> {
        let (workflow_id, revision) = start.workflow;
        let contact_id = start.contact_id.to_owned();
        // `always` needs no read.
        let held_back = start.reentry != Reentry::Always
            && start.reentry.holds_back(contact_runs(client, workflow_id, &contact_id).await?);
        if held_back {
            return Ok(());
        }
        let keys = platform::crypto::load_keys(client, std::slice::from_ref(&contact_id)).await?;
        let Some(key) = keys.get(&contact_id) else { return Ok(()) };
        let (input, trigger, trigger_id, cause) = match start.cause {
            Cause::Event { event_id, schema_id } => {
                let (data, occurred_at) = event_data(client, event_id, &keys).await?;
                let input =
                    json!({"event": {"id": event_id, "schemaId": schema_id, "occurredAt": occurred_at, "data": data}});
                (input, "event", event_id, format!("workflow-trigger\u{1f}{workflow_id}\u{1f}{event_id}"))
            }
            Cause::Segment { segment_id, position } => (
                json!({"segment": {"id": segment_id}}),
                "segment",
                segment_id,
                format!("workflow-segment\u{1f}{workflow_id}\u{1f}{segment_id}\u{1f}{contact_id}\u{1f}{position}"),
            ),
        };
        let run_id = format!("run_{}", &platform::ids::sha256_hex(&cause)[..32]);
        let now = platform::time::now_millis();
        let mut sealed = platform::events::seal(&contact_id, &proto::WorkflowInput { json: input.to_string() });
        platform::events::encrypt(&mut sealed, key)?;
        let requested = proto::WorkflowRunRequested {
            run_id: run_id.clone(),
            workflow_id: workflow_id.to_owned(),
            space_id: start.space_id.to_owned(),
            workflow_revision: revision,
            trigger: trigger.to_owned(),
            trigger_id: trigger_id.to_owned(),
            contact_id: contact_id.clone(),
            input: Some(sealed.clone()),
            requested_at_ms: now,
        };
        let guards = vec![Guard::exactly_one(
            "INSERT INTO workflow_runs (run_id, workflow_id, space_id, revision, contact_id, status, version, due_at,
                     input, requested_at, migrate_to)
                 VALUES ($1, $2, $3, $4, $5, 'waiting', 1, clock_timestamp(), $6, clock_timestamp(),
                     (SELECT c.moved_to FROM workflow_controls c WHERE c.workflow_id = $2 AND c.moved_to > $4::bigint))",
            vec![
                Box::new(run_id.clone()),
                Box::new(workflow_id.to_owned()),
                Box::new(start.space_id.to_owned()),
                Box::new(revision),
                Box::new(contact_id.clone()),
                Box::new(sealed.encode_to_vec()),
            ],
            AppendError::Failed("could not record the run".to_owned()),
        )];
        let stream = StreamAppend {
            stream_id: run_stream_id(&run_id),
            expected: ExpectedVersion::NoStream,
            events: vec![NewEvent {
                event: LogEvent::WorkflowRunRequested(requested),
                subject_id: Some(contact_id),
                occurred_at: platform::time::from_millis(now),
            }],
        };
        match self.log.append(AppendRequest::in_space(start.space_id, vec![stream], guards)).await {
            // Started by an earlier pass over the same cause.
            Ok(_) | Err(AppendError::WrongVersion { .. }) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }
}

/// A run to start: for whom, of which workflow (id, revision), under which re-entry rule, and
/// why.
struct Start<'a> {
    space_id: &'a str,
    contact_id: &'a str,
    workflow: (&'a str, i64),
    reentry: Reentry,
    cause: Cause<'a>,
}

enum Cause<'a> {
    Event { event_id: &'a str, schema_id: &'a str },
    Segment { segment_id: &'a str, position: i64 },
}

/// The entries of `segment_id` after `through` up to `reached` (position, contact), in order,
/// at most about [`ENTRIES`], and the position through which they are all the entries: the
/// last position is taken whole, so no position is ever split across steps.
async fn entries(
    client: &impl GenericClient,
    segments: &str,
    segment_id: &str,
    (through, reached): (i64, i64),
) -> anyhow::Result<(Vec<(i64, String)>, i64)> {
    let limit = i64::try_from(ENTRIES).unwrap_or(i64::MAX);
    let statement = client
        .prepare_cached(&format!(
            "SELECT position, contact_id FROM {segments}.entries
             WHERE segment_id = $1 AND position > $2 AND position <= $3 ORDER BY position, contact_id LIMIT $4"
        ))
        .await?;
    let rows = client.query(&statement, &[&segment_id, &through, &reached, &limit]).await?;
    let mut entries: Vec<(i64, String)> = rows.into_iter().map(|row| (row.get(0), row.get(1))).collect();
    if entries.len() < ENTRIES {
        return Ok((entries, reached));
    }
    let last = entries.last().map_or(reached, |entry| entry.0);
    entries.retain(|entry| entry.0 < last);
    let rest = client
        .query(
            &format!("SELECT position, contact_id FROM {segments}.entries WHERE segment_id = $1 AND position = $2"),
            &[&segment_id, &last],
        )
        .await?;
    entries.extend(rest.into_iter().map(|row| (row.get(0), row.get(1))));
    Ok((entries, last))
}

/// The runs `contact_id` has of `workflow_id`, whatever started them.
async fn contact_runs(client: &impl GenericClient, workflow_id: &str, contact_id: &str) -> anyhow::Result<ContactRuns> {
    let statement = client
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM workflow_runs WHERE workflow_id = $1 AND contact_id = $2),
                    EXISTS (SELECT 1 FROM workflow_runs WHERE workflow_id = $1 AND contact_id = $2 AND finished_at IS NULL)",
        )
        .await?;
    let row = client.query_one(&statement, &[&workflow_id, &contact_id]).await?;
    Ok(ContactRuns { any: row.get(0), unfinished: row.get(1) })
}

/// The contact an event is about, from its acceptance.
async fn contact_of_event(client: &impl GenericClient, event_id: &str) -> anyhow::Result<Option<String>> {
    let events = platform::log::read_streams(client, &[domain::business_events::stream_id(event_id)]).await?;
    for stored in events {
        if let LogEvent::EventAccepted(accepted) = stored.decode()? {
            return Ok(Some(accepted.contact_id).filter(|id| !id.is_empty()));
        }
    }
    Ok(None)
}

/// An event's values (accepted and prepared), opened with its subject's key, and when it
/// occurred.
async fn event_data(
    client: &impl GenericClient,
    event_id: &str,
    keys: &platform::crypto::Keys,
) -> anyhow::Result<(Value, Option<String>)> {
    let mut values = serde_json::Map::new();
    let mut occurred_at = None;
    for stored in platform::log::read_streams(client, &[domain::business_events::stream_id(event_id)]).await? {
        let sealed = match stored.decode()? {
            LogEvent::EventAccepted(accepted) => {
                occurred_at = Some(platform::time::format_millis(accepted.occurred_at_ms));
                accepted.data
            }
            LogEvent::EventReadinessChanged(changed) => changed.prepared,
            _ => None,
        };
        let opened: Option<proto::EventData> = platform::events::open(sealed.as_ref(), keys)?;
        if let Some(Value::Object(more)) = opened.and_then(|data| serde_json::from_str(&data.values_json).ok()) {
            values.extend(more);
        }
    }
    Ok((Value::Object(values), occurred_at))
}

async fn live_catalog(client: &impl GenericClient) -> anyhow::Result<String> {
    platform::readmodel::live_schema(client, "catalog")
        .await?
        .ok_or_else(|| anyhow::anyhow!("the catalog has no live version yet"))
}

impl Worker for Follower {
    fn name(&self) -> String {
        "workflow_events".to_owned()
    }

    fn channels(&self) -> &'static [&'static str] {
        &[platform::log::LOG_CHANNEL]
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_millis(250)
    }

    fn idle_ceiling(&self) -> Duration {
        crate::runtime::FOLLOWER_IDLE_CEILING
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
