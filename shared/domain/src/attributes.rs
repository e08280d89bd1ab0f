//! Validating one attribute value against its definition.

use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};
use kernel::error::Code;
use serde_json::Value;

use crate::catalog::AttributeEntry;
pub use crate::catalog::{has_auto_fill, is_writable};
use kernel::error::Issue;

pub fn is_required(definition: &Value) -> bool {
    definition.get("required").and_then(Value::as_bool).unwrap_or(false)
}

pub fn default_value(definition: &Value) -> Option<&Value> {
    definition.get("default").filter(|value| !value.is_null())
}

/// Checks one input key and value against a schema's custom attributes: the attribute must
/// exist and be writable, and the value must fit its type. Returns the normalised value, or
/// the issue (`unknown_attribute`, `attribute_not_writable`, `invalid_attribute_value`).
pub fn writable_value(attributes: &[AttributeEntry], key: &str, value: Value) -> Result<Value, Issue> {
    let Some(attribute) = attributes.iter().find(|a| a.key == key) else {
        return Err(Issue::coded(key, Code::UnknownAttribute, format!("{key} is not an attribute of this schema")));
    };
    if !is_writable(&attribute.definition) {
        return Err(Issue::coded(
            key,
            Code::AttributeNotWritable,
            format!("{key} is evaluated or aggregated by the platform and cannot be written"),
        ));
    }
    if attribute_type(&attribute.definition) == "json" && nests_deeper(&value, MAX_JSON_DEPTH) {
        return Err(Issue::coded(
            key,
            Code::ValueTooLong,
            format!("{key} nests arrays and objects deeper than {MAX_JSON_DEPTH} levels"),
        ));
    }
    normalize_value(&attribute.definition, value)
        .map_err(|message| Issue::coded(key, Code::InvalidAttributeValue, format!("{key} {message}")))
}

/// The most a value of each attribute type may hold, whatever door writes it (the API's
/// create, upsert and PATCH, an import, a form, a journey's update step): a `string` 4,096
/// characters, a `text` 65,536, an `email` 254, a `phone` 64, a `select` 1,024, a
/// `multiselect` 1,000 choices of 1,024 characters, a `json` value 65,536 bytes as JSON and
/// 32 levels of nesting (the nesting bounds an event's `json` values too).
pub const MAX_STRING: usize = 4_096;
pub const MAX_TEXT: usize = 65_536;
pub const MAX_EMAIL: usize = 254;
pub const MAX_PHONE: usize = 64;
/// The longest IANA time zone name is 32 characters (`America/Argentina/ComodRivadavia`).
pub const MAX_ZONE: usize = 64;
pub const MAX_CHOICE: usize = 1_024;
pub const MAX_CHOICES: usize = 1_000;
pub const MAX_JSON_BYTES: usize = 65_536;
/// How deep a `json` value may nest arrays and objects. A record's document and the answers
/// and webhook payloads that carry it wrap the value in a few more levels, which must stay
/// within what common JSON readers take (serde_json's 128, our own reads included).
pub const MAX_JSON_DEPTH: usize = 32;

/// The limit a value of the definition's type goes beyond, as words, if it does.
pub fn too_long(definition: &Value, value: &Value) -> Option<String> {
    let chars =
        |value: &Value, max: usize| value.as_str().is_some_and(|text| text.len() > max && text.chars().count() > max);
    match attribute_type(definition) {
        "string" => chars(value, MAX_STRING).then(|| format!("{MAX_STRING} characters")),
        "text" => chars(value, MAX_TEXT).then(|| format!("{MAX_TEXT} characters")),
        "email" => chars(value, MAX_EMAIL).then(|| format!("{MAX_EMAIL} characters")),
        "phone" => chars(value, MAX_PHONE).then(|| format!("{MAX_PHONE} characters")),
        "timezone" => chars(value, MAX_ZONE).then(|| format!("{MAX_ZONE} characters")),
        "select" => chars(value, MAX_CHOICE).then(|| format!("{MAX_CHOICE} characters")),
        "multiselect" => match value {
            Value::Array(items) if items.len() > MAX_CHOICES => Some(format!("{MAX_CHOICES} choices")),
            Value::Array(items) => {
                items.iter().any(|item| chars(item, MAX_CHOICE)).then(|| format!("{MAX_CHOICE} characters a choice"))
            }
            _ => None,
        },
        "number" | "integer" | "boolean" | "date" | "datetime" | "evaluated" => None,
        // json, and any other: the value as JSON text.
        _ => json_longer_than(value, MAX_JSON_BYTES).then(|| format!("{MAX_JSON_BYTES} bytes as JSON")),
    }
}

/// Whether `value` written as JSON takes more than `max` bytes (counted without writing it
/// out whole).
fn json_longer_than(value: &Value, max: usize) -> bool {
    struct Counter {
        written: usize,
        max: usize,
    }
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.written += bytes.len();
            if self.written > self.max { Err(std::io::Error::other("over")) } else { Ok(bytes.len()) }
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    serde_json::to_writer(Counter { written: 0, max }, value).is_err()
}

/// [`writable_value`] for a record (a contact or an object), whose values are bounded by
/// their type's maximum (400 `value_too_long`). An event's input is bounded as a whole instead
/// (`event_input_too_large`, the contract's).
pub fn writable_record_value(attributes: &[AttributeEntry], key: &str, value: Value) -> Result<Value, Issue> {
    let limit = attributes.iter().find(|a| a.key == key).and_then(|a| too_long(&a.definition, &value));
    if let Some(limit) = limit {
        return Err(Issue::coded(key, Code::ValueTooLong, format!("{key} is longer than {limit}")));
    }
    writable_value(attributes, key, value)
}

/// Whether `value` nests arrays and objects more than `max` levels deep (a scalar is level 0).
fn nests_deeper(value: &Value, max: usize) -> bool {
    match value {
        Value::Array(items) => max == 0 || items.iter().any(|item| nests_deeper(item, max - 1)),
        Value::Object(fields) => max == 0 || fields.values().any(|field| nests_deeper(field, max - 1)),
        _ => false,
    }
}

/// The definition's stored type (`json` when it names none).
pub fn attribute_type(definition: &Value) -> &str {
    definition.get("type").and_then(Value::as_str).unwrap_or("json")
}

/// Checks `value` against the definition's type and returns it normalised (datetimes in
/// UTC with milliseconds, emails trimmed and lowercased). `Err` is a message for the caller.
pub fn normalize_value(definition: &Value, value: Value) -> Result<Value, String> {
    if value.is_null() {
        return Ok(Value::Null);
    }
    match attribute_type(definition) {
        "string" | "text" => match value {
            Value::String(_) => Ok(value),
            _ => Err("must be a string".to_owned()),
        },
        "email" => match value.as_str() {
            Some(text) => normalize_email(text).map(Value::String),
            None => Err("must be an email address string".to_owned()),
        },
        "phone" => match value.as_str() {
            Some(text) => normalize_phone(text).map(Value::String),
            None => Err("must be a phone number string".to_owned()),
        },
        // Written in its canonical spelling (`asia/kolkata` is `Asia/Kolkata`).
        "timezone" => match value.as_str().and_then(crate::email::send::policy::zone) {
            Some(zone) => Ok(Value::String(zone.name().to_owned())),
            None => Err("must be an IANA time zone name like Europe/Berlin (a UTC offset such as +05:30 is not a \
                         zone: name the place, for example Asia/Kolkata)"
                .to_owned()),
        },
        "number" => match value {
            Value::Number(_) => Ok(value),
            _ => Err("must be a number".to_owned()),
        },
        "integer" => match value.as_i64() {
            Some(_) => Ok(value),
            None => Err("must be an integer".to_owned()),
        },
        "boolean" => match value {
            Value::Bool(_) => Ok(value),
            _ => Err("must be true or false".to_owned()),
        },
        "date" => match value.as_str().map(|text| NaiveDate::parse_from_str(text, "%Y-%m-%d")) {
            Some(Ok(_)) => Ok(value),
            _ => Err("must be a date like 2026-11-21".to_owned()),
        },
        "datetime" => match value.as_str().and_then(datetime) {
            Some(at) => Ok(Value::String(at.to_rfc3339_opts(SecondsFormat::Millis, true))),
            None => Err("must be an RFC 3339 date-time with its offset, like 2026-11-21T15:49:41.123Z, or a date \
                         like 2026-11-21 (that day's midnight UTC)"
                .to_owned()),
        },
        "select" => match value.as_str() {
            Some(choice) if option_allowed(definition, choice) => Ok(value),
            _ => Err(format!("must be one of {}", options_text(definition))),
        },
        "multiselect" => match &value {
            Value::Array(items)
                if items.iter().all(|item| item.as_str().is_some_and(|c| option_allowed(definition, c))) =>
            {
                Ok(value)
            }
            _ => Err(format!("must be an array of values from {}", options_text(definition))),
        },
        _ => Ok(value),
    }
}

/// A `datetime` value: an RFC 3339 date-time, or a date alone (`2026-11-21`, as spreadsheets
/// and CRM exports write a signup date) for that day's midnight UTC. A date and time without
/// an offset is refused: which zone it meant cannot be told.
fn datetime(text: &str) -> Option<DateTime<Utc>> {
    match DateTime::parse_from_rfc3339(text) {
        Ok(at) => Some(at.with_timezone(&Utc)),
        Err(_) => NaiveDate::parse_from_str(text, "%Y-%m-%d").ok()?.and_hms_opt(0, 0, 0).map(|at| at.and_utc()),
    }
}

pub fn normalize_email(text: &str) -> Result<String, String> {
    let email = text.trim().to_lowercase();
    let valid = email.split_once('@').is_some_and(|(local, domain)| {
        !local.is_empty() && domain.contains('.') && !domain.starts_with('.') && !domain.ends_with('.')
    }) && !email.contains(char::is_whitespace)
        && email.len() <= 254;
    if valid { Ok(email) } else { Err(format!("{text:?} is not a valid email address")) }
}

pub fn normalize_phone(text: &str) -> Result<String, String> {
    let phone = text.trim();
    let digits = phone.chars().filter(char::is_ascii_digit).count();
    let allowed = phone
        .chars()
        .enumerate()
        .all(|(index, c)| c.is_ascii_digit() || matches!(c, ' ' | '-' | '(' | ')' | '.') || (c == '+' && index == 0));
    if allowed && (5..=20).contains(&digits) {
        Ok(phone.to_owned())
    } else {
        Err(format!("{text:?} is not a valid phone number"))
    }
}

/// The allowed values of a select or multiselect, given as strings or `{"value": ...}`.
pub fn options(definition: &Value) -> Vec<&str> {
    definition
        .get("options")
        .and_then(Value::as_array)
        .map(|options| {
            options
                .iter()
                .filter_map(|option| option.as_str().or_else(|| option.get("value").and_then(Value::as_str)))
                .collect()
        })
        .unwrap_or_default()
}

fn option_allowed(definition: &Value, choice: &str) -> bool {
    let options = options(definition);
    options.is_empty() || options.contains(&choice)
}

fn options_text(definition: &Value) -> String {
    options(definition).join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn writable_excludes_evaluated_and_value_sources() {
        assert!(is_writable(&json!({"type": "string"})));
        assert!(!is_writable(&json!({"type": "evaluated"})));
        assert!(!is_writable(&json!({"type": "number", "valueSource": {"type": "aggregate"}})));
    }

    #[test]
    fn values_are_checked_and_normalised() {
        assert_eq!(
            normalize_value(&json!({"type": "email"}), json!(" Ada@Example.COM ")),
            Ok(json!("ada@example.com"))
        );
        assert!(normalize_value(&json!({"type": "email"}), json!("nope")).is_err());
        assert!(normalize_value(&json!({"type": "number"}), json!("1")).is_err());
        assert!(normalize_value(&json!({"type": "integer"}), json!(1.5)).is_err());
        assert_eq!(
            normalize_value(&json!({"type": "datetime"}), json!("2026-11-21T16:49:41+01:00")),
            Ok(json!("2026-11-21T15:49:41.000Z"))
        );
        assert_eq!(
            normalize_value(&json!({"type": "datetime"}), json!("2026-01-11")),
            Ok(json!("2026-01-11T00:00:00.000Z"))
        );
        for refused in ["2026-01-11 14:30:00", "2026-02-30", "11/01/2026", "2026-01-11T14:30"] {
            let message = normalize_value(&json!({"type": "datetime"}), json!(refused)).expect_err(refused);
            assert!(message.contains("2026-11-21 (that day's midnight UTC)"), "{message}");
        }
        assert!(normalize_value(&json!({"type": "select", "options": ["a", "b"]}), json!("c")).is_err());
        assert!(normalize_value(&json!({"type": "select", "options": [{"value": "a"}]}), json!("a")).is_ok());
        assert_eq!(normalize_value(&json!({"type": "boolean"}), Value::Null), Ok(Value::Null));
    }

    #[test]
    fn phones_need_digits_and_allowed_characters() {
        assert!(normalize_phone("+1 (555) 010-2030").is_ok());
        assert!(normalize_phone("call me").is_err());
        assert!(normalize_phone("12").is_err());
    }

    #[test]
    fn every_type_has_a_maximum_and_a_value_beyond_it_is_named() {
        let long = |n: usize| Value::String("é".repeat(n));
        assert_eq!(too_long(&json!({"type": "string"}), &long(MAX_STRING)), None);
        assert_eq!(too_long(&json!({"type": "string"}), &long(MAX_STRING + 1)).as_deref(), Some("4096 characters"));
        assert!(too_long(&json!({"type": "text"}), &long(MAX_STRING + 1)).is_none());
        assert!(too_long(&json!({"type": "text"}), &long(MAX_TEXT + 1)).is_some());
        assert!(too_long(&json!({"type": "email"}), &long(255)).is_some());
        let many = Value::Array(vec![json!("a"); MAX_CHOICES + 1]);
        assert_eq!(too_long(&json!({"type": "multiselect"}), &many).as_deref(), Some("1000 choices"));
        let big = json!({"blob": "x".repeat(MAX_JSON_BYTES)});
        assert!(too_long(&json!({"type": "json"}), &big).is_some());
        assert!(too_long(&json!({"type": "json"}), &json!({"small": [1, 2, 3]})).is_none());
        let nested = |depth: usize| (0..depth).fold(json!(1), |inner, _| json!([inner]));
        assert!(!nests_deeper(&nested(MAX_JSON_DEPTH), MAX_JSON_DEPTH));
        assert!(nests_deeper(&nested(MAX_JSON_DEPTH + 1), MAX_JSON_DEPTH));
        assert!(!nests_deeper(&json!({"a": {"b": [1, {"c": 2}]}}), 4));
        assert!(nests_deeper(&json!({"a": {"b": [1, {"c": {}}]}}), 4));
        assert!(too_long(&json!({"type": "number"}), &json!(1e300)).is_none());
        let attributes = [AttributeEntry { key: "bio".to_owned(), definition: json!({"type": "string"}) }];
        let issue = writable_record_value(&attributes, "bio", long(5_000)).expect_err("too long");
        assert!(writable_value(&attributes, "bio", long(5_000)).is_ok(), "an event's input is bounded as a whole");
        assert_eq!((issue.key.as_deref(), issue.code), (Some("bio"), Some(Code::ValueTooLong)));
        assert_eq!(issue.message, "bio is longer than 4096 characters");
    }

    #[test]
    fn a_timezone_value_is_an_iana_name_written_in_its_canonical_spelling() {
        let zone = json!({"type": "timezone"});
        assert_eq!(normalize_value(&zone, json!("asia/kolkata")), Ok(json!("Asia/Kolkata")));
        assert_eq!(normalize_value(&zone, json!("Europe/Berlin")), Ok(json!("Europe/Berlin")));
        for refused in [json!("+05:30"), json!("Mars/Olympus"), json!("UTC+5"), json!(5.5)] {
            let error = normalize_value(&zone, refused.clone()).expect_err("refused");
            assert!(error.starts_with("must be an IANA time zone name"), "{refused}: {error}");
        }
        assert!(too_long(&zone, &json!("x".repeat(65))).is_some());
    }
}
