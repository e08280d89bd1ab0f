//! Single-node mode: the command service's and the query service's routes behind one base
//! URL, with the projector's workers running in the same process. For development and the
//! demo; the split deployment (separate processes behind nginx, routing by method) is in
//! `deploy/`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use api::http::ApiServer;
use platform::readmodel::ReadModels;
use platform::settings::Settings;
use tokio_util::sync::CancellationToken;

pub struct SingleNode {
    server: ApiServer,
    runtime: projector::runtime::Runtime,
    /// The return-path listener, when `APP__INBOUND__PORT` is set.
    inbound: Option<projector::inbound::Listener>,
    shutdown: CancellationToken,
    /// Keys with a secret in the applied workspace file: `(name, secret)`.
    pub workspace_keys: Vec<(String, String)>,
    /// The workspace's write keys (the Segment-compatible ingest's): slug, secret.
    pub workspace_write_keys: Vec<(String, String)>,
}

impl SingleNode {
    /// Migrates, applies `workspace` (if any, once the read models have caught up with it)
    /// and binds the server; the workers start with [`SingleNode::run_until_stopped`].
    pub async fn build(settings: Settings, workspace: Option<&str>) -> anyhow::Result<Self> {
        let database_url = settings.database_url()?.to_owned();
        // The command and query pools run generic plans, as the separate services do.
        let pool = platform::db::generic_plan_pool(&database_url, settings.database.pool_size)?;
        projector::migrate(&pool).await.context("migrating")?;
        let projector_pool = platform::db::pool(&database_url, projector::POOL_SIZE)?;
        let read_pool = platform::db::generic_plan_pool(&database_url, settings.database.pool_size)?;
        let provider = ai_provider::AiProvider::new(&settings.ai)?;
        let process = format!("single-node-{}", std::process::id());
        let workers = projector::workers(&settings, &projector_pool, provider, &process)?;
        let runtime = projector::runtime::Runtime::new(database_url.clone(), workers);
        let shutdown = CancellationToken::new();
        let read_models = ReadModels::start(pool.clone(), database_url);
        let command_state = command_service::State::new(settings.clone(), pool.clone(), read_models.clone())?;
        let query_state = query_service::State::new(settings.clone(), read_pool, read_models);
        let mut workspace_keys = Vec::new();
        let mut workspace_write_keys = Vec::new();
        let mut applied = None;
        if let Some(text) = workspace {
            let parsed = command_service::authoring::parse(text)?;
            let report = command_service::authoring::apply(
                &pool,
                &command_state.event_log,
                &parsed,
                command_service::authoring::Rules::of(&settings),
            )
            .await?;
            applied = Some(report.position);
            for user in &parsed.users {
                for key in user.api_keys.iter().filter(|key| !key.revoked) {
                    if let Some(secret) = &key.secret {
                        workspace_keys.push((key.name.clone(), secret.clone()));
                    }
                }
            }
            for (email, name, secret) in report.generated_keys {
                workspace_keys.push((format!("{name} ({email})"), secret));
            }
            for space in &parsed.spaces {
                for key in space.write_keys.iter().filter(|key| key.enabled) {
                    for secret in key.secret.iter().chain(key.secrets.iter().take(1)).take(1) {
                        workspace_write_keys.push((key.slug.clone(), secret.clone()));
                    }
                }
            }
            for (_, slug, secret) in report.generated_write_keys {
                workspace_write_keys.push((slug, secret));
            }
        }
        let event_log = command_state.event_log.clone();
        let readiness = projector::WorkersReadiness { health: runtime.health(), pool: projector_pool };
        api::live_load::publish(pool.clone());
        let ops = api::ops::Ops::new(pool.clone(), Some(Arc::new(readiness)));
        let address = (settings.http.host.as_str(), settings.http.port);
        let served = command_state.clone();
        let server = ApiServer::bind(
            address,
            settings.server_timeouts(),
            ops,
            query_service::reference::configure,
            move |config| {
                config.app_data(served.clone()).app_data(query_state.clone());
                command_service::configure(config);
                query_service::configure(config);
            },
        )?;
        // The listener is this process's: no earlier process in its slot is alive.
        let slot =
            platform::liveness::slot(settings.instance.as_deref(), "platform", settings.http.port, server.port());
        command_state.beat.fills(slot);
        let inbound = match settings.inbound.port {
            Some(port) => {
                Some(projector::inbound::Listener::bind(pool.clone(), event_log, &settings.inbound, port).await?)
            }
            None => None,
        };
        let node = Self { server, runtime, inbound, shutdown, workspace_keys, workspace_write_keys };
        if let Some(position) = applied {
            node.wait_for_catalog(&pool, position).await?;
        }
        Ok(node)
    }

    /// Runs the workers until the catalog has `position`, so the keys just applied work.
    async fn wait_for_catalog(&self, pool: &deadpool_postgres::Pool, position: i64) -> anyhow::Result<()> {
        let catalog = projector::read_models::by_name(domain::catalog::CATALOG).context("the catalog read model")?;
        let faults = projector::read_models::runner::Faults::default();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            use projector::read_models::runner::{Outcome, project_batch};
            match project_batch(pool, catalog, 1, "single-node-start", &faults).await? {
                Outcome::CaughtUp { position: reached } if reached >= position => return Ok(()),
                Outcome::Projected { .. } => continue,
                // Another process holds the lease, or the log is not there yet.
                Outcome::CaughtUp { .. } | Outcome::Busy => tokio::time::sleep(Duration::from_millis(50)).await,
            }
            anyhow::ensure!(std::time::Instant::now() < deadline, "the catalog did not catch up with the workspace");
        }
    }

    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// The port of the return-path listener, when it runs.
    pub fn inbound_port(&self) -> Option<u16> {
        self.inbound.as_ref().and_then(|listener| listener.port().ok())
    }

    pub fn handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    /// Serves until SIGTERM or SIGINT, then stops the workers.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let Self { server, runtime, inbound, shutdown, .. } = self;
        let workers = tokio::spawn(runtime.run(shutdown.clone()));
        if let Some(listener) = inbound {
            let stop = shutdown.clone();
            tokio::spawn(async move {
                if let Err(error) = listener.serve(stop).await {
                    tracing::error!(error = %format!("{error:#}"), "the inbound listener stopped");
                }
            });
        }
        let served = server.run_until_stopped().await;
        shutdown.cancel();
        let _ = workers.await;
        served
    }
}
