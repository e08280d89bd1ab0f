//! `POST /event-identities`: binding anonymous identities to contacts.

use serde_json::{Value, json};

use crate::helpers::*;

async fn contacts_schema_id(app: &TestApp) -> String {
    let schema = app.get("/schemas/contacts", ALPHA_ADMIN).await;
    schema.body["data"]["id"].as_str().expect("schema id").to_owned()
}

fn change(schema_id: &str, contact: Value, revision: &str) -> Value {
    json!({
        "sourceId": "src_web",
        "subjectSchemaId": schema_id,
        "anonymousId": "browser-1",
        "contactId": contact,
        "operationId": uuid::Uuid::new_v4().to_string(),
        "expectedAliasRevision": revision,
    })
}

#[tokio::test]
async fn an_alias_is_bound_rebound_and_removed_by_revision() {
    let app = TestApp::spawn().await;
    let schema_id = contacts_schema_id(&app).await;
    let ada = app.create_contact(&json!({"email": "ada@example.com"})).await["id"].as_str().expect("id").to_owned();
    let bob = app.create_contact(&json!({"email": "bob@example.com"})).await["id"].as_str().expect("id").to_owned();

    let bind = change(&schema_id, json!(ada), "0");
    let bound = app.post("/event-identities", ALPHA_ADMIN, &bind).await;
    assert_eq!(bound.status, 200, "{:?}", bound.body);
    assert_eq!(bound.body["data"], json!({"identityRevision": "1", "affectedSubjectIds": [ada], "isDuplicate": false}));

    // The same operationId and body replays; a changed body under it is refused.
    let replay = app.post("/event-identities", ALPHA_ADMIN, &bind).await;
    assert_eq!(replay.body["data"]["isDuplicate"], true);
    assert_eq!(replay.body["data"]["identityRevision"], "1");
    let mut changed = bind.clone();
    changed["contactId"] = json!(bob);
    let reused = app.post("/event-identities", ALPHA_ADMIN, &changed).await;
    assert_eq!((reused.status, reused.code().as_str()), (409, Some("operation_id_conflict")));

    // A stale revision conflicts; the current one rebinds.
    let stale = app.post("/event-identities", ALPHA_ADMIN, &change(&schema_id, json!(bob), "0")).await;
    assert_eq!((stale.status, stale.code().as_str()), (409, Some("alias_revision_conflict")));
    let rebound = app.post("/event-identities", ALPHA_ADMIN, &change(&schema_id, json!(bob), "1")).await;
    assert_eq!(rebound.status, 200, "{:?}", rebound.body);
    assert_eq!(rebound.body["data"]["identityRevision"], "2");
    assert_eq!(rebound.body["data"]["affectedSubjectIds"], json!([ada, bob]));
    let removed = app.post("/event-identities", ALPHA_ADMIN, &change(&schema_id, Value::Null, "2")).await;
    assert_eq!(
        removed.body["data"],
        json!({"identityRevision": "3", "affectedSubjectIds": [bob], "isDuplicate": false})
    );

    // Each revision is an event on the alias's own stream; the anonymous id is not stored.
    assert_eq!(app.query_i64("SELECT count(*) FROM events WHERE event_type = 'EventIdentityChanged.v1'").await, 3);
    assert_eq!(app.query_i64("SELECT max(stream_version) FROM events WHERE stream_id LIKE 'alias/%'").await, 3);
    let dump = app
        .query_i64("SELECT count(*) FROM events WHERE position(convert_to('browser-1', 'UTF8') in payload) > 0")
        .await;
    assert_eq!(dump, 0);
}

#[tokio::test]
async fn identity_changes_are_refused_with_their_codes() {
    let app = TestApp::spawn().await;
    let schema_id = contacts_schema_id(&app).await;
    let ada = app.create_contact(&json!({"email": "ada@example.com"})).await["id"].as_str().expect("id").to_owned();
    let leads = app.get("/schemas/leads", ALPHA_ADMIN).await.body["data"]["id"].as_str().expect("id").to_owned();
    let lead =
        app.post("/schemas/leads/records", ALPHA_ADMIN, &json!({"email": "l@example.com", "company": "X"})).await;
    let lead_id = lead.body["data"]["id"].as_str().expect("lead").to_owned();

    let mut disabled = change(&schema_id, json!(ada), "0");
    disabled["sourceId"] = json!("src_app");
    let mut unknown_source = change(&schema_id, json!(ada), "0");
    unknown_source["sourceId"] = json!("src_nope");
    let slug = change("contacts", json!(ada), "0");
    let other_schema = change(&leads, json!(lead_id), "0");
    for body in [disabled, unknown_source, slug, other_schema] {
        let response = app.post("/event-identities", ALPHA_ADMIN, &body).await;
        assert_eq!((response.status, response.code().as_str()), (403, Some("identity_source_unavailable")), "{body:?}");
    }
    let missing = app.post("/event-identities", ALPHA_ADMIN, &change(&schema_id, json!("con_missing"), "0")).await;
    assert_eq!((missing.status, missing.code().as_str()), (404, Some("record_not_found")));
    let wrong_kind = app.post("/event-identities", ALPHA_ADMIN, &change(&schema_id, json!(lead_id), "0")).await;
    assert_eq!(wrong_kind.status, 404, "a contact of another schema");
    let mut extra = change(&schema_id, json!(ada), "0");
    extra["note"] = json!("x");
    let unknown_field = app.post("/event-identities", ALPHA_ADMIN, &extra).await;
    assert_eq!((unknown_field.status, unknown_field.code().as_str()), (400, Some("invalid_identity_change")));
    assert_eq!(unknown_field.body["error"]["issues"][0]["key"], "note");
    // Blank as the document's `\S` pattern means it: only white space is refused; U+0085,
    // which Rust's trim() removes but ECMAScript's \s does not match, is a (here unknown) value.
    let mut blank = change(&schema_id, json!(ada), "0");
    blank["anonymousId"] = json!(" \u{feff}\t");
    let refused = app.post("/event-identities", ALPHA_ADMIN, &blank).await;
    assert_eq!((refused.status, refused.code().as_str()), (400, Some("invalid_identity_change")));
    let mut next_line = change(&schema_id, json!(ada), "0");
    next_line["sourceId"] = json!("\u{85}");
    let unknown = app.post("/event-identities", ALPHA_ADMIN, &next_line).await;
    assert_eq!(
        (unknown.status, unknown.code().as_str()),
        (403, Some("identity_source_unavailable")),
        "{:?}",
        unknown.body
    );
    let read_only = app.post("/event-identities", ALPHA_NON_PAID_ADMIN, &change(&schema_id, json!(ada), "0")).await;
    assert_eq!(read_only.status, 403);
    let beta = app.post("/event-identities", MULTI_BETA, &change(&schema_id, json!(ada), "0")).await;
    assert_eq!(beta.status, 403, "beta has no such source");
    assert_eq!(app.query_i64("SELECT count(*) FROM events WHERE event_type = 'EventIdentityChanged.v1'").await, 0);
}

#[tokio::test]
async fn an_alias_of_an_erased_contact_is_erased() {
    let app = TestApp::spawn().await;
    let schema_id = contacts_schema_id(&app).await;
    let ada = app.create_contact(&json!({"email": "ada@example.com"})).await["id"].as_str().expect("id").to_owned();
    let bound = app.post("/event-identities", ALPHA_ADMIN, &change(&schema_id, json!(ada), "0")).await;
    assert_eq!(bound.status, 200);
    let deleted = app
        .send(app.request(reqwest::Method::DELETE, &format!("/schemas/contacts/records/{ada}"), Some(ALPHA_ADMIN)))
        .await;
    assert_eq!(deleted.status, 200);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while app.query_i64("SELECT count(*) FROM identity_aliases WHERE erased").await == 0 {
        assert!(std::time::Instant::now() < deadline, "the eraser did not erase the alias");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let later = app.post("/event-identities", ALPHA_ADMIN, &change(&schema_id, Value::Null, "1")).await;
    assert_eq!((later.status, later.code().as_str()), (409, Some("alias_erased")));
}

#[tokio::test]
async fn identity_capacity_is_limited_per_space() {
    let app = TestApp::spawn().await;
    let schema_id = contacts_schema_id(&app).await;
    let ada = app.create_contact(&json!({"email": "ada@example.com"})).await["id"].as_str().expect("id").to_owned();
    // Capacity is configuration; a second instance with a tiny capacity shares the counts.
    let mut settings = platform::settings::Settings::for_database(&app.database_url);
    settings.rate_limits = unlimited();
    settings.identity = platform::settings::IdentityCapacity { aliases: 2, changes: 3 };
    let small = command_service::Application::build(settings).await.expect("instance");
    let url = format!("http://127.0.0.1:{}/v1/event-identities", small.port());
    tokio::spawn(small.run_until_stopped());
    let post = |body: Value| app.send(app.http.post(&url).bearer_auth(ALPHA_ADMIN).json(&body));
    let mut first = change(&schema_id, json!(ada), "0");
    assert_eq!(post(first.clone()).await.status, 200);
    first["anonymousId"] = json!("browser-2");
    first["operationId"] = json!(uuid::Uuid::new_v4().to_string());
    assert_eq!(post(first.clone()).await.status, 200);
    let mut third = first.clone();
    third["anonymousId"] = json!("browser-3");
    third["operationId"] = json!(uuid::Uuid::new_v4().to_string());
    let over_aliases = post(third).await;
    assert_eq!((over_aliases.status, over_aliases.code().as_str()), (429, Some("identity_capacity_exhausted")));
    // A change of an existing alias needs no new alias, only a change.
    let mut again = first.clone();
    again["operationId"] = json!(uuid::Uuid::new_v4().to_string());
    again["expectedAliasRevision"] = json!("1");
    again["contactId"] = Value::Null;
    assert_eq!(post(again.clone()).await.status, 200);
    again["operationId"] = json!(uuid::Uuid::new_v4().to_string());
    again["expectedAliasRevision"] = json!("2");
    let over_changes = post(again).await;
    assert_eq!((over_changes.status, over_changes.code().as_str()), (429, Some("identity_capacity_exhausted")));
}
