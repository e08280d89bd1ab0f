//! The Segment-compatible ingest (`POST /v1/batch` and the single-message paths), driven over
//! real HTTP as Segment's clients drive it: write keys (HTTP Basic or `writeKey`), gzip bodies,
//! the limits, what each message type writes, the failures list, and a batch sent again.

use std::io::Write;

use base64::Engine;
use serde_json::{Value, json};

use crate::helpers::{ALPHA_ADMIN, TestApp, TestResponse, WORKSPACE};

/// Alpha's write key in [`ingest_workspace`].
pub(crate) const WRITE_KEY: &str = "wk_test_alpha_website_000000000001";
/// A second secret of the same write key (a rotation under way).
const ROTATED_KEY: &str = "wk_test_alpha_website_rotated_0002";

/// The test workspace with a write key in alpha: its contacts (with a `companyId` a group
/// sets), `Order Completed` recorded as a purchase, pages under a `page` event schema, groups
/// as companies.
pub(crate) fn ingest_workspace() -> String {
    let mut workspace: Value = serde_json::from_str(WORKSPACE).expect("the workspace is JSON");
    let spaces = workspace["spaces"].as_array_mut().expect("spaces");
    let alpha = spaces.iter_mut().find(|space| space["slug"] == "alpha").expect("alpha");
    let schemas = alpha["schemas"].as_array_mut().expect("schemas");
    let contacts = schemas.iter_mut().find(|schema| schema["slug"] == "contacts").expect("contacts");
    contacts["attributes"]
        .as_array_mut()
        .expect("attributes")
        .push(json!({"key": "companyId", "definition": {"type": "string"}}));
    schemas.push(json!({"slug": "page", "name": "Page viewed", "type": "event", "attributes": [
        {"key": "name", "definition": {"type": "string"}},
        {"key": "url", "definition": {"type": "string"}},
        {"key": "path", "definition": {"type": "string"}},
        {"key": "referrer", "definition": {"type": "string"}}
    ]}));
    alpha["writeKeys"] = json!([{
        "slug": "website", "name": "Website", "secrets": [WRITE_KEY, ROTATED_KEY],
        "contactSchema": "contacts", "events": {"Order Completed": "purchase"},
        "group": {"schema": "companies", "contactAttribute": "companyId"}
    }]);
    workspace.to_string()
}

pub(crate) async fn ingest_app() -> TestApp {
    let app = TestApp::spawn().await;
    app.apply_workspace(&ingest_workspace(), true).await;
    app
}

/// `POST /v1/{path}` with `body`, the write key sent as Segment's clients send it.
pub(crate) async fn ingest(app: &TestApp, path: &str, key: &str, body: &Value) -> TestResponse {
    let request = app.request(reqwest::Method::POST, path, None).basic_auth(key, Some("")).json(body);
    app.send(request).await
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).expect("compressed");
    encoder.finish().expect("finished")
}

/// The contacts of alpha holding `user_id`.
async fn contacts_of(app: &TestApp, query: &str) -> Vec<Value> {
    app.wait_for_projections().await;
    let listed = app.get(&format!("/schemas/contacts/records?{query}"), ALPHA_ADMIN).await;
    assert_eq!(listed.status, 200, "{:?}", listed.body);
    listed.body["data"].as_array().cloned().unwrap_or_default()
}

/// The ready events of event schema `schema` in alpha (the last 7 days).
async fn events_of(app: &TestApp, schema: &str) -> Vec<Value> {
    // The list holds ready events: an event is ready once the preparation worker has appended
    // its change, after the append that accepted it.
    app.wait_for_workers().await;
    let listed = app.get(&format!("/events?schema={schema}&limit=200"), ALPHA_ADMIN).await;
    assert_eq!(listed.status, 200, "{:?}", listed.body);
    listed.body["data"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn identify_track_page_group_and_alias_write_one_contact_found_by_either_id() {
    let app = ingest_app().await;
    // A visitor, known only by the browser's anonymous id: a page view and a track create them.
    let visit = ingest(
        &app,
        "/page",
        WRITE_KEY,
        &json!({"anonymousId": "anon-1", "messageId": "m-page", "name": "Pricing",
                "properties": {"url": "https://example.com/pricing", "path": "/pricing", "utm": "spring"}}),
    )
    .await;
    assert_eq!(visit.status, 200, "{:?}", visit.body);
    assert_eq!(visit.body["success"], true);
    assert_eq!(visit.body["data"]["applied"], 1, "{:?}", visit.body);
    let batch = json!({"batch": [
        {"type": "track", "anonymousId": "anon-1", "messageId": "m-track-1", "event": "Order Completed",
         "timestamp": "2026-12-01T10:00:00.000Z", "properties": {"amount": 42.5, "item": "book", "coupon": "X1"}},
        // Signing up: the alias joins the visitor to the user.
        {"type": "alias", "previousId": "anon-1", "userId": "user-1", "messageId": "m-alias"},
        {"type": "identify", "userId": "user-1", "messageId": "m-identify",
         "traits": {"email": "Ada@Example.com", "first_name": "Ada", "plan": "pro", "favouriteColour": "green"}},
        {"type": "group", "userId": "user-1", "groupId": "acme", "messageId": "m-group",
         "traits": {"name": "Acme Inc", "industry": "retail"}},
        {"type": "track", "userId": "user-1", "messageId": "m-track-2", "event": "Order Completed",
         "properties": {"amount": 10, "item": "pen"}}
    ]});
    let answer = ingest(&app, "/batch", WRITE_KEY, &batch).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(
        (&answer.body["data"]["applied"], &answer.body["data"]["failed"]),
        (&json!(5), &json!(0)),
        "{:?}",
        answer.body
    );

    // One contact, found by either id: the user's email, first name and plan from the traits.
    let users = contacts_of(&app, "userId=user-1").await;
    assert_eq!(users.len(), 1, "{users:?}");
    let ada = &users[0];
    assert_eq!(
        (&ada["email"], &ada["firstName"], &ada["plan"], &ada["source"]),
        (&json!("ada@example.com"), &json!("Ada"), &json!("pro"), &json!("ingest")),
        "{ada}"
    );
    let contact_id = ada["id"].as_str().expect("an id").to_owned();
    assert_eq!(contacts_of(&app, "limit=200").await.len(), 1, "the visitor and the user are one contact");
    // The group: the company record, and the contact names it.
    let companies = app.get("/schemas/companies/records?limit=10", ALPHA_ADMIN).await;
    let acme = &companies.body["data"][0];
    assert_eq!((&acme["externalId"], &acme["name"]), (&json!("acme"), &json!("Acme Inc")), "{:?}", companies.body);
    assert_eq!(ada["companyId"], acme["id"], "{ada}");
    // Both purchases and the page view are the contact's, before the alias and after it.
    let purchases = events_of(&app, "purchase").await;
    assert_eq!(purchases.len(), 2, "{purchases:?}");
    assert!(purchases.iter().all(|event| event["contactId"] == contact_id.as_str()), "{purchases:?}");
    let first = purchases.iter().find(|event| event["eventId"] == "m-track-1").expect("the first purchase");
    assert_eq!((&first["occurredAt"], &first["data"]["amount"]), (&json!("2026-12-01T10:00:00.000Z"), &json!(42.5)));
    let pages = events_of(&app, "page").await;
    assert_eq!(pages.len(), 1, "{pages:?}");
    assert_eq!((&pages[0]["contactId"], &pages[0]["data"]["name"]), (&json!(contact_id), &json!("Pricing")));
    assert_eq!(pages[0]["data"]["path"], "/pricing");

    // What no attribute holds is kept with its message in the contact's audit trail.
    let trail =
        app.get(&format!("/schemas/contacts/records/{contact_id}/audit-trail?channel=ingest"), ALPHA_ADMIN).await;
    assert_eq!(trail.status, 200, "{:?}", trail.body);
    let kept: Vec<(Value, Value)> = trail.body["data"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|entry| (entry["messageId"].clone(), entry["kept"].clone()))
        .collect();
    for (message_id, kept_values) in [
        ("m-identify", json!({"favouriteColour": "green"})),
        ("m-track-1", json!({"coupon": "X1"})),
        ("m-page", json!({"utm": "spring"})),
    ] {
        assert!(kept.contains(&(json!(message_id), kept_values.clone())), "{message_id}: {kept:?}");
    }
    crate::helpers::assert_conforms("AuditTrailEntry", trail.body["data"].as_array().expect("entries"));
}

#[tokio::test]
async fn a_batch_sent_again_records_nothing_twice_and_a_bad_message_is_kept_not_lost() {
    let app = ingest_app().await;
    let batch = json!({"writeKey": WRITE_KEY, "batch": [
        {"type": "identify", "userId": "user-2", "messageId": "r-1", "traits": {"email": "bo@example.com"}},
        {"type": "track", "userId": "user-2", "messageId": "r-2", "event": "Order Completed", "properties": {"amount": 5}},
        // No schema records this name: kept, with why, and the others applied. The key a
        // browser repeats in each message is not kept with it.
        {"type": "track", "userId": "user-2", "messageId": "r-3", "event": "Refund Issued", "properties": {"amount": 5},
         "writeKey": WRITE_KEY},
        // A value its attribute does not take.
        {"type": "identify", "userId": "user-3", "messageId": "r-4", "traits": {"age": "old"}},
        {"type": "track", "messageId": "r-5", "event": "Order Completed"}
    ]});
    // The key in the body, as some clients send it.
    let first = app.send(app.request(reqwest::Method::POST, "/batch", None).json(&batch)).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    assert_eq!(
        (&first.body["data"]["applied"], &first.body["data"]["failed"]),
        (&json!(2), &json!(3)),
        "{:?}",
        first.body
    );
    let codes: Vec<(&str, &str)> = first.body["data"]["failures"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|failure| Some((failure["messageId"].as_str()?, failure["code"].as_str()?)))
        .collect();
    assert_eq!(codes, [("r-3", "schema_not_found"), ("r-4", "invalid_attribute_value"), ("r-5", "missing_field")]);
    // Sent again (a client that did not hear the answer): nothing is recorded twice.
    let again = app.send(app.request(reqwest::Method::POST, "/batch", None).json(&batch)).await;
    assert_eq!(again.status, 200, "{:?}", again.body);
    assert_eq!(contacts_of(&app, "userId=user-2").await.len(), 1);
    assert_eq!(events_of(&app, "purchase").await.len(), 1, "r-2 once");
    // The failures list: each kept message once, with its write key, why and the message.
    let failures = app.get("/ingest-failures?writeKey=website", ALPHA_ADMIN).await;
    assert_eq!(failures.status, 200, "{:?}", failures.body);
    let listed = failures.body["data"].as_array().cloned().unwrap_or_default();
    assert_eq!(listed.len(), 3, "{listed:?}");
    let refund = listed.iter().find(|failure| failure["messageId"] == "r-3").expect("r-3");
    assert_eq!((&refund["type"], &refund["code"]), (&json!("track"), &json!("schema_not_found")));
    assert_eq!(refund["message"]["event"], "Refund Issued", "the message as sent: {refund}");
    assert!(refund["reason"].as_str().is_some_and(|reason| reason.contains("refund-issued")), "{refund}");
    crate::helpers::assert_conforms("IngestFailure", &listed);
    assert!(!failures.body.to_string().contains(WRITE_KEY), "no write key is listed: {listed:?}");
    let paged = app.get("/ingest-failures?limit=1", ALPHA_ADMIN).await;
    let cursor = paged.body["pagination"]["nextCursor"].as_str().expect("a next page").to_owned();
    let next = app.get(&format!("/ingest-failures?limit=2&cursor={cursor}"), ALPHA_ADMIN).await;
    assert_eq!(next.body["data"].as_array().map(Vec::len), Some(2), "{:?}", next.body);
    // Another space sees none of them.
    let elsewhere = app.get("/ingest-failures", crate::helpers::MULTI_BETA).await;
    assert_eq!(elsewhere.body["data"], json!([]), "{:?}", elsewhere.body);
    // The operator's status counts them and says where to look.
    let output = crate::helpers::run_binary("projector", &["status", "--json"], &app.database_url);
    let status: Value = serde_json::from_slice(&output.stdout).expect("the status as JSON");
    assert_eq!(status["ingestFailures"], 3, "{status}");
    let problems = status["problems"].as_array().cloned().unwrap_or_default();
    assert!(
        problems.iter().any(|problem| problem.as_str().is_some_and(|p| p.contains("/v1/ingest-failures"))),
        "{problems:?}"
    );
}

#[tokio::test]
async fn the_door_takes_gzip_and_refuses_what_segment_refuses_with_the_error_envelope() {
    let app = ingest_app().await;
    let raw = |path: &str| app.request(reqwest::Method::POST, path, None);
    // Gzip, as rudder-sdk-python sends every batch; the rotated secret is taken too.
    let batch = json!({"batch": [{"type": "identify", "userId": "zipped", "messageId": "z-1"}]});
    let zipped = raw("/batch")
        .basic_auth(ROTATED_KEY, Some(""))
        .header("Content-Type", "application/json")
        .header("Content-Encoding", "gzip")
        .body(gzip(batch.to_string().as_bytes()));
    let answer = app.send(zipped).await;
    assert_eq!((answer.status, &answer.body["data"]["applied"]), (200, &json!(1)), "{:?}", answer.body);

    // A gzip bomb: a small body that would unfold far past the batch's limit.
    let bomb = gzip(&vec![b' '; 4 * 1024 * 1024]);
    assert!(bomb.len() < 100 * 1024);
    let refused =
        app.send(raw("/batch").basic_auth(WRITE_KEY, Some("")).header("Content-Encoding", "gzip").body(bomb)).await;
    assert_eq!((refused.status, refused.code().as_str()), (400, Some("batch_too_large")), "{:?}", refused.body);
    let big = json!({"batch": [{"type": "track", "userId": "u", "event": "x", "properties": {"blob": "x".repeat(600 * 1024)}}]});
    let refused = ingest(&app, "/batch", WRITE_KEY, &big).await;
    assert_eq!((refused.status, refused.code().as_str()), (400, Some("batch_too_large")));
    let one_big = json!({"batch": [{"type": "track", "userId": "u", "event": "x", "properties": {"blob": "x".repeat(40 * 1024)}}]});
    let refused = ingest(&app, "/batch", WRITE_KEY, &one_big).await;
    assert_eq!((refused.status, refused.code().as_str()), (400, Some("message_too_large")), "{:?}", refused.body);
    assert_eq!(refused.body["error"]["issues"][0]["key"], "batch[0]");
    let untyped = ingest(&app, "/batch", WRITE_KEY, &json!({"batch": [{"userId": "u", "event": "x"}]})).await;
    assert_eq!((untyped.status, untyped.code().as_str()), (400, Some("invalid_batch")));
    let not_json = app.send(raw("/batch").basic_auth(WRITE_KEY, Some("")).body("{batch")).await;
    assert_eq!((not_json.status, not_json.code().as_str()), (400, Some("malformed_json")));
    let no_batch = ingest(&app, "/batch", WRITE_KEY, &json!({"messages": []})).await;
    assert_eq!((no_batch.status, no_batch.code().as_str()), (400, Some("invalid_body")));
    // A single-message path's message that cannot be read is the request's fault: 400.
    let nameless = ingest(&app, "/track", WRITE_KEY, &json!({"userId": "u", "messageId": "no-name"})).await;
    assert_eq!((nameless.status, nameless.code().as_str()), (400, Some("missing_field")), "{:?}", nameless.body);
    let shapeless = ingest(&app, "/identify", WRITE_KEY, &json!({"userId": "u", "traits": "tall"})).await;
    assert_eq!((shapeless.status, shapeless.code().as_str()), (400, Some("invalid_field")), "{:?}", shapeless.body);

    // The request's own fields are held to their types.
    let numbered = ingest(&app, "/identify", WRITE_KEY, &json!({"userId": "u", "writeKey": 42})).await;
    assert_eq!((numbered.status, numbered.code().as_str()), (400, Some("invalid_body")), "{:?}", numbered.body);
    for (field, value) in [("context", json!([null])), ("sentAt", json!(5)), ("writeKey", json!({"key": WRITE_KEY}))] {
        let mut body = json!({"batch": [{"type": "identify", "userId": "typed"}]});
        body[field] = value;
        let refused = ingest(&app, "/batch", WRITE_KEY, &body).await;
        assert_eq!(
            (refused.status, refused.code().as_str()),
            (400, Some("invalid_body")),
            "{field}: {:?}",
            refused.body
        );
    }
    // A single message kept as sent, less the key in its body (as analytics.js sends it).
    let kept = json!({"writeKey": WRITE_KEY, "userId": "u", "event": "Refund Issued", "messageId": "kept-1"});
    let answer = app.send(raw("/track").json(&kept)).await;
    assert_eq!((answer.status, &answer.body["data"]["failed"]), (200, &json!(1)), "{:?}", answer.body);
    let failures = app.get("/ingest-failures", ALPHA_ADMIN).await;
    assert_eq!(failures.body["data"][0]["message"]["event"], "Refund Issued", "{:?}", failures.body);
    assert!(!failures.body.to_string().contains(WRITE_KEY), "no write key is listed: {:?}", failures.body);

    // Keys: none, an unknown one, an API key; and a write key is no API key elsewhere.
    let none = app.send(raw("/track").json(&json!({"userId": "u", "event": "x"}))).await;
    assert_eq!((none.status, none.code().as_str()), (401, Some("invalid_write_key")), "{:?}", none.body);
    assert_eq!(none.header("www-authenticate"), Some("Basic realm=\"ingest\""));
    let unknown = ingest(&app, "/track", "wk_nobody_000000000000000000", &json!({"userId": "u", "event": "x"})).await;
    assert_eq!((unknown.status, unknown.code().as_str()), (401, Some("invalid_write_key")));
    let api_key = ingest(&app, "/track", ALPHA_ADMIN, &json!({"userId": "u", "event": "x"})).await;
    assert_eq!(api_key.status, 401, "an API key is no write key: {:?}", api_key.body);
    for path in ["/me", "/schemas/contacts/records", "/ingest-failures"] {
        let refused = app.send(app.request(reqwest::Method::GET, path, Some(WRITE_KEY))).await;
        assert_eq!(refused.status, 401, "{path}: a write key only sends");
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{WRITE_KEY}:"));
        let refused = app
            .send(app.request(reqwest::Method::GET, path, None).header("Authorization", format!("Basic {basic}")))
            .await;
        assert_eq!(refused.status, 401, "{path}: as Basic too");
    }
    let created = app
        .send(
            app.request(reqwest::Method::POST, "/schemas/contacts/records", Some(WRITE_KEY))
                .json(&json!({"email": "x@y.z"})),
        )
        .await;
    assert_eq!(created.status, 401, "{:?}", created.body);
}

#[tokio::test]
async fn an_alias_between_two_known_contacts_moves_the_anonymous_id_to_the_users_and_keeps_the_others_past() {
    let app = ingest_app().await;
    let batch = json!({"batch": [
        {"type": "track", "anonymousId": "anon-9", "messageId": "a-1", "event": "Order Completed", "properties": {"amount": 1}},
        {"type": "identify", "userId": "user-9", "messageId": "a-2", "traits": {"email": "cy@example.com"}}
    ]});
    assert_eq!(ingest(&app, "/batch", WRITE_KEY, &batch).await.status, 200);
    let visitor = contacts_of(&app, "limit=10")
        .await
        .into_iter()
        .find(|contact| contact["userId"].is_null())
        .expect("the visitor");
    let user = contacts_of(&app, "userId=user-9").await.remove(0);
    let merged =
        ingest(&app, "/alias", WRITE_KEY, &json!({"previousId": "anon-9", "userId": "user-9", "messageId": "a-3"}))
            .await;
    assert_eq!(merged.status, 200, "{:?}", merged.body);
    // The anonymous id now finds the user's contact.
    let later = ingest(
        &app,
        "/track",
        WRITE_KEY,
        &json!({"anonymousId": "anon-9", "messageId": "a-4", "event": "Order Completed", "properties": {"amount": 2}}),
    )
    .await;
    assert_eq!(later.status, 200, "{:?}", later.body);
    let purchases = events_of(&app, "purchase").await;
    let owner = |event_id: &str| {
        purchases.iter().find(|event| event["eventId"] == event_id).map(|event| event["contactId"].clone())
    };
    assert_eq!(owner("a-1"), Some(visitor["id"].clone()), "the visitor keeps its past");
    assert_eq!(owner("a-4"), Some(user["id"].clone()), "the alias moved to the user");
    assert_eq!(contacts_of(&app, "limit=10").await.len(), 2, "nothing deleted, nothing copied");
}

/// The host a Segment client is given: the command service's origin (it posts to
/// `<host>/v1/batch`).
fn sdk_host(app: &TestApp) -> String {
    app.command_url.trim_end_matches('/').trim_end_matches("/v1").to_owned()
}

/// Runs a client script; its JSON summary's `errors` must be empty.
async fn run_client(program: &str, script: &str, args: &[&str], env: &[(&str, String)]) {
    let mut command = std::process::Command::new(program);
    command.arg(script).args(args);
    for (key, value) in env {
        command.env(key, value);
    }
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the client ran")
        .unwrap_or_else(|error| panic!("running {program} {script}: {error}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{script}: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: Value = stdout
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| panic!("{script} printed no summary: {stdout}"));
    assert_eq!(summary["errors"], json!([]), "{script}: every message accepted");
}

#[tokio::test]
async fn the_published_python_and_node_clients_write_contacts_events_and_groups_as_teams_send_them() {
    let app = ingest_app().await;
    let host = sdk_host(&app);
    let python = std::env::var("TEST_PYTHON").expect("TEST_PYTHON names the tests' Python (see scripts/pyenv.sh)");
    let node_modules =
        std::env::var("TEST_NODE_MODULES").expect("TEST_NODE_MODULES names the Node client (see scripts/nodeenv.sh)");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/ingest");
    run_client(&python, &format!("{root}/python_sdks.py"), &[&host, WRITE_KEY, "sdk"], &[]).await;
    run_client("node", &format!("{root}/node_sdk.mjs"), &[&host, WRITE_KEY, "sdk"], &[("NODE_PATH", node_modules)])
        .await;

    // segment-analytics-python: the identify's traits (a folded key, one kept apart).
    let py = contacts_of(&app, "userId=py-sdk").await;
    assert_eq!(py.len(), 1, "{py:?}");
    assert_eq!(
        (&py[0]["email"], &py[0]["firstName"], &py[0]["plan"]),
        (&json!("py-sdk@example.com"), &json!("Py"), &json!("pro"))
    );
    let rudder = contacts_of(&app, "userId=rd-sdk").await;
    assert_eq!(rudder.len(), 1, "rudder-sdk-python's gzip batches: {rudder:?}");
    let node = contacts_of(&app, "userId=node-sdk").await;
    assert_eq!(node.len(), 1, "@segment/analytics-node: {node:?}");
    assert_eq!(node[0]["email"], "node-sdk@example.com");
    // Every track once, the retried batch's too, on its contact.
    let purchases = events_of(&app, "purchase").await;
    let mut event_ids: Vec<&str> = purchases.iter().filter_map(|event| event["eventId"].as_str()).collect();
    event_ids.sort_unstable();
    assert_eq!(event_ids, ["sdk-n2", "sdk-r2", "sdk-retried", "sdk-s2"], "{purchases:?}");
    let on = |event_id: &str| {
        purchases.iter().find(|event| event["eventId"] == event_id).map(|event| event["contactId"].clone())
    };
    assert_eq!(on("sdk-s2"), Some(py[0]["id"].clone()));
    assert_eq!(on("sdk-n2"), Some(node[0]["id"].clone()));
    // Pages by the anonymous id the identify bound land on the known contact.
    let pages = events_of(&app, "page").await;
    let page = |event_id: &str| {
        pages.iter().find(|event| event["eventId"] == event_id).map(|event| event["contactId"].clone())
    };
    assert_eq!(page("sdk-s3"), Some(py[0]["id"].clone()), "{pages:?}");
    assert_eq!(page("sdk-n3"), Some(node[0]["id"].clone()), "{pages:?}");
    assert_eq!(page("sdk-r3"), Some(rudder[0]["id"].clone()), "{pages:?}");
    // Groups: the companies, and the contacts name them.
    let companies = app.get("/schemas/companies/records?limit=10", ALPHA_ADMIN).await;
    let company = |external: &str| {
        companies.body["data"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|company| company["externalId"] == external)
            .map(|company| company["id"].clone())
    };
    assert_eq!(company("acme-sdk"), Some(py[0]["companyId"].clone()));
    assert_eq!(company("globex-sdk"), Some(node[0]["companyId"].clone()));
    // The aliases: an anonymous id joined later finds the user.
    for (anonymous, user) in [("later-py-sdk", &py[0]), ("later-node-sdk", &node[0])] {
        let message_id = format!("after-{anonymous}");
        let body = json!({"anonymousId": anonymous, "messageId": message_id, "event": "Order Completed", "properties": {"amount": 1}});
        assert_eq!(ingest(&app, "/track", WRITE_KEY, &body).await.status, 200);
        let purchases = events_of(&app, "purchase").await;
        let found =
            purchases.iter().find(|event| event["eventId"] == message_id.as_str()).map(|event| &event["contactId"]);
        assert_eq!(found, Some(&user["id"]), "{anonymous}");
    }
    assert_eq!(app.get("/ingest-failures", ALPHA_ADMIN).await.body["data"], json!([]), "nothing refused");
}

#[tokio::test]
async fn a_command_service_killed_mid_batch_loses_and_duplicates_nothing_a_client_was_told_was_taken() {
    const BATCHES: usize = 24;
    const PER_BATCH: usize = 40;
    const USERS: usize = 15;
    let app = ingest_app().await;
    // The write key's bucket and event admission raised far above the load (their contract
    // values would answer 429 within the first batches, which the client would retry forever).
    let mut settings = vec![("APP__RATE_LIMITS__INGEST_PER_SECOND".to_owned(), "1000000".to_owned())];
    for scope in ["FLEET", "SPACE", "SCHEMA"] {
        for (limit, value) in
            [("RATE", "1000000000"), ("BURST", "1000000000"), ("PENDING", "1000000000"), ("RECEIPTS", "1000000000000")]
        {
            settings.push((format!("APP__EVENTS__ADMISSION__{scope}__{limit}"), value.to_owned()));
        }
    }
    let env: Vec<(&str, String)> = settings.iter().map(|(key, value)| (key.as_str(), value.clone())).collect();
    let (mut processes, urls) = crate::helpers::spawn_servers(&app, "command-service", &["serve"], 1, &env).await;
    let url = std::sync::Arc::new(std::sync::Mutex::new(urls[0].clone()));
    // A client as Segment's: each batch posted until it is answered 200, then the next.
    let client = {
        let (http, url) = (app.http.clone(), std::sync::Arc::clone(&url));
        tokio::spawn(async move {
            let (mut taken, mut failed_attempts) = (0usize, 0usize);
            for batch in 0..BATCHES {
                let messages: Vec<Value> = (0..PER_BATCH)
                    .map(|index| {
                        json!({"type": "track", "userId": format!("killed-{}", (batch * PER_BATCH + index) % USERS),
                               "messageId": format!("k-{batch}-{index}"), "event": "Order Completed",
                               "properties": {"amount": index, "item": "mug", "category": "books"}})
                    })
                    .collect();
                let body = json!({"batch": messages});
                loop {
                    let target = url.lock().map(|url| url.clone()).unwrap_or_default();
                    let sent = http
                        .post(format!("{target}/batch"))
                        .basic_auth(WRITE_KEY, Some(""))
                        .json(&body)
                        .timeout(std::time::Duration::from_secs(10))
                        .send()
                        .await;
                    match sent {
                        Ok(response) if response.status().as_u16() == 200 => {
                            let answer: Value = response.json().await.unwrap_or_default();
                            assert_eq!(answer["data"]["applied"], json!(PER_BATCH), "every message applied: {answer}");
                            taken += PER_BATCH;
                            break;
                        }
                        _ => {
                            failed_attempts += 1;
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        }
                    }
                }
            }
            (taken, failed_attempts)
        })
    };
    // Killed with SIGKILL once some batches are taken, mid-request (the client sends the next
    // batch at once), then started again on a new port.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while app.query_i64("SELECT count(*) FROM events WHERE event_type = 'EventAccepted.v1'").await
        < (5 * PER_BATCH) as i64
    {
        assert!(std::time::Instant::now() < deadline, "the first batches were not taken");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let killed = processes.remove(0);
    drop(killed);
    let (restarted, urls) = crate::helpers::spawn_servers(&app, "command-service", &["serve"], 1, &env).await;
    if let Ok(mut current) = url.lock() {
        current.clone_from(&urls[0]);
    }
    let (taken, failed_attempts) = client.await.expect("the client finished");
    drop(restarted);
    assert_eq!(taken, BATCHES * PER_BATCH, "every batch was answered 200 in the end");
    assert!(failed_attempts > 0, "the kill cut a request off");
    // Every message the client was told was taken is on the log once: no loss, no duplicate.
    let events = app.query_i64("SELECT count(*) FROM events WHERE event_type = 'EventAccepted.v1'").await;
    let receipts = app.query_i64("SELECT count(*) FROM event_receipts").await;
    let client = app.pool.get().await.expect("a client");
    let rows = client.query("SELECT event_id FROM event_receipts", &[]).await.expect("receipts");
    let present: std::collections::HashSet<String> = rows.iter().map(|row| row.get(0)).collect();
    let missing: Vec<String> = (0..BATCHES)
        .flat_map(|batch| (0..PER_BATCH).map(move |index| format!("k-{batch}-{index}")))
        .filter(|id| !present.contains(id))
        .take(20)
        .collect();
    assert_eq!(events, (BATCHES * PER_BATCH) as i64, "receipts {receipts}; missing {missing:?}");
    let contacts = app.query_i64("SELECT count(*) FROM events WHERE event_type = 'RecordCreated.v1'").await;
    assert_eq!(contacts, USERS as i64, "one contact per userId, however often its batch was sent");
}

#[tokio::test]
async fn each_write_key_has_its_own_ingest_bucket_and_a_limited_client_is_told_when_to_retry() {
    let limits = platform::settings::RateLimits { ingest_per_second: 2, ..crate::helpers::unlimited() };
    let app = TestApp::spawn_with(crate::helpers::Options { limits: Some(limits), ..Default::default() }).await;
    app.apply_workspace(&ingest_workspace(), true).await;
    let message = |n: u32| json!({"type": "identify", "userId": format!("limit-{n}"), "traits": {"email": format!("limit{n}@example.com")}});
    // A burst inside one second of the clock: the window is a second, shared by every instance.
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_millis() % 1000)
        .unwrap_or(0);
    tokio::time::sleep(std::time::Duration::from_millis(u64::try_from(1020 - millis).unwrap_or(0))).await;
    let mut statuses = Vec::new();
    let mut limited = None;
    for n in 0..3 {
        let response = ingest(&app, "/identify", WRITE_KEY, &message(n)).await;
        if response.status == 429 {
            limited = Some(response);
        } else {
            statuses.push(response.status);
        }
    }
    assert_eq!(statuses, vec![200, 200], "two messages fit the window");
    let limited = limited.expect("the third request is limited");
    assert_eq!(limited.code(), "rate_limit_exceeded", "{:?}", limited.body);
    let retry_after = limited.header("retry-after").expect("Retry-After");
    let reset = chrono::DateTime::parse_from_rfc2822(retry_after).expect("an HTTP date");
    let wait = reset.timestamp_millis() - chrono::Utc::now().timestamp_millis();
    assert!((-1000..=1000).contains(&wait), "the window resets within a second: {retry_after}");
    // The ingest bucket is not the API key's: the admin's writes still go through.
    let created = app.post("/schemas/contacts/records", ALPHA_ADMIN, &json!({"email": "beside@example.com"})).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    // The next window opens the bucket again, and the limited message was not taken.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(ingest(&app, "/identify", WRITE_KEY, &message(3)).await.status, 200);
    let found = contacts_of(&app, "userId=limit-2").await;
    assert!(found.is_empty(), "a refused request writes nothing: {found:?}");
}

/// The events of known contacts go as an event batch of their schema: the ones event admission
/// lets in are written, and the request answers 429 with `Retry-After` for the rest, which the
/// client sends again without anything being written twice.
#[tokio::test]
async fn tracks_of_a_known_contact_over_the_event_admission_limit_answer_429_and_the_admitted_ones_are_written_once() {
    let open = crate::helpers::unlimited_admission().fleet;
    let schema = platform::settings::ScopeLimits { rate: 0.01, burst: 3.0, pending: 100, receipts: 100 };
    let admission = platform::settings::AdmissionLimits { fleet: open, space: open, schema };
    let options = crate::helpers::Options { admission: Some(admission), ..crate::helpers::Options::default() };
    let app = TestApp::spawn_with(options).await;
    app.apply_workspace(&ingest_workspace(), true).await;
    let identify =
        json!({"type": "identify", "userId": "user-9", "messageId": "i-9", "traits": {"email": "nine@example.com"}});
    let known = ingest(&app, "/identify", WRITE_KEY, &identify).await;
    assert_eq!(known.status, 200, "{:?}", known.body);
    let tracks: Vec<Value> = (0..5)
        .map(|n| {
            json!({"type": "track", "userId": "user-9", "messageId": format!("t-{n}"), "event": "Order Completed",
                   "properties": {"amount": n}})
        })
        .collect();
    let batch = json!({"batch": tracks});
    let limited = ingest(&app, "/batch", WRITE_KEY, &batch).await;
    assert_eq!(limited.status, 429, "{:?}", limited.body);
    assert_eq!(limited.body["error"]["code"], "event_rate_limited", "{:?}", limited.body);
    let retry = limited.header("retry-after").and_then(|seconds| seconds.parse::<u64>().ok());
    assert!(retry.is_some_and(|seconds| seconds >= 1), "Retry-After in seconds: {:?}", limited.header("retry-after"));
    assert_eq!(events_of(&app, "purchase").await.len(), 3, "the burst's three are written");
    let again = ingest(&app, "/batch", WRITE_KEY, &batch).await;
    assert_eq!(again.status, 429, "{:?}", again.body);
    let written = events_of(&app, "purchase").await;
    let mut event_ids: Vec<&str> = written.iter().filter_map(|event| event["eventId"].as_str()).collect();
    event_ids.sort_unstable();
    assert_eq!(event_ids, ["t-0", "t-1", "t-2"], "the first three in the batch's order, each once");
}
