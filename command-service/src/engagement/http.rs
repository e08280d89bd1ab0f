//! `GET /emails/{emailId}/click?url=…&sig=…` and `GET /emails/{emailId}/open?sig=…` (and
//! `HEAD`): public, no API key and no request limiter; the tenant is the email's.
//!
//! Checks, in order: the link's signature (a link the system did not issue, or one changed in
//! any way, is 404 `link_not_found` and never redirects: a page for a browser), the email and
//! its recipient (an unknown email or an erased contact: nothing to record, answered as if
//! recorded, since the signature proves the link is the system's), then the append. A click
//! is answered `302 Found` to its target, an open with a transparent 1×1 GIF, each only once
//! `EmailClicked` or `EmailOpened` is in the log; when it cannot be stored the answer is 503
//! and the person may try again.

use actix_web::http::Method;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, web};
use domain::engagement::Request;
use mail::tracking::Checked;
use platform::error::{ApiError, Code};
use platform::events::LogEvent;
use platform::log::{AppendError, AppendRequest, ExpectedVersion, NewEvent, StreamAppend};
use platform::proto;

use super::decide::{self, History};
use super::store;
use crate::State;

/// A transparent 1×1 GIF.
const PIXEL: &[u8] = b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00\x00\x00\x00,\
\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;";

/// How often a click or an open is decided again when another one of the same email was
/// appended first; then it is appended after whatever is there, as a repeated one.
const ATTEMPTS: usize = 8;

/// What was fetched.
enum Fetched<'a> {
    Open,
    Click { url: &'a str },
}

#[tracing::instrument(skip_all, fields(email = %path.as_str()))]
pub async fn click(path: web::Path<String>, state: web::Data<State>, req: HttpRequest) -> HttpResponse {
    let browser = api::pages::wants_html(&req, false);
    let email_id = path.into_inner();
    let query = api::query::query_pairs(&req);
    let url = api::query::query_value(&query, "url").unwrap_or_default();
    let signature = api::query::query_value(&query, "sig").unwrap_or_default();
    if state.site.links.verify_click(&email_id, url, signature) != Checked::Valid {
        return api::pages::answer(browser, Err(forged()));
    }
    let result = record(&state, &req, &email_id, Fetched::Click { url }).await.map(|()| {
        HttpResponse::Found()
            .insert_header((header::LOCATION, mail::tracking::redirect_location(url)))
            .insert_header((header::CACHE_CONTROL, HeaderValue::from_static("no-store")))
            // The target does not learn the tracking link (the email's id and signature).
            .insert_header((header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")))
            .finish()
    });
    api::pages::answer(browser, result)
}

#[tracing::instrument(skip_all, fields(email = %path.as_str()))]
pub async fn open(path: web::Path<String>, state: web::Data<State>, req: HttpRequest) -> HttpResponse {
    let email_id = path.into_inner();
    let query = api::query::query_pairs(&req);
    let signature = api::query::query_value(&query, "sig").unwrap_or_default();
    if state.site.links.verify_open(&email_id, signature) != Checked::Valid {
        return api::pages::answer(false, Err(forged()));
    }
    match record(&state, &req, &email_id, Fetched::Open).await {
        Ok(()) => HttpResponse::Ok()
            .content_type("image/gif")
            .insert_header((header::CACHE_CONTROL, HeaderValue::from_static("no-store, private")))
            .body(PIXEL),
        Err(error) => api::pages::answer(false, Err(error)),
    }
}

fn forged() -> ApiError {
    ApiError::not_found(Code::LinkNotFound, "this link was not issued by this service, or was changed")
}

/// Appends the click or the open to the email's stream, decided on the stream as it is.
async fn record(state: &State, req: &HttpRequest, email_id: &str, fetched: Fetched<'_>) -> Result<(), ApiError> {
    let forwarded = req.headers().get("x-forwarded-for").and_then(|value| value.to_str().ok());
    let peer = req.peer_addr().map(|address| address.ip());
    let request = Request {
        head: req.method() == Method::HEAD,
        user_agent: req.headers().get(header::USER_AGENT).and_then(|value| value.to_str().ok()),
        client: crate::forms::decide::client_ip(peer, forwarded, &state.settings.http.trusted_proxies),
    };
    let link_id = match &fetched {
        Fetched::Click { url } => platform::crypto::keyed_digest("tracking-link", url)?[..32].to_owned(),
        Fetched::Open => String::new(),
    };
    for attempt in 0..=ATTEMPTS {
        let client = state.pool.get().await?;
        let Some(history) = store::history(&client, email_id).await? else { return Ok(()) };
        let Some(key) = store::contact_key(&client, &history.contact_id).await? else { return Ok(()) };
        drop(client);
        let now = platform::time::now_millis();
        let last = attempt == ATTEMPTS;
        let (event, kind, machine) = match &fetched {
            Fetched::Open => {
                let verdict = decide::open(&history, &request);
                let event = LogEvent::EmailOpened(proto::EmailOpened {
                    email_id: email_id.to_owned(),
                    space_id: history.space_id.clone(),
                    contact_id: history.contact_id.clone(),
                    first: verdict.first && !last,
                    machine: verdict.machine.to_owned(),
                    at_ms: now,
                    source: Some(history.source.clone()),
                });
                (event, "open", verdict.machine)
            }
            Fetched::Click { url } => {
                let verdict = decide::click(&history, &link_id, &request, now);
                let mut link =
                    platform::events::seal(&history.contact_id, &proto::ClickedLink { url: (*url).to_owned() });
                platform::events::encrypt(&mut link, &key)?;
                let event = LogEvent::EmailClicked(proto::EmailClicked {
                    email_id: email_id.to_owned(),
                    space_id: history.space_id.clone(),
                    contact_id: history.contact_id.clone(),
                    link: Some(link),
                    link_id: link_id.clone(),
                    first: verdict.first && !last,
                    machine: verdict.machine.to_owned(),
                    at_ms: now,
                    source: Some(history.source.clone()),
                });
                (event, "click", verdict.machine)
            }
        };
        let expected = if last { ExpectedVersion::Any } else { ExpectedVersion::Exactly(history.version) };
        match append(state, (email_id, &history), expected, event, now).await {
            Err(AppendError::WrongVersion { .. }) if !last => continue,
            Err(error) => return Err(crate::edge::append_error(error)),
            Ok(()) => {
                let signal = if machine.is_empty() { "none" } else { machine };
                metrics::counter!("email_engagement_total", "kind" => kind, "signal" => signal).increment(1);
                return Ok(());
            }
        }
    }
    Ok(())
}

async fn append(
    state: &State,
    (email_id, history): (&str, &History),
    expected: ExpectedVersion,
    event: LogEvent,
    now: i64,
) -> Result<(), AppendError> {
    let stream = StreamAppend {
        stream_id: domain::email::stream_id(email_id),
        expected,
        events: vec![NewEvent {
            event,
            subject_id: Some(history.contact_id.clone()),
            occurred_at: platform::time::from_millis(now),
        }],
    };
    state.event_log.append(AppendRequest::in_space(&history.space_id, vec![stream], Vec::new())).await?;
    Ok(())
}
