//! What every read shares: authorising it, reading consistently with the caller's last write
//! (read-your-writes), an offset page of documents, and the answer with its position and warnings.
//!
//! # Life of a read
//!
//! `GET /v1/schemas/contacts/records/{id}`: the handler (`records/http.rs`) authorises (`read`)
//! and calls `consistency::consistent_row` with the read models it needs and the read's
//! columns. The check (`platform::readmodel::CHECK_SQL`: the key's last write, the live versions
//! and positions, the space's open dead letters, the log head) and the read (the schema's type
//! and the record's document, as subqueries) are **one statement** (`check_with`), so one
//! snapshot answers both; a page of records joins the check laterally with its rows
//! (`consistent_rows`), and the events list and an event's status are one statement each too
//! (the check, the schema by id or slug, and the page or the event). A record's document (or a
//! page of them) goes out as PostgreSQL sent its text (`platform::db::RawJson`, written into the
//! envelope by `consistency::respond_raw`), never parsed on the way. Other reads use
//! `consistent_read`: the check and the read's own statements pipelined on one connection.
//! When the read models have reached the caller's write the answer is sent at once, with
//! `Projection-Position`; otherwise the read gives its connection back, waits (bounded, woken
//! by `projection_progress`) and reads again, or answers with a `stale_read` warning. A waiting
//! read holds no connection, so reads waiting after a burst of writes cannot starve the pool. A
//! `Consistency-Token` beyond the head of the log (no write returned it) is answered with
//! `stale_read` as soon as the caller's own last write is read, never before.
//!
//! **Reads on a hot standby.** With `APP__DATABASE__READ_URL` set, the query service reads from
//! a physical streaming replica of the database (PostgreSQL's own replication; the read models,
//! their checkpoints in `projections` and the log replicate in the same WAL, so a standby's read
//! model never shows data beyond its checkpoint). Three things stay on the primary: rate-limit
//! reservations (the only writes a GET makes); the caller's last write (`key_positions`) and the
//! head of the log, read once per request before the check (`consistency::Anchor`; the anchors
//! of concurrent reads are read in one statement by `consistency::Anchors`, each read asking
//! before the statement that answers it starts), because the
//! standby's copies may lag, and deciding on them would skip the wait for a write the caller has
//! just made, or take a token the standby has not replayed yet for one beyond the log. The check
//! and the read then run on the standby and wait, within the same bound, until its read models
//! reach that position, answering `stale_read` past the bound as on the primary. A key the
//! standby's catalog does not know is looked up on the primary before it is refused
//! (`Authenticator::on_standby`), so a key works as soon as it is created, as without a
//! standby; a revoked key may work on a lagging standby for as long as its lag (beside the
//! authenticator's one-second cache). A standby
//! refuses `LISTEN` and gets no notifications, so there `ReadModels::start_on_standby` follows
//! positions by polling: a refresh every 500 ms, and a waiting read looks again every 5 ms.
//! Projection batches commit asynchronously and reach a standby when the primary flushes their
//! WAL, so a primary with standbys runs `wal_writer_delay = 10ms` (docs/operations.md). Each
//! read therefore costs the primary one indexed lookup (plus a share of a reservation); the
//! check, the read and any waiting run on the standby. scripts/test starts a cluster with a
//! standby after the suite and runs the read-your-writes, consistency and pagination tests a
//! second time with every query service on it (`TEST_QUERY_ON_REPLICA`), and `tests/tests/api/replica.rs`
//! pauses replay to show a read waits for the standby, a token carries across keys there and a
//! key created meanwhile authenticates.
//!
//! The query and command services' pools run generic plans (`platform::db::generic_plan_pool`):
//! their statements are keyed lookups and inserts from arrays, which PostgreSQL otherwise
//! re-planned on every execution, at more cost than executing them. Every pool runs without JIT
//! compilation (`jit=off`): PostgreSQL compiles a statement whose estimated cost passes a
//! threshold, and a misestimated read of the log was compiled on every call, at a hundred times
//! the cost of the read. Pools default to twice the
//! machine's cores (at least 4): more connections at work than cores only move the queue from
//! the pool into the kernel's scheduler.

use platform::error::Code;
use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use api::auth::{Caller, Permission};
use api::pagination::Warning;
use deadpool_postgres::Client;
use platform::error::ApiError;
use platform::readmodel::{CHECK_SQL, Check, Consistent, check_with, decode_check};
use serde_json::Value;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::State;

/// The header a writer may pass to read its write with another key.
pub(crate) const CONSISTENCY_TOKEN: &str = "consistency-token";

/// What a read does once it knows which versions of the read models to read.
pub(crate) type ReadFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ApiError>> + 'a>>;

/// Authorises a read (permission `read`) and parses the optional `Consistency-Token`.
pub(crate) async fn authorize_read(state: &State, req: &HttpRequest) -> Result<(Caller, i64), ApiError> {
    let caller = state.authenticator.authorize(req, Permission::Read).await?;
    let token = consistency_token(req)?;
    Ok((caller, token))
}

/// Parses the optional `Consistency-Token` header.
pub fn consistency_token(req: &HttpRequest) -> Result<i64, ApiError> {
    let token = match req.headers().get(CONSISTENCY_TOKEN) {
        None => 0,
        Some(value) => value.to_str().ok().and_then(|text| text.trim().parse::<i64>().ok()).ok_or_else(|| {
            ApiError::of(Code::InvalidConsistencyToken, "Consistency-Token must be a log position (an integer)")
        })?,
    };
    Ok(token)
}

/// One attempt of a consistent read against the read-model versions guessed (shared with
/// it): the decoded consistency check (of the same snapshot as the read, or an older one)
/// and the read's result.
type Attempt<'c, T> = Pin<Box<dyn Future<Output = Result<(Check, Result<T, ApiError>), ApiError>> + 'c>>;

/// The read-your-writes loop every consistent read runs: `attempt` against the versions
/// guessed, on a connection of its own that it gives back before any wait (waiting readers
/// would starve the pool, their own refreshes included); once the check says the read models
/// have reached the caller's write (or can reach no further, or the bound has passed), the
/// attempt's result is the answer; otherwise it waits, woken by progress notifications, and
/// tries again. A read that failed is answered only if its check settles: one against
/// versions that have just been retired is tried again.
async fn until_consistent<'c, T, A>(
    state: &State,
    caller: &Caller,
    token: i64,
    models: &[&str],
    attempt: A,
) -> Result<(T, Consistent), ApiError>
where
    A: Fn(std::sync::Arc<Consistent>) -> Attempt<'c, T>,
{
    let deadline = Instant::now() + state.settings.consistency_wait();
    let anchor = Anchor::read(state, caller).await?;
    // Shared with each attempt, not copied: a read is one attempt, and a copy of the
    // versions per read cost more than the rest of its bookkeeping.
    let mut guess = std::sync::Arc::new(state.read_models.current(models).await?);
    loop {
        let (check, result) = attempt(guess.clone()).await?;
        match settle(state, models, token, anchor, &guess, check, deadline) {
            Settled::Answer(consistent) => return Ok((result?, consistent)),
            Settled::Wait(attainable) => {
                let remaining = deadline.saturating_duration_since(Instant::now());
                guess = std::sync::Arc::new(state.read_models.wait_for(models, attainable, remaining).await?);
            }
        }
    }
}

/// Reads consistently with the caller's last write, in one round trip when the read models
/// are up to date: the check (the key's last position, the live versions and positions) is
/// sent first and `read` right after it on the same connection, so the read's snapshot is at
/// least as new as the check's. If the read models are behind, waits (bounded, woken by
/// progress notifications) and reads again; past the bound, answers with what it has and
/// `reached: false`.
pub(crate) async fn consistent_read<T, F>(
    state: &State,
    caller: &Caller,
    token: i64,
    models: &[&str],
    read: F,
) -> Result<(T, Consistent), ApiError>
where
    F: for<'a> Fn(&'a Client, &'a Consistent) -> ReadFuture<'a, T>,
{
    let names: Vec<&str> = models.to_vec();
    let (key_id, space_id) = (caller.key_id(), caller.space_id());
    let (read, names) = (&read, &names);
    until_consistent(state, caller, token, models, |guess| {
        Box::pin(async move {
            let client = state.pool.get().await?;
            let check = client.prepare_cached(CHECK_SQL).await?;
            let check_params: [&(dyn ToSql + Sync); 3] = [&key_id, names, &space_id];
            let (checked, result) = tokio::join!(client.query_one(&check, &check_params), read(&client, &guess));
            Ok((decode_check(&checked?), result))
        })
    })
    .await
}

/// Reads consistently with the caller's last write in one statement: the check and the read
/// folded together ([`check_with`]), so one snapshot answers both. `columns` gives the read's
/// scalar expressions for the read model versions guessed; they may use `$3` (the caller's
/// space) and `params` as `$4`, `$5`, …. The read's values start at column [`CHECK_WIDTH`].
pub(crate) async fn consistent_row<F>(
    state: &State,
    caller: &Caller,
    token: i64,
    models: &[&str],
    columns: F,
    params: &[&(dyn ToSql + Sync)],
) -> Result<(Row, Consistent), ApiError>
where
    F: Fn(&Consistent) -> String,
{
    let sql = |models: &Consistent| check_with(&columns(models));
    let (mut rows, consistent) = consistent_rows(state, caller, token, models, sql, params).await?;
    let row = rows.pop().ok_or_else(|| ApiError::unavailable("the consistency check returned no row"))?;
    Ok((row, consistent))
}

/// As [`consistent_row`] for a statement of several rows, each starting with the check's
/// columns (for example [`check_with`] joined laterally with a page of rows). `sql` builds the
/// whole statement; it must return at least one row.
pub(crate) async fn consistent_rows<F>(
    state: &State,
    caller: &Caller,
    token: i64,
    models: &[&str],
    sql: F,
    params: &[&(dyn ToSql + Sync)],
) -> Result<(Vec<Row>, Consistent), ApiError>
where
    F: Fn(&Consistent) -> String,
{
    let names: Vec<&str> = models.to_vec();
    let (key_id, space_id) = (caller.key_id(), caller.space_id());
    let (sql, names) = (&sql, &names);
    until_consistent(state, caller, token, models, |guess| {
        Box::pin(async move {
            let client = state.pool.get().await?;
            let statement = client.prepare_cached(&sql(&guess)).await?;
            let mut all_params: Vec<&(dyn ToSql + Sync)> = vec![&key_id, names, &space_id];
            all_params.extend_from_slice(params);
            let rows = client.query(&statement, &all_params).await?;
            let first = rows.first().ok_or_else(|| ApiError::unavailable("the consistency check returned no row"))?;
            Ok((decode_check(first), Ok(rows)))
        })
    })
    .await
}

/// What a read on a standby must know as of the request, from the primary: the caller's last
/// write and the head of the log. The standby's own copies of both may be behind, and a read
/// deciding on them would miss the caller's write (or take a token it has not yet replayed for
/// one beyond the log). Reads on the primary itself need none (zeros: the check's own values
/// stand).
#[derive(Debug, Clone, Copy, Default)]
struct Anchor {
    key_position: i64,
    head: i64,
}

impl Anchor {
    async fn read(state: &State, caller: &Caller) -> Result<Self, ApiError> {
        match &state.anchors {
            None => Ok(Self::default()),
            Some(anchors) => anchors.read(caller.key_id()).await,
        }
    }
}

/// The anchors of concurrent reads, read from the primary together (`platform::batch`): the
/// reads that ask while one statement runs are answered by the next. Each read asks before the
/// statement that answers it starts, so its anchor is at least as new as the read; only the
/// round trips are shared, which takes most of a standby read's cost off the primary.
#[derive(Clone)]
pub struct Anchors {
    batcher: platform::batch::Batcher<String, Anchor>,
}

/// Anchors read in one statement at most.
const ANCHORS_PER_STATEMENT: usize = 512;

impl Anchors {
    pub fn start(primary: deadpool_postgres::Pool) -> Self {
        let batcher = platform::batch::Batcher::start(ANCHORS_PER_STATEMENT, move |keys: Vec<String>| {
            let primary = primary.clone();
            async move { anchors_of(&primary, &keys).await }
        });
        Self { batcher }
    }

    async fn read(&self, key_id: &str) -> Result<Anchor, ApiError> {
        self.batcher.call(key_id.to_owned()).await.map_err(|error| {
            tracing::warn!(%error, "reading anchors on the primary failed");
            ApiError::unavailable("the primary database is unavailable; retry shortly")
        })
    }
}

/// Each key's last write and the head of the log, in `keys`' order, in one statement.
async fn anchors_of(primary: &deadpool_postgres::Pool, keys: &[String]) -> anyhow::Result<Vec<Anchor>> {
    let client = primary.get().await?;
    let statement = client
        .prepare_cached(
            "SELECT COALESCE(p.position, 0), (SELECT position FROM log_head)
             FROM unnest($1::text[]) WITH ORDINALITY AS k(key_id, ordinal)
             LEFT JOIN key_positions p ON p.key_id = k.key_id
             ORDER BY k.ordinal",
        )
        .await?;
    let rows = client.query(&statement, &[&keys]).await?;
    Ok(rows.iter().map(|row| Anchor { key_position: row.get(0), head: row.get(1) }).collect())
}

enum Settled {
    /// The read stands: it used the live versions and reached what it can.
    Answer(Consistent),
    /// Wait until the read models reach this position, then read again.
    Wait(i64),
}

/// Whether a read made with the versions `guess` and checked by `checked` (a row starting
/// with the check's columns) answers the caller.
fn settle(
    state: &State,
    models: &[&str],
    token: i64,
    anchor: Anchor,
    guess: &Consistent,
    mut check: Check,
    deadline: Instant,
) -> Settled {
    check.key_position = check.key_position.max(anchor.key_position);
    check.head = check.head.max(anchor.head);
    state.read_models.observe(&check.models);
    let required = check.key_position.max(token);
    // What waiting can reach: a token beyond the head of the log (no write returned it)
    // never will, but the caller's own writes still must be read.
    let attainable = required.min(check.head);
    let same_versions = models.iter().all(|name| {
        let used = guess.models.iter().find(|(model, _)| model == name).map(|(_, l)| l.version);
        let current = check.models.iter().find(|(model, _)| model == name).map(|(_, l)| l.version);
        used.is_some() && used == current
    });
    if same_versions {
        let mut consistent = Consistent {
            models: check.models,
            reached: false,
            required,
            quarantined: check.quarantined,
            head: check.head,
        };
        consistent.reached = consistent.has_reached(required);
        // A model that holds back the caller's space will not catch up by waiting, nor will
        // any model reach a token beyond the head of the log: once what can be reached is,
        // answer, saying so.
        let stuck = !consistent.reached
            && ((required > check.head && consistent.has_reached(attainable))
                || consistent.quarantined.iter().any(|(_, dead_at)| *dead_at <= required));
        if consistent.reached || stuck || Instant::now() >= deadline {
            return Settled::Answer(consistent);
        }
    }
    Settled::Wait(attainable)
}

/// One page of an offset list in one pipelined round trip: the total (0 when the count
/// query returns no row) and the `doc` column of each row. Both queries take `params`; the
/// rows query takes `limit` and `offset` after them.
pub(crate) async fn page_of_docs(
    client: &Client,
    count_sql: &str,
    rows_sql: &str,
    params: &[&(dyn ToSql + Sync)],
    (limit, offset): (i64, i64),
) -> Result<(i64, Vec<Value>), ApiError> {
    let count = client.prepare_cached(count_sql).await?;
    let rows = client.prepare_cached(rows_sql).await?;
    let mut rows_params = params.to_vec();
    rows_params.push(&limit);
    rows_params.push(&offset);
    let (total, rows) = tokio::join!(client.query_opt(&count, params), client.query(&rows, &rows_params));
    let total = total?.and_then(|row| row.get::<_, Option<i64>>(0)).unwrap_or(0);
    Ok((total, rows?.into_iter().map(|row| row.get(0)).collect()))
}

/// A 200 with `Projection-Position`, and a warning when the read models had not caught up.
pub fn respond(
    consistent: &Consistent,
    warnings: Vec<Warning>,
    body: impl FnOnce(&[Warning]) -> Value,
) -> HttpResponse {
    let warnings = with_read_warnings(consistent, warnings);
    HttpResponse::build(StatusCode::OK)
        .insert_header(("Projection-Position", consistent.position().to_string()))
        .json(body(&warnings))
}

/// [`respond`] for documents read as stored, whose text is never parsed
/// ([`api::http::raw_body`]): `data` is one document, or a page's ([`api::http::raw_array`]).
pub fn respond_raw(
    consistent: &Consistent,
    warnings: Vec<Warning>,
    data: &str,
    pagination: Option<&Value>,
) -> HttpResponse {
    let warnings = with_read_warnings(consistent, warnings);
    HttpResponse::build(StatusCode::OK)
        .insert_header(("Projection-Position", consistent.position().to_string()))
        .content_type(actix_web::http::header::ContentType::json())
        .body(api::http::raw_body(data, pagination, &warnings))
}

/// The caller's warnings, and one more when the read did not reach what it should have.
fn with_read_warnings(consistent: &Consistent, mut warnings: Vec<Warning>) -> Vec<Warning> {
    if let Some((model, dead_at)) = consistent.quarantined.first() {
        warnings.push(Warning {
            code: "stale_read",
            message: format!(
                "the {model} read model could not apply a change of this space at position {dead_at}; it shows the \
                 space as of position {} until an operator has fixed and retried it",
                dead_at - 1
            ),
        });
    } else if !consistent.reached && consistent.required > consistent.head && consistent.head > 0 {
        warnings.push(Warning {
            code: "stale_read",
            message: format!(
                "Consistency-Token {} is beyond the end of the log ({}); pass a value that a write returned",
                consistent.required, consistent.head
            ),
        });
    } else if !consistent.reached {
        warnings.push(Warning {
            code: "stale_read",
            message: format!(
                "the read model is at position {} and has not reached your last write at {}; retry to see it",
                consistent.position(),
                consistent.required
            ),
        });
    }
    warnings
}
