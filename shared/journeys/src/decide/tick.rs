//! The transition a decision builds ([`Tick`]): the run's row (with its status and the step in
//! flight) as it reads it and writes it back, the events and other streams' appends, and how
//! a step starts and finishes and a run ends.

use std::collections::BTreeMap;

use domain::workflows::Step;
use mail::outbox::Prepared;
use mail::send::Gate;
use platform::events::LogEvent;
use platform::ids::{RunId, SpaceId};
use platform::log::{Guard, StreamAppend};
use platform::proto;
use prost::Message;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The longest error message kept.
const ERROR_MAX_CHARS: usize = 500;

/// The step started and not finished: a sleeping wait, or a webhook call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InFlight {
    pub index: i32,
    pub step_id: String,
    pub step_type: String,
    pub started_at_ms: i64,
    /// A webhook call's attempts so far.
    #[serde(default)]
    pub attempt: u32,
    /// A webhook call's attempt is going out (committed before it does).
    #[serde(default)]
    pub attempting: bool,
    /// When the run is due in this step (a wait's end, a call's next attempt), kept so that a
    /// migration to a newer revision keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<i64>,
}

/// A run's status (`workflow_runs.status`, and a finished run's `WorkflowRunFinished.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
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
    pub fn as_str(self) -> &'static str {
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
    pub fn parse(text: &str) -> anyhow::Result<Self> {
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
pub struct Row {
    pub run_id: RunId,
    pub workflow_id: String,
    pub space_id: SpaceId,
    pub revision: i64,
    pub contact_id: Option<String>,
    pub status: RunStatus,
    pub step_id: Option<String>,
    pub step_count: i32,
    pub version: i64,
    pub paused: bool,
    pub in_flight: Option<InFlight>,
    pub waiting_schema: Option<String>,
    pub matched_event: Option<String>,
    pub passes: BTreeMap<String, u32>,
    pub input: Vec<u8>,
    pub outputs: Option<Vec<u8>>,
    /// The workflow's pause control, read with the row.
    pub control_paused: bool,
    /// The data key that seals the run's input and outputs (none: erased), read with the row.
    pub keys: platform::crypto::Keys,
    /// The revision a newer publish moves the run to (its `inFlight` rule), until the run has
    /// moved.
    pub migrate_to: Option<i64>,
    /// The row's own version: each transition's update of the row is made at it and adds
    /// one, whether or not the transition appends (a call's later attempts change only the
    /// row), so two processes never both commit one change.
    pub row_version: i64,
}

impl Row {
    /// A run just requested of `workflow_id`'s first revision, not started, with no data of
    /// its own (what a replay starts, and what the decision tests build on).
    pub fn requested(run_id: &str, workflow_id: &str, space_id: &str, contact_id: Option<String>) -> Self {
        Row {
            run_id: run_id.to_owned().into(),
            workflow_id: workflow_id.to_owned(),
            space_id: space_id.to_owned().into(),
            revision: 1,
            contact_id,
            status: RunStatus::Waiting,
            step_id: None,
            step_count: 0,
            version: 1,
            paused: false,
            in_flight: None,
            waiting_schema: None,
            matched_event: None,
            passes: BTreeMap::new(),
            input: Vec::new(),
            outputs: None,
            control_paused: false,
            keys: platform::crypto::Keys::default(),
            migrate_to: None,
            row_version: 0,
        }
    }
}

/// A webhook call to make after the transition that starts (or retries) it is committed.
pub struct Call {
    pub url: String,
    pub body: Vec<u8>,
    pub call_id: String,
    pub secret: Option<domain::webhooks::signing::Secret>,
}

/// One transition being built.
pub struct Tick {
    pub row: Row,
    /// The row's version before this transition.
    pub base_version: i64,
    pub events: Vec<LogEvent>,
    pub streams: Vec<StreamAppend>,
    pub guards: Vec<Guard>,
    /// When the run is due next (`None`: not due, parked or finished).
    pub due_ms: Option<i64>,
    pub finished: bool,
    /// A `wait_for_event` begins: only events after this transition count.
    pub new_wait: bool,
    pub outputs: BTreeMap<String, Value>,
    pub outputs_changed: bool,
    pub call: Option<Call>,
    pub email: Option<Prepared>,
    /// The move to a newer revision this transition handled (its mark is cleared with it).
    pub migrated_to: Option<i64>,
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
pub struct Opened {
    /// The run's input; `None` when its key is gone (the contact was erased).
    pub input: Option<Value>,
    /// The outputs of the steps so far, by step id.
    pub outputs: BTreeMap<String, Value>,
}

/// Opens the run's input and outputs with its data key.
pub fn open(row: &Row) -> anyhow::Result<Opened> {
    let input = open_json(&row.input, &row.keys, true)?;
    let outputs = match &row.outputs {
        Some(sealed) => open_json(sealed, &row.keys, false)?.and_then(|value| serde_json::from_value(value).ok()),
        None => Some(BTreeMap::new()),
    }
    .unwrap_or_default();
    Ok(Opened { input, outputs })
}

/// The subject whose key seals the run's data.
pub fn subject(row: &Row) -> String {
    row.contact_id.clone().unwrap_or_else(|| row.run_id.clone().into())
}

impl Tick {
    pub(super) fn new(row: Row, outputs: BTreeMap<String, Value>) -> Self {
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
            migrated_to: None,
        }
    }

    /// The step in flight as the run's row keeps it: with when the run is due in it, so that
    /// a move to a newer revision keeps that time.
    pub fn in_flight_json(&self) -> serde_json::Result<Option<Value>> {
        self.row
            .in_flight
            .clone()
            .map(|mut step| {
                step.until_ms = self.due_ms.or(step.until_ms);
                serde_json::to_value(step)
            })
            .transpose()
    }

    /// The run's outputs as its row keeps them: sealed again under the run's data key when
    /// this transition changed them.
    pub fn sealed_outputs(&self) -> anyhow::Result<Option<Vec<u8>>> {
        if !self.outputs_changed {
            return Ok(self.row.outputs.clone());
        }
        let row = &self.row;
        let Some(key) = row.keys.get(&subject(row)) else {
            anyhow::bail!("run {} has no data key", row.run_id);
        };
        let json = serde_json::to_string(&self.outputs)?;
        let mut sealed = platform::events::seal(&subject(row), &proto::WorkflowStepOutput { json });
        platform::events::encrypt(&mut sealed, key)?;
        Ok(Some(sealed.encode_to_vec()))
    }

    pub(super) fn space(&self) -> String {
        self.row.space_id.clone().into()
    }

    pub(super) fn push(&mut self, event: LogEvent) {
        self.events.push(event);
    }

    /// Starts `step` as execution `step_count + 1`.
    pub(super) fn start(&mut self, step: &Step, now: i64) -> InFlight {
        self.row.step_count += 1;
        let started = InFlight {
            index: self.row.step_count,
            step_id: step.id.clone(),
            step_type: step.kind.type_name().to_owned(),
            started_at_ms: now,
            attempt: 0,
            attempting: false,
            until_ms: None,
        };
        self.push(LogEvent::WorkflowStepStarted(proto::WorkflowStepStarted {
            run_id: self.row.run_id.clone().into(),
            space_id: self.space(),
            index: started.index,
            step_id: step.id.clone(),
            step_type: started.step_type.clone(),
            at_ms: now,
        }));
        started
    }

    /// Finishes `started` with `status` and goes to `next`.
    pub(super) fn finish(
        &mut self,
        started: &InFlight,
        status: &str,
        error: Option<(&str, String)>,
        next: Option<&str>,
        now: i64,
    ) {
        self.finish_with(started, status, error, (String::new(), None), next, now);
    }

    pub(super) fn finish_with(
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
            run_id: self.row.run_id.clone().into(),
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
    pub(super) fn skip(&mut self, started: &InFlight, (gate, email_id): (Gate, &str), next: Option<&str>, now: i64) {
        self.finish(started, "skipped", Some((gate.code().as_str(), gate.reason().to_owned())), next, now);
        if let Some(LogEvent::WorkflowStepFinished(finished)) = self.events.last_mut() {
            finished.gate = gate.as_str().to_owned();
            finished.email_id = email_id.to_owned();
        }
    }

    /// Ends the run.
    pub(super) fn end(&mut self, status: RunStatus, error: Option<(&str, String)>, now: i64) {
        let (error_code, error_message) = error.unwrap_or_default();
        self.push(LogEvent::WorkflowRunFinished(proto::WorkflowRunFinished {
            run_id: self.row.run_id.clone().into(),
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
    pub(super) fn fail(&mut self, started: &InFlight, code: &str, message: String, now: i64) {
        self.finish(started, "failed", Some((code, message.clone())), None, now);
        self.end(RunStatus::Failed, Some((code, message)), now);
    }
}
