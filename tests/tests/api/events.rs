//! Business events: firing, duplicates and conflicts, batches, readiness, admission and the
//! ready-events list.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::*;

/// Polls the status of an event until it leaves `pending` (or 20 s pass).
async fn settled_status(app: &TestApp, schema: &str, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = app.get(&format!("/events/{schema}/{id}/status"), ALPHA_ADMIN).await;
        assert_eq!(status.status, 200, "{:?}", status.body);
        if status.body["data"]["readinessState"] != "pending" || Instant::now() > deadline {
            return status.body["data"].clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn ago(seconds: i64) -> String {
    (chrono::Utc::now() - chrono::Duration::seconds(seconds)).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[tokio::test]
async fn a_fire_answers_a_durable_receipt_and_a_ready_event_is_listed() {
    let app = TestApp::spawn().await;
    let fired = app.post("/events/signup", ALPHA_ADMIN, &json!({"eventId": "order-1", "plan": "pro", "id": "x"})).await;
    assert_eq!(fired.status, 202, "{:?}", fired.body);
    let receipt = &fired.body["data"];
    assert_eq!(receipt["accepted"], 1);
    assert_eq!(receipt["eventId"], "order-1");
    assert_eq!(receipt["isDuplicate"], false);
    assert_eq!(receipt["readinessAtAcceptance"], "ready");
    let id = receipt["id"].as_str().expect("id");
    assert!(id.starts_with("ev_"), "{id}");

    let status = app.get(&format!("/events/signup/{id}/status"), ALPHA_ADMIN).await;
    assert_eq!(status.status, 200, "{:?}", status.body);
    let data = &status.body["data"];
    assert_eq!(data["id"], id);
    assert_eq!(data["readinessState"], "ready");
    assert_eq!(data["data"], json!({"plan": "pro"}));
    assert_eq!(data["definitionRevision"], "1");
    assert_eq!(data["readyAt"], data["receivedAt"]);
    assert_eq!(data["occurredAt"], data["receivedAt"], "occurredAt defaults to acceptance");
    assert_eq!(data["contactId"], Value::Null);

    let list = app.get("/events?schema=signup", ALPHA_ADMIN).await;
    assert_eq!(list.status, 200, "{:?}", list.body);
    let items = list.body["data"].as_array().expect("items");
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["id"], id);
    assert_eq!(items[0]["schemaSlug"], "signup");
    assert_eq!(items[0]["eventId"], "order-1");
    assert_eq!(list.body["pagination"], json!({"limit": 50, "nextCursor": null, "hasMore": false}));

    // A generated eventId when it is omitted or null: each such fire is a new occurrence.
    let a = app.post("/events/signup", ALPHA_ADMIN, &json!({"plan": "pro"})).await;
    let b = app.post("/events/signup", ALPHA_ADMIN, &json!({"plan": "pro", "eventId": null})).await;
    assert_eq!((a.status, b.status), (202, 202));
    assert!(uuid::Uuid::parse_str(a.body["data"]["eventId"].as_str().expect("generated")).is_ok());
    assert_ne!(a.body["data"]["id"], b.body["data"]["id"]);

    // Another space sees none of it.
    let other = app.get(&format!("/events/signup/{id}/status"), MULTI_BETA).await;
    assert_eq!(other.status, 404);
    let missing = app.get("/events/signup/ev_missing/status", ALPHA_ADMIN).await;
    assert_eq!((missing.status, missing.code().as_str()), (404, Some("event_not_found")));
    let wrong_schema = app.get(&format!("/events/purchase/{id}/status"), ALPHA_ADMIN).await;
    assert_eq!(wrong_schema.status, 404);
    let no_schema = app.get(&format!("/events/nope/{id}/status"), ALPHA_ADMIN).await;
    assert_eq!((no_schema.status, no_schema.code().as_str()), (404, Some("schema_not_found")));
}

#[tokio::test]
async fn a_retry_recovers_the_receipt_and_changed_input_conflicts() {
    let app = TestApp::spawn().await;
    let at = ago(60);
    let body = json!({"eventId": "e-1", "plan": "pro", "occurredAt": at});
    let first = app.post("/events/signup", ALPHA_ADMIN, &body).await;
    assert_eq!(first.status, 202);
    // Same input with keys reordered, and the same instant written in another offset.
    let same_instant = chrono::DateTime::parse_from_rfc3339(&at)
        .expect("time")
        .with_timezone(&chrono::FixedOffset::east_opt(3600).expect("offset"))
        .to_rfc3339();
    let retry = app
        .post("/events/signup", ALPHA_ADMIN, &json!({"occurredAt": same_instant, "plan": "pro", "eventId": "e-1"}))
        .await;
    assert_eq!(retry.status, 202, "{:?}", retry.body);
    assert_eq!(retry.body["data"]["isDuplicate"], true);
    assert_eq!(retry.body["data"]["id"], first.body["data"]["id"]);
    assert_eq!(retry.body["data"]["readinessAtAcceptance"], "ready");

    let changed =
        app.post("/events/signup", ALPHA_ADMIN, &json!({"eventId": "e-1", "plan": "free", "occurredAt": at})).await;
    assert_eq!((changed.status, changed.code().as_str()), (409, Some("event_id_conflict")));
    let moved =
        app.post("/events/signup", ALPHA_ADMIN, &json!({"eventId": "e-1", "plan": "pro", "occurredAt": ago(30)})).await;
    assert_eq!((moved.status, moved.code().as_str()), (409, Some("event_id_conflict")));
    // The same eventId in another event schema is another occurrence.
    let elsewhere =
        app.post("/events/purchase", ALPHA_ADMIN, &json!({"eventId": "e-1", "amount": 3, "category": "books"})).await;
    assert_eq!(elsewhere.status, 202);
    assert_eq!(elsewhere.body["data"]["isDuplicate"], false);
    assert_eq!(app.query_i64("SELECT count(*) FROM events WHERE event_type = 'EventAccepted.v1'").await, 2);
}

#[tokio::test]
async fn many_concurrent_fires_with_one_event_id_admit_exactly_one() {
    let app = TestApp::spawn().await;
    let body = json!({"eventId": "race", "plan": "pro"});
    let fires = (0..20).map(|_| app.post("/events/signup", ALPHA_ADMIN, &body));
    let responses = futures_util::future::join_all(fires).await;
    assert!(responses.iter().all(|r| r.status == 202), "{:?}", responses.iter().map(|r| &r.body).collect::<Vec<_>>());
    let originals = responses.iter().filter(|r| r.body["data"]["isDuplicate"] == false).count();
    assert_eq!(originals, 1);
    let ids: std::collections::BTreeSet<&str> =
        responses.iter().filter_map(|r| r.body["data"]["id"].as_str()).collect();
    assert_eq!(ids.len(), 1);
    assert_eq!(app.query_i64("SELECT count(*) FROM events WHERE event_type = 'EventAccepted.v1'").await, 1);
    assert_eq!(app.query_i64("SELECT receipts FROM event_admission WHERE scope = 'fleet'").await, 1);
}

#[tokio::test]
async fn invalid_fires_are_refused_with_clear_errors() {
    let app = TestApp::spawn().await;
    let contact = app.create_contact(&json!({"email": "ada@example.com"})).await;
    let contact_id = contact["id"].as_str().expect("id");
    let company = app.post("/schemas/companies/records", ALPHA_ADMIN, &json!({"externalId": "c1"})).await;
    let object_id = company.body["data"]["id"].as_str().expect("object id");
    let cases = [
        (json!({"occurredAt": ago(367 * 24 * 3600)}), 400, "invalid_occurred_at"),
        (json!({"occurredAt": ago(-6 * 60)}), 400, "invalid_occurred_at"),
        (json!({"occurredAt": "tomorrow"}), 400, "invalid_occurred_at"),
        (json!({"contactId": contact_id, "objectId": object_id}), 400, "invalid_event_subject"),
        (json!({"readinessState": "ready"}), 400, "reserved_field"),
        (json!({"readyAt": ago(1)}), 400, "reserved_field"),
        (json!({"nope": 1}), 400, "unknown_attribute"),
        (json!({"plan": 5}), 400, "invalid_attribute_value"),
        (json!({"plan": "x".repeat(300 * 1024)}), 400, "event_input_too_large"),
        (json!({"contactId": "con_missing"}), 404, "record_not_found"),
        (json!({"contactId": object_id}), 404, "record_not_found"),
        (json!({"objectId": contact_id}), 404, "record_not_found"),
    ];
    for (body, status, code) in cases {
        let response = app.post("/events/signup", ALPHA_ADMIN, &body).await;
        assert_eq!((response.status, response.code().as_str()), (status, Some(code)), "{body:?}");
    }
    let required = app.post("/events/purchase", ALPHA_ADMIN, &json!({"item": "book"})).await;
    assert_eq!(required.code(), "required_attribute_missing");
    let not_event = app.post("/events/contacts", ALPHA_ADMIN, &json!({})).await;
    assert_eq!((not_event.status, not_event.code().as_str()), (404, Some("schema_not_found")));
    let read_only = app.post("/events/signup", ALPHA_NON_PAID_ADMIN, &json!({})).await;
    assert_eq!(read_only.status, 403);
    let malformed = app
        .send(
            app.request(reqwest::Method::POST, "/events/signup", Some(ALPHA_ADMIN))
                .header("content-type", "application/json")
                .body("{"),
        )
        .await;
    assert_eq!(malformed.code(), "malformed_json");
    // Subjects in the space are accepted; nothing of the refused fires was written.
    let about = app.post("/events/signup", ALPHA_MEMBER, &json!({"contactId": contact_id})).await;
    assert_eq!(about.status, 202, "{:?}", about.body);
    let object = app
        .post("/events/signup", ALPHA_ADMIN, &json!({"objectId": object_id, "occurredAt": ago(365 * 24 * 3600)}))
        .await;
    assert_eq!(object.status, 202, "{:?}", object.body);
    assert_eq!(app.query_i64("SELECT count(*) FROM events WHERE event_type = 'EventAccepted.v1'").await, 2);
    let subject = app
        .query_i64(&format!(
            "SELECT count(*) FROM events WHERE event_type = 'EventAccepted.v1' AND subject_id = '{contact_id}'"
        ))
        .await;
    assert_eq!(subject, 1);
}

#[tokio::test]
async fn a_continue_batch_commits_each_item_on_its_own() {
    let app = TestApp::spawn().await;
    let existing = app.post("/events/signup", ALPHA_ADMIN, &json!({"eventId": "old", "plan": "pro"})).await;
    assert_eq!(existing.status, 202);
    let batch = json!({"events": [
        {"eventId": "b-1", "plan": "pro"},
        {"eventId": "b-2", "nope": true},
        {"eventId": "old", "plan": "pro"},
        {"eventId": "old", "plan": "free"},
        {"eventId": "b-1", "plan": "pro"},
        "not an object",
        {"eventId": "b-3"},
    ]});
    let response = app.post("/events/signup/batch", ALPHA_ADMIN, &batch).await;
    assert_eq!(response.status, 200, "{:?}", response.body);
    let results = response.body["data"]["results"].as_array().expect("results");
    let statuses: Vec<&str> = results.iter().filter_map(|r| r["status"].as_str()).collect();
    assert_eq!(statuses, ["accepted", "failed", "accepted", "failed", "accepted", "failed", "accepted"]);
    assert_eq!(results[0]["isDuplicate"], false);
    assert_eq!(results[1]["error"]["code"], "unknown_attribute");
    assert_eq!(results[2]["isDuplicate"], true);
    assert_eq!(results[2]["id"], existing.body["data"]["id"]);
    assert_eq!(results[3]["error"]["code"], "event_id_conflict");
    assert_eq!(results[4]["isDuplicate"], true, "a repeat inside the batch is a duplicate of the first");
    assert_eq!(results[4]["id"], results[0]["id"]);
    assert_eq!(results[6]["readinessAtAcceptance"], "ready");
    assert!(results.iter().enumerate().all(|(i, r)| r["index"] == i));
    assert_eq!(response.body["data"]["summary"], json!({"accepted": 4, "failed": 3}));
    assert_eq!(app.query_i64("SELECT count(*) FROM events WHERE event_type = 'EventAccepted.v1'").await, 3);

    for bad in [json!({"events": []}), json!({"events": vec![json!({}); 501]})] {
        let response = app.post("/events/signup/batch", ALPHA_ADMIN, &bad).await;
        assert_eq!((response.status, response.code().as_str()), (400, Some("invalid_batch_size")));
    }
    for bad in
        [json!({}), json!({"events": {}}), json!({"events": [{}], "onError": "skip"}), json!({"events": [{}], "x": 1})]
    {
        let response = app.post("/events/signup/batch", ALPHA_ADMIN, &bad).await;
        assert_eq!((response.status, response.code().as_str()), (400, Some("invalid_batch")), "{bad:?}");
    }
}

#[tokio::test]
async fn an_aborted_batch_leaves_no_trace() {
    let app = TestApp::spawn().await;
    let existing = app.post("/events/signup", ALPHA_ADMIN, &json!({"eventId": "kept", "plan": "pro"})).await;
    app.wait_for_projections().await;
    let head = app.query_i64("SELECT position FROM log_head").await;
    let batch = json!({"onError": "abort", "events": [
        {"eventId": "a-1", "plan": "pro"},
        {"eventId": "kept", "plan": "pro"},
        {"eventId": "a-1", "plan": "pro"},
        {"eventId": "a-3", "plan": 7},
        {"eventId": "a-4", "plan": "pro"},
    ]});
    let response = app.post("/events/signup/batch", ALPHA_ADMIN, &batch).await;
    assert_eq!(response.status, 422, "{:?}", response.body);
    assert!(response.body.get("error").is_none(), "a data result, not the error envelope");
    let data = &response.body["data"];
    assert_eq!(data["failedIndex"], 3);
    let statuses: Vec<&str> =
        data["results"].as_array().expect("results").iter().filter_map(|r| r["status"].as_str()).collect();
    assert_eq!(statuses, ["rolled_back", "accepted", "rolled_back", "failed"], "later items are not attempted");
    assert_eq!(data["results"][1]["id"], existing.body["data"]["id"], "an existing duplicate stays accepted");
    assert_eq!(data["results"][3]["error"]["code"], "invalid_attribute_value");
    assert_eq!(data["summary"], json!({"accepted": 1, "failed": 1}));
    // Nothing new in the log, the receipts or the read model; the rolled-back ids are free.
    assert_eq!(app.query_i64("SELECT position FROM log_head").await, head);
    assert_eq!(app.query_i64("SELECT count(*) FROM event_receipts").await, 1);
    let list = app.get("/events?schema=signup", ALPHA_ADMIN).await;
    assert_eq!(list.body["data"].as_array().map(Vec::len), Some(1));
    let later = app.post("/events/signup", ALPHA_ADMIN, &json!({"eventId": "a-1", "plan": "free"})).await;
    assert_eq!(later.body["data"]["isDuplicate"], false);

    // Without a failure the whole batch is accepted at once.
    let good = json!({"onError": "abort", "events": [{"eventId": "g-1"}, {"eventId": "g-2"}, {"eventId": "g-1"}]});
    let response = app.post("/events/signup/batch", ALPHA_ADMIN, &good).await;
    assert_eq!(response.status, 200, "{:?}", response.body);
    assert_eq!(response.body["data"]["summary"], json!({"accepted": 3, "failed": 0}));
    assert_eq!(response.body["data"]["results"][2]["isDuplicate"], true);
}

fn tight(rate: f64, burst: f64, pending: i64, receipts: i64) -> platform::settings::AdmissionLimits {
    let open = unlimited_admission().fleet;
    let schema = platform::settings::ScopeLimits { rate, burst, pending, receipts };
    platform::settings::AdmissionLimits { fleet: open, space: open, schema }
}

#[tokio::test]
async fn admission_limits_the_rate_per_schema_and_duplicates_cost_nothing() {
    let app = TestApp::spawn_with(Options { admission: Some(tight(0.5, 3.0, 100, 100)), ..Options::default() }).await;
    for n in 0..3 {
        let fired = app.post("/events/signup", ALPHA_ADMIN, &json!({"eventId": format!("r-{n}")})).await;
        assert_eq!(fired.status, 202, "{:?}", fired.body);
    }
    let refused = app.post("/events/signup", ALPHA_ADMIN, &json!({"eventId": "r-3"})).await;
    assert_eq!((refused.status, refused.code().as_str()), (429, Some("event_rate_limited")));
    let retry_after: u64 = refused.header("retry-after").and_then(|v| v.parse().ok()).expect("Retry-After seconds");
    assert!((1..=2).contains(&retry_after), "{retry_after}");
    // A duplicate recovers its receipt although the bucket is empty.
    let duplicate = app.post("/events/signup", ALPHA_ADMIN, &json!({"eventId": "r-0"})).await;
    assert_eq!(duplicate.status, 202);
    assert_eq!(duplicate.body["data"]["isDuplicate"], true);
    // Another key of the same space shares the budget; another schema has its own.
    let other_key = app.post("/events/signup", ALPHA_ADMIN_SECOND, &json!({"eventId": "r-4"})).await;
    assert_eq!(other_key.code(), "event_rate_limited");
    let other_schema = app.post("/events/purchase", ALPHA_ADMIN, &json!({"amount": 1, "category": "books"})).await;
    assert_eq!(other_schema.status, 202);
    // Batch items report the delay in milliseconds.
    let batch = app.post("/events/signup/batch", ALPHA_ADMIN, &json!({"events": [{"eventId": "r-5"}]})).await;
    let item = &batch.body["data"]["results"][0];
    assert_eq!(item["error"]["code"], "event_rate_limited");
    assert!(item["retryAfterMilliseconds"].as_u64().is_some_and(|ms| ms > 0 && ms <= 2000), "{item:?}");
    // The bucket refills at the sustained rate.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let refilled = app.post("/events/signup", ALPHA_ADMIN, &json!({"eventId": "r-6"})).await;
    assert_eq!(refilled.status, 202, "{:?}", refilled.body);
}

/// Concurrent fires are written in shared batches; whatever the batching, the buckets admit
/// exactly their burst, and the fires of a schema with room are all admitted beside them.
#[tokio::test]
async fn concurrent_fires_are_admitted_exactly_up_to_the_burst() {
    let app = TestApp::spawn_with(Options { admission: Some(tight(0.001, 8.0, 100, 100)), ..Options::default() }).await;
    let contact = app.create_contact(&json!({"email": "many@example.com"})).await;
    let contact_id = contact["id"].as_str().expect("id").to_owned();
    let (app, contact_id) = (&app, &contact_id);
    let signups = (0..30).map(|n| {
        let body = if n % 2 == 0 {
            json!({"eventId": format!("s-{n}"), "contactId": contact_id})
        } else {
            json!({"eventId": format!("s-{n}")})
        };
        async move { ("signup", app.post("/events/signup", ALPHA_ADMIN, &body).await) }
    });
    let purchases = (0..8).map(|n| {
        let body = json!({"eventId": format!("p-{n}"), "amount": n, "category": "books", "contactId": contact_id});
        async move { ("purchase", app.post("/events/purchase", ALPHA_ADMIN, &body).await) }
    });
    let (signups, purchases) =
        tokio::join!(futures_util::future::join_all(signups), futures_util::future::join_all(purchases));
    let outcomes = |responses: &[(&str, TestResponse)]| {
        let accepted = responses.iter().filter(|(_, r)| r.status == 202).count();
        let limited = responses.iter().filter(|(_, r)| r.code() == "event_rate_limited").count();
        (accepted, limited)
    };
    assert_eq!(outcomes(&signups), (8, 22), "the burst of 8, and not one more");
    assert_eq!(outcomes(&purchases), (8, 0), "another schema's bucket is its own");
    assert_eq!(app.query_i64("SELECT count(*) FROM event_receipts").await, 16);
    assert_eq!(app.query_i64("SELECT count(*) FROM events WHERE event_type = 'EventAccepted.v1'").await, 16);
    assert_eq!(app.query_i64("SELECT receipts FROM event_admission WHERE scope = 'fleet'").await, 16);
    let left =
        app.query_i64("SELECT floor(max(tokens))::bigint FROM event_admission WHERE scope LIKE 'schema:%'").await;
    assert_eq!(left, 0, "both buckets are spent, each admission taken once");
}

#[tokio::test]
async fn an_aborted_batch_over_the_burst_fails_at_the_first_item_over_it() {
    let app = TestApp::spawn_with(Options { admission: Some(tight(0.001, 2.0, 100, 100)), ..Options::default() }).await;
    let events: Vec<Value> = (0..4).map(|n| json!({"eventId": format!("x-{n}")})).collect();
    let response = app.post("/events/signup/batch", ALPHA_ADMIN, &json!({"onError": "abort", "events": events})).await;
    assert_eq!(response.status, 422, "{:?}", response.body);
    assert_eq!(response.body["data"]["failedIndex"], 2);
    assert_eq!(response.body["data"]["results"][2]["error"]["code"], "event_rate_limited");
    assert!(response.body["data"]["results"][2]["retryAfterMilliseconds"].as_u64().is_some());
    assert_eq!(app.query_i64("SELECT count(*) FROM event_receipts").await, 0);
    // The rolled-back items gave their tokens back.
    let continued = app
        .post(
            "/events/signup/batch",
            ALPHA_ADMIN,
            &json!({"events": [{"eventId": "y-1"}, {"eventId": "y-2"}, {"eventId": "y-3"}]}),
        )
        .await;
    assert_eq!(continued.body["data"]["summary"], json!({"accepted": 2, "failed": 1}), "{:?}", continued.body);
}

#[tokio::test]
async fn the_backlog_and_receipt_caps_refuse_until_capacity_frees() {
    // No projector, so no preparation: pending events stay pending.
    let mut options = Options::without_projector();
    options.admission = Some(tight(1000.0, 1000.0, 1, 3));
    let app = TestApp::spawn_with(options).await;
    let pending = app.post("/events/purchase", ALPHA_ADMIN, &json!({"amount": 1})).await;
    assert_eq!(pending.body["data"]["readinessAtAcceptance"], "pending");
    let full = app.post("/events/purchase", ALPHA_ADMIN, &json!({"amount": 2})).await;
    assert_eq!((full.status, full.code().as_str()), (429, Some("event_backlog_full")));
    assert_eq!(full.header("retry-after"), Some("30"));
    // Ready events do not need the backlog.
    let ready = app.post("/events/purchase", ALPHA_ADMIN, &json!({"amount": 2, "category": "games"})).await;
    assert_eq!(ready.status, 202);
    let third = app.post("/events/purchase", ALPHA_ADMIN, &json!({"amount": 3, "category": "games"})).await;
    assert_eq!(third.status, 202);
    let capped = app.post("/events/purchase", ALPHA_ADMIN, &json!({"amount": 4, "category": "games"})).await;
    assert_eq!((capped.status, capped.code().as_str()), (429, Some("event_receipt_limit")));
    assert_eq!(capped.header("retry-after"), Some("3600"));
    // Receipts past their retention (and out of the backlog) retire and free capacity.
    let client = app.pool.get().await.expect("client");
    let retired = projector::workers::maintenance::retire_receipts(&client, Duration::ZERO, 100).await.expect("retire");
    assert_eq!(retired, 2, "the pending receipt is kept");
    let freed = app.post("/events/purchase", ALPHA_ADMIN, &json!({"amount": 4, "category": "games"})).await;
    assert_eq!(freed.status, 202, "{:?}", freed.body);
    assert_eq!(app.query_i64("SELECT receipts FROM event_admission WHERE scope LIKE 'schema:%'").await, 2);
}

#[tokio::test]
async fn two_command_service_instances_share_the_fleet_and_space_budgets() {
    let mut limits = unlimited_admission();
    limits.fleet = platform::settings::ScopeLimits { rate: 0.001, burst: 6.0, pending: 100, receipts: 100 };
    limits.space = platform::settings::ScopeLimits { rate: 0.001, burst: 4.0, pending: 100, receipts: 100 };
    let app = TestApp::spawn_with(Options { admission: Some(limits), ..Options::default() }).await;
    let mut settings = platform::settings::Settings::for_database(&app.database_url);
    settings.rate_limits = unlimited();
    settings.events.admission = limits;
    let second = command_service::Application::build(settings).await.expect("second instance");
    let second_url = format!("http://127.0.0.1:{}/v1", second.port());
    tokio::spawn(second.run_until_stopped());
    let fire = async |n: usize, path: &str, key: &str, body: Value| {
        let base = if n.is_multiple_of(2) { app.command_url.clone() } else { second_url.clone() };
        app.send(app.http.post(format!("{base}{path}")).bearer_auth(key).json(&body)).await.status
    };
    // Alpha's space budget (4) is shared by both instances and both keys.
    let mut alpha = Vec::new();
    for n in 0..8_usize {
        let key = if n.is_multiple_of(3) { ALPHA_ADMIN } else { ALPHA_MEMBER };
        alpha.push(fire(n, "/events/signup", key, json!({"eventId": format!("a-{n}")})).await);
    }
    assert_eq!(alpha.iter().filter(|s| **s == 202).count(), 4, "{alpha:?}");
    // Beta's space has room, but the fleet (6) has only 2 left.
    let mut beta = Vec::new();
    for n in 0..4 {
        beta.push(fire(n, "/events/visit", MULTI_BETA, json!({"eventId": format!("b-{n}"), "topic": "t"})).await);
    }
    assert_eq!(beta, [202, 202, 429, 429]);
}

#[tokio::test]
async fn idempotency_keys_play_no_part_in_firing_events() {
    let app = TestApp::spawn().await;
    let fire = |body: Value| {
        app.send(
            app.request(reqwest::Method::POST, "/events/signup", Some(ALPHA_ADMIN))
                .header("Idempotency-Key", "k-1")
                .json(&body),
        )
    };
    let first = fire(json!({"eventId": "i-1"})).await;
    let second = fire(json!({"eventId": "i-2"})).await;
    assert_eq!((first.status, second.status), (202, 202), "{:?}", second.body);
    assert_ne!(first.body["data"]["id"], second.body["data"]["id"]);
    assert_eq!(app.query_i64("SELECT count(*) FROM idempotency_records").await, 0);
}

#[tokio::test]
async fn a_pending_event_is_prepared_then_listed() {
    let app = TestApp::spawn().await;
    let fired =
        app.post("/events/purchase", ALPHA_ADMIN, &json!({"eventId": "p-1", "amount": 12.5, "item": "a novel"})).await;
    assert_eq!(fired.status, 202, "{:?}", fired.body);
    assert_eq!(fired.body["data"]["readinessAtAcceptance"], "pending");
    let id = fired.body["data"]["id"].as_str().expect("id");
    let status = settled_status(&app, "purchase", id).await;
    assert_eq!(status["readinessState"], "ready", "{status:?}");
    assert!(status["readyAt"].is_string());
    let category = status["data"]["category"].as_str().expect("filled");
    assert!(["books", "games"].contains(&category), "{category}");
    assert_eq!(status["data"]["amount"], 12.5);
    assert_eq!(app.query_i64("SELECT spent FROM ai_credit_spend").await, 1);
    assert_eq!(app.query_i64("SELECT pending FROM event_admission WHERE scope = 'fleet'").await, 0);
    let list = app.get("/events?schema=purchase", ALPHA_ADMIN).await;
    assert_eq!(list.body["data"][0]["id"], id);
    // The receipt never changes: a retry still says it was accepted pending.
    let retry =
        app.post("/events/purchase", ALPHA_ADMIN, &json!({"eventId": "p-1", "amount": 12.5, "item": "a novel"})).await;
    assert_eq!(retry.body["data"]["readinessAtAcceptance"], "pending");
    assert_eq!(retry.body["data"]["isDuplicate"], true);
    // The worker prepared it once.
    app.wait_for_projections().await;
    assert_eq!(app.query_i64("SELECT count(*) FROM events WHERE event_type = 'EventReadinessChanged.v1'").await, 1);
    // Once the credits are spent, new events needing preparation are refused, but a retry
    // still recovers its receipt.
    app.query_i64("UPDATE ai_credit_spend SET spent = 100 RETURNING spent").await;
    let broke = app.post("/events/purchase", ALPHA_ADMIN, &json!({"eventId": "p-2", "amount": 1})).await;
    assert_eq!((broke.status, broke.code().as_str()), (402, Some("insufficient_credits")));
    let retry =
        app.post("/events/purchase", ALPHA_ADMIN, &json!({"eventId": "p-1", "amount": 12.5, "item": "a novel"})).await;
    assert_eq!((retry.status, retry.body["data"]["isDuplicate"].as_bool()), (202, Some(true)));
}

#[tokio::test]
async fn a_pending_event_is_absent_from_the_list_until_ready() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let fired = app.post("/events/purchase", ALPHA_ADMIN, &json!({"amount": 1})).await;
    let id = fired.body["data"]["id"].as_str().expect("id").to_owned();
    app.catch_up_once().await;
    let status = app.get(&format!("/events/purchase/{id}/status"), ALPHA_ADMIN).await;
    assert_eq!(status.body["data"]["readinessState"], "pending");
    assert_eq!(status.body["data"]["readyAt"], Value::Null);
    assert_eq!(
        status.body["data"]["data"],
        json!({"amount": 1, "item": null, "category": null}),
        "raw accepted values"
    );
    let list = app.get("/events?schema=purchase", ALPHA_ADMIN).await;
    assert_eq!(list.body["data"], json!([]));
    // Prepare it now, as the worker would, and project.
    let log = platform::log::EventLog::start(app.pool.clone(), 4);
    let preparation = projector::workers::preparation::Preparation::new(
        app.pool.clone(),
        log,
        ai_provider::AiProvider::Deterministic,
    );
    while projector::runtime::Worker::step(&preparation).await.expect("prepares")
        == projector::runtime::Outcome::Progressed
    {}
    app.catch_up_once().await;
    let list = app.get("/events?schema=purchase", ALPHA_ADMIN).await;
    assert_eq!(list.body["data"][0]["id"], id.as_str());
    assert_eq!(list.body["data"][0]["readinessState"], "ready");
}

#[tokio::test]
async fn preparation_without_credits_is_refused_at_the_door() {
    let app = TestApp::spawn().await;
    let refused = app.post("/events/visit", MULTI_BETA, &json!({})).await;
    assert_eq!((refused.status, refused.code().as_str()), (402, Some("insufficient_credits")));
    let given = app.post("/events/visit", MULTI_BETA, &json!({"topic": "pricing"})).await;
    assert_eq!(given.status, 202, "an event with nothing to prepare needs no credits");
}

#[tokio::test]
async fn the_list_pages_by_cursor_in_occurred_at_order() {
    let app = TestApp::spawn().await;
    // Fired out of order; one old enough to be outside the default window.
    let offsets = [300, 100, 500, 200, 400, 10 * 24 * 3600];
    for (n, seconds) in offsets.iter().enumerate() {
        let body = json!({"eventId": format!("l-{n}"), "occurredAt": ago(*seconds)});
        assert_eq!(app.post("/events/signup", ALPHA_ADMIN, &body).await.status, 202);
    }
    let mut seen = Vec::new();
    let mut path = "/events?schema=signup&limit=2".to_owned();
    loop {
        let page = app.get(&path, ALPHA_ADMIN).await;
        assert_eq!(page.status, 200, "{:?}", page.body);
        assert_eq!(page.body["pagination"]["limit"], 2);
        for item in page.body["data"].as_array().expect("items") {
            seen.push(item["eventId"].as_str().expect("eventId").to_owned());
        }
        if page.body["pagination"]["hasMore"] != true {
            assert_eq!(page.body["pagination"]["nextCursor"], Value::Null);
            break;
        }
        let cursor = page.body["pagination"]["nextCursor"].as_str().expect("cursor").to_owned();
        path = format!("/events?schema=signup&limit=2&cursor={cursor}");
    }
    assert_eq!(seen, ["l-1", "l-3", "l-0", "l-4", "l-2"], "newest occurrence first; the old one is outside 7 days");
    let wide = app.get(&format!("/events?schema=signup&from={}", urlencode(&ago(11 * 24 * 3600))), ALPHA_ADMIN).await;
    assert_eq!(wide.body["data"].as_array().map(Vec::len), Some(6));
    let clamped = app.get("/events?schema=signup&from=2020-01-01T00:00:00Z", ALPHA_ADMIN).await;
    assert_eq!(clamped.status, 200);
    assert_eq!(clamped.body["warnings"][0]["code"], "time_range_clamped");
    let before = app.get(&format!("/events?schema=signup&to={}", urlencode(&ago(250))), ALPHA_ADMIN).await;
    let ids: Vec<&str> =
        before.body["data"].as_array().expect("items").iter().filter_map(|i| i["eventId"].as_str()).collect();
    assert_eq!(ids, ["l-0", "l-4", "l-2"], "to is exclusive and bounds the window");

    let first = app.get("/events?schema=signup&limit=2", ALPHA_ADMIN).await;
    let cursor = first.body["pagination"]["nextCursor"].as_str().expect("cursor").to_owned();
    let empty = app.get("/events?schema=signup&limit=2&cursor=", ALPHA_ADMIN).await;
    assert_eq!((empty.status, &empty.body["data"]), (200, &first.body["data"]), "an empty cursor is the first page");
    for (query, code) in [
        (format!("schema=signup&cursor={cursor}&limit=3"), "invalid_cursor"),
        (format!("schema=signup&cursor=%20{cursor}"), "invalid_cursor"),
        ("schema=signup&cursor=null".to_owned(), "invalid_cursor"),
        (format!("schema=purchase&cursor={cursor}"), "invalid_cursor"),
        ("schema=signup&cursor=garbage!".to_owned(), "invalid_cursor"),
        ("schema=signup&from=yesterday".to_owned(), "invalid_time_range"),
        ("schema=signup&from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z".to_owned(), "invalid_time_range"),
        ("limit=5".to_owned(), "invalid_query_parameter"),
    ] {
        let response = app.get(&format!("/events?{query}"), ALPHA_ADMIN).await;
        assert_eq!((response.status, response.code().as_str()), (400, Some(code)), "{query}");
    }
    let capped = app.get("/events?schema=signup&limit=500", ALPHA_ADMIN).await;
    assert_eq!(capped.body["pagination"]["limit"], 200);
    let unknown = app.get("/events?schema=nope", ALPHA_ADMIN).await;
    assert_eq!(unknown.status, 404);
    let unknown = app.get("/events?schema=nope&from=yesterday", ALPHA_ADMIN).await;
    assert_eq!(unknown.status, 404, "the schema is checked before the window");
    let contacts = app.get("/events?schema=contacts", ALPHA_ADMIN).await;
    assert_eq!((contacts.status, contacts.code().as_str()), (404, Some("schema_not_found")), "contacts have no events");
    let beta = app.get("/events?schema=signup", MULTI_BETA).await;
    assert_eq!(beta.status, 404, "alpha's schema does not exist in beta");
}

fn urlencode(text: &str) -> String {
    text.replace('+', "%2B").replace(':', "%3A")
}

#[tokio::test]
async fn events_about_an_erased_contact_are_erased() {
    let app = TestApp::spawn().await;
    let contact = app.create_contact(&json!({"email": "gone@example.com"})).await;
    let contact_id = contact["id"].as_str().expect("id").to_owned();
    let body = json!({"eventId": "about-1", "contactId": contact_id, "plan": "pro"});
    let fired = app.post("/events/signup", ALPHA_ADMIN, &body).await;
    assert_eq!(fired.status, 202);
    let id = fired.body["data"]["id"].as_str().expect("id").to_owned();
    let deletion = app
        .send(app.request(
            reqwest::Method::DELETE,
            &format!("/schemas/contacts/records/{contact_id}"),
            Some(ALPHA_ADMIN),
        ))
        .await;
    assert_eq!(deletion.status, 200);
    let operation = deletion.body["data"]["operationId"].as_str().expect("operation").to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = app.get(&format!("/record-deletions/{operation}"), ALPHA_ADMIN).await;
        if status.body["data"]["status"] == "completed" {
            break;
        }
        assert!(Instant::now() < deadline, "deletion did not complete: {:?}", status.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let retry = app.post("/events/signup", ALPHA_ADMIN, &body).await;
    assert_eq!((retry.status, retry.code().as_str()), (409, Some("event_erased")));
    let new = app.post("/events/signup", ALPHA_ADMIN, &json!({"contactId": contact_id})).await;
    assert_eq!(new.status, 404, "the contact no longer exists");
    let status = app.get(&format!("/events/signup/{id}/status"), ALPHA_ADMIN).await;
    assert_eq!(status.status, 404);
    assert_eq!(app.query_i64("SELECT count(*) FROM event_receipts WHERE input_digest IS NOT NULL").await, 0);
}

#[tokio::test]
async fn preparation_through_an_openai_compatible_provider_ends_in_each_state() {
    use crate::fake_ai::{FakeAi, Mode};
    let fake = FakeAi::start().await;
    let ai =
        platform::settings::AiSettings::openai(&fake.url, "test-model", Some("sk-fake"), Duration::from_millis(500));
    let app = TestApp::spawn_with(Options { ai: Some(ai), ..Options::default() }).await;
    let fire = async |event_id: &str| {
        let body = json!({"eventId": event_id, "amount": 3, "item": "chess set"});
        let fired = app.post("/events/purchase", ALPHA_ADMIN, &body).await;
        assert_eq!(fired.status, 202, "{:?}", fired.body);
        let id = fired.body["data"]["id"].as_str().expect("id").to_owned();
        settled_status(&app, "purchase", &id).await
    };
    fake.set_mode(Mode::Answer(json!("games")));
    let ready = fire("o-ready").await;
    assert_eq!((ready["readinessState"].as_str(), ready["data"]["category"].as_str()), (Some("ready"), Some("games")));
    let request = fake.requests().pop().expect("a call");
    assert_eq!(request["model"], "test-model");
    assert!(request.to_string().contains("chess set"), "the call carries the event's values");

    fake.set_mode(Mode::Refuse);
    let refused = fire("o-refused").await;
    assert_eq!(refused["readinessState"], "failed");
    assert!(refused["readinessReason"].as_str().is_some_and(|r| r.starts_with("ai_refused")), "{refused:?}");
    assert_eq!(refused["readyAt"], Value::Null);

    fake.set_mode(Mode::Garbage);
    let calls = fake.request_count();
    let unfit = fire("o-unfit").await;
    assert_eq!(unfit["readinessState"], "failed");
    assert!(unfit["readinessReason"].as_str().is_some_and(|r| r.starts_with("ai_output_unfit")));
    assert_eq!(fake.request_count() - calls, 3, "bounded retries");

    fake.set_mode(Mode::Hang(Duration::from_secs(3)));
    let unknown = fire("o-unknown").await;
    assert_eq!(unknown["readinessState"], "outcome_unknown");
    assert!(unknown["readinessReason"].as_str().is_some_and(|r| r.starts_with("ai_outcome_unknown")));

    // Every call that reached the provider spent a credit; only the ready event is listed.
    app.wait_for_projections().await;
    assert_eq!(app.query_i64("SELECT spent FROM ai_credit_spend").await, 6);
    let list = app.get("/events?schema=purchase", ALPHA_ADMIN).await;
    let listed: Vec<&str> =
        list.body["data"].as_array().expect("items").iter().filter_map(|i| i["eventId"].as_str()).collect();
    assert_eq!(listed, ["o-ready"]);
    assert_eq!(app.query_i64("SELECT pending FROM event_admission WHERE scope = 'fleet'").await, 0);
}

#[tokio::test]
async fn a_schema_change_reaches_single_fires_at_once_despite_the_cached_catalog() {
    let app = TestApp::spawn().await;
    let first = app.post("/events/signup", ALPHA_ADMIN, &json!({"eventId": "cache-1", "plan": "pro"})).await;
    assert_eq!(first.status, 202, "{:?}", first.body);
    let signup = r#"[{ "key": "plan", "definition": { "type": "string" } }]"#;
    // A new attribute is accepted by the next fire (the cached context refused it).
    let with_seats = WORKSPACE.replace(
        signup,
        r#"[{ "key": "plan", "definition": { "type": "string" } }, { "key": "seats", "definition": { "type": "number" } }]"#,
    );
    app.apply_workspace(&with_seats, true).await;
    let second = app.post("/events/signup", ALPHA_ADMIN, &json!({"eventId": "cache-2", "seats": 3})).await;
    assert_eq!(second.status, 202, "{:?}", second.body);
    // A new required attribute refuses the next fire without it (the cached context would
    // accept it; the catalog revision guard refuses the append).
    let with_region = WORKSPACE.replace(
        signup,
        r#"[{ "key": "plan", "definition": { "type": "string" } }, { "key": "seats", "definition": { "type": "number" } },
            { "key": "region", "definition": { "type": "string", "required": true } }]"#,
    );
    app.apply_workspace(&with_region, true).await;
    let third = app.post("/events/signup", ALPHA_ADMIN, &json!({"eventId": "cache-3", "plan": "pro"})).await;
    assert_eq!(third.status, 400, "{:?}", third.body);
    assert!(third.body.to_string().contains("region"), "{:?}", third.body);
    assert_eq!(app.query_i64("SELECT count(*) FROM event_receipts WHERE event_id LIKE 'cache-%'").await, 2);
}

#[tokio::test]
async fn an_event_with_the_largest_and_smallest_numbers_reads_back_as_written() {
    // The database prints such a number in full (309 digits for the largest double); reading
    // it back must give the same double, not fail the read.
    let app = TestApp::spawn().await;
    for amount in [f64::MAX, f64::MIN, f64::MIN_POSITIVE, 5e-324, 1.0e300, -123.456] {
        let fired = app.post("/events/purchase", ALPHA_ADMIN, &json!({"amount": amount, "category": "books"})).await;
        assert_eq!(fired.status, 202, "{:?}", fired.body);
        let id = fired.body["data"]["id"].as_str().expect("id").to_owned();
        let status = app.get_after(&fired, &format!("/events/purchase/{id}/status"), ALPHA_ADMIN).await;
        assert_eq!(status.status, 200, "{amount}: {:?}", status.body);
        assert_eq!(status.body["data"]["data"]["amount"].as_f64(), Some(amount), "{:?}", status.body);
    }
}

#[tokio::test]
async fn an_event_json_value_nests_at_most_32_levels_and_one_that_deep_reads_back() {
    let app = TestApp::spawn().await;
    app.apply_with_attribute("purchase", json!({"key": "trail", "definition": {"type": "json"}})).await;
    let nested = |levels: usize| (0..levels).fold(json!(1), |inner, _| json!([inner]));
    for levels in [33, 125] {
        let body = json!({"amount": 1, "category": "books", "trail": nested(levels)});
        let refused = app.post("/events/purchase", ALPHA_ADMIN, &body).await;
        let issue = &refused.body["error"]["issues"][0];
        assert_eq!(
            (refused.status, issue["code"].as_str(), issue["key"].as_str()),
            (400, Some("value_too_long"), Some("trail")),
            "{levels}: {:?}",
            refused.body
        );
    }
    let fired = app
        .post("/events/purchase", ALPHA_ADMIN, &json!({"amount": 1, "category": "books", "trail": nested(32)}))
        .await;
    assert_eq!(fired.status, 202, "{:?}", fired.body);
    let id = fired.body["data"]["id"].as_str().expect("id").to_owned();
    let status = app.get_after(&fired, &format!("/events/purchase/{id}/status"), ALPHA_ADMIN).await;
    assert_eq!(status.status, 200, "{:?}", status.body);
    assert_eq!(status.body["data"]["data"]["trail"], nested(32), "{:?}", status.body);
}
