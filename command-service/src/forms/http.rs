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

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Value, json};
use shared::catalog::{self, CATALOG};
use shared::email::outbox;
use shared::email::render;
use shared::email::resources::{FORM, FormDef};
use shared::error::{ApiError, Code};
use shared::events::LogEvent;
use shared::log::{AppendError, Appended, ExpectedVersion, Guard, NewEvent, StreamAppend};
use shared::proto;

use super::decide;
use crate::State;
use crate::emails::consent::{Source, set_email_consent, subscription_changes};
use crate::records::decide::WriteSchema;
use crate::records::http::{plan_upsert, write_context};
use crate::templates::decide::{consent_keys, render_context};
use crate::templates::http::{EmailTo, hand_off, load_authored, schedule};

const ATTEMPTS: usize = 3;

fn submission_stream(submission_id: &str) -> String {
    format!("form-submission-{submission_id}")
}

/// The form and its space; 404 `form_not_found` when unknown, 403 `form_disabled` when off.
async fn load_form(state: &State, form_id: &str) -> Result<(String, FormDef), ApiError> {
    let not_found = || ApiError::not_found(Code::FormNotFound, format!("no form {form_id:?}"));
    if !form_id.starts_with("frm_") || !shared::storable::is_storable(form_id) {
        return Err(not_found());
    }
    let models = state.read_models.wait_for(&[CATALOG], 0, state.settings.consistency_wait()).await?;
    let client = state.pool.get().await?;
    let (space_id, _, definition) =
        catalog::resource_by_id(&client, &models.schema(CATALOG), FORM, form_id).await?.ok_or_else(not_found)?;
    let form: FormDef = serde_json::from_value(definition)
        .map_err(|error| ApiError::internal(&anyhow::anyhow!("form {form_id}: {error}")))?;
    Ok((space_id, form))
}

/// Counts one against a limiter; 429 `rate_limit_exceeded` with `Retry-After` when used up.
async fn limit(state: &State, key: &str, allowed: u32, window_seconds: u64, what: &str) -> Result<(), ApiError> {
    let client = state.pool.get().await?;
    let window = Duration::from_secs(window_seconds);
    match shared::ratelimit::take_one(&client, key, allowed, window).await? {
        Ok(()) => Ok(()),
        Err(reset) => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            Some(Code::RateLimitExceeded),
            format!("{what}: at most {allowed} per {window_seconds} s; retry after the window resets"),
        )
        .with_header("Retry-After", httpdate::fmt_http_date(reset.into()))),
    }
}

/// A small HTML page (what a browser that posted a form, or followed a link, is shown).
fn page(title: &str, text: &str, appended: Option<Appended>) -> HttpResponse {
    let mut response = HttpResponse::build(StatusCode::OK);
    crate::edge::consistency_token(&mut response, appended);
    response.content_type("text/html; charset=utf-8").insert_header(("Cache-Control", "no-store")).body(
        format!(
            "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"robots\" content=\"noindex\">\
             <title>{title}</title></head>\n<body style=\"font-family: sans-serif; max-width: 32rem; margin: 4rem auto\">\
             <h1>{title}</h1><p>{text}</p></body></html>\n",
            title = render::escape_html(title),
            text = render::escape_html(text)
        ),
    )
}

#[tracing::instrument(skip_all, fields(form = %path.as_str()))]
pub async fn submit(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let form_id = path.into_inner();
    let (space_id, form) = load_form(&state, &form_id).await?;
    if !form.enabled {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            Some(Code::FormDisabled),
            "this form is not accepting submissions",
        ));
    }
    let forwarded = req.headers().get("x-forwarded-for").and_then(|value| value.to_str().ok());
    let client =
        decide::client_ip(req.peer_addr().map(|addr| addr.ip()), forwarded, &state.settings.http.trusted_proxies);
    let limits = &state.settings.forms;
    let client = client.map_or_else(|| "unknown".to_owned(), |ip| ip.to_string());
    limit(&state, &format!("form-ip:{client}"), limits.per_ip, limits.window_seconds, "submissions from this address")
        .await?;
    limit(&state, &format!("form:{form_id}"), limits.per_form, limits.window_seconds, "submissions to this form")
        .await?;
    let (fields, urlencoded) = shared::http::read_form_or_json(&req, payload).await?;

    let (schema, attributes, _) = write_context(&state, &space_id, &form.schema_id).await?;
    let write_schema = WriteSchema {
        schema_id: &schema.schema_id,
        space_id: &space_id,
        schema_type: &schema.schema_type,
        attributes: &attributes,
    };
    let mut input = decide::contact_input(&form, &fields, &attributes, urlencoded)?;
    if !form.double_opt_in {
        for key in consent_keys(&attributes) {
            input.insert(key, Value::Bool(true));
        }
    }
    let confirmation = match (&form.double_opt_in, &form.confirmation_template_id) {
        (true, Some(template_id)) => Some(load_authored(&state, &space_id, template_id).await?),
        _ => None,
    };
    for _ in 0..ATTEMPTS {
        let now = shared::time::now_millis();
        let planned = plan_upsert(&state, &write_schema, input.clone(), now).await?;
        let contact = planned.record.clone();
        let contact_id = contact.record_id.clone();
        let address = contact.personal.as_ref().and_then(|personal| personal.email.clone()).unwrap_or_default();
        let db = state.pool.get().await?;
        let subscribed =
            shared::email::subscriptions(&db, &contact_id).await.map_err(|error| ApiError::internal(&error))?;
        let suppressed = shared::email::is_suppressed(&db, &space_id, &address).await?;
        drop(db);
        let new_topics: Vec<&String> = form
            .topic_ids
            .iter()
            .filter(|topic| subscribed.get(*topic).map(String::as_str) != Some("subscribed"))
            .collect();
        let pending = form.double_opt_in && (!new_topics.is_empty() || form.topic_ids.is_empty());
        let submission_id = shared::ids::new_id("sub");
        let mut streams = Vec::new();
        let mut guards: Vec<Guard> = Vec::new();
        let mut contact_key = planned.key.clone();
        if let Some(write) = planned.write {
            let write = write.map_err(crate::edge::append_error)?;
            contact_key = Some(write.key.clone());
            streams.push(write.stream);
            guards.extend(write.guards);
        }
        let status = if pending { "pending" } else { "subscribed" };
        let source = Source { kind: "form", id: &form_id };
        streams.extend(subscription_changes((&space_id, &contact_id), &new_topics, status, source, now));
        let mut token_digest = String::new();
        let mut confirmation_email = None;
        let expires_at_ms = now + i64::try_from(limits.token_ttl_hours).unwrap_or(168) * 3_600_000;
        if pending {
            let token = decide::new_token();
            token_digest =
                shared::crypto::keyed_digest("form-token", &token).map_err(|error| ApiError::internal(&error))?;
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
            if let (Some(authored), false, Some(key)) = (&confirmation, suppressed, contact_key.as_ref()) {
                let recipient = shared::crypto::keyed_digest("form-recipient", &address)
                    .map_err(|error| ApiError::internal(&error))?;
                let window = limits.confirmation_window_seconds;
                let per_recipient = format!("form-confirm:{form_id}:{recipient}");
                limit(
                    &state,
                    &per_recipient,
                    limits.confirmations_per_recipient,
                    window,
                    "confirmation emails to this address",
                )
                .await?;
                limit(
                    &state,
                    &format!("form-confirm:{form_id}"),
                    limits.confirmations_per_form,
                    window,
                    "confirmation emails of this form",
                )
                .await?;
                let confirm_url = format!(
                    "{}/forms/{form_id}/confirm/{token}",
                    state.settings.email.public_base_url.trim_end_matches('/')
                );
                let keys: Vec<String> = attributes.iter().map(|attribute| attribute.key.clone()).collect();
                let documents =
                    [(authored.template.recipient.clone(), (contact.document(), keys))].into_iter().collect();
                let mut context = render_context(&documents);
                if let Some(context) = context.as_object_mut() {
                    context.insert("confirmUrl".to_owned(), Value::String(confirm_url));
                    context.insert("form".to_owned(), json!({"id": form_id, "name": form.name}));
                }
                let template = &authored.template;
                let rendered =
                    render::render(&template.subject, &template.html, &template.text, &context).map_err(|error| {
                        ApiError::internal(&anyhow::anyhow!(
                            "form {form_id}: the confirmation template does not render: {error}"
                        ))
                    })?;
                let to = EmailTo { space_id: &space_id, contact_id: &contact_id, address: &address, key };
                let scheduled = schedule(&state, authored, to, &rendered, ("form_confirmation", &form_id), now)?;
                guards.push(outbox::insert_guard(&scheduled.prepared.parties.email_id, &space_id, None));
                streams.push(scheduled.stream);
                confirmation_email = Some(scheduled.prepared);
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
                occurred_at: shared::time::from_millis(now),
            }],
        });
        let appended = crate::edge::append_public(&state, &space_id, streams, guards).await;
        let appended = match appended {
            Ok(appended) => appended,
            Err(AppendError::WrongVersion { .. }) => continue,
            Err(AppendError::Conflict { code: Code::IdentifierConflict, .. }) => continue,
            Err(error) => return Err(crate::edge::append_error(error)),
        };
        if let Some(prepared) = confirmation_email {
            let state = state.clone();
            tokio::spawn(async move { hand_off(&state, &prepared).await });
        }
        let status = if pending { "pending_confirmation" } else { "subscribed" };
        let response = if urlencoded {
            let text = if pending {
                "Thank you. Please check your inbox and follow the link to confirm."
            } else {
                "Thank you. You are subscribed."
            };
            page(&form.name, text, Some(appended))
        } else {
            let mut response = HttpResponse::Ok();
            crate::edge::consistency_token(&mut response, Some(appended));
            response.json(json!({"data": {"submissionId": submission_id, "status": status}}))
        };
        return Ok(response);
    }
    Err(ApiError::conflict(
        Code::ConcurrentModification,
        "the contact kept changing while the submission was applied; retry",
    ))
}

fn wants_json(req: &HttpRequest) -> bool {
    req.headers()
        .get(actix_web::http::header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|accept| accept.contains("application/json") && !accept.contains("text/html"))
}

fn confirmed(req: &HttpRequest, form: &FormDef, form_id: &str, appended: Option<Appended>) -> HttpResponse {
    if wants_json(req) {
        let mut response = HttpResponse::Ok();
        crate::edge::consistency_token(&mut response, appended);
        response.json(json!({"data": {"formId": form_id, "status": "confirmed"}}))
    } else {
        page(&form.name, "Your subscription is confirmed. Thank you.", appended)
    }
}

#[tracing::instrument(skip_all, fields(form = %path.0))]
pub async fn confirm(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (form_id, token) = path.into_inner();
    let (space_id, form) = load_form(&state, &form_id).await?;
    let not_found = || ApiError::not_found(Code::ConfirmationNotFound, "this confirmation link is not valid");
    if token.len() > 256 || !shared::storable::is_storable(&token) {
        return Err(not_found());
    }
    let digest = shared::crypto::keyed_digest("form-token", &token).map_err(|error| ApiError::internal(&error))?;
    for _ in 0..ATTEMPTS {
        let db = state.pool.get().await?;
        let row = db
            .query_opt(
                "SELECT submission_id, contact_id, confirmed_at IS NOT NULL, expires_at < now() FROM form_tokens
                 WHERE token_digest = $1 AND form_id = $2",
                &[&digest, &form_id],
            )
            .await?
            .ok_or_else(not_found)?;
        let (submission_id, contact_id, done, expired): (String, String, bool, bool) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        if done {
            return Ok(confirmed(&req, &form, &form_id, None));
        }
        if expired {
            return Err(ApiError::new(
                StatusCode::GONE,
                Some(Code::ConfirmationExpired),
                "this confirmation link has expired; submit the form again",
            ));
        }
        let subscribed =
            shared::email::subscriptions(&db, &contact_id).await.map_err(|error| ApiError::internal(&error))?;
        drop(db);
        let now = shared::time::now_millis();
        let mut streams = Vec::new();
        let mut guards = vec![Guard::exactly_one(
            "UPDATE form_tokens SET confirmed_at = now() WHERE token_digest = $1 AND confirmed_at IS NULL",
            vec![Box::new(digest.clone())],
            AppendError::Conflict { code: Code::ConcurrentModification, message: "confirmed meanwhile".to_owned() },
        )];
        if let Some(write) = set_email_consent(&state, &space_id, &contact_id, true, now).await? {
            streams.push(write.stream);
            guards.extend(write.guards);
        }
        let topics: Vec<&String> = form
            .topic_ids
            .iter()
            .filter(|topic| subscribed.get(*topic).map(String::as_str) != Some("subscribed"))
            .collect();
        let source = Source { kind: "confirmation", id: &form_id };
        streams.extend(subscription_changes((&space_id, &contact_id), &topics, "subscribed", source, now));
        let confirmed_event = proto::SubmissionConfirmed {
            submission_id: submission_id.clone(),
            form_id: form_id.clone(),
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
                occurred_at: shared::time::from_millis(now),
            }],
        });
        let appended = crate::edge::append_public(&state, &space_id, streams, guards).await;
        match appended {
            Ok(appended) => return Ok(confirmed(&req, &form, &form_id, Some(appended))),
            // Confirmed by a concurrent request: a success, as a second confirmation is.
            Err(AppendError::Conflict { code: Code::ConcurrentModification, .. }) => {
                return Ok(confirmed(&req, &form, &form_id, None));
            }
            Err(AppendError::WrongVersion { .. }) => continue,
            Err(error) => return Err(crate::edge::append_error(error)),
        }
    }
    Err(ApiError::conflict(Code::ConcurrentModification, "the contact kept changing; follow the link again"))
}
