//! `POST /emails/{emailId}/preferences`: the recipient's choices from the preference page
//! (the page behind the email's unsubscribe link). Public like the unsubscribe link: the
//! email id, only ever sent to its recipient, names the contact and the space.
//!
//! Two choices: each topic of the space subscribed or not, or everything left (every topic
//! unsubscribed and the marketing consent withdrawn). Each change is a logged
//! `SubscriptionChanged` with source `preferences` (and a consent change a record update
//! carried by the email), so the audit trail shows it. Leaving the email's topic, or
//! everything, is an opt-out through the email as the one-click link's is (D11): the email's
//! `EmailUnsubscribed`, once, which its run's or step's count and `email.unsubscribed` follow. Subscribing to a topic from the page also grants
//! the email consent the contact had withdrawn: it is the recipient's own, explicit choice.
//! A choice that changes nothing writes nothing and answers the same.
//!
//! Body: JSON `{"topics": {"top_…": "subscribed" | "unsubscribed"}}` or
//! `{"unsubscribeAll": true}`; or what the page posts, urlencoded: `action=save` with one
//! `top_…=subscribed|unsubscribed` per topic, or `action=unsubscribe_all`. The page's post is
//! answered with a page, JSON with JSON.

use std::collections::BTreeMap;

use actix_web::{HttpRequest, HttpResponse, web};
use platform::error::ApiError;

use super::consent::load_email_consent;
use super::decide::{ChangePreferences, PageFacts, Preferences, Refusal, parse};
use super::unsubscribe;
use crate::State;
use crate::decision::Outcome;
use crate::pipeline::{self, Actor, Command, Ctx, Decided, Protection, Shell};

impl Command for ChangePreferences {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Option<Preferences>, ApiError> {
        let Some(email) = unsubscribe::load(ctx, &self.email_id).await? else { return Ok(None) };
        let (space_id, contact_id) = (&email.scheduled.space_id, &email.scheduled.contact_id);
        let catalog = ctx.catalog().await?;
        let client = ctx.db().await?;
        let defined = reads::email::topics(&client, &catalog, space_id).await.map_err(ApiError::from)?;
        let topics: BTreeMap<String, String> =
            defined.iter().map(|(topic_id, topic)| (topic_id.clone(), topic.name.clone())).collect();
        let subscribed = reads::email::subscriptions(&client, contact_id).await.map_err(ApiError::from)?;
        drop(client);
        // A choice naming a topic the space lacks is refused: its consent is not read.
        let consent = match self.choice.consent().filter(|_| self.choice.unknown_topics(&topics).is_empty()) {
            Some(consented) => load_email_consent(ctx, (space_id, contact_id), consented).await?,
            None => None,
        };
        let page = match self.browser {
            true => PageFacts::with_topics(ctx, &email.scheduled, &defined).await?,
            false => PageFacts::default(),
        };
        Ok(Some(Preferences { email, topics, subscribed, consent, page }))
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }

    fn lost_too_often(&self) -> ApiError {
        Refusal::PreferencesKeptChanging.into()
    }
}

#[tracing::instrument(skip_all, fields(email = %path.as_str()))]
pub async fn post(
    path: web::Path<String>,
    state: web::Data<State>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    let urlencoded = api::http::is_urlencoded(&req);
    let browser = api::pages::wants_html(&req, urlencoded);
    let email_id = path.into_inner();
    let result = async {
        if !platform::storable::is_storable(&email_id) || !email_id.starts_with("em_") {
            return Err(unsubscribe::not_found(&email_id));
        }
        let (fields, urlencoded) = api::http::read_form_or_json(&req, payload).await?;
        let choice = parse(&fields, urlencoded)?;
        let command = ChangePreferences { email_id: email_id.into(), choice, browser };
        pipeline::execute(&state, &req, Actor::Public, Protection::Unkeyed, command).await
    }
    .await;
    api::pages::answer(browser, result)
}
