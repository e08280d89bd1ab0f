//! Journeys changed while people are in them: a new revision's `inFlight` rule pins, migrates
//! or exits the runs in flight, with real parts (mail into the loopback SMTP sink, the
//! projector's engine as a separate process killed with SIGKILL mid-migration).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::email::{MAIL_KEY, publish_dkim};
use crate::helpers::*;
use crate::smtp_sink::SmtpSink;
use crate::workflows::{post, workflow_id};

/// The mail space's workspace with `workflows`, and room in its allowance for every mail the
/// tests send.
fn workspace(workflows: Value) -> String {
    let mut workspace: Value = serde_json::from_str(&crate::workflows::workspace(workflows)).expect("JSON");
    for space in workspace["spaces"].as_array_mut().expect("spaces") {
        if space["slug"] == "mail" {
            space["emailAllowance"] = json!({"monthly": 100_000});
        }
    }
    workspace.to_string()
}

/// A journey `slug` whose runs wait `wait` in step `wait_id`, then get the `hello` mail.
fn journey(slug: &str, (wait_id, wait): (&str, &str), in_flight: Option<Value>) -> Value {
    let mut journey = json!({
        "slug": slug, "name": slug,
        "steps": [
            {"id": "start", "type": "incoming_webhook", "referenceId": format!("{slug}-hook")},
            {"id": wait_id, "type": "wait", "duration": wait},
            {"id": "mail", "type": "send_email", "template": "hello"},
        ]
    });
    if let Some(rule) = in_flight {
        journey["inFlight"] = rule;
    }
    journey
}

/// Starts `count` runs of `slug`'s journey, 50 at a time; answers their ids.
async fn start_runs(app: &TestApp, slug: &str, count: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for chunk in (0..count).collect::<Vec<_>>().chunks(50) {
        let requests = chunk.iter().map(|index| async move {
            let body = json!({"contact": {"email": format!("{slug}-{index:04}@example.com"), "firstName": "R"}});
            let started =
                post(app, &format!("/workflows/{slug}-hook"), Some(&format!("{slug}-{index}")), Some(&body)).await;
            assert_eq!(started.status, 202, "{:?}", started.body);
            started.body["data"]["id"].as_str().expect("a run id").to_owned()
        });
        ids.extend(futures_util::future::join_all(requests).await);
    }
    ids
}

/// Waits until `sql` (a count) answers `expected`.
async fn wait_until(app: &TestApp, sql: &str, expected: i64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let got = app.query_i64(sql).await;
        if got == expected {
            return;
        }
        if Instant::now() >= deadline {
            let runs = app
                .query_strings(
                    "SELECT workflow_id || ' ' || status || ' r' || revision || ' m' || coalesce(migrate_to::text, '-')
                         || ' at ' || coalesce(step_id, '-') || ': ' || count(*)
                     FROM workflow_runs GROUP BY workflow_id, status, revision, migrate_to, step_id",
                )
                .await;
            let marked = app
                .query_strings(
                    "SELECT e.stream_id || ' v' || e.stream_version || ' ' || e.event_type || ' at ' || e.position
                     FROM events e JOIN workflow_runs r ON e.stream_id = 'workflow-run-' || r.run_id
                     WHERE r.migrate_to IS NOT NULL ORDER BY e.position LIMIT 20",
                )
                .await;
            let leases = app
                .query_strings(
                    "SELECT run_id || ' lease ' || coalesce(lease_token::text, '-') || ' until ' ||
                         coalesce(lease_until::text, '-') || ' due ' || coalesce(due_at::text, '-') || ' now ' ||
                         clock_timestamp()::text || ' in flight ' || coalesce(in_flight::text, '-')
                     FROM workflow_runs WHERE migrate_to IS NOT NULL",
                )
                .await;
            let controls = app
                .query_strings(
                    "SELECT workflow_id || ' moved_to ' || coalesce(moved_to::text, '-') FROM workflow_controls",
                )
                .await;
            let authoring = app
                .query_strings(
                    "SELECT stream_id || ' v' || stream_version || ' at ' || position FROM events
                     WHERE stream_id LIKE 'authoring/workflow/%' ORDER BY position",
                )
                .await;
            panic!(
                "{sql}: {got}, not {expected}; the runs: {runs:#?}; marked runs' events: {marked:#?}; controls: \
                 {controls:?}; definitions: {authoring:?}; leases: {leases:#?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the outbox has handed off every email (each ends `sent` or `unknown`), so the
/// log stops growing and the read models can catch up with it.
async fn settle_outbox(app: &TestApp) {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let open = app.query_i64("SELECT count(*) FROM email_outbox WHERE state IN ('pending', 'attempting')").await;
        if open == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{open} emails are still being handed off");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn runs_at(workflow_id: &str, condition: &str) -> String {
    format!("SELECT count(*) FROM workflow_runs WHERE workflow_id = '{workflow_id}' AND {condition}")
}

/// Applies `text`, answering the apply's refusal as text.
async fn try_apply(app: &TestApp, text: &str) -> Result<command_service::authoring::ApplyReport, String> {
    let workspace = command_service::authoring::parse(text).map_err(|error| format!("{error:#}"))?;
    let event_log = platform::log::EventLog::start(app.pool.clone(), 4);
    let rules = command_service::authoring::Rules { allow_loopback_webhooks: true };
    command_service::authoring::apply(&app.pool, &event_log, &workspace, rules)
        .await
        .map_err(|error| format!("{error:#}"))
}

/// The read model's history records of `workflow_id`'s runs with `status`, by step.
async fn history_statuses(app: &TestApp, workflow_id: &str, status: &str) -> Vec<String> {
    app.wait_for_projections().await;
    let version =
        app.query_i64("SELECT version::bigint FROM projections WHERE name = 'workflows' AND status = 'live'").await;
    app.query_strings(&format!(
        "SELECT h.step_id || ': ' || count(*) FROM rm_workflows_v{version}.history h
         JOIN workflow_runs r USING (run_id)
         WHERE r.workflow_id = '{workflow_id}' AND h.status = '{status}' GROUP BY h.step_id ORDER BY 1"
    ))
    .await
}

#[tokio::test]
async fn a_thousand_waiting_runs_move_to_a_migrated_revision_while_a_pinned_journey_keeps_its_own_then_exits() {
    const RUNS: usize = 1_000;
    let sink = SmtpSink::start().await;
    let moved = journey("moved", ("nap", "1h"), None);
    let pinned = journey("pinned", ("nap", "1h"), None);
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let mut env = sink.process_env(2000);
    env.push(("RUST_LOG", "warn,projector::workers::workflows=debug".to_owned()));
    let (_projector, log) = spawn_binary_logged("projector", &["run"], &app.database_url, &env);
    eprintln!("PROJECTOR LOG {}", log.display());
    app.apply_workspace(&workspace(json!([moved, pinned])), true).await;
    publish_dkim(&app, &sink).await;
    let (moved_id, pinned_id) = (workflow_id(&app, "moved").await, workflow_id(&app, "pinned").await);
    start_runs(&app, "moved", RUNS).await;
    start_runs(&app, "pinned", RUNS).await;
    for id in [&moved_id, &pinned_id] {
        wait_until(&app, &runs_at(id, "status = 'sleeping'"), RUNS as i64, Duration::from_secs(60)).await;
    }

    // A migration that leaves the runs' wait without a place is refused, naming it.
    let unmapped = journey("moved", ("short", "1s"), Some(json!({"migrate": {}})));
    let refused = try_apply(&app, &workspace(json!([unmapped, journey("pinned", ("nap", "1h"), None)])))
        .await
        .expect_err("nap holds runs and has no place");
    assert!(refused.contains("\"nap\" of revision 1 holds 1000 open run(s)"), "{refused}");
    assert_eq!(app.query_i64(&runs_at(&moved_id, "revision = 1 AND migrate_to IS NULL")).await, RUNS as i64);

    // Revision 2 of both: the moved journey maps its one-hour wait to a one-second one planned
    // again from when each run entered it; the pinned one shortens its wait too, and pins.
    let migrate = json!({"migrate": {"steps": {"nap": "short"}, "replan": ["short"]}});
    let text =
        workspace(json!([journey("moved", ("short", "1s"), Some(migrate)), journey("pinned", ("short", "1s"), None)]));
    let report = try_apply(&app, &text).await.expect("the migration applies");
    // A run requested at once may be decided on the catalog before the apply reached it: it
    // starts on revision 1 and moves too.
    let body = json!({"contact": {"email": "at-once@example.com", "firstName": "A"}});
    let at_once = post(&app, "/workflows/moved-hook", Some("at-once"), Some(&body)).await;
    assert_eq!(at_once.status, 202, "{:?}", at_once.body);
    let said = report.runs_in_flight.join("\n");
    assert!(said.contains("\"moved\" revision 2: 1000 run(s) in flight move"), "{said}");
    assert!(said.contains("1000 at nap on revision 1 → short, wait planned again"), "{said}");
    assert!(said.contains("\"pinned\" revision 2: 1000 run(s) in flight stay on revision(s) 1"), "{said}");

    // Every moved run finishes on revision 2, having sent its mail once; the pinned runs sleep on.
    wait_until(
        &app,
        &runs_at(&moved_id, "status = 'completed' AND revision = 2"),
        RUNS as i64 + 1,
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(app.query_i64(&runs_at(&moved_id, "migrate_to IS NOT NULL")).await, 0);
    // One mail per moved run, handed off once (sent, or unknown where a hand-off's answer was
    // lost), none delivered twice.
    settle_outbox(&app).await;
    let settled = "SELECT count(*) FROM email_outbox WHERE state IN ('sent', 'unknown')";
    assert_eq!(app.query_i64(settled).await, RUNS as i64 + 1, "one mail per moved run");
    assert_eq!(app.query_i64("SELECT count(*) FROM email_outbox").await, RUNS as i64 + 1);
    let mut ids = sink.message_ids().await;
    let delivered = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), delivered, "no mail was delivered twice");
    // The run requested at once started with its request: in revision 1's wait when the
    // trigger read the catalog before the apply, and then it moved from there too.
    let at_once_moved = if at_once.body["data"]["revision"] == 1 { 1 } else { 0 };
    let migrated = format!("nap: {}", RUNS + at_once_moved);
    assert_eq!(history_statuses(&app, &moved_id, "migrated").await, [migrated]);
    assert_eq!(history_statuses(&app, &moved_id, "completed").await, ["mail: 1001", "short: 1001", "start: 1001"]);
    assert_eq!(app.query_i64(&runs_at(&pinned_id, "status = 'sleeping' AND revision = 1")).await, RUNS as i64);
    assert_eq!(app.query_i64(&runs_at(&pinned_id, "migrate_to IS NOT NULL")).await, 0);

    // Once the catalog has it, a new run of the pinned journey takes revision 2 (and its
    // one-second wait).
    command_service::authoring::wait_for_catalog(&app.pool, report.position, Duration::from_secs(20))
        .await
        .expect("the catalog catches up");
    let body = json!({"contact": {"email": "late@example.com", "firstName": "L"}});
    let late = post(&app, "/workflows/pinned-hook", Some("late"), Some(&body)).await;
    assert_eq!(late.status, 202, "{:?}", late.body);
    let late_id = late.body["data"]["id"].as_str().expect("run id").to_owned();
    wait_until(
        &app,
        &format!(
            "SELECT count(*) FROM workflow_runs WHERE run_id = '{late_id}' AND revision = 2 AND status = 'completed'"
        ),
        1,
        Duration::from_secs(30),
    )
    .await;

    // Revision 3 of the pinned journey exits the runs still on revision 1.
    let text = workspace(json!([
        journey("moved", ("short", "1s"), Some(json!({"migrate": {"steps": {"nap": "short"}, "replan": ["short"]}}))),
        journey("pinned", ("short", "2s"), Some(json!("exit")))
    ]));
    let report = try_apply(&app, &text).await.expect("the exit applies");
    assert!(
        report.runs_in_flight.join("\n").contains("1000 run(s) in flight end, exited"),
        "{:?}",
        report.runs_in_flight
    );
    wait_until(&app, &runs_at(&pinned_id, "status = 'exited' AND revision = 1"), RUNS as i64, Duration::from_secs(120))
        .await;
    assert_eq!(history_statuses(&app, &pinned_id, "exited").await, ["nap: 1000"]);
    let run_id = app
        .query_strings(&format!(
            "SELECT run_id FROM workflow_runs WHERE workflow_id = '{pinned_id}' AND status = 'exited' LIMIT 1"
        ))
        .await
        .remove(0);
    let run = app.get(&format!("/workflows/{pinned_id}/runs/{run_id}"), MAIL_KEY).await;
    assert_eq!(run.body["data"]["status"], "exited", "{:?}", run.body);
    assert_eq!(run.body["data"]["error"]["code"], "workflow_revised", "{:?}", run.body);
    settle_outbox(&app).await;
    assert_eq!(
        app.query_i64("SELECT count(*) FROM email_outbox").await,
        RUNS as i64 + 2,
        "the exited runs sent nothing"
    );

    // The reads say so: the pinned journey's first revision ended by the exit, the moved
    // journey's first revision drained.
    let stats = app.get(&format!("/workflows/{pinned_id}/stats"), MAIL_KEY).await;
    assert_eq!(stats.body["data"]["byRevision"]["1"]["runs"]["exited"], json!(RUNS), "{:?}", stats.body);
    let revisions = app.get(&format!("/workflows/{moved_id}/revisions"), MAIL_KEY).await;
    let states: Vec<(Value, Value, Value)> = revisions.body["data"]
        .as_array()
        .expect("revisions")
        .iter()
        .map(|revision| (revision["revision"].clone(), revision["state"].clone(), revision["openRuns"].clone()))
        .collect();
    assert_eq!(states, [(json!(2), json!("current"), json!(0)), (json!(1), json!("drained"), json!(0))]);
}

#[tokio::test]
async fn kill_9_of_the_engine_mid_migration_and_mid_exit_moves_every_run_once_and_sends_once() {
    const RUNS: usize = 1_000;
    let sink = SmtpSink::start().await;
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let mut env = sink.process_env(2000);
    env.extend([
        ("APP__WORKFLOWS__LEASE_MS", "3000".to_owned()),
        ("RUST_LOG", "warn,projector::workers::workflows=debug".to_owned()),
    ]);
    let (mut projector, mut projector_log) = spawn_binary_logged("projector", &["run"], &app.database_url, &env);
    let text = workspace(json!([journey("moved", ("nap", "1h"), None), journey("ended", ("nap", "1h"), None)]));
    app.apply_workspace(&text, true).await;
    publish_dkim(&app, &sink).await;
    let (moved_id, ended_id) = (workflow_id(&app, "moved").await, workflow_id(&app, "ended").await);
    start_runs(&app, "moved", RUNS).await;
    start_runs(&app, "ended", RUNS).await;
    for id in [&moved_id, &ended_id] {
        wait_until(&app, &runs_at(id, "status = 'sleeping'"), RUNS as i64, Duration::from_secs(60)).await;
    }

    // One apply migrates one journey (each run then sends its mail at once) and exits the
    // other; the engine is killed three times while the runs move.
    let text = workspace(json!([
        journey("moved", ("short", "1s"), Some(json!({"migrate": {"steps": {"nap": "short"}, "replan": ["short"]}}))),
        journey("ended", ("nap", "1h"), Some(json!("exit")))
    ]));
    try_apply(&app, &text).await.expect("applies");
    let mut open_at_kills = Vec::new();
    for _ in 0..3 {
        let pause = 100 + u64::try_from(uuid::Uuid::new_v4().as_u128() % 400).unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        open_at_kills.push(app.query_i64("SELECT count(*) FROM workflow_runs WHERE migrate_to IS NOT NULL").await);
        projector.0.kill().expect("kill -9 the projector");
        let _ = projector.0.wait();
        (projector, projector_log) = spawn_binary_logged("projector", &["run"], &app.database_url, &env);
    }
    assert!(open_at_kills[0] > 0, "the first kill came mid-migration: {open_at_kills:?}");

    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let open = app.query_i64("SELECT count(*) FROM workflow_runs WHERE finished_at IS NULL").await;
        if open == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} runs are unfinished; the projector's log ends:\n{}",
            log_tail(&projector_log, 40)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Every run ends on exactly one revision: the moved ones completed on 2, the ended ones exited on 1.
    assert_eq!(app.query_i64(&runs_at(&moved_id, "status = 'completed' AND revision = 2")).await, RUNS as i64);
    assert_eq!(app.query_i64(&runs_at(&ended_id, "status = 'exited' AND revision = 1")).await, RUNS as i64);
    settle_outbox(&app).await;
    // Each moved once (one `migrated` record per run), each exited once.
    assert_eq!(history_statuses(&app, &moved_id, "migrated").await, [format!("nap: {RUNS}")]);
    assert_eq!(history_statuses(&app, &ended_id, "exited").await, [format!("nap: {RUNS}")]);
    app.wait_for_projections().await;
    let version =
        app.query_i64("SELECT version::bigint FROM projections WHERE name = 'workflows' AND status = 'live'").await;
    let most = app
        .query_i64(&format!(
            "SELECT COALESCE(max(n), 0) FROM (SELECT count(*) AS n FROM rm_workflows_v{version}.history
             WHERE status = 'migrated' GROUP BY run_id) c"
        ))
        .await;
    assert_eq!(most, 1, "no run moved twice");

    // Each mail was handed off once: sent or unknown, never two.
    let settled = app.query_i64("SELECT count(*) FROM email_outbox WHERE state IN ('sent', 'unknown')").await;
    assert_eq!(settled, RUNS as i64, "one email per moved run, none for the exited ones");
    let mut ids = sink.message_ids().await;
    let delivered = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), delivered, "no email was delivered twice");
    let _ = projector.0.kill();
}
