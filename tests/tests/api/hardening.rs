//! The edge refuses what the store cannot hold, so no request can stop a read model, answer
//! 5xx for bad input or wedge an idempotency key; and the smaller HTTP rules around it.

use std::time::Duration;

use serde_json::json;

use crate::helpers::*;

fn issue_keys(response: &TestResponse) -> Vec<String> {
    response.body["error"]["issues"]
        .as_array()
        .map(|issues| issues.iter().filter_map(|issue| issue["key"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

fn assert_invalid_character(response: &TestResponse, key: &str, what: &str) {
    assert_eq!(response.status, 400, "{what}: {:?}", response.body);
    assert_eq!(response.code(), "invalid_character", "{what}: {:?}", response.body);
    assert_eq!(response.body["error"]["type"], "invalid_request_error", "{what}");
    assert!(issue_keys(response).iter().any(|found| found == key), "{what}: issues name {key}: {:?}", response.body);
}

#[tokio::test]
async fn a_nul_in_a_body_is_refused_naming_the_field_and_reads_keep_working() {
    let app = TestApp::spawn().await;
    let value = app
        .post("/schemas/contacts/records", ALPHA_ADMIN, &json!({"email": "n@example.com", "firstName": "a\u{0}b"}))
        .await;
    assert_invalid_character(&value, "firstName", "a NUL in a value");
    let key = app.post("/schemas/contacts/records", ALPHA_ADMIN, &json!({"a\u{0}b": 1})).await;
    assert_invalid_character(&key, "a\\u0000b", "a NUL in a key");
    let identity = app.post("/schemas/contacts/records", ALPHA_ADMIN, &json!({"email": "x\u{0}@example.com"})).await;
    assert_invalid_character(&identity, "email", "a NUL in an identity");
    let event =
        app.post("/events/purchase", ALPHA_ADMIN, &json!({"eventId": "e1", "amount": 1, "item": "x\u{0}y"})).await;
    assert_invalid_character(&event, "item", "a NUL in event data");
    let event_id = app.post("/events/purchase", ALPHA_ADMIN, &json!({"eventId": "n\u{0}", "amount": 1})).await;
    assert_invalid_character(&event_id, "eventId", "a NUL in an eventId");
    let batch = app
        .post(
            "/events/purchase/batch",
            ALPHA_ADMIN,
            &json!({"events": [{"amount": 1}, {"amount": 2, "item": "\u{0}"}]}),
        )
        .await;
    assert_invalid_character(&batch, "events[1].item", "a NUL in a batch item");
    let suppression = app
        .post("/contacts/suppressions", ALPHA_ADMIN, &json!({"identifier": "a\u{0}@b.com", "reason": "manual"}))
        .await;
    assert_invalid_character(&suppression, "identifier", "a NUL in a suppression");
    let removal = app.post("/contacts/suppressions/batch-remove", ALPHA_ADMIN, &json!({"ids": ["sup_\u{0}"]})).await;
    assert_invalid_character(&removal, "ids[0]", "a NUL in a removal id");
    let identities = app
        .post(
            "/event-identities",
            ALPHA_ADMIN,
            &json!({"sourceId": "src\u{0}", "subjectSchemaId": "contacts", "anonymousId": "a", "contactId": null,
                    "operationId": uuid::Uuid::new_v4().to_string(), "expectedAliasRevision": "0"}),
        )
        .await;
    assert_invalid_character(&identities, "sourceId", "a NUL in an identity change");
    // Nothing reached the log, and writes keep becoming readable.
    let created = app.create_contact(&json!({"email": "after@example.com", "firstName": "After"})).await;
    let id = created["id"].as_str().expect("id");
    let read = app.get(&format!("/schemas/contacts/records/{id}"), ALPHA_ADMIN).await;
    assert_eq!(read.status, 200, "{:?}", read.body);
    assert!(read.body["warnings"].is_null(), "no stale read: {:?}", read.body);
}

#[tokio::test]
async fn a_nul_in_a_path_or_query_is_400_never_5xx() {
    let app = TestApp::spawn().await;
    let cases: [(reqwest::Method, &str, &str); 10] = [
        (reqwest::Method::GET, "/events?schema=a%00b", "schema"),
        (reqwest::Method::GET, "/schemas/a%00b", "schema"),
        (reqwest::Method::GET, "/schemas/contacts/records/con_%00", "id"),
        (reqwest::Method::GET, "/contacts/suppressions?identifier=a%00@b.com", "identifier"),
        (reqwest::Method::GET, "/record-deletions/op_%00", "operationId"),
        (reqwest::Method::GET, "/events/purchase/ev_%00/status", "id"),
        (reqwest::Method::DELETE, "/contacts/suppressions/sup_%00", "id"),
        (reqwest::Method::PATCH, "/schemas/contacts/records/con_%00", "id"),
        (reqwest::Method::GET, "/schemas?type=contact&x%00=1", "x\\u0000"),
        (reqwest::Method::GET, "/schemas/contacts/records?limit=1%00", "limit"),
    ];
    for (method, path, key) in cases {
        let request = app.request(method.clone(), path, Some(ALPHA_ADMIN)).json(&json!({}));
        let response = app.send(request).await;
        assert_invalid_character(&response, key, &format!("{method} {path}"));
    }
    // The guards on /events/{id} answer 405 every time, and an unknown path 404.
    let guard = app.send(app.request(reqwest::Method::PATCH, "/events/ev_%00", Some(ALPHA_ADMIN))).await;
    assert_eq!(guard.status, 405);
    assert_eq!(app.get("/nothing/a%00b", ALPHA_ADMIN).await.status, 404);
}

#[tokio::test]
async fn a_value_the_database_refuses_fails_only_its_own_command() {
    use platform::log::{AppendError, AppendRequest, Guard, Metadata};
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let event_log = platform::log::EventLog::start(app.pool.clone(), 64);
    let request = |text: &str| AppendRequest {
        metadata: Metadata::default(),
        streams: Vec::new(),
        guards: vec![Guard::unique(
            "INSERT INTO worker_checkpoints (name) VALUES ($1)",
            vec![Box::new(text.to_owned())],
            AppendError::Conflict { code: platform::error::Code::OperationTaken, message: String::new() },
        )],
    };
    // Sent together, so the batcher groups them into one transaction.
    let outcomes = futures_util::future::join_all((0..20).map(|index| {
        let text = if index == 7 { "bad\u{0}".to_owned() } else { format!("good-{index}") };
        let append = event_log.append(request(&text));
        async move { (index, append.await) }
    }))
    .await;
    for (index, outcome) in outcomes {
        if index == 7 {
            assert!(
                matches!(outcome, Err(AppendError::Refused(_))),
                "the refused value fails its command: {outcome:?}"
            );
        } else {
            assert!(outcome.is_ok(), "command {index} commits: {outcome:?}");
        }
    }
    assert_eq!(app.query_i64("SELECT count(*) FROM worker_checkpoints WHERE name LIKE 'good-%'").await, 19);
}

#[tokio::test]
async fn an_error_outcome_that_cannot_be_recorded_releases_the_claim() {
    let app = TestApp::spawn().await;
    let client = app.pool.get().await.expect("client");
    // Recording any error outcome fails (as a full disk or a lost connection would).
    client
        .batch_execute(
            "CREATE FUNCTION refuse_error_outcomes() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN IF NEW.state = 'completed' AND NEW.status >= 400 THEN
                 RAISE EXCEPTION 'injected failure' USING ERRCODE = '53100'; END IF; RETURN NEW; END; $$;
             CREATE TRIGGER refuse_error_outcomes BEFORE UPDATE ON idempotency_records
                 FOR EACH ROW EXECUTE FUNCTION refuse_error_outcomes();",
        )
        .await
        .expect("install the failure");
    // An error raised after the claim (an unknown attribute is found by the decision).
    let body = json!({"email": "wedge@example.com", "nope": 1});
    let first = app.create_with_key("wedge", &body).await;
    assert_eq!((first.status, first.code().as_str()), (400, Some("unknown_attribute")), "{:?}", first.body);
    // Not wedged: the same key runs again instead of answering 409.
    let second = app.create_with_key("wedge", &body).await;
    assert_eq!(second.status, 400, "{:?}", second.body);
    assert!(second.header("idempotent-replay").is_none());
    assert_eq!(app.query_i64("SELECT count(*) FROM idempotency_records").await, 0, "no claim is left behind");
    client.batch_execute("DROP TRIGGER refuse_error_outcomes ON idempotency_records").await.expect("remove");
    // Once outcomes can be recorded again, the error is recorded and replayed.
    let third = app.create_with_key("wedge", &body).await;
    assert_eq!(third.status, 400);
    let replay = app.create_with_key("wedge", &body).await;
    assert_eq!((replay.status, replay.header("idempotent-replay")), (400, Some("true")), "{:?}", replay.body);
}

#[tokio::test]
async fn a_405_says_which_methods_the_path_allows() {
    let app = TestApp::spawn().await;
    for (method, path, allow) in [
        (reqwest::Method::PUT, "/me", "GET"),
        (reqwest::Method::DELETE, "/schemas/contacts/records", "GET, POST"),
        // The guards' PATCH and DELETE are the document's methods of the path too (always
        // answered 405), so `Allow` names them with the method served.
        (reqwest::Method::PATCH, "/events/ev_1", "POST, PATCH, DELETE"),
        (reqwest::Method::DELETE, "/events/ev_1", "POST, PATCH, DELETE"),
        (reqwest::Method::PUT, "/events/ev_1", "POST, PATCH, DELETE"),
        (reqwest::Method::GET, "/contacts/suppressions/sup_1", "DELETE"),
    ] {
        let response = app.send(app.request(method.clone(), path, Some(ALPHA_ADMIN))).await;
        assert_eq!(response.status, 405, "{method} {path}");
        assert_eq!(response.header("allow"), Some(allow), "{method} {path}");
        assert_eq!(response.code(), "method_not_allowed");
    }
    // The query service (GET only) knows the whole API too.
    let on_query = app
        .send(app.http.request(reqwest::Method::PUT, format!("{}/schemas", app.query_url)).bearer_auth(ALPHA_ADMIN))
        .await;
    assert_eq!((on_query.status, on_query.header("allow")), (405, Some("GET")));
}

#[tokio::test]
async fn every_get_refuses_a_malformed_consistency_token_me_included() {
    let app = TestApp::spawn().await;
    for path in ["/me", "/schemas", "/contacts/suppressions"] {
        let response = app
            .send(app.request(reqwest::Method::GET, path, Some(ALPHA_ADMIN)).header("Consistency-Token", "abc"))
            .await;
        assert_eq!((response.status, response.code().as_str()), (400, Some("invalid_consistency_token")), "{path}");
        let fine =
            app.send(app.request(reqwest::Method::GET, path, Some(ALPHA_ADMIN)).header("Consistency-Token", "1")).await;
        assert_eq!(fine.status, 200, "{path}: {:?}", fine.body);
    }
}

#[tokio::test]
async fn a_consistency_token_beyond_the_log_answers_at_once_with_stale_read() {
    let app =
        TestApp::spawn_with(Options { consistency_wait: Some(Duration::from_secs(60)), ..Options::default() }).await;
    let started = std::time::Instant::now();
    let response = app
        .send(
            app.request(reqwest::Method::GET, "/schemas", Some(ALPHA_ADMIN))
                .header("Consistency-Token", "9223372036854775807"),
        )
        .await;
    assert!(started.elapsed() < Duration::from_secs(30), "no write returned that token: waiting cannot help");
    assert_eq!(response.status, 200);
    assert_eq!(response.body["warnings"][0]["code"], "stale_read", "{:?}", response.body);
    let message = response.body["warnings"][0]["message"].as_str().expect("message");
    assert!(message.contains("beyond the end of the log"), "{message}");
}

#[tokio::test]
async fn an_empty_or_invalid_filter_is_refused_not_ignored() {
    let app = TestApp::spawn().await;
    for path in [
        "/schemas?type=",
        "/schemas?type=contact,",
        "/schemas?type=contact&type=",
        "/contacts/suppressions?identifier=",
        "/contacts/suppressions?identifier=notanemail",
        "/contacts/suppressions?identifier=%20",
    ] {
        let response = app.get(path, ALPHA_ADMIN).await;
        assert_eq!((response.status, response.code().as_str()), (400, Some("invalid_query_parameter")), "{path}");
    }
    assert_eq!(app.get("/schemas?type=contact,object", ALPHA_ADMIN).await.status, 200);
    let created = app
        .post("/contacts/suppressions", ALPHA_ADMIN, &json!({"identifier": "Filter@Example.com", "reason": "manual"}))
        .await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let found = app
        .send(
            app.request(
                reqwest::Method::GET,
                "/contacts/suppressions?identifier=FILTER@example.com",
                Some(ALPHA_ADMIN),
            )
            .header("Consistency-Token", created.header("consistency-token").unwrap_or("0")),
        )
        .await;
    assert_eq!(found.body["pagination"]["totalCount"], 1, "{:?}", found.body);
}

#[tokio::test]
async fn a_replay_right_after_a_delete_no_longer_shows_the_record() {
    let app = TestApp::spawn().await;
    let body = json!({"email": "gone@example.com", "firstName": "Gone"});
    let created = app.create_with_key("erase-race", &body).await;
    assert_eq!(created.status, 201);
    let id = created.body["data"]["id"].as_str().expect("id").to_owned();
    let deleted = app
        .send(app.request(reqwest::Method::DELETE, &format!("/schemas/contacts/records/{id}"), Some(ALPHA_ADMIN)))
        .await;
    assert_eq!(deleted.status, 200, "{:?}", deleted.body);
    // At once, before the eraser has run: the replay holds no personal data.
    let replay = app.create_with_key("erase-race", &body).await;
    assert_eq!(replay.header("idempotent-replay"), Some("true"));
    assert_eq!(replay.body, json!({"data": {"id": id, "erased": true}}));
    assert_eq!(
        app.query_i64("SELECT count(*) FROM idempotency_records WHERE response::text LIKE '%gone@example.com%'").await,
        0,
        "the recorded response left storage with the request"
    );
}

/// Sleeps until just after a window boundary on the database's clock.
async fn start_of_a_database_window(app: &TestApp) {
    let millis = app.query_i64("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint % 1000").await;
    tokio::time::sleep(Duration::from_millis(u64::try_from(1000 - millis + 30).unwrap_or(0))).await;
}

#[tokio::test]
async fn a_hundred_concurrent_reads_all_pass_across_processes_and_the_next_one_does_not() {
    let app = TestApp::spawn().await;
    let (_processes, urls) =
        spawn_servers(&app, "query-service", &[], 2, &[("APP__RATE_LIMITS__READ_PER_SECOND", "100".into())]).await;
    // A burst must fall within one window; a slow machine may straddle a boundary, so try a
    // few windows and require one clean burst.
    let mut clean = false;
    for _ in 0..5 {
        start_of_a_database_window(&app).await;
        let window_before = app.query_i64("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint / 1000").await;
        let statuses: Vec<u16> = futures_util::future::join_all((0..100).map(|index| {
            let request = app.http.get(format!("{}/schemas", urls[index % 2])).bearer_auth(ALPHA_MEMBER);
            async move { request.send().await.expect("sent").status().as_u16() }
        }))
        .await;
        let next = app.http.get(format!("{}/schemas", urls[0])).bearer_auth(ALPHA_MEMBER).send().await.expect("sent");
        let window_after = app.query_i64("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint / 1000").await;
        if window_after != window_before {
            continue;
        }
        assert_eq!(statuses.iter().filter(|status| **status == 200).count(), 100, "{statuses:?}");
        assert_eq!(next.status().as_u16(), 429, "the 101st request in the window is refused");
        clean = true;
        break;
    }
    assert!(clean, "no burst fit in one window");
}
