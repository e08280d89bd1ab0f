//! Upsert (rule 3 matching, rule 4 collisions) and PATCH.

use serde_json::{Value, json};

use crate::helpers::*;

async fn upsert(app: &TestApp, body: Value) -> TestResponse {
    app.post("/schemas/contacts/records/upsert", ALPHA_ADMIN, &body).await
}

async fn patch(app: &TestApp, id: &str, body: Value) -> TestResponse {
    app.send(
        app.request(reqwest::Method::PATCH, &format!("/schemas/contacts/records/{id}"), Some(ALPHA_ADMIN)).json(&body),
    )
    .await
}

#[tokio::test]
async fn upsert_creates_with_201_then_updates_the_match_with_200() {
    let app = TestApp::spawn().await;
    let created = upsert(&app, json!({"email": "Up@Example.com", "firstName": "Ada"})).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    assert!(created.header("operation-id").is_some());
    let id = created.body["data"]["id"].as_str().expect("id").to_owned();
    let updated = upsert(&app, json!({"email": "up@example.com", "age": 37})).await;
    assert_eq!(updated.status, 200, "{:?}", updated.body);
    assert_eq!(updated.body["data"]["id"], id.as_str());
    assert_eq!(updated.body["data"]["firstName"], "Ada", "omitted fields are kept");
    assert_eq!(updated.body["data"]["age"], 37);
    assert_eq!(updated.body["data"]["source"], "api");
    let fetched = app.get(&format!("/schemas/contacts/records/{id}"), ALPHA_ADMIN).await;
    assert_eq!(fetched.body["data"], updated.body["data"], "read-your-writes after an update");
    let list = app.get("/schemas/contacts/records", ALPHA_ADMIN).await;
    assert_eq!(list.body["pagination"]["totalCount"], 1);
}

#[tokio::test]
async fn upsert_matching_follows_rule_3() {
    let app = TestApp::spawn().await;
    let with_user = app.create_contact(&json!({"userId": "u-1", "email": "with-user@example.com"})).await;
    let email_only = app.create_contact(&json!({"email": "email-only@example.com", "phone": "+1 555 0101"})).await;
    let phone_only = app.create_contact(&json!({"phone": "+1 555 0102"})).await;

    let by_user = upsert(&app, json!({"userId": "u-1", "firstName": "U"})).await;
    assert_eq!((by_user.status, &by_user.body["data"]["id"]), (200, &with_user["id"]));
    // email matches only a contact with no userId: this creates, skipping the taken email.
    let skipped = upsert(&app, json!({"email": "with-user@example.com", "firstName": "Other"})).await;
    assert_eq!(skipped.status, 201);
    assert_ne!(skipped.body["data"]["id"], with_user["id"]);
    assert!(skipped.body["data"]["email"].is_null());
    assert_eq!(skipped.body["warnings"][0]["code"], "identifier_skipped");
    let by_email = upsert(&app, json!({"email": "email-only@example.com", "userId": "u-2"})).await;
    assert_eq!((by_email.status, &by_email.body["data"]["id"]), (200, &email_only["id"]));
    assert_eq!(by_email.body["data"]["userId"], "u-2");
    // phone matches only a contact with neither userId nor email.
    let phone_taken = upsert(&app, json!({"phone": "+1 555 0101"})).await;
    assert_eq!(phone_taken.status, 201);
    assert_eq!(phone_taken.body["warnings"][0]["code"], "identifier_skipped");
    let by_phone = upsert(&app, json!({"phone": "+1 555 0102", "age": 5})).await;
    assert_eq!((by_phone.status, &by_phone.body["data"]["id"]), (200, &phone_only["id"]));

    // An explicit id selects exactly that record, or is 404.
    let id = phone_only["id"].as_str().expect("id");
    let by_id = upsert(&app, json!({"id": id, "email": "new@example.com"})).await;
    assert_eq!((by_id.status, by_id.body["data"]["email"].as_str()), (200, Some("new@example.com")));
    let missing = upsert(&app, json!({"id": "con_missing", "email": "x@example.com"})).await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.code(), "record_not_found");
}

#[tokio::test]
async fn objects_upsert_by_external_id() {
    let app = TestApp::spawn().await;
    let first =
        app.post("/schemas/companies/records/upsert", ALPHA_ADMIN, &json!({"externalId": "C-9", "name": "A"})).await;
    assert_eq!(first.status, 201);
    let second =
        app.post("/schemas/companies/records/upsert", ALPHA_ADMIN, &json!({"externalId": "C-9", "name": "B"})).await;
    assert_eq!(second.status, 200);
    assert_eq!(second.body["data"]["id"], first.body["data"]["id"]);
    assert_eq!(second.body["data"]["name"], "B");
    let broke = app.post("/schemas/accounts/records/upsert", MULTI_BETA, &json!({"externalId": "Z"})).await;
    assert_eq!(broke.code(), "insufficient_credits");
}

#[tokio::test]
async fn concurrent_upserts_of_one_new_identity_make_one_record() {
    let app = TestApp::spawn().await;
    let mut tasks = Vec::new();
    for index in 0..10 {
        let request = app
            .request(reqwest::Method::POST, "/schemas/contacts/records/upsert", Some(ALPHA_ADMIN))
            .json(&json!({"email": "race-upsert@example.com", "age": index}));
        tasks.push(tokio::spawn(async move { request.send().await.expect("sent").status().as_u16() }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.expect("task"));
    }
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 1, "{statuses:?}");
    assert!(statuses.iter().all(|s| *s == 201 || *s == 200 || *s == 409), "{statuses:?}");
    app.wait_for_projections().await;
    let list = app.get("/schemas/contacts/records", ALPHA_ADMIN).await;
    assert_eq!(list.body["pagination"]["totalCount"], 1);
}

#[tokio::test]
async fn patch_keeps_omitted_clears_nulls_and_uses_the_path_id() {
    let app = TestApp::spawn().await;
    let record = app.create_contact(&json!({"email": "p@example.com", "firstName": "Pat", "age": 30})).await;
    let other = app.create_contact(&json!({"email": "taken@example.com"})).await;
    let id = record["id"].as_str().expect("id");
    let response = patch(&app, id, json!({"id": other["id"], "age": null, "plan": "pro", "userId": "pat"})).await;
    assert_eq!(response.status, 200, "{:?}", response.body);
    let data = &response.body["data"];
    assert_eq!(data["id"], id, "the path id wins over a body id");
    assert_eq!(data["firstName"], "Pat");
    assert!(data["age"].is_null());
    assert_eq!((data["plan"].as_str(), data["userId"].as_str()), (Some("pro"), Some("pat")));
    assert_eq!(data["createdAt"], record["createdAt"]);

    let collision = patch(&app, id, json!({"email": "taken@example.com", "firstName": "P"})).await;
    assert_eq!(collision.status, 200);
    assert_eq!(collision.body["data"]["email"], "p@example.com", "the colliding field is skipped");
    assert_eq!(collision.body["data"]["firstName"], "P");
    assert_eq!(collision.body["warnings"][0]["code"], "identifier_skipped");
    // Skipped with nothing else to change: nothing is written, and the answer still says why.
    let only = patch(&app, id, json!({"email": "taken@example.com"})).await;
    assert_eq!(only.status, 200, "{:?}", only.body);
    assert_eq!(only.body["data"]["email"], "p@example.com", "the colliding field is skipped");
    assert_eq!(only.body["warnings"][0]["code"], "identifier_skipped", "{:?}", only.body);

    for (body, code) in [
        (json!({"score": 1}), "attribute_not_writable"),
        (json!({"total": 1}), "attribute_not_writable"),
        (json!({"plan": null}), "required_attribute_missing"),
        (json!({"nope": 1}), "unknown_attribute"),
    ] {
        let rejected = patch(&app, id, body.clone()).await;
        assert_eq!((rejected.status, rejected.code().as_str()), (400, Some(code)), "{body}");
    }
    let missing = patch(&app, "con_missing", json!({"age": 1})).await;
    assert_eq!((missing.status, missing.code().as_str()), (404, Some("record_not_found")));
    let wrong_schema = app
        .send(
            app.request(reqwest::Method::PATCH, &format!("/schemas/leads/records/{id}"), Some(ALPHA_ADMIN))
                .json(&json!({})),
        )
        .await;
    assert_eq!(wrong_schema.status, 404);

    // Clearing an identity frees it for another record.
    assert_eq!(patch(&app, id, json!({"email": null})).await.status, 200);
    assert_eq!(
        app.post("/schemas/contacts/records", ALPHA_ADMIN, &json!({"email": "p@example.com"})).await.status,
        201
    );
    let fetched = app.get(&format!("/schemas/contacts/records/{id}"), ALPHA_ADMIN).await;
    assert!(fetched.body["data"]["email"].is_null());
}
