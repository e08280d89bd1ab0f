//! What record writes load through the pipeline's fresh reads, shared by every command that
//! writes records (the record endpoints, template sends, forms, emails, workflows): the
//! catalog context of the schema, the record a write addresses and the holders of its
//! identities. The decisions are in `decide`.

use platform::refusal::answered;
use std::sync::Arc;

use domain::catalog::WriteContext;
use domain::records::RecordState;
use platform::error::ApiError;
use serde_json::{Map, Value};

use super::decide::{
    Input, Match, Owners, Target, UpsertLoaded, WriteSchema, check_echoed, live_target, match_upsert, parse_input,
    shown_platform_fields,
};
use super::store::{Loaded, identity_owners, load_records};
use super::topics::TopicFacts;
use super::write::identity_values;
use crate::pipeline::Ctx;
use crate::write_contexts::{self, Kind};

/// Reads what an upsert of `input` in `schema` (rule 3 of the contract's record rules) decides
/// on: the holders of its identities, and the record they (or its `id`) select.
pub(crate) async fn load_upsert(
    ctx: &Ctx<'_>,
    schema: &WriteSchema<'_>,
    input: Map<String, Value>,
) -> Result<UpsertLoaded, ApiError> {
    let input = parse_input(schema, input).map_err(answered)?;
    let client = ctx.db().await?;
    let owners = identity_owners(&client, schema.space_id, schema.schema_id, &identity_values(&input)).await?;
    upsert_target(&client, schema, input, owners).await
}

/// The rest of an upsert's reads once the holders of its identities (`owners`) are known:
/// the record they (or the input's `id`) select. A caller that reads the owners of several
/// upserts at once, on one connection, goes on from here.
pub(crate) async fn upsert_target(
    client: &deadpool_postgres::Client,
    schema: &WriteSchema<'_>,
    input: Input,
    owners: Owners,
) -> Result<UpsertLoaded, ApiError> {
    let (target, holders) = match &input.id {
        Some(record_id) => (Match::Existing(record_id.clone()), Vec::new()),
        None => {
            let holders = load_records(client, &owners.values().cloned().collect::<Vec<_>>()).await?;
            let states: Vec<RecordState> = holders
                .iter()
                .filter_map(|(_, _, loaded)| match loaded {
                    Loaded::Live { state, .. } => Some(state.clone()),
                    _ => None,
                })
                .collect();
            (match_upsert(schema.schema_type, &input, &owners, &states), holders)
        }
    };
    let target = match target {
        // A holder the identities matched was read with the others: it is not read again.
        Match::Existing(record_id) if holders.iter().any(|(id, _, _)| *id == record_id) => {
            Some(target_among(schema, &record_id, holders)?)
        }
        Match::Existing(record_id) => Some(load_in_schema(client, schema, &record_id).await?),
        Match::New => None,
    };
    Ok(UpsertLoaded { input, owners, target })
}

/// The catalog context of a record write to `schema_ref`: kept by this process, or read now.
pub(crate) async fn context(ctx: &Ctx<'_>, space_id: &str, schema_ref: &str) -> Result<Arc<WriteContext>, ApiError> {
    write_contexts::current(ctx, Kind::Record, space_id, schema_ref).await
}

/// The contact or object schema `schema_ref` (id or slug) of the space, its attributes and
/// the space's AI credits, read from the catalog now; 404 `schema_not_found` otherwise.
pub(crate) async fn write_context(
    ctx: &Ctx<'_>,
    space_id: &str,
    schema_ref: &str,
) -> Result<Arc<WriteContext>, ApiError> {
    write_contexts::fresh(ctx, Kind::Record, space_id, schema_ref).await
}

/// What an update reads: the input, the record (stream version, state, data key) and the
/// holders of the identities the input sets.
pub(crate) async fn load_update(
    ctx: &Ctx<'_>,
    schema: &WriteSchema<'_>,
    record_id: &str,
    mut input: Map<String, Value>,
) -> Result<(Input, Target, Owners), ApiError> {
    // The body may be the record as read: its `createdAt` is taken when unchanged, its
    // `updatedAt` ignored.
    let echoed = crate::echo::take_echoed(&mut input, &["createdAt"], &["updatedAt"]);
    let input = parse_input(schema, input).map_err(answered)?;
    let client = ctx.db().await?;
    // The record and the holders of the identities the input sets, sent at once on one
    // connection: one exchange with the database.
    let identities = identity_values(&input);
    let (target, owners) = tokio::try_join!(load_in_schema(&client, schema, record_id), async {
        identity_owners(&client, schema.space_id, schema.schema_id, &identities).await.map_err(ApiError::from)
    })?;
    check_echoed(&crate::echo::changed(&echoed, &shown_platform_fields(&target.1))).map_err(answered)?;
    Ok((input, target, owners))
}

/// What a write's `topics` decides on: the space's topics by slug, name and id, and the
/// contact's subscriptions (none for a new contact).
pub(crate) async fn load_topics(
    ctx: &Ctx<'_>,
    space_id: &str,
    contact_id: Option<&str>,
) -> Result<TopicFacts, ApiError> {
    let catalog = ctx.catalog().await?;
    let client = ctx.db().await?;
    let mut by_reference = std::collections::BTreeMap::new();
    for (topic_id, topic) in reads::email::topics(&client, &catalog, space_id).await.map_err(ApiError::from)? {
        by_reference.insert(topic.slug, topic_id.clone());
        by_reference.insert(topic.name, topic_id.clone());
        by_reference.insert(topic_id.clone(), topic_id);
    }
    let current = match contact_id {
        Some(contact_id) => reads::email::subscriptions(&client, contact_id).await.map_err(ApiError::from)?,
        None => std::collections::BTreeMap::new(),
    };
    Ok(TopicFacts { by_reference, current })
}

/// The record's stream version, state and data key, if it is a live record of `schema`;
/// else 404, or 409 while its deletion is under way.
pub(crate) async fn load_in_schema(
    client: &deadpool_postgres::Client,
    schema: &WriteSchema<'_>,
    record_id: &str,
) -> Result<Target, ApiError> {
    target_among(schema, record_id, load_records(client, &[record_id.to_owned()]).await?)
}

/// Record `record_id` among `loaded` (as `load_records` reads them) as [`load_in_schema`]
/// answers it.
fn target_among(
    schema: &WriteSchema<'_>,
    record_id: &str,
    loaded: Vec<(String, i64, Loaded)>,
) -> Result<Target, ApiError> {
    let loaded = loaded.into_iter().find(|(id, _, _)| id == record_id).map(|(_, version, loaded)| (version, loaded));
    live_target(schema, record_id, loaded).map_err(answered)
}
