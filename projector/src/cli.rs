//! The projector's operator commands (`migrate`, `status`, `rebuild`, `dead-letters`) as one
//! clap `Subcommand` and one function, so the `projector` binary and the `platform` binary (what
//! `scripts/start` builds) carry the same commands from one implementation.

use std::process::ExitCode;

use clap::Subcommand;
use platform::settings::Settings;

use crate::read_models;

/// The operator commands that read or repair a system's database; none serves anything.
#[derive(Subcommand)]
pub enum Operator {
    /// Apply the migrations and create the first version of every read model.
    Migrate,
    /// Rebuild a read model from position 0 beside the live one, then switch readers to it.
    Rebuild { name: String },
    /// How the system is doing: every read model's and worker's lag and health, dead letters,
    /// outbox and webhook backlogs, runs in progress, the database's size. Exits 1 when
    /// something needs attention.
    Status {
        /// JSON for scripts instead of text.
        #[arg(long)]
        json: bool,
        /// The operations origin of a projector process (`http://127.0.0.1:9100`) to ask for
        /// its workers' health as well; repeat for each process.
        #[arg(long = "process")]
        processes: Vec<String>,
    },
    /// Events a read model could not apply: list them, or retry them after a fix.
    DeadLetters {
        #[command(subcommand)]
        action: DeadLetterAction,
    },
}

#[derive(Subcommand)]
pub enum DeadLetterAction {
    /// List the open dead letters of every live and building read-model version and worker.
    List,
    /// Apply the held events of a read model's quarantined spaces again, in order.
    Retry {
        name: String,
        /// Only this space (its id; an empty string for events without a space).
        #[arg(long)]
        space: Option<String>,
    },
}

/// Runs one operator command to its end; the exit code is 1 when `status` finds a problem.
pub async fn run(command: Operator, settings: &Settings) -> anyhow::Result<ExitCode> {
    match command {
        Operator::Migrate => {
            let pool = platform::db::pool(settings.database_url()?, 2)?;
            crate::migrate(&pool).await?;
        }
        Operator::DeadLetters { action: DeadLetterAction::List } => {
            let pool = platform::db::pool(settings.database_url()?, 2)?;
            let client = pool.get().await?;
            let open = read_models::quarantine::list_open(&client).await?;
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
        }
        Operator::DeadLetters { action: DeadLetterAction::Retry { name, space } } => {
            let pool = platform::db::pool(settings.database_url()?, 2)?;
            let report = read_models::quarantine::retry(&pool, read_model(&name)?, space.as_deref()).await?;
            println!(
                "retried {} quarantined spaces ({} held events); {} dead letters still open",
                report.spaces, report.events, report.still_dead
            );
        }
        Operator::Status { json, processes } => {
            let status = crate::status::read_from(settings.database_url()?, &processes).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print!("{}", crate::status::render(&status));
            }
            if !status.problems.is_empty() {
                return Ok(ExitCode::FAILURE);
            }
        }
        Operator::Rebuild { name } => {
            let pool = platform::db::pool(settings.database_url()?, 4)?;
            // The progress ends when readers switch, so its rate is the rebuild's own, not
            // diluted by the retired version's grace period that follows.
            let mut progress = Some(platform::progress::Progress::new(&format!("rebuilding {name}"), 0, "events"));
            let mut done = 0;
            let live_yield = settings.imports.live_yield;
            let report =
                read_models::rebuild::rebuild_yielding(&pool, read_model(&name)?, live_yield, |step| match step {
                    read_models::rebuild::Step::Note(line) => match &progress {
                        Some(bar) => bar.note(line),
                        None => eprintln!("{line}"),
                    },
                    read_models::rebuild::Step::Switched => {
                        if let Some(bar) = progress.take() {
                            bar.finish(done);
                        }
                    }
                    read_models::rebuild::Step::At { position, head } => {
                        done = position.max(0).unsigned_abs();
                        if let Some(bar) = progress.as_mut() {
                            bar.set_total(head.max(position).max(0).unsigned_abs());
                            bar.set(done);
                        }
                    }
                })
                .await?;
            if let Some(bar) = progress {
                bar.finish(done);
            }
            println!(
                "rebuilt {} events in {:.2}s ({:.2}s of it yielding to live requests)",
                report.events,
                report.elapsed.as_secs_f64(),
                report.yielded.as_secs_f64()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn read_model(name: &str) -> anyhow::Result<&'static dyn read_models::ReadModel> {
    read_models::by_name(name)
        .ok_or_else(|| anyhow::anyhow!("unknown read model {name:?}; known: {}", read_models::names()))
}

/// Replays each workflow (space, id, definition JSON) against the last `window` of its space's
/// log and prints what it would have done (`platform apply FILE --dry-run --replay 30d`).
pub async fn replay(
    workflows: Vec<(String, String, String)>,
    window: std::time::Duration,
    settings: &Settings,
) -> anyhow::Result<()> {
    use crate::workers::workflows::replay;
    if workflows.is_empty() {
        println!("replay: the file defines or changes no workflow; nothing to replay");
        return Ok(());
    }
    let pool = platform::db::pool(settings.database_url()?, 2)?;
    let to_ms = platform::time::now_millis();
    let from_ms = to_ms - i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    for (space_id, workflow_id, definition_json) in workflows {
        let definition: domain::workflows::WorkflowDef = serde_json::from_str(&definition_json)?;
        let request = replay::Request {
            space_id: &space_id,
            workflow_id: &workflow_id,
            definition: &definition,
            from_ms,
            to_ms,
            until_position: None,
        };
        let (report, elapsed) = replay::replay(&pool, settings, request).await?;
        print!("{}", replay::describe(&definition, &workflow_id, &report, elapsed));
    }
    Ok(())
}
