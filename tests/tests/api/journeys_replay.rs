//! A dry run of a journey against the log (`apply --dry-run --replay`): the engine's decision
//! replayed over the window a live journey ran in tells what it did, step by step, send by
//! send and skip by gate, and writes nothing; a changed draft tells what it would have done.

use std::time::Duration;

use platform::settings::Settings;
use serde_json::{Value, json};

use crate::email::{MAIL_KEY, test_email};
use crate::helpers::*;
use crate::smtp_sink::SmtpSink;
use crate::workflows::{app_with, workflow_id, workspace};

/// A journey entered by a purchase (one run at a time per contact): the contact joins the
/// newsletter's topic, gets the newsletter, waits `nap`, and gets it again.
fn journey(nap: &str) -> Value {
    json!([{
        "slug": "buyers", "name": "Buyers",
        "triggers": [{"event": "purchase", "reentry": "once_at_a_time"}],
        "steps": [
            {"id": "start", "type": "incoming_webhook", "referenceId": "buyers-hook", "next": "join"},
            {"id": "join", "type": "subscribe", "topic": "news", "next": "mail"},
            {"id": "mail", "type": "send_email", "template": "newsletter", "next": "nap"},
            {"id": "nap", "type": "wait", "duration": nap, "next": "again"},
            {"id": "again", "type": "send_email", "template": "newsletter", "next": null}
        ]
    }])
}

/// Replays the workflows `text` defines or changes, as `platform apply FILE --dry-run --replay`
/// does, over `[from_ms, now]`.
async fn replay(
    app: &TestApp,
    settings: &Settings,
    text: &str,
    from_ms: i64,
) -> std::collections::BTreeMap<String, projector::workers::workflows::replay::Report> {
    use projector::workers::workflows::replay;
    let workspace = command_service::authoring::parse(text).expect("the file parses");
    let rules = command_service::authoring::Rules { allow_loopback_webhooks: true };
    let planned = command_service::authoring::plan(&app.pool, &workspace, rules).await.expect("the plan");
    let mut reports = std::collections::BTreeMap::new();
    for workflow in planned.workflows() {
        let definition: domain::workflows::WorkflowDef =
            serde_json::from_str(&workflow.definition_json).expect("a definition");
        let request = replay::Request {
            space_id: &workflow.space_id,
            workflow_id: &workflow.workflow_id,
            definition: &definition,
            from_ms,
            to_ms: platform::time::now_millis(),
            until_position: None,
        };
        let (report, _) = replay::replay(&app.pool, settings, request).await.expect("the replay");
        reports.insert(definition.slug.clone(), report);
    }
    reports
}

#[tokio::test]
async fn a_replay_of_a_live_journey_tells_what_it_did_and_a_draft_what_it_would_have_done() {
    let sink = SmtpSink::start().await;
    let from_ms = platform::time::now_millis() - 1_000;
    let app = app_with(&sink, journey("1h")).await;
    let workflow = workflow_id(&app, "buyers").await;
    let mut settings = Settings::for_database(&app.database_url);
    settings.email = test_email(&sink);

    // Six buyers who consented, three who did not (the consent gate skips their mail), one
    // whose address is suppressed; one consenting buyer buys twice while in the journey (held
    // back: one run at a time).
    let suppressed = app
        .post("/contacts/suppressions", MAIL_KEY, &json!({"identifier": "sup@example.com", "reason": "manual"}))
        .await;
    assert_eq!(suppressed.status, 201, "{:?}", suppressed.body);
    let mut contacts = Vec::new();
    for index in 0..10 {
        let (email, consent) = match index {
            0..6 => (format!("yes{index}@example.com"), true),
            6..9 => (format!("no{index}@example.com"), false),
            _ => ("sup@example.com".to_owned(), true),
        };
        let made = app
            .post(
                "/schemas/people/records",
                MAIL_KEY,
                &json!({"email": email, "firstName": "B", "newsConsent": consent}),
            )
            .await;
        assert_eq!(made.status, 201, "{:?}", made.body);
        contacts.push(made.body["data"]["id"].as_str().expect("id").to_owned());
    }
    for contact in contacts.iter().chain([&contacts[0]]) {
        let fired = app.post("/events/purchase", MAIL_KEY, &json!({"contactId": contact, "amount": 12})).await;
        assert_eq!(fired.status, 202, "{:?}", fired.body);
    }
    // The live journey: ten runs, each at its hour's wait after the first mail.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let sleeping =
        format!("SELECT count(*) FROM workflow_runs WHERE workflow_id = '{workflow}' AND status = 'sleeping'");
    while app.query_i64(&sleeping).await < 10 {
        assert!(std::time::Instant::now() < deadline, "the live runs did not reach their wait");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    app.wait_for_workers().await;
    let stats = app.get(&format!("/workflows/{workflow}/stats"), MAIL_KEY).await;
    assert_eq!(stats.status, 200, "{:?}", stats.body);
    let step = |id: &str| {
        stats.body["data"]["steps"].as_array().and_then(|steps| steps.iter().find(|step| step["stepId"] == id)).cloned()
    };
    let live_mail = step("mail").expect("the mail step");
    let live_sent = app.query_i64("SELECT count(*) FROM email_outbox").await;
    assert_eq!(live_sent, 6, "one mail to each consenting buyer who is not suppressed");

    // The live definition replayed over the window: what the journey did, and nothing written.
    let head = app.query_i64("SELECT max(position) FROM events").await;
    let reports = replay(&app, &settings, &workspace(journey("1h")), from_ms).await;
    assert!(reports.is_empty(), "an unchanged file defines nothing new: {reports:?}");
    let draft = workspace(journey("2s"));
    let text_same = {
        // The same journey under another slug: a new workflow, with the live one's definition.
        let mut same = journey("1h");
        same[0]["slug"] = json!("buyers-copy");
        workspace(same)
    };
    let copy = replay(&app, &settings, &text_same, from_ms).await;
    assert_eq!(copy.len(), 1, "{copy:?}");
    let copy = &copy["buyers-copy"];
    assert_eq!(copy.entered, 10, "{copy:?}");
    assert_eq!(copy.held_back, 1, "{copy:?}");
    assert_eq!(copy.at_step, [("nap".to_owned(), 10)].into_iter().collect(), "{copy:?}");
    assert_eq!(copy.sends as i64, live_sent, "{copy:?}");
    assert_eq!(copy.skips, [("consent".to_owned(), 3), ("suppressed".to_owned(), 1)].into_iter().collect());
    // Step by step, as the live journey's stats count them.
    let mail = &copy.steps["mail"];
    assert_eq!(json!(mail.started), live_mail["entered"], "{copy:?} against {live_mail}");
    assert_eq!(json!(mail.completed), live_mail["completed"], "{copy:?} against {live_mail}");
    assert_eq!(json!(mail.skipped), live_mail["skipped"]["total"], "{copy:?} against {live_mail}");
    let by_reason: Value = copy.skips.iter().map(|(gate, count)| (gate.clone(), json!(count))).collect();
    assert_eq!(by_reason, live_mail["skipped"]["byReason"], "{copy:?} against {live_mail}");
    assert_eq!(app.query_i64("SELECT max(position) FROM events").await, head, "the replay wrote nothing");
    assert_eq!(app.query_i64("SELECT count(*) FROM email_outbox").await, live_sent);

    // A draft with a two-second wait: every run would have finished, with a second mail to each
    // consenting buyer (the newsletter's caps are none here).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let reports = replay(&app, &settings, &draft, from_ms).await;
    assert_eq!(reports.len(), 1, "{reports:?}");
    let changed = &reports["buyers"];
    assert_eq!((changed.entered, changed.completed), (10, 10), "{changed:?}");
    assert!(changed.at_step.is_empty(), "{changed:?}");
    assert_eq!(changed.sends, 12, "{changed:?}");
    assert_eq!(changed.skips, [("consent".to_owned(), 6), ("suppressed".to_owned(), 2)].into_iter().collect());
    assert_eq!(changed.steps["again"].started, 10, "{changed:?}");
    assert_eq!(app.query_i64("SELECT max(position) FROM events").await, head, "the replay wrote nothing");
    assert_eq!(app.query_i64(&sleeping).await, 10, "the live runs are as they were");
}

/// Waits until replay `replay_id` of `workflow` is no longer `running`; answers it.
async fn finished_replay(app: &TestApp, workflow: &str, replay_id: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let got = app.get(&format!("/workflows/{workflow}/replays/{replay_id}"), MAIL_KEY).await;
        assert_eq!(got.status, 200, "{:?}", got.body);
        if got.body["data"]["status"] != "running" {
            assert_conforms("WorkflowReplay", std::slice::from_ref(&got.body["data"]));
            return got.body["data"].clone();
        }
        assert!(std::time::Instant::now() < deadline, "the replay did not finish: {:?}", got.body);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn the_replays_endpoint_reports_what_the_current_revision_did_and_refuses_bad_requests() {
    let sink = SmtpSink::start().await;
    let app = app_with(&sink, journey("1h")).await;
    let workflow = workflow_id(&app, "buyers").await;
    let mut contacts = Vec::new();
    for (index, consent) in [true, true, false].into_iter().enumerate() {
        let body = json!({"email": format!("api{index}@example.com"), "firstName": "A", "newsConsent": consent});
        let made = app.post("/schemas/people/records", MAIL_KEY, &body).await;
        assert_eq!(made.status, 201, "{:?}", made.body);
        contacts.push(made.body["data"]["id"].as_str().expect("id").to_owned());
    }
    for contact in &contacts {
        let fired = app.post("/events/purchase", MAIL_KEY, &json!({"contactId": contact, "amount": 3})).await;
        assert_eq!(fired.status, 202, "{:?}", fired.body);
    }
    let sleeping =
        format!("SELECT count(*) FROM workflow_runs WHERE workflow_id = '{workflow}' AND status = 'sleeping'");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while app.query_i64(&sleeping).await < 3 {
        assert!(std::time::Instant::now() < deadline, "the live runs did not reach their wait");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Asked for by slug, answered running at once, then with its report.
    let asked = app.post("/workflows/buyers/replays", MAIL_KEY, &json!({"window": "1h"})).await;
    assert_eq!(asked.status, 202, "{:?}", asked.body);
    assert_conforms("WorkflowReplay", std::slice::from_ref(&asked.body["data"]));
    assert_eq!(
        (asked.body["data"]["status"].as_str(), &asked.body["data"]["workflowId"]),
        (Some("running"), &json!(workflow))
    );
    let replay_id = asked.body["data"]["id"].as_str().expect("a replay id").to_owned();
    let done = finished_replay(&app, &workflow, &replay_id).await;
    assert_eq!(done["status"], "completed", "{done}");
    let report = &done["report"];
    assert_eq!((&report["entered"], &report["sends"]), (&json!(3), &json!(2)), "{report}");
    assert_eq!((&report["atStep"], &report["skips"]), (&json!({"nap": 3}), &json!({"consent": 1})), "{report}");
    assert_eq!(app.query_i64("SELECT count(*) FROM email_outbox").await, 2, "the replay sent nothing");
    // The same report by the workflow's id; the window's default is 30 days.
    let by_id = app.get(&format!("/workflows/{workflow}/replays/{replay_id}"), MAIL_KEY).await;
    assert_eq!(by_id.body["data"], done);
    let default = app.post(&format!("/workflows/{workflow}/replays"), MAIL_KEY, &json!({})).await;
    assert_eq!(default.status, 202, "{:?}", default.body);
    let (from, to) = (&default.body["data"]["from"], &default.body["data"]["to"]);
    let span = chrono::DateTime::parse_from_rfc3339(to.as_str().expect("to")).expect("a time")
        - chrono::DateTime::parse_from_rfc3339(from.as_str().expect("from")).expect("a time");
    assert_eq!(span.num_days(), 30, "{from} to {to}");
    // A window past a year and a day covers that much, as the answer's `from` says.
    let long = app.post(&format!("/workflows/{workflow}/replays"), MAIL_KEY, &json!({"window": "400d"})).await;
    assert_eq!(long.status, 202, "{:?}", long.body);
    let (from, to) = (&long.body["data"]["from"], &long.body["data"]["to"]);
    let span = chrono::DateTime::parse_from_rfc3339(to.as_str().expect("to")).expect("a time")
        - chrono::DateTime::parse_from_rfc3339(from.as_str().expect("from")).expect("a time");
    assert_eq!(span.num_days(), 366, "{from} to {to}");

    // Bad requests get the contract's envelope; nothing is asked for.
    let streams = "SELECT count(*) FROM events WHERE event_type = 'WorkflowReplayRequested.v1'";
    let before = app.query_i64(streams).await;
    for (body, code) in [
        (json!({"window": "030d"}), "invalid_field"),
        (json!({"window": "30 d"}), "invalid_field"),
        (json!({"window": "soon"}), "invalid_field"),
        (json!({"window": 30}), "invalid_field"),
        (json!({"days": 3}), "unknown_field"),
    ] {
        let refused = app.post(&format!("/workflows/{workflow}/replays"), MAIL_KEY, &body).await;
        assert_eq!((refused.status, refused.code().as_str()), (400, Some(code)), "{body}: {:?}", refused.body);
    }
    let missing = app.post("/workflows/wf_missing/replays", MAIL_KEY, &json!({})).await;
    assert_eq!((missing.status, missing.code().as_str()), (404, Some("workflow_not_found")), "{:?}", missing.body);
    assert_eq!(app.query_i64(streams).await, before);
    let unknown = app.get(&format!("/workflows/{workflow}/replays/wrp_missing"), MAIL_KEY).await;
    assert_eq!((unknown.status, unknown.code().as_str()), (404, Some("workflow_replay_not_found")));
    // Another workflow's path does not find it.
    let elsewhere = app.get(&format!("/workflows/wf_missing/replays/{replay_id}"), MAIL_KEY).await;
    assert_eq!((elsewhere.status, elsewhere.code().as_str()), (404, Some("workflow_not_found")));
}

#[tokio::test]
async fn a_replay_asked_for_survives_kill_9_of_the_projector_and_reports_once() {
    let sink = SmtpSink::start().await;
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let env = sink.process_env(2000);
    let (mut projector, _log) = spawn_binary_logged("projector", &["run"], &app.database_url, &env);
    app.apply_workspace(&workspace(journey("1h")), true).await;
    for index in 0..200 {
        let body = json!({"email": format!("k{index}@example.com"), "firstName": "K", "newsConsent": true});
        let made = app.post("/schemas/people/records", MAIL_KEY, &body).await;
        assert_eq!(made.status, 201, "{:?}", made.body);
        let contact = made.body["data"]["id"].as_str().expect("id").to_owned();
        let fired = app.post("/events/purchase", MAIL_KEY, &json!({"contactId": contact, "amount": 1})).await;
        assert_eq!(fired.status, 202, "{:?}", fired.body);
    }
    // The projector is down when the request is acknowledged; the next one is killed with
    // SIGKILL at a random moment of its first second (before, or while, the replay runs); the
    // one after reports it, once.
    projector.0.kill().expect("kill -9 the projector");
    let _ = projector.0.wait();
    let asked = app.post("/workflows/buyers/replays", MAIL_KEY, &json!({"window": "1h"})).await;
    assert_eq!(asked.status, 202, "{:?}", asked.body);
    let replay_id = asked.body["data"]["id"].as_str().expect("a replay id").to_owned();
    let (mut projector, _log) = spawn_binary_logged("projector", &["run"], &app.database_url, &env);
    tokio::time::sleep(Duration::from_millis(rand::random_range(0..1_000))).await;
    projector.0.kill().expect("kill -9 the projector");
    let _ = projector.0.wait();
    let (_projector, _log) = spawn_binary_logged("projector", &["run"], &app.database_url, &env);
    let done = finished_replay(&app, "buyers", &replay_id).await;
    assert_eq!((done["status"].as_str(), &done["report"]["entered"]), (Some("completed"), &json!(200)), "{done}");
    let finished = format!(
        "SELECT count(*) FROM events WHERE stream_id = 'workflow-replay-{replay_id}' AND event_type = 'WorkflowReplayFinished.v1'"
    );
    assert_eq!(app.query_i64(&finished).await, 1, "one report");
}

#[tokio::test]
async fn a_replay_ends_waits_for_events_as_the_live_journey_did() {
    let sink = SmtpSink::start().await;
    // A buyer waits for a second purchase (an hour at most): it thanks those who buy again.
    let journey = json!([{
        "slug": "again", "name": "Again",
        "triggers": [{"event": "purchase", "reentry": "once_at_a_time"}],
        "steps": [
            {"id": "start", "type": "incoming_webhook", "referenceId": "again-hook", "next": "ordered"},
            {"id": "ordered", "type": "wait_for_event", "event": "purchase", "timeout": "1h",
             "onEvent": "thanks", "onTimeout": null},
            {"id": "thanks", "type": "send_email", "template": "hello", "next": null}
        ]
    }]);
    let from_ms = platform::time::now_millis() - 1_000;
    let app = app_with(&sink, journey.clone()).await;
    let workflow = workflow_id(&app, "again").await;
    let mut settings = Settings::for_database(&app.database_url);
    settings.email = test_email(&sink);
    let mut contacts = Vec::new();
    for index in 0..4 {
        let body = json!({"email": format!("again{index}@example.com"), "firstName": "A"});
        let made = app.post("/schemas/people/records", MAIL_KEY, &body).await;
        assert_eq!(made.status, 201, "{:?}", made.body);
        contacts.push(made.body["data"]["id"].as_str().expect("id").to_owned());
    }
    let buy = |contact: String| {
        let app = &app;
        async move {
            let fired = app.post("/events/purchase", MAIL_KEY, &json!({"contactId": contact, "amount": 2})).await;
            assert_eq!(fired.status, 202, "{:?}", fired.body);
        }
    };
    for contact in &contacts {
        buy(contact.clone()).await;
    }
    // Every run is in its wait before two of the buyers buy again.
    let runs = format!("SELECT count(*) FROM workflow_runs WHERE workflow_id = '{workflow}'");
    let sleeping = format!("{runs} AND status = 'sleeping'");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while app.query_i64(&sleeping).await < 4 {
        assert!(std::time::Instant::now() < deadline, "the runs did not reach their wait");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    buy(contacts[0].clone()).await;
    buy(contacts[1].clone()).await;
    let completed = format!("{runs} AND status = 'completed'");
    while app.query_i64(&completed).await < 2 {
        assert!(std::time::Instant::now() < deadline, "the second purchases did not end the waits");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    app.wait_for_workers().await;
    assert_eq!(app.query_i64(&runs).await, 4, "a second purchase while in the journey starts no run");

    // The journey replayed under another slug: the same story.
    let mut copy = journey;
    copy[0]["slug"] = json!("again-copy");
    copy[0]["steps"][0]["referenceId"] = json!("again-copy-hook");
    let reports = replay(&app, &settings, &workspace(copy), from_ms).await;
    let report = &reports["again-copy"];
    assert_eq!((report.entered, report.held_back, report.completed), (4, 2, 2), "{report:?}");
    assert_eq!(report.at_step, [("ordered".to_owned(), 2)].into_iter().collect(), "{report:?}");
    assert_eq!((report.sends, report.steps["thanks"].completed), (2, 2), "{report:?}");
    assert_eq!(report.steps["ordered"].completed, 2, "{report:?}");
}

#[tokio::test]
async fn a_replay_starts_runs_on_segment_entries_as_the_live_journey_did() {
    let sink = SmtpSink::start().await;
    let from_ms = platform::time::now_millis() - 1_000;
    let app = app_with(&sink, json!([])).await;
    let defined = app.post("/segments", MAIL_KEY, &json!({"name": "Adas", "definition": "firstName is Ada"})).await;
    assert_eq!(defined.status, 201, "{:?}", defined.body);
    let segment = defined.body["data"]["id"].as_str().expect("segment id").to_owned();
    let journey = |slug: &str| {
        json!({"slug": slug, "name": slug, "triggers": [{"segment": segment}],
               "steps": [{"id": "start", "type": "incoming_webhook", "referenceId": format!("{slug}-hook"), "next": "nap"},
                         {"id": "nap", "type": "wait", "duration": "1h"}]})
    };
    app.apply_workspace(&workspace(json!([journey("adas")])), true).await;
    let adas = workflow_id(&app, "adas").await;
    app.wait_for_workers().await;
    // Two Adas enter the segment; a Bob does not.
    for (index, name) in ["Ada", "Ada", "Bob"].into_iter().enumerate() {
        let body = json!({"email": format!("seg{index}@example.com"), "firstName": name});
        let made = app.post("/schemas/people/records", MAIL_KEY, &body).await;
        assert_eq!(made.status, 201, "{:?}", made.body);
    }
    let sleeping = format!("SELECT count(*) FROM workflow_runs WHERE workflow_id = '{adas}' AND status = 'sleeping'");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while app.query_i64(&sleeping).await < 2 {
        assert!(std::time::Instant::now() < deadline, "the Adas did not enter the journey");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    app.wait_for_workers().await;
    assert_eq!(app.query_i64(&sleeping).await, 2);

    let reports =
        replay(&app, &settings_for(&app, &sink), &workspace(json!([journey("adas"), journey("adas-copy")])), from_ms)
            .await;
    let copy = &reports["adas-copy"];
    assert_eq!(copy.entered, 2, "{copy:?}");
    assert_eq!(copy.at_step, [("nap".to_owned(), 2)].into_iter().collect(), "{copy:?}");
}

#[tokio::test]
async fn a_replay_starts_runs_on_events_ready_after_their_preparation_with_their_prepared_values() {
    use crate::fake_ai::{FakeAi, Mode};
    let sink = SmtpSink::start().await;
    let fake = FakeAi::start().await;
    fake.set_mode(Mode::Answer(json!("games")));
    // The purchase's category is filled in by the AI provider: its events are ready only once
    // prepared, and the journey branches on the prepared value.
    let journey = |slug: &str| {
        json!({"slug": slug, "name": slug, "triggers": [{"event": "purchase", "reentry": "always"}],
               "steps": [{"id": "start", "type": "incoming_webhook", "referenceId": format!("{slug}-hook"), "next": "route"},
                         {"id": "route", "type": "branch",
                          "arms": [{"condition": "input.event.data.category is games", "next": "mail"}], "default": null},
                         {"id": "mail", "type": "send_email", "template": "hello", "next": null}]})
    };
    let text = |journeys: Value| {
        let mut workspace: Value = serde_json::from_str(&workspace(journeys)).expect("JSON");
        let spaces = workspace["spaces"].as_array_mut().expect("spaces");
        let mail = spaces.iter_mut().find(|space| space["slug"] == "mail").expect("the mail space");
        let schemas = mail["schemas"].as_array_mut().expect("schemas");
        let purchase = schemas.iter_mut().find(|schema| schema["slug"] == "purchase").expect("purchase");
        purchase["attributes"].as_array_mut().expect("attributes").push(json!(
            {"key": "category", "definition": {"type": "string", "autoFill": {"enabled": true, "prompt": "Classify"}}}
        ));
        workspace.to_string()
    };
    let ai =
        platform::settings::AiSettings::openai(&fake.url, "test-model", Some("sk-fake"), Duration::from_millis(2_000));
    let options = Options { email: Some(test_email(&sink)), ai: Some(ai), ..Options::default() };
    let from_ms = platform::time::now_millis() - 1_000;
    let app = TestApp::spawn_with(options).await;
    app.apply_workspace(&text(json!([journey("gamers")])), true).await;
    crate::email::publish_dkim(&app, &sink).await;
    let gamers = workflow_id(&app, "gamers").await;
    for index in 0..3 {
        let body = json!({"email": format!("gamer{index}@example.com"), "firstName": "G"});
        let made = app.post("/schemas/people/records", MAIL_KEY, &body).await;
        assert_eq!(made.status, 201, "{:?}", made.body);
        let contact = made.body["data"]["id"].as_str().expect("id").to_owned();
        let fired = app.post("/events/purchase", MAIL_KEY, &json!({"contactId": contact, "amount": 9})).await;
        assert_eq!(fired.status, 202, "{:?}", fired.body);
        assert_eq!(fired.body["data"]["readinessAtAcceptance"], "pending", "{:?}", fired.body);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let done = format!("SELECT count(*) FROM workflow_runs WHERE workflow_id = '{gamers}' AND status = 'completed'");
    while app.query_i64(&done).await < 3 {
        assert!(std::time::Instant::now() < deadline, "the prepared purchases did not run the journey");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    app.wait_for_workers().await;
    assert_eq!(app.query_i64("SELECT count(*) FROM email_outbox").await, 3, "the live journey took the branch");

    let reports =
        replay(&app, &settings_for(&app, &sink), &text(json!([journey("gamers"), journey("gamers-copy")])), from_ms)
            .await;
    let copy = &reports["gamers-copy"];
    assert_eq!((copy.entered, copy.completed, copy.sends), (3, 3, 3), "{copy:?}");
    assert_eq!(copy.steps["mail"].completed, 3, "the prepared category took the branch: {copy:?}");
}

fn settings_for(app: &TestApp, sink: &SmtpSink) -> Settings {
    let mut settings = Settings::for_database(&app.database_url);
    settings.email = test_email(sink);
    settings
}
