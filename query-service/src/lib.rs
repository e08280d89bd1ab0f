//! The query service: every GET of the public API, answered from read models, except the
//! audit trail, which is read from the log. One folder per capability (`http` handlers,
//! `store` reads); `consistency` is what every read shares (read-your-writes).
//! **Architecture Invariant:** nothing here writes to the database.

pub mod audit;
pub mod broadcasts;
pub mod consistency;
pub mod deletions;
pub mod email;
pub mod emails;
pub mod events;
pub mod imports;
pub mod ingest;
pub mod me;
pub mod records;
pub mod reference;
pub mod routes;
pub mod schemas;
pub mod segments;
pub mod suppressions;
pub mod webhooks;
pub mod workflows;

use actix_web::web;
use api::auth::Authenticator;
use api::http::ApiServer;
use deadpool_postgres::Pool;
use platform::readmodel::ReadModels;
use platform::settings::Settings;

pub struct State {
    /// Where reads run: the database, or its hot standby (`APP__DATABASE__READ_URL`).
    pub pool: Pool,
    /// When reads run on a standby: what a read must know as of now (the caller's last
    /// write, the head of the log), read on the primary (rate-limit reservations are written
    /// there too, by the authenticator, which also looks up there a key the standby does not
    /// know yet).
    pub anchors: Option<consistency::Anchors>,
    pub authenticator: Authenticator,
    pub read_models: ReadModels,
    pub settings: Settings,
}

impl State {
    pub fn new(settings: Settings, pool: Pool, read_models: ReadModels) -> web::Data<Self> {
        Self::with_primary(settings, pool, None, read_models)
    }

    /// A state whose reads run on `pool`, a standby of `primary` when one is given.
    pub(crate) fn with_primary(
        settings: Settings,
        pool: Pool,
        primary: Option<Pool>,
        read_models: ReadModels,
    ) -> web::Data<Self> {
        let (ttl, limits) = (settings.auth_cache_ttl(), settings.rate_limits);
        let authenticator = match &primary {
            Some(primary) => Authenticator::on_standby(pool.clone(), primary.clone(), read_models.clone(), ttl, limits),
            None => Authenticator::new(pool.clone(), read_models.clone(), ttl, limits),
        };
        let anchors = primary.map(consistency::Anchors::start);
        web::Data::new(Self { pool, anchors, authenticator, read_models, settings })
    }
}

/// Registers this service's routes (inside the `/v1` scope).
pub fn configure(config: &mut web::ServiceConfig) {
    routes::configure(config);
}

/// The service as a server: `build`, then `port()` and `run_until_stopped()`.
pub struct Application {
    server: ApiServer,
}

impl Application {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let primary = platform::db::generic_plan_pool(settings.database_url()?, settings.database.pool_size)?;
        let (pool, primary, read_models) = match settings.read_url() {
            None => {
                let read_models = ReadModels::start(primary.clone(), settings.database_url()?.to_owned());
                (primary, None, read_models)
            }
            Some(read_url) => {
                let standby =
                    platform::db::standby_pool(read_url, settings.database_url()?, settings.database.pool_size)?;
                (standby.clone(), Some(primary), ReadModels::start_on_standby(standby))
            }
        };
        let state = State::with_primary(settings.clone(), pool.clone(), primary, read_models);
        let ops = api::ops::Ops::new(pool, None);
        let address = (settings.http.host.as_str(), settings.http.port);
        let server = ApiServer::bind(address, settings.server_timeouts(), ops, reference::configure, move |config| {
            config.app_data(state.clone());
            configure(config);
        })?;
        Ok(Self { server })
    }

    pub fn port(&self) -> u16 {
        self.server.port()
    }

    pub fn handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.run_until_stopped().await
    }
}

#[cfg(test)]
mod tests {
    /// Stores know no HTTP (the pure parts are held by the workspace's purity check,
    /// `tests/tests/api/purity.rs`).
    #[test]
    fn stores_know_no_http() {
        let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for capability in ["schemas", "records", "deletions", "suppressions", "events", "audit"] {
            let store = std::fs::read_to_string(source.join(capability).join("store.rs")).expect("a store");
            assert!(!store.contains("actix"), "{capability}/store.rs mentions actix");
        }
    }
}
