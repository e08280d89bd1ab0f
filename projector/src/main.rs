//! The projector process: `run` (the workers), `inbound` (the return-path SMTP listener), and
//! the operator commands of `projector::cli` (`migrate`, `rebuild <name>`, `dead-letters
//! list|retry`, `status`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Follows the event log: builds the read models and runs the background workers")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the workers (`APP__PROJECTOR__WORKERS`) until SIGTERM or SIGINT.
    Run,
    /// Receive the bounces and complaints that come back to the return paths over SMTP
    /// (`APP__INBOUND__*`) until SIGTERM or SIGINT.
    Inbound,
    #[command(flatten)]
    Operator(projector::cli::Operator),
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    let settings = platform::process::start("info")?;
    match cli.command {
        Command::Run => {
            let application = projector::Application::build(&settings).await?;
            tracing::info!(port = application.port(), "projector running; operations endpoints listening");
            application.run_until_stopped().await?;
        }
        Command::Inbound => {
            let inbound = projector::inbound::Inbound::build(&settings).await?;
            tracing::info!(port = inbound.port()?, ops_port = inbound.ops_port(), "inbound listener running");
            inbound.run_until_stopped().await?;
        }
        Command::Operator(command) => return projector::cli::run(command, &settings).await,
    }
    Ok(ExitCode::SUCCESS)
}
