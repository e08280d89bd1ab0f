//! The email resources of a space (domains, senders, topics, templates, forms and the
//! allowance), checked and with their slugs resolved to ids, become the definitions the
//! catalog holds (`domain::email::resources`). A domain's DKIM key is generated once (or
//! taken from the file) and kept only encrypted; a later apply keeps it while the selector
//! and the given key stay the same.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use domain::email::resources::{
    ALLOWANCE, AllowanceDef, Audience, BROADCAST, BroadcastDef, ContextKey, DOMAIN, DomainDef, FORM, FormDef,
    PAGE_TEXT, SEND_POLICY, SENDER, SenderDef, TEMPLATE, TOPIC, TemplateDef, TopicDef, TopicText, TrackingDef,
};
use domain::email::send::policy::{
    Cap, MAX_CAPS, MAX_WINDOW_DAYS, MAX_WINDOW_HOURS, Outcome, QuietHours, SendPolicy, Window, ZoneRule,
};
use domain::email::{experiments, locale};
use mail::dkim;
use mail::{footer, render};
use platform::events::LogEvent;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::format::{ResourceSpec, SpaceSpec, TrackingSpec};
pub(super) use super::format::{Schemas, resource_id};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DomainSpec {
    name: String,
    #[serde(default = "default_selector")]
    dkim_selector: String,
    /// A PEM RSA key (PKCS#1 or PKCS#8); absent: one is generated.
    #[serde(default)]
    dkim_private_key_pem: Option<String>,
    #[serde(default)]
    return_path: Option<String>,
}

fn default_selector() -> String {
    "s1".to_owned()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SenderSpec {
    from_name: String,
    from_address: String,
    domain: String,
    #[serde(default)]
    reply_to: Option<String>,
    /// Printed in the footer of its marketing mail; absent: the space's.
    #[serde(default)]
    postal_address: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TopicSpec {
    name: String,
    #[serde(default)]
    description: Option<String>,
    /// Its name and description in other locales.
    #[serde(default)]
    locales: BTreeMap<String, TopicTextSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TopicTextSpec {
    name: String,
    #[serde(default)]
    description: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DataSpec {
    schema: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TemplateSpec {
    name: String,
    kind: String,
    sender: String,
    #[serde(default)]
    topic: Option<String>,
    subject: String,
    html: String,
    text: String,
    #[serde(default = "default_recipient")]
    recipient: String,
    data: BTreeMap<String, DataSpec>,
    /// Absent fields: the kind's default (marketing mail tracked, transactional not).
    #[serde(default)]
    tracking: Option<TrackingSpec>,
    /// The tag of this content (subject, html, text); absent: the space's default.
    #[serde(default)]
    locale: Option<String>,
    /// Variants by locale, each with its own subject, html and text.
    #[serde(default)]
    locales: BTreeMap<String, super::content::VariantSpec>,
    /// The slug of the layout its bodies are rendered into.
    #[serde(default)]
    layout: Option<String>,
}

fn default_recipient() -> String {
    "contact".to_owned()
}

#[derive(Deserialize)]
#[serde(untagged)]
enum FieldsSpec {
    /// Field names that are attribute keys or identity fields as they are.
    Same(Vec<String>),
    /// Form field name → attribute key or identity field.
    Mapped(BTreeMap<String, String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FormSpec {
    name: String,
    schema: String,
    fields: FieldsSpec,
    #[serde(default)]
    topics: Vec<String>,
    #[serde(default = "yes")]
    double_opt_in: bool,
    #[serde(default)]
    confirmation_template: Option<String>,
    #[serde(default = "yes")]
    enabled: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BroadcastSpec {
    name: String,
    template: String,
    #[serde(default)]
    sender: Option<String>,
    audience: AudienceSpec,
    /// RFC 3339.
    #[serde(default)]
    scheduled_at: Option<String>,
    #[serde(default)]
    experiment: Option<ExperimentSpec>,
}

/// A broadcast's experiment as the workspace file writes it (slugs and durations); stored as
/// a `domain::email::experiments::ExperimentDef` (ids and milliseconds).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ExperimentSpec {
    test_share: u8,
    variants: Vec<VariantSpec>,
    #[serde(default)]
    control: Option<String>,
    #[serde(default)]
    metric: Option<MetricSpec>,
    /// A duration (`30m`, `4h`, `2d`).
    wait: String,
    #[serde(default)]
    without_clear_winner: Option<experiments::Fallback>,
}

/// `"clicks"`, `"opens"`, or `{"conversion": <event schema slug>, "within": <duration>}`.
#[derive(Deserialize)]
#[serde(untagged)]
enum MetricSpec {
    Named(String),
    Conversion(ConversionSpec),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ConversionSpec {
    /// An event schema's slug.
    conversion: String,
    /// The window after each send, a duration.
    within: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct VariantSpec {
    id: String,
    #[serde(default)]
    subject: Option<String>,
    /// A marketing template's slug.
    #[serde(default)]
    template: Option<String>,
    /// A sender's slug.
    #[serde(default)]
    sender: Option<String>,
    /// The preview text after the subject.
    #[serde(default)]
    preheader: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AudienceSpec {
    /// A segment's id (segments are made through the API).
    #[serde(default)]
    segment: Option<String>,
    /// A topic's slug.
    #[serde(default)]
    topic: Option<String>,
}

fn yes() -> bool {
    true
}

fn spec<T: serde::de::DeserializeOwned>(kind: &str, resource: &ResourceSpec) -> anyhow::Result<T> {
    serde_json::from_value(Value::Object(resource.fields.clone()))
        .with_context(|| format!("{kind} {:?} is not valid", resource.slug))
}

fn lookup<'b>(ids: &'b BTreeMap<&str, String>, kind: &str, slug: &str, owner: &str) -> anyhow::Result<&'b String> {
    ids.get(slug).with_context(|| format!("{owner} names {kind} {slug:?}, which the space does not define"))
}

/// The ids a broadcast's experiment resolves its slugs to, and the templates' shapes.
struct ExperimentIds<'a> {
    templates: &'a BTreeMap<&'a str, String>,
    shapes: &'a BTreeMap<String, (String, bool)>,
    senders: &'a BTreeMap<&'a str, String>,
    /// The space's event schemas: slug → id.
    events: &'a BTreeMap<&'a str, String>,
}

/// A broadcast's experiment checked (`ExperimentDef::check`, and each variant's template,
/// sender and subject against the space) with its slugs resolved to ids.
fn experiment(
    spec: ExperimentSpec,
    ids: &ExperimentIds<'_>,
    (postal_senders, localized): (&BTreeMap<String, bool>, &std::collections::BTreeSet<String>),
    (broadcast_template, owner): (&str, &str),
) -> anyhow::Result<experiments::ExperimentDef> {
    let metric = match spec.metric {
        None => experiments::Metric::Clicks,
        Some(MetricSpec::Named(name)) => match name.as_str() {
            "clicks" => experiments::Metric::Clicks,
            "opens" => experiments::Metric::Opens,
            other => bail!(
                "{owner}: experiment.metric is \"clicks\", \"opens\" or {{\"conversion\": <event schema>, \"within\": \
                 <duration>}}, not {other:?}"
            ),
        },
        Some(MetricSpec::Conversion(conversion)) => {
            let schema_id =
                lookup(ids.events, "event schema", &conversion.conversion, &format!("{owner}: experiment.metric"))?;
            let window_ms = domain::workflows::parse_duration(&conversion.within).map_err(|error| {
                anyhow::anyhow!("{owner}: experiment.metric.within {:?}: {error}", conversion.within)
            })?;
            experiments::Metric::Conversion { schema_id: schema_id.clone(), window_ms }
        }
    };
    let wait_ms = domain::workflows::parse_duration(&spec.wait)
        .map_err(|error| anyhow::anyhow!("{owner}: experiment.wait {:?}: {error}", spec.wait))?;
    let mut variants = Vec::with_capacity(spec.variants.len());
    for (index, variant) in spec.variants.into_iter().enumerate() {
        let field = format!("{owner}: experiment.variants[{index}]");
        let template_id = variant
            .template
            .as_deref()
            .map(|slug| lookup(ids.templates, "template", slug, &field))
            .transpose()?
            .cloned();
        if let Some(id) = &template_id {
            match ids.shapes.get(id) {
                Some((kind, single_key)) if kind == "marketing" && *single_key => {}
                _ => bail!("{field}: its template must be a marketing template whose only data key is its recipient"),
            }
        }
        let sender_id =
            variant.sender.as_deref().map(|slug| lookup(ids.senders, "sender", slug, &field)).transpose()?.cloned();
        if sender_id.as_ref().is_some_and(|id| postal_senders.get(id) != Some(&true)) {
            bail!("{field}: its sender has no postal address for the footer of marketing mail (CAN-SPAM)");
        }
        let rewords = variant.subject.is_some() || variant.preheader.is_some();
        if rewords && localized.contains(template_id.as_deref().unwrap_or(broadcast_template)) {
            bail!(
                "{field}: its template has language variants, in whose languages a variant's subject or preheader \
                   would not be; make a template for the variant instead"
            );
        }
        variants.push(experiments::VariantDef {
            id: variant.id,
            subject: variant.subject,
            template_id,
            sender_id,
            preheader: variant.preheader,
        });
    }
    let definition = experiments::ExperimentDef {
        test_share: spec.test_share,
        variants,
        control: spec.control,
        metric,
        wait_ms,
        without_clear_winner: spec.without_clear_winner.unwrap_or_default(),
    };
    // The file writes the wait as a duration.
    definition.check().map_err(|invalid| {
        let field = invalid.field.replace("experiment.waitMs", "experiment.wait");
        anyhow::anyhow!(
            "{owner}: {} {}",
            field.replace("experiment.metric.windowMs", "experiment.metric.within"),
            invalid.message
        )
    })?;
    Ok(definition)
}

/// A postal address as the footer prints it: one to five lines, 5 to 300 characters, no
/// control characters but line breaks.
fn check_postal_address(address: &str, owner: &str) -> anyhow::Result<()> {
    let trimmed = address.trim();
    let lines = trimmed.lines().count();
    if !(5..=300).contains(&trimmed.chars().count())
        || lines > 5
        || trimmed.chars().any(|c| c.is_control() && c != '\n' && c != '\r')
    {
        bail!("{owner}: postalAddress must be 5 to 300 characters on at most five lines");
    }
    Ok(())
}

fn check_address(address: &str, what: &str) -> anyhow::Result<()> {
    if mail::is_address(address) { Ok(()) } else { bail!("{what} {address:?} is not an email address") }
}

/// The definitions (kind, id, JSON) of a space's email resources. `previous` answers the
/// current definition of a resource, to keep a domain's key.
pub(super) fn definitions(
    space: &SpaceSpec,
    space_id: &str,
    previous: impl Fn(&str, &str) -> Option<Value>,
) -> anyhow::Result<Vec<(&'static str, String, Value)>> {
    let schemas = Schemas::of(space);
    let event_schemas: BTreeMap<&str, String> = schemas
        .by_slug
        .iter()
        .filter(|(_, (_, schema_type, _))| *schema_type == "event")
        .map(|(slug, (id, _, _))| (*slug, id.clone()))
        .collect();
    fn ids<'s>(kind: &str, prefix: &str, space: &str, list: &'s [ResourceSpec]) -> BTreeMap<&'s str, String> {
        list.iter().map(|resource| (resource.slug.as_str(), resource_id(kind, prefix, space, resource))).collect()
    }
    let (domain_ids, sender_ids, topic_ids, template_ids) = (
        ids(DOMAIN, "dom", &space.slug, &space.domains),
        ids(SENDER, "snd", &space.slug, &space.senders),
        ids(TOPIC, "top", &space.slug, &space.topics),
        ids(TEMPLATE, "tpl", &space.slug, &space.templates),
    );
    let content = super::content::Content::of(space, &schemas)?;
    let mut out = content.definitions()?;
    let mut domain_names = BTreeMap::new();
    // Sender id -> whether its marketing mail has a postal address to print.
    let mut postal_senders: BTreeMap<String, bool> = BTreeMap::new();
    for resource in &space.domains {
        let input: DomainSpec = spec(DOMAIN, resource)?;
        let id = domain_ids[resource.slug.as_str()].clone();
        let name = input.name.trim().to_ascii_lowercase();
        if !name.contains('.') || name.chars().any(|c| !(c.is_ascii_alphanumeric() || c == '.' || c == '-')) {
            bail!("domain {:?} has name {:?}, which is not a domain name", resource.slug, input.name);
        }
        let kept: Option<DomainDef> =
            previous(DOMAIN, &id).and_then(|definition| serde_json::from_value(definition).ok());
        let given_public = input
            .dkim_private_key_pem
            .as_deref()
            .map(dkim::parse)
            .transpose()
            .with_context(|| format!("domain {:?}: dkimPrivateKeyPem is not an RSA private key", resource.slug))?
            .map(|(_, public)| public);
        let key = match kept {
            Some(kept)
                if kept.dkim.selector == input.dkim_selector
                    && given_public.as_ref().is_none_or(|public| *public == kept.dkim.public_key) =>
            {
                kept.dkim
            }
            _ => {
                let pem = match &input.dkim_private_key_pem {
                    Some(pem) => pem.clone(),
                    None => dkim::generate()?,
                };
                dkim::seal(platform::crypto::keyring()?, &id, &input.dkim_selector, &pem)?
            }
        };
        let return_path = input.return_path.unwrap_or_else(|| format!("bounces.{name}"));
        domain_names.insert(id.clone(), name.clone());
        let definition = DomainDef { slug: resource.slug.clone(), name, dkim: key, return_path };
        out.push((DOMAIN, id, serde_json::to_value(definition)?));
    }
    for resource in &space.senders {
        let input: SenderSpec = spec(SENDER, resource)?;
        let owner = format!("sender {:?}", resource.slug);
        let domain_id = lookup(&domain_ids, "domain", &input.domain, &owner)?.clone();
        check_address(&input.from_address, "the fromAddress")?;
        if let Some(reply_to) = &input.reply_to {
            check_address(reply_to, "the replyTo")?;
        }
        let address_domain = input.from_address.rsplit('@').next().unwrap_or_default().to_ascii_lowercase();
        if domain_names.get(&domain_id) != Some(&address_domain) {
            bail!("{owner}: fromAddress {:?} is not on its domain {:?}", input.from_address, input.domain);
        }
        let postal_address = input.postal_address.or_else(|| space.postal_address.clone());
        if let Some(address) = &postal_address {
            check_postal_address(address, &owner)?;
        }
        postal_senders.insert(sender_ids[resource.slug.as_str()].clone(), postal_address.is_some());
        let definition = SenderDef {
            slug: resource.slug.clone(),
            from_name: input.from_name,
            from_address: input.from_address,
            domain_id,
            reply_to: input.reply_to,
            postal_address,
        };
        out.push((SENDER, sender_ids[resource.slug.as_str()].clone(), serde_json::to_value(definition)?));
    }
    for resource in &space.topics {
        let input: TopicSpec = spec(TOPIC, resource)?;
        let owner = format!("topic {:?}", resource.slug);
        let mut locales = BTreeMap::new();
        for (given, text) in input.locales {
            let tag = locale::normalize(&given)
                .with_context(|| format!("{owner}: locale {given:?} is not a BCP 47 tag (such as de, pt-BR)"))?;
            if text.name.trim().is_empty() {
                bail!("{owner}, locale {given:?}: the name is empty");
            }
            if locales.insert(tag, TopicText { name: text.name, description: text.description }).is_some() {
                bail!("{owner}: locale {given:?} is given twice");
            }
        }
        let definition =
            TopicDef { slug: resource.slug.clone(), name: input.name, description: input.description, locales };
        out.push((TOPIC, topic_ids[resource.slug.as_str()].clone(), serde_json::to_value(definition)?));
    }
    // The space's switch: what it turns off, no template tracks.
    let space_tracking = space.email_tracking.unwrap_or_default().or(TrackingDef { clicks: true, opens: true });
    let mut template_kinds = BTreeMap::new();
    let mut template_shapes: BTreeMap<String, (String, bool)> = BTreeMap::new();
    // Templates with language variants: a broadcast experiment's subject cannot replace theirs.
    let mut localized = std::collections::BTreeSet::new();
    for resource in &space.templates {
        let input: TemplateSpec = spec(TEMPLATE, resource)?;
        let owner = format!("template {:?}", resource.slug);
        if !matches!(input.kind.as_str(), "transactional" | "marketing") {
            bail!("{owner} has kind {:?}; use transactional or marketing", input.kind);
        }
        let sender_id = lookup(&sender_ids, "sender", &input.sender, &owner)?.clone();
        let topic_id =
            input.topic.as_deref().map(|slug| lookup(&topic_ids, "topic", slug, &owner)).transpose()?.cloned();
        if topic_id.is_some() && input.kind != "marketing" {
            bail!("{owner}: only marketing templates have a topic");
        }
        if input.kind == "marketing" && postal_senders.get(&sender_id) != Some(&true) {
            bail!(
                "{owner}: marketing mail must carry the sender's postal address (CAN-SPAM); set postalAddress on \
                 sender {:?} or on the space",
                input.sender
            );
        }
        let mut data = BTreeMap::new();
        for (key, expected) in &input.data {
            // A marketing template's context holds the footer's values under these names.
            let footer_variables =
                [footer::UNSUBSCRIBE_VARIABLE, mail::send::POSTAL_VARIABLE, mail::send::SUBSCRIBED_TO_VARIABLE];
            if input.kind == "marketing" && footer_variables.contains(&key.as_str()) {
                bail!("{owner}: data key {key:?} is a variable of the marketing footer; name the key otherwise");
            }
            if key == render::CONTENT_VARIABLE && input.layout.is_some() {
                bail!("{owner}: data key {key:?} is where its layout holds the body; name the key otherwise");
            }
            let (schema_id, schema_type, _) = schemas.by_slug.get(expected.schema.as_str()).with_context(|| {
                format!("{owner}: data key {key:?} names schema {:?}, which the space does not define", expected.schema)
            })?;
            if *schema_type == "event" {
                bail!("{owner}: data key {key:?} names an event schema; context records are contacts or objects");
            }
            let context = ContextKey {
                schema_id: schema_id.clone(),
                schema_slug: expected.schema.clone(),
                schema_type: (*schema_type).to_owned(),
            };
            data.insert(key.clone(), context);
        }
        match data.get(&input.recipient) {
            Some(context) if context.schema_type == "contact" => {}
            _ => bail!("{owner}: its recipient key {:?} must be a data key of a contact schema", input.recipient),
        }
        let id = template_ids[resource.slug.as_str()].clone();
        template_kinds.insert(id.clone(), input.kind.clone());
        template_shapes.insert(id.clone(), (input.kind.clone(), data.len() == 1));
        let tracking = input.tracking.unwrap_or_default().or(TrackingDef::default_for(&input.kind)).and(space_tracking);
        let shapes = data
            .iter()
            .map(|(key, context): (&String, &ContextKey)| {
                (key.clone(), (context.schema_slug.clone(), context.schema_type.clone()))
            })
            .collect();
        let sample = super::content::sample_context(&schemas, &shapes, input.kind == "marketing");
        let mut definition = TemplateDef {
            slug: resource.slug.clone(),
            name: input.name,
            kind: input.kind,
            sender_id,
            topic_id,
            subject: input.subject,
            html: input.html,
            text: input.text,
            recipient: input.recipient,
            data,
            tracking: Some(tracking),
            locale: None,
            locales: BTreeMap::new(),
            locale_attribute: None,
            layout_id: None,
            partials: BTreeMap::new(),
        };
        let variants = (input.locale.as_deref(), input.locales, input.layout.as_deref());
        content.complete(&owner, &mut definition, variants, &sample)?;
        if !definition.locales.is_empty() {
            localized.insert(id.clone());
        }
        out.push((TEMPLATE, id, serde_json::to_value(definition)?));
    }
    for resource in &space.forms {
        let input: FormSpec = spec(FORM, resource)?;
        let owner = format!("form {:?}", resource.slug);
        let Some((schema_id, "contact", keys)) = schemas.by_slug.get(input.schema.as_str()) else {
            bail!("{owner}: schema {:?} is not a contact schema of the space", input.schema);
        };
        let fields: BTreeMap<String, String> = match input.fields {
            FieldsSpec::Same(names) => names.into_iter().map(|name| (name.clone(), name)).collect(),
            FieldsSpec::Mapped(map) => map,
        };
        for target in fields.values() {
            if !keys.contains(&target.as_str()) && !["email", "phone", "userId"].contains(&target.as_str()) {
                bail!(
                    "{owner}: field target {target:?} is neither an attribute of {:?} nor an identity field",
                    input.schema
                );
            }
        }
        if !fields.values().any(|target| target == "email") {
            bail!("{owner}: one field must map to email");
        }
        let topics = input
            .topics
            .iter()
            .map(|slug| lookup(&topic_ids, "topic", slug, &owner).cloned())
            .collect::<anyhow::Result<Vec<_>>>()?;
        let confirmation_template_id = input
            .confirmation_template
            .as_deref()
            .map(|slug| lookup(&template_ids, "template", slug, &owner).cloned())
            .transpose()?;
        if input.double_opt_in {
            match &confirmation_template_id {
                Some(id) if template_kinds.get(id).map(String::as_str) == Some("transactional") => {}
                _ => bail!("{owner}: double opt-in needs a transactional confirmationTemplate"),
            }
        }
        let definition = FormDef {
            slug: resource.slug.clone(),
            name: input.name,
            schema_id: schema_id.clone(),
            fields,
            topic_ids: topics,
            double_opt_in: input.double_opt_in,
            confirmation_template_id,
            enabled: input.enabled,
        };
        out.push((FORM, resource_id(FORM, "frm", &space.slug, resource), serde_json::to_value(definition)?));
    }
    for resource in &space.broadcasts {
        let input: BroadcastSpec = spec(BROADCAST, resource)?;
        let owner = format!("broadcast {:?}", resource.slug);
        let template_id = lookup(&template_ids, "template", &input.template, &owner)?.clone();
        match template_shapes.get(&template_id) {
            Some((kind, single_key)) if kind == "marketing" && *single_key => {}
            _ => bail!("{owner}: its template must be a marketing template whose only data key is its recipient"),
        }
        let sender_id =
            input.sender.as_deref().map(|slug| lookup(&sender_ids, "sender", slug, &owner)).transpose()?.cloned();
        if sender_id.as_ref().is_some_and(|id| postal_senders.get(id) != Some(&true)) {
            bail!("{owner}: its sender has no postal address for the footer of marketing mail (CAN-SPAM)");
        }
        let audience = match (input.audience.segment, input.audience.topic) {
            (Some(segment_id), None) if segment_id.starts_with("seg_") => Audience::Segment { segment_id },
            (None, Some(topic)) => Audience::Topic { topic_id: lookup(&topic_ids, "topic", &topic, &owner)?.clone() },
            _ => bail!("{owner}: audience is {{\"segment\": \"seg_...\"}} or {{\"topic\": \"<slug>\"}}"),
        };
        let scheduled_at_ms = input
            .scheduled_at
            .as_deref()
            .map(|text| {
                chrono::DateTime::parse_from_rfc3339(text)
                    .map(|at| at.timestamp_millis())
                    .with_context(|| format!("{owner}: scheduledAt {text:?} is not an RFC 3339 time"))
            })
            .transpose()?;
        let experiment = input
            .experiment
            .map(|spec| {
                let ids = ExperimentIds {
                    templates: &template_ids,
                    shapes: &template_shapes,
                    senders: &sender_ids,
                    events: &event_schemas,
                };
                experiment(spec, &ids, (&postal_senders, &localized), (&template_id, &owner))
            })
            .transpose()?;
        let definition = BroadcastDef {
            slug: resource.slug.clone(),
            name: input.name,
            template_id,
            sender_id,
            audience,
            scheduled_at_ms,
            experiment,
        };
        out.push((BROADCAST, resource_id(BROADCAST, "bc", &space.slug, resource), serde_json::to_value(definition)?));
    }
    if let Some(page_text) = content.page_text(space, previous(PAGE_TEXT, space_id).is_some())? {
        out.push((PAGE_TEXT, space_id.to_owned(), serde_json::to_value(page_text)?));
    }
    if let Some(policy) = send_policy(space, &schemas, &topic_ids, previous(SEND_POLICY, space_id).is_some())? {
        out.push((SEND_POLICY, space_id.to_owned(), serde_json::to_value(policy)?));
    }
    if let Some(allowance) = &space.email_allowance {
        let allowance: AllowanceDef =
            serde_json::from_value(allowance.clone()).context("emailAllowance must be {\"monthly\": <count>}")?;
        if allowance.monthly < 0 {
            bail!("emailAllowance.monthly must not be negative");
        }
        out.push((ALLOWANCE, space_id.to_owned(), serde_json::to_value(allowance)?));
    }
    Ok(out)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SendPolicySpec {
    time_zone: ZoneSpec,
    #[serde(default)]
    quiet_hours: Option<QuietHoursSpec>,
    #[serde(default)]
    frequency_caps: Vec<CapSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ZoneSpec {
    #[serde(default)]
    attribute: Option<String>,
    default: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuietHoursSpec {
    from: String,
    to: String,
    outcome: Outcome,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CapSpec {
    max: u32,
    per: WindowSpec,
    #[serde(default)]
    topic: Option<String>,
    outcome: Outcome,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WindowSpec {
    #[serde(default)]
    hours: Option<u32>,
    #[serde(default)]
    days: Option<u32>,
}

/// `HH:MM` as minutes after midnight.
fn minute_of_day(text: &str, what: &str) -> anyhow::Result<u32> {
    let parsed = chrono::NaiveTime::parse_from_str(text, "%H:%M")
        .with_context(|| format!("{what} {text:?} is not a time of day HH:MM"))?;
    Ok(chrono::Timelike::hour(&parsed) * 60 + chrono::Timelike::minute(&parsed))
}

/// The space's send policy, checked: the default zone an IANA name, the zone attribute one of
/// a contact schema of the space, the times `HH:MM`, at most ten caps, each of at least one
/// email over 1 to 8,760 hours or 1 to 366 days, of a topic of the space. A space whose file
/// no longer has one that had one gets the empty policy (no quiet hours, no caps).
fn send_policy(
    space: &SpaceSpec,
    schemas: &Schemas<'_>,
    topic_ids: &BTreeMap<&str, String>,
    had_one: bool,
) -> anyhow::Result<Option<SendPolicy>> {
    let Some(spec) = &space.send_policy else {
        let empty = SendPolicy {
            time_zone: ZoneRule { attribute: None, default: "UTC".to_owned() },
            quiet_hours: None,
            frequency_caps: Vec::new(),
        };
        return Ok(had_one.then_some(empty));
    };
    let spec: SendPolicySpec = serde_json::from_value(spec.clone()).context("sendPolicy is not valid")?;
    if domain::email::send::policy::zone(&spec.time_zone.default).is_none() {
        bail!("sendPolicy.timeZone.default {:?} is not an IANA time zone name", spec.time_zone.default);
    }
    if let Some(attribute) = &spec.time_zone.attribute {
        let definitions: Vec<&Value> = schemas
            .by_slug
            .iter()
            .filter(|(_, (_, schema_type, _))| *schema_type == "contact")
            .filter_map(|(slug, _)| schemas.attributes.get(slug))
            .flatten()
            .filter(|entry| entry.key == *attribute)
            .map(|entry| &entry.definition)
            .collect();
        if definitions.is_empty() {
            bail!("sendPolicy.timeZone.attribute {attribute:?} is not an attribute of a contact schema of the space");
        }
        // Its values are checked as zones when written, so a value that is no zone is refused
        // at its write rather than found at a send.
        if let Some(other) = definitions
            .iter()
            .map(|definition| domain::attributes::attribute_type(definition))
            .find(|kind| *kind != "timezone")
        {
            bail!(
                "sendPolicy.timeZone.attribute {attribute:?} is of type {other}; declare it {{\"type\": \"timezone\"}} \
                 so that each value written is checked as an IANA time zone name"
            );
        }
    }
    let quiet_hours = spec
        .quiet_hours
        .map(|quiet| -> anyhow::Result<QuietHours> {
            Ok(QuietHours {
                from_minute: minute_of_day(&quiet.from, "sendPolicy.quietHours.from")?,
                to_minute: minute_of_day(&quiet.to, "sendPolicy.quietHours.to")?,
                outcome: quiet.outcome,
            })
        })
        .transpose()?;
    if spec.frequency_caps.len() > MAX_CAPS {
        bail!("sendPolicy.frequencyCaps has {} rules; at most {MAX_CAPS}", spec.frequency_caps.len());
    }
    let mut frequency_caps = Vec::new();
    for (index, cap) in spec.frequency_caps.into_iter().enumerate() {
        let owner = format!("sendPolicy.frequencyCaps[{index}]");
        if cap.max == 0 {
            bail!("{owner}.max must be at least 1");
        }
        let window = match (cap.per.hours, cap.per.days) {
            (Some(hours @ 1..=MAX_WINDOW_HOURS), None) => Window::Hours(hours),
            (None, Some(days @ 1..=MAX_WINDOW_DAYS)) => Window::Days(days),
            _ => bail!("{owner}.per is {{\"hours\": 1..{MAX_WINDOW_HOURS}}} or {{\"days\": 1..{MAX_WINDOW_DAYS}}}"),
        };
        let topic_id = cap.topic.as_deref().map(|slug| lookup(topic_ids, "topic", slug, &owner)).transpose()?.cloned();
        frequency_caps.push(Cap { max: cap.max, window, topic_id, outcome: cap.outcome });
    }
    let time_zone = ZoneRule { attribute: spec.time_zone.attribute, default: spec.time_zone.default };
    Ok(Some(SendPolicy { time_zone, quiet_hours, frequency_caps }))
}

/// The current definition of a resource, from an authoring stream's latest event.
pub(super) fn definition_of(event: Option<&LogEvent>) -> Option<Value> {
    match event {
        Some(LogEvent::ResourceDefined(resource)) => {
            serde_json::from_str::<Map<String, Value>>(&resource.definition_json).ok().map(Value::Object)
        }
        _ => None,
    }
}
