//! `GET /emails/{emailId}/unsubscribe`: what a person sees when they open the unsubscribe
//! link of an email (its footer link, or `List-Unsubscribe` in a mail client): the preference
//! page. One press unsubscribes from the email's topic (a form that POSTs the one-click body
//! to the same URL); below, each topic of the space with the recipient's current choice, to
//! change, and a way to leave everything (both posted to `/emails/{emailId}/preferences`).
//! The GET itself changes nothing, so link scanners that fetch every link never unsubscribe
//! anyone (the lesson behind D7). Public, like the POSTs; an unknown email is 404
//! `email_not_found`, as a page for a browser and as the JSON envelope for an API client.

use actix_web::{HttpRequest, HttpResponse, web};
use api::pages::{Preferences, TopicChoice};
use domain::catalog::CATALOG;
use domain::email::page_text::PageText;
use platform::error::{ApiError, Code};
use platform::events::LogEvent;

use crate::State;

pub(crate) async fn get(req: HttpRequest, path: web::Path<String>, state: web::Data<State>) -> HttpResponse {
    let browser = api::pages::wants_html(&req, false);
    let email_id = path.into_inner();
    if browser && email_id == domain::email::PREVIEW_EMAIL_ID {
        // The link of a preview or a test send: the person is a sender checking their mail.
        let lines = [
            "This is the unsubscribe link of a preview or a test send, which unsubscribes no one.",
            "In an email sent to a contact, it opens the page where the recipient leaves this topic, \
             changes their subscriptions or leaves everything.",
        ];
        return api::pages::Message::success("A preview's unsubscribe link", &lines).response();
    }
    api::pages::answer(browser, page(&email_id, &state).await)
}

async fn page(email_id: &str, state: &State) -> Result<HttpResponse, ApiError> {
    let not_found = || ApiError::of(Code::EmailNotFound, format!("no email {email_id:?}"));
    if !email_id.starts_with("em_") || !platform::storable::is_storable(email_id) {
        return Err(not_found());
    }
    let client = state.pool.get().await?;
    let events = platform::log::read_streams(&client, &[domain::email::stream_id(email_id)]).await?;
    let (mut scheduled, mut unsubscribed) = (None, false);
    for stored in &events {
        match stored.decode().map_err(|error| ApiError::internal(&error))? {
            LogEvent::EmailScheduled(event) => scheduled = Some(event),
            LogEvent::EmailUnsubscribed(_) => unsubscribed = true,
            _ => {}
        }
    }
    let scheduled = scheduled.ok_or_else(not_found)?;
    let catalog = state.read_models.current(&[CATALOG]).await?.schema(CATALOG);
    // A read that fails is the database's failure (503 when it is away), not a defect.
    let topics = reads::email::topics(&client, &catalog, &scheduled.space_id).await.map_err(ApiError::from)?;
    let subscriptions = reads::email::subscriptions(&client, &scheduled.contact_id).await.map_err(ApiError::from)?;
    // Who it is from and to whom it went: the sender's name, the address masked.
    let (sender, address) = reads::email::parties(&client, &catalog, &scheduled).await.map_err(ApiError::from)?;
    let recipient = address.as_deref().map(api::pages::mask_address);
    // The page speaks the language the email was written in.
    let page_text = reads::email::page_text(&client, &catalog, &scheduled.space_id).await.map_err(ApiError::from)?;
    let text = PageText::of(&page_text, Some(scheduled.locale.as_str()).filter(|tag| !tag.is_empty()));
    drop(client);
    let mut choices = Vec::new();
    let mut this_topic = None;
    for (topic_id, topic) in &topics {
        let subscribed = subscriptions.get(topic_id).map(String::as_str) == Some("subscribed");
        let (name, description) = text.topic(topic);
        if *topic_id == scheduled.topic_id {
            this_topic = Some((name.to_owned(), subscribed));
        }
        let (name, description) = (name.to_owned(), description.map(str::to_owned));
        choices.push(TopicChoice { id: topic_id.clone(), name, description, subscribed });
    }
    // Relative to this page's own URL (`…/emails/{emailId}/unsubscribe`), so the forms post
    // to the origin the person is on, whatever proxy is in front.
    // Someone who already left what the one-click button leaves is told so, and not offered
    // the button again: the email's topic, or (for an email without one) marketing email
    // through this very email.
    let (notice, already_left) = match &this_topic {
        Some((name, false)) => (Some(text.fill("preferences.leftTopic", &[("topic", name)])), true),
        Some((_, true)) => (None, false),
        None if unsubscribed => (Some(text.get("preferences.leftMarketing").to_owned()), true),
        None => (None, false),
    };
    Ok(Preferences {
        unsubscribe_action: "unsubscribe".to_owned(),
        preferences_action: "preferences".to_owned(),
        notice,
        already_left,
        this_topic: this_topic.map(|(name, _)| name),
        topics: choices,
        sender,
        recipient,
        text,
    }
    .response())
}
