//! Poison events: one event a read model cannot apply must not stop it for every space.
//!
//! A batch is applied inside a savepoint. If it fails for a reason that is not transient, it
//! is applied again event by event, each in a savepoint of its own; an event that fails is
//! recorded as a **dead letter** (read model, version, position, space, error) and its space
//! is **quarantined** in that version: from then on the version holds back the space's later
//! events (they stay in the log, unapplied) and goes on with every other space. Events that
//! only remove data (a record's deletion) are applied even in a quarantined space, so erasure
//! never waits for an operator. Holding the space's later events (instead of skipping only the
//! poison) keeps each record's history in order: nothing is applied on top of a missing event.
//! The events of a record's deletion (requested, blocked, completed) are always applied: they
//! remove data or report on its removal, and applying them again on a retry changes nothing.
//!
//! Readers see it: a read in a quarantined space carries `stale_read` and reports the
//! position before the dead letter as its `Projection-Position` (see
//! `platform::readmodel::CHECK_SQL`), and a write made after it is not reported as reached, so
//! read-your-writes is never claimed for data that was not applied.
//!
//! After a fix, an operator retries (`projector dead-letters retry <name>`): under the
//! projection's lease, the quarantined space's events from the dead letter up to the
//! checkpoint are read from the log and applied in order by the same rule; what still fails
//! is dead-lettered again. A rebuild applies the same rule from position 0, so it reaches the
//! same dead letters and the same rows.
//!
//! A failure of every event of a batch in several spaces is not a poison event but a systemic
//! fault (a missing table, a broken deployment): the batch is rolled back and retried, and
//! the projection halts loudly instead of quarantining everyone.
//!
//! # Poison events: dead letters and per-space quarantine
//!
//! One event that a read model cannot apply (a defect in a projection, or an event that should
//! never have been accepted) must not stop that read model for every space. The projector
//! (`projector/src/read_models/quarantine.rs`) applies each batch inside a savepoint. When the batch fails
//! for a reason that is not transient (the SQLSTATE class says so; a decode error is never
//! transient), it rolls back to the savepoint and applies the batch event by event, each in a
//! savepoint of its own. An event that fails is recorded in `projection_dead_letters` (read
//! model, version, position, space, event type, error) and its **space is quarantined** in that
//! version: from then on the version holds back the space's later events (they stay in the log,
//! unapplied) and goes on with every other space; the checkpoint advances as usual. Holding the
//! space's later events, not only the poison, keeps each record's history in order: nothing is
//! applied on top of a missing event, as a Kafka consumer stops one partition, not the topic.
//!
//! - **Erasure still holds.** The events of a record's deletion (requested, blocked, completed)
//!   are applied even in a quarantined space: they only remove data or report on its removal. The
//!   eraser counts a version as having passed a deletion only if its checkpoint is past it *and*
//!   the deletion event itself is not a dead letter (otherwise the deletion becomes `blocked`,
//!   naming the dead letter).
//! - **Read-your-writes still holds.** The consistency check (`platform::readmodel::CHECK_SQL`)
//!   also returns, per read model, the first open dead letter of the caller's space (or of
//!   events without a space). A quarantined model counts as being just before its dead letter:
//!   `Projection-Position` says so, a write after it is never reported as reached, the read
//!   answers at once (waiting cannot help) with a `stale_read` warning that names the position.
//!   Other spaces' reads are unaffected.
//! - **Loud.** Each dead letter is logged at error when recorded and again every maintenance
//!   pass (each minute) while open; `projector dead-letters list` shows them.
//! - **Retry after a fix.** `projector dead-letters retry <name> [--space <id>]` takes the
//!   projection's checkpoint rows `FOR UPDATE` (the lease: the projector waits meanwhile), marks
//!   the space's dead letters resolved, reads the space's events from the first dead letter up
//!   to the checkpoint from the log and applies them in order by the same rule. What fails again
//!   is reopened, with the rest of the space still held. Deletion events applied early are
//!   applied again, which changes nothing.
//! - **Deterministic.** A rebuild applies the same rule from position 0, so it reaches the same
//!   dead letters in its new version and the same rows for every other space (tested).
//! - **Systemic failures are not poison.** If every event of a batch fails and the failures span
//!   three or more spaces, the batch is rolled back and retried instead (a missing table or a
//!   broken deployment must halt loudly, not quarantine everyone). Transient failures
//!   (connection, serialization, resources) always fail the whole batch, which is retried.

use std::collections::BTreeMap;

use anyhow::Context;
use deadpool_postgres::Transaction;
use platform::log::StoredEvent;

use super::ReadModel;

/// Event types that only remove data or report on its removal; they are applied even in a
/// quarantined space, so erasure never waits for an operator.
pub(crate) const ALWAYS_APPLIED: &[&str] =
    &["RecordDeletionRequested.v1", "RecordDeletionBlocked.v1", "RecordDeletionCompleted.v1"];

/// How many spaces must fail, with no event of the batch applied, for the failure to count as
/// systemic rather than as poison events.
const SYSTEMIC_SPACES: usize = 3;

/// The quarantine key of an event: its space, or `""` for events that belong to none.
pub fn space_key(event: &StoredEvent) -> &str {
    event.space_id.as_deref().unwrap_or("")
}

/// The quarantined spaces of one read-model version: space key → position of its first open
/// dead letter.
#[derive(Debug, Clone, Default)]
pub struct Quarantine {
    held_after: BTreeMap<String, i64>,
}

impl Quarantine {
    /// The open quarantines of a version.
    pub async fn load(transaction: &Transaction<'_>, name: &str, version: i32) -> anyhow::Result<Self> {
        let statement = transaction
            .prepare_cached(
                "SELECT space_key, min(position) FROM projection_dead_letters
                 WHERE name = $1 AND version = $2 AND resolved_at IS NULL GROUP BY space_key",
            )
            .await?;
        let rows = transaction.query(&statement, &[&name, &version]).await?;
        Ok(Self { held_after: rows.into_iter().map(|row| (row.get(0), row.get(1))).collect() })
    }

    /// Whether `event` is applied now, rather than held back for its quarantined space.
    pub fn admits(&self, event: &StoredEvent) -> bool {
        match self.held_after.get(space_key(event)) {
            Some(first_dead) => event.position <= *first_dead || ALWAYS_APPLIED.contains(&event.event_type.as_str()),
            None => true,
        }
    }

    fn hold(&mut self, space_key: &str, position: i64) {
        let entry = self.held_after.entry(space_key.to_owned()).or_insert(position);
        *entry = (*entry).min(position);
    }

    /// Lifts the quarantine of one space (for a retry).
    pub fn release(&mut self, space_key: &str) {
        self.held_after.remove(space_key);
    }

    pub fn is_empty(&self) -> bool {
        self.held_after.is_empty()
    }
}

/// An event a read model could not apply.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub position: i64,
    pub space_key: String,
    pub event_type: String,
    pub error: String,
}

/// Applies `events` (in order, contiguous) to version `version` of `projection`, holding back
/// events of quarantined spaces and dead-lettering events that cannot be applied. Runs inside
/// the batch transaction that also advances the checkpoint.
pub async fn apply(
    transaction: &Transaction<'_>,
    model: &dyn ReadModel,
    version: i32,
    schema: &str,
    events: Vec<StoredEvent>,
    quarantine: &mut Quarantine,
) -> anyhow::Result<Vec<DeadLetter>> {
    let admitted: Vec<StoredEvent> = events.into_iter().filter(|event| quarantine.admits(event)).collect();
    if admitted.is_empty() {
        return Ok(Vec::new());
    }
    open(transaction, model, "batch").await?;
    let whole = match model.apply(transaction, schema, &admitted).await {
        Ok(()) => {
            release(transaction, model, "batch").await?;
            return Ok(Vec::new());
        }
        // The database, not the event: the batch is retried as a whole, nothing dead-lettered.
        Err(error) if platform::db::is_transient(&error) => return Err(error),
        Err(error) => error,
    };
    transaction.batch_execute("ROLLBACK TO SAVEPOINT batch").await?;
    tracing::warn!(
        projection = model.name(),
        version,
        error = format!("{whole:#}"),
        "a batch failed; applying its events one at a time to find the poison"
    );
    let mut dead = Vec::new();
    let mut applied = 0_usize;
    for event in admitted {
        if !quarantine.admits(&event) {
            continue;
        }
        open(transaction, model, "event").await?;
        match model.apply(transaction, schema, std::slice::from_ref(&event)).await {
            Ok(()) => {
                release(transaction, model, "event").await?;
                applied += 1;
            }
            Err(error) if platform::db::is_transient(&error) => return Err(error),
            Err(error) => {
                transaction.batch_execute("ROLLBACK TO SAVEPOINT event").await?;
                let space_key = space_key(&event).to_owned();
                quarantine.hold(&space_key, event.position);
                dead.push(DeadLetter {
                    position: event.position,
                    space_key,
                    event_type: event.event_type.clone(),
                    error: platform::storable::escaped(&format!("{error:#}")),
                });
            }
        }
    }
    let spaces: std::collections::BTreeSet<&str> = dead.iter().map(|letter| letter.space_key.as_str()).collect();
    if applied == 0 && spaces.len() >= SYSTEMIC_SPACES {
        anyhow::bail!(
            "every event of the batch failed, in {} spaces: a systemic failure, not a poison event; retrying: {whole:#}",
            spaces.len()
        );
    }
    record(transaction, model, version, &dead).await?;
    Ok(dead)
}

/// Opens the savepoint `name` around a batch (or one event) of `model`. A keyed read model's
/// batch runs with `db::KEYED_PLANS`, sent in the savepoint's message; [`release`] sets them
/// back in its own, and rolling back to the savepoint undoes them. So the statements the
/// transaction runs after the batch, which every read model shares (its checkpoint, another
/// version's read of its span), never get their plans under them. Neither costs a round trip.
async fn open(transaction: &Transaction<'_>, model: &dyn ReadModel, name: &str) -> Result<(), tokio_postgres::Error> {
    let keyed = if model.keyed() { platform::db::KEYED_PLANS } else { "" };
    transaction.batch_execute(&format!("SAVEPOINT {name}; {keyed}")).await
}

/// Releases the savepoint [`open`] made, with the session's plan settings back.
async fn release(
    transaction: &Transaction<'_>,
    model: &dyn ReadModel,
    name: &str,
) -> Result<(), tokio_postgres::Error> {
    let unkeyed = if model.keyed() { platform::db::UNKEYED_PLANS } else { "" };
    transaction.batch_execute(&format!("RELEASE SAVEPOINT {name}; {unkeyed}")).await
}

/// Records dead letters (a retried one that fails again is reopened with its new error).
async fn record(
    transaction: &Transaction<'_>,
    model: &dyn ReadModel,
    version: i32,
    dead: &[DeadLetter],
) -> anyhow::Result<()> {
    for letter in dead {
        tracing::error!(
            projection = model.name(),
            version,
            position = letter.position,
            space = %letter.space_key,
            event_type = %letter.event_type,
            error = %letter.error,
            "dead letter: the read model cannot apply this event; the space's later events are held until an \
             operator retries (projector dead-letters retry)"
        );
        transaction
            .execute(
                "INSERT INTO projection_dead_letters (name, version, position, space_key, event_type, error)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (name, version, position) DO UPDATE
                 SET error = EXCLUDED.error, failed_at = now(), resolved_at = NULL",
                &[&model.name(), &version, &letter.position, &letter.space_key, &letter.event_type, &letter.error],
            )
            .await
            .context("recording a dead letter")?;
    }
    Ok(())
}

/// Records an event a side-effect worker (not a read model: version 0) cannot handle; the
/// worker passes over it. A retry of the same position reopens the row.
pub(crate) async fn record_worker_dead_letter(
    transaction: &Transaction<'_>,
    worker: &str,
    event: &StoredEvent,
    error: &anyhow::Error,
) -> anyhow::Result<()> {
    let error = platform::storable::escaped(&format!("{error:#}"));
    tracing::error!(worker, position = event.position, event_type = %event.event_type, %error,
        "dead letter: the worker cannot handle this event and passes over it");
    transaction
        .execute(
            "INSERT INTO projection_dead_letters (name, version, position, space_key, event_type, error)
             VALUES ($1, 0, $2, $3, $4, $5)
             ON CONFLICT (name, version, position) DO UPDATE SET error = EXCLUDED.error, failed_at = now(),
                 resolved_at = NULL",
            &[&worker, &event.position, &space_key(event), &event.event_type, &error],
        )
        .await
        .context("recording a dead letter")?;
    Ok(())
}

/// An open dead letter, as an operator lists it.
#[derive(Debug, Clone)]
pub(crate) struct OpenDeadLetter {
    pub name: String,
    pub version: i32,
    pub position: i64,
    pub space_key: String,
    pub event_type: String,
    pub error: String,
    pub failed_at: chrono::DateTime<chrono::Utc>,
    pub retries: i32,
}

/// Every open dead letter of live and building read-model versions and of side-effect
/// workers (version 0).
pub(crate) async fn list_open(client: &impl deadpool_postgres::GenericClient) -> anyhow::Result<Vec<OpenDeadLetter>> {
    let rows = client
        .query(
            "SELECT d.name, d.version, d.position, d.space_key, d.event_type, d.error, d.failed_at, d.retries
             FROM projection_dead_letters d
             LEFT JOIN projections p ON p.name = d.name AND p.version = d.version
             WHERE d.resolved_at IS NULL AND (d.version = 0 OR p.status IN ('live', 'building'))
             ORDER BY d.name, d.version, d.position",
            &[],
        )
        .await?;
    Ok(rows
        .into_iter()
        .map(|row| OpenDeadLetter {
            name: row.get(0),
            version: row.get(1),
            position: row.get(2),
            space_key: row.get(3),
            event_type: row.get(4),
            error: row.get(5),
            failed_at: row.get(6),
            retries: row.get(7),
        })
        .collect())
}

/// What a retry did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetryReport {
    /// Quarantined spaces retried.
    pub spaces: usize,
    /// Held events read again from the log and offered to the read model.
    pub events: usize,
    /// Dead letters still open afterwards (they failed again).
    pub still_dead: usize,
}

/// Retries the quarantined spaces of every active version of `projection` (only `space`
/// when given): under the projection's lease, each space's events from its first dead letter
/// up to the checkpoint are applied again in order; what fails again stays dead.
pub async fn retry(
    pool: &deadpool_postgres::Pool,
    model: &dyn ReadModel,
    space: Option<&str>,
) -> anyhow::Result<RetryReport> {
    let mut client = pool.get().await?;
    let transaction = client.transaction().await?;
    // Waits for a batch in flight, then holds the lease for the whole retry.
    let versions = transaction
        .query(
            "SELECT version, position FROM projections WHERE name = $1 AND status IN ('live', 'building')
             ORDER BY version FOR UPDATE",
            &[&model.name()],
        )
        .await?;
    let mut report = RetryReport::default();
    for row in versions {
        let (version, checkpoint): (i32, i64) = (row.get(0), row.get(1));
        let schema = platform::readmodel::schema_name(model.name(), version);
        let mut quarantine = Quarantine::load(&transaction, model.name(), version).await?;
        let spaces: Vec<(String, i64)> = quarantine
            .held_after
            .iter()
            .filter(|(key, _)| space.is_none_or(|space| space == key.as_str()))
            .map(|(key, position)| (key.clone(), *position))
            .collect();
        for (space_key, first_dead) in spaces {
            report.spaces += 1;
            transaction
                .execute(
                    "UPDATE projection_dead_letters SET resolved_at = now(), retries = retries + 1
                     WHERE name = $1 AND version = $2 AND space_key = $3 AND resolved_at IS NULL",
                    &[&model.name(), &version, &space_key],
                )
                .await?;
            quarantine.release(&space_key);
            let mut after = first_dead - 1;
            loop {
                let events = held_events(&transaction, &space_key, after, checkpoint).await?;
                let Some(last) = events.last() else { break };
                after = last.position;
                // Deletion events of the space were applied already; applying them again
                // changes nothing.
                report.events += events.len();
                apply(&transaction, model, version, &schema, events, &mut quarantine).await?;
                if quarantine.held_after.contains_key(&space_key) {
                    // It failed again: the rest of the space stays held.
                    break;
                }
            }
        }
        report.still_dead += transaction
            .query_one(
                "SELECT count(*) FROM projection_dead_letters WHERE name = $1 AND version = $2 AND resolved_at IS NULL",
                &[&model.name(), &version],
            )
            .await?
            .get::<_, i64>(0) as usize;
    }
    transaction.commit().await?;
    Ok(report)
}

/// A page of the space's events after `after`, up to `through`, in position order.
async fn held_events(
    transaction: &Transaction<'_>,
    space_key: &str,
    after: i64,
    through: i64,
) -> anyhow::Result<Vec<StoredEvent>> {
    let statement = transaction
        .prepare_cached(&format!(
            "SELECT {} FROM events WHERE position > $1 AND position <= $2 AND COALESCE(space_id, '') = $3
             ORDER BY position LIMIT 2000",
            platform::log::EVENT_COLUMNS
        ))
        .await?;
    let rows = transaction.query(&statement, &[&after, &through, &space_key]).await?;
    Ok(rows.iter().map(StoredEvent::from_row).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(position: i64, space: &str, event_type: &str) -> StoredEvent {
        StoredEvent {
            position,
            event_id: uuid::Uuid::now_v7(),
            stream_id: "s".into(),
            stream_version: position,
            event_type: event_type.into(),
            payload: Vec::new(),
            space_id: Some(space.to_owned()).filter(|space| !space.is_empty()),
            actor_key_id: None,
            subject_id: None,
            occurred_at: chrono::Utc::now(),
            recorded_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn a_quarantined_space_holds_its_later_events_but_not_erasure_or_other_spaces() {
        let mut quarantine = Quarantine::default();
        quarantine.hold("spc_a", 10);
        assert!(quarantine.admits(&event(9, "spc_a", "RecordCreated.v1")));
        assert!(quarantine.admits(&event(10, "spc_a", "RecordCreated.v1")), "the dead letter itself, on retry");
        assert!(!quarantine.admits(&event(11, "spc_a", "RecordUpdated.v1")));
        assert!(quarantine.admits(&event(12, "spc_a", "RecordDeletionRequested.v1")), "erasure never waits");
        assert!(quarantine.admits(&event(13, "spc_b", "RecordCreated.v1")));
        assert!(quarantine.admits(&event(14, "", "UserAuthored.v1")));
        quarantine.hold("spc_a", 7);
        assert!(!quarantine.admits(&event(9, "spc_a", "RecordCreated.v1")), "the earliest dead letter counts");
        quarantine.release("spc_a");
        assert!(quarantine.is_empty());
        assert!(quarantine.admits(&event(11, "spc_a", "RecordUpdated.v1")));
    }
}
