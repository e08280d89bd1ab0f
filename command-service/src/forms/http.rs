//! `POST /forms/{formId}/submit` and `GET /forms/{formId}/confirm/{token}`.
//!
//! A submission (JSON, or `application/x-www-form-urlencoded` as an HTML form posts it) is
//! counted against the contract's limiters (per client address and per form), then upserts
//! the contact by identity precedence. Without double opt-in its topics are subscribed and
//! its email consent granted at once. With double opt-in the subscriptions are `pending` and
//! a confirmation email carries a link with a token (32 random bytes; only its keyed digest
//! is stored, bound to the form, expiring); confirmation emails have limiters of their own.
//! Everything is one append; the confirmation email's hand-off follows it, and the outbox
//! worker finishes it if this process dies first.
//!
//! Following the link confirms: the topics subscribed and the consent granted. Following it
//! again is a success too (D7), until it expires.
//!
//! Answers: JSON `{data: {submissionId, status}}` (`pending_confirmation` or `subscribed`),
//! or, to a urlencoded post, a small HTML page. The link answers an HTML page, or JSON when
//! the request accepts only `application/json`.

use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};
use domain::email::page_text::PageText;
use domain::email::resources::{FORM, FormDef, PageTextDef};
use mail::send;
use platform::error::{ApiError, Code};
use platform::log::AppendError;

use super::decide::{
    self, ConfirmSubmission, Confirmation, ConfirmationEmail, Open, Refusal, Submission, SubmitForm, Submitted,
};
use super::store;
use crate::State;
use crate::decision::Outcome;
use crate::emails::consent::load_email_consent;
use crate::pipeline::{self, Actor, Command, Ctx, Decided, Protection, Refusal as Lost, Shell};
use crate::records::decide::write_schema;
use crate::records::load::{load_upsert, write_context};
use crate::templates::http::load_authored;

/// The form and its space from catalog version `catalog`; 404 `form_not_found` when unknown.
async fn find_form(
    client: &impl deadpool_postgres::GenericClient,
    catalog: &str,
    form_id: &str,
) -> Result<(String, FormDef), ApiError> {
    let not_found = || Refusal::FormNotFound(form_id.to_owned());
    if !form_id.starts_with("frm_") || !platform::storable::is_storable(form_id) {
        return Err(not_found().into());
    }
    let (space_id, _, definition) =
        reads::catalog::resource_by_id(client, catalog, FORM, form_id).await?.ok_or_else(not_found)?;
    let form: FormDef = serde_json::from_value(definition)
        .map_err(|error| ApiError::internal(&anyhow::anyhow!("form {form_id}: {error}")))?;
    Ok((space_id, form))
}

/// The form at the edge (before the limiters count a submission); 404 when unknown, 403
/// `form_disabled` when off.
async fn edge_form(state: &State, form_id: &str) -> Result<(String, FormDef), ApiError> {
    let catalog = pipeline::edge_catalog(state).await?;
    let found = find_form(&state.pool.get().await?, &catalog, form_id).await?;
    if !found.1.enabled {
        return Err(Refusal::Disabled.into());
    }
    Ok(found)
}

/// The form as a command decides on it (its catalog revision guards the append).
async fn load_form(ctx: &Ctx<'_>, form_id: &str) -> Result<(String, FormDef), ApiError> {
    let catalog = ctx.catalog().await?;
    find_form(&ctx.db().await?, &catalog, form_id).await
}

/// The space's page text (its pages' words per locale, and its locale setting).
async fn page_text(ctx: &Ctx<'_>, space_id: &str) -> Result<PageTextDef, ApiError> {
    let catalog = ctx.catalog().await?;
    reads::email::page_text(&ctx.db().await?, &catalog, space_id).await.map_err(ApiError::from)
}

/// Counts one against a limiter; 429 `rate_limit_exceeded` with `Retry-After` when used up.
async fn limit(state: &State, key: &str, allowed: u32, window_seconds: u64, what: &str) -> Result<(), ApiError> {
    let client = state.pool.get().await?;
    let window = Duration::from_secs(window_seconds);
    match api::ratelimit::take_one(&client, key, allowed, window).await? {
        Ok(()) => Ok(()),
        Err(reset) => Err(Refusal::RateLimited {
            what: what.to_owned(),
            allowed,
            window_seconds,
            retry_after: httpdate::fmt_http_date(reset.into()),
        }
        .into()),
    }
}

impl Command for SubmitForm<'_> {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Submission, ApiError> {
        let form_id = &self.form_id;
        let (space_id, form) = load_form(ctx, form_id).await?;
        // A form switched off reads nothing more: its decision refuses the submission.
        if !form.enabled {
            return Ok(Submission { space_id: space_id.into(), form, open: None });
        }
        let context = write_context(ctx, &space_id, &form.schema_id).await?;
        let input = decide::contact_input(&form, &self.fields, &context.attributes, self.urlencoded)?;
        let upsert = load_upsert(ctx, &write_schema(&context, &space_id), input).await?;
        // The contact the submission selects, or a new one; the address the form gives.
        let matched = upsert.target.as_ref().map(|(_, record, _)| record.record_id.clone());
        let address = upsert.input.identity("email").unwrap_or_default().to_owned();
        let client = ctx.db().await?;
        let subscribed = match &matched {
            Some(contact_id) => reads::email::subscriptions(&client, contact_id).await.map_err(ApiError::from)?,
            None => Default::default(),
        };
        drop(client);
        let confirmation = match (&form.confirmation_template_id, decide::pending(&form, &subscribed)) {
            (Some(template_id), true) => {
                let authored = load_authored(ctx, &space_id, template_id).await?;
                let limits = &ctx.state.settings.forms;
                let recipient = platform::crypto::keyed_digest("form-recipient", &address).map_err(ApiError::from)?;
                let window = limits.confirmation_window_seconds;
                let (per_recipient, per_form) =
                    (format!("form-confirm:{form_id}:{recipient}"), format!("form-confirm:{form_id}"));
                let what = "confirmation emails to this address";
                limit(ctx.state, &per_recipient, limits.confirmations_per_recipient, window, what).await?;
                let what = "confirmation emails of this form";
                limit(ctx.state, &per_form, limits.confirmations_per_form, window, what).await?;
                let (suppressed, suppressed_by) = suppression(ctx, &space_id, matched.as_deref(), &address).await?;
                Some(ConfirmationEmail { authored, address, suppressed, suppressed_by })
            }
            _ => None,
        };
        let page_text = page_text(ctx, &space_id).await?;
        let open = Open { context, upsert, subscribed, confirmation, page_text };
        Ok(Submission { space_id: space_id.into(), form, open: Some(Box::new(open)) })
    }

    fn answer(&self, Submitted { outcome, confirmation }: Submitted, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(match (Decided::from(outcome), confirmation) {
            (Decided::Append(decision), Some(prepared)) => {
                Decided::Append(decision.then(crate::templates::hand_off::later(prepared)))
            }
            (decided, _) => decided,
        })
    }

    fn refused(&self, error: AppendError) -> Lost {
        match error {
            AppendError::Conflict { code: Code::IdentifierConflict, .. } => Lost::Again,
            error => Lost::default_for(error),
        }
    }

    fn lost_too_often(&self) -> ApiError {
        Refusal::SubmissionKeptChanging.into()
    }
}

/// A submission: a browser (an HTML form posts urlencoded, and its `Accept` names HTML) is
/// answered with a page, errors included; an API client with JSON.
#[tracing::instrument(skip_all, fields(form = %path.as_str()))]
pub async fn submit(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> HttpResponse {
    let browser = api::pages::wants_html(&req, api::http::is_urlencoded(&req));
    api::pages::answer(browser, submit_form(&req, path.into_inner(), payload, &state).await)
}

async fn submit_form(
    req: &HttpRequest,
    form_id: String,
    payload: web::Payload,
    state: &web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    edge_form(state, &form_id).await?;
    let forwarded = req.headers().get("x-forwarded-for").and_then(|value| value.to_str().ok());
    let client =
        decide::client_ip(req.peer_addr().map(|addr| addr.ip()), forwarded, &state.settings.http.trusted_proxies);
    let limits = &state.settings.forms;
    let client = client.map_or_else(|| "unknown".to_owned(), |ip| ip.to_string());
    limit(state, &format!("form-ip:{client}"), limits.per_ip, limits.window_seconds, "submissions from this address")
        .await?;
    limit(state, &format!("form:{form_id}"), limits.per_form, limits.window_seconds, "submissions to this form")
        .await?;
    let (fields, urlencoded) = api::http::read_form_or_json(req, payload).await?;
    let command =
        SubmitForm { form_id, fields, urlencoded, token_ttl_hours: limits.token_ttl_hours, site: &state.site };
    pipeline::execute(state, req, Actor::Public, Protection::Unkeyed, command).await
}

fn wants_json(req: &HttpRequest) -> bool {
    req.headers()
        .get(actix_web::http::header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|accept| accept.contains("application/json") && !accept.contains("text/html"))
}

impl Command for ConfirmSubmission {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Confirmation, ApiError> {
        let (space_id, form) = load_form(ctx, &self.form_id).await?;
        let db = ctx.db().await?;
        let Some(store::Token { submission_id, contact_id, done, expired, locale }) =
            store::token(&db, &self.digest, &self.form_id).await?
        else {
            return Ok(Confirmation::Unknown);
        };
        drop(db);
        // The page speaks the language the submitter's first page did.
        let words = PageText::of(&page_text(ctx, &space_id).await?, locale.as_deref());
        if done {
            return Ok(Confirmation::Done(form, words));
        }
        if expired {
            return Ok(Confirmation::Expired);
        }
        let subscribed = reads::email::subscriptions(&ctx.db().await?, &contact_id).await.map_err(ApiError::from)?;
        let consent = load_email_consent(ctx, (&space_id, &contact_id), true).await?;
        Ok(Confirmation::Open {
            space_id: space_id.into(),
            form,
            submission_id,
            contact_id: contact_id.into(),
            consent,
            subscribed,
            words,
        })
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        if let Outcome::Append(writes) = &outcome {
            *self.decided.borrow_mut() = Some(writes.reply.clone());
        }
        Ok(outcome.into())
    }

    fn refused(&self, error: AppendError) -> Lost {
        match error {
            // Confirmed by a concurrent request: a success, as a second confirmation is.
            AppendError::Conflict { code: Code::ConcurrentModification, .. } => match self.decided.borrow().as_ref() {
                Some(reply) => Lost::Answer(reply.clone().into()),
                None => Lost::Again,
            },
            error => Lost::default_for(error),
        }
    }

    fn lost_too_often(&self) -> ApiError {
        Refusal::ConfirmationKeptChanging.into()
    }
}

/// A confirmation link: a page unless the request accepts only JSON, errors included (a
/// wrong, cut-off or expired link opened in a browser is a page too).
#[tracing::instrument(skip_all, fields(form = %path.0))]
pub async fn confirm(req: HttpRequest, path: web::Path<(String, String)>, state: web::Data<State>) -> HttpResponse {
    let browser = !wants_json(&req);
    api::pages::answer(browser, confirm_link(&req, path.into_inner(), &state).await)
}

async fn confirm_link(
    req: &HttpRequest,
    (form_id, token): (String, String),
    state: &web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let catalog = pipeline::edge_catalog(state).await?;
    find_form(&state.pool.get().await?, &catalog, &form_id).await?;
    if token.len() > 256 || !platform::storable::is_storable(&token) {
        return Err(Refusal::LinkNotFound.into());
    }
    let digest = platform::crypto::keyed_digest("form-token", &token).map_err(ApiError::from)?;
    let command = ConfirmSubmission { form_id, digest, json: wants_json(req), decided: Default::default() };
    pipeline::execute(state, req, Actor::Public, Protection::Unkeyed, command).await
}

/// Whether `address` is suppressed, and, when it is, what decided it (for the story of the
/// confirmation it refuses; `contact_id` is the contact the submission selects).
async fn suppression(
    ctx: &Ctx<'_>,
    space_id: &str,
    contact_id: Option<&str>,
    address: &str,
) -> Result<(bool, Option<mail::skipped::DecidedBy>), ApiError> {
    let client = ctx.db().await?;
    if !mail::facts::suppressed(&client, space_id, &[address]).await?.contains(address) {
        return Ok((false, None));
    }
    let refused = [mail::skipped::Refused {
        contact_id: contact_id.unwrap_or_default(),
        gate: send::Gate::Suppressed,
        address,
        topic_id: None,
        consent_keys: &[],
        filled_by: None,
    }];
    let found = mail::skipped::decided_by(&client, space_id, &refused, &platform::crypto::Keys::default())
        .await
        .map_err(ApiError::from)?;
    Ok((true, found.into_iter().next().flatten()))
}
