//! Imports past their time (`APP__IMPORTS__*`): one never completed that received nothing (its
//! create, or a part) for `receiving_expiry_seconds`, and one completed `retention_seconds`
//! ago, are dropped with their parts and row results (the keys of failed rows with them), as
//! `DELETE /imports/{id}` drops one. The records their rows wrote stay.
//!
//! The worker sweeps at most every minute (more often when a setting is shorter), under its
//! lock, so no part of a dropped import is being decided; a sweep drops at most
//! [`PER_SWEEP`] imports.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use platform::settings::ImportSettings;

/// Imports one sweep drops at most (a completed import may hold a million row results).
const PER_SWEEP: i64 = 20;

/// The imports due to be dropped at `$1` (received nothing since) and `$2` (completed
/// before), oldest first, among those of spaces `$3` and ids `$4` (all when empty), at most
/// `$5`: space, import id and whether it was still receiving.
const DUE: &str = "SELECT i.space_id, i.import_id, i.parts_total IS NULL
     FROM imports i LEFT JOIN LATERAL (
         SELECT max(received_at_ms) AS received, max(done_at_ms) AS done, bool_or(body IS NOT NULL) AS waiting
         FROM import_parts p WHERE p.space_id = i.space_id AND p.import_id = i.import_id) p ON true
     WHERE (cardinality($3::text[]) = 0 OR (i.space_id, i.import_id) IN (SELECT * FROM unnest($3::text[], $4::text[])))
     AND ((i.parts_total IS NULL AND greatest(i.created_at_ms, p.received) < $1)
          OR (i.parts_total IS NOT NULL AND NOT coalesce(p.waiting, false) AND greatest(i.closed_at_ms, p.done) < $2))
     ORDER BY i.created_at_ms, i.import_id LIMIT $5";

pub(super) struct Expiry {
    settings: ImportSettings,
    next: Mutex<Option<Instant>>,
}

impl Expiry {
    pub(super) fn new(settings: ImportSettings) -> Self {
        Self { settings, next: Mutex::new(None) }
    }

    /// How often a process sweeps: a quarter of the shorter setting, between 1 s and a minute.
    fn every(&self) -> Duration {
        let shorter = self.settings.receiving_expiry_seconds.min(self.settings.retention_seconds);
        Duration::from_secs((shorter / 4).clamp(1, 60))
    }

    /// Whether this process's sweep is due, and if so, when the one after it is.
    fn due(&self) -> bool {
        let Ok(mut next) = self.next.lock() else { return false };
        let now = Instant::now();
        if next.is_some_and(|at| at > now) {
            return false;
        }
        *next = Some(now + self.every());
        true
    }

    /// Drops the imports past their time, when a sweep is due and the worker's lock is free.
    pub(super) async fn sweep(&self, pool: &Pool, now_ms: i64) -> anyhow::Result<()> {
        if !self.due() {
            return Ok(());
        }
        let millis = |seconds: u64| i64::try_from(seconds.saturating_mul(1000)).unwrap_or(i64::MAX);
        let receiving_before = now_ms.saturating_sub(millis(self.settings.receiving_expiry_seconds));
        let completed_before = now_ms.saturating_sub(millis(self.settings.retention_seconds));
        let mut client = pool.get().await?;
        let transaction = client.transaction().await?;
        if !transaction.query_one("SELECT pg_try_advisory_xact_lock($1)", &[&super::LOCK]).await?.get::<_, bool>(0) {
            return Ok(());
        }
        let none: Vec<String> = Vec::new();
        let candidates = transaction
            .query(
                &format!("{DUE} FOR UPDATE OF i SKIP LOCKED"),
                &[&receiving_before, &completed_before, &none, &none, &PER_SWEEP],
            )
            .await?;
        if candidates.is_empty() {
            return Ok(());
        }
        // Locked, so no part lands and no complete closes them: asked again, they are still due.
        let (spaces, ids): (Vec<String>, Vec<String>) =
            candidates.iter().map(|row| (row.get::<_, String>(0), row.get::<_, String>(1))).unzip();
        let due = transaction.query(DUE, &[&receiving_before, &completed_before, &spaces, &ids, &PER_SWEEP]).await?;
        let (spaces, ids): (Vec<String>, Vec<String>) =
            due.iter().map(|row| (row.get::<_, String>(0), row.get::<_, String>(1))).unzip();
        for table in ["import_rows", "import_parts", "imports"] {
            transaction
                .execute(
                    &format!(
                        "DELETE FROM {table} WHERE (space_id, import_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))"
                    ),
                    &[&spaces, &ids],
                )
                .await?;
        }
        transaction.commit().await?;
        for row in &due {
            let (space_id, import_id, receiving) =
                (row.get::<_, &str>(0), row.get::<_, &str>(1), row.get::<_, bool>(2));
            let why = if receiving { "never completed" } else { "past its retention" };
            tracing::info!(space = %space_id, import = %import_id, why, "import dropped");
        }
        Ok(())
    }
}
