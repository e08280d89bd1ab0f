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

use std::collections::BTreeMap;

use actix_web::{HttpRequest, HttpResponse, web};
use domain::email::page_text::PageText;
use domain::email::resources::TopicDef;
use platform::error::ApiError;
use platform::events::LogEvent;
use platform::proto;

use super::consent::load_email_consent;
use super::decide::{Email, PageFacts, Refusal, Unsubscribe};
use crate::State;
use crate::decision::Outcome;
use crate::pipeline::{self, Actor, Command, Ctx, Decided, Protection, Shell};

/// The email's stream, folded; `None` for an unknown email.
pub(crate) async fn load(ctx: &Ctx<'_>, email_id: &str) -> Result<Option<Email>, ApiError> {
    let client = ctx.db().await?;
    let events = platform::log::read_streams(&client, &[domain::email::stream_id(email_id)]).await?;
    let mut found: Option<Email> = None;
    for stored in events {
        let event = stored.decode().map_err(ApiError::from)?;
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

impl PageFacts {
    /// The facts of `scheduled` a page names, in the words of the locale the email was
    /// written in: [`PageFacts::with_topics`] after reading the space's topics.
    pub(crate) async fn load(ctx: &Ctx<'_>, scheduled: &proto::EmailScheduled) -> Result<Self, ApiError> {
        let catalog = ctx.catalog().await?;
        let topics =
            reads::email::topics(&ctx.db().await?, &catalog, &scheduled.space_id).await.map_err(ApiError::from)?;
        Self::with_topics(ctx, scheduled, &topics).await
    }

    /// The facts of `scheduled` a page names, the space's `topics` given (catalog reads of
    /// its page text and the sender, and a key read).
    pub(crate) async fn with_topics(
        ctx: &Ctx<'_>,
        scheduled: &proto::EmailScheduled,
        topics: &[(String, TopicDef)],
    ) -> Result<Self, ApiError> {
        let catalog = ctx.catalog().await?;
        let client = ctx.db().await?;
        let page_text =
            reads::email::page_text(&client, &catalog, &scheduled.space_id).await.map_err(ApiError::from)?;
        let text = PageText::of(&page_text, Some(scheduled.locale.as_str()).filter(|tag| !tag.is_empty()));
        let topic_names: BTreeMap<String, String> =
            topics.iter().map(|(topic_id, topic)| (topic_id.clone(), text.topic(topic).0.to_owned())).collect();
        let (sender, address) = reads::email::parties(&client, &catalog, scheduled).await.map_err(ApiError::from)?;
        Ok(Self {
            topic_name: topic_names.get(&scheduled.topic_id).cloned(),
            topic_names,
            sender,
            recipient: address.as_deref().map(api::pages::mask_address),
            text,
        })
    }
}

impl Command for Unsubscribe {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let Some(email) = load(ctx, &self.email_id).await? else { return Ok(None) };
        let scheduled = &email.scheduled;
        let consent = match (email.unsubscribed, scheduled.topic_id.is_empty()) {
            (false, true) => load_email_consent(ctx, (&scheduled.space_id, &scheduled.contact_id), false).await?,
            _ => None,
        };
        let page = match self.browser {
            true => PageFacts::load(ctx, scheduled).await?,
            false => PageFacts::default(),
        };
        Ok(Some((email, consent, page)))
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }

    fn lost_too_often(&self) -> ApiError {
        Refusal::RecipientKeptChanging.into()
    }
}

#[tracing::instrument(skip_all, fields(email = %path.as_str()))]
pub async fn post(path: web::Path<String>, state: web::Data<State>, req: HttpRequest) -> HttpResponse {
    let browser = api::pages::wants_html(&req, false);
    let email_id = path.into_inner();
    let result = if !platform::storable::is_storable(&email_id) || !email_id.starts_with("em_") {
        Err(not_found(&email_id))
    } else {
        pipeline::execute(
            &state,
            &req,
            Actor::Public,
            Protection::Unkeyed,
            Unsubscribe { email_id: email_id.into(), browser },
        )
        .await
    };
    api::pages::answer(browser, result)
}

/// 404 `email_not_found`.
pub(crate) fn not_found(email_id: &str) -> ApiError {
    Refusal::EmailNotFound(email_id.to_owned()).into()
}
