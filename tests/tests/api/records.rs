//! Records: strict create, read by id, list order and totals.

use serde_json::{Value, json};

use crate::helpers::*;

#[tokio::test]
async fn create_returns_201_with_flattened_values_defaults_and_source_api() {
    let app = TestApp::spawn().await;
    let response = app
        .post(
            "/schemas/contacts/records",
            ALPHA_ADMIN,
            &json!({"id": "con_mine", "source": "import", "email": "Ada@Example.COM", "firstName": "Ada", "age": 36}),
        )
        .await;
    assert_eq!(response.status, 201, "{:?}", response.body);
    let record = &response.body["data"];
    let id = record["id"].as_str().expect("id");
    assert!(id.starts_with("con_") && id != "con_mine", "body id is ignored: {id}");
    assert_eq!(record["source"], "api");
    assert_eq!(record["email"], "ada@example.com");
    assert_eq!(record["firstName"], "Ada");
    assert_eq!(record["age"], 36);
    assert_eq!(record["plan"], "free", "default applied");
    assert!(record["userId"].is_null() && record["phone"].is_null());
    assert!(record.get("score").is_none() && record.get("total").is_none(), "evaluated and aggregate are not expanded");
    assert!(record["createdAt"].as_str().expect("createdAt").ends_with('Z'));
    assert!(response.header("operation-id").expect("Operation-Id").starts_with("op_"));
    assert!(response.header("consistency-token").is_some());

    let fetched = app.get(&format!("/schemas/contacts/records/{id}"), ALPHA_ADMIN).await;
    assert_eq!(fetched.status, 200);
    assert_eq!(&fetched.body["data"], record, "the read model shows what the write returned");
}

#[tokio::test]
async fn schema_is_addressed_by_id_or_slug() {
    let app = TestApp::spawn().await;
    let schema = app.get("/schemas/companies", ALPHA_ADMIN).await;
    let schema_id = schema.body["data"]["id"].as_str().expect("schema id").to_owned();
    let created = app
        .post(&format!("/schemas/{schema_id}/records"), ALPHA_ADMIN, &json!({"externalId": "ACME-1", "name": "Acme"}))
        .await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let record = &created.body["data"];
    assert!(record["id"].as_str().expect("id").starts_with("obj_"));
    assert_eq!(record["externalId"], "ACME-1");
    let id = record["id"].as_str().expect("id");
    assert_eq!(app.get(&format!("/schemas/companies/records/{id}"), ALPHA_ADMIN).await.status, 200);
    assert_eq!(app.get(&format!("/schemas/{schema_id}/records/{id}"), ALPHA_ADMIN).await.status, 200);
}

#[tokio::test]
async fn strict_create_with_an_existing_identity_is_409_identifier_conflict() {
    let app = TestApp::spawn().await;
    app.create_contact(&json!({"email": "dup@example.com", "userId": "u-1"})).await;
    for body in [
        json!({"email": "DUP@example.com"}),
        json!({"userId": "u-1"}),
        json!({"email": "other@example.com", "userId": "u-1"}),
    ] {
        let conflict = app.post("/schemas/contacts/records", ALPHA_ADMIN, &body).await;
        assert_eq!(conflict.status, 409, "{body}");
        assert_eq!(conflict.code(), "identifier_conflict");
    }
    // Identities are per schema and per space.
    assert_eq!(
        app.post("/schemas/leads/records", ALPHA_ADMIN, &json!({"email": "dup@example.com", "company": "X"}))
            .await
            .status,
        201
    );
    assert_eq!(
        app.post("/schemas/contacts/records", MULTI_BETA, &json!({"email": "dup@example.com"})).await.status,
        201
    );
    app.wait_for_projections().await;
    let list = app.get("/schemas/contacts/records", ALPHA_ADMIN).await;
    assert_eq!(list.body["pagination"]["totalCount"], 1, "a refused create leaves nothing behind");
}

#[tokio::test]
async fn concurrent_creates_of_one_identity_make_one_record() {
    let app = TestApp::spawn().await;
    let mut tasks = Vec::new();
    for _ in 0..12 {
        let request = app
            .request(reqwest::Method::POST, "/schemas/contacts/records", Some(ALPHA_ADMIN))
            .json(&json!({"email": "race@example.com"}));
        tasks.push(tokio::spawn(async move { request.send().await.expect("sent").status().as_u16() }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.expect("task"));
    }
    statuses.sort_unstable();
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 1, "{statuses:?}");
    assert!(statuses.iter().all(|s| *s == 201 || *s == 409), "{statuses:?}");
}

#[tokio::test]
async fn invalid_input_is_rejected_with_issues_and_nothing_is_written() {
    let app = TestApp::spawn().await;
    let missing = app.post("/schemas/leads/records", ALPHA_ADMIN, &json!({"email": "a@b.io"})).await;
    assert_eq!(missing.status, 400);
    assert_eq!(missing.code(), "required_attribute_missing");
    assert_eq!(missing.body["error"]["issues"][0]["key"], "company");

    for (body, code) in [
        (json!({"score": 3}), "attribute_not_writable"),
        (json!({"total": 3}), "attribute_not_writable"),
        (json!({"createdAt": "2020-01-01T00:00:00Z"}), "attribute_not_writable"),
        (json!({"favouriteColour": "red"}), "unknown_attribute"),
        (json!({"age": "old"}), "invalid_attribute_value"),
        (json!({"plan": "platinum"}), "invalid_attribute_value"),
        (json!({"email": "not-an-email"}), "invalid_attribute_value"),
        (json!({"email": 12}), "invalid_attribute_value"),
    ] {
        let response = app.post("/schemas/contacts/records", ALPHA_ADMIN, &body).await;
        assert_eq!(response.status, 400, "{body}: {:?}", response.body);
        assert_eq!(response.code(), code, "{body}");
        let key = body.as_object().and_then(|o| o.keys().next().cloned()).expect("key");
        assert_eq!(response.body["error"]["issues"][0]["key"], Value::String(key));
    }
    let not_object = app.post("/schemas/contacts/records", ALPHA_ADMIN, &json!([1, 2])).await;
    assert_eq!(not_object.status, 400);
    app.wait_for_projections().await;
    assert_eq!(app.get("/schemas/contacts/records", ALPHA_ADMIN).await.body["pagination"]["totalCount"], 0);
}

#[tokio::test]
async fn a_record_as_read_goes_back_as_a_patch_with_only_its_edits_applied() {
    let app = TestApp::spawn().await;
    let created = app.create_contact(&json!({"email": "round@trip.io", "plan": "free"})).await;
    let id = created["id"].as_str().expect("id").to_owned();
    let path = format!("/schemas/contacts/records/{id}");
    let patch = |body: Value| app.send(app.request(reqwest::Method::PATCH, &path, Some(ALPHA_ADMIN)).json(&body));
    app.wait_for_projections().await;
    let mut shown = app.get(&path, ALPHA_ADMIN).await.body["data"].clone();
    assert_eq!(shown["createdAt"], created["createdAt"], "{shown}");
    shown["plan"] = json!("pro");
    shown["updatedAt"] = json!("2001-01-01T00:00:00.000Z");
    let round_trip = patch(shown.clone()).await;
    assert_eq!(round_trip.status, 200, "{:?}", round_trip.body);
    assert_eq!(
        (&round_trip.body["data"]["plan"], &round_trip.body["data"]["email"]),
        (&json!("pro"), &json!("round@trip.io"))
    );
    assert_eq!(round_trip.body["data"]["createdAt"], created["createdAt"]);
    assert_ne!(round_trip.body["data"]["updatedAt"], "2001-01-01T00:00:00.000Z", "updatedAt is the platform's");
    // Only changing createdAt is refused, and leaves the record as it was.
    shown["createdAt"] = json!("2020-01-01T00:00:00.000Z");
    shown["plan"] = json!("free");
    let moved = patch(shown).await;
    assert_eq!((moved.status, moved.code().as_str()), (400, Some("attribute_not_writable")), "{:?}", moved.body);
    assert_eq!(moved.body["error"]["issues"][0]["key"], "createdAt");
    app.wait_for_projections().await;
    assert_eq!(app.get(&path, ALPHA_ADMIN).await.body["data"]["plan"], "pro");
}

#[tokio::test]
async fn ai_auto_fill_schemas_need_credits() {
    let app = TestApp::spawn().await;
    let broke = app.post("/schemas/accounts/records", MULTI_BETA, &json!({"externalId": "A"})).await;
    assert_eq!(broke.status, 402);
    assert_eq!(broke.code(), "insufficient_credits");
    // Alpha has credits, so its auto-fill schema accepts writes.
    assert_eq!(app.post("/schemas/companies/records", ALPHA_ADMIN, &json!({"externalId": "A"})).await.status, 201);
    // A schema without auto-fill needs none.
    assert_eq!(app.post("/schemas/contacts/records", MULTI_BETA, &json!({"email": "c@d.io"})).await.status, 201);
}

#[tokio::test]
async fn unknown_schemas_and_records_are_404() {
    let app = TestApp::spawn().await;
    let no_schema = app.post("/schemas/nope/records", ALPHA_ADMIN, &json!({})).await;
    assert_eq!(no_schema.status, 404);
    assert_eq!(no_schema.code(), "schema_not_found");
    let event_schema = app.post("/schemas/signup/records", ALPHA_ADMIN, &json!({})).await;
    assert_eq!(event_schema.code(), "schema_not_found");
    assert_eq!(app.get("/schemas/nope/records", ALPHA_ADMIN).await.code(), "schema_not_found");
    let no_record = app.get("/schemas/contacts/records/con_missing", ALPHA_ADMIN).await;
    assert_eq!(no_record.status, 404);
    assert_eq!(no_record.code(), "record_not_found");
}

#[tokio::test]
async fn another_space_never_sees_a_record() {
    let app = TestApp::spawn().await;
    let record = app.create_contact(&json!({"email": "private@example.com"})).await;
    let id = record["id"].as_str().expect("id");
    // Beta has a schema with the same slug; the record is still invisible there.
    let other = app.get(&format!("/schemas/contacts/records/{id}"), MULTI_BETA).await;
    assert_eq!(other.status, 404);
    let list = app.get("/schemas/contacts/records", MULTI_BETA).await;
    assert_eq!(list.body["pagination"]["totalCount"], 0);
    assert!(!list.body.to_string().contains("private@example.com"));
    // Schema ids of another space are not found either.
    let alpha_schema =
        app.get("/schemas/contacts", ALPHA_ADMIN).await.body["data"]["id"].as_str().expect("id").to_owned();
    assert_eq!(app.get(&format!("/schemas/{alpha_schema}"), MULTI_BETA).await.status, 404);
}

#[tokio::test]
async fn list_is_ordered_by_created_at_then_id_with_counted_totals() {
    let app = TestApp::spawn().await;
    let mut ids = Vec::new();
    for index in 0..7 {
        let record = app.create_contact(&json!({"email": format!("order{index}@example.com")})).await;
        ids.push(record["id"].as_str().expect("id").to_owned());
    }
    let page = app.get("/schemas/contacts/records?limit=3&offset=2", ALPHA_ADMIN).await;
    assert_eq!(page.status, 200);
    let listed: Vec<&str> =
        page.body["data"].as_array().expect("list").iter().filter_map(|r| r["id"].as_str()).collect();
    assert_eq!(listed, ids[2..5].iter().map(String::as_str).collect::<Vec<_>>());
    let mut pagination = page.body["pagination"].clone();
    assert!(pagination["nextCursor"].is_string(), "the cursor to go on with: {pagination}");
    pagination.as_object_mut().map(|p| p.remove("nextCursor"));
    assert_eq!(pagination, json!({"limit": 3, "offset": 2, "totalCount": 7, "hasMore": true}));
    let last = app.get("/schemas/contacts/records?limit=3&offset=6", ALPHA_ADMIN).await;
    assert_eq!(last.body["pagination"]["hasMore"], false);
    assert_eq!(last.body["data"].as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn ai_auto_fill_attributes_of_a_record_are_filled_by_the_preparation_worker() {
    let app = TestApp::spawn().await;
    let created =
        app.post("/schemas/companies/records", ALPHA_ADMIN, &json!({"externalId": "acme", "name": "Acme"})).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    assert_eq!(created.body["data"]["industry"], serde_json::Value::Null, "filled asynchronously");
    let id = created.body["data"]["id"].as_str().expect("id").to_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let industry = loop {
        let record = app.get(&format!("/schemas/companies/records/{id}"), ALPHA_ADMIN).await;
        if let Some(industry) = record.body["data"]["industry"].as_str() {
            break industry.to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "industry was never filled: {:?}", record.body);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(industry.starts_with("industry: "), "the deterministic provider's answer: {industry}");
    assert_eq!(app.query_i64("SELECT spent FROM ai_credit_spend").await, 1);
    // A given value is kept, and the worker's own update needs no further fill.
    let given =
        app.post("/schemas/companies/records", ALPHA_ADMIN, &json!({"externalId": "b", "industry": "retail"})).await;
    assert_eq!(given.status, 201);
    app.wait_for_projections().await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(app.query_i64("SELECT count(*) FROM events WHERE event_type = 'RecordUpdated.v1'").await, 1);
    assert_eq!(app.query_i64("SELECT spent FROM ai_credit_spend").await, 1);
}

#[tokio::test]
async fn a_schema_change_reaches_record_creates_at_once_despite_the_cached_catalog() {
    let app = TestApp::spawn().await;
    let first = app.post("/schemas/leads/records", ALPHA_ADMIN, &json!({"company": "Acme"})).await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    // A new attribute is accepted by the next create (the cached context refused it; the
    // writer read the catalog again).
    let with_budget = WORKSPACE.replace(
        r#"{ "key": "company", "definition": { "type": "string", "required": true } }"#,
        r#"{ "key": "company", "definition": { "type": "string", "required": true } },
            { "key": "budget", "definition": { "type": "number" } }"#,
    );
    app.apply_workspace(&with_budget, true).await;
    let second = app.post("/schemas/leads/records", ALPHA_ADMIN, &json!({"company": "Beta", "budget": 5})).await;
    assert_eq!(second.status, 201, "{:?}", second.body);
    assert_eq!(second.body["data"]["budget"], 5);
    // A new required attribute refuses the next create without it (the cached context would
    // accept it; the catalog revision guard refuses the append and the writer decides again).
    let with_region = with_budget.replace(
        r#"{ "key": "budget", "definition": { "type": "number" } }"#,
        r#"{ "key": "budget", "definition": { "type": "number" } },
            { "key": "region", "definition": { "type": "string", "required": true } }"#,
    );
    app.apply_workspace(&with_region, true).await;
    let third = app.post("/schemas/leads/records", ALPHA_ADMIN, &json!({"company": "Gamma"})).await;
    assert_eq!(third.status, 400, "{:?}", third.body);
    assert!(third.body.to_string().contains("region"), "{:?}", third.body);
    let fourth = app.post("/schemas/leads/records", ALPHA_ADMIN, &json!({"company": "Delta", "region": "EU"})).await;
    assert_eq!(fourth.status, 201, "{:?}", fourth.body);
    assert_eq!(app.query_i64("SELECT count(*) FROM events WHERE event_type = 'RecordCreated.v1'").await, 3);
}

#[tokio::test]
async fn writes_resolve_the_schema_in_the_documented_order() {
    // Record create: body, then schema, then Idempotency-Key (an unknown schema is 404 even
    // with an unusable key, and nothing is claimed under it).
    let app = TestApp::spawn().await;
    for _ in 0..2 {
        let request = app
            .request(reqwest::Method::POST, "/schemas/no-such-schema/records", Some(ALPHA_ADMIN))
            .header("Idempotency-Key", "k".repeat(300))
            .json(&json!({"email": "order@example.com"}));
        let response = app.send(request).await;
        assert_eq!((response.status, response.code().as_str()), (404, Some("schema_not_found")), "{:?}", response.body);
    }
    // Event fire: schema before body.
    let request = app
        .request(reqwest::Method::POST, "/events/no-such-schema", Some(ALPHA_ADMIN))
        .header("Content-Type", "application/json")
        .body("{not json");
    let response = app.send(request).await;
    assert_eq!((response.status, response.code().as_str()), (404, Some("schema_not_found")), "{:?}", response.body);
    // Both again once the schemas are in this process's cache.
    assert_eq!(app.post("/schemas/leads/records", ALPHA_ADMIN, &json!({"company": "Acme"})).await.status, 201);
    assert_eq!(app.post("/events/signup", ALPHA_ADMIN, &json!({"eventId": "order-1"})).await.status, 202);
    let request = app
        .request(reqwest::Method::POST, "/events/signup", Some(ALPHA_ADMIN))
        .header("Content-Type", "application/json")
        .body("{not json");
    assert_eq!(app.send(request).await.code(), "malformed_json");
    let request = app
        .request(reqwest::Method::POST, "/schemas/leads/records", Some(ALPHA_ADMIN))
        .header("Idempotency-Key", "k".repeat(300))
        .json(&json!({"company": "Acme"}));
    assert_eq!(app.send(request).await.code(), "invalid_idempotency_key");
}

#[tokio::test]
async fn a_contact_is_found_by_its_identity_and_nothing_else_is() {
    let app = TestApp::spawn().await;
    let ada =
        app.create_contact(&json!({"email": "Ada@Example.com", "userId": "u-ada", "phone": "+1 415 555 0100"})).await;
    app.create_contact(&json!({"email": "bob@example.com"})).await;
    let app = &app;
    let find = |query: &str| {
        let path = format!("/schemas/contacts/records?{query}");
        async move { app.get(&path, ALPHA_ADMIN).await }
    };
    for query in ["email=ada@example.com", "email=%20ADA@EXAMPLE.COM", "userId=u-ada", "phone=%2B1%20415%20555%200100"]
    {
        let found = find(query).await;
        assert_eq!(found.status, 200, "{query}: {:?}", found.body);
        assert_eq!(found.body["data"].as_array().map(Vec::len), Some(1), "{query}: {:?}", found.body);
        assert_eq!(found.body["data"][0]["id"], ada["id"], "{query}");
        assert_eq!(found.body["pagination"]["totalCount"], 1, "{query}");
    }
    for query in ["email=nobody@example.com", "userId=U-ADA", "email=ada@example.com&offset=1"] {
        let found = find(query).await;
        assert_eq!(
            (found.status, found.body["data"].as_array().map(Vec::len)),
            (200, Some(0)),
            "{query}: {:?}",
            found.body
        );
    }
    // Several identities: the record that has all of them.
    let both = find("email=ada@example.com&userId=u-ada").await;
    assert_eq!(both.body["data"][0]["id"], ada["id"], "{:?}", both.body);
    let mixed = find("email=bob@example.com&userId=u-ada").await;
    assert_eq!(mixed.body["data"], json!([]), "{:?}", mixed.body);
    // Another space's key finds nothing by it.
    let elsewhere = app.get("/schemas/contacts/records?email=ada@example.com", MULTI_BETA).await;
    assert!(elsewhere.status == 404 || elsewhere.body["data"] == json!([]), "{:?}", elsewhere.body);
    assert!(!elsewhere.body.to_string().contains("u-ada"), "{:?}", elsewhere.body);
}

#[tokio::test]
async fn a_list_is_paged_by_cursor_past_where_offsets_stop() {
    let app = TestApp::spawn().await;
    let mut created = Vec::new();
    for n in 0..7 {
        created.push(app.create_contact(&json!({"email": format!("c{n}@example.com")})).await["id"].clone());
    }
    // An offset page hands on the cursor of its last row while rows follow it.
    let first = app.get("/schemas/contacts/records?limit=3", ALPHA_ADMIN).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    let mut cursor = first.body["pagination"]["nextCursor"].as_str().expect("a cursor while rows follow").to_owned();
    let mut seen: Vec<Value> = first.body["data"].as_array().cloned().unwrap_or_default();
    // A cursor page ignores the offset (even one past 10,000) and pages to the end.
    loop {
        let page =
            app.get(&format!("/schemas/contacts/records?limit=3&offset=20000&cursor={cursor}"), ALPHA_ADMIN).await;
        assert_eq!(page.status, 200, "{:?}", page.body);
        let pagination = &page.body["pagination"];
        assert_eq!((&pagination["limit"], &pagination["totalCount"]), (&json!(3), &json!(7)), "{pagination}");
        assert!(pagination.get("offset").is_none(), "a cursor page has no offset: {pagination}");
        seen.extend(page.body["data"].as_array().cloned().unwrap_or_default());
        match pagination["nextCursor"].as_str() {
            Some(next) => {
                assert_eq!(pagination["hasMore"], true);
                cursor = next.to_owned();
            }
            None => {
                assert_eq!(pagination["hasMore"], false);
                break;
            }
        }
    }
    let ids: Vec<Value> = seen.iter().map(|record| record["id"].clone()).collect();
    assert_eq!(ids, created, "every record once, in the list's order");
    // The last offset page has no cursor; a malformed one is 400 invalid_cursor.
    let last = app.get("/schemas/contacts/records?limit=3&offset=6", ALPHA_ADMIN).await;
    assert_eq!(last.body["pagination"]["nextCursor"], Value::Null, "{:?}", last.body);
    for bad in ["nope", "12.", "x.con_1"] {
        let refused = app.get(&format!("/schemas/contacts/records?cursor={bad}"), ALPHA_ADMIN).await;
        assert_eq!((refused.status, refused.code().as_str()), (400, Some("invalid_cursor")), "{bad}");
        // Beside an identity filter, which ignores a cursor, a malformed one is refused too.
        let filtered =
            app.get(&format!("/schemas/contacts/records?email=a@example.com&cursor={bad}"), ALPHA_ADMIN).await;
        assert_eq!((filtered.status, filtered.code().as_str()), (400, Some("invalid_cursor")), "{bad}");
    }
    let far = app.get("/schemas/contacts/records?offset=10001", ALPHA_ADMIN).await;
    assert_eq!((far.status, far.code().as_str()), (400, Some("offset_too_large")));
    assert!(far.body["error"]["message"].as_str().is_some_and(|m| m.contains("cursor")), "{:?}", far.body);
}

#[tokio::test]
async fn a_body_of_too_many_values_is_refused_before_it_is_built_and_a_refusal_lists_at_most_100_issues() {
    let app = TestApp::spawn().await;
    let body = |keys: usize| {
        let members: Vec<String> = (0..keys).map(|n| format!("\"k{n}\":1")).collect();
        format!("{{\"email\":\"many@example.com\",{}}}", members.join(","))
    };
    let post = |body: String| {
        app.send(
            app.request(reqwest::Method::POST, "/schemas/contacts/records", Some(ALPHA_ADMIN))
                .header("content-type", "application/json")
                .body(body),
        )
    };
    let huge = post(body(300_000)).await;
    assert_eq!((huge.status, huge.code().as_str()), (413, Some("body_too_large")), "{:?}", huge.body);
    let many = post(body(500)).await;
    assert_eq!((many.status, many.code().as_str()), (400, Some("unknown_attribute")));
    assert_eq!(many.body["error"]["issues"].as_array().map(Vec::len), Some(100), "the first 100 problems");
}

#[tokio::test]
async fn a_value_beyond_its_types_maximum_is_refused_naming_the_field_and_the_limit() {
    let app = TestApp::spawn().await;
    let long = "x".repeat(70_000);
    for (method, path) in [
        (reqwest::Method::POST, "/schemas/contacts/records"),
        (reqwest::Method::POST, "/schemas/contacts/records/upsert"),
    ] {
        let response = app
            .send(
                app.request(method, path, Some(ALPHA_ADMIN))
                    .json(&json!({"email": "long@example.com", "firstName": long})),
            )
            .await;
        assert_eq!(
            (response.status, response.code().as_str()),
            (400, Some("value_too_long")),
            "{path}: {:?}",
            response.body
        );
        let issue = &response.body["error"]["issues"][0];
        assert_eq!(issue["key"], "firstName", "{path}");
        assert!(issue["message"].as_str().is_some_and(|m| m.contains("4096 characters")), "{issue}");
    }
    let contact = app.create_contact(&json!({"email": "short@example.com", "firstName": "Ada"})).await;
    let patch = app
        .send(
            app.request(
                reqwest::Method::PATCH,
                &format!("/schemas/contacts/records/{}", contact["id"].as_str().unwrap_or("")),
                Some(ALPHA_ADMIN),
            )
            .json(&json!({"firstName": long})),
        )
        .await;
    assert_eq!((patch.status, patch.code().as_str()), (400, Some("value_too_long")), "{:?}", patch.body);
    let kept =
        app.get(&format!("/schemas/contacts/records/{}", contact["id"].as_str().unwrap_or("")), ALPHA_ADMIN).await;
    assert_eq!(kept.body["data"]["firstName"], "Ada");
}

#[tokio::test]
async fn a_json_value_nests_at_most_32_levels_and_one_that_deep_reads_back() {
    // A body may nest 128 levels, but a record's document and the answers that carry it wrap
    // a value in more: a value deeper than 32 levels is refused at the door, one of 32 is
    // written and read back whole.
    let app = TestApp::spawn().await;
    app.apply_with_attribute("contacts", json!({"key": "blob", "definition": {"type": "json"}})).await;
    // Two levels (an object and an array) a step.
    let nested = |steps: usize| (0..steps).fold(json!("core"), |inner, level| json!({format!("l{level}"): [inner]}));
    for depth in [17, 30, 63] {
        let refused = app.post("/schemas/contacts/records", ALPHA_ADMIN, &json!({"blob": nested(depth)})).await;
        let issue = &refused.body["error"]["issues"][0];
        assert_eq!(
            (refused.status, issue["code"].as_str(), issue["key"].as_str()),
            (400, Some("value_too_long"), Some("blob")),
            "{depth}: {:?}",
            refused.body
        );
        assert!(issue["message"].as_str().is_some_and(|message| message.contains("32 levels")), "{issue}");
    }
    let deepest = nested(16);
    let created = app.post("/schemas/contacts/records", ALPHA_ADMIN, &json!({"blob": deepest})).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let id = created.body["data"]["id"].as_str().expect("id").to_owned();
    let read = app.get_after(&created, &format!("/schemas/contacts/records/{id}"), ALPHA_ADMIN).await;
    assert_eq!(read.status, 200, "{:?}", read.body);
    assert_eq!(read.body["data"]["blob"], deepest, "{:?}", read.body);
}
