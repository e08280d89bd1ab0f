//! The segment decisions: validating a create body, resolving the filter the AI provider
//! made against the space's catalog (event and topic slugs to ids, `has email consent` to the
//! contact schemas' consent attributes, and every other field to a contact field that exists),
//! creating a segment and deleting one. Pure: the catalog and the filter come in as arguments.

use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet};

use filter::{CONSENT_EMAIL, Condition, Engaged, FieldPath, Filter, Op, SUBSCRIPTIONS, Scalar, Source};
use platform::error::{Code, Issue};
use platform::events::LogEvent;
use platform::ids::SpaceId;
use platform::log::{ExpectedVersion, StreamAppend};
use platform::proto;
use serde_json::{Map, Value, json};

use crate::decision::{Decide, Given, Outcome, Reply};

/// The fields a create accepts.
pub(crate) const CREATE_FIELDS: [&str; 2] = ["name", "definition"];
/// The most characters of a segment's name.
pub(crate) const MAX_NAME_CHARS: usize = 200;
/// The most characters of a segment's definition.
pub(crate) const MAX_DEFINITION_CHARS: usize = 2000;
/// The fields every contact has beside its schema's attributes.
pub(crate) const CONTACT_FIELDS: [&str; 7] = ["id", "source", "userId", "email", "phone", "createdAt", "updatedAt"];

/// A validated create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NewSegment {
    pub name: String,
    pub definition: String,
}

/// What a segment's filter may name in a space.
#[derive(Debug, Clone, Default)]
pub struct Vocabulary {
    /// Attribute keys of each contact schema, and which of them are email consent attributes.
    pub contact_schemas: Vec<ContactSchema>,
    /// Event schemas by slug and by id (both resolve to the id).
    pub events: BTreeMap<String, String>,
    /// Topics by slug and by id (both resolve to the id).
    pub topics: BTreeMap<String, String>,
    /// Templates, broadcasts and workflows by slug and by id (both resolve to the id).
    pub templates: BTreeMap<String, String>,
    pub broadcasts: BTreeMap<String, String>,
    pub workflows: BTreeMap<String, String>,
    /// The step ids of each workflow, by workflow id.
    pub workflow_steps: BTreeMap<String, BTreeSet<String>>,
}

#[derive(Debug, Clone, Default)]
pub struct ContactSchema {
    pub attributes: BTreeSet<String>,
    pub consent_keys: Vec<String>,
}

/// Why a segment is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The body is not a valid segment; `issues` names every problem (400 `invalid_segment`).
    #[error("{message}")]
    Invalid { message: String, issues: Vec<Issue> },
    /// The definition did not give a filter this space can evaluate (422
    /// `ai_generation_failed`); nothing is spent or written.
    #[error("the definition could not be turned into a segment: {0}")]
    Unusable(String),
    /// The space has no AI credits left (402 `insufficient_credits`).
    #[error("the space has no AI credits left; defining a segment needs one")]
    NoCredits,
    /// No live segment with this id in the caller's space (404 `segment_not_found`).
    #[error("no segment {0:?} in this space")]
    NotFound(String),
}

/// The log stream of a segment.
pub fn stream_id(segment_id: &str) -> String {
    format!("segment-{segment_id}")
}

fn invalid(issues: Vec<Issue>) -> Refusal {
    Refusal::Invalid { message: Issue::summary(&issues, "this segment"), issues }
}

fn text_field(body: &Map<String, Value>, key: &str, max: usize, issues: &mut Vec<Issue>) -> Option<String> {
    match body.get(key) {
        None | Some(Value::Null) => {
            issues.push(Issue::coded(key, Code::MissingField, format!("{key} is required")));
            None
        }
        Some(Value::String(text)) if platform::storable::is_blank(text) => {
            issues.push(Issue::coded(key, Code::InvalidField, format!("{key} must not be blank")));
            None
        }
        Some(Value::String(text)) if text.chars().count() > max || !platform::storable::is_storable(text) => {
            issues.push(Issue::coded(
                key,
                Code::InvalidField,
                format!("{key} must be at most {max} characters of text"),
            ));
            None
        }
        Some(Value::String(text)) => Some(platform::storable::trimmed(text).to_owned()),
        Some(_) => {
            issues.push(Issue::coded(key, Code::InvalidField, format!("{key} must be a string")));
            None
        }
    }
}

/// Validates a create body: `name` and `definition`, both required text.
pub(crate) fn parse_create(body: &Map<String, Value>) -> Result<NewSegment, Refusal> {
    let mut issues: Vec<Issue> = body
        .keys()
        .filter(|key| !CREATE_FIELDS.contains(&key.as_str()))
        .map(|key| Issue::coded(key, Code::UnknownField, format!("{key} is not a field of a segment")))
        .collect();
    let name = text_field(body, "name", MAX_NAME_CHARS, &mut issues);
    let definition = text_field(body, "definition", MAX_DEFINITION_CHARS, &mut issues);
    match (name, definition) {
        (Some(name), Some(definition)) if issues.is_empty() => Ok(NewSegment { name, definition }),
        _ => Err(invalid(issues)),
    }
}

fn unusable(reason: &str) -> Refusal {
    Refusal::Unusable(reason.to_owned())
}

/// Resolves `filter` against the space: the stored filter reads ids and attribute keys only.
pub fn resolve(filter: Filter, vocabulary: &Vocabulary) -> Result<Filter, Refusal> {
    filter::rewrite(filter, &mut |leaf| match leaf {
        Filter::Performed(mut performed) => {
            performed.event =
                vocabulary.events.get(&performed.event).cloned().ok_or_else(|| {
                    unusable(&format!("there is no event schema {:?} in this space", performed.event))
                })?;
            Ok(Filter::Performed(performed))
        }
        Filter::Condition(condition) => resolve_condition(condition, vocabulary),
        Filter::Engaged(engaged) => resolve_engaged(engaged, vocabulary).map(Filter::Engaged),
        other => Ok(other),
    })
}

/// An engagement's source, named by slug or id, to ids.
fn resolve_engaged(mut engaged: Engaged, vocabulary: &Vocabulary) -> Result<Engaged, Refusal> {
    let find = |names: &BTreeMap<String, String>, kind: &str, name: &str| {
        names.get(name).cloned().ok_or_else(|| unusable(&format!("there is no {kind} {name:?} in this space")))
    };
    engaged.source = match engaged.source {
        Source::Any => Source::Any,
        Source::Broadcast(name) => Source::Broadcast(find(&vocabulary.broadcasts, "broadcast", &name)?),
        Source::Template(name) => Source::Template(find(&vocabulary.templates, "template", &name)?),
        Source::Workflow { workflow, step } => {
            let workflow = find(&vocabulary.workflows, "workflow", &workflow)?;
            if let Some(step) = &step
                && !vocabulary.workflow_steps.get(&workflow).is_some_and(|steps| steps.contains(step))
            {
                return Err(unusable(&format!("workflow {workflow:?} has no step {step:?}")));
            }
            Source::Workflow { workflow, step }
        }
    };
    Ok(engaged)
}

fn resolve_condition(condition: Condition, vocabulary: &Vocabulary) -> Result<Filter, Refusal> {
    let path = condition.field.as_str();
    if path == CONSENT_EMAIL {
        let holds = condition.op == Op::Eq(Scalar::Bool(true));
        let per_schema: Vec<Filter> = vocabulary
            .contact_schemas
            .iter()
            .filter(|schema| !schema.consent_keys.is_empty())
            .map(|schema| {
                let all =
                    schema.consent_keys.iter().map(|key| consent_condition(key)).collect::<Result<Vec<_>, _>>()?;
                Ok(filter::all_of(all))
            })
            .collect::<Result<_, Refusal>>()?;
        if !holds || per_schema.is_empty() {
            return Err(unusable(if holds {
                "no contact schema of this space has an email consent attribute"
            } else {
                "consent.email can only be asked to be true (`has email consent`)"
            }));
        }
        return Ok(filter::any_of(per_schema));
    }
    let parts: Vec<String> = condition.field.segments().map(str::to_owned).collect();
    let root = parts.first().map_or("", String::as_str);
    if root == SUBSCRIPTIONS {
        let topic = parts.get(1).map_or("", String::as_str);
        let topic_id = vocabulary
            .topics
            .get(topic)
            .ok_or_else(|| unusable(&format!("there is no topic {topic:?} in this space")))?;
        let field =
            FieldPath::parse(&format!("{SUBSCRIPTIONS}.{topic_id}")).map_err(|error| unusable(error.message()))?;
        return Ok(Filter::Condition(Condition { field, op: condition.op }));
    }
    let known = CONTACT_FIELDS.contains(&root)
        || vocabulary.contact_schemas.iter().any(|schema| schema.attributes.contains(root));
    if !known {
        return Err(unusable(&format!("contacts have no field {root:?}")));
    }
    Ok(Filter::Condition(condition))
}

fn consent_condition(key: &str) -> Result<Filter, Refusal> {
    let field = FieldPath::parse(key).map_err(|error| unusable(error.message()))?;
    Ok(Filter::Condition(Condition { field, op: Op::Eq(Scalar::Bool(true)) }))
}

/// `POST /segments`: the filter is made once per request (kept across attempts).
pub(crate) struct CreateSegment {
    pub space_id: SpaceId,
    pub new: NewSegment,
    /// The filter the AI provider made of the definition: the shell's load asks for it once
    /// and keeps it here for a later attempt.
    pub filter: OnceCell<Filter>,
}

impl Decide for CreateSegment {
    /// The space's vocabulary and the filter the AI provider made.
    type Loaded = (Vocabulary, Filter);
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, (vocabulary, filter): Self::Loaded, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let space_id = self.space_id.as_str();
        let description = filter::describe(&filter);
        let resolved = resolve(filter, &vocabulary)?;
        let segment_id = given.fresh.id("seg");
        let event = LogEvent::SegmentCreated(proto::SegmentCreated {
            segment_id: segment_id.clone(),
            space_id: space_id.to_owned(),
            name: self.new.name.clone(),
            definition: self.new.definition.clone(),
            description: description.clone(),
            filter_json: resolved.to_json().to_string(),
            created_at_ms: given.now_ms,
        });
        // Membership is computed by the projector; a read with the Consistency-Token of
        // this answer shows it.
        let document = json!({
            "id": segment_id,
            "name": self.new.name,
            "definition": self.new.definition,
            "description": description,
            "createdAt": platform::time::format_millis(given.now_ms),
            "memberCount": null,
        });
        let body = document;
        let stream = StreamAppend::one(stream_id(&segment_id), ExpectedVersion::NoStream, event, given.now_ms);
        let guards = vec![domain::admission::spend_guard(space_id, 1)];
        Ok(Outcome::one(stream, guards, Reply::created(body)))
    }
}

/// `DELETE /segments/{id}`.
pub(crate) struct DeleteSegment {
    pub space_id: SpaceId,
    pub segment_id: String,
}

impl Decide for DeleteSegment {
    /// The segment's stream version and space, when it exists and is not deleted.
    type Loaded = Option<(i64, String)>;
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, loaded: Self::Loaded, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let (space_id, segment_id) = (self.space_id.as_str(), self.segment_id.as_str());
        // A concurrent delete that won leaves this one to find the segment gone: 404.
        let version = match loaded {
            Some((version, owner)) if owner == space_id => version,
            _ => return Err(Refusal::NotFound(segment_id.to_owned())),
        };
        let body = json!({"id": segment_id, "deleted": true});
        let event = LogEvent::SegmentDeleted(proto::SegmentDeleted {
            segment_id: segment_id.to_owned(),
            space_id: space_id.to_owned(),
            deleted_at_ms: given.now_ms,
        });
        let stream = StreamAppend::one(stream_id(segment_id), ExpectedVersion::Exactly(version), event, given.now_ms);
        Ok(Outcome::one(stream, Vec::new(), Reply::ok(body)))
    }
}

impl platform::refusal::Answered for Refusal {}

/// A refused segment as the contract answers it.
impl platform::refusal::Refusal for Refusal {
    fn code(&self) -> Code {
        match self {
            Self::Invalid { .. } => Code::InvalidSegment,
            Self::Unusable(_) => Code::AiGenerationFailed,
            Self::NoCredits => Code::InsufficientCredits,
            Self::NotFound(_) => Code::SegmentNotFound,
        }
    }

    fn issues(&self) -> Vec<Issue> {
        match self {
            Self::Invalid { issues, .. } => issues.clone(),
            Self::Unusable(_) => vec![Issue::coded("definition", Code::AiGenerationFailed, self.to_string())],
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Status;
    use crate::decision::harness::{NOW_MS, given};
    use serde_json::json;

    fn vocabulary() -> Vocabulary {
        Vocabulary {
            contact_schemas: vec![ContactSchema {
                attributes: ["plan".to_owned(), "email_opt_in".to_owned()].into(),
                consent_keys: vec!["email_opt_in".to_owned()],
            }],
            events: [("purchase".to_owned(), "sch_p".to_owned()), ("sch_p".to_owned(), "sch_p".to_owned())].into(),
            topics: [("news".to_owned(), "top_n".to_owned())].into(),
            templates: [("welcome".to_owned(), "tpl_w".to_owned())].into(),
            broadcasts: [("spring".to_owned(), "brd_s".to_owned()), ("brd_s".to_owned(), "brd_s".to_owned())].into(),
            workflows: [("onboarding".to_owned(), "wfl_o".to_owned())].into(),
            workflow_steps: [("wfl_o".to_owned(), ["send_welcome".to_owned()].into())].into(),
        }
    }

    fn resolved(text: &str) -> Result<Filter, Refusal> {
        resolve(filter::parse_plain(text).expect("parses"), &vocabulary())
    }

    #[test]
    fn given_slugs_and_consent_when_resolved_then_the_filter_reads_ids_and_attributes() {
        let filter = resolved("performed purchase in the last 30 days and subscribed to news and has email consent")
            .expect("resolves");
        assert_eq!(
            filter.to_json(),
            json!({"all": [
                {"performed": {"event": "sch_p", "atLeast": 1, "withinSeconds": 2_592_000}},
                {"field": "subscriptions.top_n", "op": "eq", "value": "subscribed"},
                {"field": "email_opt_in", "op": "eq", "value": true},
            ]})
        );
        assert!(resolved("plan is pro or email ends with @acme.com").is_ok(), "attributes and identity fields");
    }

    #[test]
    fn given_engagement_sources_by_slug_when_resolved_then_they_read_ids() {
        let filter = resolved(
            "opened an email from broadcast spring in the last 7 days or clicked a link in an email from template \
             welcome or opened an email from step send_welcome of workflow onboarding or opened",
        )
        .expect("resolves");
        assert_eq!(
            filter.to_json(),
            json!({"any": [
                {"opened": {"from": {"broadcast": "brd_s"}, "withinSeconds": 604_800}},
                {"clicked": {"from": {"template": "tpl_w"}}},
                {"opened": {"from": {"workflow": "wfl_o", "step": "send_welcome"}}},
                {"opened": {}},
            ]})
        );
    }

    #[test]
    fn given_unknown_names_when_resolved_then_the_generation_is_refused_with_422() {
        for text in [
            "performed refund",
            "subscribed to sports",
            "plann is pro",
            "opened an email from broadcast autumn",
            "opened an email from template goodbye",
            "clicked a link in an email from workflow offboarding",
            "clicked a link in an email from step send_reminder of workflow onboarding",
        ] {
            assert!(matches!(resolved(text), Err(Refusal::Unusable(_))), "{text}");
        }
    }

    fn new_segment() -> NewSegment {
        NewSegment { name: "Buyers".into(), definition: "performed purchase".into() }
    }

    fn create() -> CreateSegment {
        CreateSegment { space_id: "spc_1".into(), new: new_segment(), filter: OnceCell::new() }
    }

    #[test]
    fn a_segment_is_created_under_a_fresh_id_with_its_resolved_filter_and_spends_a_credit() {
        let filter = filter::parse_plain("performed purchase").expect("parses");
        let description = filter::describe(&filter);
        let outcome = given((vocabulary(), filter.clone())).when(&create()).decided();
        assert_eq!(
            outcome.events(),
            [&LogEvent::SegmentCreated(proto::SegmentCreated {
                segment_id: "seg_1".into(),
                space_id: "spc_1".into(),
                name: "Buyers".into(),
                definition: "performed purchase".into(),
                description: description.clone(),
                filter_json: resolve(filter, &vocabulary()).expect("resolves").to_json().to_string(),
                created_at_ms: NOW_MS,
            })]
        );
        let Outcome::Append(writes) = &outcome else { panic!("an append") };
        assert_eq!(writes.streams[0].stream_id, "segment-seg_1");
        assert!(matches!(writes.streams[0].expected, ExpectedVersion::NoStream));
        assert_eq!(writes.guards.len(), 1, "the credit it spends");
        let reply = outcome.reply().expect("a reply");
        assert_eq!(reply.status, Status::Created);
        assert_eq!(
            reply.json(),
            json!({"data": {
                "id": "seg_1",
                "name": "Buyers",
                "definition": "performed purchase",
                "description": description,
                "createdAt": platform::time::format_millis(NOW_MS),
                "memberCount": null,
            }})
        );
    }

    #[test]
    fn a_filter_naming_what_the_space_lacks_is_refused_and_writes_nothing() {
        let filter = filter::parse_plain("performed refund").expect("parses");
        given((vocabulary(), filter))
            .when(&create())
            .then_refused(Refusal::Unusable("there is no event schema \"refund\" in this space".into()));
    }

    #[test]
    fn a_segment_of_the_space_is_deleted_at_its_version_and_any_other_is_not_found() {
        let delete = |space: &str| DeleteSegment { space_id: space.into(), segment_id: "seg_1".into() };
        let reply =
            given(Some((2, "spc_1".to_owned()))).when(&delete("spc_1")).then_events(&[LogEvent::SegmentDeleted(
                proto::SegmentDeleted { segment_id: "seg_1".into(), space_id: "spc_1".into(), deleted_at_ms: NOW_MS },
            )]);
        assert_eq!(reply, Reply::ok(json!({"id": "seg_1", "deleted": true})));
        let not_found = Refusal::NotFound("seg_1".into());
        given(Some((2, "spc_1".to_owned()))).when(&delete("spc_2")).then_refused(not_found.clone());
        given(None).when(&delete("spc_1")).then_refused(not_found);
    }

    #[test]
    fn given_a_create_body_when_parsed_then_name_and_definition_are_required_text() {
        let body = |value: Value| value.as_object().cloned().expect("an object");
        assert!(parse_create(&body(json!({"name": "Pro", "definition": "plan is pro"}))).is_ok());
        for bad in [
            json!({"name": "Pro"}),
            json!({"name": " ", "definition": "x"}),
            json!({"name": "P", "definition": 3}),
            json!({"name": "P", "definition": "x", "filter": {}}),
        ] {
            assert!(matches!(parse_create(&body(bad.clone())), Err(Refusal::Invalid { .. })), "{bad}");
        }
    }
}
