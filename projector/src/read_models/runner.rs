//! Projecting one batch: take the lease, read the next span of the log up to its head, apply it
//! and advance the checkpoint in one transaction, then announce the progress.

use anyhow::Context;
use deadpool_postgres::{Pool, Transaction};
use platform::log::read_wanted;
use platform::readmodel::{PROGRESS_CHANNEL, schema_name};

use super::ReadModel;

/// Events read and applied per batch: a batch of 2,000 left each pooled connection holding
/// buffers of a few megabytes (its largest statement), and a rebuild or catch-up is as fast in
/// batches of 500 (docs/benchmarks.md, issue 51).
pub(crate) const BATCH_SIZE: i64 = 500;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// This many positions were passed over (their events of the model's types applied);
    /// there may be more.
    Projected { events: usize, position: i64 },
    /// Nothing new after the checkpoint.
    CaughtUp { position: i64 },
    /// Another process holds the lease for this projection version.
    Busy,
}

/// Options that tests use to inject failures (`APP__PROJECTOR__CRASH_*`).
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Abort the whole process after applying this many events of a batch, before COMMIT.
    pub crash_after_events: Option<usize>,
    /// Only for this read model (all when `None`).
    pub crash_projection: Option<String>,
}

impl Faults {
    pub fn from_settings(settings: &platform::settings::ProjectorSettings) -> Self {
        Self { crash_after_events: settings.crash_after_events, crash_projection: settings.crash_projection.clone() }
    }
}

/// Creates version 1 of every projection that has no version yet, and adds the tables added
/// since to the versions that exist ([`super::ReadModel::additions`]).
pub(crate) async fn ensure_initialized(pool: &Pool) -> anyhow::Result<()> {
    let mut client = pool.get().await?;
    for model in super::ALL {
        let transaction = client.transaction().await?;
        transaction.execute("SELECT pg_advisory_xact_lock(727002)", &[]).await?;
        let exists =
            transaction.query_opt("SELECT 1 FROM projections WHERE name = $1 LIMIT 1", &[&model.name()]).await?;
        if exists.is_none() {
            transaction.batch_execute(&super::create_version_sql(model, &schema_name(model.name(), 1))).await?;
            transaction
                .execute(
                    "INSERT INTO projections (name, version, position, status) VALUES ($1, 1, 0, 'live')",
                    &[&model.name()],
                )
                .await?;
        } else if !model.additions().is_empty() {
            let versions =
                transaction.query("SELECT version FROM projections WHERE name = $1", &[&model.name()]).await?;
            for row in versions {
                let schema = schema_name(model.name(), row.get(0));
                let exists = transaction
                    .query_one("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", &[&schema])
                    .await?
                    .get::<_, bool>(0);
                if exists {
                    transaction.batch_execute(&super::additions_sql(model, &schema)).await?;
                }
            }
        }
        transaction.commit().await?;
    }
    Ok(())
}

/// Events read and applied per batch by a rebuild: its process is short-lived and alone in
/// holding the buffers, and in larger batches more of a run's or a record's events fold into
/// one row written once (a rebuild of the workflows read model went from 18,000 to 30,000
/// events/s with 2,000; 5,000 were no faster: docs/benchmarks.md, issue 70).
pub(crate) const REBUILD_BATCH_SIZE: i64 = 2000;

/// Projects the next batch of one projection version, if this process can take its lease.
pub async fn project_batch(
    pool: &Pool,
    model: &dyn ReadModel,
    version: i32,
    worker: &str,
    faults: &Faults,
) -> anyhow::Result<Outcome> {
    project_batch_of(pool, model, version, BATCH_SIZE, worker, faults).await
}

/// [`project_batch`] with up to `limit` positions.
pub(crate) async fn project_batch_of(
    pool: &Pool,
    model: &dyn ReadModel,
    version: i32,
    limit: i64,
    worker: &str,
    faults: &Faults,
) -> anyhow::Result<Outcome> {
    let outcomes = project(pool, model, Some(version), limit, worker, faults).await?;
    Ok(outcomes.into_iter().next().unwrap_or(Outcome::Busy))
}

/// Batches passing over this many positions or more commit once their log is flushed.
const FLUSHED_FROM: usize = 100;

/// Projects the next batch of every live and building version of `model` whose lease this
/// process can take, unless `idle` already holds every version's outcome (a pass over spans
/// without its events, [`IdlePasses`]). Returns whether some version read a full batch, so
/// that more events may be waiting.
pub(crate) async fn project_versions(
    pool: &Pool,
    model: &dyn ReadModel,
    idle: Option<Vec<Outcome>>,
    worker: &str,
    faults: &Faults,
) -> anyhow::Result<bool> {
    let outcomes = match idle {
        Some(outcomes) => outcomes,
        None => project(pool, model, None, BATCH_SIZE, worker, faults).await?,
    };
    Ok(outcomes.iter().any(|outcome| {
        matches!(outcome, Outcome::Projected { events, .. } if i64::try_from(*events).unwrap_or(i64::MAX) >= BATCH_SIZE)
    }))
}

/// The read models of one process passing over their idle spans together. Most appends hold
/// events of one or two read models' types, and each of the others committed a batch of eight
/// statements per append to pass over them (docs/benchmarks.md, issue 70: "Live creates beside
/// a broadcast"). One statement now passes over every read model's span that holds none of
/// its events ([`pass_over_idle`]); the read models that have events to apply go on to their
/// batch transactions.
///
/// The read models take turns in their lane, and each is woken by every append. The first to
/// step runs the pass, and the others take its outcome for them (once each) if it started
/// after the process last received an append's notification: every append whose notification
/// woke them committed before the notification arrived, so the pass saw it. A notification
/// that arrives later makes the next step run a new pass, and wakes the read models again.
/// A read model whose outcome was taken, or whose pass is older, runs a new pass.
pub(crate) struct IdlePasses {
    /// Every read model of the process, its event types as pairs, for the statement.
    names: Vec<&'static str>,
    pair_names: Vec<&'static str>,
    pair_types: Vec<&'static str>,
    last: tokio::sync::Mutex<Option<IdlePass>>,
}

/// One pass: when it started, and the outcomes of the read models not taken yet (`None`: it has
/// events to apply).
struct IdlePass {
    started: std::time::Instant,
    outcomes: std::collections::HashMap<&'static str, Option<Vec<Outcome>>>,
}

impl IdlePasses {
    pub(crate) fn new(models: &[&'static dyn ReadModel]) -> Self {
        let names = models.iter().map(|model| model.name()).collect();
        let (pair_names, pair_types) = models
            .iter()
            .flat_map(|model| model.event_types().iter().map(move |event_type| (model.name(), *event_type)))
            .unzip();
        Self { names, pair_names, pair_types, last: tokio::sync::Mutex::new(None) }
    }

    /// The outcome of every version of `model` from a pass that started after the last
    /// notification of an append arrived and whose outcome for `model` was not taken yet,
    /// running a new pass otherwise. `None` when the read model has events to apply in a batch
    /// of its own.
    pub(crate) async fn outcome(&self, pool: &Pool, model: &dyn ReadModel) -> anyhow::Result<Option<Vec<Outcome>>> {
        let mut last = self.last.lock().await;
        let notified = crate::runtime::last_notified(platform::log::LOG_CHANNEL);
        let fresh = last.as_ref().is_some_and(|pass| {
            pass.outcomes.contains_key(model.name()) && notified.is_none_or(|notified| pass.started > notified)
        });
        if !fresh {
            let started = std::time::Instant::now();
            let outcomes = pass_over_idle(pool, self).await?;
            *last = Some(IdlePass { started, outcomes });
        }
        Ok(last.as_mut().and_then(|pass| pass.outcomes.remove(model.name())).flatten())
    }
}

/// A span of at most this many positions ends at the head, so the short spans of all read
/// models lie in one range of the log: the idle pass reads the events of every wanted type in
/// that range once (the read models' events, by name), rather than once per read model and
/// version over its own span. While template sends kept the two cores busy, that took the pass
/// from 1.17-1.29 ms of PostgreSQL's time to 0.34-0.43 ms.
const SHORT_SPAN: i64 = 64;

/// Passes over the spans after the checkpoints of every live and building version of the read
/// models of `passes` that hold none of their events, in one statement: it reads each
/// version's span (up to [`BATCH_SIZE`] positions, no further than the head). The wanted
/// events of the short spans (at most [`SHORT_SPAN`] positions, all ending at the head) are
/// read once for all of them; a longer span is searched on its own. For a span
/// without an event of the read model's types it takes the checkpoint row's lease (`FOR
/// UPDATE SKIP LOCKED`, only if the checkpoint has not moved), advances it and announces the
/// progress, as a batch would, though in one notification for all of them (the readers'
/// [`platform::readmodel::progress_entries`]: nine notifications an append were nine
/// wake-ups of every listener), and commits without waiting for its flush (see [`project`]).
/// It records no batch in `projection_batches`: that history is of the spans whose events a
/// read model applied (when each step began and committed, and that no event was applied
/// twice), and a span without its events has none; recording them was nine rows of every
/// append. Returns the outcomes of each read model none of whose versions is left with events
/// to apply (each passed over or caught up), and `None` for the others.
async fn pass_over_idle(
    pool: &Pool,
    passes: &IdlePasses,
) -> anyhow::Result<std::collections::HashMap<&'static str, Option<Vec<Outcome>>>> {
    let client = pool.get().await.context("connecting to project")?;
    let statement = client
        .prepare_cached(
            "WITH wanted AS (SELECT * FROM unnest($2::text[], $3::text[]) AS w(name, event_type)),
             span AS (
                 SELECT p.name, p.version, p.position AS checkpoint, least(h.position, p.position + $4) AS last
                 FROM projections p, (SELECT position FROM log_head LIMIT 1) h
                 WHERE p.name = ANY($1) AND p.status IN ('live', 'building')),
             near AS (SELECT min(checkpoint) AS low, max(last) AS high FROM span WHERE last - checkpoint <= $6),
             recent AS MATERIALIZED (
                 SELECT w.name, e.position FROM near, events e JOIN wanted w ON w.event_type = e.event_type
                 WHERE e.position > near.low AND e.position <= near.high),
             idle AS (
                 SELECT s.name, s.version, s.checkpoint, s.last FROM span s
                 WHERE s.last > s.checkpoint AND CASE WHEN s.last - s.checkpoint <= $6
                     THEN NOT EXISTS (
                         SELECT FROM recent r WHERE r.name = s.name AND r.position > s.checkpoint AND r.position <= s.last)
                     ELSE NOT EXISTS (
                         SELECT FROM wanted w JOIN events e ON e.event_type = w.event_type
                         WHERE w.name = s.name AND e.position > s.checkpoint AND e.position <= s.last)
                 END),
             leased AS (
                 SELECT p.name, p.version, i.checkpoint, i.last
                 FROM projections p JOIN idle i ON i.name = p.name AND i.version = p.version
                 WHERE p.position = i.checkpoint
                 FOR UPDATE OF p SKIP LOCKED),
             advanced AS (
                 UPDATE projections p SET position = l.last, updated_at = now() FROM leased l
                 WHERE p.name = l.name AND p.version = l.version
                 RETURNING p.name, p.version, l.checkpoint, l.last),
             announced AS (
                 SELECT pg_notify($5, string_agg(a.name || ':' || a.version || ':' || a.last, ','))
                 FROM advanced a HAVING count(*) > 0)
             SELECT s.name, s.checkpoint, s.last, a.name IS NOT NULL,
                    set_config('synchronous_commit', 'off', true)
             FROM span s LEFT JOIN advanced a ON a.name = s.name AND a.version = s.version
             LEFT JOIN announced ON true
             ORDER BY s.name, s.version",
        )
        .await?;
    let rows = client
        .query(
            &statement,
            &[&passes.names, &passes.pair_names, &passes.pair_types, &BATCH_SIZE, &PROGRESS_CHANNEL, &SHORT_SPAN],
        )
        .await?;
    let mut outcomes: std::collections::HashMap<&'static str, Option<Vec<Outcome>>> =
        passes.names.iter().map(|name| (*name, Some(Vec::new()))).collect();
    for row in rows {
        let name: &str = row.get(0);
        let Some(name) = passes.names.iter().copied().find(|known| *known == name) else { continue };
        let (checkpoint, last, advanced): (i64, i64, bool) = (row.get(1), row.get(2), row.get(3));
        let outcome = if advanced {
            Outcome::Projected { events: usize::try_from(last - checkpoint).unwrap_or(usize::MAX), position: last }
        } else if last <= checkpoint {
            Outcome::CaughtUp { position: checkpoint }
        } else {
            outcomes.insert(name, None);
            continue;
        };
        if let Some(Some(versions)) = outcomes.get_mut(name) {
            versions.push(outcome);
        }
    }
    Ok(outcomes)
}

/// One transaction: lock the checkpoint rows of the live and building versions of `model`
/// (only `version`, when given) `FOR UPDATE SKIP LOCKED` in one statement (the leases; rows
/// another process holds are skipped), then project the next batch of each. Returns each
/// leased version's outcome, in version order.
async fn project(
    pool: &Pool,
    model: &dyn ReadModel,
    version: Option<i32>,
    limit: i64,
    worker: &str,
    faults: &Faults,
) -> anyhow::Result<Vec<Outcome>> {
    let mut client = pool.get().await.context("connecting to project")?;
    let transaction = client.transaction().await?;
    let lease = transaction
        .prepare_cached(
            "SELECT version, position FROM projections
             WHERE name = $1 AND ($2::int IS NULL OR version = $2) AND status IN ('live', 'building')
             ORDER BY version FOR UPDATE SKIP LOCKED",
        )
        .await?;
    let mut outcomes = Vec::new();
    for row in transaction.query(&lease, &[&model.name(), &version]).await? {
        let (version, checkpoint): (i32, i64) = (row.get(0), row.get(1));
        let outcome = match project_in(&transaction, model, version, checkpoint, limit, worker, faults).await? {
            Some((events, position)) => Outcome::Projected { events, position },
            None => Outcome::CaughtUp { position: checkpoint },
        };
        outcomes.push(outcome);
    }
    if outcomes.iter().any(|outcome| matches!(outcome, Outcome::Projected { .. })) {
        // A projection batch commits without waiting for its WAL flush. What it writes is
        // derived from the log and checkpointed in the same transaction, so a database crash
        // can only roll a read model back to an earlier checkpoint, from which it projects the
        // same rows again; and any later synchronous commit (an append, a worker's step)
        // flushes it first. Waiting for the flush on every batch of every read model put the
        // disk in the projection lag and in the appends' way. A large batch (catching up
        // after an import, a rebuild) waits for its own flush: left to the next append, the
        // flush of its log would be a live request's wait.
        let large = outcomes
            .iter()
            .any(|outcome| matches!(outcome, Outcome::Projected { events, .. } if *events >= FLUSHED_FROM));
        if !large {
            transaction.batch_execute("SET LOCAL synchronous_commit = off").await?;
        }
        transaction.commit().await.context("committing a projection batch")?;
    } else {
        transaction.rollback().await?;
    }
    Ok(outcomes)
}

/// Applies up to `limit` events after `checkpoint` inside `transaction` (which must hold the
/// lease) and advances the checkpoint. Returns the count and new position, or `None`. An event
/// the read model cannot apply is dead-lettered and its space quarantined (see
/// [`crate::quarantine`]); a transient or systemic failure fails the batch.
pub(crate) async fn project_in(
    transaction: &Transaction<'_>,
    model: &dyn ReadModel,
    version: i32,
    checkpoint: i64,
    limit: i64,
    worker: &str,
    faults: &Faults,
) -> anyhow::Result<Option<(usize, i64)>> {
    let followed = read_wanted(transaction, checkpoint, limit, model.event_types()).await?;
    let Some(last_position) = followed.last else { return Ok(None) };
    let events = followed.events;
    let schema = schema_name(model.name(), version);
    let targeted = faults.crash_projection.as_deref().is_none_or(|name| name == model.name());
    if let (true, Some(after)) = (targeted, faults.crash_after_events) {
        // Apply part of the batch, then die before COMMIT, as a crash mid-batch would.
        model.apply(transaction, &schema, &events[..after.min(events.len())]).await?;
        tracing::error!("injected fault: aborting the projector mid-batch");
        std::process::abort();
    }
    let count = followed.read;
    let mut quarantine = super::quarantine::Quarantine::load(transaction, model.name(), version).await?;
    super::quarantine::apply(transaction, model, version, &schema, events, &mut quarantine).await?;
    let statement = transaction
        .prepare_cached(
            "WITH advanced AS (
                 UPDATE projections SET position = $4, updated_at = now() WHERE name = $1 AND version = $2)
             INSERT INTO projection_batches
                 (name, version, first_position, last_position, worker, started_at, committed_at)
             VALUES ($1, $2, $3, $4, $5, now(), clock_timestamp())",
        )
        .await?;
    let (name, first) = (model.name(), checkpoint + 1);
    let parameters: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
        [&name, &version, &first, &last_position, &worker];
    // The announcement is pipelined with the checkpoint; PostgreSQL delivers it only if the
    // batch commits.
    tokio::try_join!(
        transaction.execute(&statement, &parameters),
        announce(transaction, model, version, last_position)
    )?;
    Ok(Some((count, last_position)))
}

/// Tells readers that a projection version advanced: a NOTIFY inside `transaction`, which
/// PostgreSQL delivers when (and only if) the transaction commits.
pub(crate) async fn announce(
    transaction: &Transaction<'_>,
    model: &dyn ReadModel,
    version: i32,
    position: i64,
) -> Result<u64, tokio_postgres::Error> {
    let payload = format!("{}:{version}:{position}", model.name());
    let statement = transaction.prepare_cached("SELECT pg_notify($1, $2)").await?;
    transaction.execute(&statement, &[&PROGRESS_CHANNEL, &payload]).await
}
