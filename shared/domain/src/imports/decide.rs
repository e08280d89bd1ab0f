//! An import's rows decided, a wave at a time: each row follows the record rules of an upsert
//! (rule 3's matching, validation, defaults, identity collisions), and beyond them:
//! - a row needs a key to be matched by (`userId`, `email` or `phone`; `externalId`, or the
//!   record's `id`), so that importing the same file again changes nothing;
//! - a row may grant consent (a consent attribute set to true) or subscribe to topics
//!   (`topics`, by slug, name or id) only when the import stated a consent source; the writes
//!   carry the import as their provenance, a subscription `SubscriptionChanged` with source
//!   `import` (only for topics the contact is not subscribed to, so a re-import writes none);
//! - a row that shares an identity value or a record with an earlier row of the wave waits for
//!   the next wave, which reads what the earlier one wrote (a file's later row wins);
//! - a suppressed address is imported and reported: the suppression stays.

use kernel::refusal::Refusal as _;
use std::collections::{BTreeMap, HashSet};

use kernel::error::{Code, Warning};
use kernel::events::LogEvent;
use kernel::log::{ExpectedVersion, Guard, NewEvent, StreamAppend};
use kernel::proto;
use serde_json::{Map, Value};

use super::TOPICS;
use crate::records::decide::{
    Input, Match, Owners, UpdateDecision, WriteSchema, decide_create, decide_update, identity_keys, live_target,
    match_upsert, parse_input,
};
use crate::records::write::{Write, create_write, update_write};
use crate::records::{Loaded, RecordState};
use kernel::fresh::Fresh;

/// The import the writes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    pub import_id: String,
    pub consent_label: Option<String>,
    pub file_name: Option<String>,
}

impl Provenance {
    fn proto(&self) -> proto::ImportProvenance {
        proto::ImportProvenance {
            import_id: self.import_id.clone(),
            consent_label: self.consent_label.clone().unwrap_or_default(),
            file_name: self.file_name.clone().unwrap_or_default(),
        }
    }
}

/// The identity a row was matched by, as its result names it.
pub type Key = Option<(&'static str, String)>;

/// What a written row appends: its streams and guards (the record's, and its subscriptions').
pub struct Writes {
    pub streams: Vec<StreamAppend>,
    pub guards: Vec<Guard>,
}

impl Writes {
    fn of(write: Option<Write>, subscriptions: Option<StreamAppend>) -> Option<Self> {
        let (mut streams, guards) = match write {
            Some(write) => (vec![write.stream], write.guards),
            None => (Vec::new(), Vec::new()),
        };
        streams.extend(subscriptions);
        (!streams.is_empty()).then_some(Self { streams, guards })
    }
}

/// What became of a row. A row whose record is unchanged but which subscribes the contact to
/// a topic is `Updated`.
pub enum Outcome {
    Created {
        record_id: String,
        key: Key,
        warnings: Vec<Warning>,
        writes: Writes,
    },
    Updated {
        record_id: String,
        key: Key,
        warnings: Vec<Warning>,
        writes: Writes,
    },
    Unchanged {
        record_id: String,
        key: Key,
        warnings: Vec<Warning>,
    },
    Failed {
        key: Key,
        code: Code,
        message: String,
    },
    /// It shares an identity or a record with an earlier row of this wave: decide it in the next.
    Deferred,
}

/// What a wave reads before it decides: who holds the rows' identity values, the records
/// they (or the rows' ids) name with their stream versions, the suppressed addresses among
/// the rows', the space's topics (slug, name and id, each to the id), and those records'
/// subscriptions (contact -> topic -> status).
pub struct Facts<'a> {
    pub owners: &'a Owners,
    pub records: &'a BTreeMap<String, (i64, Loaded)>,
    pub suppressed: &'a HashSet<String>,
    pub topics: &'a BTreeMap<String, String>,
    pub subscriptions: &'a BTreeMap<String, BTreeMap<String, String>>,
}

/// A row's input checked against the schema, with the topics it lists set aside.
pub struct Checked {
    pub input: Input,
    pub topics: Vec<String>,
}

/// Checks a row's raw input: the record rules' validation, a key to match by, and a
/// consent source for any consent it grants.
pub fn check(
    schema: &WriteSchema<'_>,
    provenance: &Provenance,
    mut raw: Map<String, Value>,
) -> Result<Checked, (Key, Code, String)> {
    let topics = match raw.remove(TOPICS) {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
            items.into_iter().filter_map(|item| item.as_str().map(str::to_owned)).collect()
        }
        Some(_) => return Err((None, Code::InvalidField, "topics must be a list of topic slugs".to_owned())),
    };
    let given = raw_key(schema, &raw);
    let input = parse_input(schema, raw).map_err(|refusal| (given, refusal.code(), refusal.to_string()))?;
    let key = key_of(schema, &input);
    if key.is_none() && input.id.is_none() {
        let keys = identity_keys(schema.schema_type).join(", ");
        return Err((None, Code::MissingField, format!("a row needs one of {keys} (or id) to be matched by")));
    }
    if !topics.is_empty() && schema.schema_type != "contact" {
        return Err((key, Code::InvalidField, "topics apply to contacts only".to_owned()));
    }
    let grants = !topics.is_empty()
        || schema.attributes.iter().any(|attribute| {
            attribute.definition.get("consent").is_some()
                && input.values.get(&attribute.key) == Some(&Value::Bool(true))
        });
    if grants && provenance.consent_label.is_none() {
        return Err((
            key,
            Code::ConsentSourceRequired,
            "the row grants consent or subscribes to topics, and the import states no consent source (consent.label)"
                .to_owned(),
        ));
    }
    Ok(Checked { input, topics })
}

/// The identity a row names, as given, for the result of a row the record rules refuse.
fn raw_key(schema: &WriteSchema<'_>, raw: &Map<String, Value>) -> Key {
    identity_keys(schema.schema_type).iter().find_map(|key| match raw.get(*key) {
        Some(Value::String(value)) if !value.trim().is_empty() => Some((*key, value.trim().to_owned())),
        _ => None,
    })
}

/// The identity a row is matched by, in rule 3's order.
fn key_of(schema: &WriteSchema<'_>, input: &Input) -> Key {
    identity_keys(schema.schema_type).iter().find_map(|key| input.identity(key).map(|value| (*key, value.to_owned())))
}

/// Decides a wave of checked rows, in order. The first row is never deferred, so every wave
/// makes progress.
pub fn decide_wave(
    schema: &WriteSchema<'_>,
    provenance: &Provenance,
    rows: Vec<Checked>,
    facts: &Facts<'_>,
    (now_ms, fresh): (i64, &mut dyn Fresh),
) -> Vec<Outcome> {
    let mut taken_values: HashSet<(&'static str, String)> = HashSet::new();
    let mut taken_records: HashSet<String> = HashSet::new();
    let holders: Vec<RecordState> = facts
        .records
        .values()
        .filter_map(|(_, loaded)| match loaded {
            Loaded::Live { state, .. } => Some(state.clone()),
            _ => None,
        })
        .collect();
    let mut outcomes = Vec::with_capacity(rows.len());
    for Checked { input, topics } in rows {
        let key = key_of(schema, &input);
        let target = match &input.id {
            Some(record_id) => Match::Existing(record_id.clone()),
            None => match_upsert(schema.schema_type, &input, facts.owners, &holders),
        };
        let values: Vec<(&'static str, String)> =
            input.identities.iter().filter_map(|(key, value)| value.clone().map(|value| (*key, value))).collect();
        let record = match &target {
            Match::Existing(record_id) => Some(record_id.clone()),
            Match::New => None,
        };
        let clashes = values.iter().any(|value| taken_values.contains(value))
            || record.as_ref().is_some_and(|record| taken_records.contains(record));
        taken_values.extend(values);
        taken_records.extend(record);
        if clashes {
            outcomes.push(Outcome::Deferred);
            continue;
        }
        let topic_ids = match topics.iter().map(|topic| facts.topics.get(topic).ok_or(topic)).collect() {
            Ok(topic_ids) => topic_ids,
            Err(unknown) => {
                let message = format!("the space has no topic {unknown:?}");
                outcomes.push(Outcome::Failed { key, code: Code::TopicNotFound, message });
                continue;
            }
        };
        outcomes.push(decide_row(schema, provenance, (input, topic_ids), (key, target), facts, (now_ms, fresh)));
    }
    outcomes
}

/// The row's subscriptions the contact does not have yet, as its subscriptions stream's new
/// events; `None` when there are none.
fn subscribe(
    facts: &Facts<'_>,
    provenance: &Provenance,
    (space_id, contact_id): (&str, &str),
    topic_ids: &[&String],
    now_ms: i64,
) -> Option<StreamAppend> {
    let current = facts.subscriptions.get(contact_id);
    let mut wanted: Vec<&String> = topic_ids
        .iter()
        .copied()
        .filter(|topic_id| current.and_then(|topics| topics.get(*topic_id)).is_none_or(|status| status != "subscribed"))
        .collect();
    wanted.sort_unstable();
    wanted.dedup();
    let events: Vec<NewEvent> = wanted
        .into_iter()
        .map(|topic_id| NewEvent {
            event: LogEvent::SubscriptionChanged(proto::SubscriptionChanged {
                space_id: space_id.to_owned(),
                contact_id: contact_id.to_owned(),
                topic_id: topic_id.clone(),
                status: "subscribed".to_owned(),
                source: "import".to_owned(),
                source_id: provenance.import_id.clone(),
                at_ms: now_ms,
            }),
            subject_id: Some(contact_id.to_owned()),
            occurred_at: kernel::time::from_millis(now_ms),
        })
        .collect();
    (!events.is_empty()).then(|| StreamAppend {
        stream_id: crate::email::subscriptions_stream(contact_id),
        expected: ExpectedVersion::Any,
        events,
    })
}

fn decide_row(
    schema: &WriteSchema<'_>,
    provenance: &Provenance,
    (input, topic_ids): (Input, Vec<&String>),
    (key, target): (Key, Match),
    facts: &Facts<'_>,
    (now_ms, fresh): (i64, &mut dyn Fresh),
) -> Outcome {
    let failed = |key: Key, code: Code, message: String| Outcome::Failed { key, code, message };
    let refused = |key: Key, refusal: crate::records::decide::RecordRefusal| Outcome::Failed {
        key,
        code: refusal.code(),
        message: refusal.to_string(),
    };
    match target {
        Match::Existing(record_id) => {
            let loaded = facts.records.get(&record_id).cloned();
            let (version, current, data_key) = match live_target(schema, &record_id, loaded) {
                Ok(target) => target,
                Err(refusal) => return refused(key, refusal),
            };
            let mut warnings = suppressed(facts, current.personal.as_ref().and_then(|p| p.email.as_deref()));
            let subscriptions = subscribe(facts, provenance, (schema.space_id, &record_id), &topic_ids, now_ms);
            let write = match decide_update(schema, &current, input, facts.owners, now_ms) {
                Err(refusal) => return refused(key, refusal),
                Ok(UpdateDecision::Unchanged { warnings: skipped }) => {
                    warnings.extend(skipped);
                    None
                }
                Ok(UpdateDecision::Changed(change)) => {
                    let mut change = *change;
                    warnings.extend(change.warnings.iter().cloned());
                    change.event.import = Some(provenance.proto());
                    change.event.change_source = "import".to_owned();
                    change.event.change_source_id.clone_from(&provenance.import_id);
                    match update_write(schema.space_id, schema.schema_id, (version, data_key), change, fresh) {
                        Ok(write) => Some(write),
                        Err(error) => return failed(key, Code::InternalError, error.to_string()),
                    }
                }
            };
            match Writes::of(write, subscriptions) {
                Some(writes) => Outcome::Updated { record_id, key, warnings, writes },
                None => Outcome::Unchanged { record_id, key, warnings },
            }
        }
        Match::New => {
            let record_id = fresh.id(if schema.schema_type == "contact" { "con" } else { "obj" });
            let email = input.identity("email").map(str::to_owned);
            let mut decision = match decide_create(schema, input, facts.owners, &record_id, now_ms) {
                Ok(decision) => decision,
                Err(refusal) => return refused(key, refusal),
            };
            decision.event.source = "import".to_owned();
            decision.event.source_id.clone_from(&provenance.import_id);
            decision.event.import = Some(provenance.proto());
            let mut warnings = suppressed(facts, email.as_deref());
            warnings.extend(decision.warnings.iter().cloned());
            let subscriptions = subscribe(facts, provenance, (schema.space_id, &record_id), &topic_ids, now_ms);
            match create_write(schema.space_id, schema.schema_id, decision, fresh) {
                Ok(write) => match Writes::of(Some(write), subscriptions) {
                    Some(writes) => Outcome::Created { record_id, key, warnings, writes },
                    None => failed(key, Code::InternalError, "a create writes its record".to_owned()),
                },
                Err(error) => failed(key, Code::InternalError, error.to_string()),
            }
        }
    }
}

fn suppressed(facts: &Facts<'_>, email: Option<&str>) -> Vec<Warning> {
    match email {
        Some(email) if facts.suppressed.contains(email) => vec![Warning {
            code: "recipient_suppressed",
            message: "the address is suppressed: the contact is imported, and no mail goes to it".to_owned(),
        }],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::AttributeEntry;
    use kernel::fresh::Counted;
    use serde_json::json;

    fn attributes() -> Vec<AttributeEntry> {
        vec![
            AttributeEntry {
                key: "newsletter".to_owned(),
                definition: json!({"type": "boolean", "consent": {"channel": "email"}}),
            },
            AttributeEntry { key: "plan".to_owned(), definition: json!({"type": "string"}) },
        ]
    }

    /// What a wave read, owned: nothing held, suppressed or subscribed unless a test says so.
    #[derive(Default)]
    struct Known {
        owners: Owners,
        records: BTreeMap<String, (i64, Loaded)>,
        suppressed: HashSet<String>,
        topics: BTreeMap<String, String>,
        subscriptions: BTreeMap<String, BTreeMap<String, String>>,
    }

    impl Known {
        fn facts(&self) -> Facts<'_> {
            Facts {
                owners: &self.owners,
                records: &self.records,
                suppressed: &self.suppressed,
                topics: &self.topics,
                subscriptions: &self.subscriptions,
            }
        }
    }

    /// New ids and data keys, the same on every run, with no keyring installed.
    fn fresh() -> Counted {
        Counted::new().expect("the test keyring")
    }

    fn schema(attributes: &[AttributeEntry]) -> WriteSchema<'_> {
        WriteSchema { schema_id: "sch_1", space_id: "spc_1", schema_type: "contact", attributes }
    }

    fn provenance(label: Option<&str>) -> Provenance {
        Provenance { import_id: "imp-1".to_owned(), consent_label: label.map(str::to_owned), file_name: None }
    }

    fn row(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    fn code_of(result: Result<Checked, (Key, Code, String)>) -> Option<Code> {
        result.err().map(|(_, code, _)| code)
    }

    #[test]
    fn a_row_without_a_key_fails_with_missing_field() {
        let attributes = attributes();
        let checked = check(&schema(&attributes), &provenance(None), row(json!({"plan": "pro"})));
        assert_eq!(code_of(checked), Some(Code::MissingField));
    }

    #[test]
    fn consent_is_granted_only_under_a_stated_source() {
        let attributes = attributes();
        let granting = json!({"email": "a@example.com", "newsletter": true});
        assert_eq!(
            code_of(check(&schema(&attributes), &provenance(None), row(granting.clone()))),
            Some(Code::ConsentSourceRequired)
        );
        assert!(check(&schema(&attributes), &provenance(Some("signup form")), row(granting)).is_ok());
        // Withdrawing needs no source.
        let withdrawing = json!({"email": "a@example.com", "newsletter": false});
        assert!(check(&schema(&attributes), &provenance(None), row(withdrawing)).is_ok());
    }

    #[test]
    fn a_row_sharing_an_identity_with_an_earlier_row_waits_for_the_next_wave() {
        let attributes = attributes();
        let schema = schema(&attributes);
        let provenance = provenance(None);
        let rows = [
            json!({"email": "a@example.com", "plan": "one"}),
            json!({"email": "b@example.com"}),
            json!({"userId": "u1", "email": "a@example.com", "plan": "two"}),
            json!({"userId": "u1"}),
        ];
        let checked =
            rows.into_iter().map(|value| check(&schema, &provenance, row(value)).expect("the row checks")).collect();
        let known = Known::default();
        let facts = known.facts();
        let outcomes = decide_wave(&schema, &provenance, checked, &facts, (1_000, &mut fresh()));
        let kinds: Vec<&str> = outcomes
            .iter()
            .map(|outcome| match outcome {
                Outcome::Created { .. } => "created",
                Outcome::Deferred => "deferred",
                _ => "other",
            })
            .collect();
        assert_eq!(kinds, ["created", "created", "deferred", "deferred"]);
    }

    #[test]
    fn an_imported_create_names_its_import_and_a_suppressed_address_is_reported() {
        let attributes = attributes();
        let schema = schema(&attributes);
        let provenance = provenance(Some("listmonk export"));
        let checked = check(&schema, &provenance, row(json!({"email": "s@example.com", "newsletter": true})));
        let known = Known { suppressed: HashSet::from(["s@example.com".to_owned()]), ..Known::default() };
        let facts = known.facts();
        let Some(Outcome::Created { warnings, writes, .. }) =
            decide_wave(&schema, &provenance, vec![checked.expect("the row checks")], &facts, (1_000, &mut fresh()))
                .pop()
        else {
            panic!("a new address is created");
        };
        assert_eq!(warnings.iter().map(|warning| warning.code).collect::<Vec<_>>(), ["recipient_suppressed"]);
        let kernel::events::LogEvent::RecordCreated(created) = &writes.streams[0].events[0].event else {
            panic!("a create appends RecordCreated");
        };
        assert_eq!(created.source, "import");
        assert_eq!(created.import.as_ref().map(|import| import.consent_label.as_str()), Some("listmonk export"));
    }

    #[test]
    fn topics_resolve_by_slug_and_an_unknown_one_fails_its_row() {
        let attributes = attributes();
        let schema = schema(&attributes);
        let provenance = provenance(Some("signup form"));
        let rows = [
            json!({"email": "t@example.com", "topics": ["news", "News"]}),
            json!({"email": "u@example.com", "topics": ["nope"]}),
        ];
        let checked =
            rows.into_iter().map(|value| check(&schema, &provenance, row(value)).expect("the row checks")).collect();
        let topics = BTreeMap::from([("news".to_owned(), "top_1".to_owned()), ("News".to_owned(), "top_1".to_owned())]);
        let known = Known { topics, ..Known::default() };
        let facts = known.facts();
        let mut outcomes = decide_wave(&schema, &provenance, checked, &facts, (1_000, &mut fresh())).into_iter();
        let Some(Outcome::Created { writes, .. }) = outcomes.next() else { panic!("the first row is created") };
        // One subscription for the topic named twice, on the contact's subscriptions stream.
        assert_eq!(writes.streams.len(), 2);
        assert_eq!(writes.streams[1].events.len(), 1);
        let Some(Outcome::Failed { code, .. }) = outcomes.next() else { panic!("the second row fails") };
        assert_eq!(code, Code::TopicNotFound);
    }
}
