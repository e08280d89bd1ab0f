//! The catalog read model: what authoring defines (spaces, users, memberships, API keys,
//! schemas with their attributes, AI credits, other authored resources).

use deadpool_postgres::Transaction;
use domain::catalog::is_writable;
use domain::records::base_attributes;
use platform::events::{LogEvent, open};
use platform::log::StoredEvent;
use platform::proto;
use platform::time::{format_millis, from_millis};
use serde_json::{Value, json};

pub(super) const DDL: &str = "
CREATE TABLE {s}.spaces (space_id text PRIMARY KEY, slug text NOT NULL UNIQUE, name text NOT NULL);
CREATE TABLE {s}.users (user_id text PRIMARY KEY, name text, email text);
CREATE TABLE {s}.memberships (
    user_id text NOT NULL, space_id text NOT NULL, role text NOT NULL, PRIMARY KEY (user_id, space_id)
);
CREATE TABLE {s}.api_keys (
    key_id text PRIMARY KEY,
    key_hash text NOT NULL UNIQUE,
    name text NOT NULL,
    key_display text NOT NULL,
    user_id text NOT NULL,
    space_id text,
    created_at timestamptz NOT NULL,
    revoked boolean NOT NULL DEFAULT false
);
CREATE TABLE {s}.schemas (
    schema_id text PRIMARY KEY,
    space_id text NOT NULL,
    slug text NOT NULL,
    schema_type text NOT NULL,
    doc jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    attribute_count integer NOT NULL,
    revision bigint NOT NULL DEFAULT 1,
    UNIQUE (space_id, slug)
);
CREATE INDEX ON {s}.schemas (space_id, schema_type, created_at, schema_id);
CREATE TABLE {s}.schema_counts (
    space_id text NOT NULL, schema_type text NOT NULL, total bigint NOT NULL, PRIMARY KEY (space_id, schema_type)
);
CREATE TABLE {s}.attributes (
    schema_id text NOT NULL,
    ordinal integer NOT NULL,
    key text NOT NULL,
    is_base boolean NOT NULL,
    definition jsonb NOT NULL,
    doc jsonb NOT NULL,
    PRIMARY KEY (schema_id, ordinal)
);
CREATE TABLE {s}.ai_credits (space_id text PRIMARY KEY, balance bigint NOT NULL);
CREATE TABLE {s}.resources (
    kind text NOT NULL,
    resource_id text NOT NULL,
    space_id text NOT NULL,
    revision bigint NOT NULL,
    definition jsonb NOT NULL,
    PRIMARY KEY (kind, resource_id)
);
";

/// Event types this projection reads; everything else is skipped without decoding.
pub(super) const EVENT_TYPES: &[&str] = &[
    "SpaceDefined.v1",
    "UserDefined.v1",
    "MembershipGranted.v1",
    "MembershipRevoked.v1",
    "ApiKeyIssued.v1",
    "ApiKeyRevoked.v1",
    "SchemaDefined.v1",
    "AiCreditsSet.v1",
    "ResourceDefined.v1",
];

/// Applies a batch event by event; if it held an event this model reads (each changes it),
/// the version's revision moves to the last of them.
pub(super) async fn apply(transaction: &Transaction<'_>, s: &str, events: &[StoredEvent]) -> anyhow::Result<()> {
    super::apply_each(domain::catalog::CATALOG, transaction, s, events, EVENT_TYPES, apply_event).await?;
    let Some(last) = events.iter().rev().find(|event| EVENT_TYPES.contains(&event.event_type.as_str())) else {
        return Ok(());
    };
    let revision = transaction
        .prepare_cached(
            "UPDATE projections SET revision = $1 WHERE name = 'catalog' AND 'rm_catalog_v' || version = $2",
        )
        .await?;
    transaction.execute(&revision, &[&last.position, &s]).await?;
    Ok(())
}

async fn apply_event(transaction: &Transaction<'_>, s: &str, event: &StoredEvent) -> anyhow::Result<()> {
    match event.decode()? {
        LogEvent::SpaceDefined(space) => {
            transaction
                .execute(
                    &format!(
                        "INSERT INTO {s}.spaces (space_id, slug, name) VALUES ($1, $2, $3)
                         ON CONFLICT (space_id) DO UPDATE SET slug = EXCLUDED.slug, name = EXCLUDED.name"
                    ),
                    &[&space.space_id, &space.slug, &space.name],
                )
                .await?;
        }
        LogEvent::UserDefined(user) => {
            let personal: Option<proto::UserPersonal> =
                open(user.personal.as_ref(), &platform::crypto::Keys::default())?;
            let (name, email) = personal.map(|p| (Some(p.name), Some(p.email))).unwrap_or((None, None));
            transaction
                .execute(
                    &format!(
                        "INSERT INTO {s}.users (user_id, name, email) VALUES ($1, $2, $3)
                         ON CONFLICT (user_id) DO UPDATE SET name = EXCLUDED.name, email = EXCLUDED.email"
                    ),
                    &[&user.user_id, &name, &email],
                )
                .await?;
        }
        LogEvent::MembershipGranted(membership) => {
            transaction
                .execute(
                    &format!(
                        "INSERT INTO {s}.memberships (user_id, space_id, role) VALUES ($1, $2, $3)
                         ON CONFLICT (user_id, space_id) DO UPDATE SET role = EXCLUDED.role"
                    ),
                    &[&membership.user_id, &membership.space_id, &membership.role],
                )
                .await?;
        }
        LogEvent::MembershipRevoked(membership) => {
            transaction
                .execute(
                    &format!("DELETE FROM {s}.memberships WHERE user_id = $1 AND space_id = $2"),
                    &[&membership.user_id, &membership.space_id],
                )
                .await?;
        }
        LogEvent::ApiKeyIssued(key) => {
            let space_id = Some(key.space_id.as_str()).filter(|id| !id.is_empty());
            transaction
                .execute(
                    &format!(
                        "INSERT INTO {s}.api_keys (key_id, key_hash, name, key_display, user_id, space_id, created_at)
                         VALUES ($1, $2, $3, $4, $5, $6, $7)
                         ON CONFLICT (key_id) DO UPDATE SET name = EXCLUDED.name, space_id = EXCLUDED.space_id,
                             key_hash = EXCLUDED.key_hash, key_display = EXCLUDED.key_display, revoked = false"
                    ),
                    &[
                        &key.key_id,
                        &key.key_hash,
                        &key.name,
                        &key.key_display,
                        &key.user_id,
                        &space_id,
                        &from_millis(key.created_at_ms),
                    ],
                )
                .await?;
        }
        LogEvent::ApiKeyRevoked(key) => {
            transaction
                .execute(&format!("UPDATE {s}.api_keys SET revoked = true WHERE key_id = $1"), &[&key.key_id])
                .await?;
        }
        LogEvent::SchemaDefined(schema) => apply_schema(transaction, s, &schema).await?,
        LogEvent::AiCreditsSet(credits) => {
            transaction
                .execute(
                    &format!(
                        "INSERT INTO {s}.ai_credits (space_id, balance) VALUES ($1, $2)
                         ON CONFLICT (space_id) DO UPDATE SET balance = EXCLUDED.balance"
                    ),
                    &[&credits.space_id, &credits.balance],
                )
                .await?;
        }
        LogEvent::ResourceDefined(resource) => {
            let definition: Value = serde_json::from_str(&resource.definition_json).unwrap_or(Value::Null);
            transaction
                .execute(
                    &format!(
                        "INSERT INTO {s}.resources (kind, resource_id, space_id, revision, definition)
                         VALUES ($1, $2, $3, $4, $5)
                         ON CONFLICT (kind, resource_id) DO UPDATE SET revision = EXCLUDED.revision,
                             definition = EXCLUDED.definition, space_id = EXCLUDED.space_id"
                    ),
                    &[&resource.kind, &resource.resource_id, &resource.space_id, &resource.revision, &definition],
                )
                .await?;
        }
        _ => {}
    }
    Ok(())
}

async fn apply_schema(transaction: &Transaction<'_>, s: &str, schema: &proto::SchemaDefined) -> anyhow::Result<()> {
    let document = json!({
        "id": schema.schema_id,
        "slug": schema.slug,
        "name": schema.name,
        "type": schema.schema_type,
        "description": Some(&schema.description).filter(|d| !d.is_empty()),
        "createdAt": format_millis(schema.created_at_ms),
        "updatedAt": format_millis(schema.updated_at_ms),
    });
    let base = base_attributes(&schema.schema_type);
    let attribute_count = i32::try_from(base.len() + schema.attributes.len())?;
    let inserted = transaction
        .query_one(
            &format!(
                "INSERT INTO {s}.schemas (schema_id, space_id, slug, schema_type, doc, created_at, attribute_count,
                     revision)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT (schema_id) DO UPDATE SET slug = EXCLUDED.slug, doc = EXCLUDED.doc,
                     attribute_count = EXCLUDED.attribute_count, revision = EXCLUDED.revision
                 RETURNING (xmax = 0)"
            ),
            &[
                &schema.schema_id,
                &schema.space_id,
                &schema.slug,
                &schema.schema_type,
                &document,
                &from_millis(schema.created_at_ms),
                &attribute_count,
                &schema.revision,
            ],
        )
        .await?
        .get::<_, bool>(0);
    if inserted {
        transaction
            .execute(
                &format!(
                    "INSERT INTO {s}.schema_counts (space_id, schema_type, total) VALUES ($1, $2, 1)
                     ON CONFLICT (space_id, schema_type) DO UPDATE SET total = schema_counts.total + 1"
                ),
                &[&schema.space_id, &schema.schema_type],
            )
            .await?;
    }
    transaction.execute(&format!("DELETE FROM {s}.attributes WHERE schema_id = $1"), &[&schema.schema_id]).await?;
    let mut ordinal: i32 = 0;
    for (key, attribute_type, writable) in base {
        let definition = json!({ "type": attribute_type });
        let document = json!({
            "id": format!("base:{key}"),
            "key": key,
            "name": key,
            "description": null,
            "sequence": null,
            "isBase": true,
            "writable": writable,
            "definition": definition,
            "createdAt": null,
            "updatedAt": null,
        });
        insert_attribute(transaction, s, &schema.schema_id, ordinal, key, true, &definition, &document).await?;
        ordinal += 1;
    }
    for attribute in &schema.attributes {
        let definition: Value = serde_json::from_str(&attribute.definition_json).unwrap_or_else(|_| json!({}));
        let document = json!({
            "id": attribute.attribute_id,
            "key": attribute.key,
            "name": attribute.name,
            "description": Some(&attribute.description).filter(|d| !d.is_empty()),
            "sequence": attribute.sequence,
            "isBase": false,
            "writable": is_writable(&definition),
            "definition": definition,
            "createdAt": format_millis(attribute.created_at_ms),
            "updatedAt": format_millis(attribute.updated_at_ms),
        });
        insert_attribute(transaction, s, &schema.schema_id, ordinal, &attribute.key, false, &definition, &document)
            .await?;
        ordinal += 1;
    }
    Ok(())
}

#[expect(clippy::too_many_arguments, reason = "one row's columns")]
async fn insert_attribute(
    transaction: &Transaction<'_>,
    s: &str,
    schema_id: &str,
    ordinal: i32,
    key: &str,
    is_base: bool,
    definition: &Value,
    document: &Value,
) -> anyhow::Result<()> {
    transaction
        .execute(
            &format!(
                "INSERT INTO {s}.attributes (schema_id, ordinal, key, is_base, definition, doc)
                 VALUES ($1, $2, $3, $4, $5, $6)"
            ),
            &[&schema_id, &ordinal, &key, &is_base, definition, document],
        )
        .await?;
    Ok(())
}

read_model! {
    /// Spaces, users, memberships, keys, schemas, attributes, credits, authored resources.
    Catalog = domain::catalog::CATALOG, batch
}
