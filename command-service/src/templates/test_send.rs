//! `POST /templates/{templateId}/test`: one real message of the template to an address the
//! caller gives, rendered as a preview is (a stored contact's data or given data, in a
//! locale), marked as a test (`X-Test-Send: true`, no `List-Unsubscribe`, origin `test` in its
//! story). A suppressed address is refused as for any send; no other gate is asked, and
//! nothing counts it: not the allowance, the caps, statistics, webhooks or the delivery log.
//! `EmailTestRequested` is appended first, then the message is handed to the relay inline and
//! its outcome appended (`EmailTestSent`); the answer waits for it. Test sends are limited per
//! key (the `test` bucket).

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::Permission;
use api::ratelimit::Bucket;
use domain::email::resources::TEMPLATE;
use mail::message::Outgoing;
use mail::send::{Gate, Site};
use platform::error::ApiError;
use platform::events::LogEvent;
use platform::log::{AppendRequest, ExpectedVersion, NewEvent, StreamAppend};
use platform::proto;
use serde_json::{Map, Value, json};

use super::decide::Refusal;
use super::preview::{self, Request};
use crate::State;
use crate::decision::{Decide, Given};
use crate::pipeline::{self, Actor, Answer, Command, Ctx, Decided, Decision, Protection, Shell, Then};

/// A test send's body: where to, and what a preview takes.
#[derive(Debug, Clone, PartialEq)]
pub struct TestRequest {
    pub to: String,
    pub render: Request,
}

/// The body `{to, contactId?, data?, locale?}`.
pub fn parse(body: &Map<String, Value>) -> Result<TestRequest, Refusal> {
    let mut rest = body.clone();
    let to = match rest.remove("to") {
        Some(Value::String(to)) if mail::is_address(to.trim()) => to.trim().to_owned(),
        Some(_) => {
            let message = "to must be the email address the test goes to".to_owned();
            return Err(Refusal::InvalidField { field: "to".to_owned(), message });
        }
        None => {
            let message = "to is required: the email address the test goes to".to_owned();
            return Err(Refusal::InvalidField { field: "to".to_owned(), message });
        }
    };
    Ok(TestRequest { to, render: preview::parse(&rest)? })
}

pub struct TestSend<'a> {
    pub space_id: String,
    pub template_id: String,
    pub key_id: String,
    pub request: TestRequest,
    pub site: &'a Site,
}

pub struct Loaded {
    pub preview: preview::Loaded,
    /// Whether `to` is suppressed in the space or globally.
    pub suppressed: bool,
}

/// The test's record and its message, ready to append and hand off.
pub struct Prepared {
    pub stream: StreamAppend,
    pub email_id: String,
    pub outgoing: Outgoing,
    pub domain_id: String,
    pub domain: domain::email::resources::DomainDef,
}

impl Decide for TestSend<'_> {
    type Loaded = Loaded;
    type Outcome = Box<Prepared>;
    type Refusal = Refusal;

    fn decide(&self, loaded: Loaded, given: &mut Given<'_>) -> Result<Box<Prepared>, Refusal> {
        if loaded.suppressed {
            return Err(Refusal::Gate(Gate::Suppressed));
        }
        let rendered = preview::render(&loaded.preview, &self.request.render, self.site)?;
        let authored = &loaded.preview.authored;
        let email_id = given.fresh.id("em");
        let (locale, locale_source) = match &rendered.locale {
            Some(locale) => (locale.tag.clone(), locale.source.to_owned()),
            None => Default::default(),
        };
        let requested = proto::EmailTestRequested {
            email_id: email_id.clone(),
            space_id: self.space_id.clone(),
            template_id: authored.template_id.clone(),
            template_revision: authored.revision,
            kind: authored.template.kind.clone(),
            topic_id: authored.template.topic_id.clone().unwrap_or_default(),
            contact_id: self.request.render.contact_id.clone().unwrap_or_default(),
            to_masked: api::pages::mask_address(&self.request.to),
            key_id: self.key_id.clone(),
            locale,
            locale_source,
            parts: authored.parts.revisions(),
            at_ms: given.now_ms,
        };
        let stream = StreamAppend {
            stream_id: domain::email::stream_id(&email_id),
            expected: ExpectedVersion::NoStream,
            events: vec![NewEvent {
                event: LogEvent::EmailTestRequested(requested),
                subject_id: None,
                occurred_at: platform::time::from_millis(given.now_ms),
            }],
        };
        let content = proto::EmailContent {
            to_address: self.request.to.clone(),
            subject: rendered.subject.clone(),
            html: rendered.html.clone(),
            text: rendered.text.clone(),
        };
        let outgoing = Outgoing::new(
            &email_id,
            &authored.sender,
            &authored.domain,
            &content,
            (given.now_ms, false),
            &self.site.base_url,
        )
        .in_language(rendered.locale.as_ref().map(|locale| locale.tag.as_str()))
        .as_test();
        Ok(Box::new(Prepared {
            stream,
            email_id,
            outgoing,
            domain_id: authored.sender.domain_id.clone(),
            domain: authored.domain.clone(),
        }))
    }
}

impl Command for TestSend<'_> {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Loaded, ApiError> {
        let preview = preview::load(ctx, &self.space_id, &self.template_id, &self.request.render).await?;
        let to = self.request.to.as_str();
        let suppressed = mail::facts::suppressed(&ctx.db().await?, &self.space_id, &[to]).await?.contains(to);
        Ok(Loaded { preview, suppressed })
    }

    fn answer(&self, prepared: Box<Prepared>, _: &Shell<'_>) -> Result<Decided, ApiError> {
        let Prepared { stream, email_id, outgoing, domain_id, domain } = *prepared;
        let space_id = self.space_id.clone();
        let placeholder = Answer::json(StatusCode::OK, Value::Null);
        let then = Then::Finish(Box::new(move |state: web::Data<State>| {
            Box::pin(async move {
                let (status, error) =
                    mail::outbox::hand_off_test(&state.mailer, &email_id, (&domain_id, &domain), &outgoing).await;
                let (error_code, error_message) = error.clone().unwrap_or_default();
                let now = platform::time::now_millis();
                let sent = proto::EmailTestSent {
                    email_id: email_id.clone(),
                    space_id: space_id.clone(),
                    status: status.to_owned(),
                    error_code,
                    error_message,
                    at_ms: now,
                };
                let stream = StreamAppend {
                    stream_id: domain::email::stream_id(&email_id),
                    expected: ExpectedVersion::Any,
                    events: vec![NewEvent {
                        event: LogEvent::EmailTestSent(sent),
                        subject_id: None,
                        occurred_at: platform::time::from_millis(now),
                    }],
                };
                let appended = state
                    .event_log
                    .append(AppendRequest::in_space(&space_id, vec![stream], Vec::new()))
                    .await
                    .map_err(ApiError::from)?;
                let error = error.map(|(code, message)| json!({"code": code, "message": message}));
                let body = json!({"data": {"emailId": email_id, "status": status, "error": error}});
                Ok((Answer::json(StatusCode::OK, body), appended))
            })
        }));
        Ok(Decided::Append(Decision::new(vec![stream], Vec::new(), placeholder).then(then)))
    }
}

#[tracing::instrument(skip_all, fields(template = %path.as_str()))]
pub async fn test(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (caller, body) =
        pipeline::authorize_with_body(&req, payload, &state, Permission::Write, |_| Bucket::TestSend).await?;
    let request = parse(&body)?;
    let template_id = pipeline::authored_id(&state, (TEMPLATE, caller.space_id()), path.into_inner()).await?;
    let command = TestSend {
        space_id: caller.space_id().to_owned(),
        template_id,
        key_id: caller.key_id().to_owned(),
        request,
        site: &state.site,
    };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Unkeyed, command).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use platform::error::Code;
    use platform::refusal::Refusal as _;

    #[test]
    fn a_test_names_an_address_and_what_a_preview_takes() {
        let body = |value: Value| value.as_object().cloned().unwrap_or_default();
        let request = parse(&body(json!({"to": " qa@example.com ", "locale": "de"}))).expect("valid");
        assert_eq!((request.to.as_str(), request.render.locale.as_deref()), ("qa@example.com", Some("de")));
        let code = |value: Value| parse(&body(value)).err().map(|refusal| refusal.code());
        assert_eq!(code(json!({})), Some(Code::InvalidField));
        assert_eq!(code(json!({"to": "nobody"})), Some(Code::InvalidField));
        assert_eq!(code(json!({"to": "qa@example.com", "cc": "x@example.com"})), Some(Code::UnknownField));
    }
}
