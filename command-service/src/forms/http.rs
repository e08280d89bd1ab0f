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

use std::collections::BTreeMap;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use domain::catalog::WriteContext;
use domain::email::resources::{FORM, FormDef};
use domain::records::RecordState;
use mail::{outbox, send};
use platform::error::{ApiError, Code};
use platform::events::LogEvent;
use platform::log::{AppendError, ExpectedVersion, Guard, NewEvent, StreamAppend};
use platform::proto;
use serde_json::{Map, Value, json};

use super::decide;
use super::store::{self, Token};
use crate::State;
use crate::emails::consent::{Source, set_email_consent, subscription_changes};
use crate::pipeline::{self, Actor, Answer, Ctx, Decided, Decision, Given, Legacy, Protection, Refusal};
use crate::records::decide::{PlannedUpsert, WriteSchema};
use crate::records::load::{plan_upsert, write_context};
use crate::records::write::Write;
use crate::templates::decide::{consent_keys, render_context};
use crate::templates::http::{Authored, EmailTo, load_authored};

fn submission_stream(submission_id: &str) -> String {
    format!("form-submission-{submission_id}")
}

fn not_found(form_id: &str) -> ApiError {
    ApiError::not_found(
        Code::FormNotFound,
        format!("no form {form_id:?}; a form is named by its id (frm_...), not its slug: GET /forms lists them"),
    )
}

/// The form and its space from catalog version `catalog`; 404 `form_not_found` when unknown.
async fn find_form(
    client: &impl deadpool_postgres::GenericClient,
    catalog: &str,
    form_id: &str,
) -> Result<(String, FormDef), ApiError> {
    if !form_id.starts_with("frm_") || !platform::storable::is_storable(form_id) {
        return Err(not_found(form_id));
    }
    let (space_id, _, definition) =
        reads::catalog::resource_by_id(client, catalog, FORM, form_id).await?.ok_or_else(|| not_found(form_id))?;
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
        return Err(disabled());
    }
    Ok(found)
}

fn disabled() -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, Some(Code::FormDisabled), "this form is not accepting submissions")
}

/// The form as a command decides on it (its catalog revision guards the append).
async fn load_form(ctx: &Ctx<'_>, form_id: &str) -> Result<(String, FormDef), ApiError> {
    let catalog = ctx.catalog().await?;
    find_form(&ctx.db().await?, &catalog, form_id).await
}

/// Counts one against a limiter; 429 `rate_limit_exceeded` with `Retry-After` when used up.
async fn limit(state: &State, key: &str, allowed: u32, window_seconds: u64, what: &str) -> Result<(), ApiError> {
    let client = state.pool.get().await?;
    let window = Duration::from_secs(window_seconds);
    match api::ratelimit::take_one(&client, key, allowed, window).await? {
        Ok(()) => Ok(()),
        Err(reset) => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            Some(Code::RateLimitExceeded),
            format!("{what}: at most {allowed} per {window_seconds} s; retry after the window resets"),
        )
        .with_header("Retry-After", httpdate::fmt_http_date(reset.into()))),
    }
}

/// A success page (what a browser that posted a form, or followed a link, is shown).
fn page(title: &str, text: &str) -> Answer {
    Answer::html(StatusCode::OK, api::pages::Message::success(title, &[text]).page())
}

/// What a submission decides on.
struct Submission {
    space_id: String,
    form: FormDef,
    context: std::sync::Arc<WriteContext>,
    planned: PlannedUpsert,
    subscribed: BTreeMap<String, String>,
    /// The confirmation email's template and what its send is decided on, when one is due
    /// (double opt-in, and the confirmation limiters passed).
    confirmation: Option<ConfirmationEmail>,
}

/// A confirmation email as its send decision reads it.
struct ConfirmationEmail {
    authored: std::sync::Arc<Authored>,
    suppressed: bool,
    /// The suppression's addition, when suppressed.
    suppressed_by: Option<mail::skipped::DecidedBy>,
}

struct SubmitForm<'a> {
    form_id: String,
    fields: Map<String, Value>,
    urlencoded: bool,
    token_ttl_hours: u64,
    /// Where the confirmation link points.
    site: &'a mail::send::Site,
}

impl Legacy for SubmitForm<'_> {
    type Loaded = Submission;

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Submission, ApiError> {
        let form_id = &self.form_id;
        let (space_id, form) = load_form(ctx, form_id).await?;
        if !form.enabled {
            return Err(disabled());
        }
        let context = write_context(ctx, &space_id, &form.schema_id).await?;
        let schema = WriteSchema {
            schema_id: &context.schema.schema_id,
            space_id: &space_id,
            schema_type: &context.schema.schema_type,
            attributes: &context.attributes,
        };
        let mut input = decide::contact_input(&form, &self.fields, &context.attributes, self.urlencoded)?;
        if !form.double_opt_in {
            for key in consent_keys(&context.attributes) {
                input.insert(key, Value::Bool(true));
            }
        }
        let planned = plan_upsert(ctx, &schema, input, platform::time::now_millis()).await?;
        let contact = &planned.record;
        let address = contact.personal.as_ref().and_then(|personal| personal.email.clone()).unwrap_or_default();
        let client = ctx.db().await?;
        let subscribed = reads::email::subscriptions(&client, &contact.record_id)
            .await
            .map_err(|error| ApiError::internal(&error))?;
        let suppressed = reads::email::is_suppressed(&client, &space_id, &address).await?;
        // What decided a suppression, for the story of a confirmation it refuses.
        let suppressed_by = if suppressed {
            let refused = [mail::skipped::Refused {
                contact_id: &contact.record_id,
                gate: send::Gate::Suppressed,
                address: &address,
                topic_id: None,
                consent_keys: &[],
                filled_by: None,
            }];
            let found = mail::skipped::decided_by(&client, &space_id, &refused, &platform::crypto::Keys::default())
                .await
                .map_err(|error| ApiError::internal(&error))?;
            found.into_iter().next().flatten()
        } else {
            None
        };
        drop(client);
        let pending = pending(&form, &subscribed);
        let confirmation = match (&form.confirmation_template_id, pending) {
            (Some(template_id), true) => {
                let authored = load_authored(ctx, &space_id, template_id).await?;
                let limits = &ctx.state.settings.forms;
                let recipient = platform::crypto::keyed_digest("form-recipient", &address)
                    .map_err(|error| ApiError::internal(&error))?;
                let window = limits.confirmation_window_seconds;
                let (per_recipient, per_form) =
                    (format!("form-confirm:{form_id}:{recipient}"), format!("form-confirm:{form_id}"));
                let what = "confirmation emails to this address";
                limit(ctx.state, &per_recipient, limits.confirmations_per_recipient, window, what).await?;
                let what = "confirmation emails of this form";
                limit(ctx.state, &per_form, limits.confirmations_per_form, window, what).await?;
                Some(ConfirmationEmail { authored, suppressed, suppressed_by })
            }
            _ => None,
        };
        Ok(Submission { space_id, form, context, planned, subscribed, confirmation })
    }

    fn decide(&self, loaded: Submission, given: &Given<'_>) -> Result<Decided, ApiError> {
        let Submission { space_id, form, context, planned, subscribed, confirmation } = loaded;
        let (form_id, now) = (&self.form_id, given.now_ms);
        let contact: RecordState = planned.record.clone();
        let contact_id = contact.record_id.clone();
        let address = contact.personal.as_ref().and_then(|personal| personal.email.clone()).unwrap_or_default();
        let new_topics = new_topics(&form, &subscribed);
        let pending = pending(&form, &subscribed);
        let submission_id = platform::ids::new_id("sub");
        let mut streams = Vec::new();
        let mut guards: Vec<Guard> = Vec::new();
        let mut contact_key = planned.key.clone();
        if let Some(write) = planned.write {
            let write = write.map_err(crate::edge::append_error)?.carried_by("form", form_id);
            let Write { stream, guards: write_guards, key } = write;
            contact_key = Some(key);
            streams.push(stream);
            guards.extend(write_guards);
        }
        let status = if pending { "pending" } else { "subscribed" };
        let source = Source { kind: "form", id: form_id };
        streams.extend(subscription_changes((&space_id, &contact_id), &new_topics, status, source, now));
        let mut token_digest = String::new();
        let mut confirmation_email = None;
        let token_ttl_hours = i64::try_from(self.token_ttl_hours).unwrap_or(168);
        let expires_at_ms = now + token_ttl_hours * 3_600_000;
        if pending {
            let token = new_token();
            token_digest =
                platform::crypto::keyed_digest("form-token", &token).map_err(|error| ApiError::internal(&error))?;
            guards.push(Guard::exactly_one(
                "INSERT INTO form_tokens (token_digest, form_id, submission_id, space_id, contact_id, expires_at)
                 VALUES ($1, $2, $3, $4, $5, to_timestamp($6::bigint / 1000.0))",
                vec![
                    Box::new(token_digest.clone()),
                    Box::new(form_id.clone()),
                    Box::new(submission_id.clone()),
                    Box::new(space_id.clone()),
                    Box::new(contact_id.clone()),
                    Box::new(expires_at_ms),
                ],
                AppendError::Conflict { code: Code::IdempotencyConflict, message: "the token is taken".to_owned() },
            ));
            if let (Some(confirmation), Some(key)) = (&confirmation, contact_key.as_ref()) {
                let authored = &confirmation.authored;
                let email_id = platform::ids::new_id("em");
                // A confirmation is decided as transactional mail: it asks for the consent
                // marketing mail needs.
                let facts = send::Facts {
                    kind: send::Kind::Transactional,
                    topic_id: None,
                    contact: Some(send::Contact {
                        address: Some(address.as_str()),
                        suppressed: confirmation.suppressed,
                        ..send::Contact::default()
                    }),
                    policy: None,
                    allowance_refused: false,
                    now_ms: now,
                };
                match send::decide(&facts) {
                    send::Verdict::Send => {
                        let confirm_url =
                            format!("{}/forms/{form_id}/confirm/{token}", self.site.base_url.trim_end_matches('/'));
                        let keys: Vec<String> =
                            context.attributes.iter().map(|attribute| attribute.key.clone()).collect();
                        let documents =
                            [(authored.template.recipient.clone(), (contact.document(), keys))].into_iter().collect();
                        let mut render_with = render_context(&documents);
                        if let Some(values) = render_with.as_object_mut() {
                            values.insert("confirmUrl".to_owned(), Value::String(confirm_url));
                            values.insert("form".to_owned(), json!({"id": form_id, "name": form.name}));
                        }
                        let rendered =
                            send::render_email(authored, &email_id, render_with, self.site).map_err(|error| {
                                ApiError::internal(&anyhow::anyhow!(
                                    "form {form_id}: the confirmation template does not render: {error}"
                                ))
                            })?;
                        let to = EmailTo { space_id: &space_id, contact_id: &contact_id, address: &address, key };
                        let origin = send::Origin::form(form_id);
                        let scheduled =
                            send::schedule(&email_id, authored, to, &rendered, origin, (now, &self.site.base_url))
                                .map_err(|error| ApiError::internal(&error))?;
                        guards.push(outbox::insert_guard(&email_id, &space_id, None));
                        guards.extend(scheduled.guards);
                        streams.push(scheduled.stream);
                        confirmation_email = Some(scheduled.prepared);
                    }
                    send::Verdict::Skip { gate, .. } | send::Verdict::Hold { gate, .. } => {
                        streams.push(mail::skipped::skipped(mail::skipped::Skip {
                            email_id: &email_id,
                            space_id: &space_id,
                            authored,
                            contact_id: &contact_id,
                            origin: send::Origin::form(form_id),
                            gate,
                            decided_by: confirmation.suppressed_by.as_ref().filter(|_| gate == send::Gate::Suppressed),
                            at_ms: now,
                        }));
                    }
                }
            }
        }
        let submitted = proto::FormSubmitted {
            submission_id: submission_id.clone(),
            form_id: form_id.clone(),
            space_id: space_id.clone(),
            contact_id: contact_id.clone(),
            pending,
            topic_ids: form.topic_ids.clone(),
            token_digest,
            expires_at_ms: if pending { expires_at_ms } else { 0 },
            at_ms: now,
        };
        streams.push(StreamAppend {
            stream_id: submission_stream(&submission_id),
            expected: ExpectedVersion::NoStream,
            events: vec![NewEvent {
                event: LogEvent::FormSubmitted(submitted),
                subject_id: Some(contact_id.clone()),
                occurred_at: platform::time::from_millis(now),
            }],
        });
        let answer = if self.urlencoded {
            let text = if pending {
                "Thank you. Please check your inbox and follow the link to confirm."
            } else {
                "Thank you. You are subscribed."
            };
            page(&form.name, text)
        } else {
            let status = if pending { "pending_confirmation" } else { "subscribed" };
            Answer::json(StatusCode::OK, json!({"data": {"submissionId": submission_id, "status": status}}))
        };
        let decision = Decision::new(streams, guards, answer).in_space(&space_id);
        Ok(Decided::Append(match confirmation_email {
            Some(prepared) => decision.then(crate::templates::hand_off::later(prepared)),
            None => decision,
        }))
    }

    fn refused(&self, error: AppendError) -> Refusal {
        match error {
            AppendError::Conflict { code: Code::IdentifierConflict, .. } => Refusal::Again,
            error => Refusal::default_for(error),
        }
    }

    fn lost_too_often(&self) -> ApiError {
        ApiError::conflict(
            Code::ConcurrentModification,
            "the contact kept changing while the submission was applied; retry",
        )
    }
}

/// The form's topics the contact is not subscribed to yet.
fn new_topics<'a>(form: &'a FormDef, subscribed: &BTreeMap<String, String>) -> Vec<&'a String> {
    form.topic_ids.iter().filter(|topic| subscribed.get(*topic).map(String::as_str) != Some("subscribed")).collect()
}

/// Whether a submission waits for confirmation: double opt-in, and something to confirm.
fn pending(form: &FormDef, subscribed: &BTreeMap<String, String>) -> bool {
    form.double_opt_in && (!new_topics(form, subscribed).is_empty() || form.topic_ids.is_empty())
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

/// What a confirmation decides on.
enum Confirmation {
    /// Confirmed before: a success again (D7).
    Done(FormDef),
    Open {
        space_id: String,
        form: FormDef,
        submission_id: String,
        contact_id: String,
        /// The contact's email consent granted (none when it holds already).
        consent: Option<Write>,
        subscribed: BTreeMap<String, String>,
    },
}

struct ConfirmSubmission {
    form_id: String,
    digest: String,
    json: bool,
    /// The form as the last decision saw it, to answer a concurrent confirmation's success.
    decided_form: std::cell::RefCell<Option<FormDef>>,
}

impl ConfirmSubmission {
    fn confirmed(&self, form: &FormDef) -> Answer {
        if self.json {
            Answer::json(StatusCode::OK, json!({"data": {"formId": self.form_id, "status": "confirmed"}}))
        } else {
            page(&form.name, "Your subscription is confirmed. Thank you.")
        }
    }
}

impl Legacy for ConfirmSubmission {
    type Loaded = Confirmation;

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Confirmation, ApiError> {
        let (space_id, form) = load_form(ctx, &self.form_id).await?;
        let db = ctx.db().await?;
        let Token { submission_id, contact_id, done, expired } =
            store::token(&db, &self.digest, &self.form_id).await?.ok_or_else(link_not_found)?;
        if done {
            return Ok(Confirmation::Done(form));
        }
        if expired {
            return Err(ApiError::new(
                StatusCode::GONE,
                Some(Code::ConfirmationExpired),
                "this confirmation link has expired; submit the form again",
            ));
        }
        let subscribed =
            reads::email::subscriptions(&db, &contact_id).await.map_err(|error| ApiError::internal(&error))?;
        drop(db);
        let source = Source { kind: "confirmation", id: &self.form_id };
        let consent =
            set_email_consent(ctx, (&space_id, &contact_id), true, source, platform::time::now_millis()).await?;
        Ok(Confirmation::Open { space_id, form, submission_id, contact_id, consent, subscribed })
    }

    fn decide(&self, loaded: Confirmation, given: &Given<'_>) -> Result<Decided, ApiError> {
        let (space_id, form, submission_id, contact_id, consent, subscribed) = match loaded {
            Confirmation::Done(form) => return Ok(Decided::Answer(self.confirmed(&form))),
            Confirmation::Open { space_id, form, submission_id, contact_id, consent, subscribed } => {
                (space_id, form, submission_id, contact_id, consent, subscribed)
            }
        };
        let now = given.now_ms;
        let mut streams = Vec::new();
        let mut guards = vec![Guard::exactly_one(
            "UPDATE form_tokens SET confirmed_at = now() WHERE token_digest = $1 AND confirmed_at IS NULL",
            vec![Box::new(self.digest.clone())],
            AppendError::Conflict { code: Code::ConcurrentModification, message: "confirmed meanwhile".to_owned() },
        )];
        if let Some(write) = consent {
            streams.push(write.stream);
            guards.extend(write.guards);
        }
        let source = Source { kind: "confirmation", id: &self.form_id };
        streams.extend(subscription_changes(
            (&space_id, &contact_id),
            &new_topics(&form, &subscribed),
            "subscribed",
            source,
            now,
        ));
        let confirmed_event = proto::SubmissionConfirmed {
            submission_id: submission_id.clone(),
            form_id: self.form_id.clone(),
            space_id: space_id.clone(),
            contact_id: contact_id.clone(),
            at_ms: now,
        };
        streams.push(StreamAppend {
            stream_id: submission_stream(&submission_id),
            expected: ExpectedVersion::Any,
            events: vec![NewEvent {
                event: LogEvent::SubmissionConfirmed(confirmed_event),
                subject_id: Some(contact_id.clone()),
                occurred_at: platform::time::from_millis(now),
            }],
        });
        *self.decided_form.borrow_mut() = Some(form.clone());
        Ok(Decided::Append(Decision::new(streams, guards, self.confirmed(&form)).in_space(&space_id)))
    }

    fn refused(&self, error: AppendError) -> Refusal {
        match error {
            // Confirmed by a concurrent request: a success, as a second confirmation is.
            AppendError::Conflict { code: Code::ConcurrentModification, .. } => {
                match self.decided_form.borrow().as_ref() {
                    Some(form) => Refusal::Answer(self.confirmed(form)),
                    None => Refusal::Again,
                }
            }
            error => Refusal::default_for(error),
        }
    }

    fn lost_too_often(&self) -> ApiError {
        ApiError::conflict(Code::ConcurrentModification, "the contact kept changing; follow the link again")
    }
}

fn link_not_found() -> ApiError {
    ApiError::not_found(Code::ConfirmationNotFound, "this confirmation link is not valid")
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
        return Err(link_not_found());
    }
    let digest = platform::crypto::keyed_digest("form-token", &token).map_err(|error| ApiError::internal(&error))?;
    let command = ConfirmSubmission { form_id, digest, json: wants_json(req), decided_form: Default::default() };
    pipeline::execute(state, req, Actor::Public, Protection::Unkeyed, command).await
}

/// A fresh double opt-in token: 32 random bytes, URL-safe base64.
fn new_token() -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(platform::crypto::random_bytes::<32>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_double_opt_in_token_is_fresh_each_time_and_43_characters() {
        assert_ne!(new_token(), new_token());
        assert_eq!(new_token().len(), 43);
    }
}
