//! Backups that restore: `scripts/backup` (pg_dump) of a running system, `scripts/restore`
//! into a fresh PostgreSQL cluster, and the restored system serves the same records, events,
//! suppressions and audit trails, takes new writes, and still cannot read an erased subject.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::*;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn script(name: &str, args: &[&str]) {
    let output = Command::new("bash").arg(format!("{ROOT}/scripts/{name}")).args(args).output().expect("runs");
    assert!(output.status.success(), "scripts/{name}: {}", String::from_utf8_lossy(&output.stderr));
}

/// What a client reads of the system: the same requests against either deployment.
async fn reads(app: &TestApp, query_url: &str, kept: &str) -> Vec<(String, u16, Value)> {
    let mut seen = Vec::new();
    for path in [
        "/schemas/contacts/records?limit=100".to_owned(),
        format!("/schemas/contacts/records/{kept}"),
        format!("/schemas/contacts/records/{kept}/audit-trail"),
        "/events?schema=signup&limit=100".to_owned(),
        "/contacts/suppressions?limit=100".to_owned(),
        "/webhooks".to_owned(),
    ] {
        let response = app.http.get(format!("{query_url}{path}")).bearer_auth(ALPHA_ADMIN).send().await.expect("sent");
        let status = response.status().as_u16();
        seen.push((path, status, response.json().await.expect("JSON")));
    }
    seen
}

#[tokio::test]
async fn a_backup_restored_into_a_fresh_cluster_serves_the_same_data_and_keeps_erasures() {
    let app = TestApp::spawn().await;
    let kept = app.create_contact(&json!({"email": "kept@backup.io", "firstName": "Kept", "plan": "pro"})).await;
    let kept = kept["id"].as_str().expect("id").to_owned();
    let erased = app.create_contact(&json!({"email": "erased-subject@backup.io", "firstName": "Zenobia"})).await;
    let erased = erased["id"].as_str().expect("id").to_owned();
    let patched = app
        .send(
            app.request(reqwest::Method::PATCH, &format!("/schemas/contacts/records/{kept}"), Some(ALPHA_ADMIN))
                .json(&json!({"plan": "free"})),
        )
        .await;
    assert_eq!(patched.status, 200);
    let suppressed = app
        .post("/contacts/suppressions", ALPHA_ADMIN, &json!({"identifier": "kept@backup.io", "reason": "manual"}))
        .await;
    assert_eq!(suppressed.status, 201, "{:?}", suppressed.body);
    for plan in ["pro", "free"] {
        assert_eq!(app.post("/events/signup", ALPHA_ADMIN, &json!({"plan": plan})).await.status, 202);
    }
    let deletion = app
        .send(app.request(reqwest::Method::DELETE, &format!("/schemas/contacts/records/{erased}"), Some(ALPHA_ADMIN)))
        .await;
    let operation = deletion.body["data"]["operationId"].as_str().expect("operation").to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    while app.get(&format!("/record-deletions/{operation}"), ALPHA_ADMIN).await.body["data"]["status"] != "completed" {
        assert!(Instant::now() < deadline, "the erasure completed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.wait_for_workers().await;
    let before = reads(&app, &app.query_url, &kept).await;
    assert!(before.iter().all(|(_, status, _)| *status == 200), "{before:?}");
    assert_eq!(before[0].2["pagination"]["totalCount"], 1, "the erased contact is gone: {:?}", before[0].2);
    assert!(before[2].2["data"].as_array().is_some_and(|trail| !trail.is_empty()), "a trail: {:?}", before[2].2);
    assert_eq!(before[3].2["data"].as_array().map(Vec::len), Some(2), "two ready events: {:?}", before[3].2);

    // Back up the running system, restore into a fresh cluster.
    let file = scratch_dir("backup").join("platform.dump");
    let file = file.to_str().expect("UTF-8").to_owned();
    script("backup", &[&app.database_url, &file]);
    let cluster = PrivateCluster::start();
    let admin = cluster.url("postgres");
    let (client, connection) = tokio_postgres::connect(&admin, tokio_postgres::NoTls).await.expect("the fresh cluster");
    tokio::spawn(connection);
    client.batch_execute("CREATE DATABASE restored").await.expect("an empty database");
    let restored_url = cluster.url("restored");
    script("restore", &[&file, &restored_url]);

    // The restored system, under the same master key, reads as the original did.
    let settings = platform::settings::Settings {
        rate_limits: unlimited(),
        ..platform::settings::Settings::for_database(&restored_url)
    };
    let query = query_service::Application::build(settings.clone()).await.expect("query service");
    let query_url = format!("http://127.0.0.1:{}/v1", query.port());
    tokio::spawn(query.run_until_stopped());
    let after = reads(&app, &query_url, &kept).await;
    assert_eq!(after, before, "the restored system serves the same data");
    let gone = app.http.get(format!("{query_url}/schemas/contacts/records/{erased}")).bearer_auth(ALPHA_ADMIN);
    assert_eq!(gone.send().await.expect("sent").status(), 404, "the erased subject stays erased");
    // Nowhere in the restored database is the erased subject in clear.
    let pg_dump = std::env::var("PG_BIN").map_or_else(|_| "pg_dump".into(), |bin| format!("{bin}/pg_dump"));
    let dump = Command::new(pg_dump).arg("--data-only").arg(format!("--dbname={restored_url}")).output().expect("dump");
    let dump = String::from_utf8_lossy(&dump.stdout).to_lowercase();
    assert!(dump.contains("kept@backup.io"), "the live contact's read model rows are in the dump");
    for needle in ["erased-subject@backup.io", "zenobia"] {
        assert!(!dump.contains(needle), "{needle} is in the restored database");
    }

    // And it takes writes: a command service on it creates a contact the query service reads.
    let command = command_service::Application::build(settings).await.expect("command service");
    let command_url = format!("http://127.0.0.1:{}/v1", command.port());
    tokio::spawn(command.run_until_stopped());
    let created = app
        .http
        .post(format!("{command_url}/schemas/contacts/records"))
        .bearer_auth(ALPHA_ADMIN)
        .json(&json!({"email": "after-restore@backup.io"}))
        .send()
        .await
        .expect("sent");
    assert_eq!(created.status(), 201);
    let token = created.headers().get("consistency-token").and_then(|v| v.to_str().ok()).expect("token").to_owned();
    let _projector = spawn_binary("projector", &["run"], &restored_url, &[]);
    let listed = app
        .http
        .get(format!("{query_url}/schemas/contacts/records?limit=100"))
        .bearer_auth(ALPHA_ADMIN)
        .header("Consistency-Token", token)
        .send()
        .await
        .expect("sent");
    let listed: Value = listed.json().await.expect("JSON");
    assert_eq!(listed["pagination"]["totalCount"], 2, "{listed}");
    drop(cluster);
}
