//! The pure parts of a send: what the body may hold, the context it must give, and who may
//! receive marketing mail.

use std::collections::BTreeMap;

use domain::email::resources::TemplateDef;
use mail::send::Gate;
use platform::error::{ApiError, Code, Issue};
use serde_json::{Map, Value};

/// Fields a caller might try in order to replace stored content; refused with 400.
const CONTENT_FIELDS: &[&str] = &["subject", "html", "text", "body", "content", "from", "sender", "to", "replyTo"];

/// The context of a send body `{data: {<key>: {...}}}`: each key's record input.
pub fn context(body: &Map<String, Value>) -> Result<BTreeMap<String, Map<String, Value>>, ApiError> {
    if let Some(field) = body.keys().find(|key| CONTENT_FIELDS.contains(&key.as_str())) {
        return Err(ApiError::bad_request(
            Code::TemplateContentNotAccepted,
            format!("{field:?} cannot be given: the stored template's content is sent as authored"),
        ));
    }
    if let Some(field) = body.keys().find(|key| *key != "data") {
        return Err(ApiError::bad_request(
            Code::UnknownField,
            format!("unknown field {field:?}; the body is {{data: {{...}}}}"),
        ));
    }
    let Some(Value::Object(data)) = body.get("data") else {
        return Err(invalid("data", "data must be an object of context records, one per key the template expects"));
    };
    data.iter()
        .map(|(key, value)| match value {
            Value::Object(record) => Ok((key.clone(), record.clone())),
            _ => Err(invalid(&format!("data.{key}"), "each context value is an object of the record's fields")),
        })
        .collect()
}

fn invalid(field: &str, message: &str) -> ApiError {
    ApiError::bad_request(Code::InvalidTemplateData, message.to_owned())
        .with_issues(vec![Issue::for_key(field, message)])
}

/// Every key the template expects is given, and nothing else.
pub(crate) fn check_keys(
    template: &TemplateDef,
    context: &BTreeMap<String, Map<String, Value>>,
) -> Result<(), ApiError> {
    let mut issues = Vec::new();
    for key in context.keys().filter(|key| !template.data.contains_key(*key)) {
        let expected: Vec<&str> = template.data.keys().map(String::as_str).collect();
        issues.push(Issue::for_key(
            format!("data.{key}"),
            format!("the template does not expect {key:?}; it expects {}", expected.join(", ")),
        ));
    }
    for (key, expected) in template.data.iter().filter(|(key, _)| !context.contains_key(*key)) {
        issues.push(Issue::for_key(
            format!("data.{key}"),
            format!("the template expects a {} record under {key:?}", expected.schema_slug),
        ));
    }
    if issues.is_empty() {
        return Ok(());
    }
    Err(ApiError::bad_request(Code::InvalidTemplateData, "the context does not match what the template expects")
        .with_issues(issues))
}

/// A send the decision refused, answered as a template send refuses (D9, D11): a contact
/// without an address is a 400 `recipient_missing`, every other gate 422 with its code; nothing
/// was sent.
pub fn refusal(gate: Gate) -> ApiError {
    let message = format!("{}; nothing was sent", gate.reason());
    match gate {
        Gate::NoAddress => ApiError::bad_request(gate.code(), message),
        gate => ApiError::unprocessable(gate.code(), message),
    }
}

/// The keys of a contact schema's email consent attributes.
pub fn consent_keys(attributes: &[domain::catalog::AttributeEntry]) -> Vec<String> {
    attributes
        .iter()
        .filter(|attribute| mail::send::is_email_consent(&attribute.definition))
        .map(|attribute| attribute.key.clone())
        .collect()
}

/// The Liquid context: each key's record document, with every attribute of its schema
/// present (null when unset) so a template may name any of them.
pub(crate) fn render_context(documents: &BTreeMap<String, (Value, Vec<String>)>) -> Value {
    let mut context = Map::new();
    for (key, (document, attribute_keys)) in documents {
        let mut document = document.as_object().cloned().unwrap_or_default();
        for attribute in attribute_keys {
            document.entry(attribute.clone()).or_insert(Value::Null);
        }
        context.insert(key.clone(), Value::Object(document));
    }
    Value::Object(context)
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::email::resources::ContextKey;
    use serde_json::json;

    fn template(kind: &str, topic: Option<&str>) -> TemplateDef {
        TemplateDef {
            slug: "t".into(),
            name: "T".into(),
            kind: kind.into(),
            sender_id: "snd_1".into(),
            topic_id: topic.map(str::to_owned),
            subject: String::new(),
            html: String::new(),
            text: String::new(),
            recipient: "contact".into(),
            data: BTreeMap::from([(
                "contact".to_owned(),
                ContextKey { schema_id: "sch_1".into(), schema_slug: "contacts".into(), schema_type: "contact".into() },
            )]),
            tracking: None,
        }
    }

    #[test]
    fn a_refused_send_answers_with_its_gates_code_and_a_missing_address_is_a_bad_request() {
        assert_eq!(refusal(Gate::NoAddress).status().as_u16(), 400);
        assert_eq!(refusal(Gate::NoAddress).code(), Some(Code::RecipientMissing));
        for gate in [Gate::Suppressed, Gate::Consent, Gate::Topic, Gate::FrequencyCap, Gate::QuietHours] {
            assert_eq!(refusal(gate).status().as_u16(), 422, "{gate:?}");
            assert_eq!(refusal(gate).code(), Some(gate.code()));
        }
    }

    #[test]
    fn the_body_is_data_only_and_its_keys_are_the_templates() {
        let body = |value: Value| value.as_object().cloned().unwrap_or_default();
        let refused = context(&body(json!({"data": {}, "subject": "x"}))).err().and_then(|e| e.code());
        assert_eq!(refused, Some(Code::TemplateContentNotAccepted));
        assert_eq!(
            context(&body(json!({"data": {}, "other": 1}))).err().and_then(|e| e.code()),
            Some(Code::UnknownField)
        );
        assert_eq!(
            context(&body(json!({"data": {"contact": 1}}))).err().and_then(|e| e.code()),
            Some(Code::InvalidTemplateData)
        );
        let given = context(&body(json!({"data": {"contact": {"email": "a@example.com"}}}))).expect("valid");
        assert!(check_keys(&template("transactional", None), &given).is_ok());
        let extra = context(&body(json!({"data": {"contact": {}, "order": {}}}))).expect("valid");
        assert!(check_keys(&template("transactional", None), &extra).is_err());
        assert!(check_keys(&template("transactional", None), &BTreeMap::new()).is_err());
    }
}
