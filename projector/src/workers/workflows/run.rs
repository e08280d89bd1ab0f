//! Advancing one run: what a claimed run does next, appended as one transition.
//!
//! A tick reads the run's row (the engine's copy of the run's stream, written with it), the
//! definition at the run's revision (from the log), the workflow's pause control and, when a
//! step needs them, the contact's facts; it then executes steps until one must wait (a wait, a
//! webhook call), writes to another stream (an email, a record change, a subscription: one
//! such effect per transition), or the run ends, and appends the transition: the run's events
//! at its stream's version, the other streams' events and their guards, and the row's update
//! under the run's lease. A webhook call is two transitions: its start is committed before the
//! request goes out, and its outcome after; a start found without an outcome after a crash is
//! `outcome_unknown`, never repeated.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::{GenericClient, Pool};
use domain::records::{Loaded, RecordState};
use domain::workflows::{Source, Step, StepKind, Wait, WorkflowDef, at_path, condition_document, run_stream_id};
use mail::outbox::{self, Prepared};
use mail::send::{Authored, EmailTo, Gate, Recipient, allowance_guard, schedule};
use platform::crypto::DataKey;
use platform::error::Code;
use platform::events::LogEvent;
use platform::log::{AppendError, AppendRequest, ExpectedVersion, Guard, Metadata, NewEvent, SetValue, StreamAppend};
use platform::proto;
use prost::Message;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use uuid::Uuid;

use super::Inner;
use crate::workers::outbound::{AttemptResult, classify, describe, retry_after};

/// Steps one transition executes at most (a loop of steps without effects is bounded by its
/// `goto`, and each transition by this).
const STEPS_PER_TICK: usize = 64;
/// The longest error message kept.
const ERROR_MAX_CHARS: usize = 500;
/// The largest webhook answer body kept for later conditions.
const ANSWER_MAX_BYTES: usize = 64 * 1024;

/// The step started and not finished: a sleeping wait, or a webhook call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct InFlight {
    index: i32,
    step_id: String,
    step_type: String,
    started_at_ms: i64,
    /// A webhook call's attempts so far.
    #[serde(default)]
    attempt: u32,
    /// A webhook call's attempt is going out (committed before it does).
    #[serde(default)]
    attempting: bool,
}

/// A run's row as a tick reads it and writes it back.
#[derive(Clone)]
pub(super) struct Row {
    run_id: String,
    workflow_id: String,
    space_id: String,
    revision: i64,
    contact_id: Option<String>,
    status: String,
    step_id: Option<String>,
    step_count: i32,
    version: i64,
    paused: bool,
    in_flight: Option<InFlight>,
    waiting_schema: Option<String>,
    matched_event: Option<String>,
    passes: BTreeMap<String, u32>,
    input: Vec<u8>,
    outputs: Option<Vec<u8>>,
    /// The workflow's pause control, read with the row.
    control_paused: bool,
    /// The data key that seals the run's input and outputs (none: erased), read with the row.
    keys: platform::crypto::Keys,
}

/// What a tick reads of a run (`r`, a `workflow_runs` row), with its workflow's pause control
/// and its data key: the claim returns it, and a later tick of the same claim reads it again.
pub(super) const ROW: &str = "r.run_id, r.workflow_id, r.space_id, r.revision, r.contact_id, r.status, r.step_id,
    r.step_count, r.version, r.paused, r.in_flight, r.waiting_schema, r.matched_event, r.passes, r.input, r.outputs,
    COALESCE((SELECT c.paused FROM workflow_controls c WHERE c.workflow_id = r.workflow_id), false),
    (SELECT k.wrapped_key FROM subject_keys k WHERE k.subject_id = COALESCE(r.contact_id, r.run_id))";

/// The run's row under the lease `token` (see [`ROW`]).
async fn load_row(client: &impl GenericClient, run_id: &str, token: Uuid) -> anyhow::Result<Option<Row>> {
    let statement = client
        .prepare_cached(&format!("SELECT {ROW} FROM workflow_runs r WHERE r.run_id = $1 AND r.lease_token = $2"))
        .await?;
    client.query_opt(&statement, &[&run_id, &token]).await?.as_ref().map(Row::read).transpose()
}

impl Row {
    /// A row selected as [`ROW`], its data key unwrapped.
    pub(super) fn read(row: &tokio_postgres::Row) -> anyhow::Result<Self> {
        let run_id: String = row.get(0);
        let contact_id: Option<String> = row.get(4);
        let subject = contact_id.clone().unwrap_or_else(|| run_id.clone());
        let mut keys = platform::crypto::Keys::default();
        if let Some(wrapped) = row.get::<_, Option<Vec<u8>>>(17) {
            let key = platform::crypto::keyring()?.unwrap_key(&subject, &wrapped)?;
            keys.insert(subject, key);
        }
        Ok(Row {
            run_id,
            workflow_id: row.get(1),
            space_id: row.get(2),
            revision: row.get(3),
            contact_id,
            status: row.get(5),
            step_id: row.get(6),
            step_count: row.get(7),
            version: row.get(8),
            paused: row.get(9),
            in_flight: row.get::<_, Option<Value>>(10).map(serde_json::from_value).transpose()?,
            waiting_schema: row.get(11),
            matched_event: row.get(12),
            passes: serde_json::from_value(row.get(13))?,
            input: row.get(14),
            outputs: row.get(15),
            control_paused: row.get(16),
            keys,
        })
    }
}

/// After a failed tick: the run is due again in a few seconds, its lease given back.
pub(super) async fn back_off(pool: &Pool, run_id: &str, token: Uuid) {
    let Ok(client) = pool.get().await else { return };
    let _ = client
        .execute(
            "UPDATE workflow_runs SET due_at = clock_timestamp() + interval '2 seconds', lease_token = NULL,
                 lease_until = NULL
             WHERE run_id = $1 AND lease_token = $2",
            &[&run_id, &token],
        )
        .await;
}

/// A contact as steps read it.
struct Contact {
    version: i64,
    state: RecordState,
    key: Option<DataKey>,
    consent: Option<bool>,
    subscriptions: BTreeMap<String, String>,
    segments: BTreeSet<String>,
}

/// What a run's contact is now.
enum ContactFacts {
    /// The run has none.
    None,
    /// Being deleted or erased: the run ends.
    Gone,
    Live(Box<Contact>),
}

/// A webhook call to make after the transition that starts (or retries) it is committed.
struct Call {
    url: String,
    body: Vec<u8>,
    call_id: String,
    secret: Option<domain::webhooks::signing::Secret>,
}

/// One transition being built.
struct Tick {
    row: Row,
    /// The row's version before this transition.
    base_version: i64,
    events: Vec<LogEvent>,
    streams: Vec<StreamAppend>,
    guards: Vec<Guard>,
    /// When the run is due next (`None`: not due, parked or finished).
    due_ms: Option<i64>,
    finished: bool,
    /// A `wait_for_event` begins: only events after this transition count.
    new_wait: bool,
    outputs: BTreeMap<String, Value>,
    outputs_changed: bool,
    call: Option<Call>,
    email: Option<Prepared>,
}

/// Advances a claimed run by one transition (two around a webhook call), from the row its
/// claim returned.
pub(super) async fn advance(inner: &Arc<Inner>, claimed: Row, token: Uuid) -> anyhow::Result<()> {
    let run_id = claimed.run_id.clone();
    let run_id = run_id.as_str();
    let mut claimed = Some(claimed);
    let mut outcome = None;
    let mut allowance_refused = false;
    loop {
        let row = match claimed.take() {
            Some(row) => row,
            None => {
                let client = inner.pool.get().await?;
                let Some(row) = load_row(&client, run_id, token).await? else { return Ok(()) };
                row
            }
        };
        let definition = definition(inner, &row.workflow_id, row.revision).await?;
        let mut tick = decide(inner, row, &definition, outcome.take(), allowance_refused).await?;
        let email = tick.email.take();
        match append(inner, &mut tick, token).await {
            Ok(()) => {}
            // The month's allowance ran out since the gate was read: the send is skipped.
            Err(AppendError::Conflict { code: Code::EmailLimitReached, .. }) if !allowance_refused => {
                allowance_refused = true;
                continue;
            }
            // The contact changed meanwhile, or the lease was lost: decide again later.
            Err(error @ (AppendError::WrongVersion { .. } | AppendError::Conflict { .. })) => {
                tracing::debug!(run = %run_id, %error, "a workflow transition lost a race");
                back_off(&inner.pool, run_id, token).await;
                return Ok(());
            }
            Err(error) => return Err(error.into()),
        }
        if let Some(prepared) = email {
            let inner = inner.clone();
            tokio::spawn(async move { hand_off(&inner, &prepared).await });
        }
        let Some(call) = tick.call.take() else { return Ok(()) };
        // The attempt is committed as going out (the run keeps its lease): now it goes.
        outcome = Some(send(inner, &call).await);
    }
}

/// The definition the run follows, from its authoring stream in the log.
async fn definition(inner: &Inner, workflow_id: &str, revision: i64) -> anyhow::Result<Arc<WorkflowDef>> {
    let cache_key = (workflow_id.to_owned(), revision);
    if let Some(found) = inner.definitions.lock().ok().and_then(|cache| cache.get(&cache_key).cloned()) {
        return Ok(found);
    }
    let client = inner.pool.get().await?;
    let stream = format!("authoring/{}/{workflow_id}", domain::workflows::WORKFLOW);
    let events = platform::log::read_streams(&client, &[stream]).await?;
    let found = events
        .iter()
        .filter_map(|stored| match stored.decode() {
            Ok(LogEvent::ResourceDefined(resource)) if resource.revision == revision => Some(resource),
            _ => None,
        })
        .next_back()
        .ok_or_else(|| anyhow::anyhow!("workflow {workflow_id} has no revision {revision}"))?;
    let definition: Arc<WorkflowDef> = Arc::new(serde_json::from_str(&found.definition_json)?);
    if let Ok(mut cache) = inner.definitions.lock() {
        if cache.len() > 10_000 {
            cache.clear();
        }
        cache.insert(cache_key, definition.clone());
    }
    Ok(definition)
}

/// Opens a sealed JSON value of the run (its input or outputs); `None` when its key is gone.
fn open_json(sealed: &[u8], keys: &platform::crypto::Keys, input: bool) -> anyhow::Result<Option<Value>> {
    if sealed.is_empty() {
        return Ok(Some(Value::Null));
    }
    let sealed = proto::Sealed::decode(sealed)?;
    let json = if input {
        platform::events::open::<proto::WorkflowInput>(Some(&sealed), keys)?.map(|input| input.json)
    } else {
        platform::events::open::<proto::WorkflowStepOutput>(Some(&sealed), keys)?.map(|output| output.json)
    };
    Ok(match json {
        Some(json) => Some(serde_json::from_str(&json)?),
        None => None,
    })
}

/// The subject whose key seals the run's data.
fn subject(row: &Row) -> String {
    row.contact_id.clone().unwrap_or_else(|| row.run_id.clone())
}

async fn contact_facts(inner: &Inner, row: &Row) -> anyhow::Result<ContactFacts> {
    let Some(contact_id) = &row.contact_id else { return Ok(ContactFacts::None) };
    let client = inner.pool.get().await?;
    let loaded = domain::records::load_records(&client, std::slice::from_ref(contact_id)).await?.pop();
    let Some((_, version, Loaded::Live { state, key })) = loaded else { return Ok(ContactFacts::Gone) };
    if state.personal.is_none() {
        return Ok(ContactFacts::Gone);
    }
    let catalog = live_schema(&client, "catalog").await?;
    let consent_keys: Vec<String> = client
        .query(
            &format!(
                "SELECT key FROM {catalog}.attributes WHERE schema_id = $1 AND definition #>> '{{consent,channel}}' = 'email'"
            ),
            &[&state.schema_id],
        )
        .await?
        .into_iter()
        .map(|row| row.get(0))
        .collect();
    let values = state.values();
    let consent =
        (!consent_keys.is_empty()).then(|| consent_keys.iter().all(|key| values.get(key) == Some(&Value::Bool(true))));
    let subscriptions = domain::email::subscriptions(&client, contact_id).await?;
    let segments_schema = live_schema(&client, "segments").await?;
    let segments = client
        .query(&format!("SELECT segment_id FROM {segments_schema}.members WHERE contact_id = $1"), &[contact_id])
        .await?
        .into_iter()
        .map(|row| row.get(0))
        .collect();
    Ok(ContactFacts::Live(Box::new(Contact { version, state, key, consent, subscriptions, segments })))
}

async fn live_schema(client: &impl GenericClient, name: &str) -> anyhow::Result<String> {
    platform::readmodel::live_schema(client, name)
        .await?
        .ok_or_else(|| anyhow::anyhow!("read model {name} has no live version yet"))
}

/// What a webhook call came to.
struct CallOutcome {
    result: AttemptResult,
    /// The answer's body, when it is JSON.
    body: Option<Value>,
}

impl Tick {
    fn new(row: Row, outputs: BTreeMap<String, Value>) -> Self {
        let base_version = row.version;
        Self {
            row,
            base_version,
            events: Vec::new(),
            streams: Vec::new(),
            guards: Vec::new(),
            due_ms: None,
            finished: false,
            new_wait: false,
            outputs,
            outputs_changed: false,
            call: None,
            email: None,
        }
    }

    fn space(&self) -> String {
        self.row.space_id.clone()
    }

    fn push(&mut self, event: LogEvent) {
        self.events.push(event);
    }

    /// Starts `step` as execution `step_count + 1`.
    fn start(&mut self, step: &Step, now: i64) -> InFlight {
        self.row.step_count += 1;
        let started = InFlight {
            index: self.row.step_count,
            step_id: step.id.clone(),
            step_type: step.kind.type_name().to_owned(),
            started_at_ms: now,
            attempt: 0,
            attempting: false,
        };
        self.push(LogEvent::WorkflowStepStarted(proto::WorkflowStepStarted {
            run_id: self.row.run_id.clone(),
            space_id: self.space(),
            index: started.index,
            step_id: step.id.clone(),
            step_type: started.step_type.clone(),
            at_ms: now,
        }));
        started
    }

    /// Finishes `started` with `status` and goes to `next`.
    fn finish(
        &mut self,
        started: &InFlight,
        status: &str,
        error: Option<(&str, String)>,
        next: Option<&str>,
        now: i64,
    ) {
        self.finish_with(started, status, error, (String::new(), None), next, now);
    }

    fn finish_with(
        &mut self,
        started: &InFlight,
        status: &str,
        error: Option<(&str, String)>,
        (email_id, output): (String, Option<Value>),
        next: Option<&str>,
        now: i64,
    ) {
        let (error_code, error_message) = error.map_or((String::new(), String::new()), |(code, message)| {
            (code.to_owned(), message.chars().take(ERROR_MAX_CHARS).collect())
        });
        if let Some(output) = &output {
            self.outputs.insert(started.step_id.clone(), output.clone());
            self.outputs_changed = true;
        }
        self.push(LogEvent::WorkflowStepFinished(proto::WorkflowStepFinished {
            run_id: self.row.run_id.clone(),
            space_id: self.space(),
            index: started.index,
            step_id: started.step_id.clone(),
            step_type: started.step_type.clone(),
            status: status.to_owned(),
            error_code,
            error_message,
            email_id,
            // Outputs are kept sealed in the run's row; the log records that there was one.
            output: None,
            next_step_id: next.unwrap_or_default().to_owned(),
            started_at_ms: started.started_at_ms,
            at_ms: now,
            gate: String::new(),
        }));
        self.row.in_flight = None;
        self.row.waiting_schema = None;
        self.row.matched_event = None;
        self.row.status = "running".to_owned();
        self.row.step_id = next.map(str::to_owned);
    }

    /// Finishes `started` as `skipped`: the send's `gate` refused it (its code and reason, and
    /// the gate); the run goes on to `next`.
    fn skip(&mut self, started: &InFlight, gate: Gate, next: Option<&str>, now: i64) {
        self.finish(started, "skipped", Some((gate.code().as_str(), gate.reason().to_owned())), next, now);
        if let Some(LogEvent::WorkflowStepFinished(finished)) = self.events.last_mut() {
            finished.gate = gate.as_str().to_owned();
        }
    }

    /// Ends the run.
    fn end(&mut self, status: &str, error: Option<(&str, String)>, now: i64) {
        let (error_code, error_message) = error.unwrap_or_default();
        self.push(LogEvent::WorkflowRunFinished(proto::WorkflowRunFinished {
            run_id: self.row.run_id.clone(),
            space_id: self.space(),
            status: status.to_owned(),
            error_code: error_code.to_owned(),
            error_message: error_message.chars().take(ERROR_MAX_CHARS).collect(),
            at_ms: now,
        }));
        self.row.status = status.to_owned();
        self.row.in_flight = None;
        self.row.waiting_schema = None;
        self.row.step_id = None;
        self.finished = true;
        self.due_ms = None;
    }

    /// Fails `started` and the run.
    fn fail(&mut self, started: &InFlight, code: &str, message: String, now: i64) {
        self.finish(started, "failed", Some((code, message.clone())), None, now);
        self.end("failed", Some((code, message)), now);
    }
}

/// Decides the run's next transition (and performs nothing outside).
async fn decide(
    inner: &Inner,
    row: Row,
    definition: &WorkflowDef,
    call_outcome: Option<CallOutcome>,
    allowance_refused: bool,
) -> anyhow::Result<Tick> {
    let now = platform::time::now_millis();
    let (paused, keys) = (row.control_paused, &row.keys);
    let input = open_json(&row.input, keys, true)?;
    let outputs: BTreeMap<String, Value> = match &row.outputs {
        Some(sealed) => open_json(sealed, keys, false)?.and_then(|value| serde_json::from_value(value).ok()),
        None => Some(BTreeMap::new()),
    }
    .unwrap_or_default();
    let mut tick = Tick::new(row, outputs);
    if tick.row.status == "completed" || tick.row.status == "exited" || tick.row.status == "failed" {
        tick.finished = true;
        return Ok(tick);
    }
    // The contact's key is gone: the contact was erased, and its run with it.
    let Some(input) = input else {
        tick.end("exited", Some(("contact_erased", "the run's contact was erased".to_owned())), now);
        return Ok(tick);
    };
    let started_waiting = tick.row.status == "waiting";
    if paused {
        // Stopped before its next step; a run that has not started only waits longer.
        if !started_waiting && !tick.row.paused {
            tick.push(LogEvent::WorkflowRunPaused(proto::WorkflowRunPaused {
                run_id: tick.row.run_id.clone(),
                space_id: tick.space(),
                at_ms: now,
            }));
        }
        tick.row.paused = true;
        tick.due_ms = None;
        tick.guards.push(still_paused(&tick.row.workflow_id));
        return Ok(tick);
    }
    if tick.row.paused {
        tick.row.paused = false;
        if !started_waiting {
            tick.push(LogEvent::WorkflowRunResumed(proto::WorkflowRunResumed {
                run_id: tick.row.run_id.clone(),
                space_id: tick.space(),
                at_ms: now,
            }));
        }
    }
    let mut contact: Option<ContactFacts> = None;
    let mut call_outcome = call_outcome;
    for _ in 0..STEPS_PER_TICK {
        if tick.finished || tick.call.is_some() || tick.due_ms.is_some() {
            break;
        }
        if tick.row.status == "waiting" {
            tick.push(LogEvent::WorkflowRunStarted(proto::WorkflowRunStarted {
                run_id: tick.row.run_id.clone(),
                space_id: tick.space(),
                at_ms: now,
            }));
            tick.row.status = "running".to_owned();
            // The entry is the run's first record: the trigger, as a journey shows it.
            tick.row.step_id = Some(definition.entry.clone());
            continue;
        }
        if let Some(in_flight) = tick.row.in_flight.clone() {
            let Some(step) = definition.step(&in_flight.step_id) else {
                anyhow::bail!("run {} is in step {}, which its workflow has not", tick.row.run_id, in_flight.step_id);
            };
            match (&step.kind, tick.row.status.as_str()) {
                (StepKind::Wait { next, .. }, _) => tick.finish(&in_flight, "completed", None, next.as_deref(), now),
                (StepKind::WaitForEvent { on_event, on_timeout, .. }, _) => match tick.row.matched_event.clone() {
                    Some(event_id) => {
                        let output = json!({"eventId": event_id});
                        let next = on_event.as_deref();
                        tick.finish_with(&in_flight, "completed", None, (String::new(), Some(output)), next, now);
                    }
                    None => tick.finish(&in_flight, "timed_out", None, on_timeout.as_deref(), now),
                },
                (StepKind::CallWebhook { url, next }, _) => {
                    match call_outcome.take() {
                        Some(outcome) => finish_call(inner, &mut tick, &in_flight, outcome, next.as_deref(), now),
                        // Started and never recorded: it may have been received. Never again.
                        None if in_flight.attempting => tick.finish(
                            &in_flight,
                            "outcome_unknown",
                            Some(("outcome_unknown", "the call's outcome was lost in a crash".to_owned())),
                            next.as_deref(),
                            now,
                        ),
                        // Between attempts: the next one goes out.
                        None => {
                            let facts = contact_of(inner, &tick.row, &mut contact).await?;
                            tick.call = Some(call_request(inner, definition, &tick.row, step, &input, facts, url)?);
                            let mut attempt = in_flight.clone();
                            attempt.attempt += 1;
                            attempt.attempting = true;
                            tick.row.in_flight = Some(attempt);
                        }
                    }
                }
                _ => anyhow::bail!("run {} has step {} in flight, which does not wait", tick.row.run_id, step.id),
            }
            if tick.row.step_id.is_none() && tick.row.in_flight.is_none() && !tick.finished {
                tick.end("completed", None, now);
            }
            continue;
        }
        let Some(step_id) = tick.row.step_id.clone() else {
            tick.end("completed", None, now);
            continue;
        };
        let Some(step) = definition.step(&step_id) else {
            anyhow::bail!("run {} goes to step {step_id}, which its workflow has not", tick.row.run_id);
        };
        if tick.row.step_count >= domain::workflows::MAX_STEP_COUNT {
            let started = tick.start(step, now);
            tick.fail(&started, "step_limit", "the run executed too many steps".to_owned(), now);
            continue;
        }
        if step.kind.needs_contact() {
            match contact_of(inner, &tick.row, &mut contact).await? {
                ContactFacts::None => {
                    let started = tick.start(step, now);
                    let message = format!("step {:?} needs a contact and the run has none", step.id);
                    tick.fail(&started, "no_contact", message, now);
                    continue;
                }
                ContactFacts::Gone => {
                    tick.end("exited", Some(("contact_erased", "the run's contact was deleted".to_owned())), now);
                    continue;
                }
                ContactFacts::Live(_) => {}
            }
        }
        let effect =
            execute(inner, &mut tick, (definition, step), &input, &mut contact, (now, allowance_refused)).await?;
        if tick.row.step_id.is_none() && tick.row.in_flight.is_none() && !tick.finished {
            tick.end("completed", None, now);
        }
        if effect {
            break;
        }
    }
    if !tick.finished && tick.due_ms.is_none() {
        // More steps to go (or a call's outcome, which the lease keeps for this process until
        // it runs out): due again at once.
        tick.due_ms = Some(now);
    }
    Ok(tick)
}

async fn contact_of<'c>(
    inner: &Inner,
    row: &Row,
    contact: &'c mut Option<ContactFacts>,
) -> anyhow::Result<&'c ContactFacts> {
    if contact.is_none() {
        *contact = Some(contact_facts(inner, row).await?);
    }
    contact.as_ref().ok_or_else(|| anyhow::anyhow!("contact facts were not loaded"))
}

/// Executes `step` (not in flight); `true` when it wrote to another stream (one per
/// transition).
async fn execute(
    inner: &Inner,
    tick: &mut Tick,
    (definition, step): (&WorkflowDef, &Step),
    input: &Value,
    contact: &mut Option<ContactFacts>,
    (now, allowance_refused): (i64, bool),
) -> anyhow::Result<bool> {
    match &step.kind {
        StepKind::IncomingWebhook { next, .. } => {
            let started = tick.start(step, now);
            tick.finish(&started, "completed", None, next.as_deref(), now);
        }
        StepKind::Wait { wait, next } => {
            let until = match wait {
                Wait::For { ms } => Some(now.saturating_add(*ms)),
                Wait::Until { at_ms } => Some(*at_ms),
                Wait::UntilAttribute { attribute, offset_ms } => match contact_of(inner, &tick.row, contact).await? {
                    ContactFacts::Live(facts) => facts
                        .state
                        .values()
                        .get(attribute)
                        .and_then(Value::as_str)
                        .and_then(parse_date)
                        .map(|at| at.saturating_add(*offset_ms)),
                    _ => None,
                },
            };
            let started = tick.start(step, now);
            match until {
                Some(until) if until > now => sleep(tick, started, until, None, now),
                Some(_) => tick.finish(&started, "completed", None, next.as_deref(), now),
                None => {
                    let message = "the contact's date attribute is missing or not a date; the wait is skipped";
                    tick.finish(
                        &started,
                        "skipped",
                        Some(("attribute_missing", message.to_owned())),
                        next.as_deref(),
                        now,
                    );
                }
            }
        }
        StepKind::WaitForEvent { event_schema_id, timeout_ms, .. } => {
            let started = tick.start(step, now);
            sleep(tick, started, now.saturating_add(*timeout_ms), Some(event_schema_id.clone()), now);
        }
        StepKind::Branch { arms, default } => {
            let facts = contact_of(inner, &tick.row, contact).await?;
            let document = branch_document(input, facts, &tick.outputs);
            let taken = arms.iter().position(|arm| filter::matches(&arm.condition, &document));
            let next = taken.map_or(default.as_deref(), |arm| arms[arm].next.as_deref());
            let started = tick.start(step, now);
            tick.finish(&started, "completed", None, next, now);
        }
        StepKind::Goto { target, max_passes, next } => {
            let passes = tick.row.passes.get(&step.id).copied().unwrap_or(0);
            let started = tick.start(step, now);
            if passes < *max_passes {
                tick.row.passes.insert(step.id.clone(), passes + 1);
                tick.finish(&started, "completed", None, Some(target), now);
            } else {
                tick.finish(&started, "completed", None, next.as_deref(), now);
            }
        }
        StepKind::Exit => {
            let started = tick.start(step, now);
            tick.finish(&started, "completed", None, None, now);
            tick.end("exited", None, now);
        }
        StepKind::SendEmail { template_id, next } => {
            let ContactFacts::Live(facts) = contact_of(inner, &tick.row, contact).await? else { return Ok(false) };
            let started = tick.start(step, now);
            if allowance_refused {
                tick.skip(&started, Gate::Allowance, next.as_deref(), now);
                return Ok(false);
            }
            return send_email(inner, tick, (&started, next.as_deref()), template_id, input, facts, now).await;
        }
        StepKind::UpdateContact { set, next } => {
            let ContactFacts::Live(facts) = contact_of(inner, &tick.row, contact).await? else { return Ok(false) };
            let started = tick.start(step, now);
            let mut values = facts.state.values();
            let mut changed = Vec::new();
            for (key, source) in set {
                let value = match source {
                    Source::Value(value) => value.clone(),
                    Source::Input(path) => at_path(input, path).cloned().unwrap_or(Value::Null),
                };
                if values.get(key) != Some(&value) {
                    values.insert(key.clone(), value);
                    changed.push(key.clone());
                }
            }
            if !changed.is_empty() {
                let personal = facts.state.personal_with_values(values);
                let mut sealed = platform::events::seal(&facts.state.record_id, &personal);
                if let Some(key) = &facts.key {
                    platform::events::encrypt(&mut sealed, key)?;
                }
                let updated = facts.state.after_update(personal, now);
                let event = updated.updated_event(sealed, changed, 0);
                tick.streams.push(StreamAppend {
                    stream_id: domain::records::stream_id(&facts.state.record_id),
                    expected: ExpectedVersion::Exactly(facts.version),
                    events: vec![NewEvent {
                        event: LogEvent::RecordUpdated(event),
                        subject_id: Some(facts.state.record_id.clone()),
                        occurred_at: platform::time::from_millis(now),
                    }],
                });
            }
            tick.finish(&started, "completed", None, next.as_deref(), now);
            *contact = None;
            return Ok(true);
        }
        StepKind::Subscribe { topic_id, next } | StepKind::Unsubscribe { topic_id, next } => {
            let ContactFacts::Live(facts) = contact_of(inner, &tick.row, contact).await? else { return Ok(false) };
            let status = if matches!(step.kind, StepKind::Subscribe { .. }) { "subscribed" } else { "unsubscribed" };
            let started = tick.start(step, now);
            if facts.subscriptions.get(topic_id).map(String::as_str) != Some(status) {
                let contact_id = facts.state.record_id.clone();
                tick.streams.push(StreamAppend {
                    stream_id: domain::email::subscriptions_stream(&contact_id),
                    expected: ExpectedVersion::Any,
                    events: vec![NewEvent {
                        event: LogEvent::SubscriptionChanged(proto::SubscriptionChanged {
                            space_id: tick.space(),
                            contact_id: contact_id.clone(),
                            topic_id: topic_id.clone(),
                            status: status.to_owned(),
                            source: "workflow".to_owned(),
                            source_id: tick.row.run_id.clone(),
                            at_ms: now,
                        }),
                        subject_id: Some(contact_id),
                        occurred_at: platform::time::from_millis(now),
                    }],
                });
            }
            tick.finish(&started, "completed", None, next.as_deref(), now);
            *contact = None;
            return Ok(true);
        }
        StepKind::CallWebhook { url, .. } => {
            let mut started = tick.start(step, now);
            let facts = contact_of(inner, &tick.row, contact).await?;
            tick.call = Some(call_request(inner, definition, &tick.row, step, input, facts, url)?);
            started.attempt = 1;
            started.attempting = true;
            tick.row.in_flight = Some(started);
            return Ok(true);
        }
    }
    Ok(false)
}

fn sleep(tick: &mut Tick, started: InFlight, until: i64, event_schema_id: Option<String>, now: i64) {
    tick.push(LogEvent::WorkflowRunSleeping(proto::WorkflowRunSleeping {
        run_id: tick.row.run_id.clone(),
        space_id: tick.space(),
        index: started.index,
        until_ms: until,
        event_schema_id: event_schema_id.clone().unwrap_or_default(),
        at_ms: now,
    }));
    tick.new_wait = event_schema_id.is_some();
    tick.row.waiting_schema = event_schema_id;
    tick.row.matched_event = None;
    tick.row.status = "sleeping".to_owned();
    tick.row.in_flight = Some(started);
    tick.due_ms = Some(until);
}

/// A date attribute's value in Unix milliseconds (`YYYY-MM-DD`, or an RFC 3339 time).
fn parse_date(text: &str) -> Option<i64> {
    if let Ok(at) = chrono::DateTime::parse_from_rfc3339(text) {
        return Some(at.timestamp_millis());
    }
    let date = chrono::NaiveDate::parse_from_str(text.get(..10)?, "%Y-%m-%d").ok()?;
    Some(date.and_hms_opt(0, 0, 0)?.and_utc().timestamp_millis())
}

/// What a branch condition reads.
fn branch_document(input: &Value, facts: &ContactFacts, outputs: &BTreeMap<String, Value>) -> Value {
    let empty = (BTreeMap::new(), BTreeSet::new());
    match facts {
        ContactFacts::Live(facts) => {
            let document = facts.state.document();
            condition_document(input, Some(&document), facts.consent, &facts.subscriptions, &facts.segments, outputs)
        }
        _ => condition_document(input, None, None, &empty.0, &empty.1, outputs),
    }
}

/// Schedules the step's email through the template send's gates; a refused gate skips it.
async fn send_email(
    inner: &Inner,
    tick: &mut Tick,
    (started, next): (&InFlight, Option<&str>),
    template_id: &str,
    input: &Value,
    facts: &Contact,
    now: i64,
) -> anyhow::Result<bool> {
    let client = inner.pool.get().await?;
    let catalog = live_schema(&client, "catalog").await?;
    let Some(authored) = Authored::load(&client, &catalog, &tick.row.space_id, template_id).await? else {
        tick.fail(started, "template_not_found", format!("template {template_id} is gone"), now);
        return Ok(false);
    };
    let template = &authored.template;
    let document = facts.state.document();
    let address = document.get("email").and_then(Value::as_str).map(str::to_owned);
    let Some(address) = address else {
        let message = "the contact has no email address".to_owned();
        tick.finish(started, "skipped", Some((Code::RecipientMissing.as_str(), message)), next, now);
        return Ok(false);
    };
    let suppressed = domain::email::is_suppressed(&client, &tick.row.space_id, &address).await?;
    drop(client);
    let recipient = Recipient {
        suppressed,
        consent: facts.consent,
        subscription: template.topic_id.as_ref().and_then(|topic_id| facts.subscriptions.get(topic_id).cloned()),
    };
    if let Err(gate) = mail::send::gate(template, &recipient) {
        tick.skip(started, gate, next, now);
        return Ok(false);
    }
    let Some(key) = &facts.key else {
        tick.fail(started, "no_data_key", "the contact has no data key".to_owned(), now);
        return Ok(false);
    };
    // The recipient's key takes the contact; the others take the input's values of the same
    // name.
    let mut context = serde_json::Map::new();
    for key_name in template.data.keys() {
        let value = if *key_name == template.recipient {
            document.clone()
        } else {
            input.get(key_name).cloned().unwrap_or(Value::Null)
        };
        context.insert(key_name.clone(), value);
    }
    context.insert("input".to_owned(), input.clone());
    let email_id = domain::workflows::email_id(&tick.row.run_id, started.index);
    let rendered = match mail::send::render_email(
        &authored,
        &email_id,
        Value::Object(context),
        &inner.settings.email.public_base_url,
    ) {
        Ok(rendered) => rendered,
        Err(error) => {
            tick.fail(
                started,
                Code::TemplateRenderFailed.as_str(),
                format!("the template does not render: {error}"),
                now,
            );
            return Ok(false);
        }
    };
    let contact_id = facts.state.record_id.clone();
    let to = EmailTo { space_id: &tick.row.space_id, contact_id: &contact_id, address: &address, key };
    let scheduled = schedule(
        &email_id,
        &authored,
        to,
        &rendered,
        ("workflow", &tick.row.run_id),
        (now, &inner.settings.email.public_base_url),
    )?;
    tick.streams.push(scheduled.stream);
    tick.guards.push(outbox::insert_guard(&email_id, &tick.row.space_id, None));
    if let Some(allowance) = &authored.allowance {
        tick.guards.push(allowance_guard(&tick.row.space_id, now, allowance.monthly));
    }
    tick.email = Some(scheduled.prepared);
    tick.finish_with(started, "completed", None, (email_id, None), next, now);
    Ok(true)
}

/// The request of a `call_webhook` step: the run's data, signed with the workflow's secret.
fn call_request(
    inner: &Inner,
    definition: &WorkflowDef,
    row: &Row,
    step: &Step,
    input: &Value,
    facts: &ContactFacts,
    url: &str,
) -> anyhow::Result<Call> {
    let index = row.in_flight.as_ref().map_or(row.step_count, |in_flight| in_flight.index);
    let contact = match facts {
        ContactFacts::Live(facts) => facts.state.document(),
        _ => Value::Null,
    };
    let body = json!({
        "type": "workflow.call",
        "timestamp": platform::time::format_millis(platform::time::now_millis()),
        "data": {
            "workflowId": row.workflow_id,
            "runId": row.run_id,
            "stepId": step.id,
            "index": index,
            "contactId": row.contact_id,
            "input": input,
            "contact": contact,
        },
    });
    let secret = match &definition.signing {
        Some(stored) => {
            let keyring = platform::crypto::keyring()?;
            let secret = domain::workflows::open_secret(keyring, &row.workflow_id, stored)?;
            domain::webhooks::signing::Secret::parse(&secret)
        }
        None => None,
    };
    let _ = inner;
    Ok(Call {
        url: url.to_owned(),
        body: serde_json::to_vec(&body)?,
        call_id: domain::workflows::call_id(&row.run_id, index),
        secret,
    })
}

/// One attempt of a call.
async fn send(inner: &Inner, call: &Call) -> CallOutcome {
    if let Some(refusal) = domain::webhooks::target::url_refusal(&call.url, inner.settings.webhooks.allow_loopback) {
        let error = format!("the target is refused: {}", refusal.message());
        return CallOutcome { result: AttemptResult::Rejected { status: None, error }, body: None };
    }
    let timestamp = chrono::Utc::now().timestamp();
    let mut request = inner
        .http
        .post(&call.url)
        .header("content-type", "application/json")
        .header("webhook-id", &call.call_id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("x-webhook-id", &call.call_id);
    if let Some(secret) = &call.secret {
        let signature = domain::webhooks::signing::signature_header(
            std::slice::from_ref(secret),
            &call.call_id,
            timestamp,
            &call.body,
        );
        request = request.header("webhook-signature", signature);
    }
    match request.body(call.body.clone()).send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            let result = classify(status, retry_after(response.headers()));
            let body = response
                .bytes()
                .await
                .ok()
                .filter(|bytes| bytes.len() <= ANSWER_MAX_BYTES)
                .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok());
            CallOutcome { result, body }
        }
        Err(error) => CallOutcome {
            result: AttemptResult::Retryable { status: None, error: describe(&error), retry_after: None },
            body: None,
        },
    }
}

/// Records a call's attempt: done, failed, or due again after the retry schedule's delay.
fn finish_call(
    inner: &Inner,
    tick: &mut Tick,
    in_flight: &InFlight,
    outcome: CallOutcome,
    next: Option<&str>,
    now: i64,
) {
    let answer = |status: Option<u16>| json!({"status": status, "body": outcome.body});
    let (status, error) = match &outcome.result {
        AttemptResult::Delivered { status } => {
            let output = answer(Some(*status));
            tick.finish_with(in_flight, "completed", None, (String::new(), Some(output)), next, now);
            return;
        }
        AttemptResult::Retryable { status, error, retry_after } => {
            let schedule = &inner.settings.webhooks.retry_schedule_ms;
            let attempt = usize::try_from(in_flight.attempt).unwrap_or(usize::MAX).saturating_sub(1);
            if let Some(delay) = schedule.get(attempt) {
                let jitter = rand::random_range(0.8..1.2);
                let delay = Duration::from_millis(*delay).mul_f64(jitter).max(retry_after.unwrap_or_default());
                let mut waiting = in_flight.clone();
                waiting.attempting = false;
                tick.row.in_flight = Some(waiting);
                tick.due_ms = Some(now.saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)));
                return;
            }
            (*status, error.clone())
        }
        AttemptResult::Rejected { status, error } => (*status, error.clone()),
        AttemptResult::Gone => (Some(410), "HTTP 410 Gone".to_owned()),
    };
    // Refused, or retried to the end of the schedule: the step and the run fail.
    let failure = ("webhook_call_failed", error);
    tick.finish_with(in_flight, "failed", Some(failure.clone()), (String::new(), Some(answer(status))), None, now);
    tick.end("failed", Some(failure), now);
}

/// The guard that parks a run only while its workflow is still paused (an unpause that
/// commits first wakes nothing this park would then hide).
fn still_paused(workflow_id: &str) -> Guard {
    Guard::exactly_one(
        "SELECT 1 FROM workflow_controls WHERE workflow_id = $1 AND paused FOR SHARE",
        vec![Box::new(workflow_id.to_owned())],
        AppendError::Conflict { code: Code::ConcurrentModification, message: "the workflow was unpaused".to_owned() },
    )
}

/// Appends the transition with the row's update under the run's lease.
async fn append(inner: &Inner, tick: &mut Tick, token: Uuid) -> Result<(), AppendError> {
    let row = &tick.row;
    let count = i64::try_from(tick.events.len()).unwrap_or(0);
    let outputs = if tick.outputs_changed {
        let Some(key) = row.keys.get(&subject(row)) else {
            return Err(AppendError::Failed(format!("run {} has no data key", row.run_id)));
        };
        let json = serde_json::to_string(&tick.outputs).map_err(|error| AppendError::Failed(error.to_string()))?;
        let mut sealed = platform::events::seal(&subject(row), &proto::WorkflowStepOutput { json });
        platform::events::encrypt(&mut sealed, key)?;
        Some(sealed.encode_to_vec())
    } else {
        row.outputs.clone()
    };
    let in_flight =
        row.in_flight.as_ref().map(serde_json::to_value).transpose().map_err(|e| AppendError::Failed(e.to_string()))?;
    let passes = serde_json::to_value(&row.passes).map_err(|error| AppendError::Failed(error.to_string()))?;
    // The set form's row: the same values, with sentinels for what an array cannot hold as
    // SQL NULL (no due time: -1; no call in flight: JSON null; no outputs: empty bytes).
    let set_row = vec![
        SetValue::Text(Some(row.run_id.clone())),
        SetValue::Uuid(token),
        SetValue::Text(Some(row.status.clone())),
        SetValue::Text(row.step_id.clone()),
        SetValue::Int(row.step_count),
        SetValue::BigInt(tick.base_version + count),
        SetValue::BigInt(tick.due_ms.unwrap_or(-1)),
        SetValue::Int(i32::from(row.paused)),
        SetValue::Json(in_flight.clone().unwrap_or(Value::Null)),
        SetValue::Text(row.waiting_schema.clone()),
        SetValue::Int(i32::from(tick.new_wait)),
        SetValue::Json(passes.clone()),
        SetValue::Bytes(outputs.clone().unwrap_or_default()),
        SetValue::Int(i32::from(tick.finished)),
        SetValue::Int(i32::from(tick.call.is_some())),
    ];
    let mut guards: Vec<Guard> = Vec::new();
    guards.push(
        Guard::exactly_one(
            "UPDATE workflow_runs SET status = $3, step_id = $4, step_count = $5, version = $6,
             due_at = CASE WHEN $7::bigint IS NULL THEN NULL ELSE to_timestamp($7::bigint / 1000.0) END,
             paused = $8, in_flight = $9, waiting_schema = $10,
             waiting_after = CASE WHEN $11 THEN (SELECT position FROM log_head)
                                  WHEN $10::text IS NULL THEN NULL ELSE waiting_after END,
             matched_event = CASE WHEN $10::text IS NULL OR $11 THEN NULL ELSE matched_event END,
             passes = $12, outputs = $13, finished_at = CASE WHEN $14 THEN clock_timestamp() END,
             lease_token = CASE WHEN $15 THEN lease_token END,
             lease_until = CASE WHEN $15 THEN lease_until END
         WHERE run_id = $1 AND lease_token = $2",
            vec![
                Box::new(row.run_id.clone()),
                Box::new(token),
                Box::new(row.status.clone()),
                Box::new(row.step_id.clone()),
                Box::new(row.step_count),
                Box::new(tick.base_version + count),
                Box::new(tick.due_ms),
                Box::new(row.paused),
                Box::new(in_flight),
                Box::new(row.waiting_schema.clone()),
                Box::new(tick.new_wait),
                Box::new(passes),
                Box::new(outputs),
                Box::new(tick.finished),
                // A call keeps its lease while it goes out; every other transition gives it back.
                Box::new(tick.call.is_some()),
            ],
            AppendError::Conflict {
                code: Code::ConcurrentModification,
                message: "the run's lease was lost".to_owned(),
            },
        )
        .with_set(
            "UPDATE workflow_runs r SET status = u.status, step_id = u.step_id, step_count = u.step_count,
             version = u.version,
             due_at = CASE WHEN u.due_ms < 0 THEN NULL ELSE to_timestamp(u.due_ms::bigint / 1000.0) END,
             paused = u.paused = 1, in_flight = NULLIF(u.in_flight, 'null'::jsonb), waiting_schema = u.waiting_schema,
             waiting_after = CASE WHEN u.new_wait = 1 THEN (SELECT position FROM log_head)
                                  WHEN u.waiting_schema IS NULL THEN NULL ELSE r.waiting_after END,
             matched_event = CASE WHEN u.waiting_schema IS NULL OR u.new_wait = 1 THEN NULL ELSE r.matched_event END,
             passes = u.passes, outputs = NULLIF(u.outputs, ''::bytea),
             finished_at = CASE WHEN u.finished = 1 THEN clock_timestamp() END,
             lease_token = CASE WHEN u.keep_lease = 1 THEN r.lease_token END,
             lease_until = CASE WHEN u.keep_lease = 1 THEN r.lease_until END
         FROM unnest($1::text[], $2::uuid[], $3::text[], $4::text[], $5::int4[], $6::bigint[], $7::bigint[],
                     $8::int4[], $9::jsonb[], $10::text[], $11::int4[], $12::jsonb[], $13::bytea[], $14::int4[],
                     $15::int4[])
             AS u(run_id, token, status, step_id, step_count, version, due_ms, paused, in_flight, waiting_schema,
                  new_wait, passes, outputs, finished, keep_lease)
         WHERE r.run_id = u.run_id AND r.lease_token = u.token",
            set_row,
        ),
    );
    guards.extend(std::mem::take(&mut tick.guards));
    let mut streams = std::mem::take(&mut tick.streams);
    if !tick.events.is_empty() {
        streams.push(StreamAppend {
            stream_id: run_stream_id(&row.run_id),
            expected: ExpectedVersion::Exactly(tick.base_version),
            events: tick
                .events
                .iter()
                .map(|event| NewEvent {
                    event: event.clone(),
                    subject_id: row.contact_id.clone(),
                    occurred_at: platform::time::from_millis(platform::time::now_millis()),
                })
                .collect(),
        });
    }
    let metadata = Metadata::in_space(&row.space_id);
    if streams.is_empty() {
        // Only the row changes (a retry's due time, a run parked before it started).
        return apply_guards_alone(inner, guards).await;
    }
    inner.log.append(AppendRequest::new(metadata, streams, guards)).await.map(|_| ())
}

/// Runs guards in a transaction of their own (a transition with no event).
async fn apply_guards_alone(inner: &Inner, guards: Vec<Guard>) -> Result<(), AppendError> {
    let mut client = inner.pool.get().await?;
    let transaction = client.transaction().await?;
    for guard in guards {
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            guard.params.iter().map(|param| param.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync)).collect();
        let rows = transaction.execute(guard.sql, &params).await?;
        if guard.expect_rows.is_some_and(|expected| expected != rows) {
            return Err(guard.conflict);
        }
    }
    transaction.commit().await?;
    Ok(())
}

/// Hands an email a run scheduled to the relay; the outbox worker finishes what this leaves.
async fn hand_off(inner: &Inner, prepared: &Prepared) {
    let email_id = &prepared.parties.email_id;
    let lease = match inner.claims.claim(email_id, inner.settings.email_lease()).await {
        Ok(Some(lease)) => lease,
        Ok(None) => return,
        Err(error) => {
            tracing::warn!(error = %format!("{error:#}"), email = %email_id, "could not claim a workflow email's hand-off");
            return;
        }
    };
    let started = Instant::now();
    let _ = outbox::hand_off(&inner.pool, &inner.log, &inner.mailer, &lease, prepared, None).await;
    metrics::histogram!("workflow_email_handoff_seconds").record(started.elapsed().as_secs_f64());
}
