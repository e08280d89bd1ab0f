//! What PostgreSQL refuses to store, found at the edge so it never reaches a guard, the log
//! or a read model.
//!
//! PostgreSQL `text` and `jsonb` cannot hold the NUL character (U+0000): a NUL reaching a
//! statement fails it ("invalid byte sequence for encoding UTF8: 0x00", or "\u0000 cannot be
//! converted to text" in a projection), which would turn bad input into a 5xx or stop a read
//! model. Everything else that valid JSON or a URL can carry is storable: serde_json refuses
//! lone surrogates, numbers out of range and nesting deeper than 128 levels before we see the
//! value, and index entries are bounded by the per-field length limits of each decision.

use crate::error::Code;
use serde_json::Value;

use crate::error::Issue;

/// The code of an input that holds a character the store cannot hold.
pub const INVALID_CHARACTER: Code = Code::InvalidCharacter;

/// Whether `text` can be stored in a PostgreSQL `text` or `jsonb` value.
pub fn is_storable(text: &str) -> bool {
    !text.contains('\0')
}

/// Whether `text` is empty or only white space, as the OpenAPI document's `\S` patterns
/// (ECMAScript regular expressions) judge it. Rust's own `char::is_whitespace` differs in two
/// characters: it counts U+0085 (next line) as white space, which ECMAScript does not, and not
/// U+FEFF (zero-width no-break space), which ECMAScript does, so a field the document calls
/// valid would have been refused as blank.
pub fn is_blank(text: &str) -> bool {
    text.chars().all(is_white_space)
}

/// `text` without leading and trailing white space as [`is_blank`] judges it.
pub fn trimmed(text: &str) -> &str {
    text.trim_matches(is_white_space)
}

/// ECMAScript's `\s`: its WhiteSpace and LineTerminator characters.
fn is_white_space(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n' | '\u{b}' | '\u{c}' | '\r' | ' ' | '\u{a0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200a}' | '\u{2028}' | '\u{2029}' | '\u{202f}' | '\u{205f}' | '\u{3000}' | '\u{feff}'
    )
}

/// `text` with every NUL written as `\u0000`, so a message or an issue key can name it.
pub fn escaped(text: &str) -> String {
    text.replace('\0', "\\u0000")
}

/// Issues for every string (object key or value) in `value` that cannot be stored, each naming
/// the field by its path from the top of the body (`firstName`, `suppressions[2].identifier`).
pub fn json_issues(value: &Value) -> Vec<Issue> {
    let mut issues = Vec::new();
    walk(value, &mut String::new(), &mut issues);
    issues
}

fn walk(value: &Value, path: &mut String, issues: &mut Vec<Issue>) {
    match value {
        Value::String(text) if !is_storable(text) => issues.push(issue(field_name(path), "the value")),
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                let length = path.len();
                path.push_str(&format!("[{index}]"));
                walk(item, path, issues);
                path.truncate(length);
            }
        }
        Value::Object(object) => {
            for (key, item) in object {
                let length = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(&escaped(key));
                if is_storable(key) {
                    walk(item, path, issues);
                } else {
                    issues.push(issue(path.clone(), "the key"));
                }
                path.truncate(length);
            }
        }
        _ => {}
    }
}

fn field_name(path: &str) -> String {
    if path.is_empty() { "body".to_owned() } else { path.to_owned() }
}

fn issue(key: String, what: &str) -> Issue {
    let message = format!("{what} of {key} contains a NUL character (U+0000), which cannot be stored; remove it");
    Issue::coded(key, INVALID_CHARACTER, message)
}

/// Issues for named parameters (path segments, query pairs) that cannot be stored.
pub fn parameter_issues<'a>(kind: &str, parameters: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<Issue> {
    parameters
        .into_iter()
        .filter(|(name, value)| !is_storable(name) || !is_storable(value))
        .map(|(name, _)| {
            let name = escaped(name);
            let message =
                format!("{kind} parameter {name} contains a NUL character (U+0000), which cannot be stored; remove it");
            Issue::coded(name, INVALID_CHARACTER, message)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn keys(value: &Value) -> Vec<String> {
        json_issues(value).into_iter().filter_map(|issue| issue.key).collect()
    }

    #[test]
    fn blank_means_what_the_documents_white_space_pattern_means() {
        for blank in ["", " ", "\t\r\n", "\u{a0}\u{2003}", "\u{feff}", "\u{3000}\u{2028}"] {
            assert!(is_blank(blank), "{blank:?}");
        }
        // U+0085 is white space to Rust, not to ECMAScript's \S: the document calls it a value.
        for value in ["a", "\u{85}", " \u{85} ", "\u{200b}"] {
            assert!(!is_blank(value), "{value:?}");
        }
        assert_eq!(trimmed("\u{feff} a b\u{a0}"), "a b");
        assert_eq!(trimmed("\u{85}x"), "\u{85}x");
    }

    #[test]
    fn clean_values_have_no_issues() {
        assert!(json_issues(&json!({"a": ["b", {"c": "d\u{1}é😀"}], "n": 1.5, "z": null})).is_empty());
    }

    #[test]
    fn nul_in_values_and_keys_is_named_by_its_path() {
        let body = json!({
            "firstName": "a\u{0}b",
            "a\u{0}b": 1,
            "suppressions": [{"identifier": "x@y.z"}, {"identifier": "\u{0}"}],
            "nested": {"deep": ["ok", "n\u{0}"]}
        });
        let mut found = keys(&body);
        found.sort();
        assert_eq!(found, ["a\\u0000b", "firstName", "nested.deep[1]", "suppressions[1].identifier"]);
        assert_eq!(keys(&json!("\u{0}")), ["body"]);
    }

    #[test]
    fn issue_text_never_holds_a_nul() {
        for issue in json_issues(&json!({"\u{0}": "\u{0}"})) {
            assert!(is_storable(&issue.message));
            assert!(issue.key.as_deref().is_some_and(is_storable));
        }
    }

    #[test]
    fn parameters_are_named() {
        let issues = parameter_issues("path", [("schema", "a\u{0}b"), ("id", "fine")]);
        assert_eq!(issues.len(), 1);
        assert_eq!(issues[0].key.as_deref(), Some("schema"));
        assert!(parameter_issues("query", [("limit", "5")]).is_empty());
    }
}
