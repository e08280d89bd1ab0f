//! The command service process: `serve`, or `apply <workspace.json>` (`command_service::cli`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use command_service::Application;

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
    Apply(command_service::cli::Apply),
    Import(command_service::imports::cli::Import),
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    let settings = platform::process::start("info")?;
    match cli.command {
        Command::Serve => {
            let application = Application::build(settings).await?;
            tracing::info!(port = application.port(), "command service listening");
            application.run_until_stopped().await?;
        }
        Command::Apply(arguments) => {
            // The replay is the workflow engine's: the `platform` binary carries both.
            anyhow::ensure!(
                arguments.replay().is_none(),
                "--replay runs in the platform binary (scripts/platform apply FILE --dry-run --replay 30d)"
            );
            command_service::cli::apply(arguments, &settings).await?;
        }
        Command::Import(arguments) => return Ok(command_service::imports::cli::import(arguments, &settings).await),
    }
    Ok(ExitCode::SUCCESS)
}
