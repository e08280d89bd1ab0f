//! Liquid rendering of a template's subject and bodies. Liquid does not escape by itself:
//! the HTML body is rendered against a copy of the context whose strings are HTML-escaped, so
//! a contact's `<script>` name arrives as text; the subject and the text body get the values
//! as they are.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use serde_json::Value;

/// The partials one render may use: slug → source, for one body (a partial's HTML or its
/// text) and one locale, and a key naming exactly that set (its ids, revisions and tags) to
/// find the parser built with it.
#[derive(Debug, Clone, Default)]
pub struct Partials {
    pub key: String,
    pub sources: Vec<(String, String)>,
}

impl Partials {
    /// The partials of one locale, `(slug, html, text)` each, as an HTML body renders them and
    /// as a subject or a text body does, under `key` (which must name exactly these sources).
    pub fn pair<'a>(key: &str, parts: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>) -> (Self, Self) {
        let (mut html, mut text) = (Self { key: key.to_owned(), ..Self::default() }, Self::default());
        text.key = format!("{key}|text");
        for (slug, html_source, text_source) in parts {
            html.sources.push((slug.to_owned(), html_source.to_owned()));
            text.sources.push((slug.to_owned(), text_source.to_owned()));
        }
        (html, text)
    }
}

/// Parsers built with a set of partials, by the set's key; emptied when it grows past this
/// many (a space's partials change rarely, and each set is a handful of locales).
const CACHED_PARSERS: usize = 64;

/// The Liquid parser with the standard tags and filters and `partials`: built once per set.
/// Partials are compiled when it is built, so a partial that does not parse fails here.
fn parser(partials: &Partials) -> Result<Arc<liquid::Parser>, String> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<liquid::Parser>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(parser) = cache.lock().unwrap_or_else(PoisonError::into_inner).get(&partials.key) {
        return Ok(Arc::clone(parser));
    }
    let mut store = liquid::partials::InMemorySource::new();
    for (name, source) in &partials.sources {
        store.add(name.as_str(), source.as_str());
    }
    let parser = liquid::ParserBuilder::with_stdlib()
        .partials(liquid::partials::EagerCompiler::new(store))
        .build()
        .map_err(|error| error.to_string())?;
    let parser = Arc::new(parser);
    let mut cache = cache.lock().unwrap_or_else(PoisonError::into_inner);
    if cache.len() >= CACHED_PARSERS {
        cache.clear();
    }
    cache.insert(partials.key.clone(), Arc::clone(&parser));
    Ok(parser)
}

/// Parsed sources kept for the next send of the same template; emptied when it grows past
/// this many (authored templates are few, so it rarely does).
const CACHED_SOURCES: usize = 512;

/// `source` parsed with `partials`: from the process's cache, or parsed now and kept. Keyed
/// by the partials' key and the source itself, so a changed template or partial is a new
/// entry and nothing needs invalidating.
fn parsed(partials: &Partials, source: &str) -> Result<Arc<liquid::Template>, String> {
    /// (The partials' key, the source) → the parsed template.
    type Parsed = HashMap<(String, String), Arc<liquid::Template>>;
    static CACHE: OnceLock<Mutex<Parsed>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (partials.key.clone(), source.to_owned());
    if let Some(template) = cache.lock().unwrap_or_else(PoisonError::into_inner).get(&key) {
        return Ok(Arc::clone(template));
    }
    let template = Arc::new(parser(partials)?.parse(source).map_err(|error| error.to_string())?);
    let mut cache = cache.lock().unwrap_or_else(PoisonError::into_inner);
    if cache.len() >= CACHED_SOURCES {
        cache.clear();
    }
    cache.insert(key, Arc::clone(&template));
    Ok(template)
}

/// Parses one Liquid source; the error names the problem (for authoring).
pub fn check(source: &str) -> Result<(), String> {
    parser(&Partials::default())?.parse(source).map(|_| ()).map_err(|error| error.to_string())
}

/// What a template renders to, and the locale of the variant it rendered (`None` when the
/// template names no locale).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rendered {
    pub subject: String,
    pub html: String,
    pub text: String,
    pub locale: Option<LocaleUsed>,
}

/// The locale a mail was rendered in, and how it was chosen: `exact`, `language` or
/// `default` (the fallback chain, `domain::email::locale::pick`), or `invalid` (the contact's
/// value is not a language tag, so the default was used).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocaleUsed {
    pub tag: String,
    pub source: &'static str,
}

/// The Liquid variable of a layout that holds the template's rendered body.
pub const CONTENT_VARIABLE: &str = "content";

/// Everything one render reads: a variant's three parts, the layout's two (if any), and
/// the partials each body may render.
#[derive(Debug, Clone, Copy)]
pub struct Sources<'a> {
    pub subject: &'a str,
    pub html: &'a str,
    pub text: &'a str,
    /// The layout's HTML and text.
    pub layout: Option<(&'a str, &'a str)>,
    /// The partials as the HTML body renders them.
    pub html_partials: &'a Partials,
    /// The partials as the subject and the text body render them.
    pub text_partials: &'a Partials,
}

impl<'a> Sources<'a> {
    /// Three parts with no layout and no partials.
    pub fn plain(subject: &'a str, html: &'a str, text: &'a str) -> Self {
        static NONE: OnceLock<Partials> = OnceLock::new();
        let none = NONE.get_or_init(Partials::default);
        Self { subject, html, text, layout: None, html_partials: none, text_partials: none }
    }
}

/// Which part of a render failed, for the message.
fn failed(part: &str, error: &liquid::Error) -> String {
    format!("{part}: {error}")
}

/// Renders the parts against `context` (an object: context key → record document). The
/// layout, if any, gets the rendered body as `content`, unescaped. Not public outside the
/// crate: sends render through `send::render_email`, which adds what marketing mail needs.
pub(crate) fn render(sources: &Sources<'_>, context: &Value) -> Result<Rendered, String> {
    let plain = liquid::to_object(context).map_err(|error| error.to_string())?;
    let escaped = liquid::to_object(&escape_strings(context)).map_err(|error| error.to_string())?;
    let part = |name: &str, partials: &Partials, source: &str, globals: &liquid::Object| {
        parsed(partials, source)
            .map_err(|error| format!("{name}: {error}"))?
            .render(globals)
            .map_err(|error| failed(name, &error))
    };
    let subject = part("subject", sources.text_partials, sources.subject, &plain)?.replace(['\r', '\n'], " ");
    let mut html = part("html", sources.html_partials, sources.html, &escaped)?;
    let mut text = part("text", sources.text_partials, sources.text, &plain)?;
    if let Some((layout_html, layout_text)) = sources.layout {
        let mut with_body = escaped;
        with_body.insert(CONTENT_VARIABLE.into(), liquid::model::Value::scalar(html));
        html = part("the layout's html", sources.html_partials, layout_html, &with_body)?;
        let mut with_body = plain;
        with_body.insert(CONTENT_VARIABLE.into(), liquid::model::Value::scalar(text));
        text = part("the layout's text", sources.text_partials, layout_text, &with_body)?;
    }
    Ok(Rendered { subject, html, text, locale: None })
}

/// Renders `sources` against `context` as a send would, without what `send::render_email`
/// adds (footer, language, tracking): for checking authored content with sample data.
pub fn render_sample(sources: &Sources<'_>, context: &Value) -> Result<Rendered, String> {
    render(sources, context)
}

/// The partials `source` renders (`{% render 'name' %}`, or `include`), in order. Each tag is
/// read as Liquid reads it (`{%`, an optional `-`, the tag's name); a partial named by a
/// variable rather than a quoted name is an error, since it could not be checked.
pub fn partials_named(source: &str) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        rest = &rest[at + 2..];
        let tag = rest.trim_start_matches('-').trim_start();
        let name_end = tag.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tag.len());
        let (word, after) = tag.split_at(name_end);
        if word != "render" && word != "include" {
            continue;
        }
        let after = after.trim_start();
        let quote = after.chars().next().filter(|c| *c == '\'' || *c == '"');
        let name = quote.and_then(|quote| after[1..].find(quote).map(|end| &after[1..=end]));
        match name {
            Some(name) if !name.is_empty() => names.push(name.to_owned()),
            _ => {
                let shown: String = tag.chars().take(40).collect();
                return Err(format!("{{% {shown} names its partial by a variable; name it in quotes"));
            }
        }
    }
    Ok(names)
}

/// The line of `source` a Liquid error points at: the position a parse error gives
/// (` --> line:column`), else the first line holding what the error names (the unknown
/// variable or index, the partial, the filter).
pub fn line_of(source: &str, error: &str) -> Option<usize> {
    if let Some(at) = error.find("--> ") {
        let line: String = error[at + 4..].chars().take_while(char::is_ascii_digit).collect();
        return line.parse().ok();
    }
    let value =
        |name: &str| error.lines().find_map(|line| line.trim().strip_prefix(name)?.strip_prefix('=')).map(str::trim);
    let mut wanted = Vec::new();
    if let (Some(variable), Some(index)) = (value("variable"), value("requested index")) {
        wanted.push(format!("{variable}.{index}"));
    }
    wanted.extend(value("requested index").map(str::to_owned));
    wanted.extend(value("requested variable").map(str::to_owned));
    wanted.extend(value("requested partial").map(|name| name.trim_end_matches(".liquid").to_owned()));
    wanted.extend(value("filter").and_then(|filter| filter.split_whitespace().next()).map(str::to_owned));
    wanted
        .iter()
        .filter(|wanted| !wanted.is_empty())
        .find_map(|wanted| source.lines().position(|line| line.contains(wanted.as_str())).map(|index| index + 1))
}

/// Whether a render error is about a missing value under the variable `root` (`input`,
/// whose shape only a workflow's run knows).
pub fn is_missing_under(error: &str, root: &str) -> bool {
    error.lines().any(|line| line.trim().strip_prefix("variable=") == Some(root))
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

/// `html` with `preheader` as hidden text at the start of its body (or of the fragment): the
/// preview mail clients show after the subject, escaped, never shown in the message itself.
/// HTML that does not parse as far as the rewriter needs gets it at its start.
pub fn with_preheader(html: &str, preheader: &str) -> String {
    let hidden = format!(
        "<div style=\"display:none;font-size:1px;line-height:1px;max-height:0;max-width:0;opacity:0;\
         overflow:hidden;mso-hide:all\">{}</div>",
        escape_html(preheader)
    );
    let mut saw_body = false;
    let settings =
        lol_html::RewriteStrSettings::new().append_element_content_handler(lol_html::element!("body", |element| {
            saw_body = true;
            element.prepend(&hidden, lol_html::html_content::ContentType::Html);
            Ok(())
        }));
    match lol_html::rewrite_str(html, settings) {
        Ok(rewritten) if saw_body => rewritten,
        _ => format!("{hidden}{html}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preheader_opens_the_body_hidden_and_escaped() {
        let document = with_preheader("<html><body class=\"x\"><p>Hi</p></body></html>", "20% <off> & more");
        assert!(document.starts_with("<html><body class=\"x\"><div style=\"display:none;"), "{document}");
        assert!(document.contains(">20% &lt;off&gt; &amp; more</div><p>Hi</p></body></html>"), "{document}");
        let fragment = with_preheader("<p>Hi</p>", "Soon");
        assert!(fragment.starts_with("<div style=\"display:none;") && fragment.ends_with(">Soon</div><p>Hi</p>"));
    }
    use serde_json::json;

    #[test]
    fn the_html_part_escapes_values_and_the_others_do_not() {
        let context = json!({"contact": {"firstName": "<b>Ada</b> & co", "plan": "pro"}});
        let rendered = render(
            &Sources::plain(
                "Hi {{ contact.firstName }}",
                "<p>Hi {{ contact.firstName }}, plan {{ contact.plan | upcase }}</p>",
                "Hi {{ contact.firstName }}",
            ),
            &context,
        )
        .expect("renders");
        assert_eq!(rendered.subject, "Hi <b>Ada</b> & co");
        assert_eq!(rendered.html, "<p>Hi &lt;b&gt;Ada&lt;/b&gt; &amp; co, plan PRO</p>");
        assert_eq!(rendered.text, "Hi <b>Ada</b> & co");
    }

    #[test]
    fn null_values_render_empty_and_unknown_names_and_bad_syntax_are_reported() {
        let rendered = render(&Sources::plain("{{ contact.unset }}x", "", ""), &json!({"contact": {"unset": null}}))
            .expect("renders");
        assert_eq!(rendered.subject, "x");
        let unknown =
            render(&Sources::plain("{{ contact.nope }}", "", ""), &json!({"contact": {}})).err().unwrap_or_default();
        assert!(unknown.contains("nope"), "{unknown}");
        assert!(check("{% if %}").is_err());
        assert!(check("Hello {{ contact.email }}").is_ok());
    }

    #[test]
    fn an_error_names_its_line_and_a_missing_input_value_is_told_apart() {
        let cases = [
            ("a\nb {% if %}", json!({}), Some(2)),
            ("a\nb\n<p>{{ contact.nope }}</p>", json!({"contact": {}}), Some(3)),
            ("x\n\n{{ confirmUrl }}", json!({"contact": {}}), Some(3)),
            ("x\n{{ a | divided_by: 0 }}", json!({"a": 1}), Some(2)),
            ("x\ny\n{% render 'nope' %}", json!({}), Some(3)),
        ];
        for (source, context, line) in cases {
            let error = render(&Sources::plain(source, "", ""), &context).err().unwrap_or_default();
            assert_eq!(line_of(source, &error), line, "{source:?}: {error}");
            assert!(!is_missing_under(&error, "input"), "{error}");
        }
        let error =
            render(&Sources::plain("{{ input.plan }}", "", ""), &json!({"input": {}})).err().unwrap_or_default();
        assert!(is_missing_under(&error, "input"), "{error}");
    }

    #[test]
    fn partials_are_named_in_quotes_and_found_in_every_tag_form() {
        let source = "{% render 'a' %}{%- render \"b\", x: 1 -%}{%render 'c' for items as i%}{% include 'd' %}\
                      {% if x %}{% endif %}{{ 'render' }}";
        assert_eq!(partials_named(source), Ok(vec!["a".into(), "b".into(), "c".into(), "d".into()]));
        assert!(partials_named("{% render name %}").is_err());
        assert!(partials_named("{%- include some_var -%}").is_err());
    }

    #[test]
    fn partials_render_in_their_own_scope_and_a_layout_holds_the_body() {
        let partials = |flavor: &str, greeting: &str| Partials {
            key: format!("test-{flavor}-{greeting}"),
            sources: vec![("greeting".into(), greeting.into())],
        };
        let (html, text) = (partials("html", "<b>Hello {{ name }}</b>"), partials("text", "Hello {{ name }}"));
        let sources = Sources {
            subject: "{% render 'greeting', name: contact.firstName %}",
            html: "{% render 'greeting', name: contact.firstName %}<p>{{ contact.plan }}</p>",
            text: "{% render 'greeting', name: contact.firstName %} / {{ contact.plan }}",
            layout: Some(("<main>{{ content }}</main>", "== {{ content }} ==")),
            html_partials: &html,
            text_partials: &text,
        };
        let context = json!({"contact": {"firstName": "<Ada>", "plan": "pro"}});
        let rendered = render(&sources, &context).expect("renders");
        assert_eq!(rendered.subject, "Hello <Ada>");
        assert_eq!(rendered.html, "<main><b>Hello &lt;Ada&gt;</b><p>pro</p></main>");
        assert_eq!(rendered.text, "== Hello <Ada> / pro ==");
        // Isolated: a partial does not see the template's variables.
        let leaky = Partials { key: "test-leaky".into(), sources: vec![("leaky".into(), "{{ contact.plan }}".into())] };
        let sources = Sources { html: "{% render 'leaky' %}", html_partials: &leaky, layout: None, ..sources };
        let error = render(&sources, &context).err().unwrap_or_default();
        assert!(error.contains("contact"), "{error}");
    }

    #[test]
    fn a_subject_never_carries_a_line_break() {
        let rendered =
            render(&Sources::plain("{{ a }}", "", ""), &json!({"a": "x\r\nBcc: y@example.com"})).expect("renders");
        assert_eq!(rendered.subject, "x  Bcc: y@example.com");
    }
}
