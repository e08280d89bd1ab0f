//! Record deletion with crypto-shredding: the operation's states, the work it refuses while
//! pending, and the proof that no copy of the data is left in the database.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::*;

fn hex(text: &str) -> String {
    text.bytes().map(|byte| format!("{byte:02x}")).collect()
}

/// Everything in the test's database, as `pg_dump` prints it (the log included).
pub(crate) async fn dump(app: &TestApp) -> String {
    let pg_dump = std::env::var("PG_BIN").map_or_else(|_| "pg_dump".into(), |bin| format!("{bin}/pg_dump"));
    let database_url = app.database_url.clone();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(pg_dump).arg("--data-only").arg(format!("--dbname={database_url}")).output()
    })
    .await
    .expect("pg_dump task")
    .expect("pg_dump runs");
    assert!(output.status.success(), "pg_dump: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("the dump is text")
}

/// Where `needle` occurs in the dump in clear: as text, or as the hex of a bytea column.
pub(crate) fn occurrences(dump: &str, needle: &str) -> Vec<String> {
    let (text, bytes) = (needle.to_lowercase(), hex(needle));
    dump.lines()
        .filter(|line| line.to_lowercase().contains(&text) || line.contains(&bytes))
        .map(|line| line.chars().take(160).collect())
        .collect()
}

async fn delete(app: &TestApp, schema: &str, id: &str) -> TestResponse {
    app.send(app.request(reqwest::Method::DELETE, &format!("/schemas/{schema}/records/{id}"), Some(ALPHA_ADMIN))).await
}

async fn patch(app: &TestApp, id: &str, body: &Value) -> TestResponse {
    app.send(
        app.request(reqwest::Method::PATCH, &format!("/schemas/contacts/records/{id}"), Some(ALPHA_ADMIN)).json(body),
    )
    .await
}

/// Polls the deletion until it reaches `status`.
async fn poll_until(app: &TestApp, operation_id: &str, status: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let polled = app.get(&format!("/record-deletions/{operation_id}"), ALPHA_ADMIN).await;
        assert_eq!(polled.status, 200, "{:?}", polled.body);
        if polled.body["data"]["status"] == status {
            return polled.body["data"].clone();
        }
        assert!(Instant::now() < deadline, "deletion never became {status}: {:?}", polled.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn deletion_erases_every_copy_of_the_contact() {
    let app = TestApp::spawn().await;
    let tag = uuid::Uuid::now_v7().simple().to_string();
    let email = format!("erase-me-{tag}@example.org");
    let name = format!("Zebulon{}", &tag[24..]);
    let phone = "+4915112345678";
    // A webhook whose deliveries about the contact are queued (its target refuses
    // connections, so they stay in the outbox, retried).
    let webhook = app
        .post(
            "/webhooks",
            ALPHA_ADMIN,
            &json!({"url": "http://127.0.0.1:9/hook", "trigger": "contact upserted", "schemaId": "contacts"}),
        )
        .await;
    assert_eq!(webhook.status, 201, "{:?}", webhook.body);
    let contact = app.create_contact(&json!({"email": email, "firstName": name, "plan": "pro"})).await;
    let id = contact["id"].as_str().expect("id").to_owned();
    // More writes about the subject: updates, and an upsert matched by email whose response
    // is recorded under an idempotency key.
    assert_eq!(patch(&app, &id, &json!({"age": 41, "phone": phone})).await.status, 200);
    assert_eq!(patch(&app, &id, &json!({"firstName": format!("{name}x")})).await.status, 200);
    let upsert = app
        .send(
            app.request(reqwest::Method::POST, "/schemas/contacts/records/upsert", Some(ALPHA_ADMIN))
                .header("Idempotency-Key", format!("erase-{tag}"))
                .json(&json!({"email": email, "age": 42})),
        )
        .await;
    assert_eq!(upsert.status, 200, "{:?}", upsert.body);
    app.wait_for_projections().await;

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while app.query_i64(&format!("SELECT count(*) FROM webhook_deliveries WHERE subject_id = '{id}'")).await < 4 {
        assert!(std::time::Instant::now() < deadline, "the webhook deliveries about the contact were not enqueued");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    // Before deletion the read model holds the data in clear, and the log does not.
    let before = dump(&app).await;
    assert!(!occurrences(&before, &email).is_empty(), "the read model holds the email before deletion");
    let log_payloads = app.query_i64(&format!("SELECT count(*) FROM events WHERE subject_id = '{id}'")).await;
    assert_eq!(log_payloads, 4, "four log events are about the contact");
    let clear_in_log = app
        .query_i64(&format!("SELECT count(*) FROM events WHERE position(convert_to('{email}', 'UTF8') IN payload) > 0"))
        .await;
    assert_eq!(clear_in_log, 0, "the log holds the email only encrypted");

    let deleted = delete(&app, "contacts", &id).await;
    assert_eq!(deleted.status, 200, "{:?}", deleted.body);
    let operation_id = deleted.body["data"]["operationId"].as_str().expect("operationId").to_owned();
    assert_eq!(deleted.header("Operation-Id"), Some(operation_id.as_str()));
    assert!(operation_id.starts_with("op_"));
    assert_eq!(deleted.body["data"]["status"], "pending");
    assert!(deleted.body["data"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    // Gone from reads at once (read-your-writes).
    assert_eq!(app.get(&format!("/schemas/contacts/records/{id}"), ALPHA_ADMIN).await.status, 404);

    let completed = poll_until(&app, &operation_id, "completed").await;
    assert_eq!(completed["recordId"], id.as_str());
    assert!(completed["completedAt"].is_string());
    assert_eq!(app.query_i64(&format!("SELECT count(*) FROM subject_keys WHERE subject_id = '{id}'")).await, 0);
    let completion = app
        .query_i64(&format!(
            "SELECT count(*) FROM events WHERE subject_id = '{id}' AND event_type = 'RecordDeletionCompleted.v1'"
        ))
        .await;
    assert_eq!(completion, 1, "the completion is recorded in the log");

    // The proof: nothing in the whole database shows the data in clear, the log included.
    let after = dump(&app).await;
    for needle in [email.as_str(), name.as_str(), phone] {
        let found = occurrences(&after, needle);
        assert!(found.is_empty(), "{needle:?} is still in the database: {found:?}");
    }
    // The log still holds the (now unreadable) events: nothing was rewritten.
    assert_eq!(app.query_i64(&format!("SELECT count(*) FROM events WHERE subject_id = '{id}'")).await, 6);
    // A replay of the recorded upsert answers without the data.
    let replay = app
        .send(
            app.request(reqwest::Method::POST, "/schemas/contacts/records/upsert", Some(ALPHA_ADMIN))
                .header("Idempotency-Key", format!("erase-{tag}"))
                .json(&json!({"email": email, "age": 42})),
        )
        .await;
    assert_eq!(replay.header("Idempotent-Replay"), Some("true"));
    assert!(!replay.body.to_string().contains(&email), "{:?}", replay.body);
    // Deleted for good: 404 everywhere, also for the poll's repeat of DELETE.
    assert_eq!(delete(&app, "contacts", &id).await.code().as_str(), Some("record_not_found"));
    assert_eq!(patch(&app, &id, &json!({"age": 1})).await.status, 404);
}

/// The eraser's looks for open operations, as its projector's `/metrics` counts them (`None`
/// before its first look, or while the projector does not answer).
async fn eraser_looks(app: &TestApp, origin: &str) -> Option<u64> {
    let metrics = app.http.get(format!("{origin}/metrics")).send().await.ok()?.text().await.ok()?;
    let count = metrics.lines().find_map(|line| line.strip_prefix("eraser_looks_total "))?;
    Some(count.trim().parse::<f64>().expect("a count") as u64)
}

#[tokio::test]
async fn the_eraser_looks_for_deletions_when_one_is_requested_not_after_every_write() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let port = free_port();
    let _projector =
        spawn_binary("projector", &["run"], &app.database_url, &[("APP__PROJECTOR__PORT", port.to_string())]);
    let origin = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while eraser_looks(&app, &origin).await.is_none() {
        assert!(Instant::now() < deadline, "the projector's eraser never looked");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut ids = Vec::new();
    let before = eraser_looks(&app, &origin).await.expect("looks counted");
    for index in 0..30 {
        ids.push(app.create_contact(&json!({"email": format!("quiet-{index}@eraser.test")})).await["id"].clone());
    }
    app.wait_for_projections().await;
    let looks = eraser_looks(&app, &origin).await.expect("looks counted") - before;
    // 30 appends and their read models' progress; at most the looks of the 10 s recheck.
    assert!(looks <= 3, "the eraser looked {looks} times for 30 writes");

    let id = ids[0].as_str().expect("an id");
    let requested = Instant::now();
    let deleted = delete(&app, "contacts", id).await;
    assert_eq!(deleted.status, 200, "{:?}", deleted.body);
    let operation = deleted.body["data"]["operationId"].as_str().expect("operationId").to_owned();
    poll_until(&app, &operation, "completed").await;
    assert!(
        requested.elapsed() < Duration::from_secs(6),
        "the deletion waited {:?}: the request did not wake the eraser",
        requested.elapsed()
    );
}

#[tokio::test]
async fn a_pending_deletion_refuses_conflicting_work() {
    // Without a projector process nothing completes the deletion: it stays pending.
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let contact = app.create_contact(&json!({"email": "pending@example.com", "firstName": "P"})).await;
    let id = contact["id"].as_str().expect("id").to_owned();
    let deleted = delete(&app, "contacts", &id).await;
    assert_eq!(deleted.status, 200, "{:?}", deleted.body);
    let operation_id = deleted.body["data"]["operationId"].as_str().expect("operationId").to_owned();

    let again = delete(&app, "contacts", &id).await;
    assert_eq!((again.status, again.code().as_str()), (409, Some("record_deletion_pending")));
    let write = patch(&app, &id, &json!({"age": 3})).await;
    assert_eq!((write.status, write.code().as_str()), (409, Some("record_deletion_pending")));
    let upsert = app.post("/schemas/contacts/records/upsert", ALPHA_ADMIN, &json!({"id": id, "age": 3})).await;
    assert_eq!((upsert.status, upsert.code().as_str()), (409, Some("record_deletion_pending")));
    // The schema must match too: the same id under another schema is unknown there.
    assert_eq!(delete(&app, "leads", &id).await.code().as_str(), Some("record_not_found"));
    assert_eq!(delete(&app, "contacts", "con_missing").await.code().as_str(), Some("record_not_found"));
    assert_eq!(delete(&app, "nope", &id).await.code().as_str(), Some("schema_not_found"));
    // A member key may delete (write permission); another space cannot see the record.
    let other = app
        .send(app.request(reqwest::Method::DELETE, &format!("/schemas/contacts/records/{id}"), Some(MULTI_BETA)))
        .await;
    assert_eq!(other.status, 404);

    app.catch_up_once().await;
    let polled = app.get(&format!("/record-deletions/{operation_id}"), ALPHA_ADMIN).await;
    assert_eq!(polled.status, 200);
    assert_eq!(polled.body["data"]["status"], "pending");
    assert_eq!(app.get(&format!("/record-deletions/{operation_id}"), MULTI_BETA).await.status, 404);
    let unknown = app.get("/record-deletions/op_unknown", ALPHA_ADMIN).await;
    assert_eq!((unknown.status, unknown.code().as_str()), (404, Some("record_deletion_not_found")));
    // The identity was released with the request: a new contact may take the address.
    let fresh = app.post("/schemas/contacts/records", ALPHA_ADMIN, &json!({"email": "pending@example.com"})).await;
    assert_eq!(fresh.status, 201, "{:?}", fresh.body);
    assert_ne!(fresh.body["data"]["id"], id.as_str());
}

#[tokio::test]
async fn concurrent_deletes_start_exactly_one_operation() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let contact = app.create_contact(&json!({"email": "race-delete@example.com"})).await;
    let id = contact["id"].as_str().expect("id").to_owned();
    let attempts = (0..8).map(|_| delete(&app, "contacts", &id));
    let answers = futures_util::future::join_all(attempts).await;
    let started = answers.iter().filter(|answer| answer.status == 200).count();
    let refused = answers.iter().filter(|answer| answer.code().as_str() == Some("record_deletion_pending")).count();
    assert_eq!((started, refused), (1, 7), "{:?}", answers.iter().map(|a| &a.body).collect::<Vec<_>>());
    assert_eq!(app.query_i64("SELECT count(*) FROM record_deletions").await, 1);
}

#[tokio::test]
async fn a_stuck_projection_blocks_the_deletion_until_it_is_resolved() {
    // Long enough for the live read models to pass the deletion under a loaded suite, so the
    // reason names the abandoned version, not one that is only a moment behind.
    let app =
        TestApp::spawn_with(Options { erasure_blocked_after: Some(Duration::from_secs(2)), ..Options::default() })
            .await;
    let contact = app.create_contact(&json!({"email": "blocked@example.com"})).await;
    let id = contact["id"].as_str().expect("id").to_owned();
    // A rebuild that was abandoned at position 0: its version may still hold data.
    app.query_i64(
        "WITH stuck AS (INSERT INTO projections (name, version, position, status)
                        VALUES ('records', 99, 0, 'building') RETURNING 1) SELECT count(*) FROM stuck",
    )
    .await;
    let deleted = delete(&app, "contacts", &id).await;
    let operation_id = deleted.body["data"]["operationId"].as_str().expect("operationId").to_owned();
    let blocked = poll_until(&app, &operation_id, "blocked").await;
    let message = blocked["message"].as_str().expect("message");
    assert!(message.contains("records version 99"), "{message}");
    // The key is already destroyed; only the proof is outstanding.
    assert_eq!(app.query_i64(&format!("SELECT count(*) FROM subject_keys WHERE subject_id = '{id}'")).await, 0);
    let erased_once = "SELECT count(*) FROM record_deletions WHERE erased_at IS NOT NULL AND position IS NOT NULL";
    assert_eq!(app.query_i64(erased_once).await, 1, "step 1 is recorded, so it is not repeated while waiting");
    // Reconciliation: the abandoned version is dropped, and the deletion completes by itself.
    app.query_i64("WITH gone AS (DELETE FROM projections WHERE version = 99 RETURNING 1) SELECT count(*) FROM gone")
        .await;
    poll_until(&app, &operation_id, "completed").await;
}

#[tokio::test]
async fn replaying_the_log_after_erasure_rebuilds_the_same_read_models() {
    let app = TestApp::spawn().await;
    let kept = app.create_contact(&json!({"email": "kept@example.com", "firstName": "Kept"})).await;
    let erased = app.create_contact(&json!({"email": "erased@example.com", "firstName": "Gone"})).await;
    let erased_id = erased["id"].as_str().expect("id").to_owned();
    assert_eq!(patch(&app, &erased_id, &json!({"age": 9})).await.status, 200);
    let deleted = delete(&app, "contacts", &erased_id).await;
    let operation_id = deleted.body["data"]["operationId"].as_str().expect("operationId").to_owned();
    poll_until(&app, &operation_id, "completed").await;
    app.wait_for_projections().await;

    async fn snapshot(app: &TestApp, projection: &str, sql: &str) -> Vec<String> {
        let client = app.pool.get().await.expect("client");
        let version: i32 = client
            .query_one("SELECT version FROM projections WHERE name = $1 AND status = 'live'", &[&projection])
            .await
            .expect("live version")
            .get(0);
        let sql = sql.replace("{s}", &format!("rm_{projection}_v{version}"));
        client.query(&sql, &[]).await.expect("snapshot").iter().map(|row| row.get::<_, String>(0)).collect()
    }
    let records = "SELECT record_id || ' ' || doc::text FROM {s}.records ORDER BY record_id";
    let counts = "SELECT space_id || schema_id || total FROM {s}.record_counts ORDER BY 1";
    let deletions = "SELECT operation_id || status || message || record_id FROM {s}.deletions ORDER BY 1";
    let before = (
        snapshot(&app, "records", records).await,
        snapshot(&app, "records", counts).await,
        snapshot(&app, "deletions", deletions).await,
    );
    assert!(before.0.iter().any(|row| row.contains(kept["id"].as_str().expect("id"))));
    assert!(!before.0.iter().any(|row| row.contains(&erased_id)));
    for model in [read_model("records"), read_model("deletions")] {
        projector::read_models::rebuild::rebuild(&app.pool, model, |_| {}).await.expect("rebuild");
    }
    let after = (
        snapshot(&app, "records", records).await,
        snapshot(&app, "records", counts).await,
        snapshot(&app, "deletions", deletions).await,
    );
    assert_eq!(before, after, "a replay after erasure yields the same read models");
}
