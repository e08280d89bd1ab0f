//! What a claimed run does next, decided without IO: from the run's row, its definition and
//! the facts loaded for it, the transition to append (the run's events, the other streams'
//! events and guards, the row's next state) and what to do once it is committed (a webhook
//! call, an email's hand-off).
//!
//! A decision executes steps until one must wait (a wait, a webhook call), writes to another
//! stream (an email, a record change, a subscription: one such effect per transition), or
//! the run ends. It reads the contact, a send step's template and whether an address is
//! suppressed only when a step reaches for them: a fact not loaded yet is asked for
//! ([`Decided::Needs`]), and the decision is made again, from the start, once it is there
//! (`run.rs` loads it).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use domain::records::RecordState;
use domain::webhooks::signing::Secret;
use domain::workflows::{EngagementAction, Source, Step, StepKind, Wait, WorkflowDef, at_path, condition_document};
use mail::outbox::{self, Prepared};
use mail::send::{Authored, EmailTo, Gate, Verdict, allowance_guard, schedule};
use mail::skipped::{DecidedBy, Skip};
use platform::crypto::DataKey;
use platform::error::Code;
use platform::events::LogEvent;
use platform::log::{AppendError, ExpectedVersion, Guard, NewEvent, StreamAppend};
use platform::proto;
use prost::Message;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::workers::outbound::AttemptResult;

/// Steps one transition executes at most (a loop of steps without effects is bounded by its
/// `goto`, and each transition by this).
const STEPS_PER_TICK: usize = 64;
/// The longest error message kept.
const ERROR_MAX_CHARS: usize = 500;

/// What a decision reads beyond the run's row and definition, loaded when a step reaches
/// for it (see [`Need`]).
#[derive(Default)]
pub(super) struct Facts {
    /// The run's contact, once a step needed it.
    pub(super) contact: Option<ContactFacts>,
    /// Send steps' templates with their sender, domain and allowance, by template id (`None`:
    /// the template is gone).
    pub(super) templates: BTreeMap<String, Option<Authored>>,
    /// Whether an address is suppressed in the run's space.
    pub(super) suppressed: BTreeMap<String, bool>,
    /// The secret the workflow's calls are signed with, opened (`Some(None)`: it signs
    /// nothing).
    pub(super) secret: Option<Option<Secret>>,
    /// What a person did with the run's emails, by email id.
    pub(super) engagement: BTreeMap<String, Engaged>,
    /// The fact that decided a gate's refusal, by gate (`None`: no event decided).
    pub(super) decided_by: BTreeMap<&'static str, Option<DecidedBy>>,
    /// The contact's marketing sends within the send policy's caps' windows, once a
    /// marketing send under caps needed them.
    pub(super) sent: Option<Vec<mail::send::Sent>>,
}

/// Whether a person opened an email and followed one of its links (machines' opens and
/// clicks are left out).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Engaged {
    pub(super) opened: bool,
    pub(super) clicked: bool,
}

impl Engaged {
    fn did(self, action: EngagementAction) -> bool {
        match action {
            EngagementAction::Opened => self.opened,
            EngagementAction::Clicked => self.clicked,
        }
    }
}

impl Facts {
    fn contact(&self) -> Result<&ContactFacts, Stop> {
        self.contact.as_ref().ok_or(Stop::Needs(Need::Contact))
    }

    /// What a person did with `email_ids`, once loaded.
    fn engaged(&self, email_ids: &[String]) -> Result<Vec<Engaged>, Stop> {
        let missing: Vec<String> = email_ids.iter().filter(|id| !self.engagement.contains_key(*id)).cloned().collect();
        if !missing.is_empty() {
            return Err(Stop::Needs(Need::Engagement(missing)));
        }
        Ok(email_ids.iter().map(|id| self.engagement.get(id).copied().unwrap_or_default()).collect())
    }
}

/// The email a send step of the run last scheduled (its output), if any.
fn email_of(outputs: &BTreeMap<String, Value>, step_id: &str) -> Option<String> {
    outputs.get(step_id)?.get("emailId")?.as_str().map(str::to_owned)
}

/// Whether a person did `action` with the email the send step `sent_by` scheduled (`false`
/// when it scheduled none).
fn engaged_with(
    outputs: &BTreeMap<String, Value>,
    facts: &Facts,
    sent_by: &str,
    action: EngagementAction,
) -> Result<(Option<String>, bool), Stop> {
    let Some(email_id) = email_of(outputs, sent_by) else { return Ok((None, false)) };
    let engaged = facts.engaged(std::slice::from_ref(&email_id))?.first().is_some_and(|engaged| engaged.did(action));
    Ok((Some(email_id), engaged))
}

/// A fact a decision needs before it can be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Need {
    /// The run's contact: its record, consent, subscriptions and segments.
    Contact,
    /// A template, by id, with its sender, domain and the space's allowance.
    Template(String),
    /// Whether an address is suppressed.
    Suppression(String),
    /// The workflow's signing secret, opened.
    Secret,
    /// What a person did with these emails of the run.
    Engagement(Vec<String>),
    /// The fact that decided a gate's refusal of a send to `address` (of a template with
    /// `topic_id`; for a cap, the position of the send that filled it, as the decision named it).
    DecidedBy { gate: Gate, address: String, topic_id: Option<String>, filled_by: Option<i64> },
    /// The contact's marketing sends since `since_ms` (the caps count them).
    MarketingSends { since_ms: i64 },
}

/// What a decision is given besides the run and the facts.
pub(super) struct Given<'a> {
    pub(super) now: i64,
    /// The factor a retry's delay is scaled by (0.8 to 1.2), drawn once per transition.
    pub(super) jitter: f64,
    /// The month's allowance refused the email this transition scheduled: the send is skipped.
    pub(super) allowance_refused: bool,
    /// The outcome of the webhook call the run has in flight, just made.
    pub(super) call_outcome: Option<&'a CallOutcome>,
    /// The delays of a call's retries (`APP__WEBHOOKS__RETRY_SCHEDULE_MS`).
    pub(super) retry_schedule_ms: &'a [u64],
    /// The base of the links in email (`APP__EMAIL__PUBLIC_BASE_URL`) and the keys that sign
    /// tracking links.
    pub(super) site: &'a mail::send::Site,
}

/// A decision: the transition, or the fact to load first.
pub(super) enum Decided {
    Tick(Box<Tick>),
    Needs(Need),
}

/// Why a transition was not made: a fact is missing, or the run is broken.
enum Stop {
    Needs(Need),
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for Stop {
    fn from(error: anyhow::Error) -> Self {
        Self::Failed(error)
    }
}

/// The step started and not finished: a sleeping wait, or a webhook call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct InFlight {
    pub(super) index: i32,
    pub(super) step_id: String,
    pub(super) step_type: String,
    pub(super) started_at_ms: i64,
    /// A webhook call's attempts so far.
    #[serde(default)]
    pub(super) attempt: u32,
    /// A webhook call's attempt is going out (committed before it does).
    #[serde(default)]
    pub(super) attempting: bool,
}

/// A run's status (`workflow_runs.status`, and a finished run's `WorkflowRunFinished.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RunStatus {
    /// Requested, not started.
    Waiting,
    Running,
    /// In a wait step, due at its end (or woken by what it waits for).
    Sleeping,
    Completed,
    Exited,
    Failed,
}

impl RunStatus {
    /// The status as the database and the log hold it.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            RunStatus::Waiting => "waiting",
            RunStatus::Running => "running",
            RunStatus::Sleeping => "sleeping",
            RunStatus::Completed => "completed",
            RunStatus::Exited => "exited",
            RunStatus::Failed => "failed",
        }
    }

    /// The status a row holds; one of no known value is an error.
    pub(super) fn parse(text: &str) -> anyhow::Result<Self> {
        Ok(match text {
            "waiting" => RunStatus::Waiting,
            "running" => RunStatus::Running,
            "sleeping" => RunStatus::Sleeping,
            "completed" => RunStatus::Completed,
            "exited" => RunStatus::Exited,
            "failed" => RunStatus::Failed,
            other => anyhow::bail!("a workflow run's status {other:?} is none the engine knows"),
        })
    }
}

/// A run's row as a tick reads it and writes it back.
#[derive(Clone)]
pub(super) struct Row {
    pub(super) run_id: String,
    pub(super) workflow_id: String,
    pub(super) space_id: String,
    pub(super) revision: i64,
    pub(super) contact_id: Option<String>,
    pub(super) status: RunStatus,
    pub(super) step_id: Option<String>,
    pub(super) step_count: i32,
    pub(super) version: i64,
    pub(super) paused: bool,
    pub(super) in_flight: Option<InFlight>,
    pub(super) waiting_schema: Option<String>,
    pub(super) matched_event: Option<String>,
    pub(super) passes: BTreeMap<String, u32>,
    pub(super) input: Vec<u8>,
    pub(super) outputs: Option<Vec<u8>>,
    /// The workflow's pause control, read with the row.
    pub(super) control_paused: bool,
    /// The data key that seals the run's input and outputs (none: erased), read with the row.
    pub(super) keys: platform::crypto::Keys,
}

/// A contact as steps read it.
pub(super) struct Contact {
    pub(super) version: i64,
    pub(super) state: RecordState,
    pub(super) key: Option<DataKey>,
    pub(super) consent: Option<bool>,
    /// The keys of the contact's email consent attributes (`consent` is whether all are true).
    pub(super) consent_keys: Vec<String>,
    pub(super) subscriptions: BTreeMap<String, String>,
    pub(super) segments: BTreeSet<String>,
    /// The contact schema's attributes, which bound what an update step writes.
    pub(super) attributes: Vec<domain::catalog::AttributeEntry>,
}

/// What a run's contact is now.
pub(super) enum ContactFacts {
    /// The run has none.
    None,
    /// Being deleted or erased: the run ends.
    Gone,
    Live(Box<Contact>),
}

/// A webhook call to make after the transition that starts (or retries) it is committed.
pub(super) struct Call {
    pub(super) url: String,
    pub(super) body: Vec<u8>,
    pub(super) call_id: String,
    pub(super) secret: Option<domain::webhooks::signing::Secret>,
}

/// One transition being built.
pub(super) struct Tick {
    pub(super) row: Row,
    /// The row's version before this transition.
    pub(super) base_version: i64,
    pub(super) events: Vec<LogEvent>,
    pub(super) streams: Vec<StreamAppend>,
    pub(super) guards: Vec<Guard>,
    /// When the run is due next (`None`: not due, parked or finished).
    pub(super) due_ms: Option<i64>,
    pub(super) finished: bool,
    /// A `wait_for_event` begins: only events after this transition count.
    pub(super) new_wait: bool,
    pub(super) outputs: BTreeMap<String, Value>,
    pub(super) outputs_changed: bool,
    pub(super) call: Option<Call>,
    pub(super) email: Option<Prepared>,
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

/// The run's sealed data, opened once per tick (a decision made again after loading a fact
/// reads it from here).
pub(super) struct Opened {
    /// The run's input; `None` when its key is gone (the contact was erased).
    pub(super) input: Option<Value>,
    /// The outputs of the steps so far, by step id.
    pub(super) outputs: BTreeMap<String, Value>,
}

/// Opens the run's input and outputs with its data key.
pub(super) fn open(row: &Row) -> anyhow::Result<Opened> {
    let input = open_json(&row.input, &row.keys, true)?;
    let outputs = match &row.outputs {
        Some(sealed) => open_json(sealed, &row.keys, false)?.and_then(|value| serde_json::from_value(value).ok()),
        None => Some(BTreeMap::new()),
    }
    .unwrap_or_default();
    Ok(Opened { input, outputs })
}

/// The subject whose key seals the run's data.
pub(super) fn subject(row: &Row) -> String {
    row.contact_id.clone().unwrap_or_else(|| row.run_id.clone())
}

/// What a webhook call came to.
pub(super) struct CallOutcome {
    pub(super) result: AttemptResult,
    /// The answer's body, when it is JSON.
    pub(super) body: Option<Value>,
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
        self.row.status = RunStatus::Running;
        self.row.step_id = next.map(str::to_owned);
    }

    /// Finishes `started` as `skipped`: the send's `gate` refused it (its code and reason, the
    /// gate, and the email whose story says so); the run goes on to `next`.
    fn skip(&mut self, started: &InFlight, (gate, email_id): (Gate, &str), next: Option<&str>, now: i64) {
        self.finish(started, "skipped", Some((gate.code().as_str(), gate.reason().to_owned())), next, now);
        if let Some(LogEvent::WorkflowStepFinished(finished)) = self.events.last_mut() {
            finished.gate = gate.as_str().to_owned();
            finished.email_id = email_id.to_owned();
        }
    }

    /// Ends the run.
    fn end(&mut self, status: RunStatus, error: Option<(&str, String)>, now: i64) {
        let (error_code, error_message) = error.unwrap_or_default();
        self.push(LogEvent::WorkflowRunFinished(proto::WorkflowRunFinished {
            run_id: self.row.run_id.clone(),
            space_id: self.space(),
            status: status.as_str().to_owned(),
            error_code: error_code.to_owned(),
            error_message: error_message.chars().take(ERROR_MAX_CHARS).collect(),
            at_ms: now,
        }));
        self.row.status = status;
        self.row.in_flight = None;
        self.row.waiting_schema = None;
        self.row.step_id = None;
        self.finished = true;
        self.due_ms = None;
    }

    /// Fails `started` and the run.
    fn fail(&mut self, started: &InFlight, code: &str, message: String, now: i64) {
        self.finish(started, "failed", Some((code, message.clone())), None, now);
        self.end(RunStatus::Failed, Some((code, message)), now);
    }
}

/// Decides the run's next transition, or names the fact it needs first.
pub(super) fn decide(
    (row, opened): (&Row, &Opened),
    definition: &WorkflowDef,
    facts: &Facts,
    given: &Given<'_>,
) -> anyhow::Result<Decided> {
    match transition((row.clone(), opened), definition, facts, given) {
        Ok(tick) => Ok(Decided::Tick(Box::new(tick))),
        Err(Stop::Needs(need)) => Ok(Decided::Needs(need)),
        Err(Stop::Failed(error)) => Err(error),
    }
}

fn transition(
    (row, opened): (Row, &Opened),
    definition: &WorkflowDef,
    facts: &Facts,
    given: &Given<'_>,
) -> Result<Tick, Stop> {
    let (now, allowance_refused) = (given.now, given.allowance_refused);
    let paused = row.control_paused;
    let input = opened.input.clone();
    let mut tick = Tick::new(row, opened.outputs.clone());
    if matches!(tick.row.status, RunStatus::Completed | RunStatus::Exited | RunStatus::Failed) {
        tick.finished = true;
        return Ok(tick);
    }
    // The contact's key is gone: the contact was erased, and its run with it.
    let Some(input) = input else {
        tick.end(RunStatus::Exited, Some(("contact_erased", "the run's contact was erased".to_owned())), now);
        return Ok(tick);
    };
    let started_waiting = tick.row.status == RunStatus::Waiting;
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
    let mut call_outcome = given.call_outcome;
    for _ in 0..STEPS_PER_TICK {
        if tick.finished || tick.call.is_some() || tick.due_ms.is_some() {
            break;
        }
        if tick.row.status == RunStatus::Waiting {
            tick.push(LogEvent::WorkflowRunStarted(proto::WorkflowRunStarted {
                run_id: tick.row.run_id.clone(),
                space_id: tick.space(),
                at_ms: now,
            }));
            tick.row.status = RunStatus::Running;
            // The entry is the run's first record: the trigger, as a journey shows it.
            tick.row.step_id = Some(definition.entry.clone());
            continue;
        }
        if let Some(in_flight) = tick.row.in_flight.clone() {
            let Some(step) = definition.step(&in_flight.step_id) else {
                return Err(Stop::Failed(anyhow::anyhow!(
                    "run {} is in step {}, which its workflow has not",
                    tick.row.run_id,
                    in_flight.step_id
                )));
            };
            match (&step.kind, tick.row.status) {
                (StepKind::Wait { next, .. }, _) => tick.finish(&in_flight, "completed", None, next.as_deref(), now),
                (StepKind::WaitForEvent { on_event, on_timeout, .. }, _) => match tick.row.matched_event.clone() {
                    Some(event_id) => {
                        let output = json!({"eventId": event_id});
                        let next = on_event.as_deref();
                        tick.finish_with(&in_flight, "completed", None, (String::new(), Some(output)), next, now);
                    }
                    None => tick.finish(&in_flight, "timed_out", None, on_timeout.as_deref(), now),
                },
                (StepKind::WaitForEngagement { step: sent_by, action, on_engaged, on_timeout, .. }, _) => {
                    // Matched by the follower; at the timeout, what the log says (an open
                    // recorded while the wait began is not missed).
                    let (email_id, engaged) = match tick.row.matched_event.clone() {
                        Some(email_id) => (Some(email_id), true),
                        None => engaged_with(&tick.outputs, facts, sent_by, *action)?,
                    };
                    if engaged {
                        let output = json!({"emailId": email_id});
                        let next = on_engaged.as_deref();
                        tick.finish_with(&in_flight, "completed", None, (String::new(), Some(output)), next, now);
                    } else {
                        tick.finish(&in_flight, "timed_out", None, on_timeout.as_deref(), now);
                    }
                }
                (StepKind::CallWebhook { url, next }, _) => {
                    match call_outcome.take() {
                        Some(outcome) => finish_call(given, &mut tick, &in_flight, outcome, next.as_deref()),
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
                            let contact = facts.contact()?;
                            tick.call = Some(call_request(given, facts, &tick.row, step, &input, contact, url)?);
                            let mut attempt = in_flight.clone();
                            attempt.attempt += 1;
                            attempt.attempting = true;
                            tick.row.in_flight = Some(attempt);
                        }
                    }
                }
                _ => {
                    return Err(Stop::Failed(anyhow::anyhow!(
                        "run {} has step {} in flight, which does not wait",
                        tick.row.run_id,
                        step.id
                    )));
                }
            }
            if tick.row.step_id.is_none() && tick.row.in_flight.is_none() && !tick.finished {
                tick.end(RunStatus::Completed, None, now);
            }
            continue;
        }
        let Some(step_id) = tick.row.step_id.clone() else {
            tick.end(RunStatus::Completed, None, now);
            continue;
        };
        let Some(step) = definition.step(&step_id) else {
            return Err(Stop::Failed(anyhow::anyhow!(
                "run {} goes to step {step_id}, which its workflow has not",
                tick.row.run_id
            )));
        };
        if tick.row.step_count >= domain::workflows::MAX_STEP_COUNT {
            let started = tick.start(step, now);
            tick.fail(&started, "step_limit", "the run executed too many steps".to_owned(), now);
            continue;
        }
        if step.kind.needs_contact() {
            match facts.contact()? {
                ContactFacts::None => {
                    let started = tick.start(step, now);
                    let message = format!("step {:?} needs a contact and the run has none", step.id);
                    tick.fail(&started, "no_contact", message, now);
                    continue;
                }
                ContactFacts::Gone => {
                    tick.end(
                        RunStatus::Exited,
                        Some(("contact_erased", "the run's contact was deleted".to_owned())),
                        now,
                    );
                    continue;
                }
                ContactFacts::Live(_) => {}
            }
        }
        let effect = execute(&mut tick, step, &input, facts, (given, allowance_refused))?;
        if tick.row.step_id.is_none() && tick.row.in_flight.is_none() && !tick.finished {
            tick.end(RunStatus::Completed, None, now);
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

/// Executes `step` (not in flight); `true` when it wrote to another stream (one per
/// transition).
fn execute(
    tick: &mut Tick,
    step: &Step,
    input: &Value,
    facts: &Facts,
    (given, allowance_refused): (&Given<'_>, bool),
) -> Result<bool, Stop> {
    let now = given.now;
    match &step.kind {
        StepKind::IncomingWebhook { next, .. } => {
            let started = tick.start(step, now);
            tick.finish(&started, "completed", None, next.as_deref(), now);
        }
        StepKind::Wait { wait, next } => {
            let until = match wait {
                Wait::For { ms } => Some(now.saturating_add(*ms)),
                Wait::Until { at_ms } => Some(*at_ms),
                Wait::UntilAttribute { attribute, offset_ms } => match facts.contact()? {
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
        StepKind::WaitForEngagement { step: sent_by, action, timeout_ms, on_engaged, .. } => {
            let (email_id, engaged) = engaged_with(&tick.outputs, facts, sent_by, *action)?;
            let started = tick.start(step, now);
            if engaged {
                let output = json!({"emailId": email_id});
                tick.finish_with(
                    &started,
                    "completed",
                    None,
                    (String::new(), Some(output)),
                    on_engaged.as_deref(),
                    now,
                );
            } else {
                // Without an email (its send was skipped) only the timeout ends the wait.
                let waiting = email_id.map(|email_id| action.waiting_key(&email_id));
                sleep(tick, started, now.saturating_add(*timeout_ms), waiting, now);
            }
        }
        StepKind::Branch { arms, default } => {
            let outputs = with_engagement(&tick.outputs, arms, facts)?;
            let document = branch_document(input, facts.contact()?, &outputs);
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
            tick.end(RunStatus::Exited, None, now);
        }
        StepKind::SendEmail { template_id, next } => {
            let ContactFacts::Live(contact) = facts.contact()? else { return Ok(false) };
            let started = tick.start(step, now);
            let gates = (facts, given, allowance_refused);
            return send_email(tick, (&started, next.as_deref()), template_id, input, gates, contact);
        }
        StepKind::UpdateContact { set, next } => {
            let ContactFacts::Live(live) = facts.contact()? else { return Ok(false) };
            let started = tick.start(step, now);
            let mut values = live.state.values();
            let mut changed = Vec::new();
            for (key, source) in set {
                let value = match source {
                    Source::Value(value) => value.clone(),
                    Source::Input(path) => at_path(input, path).cloned().unwrap_or(Value::Null),
                };
                // An attribute's value is held to its type and maximum, as on every door
                // that writes a record; the step (and the run) fails naming the field.
                let value = if live.attributes.iter().any(|a| &a.key == key) {
                    match domain::attributes::writable_record_value(&live.attributes, key, value) {
                        Ok(value) => value,
                        Err(issue) => {
                            let code = issue.code.unwrap_or(Code::InvalidAttributeValue);
                            tick.fail(&started, code.as_str(), issue.message, now);
                            return Ok(true);
                        }
                    }
                } else {
                    value
                };
                if values.get(key) != Some(&value) {
                    values.insert(key.clone(), value);
                    changed.push(key.clone());
                }
            }
            if !changed.is_empty() {
                let personal = live.state.personal_with_values(values);
                let mut sealed = platform::events::seal(&live.state.record_id, &personal);
                if let Some(key) = &live.key {
                    platform::events::encrypt(&mut sealed, key)?;
                }
                let updated = live.state.after_update(personal, now);
                let mut event = updated.updated_event(sealed, changed, 0);
                event.change_source = "workflow".to_owned();
                event.change_source_id.clone_from(&tick.row.run_id);
                tick.streams.push(StreamAppend {
                    stream_id: domain::records::stream_id(&live.state.record_id),
                    expected: ExpectedVersion::Exactly(live.version),
                    events: vec![NewEvent {
                        event: LogEvent::RecordUpdated(event),
                        subject_id: Some(live.state.record_id.clone()),
                        occurred_at: platform::time::from_millis(now),
                    }],
                });
            }
            tick.finish(&started, "completed", None, next.as_deref(), now);
            return Ok(true);
        }
        StepKind::Subscribe { topic_id, next } | StepKind::Unsubscribe { topic_id, next } => {
            let ContactFacts::Live(live) = facts.contact()? else { return Ok(false) };
            let status = if matches!(step.kind, StepKind::Subscribe { .. }) { "subscribed" } else { "unsubscribed" };
            let started = tick.start(step, now);
            if live.subscriptions.get(topic_id).map(String::as_str) != Some(status) {
                let contact_id = live.state.record_id.clone();
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
            return Ok(true);
        }
        StepKind::CallWebhook { url, .. } => {
            let mut started = tick.start(step, now);
            let contact = facts.contact()?;
            tick.call = Some(call_request(given, facts, &tick.row, step, input, contact, url)?);
            started.attempt = 1;
            started.attempting = true;
            tick.row.in_flight = Some(started);
            return Ok(true);
        }
    }
    Ok(false)
}

/// The run's step outputs as a branch reads them: when an arm asks whether a send step's
/// email was `opened` or `clicked` (`steps.<id>.opened`), each send step's output with what a
/// person did with its email.
fn with_engagement(
    outputs: &BTreeMap<String, Value>,
    arms: &[domain::workflows::Arm],
    facts: &Facts,
) -> Result<BTreeMap<String, Value>, Stop> {
    let asks = arms.iter().any(|arm| {
        condition_fields(&arm.condition).iter().any(|field| {
            let mut segments = field.split('.');
            segments.next() == Some("steps")
                && segments.next().is_some()
                && matches!(segments.next(), Some("opened" | "clicked"))
        })
    });
    if !asks {
        return Ok(outputs.clone());
    }
    let sent: Vec<(String, String)> = outputs
        .keys()
        .filter_map(|step_id| email_of(outputs, step_id).map(|email_id| (step_id.clone(), email_id)))
        .collect();
    let email_ids: Vec<String> = sent.iter().map(|(_, email_id)| email_id.clone()).collect();
    let engaged = facts.engaged(&email_ids)?;
    let mut outputs = outputs.clone();
    for ((step_id, _), engaged) in sent.iter().zip(engaged) {
        if let Some(Value::Object(output)) = outputs.get_mut(step_id) {
            output.insert("opened".to_owned(), Value::Bool(engaged.opened));
            output.insert("clicked".to_owned(), Value::Bool(engaged.clicked));
        }
    }
    Ok(outputs)
}

/// The field paths a condition reads.
fn condition_fields(filter: &filter::Filter) -> Vec<&str> {
    match filter {
        filter::Filter::All(parts) | filter::Filter::Any(parts) => parts.iter().flat_map(condition_fields).collect(),
        filter::Filter::Not(inner) => condition_fields(inner),
        filter::Filter::Condition(condition) => vec![condition.field.as_str()],
        filter::Filter::Performed(_) | filter::Filter::Engaged(_) => Vec::new(),
    }
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
    tick.row.status = RunStatus::Sleeping;
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

/// Schedules the step's email through the template send's gates; a refused gate (or the
/// allowance, refused by the append this decision follows) skips it, with the email's
/// `EmailSkipped`.
fn send_email(
    tick: &mut Tick,
    (started, next): (&InFlight, Option<&str>),
    template_id: &str,
    input: &Value,
    (facts, given, allowance_refused): (&Facts, &Given<'_>, bool),
    contact: &Contact,
) -> Result<bool, Stop> {
    let now = given.now;
    let Some(authored) = facts.templates.get(template_id) else {
        return Err(Stop::Needs(Need::Template(template_id.to_owned())));
    };
    let Some(authored) = authored else {
        tick.fail(started, "template_not_found", format!("template {template_id} is gone"), now);
        return Ok(false);
    };
    let template = &authored.template;
    let email_id = domain::workflows::email_id(&tick.row.run_id, started.index);
    let document = contact.state.document();
    let address = document.get("email").and_then(Value::as_str).map(str::to_owned);
    let suppressed = match &address {
        Some(address) => match facts.suppressed.get(address) {
            Some(&suppressed) => suppressed,
            None => return Err(Stop::Needs(Need::Suppression(address.clone()))),
        },
        None => false,
    };
    // Only a marketing send under frequency caps reads the contact's sends.
    let lookback = authored.policy.as_ref().and_then(mail::send::SendPolicy::lookback_ms);
    let sent: &[mail::send::Sent] = match (lookback, &facts.sent) {
        (Some(_), Some(sent)) if template.kind == "marketing" => sent,
        (Some(lookback), None) if template.kind == "marketing" => {
            return Err(Stop::Needs(Need::MarketingSends { since_ms: now - lookback }));
        }
        _ => &[],
    };
    let verdict = mail::send::decide(&mail::send::Facts {
        kind: mail::send::Kind::of(&template.kind),
        topic_id: template.topic_id.as_deref(),
        contact: Some(mail::send::Contact {
            address: address.as_deref(),
            suppressed,
            consent: contact.consent,
            subscription: template
                .topic_id
                .as_ref()
                .and_then(|topic_id| contact.subscriptions.get(topic_id))
                .map(String::as_str),
            zone: authored
                .policy
                .as_ref()
                .and_then(|policy| policy.time_zone.attribute.as_ref())
                .and_then(|attribute| document.get(attribute))
                .and_then(Value::as_str),
            sent,
        }),
        policy: authored.policy.as_ref(),
        allowance_refused,
        now_ms: now,
    });
    let held = match verdict {
        Verdict::Send => None,
        Verdict::Hold { until_ms, gate } => Some((until_ms, gate)),
        Verdict::Skip { gate: Gate::NoAddress, .. } => {
            let message = "the contact has no email address".to_owned();
            tick.finish(started, "skipped", Some((Code::RecipientMissing.as_str(), message)), next, now);
            return Ok(false);
        }
        Verdict::Skip { gate: Gate::Allowance, .. } => {
            skip_send(tick, (started, next), (Gate::Allowance, None), (authored, &email_id, contact), now);
            return Ok(true);
        }
        Verdict::Skip { gate, decided_by: filled_by } => {
            let address = address.unwrap_or_default();
            let Some(decided_by) = facts.decided_by.get(gate.as_str()) else {
                let topic_id = template.topic_id.clone();
                return Err(Stop::Needs(Need::DecidedBy { gate, address, topic_id, filled_by }));
            };
            skip_send(tick, (started, next), (gate, decided_by.as_ref()), (authored, &email_id, contact), now);
            return Ok(true);
        }
    };
    let address = address.unwrap_or_default();
    let Some(key) = &contact.key else {
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
    let rendered = match mail::send::render_email(authored, &email_id, Value::Object(context), given.site) {
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
    let contact_id = contact.state.record_id.clone();
    let to = EmailTo { space_id: &tick.row.space_id, contact_id: &contact_id, address: &address, key };
    let scheduled = schedule(
        &email_id,
        authored,
        to,
        &rendered,
        mail::send::Origin::workflow(&tick.row.workflow_id, &tick.row.run_id, &started.step_id),
        (now, &given.site.base_url),
    )?;
    if let Some(allowance) = &authored.allowance {
        tick.guards.push(allowance_guard(&tick.row.space_id, now, allowance.monthly));
    }
    // A held email is stored now and decided again at its time by the held sends worker; the
    // run goes on (the step is done when its email is stored, as for one sent at once).
    let output = match held {
        None => {
            tick.streams.push(scheduled.stream);
            tick.guards.push(outbox::insert_guard(&email_id, &tick.row.space_id, None));
            tick.guards.extend(scheduled.guards);
            tick.email = Some(scheduled.prepared);
            json!({"emailId": email_id})
        }
        Some((until_ms, gate)) => {
            let held = scheduled.hold(until_ms, gate, now);
            tick.streams.push(held.stream);
            tick.guards.push(held.guard);
            json!({"emailId": email_id, "status": "held", "notBefore": platform::time::format_millis(until_ms)})
        }
    };
    tick.finish_with(started, "completed", None, (email_id, Some(output)), next, now);
    Ok(true)
}

/// Skips the step's send: `EmailSkipped` begins the email's stream (the gate, the refusal and
/// the fact that decided), and the step finishes `skipped` naming the email.
fn skip_send(
    tick: &mut Tick,
    (started, next): (&InFlight, Option<&str>),
    (gate, decided_by): (Gate, Option<&DecidedBy>),
    (authored, email_id, contact): (&Authored, &str, &Contact),
    now: i64,
) {
    let row = &tick.row;
    tick.streams.push(mail::skipped::skipped(Skip {
        email_id,
        space_id: &row.space_id,
        authored,
        contact_id: &contact.state.record_id,
        origin: mail::send::Origin::workflow(&row.workflow_id, &row.run_id, &started.step_id),
        gate,
        decided_by,
        at_ms: now,
    }));
    tick.skip(started, (gate, email_id), next, now);
}

/// The request of a `call_webhook` step: the run's data, signed with the workflow's secret.
fn call_request(
    given: &Given<'_>,
    facts: &Facts,
    row: &Row,
    step: &Step,
    input: &Value,
    contact: &ContactFacts,
    url: &str,
) -> Result<Call, Stop> {
    let index = row.in_flight.as_ref().map_or(row.step_count, |in_flight| in_flight.index);
    let contact = match contact {
        ContactFacts::Live(live) => live.state.document(),
        _ => Value::Null,
    };
    let body = json!({
        "type": "workflow.call",
        "timestamp": platform::time::format_millis(given.now),
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
    Ok(Call {
        url: url.to_owned(),
        body: serde_json::to_vec(&body).map_err(anyhow::Error::from)?,
        call_id: domain::workflows::call_id(&row.run_id, index),
        secret: facts.secret.clone().ok_or(Stop::Needs(Need::Secret))?,
    })
}

/// Records a call's attempt: done, failed, or due again after the retry schedule's delay.
fn finish_call(given: &Given<'_>, tick: &mut Tick, in_flight: &InFlight, outcome: &CallOutcome, next: Option<&str>) {
    let now = given.now;
    let answer = |status: Option<u16>| json!({"status": status, "body": outcome.body});
    let (status, error) = match &outcome.result {
        AttemptResult::Delivered { status } => {
            let output = answer(Some(*status));
            tick.finish_with(in_flight, "completed", None, (String::new(), Some(output)), next, now);
            return;
        }
        AttemptResult::Retryable { status, error, retry_after } => {
            let schedule = given.retry_schedule_ms;
            let attempt = usize::try_from(in_flight.attempt).unwrap_or(usize::MAX).saturating_sub(1);
            if let Some(delay) = schedule.get(attempt) {
                let delay = Duration::from_millis(*delay).mul_f64(given.jitter).max(retry_after.unwrap_or_default());
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
    tick.end(RunStatus::Failed, Some(failure), now);
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

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    fn step(id: &str, kind: StepKind) -> Step {
        Step { id: id.into(), kind }
    }

    fn next(id: &str) -> Option<String> {
        Some(id.to_owned())
    }

    fn workflow(steps: Vec<Step>) -> WorkflowDef {
        WorkflowDef {
            slug: "onboarding".into(),
            name: "Onboarding".into(),
            status: domain::workflows::Status::Published,
            contact_schema_id: "sch_contacts".into(),
            entry: "start".into(),
            reference_id: "wh-onboarding".into(),
            steps,
            triggers: Vec::new(),
            signing: None,
        }
    }

    fn entry(then: &str) -> Step {
        step("start", StepKind::IncomingWebhook { reference_id: "wh-onboarding".into(), next: next(then) })
    }

    /// A run of the contact `con_1`, `status`, at `step_id`, with nothing in flight.
    fn row(status: RunStatus, step_id: Option<&str>) -> Row {
        Row {
            run_id: "run_1".into(),
            workflow_id: "wf_1".into(),
            space_id: "spc_1".into(),
            revision: 1,
            contact_id: Some("con_1".into()),
            status,
            step_id: step_id.map(str::to_owned),
            step_count: 1,
            version: 2,
            paused: false,
            in_flight: None,
            waiting_schema: None,
            matched_event: None,
            passes: BTreeMap::new(),
            input: Vec::new(),
            outputs: None,
            control_paused: false,
            keys: platform::crypto::Keys::default(),
        }
    }

    /// `row` with `step_id` in flight since the run's second step.
    fn in_flight(status: RunStatus, step: &Step, attempt: u32, attempting: bool) -> Row {
        let mut row = row(status, Some(&step.id));
        row.in_flight = Some(InFlight {
            index: 2,
            step_id: step.id.clone(),
            step_type: step.kind.type_name().into(),
            started_at_ms: NOW - 1000,
            attempt,
            attempting,
        });
        row
    }

    fn contact(email: Option<&str>, values: Value) -> ContactFacts {
        ContactFacts::Live(Box::new(Contact {
            version: 3,
            state: RecordState {
                record_id: "con_1".into(),
                space_id: "spc_1".into(),
                schema_id: "sch_contacts".into(),
                schema_type: "contact".into(),
                source: "api".into(),
                created_at_ms: NOW - 10_000,
                updated_at_ms: NOW - 10_000,
                personal: Some(proto::RecordPersonal {
                    email: email.map(str::to_owned),
                    values_json: values.to_string(),
                    ..Default::default()
                }),
            },
            key: None,
            consent: Some(true),
            consent_keys: vec!["marketingConsent".into()],
            subscriptions: BTreeMap::from([("top_news".to_owned(), "subscribed".to_owned())]),
            segments: BTreeSet::new(),
            attributes: vec![domain::catalog::AttributeEntry {
                key: "plan".into(),
                definition: json!({"type": "string"}),
            }],
        }))
    }

    fn with_contact(contact: ContactFacts) -> Facts {
        Facts { contact: Some(contact), ..Facts::default() }
    }

    const SCHEDULE: &[u64] = &[1000, 2000];

    static SITE: std::sync::LazyLock<mail::send::Site> = std::sync::LazyLock::new(|| mail::send::Site {
        base_url: "https://api.example.test".to_owned(),
        links: mail::tracking::Links::derive(|_| [7; 32], 1, &[]),
    });

    fn given() -> Given<'static> {
        Given {
            now: NOW,
            jitter: 1.0,
            allowance_refused: false,
            call_outcome: None,
            retry_schedule_ms: SCHEDULE,
            site: &SITE,
        }
    }

    fn decided(row: &Row, definition: &WorkflowDef, facts: &Facts, given: &Given<'_>) -> Tick {
        let opened = open(row).expect("opens");
        match decide((row, &opened), definition, facts, given).expect("decides") {
            Decided::Tick(tick) => *tick,
            Decided::Needs(need) => panic!("the decision needs {need:?}"),
        }
    }

    fn needs(row: &Row, definition: &WorkflowDef, facts: &Facts, given: &Given<'_>) -> Need {
        let opened = open(row).expect("opens");
        match decide((row, &opened), definition, facts, given).expect("decides") {
            Decided::Needs(need) => need,
            Decided::Tick(_) => panic!("the decision needed nothing"),
        }
    }

    /// The run's events: each type, with the step it names where it names one.
    fn events(tick: &Tick) -> Vec<String> {
        tick.events
            .iter()
            .map(|event| match event {
                LogEvent::WorkflowStepStarted(started) => format!("started {}", started.step_id),
                LogEvent::WorkflowStepFinished(finished) => format!("{} {}", finished.status, finished.step_id),
                LogEvent::WorkflowRunFinished(finished) => format!("run {}", finished.status),
                LogEvent::WorkflowRunStarted(_) => "run started".to_owned(),
                LogEvent::WorkflowRunSleeping(_) => "sleeping".to_owned(),
                LogEvent::WorkflowRunPaused(_) => "paused".to_owned(),
                LogEvent::WorkflowRunResumed(_) => "resumed".to_owned(),
                other => other.event_type().to_owned(),
            })
            .collect()
    }

    fn finished(tick: &Tick, step_id: &str) -> proto::WorkflowStepFinished {
        tick.events
            .iter()
            .find_map(|event| match event {
                LogEvent::WorkflowStepFinished(finished) if finished.step_id == step_id => Some(finished.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("step {step_id} did not finish"))
    }

    #[test]
    fn given_a_new_run_when_decided_then_it_starts_at_the_entry_and_sleeps_in_its_first_wait() {
        let definition =
            workflow(vec![entry("wait"), step("wait", StepKind::Wait { wait: Wait::For { ms: 60_000 }, next: None })]);
        let tick = decided(&row(RunStatus::Waiting, None), &definition, &Facts::default(), &given());
        assert_eq!(events(&tick), ["run started", "started start", "completed start", "started wait", "sleeping"]);
        assert_eq!((tick.row.status.as_str(), tick.due_ms, tick.finished), ("sleeping", Some(NOW + 60_000), false));
        assert_eq!(tick.row.in_flight.as_ref().map(|in_flight| in_flight.step_id.as_str()), Some("wait"));
    }

    #[test]
    fn given_a_sleeping_wait_when_due_then_it_completes_and_a_run_with_no_next_step_completes() {
        let wait = step("wait", StepKind::Wait { wait: Wait::For { ms: 60_000 }, next: None });
        let definition = workflow(vec![entry("wait"), wait.clone()]);
        let tick = decided(&in_flight(RunStatus::Sleeping, &wait, 0, false), &definition, &Facts::default(), &given());
        assert_eq!(events(&tick), ["completed wait", "run completed"]);
        assert!(tick.finished && tick.due_ms.is_none() && tick.row.in_flight.is_none());
    }

    #[test]
    fn given_a_finished_run_when_decided_then_nothing_happens() {
        let definition = workflow(vec![entry("end"), step("end", StepKind::Exit)]);
        for status in [RunStatus::Completed, RunStatus::Exited, RunStatus::Failed] {
            let tick = decided(&row(status, None), &definition, &Facts::default(), &given());
            assert!(tick.finished && tick.events.is_empty(), "{}", status.as_str());
        }
    }

    #[test]
    fn given_a_wait_until_a_date_attribute_when_decided_then_it_needs_the_contact_and_sleeps_until_the_date() {
        let wait = Wait::UntilAttribute { attribute: "renewsOn".into(), offset_ms: -86_400_000 };
        let definition = workflow(vec![step("start", StepKind::Wait { wait, next: None })]);
        let run = row(RunStatus::Running, Some("start"));
        assert_eq!(needs(&run, &definition, &Facts::default(), &given()), Need::Contact);
        let facts = with_contact(contact(Some("ada@example.test"), json!({"renewsOn": "2030-01-02"})));
        let tick = decided(&run, &definition, &facts, &given());
        let day_before =
            chrono::DateTime::parse_from_rfc3339("2030-01-01T00:00:00Z").expect("a time").timestamp_millis();
        assert_eq!(tick.due_ms, Some(day_before));
        // A missing date skips the wait.
        let facts = with_contact(contact(Some("ada@example.test"), json!({})));
        let tick = decided(&run, &definition, &facts, &given());
        assert_eq!(finished(&tick, "start").status, "skipped");
        assert_eq!(finished(&tick, "start").error_code, "attribute_missing");
    }

    #[test]
    fn given_a_branch_when_decided_then_the_first_arm_that_holds_is_taken_else_the_default() {
        let arm = domain::workflows::Arm {
            condition: filter::parse_plain("contact.plan is pro").expect("parses"),
            description: "contact.plan is pro".into(),
            next: next("pro"),
        };
        let definition = workflow(vec![
            step("start", StepKind::Branch { arms: vec![arm], default: next("other") }),
            step("pro", StepKind::Exit),
            step("other", StepKind::Exit),
        ]);
        let run = row(RunStatus::Running, Some("start"));
        let pro = with_contact(contact(None, json!({"plan": "pro"})));
        assert_eq!(finished(&decided(&run, &definition, &pro, &given()), "start").next_step_id, "pro");
        let free = with_contact(contact(None, json!({"plan": "free"})));
        assert_eq!(finished(&decided(&run, &definition, &free, &given()), "start").next_step_id, "other");
    }

    #[test]
    fn given_a_goto_when_its_passes_are_used_up_then_the_run_goes_on_to_its_next_step() {
        let definition = workflow(vec![
            entry("again"),
            step("again", StepKind::Goto { target: "start".into(), max_passes: 2, next: next("end") }),
            step("end", StepKind::Exit),
        ]);
        let tick = decided(&row(RunStatus::Running, Some("start")), &definition, &Facts::default(), &given());
        let gotos = events(&tick).iter().filter(|event| *event == "started again").count();
        assert_eq!(gotos, 3, "two passes back, then on");
        assert_eq!(tick.row.passes.get("again"), Some(&2));
        assert_eq!(events(&tick).last().map(String::as_str), Some("run exited"));
    }

    #[test]
    fn given_a_long_loop_when_decided_then_one_transition_executes_at_most_its_step_budget_and_is_due_at_once() {
        let definition = workflow(vec![
            entry("again"),
            step("again", StepKind::Goto { target: "start".into(), max_passes: 10_000, next: None }),
        ]);
        let tick = decided(&row(RunStatus::Running, Some("start")), &definition, &Facts::default(), &given());
        let started = events(&tick).iter().filter(|event| event.starts_with("started")).count();
        assert_eq!(started, STEPS_PER_TICK);
        assert_eq!((tick.finished, tick.due_ms), (false, Some(NOW)));
    }

    #[test]
    fn given_a_run_at_its_step_limit_when_decided_then_its_next_step_and_the_run_fail() {
        let definition = workflow(vec![entry("end"), step("end", StepKind::Exit)]);
        let mut run = row(RunStatus::Running, Some("start"));
        run.step_count = domain::workflows::MAX_STEP_COUNT;
        let tick = decided(&run, &definition, &Facts::default(), &given());
        assert_eq!(events(&tick), ["started start", "failed start", "run failed"]);
        assert_eq!(finished(&tick, "start").error_code, "step_limit");
    }

    #[test]
    fn given_a_paused_workflow_when_decided_then_a_started_run_parks_under_a_guard_and_resumes_on_unpause() {
        let definition = workflow(vec![entry("end"), step("end", StepKind::Exit)]);
        let mut run = row(RunStatus::Running, Some("start"));
        run.control_paused = true;
        let parked = decided(&run, &definition, &Facts::default(), &given());
        assert_eq!(events(&parked), ["paused"]);
        assert!(parked.row.paused && parked.due_ms.is_none() && !parked.finished);
        assert_eq!(parked.guards.len(), 1, "parked only while the workflow is still paused");
        // Parked again: no second event.
        run.paused = true;
        assert!(decided(&run, &definition, &Facts::default(), &given()).events.is_empty());
        // A run that has not started waits without an event.
        let mut waiting = row(RunStatus::Waiting, None);
        waiting.control_paused = true;
        assert!(decided(&waiting, &definition, &Facts::default(), &given()).events.is_empty());
        // Unpaused: resumed, and on.
        run.control_paused = false;
        let resumed = decided(&run, &definition, &Facts::default(), &given());
        assert_eq!(events(&resumed)[0], "resumed");
        assert!(resumed.finished && !resumed.row.paused);
    }

    #[test]
    fn given_a_step_that_needs_a_contact_when_the_run_has_none_or_it_is_gone_then_it_fails_or_exits() {
        let definition = workflow(vec![step("start", StepKind::Subscribe { topic_id: "top_news".into(), next: None })]);
        let mut run = row(RunStatus::Running, Some("start"));
        let gone = decided(&run, &definition, &with_contact(ContactFacts::Gone), &given());
        assert_eq!(events(&gone), ["run exited"]);
        run.contact_id = None;
        let none = decided(&run, &definition, &with_contact(ContactFacts::None), &given());
        assert_eq!(finished(&none, "start").error_code, "no_contact");
        assert_eq!(events(&none).last().map(String::as_str), Some("run failed"));
    }

    #[test]
    fn given_a_send_step_when_its_template_is_gone_then_the_step_and_the_run_fail() {
        let definition = workflow(vec![step("start", StepKind::SendEmail { template_id: "tpl_1".into(), next: None })]);
        let run = row(RunStatus::Running, Some("start"));
        let mut facts = with_contact(contact(Some("ada@example.test"), json!({})));
        assert_eq!(needs(&run, &definition, &facts, &given()), Need::Template("tpl_1".into()));
        facts.templates.insert("tpl_1".into(), None);
        let tick = decided(&run, &definition, &facts, &given());
        assert_eq!(finished(&tick, "start").error_code, "template_not_found");
        assert!(tick.email.is_none() && tick.streams.is_empty());
    }

    #[test]
    fn given_a_send_step_when_the_allowance_refused_it_then_it_is_skipped_by_the_allowance_gate() {
        let definition = workflow(vec![
            step("start", StepKind::SendEmail { template_id: "tpl_1".into(), next: next("end") }),
            step("end", StepKind::Exit),
        ]);
        let mut facts = with_contact(contact(Some("ada@example.test"), json!({})));
        facts.templates.insert("tpl_1".into(), Some(authored()));
        facts.suppressed.insert("ada@example.test".into(), false);
        let given = Given { allowance_refused: true, ..given() };
        let tick = decided(&row(RunStatus::Running, Some("start")), &definition, &facts, &given);
        let skipped = finished(&tick, "start");
        assert_eq!((skipped.status.as_str(), skipped.gate.as_str()), ("skipped", Gate::Allowance.as_str()));
        assert_eq!(skipped.next_step_id, "end");
        let (email, decided_by) = skipped_email(&tick);
        assert_eq!((email.gate.as_str(), email.code.as_str()), ("allowance", "email_limit_reached"));
        assert_eq!(decided_by, None, "a count, no event, decided");
        assert!(tick.guards.is_empty() && tick.email.is_none(), "nothing scheduled, nothing counted");
    }

    /// The `EmailSkipped` a tick appends, and the position of the fact that decided (if any).
    fn skipped_email(tick: &Tick) -> (proto::EmailSkipped, Option<i64>) {
        assert_eq!(tick.streams.len(), 1, "one stream: the skipped email's");
        let stream = &tick.streams[0];
        let LogEvent::EmailSkipped(skipped) = &stream.events[0].event else { panic!("an EmailSkipped") };
        assert_eq!(stream.stream_id, domain::email::stream_id(&skipped.email_id));
        assert_eq!(stream.expected, ExpectedVersion::NoStream, "it begins the email's stream");
        assert_eq!(skipped.email_id, finished(tick, "start").email_id, "the step names the email");
        assert_eq!(skipped.email_id, domain::workflows::email_id("run_1", 2));
        let source = skipped.source.clone().unwrap_or_default();
        assert_eq!(
            (source.origin.as_str(), source.source_id.as_str(), source.step_id.as_str()),
            ("workflow", "run_1", "start")
        );
        assert_eq!(tick.due_ms, Some(NOW), "one effect per transition: the run goes on in the next");
        (skipped.clone(), Some(skipped.decided_by_position).filter(|position| *position > 0))
    }

    #[test]
    fn given_an_update_step_when_a_value_changes_then_the_record_is_updated_at_its_version_and_the_transition_ends() {
        let set = BTreeMap::from([("plan".to_owned(), Source::Value(json!("pro")))]);
        let definition = workflow(vec![
            step("start", StepKind::UpdateContact { set: set.clone(), next: next("end") }),
            step("end", StepKind::Exit),
        ]);
        let run = row(RunStatus::Running, Some("start"));
        let facts = with_contact(contact(None, json!({"plan": "free"})));
        let tick = decided(&run, &definition, &facts, &given());
        assert_eq!(tick.streams.len(), 1);
        assert_eq!(tick.streams[0].expected, ExpectedVersion::Exactly(3));
        assert!(matches!(tick.streams[0].events[0].event, LogEvent::RecordUpdated(_)));
        assert_eq!((tick.row.step_id.as_deref(), tick.due_ms, tick.finished), (Some("end"), Some(NOW), false));
        // Already so: nothing written.
        let facts = with_contact(contact(None, json!({"plan": "pro"})));
        assert!(decided(&run, &definition, &facts, &given()).streams.is_empty());
    }

    #[test]
    fn given_an_update_step_when_a_value_is_past_its_maximum_or_of_another_type_then_the_run_fails_naming_it() {
        let definition = |value: Value| {
            let set = BTreeMap::from([("plan".to_owned(), Source::Value(value))]);
            workflow(vec![
                step("start", StepKind::UpdateContact { set, next: next("end") }),
                step("end", StepKind::Exit),
            ])
        };
        let run = row(RunStatus::Running, Some("start"));
        let facts = with_contact(contact(None, json!({"plan": "free"})));
        for (value, code) in [(json!("x".repeat(5_000)), "value_too_long"), (json!(7), "invalid_attribute_value")] {
            let tick = decided(&run, &definition(value), &facts, &given());
            assert!(tick.streams.is_empty(), "nothing written");
            assert_eq!((tick.row.status.as_str(), tick.finished), ("failed", true));
            let LogEvent::WorkflowRunFinished(ended) = tick.events.last().expect("an end") else {
                panic!("the run ends")
            };
            assert_eq!(ended.error_code, code);
            assert!(ended.error_message.contains("plan"), "{}", ended.error_message);
        }
    }

    #[test]
    fn given_a_subscribe_step_when_the_contact_is_not_subscribed_then_a_subscription_change_is_written() {
        let subscribe =
            |topic: &str| workflow(vec![step("start", StepKind::Subscribe { topic_id: topic.into(), next: None })]);
        let run = row(RunStatus::Running, Some("start"));
        let facts = with_contact(contact(None, json!({})));
        let tick = decided(&run, &subscribe("top_offers"), &facts, &given());
        let LogEvent::SubscriptionChanged(changed) = &tick.streams[0].events[0].event else { panic!("a subscription") };
        assert_eq!(
            (changed.topic_id.as_str(), changed.status.as_str(), changed.source.as_str()),
            ("top_offers", "subscribed", "workflow")
        );
        // Already subscribed: nothing written.
        assert!(decided(&run, &subscribe("top_news"), &facts, &given()).streams.is_empty());
    }

    #[test]
    fn given_a_call_step_when_started_then_the_attempt_is_committed_before_the_call_goes_out() {
        let definition = workflow(vec![step(
            "start",
            StepKind::CallWebhook { url: "https://hooks.example.test/x".into(), next: None },
        )]);
        let run = row(RunStatus::Running, Some("start"));
        let mut facts = with_contact(contact(None, json!({})));
        assert_eq!(needs(&run, &definition, &facts, &given()), Need::Secret);
        facts.secret = Some(None);
        let tick = decided(&run, &definition, &facts, &given());
        let call = tick.call.as_ref().expect("a call");
        assert_eq!(call.url, "https://hooks.example.test/x");
        assert_eq!(call.call_id, domain::workflows::call_id("run_1", 2));
        let attempt = tick.row.in_flight.as_ref().expect("in flight");
        assert_eq!((attempt.attempt, attempt.attempting), (1, true));
    }

    #[test]
    fn given_a_call_in_flight_when_its_outcome_comes_then_it_completes_is_retried_on_schedule_or_fails() {
        let call = step("start", StepKind::CallWebhook { url: "https://hooks.example.test/x".into(), next: None });
        let definition = workflow(vec![call.clone()]);
        let facts = Facts::default();
        let delivered =
            CallOutcome { result: AttemptResult::Delivered { status: 200 }, body: Some(json!({"ok": true})) };
        let given_outcome = |outcome| Given { call_outcome: Some(outcome), ..given() };
        let done =
            decided(&in_flight(RunStatus::Running, &call, 1, true), &definition, &facts, &given_outcome(&delivered));
        assert_eq!(events(&done), ["completed start", "run completed"]);
        assert_eq!(done.outputs.get("start"), Some(&json!({"status": 200, "body": {"ok": true}})));
        let busy = CallOutcome {
            result: AttemptResult::Retryable { status: Some(503), error: "HTTP 503".into(), retry_after: None },
            body: None,
        };
        let retried =
            decided(&in_flight(RunStatus::Running, &call, 1, true), &definition, &facts, &given_outcome(&busy));
        assert!(retried.events.is_empty());
        assert_eq!(retried.due_ms, Some(NOW + 1000));
        assert_eq!(retried.row.in_flight.as_ref().map(|in_flight| in_flight.attempting), Some(false));
        let exhausted =
            decided(&in_flight(RunStatus::Running, &call, 3, true), &definition, &facts, &given_outcome(&busy));
        assert_eq!(events(&exhausted), ["failed start", "run failed"]);
        assert_eq!(finished(&exhausted, "start").error_code, "webhook_call_failed");
    }

    #[test]
    fn given_a_call_found_going_out_without_an_outcome_when_decided_then_it_is_outcome_unknown_and_never_repeated() {
        let call = step("start", StepKind::CallWebhook { url: "https://hooks.example.test/x".into(), next: None });
        let definition = workflow(vec![call.clone()]);
        let tick = decided(&in_flight(RunStatus::Running, &call, 1, true), &definition, &Facts::default(), &given());
        assert_eq!(finished(&tick, "start").status, "outcome_unknown");
        assert!(tick.call.is_none());
    }

    #[test]
    fn given_a_wait_for_an_event_when_it_ends_then_a_matched_event_takes_on_event_and_a_timeout_on_timeout() {
        let wait = step(
            "start",
            StepKind::WaitForEvent {
                event_schema_id: "sch_purchase".into(),
                timeout_ms: 3_600_000,
                on_event: next("thanks"),
                on_timeout: next("remind"),
            },
        );
        let definition = workflow(vec![wait.clone(), step("thanks", StepKind::Exit), step("remind", StepKind::Exit)]);
        let mut matched = in_flight(RunStatus::Sleeping, &wait, 0, false);
        matched.matched_event = Some("evt_1".into());
        let tick_matched = decided(&matched, &definition, &Facts::default(), &given());
        assert_eq!(finished(&tick_matched, "start").next_step_id, "thanks");
        assert_eq!(tick_matched.outputs.get("start"), Some(&json!({"eventId": "evt_1"})));
        let timed_out =
            decided(&in_flight(RunStatus::Sleeping, &wait, 0, false), &definition, &Facts::default(), &given());
        let finished_step = finished(&timed_out, "start");
        assert_eq!((finished_step.status.as_str(), finished_step.next_step_id.as_str()), ("timed_out", "remind"));
    }

    #[test]
    fn given_a_wait_for_an_event_when_started_then_only_later_events_count() {
        let definition = workflow(vec![step(
            "start",
            StepKind::WaitForEvent {
                event_schema_id: "sch_purchase".into(),
                timeout_ms: 1000,
                on_event: None,
                on_timeout: None,
            },
        )]);
        let facts = with_contact(contact(None, json!({})));
        let tick = decided(&row(RunStatus::Running, Some("start")), &definition, &facts, &given());
        assert!(tick.new_wait);
        assert_eq!(tick.row.waiting_schema.as_deref(), Some("sch_purchase"));
        assert_eq!(tick.due_ms, Some(NOW + 1000));
    }

    /// A marketing template of topic `top_news` whose recipient is the context key `contact`.
    fn authored() -> Authored {
        let template = json!({
            "slug": "welcome", "name": "Welcome", "kind": "marketing", "senderId": "snd_1", "topicId": "top_news",
            "subject": "Hello {{ contact.firstName }}", "html": "<p>Hello</p>", "text": "Hello",
            "recipient": "contact", "data": {"contact": {"schemaId": "sch_contacts", "schemaSlug": "contacts", "schemaType": "contact"}},
        });
        let sender =
            json!({"slug": "hello", "fromName": "Acme", "fromAddress": "hello@acme.test", "domainId": "dom_1"});
        let domain = json!({
            "slug": "acme", "name": "acme.test", "returnPath": "bounces.acme.test",
            "dkim": {"selector": "s1", "publicKey": "", "wrappedKey": "", "privateKey": ""},
        });
        Authored {
            template_id: "tpl_1".into(),
            revision: 1,
            template: serde_json::from_value(template).expect("a template"),
            sender_id: "snd_1".into(),
            sender: serde_json::from_value(sender).expect("a sender"),
            domain: serde_json::from_value(domain).expect("a domain"),
            topic: None,
            allowance: None,
            policy: None,
        }
    }

    fn send_step() -> WorkflowDef {
        workflow(vec![
            step("start", StepKind::SendEmail { template_id: "tpl_1".into(), next: next("end") }),
            step("end", StepKind::Exit),
        ])
    }

    #[test]
    fn given_a_send_step_when_the_contact_has_no_address_or_it_is_suppressed_then_the_step_is_skipped_and_the_run_goes_on()
     {
        let run = row(RunStatus::Running, Some("start"));
        let mut facts = with_contact(contact(None, json!({})));
        facts.templates.insert("tpl_1".into(), Some(authored()));
        let no_address = decided(&run, &send_step(), &facts, &given());
        let skipped = finished(&no_address, "start");
        assert_eq!((skipped.status.as_str(), skipped.error_code.as_str()), ("skipped", "recipient_missing"));
        assert_eq!(skipped.next_step_id, "end");
        facts.contact = Some(contact(Some("ada@example.test"), json!({})));
        assert_eq!(needs(&run, &send_step(), &facts, &given()), Need::Suppression("ada@example.test".into()));
        facts.suppressed.insert("ada@example.test".into(), true);
        let need = Need::DecidedBy {
            gate: Gate::Suppressed,
            address: "ada@example.test".into(),
            topic_id: Some("top_news".into()),
            filled_by: None,
        };
        assert_eq!(needs(&run, &send_step(), &facts, &given()), need, "the fact that decided is asked for");
        let by = DecidedBy { position: 42, event_type: "SuppressionAdded.v1".into(), at_ms: NOW - 5_000 };
        facts.decided_by.insert(Gate::Suppressed.as_str(), Some(by));
        let suppressed = decided(&run, &send_step(), &facts, &given());
        assert_eq!(finished(&suppressed, "start").gate, Gate::Suppressed.as_str());
        let (email, decided_by) = skipped_email(&suppressed);
        assert_eq!((email.gate.as_str(), decided_by), ("suppressed", Some(42)));
        assert_eq!((email.decided_by_type.as_str(), email.decided_by_at_ms), ("SuppressionAdded.v1", NOW - 5_000));
        assert!(suppressed.email.is_none() && suppressed.guards.is_empty(), "nothing scheduled");
    }

    #[test]
    fn given_a_send_step_when_every_gate_passes_then_the_email_is_scheduled_with_its_outbox_row_and_the_transition_ends()
     {
        let run = row(RunStatus::Running, Some("start"));
        let keyring = platform::crypto::Keyring::from_hex(platform::crypto::TEST_MASTER_KEY).expect("a keyring");
        let (key, _) = keyring.generate("con_1").expect("a data key");
        let mut live = contact(Some("ada@example.test"), json!({"firstName": "Ada"}));
        if let ContactFacts::Live(live) = &mut live {
            live.key = Some(key);
        }
        let mut facts = with_contact(live);
        facts.templates.insert("tpl_1".into(), Some(authored()));
        facts.suppressed.insert("ada@example.test".into(), false);
        let tick = decided(&run, &send_step(), &facts, &given());
        let email_id = domain::workflows::email_id("run_1", 2);
        assert_eq!(finished(&tick, "start").email_id, email_id);
        assert_eq!(tick.streams.len(), 1);
        assert!(matches!(tick.streams[0].events[0].event, LogEvent::EmailScheduled(_)));
        assert_eq!(tick.guards.len(), 2, "the outbox row and the marketing send a cap counts");
        assert_eq!(tick.email.as_ref().map(|prepared| prepared.parties.email_id.as_str()), Some(email_id.as_str()));
        assert_eq!((tick.row.step_id.as_deref(), tick.due_ms), (Some("end"), Some(NOW)));
        // Not subscribed to the topic: skipped by the topic gate.
        if let Some(ContactFacts::Live(live)) = &mut facts.contact {
            live.subscriptions.clear();
        }
        facts.decided_by.insert(Gate::Topic.as_str(), None);
        let unsubscribed = decided(&run, &send_step(), &facts, &given());
        assert_eq!(finished(&unsubscribed, "start").gate, Gate::Topic.as_str());
        assert_eq!(skipped_email(&unsubscribed).1, None, "never subscribed: no event decided");
    }

    #[test]
    fn given_an_unsubscribe_step_when_the_contact_is_subscribed_then_it_is_unsubscribed() {
        let definition =
            workflow(vec![step("start", StepKind::Unsubscribe { topic_id: "top_news".into(), next: None })]);
        let facts = with_contact(contact(None, json!({})));
        let tick = decided(&row(RunStatus::Running, Some("start")), &definition, &facts, &given());
        let LogEvent::SubscriptionChanged(changed) = &tick.streams[0].events[0].event else { panic!("a subscription") };
        assert_eq!((changed.topic_id.as_str(), changed.status.as_str()), ("top_news", "unsubscribed"));
    }

    #[test]
    fn given_a_run_whose_input_cannot_be_opened_when_decided_then_the_run_exits_as_erased() {
        let definition = workflow(vec![entry("end"), step("end", StepKind::Exit)]);
        let erased = Opened { input: None, outputs: BTreeMap::new() };
        let Decided::Tick(tick) =
            decide((&row(RunStatus::Running, Some("start")), &erased), &definition, &Facts::default(), &given())
                .expect("decides")
        else {
            panic!("the decision needed a fact")
        };
        assert_eq!(events(&tick), ["run exited"]);
        let LogEvent::WorkflowRunFinished(finished) = &tick.events[0] else { panic!("the run finished") };
        assert_eq!(finished.error_code, "contact_erased");
    }

    /// `row` with the step outputs `outputs` (sealed in the clear, as a test has no keys).
    fn with_outputs(mut row: Row, outputs: Value) -> Row {
        let sealed = platform::events::seal("con_1", &proto::WorkflowStepOutput { json: outputs.to_string() });
        row.outputs = Some(prost::Message::encode_to_vec(&sealed));
        row
    }

    /// A journey that sends `mail`, waits up to a minute for its open, and goes to `thanks`
    /// or `again`.
    fn waits_for_open() -> (WorkflowDef, Step) {
        let wait = step(
            "wait",
            StepKind::WaitForEngagement {
                step: "mail".into(),
                action: EngagementAction::Opened,
                timeout_ms: 60_000,
                on_engaged: next("thanks"),
                on_timeout: next("again"),
            },
        );
        let definition = workflow(vec![
            entry("mail"),
            step("mail", StepKind::SendEmail { template_id: "tpl_1".into(), next: next("wait") }),
            wait.clone(),
            step("thanks", StepKind::Exit),
            step("again", StepKind::Exit),
        ]);
        (definition, wait)
    }

    fn engaged(opened: bool, clicked: bool) -> Facts {
        Facts { engagement: BTreeMap::from([("em_1".to_owned(), Engaged { opened, clicked })]), ..Facts::default() }
    }

    #[test]
    fn given_a_wait_for_an_open_when_it_starts_then_an_earlier_open_ends_it_at_once_and_otherwise_it_sleeps_on_the_email()
     {
        let (definition, _) = waits_for_open();
        let run = with_outputs(row(RunStatus::Running, Some("wait")), json!({"mail": {"emailId": "em_1"}}));
        assert_eq!(needs(&run, &definition, &Facts::default(), &given()), Need::Engagement(vec!["em_1".to_owned()]));
        let tick = decided(&run, &definition, &engaged(false, true), &given());
        assert_eq!(events(&tick), ["started wait", "sleeping"], "a click is not an open");
        assert_eq!((tick.row.waiting_schema.as_deref(), tick.due_ms), (Some("opened:em_1"), Some(NOW + 60_000)));
        assert!(tick.new_wait, "the follower matches opens after this point");
        let tick = decided(&run, &definition, &engaged(true, false), &given());
        assert_eq!(events(&tick)[..2], ["started wait", "completed wait"]);
        assert_eq!(finished(&tick, "wait").next_step_id, "thanks");
        // Its send was skipped: no email to open, only the timeout ends the wait.
        let tick = decided(&row(RunStatus::Running, Some("wait")), &definition, &Facts::default(), &given());
        assert_eq!(
            (events(&tick), tick.row.waiting_schema),
            (vec!["started wait".to_owned(), "sleeping".to_owned()], None)
        );
    }

    #[test]
    fn given_a_sleeping_wait_for_an_open_when_it_wakes_then_a_match_goes_on_engaged_and_a_timeout_asks_the_log_again() {
        let (definition, wait) = waits_for_open();
        let outputs = json!({"mail": {"emailId": "em_1"}});
        let mut matched = with_outputs(in_flight(RunStatus::Sleeping, &wait, 0, false), outputs.clone());
        matched.matched_event = Some("em_1".into());
        let tick = decided(&matched, &definition, &Facts::default(), &given());
        assert_eq!(
            (finished(&tick, "wait").status.as_str(), finished(&tick, "wait").next_step_id.as_str()),
            ("completed", "thanks")
        );
        assert_eq!(tick.outputs.get("wait"), Some(&json!({"emailId": "em_1"})));
        let due = with_outputs(in_flight(RunStatus::Sleeping, &wait, 0, false), outputs);
        assert_eq!(needs(&due, &definition, &Facts::default(), &given()), Need::Engagement(vec!["em_1".to_owned()]));
        let timed_out = decided(&due, &definition, &engaged(false, false), &given());
        assert_eq!(
            (finished(&timed_out, "wait").status.as_str(), finished(&timed_out, "wait").next_step_id.as_str()),
            ("timed_out", "again")
        );
        let missed = decided(&due, &definition, &engaged(true, false), &given());
        assert_eq!(finished(&missed, "wait").next_step_id, "thanks", "an open the follower missed still counts");
    }

    #[test]
    fn given_a_branch_on_a_send_steps_open_when_decided_then_it_reads_what_a_person_did_with_the_email() {
        let arm = domain::workflows::Arm {
            condition: filter::parse_plain("steps.mail.opened is false").expect("parses"),
            description: "steps.mail.opened is false".into(),
            next: next("again"),
        };
        let definition = workflow(vec![
            step("start", StepKind::Branch { arms: vec![arm], default: next("thanks") }),
            step("thanks", StepKind::Exit),
            step("again", StepKind::Exit),
        ]);
        let run = with_outputs(row(RunStatus::Running, Some("start")), json!({"mail": {"emailId": "em_1"}}));
        let facts =
            |opened| Facts { engagement: engaged(opened, false).engagement, ..with_contact(contact(None, json!({}))) };
        let contact_only = with_contact(contact(None, json!({})));
        assert_eq!(needs(&run, &definition, &contact_only, &given()), Need::Engagement(vec!["em_1".to_owned()]));
        assert_eq!(finished(&decided(&run, &definition, &facts(false), &given()), "start").next_step_id, "again");
        assert_eq!(finished(&decided(&run, &definition, &facts(true), &given()), "start").next_step_id, "thanks");
    }

    /// Ada, with an address and a data key, and a template under a cap of one marketing email
    /// a day whose outcome is `outcome`.
    fn capped_facts(outcome: &str) -> Facts {
        let keyring = platform::crypto::Keyring::from_hex(platform::crypto::TEST_MASTER_KEY).expect("a keyring");
        let (key, _) = keyring.generate("con_1").expect("a data key");
        let mut live = contact(Some("ada@example.test"), json!({"firstName": "Ada"}));
        if let ContactFacts::Live(live) = &mut live {
            live.key = Some(key);
        }
        let mut facts = with_contact(live);
        let mut capped = authored();
        let policy = json!({"timeZone": {"default": "UTC"},
                            "frequencyCaps": [{"max": 1, "window": {"hours": 24}, "outcome": outcome}]});
        capped.policy = Some(serde_json::from_value(policy).expect("a policy"));
        facts.templates.insert("tpl_1".into(), Some(capped));
        facts.suppressed.insert("ada@example.test".into(), false);
        facts
    }

    #[test]
    fn given_a_send_step_under_a_full_frequency_cap_then_it_asks_for_the_sends_and_names_the_one_that_filled_it() {
        let run = row(RunStatus::Running, Some("start"));
        let mut facts = capped_facts("skip");
        let since_ms = given().now - 86_400_000;
        assert_eq!(needs(&run, &send_step(), &facts, &given()), Need::MarketingSends { since_ms });
        facts.sent = Some(vec![mail::send::Sent { at_ms: given().now - 3_600_000, topic_id: None, position: 9 }]);
        let need = Need::DecidedBy {
            gate: Gate::FrequencyCap,
            address: "ada@example.test".into(),
            topic_id: Some("top_news".into()),
            filled_by: Some(9),
        };
        assert_eq!(needs(&run, &send_step(), &facts, &given()), need);
        facts.sent = Some(Vec::new());
        let sent = decided(&run, &send_step(), &facts, &given());
        assert!(sent.email.is_some(), "under the cap: scheduled");
    }

    #[test]
    fn given_a_send_step_under_a_full_cap_whose_outcome_is_hold_then_its_email_is_stored_held_and_the_run_goes_on() {
        let run = row(RunStatus::Running, Some("start"));
        let mut facts = capped_facts("hold");
        let filled_at = given().now - 3_600_000;
        facts.sent = Some(vec![mail::send::Sent { at_ms: filled_at, topic_id: None, position: 9 }]);
        let tick = decided(&run, &send_step(), &facts, &given());
        assert!(tick.email.is_none(), "nothing is handed off now");
        let step = finished(&tick, "start");
        assert_eq!(step.status, "completed", "the step is done when its email is stored");
        let stream = tick.streams.iter().find(|stream| stream.stream_id.starts_with("email-")).expect("the email");
        let Some(LogEvent::EmailHeld(held)) = stream.events.get(1).map(|event| &event.event) else {
            panic!("EmailHeld follows EmailScheduled: {:?}", stream.events)
        };
        assert_eq!((held.gate.as_str(), held.not_before_ms), ("frequency_cap", filled_at + 86_400_000));
        let output = &tick.outputs["start"];
        assert_eq!(
            (output["status"].as_str(), output["emailId"].as_str()),
            (Some("held"), Some(step.email_id.as_str()))
        );
        assert!(tick.guards.iter().any(|guard| guard.sql.contains("'held'")), "its outbox row is held");
        assert!(!tick.guards.iter().any(|guard| guard.sql.contains("marketing_sends")), "not counted until released");
    }
}
