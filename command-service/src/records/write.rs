//! The write assembly of record writes, shared by every command that writes records (the
//! record endpoints, template sends, forms, emails, workflows): loading and deciding a
//! create, an upsert or an update, and turning a decision into the streams and guards to
//! append (with the subject's data key and its personal data sealed).

use actix_web::http::StatusCode;
use domain::catalog::WriteContext;
use domain::records::RecordState;
pub(crate) use domain::records::write::{Write, create_write, identity_values, update_write};
use platform::crypto::DataKey;
use platform::error::ApiError;
use platform::fresh::Drawn;
use platform::ids::new_id;
use platform::log::AppendError;
use serde_json::{Map, Value};

use crate::pipeline::Ctx;
use crate::records::decide::{
    Input, Match, Owners, UpdateDecision, WriteSchema, check_echoed, decide_create, decide_update, live_target,
    match_upsert, parse_input, shown_platform_fields,
};
use crate::records::store::{Loaded, identity_owners, load_records};
use crate::write_contexts::{self, Kind};

/// The record schema of a write and the space it is in, as a decision takes it.
pub(crate) fn write_schema<'a>(context: &'a WriteContext, space_id: &'a str) -> WriteSchema<'a> {
    WriteSchema {
        schema_id: &context.schema.schema_id,
        space_id,
        schema_type: &context.schema.schema_type,
        attributes: &context.attributes,
    }
}

/// An upsert decided: the status and record it answers with, and the write (none when
/// nothing changes).
pub(crate) struct PlannedUpsert {
    pub status: StatusCode,
    pub record: RecordState,
    pub warnings: Vec<api::pagination::Warning>,
    pub write: Option<Result<Write, AppendError>>,
    /// The data key of an unchanged record (a write carries its own).
    pub key: Option<DataKey>,
}

/// What an upsert reads: its input, the identity holders, and the record it updates (its
/// stream version, state and data key), or `None` for a new record.
pub(crate) struct UpsertLoaded {
    input: Input,
    owners: Owners,
    target: Option<(i64, RecordState, Option<DataKey>)>,
}

/// Reads what an upsert of `input` in `schema` (rule 3 of the contract's record rules) decides
/// on: the holders of its identities, and the record they (or its `id`) select.
pub(crate) async fn load_upsert(
    ctx: &Ctx<'_>,
    schema: &WriteSchema<'_>,
    input: Map<String, Value>,
) -> Result<UpsertLoaded, ApiError> {
    let input = parse_input(schema, input)?;
    let client = ctx.db().await?;
    let owners = identity_owners(&client, schema.space_id, schema.schema_id, &identity_values(&input)).await?;
    let target = match &input.id {
        Some(record_id) => Match::Existing(record_id.clone()),
        None => {
            let holders: Vec<String> = owners.values().cloned().collect();
            let states: Vec<RecordState> = load_records(&client, &holders)
                .await?
                .into_iter()
                .filter_map(|(_, _, loaded)| match loaded {
                    Loaded::Live { state, .. } => Some(state),
                    _ => None,
                })
                .collect();
            match_upsert(schema.schema_type, &input, &owners, &states)
        }
    };
    let target = match target {
        Match::Existing(record_id) => Some(load_in_schema(&client, schema, &record_id).await?),
        Match::New => None,
    };
    Ok(UpsertLoaded { input, owners, target })
}

/// Decides an upsert on what [`load_upsert`] read, without appending it, so that other writes
/// can join its append (a template send's context).
pub(crate) fn decide_upsert(
    schema: &WriteSchema<'_>,
    loaded: UpsertLoaded,
    now: i64,
) -> Result<PlannedUpsert, ApiError> {
    let UpsertLoaded { input, owners, target } = loaded;
    match target {
        Some((version, current, key)) => {
            let UpdateDecision::Changed(change) = decide_update(schema, &current, input, &owners, now)? else {
                return Ok(PlannedUpsert {
                    status: StatusCode::OK,
                    record: current,
                    warnings: Vec::new(),
                    write: None,
                    key,
                });
            };
            let (record, warnings) = (change.state.clone(), change.warnings.clone());
            let write = update_write(schema.space_id, schema.schema_id, (version, key), *change, &mut Drawn);
            Ok(PlannedUpsert { status: StatusCode::OK, record, warnings, write: Some(write), key: None })
        }
        None => {
            let record_id = new_id(if schema.schema_type == "contact" { "con" } else { "obj" });
            let decision = decide_create(schema, input, &owners, &record_id, now)?;
            let record = RecordState::from_created(&decision.event, &Default::default())
                .map_err(|error| ApiError::internal(&error))?;
            let warnings = decision.warnings.clone();
            let write = create_write(schema.space_id, schema.schema_id, decision, &mut Drawn);
            Ok(PlannedUpsert { status: StatusCode::CREATED, record, warnings, write: Some(write), key: None })
        }
    }
}

/// The catalog context of a record write to `schema_ref`: kept by this process, or read now.
pub(crate) async fn context(
    ctx: &Ctx<'_>,
    space_id: &str,
    schema_ref: &str,
) -> Result<std::sync::Arc<WriteContext>, ApiError> {
    write_contexts::current(ctx, Kind::Record, space_id, schema_ref).await
}

/// The contact or object schema `schema_ref` (id or slug) of the space, its attributes and
/// the space's AI credits, read from the catalog now; 404 `schema_not_found` otherwise.
pub(crate) async fn write_context(
    ctx: &Ctx<'_>,
    space_id: &str,
    schema_ref: &str,
) -> Result<std::sync::Arc<WriteContext>, ApiError> {
    write_contexts::fresh(ctx, Kind::Record, space_id, schema_ref).await
}

/// Decides an upsert on what it reads now (see [`load_upsert`] and [`decide_upsert`]).
pub(crate) async fn plan_upsert(
    ctx: &Ctx<'_>,
    schema: &WriteSchema<'_>,
    input: Map<String, Value>,
    now: i64,
) -> Result<PlannedUpsert, ApiError> {
    let loaded = load_upsert(ctx, schema, input).await?;
    decide_upsert(schema, loaded, now)
}

/// Decides an update of the live record `record_id` of `schema` with `input` (rule 6)
/// without appending it, on what it reads now; `None` when nothing changes.
pub(crate) async fn plan_update(
    ctx: &Ctx<'_>,
    schema: &WriteSchema<'_>,
    record_id: &str,
    input: Map<String, Value>,
    now: i64,
) -> Result<Option<Write>, ApiError> {
    let (input, target, owners) = load_update(ctx, schema, record_id, input).await?;
    decide_record_update(schema, input, target, &owners, now).map(|decided| decided.map(|(write, _)| write))
}

/// What an update reads: the input, the record (stream version, state, data key) and the
/// holders of the identities the input sets.
pub(crate) async fn load_update(
    ctx: &Ctx<'_>,
    schema: &WriteSchema<'_>,
    record_id: &str,
    mut input: Map<String, Value>,
) -> Result<(Input, (i64, RecordState, Option<DataKey>), Owners), ApiError> {
    // The body may be the record as read: its `createdAt` is taken when unchanged, its
    // `updatedAt` ignored.
    let echoed = crate::echo::take_echoed(&mut input, &["createdAt"], &["updatedAt"]);
    let input = parse_input(schema, input)?;
    let client = ctx.db().await?;
    let target = load_in_schema(&client, schema, record_id).await?;
    check_echoed(&crate::echo::changed(&echoed, &shown_platform_fields(&target.1)))?;
    let owners = identity_owners(&client, schema.space_id, schema.schema_id, &identity_values(&input)).await?;
    Ok((input, target, owners))
}

/// An update decided: the write and the record after it, or `None` when nothing changes.
pub(crate) fn decide_record_update(
    schema: &WriteSchema<'_>,
    input: Input,
    (version, current, key): (i64, RecordState, Option<DataKey>),
    owners: &Owners,
    now: i64,
) -> Result<Option<(Write, Value)>, ApiError> {
    match decide_update(schema, &current, input, owners, now)? {
        UpdateDecision::Unchanged => Ok(None),
        UpdateDecision::Changed(change) => {
            let body = api::http::data_body(change.state.document(), &change.warnings);
            let write = update_write(schema.space_id, schema.schema_id, (version, key), *change, &mut Drawn)
                .map_err(crate::edge::append_error)?;
            Ok(Some((write, body)))
        }
    }
}

/// The record's stream version, state and data key, if it is a live record of `schema`;
/// else 404, or 409 while its deletion is under way.
pub(crate) async fn load_in_schema(
    client: &deadpool_postgres::Client,
    schema: &WriteSchema<'_>,
    record_id: &str,
) -> Result<(i64, RecordState, Option<DataKey>), ApiError> {
    let loaded = load_records(client, &[record_id.to_owned()])
        .await?
        .into_iter()
        .find(|(id, _, _)| id == record_id)
        .map(|(_, version, loaded)| (version, loaded));
    Ok(live_target(schema, record_id, loaded)?)
}
