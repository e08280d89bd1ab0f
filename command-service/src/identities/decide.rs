//! The identity-binding decision: validating a change, and deciding it against what is
//! recorded (an earlier operation with the same id), the alias's state and the contact's.
//! Pure: every fact comes in as an argument (the keyed digests naming the alias and the body
//! are computed by the shell).

use platform::error::{Code, Issue};
use platform::events::LogEvent;
use platform::ids::SpaceId;
use platform::log::{ExpectedVersion, NewEvent, StreamAppend};
use platform::proto;
use platform::settings::IdentityCapacity;
use serde_json::{Map, Value, json};

use crate::decision::{self, Decide, Outcome, Reply};

pub use super::{Alias, Change, Contact, Recorded};

/// The six fields of an identity change, and no others.
pub(crate) const FIELDS: [&str; 6] =
    ["sourceId", "subjectSchemaId", "anonymousId", "contactId", "operationId", "expectedAliasRevision"];
/// The most characters a text field may have.
const MAX_CHARS: usize = 256;

/// Why an identity change is refused. The HTTP edge maps each to the contract's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The body is not an identity change; `issues` names every problem (400).
    #[error("{message}")]
    Invalid { message: String, issues: Vec<Issue> },
    /// The operationId was used for a different change (409).
    #[error("this operationId was used for a different identity change; use a new operationId")]
    OperationIdConflict,
    /// The contact the alias was bound to was erased: the alias takes no more changes (409).
    #[error("the contact this alias was bound to was erased")]
    AliasErased,
    /// `expectedAliasRevision` is not the alias's revision (409).
    #[error("expectedAliasRevision does not match: the alias is at revision {current}")]
    RevisionConflict { current: i64 },
    /// The contact's deletion has started (409).
    #[error("contact {0:?} is being deleted")]
    ContactDeletionPending(String),
    /// No such contact in the subject schema of the caller's space (404).
    #[error("no contact {contact_id:?} in schema {schema_id:?}")]
    ContactNotFound { contact_id: String, schema_id: String },
    /// No enabled contact track of the space has the source and uses the subject schema (403).
    #[error(
        "identity source {0:?} is unavailable: no enabled contact track with this sourceId uses that contact \
         schema"
    )]
    SourceUnavailable(String),
    /// The space holds as many aliases or identity changes as it may (429).
    #[error("the space's identity capacity is exhausted ({aliases} aliases, {changes} identity changes)")]
    CapacityExhausted { aliases: i64, changes: i64 },
    /// The contact's deletion started while the change was appended (409).
    #[error("the contact is being deleted")]
    ContactBeingDeleted,
    /// Every attempt lost a race with another change of the alias (409).
    #[error("the alias kept changing while this change was applied; retry")]
    KeptChanging,
}

/// Validates the body: exactly the six fields, with their types.
pub(crate) fn parse_change(body: Map<String, Value>) -> Result<Change, Refusal> {
    let mut issues = Vec::new();
    for key in body.keys().filter(|key| !FIELDS.contains(&key.as_str())) {
        issues.push(Issue::coded(key, Code::UnknownField, format!("{key} is not a field of an identity change")));
    }
    let text = |key: &str, issues: &mut Vec<Issue>| -> Option<String> {
        match body.get(key) {
            Some(Value::String(value))
                if !platform::storable::is_blank(value) && value.chars().count() <= MAX_CHARS =>
            {
                Some(value.clone())
            }
            Some(_) => {
                let message = format!("{key} must be a non-blank string of at most {MAX_CHARS} characters");
                issues.push(Issue::coded(key, Code::InvalidField, message));
                None
            }
            None => {
                issues.push(Issue::coded(key, Code::MissingField, format!("{key} is required")));
                None
            }
        }
    };
    let source_id = text("sourceId", &mut issues);
    let subject_schema_id = text("subjectSchemaId", &mut issues);
    let anonymous_id = text("anonymousId", &mut issues);
    let contact_id = match body.get("contactId") {
        Some(Value::Null) => Some(None),
        Some(Value::String(id)) if !platform::storable::is_blank(id) && id.chars().count() <= MAX_CHARS => {
            Some(Some(id.clone()))
        }
        Some(_) => {
            issues.push(Issue::coded("contactId", Code::InvalidField, "contactId must be a contact id or null"));
            None
        }
        None => {
            let message = "contactId is required (null removes the binding)";
            issues.push(Issue::coded("contactId", Code::MissingField, message));
            None
        }
    };
    let operation_id = text("operationId", &mut issues).and_then(|id| match uuid::Uuid::parse_str(&id) {
        Ok(parsed) => Some(parsed.hyphenated().to_string()),
        Err(_) => {
            issues.push(Issue::coded("operationId", Code::InvalidField, "operationId must be a UUID"));
            None
        }
    });
    let expected_revision = text("expectedAliasRevision", &mut issues).and_then(|raw| {
        match raw.parse::<i64>().ok().filter(|n| *n >= 0 && raw.chars().all(|c| c.is_ascii_digit())) {
            Some(revision) => Some(revision),
            None => {
                issues.push(Issue::coded(
                    "expectedAliasRevision",
                    Code::InvalidField,
                    "expectedAliasRevision must be a decimal string (\"0\" for a new alias)",
                ));
                None
            }
        }
    });
    match (source_id, subject_schema_id, anonymous_id, contact_id, operation_id, expected_revision) {
        (
            Some(source_id),
            Some(subject_schema_id),
            Some(anonymous_id),
            Some(contact_id),
            Some(operation_id),
            Some(expected_revision),
        ) if issues.is_empty() => {
            Ok(Change { source_id, subject_schema_id, anonymous_id, contact_id, operation_id, expected_revision })
        }
        _ => {
            let message = issues.first().map_or_else(|| "invalid identity change".to_owned(), |i| i.message.clone());
            Err(Refusal::Invalid { message, issues })
        }
    }
}

/// The facts a change is decided on.
#[derive(Debug, Clone)]
pub struct Given<'a> {
    pub space_id: &'a str,
    /// The keyed digest naming the alias (source and anonymous id).
    pub alias_digest: &'a str,
    /// The keyed digest of the change's body, to tell a replay from a reuse of the operationId.
    pub body_digest: &'a str,
    pub recorded: Option<Recorded>,
    pub alias: Alias,
    /// The contact to bind to (`None` when the change removes the binding).
    pub contact: Option<Contact>,
    pub now_ms: i64,
}

/// The outcome of a change.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// The same operation was applied already: answer its result again, append nothing.
    Replay(Value),
    /// Append `event` at the alias's current revision and answer `result`.
    Change { event: proto::EventIdentityChanged, result: Value, expected_revision: i64 },
}

/// Decides `change` against what is recorded.
pub fn decide(change: &Change, given: Given<'_>) -> Result<Decision, Refusal> {
    if let Some(recorded) = given.recorded {
        if recorded.body_digest != given.body_digest {
            return Err(Refusal::OperationIdConflict);
        }
        let mut result = recorded.result;
        result["isDuplicate"] = Value::Bool(true);
        return Ok(Decision::Replay(result));
    }
    if given.alias.erased {
        return Err(Refusal::AliasErased);
    }
    if given.alias.revision != change.expected_revision {
        return Err(Refusal::RevisionConflict { current: given.alias.revision });
    }
    if let Some(contact_id) = &change.contact_id {
        match given.contact {
            Some(Contact::Live { space_id, schema_id })
                if space_id == given.space_id && schema_id == change.subject_schema_id => {}
            Some(Contact::Deleting) => return Err(Refusal::ContactDeletionPending(contact_id.clone())),
            _ => {
                return Err(Refusal::ContactNotFound {
                    contact_id: contact_id.clone(),
                    schema_id: change.subject_schema_id.clone(),
                });
            }
        }
    }
    let revision = given.alias.revision + 1;
    let previous = given.alias.contact_id;
    let mut affected: Vec<String> = previous.iter().chain(change.contact_id.iter()).cloned().collect();
    affected.dedup();
    let result = json!({
        "identityRevision": revision.to_string(),
        "affectedSubjectIds": affected,
        "isDuplicate": false,
    });
    let event = proto::EventIdentityChanged {
        space_id: given.space_id.to_owned(),
        source_id: change.source_id.clone(),
        subject_schema_id: change.subject_schema_id.clone(),
        alias_digest: given.alias_digest.to_owned(),
        operation_id: change.operation_id.clone(),
        contact_id: change.contact_id.clone().unwrap_or_default(),
        previous_contact_id: previous.unwrap_or_default(),
        revision,
        changed_at_ms: given.now_ms,
    };
    Ok(Decision::Change { event, result, expected_revision: given.alias.revision })
}

/// `POST /event-identities`: binds the alias to a contact, or removes its binding, at the
/// alias's revision.
pub(crate) struct ChangeIdentity {
    pub space_id: SpaceId,
    pub change: Change,
    /// The keyed digest of the change's body (a replay of the operationId has the same).
    pub body_digest: String,
    /// The keyed digest naming the alias.
    pub alias: String,
    /// The space's identity capacity, which the append's guards keep.
    pub capacity: IdentityCapacity,
}

impl Decide for ChangeIdentity {
    /// The operation recorded under the change's operationId, the alias, and the contact to
    /// bind to (loaded only when no operation is recorded).
    type Loaded = (Option<Recorded>, Alias, Option<Contact>);
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(
        &self,
        (recorded, alias, contact): Self::Loaded,
        given: &mut decision::Given<'_>,
    ) -> Result<Outcome, Refusal> {
        let (space_id, change) = (self.space_id.as_str(), &self.change);
        let previous = alias.contact_id.clone();
        let facts = Given {
            space_id,
            alias_digest: &self.alias,
            body_digest: &self.body_digest,
            recorded,
            alias,
            contact,
            now_ms: given.now_ms,
        };
        let (event, result, revision) = match decide(change, facts)? {
            Decision::Replay(result) => return Ok(Outcome::Answer(Reply::ok(json!(result)))),
            Decision::Change { event, result, expected_revision } => (event, result, expected_revision),
        };
        let guards =
            super::store::guards(self.capacity, space_id, change, &self.alias, &self.body_digest, &result, revision);
        let stream = StreamAppend {
            stream_id: format!("alias/{space_id}/{}", self.alias),
            expected: if revision == 0 { ExpectedVersion::NoStream } else { ExpectedVersion::Exactly(revision) },
            events: vec![NewEvent {
                subject_id: change.contact_id.clone().or(previous),
                occurred_at: platform::time::from_millis(event.changed_at_ms),
                event: LogEvent::EventIdentityChanged(event),
            }],
        };
        Ok(Outcome::one(stream, guards, Reply::ok(json!(result))))
    }
}

impl platform::refusal::Answered for Refusal {}

/// A refused identity change as the contract answers it.
impl platform::refusal::Refusal for Refusal {
    fn code(&self) -> Code {
        match self {
            Self::Invalid { .. } => Code::InvalidIdentityChange,
            Self::OperationIdConflict => Code::OperationIdConflict,
            Self::AliasErased => Code::AliasErased,
            Self::RevisionConflict { .. } => Code::AliasRevisionConflict,
            Self::ContactDeletionPending(_) => Code::RecordDeletionPending,
            Self::ContactNotFound { .. } => Code::RecordNotFound,
            Self::SourceUnavailable(_) => Code::IdentitySourceUnavailable,
            Self::CapacityExhausted { .. } => Code::IdentityCapacityExhausted,
            Self::ContactBeingDeleted => Code::RecordDeletionPending,
            Self::KeptChanging => Code::ConcurrentModification,
        }
    }

    fn issues(&self) -> Vec<Issue> {
        match self {
            Self::Invalid { issues, .. } => issues.clone(),
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::harness::{NOW_MS, given as scenario};
    use crate::decision::{Body, Status};
    use platform::refusal::Refusal as _;

    fn body(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }

    fn valid() -> Value {
        json!({
            "sourceId": "src_web", "subjectSchemaId": "sch_1", "anonymousId": "anon-1", "contactId": "con_1",
            "operationId": "0192f3a4-1111-7000-8000-000000000001", "expectedAliasRevision": "0"
        })
    }

    fn change(contact_id: Option<&str>, expected_revision: i64) -> Change {
        Change {
            source_id: "src_web".into(),
            subject_schema_id: "sch_1".into(),
            anonymous_id: "anon-1".into(),
            contact_id: contact_id.map(str::to_owned),
            operation_id: "0192f3a4-1111-7000-8000-000000000001".into(),
            expected_revision,
        }
    }

    fn given(alias: Alias, contact: Option<Contact>) -> Given<'static> {
        Given {
            space_id: "spc_1",
            alias_digest: "digest",
            body_digest: "body",
            recorded: None,
            alias,
            contact,
            now_ms: 7,
        }
    }

    fn live() -> Option<Contact> {
        Some(Contact::Live { space_id: "spc_1".into(), schema_id: "sch_1".into() })
    }

    #[test]
    fn exactly_the_six_fields_are_accepted() {
        let change = parse_change(body(valid())).expect("valid");
        assert_eq!(change.expected_revision, 0);
        assert_eq!(change.contact_id.as_deref(), Some("con_1"));
        let mut removal = valid();
        removal["contactId"] = Value::Null;
        assert_eq!(parse_change(body(removal)).expect("null removes").contact_id, None);
        let mut extra = valid();
        extra["note"] = json!("x");
        let refusal = parse_change(body(extra)).expect_err("unknown field");
        assert_eq!(refusal.code(), Code::InvalidIdentityChange);
        for key in FIELDS {
            let mut missing = valid();
            missing.as_object_mut().map(|o| o.remove(key));
            assert!(parse_change(body(missing)).is_err(), "{key} is required");
        }
    }

    #[test]
    fn revisions_are_decimal_strings_and_operation_ids_uuids() {
        for (key, value) in [
            ("expectedAliasRevision", json!(0)),
            ("expectedAliasRevision", json!("-1")),
            ("expectedAliasRevision", json!("1.5")),
            ("expectedAliasRevision", json!("+1")),
            ("operationId", json!("op-1")),
            ("contactId", json!(5)),
            ("anonymousId", json!("")),
            ("sourceId", json!("   ")),
            ("sourceId", json!("x".repeat(257))),
        ] {
            let mut changed = valid();
            changed[key] = value.clone();
            assert!(parse_change(body(changed)).is_err(), "{key} = {value}");
        }
        let mut later = valid();
        later["expectedAliasRevision"] = json!("12");
        assert_eq!(parse_change(body(later)).expect("valid").expected_revision, 12);
    }

    #[test]
    fn given_a_new_alias_when_binding_a_live_contact_then_revision_one_names_the_contact() {
        let decision = decide(&change(Some("con_1"), 0), given(Alias::default(), live())).expect("binds");
        let Decision::Change { event, result, expected_revision } = decision else { panic!("a change") };
        assert_eq!(expected_revision, 0);
        assert_eq!((event.revision, event.contact_id.as_str(), event.previous_contact_id.as_str()), (1, "con_1", ""));
        assert_eq!(result, json!({"identityRevision": "1", "affectedSubjectIds": ["con_1"], "isDuplicate": false}));
    }

    #[test]
    fn given_a_bound_alias_when_moving_it_then_both_contacts_are_affected() {
        let alias = Alias { contact_id: Some("con_0".into()), revision: 3, erased: false };
        let Decision::Change { result, event, .. } =
            decide(&change(Some("con_1"), 3), given(alias, live())).expect("moves")
        else {
            panic!("a change")
        };
        assert_eq!(result["affectedSubjectIds"], json!(["con_0", "con_1"]));
        assert_eq!(event.previous_contact_id, "con_0");
        let unbound = Alias { contact_id: Some("con_0".into()), revision: 3, erased: false };
        let Decision::Change { result, .. } = decide(&change(None, 3), given(unbound, None)).expect("unbinds") else {
            panic!("a change")
        };
        assert_eq!(result["affectedSubjectIds"], json!(["con_0"]));
    }

    #[test]
    fn given_the_same_operation_when_repeated_then_its_result_is_replayed_and_a_changed_body_refused() {
        let recorded = Recorded { body_digest: "body".into(), result: json!({"identityRevision": "1"}) };
        let mut facts = given(Alias { revision: 1, ..Alias::default() }, live());
        facts.recorded = Some(recorded.clone());
        assert_eq!(
            decide(&change(Some("con_1"), 0), facts.clone()),
            Ok(Decision::Replay(json!({"identityRevision": "1", "isDuplicate": true})))
        );
        facts.body_digest = "another body";
        assert_eq!(decide(&change(Some("con_1"), 0), facts), Err(Refusal::OperationIdConflict));
    }

    #[test]
    fn given_a_stale_revision_an_erased_alias_or_an_unusable_contact_then_the_change_is_refused() {
        let at_two = Alias { revision: 2, ..Alias::default() };
        assert_eq!(
            decide(&change(Some("con_1"), 1), given(at_two, live())),
            Err(Refusal::RevisionConflict { current: 2 })
        );
        let erased = Alias { revision: 2, erased: true, contact_id: None };
        assert_eq!(decide(&change(Some("con_1"), 2), given(erased, live())), Err(Refusal::AliasErased));
        let new = Alias::default;
        assert_eq!(
            decide(&change(Some("con_1"), 0), given(new(), Some(Contact::Deleting))),
            Err(Refusal::ContactDeletionPending("con_1".into()))
        );
        let missing = Refusal::ContactNotFound { contact_id: "con_1".into(), schema_id: "sch_1".into() };
        assert_eq!(decide(&change(Some("con_1"), 0), given(new(), Some(Contact::Missing))), Err(missing.clone()));
        let elsewhere = Some(Contact::Live { space_id: "spc_2".into(), schema_id: "sch_1".into() });
        assert_eq!(decide(&change(Some("con_1"), 0), given(new(), elsewhere)), Err(missing));
    }

    fn command(contact_id: Option<&str>, expected_revision: i64) -> ChangeIdentity {
        ChangeIdentity {
            space_id: "spc_1".into(),
            change: change(contact_id, expected_revision),
            body_digest: "body".into(),
            alias: "digest".into(),
            capacity: IdentityCapacity::default(),
        }
    }

    #[test]
    fn a_binding_appends_the_aliases_next_revision_on_its_stream_and_answers_the_result() {
        let reply = scenario((None, Alias::default(), live())).when(&command(Some("con_1"), 0)).then_events(&[
            LogEvent::EventIdentityChanged(proto::EventIdentityChanged {
                space_id: "spc_1".into(),
                source_id: "src_web".into(),
                subject_schema_id: "sch_1".into(),
                alias_digest: "digest".into(),
                operation_id: "0192f3a4-1111-7000-8000-000000000001".into(),
                contact_id: "con_1".into(),
                previous_contact_id: String::new(),
                revision: 1,
                changed_at_ms: NOW_MS,
            }),
        ]);
        assert_eq!(reply.status, Status::Ok);
        let result = json!({"identityRevision": "1", "affectedSubjectIds": ["con_1"], "isDuplicate": false});
        assert_eq!(reply.body, Body::Data { data: json!(result), warnings: Vec::new() });
        let Outcome::Append(writes) =
            scenario((None, Alias::default(), live())).when(&command(Some("con_1"), 0)).decided()
        else {
            panic!("an append")
        };
        let stream = &writes.streams[0];
        assert_eq!((stream.stream_id.as_str(), stream.expected), ("alias/spc_1/digest", ExpectedVersion::NoStream));
        assert_eq!(stream.events[0].subject_id.as_deref(), Some("con_1"));
        assert!(!writes.guards.is_empty(), "the operation, the alias and the capacity are claimed");
    }

    #[test]
    fn an_unbinding_is_about_the_contact_it_was_bound_to_at_the_aliases_revision() {
        let bound = Alias { contact_id: Some("con_0".into()), revision: 3, erased: false };
        let Outcome::Append(writes) = scenario((None, bound, None)).when(&command(None, 3)).decided() else {
            panic!("an append")
        };
        let stream = &writes.streams[0];
        assert_eq!(stream.expected, ExpectedVersion::Exactly(3));
        assert_eq!(stream.events[0].subject_id.as_deref(), Some("con_0"));
    }

    #[test]
    fn a_repeated_operation_answers_its_result_and_a_stale_revision_or_reused_operation_id_is_refused() {
        let recorded = Recorded { body_digest: "body".into(), result: json!({"identityRevision": "1"}) };
        let at_one = Alias { revision: 1, ..Alias::default() };
        let reply = scenario((Some(recorded), at_one.clone(), None)).when(&command(Some("con_1"), 0)).then_answers();
        assert_eq!(
            reply.body,
            Body::Data { data: json!({"identityRevision": "1", "isDuplicate": true}), warnings: Vec::new() }
        );
        let reused = Recorded { body_digest: "another body".into(), result: json!({}) };
        scenario((Some(reused), at_one.clone(), None))
            .when(&command(Some("con_1"), 0))
            .then_refused(Refusal::OperationIdConflict);
        scenario((None, at_one, live()))
            .when(&command(Some("con_1"), 0))
            .then_refused(Refusal::RevisionConflict { current: 1 });
    }
}
