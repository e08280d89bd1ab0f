//! Builds the MIME message of an email (multipart text + HTML), DKIM-signed with its domain's
//! key. The bytes depend only on what the log holds (the Message-ID comes from the email id
//! and the Date from its scheduling), so the outbox worker rebuilds the same message the
//! inline hand-off would have sent.

use std::time::{Duration, SystemTime};

use anyhow::Context;
use lettre::message::dkim::{
    DkimCanonicalization, DkimCanonicalizationType, DkimConfig, DkimSigningAlgorithm, DkimSigningKey,
};
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
}

impl Outgoing {
    /// The message of an email from its sender, domain and content. Marketing mail carries the
    /// one-click unsubscribe URL under `public_base_url` (D6).
    pub fn new(
        email_id: &str,
        sender: &super::resources::SenderDef,
        domain: &super::resources::DomainDef,
        content: &crate::proto::EmailContent,
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
        }
    }
}

/// The one-click unsubscribe URL of an email (RFC 8058, D6).
pub fn unsubscribe_url(public_base_url: &str, email_id: &str) -> String {
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

/// The signed message, ready for the relay (its envelope inside).
pub fn build(outgoing: &Outgoing, signing: &Signing<'_>) -> anyhow::Result<Message> {
    let from_address: Address = outgoing.from_address.parse().context("the sender's address")?;
    let to: Address = outgoing.to.parse().context("the recipient's address")?;
    let bounce: Address =
        format!("bounce+{}@{}", outgoing.email_id, outgoing.return_path).parse().context("the return path")?;
    let envelope = lettre::address::Envelope::new(Some(bounce), vec![to.clone()])?;
    let date = SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(outgoing.scheduled_at_ms).unwrap_or(0));
    let mut builder = Message::builder()
        .from(Mailbox::new(Some(outgoing.from_name.clone()), from_address))
        .to(Mailbox::new(None, to))
        .subject(outgoing.subject.clone())
        .date(date)
        .message_id(Some(message_id(&outgoing.email_id, &outgoing.domain)))
        .envelope(envelope);
    if let Some(reply_to) = &outgoing.reply_to {
        builder = builder.reply_to(Mailbox::new(None, reply_to.parse().context("the reply-to address")?));
    }
    let mut headers = vec!["From", "To", "Subject", "Date", "Message-ID"];
    if let Some(url) = &outgoing.unsubscribe_url {
        builder = builder.header(ListUnsubscribe(format!("<{url}>"))).header(ListUnsubscribePost);
        headers.extend(["List-Unsubscribe", "List-Unsubscribe-Post"]);
    }
    let mut message =
        builder.multipart(MultiPart::alternative_plain_html(outgoing.text.to_owned(), outgoing.html.to_owned()))?;
    let config = dkim_config(signing, &outgoing.domain, &headers)?;
    message.sign(&config);
    Ok(message)
}

/// Signing configurations by selector, domain, key (its digest) and signed headers. Parsing
/// an RSA key and precomputing its CRT values costs more than the signature, so a process
/// parses each key once.
type ConfigKey = (String, String, [u8; 32], Vec<&'static str>);
static CONFIGS: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<ConfigKey, std::sync::Arc<DkimConfig>>>,
> = std::sync::LazyLock::new(Default::default);

fn dkim_config(
    signing: &Signing<'_>,
    domain: &str,
    headers: &[&'static str],
) -> anyhow::Result<std::sync::Arc<DkimConfig>> {
    use sha2::Digest;
    let digest: [u8; 32] = sha2::Sha256::digest(signing.pem.as_bytes()).into();
    let key = (signing.selector.to_owned(), domain.to_owned(), digest, headers.to_vec());
    if let Some(config) = CONFIGS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key) {
        return Ok(std::sync::Arc::clone(config));
    }
    let signing_key = DkimSigningKey::new(signing.pem, DkimSigningAlgorithm::Rsa)
        .map_err(|error| anyhow::anyhow!("the domain's DKIM key: {error:?}"))?;
    let config = std::sync::Arc::new(DkimConfig::new(
        signing.selector.to_owned(),
        domain.to_owned(),
        signing_key,
        headers.iter().map(|name| HeaderName::new_from_ascii_str(name)).collect(),
        DkimCanonicalization { header: DkimCanonicalizationType::Relaxed, body: DkimCanonicalizationType::Relaxed },
    ));
    CONFIGS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key, std::sync::Arc::clone(&config));
    Ok(config)
}
