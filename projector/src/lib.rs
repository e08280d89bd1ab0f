//! The projector: follows the event log and builds the read models the query service serves.
//!
//! Each read model is a named projection with versions; each version lives in its own
//! Postgres schema (`rm_<name>_v<version>`) with a checkpoint row in `projections`. The row
//! is locked `FOR UPDATE SKIP LOCKED` for a batch, so it is also the lease: any number of
//! projector processes may run, and each batch is applied by exactly one of them.

pub mod daemon;
pub mod eraser;
pub mod preparation;
pub mod projections;
pub mod quarantine;
pub mod rebuild;
pub mod runner;

pub use projections::Projection;

/// Applies the log's migrations and creates version 1 of every read model that has none.
pub async fn migrate(pool: &deadpool_postgres::Pool) -> anyhow::Result<()> {
    shared::db::migrate(pool).await?;
    runner::ensure_initialized(pool).await
}
