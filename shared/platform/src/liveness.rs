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
//! "Older" is measured twice: by the wall, and by the database's available time, a clock in
//! the table `beat_clock` that each beat advances by the time since the last beat of any
//! process, at most [`CLOCK_STEP`]. While the database is away nobody can beat, so the clock
//! stands still: a process that was beating when the database went is not presumed dead the
//! moment it is back (by the wall, every process would be after a failover of over
//! [`DEAD_AFTER`]), but once the others have beaten for the bound without it. A process that
//! died during the outage is presumed dead at most [`DEAD_AFTER`] after the database is back.
//!
//! A process that knows the slot it fills (its role, host and fixed port, or `APP__INSTANCE`:
//! [`slot`], [`Beat::fills`]) deletes, in its next beat, the rows of the processes that filled
//! that slot before. A row that is missing means dead, so what a killed process held is taken
//! over as soon as its replacement beats, not after [`DEAD_AFTER`].
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
/// The most one beat advances the database's available time: the time since the last beat
/// of any process counts only up to this much. Beats come every [`BEAT_INTERVAL`] from each
/// process, so a longer gap means nobody could beat (the database was away); counting a
/// little of it leaves a live process [`DEAD_AFTER`] less this to beat again after an outage.
pub const CLOCK_STEP: Duration = Duration::from_millis(1_500);

/// This process's id, once it beats.
static PROCESS: std::sync::OnceLock<Uuid> = std::sync::OnceLock::new();
/// The slot this process fills, once it is known ([`Beat::fills`]).
static SLOT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
/// Wakes the beats when the slot becomes known, so that the earlier processes' rows go at once.
static SLOT_KNOWN: tokio::sync::Notify = tokio::sync::Notify::const_new();
/// Whether a beat has deleted the rows of the slot's earlier processes: done once, so that two
/// live processes given one slot by mistake do not keep deleting each other's rows.
static SLOT_TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The slot of a process of `role` that listens on `port`, asked for as `configured_port`:
/// `configured` (`APP__INSTANCE`) if set; else `role@host:port` when the port was fixed (a
/// port picked at random names no slot a replacement would fill) and the host has a name.
pub fn slot(configured: Option<&str>, role: &str, configured_port: u16, port: u16) -> Option<String> {
    if let Some(configured) = configured.map(str::trim).filter(|name| !name.is_empty()) {
        return Some(configured.to_owned());
    }
    if configured_port == 0 {
        return None;
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let host = host.trim();
    (!host.is_empty()).then(|| format!("{role}@{host}:{port}"))
}

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
    is_dead("owner", dead_after)
}

/// [`owner_is_dead`] for the process named by `column`.
pub fn is_dead(column: &str, dead_after: &str) -> String {
    format!("({column} IS NOT NULL AND {column} NOT IN ({}))", live(dead_after))
}

/// A SQL subquery of the ids of the processes presumed alive: those whose beat is younger
/// than the statement's parameter `dead_after` (seconds) by the wall or by the database's
/// available time (the clock of the module's doc).
fn live(dead_after: &str) -> String {
    format!(
        "SELECT b.process_id FROM process_beats b
         WHERE b.beat_at >= now() - make_interval(secs => {dead_after})
            OR b.available_at > (SELECT c.available FROM beat_clock c) - {dead_after}"
    )
}

/// This process's share of a worker's rows: the live processes that run the worker, in the
/// order of their ids, each take the rows whose key hashes to their place ([`Share::holds`]).
/// Rows shared out this way need no claim of their own (no write per row): what makes the
/// work happen once is the write it leads to (an append at a stream's version), and the share
/// only keeps processes from deciding the same rows. While the members change (a process
/// starts, or one dies and is noticed after [`DEAD_AFTER`]), two processes may briefly hold
/// the same row; the second to write loses its version and writes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    /// This process's place among the members, from 0.
    pub index: i32,
    /// How many members there are (1: this process holds every row).
    pub of: i32,
}

impl Share {
    /// Every row: a process that does not beat (a CLI, a test calling a worker directly).
    pub const ALL: Share = Share { index: 0, of: 1 };

    /// A SQL condition, true for the rows whose text `key` falls to the share given by the
    /// statement's parameters `index` and `of` (`"$5"`, `"$6"`, both `int4`).
    pub fn holds(key: &str, index: &str, of: &str) -> String {
        format!("({of}::int4 = 1 OR (hashtext({key}) & 2147483647) % {of}::int4 = {index}::int4)")
    }

    /// Registers this process as a member of `worker` and reads its share: itself and the
    /// members whose beat is fresh. [`Share::ALL`] in a process that does not beat.
    pub async fn read(
        client: &impl deadpool_postgres::GenericClient,
        worker: &str,
    ) -> Result<Share, tokio_postgres::Error> {
        let Some(me) = process_id() else { return Ok(Share::ALL) };
        let dead_after = DEAD_AFTER.as_secs_f64();
        let sql = format!(
            "WITH joined AS (INSERT INTO worker_members (worker, process_id) VALUES ($1, $2) ON CONFLICT DO NOTHING),
                  members AS (SELECT m.process_id FROM worker_members m
                              WHERE m.worker = $1 AND m.process_id IN ({}) UNION SELECT $2::uuid)
             SELECT count(*) FILTER (WHERE process_id < $2)::int4, count(*)::int4 FROM members",
            live("$3")
        );
        let row = client.query_one(&sql, &[&worker, &me, &dead_after]).await?;
        Ok(Share { index: row.get(0), of: row.get(1) })
    }
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

    /// Names the slot this process fills ([`slot`]), once it holds what makes the slot its
    /// own (its listener: a process still alive in the slot would hold the port). The next
    /// beat, at once, deletes the rows of the processes that filled the slot before, so what
    /// they held is taken over now. A process fills the first slot it names.
    pub fn fills(&self, slot: Option<String>) {
        if let Some(slot) = slot
            && SLOT.set(slot).is_ok()
        {
            SLOT_KNOWN.notify_waiters();
        }
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
            "WITH earlier AS (DELETE FROM process_beats WHERE $5 AND instance = $4 AND process_id <> $1),
                  tick AS (
                 UPDATE beat_clock SET
                     available = available + least(greatest(extract(epoch FROM now() - ticked_at)::float8, 0), $3),
                     ticked_at = greatest(ticked_at, now())
                 RETURNING available)
             INSERT INTO process_beats (process_id, role, available_at, instance)
             VALUES ($1, $2, (SELECT available FROM tick), $4)
             ON CONFLICT (process_id) DO UPDATE
             SET beat_at = now(), available_at = EXCLUDED.available_at, instance = EXCLUDED.instance",
        )
        .await;
    let step = CLOCK_STEP.as_secs_f64();
    let result = async {
        let statement = statement?;
        loop {
            // Taken before the beat reads the slot: a slot filled from then on (during the beat,
            // or while it waits) wakes the wait below, so the slot is recorded at once, not a
            // beat later (a process killed within that second would not be taken over).
            let known = SLOT_KNOWN.notified();
            let slot = SLOT.get();
            let take = slot.is_some() && !SLOT_TAKEN.load(std::sync::atomic::Ordering::Acquire);
            // A beat that hangs is a lost connection: start again on a new one.
            tokio::time::timeout(DEAD_AFTER, client.execute(&statement, &[&id, &role, &step, &slot, &take])).await??;
            if take {
                SLOT_TAKEN.store(true, std::sync::atomic::Ordering::Release);
                tracing::info!(
                    slot = slot.map(String::as_str),
                    "took this process's slot over from its earlier processes"
                );
            }
            tokio::select! {
                () = tokio::time::sleep(BEAT_INTERVAL) => {}
                () = known, if slot.is_none() => {}
            }
        }
    }
    .await;
    driver.abort();
    result
}
