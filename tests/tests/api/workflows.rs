//! Workflows: authored in the workspace file, triggered, paused and unpaused through the API,
//! and run by the projector's engine through every step kind, with real parts: mail into the
//! loopback SMTP sink (DKIM checked), webhook calls into the loopback receiver (signatures
//! checked by the `standardwebhooks` package), events fired through the API.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::email::{MAIL_KEY, mail_workspace, publish_dkim, test_email};
use crate::helpers::*;
use crate::receiver::Receiver;
use crate::smtp_sink::SmtpSink;

const WAIT: Duration = Duration::from_secs(30);
/// The signing secret of the test workflows (`whsec_` and base64 of 32 bytes of 7).
const SECRET: &str = "whsec_BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";

/// The mail space's workspace with a `hello` template and `workflows` added.
pub(crate) fn workspace(workflows: Value) -> String {
    let mut workspace: Value = serde_json::from_str(&mail_workspace(1_000)).expect("the workspace is JSON");
    let spaces = workspace["spaces"].as_array_mut().expect("spaces");
    let mail = spaces.iter_mut().find(|space| space["slug"] == "mail").expect("the mail space");
    mail["templates"].as_array_mut().expect("templates").push(json!({
        "slug": "hello", "name": "Hello", "kind": "transactional", "sender": "hello",
        "subject": "Hello {{ contact.firstName }}", "html": "<p>Hello {{ contact.firstName }}</p>",
        "text": "Hello {{ contact.firstName }}", "data": {"contact": {"schema": "people"}}
    }));
    mail["workflows"] = workflows;
    workspace.to_string()
}

/// An app whose engine sends into `sink` and may call loopback receivers, with `workflows`.
pub(crate) async fn app_with(sink: &SmtpSink, workflows: Value) -> TestApp {
    let options = Options {
        email: Some(test_email(sink)),
        webhooks: Some(platform::settings::WebhookSettings { retry_schedule_ms: vec![100, 100], ..test_webhooks() }),
        ..Options::default()
    };
    let app = TestApp::spawn_with(options).await;
    app.apply_workspace(&workspace(workflows), true).await;
    publish_dkim(&app, sink).await;
    app
}

pub(crate) async fn post(app: &TestApp, path: &str, key: Option<&str>, body: Option<&Value>) -> TestResponse {
    let mut request = app.request(reqwest::Method::POST, path, Some(MAIL_KEY));
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    app.send(request).await
}

pub(crate) async fn workflow_id(app: &TestApp, slug: &str) -> String {
    let list = app.get("/workflows", MAIL_KEY).await;
    assert_eq!(list.status, 200, "{:?}", list.body);
    list.body["data"]
        .as_array()
        .expect("workflows")
        .iter()
        .find(|workflow| workflow["slug"] == slug)
        .and_then(|workflow| workflow["id"].as_str())
        .unwrap_or_else(|| panic!("no workflow {slug}: {:?}", list.body))
        .to_owned()
}

/// Polls a run until `done` holds for it.
async fn wait_for_run(app: &TestApp, workflow_id: &str, run_id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let run = app.get(&format!("/workflows/{workflow_id}/runs/{run_id}"), MAIL_KEY).await;
        assert_eq!(run.status, 200, "{:?}", run.body);
        if done(&run.body["data"]) {
            return run.body["data"].clone();
        }
        assert!(Instant::now() < deadline, "the run did not get there: {}", run.body["data"]);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn finished(run: &Value) -> bool {
    ["completed", "exited", "failed"].contains(&run["status"].as_str().unwrap_or_default())
}

/// `(stepId, type, status)` of each record of a history window.
fn steps(run: &Value) -> Vec<(String, String, String)> {
    run["history"]
        .as_array()
        .expect("history")
        .iter()
        .map(|record| {
            let text = |key: &str| record[key].as_str().unwrap_or_default().to_owned();
            (text("stepId"), text("type"), text("status"))
        })
        .collect()
}

#[tokio::test]
async fn a_journey_runs_every_step_kind_through_real_mail_and_a_real_webhook_receiver() {
    let sink = SmtpSink::start().await;
    let receiver = Receiver::start().await;
    receiver.endpoint("crm", &[SECRET], json!({"status": 200, "body": {"vip": true}})).await;
    let journey = json!([{
        "slug": "journey", "name": "Journey", "signingSecret": SECRET,
        "steps": [
            {"id": "start", "type": "incoming_webhook", "referenceId": "journey-hook", "next": "tag"},
            {"id": "tag", "type": "update_contact", "set": {"firstName": {"input": "name"}}, "next": "join"},
            {"id": "join", "type": "subscribe", "topic": "news", "next": "hello"},
            {"id": "hello", "type": "send_email", "template": "hello", "next": "nap"},
            {"id": "nap", "type": "wait", "duration": "1s", "next": "route"},
            {"id": "route", "type": "branch",
             "arms": [{"condition": "input.plan is pro and subscribed to news", "next": "crm"}], "default": "bye"},
            {"id": "crm", "type": "call_webhook", "url": receiver.url("crm"), "next": "check"},
            {"id": "check", "type": "branch", "arms": [{"condition": "steps.crm.body.vip is true", "next": "await"}],
             "default": "bye"},
            {"id": "await", "type": "wait_for_event", "event": "purchase", "timeout": "1m",
             "onEvent": "leave", "onTimeout": "bye"},
            {"id": "leave", "type": "unsubscribe", "topic": "news", "next": null},
            {"id": "bye", "type": "exit"}
        ]
    }]);
    let app = app_with(&sink, journey).await;
    let workflow = workflow_id(&app, "journey").await;
    let shown = app.get(&format!("/workflows/{workflow}"), MAIL_KEY).await;
    assert_eq!(shown.body["data"]["status"], "published", "{:?}", shown.body);
    assert_eq!(shown.body["data"]["referenceId"], "journey-hook");
    assert!(shown.body["data"].get("signing").is_none(), "the secret is never shown");

    let input = json!({"plan": "pro", "name": "Ada", "contact": {"email": "ada@example.com", "newsConsent": true}});
    let started = post(&app, "/workflows/journey-hook", Some("go-1"), Some(&input)).await;
    assert_eq!(started.status, 202, "{:?}", started.body);
    assert_eq!(started.body["data"]["status"], "waiting");
    assert!(started.header("operation-id").is_some());
    let run_id = started.body["data"]["id"].as_str().expect("run id").to_owned();
    assert!(run_id.starts_with("run_"));
    let contact_id = started.body["data"]["contactId"].as_str().expect("a bound contact").to_owned();
    let replay = post(&app, "/workflows/journey-hook", Some("go-1"), Some(&input)).await;
    assert_eq!((replay.header("idempotent-replay"), &replay.body["data"]["id"]), (Some("true"), &json!(run_id)));

    // The call reaches the receiver, signed, with the run's data.
    let calls = receiver.wait_for("crm", 1, WAIT).await;
    assert_eq!(calls[0]["verifiedWith"], json!([0]), "{}", calls[0]);
    assert_eq!(calls[0]["body"]["type"], "workflow.call");
    assert_eq!(calls[0]["body"]["data"]["runId"], run_id.as_str());
    assert_eq!(calls[0]["body"]["data"]["input"]["plan"], "pro");
    assert_eq!(calls[0]["body"]["data"]["contact"]["firstName"], "Ada");
    // The engine's transitions are not the caller's writes: the read shows them once projected.
    wait_for_run(&app, &workflow, &run_id, |run| run["status"] == "sleeping" && run["currentStepId"] == "await").await;

    // The event it waits for, fired for its contact.
    let fired = app.post("/events/purchase", MAIL_KEY, &json!({"contactId": contact_id, "amount": 12})).await;
    assert_eq!(fired.status, 202, "{:?}", fired.body);
    let run = wait_for_run(&app, &workflow, &run_id, finished).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["stepCount"], 10, "{run}");
    let expected = [
        ("start", "incoming_webhook"),
        ("tag", "update_contact"),
        ("join", "subscribe"),
        ("hello", "send_email"),
        ("nap", "wait"),
        ("route", "branch"),
        ("crm", "call_webhook"),
        ("check", "branch"),
        ("await", "wait_for_event"),
        ("leave", "unsubscribe"),
    ];
    let got = steps(&run);
    assert_eq!(got.len(), expected.len(), "{run}");
    for (index, ((step, kind), (got_step, got_kind, status))) in expected.iter().zip(&got).enumerate() {
        assert_eq!((got_step.as_str(), got_kind.as_str(), status.as_str()), (*step, *kind, "completed"), "{run}");
        assert_eq!(run["history"][index]["index"], index + 1);
        if *kind != "send_email" {
            assert_eq!(run["history"][index]["emailId"], Value::Null, "only a send step names an email: {run}");
        }
    }
    assert_eq!(run["nextHistoryBeforeIndex"], Value::Null);
    // The completed send step names its email, whose story is the one delivered.
    let email_id = run["history"][3]["emailId"].as_str().expect("a completed send step names its email").to_owned();
    let story = app.get(&format!("/emails/{email_id}"), MAIL_KEY).await;
    assert_eq!(story.status, 200, "{:?}", story.body);
    assert_eq!(story.body["data"]["origin"]["workflowId"], workflow.as_str(), "{:?}", story.body);

    // The email went out once, signed; the contact was updated, subscribed and unsubscribed.
    let messages = sink.wait_for(1, WAIT).await;
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0]["rcptTo"][0], "ada@example.com");
    assert_eq!(messages[0]["dkim"]["valid"], true, "{}", messages[0]);
    assert_eq!(messages[0]["headers"]["subject"][0], "Hello Ada");
    let contact = app.get(&format!("/schemas/people/records/{contact_id}"), MAIL_KEY).await;
    assert_eq!(contact.body["data"]["firstName"], "Ada", "{:?}", contact.body);
    let client = app.pool.get().await.expect("client");
    let subscriptions = reads::email::subscriptions(&client, &contact_id).await.expect("subscriptions");
    assert_eq!(subscriptions.values().collect::<Vec<_>>(), ["unsubscribed"]);
    assert_eq!(receiver.received("crm").await.len(), 1, "the call was made once");

    // The journey is in the contact's audit trail.
    let trail = app.get(&format!("/schemas/people/records/{contact_id}/audit-trail?channel=workflow"), MAIL_KEY).await;
    assert_eq!(trail.status, 200, "{:?}", trail.body);
    let entries = trail.body["data"].as_array().expect("entries");
    assert_conforms("AuditTrailEntry", entries);
    // Each of the run's changes, newest first, though a transition is one log event.
    let shown: Vec<(&str, &str)> = entries
        .iter()
        .map(|entry| (entry["type"].as_str().unwrap_or_default(), entry["stepId"].as_str().unwrap_or_default()))
        .collect();
    let mut wanted = vec![("workflow_run_finished", "")];
    wanted.extend(expected.iter().rev().map(|(step, _)| ("workflow_step_finished", *step)));
    wanted.push(("workflow_run_requested", ""));
    assert_eq!(shown, wanted, "{:?}", trail.body);
    let ids: std::collections::BTreeSet<&str> = entries.iter().filter_map(|entry| entry["id"].as_str()).collect();
    assert_eq!(ids.len(), entries.len(), "every entry has an id of its own: {:?}", trail.body);
    // The run's log: one event per transition, not one per change (23 changes here).
    let stream = format!("workflow-run-{run_id}");
    let events = client
        .query("SELECT event_type FROM events WHERE stream_id = $1 ORDER BY stream_version", &[&stream])
        .await
        .expect("the run's events");
    let types: Vec<String> = events.iter().map(|row| row.get(0)).collect();
    assert!(types.len() <= 10, "a transition is one event: {types:?}");
    assert!(types.iter().any(|kind| kind == "WorkflowRunAdvanced.v1"), "{types:?}");
    let runs = app.get(&format!("/workflows/{workflow}/runs?status=completed"), MAIL_KEY).await;
    assert_eq!(runs.body["pagination"]["totalCount"], 1, "{:?}", runs.body);
}

/// A workflow that loops `passes` times through a branch and a `goto` (no effects), then
/// exits; its input's `stop` ends it at once.
/// A run whose first steps need no fact and reach nothing outside is started by its trigger:
/// the request and the first transition in one append (one transaction), the answer shows
/// where it stands, and the engine has not touched its row. One whose first step sends is left
/// to the engine.
#[tokio::test]
async fn a_run_whose_first_steps_need_nothing_is_started_in_its_triggers_own_write() {
    let sink = SmtpSink::start().await;
    let entry =
        |hook: &str, next: &str| json!({"id": "start", "type": "incoming_webhook", "referenceId": hook, "next": next});
    let journeys = json!([
        {"slug": "napper", "name": "Napper", "steps": [
            entry("nap-hook", "nap"), {"id": "nap", "type": "wait", "duration": "1h", "next": "done"},
            {"id": "done", "type": "exit"}]},
        {"slug": "quitter", "name": "Quitter", "steps": [
            entry("quit-hook", "route"),
            {"id": "route", "type": "branch", "arms": [{"condition": "input.plan is pro", "next": "done"}],
             "default": "done"},
            {"id": "done", "type": "exit"}]},
        {"slug": "greeter", "name": "Greeter", "steps": [
            entry("greet-hook", "hello"), {"id": "hello", "type": "send_email", "template": "hello", "next": null}]}
    ]);
    let app = app_with(&sink, journeys).await;
    // What the run's stream holds: each event's type and the transaction that wrote it.
    let written = |run_id: &str| {
        format!(
            "SELECT event_type || ' ' || xmin::text FROM events WHERE stream_id = 'workflow-run-{run_id}' ORDER BY position"
        )
    };

    let napping = post(&app, "/workflows/nap-hook", None, Some(&json!({}))).await;
    assert_eq!(napping.status, 202, "{:?}", napping.body);
    let run = &napping.body["data"];
    assert_eq!(
        (&run["status"], &run["currentStepId"], &run["stepCount"]),
        (&json!("sleeping"), &json!("nap"), &json!(2))
    );
    assert!(run["startedAt"].is_string() && run["finishedAt"].is_null(), "{run}");
    let run_id = run["id"].as_str().expect("run id").to_owned();
    let events = app.query_strings(&written(&run_id)).await;
    let transactions: Vec<&str> = events.iter().filter_map(|event| event.split(' ').nth(1)).collect();
    assert_eq!(events.len(), 2, "the request and its first transition: {events:?}");
    assert!(
        events[0].starts_with("WorkflowRunRequested") && events[1].starts_with("WorkflowRunAdvanced"),
        "{events:?}"
    );
    assert_eq!(transactions[0], transactions[1], "one transaction: {events:?}");
    let row = format!(
        "SELECT status || ' ' || version || ' ' || row_version || ' ' || (due_at > now() + interval '59 minutes')
         FROM workflow_runs WHERE run_id = '{run_id}'"
    );
    assert_eq!(app.query_strings(&row).await, ["sleeping 2 0 true"], "asleep until the wait's end, never moved since");
    let workflow = workflow_id(&app, "napper").await;
    let shown = wait_for_run(&app, &workflow, &run_id, |run| run["status"] == "sleeping").await;
    assert_eq!(
        steps(&shown),
        [
            ("start".into(), "incoming_webhook".into(), "completed".into()),
            ("nap".into(), "wait".into(), "running".into())
        ]
    );

    let quitting = post(&app, "/workflows/quit-hook", None, Some(&json!({"plan": "pro"}))).await;
    let run = &quitting.body["data"];
    assert_eq!((&run["status"], &run["currentStepId"], &run["stepCount"]), (&json!("exited"), &Value::Null, &json!(3)));
    assert!(run["finishedAt"].is_string(), "{run}");
    let quit_id = run["id"].as_str().expect("run id").to_owned();
    let row = format!(
        "SELECT status || ' ' || (due_at IS NULL) || ' ' || (finished_at IS NOT NULL) FROM workflow_runs WHERE run_id = '{quit_id}'"
    );
    assert_eq!(app.query_strings(&row).await, ["exited true true"]);

    // A send needs the contact and the template: the engine decides it.
    let body = json!({"contact": {"email": "greet@example.com", "firstName": "Grace"}});
    let greeting = post(&app, "/workflows/greet-hook", None, Some(&body)).await;
    assert_eq!((&greeting.body["data"]["status"], &greeting.body["data"]["stepCount"]), (&json!("waiting"), &json!(0)));
    let greet_id = greeting.body["data"]["id"].as_str().expect("run id").to_owned();
    let greeter = workflow_id(&app, "greeter").await;
    let done = wait_for_run(&app, &greeter, &greet_id, finished).await;
    assert_eq!(done["status"], "completed", "{done}");
    let events = app.query_strings(&written(&greet_id)).await;
    let transactions: std::collections::BTreeSet<&str> =
        events.iter().filter_map(|event| event.split(' ').nth(1)).collect();
    assert!(transactions.len() >= 2, "requested, then advanced by the engine: {events:?}");
}

fn looper(passes: u32) -> Value {
    json!([{
        "slug": "looper", "name": "Looper",
        "steps": [
            {"id": "start", "type": "incoming_webhook", "referenceId": "loop-hook", "next": "spin"},
            {"id": "spin", "type": "branch", "arms": [{"condition": "input.stop is true", "next": "done"}],
             "default": "again"},
            {"id": "again", "type": "goto", "target": "spin", "maxPasses": passes, "next": "done"},
            {"id": "done", "type": "exit"}
        ]
    }])
}

#[tokio::test]
async fn a_long_loop_is_read_back_window_by_window_down_to_the_first_record() {
    let sink = SmtpSink::start().await;
    let looper = looper(80);
    let app = app_with(&sink, looper).await;
    let workflow = workflow_id(&app, "looper").await;
    let started = post(&app, "/workflows/loop-hook", None, Some(&json!({"stop": false}))).await;
    assert_eq!(started.status, 202, "{:?}", started.body);
    assert_eq!(started.body["data"]["contactId"], Value::Null);
    let run_id = started.body["data"]["id"].as_str().expect("run id").to_owned();
    let run = wait_for_run(&app, &workflow, &run_id, finished).await;
    // The entry, 81 passes of (spin, again) and the exit.
    assert_eq!((run["status"].as_str(), run["stepCount"].as_i64()), (Some("exited"), Some(164)), "{run}");
    let mut seen = Vec::new();
    let mut before: Option<i64> = None;
    loop {
        let query = before.map(|index| format!("?history_before={index}")).unwrap_or_default();
        let window = app.get(&format!("/workflows/{workflow}/runs/{run_id}{query}"), MAIL_KEY).await;
        assert_eq!(window.status, 200, "{:?}", window.body);
        let records = window.body["data"]["history"].as_array().expect("history").clone();
        assert!(records.len() <= 100);
        let indexes: Vec<i64> = records.iter().map(|record| record["index"].as_i64().expect("index")).collect();
        assert!(indexes.windows(2).all(|pair| pair[1] == pair[0] + 1), "ascending: {indexes:?}");
        assert_eq!(window.body["data"]["stepCount"], 164, "stepCount is the ordinal, whatever the window");
        seen.splice(0..0, indexes);
        match window.body["data"]["nextHistoryBeforeIndex"].as_i64() {
            Some(next) => before = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, (1..=164).collect::<Vec<i64>>());
    let first = app.get(&format!("/workflows/{workflow}/runs/{run_id}?history_before=2"), MAIL_KEY).await;
    assert_eq!(
        steps(&first.body["data"]),
        [("start".to_owned(), "incoming_webhook".to_owned(), "completed".to_owned())]
    );
    for bad in ["0", "x", "-3"] {
        let refused = app.get(&format!("/workflows/{workflow}/runs/{run_id}?history_before={bad}"), MAIL_KEY).await;
        assert_eq!(refused.code(), "invalid_query_parameter", "{bad}: {:?}", refused.body);
    }
}

#[tokio::test]
async fn a_paused_workflow_holds_its_runs_and_triggers_and_lets_them_go_on_at_unpause() {
    let sink = SmtpSink::start().await;
    let sleeper = json!([{
        "slug": "sleeper", "name": "Sleeper",
        "steps": [
            {"id": "start", "type": "incoming_webhook", "referenceId": "sleep-hook", "next": "nap"},
            {"id": "nap", "type": "wait", "duration": "4s", "next": "done"},
            {"id": "done", "type": "exit"}
        ]
    }]);
    let app = app_with(&sink, sleeper).await;
    let workflow = workflow_id(&app, "sleeper").await;
    let first = post(&app, "/workflows/sleep-hook", None, Some(&json!({}))).await;
    let first_id = first.body["data"]["id"].as_str().expect("run id").to_owned();
    wait_for_run(&app, &workflow, &first_id, |run| run["status"] == "sleeping").await;

    let paused = post(&app, &format!("/workflows/{workflow}/pause"), Some("pause-1"), None).await;
    assert_eq!((paused.status, &paused.body["data"]["status"]), (200, &json!("paused")), "{:?}", paused.body);
    let replayed = post(&app, &format!("/workflows/{workflow}/pause"), Some("pause-1"), None).await;
    assert_eq!(replayed.header("idempotent-replay"), Some("true"));
    // The slug names the workflow as its id does.
    let again = post(&app, "/workflows/sleeper/pause", Some("pause-2"), None).await;
    assert_eq!((again.status, &again.body["data"]["status"]), (200, &json!("paused")), "pausing twice changes nothing");
    // A trigger during the pause is accepted and waits.
    let second = post(&app, "/workflows/sleep-hook", Some("during"), Some(&json!({}))).await;
    assert_eq!(second.status, 202, "{:?}", second.body);
    let second_id = second.body["data"]["id"].as_str().expect("run id").to_owned();
    // The first run's wait elapses during the pause: it stops before its next step.
    tokio::time::sleep(Duration::from_millis(5_000)).await;
    for run_id in [&first_id, &second_id] {
        let run = wait_for_run(&app, &workflow, run_id, |run| run["status"] == "waiting").await;
        assert!(!finished(&run));
    }
    let held = app.get(&format!("/workflows/{workflow}/runs/{second_id}"), MAIL_KEY).await;
    assert_eq!(held.body["data"]["stepCount"], 0, "a run triggered during the pause has not started");

    let unpaused = post(&app, &format!("/workflows/{workflow}/unpause"), Some("unpause-1"), None).await;
    assert_eq!((unpaused.status, &unpaused.body["data"]["status"]), (200, &json!("published")));
    let resumed_at = Instant::now();
    let first_run = wait_for_run(&app, &workflow, &first_id, finished).await;
    // Sooner than the wait's own length: the elapsed wait is not started over.
    assert!(resumed_at.elapsed() < Duration::from_millis(3_500), "the elapsed wait completes at once");
    assert_eq!(steps(&first_run).iter().map(|step| step.0.as_str()).collect::<Vec<_>>(), ["start", "nap", "done"]);
    let second_run = wait_for_run(&app, &workflow, &second_id, finished).await;
    assert_eq!(second_run["status"], "exited", "{second_run}");
    let replayed = post(&app, &format!("/workflows/{workflow}/unpause"), Some("unpause-1"), None).await;
    assert_eq!(replayed.header("idempotent-replay"), Some("true"));
    let live = post(&app, "/workflows/sleeper/unpause", Some("unpause-2"), None).await;
    assert_eq!(live.body["data"]["status"], "published", "unpausing a live workflow changes nothing");
    let by_id = app.get(&format!("/workflows/{workflow}"), MAIL_KEY).await;
    for path in
        ["/workflows/sleeper".to_owned(), "/workflows/sleeper/stats".to_owned(), "/workflows/sleeper/runs".to_owned()]
    {
        let by_slug = app.get(&path, MAIL_KEY).await;
        assert_eq!(by_slug.status, 200, "{path}: {:?}", by_slug.body);
    }
    assert_eq!(app.get("/workflows/sleeper", MAIL_KEY).await.body["data"], by_id.body["data"]);
    let run = app.get(&format!("/workflows/sleeper/runs/{first_id}"), MAIL_KEY).await;
    assert_eq!(run.body["data"]["id"], json!(first_id), "{:?}", run.body);
    let elsewhere = app.get("/workflows/sleeper", ALPHA_ADMIN).await;
    assert_eq!(elsewhere.code(), "workflow_not_found", "another space's slug names nothing here");
}

#[tokio::test]
async fn triggers_are_refused_with_the_contracts_answers() {
    let sink = SmtpSink::start().await;
    let workflows = json!([
        {"slug": "live", "name": "Live", "steps": [
            {"type": "incoming_webhook", "referenceId": "live-hook"}, {"type": "exit"}]},
        {"slug": "draft", "name": "Draft", "status": "draft", "steps": [
            {"type": "incoming_webhook", "referenceId": "draft-hook"}, {"type": "exit"}]}
    ]);
    let app = app_with(&sink, workflows).await;
    let live = workflow_id(&app, "live").await;
    let draft = workflow_id(&app, "draft").await;
    for (path, code) in [
        ("/workflows/nope".to_owned(), "workflow_not_found"),
        (format!("/workflows/{live}"), "workflow_not_found"),
        ("/workflows/draft-hook".to_owned(), "workflow_not_published"),
        (format!("/workflows/{draft}/pause"), "workflow_not_published"),
        ("/workflows/draft/pause".to_owned(), "workflow_not_published"),
        // The trigger's path is the incoming-webhook step's reference id, never the slug (D10).
        ("/workflows/live".to_owned(), "workflow_not_found"),
        ("/workflows/wf_nope/pause".to_owned(), "workflow_not_found"),
    ] {
        let refused = post(&app, &path, None, Some(&json!({}))).await;
        assert_eq!(refused.code(), code, "{path}: {:?}", refused.body);
    }
    let other_space =
        app.send(app.request(reqwest::Method::POST, "/workflows/live-hook", Some(ALPHA_ADMIN)).json(&json!({}))).await;
    assert_eq!(other_space.code(), "workflow_not_found", "another space's reference is unknown");
    for body in [
        json!({"contact": "ada@example.com"}),
        json!({"contact": {"plan": "x"}}),
        json!({"blob": "x".repeat(300 * 1024)}),
    ] {
        let refused = post(&app, "/workflows/live-hook", None, Some(&body)).await;
        assert_eq!(refused.code(), "invalid_workflow_input", "{:?}", refused.body);
    }
    let refused = app.get(&format!("/workflows/{live}/runs?status=sleepy"), MAIL_KEY).await;
    assert_eq!(refused.code(), "invalid_query_parameter");
    let missing = app.get(&format!("/workflows/{live}/runs/run_nope"), MAIL_KEY).await;
    assert_eq!(missing.code(), "workflow_run_not_found");
    let elsewhere = app.get(&format!("/workflows/{live}"), ALPHA_ADMIN).await;
    assert_eq!(elsewhere.code(), "workflow_not_found");

    // What a trigger read is kept by the process only until the catalog moves on: once an
    // apply makes the live workflow a draft and the draft live, triggers follow at once.
    assert_eq!(post(&app, "/workflows/live-hook", None, Some(&json!({}))).await.status, 202);
    let swapped = json!([
        {"slug": "live", "name": "Live", "status": "draft", "steps": [
            {"type": "incoming_webhook", "referenceId": "live-hook"}, {"type": "exit"}]},
        {"slug": "draft", "name": "Draft", "steps": [
            {"type": "incoming_webhook", "referenceId": "draft-hook"}, {"type": "exit"}]}
    ]);
    app.apply_workspace(&workspace(swapped), true).await;
    let now_draft = post(&app, "/workflows/live-hook", None, Some(&json!({}))).await;
    assert_eq!(now_draft.code(), "workflow_not_published", "{:?}", now_draft.body);
    let now_live = post(&app, "/workflows/draft-hook", None, Some(&json!({}))).await;
    assert_eq!(now_live.status, 202, "{:?}", now_live.body);
}

#[tokio::test]
async fn an_apply_refuses_a_bad_graph_naming_the_step() {
    let app = TestApp::spawn().await;
    let steps = |steps: Value| json!([{"slug": "bad", "name": "Bad", "steps": steps}]);
    for (workflows, named) in [
        (steps(json!([{"id": "in", "type": "incoming_webhook", "referenceId": "r", "next": "x"}])), "\"x\""),
        (
            steps(json!([{"id": "in", "type": "incoming_webhook", "referenceId": "r", "next": null},
                      {"id": "lost", "type": "exit"}])),
            "\"lost\" is unreachable",
        ),
        (
            steps(json!([{"id": "in", "type": "incoming_webhook", "referenceId": "r", "next": "a"},
                      {"id": "a", "type": "subscribe", "topic": "news", "next": "b"},
                      {"id": "b", "type": "unsubscribe", "topic": "news", "next": "a"}])),
            "loop without a bound",
        ),
        (
            steps(json!([{"id": "in", "type": "incoming_webhook", "referenceId": "r", "next": "m"},
                      {"id": "m", "type": "send_email", "template": "nope"}])),
            "template \"nope\"",
        ),
        (
            steps(json!([{"id": "in", "type": "incoming_webhook", "referenceId": "r", "next": "b"},
                      {"id": "b", "type": "branch", "arms": [{"condition": "segments.seg_nope is true"}]}])),
            "segment \"seg_nope\"",
        ),
        (
            steps(json!([{"id": "in", "type": "incoming_webhook", "referenceId": "r", "next": "b"},
                      {"id": "b", "type": "branch", "arms": [{"condition": "opened in the last 2 days"}]}])),
            "are for segments",
        ),
        (
            steps(json!([{"id": "in", "type": "incoming_webhook", "referenceId": "r", "next": "w"},
                      {"id": "w", "type": "wait_for_engagement", "step": "in", "action": "opened", "timeout": "1d"}])),
            "not a send_email step",
        ),
        (
            json!([{"slug": "bad", "name": "Bad", "triggers": [{"segment": "seg_nope"}],
                    "steps": [{"id": "in", "type": "incoming_webhook", "referenceId": "r", "next": null}]}]),
            "segment \"seg_nope\"",
        ),
        (
            json!([{"slug": "bad", "name": "Bad", "triggers": [{"event": "purchase", "segment": "seg_nope"}],
                    "steps": [{"id": "in", "type": "incoming_webhook", "referenceId": "r", "next": null}]}]),
            "either an event",
        ),
        (
            steps(json!([{"id": "in", "type": "incoming_webhook", "referenceId": "r", "next": "u"},
                      {"id": "u", "type": "update_contact", "set": {"newsConsent": "yes"}}])),
            "set \"newsConsent\"",
        ),
        (
            steps(json!([{"id": "in", "type": "incoming_webhook", "referenceId": "r", "next": "u"},
                      {"id": "u", "type": "update_contact", "set": {"firstName": "x".repeat(4_097)}}])),
            "firstName is longer than 4096 characters",
        ),
        (steps(json!([{"id": "a", "type": "exit"}])), "no entry"),
        (
            steps(json!([{"id": "in", "type": "incoming_webhook", "referenceId": "r", "next": "two"},
                      {"id": "two", "type": "incoming_webhook", "referenceId": "s"}])),
            "exactly one entry",
        ),
    ] {
        let text = workspace(workflows);
        let parsed = command_service::authoring::parse(&text).expect("the file parses");
        let log = platform::log::EventLog::start(app.pool.clone(), 4);
        let refused =
            command_service::authoring::apply(&app.pool, &log, &parsed, Default::default()).await.expect_err("refused");
        let message = format!("{refused:#}");
        assert!(message.contains(named), "{named}: {message}");
        assert!(message.contains("workflow \"bad\""), "{message}");
    }
}

/// A contact of the mail space, made through the API.
async fn person(app: &TestApp, email: &str, first_name: &str) -> String {
    let made = app.post("/schemas/people/records", MAIL_KEY, &json!({"email": email, "firstName": first_name})).await;
    assert_eq!(made.status, 201, "{:?}", made.body);
    made.body["data"]["id"].as_str().expect("id").to_owned()
}

/// Changes a contact, then waits until every read model has it (so each change is evaluated
/// for segments on its own, not folded into the next).
async fn change(app: &TestApp, contact_id: &str, fields: &Value) {
    let request = app.request(reqwest::Method::PATCH, &format!("/schemas/people/records/{contact_id}"), Some(MAIL_KEY));
    let changed = app.send(request.json(fields)).await;
    assert_eq!(changed.status, 200, "{:?}", changed.body);
    app.wait_for_workers().await;
}

/// The runs of a workflow once there are `count`: (contact, trigger type, trigger id).
async fn runs_of(app: &TestApp, workflow_id: &str, count: u64) -> Vec<(String, String, String)> {
    let deadline = Instant::now() + WAIT;
    loop {
        let runs = app.get(&format!("/workflows/{workflow_id}/runs?limit=100"), MAIL_KEY).await;
        assert_eq!(runs.status, 200, "{:?}", runs.body);
        if runs.body["pagination"]["totalCount"].as_u64() >= Some(count) {
            let mut found: Vec<(String, String, String)> = runs.body["data"]
                .as_array()
                .expect("runs")
                .iter()
                .map(|run| {
                    let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
                    (text(&run["contactId"]), text(&run["trigger"]["type"]), text(&run["trigger"]["id"]))
                })
                .collect();
            found.sort();
            return found;
        }
        assert!(Instant::now() < deadline, "fewer than {count} runs: {:?}", runs.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn event_and_segment_triggers_start_runs_under_their_reentry_rules() {
    let sink = SmtpSink::start().await;
    let receiver = Receiver::start().await;
    receiver.endpoint("buyer", &[SECRET], json!({})).await;
    let app = app_with(&sink, json!([])).await;
    let defined = app.post("/segments", MAIL_KEY, &json!({"name": "Adas", "definition": "firstName is Ada"})).await;
    assert_eq!(defined.status, 201, "{:?}", defined.body);
    let segment = defined.body["data"]["id"].as_str().expect("segment id").to_owned();
    // A member from before the trigger is published: it starts nothing.
    let before = person(&app, "before@example.com", "Ada").await;
    app.wait_for_workers().await;
    let workflows = json!([
        {"slug": "greeter", "name": "Greeter", "triggers": [{"segment": segment}],
         "steps": [{"id": "start", "type": "incoming_webhook", "referenceId": "greet", "next": null}]},
        {"slug": "buyer", "name": "Buyer", "signingSecret": SECRET,
         "triggers": [{"event": "purchase", "reentry": "once_at_a_time"}],
         "steps": [{"id": "start", "type": "incoming_webhook", "referenceId": "buy"},
                   {"id": "tell", "type": "call_webhook", "url": receiver.url("buyer")},
                   {"id": "nap", "type": "wait", "duration": "1h"}]}
    ]);
    app.apply_workspace(&workspace(workflows), true).await;
    let greeter = workflow_id(&app, "greeter").await;
    let buyer = workflow_id(&app, "buyer").await;
    let shown = app.get(&format!("/workflows/{greeter}"), MAIL_KEY).await;
    assert_eq!(shown.body["data"]["triggers"], json!([{"type": "segment", "segmentId": segment, "reentry": "always"}]));

    // Entering starts a run; leaving and entering again (re-entry `always`) starts another;
    // a change that keeps the contact a member starts nothing, nor does one of the member
    // from before.
    let ada = person(&app, "ada@example.com", "Ada").await;
    app.wait_for_workers().await;
    change(&app, &ada, &json!({"firstName": "Bob"})).await;
    change(&app, &ada, &json!({"firstName": "Ada"})).await;
    change(&app, &ada, &json!({"newsConsent": true})).await;
    change(&app, &before, &json!({"newsConsent": true})).await;
    // Entries are followed in log order: once the last one has its run, the others had theirs.
    let last = person(&app, "last@example.com", "Ada").await;
    let entered = ("segment".to_owned(), segment.clone());
    let mut expected = vec![
        (ada.clone(), entered.0.clone(), entered.1.clone()),
        (ada.clone(), entered.0.clone(), entered.1.clone()),
        (last.clone(), entered.0.clone(), entered.1.clone()),
    ];
    expected.sort();
    assert_eq!(runs_of(&app, &greeter, 3).await, expected);

    // An event trigger: the ready event starts a run with the event as its input; a second
    // one while that run is unfinished (`once_at_a_time`) starts nothing.
    let fired = app.post("/events/purchase", MAIL_KEY, &json!({"contactId": ada, "amount": 12})).await;
    assert_eq!(fired.status, 202, "{:?}", fired.body);
    let event_id = fired.body["data"]["id"].as_str().expect("event id").to_owned();
    let calls = receiver.wait_for("buyer", 1, WAIT).await;
    assert_eq!(calls[0]["verifiedWith"], json!([0]), "{}", calls[0]);
    let event = &calls[0]["body"]["data"]["input"]["event"];
    assert_eq!((&event["id"], &event["schemaId"].is_string()), (&json!(event_id), &true), "{event}");
    assert_eq!(event["data"]["amount"], 12, "{event}");
    assert!(event["occurredAt"].as_str().is_some_and(|at| at.ends_with('Z')), "{event}");
    // The run never finishes (it sleeps an hour), so `once_at_a_time` holds the next back.
    let first = runs_of(&app, &buyer, 1).await;
    let again = app.post("/events/purchase", MAIL_KEY, &json!({"contactId": ada, "amount": 13})).await;
    assert_eq!(again.status, 202, "{:?}", again.body);
    let other = app.post("/events/purchase", MAIL_KEY, &json!({"contactId": last, "amount": 14})).await;
    assert_eq!(other.status, 202, "{:?}", other.body);
    let got = runs_of(&app, &buyer, 2).await;
    let contacts: Vec<&str> = got.iter().map(|(contact, ..)| contact.as_str()).collect();
    let mut want = vec![ada.as_str(), last.as_str()];
    want.sort_unstable();
    assert_eq!(contacts, want, "{first:?} then {got:?}");
    assert!(got.iter().all(|(_, kind, _)| kind == "event"), "{got:?}");
}

#[tokio::test]
async fn a_create_that_starts_no_run_is_passed_over_by_the_follower_without_its_lease_or_a_flush() {
    let sink = SmtpSink::start().await;
    let app = TestApp::spawn_with(Options { email: Some(test_email(&sink)), ..Options::without_projector() }).await;
    let settings = platform::settings::Settings {
        email: test_email(&sink),
        ..platform::settings::Settings::for_database(&app.database_url)
    };
    let projector = projector_noting_checkpoint_commits(&app, settings).await;
    app.apply_workspace(&workspace(json!([])), true).await;
    let defined = app.post("/segments", MAIL_KEY, &json!({"name": "Adas", "definition": "firstName is Ada"})).await;
    assert_eq!(defined.status, 201, "{:?}", defined.body);
    let segment = defined.body["data"]["id"].as_str().expect("segment id").to_owned();
    let greeter = json!([{"slug": "greeter", "name": "Greeter", "triggers": [{"segment": segment}],
        "steps": [{"id": "start", "type": "incoming_webhook", "referenceId": "greet", "next": null}]}]);
    app.apply_workspace(&workspace(greeter), true).await;
    let greeter = workflow_id(&app, "greeter").await;
    let follower = async |after: i64| checkpoint_commits(&app, "workflow_events", after).await;
    // Waits until the follower has passed the log's head, the segments read model has reached
    // it, and the greeter's trigger is followed: from then on a step of the follower is about
    // what comes next.
    let passed_head = async || {
        let head = app.query_i64("SELECT position FROM log_head").await;
        let deadline = Instant::now() + WAIT;
        let behind = "SELECT (SELECT count(*) FROM workflow_segment_triggers) = 0
                          OR COALESCE((SELECT position FROM worker_checkpoints WHERE name = 'workflow_events'), 0) < $1
                          OR (SELECT position FROM projections WHERE name = 'segments' AND status = 'live') < $1";
        let client = app.pool.get().await.expect("client");
        while client.query_one(behind, &[&head]).await.expect("the follower").get::<_, bool>(0) {
            assert!(Instant::now() < deadline, "the follower never passed {head}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    app.wait_for_workers().await;
    passed_head().await;

    // A create that enters no segment moves the segments read model, and the follower finds
    // no entry after its triggers' progress: it passes over the create without its lease, in
    // one statement that does not wait for a flush.
    let before = last_checkpoint_commit(&app).await;
    person(&app, "bob@example.com", "Bob").await;
    app.wait_for_workers().await;
    passed_head().await;
    let passed = follower(before).await;
    assert!(!passed.is_empty(), "the follower passed over the create");
    assert!(passed.iter().all(|commit| commit.synchronous == "off" && !commit.leased), "{passed:?}");

    // One that enters it starts a run: that step waits for its flush.
    let before = last_checkpoint_commit(&app).await;
    let ada = person(&app, "ada@example.com", "Ada").await;
    let runs = runs_of(&app, &greeter, 1).await;
    assert_eq!(runs[0].0, ada);
    app.wait_for_workers().await;
    passed_head().await;
    let entered = follower(before).await;
    assert!(entered.iter().any(|commit| commit.synchronous == "on" && commit.leased), "{entered:?}");
    projector.cancel();
}

/// The killed run's steps: the entry, a wait, an email, a webhook call and the exit.
const KILL_STEPS: [(&str, &str); 5] = [
    ("start", "incoming_webhook"),
    ("nap", "wait"),
    ("mail", "send_email"),
    ("call", "call_webhook"),
    ("done", "exit"),
];

/// The unfinished runs, counted by status and step: what a test that waited in vain says.
async fn unfinished_by_step(app: &TestApp) -> Vec<String> {
    app.query_strings(
        "SELECT status || ' at ' || coalesce(step_id, '-') || ': ' || count(*) FROM workflow_runs
         WHERE finished_at IS NULL GROUP BY status, step_id",
    )
    .await
}

/// How long a call holds its run in the killed-runs test: longer than the test may take, so a
/// call a killed process had out is taken over because the process stopped beating, never
/// because its lease ran out.
const KILL_CALL_LEASE: Duration = Duration::from_secs(300);

#[tokio::test]
async fn a_thousand_runs_survive_kill_9_of_the_projectors_and_the_command_service() {
    const RUNS: usize = 1_000;
    let sink = SmtpSink::start().await;
    let receiver = Receiver::start().await;
    // Each call is answered after a second, so a killed projector always has calls out.
    receiver.endpoint("crm", &[SECRET], json!({"status": 200, "delaySeconds": 1})).await;
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let mut env = sink.process_env(2000);
    env.extend([
        ("APP__WEBHOOKS__ALLOW_LOOPBACK", "true".to_owned()),
        // A call is sent again (with the same `webhook-id`) only after an attempt failed. The
        // receiver answers at once, so an attempt fails only when the machine is too busy to
        // carry its answer within the timeout: 2 s was not enough in a full run once
        // (2026-12-03, three calls sent twice), and the kills, not timeouts, are what this
        // test is about. A failed attempt is in the projector's log either way.
        ("APP__WEBHOOKS__ATTEMPT_TIMEOUT_MS", "10000".to_owned()),
        ("APP__WORKFLOWS__LEASE_MS", KILL_CALL_LEASE.as_millis().to_string()),
        // What the engine and the outbox did, so that a stall in a full run can be read: once
        // (2026-12-02) half the runs stood still for four minutes, with nothing at warn.
        ("RUST_LOG", "warn,projector::workers::workflows=debug,mail=info".to_owned()),
    ]);
    // Two projectors share the due runs; each one's output is kept: a stall shows what the
    // last ones said.
    let mut projectors: Vec<_> =
        (0..2).map(|_| spawn_binary_logged("projector", &["run"], &app.database_url, &env)).collect();
    let mut projector_logs: Vec<_> = projectors.iter().map(|(_, log)| log.clone()).collect();
    let steps: Vec<Value> = vec![
        json!({"id": "start", "type": "incoming_webhook", "referenceId": "kill-hook"}),
        json!({"id": "nap", "type": "wait", "duration": "1s"}),
        json!({"id": "mail", "type": "send_email", "template": "hello"}),
        json!({"id": "call", "type": "call_webhook", "url": receiver.url("crm")}),
        json!({"id": "done", "type": "exit"}),
    ];
    let text = workspace(json!([{"slug": "killed", "name": "Killed", "signingSecret": SECRET, "steps": steps}]));
    app.apply_workspace(&text, true).await;
    publish_dkim(&app, &sink).await;
    let env_commands = [("APP__RATE_LIMITS__ENABLED", "false".to_owned())];
    let (mut commands, urls) = spawn_servers(&app, "command-service", &["serve"], 1, &env_commands).await;
    let mut url = urls[0].clone();

    // A projector is killed three times while the runs go on (one, the other, the first
    // again): each time right after a batch of triggers was acknowledged (so runs are
    // under way, in their wait or past it, some with a call out), at a random moment within
    // the next batch.
    let mut unfinished_at_kills = Vec::new();
    let mut out_at_kills = Vec::new();
    let mut acknowledged = Vec::new();
    let mut cut = 0;
    for batch in 0..RUNS / 50 {
        if [4, 11, 17].contains(&batch) {
            let pause = 50 + u64::try_from(uuid::Uuid::new_v4().as_u128() % 500).unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            // Not before ten calls are out (the runs' waits end a second after their start):
            // with the runs shared by hash, the one killed then has some of them.
            let calls_out = Instant::now() + Duration::from_secs(10);
            while app.query_i64("SELECT count(*) FROM workflow_runs WHERE lease_until > now()").await < 10
                && Instant::now() < calls_out
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            unfinished_at_kills
                .push(app.query_i64("SELECT count(*) FROM workflow_runs WHERE finished_at IS NULL").await);
            out_at_kills.push(app.query_i64("SELECT count(*) FROM workflow_runs WHERE lease_until > now()").await);
            let killed = &mut projectors[unfinished_at_kills.len() % 2];
            killed.0.0.kill().expect("kill -9 a projector");
            let _ = killed.0.0.wait();
            *killed = spawn_binary_logged("projector", &["run"], &app.database_url, &env);
            projector_logs.push(killed.1.clone());
        }
        if batch == 8 {
            // Once the command service, mid-way through the triggers.
            commands[0].0.kill().expect("kill -9 the command service");
            let _ = commands[0].0.wait();
            let (respawned, urls) = spawn_servers(&app, "command-service", &["serve"], 1, &env_commands).await;
            (commands, url) = (respawned, urls[0].clone());
        }
        let requests = (batch * 50..(batch + 1) * 50).map(|index| {
            let (http, url) = (app.http.clone(), url.clone());
            async move {
                let body =
                    json!({"n": index, "contact": {"email": format!("k{index:04}@example.com"), "firstName": "K"}});
                let sent = http
                    .post(format!("{url}/workflows/kill-hook"))
                    .bearer_auth(MAIL_KEY)
                    .header("Idempotency-Key", format!("kill-{index}"))
                    .json(&body)
                    .send()
                    .await;
                match sent {
                    Ok(response) if response.status().as_u16() == 202 => {
                        let body: Value = response.json().await.expect("JSON");
                        Some(body["data"]["id"].as_str().expect("run id").to_owned())
                    }
                    _ => None,
                }
            }
        });
        for outcome in futures_util::future::join_all(requests).await {
            match outcome {
                Some(run_id) => acknowledged.push(run_id),
                None => cut += 1,
            }
        }
    }
    // The last projectors run on until the test ends.
    assert!(cut < 100, "only requests in flight at the kill fail ({cut})");
    assert!(unfinished_at_kills.iter().all(|runs| *runs > 0), "each kill came mid-run: {unfinished_at_kills:?}");
    assert!(out_at_kills.iter().all(|calls| *calls > 0), "calls were out at each kill: {out_at_kills:?}");

    // Every run finishes, well before a killed projector's calls' leases could have run out;
    // every acknowledged one is among them.
    let deadline = Instant::now() + KILL_CALL_LEASE / 2;
    loop {
        let open = app.query_i64("SELECT count(*) FROM workflow_runs WHERE finished_at IS NULL").await;
        if open == 0 {
            break;
        }
        if Instant::now() >= deadline {
            let stuck = unfinished_by_step(&app).await;
            // What the database was doing for this test's processes: a wait on a lock or a
            // statement that never ends, or nothing (the stall is in a process).
            let activity = app
                .query_strings(
                    "SELECT coalesce(wait_event_type || '/' || wait_event, state, '-') || ': ' || left(query, 80)
                     FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
                       AND state <> 'idle'",
                )
                .await;
            let said: Vec<String> = projectors
                .iter_mut()
                .map(|(projector, log)| {
                    let exited = projector.0.try_wait().ok().flatten();
                    format!(
                        "a projector {}; its log ends:\n{}",
                        exited.map_or("is running".to_owned(), |status| format!("exited: {status}")),
                        log_tail(log, 40)
                    )
                })
                .collect();
            panic!(
                "{open} runs are still unfinished ({stuck:?}); the database's busy sessions: {activity:?}; {}",
                said.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let client = app.pool.get().await.expect("client");
    let runs: Vec<(String, String)> = client
        .query("SELECT run_id, status FROM workflow_runs", &[])
        .await
        .expect("runs")
        .into_iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let known: std::collections::HashSet<&str> = runs.iter().map(|(id, _)| id.as_str()).collect();
    assert!(acknowledged.iter().all(|id| known.contains(id.as_str())), "no acknowledged run is lost");
    assert!(runs.iter().all(|(_, status)| status == "exited"), "every run reached its exit");

    // Each email and each call arrived at most once; sent and unknown account for every email
    // once the outbox has settled the hand-offs the kills cut off.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let open = app.query_i64("SELECT count(*) FROM email_outbox WHERE state IN ('pending', 'attempting')").await;
        if open == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{open} emails are still being handed off");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let outbox: Vec<(String, i64)> = client
        .query("SELECT state, count(*) FROM email_outbox GROUP BY state", &[])
        .await
        .expect("outbox")
        .into_iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let count = |state: &str| outbox.iter().find(|(s, _)| s == state).map_or(0, |(_, n)| *n);
    assert_eq!(count("sent") + count("unknown"), runs.len() as i64, "{outbox:?}");
    let summary = sink.summary().await;
    let mut ids: Vec<&str> = summary["messageIds"].as_array().expect("ids").iter().filter_map(Value::as_str).collect();
    let delivered = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), delivered, "no email was delivered twice");
    assert!(delivered as i64 >= count("sent"), "{delivered} delivered, {} sent", count("sent"));
    assert_eq!(summary["dkimInvalid"], 0);
    let calls = receiver.ids("crm").await;
    if !calls.values().all(|received| *received == 1) {
        let twice: Vec<&String> = calls.iter().filter(|(_, received)| **received > 1).map(|(id, _)| id).collect();
        // What the projectors said of those calls' attempts.
        let said: Vec<String> = projector_logs
            .iter()
            .filter_map(|path| std::fs::read_to_string(path).ok())
            .flat_map(|log| log.lines().map(str::to_owned).collect::<Vec<_>>())
            .filter(|line| twice.iter().any(|id| line.contains(id.as_str())))
            .collect();
        panic!("no call arrived twice: {twice:?} did; the projectors' log of them: {said:#?}");
    }

    // Each run's history is the one a run without kills has, but for unknown outcomes.
    let version: i32 = client
        .query_one("SELECT version FROM projections WHERE name = 'workflows' AND status = 'live'", &[])
        .await
        .expect("the workflows read model")
        .get(0);
    app.wait_for_projections().await;
    let history = client
        .query(
            &format!(
                "SELECT run_id, array_agg(step_id ORDER BY index), array_agg(type ORDER BY index),
                        array_agg(status ORDER BY index)
                 FROM rm_workflows_v{version}.history GROUP BY run_id"
            ),
            &[],
        )
        .await
        .expect("histories");
    assert_eq!(history.len(), runs.len());
    let mut unknown_calls = 0;
    for row in history {
        let (step_ids, types, statuses): (Vec<String>, Vec<String>, Vec<String>) = (row.get(1), row.get(2), row.get(3));
        let expected: Vec<(String, String)> =
            KILL_STEPS.iter().map(|(id, kind)| ((*id).to_owned(), (*kind).to_owned())).collect();
        let got: Vec<(String, String)> = step_ids.into_iter().zip(types).collect();
        assert_eq!(got, expected);
        for (index, status) in statuses.iter().enumerate() {
            match (KILL_STEPS[index].1, status.as_str()) {
                (_, "completed") => {}
                ("call_webhook", "outcome_unknown") => unknown_calls += 1,
                other => panic!("run {} has step {index} {other:?}", row.get::<_, String>(0)),
            }
        }
    }
    assert!(calls.len() + unknown_calls >= runs.len(), "every call arrived or is unknown");
}

#[tokio::test]
async fn two_engines_that_take_the_same_runs_send_each_attempt_of_a_call_once() {
    const RUNS: usize = 100;
    let sink = SmtpSink::start().await;
    let receiver = Receiver::start().await;
    // Each call's first attempt fails: its second goes out 100 ms later, a change of the run's
    // row alone (no event), which both engines find due.
    receiver.endpoint("crm", &[SECRET], json!({"status": 200, "failFirst": 1})).await;
    let steps = json!([
        {"id": "start", "type": "incoming_webhook", "referenceId": "twice-hook", "next": "call"},
        {"id": "call", "type": "call_webhook", "url": receiver.url("crm"), "next": "done"},
        {"id": "done", "type": "exit"}
    ]);
    let app =
        app_with(&sink, json!([{"slug": "twice", "name": "Twice", "signingSecret": SECRET, "steps": steps}])).await;
    // A second engine in this process: the same process id as the in-process projector's, so
    // the same share (every run), with runs in flight of its own. Nothing keeps the two from
    // deciding the same transition but the writes' versions.
    let mut settings = platform::settings::Settings::for_database(&app.database_url);
    settings.webhooks = platform::settings::WebhookSettings { retry_schedule_ms: vec![100, 100], ..test_webhooks() };
    settings.projector.workers = "workflows".to_owned();
    let pool = platform::db::pool(&app.database_url, 8).expect("pool");
    let provider = ai_provider::AiProvider::new(&settings.ai).expect("AI provider");
    let workers = projector::workers(&settings, &pool, provider, "second-engine").expect("the workers");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let second =
        tokio::spawn(projector::runtime::Runtime::new(app.database_url.clone(), workers).run(shutdown.clone()));

    for index in 0..RUNS {
        let body = json!({"n": index, "contact": {"email": format!("t{index:03}@example.com")}});
        let started = post(&app, "/workflows/twice-hook", Some(&format!("twice-{index}")), Some(&body)).await;
        assert_eq!(started.status, 202, "{:?}", started.body);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while app.query_i64("SELECT count(*) FROM workflow_runs WHERE finished_at IS NULL").await > 0 {
        if Instant::now() >= deadline {
            let calls = receiver.ids("crm").await;
            let repeated: Vec<(&String, &u64)> = calls.iter().filter(|(_, attempts)| **attempts > 2).collect();
            let open = unfinished_by_step(&app).await;
            panic!(
                "the runs did not finish ({open:?}); {} calls went out more than twice, first {:?}",
                repeated.len(),
                repeated.iter().take(5).collect::<Vec<_>>()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shutdown.cancel();
    second.await.expect("the second engine stops");
    let calls = receiver.ids("crm").await;
    assert_eq!(calls.len(), RUNS, "one call per run");
    let repeated: Vec<(&String, &u64)> = calls.iter().filter(|(_, attempts)| **attempts != 2).collect();
    assert!(
        repeated.is_empty(),
        "each call went out twice (the failed attempt and the retry), these not: {repeated:?}"
    );
    let statuses = app.query_strings("SELECT DISTINCT status FROM workflow_runs").await;
    assert_eq!(statuses, vec!["exited".to_owned()]);
}

/// A member of the engine that beats but never advances its share (a process id that only
/// beats, as a process whose every slot a slow receiver holds would): its runs stay with it
/// while they are overdue by less than the take-over bound, and then another process with
/// free slots advances them.
#[tokio::test]
async fn runs_held_back_by_a_member_that_beats_but_does_not_advance_them_are_taken_over_once_overdue() {
    const RUNS: i64 = 40;
    let sink = SmtpSink::start().await;
    let steps = json!([
        {"id": "start", "type": "incoming_webhook", "referenceId": "stuck-hook", "next": "nap"},
        {"id": "nap", "type": "wait", "duration": "1s", "next": "done"},
        {"id": "done", "type": "exit"}
    ]);
    let app = app_with(&sink, json!([{"slug": "stuck", "name": "Stuck", "steps": steps}])).await;
    let stuck = uuid::Uuid::now_v7();
    let client = app.pool.get().await.expect("client");
    client
        .execute("INSERT INTO process_beats (process_id, role, beat_at) VALUES ($1, 'test', now())", &[&stuck])
        .await
        .expect("a beat");
    client
        .execute("INSERT INTO worker_members (worker, process_id) VALUES ('workflow_runs', $1)", &[&stuck])
        .await
        .expect("a member");
    let beating = tokio::spawn(async move {
        loop {
            let _ = client.execute("UPDATE process_beats SET beat_at = now() WHERE process_id = $1", &[&stuck]).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    // The engine reads its members once a second.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for index in 0..RUNS {
        let started = post(&app, "/workflows/stuck-hook", None, Some(&json!({"n": index}))).await;
        assert_eq!(started.body["data"]["status"], "sleeping", "{:?}", started.body);
    }
    let due = Instant::now() + Duration::from_secs(1);
    let sleeping = "SELECT count(*) FROM workflow_runs WHERE status = 'sleeping'";
    // Five seconds after the waits ended: this process advanced its share, the other share
    // still sleeps.
    tokio::time::sleep_until((due + Duration::from_secs(5)).into()).await;
    let held = app.query_i64(sleeping).await;
    assert!(held > 0 && held < RUNS, "{held} of {RUNS} runs still sleep: the other member's share, and only it");
    let deadline = Instant::now() + Duration::from_secs(30);
    while app.query_i64(sleeping).await > 0 {
        assert!(Instant::now() < deadline, "{} runs were never taken over", app.query_i64(sleeping).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    beating.abort();
    let exited = app.query_i64("SELECT count(*) FROM workflow_runs WHERE status = 'exited'").await;
    assert_eq!(exited, RUNS, "every run went on to its exit once");
}

/// Every row of the `workflows` read model, as text, in a stable order.
async fn workflows_snapshot(app: &TestApp) -> Vec<String> {
    let client = app.pool.get().await.expect("client");
    let version: i32 = client
        .query_one("SELECT version FROM projections WHERE name = 'workflows' AND status = 'live'", &[])
        .await
        .expect("live version")
        .get(0);
    let s = format!("rm_workflows_v{version}");
    let mut rows = Vec::new();
    for sql in [
        format!("SELECT workflow_id || ' ' || doc::text FROM {s}.workflows ORDER BY 1"),
        format!("SELECT space_id || ' ' || total FROM {s}.workflow_counts ORDER BY 1"),
        format!("SELECT to_jsonb(r)::text FROM {s}.runs r ORDER BY run_id"),
        format!("SELECT to_jsonb(c)::text FROM {s}.run_counts c WHERE total <> 0 ORDER BY workflow_id, status"),
        format!("SELECT to_jsonb(h)::text FROM {s}.history h ORDER BY run_id, index"),
        format!("SELECT to_jsonb(v)::text FROM {s}.revisions v ORDER BY workflow_id, revision"),
        format!(
            "SELECT to_jsonb(c)::text FROM {s}.revision_run_counts c WHERE total <> 0
             ORDER BY workflow_id, revision, status"
        ),
    ] {
        rows.extend(client.query(&sql, &[]).await.expect("snapshot").iter().map(|row| row.get::<_, String>(0)));
    }
    rows
}

#[tokio::test]
async fn a_rebuild_of_the_workflows_read_model_gives_the_same_runs_and_histories() {
    let sink = SmtpSink::start().await;
    let looper = looper(5);
    let app = app_with(&sink, looper).await;
    let workflow = workflow_id(&app, "looper").await;
    let mut runs = Vec::new();
    for stop in [true, false, false] {
        let started = post(&app, "/workflows/loop-hook", None, Some(&json!({"stop": stop}))).await;
        runs.push(started.body["data"]["id"].as_str().expect("run id").to_owned());
    }
    // Each run has stepped before the pause (a loaded machine could otherwise pause them all
    // before the engine took a step, leaving no history to compare).
    for run_id in &runs {
        wait_for_run(&app, &workflow, run_id, |run| run["stepCount"].as_i64().unwrap_or(0) >= 2 || finished(run)).await;
    }
    let paused = post(&app, &format!("/workflows/{workflow}/pause"), None, None).await;
    assert_eq!(paused.status, 200, "{:?}", paused.body);
    for run_id in &runs {
        wait_for_run(&app, &workflow, run_id, |run| finished(run) || run["status"] == "waiting").await;
    }
    app.wait_for_projections().await;
    let before = workflows_snapshot(&app).await;
    assert!(before.iter().filter(|row| row.contains("\"step_id\"")).count() >= 3, "histories were projected");
    let indexes = app.index_definitions("workflows", 1).await;
    assert!(indexes.iter().any(|index| index.contains("(workflow_id, status, requested_at DESC, run_id DESC)")));
    projector::read_models::rebuild::rebuild(&app.pool, read_model("workflows"), |_| {}).await.expect("rebuild");
    assert_eq!(workflows_snapshot(&app).await, before, "a rebuild gives the same workflows, runs and histories");
    assert_eq!(app.index_definitions("workflows", 2).await, indexes, "the lists' indexes are built after the rebuild");
}

/// A workflow whose runs sleep an hour in `nap`, named `name` (a new name, a new revision).
fn napper(name: &str) -> Value {
    json!([{
        "slug": "napper", "name": name,
        "steps": [
            {"id": "start", "type": "incoming_webhook", "referenceId": "nap-hook", "next": "nap"},
            {"id": "nap", "type": "wait", "duration": "1h", "next": "done"},
            {"id": "done", "type": "exit"}
        ]
    }])
}

/// Starts a run of the napper and waits until it sleeps in `nap`; returns its id.
async fn nap(app: &TestApp, workflow_id: &str) -> String {
    let started = post(app, "/workflows/nap-hook", None, Some(&json!({}))).await;
    assert_eq!(started.status, 202, "{:?}", started.body);
    let run_id = started.body["data"]["id"].as_str().expect("run id").to_owned();
    wait_for_run(app, workflow_id, &run_id, |run| run["status"] == "sleeping" && run["currentStepId"] == "nap").await;
    run_id
}

/// The napper under two revisions (the default rule, `pin`): two runs sleeping on revision 1,
/// one on revision 2. Returns the workflow's id and the runs' ids by revision.
async fn napper_under_two_revisions(app: &TestApp) -> (String, Vec<String>, Vec<String>) {
    let workflow = workflow_id(app, "napper").await;
    let first = vec![nap(app, &workflow).await, nap(app, &workflow).await];
    app.apply_workspace(&workspace(napper("Napper, renamed")), true).await;
    let second = vec![nap(app, &workflow).await];
    app.wait_for_projections().await;
    (workflow, first, second)
}

/// Runs by status as `stats` shows them, with `sleeping` runs and none of another status.
fn sleeping_runs(sleeping: i64) -> Value {
    json!({"waiting": 0, "running": 0, "sleeping": sleeping, "completed": 0, "exited": 0, "failed": 0})
}

#[tokio::test]
async fn runs_of_an_earlier_revision_stay_on_it_and_its_revision_drains_beside_the_current_one() {
    let sink = SmtpSink::start().await;
    let app = app_with(&sink, napper("Napper")).await;
    let (workflow, first, second) = napper_under_two_revisions(&app).await;

    // Each run shows the revision it follows; none moved.
    let page = app.get(&format!("/workflows/{workflow}/runs"), MAIL_KEY).await;
    assert_eq!(page.status, 200, "{:?}", page.body);
    assert_conforms("WorkflowRunPage", std::slice::from_ref(&page.body));
    let runs = page.body["data"].as_array().expect("runs");
    assert_eq!(runs.len(), 3, "{runs:?}");
    for run in runs {
        let revision = if second.iter().any(|id| run["id"] == id.as_str()) { 2 } else { 1 };
        assert_eq!((&run["revision"], &run["migrations"]), (&json!(revision), &json!([])), "{run}");
    }
    let one = app.get(&format!("/workflows/{workflow}/runs/{}", first[0]), MAIL_KEY).await;
    assert_eq!((&one.body["data"]["revision"], &one.body["data"]["migrations"]), (&json!(1), &json!([])));
    assert_conforms("WorkflowRunWithHistory", std::slice::from_ref(&one.body["data"]));

    // A paused workflow's new run waits at no step: it counts as not started.
    let paused = post(&app, &format!("/workflows/{workflow}/pause"), None, None).await;
    assert_eq!(paused.status, 200, "{:?}", paused.body);
    let held = post(&app, "/workflows/nap-hook", None, Some(&json!({}))).await;
    assert_eq!(held.status, 202, "{:?}", held.body);
    let held_id = held.body["data"]["id"].as_str().expect("run id").to_owned();
    wait_for_run(&app, &workflow, &held_id, |run| run["status"] == "waiting").await;

    // Revision 2 is current; revision 1 drains, its two runs in its wait.
    let listed = app.get(&format!("/workflows/{workflow}/revisions"), MAIL_KEY).await;
    assert_eq!(listed.status, 200, "{:?}", listed.body);
    let revisions = listed.body["data"].as_array().expect("revisions").clone();
    assert_conforms("WorkflowRevision", &revisions);
    let shown = |revision: &Value| {
        json!({
            "revision": revision["revision"], "status": revision["status"], "inFlight": revision["inFlight"],
            "state": revision["state"], "openRuns": revision["openRuns"], "notStarted": revision["notStarted"],
            "steps": revision["steps"],
        })
    };
    assert_eq!(
        revisions.iter().map(shown).collect::<Vec<_>>(),
        [
            json!({"revision": 2, "status": "published", "inFlight": {"runs": "pin"}, "state": "current",
                   "openRuns": 2, "notStarted": 1, "steps": {"nap": 1}}),
            json!({"revision": 1, "status": "published", "inFlight": {"runs": "pin"}, "state": "draining",
                   "openRuns": 2, "notStarted": 0, "steps": {"nap": 2}}),
        ]
    );
    let defined = |index: usize| revisions[index]["definedAt"].as_str().expect("definedAt").to_owned();
    assert!(defined(1) < defined(0), "revision 1 was defined before revision 2: {revisions:?}");
    // The workflow shows the same revisions, by its id or its slug.
    for path in [format!("/workflows/{workflow}"), "/workflows/napper".to_owned()] {
        let workflow = app.get(&path, MAIL_KEY).await;
        assert_eq!(workflow.status, 200, "{:?}", workflow.body);
        assert_eq!(
            (&workflow.body["data"]["revision"], &workflow.body["data"]["name"]),
            (&json!(2), &json!("Napper, renamed"))
        );
        assert_eq!(workflow.body["data"]["revisions"], json!(revisions), "{path}");
        assert_conforms("WorkflowWithRevisions", std::slice::from_ref(&workflow.body["data"]));
    }
    let by_slug = app.get("/workflows/napper/revisions", MAIL_KEY).await;
    assert_eq!(by_slug.body["data"], json!(revisions));
    // The list of workflows does not carry them.
    let list = app.get("/workflows", MAIL_KEY).await;
    assert!(list.body["data"][0].get("revisions").is_none(), "{:?}", list.body);

    // The counts by revision.
    let stats = app.get(&format!("/workflows/{workflow}/stats"), MAIL_KEY).await;
    assert_eq!(stats.status, 200, "{:?}", stats.body);
    assert_conforms("WorkflowStats", std::slice::from_ref(&stats.body["data"]));
    let mut waiting = sleeping_runs(1);
    waiting["waiting"] = json!(1);
    assert_eq!(stats.body["data"]["byRevision"], json!({"1": {"runs": sleeping_runs(2)}, "2": {"runs": waiting}}));
    assert_eq!(stats.body["data"]["runs"]["sleeping"], 3);

    for (path, key) in [
        ("/workflows/wf_missing/revisions".to_owned(), MAIL_KEY),
        (format!("/workflows/{workflow}/revisions"), ALPHA_ADMIN),
    ] {
        let missing = app.get(&path, key).await;
        assert_eq!(missing.status, 404, "{path}: {:?}", missing.body);
        assert_eq!(missing.code(), "workflow_not_found", "{path}");
    }
}

/// The rows revisions added to the workflows read model, in order.
async fn revision_rows(app: &TestApp) -> Vec<String> {
    let client = app.pool.get().await.expect("client");
    let mut rows = Vec::new();
    for sql in [
        "SELECT to_jsonb(v)::text FROM rm_workflows_v1.revisions v ORDER BY workflow_id, revision",
        "SELECT to_jsonb(c)::text FROM rm_workflows_v1.revision_run_counts c WHERE total <> 0
         ORDER BY workflow_id, revision, status",
        "SELECT jsonb_build_array(run_id, revision, migrations)::text FROM rm_workflows_v1.runs ORDER BY run_id",
    ] {
        rows.extend(client.query(sql, &[]).await.expect("rows").iter().map(|row| row.get::<_, String>(0)));
    }
    rows
}

#[tokio::test]
async fn a_version_made_before_revisions_gets_them_from_the_engine_and_the_log_when_a_projector_starts() {
    let sink = SmtpSink::start().await;
    let app = app_with(&sink, napper("Napper")).await;
    napper_under_two_revisions(&app).await;
    let folded = revision_rows(&app).await;
    assert_eq!(folded.iter().filter(|row| row.contains("\"defined_at\"")).count(), 2, "{folded:?}");
    // As the version was before revisions: no revision tables, no run revisions.
    let client = app.pool.get().await.expect("client");
    client
        .batch_execute(
            "DROP TABLE rm_workflows_v1.revisions, rm_workflows_v1.revision_run_counts;
             ALTER TABLE rm_workflows_v1.runs DROP COLUMN revision, DROP COLUMN migrations;",
        )
        .await
        .expect("the version as it was");
    projector::migrate(&app.pool).await.expect("a projector's start");
    assert_eq!(revision_rows(&app).await, folded, "the start fills in what the fold would have written");
    let indexes = app.index_definitions("workflows", 1).await;
    assert!(indexes.iter().any(|index| index.contains("runs_open_by_revision")), "{indexes:?}");
    projector::migrate(&app.pool).await.expect("a second start");
    assert_eq!(revision_rows(&app).await, folded, "a second start changes nothing");
}

#[tokio::test]
async fn erasing_a_contact_ends_its_runs_and_shreds_their_input() {
    let sink = SmtpSink::start().await;
    let napper = json!([{
        "slug": "napper", "name": "Napper",
        "steps": [
            {"id": "start", "type": "incoming_webhook", "referenceId": "nap-hook", "next": "nap"},
            {"id": "nap", "type": "wait", "duration": "1h", "next": "hello"},
            {"id": "hello", "type": "send_email", "template": "hello"}
        ]
    }]);
    let app = app_with(&sink, napper).await;
    let workflow = workflow_id(&app, "napper").await;
    let input = json!({"secret": "s3cr3t", "contact": {"email": "gone@example.com", "firstName": "Gone"}});
    let started = post(&app, "/workflows/nap-hook", None, Some(&input)).await;
    let run_id = started.body["data"]["id"].as_str().expect("run id").to_owned();
    let contact_id = started.body["data"]["contactId"].as_str().expect("contact").to_owned();
    wait_for_run(&app, &workflow, &run_id, |run| run["status"] == "sleeping").await;
    let deleted = app
        .send(app.request(reqwest::Method::DELETE, &format!("/schemas/people/records/{contact_id}"), Some(MAIL_KEY)))
        .await;
    assert_eq!(deleted.status, 200, "{:?}", deleted.body);
    let run = wait_for_run(&app, &workflow, &run_id, finished).await;
    assert_eq!(run["status"], "exited", "{run}");
    assert_eq!(run["error"]["code"], "contact_erased", "{run}");
    assert!(sink.messages().await.is_empty(), "nothing is sent to an erased contact");
    // Once the erasure completes, the run's input reads as erased: its key is gone.
    let operation_id = deleted.body["data"]["operationId"].as_str().expect("operation").to_owned();
    let deadline = Instant::now() + WAIT;
    loop {
        let status = app.get(&format!("/record-deletions/{operation_id}"), MAIL_KEY).await;
        if status.body["data"]["status"] == "completed" {
            break;
        }
        assert!(Instant::now() < deadline, "the erasure did not complete: {:?}", status.body);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let client = app.pool.get().await.expect("client");
    let keys = platform::crypto::load_keys(&client, std::slice::from_ref(&contact_id)).await.expect("keys");
    let sealed: Vec<u8> =
        client.query_one("SELECT input FROM workflow_runs WHERE run_id = $1", &[&run_id]).await.expect("row").get(0);
    let sealed = <platform::proto::Sealed as prost::Message>::decode(sealed.as_slice()).expect("a seal");
    let opened: Option<platform::proto::WorkflowInput> = platform::events::open(Some(&sealed), &keys).expect("opens");
    assert_eq!(opened, None, "the run's input is shredded with the contact's key");
}

/// The error of a run's history record of `step_id`.
fn error_of_step<'a>(run: &'a Value, step_id: &str) -> &'a Value {
    let history = run["history"].as_array().expect("history");
    let record = history.iter().find(|record| record["stepId"] == step_id).expect("the step ran");
    &record["error"]
}

#[tokio::test]
async fn reentry_counts_runs_of_every_trigger_and_a_skipped_send_names_its_gate() {
    let sink = SmtpSink::start().await;
    // A newsletter journey entered through the API and also by a purchase (`once`): a contact
    // who came in through the API and then buys is not run again. Its send names the gate
    // that refused it.
    let journey = json!([{
        "slug": "welcome", "name": "Welcome",
        "triggers": [{"event": "purchase", "reentry": "once"}],
        "steps": [
            {"id": "start", "type": "incoming_webhook", "referenceId": "welcome-hook", "next": "mail"},
            {"id": "mail", "type": "send_email", "template": "newsletter", "next": "join"},
            {"id": "join", "type": "subscribe", "topic": "news", "next": "again"},
            {"id": "again", "type": "send_email", "template": "newsletter", "next": null}
        ]
    }]);
    let app = app_with(&sink, journey).await;
    let workflow = workflow_id(&app, "welcome").await;

    // No consent: both sends are skipped by the consent gate.
    let input = json!({"contact": {"email": "nocon@example.com", "firstName": "No"}});
    let started = post(&app, "/workflows/welcome-hook", None, Some(&input)).await;
    assert_eq!(started.status, 202, "{:?}", started.body);
    let run_id = started.body["data"]["id"].as_str().expect("run id").to_owned();
    let run = wait_for_run(&app, &workflow, &run_id, finished).await;
    let error = error_of_step(&run, "mail");
    assert_eq!((error["code"].as_str(), error["gate"].as_str()), (Some("recipient_not_subscribed"), Some("consent")));
    assert!(error["message"].as_str().is_some_and(|message| message.contains("consent")), "{error}");

    // Consent but no subscription yet: the topic gate refuses the first send; after the
    // subscribe step the second goes out.
    let input = json!({"contact": {"email": "ada@example.com", "firstName": "Ada", "newsConsent": true}});
    let started = post(&app, "/workflows/welcome-hook", None, Some(&input)).await;
    assert_eq!(started.status, 202, "{:?}", started.body);
    let run_id = started.body["data"]["id"].as_str().expect("run id").to_owned();
    let contact_id = started.body["data"]["contactId"].as_str().expect("contact").to_owned();
    let run = wait_for_run(&app, &workflow, &run_id, finished).await;
    assert_eq!(run["status"], "completed", "{run}");
    let error = error_of_step(&run, "mail");
    assert_eq!((error["code"].as_str(), error["gate"].as_str()), (Some("recipient_not_subscribed"), Some("topic")));
    assert_eq!(error_of_step(&run, "again"), &Value::Null, "{run}");
    let messages = sink.wait_for(1, WAIT).await;
    assert_eq!(messages[0]["rcptTo"][0], "ada@example.com");

    // The workflow's counts: what runs did at each step, skips by their gate, and what became
    // of a send step's emails, opened by a person here.
    let pixel = crate::engagement::tracked(&messages[0], "open?sig=").pop().expect("a pixel");
    assert_eq!(crate::engagement::get(&app, &pixel).await.status(), 200);
    let deadline = std::time::Instant::now() + WAIT;
    let stats = loop {
        let stats = app.get(&format!("/workflows/{workflow}/stats"), MAIL_KEY).await;
        assert_eq!(stats.status, 200, "{:?}", stats.body);
        if stats.body["data"]["steps"][3]["emails"]["opened"] == 1 {
            break stats.body["data"].clone();
        }
        assert!(std::time::Instant::now() < deadline, "the open was not counted: {:?}", stats.body);
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_conforms("WorkflowStats", std::slice::from_ref(&stats));
    let step = |id: &str| stats["steps"].as_array().and_then(|steps| steps.iter().find(|step| step["stepId"] == id));
    let (mail, again) = (step("mail").expect("mail"), step("again").expect("again"));
    assert_eq!((&mail["entered"], &mail["completed"]), (&json!(2), &json!(0)), "{stats}");
    assert_eq!(mail["skipped"], json!({"total": 2, "byReason": {"consent": 1, "topic": 1}}), "{stats}");
    assert_eq!(mail["emails"]["scheduled"], 0, "{stats}");
    assert_eq!((&again["entered"], &again["completed"], &again["inProgress"]), (&json!(2), &json!(1), &json!(0)));
    assert_eq!(again["skipped"], json!({"total": 1, "byReason": {"consent": 1}}), "{stats}");
    let emails = &again["emails"];
    assert_eq!(
        (&emails["scheduled"], &emails["sent"], &emails["opened"]),
        (&json!(1), &json!(1), &json!(1)),
        "{stats}"
    );
    assert_eq!((&emails["openRate"], &emails["clickRate"]), (&json!(1.0), &json!(0.0)), "{stats}");
    assert_eq!(step("start").expect("start")["emails"], Value::Null);
    let runs = &stats["runs"];
    assert_eq!(runs["completed"].as_i64().unwrap_or(0) + runs["exited"].as_i64().unwrap_or(0), 2, "{stats}");
    let missing = app.get("/workflows/wf_missing/stats", MAIL_KEY).await;
    assert_eq!(missing.code(), "workflow_not_found");
    // The trail shows the gate too, and conforms to the document.
    let trail = app.get(&format!("/schemas/people/records/{contact_id}/audit-trail?channel=workflow"), MAIL_KEY).await;
    let entries = trail.body["data"].as_array().expect("entries");
    assert!(entries.iter().any(|entry| entry["error"]["gate"] == "topic"), "{entries:?}");
    assert_conforms("AuditTrailEntry", entries);

    // The contact who entered through the API buys: `once` counts that run, so no second run
    // starts; a buyer who never entered starts one.
    let buyer = person(&app, "buyer@example.com", "Bea").await;
    for contact in [&contact_id, &buyer] {
        let fired = app.post("/events/purchase", MAIL_KEY, &json!({"contactId": contact, "amount": 12})).await;
        assert_eq!(fired.status, 202, "{:?}", fired.body);
    }
    let runs = runs_of(&app, &workflow, 3).await;
    app.wait_for_workers().await;
    let runs_after = runs_of(&app, &workflow, 3).await;
    assert_eq!(runs, runs_after);
    let of_ada = runs.iter().filter(|(contact, ..)| contact == &contact_id).count();
    let of_buyer: Vec<_> = runs.iter().filter(|(contact, ..)| contact == &buyer).collect();
    assert_eq!(of_ada, 1, "the API's run counts for `once`: {runs:?}");
    assert_eq!(of_buyer.len(), 1, "{runs:?}");
    assert_eq!(of_buyer[0].1, "event");
}

#[tokio::test]
async fn a_journey_waits_for_an_open_and_resends_when_the_mail_was_not_opened() {
    let sink = SmtpSink::start().await;
    // Send the promo, wait up to four seconds for a person to open it: an open goes on to a
    // thank-you update at once; no open resends, through a branch on the send step's open.
    let journey = json!([{
        "slug": "nudge", "name": "Nudge",
        "steps": [
            {"id": "start", "type": "incoming_webhook", "referenceId": "nudge-hook", "next": "mail"},
            {"id": "mail", "type": "send_email", "template": "promo", "next": "wait"},
            {"id": "wait", "type": "wait_for_engagement", "step": "mail", "action": "opened", "timeout": "4s",
             "onEngaged": "thanks", "onTimeout": "check"},
            {"id": "thanks", "type": "update_contact", "set": {"firstName": "Reader"}, "next": null},
            {"id": "check", "type": "branch", "arms": [{"condition": "steps.mail.opened is false", "next": "again"}],
             "default": null},
            {"id": "again", "type": "send_email", "template": "promo", "next": null}
        ]
    }]);
    let app = app_with(&sink, journey).await;
    let workflow = workflow_id(&app, "nudge").await;
    let mut runs = Vec::new();
    for email in ["ada@example.com", "bea@example.com"] {
        let input = json!({"contact": {"email": email, "newsConsent": true}});
        let started = post(&app, "/workflows/nudge-hook", None, Some(&input)).await;
        assert_eq!(started.status, 202, "{:?}", started.body);
        runs.push(started.body["data"]["id"].as_str().expect("run id").to_owned());
    }
    let messages = sink.wait_for(2, WAIT).await;
    let to_ada = messages.iter().find(|message| message["rcptTo"][0] == "ada@example.com").expect("Ada's mail");
    // A link checker's HEAD of Bea's pixel is a machine's open: it ends no wait.
    let pixel_of = |message: &Value| crate::engagement::tracked(message, "open?sig=").pop().expect("a pixel");
    let to_bea = messages.iter().find(|message| message["rcptTo"][0] == "bea@example.com").expect("Bea's mail");
    let checker = reqwest::Client::new();
    let head = checker.head(crate::engagement::local(&app, &pixel_of(to_bea))).send().await.expect("HEAD");
    assert_eq!(head.status(), 200);
    wait_for_run(&app, &workflow, &runs[0], |run| run["status"] == "sleeping" && run["currentStepId"] == "wait").await;
    assert_eq!(crate::engagement::get(&app, &pixel_of(to_ada)).await.status(), 200);

    // Ada opened: the wait ends early and goes on to the thank-you.
    let ada = wait_for_run(&app, &workflow, &runs[0], finished).await;
    let path: Vec<(String, String)> = steps(&ada).into_iter().map(|(step, _, status)| (step, status)).collect();
    let expected = [("start", "completed"), ("mail", "completed"), ("wait", "completed"), ("thanks", "completed")];
    assert_eq!(path, expected.map(|(step, status)| (step.to_owned(), status.to_owned())), "{ada}");
    let at = |key: &str| {
        let text = ada["history"][2][key].as_str().unwrap_or_default();
        chrono::DateTime::parse_from_rfc3339(text).unwrap_or_else(|error| panic!("{key} {text:?}: {error}"))
    };
    let waited = at("finishedAt") - at("startedAt");
    assert!(waited < chrono::Duration::seconds(4), "the open ended the wait before its timeout: {waited}");
    // Bea did not: the wait times out, the branch reads that the mail was not opened, and
    // the promo goes again.
    let bea = wait_for_run(&app, &workflow, &runs[1], finished).await;
    let path: Vec<(String, String)> = steps(&bea).into_iter().map(|(step, _, status)| (step, status)).collect();
    let expected = [
        ("start", "completed"),
        ("mail", "completed"),
        ("wait", "timed_out"),
        ("check", "completed"),
        ("again", "completed"),
    ];
    assert_eq!(path, expected.map(|(step, status)| (step.to_owned(), status.to_owned())), "{bea}");
    let messages = sink.wait_for(3, WAIT).await;
    let to_bea = messages.iter().filter(|message| message["rcptTo"][0] == "bea@example.com").count();
    assert_eq!((messages.len(), to_bea), (3, 2), "Bea's reminder, no second mail for Ada");
}

/// A consenting contact in UTC at `email`, run through the `promote` journey (`workflow`) to
/// its end: the contact's id and the finished run.
async fn promote_in_utc(app: &TestApp, workflow: &str, email: &str) -> (String, Value) {
    let created = app
        .post("/schemas/people/records", MAIL_KEY, &json!({"email": email, "newsConsent": true, "timeZone": "UTC"}))
        .await;
    let contact = created.body["data"]["id"].as_str().expect("id").to_owned();
    let started = post(app, "/workflows/promote-hook", None, Some(&json!({"contact": {"id": contact}}))).await;
    assert_eq!(started.status, 202, "{:?}", started.body);
    let run_id = started.body["data"]["id"].as_str().expect("run id").to_owned();
    (contact, wait_for_run(app, workflow, &run_id, finished).await)
}

/// A journey whose send step's email quiet hours hold (a run triggered for a consenting
/// contact in UTC): the app, the workflow, the contact and the held email.
async fn held_journey_send(sink: &SmtpSink) -> (TestApp, String, String, String) {
    held_journey_send_with(sink, 1000).await
}

/// [`held_journey_send`] in a space whose monthly allowance is `allowance` emails.
async fn held_journey_send_with(sink: &SmtpSink, allowance: i64) -> (TestApp, String, String, String) {
    let (quiet, _) = crate::email::quiet_hours_around_now("hold");
    let policy = json!({"timeZone": {"attribute": "timeZone", "default": "UTC"}, "quietHours": quiet});
    let mut workspace: Value =
        serde_json::from_str(&crate::email::policy_workspace_with(allowance, &policy)).expect("the workspace is JSON");
    let spaces = workspace["spaces"].as_array_mut().expect("spaces");
    let mail = spaces.iter_mut().find(|space| space["slug"] == "mail").expect("the mail space");
    mail["workflows"] = json!([{
        "slug": "promote", "name": "Promote",
        "steps": [
            {"id": "start", "type": "incoming_webhook", "referenceId": "promote-hook", "next": "mail"},
            {"id": "mail", "type": "send_email", "template": "promo", "next": null}
        ]
    }]);
    let app = TestApp::spawn_with(Options { email: Some(test_email(sink)), ..Options::default() }).await;
    app.apply_workspace(&workspace.to_string(), true).await;
    publish_dkim(&app, sink).await;
    let workflow = workflow_id(&app, "promote").await;
    let (ada, run) = promote_in_utc(&app, &workflow, "ada@example.com").await;
    assert_eq!(run["status"], "completed", "the run goes on past a held send: {run}");

    // The step's email, from the workflow's delivery log: held until the quiet hours end.
    app.wait_for_projections().await;
    let log = app.get(&format!("/emails?workflowId={workflow}&stepId=mail"), MAIL_KEY).await;
    assert_eq!(log.status, 200, "{:?}", log.body);
    let row = &log.body["data"][0];
    assert_eq!((row["status"].as_str(), row["gate"].as_str()), (Some("held"), Some("quiet_hours")), "{row}");
    let email_id = row["id"].as_str().expect("an email").to_owned();
    let stats = app.get(&format!("/workflows/{workflow}/stats"), MAIL_KEY).await;
    assert_eq!(stats.body["data"]["steps"][1]["emails"]["held"], 1, "{:?}", stats.body);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(sink.messages().await.is_empty(), "nothing leaves before its time");

    (app, workflow, ada, email_id)
}

#[tokio::test]
async fn a_journeys_send_held_by_quiet_hours_completes_its_step_and_its_email_leaves_at_its_time() {
    let sink = SmtpSink::start().await;
    let (app, workflow, ada, email_id) = held_journey_send(&sink).await;

    // Day where the contact is now, and its time comes: it leaves, once.
    change(&app, &ada, &json!({"timeZone": "Etc/GMT-12"})).await;
    app.wait_for_projections().await;
    crate::email::make_due(&app, &email_id).await;
    crate::email::story_when(&app, &email_id, "sent").await;
    assert_eq!(sink.wait_for(1, WAIT).await.len(), 1);
    let stats = app.get(&format!("/workflows/{workflow}/stats"), MAIL_KEY).await;
    let emails = &stats.body["data"]["steps"][1]["emails"];
    assert_eq!((emails["held"].as_i64(), emails["sent"].as_i64()), (Some(0), Some(1)), "{:?}", stats.body);
}

/// With the month's allowance used up (by the held email of the first run), a journey's send
/// that quiet hours would hold cannot be held (a held email counts when it is stored): its step
/// is skipped as the allowance's, and the run completes. It was decided `held` again, which the
/// allowance refused again, and the run backed off and tried again for ever.
#[tokio::test]
async fn a_journeys_send_in_quiet_hours_beyond_the_allowance_is_skipped_and_the_run_completes() {
    let sink = SmtpSink::start().await;
    let (app, workflow, _, _) = held_journey_send_with(&sink, 1).await;
    let (_, run) = promote_in_utc(&app, &workflow, "bea@example.com").await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(error_of_step(&run, "mail")["code"], "email_limit_reached", "{run}");
    let used = app.query_i64("SELECT coalesce(sum(used), 0)::bigint FROM email_allowance_usage").await;
    assert_eq!(used, 1, "only the first run's held email counts");
}

#[tokio::test]
async fn a_journeys_held_send_skipped_at_its_time_counts_as_its_steps_skip_in_the_stats_and_the_log() {
    let sink = SmtpSink::start().await;
    let (app, workflow, _, email_id) = held_journey_send(&sink).await;
    let suppressed = app
        .post("/contacts/suppressions", MAIL_KEY, &json!({"identifier": "ada@example.com", "reason": "manual"}))
        .await;
    assert_eq!(suppressed.status, 201, "{:?}", suppressed.body);
    app.wait_for_projections().await;
    crate::email::make_due(&app, &email_id).await;
    let story = crate::email::story_when(&app, &email_id, "skipped").await;
    let last = story["timeline"].as_array().and_then(|timeline| timeline.last()).cloned().unwrap_or_default();
    assert_eq!(last["gate"], "suppressed", "{story}");

    let stats = app.get(&format!("/workflows/{workflow}/stats"), MAIL_KEY).await;
    let step = &stats.body["data"]["steps"][1];
    assert_eq!(
        (&step["entered"], &step["completed"], &step["inProgress"]),
        (&json!(1), &json!(0), &json!(0)),
        "the step's email was not sent: {step}"
    );
    assert_eq!(step["skipped"], json!({"total": 1, "byReason": {"suppressed": 1}}), "{step}");
    assert_eq!((&step["emails"]["scheduled"], &step["emails"]["held"]), (&json!(0), &json!(0)), "{step}");
    // The delivery log of the step agrees.
    let skipped = app.get(&format!("/emails?workflowId={workflow}&stepId=mail&status=skipped"), MAIL_KEY).await;
    assert_eq!(skipped.body["data"].as_array().map(Vec::len), Some(1), "{:?}", skipped.body);
    let rows = app.get(&format!("/emails?workflowId={workflow}&stepId=mail"), MAIL_KEY).await;
    assert_eq!(rows.body["data"].as_array().map(Vec::len), Some(1), "{:?}", rows.body);
    assert!(sink.messages().await.is_empty(), "a suppressed address is never mailed");
}

/// The log position of version `version` of `stream_id`.
async fn position_of(app: &TestApp, stream_id: &str, version: i64) -> i64 {
    app.query_i64(&format!(
        "SELECT position FROM events WHERE stream_id = '{stream_id}' AND stream_version = {version}"
    ))
    .await
}

#[tokio::test]
async fn a_skipped_send_has_a_story_naming_its_gate_and_the_fact_that_decided() {
    let sink = SmtpSink::start().await;
    let journey = json!([{
        "slug": "promote", "name": "Promote",
        "steps": [
            {"id": "start", "type": "incoming_webhook", "referenceId": "promote-hook", "next": "mail"},
            {"id": "mail", "type": "send_email", "template": "promo", "next": null}
        ]
    }]);
    let app = app_with(&sink, journey).await;
    let workflow = workflow_id(&app, "promote").await;
    let skipped_story = |run: Value| {
        let app = &app;
        async move {
            let error = error_of_step(&run, "mail").clone();
            let email_id = error["emailId"].as_str().unwrap_or_else(|| panic!("the skip names its email: {run}"));
            let deadline = Instant::now() + WAIT;
            loop {
                let story = app.get(&format!("/emails/{email_id}"), MAIL_KEY).await;
                if story.status == 200 {
                    assert_conforms("EmailStory", std::slice::from_ref(&story.body["data"]));
                    break (error, story.body["data"].clone());
                }
                assert!(Instant::now() < deadline, "no story for {email_id}: {:?}", story.body);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };

    // Consent given, then withdrawn, then the name changed: the withdrawal decided, not the
    // latest write of the record.
    let ada =
        app.post("/schemas/people/records", MAIL_KEY, &json!({"email": "ada@example.com", "newsConsent": true})).await;
    let ada = ada.body["data"]["id"].as_str().expect("id").to_owned();
    change(&app, &ada, &json!({"newsConsent": false})).await;
    change(&app, &ada, &json!({"firstName": "Ada"})).await;
    let started = post(&app, "/workflows/promote-hook", None, Some(&json!({"contact": {"id": ada}}))).await;
    assert_eq!(started.status, 202, "{:?}", started.body);
    let run_id = started.body["data"]["id"].as_str().expect("run id").to_owned();
    let run = wait_for_run(&app, &workflow, &run_id, finished).await;
    assert_eq!(run["status"], "completed", "a skip does not stop the run: {run}");
    let (error, story) = skipped_story(run).await;
    assert_eq!(error["gate"], "consent");
    assert_eq!(
        (&story["status"], &story["contactId"], &story["sentAt"]),
        (&json!("skipped"), &json!(ada), &Value::Null)
    );
    assert_eq!(
        story["origin"],
        json!({"type": "workflow", "workflowId": workflow, "workflowRunId": run_id, "stepId": "mail"})
    );
    let entry = &story["timeline"][0];
    assert_eq!((&entry["type"], &entry["gate"]), (&json!("skipped"), &json!("consent")), "{story}");
    assert_eq!(entry["error"]["code"], "recipient_not_subscribed", "{story}");
    let withdrawal = position_of(&app, &format!("record/{ada}"), 2).await;
    assert_eq!(
        (&entry["decidedBy"]["position"], &entry["decidedBy"]["type"]),
        (&json!(withdrawal), &json!("RecordUpdated")),
        "{story}"
    );
    assert_eq!(story["timeline"].as_array().map(Vec::len), Some(1), "{story}");

    // A suppressed address: the suppression's addition decided.
    let bea =
        app.post("/schemas/people/records", MAIL_KEY, &json!({"email": "bea@example.com", "newsConsent": true})).await;
    let bea = bea.body["data"]["id"].as_str().expect("id").to_owned();
    let suppressed = app
        .post("/contacts/suppressions", MAIL_KEY, &json!({"identifier": "bea@example.com", "reason": "manual"}))
        .await;
    assert_eq!(suppressed.status, 201, "{:?}", suppressed.body);
    let suppression_id = suppressed.body["data"]["id"].as_str().expect("id").to_owned();
    let started = post(&app, "/workflows/promote-hook", None, Some(&json!({"contact": {"id": bea}}))).await;
    let run_id = started.body["data"]["id"].as_str().expect("run id").to_owned();
    let (error, story) = skipped_story(wait_for_run(&app, &workflow, &run_id, finished).await).await;
    assert_eq!((&error["gate"], &error["code"]), (&json!("suppressed"), &json!("recipient_suppressed")));
    let entry = &story["timeline"][0];
    let added = position_of(&app, &format!("suppression/{suppression_id}"), 1).await;
    assert_eq!(
        (&entry["decidedBy"]["position"], &entry["decidedBy"]["type"]),
        (&json!(added), &json!("SuppressionAdded")),
        "{story}"
    );

    // The contact's emails list the skipped one; nothing went out, and no step's email count
    // holds a skip.
    let listed = app.get(&format!("/emails?contactId={bea}"), MAIL_KEY).await;
    assert_eq!(listed.body["pagination"]["totalCount"], 1, "{:?}", listed.body);
    assert_eq!(listed.body["data"][0]["status"], "skipped", "{:?}", listed.body);
    assert_conforms("EmailSummary", std::slice::from_ref(&listed.body["data"][0]));
    let stats = app.get(&format!("/workflows/{workflow}/stats"), MAIL_KEY).await;
    let mail = &stats.body["data"]["steps"][1];
    assert_eq!(mail["skipped"], json!({"total": 2, "byReason": {"consent": 1, "suppressed": 1}}), "{:?}", stats.body);
    assert_eq!(mail["emails"]["scheduled"], 0, "{:?}", stats.body);
    app.wait_for_workers().await;
    assert!(sink.messages().await.is_empty(), "nothing was sent");
}
