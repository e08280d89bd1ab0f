//! The database pool, the migrations of the log's own tables, and LISTEN helpers.

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, NoTls};

/// `(version, name, sql)` of each migration, applied in order.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "event_log", include_str!("../migrations/V1__event_log.sql")),
    (2, "suppressions", include_str!("../migrations/V2__suppressions.sql")),
    (3, "rate_windows", include_str!("../migrations/V3__rate_windows.sql")),
    (4, "idempotency", include_str!("../migrations/V4__idempotency.sql")),
    (5, "erasure", include_str!("../migrations/V5__erasure.sql")),
    (6, "business_events", include_str!("../migrations/V6__business_events.sql")),
    (7, "hardening", include_str!("../migrations/V7__hardening.sql")),
];

pub fn pool(database_url: &str, max_size: usize) -> anyhow::Result<Pool> {
    let mut config = tokio_postgres::Config::from_str(database_url).context("parsing the database URL")?;
    // A stuck transaction would hold the log head lock; never let one idle for long.
    config.options("-c idle_in_transaction_session_timeout=30000");
    let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Pool::builder(manager)
        .max_size(max_size)
        .wait_timeout(Some(Duration::from_secs(10)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .context("building the database pool")
}

/// Applies the log migrations that are not applied yet, one process at a time.
pub async fn migrate(pool: &Pool) -> anyhow::Result<()> {
    let mut client = pool.get().await.context("connecting to migrate")?;
    let transaction = client.transaction().await?;
    transaction.execute("SELECT pg_advisory_xact_lock(727001)", &[]).await?;
    transaction
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await?;
    for (version, name, sql) in MIGRATIONS {
        let applied = transaction.query_opt("SELECT 1 FROM schema_migrations WHERE version = $1", &[version]).await?;
        if applied.is_none() {
            tracing::info!(version, name, "applying migration");
            transaction.batch_execute(sql).await.with_context(|| format!("applying migration {version} {name}"))?;
            transaction
                .execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", &[version, name])
                .await?;
        }
    }
    transaction.commit().await?;
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
    let (client, mut connection) = tokio_postgres::connect(database_url, NoTls).await?;
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
        "25" if code == "25P03" => Failure::Transient,
        "22" | "54" => Failure::Refused,
        _ => Failure::Defect,
    }
}
