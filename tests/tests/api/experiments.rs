//! Broadcast experiments: a run tests its variants on a share of the audience over real SMTP,
//! people click the tracked links of the mail they received (and a link checker follows
//! others), the verdict is decided on people's clicks alone and recorded once, and the winner
//! goes to the rest, each recipient mailed once; each link's clicks are read per variant.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::broadcasts::{create_people, patch, segment, send};
use crate::email::{
    BLAST_BROADCAST, MAIL_KEY, email_id_of, mail_workspace_with_promo, publish_dkim, template_id, test_email,
};
use crate::engagement::{get, local, tracked};
use crate::helpers::*;
use crate::smtp_sink::SmtpSink;

const WAIT: Duration = Duration::from_secs(60);

/// The mail workspace whose promo template has two tracked links (the second with a personal
/// query) and whose blast broadcast tests two subjects on half its audience, with `fallback`
/// when neither wins clearly.
fn experiment_workspace(fallback: &str) -> String {
    experiment_workspace_with(fallback, |_| {})
}

/// [`experiment_workspace`] with its experiment changed by `change`.
fn experiment_workspace_with(fallback: &str, change: impl FnOnce(&mut Value)) -> String {
    let workspace = mail_workspace_with_promo(|promo| {
        promo["html"] = json!(concat!(
            "<html><body><p><a href=\"https://shop.example.com/deal\">See the deal</a></p>",
            "<p><a href=\"https://shop.example.com/account?who={{ contact.email }}\">Your account</a></p></body></html>"
        ));
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
        "variants": [{"id": "a", "subject": "Deal A"}, {"id": "b", "subject": "Deal B", "preheader": "Ends <Sunday>"}],
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
    // Only b's mail opens with its preheader, hidden.
    let opens = |message: &Value| message["html"].as_str().unwrap_or_default().contains(">Ends &lt;Sunday&gt;</div>");
    assert!(b.iter().all(|message| opens(message)) && !a.iter().any(|message| opens(message)));
    // Each mail's story names the variant it was sent.
    for (message, variant) in [(a[0], "a"), (b[0], "b")] {
        let story = app.get(&format!("/emails/{}", email_id_of(message)), MAIL_KEY).await;
        assert_eq!(story.body["data"]["origin"]["variant"], variant, "{:?}", story.body);
    }

    // People click: 6 of variant a's mail (at most 24%), and 60% of b's but at least 20, so
    // that b leads significantly whatever the random split (36 and 64 people with 6 and 20
    // clicks was p = 0.11). A link checker follows (HEAD) every other link of a's mail:
    // counted apart, those would make a the leader.
    let b_clicks = (b.len() * 3).div_ceil(5).max(20);
    tokio::time::sleep(Duration::from_millis(10_500).saturating_sub(delivered.elapsed())).await;
    for message in a.iter().take(6).chain(b.iter().take(b_clicks)) {
        let link = &tracked(message, "click?")[0];
        assert_eq!(get(&app, link).await.status(), 302);
    }
    let checker = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("a client");
    for message in a.iter().skip(6) {
        let link = local(&app, &tracked(message, "click?")[0]);
        let answer = checker.head(link).header("User-Agent", "LinkChecker/1.0").send().await.expect("HEAD");
        assert_eq!(answer.status(), 302);
    }
    // Five of b's clickers open their account too, twice, after the 2 s that would make a
    // second link a burst.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    for message in b.iter().take(5) {
        for _ in 0..2 {
            assert_eq!(get(&app, &tracked(message, "click?")[1]).await.status(), 302);
        }
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
    assert_eq!((figures(0, "engaged"), figures(1, "engaged")), (6, b_clicks as i64), "people's clicks only: {verdict}");
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
    assert_eq!(rest_story.body["data"]["origin"]["cohort"], "winner", "{:?}", rest_story.body);

    // Three of the rest click the deal, once their mail is older than a scanner's window.
    let rest: Vec<&Value> = everything
        .iter()
        .filter(|message| !tested_subjects.contains_key(message["rcptTo"][0].as_str().unwrap_or("")))
        .collect();
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    for message in rest.iter().take(3) {
        assert_eq!(get(&app, &tracked(message, "click?")[0]).await.status(), 302);
    }
    app.wait_for_workers().await;
    // Each link's clicks, by cohort and variant: people's apart from the checker's, a link
    // named by its target without the query that differs per recipient.
    let links = app.get(&format!("/broadcasts/{BLAST_BROADCAST}/runs/{run_id}/links"), MAIL_KEY).await;
    assert_eq!(links.status, 200, "{:?}", links.body);
    let rows = links.body["data"].as_array().expect("links").clone();
    assert_conforms("BroadcastRunLink", &rows);
    // (cohort, variant, position, url, clicks, unique clicks, machines' clicks, machines' unique)
    let figures: Vec<Value> = rows
        .iter()
        .map(|row| {
            json!([
                row["cohort"],
                row["variant"],
                row["position"],
                row["url"],
                row["clicks"],
                row["uniqueClicks"],
                row["machine"]["clicks"],
                row["machine"]["uniqueClicks"]
            ])
        })
        .collect();
    let (deal, account) = ("https://shop.example.com/deal", "https://shop.example.com/account");
    let checked = a.len() - 6;
    let expected = vec![
        json!(["test", "a", 1, deal, 6, 6, checked, checked]),
        json!(["test", "b", 1, deal, b_clicks, b_clicks, 0, 0]),
        json!(["test", "b", 2, account, 10, 5, 0, 0]),
        json!(["winner", "b", 1, deal, 3, 3, 0, 0]),
    ];
    assert_eq!(figures, expected, "{rows:?}");
    let unknown = app.get(&format!("/broadcasts/{BLAST_BROADCAST}/runs/bcr_nope/links"), MAIL_KEY).await;
    assert_eq!(unknown.status, 404, "{:?}", unknown.body);
    assert_eq!(unknown.body["error"]["code"], "broadcast_run_not_found");
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
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let header = reader.headers().expect("a header").clone();
    let column = |name: &str| header.iter().position(|field| field == name).expect("a column");
    let (variant, cohort, links_clicked) = (column("variant"), column("cohort"), column("linksClicked"));
    let mut exported = BTreeMap::new();
    let mut clicked = BTreeMap::new();
    for record in reader.records() {
        let record = record.expect("a CSV record");
        *exported.entry((record[cohort].to_owned(), record[variant].to_owned())).or_insert(0) += 1;
        *clicked.entry(record[links_clicked].to_owned()).or_insert(0) += 1;
    }
    let tested_b = b.len();
    let expected = BTreeMap::from([
        (("test".to_owned(), "a".to_owned()), a.len()),
        (("test".to_owned(), "b".to_owned()), tested_b),
        (("winner".to_owned(), "b".to_owned()), PEOPLE - a.len() - tested_b),
    ]);
    assert_eq!(exported, expected, "each email's variant and cohort");
    let expected = BTreeMap::from([
        (String::new(), PEOPLE - 6 - b_clicks - 3),
        ("1".to_owned(), 6 + b_clicks - 5 + 3),
        ("1 2".to_owned(), 5),
    ]);
    assert_eq!(clicked, expected, "the links each person clicked, the checker's left out");
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
    // Nobody clicks: too few engaged recipients for the test. While the emails read model
    // holds a dead letter of the space (its later events held until an operator retries it),
    // the verdict waits rather than decide on figures that may be short.
    let client = app.pool.get().await.expect("a connection");
    let quarantined = client
        .execute(
            "INSERT INTO projection_dead_letters (name, version, position, space_key, event_type, error)
             SELECT 'emails', p.version, (SELECT position FROM log_head), r.space_id, 'EmailClicked.v1', 'planted'
             FROM projections p, broadcast_runs r WHERE p.name = 'emails' AND p.status = 'live' AND r.run_id = $1",
            &[&run_id],
        )
        .await
        .expect("a dead letter");
    assert_eq!(quarantined, 1);
    end_wait(&app, &run_id).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(run(&app, &run_id).await["experiment"]["phase"], "wait", "no verdict on held figures");
    client
        .execute("UPDATE projection_dead_letters SET resolved_at = now() WHERE error = 'planted'", &[])
        .await
        .expect("resolved");
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

#[tokio::test]
async fn an_experiment_changed_by_patch_is_checked_against_the_space_and_taken_by_the_next_run() {
    let sink = SmtpSink::start().await;
    let app = experiment_app(&sink, "stop").await;
    let shown = app.get(&format!("/broadcasts/{BLAST_BROADCAST}"), MAIL_KEY).await;
    assert_eq!(shown.status, 200, "{:?}", shown.body);
    let mut experiment = shown.body["data"]["experiment"].clone();
    let (newsletter, receipt) = (template_id(&app, "newsletter").await, template_id(&app, "receipt").await);

    // What the space cannot send with is refused, naming the variant's field.
    for (index, (variant, expected)) in [
        (json!({"id": "c", "templateId": receipt}), "experiment.variants[2].templateId"),
        (json!({"id": "c", "templateId": "tpl_not_here"}), "experiment.variants[2].templateId"),
        (json!({"id": "c", "senderId": "snd_not_here"}), "experiment.variants[2].senderId"),
        (json!({"id": "C"}), "experiment.variants[2].id"),
    ]
    .into_iter()
    .enumerate()
    {
        let mut broken = experiment.clone();
        broken["variants"].as_array_mut().expect("variants").push(variant.clone());
        let refused = patch(&app, BLAST_BROADCAST, &format!("broken-{index}"), &json!({"experiment": broken})).await;
        assert_eq!(refused.status, 400, "{variant}: {:?}", refused.body);
        assert_eq!(refused.body["error"]["code"], "invalid_broadcast", "{:?}", refused.body);
        let issues = refused.body["error"]["issues"].as_array().into_iter().flatten();
        let keys: Vec<&str> = issues.filter_map(|issue| issue["key"].as_str()).collect();
        assert!(keys.contains(&expected), "{variant}: {expected} in {:?}", refused.body);
    }

    // A third variant on another template, a smaller share and a longer wait.
    experiment["testShare"] = json!(10);
    experiment["waitMs"] = json!(7_200_000);
    experiment["variants"].as_array_mut().expect("variants").push(json!({"id": "c", "templateId": newsletter}));
    let changed = patch(&app, BLAST_BROADCAST, "change", &json!({"experiment": experiment})).await;
    assert_eq!(changed.status, 200, "{:?}", changed.body);
    assert_eq!(changed.body["data"]["experiment"], experiment, "answered as changed");
    let removed = patch(&app, BLAST_BROADCAST, "remove", &json!({"experiment": null})).await;
    assert_eq!(removed.body["data"]["experiment"], Value::Null, "{:?}", removed.body);
    let back = patch(&app, BLAST_BROADCAST, "back", &json!({"experiment": experiment})).await;
    assert_eq!(back.status, 200, "{:?}", back.body);
    app.wait_for_projections().await;
    let read = app.get(&format!("/broadcasts/{BLAST_BROADCAST}"), MAIL_KEY).await;
    assert_eq!(read.body["data"]["experiment"], experiment, "the read model folds the update");

    // The next run tests what the PATCH set.
    create_people(&app, (0..20).map(|index| (format!("pat{index:03}@example.com"), true)).collect()).await;
    let segment_id = segment(&app, "Fans", "firstName is Fan").await;
    let aimed = patch(&app, BLAST_BROADCAST, "aim", &json!({"audience": {"segmentId": segment_id}})).await;
    assert_eq!(aimed.status, 200, "{:?}", aimed.body);
    app.wait_for_projections().await;
    let sent = send(&app, BLAST_BROADCAST, "go").await;
    assert_eq!(sent.status, 202, "{:?}", sent.body);
    assert_eq!(sent.body["data"]["experiment"]["definition"], experiment, "{:?}", sent.body);
    // While it runs, the experiment cannot change.
    let active = patch(&app, BLAST_BROADCAST, "late", &json!({"experiment": null})).await;
    assert_eq!((active.status, &active.body["error"]["code"]), (409, &json!("broadcast_run_active")));
}

#[tokio::test]
async fn an_experiment_by_conversions_counts_the_events_within_the_window_after_each_send() {
    const PEOPLE: usize = 200;
    let sink = SmtpSink::start().await;
    let app = TestApp::spawn_with(Options { email: Some(test_email(&sink)), ..Options::default() }).await;
    let workspace = experiment_workspace_with("stop", |experiment| {
        experiment["metric"] = json!({"conversion": "purchase", "within": "1m"});
    });
    app.apply_workspace(&workspace, true).await;
    publish_dkim(&app, &sink).await;
    let run_id = start_run(&app, PEOPLE).await;
    let waiting = run_until(&app, &run_id, "its wait with every test mail sent", test_sent).await;
    assert_eq!(waiting["experiment"]["definition"]["metric"]["type"], "conversion", "{waiting}");
    let tested = waiting["counts"]["sent"].as_u64().expect("sent") as usize;
    let test_mail = sink.wait_for(tested, WAIT).await;
    // Each test recipient's contact, by the subject (the variant) it was sent.
    let mut contacts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for message in &test_mail {
        let story = app.get(&format!("/emails/{}", email_id_of(message)), MAIL_KEY).await;
        let contact = story.body["data"]["contactId"].as_str().expect("a contact").to_owned();
        let subject = message["headers"]["subject"][0].as_str().expect("a subject").to_owned();
        contacts.entry(subject).or_default().push(contact);
    }
    let (a, b) = (&contacts["Deal A"], &contacts["Deal B"]);
    assert!(a.len() >= 25 && b.len() >= 35, "an even split: {} and {}", a.len(), b.len());

    // 6 of a's recipients buy, 30 of b's; 10 more of a's bought an hour before the send, which
    // does not count.
    let fire = |contact: &String, occurred: Option<String>| {
        let mut body = json!({"contactId": contact, "amount": 1});
        if let Some(at) = occurred {
            body["occurredAt"] = json!(at);
        }
        body
    };
    let before = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let bodies: Vec<Value> = a
        .iter()
        .take(6)
        .map(|contact| fire(contact, None))
        .chain(a.iter().skip(6).take(10).map(|contact| fire(contact, Some(before.clone()))))
        .chain(b.iter().take(30).map(|contact| fire(contact, None)))
        .collect();
    for body in &bodies {
        let fired = app.post("/events/purchase", MAIL_KEY, body).await;
        assert_eq!(fired.status, 202, "{:?}", fired.body);
    }
    app.wait_for_workers().await;
    let live = run(&app, &run_id).await;
    let results = &live["experiment"]["results"];
    assert_eq!((&results[0]["engaged"], &results[1]["engaged"]), (&json!(6), &json!(30)), "{live}");

    end_wait(&app, &run_id).await;
    let finished = run_until(&app, &run_id, "its end", |run| run["status"] == "completed").await;
    let experiment = &finished["experiment"];
    assert_eq!(experiment["winner"], "b", "{finished}");
    let verdict = &experiment["verdict"];
    let figures = |index: usize, field: &str| verdict["variants"][index][field].as_i64().unwrap_or(-1);
    assert_eq!((figures(0, "engaged"), figures(1, "engaged")), (6, 30), "{verdict}");
    assert_eq!((figures(0, "machine"), figures(1, "machine")), (0, 0), "{verdict}");
    assert_eq!(verdict["metric"], "conversion", "{verdict}");
}
