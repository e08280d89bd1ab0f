//! Broadcasts: authored in the workspace file, changed and sent through the API, run by the
//! projector's broadcast engine into a loopback SMTP sink: every consenting recipient once,
//! suppressed and unsubscribed ones skipped with their reason, across kill -9.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::email::{BLAST_BROADCAST, MAIL_KEY, QUICK_FORM, WEEKLY_BROADCAST, mail_app};
use crate::helpers::*;
use crate::smtp_sink::SmtpSink;

const WAIT: Duration = Duration::from_secs(30);

async fn with_key(app: &TestApp, method: reqwest::Method, path: &str, key: &str, body: Option<&Value>) -> TestResponse {
    let mut request = app.request(method, path, Some(MAIL_KEY)).header("Idempotency-Key", key);
    if let Some(body) = body {
        request = request.json(body);
    }
    app.send(request).await
}

pub(crate) async fn send(app: &TestApp, broadcast_id: &str, key: &str) -> TestResponse {
    with_key(app, reqwest::Method::POST, &format!("/broadcasts/{broadcast_id}/send"), key, None).await
}

pub(crate) async fn patch(app: &TestApp, broadcast_id: &str, key: &str, body: &Value) -> TestResponse {
    with_key(app, reqwest::Method::PATCH, &format!("/broadcasts/{broadcast_id}"), key, Some(body)).await
}

/// Polls a run until it has `completed` (or failed) and returns it.
pub(crate) async fn finished_run(app: &TestApp, broadcast_id: &str, run_id: &str, timeout: Duration) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let run = app.get(&format!("/broadcasts/{broadcast_id}/runs/{run_id}"), MAIL_KEY).await;
        assert_eq!(run.status, 200, "{:?}", run.body);
        let data = &run.body["data"];
        let settled = data["counts"]["queued"] == 0 && data["counts"]["pending"] == 0;
        if (data["status"] == "completed" && settled) || data["status"] == "failed" {
            return data.clone();
        }
        assert!(Instant::now() < deadline, "the run did not finish: {data}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn subscribe(app: &TestApp, email: &str) {
    let response = app
        .send(
            app.request(reqwest::Method::POST, &format!("/forms/{QUICK_FORM}/submit"), None)
                .json(&json!({"email": email, "firstName": "Reader"})),
        )
        .await;
    assert!(response.status < 300, "{:?}", response.body);
}

#[tokio::test]
async fn a_broadcast_is_read_changed_and_sent_to_its_topic_once_per_consenting_subscriber() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 1000).await;
    let list = app.get("/broadcasts", MAIL_KEY).await;
    assert_eq!(list.status, 200, "{:?}", list.body);
    assert_eq!(list.body["pagination"]["totalCount"], 2);
    let weekly = app.get(&format!("/broadcasts/{WEEKLY_BROADCAST}"), MAIL_KEY).await;
    assert_eq!(weekly.body["data"]["name"], "Weekly news");
    assert_eq!(weekly.body["data"]["audience"]["type"], "topic");
    assert_eq!(weekly.body["data"]["scheduledAt"], Value::Null);
    for (path, code) in [
        ("/broadcasts/bc_missing".to_owned(), "broadcast_not_found"),
        (format!("/broadcasts/{WEEKLY_BROADCAST}/runs/run_missing"), "broadcast_run_not_found"),
    ] {
        let missing = app.get(&path, MAIL_KEY).await;
        assert_eq!((missing.status, missing.code().as_str()), (404, Some(code)), "{path}");
    }
    let other = app.get(&format!("/broadcasts/{WEEKLY_BROADCAST}"), ALPHA_ADMIN).await;
    assert_eq!(other.code(), "broadcast_not_found", "another space sees none of it");
    // The workspace file's slug names it too, in the caller's space only.
    let by_slug = app.get("/broadcasts/weekly", MAIL_KEY).await;
    assert_eq!((by_slug.status, &by_slug.body["data"]), (200, &weekly.body["data"]), "{:?}", by_slug.body);
    let other = app.get("/broadcasts/weekly", ALPHA_ADMIN).await;
    assert_eq!(other.code(), "broadcast_not_found", "another space's slug names nothing here");

    // Three subscribers through the form (subscribed and consenting), one of them suppressed;
    // a consenting contact who never subscribed is not in the topic's audience.
    for email in ["one@example.com", "two@example.com", "held@example.com"] {
        subscribe(&app, email).await;
    }
    let suppressed = app
        .post("/contacts/suppressions", MAIL_KEY, &json!({"identifier": "held@example.com", "reason": "manual"}))
        .await;
    assert_eq!(suppressed.status, 201, "{:?}", suppressed.body);
    let outsider = app
        .post("/schemas/people/records", MAIL_KEY, &json!({"email": "outsider@example.com", "newsConsent": true}))
        .await;
    assert_eq!(outsider.status, 201);
    app.wait_for_workers().await;

    let sent = send(&app, WEEKLY_BROADCAST, "weekly-1").await;
    assert_eq!(sent.status, 202, "{:?}", sent.body);
    let run_id = sent.body["data"]["id"].as_str().expect("run id").to_owned();
    assert!(run_id.starts_with("bcr_"), "a broadcast run id is bcr_ (D2): {run_id}");
    assert_eq!(sent.body["data"]["status"], "scheduled");
    assert_conforms("BroadcastRun", std::slice::from_ref(&sent.body["data"]));
    let replay = send(&app, WEEKLY_BROADCAST, "weekly-1").await;
    assert_eq!((replay.header("idempotent-replay"), &replay.body["data"]["id"]), (Some("true"), &json!(run_id)));

    let run = finished_run(&app, WEEKLY_BROADCAST, &run_id, WAIT).await;
    assert_eq!(run["status"], "completed", "{run}");
    let by_slug = app.get(&format!("/broadcasts/weekly/runs/{run_id}"), MAIL_KEY).await;
    assert_eq!((by_slug.status, &by_slug.body["data"]["id"]), (200, &json!(run_id)), "{:?}", by_slug.body);
    let runs = app.get("/broadcasts/weekly/runs", MAIL_KEY).await;
    assert_eq!(runs.body["data"][0]["id"], json!(run_id), "{:?}", runs.body);
    assert_eq!(run["counts"]["audience"], 3, "{run}");
    assert_eq!(run["counts"]["sent"], 2, "{run}");
    assert_eq!(run["counts"]["skipped"]["suppressed"], 1, "{run}");
    // The suppressed recipient has a story: its email, skipped by the suppression gate, decided
    // by the suppression's addition.
    let story = skipped_story(&app, &run_id).await;
    let refusal = &story["timeline"][0];
    assert_eq!(
        (refusal["gate"].as_str(), refusal["error"]["code"].as_str()),
        (Some("suppressed"), Some("recipient_suppressed"))
    );
    assert_eq!(refusal["decidedBy"]["type"], "SuppressionAdded", "{refusal}");
    let messages = sink.wait_for(2, WAIT).await;
    let mut recipients: Vec<&str> = messages.iter().filter_map(|message| message["rcptTo"][0].as_str()).collect();
    recipients.sort_unstable();
    assert_eq!(recipients, ["one@example.com", "two@example.com"]);
    for message in &messages {
        assert_eq!(message["dkim"]["valid"], true, "{message}");
        assert_eq!(message["headers"]["list-unsubscribe-post"][0], "List-Unsubscribe=One-Click");
        assert_eq!(message["headers"]["subject"][0], "News for Reader");
        // The visible link of each recipient's own email, naming the broadcast's topic.
        crate::email::assert_unsubscribe_footer(message, "News");
    }
    // One reader opens the mail and follows its link; a link scanner follows the other's at
    // once. The run counts what people did, once per email, and its rates.
    use crate::engagement::tracked;
    let (reader, scanned) = (&messages[0], &messages[1]);
    let pixel = tracked(reader, "open?sig=").pop().expect("a pixel");
    let links = tracked(reader, "click?");
    assert!(!links.is_empty(), "the weekly news has a tracked link: {reader}");
    tokio::time::sleep(Duration::from_millis(10_500)).await; // past the scanners' moment
    for _ in 0..2 {
        assert_eq!(crate::engagement::get(&app, &pixel).await.status(), 200);
        assert_eq!(crate::engagement::get(&app, &links[0]).await.status(), 302);
    }
    let scanner = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("a client");
    let scanned_link = tracked(scanned, "click?").pop().expect("a link");
    let head = scanner.head(crate::engagement::local(&app, &scanned_link)).send().await.expect("HEAD");
    assert_eq!(head.status(), 302);
    let deadline = Instant::now() + WAIT;
    let run = loop {
        let run =
            app.get(&format!("/broadcasts/{WEEKLY_BROADCAST}/runs/{run_id}"), MAIL_KEY).await.body["data"].clone();
        if run["counts"]["opened"] == 1 && run["counts"]["clicked"] == 1 {
            break run;
        }
        assert!(Instant::now() < deadline, "the opens and clicks were not counted: {run}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_conforms("BroadcastRun", std::slice::from_ref(&run));
    let counts = &run["counts"];
    assert_eq!(counts["sent"], json!(messages.len()), "what the sink got: {run}");
    assert_eq!((&counts["openRate"], &counts["clickRate"]), (&json!(0.5), &json!(0.5)), "{run}");
    assert_eq!((&counts["bounced"], &counts["complained"], &counts["unsubscribed"]), (&json!(0), &json!(0), &json!(0)));
    // The reader leaves the topic on the email's preference page (as the page posts it): an
    // opt-out the run counts, as it counts the one-click link's.
    let reader_email = reader["headers"]["message-id"][0]
        .as_str()
        .and_then(|id| id.trim_start_matches('<').split('@').next())
        .expect("a message id")
        .to_owned();
    let topic_id = app.get("/topics", MAIL_KEY).await.body["data"][0]["id"].as_str().expect("a topic").to_owned();
    let saved = app
        .send(
            app.request(reqwest::Method::POST, &format!("/emails/{reader_email}/preferences"), None)
                .header("Content-Type", "application/x-www-form-urlencoded")
                .body(format!("action=save&{topic_id}=unsubscribed")),
        )
        .await;
    assert_eq!(saved.status, 200, "{:?}", saved.body);
    let deadline = Instant::now() + WAIT;
    loop {
        let run =
            app.get(&format!("/broadcasts/{WEEKLY_BROADCAST}/runs/{run_id}"), MAIL_KEY).await.body["data"].clone();
        if run["counts"]["unsubscribed"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the page's opt-out was not counted: {run}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let runs = app.get(&format!("/broadcasts/{WEEKLY_BROADCAST}/runs"), MAIL_KEY).await;
    assert_eq!(runs.body["pagination"]["totalCount"], 1);
    assert_eq!(runs.body["data"][0]["id"], run_id.as_str());

    // The blast: its authored segment does not exist, so it cannot be sent until it names one.
    let missing_segment = send(&app, BLAST_BROADCAST, "blast-1").await;
    assert_eq!(missing_segment.code(), "segment_not_found", "{:?}", missing_segment.body);
    let segment =
        app.post("/segments", MAIL_KEY, &json!({"name": "Consenting", "definition": "has email consent"})).await;
    assert_eq!(segment.status, 201, "{:?}", segment.body);
    let segment_id = segment.body["data"]["id"].as_str().expect("id").to_owned();
    for (body, field) in [
        (json!({}), None),
        (json!({"templateId": "tpl_x", "name": "x"}), Some("templateId")),
        (json!({"audience": {"type": "topic", "segmentId": "a"}}), Some("audience")),
        (json!({"audience": {"segmentId": "a", "topicId": "b"}}), Some("audience")),
        (json!({"scheduledAt": "soon"}), Some("scheduledAt")),
    ] {
        let refused = patch(&app, BLAST_BROADCAST, &format!("bad-{body}"), &body).await;
        assert_eq!((refused.status, refused.code().as_str()), (400, Some("invalid_broadcast")), "{body}");
        if let Some(field) = field {
            assert_eq!(refused.body["error"]["issues"][0]["key"], field);
        }
    }
    let unknown = patch(&app, BLAST_BROADCAST, "p-unknown", &json!({"audience": {"segmentId": "seg_nope"}})).await;
    assert_eq!(unknown.code(), "segment_not_found");
    let changed =
        patch(&app, BLAST_BROADCAST, "p-1", &json!({"name": "Big blast", "audience": {"segmentId": segment_id}})).await;
    assert_eq!(changed.status, 200, "{:?}", changed.body);
    assert_eq!(changed.body["data"]["name"], "Big blast");
    assert_eq!(changed.body["data"]["audience"], json!({"type": "segment", "segmentId": segment_id}));
    assert_eq!(changed.body["data"]["scheduledAt"], "2030-01-01T00:00:00.000Z");
    app.wait_for_workers().await;
    let mut shown = app.get(&format!("/broadcasts/{BLAST_BROADCAST}"), MAIL_KEY).await.body["data"].clone();
    assert_eq!(shown["name"], "Big blast");

    // What a GET returns is taken back: fixed fields unchanged, updatedAt ignored.
    shown["name"] = json!("Bigger blast");
    shown["updatedAt"] = json!("2001-01-01T00:00:00.000Z");
    let round_trip = patch(&app, BLAST_BROADCAST, "p-round-trip", &shown).await;
    assert_eq!(round_trip.status, 200, "{:?}", round_trip.body);
    assert_eq!(round_trip.body["data"]["name"], "Bigger blast");
    assert_eq!(round_trip.body["data"]["audience"], json!({"type": "segment", "segmentId": segment_id}));
    shown["slug"] = json!("another-slug");
    let moved = patch(&app, BLAST_BROADCAST, "p-moved", &shown).await;
    assert_eq!((moved.status, moved.code().as_str()), (400, Some("invalid_broadcast")), "{:?}", moved.body);
    assert_eq!(moved.body["error"]["issues"][0]["key"], "slug");

    // Scheduled for 2030: the run waits, and while it does the broadcast cannot change or be
    // sent again.
    let scheduled = send(&app, BLAST_BROADCAST, "blast-2").await;
    assert_eq!(scheduled.status, 202, "{:?}", scheduled.body);
    assert_eq!(scheduled.body["data"]["startAt"], "2030-01-01T00:00:00.000Z");
    let again = send(&app, BLAST_BROADCAST, "blast-3").await;
    assert_eq!((again.status, again.code().as_str()), (409, Some("broadcast_run_active")), "{:?}", again.body);
    let frozen = patch(&app, BLAST_BROADCAST, "p-2", &json!({"name": "Renamed"})).await;
    assert_eq!((frozen.status, frozen.code().as_str()), (409, Some("broadcast_run_active")));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let waiting = app.get(&format!("/broadcasts/{BLAST_BROADCAST}/runs"), MAIL_KEY).await;
    assert_eq!(waiting.body["data"][0]["status"], "scheduled", "{:?}", waiting.body);
    assert_eq!(sink.messages().await.len(), 2, "nothing more was sent");
}

/// Creates `count` people in the mail space, eight requests at a time.
pub(crate) async fn create_people(app: &TestApp, emails: Vec<(String, bool)>) {
    let chunks: Vec<Vec<(String, bool)>> = emails.chunks(emails.len().div_ceil(8).max(1)).map(<[_]>::to_vec).collect();
    let tasks: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            let (http, url) = (app.http.clone(), app.command_url.clone());
            tokio::spawn(async move {
                for (email, consent) in chunk {
                    let response = http
                        .post(format!("{url}/schemas/people/records"))
                        .bearer_auth(MAIL_KEY)
                        .json(&json!({"email": email, "firstName": "Fan", "newsConsent": consent}))
                        .send()
                        .await
                        .expect("sent");
                    assert_eq!(response.status().as_u16(), 201, "{email}");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a creating task");
    }
}

#[tokio::test]
async fn a_broadcast_to_1000_contacts_killed_mid_run_reaches_every_consenting_recipient_once() {
    // A thousand: ten batches, so the kill lands mid-run with batches decided, handed off and
    // pending. (It was 5,000: some 120 s of a core, which a full run on two cores could not
    // give it within the deadline, so the second projector was still sending after 180 s.)
    const PEOPLE: usize = 1_000;
    const UNSUBSCRIBED: usize = 50;
    const SUPPRESSED: usize = 50;
    let sink = SmtpSink::start().await;
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let mut env = sink.process_env(2000);
    env.extend([
        ("APP__BROADCASTS__RATE_PER_SECOND", "400".to_owned()),
        ("APP__BROADCASTS__BATCH", "100".to_owned()),
        ("APP__BROADCASTS__HANDOFFS", "16".to_owned()),
    ]);
    let mut first = spawn_binary("projector", &["run"], &app.database_url, &env);
    app.apply_workspace(&crate::email::mail_workspace(1_000_000), true).await;
    let domains = app.get("/domains", MAIL_KEY).await;
    for record in domains.body["data"][0]["records"].as_array().expect("records") {
        if record["purpose"] == "dkim" {
            sink.add_dkim_record(record["name"].as_str().expect("name"), record["value"].as_str().expect("value"))
                .await;
        }
    }
    let people: Vec<(String, bool)> =
        (0..PEOPLE).map(|index| (format!("fan{index:04}@example.com"), index >= UNSUBSCRIBED)).collect();
    create_people(&app, people).await;
    let suppressions: Vec<Value> = (UNSUBSCRIBED..UNSUBSCRIBED + SUPPRESSED)
        .map(|index| json!({"identifier": format!("fan{index:04}@example.com"), "reason": "manual"}))
        .collect();
    let suppressed = app.post("/contacts/suppressions/batch", MAIL_KEY, &json!({"suppressions": suppressions})).await;
    assert!(suppressed.status < 300, "{:?}", suppressed.body);
    let segment = app.post("/segments", MAIL_KEY, &json!({"name": "Fans", "definition": "firstName is Fan"})).await;
    assert_eq!(segment.status, 201, "{:?}", segment.body);
    let segment_id = segment.body["data"]["id"].as_str().expect("id").to_owned();
    let aimed =
        patch(&app, BLAST_BROADCAST, "aim", &json!({"audience": {"segmentId": segment_id}, "scheduledAt": null})).await;
    assert_eq!(aimed.status, 200, "{:?}", aimed.body);
    app.wait_for_projections().await;
    let members = app.get(&format!("/segments/{segment_id}"), MAIL_KEY).await;
    assert_eq!(members.body["data"]["memberCount"], PEOPLE, "{:?}", members.body);

    let sent = send(&app, BLAST_BROADCAST, "blast").await;
    assert_eq!(sent.status, 202, "{:?}", sent.body);
    let run_id = sent.body["data"]["id"].as_str().expect("run id").to_owned();
    // Killed with about a fifth delivered.
    let deadline = Instant::now() + Duration::from_secs(120);
    while sink.summary().await["accepted"].as_u64().unwrap_or(0) < 200 {
        assert!(Instant::now() < deadline, "the run did not get going");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    first.0.kill().expect("kill -9");
    let at_kill = sink.summary().await["accepted"].as_u64().unwrap_or(0);
    assert!(at_kill < 800, "the kill came mid-run ({at_kill} delivered)");
    let _second = spawn_binary("projector", &["run"], &app.database_url, &env);

    // A hand-off the kill interrupted is settled as unknown once its lease runs out (never
    // sent again blindly), so the run settles within that time.
    let run = finished_run(&app, BLAST_BROADCAST, &run_id, Duration::from_secs(180)).await;
    let consenting = PEOPLE - UNSUBSCRIBED - SUPPRESSED;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["counts"]["audience"], PEOPLE, "{run}");
    assert_eq!(run["counts"]["skipped"]["noConsent"], UNSUBSCRIBED, "{run}");
    assert_eq!(run["counts"]["skipped"]["suppressed"], SUPPRESSED, "{run}");
    let unknown = run["counts"]["outcomeUnknown"].as_u64().expect("a count");
    assert_eq!(run["counts"]["sent"].as_u64().expect("a count") + unknown, consenting as u64, "{run}");
    // In flight at the kill: at most the run's hand-offs (16) and the outbox worker's batch of
    // sends it took over after their grace (16).
    assert!(unknown <= 32, "at most the hand-offs in flight at the kill are unknown: {run}");

    let summary = sink.summary().await;
    assert_eq!(summary["dkimInvalid"], 0);
    let mut recipients: Vec<String> = summary["rcptTo"]
        .as_array()
        .expect("recipients")
        .iter()
        .filter_map(|r| r.as_str().map(str::to_owned))
        .collect();
    let delivered = recipients.len();
    recipients.sort();
    recipients.dedup();
    assert_eq!(recipients.len(), delivered, "no recipient was sent twice");
    let mut ids: Vec<&str> = summary["messageIds"].as_array().expect("ids").iter().filter_map(Value::as_str).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), delivered, "no email was sent twice");
    // Every consenting recipient got its one message, except those whose hand-off the kill
    // cut off before the relay had the message (outcome unknown, by design never resent).
    assert!(delivered as u64 >= consenting as u64 - unknown && delivered <= consenting, "{delivered} of {consenting}");
    let expected: Vec<String> =
        (UNSUBSCRIBED + SUPPRESSED..PEOPLE).map(|index| format!("fan{index:04}@example.com")).collect();
    assert!(recipients.iter().all(|recipient| expected.binary_search(recipient).is_ok()), "only consenting recipients");
    // Every refused recipient has one story, and no recipient has both a story and an email.
    let stories = app.query_i64("SELECT count(*) FROM events WHERE event_type = 'EmailSkipped.v1'").await;
    let storied =
        app.query_i64("SELECT count(DISTINCT subject_id) FROM events WHERE event_type = 'EmailSkipped.v1'").await;
    assert_eq!((stories, storied), ((UNSUBSCRIBED + SUPPRESSED) as i64, (UNSUBSCRIBED + SUPPRESSED) as i64));
    let both = app
        .query_i64(
            "SELECT count(*) FROM events s JOIN events e ON e.subject_id = s.subject_id
             WHERE s.event_type = 'EmailSkipped.v1' AND e.event_type = 'EmailScheduled.v1'",
        )
        .await;
    assert_eq!(both, 0, "a recipient with a story was also mailed");
    let unstoried = app
        .query_i64(&format!(
            "SELECT count(*) FROM broadcast_recipients r WHERE r.run_id = '{run_id}' AND r.state = 'skipped'
             AND NOT EXISTS (SELECT 1 FROM events e WHERE e.stream_id = 'email-' || r.email_id)"
        ))
        .await;
    assert_eq!(unstoried, 0, "every skipped recipient's story is in the log");
}

#[tokio::test]
async fn a_broadcast_gives_way_to_live_requests_and_still_mails_each_recipient_once() {
    const PEOPLE: usize = 40;
    let sink = SmtpSink::start().await;
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let ops_port = free_port();
    let mut env = sink.process_env(2000);
    env.extend([
        ("APP__BROADCASTS__RATE_PER_SECOND", "0".to_owned()),
        ("APP__BROADCASTS__BATCH", "10".to_owned()),
        ("APP__PROJECTOR__PORT", ops_port.to_string()),
    ]);
    let _projector = spawn_binary("projector", &["run"], &app.database_url, &env);
    app.apply_workspace(&crate::email::mail_workspace(1_000_000), true).await;
    let people: Vec<(String, bool)> = (0..PEOPLE).map(|index| (format!("busy{index:02}@example.com"), true)).collect();
    create_people(&app, people).await;
    let segment = segment(&app, "Busy fans", "firstName is Fan").await;
    let aimed =
        patch(&app, BLAST_BROADCAST, "aim", &json!({"audience": {"segmentId": segment}, "scheduledAt": null})).await;
    assert_eq!(aimed.status, 200, "{:?}", aimed.body);
    app.wait_for_projections().await;
    app.publish_busy_live_load().await;

    let sent = send(&app, BLAST_BROADCAST, "busy").await;
    assert_eq!(sent.status, 202, "{:?}", sent.body);
    let run_id = sent.body["data"]["id"].as_str().expect("run id").to_owned();
    let run = finished_run(&app, BLAST_BROADCAST, &run_id, Duration::from_secs(120)).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["counts"]["sent"], PEOPLE, "{run}");
    let mut recipients: Vec<String> = sink.summary().await["rcptTo"]
        .as_array()
        .expect("recipients")
        .iter()
        .filter_map(|recipient| recipient.as_str().map(str::to_owned))
        .collect();
    recipients.sort();
    recipients.dedup();
    assert_eq!(recipients.len(), PEOPLE, "each recipient once");
    // The run waited after its batches: the engine counts the time it gave way.
    let metrics = reqwest::get(format!("http://127.0.0.1:{ops_port}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    let yielded: f64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("broadcast_live_yield_milliseconds_total "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(yielded > 0.0, "the run gave way to the live requests: {yielded} ms");
}

/// The recipients of the sink's messages from the `from`th on.
async fn recipients_since(sink: &SmtpSink, from: usize) -> Vec<String> {
    let summary = sink.summary().await;
    summary["rcptTo"]
        .as_array()
        .expect("recipients")
        .iter()
        .skip(from)
        .filter_map(|r| r.as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_broadcast_partly_held_and_partly_capped_killed_twice_mails_each_recipient_once_or_tells_its_story() {
    // A quarter had a marketing email today (capped: skipped with a story), a quarter is in
    // its quiet hours (held, released when the policy changes, killed while they leave), the
    // rest is mailed at once (killed mid-run).
    const PEOPLE: usize = 400;
    const CAPPED: usize = 100;
    const QUIET: usize = 100;
    let sink = SmtpSink::start().await;
    let options = Options { email: Some(crate::email::test_email(&sink)), ..Options::without_projector() };
    let app = TestApp::spawn_with(options).await;
    // A short relay timeout keeps the leases of the hand-offs the kills cut off short.
    let mut env = sink.process_env(500);
    env.extend([
        ("APP__BROADCASTS__RATE_PER_SECOND", "200".to_owned()),
        ("APP__BROADCASTS__BATCH", "50".to_owned()),
        ("APP__BROADCASTS__HANDOFFS", "8".to_owned()),
        ("APP__EMAIL__OUTBOX_POLL_MS", "200".to_owned()),
    ]);
    let mut projector = spawn_binary("projector", &["run"], &app.database_url, &env);
    let (quiet, _) = crate::email::quiet_hours_around_now("hold");
    let policy = |quiet: Option<&Value>| {
        let mut policy = json!({
            "timeZone": {"attribute": "timeZone", "default": "UTC"},
            "frequencyCaps": [{"max": 1, "per": {"days": 1}, "outcome": "skip"}]
        });
        if let Some(quiet) = quiet {
            policy["quietHours"] = quiet.clone();
        }
        crate::email::policy_workspace_with(1_000_000, &policy)
    };
    app.apply_workspace(&policy(Some(&quiet)), true).await;
    crate::email::publish_dkim(&app, &sink).await;
    // Capped: fan0000..; quiet (UTC): the next hundred; the others where it is day.
    let bodies: Vec<Value> = (0..PEOPLE)
        .map(|index| {
            let zone = if (CAPPED..CAPPED + QUIET).contains(&index) { "UTC" } else { "Etc/GMT-12" };
            json!({"email": format!("fan{index:04}@example.com"), "firstName": "Fan", "newsConsent": true, "timeZone": zone})
        })
        .collect();
    for chunk in bodies.chunks(50) {
        let requests = chunk.iter().map(|body| app.post("/schemas/people/records", MAIL_KEY, body));
        for created in futures_util::future::join_all(requests).await {
            assert_eq!(created.status, 201, "{:?}", created.body);
        }
    }
    let promo = crate::email::template_id(&app, "promo").await;
    for index in 0..CAPPED {
        let body = json!({"data": {"contact": {"email": format!("fan{index:04}@example.com")}}});
        let today = crate::email::send(&app, &promo, &body, None).await;
        assert_eq!(today.body["data"]["status"], "sent", "{:?}", today.body);
    }
    let before = sink.summary().await["rcptTo"].as_array().map_or(0, Vec::len);
    assert_eq!(before, CAPPED);
    let segment = app.post("/segments", MAIL_KEY, &json!({"name": "Fans", "definition": "firstName is Fan"})).await;
    assert_eq!(segment.status, 201, "{:?}", segment.body);
    let segment_id = segment.body["data"]["id"].as_str().expect("id").to_owned();
    let aimed =
        patch(&app, BLAST_BROADCAST, "aim", &json!({"audience": {"segmentId": segment_id}, "scheduledAt": null})).await;
    assert_eq!(aimed.status, 200, "{:?}", aimed.body);
    app.wait_for_projections().await;

    let sent = send(&app, BLAST_BROADCAST, "blast").await;
    assert_eq!(sent.status, 202, "{:?}", sent.body);
    let run_id = sent.body["data"]["id"].as_str().expect("run id").to_owned();
    let deadline = Instant::now() + Duration::from_secs(120);
    while recipients_since(&sink, before).await.len() < 40 {
        assert!(Instant::now() < deadline, "the run did not get going");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    projector.0.kill().expect("kill -9");
    projector = spawn_binary("projector", &["run"], &app.database_url, &env);
    let deadline = Instant::now() + Duration::from_secs(180);
    let path = format!("/broadcasts/{BLAST_BROADCAST}/runs/{run_id}");
    let run = loop {
        let run = app.get(&path, MAIL_KEY).await.body["data"].clone();
        // Hand-offs the kill cut off settle when their lease runs out, at the end.
        if run["status"] == "completed" && run["counts"]["held"] == QUIET {
            break run;
        }
        assert!(Instant::now() < deadline, "the run did not settle: {run}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(run["counts"]["skipped"]["frequencyCap"], CAPPED, "{run}");

    // The quiet hours are lifted and the held sends are due: killed while they leave.
    app.apply_workspace(&policy(None), true).await;
    app.wait_for_projections().await;
    let mailed_before = recipients_since(&sink, before).await.len();
    let client = app.pool.get().await.expect("client");
    let due =
        client.execute("UPDATE email_outbox SET next_attempt_at = now() WHERE state = 'held'", &[]).await.expect("due");
    assert_eq!(due, QUIET as u64);
    drop(client);
    let deadline = Instant::now() + Duration::from_secs(60);
    while recipients_since(&sink, before).await.len() < mailed_before + 10 {
        assert!(Instant::now() < deadline, "the held sends did not leave");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    projector.0.kill().expect("kill -9");
    let _third = spawn_binary("projector", &["run"], &app.database_url, &env);
    let deadline = Instant::now() + Duration::from_secs(120);
    let run = loop {
        let run = app.get(&path, MAIL_KEY).await.body["data"].clone();
        if run["counts"]["held"] == 0 && run["counts"]["queued"] == 0 {
            break run;
        }
        assert!(Instant::now() < deadline, "the held sends did not settle: {run}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // Every recipient: mailed once, or a story; never both, never twice.
    let unknown = run["counts"]["outcomeUnknown"].as_u64().expect("a count");
    let mailed = run["counts"]["sent"].as_u64().expect("a count");
    assert_eq!(mailed + unknown, (PEOPLE - CAPPED) as u64, "{run}");
    assert!(unknown <= 2 * (8 + 16), "at most the hand-offs in flight at the kills are unknown: {run}");
    let mut recipients = recipients_since(&sink, before).await;
    let delivered = recipients.len();
    recipients.sort();
    recipients.dedup();
    assert_eq!(recipients.len(), delivered, "no recipient was mailed twice");
    assert!(delivered as u64 >= mailed, "{delivered} delivered, {mailed} recorded sent");
    let capped: Vec<String> = (0..CAPPED).map(|index| format!("fan{index:04}@example.com")).collect();
    assert!(recipients.iter().all(|recipient| capped.binary_search(recipient).is_err()), "no capped one is mailed");
    let stories = app
        .query_i64(&format!(
            "SELECT count(DISTINCT r.contact_id) FROM broadcast_recipients r
             JOIN events e ON e.stream_id = 'email-' || r.email_id AND e.event_type = 'EmailSkipped.v1'
             WHERE r.run_id = '{run_id}'"
        ))
        .await;
    assert_eq!(stories, CAPPED as i64, "each capped recipient has one story");
    let both = app
        .query_i64(&format!(
            "SELECT count(*) FROM broadcast_recipients r
             JOIN events s ON s.stream_id = 'email-' || r.email_id AND s.event_type = 'EmailSkipped.v1'
             JOIN events e ON e.stream_id = 'email-' || r.email_id AND e.event_type = 'EmailSent.v1'
             WHERE r.run_id = '{run_id}'"
        ))
        .await;
    assert_eq!(both, 0, "no recipient has both a story and a sent email");
    let released =
        app.query_i64("SELECT count(DISTINCT stream_id) FROM events WHERE event_type = 'EmailReleased.v1'").await;
    let releases = app.query_i64("SELECT count(*) FROM events WHERE event_type = 'EmailReleased.v1'").await;
    assert_eq!((released, releases), (QUIET as i64, QUIET as i64), "each held send released once");
    let states = app
        .query_string(&format!(
            "SELECT string_agg(DISTINCT state, ',' ORDER BY state) FROM broadcast_recipients WHERE run_id = '{run_id}'"
        ))
        .await;
    assert_eq!(states, "scheduled,skipped");
}

/// The story of the run's one skipped recipient, as `GET /emails/{id}` answers it: skipped,
/// sent by the run.
async fn skipped_story(app: &TestApp, run_id: &str) -> Value {
    let story_id = app
        .query_string(&format!(
            "SELECT email_id FROM broadcast_recipients WHERE run_id = '{run_id}' AND state = 'skipped'"
        ))
        .await;
    app.wait_for_projections().await;
    let story = app.get(&format!("/emails/{story_id}"), MAIL_KEY).await;
    assert_eq!(story.status, 200, "{:?}", story.body);
    assert_eq!(story.body["data"]["status"], "skipped", "{:?}", story.body);
    assert_eq!(story.body["data"]["origin"]["broadcastRunId"], json!(run_id), "{:?}", story.body);
    story.body["data"].clone()
}

/// A segment of the mail space defined by `definition`.
pub(crate) async fn segment(app: &TestApp, name: &str, definition: &str) -> String {
    let created = app.post("/segments", MAIL_KEY, &json!({"name": name, "definition": definition})).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    created.body["data"]["id"].as_str().expect("id").to_owned()
}

/// A run's status and audience as the run engine holds them (read directly: the test may hold
/// a read model back).
async fn run_row(app: &TestApp, run_id: &str) -> (String, Value, Option<i32>) {
    let client = app.pool.get().await.expect("client");
    let row = client
        .query_one("SELECT status, audience, audience_count FROM broadcast_runs WHERE run_id = $1", &[&run_id])
        .await
        .expect("the run's row");
    (row.get(0), row.get(1), row.get(2))
}

/// Waits until the run has left `scheduled` and `sending`, and returns its row.
async fn settled_run(app: &TestApp, run_id: &str) -> (String, Value, Option<i32>) {
    let deadline = Instant::now() + WAIT;
    loop {
        let row = run_row(app, run_id).await;
        if row.0 != "scheduled" && row.0 != "sending" {
            return row;
        }
        assert!(Instant::now() < deadline, "run {run_id} did not settle: {row:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_send_right_after_an_audience_change_goes_to_the_new_audience_even_while_read_models_lag() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 1000).await;
    let segments = [
        segment(&app, "Nobody at a", "email ends with @a.invalid").await,
        segment(&app, "Nobody at b", "email ends with @b.invalid").await,
    ];
    let unscheduled = patch(&app, BLAST_BROADCAST, "unschedule", &json!({"scheduledAt": null})).await;
    assert_eq!(unscheduled.status, 200, "{:?}", unscheduled.body);
    for round in 0..50 {
        // The second half with the broadcasts read model held back: a decision that read it
        // would see the previous audience every time.
        let paused = if round >= 25 { Some(app.pause_read_model("broadcasts").await) } else { None };
        let target = &segments[round % 2];
        let aimed =
            patch(&app, BLAST_BROADCAST, &format!("aim-{round}"), &json!({"audience": {"segmentId": target}})).await;
        assert_eq!(aimed.status, 200, "round {round}: {:?}", aimed.body);
        assert_eq!(aimed.body["data"]["audience"]["segmentId"], target.as_str(), "round {round}");
        let sent = send(&app, BLAST_BROADCAST, &format!("send-{round}")).await;
        assert_eq!(sent.status, 202, "round {round}: {:?}", sent.body);
        assert_eq!(sent.body["data"]["audience"]["segmentId"], target.as_str(), "round {round}: {:?}", sent.body);
        let run_id = sent.body["data"]["id"].as_str().expect("run id").to_owned();
        let (status, audience, _) = settled_run(&app, &run_id).await;
        assert_eq!(status, "completed", "round {round}");
        assert_eq!(audience["segmentId"], target.as_str(), "round {round}: the run names the audience the PATCH set");
        if let Some(paused) = paused {
            paused.resume().await;
        }
    }
}

#[tokio::test]
async fn a_segment_created_a_moment_ago_can_be_named_and_sent_to_at_once() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 1000).await;
    let fresh = app
        .post(
            "/schemas/people/records",
            MAIL_KEY,
            &json!({"email": "fresh@example.com",
        "firstName": "Fresh", "newsConsent": true}),
        )
        .await;
    assert_eq!(fresh.status, 201, "{:?}", fresh.body);
    app.wait_for_projections().await;
    // The segments read model is held back: the segment exists only in the log.
    let paused = app.pause_read_model("segments").await;
    let segment_id = segment(&app, "Fresh ones", "firstName is Fresh").await;
    let aimed =
        patch(&app, BLAST_BROADCAST, "aim", &json!({"audience": {"segmentId": segment_id}, "scheduledAt": null})).await;
    assert_eq!(aimed.status, 200, "{:?}", aimed.body);
    let webhook = app
        .post(
            "/webhooks",
            MAIL_KEY,
            &json!({"url": "http://127.0.0.1:9/hook", "trigger": "contact upserted", "schemaId": "people",
                    "condition": {"type": "segment", "segmentId": segment_id}}),
        )
        .await;
    assert_eq!(webhook.status, 201, "{:?}", webhook.body);
    let sent = send(&app, BLAST_BROADCAST, "send").await;
    assert_eq!(sent.status, 202, "{:?}", sent.body);
    let run_id = sent.body["data"]["id"].as_str().expect("run id").to_owned();
    // The run waits for membership as of its request rather than taking the lagging model's.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(run_row(&app, &run_id).await.0, "scheduled", "the run waits for the segments read model");
    paused.resume().await;
    let (status, _, audience_count) = settled_run(&app, &run_id).await;
    assert_eq!((status.as_str(), audience_count), ("completed", Some(1)));
    let messages = sink.wait_for(1, WAIT).await;
    assert_eq!(messages[0]["rcptTo"][0], "fresh@example.com");
}

#[tokio::test]
async fn two_concurrent_changes_of_different_fields_both_survive() {
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, 1000).await;
    // Held back, so that a decision on the read model could not see the other change.
    let paused = app.pause_read_model("broadcasts").await;
    let mut last = (String::new(), String::new());
    for round in 0..10 {
        let name = format!("Blast {round}");
        let at = format!("2031-01-{:02}T00:00:00.000Z", round + 1);
        let (name_key, at_key) = (format!("name-{round}"), format!("at-{round}"));
        let (name_body, at_body) = (json!({"name": name}), json!({"scheduledAt": at}));
        let (renamed, moved) = tokio::join!(
            patch(&app, BLAST_BROADCAST, &name_key, &name_body),
            patch(&app, BLAST_BROADCAST, &at_key, &at_body),
        );
        assert_eq!((renamed.status, moved.status), (200, 200), "{:?} {:?}", renamed.body, moved.body);
        // They are ordered: whichever came second answers with both changes.
        let both = |response: &TestResponse| {
            response.body["data"]["name"] == name.as_str() && response.body["data"]["scheduledAt"] == at.as_str()
        };
        assert!(both(&renamed) || both(&moved), "round {round}: {:?} {:?}", renamed.body, moved.body);
        last = (name, at);
    }
    paused.resume().await;
    app.wait_for_projections().await;
    let read = app.get(&format!("/broadcasts/{BLAST_BROADCAST}"), MAIL_KEY).await;
    assert_eq!((&read.body["data"]["name"], &read.body["data"]["scheduledAt"]), (&json!(last.0), &json!(last.1)));
}

/// Creates `people` consenting contacts (`{prefix}NN@example.com`), aims the blast broadcast at
/// them through a segment and sends it: the run's id.
async fn send_blast_to_consenting(app: &TestApp, prefix: &str, people: usize) -> String {
    create_people(app, (0..people).map(|index| (format!("{prefix}{index:02}@example.com"), true)).collect()).await;
    let segment_id = segment(app, prefix, "firstName is Fan").await;
    let aimed =
        patch(app, BLAST_BROADCAST, "aim", &json!({"audience": {"segmentId": segment_id}, "scheduledAt": null})).await;
    assert_eq!(aimed.status, 200, "{:?}", aimed.body);
    app.wait_for_projections().await;
    let sent = send(app, BLAST_BROADCAST, prefix).await;
    assert_eq!(sent.status, 202, "{:?}", sent.body);
    sent.body["data"]["id"].as_str().expect("run id").to_owned()
}

#[tokio::test]
async fn a_run_larger_than_the_allowance_sends_exactly_what_is_left_of_it() {
    const PEOPLE: usize = 40;
    const ALLOWANCE: i64 = 25;
    let sink = SmtpSink::start().await;
    let app = mail_app(&sink, ALLOWANCE).await;
    // One batch holds every recipient: counted together they do not fit, so each is counted
    // on its own and exactly the allowance is used.
    let run_id = send_blast_to_consenting(&app, "few", PEOPLE).await;
    let run = finished_run(&app, BLAST_BROADCAST, &run_id, WAIT).await;
    assert_eq!(run["counts"]["audience"], PEOPLE, "{run}");
    assert_eq!(run["counts"]["sent"], ALLOWANCE, "{run}");
    assert_eq!(run["counts"]["skipped"]["allowance"], PEOPLE as i64 - ALLOWANCE, "{run}");
    let used = app.query_i64("SELECT coalesce(sum(used), 0)::bigint FROM email_allowance_usage").await;
    assert_eq!(used, ALLOWANCE);
    assert_eq!(sink.wait_for(ALLOWANCE as usize, WAIT).await.len(), ALLOWANCE as usize);
}

#[tokio::test]
async fn a_broadcast_under_a_send_policy_skips_capped_recipients_with_a_story_naming_the_send_that_filled_the_cap() {
    let sink = SmtpSink::start().await;
    let options = Options { email: Some(crate::email::test_email(&sink)), ..Options::default() };
    let app = TestApp::spawn_with(options).await;
    let policy = json!({
        "timeZone": {"attribute": "timeZone", "default": "UTC"},
        "frequencyCaps": [{"max": 1, "per": {"days": 1}, "topic": "news", "outcome": "skip"}]
    });
    app.apply_workspace(&crate::email::policy_workspace(&policy), true).await;
    crate::email::publish_dkim(&app, &sink).await;
    for email in ["one@example.com", "two@example.com"] {
        subscribe(&app, email).await;
    }
    // One of them had the news today already.
    let newsletter = crate::email::template_id(&app, "newsletter").await;
    let body = json!({"data": {"contact": {"email": "one@example.com"}}});
    let today = crate::email::send(&app, &newsletter, &body, None).await;
    assert_eq!(today.body["data"]["status"], "sent", "{:?}", today.body);
    let first_id = today.body["data"]["emailId"].as_str().expect("emailId").to_owned();
    app.wait_for_workers().await;

    let sent = send(&app, WEEKLY_BROADCAST, "weekly-capped").await;
    assert_eq!(sent.status, 202, "{:?}", sent.body);
    let run_id = sent.body["data"]["id"].as_str().expect("run id").to_owned();
    let run = finished_run(&app, WEEKLY_BROADCAST, &run_id, WAIT).await;
    assert_eq!(run["counts"]["audience"], 2, "{run}");
    assert_eq!(run["counts"]["skipped"]["frequencyCap"], 1, "{run}");
    let messages = sink.wait_for(2, WAIT).await;
    let to_two = messages.iter().filter(|message| message["rcptTo"][0] == "two@example.com").count();
    assert_eq!(to_two, 1, "the other recipient is mailed");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(sink.messages().await.len(), 2, "the capped one is not");

    let story = skipped_story(&app, &run_id).await;
    let refusal = &story["timeline"][0];
    assert_eq!(
        (refusal["gate"].as_str(), refusal["error"]["code"].as_str()),
        (Some("frequency_cap"), Some("frequency_capped"))
    );
    let filled_by = app
        .query_i64(&format!("SELECT position FROM events WHERE stream_id = 'email-{first_id}' AND stream_version = 1"))
        .await;
    assert_eq!(refusal["decidedBy"]["position"], filled_by, "{refusal}");
    assert_eq!(refusal["decidedBy"]["type"], "EmailScheduled", "{refusal}");
}

/// The id of the mail space's contact with `email`.
async fn contact_id(app: &TestApp, email: &str) -> String {
    let list = app.get("/schemas/people/records?limit=100", MAIL_KEY).await;
    assert_eq!(list.status, 200, "{:?}", list.body);
    list.body["data"]
        .as_array()
        .expect("records")
        .iter()
        .find(|record| record["email"] == email)
        .and_then(|record| record["id"].as_str())
        .unwrap_or_else(|| panic!("no contact {email}"))
        .to_owned()
}

/// A held email counts against the month's allowance when it is stored, so once the allowance
/// is used up a recipient in its quiet hours cannot be held: it is skipped as `allowance`. It
/// was decided `held` again instead, which the allowance refused again, and the run's first
/// such recipients stayed `pending` for ever (found in the demo: 19,977 of a broadcast's
/// recipients at night in Berlin, the run `sending` with nothing more to do).
#[tokio::test]
async fn a_run_in_quiet_hours_beyond_the_allowance_skips_what_it_cannot_hold_and_completes() {
    const PEOPLE: usize = 6;
    const ALLOWANCE: i64 = 3;
    let sink = SmtpSink::start().await;
    let (app, _) = quiet_now_app(&sink, ALLOWANCE).await;
    for index in 0..PEOPLE {
        subscribe(&app, &format!("night{index}@example.com")).await;
    }
    app.wait_for_projections().await;
    let sent = send(&app, WEEKLY_BROADCAST, "weekly-night").await;
    assert_eq!(sent.status, 202, "{:?}", sent.body);
    let run_id = sent.body["data"]["id"].as_str().expect("run id").to_owned();
    let run = finished_run(&app, WEEKLY_BROADCAST, &run_id, WAIT).await;
    assert_eq!(run["counts"]["audience"], PEOPLE, "{run}");
    assert_eq!(run["counts"]["held"], ALLOWANCE, "{run}");
    assert_eq!(run["counts"]["skipped"]["allowance"], PEOPLE as i64 - ALLOWANCE, "{run}");
    assert_eq!(run["counts"]["pending"], 0, "{run}");
    let used = app.query_i64("SELECT coalesce(sum(used), 0)::bigint FROM email_allowance_usage").await;
    assert_eq!(used, ALLOWANCE);
}

/// A run's pace (`APP__BROADCASTS__RATE_PER_SECOND`) is of the emails it schedules: the
/// recipients it skips send nothing and are recorded at the database's pace. Here one email a
/// second, and an allowance of one: the other 39 recipients are skipped in a few batches of
/// one, where counting them took 39 s more.
#[tokio::test]
async fn a_runs_pace_counts_the_emails_it_schedules_not_the_recipients_it_skips() {
    const PEOPLE: usize = 40;
    let sink = SmtpSink::start().await;
    let email = crate::email::test_email(&sink);
    let tweak: fn(&mut platform::settings::Settings) = |settings| settings.broadcasts.rate_per_second = 1;
    let app = TestApp::spawn_with(Options { email: Some(email), tweak: Some(tweak), ..Options::default() }).await;
    app.apply_workspace(&crate::email::mail_workspace(1), true).await;
    crate::email::publish_dkim(&app, &sink).await;
    let run_id = send_blast_to_consenting(&app, "paced", PEOPLE).await;
    let started = Instant::now();
    let run = finished_run(&app, BLAST_BROADCAST, &run_id, Duration::from_secs(20)).await;
    assert_eq!(run["counts"]["sent"], 1, "{run}");
    assert_eq!(run["counts"]["skipped"]["allowance"], PEOPLE as i64 - 1, "{run}");
    assert!(started.elapsed() < Duration::from_secs(20), "paced by the skipped recipients");
}

/// The mail app whose space holds marketing mail in quiet hours from the last hour to two hours
/// from this one (in each contact's `timeZone`, UTC by default), with a monthly allowance of
/// `allowance`; and the end of those hours in UTC.
async fn quiet_now_app(sink: &SmtpSink, allowance: i64) -> (TestApp, chrono::DateTime<chrono::Utc>) {
    let options = Options { email: Some(crate::email::test_email(sink)), ..Options::default() };
    let app = TestApp::spawn_with(options).await;
    let (quiet, end) = crate::email::quiet_hours_around_now("hold");
    let policy = json!({"timeZone": {"attribute": "timeZone", "default": "UTC"}, "quietHours": quiet});
    app.apply_workspace(&crate::email::policy_workspace_with(allowance, &policy), true).await;
    crate::email::publish_dkim(&app, sink).await;
    (app, end)
}

#[tokio::test]
async fn a_broadcast_to_three_zones_holds_the_recipients_in_their_quiet_hours_until_their_time_and_counts_them() {
    let sink = SmtpSink::start().await;
    // Quiet from the last hour to two hours from this one, local: UTC and an hour behind it
    // are in it, twelve hours ahead is day.
    let (app, end) = quiet_now_app(&sink, 1000).await;
    let zones = [("utc@example.com", "UTC"), ("behind@example.com", "Etc/GMT+1"), ("ahead@example.com", "Etc/GMT-12")];
    for (email, zone) in zones {
        subscribe(&app, email).await;
        app.wait_for_projections().await;
        let id = contact_id(&app, email).await;
        let moved = app
            .send(
                app.request(reqwest::Method::PATCH, &format!("/schemas/people/records/{id}"), Some(MAIL_KEY))
                    .json(&json!({"timeZone": zone})),
            )
            .await;
        assert_eq!(moved.status, 200, "{:?}", moved.body);
    }
    app.wait_for_projections().await;

    let sent = send(&app, WEEKLY_BROADCAST, "weekly-zones").await;
    assert_eq!(sent.status, 202, "{:?}", sent.body);
    let run_id = sent.body["data"]["id"].as_str().expect("run id").to_owned();
    let messages = sink.wait_for(1, WAIT).await;
    assert_eq!(messages[0]["rcptTo"][0], "ahead@example.com", "day where it is mailed at once");
    let path = format!("/broadcasts/{WEEKLY_BROADCAST}/runs/{run_id}");
    let counts = |run: &TestResponse| run.body["data"]["counts"].clone();
    let deadline = Instant::now() + WAIT;
    let run = loop {
        app.wait_for_projections().await;
        let run = app.get(&path, MAIL_KEY).await;
        if counts(&run)["held"] == 2 && counts(&run)["sent"] == 1 && run.body["data"]["status"] == "completed" {
            break run;
        }
        assert!(Instant::now() < deadline, "{:?}", run.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (counts(&run)["pending"].as_i64(), counts(&run)["queued"].as_i64()),
        (Some(0), Some(0)),
        "{:?}",
        run.body
    );

    // Each held recipient waits for the end of the quiet hours in its own zone.
    let held = |email: &'static str| {
        let app = &app;
        let run_id = run_id.clone();
        async move {
            let id = contact_id(app, email).await;
            app.query_string(&format!(
                "SELECT email_id FROM broadcast_recipients WHERE run_id = '{run_id}' AND contact_id = '{id}' AND state = 'held'"
            ))
            .await
        }
    };
    let (utc, behind) = (held("utc@example.com").await, held("behind@example.com").await);
    let utc_story = crate::email::story_when(&app, &utc, "held").await;
    let behind_story = crate::email::story_when(&app, &behind, "held").await;
    let local_end =
        |offset_hours: i64| (end + chrono::Duration::hours(offset_hours)).format("%Y-%m-%dT%H:00:00.000Z").to_string();
    assert_eq!(utc_story["notBefore"].as_str(), Some(local_end(0).as_str()), "{utc_story}");
    assert_eq!(behind_story["notBefore"].as_str(), Some(local_end(1).as_str()), "an hour later: {behind_story}");

    // Their time comes: the one now in day (it moved) is mailed; the one suppressed meanwhile
    // is skipped with its story, and counted so.
    let utc_contact = contact_id(&app, "utc@example.com").await;
    let moved = app
        .send(
            app.request(reqwest::Method::PATCH, &format!("/schemas/people/records/{utc_contact}"), Some(MAIL_KEY))
                .json(&json!({"timeZone": "Etc/GMT-12"})),
        )
        .await;
    assert_eq!(moved.status, 200, "{:?}", moved.body);
    let suppressed = app
        .post("/contacts/suppressions", MAIL_KEY, &json!({"identifier": "behind@example.com", "reason": "manual"}))
        .await;
    assert_eq!(suppressed.status, 201, "{:?}", suppressed.body);
    app.wait_for_projections().await;
    crate::email::make_due(&app, &utc).await;
    crate::email::make_due(&app, &behind).await;
    crate::email::story_when(&app, &utc, "sent").await;
    crate::email::story_when(&app, &behind, "skipped").await;
    let deadline = Instant::now() + WAIT;
    let run = loop {
        app.wait_for_projections().await;
        let run = app.get(&path, MAIL_KEY).await;
        if counts(&run)["held"] == 0 && counts(&run)["sent"] == 2 && counts(&run)["skipped"]["suppressed"] == 1 {
            break run;
        }
        assert!(Instant::now() < deadline, "{:?}", run.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (counts(&run)["pending"].as_i64(), counts(&run)["queued"].as_i64()),
        (Some(0), Some(0)),
        "{:?}",
        run.body
    );
    let messages = sink.wait_for(2, WAIT).await;
    assert_eq!(messages[1]["rcptTo"][0], "utc@example.com");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(sink.messages().await.len(), 2, "once each, the suppressed one never");
}

#[tokio::test]
async fn a_runs_delivery_log_pages_by_cursor_filters_by_status_agrees_with_its_counts_and_exports_csv_and_ndjson() {
    let sink = SmtpSink::start().await;
    let (app, _) = quiet_now_app(&sink, 1000).await;
    // Eight mailed at once, two held in their quiet hours, one suppressed, one without consent.
    for index in 0..12 {
        let zone = if (8..10).contains(&index) { "UTC" } else { "Etc/GMT-12" };
        let body = json!({"email": format!("log{index:02}@example.com"), "firstName": "Fan", "newsConsent": index != 11,
                          "timeZone": zone});
        let created = app.post("/schemas/people/records", MAIL_KEY, &body).await;
        assert_eq!(created.status, 201, "{:?}", created.body);
    }
    let suppressed = app
        .post("/contacts/suppressions", MAIL_KEY, &json!({"identifier": "log10@example.com", "reason": "manual"}))
        .await;
    assert_eq!(suppressed.status, 201, "{:?}", suppressed.body);
    let segment = segment(&app, "Fans", "firstName is Fan").await;
    let aimed =
        patch(&app, BLAST_BROADCAST, "aim-log", &json!({"audience": {"segmentId": segment}, "scheduledAt": null}))
            .await;
    assert_eq!(aimed.status, 200, "{:?}", aimed.body);
    app.wait_for_projections().await;
    let sent = send(&app, BLAST_BROADCAST, "blast-log").await;
    assert_eq!(sent.status, 202, "{:?}", sent.body);
    let run_id = sent.body["data"]["id"].as_str().expect("run id").to_owned();
    let deadline = Instant::now() + WAIT;
    let run = loop {
        app.wait_for_projections().await;
        let run = app.get(&format!("/broadcasts/{BLAST_BROADCAST}/runs/{run_id}"), MAIL_KEY).await.body["data"].clone();
        if run["status"] == "completed" && run["counts"]["sent"] == 8 && run["counts"]["held"] == 2 {
            break run;
        }
        assert!(Instant::now() < deadline, "{run}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // Paged by a cursor, newest first, every recipient once.
    let mut path = format!("/emails?broadcastRunId={run_id}&limit=5");
    let mut rows: Vec<Value> = Vec::new();
    for _ in 0..5 {
        let page = app.get(&path, MAIL_KEY).await;
        assert_eq!(page.status, 200, "{:?}", page.body);
        crate::helpers::assert_conforms("EmailSummary", page.body["data"].as_array().expect("rows"));
        rows.extend(page.body["data"].as_array().expect("rows").iter().cloned());
        match page.body["pagination"]["nextCursor"].as_str() {
            Some(cursor) => path = format!("/emails?broadcastRunId={run_id}&limit=5&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(rows.len(), 12, "{rows:?}");
    let mut ids: Vec<&str> = rows.iter().filter_map(|row| row["id"].as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 12, "each once");
    let times: Vec<&str> = rows.iter().filter_map(|row| row["scheduledAt"].as_str()).collect();
    assert!(times.windows(2).all(|pair| pair[0] >= pair[1]), "newest first: {times:?}");

    // Filtered by status, the rows agree with the run's counts.
    let with = |status: &str| {
        let (app, run_id) = (&app, run_id.clone());
        let status = status.to_owned();
        async move {
            let page = app.get(&format!("/emails?broadcastRunId={run_id}&status={status}&limit=200"), MAIL_KEY).await;
            assert_eq!(page.status, 200, "{:?}", page.body);
            page.body["data"].as_array().expect("rows").clone()
        }
    };
    let sent_rows = with("sent").await;
    assert_eq!(sent_rows.len() as u64, run["counts"]["sent"].as_u64().expect("a count"));
    assert!(sent_rows.iter().all(|row| row["address"].as_str().is_some_and(|a| a.ends_with("@example.com"))));
    let held = with("held").await;
    assert_eq!(held.len() as u64, run["counts"]["held"].as_u64().expect("a count"));
    assert!(held.iter().all(|row| row["gate"] == "quiet_hours" && row["notBefore"].is_string()), "{held:?}");
    let skipped = with("skipped").await;
    let mut gates: Vec<&str> = skipped.iter().filter_map(|row| row["gate"].as_str()).collect();
    gates.sort_unstable();
    assert_eq!(gates, ["consent", "suppressed"]);
    let skips = &run["counts"]["skipped"];
    assert_eq!(
        (skips["suppressed"].as_u64(), skips["noConsent"].as_u64(), skips["notSubscribed"].as_u64()),
        (Some(1), Some(1), Some(0)),
        "never consenting is counted apart from leaving a topic: {skips}"
    );
    assert!(skipped.iter().all(|row| row["error"]["code"].is_string()), "{skipped:?}");
    // Who was skipped, by address.
    let mut addresses: Vec<&str> = skipped.iter().filter_map(|row| row["address"].as_str()).collect();
    addresses.sort_unstable();
    assert_eq!(addresses, ["log10@example.com", "log11@example.com"], "{skipped:?}");
    assert_eq!(with("sent,held").await.len(), 10);
    assert_eq!(with("sent&status=skipped").await.len(), 10, "status repeated");

    // The whole log as CSV and as NDJSON, in one answer each.
    let export = |accept: &'static str| {
        let (app, run_id) = (&app, run_id.clone());
        async move {
            let response = app
                .request(
                    reqwest::Method::GET,
                    &format!("/emails?broadcastRunId={run_id}&status=sent,skipped"),
                    Some(MAIL_KEY),
                )
                .header("Accept", accept)
                .send()
                .await
                .expect("answered");
            assert_eq!(response.status().as_u16(), 200);
            let content_type =
                response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
            (content_type, response.text().await.expect("a body"))
        }
    };
    let (content_type, csv) = export("text/csv").await;
    assert!(content_type.starts_with("text/csv"), "{content_type}");
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].starts_with("emailId,contactId,address,status,gate,errorCode"), "{}", lines[0]);
    assert_eq!(lines.len(), 11, "a header and ten rows: {csv}");
    assert_eq!(lines.iter().filter(|line| line.contains(",sent,")).count(), 8, "{csv}");
    assert!(
        lines.iter().any(|line| line.contains("log10@example.com,skipped,suppressed,recipient_suppressed")),
        "{csv}"
    );
    assert!(lines.iter().any(|line| line.contains("log11@example.com,skipped,consent,")), "{csv}");
    let (content_type, ndjson) = export("application/x-ndjson").await;
    assert_eq!(content_type, "application/x-ndjson");
    let parsed: Vec<Value> = ndjson.lines().map(|line| serde_json::from_str(line).expect("a JSON line")).collect();
    assert_eq!(parsed.len(), 10);
    crate::helpers::assert_conforms("EmailSummary", &parsed);
    assert!(parsed.iter().all(|row| row["address"].is_string()), "every row names its address: {parsed:?}");

    // A cursor pages only its own request; the log needs a scope; another space sees nothing.
    let first = app.get(&format!("/emails?broadcastRunId={run_id}&limit=1"), MAIL_KEY).await;
    let cursor = first.body["pagination"]["nextCursor"].as_str().expect("a cursor").to_owned();
    let other = app.get(&format!("/emails?broadcastRunId={run_id}&status=sent&cursor={cursor}"), MAIL_KEY).await;
    assert_eq!((other.status, other.code().as_str()), (400, Some("invalid_cursor")), "{:?}", other.body);
    let unknown = app.get("/emails?status=delivered", MAIL_KEY).await;
    assert_eq!((unknown.status, unknown.code().as_str()), (400, Some("invalid_query_parameter")));
    // Filters narrow together: one contact's email in this run; the space's sent emails.
    let contact = sent_rows[0]["contactId"].as_str().expect("a contact").to_owned();
    let theirs = app.get(&format!("/emails?broadcastRunId={run_id}&contactId={contact}"), MAIL_KEY).await;
    assert_eq!(theirs.body["data"].as_array().map(Vec::len), Some(1), "{:?}", theirs.body);
    let space = app.get("/emails?status=sent&limit=200", MAIL_KEY).await;
    assert_eq!(space.body["data"].as_array().map(Vec::len), Some(8), "{:?}", space.body);
    let elsewhere = app.get(&format!("/emails?broadcastRunId={run_id}"), crate::helpers::ALPHA_ADMIN).await;
    assert_eq!(elsewhere.body["data"], json!([]), "{:?}", elsewhere.body);
}

#[tokio::test]
async fn a_journey_and_a_broadcast_racing_for_the_same_contacts_pass_a_cap_of_one_once_per_contact() {
    // One news email a day, the rest skipped. A broadcast to every subscriber and a journey
    // that mails the same newsletter on a purchase, started at the same moment for each
    // subscriber: each contact gets exactly one, and the send that lost the race is decided
    // again and skipped by the cap, with its story (none is lost, none goes twice).
    const PEOPLE: usize = 40;
    let sink = SmtpSink::start().await;
    let options = Options { email: Some(crate::email::test_email(&sink)), ..Options::default() };
    let app = TestApp::spawn_with(options).await;
    let policy = json!({
        "timeZone": {"attribute": "timeZone", "default": "UTC"},
        "frequencyCaps": [{"max": 1, "per": {"days": 1}, "topic": "news", "outcome": "skip"}]
    });
    let mut workspace: Value =
        serde_json::from_str(&crate::email::policy_workspace(&policy)).expect("the workspace is JSON");
    let spaces = workspace["spaces"].as_array_mut().expect("spaces");
    let mail = spaces.iter_mut().find(|space| space["slug"] == "mail").expect("the mail space");
    mail["workflows"] = json!([{
        "slug": "thanks", "name": "Thanks",
        "triggers": [{"event": "purchase", "reentry": "always"}],
        "steps": [
            {"id": "start", "type": "incoming_webhook", "referenceId": "thanks-hook", "next": "mail"},
            {"id": "mail", "type": "send_email", "template": "newsletter", "next": null}
        ]
    }]);
    app.apply_workspace(&workspace.to_string(), true).await;
    crate::email::publish_dkim(&app, &sink).await;
    let addresses: Vec<String> = (0..PEOPLE).map(|index| format!("racer{index}@example.com")).collect();
    let mut contacts = Vec::new();
    for address in &addresses {
        let body = json!({"email": address, "newsConsent": true, "topics": ["news"]});
        let made = app.post("/schemas/people/records", MAIL_KEY, &body).await;
        assert_eq!(made.status, 201, "{:?}", made.body);
        contacts.push(made.body["data"]["id"].as_str().expect("id").to_owned());
    }
    app.wait_for_projections().await;

    let bodies: Vec<Value> = contacts.iter().map(|contact| json!({"contactId": contact, "amount": 1})).collect();
    let purchases =
        futures_util::future::join_all(bodies.iter().map(|body| app.post("/events/purchase", MAIL_KEY, body)));
    let (sent, purchases) = tokio::join!(send(&app, WEEKLY_BROADCAST, "weekly-race"), purchases);
    assert_eq!(sent.status, 202, "{:?}", sent.body);
    assert!(
        purchases.iter().all(|fired| fired.status == 202),
        "{:?}",
        purchases.iter().map(|p| &p.body).collect::<Vec<_>>()
    );
    let run_id = sent.body["data"]["id"].as_str().expect("run id").to_owned();
    let run = finished_run(&app, WEEKLY_BROADCAST, &run_id, WAIT).await;
    let workflow = app.get("/workflows", MAIL_KEY).await.body["data"][0]["id"].as_str().expect("workflow").to_owned();
    let deadline = Instant::now() + WAIT;
    let mail_step = loop {
        let stats = app.get(&format!("/workflows/{workflow}/stats"), MAIL_KEY).await;
        assert_eq!(stats.status, 200, "{:?}", stats.body);
        let steps = stats.body["data"]["steps"].as_array().cloned().unwrap_or_default();
        let step = steps.into_iter().find(|step| step["stepId"] == "mail").unwrap_or_default();
        let done = step["completed"].as_u64().unwrap_or(0) + step["skipped"]["total"].as_u64().unwrap_or(0);
        if done == PEOPLE as u64 {
            break step;
        }
        assert!(Instant::now() < deadline, "the journey's runs did not all pass the step: {}", stats.body);
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let messages = sink.wait_for(PEOPLE, WAIT).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let messages = if sink.messages().await.len() > messages.len() { sink.messages().await } else { messages };
    for address in &addresses {
        let to = messages.iter().filter(|message| message["rcptTo"][0] == address.as_str()).count();
        assert_eq!(to, 1, "{address} is sent the news once: {run} {mail_step}");
    }
    let broadcast_skipped = run["counts"]["skipped"]["frequencyCap"].as_u64().unwrap_or(0);
    let journey_skipped = mail_step["skipped"]["byReason"]["frequency_cap"].as_u64().unwrap_or(0);
    assert_eq!(
        broadcast_skipped + journey_skipped,
        PEOPLE as u64,
        "each loser is skipped by the cap: {run} {mail_step}"
    );
    assert_eq!(
        run["counts"]["sent"].as_u64().unwrap_or(0) + mail_step["completed"].as_u64().unwrap_or(0),
        PEOPLE as u64,
        "{run} {mail_step}"
    );
    let recorded = app.query_i64("SELECT count(*) FROM marketing_sends").await;
    assert_eq!(recorded, PEOPLE as i64, "one counted send per contact");
}

/// The outbox's statements that find rows by id probe its primary key whatever its statistics
/// say, and the search for abandoned hand-offs reads attempting rows only. The statistics are
/// taken while every row is sent (and kept: no autovacuum), then 100,000 pending and 100,000
/// held rows of another space, none due, are added, as a broadcast or a held release leaves
/// them. A plan that answered a by-id statement from the index of pending or held rows would
/// read all of them on every call (over 1,500 pages). A broadcast held by quiet hours is then
/// released, claimed, sent and settled beside them, and no update of the outbox reads more than
/// a few hundred pages a call (planning included: the statistics count its catalog reads).
#[tokio::test]
async fn a_full_outbox_is_probed_by_id_whatever_its_statistics_say() {
    const PEOPLE: usize = 5;
    let sink = SmtpSink::start().await;
    let (app, _) = quiet_now_app(&sink, 1000).await;
    let client = app.pool.get().await.expect("client");
    client
        .batch_execute(
            "ALTER TABLE email_outbox SET (autovacuum_enabled = false);
             INSERT INTO email_outbox (email_id, space_id, state)
                 SELECT 'em_sent_' || g, 'sp_filler', 'sent' FROM generate_series(1, 20000) g;
             ANALYZE email_outbox;
             INSERT INTO email_outbox (email_id, space_id, state, next_attempt_at)
                 SELECT 'em_' || state || '_' || g, 'sp_filler', state, now() + interval '1 day'
                 FROM generate_series(1, 100000) g, unnest(ARRAY['pending', 'held']) AS state;
             CREATE EXTENSION IF NOT EXISTS pg_stat_statements;",
        )
        .await
        .expect("the outbox filled");

    let run_id = send_blast_to_consenting(&app, "full", PEOPLE).await;
    let deadline = Instant::now() + WAIT;
    let held = format!("SELECT count(*) FROM broadcast_recipients WHERE run_id = '{run_id}' AND state = 'held'");
    while app.query_i64(&held).await < PEOPLE as i64 {
        assert!(Instant::now() < deadline, "the recipients were never held");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Day now (the quiet hours moved later), and due in a moment, so that the counts start
    // before the release.
    let hour = chrono::Timelike::hour(&chrono::Utc::now());
    let later = json!({"from": format!("{:02}:00", (hour + 4) % 24), "to": format!("{:02}:00", (hour + 5) % 24),
                       "outcome": "hold"});
    let policy = json!({"timeZone": {"attribute": "timeZone", "default": "UTC"}, "quietHours": later});
    app.apply_workspace(&crate::email::policy_workspace(&policy), true).await;
    client
        .execute(
            "UPDATE email_outbox SET next_attempt_at = now() + interval '2 seconds'
             WHERE space_id <> 'sp_filler' AND state = 'held'",
            &[],
        )
        .await
        .expect("made due");
    let database = app.query_string("SELECT current_database()").await;
    let this_database = format!("(SELECT oid FROM pg_database WHERE datname = '{database}')");
    app.query_string(&format!("SELECT pg_stat_statements_reset(0, {this_database}, 0)::text")).await;
    assert_eq!(sink.wait_for(PEOPLE, WAIT).await.len(), PEOPLE);
    let run = finished_run(&app, BLAST_BROADCAST, &run_id, WAIT).await;
    assert_eq!(run["counts"]["sent"], PEOPLE, "{run}");

    let read = app
        .query_strings(&format!(
            "SELECT round((shared_blks_hit + shared_blks_read)::numeric / calls) || ' pages a call, '
                    || calls || ' calls: ' || left(regexp_replace(query, '\\s+', ' ', 'g'), 90)
             FROM pg_stat_statements
             WHERE dbid = {this_database} AND query LIKE 'UPDATE email_outbox%'"
        ))
        .await;
    // The release, the claims, the outcomes, and the worker's search for abandoned ones.
    assert!(read.len() >= 4, "{read:#?}");
    for statement in &read {
        let pages: f64 = statement.split(' ').next().and_then(|pages| pages.parse().ok()).expect("pages");
        assert!(pages < 500.0, "{read:#?}");
    }
}
