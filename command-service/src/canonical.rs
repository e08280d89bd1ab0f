//! Canonical JSON for comparing request bodies: object keys sorted at every level, no
//! insignificant whitespace. Reordering keys does not change it; changing any value does.

use serde_json::Value;
use sha2::{Digest, Sha256};

pub(crate) fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write(value, &mut out);
    out
}

fn write(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (index, (key, value)) in entries.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write(value, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// SHA-256 of the canonical form, as hex.
pub fn body_hash(value: &Value) -> String {
    hex::encode(Sha256::digest(canonical_json(value).as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_does_not_matter_values_do() {
        let a = json!({"b": 1, "a": {"y": [1, {"q": 2, "p": 1}], "x": null}});
        let b = json!({"a": {"x": null, "y": [1, {"p": 1, "q": 2}]}, "b": 1});
        assert_eq!(body_hash(&a), body_hash(&b));
        assert_ne!(body_hash(&a), body_hash(&json!({"b": 2, "a": {"y": [1, {"q": 2, "p": 1}], "x": null}})));
        assert_ne!(body_hash(&json!([1, 2])), body_hash(&json!([2, 1])));
        assert_eq!(canonical_json(&json!({"b": "x", "a": 1.5})), r#"{"a":1.5,"b":"x"}"#);
    }
}
