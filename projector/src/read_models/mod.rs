//! The read models. Each knows its tables (created in a schema of its own per version,
//! `rm_<name>_v<version>`) and how the log's events change them; `runner` projects a batch,
//! `quarantine` keeps a poison event from stopping one, `rebuild` builds a new version beside
//! the live one, and `worker` runs each read model on the worker runtime.
//!
//! # Life of a log event
//!
//! 1. Appended at position P in a transaction that also records `key_positions[key] = P`.
//! 2. `NOTIFY log_appended` wakes the workers that follow the log in every projector process (or
//!    their 250 ms poll finds it).
//! 3. A read model's worker locks the checkpoint rows of its live and building versions `FOR
//!    UPDATE SKIP LOCKED` in one statement (the leases; another process's rows are skipped)
//!    and, for each version it holds, reads the span of up to 500 positions after the
//!    checkpoint, no further than the head: only the events of the types the read model reads,
//!    through the index `events (event_type, position)` (`log::read_wanted`; the webhook enqueue,
//!    the workflows' follower and preparation read the same way). Every position up to the head
//!    is committed, so the span holds every event of those types. Spans that hold none (most
//!    appends concern one or two read models) are passed over for every read model of the
//!    process in one statement that takes their leases, advances their checkpoints and
//!    notifies once for all of them, but records no batch: there is nothing applied to record
//!    (`runner::IdlePasses`). Otherwise the read model applies them (holding back events of
//!    quarantined spaces, dead-lettering an event that cannot be applied: see Poison events),
//!    advances the checkpoint, records the batch in `projection_batches` (with when the step began
//!    and when it committed, which the benchmark uses to split the lag) and issues `NOTIFY
//!    projection_progress`, all in one transaction (PostgreSQL delivers the notification only
//!    when it commits). That transaction commits with `synchronous_commit = off`: what it
//!    writes is derived from the log and checkpointed with it, so a database crash can only
//!    take a read model back to an earlier checkpoint, from which it projects the same rows
//!    again, and the next synchronous commit of anyone (an append, a worker's step) flushes it
//!    first. A batch of 100 positions or more (catching up on an import) and a rebuild's batch
//!    wait for their own flush instead (a rebuild's full batches are such), so that a live request's commit does not flush their log.
//!    The read models of a process share a lane (below), so under load each batch
//!    gathers the events that arrived while the others projected.
//! 4. A GET by the same key reads `key_positions`, waits until the read models it uses have
//!    reached P (woken by the progress notification), and answers with `Projection-Position`.
//!    Another key can pass `Consistency-Token: P` for the same guarantee.

/// Declares a read model: the unit type `$model` named `$name`, with the module's `DDL` and
/// `apply`: set-based over the whole batch (`batch`) or event by event over the module's
/// `EVENT_TYPES` (`each`); with `read_indexes = X`, `X` holds its read indexes; with
/// `additions = Y`, `Y` holds what was added since its first release; with `keyed = true`, its
/// batch runs generic plans held to index lookups (see [`ReadModel::keyed`]).
macro_rules! read_model {
    ($(#[$meta:meta])* $model:ident = $name:expr, $mode:ident $(, read_indexes = $indexes:expr)?
     $(, additions = $additions:expr)? $(, keyed = $keyed:expr)?) => {
        $(#[$meta])*
        pub(crate) struct $model;

        impl super::ReadModel for $model {
            fn name(&self) -> &'static str {
                $name
            }

            fn ddl(&self) -> &'static str {
                DDL
            }

            $(fn read_indexes(&self) -> &'static str {
                $indexes
            })?

            $(fn additions(&self) -> &'static str {
                $additions
            })?

            $(fn keyed(&self) -> bool {
                $keyed
            })?

            fn event_types(&self) -> &'static [&'static str] {
                EVENT_TYPES
            }

            fn apply<'a>(
                &'a self,
                transaction: &'a deadpool_postgres::Transaction<'a>,
                schema: &'a str,
                events: &'a [platform::log::StoredEvent],
            ) -> futures_util::future::BoxFuture<'a, anyhow::Result<()>> {
                read_model!(@apply $mode, $name, transaction, schema, events)
            }
        }
    };
    (@apply batch, $name:expr, $transaction:ident, $schema:ident, $events:ident) => {
        Box::pin(super::apply_batch($name, apply($transaction, $schema, $events), $events))
    };
    (@apply each, $name:expr, $transaction:ident, $schema:ident, $events:ident) => {
        Box::pin(super::apply_each($name, $transaction, $schema, $events, EVENT_TYPES, apply))
    };
}

mod broadcasts;
mod catalog;
pub mod deletions;
mod emails;
mod events;
pub mod quarantine;
pub mod rebuild;
mod records;
pub mod runner;
pub mod segments;
mod suppressions;
mod webhooks;
pub mod worker;
mod workflows;

use anyhow::Context;
use deadpool_postgres::Transaction;
use futures_util::future::BoxFuture;
use platform::log::StoredEvent;

/// A read model: its tables and how a batch of log events changes them.
pub trait ReadModel: Send + Sync + 'static {
    /// The stable name (`records`): the key of its versions in `projections`.
    fn name(&self) -> &'static str;

    /// The tables of one version, with `{s}` standing for the version's schema.
    fn ddl(&self) -> &'static str;

    /// Indexes that only readers use, never [`ReadModel::apply`] (with `{s}` as in `ddl`). A
    /// rebuild builds them once its version has caught up, before readers switch to it: built
    /// over the finished tables, they cost a fraction of keeping them on every batch. A
    /// version created otherwise (the first) has them from the start.
    fn read_indexes(&self) -> &'static str {
        ""
    }

    /// What was added to the read model since versions of it were first made (with `{s}` as in
    /// `ddl`): part of every new version, and run on the versions that exist when a projector
    /// starts ([`runner::ensure_initialized`]), so an upgrade needs no rebuild for it. Each
    /// statement is idempotent (`CREATE TABLE IF NOT EXISTS`, `ADD COLUMN IF NOT EXISTS`,
    /// `CREATE INDEX IF NOT EXISTS`, a fill that finds nothing left to fill). A version made
    /// before holds what a rebuild would: what was added is filled only by events that came
    /// with it, or filled in by the additions themselves from what the log and the engine hold.
    fn additions(&self) -> &'static str {
        ""
    }

    /// Whether every statement of its batch finds its rows by key (a key column, or a table's
    /// key joined to `unnest` of parameter arrays) and none joins two sets of its own. Its
    /// batch then runs its generic plans, planned once per connection and held to index
    /// lookups (`db::KEYED_PLANS`, set for the batch alone: [`quarantine::apply`]). Given
    /// arrays of keys, PostgreSQL planned such statements again on every call. A batch that
    /// joins sets (the workflows' history with the runs it names) needs the hash joins those
    /// settings forbid: with them its rebuild took four times as long (docs/benchmarks.md,
    /// issue 70: "Planned once").
    fn keyed(&self) -> bool {
        false
    }

    /// The event types it reads; it is given the payloads of these alone.
    fn event_types(&self) -> &'static [&'static str];

    /// Applies `events` (contiguous, in log order) to the version in `schema`, inside the
    /// batch transaction that also advances its checkpoint. Applying the same events again
    /// changes nothing.
    fn apply<'a>(
        &'a self,
        transaction: &'a Transaction<'a>,
        schema: &'a str,
        events: &'a [StoredEvent],
    ) -> BoxFuture<'a, anyhow::Result<()>>;
}

/// Every read model.
pub const ALL: [&dyn ReadModel; 10] = [
    &catalog::Catalog,
    &records::Records,
    &suppressions::Suppressions,
    &deletions::Deletions,
    &events::Events,
    &webhooks::Webhooks,
    &segments::Segments,
    &broadcasts::Broadcasts,
    &workflows::Workflows,
    &emails::Emails,
];

/// The read model named `name`.
pub fn by_name(name: &str) -> Option<&'static dyn ReadModel> {
    ALL.into_iter().find(|model| model.name() == name)
}

/// The names of every read model, for messages.
pub fn names() -> String {
    ALL.iter().map(|model| model.name()).collect::<Vec<_>>().join(", ")
}

/// The statements that create one version of `model` in `schema`: its schema and tables, with
/// its read indexes (see [`ReadModel::read_indexes`]).
pub(crate) fn create_version_sql(model: &dyn ReadModel, schema: &str) -> String {
    format!("{}\n{}", create_tables_sql(model, schema), read_indexes_sql(model, schema))
}

/// A version's schema and tables without its read indexes: what a rebuild starts from.
pub(crate) fn create_tables_sql(model: &dyn ReadModel, schema: &str) -> String {
    format!("CREATE SCHEMA {schema};\n{}\n{}", model.ddl().replace("{s}", schema), additions_sql(model, schema))
}

/// The tables added since the read model's first release (see [`ReadModel::additions`]).
pub(crate) fn additions_sql(model: &dyn ReadModel, schema: &str) -> String {
    model.additions().replace("{s}", schema)
}

/// A version's read indexes (see [`ReadModel::read_indexes`]).
pub(crate) fn read_indexes_sql(model: &dyn ReadModel, schema: &str) -> String {
    model.read_indexes().replace("{s}", schema)
}

/// Applies a set-based read model's batch, naming the batch in the error.
async fn apply_batch(
    name: &'static str,
    applied: impl std::future::Future<Output = anyhow::Result<()>>,
    events: &[StoredEvent],
) -> anyhow::Result<()> {
    applied.await.with_context(|| {
        let first = events.first().map_or(0, |event| event.position);
        format!("read model {name} failed on the batch starting at position {first}")
    })
}

/// Applies an event-by-event read model: each event of `types`, in order (others are skipped
/// without decoding), naming the failing event in the error.
async fn apply_each<'a, F, Fut>(
    name: &'static str,
    transaction: &'a Transaction<'a>,
    schema: &'a str,
    events: &'a [StoredEvent],
    types: &'static [&'static str],
    apply: F,
) -> anyhow::Result<()>
where
    F: Fn(&'a Transaction<'a>, &'a str, &'a StoredEvent) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    for event in events.iter().filter(|event| types.contains(&event.event_type.as_str())) {
        apply(transaction, schema, event).await.with_context(|| {
            format!("read model {name} failed on {} at position {}", event.event_type, event.position)
        })?;
    }
    Ok(())
}
