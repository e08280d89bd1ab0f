//! Which server processes are alive, by heartbeat rows in `process_beats`.
//!
//! A process starts a [`Beat`]: a task that, on a connection of its own (so a busy pool never
//! delays it), writes the process's row and refreshes it every [`BEAT_INTERVAL`]. Work the
//! process claims in the database names its [`Beat::id`]; another process presumes the
//! claimant dead once its row is missing or older than [`DEAD_AFTER`] (see
//! [`owner_is_dead`]). Being presumed dead while alive (a stall longer than the bound) must
//! be safe for whoever relies on this: the idempotency claims do, because a taken-over
//! claim's completion guard no longer matches and its append fails.
//!
//! The row is left behind when the process stops; the maintenance worker deletes rows that
//! have not beaten for a day.

use std::time::Duration;

use uuid::Uuid;

/// How often a live process refreshes its row.
pub(crate) const BEAT_INTERVAL: Duration = Duration::from_secs(1);
/// A process whose row is older than this (or missing) is presumed dead. Five missed beats:
/// long enough for a short stall, short enough that a retry after a crash waits seconds, not
/// a minute (the work a dead process held is taken over within this bound and a worker's
/// poll).
pub const DEAD_AFTER: Duration = Duration::from_secs(5);

/// This process's id, once it beats.
static PROCESS: std::sync::OnceLock<Uuid> = std::sync::OnceLock::new();

/// The id of this process's [`Beat`], which the rows it claims name as their owner; `None`
/// in a process that does not beat (a CLI, a test calling functions directly), whose rows
/// then name no owner and are never presumed dead by [`owner_is_dead`] (they wait out their
/// lease or grace instead).
pub fn process_id() -> Option<Uuid> {
    PROCESS.get().copied()
}

/// A SQL condition, true when the process named by the column `owner` is presumed dead;
/// `dead_after` is the statement's parameter holding [`DEAD_AFTER`] in seconds (`"$3"`). A
/// NULL owner (a claim from before owners were recorded) is never presumed dead by this test.
/// The live processes are read once per statement (a hashed subplan), however many rows it
/// tests.
pub fn owner_is_dead(dead_after: &str) -> String {
    format!(
        "(owner IS NOT NULL AND owner NOT IN (SELECT b.process_id FROM process_beats b
            WHERE b.beat_at >= now() - make_interval(secs => {dead_after})))"
    )
}

/// This process's heartbeat. Dropping it stops the beats (the row then ages into dead).
#[derive(Debug)]
pub struct Beat {
    id: Uuid,
    task: tokio::task::JoinHandle<()>,
}

impl Beat {
    /// Starts beating as a process of `role` (`command-service`, ...). Needs a Tokio runtime.
    /// Every beat a process starts beats for the one process id ([`process_id`]).
    pub fn start(database_url: String, role: &'static str) -> Self {
        let id = *PROCESS.get_or_init(Uuid::now_v7);
        let task = tokio::spawn(async move {
            loop {
                if let Err(error) = beat_on_one_connection(&database_url, id, role).await {
                    tracing::warn!(error = format!("{error:#}"), "heartbeat connection lost; reconnecting");
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        Self { id, task }
    }

    /// The id that this process's claims name.
    pub fn id(&self) -> Uuid {
        self.id
    }
}

impl Drop for Beat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn beat_on_one_connection(database_url: &str, id: Uuid, role: &str) -> anyhow::Result<()> {
    let (client, connection) = crate::db::connect(database_url).await?;
    let driver = tokio::spawn(connection);
    let statement = client
        .prepare(
            "INSERT INTO process_beats (process_id, role) VALUES ($1, $2)
             ON CONFLICT (process_id) DO UPDATE SET beat_at = now()",
        )
        .await;
    let result = async {
        let statement = statement?;
        loop {
            // A beat that hangs is a lost connection: start again on a new one.
            tokio::time::timeout(DEAD_AFTER, client.execute(&statement, &[&id, &role])).await??;
            tokio::time::sleep(BEAT_INTERVAL).await;
        }
    }
    .await;
    driver.abort();
    result
}
