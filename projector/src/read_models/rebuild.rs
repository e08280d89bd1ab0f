//! Rebuilding a read model with no downtime: build a new version from position 0 beside the
//! live one, then, once it has caught up, switch readers to it in one transaction.
//!
//! # Rebuild
//!
//! `projector rebuild <name>` creates version N+1 in a new schema (`rm_<name>_v<N+1>`), without
//! the indexes only readers use (`ReadModel::read_indexes`), projects it from position 0 beside
//! the live version in batches of 2,000 (500 while it yields to live requests, as the imports
//! worker's waves shrink; `api::live_load::next_step`) (with a progress bar, rate and time left on a
//! terminal, `platform::progress`, and a plain line every 2 s otherwise; after each batch it
//! yields to live requests as the imports worker does, `api::live_load::yield_to_live` with
//! `APP__IMPORTS__LIVE_YIELD`), builds those indexes under the version's lease once it has
//! caught up, then in one transaction
//! locks both checkpoint rows, brings the new version to the head of the log, retires the old
//! one and makes the new one live. Readers pick up the switch within 500 ms; the retired
//! schema is dropped after a grace period. A table added to a read model later (`ReadModel::additions`, `CREATE TABLE IF
//! NOT EXISTS`, filled only by events that came with it) is part of every new version and is
//! added to the existing versions when a projector starts, so it needs no rebuild.

use std::time::{Duration, Instant};

use anyhow::Context;
use deadpool_postgres::Pool;
use platform::readmodel::schema_name;

use super::ReadModel;
use super::runner::{BATCH_SIZE, Faults, Outcome, REBUILD_BATCH_SIZE, announce, project_batch_of, project_in};

/// How long the retired version is kept after the switch, so reads already under way on it
/// (and readers whose cached live version is still the old one) finish.
const RETIRE_GRACE: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy)]
pub struct RebuildReport {
    pub version: i32,
    pub events: i64,
    pub elapsed: Duration,
    /// How long it waited for live requests in all (see [`rebuild_yielding`]).
    pub yielded: Duration,
}

/// What a rebuild reports as it goes.
#[derive(Debug, Clone, Copy)]
pub enum Step<'a> {
    /// A stage began or ended, in words.
    Note(&'a str),
    /// The new version has reached `position`, of a log whose head was `head` when the
    /// rebuild began (after each batch).
    At { position: i64, head: i64 },
    /// Readers switched to the new version; what follows is the retired version's grace
    /// period and its drop.
    Switched,
}

/// Rebuilds `projection` at full pace, calling `progress` as it goes.
pub async fn rebuild(
    pool: &Pool,
    model: &dyn ReadModel,
    progress: impl FnMut(Step<'_>),
) -> anyhow::Result<RebuildReport> {
    rebuild_yielding(pool, model, 0.0, progress).await
}

/// Rebuilds `projection`, calling `progress` as it goes. While the API servers serve requests,
/// it waits after each batch up to `live_yield` times as long as the batch took, in proportion
/// to their rate (`api::live_load`), so the live version's readers and the writers keep the
/// machine; 0 never waits.
pub async fn rebuild_yielding(
    pool: &Pool,
    model: &dyn ReadModel,
    live_yield: f64,
    mut progress: impl FnMut(Step<'_>),
) -> anyhow::Result<RebuildReport> {
    let started = Instant::now();
    let mut yielded = Duration::ZERO;
    let (live_version, version) = create_version(pool, model).await?;
    let note = format!("rebuilding {} as version {version} beside live version {live_version}", model.name());
    progress(Step::Note(&note));
    let worker = format!("rebuild-{}", std::process::id());
    let faults = Faults::default();
    let head = {
        let client = pool.get().await?;
        platform::log::head(&client).await?
    };
    // While it yields to live requests, a rebuild takes the live projection's batches.
    let mut size = api::live_load::first_step(pool, live_yield, REBUILD_BATCH_SIZE, BATCH_SIZE).await?;
    loop {
        let batch = Instant::now();
        match project_batch_of(pool, model, version, size, &worker, &faults).await? {
            Outcome::Projected { position, .. } => {
                progress(Step::At { position, head });
                let paused = api::live_load::yield_to_live(
                    pool,
                    batch.elapsed(),
                    live_yield,
                    "rebuild_live_yield_milliseconds_total",
                )
                .await?;
                yielded += paused;
                size = api::live_load::next_step(paused, REBUILD_BATCH_SIZE, BATCH_SIZE);
            }
            Outcome::CaughtUp { .. } => break,
            Outcome::Busy => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    build_read_indexes(pool, model, version).await?;
    // Fresh tables have no planner statistics; without them the first queries on the new
    // version can choose sequential scans.
    {
        let client = pool.get().await?;
        client
            .batch_execute(&format!("ANALYZE {}", tables_of(&client, &schema_name(model.name(), version)).await?))
            .await?;
    }
    let position = switch(pool, model, live_version, version, &worker).await?;
    let elapsed = started.elapsed();
    progress(Step::Switched);
    let note = format!(
        "switched readers to {} version {version} at position {position} after {:.2}s",
        model.name(),
        elapsed.as_secs_f64()
    );
    progress(Step::Note(&note));
    tokio::time::sleep(RETIRE_GRACE).await;
    let client = pool.get().await?;
    client.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", schema_name(model.name(), live_version))).await?;
    progress(Step::Note(&format!("dropped retired version {live_version}")));
    Ok(RebuildReport { version, events: position, elapsed, yielded })
}

async fn create_version(pool: &Pool, model: &dyn ReadModel) -> anyhow::Result<(i32, i32)> {
    let mut client = pool.get().await?;
    let transaction = client.transaction().await?;
    transaction.execute("SELECT pg_advisory_xact_lock(727002)", &[]).await?;
    let building = transaction
        .query_opt("SELECT version FROM projections WHERE name = $1 AND status = 'building'", &[&model.name()])
        .await?;
    if let Some(row) = building {
        anyhow::bail!("version {} of {} is already being built", row.get::<_, i32>(0), model.name());
    }
    let live: i32 = transaction
        .query_one("SELECT version FROM projections WHERE name = $1 AND status = 'live'", &[&model.name()])
        .await
        .context("the projection has no live version; run migrate first")?
        .get(0);
    let next: i32 = transaction
        .query_one("SELECT max(version) + 1 FROM projections WHERE name = $1", &[&model.name()])
        .await?
        .get(0);
    transaction.batch_execute(&super::create_tables_sql(model, &schema_name(model.name(), next))).await?;
    transaction
        .execute(
            "INSERT INTO projections (name, version, position, status) VALUES ($1, $2, 0, 'building')",
            &[&model.name(), &next],
        )
        .await?;
    transaction.commit().await?;
    Ok((live, next))
}

/// Builds the read indexes of the version being built (see [`ReadModel::read_indexes`]) under
/// its lease, so no batch writes its tables meanwhile (another process's batches skip a
/// version whose lease is held, and none holds one table while waiting for another).
async fn build_read_indexes(pool: &Pool, model: &dyn ReadModel, version: i32) -> anyhow::Result<()> {
    let indexes = super::read_indexes_sql(model, &schema_name(model.name(), version));
    if indexes.trim().is_empty() {
        return Ok(());
    }
    let mut client = pool.get().await?;
    let transaction = client.transaction().await?;
    transaction
        .execute("SELECT 1 FROM projections WHERE name = $1 AND version = $2 FOR UPDATE", &[&model.name(), &version])
        .await?;
    transaction.batch_execute(&indexes).await?;
    transaction.commit().await?;
    Ok(())
}

/// Locks both versions (waiting out batches in flight), brings the new one to the head of
/// the log, and makes it live. The new version is then at least as far as the old one was, so
/// no reader sees a read model go backwards.
async fn switch(pool: &Pool, model: &dyn ReadModel, live: i32, next: i32, worker: &str) -> anyhow::Result<i64> {
    let mut client = pool.get().await?;
    let transaction = client.transaction().await?;
    let rows = transaction
        .query(
            "SELECT version, position FROM projections WHERE name = $1 AND version = ANY($2) ORDER BY version FOR UPDATE",
            &[&model.name(), &vec![live, next]],
        )
        .await?;
    let mut position = rows
        .iter()
        .find(|row| row.get::<_, i32>(0) == next)
        .map(|row| row.get::<_, i64>(1))
        .context("the version being built disappeared")?;
    while let Some((_, last)) =
        project_in(&transaction, model, next, position, REBUILD_BATCH_SIZE, worker, &Faults::default()).await?
    {
        position = last;
    }
    transaction
        .execute(
            "UPDATE projections SET status = 'retired', updated_at = now() WHERE name = $1 AND version = $2",
            &[&model.name(), &live],
        )
        .await?;
    transaction
        .execute(
            "UPDATE projections SET status = 'live', updated_at = now() WHERE name = $1 AND version = $2",
            &[&model.name(), &next],
        )
        .await?;
    announce(&transaction, model, next, position).await?;
    transaction.commit().await?;
    Ok(position)
}

/// The tables of a read-model schema, as a comma-separated list for ANALYZE.
async fn tables_of(client: &deadpool_postgres::Client, schema: &str) -> anyhow::Result<String> {
    let rows = client.query("SELECT tablename FROM pg_tables WHERE schemaname = $1", &[&schema]).await?;
    let tables: Vec<String> = rows.into_iter().map(|row| format!("{schema}.{}", row.get::<_, String>(0))).collect();
    anyhow::ensure!(!tables.is_empty(), "schema {schema} has no tables");
    Ok(tables.join(", "))
}
