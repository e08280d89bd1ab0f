//! `POST /emails/{emailId}/unsubscribe`: one-click unsubscribe (RFC 8058, D6). Public: no API
//! key and no request limiter; the tenant is the email's. Mail clients post the form body
//! `List-Unsubscribe=One-Click`; any body (or none) is taken the same way.
//!
//! The recipient leaves the email's topic, or, for an email without a topic, withdraws the
//! marketing consent of the contact (its consent attributes for channel `email` set to
//! false, an ordinary record update that the audit trail shows). Idempotent: a second POST
//! answers the same and changes nothing. Afterwards marketing sends to the contact are
//! refused with `recipient_not_subscribed`. An unknown email is 404 `email_not_found`.
//!
//! A browser (its `Accept` names `text/html`: the button of the preference page) is answered
//! with a page saying what happened, with a link back to the preferences; a mail client's
//! one-click POST gets the JSON it always got.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use domain::email::resources::TOPIC;
use platform::error::{ApiError, Code};
use platform::events::LogEvent;
use platform::log::{ExpectedVersion, NewEvent, StreamAppend};
use platform::proto;
use serde_json::json;

use super::consent::{Source, set_email_consent, subscription_changes};
use crate::State;
use crate::pipeline::{self, Actor, Answer, Ctx, Decided, Decision, Given, Legacy, Protection};
use crate::records::write::Write;

/// What the email's stream says.
pub(crate) struct Email {
    pub version: i64,
    pub scheduled: proto::EmailScheduled,
    pub unsubscribed: bool,
}

/// The email's stream, folded; `None` for an unknown email.
pub(crate) async fn load(ctx: &Ctx<'_>, email_id: &str) -> Result<Option<Email>, ApiError> {
    let client = ctx.db().await?;
    let events = platform::log::read_streams(&client, &[domain::email::stream_id(email_id)]).await?;
    let mut found: Option<Email> = None;
    for stored in events {
        let event = stored.decode().map_err(|error| ApiError::internal(&error))?;
        match (event, found.as_mut()) {
            (LogEvent::EmailScheduled(scheduled), _) => {
                found = Some(Email { version: stored.stream_version, scheduled, unsubscribed: false });
            }
            (LogEvent::EmailUnsubscribed(_), Some(email)) => {
                email.unsubscribed = true;
                email.version = stored.stream_version;
            }
            (_, Some(email)) => email.version = stored.stream_version,
            _ => {}
        }
    }
    Ok(found)
}

/// What the page after an unsubscription names: the email's topic, its sender and the
/// address it went to (masked).
#[derive(Default)]
pub(crate) struct PageFacts {
    pub topic_name: Option<String>,
    pub sender: Option<String>,
    pub recipient: Option<String>,
}

impl PageFacts {
    /// The facts of `scheduled` a page names (one catalog read and one key read).
    pub(crate) async fn load(ctx: &Ctx<'_>, scheduled: &proto::EmailScheduled) -> Result<Self, ApiError> {
        let topic_name = match scheduled.topic_id.is_empty() {
            true => None,
            false => topic_name(ctx, &scheduled.topic_id).await?,
        };
        let catalog = ctx.catalog().await?;
        let (sender, address) = reads::email::parties(&ctx.db().await?, &catalog, scheduled)
            .await
            .map_err(|error| ApiError::internal(&error))?;
        Ok(Self { topic_name, sender, recipient: address.as_deref().map(api::pages::mask_address) })
    }

    /// "Email from S to a***@example.com." when either is known.
    pub(crate) fn parties_line(&self) -> Option<String> {
        match (&self.sender, &self.recipient) {
            (None, None) => None,
            (Some(sender), Some(recipient)) => Some(format!("Email from {sender} to {recipient}.")),
            (Some(sender), None) => Some(format!("Email from {sender}.")),
            (None, Some(recipient)) => Some(format!("Email to {recipient}.")),
        }
    }
}

fn answer(email_id: &str, topic_id: &str, page: Option<&PageFacts>) -> Answer {
    let topic = (!topic_id.is_empty()).then_some(topic_id);
    if let Some(facts) = page {
        let text = match &facts.topic_name {
            Some(name) => format!("You will no longer receive emails about {name}."),
            None => "You will no longer receive marketing email from us.".to_owned(),
        };
        let parties = facts.parties_line();
        let lines: Vec<&str> = parties.iter().map(String::as_str).chain([text.as_str()]).collect();
        let message = api::pages::Message::success("You are unsubscribed", &lines)
            .with_link("unsubscribe", "Change your other email preferences");
        return Answer::html(StatusCode::OK, message.page());
    }
    Answer::json(
        StatusCode::OK,
        json!({ "data": {
            "emailId": email_id,
            "unsubscribed": true,
            "scope": if topic.is_some() { "topic" } else { "marketing" },
            "topicId": topic,
        }}),
    )
}

struct Unsubscribe {
    email_id: String,
    /// Answer a page (a browser), not JSON.
    browser: bool,
}

impl Unsubscribe {
    /// The answer: for a browser a page naming the topic left, the sender and the address.
    fn answer(&self, topic_id: &str, page: &PageFacts) -> Answer {
        answer(&self.email_id, topic_id, self.browser.then_some(page))
    }
}

impl Legacy for Unsubscribe {
    /// The email, (for an email without a topic) the contact's consent withdrawn, and what a
    /// page names.
    type Loaded = (Email, Option<Write>, PageFacts);

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let Some(email) = load(ctx, &self.email_id).await? else { return Err(not_found(&self.email_id)) };
        let scheduled = &email.scheduled;
        let consent = match (email.unsubscribed, scheduled.topic_id.is_empty()) {
            (false, true) => {
                let now = platform::time::now_millis();
                let source = Source { kind: "unsubscribe", id: &self.email_id };
                set_email_consent(ctx, (&scheduled.space_id, &scheduled.contact_id), false, source, now).await?
            }
            _ => None,
        };
        let page = match self.browser {
            true => PageFacts::load(ctx, scheduled).await?,
            false => PageFacts::default(),
        };
        Ok((email, consent, page))
    }

    fn decide(&self, (email, consent, page): Self::Loaded, given: &Given<'_>) -> Result<Decided, ApiError> {
        let (email_id, scheduled, now) = (&self.email_id, &email.scheduled, given.now_ms);
        if email.unsubscribed {
            return Ok(Decided::Answer(self.answer(&scheduled.topic_id, &page)));
        }
        let mut streams = Vec::new();
        let mut guards = Vec::new();
        if let Some(write) = consent {
            streams.push(write.stream);
            guards.extend(write.guards);
        }
        if !scheduled.topic_id.is_empty() {
            let topics = [&scheduled.topic_id];
            let source = Source { kind: "unsubscribe", id: email_id };
            let parties = (scheduled.space_id.as_str(), scheduled.contact_id.as_str());
            streams.extend(subscription_changes(parties, &topics, "unsubscribed", source, now));
        }
        streams.push(unsubscribed(email_id, &email, now));
        let answer = self.answer(&scheduled.topic_id, &page);
        Ok(Decided::Append(Decision::new(streams, guards, answer).in_space(&scheduled.space_id)))
    }

    fn lost_too_often(&self) -> ApiError {
        ApiError::conflict(Code::ConcurrentModification, "the email's recipient kept changing; retry")
    }
}

/// The email's `EmailUnsubscribed`: an opt-out made through it (the one-click link, or the
/// preference page), appended at the email's version so it is recorded once.
pub(crate) fn unsubscribed(email_id: &str, email: &Email, now: i64) -> StreamAppend {
    let scheduled = &email.scheduled;
    let unsubscribed = proto::EmailUnsubscribed {
        email_id: email_id.to_owned(),
        space_id: scheduled.space_id.clone(),
        contact_id: scheduled.contact_id.clone(),
        topic_id: scheduled.topic_id.clone(),
        at_ms: now,
    };
    StreamAppend {
        stream_id: domain::email::stream_id(email_id),
        expected: ExpectedVersion::Exactly(email.version),
        events: vec![NewEvent {
            event: LogEvent::EmailUnsubscribed(unsubscribed),
            subject_id: Some(scheduled.contact_id.clone()),
            occurred_at: platform::time::from_millis(now),
        }],
    }
}

/// The name of a topic, for a page (`None` when the catalog no longer has it).
pub(crate) async fn topic_name(ctx: &Ctx<'_>, topic_id: &str) -> Result<Option<String>, ApiError> {
    let catalog = ctx.catalog().await?;
    let found = reads::catalog::resource_by_id(&ctx.db().await?, &catalog, TOPIC, topic_id).await?;
    Ok(found.and_then(|(_, _, definition)| definition.get("name").and_then(|name| name.as_str()).map(str::to_owned)))
}

#[tracing::instrument(skip_all, fields(email = %path.as_str()))]
pub async fn post(path: web::Path<String>, state: web::Data<State>, req: HttpRequest) -> HttpResponse {
    let browser = api::pages::wants_html(&req, false);
    let email_id = path.into_inner();
    let result = if !platform::storable::is_storable(&email_id) || !email_id.starts_with("em_") {
        Err(not_found(&email_id))
    } else {
        pipeline::execute(&state, &req, Actor::Public, Protection::Unkeyed, Unsubscribe { email_id, browser }).await
    };
    api::pages::answer(browser, result)
}

pub(crate) fn not_found(email_id: &str) -> ApiError {
    ApiError::not_found(Code::EmailNotFound, format!("no email {email_id:?}"))
}
