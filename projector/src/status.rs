//! `projector status`: how a running system is doing, read from its database (and, when
//! named, from the operations endpoints of its projector processes): the log's head; every
//! read model and checkpointed worker with its lag and health; open dead letters; the email
//! outbox, webhook deliveries by webhook and due timers; broadcast and workflow runs in
//! progress; the database's size. Text for a person, `--json` for scripts; the exit status
//! says whether anything needs attention.

use std::time::Duration;

use anyhow::Context;
use deadpool_postgres::GenericClient;
use serde::Serialize;
use serde_json::Value;

/// A read model or worker whose position has not moved for this long, behind an event
/// recorded at least this long ago, is reported `stalled`.
const STALLED_AFTER: Duration = Duration::from_secs(30);

/// Workers whose checkpoint is not a log position, so they have no lag: the eraser counts the
/// deletions it completed there (its backlog is the open deletions, reported on their own),
/// maintenance keeps the time of its last run.
const NOT_LOG_POSITIONS: [&str; 2] = [crate::workers::eraser::LEASE, crate::workers::maintenance::LEASE];

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub log_head: i64,
    /// Seconds since the last event was recorded (null for an empty log).
    pub last_event_age_seconds: Option<f64>,
    pub read_models: Vec<Follower>,
    pub workers: Vec<Follower>,
    pub dead_letters: Vec<DeadLetters>,
    pub email_outbox: Vec<Count>,
    /// Opens and clicks taken in and not yet in the log, and the oldest's age in seconds.
    pub engagement_inbox: Inbox,
    pub webhook_backlog: Vec<WebhookBacklog>,
    pub timers: Timers,
    pub broadcast_runs: Vec<Value>,
    pub workflow_runs: Vec<Count>,
    /// Record deletions not completed yet, by state (`pending`, `blocked`).
    pub record_deletions: Vec<Count>,
    /// Messages of the Segment-compatible ingest not applied in the last 24 hours (listed by
    /// `GET /v1/ingest-failures`).
    pub ingest_failures: i64,
    pub database_bytes: i64,
    pub largest_tables: Vec<Table>,
    /// What each named projector process reports on `/health/ready`.
    pub processes: Vec<Value>,
    /// What needs attention; empty when all is well.
    pub problems: Vec<String>,
}

/// A read-model version or a checkpointed worker following the log.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Follower {
    pub name: String,
    /// Read models: the version and its status (`live`, `building`, `halted`).
    pub version: Option<i32>,
    pub status: Option<String>,
    pub position: i64,
    /// Events between its position and the head; null for a worker whose checkpoint is not a
    /// log position (the eraser and maintenance).
    pub lag: Option<i64>,
    pub seconds_since_progress: f64,
    /// `ok`, `catching_up`, `stalled` or `halted`.
    pub health: &'static str,
}

#[derive(Debug, Serialize)]
pub struct DeadLetters {
    pub name: String,
    pub open: i64,
}

#[derive(Debug, Serialize)]
pub struct Count {
    pub key: String,
    pub count: i64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Inbox {
    pub pending: i64,
    pub oldest_seconds: Option<f64>,
}

/// An inbox row older than this means the `engagement` worker is not keeping up.
const INBOX_LATE_SECONDS: f64 = 60.0;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookBacklog {
    pub webhook_id: String,
    pub pending: i64,
    pub oldest_seconds: f64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Timers {
    pub total: i64,
    pub due: i64,
}

#[derive(Debug, Serialize)]
pub struct Table {
    pub name: String,
    pub bytes: i64,
}

/// `idle`: seconds since the position last moved; `behind`: seconds since the first event
/// beyond it was recorded. A follower that rested while nothing happened is not stalled the
/// moment an event arrives: it is only once that event has waited too.
fn health(status: Option<&str>, lag: i64, idle: f64, behind: Option<f64>) -> &'static str {
    let waited = idle.min(behind.unwrap_or(idle));
    match status {
        Some("halted") => "halted",
        _ if lag <= 0 => "ok",
        _ if waited >= STALLED_AFTER.as_secs_f64() => "stalled",
        _ => "catching_up",
    }
}

/// Reads the status of the system whose database `client` is connected to; `processes` are
/// the operations origins (`http://host:port`) of projector processes to ask as well.
pub async fn read(client: &impl GenericClient, processes: &[String]) -> anyhow::Result<Status> {
    let head: i64 = client.query_one("SELECT position FROM log_head", &[]).await?.get(0);
    let last_event_age_seconds: Option<f64> = client
        .query_one(
            "SELECT extract(epoch FROM clock_timestamp() - recorded_at)::float8 FROM events
             WHERE position = (SELECT position FROM log_head)",
            &[],
        )
        .await
        .ok()
        .map(|row| row.get(0));
    let follower = |row: &tokio_postgres::Row, version: Option<i32>, status: Option<String>| {
        let (name, position, idle): (String, i64, f64) = (row.get("name"), row.get("position"), row.get("idle"));
        let behind: Option<f64> = row.get("behind");
        let follows_the_log = !NOT_LOG_POSITIONS.contains(&name.as_str());
        let lag = (follows_the_log && position <= head).then_some(head - position);
        Follower {
            name,
            health: health(status.as_deref(), lag.unwrap_or(0), idle, behind),
            version,
            status,
            position,
            lag,
            seconds_since_progress: idle,
        }
    };
    let read_models = client
        .query(
            "SELECT name, version, status, p.position,
                    extract(epoch FROM now() - updated_at)::float8 AS idle,
                    (SELECT extract(epoch FROM clock_timestamp() - recorded_at)::float8 FROM events
                     WHERE events.position = p.position + 1) AS behind
             FROM projections p WHERE status <> 'retired' ORDER BY name, version",
            &[],
        )
        .await?
        .iter()
        .map(|row| follower(row, Some(row.get("version")), Some(row.get("status"))))
        .collect::<Vec<_>>();
    let workers = client
        .query(
            "SELECT name, w.position, extract(epoch FROM now() - updated_at)::float8 AS idle,
                    (SELECT extract(epoch FROM clock_timestamp() - recorded_at)::float8 FROM events
                     WHERE events.position = w.position + 1) AS behind
             FROM worker_checkpoints w ORDER BY name",
            &[],
        )
        .await?
        .iter()
        .map(|row| follower(row, None, None))
        .collect::<Vec<_>>();
    let dead_letters = crate::read_models::quarantine::list_open(client).await?.into_iter().fold(
        Vec::<DeadLetters>::new(),
        |mut counts, letter| {
            match counts.iter_mut().find(|count| count.name == letter.name) {
                Some(count) => count.open += 1,
                None => counts.push(DeadLetters { name: letter.name, open: 1 }),
            }
            counts
        },
    );
    let counts = |rows: Vec<tokio_postgres::Row>| -> Vec<Count> {
        rows.iter().map(|row| Count { key: row.get(0), count: row.get(1) }).collect()
    };
    let email_outbox =
        counts(client.query("SELECT state, count(*) FROM email_outbox GROUP BY state ORDER BY state", &[]).await?);
    let engagement_inbox = client
        .query_one(
            "SELECT count(*), (extract(epoch FROM clock_timestamp()) * 1000 - min(at_ms))::float8 / 1000
             FROM engagement_inbox",
            &[],
        )
        .await
        .map(|row| Inbox { pending: row.get(0), oldest_seconds: row.get(1) })?;
    let webhook_backlog = client
        .query(
            "SELECT webhook_id, count(*), extract(epoch FROM now() - min(created_at))::float8
             FROM webhook_deliveries WHERE state = 'pending'
             GROUP BY webhook_id ORDER BY count(*) DESC LIMIT 20",
            &[],
        )
        .await?
        .iter()
        .map(|row| WebhookBacklog { webhook_id: row.get(0), pending: row.get(1), oldest_seconds: row.get(2) })
        .collect();
    let timers = client
        .query_one("SELECT count(*), count(*) FILTER (WHERE due_at <= now()) FROM timers", &[])
        .await
        .map(|row| Timers { total: row.get(0), due: row.get(1) })?;
    let broadcast_runs = client
        .query(
            "SELECT json_build_object(
                 'runId', r.run_id, 'broadcastId', r.broadcast_id, 'status', r.status,
                 'startAt', r.start_at, 'startedAt', r.started_at,
                 'recipients', (SELECT json_object_agg(state, n) FROM
                     (SELECT state, count(*) AS n FROM broadcast_recipients WHERE run_id = r.run_id GROUP BY state) s))
             FROM broadcast_runs r WHERE r.status IN ('scheduled', 'sending') ORDER BY r.start_at",
            &[],
        )
        .await?
        .iter()
        .map(|row| row.get::<_, Value>(0))
        .collect();
    let workflow_runs = counts(
        client
            .query(
                "SELECT status, count(*) FROM workflow_runs
                 WHERE status IN ('waiting', 'running', 'sleeping') GROUP BY status ORDER BY status",
                &[],
            )
            .await?,
    );
    let record_deletions = counts(
        client
            .query(
                "SELECT state, count(*) FROM record_deletions WHERE state <> 'completed' GROUP BY state ORDER BY state",
                &[],
            )
            .await?,
    );
    let ingest_failures = reads::ingest::recent_count(client).await?;
    let database_bytes: i64 = client.query_one("SELECT pg_database_size(current_database())", &[]).await?.get(0);
    let largest_tables = client
        .query(
            "SELECT n.nspname || '.' || c.relname, pg_total_relation_size(c.oid)
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE c.relkind = 'r' AND n.nspname NOT IN ('pg_catalog', 'information_schema')
             ORDER BY 2 DESC LIMIT 5",
            &[],
        )
        .await?
        .iter()
        .map(|row| Table { name: row.get(0), bytes: row.get(1) })
        .collect();
    let mut status = Status {
        log_head: head,
        last_event_age_seconds,
        read_models,
        workers,
        dead_letters,
        email_outbox,
        engagement_inbox,
        webhook_backlog,
        timers,
        broadcast_runs,
        workflow_runs,
        record_deletions,
        ingest_failures,
        database_bytes,
        largest_tables,
        processes: Vec::new(),
        problems: Vec::new(),
    };
    for origin in processes {
        status.processes.push(ask(origin).await);
    }
    status.problems = problems(&status);
    Ok(status)
}

/// A projector process's `/health/ready` report, or what went wrong asking for it.
async fn ask(origin: &str) -> Value {
    let url = format!("{}/health/ready", origin.trim_end_matches('/'));
    let answer = async {
        let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
        let response = client.get(&url).send().await?;
        let ready = response.status().is_success();
        let report: Value = response.json().await?;
        anyhow::Ok(serde_json::json!({"origin": origin, "ready": ready, "report": report}))
    };
    answer
        .await
        .unwrap_or_else(|error| serde_json::json!({"origin": origin, "ready": false, "error": error.to_string()}))
}

fn problems(status: &Status) -> Vec<String> {
    let mut problems = Vec::new();
    for follower in status.read_models.iter().chain(&status.workers) {
        if matches!(follower.health, "halted" | "stalled") {
            let lag = follower.lag.unwrap_or(0);
            problems.push(format!("{} is {} {lag} events behind the head", follower.name, follower.health));
        }
    }
    for blocked in status.record_deletions.iter().filter(|count| count.key == "blocked") {
        problems
            .push(format!("{} record deletions are blocked (GET /record-deletions/{{operationId}})", blocked.count));
    }
    if let Some(oldest) = status.engagement_inbox.oldest_seconds.filter(|oldest| *oldest > INBOX_LATE_SECONDS) {
        problems.push(format!(
            "{} opens and clicks wait in engagement_inbox, the oldest {oldest:.0} s (is an engagement worker running?)",
            status.engagement_inbox.pending
        ));
    }
    for letters in &status.dead_letters {
        problems
            .push(format!("{} holds {} open dead letters (projector dead-letters list)", letters.name, letters.open));
    }
    if status.ingest_failures > 0 {
        problems.push(format!(
            "{} ingest messages were not applied in the last 24 hours (GET /v1/ingest-failures says why)",
            status.ingest_failures
        ));
    }
    for process in &status.processes {
        if process["ready"] != true {
            problems.push(format!("projector process {} is not ready", process["origin"]));
        }
    }
    problems
}

/// The status as text for a person.
pub fn render(status: &Status) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let age = status.last_event_age_seconds.map_or("empty".to_owned(), |age| format!("last event {age:.0} s ago"));
    let _ = writeln!(out, "log head {} ({age})", status.log_head);
    let _ = writeln!(out, "\nread models (name, version, status, lag, health):");
    for model in &status.read_models {
        let _ = writeln!(
            out,
            "  {:<28} v{:<3} {:<9} lag {:<8} {}",
            model.name,
            model.version.unwrap_or(0),
            model.status.as_deref().unwrap_or(""),
            model.lag.map_or("-".to_owned(), |lag| lag.to_string()),
            model.health
        );
    }
    let _ = writeln!(out, "\nworkers (name, lag, health):");
    for worker in &status.workers {
        let lag = worker.lag.map_or("-".to_owned(), |lag| lag.to_string());
        let _ = writeln!(out, "  {:<40} lag {lag:<8} {}", worker.name, worker.health);
    }
    let letters: i64 = status.dead_letters.iter().map(|letters| letters.open).sum();
    let _ = writeln!(out, "\ndead letters: {letters}");
    for letters in &status.dead_letters {
        let _ = writeln!(out, "  {:<28} {}", letters.name, letters.open);
    }
    let outbox: Vec<String> =
        status.email_outbox.iter().map(|count| format!("{} {}", count.key, count.count)).collect();
    let _ = writeln!(out, "\nemail outbox: {}", if outbox.is_empty() { "empty".to_owned() } else { outbox.join(", ") });
    let inbox = &status.engagement_inbox;
    let _ = writeln!(
        out,
        "engagement inbox: {} waiting{}",
        inbox.pending,
        inbox.oldest_seconds.map_or(String::new(), |oldest| format!(", the oldest {oldest:.1} s"))
    );
    let pending: i64 = status.webhook_backlog.iter().map(|backlog| backlog.pending).sum();
    let _ = writeln!(out, "webhook deliveries pending: {pending}");
    for backlog in &status.webhook_backlog {
        let _ =
            writeln!(out, "  {:<40} {} (oldest {:.0} s)", backlog.webhook_id, backlog.pending, backlog.oldest_seconds);
    }
    let _ = writeln!(out, "timers: {} ({} due)", status.timers.total, status.timers.due);
    let _ = writeln!(out, "\nbroadcast runs in progress: {}", status.broadcast_runs.len());
    for run in &status.broadcast_runs {
        let _ = writeln!(out, "  {} of {} {}: {}", run["runId"], run["broadcastId"], run["status"], run["recipients"]);
    }
    let runs: Vec<String> = status.workflow_runs.iter().map(|count| format!("{} {}", count.key, count.count)).collect();
    let _ = writeln!(
        out,
        "workflow runs in progress: {}",
        if runs.is_empty() { "none".to_owned() } else { runs.join(", ") }
    );
    let deletions: Vec<String> =
        status.record_deletions.iter().map(|count| format!("{} {}", count.key, count.count)).collect();
    let _ = writeln!(
        out,
        "record deletions open: {}",
        if deletions.is_empty() { "none".to_owned() } else { deletions.join(", ") }
    );
    let _ = writeln!(out, "ingest messages not applied (24 h): {}", status.ingest_failures);
    let _ = writeln!(out, "\ndatabase: {}", megabytes(status.database_bytes));
    for table in &status.largest_tables {
        let _ = writeln!(out, "  {:<40} {}", table.name, megabytes(table.bytes));
    }
    for process in &status.processes {
        let _ = writeln!(out, "\nprojector process {}: ready {}", process["origin"], process["ready"]);
        if let Some(error) = process["error"].as_str() {
            let _ = writeln!(out, "  {error}");
        }
        if let Some(workers) = process["report"]["process"]["workers"].as_object() {
            for (name, worker) in workers {
                let failing = worker["failingSince"].as_str().map_or(String::new(), |since| {
                    format!(", failing since {since}: {}", worker["lastError"].as_str().unwrap_or(""))
                });
                let lag = worker["lag"].as_i64().map_or(String::new(), |lag| format!(", lag {lag}"));
                let _ = writeln!(
                    out,
                    "  {name:<40} {} steps, {} failures{lag}{failing}",
                    worker["steps"], worker["failures"]
                );
            }
        }
    }
    match status.problems.as_slice() {
        [] => {
            let _ = writeln!(out, "\nall well");
        }
        problems => {
            let _ = writeln!(out, "\nneeds attention:");
            for problem in problems {
                let _ = writeln!(out, "  - {problem}");
            }
        }
    }
    out
}

fn megabytes(bytes: i64) -> String {
    format!("{:.1} MB", bytes as f64 / 1_048_576.0)
}

/// Connects with `database_url` and reads the status.
pub(crate) async fn read_from(database_url: &str, processes: &[String]) -> anyhow::Result<Status> {
    let pool = platform::db::pool(database_url, 1)?;
    let client = pool.get().await.context("connecting to the database")?;
    read(&client, processes).await
}

#[cfg(test)]
mod tests {
    use super::health;

    #[test]
    fn a_follower_is_stalled_only_once_the_event_it_lacks_has_waited() {
        // At the head, or halted: whatever the times.
        assert_eq!(health(Some("live"), 0, 3600.0, None), "ok");
        assert_eq!(health(Some("halted"), 5, 0.0, Some(0.0)), "halted");
        // Rested for an hour while nothing happened; an event has just arrived.
        assert_eq!(health(Some("live"), 1, 3600.0, Some(0.2)), "catching_up");
        // That event has waited a minute: stalled.
        assert_eq!(health(Some("live"), 1, 3600.0, Some(60.0)), "stalled");
        // Moving, though far behind: catching up.
        assert_eq!(health(None, 5000, 1.0, Some(600.0)), "catching_up");
    }
}
