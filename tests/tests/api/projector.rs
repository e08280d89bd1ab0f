//! The projector: crash recovery, exclusive batches across processes, rebuild equivalence.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::*;
use crate::log::{assert_batches_cover_each_event_once, wait_until_listening};

async fn create_contacts(app: &TestApp, count: usize, prefix: &str) {
    for index in 0..count {
        let response = app
            .post("/schemas/contacts/records", ALPHA_ADMIN, &json!({"email": format!("{prefix}{index}@example.com")}))
            .await;
        assert_eq!(response.status, 201);
    }
}

#[tokio::test]
async fn a_projector_killed_mid_batch_resumes_without_loss_or_double_effect() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let records_before = app.query_i64("SELECT position FROM projections WHERE name = 'records'").await;
    create_contacts(&app, 30, "crash").await;
    let mut crashing = spawn_binary(
        "projector",
        &["run"],
        &app.database_url,
        &[("APP__PROJECTOR__CRASH_AFTER_EVENTS", "5".into()), ("APP__PROJECTOR__CRASH_PROJECTION", "records".into())],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if crashing.0.try_wait().expect("wait").is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "the crashing projector did not crash");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let records_after = app.query_i64("SELECT position FROM projections WHERE name = 'records'").await;
    assert_eq!(records_after, records_before, "the interrupted batch committed nothing");
    assert_eq!(app.query_i64("SELECT count(*) FROM rm_records_v1.records").await, 0, "no partial batch");
    let _healthy = spawn_binary("projector", &["run"], &app.database_url, &[]);
    app.wait_for_projections().await;
    assert_eq!(app.query_i64("SELECT count(*) FROM rm_records_v1.records").await, 30);
    assert_eq!(app.query_i64("SELECT total FROM rm_records_v1.record_counts").await, 30);
    let head = app.query_i64("SELECT position FROM log_head").await;
    assert_batches_cover_each_event_once(&app, "records", head).await;
}

#[tokio::test]
async fn a_version_made_before_a_table_was_added_gets_it_when_a_projector_starts() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let client = app.pool.get().await.expect("a connection");
    let schema: String = client
        .query_one("SELECT 'rm_emails_v' || version FROM projections WHERE name = 'emails' AND status = 'live'", &[])
        .await
        .expect("the live version")
        .get(0);
    // As a version made before the per-link counts were added.
    client.batch_execute(&format!("DROP TABLE {schema}.link_counts")).await.expect("dropped");
    let exists = format!("SELECT to_regclass('{schema}.link_counts') IS NOT NULL");
    assert!(!client.query_one(&exists, &[]).await.expect("asked").get::<_, bool>(0));
    projector::migrate(&app.pool).await.expect("a projector's start");
    assert!(client.query_one(&exists, &[]).await.expect("asked").get::<_, bool>(0), "added to the live version");
    projector::migrate(&app.pool).await.expect("a second start changes nothing");
}

#[tokio::test]
async fn two_projector_processes_never_apply_the_same_batch() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let _first = spawn_binary("projector", &["run"], &app.database_url, &[]);
    let _second = spawn_binary("projector", &["run"], &app.database_url, &[]);
    let port = free_port();
    let _writer =
        spawn_binary("command-service", &["serve"], &app.database_url, &[("APP__HTTP__PORT", port.to_string())]);
    let url = format!("http://127.0.0.1:{port}/v1");
    wait_until_listening(&app.http, &url).await;
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let (http, url, command_url) = (app.http.clone(), url.clone(), app.command_url.clone());
        tasks.push(tokio::spawn(async move {
            for index in 0..25 {
                let base = if index % 2 == 0 { &url } else { &command_url };
                let status = http
                    .post(format!("{base}/schemas/contacts/records"))
                    .bearer_auth(ALPHA_ADMIN)
                    .json(&json!({"email": format!("p{worker}-{index}@example.com")}))
                    .send()
                    .await
                    .expect("sent")
                    .status();
                assert_eq!(status.as_u16(), 201);
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    app.wait_for_projections().await;
    let head = app.query_i64("SELECT position FROM log_head").await;
    assert_batches_cover_each_event_once(&app, "records", head).await;
    assert_batches_cover_each_event_once(&app, "catalog", head).await;
    assert_eq!(app.query_i64("SELECT count(DISTINCT record_id) FROM rm_records_v1.records").await, 200);
    assert_eq!(app.query_i64("SELECT count(*) FROM rm_records_v1.records").await, 200);
}

async fn snapshot(app: &TestApp, queries: &[&str]) -> Vec<Vec<Value>> {
    let client = app.pool.get().await.expect("client");
    let mut tables = Vec::new();
    for query in queries {
        let rows = client.query(*query, &[]).await.unwrap_or_else(|error| panic!("{query}: {error}"));
        tables.push(rows.into_iter().map(|row| row.get::<_, Value>(0)).collect());
    }
    tables
}

fn records_queries(version: i32) -> Vec<String> {
    vec![
        format!("SELECT to_jsonb(r) FROM rm_records_v{version}.records r ORDER BY record_id"),
        format!("SELECT to_jsonb(c) FROM rm_records_v{version}.record_counts c ORDER BY space_id, schema_id"),
    ]
}

fn catalog_queries(version: i32) -> Vec<String> {
    ["spaces", "users", "memberships", "api_keys", "schemas", "schema_counts", "attributes", "ai_credits", "resources"]
        .iter()
        .map(|table| format!("SELECT to_jsonb(t) FROM rm_catalog_v{version}.{table} t ORDER BY to_jsonb(t)::text"))
        .collect()
}

/// A rebuild beside live traffic waits after each batch in proportion to the API servers'
/// request rate, and runs at full pace when nothing is served.
#[tokio::test]
async fn a_rebuild_yields_to_live_requests_only_while_they_are_served() {
    use projector::read_models::rebuild::rebuild_yielding;
    // No projector of the app's own: it would race the rebuild for the new version's batches
    // (a batch it projects is one the rebuild does not, and does not yield after).
    let app = TestApp::spawn_with(Options::without_projector()).await;
    create_contacts(&app, 25, "yield").await;
    // The test's own server writes its rate for half a second after its last request.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let client = app.pool.get().await.expect("client");
    client.execute("DELETE FROM live_load", &[]).await.expect("no live load");
    let quiet = rebuild_yielding(&app.pool, read_model("records"), 3.0, |_| {}).await.expect("a quiet rebuild");
    assert!(quiet.events > 0);
    assert_eq!(quiet.yielded, Duration::ZERO, "nothing served: full pace");

    app.publish_busy_live_load().await;
    let busy = rebuild_yielding(&app.pool, read_model("records"), 3.0, |_| {}).await.expect("a busy rebuild");
    assert!(busy.yielded > Duration::ZERO, "it waited for live requests: {busy:?}");
    let never =
        rebuild_yielding(&app.pool, read_model("records"), 0.0, |_| {}).await.expect("a rebuild that never yields");
    assert_eq!(never.yielded, Duration::ZERO, "0 never yields");
    assert_eq!(app.query_i64("SELECT count(*) FROM projections WHERE name = 'records' AND status = 'live'").await, 1);
}

#[tokio::test]
async fn a_rebuilt_read_model_equals_the_incrementally_built_one() {
    let app = TestApp::spawn().await;
    create_contacts(&app, 25, "rebuild").await;
    app.post("/schemas/companies/records", ALPHA_ADMIN, &json!({"externalId": "C-1", "name": "Co"})).await;
    // The company's AI auto-fill attribute is filled by an update of the preparation worker.
    app.wait_for_workers().await;
    let before_records = snapshot(&app, &records_queries(1).iter().map(String::as_str).collect::<Vec<_>>()).await;
    let before_catalog = snapshot(&app, &catalog_queries(1).iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(before_records[0].len(), 26);
    let indexes_before = [app.index_definitions("records", 1).await, app.index_definitions("catalog", 1).await];
    assert!(indexes_before[0].iter().any(|index| index.contains("(space_id, schema_id, created_at, record_id)")));

    let mut lines = Vec::new();
    let report = projector::read_models::rebuild::rebuild(&app.pool, read_model("records"), |step| {
        if let projector::read_models::rebuild::Step::Note(line) = step {
            lines.push(line.to_owned());
        }
    })
    .await
    .expect("rebuild records");
    assert_eq!(report.version, 2);
    assert!(lines.iter().any(|line| line.contains("switched readers")), "progress is printed: {lines:?}");
    let after_records = snapshot(&app, &records_queries(2).iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(before_records, after_records);

    projector::read_models::rebuild::rebuild(&app.pool, read_model("catalog"), |_| {}).await.expect("rebuild catalog");
    let after_catalog = snapshot(&app, &catalog_queries(2).iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(before_catalog, after_catalog);
    // A rebuild builds the indexes only readers use once it has caught up: the new versions
    // have every index the first ones were created with.
    let indexes_after = [app.index_definitions("records", 2).await, app.index_definitions("catalog", 2).await];
    assert_eq!(indexes_before, indexes_after);

    assert_eq!(app.query_i64("SELECT count(*) FROM projections WHERE status = 'live' AND version = 2").await, 2);
    assert_eq!(
        app.query_i64(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name IN ('rm_records_v1', 'rm_catalog_v1')"
        )
        .await,
        0,
        "retired versions are dropped"
    );
    // Readers switched with no downtime: the API answers from version 2, and new writes project there.
    let list = app.get("/schemas/contacts/records", ALPHA_ADMIN).await;
    assert_eq!(list.status, 200, "{:?}", list.body);
    assert_eq!(list.body["pagination"]["totalCount"], 25);
    let created = app.create_contact(&json!({"email": "after-rebuild@example.com"})).await;
    let id = created["id"].as_str().expect("id");
    assert_eq!(app.get(&format!("/schemas/contacts/records/{id}"), ALPHA_ADMIN).await.status, 200);
}

#[tokio::test]
async fn batch_history_older_than_a_day_is_pruned() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    app.query_i64(
        "WITH old AS (INSERT INTO projection_batches (name, version, first_position, last_position, worker, committed_at)
                      VALUES ('records', 1, 1000000, 1000000, 'old', now() - interval '2 days') RETURNING 1)
         SELECT count(*) FROM old",
    )
    .await;
    let recent = app.query_i64("SELECT count(*) FROM projection_batches WHERE worker <> 'old'").await;
    assert!(recent > 0, "applying the workspace left recent batches");
    // The maintenance worker's pass prunes it.
    let maintenance = projector::workers::maintenance::Maintenance::new(
        app.pool.clone(),
        Duration::from_secs(3600),
        Duration::from_secs(7 * 24 * 3600),
    );
    projector::runtime::Worker::step(&maintenance).await.expect("a maintenance pass");
    assert_eq!(app.query_i64("SELECT count(*) FROM projection_batches WHERE worker = 'old'").await, 0);
    assert_eq!(app.query_i64("SELECT count(*) FROM projection_batches WHERE worker <> 'old'").await, recent);
}

#[tokio::test]
async fn marketing_sends_older_than_any_cap_counts_are_pruned_once_a_day() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let day = 86_400_000_i64;
    let now = platform::time::now_millis();
    // A year and four days ago is past the longest window a cap may have (366 calendar days
    // and two for zones); a year ago is within it.
    let longest = domain::email::send::policy::Window::longest_lookback_ms();
    assert_eq!(longest, 368 * day);
    app.query_i64(&format!(
        "WITH sends AS (INSERT INTO marketing_sends (contact_id, at_ms, email_id, topic_id, seq)
                        VALUES ('rec_a', {old}, 'em_old', '', 1), ('rec_a', {kept}, 'em_kept', '', 2)
                        RETURNING 1)
         SELECT count(*) FROM sends",
        old = now - 369 * day,
        kept = now - 365 * day,
    ))
    .await;
    let maintenance = projector::workers::maintenance::Maintenance::new(
        app.pool.clone(),
        Duration::from_secs(3600),
        Duration::from_secs(7 * 24 * 3600),
    );
    // A pass earlier today: this pass leaves them for tomorrow's first.
    app.query_i64(&format!(
        "WITH saved AS (INSERT INTO worker_checkpoints (name, position) VALUES ('maintenance', {today})
                        ON CONFLICT (name) DO UPDATE SET position = EXCLUDED.position RETURNING 1)
         SELECT count(*) FROM saved",
        today = chrono::Utc::now().timestamp()
    ))
    .await;
    projector::runtime::Worker::step(&maintenance).await.expect("a maintenance pass");
    assert_eq!(app.query_i64("SELECT count(*) FROM marketing_sends").await, 2, "not twice in a day");
    // The last pass was yesterday: the first pass of the day prunes.
    app.query_i64(&format!(
        "WITH saved AS (UPDATE worker_checkpoints SET position = {yesterday} WHERE name = 'maintenance' RETURNING 1)
         SELECT count(*) FROM saved",
        yesterday = chrono::Utc::now().timestamp() - 86_400
    ))
    .await;
    projector::runtime::Worker::step(&maintenance).await.expect("a maintenance pass");
    let left = app.query_i64("SELECT count(*) FROM marketing_sends WHERE email_id = 'em_kept'").await;
    assert_eq!((app.query_i64("SELECT count(*) FROM marketing_sends").await, left), (1, 1));
}

/// Most appends hold events of one or two read models' types; the others pass over the span
/// together, and announce it in one notification rather than one each (every notification
/// wakes every listener: the query services, the eraser).
#[tokio::test]
async fn a_pass_over_idle_spans_announces_every_read_model_it_advanced_in_one_notification() {
    let app = TestApp::spawn().await;
    app.wait_for_projections().await;
    let mut progress = platform::db::listen(app.database_url.clone(), platform::readmodel::PROGRESS_CHANNEL);
    // The listener sends an empty payload once it listens.
    let listening = tokio::time::timeout(Duration::from_secs(10), progress.recv()).await.expect("listening");
    assert_eq!(listening.as_deref(), Some(""));
    create_contacts(&app, 1, "announced").await;
    app.wait_for_projections().await;
    let mut payloads = Vec::new();
    while let Ok(Some(payload)) = tokio::time::timeout(Duration::from_millis(300), progress.recv()).await {
        payloads.push(payload);
    }
    let announced: Vec<Vec<(String, i32, i64)>> = payloads
        .iter()
        .map(|payload| {
            let entries: Vec<_> = platform::readmodel::progress_entries(payload)
                .map(|(name, version, position)| (name.to_owned(), version, position))
                .collect();
            assert_eq!(entries.len(), payload.split(',').count(), "every entry reads: {payload}");
            entries
        })
        .collect();
    let together = announced.iter().map(Vec::len).max().unwrap_or(0);
    assert!(together >= 5, "the idle read models announced together: {payloads:?}");
    // Every live read model reached the create, whether announced by a batch or by the pass.
    let head = app.query_i64("SELECT position FROM log_head").await;
    let live = app.query_strings("SELECT name FROM projections WHERE status = 'live' ORDER BY name").await;
    for name in &live {
        assert!(
            announced.iter().flatten().any(|(announced, _, position)| announced == name && *position >= head),
            "{name} announced at the head {head}: {payloads:?}"
        );
    }
}
