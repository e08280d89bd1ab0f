//! Outgoing webhooks: the six operations, and deliveries to a real receiver on loopback whose
//! signatures the reference Python implementation of Standard Webhooks verifies.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::*;
use crate::receiver::Receiver;

const WAIT: Duration = Duration::from_secs(20);

async fn create_webhook(app: &TestApp, body: &Value) -> Value {
    let response = app.post("/webhooks", ALPHA_ADMIN, body).await;
    assert_eq!(response.status, 201, "{:?}", response.body);
    response.body["data"].clone()
}

/// A webhook on alpha's contacts sending to the receiver's endpoint `name`, which verifies
/// with the webhook's secret and answers as `behaviour` says.
async fn hook(app: &TestApp, receiver: &Receiver, name: &str, trigger: &str, behaviour: Value) -> Value {
    receiver.endpoint(name, &[], json!({})).await;
    let webhook =
        create_webhook(app, &json!({"url": receiver.url(name), "trigger": trigger, "schemaId": "contacts"})).await;
    let secret = webhook["signatureVerificationSecret"].as_str().expect("secret").to_owned();
    receiver.endpoint(name, &[&secret], behaviour).await;
    webhook
}

async fn patch(app: &TestApp, path: &str, body: &Value) -> TestResponse {
    app.send(app.request(reqwest::Method::PATCH, path, Some(ALPHA_ADMIN)).json(body)).await
}

async fn get_webhook(app: &TestApp, id: &str) -> Value {
    let response = app.get(&format!("/webhooks/{id}"), ALPHA_ADMIN).await;
    assert_eq!(response.status, 200, "{:?}", response.body);
    response.body["data"].clone()
}

/// Polls the webhook until `check` holds.
async fn wait_for_webhook(app: &TestApp, id: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let webhook = get_webhook(app, id).await;
        if check(&webhook) {
            return webhook;
        }
        assert!(Instant::now() < deadline, "the webhook never reached the expected state: {webhook}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until no delivery is pending any more.
pub(crate) async fn wait_until_settled(app: &TestApp) {
    let deadline = Instant::now() + WAIT;
    // One statement, so one snapshot: the enqueue worker inserts deliveries and advances its
    // checkpoint in one transaction, and two separate reads could straddle it (no delivery
    // yet, then the checkpoint already past the event).
    while app
        .query_i64(
            "SELECT (SELECT count(*) FROM webhook_deliveries WHERE state = 'pending')
                  + GREATEST((SELECT position FROM log_head)
                      - COALESCE((SELECT position FROM worker_checkpoints WHERE name = 'webhook_enqueue'), 0), 0)",
        )
        .await
        > 0
    {
        assert!(Instant::now() < deadline, "deliveries are still pending");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_webhook_is_created_read_and_listed_and_its_secret_is_shown_only_at_creation() {
    let app = TestApp::spawn().await;
    let response = app
        .post(
            "/webhooks",
            ALPHA_ADMIN,
            &json!({"url": "https://hooks.example.com/in", "trigger": "contact upserted", "schemaId": "contacts"}),
        )
        .await;
    assert_eq!(response.status, 201, "{:?}", response.body);
    let created = &response.body["data"];
    let id = created["id"].as_str().expect("id");
    assert!(id.starts_with("wh_"));
    assert!(created["signatureVerificationSecret"].as_str().is_some_and(|secret| secret.starts_with("whsec_")));
    assert!(created["schemaId"].as_str().is_some_and(|schema| schema.starts_with("sch_")), "the slug became the id");
    assert_eq!(created["status"], "live");
    assert_eq!(created["condition"], json!({"type": "none"}));
    for counter in ["totalCalls", "failedCalls", "failedCallsInARow"] {
        assert_eq!(created[counter], 0, "{counter}");
    }
    assert!(created["lastCalledAt"].is_null() && created["lastCallErrorMessage"].is_null());
    assert!(created.get("integrationVendorName").is_none());

    let token = response.header("Consistency-Token").expect("token").to_owned();
    let read = app
        .send(
            app.request(reqwest::Method::GET, &format!("/webhooks/{id}"), Some(ALPHA_ADMIN))
                .header("Consistency-Token", token),
        )
        .await;
    assert_eq!(read.status, 200);
    let mut expected = created.clone();
    expected.as_object_mut().expect("object").remove("signatureVerificationSecret");
    assert_eq!(read.body["data"], expected, "GET shows the resource without its secret");
    let list = app.get("/webhooks", ALPHA_ADMIN).await;
    assert_eq!(list.status, 200);
    assert_eq!(list.body["pagination"]["totalCount"], 1);
    assert_eq!(list.body["data"][0], expected);
    assert!(!list.body.to_string().contains("whsec_"));

    // Another space sees nothing of it.
    assert_eq!(app.get(&format!("/webhooks/{id}"), MULTI_BETA).await.code(), "webhook_not_found");
    assert_eq!(app.get("/webhooks", MULTI_BETA).await.body["pagination"]["totalCount"], 0);
    let foreign = app.send(app.request(reqwest::Method::DELETE, &format!("/webhooks/{id}"), Some(MULTI_BETA))).await;
    assert_eq!(foreign.code(), "webhook_not_found");

    // Deleted: 200 once, then 404 for it everywhere.
    let deleted = app.send(app.request(reqwest::Method::DELETE, &format!("/webhooks/{id}"), Some(ALPHA_ADMIN))).await;
    assert_eq!(deleted.status, 200);
    assert_eq!(deleted.body["data"], json!({"id": id, "deleted": true}));
    let again = app.send(app.request(reqwest::Method::DELETE, &format!("/webhooks/{id}"), Some(ALPHA_ADMIN))).await;
    assert_eq!((again.status, again.code().as_str()), (404, Some("webhook_not_found")));
    // Read-your-writes holds even under a token no write returned (beyond the log's end).
    let bogus = app
        .send(
            app.request(reqwest::Method::GET, &format!("/webhooks/{id}/deliveries"), Some(ALPHA_ADMIN))
                .header("Consistency-Token", "536870911"),
        )
        .await;
    assert_eq!(bogus.code(), "webhook_not_found", "{:?}", bogus.body);
    let token = deleted.header("Consistency-Token").expect("token").to_owned();
    let gone = app
        .send(
            app.request(reqwest::Method::GET, &format!("/webhooks/{id}"), Some(ALPHA_ADMIN))
                .header("Consistency-Token", token),
        )
        .await;
    assert_eq!(gone.status, 404);
    assert_eq!(app.get("/webhooks", ALPHA_ADMIN).await.body["pagination"]["totalCount"], 0);
    assert_eq!(
        app.query_i64(&format!("SELECT count(*) FROM subject_keys WHERE subject_id = 'webhook-{id}'")).await,
        0,
        "its secrets are shredded"
    );
}

#[tokio::test]
async fn invalid_webhooks_are_refused_with_issues_naming_the_field() {
    let app = TestApp::spawn().await;
    let cases = [
        (json!({"trigger": "contact upserted", "schemaId": "contacts"}), "url"),
        (json!({"url": "ftp://example.com/x", "trigger": "contact upserted", "schemaId": "contacts"}), "url"),
        (json!({"url": "http://10.1.2.3/x", "trigger": "contact upserted", "schemaId": "contacts"}), "url"),
        (json!({"url": "http://169.254.169.254/latest", "trigger": "contact upserted", "schemaId": "contacts"}), "url"),
        (json!({"url": "https://example.com", "trigger": "contact_upserted", "schemaId": "contacts"}), "trigger"),
        (json!({"url": "https://example.com", "trigger": "contact upserted"}), "schemaId"),
        (json!({"url": "https://example.com", "trigger": "email event"}), "emailEventTypes"),
        (
            json!({"url": "https://example.com", "trigger": "email event", "emailEventTypes": ["delivered"]}),
            "emailEventTypes",
        ),
        (
            json!({"url": "https://example.com", "trigger": "email event", "emailEventTypes": ["sent"], "schemaId": "contacts"}),
            "schemaId",
        ),
        (
            json!({"url": "https://example.com", "trigger": "contact upserted", "schemaId": "contacts", "emailEventTypes": ["sent"]}),
            "emailEventTypes",
        ),
        (json!({"url": "https://example.com", "trigger": "contact upserted", "schemaId": "purchase"}), "schemaId"),
        (json!({"url": "https://example.com", "trigger": "event fired", "schemaId": "contacts"}), "schemaId"),
        (
            json!({"url": "https://example.com", "trigger": "contact upserted", "schemaId": "contacts", "condition": {"type": "segment"}}),
            "condition.segmentId",
        ),
        (
            json!({"url": "https://example.com", "trigger": "contact upserted", "schemaId": "contacts", "condition": {"type": "everyone"}}),
            "condition.type",
        ),
        (
            json!({"url": "https://example.com", "trigger": "contact upserted", "schemaId": "contacts", "colour": "red"}),
            "colour",
        ),
    ];
    for (body, field) in cases {
        let response = app.post("/webhooks", ALPHA_ADMIN, &body).await;
        assert_eq!(
            (response.status, response.code().as_str()),
            (400, Some("invalid_webhook")),
            "{body}: {:?}",
            response.body
        );
        let issues = response.body["error"]["issues"].as_array().expect("issues");
        assert!(issues.iter().any(|issue| issue["key"] == field), "{body}: {issues:?}");
    }
    let unknown = app
        .post(
            "/webhooks",
            ALPHA_ADMIN,
            &json!({"url": "https://example.com", "trigger": "contact upserted", "schemaId": "nope"}),
        )
        .await;
    assert_eq!((unknown.status, unknown.code().as_str()), (404, Some("schema_not_found")));
    let email = create_webhook(&app, &json!({"url": "https://example.com/e", "trigger": "email event", "emailEventTypes": ["bounced", "complained"], "schemaId": null})).await;
    assert!(email["schemaId"].is_null());
    let event = create_webhook(
        &app,
        &json!({"url": "https://example.com/e", "trigger": "event fired", "schemaId": "purchase"}),
    )
    .await;
    let path = format!("/webhooks/{}", event["id"].as_str().expect("id"));
    for (body, field) in [
        (json!({"trigger": "contact upserted"}), Some("trigger")),
        (json!({"schemaId": "signup"}), Some("schemaId")),
        (json!({"emailEventTypes": ["sent"]}), Some("emailEventTypes")),
        (json!({"status": "off"}), Some("status")),
        (json!({}), None),
    ] {
        let response = patch(&app, &path, &body).await;
        assert_eq!((response.status, response.code().as_str()), (400, Some("invalid_webhook")), "{body}");
        if let Some(field) = field {
            assert!(
                response.body["error"]["issues"].as_array().expect("issues").iter().any(|issue| issue["key"] == field),
                "{body}: {:?}",
                response.body
            );
        }
    }
    let missing = patch(&app, "/webhooks/wh_missing", &json!({"status": "paused"})).await;
    assert_eq!((missing.status, missing.code().as_str()), (404, Some("webhook_not_found")));
    // The member role reads but cannot write.
    assert_eq!(app.get("/webhooks", ALPHA_MEMBER).await.status, 200);
}

#[tokio::test]
async fn create_and_rotate_replay_their_secret_under_the_same_key_and_a_new_key_rotates_again() {
    let app = TestApp::spawn().await;
    let body = json!({"url": "https://example.com/hook", "trigger": "contact deleted", "schemaId": "contacts"});
    let send = |key: &'static str, method: reqwest::Method, path: String, body: Option<Value>| {
        let mut request = app.request(method, &path, Some(ALPHA_ADMIN)).header("Idempotency-Key", key);
        if let Some(body) = body {
            request = request.json(&body);
        }
        app.send(request)
    };
    let first = send("create-1", reqwest::Method::POST, "/webhooks".into(), Some(body.clone())).await;
    let replay = send("create-1", reqwest::Method::POST, "/webhooks".into(), Some(body.clone())).await;
    assert_eq!(first.status, 201);
    assert_eq!(replay.status, 201);
    assert_eq!(replay.header("Idempotent-Replay"), Some("true"));
    assert_eq!(replay.body, first.body, "the replay returns the same webhook and secret");
    let id = first.body["data"]["id"].as_str().expect("id").to_owned();
    let original = first.body["data"]["signatureVerificationSecret"].clone();

    let path = format!("/webhooks/{id}/rotate-secret");
    let rotated = send("rotate-1", reqwest::Method::POST, path.clone(), None).await;
    assert_eq!(rotated.status, 200, "{:?}", rotated.body);
    let data = &rotated.body["data"];
    assert_eq!(data["id"], id.as_str());
    assert!(data["updatedAt"].is_string());
    assert_ne!(data["signatureVerificationSecret"], original);
    let rotated_replay = send("rotate-1", reqwest::Method::POST, path.clone(), None).await;
    assert_eq!(rotated_replay.body, rotated.body, "the same key replays the same secret");
    let rotated_again = send("rotate-2", reqwest::Method::POST, path.clone(), None).await;
    assert_eq!(rotated_again.status, 200);
    assert_ne!(rotated_again.body["data"]["signatureVerificationSecret"], data["signatureVerificationSecret"]);
    assert_eq!(app.query_i64(&format!("SELECT count(*) FROM events WHERE stream_id = 'webhook-{id}'")).await, 3);

    let deleted = send("delete-1", reqwest::Method::DELETE, format!("/webhooks/{id}"), None).await;
    assert_eq!(deleted.status, 200);
    let deleted_replay = send("delete-1", reqwest::Method::DELETE, format!("/webhooks/{id}"), None).await;
    assert_eq!(deleted_replay.body, deleted.body, "a replayed delete answers as the first");
    let rotate_deleted = send("rotate-3", reqwest::Method::POST, path, None).await;
    assert_eq!(rotate_deleted.code(), "webhook_not_found");
    // Once the webhook is deleted, replays no longer show its secrets.
    let create_replay = send("create-1", reqwest::Method::POST, "/webhooks".into(), Some(body.clone())).await;
    assert_eq!(create_replay.body["data"]["id"], id.as_str());
    assert!(!create_replay.body.to_string().contains("whsec_"), "{:?}", create_replay.body);
    let rotate_replay = send("rotate-1", reqwest::Method::POST, format!("/webhooks/{id}/rotate-secret"), None).await;
    assert!(!rotate_replay.body.to_string().contains("whsec_"), "{:?}", rotate_replay.body);
}

#[tokio::test]
async fn integration_owned_webhooks_are_listed_but_cannot_be_changed() {
    let app = TestApp::spawn().await;
    let receiver = Receiver::start().await;
    receiver.endpoint("vendor", &[], json!({})).await;
    let receiver_url = receiver.url("vendor");
    let workspace = WORKSPACE.replacen(
        "\"aiCredits\": 100,",
        &format!("\"aiCredits\": 100, \"webhooks\": [{{\"id\": \"wh_vendor\", \"url\": \"{receiver_url}\", \"trigger\": \"contact upserted\", \"schema\": \"contacts\", \"integrationVendorName\": \"Salesforce\"}}],"),
        1,
    );
    let report = app.apply_workspace(&workspace, true).await;
    let [(id, vendor, secret)] = report.generated_webhook_secrets.as_slice() else {
        panic!("one secret generated: {:?}", report.generated_webhook_secrets.len())
    };
    assert_eq!((id.as_str(), vendor.as_str()), ("wh_vendor", "Salesforce"));
    receiver.endpoint("vendor", &[secret], json!({})).await;
    app.wait_for_projections().await;
    let webhook = get_webhook(&app, "wh_vendor").await;
    assert_eq!(webhook["integrationVendorName"], "Salesforce");
    assert_eq!(webhook["url"], receiver_url);
    for response in [
        patch(&app, "/webhooks/wh_vendor", &json!({"status": "paused"})).await,
        app.send(app.request(reqwest::Method::DELETE, "/webhooks/wh_vendor", Some(ALPHA_ADMIN))).await,
        app.post("/webhooks/wh_vendor/rotate-secret", ALPHA_ADMIN, &json!({})).await,
    ] {
        assert_eq!(
            (response.status, response.code().as_str()),
            (409, Some("webhook_integration_owned")),
            "{:?}",
            response.body
        );
    }
    // Applying the file again changes nothing.
    let again = app.apply_workspace(&workspace, true).await;
    assert!(again.generated_webhook_secrets.is_empty(), "a secret is shown once");
    assert_eq!(app.query_i64("SELECT count(*) FROM events WHERE stream_id = 'webhook-wh_vendor'").await, 1);
    // It delivers like any other, signed with the secret made when the file was applied.
    app.create_contact(&json!({"email": "vendor@example.com"})).await;
    let got = receiver.wait_for("vendor", 1, WAIT).await;
    assert_eq!(got[0]["body"]["data"]["email"], "vendor@example.com");
    assert_eq!(got[0]["verifiedWith"], json!([0]), "the integration verifies with the secret the apply showed");

    // Taken out of the file, the next apply deletes it (its secret's key shredded): it is gone
    // from the API and delivers no more.
    let removed = app.apply_workspace(WORKSPACE, true).await;
    assert!(removed.events >= 1, "the apply deleted the webhook");
    app.wait_for_projections().await;
    let gone = app.get("/webhooks/wh_vendor", ALPHA_ADMIN).await;
    assert_eq!((gone.status, gone.code().as_str()), (404, Some("webhook_not_found")), "{:?}", gone.body);
    let keys = app.query_i64("SELECT count(*) FROM subject_keys WHERE subject_id LIKE '%wh_vendor%'").await;
    assert_eq!(keys, 0, "the secret's key is shredded");
    app.create_contact(&json!({"email": "after@example.com"})).await;
    app.wait_for_projections().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.received("vendor").await.len(), 1, "no delivery after its removal");
    // Applying without it again appends nothing; declaring the removed id again is refused.
    assert_eq!(app.apply_workspace(WORKSPACE, true).await.events, 0);
    let parsed = command_service::authoring::parse(&workspace).expect("parses");
    let rules = command_service::authoring::Rules { allow_loopback_webhooks: true };
    let again = command_service::authoring::plan(&app.pool, &parsed, rules).await.err().map(|e| e.to_string());
    assert!(again.as_deref().is_some_and(|message| message.contains("give it a new id")), "{again:?}");
}

#[tokio::test]
async fn apply_holds_workspace_webhooks_to_the_targets_post_webhooks_allows() {
    let app = TestApp::spawn().await;
    let with_url = |url: &str| {
        let workspace = WORKSPACE.replacen(
            "\"aiCredits\": 100,",
            &format!("\"aiCredits\": 100, \"webhooks\": [{{\"id\": \"wh_inward\", \"url\": \"{url}\", \"trigger\": \"contact upserted\", \"schema\": \"contacts\", \"integrationVendorName\": \"Acme\"}}],"),
            1,
        );
        command_service::authoring::parse(&workspace)
    };
    let strict = command_service::authoring::Rules { allow_loopback_webhooks: false };
    let loose = command_service::authoring::Rules { allow_loopback_webhooks: true };
    for (url, rules, refused) in [
        ("http://127.0.0.1:9/hook", strict, Some("loopback")),
        ("http://localhost:9/hook", strict, Some("loopback")),
        ("http://127.0.0.1:9/hook", loose, None),
        ("http://10.1.2.3/hook", loose, Some("private")),
        ("http://169.254.169.254/latest/meta-data", loose, Some("metadata")),
        ("https://hooks.example.com/in", strict, None),
    ] {
        // The file's own check refuses what no deployment allows; the plan, what this one does not.
        let planned = match with_url(url) {
            Ok(workspace) => command_service::authoring::plan(&app.pool, &workspace, rules).await.map(|_| ()),
            Err(error) => Err(error),
        };
        match refused {
            Some(word) => {
                let message = planned.err().map(|error| error.to_string()).unwrap_or_default();
                assert!(message.contains("wh_inward") && message.contains(word), "{url}: {message}");
            }
            None => assert!(planned.is_ok(), "{url} is allowed"),
        }
    }
    assert_eq!(app.query_i64("SELECT count(*) FROM events WHERE stream_id = 'webhook-wh_inward'").await, 0);
}

#[tokio::test]
async fn deliveries_are_signed_verified_by_the_reference_implementation_and_counted() {
    let app = TestApp::spawn().await;
    let receiver = Receiver::start().await;
    let upserts = hook(&app, &receiver, "upserts", "contact upserted", json!({"status": 204})).await;
    let deletes = hook(&app, &receiver, "deletes", "contact deleted", json!({"status": 200})).await;
    let contact = app.create_contact(&json!({"email": "hook@example.com", "firstName": "Ada"})).await;
    let id = contact["id"].as_str().expect("id").to_owned();
    let got = receiver.wait_for("upserts", 1, WAIT).await;
    let first = &got[0];
    assert_eq!(first["verifiedWith"], json!([0]), "the standardwebhooks package verifies the signature: {first}");
    assert_eq!(first["xWebhookId"], first["webhookId"]);
    assert!(first["webhookId"].as_str().is_some_and(|id| id.starts_with("msg_")));
    assert_eq!(first["body"]["type"], "contact.upserted");
    assert!(first["body"]["timestamp"].is_string());
    assert_eq!(first["body"]["data"], contact, "data is the record as GET returns it");

    let patched = patch(&app, &format!("/schemas/contacts/records/{id}"), &json!({"firstName": "Grace"})).await;
    assert_eq!(patched.status, 200);
    let got = receiver.wait_for("upserts", 2, WAIT).await;
    assert_eq!(got[1]["body"]["data"]["firstName"], "Grace");
    assert_ne!(got[1]["webhookId"], got[0]["webhookId"], "each delivery has its own id");
    // Another schema's records do not fire it.
    let lead =
        app.post("/schemas/leads/records", ALPHA_ADMIN, &json!({"email": "lead@example.com", "company": "Acme"})).await;
    assert_eq!(lead.status, 201);

    let deleted = app
        .send(app.request(reqwest::Method::DELETE, &format!("/schemas/contacts/records/{id}"), Some(ALPHA_ADMIN)))
        .await;
    assert_eq!(deleted.status, 200);
    let got = receiver.wait_for("deletes", 1, WAIT).await;
    assert_eq!(got[0]["verifiedWith"], json!([0]));
    assert_eq!(got[0]["body"]["type"], "contact.deleted");
    let schema_id = contact_schema_id(&app).await;
    assert_eq!(got[0]["body"]["data"], json!({"id": id, "schemaId": schema_id}), "ids only, no personal data");

    wait_until_settled(&app).await;
    assert_eq!(receiver.received("upserts").await.len(), 2, "the lead and the deletion did not fire the upsert hook");
    let counted = wait_for_webhook(&app, upserts["id"].as_str().expect("id"), |w| w["totalCalls"] == 2).await;
    assert_eq!(counted["failedCalls"], 0);
    assert!(counted["lastCalledAt"].is_string());
    assert!(counted["lastCallErrorMessage"].is_null());
    wait_for_webhook(&app, deletes["id"].as_str().expect("id"), |w| w["totalCalls"] == 1).await;
}

#[tokio::test]
async fn a_span_with_nothing_to_enqueue_is_passed_over_in_one_statement_without_waiting_for_its_flush() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let settings = platform::settings::Settings {
        webhooks: test_webhooks(),
        ..platform::settings::Settings::for_database(&app.database_url)
    };
    let projector = projector_noting_checkpoint_commits(&app, settings).await;
    let head = async || app.query_i64("SELECT position FROM log_head").await;

    // The workspace's own definitions first (their steps write endpoints).
    wait_until_settled(&app).await;
    // No webhook: a create gives the workers nothing to do. Each looks at the span without its
    // lease and passes over it in one statement, without waiting for its flush.
    let followers = ["webhook_enqueue", "preparation", "workflow_replays"];
    let caught_up = async || {
        let deadline = Instant::now() + WAIT;
        let behind = "SELECT count(*) FROM unnest($1::text[]) AS w(name)
                      LEFT JOIN worker_checkpoints c USING (name)
                      WHERE COALESCE(c.position, 0) < (SELECT position FROM log_head)";
        let client = app.pool.get().await.expect("client");
        while client.query_one(behind, &[&followers.as_slice()]).await.expect("the checkpoints").get::<_, i64>(0) > 0 {
            assert!(Instant::now() < deadline, "the followers never reached the head");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    caught_up().await;
    let before = last_checkpoint_commit(&app).await;
    app.create_contact(&json!({"email": "passed@example.com"})).await;
    let created_at = head().await;
    wait_until_settled(&app).await;
    caught_up().await;
    for worker in followers {
        let passed = checkpoint_commits(&app, worker, before).await;
        assert!(passed.iter().any(|commit| commit.position >= created_at), "{worker} passed the create: {passed:?}");
        assert!(passed.iter().all(|commit| commit.synchronous == "off" && !commit.leased), "{worker}: {passed:?}");
    }

    // A webhook's definition: the worker enqueues nothing but writes its endpoint, so that
    // step waits for its flush.
    let before = last_checkpoint_commit(&app).await;
    let receiver = Receiver::start().await;
    hook(&app, &receiver, "upserts", "contact upserted", json!({"status": 204})).await;
    let defined_at = head().await;
    wait_until_settled(&app).await;
    let defined = checkpoint_commits(&app, "webhook_enqueue", before).await;
    let step = defined.iter().find(|commit| commit.position >= defined_at).expect("the definition's step");
    assert_eq!(step.synchronous, "on", "the endpoint's write waits for its flush: {defined:?}");
    assert!(step.leased, "the definition's step takes the lease: {defined:?}");

    // A create that fires it: the step that enqueues its delivery waits for its flush.
    let before = last_checkpoint_commit(&app).await;
    app.create_contact(&json!({"email": "fired@example.com"})).await;
    let fired_at = head().await;
    receiver.wait_for("upserts", 1, WAIT).await;
    let fired = checkpoint_commits(&app, "webhook_enqueue", before).await;
    let step = fired.iter().find(|commit| commit.position >= fired_at).expect("the delivery's step");
    assert_eq!((step.synchronous.as_str(), step.leased), ("on", true), "{fired:?}");
    projector.cancel();
}

async fn contact_schema_id(app: &TestApp) -> String {
    let schema = app.get("/schemas/contacts", ALPHA_ADMIN).await;
    schema.body["data"]["id"].as_str().expect("schema id").to_owned()
}

#[tokio::test]
async fn failures_are_retried_with_the_same_id_and_only_retryable_ones() {
    let app = TestApp::spawn().await;
    let receiver = Receiver::start().await;
    let flaky = hook(&app, &receiver, "flaky", "contact upserted", json!({"failFirst": 2, "status": 204})).await;
    let limited = hook(&app, &receiver, "limited", "contact upserted", json!({"status": 429, "retryAfter": "1"})).await;
    let timeout = hook(&app, &receiver, "timeout", "contact upserted", json!({"status": 408})).await;
    let refused = hook(&app, &receiver, "refused", "contact upserted", json!({"status": 400})).await;
    app.create_contact(&json!({"email": "retry@example.com"})).await;

    let got = receiver.wait_for("flaky", 3, WAIT).await;
    let ids: Vec<&Value> = got.iter().map(|delivery| &delivery["webhookId"]).collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "retries keep the delivery id: {ids:?}");
    assert_eq!(got.iter().map(|d| d["answered"].clone()).collect::<Vec<_>>(), [json!(500), json!(500), json!(204)]);
    assert!(got.iter().all(|delivery| delivery["verifiedWith"] == json!([0])));
    let counted = wait_for_webhook(&app, flaky["id"].as_str().expect("id"), |w| w["totalCalls"] == 3).await;
    assert_eq!((counted["failedCalls"].clone(), counted["failedCallsInARow"].clone()), (json!(2), json!(0)));
    assert!(counted["lastCallErrorMessage"].is_null(), "the last call succeeded");

    // 429 honours Retry-After (1 s, above the test schedule's 100 ms); 408 is retried.
    let limited_got = receiver.wait_for("limited", 2, WAIT).await;
    let gap =
        limited_got[1]["receivedAt"].as_f64().expect("time") - limited_got[0]["receivedAt"].as_f64().expect("time");
    assert!(gap >= 0.95, "the retry waited for Retry-After: {gap} s");
    receiver.wait_for("timeout", 2, WAIT).await;
    // The schedule has three retries: four attempts, then the delivery has failed.
    wait_until_settled(&app).await;
    assert_eq!(receiver.received("timeout").await.len(), 4);
    let exhausted = wait_for_webhook(&app, timeout["id"].as_str().expect("id"), |w| w["totalCalls"] == 4).await;
    assert_eq!(exhausted["failedCallsInARow"], 4);
    assert_eq!(exhausted["lastCallErrorMessage"], "HTTP 408 Request Timeout (retries exhausted)");
    assert_eq!(receiver.received("limited").await.len(), 4);
    // Another 4xx is not retried.
    assert_eq!(receiver.received("refused").await.len(), 1);
    let rejected = wait_for_webhook(&app, refused["id"].as_str().expect("id"), |w| w["totalCalls"] == 1).await;
    assert_eq!(rejected["failedCalls"], 1);
    assert_eq!(rejected["status"], "live", "a 400 does not pause the webhook");
    assert_eq!(limited["status"], "live");
}

#[tokio::test]
async fn a_410_pauses_the_webhook_until_its_owner_sets_it_live() {
    let app = TestApp::spawn().await;
    let receiver = Receiver::start().await;
    let webhook = hook(&app, &receiver, "gone", "contact upserted", json!({"status": 410})).await;
    let id = webhook["id"].as_str().expect("id").to_owned();
    app.create_contact(&json!({"email": "gone1@example.com"})).await;
    receiver.wait_for("gone", 1, WAIT).await;
    let paused = wait_for_webhook(&app, &id, |w| w["status"] == "paused").await;
    assert_eq!(paused["pauseReason"]["reason"], "gone");
    assert!(paused["pauseReason"]["pausedAt"].is_string());
    assert_eq!(paused["failedCallsInARow"], 1);
    // While paused, nothing is sent.
    app.create_contact(&json!({"email": "gone2@example.com"})).await;
    wait_until_settled(&app).await;
    assert_eq!(receiver.received("gone").await.len(), 1);
    // Live again: the consecutive failures and the reason are cleared, and it delivers again.
    receiver
        .endpoint("gone", &[webhook["signatureVerificationSecret"].as_str().expect("secret")], json!({"status": 204}))
        .await;
    let live = patch(&app, &format!("/webhooks/{id}"), &json!({"status": "live"})).await;
    assert_eq!(live.status, 200, "{:?}", live.body);
    assert_eq!(live.body["data"]["status"], "live");
    assert_eq!(live.body["data"]["failedCallsInARow"], 0);
    assert!(live.body["data"]["pauseReason"].is_null());
    assert_eq!(get_webhook(&app, &id).await["failedCallsInARow"], 0);
    app.create_contact(&json!({"email": "gone3@example.com"})).await;
    let got = receiver.wait_for("gone", 2, WAIT).await;
    assert_eq!(got[1]["body"]["data"]["email"], "gone3@example.com", "the delivery of the paused time was dropped");
}

#[tokio::test]
async fn pausing_drops_queued_deliveries_instead_of_holding_them() {
    let webhooks = platform::settings::WebhookSettings { retry_schedule_ms: vec![1_500, 1_500], ..test_webhooks() };
    let app = TestApp::spawn_with(Options { webhooks: Some(webhooks), ..Options::default() }).await;
    let receiver = Receiver::start().await;
    let webhook = hook(&app, &receiver, "down", "contact upserted", json!({"status": 503})).await;
    let id = webhook["id"].as_str().expect("id").to_owned();
    app.create_contact(&json!({"email": "queued@example.com"})).await;
    receiver.wait_for("down", 1, WAIT).await;
    // The retry is queued 1.5 s out; pause now.
    let paused = patch(&app, &format!("/webhooks/{id}"), &json!({"status": "paused"})).await;
    assert_eq!(paused.status, 200);
    assert!(paused.body["data"]["pauseReason"].is_null(), "paused by its owner, not by the engine");
    wait_until_settled(&app).await;
    assert_eq!(receiver.received("down").await.len(), 1, "the queued retry was not sent");
    let dropped = app
        .query_i64(&format!("SELECT count(*) FROM webhook_deliveries WHERE webhook_id = '{id}' AND state = 'dropped'"))
        .await;
    assert_eq!(dropped, 1);
    // Setting it live again does not bring the dropped delivery back.
    assert_eq!(patch(&app, &format!("/webhooks/{id}"), &json!({"status": "live"})).await.status, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.received("down").await.len(), 1);
}

#[tokio::test]
async fn a_delivery_queued_before_a_rotation_still_verifies_under_the_old_secret() {
    let app = TestApp::spawn().await;
    let receiver = Receiver::start().await;
    let webhook =
        hook(&app, &receiver, "rotating", "contact upserted", json!({"failFirst": 1, "delaySeconds": 0.5})).await;
    let id = webhook["id"].as_str().expect("id").to_owned();
    let old = webhook["signatureVerificationSecret"].as_str().expect("secret").to_owned();
    app.create_contact(&json!({"email": "rotate@example.com"})).await;
    // Rotate while the first attempt is in flight (the receiver answers after 0.5 s).
    receiver.wait_for("rotating", 1, WAIT).await;
    let rotated = app.post(&format!("/webhooks/{id}/rotate-secret"), ALPHA_ADMIN, &json!({})).await;
    assert_eq!(rotated.status, 200);
    let new = rotated.body["data"]["signatureVerificationSecret"].as_str().expect("secret").to_owned();
    receiver.endpoint("rotating", &[&old, &new], json!({"status": 204})).await;
    let got = receiver.wait_for("rotating", 2, WAIT).await;
    let retry = &got[1];
    assert_eq!(retry["webhookId"], got[0]["webhookId"]);
    assert_eq!(
        retry["verifiedWith"],
        json!([0, 1]),
        "the retry verifies under the old secret, and the new one during the grace period"
    );
    assert_eq!(retry["signatures"].as_array().map(Vec::len), Some(2));
    // A delivery enqueued after the rotation is signed with the new secret (and the old one
    // while the grace period lasts).
    app.create_contact(&json!({"email": "rotated@example.com"})).await;
    let got = receiver.wait_for("rotating", 3, WAIT).await;
    assert_eq!(got[2]["verifiedWith"], json!([0, 1]));
    receiver.endpoint("rotating", &[&new], json!({"status": 204})).await;
    app.create_contact(&json!({"email": "rotated2@example.com"})).await;
    let got = receiver.wait_for("rotating", 4, WAIT).await;
    assert_eq!(got[3]["verifiedWith"], json!([0]), "the new secret alone verifies");
}

#[tokio::test]
async fn the_circuit_breaker_pauses_a_webhook_that_keeps_failing() {
    let webhooks = platform::settings::WebhookSettings {
        retry_schedule_ms: vec![],
        breaker_failures: 3,
        breaker_window_seconds: 0,
        ..test_webhooks()
    };
    let app = TestApp::spawn_with(Options { webhooks: Some(webhooks), ..Options::default() }).await;
    let receiver = Receiver::start().await;
    let webhook = hook(&app, &receiver, "broken", "contact upserted", json!({"status": 500})).await;
    let id = webhook["id"].as_str().expect("id").to_owned();
    for index in 0..2 {
        app.create_contact(&json!({"email": format!("b{index}@example.com")})).await;
    }
    receiver.wait_for("broken", 2, WAIT).await;
    wait_until_settled(&app).await;
    assert_eq!(get_webhook(&app, &id).await["status"], "live", "two failures do not open the breaker");
    app.create_contact(&json!({"email": "b2@example.com"})).await;
    let paused = wait_for_webhook(&app, &id, |w| w["status"] == "paused").await;
    assert_eq!(paused["pauseReason"]["reason"], "failing");
    assert!(
        paused["pauseReason"]["detail"].as_str().is_some_and(|detail| detail.contains("3 consecutive")),
        "{paused}"
    );
    assert_eq!((paused["totalCalls"].clone(), paused["failedCallsInARow"].clone()), (json!(3), json!(3)));
    let events = app
        .query_i64(&format!(
            "SELECT count(*) FROM events WHERE stream_id = 'webhook-{id}' AND event_type = 'WebhookPaused.v1'"
        ))
        .await;
    assert_eq!(events, 1, "the pause is in the log, once");
}

#[tokio::test]
async fn a_custom_filter_delivers_only_matching_events_and_spends_a_credit() {
    let app = TestApp::spawn().await;
    let receiver = Receiver::start().await;
    receiver.endpoint("pro", &[], json!({})).await;
    let spent = || {
        app.query_i64("SELECT COALESCE((SELECT spent FROM ai_credit_spend WHERE space_id = (SELECT space_id FROM events WHERE space_id IS NOT NULL LIMIT 1)), 0)")
    };
    let before = spent().await;
    let response = app
        .post(
            "/webhooks",
            ALPHA_ADMIN,
            &json!({
                "url": receiver.url("pro"), "trigger": "contact upserted", "schemaId": "contacts",
                "condition": {"type": "custom filter", "requirements": "plan is pro and email ends with @acme.com"}
            }),
        )
        .await;
    assert_eq!(response.status, 201, "{:?}", response.body);
    let webhook = &response.body["data"];
    assert_eq!(webhook["condition"]["type"], "custom filter");
    assert!(webhook["condition"]["description"].as_str().is_some_and(|d| d.contains("pro")), "{webhook}");
    assert!(webhook["condition"].get("requirements").is_none() && webhook["condition"].get("expression").is_none());
    assert!(!response.body.to_string().contains("ends_with"), "the generated expression is never returned");
    assert_eq!(spent().await, before + 1, "making the filter spent one credit");
    receiver.endpoint("pro", &[webhook["signatureVerificationSecret"].as_str().expect("secret")], json!({})).await;

    app.create_contact(&json!({"email": "free@acme.com", "plan": "free"})).await;
    app.create_contact(&json!({"email": "pro@other.com", "plan": "pro"})).await;
    app.create_contact(&json!({"email": "pro@acme.com", "plan": "pro"})).await;
    wait_until_settled(&app).await;
    let got = receiver.received("pro").await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["body"]["data"]["email"], "pro@acme.com");
    let counted = get_webhook(&app, webhook["id"].as_str().expect("id")).await;
    assert_eq!(counted["totalCalls"], 1, "rejected deliveries are not counted");

    // The webhook as read goes back as a PATCH: its shown condition is no change (the filter
    // stays, no credit is spent), the counters are ignored, and only the edit applies.
    let mut shown = counted.clone();
    shown["status"] = json!("paused");
    shown["totalCalls"] = json!(1000);
    let round_trip = patch(&app, &format!("/webhooks/{}", webhook["id"].as_str().expect("id")), &shown).await;
    assert_eq!(round_trip.status, 200, "{:?}", round_trip.body);
    assert_eq!(round_trip.body["data"]["status"], "paused");
    assert_eq!(
        (&round_trip.body["data"]["condition"], &round_trip.body["data"]["totalCalls"]),
        (&counted["condition"], &json!(1))
    );
    assert_eq!(spent().await, before + 1, "an echoed condition spends no credit");
    shown["condition"]["description"] = json!("plan is free");
    let described = patch(&app, &format!("/webhooks/{}", webhook["id"].as_str().expect("id")), &shown).await;
    assert_eq!((described.status, described.code().as_str()), (400, Some("invalid_webhook")), "{:?}", described.body);

    // Requirements the provider cannot turn into a filter are refused, and a space without
    // credits gets 402.
    let unclear = app
        .post(
            "/webhooks",
            ALPHA_ADMIN,
            &json!({"url": receiver.url("pro"), "trigger": "contact upserted", "schemaId": "contacts",
            "condition": {"type": "custom filter", "requirements": "only the nice ones please"}}),
        )
        .await;
    assert_eq!((unclear.status, unclear.code().as_str()), (422, Some("ai_generation_failed")), "{:?}", unclear.body);
    assert_eq!(unclear.body["error"]["issues"][0]["key"], "condition.requirements");
    // Facts about a contact beyond the delivered data are for segments.
    for requirements in ["performed purchase", "opened an email in the last 7 days", "plan is pro and did not click"] {
        let facts = app
            .post(
                "/webhooks",
                ALPHA_ADMIN,
                &json!({"url": receiver.url("pro"), "trigger": "contact upserted", "schemaId": "contacts",
                "condition": {"type": "custom filter", "requirements": requirements}}),
            )
            .await;
        assert_eq!((facts.status, facts.code().as_str()), (422, Some("ai_generation_failed")), "{requirements}");
        assert!(facts.body["error"]["message"].as_str().is_some_and(|message| message.contains("for segments")));
    }
    let broke = app
        .post(
            "/webhooks",
            MULTI_BETA,
            &json!({"url": "https://example.com", "trigger": "contact upserted", "schemaId": "contacts",
            "condition": {"type": "custom filter", "requirements": "plan is pro"}}),
        )
        .await;
    assert_eq!((broke.status, broke.code().as_str()), (402, Some("insufficient_credits")), "{:?}", broke.body);
}

#[tokio::test]
async fn a_custom_filter_uses_the_ai_bucket() {
    let limits = platform::settings::RateLimits { ai_per_minute: 1, ..unlimited() };
    let app = TestApp::spawn_with(Options { limits: Some(limits), ..Options::default() }).await;
    let body = |requirements: &str| {
        json!({"url": "https://example.com", "trigger": "contact upserted", "schemaId": "contacts",
        "condition": {"type": "custom filter", "requirements": requirements}})
    };
    // The AI bucket's window is a minute of the clock: both requests go well inside one (the
    // second, sent in the next minute, would find the bucket open again).
    let into_minute = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_millis() % 60_000)
        .unwrap_or(0);
    if into_minute > 40_000 {
        tokio::time::sleep(Duration::from_millis(u64::try_from(60_100 - into_minute).unwrap_or(0))).await;
    }
    assert_eq!(app.post("/webhooks", ALPHA_ADMIN, &body("plan is pro")).await.status, 201);
    let limited = app.post("/webhooks", ALPHA_ADMIN, &body("plan is free")).await;
    assert_eq!((limited.status, limited.code().as_str()), (429, Some("rate_limit_exceeded")));
    let plain = app
        .post(
            "/webhooks",
            ALPHA_ADMIN,
            &json!({"url": "https://example.com", "trigger": "contact upserted", "schemaId": "contacts"}),
        )
        .await;
    assert_eq!(plain.status, 201, "a webhook without a custom filter counts in the write bucket");
}

#[tokio::test]
async fn events_fire_webhooks_when_they_become_ready() {
    let app = TestApp::spawn().await;
    let receiver = Receiver::start().await;
    receiver.endpoint("fired", &[], json!({})).await;
    let webhook =
        create_webhook(&app, &json!({"url": receiver.url("fired"), "trigger": "event fired", "schemaId": "purchase"}))
            .await;
    receiver.endpoint("fired", &[webhook["signatureVerificationSecret"].as_str().expect("secret")], json!({})).await;
    let fired =
        app.post("/events/purchase", ALPHA_ADMIN, &json!({"eventId": "order-1", "amount": 12.5, "item": "book"})).await;
    assert_eq!(fired.status, 202, "{:?}", fired.body);
    let got = receiver.wait_for("fired", 1, WAIT).await;
    assert_eq!(got[0]["verifiedWith"], json!([0]));
    let data = &got[0]["body"]["data"];
    assert_eq!(got[0]["body"]["type"], "event.fired");
    assert_eq!(data["eventId"], "order-1");
    assert_eq!(data["readinessState"], "ready");
    assert_eq!(data["data"]["amount"], 12.5);
    assert_eq!(data["id"], fired.body["data"]["id"]);

    // A custom filter reads an event's values as it reads a record's.
    receiver.endpoint("big", &[], json!({})).await;
    let big = create_webhook(
        &app,
        &json!({"url": receiver.url("big"), "trigger": "event fired", "schemaId": "purchase",
        "condition": {"type": "custom filter", "requirements": "amount is over 100"}}),
    )
    .await;
    receiver.endpoint("big", &[big["signatureVerificationSecret"].as_str().expect("secret")], json!({})).await;
    for (event_id, amount) in [("small-1", 20.0), ("big-1", 250.0)] {
        let fired = app.post("/events/purchase", ALPHA_ADMIN, &json!({"eventId": event_id, "amount": amount})).await;
        assert_eq!(fired.status, 202);
    }
    // Readiness may wait for preparation (AI auto-fill); then the deliveries settle.
    app.wait_for_workers().await;
    wait_until_settled(&app).await;
    let got = receiver.received("big").await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["body"]["data"]["eventId"], "big-1");
}

/// The environment of projector processes that deliver to the loopback receiver quickly.
fn delivery_env(workers: &str) -> Vec<(&'static str, String)> {
    vec![
        ("APP__PROJECTOR__WORKERS", workers.to_owned()),
        ("APP__WEBHOOKS__ALLOW_LOOPBACK", "true".to_owned()),
        ("APP__WEBHOOKS__ATTEMPT_TIMEOUT_MS", "1500".to_owned()),
        ("APP__WEBHOOKS__RETRY_SCHEDULE_MS", "[100,200,400,800,1600,3200]".to_owned()),
    ]
}

#[tokio::test]
async fn nothing_is_lost_when_worker_processes_are_killed_and_repeats_stay_in_the_window() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let everything = "read_models,webhook_enqueue,webhook_delivery,preparation,eraser,maintenance";
    let mut main = spawn_binary("projector", &["run"], &app.database_url, &delivery_env(everything));
    let _second = spawn_binary("projector", &["run"], &app.database_url, &delivery_env("webhook_delivery"));
    let receiver = Receiver::start().await;
    receiver.endpoint("load", &[], json!({})).await;
    let webhook = create_webhook(
        &app,
        &json!({"url": receiver.url("load"), "trigger": "contact upserted", "schemaId": "contacts"}),
    )
    .await;
    let secret = webhook["signatureVerificationSecret"].as_str().expect("secret").to_owned();
    // Slow enough that attempts are in flight when the process dies.
    receiver.endpoint("load", &[&secret], json!({"status": 204, "delaySeconds": 0.05})).await;

    const CONTACTS: usize = 120;
    let writers: Vec<_> = (0..4)
        .map(|writer| {
            let (http, url) = (app.http.clone(), app.command_url.clone());
            tokio::spawn(async move {
                for index in 0..CONTACTS / 4 {
                    let response = http
                        .post(format!("{url}/schemas/contacts/records"))
                        .bearer_auth(ALPHA_ADMIN)
                        .json(&json!({"email": format!("load-{writer}-{index}@example.com")}))
                        .send()
                        .await
                        .expect("sent");
                    assert_eq!(response.status().as_u16(), 201);
                }
            })
        })
        .collect();
    // Kill the process that enqueues (and delivers) mid-load, without warning.
    receiver.wait_for("load", 20, WAIT).await;
    let before_kill = receiver.ids("load").await;
    assert!(
        before_kill.values().all(|count| *count == 1),
        "two workers never send one delivery twice: {before_kill:?}"
    );
    assert!(before_kill.len() < CONTACTS / 2, "the kill comes mid-load");
    main.0.kill().expect("kill -9");
    main.0.wait().expect("reaped");
    let in_flight = app
        .query_i64("SELECT count(*) FROM webhook_deliveries WHERE state = 'pending' AND leased_until IS NOT NULL")
        .await;
    for writer in writers {
        writer.await.expect("writer");
    }
    let _restarted = spawn_binary("projector", &["run"], &app.database_url, &delivery_env(everything));

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ids = receiver.ids("load").await;
        if ids.len() >= CONTACTS {
            break;
        }
        assert!(Instant::now() < deadline, "only {} of {CONTACTS} deliveries arrived", ids.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_until_settled(&app).await;
    let ids = receiver.ids("load").await;
    assert_eq!(ids.len(), CONTACTS, "every acknowledged write was delivered exactly under one id each");
    let repeats: u64 = ids.values().map(|count| count - 1).sum();
    let repeats = i64::try_from(repeats).expect("small");
    // A repeat is an attempt whose 2xx the killed process did not record: at most those it
    // held leases for.
    assert!(repeats <= in_flight, "{repeats} repeats; {in_flight} attempts were in flight at the kill");
    eprintln!("killed with {} of {CONTACTS} delivered and {in_flight} in flight; {repeats} repeats", before_kill.len());
    assert!(receiver.received("load").await.iter().all(|delivery| delivery["verifiedWith"] == json!([0])));
    let delivered = app.query_i64("SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'").await;
    assert_eq!(delivered, i64::try_from(CONTACTS).expect("small"));
    // The counters, kept by several processes at once, match the attempts recorded.
    let counted = get_webhook(&app, webhook["id"].as_str().expect("id")).await;
    let attempts = app.query_i64("SELECT count(*) FROM webhook_attempts").await;
    assert_eq!(counted["totalCalls"], attempts);
    assert_eq!(counted["failedCalls"], 0);
}

#[tokio::test]
async fn an_attempt_that_outlasts_its_timeout_is_retried() {
    let webhooks = platform::settings::WebhookSettings { attempt_timeout_ms: 300, ..test_webhooks() };
    let app = TestApp::spawn_with(Options { webhooks: Some(webhooks), ..Options::default() }).await;
    let receiver = Receiver::start().await;
    let webhook = hook(&app, &receiver, "slow", "contact upserted", json!({"delaySeconds": 1.0})).await;
    app.create_contact(&json!({"email": "slow@example.com"})).await;
    receiver.wait_for("slow", 2, WAIT).await;
    let failed =
        wait_for_webhook(&app, webhook["id"].as_str().expect("id"), |w| w["failedCalls"].as_i64() >= Some(1)).await;
    assert_eq!(failed["lastCallErrorMessage"].as_str().map(|m| m.starts_with("timed out")), Some(true), "{failed}");
}

#[tokio::test]
async fn acknowledged_writes_are_delivered_when_the_command_service_is_killed() {
    let app = TestApp::spawn().await;
    let receiver = Receiver::start().await;
    hook(&app, &receiver, "writes", "contact upserted", json!({})).await;
    let start = || {
        let port = free_port();
        let env = [("APP__HTTP__PORT", port.to_string())];
        (spawn_binary("command-service", &["serve"], &app.database_url, &env), format!("http://127.0.0.1:{port}/v1"))
    };
    let (mut first, first_url) = start();
    crate::log::wait_until_listening(&app.http, &first_url).await;
    let write = |url: String, email: String| {
        let http = app.http.clone();
        async move {
            let response = http
                .post(format!("{url}/schemas/contacts/records"))
                .bearer_auth(ALPHA_ADMIN)
                .json(&json!({"email": email}))
                .send()
                .await;
            response.is_ok_and(|response| response.status().as_u16() == 201).then_some(email)
        }
    };
    // Writes in flight when the process dies: some are acknowledged, some not.
    let in_flight: Vec<_> =
        (0..40).map(|index| tokio::spawn(write(first_url.clone(), format!("killed-{index}@example.com")))).collect();
    tokio::time::sleep(Duration::from_millis(30)).await;
    first.0.kill().expect("kill -9");
    let mut acknowledged: Vec<String> = Vec::new();
    for task in in_flight {
        acknowledged.extend(task.await.expect("writer"));
    }
    let (_second, second_url) = start();
    crate::log::wait_until_listening(&app.http, &second_url).await;
    for index in 0..10 {
        acknowledged.extend(write(second_url.clone(), format!("after-{index}@example.com")).await);
    }
    assert!(acknowledged.len() >= 10);
    let deadline = Instant::now() + WAIT;
    loop {
        let received: std::collections::HashSet<String> = receiver
            .received("writes")
            .await
            .iter()
            .filter_map(|delivery| delivery["body"]["data"]["email"].as_str().map(str::to_owned))
            .collect();
        if acknowledged.iter().all(|email| received.contains(email)) {
            break;
        }
        assert!(Instant::now() < deadline, "some acknowledged writes were not delivered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_custom_filter_can_come_from_an_openai_compatible_provider() {
    let fake = crate::fake_ai::FakeAi::start().await;
    let ai = platform::settings::AiSettings::openai(&fake.url, "test-model", None, Duration::from_secs(5));
    let app = TestApp::spawn_with(Options { ai: Some(ai), ..Options::default() }).await;
    let expression = json!({"field": "plan", "op": "eq", "value": "pro"});
    let content = json!({"filter": expression}).to_string();
    fake.set_mode(crate::fake_ai::Mode::Body(json!({
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]
    })));
    let body = |requirements: &str| {
        json!({"url": "https://example.com/hook", "trigger": "contact upserted", "schemaId": "contacts",
            "condition": {"type": "custom filter", "requirements": requirements}})
    };
    let created = app.post("/webhooks", ALPHA_ADMIN, &body("only customers on the pro plan")).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    assert_eq!(created.body["data"]["condition"], json!({"type": "custom filter", "description": "plan is pro"}));
    let asked = fake.requests();
    assert_eq!(asked.len(), 1);
    assert!(asked[0].to_string().contains("only customers on the pro plan"), "the requirements reach the provider");
    // An answer that is not a valid filter is refused as unusable requirements; a provider
    // that is down is a 503 that leaves nothing behind.
    fake.set_mode(crate::fake_ai::Mode::Garbage);
    let garbage = app.post("/webhooks", ALPHA_ADMIN, &body("whatever")).await;
    assert_eq!((garbage.status, garbage.code().as_str()), (422, Some("ai_generation_failed")), "{:?}", garbage.body);
    fake.set_mode(crate::fake_ai::Mode::Status(503));
    let down = app.post("/webhooks", ALPHA_ADMIN, &body("plan is pro")).await;
    assert_eq!(down.status, 503, "{:?}", down.body);
    assert_eq!(app.get("/webhooks", ALPHA_ADMIN).await.body["pagination"]["totalCount"], 1);
}

#[tokio::test]
async fn the_delivery_log_shows_each_attempt_and_a_replay_or_a_test_sends_again() {
    let app = TestApp::spawn().await;
    let receiver = Receiver::start().await;
    let webhook = hook(&app, &receiver, "log", "contact upserted", json!({"status": 400})).await;
    let id = webhook["id"].as_str().expect("id").to_owned();
    let secret = webhook["signatureVerificationSecret"].as_str().expect("secret").to_owned();
    for index in 0..3 {
        app.create_contact(&json!({"email": format!("log{index}@example.com")})).await;
    }
    receiver.wait_for("log", 3, WAIT).await;
    wait_until_settled(&app).await;

    let page = app.get(&format!("/webhooks/{id}/deliveries?limit=2"), ALPHA_ADMIN).await;
    assert_eq!(page.status, 200, "{:?}", page.body);
    let items = page.body["data"].as_array().expect("items").clone();
    assert_eq!(items.len(), 2);
    assert_eq!(page.body["pagination"]["hasMore"], true);
    let latest = &items[0];
    assert_eq!((latest["status"].clone(), latest["type"].clone()), (json!("failed"), json!("contact.upserted")));
    assert_eq!(latest["attemptCount"], 1);
    assert_eq!(latest["attempts"][0]["statusCode"], 400);
    assert_eq!(latest["attempts"][0]["error"], "HTTP 400 Bad Request");
    assert!(latest["attempts"][0]["latencyMs"].is_u64() && latest["attempts"][0]["attemptedAt"].is_string());
    assert!(
        !page.body.to_string().contains("whsec_") && !page.body.to_string().contains("log2@"),
        "no secrets, no bodies"
    );
    let cursor = page.body["pagination"]["nextCursor"].as_str().expect("cursor");
    let rest = app.get(&format!("/webhooks/{id}/deliveries?limit=2&cursor={cursor}"), ALPHA_ADMIN).await;
    assert_eq!(rest.body["data"].as_array().map(Vec::len), Some(1));
    assert_eq!(rest.body["pagination"]["hasMore"], false);
    let bad = app.get(&format!("/webhooks/{id}/deliveries?cursor=nonsense"), ALPHA_ADMIN).await;
    assert_eq!(bad.code(), "invalid_cursor");
    assert_eq!(app.get(&format!("/webhooks/{id}/deliveries"), MULTI_BETA).await.code(), "webhook_not_found");

    // The receiver is fixed; the owner replays the failed delivery: same id, same body.
    receiver.endpoint("log", &[&secret], json!({"status": 204})).await;
    let delivery_id = latest["id"].as_str().expect("delivery id");
    let replay = app.post(&format!("/webhooks/{id}/deliveries/{delivery_id}/replay"), ALPHA_ADMIN, &json!({})).await;
    assert_eq!(replay.status, 202, "{:?}", replay.body);
    assert_eq!(replay.body["data"]["status"], "pending");
    let got = receiver.wait_for("log", 4, WAIT).await;
    assert_eq!(got[3]["webhookId"], delivery_id);
    assert_eq!(got[3]["body"], got.iter().find(|d| d["webhookId"] == delivery_id).expect("first")["body"]);
    assert_eq!(got[3]["verifiedWith"], json!([0]));
    wait_until_settled(&app).await;
    let log = app.get(&format!("/webhooks/{id}/deliveries?limit=1"), ALPHA_ADMIN).await;
    assert_eq!(log.body["data"][0]["status"], "delivered");
    assert_eq!(log.body["data"][0]["attemptCount"], 2);
    assert_eq!(log.body["data"][0]["attempts"][1]["statusCode"], 204);
    let unknown = app.post(&format!("/webhooks/{id}/deliveries/msg_unknown/replay"), ALPHA_ADMIN, &json!({})).await;
    assert_eq!((unknown.status, unknown.code().as_str()), (404, Some("webhook_delivery_not_found")));

    // A test delivery.
    let test = app.post(&format!("/webhooks/{id}/test"), ALPHA_ADMIN, &json!({})).await;
    assert_eq!(test.status, 202, "{:?}", test.body);
    let got = receiver.wait_for("log", 5, WAIT).await;
    assert_eq!(got[4]["body"]["type"], "webhook.test");
    assert_eq!(got[4]["webhookId"], test.body["data"]["id"]);
    assert_eq!(got[4]["verifiedWith"], json!([0]));
    let foreign = app.post(&format!("/webhooks/{id}/test"), MULTI_BETA, &json!({})).await;
    assert_eq!(foreign.code(), "webhook_not_found");
}

#[tokio::test]
async fn acknowledged_writes_are_delivered_across_a_kill_9_of_postgresql() {
    let cluster = PrivateCluster::start();
    let url = cluster.migrated_platform().await;
    let everything = "read_models,webhook_enqueue,webhook_delivery,preparation,eraser,maintenance";
    let _projector = spawn_binary("projector", &["run"], &url, &delivery_env(everything));
    let port = free_port();
    let command_env = [("APP__HTTP__PORT", port.to_string()), ("APP__WEBHOOKS__ALLOW_LOOPBACK", "true".to_owned())];
    let _command = spawn_binary("command-service", &["serve"], &url, &command_env);
    apply_file(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/workspace.json"), &url);
    let base = format!("http://127.0.0.1:{port}/v1");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("client");
    crate::log::wait_until_listening(&http, &base).await;
    let receiver = Receiver::start().await;
    receiver.endpoint("crash", &[], json!({})).await;
    let created = http
        .post(format!("{base}/webhooks"))
        .bearer_auth(ALPHA_ADMIN)
        .json(&json!({"url": receiver.url("crash"), "trigger": "contact upserted", "schemaId": "contacts"}))
        .send()
        .await
        .expect("sent");
    assert_eq!(created.status().as_u16(), 201);

    // Writers run before, during and after the crash; only 201s count as acknowledged.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|writer| {
            let (http, base, stop) = (http.clone(), base.clone(), stop.clone());
            tokio::spawn(async move {
                let (mut acknowledged, mut refused) = (Vec::new(), 0);
                let mut index = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    index += 1;
                    let email = format!("crash-{writer}-{index}@example.com");
                    let sent = http
                        .post(format!("{base}/schemas/contacts/records"))
                        .bearer_auth(ALPHA_ADMIN)
                        .json(&json!({"email": email}))
                        .send()
                        .await;
                    match sent {
                        Ok(response) if response.status().as_u16() == 201 => acknowledged.push(email),
                        _ => {
                            refused += 1;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
                (acknowledged, refused)
            })
        })
        .collect();
    receiver.wait_for("crash", 10, WAIT).await;
    cluster.kill9();
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.pg_start();
    // Let the writers succeed again for a while after the restart.
    let restarted_at = receiver.received("crash").await.len();
    receiver.wait_for("crash", restarted_at + 20, Duration::from_secs(60)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut acknowledged, mut refused) = (Vec::new(), 0);
    for writer in writers {
        let (written, failed) = writer.await.expect("writer");
        acknowledged.extend(written);
        refused += failed;
    }
    assert!(refused > 0, "the writers met the outage");
    eprintln!("{} writes acknowledged, {refused} refused during the outage", acknowledged.len());

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let received: std::collections::HashSet<String> = receiver
            .received("crash")
            .await
            .iter()
            .filter_map(|delivery| delivery["body"]["data"]["email"].as_str().map(str::to_owned))
            .collect();
        let missing: Vec<&String> = acknowledged.iter().filter(|email| !received.contains(*email)).collect();
        if missing.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "{} acknowledged writes were never delivered: {missing:?}", missing.len());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ids = receiver.ids("crash").await;
    assert!(ids.len() >= acknowledged.len(), "one delivery id per acknowledged write at least");
}
