//! The projector process: `migrate`, `run` (follow the log) or `rebuild <name>`.

use clap::{Parser, Subcommand};
use projector::Projection;
use shared::settings::Settings;

#[derive(Parser)]
#[command(about = "Follows the event log and builds the read models")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply the log migrations and create the first version of every read model.
    Migrate,
    /// Follow the log until stopped.
    Run,
    /// Rebuild a read model from position 0 beside the live one, then switch readers to it.
    Rebuild { name: String },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shared::telemetry::init("info");
    let cli = Cli::parse();
    let settings = Settings::from_env()?;
    let pool = shared::db::pool(settings.database_url.expose(), 4)?;
    match cli.command {
        Command::Migrate => projector::migrate(&pool).await,
        Command::Run => {
            let worker = format!("projector-{}", std::process::id());
            let provider = shared::ai::AiProvider::new(&settings.ai)?;
            projector::daemon::run(
                pool,
                settings.database_url.expose().to_owned(),
                worker,
                settings.erasure_blocked_after,
                provider,
                async {
                    let _ = tokio::signal::ctrl_c().await;
                },
            )
            .await;
            Ok(())
        }
        Command::Rebuild { name } => {
            let projection = Projection::parse(&name).ok_or_else(|| {
                anyhow::anyhow!("unknown read model {name:?}; known: catalog, records, suppressions, deletions, events")
            })?;
            let report = projector::rebuild::rebuild(&pool, projection, |line| println!("{line}")).await?;
            println!("rebuilt {} events in {:.2}s", report.events, report.elapsed.as_secs_f64());
            Ok(())
        }
    }
}
