//! The operator's commands against a running system, run as the built binaries:
//! `projector status` (text and `--json`, exit status), `command-service apply --dry-run`
//! (a diff per resource; nothing written, as the log shows) and the plain progress lines of
//! `projector rebuild` and `command-service apply` when their output is not a terminal.

use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::*;

/// Runs a built binary to its end against the app's database.
fn run(app: &TestApp, binary: &str, args: &[&str]) -> Output {
    run_binary(binary, args, &app.database_url)
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

#[tokio::test]
async fn status_reports_every_worker_backlogs_and_size_and_fails_when_something_needs_attention() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let port = free_port();
    let projector =
        spawn_binary("projector", &["run"], &app.database_url, &[("APP__PROJECTOR__PORT", port.to_string())]);
    let origin = format!("http://127.0.0.1:{port}");
    let created = app.create_contact(&json!({"email": "status@x.io"})).await;
    let id = created["id"].as_str().expect("id").to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    while app.get(&format!("/schemas/contacts/records/{id}"), ALPHA_ADMIN).await.status != 200 {
        assert!(Instant::now() < deadline, "the projector caught up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // An erasure: the eraser's checkpoint counts completed deletions, not log positions, so it
    // has no lag (it once read as far behind the head, then stalled).
    let erased = app.create_contact(&json!({"email": "erased-status@x.io"})).await;
    let path = format!("/schemas/contacts/records/{}", erased["id"].as_str().expect("id"));
    let deletion = app.send(app.request(reqwest::Method::DELETE, &path, Some(ALPHA_ADMIN))).await;
    let operation = deletion.body["data"]["operationId"].as_str().expect("an operation").to_owned();
    while app.get(&format!("/record-deletions/{operation}"), ALPHA_ADMIN).await.body["data"]["status"] != "completed" {
        assert!(Instant::now() < deadline, "the erasure completed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.create_contact(&json!({"email": "after-erasure@x.io"})).await;
    app.wait_for_workers().await;
    let head = app.query_i64("SELECT position FROM log_head").await;

    let output = run(&app, "projector", &["status", "--json", "--process", &origin]);
    assert!(output.status.success(), "all well exits 0: {}", text(&output));
    let status: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(status["logHead"], head);
    let models = status["readModels"].as_array().expect("read models");
    assert_eq!(models.len(), projector::read_models::ALL.len(), "{models:?}");
    assert!(models.iter().all(|model| model["lag"] == 0 && model["health"] == "ok"), "{models:?}");
    let workers = status["workers"].as_array().expect("workers");
    assert!(workers.iter().any(|worker| worker["name"] == "preparation"));
    let eraser = workers.iter().find(|worker| worker["name"] == "eraser").expect("the eraser is listed");
    assert_eq!((eraser["lag"].clone(), eraser["health"].clone()), (Value::Null, json!("ok")), "{eraser}");
    assert_eq!(status["recordDeletions"], json!([]));
    assert!(status["databaseBytes"].as_i64().is_some_and(|bytes| bytes > 1_000_000), "{}", status["databaseBytes"]);
    assert_eq!(status["processes"][0]["ready"], true, "{}", status["processes"]);
    assert!(status["processes"][0]["report"]["process"]["workers"]["email_outbox"].is_object());
    assert_eq!(status["problems"], json!([]));
    let output = run(&app, "projector", &["status"]);
    let report = text(&output);
    for section in [
        "log head",
        "read models",
        "workers",
        "dead letters: 0",
        "email outbox",
        "engagement inbox: 0 waiting",
        "webhook deliveries",
        "timers",
        "broadcast runs",
        "workflow runs",
        "record deletions open: none",
        "database:",
        "all well",
    ] {
        assert!(report.contains(section), "{section} in:\n{report}");
    }

    // With the projector gone, writes pile up; a read model that has not moved for a while,
    // behind an event that has waited as long, is stalled, and the status says so and exits 1.
    drop(projector);
    app.create_contact(&json!({"email": "behind@x.io"})).await;
    let aged = |sql: &'static str| {
        let pool = app.pool.clone();
        async move { pool.get().await.expect("client").batch_execute(sql).await.expect("aged") }
    };
    aged("UPDATE projections SET updated_at = now() - interval '5 minutes' WHERE name = 'records'").await;
    let just_behind = run(&app, "projector", &["status"]);
    assert!(text(&just_behind).contains("records"), "{}", text(&just_behind));
    assert!(!text(&just_behind).contains("records is stalled"), "its event has just come: {}", text(&just_behind));
    // The log is append-only; this test's own database lets its trigger go for a moment.
    aged(
        "ALTER TABLE events DISABLE TRIGGER events_no_update_or_delete;
         UPDATE events SET recorded_at = recorded_at - interval '5 minutes'
          WHERE position = (SELECT position FROM log_head);
         ALTER TABLE events ENABLE TRIGGER events_no_update_or_delete;",
    )
    .await;
    // A click taken in two minutes ago and still not in the log: no engagement worker runs.
    app.pool
        .get()
        .await
        .expect("client")
        .execute(
            "INSERT INTO engagement_inbox (email_id, kind, at_ms)
             VALUES ('em_waiting', 'open', (extract(epoch FROM now()) * 1000)::bigint - 120000)",
            &[],
        )
        .await
        .expect("a waiting open");
    let output = run(&app, "projector", &["status", "--process", &origin]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    let report = text(&output);
    assert!(report.contains("needs attention") && report.contains("records is stalled 1 events behind"), "{report}");
    assert!(report.contains(&format!("projector process \"{origin}\" is not ready")), "{report}");
    assert!(report.contains("1 opens and clicks wait in engagement_inbox, the oldest 12"), "{report}");
}

#[tokio::test]
async fn apply_dry_run_prints_a_diff_per_resource_and_writes_nothing() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let mut workspace: Value = serde_json::from_str(WORKSPACE).expect("fixture");
    let space = &mut workspace["spaces"][0];
    space["name"] = json!("Alpha, renamed");
    let attributes = space["schemas"][0]["attributes"].as_array_mut().expect("attributes");
    attributes.push(json!({"key": "dryRunProbe", "name": "Dry run probe", "definition": {"type": "string"}}));
    let file = scratch_dir("dry-run").join("workspace.json");
    std::fs::write(&file, workspace.to_string()).expect("written");
    let file = file.to_str().expect("a UTF-8 path");
    let head = app.query_i64("SELECT position FROM log_head").await;

    let output = run(&app, "command-service", &["apply", "--dry-run", file]);
    assert!(output.status.success(), "{}", text(&output));
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(printed.contains("~ authoring/space/"), "the space is shown as changed:\n{printed}");
    // Events read as indented JSON, a field per line.
    let changed = |sign: char, field: &str| {
        printed.lines().any(|line| line.strip_prefix(sign).is_some_and(|rest| rest.trim_start().starts_with(field)))
    };
    assert!(changed('+', r#""name": "Alpha, renamed","#), "with the new name:\n{printed}");
    assert!(changed('-', r#""name": ""#), "and the old one:\n{printed}");
    assert!(changed('+', r#""key": "dryRunProbe","#), "the new attribute:\n{printed}");
    assert!(printed.contains("events would be appended") && printed.contains("nothing was written"), "{printed}");
    assert_eq!(app.query_i64("SELECT position FROM log_head").await, head, "the dry run appended nothing");

    // The same file applied for real appends exactly what the dry run showed.
    let shown =
        printed.lines().filter(|line| line.starts_with("~ authoring/") || line.starts_with("+ authoring/")).count();
    let output = run(&app, "command-service", &["apply", file]);
    assert!(output.status.success(), "{}", text(&output));
    let applied = text(&output);
    assert!(applied.contains(&format!("appending in one transaction: {shown} of {shown} events")), "{applied}");
    assert_eq!(app.query_i64("SELECT position FROM log_head").await, head + shown as i64);
    let again = run(&app, "command-service", &["apply", "--dry-run", file]);
    assert!(text(&again).contains("dry run: 0 events would be appended"), "{}", text(&again));
}

#[tokio::test]
async fn rebuild_prints_plain_progress_lines_when_not_on_a_terminal() {
    let app = TestApp::spawn().await;
    for index in 0..5 {
        app.create_contact(&json!({"email": format!("rebuild{index}@x.io")})).await;
    }
    app.wait_for_workers().await;
    let head = app.query_i64("SELECT position FROM log_head").await;
    let output = run(&app, "projector", &["rebuild", "records"]);
    assert!(output.status.success(), "{}", text(&output));
    let printed = text(&output);
    assert!(printed.contains(&format!("rebuilding records: {head} of {head} events")), "{printed}");
    assert!(printed.contains("switched readers to records version 2"), "{printed}");
    // The last progress line (with the rebuild's rate) is printed when readers switch, before
    // the retired version's grace period.
    let finished = printed.find(&format!("rebuilding records: {head} of {head} events"));
    let dropped = printed.find("dropped retired version");
    assert!(finished.is_some() && dropped.is_some() && finished < dropped, "{printed}");
    assert!(!printed.contains('\r') && !printed.contains("\u{1b}["), "no terminal drawing in a pipe: {printed:?}");
    // The retired version's row stays beside the new one; starting a process again (which
    // migrates and sees every read model initialized) still works.
    let versions = app.query_i64("SELECT count(*) FROM projections WHERE name = 'records'").await;
    assert_eq!(versions, 2, "the live version and the retired one");
    let migrated = run(&app, "projector", &["migrate"]);
    assert!(migrated.status.success(), "a start after a rebuild: {}", text(&migrated));
}
