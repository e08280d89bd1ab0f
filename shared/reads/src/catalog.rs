//! Queries over the catalog read model (spaces, users, memberships, keys, schemas,
//! attributes, credits, authored resources), which every tier reads: the command service to
//! authenticate and validate, the query service to authenticate and answer, the workers to
//! decide.

use deadpool_postgres::GenericClient;
use serde_json::Value;

use domain::catalog::{AttributeEntry, KeyIdentity, Membership, SchemaEntry, WriteContext};
use domain::roles::Role;

/// A schema from a row starting with `schema_id, slug, schema_type, doc, attribute_count,
/// revision`.
fn schema_entry(row: &tokio_postgres::Row) -> SchemaEntry {
    SchemaEntry {
        schema_id: row.get(0),
        slug: row.get(1),
        schema_type: row.get(2),
        doc: row.get(3),
        attribute_count: row.get::<_, i32>(4).into(),
        revision: row.get(5),
    }
}

/// Looks up a live (not revoked) key by the SHA-256 of its full value.
pub async fn find_key(
    client: &impl GenericClient,
    schema: &str,
    key_hash: &str,
) -> Result<Option<KeyIdentity>, tokio_postgres::Error> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT k.key_id, k.name, k.key_display, k.created_at, k.user_id, u.name, u.email, k.space_id,
                    s.slug, s.name
             FROM {schema}.api_keys k JOIN {schema}.users u ON u.user_id = k.user_id
             LEFT JOIN {schema}.spaces s ON s.space_id = k.space_id
             WHERE k.key_hash = $1 AND NOT k.revoked"
        ))
        .await?;
    let Some(row) = client.query_opt(&statement, &[&key_hash]).await? else {
        return Ok(None);
    };
    let user_id: String = row.get(4);
    let statement = client
        .prepare_cached(&format!(
            "SELECT m.space_id, s.slug, s.name, m.role FROM {schema}.memberships m
             JOIN {schema}.spaces s ON s.space_id = m.space_id WHERE m.user_id = $1 ORDER BY m.space_id"
        ))
        .await?;
    let memberships = client
        .query(&statement, &[&user_id])
        .await?
        .into_iter()
        .filter_map(|row| {
            let role = Role::parse(row.get::<_, &str>(3))?;
            Some(Membership { space_id: row.get(0), slug: row.get(1), name: row.get(2), role })
        })
        .collect();
    Ok(Some(KeyIdentity {
        key_id: row.get(0),
        name: row.get(1),
        key_display: row.get(2),
        created_at: row.get(3),
        user_id,
        user_name: row.get::<_, Option<String>>(5).unwrap_or_default(),
        user_email: row.get::<_, Option<String>>(6).unwrap_or_default(),
        bound_space_id: row.get(7),
        bound_space: match (
            row.get::<_, Option<String>>(7),
            row.get::<_, Option<String>>(8),
            row.get::<_, Option<String>>(9),
        ) {
            (Some(id), Some(slug), Some(name)) => Some((id, slug, name)),
            _ => None,
        },
        memberships,
    }))
}

/// Finds a schema of the space by id or slug.
pub async fn find_schema(
    client: &impl GenericClient,
    schema: &str,
    space_id: &str,
    id_or_slug: &str,
) -> Result<Option<SchemaEntry>, tokio_postgres::Error> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT schema_id, slug, schema_type, doc, attribute_count, revision FROM {schema}.schemas
             WHERE space_id = $1 AND (schema_id = $2 OR slug = $2)
             ORDER BY (schema_id = $2) DESC LIMIT 1"
        ))
        .await?;
    let row = client.query_opt(&statement, &[&space_id, &id_or_slug]).await?;
    Ok(row.as_ref().map(schema_entry))
}

/// The space's remaining AI credits: the authored grant less what has been spent.
pub async fn credits(client: &impl GenericClient, schema: &str, space_id: &str) -> Result<i64, tokio_postgres::Error> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT COALESCE((SELECT balance FROM {schema}.ai_credits WHERE space_id = $1), 0)
                      - COALESCE((SELECT spent FROM public.ai_credit_spend WHERE space_id = $1), 0)"
        ))
        .await?;
    Ok(client.query_one(&statement, &[&space_id]).await?.get(0))
}

/// Everything a record write or an event acceptance needs from the catalog, in one
/// statement: the schema, its custom attributes, the space's remaining AI credits and the
/// catalog's revision. `None` when the schema does not exist.
pub async fn write_context(
    client: &impl GenericClient,
    schema: &str,
    space_id: &str,
    id_or_slug: &str,
) -> Result<Option<WriteContext>, tokio_postgres::Error> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT s.schema_id, s.slug, s.schema_type, s.doc, s.attribute_count, s.revision,
                    COALESCE((SELECT jsonb_agg(jsonb_build_array(a.key, a.definition) ORDER BY a.ordinal)
                              FROM {schema}.attributes a WHERE a.schema_id = s.schema_id AND NOT a.is_base), '[]'),
                    COALESCE((SELECT balance FROM {schema}.ai_credits WHERE space_id = $1), 0)
                      - COALESCE((SELECT spent FROM public.ai_credit_spend WHERE space_id = $1), 0),
                    COALESCE((SELECT revision FROM public.projections WHERE name = 'catalog' AND status = 'live'), 0)
             FROM {schema}.schemas s WHERE s.space_id = $1 AND (s.schema_id = $2 OR s.slug = $2)
             ORDER BY (s.schema_id = $2) DESC LIMIT 1"
        ))
        .await?;
    let Some(row) = client.query_opt(&statement, &[&space_id, &id_or_slug]).await? else {
        return Ok(None);
    };
    let entry = schema_entry(&row);
    let attributes = match row.get::<_, Value>(6) {
        Value::Array(pairs) => pairs
            .into_iter()
            .filter_map(|pair| match pair {
                Value::Array(mut parts) if parts.len() == 2 => {
                    let definition = parts.pop()?;
                    let key = parts.pop()?.as_str()?.to_owned();
                    Some(AttributeEntry { key, definition })
                }
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    Ok(Some(WriteContext { schema: entry, attributes, credits: row.get(7), revision: row.get(8) }))
}

/// A resource found by id alone, whatever its space (public endpoints, whose tenant comes
/// from the resource): its space, revision and definition.
pub async fn resource_by_id(
    client: &impl GenericClient,
    schema: &str,
    kind: &str,
    resource_id: &str,
) -> Result<Option<(String, i64, Value)>, tokio_postgres::Error> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT space_id, revision, definition FROM {schema}.resources WHERE kind = $1 AND resource_id = $2"
        ))
        .await?;
    let row = client.query_opt(&statement, &[&kind, &resource_id]).await?;
    Ok(row.map(|row| (row.get(0), row.get(1), row.get(2))))
}

/// The id of the space's resource of `kind` named by `id_or_slug`: its id, or the slug its
/// definition carries (an id wins).
/// The `write_key` resource one of whose secrets hashes to `key_hash`: its id, space and
/// definition (a withdrawn key holds no hash, so it is never found).
pub async fn find_write_key(
    client: &impl GenericClient,
    schema: &str,
    key_hash: &str,
) -> Result<Option<(String, String, Value)>, tokio_postgres::Error> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT resource_id, space_id, definition FROM {schema}.resources
             WHERE kind = 'write_key' AND definition -> 'keyHashes' ? $1 LIMIT 1"
        ))
        .await?;
    let row = client.query_opt(&statement, &[&key_hash]).await?;
    Ok(row.map(|row| (row.get(0), row.get(1), row.get(2))))
}

/// The slugs of the space's schemas of `schema_type`, each to its id.
pub async fn schema_slugs(
    client: &impl GenericClient,
    schema: &str,
    space_id: &str,
    schema_type: &str,
) -> Result<std::collections::BTreeMap<String, String>, tokio_postgres::Error> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT slug, schema_id FROM {schema}.schemas WHERE space_id = $1 AND schema_type = $2"
        ))
        .await?;
    let rows = client.query(&statement, &[&space_id, &schema_type]).await?;
    Ok(rows.into_iter().map(|row| (row.get(0), row.get(1))).collect())
}

pub async fn resource_id_of(
    client: &impl GenericClient,
    schema: &str,
    (kind, space_id): (&str, &str),
    id_or_slug: &str,
) -> Result<Option<String>, tokio_postgres::Error> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT resource_id FROM {schema}.resources
             WHERE kind = $1 AND space_id = $2 AND (resource_id = $3 OR definition ->> 'slug' = $3)
             ORDER BY resource_id = $3 DESC LIMIT 1"
        ))
        .await?;
    let row = client.query_opt(&statement, &[&kind, &space_id, &id_or_slug]).await?;
    Ok(row.map(|row| row.get(0)))
}

/// What [`email_template`] finds: the template's revision and definition, and the definitions
/// of its sender, the sender's domain, its topic, the space's email allowance and its send
/// policy (each `None` when missing).
pub struct EmailTemplateRow {
    pub revision: i64,
    pub template: Value,
    pub sender: Option<Value>,
    pub domain: Option<Value>,
    pub topic: Option<Value>,
    pub allowance: Option<Value>,
    pub policy: Option<Value>,
    /// The partials and the layout the template names (`partials` and `layoutId` of its
    /// definition): each `{kind, id, revision, definition}`.
    pub parts: Vec<Value>,
}

/// A template of the space with, in the same statement, its sender, the sender's domain, its
/// topic (the footer of marketing mail names it) and the space's email allowance: everything
/// a send reads from the catalog in one round trip.
pub async fn email_template(
    client: &impl GenericClient,
    schema: &str,
    space_id: &str,
    template_id: &str,
) -> Result<Option<EmailTemplateRow>, tokio_postgres::Error> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT t.revision, t.definition, s.definition, d.definition, tp.definition, a.definition, p.definition,
                    (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                                'kind', r.kind, 'id', r.resource_id, 'revision', r.revision,
                                'definition', r.definition)), '[]'::jsonb)
                     FROM {schema}.resources r
                     WHERE r.space_id = t.space_id
                       AND ((r.kind = 'layout' AND r.resource_id = t.definition->>'layoutId')
                         OR (r.kind = 'partial' AND r.resource_id IN (
                                SELECT jsonb_each_text.value FROM jsonb_each_text(
                                    COALESCE(t.definition->'partials', '{{}}'::jsonb))))))
             FROM {schema}.resources t
             LEFT JOIN {schema}.resources s
               ON s.kind = 'sender' AND s.space_id = t.space_id AND s.resource_id = t.definition->>'senderId'
             LEFT JOIN {schema}.resources d
               ON d.kind = 'domain' AND d.space_id = t.space_id AND d.resource_id = s.definition->>'domainId'
             LEFT JOIN {schema}.resources tp
               ON tp.kind = 'topic' AND tp.space_id = t.space_id AND tp.resource_id = t.definition->>'topicId'
             LEFT JOIN {schema}.resources a
               ON a.kind = 'email_allowance' AND a.resource_id = t.space_id
             LEFT JOIN {schema}.resources p
               ON p.kind = 'send_policy' AND p.resource_id = t.space_id
             WHERE t.kind = 'template' AND t.space_id = $1 AND t.resource_id = $2"
        ))
        .await?;
    let row = client.query_opt(&statement, &[&space_id, &template_id]).await?;
    Ok(row.map(|row| EmailTemplateRow {
        revision: row.get(0),
        template: row.get(1),
        sender: row.get(2),
        domain: row.get(3),
        topic: row.get(4),
        allowance: row.get(5),
        policy: row.get(6),
        parts: match row.get::<_, Value>(7) {
            Value::Array(parts) => parts,
            _ => Vec::new(),
        },
    }))
}
