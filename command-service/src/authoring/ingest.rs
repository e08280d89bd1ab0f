//! Write keys (`writeKeys` of a space): the credentials of the Segment-compatible ingest
//! (`POST /v1/batch` and its single-message paths), each naming the contact schema its
//! identifies write, the event schemas its tracks, pages and screens are recorded under, and
//! the object schema its groups join. Checked against the space's schemas at apply; stored as
//! a `write_key` resource holding only the secrets' hashes.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use platform::ids::{derived_id, sha256_hex};
use serde_json::{Value, json};

use super::format::{SpaceSpec, WriteKeySpec};

/// The resource kind of a write key, and its id prefix.
pub(crate) const WRITE_KEY: &str = domain::ingest::WRITE_KEY;
const PREFIX: &str = "wrk";

/// The shortest secret taken: `wk_` and 21 characters, as an API key.
const MIN_SECRET: usize = 24;

/// A write key's id (fixed, or derived from the space and its slug).
pub(super) fn write_key_id(space_slug: &str, spec: &WriteKeySpec) -> String {
    spec.id.clone().unwrap_or_else(|| derived_id(PREFIX, &[WRITE_KEY, space_slug, &spec.slug]))
}

/// The definition stored for `spec`: the schemas resolved to ids, and the secrets' hashes
/// (the given ones, or `stored` when none is given: the hashes of an earlier apply, or of a
/// secret generated now, which is returned to be shown once).
pub(super) fn definition(
    space: &SpaceSpec,
    spec: &WriteKeySpec,
    stored: Option<&Value>,
    generate: impl FnOnce() -> String,
) -> anyhow::Result<(Value, Option<String>)> {
    let owner = format!("write key {:?}", spec.slug);
    let schema = |slug: &str, wanted: &str| -> anyhow::Result<(String, &super::format::SchemaSpec)> {
        let found = space.schemas.iter().find(|schema| schema.slug == slug);
        match found {
            Some(schema) if schema.schema_type == wanted => {
                Ok((derived_id("sch", &["schema", &space.slug, &schema.slug]), schema))
            }
            Some(schema) => {
                bail!("{owner} names {slug:?}, a {} schema; it must be a {wanted} schema", schema.schema_type)
            }
            None => bail!("{owner} names schema {slug:?}, which the space does not define"),
        }
    };
    let (contact_schema_id, contact_schema) = schema(&spec.contact_schema, "contact")?;
    let mut events = BTreeMap::new();
    for (name, slug) in &spec.events {
        events.insert(name.clone(), schema(slug, "event")?.0);
    }
    let page = spec.page.as_deref().map(|slug| schema(slug, "event")).transpose()?.map(|(id, _)| id);
    let screen = spec.screen.as_deref().map(|slug| schema(slug, "event")).transpose()?.map(|(id, _)| id);
    let group = match &spec.group {
        Some(group) => {
            let (schema_id, _) = schema(&group.schema, "object")?;
            let attribute = contact_schema
                .attributes
                .iter()
                .find(|attribute| attribute.key == group.contact_attribute)
                .with_context(|| {
                    format!(
                        "{owner}: group.contactAttribute {:?} is not an attribute of {:?}",
                        group.contact_attribute, spec.contact_schema
                    )
                })?;
            let kind = attribute.definition.get("type").and_then(Value::as_str).unwrap_or("json");
            if kind != "string" {
                bail!(
                    "{owner}: group.contactAttribute {:?} is of type {kind}; it holds a record id: declare it a string",
                    group.contact_attribute
                );
            }
            Some(json!({"schemaId": schema_id, "contactAttribute": group.contact_attribute}))
        }
        None => None,
    };
    let mut secrets: Vec<&String> = spec.secret.iter().chain(&spec.secrets).collect();
    secrets.dedup();
    for secret in &secrets {
        if !secret.starts_with("wk_") || secret.chars().count() < MIN_SECRET || secret.chars().any(char::is_whitespace)
        {
            bail!("{owner}: a secret is `wk_` and at least {} more characters, without spaces", MIN_SECRET - 3);
        }
    }
    let (hashes, displays, generated): (Vec<String>, Vec<String>, Option<String>) = if secrets.is_empty() {
        match stored
            .and_then(|stored| stored.get("keyHashes"))
            .and_then(Value::as_array)
            .filter(|hashes| !hashes.is_empty())
        {
            Some(hashes) => {
                let displays = stored.and_then(|stored| stored.get("keyDisplays")).and_then(Value::as_array);
                (
                    hashes.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
                    displays.into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect(),
                    None,
                )
            }
            None => {
                let secret = generate();
                (vec![sha256_hex(&secret)], vec![api::auth::key_display(&secret)], Some(secret))
            }
        }
    } else {
        (
            secrets.iter().map(|secret| sha256_hex(secret)).collect(),
            secrets.iter().map(|secret| api::auth::key_display(secret)).collect(),
            None,
        )
    };
    let definition = json!({
        "slug": spec.slug,
        "name": spec.name.clone().unwrap_or_else(|| spec.slug.clone()),
        "keyHashes": hashes,
        "keyDisplays": displays,
        "contactSchemaId": contact_schema_id,
        "source": spec.source.clone().unwrap_or_else(|| spec.slug.clone()),
        "events": events,
        "pageSchemaId": page,
        "screenSchemaId": screen,
        "group": group,
        "enabled": spec.enabled,
    });
    Ok((definition, generated))
}

/// A write key the file no longer lists: kept (its id is not used again) with no secret, so
/// it stops at once.
pub(super) fn withdrawn(stored: &Value) -> Value {
    let mut definition = stored.clone();
    definition["keyHashes"] = json!([]);
    definition["keyDisplays"] = json!([]);
    definition["enabled"] = json!(false);
    definition
}

/// A new secret: `wk_` and 40 letters and digits.
pub(super) fn generate_secret() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    use rand::Rng;
    let mut rng = rand::rng();
    let body: String = (0..40).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect();
    format!("wk_{body}")
}
