//! Authoring through the log: idempotent apply, revisions, generated keys.

use crate::helpers::*;

#[tokio::test]
async fn applying_the_same_file_again_changes_nothing() {
    let app = TestApp::spawn().await;
    let head = app.query_i64("SELECT position FROM log_head").await;
    let again = app.apply_workspace(WORKSPACE, true).await;
    assert_eq!(again.events, 0);
    assert_eq!(app.query_i64("SELECT position FROM log_head").await, head);
}

#[tokio::test]
async fn a_changed_schema_appends_one_revision() {
    let app = TestApp::spawn().await;
    let before = app.get("/schemas/leads/attributes", ALPHA_ADMIN).await;
    assert_eq!(before.body["pagination"]["totalCount"], 8);
    let changed = WORKSPACE.replace(
        r#"{ "key": "company", "definition": { "type": "string", "required": true } }"#,
        r#"{ "key": "company", "definition": { "type": "string", "required": true } },
            { "key": "budget", "definition": { "type": "number" } }"#,
    );
    let report = app.apply_workspace(&changed, true).await;
    assert_eq!(report.events, 1);
    let after = app.get("/schemas/leads/attributes", ALPHA_ADMIN).await;
    assert_eq!(after.body["pagination"]["totalCount"], 9);
    assert_eq!(app.query_i64("SELECT count(*) FROM rm_catalog_v1.schema_counts WHERE schema_type = 'contact' AND space_id = (SELECT space_id FROM rm_catalog_v1.spaces WHERE slug = 'alpha')").await, 1);
    assert_eq!(
        app.get("/schemas?type=contact", ALPHA_ADMIN).await.body["pagination"]["totalCount"],
        2,
        "a revision is not a new schema"
    );
    assert_eq!(app.apply_workspace(&changed, true).await.events, 0);
}

#[tokio::test]
async fn a_key_without_a_secret_is_generated_once_and_stored_only_as_a_hash() {
    let app = TestApp::spawn().await;
    let with_new_key = WORKSPACE.replace(
        r#""apiKeys": [{ "name": "alpha member", "space": "alpha", "secret": "sk_test_alpha_member_0000000000004" }]"#,
        r#""apiKeys": [{ "name": "alpha member", "space": "alpha", "secret": "sk_test_alpha_member_0000000000004" },
                       { "name": "generated", "space": "alpha" }]"#,
    );
    assert_ne!(with_new_key, WORKSPACE);
    let report = app.apply_workspace(&with_new_key, true).await;
    assert_eq!(report.generated_keys.len(), 1);
    let secret = report.generated_keys[0].2.clone();
    assert!(secret.starts_with("sk_"));
    let me = app.get("/me", &secret).await;
    assert_eq!(me.status, 200);
    assert_eq!(me.body["data"]["apiKey"]["name"], "generated");
    let again = app.apply_workspace(&with_new_key, true).await;
    assert!(again.generated_keys.is_empty() && again.events == 0);
    let dump_hits = app
        .query_i64(&format!(
            "SELECT count(*) FROM events WHERE position(convert_to('{secret}', 'UTF8') in payload) > 0"
        ))
        .await;
    assert_eq!(dump_hits, 0, "the secret is never stored");
}

#[tokio::test]
async fn the_demo_workspace_applies_and_its_key_works() {
    let app = TestApp::spawn().await;
    let demo = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/demo-workspace.json"))
        .expect("demo file");
    let report = app.apply_workspace(&demo, true).await;
    assert!(report.events > 5);
    let me = app.get("/me", "sk_demo_0123456789abcdefghijklmnop").await;
    assert_eq!(me.status, 200);
    assert_eq!(me.body["data"]["space"]["slug"], "demo");
    assert_eq!(app.query_i64("SELECT count(*) FROM rm_catalog_v1.resources WHERE kind = 'template'").await, 4);
}
