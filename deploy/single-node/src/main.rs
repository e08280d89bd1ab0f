//! Runs the whole system in one process and prints the base URL and the workspace's keys.

use clap::Parser;
use single_node::SingleNode;

#[derive(Parser)]
#[command(about = "The whole API in one process: both route sets and the projector")]
struct Cli {
    /// A workspace file to apply at start (idempotent).
    #[arg(long)]
    workspace: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let settings = shared::process::start("warn")?;
    let workspace = cli.workspace.map(std::fs::read_to_string).transpose()?;
    let node = SingleNode::build(settings.clone(), workspace.as_deref()).await?;
    println!("Base URL: http://{}:{}/v1", settings.http.host, node.port());
    println!("API reference: http://{}:{}/docs", settings.http.host, node.port());
    if let Some(port) = node.inbound_port() {
        println!("Bounces and complaints (SMTP): {}:{port}", settings.inbound.host);
    }
    for (name, secret) in &node.workspace_keys {
        println!("API key {name}: {secret}");
    }
    println!("Try: curl -H 'Authorization: Bearer <key>' http://{}:{}/v1/me", settings.http.host, node.port());
    node.run_until_stopped().await?;
    Ok(())
}
