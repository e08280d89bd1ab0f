//! Record decisions: strict create, upsert (match, then create or update) and update. Input is
//! validated against the schema, defaults apply on create, identity collisions follow the
//! contract's rules 1 and 4. Pure: every fact comes in as an argument.

use kernel::error::Code;
use std::collections::BTreeMap;

use crate::catalog::AttributeEntry;
use crate::records::{Loaded, RecordState};
use kernel::crypto::DataKey;
use kernel::error::Issue;
use kernel::error::Warning;
use kernel::events::seal;
use kernel::proto;
use serde_json::{Map, Value};

use crate::attributes::{default_value, has_auto_fill, is_required, is_writable, writable_record_value};

/// Why a record write is refused. The HTTP edge maps each to the contract's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordRefusal {
    /// The input does not fit the schema; `issues` names every problem (400).
    #[error("{message}")]
    Invalid { code: Code, message: String, issues: Vec<Issue> },
    /// A writable AI auto-fill attribute needs credits the space does not have (402).
    #[error("the space has no AI credits left; add credits before writing to a schema with AI auto-fill")]
    InsufficientCredits,
    /// No record with this id in the schema, or it is deleted (404).
    #[error("no record {0:?} in this schema")]
    NotFound(String),
    /// The record's deletion has started: it accepts no more work (409).
    #[error("record {record_id:?} is being deleted (operation {operation_id}); it accepts no more work")]
    DeletionPending { record_id: String, operation_id: String },
}

impl RecordRefusal {
    pub fn invalid(code: Code, message: String, issues: Vec<Issue>) -> Self {
        Self::Invalid { code, message, issues }
    }
}

/// A refused record write as the contract answers it.
impl kernel::refusal::Refusal for RecordRefusal {
    /// The contract's code of the refusal.
    fn code(&self) -> Code {
        match self {
            Self::Invalid { code, .. } => *code,
            Self::InsufficientCredits => Code::InsufficientCredits,
            Self::NotFound(_) => Code::RecordNotFound,
            Self::DeletionPending { .. } => Code::RecordDeletionPending,
        }
    }

    fn issues(&self) -> Vec<Issue> {
        match self {
            Self::Invalid { issues, .. } => issues.clone(),
            _ => Vec::new(),
        }
    }
}

/// What the decision needs to know of the schema.
#[derive(Debug, Clone)]
pub struct WriteSchema<'a> {
    pub schema_id: &'a str,
    pub space_id: &'a str,
    pub schema_type: &'a str,
    pub attributes: &'a [AttributeEntry],
}

/// An identity the record claims, unique within its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The wire key: `userId`, `email`, `phone` or `externalId`.
    pub key: &'static str,
    pub value: String,
}

/// Who holds each identity value already: `(key, value) -> record id`.
pub type Owners = BTreeMap<(String, String), String>;

/// Validated input: identity fields (`None` for an explicit null) and custom values (an
/// explicit null kept as `Value::Null`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Input {
    pub identities: Vec<(&'static str, Option<String>)>,
    pub values: Map<String, Value>,
    /// The body's `id`, used by upsert to select a record.
    pub id: Option<String>,
}

impl Input {
    pub fn identity(&self, key: &str) -> Option<&str> {
        self.identities.iter().find(|(k, _)| *k == key).and_then(|(_, value)| value.as_deref())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct CreateDecision {
    pub event: proto::RecordCreated,
    pub identities: Vec<Identity>,
    pub warnings: Vec<Warning>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum UpdateDecision {
    /// Nothing changes: answer with the current record, and the warnings of what was skipped
    /// (an identity held by another record), and append nothing.
    Unchanged {
        warnings: Vec<Warning>,
    },
    Changed(Box<Change>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub event: proto::RecordUpdated,
    pub state: RecordState,
    /// Identities to claim and to release.
    pub claims: Vec<Identity>,
    pub releases: Vec<Identity>,
    pub warnings: Vec<Warning>,
}

/// The upsert's target, per rule 3.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Match {
    Existing(String),
    New,
}

/// Platform fields that callers cannot set.
const READ_ONLY_PLATFORM_FIELDS: &[&str] = &["createdAt", "updatedAt"];

pub fn identity_keys(schema_type: &str) -> &'static [&'static str] {
    match schema_type {
        "contact" => &["userId", "email", "phone"],
        _ => &["externalId"],
    }
}

/// Refused when the schema has a writable AI auto-fill attribute and the space has no
/// credits (rule 2: checked first on create and upsert).
pub fn check_credits(schema: &WriteSchema<'_>, credits: i64) -> Result<(), RecordRefusal> {
    let auto_filled = schema.attributes.iter().any(|a| is_writable(&a.definition) && has_auto_fill(&a.definition));
    if auto_filled && credits <= 0 { Err(RecordRefusal::InsufficientCredits) } else { Ok(()) }
}

/// The record a write addresses, if it is a live record of `schema`: its stream version,
/// state and data key. `loaded` is what the store found for `record_id`.
pub fn live_target(
    schema: &WriteSchema<'_>,
    record_id: &str,
    loaded: Option<(i64, Loaded)>,
) -> Result<(i64, RecordState, Option<DataKey>), RecordRefusal> {
    match loaded.filter(|(_, loaded)| loaded.scope() == (schema.space_id, schema.schema_id)) {
        Some((version, Loaded::Live { state, key })) => Ok((version, state, key)),
        Some((_, Loaded::Deleting { operation_id, .. })) => {
            Err(RecordRefusal::DeletionPending { record_id: record_id.to_owned(), operation_id })
        }
        Some((_, Loaded::Deleted { .. })) | None => Err(RecordRefusal::NotFound(record_id.to_owned())),
    }
}

/// The record state a write addresses, shown as the wire echoes it (`createdAt`), to
/// compare an echoed body against.
pub fn shown_platform_fields(current: &RecordState) -> Value {
    serde_json::json!({"createdAt": kernel::time::format_millis(current.created_at_ms)})
}

/// The most issues a refused input lists.
pub const MAX_ISSUES: usize = 100;

/// Validates a flat record input against the schema. `source` is ignored, `id` kept aside.
pub fn parse_input(schema: &WriteSchema<'_>, input: Map<String, Value>) -> Result<Input, RecordRefusal> {
    let mut issues = Vec::new();
    let mut parsed = Input::default();
    for (key, value) in input {
        // A refusal names the first problems, not every one of a body of thousands.
        if issues.len() >= MAX_ISSUES {
            break;
        }
        match key.as_str() {
            "source" => continue,
            "id" => {
                parsed.id = value.as_str().map(str::to_owned);
                continue;
            }
            _ => {}
        }
        if READ_ONLY_PLATFORM_FIELDS.contains(&key.as_str()) {
            issues.push(Issue::coded(&key, Code::AttributeNotWritable, format!("{key} is set by the platform")));
            continue;
        }
        if let Some(identity_key) = identity_keys(schema.schema_type).iter().find(|k| **k == key) {
            match normalize_identity(identity_key, value) {
                Ok(normalized) => parsed.identities.push((identity_key, normalized)),
                Err(message) => issues.push(Issue::coded(&key, Code::InvalidAttributeValue, message)),
            }
            continue;
        }
        match writable_record_value(schema.attributes, &key, value) {
            Ok(normalized) => {
                parsed.values.insert(key, normalized);
            }
            Err(issue) => issues.push(issue),
        }
    }
    match issues.first() {
        None => Ok(parsed),
        Some(first) => {
            let (code, message) = (first.code.unwrap_or(Code::InvalidAttributeValue), first.message.clone());
            Err(RecordRefusal::invalid(code, message, issues))
        }
    }
}

/// Refuses an update that echoes platform fields with other values than the record's
/// (`changed`: each such key and the value given): a record's creation time is set by the
/// platform.
pub fn check_echoed(changed: &[(&str, &Value)]) -> Result<(), RecordRefusal> {
    let issues: Vec<Issue> = changed
        .iter()
        .map(|(key, value)| {
            Issue::coded(
                *key,
                Code::AttributeNotWritable,
                format!("{key} is set by the platform ({value}); it cannot change"),
            )
        })
        .collect();
    match issues.first() {
        None => Ok(()),
        Some(first) => Err(RecordRefusal::invalid(Code::AttributeNotWritable, first.message.clone(), issues)),
    }
}

fn collision_warning(identity_key: &str) -> Warning {
    Warning {
        code: "identifier_skipped",
        message: format!("{identity_key} belongs to another record of this schema; the field was left unchanged"),
    }
}

/// Decides a create. An identity that `owners` shows held by another record is skipped and
/// reported in a warning (rule 4, for an upsert that creates). A strict create passes no
/// owners: its identity guards in the append turn a collision into 409 `identifier_conflict`.
pub fn decide_create(
    schema: &WriteSchema<'_>,
    input: Input,
    owners: &Owners,
    record_id: &str,
    now_ms: i64,
) -> Result<CreateDecision, RecordRefusal> {
    let mut personal = proto::RecordPersonal::default();
    let mut identities = Vec::new();
    let mut warnings = Vec::new();
    for (key, value) in input.identities {
        let Some(value) = value else { continue };
        if owners.contains_key(&(key.to_owned(), value.clone())) {
            warnings.push(collision_warning(key));
            continue;
        }
        set_identity(&mut personal, key, Some(value.clone()));
        identities.push(Identity { key, value });
    }
    let mut values = input.values;
    let mut missing = Vec::new();
    for attribute in schema.attributes.iter().filter(|a| is_writable(&a.definition)) {
        if values.get(&attribute.key).is_some_and(|value| !value.is_null()) {
            continue;
        }
        if let Some(default) = default_value(&attribute.definition) {
            values.insert(attribute.key.clone(), default.clone());
        } else if is_required(&attribute.definition) && !has_auto_fill(&attribute.definition) {
            missing.push(Issue::coded(
                &attribute.key,
                Code::RequiredAttributeMissing,
                format!("{} is required", attribute.key),
            ));
        } else {
            values.insert(attribute.key.clone(), Value::Null);
        }
    }
    if !missing.is_empty() {
        let keys: Vec<&str> = missing.iter().filter_map(|issue| issue.key.as_deref()).collect();
        let message = format!("required attributes are missing: {}", keys.join(", "));
        return Err(RecordRefusal::invalid(Code::RequiredAttributeMissing, message, missing));
    }
    personal.values_json = Value::Object(values).to_string();
    let event = proto::RecordCreated {
        record_id: record_id.to_owned(),
        space_id: schema.space_id.to_owned(),
        schema_id: schema.schema_id.to_owned(),
        source: "api".to_owned(),
        created_at_ms: now_ms,
        personal: Some(seal(record_id, &personal)),
        schema_type: schema.schema_type.to_owned(),
        import: None,
        source_id: String::new(),
    };
    Ok(CreateDecision { event, identities, warnings })
}

/// Finds the record an upsert addresses (rule 3), given who holds each identity value and
/// the states of those holders. The body's explicit `id` is handled by the caller.
pub fn match_upsert(schema_type: &str, input: &Input, owners: &Owners, holders: &[RecordState]) -> Match {
    let holder = |key: &str| {
        let value = input.identity(key)?;
        let record_id = owners.get(&(key.to_owned(), value.to_owned()))?;
        holders.iter().find(|state| &state.record_id == record_id)
    };
    if schema_type != "contact" {
        return holder("externalId").map_or(Match::New, |state| Match::Existing(state.record_id.clone()));
    }
    let has = |state: &RecordState, key: &str| {
        state.personal.as_ref().is_some_and(|p| match key {
            "userId" => p.user_id.is_some(),
            "email" => p.email.is_some(),
            _ => false,
        })
    };
    if let Some(state) = holder("userId") {
        return Match::Existing(state.record_id.clone());
    }
    if let Some(state) = holder("email").filter(|state| !has(state, "userId")) {
        return Match::Existing(state.record_id.clone());
    }
    if let Some(state) = holder("phone").filter(|state| !has(state, "userId") && !has(state, "email")) {
        return Match::Existing(state.record_id.clone());
    }
    Match::New
}

/// Decides an update of `current`: given fields replace, omitted fields are kept, an
/// explicit null clears a nullable field, and an identity held by another record is skipped
/// with a warning (rule 4).
pub fn decide_update(
    schema: &WriteSchema<'_>,
    current: &RecordState,
    input: Input,
    owners: &Owners,
    now_ms: i64,
) -> Result<UpdateDecision, RecordRefusal> {
    let mut personal = current.personal.clone().unwrap_or_default();
    let mut values = current.values();
    let mut changed = Vec::new();
    let mut claims = Vec::new();
    let mut releases = Vec::new();
    let mut warnings = Vec::new();
    for (key, value) in input.identities {
        let existing = get_identity(&personal, key);
        if existing == value {
            continue;
        }
        if let Some(value) = &value
            && owners.get(&(key.to_owned(), value.clone())).is_some_and(|owner| owner != &current.record_id)
        {
            warnings.push(collision_warning(key));
            continue;
        }
        if let Some(old) = existing {
            releases.push(Identity { key, value: old });
        }
        if let Some(value) = &value {
            claims.push(Identity { key, value: value.clone() });
        }
        set_identity(&mut personal, key, value);
        changed.push(key.to_owned());
    }
    let mut issues = Vec::new();
    for (key, value) in input.values {
        if value.is_null()
            && let Some(attribute) = schema.attributes.iter().find(|a| a.key == key)
            && is_required(&attribute.definition)
        {
            issues.push(Issue::coded(
                &key,
                Code::RequiredAttributeMissing,
                format!("{key} is required and cannot be cleared"),
            ));
            continue;
        }
        if values.get(&key) != Some(&value) {
            values.insert(key.clone(), value);
            changed.push(key);
        }
    }
    if let Some(first) = issues.first() {
        let message = first.message.clone();
        return Err(RecordRefusal::invalid(Code::RequiredAttributeMissing, message, issues));
    }
    if changed.is_empty() {
        return Ok(UpdateDecision::Unchanged { warnings });
    }
    personal.values_json = Value::Object(values).to_string();
    let state = current.after_update(personal.clone(), now_ms);
    let event = state.updated_event(seal(&state.record_id, &personal), changed, 0);
    Ok(UpdateDecision::Changed(Box::new(Change { event, state, claims, releases, warnings })))
}

fn normalize_identity(key: &str, value: Value) -> Result<Option<String>, String> {
    match value {
        Value::Null => Ok(None),
        Value::String(text) => {
            let normalized = match key {
                "email" => crate::attributes::normalize_email(&text)?,
                "phone" => crate::attributes::normalize_phone(&text)?,
                _ => text.trim().to_owned(),
            };
            if normalized.is_empty() {
                return Err(format!("{key} must not be empty"));
            }
            if normalized.len() > 512 {
                return Err(format!("{key} must be at most 512 characters"));
            }
            Ok(Some(normalized))
        }
        _ => Err(format!("{key} must be a string or null")),
    }
}

fn get_identity(personal: &proto::RecordPersonal, key: &str) -> Option<String> {
    match key {
        "userId" => personal.user_id.clone(),
        "email" => personal.email.clone(),
        "phone" => personal.phone.clone(),
        _ => personal.external_id.clone(),
    }
}

fn set_identity(personal: &mut proto::RecordPersonal, key: &str, value: Option<String>) {
    match key {
        "userId" => personal.user_id = value,
        "email" => personal.email = value,
        "phone" => personal.phone = value,
        _ => personal.external_id = value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel::refusal::Refusal as _;
    use serde_json::json;

    fn attribute(key: &str, definition: Value) -> AttributeEntry {
        AttributeEntry { key: key.to_owned(), definition }
    }

    fn contact_schema(attributes: &[AttributeEntry]) -> WriteSchema<'_> {
        WriteSchema { schema_id: "sch_1", space_id: "spc_1", schema_type: "contact", attributes }
    }

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().cloned().expect("test input is an object")
    }

    fn create(schema: &WriteSchema<'_>, input: Value) -> Result<CreateDecision, RecordRefusal> {
        decide_create(schema, parse_input(schema, object(input))?, &Owners::new(), "con_1", 1000)
    }

    fn values_of(decision: &CreateDecision) -> Value {
        let personal: proto::RecordPersonal =
            kernel::events::open(decision.event.personal.as_ref(), &Default::default())
                .expect("opens")
                .expect("present");
        serde_json::from_str(&personal.values_json).expect("json")
    }

    fn contact(record_id: &str, user_id: Option<&str>, email: Option<&str>, phone: Option<&str>) -> RecordState {
        RecordState {
            record_id: record_id.into(),
            space_id: "spc_1".into(),
            schema_id: "sch_1".into(),
            schema_type: "contact".into(),
            source: "api".into(),
            created_at_ms: 1,
            updated_at_ms: 1,
            personal: Some(proto::RecordPersonal {
                user_id: user_id.map(str::to_owned),
                email: email.map(str::to_owned),
                phone: phone.map(str::to_owned),
                external_id: None,
                values_json: json!({"plan": "free", "nickname": "n"}).to_string(),
            }),
        }
    }

    fn owners(pairs: &[(&str, &str, &str)]) -> Owners {
        pairs.iter().map(|(k, v, id)| (((*k).to_owned(), (*v).to_owned()), (*id).to_owned())).collect()
    }

    #[test]
    fn given_valid_input_when_creating_then_source_is_api_and_identities_are_claimed() {
        let attributes = [attribute("plan", json!({"type": "string"}))];
        let decision = create(
            &contact_schema(&attributes),
            json!({"email": "Ada@Example.com", "plan": "pro", "source": "import", "id": "con_x"}),
        )
        .expect("valid");
        assert_eq!(decision.event.source, "api");
        assert_eq!(decision.event.record_id, "con_1");
        assert_eq!(decision.identities, vec![Identity { key: "email", value: "ada@example.com".into() }]);
        assert_eq!(values_of(&decision), json!({"plan": "pro"}));
    }

    #[test]
    fn given_a_default_when_the_value_is_missing_then_the_default_applies() {
        let attributes = [attribute("plan", json!({"type": "string", "required": true, "default": "free"}))];
        let decision = create(&contact_schema(&attributes), json!({})).expect("valid");
        assert_eq!(values_of(&decision), json!({"plan": "free"}));
    }

    #[test]
    fn given_a_required_attribute_without_value_or_default_then_400_names_the_key() {
        let attributes = [attribute("plan", json!({"type": "string", "required": true}))];
        let error = create(&contact_schema(&attributes), json!({"plan": null})).expect_err("missing");
        let RecordRefusal::Invalid { code, issues, .. } = error else { panic!("invalid input") };
        assert_eq!(code, Code::RequiredAttributeMissing);
        assert_eq!(issues[0].key.as_deref(), Some("plan"));
    }

    #[test]
    fn given_evaluated_or_aggregate_keys_then_they_are_rejected() {
        let attributes = [
            attribute("score", json!({"type": "evaluated"})),
            attribute("total", json!({"type": "number", "valueSource": {"type": "aggregate"}})),
        ];
        let schema = contact_schema(&attributes);
        assert_eq!(create(&schema, json!({"score": 1})).expect_err("evaluated").code(), Code::AttributeNotWritable);
        assert_eq!(create(&schema, json!({"total": 1})).expect_err("aggregate").code(), Code::AttributeNotWritable);
    }

    #[test]
    fn given_auto_fill_without_credits_then_402() {
        let attributes = [attribute("summary", json!({"type": "string", "autoFill": {"enabled": true}}))];
        let error = check_credits(&contact_schema(&attributes), 0).expect_err("no credits");
        assert_eq!(error, RecordRefusal::InsufficientCredits);
        assert!(check_credits(&contact_schema(&attributes), 5).is_ok());
        assert!(check_credits(&contact_schema(&[]), 0).is_ok());
    }

    #[test]
    fn given_unknown_keys_or_bad_values_then_issues_name_them() {
        let attributes = [attribute("age", json!({"type": "integer"}))];
        let error = create(&contact_schema(&attributes), json!({"age": "x", "nope": 1})).expect_err("invalid");
        let RecordRefusal::Invalid { issues, .. } = error else { panic!("invalid input") };
        assert_eq!(issues.len(), 2);
        let error = create(&contact_schema(&attributes), json!({"createdAt": "x"})).expect_err("read only");
        assert_eq!(error.code(), Code::AttributeNotWritable);
    }

    #[test]
    fn a_create_skips_identities_held_by_another_record_and_warns() {
        let schema = contact_schema(&[]);
        let taken = owners(&[("email", "a@b.io", "con_other")]);
        let input = || parse_input(&schema, object(json!({"email": "a@b.io", "phone": "+1 555 0100"}))).expect("valid");
        let decision = decide_create(&schema, input(), &taken, "con_1", 0).expect("skips");
        assert_eq!(decision.identities, vec![Identity { key: "phone", value: "+1 555 0100".into() }]);
        assert_eq!(decision.warnings[0].code, "identifier_skipped");
    }

    #[test]
    fn objects_claim_external_id() {
        let schema = WriteSchema { schema_id: "sch_2", space_id: "spc_1", schema_type: "object", attributes: &[] };
        let decision = decide_create(
            &schema,
            parse_input(&schema, object(json!({"externalId": "A-1"}))).expect("valid"),
            &Owners::new(),
            "obj_1",
            0,
        )
        .expect("valid");
        assert_eq!(decision.identities, vec![Identity { key: "externalId", value: "A-1".into() }]);
        assert_eq!(
            parse_input(&schema, object(json!({"email": "a@b.co"}))).expect_err("x").code(),
            Code::UnknownAttribute
        );
    }

    #[test]
    fn upsert_matches_user_id_first_then_email_without_user_id_then_phone_alone() {
        let schema = contact_schema(&[]);
        let parse = |input: Value| parse_input(&schema, object(input)).expect("valid");
        let holders = [
            contact("con_u", Some("u1"), Some("u@x.io"), None),
            contact("con_e", None, Some("e@x.io"), Some("+1 555 0101")),
            contact("con_p", None, None, Some("+1 555 0102")),
        ];
        let known = owners(&[
            ("userId", "u1", "con_u"),
            ("email", "u@x.io", "con_u"),
            ("email", "e@x.io", "con_e"),
            ("phone", "+1 555 0101", "con_e"),
            ("phone", "+1 555 0102", "con_p"),
        ]);
        let matched = |input: Value| match_upsert("contact", &parse(input), &known, &holders);
        assert_eq!(matched(json!({"userId": "u1", "email": "e@x.io"})), Match::Existing("con_u".into()));
        // email matches only a contact without userId.
        assert_eq!(matched(json!({"email": "u@x.io"})), Match::New);
        assert_eq!(matched(json!({"email": "e@x.io"})), Match::Existing("con_e".into()));
        assert_eq!(matched(json!({"userId": "new", "email": "e@x.io"})), Match::Existing("con_e".into()));
        // phone matches only a contact with neither userId nor email.
        assert_eq!(matched(json!({"phone": "+1 555 0101"})), Match::New);
        assert_eq!(matched(json!({"phone": "+1 555 0102"})), Match::Existing("con_p".into()));
        assert_eq!(matched(json!({"email": "nobody@x.io"})), Match::New);
    }

    #[test]
    fn update_keeps_omitted_fields_clears_explicit_nulls_and_skips_collisions() {
        let attributes = [
            attribute("plan", json!({"type": "string", "required": true})),
            attribute("nickname", json!({"type": "string"})),
        ];
        let schema = contact_schema(&attributes);
        let current = contact("con_1", None, Some("a@x.io"), None);
        let taken = owners(&[("phone", "+1 555 0199", "con_other")]);
        let input = parse_input(&schema, object(json!({"nickname": null, "phone": "+1 555 0199", "userId": "u9"})))
            .expect("valid");
        let UpdateDecision::Changed(change) = decide_update(&schema, &current, input, &taken, 5).expect("valid") else {
            panic!("expected a change");
        };
        let Change { state, claims, releases, warnings, event } = *change;
        assert_eq!(state.values(), object(json!({"plan": "free", "nickname": null})));
        let personal = state.personal.expect("personal");
        assert_eq!(
            (personal.email.as_deref(), personal.user_id.as_deref(), personal.phone),
            (Some("a@x.io"), Some("u9"), None)
        );
        assert_eq!(claims, vec![Identity { key: "userId", value: "u9".into() }]);
        assert!(releases.is_empty());
        assert_eq!(warnings[0].code, "identifier_skipped");
        assert_eq!(event.changed_keys, vec!["userId".to_owned(), "nickname".to_owned()]);

        let cleared = parse_input(&schema, object(json!({"email": null}))).expect("valid");
        let UpdateDecision::Changed(change) =
            decide_update(&schema, &current, cleared, &Owners::new(), 5).expect("valid")
        else {
            panic!("expected a change");
        };
        assert_eq!(change.releases, vec![Identity { key: "email", value: "a@x.io".into() }]);

        let required = parse_input(&schema, object(json!({"plan": null}))).expect("valid");
        let error = decide_update(&schema, &current, required, &Owners::new(), 5).expect_err("required");
        assert_eq!(error.code(), Code::RequiredAttributeMissing);

        let same = parse_input(&schema, object(json!({"email": "A@x.io", "plan": "free"}))).expect("valid");
        assert_eq!(
            decide_update(&schema, &current, same, &Owners::new(), 5).expect("valid"),
            UpdateDecision::Unchanged { warnings: Vec::new() }
        );
    }
}
