//! The query service process.

use query_service::Application;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = platform::process::start("info")?;
    let application = Application::build(settings).await?;
    tracing::info!(port = application.port(), "query service listening");
    application.run_until_stopped().await?;
    Ok(())
}
