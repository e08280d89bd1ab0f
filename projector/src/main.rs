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
    /// Events a read model could not apply: list them, or retry them after a fix.
    DeadLetters {
        #[command(subcommand)]
        action: DeadLetterAction,
    },
}

#[derive(Subcommand)]
enum DeadLetterAction {
    /// List the open dead letters of every live and building read-model version.
    List,
    /// Apply the held events of a read model's quarantined spaces again, in order.
    Retry {
        name: String,
        /// Only this space (its id; an empty string for events without a space).
        #[arg(long)]
        space: Option<String>,
    },
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
        Command::DeadLetters { action: DeadLetterAction::List } => {
            let client = pool.get().await?;
            let open = projector::quarantine::list_open(&client).await?;
            for letter in &open {
                println!(
                    "{} v{} position {} space {:?} {} failed at {} (retried {} times): {}",
                    letter.name,
                    letter.version,
                    letter.position,
                    letter.space_key,
                    letter.event_type,
                    letter.failed_at,
                    letter.retries,
                    letter.error
                );
            }
            println!("{} open dead letters", open.len());
            Ok(())
        }
        Command::DeadLetters { action: DeadLetterAction::Retry { name, space } } => {
            let report = projector::quarantine::retry(&pool, parse_projection(&name)?, space.as_deref()).await?;
            println!(
                "retried {} quarantined spaces ({} held events); {} dead letters still open",
                report.spaces, report.events, report.still_dead
            );
            Ok(())
        }
        Command::Rebuild { name } => {
            let projection = parse_projection(&name)?;
            let report = projector::rebuild::rebuild(&pool, projection, |line| println!("{line}")).await?;
            println!("rebuilt {} events in {:.2}s", report.events, report.elapsed.as_secs_f64());
            Ok(())
        }
    }
}

fn parse_projection(name: &str) -> anyhow::Result<Projection> {
    Projection::parse(name).ok_or_else(|| {
        anyhow::anyhow!("unknown read model {name:?}; known: catalog, records, suppressions, deletions, events")
    })
}
