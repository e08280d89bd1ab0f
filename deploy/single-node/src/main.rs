//! `platform`: the one binary of the quick start. With no subcommand (or `serve`) it runs the
//! whole system in one process and prints the base URL and the workspace's keys; its other
//! subcommands are the operator commands of `command_service::cli` and `projector::cli`, so a
//! user has all of them after `scripts/start` (through `scripts/platform`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use single_node::SingleNode;

#[derive(Parser)]
#[command(
    name = "platform",
    about = "The whole API in one process (the default), and the operator commands",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(flatten)]
    serve: Serve,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve both route sets and run the projector's workers in one process (the default).
    Serve(Serve),
    /// Apply a workspace file to the system's log (idempotent); a running system follows it
    /// without a restart.
    Apply(command_service::cli::Apply),
    /// Import a CSV or NDJSON file into a contact or object schema (needs the projector's
    /// imports worker running: `scripts/start` runs it).
    Import(command_service::imports::cli::Import),
    #[command(flatten)]
    Operator(projector::cli::Operator),
}

#[derive(clap::Args)]
struct Serve {
    /// A workspace file to apply at start (idempotent).
    #[arg(long)]
    workspace: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    let settings = platform::process::start("warn")?;
    match cli.command.unwrap_or(Command::Serve(cli.serve)) {
        Command::Serve(serve) => serve_until_stopped(serve, settings).await?,
        Command::Apply(arguments) => {
            let replay = arguments.replay();
            let workflows = command_service::cli::apply(arguments, &settings).await?;
            if let Some(window) = replay {
                let workflows = workflows
                    .into_iter()
                    .map(|planned| (planned.space_id, planned.workflow_id, planned.definition_json))
                    .collect();
                projector::cli::replay(workflows, window, &settings).await?;
            }
        }
        Command::Import(arguments) => return Ok(command_service::imports::cli::import(arguments, &settings).await),
        Command::Operator(command) => return projector::cli::run(command, &settings).await,
    }
    Ok(ExitCode::SUCCESS)
}

async fn serve_until_stopped(serve: Serve, settings: platform::settings::Settings) -> anyhow::Result<()> {
    let workspace = serve.workspace.map(std::fs::read_to_string).transpose()?;
    let node = SingleNode::build(settings.clone(), workspace.as_deref()).await?;
    let (host, port) = (&settings.http.host, node.port());
    println!("Base URL: http://{host}:{port}/v1");
    println!("API reference: http://{host}:{port}/docs");
    if let Some(port) = node.inbound_port() {
        println!("Bounces and complaints (SMTP): {}:{port}", settings.inbound.host);
    }
    for (name, secret) in &node.workspace_keys {
        println!("API key {name}: {secret}");
    }
    for (slug, secret) in &node.workspace_write_keys {
        println!("Write key {slug} (for Segment and RudderStack SDKs, host http://{host}:{port}): {secret}");
    }
    println!("Try: curl -H 'Authorization: Bearer <key>' http://{host}:{port}/v1/me");
    println!(
        "Operator commands: scripts/platform status | apply FILE [--dry-run [--replay 30d]] | import FILE --schema SLUG | rebuild NAME \
         | dead-letters list"
    );
    println!(
        "Change the workspace live (no restart): edit a copy of deploy/demo-workspace.json, then scripts/platform apply FILE"
    );
    node.run_until_stopped().await?;
    Ok(())
}
