//! The command service process: `serve`, or `apply <workspace.json>` (the operator CLI).

use std::time::Duration;

use clap::{Parser, Subcommand};
use command_service::{Application, authoring};

#[derive(Parser)]
#[command(about = "Serves the API's writes and applies workspace files")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the write endpoints.
    Serve,
    /// Apply a workspace file through the event log (idempotent).
    Apply {
        file: std::path::PathBuf,
        /// Wait until the catalog read model has the changes (needs a running projector).
        #[arg(long)]
        wait: bool,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let settings = shared::process::start("info")?;
    match cli.command {
        Command::Serve => {
            let application = Application::build(settings).await?;
            tracing::info!(port = application.port(), "command service listening");
            application.run_until_stopped().await?;
        }
        Command::Apply { file, wait } => {
            let text = std::fs::read_to_string(&file)?;
            let workspace = authoring::parse(&text)?;
            let pool = shared::db::pool(settings.database_url()?, 2)?;
            let event_log = shared::log::EventLog::start(pool.clone(), 1);
            let report = authoring::apply(&pool, &event_log, &workspace).await?;
            println!("applied {} events (log position {})", report.events, report.position);
            for (email, name, secret) in &report.generated_keys {
                println!("generated key {name:?} for {email}: {secret}  (shown once; only its hash is stored)");
            }
            for (webhook_id, vendor, secret) in &report.generated_webhook_secrets {
                println!("webhook {webhook_id} of {vendor} signs with {secret}  (shown once; give it to {vendor})");
            }
            for (workflow_id, secret) in &report.generated_workflow_secrets {
                println!("workflow {workflow_id} signs its webhook calls with {secret}  (shown once)");
            }
            if wait && report.position > 0 {
                authoring::wait_for_catalog(&pool, report.position, Duration::from_secs(30)).await?;
            }
        }
    }
    Ok(())
}
