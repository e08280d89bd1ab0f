//! What a write reads from the catalog (a schema, its attributes, the space's credits), kept
//! per process so that record creates and single event fires need no catalog statement, and
//! never used once the catalog has changed: a decision made on a kept context appends with
//! the catalog revision guard, and a refusal made on one is decided again on a fresh read
//! when the catalog has moved on (both by the command pipeline, told through
//! [`Ctx::kept_catalog`]).

use std::sync::Arc;

use domain::catalog::{self, WriteContext};
use platform::error::ApiError;

use crate::decision::UnknownSchema;

use crate::State;
use crate::pipeline::Ctx;

/// The kind of schema a write names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A contact or object schema (record writes).
    Record,
    /// An event schema (fires).
    Event,
}

impl Kind {
    fn cache(self, state: &State) -> &catalog::WriteContexts {
        match self {
            Kind::Record => &state.write_contexts,
            Kind::Event => &state.event_contexts,
        }
    }

    fn accepts(self, schema_type: &str) -> bool {
        (schema_type == "event") == (self == Kind::Event)
    }

    fn not_found(self, schema_ref: &str) -> ApiError {
        let what = match self {
            Kind::Record => "contact or object schema",
            Kind::Event => "event schema",
        };
        UnknownSchema { what, schema_ref: schema_ref.to_owned() }.into()
    }
}

/// The context of a write to `schema_ref` read from the catalog now, in one statement with
/// the catalog's revision (which guards the command's append); 404 `schema_not_found` when the
/// space has no such schema of `kind`. Kept for later writes, except a record schema with AI
/// auto-fill: a record write to it needs the space's credits as they are now.
pub(crate) async fn fresh(
    ctx: &Ctx<'_>,
    kind: Kind,
    space_id: &str,
    schema_ref: &str,
) -> Result<Arc<WriteContext>, ApiError> {
    let catalog = ctx.catalog_as_last_seen().await?;
    let context = reads::catalog::write_context(&ctx.db().await?, &catalog, space_id, schema_ref).await?;
    if let Some(context) = &context {
        ctx.saw_catalog(context.revision);
    }
    let context = context
        .filter(|context| kind.accepts(&context.schema.schema_type))
        .ok_or_else(|| kind.not_found(schema_ref))?;
    let context = Arc::new(context);
    if kind == Kind::Event || !context.spends_credits() {
        kind.cache(ctx.state).put(space_id, schema_ref, context.revision, &context);
    }
    Ok(context)
}

/// The kept context of `schema_ref` when this process holds one, else a fresh one.
pub(crate) async fn current(
    ctx: &Ctx<'_>,
    kind: Kind,
    space_id: &str,
    schema_ref: &str,
) -> Result<Arc<WriteContext>, ApiError> {
    match kind.cache(ctx.state).get(space_id, schema_ref) {
        Some((revision, context)) => {
            ctx.kept_catalog(revision);
            Ok(context)
        }
        None => fresh(ctx, kind, space_id, schema_ref).await,
    }
}

/// The context this process keeps for `schema_ref`, or the catalog's (read at the edge,
/// before an idempotency claim: an unknown schema records nothing). A write that decides on it
/// outside a command's [`Ctx`] appends with the revision guard of its `revision`.
pub(crate) async fn at_edge(
    state: &State,
    kind: Kind,
    space_id: &str,
    schema_ref: &str,
) -> Result<Arc<WriteContext>, ApiError> {
    if let Some((_, context)) = kind.cache(state).get(space_id, schema_ref) {
        return Ok(context);
    }
    let catalog = crate::pipeline::edge_catalog(state).await?;
    let context = reads::catalog::write_context(&state.pool.get().await?, &catalog, space_id, schema_ref)
        .await?
        .filter(|context| kind.accepts(&context.schema.schema_type))
        .ok_or_else(|| kind.not_found(schema_ref))?;
    let context = Arc::new(context);
    if kind == Kind::Event || !context.spends_credits() {
        kind.cache(state).put(space_id, schema_ref, context.revision, &context);
    }
    Ok(context)
}
