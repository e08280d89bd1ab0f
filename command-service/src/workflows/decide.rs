//! The workflow decisions: reading a trigger's input, and whether a workflow takes a run or
//! changes its pause. Pure.

use std::sync::Arc;

use domain::catalog::WriteContext;
use domain::workflows::{MAX_INPUT_BYTES, Status, WorkflowDef, run_stream_id, stream_id};
use platform::events::LogEvent;
use platform::ids::SpaceId;
use platform::log::{ExpectedVersion, Guard, NewEvent, StreamAppend};
use platform::proto;
use prost::Message;
use serde_json::{Map, Value, json};

use journeys::decide::{Decided, Opened, Row, Tick};

use super::store::{self, FirstState, Found, NewRun};
use crate::decision::{Decide, Given, Outcome, Reply};
use crate::records::decide::{self as records, UpsertLoaded, decide_upsert, write_schema};
use crate::records::write::Write;

/// Why a workflow request is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// No such workflow (or reference id) in the caller's space (404 `workflow_not_found`).
    #[error("no workflow {0:?} in this space")]
    NotFound(String),
    /// A draft takes no runs and cannot be paused (409 `workflow_not_published`).
    #[error("workflow {0} is a draft; publish it in the workspace file first")]
    NotPublished(String),
    /// The input is not a run's input (400 `invalid_workflow_input`).
    #[error("{0}")]
    InvalidInput(String),
    /// A replay request's field is not what it may be (400 `invalid_field`).
    #[error("{0}")]
    InvalidReplay(String),
    /// A replay request names a field it has not (400 `unknown_field`).
    #[error("unknown field {0:?}; a replay request takes window")]
    UnknownField(String),
    /// The contact a trigger names cannot be written: a record rule's refusal, a new contact
    /// that cannot be read back, a write that cannot be assembled (the record write's answer).
    #[error(transparent)]
    Record(#[from] records::Refusal),
    /// The run's input could not be sealed (500).
    #[error("{0}")]
    Failed(String),
}

impl Refusal {
    fn failed(error: &anyhow::Error) -> Self {
        Self::Failed(format!("{error:#}"))
    }
}

/// A trigger's body read: the run's input, and the contact's record input when it names one.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    pub input: Value,
    pub contact: Option<Map<String, Value>>,
}

/// Reads a trigger's body: any JSON object of at most 256 KiB; `contact`, when present and not
/// null, is an object naming the contact (`id`, `email` or `userId`) with attributes to write.
pub(crate) fn parse_input(body: Map<String, Value>) -> Result<Input, Refusal> {
    let size = Value::Object(body.clone()).to_string().len();
    if size > MAX_INPUT_BYTES {
        return Err(Refusal::InvalidInput(format!(
            "the input is {size} bytes of JSON; a run's input is at most {MAX_INPUT_BYTES}"
        )));
    }
    let contact = match body.get("contact") {
        None | Some(Value::Null) => None,
        Some(Value::Object(contact)) => {
            if !["id", "email", "userId"].iter().any(|key| contact.get(*key).is_some_and(|value| !value.is_null())) {
                return Err(Refusal::InvalidInput("contact must name the contact by id, email or userId".to_owned()));
            }
            Some(contact.clone())
        }
        Some(_) => {
            return Err(Refusal::InvalidInput(
                "contact must be an object naming the contact by id, email or userId".to_owned(),
            ));
        }
    };
    Ok(Input { input: Value::Object(body), contact })
}

/// Whether `definition` takes a run: only a published workflow does (a paused one takes it and
/// lets it wait).
pub(crate) fn check_trigger(workflow_id: &str, definition: &WorkflowDef) -> Result<(), Refusal> {
    match definition.status {
        Status::Published => Ok(()),
        Status::Draft => Err(Refusal::NotPublished(workflow_id.to_owned())),
    }
}

/// What a pause or an unpause does to a workflow that is `paused` now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PauseChange {
    /// Append the change.
    Change,
    /// It is so already: a success that changes nothing.
    Same,
}

/// A pause (`pause: true`) or unpause of a workflow: a draft cannot be paused.
pub(crate) fn decide_pause(
    workflow_id: &str,
    definition: &WorkflowDef,
    paused: bool,
    pause: bool,
) -> Result<PauseChange, Refusal> {
    if definition.status == Status::Draft {
        return Err(Refusal::NotPublished(workflow_id.to_owned()));
    }
    Ok(if paused == pause { PauseChange::Same } else { PauseChange::Change })
}

/// A run as the API shows it when it was just requested.
pub(crate) fn requested_run(
    (run_id, workflow_id, revision): (&str, &str, i64),
    contact_id: Option<&str>,
    reference_id: &str,
    requested_at_ms: i64,
) -> Value {
    json!({
        "id": run_id,
        "workflowId": workflow_id,
        "revision": revision,
        "migrations": [],
        "status": "waiting",
        "contactId": contact_id,
        "trigger": {"type": "webhook", "id": reference_id},
        "requestedAt": platform::time::format_millis(requested_at_ms),
        "startedAt": null,
        "finishedAt": null,
        "stepCount": 0,
        "currentStepId": null,
        "error": null,
    })
}

/// `POST /workflows/{referenceId}`.
pub(crate) struct TriggerWorkflow<'a> {
    pub space_id: SpaceId,
    pub reference_id: String,
    pub input: Input,
    /// What the engine's decision is given besides the run (see [`first_transition`]).
    pub site: &'a mail::send::Site,
    pub retry_schedule_ms: &'a [u64],
}

/// What a trigger decides on.
pub(crate) struct Trigger {
    pub found: Arc<Found>,
    /// The contact's schema and what its upsert read, when the input names a contact.
    pub contact: Option<(Arc<WriteContext>, UpsertLoaded)>,
    /// Whether the workflow is paused, once read: a first attempt does not read it and writes
    /// a run's first transition only while the workflow is not paused (the row's guard); a
    /// pause found there makes the next attempt read it.
    pub paused: Option<bool>,
}

impl Decide for TriggerWorkflow<'_> {
    type Loaded = Trigger;
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, trigger: Trigger, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let Trigger { found, contact, paused } = trigger;
        let (space_id, now) = (self.space_id.as_str(), given.now_ms);
        let run_id = given.fresh.id("run");
        let mut streams = Vec::new();
        let mut guards: Vec<Guard> = Vec::new();
        // The key the input is sealed under: the contact's, or one of the run's own.
        let (contact_id, key) = match contact {
            Some((context, loaded)) => {
                let schema = write_schema(&context, space_id);
                let planned = decide_upsert(&schema, loaded, now, given.fresh)?;
                let contact_id = planned.record.record_id.clone();
                let key = match planned.write {
                    Some(write) => {
                        let Write { stream, guards: write_guards, key } =
                            write.map_err(records::Refusal::Unwritable)?;
                        streams.push(stream);
                        guards.extend(write_guards);
                        Some(key)
                    }
                    None => planned.key,
                };
                (Some(contact_id), key)
            }
            None => (None, None),
        };
        let subject = contact_id.clone().unwrap_or_else(|| run_id.clone());
        let key = match key {
            Some(key) => key,
            None => {
                let (key, wrapped) = given.fresh.data_key(&subject).map_err(|error| Refusal::failed(&error))?;
                guards.push(crate::records::store::store_key(&subject, space_id, wrapped));
                key
            }
        };
        let mut input = platform::events::seal(&subject, &proto::WorkflowInput { json: self.input.input.to_string() });
        platform::events::encrypt(&mut input, &key).map_err(|error| Refusal::failed(&error))?;
        // The run's first transition, when it needs no fact and reaches nothing outside: made
        // here with the engine's own decision and appended with the request, so a run that only
        // starts and waits (or ends) is written once.
        let first = match paused {
            Some(true) => None,
            _ => first_transition(&found, (&run_id, space_id, contact_id.as_deref()), (&subject, &key), self, now),
        };
        let encoded_input = input.encode_to_vec();
        let requested = proto::WorkflowRunRequested {
            run_id: run_id.clone(),
            workflow_id: found.workflow_id.clone(),
            space_id: space_id.to_owned(),
            workflow_revision: found.revision,
            trigger: "webhook".to_owned(),
            trigger_id: self.reference_id.clone(),
            contact_id: contact_id.clone().unwrap_or_default(),
            input: Some(input),
            requested_at_ms: now,
        };
        let mut run = requested_run(
            (&run_id, &found.workflow_id, found.revision),
            contact_id.as_deref(),
            &self.reference_id,
            now,
        );
        let mut events = vec![LogEvent::WorkflowRunRequested(requested)];
        let mut first_state = None;
        if let Some(tick) = first {
            let (state, changes) = first_state_of(tick, now).map_err(|error| Refusal::failed(&error))?;
            decided_run(&mut run, &state, &changes, now);
            events.extend(domain::workflows::transition(&run_id, space_id, changes));
            first_state = Some(state);
        }
        guards.push(store::insert_run(NewRun {
            run_id: &run_id,
            workflow_id: &found.workflow_id,
            space_id,
            revision: found.revision,
            contact_id: contact_id.as_deref(),
            input: encoded_input,
            requested_at_ms: now,
            first: first_state,
        }));
        streams.push(StreamAppend {
            stream_id: run_stream_id(&run_id),
            expected: ExpectedVersion::NoStream,
            events: events
                .into_iter()
                .map(|event| NewEvent {
                    event,
                    subject_id: contact_id.clone(),
                    occurred_at: platform::time::from_millis(now),
                })
                .collect(),
        });
        Ok(Outcome::append(streams, guards, Reply::accepted(run)))
    }
}

/// A run's first transition, decided by the engine's own decision (`journeys::decide`) as the
/// engine would decide it at `now`: kept only when it needs no fact the engine loads (the
/// contact's record, a template, a suppression, the signing secret, engagement; a run without
/// a contact is known to have none) and reaches nothing outside the run (no email, no webhook
/// call, no other stream). Otherwise, or when the decision fails, the engine makes it, as it
/// makes every later one.
fn first_transition(
    found: &Found,
    (run_id, space_id, contact_id): (&str, &str, Option<&str>),
    (subject, key): (&str, &platform::crypto::DataKey),
    trigger: &TriggerWorkflow<'_>,
    now: i64,
) -> Option<Tick> {
    let mut row = Row::requested(run_id, &found.workflow_id, space_id, contact_id.map(str::to_owned));
    row.revision = found.revision;
    row.keys.insert(subject.to_owned(), key.clone());
    let opened = Opened { input: Some(trigger.input.input.clone()), outputs: Default::default() };
    let given = journeys::decide::Given {
        now,
        // A retry's delay is only drawn for a call's failed attempt, which no first transition
        // kept here has.
        jitter: 1.0,
        allowance_refused: false,
        call_outcome: None,
        retry_schedule_ms: trigger.retry_schedule_ms,
        site: trigger.site,
        newer: None,
    };
    // A run without a contact has none to load: a branch on its input is decided here too.
    let facts = journeys::decide::Facts {
        contact: contact_id.is_none().then_some(journeys::decide::ContactFacts::None),
        ..Default::default()
    };
    match journeys::decide::decide((&row, &opened), &found.definition, &facts, &given) {
        Ok(Decided::Tick(tick))
            if tick.email.is_none() && tick.call.is_none() && tick.streams.is_empty() && tick.guards.is_empty() =>
        {
            Some(*tick)
        }
        _ => None,
    }
}

/// The row a first transition leaves, and its changes.
fn first_state_of(mut tick: Tick, now: i64) -> anyhow::Result<(FirstState, Vec<LogEvent>)> {
    let changes = std::mem::take(&mut tick.events);
    let version = 1 + i64::from(!changes.is_empty());
    let state = FirstState {
        status: tick.row.status.as_str(),
        step_id: tick.row.step_id.clone(),
        step_count: tick.row.step_count,
        version,
        due_ms: if tick.finished { None } else { Some(tick.due_ms.unwrap_or(now)) },
        in_flight: tick.in_flight_json()?,
        waiting_schema: tick.row.waiting_schema.clone(),
        new_wait: tick.new_wait,
        passes: serde_json::to_value(&tick.row.passes)?,
        outputs: tick.sealed_outputs()?,
        finished: tick.finished,
    };
    Ok((state, changes))
}

/// The requested run's document as its first transition left it: its status, when it
/// started (and ended), its step count, the step it is at, and a failed run's error.
fn decided_run(run: &mut Value, state: &FirstState, changes: &[LogEvent], now: i64) {
    let at = platform::time::format_millis(now);
    run["status"] = json!(state.status);
    if state.status != "waiting" {
        run["startedAt"] = json!(at);
    }
    run["stepCount"] = json!(state.step_count);
    let current = state
        .in_flight
        .as_ref()
        .and_then(|step| step.get("stepId").cloned())
        .or_else(|| state.step_id.clone().map(Value::String));
    run["currentStepId"] = if state.finished { Value::Null } else { current.unwrap_or(Value::Null) };
    for change in changes {
        if let LogEvent::WorkflowRunFinished(finished) = change {
            run["finishedAt"] = json!(at);
            if !finished.error_code.is_empty() {
                run["error"] = json!({"code": finished.error_code, "message": finished.error_message});
            }
        }
    }
}

/// Reads a replay request's body: `window` (a duration such as `30d`, `12h` or `1w`; default
/// `30d`), and nothing else. Answers the window in milliseconds.
pub(crate) fn parse_replay(body: &Map<String, Value>) -> Result<i64, Refusal> {
    if let Some(unknown) = body.keys().find(|key| key.as_str() != "window") {
        return Err(Refusal::UnknownField(unknown.clone()));
    }
    let window = match body.get("window") {
        None | Some(Value::Null) => domain::workflows::REPLAY_WINDOW_DEFAULT,
        Some(Value::String(window)) => window.as_str(),
        Some(_) => return Err(Refusal::InvalidReplay("window must be a duration such as 30d, 12h or 1w".to_owned())),
    };
    domain::workflows::parse_replay_window(window)
        .map_err(|message| Refusal::InvalidReplay(format!("window: {message}")))
}

/// `POST /workflows/{id}/replays`: a dry run of the workflow's current revision (a draft or a
/// published one) against the last `window_ms` of its space's log. The request is on the log;
/// the projector's `workflow_replays` worker runs it and appends its report.
pub(crate) struct RequestReplay {
    pub space_id: SpaceId,
    pub workflow_id: String,
    pub window_ms: i64,
}

impl Decide for RequestReplay {
    type Loaded = Found;
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, found: Found, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let now = given.now_ms;
        let replay_id = given.fresh.id("wrp");
        let requested = proto::WorkflowReplayRequested {
            replay_id: replay_id.clone(),
            workflow_id: self.workflow_id.clone(),
            space_id: self.space_id.clone().into(),
            revision: found.revision,
            from_ms: now - self.window_ms,
            to_ms: now,
        };
        let document = domain::workflows::replay_document(&requested, None);
        let stream = StreamAppend::one(
            domain::workflows::replay_stream_id(&replay_id),
            ExpectedVersion::NoStream,
            LogEvent::WorkflowReplayRequested(requested),
            now,
        );
        Ok(Outcome::one(stream, Vec::new(), Reply::accepted(document)))
    }
}

/// `POST /workflows/{id}/pause` (`pause`) and `/unpause`.
pub(crate) struct SetPaused {
    pub space_id: SpaceId,
    pub workflow_id: String,
    pub pause: bool,
}

impl Decide for SetPaused {
    /// The workflow, and its stream's version and pause.
    type Loaded = (Found, i64, bool);
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, (found, version, paused): Self::Loaded, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let (workflow_id, space_id, now) = (&self.workflow_id, self.space_id.as_str(), given.now_ms);
        let change = decide_pause(workflow_id, &found.definition, paused, self.pause)?;
        let document = found.definition.document(workflow_id, found.revision, self.pause);
        let body = document;
        if change == PauseChange::Same {
            return Ok(Outcome::Answer(Reply::ok(body)));
        }
        let event = match self.pause {
            true => LogEvent::WorkflowPaused(proto::WorkflowPaused {
                workflow_id: workflow_id.clone(),
                space_id: space_id.to_owned(),
                at_ms: now,
            }),
            false => LogEvent::WorkflowUnpaused(proto::WorkflowUnpaused {
                workflow_id: workflow_id.clone(),
                space_id: space_id.to_owned(),
                at_ms: now,
            }),
        };
        let expected = if version == 0 { ExpectedVersion::NoStream } else { ExpectedVersion::Exactly(version) };
        let stream = StreamAppend::one(stream_id(workflow_id), expected, event, now);
        let mut guards = vec![store::control(workflow_id, space_id, self.pause)];
        if !self.pause {
            guards.push(store::wake_parked(workflow_id));
        }
        Ok(Outcome::one(stream, guards, Reply::ok(body)))
    }
}

impl platform::refusal::Answered for Refusal {}

/// A refused workflow request as the contract answers it (a contact's write as the record
/// write's refusal is).
impl platform::refusal::Refusal for Refusal {
    fn code(&self) -> platform::error::Code {
        use platform::error::Code;
        match self {
            Self::NotFound(_) => Code::WorkflowNotFound,
            Self::NotPublished(_) => Code::WorkflowNotPublished,
            Self::InvalidInput(_) => Code::InvalidWorkflowInput,
            Self::InvalidReplay(_) => Code::InvalidField,
            Self::UnknownField(_) => Code::UnknownField,
            Self::Record(refusal) => platform::refusal::Refusal::code(refusal),
            Self::Failed(_) => Code::InternalError,
        }
    }

    fn issues(&self) -> Vec<platform::error::Issue> {
        match self {
            Self::Record(refusal) => platform::refusal::Refusal::issues(refusal),
            _ => Vec::new(),
        }
    }

    fn is_defect(&self) -> bool {
        match self {
            Self::Record(refusal) => platform::refusal::Refusal::is_defect(refusal),
            Self::Failed(_) => true,
            _ => false,
        }
    }

    fn into_failure(self) -> Result<platform::refusal::Failure, Self> {
        match self {
            Self::Record(refusal) => platform::refusal::Refusal::into_failure(refusal).map_err(Self::Record),
            other => Err(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(value: Value) -> Map<String, Value> {
        value.as_object().cloned().expect("an object")
    }

    #[test]
    fn given_a_body_when_read_then_contact_is_split_out_and_size_is_bounded() {
        let read = parse_input(body(json!({"plan": "pro", "contact": {"email": "a@b.c"}}))).expect("valid");
        assert_eq!(read.contact, Some(body(json!({"email": "a@b.c"}))));
        assert_eq!(read.input["plan"], "pro");
        assert_eq!(parse_input(body(json!({}))).expect("valid").contact, None);
        for bad in [json!({"contact": "a@b.c"}), json!({"contact": {"plan": "pro"}})] {
            assert!(matches!(parse_input(body(bad.clone())), Err(Refusal::InvalidInput(_))), "{bad}");
        }
        let huge = json!({"blob": "x".repeat(MAX_INPUT_BYTES)});
        assert!(matches!(parse_input(body(huge)), Err(Refusal::InvalidInput(_))));
    }

    fn definition(status: Status) -> WorkflowDef {
        WorkflowDef {
            slug: "w".into(),
            name: "W".into(),
            status,
            contact_schema_id: "sch_1".into(),
            entry: "start".into(),
            reference_id: "ref".into(),
            steps: Vec::new(),
            triggers: Vec::new(),
            signing: None,
            in_flight: domain::workflows::InFlightRule::Pin,
        }
    }

    #[test]
    fn given_a_draft_when_triggered_or_paused_then_refused() {
        assert_eq!(check_trigger("wf_1", &definition(Status::Draft)), Err(Refusal::NotPublished("wf_1".into())));
        assert_eq!(check_trigger("wf_1", &definition(Status::Published)), Ok(()));
        let draft = decide_pause("wf_1", &definition(Status::Draft), false, true);
        assert_eq!(draft, Err(Refusal::NotPublished("wf_1".into())));
    }

    #[test]
    fn given_a_pause_state_when_paused_or_unpaused_then_only_a_change_appends() {
        let published = definition(Status::Published);
        assert_eq!(decide_pause("wf_1", &published, false, true), Ok(PauseChange::Change));
        assert_eq!(decide_pause("wf_1", &published, true, true), Ok(PauseChange::Same));
        assert_eq!(decide_pause("wf_1", &published, true, false), Ok(PauseChange::Change));
        assert_eq!(decide_pause("wf_1", &published, false, false), Ok(PauseChange::Same));
    }

    use crate::decision::harness::{NOW_MS, given};
    use crate::decision::{Body, Status as ReplyStatus};
    use domain::catalog::{AttributeEntry, SchemaEntry};
    use platform::error::Code;

    fn found(status: Status) -> Found {
        Found { workflow_id: "wf_1".into(), revision: 4, definition: definition(status) }
    }

    fn site() -> mail::send::Site {
        mail::send::Site {
            base_url: "https://api.example.test/v1".into(),
            links: mail::tracking::Links::derive(|_| [7; 32], 1, &[]),
        }
    }

    fn trigger(contact: Option<Map<String, Value>>, site: &mail::send::Site) -> TriggerWorkflow<'_> {
        let input = json!({"plan": "pro", "contact": contact.clone()});
        TriggerWorkflow {
            space_id: "spc_1".into(),
            reference_id: "ref".into(),
            input: Input { input, contact },
            site,
            retry_schedule_ms: &[1_000],
        }
    }

    fn requested(outcome: &Outcome) -> proto::WorkflowRunRequested {
        match outcome.events().last() {
            Some(LogEvent::WorkflowRunRequested(requested)) => (*requested).clone(),
            other => panic!("a run requested, not {other:?}"),
        }
    }

    fn guard_sqls(outcome: &Outcome) -> Vec<&'static str> {
        match outcome {
            Outcome::Append(writes) => writes.guards.iter().map(|guard| guard.sql).collect(),
            _ => Vec::new(),
        }
    }

    /// The SQL of the guard that stores a subject's wrapped data key.
    fn store_key_sql() -> &'static str {
        crate::records::store::store_key("x", "spc_1", Vec::new()).sql
    }

    #[test]
    fn given_a_published_workflow_when_triggered_without_a_contact_then_the_run_is_requested_under_a_key_of_its_own() {
        let loaded = Trigger { found: Arc::new(found(Status::Published)), contact: None, paused: None };
        let outcome = given(loaded).when(&trigger(None, &site())).decided();
        let requested = requested(&outcome);
        assert_eq!(outcome.events().len(), 1);
        assert_eq!(
            (requested.run_id.as_str(), requested.workflow_id.as_str(), requested.space_id.as_str()),
            ("run_1", "wf_1", "spc_1")
        );
        assert_eq!(
            (requested.workflow_revision, requested.trigger.as_str(), requested.trigger_id.as_str()),
            (4, "webhook", "ref")
        );
        assert_eq!((requested.contact_id.as_str(), requested.requested_at_ms), ("", NOW_MS));
        assert!(requested.input.is_some(), "the input is sealed");
        let Outcome::Append(writes) = &outcome else { panic!("appended") };
        assert_eq!(writes.streams[0].stream_id, run_stream_id("run_1"));
        assert_eq!(writes.streams[0].events[0].subject_id, None);
        let run_row = store::insert_run(NewRun {
            run_id: "run_1",
            workflow_id: "wf_1",
            space_id: "spc_1",
            revision: 4,
            contact_id: None,
            input: Vec::new(),
            requested_at_ms: NOW_MS,
            first: None,
        });
        assert_eq!(guard_sqls(&outcome), [store_key_sql(), run_row.sql], "the run's own key, then its row");
        let reply = outcome.reply().expect("a reply");
        assert_eq!(reply.status, ReplyStatus::Accepted);
        let expected = requested_run(("run_1", "wf_1", 4), None, "ref", NOW_MS);
        assert_eq!(reply.body, Body::Data { data: json!(expected), warnings: Vec::new() });
    }

    /// A published workflow whose entry goes on to `steps`' first.
    fn with_steps(steps: Vec<domain::workflows::Step>) -> Found {
        let mut definition = definition(Status::Published);
        let first = steps.first().map(|step| step.id.clone());
        let entry = domain::workflows::StepKind::IncomingWebhook { reference_id: "ref".into(), next: first };
        definition.steps =
            std::iter::once(domain::workflows::Step { id: "start".into(), kind: entry }).chain(steps).collect();
        Found { workflow_id: "wf_1".into(), revision: 4, definition }
    }

    fn step(id: &str, kind: domain::workflows::StepKind) -> domain::workflows::Step {
        domain::workflows::Step { id: id.into(), kind }
    }

    /// The kinds of the run stream's events and of the changes its transition holds.
    fn run_events(outcome: &Outcome) -> Vec<String> {
        let Outcome::Append(writes) = outcome else { return Vec::new() };
        let stream =
            writes.streams.iter().find(|stream| stream.stream_id == run_stream_id("run_1")).expect("the run's");
        stream
            .events
            .iter()
            .flat_map(|new| domain::workflows::changes(new.event.clone()))
            .map(|event| event.event_type().trim_end_matches(".v1").to_owned())
            .collect()
    }

    #[test]
    fn given_a_workflow_that_waits_first_when_triggered_then_the_run_starts_and_sleeps_in_the_same_append() {
        let nap = step(
            "nap",
            domain::workflows::StepKind::Wait { wait: domain::workflows::Wait::For { ms: 60_000 }, next: None },
        );
        let loaded = Trigger { found: Arc::new(with_steps(vec![nap])), contact: None, paused: None };
        let outcome = given(loaded).when(&trigger(None, &site())).decided();
        assert_eq!(
            run_events(&outcome),
            [
                "WorkflowRunRequested",
                "WorkflowRunStarted",
                "WorkflowStepStarted",
                "WorkflowStepFinished",
                "WorkflowStepStarted",
                "WorkflowRunSleeping"
            ]
        );
        let Outcome::Append(writes) = &outcome else { panic!("appended") };
        assert_eq!(
            writes.streams.iter().map(|stream| stream.events.len()).sum::<usize>(),
            2,
            "the request and one transition"
        );
        let reply = outcome.reply().expect("a reply");
        let Body::Data { data, .. } = &reply.body else { panic!("a run") };
        assert_eq!(
            (&data["status"], &data["stepCount"], &data["currentStepId"], &data["finishedAt"]),
            (&json!("sleeping"), &json!(2), &json!("nap"), &Value::Null)
        );
        assert_eq!(data["startedAt"], json!(platform::time::format_millis(NOW_MS)));
    }

    #[test]
    fn given_a_workflow_that_exits_first_when_triggered_then_the_run_ends_in_the_same_append() {
        let loaded = Trigger {
            found: Arc::new(with_steps(vec![step("out", domain::workflows::StepKind::Exit)])),
            contact: None,
            paused: None,
        };
        let outcome = given(loaded).when(&trigger(None, &site())).decided();
        assert_eq!(run_events(&outcome).last().map(String::as_str), Some("WorkflowRunFinished"));
        let Some(Body::Data { data, .. }) = outcome.reply().map(|reply| &reply.body) else { panic!("a run") };
        assert_eq!((&data["status"], &data["currentStepId"]), (&json!("exited"), &Value::Null));
        assert_eq!(data["finishedAt"], json!(platform::time::format_millis(NOW_MS)));
    }

    #[test]
    fn given_a_first_step_that_calls_out_or_a_paused_workflow_when_triggered_then_the_engine_starts_the_run() {
        let url = "https://crm.example.test/hook".to_owned();
        let send = step("call", domain::workflows::StepKind::CallWebhook { url, next: None });
        let nap = step(
            "nap",
            domain::workflows::StepKind::Wait { wait: domain::workflows::Wait::For { ms: 60_000 }, next: None },
        );
        for (found, paused) in [(with_steps(vec![send]), None), (with_steps(vec![nap]), Some(true))] {
            let loaded = Trigger { found: Arc::new(found), contact: None, paused };
            let outcome = given(loaded).when(&trigger(None, &site())).decided();
            assert_eq!(run_events(&outcome), ["WorkflowRunRequested"]);
            let Some(Body::Data { data, .. }) = outcome.reply().map(|reply| &reply.body) else { panic!("a run") };
            assert_eq!((&data["status"], &data["stepCount"]), (&json!("waiting"), &json!(0)));
        }
    }

    fn contact_context(attributes: Vec<AttributeEntry>) -> Arc<WriteContext> {
        Arc::new(WriteContext {
            schema: SchemaEntry {
                schema_id: "sch_1".into(),
                slug: "contacts".into(),
                schema_type: "contact".into(),
                doc: json!({}),
                attribute_count: attributes.len() as i64,
                revision: 1,
            },
            attributes,
            credits: 0,
            revision: 1,
        })
    }

    fn upsert_loaded(context: &WriteContext, input: &Map<String, Value>) -> UpsertLoaded {
        let schema = write_schema(context, "spc_1");
        let input = crate::records::decide::parse_input(&schema, input.clone()).expect("valid input");
        UpsertLoaded { input, owners: Default::default(), target: None }
    }

    #[test]
    fn given_a_new_contact_when_triggered_then_the_contact_is_created_and_the_input_sealed_under_its_key() {
        let contact = body(json!({"email": "ada@example.com"}));
        let context = contact_context(Vec::new());
        let loaded = upsert_loaded(&context, &contact);
        let trigger_loaded =
            Trigger { found: Arc::new(found(Status::Published)), contact: Some((context, loaded)), paused: None };
        let outcome = given(trigger_loaded).when(&trigger(Some(contact), &site())).decided();
        let events = outcome.events();
        let [LogEvent::RecordCreated(created), LogEvent::WorkflowRunRequested(requested)] = events.as_slice() else {
            panic!("the contact's creation, then the run: {events:?}");
        };
        assert_eq!((created.record_id.as_str(), created.created_at_ms), ("con_2", NOW_MS), "drawn after the run's id");
        assert_eq!((requested.run_id.as_str(), requested.contact_id.as_str()), ("run_1", "con_2"));
        let Outcome::Append(writes) = &outcome else { panic!("appended") };
        assert_eq!(writes.streams[1].events[0].subject_id.as_deref(), Some("con_2"));
        let sqls = guard_sqls(&outcome);
        assert_eq!(sqls.iter().filter(|sql| **sql == store_key_sql()).count(), 1, "only the contact's key is stored");
        let reply = outcome.reply().expect("a reply");
        assert_eq!(reply.json()["data"]["contactId"], "con_2");
    }

    #[test]
    fn given_a_contact_missing_a_required_attribute_when_triggered_then_the_record_refusal_answers() {
        let contact = body(json!({"email": "ada@example.com"}));
        let required = AttributeEntry { key: "plan".into(), definition: json!({"type": "string", "required": true}) };
        let context = contact_context(vec![required]);
        let loaded = upsert_loaded(&context, &contact);
        let trigger_loaded =
            Trigger { found: Arc::new(found(Status::Published)), contact: Some((context, loaded)), paused: None };
        let refused = given(trigger_loaded).when(&trigger(Some(contact), &site())).0.err();
        assert!(
            matches!(
                refused,
                Some(Refusal::Record(records::Refusal::Record(records::RecordRefusal::Invalid {
                    code: Code::RequiredAttributeMissing,
                    ..
                })))
            ),
            "{refused:?}"
        );
    }

    fn set_paused(pause: bool) -> SetPaused {
        SetPaused { space_id: "spc_1".into(), workflow_id: "wf_1".into(), pause }
    }

    #[test]
    fn given_a_running_workflow_when_paused_then_the_pause_is_appended_at_its_version() {
        let reply = given((found(Status::Published), 3, false)).when(&set_paused(true)).then_events(&[
            LogEvent::WorkflowPaused(proto::WorkflowPaused {
                workflow_id: "wf_1".into(),
                space_id: "spc_1".into(),
                at_ms: NOW_MS,
            }),
        ]);
        assert_eq!(reply.status, ReplyStatus::Ok);
        assert_eq!(reply.json()["data"]["status"], "paused");
        let outcome = given((found(Status::Published), 3, false)).when(&set_paused(true)).decided();
        let Outcome::Append(writes) = &outcome else { panic!("appended") };
        assert_eq!(writes.streams[0].expected, ExpectedVersion::Exactly(3));
        assert_eq!(guard_sqls(&outcome), [store::control("wf_1", "spc_1", true).sql]);
    }

    #[test]
    fn given_a_paused_workflow_when_unpaused_then_its_parked_runs_are_woken() {
        let outcome = given((found(Status::Published), 0, true)).when(&set_paused(false)).decided();
        assert_eq!(
            outcome.events(),
            [&LogEvent::WorkflowUnpaused(proto::WorkflowUnpaused {
                workflow_id: "wf_1".into(),
                space_id: "spc_1".into(),
                at_ms: NOW_MS,
            })]
        );
        let Outcome::Append(writes) = &outcome else { panic!("appended") };
        assert_eq!(writes.streams[0].expected, ExpectedVersion::NoStream);
        assert_eq!(guard_sqls(&outcome), [store::control("wf_1", "spc_1", false).sql, store::wake_parked("wf_1").sql]);
    }

    #[test]
    fn given_a_workflow_already_so_when_paused_then_it_answers_without_appending_and_a_draft_is_refused() {
        let reply = given((found(Status::Published), 3, true)).when(&set_paused(true)).then_answers();
        assert_eq!((reply.status, &reply.json()["data"]["status"]), (ReplyStatus::Ok, &json!("paused")));
        given((found(Status::Draft), 0, false))
            .when(&set_paused(true))
            .then_refused(Refusal::NotPublished("wf_1".into()));
    }
}
