//! The append batcher: one task per process groups concurrent commands into one transaction
//! (bounded by commands and by bytes), writes it in one of three ways (the set form, pipelined,
//! a savepoint per command), and notifies followers after the commit.

use deadpool_postgres::Pool;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::append::{AppendError, AppendRequest, Appended, ExpectedVersion};
use super::commit::{BatchOutcome, Fallback, PendingRow, finish_batch, pending_rows, unavailable};
use super::set_form::{SetBatch, write_set};

/// The channel notified (after commit, once per batch) with the new head position.
pub const LOG_CHANNEL: &str = "log_appended";

struct Job {
    request: AppendRequest,
    reply: oneshot::Sender<Result<Appended, AppendError>>,
}

/// Handle to this process's append batcher.
#[derive(Clone)]
pub struct EventLog {
    jobs: mpsc::Sender<Job>,
}

impl EventLog {
    /// Starts the batcher task. `batch_max` bounds the commands grouped in one transaction,
    /// and [`BATCH_BYTES`] their events' bytes.
    pub fn start(pool: Pool, batch_max: usize) -> Self {
        Self::start_bounded(pool, batch_max, BATCH_BYTES)
    }

    /// A service process's batcher, with both bounds given (`APP__APPEND__*`), on a connection
    /// of its own ([`crate::db::log_pool`]; `generic_plans` as the process's pool): its
    /// transactions are the largest messages the process sends (a wave of 1,500 released emails
    /// is a bind of about a megabyte), and tokio-postgres keeps each connection's buffers at the
    /// largest it has sent. Sharing the process's pool, every one of its connections came to hold
    /// them in turn: the run engine grew by about 40 MB over a release of 50,000 held emails.
    pub fn start_own(
        database_url: &str,
        generic_plans: bool,
        (batch_max, batch_bytes): (usize, usize),
    ) -> anyhow::Result<Self> {
        Ok(Self::start_bounded(crate::db::log_pool(database_url, generic_plans)?, batch_max, batch_bytes))
    }

    /// Starts the batcher task with both bounds given (`APP__APPEND__*`) on `pool`.
    pub fn start_bounded(pool: Pool, batch_max: usize, batch_bytes: usize) -> Self {
        let (jobs, receiver) = mpsc::channel(batch_max.max(1) * 4);
        tokio::spawn(run_batcher(pool, receiver, batch_max.max(1), batch_bytes.max(1)));
        Self { jobs }
    }

    #[tracing::instrument(skip_all, fields(streams = request.streams.len()))]
    pub async fn append(&self, request: AppendRequest) -> Result<Appended, AppendError> {
        let (reply, outcome) = oneshot::channel();
        self.jobs
            .send(Job { request, reply })
            .await
            .map_err(|_| AppendError::Unavailable("the append batcher has stopped".to_owned()))?;
        outcome.await.map_err(|_| AppendError::OutcomeUnknown("the append batcher stopped mid-append".to_owned()))?
    }
}

/// The most event bytes one transaction writes (unless one command alone writes more). The
/// log's head row stays locked from the events' insert until the commit is flushed, and every
/// other process's append waits for it: a batch of 500 rendered emails (several megabytes)
/// held it for tens of milliseconds, which a live request beside a broadcast waited out.
pub const BATCH_BYTES: usize = 256 * 1024;

async fn run_batcher(pool: Pool, mut receiver: mpsc::Receiver<Job>, batch_max: usize, batch_bytes: usize) {
    let mut jobs = Vec::with_capacity(batch_max);
    while receiver.recv_many(&mut jobs, batch_max).await > 0 {
        for batch in by_bytes(std::mem::take(&mut jobs), batch_bytes) {
            append_batch(&pool, batch).await;
        }
    }
}

/// Splits `jobs`, in order, into batches of at most `bytes` of events each (a command larger
/// than that is a batch of its own).
fn by_bytes(jobs: Vec<Job>, bytes: usize) -> Vec<Vec<Job>> {
    if jobs.len() <= 1 {
        // A lone command (most live requests) is a batch whatever its size: nothing to measure.
        return if jobs.is_empty() { Vec::new() } else { vec![jobs] };
    }
    let mut batches: Vec<Vec<Job>> = Vec::new();
    let mut filled = 0;
    for job in jobs {
        let size = job.request.event_bytes();
        match batches.last_mut() {
            Some(batch) if filled + size <= bytes => batch.push(job),
            _ => {
                batches.push(vec![job]);
                filled = 0;
            }
        }
        filled += size;
    }
    batches
}

async fn append_batch(pool: &Pool, jobs: Vec<Job>) {
    let started = std::time::Instant::now();
    metrics::histogram!("append_batch_commands").record(jobs.len() as f64);
    let mut requests = Vec::with_capacity(jobs.len());
    let mut replies = Vec::with_capacity(jobs.len());
    for job in jobs {
        requests.push(job.request);
        replies.push(job.reply);
    }
    let outcomes = match write_batch(pool, &requests).await {
        Ok((outcomes, head)) => {
            if head > 0 {
                notify_appended(pool, head).await;
            }
            outcomes
        }
        Err(error) => requests.iter().map(|_| Err(error.clone())).collect(),
    };
    metrics::histogram!("append_batch_seconds").record(started.elapsed().as_secs_f64());
    for (reply, outcome) in replies.into_iter().zip(outcomes) {
        if let Err(error) = &outcome {
            let kind = match error {
                AppendError::WrongVersion { .. } | AppendError::Conflict { .. } => "refused",
                AppendError::Refused(_) | AppendError::Failed(_) => "failed",
                AppendError::Unavailable(_) | AppendError::OutcomeUnknown(_) => "unavailable",
            };
            metrics::counter!("append_failures_total", "kind" => kind).increment(1);
        }
        let _ = reply.send(outcome);
    }
}

/// Notifies followers after the commit, once per batch (never inside the append transaction).
async fn notify_appended(pool: &Pool, head: i64) {
    let Ok(client) = pool.get().await else { return };
    let payload = head.to_string();
    let notified = async {
        let statement = client.prepare_cached("SELECT pg_notify($1, $2)").await?;
        client.execute(&statement, &[&LOG_CHANNEL, &payload]).await
    };
    if let Err(error) = notified.await {
        tracing::warn!(%error, "could not notify followers; they fall back to polling");
    }
}

/// Writes a batch. The fast path writes the whole batch with one statement per table (see
/// [`SetBatch`]) when every command allows it, and otherwise sends every command's statements
/// at once (pipelined); neither uses savepoints. If any command is refused (lost race, guard
/// conflict) the transaction is rolled back and the batch is written again with a savepoint
/// per command, so only the refused commands fail.
async fn write_batch(pool: &Pool, requests: &[AppendRequest]) -> Result<BatchOutcome, AppendError> {
    let mut connection = Unended(Some(pool.get().await.map_err(|error| AppendError::Unavailable(error.to_string()))?));
    let client = connection.client();
    let first_try = match SetBatch::of(requests) {
        Some(batch) => write_set(client, requests, batch).await,
        None => write_pipelined(client, requests).await,
    };
    let written = match first_try {
        Ok(outcome) => Ok(outcome),
        Err(Fallback::Isolate) => write_isolated(client, requests).await,
        Err(Fallback::Fail(error)) => Err(error),
    };
    if written.is_ok() {
        connection.ended();
    }
    written
}

/// A connection carrying a batch: unless the write ended (its transaction committed, or rolled
/// back with the batch's outcome known), it is closed rather than pooled. A write opens its
/// transaction with its first statements (`db::BEGIN_KEYED`, no round trip of its own) and
/// ends it itself, so a write stopped on the way (a failure, a panic) could otherwise leave
/// the next user of the connection inside it.
struct Unended(Option<deadpool_postgres::Client>);

impl Unended {
    fn client(&mut self) -> &mut deadpool_postgres::Client {
        self.0.as_mut().expect("the connection is held until the write ends")
    }

    /// Returns the connection to its pool.
    fn ended(&mut self) {
        self.0 = None;
    }
}

impl Drop for Unended {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

async fn write_pipelined(
    client: &mut deadpool_postgres::Client,
    requests: &[AppendRequest],
) -> Result<BatchOutcome, Fallback> {
    let client: &deadpool_postgres::Client = client;
    // The BEGIN and the plan settings (`db::BEGIN_KEYED`) go out first, pipelined with the
    // statements (polled first, sent first).
    let (begun, staged) = tokio::join!(
        client.batch_execute(crate::db::BEGIN_KEYED),
        futures_util::future::join_all(
            requests.iter().enumerate().map(|(index, request)| stage_request(client, request, index))
        )
    );
    begun.map_err(|error| Fallback::Fail(unavailable(error)))?;
    let mut rows_per_request = Vec::with_capacity(requests.len());
    for outcome in staged {
        match outcome {
            Ok(rows) => rows_per_request.push(rows),
            Err(_) => {
                client.batch_execute("ROLLBACK").await.map_err(|error| Fallback::Fail(unavailable(error)))?;
                return Err(Fallback::Isolate);
            }
        }
    }
    let outcomes = rows_per_request.iter().map(|_| Some(Ok(()))).collect();
    finish_batch(client, requests, outcomes, rows_per_request).await.map_err(Fallback::Fail)
}

async fn write_isolated(
    client: &mut deadpool_postgres::Client,
    requests: &[AppendRequest],
) -> Result<BatchOutcome, AppendError> {
    let client: &deadpool_postgres::Client = client;
    client.batch_execute(crate::db::BEGIN_KEYED).await.map_err(unavailable)?;
    let mut outcomes: Vec<Option<Result<(), AppendError>>> = Vec::with_capacity(requests.len());
    let mut rows_per_request: Vec<Vec<PendingRow>> = Vec::with_capacity(requests.len());
    for (index, request) in requests.iter().enumerate() {
        client.batch_execute("SAVEPOINT command").await.map_err(unavailable)?;
        match stage_request(client, request, index).await {
            Ok(rows) => {
                client.batch_execute("RELEASE SAVEPOINT command").await.map_err(unavailable)?;
                rows_per_request.push(rows);
                outcomes.push(Some(Ok(())));
            }
            Err(Staging::Refused(error)) => {
                client.batch_execute("ROLLBACK TO SAVEPOINT command").await.map_err(unavailable)?;
                rows_per_request.push(Vec::new());
                outcomes.push(Some(Err(error)));
            }
            Err(Staging::Failed(error)) => return Err(unavailable(error)),
        }
    }
    finish_batch(client, requests, outcomes, rows_per_request).await
}

enum Staging {
    /// The command is refused (lost race, guard conflict); the batch goes on.
    Refused(AppendError),
    /// The transaction is unusable; the whole batch fails.
    Failed(tokio_postgres::Error),
}

impl From<tokio_postgres::Error> for Staging {
    /// A transient failure makes the transaction unusable for everyone in the batch; any other
    /// failure is this command's own (a refused value, a defect) and fails only it (its
    /// savepoint is rolled back).
    fn from(error: tokio_postgres::Error) -> Self {
        match crate::db::classify(&error) {
            crate::db::Failure::Transient => Self::Failed(error),
            crate::db::Failure::Refused => Self::Refused(AppendError::Refused(error.to_string())),
            crate::db::Failure::Defect => Self::Refused(AppendError::Failed(super::append::described(&error))),
        }
    }
}

fn is_unique_violation(error: &tokio_postgres::Error) -> bool {
    error.code() == Some(&SqlState::UNIQUE_VIOLATION)
}

async fn stage_request(
    client: &deadpool_postgres::Client,
    request: &AppendRequest,
    metadata_index: usize,
) -> Result<Vec<PendingRow>, Staging> {
    let mut rows = Vec::new();
    for stream in &request.streams {
        let count = stream.events.len() as i64;
        if count == 0 {
            continue;
        }
        let wrong_version = || Staging::Refused(AppendError::WrongVersion { stream_id: stream.stream_id.clone() });
        let first_version = match stream.expected {
            ExpectedVersion::NoStream => {
                let statement =
                    client.prepare_cached("INSERT INTO streams (stream_id, version) VALUES ($1, $2)").await?;
                match client.execute(&statement, &[&stream.stream_id, &count]).await {
                    Ok(_) => 1,
                    Err(error) if is_unique_violation(&error) => return Err(wrong_version()),
                    Err(error) => return Err(error.into()),
                }
            }
            ExpectedVersion::Exactly(version) => {
                let statement = client
                    .prepare_cached("UPDATE streams SET version = $3 WHERE stream_id = $1 AND version = $2")
                    .await?;
                let updated = client.execute(&statement, &[&stream.stream_id, &version, &(version + count)]).await?;
                if updated != 1 {
                    return Err(wrong_version());
                }
                version + 1
            }
            ExpectedVersion::Any => {
                let statement = client
                    .prepare_cached(
                        "INSERT INTO streams (stream_id, version) VALUES ($1, $2)
                         ON CONFLICT (stream_id) DO UPDATE SET version = streams.version + EXCLUDED.version
                         RETURNING version",
                    )
                    .await?;
                let row = client.query_one(&statement, &[&stream.stream_id, &count]).await?;
                row.get::<_, i64>(0) - count + 1
            }
        };
        rows.extend(pending_rows(stream, first_version, metadata_index));
    }
    for guard in &request.guards {
        let params: Vec<&(dyn ToSql + Sync)> = guard.params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect();
        let statement = client.prepare_cached(guard.sql).await?;
        match client.execute(&statement, &params).await {
            Ok(rows) if guard.expect_rows.is_some_and(|expected| expected != rows) => {
                return Err(Staging::Refused(guard.conflict.clone()));
            }
            Ok(_) => {}
            Err(error) if is_unique_violation(&error) => return Err(Staging::Refused(guard.conflict.clone())),
            Err(error) => return Err(error.into()),
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_batch_holds_at_most_its_bytes_of_events_in_order_and_a_large_command_goes_alone() {
        use super::Job;
        use crate::log::{AppendRequest, ExpectedVersion, Metadata, StreamAppend};
        let job = |bytes: usize| {
            let created = crate::proto::RecordCreated { record_id: "x".repeat(bytes), ..Default::default() };
            let stream = StreamAppend::one(
                format!("s{bytes}"),
                ExpectedVersion::Any,
                crate::events::LogEvent::RecordCreated(created),
                0,
            );
            let (reply, _) = tokio::sync::oneshot::channel();
            Job { request: AppendRequest::new(Metadata::default(), vec![stream], Vec::new()), reply }
        };
        let shape = |batches: Vec<Vec<Job>>| -> Vec<Vec<String>> {
            batches
                .iter()
                .map(|batch| batch.iter().map(|job| job.request.streams[0].stream_id.clone()).collect())
                .collect()
        };
        // 102 bytes each (a tag, a length and the id): nine fit in 1,000.
        let small: Vec<Job> = (0..10).map(|_| job(100)).collect();
        assert_eq!(super::by_bytes(small, 1000).iter().map(Vec::len).collect::<Vec<_>>(), vec![9, 1]);
        let mixed = vec![job(10), job(5000), job(11), job(12)];
        assert_eq!(
            shape(super::by_bytes(mixed, 1000)),
            vec![vec!["s10".to_owned()], vec!["s5000".to_owned()], vec!["s11".to_owned(), "s12".to_owned()]]
        );
        assert!(super::by_bytes(Vec::new(), 1000).is_empty());
    }

    /// A command of one stream `s{index}` whose one event takes `id_bytes + 2` bytes (a tag, a
    /// length and the id, below 128 bytes), or more above.
    fn job(index: usize, id_bytes: usize) -> super::Job {
        use crate::log::{AppendRequest, ExpectedVersion, Metadata, StreamAppend};
        let created = crate::proto::RecordCreated { record_id: "x".repeat(id_bytes), ..Default::default() };
        let event = crate::events::LogEvent::RecordCreated(created);
        let stream = StreamAppend::one(format!("s{index}"), ExpectedVersion::Any, event, 0);
        let (reply, _) = tokio::sync::oneshot::channel();
        super::Job { request: AppendRequest::new(Metadata::default(), vec![stream], Vec::new()), reply }
    }

    /// A command that appends no event (its guards alone).
    fn eventless(index: usize) -> super::Job {
        use crate::log::{AppendRequest, ExpectedVersion, Metadata, StreamAppend};
        let stream =
            StreamAppend { stream_id: format!("s{index}"), expected: ExpectedVersion::Any, events: Vec::new() };
        let (reply, _) = tokio::sync::oneshot::channel();
        super::Job { request: AppendRequest::new(Metadata::default(), vec![stream], Vec::new()), reply }
    }

    fn names(batches: &[Vec<super::Job>]) -> Vec<Vec<String>> {
        batches.iter().map(|batch| batch.iter().map(|job| job.request.streams[0].stream_id.clone()).collect()).collect()
    }

    #[test]
    fn a_batch_never_exceeds_its_byte_limit_unless_one_job_does_and_no_job_is_lost_or_reordered() {
        // Sizes from a fixed linear congruential sequence, small and large mixed.
        let mut seed: u64 = 7;
        let mut next = || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) as usize
        };
        for limit in [1, 50, 300, 1000, 4096] {
            let sizes: Vec<usize> =
                (0..200).map(|_| if next() % 10 == 0 { next() % 3000 } else { next() % 120 }).collect();
            let jobs: Vec<super::Job> = sizes.iter().enumerate().map(|(index, size)| job(index, *size)).collect();
            let bytes: Vec<usize> = jobs.iter().map(|job| job.request.event_bytes()).collect();
            let batches = super::by_bytes(jobs, limit);
            let order: Vec<String> = names(&batches).into_iter().flatten().collect();
            assert_eq!(order, (0..sizes.len()).map(|index| format!("s{index}")).collect::<Vec<_>>(), "limit {limit}");
            let mut at = 0;
            for (number, batch) in batches.iter().enumerate() {
                assert!(!batch.is_empty(), "limit {limit}: an empty batch");
                let filled: usize = bytes[at..at + batch.len()].iter().sum();
                assert!(filled <= limit || batch.len() == 1, "limit {limit}: batch {number} holds {filled} bytes");
                at += batch.len();
                // A batch closes only when the next job would not fit: none is smaller than it must be.
                if at < bytes.len() {
                    assert!(filled + bytes[at] > limit, "limit {limit}: batch {number} closed with room for the next");
                }
            }
        }
    }

    #[test]
    fn a_batch_is_filled_up_to_exactly_its_byte_limit() {
        // 50 bytes each.
        let batches = super::by_bytes(vec![job(0, 48), job(1, 48), job(2, 48)], 100);
        assert_eq!(names(&batches), vec![vec!["s0".to_owned(), "s1".to_owned()], vec!["s2".to_owned()]]);
        let batches = super::by_bytes(vec![job(0, 48), job(1, 48), job(2, 48)], 99);
        assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), vec![1, 1, 1]);
    }

    #[test]
    fn a_lone_command_is_a_batch_whatever_its_size_and_commands_without_events_weigh_nothing() {
        assert_eq!(names(&super::by_bytes(vec![job(0, 5000)], 10)), vec![vec!["s0".to_owned()]]);
        let batches = super::by_bytes((0..5).map(eventless).collect(), 1);
        assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), vec![5]);
        // A command without events joins a full batch; one with events after it does not.
        let batches = super::by_bytes(vec![job(0, 98), eventless(1), job(2, 1)], 100);
        assert_eq!(names(&batches), vec![vec!["s0".to_owned(), "s1".to_owned()], vec!["s2".to_owned()]]);
    }
}
