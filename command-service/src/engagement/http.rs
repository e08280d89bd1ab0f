//! `GET /emails/{emailId}/click?url=…&n=…&sig=…` and `GET /emails/{emailId}/open?sig=…` (and
//! `HEAD`): public, no API key and no request limiter; the tenant is the email's.
//!
//! The link's signature is checked first (a link the system did not issue, or one changed in
//! any way, is 404 `link_not_found` and never redirects: a page for a browser); no database
//! read is needed for that. Then the hit is taken into `engagement_inbox`, one committed
//! `INSERT`, and only then answered: a click with `302 Found` to its target, an open with a
//! transparent 1×1 GIF. When it cannot be stored the answer is 503 and the person may try
//! again. The projector's `engagement` worker appends `EmailClicked` or `EmailOpened` to the
//! email's stream (an unknown email or an erased contact records nothing: the signature
//! proved the link, so it still redirects).

use actix_web::http::Method;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, web};
use mail::tracking::Checked;
use platform::error::ApiError;

use super::decide::{self as signals, Request};
use super::store::Hit;
use crate::State;

/// A transparent 1×1 GIF.
const PIXEL: &[u8] = b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00\x00\x00\x00,\
\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;";

/// What was fetched.
enum Fetched<'a> {
    Open,
    /// A click of `url`, the `position`th tracked link of the email (none in links sent
    /// before positions were numbered).
    Click {
        url: &'a str,
        position: Option<u32>,
    },
}

#[tracing::instrument(skip_all, fields(email = %path.as_str()))]
pub async fn click(path: web::Path<String>, state: web::Data<State>, req: HttpRequest) -> HttpResponse {
    let browser = api::pages::wants_html(&req, false);
    let email_id = path.into_inner();
    let query = api::query::query_pairs(&req);
    let url = api::query::query_value(&query, "url").unwrap_or_default();
    let signature = api::query::query_value(&query, "sig").unwrap_or_default();
    // A position that is not a number is no link this system issued.
    let position = match api::query::query_value(&query, "n").map(str::parse::<u32>) {
        None => None,
        Some(Ok(position)) if position > 0 => Some(position),
        Some(_) => return api::pages::answer(browser, Err(forged())),
    };
    if state.site.links.verify_click(&email_id, url, position, signature) != Checked::Valid {
        return api::pages::answer(browser, Err(forged()));
    }
    let result = record(&state, &req, &email_id, Fetched::Click { url, position }).await.map(|()| {
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
    signals::Forged.into()
}

/// Takes the click or the open in: what the request alone shows of whose it was (its
/// address and user agent are used here and not kept), and a click's target sealed. The
/// `engagement` worker decides the rest against the email's stream (the first of its kind,
/// a scanner's timing, an unknown email or an erased contact: nothing recorded).
async fn record(state: &State, req: &HttpRequest, email_id: &str, fetched: Fetched<'_>) -> Result<(), ApiError> {
    let forwarded = req.headers().get("x-forwarded-for").and_then(|value| value.to_str().ok());
    let peer = req.peer_addr().map(|address| address.ip());
    let request = Request {
        head: req.method() == Method::HEAD,
        user_agent: req.headers().get(header::USER_AGENT).and_then(|value| value.to_str().ok()),
        client: crate::forms::decide::client_ip(peer, forwarded, &state.settings.http.trusted_proxies),
    };
    let (kind, actor, link, link_id, link_position) = match fetched {
        Fetched::Open => ("open", signals::open(&request), None, String::new(), 0),
        Fetched::Click { url, position } => {
            // A link is its position and target: the same target twice in one email is two
            // links, each with its own first click.
            let identity = match position {
                Some(position) => format!("{position} {url}"),
                None => url.to_owned(),
            };
            let link_id = platform::crypto::keyed_digest("tracking-link", &identity)?[..32].to_owned();
            let link = mail::inbox::seal_inbox_link(email_id, url)?;
            ("click", signals::click_request(&request), Some(link), link_id, position.unwrap_or(0))
        }
    };
    let hit = Hit {
        email_id: email_id.to_owned(),
        kind,
        link,
        link_id,
        link_position: link_position as i32,
        signal: actor.signal(),
        at_ms: platform::time::now_millis(),
    };
    state.engagement.take_in(hit).await.map_err(|error| {
        tracing::warn!(%error, "a click or an open could not be taken in");
        ApiError::unavailable("the click or open could not be recorded; retry shortly")
    })
}
