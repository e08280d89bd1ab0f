//! Workflows (journeys): the definition the catalog holds (authored in the workspace file,
//! references resolved to ids), its checks, and what the command service, the engine and the
//! read models share about runs. Pure: no IO.
//!
//! A workflow is a graph of steps with exactly one entry, an `incoming_webhook` step whose
//! `referenceId` the API's trigger names. Each step names the step that follows it (`next`;
//! none: the run completes), except a `branch` (one `next` per arm and a `default`), a
//! `wait_for_event` (`onEvent`, `onTimeout`), a `goto` (its `target`, while passes remain, then
//! `next`) and an `exit` (the run ends, `exited`). A loop must pass through a `goto`, whose
//! `maxPasses` bounds it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use filter::Filter;
use kernel::events::LogEvent;

mod replays;
mod revisions;
pub use replays::{
    REPLAY_WINDOW_DEFAULT, REPLAY_WINDOW_MAX_MS, parse_replay_window, replay_document, replay_stream_id,
};
pub use revisions::{
    Active, InFlightRule, Unmapped, attribute_wait, check_in_flight, exited_by, holds_runs, replanned_until, target,
};

/// The resource kind of workflows in the catalog.
pub const WORKFLOW: &str = "workflow";
/// The most steps a workflow may have.
pub(crate) const MAX_STEPS: usize = 200;
/// The most passes a `goto` may allow.
pub(crate) const MAX_PASSES: u32 = 10_000;
/// The largest trigger input, in bytes of its JSON.
pub const MAX_INPUT_BYTES: usize = 256 * 1024;
/// The most step executions of one run (a guard against a definition the checks let through).
pub const MAX_STEP_COUNT: i32 = 100_000;
/// The records of a run's step history one read shows.
pub const HISTORY_WINDOW: i32 = 100;

/// A workflow as the catalog holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowDef {
    pub slug: String,
    pub name: String,
    pub status: Status,
    /// The contact schema a run's `contact` is upserted into.
    pub contact_schema_id: String,
    /// The id of the entry step (the `incoming_webhook` step).
    pub entry: String,
    /// The entry's `referenceId` (what `POST /workflows/{referenceId}` names).
    pub reference_id: String,
    pub steps: Vec<Step>,
    /// Starts beside the API's trigger (beyond the contract).
    #[serde(default)]
    pub triggers: Vec<Trigger>,
    /// The secret `call_webhook` steps sign with, encrypted under a data key of its own that
    /// the master key wraps (absent when the workflow calls no webhook).
    #[serde(default)]
    pub signing: Option<StoredSecret>,
    /// What publishing this revision does with the runs in flight on earlier ones (absent:
    /// `pin`, as definitions made before the rule existed read).
    #[serde(default, skip_serializing_if = "InFlightRule::is_pin")]
    pub in_flight: InFlightRule,
}

/// A secret kept encrypted in a definition: the wrapped data key and the ciphertext, base64.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredSecret {
    pub wrapped_key: String,
    pub ciphertext: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Published,
    Draft,
}

/// A start of the workflow other than the API's trigger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Trigger {
    #[serde(flatten)]
    pub on: TriggerOn,
    pub reentry: Reentry,
}

/// What starts a run beside the API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TriggerOn {
    /// An event of this schema became ready for a contact; the run's input is
    /// `{"event": {"id", "schemaId", "data"}}`.
    #[serde(rename_all = "camelCase")]
    Event { event_schema_id: String },
    /// A contact entered this segment after the workflow was published; the run's input is
    /// `{"segment": {"id"}}`.
    #[serde(rename_all = "camelCase")]
    Segment { segment_id: String },
}

/// Whether a contact may be in more than one run started by a trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reentry {
    /// Every occurrence starts a run.
    Always,
    /// At most one run per contact ever.
    Once,
    /// At most one unfinished run per contact at a time.
    OnceAtATime,
}

/// The runs a contact has of a workflow, whatever started them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContactRuns {
    pub any: bool,
    pub unfinished: bool,
}

impl Reentry {
    /// Whether the rule holds a new run of a trigger back, given the contact's runs.
    pub fn holds_back(self, runs: ContactRuns) -> bool {
        match self {
            Reentry::Always => false,
            Reentry::Once => runs.any,
            Reentry::OnceAtATime => runs.unfinished,
        }
    }
}

/// A step: its id, unique in the workflow, and what it does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    pub id: String,
    #[serde(flatten)]
    pub kind: StepKind,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", rename_all_fields = "camelCase")]
pub enum StepKind {
    IncomingWebhook {
        reference_id: String,
        next: Option<String>,
    },
    Wait {
        wait: Wait,
        next: Option<String>,
    },
    WaitForEvent {
        event_schema_id: String,
        timeout_ms: i64,
        on_event: Option<String>,
        on_timeout: Option<String>,
    },
    /// Waits until the contact opens (or clicks a link in) the email an earlier send step
    /// sent, at most `timeout_ms`: a person's open or click, not a machine's.
    WaitForEngagement {
        step: String,
        action: EngagementAction,
        timeout_ms: i64,
        on_engaged: Option<String>,
        on_timeout: Option<String>,
    },
    Branch {
        arms: Vec<Arm>,
        default: Option<String>,
    },
    SendEmail {
        template_id: String,
        next: Option<String>,
    },
    UpdateContact {
        set: BTreeMap<String, Source>,
        next: Option<String>,
    },
    Subscribe {
        topic_id: String,
        next: Option<String>,
    },
    Unsubscribe {
        topic_id: String,
        next: Option<String>,
    },
    CallWebhook {
        url: String,
        next: Option<String>,
    },
    Goto {
        target: String,
        max_passes: u32,
        next: Option<String>,
    },
    Exit,
}

/// What a `wait_for_engagement` step waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngagementAction {
    Opened,
    Clicked,
}

impl EngagementAction {
    pub fn as_str(self) -> &'static str {
        match self {
            EngagementAction::Opened => "opened",
            EngagementAction::Clicked => "clicked",
        }
    }

    /// What a sleeping run waits for (`workflow_runs.waiting_schema`): `opened:<emailId>` or
    /// `clicked:<emailId>`, beside the event schema ids `wait_for_event` waits for.
    pub fn waiting_key(self, email_id: &str) -> String {
        format!("{}:{email_id}", self.as_str())
    }
}

/// How long a `wait` step waits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Wait {
    /// A duration from when the step starts.
    For { ms: i64 },
    /// Until a fixed time (a time already past ends the wait at once).
    Until { at_ms: i64 },
    /// Until a date attribute of the contact plus an offset (a missing or unreadable date
    /// skips the wait).
    UntilAttribute { attribute: String, offset_ms: i64 },
}

/// One arm of a branch: the first whose condition holds is taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Arm {
    pub condition: Filter,
    /// The condition as written, for the API.
    pub description: String,
    pub next: Option<String>,
}

/// A value an `update_contact` step writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Source {
    /// This value.
    Value(Value),
    /// The value at this dot path of the run's input (null when absent).
    Input(String),
}

impl StepKind {
    /// The name of the step's type, as authored and shown.
    pub fn type_name(&self) -> &'static str {
        match self {
            StepKind::IncomingWebhook { .. } => "incoming_webhook",
            StepKind::Wait { .. } => "wait",
            StepKind::WaitForEvent { .. } => "wait_for_event",
            StepKind::WaitForEngagement { .. } => "wait_for_engagement",
            StepKind::Branch { .. } => "branch",
            StepKind::SendEmail { .. } => "send_email",
            StepKind::UpdateContact { .. } => "update_contact",
            StepKind::Subscribe { .. } => "subscribe",
            StepKind::Unsubscribe { .. } => "unsubscribe",
            StepKind::CallWebhook { .. } => "call_webhook",
            StepKind::Goto { .. } => "goto",
            StepKind::Exit => "exit",
        }
    }

    /// Every step this one may go to.
    pub(crate) fn successors(&self) -> Vec<&str> {
        let mut out: Vec<&Option<String>> = Vec::new();
        match self {
            StepKind::IncomingWebhook { next, .. }
            | StepKind::Wait { next, .. }
            | StepKind::SendEmail { next, .. }
            | StepKind::UpdateContact { next, .. }
            | StepKind::Subscribe { next, .. }
            | StepKind::Unsubscribe { next, .. }
            | StepKind::CallWebhook { next, .. } => out.push(next),
            StepKind::WaitForEvent { on_event, on_timeout, .. } => out.extend([on_event, on_timeout]),
            StepKind::WaitForEngagement { on_engaged, on_timeout, .. } => out.extend([on_engaged, on_timeout]),
            StepKind::Branch { arms, default } => {
                out.extend(arms.iter().map(|arm| &arm.next));
                out.push(default);
            }
            StepKind::Goto { target, next, .. } => {
                return std::iter::once(target.as_str()).chain(next.as_deref()).collect();
            }
            StepKind::Exit => {}
        }
        out.into_iter().filter_map(Option::as_deref).collect()
    }

    /// Whether the step needs the run's contact.
    pub fn needs_contact(&self) -> bool {
        matches!(
            self,
            StepKind::SendEmail { .. }
                | StepKind::UpdateContact { .. }
                | StepKind::Subscribe { .. }
                | StepKind::Unsubscribe { .. }
                | StepKind::WaitForEvent { .. }
        ) || matches!(self, StepKind::Wait { wait: Wait::UntilAttribute { .. }, .. })
    }
}

impl WorkflowDef {
    pub fn step(&self, step_id: &str) -> Option<&Step> {
        self.steps.iter().find(|step| step.id == step_id)
    }

    /// The step after the entry (where a run begins executing).
    pub fn first(&self) -> Option<&str> {
        match self.step(&self.entry).map(|step| &step.kind) {
            Some(StepKind::IncomingWebhook { next, .. }) => next.as_deref(),
            _ => None,
        }
    }

    /// The definition as the API shows it (no secret, conditions as written).
    pub fn document(&self, workflow_id: &str, revision: i64, paused: bool) -> Value {
        let status = match (self.status, paused) {
            (Status::Draft, _) => "draft",
            (Status::Published, true) => "paused",
            (Status::Published, false) => "published",
        };
        let steps: Vec<Value> = self.steps.iter().map(step_document).collect();
        let triggers: Vec<Value> = self
            .triggers
            .iter()
            .map(|trigger| match &trigger.on {
                TriggerOn::Event { event_schema_id } => {
                    json!({"type": "event", "eventSchemaId": event_schema_id, "reentry": trigger.reentry})
                }
                TriggerOn::Segment { segment_id } => {
                    json!({"type": "segment", "segmentId": segment_id, "reentry": trigger.reentry})
                }
            })
            .collect();
        json!({
            "id": workflow_id,
            "slug": self.slug,
            "name": self.name,
            "status": status,
            "referenceId": self.reference_id,
            "contactSchemaId": self.contact_schema_id,
            "revision": revision,
            "steps": steps,
            "triggers": triggers,
        })
    }
}

/// A step as the API shows it.
pub(crate) fn step_document(step: &Step) -> Value {
    let mut document = match serde_json::to_value(step) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    };
    if let StepKind::Branch { arms, default } = &step.kind {
        let arms: Vec<Value> = arms.iter().map(|arm| json!({"condition": arm.description, "next": arm.next})).collect();
        document.insert("arms".to_owned(), Value::Array(arms));
        document.insert("default".to_owned(), json!(default));
    }
    Value::Object(document)
}

/// Why a definition is refused; the message names the step.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DefinitionError(pub String);

fn refuse(message: impl Into<String>) -> Result<(), DefinitionError> {
    Err(DefinitionError(message.into()))
}

/// The graph checks: ids unique and well-formed, exactly one entry, every reference to a step
/// that exists, every step reachable from the entry, and every loop through a `goto` with a
/// bound.
pub fn check(definition: &WorkflowDef) -> Result<(), DefinitionError> {
    if definition.steps.is_empty() || definition.steps.len() > MAX_STEPS {
        return refuse(format!("a workflow has 1 to {MAX_STEPS} steps"));
    }
    let mut ids = BTreeSet::new();
    for step in &definition.steps {
        let valid = !step.id.is_empty()
            && step.id.len() <= 64
            && step.id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return refuse(format!("step id {:?} must be 1 to 64 letters, digits, '_' or '-'", step.id));
        }
        if !ids.insert(step.id.as_str()) {
            return refuse(format!("two steps have the id {:?}", step.id));
        }
    }
    let entries: Vec<&Step> =
        definition.steps.iter().filter(|step| matches!(step.kind, StepKind::IncomingWebhook { .. })).collect();
    match entries.as_slice() {
        [entry] if entry.id == definition.entry => {}
        [] => return refuse("the workflow has no entry: one step must be an incoming_webhook step"),
        [_] => return refuse(format!("the entry {:?} is not the incoming_webhook step", definition.entry)),
        more => {
            let names: Vec<&str> = more.iter().map(|step| step.id.as_str()).collect();
            return refuse(format!("a workflow has exactly one entry; incoming_webhook steps: {}", names.join(", ")));
        }
    }
    for step in &definition.steps {
        for successor in step.kind.successors() {
            if !ids.contains(successor) {
                return refuse(format!("step {:?} goes to {successor:?}, which is not a step", step.id));
            }
            if successor == definition.entry {
                return refuse(format!("step {:?} goes back to the entry {successor:?}", step.id));
            }
        }
        if let StepKind::Goto { max_passes, .. } = &step.kind
            && !(1..=MAX_PASSES).contains(max_passes)
        {
            return refuse(format!("goto {:?} needs maxPasses from 1 to {MAX_PASSES}", step.id));
        }
        if let StepKind::WaitForEngagement { step: sent_by, .. } = &step.kind
            && !definition
                .steps
                .iter()
                .any(|other| other.id == *sent_by && matches!(other.kind, StepKind::SendEmail { .. }))
        {
            return refuse(format!(
                "wait_for_engagement {:?} waits on {sent_by:?}, which is not a send_email step",
                step.id
            ));
        }
    }
    let by_id: BTreeMap<&str, &Step> = definition.steps.iter().map(|step| (step.id.as_str(), step)).collect();
    let mut reached = BTreeSet::from([definition.entry.as_str()]);
    let mut todo = vec![definition.entry.as_str()];
    while let Some(id) = todo.pop() {
        for successor in by_id[id].kind.successors() {
            if reached.insert(successor) {
                todo.push(successor);
            }
        }
    }
    if let Some(step) = definition.steps.iter().find(|step| !reached.contains(step.id.as_str())) {
        return refuse(format!("step {:?} is unreachable from the entry", step.id));
    }
    // Without the edges a goto jumps along, the graph must have no cycle.
    let forward = |id: &str| -> Vec<&str> {
        match &by_id[id].kind {
            StepKind::Goto { next, .. } => next.as_deref().into_iter().collect(),
            kind => kind.successors(),
        }
    };
    let mut state: BTreeMap<&str, u8> = BTreeMap::new();
    fn visit<'a>(
        id: &'a str,
        forward: &dyn Fn(&'a str) -> Vec<&'a str>,
        state: &mut BTreeMap<&'a str, u8>,
    ) -> Result<(), DefinitionError> {
        match state.get(id) {
            Some(1) => {
                return refuse(format!(
                    "step {id:?} is in a loop without a bound: loop through a goto step with maxPasses"
                ));
            }
            Some(_) => return Ok(()),
            None => {}
        }
        state.insert(id, 1);
        for successor in forward(id) {
            visit(successor, forward, state)?;
        }
        state.insert(id, 2);
        Ok(())
    }
    let ids: Vec<&str> = definition.steps.iter().map(|step| step.id.as_str()).collect();
    for id in ids {
        visit(id, &forward, &mut state)?;
    }
    Ok(())
}

/// A duration as authored: a whole number and a unit, `30s`, `15m`, `36h`, `2d` or `1w`.
pub fn parse_duration(text: &str) -> Result<i64, DefinitionError> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let unit_ms: i64 = match unit.trim() {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "w" => 7 * 86_400_000,
        _ => return Err(DefinitionError(format!("{text:?} is not a duration such as 30s, 15m, 36h, 2d or 1w"))),
    };
    let number: i64 =
        number.parse().map_err(|_| DefinitionError(format!("{text:?} is not a duration such as 30s, 15m or 2d")))?;
    number
        .checked_mul(unit_ms)
        .filter(|ms| *ms <= 10 * 365 * 86_400_000)
        .ok_or_else(|| DefinitionError(format!("{text:?} is longer than ten years")))
}

/// The data subject a workflow's signing secret is sealed for: its data key is generated and
/// unwrapped for it by the shell, which holds the keyring.
pub fn secret_subject(workflow_id: &str) -> String {
    format!("workflow-{workflow_id}")
}

/// A signing secret sealed under `key`, a data key of its own for [`secret_subject`];
/// `wrapped` is that key as the master key wrapped it.
pub fn seal_secret(
    key: &kernel::crypto::DataKey,
    wrapped: &[u8],
    workflow_id: &str,
    secret: &str,
) -> anyhow::Result<StoredSecret> {
    use base64::Engine;
    let ciphertext = key.encrypt(&secret_subject(workflow_id), secret.as_bytes())?;
    let encode = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    Ok(StoredSecret { wrapped_key: encode(wrapped), ciphertext: encode(&ciphertext) })
}

/// The wrapped data key of a stored secret, for the shell to unwrap.
pub fn wrapped_key(stored: &StoredSecret) -> anyhow::Result<Vec<u8>> {
    use base64::Engine;
    Ok(base64::engine::general_purpose::STANDARD.decode(&stored.wrapped_key)?)
}

/// A workflow's signing secret, in the clear, opened with its unwrapped data key.
pub fn open_secret(key: &kernel::crypto::DataKey, workflow_id: &str, stored: &StoredSecret) -> anyhow::Result<String> {
    use base64::Engine;
    let ciphertext = base64::engine::general_purpose::STANDARD.decode(&stored.ciphertext)?;
    Ok(String::from_utf8(key.decrypt(&secret_subject(workflow_id), &ciphertext)?)?)
}

/// The log stream of a workflow's API-made state (pause, unpause).
pub fn stream_id(workflow_id: &str) -> String {
    format!("workflow-{workflow_id}")
}

/// The log stream of a run.
pub fn run_stream_id(run_id: &str) -> String {
    format!("workflow-run-{run_id}")
}

/// A transition's changes as the log keeps them: a single change as its own event, several as
/// one `WorkflowRunAdvanced` holding them in order (one log event per transition, however
/// many steps it passed). Changes that are not a run's (none today) are kept as they are.
pub fn transition(run_id: &str, space_id: &str, changes: Vec<LogEvent>) -> Vec<LogEvent> {
    use kernel::proto::workflow_run_change::Change;
    if changes.len() < 2 {
        return changes;
    }
    let mut wrapped = Vec::with_capacity(changes.len());
    for event in changes {
        wrapped.push(match event {
            LogEvent::WorkflowRunStarted(e) => Change::RunStarted(e),
            LogEvent::WorkflowStepStarted(e) => Change::StepStarted(e),
            LogEvent::WorkflowRunSleeping(e) => Change::RunSleeping(e),
            LogEvent::WorkflowStepFinished(e) => Change::StepFinished(e),
            LogEvent::WorkflowRunPaused(e) => Change::RunPaused(e),
            LogEvent::WorkflowRunResumed(e) => Change::RunResumed(e),
            LogEvent::WorkflowRunFinished(e) => Change::RunFinished(e),
            LogEvent::WorkflowRunMigrated(e) => Change::RunMigrated(e),
            other => return unwrappable(run_id, space_id, wrapped, other),
        });
    }
    vec![advanced(run_id, space_id, wrapped)]
}

/// The events of a transition that holds a change no `WorkflowRunAdvanced` carries: what was
/// wrapped so far as one event, then that change on its own.
fn unwrappable(
    run_id: &str,
    space_id: &str,
    wrapped: Vec<kernel::proto::workflow_run_change::Change>,
    other: LogEvent,
) -> Vec<LogEvent> {
    let mut events: Vec<LogEvent> = changes(advanced(run_id, space_id, wrapped));
    events.push(other);
    events
}

fn advanced(run_id: &str, space_id: &str, changes: Vec<kernel::proto::workflow_run_change::Change>) -> LogEvent {
    LogEvent::WorkflowRunAdvanced(kernel::proto::WorkflowRunAdvanced {
        run_id: run_id.to_owned(),
        space_id: space_id.to_owned(),
        changes: changes.into_iter().map(|change| kernel::proto::WorkflowRunChange { change: Some(change) }).collect(),
    })
}

/// The changes a log event made to runs, in order: a `WorkflowRunAdvanced`'s, each as the
/// event it would have been on its own; any other event as itself.
pub fn changes(event: LogEvent) -> Vec<LogEvent> {
    use kernel::proto::workflow_run_change::Change;
    let LogEvent::WorkflowRunAdvanced(advanced) = event else { return vec![event] };
    advanced
        .changes
        .into_iter()
        .filter_map(|change| {
            Some(match change.change? {
                Change::RunStarted(e) => LogEvent::WorkflowRunStarted(e),
                Change::StepStarted(e) => LogEvent::WorkflowStepStarted(e),
                Change::RunSleeping(e) => LogEvent::WorkflowRunSleeping(e),
                Change::StepFinished(e) => LogEvent::WorkflowStepFinished(e),
                Change::RunPaused(e) => LogEvent::WorkflowRunPaused(e),
                Change::RunResumed(e) => LogEvent::WorkflowRunResumed(e),
                Change::RunFinished(e) => LogEvent::WorkflowRunFinished(e),
                Change::RunMigrated(e) => LogEvent::WorkflowRunMigrated(e),
            })
        })
        .collect()
}

/// The email id of the `send_email` execution `index` of a run: the same for every attempt at
/// that execution, so it is scheduled at most once (its stream is new).
pub fn email_id(run_id: &str, index: i32) -> String {
    format!("em_{}", &kernel::ids::sha256_hex(&format!("workflow-email\u{1f}{run_id}\u{1f}{index}"))[..32])
}

/// The delivery id (`webhook-id`) of the `call_webhook` execution `index` of a run, stable
/// across its attempts, which receivers deduplicate on.
pub fn call_id(run_id: &str, index: i32) -> String {
    format!("msg_{}", &kernel::ids::sha256_hex(&format!("workflow-call\u{1f}{run_id}\u{1f}{index}"))[..32])
}

/// The value at a dot path of a JSON document (`None` when absent).
pub fn at_path<'a>(document: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(document, |value, key| value.get(key)).filter(|value| !value.is_null())
}

/// The document a branch condition reads: the run's input, the contact's fields, its email
/// consent, topic subscriptions and segment memberships, and what earlier steps produced.
pub fn condition_document(
    input: &Value,
    contact: Option<&Value>,
    consent: Option<bool>,
    subscriptions: &BTreeMap<String, String>,
    segments: &BTreeSet<String>,
    steps: &BTreeMap<String, Value>,
) -> Value {
    let segments: Map<String, Value> = segments.iter().map(|id| (id.clone(), Value::Bool(true))).collect();
    json!({
        "input": input,
        "contact": contact.cloned().unwrap_or(Value::Null),
        "consent": {"email": consent},
        "subscriptions": subscriptions,
        "segments": segments,
        "steps": steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transition_of_several_changes_is_one_event_that_gives_them_back_in_order() {
        use kernel::proto::{WorkflowRunFinished, WorkflowRunSleeping, WorkflowStepStarted};
        let started = LogEvent::WorkflowStepStarted(WorkflowStepStarted {
            run_id: "run_1".into(),
            index: 2,
            step_id: "nap".into(),
            ..Default::default()
        });
        let sleeping =
            LogEvent::WorkflowRunSleeping(WorkflowRunSleeping { run_id: "run_1".into(), ..Default::default() });
        let ended = LogEvent::WorkflowRunFinished(WorkflowRunFinished {
            run_id: "run_1".into(),
            status: "completed".into(),
            ..Default::default()
        });
        // One change stays its own event.
        assert_eq!(transition("run_1", "spc_1", vec![ended.clone()]), vec![ended.clone()]);
        assert!(transition("run_1", "spc_1", Vec::new()).is_empty());
        let made = vec![started, sleeping, ended];
        let wrapped = transition("run_1", "spc_1", made.clone());
        assert_eq!(wrapped.len(), 1);
        let LogEvent::WorkflowRunAdvanced(advanced) = &wrapped[0] else { panic!("one WorkflowRunAdvanced") };
        assert_eq!(
            (advanced.run_id.as_str(), advanced.space_id.as_str(), advanced.changes.len()),
            ("run_1", "spc_1", 3)
        );
        // Stored and read back, it gives the changes in their order.
        let stored = LogEvent::decode(wrapped[0].event_type(), &wrapped[0].encode()).expect("decodes");
        assert_eq!(changes(stored), made);
        // Any other event is its own change.
        let other = LogEvent::Unknown("Later.v1".into());
        assert_eq!(changes(other.clone()), vec![other]);
    }

    #[test]
    fn given_a_contacts_runs_when_a_trigger_fires_then_its_reentry_rule_decides_whether_a_run_starts() {
        let none = ContactRuns::default();
        let finished = ContactRuns { any: true, unfinished: false };
        let running = ContactRuns { any: true, unfinished: true };
        assert!([none, finished, running].iter().all(|runs| !Reentry::Always.holds_back(*runs)));
        assert!(!Reentry::Once.holds_back(none));
        assert!(Reentry::Once.holds_back(finished) && Reentry::Once.holds_back(running));
        assert!(!Reentry::OnceAtATime.holds_back(none) && !Reentry::OnceAtATime.holds_back(finished));
        assert!(Reentry::OnceAtATime.holds_back(running));
    }

    fn step(id: &str, kind: StepKind) -> Step {
        Step { id: id.into(), kind }
    }

    fn next(id: &str) -> Option<String> {
        Some(id.into())
    }

    fn workflow(steps: Vec<Step>) -> WorkflowDef {
        WorkflowDef {
            slug: "w".into(),
            name: "W".into(),
            status: Status::Published,
            contact_schema_id: "sch_1".into(),
            entry: "start".into(),
            reference_id: "ref".into(),
            steps,
            triggers: Vec::new(),
            signing: None,
            in_flight: InFlightRule::Pin,
        }
    }

    fn start(to: &str) -> Step {
        step("start", StepKind::IncomingWebhook { reference_id: "ref".into(), next: next(to) })
    }

    #[test]
    fn given_a_bounded_loop_when_checked_then_it_is_accepted() {
        let definition = workflow(vec![
            start("mail"),
            step("mail", StepKind::SendEmail { template_id: "tpl_1".into(), next: next("again") }),
            step("again", StepKind::Goto { target: "mail".into(), max_passes: 3, next: next("bye") }),
            step("bye", StepKind::Exit),
        ]);
        assert_eq!(check(&definition), Ok(()));
        assert_eq!(definition.first(), Some("mail"));
    }

    #[test]
    fn given_a_bad_graph_when_checked_then_the_refusal_names_the_step() {
        let dangling = workflow(vec![start("nowhere")]);
        assert!(check(&dangling).expect_err("dangling").0.contains("\"start\" goes to \"nowhere\""));
        let unreachable = workflow(vec![start("a"), step("a", StepKind::Exit), step("lost", StepKind::Exit)]);
        assert!(check(&unreachable).expect_err("unreachable").0.contains("\"lost\" is unreachable"));
        let unbounded = workflow(vec![
            start("a"),
            step("a", StepKind::Subscribe { topic_id: "top_1".into(), next: next("b") }),
            step("b", StepKind::Unsubscribe { topic_id: "top_1".into(), next: next("a") }),
        ]);
        assert!(check(&unbounded).expect_err("unbounded").0.contains("loop without a bound"));
        let two_entries = workflow(vec![
            start("other"),
            step("other", StepKind::IncomingWebhook { reference_id: "x".into(), next: None }),
        ]);
        assert!(check(&two_entries).expect_err("two entries").0.contains("exactly one entry"));
        let no_entry = WorkflowDef { entry: "a".into(), ..workflow(vec![step("a", StepKind::Exit)]) };
        assert!(check(&no_entry).expect_err("no entry").0.contains("no entry"));
        let zero_passes = workflow(vec![
            start("g"),
            step("g", StepKind::Goto { target: "e".into(), max_passes: 0, next: None }),
            step("e", StepKind::Exit),
        ]);
        assert!(check(&zero_passes).expect_err("zero").0.contains("goto \"g\" needs maxPasses"));
    }

    #[test]
    fn durations_read_whole_units() {
        assert_eq!(parse_duration("2d"), Ok(172_800_000));
        assert_eq!(parse_duration("15m"), Ok(900_000));
        assert_eq!(parse_duration("250ms"), Ok(250));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("2 days").is_err());
        assert!(parse_duration("99999w").is_err());
    }

    #[test]
    fn effect_ids_are_stable_per_run_and_index() {
        assert_eq!(email_id("run_1", 3), email_id("run_1", 3));
        assert_ne!(email_id("run_1", 3), email_id("run_1", 4));
        assert!(email_id("run_1", 3).starts_with("em_"));
        assert!(call_id("run_1", 3).starts_with("msg_"));
    }

    #[test]
    fn a_definition_round_trips_through_its_stored_json() {
        let definition = workflow(vec![
            start("w"),
            step("w", StepKind::Wait { wait: Wait::For { ms: 1_000 }, next: next("b") }),
            step(
                "b",
                StepKind::Branch {
                    arms: vec![Arm {
                        condition: filter::parse_plain("input.plan is pro").expect("parses"),
                        description: "input.plan is pro".into(),
                        next: None,
                    }],
                    default: next("u"),
                },
            ),
            step(
                "u",
                StepKind::UpdateContact {
                    set: BTreeMap::from([("plan".into(), Source::Input("plan".into()))]),
                    next: None,
                },
            ),
        ]);
        let stored = serde_json::to_value(&definition).expect("serializes");
        assert_eq!(stored["steps"][1]["type"], "wait");
        assert_eq!(stored["steps"][1]["wait"], json!({"for": {"ms": 1000}}));
        let back: WorkflowDef = serde_json::from_value(stored).expect("deserializes");
        assert_eq!(back, definition);
        let shown = definition.document("wf_1", 2, true);
        assert_eq!(shown["status"], "paused");
        assert_eq!(shown["steps"][2]["arms"][0]["condition"], "input.plan is pro");
    }
}
