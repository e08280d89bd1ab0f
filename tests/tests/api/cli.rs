//! The operator CLI as a user runs it after the quick start: the `platform` binary's
//! `status`, `apply --dry-run` and `apply` against a running single node started as a real
//! process (`platform serve`), and live authoring: a workflow the apply adds takes runs
//! through the API of that same process, with no restart.

use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::*;
use crate::log::wait_until_listening;

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

async fn log_head(database_url: &str) -> i64 {
    let (client, connection) = tokio_postgres::connect(database_url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    client.query_one("SELECT position FROM log_head", &[]).await.expect("log head").get(0)
}

/// The fixture workspace with a workflow added to the alpha space: an incoming webhook, a
/// one-second wait, then the end of the run (`completed`).
fn workspace_with_a_new_workflow() -> String {
    let fixture = include_str!("../../fixtures/workspace.json");
    let mut workspace: Value = serde_json::from_str(fixture).expect("the fixture is JSON");
    let spaces = workspace["spaces"].as_array_mut().expect("spaces");
    let alpha = spaces.iter_mut().find(|space| space["slug"] == "alpha").expect("the alpha space");
    alpha["workflows"] = json!([{
        "slug": "live-greeter", "name": "Live greeter", "contactSchema": "contacts",
        "steps": [
            {"id": "start", "type": "incoming_webhook", "referenceId": "live-greeter-hook", "next": "pause"},
            {"id": "pause", "type": "wait", "duration": "1s", "next": null}
        ]
    }]);
    workspace.to_string()
}

#[tokio::test]
async fn the_platform_cli_reports_plans_and_applies_a_workflow_a_running_node_serves_without_a_restart() {
    let database_url = create_database().await;
    let port = free_port();
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/workspace.json");
    let mut node = spawn_binary(
        "platform",
        &["serve", "--workspace", fixture],
        &database_url,
        &[("APP__HTTP__PORT", port.to_string())],
    );
    let base = format!("http://127.0.0.1:{port}/v1");
    let http = reqwest::Client::new();
    wait_until_listening(&http, &base).await;

    // status: the running node's read models and workers, and its own report of them; it
    // exits 0 once the node has caught up with the workspace it applied at start.
    let origin = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (status, status_text) = loop {
        let status = run_binary("platform", &["status", "--process", &origin], &database_url);
        let status_text = text(&status);
        if status.status.success() || Instant::now() > deadline {
            break (status, status_text);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(status.status.success(), "platform status reports problems:\n{status_text}");
    for expected in ["workers (name, lag, health):", "workflow_events", "catalog", "ready true"] {
        assert!(status_text.contains(expected), "status names {expected:?}:\n{status_text}");
    }

    // The workflow is not there yet.
    let trigger = format!("{base}/workflows/live-greeter-hook");
    let missing = http.post(&trigger).bearer_auth(ALPHA_ADMIN).json(&json!({})).send().await.expect("trigger");
    assert_eq!(missing.status().as_u16(), 404, "no such workflow before the apply");

    let file = std::env::temp_dir().join(format!("cli-workspace-{}.json", uuid::Uuid::now_v7().simple()));
    std::fs::write(&file, workspace_with_a_new_workflow()).expect("write the workspace file");
    let file_arg = file.to_str().expect("a UTF-8 path");

    // apply --dry-run: names the new workflow, writes nothing.
    let head_before = log_head(&database_url).await;
    let dry_run = run_binary("platform", &["apply", file_arg, "--dry-run"], &database_url);
    let dry_run_text = text(&dry_run);
    assert!(dry_run.status.success(), "dry run failed:\n{dry_run_text}");
    assert!(dry_run_text.contains("live-greeter-hook"), "the plan names the new workflow:\n{dry_run_text}");
    assert!(dry_run_text.contains("nothing was written"), "{dry_run_text}");
    assert_eq!(log_head(&database_url).await, head_before, "a dry run appends nothing");

    // apply, live: the running node follows it.
    let applied = run_binary("platform", &["apply", file_arg, "--wait"], &database_url);
    let applied_text = text(&applied);
    assert!(applied.status.success(), "apply failed:\n{applied_text}");
    assert!(applied_text.contains("applied 1 events"), "{applied_text}");
    assert!(log_head(&database_url).await > head_before, "the apply appended");
    let _ = std::fs::remove_file(&file);

    let started = http.post(&trigger).bearer_auth(ALPHA_ADMIN).json(&json!({})).send().await.expect("trigger");
    assert_eq!(started.status().as_u16(), 202, "the new workflow takes runs without a restart");
    let body: Value = started.json().await.expect("json");
    let workflow_id = body["data"]["workflowId"].as_str().expect("workflow id").to_owned();
    let run_id = body["data"]["id"].as_str().expect("run id").to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    let run = loop {
        let response = http
            .get(format!("{base}/workflows/{workflow_id}/runs/{run_id}"))
            .bearer_auth(ALPHA_ADMIN)
            .send()
            .await
            .expect("run");
        assert_eq!(response.status().as_u16(), 200);
        let run: Value = response.json().await.expect("json");
        if run["data"]["status"] == "completed" {
            break run["data"].clone();
        }
        assert!(Instant::now() < deadline, "the run did not complete: {run}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let steps: Vec<&str> = run["history"]
        .as_array()
        .expect("history")
        .iter()
        .map(|record| record["stepId"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(steps, ["start", "pause"], "{run}");
    assert!(node.0.try_wait().expect("the node's state").is_none(), "the same node served it all, never restarted");
}

/// Output an operator reads must not carry what the file keeps secret.
fn assert_shows_no_secret(output: &str, file_secrets: &[&str]) {
    for secret in file_secrets {
        assert!(!output.contains(secret), "the output shows a secret of the file:\n{output}");
    }
    for material in ["-----BEGIN", "PRIVATE KEY", "Ciphertext(", "Sealed {", "whsec_"] {
        let shown = output.lines().any(|line| line.contains(material) && !line.contains(" signs with whsec_"));
        assert!(!shown, "the output shows key material ({material}):\n{output}");
    }
    // Fields holding secrets are named, their values not shown.
    for field in ["wrappedKey", "privateKey", "ciphertext", "signing\"", "key_hash", "personal", "secret:"] {
        for line in output.lines().filter(|line| line.contains(field)) {
            assert!(line.contains("(not shown)") || line.contains("(changed)"), "{field} is shown: {line}\n{output}");
        }
    }
    // A byte array as a debug dump prints one small number per line.
    let numbers = output.lines().filter(|line| line.trim().trim_end_matches(',').parse::<u8>().is_ok()).count();
    assert!(numbers < 4, "the output dumps bytes:\n{output}");
    let data_dir = std::env::current_dir().expect("the working directory").join("data");
    assert!(!output.contains(&data_dir.display().to_string()), "the output names a server path:\n{output}");
}

#[tokio::test]
async fn apply_names_what_it_touches_by_kind_slug_and_id_and_shows_no_secret() {
    let database_url = create_database().await;
    let mut workspace: Value = serde_json::from_str(&crate::email::mail_workspace(100)).expect("JSON");
    let mail = |workspace: &mut Value| {
        let spaces = workspace["spaces"].as_array_mut().expect("spaces");
        spaces.iter_mut().find(|space| space["slug"] == "mail").expect("the mail space").clone()
    };
    let mut space = mail(&mut workspace);
    space["webhooks"] = json!([{"id": "wh_cli", "url": "https://hooks.example.com/in", "trigger": "contact upserted",
        "schema": "people", "integrationVendorName": "Acme"}]);
    let write = |workspace: &Value, space: &Value| {
        let mut workspace = workspace.clone();
        let spaces = workspace["spaces"].as_array_mut().expect("spaces");
        *spaces.iter_mut().find(|other| other["slug"] == "mail").expect("the mail space") = space.clone();
        let file = std::env::temp_dir().join(format!("cli-secrets-{}.json", uuid::Uuid::now_v7().simple()));
        std::fs::write(&file, workspace.to_string()).expect("the workspace file");
        file
    };
    let secrets = [crate::email::MAIL_KEY, "MIIE"];
    let file = write(&workspace, &space);
    let file_arg = file.to_str().expect("UTF-8");

    // The dry run names every resource it would create, with its id, and shows no secret.
    let dry_run = run_binary("platform", &["apply", file_arg, "--dry-run"], &database_url);
    let dry_text = text(&dry_run);
    assert!(dry_run.status.success(), "{dry_text}");
    for line in [
        &format!("would create form \"signup\": {}", crate::email::SIGNUP_FORM),
        "would create webhook: wh_cli",
        "would create template \"newsletter\": tpl_",
        "would create domain \"main\": dom_",
        "would create api key \"mail admin\": key_",
    ] {
        assert!(dry_text.contains(line), "the dry run names {line:?}:\n{dry_text}");
    }
    assert!(dry_text.contains("privateKey\": \"(not shown)\""), "the DKIM key is named, not shown:\n{dry_text}");
    assert!(dry_text.contains(r#""secret": "(not shown)""#), "the webhook's secret is named, not shown:\n{dry_text}");
    assert_shows_no_secret(&dry_text, &secrets);

    // The apply names them too; its only secret is the webhook's, generated and shown once.
    let applied = run_binary("platform", &["apply", file_arg], &database_url);
    let applied_text = text(&applied);
    assert!(applied.status.success(), "{applied_text}");
    assert!(
        applied_text.contains(&format!("created form \"signup\": {}", crate::email::SIGNUP_FORM)),
        "{applied_text}"
    );
    assert!(applied_text.contains("webhook wh_cli of Acme signs with whsec_"), "{applied_text}");
    assert_shows_no_secret(&applied_text, &secrets);
    let _ = std::fs::remove_file(&file);

    // A changed URL and a changed key: the diff names the fields, a secret only as changed.
    space["webhooks"][0]["url"] = json!("https://hooks.example.com/moved");
    let mut changed = workspace.clone();
    let users = changed["users"].as_array_mut().expect("users");
    let admin = users.iter_mut().find(|user| user["email"] == "admin@mail.test").expect("the mail admin");
    admin["apiKeys"][0]["secret"] = json!("sk_test_mail_admin_rotated_00000009");
    let file = write(&changed, &space);
    let dry_run = run_binary("platform", &["apply", file.to_str().expect("UTF-8"), "--dry-run"], &database_url);
    let _ = std::fs::remove_file(&file);
    let dry_text = text(&dry_run);
    assert!(dry_run.status.success(), "{dry_text}");
    assert!(dry_text.contains("would change webhook: wh_cli"), "{dry_text}");
    assert!(dry_text.lines().any(|line| line.starts_with('+') && line.contains("/moved")), "{dry_text}");
    assert!(dry_text.contains("would change api key \"mail admin\": key_"), "{dry_text}");
    let changed_hash = dry_text.lines().any(|line| line.starts_with('+') && line.contains(r#""keyHash": "(changed)""#));
    assert!(changed_hash, "the key's hash is named as changed:\n{dry_text}");
    assert_shows_no_secret(&dry_text, &[crate::email::MAIL_KEY, "sk_test_mail_admin_rotated_00000009", "MIIE"]);
}
