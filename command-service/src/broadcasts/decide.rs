//! The broadcast decisions: validating an update body, updating a broadcast and requesting
//! its run, on the broadcast as the log holds it. Pure.

use std::collections::BTreeMap;

use domain::email::broadcasts::{apply_update, document, stream_id};
use domain::email::experiments::{ExperimentDef, Metric};
use domain::email::resources::{Audience, BroadcastDef};
use platform::error::{Code, Issue};
use platform::events::LogEvent;
use platform::ids::SpaceId;
use platform::log::{ExpectedVersion, Guard, StreamAppend};
use platform::proto;
use serde_json::{Map, Value, json};

use super::store::{self, Current, Loaded};
use crate::decision::{Decide, Given, Outcome, Reply};

/// The fields an update accepts.
pub(crate) const UPDATE_FIELDS: [&str; 4] = ["name", "audience", "scheduledAt", "experiment"];
/// Fields of the broadcast as returned that an update takes when they are unchanged.
pub(crate) const FIXED_FIELDS: [&str; 4] = ["id", "slug", "templateId", "senderId"];
/// Fields of the broadcast as returned that the server keeps: an update ignores them.
pub(crate) const KEPT_FIELDS: [&str; 1] = ["updatedAt"];
/// The most characters of a broadcast's name.
pub(crate) const MAX_NAME_CHARS: usize = 200;

/// A validated update: each field present only when the caller sent it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Update {
    pub name: Option<String>,
    pub audience: Option<Audience>,
    /// `Some(None)` clears the schedule.
    pub scheduled_at_ms: Option<Option<i64>>,
    /// `Some(None)` removes the experiment; a new one is checked by itself here and against
    /// the space's templates and senders by [`check_experiment`].
    pub experiment: Option<Option<ExperimentDef>>,
    /// The fixed fields the body echoed from the broadcast as returned, checked unchanged
    /// against the broadcast by [`check_echoed`].
    pub echoed: Map<String, Value>,
}

/// Why a broadcast request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The body is not a valid update; `issues` names every problem (400 `invalid_broadcast`).
    #[error("{message}")]
    Invalid { message: String, issues: Vec<Issue> },
    /// No such broadcast in the caller's space (404 `broadcast_not_found`).
    #[error("no broadcast {0:?} in this space")]
    NotFound(String),
    /// A run is scheduled or sending (409 `broadcast_run_active`).
    #[error("a run of this broadcast is scheduled or sending; wait until it has completed")]
    RunActive,
    /// The audience names no live segment or topic of the space (404 `segment_not_found` or
    /// `topic_not_found`).
    #[error("no {} {:?} in this space", kind(.0), id(.0))]
    AudienceNotFound(Audience),
    /// A decision that cannot be made on what was loaded (500).
    #[error("{0}")]
    Failed(String),
}

fn kind(audience: &Audience) -> &'static str {
    match audience {
        Audience::Segment { .. } => "segment",
        Audience::Topic { .. } => "topic",
    }
}

fn id(audience: &Audience) -> &str {
    match audience {
        Audience::Segment { segment_id } => segment_id,
        Audience::Topic { topic_id } => topic_id,
    }
}

/// What a command knows of an audience it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AudienceFound {
    Yes,
    No,
}

/// An update of `current` (`None`: no such broadcast) at `now`: its event and the broadcast
/// after it. Refused while a run is scheduled or sending, and when the new audience does not
/// exist.
pub(crate) fn decide_update(
    broadcast_id: &str,
    space_id: &str,
    current: Option<&Current>,
    update: &Update,
    audience: AudienceFound,
    now: i64,
) -> Result<(proto::BroadcastUpdated, BroadcastDef), Refusal> {
    let current = current.ok_or_else(|| Refusal::NotFound(broadcast_id.to_owned()))?;
    if current.run_active {
        return Err(Refusal::RunActive);
    }
    if let (Some(named), AudienceFound::No) = (&update.audience, audience) {
        return Err(Refusal::AudienceNotFound(named.clone()));
    }
    let event = proto::BroadcastUpdated {
        broadcast_id: broadcast_id.to_owned(),
        space_id: space_id.to_owned(),
        name: update.name.clone(),
        audience: update.audience.as_ref().map(Audience::to_proto),
        scheduled_at_set: update.scheduled_at_ms.is_some(),
        scheduled_at_ms: update.scheduled_at_ms.flatten().unwrap_or(0),
        updated_at_ms: now,
        experiment_set: update.experiment.is_some(),
        experiment_json: experiment_json(update.experiment.as_ref().and_then(Option::as_ref))?,
    };
    let next = apply_update(current.definition.clone(), &event);
    Ok((event, next))
}

/// A run of `current` requested at `now` under `run_id`: the audience, template and sender
/// are the broadcast's as the log holds them at this decision. Refused while another run is
/// scheduled or sending, and when the audience no longer exists.
pub(crate) fn decide_send(
    broadcast_id: &str,
    space_id: &str,
    current: Option<&Current>,
    audience: AudienceFound,
    (run_id, now): (&str, i64),
) -> Result<proto::BroadcastRunRequested, Refusal> {
    let current = current.ok_or_else(|| Refusal::NotFound(broadcast_id.to_owned()))?;
    if current.run_active {
        return Err(Refusal::RunActive);
    }
    let definition = &current.definition;
    if audience == AudienceFound::No {
        return Err(Refusal::AudienceNotFound(definition.audience.clone()));
    }
    Ok(proto::BroadcastRunRequested {
        run_id: run_id.to_owned(),
        broadcast_id: broadcast_id.to_owned(),
        space_id: space_id.to_owned(),
        template_id: definition.template_id.clone(),
        sender_id: definition.sender_id.clone().unwrap_or_default(),
        audience: Some(definition.audience.to_proto()),
        start_at_ms: start_at(definition.scheduled_at_ms, now),
        requested_at_ms: now,
        experiment_json: experiment_json(definition.experiment.as_ref())?,
    })
}

/// An experiment as the log carries it (JSON; empty for none).
fn experiment_json(experiment: Option<&ExperimentDef>) -> Result<String, Refusal> {
    experiment.map_or(Ok(String::new()), |experiment| {
        serde_json::to_string(experiment).map_err(|error| Refusal::Failed(error.to_string()))
    })
}

fn invalid(issues: Vec<Issue>) -> Refusal {
    Refusal::Invalid { message: Issue::summary(&issues, "this broadcast update"), issues }
}

/// `{"segmentId": …}` or `{"topicId": …}`, with or without the `type` a `GET` shows
/// (`{"type": "segment", "segmentId": …}`), which must then match the id given.
fn audience(value: &Value, issues: &mut Vec<Issue>) -> Option<Audience> {
    let id = |key: &str| {
        value
            .get(key)
            .and_then(Value::as_str)
            .filter(|id| !platform::storable::is_blank(id) && id.len() <= 100)
            .map(str::to_owned)
    };
    let typed = value.get("type").map(Value::as_str);
    let fields = value.as_object().map_or(0, |object| object.len() - usize::from(typed.is_some()));
    match (id("segmentId"), id("topicId"), fields, typed) {
        (Some(segment_id), None, 1, None | Some(Some("segment"))) if platform::storable::is_storable(&segment_id) => {
            Some(Audience::Segment { segment_id })
        }
        (None, Some(topic_id), 1, None | Some(Some("topic"))) if platform::storable::is_storable(&topic_id) => {
            Some(Audience::Topic { topic_id })
        }
        _ => {
            issues.push(Issue::coded(
                "audience",
                Code::InvalidField,
                "audience must be {\"segmentId\": \"seg_...\"} or {\"topicId\": \"top_...\"}, \
                 optionally with the matching \"type\" (segment or topic)",
            ));
            None
        }
    }
}

/// Refuses an update whose echoed fixed fields differ from the broadcast as shown (`shown`,
/// the document a `GET` returns): the template, sender and slug are authored in the
/// application, the id is the broadcast's own.
pub(crate) fn check_echoed(update: &Update, shown: &Value) -> Result<(), Refusal> {
    let issues: Vec<Issue> = crate::echo::changed(&update.echoed, shown)
        .into_iter()
        .map(|(key, current)| {
            let message = match key {
                "id" => format!("id is the broadcast's own ({current}); it cannot change"),
                _ => format!("{key} is authored in the application ({current}); it cannot change here"),
            };
            Issue::coded(key, Code::UnknownField, message)
        })
        .collect();
    if issues.is_empty() { Ok(()) } else { Err(invalid(issues)) }
}

/// Validates an update body: at least one of `name`, `audience` and `scheduledAt` (an RFC 3339
/// time, or null to send at once).
pub(crate) fn parse_update(body: &Map<String, Value>) -> Result<Update, Refusal> {
    let mut body = body.clone();
    let echoed = crate::echo::take_echoed(&mut body, &FIXED_FIELDS, &KEPT_FIELDS);
    let mut issues: Vec<Issue> = body
        .keys()
        .filter(|key| !UPDATE_FIELDS.contains(&key.as_str()))
        .map(|key| Issue::coded(key, Code::UnknownField, format!("{key} is not a field of a broadcast update")))
        .collect();
    let mut update = Update { echoed, ..Update::default() };
    match body.get("name") {
        None => {}
        Some(Value::String(name))
            if !platform::storable::is_blank(name)
                && name.chars().count() <= MAX_NAME_CHARS
                && platform::storable::is_storable(name) =>
        {
            update.name = Some(platform::storable::trimmed(name).to_owned());
        }
        Some(_) => issues.push(Issue::coded(
            "name",
            Code::InvalidField,
            format!("name must be non-blank text of at most {MAX_NAME_CHARS} characters"),
        )),
    }
    if let Some(value) = body.get("audience") {
        update.audience = audience(value, &mut issues);
    }
    match body.get("scheduledAt") {
        None => {}
        Some(Value::Null) => update.scheduled_at_ms = Some(None),
        Some(Value::String(text)) => match chrono::DateTime::parse_from_rfc3339(text) {
            Ok(at) if at.timestamp_millis() > 0 => update.scheduled_at_ms = Some(Some(at.timestamp_millis())),
            _ => issues.push(Issue::coded(
                "scheduledAt",
                Code::InvalidField,
                "scheduledAt must be an RFC 3339 date-time after 1970 (or null to send at once)",
            )),
        },
        Some(_) => issues.push(Issue::coded("scheduledAt", Code::InvalidField, "scheduledAt must be a string or null")),
    }
    match body.get("experiment") {
        None => {}
        Some(Value::Null) => update.experiment = Some(None),
        Some(value) => match experiment(value) {
            Ok(experiment) => update.experiment = Some(Some(experiment)),
            Err(issue) => issues.push(issue),
        },
    }
    let nothing = update.name.is_none()
        && update.audience.is_none()
        && update.scheduled_at_ms.is_none()
        && update.experiment.is_none();
    if issues.is_empty() && nothing {
        issues.push(Issue {
            key: None,
            code: Some(Code::MissingField),
            message: "an update needs at least one of name, audience, scheduledAt, experiment".to_owned(),
        });
    }
    if issues.is_empty() { Ok(update) } else { Err(invalid(issues)) }
}

/// An experiment as `GET /broadcasts/{id}` shows it (ids and milliseconds), checked by itself
/// (`ExperimentDef::check`): the issue names the field that breaks a rule.
fn experiment(value: &Value) -> Result<ExperimentDef, Issue> {
    let experiment: ExperimentDef = serde_json::from_value(value.clone()).map_err(|error| {
        Issue::coded(
            "experiment",
            Code::InvalidField,
            format!("experiment must be an experiment as GET /broadcasts/{{id}} shows it, or null: {error}"),
        )
    })?;
    experiment.check().map_err(|invalid| Issue::coded(&invalid.field, Code::InvalidField, invalid.message))?;
    if let Metric::Conversion { schema_id, .. } = &experiment.metric
        && !platform::storable::is_storable(schema_id)
    {
        return Err(Issue::coded("experiment.metric.schemaId", Code::InvalidField, "names no event schema"));
    }
    for (index, variant) in experiment.variants.iter().enumerate() {
        let fields = [
            ("subject", variant.subject.as_deref()),
            ("preheader", variant.preheader.as_deref()),
            ("templateId", variant.template_id.as_deref()),
            ("senderId", variant.sender_id.as_deref()),
        ];
        for (field, text) in fields {
            if text.is_some_and(|text| !platform::storable::is_storable(text) || text.chars().any(char::is_control)) {
                let key = format!("experiment.variants[{index}].{field}");
                return Err(Issue::coded(&key, Code::InvalidField, format!("{key} holds a control character")));
            }
        }
    }
    if experiment.control.as_deref().is_some_and(|control| !platform::storable::is_storable(control)) {
        return Err(Issue::coded("experiment.control", Code::InvalidField, "experiment.control is not a variant"));
    }
    Ok(experiment)
}

/// What the space holds of a template an experiment names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TemplateFacts {
    /// A marketing template whose only data key is its recipient: one a broadcast can send.
    pub broadcastable: bool,
    /// It has language variants, whose subjects a variant's subject would replace.
    pub localized: bool,
}

/// What the space holds of the templates and senders an update's experiment names (absent:
/// not one of the space's), and whether the broadcast's own template has language variants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ExperimentFacts {
    pub templates: BTreeMap<String, TemplateFacts>,
    /// Each sender's: whether it has the postal address marketing mail's footer needs.
    pub senders: BTreeMap<String, bool>,
    pub own_template_localized: bool,
    /// A conversion metric's schema is an event schema of the space.
    pub conversion_schema_found: bool,
}

/// Refuses an experiment whose variants name a template or sender the space does not have or
/// cannot send a broadcast with, or replace the subject of a template with language variants,
/// as the workspace file's apply does; the issue names the variant's field.
pub(crate) fn check_experiment(experiment: &ExperimentDef, facts: &ExperimentFacts) -> Result<(), Refusal> {
    let mut issues = Vec::new();
    for (index, variant) in experiment.variants.iter().enumerate() {
        let field = |name: &str| format!("experiment.variants[{index}].{name}");
        let template = variant.template_id.as_ref().map(|id| (id, facts.templates.get(id)));
        match template {
            Some((id, None)) => issues.push(Issue::coded(
                field("templateId"),
                Code::InvalidField,
                format!("no template {id:?} in this space"),
            )),
            Some((_, Some(facts))) if !facts.broadcastable => issues.push(Issue::coded(
                field("templateId"),
                Code::InvalidField,
                "a variant's template must be a marketing template whose only data key is its recipient",
            )),
            _ => {}
        }
        if let Some(id) = &variant.sender_id {
            match facts.senders.get(id) {
                None => issues.push(Issue::coded(
                    field("senderId"),
                    Code::InvalidField,
                    format!("no sender {id:?} in this space"),
                )),
                Some(false) => issues.push(Issue::coded(
                    field("senderId"),
                    Code::InvalidField,
                    "a variant's sender needs a postal address for the footer of marketing mail (CAN-SPAM)",
                )),
                Some(true) => {}
            }
        }
        let localized = match template {
            Some((_, Some(facts))) => facts.localized,
            Some((_, None)) => false,
            None => facts.own_template_localized,
        };
        let reworded = [("subject", variant.subject.is_some()), ("preheader", variant.preheader.is_some())];
        for (name, _) in reworded.into_iter().filter(|(_, set)| *set && localized) {
            issues.push(Issue::coded(
                field(name),
                Code::InvalidField,
                format!(
                    "the template has language variants, in whose languages a variant's {name} would not be; \
                     use a template of its own for the variant"
                ),
            ));
        }
    }
    if let Metric::Conversion { schema_id, .. } = &experiment.metric
        && !facts.conversion_schema_found
    {
        let message = format!("no event schema {schema_id:?} in this space");
        issues.push(Issue::coded("experiment.metric.schemaId", Code::InvalidField, message));
    }
    if issues.is_empty() { Ok(()) } else { Err(invalid(issues)) }
}

/// When a run requested at `now` starts: at the schedule when it is still ahead, else at once.
pub fn start_at(scheduled_at_ms: Option<i64>, now: i64) -> i64 {
    scheduled_at_ms.filter(|at| *at > now).unwrap_or(now)
}

/// The broadcast's own stream at the version it was loaded at, and its authoring stream
/// unchanged.
fn at_loaded(broadcast_id: &str, loaded: &Loaded, event: LogEvent, now: i64) -> (StreamAppend, Guard) {
    let expected = match loaded.version {
        0 => ExpectedVersion::NoStream,
        version => ExpectedVersion::Exactly(version),
    };
    let stream = StreamAppend::one(stream_id(broadcast_id), expected, event, now);
    (stream, Guard::stream_at(&store::authored_stream(broadcast_id), loaded.authored_version))
}

/// The broadcast from the log (`None`: not one of the space's), what is known of the audience
/// the command checks, the guard that keeps a segment audience's stream where it was read, and
/// what the space holds of what an update's experiment names.
pub(crate) type Broadcast = Option<(Loaded, AudienceFound, Option<Guard>, ExperimentFacts)>;

/// `PATCH /broadcasts/{id}`.
pub(crate) struct UpdateBroadcast {
    pub space_id: SpaceId,
    pub broadcast_id: String,
    pub update: Update,
}

impl Decide for UpdateBroadcast {
    type Loaded = Broadcast;
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, loaded: Broadcast, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let (space_id, broadcast_id) = (self.space_id.as_str(), self.broadcast_id.as_str());
        let current = loaded.as_ref().map(|(loaded, _, _, _)| &loaded.current);
        if let Some(current) = current {
            check_echoed(&self.update, &document(broadcast_id, &current.definition, given.now_ms))?;
        }
        if let (Some(Some(experiment)), Some((_, _, _, facts))) = (&self.update.experiment, &loaded) {
            check_experiment(experiment, facts)?;
        }
        let found = loaded.as_ref().map_or(AudienceFound::Yes, |(_, found, _, _)| *found);
        let (event, next) = decide_update(broadcast_id, space_id, current, &self.update, found, given.now_ms)?;
        let Some((loaded, _, audience_guard, _)) = loaded else {
            return Err(Refusal::Failed("an update decided without its broadcast".to_owned()));
        };
        let body = document(broadcast_id, &next, given.now_ms);
        let (stream, authored) = at_loaded(broadcast_id, &loaded, LogEvent::BroadcastUpdated(event), given.now_ms);
        let guards = [store::no_active_run(broadcast_id), authored].into_iter().chain(audience_guard).collect();
        Ok(Outcome::one(stream, guards, Reply::ok(body)))
    }
}

/// A run as the API shows it when it was just requested.
fn requested_run(run: &proto::BroadcastRunRequested, audience: &Audience) -> Value {
    json!({
        "id": run.run_id,
        "broadcastId": run.broadcast_id,
        "status": "scheduled",
        "templateId": run.template_id,
        "senderId": Some(&run.sender_id).filter(|id| !id.is_empty()),
        "audience": audience,
        "startAt": platform::time::format_millis(run.start_at_ms),
        "requestedAt": platform::time::format_millis(run.requested_at_ms),
        "startedAt": null,
        "finishedAt": null,
        "error": null,
        "counts": {"audience": null, "pending": 0, "queued": 0, "held": 0, "sent": 0, "failed": 0, "outcomeUnknown": 0,
                   "bounced": 0, "complained": 0, "unsubscribed": 0, "opened": 0, "clicked": 0,
                   "openRate": null, "clickRate": null,
                   "skipped": {"noConsent": 0, "notSubscribed": 0, "suppressed": 0, "allowance": 0, "noAddress": 0,
                               "gone": 0, "frequencyCap": 0, "quietHours": 0, "experimentStopped": 0}},
        "experiment": serde_json::from_str::<Value>(&run.experiment_json).ok().map(|definition| json!({
            "phase": null, "definition": definition, "decideAt": null, "winner": null, "verdict": null,
        })),
    })
}

/// `POST /broadcasts/{id}/send`.
pub(crate) struct SendBroadcast {
    pub space_id: SpaceId,
    pub broadcast_id: String,
}

impl Decide for SendBroadcast {
    type Loaded = Broadcast;
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, loaded: Broadcast, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let (space_id, broadcast_id) = (self.space_id.as_str(), self.broadcast_id.as_str());
        let current = loaded.as_ref().map(|(loaded, _, _, _)| &loaded.current);
        let found = loaded.as_ref().map_or(AudienceFound::Yes, |(_, found, _, _)| *found);
        let run_id = given.fresh.id("bcr");
        let run = decide_send(broadcast_id, space_id, current, found, (&run_id, given.now_ms))?;
        let Some((loaded, _, audience_guard, _)) = loaded else {
            return Err(Refusal::Failed("a send decided without its broadcast".to_owned()));
        };
        let audience = &loaded.current.definition.audience;
        let body = requested_run(&run, audience);
        let audience = serde_json::to_value(audience).map_err(|error| Refusal::Failed(format!("{error:#}")))?;
        let mut guards = store::run_guards(&run, audience);
        let (stream, authored) = at_loaded(broadcast_id, &loaded, LogEvent::BroadcastRunRequested(run), given.now_ms);
        guards.push(authored);
        guards.extend(audience_guard);
        Ok(Outcome::one(stream, guards, Reply::accepted(body)))
    }
}

impl platform::refusal::Answered for Refusal {}

/// A refused broadcast update as the contract answers it.
impl platform::refusal::Refusal for Refusal {
    fn code(&self) -> Code {
        match self {
            Self::Invalid { .. } => Code::InvalidBroadcast,
            Self::NotFound(_) => Code::BroadcastNotFound,
            Self::RunActive => Code::BroadcastRunActive,
            Self::AudienceNotFound(Audience::Segment { .. }) => Code::SegmentNotFound,
            Self::AudienceNotFound(Audience::Topic { .. }) => Code::TopicNotFound,
            Self::Failed(_) => Code::InternalError,
        }
    }

    fn issues(&self) -> Vec<Issue> {
        match self {
            Self::Invalid { issues, .. } => issues.clone(),
            _ => Vec::new(),
        }
    }

    fn is_defect(&self) -> bool {
        matches!(self, Self::Failed(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(value: Value) -> Map<String, Value> {
        value.as_object().cloned().expect("an object")
    }

    /// What the OpenAPI document shows a caller sending is what the update takes: every
    /// example of `PATCH /broadcasts/{id}`'s body parses, with no field refused.
    #[test]
    fn the_documents_update_examples_are_taken() {
        let document: Value =
            serde_json::from_str(include_str!("../../../docs/openapi.json")).expect("the document is JSON");
        let examples = document
            .pointer("/paths/~1broadcasts~1{id}/patch/requestBody/content/application~1json/examples")
            .and_then(Value::as_object)
            .expect("the update's examples");
        assert!(!examples.is_empty());
        for (name, example) in examples {
            let value = body(example["value"].clone());
            if let Err(refusal) = parse_update(&value) {
                panic!("the example {name:?} is refused: {refusal:?}");
            }
        }
    }

    #[test]
    fn given_an_update_when_parsed_then_each_field_is_checked() {
        let update =
            parse_update(&body(json!({"name": " Launch ", "audience": {"segmentId": "seg_1"}, "scheduledAt": null})))
                .expect("valid");
        assert_eq!(update.name.as_deref(), Some("Launch"));
        assert_eq!(update.audience, Some(Audience::Segment { segment_id: "seg_1".into() }));
        assert_eq!(update.scheduled_at_ms, Some(None));
        let at = parse_update(&body(json!({"scheduledAt": "2030-01-02T03:04:05Z"}))).expect("valid");
        assert_eq!(at.scheduled_at_ms, Some(Some(1_893_553_445_000)));
        for bad in [
            json!({}),
            json!({"templateId": "tpl_1"}),
            json!({"status": "draft", "name": "x"}),
            json!({"name": ""}),
            json!({"audience": {"segmentId": "seg_1", "topicId": "top_1"}}),
            json!({"audience": "everyone"}),
            json!({"audience": {"type": "topic", "segmentId": "seg_1"}}),
            json!({"audience": {"type": "segment"}}),
            json!({"id": "bc_1", "updatedAt": "2026-01-01T00:00:00.000Z"}),
            json!({"scheduledAt": "tomorrow"}),
        ] {
            assert!(matches!(parse_update(&body(bad.clone())), Err(Refusal::Invalid { .. })), "{bad}");
        }
    }

    fn current(run_active: bool) -> Current {
        Current {
            definition: BroadcastDef {
                slug: "launch".into(),
                name: "Launch".into(),
                template_id: "tpl_1".into(),
                sender_id: None,
                audience: Audience::Topic { topic_id: "top_1".into() },
                scheduled_at_ms: None,
                experiment: None,
            },
            run_active,
        }
    }

    #[test]
    fn given_a_broadcast_when_updated_then_the_answer_folds_the_update_over_the_logged_state() {
        let update = parse_update(&body(json!({"audience": {"segmentId": "seg_2"}}))).expect("valid");
        let (event, next) =
            decide_update("bc_1", "spc_1", Some(&current(false)), &update, AudienceFound::Yes, 7).expect("decided");
        assert_eq!(next.audience, Audience::Segment { segment_id: "seg_2".into() });
        assert_eq!((next.name.as_str(), event.updated_at_ms, event.name), ("Launch", 7, None));
    }

    #[test]
    fn given_the_broadcast_as_shown_then_only_its_edits_change_and_fixed_fields_must_match() {
        let shown = domain::email::broadcasts::document("bc_1", &current(false).definition, 5);
        let mut edited = shown.clone();
        edited["name"] = json!("Relaunch");
        edited["updatedAt"] = json!("2031-01-01T00:00:00.000Z");
        let update = parse_update(edited.as_object().expect("object")).expect("the returned shape is accepted");
        assert_eq!(update.name.as_deref(), Some("Relaunch"));
        assert_eq!(update.audience, Some(Audience::Topic { topic_id: "top_1".into() }), "with its type");
        assert_eq!(check_echoed(&update, &shown), Ok(()));
        edited["templateId"] = json!("tpl_2");
        edited["slug"] = json!("other");
        let update = parse_update(edited.as_object().expect("object")).expect("parsed");
        let Err(Refusal::Invalid { issues, .. }) = check_echoed(&update, &shown) else { panic!("refused") };
        let keys: Vec<_> = issues.iter().filter_map(|issue| issue.key.as_deref()).collect();
        assert_eq!(keys, ["slug", "templateId"]);
    }

    #[test]
    fn given_a_run_or_a_missing_audience_when_updated_or_sent_then_refused() {
        let update = parse_update(&body(json!({"name": "New"}))).expect("valid");
        let refused = decide_update("bc_1", "spc_1", Some(&current(true)), &update, AudienceFound::Yes, 7);
        assert_eq!(refused.map(|_| ()), Err(Refusal::RunActive));
        let missing = decide_update("bc_1", "spc_1", None, &update, AudienceFound::Yes, 7);
        assert_eq!(missing.map(|_| ()), Err(Refusal::NotFound("bc_1".into())));
        let to_segment = parse_update(&body(json!({"audience": {"segmentId": "seg_9"}}))).expect("valid");
        let unknown = decide_update("bc_1", "spc_1", Some(&current(false)), &to_segment, AudienceFound::No, 7);
        assert!(matches!(unknown, Err(Refusal::AudienceNotFound(Audience::Segment { .. }))));
        let active = decide_send("bc_1", "spc_1", Some(&current(true)), AudienceFound::Yes, ("bcr_1", 7));
        assert_eq!(active.map(|_| ()), Err(Refusal::RunActive));
        let gone = decide_send("bc_1", "spc_1", Some(&current(false)), AudienceFound::No, ("bcr_1", 7));
        assert!(matches!(gone, Err(Refusal::AudienceNotFound(Audience::Topic { .. }))));
    }

    #[test]
    fn given_a_broadcast_when_sent_then_the_run_takes_its_audience_template_and_sender_as_decided() {
        let run = decide_send("bc_1", "spc_1", Some(&current(false)), AudienceFound::Yes, ("bcr_1", 7)).expect("sent");
        assert_eq!((run.run_id.as_str(), run.template_id.as_str(), run.start_at_ms), ("bcr_1", "tpl_1", 7));
        assert_eq!(run.audience.map(|audience| audience.topic_id), Some("top_1".to_owned()));
    }

    #[test]
    fn given_a_schedule_when_a_run_is_requested_then_it_starts_then_or_at_once_if_past() {
        assert_eq!(start_at(Some(5_000), 1_000), 5_000);
        assert_eq!(start_at(Some(500), 1_000), 1_000);
        assert_eq!(start_at(None, 1_000), 1_000);
    }

    use crate::decision::harness::{NOW_MS, given};
    use crate::decision::{Outcome, Status};

    fn loaded(run_active: bool, found: AudienceFound) -> Broadcast {
        loaded_with(run_active, found, ExperimentFacts::default())
    }

    fn loaded_with(run_active: bool, found: AudienceFound, facts: ExperimentFacts) -> Broadcast {
        Some((Loaded { current: current(run_active), version: 2, authored_version: 5 }, found, None, facts))
    }

    fn update(value: Value) -> UpdateBroadcast {
        UpdateBroadcast {
            space_id: "spc_1".into(),
            broadcast_id: "bc_1".into(),
            update: parse_update(&body(value)).expect("valid"),
        }
    }

    fn send() -> SendBroadcast {
        SendBroadcast { space_id: "spc_1".into(), broadcast_id: "bc_1".into() }
    }

    #[test]
    fn given_a_broadcast_when_updated_then_the_update_is_appended_at_its_version_and_answered_folded() {
        let reply = given(loaded(false, AudienceFound::Yes)).when(&update(json!({"name": "Relaunch"}))).then_events(&[
            LogEvent::BroadcastUpdated(proto::BroadcastUpdated {
                broadcast_id: "bc_1".into(),
                space_id: "spc_1".into(),
                name: Some("Relaunch".into()),
                audience: None,
                scheduled_at_set: false,
                scheduled_at_ms: 0,
                updated_at_ms: NOW_MS,
                experiment_set: false,
                experiment_json: String::new(),
            }),
        ]);
        assert_eq!(reply.status, Status::Ok);
        assert_eq!(reply.json()["data"]["name"], "Relaunch");
        assert_eq!(reply.json()["data"]["templateId"], "tpl_1");
        let Outcome::Append(writes) =
            given(loaded(false, AudienceFound::Yes)).when(&update(json!({"name": "Relaunch"}))).decided()
        else {
            panic!("appended")
        };
        assert_eq!(writes.streams[0].expected, ExpectedVersion::Exactly(2));
        let sqls: Vec<_> = writes.guards.iter().map(|guard| guard.sql).collect();
        let authored = Guard::stream_at(&store::authored_stream("bc_1"), 5);
        assert_eq!(sqls, [store::no_active_run("bc_1").sql, authored.sql]);
    }

    #[test]
    fn given_no_broadcast_an_active_run_or_a_missing_audience_when_updated_then_refused() {
        given(None).when(&update(json!({"name": "New"}))).then_refused(Refusal::NotFound("bc_1".into()));
        given(loaded(true, AudienceFound::Yes)).when(&update(json!({"name": "New"}))).then_refused(Refusal::RunActive);
        let to_segment = update(json!({"audience": {"segmentId": "seg_9"}}));
        given(loaded(false, AudienceFound::No))
            .when(&to_segment)
            .then_refused(Refusal::AudienceNotFound(Audience::Segment { segment_id: "seg_9".into() }));
    }

    #[test]
    fn given_a_broadcast_when_sent_then_a_run_is_requested_under_a_drawn_id() {
        let reply =
            given(loaded(false, AudienceFound::Yes)).when(&send()).then_events(&[LogEvent::BroadcastRunRequested(
                proto::BroadcastRunRequested {
                    run_id: "bcr_1".into(),
                    broadcast_id: "bc_1".into(),
                    space_id: "spc_1".into(),
                    template_id: "tpl_1".into(),
                    sender_id: String::new(),
                    audience: Some(Audience::Topic { topic_id: "top_1".into() }.to_proto()),
                    start_at_ms: NOW_MS,
                    requested_at_ms: NOW_MS,
                    experiment_json: String::new(),
                },
            )]);
        assert_eq!(reply.status, Status::Accepted);
        assert_eq!(
            (&reply.json()["data"]["id"], &reply.json()["data"]["status"], &reply.json()["data"]["senderId"]),
            (&json!("bcr_1"), &json!("scheduled"), &Value::Null)
        );
    }

    #[test]
    fn given_an_active_run_or_a_gone_audience_when_sent_then_refused() {
        given(loaded(true, AudienceFound::Yes)).when(&send()).then_refused(Refusal::RunActive);
        given(loaded(false, AudienceFound::No))
            .when(&send())
            .then_refused(Refusal::AudienceNotFound(Audience::Topic { topic_id: "top_1".into() }));
        given(None).when(&send()).then_refused(Refusal::NotFound("bc_1".into()));
    }

    fn experiment_body(variants: Value) -> Value {
        json!({"experiment": {"testShare": 20, "variants": variants, "control": null, "metric": {"type": "opens"},
                              "waitMs": 3_600_000, "withoutClearWinner": "send_best"}})
    }

    fn facts() -> ExperimentFacts {
        ExperimentFacts {
            templates: BTreeMap::from([
                ("tpl_2".to_owned(), TemplateFacts { broadcastable: true, localized: false }),
                ("tpl_de".to_owned(), TemplateFacts { broadcastable: true, localized: true }),
                ("tpl_tx".to_owned(), TemplateFacts { broadcastable: false, localized: false }),
            ]),
            senders: BTreeMap::from([("snd_ok".to_owned(), true), ("snd_bare".to_owned(), false)]),
            own_template_localized: false,
            conversion_schema_found: false,
        }
    }

    #[test]
    fn given_an_experiment_as_shown_when_updated_then_it_is_appended_and_the_broadcast_shows_it() {
        let body = experiment_body(json!([{"id": "a", "subject": "One"}, {"id": "b", "templateId": "tpl_2",
                                            "senderId": "snd_ok"}]));
        let reply = given(loaded_with(false, AudienceFound::Yes, facts())).when(&update(body.clone())).decided();
        let reply = reply.reply().cloned().expect("a reply");
        assert_eq!(reply.status, Status::Ok, "{}", reply.json());
        assert_eq!(reply.json()["data"]["experiment"], body["experiment"], "shown as sent");
        let Outcome::Append(writes) =
            given(loaded_with(false, AudienceFound::Yes, facts())).when(&update(body)).decided()
        else {
            panic!("appended")
        };
        let LogEvent::BroadcastUpdated(event) = &writes.streams[0].events[0].event else { panic!("an update") };
        assert!(event.experiment_set);
        let folded = apply_update(current(false).definition, event);
        assert_eq!(folded.experiment.map(|experiment| experiment.variants.len()), Some(2), "the fold keeps it");
        let removed = given(loaded(false, AudienceFound::Yes)).when(&update(json!({"experiment": null}))).decided();
        assert_eq!(removed.reply().expect("a reply").json()["data"]["experiment"], Value::Null);
    }

    #[test]
    fn given_an_experiment_that_breaks_a_rule_when_parsed_then_the_field_is_named() {
        let cases = [
            (json!({"experiment": {"testShare": 70}}), "experiment"),
            (experiment_body(json!([{"id": "a"}])), "experiment.variants"),
            (experiment_body(json!([{"id": "A"}, {"id": "b"}])), "experiment.variants[0].id"),
            (
                experiment_body(json!([{"id": "a", "subject": "x\r\nBcc: y"}, {"id": "b"}])),
                "experiment.variants[0].subject",
            ),
        ];
        for (body, key) in cases {
            let Err(Refusal::Invalid { issues, .. }) = parse_update(&self::body(body.clone())) else {
                panic!("refused: {body}")
            };
            assert_eq!(issues[0].key.as_deref(), Some(key), "{body}");
        }
        let mut conversion = experiment_body(json!([{"id": "a"}, {"id": "b"}]));
        conversion["experiment"]["metric"] = json!({"type": "conversion", "schemaId": "sch_1", "windowMs": 7_200_000});
        let Err(Refusal::Invalid { issues, .. }) = parse_update(&body(conversion)) else { panic!("refused") };
        assert_eq!(issues[0].key.as_deref(), Some("experiment.metric.windowMs"), "a window longer than the wait");
    }

    #[test]
    fn given_variants_naming_what_the_space_cannot_send_when_updated_then_each_is_refused_by_field() {
        let body = experiment_body(json!([
            {"id": "a", "templateId": "tpl_nope"},
            {"id": "b", "templateId": "tpl_tx", "senderId": "snd_bare"},
            {"id": "c", "templateId": "tpl_de", "subject": "Hallo"},
            {"id": "d", "senderId": "snd_nope"},
        ]));
        let refused =
            given(loaded_with(false, AudienceFound::Yes, facts())).when(&update(body)).0.err().expect("refused");
        let Refusal::Invalid { issues, .. } = refused else { panic!("invalid: {refused:?}") };
        let keys: Vec<_> = issues.iter().filter_map(|issue| issue.key.as_deref()).collect();
        assert_eq!(
            keys,
            [
                "experiment.variants[0].templateId",
                "experiment.variants[1].templateId",
                "experiment.variants[1].senderId",
                "experiment.variants[2].subject",
                "experiment.variants[3].senderId",
            ]
        );
        let mut conversion = experiment_body(json!([{"id": "a"}, {"id": "b"}]));
        conversion["experiment"]["metric"] = json!({"type": "conversion", "schemaId": "sch_1", "windowMs": 3_600_000});
        let refused = given(loaded_with(false, AudienceFound::Yes, facts()))
            .when(&update(conversion.clone()))
            .0
            .err()
            .expect("refused");
        let Refusal::Invalid { issues, .. } = refused else { panic!("invalid: {refused:?}") };
        assert_eq!(issues[0].key.as_deref(), Some("experiment.metric.schemaId"), "not an event schema of the space");
        let found = ExperimentFacts { conversion_schema_found: true, ..facts() };
        given(loaded_with(false, AudienceFound::Yes, found)).when(&update(conversion)).decided();
        let own_localized = ExperimentFacts { own_template_localized: true, ..facts() };
        let subject = experiment_body(json!([{"id": "a"}, {"id": "b", "subject": "New"}]));
        let refused = given(loaded_with(false, AudienceFound::Yes, own_localized))
            .when(&update(subject))
            .0
            .err()
            .expect("refused");
        assert!(matches!(refused, Refusal::Invalid { .. }), "the broadcast's own template has language variants");
    }
}
