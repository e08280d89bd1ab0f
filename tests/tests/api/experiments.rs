//! Broadcast experiments: a run tests its variants on a share of the audience over real SMTP,
//! people click the tracked links of the mail they received (and a link checker follows
//! others), the verdict is decided on people's clicks alone and recorded once, and the winner
//! goes to the rest, each recipient mailed once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::broadcasts::{create_people, patch, segment, send};
use crate::email::{BLAST_BROADCAST, MAIL_KEY, email_id_of, mail_workspace_with_promo, publish_dkim, test_email};
use crate::engagement::{get, local, tracked};
use crate::helpers::*;
use crate::smtp_sink::SmtpSink;

const WAIT: Duration = Duration::from_secs(60);

/// The mail workspace whose promo template has one tracked link and whose blast broadcast
/// tests two subjects on half its audience, with `fallback` when neither wins clearly.
fn experiment_workspace(fallback: &str) -> String {
    experiment_workspace_with(fallback, |_| {})
}

/// [`experiment_workspace`] with its experiment changed by `change`.
fn experiment_workspace_with(fallback: &str, change: impl FnOnce(&mut Value)) -> String {
    let workspace = mail_workspace_with_promo(|promo| {
        promo["html"] =
            json!("<html><body><p><a href=\"https://shop.example.com/deal\">See the deal</a></p></body></html>");
    });
    let mut workspace: Value = serde_json::from_str(&workspace).expect("JSON");
    let space = workspace["spaces"]
        .as_array_mut()
        .and_then(|spaces| spaces.iter_mut().find(|space| space["slug"] == "mail"))
        .expect("the mail space");
    space["emailAllowance"] = json!({"monthly": 10_000});
    let blast = space["broadcasts"]
        .as_array_mut()
        .and_then(|broadcasts| broadcasts.iter_mut().find(|broadcast| broadcast["slug"] == "blast"))
        .expect("the blast broadcast");
    blast["experiment"] = json!({
        "testShare": 50,
        "variants": [{"id": "a", "subject": "Deal A"}, {"id": "b", "subject": "Deal B"}],
        "control": "a",
        "metric": "clicks",
        "wait": "1m",
        "withoutClearWinner": fallback
    });
    change(&mut blast["experiment"]);
    workspace.to_string()
}

async fn experiment_app(sink: &SmtpSink, fallback: &str) -> TestApp {
    let app = TestApp::spawn_with(Options { email: Some(test_email(sink)), ..Options::default() }).await;
    app.apply_workspace(&experiment_workspace(fallback), true).await;
    publish_dkim(&app, sink).await;
    app
}

/// `people` contacts with consent in a segment, the blast aimed at it and sent: the run's id.
async fn start_run(app: &TestApp, people: usize) -> String {
    create_people(app, (0..people).map(|index| (format!("fan{index:03}@example.com"), true)).collect()).await;
    let segment_id = segment(app, "Fans", "firstName is Fan").await;
    let aimed =
        patch(app, BLAST_BROADCAST, "aim", &json!({"audience": {"segmentId": segment_id}, "scheduledAt": null})).await;
    assert_eq!(aimed.status, 200, "{:?}", aimed.body);
    assert_eq!(aimed.body["data"]["experiment"]["testShare"], 50, "the broadcast shows its experiment");
    app.wait_for_projections().await;
    let sent = send(app, BLAST_BROADCAST, "try").await;
    assert_eq!(sent.status, 202, "{:?}", sent.body);
    assert_conforms("BroadcastRun", std::slice::from_ref(&sent.body["data"]));
    assert_eq!(sent.body["data"]["experiment"]["definition"]["waitMs"], 60_000, "{:?}", sent.body);
    sent.body["data"]["id"].as_str().expect("run id").to_owned()
}

async fn run(app: &TestApp, run_id: &str) -> Value {
    let run = app.get(&format!("/broadcasts/{BLAST_BROADCAST}/runs/{run_id}"), MAIL_KEY).await;
    assert_eq!(run.status, 200, "{:?}", run.body);
    assert_conforms("BroadcastRun", std::slice::from_ref(&run.body["data"]));
    run.body["data"].clone()
}

/// Polls the run until `done` holds for it.
async fn run_until(app: &TestApp, run_id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let data = run(app, run_id).await;
        if done(&data) {
            return data;
        }
        assert!(Instant::now() < deadline, "the run never got to {what}: {data}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether the run waits for its verdict with every test recipient's mail sent (the test
/// recipients all have an address and consent).
fn test_sent(run: &Value) -> bool {
    let results = run["experiment"]["results"].as_array().map(Vec::as_slice).unwrap_or_default();
    let sum = |field: &str| results.iter().map(|result| result[field].as_i64().unwrap_or(0)).sum::<i64>();
    run["experiment"]["phase"] == "wait"
        && sum("recipients") > 0
        && sum("delivered") == sum("recipients")
        && run["counts"]["sent"] == sum("recipients")
}

/// Makes the run's verdict due now, as if its wait had passed.
async fn end_wait(app: &TestApp, run_id: &str) {
    let client = app.pool.get().await.expect("client");
    let moved = client
        .execute("UPDATE timers SET due_at = now() WHERE kind = 'broadcast_experiments' AND key = $1", &[&run_id])
        .await
        .expect("the verdict's timer");
    assert_eq!(moved, 1, "the verdict's timer is scheduled at the end of the test send");
}

/// The subject of each received message, by recipient.
fn subjects(messages: &[Value]) -> BTreeMap<String, String> {
    messages
        .iter()
        .map(|message| {
            let to = message["rcptTo"][0].as_str().expect("a recipient").to_owned();
            (to, message["headers"]["subject"][0].as_str().expect("a subject").to_owned())
        })
        .collect()
}

#[tokio::test]
async fn an_experiment_tests_two_subjects_decides_on_peoples_clicks_and_sends_the_winner_to_the_rest_once() {
    const PEOPLE: usize = 200;
    let sink = SmtpSink::start().await;
    let app = experiment_app(&sink, "stop").await;
    let run_id = start_run(&app, PEOPLE).await;

    // The test share is sent, one variant each; then the run waits for its verdict.
    let waiting = run_until(&app, &run_id, "its wait with every test mail sent", test_sent).await;
    assert!(waiting["experiment"]["decideAt"].is_string(), "{waiting}");
    assert_eq!(waiting["status"], "sending", "{waiting}");
    let tested = waiting["counts"]["sent"].as_u64().expect("sent") as usize;
    assert!((70..=130).contains(&tested), "about half of {PEOPLE} in the test: {tested}");
    assert_eq!(waiting["counts"]["pending"], PEOPLE - tested, "the rest waits for the verdict: {waiting}");
    let test_mail = sink.wait_for(tested, WAIT).await;
    assert_eq!(test_mail.len(), tested, "only the test share is mailed before the verdict");
    let delivered = Instant::now();
    let by_variant = |subject: &str| -> Vec<&Value> {
        test_mail.iter().filter(|message| message["headers"]["subject"][0] == subject).collect()
    };
    let (a, b) = (by_variant("Deal A"), by_variant("Deal B"));
    assert_eq!(a.len() + b.len(), tested, "every test mail is one variant's");
    assert!(a.len() >= 25 && b.len() >= 25, "an even split: {} and {}", a.len(), b.len());
    // Each mail's story names the variant it was sent.
    for (message, variant) in [(a[0], "a"), (b[0], "b")] {
        let story = app.get(&format!("/emails/{}", email_id_of(message)), MAIL_KEY).await;
        assert_eq!(story.body["data"]["origin"]["variant"], variant, "{:?}", story.body);
    }

    // People click: 6 of variant a's mail, 20 of b's. A link checker follows (HEAD) every
    // other link of a's mail: counted apart, those would make a the leader.
    tokio::time::sleep(Duration::from_millis(10_500).saturating_sub(delivered.elapsed())).await;
    for message in a.iter().take(6).chain(b.iter().take(20)) {
        let link = &tracked(message, "click?")[0];
        assert_eq!(get(&app, link).await.status(), 302);
    }
    let checker = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("a client");
    for message in a.iter().skip(6) {
        let link = local(&app, &tracked(message, "click?")[0]);
        let answer = checker.head(link).header("User-Agent", "LinkChecker/1.0").send().await.expect("HEAD");
        assert_eq!(answer.status(), 302);
    }
    let live = run(&app, &run_id).await;
    let results = &live["experiment"]["results"];
    assert_eq!(results[0]["variant"], "a", "{live}");
    assert_eq!(results[0]["recipients"], a.len(), "{live}");

    end_wait(&app, &run_id).await;
    let finished = run_until(&app, &run_id, "its end", |run| {
        run["status"] == "completed" && run["counts"]["queued"] == 0 && run["counts"]["pending"] == 0
    })
    .await;
    let experiment = &finished["experiment"];
    assert_eq!(
        (experiment["phase"].as_str(), experiment["winner"].as_str()),
        (Some("winner"), Some("b")),
        "{finished}"
    );
    let verdict = &experiment["verdict"];
    assert_eq!((verdict["clear"].as_bool(), verdict["rule"].as_str()), (Some(true), Some("significant")), "{verdict}");
    let figures = |index: usize, field: &str| verdict["variants"][index][field].as_i64().unwrap_or(-1);
    assert_eq!((figures(0, "engaged"), figures(1, "engaged")), (6, 20), "people's clicks only: {verdict}");
    assert_eq!(figures(0, "machine"), a.len() as i64 - 6, "the checker's clicks, shown apart: {verdict}");
    assert_eq!((figures(0, "delivered"), figures(1, "delivered")), (a.len() as i64, b.len() as i64), "{verdict}");
    assert!(verdict["comparisons"][0]["pValue"].as_f64().is_some_and(|p| p < 0.05), "{verdict}");

    // The rest got the winner, and nobody got two mails.
    assert_eq!(finished["counts"]["sent"], PEOPLE, "{finished}");
    let everything = sink.wait_for(PEOPLE, WAIT).await;
    let received = subjects(&everything);
    assert_eq!((everything.len(), received.len()), (PEOPLE, PEOPLE), "each contact mailed once");
    let tested_subjects = subjects(&test_mail);
    for (to, subject) in &received {
        match tested_subjects.get(to) {
            Some(tested) => assert_eq!(subject, tested, "{to} kept its test mail only"),
            None => assert_eq!(subject, "Deal B", "{to} of the rest got the winner"),
        }
    }
    let rest_mail =
        everything.iter().find(|message| !tested_subjects.contains_key(message["rcptTo"][0].as_str().unwrap_or("")));
    let rest_story =
        app.get(&format!("/emails/{}", email_id_of(rest_mail.expect("a mail of the rest"))), MAIL_KEY).await;
    assert_eq!(rest_story.body["data"]["origin"]["variant"], "b", "{:?}", rest_story.body);
    // The delivery log's export names each email's variant.
    let csv = app
        .request(reqwest::Method::GET, &format!("/emails?broadcastRunId={run_id}"), Some(MAIL_KEY))
        .header("Accept", "text/csv")
        .send()
        .await
        .expect("answered")
        .text()
        .await
        .expect("a body");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    let column = header.iter().position(|name| *name == "variant").expect("a variant column");
    let mut exported = BTreeMap::new();
    for line in lines {
        *exported.entry(line.split(',').nth(column).unwrap_or_default().to_owned()).or_insert(0) += 1;
    }
    assert_eq!(exported.get("a"), Some(&a.len()), "{exported:?}");
    assert_eq!(exported.get("b"), Some(&(PEOPLE - a.len())), "the test's b and the rest: {exported:?}");
    let recorded = app
        .query_i64(&format!(
            "SELECT count(*) FROM events WHERE event_type = 'BroadcastExperimentDecided.v1' AND stream_id = 'broadcast-run-{run_id}'"
        ))
        .await;
    assert_eq!(recorded, 1, "the verdict is recorded once");
}

#[tokio::test]
async fn an_experiment_without_a_clear_winner_stops_and_the_rest_gets_nothing() {
    const PEOPLE: usize = 40;
    let sink = SmtpSink::start().await;
    let app = experiment_app(&sink, "stop").await;
    let run_id = start_run(&app, PEOPLE).await;
    let waiting = run_until(&app, &run_id, "its wait with every test mail sent", test_sent).await;
    let tested = waiting["counts"]["sent"].as_u64().expect("sent") as usize;
    assert!(tested > 0 && tested < PEOPLE, "{waiting}");
    // Nobody clicks: too few engaged recipients for the test.
    end_wait(&app, &run_id).await;
    let finished = run_until(&app, &run_id, "its end", |run| run["status"] == "completed").await;
    let experiment = &finished["experiment"];
    assert_eq!((experiment["phase"].as_str(), &experiment["winner"]), (Some("stopped"), &Value::Null), "{finished}");
    assert_eq!(experiment["verdict"]["rule"], "stop", "{finished}");
    assert!(experiment["verdict"]["reason"].as_str().is_some_and(|reason| reason.contains("at least 5")), "{finished}");
    assert_eq!(finished["counts"]["skipped"]["experimentStopped"], PEOPLE - tested, "{finished}");
    assert_eq!(finished["counts"]["pending"], 0, "{finished}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sink.wait_for(tested, WAIT).await.len(), tested, "the rest got nothing");
}

#[tokio::test]
async fn a_workspace_experiment_that_breaks_a_rule_is_refused_naming_the_field() {
    let sink = SmtpSink::start().await;
    let app = TestApp::spawn_with(Options { email: Some(test_email(&sink)), ..Options::default() }).await;
    for (change, expected) in [
        (json!({"testShare": 60}), "experiment.testShare"),
        (json!({"variants": [{"id": "a"}]}), "experiment.variants"),
        (json!({"control": "z"}), "experiment.control"),
        (json!({"wait": "10s"}), "experiment.wait must be from one minute"),
        (json!({"metric": "revenue"}), "experiment.metric"),
        (json!({"variants": [{"id": "a"}, {"id": "b", "template": "receipt"}]}), "marketing template"),
    ] {
        let workspace = experiment_workspace_with("send_best", |experiment| {
            for (key, value) in change.as_object().expect("an object") {
                experiment[key] = value.clone();
            }
        });
        let parsed = command_service::authoring::parse(&workspace).expect("the workspace parses");
        let log = platform::log::EventLog::start(app.pool.clone(), 16);
        let refused =
            command_service::authoring::apply(&app.pool, &log, &parsed, Default::default()).await.expect_err("refused");
        assert!(format!("{refused:#}").contains(expected), "{change}: {refused:#}");
    }
}

/// The run's phase as the engine holds it.
async fn phase(app: &TestApp, run_id: &str) -> Option<String> {
    let client = app.pool.get().await.expect("client");
    client
        .query_one("SELECT phase FROM broadcast_runs WHERE run_id = $1", &[&run_id])
        .await
        .expect("the run's row")
        .get(0)
}

/// Waits until the sink has accepted `count` messages.
async fn accepted(sink: &SmtpSink, count: u64, what: &str) -> u64 {
    let deadline = Instant::now() + WAIT;
    loop {
        let accepted = sink.summary().await["accepted"].as_u64().unwrap_or(0);
        if accepted >= count {
            return accepted;
        }
        assert!(Instant::now() < deadline, "{what}: only {accepted} accepted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_experiment_killed_in_its_test_send_at_its_verdict_and_in_its_winner_send_mails_each_recipient_once() {
    const PEOPLE: usize = 400;
    let sink = SmtpSink::start().await;
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let mut env = sink.process_env(2000);
    env.extend([
        ("APP__BROADCASTS__RATE_PER_SECOND", "100".to_owned()),
        ("APP__BROADCASTS__BATCH", "20".to_owned()),
        ("APP__BROADCASTS__HANDOFFS", "8".to_owned()),
    ]);
    let mut first = spawn_binary("projector", &["run"], &app.database_url, &env);
    app.apply_workspace(&experiment_workspace("send_best"), true).await;
    publish_dkim(&app, &sink).await;
    let run_id = start_run(&app, PEOPLE).await;

    // 1. Killed in the test send.
    accepted(&sink, 30, "the test send did not get going").await;
    first.0.kill().expect("kill -9");
    assert_eq!(phase(&app, &run_id).await.as_deref(), Some("test"), "the kill came in the test send");
    let mut crash_env = env.clone();
    crash_env.push(("APP__PROJECTOR__CRASH_AFTER_VERDICT", "true".to_owned()));
    let mut second = spawn_binary("projector", &["run"], &app.database_url, &crash_env);
    let deadline = Instant::now() + Duration::from_secs(120);
    while phase(&app, &run_id).await.as_deref() != Some("wait") {
        assert!(Instant::now() < deadline, "the test send did not end");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let tested = app
        .query_i64(&format!(
            "SELECT count(*) FROM broadcast_recipients WHERE run_id = '{run_id}' AND variant IS NOT NULL"
        ))
        .await;

    // 2. Dies between the verdict's append and its application: the verdict is in the log,
    // the run still waits.
    end_wait(&app, &run_id).await;
    let deadline = Instant::now() + WAIT;
    while second.0.try_wait().expect("the projector's status").is_none() {
        assert!(Instant::now() < deadline, "the projector did not reach its verdict");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let verdicts = format!(
        "SELECT count(*) FROM events WHERE event_type = 'BroadcastExperimentDecided.v1' AND stream_id = 'broadcast-run-{run_id}'"
    );
    assert_eq!(app.query_i64(&verdicts).await, 1, "the verdict was recorded before the crash");
    assert_eq!(phase(&app, &run_id).await.as_deref(), Some("wait"), "and not applied");

    // 3. The next process applies the recorded verdict, and is killed in the winner send.
    let mut third = spawn_binary("projector", &["run"], &app.database_url, &env);
    let at_verdict = sink.summary().await["accepted"].as_u64().unwrap_or(0);
    accepted(&sink, at_verdict + 30, "the winner send did not get going").await;
    third.0.kill().expect("kill -9");
    assert_eq!(phase(&app, &run_id).await.as_deref(), Some("winner"), "the kill came in the winner send");
    let _fourth = spawn_binary("projector", &["run"], &app.database_url, &env);

    let run = run_until(&app, &run_id, "its end", |run| {
        run["status"] == "completed" && run["counts"]["queued"] == 0 && run["counts"]["pending"] == 0
    })
    .await;
    assert_eq!(app.query_i64(&verdicts).await, 1, "the verdict is recorded once");
    // No clicks: no clear winner, and `send_best` sends the leader (the first on a tie).
    assert_eq!(
        (run["experiment"]["winner"].as_str(), run["experiment"]["verdict"]["rule"].as_str()),
        (Some("a"), Some("send_best")),
        "{run}"
    );
    let unknown = run["counts"]["outcomeUnknown"].as_u64().expect("a count");
    let sent = run["counts"]["sent"].as_u64().expect("a count");
    assert_eq!(sent + unknown, PEOPLE as u64, "every recipient was sent or its hand-off left unknown: {run}");
    // In flight at each of the two kills: at most its hand-offs (8) and the outbox worker's
    // batch it took over (16).
    assert!(unknown <= 48, "{run}");

    let summary = sink.summary().await;
    let recipients: Vec<&str> =
        summary["rcptTo"].as_array().expect("recipients").iter().filter_map(Value::as_str).collect();
    let mut unique = recipients.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), recipients.len(), "no recipient was mailed twice");
    assert!(recipients.len() as u64 >= PEOPLE as u64 - unknown, "{} of {PEOPLE}", recipients.len());
    // A test recipient got its variant's mail; the rest got the winner's.
    let messages = sink.wait_for(recipients.len(), WAIT).await;
    let client = app.pool.get().await.expect("client");
    let variants: BTreeMap<String, Option<String>> = client
        .query(
            "SELECT email_id, variant FROM broadcast_recipients WHERE run_id = $1 AND email_id IS NOT NULL",
            &[&run_id],
        )
        .await
        .expect("the recipients")
        .into_iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let mut rest = 0;
    for message in &messages {
        let variant = variants.get(&email_id_of(message)).expect("a recipient's email");
        let expected = match variant.as_deref() {
            Some("b") => "Deal B",
            Some(_) => "Deal A",
            None => {
                rest += 1;
                "Deal A"
            }
        };
        assert_eq!(message["headers"]["subject"][0], expected, "{variant:?}");
    }
    assert!(tested > 0 && rest > 0 && rest + tested as usize >= messages.len(), "{tested} tested, {rest} of the rest");
}
