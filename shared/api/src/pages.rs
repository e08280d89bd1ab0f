//! Pages a person sees. The public endpoints (the unsubscribe link and its preference page,
//! form submissions and their confirmation links) are opened by people in browsers and mail
//! clients, not only by API clients: a browser gets a small, accessible HTML page for every
//! answer, success or error, and an API client the JSON envelope. Pages are rendered from the
//! templates in `shared/api/pages/` (MiniJinja, every value escaped) and served under a
//! Content-Security-Policy that allows only their one inline style sheet and form posts to
//! this origin.

use std::sync::LazyLock;

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, HttpResponseBuilder};
use base64::Engine;
use serde::Serialize;
use sha2::Digest;

use platform::error::{ApiError, Code};

use domain::email::page_text::PageText;

const STYLE: &str = include_str!("../pages/style.css");

static TEMPLATES: LazyLock<minijinja::Environment<'static>> = LazyLock::new(|| {
    let mut environment = minijinja::Environment::new();
    for (name, source) in [
        ("base.html", include_str!("../pages/base.html")),
        ("message.html", include_str!("../pages/message.html")),
        ("preferences.html", include_str!("../pages/preferences.html")),
    ] {
        // The templates are part of the binary; a syntax error in one fails the unit tests.
        if let Err(error) = environment.add_template(name, source) {
            tracing::error!(template = name, error = %error, "a page template does not parse");
        }
    }
    environment
});

/// The Content-Security-Policy of every page: nothing loads, scripts never run, the one
/// inline style sheet is allowed by its hash, and forms post only to this origin.
static POLICY: LazyLock<String> = LazyLock::new(|| {
    let hash = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(STYLE.as_bytes()));
    format!(
        "default-src 'none'; style-src 'sha256-{hash}'; img-src 'self'; form-action 'self'; \
         base-uri 'none'; frame-ancestors 'none'"
    )
});

/// Whether the request is a browser's: its `Accept` names `text/html` (a navigation or a
/// form post from a page), or it is a form post from one of our pages. A mail client's
/// RFC 8058 one-click POST names neither and keeps its JSON.
pub fn wants_html(req: &HttpRequest, from_our_page: bool) -> bool {
    from_our_page || req.headers().get(header::ACCEPT).and_then(|value| value.to_str().ok()).is_some_and(accepts_html)
}

/// Whether an `Accept` value prefers HTML to JSON: it names `text/html` with a quality above
/// zero, and `application/json` (if named) with no higher quality.
fn accepts_html(accept: &str) -> bool {
    let quality_of = |wanted: &str| {
        accept.split(',').find_map(|part| {
            let mut pieces = part.split(';').map(str::trim);
            let media = pieces.next()?.to_ascii_lowercase();
            (media == wanted).then(|| {
                pieces
                    .find_map(|piece| piece.strip_prefix("q=").and_then(|q| q.trim().parse::<f32>().ok()))
                    .unwrap_or(1.0)
            })
        })
    };
    match (quality_of("text/html"), quality_of("application/json")) {
        (Some(html), Some(json)) => html > 0.0 && html >= json,
        (Some(html), None) => html > 0.0,
        (None, _) => false,
    }
}

/// A link on a page.
#[derive(Debug, Clone, Serialize)]
pub struct Link {
    pub href: String,
    pub text: String,
}

/// One problem with what a person sent, named by its field.
#[derive(Debug, Clone, Serialize)]
struct PageIssue {
    field: Option<String>,
    message: String,
}

/// A page that tells a person what happened: a title, a few sentences and perhaps a link.
#[derive(Debug, Clone)]
pub struct Message {
    pub status: StatusCode,
    pub title: String,
    pub paragraphs: Vec<String>,
    pub link: Option<Link>,
    issues: Vec<PageIssue>,
    /// The language the page is in (`<html lang>`) and its direction.
    lang: String,
    dir: &'static str,
}

impl Message {
    /// A success page.
    pub fn success(title: impl Into<String>, paragraphs: &[&str]) -> Self {
        Self {
            status: StatusCode::OK,
            title: title.into(),
            paragraphs: paragraphs.iter().map(|text| (*text).to_owned()).collect(),
            link: None,
            issues: Vec::new(),
            lang: PageText::default().lang().to_owned(),
            dir: PageText::default().dir(),
        }
    }

    /// The page says it is in the language of `text` (which its sentences came from).
    pub fn in_language_of(mut self, text: &PageText) -> Self {
        self.lang = text.lang().to_owned();
        self.dir = text.dir();
        self
    }

    pub fn with_link(mut self, href: impl Into<String>, text: impl Into<String>) -> Self {
        self.link = Some(Link { href: href.into(), text: text.into() });
        self
    }

    /// What a person is told for an error: the same status as the API's answer, in words
    /// that suit a person rather than a program, naming each field that was wrong.
    pub(crate) fn for_error(error: &ApiError) -> Self {
        let (title, text): (&str, String) = match (error.status(), error.code()) {
            (_, Some(Code::EmailNotFound | Code::LinkNotFound)) => (
                "Link not found",
                "This link is not valid. It may have been cut off by your mail program: \
                 open it again from the email, or copy the whole address."
                    .to_owned(),
            ),
            (_, Some(Code::ConfirmationNotFound)) => (
                "Link not valid",
                "This confirmation link is not valid. It may have been cut off by your mail program: \
                 open it again from the email, or submit the form again to get a new one."
                    .to_owned(),
            ),
            (_, Some(Code::ConfirmationExpired)) => (
                "Link expired",
                "This confirmation link has expired. Submit the form again to get a new one.".to_owned(),
            ),
            (_, Some(Code::RouteNotFound)) => (
                "Page not found",
                "There is nothing at this address. If you followed a link from an email, it may have \
                 been cut off by your mail program: open it again from the email, or copy the whole address."
                    .to_owned(),
            ),
            (_, Some(Code::MethodNotAllowed)) => {
                ("Page not available", "This address cannot be opened this way.".to_owned())
            }
            (_, Some(Code::FormNotFound)) => ("Form not found", "This form does not exist (any more).".to_owned()),
            (_, Some(Code::FormDisabled)) => ("Form closed", "This form is not accepting submissions.".to_owned()),
            (StatusCode::TOO_MANY_REQUESTS, _) => {
                ("Too many attempts", "Too many attempts in a short time. Wait a minute, then try again.".to_owned())
            }
            (status, _) if status.is_server_error() => {
                ("Something went wrong", "We could not do this just now. Please try again in a moment.".to_owned())
            }
            (StatusCode::BAD_REQUEST, _) if !error.issues().is_empty() => {
                ("Please check what you sent", "Some of what you sent could not be used:".to_owned())
            }
            (StatusCode::UNSUPPORTED_MEDIA_TYPE | StatusCode::PAYLOAD_TOO_LARGE, _) => {
                ("Could not read the form", sentence(error.message()))
            }
            _ => ("Something is not right", sentence(error.message())),
        };
        let issues = error
            .issues()
            .iter()
            .map(|issue| PageIssue { field: issue.key.clone(), message: sentence(&issue.message) })
            .collect();
        Self {
            status: error.status(),
            title: title.to_owned(),
            paragraphs: vec![text],
            link: None,
            issues,
            lang: PageText::default().lang().to_owned(),
            dir: PageText::default().dir(),
        }
    }

    /// The page as HTML.
    pub fn page(&self) -> String {
        let tone = if self.status.is_success() { "success" } else { "error" };
        render(
            "message.html",
            minijinja::context! {
                title => &self.title,
                tone => tone,
                paragraphs => &self.paragraphs,
                issues => minijinja::Value::from(minijinja::value::Serde(&self.issues)),
                link => minijinja::Value::from(minijinja::value::Serde(&self.link)),
                lang => &self.lang,
                dir => self.dir,
            },
        )
    }

    pub fn response(&self) -> HttpResponse {
        respond(HttpResponse::build(self.status), self.page())
    }
}

/// A topic on the preference page, with the recipient's current choice.
#[derive(Debug, Clone, Serialize)]
pub struct TopicChoice {
    pub id: String,
    pub name: String,
    pub description: Option<String>,
    pub subscribed: bool,
}

/// The preference page of one email: a one-press unsubscribe from the email's topic (or from
/// marketing email when it has none), a choice per topic of the space, and a way to leave all.
#[derive(Debug, Clone)]
pub struct Preferences {
    /// The email's own unsubscribe URL (the one-click POST).
    pub unsubscribe_action: String,
    /// Where the choices are posted.
    pub preferences_action: String,
    /// The name of the email's topic, when it has one.
    pub this_topic: Option<String>,
    /// The recipient already left what the one-click button leaves (the email's topic, or for
    /// an email without one, marketing email through it): the button is not offered again.
    pub already_left: bool,
    pub topics: Vec<TopicChoice>,
    /// A line at the top (for example after everything was left).
    pub notice: Option<String>,
    /// Who sent the email (the sender's name), when the catalog still has it.
    pub sender: Option<String>,
    /// The address the email went to, masked ([`mask_address`]); `None` once erased.
    pub recipient: Option<String>,
    /// The words of the page, in the recipient's locale (topics come named in it).
    pub text: PageText,
}

/// An address as a page shows it to whoever holds the link: its first character, `***`, and
/// its domain (`a***@example.com`), so a forwarded link does not spell out the address.
pub fn mask_address(address: &str) -> String {
    match address.rsplit_once('@') {
        Some((local, domain)) => {
            let first: String = local.chars().take(1).collect();
            format!("{first}***@{domain}")
        }
        None => "***".to_owned(),
    }
}

impl Preferences {
    pub fn response(&self) -> HttpResponse {
        respond(HttpResponse::build(StatusCode::OK), self.page())
    }

    /// The page's HTML.
    fn page(&self) -> String {
        let text = &self.text;
        let words: std::collections::BTreeMap<&str, &str> =
            domain::email::page_text::ENTRIES.iter().map(|entry| (entry.key, text.get(entry.key))).collect();
        let topic = |key: &str| self.this_topic.as_deref().map(|name| text.fill(key, &[("topic", name)]));
        render(
            "preferences.html",
            minijinja::context! {
                title => text.get("preferences.title"),
                t => minijinja::Value::from(minijinja::value::Serde(&words)),
                lang => text.lang(),
                dir => text.dir(),
                unsubscribe_action => &self.unsubscribe_action,
                preferences_action => &self.preferences_action,
                this_topic_line => topic("preferences.thisTopic"),
                leave_topic => topic("preferences.leaveTopic"),
                already_left => self.already_left,
                topics => minijinja::Value::from(minijinja::value::Serde(&self.topics)),
                notice => &self.notice,
                parties => text.parties(self.sender.as_deref(), self.recipient.as_deref()),
            },
        )
    }
}

/// The answer of a public endpoint: for a browser, an error becomes a page with the same
/// status (and headers, such as `Retry-After`); for an API client, the JSON envelope.
pub fn answer(browser: bool, result: Result<HttpResponse, ApiError>) -> HttpResponse {
    match result {
        Ok(response) => response,
        Err(error) if browser => {
            let mut builder = HttpResponse::build(error.status());
            for (name, value) in error.headers() {
                builder.insert_header((*name, value.as_str()));
            }
            respond(builder, Message::for_error(&error).page())
        }
        Err(error) => crate::envelope::error_response(&error),
    }
}

/// The headers every page carries.
pub fn page_headers(builder: &mut HttpResponseBuilder) -> &mut HttpResponseBuilder {
    builder
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, HeaderValue::from_static("no-store")))
        .insert_header((header::CONTENT_SECURITY_POLICY, POLICY.as_str()))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")))
        .insert_header((header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")))
        .insert_header((header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")))
}

fn respond(mut builder: actix_web::HttpResponseBuilder, page: String) -> HttpResponse {
    page_headers(&mut builder).body(page)
}

fn render(name: &str, context: minijinja::Value) -> String {
    let rendered = TEMPLATES
        .get_template(name)
        .and_then(|template| template.render(minijinja::context! { style => STYLE, ..context }));
    match rendered {
        Ok(page) => page,
        Err(error) => {
            tracing::error!(template = name, error = %error, "a page did not render");
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Error</title></head>\
             <body><h1>Something went wrong</h1><p>Please try again in a moment.</p></body></html>"
                .to_owned()
        }
    }
}

/// An API message as a sentence for a person: capitalised, with a full stop.
fn sentence(message: &str) -> String {
    let mut characters = message.trim().chars();
    let Some(first) = characters.next() else { return String::new() };
    let mut text: String = first.to_uppercase().chain(characters).collect();
    if !text.ends_with(['.', '!', '?']) {
        text.push('.');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use platform::error::Issue;

    #[test]
    fn every_template_parses_and_escapes_what_it_is_given() {
        let page = Message::success("<b>Done</b>", &["a & <script>alert(1)</script>"])
            .with_link("/x?a=1&b=\"2\"", "back")
            .page();
        assert!(page.contains("&lt;b&gt;Done&lt;&#x2f;b&gt;"), "{page}");
        assert!(page.contains("&lt;script&gt;"), "{page}");
        assert!(!page.contains("<script>"), "{page}");
        assert!(page.contains("href=\"&#x2f;x?a=1&amp;b=&quot;2&quot;\""), "{page}");
        let preferences = Preferences {
            unsubscribe_action: "/v1/emails/em_1/unsubscribe".to_owned(),
            preferences_action: "/v1/emails/em_1/preferences".to_owned(),
            this_topic: Some("News <weekly>".to_owned()),
            topics: vec![TopicChoice {
                id: "top_1".to_owned(),
                name: "News <weekly>".to_owned(),
                description: None,
                subscribed: true,
            }],
            notice: None,
            already_left: false,
            sender: Some("Tom & Jerry".to_owned()),
            recipient: Some(mask_address("ada@example.com")),
            text: PageText::default(),
        };
        assert_eq!(preferences.response().status(), StatusCode::OK);
        assert!(preferences.page().contains("Unsubscribe from News &lt;weekly&gt;</button>"));
        // Left already: told so, and the button that would leave again is not offered.
        let left = Preferences {
            notice: Some("You are not subscribed to News.".to_owned()),
            already_left: true,
            ..preferences
        }
        .page();
        assert!(left.contains("You are not subscribed to News."), "{left}");
        assert!(!left.contains("Unsubscribe from News"), "{left}");
        assert!(left.contains("Unsubscribe from all"), "{left}");
    }

    #[test]
    fn an_address_is_masked_to_its_first_character_and_its_domain() {
        assert_eq!(mask_address("ada@example.com"), "a***@example.com");
        assert_eq!(mask_address("\u{e9}lo\u{ef}se@example.com"), "\u{e9}***@example.com");
        assert_eq!(mask_address("@example.com"), "***@example.com");
        assert_eq!(mask_address("nobody"), "***");
    }

    #[test]
    fn the_style_sheet_is_allowed_by_its_hash_and_nothing_else_loads() {
        let page = Message::success("Done", &["ok"]).page();
        let start = page.find("<style>").expect("a style element") + "<style>".len();
        let end = page.find("</style>").expect("its end");
        let hash = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(&page.as_bytes()[start..end]));
        assert!(POLICY.contains(&format!("'sha256-{hash}'")), "{}", *POLICY);
        assert!(POLICY.starts_with("default-src 'none'"));
        assert!(!POLICY.contains("script-src"), "no script may run");
    }

    #[test]
    fn browsers_are_told_apart_from_api_clients_by_accept() {
        let html = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,*/*;q=0.8";
        assert!(accepts_html(html));
        assert!(accepts_html("text/html"));
        assert!(!accepts_html("application/json"));
        assert!(!accepts_html("*/*"));
        assert!(!accepts_html("application/json, text/html;q=0.5"));
        assert!(!accepts_html("text/html;q=0"));
        assert!(accepts_html("application/json;q=0.5, text/html"));
    }

    #[test]
    fn an_error_page_keeps_the_status_and_names_each_field() {
        let error = ApiError::of(Code::InvalidFormSubmission, "the submission is not valid")
            .with_issues(vec![Issue::for_key("email", "email is required")]);
        let message = Message::for_error(&error);
        assert_eq!(message.status, StatusCode::BAD_REQUEST);
        let page = message.page();
        assert!(page.contains("<strong>email</strong>: Email is required."), "{page}");
        let expired = Message::for_error(&ApiError::of(Code::ConfirmationExpired, "x"));
        assert_eq!((expired.status, expired.title.as_str()), (StatusCode::GONE, "Link expired"));
        let limited = ApiError::of(Code::RateLimitExceeded, "slow down")
            .with_header("Retry-After", "Thu, 01 Jan 2099 00:00:00 GMT".to_owned());
        let response = answer(true, Err(limited));
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(response.headers().get("retry-after").is_some());
        assert!(response.headers().get("content-security-policy").is_some());
    }
}
