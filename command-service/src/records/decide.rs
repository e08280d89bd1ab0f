//! Record decisions. The record rules (pure) live in `domain::records::decide`, shared with the
//! import worker; here are the record commands' decisions on them (strict create, upsert,
//! update, delete), the planning of a create, an upsert or an update that other commands'
//! writes share (a template send's context, a form's contact), and why a record write is
//! refused.

pub use domain::records::decide::*;

use std::sync::Arc;

use domain::catalog::WriteContext;
use domain::records::{RecordState, record_document};
use platform::error::Warning;
use platform::events::LogEvent;
use platform::fresh::Fresh;
use platform::ids::SpaceId;
use platform::log::{AppendError, ExpectedVersion, NewEvent, StreamAppend};
use serde_json::{Map, Value};

use platform::crypto::DataKey;

use super::store::{deletion_guards, stream_id};
use super::topics::{self, TopicFacts, Wanted};
use super::write::{Write, create_write, update_write};
use crate::decision::{Body, Decide, Given, Outcome, Reply, Status};

/// Why a record write is refused. The HTTP edge maps each to the contract's answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Refusal {
    /// A record rule refused it: invalid input (400), no AI credits (402), no such record
    /// (404), its deletion under way (409).
    #[error(transparent)]
    Record(#[from] RecordRefusal),
    /// Every attempt lost its race to another write of the record (409
    /// `concurrent_modification`).
    #[error("the record kept changing while this write was applied; retry")]
    KeptChanging,
    /// A decided record that cannot be read back (500).
    #[error("{0}")]
    Unreadable(String),
    /// The write could not be assembled (its data key, the sealing of its personal data): the
    /// contract's answer to that failed append (500).
    #[error("{0}")]
    Unwritable(AppendError),
}

/// An `AppendError` has no equality: two unwritable refusals are equal when they say the same.
impl PartialEq for Refusal {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Record(refusal), Self::Record(other)) => refusal == other,
            (Self::KeptChanging, Self::KeptChanging) => true,
            (Self::Unreadable(message), Self::Unreadable(other)) => message == other,
            (Self::Unwritable(error), Self::Unwritable(other)) => error.to_string() == other.to_string(),
            _ => false,
        }
    }
}

fn unreadable(error: anyhow::Error) -> Refusal {
    Refusal::Unreadable(format!("{error:#}"))
}

/// The record a write addresses: its stream version, state and data key.
pub(crate) type Target = (i64, RecordState, Option<DataKey>);

/// The record schema of a write and the space it is in, as a decision takes it.
pub(crate) fn write_schema<'a>(context: &'a WriteContext, space_id: &'a str) -> WriteSchema<'a> {
    WriteSchema {
        schema_id: &context.schema.schema_id,
        space_id,
        schema_type: &context.schema.schema_type,
        attributes: &context.attributes,
    }
}

/// An upsert decided: the status and record it answers with, and the write (none when
/// nothing changes).
pub(crate) struct PlannedUpsert {
    pub status: Status,
    pub record: RecordState,
    pub warnings: Vec<Warning>,
    pub write: Option<Result<Write, AppendError>>,
    /// The data key of an unchanged record (a write carries its own).
    pub key: Option<DataKey>,
}

/// What an upsert reads: its input, the identity holders, and the record it updates (its
/// stream version, state and data key), or `None` for a new record.
pub(crate) struct UpsertLoaded {
    pub input: Input,
    pub owners: Owners,
    pub target: Option<Target>,
}

/// Decides an upsert on what `load::load_upsert` read, without appending it, so that other
/// writes can join its append (a template send's context). A new record's id and data key
/// come from `fresh`.
pub(crate) fn decide_upsert(
    schema: &WriteSchema<'_>,
    loaded: UpsertLoaded,
    now: i64,
    fresh: &mut dyn Fresh,
) -> Result<PlannedUpsert, Refusal> {
    let UpsertLoaded { input, owners, target } = loaded;
    match target {
        Some((version, current, key)) => {
            let change = match decide_update(schema, &current, input, &owners, now)? {
                UpdateDecision::Changed(change) => change,
                UpdateDecision::Unchanged { warnings } => {
                    return Ok(PlannedUpsert { status: Status::Ok, record: current, warnings, write: None, key });
                }
            };
            let (record, warnings) = (change.state.clone(), change.warnings.clone());
            let write = update_write(schema.space_id, schema.schema_id, (version, key), *change, fresh);
            Ok(PlannedUpsert { status: Status::Ok, record, warnings, write: Some(write), key: None })
        }
        None => {
            let record_id = fresh.id(if schema.schema_type == "contact" { "con" } else { "obj" });
            let decision = decide_create(schema, input, &owners, &record_id, now)?;
            let record = RecordState::from_created(&decision.event, &Default::default()).map_err(unreadable)?;
            let warnings = decision.warnings.clone();
            let write = create_write(schema.space_id, schema.schema_id, decision, fresh);
            Ok(PlannedUpsert { status: Status::Created, record, warnings, write: Some(write), key: None })
        }
    }
}

/// An update decided: the write (`None` when nothing changes) and the answer, the record
/// after it with the warnings of what was skipped. A record without a data key gets one from
/// `fresh`.
pub(crate) fn decide_record_update(
    schema: &WriteSchema<'_>,
    input: Input,
    (version, current, key): Target,
    owners: &Owners,
    now: i64,
    fresh: &mut dyn Fresh,
) -> Result<(Option<Write>, Reply), Refusal> {
    match decide_update(schema, &current, input, owners, now)? {
        UpdateDecision::Unchanged { warnings } => Ok((None, Reply::ok(current.document()).with_warnings(&warnings))),
        UpdateDecision::Changed(change) => {
            let reply = Reply::ok(change.state.document()).with_warnings(&change.warnings);
            let write = update_write(schema.space_id, schema.schema_id, (version, key), *change, fresh)
                .map_err(Refusal::Unwritable)?;
            Ok((Some(write), reply))
        }
    }
}

/// A contact write's `topics` decided for contact `contact_id`: the subscription changes to
/// append with the record's write (none without `topics`, or when nothing changes).
fn topic_changes(
    wanted: Option<&Wanted>,
    facts: Option<&TopicFacts>,
    (space_id, contact_id): (&str, &str),
    given: &Given<'_>,
) -> Result<Option<StreamAppend>, Refusal> {
    let (Some(wanted), Some(facts)) = (wanted, facts) else { return Ok(None) };
    Ok(topics::decide(wanted, facts, (space_id, contact_id), given.operation_id, given.now_ms)?)
}

/// `POST /schemas/{schema}/records`: strict create.
pub(crate) struct CreateRecord {
    pub space_id: SpaceId,
    pub schema_ref: String,
    pub input: Map<String, Value>,
    /// A contact's `topics`, taken out of the input at the edge.
    pub topics: Option<Wanted>,
}

impl Decide for CreateRecord {
    /// The schema's catalog context, and the topics when the write names some.
    type Loaded = (Arc<WriteContext>, Option<TopicFacts>);
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, (context, topic_facts): Self::Loaded, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let schema = write_schema(&context, &self.space_id);
        check_credits(&schema, context.credits)?;
        let input = parse_input(&schema, self.input.clone())?;
        // A strict create needs no lookup of identity holders: the identity guards in its
        // append are the uniqueness check, and a collision is 409 identifier_conflict.
        let record_id = given.fresh.id(if schema.schema_type == "contact" { "con" } else { "obj" });
        let decision = decide_create(&schema, input, &Owners::new(), &record_id, given.now_ms)?;
        let document = record_document(&decision.event, &Default::default()).map_err(unreadable)?;
        let body = document;
        let Write { stream, guards, .. } =
            create_write(schema.space_id, schema.schema_id, decision, given.fresh).map_err(Refusal::Unwritable)?;
        let subscriptions =
            topic_changes(self.topics.as_ref(), topic_facts.as_ref(), (&self.space_id, &record_id), given)?;
        let streams = std::iter::once(stream).chain(subscriptions).collect();
        Ok(Outcome::append(streams, guards, Reply::created(body)))
    }
}

/// `POST /schemas/{schema}/records/upsert`.
pub(crate) struct UpsertRecord {
    pub space_id: SpaceId,
    pub schema_ref: String,
    pub input: Map<String, Value>,
    /// A contact's `topics`, taken out of the input at the edge.
    pub topics: Option<Wanted>,
}

impl Decide for UpsertRecord {
    /// The schema's catalog context, what the upsert reads, and the topics when the write
    /// names some (with the matched contact's subscriptions).
    type Loaded = (Arc<WriteContext>, UpsertLoaded, Option<TopicFacts>);
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, (context, loaded, topic_facts): Self::Loaded, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let schema = write_schema(&context, &self.space_id);
        let planned = decide_upsert(&schema, loaded, given.now_ms, given.fresh)?;
        let document = planned.record.document();
        let contact_id = planned.record.record_id.clone();
        let subscriptions =
            topic_changes(self.topics.as_ref(), topic_facts.as_ref(), (&self.space_id, &contact_id), given)?;
        let reply = Reply { status: planned.status, body: Body::Data { data: document, warnings: planned.warnings } };
        let (mut streams, guards) = match planned.write {
            Some(write) => {
                let Write { stream, guards, .. } = write.map_err(Refusal::Unwritable)?;
                (vec![stream], guards)
            }
            None => (Vec::new(), Vec::new()),
        };
        streams.extend(subscriptions);
        Ok(Outcome::batch(streams, guards, reply))
    }
}

/// `PATCH /schemas/{schema}/records/{id}` (does not honour `Idempotency-Key`).
pub(crate) struct UpdateRecord {
    pub space_id: SpaceId,
    pub schema_ref: String,
    pub record_id: String,
    pub input: Map<String, Value>,
    /// A contact's `topics`, taken out of the input at the edge.
    pub topics: Option<Wanted>,
}

impl Decide for UpdateRecord {
    /// The schema's catalog context, the input, the record, the holders of the identities the
    /// input sets, and the topics when the write names some (with the contact's
    /// subscriptions).
    type Loaded = (Arc<WriteContext>, Input, Target, Owners, Option<TopicFacts>);
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(
        &self,
        (context, input, target, owners, topic_facts): Self::Loaded,
        given: &mut Given<'_>,
    ) -> Result<Outcome, Refusal> {
        let schema = write_schema(&context, &self.space_id);
        let subscriptions =
            topic_changes(self.topics.as_ref(), topic_facts.as_ref(), (&self.space_id, &self.record_id), given)?;
        let (mut streams, guards, reply) =
            match decide_record_update(&schema, input, target, &owners, given.now_ms, given.fresh)? {
                (None, reply) => (Vec::new(), Vec::new(), reply),
                (Some(Write { stream, guards, .. }), reply) => (vec![stream], guards, reply),
            };
        streams.extend(subscriptions);
        Ok(Outcome::batch(streams, guards, reply))
    }
}

/// `DELETE /schemas/{schema}/records/{id}`: starts the deletion operation and answers 200 with
/// it while `pending`. The record leaves every read at once; its erasure is proven when the
/// operation reaches `completed` (see the projector's eraser, "Erasure"). Does not honour
/// `Idempotency-Key`: a repeated DELETE gets 409 while pending and 404 afterwards.
pub(crate) struct DeleteRecord {
    pub space_id: SpaceId,
    pub schema_ref: String,
    pub record_id: String,
}

impl Decide for DeleteRecord {
    /// The schema's catalog context and the record's stream version.
    type Loaded = (Arc<WriteContext>, i64);
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, (context, version): Self::Loaded, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let (record_id, space_id) = (&self.record_id, self.space_id.as_str());
        let operation_id = given.operation_id;
        let requested = platform::proto::RecordDeletionRequested {
            operation_id: operation_id.to_owned(),
            record_id: record_id.clone(),
            space_id: space_id.to_owned(),
            schema_id: context.schema.schema_id.clone(),
            schema_type: context.schema.schema_type.clone(),
            requested_at_ms: given.now_ms,
        };
        let stream = StreamAppend {
            stream_id: stream_id(record_id),
            expected: ExpectedVersion::Exactly(version),
            events: vec![NewEvent {
                event: LogEvent::RecordDeletionRequested(requested),
                subject_id: Some(record_id.clone()),
                occurred_at: platform::time::from_millis(given.now_ms),
            }],
        };
        let guards = deletion_guards(operation_id, record_id, space_id, &context.schema.schema_id);
        let body = serde_json::json!({ "operationId": operation_id, "status": "pending", "message": domain::records::DELETION_PENDING_MESSAGE });
        Ok(Outcome::one(stream, guards, Reply::ok(body)))
    }
}

impl platform::refusal::Answered for Refusal {}

/// A refused record write as the contract answers it: a record rule's refusal as the domain
/// answers it (`RecordRefusal`, which the import worker shares), a write that could not be
/// assembled as its failed append is.
impl platform::refusal::Refusal for Refusal {
    fn code(&self) -> platform::error::Code {
        match self {
            Self::Record(refusal) => refusal.code(),
            Self::KeptChanging => platform::error::Code::ConcurrentModification,
            Self::Unreadable(_) | Self::Unwritable(_) => platform::error::Code::InternalError,
        }
    }

    fn issues(&self) -> Vec<platform::error::Issue> {
        match self {
            Self::Record(refusal) => platform::refusal::Refusal::issues(refusal),
            _ => Vec::new(),
        }
    }

    fn is_defect(&self) -> bool {
        matches!(self, Self::Unreadable(_))
    }

    fn into_failure(self) -> Result<platform::refusal::Failure, Self> {
        match self {
            Self::Unwritable(error) => Ok(platform::refusal::Failure::Append(error)),
            other => Err(other),
        }
    }
}

/// A write context and a contact for the decisions' tests that write records.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;
    use domain::catalog::{AttributeEntry, SchemaEntry};
    use platform::proto;
    use serde_json::json;

    pub(crate) fn context(attributes: Value, credits: i64) -> Arc<WriteContext> {
        let attributes = attributes
            .as_object()
            .expect("attributes")
            .iter()
            .map(|(key, definition)| AttributeEntry { key: key.clone(), definition: definition.clone() })
            .collect();
        Arc::new(WriteContext {
            schema: SchemaEntry {
                schema_id: "sch_1".into(),
                slug: "contacts".into(),
                schema_type: "contact".into(),
                doc: json!({}),
                attribute_count: 1,
                revision: 1,
            },
            attributes,
            credits,
            revision: 7,
        })
    }

    pub(crate) fn contacts() -> Arc<WriteContext> {
        context(json!({"plan": {"type": "string"}}), 0)
    }

    pub(crate) fn input(value: Value) -> Map<String, Value> {
        value.as_object().cloned().expect("an object")
    }

    pub(crate) fn ada() -> RecordState {
        RecordState {
            record_id: "con_ada".into(),
            space_id: "spc_1".into(),
            schema_id: "sch_1".into(),
            schema_type: "contact".into(),
            source: "api".into(),
            created_at_ms: 1,
            updated_at_ms: 1,
            personal: Some(proto::RecordPersonal {
                email: Some("ada@example.com".into()),
                values_json: json!({"plan": "free"}).to_string(),
                ..Default::default()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{ada, contacts, context, input};
    use super::*;
    use crate::decision::harness::{NOW_MS, given};
    use platform::error::Code;
    use platform::proto;
    use serde_json::json;

    fn created(outcome: &Outcome) -> &proto::RecordCreated {
        match outcome.events()[..] {
            [LogEvent::RecordCreated(created)] => created,
            ref events => panic!("one RecordCreated was expected: {events:?}"),
        }
    }

    fn updated(outcome: &Outcome) -> &proto::RecordUpdated {
        match outcome.events()[..] {
            [LogEvent::RecordUpdated(updated)] => updated,
            ref events => panic!("one RecordUpdated was expected: {events:?}"),
        }
    }

    fn appended(outcome: &Outcome) -> &crate::decision::Writes {
        match outcome {
            Outcome::Append(writes) => writes,
            _ => panic!("an append was expected"),
        }
    }

    #[test]
    fn a_strict_create_appends_a_new_contact_under_a_fresh_id_and_answers_created() {
        let command = CreateRecord {
            space_id: "spc_1".into(),
            schema_ref: "contacts".into(),
            input: input(json!({"email": "Ada@Example.com", "plan": "pro"})),
            topics: None,
        };
        let outcome = given((contacts(), None)).when(&command).decided();
        let event = created(&outcome);
        assert_eq!((event.record_id.as_str(), event.space_id.as_str()), ("con_1", "spc_1"));
        assert_eq!((event.source.as_str(), event.created_at_ms), ("api", NOW_MS));
        let writes = appended(&outcome);
        assert_eq!(writes.streams[0].stream_id, stream_id("con_1"));
        assert!(matches!(writes.streams[0].expected, ExpectedVersion::NoStream));
        assert_eq!(writes.guards.len(), 2, "the email's claim and the new data key");
        let reply = outcome.reply().expect("a reply");
        assert_eq!(reply.status, Status::Created);
        assert_eq!(reply.json()["data"]["id"], "con_1");
        assert_eq!(reply.json()["data"]["email"], "ada@example.com");
        assert_eq!(reply.json()["data"]["plan"], "pro");
    }

    #[test]
    fn a_create_without_credits_for_auto_fill_or_with_bad_input_is_refused() {
        let create = |value: Value| CreateRecord {
            space_id: "spc_1".into(),
            schema_ref: "contacts".into(),
            input: input(value),
            topics: None,
        };
        let auto_filled = context(json!({"summary": {"type": "string", "autoFill": true}}), 0);
        given((auto_filled, None))
            .when(&create(json!({"email": "a@b.io"})))
            .then_refused(Refusal::Record(RecordRefusal::InsufficientCredits));
        let refused = given((contacts(), None)).when(&create(json!({"email": "nope"}))).0.err().expect("refused");
        assert!(matches!(refused, Refusal::Record(RecordRefusal::Invalid { .. })), "{refused:?}");
    }

    #[test]
    fn an_upsert_creates_a_new_record_updates_a_matched_one_and_answers_an_unchanged_one() {
        let command =
            UpsertRecord { space_id: "spc_1".into(), schema_ref: "contacts".into(), input: Map::new(), topics: None };
        let schema_context = contacts();
        let schema = write_schema(&schema_context, "spc_1");
        let parse = |value: Value| parse_input(&schema, input(value)).expect("valid");

        let new =
            UpsertLoaded { input: parse(json!({"email": "new@example.com"})), owners: Owners::new(), target: None };
        let outcome = given((contacts(), new, None)).when(&command).decided();
        assert_eq!(created(&outcome).record_id, "con_1");
        assert_eq!(outcome.reply().expect("a reply").status, Status::Created);

        let matched = |value: Value| UpsertLoaded {
            input: parse(value),
            owners: Owners::from([(("email".into(), "ada@example.com".into()), "con_ada".into())]),
            target: Some((3, ada(), None)),
        };
        let outcome = given((contacts(), matched(json!({"email": "ada@example.com", "plan": "pro"})), None))
            .when(&command)
            .decided();
        let event = updated(&outcome);
        assert_eq!((event.record_id.as_str(), event.updated_at_ms), ("con_ada", NOW_MS));
        assert_eq!(event.changed_keys, ["plan"]);
        assert!(matches!(appended(&outcome).streams[0].expected, ExpectedVersion::Exactly(3)));
        let reply = outcome.reply().expect("a reply");
        assert_eq!((reply.status, &reply.json()["data"]["plan"]), (Status::Ok, &json!("pro")));

        let reply = given((contacts(), matched(json!({"email": "ada@example.com", "plan": "free"})), None))
            .when(&command)
            .then_answers();
        assert_eq!(reply, Reply::ok(ada().document()));
    }

    #[test]
    fn an_update_appends_the_change_at_the_record_version_or_answers_the_record_unchanged() {
        let command = UpdateRecord {
            space_id: "spc_1".into(),
            schema_ref: "contacts".into(),
            record_id: "con_ada".into(),
            input: Map::new(),
            topics: None,
        };
        let schema_context = contacts();
        let schema = write_schema(&schema_context, "spc_1");
        let parse = |value: Value| parse_input(&schema, input(value)).expect("valid");
        let outcome = given((contacts(), parse(json!({"plan": "pro"})), (5, ada(), None), Owners::new(), None))
            .when(&command)
            .decided();
        let event = updated(&outcome);
        assert_eq!(event.changed_keys, ["plan"]);
        let writes = appended(&outcome);
        assert!(matches!(writes.streams[0].expected, ExpectedVersion::Exactly(5)));
        assert_eq!(writes.guards.len(), 1, "a record without a data key gets one");
        assert_eq!(writes.reply.json()["data"]["plan"], "pro");
        let reply = given((contacts(), parse(json!({"plan": "free"})), (5, ada(), None), Owners::new(), None))
            .when(&command)
            .then_answers();
        assert_eq!(reply.json()["data"]["id"], "con_ada");
    }

    #[test]
    fn clearing_a_required_attribute_is_refused() {
        let required = context(json!({"plan": {"type": "string", "required": true}}), 0);
        let schema = write_schema(&required, "spc_1");
        let cleared = parse_input(&schema, input(json!({"plan": null}))).expect("parses");
        let command = UpdateRecord {
            space_id: "spc_1".into(),
            schema_ref: "contacts".into(),
            record_id: "con_ada".into(),
            input: Map::new(),
            topics: None,
        };
        let refused = given((required.clone(), cleared, (5, ada(), None), Owners::new(), None)).when(&command).0.err();
        assert!(
            matches!(
                refused,
                Some(Refusal::Record(RecordRefusal::Invalid { code: Code::RequiredAttributeMissing, .. }))
            ),
            "{refused:?}"
        );
    }

    #[test]
    fn a_delete_requests_the_deletion_under_the_operation_and_answers_pending() {
        let command =
            DeleteRecord { space_id: "spc_1".into(), schema_ref: "contacts".into(), record_id: "con_ada".into() };
        let reply = given((contacts(), 4)).when(&command).then_events(&[LogEvent::RecordDeletionRequested(
            proto::RecordDeletionRequested {
                operation_id: "op_test".into(),
                record_id: "con_ada".into(),
                space_id: "spc_1".into(),
                schema_id: "sch_1".into(),
                schema_type: "contact".into(),
                requested_at_ms: NOW_MS,
            },
        )]);
        assert_eq!(reply.status, Status::Ok);
        assert_eq!(reply.json()["data"]["operationId"], "op_test");
        assert_eq!(reply.json()["data"]["status"], "pending");
    }

    #[test]
    fn a_contact_write_with_topics_appends_its_subscriptions_with_the_record_or_alone_when_unchanged() {
        let facts =
            TopicFacts { by_reference: [("news".to_owned(), "top_1".to_owned())].into(), current: Default::default() };
        let wanted = |body: Value| {
            let mut body = input(body);
            Wanted::take("contact", &mut body).expect("valid")
        };
        let create = CreateRecord {
            space_id: "spc_1".into(),
            schema_ref: "contacts".into(),
            input: input(json!({"email": "new@example.com"})),
            topics: wanted(json!({"topics": ["news"]})),
        };
        let outcome = given((contacts(), Some(facts.clone()))).when(&create).decided();
        let streams: Vec<&str> = appended(&outcome).streams.iter().map(|stream| stream.stream_id.as_str()).collect();
        assert_eq!(streams, [stream_id("con_1").as_str(), "subscriptions-con_1"]);
        let [_, LogEvent::SubscriptionChanged(changed)] = outcome.events()[..] else { panic!("a subscription") };
        assert_eq!(
            (changed.topic_id.as_str(), changed.status.as_str(), changed.source.as_str(), changed.source_id.as_str()),
            ("top_1", "subscribed", "api", "op_test")
        );

        let schema_context = contacts();
        let schema = write_schema(&schema_context, "spc_1");
        let unchanged = UpsertLoaded {
            input: parse_input(&schema, input(json!({"email": "ada@example.com", "plan": "free"}))).expect("valid"),
            owners: Owners::from([(("email".into(), "ada@example.com".into()), "con_ada".into())]),
            target: Some((3, ada(), None)),
        };
        let command = UpsertRecord {
            space_id: "spc_1".into(),
            schema_ref: "contacts".into(),
            input: Map::new(),
            topics: wanted(json!({"topics": {"news": "subscribed"}})),
        };
        let outcome = given((contacts(), unchanged, Some(facts))).when(&command).decided();
        let writes = appended(&outcome);
        let streams: Vec<&str> = writes.streams.iter().map(|stream| stream.stream_id.as_str()).collect();
        assert_eq!(streams, ["subscriptions-con_ada"], "the record is unchanged; its subscription is new");
        assert_eq!(writes.reply.status, Status::Ok);
    }
}
