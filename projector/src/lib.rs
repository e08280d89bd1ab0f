//! The projector: the process that follows the event log. It builds the read models the
//! query service serves and runs the background workers (AI preparation, the eraser,
//! maintenance, and timers), all on one worker runtime (`runtime`). Which workers a process
//! runs is configuration (`APP__PROJECTOR__WORKERS`), so a deployment can split them across
//! processes; any number of processes may run the same workers, each lease letting one at a
//! time do a worker's work.

pub mod cli;
pub mod inbound;
pub mod read_models;
pub mod runtime;
pub mod status;
pub mod timers;
pub mod workers;

use std::sync::Arc;

use deadpool_postgres::Pool;
use futures_util::future::BoxFuture;
use platform::settings::Settings;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::read_models::runner::Faults;
use crate::read_models::worker::ReadModelWorker;
use crate::runtime::{Health, Runtime, Worker};

/// Applies the log's migrations and creates version 1 of every read model that has none.
pub async fn migrate(pool: &Pool) -> anyhow::Result<()> {
    platform::db::migrate(pool).await?;
    read_models::runner::ensure_initialized(pool).await
}

/// Connections a projector process needs: a step may hold its lease's connection while it
/// reads, writes and appends through others, and every worker steps at once.
pub const POOL_SIZE: usize = 32;

/// The kinds of worker a process can run.
pub(crate) const WORKER_KINDS: [&str; 13] = [
    "read_models",
    "preparation",
    "eraser",
    "maintenance",
    "webhook_enqueue",
    "webhook_delivery",
    "email_outbox",
    "domain_checks",
    "segment_windows",
    "broadcasts",
    "workflows",
    "engagement",
    "imports",
];

/// The workers a process runs: `selection` is `all` or a comma-separated list of
/// [`WORKER_KINDS`]. `process` names this process in the batch history.
pub fn workers(
    settings: &Settings,
    pool: &Pool,
    provider: ai_provider::AiProvider,
    process: &str,
) -> anyhow::Result<Vec<Arc<dyn Worker>>> {
    let selection = settings.projector.workers.trim();
    let wanted: Vec<&str> = if selection == "all" {
        WORKER_KINDS.to_vec()
    } else {
        selection.split(',').map(str::trim).filter(|kind| !kind.is_empty()).collect()
    };
    if let Some(unknown) = wanted.iter().find(|kind| !WORKER_KINDS.contains(kind)) {
        anyhow::bail!("APP__PROJECTOR__WORKERS names {unknown:?}; the workers are all, {}", WORKER_KINDS.join(", "));
    }
    let log = platform::log::EventLog::start_own(
        settings.database_url()?,
        false,
        (settings.append.batch_max, settings.append.batch_bytes),
    )?;
    let mut workers: Vec<Arc<dyn Worker>> = Vec::new();
    if wanted.contains(&"read_models") {
        let faults = Faults::from_settings(&settings.projector);
        let idle = Arc::new(read_models::runner::IdlePasses::new(&read_models::ALL));
        for model in read_models::ALL {
            workers.push(Arc::new(ReadModelWorker::new(
                pool.clone(),
                model,
                process.to_owned(),
                faults.clone(),
                idle.clone(),
            )));
        }
    }
    if wanted.contains(&"preparation") {
        workers.push(Arc::new(workers::preparation::Preparation::new(pool.clone(), log.clone(), provider)));
    }
    if wanted.contains(&"eraser") {
        workers.push(Arc::new(workers::eraser::Eraser::new(
            pool.clone(),
            log.clone(),
            settings.erasure_blocked_after(),
        )));
    }
    if wanted.contains(&"webhook_enqueue") {
        workers.push(Arc::new(workers::webhooks::enqueue::Enqueue::new(pool.clone())));
    }
    if wanted.contains(&"webhook_delivery") {
        workers.push(Arc::new(workers::webhooks::deliver::Deliver::new(
            pool.clone(),
            log.clone(),
            &settings.webhooks,
        )?));
    }
    if wanted.contains(&"segment_windows") {
        let windows = Arc::new(workers::segments::Windows::new(log.clone()));
        workers.push(Arc::new(timers::TimerWorker::new(pool.clone(), windows)));
    }
    if wanted.contains(&"broadcasts") {
        workers.extend(workers::broadcasts::workers(pool, &log, settings)?);
    }
    if wanted.contains(&"workflows") {
        workers.extend(workers::workflows::workers(pool, &log, settings)?);
    }
    if wanted.contains(&"engagement") {
        workers.push(Arc::new(workers::engagement::Engagement::new(pool.clone(), log.clone())));
    }
    if wanted.contains(&"imports") {
        workers.push(Arc::new(workers::imports::Imports::new(pool.clone(), log.clone(), &settings.imports)));
    }
    if wanted.contains(&"email_outbox") {
        // Held sends are decided again and handed off by the processes that run the outbox.
        workers.push(Arc::new(workers::email::held::Held::new(pool.clone(), log.clone(), settings)?));
        workers.push(Arc::new(workers::email::outbox::Outbox::new(pool.clone(), log, settings)?));
    }
    // Only with a nameserver to ask (APP__EMAIL__DNS_NAMESERVER).
    if wanted.contains(&"domain_checks")
        && let Some(checks) = workers::email::domains::DomainChecks::new(pool.clone(), &settings.email)?
    {
        workers.push(Arc::new(checks));
    }
    if wanted.contains(&"maintenance") {
        workers.push(Arc::new(workers::maintenance::Maintenance::new(
            pool.clone(),
            settings.event_receipt_retention(),
            std::time::Duration::from_secs(settings.inbound.soft_bounce_window_seconds),
        )));
    }
    Ok(workers)
}

/// A process's readiness as its workers see it: not ready while one has been failing for
/// more than [`FAILING_GRACE`]; the report lists each worker's health and the open dead
/// letters.
pub struct WorkersReadiness {
    pub health: Health,
    pub pool: Pool,
}

/// How long a worker may fail before the process reports itself not ready.
pub(crate) const FAILING_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

impl api::ops::Readiness for WorkersReadiness {
    fn check(&self) -> BoxFuture<'_, (bool, serde_json::Value)> {
        Box::pin(async {
            let failing = self.health.failing_longer_than(FAILING_GRACE);
            let dead_letters = match self.pool.get().await {
                Ok(client) => read_models::quarantine::list_open(&client).await.map(|open| open.len()).ok(),
                Err(_) => None,
            };
            let report = json!({
                "workers": self.health.snapshot(),
                "failing": failing,
                "deadLetters": dead_letters,
            });
            (failing.is_empty(), report)
        })
    }
}

/// The operations endpoints (`/health/live`, `/health/ready`, `/metrics`) of a projector
/// process, bound on `APP__PROJECTOR__PORT`; the server and its port.
pub(crate) fn ops_server(settings: &Settings, ops: api::ops::Ops) -> anyhow::Result<(actix_web::dev::Server, u16)> {
    let listener = std::net::TcpListener::bind((settings.http.host.as_str(), settings.projector.port))?;
    let port = listener.local_addr()?.port();
    let server = actix_web::HttpServer::new(move || {
        let ops = ops.clone();
        actix_web::App::new().configure(|config| ops.configure(config))
    })
    .workers(1)
    .shutdown_timeout(settings.shutdown_timeout().as_secs().max(1))
    .listen(listener)?
    .run();
    Ok((server, port))
}

/// The projector process: its workers on the runtime, and its operations endpoints
/// (`/health/live`, `/health/ready`, `/metrics`) on `APP__PROJECTOR__PORT`.
pub struct Application {
    runtime: Runtime,
    server: actix_web::dev::Server,
    port: u16,
    shutdown: CancellationToken,
    /// The process's heartbeat: the outbox rows and leases its workers take name it, so
    /// another process takes them over within seconds of its death.
    _beat: platform::liveness::Beat,
}

impl Application {
    pub async fn build(settings: &Settings) -> anyhow::Result<Self> {
        let database_url = settings.database_url()?.to_owned();
        let beat = platform::liveness::Beat::start(database_url.clone(), "projector");
        let pool = platform::db::pool(&database_url, POOL_SIZE)?;
        let provider = ai_provider::AiProvider::new(&settings.ai)?;
        let process = format!("projector-{}", std::process::id());
        let runtime = Runtime::new(database_url, workers(settings, &pool, provider, &process)?);
        let readiness = WorkersReadiness { health: runtime.health(), pool: pool.clone() };
        let ops = api::ops::Ops::new(pool, Some(Arc::new(readiness)));
        let (server, port) = ops_server(settings, ops)?;
        // The listener is this process's: no earlier process in its slot is alive.
        beat.fills(platform::liveness::slot(settings.instance.as_deref(), "projector", settings.projector.port, port));
        Ok(Self { runtime, server, port, shutdown: CancellationToken::new(), _beat: beat })
    }

    /// The port of the operations endpoints.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Runs until SIGTERM or SIGINT (which stop the operations server) or until the shutdown
    /// token is cancelled; then stops the workers, whose leases end with their transactions.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let Self { runtime, server, shutdown, _beat, .. } = self;
        let handle = server.handle();
        let workers = tokio::spawn(runtime.run(shutdown.clone()));
        tokio::select! {
            served = server => {
                served?;
                shutdown.cancel();
            }
            () = shutdown.cancelled() => handle.stop(true).await,
        }
        workers.await?;
        Ok(())
    }
}
