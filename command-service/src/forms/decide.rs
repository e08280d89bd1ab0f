//! The pure parts of a form submission: who the client is, and what the fields become.

use std::net::IpAddr;

use domain::catalog::AttributeEntry;
use domain::email::resources::FormDef;
use platform::error::{ApiError, Code, Issue};
use serde_json::{Map, Value};

/// The client's address: the peer's, or, when the peer is a trusted proxy, the address its
/// `X-Forwarded-For` names (the rightmost one that is not itself a trusted proxy).
pub(crate) fn client_ip(peer: Option<IpAddr>, forwarded_for: Option<&str>, trusted: &[IpAddr]) -> Option<IpAddr> {
    let peer = peer?;
    if !trusted.contains(&peer) {
        return Some(peer);
    }
    let chain: Vec<IpAddr> =
        forwarded_for.unwrap_or_default().split(',').filter_map(|hop| hop.trim().parse().ok()).collect();
    Some(chain.iter().rev().find(|hop| !trusted.contains(hop)).or(chain.first()).copied().unwrap_or(peer))
}

/// The contact input of a submission: each form field the form maps, to its attribute or
/// identity field. A urlencoded body's strings are read as the attribute's type (`true`,
/// `on` and `1` are true for a checkbox); empty values are left out. The email is required.
pub(crate) fn contact_input(
    form: &FormDef,
    fields: &Map<String, Value>,
    attributes: &[AttributeEntry],
    urlencoded: bool,
) -> Result<Map<String, Value>, ApiError> {
    let mut input = Map::new();
    for (field, target) in &form.fields {
        let Some(value) = fields.get(field) else { continue };
        let value = match value {
            Value::String(text) if urlencoded => {
                let text = text.trim();
                if text.is_empty() {
                    continue;
                }
                let kind = attributes
                    .iter()
                    .find(|attribute| attribute.key == *target)
                    .and_then(|attribute| attribute.definition.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("string");
                typed(kind, text)
            }
            other => other.clone(),
        };
        input.insert(target.clone(), value);
    }
    if input.get("email").is_none_or(|email| email.as_str().is_none_or(|email| email.trim().is_empty())) {
        let field = form.fields.iter().find(|(_, target)| *target == "email").map_or("email", |(field, _)| field);
        return Err(ApiError::bad_request(
            Code::InvalidFormSubmission,
            format!("{field} (an email address) is required"),
        )
        .with_issues(vec![Issue::for_key(field, "an email address is required")]));
    }
    Ok(input)
}

fn typed(kind: &str, text: &str) -> Value {
    match kind {
        "boolean" => Value::Bool(matches!(text.to_ascii_lowercase().as_str(), "true" | "on" | "1" | "yes")),
        "integer" => text.parse::<i64>().map(Value::from).unwrap_or_else(|_| Value::String(text.to_owned())),
        "number" => text
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or_else(|| Value::String(text.to_owned()), Value::Number),
        _ => Value::String(text.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    #[test]
    fn forwarded_for_counts_only_behind_a_trusted_proxy() {
        let proxy: IpAddr = "127.0.0.1".parse().expect("ip");
        let client: IpAddr = "203.0.113.9".parse().expect("ip");
        let spoofed = Some("198.51.100.1, 203.0.113.9");
        assert_eq!(
            client_ip(Some(client), Some("198.51.100.1"), &[proxy]),
            Some(client),
            "untrusted peer: header ignored"
        );
        assert_eq!(client_ip(Some(proxy), spoofed, &[proxy]), Some(client), "the rightmost untrusted hop");
        assert_eq!(client_ip(Some(proxy), None, &[proxy]), Some(proxy));
        assert_eq!(client_ip(Some(proxy), Some("garbage"), &[proxy]), Some(proxy));
    }

    #[test]
    fn fields_map_to_attributes_with_types_and_the_email_is_required() {
        let form = FormDef {
            slug: "f".into(),
            name: "F".into(),
            schema_id: "sch".into(),
            fields: BTreeMap::from([
                ("email_address".into(), "email".into()),
                ("agree".into(), "consent".into()),
                ("age".into(), "age".into()),
            ]),
            topic_ids: vec![],
            double_opt_in: true,
            confirmation_template_id: None,
            enabled: true,
        };
        let attributes = vec![
            AttributeEntry { key: "consent".into(), definition: json!({"type": "boolean"}) },
            AttributeEntry { key: "age".into(), definition: json!({"type": "integer"}) },
        ];
        let fields = json!({"email_address": "a@example.com", "agree": "on", "age": "42", "other": "x"});
        let input = contact_input(&form, fields.as_object().expect("object"), &attributes, true).expect("valid");
        assert_eq!(Value::Object(input), json!({"email": "a@example.com", "consent": true, "age": 42}));
        let missing = json!({"email_address": " ", "age": "1"});
        let error = contact_input(&form, missing.as_object().expect("object"), &attributes, true).err();
        assert_eq!(error.and_then(|error| error.code()), Some(Code::InvalidFormSubmission));
    }
}
