//! Operations endpoints (health, readiness, metrics), graceful shutdown on SIGTERM, and
//! migrations that refuse an edited history.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::*;

fn origin(base_url: &str) -> String {
    base_url.trim_end_matches("/v1").to_owned()
}

async fn get_json(http: &reqwest::Client, url: &str) -> (u16, Value) {
    let response = http.get(url).send().await.expect("sent");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn get_text(http: &reqwest::Client, url: &str) -> (u16, String) {
    let response = http.get(url).send().await.expect("sent");
    (response.status().as_u16(), response.text().await.expect("text"))
}

#[tokio::test]
async fn both_services_report_live_ready_and_metrics_outside_v1() {
    let app = TestApp::spawn().await;
    assert_eq!(app.get("/me", ALPHA_ADMIN).await.status, 200);
    for base in [&app.command_url, &app.query_url] {
        let origin = origin(base);
        assert_eq!(get_json(&app.http, &format!("{origin}/health/live")).await.0, 200);
        let (status, ready) = get_json(&app.http, &format!("{origin}/health/ready")).await;
        assert_eq!(status, 200, "{ready}");
        assert_eq!(ready["database"], json!({"reachable": true, "migrated": true}));
    }
    let (status, metrics) = get_text(&app.http, &format!("{}/metrics", origin(&app.query_url))).await;
    assert_eq!(status, 200);
    assert!(
        metrics.lines().any(|line| line.starts_with("http_requests_total")
            && line.contains("operation=\"getMe\"")
            && line.contains("status=\"200\"")),
        "requests are counted by operation and status:\n{metrics}"
    );
    assert!(metrics.contains("http_request_duration_seconds_bucket"), "with a latency histogram");
    // Writes report their append batches.
    app.create_contact(&json!({"email": "metrics@x.io"})).await;
    let (_, metrics) = get_text(&app.http, &format!("{}/metrics", origin(&app.command_url))).await;
    for name in ["append_batch_commands_count", "append_batch_seconds_bucket"] {
        assert!(metrics.contains(name), "{name} in:\n{metrics}");
    }
}

/// A new empty database beside the app's, named from `prefix`: its URL.
async fn empty_database(app: &TestApp, prefix: &str) -> String {
    let name = format!("{prefix}_{}", uuid::Uuid::now_v7().simple());
    app.pool.get().await.expect("client").batch_execute(&format!("CREATE DATABASE {name}")).await.expect("create");
    let at = app.database_url.rfind("dbname=").expect("dbname");
    format!("{}dbname={name}", &app.database_url[..at])
}

#[tokio::test]
async fn readiness_fails_while_the_database_is_not_migrated() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    // A database nobody migrated.
    let bare = empty_database(&app, "bare").await;
    let query =
        query_service::Application::build(platform::settings::Settings::for_database(&bare)).await.expect("builds");
    let origin = format!("http://127.0.0.1:{}", query.port());
    tokio::spawn(query.run_until_stopped());
    let (status, body) = get_json(&app.http, &format!("{origin}/health/ready")).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["database"]["migrated"], false);
    assert_eq!(get_json(&app.http, &format!("{origin}/health/live")).await.0, 200, "alive all the same");
}

#[tokio::test]
async fn the_projector_reports_each_workers_health_lag_and_metrics() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let port = free_port();
    let _projector =
        spawn_binary("projector", &["run"], &app.database_url, &[("APP__PROJECTOR__PORT", port.to_string())]);
    let origin = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let ready = loop {
        if let Ok(response) = app.http.get(format!("{origin}/health/ready")).send().await
            && response.status() == 200
        {
            let body: Value = response.json().await.expect("json");
            let every_worker_stepped = body["process"]["workers"]
                .as_object()
                .is_some_and(|workers| workers.len() >= 8 && workers.values().all(|w| w["lastSuccessAt"].is_string()));
            if body["process"]["workers"]["read_model:records"]["lag"] == 0 && every_worker_stepped {
                break body;
            }
        }
        assert!(Instant::now() < deadline, "the projector did not become ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let workers = ready["process"]["workers"].as_object().expect("workers");
    for name in ["read_model:catalog", "read_model:records", "preparation", "eraser", "maintenance"] {
        let worker = &workers[name];
        assert!(worker["lastSuccessAt"].is_string(), "{name}: {worker}");
        assert!(worker["failingSince"].is_null(), "{name}: {worker}");
    }
    assert_eq!(ready["process"]["deadLetters"], 0);
    let (_, metrics) = get_text(&app.http, &format!("{origin}/metrics")).await;
    assert!(metrics.contains("worker_steps_total{worker=\"read_model:records\"}"), "{metrics}");
    assert!(metrics.contains("worker_lag_positions{worker=\"read_model:records\"} 0"), "{metrics}");
}

fn terminate(child: &ChildGuard) {
    let status = Command::new("kill").args(["-TERM", &child.0.id().to_string()]).status().expect("kill runs");
    assert!(status.success());
}

fn wait_for_exit(child: &mut ChildGuard, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.0.try_wait().expect("waits") {
            return status;
        }
        assert!(Instant::now() < deadline, "the process did not exit within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn sigterm_lets_requests_in_flight_finish_and_loses_nothing_acknowledged() {
    let app = TestApp::spawn().await;
    let (mut processes, urls) = spawn_servers(&app, "command-service", &["serve"], 1, &[]).await;
    let url = format!("{}/schemas/contacts/records", urls[0]);
    // Hold appends back, so that requests are in flight when the signal comes.
    let mut holder = app.pool.get().await.expect("client");
    let hold = holder.transaction().await.expect("begins");
    hold.batch_execute("LOCK TABLE log_head IN EXCLUSIVE MODE").await.expect("locks");
    let requests: Vec<_> = (0..20)
        .map(|index| {
            let request =
                app.http.post(&url).bearer_auth(ALPHA_ADMIN).json(&json!({"email": format!("t{index}@x.io")}));
            tokio::spawn(async move { request.send().await.map(|response| response.status().as_u16()) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    terminate(&processes[0]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // New connections are refused once the listener has stopped...
    assert!(app.http.post(&url).bearer_auth(ALPHA_ADMIN).json(&json!({})).send().await.is_err());
    // ... and the requests in flight finish when their appends can.
    hold.rollback().await.expect("releases");
    let mut created = 0;
    for request in requests {
        let status = request.await.expect("joins").expect("an answer, not a reset");
        assert_eq!(status, 201, "every request in flight completes");
        created += 1;
    }
    let status = wait_for_exit(&mut processes[0], Duration::from_secs(15));
    assert!(status.success(), "exits cleanly: {status:?}");
    app.wait_for_projections().await;
    let stored = app.query_i64("SELECT count(*) FROM events WHERE event_type = 'RecordCreated.v1'").await;
    assert_eq!(stored, created, "every acknowledged write is in the log");
}

#[tokio::test]
async fn sigterm_stops_the_projector_and_releases_its_leases() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let mut first = spawn_binary("projector", &["run"], &app.database_url, &[]);
    let created = app.create_contact(&json!({"email": "before@x.io"})).await;
    let id = created["id"].as_str().expect("id").to_owned();
    let readable =
        async |id: &str| app.get(&format!("/schemas/contacts/records/{id}"), ALPHA_ADMIN).await.status == 200;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !readable(&id).await {
        assert!(Instant::now() < deadline, "projected by the first projector");
    }
    terminate(&first);
    let status = wait_for_exit(&mut first, Duration::from_secs(15));
    assert!(status.success(), "exits cleanly: {status:?}");
    // Nothing is left locked: a second projector takes every lease at once. A lease is a row
    // lock (`FOR UPDATE`), which holds the table in a mode stronger than the `AccessShareLock`
    // that the services' own short reads of `projections` take. A server process whose client
    // has just exited may take a moment to notice, hence the short wait.
    let leases_held = async || {
        app.query_i64(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
             WHERE l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND c.relname IN ('projections', 'worker_checkpoints')
               AND l.mode <> 'AccessShareLock' AND l.pid <> pg_backend_pid()",
        )
        .await
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut locked = leases_held().await;
    while locked != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        locked = leases_held().await;
    }
    assert_eq!(locked, 0, "no lease outlives the projector that held it");
    let _second = spawn_binary("projector", &["run"], &app.database_url, &[]);
    let later = app.create_contact(&json!({"email": "after@x.io"})).await;
    let later_id = later["id"].as_str().expect("id").to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !readable(&later_id).await {
        assert!(Instant::now() < deadline, "projected by the second projector");
    }
}

#[tokio::test]
async fn an_edited_applied_migration_fails_loudly() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let migrate = || run_binary("projector", &["migrate"], &app.database_url);
    assert!(migrate().status.success(), "applying again changes nothing");
    // The database applied a version 1 that is not the file in the repository.
    app.query_i64("WITH edited AS (UPDATE refinery_schema_history SET checksum = '1' WHERE version = 1 RETURNING 1) SELECT count(*) FROM edited")
        .await;
    let refused = migrate();
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("V1__event_log is different"), "{said}");
}

/// Writes one POST on `stream` and reads its response: the status, and whether the server
/// said it would close the connection.
async fn post_on(stream: &mut tokio::net::TcpStream, host: &str, path: &str, body: &str) -> (u16, bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {ALPHA_ADMIN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("request written");
    let mut received = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let read = stream.read(&mut chunk).await.expect("response read");
        assert!(read > 0, "the server closed the connection without a response");
        received.extend_from_slice(&chunk[..read]);
        let text = String::from_utf8_lossy(&received);
        let Some(end) = text.find("\r\n\r\n") else { continue };
        let head = text[..end].to_ascii_lowercase();
        let length = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|value| value.trim().parse::<usize>().ok())
            .expect("a content length");
        if received.len() >= end + 4 + length {
            let status = head.split(' ').nth(1).and_then(|code| code.parse().ok()).expect("a status");
            return (status, head.contains("connection: close"));
        }
    }
}

#[tokio::test]
async fn an_idle_connection_still_carries_a_post_after_the_old_five_second_limit() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let address = app.command_url.trim_start_matches("http://").trim_end_matches("/v1").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&address).await.expect("connected");
    let path = "/v1/schemas/contacts/records";
    let (status, closing) = post_on(&mut stream, &address, path, r#"{"email":"first@keepalive.io"}"#).await;
    assert_eq!((status, closing), (201, false));
    // actix closes idle connections after 5 s by default; the services keep them 75 s.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let (status, _) = post_on(&mut stream, &address, path, r#"{"email":"second@keepalive.io"}"#).await;
    assert_eq!(status, 201, "the reused connection carried the second POST");
}

#[tokio::test]
async fn an_upgrade_orders_the_marketing_sends_an_earlier_release_recorded() {
    // A database as the release before the caps' guard left it, with sends recorded; the
    // upgrade gives each contact's sends their order by time, and the guard holds at once.
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let url = empty_database(&app, "earlier").await;
    let pool = platform::db::pool(&url, 2).expect("a pool");
    platform::db::migrate_until(&pool, Some(31)).await.expect("the earlier release's migrations");
    let client = pool.get().await.expect("client");
    client
        .batch_execute(
            "INSERT INTO marketing_sends (contact_id, at_ms, email_id, topic_id) VALUES
                 ('rec_a', 3000, 'em_3', ''), ('rec_a', 1000, 'em_1', 'top_1'), ('rec_b', 500, 'em_b', ''),
                 ('rec_a', 2000, 'em_2', '')",
        )
        .await
        .expect("sends of the earlier release");
    drop(client);
    platform::db::migrate(&pool).await.expect("the upgrade");
    let client = pool.get().await.expect("client");
    let rows = client
        .query("SELECT contact_id, email_id, seq FROM marketing_sends ORDER BY contact_id, at_ms", &[])
        .await
        .expect("sends");
    let ordered: Vec<(String, String, Option<i64>)> =
        rows.iter().map(|row| (row.get(0), row.get(1), row.get(2))).collect();
    let expected = [("rec_a", "em_1", 1), ("rec_a", "em_2", 2), ("rec_a", "em_3", 3), ("rec_b", "em_b", 1)]
        .map(|(contact, email, seq)| (contact.to_owned(), email.to_owned(), Some(seq)));
    assert_eq!(ordered, expected);
    // The next send decided from that reading takes the place after the newest; a second one
    // decided from the same reading cannot.
    let next = "INSERT INTO marketing_sends (contact_id, at_ms, email_id, topic_id, seq)
                VALUES ('rec_a', 4000, $1, '', 4) ON CONFLICT DO NOTHING";
    assert_eq!(client.execute(next, &[&"em_4"]).await.expect("insert"), 1);
    assert_eq!(client.execute(next, &[&"em_4b"]).await.expect("insert"), 0);
}
