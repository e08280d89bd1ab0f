//! `apply <workspace.json> [--dry-run [--replay DURATION]] [--wait]`, the operator command of the
//! command service,
//! as clap `Args` and one function, so the `command-service` binary and the `platform` binary
//! (what `scripts/start` builds) carry it from one implementation.

use std::time::Duration;

use platform::settings::Settings;

use crate::authoring;

/// Apply a workspace file through the event log (idempotent). A running system follows it
/// without a restart: every decision checks the catalog revision.
#[derive(clap::Args)]
pub struct Apply {
    file: std::path::PathBuf,
    /// Wait until the catalog read model has the changes (needs a running projector).
    #[arg(long)]
    wait: bool,
    /// Print what the apply would change, stream by stream, and write nothing.
    #[arg(long)]
    dry_run: bool,
    /// With `--dry-run`: replay each workflow the file defines or changes against the last
    /// DURATION of its space's log (`30d`, `12h`, `90m`; at most `366d`), and print what it would
    /// have done.
    /// The `platform` binary runs it (the replay is the engine's).
    #[arg(long, requires = "dry_run", value_name = "DURATION", value_parser = replay_window)]
    replay: Option<Duration>,
}

impl Apply {
    /// The window `--replay` asks for.
    pub fn replay(&self) -> Option<Duration> {
        self.replay
    }
}

/// A window such as `30d`, `12h` or `90m` (`domain::workflows::parse_replay_window`).
fn replay_window(text: &str) -> Result<Duration, String> {
    let ms = domain::workflows::parse_replay_window(text)?;
    Ok(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

/// Plans the workspace file against the log, then prints the plan (`--dry-run`) or appends it.
/// A dry run returns the workflows the file defines or changes (what `--replay` replays).
pub async fn apply(arguments: Apply, settings: &Settings) -> anyhow::Result<Vec<authoring::PlannedWorkflow>> {
    let Apply { file, wait, dry_run, replay: _ } = arguments;
    let text = std::fs::read_to_string(&file)
        .map_err(|error| anyhow::anyhow!("reading the workspace file {}: {error}", file.display()))?;
    let workspace = authoring::parse(&text)?;
    let pool = platform::db::pool(settings.database_url()?, 2)?;
    eprintln!("reading the log's authoring streams and planning {} spaces", workspace.spaces.len());
    let planned = authoring::plan(&pool, &workspace, authoring::Rules::of(settings)).await?;
    if dry_run {
        print_dry_run(&planned);
        return Ok(planned.workflows());
    }
    let resources = planned.resources();
    let event_log = platform::log::EventLog::start(pool.clone(), 1);
    let events = planned.events() as u64;
    let progress = platform::progress::Progress::new("appending in one transaction", events, "events");
    let report = authoring::commit(&event_log, planned).await?;
    progress.finish(events);
    print_resources(&resources, false);
    for line in &report.runs_in_flight {
        println!("{line}");
    }
    println!("applied {} events (log position {})", report.events, report.position);
    for (email, name, secret) in &report.generated_keys {
        println!("generated key {name:?} for {email}: {secret}  (shown once; only its hash is stored)");
    }
    for (space, slug, secret) in &report.generated_write_keys {
        println!("generated write key {slug:?} of space {space}: {secret}  (shown once; only its hash is stored)");
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
    Ok(Vec::new())
}

/// What an apply would append, stream by stream: a new stream with its first event, a changed
/// one as a unified diff of its latest event and the new one.
fn print_dry_run(planned: &authoring::Planned) {
    let changes = planned.changes();
    for change in &changes {
        match &change.before {
            None => {
                println!("+ {} ({}, new)", change.stream_id, change.event_type);
                for line in change.after.lines() {
                    println!("    {line}");
                }
            }
            Some(before) => {
                println!("~ {} ({})", change.stream_id, change.event_type);
                let diff = similar::TextDiff::from_lines(before.as_str(), change.after.as_str());
                print!("{}", diff.unified_diff().context_radius(2).header("in the log", "after the apply"));
            }
        }
    }
    print_resources(&planned.resources(), true);
    let report = &planned.report;
    for (email, name, _) in &report.generated_keys {
        println!("a key {name:?} would be generated for {email}");
    }
    for (space, slug, _) in &report.generated_write_keys {
        println!("a write key {slug:?} of space {space} would get a secret");
    }
    for (webhook_id, vendor, _) in &report.generated_webhook_secrets {
        println!("webhook {webhook_id} of {vendor} would get a signing secret");
    }
    for (workflow_id, _) in &report.generated_workflow_secrets {
        println!("workflow {workflow_id} would get a signing secret");
    }
    for line in &report.runs_in_flight {
        println!("{line}");
    }
    let streams: std::collections::BTreeSet<&str> = changes.iter().map(|change| change.stream_id.as_str()).collect();
    println!("dry run: {} events would be appended to {} streams; nothing was written", changes.len(), streams.len());
}

/// Each resource created, changed or removed, one per line: what happened, its kind, slug and
/// id (the id is what the API's paths take, such as a form's public submit).
fn print_resources(resources: &[authoring::Touched], dry_run: bool) {
    for touched in resources {
        let slug = if touched.slug.is_empty() { String::new() } else { format!(" {:?}", touched.slug) };
        let action = match (dry_run, touched.action) {
            (false, action) => action,
            (true, "created") => "would create",
            (true, "removed") => "would remove",
            (true, _) => "would change",
        };
        println!("{action} {}{slug}: {}", touched.kind, touched.id);
    }
}
