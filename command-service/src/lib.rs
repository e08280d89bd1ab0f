//! The command service: every mutation of the public API. Authenticate, resolve the space,
//! check the permission, parse and validate, decide, append to the event log.

pub mod authoring;
pub mod domain;
pub mod http;
pub mod idempotency;
pub mod store;

use actix_web::web;
use deadpool_postgres::Pool;
use shared::auth::Authenticator;
use shared::http::ApiServer;
use shared::log::EventLog;
use shared::readmodel::ReadModels;
use shared::settings::Settings;

/// What every handler of this service needs.
pub struct State {
    pub pool: Pool,
    pub event_log: EventLog,
    pub authenticator: Authenticator,
    pub read_models: ReadModels,
    pub settings: Settings,
}

impl State {
    pub fn new(settings: Settings, pool: Pool, read_models: ReadModels) -> web::Data<Self> {
        let event_log = EventLog::start(pool.clone(), settings.append_batch_max);
        let authenticator =
            Authenticator::new(pool.clone(), read_models.clone(), settings.auth_cache_ttl, settings.rate_limits);
        tokio::spawn(maintain(pool.clone()));
        web::Data::new(Self { pool, event_log, authenticator, read_models, settings })
    }
}

/// Every minute: purge idempotency records past their 24 hours and reconcile unresolved
/// claims. Any number of instances may run it.
async fn maintain(pool: Pool) {
    let mut ticker = tokio::time::interval(std::time::Duration::from_secs(60));
    loop {
        ticker.tick().await;
        if let Err(error) = idempotency::purge_and_reconcile(&pool).await {
            tracing::warn!(error = format!("{error:#}"), "idempotency maintenance failed");
        }
    }
}

/// Registers this service's routes (inside the `/v1` scope).
pub fn configure(config: &mut web::ServiceConfig) {
    http::routes::configure(config);
}

/// The service as a server: `build`, then `port()` and `run_until_stopped()`.
pub struct Application {
    server: ApiServer,
}

impl Application {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let pool = shared::db::pool(settings.database_url.expose(), settings.database_pool_size)?;
        let read_models = ReadModels::start(pool.clone(), settings.database_url.expose().to_owned());
        let state = State::new(settings.clone(), pool, read_models);
        let server = ApiServer::bind(&settings.host, settings.port, move |config| {
            config.app_data(state.clone());
            configure(config);
        })?;
        Ok(Self { server })
    }

    pub fn port(&self) -> u16 {
        self.server.port()
    }

    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.run_until_stopped().await
    }
}
