//! Liquid rendering of a template's subject and bodies. Liquid does not escape by itself:
//! the HTML body is rendered against a copy of the context whose strings are HTML-escaped, so
//! a contact's `<script>` name arrives as text; the subject and the text body get the values
//! as they are.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use serde_json::Value;

/// The Liquid parser with the standard tags and filters, built once.
fn parser() -> Result<&'static liquid::Parser, String> {
    static PARSER: OnceLock<Result<liquid::Parser, String>> = OnceLock::new();
    PARSER
        .get_or_init(|| liquid::ParserBuilder::with_stdlib().build().map_err(|error| error.to_string()))
        .as_ref()
        .map_err(Clone::clone)
}

/// Parsed sources kept for the next send of the same template; emptied when it grows past
/// this many (authored templates are few, so it rarely does).
const CACHED_SOURCES: usize = 512;

/// `source` parsed: from the process's cache, or parsed now and kept. Keyed by the source
/// itself, so a changed template is a new entry and nothing needs invalidating.
fn parsed(source: &str) -> Result<Arc<liquid::Template>, String> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<liquid::Template>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(template) = cache.lock().unwrap_or_else(PoisonError::into_inner).get(source) {
        return Ok(Arc::clone(template));
    }
    let template = Arc::new(parser()?.parse(source).map_err(|error| error.to_string())?);
    let mut cache = cache.lock().unwrap_or_else(PoisonError::into_inner);
    if cache.len() >= CACHED_SOURCES {
        cache.clear();
    }
    cache.insert(source.to_owned(), Arc::clone(&template));
    Ok(template)
}

/// Parses one Liquid source; the error names the problem (for authoring).
pub fn check(source: &str) -> Result<(), String> {
    parser()?.parse(source).map(|_| ()).map_err(|error| error.to_string())
}

/// What a template renders to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub subject: String,
    pub html: String,
    pub text: String,
}

/// Renders the three parts against `context` (an object: context key → record document).
/// Not public: sends render through `send::render_email`, which adds what marketing mail
/// needs.
pub(crate) fn render(subject: &str, html: &str, text: &str, context: &Value) -> Result<Rendered, String> {
    let plain = liquid::to_object(context).map_err(|error| error.to_string())?;
    let escaped = liquid::to_object(&escape_strings(context)).map_err(|error| error.to_string())?;
    let part =
        |source: &str, globals: &liquid::Object| parsed(source)?.render(globals).map_err(|error| error.to_string());
    Ok(Rendered {
        subject: part(subject, &plain)?.replace(['\r', '\n'], " "),
        html: part(html, &escaped)?,
        text: part(text, &plain)?,
    })
}

fn escape_strings(value: &Value) -> Value {
    match value {
        Value::String(text) => Value::String(escape_html(text)),
        Value::Array(items) => Value::Array(items.iter().map(escape_strings).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), escape_strings(v))).collect()),
        other => other.clone(),
    }
}

pub(crate) fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_html_part_escapes_values_and_the_others_do_not() {
        let context = json!({"contact": {"firstName": "<b>Ada</b> & co", "plan": "pro"}});
        let rendered = render(
            "Hi {{ contact.firstName }}",
            "<p>Hi {{ contact.firstName }}, plan {{ contact.plan | upcase }}</p>",
            "Hi {{ contact.firstName }}",
            &context,
        )
        .expect("renders");
        assert_eq!(rendered.subject, "Hi <b>Ada</b> & co");
        assert_eq!(rendered.html, "<p>Hi &lt;b&gt;Ada&lt;/b&gt; &amp; co, plan PRO</p>");
        assert_eq!(rendered.text, "Hi <b>Ada</b> & co");
    }

    #[test]
    fn null_values_render_empty_and_unknown_names_and_bad_syntax_are_reported() {
        let rendered = render("{{ contact.unset }}x", "", "", &json!({"contact": {"unset": null}})).expect("renders");
        assert_eq!(rendered.subject, "x");
        let unknown = render("{{ contact.nope }}", "", "", &json!({"contact": {}})).err().unwrap_or_default();
        assert!(unknown.contains("nope"), "{unknown}");
        assert!(check("{% if %}").is_err());
        assert!(check("Hello {{ contact.email }}").is_ok());
    }

    #[test]
    fn a_subject_never_carries_a_line_break() {
        let rendered = render("{{ a }}", "", "", &json!({"a": "x\r\nBcc: y@example.com"})).expect("renders");
        assert_eq!(rendered.subject, "x  Bcc: y@example.com");
    }
}
