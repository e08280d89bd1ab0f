//! Deciding a strict record create: validate the flat input against the schema, apply
//! defaults, and produce the `RecordCreated` event with the identities it claims.

use serde_json::{Map, Value};
use shared::catalog::AttributeEntry;
use shared::error::{ApiError, Issue};
use shared::events::seal;
use shared::proto;

use super::attributes::{default_value, has_auto_fill, is_required, is_writable, normalize_value};

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

#[derive(Debug, Clone, PartialEq)]
pub struct CreateDecision {
    pub event: proto::RecordCreated,
    pub identities: Vec<Identity>,
}

/// Platform fields that callers cannot set.
const READ_ONLY_PLATFORM_FIELDS: &[&str] = &["createdAt", "updatedAt"];
/// Fields the contract says are ignored on input.
const IGNORED_FIELDS: &[&str] = &["id", "source"];

fn identity_keys(schema_type: &str) -> &'static [&'static str] {
    match schema_type {
        "contact" => &["userId", "email", "phone"],
        _ => &["externalId"],
    }
}

/// Decides a strict create. `credits` is the space's AI credit balance.
pub fn decide_create(
    schema: &WriteSchema<'_>,
    credits: i64,
    input: Map<String, Value>,
    record_id: &str,
    now_ms: i64,
) -> Result<CreateDecision, ApiError> {
    let auto_filled = schema.attributes.iter().any(|a| is_writable(&a.definition) && has_auto_fill(&a.definition));
    if auto_filled && credits <= 0 {
        return Err(ApiError::insufficient_credits());
    }
    let mut issues = Vec::new();
    let mut personal = proto::RecordPersonal::default();
    let mut identities = Vec::new();
    let mut values = Map::new();
    for (key, value) in input {
        if IGNORED_FIELDS.contains(&key.as_str()) {
            continue;
        }
        if READ_ONLY_PLATFORM_FIELDS.contains(&key.as_str()) {
            issues.push(Issue::coded(&key, "attribute_not_writable", format!("{key} is set by the platform")));
            continue;
        }
        if let Some(identity_key) = identity_keys(schema.schema_type).iter().find(|k| **k == key) {
            match normalize_identity(identity_key, value) {
                Ok(None) => {}
                Ok(Some(normalized)) => {
                    set_identity(&mut personal, identity_key, normalized.clone());
                    identities.push(Identity { key: identity_key, value: normalized });
                }
                Err(message) => issues.push(Issue::coded(&key, "invalid_attribute_value", message)),
            }
            continue;
        }
        let Some(attribute) = schema.attributes.iter().find(|a| a.key == key) else {
            issues.push(Issue::coded(&key, "unknown_attribute", format!("{key} is not an attribute of this schema")));
            continue;
        };
        if !is_writable(&attribute.definition) {
            issues.push(Issue::coded(
                &key,
                "attribute_not_writable",
                format!("{key} is evaluated or aggregated by the platform and cannot be written"),
            ));
            continue;
        }
        match normalize_value(&attribute.definition, value) {
            Ok(normalized) => {
                values.insert(key, normalized);
            }
            Err(message) => issues.push(Issue::coded(&key, "invalid_attribute_value", format!("{key} {message}"))),
        }
    }
    let mut missing = Vec::new();
    for attribute in schema.attributes.iter().filter(|a| is_writable(&a.definition)) {
        let present = values.get(&attribute.key).is_some_and(|value| !value.is_null());
        if present {
            continue;
        }
        if let Some(default) = default_value(&attribute.definition) {
            values.insert(attribute.key.clone(), default.clone());
        } else if is_required(&attribute.definition) && !has_auto_fill(&attribute.definition) {
            missing.push(Issue::coded(
                &attribute.key,
                "required_attribute_missing",
                format!("{} is required", attribute.key),
            ));
        } else {
            values.entry(attribute.key.clone()).or_insert(Value::Null);
        }
    }
    if let Some(first) = issues.first() {
        let code = first.code.unwrap_or("invalid_record_input");
        let message = first.message.clone();
        issues.extend(missing);
        return Err(ApiError::bad_request(code, message).with_issues(issues));
    }
    if !missing.is_empty() {
        let keys: Vec<&str> = missing.iter().filter_map(|issue| issue.key.as_deref()).collect();
        let message = format!("required attributes are missing: {}", keys.join(", "));
        return Err(ApiError::bad_request("required_attribute_missing", message).with_issues(missing));
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
    };
    Ok(CreateDecision { event, identities })
}

fn normalize_identity(key: &str, value: Value) -> Result<Option<String>, String> {
    match value {
        Value::Null => Ok(None),
        Value::String(text) => {
            let normalized = match key {
                "email" => super::attributes::normalize_email(&text)?,
                "phone" => super::attributes::normalize_phone(&text)?,
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

fn set_identity(personal: &mut proto::RecordPersonal, key: &str, value: String) {
    match key {
        "userId" => personal.user_id = Some(value),
        "email" => personal.email = Some(value),
        "phone" => personal.phone = Some(value),
        _ => personal.external_id = Some(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

    fn values_of(decision: &CreateDecision) -> Value {
        let personal: proto::RecordPersonal =
            shared::events::open(decision.event.personal.as_ref()).expect("opens").expect("present");
        serde_json::from_str(&personal.values_json).expect("json")
    }

    #[test]
    fn given_valid_input_when_creating_then_source_is_api_and_identities_are_claimed() {
        let attributes = [attribute("plan", json!({"type": "string"}))];
        let decision = decide_create(
            &contact_schema(&attributes),
            0,
            object(json!({"email": "Ada@Example.com", "plan": "pro", "source": "import", "id": "con_x"})),
            "con_1",
            1000,
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
        let decision = decide_create(&contact_schema(&attributes), 0, object(json!({})), "con_1", 0).expect("valid");
        assert_eq!(values_of(&decision), json!({"plan": "free"}));
    }

    #[test]
    fn given_a_required_attribute_without_value_or_default_then_400_names_the_key() {
        let attributes = [attribute("plan", json!({"type": "string", "required": true}))];
        let error = decide_create(&contact_schema(&attributes), 0, object(json!({"plan": null})), "con_1", 0)
            .expect_err("missing");
        assert_eq!(error.code(), Some("required_attribute_missing"));
        assert_eq!(error.body()["error"]["issues"][0]["key"], "plan");
    }

    #[test]
    fn given_evaluated_or_aggregate_keys_then_they_are_rejected() {
        let attributes = [
            attribute("score", json!({"type": "evaluated"})),
            attribute("total", json!({"type": "number", "valueSource": {"type": "aggregate"}})),
        ];
        let error = decide_create(&contact_schema(&attributes), 0, object(json!({"score": 1})), "con_1", 0)
            .expect_err("evaluated");
        assert_eq!(error.code(), Some("attribute_not_writable"));
        let error = decide_create(&contact_schema(&attributes), 0, object(json!({"total": 1})), "con_1", 0)
            .expect_err("aggregate");
        assert_eq!(error.code(), Some("attribute_not_writable"));
    }

    #[test]
    fn given_auto_fill_without_credits_then_402_before_validation() {
        let attributes = [attribute("summary", json!({"type": "string", "autoFill": {"enabled": true}}))];
        let error = decide_create(&contact_schema(&attributes), 0, object(json!({"nope": 1})), "con_1", 0)
            .expect_err("no credits");
        assert_eq!(error.code(), Some("insufficient_credits"));
        assert_eq!(error.status().as_u16(), 402);
        assert!(decide_create(&contact_schema(&attributes), 5, object(json!({})), "con_1", 0).is_ok());
    }

    #[test]
    fn given_unknown_keys_or_bad_values_then_issues_name_them() {
        let attributes = [attribute("age", json!({"type": "integer"}))];
        let error = decide_create(&contact_schema(&attributes), 0, object(json!({"age": "x", "nope": 1})), "con_1", 0)
            .expect_err("invalid");
        assert_eq!(error.status().as_u16(), 400);
        let issues = error.body()["error"]["issues"].clone();
        assert_eq!(issues.as_array().map(Vec::len), Some(2));
        let error = decide_create(&contact_schema(&attributes), 0, object(json!({"createdAt": "x"})), "con_1", 0)
            .expect_err("read only");
        assert_eq!(error.code(), Some("attribute_not_writable"));
    }

    #[test]
    fn objects_claim_external_id() {
        let schema = WriteSchema { schema_id: "sch_2", space_id: "spc_1", schema_type: "object", attributes: &[] };
        let decision = decide_create(&schema, 0, object(json!({"externalId": "A-1"})), "obj_1", 0).expect("valid");
        assert_eq!(decision.identities, vec![Identity { key: "externalId", value: "A-1".into() }]);
        let error = decide_create(&schema, 0, object(json!({"email": "a@b.co"})), "obj_1", 0).expect_err("no email");
        assert_eq!(error.code(), Some("unknown_attribute"));
    }
}
