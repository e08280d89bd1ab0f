//! The database pool, the migrations of the log's own tables, and LISTEN helpers.

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, NoTls};

mod embedded {
    refinery::embed_migrations!("migrations");
}

mod hosts;

pub fn pool(database_url: &str, max_size: usize) -> anyhow::Result<Pool> {
    pool_with_options(database_url, max_size, "")
}

/// Messages larger than this leave a connection's buffers as large for as long as it lives
/// (the client's encoder and its socket's write and read buffers keep their capacity): a
/// connection that carried one is closed instead of going back to the pool.
pub const LARGE_MESSAGE_BYTES: usize = 256 * 1024;

/// Returns `client` to its pool, or closes it when it carried a message of `bytes` above
/// [`LARGE_MESSAGE_BYTES`] (an import's part), so a burst of large messages does not stay in
/// the process's memory, a few megabytes per pooled connection.
pub fn release(client: deadpool_postgres::Client, bytes: usize) {
    if bytes > LARGE_MESSAGE_BYTES {
        drop(deadpool_postgres::Object::take(client));
    }
}

/// The pauses between tries of a statement that settles what a failed operation left (a claim
/// to withdraw, release or mark unresolved, a hand-off to give back) while the database is
/// away: 100 ms, doubling to 250 ms. A try while it is away fails at once, or within the
/// connect timeout; the first after its return must come soon, since a client's retry of the
/// operation waits for it (docs/benchmarks.md, "A client's longest wait through a failover").
pub fn settling_pauses() -> impl Iterator<Item = Duration> {
    std::iter::successors(Some(Duration::from_millis(100)), |pause| Some((*pause * 2).min(SETTLING_PAUSE_MAX)))
}

const SETTLING_PAUSE_MAX: Duration = Duration::from_millis(250);

/// Runs `sql` until it changes exactly one row, or `for_at_most` passes, pausing
/// [`settling_pauses`] between tries; whether it did. For undoing a claim whose answer was
/// lost: its statement may commit after the error was seen, and the database may be away when
/// the undoing is due, so one try is not enough.
pub async fn until_one_row(
    pool: &Pool,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    for_at_most: Duration,
) -> bool {
    let deadline = std::time::Instant::now() + for_at_most;
    for pause in settling_pauses() {
        if let Ok(client) = pool.get().await
            && client.execute(sql, params).await.is_ok_and(|rows| rows == 1)
        {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(pause).await;
    }
    false
}

/// The pool of the request-serving services (query and command): as [`pool`], and every
/// prepared statement runs its generic plan. Their statements are parameterised lookups on
/// indexes and inserts from parameter arrays, and PostgreSQL kept planning some of them on
/// every execution, because it judged the generic plan dearer than a custom one: the
/// consistency check of a read (0.15–0.3 ms of planning, more than the read itself), a
/// fire's receipt lookup (0.11 ms of planning against 0.011 ms of execution) and its
/// admission statement (0.15 ms against 0.07 ms).
pub fn generic_plan_pool(database_url: &str, max_size: usize) -> anyhow::Result<Pool> {
    pool_with_options(database_url, max_size, GENERIC_PLANS)
}

const GENERIC_PLANS: &str = " -c plan_cache_mode=force_generic_plan";

/// What a process's append batcher's connection is called in `pg_stat_activity`.
pub const LOG_APPLICATION_NAME: &str = "event-log";

/// The pool of a process's append batcher ([`crate::log::EventLog::start_own`] says why it has
/// one of its own): one connection, named [`LOG_APPLICATION_NAME`], running generic plans
/// when `generic_plans` (as the request-serving services' pools do).
pub fn log_pool(database_url: &str, generic_plans: bool) -> anyhow::Result<Pool> {
    let options = if generic_plans { GENERIC_PLANS } else { "" };
    named_pool(database_url, LOG_POOL_SIZE, options, Some(LOG_APPLICATION_NAME))
}

/// Connections an append batcher uses: one at a time, since it writes one batch after another
/// and notifies after each.
const LOG_POOL_SIZE: usize = 1;

// The keyed settings, named once: `$then!` gets each setting with its keyed value, and writes
// them out (`concat!` takes literals only, so the texts below are built by macros).
macro_rules! keyed_settings {
    ($then:ident) => {
        $then!(
            plan_cache_mode = force_generic_plan,
            enable_seqscan = off,
            enable_hashjoin = off,
            enable_mergejoin = off
        )
    };
}

macro_rules! set_keyed {
    ($($name:ident = $value:ident),+) => {
        concat!($("SET LOCAL ", stringify!($name), " = ", stringify!($value), "; "),+)
    };
}

macro_rules! set_default {
    ($($name:ident = $value:ident),+) => {
        concat!($("SET LOCAL ", stringify!($name), " TO DEFAULT; "),+)
    };
}

macro_rules! keyed_plans {
    () => {
        keyed_settings!(set_keyed)
    };
}

/// Planner settings for a transaction whose statements all find their rows by key (a key
/// column, or a join to `unnest` of parameter arrays), sent first with `SET LOCAL`:
/// - each prepared statement runs its generic plan, planned once per connection. Given arrays
///   of keys, PostgreSQL judged a plan for the few values at hand cheaper than one for any
///   count and planned again on every call: the segments read model's batch (0.24 ms of
///   planning a create beside 0.04 ms of execution), and a held send's release, whose
///   hand-off's reads, read models' batches and appends spent a quarter of their time planning
///   (docs/benchmarks.md, issue 70: "Followers look before they lease" and "Planned once");
/// - the plans are held to index lookups. Without that a plan made while a table was small
///   (statistics from before a burst of writes, or a connection's cached generic plan) scans
///   the whole table once it has grown: measured, the log's stream update of every append
///   batch scanned all 10,000 rows of a young `streams` table, and the workflow engine's claim
///   and row update all of `workflow_runs`, together half the cluster's CPU per run when
///   10,000 waits ended at once (docs/benchmarks.md, issue 52).
///
/// The append transactions, the keyed read models' batches, the email hand-offs' reads, the
/// workflow engine's read of due runs and the webhook deliveries' claim send them. Never a
/// transaction that joins two sets of its own (a `unnest` with a `RETURNING`'s rows): without
/// hash and merge joins that join is a nested loop, quadratic in the batch (the workflows read
/// model's rebuild took four times as long). And a statement that transactions without them run
/// too must not get its plan under them if it needs a scan they forbid: costed with the disabled
/// scan, that generic plan made PostgreSQL plan the statement again on every call elsewhere on
/// the connection (the read models' read of a span, with its scan of the one-row `log_head`,
/// took a quiet create from 0.05 to 0.28 ms of planning). So a keyed read model's batch sets
/// them after that read, and [`UNKEYED_PLANS`] sets them back before the batch's checkpoint.
pub const KEYED_PLANS: &str = keyed_plans!();

/// [`KEYED_PLANS`] set back to the session's values (its connection's options) for the rest of
/// the transaction.
pub const UNKEYED_PLANS: &str = keyed_settings!(set_default);

/// [`KEYED_PLANS`] with the `BEGIN` before them: a transaction opened by its first
/// statements, pipelined with the rest instead of a round trip of its own (the log's set
/// writes).
pub const BEGIN_KEYED: &str = concat!("BEGIN; ", keyed_plans!());

/// A claim's settings: [`KEYED_PLANS`], and a commit that does not wait for the disk (a claim
/// acknowledges nothing; the work it leads to is appended with a flush that makes it durable
/// too, and a claim lost in a crash only lets its rows be claimed again).
pub const CLAIM_SETTINGS: &str = concat!("SET LOCAL synchronous_commit = off; ", keyed_plans!());

/// Every pooled connection's settings:
/// - a stuck transaction would hold the log head lock: none may idle for long;
/// - no JIT compilation. Every statement here is an index lookup or a write of parameter
///   arrays, and PostgreSQL compiles a statement when its estimated cost passes a threshold:
///   a read model's read of the log, planned before `log_head` had statistics, was estimated
///   at millions of rows and compiled on every call, 40 to 100 ms for a read of 0.2 ms
///   (docs/benchmarks.md, issue 51).
const SESSION: &str = "-c idle_in_transaction_session_timeout=30000 -c jit=off";

/// How long a connection may keep data unacknowledged by the server before the kernel drops
/// it, and when idle connections are probed: a server that vanished from the network (a
/// partitioned primary) sends no reset, so without these a connection would wait for it for
/// hours. A live server's kernel acknowledges within milliseconds however busy PostgreSQL is,
/// so 4 s only ever cuts a connection whose server is gone, and a request that met a cut-off
/// primary answers 503 in time for its retry to find the new one (docs/benchmarks.md, "A
/// client's longest wait through a failover").
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(4);
const KEEPALIVES_IDLE: Duration = Duration::from_secs(5);
const KEEPALIVES_INTERVAL: Duration = Duration::from_secs(2);
const KEEPALIVES_RETRIES: u32 = 3;
/// How long one host may take to accept a connection (the socket's, before the startup) before
/// the next host of the URL is tried: while a primary is cut off, every new connection pays it
/// once. 2 s is libpq's smallest and leaves room for one lost SYN.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The settings of `database_url` (libpq's key=value or URL form: several hosts with
/// `target_session_attrs=read-write` find the primary of a failover cluster), with the
/// timeouts it leaves unset chosen so that a lost server is noticed within seconds. (Unlike
/// libpq, tokio-postgres reads `tcp_user_timeout` in seconds.)
pub fn connection_config(database_url: &str) -> anyhow::Result<tokio_postgres::Config> {
    let mut config = tokio_postgres::Config::from_str(database_url).context("parsing the database URL")?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
    if config.get_keepalives() {
        // tokio-postgres's own default idle time is two hours.
        if config.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
            config.keepalives_idle(KEEPALIVES_IDLE);
        }
        if config.get_keepalives_interval().is_none() {
            config.keepalives_interval(KEEPALIVES_INTERVAL);
        }
        if config.get_keepalives_retries().is_none() {
            config.keepalives_retries(KEEPALIVES_RETRIES);
        }
    }
    Ok(config)
}

/// One connection of `database_url` (see [`connection_config`]), outside any pool.
pub async fn connect(
    database_url: &str,
) -> anyhow::Result<(
    tokio_postgres::Client,
    tokio_postgres::Connection<tokio_postgres::Socket, tokio_postgres::tls::NoTlsStream>,
)> {
    Ok(connection_config(database_url)?.connect(NoTls).await?)
}

fn pool_with_options(database_url: &str, max_size: usize, options: &str) -> anyhow::Result<Pool> {
    named_pool(database_url, max_size, options, None)
}

fn named_pool(
    database_url: &str,
    max_size: usize,
    options: &str,
    application_name: Option<&str>,
) -> anyhow::Result<Pool> {
    let mut config = connection_config(database_url)?;
    config.options(format!("{SESSION}{options}"));
    if let Some(name) = application_name {
        config.application_name(name);
    }
    let hosts = hosts::Hosts::new(&config);
    let manager = Manager::from_connect(
        config,
        Connector { hosts, fallback: None },
        ManagerConfig { recycling_method: RecyclingMethod::Fast },
    );
    build(Pool::builder(manager), max_size)
}

/// A pool's connections: to the first host of `hosts` that takes them, never trying one that
/// has just failed to accept one ([`hosts`]); when none does and there is a `fallback` (the
/// standby pool's primary), to the first of its hosts that does.
struct Connector {
    hosts: hosts::Hosts,
    fallback: Option<hosts::Hosts>,
}

impl deadpool_postgres::Connect for Connector {
    fn connect(
        &self,
        _: &tokio_postgres::Config,
    ) -> futures_util::future::BoxFuture<
        '_,
        Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
    > {
        Box::pin(async move {
            let (client, connection) = match (self.hosts.connect().await, &self.fallback) {
                (Ok(connected), _) => connected,
                (Err(error), Some(fallback)) => {
                    tracing::debug!(%error, "no standby answered; reading from the primary");
                    fallback.connect().await?
                }
                (Err(error), None) => return Err(error),
            };
            Ok(driven(client, connection))
        })
    }
}

/// `client` with a task that drives its `connection` until it ends.
fn driven(
    client: tokio_postgres::Client,
    connection: tokio_postgres::Connection<tokio_postgres::Socket, tokio_postgres::tls::NoTlsStream>,
) -> (tokio_postgres::Client, tokio::task::JoinHandle<()>) {
    let driver = tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "a connection ended");
        }
    });
    (client, driver)
}

fn build(builder: deadpool_postgres::PoolBuilder, max_size: usize) -> anyhow::Result<Pool> {
    builder
        .max_size(max_size)
        .wait_timeout(Some(Duration::from_secs(10)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .context("building the database pool")
}

/// How long a connection of the standby pool lives: one opened on the primary while no standby
/// answered goes back to a standby within this time.
const STANDBY_CONNECTION_AGE: Duration = Duration::from_secs(60);

/// The query service's pool of read connections: each new connection goes to a standby of
/// `read_url` (list every node with `target_session_attrs=read-only` and the connection lands
/// on whichever is a standby now, after a failover too), and to the primary of `primary_url`
/// while no standby answers. Reads on the primary are as current as on any standby, so the
/// consistency checks hold either way. Connections live at most a minute, so reads leave the
/// primary soon after a standby returns.
pub fn standby_pool(read_url: &str, primary_url: &str, max_size: usize) -> anyhow::Result<Pool> {
    let options = format!("{SESSION}{GENERIC_PLANS}");
    let mut standby = connection_config(read_url)?;
    standby.options(&options);
    let mut primary = connection_config(primary_url)?;
    primary.options(&options);
    let hosts = (hosts::Hosts::new(&standby), hosts::Hosts::new(&primary));
    let manager = Manager::from_connect(
        standby,
        Connector { hosts: hosts.0, fallback: Some(hosts.1) },
        ManagerConfig { recycling_method: RecyclingMethod::Fast },
    );
    let too_old = deadpool_postgres::Hook::sync_fn(|_, metrics| {
        if metrics.age() > STANDBY_CONNECTION_AGE {
            Err(deadpool_postgres::HookError::Message("renewed, to prefer a standby".into()))
        } else {
            Ok(())
        }
    });
    build(Pool::builder(manager).pre_recycle(too_old), max_size)
}

/// Applies the migrations (`shared/platform/migrations/V<n>__<name>.sql`, with refinery) that are not
/// applied yet, one process at a time. A migration that was applied and has changed since
/// (its checksum differs) fails loudly: applied migrations are never edited.
pub async fn migrate(pool: &Pool) -> anyhow::Result<()> {
    migrate_until(pool, None).await
}

/// [`migrate`], stopping after migration `version` when one is given: what an earlier release
/// left, for the tests that upgrade such a database.
pub async fn migrate_until(pool: &Pool, version: Option<i32>) -> anyhow::Result<()> {
    let mut client = pool.get().await.context("connecting to migrate")?;
    client.execute("SELECT pg_advisory_lock(727001)", &[]).await?;
    let outcome = async {
        adopt_earlier_history(&mut client).await?;
        let target = version.map_or(refinery::Target::Latest, refinery::Target::Version);
        let report = embedded::migrations::runner()
            .set_target(target)
            .set_abort_divergent(true)
            .set_abort_missing(true)
            .run_async(&mut **client)
            .await
            .context("applying the migrations")?;
        for migration in report.applied_migrations() {
            tracing::info!(version = migration.version(), name = migration.name(), "applied migration");
        }
        anyhow::Ok(())
    }
    .await;
    client.execute("SELECT pg_advisory_unlock(727001)", &[]).await?;
    outcome
}

/// The latest migration version the code knows, and whether the database has it.
pub async fn is_migrated(client: &impl deadpool_postgres::GenericClient) -> anyhow::Result<bool> {
    let latest = embedded::migrations::runner().get_migrations().iter().map(|m| m.version()).max().unwrap_or(0);
    let exists: bool = client.query_one("SELECT to_regclass('refinery_schema_history') IS NOT NULL", &[]).await?.get(0);
    if !exists {
        return Ok(false);
    }
    let applied: i32 =
        client.query_one("SELECT COALESCE(max(version), 0) FROM refinery_schema_history", &[]).await?.get(0);
    Ok(applied >= latest)
}

/// Databases migrated before refinery kept their history in `schema_migrations`: record those
/// migrations in refinery's table (with the checksums of the same files) so they are not
/// applied again.
async fn adopt_earlier_history(client: &mut deadpool_postgres::Client) -> anyhow::Result<()> {
    let row = client
        .query_one(
            "SELECT to_regclass('schema_migrations') IS NOT NULL, to_regclass('refinery_schema_history') IS NOT NULL",
            &[],
        )
        .await?;
    let (earlier, refinery): (bool, bool) = (row.get(0), row.get(1));
    if !earlier || refinery {
        return Ok(());
    }
    let transaction = client.transaction().await?;
    let applied: Vec<i32> =
        transaction.query("SELECT version FROM schema_migrations", &[]).await?.iter().map(|row| row.get(0)).collect();
    transaction
        .batch_execute(
            "CREATE TABLE refinery_schema_history (version int4 PRIMARY KEY, name varchar(255),
             applied_on varchar(255), checksum varchar(255))",
        )
        .await?;
    let applied_on = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    for migration in embedded::migrations::runner().get_migrations() {
        if applied.contains(&migration.version()) {
            transaction
                .execute(
                    "INSERT INTO refinery_schema_history (version, name, applied_on, checksum) VALUES ($1, $2, $3, $4)",
                    &[&migration.version(), &migration.name(), &applied_on, &migration.checksum().to_string()],
                )
                .await?;
        }
    }
    transaction.batch_execute("DROP TABLE schema_migrations").await?;
    transaction.commit().await?;
    tracing::info!(migrations = applied.len(), "adopted the earlier migration history");
    Ok(())
}

/// Listens on `channel` on a dedicated connection and forwards each payload. Reconnects on
/// failure, sending an empty payload after each reconnect so listeners re-check state.
pub fn listen(database_url: String, channel: &'static str) -> mpsc::UnboundedReceiver<String> {
    let (sender, receiver) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            if let Err(error) = listen_once(&database_url, channel, &sender).await {
                tracing::warn!(channel, error = format!("{error:#}"), "notification listener lost; reconnecting");
            }
            if sender.is_closed() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    receiver
}

async fn listen_once(database_url: &str, channel: &str, sender: &mpsc::UnboundedSender<String>) -> anyhow::Result<()> {
    let (client, mut connection) = connect(database_url).await?;
    let (message_sender, mut messages) = mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut stream = futures_util::stream::poll_fn(move |context| connection.poll_message(context));
        while let Some(message) = stream.next().await {
            match message {
                Ok(AsyncMessage::Notification(notification)) => {
                    if message_sender.send(notification.payload().to_owned()).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "notification connection failed");
                    return;
                }
            }
        }
    });
    client.batch_execute(&format!("LISTEN {channel}")).await?;
    let _ = sender.send(String::new());
    while let Some(payload) = messages.recv().await {
        if sender.send(payload).is_err() {
            break;
        }
    }
    driver.abort();
    drop(client);
    anyhow::bail!("connection closed")
}

/// What a failed statement says about the request that sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The database could not be reached or gave up for a reason of its own (connection lost,
    /// serialization failure, deadlock, out of resources, shutting down): retrying may succeed.
    Transient,
    /// The database refused a value (a data exception, or a program limit such as an index
    /// entry that is too large): the same request can never succeed.
    Refused,
    /// Anything else: a defect of ours (a constraint our code should have kept, bad SQL).
    Defect,
}

/// Whether `error` (any of its causes) is a database failure that passes by itself: a
/// [`Failure::Transient`] statement failure, or no connection to be had from a pool.
pub fn is_transient(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        if let Some(database) = cause.downcast_ref::<tokio_postgres::Error>() {
            return classify(database) == Failure::Transient;
        }
        match cause.downcast_ref::<deadpool_postgres::PoolError>() {
            Some(deadpool_postgres::PoolError::Backend(database)) => classify(database) == Failure::Transient,
            Some(deadpool_postgres::PoolError::Timeout(_) | deadpool_postgres::PoolError::Closed) => true,
            _ => false,
        }
    })
}

/// Classifies a statement's failure by its SQLSTATE class.
pub fn classify(error: &tokio_postgres::Error) -> Failure {
    let Some(database_error) = error.as_db_error() else {
        // No SQLSTATE: the connection failed or the driver gave up.
        let io = std::error::Error::source(error).is_some_and(|source| source.is::<std::io::Error>());
        let text = error.to_string();
        return if error.is_closed() || io || text.contains("connect") || text.contains("timeout") {
            Failure::Transient
        } else {
            Failure::Defect
        };
    };
    let code = database_error.code().code();
    match &code[..2] {
        // connection exception, transaction rollback, insufficient resources, operator
        // intervention (shutdown, statement timeout), system error
        "08" | "40" | "53" | "57" | "58" => Failure::Transient,
        // lock not available; idle-in-transaction session timeout
        "55" if code == "55P03" => Failure::Transient,
        // 25P03: idle-in-transaction session timeout; 25006: the server is read-only, a primary
        // that has just become a standby in a failover (the connection is dropped with it).
        "25" if code == "25P03" || code == "25006" => Failure::Transient,
        "22" | "54" => Failure::Refused,
        _ => Failure::Defect,
    }
}

/// A `json` or `jsonb` value as PostgreSQL sends it, kept as text and never parsed: for a
/// document that goes out in an answer as it is stored. The server produced the text from a
/// value it had validated, so it is JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawJson(pub String);

impl<'a> tokio_postgres::types::FromSql<'a> for RawJson {
    fn from_sql(
        ty: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        // `jsonb`'s binary form is a version byte (1) and the text.
        let text = if *ty == tokio_postgres::types::Type::JSONB {
            match raw.split_first() {
                Some((1, text)) => text,
                _ => return Err("an unknown jsonb binary version".into()),
            }
        } else {
            raw
        };
        Ok(Self(std::str::from_utf8(text)?.to_owned()))
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        matches!(*ty, tokio_postgres::types::Type::JSON | tokio_postgres::types::Type::JSONB)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio_postgres::types::{FromSql, Type};

    use super::{BEGIN_KEYED, KEYED_PLANS, RawJson, UNKEYED_PLANS, connection_config};

    #[test]
    fn the_keyed_settings_are_set_and_set_back_by_the_same_names() {
        assert_eq!(
            KEYED_PLANS,
            "SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL enable_seqscan = off; \
             SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off; "
        );
        assert_eq!(
            UNKEYED_PLANS,
            "SET LOCAL plan_cache_mode TO DEFAULT; SET LOCAL enable_seqscan TO DEFAULT; \
             SET LOCAL enable_hashjoin TO DEFAULT; SET LOCAL enable_mergejoin TO DEFAULT; "
        );
        assert_eq!(BEGIN_KEYED, format!("BEGIN; {KEYED_PLANS}"));
    }

    #[test]
    fn raw_json_is_the_text_postgres_sent() {
        let text = r#"{"a": [1, 2.50, "é"]}"#;
        let jsonb = [&[1u8][..], text.as_bytes()].concat();
        assert_eq!(RawJson::from_sql(&Type::JSONB, &jsonb).ok(), Some(RawJson(text.to_owned())));
        assert_eq!(RawJson::from_sql(&Type::JSON, text.as_bytes()).ok(), Some(RawJson(text.to_owned())));
        assert!(RawJson::from_sql(&Type::JSONB, b"\x02{}").is_err(), "an unknown version");
        assert!(RawJson::from_sql(&Type::JSONB, b"").is_err());
        assert!(RawJson::from_sql(&Type::JSON, b"\xff").is_err(), "not UTF-8");
        assert!(RawJson::accepts(&Type::JSONB) && RawJson::accepts(&Type::JSON) && !RawJson::accepts(&Type::TEXT));
    }

    #[test]
    fn a_lost_server_is_noticed_within_seconds_unless_the_url_says_otherwise() {
        let config =
            connection_config("host=a,b port=5432,5433 user=postgres target_session_attrs=read-write").expect("parsed");
        assert_eq!(config.get_hosts().len(), 2, "every node of the URL is kept");
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(2)));
        assert_eq!(config.get_tcp_user_timeout(), Some(&Duration::from_secs(4)));
        assert_eq!(config.get_keepalives_idle(), Duration::from_secs(5));
        assert_eq!(config.get_keepalives_interval(), Some(Duration::from_secs(2)));
        assert_eq!(config.get_keepalives_retries(), Some(3));

        let chosen = connection_config(
            "host=a user=postgres connect_timeout=1 tcp_user_timeout=30 keepalives_idle=60 \
             keepalives_interval=7 keepalives_retries=9",
        )
        .expect("parsed");
        assert_eq!(chosen.get_connect_timeout(), Some(&Duration::from_secs(1)));
        assert_eq!(chosen.get_tcp_user_timeout(), Some(&Duration::from_secs(30)));
        assert_eq!(chosen.get_keepalives_idle(), Duration::from_secs(60));
        assert_eq!(chosen.get_keepalives_interval(), Some(Duration::from_secs(7)));
        assert_eq!(chosen.get_keepalives_retries(), Some(9));
    }

    #[test]
    fn no_connection_from_a_pool_is_transient_and_other_failures_are_not() {
        use deadpool_postgres::{PoolError, TimeoutType};
        let waited = anyhow::Error::new(PoolError::Timeout(TimeoutType::Wait)).context("a worker step");
        assert!(super::is_transient(&waited));
        assert!(super::is_transient(&anyhow::Error::new(PoolError::Closed)));
        assert!(!super::is_transient(&anyhow::anyhow!("a stored part cannot be read")));
    }
}
