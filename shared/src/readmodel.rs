//! Which version of each read model is live, how far it has projected, and waiting until it
//! reaches a caller's last write (read-your-writes).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio::sync::Notify;

use crate::error::ApiError;

/// The channel the projector notifies after each committed batch: `name:version:position`.
pub const PROGRESS_CHANNEL: &str = "projection_progress";

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
}

/// The outcome of waiting for read models: where they are, and whether they reached the
/// position asked for.
#[derive(Debug, Clone)]
pub struct Consistent {
    pub models: Vec<(String, Live)>,
    pub reached: bool,
    pub required: i64,
}

impl Consistent {
    pub fn schema(&self, name: &str) -> String {
        self.models
            .iter()
            .find(|(model, _)| model == name)
            .map(|(model, live)| live.schema(model))
            .unwrap_or_else(|| schema_name(name, 1))
    }

    /// The lowest position among the models read: the `Projection-Position` of a response.
    pub fn position(&self) -> i64 {
        self.models.iter().map(|(_, live)| live.position).min().unwrap_or(0)
    }
}

impl ReadModels {
    /// Starts following projection progress: notifications, plus a refresh every 500 ms.
    pub fn start(pool: Pool, database_url: String) -> Self {
        let models = Self { pool, live: Arc::default(), progress: Arc::new(Notify::new()) };
        let follower = models.clone();
        tokio::spawn(async move {
            let mut notifications = crate::db::listen(database_url, PROGRESS_CHANNEL);
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
        let mut parts = payload.split(':');
        let (Some(name), Some(version), Some(position)) = (parts.next(), parts.next(), parts.next()) else {
            return;
        };
        let (Ok(version), Ok(position)) = (version.parse::<i32>(), position.parse::<i64>()) else { return };
        if let Ok(mut live) = self.live.write()
            && let Some(current) = live.get_mut(name)
            && current.version == version
            && current.position < position
        {
            current.position = position;
        }
        self.progress.notify_waiters();
    }

    /// Reloads live versions and positions from the database.
    pub async fn refresh(&self) -> Result<(), ApiError> {
        let client = self.pool.get().await?;
        let rows = client.query("SELECT name, version, position FROM projections WHERE status = 'live'", &[]).await?;
        let fresh: HashMap<String, Live> = rows
            .into_iter()
            .map(|row| (row.get::<_, String>(0), Live { version: row.get(1), position: row.get(2) }))
            .collect();
        if let Ok(mut live) = self.live.write() {
            *live = fresh;
        }
        Ok(())
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
                    return Ok(Consistent { models, reached: true, required });
                }
                if Instant::now() >= deadline {
                    return Ok(Consistent { models, reached: false, required });
                }
            } else if !refreshed {
                self.refresh().await?;
                refreshed = true;
                continue;
            } else if Instant::now() >= deadline {
                return Err(ApiError::unavailable("the read models are not built yet; retry shortly"));
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            let _ = tokio::time::timeout(remaining.min(Duration::from_millis(50)), notified).await;
            self.refresh().await?;
            refreshed = true;
        }
    }
}
