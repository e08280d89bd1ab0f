//! Builds the MIME message of an email (multipart text + HTML), DKIM-signed with its domain's
//! key. Its headers depend only on what the log holds (the Message-ID comes from the email
//! id, the Date and the signature's time from its scheduling), so the outbox worker rebuilds
//! the message the inline hand-off would have sent (only the MIME boundary differs).

use std::time::{Duration, SystemTime};

use anyhow::Context;
use lettre::message::header::{Header, HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart};
use lettre::{Address, Message};

/// Everything a message is built from.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub email_id: String,
    pub from_name: String,
    pub from_address: String,
    pub reply_to: Option<String>,
    pub to: String,
    pub subject: String,
    pub html: String,
    pub text: String,
    pub scheduled_at_ms: i64,
    /// The one-click unsubscribe URL, for marketing mail (RFC 8058).
    pub unsubscribe_url: Option<String>,
    /// The envelope sender's domain: bounces return to `bounce+<emailId>@<return path>`.
    pub return_path: String,
    /// The sending domain: the right side of the Message-ID and the DKIM `d=`.
    pub domain: String,
    /// The language tag of its content (`Content-Language`), when its template names one.
    pub language: Option<String>,
    /// A test send of its template: marked `X-Test-Send: true`, and no `List-Unsubscribe`.
    pub test: bool,
}

impl Outgoing {
    /// The message of an email from its sender, domain and content. Marketing mail carries the
    /// one-click unsubscribe URL under `public_base_url` (D6).
    pub fn new(
        email_id: &str,
        sender: &domain::email::resources::SenderDef,
        domain: &domain::email::resources::DomainDef,
        content: &platform::proto::EmailContent,
        (scheduled_at_ms, marketing): (i64, bool),
        public_base_url: &str,
    ) -> Self {
        Self {
            email_id: email_id.to_owned(),
            from_name: sender.from_name.clone(),
            from_address: sender.from_address.clone(),
            reply_to: sender.reply_to.clone(),
            to: content.to_address.clone(),
            subject: content.subject.clone(),
            html: content.html.clone(),
            text: content.text.clone(),
            scheduled_at_ms,
            unsubscribe_url: marketing.then(|| unsubscribe_url(public_base_url, email_id)),
            return_path: domain.return_path.clone(),
            domain: domain.name.clone(),
            language: None,
            test: false,
        }
    }

    /// A test send's message (`POST /templates/{id}/test`).
    pub fn as_test(mut self) -> Self {
        self.test = true;
        self.unsubscribe_url = None;
        self
    }

    /// The message says its content is in `tag` (`Content-Language`, RFC 3282).
    pub fn in_language(mut self, tag: Option<&str>) -> Self {
        self.language = tag.filter(|tag| !tag.is_empty()).map(str::to_owned);
        self
    }
}

/// The one-click unsubscribe URL of an email (RFC 8058, D6).
pub(crate) fn unsubscribe_url(public_base_url: &str, email_id: &str) -> String {
    format!("{}/emails/{email_id}/unsubscribe", public_base_url.trim_end_matches('/'))
}

/// The DKIM key to sign with.
pub struct Signing<'a> {
    pub selector: &'a str,
    pub pem: &'a str,
}

/// The Message-ID of an email.
pub fn message_id(email_id: &str, domain: &str) -> String {
    format!("<{email_id}@{domain}>")
}

#[derive(Clone)]
struct ListUnsubscribe(String);

impl Header for ListUnsubscribe {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str("List-Unsubscribe")
    }
    fn parse(text: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Self(text.to_owned()))
    }
    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), self.0.clone())
    }
}

#[derive(Clone)]
struct ContentLanguage(String);

impl Header for ContentLanguage {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str("Content-Language")
    }
    fn parse(text: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Self(text.to_owned()))
    }
    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), self.0.clone())
    }
}

/// The mark of a test send.
#[derive(Clone)]
struct TestSend;

impl Header for TestSend {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str(TEST_HEADER)
    }
    fn parse(_: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Self)
    }
    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), "true".to_owned())
    }
}

/// The header that marks a test send: `X-Test-Send: true`.
pub const TEST_HEADER: &str = "X-Test-Send";

#[derive(Clone)]
struct ListUnsubscribePost;

impl Header for ListUnsubscribePost {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str("List-Unsubscribe-Post")
    }
    fn parse(_: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Self)
    }
    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), "List-Unsubscribe=One-Click".to_owned())
    }
}

/// A signed message as it goes to the relay: its envelope and its bytes.
#[derive(Debug, Clone)]
pub struct Signed {
    pub envelope: lettre::address::Envelope,
    pub bytes: Vec<u8>,
}

/// The signed message, ready for the relay: built by lettre, DKIM-signed here
/// ([`crate::dkim_sign`]).
pub fn build(outgoing: &Outgoing, signing: &Signing<'_>) -> anyhow::Result<Signed> {
    let from_address: Address = outgoing.from_address.parse().context("the sender's address")?;
    let to: Address = outgoing.to.parse().context("the recipient's address")?;
    let bounce: Address =
        format!("bounce+{}@{}", outgoing.email_id, outgoing.return_path).parse().context("the return path")?;
    let envelope = lettre::address::Envelope::new(Some(bounce), vec![to.clone()])?;
    let scheduled_ms = u64::try_from(outgoing.scheduled_at_ms).unwrap_or(0);
    let date = SystemTime::UNIX_EPOCH + Duration::from_millis(scheduled_ms);
    let mut builder = Message::builder()
        .from(Mailbox::new(Some(outgoing.from_name.clone()), from_address))
        .to(Mailbox::new(None, to))
        .subject(outgoing.subject.clone())
        .date(date)
        .message_id(Some(message_id(&outgoing.email_id, &outgoing.domain)))
        .envelope(envelope.clone());
    if let Some(reply_to) = &outgoing.reply_to {
        builder = builder.reply_to(Mailbox::new(None, reply_to.parse().context("the reply-to address")?));
    }
    let mut headers = vec!["From", "To", "Subject", "Date", "Message-ID"];
    if let Some(url) = &outgoing.unsubscribe_url {
        builder = builder.header(ListUnsubscribe(format!("<{url}>"))).header(ListUnsubscribePost);
        headers.extend(["List-Unsubscribe", "List-Unsubscribe-Post"]);
    }
    if outgoing.test {
        builder = builder.header(TestSend);
        headers.push(TEST_HEADER);
    }
    if let Some(language) = &outgoing.language {
        // A canonical tag is ASCII letters, digits and `-` (`domain::email::locale`).
        builder = builder.header(ContentLanguage(language.clone()));
        headers.push("Content-Language");
    }
    let message =
        builder.multipart(MultiPart::alternative_plain_html(outgoing.text.to_owned(), outgoing.html.to_owned()))?;
    let unsigned = message.formatted();
    let signer = crate::dkim_sign::Signer::cached(signing.pem, signing.selector, &outgoing.domain)?;
    // The signature's time is the scheduling's, so a rebuilt message is the same message.
    let header = signer.sign(&unsigned, &headers, scheduled_ms / 1000)?;
    let mut bytes = Vec::with_capacity(header.len() + unsigned.len());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&unsigned);
    Ok(Signed { envelope, bytes })
}
