//! Which version of each read model is live, how far it has projected, and waiting until it
//! reaches a caller's last write (read-your-writes).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio::sync::Notify;

use crate::error::ApiError;

/// The channel the projector notifies after each committed batch and each pass over idle spans
/// ([`progress_entries`]).
pub const PROGRESS_CHANNEL: &str = "projection_progress";

/// The progress a `projection_progress` notification announces: `name:version:position`
/// entries, separated by commas (a batch announces its own read model, a pass over idle spans
/// every read model it advanced). An entry that does not read so is left out.
pub fn progress_entries(payload: &str) -> impl Iterator<Item = (&str, i32, i64)> {
    payload.split(',').filter_map(|entry| {
        let mut parts = entry.split(':');
        let (name, version, position) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        Some((name, version.parse().ok()?, position.parse().ok()?))
    })
}

/// The live version of one read model and its checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Live {
    pub version: i32,
    pub position: i64,
}

/// The Postgres schema holding version `version` of read model `name`.
pub fn schema_name(name: &str, version: i32) -> String {
    format!("rm_{name}_v{version}")
}

/// The schema of read model `name`'s live version, read now; `None` before it has one.
pub async fn live_schema(client: &impl deadpool_postgres::GenericClient, name: &str) -> anyhow::Result<Option<String>> {
    let row = client.query_opt("SELECT version FROM projections WHERE name = $1 AND status = 'live'", &[&name]).await?;
    Ok(row.map(|row| schema_name(name, row.get(0))))
}

impl Live {
    pub fn schema(&self, name: &str) -> String {
        schema_name(name, self.version)
    }
}

#[derive(Clone)]
pub struct ReadModels {
    pool: Pool,
    live: Arc<RwLock<HashMap<String, Live>>>,
    progress: Arc<Notify>,
    /// How often a waiting read looks at the positions again: notifications usually wake it
    /// first; on a standby, which gets none, this is how it learns of progress.
    poll: Duration,
    /// When the positions were last read: waiting reads share a refresh made less than `poll`
    /// ago instead of each making its own.
    refreshed_at: Arc<std::sync::Mutex<Option<Instant>>>,
}

/// The outcome of waiting for read models: where they are, and whether they reached the
/// position asked for.
#[derive(Debug, Clone)]
pub struct Consistent {
    pub models: Vec<(String, Live)>,
    pub reached: bool,
    pub required: i64,
    /// Read models that hold back the caller's space since a dead letter at this position
    /// (see the projector's quarantine): they have not applied the space's later events.
    pub quarantined: Vec<(String, i64)>,
    /// The head of the log when checked (0 when not checked).
    pub head: i64,
}

impl Consistent {
    pub fn schema(&self, name: &str) -> String {
        self.models
            .iter()
            .find(|(model, _)| model == name)
            .map(|(model, live)| live.schema(model))
            .unwrap_or_else(|| schema_name(name, 1))
    }

    /// The lowest position among the models read, for the caller's space: the
    /// `Projection-Position` of a response. A model quarantined for the space counts as being
    /// just before its dead letter.
    pub fn position(&self) -> i64 {
        self.models.iter().map(|(name, live)| self.effective(name, live.position)).min().unwrap_or(0)
    }

    fn effective(&self, name: &str, position: i64) -> i64 {
        match self.quarantined.iter().find(|(model, _)| model == name) {
            Some((_, dead_at)) => position.min(dead_at - 1),
            None => position,
        }
    }

    /// Whether every model read has applied the caller's space up to `required`.
    pub fn has_reached(&self, required: i64) -> bool {
        self.models.iter().all(|(name, live)| self.effective(name, live.position) >= required)
    }
}

impl ReadModels {
    /// Starts following projection progress: notifications, plus a refresh every 500 ms.
    pub fn start(pool: Pool, database_url: String) -> Self {
        Self::follow(pool, Some(database_url), Duration::from_millis(50))
    }

    /// Starts following projection progress on a hot standby, where `LISTEN` is refused and
    /// notifications never arrive: a refresh every 500 ms, and waiting reads look again every
    /// 5 ms.
    pub fn start_on_standby(pool: Pool) -> Self {
        Self::follow(pool, None, Duration::from_millis(5))
    }

    fn follow(pool: Pool, listen_url: Option<String>, poll: Duration) -> Self {
        let models =
            Self { pool, live: Arc::default(), progress: Arc::new(Notify::new()), poll, refreshed_at: Arc::default() };
        let follower = models.clone();
        tokio::spawn(async move {
            // Without notifications, a channel nobody sends on (its sender kept open, so it
            // never ends): the select below then only ticks.
            let (_silent, mut notifications) = match listen_url {
                Some(url) => (None, crate::db::listen(url, PROGRESS_CHANNEL)),
                None => {
                    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
                    (Some(sender), receiver)
                }
            };
            let mut ticker = tokio::time::interval(Duration::from_millis(500));
            loop {
                tokio::select! {
                    payload = notifications.recv() => match payload {
                        Some(payload) => follower.apply_notification(&payload),
                        None => return,
                    },
                    _ = ticker.tick() => {
                        if let Err(error) = follower.refresh().await {
                            tracing::warn!(error = %error, "could not refresh read model positions");
                        }
                    }
                }
            }
        });
        models
    }

    fn apply_notification(&self, payload: &str) {
        if let Ok(mut live) = self.live.write() {
            for (name, version, position) in progress_entries(payload) {
                if let Some(current) = live.get_mut(name)
                    && current.version == version
                    && current.position < position
                {
                    current.position = position;
                }
            }
        }
        self.progress.notify_waiters();
    }

    /// Reloads live versions and positions from the database.
    pub(crate) async fn refresh(&self) -> Result<(), ApiError> {
        if let Ok(mut at) = self.refreshed_at.lock() {
            *at = Some(Instant::now());
        }
        let client = self.pool.get().await?;
        let statement =
            client.prepare_cached("SELECT name, version, position FROM projections WHERE status = 'live'").await?;
        let rows = client.query(&statement, &[]).await?;
        let fresh: HashMap<String, Live> = rows
            .into_iter()
            .map(|row| (row.get::<_, String>(0), Live { version: row.get(1), position: row.get(2) }))
            .collect();
        if let Ok(mut live) = self.live.write() {
            *live = fresh;
        }
        Ok(())
    }

    /// Reloads the positions unless a refresh began less than a poll interval ago (another
    /// waiting read's, or the follower's): many reads waiting at once then cost one query per
    /// interval, not one each.
    async fn refresh_unless_recent(&self) -> Result<(), ApiError> {
        let recent = self.refreshed_at.lock().map(|at| at.is_some_and(|at| at.elapsed() < self.poll)).unwrap_or(false);
        if recent { Ok(()) } else { self.refresh().await }
    }

    /// The live versions of `names` as last seen (loading them if never seen), with no
    /// claim about how far they have projected.
    pub async fn current(&self, names: &[&str]) -> Result<Consistent, ApiError> {
        if self.cached(names).is_none() {
            self.refresh().await?;
        }
        let models = self
            .cached(names)
            .ok_or_else(|| ApiError::unavailable("the read models are not built yet; retry shortly"))?;
        Ok(Consistent { models, reached: false, required: 0, quarantined: Vec::new(), head: 0 })
    }

    /// Records live versions and positions observed by a check query.
    pub fn observe(&self, observed: &[(String, Live)]) {
        if let Ok(mut live) = self.live.write() {
            for (name, model) in observed {
                let entry = live.entry(name.clone()).or_insert(*model);
                if entry.version != model.version || entry.position < model.position {
                    *entry = *model;
                }
            }
        }
    }

    fn cached(&self, names: &[&str]) -> Option<Vec<(String, Live)>> {
        let live = self.live.read().ok()?;
        names.iter().map(|name| live.get(*name).map(|model| ((*name).to_owned(), *model))).collect()
    }

    /// The live versions of `names`, waiting (bounded by `max_wait`, woken by progress
    /// notifications) until each has projected at least `required`.
    pub async fn wait_for(&self, names: &[&str], required: i64, max_wait: Duration) -> Result<Consistent, ApiError> {
        let deadline = Instant::now() + max_wait;
        let mut refreshed = false;
        loop {
            let notified = self.progress.notified();
            if let Some(models) = self.cached(names) {
                if models.iter().all(|(_, live)| live.position >= required) {
                    return Ok(Consistent { models, reached: true, required, quarantined: Vec::new(), head: 0 });
                }
                if Instant::now() >= deadline {
                    return Ok(Consistent { models, reached: false, required, quarantined: Vec::new(), head: 0 });
                }
            } else if !refreshed {
                self.refresh().await?;
                refreshed = true;
                continue;
            } else if Instant::now() >= deadline {
                return Err(ApiError::unavailable("the read models are not built yet; retry shortly"));
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            let _ = tokio::time::timeout(remaining.min(self.poll), notified).await;
            self.refresh_unless_recent().await?;
            refreshed = true;
        }
    }
}

/// The columns of the check that runs first in a consistent read: the calling key's last
/// write, where the live versions of the read models are, and, per model, the position of the
/// first open dead letter that holds back the caller's space (`$3`) or events without a space
/// (null when none), and the head of the log.
macro_rules! check_columns {
    () => {
        "COALESCE((SELECT position FROM key_positions WHERE key_id = $1), 0),
        COALESCE(array_agg(p.name), '{}'::text[]), COALESCE(array_agg(p.version), '{}'::integer[]),
        COALESCE(array_agg(p.position), '{}'::bigint[]),
        COALESCE(array_agg((SELECT min(d.position) FROM projection_dead_letters d
                            WHERE d.name = p.name AND d.version = p.version AND d.resolved_at IS NULL
                              AND d.space_key IN ($3, ''))), '{}'::bigint[]),
        (SELECT position FROM log_head)"
    };
}

/// The rows the check aggregates: the live versions of the read models named in `$2`.
macro_rules! check_from {
    () => {
        " FROM projections p WHERE p.status = 'live' AND p.name = ANY($2)"
    };
}

/// The check on its own (parameters: key id, read model names, space id). One row, always.
pub const CHECK_SQL: &str = concat!("SELECT ", check_columns!(), check_from!());

/// The number of columns of the check; a read folded into it ([`check_with`]) starts here.
pub const CHECK_WIDTH: usize = 6;

/// The check and a read in one statement (one snapshot, one round trip): `read_columns` are
/// scalar expressions (subqueries) evaluated once, after the check's columns. They may use
/// `$3` (the space id) and parameters from `$4` on. One row, always.
pub fn check_with(read_columns: &str) -> String {
    [concat!("SELECT ", check_columns!(), ", "), read_columns, check_from!()].concat()
}

/// What the row of `CHECK_SQL` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub key_position: i64,
    /// The head of the log: no write has a position beyond it.
    pub head: i64,
    pub models: Vec<(String, Live)>,
    pub quarantined: Vec<(String, i64)>,
}

/// Decodes the row of `CHECK_SQL`.
pub fn decode_check(row: &tokio_postgres::Row) -> Check {
    let names: Vec<String> = row.get(1);
    let versions: Vec<i32> = row.get(2);
    let positions: Vec<i64> = row.get(3);
    let dead: Vec<Option<i64>> = row.get(4);
    let quarantined =
        names.iter().zip(&dead).filter_map(|(name, dead)| dead.map(|position| (name.clone(), position))).collect();
    let models = names
        .into_iter()
        .zip(versions)
        .zip(positions)
        .map(|((name, version), position)| (name, Live { version, position }))
        .collect();
    Check { key_position: row.get(0), models, quarantined, head: row.get(5) }
}

#[cfg(test)]
mod tests {
    use super::progress_entries;

    #[test]
    fn a_notification_announces_one_read_model_or_several() {
        assert_eq!(progress_entries("records:2:41").collect::<Vec<_>>(), [("records", 2, 41)]);
        assert_eq!(
            progress_entries("catalog:1:41,emails:1:41,webhooks:3:40").collect::<Vec<_>>(),
            [("catalog", 1, 41), ("emails", 1, 41), ("webhooks", 3, 40)]
        );
        // Entries that do not read as one are left out; the others still count.
        assert_eq!(
            progress_entries("records:x:41,segments:1:41:9,,emails:1:42").collect::<Vec<_>>(),
            [("emails", 1, 42)]
        );
    }
}
