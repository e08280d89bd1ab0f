//! Single-node mode: the command service's and the query service's routes behind one base
//! URL, with the projector running in the same process. For development and the demo; the
//! split deployment (separate processes behind nginx, routing by method) is in `deploy/`.

use std::time::Duration;

use anyhow::Context;
use shared::http::ApiServer;
use shared::readmodel::ReadModels;
use shared::settings::Settings;

pub struct SingleNode {
    server: ApiServer,
    /// Keys with a secret in the applied workspace file: `(name, secret)`.
    pub workspace_keys: Vec<(String, String)>,
}

impl SingleNode {
    /// Migrates, starts the projector, applies `workspace` (if any) and binds the server.
    pub async fn build(settings: Settings, workspace: Option<&str>) -> anyhow::Result<Self> {
        let database_url = settings.database_url.expose().to_owned();
        let pool = shared::db::pool(&database_url, settings.database_pool_size)?;
        projector::migrate(&pool).await.context("migrating")?;
        let projector_pool = shared::db::pool(&database_url, 4)?;
        let worker = format!("single-node-{}", std::process::id());
        let provider = shared::ai::AiProvider::new(&settings.ai)?;
        tokio::spawn(projector::daemon::run(
            projector_pool,
            database_url.clone(),
            worker,
            settings.erasure_blocked_after,
            provider,
            std::future::pending(),
        ));
        let read_models = ReadModels::start(pool.clone(), database_url);
        let command_state = command_service::State::new(settings.clone(), pool.clone(), read_models.clone());
        let query_state = query_service::State::new(settings.clone(), pool.clone(), read_models);
        let mut workspace_keys = Vec::new();
        if let Some(text) = workspace {
            let parsed = command_service::authoring::parse(text)?;
            let report = command_service::authoring::apply(&pool, &command_state.event_log, &parsed).await?;
            command_service::authoring::wait_for_catalog(&pool, report.position, Duration::from_secs(30)).await?;
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
        }
        let server = ApiServer::bind(&settings.host, settings.port, move |config| {
            config.app_data(command_state.clone()).app_data(query_state.clone());
            command_service::configure(config);
            query_service::configure(config);
        })?;
        Ok(Self { server, workspace_keys })
    }

    pub fn port(&self) -> u16 {
        self.server.port()
    }

    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.run_until_stopped().await
    }
}
