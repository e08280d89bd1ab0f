//! The workspace file: spaces with what is authored in them, and users with their
//! memberships and API keys. JSON; unknown fields are rejected so typos fail loudly.

use std::collections::{BTreeMap, HashSet};

use anyhow::{Context, bail};
use platform::ids::derived_id;
use serde::Deserialize;
use serde_json::{Map, Value};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Workspace {
    #[serde(default)]
    pub spaces: Vec<SpaceSpec>,
    #[serde(default)]
    pub users: Vec<UserSpec>,
    /// Suppressions not tied to a space; they block sends in every space.
    #[serde(default)]
    pub global_suppressions: Vec<SuppressionSpec>,
}

/// A suppression authored in the file: a space's provider `bounce` / `complaint` ones (until
/// the email pipeline records them), or global ones with any reason.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SuppressionSpec {
    pub identifier: String,
    /// `manual`, `legal`, `bounce` or `complaint`.
    pub reason: String,
}

/// `{"clicks": <bool>, "opens": <bool>}`, each optional.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrackingSpec {
    #[serde(default)]
    pub clicks: Option<bool>,
    #[serde(default)]
    pub opens: Option<bool>,
}

impl TrackingSpec {
    /// The fields given, the others from `otherwise`.
    pub fn or(self, otherwise: domain::email::resources::TrackingDef) -> domain::email::resources::TrackingDef {
        domain::email::resources::TrackingDef {
            clicks: self.clicks.unwrap_or(otherwise.clicks),
            opens: self.opens.unwrap_or(otherwise.opens),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SpaceSpec {
    pub slug: String,
    pub name: String,
    /// The space's AI credit grant; the remaining balance is this less what was spent.
    #[serde(default)]
    pub ai_credits: Option<i64>,
    /// The postal address printed in the footer of marketing mail from the space's senders
    /// that do not give their own.
    #[serde(default)]
    pub postal_address: Option<String>,
    /// The space's email allowance, e.g. `{"monthly": 10000}`.
    #[serde(default)]
    pub email_allowance: Option<Value>,
    /// The space's send policy: quiet hours and frequency caps of marketing mail in the
    /// recipient's time zone (docs/workspace-file.md).
    #[serde(default)]
    pub send_policy: Option<Value>,
    /// Click and open tracking of the space's mail, e.g. `{"clicks": false}`: turns off what
    /// templates would track (absent fields stay on).
    #[serde(default)]
    pub email_tracking: Option<TrackingSpec>,
    /// The contact attribute that holds a contact's locale, and the default tag:
    /// `{"attribute": "language", "default": "en"}`.
    #[serde(default)]
    pub locale: Option<LocaleSpec>,
    /// The words of the recipient pages per locale: tag → page text key → text.
    #[serde(default)]
    pub page_text: BTreeMap<String, BTreeMap<String, String>>,
    #[serde(default)]
    pub schemas: Vec<SchemaSpec>,
    /// Blocks of content templates render with `{% render 'slug' %}`.
    #[serde(default)]
    pub partials: Vec<ResourceSpec>,
    /// Frames around template bodies, holding them at `{{ content }}`.
    #[serde(default)]
    pub layouts: Vec<ResourceSpec>,
    #[serde(default)]
    pub templates: Vec<ResourceSpec>,
    #[serde(default)]
    pub broadcasts: Vec<ResourceSpec>,
    #[serde(default)]
    pub workflows: Vec<ResourceSpec>,
    #[serde(default)]
    pub forms: Vec<ResourceSpec>,
    #[serde(default)]
    pub topics: Vec<ResourceSpec>,
    #[serde(default)]
    pub senders: Vec<ResourceSpec>,
    #[serde(default)]
    pub domains: Vec<ResourceSpec>,
    #[serde(default)]
    pub contact_tracks: Vec<ResourceSpec>,
    #[serde(default)]
    pub suppressions: Vec<SuppressionSpec>,
    /// The credentials of the Segment-compatible ingest, with what their messages write.
    #[serde(default)]
    pub write_keys: Vec<WriteKeySpec>,
    /// Webhooks an integration owns: listed and readable through the API, never changed
    /// there.
    #[serde(default)]
    pub webhooks: Vec<WebhookSpec>,
}

/// `locale` of a space: the contact attribute that holds a contact's locale, and the tag of
/// contacts without one (and of templates that name none).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LocaleSpec {
    pub attribute: String,
    pub default: String,
}

/// An integration-owned webhook. Created once with a fresh secret; a later apply changes its
/// URL when the file does.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WebhookSpec {
    /// A fixed `wh_...` id.
    pub id: String,
    pub url: String,
    pub trigger: String,
    /// The slug of a schema of this space (not for `email event`).
    #[serde(default)]
    pub schema: Option<String>,
    #[serde(default)]
    pub email_event_types: Vec<String>,
    pub integration_vendor_name: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SchemaSpec {
    pub slug: String,
    pub name: String,
    #[serde(rename = "type")]
    pub schema_type: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub attributes: Vec<AttributeSpec>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AttributeSpec {
    pub key: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// `type`, `required`, `default`, `options`, `valueSource`, `autoFill`, and for evaluated
    /// attributes `returnType`, `targets` and `expression` (stored, never exposed).
    pub definition: Map<String, Value>,
}

/// A template, broadcast, workflow, form, topic, sender, domain or contact track: a `slug`
/// (unique per kind in the space), an optional fixed `id`, and the kind's own fields.
#[derive(Debug, Clone, Deserialize)]
pub struct ResourceSpec {
    pub slug: String,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UserSpec {
    pub email: String,
    pub name: String,
    #[serde(default)]
    pub memberships: Vec<MembershipSpec>,
    #[serde(default)]
    pub api_keys: Vec<KeySpec>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MembershipSpec {
    /// The space's slug.
    pub space: String,
    /// `admin`, `non_paid_admin` or `member`.
    pub role: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KeySpec {
    pub name: String,
    /// The slug of the space the key is bound to; absent for a space-unbound key.
    #[serde(default)]
    pub space: Option<String>,
    /// The full key (`sk_...`), for fixtures and tests. Absent: generated and printed once.
    #[serde(default)]
    pub secret: Option<String>,
    #[serde(default)]
    pub revoked: bool,
}

/// Parses and checks a workspace file.
pub fn parse(text: &str) -> anyhow::Result<Workspace> {
    let value: Value = serde_json::from_str(text).context("the workspace file is not valid JSON")?;
    // What the store cannot hold would stop the catalog read model when projected.
    if let Some(issue) = platform::storable::json_issues(&value).into_iter().next() {
        bail!("the workspace file is not valid: {}", issue.message);
    }
    let workspace: Workspace = serde_json::from_value(value).context("the workspace file is not valid")?;
    validate(&workspace)?;
    Ok(workspace)
}

fn validate(workspace: &Workspace) -> anyhow::Result<()> {
    let mut space_slugs = HashSet::new();
    for space in &workspace.spaces {
        check_slug("space", &space.slug)?;
        if !space_slugs.insert(space.slug.as_str()) {
            bail!("space {:?} is defined twice", space.slug);
        }
        let mut schema_slugs = HashSet::new();
        for schema in &space.schemas {
            check_slug("schema", &schema.slug)?;
            if !schema_slugs.insert(schema.slug.as_str()) {
                bail!("schema {:?} is defined twice in space {:?}", schema.slug, space.slug);
            }
            if !matches!(schema.schema_type.as_str(), "contact" | "object" | "event") {
                bail!("schema {:?} has type {:?}; use contact, object or event", schema.slug, schema.schema_type);
            }
            let base: Vec<&str> =
                domain::records::base_attributes(&schema.schema_type).iter().map(|(key, _, _)| *key).collect();
            let mut keys = HashSet::new();
            for attribute in &schema.attributes {
                let valid_key = !attribute.key.is_empty()
                    && attribute.key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && attribute.key.chars().next().is_some_and(|c| c.is_ascii_alphabetic());
                if !valid_key {
                    bail!(
                        "attribute key {:?} in schema {:?} must be letters, digits and _",
                        attribute.key,
                        schema.slug
                    );
                }
                if base.contains(&attribute.key.as_str()) {
                    bail!("attribute {:?} in schema {:?} is a base attribute", attribute.key, schema.slug);
                }
                if !keys.insert(attribute.key.as_str()) {
                    bail!("attribute {:?} is defined twice in schema {:?}", attribute.key, schema.slug);
                }
                if attribute.definition.get("type").and_then(Value::as_str).is_none() {
                    bail!("attribute {:?} in schema {:?} needs definition.type", attribute.key, schema.slug);
                }
                if let Some(consent) = attribute.definition.get("consent") {
                    let channel = consent.get("channel").and_then(Value::as_str);
                    if schema.schema_type != "contact"
                        || !channel.is_some_and(|c| domain::records::CHANNELS.contains(&c))
                    {
                        bail!(
                            "attribute {:?} in schema {:?}: consent fields belong to contact schemas and need \
                             consent.channel, one of {}",
                            attribute.key,
                            schema.slug,
                            domain::records::CHANNELS.join(", ")
                        );
                    }
                }
            }
        }
    }
    for space in &workspace.spaces {
        for webhook in &space.webhooks {
            let mut body = Map::new();
            body.insert("url".into(), Value::String(webhook.url.clone()));
            body.insert("trigger".into(), Value::String(webhook.trigger.clone()));
            body.insert("schemaId".into(), webhook.schema.clone().map_or(Value::Null, Value::String));
            if !webhook.email_event_types.is_empty() {
                body.insert("emailEventTypes".into(), webhook.email_event_types.clone().into());
            }
            let new = crate::webhooks::decide::parse_create(&body, true)
                .map_err(|refusal| anyhow::anyhow!("webhook {:?}: {refusal}", webhook.id))?;
            if let Some(slug) = &new.schema {
                let schema = space.schemas.iter().find(|schema| &schema.slug == slug);
                let Some(schema) = schema else {
                    bail!("webhook {:?} names schema {slug:?}, not in its space", webhook.id)
                };
                crate::webhooks::decide::check_schema(new.trigger, &schema.schema_type)
                    .map_err(|refusal| anyhow::anyhow!("webhook {:?}: {refusal}", webhook.id))?;
            }
            if !webhook.id.starts_with("wh_") || webhook.integration_vendor_name.trim().is_empty() {
                bail!("webhook {:?}: the id starts with wh_ and integrationVendorName is required", webhook.id);
            }
        }
    }
    for suppression in workspace.spaces.iter().flat_map(|space| space.suppressions.iter()) {
        if !matches!(suppression.reason.as_str(), "bounce" | "complaint") {
            bail!(
                "a space's authored suppression must be bounce or complaint; manual and legal ones come through the API"
            );
        }
    }
    let all_suppressions =
        workspace.global_suppressions.iter().chain(workspace.spaces.iter().flat_map(|space| space.suppressions.iter()));
    for suppression in all_suppressions {
        if !suppression.identifier.contains('@') {
            bail!("suppression identifier {:?} is not an email address", suppression.identifier);
        }
        if !domain::suppressions::ALL_REASONS.contains(&suppression.reason.as_str()) {
            bail!("suppression reason {:?}; use manual, legal, bounce or complaint", suppression.reason);
        }
    }
    let mut emails = HashSet::new();
    for user in &workspace.users {
        if !user.email.contains('@') {
            bail!("user email {:?} is not an email address", user.email);
        }
        if !emails.insert(user.email.to_lowercase()) {
            bail!("user {:?} is defined twice", user.email);
        }
        for membership in &user.memberships {
            if !space_slugs.contains(membership.space.as_str()) {
                bail!("user {:?} is a member of unknown space {:?}", user.email, membership.space);
            }
            if api::auth::Role::parse(&membership.role).is_none() {
                bail!("role {:?} of {:?}; use admin, non_paid_admin or member", membership.role, user.email);
            }
        }
        let mut names = HashSet::new();
        for key in &user.api_keys {
            if !names.insert(key.name.as_str()) {
                bail!("user {:?} has two keys named {:?}", user.email, key.name);
            }
            if let Some(space) = &key.space
                && !space_slugs.contains(space.as_str())
            {
                bail!("key {:?} is bound to unknown space {:?}", key.name, space);
            }
            if let Some(secret) = &key.secret {
                let prefix = format!("{}_", api::auth::KEY_PREFIX);
                if !secret.starts_with(&prefix) || secret.len() < 24 {
                    bail!("key {:?}: a secret must start with {prefix} and be at least 24 characters", key.name);
                }
            }
        }
    }
    Ok(())
}

fn check_slug(kind: &str, slug: &str) -> anyhow::Result<()> {
    let valid = !slug.is_empty()
        && slug.len() <= 64
        && slug.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if valid { Ok(()) } else { bail!("{kind} slug {slug:?} must be lowercase letters, digits, - and _") }
}

/// A write key as the workspace file declares it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WriteKeySpec {
    pub slug: String,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    /// The secret (`wk_` and at least 21 more characters). Absent, with `secrets` absent too:
    /// one is generated at the first apply and printed once.
    #[serde(default)]
    pub secret: Option<String>,
    /// Several secrets at once, each accepted: a rotation adds the new one beside the old,
    /// and removes the old once every client sends the new.
    #[serde(default)]
    pub secrets: Vec<String>,
    /// The contact schema (slug) identifies write and every message's contact is found in.
    pub contact_schema: String,
    /// The namespace of its anonymous ids (a contact track's `sourceId`, shared with `POST
    /// /event-identities`); the write key's slug by default.
    #[serde(default)]
    pub source: Option<String>,
    /// A track's event name → the event schema (slug) it is recorded under; a name not
    /// listed goes to the schema whose slug is the name (or the name as a slug).
    #[serde(default)]
    pub events: BTreeMap<String, String>,
    /// The event schema (slug) pages are recorded under (default: one with slug `page`).
    #[serde(default)]
    pub page: Option<String>,
    /// The event schema (slug) screens are recorded under (default: one with slug `screen`).
    #[serde(default)]
    pub screen: Option<String>,
    /// What a group joins: the object schema its `groupId` names a record of, and the contact
    /// attribute that holds that record's id.
    #[serde(default)]
    pub group: Option<GroupSpec>,
    #[serde(default = "enabled")]
    pub enabled: bool,
}

fn enabled() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GroupSpec {
    pub schema: String,
    pub contact_attribute: String,
}

/// What the email resources of a space refer to elsewhere in the file.
pub(super) struct Schemas<'a> {
    /// Schema slug → (id, type, attribute keys).
    pub by_slug: BTreeMap<&'a str, (String, &'a str, Vec<&'a str>)>,
    /// Schema slug → its attributes with their definitions, to check values against.
    pub attributes: BTreeMap<&'a str, Vec<domain::catalog::AttributeEntry>>,
}

impl<'a> Schemas<'a> {
    pub(super) fn of(space: &'a SpaceSpec) -> Self {
        let by_slug = space
            .schemas
            .iter()
            .map(|schema| {
                let id = derived_id("sch", &["schema", &space.slug, &schema.slug]);
                let keys = schema.attributes.iter().map(|attribute| attribute.key.as_str()).collect();
                (schema.slug.as_str(), (id, schema.schema_type.as_str(), keys))
            })
            .collect();
        let attributes = space
            .schemas
            .iter()
            .map(|schema| {
                let entries = schema
                    .attributes
                    .iter()
                    .map(|attribute| domain::catalog::AttributeEntry {
                        key: attribute.key.clone(),
                        definition: Value::Object(attribute.definition.clone()),
                    })
                    .collect();
                (schema.slug.as_str(), entries)
            })
            .collect();
        Self { by_slug, attributes }
    }
}

/// The id of a resource of `kind` (its fixed id, or one derived from the space and slug).
pub(super) fn resource_id(kind: &str, prefix: &str, space_slug: &str, resource: &ResourceSpec) -> String {
    resource.id.clone().unwrap_or_else(|| derived_id(prefix, &[kind, space_slug, &resource.slug]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_workspace_parses() {
        let text = include_str!("../../../deploy/demo-workspace.json");
        let workspace = parse(text).expect("demo workspace is valid");
        assert!(!workspace.spaces.is_empty());
    }

    #[test]
    fn typos_and_bad_references_are_rejected() {
        assert!(parse(r#"{"spacez": []}"#).is_err());
        let bad_role = r#"{"spaces": [{"slug": "a", "name": "A"}],
            "users": [{"email": "u@x.io", "name": "U", "memberships": [{"space": "a", "role": "owner"}]}]}"#;
        assert!(parse(bad_role).is_err());
        let unknown_space =
            r#"{"users": [{"email": "u@x.io", "name": "U", "memberships": [{"space": "b", "role": "admin"}]}]}"#;
        assert!(parse(unknown_space).is_err());
    }

    #[test]
    fn a_nul_anywhere_is_refused_before_it_can_reach_the_catalog() {
        let error = parse(r#"{"spaces": [{"slug": "a", "name": "A\u0000B"}]}"#).expect_err("NUL refused");
        assert!(format!("{error:#}").contains("spaces[0].name"), "{error:#}");
        assert!(parse(r#"{"spaces": [{"slug": "a", "name": "A B"}]}"#).is_ok());
    }

    #[test]
    fn consent_fields_need_a_known_channel_on_a_contact_schema() {
        let with = |schema_type: &str, consent: &str| {
            format!(
                r#"{{"spaces": [{{"slug": "a", "name": "A", "schemas": [{{"slug": "s", "name": "S",
                    "type": "{schema_type}", "attributes": [{{"key": "c",
                    "definition": {{"type": "boolean", "consent": {consent}}}}}]}}]}}]}}"#
            )
        };
        assert!(parse(&with("contact", r#"{"channel": "email"}"#)).is_ok());
        assert!(parse(&with("contact", r#"{"channel": "fax"}"#)).is_err());
        assert!(parse(&with("contact", "{}")).is_err());
        assert!(parse(&with("object", r#"{"channel": "email"}"#)).is_err());
    }
}
