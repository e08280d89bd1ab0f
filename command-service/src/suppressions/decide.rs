//! Suppression decisions: validating input, adding one or a batch, and whether one may be
//! removed.

use std::collections::{HashMap, HashSet};

use domain::suppressions::{API_REASONS, removable, scope, suppression_document};
use platform::error::Code;
use platform::error::Issue;
use platform::events::{LogEvent, seal};
use platform::ids::SpaceId;
use platform::log::{ExpectedVersion, Guard, NewEvent, StreamAppend};
use platform::proto::{self, SuppressionAdded};
use serde_json::{Value, json};

use domain::attributes::normalize_email;

pub(crate) use super::NewSuppression;
use super::store::{key_guard, removal_guard, stream_id};
use crate::decision::{Decide, Given, Outcome, Reply};

/// Items a batch takes.
const BATCH_MAX: usize = 100;

/// Why a suppression write is refused. The HTTP edge maps each to the contract's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The input is not a suppression; `issues` names every problem (400).
    #[error("{message}")]
    Invalid { code: Code, message: String, issues: Vec<Issue> },
    /// No such suppression in the caller's space, or already removed (404).
    #[error("no suppression {0:?} in this space")]
    NotFound(String),
    /// A global or provider (bounce, complaint) suppression (409).
    #[error(
        "only manual and legal suppressions of your space can be removed; global and provider (bounce, complaint) \
         suppressions cannot"
    )]
    NotRemovable,
    /// A batch whose suppressions kept changing while it was applied (409).
    #[error("the suppressions kept changing while this batch was applied; retry")]
    KeptChanging,
    /// A stored suppression that cannot be read back (500).
    #[error("{0}")]
    Unreadable(String),
}

/// Parses `{identifier, reason}`: an email address and `manual` or `legal`.
pub(crate) fn parse_new(value: &Value) -> Result<NewSuppression, Refusal> {
    let Some(object) = value.as_object() else {
        let message = "a suppression is a JSON object {identifier, reason}".to_owned();
        return Err(Refusal::Invalid { code: Code::InvalidBody, message, issues: Vec::new() });
    };
    let mut issues = Vec::new();
    for key in object.keys().filter(|key| !matches!(key.as_str(), "identifier" | "reason")) {
        issues.push(Issue::coded(key, Code::UnknownField, format!("{key} is not a suppression field")));
    }
    let identifier = match object.get("identifier").and_then(Value::as_str) {
        Some(text) => match normalize_email(text) {
            Ok(email) => Some(email),
            Err(message) => {
                issues.push(Issue::coded("identifier", Code::InvalidIdentifier, message));
                None
            }
        },
        None => {
            issues.push(Issue::coded(
                "identifier",
                Code::InvalidIdentifier,
                "identifier (an email address) is required",
            ));
            None
        }
    };
    let reason = match object.get("reason").and_then(Value::as_str) {
        Some(reason) if API_REASONS.contains(&reason) => Some(reason.to_owned()),
        _ => {
            issues.push(Issue::coded("reason", Code::InvalidReason, "reason must be manual or legal"));
            None
        }
    };
    match (identifier, reason, issues.first()) {
        (Some(identifier), Some(reason), None) => Ok(NewSuppression { identifier, reason }),
        (_, _, first) => {
            let (code, message) = first.map_or((Code::InvalidBody, String::new()), |i| {
                (i.code.unwrap_or(Code::InvalidBody), i.message.clone())
            });
            Err(Refusal::Invalid { code, message, issues })
        }
    }
}

pub(crate) fn decide_add(
    space_id: &str,
    new: &NewSuppression,
    suppression_id: &str,
    now_ms: i64,
    source: &str,
) -> proto::SuppressionAdded {
    proto::SuppressionAdded {
        suppression_id: suppression_id.to_owned(),
        space_id: space_id.to_owned(),
        reason: new.reason.clone(),
        created_at_ms: now_ms,
        personal: Some(seal(suppression_id, &proto::SuppressionPersonal { identifier: new.identifier.clone() })),
        source: source.to_owned(),
    }
}

/// Decides removing `added` (`None` when it does not exist or was removed) for a caller in
/// `space_id`. Global suppressions are visible to every space but removable by none.
pub(crate) fn decide_remove(
    space_id: &str,
    suppression_id: &str,
    added: Option<&proto::SuppressionAdded>,
    now_ms: i64,
) -> Result<proto::SuppressionRemoved, Refusal> {
    let not_found = || Refusal::NotFound(suppression_id.to_owned());
    let added = added.ok_or_else(not_found)?;
    if !added.space_id.is_empty() && added.space_id != space_id {
        return Err(not_found());
    }
    if !removable(added) {
        return Err(Refusal::NotRemovable);
    }
    Ok(proto::SuppressionRemoved {
        suppression_id: added.suppression_id.clone(),
        space_id: added.space_id.clone(),
        removed_at_ms: now_ms,
    })
}

/// Reads `{<field>: [1..100 items]}`; any other field is `unknown_field`.
pub(crate) fn batch_items(body: &Value, field: &str) -> Result<Vec<Value>, Refusal> {
    if let Some(object) = body.as_object() {
        let issues: Vec<Issue> = object
            .keys()
            .filter(|key| key.as_str() != field)
            .map(|key| Issue::coded(key, Code::UnknownField, format!("{key} is not a field; the body has {field}")))
            .collect();
        if let Some(first) = issues.first() {
            return Err(Refusal::Invalid { code: Code::UnknownField, message: first.message.clone(), issues });
        }
    }
    let Some(items) = body.get(field).and_then(Value::as_array) else {
        let message = format!("the body must be an object with an array {field:?}");
        return Err(Refusal::Invalid { code: Code::InvalidBody, message, issues: Vec::new() });
    };
    if items.is_empty() || items.len() > BATCH_MAX {
        let message = format!("{field} must hold 1 to {BATCH_MAX} items; got {}", items.len());
        return Err(Refusal::Invalid { code: Code::InvalidBatchSize, message, issues: Vec::new() });
    }
    Ok(items.clone())
}

/// The append of one new suppression, its uniqueness guard included, and its document.
struct Addition {
    stream: StreamAppend,
    guard: Guard,
    document: Value,
}

/// Adds `new` (whose identifier's subject is `subject_id`) in `space_id`.
fn addition(
    space_id: &str,
    new: &NewSuppression,
    subject_id: &str,
    given: &mut Given<'_>,
) -> Result<Addition, Refusal> {
    let suppression_id = given.fresh.id("sup");
    let added = decide_add(space_id, new, &suppression_id, given.now_ms, "api");
    let document = suppression_document(&added)
        .ok()
        .flatten()
        .ok_or_else(|| Refusal::Unreadable("could not build the suppression document".to_owned()))?;
    let occurred_at = platform::time::from_millis(added.created_at_ms);
    Ok(Addition {
        stream: StreamAppend {
            stream_id: stream_id(&suppression_id),
            expected: ExpectedVersion::NoStream,
            events: vec![NewEvent {
                event: LogEvent::SuppressionAdded(added),
                subject_id: Some(subject_id.to_owned()),
                occurred_at,
            }],
        },
        guard: key_guard(scope(space_id), new, &suppression_id),
        document,
    })
}

/// A live suppression as a removal decides on it.
#[derive(Debug, Clone)]
pub(crate) struct Current {
    /// Its stream's version.
    pub version: i64,
    pub added: SuppressionAdded,
    /// Its identifier's subject (`None` when its personal data is erased).
    pub subject_id: Option<String>,
}

/// The append of one removal.
struct Removal {
    stream: StreamAppend,
    guard: Guard,
}

fn removal(space_id: &str, suppression_id: &str, current: Option<&Current>, now_ms: i64) -> Result<Removal, Refusal> {
    let version = current.map_or(0, |current| current.version);
    let removed = decide_remove(space_id, suppression_id, current.map(|current| &current.added), now_ms)?;
    let occurred_at = platform::time::from_millis(removed.removed_at_ms);
    let subject_id = current.and_then(|current| current.subject_id.clone());
    Ok(Removal {
        stream: StreamAppend {
            stream_id: stream_id(suppression_id),
            expected: ExpectedVersion::Exactly(version),
            events: vec![NewEvent { event: LogEvent::SuppressionRemoved(removed), subject_id, occurred_at }],
        },
        guard: removal_guard(suppression_id),
    })
}

/// `POST /contacts/suppressions`: one suppression. The identifier and reason are unique in
/// the space by the append's guard.
pub(crate) struct CreateSuppression {
    pub space_id: SpaceId,
    pub new: NewSuppression,
}

impl Decide for CreateSuppression {
    /// The identifier's subject.
    type Loaded = String;
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, subject_id: String, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let Addition { stream, guard, document } = addition(&self.space_id, &self.new, &subject_id, given)?;
        Ok(Outcome::one(stream, vec![guard], Reply::created(json!(document))))
    }
}

/// What one item of a batch came to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Item {
    /// Added, with its document.
    Created(Value),
    /// Its identifier and reason exist already, or repeat an earlier item.
    Exists,
    /// Removed.
    Removed(String),
    /// Refused: not a suppression or not an id (`id` is `None`), or not removable.
    Refused { id: Option<String>, refusal: Refusal },
}

/// A batch decided: its appends in one transaction (none when it writes nothing), and what
/// each item came to.
pub(crate) struct Batch {
    pub streams: Vec<StreamAppend>,
    pub guards: Vec<Guard>,
    pub items: Vec<Item>,
}

/// `POST /contacts/suppressions/batch`: the new suppressions; an item whose identifier and
/// reason exist already (or repeat an earlier item) is `exists`.
pub(crate) struct BatchCreate {
    pub space_id: SpaceId,
    pub parsed: Vec<Result<NewSuppression, Refusal>>,
}

/// What a batch create decides on: the `(identifier, reason)` pairs that exist, and each
/// identifier's subject.
pub(crate) struct Existing {
    pub keys: HashSet<(String, String)>,
    pub subjects: HashMap<String, String>,
}

impl Decide for BatchCreate {
    type Loaded = Existing;
    type Outcome = Batch;
    type Refusal = Refusal;

    fn decide(&self, existing: Existing, given: &mut Given<'_>) -> Result<Batch, Refusal> {
        let mut seen = HashSet::new();
        let mut batch = Batch { streams: Vec::new(), guards: Vec::new(), items: Vec::new() };
        for item in &self.parsed {
            let new = match item {
                Ok(new) => new,
                Err(refusal) => {
                    batch.items.push(Item::Refused { id: None, refusal: refusal.clone() });
                    continue;
                }
            };
            let key = (new.identifier.clone(), new.reason.clone());
            if existing.keys.contains(&key) || !seen.insert(key) {
                batch.items.push(Item::Exists);
                continue;
            }
            let subject_id = existing
                .subjects
                .get(&new.identifier)
                .ok_or_else(|| Refusal::Unreadable(format!("no subject was loaded for item {}", batch.items.len())))?;
            let Addition { stream, guard, document } = addition(&self.space_id, new, subject_id, given)?;
            batch.items.push(Item::Created(document));
            batch.streams.push(stream);
            batch.guards.push(guard);
        }
        Ok(batch)
    }
}

/// `POST /contacts/suppressions/batch-remove`: the removals; an id repeated in the batch is
/// not found after its first removal.
pub(crate) struct BatchRemove {
    pub space_id: SpaceId,
    pub items: Vec<Value>,
}

impl BatchRemove {
    /// The ids it names.
    pub(crate) fn ids(&self) -> Vec<String> {
        self.items.iter().filter_map(|item| item.as_str().map(str::to_owned)).collect()
    }
}

impl Decide for BatchRemove {
    type Loaded = HashMap<String, Current>;
    type Outcome = Batch;
    type Refusal = Refusal;

    fn decide(&self, current: Self::Loaded, given: &mut Given<'_>) -> Result<Batch, Refusal> {
        let mut seen = HashSet::new();
        let mut batch = Batch { streams: Vec::new(), guards: Vec::new(), items: Vec::new() };
        for item in &self.items {
            let Some(id) = item.as_str() else {
                let message = "each id must be a string".to_owned();
                let refusal = Refusal::Invalid { code: Code::InvalidId, message, issues: Vec::new() };
                batch.items.push(Item::Refused { id: None, refusal });
                continue;
            };
            let found = if seen.insert(id) { current.get(id) } else { None };
            match removal(&self.space_id, id, found, given.now_ms) {
                Ok(Removal { stream, guard }) => {
                    batch.items.push(Item::Removed(id.to_owned()));
                    batch.streams.push(stream);
                    batch.guards.push(guard);
                }
                Err(refusal) => batch.items.push(Item::Refused { id: Some(id.to_owned()), refusal }),
            }
        }
        Ok(batch)
    }
}

/// `DELETE /contacts/suppressions/{id}`. One removed by someone else meanwhile is found gone
/// when decided again.
pub(crate) struct DeleteSuppression {
    pub space_id: SpaceId,
    pub suppression_id: String,
}

impl Decide for DeleteSuppression {
    type Loaded = Option<Current>;
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, current: Self::Loaded, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let Removal { stream, guard } = removal(&self.space_id, &self.suppression_id, current.as_ref(), given.now_ms)?;
        let body = json!({ "id": self.suppression_id, "deleted": true });
        Ok(Outcome::one(stream, vec![guard], Reply::ok(body)))
    }
}

impl platform::refusal::Answered for Refusal {}

/// A refused suppression write as the contract answers it.
impl platform::refusal::Refusal for Refusal {
    fn code(&self) -> Code {
        match self {
            Self::Invalid { code, .. } => *code,
            Self::NotFound(_) => Code::SuppressionNotFound,
            Self::NotRemovable => Code::SuppressionNotRemovable,
            Self::KeptChanging => Code::ConcurrentModification,
            Self::Unreadable(_) => Code::InternalError,
        }
    }

    fn issues(&self) -> Vec<Issue> {
        match self {
            Self::Invalid { issues, .. } => issues.clone(),
            _ => Vec::new(),
        }
    }

    fn is_defect(&self) -> bool {
        matches!(self, Self::Unreadable(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::harness::{NOW_MS, given};
    use crate::decision::{Body, Status};
    use platform::refusal::Refusal as _;
    use serde_json::json;

    fn new(identifier: &str, reason: &str) -> NewSuppression {
        NewSuppression { identifier: identifier.into(), reason: reason.into() }
    }

    #[test]
    fn a_new_suppression_is_added_under_a_fresh_id_and_answered_created() {
        let command = CreateSuppression { space_id: "spc_1".into(), new: new("a@b.io", "manual") };
        let reply = given("email:ab".to_owned()).when(&command).then_events(&[LogEvent::SuppressionAdded(decide_add(
            "spc_1",
            &new("a@b.io", "manual"),
            "sup_1",
            NOW_MS,
            "api",
        ))]);
        assert_eq!(reply.status, Status::Created);
        assert_eq!(reply.json()["data"]["id"], "sup_1");
        assert_eq!(reply.json()["data"]["identifier"], "a@b.io");
    }

    #[test]
    fn deleting_a_suppression_of_another_space_or_a_provider_one_is_refused() {
        let delete = |space: &str| DeleteSuppression { space_id: space.into(), suppression_id: "sup_1".into() };
        let manual = decide_add("spc_1", &new("a@b.io", "manual"), "sup_1", 0, "api");
        let removed = proto::SuppressionRemoved {
            suppression_id: "sup_1".into(),
            space_id: "spc_1".into(),
            removed_at_ms: NOW_MS,
        };
        let current = |added: &SuppressionAdded| Some(Current { version: 1, added: added.clone(), subject_id: None });
        let reply =
            given(current(&manual)).when(&delete("spc_1")).then_events(&[LogEvent::SuppressionRemoved(removed)]);
        assert_eq!(reply.body, Body::Data { data: json!({"id": "sup_1", "deleted": true}), warnings: Vec::new() });
        given(current(&manual)).when(&delete("spc_2")).then_refused(Refusal::NotFound("sup_1".into()));
        given(None).when(&delete("spc_1")).then_refused(Refusal::NotFound("sup_1".into()));
        let bounce = decide_add("spc_1", &new("a@b.io", "bounce"), "sup_1", 0, "provider");
        given(current(&bounce)).when(&delete("spc_1")).then_refused(Refusal::NotRemovable);
    }

    #[test]
    fn a_batch_adds_each_new_pair_once_and_reports_the_rest() {
        let parsed = vec![
            Ok(new("a@b.io", "manual")),
            Ok(new("a@b.io", "manual")),
            Ok(new("c@d.io", "legal")),
            parse_new(&json!({"identifier": "nope", "reason": "manual"})),
        ];
        let command = BatchCreate { space_id: "spc_1".into(), parsed };
        let existing = Existing {
            keys: HashSet::from([("c@d.io".to_owned(), "legal".to_owned())]),
            subjects: HashMap::from([
                ("a@b.io".to_owned(), "email:ab".to_owned()),
                ("c@d.io".to_owned(), "email:cd".to_owned()),
            ]),
        };
        let batch = given(existing).when(&command).decided();
        assert_eq!(batch.streams.len(), 1);
        assert_eq!(batch.streams[0].stream_id, "suppression/sup_1");
        assert!(matches!(&batch.items[0], Item::Created(document) if document["id"] == "sup_1"));
        assert_eq!(batch.items[1], Item::Exists);
        assert_eq!(batch.items[2], Item::Exists);
        assert!(matches!(&batch.items[3], Item::Refused { id: None, refusal: Refusal::Invalid { .. } }));
    }

    #[test]
    fn a_batch_removal_finds_a_repeated_id_gone_and_a_non_string_invalid() {
        let manual = decide_add("spc_1", &new("a@b.io", "manual"), "sup_1", 0, "api");
        let command = BatchRemove { space_id: "spc_1".into(), items: vec![json!("sup_1"), json!("sup_1"), json!(7)] };
        let batch =
            given(HashMap::from([("sup_1".to_owned(), Current { version: 1, added: manual, subject_id: None })]))
                .when(&command)
                .decided();
        assert_eq!(batch.streams.len(), 1);
        assert_eq!(batch.items[0], Item::Removed("sup_1".into()));
        assert_eq!(
            batch.items[1],
            Item::Refused { id: Some("sup_1".into()), refusal: Refusal::NotFound("sup_1".into()) }
        );
        assert!(matches!(
            &batch.items[2],
            Item::Refused { id: None, refusal: Refusal::Invalid { code: Code::InvalidId, .. } }
        ));
    }

    #[test]
    fn a_batch_needs_one_to_a_hundred_items_and_no_other_field() {
        assert_eq!(batch_items(&json!({"ids": ["a"]}), "ids"), Ok(vec![json!("a")]));
        for (body, code) in [
            (json!({"ids": []}), Code::InvalidBatchSize),
            (json!({"ids": vec![json!("a"); 101]}), Code::InvalidBatchSize),
            (json!({"ids": "a"}), Code::InvalidBody),
            (json!({"ids": ["a"], "more": 1}), Code::UnknownField),
        ] {
            assert_eq!(batch_items(&body, "ids").map_err(|refusal| refusal.code()), Err(code), "{body}");
        }
    }

    #[test]
    fn input_needs_an_email_and_an_api_reason() {
        let parsed = parse_new(&json!({"identifier": " A@B.io ", "reason": "legal"})).expect("valid");
        assert_eq!(parsed, NewSuppression { identifier: "a@b.io".into(), reason: "legal".into() });
        for bad in [
            json!({"identifier": "nope", "reason": "manual"}),
            json!({"identifier": "a@b.io", "reason": "bounce"}),
            json!({"identifier": "a@b.io"}),
            json!({"identifier": "a@b.io", "reason": "manual", "extra": 1}),
            json!([1]),
        ] {
            assert!(matches!(parse_new(&bad), Err(Refusal::Invalid { .. })), "{bad}");
        }
    }

    #[test]
    fn only_manual_and_legal_of_the_callers_space_can_be_removed() {
        let new = |reason: &str| NewSuppression { identifier: "a@b.io".into(), reason: reason.into() };
        let manual = decide_add("spc_1", &new("manual"), "sup_1", 0, "api");
        assert!(decide_remove("spc_1", "sup_1", Some(&manual), 1).is_ok());
        let not_found = Err(Refusal::NotFound("sup_1".into()));
        assert_eq!(decide_remove("spc_2", "sup_1", Some(&manual), 1), not_found);
        assert_eq!(decide_remove("spc_1", "sup_1", None, 1), not_found);
        let bounce = decide_add("spc_1", &new("bounce"), "sup_2", 0, "provider");
        assert_eq!(decide_remove("spc_1", "sup_2", Some(&bounce), 1), Err(Refusal::NotRemovable));
        let global = decide_add("", &new("manual"), "sup_3", 0, "authoring");
        assert_eq!(decide_remove("spc_1", "sup_3", Some(&global), 1), Err(Refusal::NotRemovable));
    }
}
