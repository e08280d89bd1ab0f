//! Scheduling one email from an authored template: what a template send, a form's
//! confirmation, a broadcast run and a workflow's send step share. Each renders through
//! [`render_email`] (the only public way to render a template), so no path sends marketing
//! mail without its visible unsubscribe link. The email gets a new stream holding
//! `EmailScheduled` (its content sealed under the contact's key); its append carries the
//! outbox row (`outbox::insert_guard`) and, when the space has an allowance, the count
//! against it ([`allowance_guard`]).

use std::collections::BTreeMap;

use deadpool_postgres::GenericClient;

use serde_json::Value;

use super::tracking::{self, Links, Track};
use super::{footer, message, render};
use crate::outbox::{Parties, Prepared};
use domain::email::locale;
use domain::email::resources::{AllowanceDef, DomainDef, LAYOUT, PARTIAL, PartDef, SenderDef, TemplateDef, TopicDef};
use platform::error::Code;
use platform::events::LogEvent;
use platform::log::{AppendError, ExpectedVersion, Guard, NewEvent, SetValue, StreamAppend};
use platform::proto;

/// A template with its sender, the sender's domain, its topic and the space's allowance, as a
/// send reads them from the catalog.
#[derive(Debug, Clone)]
pub struct Authored {
    pub template_id: String,
    pub revision: i64,
    pub template: TemplateDef,
    pub sender_id: String,
    pub sender: SenderDef,
    pub domain: DomainDef,
    /// The template's topic (marketing templates only); its name is what the footer says the
    /// recipient subscribed to.
    pub topic: Option<TopicDef>,
    pub allowance: Option<AllowanceDef>,
    /// The space's send policy, if it has one (marketing mail only).
    pub policy: Option<domain::email::send::SendPolicy>,
    /// The layout and the partials the template renders.
    pub parts: Parts,
    /// Preview text for the start of the HTML body (a broadcast experiment's variant sets it).
    pub preheader: Option<String>,
}

/// A partial or a layout as a send reads it: its id, its revision and its definition.
#[derive(Debug, Clone)]
pub struct Part {
    pub id: String,
    pub revision: i64,
    pub def: PartDef,
}

/// The layout and the partials a template renders, each at its current revision.
#[derive(Debug, Clone, Default)]
pub struct Parts {
    pub layout: Option<Part>,
    pub partials: Vec<Part>,
    /// The partials as each locale of the template renders them, made once when the template
    /// is loaded rather than for each recipient ([`Parts::for_locale`]).
    by_tag: BTreeMap<Option<String>, (render::Partials, render::Partials)>,
}

impl Parts {
    /// From the catalog's rows (`{kind, id, revision, definition}`), checked against what
    /// the template names: a part it names and the catalog lacks is an error.
    fn from_rows(template: &TemplateDef, rows: Vec<Value>) -> anyhow::Result<Self> {
        let mut parts = Self::default();
        for row in rows {
            let part = Part {
                id: row["id"].as_str().unwrap_or_default().to_owned(),
                revision: row["revision"].as_i64().unwrap_or_default(),
                def: definition(Some(row["definition"].clone()), "a partial or layout")?,
            };
            match row["kind"].as_str() {
                Some(LAYOUT) => parts.layout = Some(part),
                _ => parts.partials.push(part),
            }
        }
        parts.partials.sort_by(|a, b| a.def.slug.cmp(&b.def.slug));
        if template.layout_id.is_some() != parts.layout.is_some() {
            anyhow::bail!("the template's layout {:?} is missing", template.layout_id);
        }
        for id in template.partials.values() {
            if !parts.partials.iter().any(|part| &part.id == id) {
                anyhow::bail!("the template's partial {id} is missing");
            }
        }
        // A send renders in the template's default tag or one of its variants' (or none).
        let tags = std::iter::once(template.locale.clone()).chain(template.locales.keys().cloned().map(Some));
        parts.by_tag = tags.map(|tag| (tag.clone(), parts.made_for(tag.as_deref()))).collect();
        Ok(parts)
    }

    /// The partials in the variant for `tag`, keyed by their ids, revisions and the tag.
    fn made_for(&self, tag: Option<&str>) -> (render::Partials, render::Partials) {
        let key: String = self
            .partials
            .iter()
            .map(|part| format!("{}@{}:{}|", part.id, part.revision, tag.unwrap_or_default()))
            .collect();
        let sources = self.partials.iter().map(|part| {
            let (html, text) = part.def.variant(tag);
            (part.def.slug.as_str(), html, text)
        });
        render::Partials::pair(&key, sources)
    }

    /// The partials in the variant for `tag`, as HTML bodies and as text bodies render them:
    /// made when the template was loaded, or now for parts made by hand.
    fn for_locale(&self, tag: Option<&str>) -> std::borrow::Cow<'_, (render::Partials, render::Partials)> {
        match self.by_tag.get(&tag.map(str::to_owned)) {
            Some(made) => std::borrow::Cow::Borrowed(made),
            None => std::borrow::Cow::Owned(self.made_for(tag)),
        }
    }

    /// Each part as the email records it: kind, id and revision.
    pub fn revisions(&self) -> Vec<proto::PartRevision> {
        let layout = self.layout.iter().map(|part| (LAYOUT, part));
        let partials = self.partials.iter().map(|part| (PARTIAL, part));
        layout
            .chain(partials)
            .map(|(kind, part)| proto::PartRevision {
                kind: kind.to_owned(),
                id: part.id.clone(),
                slug: part.def.slug.clone(),
                revision: part.revision,
            })
            .collect()
    }
}

fn definition<T: serde::de::DeserializeOwned>(found: Option<serde_json::Value>, what: &str) -> anyhow::Result<T> {
    let definition = found.ok_or_else(|| anyhow::anyhow!("{what} is missing"))?;
    serde_json::from_value(definition).map_err(|error| anyhow::anyhow!("{what}: {error}"))
}

impl Authored {
    /// The template `template_id` of the space, from catalog version schema `catalog`, in one
    /// statement; `None` when the space has no such template. `sender_id` replaces the
    /// template's sender (a broadcast's own sender).
    pub async fn load(
        client: &impl GenericClient,
        catalog: &str,
        space_id: &str,
        template_id: &str,
    ) -> anyhow::Result<Option<Self>> {
        let found = reads::catalog::email_template(client, catalog, space_id, template_id).await?;
        let Some(found) = found else { return Ok(None) };
        let template: TemplateDef = definition(Some(found.template), "the template")?;
        // Only the footer's wording needs the topic: without it, the footer names the sender.
        let topic = found.topic.and_then(|topic| serde_json::from_value(topic).ok());
        Ok(Some(Self {
            template_id: template_id.to_owned(),
            revision: found.revision,
            sender_id: template.sender_id.clone(),
            sender: definition(found.sender, "the template's sender")?,
            domain: definition(found.domain, "the sender's domain")?,
            topic,
            allowance: found.allowance.and_then(|allowance| serde_json::from_value(allowance).ok()),
            policy: found.policy.map(|policy| definition(Some(policy), "the space's send policy")).transpose()?,
            parts: Parts::from_rows(&template, found.parts)?,
            template,
            preheader: None,
        }))
    }

    fn is_marketing(&self) -> bool {
        self.template.kind == "marketing"
    }
}

/// Where a send's links point: the public base URL (with `/v1`) and the keys that sign
/// tracking links.
#[derive(Clone)]
pub struct Site {
    pub base_url: String,
    pub links: Links,
}

impl Site {
    /// From the email settings, with link keys derived from the process's master key.
    pub fn from_settings(settings: &platform::settings::EmailSettings) -> anyhow::Result<Self> {
        let keyring = platform::crypto::keyring()?;
        Ok(Self { base_url: settings.public_base_url.clone(), links: Links::from_settings(keyring, settings) })
    }
}

/// Renders the template for email `email_id` against `context` (an object: context key →
/// value), in the variant of the recipient's locale ([`locale_of`]), its body inside its
/// layout. Marketing mail also gets `unsubscribeUrl` (the URL of its `List-Unsubscribe`),
/// `postalAddress` and `subscribedTo` (what a layout's footer shows), and a footer with the
/// link and the address in each part that does not show them ([`footer::add`]); it says
/// the recipient subscribed to the topic, or to mail from the sender (the one that sends it,
/// so a broadcast's own sender is named). Transactional mail renders as authored. The HTML
/// says its language and direction ([`with_language`]). Then, as the template's tracking
/// says, the HTML part's links become tracking links and it gets the open pixel
/// ([`tracking::rewrite`]; the platform's own links stay as they are). The error names the
/// problem.
pub fn render_email(
    authored: &Authored,
    email_id: &str,
    context: Value,
    site: &Site,
) -> Result<render::Rendered, String> {
    let locale = locale_of(&authored.template, &context);
    render_in(authored, email_id, context, site, locale)
}

/// [`render_email`] in a locale chosen by the caller (a preview's).
pub fn render_in(
    authored: &Authored,
    email_id: &str,
    context: Value,
    site: &Site,
    locale: Wanted,
) -> Result<render::Rendered, String> {
    let mut rendered = render_untracked(authored, email_id, context, &site.base_url, locale)?;
    if let Some(preheader) = &authored.preheader {
        rendered.html = render::with_preheader(&rendered.html, preheader);
    }
    let tracking = authored.template.tracking();
    let track = Track { clicks: tracking.clicks, opens: tracking.opens };
    rendered.html = tracking::rewrite(&rendered.html, email_id, &site.base_url, &site.links, track);
    Ok(rendered)
}

pub use domain::email::PREVIEW_EMAIL_ID;

/// What a send of the template would render for `context`, in `locale`: the same variant,
/// layout, partials and footer, with its links as written (no tracking links, no open pixel)
/// and `unsubscribeUrl` naming [`PREVIEW_EMAIL_ID`]. Sends, counts and tracks nothing.
pub fn preview(authored: &Authored, context: Value, site: &Site, locale: Wanted) -> Result<render::Rendered, String> {
    render_untracked(authored, PREVIEW_EMAIL_ID, context, &site.base_url, locale)
}

/// The locale a reader asks for: a canonical tag, a value that is not one, or none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    Tag(String),
    Invalid(String),
    None,
}

/// The recipient's locale as the template's space names it: the value of the locale
/// attribute in the recipient's record.
pub fn locale_of(template: &TemplateDef, context: &Value) -> Wanted {
    let value = template
        .locale_attribute
        .as_deref()
        .and_then(|attribute| context.get(&template.recipient)?.get(attribute)?.as_str());
    match value.map(str::trim).filter(|value| !value.is_empty()) {
        None => Wanted::None,
        Some(value) => match locale::normalize(value) {
            Some(tag) => Wanted::Tag(tag),
            None => Wanted::Invalid(value.to_owned()),
        },
    }
}

/// The Liquid variables of a marketing mail's footer, beside `unsubscribeUrl`.
pub const POSTAL_VARIABLE: &str = "postalAddress";
pub const SUBSCRIBED_TO_VARIABLE: &str = "subscribedTo";

fn render_untracked(
    authored: &Authored,
    email_id: &str,
    mut context: Value,
    public_base_url: &str,
    wanted: Wanted,
) -> Result<render::Rendered, String> {
    let template = &authored.template;
    let tag = match &wanted {
        Wanted::Tag(tag) => Some(tag.as_str()),
        _ => None,
    };
    let (chosen, matched, (subject, html, text)) = template.variant(tag);
    let partials = authored.parts.for_locale(chosen);
    let (html_partials, text_partials) = (&partials.0, &partials.1);
    let sources = render::Sources {
        subject,
        html,
        text,
        layout: authored.parts.layout.as_ref().map(|layout| layout.def.variant(chosen)),
        html_partials,
        text_partials,
    };
    let locale = chosen.map(|tag| render::LocaleUsed {
        tag: tag.to_owned(),
        source: match (&wanted, matched) {
            (Wanted::Invalid(_), _) => "invalid",
            (_, matched) => matched.as_str(),
        },
    });
    let mut rendered = if authored.is_marketing() {
        let url = message::unsubscribe_url(public_base_url, email_id);
        // The topic's name in the mail's language, as its preference page shows it.
        let subscribed_to = match &authored.topic {
            Some(topic) => chosen.map_or_else(|| topic.name.clone(), |tag| topic.in_locale(tag).0.to_owned()),
            None => format!("email from {}", authored.sender.from_name),
        };
        let postal = authored
            .sender
            .postal_address
            .as_deref()
            .map(|address| footer::postal_line(&authored.sender.from_name, address));
        if let Some(values) = context.as_object_mut() {
            values.insert(footer::UNSUBSCRIBE_VARIABLE.to_owned(), Value::String(url.clone()));
            values.insert(POSTAL_VARIABLE.to_owned(), Value::String(postal.clone().unwrap_or_default()));
            values.insert(SUBSCRIBED_TO_VARIABLE.to_owned(), Value::String(subscribed_to.clone()));
        }
        let mut rendered = render::render(&sources, &context)?;
        footer::add(&mut rendered, &url, &subscribed_to, postal.as_deref());
        rendered
    } else {
        render::render(&sources, &context)?
    };
    if let Some(locale) = &locale {
        rendered.html = with_language(&rendered.html, &locale.tag);
    }
    rendered.locale = locale;
    Ok(rendered)
}

/// `html` saying it is written in `tag`, and in which direction: `lang` and `dir` on its
/// `<html>` element (each unless it has one), or a fragment wrapped in a `<div>` that says
/// them.
pub fn with_language(html: &str, tag: &str) -> String {
    let dir = locale::direction(tag);
    // ASCII lowercasing keeps every byte offset, so a position found in it is one in `html`.
    let lowercase = html.to_ascii_lowercase();
    let element = lowercase
        .find("<html")
        .filter(|at| lowercase[at + 5..].starts_with(|c: char| c == '>' || c.is_ascii_whitespace()));
    let Some(at) = element else {
        if html.trim().is_empty() {
            return html.to_owned();
        }
        return format!("<div lang=\"{tag}\" dir=\"{dir}\">{html}</div>");
    };
    let end = lowercase[at..].find('>').map_or(lowercase.len(), |end| at + end);
    let attributes = &lowercase[at + 5..end];
    let has = |name: &str| {
        attributes
            .split(|c: char| c.is_ascii_whitespace())
            .any(|attribute| attribute == name || attribute.starts_with(&format!("{name}=")))
    };
    let mut added = String::new();
    if !has("lang") {
        added.push_str(&format!(" lang=\"{tag}\""));
    }
    if !has("dir") {
        added.push_str(&format!(" dir=\"{dir}\""));
    }
    format!("{}{added}{}", &html[..at + 5], &html[at + 5..])
}

pub use domain::email::send::policy::SkipReason;
pub use domain::email::send::{
    Contact, Facts, Gate, Kind, SendPolicy, Sent, Verdict, ZoneUsed, consent_keys, decide, email_consent,
    is_email_consent, zone_used,
};

/// Who an email goes to: the contact, its address and its data key.
pub struct EmailTo<'a> {
    pub space_id: &'a str,
    pub contact_id: &'a str,
    pub address: &'a str,
    pub key: &'a platform::crypto::DataKey,
    /// The place of the contact's last marketing send as a decision under frequency caps read
    /// it ([`last_seq`] of what [`marketing_sends`] returned), or `None` when the decision read
    /// none (no caps). A marketing email's append takes the next place, and fails
    /// `stream_moved` (decide again) when another send took it first.
    pub follows: Option<i64>,
}

/// A rendered email ready to append: its `EmailScheduled` stream, the guards every such
/// append carries (a marketing email's row in `marketing_sends`, which the frequency caps
/// count), and what its hand-off needs.
pub struct Scheduled {
    pub stream: StreamAppend,
    pub guards: Vec<Guard>,
    pub prepared: Prepared,
    /// The zone the send policy decided it in ([`Scheduled::decided_in`]).
    zone: Option<proto::PolicyZone>,
}

impl Scheduled {
    /// Records the zone the send policy decided the email in (`zone_used` of its facts) on
    /// its `EmailScheduled` and, when it is held, its `EmailHeld`.
    pub fn decided_in(mut self, zone: Option<&ZoneUsed>) -> Self {
        self.zone = zone.map(ZoneUsed::to_proto);
        for event in &mut self.stream.events {
            if let LogEvent::EmailScheduled(scheduled) = &mut event.event {
                scheduled.zone.clone_from(&self.zone);
            }
        }
        self
    }

    /// Holds the email until `until_ms` (the send decision's `Hold`): `EmailHeld` follows its
    /// `EmailScheduled`, and it is not counted against the frequency caps until it is released.
    /// Its outbox row must be inserted `held` ([`crate::outbox::held_guard`]) and it is not
    /// handed off now.
    pub fn hold(mut self, until_ms: i64, gate: Gate, now_ms: i64) -> HeldEmail {
        let parties = &self.prepared.parties;
        self.stream.events.push(NewEvent {
            event: LogEvent::EmailHeld(proto::EmailHeld {
                email_id: parties.email_id.clone(),
                space_id: parties.space_id.clone(),
                contact_id: parties.contact_id.clone(),
                gate: gate.as_str().to_owned(),
                not_before_ms: until_ms,
                at_ms: now_ms,
                zone: self.zone.clone(),
            }),
            subject_id: Some(parties.contact_id.clone()),
            occurred_at: platform::time::from_millis(now_ms),
        });
        let guard = crate::outbox::held_guard(&parties.email_id, &parties.space_id, until_ms);
        HeldEmail { stream: self.stream, guard }
    }
}

/// A held email ready to append: its stream (`EmailScheduled`, `EmailHeld`) and the guard that
/// inserts its outbox row `held`.
pub struct HeldEmail {
    pub stream: StreamAppend,
    pub guard: Guard,
}

/// What sent an email: a template send, a form's confirmation, a broadcast run or a
/// workflow's send step.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    /// `template`, `form_confirmation`, `broadcast` or `workflow`.
    pub kind: &'a str,
    /// The form, or the run.
    pub source_id: &'a str,
    /// The run's broadcast or workflow.
    pub parent_id: &'a str,
    /// The workflow's send step.
    pub step_id: &'a str,
    /// A broadcast experiment's variant (empty otherwise).
    pub variant: &'a str,
    /// The variant is sent as the experiment's winner, not in its test.
    pub winner: bool,
}

impl<'a> Origin<'a> {
    pub fn template() -> Self {
        Self { kind: "template", source_id: "", parent_id: "", step_id: "", variant: "", winner: false }
    }

    pub fn form(form_id: &'a str) -> Self {
        Self { kind: "form_confirmation", source_id: form_id, parent_id: "", step_id: "", variant: "", winner: false }
    }

    pub fn broadcast(broadcast_id: &'a str, run_id: &'a str) -> Self {
        Self { kind: "broadcast", source_id: run_id, parent_id: broadcast_id, step_id: "", variant: "", winner: false }
    }

    pub fn workflow(workflow_id: &'a str, run_id: &'a str, step_id: &'a str) -> Self {
        Self { kind: "workflow", source_id: run_id, parent_id: workflow_id, step_id, variant: "", winner: false }
    }

    /// This origin, for an experiment's `variant`, sent in its test or as its `winner`.
    pub fn with_variant(self, variant: &'a str, winner: bool) -> Self {
        Self { variant, winner, ..self }
    }
}

/// Schedules `rendered` from the authored template for `to` as email `email_id`: the content
/// sealed under the contact's key, and the message its hand-off will send, sent by `origin`.
pub fn schedule(
    email_id: &str,
    authored: &Authored,
    to: EmailTo<'_>,
    rendered: &render::Rendered,
    origin: Origin<'_>,
    (now, public_base_url): (i64, &str),
) -> anyhow::Result<Scheduled> {
    let template = &authored.template;
    let content = proto::EmailContent {
        to_address: to.address.to_owned(),
        subject: rendered.subject.clone(),
        html: rendered.html.clone(),
        text: rendered.text.clone(),
    };
    let mut sealed = platform::events::seal(to.contact_id, &content);
    platform::events::encrypt(&mut sealed, to.key)?;
    let scheduled = proto::EmailScheduled {
        email_id: email_id.to_owned(),
        space_id: to.space_id.to_owned(),
        template_id: authored.template_id.clone(),
        template_revision: authored.revision,
        kind: template.kind.clone(),
        contact_id: to.contact_id.to_owned(),
        sender_id: authored.sender_id.clone(),
        topic_id: template.topic_id.clone().unwrap_or_default(),
        content: Some(sealed),
        scheduled_at_ms: now,
        origin: origin.kind.to_owned(),
        form_id: origin.source_id.to_owned(),
        parent_id: origin.parent_id.to_owned(),
        step_id: origin.step_id.to_owned(),
        variant: origin.variant.to_owned(),
        experiment_winner: origin.winner,
        zone: None,
        locale: rendered.locale.as_ref().map(|locale| locale.tag.clone()).unwrap_or_default(),
        locale_source: rendered.locale.as_ref().map(|locale| locale.source.to_owned()).unwrap_or_default(),
        parts: authored.parts.revisions(),
    };
    let stream = StreamAppend {
        stream_id: domain::email::stream_id(email_id),
        expected: ExpectedVersion::NoStream,
        events: vec![NewEvent {
            event: LogEvent::EmailScheduled(scheduled),
            subject_id: Some(to.contact_id.to_owned()),
            occurred_at: platform::time::from_millis(now),
        }],
    };
    let prepared = Prepared {
        parties: Parties {
            email_id: email_id.to_owned(),
            space_id: to.space_id.to_owned(),
            contact_id: to.contact_id.to_owned(),
            message_id: message::message_id(email_id, &authored.domain.name),
        },
        outgoing: message::Outgoing::new(
            email_id,
            &authored.sender,
            &authored.domain,
            &content,
            (now, authored.is_marketing()),
            public_base_url,
        )
        .in_language(rendered.locale.as_ref().map(|locale| locale.tag.as_str())),
        domain_id: authored.sender.domain_id.clone(),
        domain: authored.domain.clone(),
    };
    let guards = if authored.is_marketing() {
        vec![marketing_send_guard(to.contact_id, email_id, template.topic_id.as_deref(), now, to.follows)]
    } else {
        Vec::new()
    };
    Ok(Scheduled { stream, guards, prepared, zone: None })
}

/// Records a marketing email in `marketing_sends`, in its append, for the frequency caps: as
/// the contact's send after `follows` (see [`EmailTo::follows`]), so that of two sends decided
/// from the same reading only the first to commit is recorded and the other fails
/// `stream_moved`.
fn marketing_send_guard(
    contact_id: &str,
    email_id: &str,
    topic_id: Option<&str>,
    at_ms: i64,
    follows: Option<i64>,
) -> Guard {
    let topic_id = topic_id.unwrap_or_default().to_owned();
    // 0: no place (a send decided without caps); places start at 1.
    let seq = follows.map_or(0, |last| last + 1);
    let row = vec![
        SetValue::Text(Some(contact_id.to_owned())),
        SetValue::BigInt(at_ms),
        SetValue::Text(Some(email_id.to_owned())),
        SetValue::Text(Some(topic_id.clone())),
        SetValue::BigInt(seq),
    ];
    Guard::exactly_one(
        "INSERT INTO marketing_sends (contact_id, at_ms, email_id, topic_id, seq)
         VALUES ($1, $2, $3, $4, NULLIF($5::bigint, 0)) ON CONFLICT DO NOTHING",
        vec![
            Box::new(contact_id.to_owned()),
            Box::new(at_ms),
            Box::new(email_id.to_owned()),
            Box::new(topic_id),
            Box::new(seq),
        ],
        sends_moved(contact_id),
    )
    .with_set(
        "INSERT INTO marketing_sends (contact_id, at_ms, email_id, topic_id, seq)
         SELECT c, a, e, t, NULLIF(s, 0) FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bigint[])
             AS w(c, a, e, t, s)
         ON CONFLICT DO NOTHING",
        row,
    )
}

/// The conflict of a marketing send whose place in the contact's sends another send took
/// since the decision read them: decide again.
fn sends_moved(contact_id: &str) -> AppendError {
    AppendError::Conflict {
        code: Code::StreamMoved,
        message: format!("contact {contact_id} was sent marketing email while this send was decided; decide again"),
    }
}

/// The place of the newest of `sent` (0 when there is none): what a send decided from them
/// follows.
pub fn last_seq(sent: &[domain::email::send::Sent]) -> i64 {
    sent.iter().map(|sent| sent.seq).max().unwrap_or(0)
}

/// What a marketing send decided from `facts` follows ([`EmailTo::follows`]): the newest of the
/// contact's sends the decision read when the policy has frequency caps, else `None`.
pub fn follows(facts: &Facts<'_>) -> Option<i64> {
    let read = facts.policy.and_then(SendPolicy::lookback_ms).is_some();
    read.then(|| facts.contact.as_ref().map_or(0, |contact| last_seq(contact.sent)))
}

/// Counts one email against the month's allowance, refused (`email_limit_reached`) once it
/// is used up.
///
/// In a batch, the emails of one space and month are counted with one update of its row
/// (the row every email of the space touches); if they do not all fit, the batch is written
/// again one append at a time, so exactly the emails past the allowance are refused.
pub fn allowance_guard(space_id: &str, now_ms: i64, monthly: i64) -> Guard {
    let month = domain::email::allowance_month(now_ms);
    let row =
        vec![SetValue::Text(Some(space_id.to_owned())), SetValue::Text(Some(month.clone())), SetValue::BigInt(monthly)];
    Guard::exactly_one(
        "INSERT INTO email_allowance_usage AS u (space_id, month, used) SELECT $1, $2, 1 WHERE $3::bigint > 0
         ON CONFLICT (space_id, month) DO UPDATE SET used = u.used + 1 WHERE u.used < $3",
        vec![Box::new(space_id.to_owned()), Box::new(month), Box::new(monthly)],
        AppendError::Conflict { code: Code::EmailLimitReached, message: "the email allowance is used up".to_owned() },
    )
    .with_set(
        "WITH w AS (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) AS w(space_id, month, monthly)),
         g AS (SELECT space_id, month, min(monthly) AS monthly, count(*) AS n FROM w GROUP BY space_id, month),
         counted AS (
             INSERT INTO email_allowance_usage AS u (space_id, month, used)
             SELECT space_id, month, n FROM g WHERE n <= monthly
             ON CONFLICT (space_id, month) DO UPDATE SET used = u.used + excluded.used
             WHERE u.used + excluded.used
                 <= (SELECT g.monthly FROM g WHERE g.space_id = u.space_id AND g.month = u.month)
             RETURNING space_id, month)
         SELECT 1 FROM w JOIN counted USING (space_id, month)",
        row,
    )
}
