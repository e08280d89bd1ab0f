//! What a message of the Segment-compatible ingest writes, decided on what its load found
//! (pure). Each message first finds its contact (`Resolve`), then a track, page or screen is
//! fired as a business event of that contact (the events' own decision, `FireEvent`), and a
//! group joins the contact to its object record (`JoinGroup`).
//!
//! **Which contact.** A message with a `userId` is the contact that holds that userId. If none
//! does, the contact of its `anonymousId` (the alias, in the write key's source) takes the
//! userId when it has none yet, and an identify's `traits.email` finds one the same way; else
//! the contact is created. A message with only an `anonymousId` is the alias's contact; an
//! identify's email finds one when the alias has none; else it is created and the alias bound
//! to it. The alias is bound (or moved) to the contact found, so the visitor and the user are
//! one contact afterwards, found by either id.
//!
//! **Alias** (`previousId` → `userId`): the previous id's contact takes the userId when no
//! contact holds it; when one does, the alias moves to it (the merge rule: the contact that
//! holds the userId survives as the one both ids find; the other keeps its own events and
//! consents, which are never moved or copied, and the alias's revision on the log records the
//! move); when neither exists, a contact is created with the userId and the alias bound to it.

use platform::refusal::Refusal as _;
use std::sync::Arc;

use domain::catalog::WriteContext;
pub use domain::ingest::Refused;
use domain::ingest::{Kind, Message};
use domain::records::decide::{
    Input, Owners, RecordRefusal, UpdateDecision, WriteSchema, decide_create, decide_update,
};
use domain::records::write::{Write, create_write, update_write};
use platform::crypto::DataKey;
use platform::error::Code;
use platform::events::LogEvent;
use platform::ids::SpaceId;
use platform::log::{ExpectedVersion, Guard, NewEvent, StreamAppend};
use platform::proto;
use serde_json::{Map, Value, json};

use super::write_key::WriteKey;
use crate::decision::{Decide, Given, Outcome, Reply};
use crate::identities::{Alias, Change};
use crate::records::decide::{Target, write_schema};

/// Why a message was not applied. It is kept with its reason; the HTTP edge maps each to the
/// code the failures list shows.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// The record rules refused the contact's write (an attribute's value, a deletion under
    /// way).
    #[error(transparent)]
    Record(#[from] RecordRefusal),
    /// The anonymous id's alias was erased with its contact: it names nobody again.
    #[error("the anonymousId belongs to an erased contact and is not used again")]
    AliasErased,
    /// The contact could not be assembled (its data key, the sealing of its data).
    #[error("{0}")]
    Unwritable(String),
}

/// Why a request is refused whole, before any of its messages is applied: its body (400), or
/// its key (401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Intake {
    #[error("the request body is over {limit} bytes (decoded); send fewer messages at once")]
    TooLarge { limit: usize },
    #[error("Content-Encoding {0:?} is not read; send gzip or no encoding")]
    Encoding(String),
    #[error("the request body is not valid {0}")]
    NotJson(String),
    #[error("{0}")]
    Shape(String),
    #[error("batch[{0}] has no type, or one that is no message type (identify, track, page, screen, group, alias)")]
    NoType(usize),
    #[error("batch[{index}] is over {limit} bytes as JSON; a message is at most {limit}")]
    MessageTooLarge { index: usize, limit: usize },
    #[error(
        "no write key: send it as the user of HTTP Basic authentication (`Authorization: Basic base64(key:)`) or as `writeKey` in the body"
    )]
    NoKey,
    #[error("unknown write key (an API key is not one: write keys are declared in the workspace file)")]
    UnknownKey,
    /// The one message of a single-message path cannot be read (its fields' shapes, the ids
    /// its type needs): the request is the message, so it is refused, not kept.
    #[error("{}", .0.reason)]
    Unreadable(Refused),
}

/// What a contact step found, loaded fresh.
pub struct Found {
    /// The write key's contact schema.
    pub context: Arc<WriteContext>,
    /// The contact's input the message gives (identities and attributes), already checked
    /// against the schema, and what no attribute holds.
    pub input: Input,
    pub kept: Map<String, Value>,
    /// The holders of the input's identity values.
    pub owners: Owners,
    /// The contact holding the message's userId.
    pub by_user: Option<Target>,
    /// The alias of the message's anonymousId (an alias message's previousId) and its contact.
    pub alias: Option<(String, Alias)>,
    pub by_alias: Option<Target>,
    /// The contact holding an identify's email.
    pub by_email: Option<Target>,
    /// The contact schema's identity capacity guard's limits.
    pub capacity: platform::settings::IdentityCapacity,
}

/// A message's contact step: finds (or creates) its contact, writes what an identify or an
/// alias says of it, binds the anonymous id, and keeps what no attribute holds. Answers
/// `{"contactId", "created"}`.
pub(crate) struct Resolve {
    pub key: Arc<WriteKey>,
    pub message: Arc<Message>,
    /// What an event's properties hold that its attributes do not, kept with this step.
    pub kept: Map<String, Value>,
}

/// The contact the message is about, by the rules of the module's documentation.
enum Choice<'a> {
    Existing(&'a Target),
    New,
}

fn user_id_of(target: &Target) -> Option<&str> {
    target.1.personal.as_ref().and_then(|personal| personal.user_id.as_deref())
}

/// Whether a contact found by its alias or its email may be the message's: it holds no
/// userId, or the message's.
fn may_take(target: &Target, user_id: Option<&str>) -> bool {
    match (user_id_of(target), user_id) {
        (Some(held), Some(given)) => held == given,
        _ => true,
    }
}

fn choose<'a>(message: &Message, found: &'a Found) -> Choice<'a> {
    let user_id = message.user_id.as_deref();
    if let Some(target) = &found.by_user {
        return Choice::Existing(target);
    }
    if message.kind == Kind::Alias {
        // The previous id's contact takes the userId unless it is another user's.
        return match &found.by_alias {
            Some(target) if user_id_of(target).is_none() => Choice::Existing(target),
            _ => Choice::New,
        };
    }
    for candidate in [&found.by_alias, &found.by_email].into_iter().flatten() {
        if may_take(candidate, user_id) {
            return Choice::Existing(candidate);
        }
    }
    Choice::New
}

/// `IngestMessageKept` of what no attribute held, sealed under the contact's key.
fn kept_stream(
    key: &WriteKey,
    message: &Message,
    (contact_id, data_key): (&str, &DataKey),
    kept: &Map<String, Value>,
    now_ms: i64,
) -> Result<Option<StreamAppend>, Refusal> {
    if kept.is_empty() {
        return Ok(None);
    }
    let data = proto::IngestKeptData { json: Value::Object(kept.clone()).to_string() };
    let mut sealed = platform::events::seal(contact_id, &data);
    platform::events::encrypt(&mut sealed, data_key).map_err(|error| Refusal::Unwritable(format!("{error:#}")))?;
    let event = proto::IngestMessageKept {
        space_id: key.space_id.clone(),
        contact_id: contact_id.to_owned(),
        write_key_id: key.id.clone(),
        message_id: message.message_id.clone(),
        message_type: message.kind.as_str().to_owned(),
        data: Some(sealed),
        at_ms: now_ms,
    };
    Ok(Some(StreamAppend {
        stream_id: format!("ingest-{contact_id}"),
        expected: ExpectedVersion::Any,
        events: vec![NewEvent {
            event: LogEvent::IngestMessageKept(event),
            subject_id: Some(contact_id.to_owned()),
            occurred_at: platform::time::from_millis(now_ms),
        }],
    }))
}

/// The alias bound (or moved) to `contact_id` at its revision, with the identity claims of
/// `POST /event-identities` (a fresh operation id: the alias's revision is what makes a
/// repeat change nothing).
fn bind_alias(
    key: &WriteKey,
    (digest, alias): (&str, &Alias),
    contact_id: &str,
    capacity: platform::settings::IdentityCapacity,
    given: &mut Given<'_>,
) -> (StreamAppend, Vec<Guard>) {
    let operation_id = given.fresh.uuid().to_string();
    let change = Change {
        source_id: key.source.clone(),
        subject_schema_id: key.contact_schema_id.clone(),
        anonymous_id: String::new(),
        contact_id: Some(contact_id.to_owned()),
        operation_id: operation_id.clone(),
        expected_revision: alias.revision,
    };
    let revision = alias.revision + 1;
    let previous = alias.contact_id.clone();
    let result = json!({"identityRevision": revision.to_string(), "isDuplicate": false});
    let guards =
        crate::identities::store::guards(capacity, &key.space_id, &change, digest, "ingest", &result, alias.revision);
    let event = proto::EventIdentityChanged {
        space_id: key.space_id.clone(),
        source_id: key.source.clone(),
        subject_schema_id: key.contact_schema_id.clone(),
        alias_digest: digest.to_owned(),
        operation_id,
        contact_id: contact_id.to_owned(),
        previous_contact_id: previous.unwrap_or_default(),
        revision,
        changed_at_ms: given.now_ms,
    };
    let stream = StreamAppend {
        stream_id: format!("alias/{}/{digest}", key.space_id),
        expected: if alias.revision == 0 {
            ExpectedVersion::NoStream
        } else {
            ExpectedVersion::Exactly(alias.revision)
        },
        events: vec![NewEvent {
            subject_id: Some(contact_id.to_owned()),
            occurred_at: platform::time::from_millis(given.now_ms),
            event: LogEvent::EventIdentityChanged(event),
        }],
    };
    (stream, guards)
}

/// A record of `schema` (in `space_id`) as the ingest writes it: `input` over the record
/// `target` (none when nothing changes), carried by the message `message_id`.
fn update_of(
    (space_id, schema): (&str, &WriteSchema<'_>),
    (version, current, data_key): &Target,
    (input, owners): (Input, &Owners),
    message_id: &str,
    given: &mut Given<'_>,
) -> Result<Option<Write>, Refusal> {
    match decide_update(schema, current, input, owners, given.now_ms)? {
        UpdateDecision::Unchanged { .. } => Ok(None),
        UpdateDecision::Changed(change) => {
            let write = update_write(space_id, schema.schema_id, (*version, data_key.clone()), *change, given.fresh)
                .map_err(|error| Refusal::Unwritable(error.to_string()))?;
            Ok(Some(write.carried_by("ingest", message_id)))
        }
    }
}

/// A new record `record_id` of `schema` with `input`, created by the message `message_id`
/// (`source: ingest`).
fn create_of(
    (space_id, schema): (&str, &WriteSchema<'_>),
    record_id: &str,
    (input, owners): (Input, &Owners),
    message_id: &str,
    given: &mut Given<'_>,
) -> Result<Write, Refusal> {
    let mut decision = decide_create(schema, input, owners, record_id, given.now_ms)?;
    decision.event.source = "ingest".to_owned();
    decision.event.source_id = message_id.to_owned();
    create_write(space_id, schema.schema_id, decision, given.fresh)
        .map_err(|error| Refusal::Unwritable(error.to_string()))
}

impl Decide for Resolve {
    type Loaded = Found;
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, found: Found, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let (key, message) = (&*self.key, &*self.message);
        if found.alias.as_ref().is_some_and(|(_, alias)| alias.erased) {
            return Err(Refusal::AliasErased);
        }
        let schema = write_schema(&found.context, &key.space_id);
        let now = given.now_ms;
        let mut streams = Vec::new();
        let mut guards = Vec::new();
        let space = (key.space_id.as_str(), &schema);
        let input = (found.input.clone(), &found.owners);
        let (contact_id, data_key, created) = match choose(message, &found) {
            Choice::Existing(target) => {
                let contact_id = target.1.record_id.clone();
                let data_key = match update_of(space, target, input, &message.message_id, given)? {
                    None => target.2.clone(),
                    Some(Write { stream, guards: claims, key: written_with }) => {
                        streams.push(stream);
                        guards.extend(claims);
                        Some(written_with)
                    }
                };
                (contact_id, data_key, false)
            }
            Choice::New => {
                let contact_id = given.fresh.id("con");
                let Write { stream, guards: claims, key: written_with } =
                    create_of(space, &contact_id, input, &message.message_id, given)?;
                streams.push(stream);
                guards.extend(claims);
                (contact_id, Some(written_with), true)
            }
        };
        if let Some((digest, alias)) = &found.alias
            && alias.contact_id.as_deref() != Some(contact_id.as_str())
        {
            let (stream, claims) = bind_alias(key, (digest, alias), &contact_id, found.capacity, given);
            streams.push(stream);
            guards.extend(claims);
        }
        if let Some(data_key) = &data_key {
            streams.extend(kept_stream(key, message, (&contact_id, data_key), &found.kept, now)?);
        }
        let reply = Reply::raw(json!({"contactId": contact_id, "created": created}));
        Ok(Outcome::batch(streams, guards, reply))
    }
}

/// A group's join: the object record its `groupId` names (created, or updated with its
/// traits) and the contact's attribute set to that record's id, in one append. Answers
/// `{"objectId"}`.
pub(crate) struct JoinGroup {
    pub key: Arc<WriteKey>,
    pub message: Arc<Message>,
    pub contact_id: String,
}

/// What a join found, loaded fresh.
pub struct Joined {
    pub object_context: Arc<WriteContext>,
    pub contact_context: Arc<WriteContext>,
    /// The object's input: `externalId` (the groupId) and the traits its attributes hold.
    pub input: Input,
    pub owners: Owners,
    /// The object holding the groupId, if any.
    pub object: Option<Target>,
    /// The contact the group joins.
    pub contact: Target,
    /// The contact's input that names the object (built once its id is known).
    pub contact_attribute: String,
}

impl Decide for JoinGroup {
    type Loaded = Joined;
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, joined: Joined, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let key = &*self.key;
        let object_schema = write_schema(&joined.object_context, &key.space_id);
        let mut streams = Vec::new();
        let mut guards = Vec::new();
        let message_id = &self.message.message_id;
        let input = (joined.input.clone(), &joined.owners);
        let (object_id, object_write) = match &joined.object {
            Some(target) => {
                let write = update_of((&key.space_id, &object_schema), target, input, message_id, given)?;
                (target.1.record_id.clone(), write)
            }
            None => {
                let object_id = given.fresh.id("obj");
                let write = create_of((&key.space_id, &object_schema), &object_id, input, message_id, given)?;
                (object_id, Some(write))
            }
        };
        let contact_schema = write_schema(&joined.contact_context, &key.space_id);
        let mut values = Map::new();
        values.insert(joined.contact_attribute.clone(), Value::String(object_id.clone()));
        let input = domain::records::decide::parse_input(&contact_schema, values)?;
        let owners = Owners::new();
        let contact_write =
            update_of((&key.space_id, &contact_schema), &joined.contact, (input, &owners), message_id, given)?;
        for write in object_write.into_iter().chain(contact_write) {
            streams.push(write.stream);
            guards.extend(write.guards);
        }
        Ok(Outcome::batch(streams, guards, Reply::raw(json!({"objectId": object_id}))))
    }
}

/// The code a refused message is listed with.
pub fn refusal_code(refusal: &Refusal) -> Code {
    match refusal {
        Refusal::Record(refusal) => refusal.code(),
        Refusal::AliasErased => Code::AliasErased,
        Refusal::Unwritable(_) => Code::InternalError,
    }
}

/// The contact's input a message gives: for an identify, its traits matched to the contact
/// schema's attributes (and `email`, `phone`), with its `userId`; for any other message its
/// `userId` alone. What no attribute holds is kept apart.
pub fn contact_input(message: &Message, context: &WriteContext) -> (Map<String, Value>, Map<String, Value>) {
    let (mut input, kept) = match message.kind {
        Kind::Identify => domain::ingest::matched(&message.traits, &context.attributes, &["email", "phone"]),
        _ => (Map::new(), Map::new()),
    };
    if let Some(user_id) = &message.user_id {
        input.insert("userId".to_owned(), Value::String(user_id.clone()));
    }
    (input, kept)
}

/// What could not be applied of a request: each message's id, type, refusal and the message
/// as sent, recorded in one append (`IngestMessagesRefused` on the log, the messages beside
/// it in `ingest_failures`, a message listed once however often it is sent again).
pub(crate) struct RecordRefusals {
    pub space_id: SpaceId,
    pub write_key_id: String,
    pub rows: Vec<(String, String, Refused, Value)>,
}

impl Decide for RecordRefusals {
    type Loaded = ();
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, (): (), given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let messages = self
            .rows
            .iter()
            .map(|(message_id, kind, refused, _)| proto::IngestRefusal {
                message_id: message_id.clone(),
                message_type: kind.clone(),
                code: refused.code.as_str().to_owned(),
                reason: refused.reason.clone(),
            })
            .collect();
        let event = proto::IngestMessagesRefused {
            space_id: self.space_id.clone().into(),
            write_key_id: self.write_key_id.clone(),
            messages,
            at_ms: given.now_ms,
        };
        let stream = StreamAppend {
            stream_id: format!("ingest-failures-{}", self.space_id),
            expected: ExpectedVersion::Any,
            events: vec![NewEvent {
                event: LogEvent::IngestMessagesRefused(event),
                subject_id: None,
                occurred_at: platform::time::from_millis(given.now_ms),
            }],
        };
        let column = |pick: fn(&(String, String, Refused, Value)) -> String| -> Vec<String> {
            self.rows.iter().map(pick).collect()
        };
        let messages: Vec<Value> = self.rows.iter().map(|(_, _, _, item)| item.clone()).collect();
        let guard = Guard {
            sql: "INSERT INTO ingest_failures (space_id, write_key_id, message_id, message_type, code, reason, message)
                  SELECT $1, $2, m, t, c, r, j FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::jsonb[])
                      AS f(m, t, c, r, j)
                  ON CONFLICT DO NOTHING",
            params: vec![
                Box::new(self.space_id.clone()),
                Box::new(self.write_key_id.clone()),
                Box::new(column(|row| row.0.clone())),
                Box::new(column(|row| row.1.clone())),
                Box::new(column(|row| row.2.code.as_str().to_owned())),
                Box::new(column(|row| row.2.reason.clone())),
                Box::new(messages),
            ],
            conflict: platform::log::AppendError::Conflict {
                code: Code::OperationTaken,
                message: "the refusals were not recorded".to_owned(),
            },
            expect_rows: None,
            set: None,
        };
        Ok(Outcome::one(stream, vec![guard], Reply::raw(json!({"recorded": self.rows.len()}))).in_space(&self.space_id))
    }
}

impl platform::refusal::Answered for Intake {}

/// A refused ingest request: 401 for its key (with the Basic challenge Segment's clients
/// expect), 400 for its body, the message it names as its issue.
impl platform::refusal::Refusal for Intake {
    /// The code the refusal answers with.
    fn code(&self) -> Code {
        match self {
            Self::TooLarge { .. } => Code::BatchTooLarge,
            Self::Encoding(_) | Self::Shape(_) => Code::InvalidBody,
            Self::NotJson(_) => Code::MalformedJson,
            Self::NoType(_) => Code::InvalidBatch,
            Self::MessageTooLarge { .. } => Code::MessageTooLarge,
            Self::NoKey | Self::UnknownKey => Code::InvalidWriteKey,
            Self::Unreadable(refused) => refused.code,
        }
    }

    fn issues(&self) -> Vec<platform::error::Issue> {
        match self {
            Self::NoType(index) | Self::MessageTooLarge { index, .. } => {
                vec![platform::error::Issue::coded(format!("batch[{index}]"), Intake::code(self), self.to_string())]
            }
            _ => Vec::new(),
        }
    }

    fn headers(&self) -> Vec<(&'static str, String)> {
        match self {
            Self::NoKey | Self::UnknownKey => vec![("WWW-Authenticate", "Basic realm=\"ingest\"".to_owned())],
            _ => Vec::new(),
        }
    }
}

impl platform::refusal::Answered for Refusal {}

/// A message the ingest could not apply, as the pipeline answers it (the failures list keeps
/// its code and message).
impl platform::refusal::Refusal for Refusal {
    fn code(&self) -> Code {
        match self {
            Self::Record(refusal) => refusal.code(),
            Self::AliasErased => Code::AliasErased,
            Self::Unwritable(_) => Code::InternalError,
        }
    }

    fn issues(&self) -> Vec<platform::error::Issue> {
        match self {
            Self::Record(refusal) => platform::refusal::Refusal::issues(refusal),
            _ => Vec::new(),
        }
    }

    fn is_defect(&self) -> bool {
        matches!(self, Self::Unwritable(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::harness::given;
    use domain::catalog::{AttributeEntry, SchemaEntry};
    use domain::records::RecordState;
    use domain::records::decide::parse_input;
    use std::collections::BTreeMap;

    fn key() -> Arc<WriteKey> {
        Arc::new(WriteKey {
            id: "wrk_1".into(),
            space_id: "spc_1".into(),
            slug: "web".into(),
            source: "web".into(),
            contact_schema_id: "sch_c".into(),
            events: BTreeMap::new(),
            page_schema_id: None,
            screen_schema_id: None,
            group: None,
        })
    }

    fn context() -> Arc<WriteContext> {
        Arc::new(WriteContext {
            schema: SchemaEntry {
                schema_id: "sch_c".into(),
                slug: "contacts".into(),
                schema_type: "contact".into(),
                doc: json!({}),
                attribute_count: 1,
                revision: 1,
            },
            attributes: vec![AttributeEntry { key: "plan".into(), definition: json!({"type": "string"}) }],
            credits: 0,
            revision: 1,
        })
    }

    fn message(kind: Kind, user: Option<&str>, anonymous: Option<&str>) -> Arc<Message> {
        let item = json!({"messageId": "m-1", "userId": user, "anonymousId": anonymous, "previousId": anonymous,
                          "event": "Signed Up", "traits": {"plan": "pro", "shoe": 42}});
        Arc::new(domain::ingest::read(kind, &item, || "g".to_owned()).expect("a message"))
    }

    /// A live contact `id` holding `user_id`.
    fn contact(id: &str, user_id: Option<&str>) -> Target {
        let state = RecordState {
            record_id: id.into(),
            space_id: "spc_1".into(),
            schema_id: "sch_c".into(),
            schema_type: "contact".into(),
            source: "api".into(),
            created_at_ms: 1,
            updated_at_ms: 1,
            personal: Some(proto::RecordPersonal {
                user_id: user_id.map(str::to_owned),
                values_json: "{}".into(),
                ..Default::default()
            }),
        };
        (2, state, None)
    }

    fn found(message: &Message, by_user: Option<Target>, alias: Option<(Option<&str>, Option<Target>)>) -> Found {
        let context = context();
        let (raw, kept) = contact_input(message, &context);
        let input = parse_input(&write_schema(&context, "spc_1"), raw).expect("valid");
        let (alias, by_alias) = match alias {
            Some((bound, target)) => (
                Some((
                    "digest".to_owned(),
                    Alias { contact_id: bound.map(str::to_owned), revision: i64::from(bound.is_some()), erased: false },
                )),
                target,
            ),
            None => (None, None),
        };
        Found {
            context,
            input,
            kept,
            owners: Owners::new(),
            by_user,
            alias,
            by_alias,
            by_email: None,
            capacity: platform::settings::IdentityCapacity::default(),
        }
    }

    fn resolve(message: Arc<Message>) -> Resolve {
        Resolve { key: key(), message, kept: Map::new() }
    }

    fn types(outcome: &Outcome) -> Vec<&str> {
        outcome.events().iter().map(|event| event.event_type()).collect()
    }

    #[test]
    fn given_an_unknown_visitor_when_identified_then_a_contact_is_created_with_its_user_id_and_the_alias_bound() {
        let identify = message(Kind::Identify, Some("u-1"), Some("a-1"));
        let outcome = given(found(&identify, None, Some((None, None)))).when(&resolve(identify)).decided();
        assert_eq!(types(&outcome), ["RecordCreated.v1", "EventIdentityChanged.v1", "IngestMessageKept.v1"]);
        let LogEvent::RecordCreated(created) = outcome.events()[0] else { panic!("created") };
        assert_eq!((created.source.as_str(), created.source_id.as_str()), ("ingest", "m-1"));
        let LogEvent::EventIdentityChanged(bound) = outcome.events()[1] else { panic!("bound") };
        assert_eq!((bound.contact_id.as_str(), bound.revision), ("con_1", 1));
        assert_eq!(outcome.reply().expect("a reply").json(), json!({"contactId": "con_1", "created": true}));
    }

    #[test]
    fn given_a_visitor_known_by_its_anonymous_id_when_it_signs_up_then_its_contact_takes_the_user_id() {
        let alias = message(Kind::Alias, Some("u-1"), Some("a-1"));
        let outcome = given(found(&alias, None, Some((Some("con_anon"), Some(contact("con_anon", None))))))
            .when(&resolve(alias))
            .decided();
        assert_eq!(types(&outcome), ["RecordUpdated.v1"], "the alias names it already");
        let LogEvent::RecordUpdated(updated) = outcome.events()[0] else { panic!("updated") };
        assert_eq!((updated.record_id.as_str(), updated.change_source.as_str()), ("con_anon", "ingest"));
        assert_eq!(updated.changed_keys, ["userId"]);
    }

    #[test]
    fn given_both_ids_known_when_aliased_then_the_users_contact_survives_and_the_alias_moves_to_it() {
        let alias = message(Kind::Alias, Some("u-1"), Some("a-1"));
        let found = found(
            &alias,
            Some(contact("con_user", Some("u-1"))),
            Some((Some("con_anon"), Some(contact("con_anon", None)))),
        );
        let outcome = given(found).when(&resolve(alias)).decided();
        assert_eq!(types(&outcome), ["EventIdentityChanged.v1"], "nothing else is written: no merge of data");
        let LogEvent::EventIdentityChanged(moved) = outcome.events()[0] else { panic!("moved") };
        assert_eq!(
            (moved.contact_id.as_str(), moved.previous_contact_id.as_str(), moved.revision),
            ("con_user", "con_anon", 2)
        );
    }

    #[test]
    fn given_an_anonymous_id_of_another_user_when_a_new_user_is_seen_then_a_contact_of_its_own_is_made() {
        let track = message(Kind::Track, Some("u-2"), Some("a-1"));
        let found = found(&track, None, Some((Some("con_other"), Some(contact("con_other", Some("u-1"))))));
        let outcome = given(found).when(&resolve(track)).decided();
        assert_eq!(types(&outcome), ["RecordCreated.v1", "EventIdentityChanged.v1"], "a shared device's second user");
        let erased = Found {
            alias: Some(("digest".to_owned(), Alias { contact_id: None, revision: 3, erased: true })),
            ..found_of_erased()
        };
        given(erased).when(&resolve(message(Kind::Track, None, Some("a-1")))).then_refused(Refusal::AliasErased);
    }

    fn found_of_erased() -> Found {
        found(&message(Kind::Track, None, Some("a-1")), None, None)
    }
}
