//! The command service: every mutation of the public API. Authenticate, resolve the space,
//! check the permission, parse and validate, decide, append to the event log.

pub mod authoring;
pub mod domain;
pub mod http;

use std::net::TcpListener;

use actix_web::dev::Server;
use actix_web::{App, HttpServer, middleware, web};
use anyhow::Context;
use deadpool_postgres::Pool;
use shared::auth::Authenticator;
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
        let authenticator = Authenticator::new(pool.clone(), read_models.clone(), settings.auth_cache_ttl);
        web::Data::new(Self { pool, event_log, authenticator, read_models, settings })
    }
}

/// Registers this service's routes (inside the `/v1` scope).
pub fn configure(config: &mut web::ServiceConfig) {
    http::routes::configure(config);
}

pub struct Application {
    port: u16,
    server: Server,
}

impl Application {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let pool = shared::db::pool(settings.database_url.expose(), settings.database_pool_size)?;
        let read_models = ReadModels::start(pool.clone(), settings.database_url.expose().to_owned());
        let state = State::new(settings.clone(), pool, read_models);
        let listener = TcpListener::bind((settings.host.as_str(), settings.port)).context("binding the listener")?;
        let port = listener.local_addr()?.port();
        let server = HttpServer::new(move || {
            App::new()
                .wrap(middleware::from_fn(shared::http::request_id_middleware))
                .app_data(state.clone())
                .service(web::scope(shared::routes::API_PREFIX).configure(configure))
                .default_service(web::to(shared::http::fallback))
        })
        .listen(listener)?
        .run();
        Ok(Self { port, server })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.await
    }
}
