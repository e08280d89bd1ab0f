//! The query service process.

use query_service::Application;
use shared::settings::Settings;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shared::telemetry::init("info");
    let application = Application::build(Settings::from_env()?).await?;
    tracing::info!(port = application.port(), "query service listening");
    application.run_until_stopped().await?;
    Ok(())
}
