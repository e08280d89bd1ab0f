//! What a write reads from the catalog (a schema, its attributes, the space's credits), kept
//! per process so that record creates and single event fires need no catalog statement, and
//! never used once the catalog has changed: a decision made on a kept context appends with
//! the catalog revision guard, and a refusal made on one is decided again on a fresh read
//! when the catalog has moved on.

use std::future::Future;

use shared::catalog::{self, CATALOG, WriteContext};
use shared::error::{ApiError, Code};

use crate::State;

/// The kind of schema a write names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
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
        ApiError::not_found(Code::SchemaNotFound, format!("no {what} {schema_ref:?}"))
    }
}

/// The context of a write to `schema_ref` read from the catalog now; 404 `schema_not_found`
/// when the space has no such schema of `kind`. Kept for later writes, except a record
/// schema with AI auto-fill: a record write to it needs the space's credits as they are now.
pub async fn fresh(state: &State, kind: Kind, space_id: &str, schema_ref: &str) -> Result<WriteContext, ApiError> {
    let models = state.read_models.wait_for(&[CATALOG], 0, state.settings.consistency_wait()).await?;
    let client = state.pool.get().await?;
    let context = catalog::write_context(&client, &models.schema(CATALOG), space_id, schema_ref)
        .await?
        .filter(|context| kind.accepts(&context.schema.schema_type))
        .ok_or_else(|| kind.not_found(schema_ref))?;
    if kind == Kind::Event || !context.spends_credits() {
        kind.cache(state).put(space_id, schema_ref, &context);
    }
    Ok(context)
}

/// The kept context of `schema_ref` when this process holds one (`true`), else a fresh one.
pub async fn current(
    state: &State,
    kind: Kind,
    space_id: &str,
    schema_ref: &str,
) -> Result<(WriteContext, bool), ApiError> {
    match kind.cache(state).get(space_id, schema_ref) {
        Some(context) => Ok((context, true)),
        None => Ok((fresh(state, kind, space_id, schema_ref).await?, false)),
    }
}

/// Runs `attempt` on `context` (`kept`: from the cache). `attempt` gets the catalog revision
/// its append must be guarded by (`catalog::revision_guard`) when the context was kept, and
/// `None` for a fresh read, which needs no guard. A client error answered on a kept context
/// may be the cache's: if the catalog has moved on, the entries of older revisions are
/// dropped and the write is decided once more on the fresh context.
pub async fn decide<T, F, Fut>(
    state: &State,
    kind: Kind,
    (space_id, schema_ref): (&str, &str),
    (mut context, mut kept): (WriteContext, bool),
    attempt: F,
) -> Result<T, ApiError>
where
    F: Fn(WriteContext, Option<i64>) -> Fut,
    Fut: Future<Output = Result<T, ApiError>>,
{
    loop {
        let revision = kept.then_some(context.revision);
        match attempt(context.clone(), revision).await {
            Err(error) if kept && error.status().is_client_error() => {
                let fresh = fresh(state, kind, space_id, schema_ref).await?;
                if fresh.revision == context.revision {
                    return Err(error);
                }
                kind.cache(state).keep_revision(fresh.revision);
                (context, kept) = (fresh, false);
            }
            outcome => return outcome,
        }
    }
}
