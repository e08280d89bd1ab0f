//! The authored email resources as the catalog holds them (the workspace file's entries,
//! checked and with their references resolved to ids at apply), and their public documents.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub const DOMAIN: &str = "domain";
pub const SENDER: &str = "sender";
pub const TOPIC: &str = "topic";
pub const TEMPLATE: &str = "template";
pub const FORM: &str = "form";
pub const ALLOWANCE: &str = "email_allowance";
pub const BROADCAST: &str = "broadcast";
/// The space's send policy (`domain::email::send::SendPolicy`), one per space, its id the
/// space's.
pub const SEND_POLICY: &str = "send_policy";
/// A reusable block of content, rendered with Liquid's `{% render 'slug' %}` ([`PartDef`]).
pub const PARTIAL: &str = "partial";
/// A frame around a template's body, which it holds at `{{ content }}` ([`PartDef`]).
pub const LAYOUT: &str = "layout";
/// The words of the space's recipient pages in its locales ([`PageTextDef`]), one per space,
/// its id the space's.
pub const PAGE_TEXT: &str = "page_text";

/// A domain's signing key as stored in its definition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredKey {
    pub selector: String,
    /// Base64 of the SubjectPublicKeyInfo: the `p=` of the DKIM record.
    pub public_key: String,
    /// The wrapped data key and the PKCS#1 PEM encrypted under it, both base64.
    pub wrapped_key: String,
    pub private_key: String,
}

/// The DKIM TXT record's value for a public key.
pub(crate) fn dkim_record_value(public_key: &str) -> String {
    format!("v=DKIM1; k=rsa; p={public_key}")
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DomainDef {
    pub slug: String,
    /// The domain name, lowercase (`example.com`).
    pub name: String,
    pub dkim: StoredKey,
    /// The envelope sender's domain (`bounces.example.com`); bounces come back there.
    pub return_path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SenderDef {
    pub slug: String,
    pub from_name: String,
    pub from_address: String,
    pub domain_id: String,
    #[serde(default)]
    pub reply_to: Option<String>,
    /// The sender's physical postal address, printed in the footer of its marketing mail
    /// (CAN-SPAM): the sender's own, or the space's (`postalAddress` in the workspace file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postal_address: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopicDef {
    pub slug: String,
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// Its name and description in other locales, by canonical tag.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub locales: BTreeMap<String, TopicText>,
}

/// A topic's name and description in one locale.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopicText {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
}

impl TopicDef {
    /// Its name and description as a page in locale `tag` shows them: the variant of the
    /// exact tag, else of its language, else its own.
    pub fn in_locale(&self, tag: &str) -> (&str, Option<&str>) {
        let (picked, _) = crate::email::locale::pick(Some(tag), "", self.locales.keys().map(String::as_str));
        match self.locales.get(picked) {
            Some(text) => (&text.name, text.description.as_deref().or(self.description.as_deref())),
            None => (&self.name, self.description.as_deref()),
        }
    }
}

/// The space's locale setting as its recipient pages read it, and the words of those pages
/// the space gives per locale (key → text; the platform's English stands for a key not
/// given). Stored whenever the space names a locale attribute or gives page text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PageTextDef {
    /// The contact attribute that holds a contact's locale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locale_attribute: Option<String>,
    /// The tag of contacts without a locale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_locale: Option<String>,
    /// Canonical tag → page text key → text.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub locales: BTreeMap<String, BTreeMap<String, String>>,
}

/// The language of the platform's own page text, which every other falls back to.
pub const PAGE_FALLBACK_LOCALE: &str = "en";

impl PageTextDef {
    /// The locale a page for a reader of `wanted` (the locale of the email the page belongs
    /// to, or the contact's) is shown in: the space's text of the exact tag, else of its
    /// language; failing both, the same for the space's default locale; failing that, the
    /// platform's English.
    pub fn locale_for(&self, wanted: Option<&str>) -> &str {
        use crate::email::locale::{Matched, pick};
        let given = || self.locales.keys().map(String::as_str);
        for wanted in [wanted, self.default_locale.as_deref()].into_iter().flatten() {
            let (tag, matched) = pick(Some(wanted), PAGE_FALLBACK_LOCALE, given());
            if matched != Matched::Default {
                return tag;
            }
        }
        PAGE_FALLBACK_LOCALE
    }

    /// The text the space gives in `tag` (empty for the platform's English unless given).
    pub fn text_of(&self, tag: &str) -> Option<&BTreeMap<String, String>> {
        self.locales.get(tag)
    }

    /// The locale held by a contact document's locale attribute, canonical (`None` when the
    /// space names no attribute, or the value is absent or no tag).
    pub fn locale_in(&self, document: &Value) -> Option<String> {
        let attribute = self.locale_attribute.as_deref()?;
        crate::email::locale::normalize(document.get(attribute)?.as_str()?)
    }
}

/// What a template expects under one context key: a record of this schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContextKey {
    pub schema_id: String,
    pub schema_slug: String,
    /// `contact` or `object`.
    pub schema_type: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateDef {
    pub slug: String,
    pub name: String,
    /// `transactional` or `marketing`.
    pub kind: String,
    pub sender_id: String,
    #[serde(default)]
    pub topic_id: Option<String>,
    pub subject: String,
    pub html: String,
    pub text: String,
    /// The context key whose record (a contact) receives the mail.
    pub recipient: String,
    pub data: BTreeMap<String, ContextKey>,
    /// What is tracked in its mail: the template's choice, already narrowed by the space's
    /// (`emailTracking`). Absent in definitions applied before tracking existed: the kind's
    /// default ([`TemplateDef::tracking`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking: Option<TrackingDef>,
    /// The tag of the default variant (`subject`, `html`, `text` above): the template's
    /// `locale`, else the space's default. Absent when neither names one: the mail then
    /// says no language.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locale: Option<String>,
    /// The other variants, by canonical tag.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub locales: BTreeMap<String, Variant>,
    /// The contact attribute that holds a contact's locale (the space's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locale_attribute: Option<String>,
    /// The layout its bodies are rendered into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout_id: Option<String>,
    /// Every partial its variants and its layout render, directly or through another
    /// partial: slug → id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub partials: BTreeMap<String, String>,
}

/// One locale's content of a template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Variant {
    pub subject: String,
    pub html: String,
    pub text: String,
}

/// A partial or a layout: its default content and its variants by canonical tag. A
/// partial's `text` is what a text body or a subject renders (its HTML by default); a
/// layout holds the template's rendered body at `{{ content }}` in both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartDef {
    pub slug: String,
    pub html: String,
    pub text: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub locales: BTreeMap<String, PartVariant>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartVariant {
    pub html: String,
    pub text: String,
}

impl PartDef {
    /// The HTML and text of the variant for `tag`, by the same chain as the template's.
    pub fn variant(&self, tag: Option<&str>) -> (&str, &str) {
        let chosen = tag.and_then(|tag| {
            let (tag, matched) = super::locale::pick(Some(tag), "", self.locales.keys().map(String::as_str));
            (matched != super::locale::Matched::Default).then_some(tag)
        });
        match chosen.and_then(|tag| self.locales.get(tag)) {
            Some(variant) => (&variant.html, &variant.text),
            None => (&self.html, &self.text),
        }
    }
}

impl TemplateDef {
    /// The variant a contact whose locale is `wanted` (canonical) reads: its tag (`None` when
    /// the template names no locale), how it matched, and its content.
    pub fn variant(&self, wanted: Option<&str>) -> (Option<&str>, super::locale::Matched, (&str, &str, &str)) {
        let default = (self.subject.as_str(), self.html.as_str(), self.text.as_str());
        let Some(default_tag) = self.locale.as_deref() else {
            return (None, super::locale::Matched::Default, default);
        };
        let (tag, matched) = super::locale::pick(wanted, default_tag, self.locales.keys().map(String::as_str));
        let content = match self.locales.get(tag) {
            Some(variant) if tag != default_tag => {
                (variant.subject.as_str(), variant.html.as_str(), variant.text.as_str())
            }
            _ => default,
        };
        (Some(tag), matched, content)
    }

    /// What its mail tracks: as authored, or by default opens and clicks in marketing mail
    /// and nothing in transactional mail.
    pub fn tracking(&self) -> TrackingDef {
        self.tracking.unwrap_or_else(|| TrackingDef::default_for(&self.kind))
    }
}

/// Click and open tracking of a template's mail (or a space's switch over all of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrackingDef {
    pub clicks: bool,
    pub opens: bool,
}

impl TrackingDef {
    /// Marketing mail is tracked; transactional mail only when its template says so.
    pub fn default_for(kind: &str) -> Self {
        let marketing = kind == "marketing";
        Self { clicks: marketing, opens: marketing }
    }

    /// What both allow.
    pub fn and(self, other: Self) -> Self {
        Self { clicks: self.clicks && other.clicks, opens: self.opens && other.opens }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FormDef {
    pub slug: String,
    pub name: String,
    /// The contact schema submissions write to.
    pub schema_id: String,
    /// Form field name → contact attribute key or identity field (`email`, `phone`, `userId`).
    pub fields: BTreeMap<String, String>,
    pub topic_ids: Vec<String>,
    pub double_opt_in: bool,
    /// The transactional template of the confirmation email (double opt-in only); it is
    /// rendered with `contact` and `confirmUrl`.
    #[serde(default)]
    pub confirmation_template_id: Option<String>,
    pub enabled: bool,
}

/// Who a broadcast goes to: the contacts of a segment, or those subscribed to a topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum Audience {
    Segment {
        #[serde(rename = "segmentId")]
        segment_id: String,
    },
    Topic {
        #[serde(rename = "topicId")]
        topic_id: String,
    },
}

impl Audience {
    pub fn to_proto(&self) -> kernel::proto::BroadcastAudience {
        match self {
            Audience::Segment { segment_id } => {
                kernel::proto::BroadcastAudience { segment_id: segment_id.clone(), topic_id: String::new() }
            }
            Audience::Topic { topic_id } => {
                kernel::proto::BroadcastAudience { segment_id: String::new(), topic_id: topic_id.clone() }
            }
        }
    }

    pub(crate) fn from_proto(audience: &kernel::proto::BroadcastAudience) -> Option<Self> {
        match (audience.segment_id.as_str(), audience.topic_id.as_str()) {
            ("", "") => None,
            (segment_id, "") => Some(Audience::Segment { segment_id: segment_id.to_owned() }),
            (_, topic_id) => Some(Audience::Topic { topic_id: topic_id.to_owned() }),
        }
    }
}

/// A broadcast as authored: a marketing template sent to an audience, from the template's
/// sender or its own, now or at `scheduledAt`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BroadcastDef {
    pub slug: String,
    pub name: String,
    pub template_id: String,
    /// Replaces the template's sender when set.
    #[serde(default)]
    pub sender_id: Option<String>,
    pub audience: Audience,
    /// When a send starts its run (Unix milliseconds); `None`: at once.
    #[serde(default)]
    pub scheduled_at_ms: Option<i64>,
    /// A test of variants on a share of the audience before the winner goes to the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experiment: Option<super::experiments::ExperimentDef>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllowanceDef {
    /// Emails a space may send per calendar month (UTC).
    pub monthly: i64,
}

/// The DNS records a domain must publish: `(purpose, type, name, value)`.
pub fn dns_records(domain: &DomainDef, platform_host: &str) -> Vec<(&'static str, &'static str, String, String)> {
    vec![
        ("spf", "TXT", domain.name.clone(), format!("v=spf1 include:_spf.{platform_host} ~all")),
        (
            "dkim",
            "TXT",
            format!("{}._domainkey.{}", domain.dkim.selector, domain.name),
            dkim_record_value(&domain.dkim.public_key),
        ),
        ("dmarc", "TXT", format!("_dmarc.{}", domain.name), "v=DMARC1; p=none".to_owned()),
        ("returnPath", "CNAME", domain.return_path.clone(), format!("bounces.{platform_host}")),
    ]
}

/// A domain's public document; `checks` holds what verification last found per purpose
/// (`found` values and when), absent before the first check.
pub fn domain_document(id: &str, domain: &DomainDef, platform_host: &str, checks: &BTreeMap<String, Value>) -> Value {
    let records: Vec<Value> = dns_records(domain, platform_host)
        .into_iter()
        .map(|(purpose, kind, name, value)| {
            let check = checks.get(purpose);
            let found = check.and_then(|check| check.get("found")).cloned().unwrap_or(Value::Array(Vec::new()));
            let verified =
                found.as_array().is_some_and(|found| found.iter().any(|v| v.as_str() == Some(value.as_str())));
            json!({
                "purpose": purpose,
                "type": kind,
                "name": name,
                "value": value,
                "status": match check { None => "pending", Some(_) if verified => "verified", Some(_) => "failed" },
                "found": found,
                "checkedAt": check.and_then(|check| check.get("checkedAt")).cloned().unwrap_or(Value::Null),
            })
        })
        .collect();
    let all_verified = records.iter().all(|record| record["status"] == "verified");
    let any_checked = records.iter().any(|record| record["status"] != "pending");
    json!({
        "id": id,
        "name": domain.name,
        "status": if all_verified { "verified" } else if any_checked { "failed" } else { "pending" },
        "dkimSelector": domain.dkim.selector,
        "returnPath": domain.return_path,
        "records": records,
    })
}

pub fn sender_document(id: &str, sender: &SenderDef) -> Value {
    json!({
        "id": id,
        "slug": sender.slug,
        "fromName": sender.from_name,
        "fromAddress": sender.from_address,
        "replyTo": sender.reply_to,
        "domainId": sender.domain_id,
        "postalAddress": sender.postal_address,
    })
}

pub fn topic_document(id: &str, topic: &TopicDef) -> Value {
    json!({
        "id": id,
        "slug": topic.slug,
        "name": topic.name,
        "description": topic.description,
        "locales": topic.locales,
    })
}

/// A form's public document, with the public URLs under `public_base_url` (with `/v1`) that
/// a page posts to and that a confirmation email links to (`{token}` stands for the token).
pub fn form_document(id: &str, form: &FormDef, public_base_url: &str) -> Value {
    let base = public_base_url.trim_end_matches('/');
    json!({
        "id": id,
        "slug": form.slug,
        "name": form.name,
        "enabled": form.enabled,
        "schemaId": form.schema_id,
        "fields": form.fields,
        "topicIds": form.topic_ids,
        "doubleOptIn": form.double_opt_in,
        "confirmationTemplateId": form.confirmation_template_id,
        "submitUrl": format!("{base}/forms/{id}/submit"),
        "confirmUrl": form.double_opt_in.then(|| format!("{base}/forms/{id}/confirm/{{token}}")),
    })
}

pub fn template_document(id: &str, revision: i64, template: &TemplateDef) -> Value {
    let expected: serde_json::Map<String, Value> = template
        .data
        .iter()
        .map(|(key, expected)| {
            (
                key.clone(),
                json!({
                    "schemaId": expected.schema_id,
                    "schemaSlug": expected.schema_slug,
                    "schemaType": expected.schema_type,
                    "recipient": *key == template.recipient,
                }),
            )
        })
        .collect();
    json!({
        "id": id,
        "slug": template.slug,
        "name": template.name,
        "kind": template.kind,
        "senderId": template.sender_id,
        "topicId": template.topic_id,
        "subject": template.subject,
        "revision": revision,
        "recipientKey": template.recipient,
        "expectedDataRepresentation": expected,
    })
}
