//! Form decisions: who the client is, what the fields become, what a submission appends
//! (the contact, its subscriptions, the confirmation token and email) and what following the
//! confirmation link does. Pure: the form, what the contact's upsert reads, its
//! subscriptions and the confirmation's template are loaded by the shell (`http.rs`); the
//! decision upserts the contact and draws the token through what it is given.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use domain::catalog::{AttributeEntry, WriteContext};
use domain::email::page_text::PageText;
use domain::email::resources::{FormDef, PageTextDef};
use domain::records::write::Write;
use mail::outbox::{self, Prepared};
use mail::send::{self, Authored, EmailTo};
use platform::error::{Code, Issue};
use platform::events::LogEvent;
use platform::ids::{ContactId, SpaceId};
use platform::log::{ExpectedVersion, Guard, NewEvent, StreamAppend};
use platform::proto;
use serde_json::{Map, Value, json};

use super::store::{confirm_guard, token_guard};
use crate::decision::{Decide, Given, Outcome, Reply};
use crate::emails::decide::subscriptions::{Source, subscription_changes};
use crate::emails::decide::{ConsentLoaded, consent_write};
use crate::records::decide::{self as records, PlannedUpsert, UpsertLoaded};
use crate::templates::decide::render_context;

/// Why a submission or a confirmation is refused. The HTTP edge maps each to the contract's
/// answer (a page for a browser).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// The submission lacks what the form needs; `issues` names it (400).
    #[error("{message}")]
    Invalid { message: String, issues: Vec<Issue> },
    /// No such form (404).
    #[error("no form {0:?}; a form is named by its id (frm_...), not its slug: GET /forms lists them")]
    FormNotFound(String),
    /// The form is switched off (403).
    #[error("this form is not accepting submissions")]
    Disabled,
    /// A limiter is used up (429, with `Retry-After`, an HTTP date: when its window resets).
    #[error("{what}: at most {allowed} per {window_seconds} s; retry after the window resets")]
    RateLimited { what: String, allowed: u32, window_seconds: u64, retry_after: String },
    /// No confirmation token of the form is this link's (404).
    #[error("this confirmation link is not valid")]
    LinkNotFound,
    /// The link expired unconfirmed (410).
    #[error("this confirmation link has expired; submit the form again")]
    LinkExpired,
    /// Every attempt at a submission lost a race (409).
    #[error("the contact kept changing while the submission was applied; retry")]
    SubmissionKeptChanging,
    /// Every attempt at a confirmation lost a race (409).
    #[error("the contact kept changing; follow the link again")]
    ConfirmationKeptChanging,
    /// What the submission appends could not be built (500).
    #[error("{0}")]
    Internal(String),
    /// The contact's write could not be assembled (the record write's answer).
    #[error(transparent)]
    Record(#[from] records::Refusal),
}

/// The client's address: the peer's, or, when the peer is a trusted proxy, the address its
/// `X-Forwarded-For` names (the rightmost one that is not itself a trusted proxy).
pub(crate) fn client_ip(peer: Option<IpAddr>, forwarded_for: Option<&str>, trusted: &[IpAddr]) -> Option<IpAddr> {
    let peer = peer?;
    if !trusted.contains(&peer) {
        return Some(peer);
    }
    let chain: Vec<IpAddr> =
        forwarded_for.unwrap_or_default().split(',').filter_map(|hop| hop.trim().parse().ok()).collect();
    Some(chain.iter().rev().find(|hop| !trusted.contains(hop)).or(chain.first()).copied().unwrap_or(peer))
}

/// The contact input of a submission: each form field the form maps, to its attribute or
/// identity field. A urlencoded body's strings are read as the attribute's type (`true`,
/// `on` and `1` are true for a checkbox); empty values are left out. The email is required.
pub(crate) fn contact_input(
    form: &FormDef,
    fields: &Map<String, Value>,
    attributes: &[AttributeEntry],
    urlencoded: bool,
) -> Result<Map<String, Value>, Refusal> {
    let mut input = Map::new();
    for (field, target) in &form.fields {
        let Some(value) = fields.get(field) else { continue };
        let value = match value {
            Value::String(text) if urlencoded => {
                let text = text.trim();
                if text.is_empty() {
                    continue;
                }
                let kind = attributes
                    .iter()
                    .find(|attribute| attribute.key == *target)
                    .and_then(|attribute| attribute.definition.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("string");
                typed(kind, text)
            }
            other => other.clone(),
        };
        input.insert(target.clone(), value);
    }
    if input.get("email").is_none_or(|email| email.as_str().is_none_or(|email| email.trim().is_empty())) {
        let field = form.fields.iter().find(|(_, target)| *target == "email").map_or("email", |(field, _)| field);
        return Err(Refusal::Invalid {
            message: format!("{field} (an email address) is required"),
            issues: vec![Issue::for_key(field, "an email address is required")],
        });
    }
    Ok(input)
}

fn typed(kind: &str, text: &str) -> Value {
    match kind {
        "boolean" => Value::Bool(matches!(text.to_ascii_lowercase().as_str(), "true" | "on" | "1" | "yes")),
        "integer" => text.parse::<i64>().map(Value::from).unwrap_or_else(|_| Value::String(text.to_owned())),
        "number" => text
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or_else(|| Value::String(text.to_owned()), Value::Number),
        _ => Value::String(text.to_owned()),
    }
}

pub(crate) fn submission_stream(submission_id: &str) -> String {
    format!("form-submission-{submission_id}")
}

/// A success page (what a browser that posted a form, or followed a link, is shown): the
/// sentence of `key` in the submitter's words.
fn page(title: &str, words: &PageText, key: &str) -> Reply {
    Reply::page(title, &[words.get(key)], words)
}

/// The form's topics the contact is not subscribed to yet.
pub(crate) fn new_topics<'a>(form: &'a FormDef, subscribed: &BTreeMap<String, String>) -> Vec<&'a String> {
    form.topic_ids.iter().filter(|topic| subscribed.get(*topic).map(String::as_str) != Some("subscribed")).collect()
}

/// Whether a submission waits for confirmation: double opt-in, and something to confirm.
pub(crate) fn pending(form: &FormDef, subscribed: &BTreeMap<String, String>) -> bool {
    form.double_opt_in && (!new_topics(form, subscribed).is_empty() || form.topic_ids.is_empty())
}

/// `POST /forms/{formId}/submit`: a submission, public (the tenant is the form's).
pub(crate) struct SubmitForm<'a> {
    pub form_id: String,
    pub fields: Map<String, Value>,
    pub urlencoded: bool,
    pub token_ttl_hours: u64,
    /// Where the confirmation link points.
    pub site: &'a send::Site,
}

/// What a submission decides on: the form, and what a submission to it reads when the form
/// accepts submissions (not loaded for a form switched off).
pub(crate) struct Submission {
    pub space_id: SpaceId,
    pub form: FormDef,
    pub open: Option<Box<Open>>,
}

/// What a submission to a form that accepts them reads.
pub(crate) struct Open {
    /// The write context of the form's contact schema.
    pub context: Arc<WriteContext>,
    /// What the contact's upsert reads: the form's fields as its input, the holders of its
    /// identities and the contact they select.
    pub upsert: UpsertLoaded,
    /// The selected contact's topic statuses (none for a new contact).
    pub subscribed: BTreeMap<String, String>,
    /// The confirmation email's template and what its send is decided on, when one is due
    /// (double opt-in, and the confirmation limiters passed).
    pub confirmation: Option<ConfirmationEmail>,
    /// The space's page text, for the submitter's pages in the contact's locale.
    pub page_text: PageTextDef,
}

/// A confirmation email as its send decision reads it.
pub(crate) struct ConfirmationEmail {
    pub authored: Arc<Authored>,
    /// The address the facts were read for (the one the form gives).
    pub address: String,
    pub suppressed: bool,
    /// The suppression's addition, when suppressed.
    pub suppressed_by: Option<mail::skipped::DecidedBy>,
}

/// A submission decided: its appends and answer, and the confirmation email to hand off once
/// appended.
pub(crate) struct Submitted {
    pub outcome: Outcome,
    pub confirmation: Option<Prepared>,
}

impl Decide for SubmitForm<'_> {
    type Loaded = Submission;
    type Outcome = Submitted;
    type Refusal = Refusal;

    fn decide(&self, loaded: Submission, given: &mut Given<'_>) -> Result<Submitted, Refusal> {
        let Submission { space_id, form, open } = loaded;
        if !form.enabled {
            return Err(Refusal::Disabled);
        }
        let Some(open) = open else {
            return Err(Refusal::Internal("an open form's submission was not read".to_owned()));
        };
        let Open { context, mut upsert, subscribed, confirmation, page_text } = *open;
        let (form_id, now) = (&self.form_id, given.now_ms);
        // Without double opt-in, a submission is the contact's consent to email.
        if !form.double_opt_in {
            for key in send::consent_keys(&context.attributes) {
                upsert.input.values.insert(key, Value::Bool(true));
            }
        }
        let schema = records::write_schema(&context, &space_id);
        let PlannedUpsert { record: contact, write, key, .. } =
            records::decide_upsert(&schema, upsert, now, given.fresh)?;
        let write = write.transpose().map_err(records::Refusal::Unwritable)?;
        // The submitter's pages speak the contact's locale, as the space has words for it.
        let words = PageText::of(&page_text, page_text.locale_in(&contact.document()).as_deref());
        let contact_id = contact.record_id.clone();
        let address = contact.personal.as_ref().and_then(|personal| personal.email.clone()).unwrap_or_default();
        let new_topics = new_topics(&form, &subscribed);
        let pending = pending(&form, &subscribed);
        let submission_id = given.fresh.id("sub");
        let mut streams = Vec::new();
        let mut guards: Vec<Guard> = Vec::new();
        let mut contact_key = key;
        if let Some(write) = write {
            let write = write.carried_by("form", form_id);
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
            // The double opt-in token: drawn now, stored only by its digest.
            let (token, digest) =
                given.fresh.token("form-token").map_err(|error| Refusal::Internal(format!("{error:#}")))?;
            token_digest = digest;
            let expiry = (expires_at_ms, words.lang());
            guards.push(token_guard(&token_digest, form_id, &submission_id, (&space_id, &contact_id), expiry));
            if let (Some(confirmation), Some(key)) = (&confirmation, contact_key.as_ref()) {
                // The contact may end without an address (the form's address held by another
                // record, being deleted, is skipped): the send decision says `no_address`.
                if !address.is_empty() && confirmation.address != address {
                    let read = &confirmation.address;
                    return Err(Refusal::Internal(format!(
                        "the confirmation's facts were read for {read:?}, not {address:?}"
                    )));
                }
                let authored = &confirmation.authored;
                let email_id = given.fresh.id("em");
                // A confirmation is decided as transactional mail: it asks for the consent
                // marketing mail needs.
                let facts = send::Facts {
                    kind: send::Kind::Transactional,
                    topic_id: None,
                    contact: Some(send::Contact {
                        address: Some(address.as_str()),
                        suppressed: confirmation.suppressed && !address.is_empty(),
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
                                Refusal::Internal(format!(
                                    "form {form_id}: the confirmation template does not render: {error}"
                                ))
                            })?;
                        // Transactional: not counted by the caps, so it follows no send.
                        let to = EmailTo {
                            space_id: &space_id,
                            contact_id: &contact_id,
                            address: &address,
                            key,
                            follows: None,
                        };
                        let origin = send::Origin::form(form_id);
                        let scheduled =
                            send::schedule(&email_id, authored, to, &rendered, origin, (now, &self.site.base_url))
                                .map_err(|error| Refusal::Internal(format!("{error:#}")))?;
                        guards.push(outbox::insert_guard(&email_id, &space_id));
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
                            recipient: Some((address.as_str(), key)),
                            zone: None,
                            at_ms: now,
                        }));
                    }
                }
            }
        }
        let submitted = proto::FormSubmitted {
            submission_id: submission_id.clone(),
            form_id: form_id.clone(),
            space_id: space_id.clone().into(),
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
        let reply = if self.urlencoded {
            page(&form.name, &words, if pending { "form.pending" } else { "form.subscribed" })
        } else {
            let status = if pending { "pending_confirmation" } else { "subscribed" };
            Reply::ok(json!({"submissionId": submission_id, "status": status}))
        };
        let outcome = Outcome::append(streams, guards, reply).in_space(&space_id);
        Ok(Submitted { outcome, confirmation: confirmation_email })
    }
}

/// `GET /forms/{formId}/confirm/{token}`: following the confirmation link.
pub(crate) struct ConfirmSubmission {
    pub form_id: String,
    /// The keyed digest of the link's token.
    pub digest: String,
    pub json: bool,
    /// The answer of the last decision that appended, for the shell to give when a
    /// concurrent confirmation won the race.
    pub decided: RefCell<Option<Reply>>,
}

impl ConfirmSubmission {
    /// The answer to a confirmation (the first, or any after it), a page in `words`.
    pub(crate) fn confirmed(&self, form: &FormDef, words: &PageText) -> Reply {
        if self.json {
            Reply::ok(json!({"formId": self.form_id, "status": "confirmed"}))
        } else {
            page(&form.name, words, "form.confirmed")
        }
    }
}

/// What a confirmation decides on: the form's token with the link's digest.
pub(crate) enum Confirmation {
    /// No token of the form has the digest.
    Unknown,
    /// The token expired unconfirmed.
    Expired,
    /// Confirmed before: a success again (D7), in the submitter's words.
    Done(FormDef, PageText),
    Open {
        space_id: SpaceId,
        form: FormDef,
        submission_id: String,
        contact_id: ContactId,
        /// The contact whose email consent is granted (none when it is gone or its schema
        /// has no consent attribute).
        consent: Option<Box<ConsentLoaded>>,
        subscribed: BTreeMap<String, String>,
        /// The words of the submitter's pages.
        words: PageText,
    },
}

impl Decide for ConfirmSubmission {
    type Loaded = Confirmation;
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, loaded: Confirmation, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let (space_id, form, submission_id, contact_id, consent, subscribed, words) = match loaded {
            Confirmation::Unknown => return Err(Refusal::LinkNotFound),
            Confirmation::Expired => return Err(Refusal::LinkExpired),
            Confirmation::Done(form, words) => return Ok(Outcome::Answer(self.confirmed(&form, &words))),
            Confirmation::Open { space_id, form, submission_id, contact_id, consent, subscribed, words } => {
                (space_id, form, submission_id, contact_id, consent, subscribed, words)
            }
        };
        let now = given.now_ms;
        let mut streams = Vec::new();
        let mut guards = vec![confirm_guard(&self.digest)];
        let source = Source { kind: "confirmation", id: &self.form_id };
        if let Some(write) = consent_write(consent, source, given)? {
            streams.push(write.stream);
            guards.extend(write.guards);
        }
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
            space_id: space_id.clone().into(),
            contact_id: contact_id.clone().into(),
            at_ms: now,
        };
        streams.push(StreamAppend {
            stream_id: submission_stream(&submission_id),
            expected: ExpectedVersion::Any,
            events: vec![NewEvent {
                event: LogEvent::SubmissionConfirmed(confirmed_event),
                subject_id: Some(contact_id.clone().into()),
                occurred_at: platform::time::from_millis(now),
            }],
        });
        Ok(Outcome::append(streams, guards, self.confirmed(&form, &words)).in_space(&space_id))
    }
}

impl platform::refusal::Answered for Refusal {}

/// A refused form submission or confirmation as the contract answers it.
impl platform::refusal::Refusal for Refusal {
    fn code(&self) -> Code {
        match self {
            Self::Invalid { .. } => Code::InvalidFormSubmission,
            Self::FormNotFound(_) => Code::FormNotFound,
            Self::Disabled => Code::FormDisabled,
            Self::RateLimited { .. } => Code::RateLimitExceeded,
            Self::LinkNotFound => Code::ConfirmationNotFound,
            Self::LinkExpired => Code::ConfirmationExpired,
            Self::SubmissionKeptChanging | Self::ConfirmationKeptChanging => Code::ConcurrentModification,
            Self::Internal(_) => Code::InternalError,
            Self::Record(refusal) => platform::refusal::Refusal::code(refusal),
        }
    }

    fn issues(&self) -> Vec<Issue> {
        match self {
            Self::Invalid { issues, .. } => issues.clone(),
            Self::Record(refusal) => platform::refusal::Refusal::issues(refusal),
            _ => Vec::new(),
        }
    }

    fn headers(&self) -> Vec<(&'static str, String)> {
        match self {
            Self::RateLimited { retry_after, .. } => vec![("Retry-After", retry_after.clone())],
            _ => Vec::new(),
        }
    }

    fn is_defect(&self) -> bool {
        match self {
            Self::Record(refusal) => platform::refusal::Refusal::is_defect(refusal),
            other => matches!(other, Self::Internal(_)),
        }
    }

    fn into_failure(self) -> Result<platform::refusal::Failure, Self> {
        match self {
            Self::Record(refusal) => platform::refusal::Refusal::into_failure(refusal).map_err(Self::Record),
            other => Err(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::harness::{NOW_MS, given};

    #[test]
    fn forwarded_for_counts_only_behind_a_trusted_proxy() {
        let proxy: IpAddr = "127.0.0.1".parse().expect("ip");
        let client: IpAddr = "203.0.113.9".parse().expect("ip");
        let spoofed = Some("198.51.100.1, 203.0.113.9");
        assert_eq!(
            client_ip(Some(client), Some("198.51.100.1"), &[proxy]),
            Some(client),
            "untrusted peer: header ignored"
        );
        assert_eq!(client_ip(Some(proxy), spoofed, &[proxy]), Some(client), "the rightmost untrusted hop");
        assert_eq!(client_ip(Some(proxy), None, &[proxy]), Some(proxy));
        assert_eq!(client_ip(Some(proxy), Some("garbage"), &[proxy]), Some(proxy));
    }

    #[test]
    fn fields_map_to_attributes_with_types_and_the_email_is_required() {
        let form = FormDef {
            slug: "f".into(),
            name: "F".into(),
            schema_id: "sch".into(),
            fields: BTreeMap::from([
                ("email_address".into(), "email".into()),
                ("agree".into(), "consent".into()),
                ("age".into(), "age".into()),
            ]),
            topic_ids: vec![],
            double_opt_in: true,
            confirmation_template_id: None,
            enabled: true,
        };
        let attributes = vec![
            AttributeEntry { key: "consent".into(), definition: json!({"type": "boolean"}) },
            AttributeEntry { key: "age".into(), definition: json!({"type": "integer"}) },
        ];
        let fields = json!({"email_address": "a@example.com", "agree": "on", "age": "42", "other": "x"});
        let input = contact_input(&form, fields.as_object().expect("object"), &attributes, true).expect("valid");
        assert_eq!(Value::Object(input), json!({"email": "a@example.com", "consent": true, "age": 42}));
        let missing = json!({"email_address": " ", "age": "1"});
        let error = contact_input(&form, missing.as_object().expect("object"), &attributes, true).err();
        assert_eq!(error.as_ref().map(platform::refusal::Refusal::code), Some(Code::InvalidFormSubmission));
        assert_eq!(
            error,
            Some(Refusal::Invalid {
                message: "email_address (an email address) is required".into(),
                issues: vec![Issue::for_key("email_address", "an email address is required")],
            })
        );
    }

    fn form(double_opt_in: bool) -> FormDef {
        FormDef {
            slug: "news".into(),
            name: "Newsletter".into(),
            schema_id: "sch_1".into(),
            fields: BTreeMap::from([("email".into(), "email".into())]),
            topic_ids: vec!["top_a".into()],
            double_opt_in,
            confirmation_template_id: None,
            enabled: true,
        }
    }

    /// A submission of form `frm_1` (a form post from a page when `urlencoded`).
    fn submit(site: &send::Site, urlencoded: bool) -> SubmitForm<'_> {
        SubmitForm { form_id: "frm_1".into(), fields: Map::new(), urlencoded, token_ttl_hours: 24, site }
    }

    fn site() -> send::Site {
        send::Site {
            base_url: "https://mail.test/v1".into(),
            links: mail::tracking::Links::derive(|_| [7; 32], 1, &[]),
        }
    }

    /// A submission of `a@example.com` by an existing contact that holds that address and is
    /// subscribed to nothing yet, to a form whose schema has the email consent attribute
    /// `news`.
    fn submission(double_opt_in: bool) -> Submission {
        let record = domain::records::RecordState {
            record_id: "con_1".into(),
            space_id: "spc_1".into(),
            schema_id: "sch_1".into(),
            schema_type: "contact".into(),
            source: "api".into(),
            created_at_ms: 0,
            updated_at_ms: 0,
            personal: Some(proto::RecordPersonal { email: Some("a@example.com".into()), ..Default::default() }),
        };
        let news = json!({"news": {"type": "boolean", "consent": {"channel": "email"}}});
        let context = crate::records::decide::fixtures::context(news, 0);
        let schema = records::write_schema(&context, "spc_1");
        let input = crate::records::decide::fixtures::input(json!({"email": "a@example.com"}));
        let input = records::parse_input(&schema, input).expect("valid");
        let upsert = UpsertLoaded { input, owners: Default::default(), target: Some((2, record, None)) };
        let open = Open {
            context,
            upsert,
            subscribed: BTreeMap::new(),
            confirmation: None,
            page_text: PageTextDef::default(),
        };
        Submission { space_id: "spc_1".into(), form: form(double_opt_in), open: Some(Box::new(open)) }
    }

    fn open(submission: &mut Submission) -> &mut Open {
        submission.open.as_deref_mut().expect("an open form's submission")
    }

    /// The digest of the token a test's decision draws second (after the submission's id).
    fn token_digest() -> String {
        let keyring = platform::crypto::Keyring::from_hex(platform::crypto::TEST_MASTER_KEY).expect("the test keyring");
        keyring.digest("form-token", "token_2")
    }

    fn subscription(status: &str, source: &str) -> LogEvent {
        LogEvent::SubscriptionChanged(proto::SubscriptionChanged {
            space_id: "spc_1".into(),
            contact_id: "con_1".into(),
            topic_id: "top_a".into(),
            status: status.into(),
            source: source.into(),
            source_id: "frm_1".into(),
            at_ms: NOW_MS,
        })
    }

    fn submitted(pending: bool, token_digest: &str, expires_at_ms: i64) -> LogEvent {
        LogEvent::FormSubmitted(proto::FormSubmitted {
            submission_id: "sub_1".into(),
            form_id: "frm_1".into(),
            space_id: "spc_1".into(),
            contact_id: "con_1".into(),
            pending,
            topic_ids: vec!["top_a".into()],
            token_digest: token_digest.into(),
            expires_at_ms,
            at_ms: NOW_MS,
        })
    }

    fn events(outcome: &Outcome) -> Vec<LogEvent> {
        outcome.events().into_iter().cloned().collect()
    }

    #[test]
    fn a_submission_without_double_opt_in_subscribes_at_once() {
        let site = site();
        let command = submit(&site, false);
        let Submitted { outcome, confirmation } = given(submission(false)).when(&command).decided();
        assert!(confirmation.is_none());
        let [LogEvent::RecordUpdated(consented), subscribed, form_submitted] = &events(&outcome)[..] else {
            panic!("the consent, the subscription and the submission: {:?}", events(&outcome))
        };
        assert_eq!(
            (consented.changed_keys.as_slice(), consented.change_source.as_str()),
            (&["news".to_owned()][..], "form")
        );
        assert_eq!([subscribed, form_submitted], [&subscription("subscribed", "form"), &submitted(false, "", 0)]);
        let Outcome::Append(writes) = outcome else { panic!("appended") };
        assert_eq!(writes.space_id.as_deref(), Some("spc_1"));
        assert_eq!(writes.reply, Reply::ok(json!({"submissionId": "sub_1", "status": "subscribed"})));
    }

    #[test]
    fn a_double_opt_in_submission_waits_under_its_token_and_a_browser_gets_a_page() {
        let site = site();
        let command = submit(&site, true);
        let Submitted { outcome, .. } = given(submission(true)).when(&command).decided();
        let expires_at_ms = NOW_MS + 24 * 3_600_000;
        // No consent is written: it waits for the confirmation.
        assert_eq!(
            events(&outcome),
            [subscription("pending", "form"), submitted(true, &token_digest(), expires_at_ms)]
        );
        let Outcome::Append(writes) = outcome else { panic!("appended") };
        assert_eq!(writes.guards.len(), 1, "the token's insert");
        let Some(page) = crate::pipeline::html_of(&writes.reply) else { panic!("a page") };
        assert!(page.contains("follow the link to confirm"), "{page}");
        let mut off = submission(true);
        off.form.enabled = false;
        given(off).when(&command).then_refused(Refusal::Disabled);
    }

    #[test]
    fn a_submission_whose_address_another_record_holds_is_confirmed_to_no_one() {
        // The address is held by a record being deleted: the new contact is written without
        // it, and its confirmation is skipped at the gate, not failed.
        let site = site();
        let command = submit(&site, true);
        let mut loaded = submission(true);
        let address = "a@example.com".to_owned();
        let open = open(&mut loaded);
        open.upsert.target = None;
        open.upsert.owners =
            domain::records::decide::Owners::from([(("email".to_owned(), address.clone()), "con_other".to_owned())]);
        let authored = crate::templates::decide::fixtures::authored("Confirm");
        open.confirmation = Some(ConfirmationEmail { authored, address, suppressed: false, suppressed_by: None });
        let Submitted { outcome, confirmation } = given(loaded).when(&command).decided();
        assert!(confirmation.is_none(), "nothing is handed off");
        let skipped = events(&outcome).into_iter().find_map(|event| match event {
            LogEvent::EmailSkipped(skipped) => Some(skipped),
            _ => None,
        });
        assert_eq!(skipped.map(|skipped| skipped.gate), Some(send::Gate::NoAddress.as_str().to_owned()));
    }

    fn confirm(json: bool) -> ConfirmSubmission {
        ConfirmSubmission { form_id: "frm_1".into(), digest: "digest".into(), json, decided: RefCell::new(None) }
    }

    #[test]
    fn following_the_link_confirms_once_and_again_is_a_success() {
        let open = Confirmation::Open {
            space_id: "spc_1".into(),
            form: form(true),
            submission_id: "sub_1".into(),
            contact_id: "con_1".into(),
            consent: None,
            subscribed: BTreeMap::from([("top_a".to_owned(), "pending".to_owned())]),
            words: PageText::default(),
        };
        let reply = given(open).when(&confirm(true)).then_events(&[
            subscription("subscribed", "confirmation"),
            LogEvent::SubmissionConfirmed(proto::SubmissionConfirmed {
                submission_id: "sub_1".into(),
                form_id: "frm_1".into(),
                space_id: "spc_1".into(),
                contact_id: "con_1".into(),
                at_ms: NOW_MS,
            }),
        ]);
        let confirmed = Reply::ok(json!({"formId": "frm_1", "status": "confirmed"}));
        assert_eq!(reply, confirmed);
        let done = || Confirmation::Done(form(true), PageText::default());
        assert_eq!(given(done()).when(&confirm(true)).decided().reply(), Some(&confirmed));
        let page = given(done()).when(&confirm(false)).decided();
        assert!(page.reply().and_then(crate::pipeline::html_of).is_some());
    }

    /// The space's page text: `language` holds the locale; German words for the form's pages.
    fn german() -> PageTextDef {
        PageTextDef {
            locale_attribute: Some("language".into()),
            default_locale: Some("en".into()),
            locales: BTreeMap::from([(
                "de".to_owned(),
                BTreeMap::from([
                    (
                        "form.pending".to_owned(),
                        "Danke. Bitte bestätigen Sie den Link in Ihrem Posteingang.".to_owned(),
                    ),
                    ("form.confirmed".to_owned(), "Ihr Abonnement ist bestätigt.".to_owned()),
                ]),
            )]),
        }
    }

    #[test]
    fn a_submitters_pages_speak_the_contacts_locale_and_the_token_keeps_it() {
        let site = site();
        let command = submit(&site, true);
        let mut loaded = submission(true);
        open(&mut loaded).page_text = german();
        if let Some((_, contact, _)) = open(&mut loaded).upsert.target.as_mut() {
            let mut personal = contact.personal.clone().unwrap_or_default();
            personal.values_json = json!({"language": "de-CH"}).to_string();
            contact.personal = Some(personal);
        }
        let Submitted { outcome, .. } = given(loaded).when(&command).decided();
        let Outcome::Append(writes) = outcome else { panic!("appended") };
        let Some(page) = crate::pipeline::html_of(&writes.reply) else { panic!("a page") };
        assert!(page.contains("<html lang=\"de\" dir=\"ltr\">"), "{page}");
        assert!(page.contains("Bitte bestätigen"), "{page}");
        // The token keeps the page's locale for the confirmation link.
        let params = format!("{:?}", writes.guards[0].params);
        assert!(params.contains("\"de\""), "{params}");
        // A contact without a locale: the space's default, English here.
        let mut plain = submission(true);
        open(&mut plain).page_text = german();
        let Submitted { outcome, .. } = given(plain).when(&command).decided();
        let Outcome::Append(writes) = outcome else { panic!("appended") };
        let Some(page) = crate::pipeline::html_of(&writes.reply) else { panic!("a page") };
        assert!(page.contains("<html lang=\"en\"") && page.contains("follow the link to confirm"), "{page}");
        let words = PageText::of(&german(), Some("de"));
        let page = given(Confirmation::Done(form(true), words)).when(&confirm(false)).decided();
        let Some(page) = page.reply().and_then(crate::pipeline::html_of) else { panic!("a page") };
        assert!(page.contains("Ihr Abonnement ist bestätigt."), "{page}");
    }

    #[test]
    fn an_unknown_or_expired_link_is_refused() {
        given(Confirmation::Unknown).when(&confirm(false)).then_refused(Refusal::LinkNotFound);
        given(Confirmation::Expired).when(&confirm(false)).then_refused(Refusal::LinkExpired);
    }
}
